"""Optional imports (util/optional.py): one line naming the extra when a module is missing, the original error
when an installed module is broken, and nothing imported by the check."""
import sys

import pytest

from overinterp_fast.errors import MissingDependency
from overinterp_fast.util import optional


def test_require_names_the_missing_distributions_and_the_extra(monkeypatch):
    optional.require("audit", "the audit")  # all installed here: no error
    monkeypatch.setitem(sys.modules, "PIL", None)  # not importable, as when pillow is not installed
    with pytest.raises(MissingDependency) as err:
        optional.require("audit", "the audit")
    assert str(err.value) == "the audit needs pillow, which is not installed: pip install 'overinterp-fast[audit]'"
    assert err.value.extra == "audit" and err.value.missing == ("PIL",) and isinstance(err.value, ImportError)
    monkeypatch.setitem(sys.modules, "scipy", None)
    with pytest.raises(MissingDependency, match=r"^the audit needs pillow, scipy, which are not installed: "):
        optional.require("audit", "the audit")


def test_load_imports_or_names_the_extra(monkeypatch):
    assert optional.load("json.decoder", "audit", "x").__name__ == "json.decoder"
    monkeypatch.setitem(sys.modules, "skimage", None)
    monkeypatch.delitem(sys.modules, "skimage.data", raising=False)  # imported by an earlier test
    with pytest.raises(MissingDependency) as err:
        optional.load("skimage.data", "imagenet", "the bundled photos")
    assert str(err.value) == ("the bundled photos needs scikit-image, which is not installed: "
                              "pip install 'overinterp-fast[imagenet]'")
    assert isinstance(err.value.__cause__, ImportError)


def test_a_broken_installed_module_keeps_its_own_error(tmp_path, monkeypatch):
    (tmp_path / "half_installed_pkg.py").write_text("import a_dependency_nobody_has_xyz\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ModuleNotFoundError) as err:
        optional.load("half_installed_pkg", "audit", "x")
    assert err.type is ModuleNotFoundError and err.value.name == "a_dependency_nobody_has_xyz"


def test_installed_does_not_import(monkeypatch):
    monkeypatch.delitem(sys.modules, "wave", raising=False)
    assert optional.installed("wave") and "wave" not in sys.modules  # found on the path, not imported
    assert not optional.installed("no_such_module_xyz.sub")
    monkeypatch.setitem(sys.modules, "wave", None)
    assert not optional.installed("wave")
    assert optional.install_hint("onnx") == "pip install 'overinterp-fast[onnx]'"

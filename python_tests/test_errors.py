"""The package's exceptions (errors.py): each a subclass of the built-in raised before it existed, exported at the
top and by the audit, and raised where documented (test_lock.py, test_faults.py, util/test_optional.py raise them
for real; here the configuration mismatch)."""
import pickle

import pytest

import overinterp_fast as of
from overinterp_fast import errors


def test_each_subclasses_the_builtin_and_is_exported():
    assert issubclass(errors.FolderLocked, ValueError) and issubclass(errors.ConfigMismatch, ValueError)
    assert issubclass(errors.StorageFault, OSError) and issubclass(errors.MissingDependency, ImportError)
    for name in errors.__all__:
        assert getattr(of, name) is getattr(errors, name) and name in of.__all__
    from overinterp_fast import audit

    assert (audit.FolderLocked, audit.ConfigMismatch, audit.StorageFault) == (
        errors.FolderLocked, errors.ConfigMismatch, errors.StorageFault)


def test_they_keep_their_message_through_pickle():
    """Exceptions cross process boundaries (DataLoader workers, torchrun) pickled."""
    for exc in (errors.FolderLocked("f is locked", "f"), errors.ConfigMismatch("m", "f", "k"),
                errors.StorageFault("f: full", "f", "full", 28), errors.MissingDependency("needs x", "audit", ("x",))):
        back = pickle.loads(pickle.dumps(exc))
        assert type(back) is type(exc) and str(back) == str(exc)


def test_a_configuration_mismatch_names_the_first_difference(tmp_path):
    from overinterp_fast.audit import store

    folder = str(tmp_path)
    store.write_json(f"{folder}/results.json", {"format_version": store.FORMAT_VERSION,
                                                 "config": {"method": "exact", "k": 5, "size": 8}})
    with pytest.raises(errors.ConfigMismatch) as err:
        store.check_resumable(folder, {"method": "exact", "k": 6, "size": 9})
    assert err.value.key == "k" and err.value.folder == folder
    assert str(err.value) == (f"{folder!r} holds an audit with another configuration: k is 5 there, 6 here (and 1 "
                              f"more: size); rerun with --restart to start over, or choose another --out")
    assert store.check_resumable(folder, {"method": "exact", "k": 5, "size": 8})["config"]["k"] == 5

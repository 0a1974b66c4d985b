"""Storage faults end in one line, and nothing is lost: real faults, not mocks.

A tmpfs of 48 KB fills up during an audit (the command line's message; the rerun on a larger disk resumes); a
folder's parts/ turns read-only during a run (a read-only bind mount); a folder is read-only when the audit
starts (a tmpfs remounted read-only); a folder is removed while the audit runs. After each, the rerun gives the
uninterrupted run's rows exactly. The mounts need root: elsewhere these tests are skipped (python_tests/mounts.py).
"""
import errno
import os
import shutil

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

import overinterp_fast as of
from overinterp_fast.audit.config import AuditConfig, RunOptions, StoreOptions
from overinterp_fast.audit.faults import storage_fault, writing
from overinterp_fast.audit.persist import load_audit
from overinterp_fast.audit.sources import ImageSource
from overinterp_fast.audit.stream import run_stored_audit
from overinterp_fast.cli import main
from helpers import tiny_cnn
from mounts import read_only_bind, remount, tmpfs

N = 8  # images, one per chunk


pytestmark = pytest.mark.usefixtures("one_torch_thread")


class Noise(ImageSource):
    """Seeded random 8 x 8 RGB photos."""

    def photo(self, i):
        return np.random.default_rng(i).integers(0, 256, (8, 8, 3), dtype=np.uint8)


class Trigger(torch.nn.Module):
    """tiny_cnn(3); once ``out`` holds ``after`` committed chunks, ``action()`` runs (once) before the forward
    pass: a fault in the middle of the audit, at a chosen point."""

    def __init__(self, out=None, after=0, action=None):
        super().__init__()
        self.net = tiny_cnn(3)
        self.out, self.after, self.action = out, after, action
        self.eval()

    def forward(self, x):
        if self.action is not None and len(_committed(self.out)) >= self.after:
            action, self.action = self.action, None
            action()
        return self.net(x)


def _committed(out):
    """The committed chunks, read from the folder by hand."""
    parts = os.path.join(out, "parts")
    return sorted(f for f in os.listdir(parts) if f.endswith(".results.parquet")) if os.path.isdir(parts) else []


def _audit(out, model=None):
    src = Noise([f"im{i}" for i in range(N)], [i % 5 for i in range(N)], 8, description={"kind": "noise"})
    return run_stored_audit({"net": model or Trigger()}, src, str(out), AuditConfig(method="exact", threshold=0.5, channels_last=False),
                            StoreOptions(chunk_size=1, workers=0, gallery=3), RunOptions(progress=False))


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    out = tmp_path_factory.mktemp("reference") / "audit"
    _audit(out)
    return str(out)


def assert_same_rows(out, reference):
    """The per-image results (orders, values, SIS) and sis.parquet's rows equal the uninterrupted run's."""
    a, b = load_audit(str(out)), load_audit(reference)
    for ra, rb in zip(a.models[0].results, b.models[0].results, strict=True):
        assert torch.equal(ra.order, rb.order) and torch.equal(ra.values, rb.values)
        assert (ra.sis is None) == (rb.sis is None) and (ra.sis is None or torch.equal(ra.sis, rb.sis))
        assert (ra.target, ra.score, ra.threshold) == (rb.target, rb.score, rb.threshold)
    assert pq.read_table(os.path.join(out, "sis.parquet")).equals(pq.read_table(os.path.join(reference, "sis.parquet")))
    assert not [f for f in os.listdir(os.path.join(out, "parts")) if ".tmp-" in f]


def _resumes(kept, chunks=N):
    return f"the {kept} of {chunks} chunks committed so far are kept"


# ------------------------------------------------------------------------------------------ the command line


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    from PIL import Image

    root = tmp_path_factory.mktemp("inputs")
    (root / "images").mkdir()
    for i in range(N):
        Image.fromarray(Noise.photo(None, i)).save(root / "images" / f"im{i}.png")
    batch = torch.export.Dim("batch")
    torch.export.save(torch.export.export(tiny_cnn(3), (torch.zeros(2, 3, 8, 8),), dynamic_shapes=({0: batch},)),
                      str(root / "net.pt2"))
    return root


def _cli(files, out):
    return ["audit", "--model", str(files / "net.pt2"), "--images", str(files / "images"), "--size", "8",
            "--method", "exact", "--threshold", "0.5", "--chunk-size", "1", "--workers", "0", "--quiet",
            "--channels-last", "off", "--gallery", "3", "--out", str(out)]  # format fixed: runs compared bit for bit


def test_a_full_disk_ends_in_one_line_and_the_rerun_resumes(files, tmp_path, capsys):
    ref = tmp_path / "reference"
    assert main(_cli(files, ref)) == 0
    capsys.readouterr()
    with tmpfs(tmp_path / "disk", "48k") as disk:
        out = os.path.join(disk, "audit")
        assert main(_cli(files, out)) == 2
        captured = capsys.readouterr()
        kept = len(_committed(out))
        assert 1 <= kept < N
        assert captured.err == (f"overinterp-fast: error: {out}: no space is left on its device; "
                                f"{_resumes(kept)}: free some space (or move the folder to a larger disk) and rerun "
                                f"the same command, which resumes the audit\n")
        assert not [f for f in os.listdir(os.path.join(out, "parts")) if ".tmp-" in f]  # no partial part left
        remount(disk, "size=4m")  # a larger disk
        assert main(_cli(files, out)) == 0
        assert f"{N} chunks: {kept} already committed" in capsys.readouterr().out
        assert_same_rows(out, str(ref))


# ------------------------------------------------------------------------------------------ the Python API


def test_parts_turning_read_only_mid_run(tmp_path, reference):
    out = tmp_path / "audit"
    parts = out / "parts"
    bind = []

    def freeze():
        bind.append(read_only_bind(parts))
        bind[0].__enter__()

    try:
        with pytest.raises(of.StorageFault) as err:
            _audit(out, Trigger(str(out), 2, freeze))
        assert bind, "the fault was not planted"
        assert err.value.reason == "read-only" and err.value.errno == errno.EROFS
        assert str(err.value) == (f"{out}: it cannot be written (Read-only file system); {_resumes(2)}: make it "
                                  f"writable (or copy it to a writable place and give that folder) and rerun the "
                                  f"same command, which resumes the audit")
    finally:
        for b in bind:
            b.__exit__(None, None, None)
    run = _audit(out)
    assert (run.skipped, run.computed) == (2, N - 2)
    assert_same_rows(out, reference)


def test_a_read_only_folder_is_refused_in_one_line_before_anything_runs(tmp_path, reference):
    def crash():
        raise RuntimeError("stopped")

    with tmpfs(tmp_path / "disk", "4m") as disk:
        out = os.path.join(disk, "audit")
        with pytest.raises(RuntimeError, match="stopped"):
            _audit(out, Trigger(out, 3, crash))  # an audit stopped after 3 chunks
        remount(disk, "ro")
        with pytest.raises(of.StorageFault) as err:
            _audit(out)
        assert err.value.reason == "read-only"
        assert str(err.value).startswith(f"{out}: it cannot be written (Read-only file system); {_resumes(3)}")
        remount(disk, "rw")
        run = _audit(out)
        assert (run.skipped, run.computed) == (3, N - 3)
        assert_same_rows(out, reference)


def test_a_folder_removed_mid_run(tmp_path, reference):
    out = tmp_path / "audit"
    with pytest.raises(of.StorageFault) as err:
        _audit(out, Trigger(str(out), 2, lambda: shutil.rmtree(out)))
    assert err.value.reason == "removed"
    assert str(err.value) == f"{out} was removed while being written; rerun the same command to start the audit again"
    assert not out.exists()  # not made again by the commit that found it gone
    run = _audit(out)
    assert (run.skipped, run.computed) == (0, N)
    assert_same_rows(out, reference)


# ------------------------------------------------------------------------------------------ the classification


def test_other_errors_pass_unchanged(tmp_path):
    with pytest.raises(FileNotFoundError):  # a missing input, not the folder
        with writing(str(tmp_path), 4):
            open(tmp_path / "no such image.png", "rb")
    err = OSError(errno.EIO, "Input/output error")
    assert storage_fault(str(tmp_path), err, True, 4) is None
    with pytest.raises(ValueError):
        with writing(str(tmp_path)):
            raise ValueError("not an OSError")


def test_results_written_in_one_piece_say_rerun(tmp_path):
    full = storage_fault(str(tmp_path), OSError(errno.ENOSPC, "No space left on device"), True)
    assert str(full) == (f"{tmp_path}: no space is left on its device; free some space (or move the folder to a "
                         f"larger disk) and rerun the same command")
    assert isinstance(full, OSError) and full.folder == str(tmp_path) and full.errno == errno.ENOSPC
    gone = storage_fault(str(tmp_path / "x"), FileNotFoundError(errno.ENOENT, "gone"), True)
    assert str(gone) == f"{tmp_path / 'x'} was removed while being written; rerun the same command to write them again"
    quota = storage_fault(str(tmp_path), OSError(errno.EDQUOT, "Disk quota exceeded"), True, 3)
    assert quota.reason == "full" and _resumes(0, 3) in str(quota)
    denied = storage_fault(str(tmp_path), PermissionError(errno.EACCES, "Permission denied"), False, 3)
    assert denied.reason == "read-only" and "(Permission denied)" in str(denied)

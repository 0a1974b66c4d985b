"""Real storage faults for tests: a tmpfs of a given size (a disk that fills up), remounted read-only or larger.

Mounting needs root (or CAP_SYS_ADMIN) and a ``mount`` binary; where either is missing, the test that asked for
a mount is skipped with the reason. Imported as ``from mounts import tmpfs``.
"""
import contextlib
import os
import shutil
import subprocess

import pytest


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(list(args), capture_output=True, text=True)


def remount(path, options: str) -> None:
    """``mount -o remount,<options> path`` (e.g. "ro", "rw", "size=4m"); raises when it fails."""
    p = _run("mount", "-o", f"remount,{options}", str(path))
    if p.returncode != 0:
        raise RuntimeError(f"mount -o remount,{options} {path}: {p.stderr.strip()}")


@contextlib.contextmanager
def tmpfs(path, size: str):
    """A tmpfs of ``size`` (e.g. "300k") mounted on the folder ``path`` (created) for the block; the test is
    skipped where mounting is not permitted."""
    if shutil.which("mount") is None or shutil.which("umount") is None:
        pytest.skip("needs mount and umount (a tmpfs of a few hundred KB is the full disk)")
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs (the full disk) needs root")
    os.makedirs(path, exist_ok=True)
    p = _run("mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(path))
    if p.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {p.stderr.strip() or p.returncode}")
    try:
        yield str(path)
    finally:
        _run("umount", "-l", str(path))


@contextlib.contextmanager
def read_only_bind(path):
    """``path`` (a folder) made read-only for the block by a read-only bind mount onto itself (root ignores
    file modes, so chmod cannot do it); a file already open for writing there would make the remount fail."""
    p = _run("mount", "--bind", str(path), str(path))
    if p.returncode != 0:
        pytest.skip(f"cannot bind-mount here: {p.stderr.strip() or p.returncode}")
    try:
        remount(path, "ro,bind")
        yield str(path)
    finally:
        _run("umount", "-l", str(path))

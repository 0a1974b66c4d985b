"""Where a result came from: the commit of the code that made it and the versions it ran with.

    doc = {"commit": source_commit(), "versions": versions(device), ...}   # as every results JSON carries them

Read by the benchmarks' results files (``benchmarks/common.py``) and the retraining results
(:mod:`overinterp_fast.audit.retraining`) alike. It needs no extra (torch alone).
"""
from __future__ import annotations

import functools
import os
import platform
import subprocess

import torch

# what "-dirty" looks at: the code a result depends on (not the results folders a run rewrites as it goes)
CODE_PATHS = ("overinterp_fast", "csrc", "benchmarks", "setup.py", ":(exclude)benchmarks/results")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the checkout


@functools.lru_cache(maxsize=1)
def source_commit() -> str:
    """The full hash of the code that ran: ``$OVERINTERP_FAST_COMMIT`` where set (a copy of the tree without its
    ``.git``), else ``git rev-parse HEAD`` of the checkout the package was imported from, with ``-dirty`` when its
    tracked code (:data:`CODE_PATHS`) differs from that commit; "unknown" when neither is available (an installed
    package). Read once per process, at the first call: a run records the code it started with."""
    env = os.environ.get("OVERINTERP_FAST_COMMIT")
    if env:
        return env
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "diff", "--quiet", "HEAD", "--", *CODE_PATHS], cwd=ROOT,
                               capture_output=True).returncode != 0
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("-dirty" if dirty else "")


def versions(device: str | torch.device = "cpu") -> dict:
    """python, torch, overinterp_fast (and whether its compiled ops loaded), CUDA on a GPU, onnxruntime where
    installed."""
    from .. import __version__
    from ..ops import extension_loaded

    v = {"python": platform.python_version(), "torch": torch.__version__, "overinterp_fast": __version__,
         "compiled_ops": extension_loaded()}
    if torch.device(device).type == "cuda":
        v["cuda"] = torch.version.cuda
    try:
        import onnxruntime

        v["onnxruntime"] = onnxruntime.__version__
    except ImportError:
        pass
    return v

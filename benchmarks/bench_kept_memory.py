"""Memory a process keeps after using many models once: what each call keeps for its model must go with it.

    python benchmarks/bench_kept_memory.py            # 24 small CNNs, each used once by exact SIS, then deleted
    python benchmarks/bench_kept_memory.py --models 48 --method gradient --json results/kept-memory-cpu.json

Each model is a new small CNN (3 x 12 x 12 inputs, 2 images), used by one call and deleted. The process's resident
memory (RSS, after ``gc.collect()`` and glibc's ``malloc_trim``) is read after the first model (the libraries' and
allocators' own growth done) and after the last; their difference is what the calls kept. Also counted: the models
still alive (weak references) and the models that still keep a state (runtime.model_state).
"""
from __future__ import annotations

import argparse
import ctypes
import gc
import json
import os
import subprocess
import sys
import weakref

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import overinterp_fast as of  # noqa: E402
from overinterp_fast.runtime import model_state  # noqa: E402
from common import write_results  # noqa: E402


def rss_mb() -> float:
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:
        pass
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def small_cnn(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.ReLU(),
                               torch.nn.Conv2d(16, 16, 3, padding=1), torch.nn.ReLU(),
                               torch.nn.Flatten(), torch.nn.Linear(16 * 12 * 12, 10)).eval()


METHODS = ("exact", "gradient", "minimal")


def use(model, images, method: str) -> None:
    if method == "exact":
        of.fast_sis(model, images, 0.0, progress=False)
    elif method == "gradient":
        of.GradientSIS(model, threshold=0.0).find_sis(images)
    else:
        of.MinimalPixelSet(model).find_sis(images)


def one(method: str, models: int) -> dict:
    """Use ``models`` new models once each with ``method`` in this process; the figures."""
    images = torch.randn(2, 3, 12, 12, generator=torch.Generator().manual_seed(0))
    refs = []
    first = None
    for i in range(models):
        model = small_cnn(i)
        refs.append(weakref.ref(model))
        use(model, images, method)
        del model
        if i == 0:
            first = rss_mb()
    last = rss_mb()
    return {"method": method, "models": models, "rss_first_mb": round(first, 1), "rss_last_mb": round(last, 1),
            "growth_mb": round(last - first, 1), "models_alive": sum(r() is not None for r in refs),
            "states_kept": model_state.kept_models()}


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", type=int, default=24)
    ap.add_argument("--methods", nargs="*", choices=METHODS, default=list(METHODS))
    ap.add_argument("--one", choices=METHODS, help=argparse.SUPPRESS)  # a child process: one method, JSON out
    ap.add_argument("--out", default=None, help="the results JSON (default benchmarks/results/kept-memory-cpu.json)")
    ap.add_argument("--no-write", action="store_true", help="print only")
    args = ap.parse_args(argv)
    if args.one:
        print(json.dumps(one(args.one, args.models)))
        return []
    rows = []
    for method in args.methods:  # each in a fresh process: what one method keeps, nothing of another
        done = subprocess.run([sys.executable, os.path.abspath(__file__), "--one", method, "--models",
                               str(args.models)], capture_output=True, text=True, check=True)
        row = json.loads(done.stdout.strip().splitlines()[-1])
        rows.append(row)
        print(f"{method}: {row['models']} models used once each: RSS {row['rss_first_mb']:.1f} -> "
              f"{row['rss_last_mb']:.1f} MB (+{row['growth_mb']:.1f} MB); models alive {row['models_alive']}, "
              f"states kept {row['states_kept']}")
    if not args.no_write:
        print("wrote", write_results("kept-memory", "cpu", rows, out=args.out))
    return rows


if __name__ == "__main__":
    main()

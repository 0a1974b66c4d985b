"""Audits at scale: throughput with 1 and 2 processes, the cost of durability, and peak memory vs images.

    python benchmarks/bench_scale.py                      # defaults: 256 images, 3 rounds (~10 min on 2 cores)
    python benchmarks/bench_scale.py --images 512 --rounds 5 --memory-images 256 1024 2048
    python benchmarks/bench_scale.py --images 16 --rounds 1 --memory-images 16   # a smoke run

Data: generated CIFAR-10-format batches (``cifar-10-batches-py/test_batch``, uint8 [N, 3072]),
read by ``--dataset cifar10`` exactly as a user's files. Model: a seeded small CNN.

Contenders, each a fresh process with one torch thread, run in interleaved rounds (minimum kept):
- ``stored x1``: run_stored_audit (exact SIS, chunks committed as Parquet parts, finalize) in 1 process;
- ``stored x2``: the same under torchrun with 2 processes (gloo), sharing the chunks;
- ``memory x1``: the same chunks through the same audit_chunk at the stored mode's settings (its batch size and the
  format it measures once), results held in memory and saved once
  at the end (save_audit): the audit without durability.
Throughput is images / seconds of the audit call (process start-up and imports excluded; for x2,
rank 0's time from the first barrier to the end of finalize). Scaling efficiency = rate x2 / (2 rate x1);
durability cost = stored x1 / memory x1 - 1.

Peak memory: ``ru_maxrss`` of a process auditing N images (gradient SIS at 64x64, cheap per image,
so that per-image results are large: 4096 int64 order + values each), stored vs in memory, for
several N. The stored run must stay flat; the in-memory one grows with N.
"""
from __future__ import annotations

import argparse
import json
import os
import pickle
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def write_cifar(root: str, n: int, seed: int = 0) -> None:
    """CIFAR-10 test batch in torchvision's layout with ``n`` smooth random images (blurred noise)."""
    folder = os.path.join(root, "cifar-10-batches-py")
    os.makedirs(folder, exist_ok=True)
    rng = np.random.default_rng(seed)
    low = rng.integers(0, 256, (n, 3, 8, 8)).astype(np.float32)
    data = np.clip(np.kron(low, np.ones((1, 1, 4, 4))) + rng.normal(0, 20, (n, 3, 32, 32)), 0, 255)
    with open(os.path.join(folder, "test_batch"), "wb") as fh:
        pickle.dump({"data": data.astype(np.uint8).reshape(n, 3072), "labels": [i % 10 for i in range(n)]}, fh)
    with open(os.path.join(folder, "batches.meta"), "wb") as fh:
        pickle.dump({"label_names": [f"class{i}" for i in range(10)]}, fh)


# ---------------------------------------------------------------------------------------------- child


def child(args) -> None:
    """One contender in this process (or this torchrun rank); prints one JSON line on rank 0."""
    import resource

    import torch

    torch.set_num_threads(1)
    from overinterp_fast.audit import runner, store
    from overinterp_fast.audit.config import AuditConfig, RunOptions, StoreOptions
    from overinterp_fast.audit.persist import save_audit
    from overinterp_fast.audit.records import AuditRecord, ModelRecord
    from overinterp_fast.audit.distributed import Ranks
    from overinterp_fast.audit.stream import device_settings, run_stored_audit
    from overinterp_fast.audit.sources import collate, open_images, select_range
    from overinterp_fast.zoo.cifar import SmallCNN

    torch.manual_seed(0)
    model = SmallCNN(args.size).eval()
    src = open_images(dataset="cifar10", data_dir=args.data, size=args.size)
    src = src.subset(select_range(len(src), None, args.count))
    config = AuditConfig(method=args.method, threshold=0.9, k=args.k)
    t0 = time.perf_counter()
    cpu0 = time.process_time()
    extra = {}
    if args.mode == "stored":
        run = run_stored_audit({"cnn": model}, src, args.out, config,
                               StoreOptions(chunk_size=args.chunk, restart=True, workers=0, report=False, load=False),
                               RunOptions(show_progress=False))
        rank = run.ranks.rank
        extra = {"commit_s": run.commit_seconds, "finalize_s": run.finalize_seconds}
    else:  # the same chunks and batches, held in memory, written once at the end
        rank = 0
        # the stored mode's configuration: the batch size it fixes and, for exact SIS, the format it measures once
        chunk_config = device_settings({"cnn": model}, src, config, args.chunk, Ranks(), None)
        results, names, labels, displays = [], [], [], []
        for a, b in store.chunk_ranges(len(src), args.chunk):
            c = collate([src[i] for i in range(a, b)])
            done = runner.audit_chunk({"cnn": model}, c["x"], c["labels"], True, chunk_config, engine=None,
                                      progress=False, object_masks=None)
            results += done.results[0]
            names += [src.image_names[i] for i in c["index"]]
            labels += c["labels"]
            displays += c["displays"]
        t1 = time.perf_counter()
        save_audit(AuditRecord("bench", names, displays, labels, {}, [ModelRecord("cnn", args.method, results)]),
                   args.out)
        extra = {"save_s": time.perf_counter() - t1}
    seconds = time.perf_counter() - t0
    cpu = time.process_time() - cpu0
    if rank == 0:
        peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(json.dumps({"seconds": seconds, "cpu_s": cpu, "peak_mb": peak_mb, **extra}), flush=True)


def launch(args, mode: str, procs: int, n: int, out: str, method: str, size: int) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    cmd = [sys.executable, os.path.abspath(__file__), "--child", mode, "--count", str(n), "--out", out,
           "--data", args.data_dir, "--method", method, "--size", str(size), "--chunk", str(args.chunk),
           "--k", str(args.k)]
    if procs > 1:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={procs}"] + cmd[1:]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{p.stderr[-3000:]}")
    line = [ln for ln in p.stdout.splitlines() if ln.startswith("{")][-1]
    return json.loads(line)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--images", type=int, default=256, help="images in the throughput runs (default 256)")
    ap.add_argument("--size", type=int, default=8, help="image side for the exact-SIS throughput runs (default 8)")
    ap.add_argument("--chunk", type=int, default=16, help="images per chunk (default 16)")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds; minima are kept (default 3)")
    ap.add_argument("--memory-images", type=int, nargs="+", default=[128, 512, 1024],
                    help="image counts for the peak-memory runs (default 128 512 1024)")
    ap.add_argument("--k", type=int, default=1024, help="gradient block size for the memory runs (default 1024)")
    ap.add_argument("--out", default=None, help="results JSON (default benchmarks/results/scale-cpu.json)")
    ap.add_argument("--child", choices=("stored", "memory"), default=None, help=argparse.SUPPRESS)
    ap.add_argument("--count", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--data", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--method", default="exact", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        args.mode = args.child
        child(args)
        return

    sys.path.insert(0, HERE)
    from common import machine, write_results

    with tempfile.TemporaryDirectory() as tmp:
        args.data_dir = tmp
        write_cifar(tmp, max([args.images] + args.memory_images))
        n = args.images
        best: dict[str, float] = {}
        cpu: dict[str, float] = {}
        writing: list[float] = []  # stored x1: seconds committing parts and merging them, per round
        contenders = [("stored x1", "stored", 1), ("memory x1", "memory", 1), ("stored x2", "stored", 2)]
        for r in range(args.rounds):
            for name, mode, procs in contenders:
                res = launch(args, mode, procs, n, os.path.join(tmp, "out"), "exact", args.size)
                best[name] = min(best.get(name, float("inf")), res["seconds"])
                cpu[name] = min(cpu.get(name, float("inf")), res["cpu_s"])
                if name == "stored x1":
                    writing.append((res["commit_s"] + res["finalize_s"]) / res["seconds"])
                print(f"round {r + 1}: {name:<10} {res['seconds']:7.2f} s  {n / res['seconds']:7.2f} images/s",
                      flush=True)
        rate = {k: n / v for k, v in best.items()}
        efficiency = rate["stored x2"] / (2 * rate["stored x1"])
        durability = best["stored x1"] / best["memory x1"] - 1
        durability_cpu = cpu["stored x1"] / cpu["memory x1"] - 1
        rows = [{"contender": k, "images": n, "seconds": best[k], "images_per_s": rate[k], "cpu_s": cpu[k]}
                for k in best]
        print(f"\nexact SIS, {n} images {args.size}x{args.size}, chunk {args.chunk}, small CNN, 1 thread per process")
        print(f"{'contender':<12} {'s (min)':>8} {'images/s':>9} {'CPU s (rank 0)':>15}")
        for row in rows:
            print(f"{row['contender']:<12} {row['seconds']:>8.2f} {row['images_per_s']:>9.2f} {row['cpu_s']:>15.2f}")
        print(f"scaling efficiency, 2 processes: {efficiency:.2f} (target >= 0.9)")
        print(f"durability cost, stored vs in memory: {100 * durability:+.1f}% wall, {100 * durability_cpu:+.1f}% CPU "
              f"time (target <= 5%)")
        print(f"stored x1: committing parts and merging them took {100 * min(writing):.1f}% of the audit "
              f"(min over rounds; an upper bound on durability's cost: the in-memory run also saves once)")

        memory = []
        print(f"\npeak memory (gradient SIS, 64x64, k={args.k}, chunk {args.chunk}):")
        print(f"{'images':>7} {'stored MB':>10} {'in memory MB':>13}")
        for m in args.memory_images:
            stored = launch(args, "stored", 1, m, os.path.join(tmp, "mem"), "gradient", 64)
            held = launch(args, "memory", 1, m, os.path.join(tmp, "mem"), "gradient", 64)
            memory.append({"images": m, "stored_peak_mb": stored["peak_mb"], "memory_peak_mb": held["peak_mb"],
                           "stored_seconds": stored["seconds"], "memory_seconds": held["seconds"]})
            print(f"{m:>7} {stored['peak_mb']:>10.0f} {held['peak_mb']:>13.0f}", flush=True)
    summary = {"scaling_efficiency_2": efficiency, "durability_cost": durability,
               "durability_cost_cpu": durability_cpu, "commit_and_merge_share": min(writing), "memory": memory,
               "settings": {"images": n, "size": args.size, "chunk": args.chunk, "rounds": args.rounds,
                            "threads_per_process": 1, "load_average": os.getloadavg()}}
    path = write_results("scale", "cpu", rows + [summary], args.out)
    print(f"wrote {path}; machine: {machine('cpu').get('cpu')}")


if __name__ == "__main__":
    main()

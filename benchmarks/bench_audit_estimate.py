"""A stored audit's estimate of the whole audit, said before its first chunk, against the time the audit then takes.

    python benchmarks/bench_audit_estimate.py                    # -> results/audit-estimate-cpu.json
    python benchmarks/bench_audit_estimate.py --side 16 --images 1 4 64 --repeats 2

Each run is ``overinterp-fast audit`` in a subprocess (``-v``, so that the estimate of a short audit is logged too)
on generated CIFAR-format images (helpers.write_cifar's, resized to ``--side``), with the tests' tiny convolutional
network (helpers.export_tiny_cnn), exact SIS, one chunk of 64 images at most. Measured: from the estimate's line to
the audit's last line (``wrote .../report.html``): what the estimate predicts; the interpreter's exit after it is
recorded apart. The target: every ratio measured / estimated within [0.5, 2].
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "python_tests"))
from common import write_results  # noqa: E402
from helpers import export_tiny_cnn, write_cifar  # noqa: E402

UNITS = {"s": 1.0, "min": 60.0, "h": 3600.0, "d": 86400.0}


def run(data: str, model: str, side: int, images: int, threads: int, out: str) -> dict:
    env = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS=str(threads))
    cmd = [sys.executable, "-W", "ignore", "-m", "overinterp_fast", "audit", "--model", model, "--dataset", "cifar10",
           "--data-dir", data, "--size", str(side), "--method", "exact", "--limit", str(images), "--workers", "0",
           "--quiet", "-v", "--restart", "--out", out]
    t0 = time.time()
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    ends: list[float] = []

    def stdout():
        for line in p.stdout:
            if "report.html" in line:
                ends.append(time.time())  # the audit's last line

    reader = threading.Thread(target=stdout)
    reader.start()
    said, text = None, None
    for line in p.stderr:
        if said is None and re.search(r"audit of [\d,]+ images?", line):
            said, text = time.time(), line.strip()
    p.wait()
    reader.join()
    exited = time.time()
    if p.returncode or said is None or not ends:
        raise RuntimeError(f"the audit failed or said no estimate: {' '.join(cmd)}")
    m = re.search(r"(?:about|under) ([\d.]+) (s|min|h|d)", text)
    estimate_s = float(m.group(1)) * UNITS[m.group(2)]
    measured = ends[-1] - said
    return {"images": images, "side": side, "estimate_s": estimate_s, "measured_s": round(measured, 2),
            "ratio": round(measured / estimate_s, 2), "command_s": round(exited - t0, 2),
            "exit_s": round(exited - ends[-1], 2), "line": text}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--side", type=int, nargs="*", default=[8, 16])
    ap.add_argument("--images", type=int, nargs="*", default=[1, 4, 64])
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        from pathlib import Path

        write_cifar(Path(tmp), max(args.images))
        for side in args.side:
            model = export_tiny_cnn(Path(tmp) / f"net{side}.pt2", side, classes=10)  # CIFAR-10's classes
            for repeat in range(args.repeats):
                for n in args.images:
                    row = run(tmp, model, side, n, args.threads, os.path.join(tmp, f"audit{side}-{n}"))
                    row["repeat"] = repeat
                    rows.append(row)
                    print(f"{side}x{side}, {n:3d} images: estimate {row['estimate_s']:7.1f} s  measured "
                          f"{row['measured_s']:7.1f} s  ratio {row['ratio']:.2f}  (exit {row['exit_s']:.1f} s)",
                          flush=True)
    within = all(0.5 <= r["ratio"] <= 2.0 for r in rows)
    print(f"every estimate within 2x of its audit: {within}")
    print("wrote", write_results("audit-estimate", "cpu", rows, args.out, within_2x=within))


if __name__ == "__main__":
    main()

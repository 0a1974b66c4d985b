"""How faithful is the surrogate of virtual descents, and which surrogate is most faithful?

    cd benchmarks && PYTHONPATH=.. ../.venv/bin/python surrogate_study.py --rex-dir /tmp/rexkeep

A reference map per photo: ``--ref-iterations`` real monotone descents (seeds 90000 + t), far more than
any run. Each run (seeds ``--seed`` + 100 r + t): the default 8 real descents, then per surrogate
variant, ``--virtual`` virtual descents on it. Judged against the reference map (Spearman correlation
over pixels; Dice of the top ``--top`` share of pixels of both maps), against held-out mutants (the
reference descents' mutants: accuracy of the surrogate), and as window_study.py judges a run (MPS size,
queries, Dice to ReX's sets). Variants: ``ridgeL`` (L2 penalty L on the weights, fast_sis's surrogate
with L=1), ``smoothS`` (a penalty S on the squared differences of neighbouring cells' weights, plus
1e-3 ridge), each at ``--grids``.
"""
from __future__ import annotations

import argparse
import os
import statistics

import torch
from scipy.stats import spearmanr

from overinterp_fast.methods.responsibility import MutantCache, compute_responsibility
from overinterp_fast.experimental.surrogate import (SEED_OFFSET, Surrogate, logistic_newton, mutant_features, outcome_constants,
                                       ridge, virtual_descents)

from common import write_results
from window_study import Study


def penalty(grid: int, kind: str, strength: float) -> torch.Tensor:
    """:func:`logistic_newton`'s penalty matrix (float64 [d+1, d+1], none on the intercept) for ``kind`` "ridge"
    (``strength`` on each weight) or "smooth" (``strength`` on each squared difference of neighbouring cells'
    weights, plus 1e-3 ridge)."""
    d = grid * grid
    if kind == "ridge":
        return ridge(d, strength)
    lap = torch.zeros(d + 1, d + 1, dtype=torch.float64)
    for r in range(grid):
        for c in range(grid):
            a = r * grid + c
            for rr, cc in ((r + 1, c), (r, c + 1)):
                if rr < grid and cc < grid:
                    b = rr * grid + cc
                    lap[a, a] += 1
                    lap[b, b] += 1
                    lap[a, b] -= 1
                    lap[b, a] -= 1
    return strength * lap + ridge(d, 1e-3)


def penalised_fit(x, y, img, n, pen):
    """Per image with both outcomes, :func:`logistic_newton`: (weight [n, d], bias [n], constant per image)."""
    d = x.shape[1]
    weight, bias = torch.zeros(n, d, dtype=torch.float64), torch.zeros(n, dtype=torch.float64)
    constant = outcome_constants(y, img, n)
    fitted = torch.tensor([i for i in range(n) if constant[i] is None])
    sel = torch.isin(img, fitted)
    v = logistic_newton(x[sel], y[sel], torch.searchsorted(fitted, img[sel]), len(fitted), pen)
    weight[fitted], bias[fitted] = v[:, :d], v[:, d]
    return weight, bias, constant


def top_dice(a: torch.Tensor, b: torch.Tensor, share: float) -> float:
    k = int(round(share * a.numel()))
    ta = torch.zeros(a.numel(), dtype=torch.bool)
    tb = torch.zeros(a.numel(), dtype=torch.bool)
    ta[torch.argsort(a.flatten(), descending=True, stable=True)[:k]] = True
    tb[torch.argsort(b.flatten(), descending=True, stable=True)[:k]] = True
    return 2 * float((ta & tb).sum()) / (2 * k)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rex-dir", required=True)
    ap.add_argument("--runs", type=int, default=4)
    ap.add_argument("--seed", type=int, default=6000)
    ap.add_argument("--iterations", type=int, default=8)
    ap.add_argument("--virtual", type=int, default=100)
    ap.add_argument("--ref-iterations", type=int, default=48)
    ap.add_argument("--ref-cache", default="/tmp/surrogate_ref.pt")
    ap.add_argument("--top", type=float, default=0.116)
    ap.add_argument("--grids", type=int, nargs="*", default=[14])
    ap.add_argument("--variants", nargs="*", default=["ridge1", "ridge0.1", "smooth1", "smooth10"])
    ap.add_argument("--judge", action="store_true", help="also extract sets and compare with ReX's (queries)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    study = Study(args.rex_dir, [0, 20, 40], expected_rows=14 * 6 * args.iterations)
    n, h, w = study.n, study.h, study.w
    if os.path.exists(args.ref_cache):
        ref, ref_cache = torch.load(args.ref_cache, weights_only=False)
    else:
        ref_cache = MutantCache()
        ref, _ = compute_responsibility(study.ev, study.s.prep, study.present, study.passes, args.ref_iterations,
                                        10, 10, 90000, True, True, ref_cache)
        torch.save((ref, ref_cache), args.ref_cache)
    ref = ref.view(n, -1)

    def judge_map(m, q):
        rho = [float(spearmanr(m[i].numpy(), ref[i].numpy())[0]) for i in range(n)]
        td = [top_dice(m[i], ref[i], args.top) for i in range(n)]
        out = {"spearman": statistics.median(rho), "top_dice": statistics.median(td)}
        if args.judge:
            out.update({k: v for k, v in study.judge(m, q).items() if k in ("size", "queries", "dice")})
        return out

    rows: dict[str, list[dict]] = {}
    for r in range(args.runs):
        seed = args.seed + 100 * r
        cache = MutantCache()
        logs, q = compute_responsibility(study.ev, study.s.prep, study.present, study.passes, args.iterations,
                                         10, 10, seed, False, True, cache)
        logs = logs.view(n, -1)
        rows.setdefault("real", []).append(judge_map(logs, q))
        print(f"run {r} real: {rows['real'][-1]}", flush=True)
        for grid in args.grids:
            x, y, img = mutant_features(cache, study.present, study.passes, n, h, w, grid)
            xt, yt, imgt = mutant_features(ref_cache, study.present, study.passes, n, h, w, grid)
            for v in args.variants:
                kind = "ridge" if v.startswith("ridge") else "smooth"
                weight, bias, constant = penalised_fit(x, y, img, n, penalty(grid, kind, float(v[len(kind):])))
                sur = Surrogate(weight, bias, constant, grid, h, w, study.ev.runner, [float("nan")] * n)
                acc = float(((sur.predict(xt, imgt) > 0.5) == yt.bool()).double().mean())
                train = float(((sur.predict(x, img) > 0.5) == y.bool()).double().mean())
                vm = virtual_descents(sur, study.s.prep, study.present, list(range(n)), args.virtual, 10, 10,
                                      seed + SEED_OFFSET).view(n, -1)
                label = f"{v}/g{grid}"
                one = judge_map(logs + vm, q)
                one.update({"heldout_acc": acc, "train_acc": train, "virtual_only": judge_map(vm, q)["spearman"]})
                rows.setdefault(label, []).append(one)
                print(f"run {r} {label}: {one}", flush=True)
    summary = []
    for label, got in rows.items():
        keys = [k for k in got[0] if isinstance(got[0][k], float)]
        s = {k: statistics.mean(g[k] for g in got) for k in keys}
        summary.append({"variant": label, **s, "runs": got})
        print(label, {k: round(v, 4) for k, v in s.items()}, flush=True)
    if args.out:
        write_results("surrogate_study", "cpu", summary, args.out)


if __name__ == "__main__":
    main()

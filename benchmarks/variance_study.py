"""Can a run of the default minimal-pixel-set search be made less noisy for the same queries? Variants, measured.

    cd benchmarks && PYTHONPATH=.. ../.venv/bin/python bench_responsibility.py --keep /tmp/rexkeep   # ReX's sets
    cd benchmarks && PYTHONPATH=.. ../.venv/bin/python variance_study.py --rex-dir /tmp/rexkeep --runs 10   # ~25 min, 2 cores

window_study.py showed that one run of the defaults (8 monotone iterations) on the 7 photos is noisy,
and that its mean over runs misses the size and Dice bars. This script runs independent
runs (run r: iterations seeded ``--seed`` + 100 r + t, one mutant cache per run, as fast_sis)
of several variants, interleaved run by run, each judged as window_study.py judges a window
(the median over photos of MPS size, queries and Dice to ReX's sets). Variants:

- ``default``: fast_sis's defaults.
- ``sobol``: the split points of the T iterations come from one scrambled Sobol' sequence (scipy.stats.qmc,
  scrambled with the run's seed) instead of independent generators: iteration t takes point t, and its
  descent takes the point's coordinates in the order it draws split points (row, then column, box by
  box, level by level; past 64 coordinates its own generator). Each point is uniform on the unit cube, so
  each descent has ReX's distribution and the expected map is ReX's; only the iterations' joint spread
  changes (stratified top-level splits). A variance reduction, if the map's noise comes from the splits.
- ``pairs-any``: the monotone rule made stronger for pairs only: a pair is taken as failing when either of
  its two 3-quadrant supersets failed (singles keep the default rule). Fewer queries per iteration, so
  one more iteration for the budget.
- ``pixels64``: the default map, ranked pixel by pixel (no squares) and scanned in steps of 64 pixels,
  bisection inside the last step.
- ``virtualV`` (e.g. ``virtual100``): fast_sis's ``virtual_iterations=V``: V more descents per image on a
  surrogate fitted to the mutants the real ones scored (``overinterp_fast/surrogate.py``), at no query.
- ``scanS`` (e.g. ``scan128``): the square scan tries every one of the first S squares (the default:
  ``blocks.SCAN_SQUARES``) before its steps of ``blocks.SCAN_RATIO``.
- ``gatedG`` (e.g. ``gated9``): fast_sis's ``gated_iterations=G``: G more descents per image after the real
  ones, in which a surrogate refitted before each answers the mutants it is sure of and the model the others
  (``surrogate.add_gated_descents``); with ``virtualV`` the virtual descents come after them, as in fast_sis.
- ``wA`` with ``virtualV`` (e.g. ``virtual40+w0.1``): the virtual descents' log maps count with weight A
  (fast_sis: 1) in the sum with the real ones.
- ``guided``: the extraction of fast_sis's defaults now (``prefix_search="guided"``: the first passing prefix of the
  square ranking in steps of 10 pixels, found from the margins, :mod:`overinterp_fast.methods.guided`); without it (and
  without ``pxguided`` or ``pixels64``), the square scan of the defaults before it.
- ``pxguided``: the map ranked pixel by pixel (no squares), the first passing prefix in steps of 10 pixels found by
  the guided search: ReX's extraction of the map, at the guided search's cost.
- ``full``: monotone=False (every mutant scored, as ReX; ``full:20`` is ReX's algorithm with ReX's 20 descents).
- ``blurS`` (e.g. ``blur6``): the map (the descents' summed log maps) smoothed by a Gaussian of S pixels
  (scipy.ndimage.gaussian_filter, edges repeated) before the extraction ranks it. A variance reduction bought with
  bias: neighbouring pixels' responsibilities are pooled.
- ``infer``, ``infer-pass``, ``infer-fail``: monotone inference *across* descents. The descents run in waves (wave t:
  descent t of every image), and every mutant the model scored is remembered per image as a pixel mask: the minimal
  passing ones and the maximal failing ones. Before a round is scored, a mutant that contains a remembered pass is
  taken as passing, and one inside a remembered fail as failing, without a query (``infer-pass`` / ``infer-fail``:
  only that half of the rule). The same assumption as the monotone rounds of one split (passing monotone in the
  pixels kept), applied between splits, levels and descents; on a monotone criterion the map is unchanged.
  Measured here: how often the inference is wrong on the real model (``--check``: the inferred mutants are also
  scored, not counted as queries), and what the saved queries buy in more descents.
- ``squareS`` (e.g. ``square16``): the extraction ranks squares of S x S pixels (fast_sis's ``block=S``; the defaults:
  ``block="auto"``, 8 at 224 x 224).
- parts joined by ``+`` combine: ``virtual40+scan128``.

Also printed, per run and variant: "at ReX's sizes", the Dice of the ranking the extraction used, cut at each ReX
set's own size (``window_study.oracle_size_dice``: how well the map ranks, apart from where the search stops), and
once, ReX's own figure (each seed's map cut at the other seeds' sizes).

Also printed: where the descents' queries go, per image and iteration by level (level 0 splits the
whole image).

Writes benchmarks/results/variance_study_cpu.json.
"""
from __future__ import annotations

import argparse
import importlib
import re
import statistics

import numpy as np
import torch
from scipy.ndimage import gaussian_filter
from scipy.stats import qmc

import overinterp_fast.methods.extraction as extraction_module
from overinterp_fast.methods.blocks import scan_sizes
from overinterp_fast.experimental.mutant_memory import MutantMemory, RememberingEvaluator, remembered_responsibility
from overinterp_fast.methods.responsibility import (SUBSETS, MutantCache, compute_responsibility, ranking_positions,
                                            score_painted_rows)
from overinterp_fast.experimental.surrogate import add_gated_descents, add_virtual_descents

from common import write_results
from rex_map_extraction import rex_maps
from window_study import Study, describe, oracle_size_dice

resp = importlib.import_module("overinterp_fast.methods.responsibility")  # the module (the package exports a function so named)
DEFAULT_RNG, DEFAULT_SKIP = resp.descent_rng, resp.skipped
CHECK = {"on": False}  # --check: also score the inferred mutants; "wrong"/"inferred" count per run
SOBOL_DIMS = 64
EXTRACTION_PARTS = ("scan", "guided", "pxguided", "pixels64", "blur", "square")  # parts applied after the descents' map


class _PointRng:
    """A descent's split points from one quasi-random point, then from its own generator."""

    def __init__(self, point: np.ndarray, seed: int):
        self.point, self.k, self.rest = point, 0, np.random.default_rng(seed)

    def integers(self, lo: int, hi: int) -> int:
        if self.k < len(self.point):
            self.k += 1
            return lo + int(self.point[self.k - 1] * (hi - lo))
        return int(self.rest.integers(lo, hi))


def sobol_rng(first_seed: int, iterations: int, scramble: int):
    points = qmc.Sobol(d=SOBOL_DIMS, scramble=True, seed=scramble).random_base2(max(0, (iterations - 1).bit_length()))

    def make(seed: int):
        t = seed - first_seed
        return _PointRng(points[t], seed) if 0 <= t < iterations else np.random.default_rng(seed)
    return make


def pairs_any(k: int, superset_passed: list[bool]) -> bool:
    if len(SUBSETS[k]) == 2:
        return not all(superset_passed)
    return DEFAULT_SKIP(k, superset_passed)


def parts(variant: str) -> dict[str, int | float | None]:
    """``a+virtual40+scan128`` -> {"a": None, "virtual": 40, "scan": 128}; raises SystemExit on an unknown part."""
    out: dict[str, int | float | None] = {}
    for part in variant.split("+"):
        if part in ("default", "sobol", "pairs-any", "pixels64", "guided", "pxguided", "full", "infer", "infer-pass",
                    "infer-fail"):
            out[part] = None
        elif part.startswith("w") and part[1:].replace(".", "", 1).isdigit():
            out["w"] = float(part[1:])
        elif re.fullmatch(r"(virtual|scan|gated|blur|square)\d+", part):
            name = re.match(r"[a-z]+", part).group()
            out[name] = int(part[len(name):])
        else:
            raise SystemExit(f"unknown variant part {part!r} in {variant!r}")
    if "w" in out and "virtual" not in out:
        raise SystemExit(f"{variant!r}: a weight (w) needs virtual descents")
    return out


def run(study: Study, variant: str, iterations: int, seed: int, scramble: int, maps: dict | None = None) -> dict:
    """One run of a variant. ``maps``: the maps already computed in this run, keyed by the parts that make them
    (all but ``EXTRACTION_PARTS``, which only change the extraction or smooth the map): a variant that differs from
    another only in those parts reuses that one's map and queries (the maps are deterministic in the seeds)."""
    opts = parts(variant)
    key = (iterations, seed, scramble, tuple(sorted((k, v) for k, v in opts.items() if k not in EXTRACTION_PARTS)))
    if maps is not None and key in maps:
        logs, q, level_queries = maps[key]
    else:
        CHECK.update(inferred=0, wrong=0)
        logs, q, level_queries = ranking(study, opts, iterations, seed, scramble)
        if maps is not None:
            maps[key] = (logs, q, level_queries)
    if "blur" in opts:
        logs = blurred(logs.view(study.n, study.h, study.w), opts["blur"])
    extraction = {"block": None, "refine_scan": 64} if "pixels64" in opts else {}
    if "pxguided" in opts:
        extraction = {"block": None, "guided": True}
    elif "guided" in opts:
        extraction = {"guided": True}
    if "square" in opts:
        extraction["block"] = opts["square"]
    if "scan" in opts:
        extraction_module.scan_sizes = lambda ends: scan_sizes(ends, squares=opts["scan"])
    try:
        out = study.judge(logs.view(study.n, study.p), q, **extraction)
    finally:
        extraction_module.scan_sizes = scan_sizes
    out["level_queries"] = level_queries
    if CHECK["on"] and CHECK["inferred"]:
        out["inference_check"] = {"inferred": CHECK["inferred"], "wrong": CHECK["wrong"]}
    return out


def ranking(study: Study, opts: dict, iterations: int, seed: int, scramble: int):
    """The map of a variant's parts: (float64 [N, H, W], the model's queries per image, the descents' queries per
    image and descent by level)."""
    resp.descent_rng = sobol_rng(seed, iterations, scramble) if "sobol" in opts else DEFAULT_RNG
    resp.skipped = pairs_any if "pairs-any" in opts else DEFAULT_SKIP
    cache = MutantCache()
    infer = next((part for part in ("infer", "infer-pass", "infer-fail") if part in opts), None)
    try:
        if infer is None:
            logs, q = compute_responsibility(study.ev, study.s.prep, study.present, study.passes, iterations, 10, 10,
                                             seed, False, "full" not in opts, cache)
        else:
            logs, q = inferred_descents(study, cache, iterations, seed, "full" not in opts, infer)
    finally:
        resp.descent_rng, resp.skipped = DEFAULT_RNG, DEFAULT_SKIP
    if "gated" in opts:
        logs, q = add_gated_descents(logs, q, cache, study.ev, study.s.prep, study.present, study.passes,
                                     opts["gated"], seed + iterations, 10, 10, "full" not in opts)
    if "virtual" in opts:
        both = add_virtual_descents(logs, cache, study.ev.runner, study.s.prep, study.present, study.passes,
                                    opts["virtual"], 10, 10, seed)
        logs = both if "w" not in opts else logs + opts["w"] * (both - logs)
    descents = iterations + opts.get("gated", 0)  # the model's queries: real and gated descents
    return logs, q, [c / (study.n * descents) for c in cache.level_queries]  # per image and descent


class Memory(MutantMemory):
    """The library's memory (:class:`~overinterp_fast.experimental.mutant_memory.MutantMemory`), with ``rule`` "infer-pass" or
    "infer-fail": only that half of its inference (the other half's masks are still remembered, not used)."""

    def __init__(self, n: int, rule: str):
        super().__init__(n)
        self.rule = rule

    def infer(self, i: int, masks: torch.Tensor) -> torch.Tensor:
        passing, failing = self.passing[i], self.failing[i]
        self.passing[i] = None if self.rule == "infer-fail" else passing
        self.failing[i] = None if self.rule == "infer-pass" else failing
        try:
            return super().infer(i, masks)
        finally:
            self.passing[i], self.failing[i] = passing, failing


class CheckedEvaluator(RememberingEvaluator):
    """The library's remembering evaluator; with ``--check`` (``CHECK["on"]``) the mutants the memory answered
    are also scored on the model (not counted as queries), and the wrong answers counted."""

    def score_rectangles(self, rects, owner, images, present):
        out = super().score_rectangles(rects, owner, images, present)
        known = (out[:, 3] == 0).nonzero().flatten()
        if CHECK["on"] and len(known):
            truth = score_painted_rows(self.evaluator, rects, owner, images, known, present, self.h, self.w)
            CHECK["inferred"] = CHECK.get("inferred", 0) + len(known)
            CHECK["wrong"] = CHECK.get("wrong", 0) + int((truth[:, 1] != out[known, 1]).sum())
        return out


def inferred_descents(study: Study, cache: MutantCache, iterations: int, seed: int, monotone: bool, rule: str):
    """The ``infer`` parts: fast_sis's ``monotone_memory=True`` descents
    (:func:`~overinterp_fast.experimental.mutant_memory.remembered_responsibility`: descent t of every image in wave t, seed + t),
    with :class:`Memory`'s rule and :class:`CheckedEvaluator`'s check; returns (float64 [N, H, W], the model's
    queries per image)."""
    scorer = CheckedEvaluator(study.ev, Memory(study.n, rule), study.passes, study.h, study.w)
    return remembered_responsibility(study.ev, study.s.prep, study.present, study.passes, iterations, 10, 10, seed,
                                     False, monotone, cache, scorer=scorer)


def blurred(logs: torch.Tensor, sigma: float) -> torch.Tensor:
    """Each image's map (float64 [n, H, W]) smoothed by a Gaussian of ``sigma`` pixels, edges repeated."""
    return torch.from_numpy(np.stack([gaussian_filter(m.numpy(), sigma, mode="nearest") for m in logs]))


def rex_oracle_dice(study: Study, rex_dir: str, seeds: list[int]) -> float:
    """ReX's agreement with itself apart from where its prefix search stops: each seed's map ranked pixel by pixel
    (as ReX ranks it), cut at each other seed's set size (:func:`~window_study.oracle_size_dice`); the median over
    photos of the mean over ordered pairs of seeds."""
    per_photo = [[] for _ in range(study.n)]
    for s, m in enumerate(rex_maps(rex_dir, seeds, study.n)):
        orders = torch.argsort(ranking_positions(m, study.present), dim=1)
        for i, d in enumerate(oracle_size_dice(list(orders), study.rex, study.h, study.w, skip=s)):
            per_photo[i].append(d)
    return statistics.median(statistics.mean(v) for v in per_photo)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rex-dir", required=True, help="bench_responsibility.py --keep folder (ONNX file, rex*.npz)")
    ap.add_argument("--rex-seeds", type=int, nargs="*", default=[0, 20, 40])
    ap.add_argument("--seed", type=int, default=6000, help="run r's iterations are seeded seed + 100 r + t")
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--variants", nargs="*", default=["default:8", "sobol:8", "pairs-any:9", "pixels64:8"],
                    help="variant:iterations")
    ap.add_argument("--check", action="store_true", help="infer parts: also score the inferred mutants in run 0 "
                    "(not counted as queries) and report how many inferences were wrong")
    ap.add_argument("--out", default=None, help="default: benchmarks/results/variance_study_cpu.json")
    args = ap.parse_args()
    plan = [(v, int(t)) for v, t in (x.split(":") for x in args.variants)]
    for v, _ in plan:
        parts(v)
    study = Study(args.rex_dir, args.rex_seeds, expected_rows=14 * 6 * max(t for _, t in plan))
    rex_oracle = rex_oracle_dice(study, args.rex_dir, args.rex_seeds)
    print(f"ReX: median MPS {100 * study.rex_size:.2f}%, seed-to-seed Dice {study.rex_dice:.3f}, at the other seeds' "
          f"sizes {rex_oracle:.3f}", flush=True)
    runs: dict[tuple[str, int], list[dict]] = {key: [] for key in plan}
    torch.set_grad_enabled(False)
    for r in range(args.runs):
        maps: dict = {}  # this run's maps, shared by variants that differ only in their scan
        for variant, t in plan:
            CHECK["on"] = args.check and r == 0
            one = run(study, variant, t, args.seed + 100 * r, scramble=r, maps=maps)
            runs[variant, t].append(one)
            print(f"run {r} {variant}:{t}: MPS {100 * one['size']:5.2f}%, queries {one['queries']:.0f}, "
                  f"Dice {one['dice']:.3f} (at ReX's sizes {one['oracle_dice']:.3f})"
                  + (f", inferences wrong {one['inference_check']['wrong']} of {one['inference_check']['inferred']}"
                     if "inference_check" in one else ""), flush=True)
    rows = []
    for (variant, t), got in runs.items():
        row = {"variant": variant, "iterations": t, **study.summary(got), "rex_oracle_dice": rex_oracle}
        depth = max(len(g["level_queries"]) for g in got)
        row["mean_level_queries"] = [round(sum(g["level_queries"][lv] for g in got if lv < len(g["level_queries"]))
                                           / len(got), 2) for lv in range(depth)]
        rows.append(row)
        print(describe(f"{variant}:{t}", row), flush=True)
        print(f"    descent queries per image and iteration by level: {row['mean_level_queries']}", flush=True)
    print(f"wrote {write_results('variance_study', 'cpu', rows, args.out)}")


if __name__ == "__main__":
    main()

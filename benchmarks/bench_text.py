"""Input reduction (Feng et al. 2018) on the bundled Rotten Tomatoes word CNN: packed engine vs the plain transcription.

Contenders, run in interleaved rounds (minimum over rounds reported):
  reference   overinterp_fast.methods.reference.input_reduction: one sequence and one beam member at a time, each
              member's deleted-token rows as one batch (the algorithm transcribed).
  packed      of.input_reduction, default options: every beam member of every sequence in shared batches;
              leave-one-out through the word CNN's incremental deletion_logits.
  packed-rows of.input_reduction(incremental=False): the same packing, every deleted-token row run as a row.
Every contender's reductions are compared with the reference's (kept positions of the reported reduction and
the whole final beam). The cold case: a fresh process, one snippet, default options (model loaded from cache).

    python benchmarks/bench_text.py                   # 200 held-out snippets, beam 5, CPU, 1 thread -> results/text-cpu.json
    python benchmarks/bench_text.py --n 5 --rounds 1  # a smoke run
    python benchmarks/bench_text.py --importance gradient --rounds 2
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

import overinterp_fast as of  # noqa: E402
from common import ROOT, machine, write_results  # noqa: E402
from overinterp_fast.methods import reference  # noqa: E402
from overinterp_fast.zoo.text import bundled_text_model, load_text_data  # noqa: E402

COLD = r"""
import json, sys, time, torch
torch.set_num_threads(int(sys.argv[2]))
import overinterp_fast as of
from overinterp_fast.methods import reference
from overinterp_fast.zoo.text import bundled_text_model, load_text_data
tm = bundled_text_model()
seq = [tm.vocab.encode(load_text_data().tokens_test[0])]
t = time.perf_counter()
if sys.argv[1] == "packed":
    of.input_reduction(tm.model, seq)
else:
    reference.input_reduction(tm.model, seq)
print(json.dumps({"seconds": time.perf_counter() - t, "length": int(seq[0].numel())}))
"""


def same(fast, ref) -> tuple[int, int]:
    """(sequences with the reference's reduction, with the reference's whole final beam)."""
    kept = sum(r.kept.tolist() == q["kept"] for r, q in zip(fast, ref))
    beam = sum([tuple(b.kept.tolist()) for b in r.beam] == [b[0] for b in q["beam"]] for r, q in zip(fast, ref))
    return kept, beam


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=200, help="held-out snippets (default 200)")
    ap.add_argument("--beam", type=int, default=5)
    ap.add_argument("--importance", choices=("leave_one_out", "gradient"), default="leave_one_out")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads (default 1: the word CNN's ops are small; on a shared machine 2 threads "
                         "ran 10-50x slower from OpenMP contention)")
    ap.add_argument("--no-cold", action="store_true")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    tm = bundled_text_model()
    data = load_text_data()
    seqs = [tm.vocab.encode(t) for t in data.tokens_test[: args.n]]
    model = tm.model
    kw = dict(beam_size=args.beam, importance=args.importance)
    contenders = {
        "reference": lambda: reference.input_reduction(model, seqs, embedding=model.embedding, **kw),
        "packed": lambda: of.input_reduction(model, seqs, show_progress=False, **kw),
    }
    if args.importance == "leave_one_out":
        contenders["packed-rows"] = lambda: of.input_reduction(model, seqs, show_progress=False, incremental=False,
                                                               **kw)
    times = {k: [] for k in contenders}
    outputs = {}
    for rnd in range(args.rounds):
        for name, fn in contenders.items():
            t = time.perf_counter()
            outputs[name] = fn()
            times[name].append(time.perf_counter() - t)
            print(f"round {rnd + 1}: {name:<12} {times[name][-1]:7.2f} s", flush=True)
    best = {k: min(v) for k, v in times.items()}
    ref = outputs["reference"]
    queries = sum(r["queries"] for r in ref)
    rows = []
    for name in contenders:
        row = {"contender": name, "seconds_min": best[name], "seconds_all": times[name],
               "speedup_vs_reference": best["reference"] / best[name], "sequences": len(seqs),
               "queries": queries, "beam": args.beam, "importance": args.importance}
        if name != "reference":
            row["same_reduction"], row["same_beam"] = same(outputs[name], ref)
        rows.append(row)
    lengths = [len(r["kept"]) for r in ref]
    summary = {"mean_length": sum(int(s.numel()) for s in seqs) / len(seqs),
               "median_reduced_length": sorted(lengths)[len(lengths) // 2],
               "share_more_confident": sum(r["confidence"] > r["original_confidence"] for r in ref) / len(ref)}
    if not args.no_cold:
        for name in ("packed", "reference"):
            out = subprocess.run([sys.executable, "-c", COLD, name, str(args.threads)], capture_output=True,
                                 text=True, check=True, cwd=ROOT)
            cold = json.loads(out.stdout.strip().splitlines()[-1])
            rows.append({"contender": f"cold-{name}", "seconds_min": cold["seconds"], "sequences": 1,
                         "length": cold["length"], "beam": args.beam, "importance": "leave_one_out"})
    print(f"\n{len(seqs)} snippets (mean length {summary['mean_length']:.1f}), beam {args.beam}, {args.importance}, "
          f"{queries} queries, {args.threads} thread(s), {machine('cpu').get('cpu')}")
    print(f"{'contender':<16} {'min s':>8} {'vs reference':>13} {'same reduction':>15} {'same beam':>10}")
    for r in rows:
        print(f"{r['contender']:<16} {r['seconds_min']:>8.3f} {r.get('speedup_vs_reference', float('nan')):>12.2f}x "
              f"{r.get('same_reduction', '-')!s:>15} {r.get('same_beam', '-')!s:>10}")
    rows.append({"summary": summary})
    name = "text" if args.importance == "leave_one_out" else "text-gradient"
    print(f"wrote {write_results(name, 'cpu', rows, args.out)}")


if __name__ == "__main__":
    main()

"""The mitigation of Feng et al. 2018 (entropy fine-tuning) on the bundled Rotten Tomatoes word CNN: does entropy fine-tuning make the model less
confident on reduced inputs while its accuracy holds?

Reduced examples: every final beam member (beam 5) of input reduction on the first --reduce training snippets.
Fine-tuning: one epoch over all training snippets, CE + lambda * entropy on reduced examples; lambda = 0 is the
control (the same fine-tuning without the entropy term). Evaluation on held-out snippets: accuracy (all of them)
and input reduction of the first --eval snippets (mean confidence on the reduced inputs, reduced length).

    python examples/text_entropy_finetune.py --lam 0 1 --out docs/notes/results/text-entropy-cpu.json
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from overinterp_fast.text import entropy_finetune, input_reduction
from overinterp_fast.zoo.text import bundled_text_model, load_text_data, text_accuracy


def evaluate(model, test_seqs, y_test, eval_seqs) -> dict:
    red = input_reduction(model, eval_seqs, beam_size=5, show_progress=False)
    return {"accuracy": text_accuracy(model, test_seqs, y_test),
            "reduced_confidence_mean": statistics.fmean(r.confidence for r in red),
            "original_confidence_mean": statistics.fmean(r.original_confidence for r in red),
            "reduced_length_mean": statistics.fmean(r.length for r in red),
            "reduced_length_median": statistics.median(r.length for r in red),
            "share_more_confident": statistics.fmean(r.confidence > r.original_confidence for r in red)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lam", type=float, nargs="+", default=[0.0, 1.0])
    ap.add_argument("--reduce", type=int, default=2000, help="training snippets reduced for X~ (default 2000)")
    ap.add_argument("--eval", type=int, default=200, help="held-out snippets reduced for evaluation")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    tm = bundled_text_model()
    data = load_text_data()
    train = [tm.vocab.encode(t) for t in data.tokens_train]
    test = [tm.vocab.encode(t) for t in data.tokens_test]
    rows = [{"model": "bundled", **evaluate(tm.model, test, data.y_test, test[: args.eval])}]
    print(rows[-1])
    for lam in args.lam:
        t = time.perf_counter()
        # X~ from the first --reduce training inputs, the log-likelihood term over all of them
        res = entropy_finetune(tm.model, (train, data.y_train), lam, reduce_limit=args.reduce, show_progress=False)
        rows.append({"model": f"fine-tuned, lambda={lam:g}", "reduced_examples": res.reduced_examples,
                     "seconds": time.perf_counter() - t, **evaluate(res.model, test, data.y_test, test[: args.eval])})
        print(rows[-1])
    print(f"\n{'model':<24} {'accuracy':>9} {'conf. on reduced':>17} {'orig. conf.':>12} {'reduced len':>12} "
          f"{'more conf.':>11}")
    for r in rows:
        print(f"{r['model']:<24} {r['accuracy']:>9.3f} {r['reduced_confidence_mean']:>17.3f} "
              f"{r['original_confidence_mean']:>12.3f} {r['reduced_length_mean']:>12.2f} {r['share_more_confident']:>11.1%}")
    if args.out:
        with open(args.out, "w") as fh:
            json.dump({"command": "python examples/text_entropy_finetune.py " + " ".join(
                f"--{k} {' '.join(map(str, v)) if isinstance(v, list) else v}" for k, v in vars(args).items()
                if v is not None), "rows": rows}, fh, indent=1)
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

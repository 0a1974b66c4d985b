"""How often can a low dtype decide a backward-selection step? A study of score_dtype's premise on small CNNs.

    python scripts/low_precision_study.py --model resnet20 --side 16                 # random weights
    python scripts/low_precision_study.py --model resnet20 --side 16 --head 10       # last layer x 10
    python scripts/low_precision_study.py --model resnet20 --side 16 --trained       # 150 SGD steps on synthetic images
    python scripts/low_precision_study.py --model small --side 16 --dtype float16

Runs one image's whole backward selection in float32 (pixel features, masking by 0) and scores every candidate of
every step in the low dtype too (a copy of the model, logits taken to float32 before the softmax, as score_dtype
does). Reports the error |f_low - f_full| per step and the share of a round's candidates whose low score lies within
a margin of their step's best low score, for margins of 4x the first step's largest error (how score_dtype sizes K),
4x the running largest error (how its margin grows), 4x and 1x each step's own largest error: the share a
low-precision step must re-score in float32 to decide exactly, whatever K. Seconds to minutes on 2 CPU cores.
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import sys

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

from common import NearFree, StrideCNN  # noqa: E402
from overinterp_fast.zoo.cifar import ResNet20, SmallCNN  # noqa: E402

MODELS = {"resnet20": lambda side: ResNet20(), "small": lambda side: SmallCNN(side), "stride": lambda side: StrideCNN(),
          "linear": lambda side: NearFree(3 * side * side)}


def synthetic(n: int, side: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Ten classes, each a smooth colour template (4 x 4 random colours upsampled), plus pixel noise (std 0.8)."""
    base = torch.randn(10, 3, 4, 4, generator=torch.Generator().manual_seed(123))
    templates = 1.5 * torch.nn.functional.interpolate(base, size=(side, side), mode="bilinear", align_corners=False)
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 10, (n,), generator=g)
    return templates[y] + 0.8 * torch.randn(n, 3, side, side, generator=g), y


def train(model: torch.nn.Module, side: int, steps: int = 150) -> torch.nn.Module:
    """``steps`` SGD steps (batch 64, lr 0.1, momentum 0.9) on :func:`synthetic` images."""
    torch.manual_seed(0)
    x, y = synthetic(64 * steps, side, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
    model.train()
    for i in range(steps):
        loss = torch.nn.functional.cross_entropy(model(x[64 * i:64 * (i + 1)]), y[64 * i:64 * (i + 1)])
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval()


def study(model: torch.nn.Module, x: torch.Tensor, dtype: torch.dtype) -> dict:
    """Backward selection of one image [1, 3, S, S] in float32, every candidate also scored in ``dtype``."""
    side = x.shape[-1]
    p = side * side
    low = copy.deepcopy(model).to(dtype)
    present = torch.ones(p, dtype=torch.bool)
    steps = []
    with torch.inference_mode():
        target = int(model(x).argmax(1))
        f0 = float(torch.softmax(model(x), 1)[0, target])
        while present.any():
            idx = present.nonzero().flatten()
            keep = present.repeat(len(idx), 1)
            keep[torch.arange(len(idx)), idx] = False
            cand = torch.where(keep.view(-1, 1, side, side), x, torch.zeros(()))
            full = torch.softmax(model(cand), 1)[:, target].double()
            lowf = torch.softmax(low(cand.to(dtype)).float(), 1)[:, target].double()
            steps.append((float((full - lowf).abs().max()), lowf))
            present[idx[int(full.argmax())]] = False
    errs = np.array([e for e, _ in steps])
    total = p * (p + 1) // 2
    running = np.maximum.accumulate(errs)
    margins = {"4x first step's error": 4 * errs[0] + 0 * errs, "4x running largest error": 4 * running,
               "4x the step's own error": 4 * errs, "1x the step's own error": errs}
    shares = {k: sum(int((lo >= lo.max() - m).sum()) for (_, lo), m in zip(steps, ms)) / total
              for k, ms in margins.items()}
    return {"f0": f0, "features": p, "error_first": float(errs[0]), "error_quantiles_0_50_90_100":
            np.quantile(errs, [0, 0.5, 0.9, 1]).tolist(), "share_within": shares}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=sorted(MODELS), default="resnet20")
    ap.add_argument("--side", type=int, default=16)
    ap.add_argument("--head", type=float, default=1.0, help="multiply the last linear layer's weights")
    ap.add_argument("--trained", action="store_true", help="train first (150 SGD steps on synthetic images)")
    ap.add_argument("--dtype", choices=("bfloat16", "float16"), default="bfloat16")
    ap.add_argument("--image-seed", type=int, default=1)
    args = ap.parse_args()
    torch.manual_seed(0)
    model = MODELS[args.model](args.side).eval()
    if args.trained:
        model = train(model, args.side)
        x = synthetic(1, args.side, 999)[0]
    else:
        x = torch.randn(1, 3, args.side, args.side, generator=torch.Generator().manual_seed(args.image_seed))
    last = [m for m in model.modules() if isinstance(m, torch.nn.Linear)][-1]
    with torch.no_grad():
        last.weight *= args.head
    print(json.dumps({**vars(args), **study(model, x, getattr(torch, args.dtype))}, indent=1))


if __name__ == "__main__":
    main()

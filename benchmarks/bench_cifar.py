"""The paper's CIFAR-10 workload: exact SIS of ResNet-20 on CIFAR-10-shaped images, against the model's bare rate.

    python benchmarks/bench_cifar.py --device cuda      # 32 images of 3x32x32 (1,024 features) -> results/cifar-cuda.json
    python benchmarks/bench_cifar.py                    # CPU: 2 images of 3x16x16 (256 features) -> results/cifar-cpu.json
    python benchmarks/bench_cifar.py --device cuda --checkpoint resnet20.pt --data-dir ~/data   # a trained model,
                                                        # the first CIFAR-10 test images

The workload (Carter et al. 2021): ResNet-20 (overinterp_fast.zoo.cifar, seeded, random weights; --checkpoint: a state
dict of that architecture, or a pickled module), CIFAR-10-shaped images (generated CIFAR-like: smooth colour fields
with pixel noise in [0, 1], seeded; --data-dir: the first test images of a CIFAR-10 python batch folder, averaged
down to --size where it is below 32), normalized with CIFAR-10's mean and std, one feature per pixel (all channels of
a pixel one feature), masking by 0, threshold 0.99, backward selection and FindSIS. The threshold per image is
0.99 where f(x) >= 0.99, else 0.99 f(x) (the audit's "auto" mode: a model of random weights is not confident, and its
images still get a SIS); --threshold-mode absolute gives the paper's 0.99 for every image.

Runs, each once (a user's first call: calibration, the format's measurement and CUDA graph captures included), the
float32 one first:
  float32   fast_sis with default options (engine "auto", calibrated batch size, channels_last where measured faster)
  bf16      the same with score_dtype=torch.bfloat16 (candidates scored in bfloat16 first, the undecided ones again
            in float32; the result is float32's)
  ceiling   the model's best bare rate: plain forward passes and softmax on candidate-like rows over a sweep of
            batch sizes, in float32 as given, float32 channels_last and bfloat16 channels_last; the best rows/s of
            the float32 sweeps is the ceiling (the bfloat16 one is reported beside it)

One row (config "cifar-resnet20-<S>x<S>"): rows_per_s (float32's candidate rows per second), bf16_rows_per_s,
ceiling_rows_per_s, fraction_of_ceiling, images_per_hour and projected_hours_10000 / projected_hours_60000: a
projection from the measured images (the faster of the runs whose SIS equal float32's, named in projected_from) to
10,000 and 60,000 images of the same size, never a measurement of them; same_sis_as_float32 (and
same_order_and_values), rescored and rescored_share (candidates scored again in float32 after bfloat16), the batch
size, engine and format each run chose (SISResult.info), and the low-precision summary (K, m, whether declined).
The file records the commit, machine and versions (common.write_results). The row is written after each run, so a
run stopped by a timeout keeps what was measured.
"""
from __future__ import annotations

import argparse
import copy
import math
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import overinterp_fast as of  # noqa: E402
from common import ceiling, explain, same_sis, sync, write_results  # noqa: E402
from overinterp_fast.zoo.cifar import ResNet20  # noqa: E402

MEAN, STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)  # CIFAR-10's training set, per channel
THRESHOLD = 0.99
DEFAULTS = {"cuda": (32, 32), "cpu": (2, 16)}  # device type: (images, side)
SWEEP = (64, 256, 1024, 4096, 8192, 16384, 32768)  # ceiling batch sizes (those up to the job's rows per step)


def load_model(checkpoint: str | None, device) -> torch.nn.Module:
    """ResNet-20 of random weights (seed 0), or from ``checkpoint``: a state dict of the zoo's ResNet-20 (also under a
    "state_dict" or "model" key), or a pickled module (a file you trust). Eval mode, on ``device``."""
    torch.manual_seed(0)
    if checkpoint is None:
        return ResNet20().to(device).eval()
    obj = torch.load(checkpoint, map_location="cpu", weights_only=False)
    if isinstance(obj, torch.nn.Module):
        return obj.to(device).eval()
    if isinstance(obj, dict) and not any(torch.is_tensor(v) for v in obj.values()):
        obj = obj.get("state_dict", obj.get("model", obj))
    model = ResNet20()
    model.load_state_dict({k.removeprefix("module."): v for k, v in obj.items()})
    return model.to(device).eval()


def cifar_like(n: int, side: int, seed: int = 1) -> torch.Tensor:
    """``n`` CIFAR-like photos, float32 [n, 3, side, side] in [0, 1]: smooth colour fields (4 x 4 random colours
    bilinearly upsampled) with pixel noise (std 0.08), seeded."""
    g = torch.Generator().manual_seed(seed)
    coarse = torch.rand(n, 3, 4, 4, generator=g)
    smooth = torch.nn.functional.interpolate(coarse, size=(side, side), mode="bilinear", align_corners=False)
    return (smooth + 0.08 * torch.randn(n, 3, side, side, generator=g)).clamp(0, 1)


def cifar_test_images(data_dir: str, n: int, side: int) -> torch.Tensor:
    """The first ``n`` CIFAR-10 test images of a python batch folder, float32 [n, 3, side, side] in [0, 1] (averaged
    over 32 / side squares where side < 32)."""
    from overinterp_fast.audit.sources import open_images

    src = open_images(dataset="cifar10", data_dir=data_dir, split="test")
    photos = torch.stack([torch.from_numpy(src.display(i)).permute(2, 0, 1) for i in range(n)]).float() / 255
    return torch.nn.functional.avg_pool2d(photos, 32 // side) if side < 32 else photos


def normalize(photos: torch.Tensor) -> torch.Tensor:
    return (photos - torch.tensor(MEAN).view(1, 3, 1, 1)) / torch.tensor(STD).view(1, 3, 1, 1)


def thresholds(model, images: torch.Tensor, mode: str) -> list[float]:
    """THRESHOLD per image: as is ("absolute"), or 0.99 f(x) where f(x) < 0.99 ("auto")."""
    with torch.inference_mode():
        f = torch.softmax(model(images), 1).max(1).values.double().tolist()
    return [THRESHOLD if mode == "absolute" or v >= THRESHOLD else THRESHOLD * v for v in f]


def ceilings(model, images: torch.Tensor, max_rows: int, device) -> dict[str, dict[int, float]]:
    """Bare rates (common.ceiling) over SWEEP up to ``max_rows``: float32 as given, float32 and bfloat16
    channels_last."""
    sizes = [b for b in SWEEP if b < max_rows] + [max_rows] if max_rows < SWEEP[-1] else list(SWEEP)
    cl = torch.channels_last
    out = {"float32": ceiling(model, images, None, sizes, device)}
    m32 = copy.deepcopy(model).to(memory_format=cl)
    out["float32_channels_last"] = ceiling(m32, images.contiguous(memory_format=cl), None, sizes, device)
    m16 = copy.deepcopy(model).to(torch.bfloat16).to(memory_format=cl)
    out["bfloat16_channels_last"] = ceiling(m16, images.to(torch.bfloat16).contiguous(memory_format=cl), None, sizes,
                                            device)
    return out


def info_of(results) -> dict:
    """The run's choices, from SISResult.info."""
    info = results[0].info
    return {"engine": info.engine, "batch_size": info.batch_size, "batch_source": info.batch_source,
            "channels_last": info.channels_last, "candidates": info.candidates, "rescored": info.rescored,
            "low": info.low}


def run(args) -> dict:
    device = torch.device(args.device)
    n, side = args.images or DEFAULTS[device.type][0], args.size or DEFAULTS[device.type][1]
    model = load_model(args.checkpoint, device)
    photos = cifar_test_images(args.data_dir, n, side) if args.data_dir else cifar_like(n, side)
    images = normalize(photos).to(device)
    p = side * side
    candidates = n * p * (p + 1) // 2
    taus = thresholds(model, images, args.threshold_mode)
    row = {"config": f"cifar-resnet20-{side}x{side}", "device": str(device), "images": n, "side": side,
           "features": p, "candidates": candidates, "threshold": THRESHOLD, "threshold_mode": args.threshold_mode,
           "images_source": "cifar10 test" if args.data_dir else "cifar-like (generated)",
           "model": args.checkpoint or "ResNet-20, random weights (seed 0)"}

    def save():
        row.update(summarize(row))
        write_results("cifar", device, [row], args.out)

    t0 = time.perf_counter()
    rates = ceilings(model, images, n * p, device)
    row["ceiling_s"] = time.perf_counter() - t0
    row["ceiling_sweep"] = {k: {str(b): r for b, r in v.items()} for k, v in rates.items()}
    row["ceiling_rows_per_s"] = max(max(rates["float32"].values()), max(rates["float32_channels_last"].values()))
    row["bf16_ceiling_rows_per_s"] = max(rates["bfloat16_channels_last"].values())
    save()
    print(f"ceiling {row['ceiling_rows_per_s']:.0f} rows/s (bf16 {row['bf16_ceiling_rows_per_s']:.0f})", flush=True)

    outputs = {}
    for name, keywords in (("float32", {}), ("bf16", {"score_dtype": torch.bfloat16})):
        sync(device)
        t = time.perf_counter()
        outputs[name] = explain(model, images, taus, show_progress=args.progress, **keywords)
        sync(device)
        row[f"{name}_s"] = time.perf_counter() - t
        row[f"{name}_info"] = info_of(outputs[name])
        print(f"{name}: {row[f'{name}_s']:.2f} s, {candidates / row[f'{name}_s']:.0f} rows/s, "
              f"{row[f'{name}_info']}", flush=True)
        save()
    full, low = outputs["float32"], outputs["bf16"]
    row["same_sis_as_float32"] = same_sis(low, full)
    row["same_order_and_values"] = all(torch.equal(a.order, b.order) and torch.equal(a.values, b.values)
                                       for a, b in zip(low, full))
    row["images_with_sis"] = sum(r.sis is not None for r in full)
    row["median_sis_size"] = sorted(r.sis.numel() for r in full if r.sis is not None)[row["images_with_sis"] // 2] \
        if row["images_with_sis"] else None
    save()
    return row


def summarize(row: dict) -> dict:
    """The derived figures of the row measured so far: rates, the fraction of the ceiling, images per hour and
    the projections (from the faster of float32 and bf16 where bf16's SIS equal float32's)."""
    out = {}
    c = row["candidates"]
    if "float32_s" in row:
        out["rows_per_s"] = c / row["float32_s"]
        out["fraction_of_ceiling"] = out["rows_per_s"] / row["ceiling_rows_per_s"]
    if "bf16_s" in row:
        out["bf16_rows_per_s"] = c / row["bf16_s"]
        out["bf16_over_float32"] = row["float32_s"] / row["bf16_s"]
        info = row["bf16_info"]
        out["rescored"] = info["rescored"]
        out["rescored_share"] = info["rescored"] / info["candidates"] if info["candidates"] else 0.0
    runs = {"float32": row.get("float32_s")}
    if row.get("same_sis_as_float32"):
        runs["bf16"] = row.get("bf16_s")
    runs = {k: v for k, v in runs.items() if v is not None}
    if runs:
        best = min(runs, key=runs.get)
        per_image = runs[best] / row["images"]
        out.update(projected_from=best, images_per_hour=3600 / per_image,
                   projected_hours_10000=10_000 * per_image / 3600, projected_hours_60000=60_000 * per_image / 3600,
                   projection=f"projection: {row['images']} measured images of {row['side']}x{row['side']} "
                              f"({best}) scaled linearly to 10,000 and 60,000 images of that size")
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--images", type=int, default=None, help="images (default: 32 on cuda, 2 on cpu)")
    ap.add_argument("--size", type=int, default=None, choices=(8, 16, 32),
                    help="image side (default: 32 on cuda, 16 on cpu)")
    ap.add_argument("--checkpoint", default=None, help="ResNet-20 weights (a state dict) or a pickled module")
    ap.add_argument("--data-dir", default=None, help="CIFAR-10 python batches (cifar-10-batches-py) for real images")
    ap.add_argument("--threshold-mode", choices=("auto", "absolute"), default="auto",
                    help="tau per image: auto (0.99, or 0.99 f(x) below it; default) or absolute (0.99)")
    ap.add_argument("--progress", action="store_true", help="progress bars")
    ap.add_argument("--out", default=None, help="JSON path (default: benchmarks/results/cifar-<device>.json)")
    args = ap.parse_args()
    row = run(args)
    g = row.get
    print(f"{row['config']}: {row['images']} images, {row['candidates']} candidates; float32 {g('rows_per_s', math.nan):.0f} "
          f"rows/s, bf16 {g('bf16_rows_per_s', math.nan):.0f} rows/s (re-scored {100 * g('rescored_share', 0):.1f}%), "
          f"ceiling {row['ceiling_rows_per_s']:.0f} rows/s; same SIS {row['same_sis_as_float32']}; "
          f"{g('projection')}: {g('projected_hours_10000', math.nan):.2f} h and {g('projected_hours_60000', math.nan):.2f} h")


if __name__ == "__main__":
    main()

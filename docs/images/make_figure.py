"""Makes docs/images/sis_imagenet.png: EfficientNet-Lite0 (ImageNet weights) on four bundled photos, each
beside its batched-gradient SIS shown alone (everything else at the mask value, grey).

    PYTHONPATH=. python docs/images/make_figure.py      # about a minute on 2 CPU cores
"""
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import torch

import overinterp_fast as of
from overinterp_fast.zoo.imagenet import imagenet_label, load_efficientnet_lite, load_photos

torch.manual_seed(0)
model = load_efficientnet_lite(0)
x, names, originals = load_photos(224, ["chelsea", "coffee", "rocket", "flower"])
with torch.no_grad():
    p = model(x).softmax(-1).max(-1).values
tau = torch.where(p >= 0.9, torch.full_like(p, 0.9), 0.9 * p)  # the audit's "auto" threshold
res = of.fast_sis(model, x, tau, method="gradient", options=of.GradientOptions(k=500)) \
    if hasattr(of, "GradientOptions") else of.fast_sis(model, x, tau, method="gradient", k=500)

fig, axes = plt.subplots(2, len(names), figsize=(2.1 * len(names), 5.0), dpi=100)
for j, (r, orig) in enumerate(zip(res, originals)):
    alone = np.full_like(orig, 128)
    alone[r.mask.numpy()] = orig[r.mask.numpy()]
    axes[0, j].imshow(orig)
    axes[0, j].set_title(f"{imagenet_label(r.target)[:16]}\nf(x) = {r.score:.2f}", fontsize=9)
    axes[1, j].imshow(alone)
    axes[1, j].set_title(f"SIS: {r.mask.float().mean():.1%} of pixels\nf(SIS) = {r.sis_score:.2f}", fontsize=9)
    for a in axes[:, j]:
        a.set_xticks([]), a.set_yticks([])
fig.tight_layout(h_pad=1.5)
fig.savefig("docs/images/sis_imagenet.png")
from PIL import Image  # noqa: E402  (128 colours keep the PNG under 100 KB)

Image.open("docs/images/sis_imagenet.png").convert("RGB").quantize(colors=128).save("docs/images/sis_imagenet.png",
                                                                                   optimize=True)
for n, r, t in zip(names, res, tau):
    print(n, imagenet_label(r.target), f"f(x)={r.score:.3f} tau={float(t):.3f} size={len(r.sis)} "
          f"frac={r.mask.float().mean():.3%} f(SIS)={r.sis_score:.3f}")

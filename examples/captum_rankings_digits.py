"""How sufficient is the top of a saliency map? Captum's attributions as rankings for SufficientSubset.

    .venv/bin/python examples/captum_rankings_digits.py [N_IMAGES]     # default 8 test digits; needs captum

For each digit: the smallest prefix of Integrated Gradients' pixel ranking that keeps the model's confidence at
0.9 (refine=False: the top of the map, as it ranks), the same prefix pruned to a 1-minimal set (the default), and
the exact SIS for comparison. Every set is checked on the model.
"""
import sys

from captum.attr import IntegratedGradients

from overinterp_fast.attr import ExactSIS, SufficientSubset
from overinterp_fast.zoo.digits import load_digits, train_digits_cnn

n = int(sys.argv[1]) if len(sys.argv) > 1 else 8
data = load_digits()
model = train_digits_cnn(data)
images = data.x_test[:n]  # [n, 1, 8, 8]; 0 is the mean pixel (the baseline)
targets = model(images).argmax(1)

ig = IntegratedGradients(model).attribute(images, baselines=0.0, target=targets)  # [n, 1, 8, 8]
prefix = SufficientSubset(model, threshold=0.9, refine=False).find_sis(images, ig, target=targets)
pruned = SufficientSubset(model, threshold=0.9).find_sis(images, ig, target=targets)
exact = ExactSIS(model, threshold=0.9).find_sis(images, target=targets)

print("image  class  IG prefix  IG pruned  exact SIS   (pixels of 64)")
for i in range(n):
    size = [r.size if r.sis is not None else "-" for r in (prefix[i], pruned[i], exact[i])]
    print(f"{i:>5}  {int(targets[i]):>5}  {size[0]:>9}  {size[1]:>9}  {size[2]:>9}")

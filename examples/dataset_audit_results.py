"""A dataset as an audit source, and the results taken away: a table, a data frame, masks, a figure.

    .venv/bin/python examples/dataset_audit_results.py [N_IMAGES] [OUT]     # default 32 test digits, out/digits

Any map-style dataset works the same way: a torchvision dataset, a ``datasets.Dataset`` from Hugging Face
(``{"image": PIL image, "label": class}`` rows, e.g. ``load_dataset("mnist", split="test")``), or, as here, a
torch ``TensorDataset`` of pixels in [0, 1]. Leave normalization out of the dataset: the audit normalizes as
the preprocessing says, so the stored audit records it and resumes exactly.
"""
import os
import sys

import torch

import overinterp_fast as of
from overinterp_fast import audit
from overinterp_fast.audit.stream import run_stored_audit
from overinterp_fast.zoo.digits import load_digits, train_digits_cnn
from overinterp_fast.zoo.preprocessing import Preprocessing

n = int(sys.argv[1]) if len(sys.argv) > 1 else 32
out = sys.argv[2] if len(sys.argv) > 2 else os.path.join("out", "digits")
data = load_digits()
model = train_digits_cnn(data)  # the CNN expects (pixel / 16 - mean) / std

# The test digits as a dataset of (image [1, 8, 8] in [0, 1], label) pairs, and the model's normalization.
dataset = torch.utils.data.TensorDataset(data.raw_test[:n, None] / 16.0, data.y_test[:n])
source = audit.from_dataset(dataset, Preprocessing(8, data.mean, data.std), grey=True)
print(source)

# A stored audit: resumable, chunk by chunk (run it again: every chunk is already committed).
run = run_stored_audit({"digits_cnn": model}, source, out, audit.AuditConfig(method="exact", threshold=0.9),
                       audit.StoreOptions(chunk_size=16, workers=0), audit.RunOptions(show_progress=False))
record = run.record
print(record)
print(record.models[0])
results = record.models[0].results

# One row per image, as a pyarrow table and a pandas frame; the masks in a .npz file and back.
table = of.sis_table(results)
print(table.select(["image", "target", "score", "sis_size", "sis_fraction"]).slice(0, 5).to_pandas())
print("mean SIS fraction:", float(of.sis_frame(results)["sis_fraction"].mean()))
masks = of.load_masks(of.save_masks(os.path.join(out, "masks.npz"), results))
print("masks:", sum(m is not None for m in masks), "of", len(masks), "images have a SIS")

# One result drawn: the digit, and its SIS alone on the baseline.
import matplotlib  # noqa: E402

matplotlib.use("Agg")
axes = of.plot_sis(results[0], record.displays[0])
axes[0].figure.savefig(os.path.join(out, "sis0.png"))

# What ran: the package version and which implementation each op used.
print("overinterp_fast", record.meta["overinterp_fast"], "| ops:", record.meta["ops"])

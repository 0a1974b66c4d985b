"""Each model on its own pixel subsets (audit/own_subsets.py) and what the report shows of it and of classes
(audit/report_subsets.py, the report's "classes" and "subsets" sections): a record written by hand, every number
of the summary, the per-class table and the gallery worked out by hand; the columns of a model whose outputs are
known in closed form."""
import re
import shutil
import subprocess

import numpy as np
import pytest
import torch
from torch import nn

from overinterp_fast.audit import own_subsets, report_subsets
from overinterp_fast.audit.records import AuditRecord, ModelRecord
from overinterp_fast.audit.report import build_report, render_report
from overinterp_fast.audit.subset_files import random_keep
from overinterp_fast.methods.results import SISResult

# four 4 x 4 images (16 features; 5% keeps ceil(0.8) = 1, the last of the order); labels cat cat dog dog
LABELS = [0, 0, 1, 1]
TARGETS = [0, 1, 1, 0]  # images 0 and 2 right, 1 and 3 wrong
SCORES = [0.9, 0.6, 0.8, 0.7]
SIS = [[5, 6], None, [1, 2, 3, 4], [9]]  # fractions 0.125, -, 0.25, 0.0625
OWN = {"backselect_class": np.array([0, 0, 1, 1]), "backselect_score": np.array([0.8, 0.1, 0.9, 0.3]),
       "random_class": np.array([1, 1, 1, 1]), "random_score": np.array([0.2, 0.4, 0.5, 0.5])}


def _result(i):
    order = torch.tensor([(i + j) % 16 for j in range(16)])  # the last pixel kept: (i + 15) % 16
    sis = SIS[i]
    mask = None if sis is None else torch.zeros(4, 4, dtype=torch.bool).view(-1).index_fill(
        0, torch.tensor(sis), True).view(4, 4)
    return SISResult(order=order, values=torch.linspace(1, 0, 16, dtype=torch.float64),
                     sis=None if sis is None else torch.tensor(sis), mask=mask, target=TARGETS[i], score=SCORES[i],
                     threshold=0.5)


def record(labels=LABELS, own=True) -> AuditRecord:
    results = [_result(i) for i in range(4)]
    m = ModelRecord("net", "exact", results, seconds=1.0)
    if own:
        m.subset_columns = {k: v.copy() for k, v in OWN.items()}
        m.subsets = own_subsets.subset_summary(m.subset_columns, TARGETS, labels, 0.05)
    displays = [np.full((4, 4, 3), 40 * i, np.uint8) for i in range(4)]
    return AuditRecord("subsets", [f"im{i}" for i in range(4)], displays, list(labels), {0: "cat", 1: "dog"}, [m])


def test_subset_summary_by_hand():
    s = own_subsets.subset_summary(OWN, TARGETS, LABELS, 0.05)
    assert s == {"fraction": 0.05, "images": 4, "reference": "labels",
                 "accuracy": {"full": 0.5, "backselect": 1.0, "random": 0.5},
                 "confidence": {"backselect": pytest.approx(0.525), "random": pytest.approx(0.4)}}
    # a label unknown: against the model's own full-image classes (full accuracy 1 by definition)
    s = own_subsets.subset_summary(OWN, TARGETS, [0, None, 1, 1], 0.05)
    assert s["reference"] == "full-image predictions"
    assert s["accuracy"] == {"full": 1.0, "backselect": 0.5, "random": 0.5}  # [0,0,1,1] vs [0,1,1,0]; [1]*4 vs
    with pytest.raises(ValueError, match="4 own-subset rows for 3 images"):
        own_subsets.subset_summary(OWN, TARGETS[:3], LABELS[:3], 0.05)


def test_split_merge_and_concat_columns():
    sens = {"fg_correct": np.array([True, False]), "p_fg": np.array([0.5, 0.25])}
    own = {k: v[:2] for k, v in OWN.items()}
    merged = own_subsets.merge_columns(sens, own)
    assert own_subsets.split_columns(merged) == (sens, own)
    assert own_subsets.split_columns(None) == (None, None) and own_subsets.merge_columns(None, None) is None
    assert own_subsets.split_columns(sens) == (sens, None)
    part = dict(own)
    del part["random_score"]
    assert own_subsets.split_columns(part) == (None, None)  # an incomplete group is not the model's columns
    both = own_subsets.concat_columns([own, {k: v[2:] for k, v in OWN.items()}])
    assert {k: v.tolist() for k, v in both.items()} == {k: v.tolist() for k, v in OWN.items()}
    assert both["backselect_class"].dtype == np.int64 and both["random_score"].dtype == np.float64
    assert own_subsets.concat_columns([own, None]) is None and own_subsets.concat_columns([]) is None


class Weighted(nn.Module):
    """Two classes over 1 x 2 x 2 images: logit 0 = 4 * pixel (0, 0), logit 1 = 4 * pixel (1, 1)."""

    def forward(self, x):
        return torch.stack([4 * x[:, 0, 0, 0], 4 * x[:, 0, 1, 1]], 1)


def test_subset_columns_of_a_model_known_in_closed_form():
    x = torch.tensor([[[[1.0, 0.0], [0.0, 0.5]]], [[[0.25, 0.0], [0.0, 1.0]]]])
    # 4 features at 50%: keep 2, the last two of the order; image 0 keeps (0, 0) and (0, 1), image 1 (1, 0), (1, 1)
    results = [SISResult(order=torch.tensor([3, 2, 1, 0]), values=torch.zeros(4, dtype=torch.float64), sis=None,
                         mask=None, target=0, score=0.5, threshold=0.9),
               SISResult(order=torch.tensor([0, 1, 2, 3]), values=torch.zeros(4, dtype=torch.float64), sis=None,
                         mask=None, target=0, score=0.5, threshold=0.9)]
    cols = own_subsets.subset_columns(Weighted(), x, results, [7, 8], 0.5, None, seed=3)
    # image 0 on its subset: logits (4, 0) -> class 0, p0 = 1 / (1 + e^-4); image 1: logits (0, 4) -> class 1,
    # p0 = 1 / (1 + e^4)
    assert cols["backselect_class"].tolist() == [0, 1]
    assert cols["backselect_score"] == pytest.approx([1 / (1 + np.exp(-4)), 1 / (1 + np.exp(4))])
    # random: two pixels drawn for images 7 and 8 of the audit (seed 3), the pixel-subset files' draws
    for j, idx in enumerate((7, 8)):
        keep = random_keep(4, 2, 3, idx).reshape(2, 2)
        l0 = 4 * float(x[j, 0, 0, 0]) * keep[0, 0]
        l1 = 4 * float(x[j, 0, 1, 1]) * keep[1, 1]
        assert cols["random_class"][j] == int(l1 > l0)
        assert cols["random_score"][j] == pytest.approx(1 / (1 + np.exp(l1 - l0)))
    # orders that do not rank the pixels (a custom feature map): no columns
    short = [SISResult(order=torch.tensor([1, 0]), values=torch.zeros(2, dtype=torch.float64), sis=None, mask=None,
                       target=0, score=0.5, threshold=0.9)] * 2
    assert own_subsets.subset_columns(Weighted(), x, short, [0, 1], 0.5, None, seed=0) is None


def test_class_stats_by_hand():
    cat, dog = report_subsets.class_stats(record(), record().models[0])
    assert (cat.name, cat.images, cat.accuracy, cat.with_sis, cat.median_sis) == ("cat", 2, 0.5, 1, 0.125)
    assert cat.mean_score == pytest.approx(0.75) and cat.subset_confidence == pytest.approx(0.45)
    assert cat.subset_accuracy == 1.0
    assert (dog.name, dog.images, dog.accuracy, dog.with_sis) == ("dog", 2, 0.5, 2)
    assert dog.median_sis == pytest.approx(0.15625) and dog.subset_confidence == pytest.approx(0.6)
    assert dog.subset_accuracy == 1.0
    # without labels: the classes are the predictions (0: images 0 and 3; 1: images 1 and 2), the subsets'
    # accuracy against them
    rec = record(labels=[None] * 4)
    assert report_subsets.image_classes(rec, rec.models[0])[1] == "predicted class"
    a, b = report_subsets.class_stats(rec, rec.models[0])
    assert (a.images, a.accuracy, a.subset_accuracy, a.median_sis) == (2, None, 0.5, pytest.approx(0.09375))
    assert (b.images, b.accuracy, b.subset_accuracy, b.subset_confidence) == (2, None, 0.5, pytest.approx(0.5))
    # no own-subset columns (another method): those two stay None
    plain = record(own=False)
    assert report_subsets.class_stats(plain, plain.models[0])[0].subset_confidence is None


def test_gallery_picks_per_class_and_titles_what_the_subset_says():
    rec = record()
    m = rec.models[0]
    assert report_subsets.gallery_images(rec, m) == [0, 1, 2, 3]
    assert report_subsets.gallery_images(rec, m, per_class=1) == [0, 2]
    assert report_subsets.gallery_images(rec, m, most=3) == [0, 1, 2]
    assert report_subsets.subset_title(rec, 0, m.subset_columns, 0, 0.05) == "5%: f=0.80"
    assert report_subsets.subset_title(rec, 1, m.subset_columns, 1, 0.05) == "5%: cat, f=0.10"
    assert report_subsets.subset_title(rec, 1, None, 1, 0.05) == "5% subset"
    fig = report_subsets.gallery_figure(rec, m, [0, 1], 0.05)
    axes = fig.get_axes()
    assert [ax.get_title() for ax in axes] == ["cat", "5%: f=0.80", "cat", "5%: cat, f=0.10"]
    # the subset panel frames the one kept pixel: the last of image 1's order, (1 + 15) % 16 = 0 -> (0, 0)
    (frame,) = axes[3].patches
    assert frame.get_xy() == (-0.5, -0.5)
    assert report_subsets.gallery_figure(rec, m, [], 0.05) is None


def _cells(html: str, section: str) -> list[list[str]]:
    body = html.split(f'<section id="{section}">', 1)[1].split("</section>", 1)[0]
    return [[re.sub("<[^>]+>", "", c) for c in re.findall(r"<t[dh][^>]*>(.*?)</t[dh]>", row)]
            for row in re.findall(r"<tr>(.*?)</tr>", body)]


def test_report_sections_by_hand(tmp_path):
    html = render_report(record())
    assert html.index('id="classes"') < html.index('id="subsets"') < html.index('id="heatmaps"')
    assert _cells(html, "classes") == [
        ["true class", "images", "accuracy", "with SIS", "median SIS", "mean f(x)", "mean confidence on its 5% subsets",
         "accuracy on its 5% subsets"],
        ["cat", "2", "50.0%", "1", "12.50%", "0.750", "0.450", "100.0%"],
        ["dog", "2", "50.0%", "2", "15.62%", "0.750", "0.600", "100.0%"]]
    assert _cells(html, "subsets")[1] == ["net", "4", "labels", "50.0%", "100.0%", "50.0%", "0.525", "0.400"]
    assert html.split('<section id="subsets">')[1].split("</section>")[0].count("<img ") == 1
    assert ("on its own 5% backward-selection subsets its accuracy is 100.0%, on random 5% 50.0% (against labels)"
            in html.split('<section id="summary">')[1].split("</section>")[0])
    plain = render_report(record(own=False))  # another method: no subsets section, the classes without its columns
    assert 'id="subsets"' not in plain and 'href="#subsets"' not in plain
    assert _cells(plain, "classes")[1] == ["cat", "2", "50.0%", "1", "12.50%", "0.750"]


@pytest.mark.skipif(shutil.which("chromium") is None, reason="needs the chromium binary")
def test_the_subsets_report_renders_in_headless_chromium(tmp_path):
    path = build_report(record(), str(tmp_path / "report.html"))
    shot = tmp_path / "shot.png"
    subprocess.run(["chromium", "--headless", "--no-sandbox", "--disable-gpu", f"--screenshot={shot}",
                    "--window-size=1200,3000", f"file://{path}"], timeout=90, capture_output=True)
    import matplotlib.image

    pixels = matplotlib.image.imread(str(shot))
    assert pixels.shape[:2] == (3000, 1200) and pixels[..., :3].var() > 0

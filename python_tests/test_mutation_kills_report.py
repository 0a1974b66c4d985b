"""audit/report.py's computing helpers by hand (the numbers a reader of the report takes away): the formatting of
numbers and intervals, tables, the border band, the 5% subsets, where SIS pixels lie, the guarded tests, the curve's
thresholds, pairwise overlap and the headline sentence. test_report.py builds whole reports."""
import math

import numpy as np
import pytest
import torch
from scipy import stats

from overinterp_fast.audit import report
from overinterp_fast.audit.records import AuditRecord, ModelRecord
from overinterp_fast.results import SISResult


def _r(sis, grid=(10, 10), target=1, score=0.9, threshold=0.5, blocks=None, order=None):
    p = grid[0] * grid[1]
    mask = None
    if sis is not None:
        mask = torch.zeros(grid, dtype=torch.bool)
        mask.view(-1)[torch.tensor(sis, dtype=torch.long)] = True
    return SISResult(order=torch.arange(p) if order is None else order, values=torch.zeros(p), target=target,
                     score=score, threshold=threshold, sis=None if sis is None else torch.tensor(sis), mask=mask,
                     blocks=blocks)


def _record(results_by_model, labels=None, grid=(10, 10), methods=None):
    n = len(next(iter(results_by_model.values())))
    models = [ModelRecord(name, (methods or {}).get(name, "exact"), res) for name, res in results_by_model.items()]
    return AuditRecord("t", [f"i{k}" for k in range(n)], [np.zeros(grid, np.uint8)] * n, labels or [None] * n,
                       {1: "one", 2: "two"}, models)


def test_number_and_percent_formatting():
    assert report._esc('<a href="x">&') == "&lt;a href=&quot;x&quot;&gt;&amp;"
    assert report._finite(0.0) and report._finite(-3) and not report._finite(None)
    assert not report._finite(float("nan")) and not report._finite(float("inf"))
    assert report._num(1234.5) == "1.23e+03" and report._num(0.12345) == "0.123" and report._num(2, ".2f") == "2.00"
    assert report._num(None) == "n/a" and report._num(float("nan")) == "n/a" and report._num(float("-inf")) == "n/a"
    assert report._pct(0.1234) == "12.3%" and report._pct(1) == "100.0%" and report._pct(0.5, 0) == "50%"
    assert report._pct(None) == "n/a" and report._pct(float("nan")) == "n/a"
    assert report._ci(0.1, 0.25) == "[10.0%, 25.0%]"
    assert report._ci(float("nan"), 0.2) == "n/a" and report._ci(0.1, None) == "n/a"


def test_fraction_ci_is_the_t_interval_clipped_to_the_unit_interval():
    v = [0.1, 0.2, 0.6]
    m, lo, hi = report.fraction_ci(v)
    t_lo, t_hi = stats.t.interval(0.95, 2, loc=0.3, scale=stats.sem(v))
    assert m == pytest.approx(0.3) and t_lo < 0 and t_hi < 1
    assert lo == 0.0 and hi == pytest.approx(t_hi)  # clipped below at 0
    m, lo, hi = report.fraction_ci([0.9, 0.95, 0.85])
    t_lo, t_hi = stats.t.interval(0.95, 2, loc=0.9, scale=stats.sem([0.9, 0.95, 0.85]))
    assert t_hi > 1 and hi == 1.0 and lo == pytest.approx(t_lo) and t_lo > 0  # clipped above at 1
    m, lo, hi = report.fraction_ci([0.3])  # one value: no interval
    assert m == 0.3 and math.isnan(lo) and math.isnan(hi)
    m, lo, hi = report.fraction_ci([0.2, 0.2])  # identical values: NaN, no warning raised
    assert m == pytest.approx(0.2)
    m, lo, hi = report.fraction_ci([0.4, 0.45, 0.5])  # inside [0, 1]: unchanged
    assert (lo, hi) == pytest.approx(stats.t.interval(0.95, 2, loc=0.45, scale=stats.sem([0.4, 0.45, 0.5])))
    assert 0 < lo < hi < 1


def test_html_pieces():
    assert report._p("a < b") == "<p>a &lt; b</p>" and report._p("x", "note") == '<p class="note">x</p>'
    assert report._section("s<", "T&", "body") == '<section id="s&lt;">\n<h2>T&amp;</h2>\nbody\n</section>'
    html = report._table(["a", "b<"], [[1, "x"], ["12.5%", "n/a"], ["[1.0%, 2.0%]", "-3e-05"], [2.5, "word 1"]])
    assert html == ("<table><thead><tr><th>a</th><th>b&lt;</th></tr></thead><tbody>"
                    '<tr><td class="num">1</td><td>x</td></tr>'
                    '<tr><td class="num">12.5%</td><td class="num">n/a</td></tr>'
                    '<tr><td class="num">[1.0%, 2.0%]</td><td class="num">-3e-05</td></tr>'
                    '<tr><td class="num">2.5</td><td>word 1</td></tr></tbody></table>')
    assert report._json("text") == "text" and report._json({"b": 1, "a": (2,)}) == '{"a": [2], "b": 1}'
    assert report._json({"device": torch.device("cpu")}) == '{"device": "cpu"}'  # anything else as its str


def test_border_mask_by_hand():
    m = report.border_mask((10, 10))  # 10% of 10: a band one pixel wide
    assert m.sum() == 100 - 64 and not m[1:9, 1:9].any() and m[0].all() and m[:, 9].all()
    m = report.border_mask((20, 10), 0.2)  # 4 rows and 2 columns
    assert m.sum() == 200 - 12 * 6 and not m[4:16, 2:8].any() and m[3, 5] and m[4, 1]
    m = report.border_mask((3, 4), 0.01)  # at least one pixel wide
    assert m.sum() == 12 - 2 and not m[1, 1] and not m[1, 2]
    assert report.border_mask((10, 10)).dtype == bool


def test_subset_mask_and_grids():
    order = torch.tensor([3, 0, 1, 2])  # the last 5% of 4: one feature, id 2
    assert report.subset_mask(order, (2, 2)).tolist() == [[False, False], [True, False]]
    assert report.subset_mask(order, (2, 2), 0.5).tolist() == [[False, True], [True, False]]  # ids 1 and 2
    assert report.subset_mask(order, (3, 2)) is None  # not on that grid
    assert report.grid_shape(np.zeros((4, 5, 3))) == (4, 5) and report.grid_shape(np.zeros((4, 5))) == (4, 5)
    r = _r([0], grid=(4, 5))
    assert report.on_grid(r, np.zeros((4, 5, 3))) and not report.on_grid(r, np.zeros((5, 4)))
    assert not report.on_grid(_r(None, grid=(4, 5)), np.zeros((4, 5)))
    rec = _record({"m": [_r([0]), _r(None)]})
    assert report.common_grid(rec, rec.models[0]) == (10, 10)
    rec.displays[1] = np.zeros((8, 10), np.uint8)
    assert report.common_grid(rec, rec.models[0]) is None  # two grids
    rec = _record({"m": [_r([0], grid=(5, 20)), _r([1])]})
    assert report.common_grid(rec, rec.models[0]) is None  # a mask off the grid


def test_fractions_correctness_and_border_by_hand():
    # image 0: 4 pixels, 3 in the border band; image 1: no SIS; image 2: 2 pixels, none in the band
    rec = _record({"m": [_r([0, 1, 9, 55]), _r(None, target=2), _r([44, 45], target=2)]}, labels=[1, None, 1])
    m = rec.models[0]
    assert report.sis_fractions(m).tolist() == [0.04, 0.02]
    assert report.correctness(rec, m) == [True, None, False]
    b = report.border_fractions(rec, m)
    assert b[0] == 0.75 and math.isnan(b[1]) and b[2] == 0.0
    regions = [np.ones((10, 10), bool), np.ones((10, 10), bool), np.eye(10, dtype=bool)]
    inside = report.inside_fractions(rec, m, regions)
    assert inside[0] == 1.0 and math.isnan(inside[1]) and inside[2] == 0.5  # pixel 44 is (4, 4): on the diagonal
    assert report.border_share(rec) == pytest.approx(0.36)
    rec.displays = [np.zeros((10, 10), np.uint8), np.zeros((10, 10), np.uint8), np.zeros((15, 15), np.uint8)]
    # 15 x 15: bands of round(1.5) = 2 pixels, an inner 11 x 11
    assert report.border_share(rec) == pytest.approx((0.36 + 0.36 + (225 - 121) / 225) / 3)
    # another band width: 20% of 10 is 2 pixels
    rec2 = _record({"m": [_r([0, 11, 22, 55])]})
    wide = report.border_fractions(rec2, rec2.models[0], 0.2)
    assert wide[0] == 0.5  # pixels 0 and 11 ((1, 1)) lie in the band; 22 ((2, 2)) and 55 do not
    assert report.border_share(_record({"m": [_r([0])]}), 0.2) == pytest.approx(0.64)
    empty = _record({"m": [_r([])]})  # an empty SIS has no pixels to place
    assert math.isnan(report.border_fractions(empty, empty.models[0])[0])


def test_safe_test_reasons():
    kw = report.kruskal_wallis
    assert report.safe_test(kw, [[1, 2]]) == "n/a: needs 2 groups"
    assert report.safe_test(kw, [[1, 2], [3]], min_groups=3) == "n/a: needs 3 groups"
    assert report.safe_test(kw, [[1, 2], []]) == "n/a: a group has no values"
    assert report.safe_test(kw, [[1, 2], [3]], min_values=2) == "n/a: needs 2 values per group"
    assert report.safe_test(kw, [[1, 1], [1]]) == "n/a: all values identical"
    stat, p = report.safe_test(kw, [[1, 2, 3], [4, 5, 6]])
    want = stats.kruskal([1, 2, 3], [4, 5, 6])
    assert (stat, p) == pytest.approx((want.statistic, want.pvalue))
    assert report.safe_test(lambda g: (_ for _ in ()).throw(ValueError("bad")), [[1], [2]]) == "n/a: bad"
    assert report.safe_test(lambda g: 1 / 0, [[1], [2]]) == "n/a: division by zero"
    assert report.safe_test(lambda g: (float("nan"), 0.5), [[1], [2]]) == "n/a: not defined for these values"
    assert report.safe_test(lambda g: (1.0, float("inf")), [[1], [2]]) == "n/a: not defined for these values"
    assert report._test_cells((1.23456, 0.5)) == ["1.23", "0.5"]
    assert report._test_cells("n/a: why") == ["n/a: why", "n/a"]


def test_curve_thresholds_and_exactness():
    models = [ModelRecord("a", "exact", [_r([0], score=0.8, threshold=0.3), _r([1], score=0.95, threshold=0.6)])]
    t = report.curve_thresholds(models, points=5)
    assert t.tolist() == pytest.approx(np.linspace(0.3, 0.95, 5).tolist())  # lowest tau to highest f(x)
    models = [ModelRecord("a", "exact", [_r([0], score=0.999, threshold=0.7)])]
    assert report.curve_thresholds(models, 3).tolist() == pytest.approx([0.5, 0.745, 0.99])  # capped: 0.5, 0.99
    models = [ModelRecord("a", "exact", [_r([0], score=0.4, threshold=0.6)])]
    assert report.curve_thresholds(models).tolist() == [0.5]  # f(x) below 0.5: one point, the low end
    assert len(report.curve_thresholds([ModelRecord("a", "exact", [_r([0])])])) == 20  # CURVE_POINTS
    nan_scores = [ModelRecord("a", "exact", [_r([0], score=float("nan"), threshold=0.2)])]
    assert report.curve_thresholds(nan_scores, 3).tolist() == pytest.approx([0.2, 0.595, 0.99])  # up to 0.99
    flat = [ModelRecord("a", "exact", [_r([0], score=0.5, threshold=0.5)])]
    assert report.curve_thresholds(flat).tolist() == [0.5]  # one point, not 20 equal ones
    assert report.is_exact(ModelRecord("a", "exact", [_r([0])]))
    assert not report.is_exact(ModelRecord("a", "gradient", [_r([0])]))
    assert not report.is_exact(ModelRecord("a", "exact", [_r([0], blocks=torch.tensor([0, 50, 100]))]))


def test_pair_overlap_and_matched_fractions():
    a = ModelRecord("a", "exact", [_r([0, 1]), _r([5]), _r(None), _r([], grid=(10, 10))])
    b = ModelRecord("b", "exact", [_r([1, 2]), _r([5], grid=(5, 20)), _r([3]), _r([7])])
    n, d, h = report.pair_overlap(a, b)
    # image 0: Dice 2 x 1 / 4 = 0.5, Hausdorff 1 pixel; image 1: other shapes; image 2: no SIS in a;
    # image 3: Dice of an empty and a 1-pixel set is 0, no Hausdorff (empty)
    assert n == 2 and d == pytest.approx(0.25) and h == pytest.approx(1.0)
    n, d, h = report.pair_overlap(ModelRecord("x", "exact", [_r(None)]), ModelRecord("y", "exact", [_r([1])]))
    assert n == 0 and math.isnan(d) and math.isnan(h)
    fr = report.matched_fractions([a, b])
    assert fr.tolist() == [[0.02, 0.01, 0.0], [0.02, 0.01, 0.01]]  # images 0, 1 and 3 (2: no SIS in a)
    assert report.matched_fractions([ModelRecord("x", "exact", [_r(None)])]).shape == (1, 0)


def test_headline_sentences():
    rec = _record({"m": [_r([0, 1, 9, 55]), _r(None, target=2), _r([44, 45], target=2)]}, labels=[1, None, 1])
    assert report.headline(rec, rec.models[0]) == (
        "m (exact): 2 of 3 images reach f(x) >= tau and have a SIS; median SIS: 3.0% of the pixels; on average "
        "37.5% of SIS pixels lie in the outer 10% border, which is 36.0% of the image, more than the border's share "
        "of the area: the SIS lean on the image's edges (often background); 1 of 2 labelled images are classified "
        "correctly.")
    rec = _record({"g": [_r([44]), _r([45])]}, methods={"g": "gradient"})
    assert report.headline(rec, rec.models[0]) == (
        "g (gradient): 2 of 2 images reach f(x) >= tau and have a SIS; median SIS: 1.0% of the pixels; on average "
        "0.0% of SIS pixels lie in the outer 10% border, which is 36.0% of the image, no more than the border's "
        "share of the area.")
    # exactly the border's share (9 of 25 SIS pixels, 36%): "no more than"
    band = [0, 1, 2, 3, 4, 5, 6, 7, 8] + [k for k in range(11, 89) if 1 <= k % 10 <= 8][:16]
    rec = _record({"e": [_r(band)]})
    assert report.border_fractions(rec, rec.models[0])[0] == pytest.approx(0.36)
    assert "which is 36.0% of the image, no more than the border's share of the area" in report.headline(
        rec, rec.models[0])
    rec = _record({"n": [_r(None)]})
    assert report.headline(rec, rec.models[0]) == "n (exact): 0 of 1 images reach f(x) >= tau and have a SIS."
    rec = _record({"f": [_r([3], grid=(2, 50))]})  # masks off the display grid: features, no border figure
    assert report.headline(rec, rec.models[0]) == (
        "f (exact): 1 of 1 images reach f(x) >= tau and have a SIS; median SIS: 1.0% of the features.")

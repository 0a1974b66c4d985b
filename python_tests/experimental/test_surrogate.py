"""Virtual descents on a surrogate of the criterion (overinterp_fast/experimental/surrogate.py, virtual_iterations).

Expectations come from the model itself (its real descents), from arithmetic by hand, or from a
criterion built to be linear in the cell fractions.
"""
import pytest
import torch
import overinterp_fast as of
from overinterp_fast.experimental import SurrogateMinimalPixelSet, SurrogateResponsibility
from overinterp_fast.methods.responsibility import MutantCache, compute_responsibility
from overinterp_fast.experimental.surrogate import (SEED_OFFSET, Surrogate, add_virtual_descents, cell_fractions, fit_surrogate,
                                       virtual_descents)
from helpers import PatchReader, responsibility_evaluator, top1 as _top1


def research_maps(model, x, progress=False, **kw):
    """of.responsibility with the research options: experimental.SurrogateResponsibility."""
    return SurrogateResponsibility(model, **kw).compute_maps(x, show_progress=progress)


def research_sets(model, x, progress=False, **kw):
    """of.fast_sis(method="responsibility") with the research options: experimental.SurrogateMinimalPixelSet."""
    return SurrogateMinimalPixelSet(model, **kw).find_sis(x, show_progress=progress)


# a 28x28 image of ones; the patch rows 8:16, cols 12:20 is the 2x2-pixel cells (4..7, 6..9) of a 14x14 grid.
# PatchReader(need=0.4): class 0 (the class of the whole image) while more than 25.6 of its 64 pixels are kept,
# i.e. while the patch cells' kept fractions sum to more than 6.4 (they are multiples of 1/4: never equal).
ROWS, COLS = slice(8, 16), slice(12, 20)


def _patch_surrogate(runner, n=1, sharp=100.0):
    weight = torch.zeros(n, 14, 14, dtype=torch.float64)
    weight[:, 4:8, 6:10] = sharp
    return Surrogate(weight.view(n, -1), torch.full((n,), -6.4 * sharp, dtype=torch.float64), [None] * n, 14, 28,
                     28, runner, [float("nan")] * n)


def _scored(need, n, iterations, depth, seed):
    """Real descents of PatchReader(need) on n 28x28 images of ones: (evaluator, prep, present, their cache)."""
    model = PatchReader(ROWS, COLS, need=need).eval()
    with torch.inference_mode():
        ev, prep = responsibility_evaluator(model, torch.ones(n, 1, 28, 28, dtype=torch.float64))
        present = torch.ones(n, 28 * 28, dtype=torch.bool)
        cache = MutantCache()
        compute_responsibility(ev, prep, present, _top1, iterations, depth, 4, seed, False, cache=cache)
    return ev, prep, present, cache


def test_cell_fractions_by_hand():
    keep = torch.zeros(2, 4, 4, dtype=torch.bool)
    keep[0, 0, 0] = True  # one pixel of cell (0, 0)
    keep[0, 2:4, 2:4] = True  # all of cell (1, 1)
    keep[1, :, 1] = True  # one column: a half of cells (0, 0) and (1, 0)
    got = cell_fractions(keep.view(2, -1), 4, 4, 2)
    assert torch.equal(got, torch.tensor([[0.25, 0, 0, 1], [0.5, 0, 0.5, 0]], dtype=torch.float64))


@pytest.mark.timeout(60)
def test_an_exact_surrogate_gives_the_model_s_own_descents():
    """A surrogate that decides every mutant as the model does (the patch criterion written on the cells) must
    give exactly the maps of ReX's descents of the model with the same seeds."""
    model = PatchReader(ROWS, COLS, need=0.4).eval()
    x = torch.ones(2, 1, 28, 28, dtype=torch.float64)
    with torch.inference_mode():
        ev, prep = responsibility_evaluator(model, x)
        present = torch.ones(2, 28 * 28, dtype=torch.bool)
        want, _ = compute_responsibility(ev, prep, present, _top1, 5, 10, 4, 3, False)
        got = virtual_descents(_patch_surrogate(ev.runner, 2), prep, present, [0, 1], 5, 10, 4, 3)
    assert want.abs().sum() > 0 and torch.equal(got, want)
    with torch.inference_mode():  # an image left out gets zeros
        one = virtual_descents(_patch_surrogate(ev.runner, 2), prep, present, [1], 5, 10, 4, 3)
    assert torch.equal(one[1], want[1]) and not one[0].any()
    with torch.inference_mode():  # a single descent
        want1, _ = compute_responsibility(ev, prep, present, _top1, 1, 10, 4, 3, False)
        got1 = virtual_descents(_patch_surrogate(ev.runner, 2), prep, present, [0, 1], 1, 10, 4, 3)
    assert want1.abs().sum() > 0 and torch.equal(got1, want1)


@pytest.mark.timeout(60)
def test_fit_learns_a_criterion_linear_in_the_cells():
    """The patch criterion is a threshold on a sum of cell fractions: the fitted model gets at least 95% of the
    real descents' mutants right, and agrees with the model on the mutants of new descents."""
    ev, prep, present, cache = _scored(0.4, 1, 8, 10, 0)
    with torch.inference_mode():
        sur = fit_surrogate(cache, present, lambda i, f, t: bool(t), 1, 28, 28, ev.runner)
        assert sur.constant == [None] and sur.accuracy[0] >= 0.95
        assert sur.weight.dtype == sur.bias.dtype == torch.float64
        fresh = MutantCache()
        compute_responsibility(ev, prep, present, _top1, 4, 10, 4, 100, False, cache=fresh)
        keys = list(fresh.scores)
        keep = torch.zeros(len(keys), 28, 28, dtype=torch.bool)
        for j, key in enumerate(keys):
            for y0, x0, y1, x1 in key[1:]:
                keep[j, y0:y1, x0:x1] = True
        _, predicted = sur(keep.view(len(keys), -1), torch.zeros(len(keys), dtype=torch.int64), None, None)
    truth = torch.tensor([fresh.scores[k][1] for k in keys])
    assert (predicted == truth).double().mean() >= 0.9
    # the patch cells carry the weight: their mean outweighs every cell outside the patch
    w = sur.weight.view(14, 14)
    outside = torch.ones(14, 14, dtype=torch.bool)
    outside[4:8, 6:10] = False
    assert w[4:8, 6:10].mean() > 2 * w[outside].max()


@pytest.mark.timeout(60)
def test_one_outcome_gives_a_constant_and_labels_follow_passes():
    """An image whose scored mutants all passed predicts a pass for any mask; labels come from ``passes``
    (here: never), not from top-1; an image with no mutant is taken as failing."""
    ev, prep, present, cache = _scored(0.0, 2, 1, 2, 0)  # need 0: class 0 whatever is kept, every mutant passes
    with torch.inference_mode():
        only0 = MutantCache()
        only0.scores = {k: v for k, v in cache.scores.items() if k[0] == 0}
        sur = fit_surrogate(only0, present, _top1, 2, 28, 28, ev.runner)
        assert sur.constant == [True, False] and sur.accuracy[0] == 1.0 and sur.accuracy[1] != sur.accuracy[1]
        f, ok = sur(torch.zeros(2, 28 * 28, dtype=torch.bool), torch.tensor([0, 1]), None, None)
        assert ok.tolist() == [True, False] and f.tolist() == [1.0, 0.0]
        never = fit_surrogate(cache, present, lambda i, f, t: False, 2, 28, 28, ev.runner)
        by_image = fit_surrogate(cache, present, lambda i, f, t: i == 1 and f > -float("inf"), 2, 28, 28, ev.runner)
    assert never.constant == [False, False]
    assert by_image.constant == [False, True]  # passes sees each mutant's image and score


@pytest.mark.timeout(120)
def test_virtual_iterations_cost_no_query_and_change_only_the_ranking():
    """fast_sis and responsibility with virtual_iterations: the same queries as without, a map that adds the
    virtual descents of a surrogate fitted to the same run, the same result twice, and an MPS that passes on
    the model and lies in the patch."""
    model = PatchReader(slice(4, 10), slice(3, 9), need=0.4).eval()
    x = 0.5 + torch.rand(1, 3, 28, 28, generator=torch.Generator().manual_seed(1))
    base, = of.responsibility(model, x, iterations=4, seed=2, monotone=True)
    more, = research_maps(model, x, iterations=4, seed=2, monotone=True, virtual_iterations=6)
    again, = research_maps(model, x, iterations=4, seed=2, monotone=True, virtual_iterations=6)
    assert more.queries == base.queries and not torch.equal(more.map, base.map) and torch.equal(more.map, again.map)
    with torch.inference_mode():  # the same sum, built from the parts
        ev, prep = responsibility_evaluator(model, x)
        present = torch.ones(1, 28 * 28, dtype=torch.bool)
        cache = MutantCache()
        maps, _ = compute_responsibility(ev, prep, present, _top1, 4, 10, 10, 2, False, monotone=True, cache=cache)
        want = add_virtual_descents(maps, cache, ev.runner, prep, present, _top1, 6, 10, 10, 2)
        sur = fit_surrogate(cache, present, _top1, 1, 28, 28, ev.runner)
        alone = virtual_descents(sur, prep, present, [0], 6, 10, 10, 2 + SEED_OFFSET)
    torch.testing.assert_close(more.map, want[0], rtol=0, atol=1e-9)
    torch.testing.assert_close(more.map, base.map + alone[0], rtol=0, atol=1e-9)
    r0, = of.fast_sis(model, x, method="responsibility", options=of.MinimalPixelSetOptions(iterations=4, seed=2))
    r1, = research_sets(model, x, iterations=4, seed=2, virtual_iterations=6)
    assert r1.queries == r0.queries and r1.sis is not None
    mask = r1.mask.any(0) if r1.mask.dim() == 3 else r1.mask
    with torch.no_grad():
        assert int(model(torch.where(mask, x[0], torch.zeros(())).unsqueeze(0)).argmax(1)) == r1.target
    inside = torch.zeros(28, 28, dtype=torch.bool)
    inside[4:10, 3:9] = True
    assert (mask & ~inside).sum() == 0


@pytest.mark.parametrize("option", ["virtual_iterations", "gated_iterations"])
@pytest.mark.parametrize("bad", [-1, True, 1.5, "10"])
def test_bad_virtual_and_gated_iterations_are_refused(option, bad):
    model = PatchReader(ROWS, COLS).eval()
    x = torch.ones(1, 1, 28, 28)
    with pytest.raises(ValueError, match=f"{option} must be an int >= 0"):
        research_sets(model, x, **{option: bad})
    with pytest.raises(ValueError, match=f"{option} must be an int >= 0"):
        research_maps(model, x, **{option: bad})


def test_gated_iterations_need_an_int_number_of_iterations():
    from overinterp_fast.experimental.surrogate import GatedEvaluator
    model = PatchReader(ROWS, COLS).eval()
    x = torch.ones(1, 1, 28, 28)
    whole = r'^gated_iterations needs an int number of iterations, not iterations="auto"$'
    with pytest.raises(ValueError, match=whole):
        research_sets(model, x, iterations="auto", gated_iterations=2)
    with pytest.raises(ValueError, match="margin must be in"):
        GatedEvaluator(type("E", (), {"runner": None})(), None, margin=0.6)


@pytest.mark.timeout(120)
def test_gated_iterations_cost_fewer_queries_than_as_many_real_ones():
    """responsibility with 3 real + 3 gated descents: fewer queries than 6 real descents and more than 3;
    fast_sis with them: the same descent queries, and an MPS that passes on the model and lies in the patch."""
    model = PatchReader(slice(4, 10), slice(3, 9), need=0.4).eval()
    x = 0.5 + torch.rand(1, 3, 28, 28, generator=torch.Generator().manual_seed(1))
    three, = of.responsibility(model, x, iterations=3, seed=2, monotone=True)
    six, = of.responsibility(model, x, iterations=6, seed=2, monotone=True)
    gated, = research_maps(model, x, iterations=3, seed=2, monotone=True, gated_iterations=3)
    assert three.queries < gated.queries < six.queries
    r, = research_sets(model, x, iterations=3, gated_iterations=3, seed=2)
    mask = r.mask.any(0) if r.mask.dim() == 3 else r.mask
    with torch.no_grad():
        assert int(model(torch.where(mask, x[0], torch.zeros(())).unsqueeze(0)).argmax(1)) == r.target
    inside = torch.zeros(28, 28, dtype=torch.bool)
    inside[4:10, 3:9] = True
    assert r.sis is not None and (mask & ~inside).sum() == 0
    assert r.queries == gated.queries  # fast_sis ran the same gated descents (monotone by default)


def test_bad_grid_and_penalty_are_refused():
    for bad in (0, True, 1.5):
        with pytest.raises(ValueError, match="grid must be an int >= 1"):
            fit_surrogate(MutantCache(), torch.ones(1, 4, dtype=torch.bool), _top1, 1, 2, 2, None, grid=bad)
    one = fit_surrogate(MutantCache(), torch.ones(1, 4, dtype=torch.bool), _top1, 1, 2, 2, None, grid=1)
    assert one.weight.shape == (1, 1) and one.constant == [False]  # one cell: allowed; no mutant: failing
    with pytest.raises(ValueError, match="l2 must be > 0"):
        fit_surrogate(MutantCache(), torch.ones(1, 4, dtype=torch.bool), _top1, 1, 2, 2, None, l2=0.0)


def test_a_mutant_passes_when_its_probability_exceeds_one_half():
    """Weights 0: the probability is sigmoid(bias) whatever is kept; a pass needs more than 1/2."""
    bias = torch.tensor([0.1, -0.1, 0.0], dtype=torch.float64)
    sur = Surrogate(torch.zeros(3, 4, dtype=torch.float64), bias, [None] * 3, 2, 4, 4, None, [float("nan")] * 3)
    f, ok = sur(torch.ones(3, 16, dtype=torch.bool), torch.arange(3), None, None)
    torch.testing.assert_close(f, torch.sigmoid(bias))
    assert ok.tolist() == [True, False, False]
    scored = sur.score_rectangles(torch.tensor([[0, 0, 4, 4]] * 3), torch.arange(3), torch.arange(3),
                                  torch.ones(3, 16, dtype=torch.bool))  # the rectangle interface: the same
    assert scored[:, 1].tolist() == [1.0, 0.0, 0.0] and scored[:, 2].tolist() == [16.0] * 3


@pytest.mark.parametrize("h,w,grid", [(28, 28, 14), (30, 17, 4), (5, 7, 3), (3, 3, 3), (2, 5, 3)])
def test_cell_fractions_from_rectangles_equal_painted_masks(h, w, grid, monkeypatch):
    """Mutants as disjoint rectangles (kept quadrants of random splits), some pixels absent: the fractions and
    pixel counts computed from the rectangles equal those of the painted masks counted cell by cell in plain
    Python (cells: floor(i * size / grid)); scoring in chunks of 3 mutants changes nothing."""
    import overinterp_fast.experimental.surrogate as sg
    g = torch.Generator().manual_seed(h * w + grid)
    n, m = 3, 25
    present = torch.rand(n, h, w, generator=g) > 0.3
    images = torch.randint(0, n, (m,), generator=g)
    rects, owner, keep = [], [], torch.zeros(m, h, w, dtype=torch.bool)
    for j in range(m):
        y0, y1 = sorted(torch.randint(0, h + 1, (2,), generator=g).tolist())
        x0, x1 = sorted(torch.randint(0, w + 1, (2,), generator=g).tolist())
        ys, xs = int(torch.randint(y0, y1 + 1, (1,), generator=g)), int(torch.randint(x0, x1 + 1, (1,), generator=g))
        for q in ((y0, x0, ys, xs), (y0, xs, ys, x1), (ys, x0, y1, xs), (ys, xs, y1, x1)):
            if float(torch.rand(1, generator=g)) < 0.6:
                rects.append(q)
                owner.append(j)
                keep[j, q[0]:q[2], q[1]:q[3]] = True
    keep &= present[images]
    yb = [i * h // grid for i in range(grid + 1)]
    xb = [i * w // grid for i in range(grid + 1)]
    want = torch.tensor([[keep[j, yb[a]:yb[a + 1], xb[b]:xb[b + 1]].sum().item()
                          / max(1, (yb[a + 1] - yb[a]) * (xb[b + 1] - xb[b])) for a in range(grid) for b in range(grid)]
                         for j in range(m)], dtype=torch.float64)
    rect_t, owner_t = torch.tensor(rects).view(-1, 4), torch.tensor(owner)
    got, kept = sg.rect_cell_fractions(rect_t, owner_t, images, sg._integral(present), h, w, grid)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    torch.testing.assert_close(sg.cell_fractions(keep.view(m, -1), h, w, grid), want, rtol=0, atol=1e-12)
    assert kept.tolist() == keep.view(m, -1).sum(1).tolist()
    sur = Surrogate(torch.linspace(-1, 1, grid * grid, dtype=torch.float64).repeat(n, 1),
                    torch.tensor([0.1, -0.2, 0.3], dtype=torch.float64), [None, None, True], grid, h, w, None,
                    [float("nan")] * n)
    whole = sur.score_rectangles(rect_t, owner_t, images, present.view(n, -1))
    monkeypatch.setattr(sg, "RECT_CHUNK", 3)
    chunked = sur.score_rectangles(rect_t, owner_t, images, present.view(n, -1))
    torch.testing.assert_close(chunked, whole, rtol=0, atol=0)
    prob, ok = sur(keep.view(m, -1), images, None, None)  # the mask interface agrees
    torch.testing.assert_close(whole[:, 0], prob, rtol=0, atol=1e-12)
    assert whole[:, 1].bool().tolist() == ok.tolist() and whole[:, 2].tolist() == kept.double().tolist()
    assert whole[:, 3].eq(0).all()  # the surrogate's answers: no query
    none = torch.zeros(0, dtype=torch.int64)  # no mutant: an empty score table
    empty = sur.score_rectangles(torch.zeros(0, 4, dtype=torch.int64), none, none, present.view(n, -1))
    assert empty.shape == (0, 4) and empty.dtype == torch.float64


@pytest.mark.parametrize("chunk", [64, 2, 1])
def test_newton_fit_equals_scikit_learn(monkeypatch, chunk):
    """The fit is scikit-learn's LogisticRegression(C=1/l2) (penalty on the weights, not the intercept), image by
    image, for images with different numbers of mutants, fitted in one problem batch or in chunks of 2; an
    image with a constant is left untouched."""
    sklearn = pytest.importorskip("sklearn.linear_model")
    import overinterp_fast.experimental.surrogate as sg
    monkeypatch.setattr(sg, "FIT_CHUNK", chunk)
    gen = torch.Generator().manual_seed(5)
    d, sizes, l2 = 6, [40, 0, 25, 60], 0.7
    x = torch.rand(sum(sizes), d, generator=gen, dtype=torch.float64)
    img = torch.repeat_interleave(torch.arange(len(sizes)), torch.tensor(sizes))
    true_w = torch.randn(len(sizes), d, generator=gen, dtype=torch.float64) * 4
    z = (x * true_w[img]).sum(1)
    z = z - torch.zeros(len(sizes), dtype=torch.float64).index_add_(0, img, z)[img] / torch.tensor(sizes)[img]
    y = (torch.rand(len(img), generator=gen, dtype=torch.float64) < torch.sigmoid(z)).double()
    constant = [None, False, None, None]
    weight = torch.full((len(sizes), d), 9.0, dtype=torch.float64)
    bias = torch.full((len(sizes),), 9.0, dtype=torch.float64)
    sg._fit(weight, bias, x, y, img, constant, l2)
    assert weight[1].eq(9).all() and bias[1] == 9  # the constant image: not fitted
    for i in (0, 2, 3):
        sel = img == i
        assert 0 < y[sel].sum() < sel.sum()  # both outcomes
        ref = sklearn.LogisticRegression(C=1 / l2, tol=1e-12, max_iter=10_000).fit(x[sel].numpy(), y[sel].numpy())
        assert torch.allclose(weight[i], torch.from_numpy(ref.coef_[0]), atol=1e-6)
        assert abs(float(bias[i]) - float(ref.intercept_[0])) < 1e-6


def test_newton_with_a_full_penalty_meets_the_optimality_condition():
    """logistic_newton with a full (non-diagonal) penalty P: at its answer v, each problem's gradient
    X'(sigmoid(Xv) - y) + Pv vanishes, computed here from the definition."""
    from overinterp_fast.experimental.surrogate import logistic_newton
    gen = torch.Generator().manual_seed(11)
    d, sizes = 5, [30, 50]
    x = torch.rand(sum(sizes), d, generator=gen, dtype=torch.float64)
    row = torch.repeat_interleave(torch.arange(2), torch.tensor(sizes))
    y = (torch.rand(len(row), generator=gen, dtype=torch.float64) < x[:, 0]).double()
    a = torch.randn(d, d, generator=gen, dtype=torch.float64)
    pen = torch.zeros(d + 1, d + 1, dtype=torch.float64)
    pen[:d, :d] = a @ a.T + 0.1 * torch.eye(d, dtype=torch.float64)
    v = logistic_newton(x, y, row, 2, pen)
    for k in range(2):
        xk = torch.cat([x[row == k], torch.ones(sizes[k], 1, dtype=torch.float64)], 1)
        grad = xk.T @ (torch.sigmoid(xk @ v[k]) - y[row == k]) + pen @ v[k]
        assert grad.abs().max() < 1e-8 and v[k].abs().max() > 1e-3


def test_newton_halves_a_step_that_overshoots():
    """On a nearly separable problem (found by a random search) the full Newton step from the origin raises the
    objective at some step, computed here with plain torch ops; logistic_newton halves that step and still meets
    the optimality condition X'(sigmoid(Xv) - y) + Pv = 0."""
    from overinterp_fast.experimental.surrogate import logistic_newton, ridge
    x = torch.tensor([[-31, 93, 3], [117, -37, -9], [128, 5, 100], [39, 22, -10], [31, -21, 65], [71, 53, 104]],
                     dtype=torch.float64)
    y = torch.tensor([0, 0, 0, 1, 1, 0], dtype=torch.float64)
    pen = ridge(3, 1e-3)
    xs = torch.cat([x, torch.ones(6, 1, dtype=torch.float64)], 1)

    def objective(v):
        return float(torch.nn.functional.binary_cross_entropy_with_logits(xs @ v, y, reduction="sum") + v @ pen @ v / 2)

    v, overshoot = torch.zeros(4, dtype=torch.float64), False
    for _ in range(20):  # plain Newton: does a full step ever raise the objective?
        prob = torch.sigmoid(xs @ v)
        step = torch.linalg.solve(xs.T @ (xs * (prob * (1 - prob)).unsqueeze(1)) + pen, xs.T @ (prob - y) + pen @ v)
        overshoot = objective(v - step) > objective(v)
        if overshoot:
            break
        v = v - step
    assert overshoot
    got = logistic_newton(x, y, torch.zeros(6, dtype=torch.int64), 1, pen)[0]
    grad = xs.T @ (torch.sigmoid(xs @ got) - y) + pen @ got
    assert grad.abs().max() < 1e-6 and got.abs().max() > 1


@pytest.mark.timeout(60)
def test_fit_counts_only_the_pixels_present():
    """A mutant keeps its rectangles' pixels that are present: where the top 8 rows (cell rows 0-3 of the
    14 x 14 grid) are absent, those cells are never kept, so the penalised fit leaves their weights at 0;
    with every pixel present the same cells get weight."""
    model = PatchReader(ROWS, COLS, need=0.4).eval()
    weights = {}
    for name, rows_absent in (("all", 0), ("top absent", 8)):
        with torch.inference_mode():
            ev, prep = responsibility_evaluator(model, torch.ones(1, 1, 28, 28, dtype=torch.float64))
            present = torch.ones(1, 28, 28, dtype=torch.bool)
            present[:, :rows_absent] = False
            present = present.view(1, -1)
            cache = MutantCache()
            compute_responsibility(ev, prep, present, _top1, 6, 10, 4, 0, False, cache=cache)
            sur = fit_surrogate(cache, present, _top1, 1, 28, 28, ev.runner)
        assert sur.constant == [None]
        weights[name] = sur.weight.view(14, 14)
    assert weights["top absent"][:4].eq(0).all() and weights["top absent"][4:].ne(0).any()
    assert weights["all"][:4].ne(0).any()


@pytest.mark.timeout(60)
def test_virtual_descents_score_every_mutant():
    """Virtual descents are ReX's (monotone=False): on a surrogate that passes when the patch is mostly
    removed (not monotone in the pixels kept), they equal descend(monotone=False), which here differs from
    the monotone descents' map."""
    from overinterp_fast.methods.responsibility import descend
    model = PatchReader(ROWS, COLS, need=0.4).eval()
    with torch.inference_mode():
        ev, prep = responsibility_evaluator(model, torch.ones(1, 1, 28, 28, dtype=torch.float64))
        present = torch.ones(1, 28 * 28, dtype=torch.bool)
        sur = _patch_surrogate(ev.runner, 1, sharp=-100.0)  # passes while the patch keeps less than 6.4 cells
        got = virtual_descents(sur, prep, present, [0], 4, 10, 4, 5)
        full, _ = descend(sur, prep, present, _top1, [(0, 5 + t) for t in range(4)], 10, 4, MutantCache(),
                          progress=False, monotone=False)
        skipping, _ = descend(sur, prep, present, _top1, [(0, 5 + t) for t in range(4)], 10, 4, MutantCache(),
                              progress=False, monotone=True)
    assert torch.equal(got[0], full.sum(0)) and not torch.equal(full, skipping)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("iterations", [3, "auto"])
def test_ranking_maps_adds_virtual_descents_fitted_on_the_run_s_mutants(iterations):
    """ranking_maps = the real descents (fixed or auto) + the virtual descents of a surrogate fitted to the
    mutants those real descents scored (one cache), built here from the parts; with one virtual descent too."""
    from overinterp_fast.methods.responsibility import auto_responsibility
    from overinterp_fast.experimental.surrogate import research_hook
    from overinterp_fast.methods.responsibility import DescentPlan, ranking_maps
    model = PatchReader(slice(4, 10), slice(3, 9), need=0.4).eval()
    x = 0.5 + torch.rand(1, 3, 28, 28, generator=torch.Generator().manual_seed(3))
    with torch.inference_mode():
        ev, prep = responsibility_evaluator(model, x)
        present = torch.ones(1, 28 * 28, dtype=torch.bool)
        for virtual in (1, 5):
            got, q = ranking_maps(ev, prep, present, _top1, DescentPlan(iterations, 10, 4, 7, False, True,
                                                                        research_hook(virtual)))
            cache = MutantCache()
            if iterations == "auto":
                maps, want_q, _ = auto_responsibility(ev, prep, present, _top1, 10, 4, 7, False, monotone=True,
                                                      cache=cache)
            else:
                maps, want_q = compute_responsibility(ev, prep, present, _top1, iterations, 10, 4, 7, False,
                                                      monotone=True, cache=cache)
            sur = fit_surrogate(cache, present, _top1, 1, 28, 28, ev.runner)
            extra = virtual_descents(sur, prep, present, [0], virtual, 10, 4, 7 + SEED_OFFSET)
            assert q == want_q and extra.abs().sum() > 0
            torch.testing.assert_close(got, maps + extra, rtol=0, atol=1e-9)
            assert torch.equal(add_virtual_descents(maps, cache, ev.runner, prep, present, _top1, virtual, 10, 4, 7),
                               got)


@pytest.mark.timeout(60)
def test_surrogate_makes_its_tensors_beside_its_inputs_not_on_torch_s_default_device():
    """Under a meta default device (as torch.set_default_device("cuda") would be for CPU inputs), the fit, the
    rectangle scores (also of no mutant) and ranking_maps give what they give outside: a tensor made on meta
    holds no data, so any tensor made on the default device fails."""
    from overinterp_fast.experimental.surrogate import research_hook
    from overinterp_fast.methods.responsibility import DescentPlan, ranking_maps
    ev, prep, present, cache = _scored(0.4, 2, 4, 10, 0)
    rects = torch.tensor([[0, 0, 14, 28], [14, 0, 28, 14], [8, 12, 16, 20]])
    owner, images = torch.tensor([0, 0, 1]), torch.tensor([0, 1])
    none = torch.zeros(0, dtype=torch.int64)

    def run():
        sur = fit_surrogate(cache, present, _top1, 2, 28, 28, ev.runner)
        scores = sur.score_rectangles(rects, owner, images, present)
        empty = sur.score_rectangles(torch.zeros(0, 4, dtype=torch.int64), none, none, present)
        maps, q = ranking_maps(ev, prep, present, _top1, DescentPlan(3, 10, 4, 7, False, True, research_hook(4, 2)))
        return sur.weight, sur.bias, scores, empty, maps, q

    with torch.inference_mode():
        want = run()
        with torch.device("meta"):
            got = run()
    for a, b in zip(got[:5], want[:5]):
        assert a.device.type == "cpu"
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert got[5] == want[5] and want[0].abs().sum() > 0


def test_ridge_penalises_the_weights_not_the_intercept_on_the_host():
    """ridge(d, l2): float64 diag(l2, ..., l2, 0) on the CPU (also under another default device), or on the
    device given."""
    from overinterp_fast.experimental.surrogate import ridge
    want = torch.diag(torch.tensor([0.5, 0.5, 0.0], dtype=torch.float64))
    with torch.device("meta"):
        got = ridge(2, 0.5)
    assert got.device.type == "cpu" and got.dtype == torch.float64 and torch.equal(got, want)
    assert ridge(2, 0.5, torch.device("meta")).device.type == "meta"


# ---- gated descents (gated_iterations) ----

def _mild_patch_surrogate(runner, n=1):
    """Passes while the patch cells' kept fractions sum to more than 6.4, with probabilities that never reach
    0 or 1 in float64 (|logit| <= 16 x 0.5 x 6.4 + ...: weight 0.5)."""
    return _patch_surrogate(runner, n, sharp=0.5)


@pytest.mark.timeout(60)
def test_gated_descents_with_margin_zero_are_the_model_s_descents():
    """margin 0: every mutant whose probability is strictly between 0 and 1 (here all) is asked of the model, so
    the gated descents' maps, queries and cache answers are those of the real descents with the same seeds."""
    from overinterp_fast.experimental.surrogate import GatedEvaluator
    model = PatchReader(ROWS, COLS, need=0.4).eval()
    with torch.inference_mode():
        ev, prep = responsibility_evaluator(model, torch.ones(2, 1, 28, 28, dtype=torch.float64))
        present = torch.ones(2, 28 * 28, dtype=torch.bool)
        want_cache, got_cache = MutantCache(), MutantCache()
        want, want_q = compute_responsibility(ev, prep, present, _top1, 3, 10, 4, 11, False, monotone=True,
                                              cache=want_cache)
        gated = GatedEvaluator(ev, _mild_patch_surrogate(ev.runner, 2), margin=0.0)
        got, got_q = compute_responsibility(gated, prep, present, _top1, 3, 10, 4, 11, False, monotone=True,
                                            cache=got_cache)
    assert not got_cache.guessed and got_q == want_q and sum(want_q) > 0
    assert torch.equal(got, want) and got_cache.scores == want_cache.scores


@pytest.mark.timeout(60)
@pytest.mark.parametrize("margin", [0.2, 0.45])
def test_gated_descents_ask_the_model_only_where_the_surrogate_is_unsure(margin):
    """Every mutant a gated descent scored, checked by hand: painted in plain torch, its cell fractions give the
    surrogate's probability p; where margin < p < 1 - margin the cache holds the model's own f and top-1 (a
    query), elsewhere the surrogate's p and p > 1/2 (in cache.guessed, no query); the queries per image count
    the first kind. margin 0.5: nothing is asked, and the descents are the surrogate's own."""
    from overinterp_fast.experimental.surrogate import GatedEvaluator
    model = PatchReader(ROWS, COLS, need=0.4).eval()
    with torch.inference_mode():
        ev, prep = responsibility_evaluator(model, torch.ones(2, 1, 28, 28, dtype=torch.float64))
        present = torch.ones(2, 28 * 28, dtype=torch.bool)
        present[1, :28 * 4] = False  # image 1: its top 4 rows absent
        sur = _patch_surrogate(ev.runner, 2, sharp=2.0)
        cache = MutantCache()
        _, q = compute_responsibility(GatedEvaluator(ev, sur, margin), prep, present, _top1, 4, 10, 4, 3, False,
                                      monotone=True, cache=cache)
        asked = {0: 0, 1: 0}
        for key, (f, top1, kept) in cache.scores.items():
            mask = torch.zeros(28, 28, dtype=torch.bool)
            for y0, x0, y1, x1 in key[1:]:
                mask[y0:y1, x0:x1] = True
            mask &= present[key[0]].view(28, 28)
            frac = mask.double().view(14, 2, 14, 2).mean((1, 3))
            p = float(torch.sigmoid((frac[4:8, 6:10].sum() - 6.4) * 2.0))
            assert kept == int(mask.sum())
            if margin < p < 1 - margin:
                x = prep.images[key[0]:key[0] + 1] * mask
                logits = model(x)
                assert key not in cache.guessed and top1 == bool(logits.argmax(1) == 0)
                assert f == pytest.approx(float(torch.softmax(logits, 1)[0, 0]), abs=1e-9)
                asked[key[0]] += 1
            else:
                assert key in cache.guessed and f == pytest.approx(p, abs=1e-12) and top1 == (p > 0.5)
        assert q == [asked[0], asked[1]] and 0 < len(cache.guessed) < len(cache.scores) and sum(q) > 0
        none_cache = MutantCache()
        sure, q_sure = compute_responsibility(GatedEvaluator(ev, sur, 0.5), prep, present, _top1, 4, 10, 4, 3,
                                              False, monotone=True, cache=none_cache)
        own, _ = compute_responsibility(sur, prep, present, _top1, 4, 10, 4, 3, False, monotone=True)
    assert q_sure == [0, 0] and none_cache.guessed == set(none_cache.scores) and torch.equal(sure, own)


@pytest.mark.timeout(60)
def test_a_constant_surrogate_is_never_trusted():
    """An image whose surrogate is a constant (all its mutants had one outcome) has every mutant asked of the
    model, whatever the margin; the other image is gated."""
    from overinterp_fast.experimental.surrogate import GatedEvaluator
    model = PatchReader(ROWS, COLS, need=0.4).eval()
    with torch.inference_mode():
        ev, prep = responsibility_evaluator(model, torch.ones(2, 1, 28, 28, dtype=torch.float64))
        present = torch.ones(2, 28 * 28, dtype=torch.bool)
        sur = _patch_surrogate(ev.runner, 2, sharp=2.0)
        sur.constant = [True, None]
        cache = MutantCache()
        _, q = compute_responsibility(GatedEvaluator(ev, sur, 0.5), prep, present, _top1, 3, 10, 4, 0, False,
                                      monotone=True, cache=cache)
    assert q[0] > 0 and q[1] == 0
    assert all(k[0] == 1 for k in cache.guessed) and any(k[0] == 0 for k in cache.scores)


def test_the_fit_learns_from_the_model_s_answers_only():
    """mutant_features leaves out the keys a surrogate answered (cache.guessed)."""
    from overinterp_fast.experimental.surrogate import mutant_features
    cache = MutantCache()
    cache.scores[(0, (0, 0, 2, 2))] = (0.9, True, 4)
    cache.scores[(0, (0, 0, 4, 4))] = (0.2, False, 16)
    cache.scores[(0, (2, 2, 4, 4))] = (0.8, True, 4)
    cache.guessed.add((0, (2, 2, 4, 4)))
    x, y, img = mutant_features(cache, torch.ones(1, 16, dtype=torch.bool), _top1, 1, 4, 4, 2)
    assert y.tolist() == [1.0, 0.0] and img.tolist() == [0, 0]
    assert x.tolist() == [[1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]]


def _patch_run():
    """PatchReader(rows 4:10, cols 3:9, need 0.4) on one random 28x28 RGB image (seed 3): (evaluator, prep,
    present: every pixel)."""
    model = PatchReader(slice(4, 10), slice(3, 9), need=0.4).eval()
    x = 0.5 + torch.rand(1, 3, 28, 28, generator=torch.Generator().manual_seed(3))
    with torch.inference_mode():
        ev, prep = responsibility_evaluator(model, x)
    return ev, prep, torch.ones(1, 28 * 28, dtype=torch.bool)


@pytest.mark.timeout(120)
def test_add_gated_descents_refits_before_every_descent(monkeypatch):
    """Gated descent t (seed first_seed + t) runs on a surrogate fitted to every mutant the model has answered
    so far, the real descents' and the earlier gated ones' (one cache); the maps add up and the queries are
    the model's. Built here from the parts."""
    import overinterp_fast.experimental.surrogate as sg
    from overinterp_fast.experimental.surrogate import GatedEvaluator, add_gated_descents, mutant_features
    fits = []
    real_fit = sg.fit_surrogate

    def recording_fit(cache, *args, **kw):
        fits.append(len(cache.scores) - len(cache.guessed))
        return real_fit(cache, *args, **kw)

    monkeypatch.setattr(sg, "fit_surrogate", recording_fit)
    ev, prep, present = _patch_run()
    with torch.inference_mode():
        cache = MutantCache()
        maps, q = compute_responsibility(ev, prep, present, _top1, 3, 10, 4, 7, False, monotone=True, cache=cache)
        answered = len(cache.scores)
        got, got_q = add_gated_descents(maps, q, cache, ev, prep, present, _top1, 2, 10, 10, 4, True, margin=0.2)
        # by hand: the same two steps on a copy of the real descents' cache
        want_cache = MutantCache()
        want, want_q = compute_responsibility(ev, prep, present, _top1, 3, 10, 4, 7, False, monotone=True,
                                              cache=want_cache)
        for t in range(2):
            sur = real_fit(want_cache, present, _top1, 1, 28, 28, ev.runner)
            logs, q_t = compute_responsibility(GatedEvaluator(ev, sur, 0.2), prep, present, _top1, 1, 10, 4, 10 + t,
                                               False, monotone=True, cache=want_cache)
            want, want_q = want + logs, [a + b for a, b in zip(want_q, q_t)]
    assert fits[0] == answered and fits[1] > fits[0] and len(fits) == 2
    assert got_q == want_q and got_q[0] > q[0]
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert not torch.equal(got, maps)
    assert len(mutant_features(cache, present, _top1, 1, 28, 28, 14)[1]) == len(cache.scores) - len(cache.guessed)


def test_gating_trusts_a_probability_of_exactly_margin_or_one_minus_margin():
    """The surrogate answers where p <= margin or p >= 1 - margin, both ends included: weights 0 make p =
    sigmoid(bias), exactly 0.75 and 0.25 here (bias +-log 3), so margin 0.25 answers both mutants at no query,
    and a margin a hair smaller asks the model (its f and top-1, checked with a plain forward pass)."""
    import math
    from overinterp_fast.experimental.surrogate import GatedEvaluator
    model = PatchReader(ROWS, COLS, need=0.4).eval()
    with torch.inference_mode():
        ev, prep = responsibility_evaluator(model, torch.ones(2, 1, 28, 28, dtype=torch.float64))
        present = torch.ones(2, 28 * 28, dtype=torch.bool)
        bias = torch.tensor([math.log(3), -math.log(3)], dtype=torch.float64)
        sur = Surrogate(torch.zeros(2, 196, dtype=torch.float64), bias, [None, None], 14, 28, 28, ev.runner,
                        [float("nan")] * 2)
        rects = torch.tensor([[0, 0, 28, 28], [0, 0, 14, 28]], dtype=torch.int64)  # image 0 whole; image 1, top half
        owner = images = torch.tensor([0, 1])
        sure = GatedEvaluator(ev, sur, 0.25).score_rectangles(rects, owner, images, present)
        unsure = GatedEvaluator(ev, sur, 0.25 - 1e-9).score_rectangles(rects, owner, images, present)
        top = torch.zeros(1, 1, 28, 28, dtype=torch.float64)
        top[..., :14, :] = 1.0
        logits = model(torch.cat([torch.ones(1, 1, 28, 28, dtype=torch.float64), top]))
    assert sure.tolist() == [[0.75, 1.0, 784.0, 0.0], [0.25, 0.0, 392.0, 0.0]]
    assert unsure[:, 1:].tolist() == [[1.0, 784.0, 1.0], [1.0, 392.0, 1.0]]  # class 0 both: 48 patch pixels kept
    assert logits.argmax(1).tolist() == [0, 0]
    torch.testing.assert_close(unsure[:, 0], torch.softmax(logits, 1)[:, 0], rtol=0, atol=1e-12)


@pytest.mark.timeout(120)
def test_gated_descents_follow_the_monotone_option():
    """margin 0 never trusts the surrogate (no p is exactly 0 or 1 here), so 2 real + 2 gated descents are the
    model's own 4 descents (seeds 7..10, one cache), with monotone=True or False as asked; the monotone ones cost
    fewer queries."""
    from overinterp_fast.experimental.surrogate import add_gated_descents
    total = {}
    ev, prep, present = _patch_run()
    with torch.inference_mode():
        for monotone in (True, False):
            cache = MutantCache()
            maps, q = compute_responsibility(ev, prep, present, _top1, 2, 10, 4, 7, False, monotone=monotone,
                                             cache=cache)
            got, got_q = add_gated_descents(maps, q, cache, ev, prep, present, _top1, 2, 9, 10, 4, monotone,
                                            margin=0.0)
            want, want_q = compute_responsibility(ev, prep, present, _top1, 4, 10, 4, 7, False, monotone=monotone,
                                                  cache=MutantCache())
            assert not cache.guessed and got_q == want_q
            torch.testing.assert_close(got, want)
            total[monotone] = got_q[0]
    assert total[True] < total[False]


def test_ranking_maps_passes_monotone_to_the_gated_descents(monkeypatch):
    """ranking_maps hands its monotone option to add_gated_descents (as it does to the real descents)."""
    import inspect
    import overinterp_fast.experimental.surrogate as sg
    from overinterp_fast.experimental.surrogate import research_hook
    from overinterp_fast.methods.responsibility import DescentPlan, ranking_maps
    seen = []
    real = sg.add_gated_descents

    def spy(*args, **kw):
        seen.append(inspect.signature(real).bind(*args, **kw).arguments["monotone"])
        return real(*args, **kw)

    monkeypatch.setattr(sg, "add_gated_descents", spy)
    ev, prep, present = _patch_run()
    with torch.inference_mode():
        for monotone in (True, False):
            ranking_maps(ev, prep, present, _top1, DescentPlan(2, 10, 4, 5, False, monotone, research_hook(0, 1)))
    assert seen == [True, False]

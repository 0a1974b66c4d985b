"""Square-by-square ranking and scan of minimal pixel sets (blocks.py; fast_sis(..., block=...)).
"""
import pytest
import torch
import overinterp_fast as of
from overinterp_fast.methods.blocks import auto_block, block_positions, check_block, scan_sizes
from helpers import PatchReader, assert_one_minimal, top1_on


def brute_block_ranking(scores, present, h, w, b):
    """Pure-Python reference: present pixels sorted by (square mean rounded to 9 decimals desc, square index desc, score desc, index
    desc); the sizes at which a square ends; every present pixel's square mean."""
    bw = -(-w // b)
    sq = lambda i: (i // w) // b * bw + (i % w) // b  # noqa: E731
    sums, cnts = {}, {}
    for i in range(h * w):
        if present[i]:
            sums[sq(i)] = sums.get(sq(i), 0.0) + float(scores[i])
            cnts[sq(i)] = cnts.get(sq(i), 0) + 1
    mean = {s: round(sums[s] / cnts[s], 9) for s in sums}
    order = sorted((i for i in range(h * w) if present[i]), key=lambda i: (-mean[sq(i)], -sq(i), -float(scores[i]), -i))
    ends, total = [], 0
    for s in sorted(mean, key=lambda s: (-mean[s], -s)):
        total += cnts[s]
        ends.append(total)
    return order, ends, {i: mean[sq(i)] for i in order}


def test_block_positions_by_hand():
    # 3 x 5 grid, squares of 2: square 0 = {1, 2, 3, 4} mean 2.5, square 1 = {0, 0, 0, 9} mean 2.25,
    # square 2 = {5, 0} mean 2.5 (ties square 0: the higher square first), squares 3-5 (bottom row) mean 0
    s = torch.tensor([[1.0, 2, 0, 0, 5], [3, 4, 0, 9, 0], [0, 0, 0, 0, 0]]).view(1, -1)
    pos, sizes, key = block_positions(s, torch.ones(1, 15, dtype=torch.bool), 3, 5, 2)
    assert pos.view(3, 5).tolist() == [[5, 4, 9, 8, 0], [3, 2, 7, 6, 1], [14, 13, 12, 11, 10]]
    assert sizes == [[2, 6, 10, 11, 13, 15]]
    assert key.view(3, 5).tolist() == [[2.5, 2.5, 2.25, 2.25, 2.5], [2.5, 2.5, 2.25, 2.25, 2.5], [0.0] * 5]
    # without the right column (square 2 has no pixel left; absent pixels rank last, at 15, key 0)
    present = torch.ones(1, 15, dtype=torch.bool)
    present[0, [4, 9]] = False
    pos, sizes, key = block_positions(s, present, 3, 5, 2)
    assert pos.view(3, 5).tolist() == [[3, 2, 7, 6, 15], [1, 0, 5, 4, 15], [12, 11, 10, 9, 8]]
    assert sizes == [[4, 8, 9, 11, 13]]
    assert key.view(3, 5)[:, 4].tolist() == [0.0, 0.0, 0.0]


@pytest.mark.parametrize("h,w,b", [(6, 6, 2), (7, 5, 3), (5, 9, 4), (4, 4, 1), (3, 3, 5)])
def test_block_positions_equal_a_brute_force_sort(h, w, b):
    g = torch.Generator().manual_seed(h * 100 + w * 10 + b)
    scores = torch.randint(0, 3, (4, h * w), generator=g).double()  # many exact ties
    present = torch.rand(4, h * w, generator=g) > 0.25
    present[3] = False  # a row with nothing left
    pos, sizes, key = block_positions(scores, present, h, w, b)
    for r in range(4):
        order, ends, mean = brute_block_ranking(scores[r].tolist(), present[r].tolist(), h, w, b)
        assert [int(torch.nonzero(pos[r] == k)) for k in range(len(order))] == order
        assert (pos[r][~present[r]] == h * w).all()
        assert sizes[r] == ends
        assert all(abs(float(key[r, i]) - m) < 1e-12 for i, m in mean.items())


def test_scan_sizes_steps_squares_then_grows_by_ten_percent():
    ends = [64 * (k + 1) for k in range(784)]  # 224 x 224 in squares of 8
    got = scan_sizes(ends)
    assert got[:64] == ends[:64]
    # then the first end >= 1.1 x the last size kept: 4096 -> 4544 (71 squares), 4544 -> 5056, ...
    assert got[64:67] == [4544, 5056, 5568]
    assert got[-1] == 50176 and all(b >= 1.1 * a for a, b in zip(got[64:-2], got[65:-1]))
    assert len(got) == 90
    assert scan_sizes([3, 5], squares=1) == [3, 5]  # the last end is always tried
    assert scan_sizes([10, 20, 21, 22, 23, 30], squares=2, ratio=1.1) == [10, 20, 22, 30]


def test_auto_block_and_checks():
    assert [auto_block(224, 224), auto_block(32, 32), auto_block(64, 64), auto_block(299, 299)] == [8, 1, 2, 11]
    for ok in ("auto", 1, 8):
        check_block(ok)
    for bad in (0, -1, 2.0, True, "8", None):
        with pytest.raises(ValueError, match="block must be 'auto' or an int >= 1"):
            check_block(bad)
    x = torch.rand(1, 3, 8, 8)
    with pytest.raises(ValueError, match="block must be"):
        of.fast_sis(PatchReader(slice(0, 2), slice(0, 2)), x, method="responsibility",
                    options=of.MinimalPixelSetOptions(block=0))


@pytest.mark.parametrize("rows,cols", [(slice(4, 12), slice(14, 22)), (slice(20, 26), slice(0, 9))])
def test_square_scan_finds_the_first_passing_square_then_the_pixel_boundary(rows, cols):
    """block=4 on 32x32: the ranking is the responsibility map's square ranking (brute force), every scan size
    before the boundary's square fails, the boundary prefix passes and the one pixel shorter fails (plain
    forward passes), and the pruned set lies inside the planted patch and is 1-minimal."""
    model = PatchReader(rows, cols, need=0.4).eval()
    x = 0.5 + torch.rand(2, 3, 32, 32, generator=torch.Generator().manual_seed(rows.start + cols.start))
    res = of.fast_sis(model, x, method="responsibility", options=of.MinimalPixelSetOptions(iterations=4, block=4,
                                                                                           refine_budget=None))
    maps = of.responsibility(model, x, iterations=4, seed=0, monotone=True)
    inside = torch.zeros(32, 32, dtype=torch.bool)
    inside[rows, cols] = True
    for img, r, m in zip(x, res, maps):
        order, ends, mean = brute_block_ranking(m.map.view(-1).tolist(), [True] * 1024, 32, 32, 4)
        assert r.order.tolist() == order
        assert r.values.tolist() == pytest.approx([mean[i] for i in order], rel=1e-12)
        assert r.queries == m.queries

        def passes(k):
            keep = torch.zeros(1024, dtype=torch.bool)
            keep[torch.tensor(order[:k])] = True
            return top1_on(model, img, keep.view(32, 32)) == r.target

        k = r.size_before_refine
        assert passes(k) and not passes(k - 1)
        tried = scan_sizes(ends)
        first = next(s for s in tried if s >= k)
        assert passes(first) and not any(passes(s) for s in tried if s < first)
        assert (r.mask & inside).sum() >= 0.95 * r.mask.sum()
        assert r.minimal is True and r.size <= k
        assert_one_minimal(model, img, r.mask, r.target)


def test_refine_budget_auto_prunes_small_sets_and_leaves_large_ones():
    """refine_budget="auto" (the default): a boundary set of more than 256 pixels is returned unpruned (no
    pruning query, minimal False); a small one is pruned to a certified 1-minimal set."""
    big = PatchReader(slice(0, 24), slice(0, 24), need=0.7).eval()  # needs about 0.7 x 576 = 403 pixels
    small = PatchReader(slice(3, 7), slice(3, 7), need=0.4).eval()
    x = 0.5 + torch.rand(1, 3, 32, 32, generator=torch.Generator().manual_seed(2))
    kw = dict(method="responsibility")
    b, = of.fast_sis(big, x, **kw, options=of.MinimalPixelSetOptions(iterations=2))
    assert b.size_before_refine > 256 and b.size == b.size_before_refine
    assert b.refine_queries == 0 and b.minimal is False and top1_on(big, x[0], b.mask) == b.target
    s, = of.fast_sis(small, x, **kw, options=of.MinimalPixelSetOptions(iterations=2))
    assert s.size_before_refine <= 256 and s.minimal is True and s.refine_queries > 0
    assert_one_minimal(small, x[0], s.mask, s.target)
    for bad in ("none", -3):
        with pytest.raises(ValueError, match="refine_budget must be 'auto', an int >= 0 or None"):
            of.fast_sis(small, x, **kw, options=of.MinimalPixelSetOptions(iterations=2, refine_budget=bad))


def test_defaults_are_eight_monotone_iterations_ranked_in_auto_squares():
    """fast_sis(method="responsibility") with no options: the map of 8 iterations (seed 0) with monotone=True,
    ranked in squares of auto_block(H, W) (2 at 64x64: 4 pixels per square, so the scan keeps ReX's steps of 10)."""
    model = PatchReader(slice(20, 30), slice(30, 44), need=0.4).eval()
    x = 0.5 + torch.rand(1, 3, 64, 64, generator=torch.Generator().manual_seed(9))
    r, = of.fast_sis(model, x, method="responsibility")
    m, = of.responsibility(model, x, iterations=8, seed=0, monotone=True)
    assert r.queries == m.queries
    order, _, mean = brute_block_ranking(m.map.view(-1).tolist(), [True] * 4096, 64, 64, 2)
    assert r.order.tolist() == order
    assert r.values.tolist() == pytest.approx([mean[i] for i in order], rel=1e-12)
    assert r.minimal is True and top1_on(model, x[0], r.mask) == r.target


def test_square_scan_per_row_and_the_redo_on_the_model_keeps_each_rows_squares():
    """6x6 images, block 4: squares S0 (rows 0-3, cols 0-3, 16 pixels), S1 (rows 0-3, cols 4-5, 8), S2 (rows 4-5,
    cols 0-3, 8), S3 (rows 4-5, cols 4-5, 4). Image 0 ranks S3, S1, S2, S0 (square ends 4, 12, 20, 36), image 1 ranks
    S0, S1, S2, S3 (ends 16, 24, 32, 36); inside a square, the lower pixel index first. The stand-in engine needs
    pixel 28 (image 0) and pixel 0 (image 1); the model needs {28} and {0, 5}: image 1's set {0} fails there and is
    redone on the model with image 1's own squares: 16 fails, 24 passes (one round of 2), bisection 20, 18, 17:
    boundary 18 (S0 and pixels 4, 5), pruned to {0, 5}."""
    from overinterp_fast.methods.extraction import ExtractionConfig, extract_sets
    from overinterp_fast.runtime.inputs import prepare

    from helpers import RuleEvaluator

    square = [(i // 6) // 4 * 2 + (i % 6) // 4 for i in range(36)]
    rank0, rank1 = {3: 40, 1: 30, 2: 20, 0: 10}, {0: 40, 1: 30, 2: 20, 3: 10}
    scores = torch.tensor([[rank[square[i]] - 0.01 * i for i in range(36)] for rank in (rank0, rank1)],
                          dtype=torch.float64)
    need = lambda want: lambda i, ids: (len(ids & want[i]) / len(want[i]), want[i] <= ids)  # noqa: E731
    engine = RuleEvaluator(need({0: {28}, 1: {0}}))
    model = RuleEvaluator(need({0: {28}, 1: {0, 5}}))
    prep = prepare(torch.ones(2, 1, 6, 6, dtype=torch.float64))
    a, b = extract_sets(engine, prep, torch.tensor([1, 1]), torch.ones(2, dtype=torch.float64), [0.5, 0.5],
                        lambda present: (scores, None), lambda i, f, t: bool(t),
                        ExtractionConfig(step=10, verifier=model, engine="stand-in", refine=True, refine_budget=None,
                                         refine_scan=10, block=4))
    assert a.order[:4].tolist() == [28, 29, 34, 35] and a.order[4:12].tolist() == [4, 5, 10, 11, 16, 17, 22, 23]
    assert b.order[:16].tolist() == [0, 1, 2, 3, 6, 7, 8, 9, 12, 13, 14, 15, 18, 19, 20, 21]
    # the engine's scan of image 0: squares 4 and 12 (one round of 2), then bisection of (0, 4): 2 and 1 pass
    assert [s for i, s in engine.seen if i == 0][:4] == [4, 12, 2, 1]
    assert a.size_before_refine == 1 and a.sis.tolist() == [28] and a.minimal is True
    assert [s for i, s in model.seen if i == 1][:6] == [1, 16, 24, 20, 18, 17]
    assert b.size_before_refine == 18 and sorted(b.sis.tolist()) == [0, 5] and b.minimal is True


def test_refine_budget_auto_prunes_a_set_of_exactly_256_features():
    """Boundary prefixes of exactly 256 features are pruned (to a certified 1-minimal set); of 257, not."""
    from overinterp_fast.methods.extraction import refined_sets

    from helpers import RuleEvaluator

    pos = torch.arange(300).view(1, -1)
    for need, pruned in ((256, True), (257, False)):
        ev = RuleEvaluator(lambda i, ids, need=need: (len(ids) / 300, len(ids) >= need))
        out, _, q_prune = refined_sets(ev, pos, [0], [300], lambda r, f, t: bool(t), budget="auto")
        feats, k, _, minimal = out[0]
        assert k == need and feats.tolist() == list(range(need))
        assert minimal is pruned and (q_prune[0] > 0) is pruned


def test_block_one_ranks_and_reports_the_raw_map_and_boundary_uses_squares():
    """block=1: values are the map itself (not square means rounded to 9 decimals); refine="boundary" with squares of
    4: a pixel-exact boundary prefix of the square ranking (plain forward passes)."""
    model = PatchReader(slice(4, 12), slice(14, 22), need=0.4).eval()
    x = 0.5 + torch.rand(1, 3, 32, 32, generator=torch.Generator().manual_seed(4))
    m, = of.responsibility(model, x, iterations=3, seed=0)
    r, = of.fast_sis(model, x, method="responsibility", options=of.MinimalPixelSetOptions(iterations=3, block=1))
    assert torch.equal(r.values, m.map.view(-1)[r.order].double())
    b, = of.fast_sis(model, x, method="responsibility", options=of.MinimalPixelSetOptions(iterations=3, block=4,
                                                                                          refine="boundary"))
    order, _, _ = brute_block_ranking(m.map.view(-1).tolist(), [True] * 1024, 32, 32, 4)
    assert b.order.tolist() == order and b.minimal is None

    def passes(k):
        keep = torch.zeros(1024, dtype=torch.bool)
        keep[torch.tensor(order[:k])] = True
        return top1_on(model, x[0], keep.view(32, 32)) == b.target

    assert passes(b.size) and not passes(b.size - 1)


def test_block_positions_checks_the_grid_and_makes_everything_on_the_scores_device():
    """A grid that does not match the scores is refused with the whole message; under a meta default device
    (as torch.set_default_device("cuda") would be for CPU inputs) every tensor is still made beside the scores."""
    with pytest.raises(ValueError, match=r"^scores have 12 features per row, not H\*W = 15$"):
        block_positions(torch.zeros(1, 12), torch.ones(1, 12, dtype=torch.bool), 3, 5, 2)
    s = torch.tensor([[1.0, 2, 0, 0, 5], [3, 4, 0, 9, 0], [0, 0, 0, 0, 0]]).view(1, -1)
    present = torch.ones(1, 15, dtype=torch.bool)
    with torch.device("meta"):
        pos, sizes, key = block_positions(s, present, 3, 5, 2)
    assert pos.device.type == "cpu" and key.device.type == "cpu"
    assert pos.view(3, 5).tolist() == [[5, 4, 9, 8, 0], [3, 2, 7, 6, 1], [14, 13, 12, 11, 10]]
    assert sizes == [[2, 6, 10, 11, 13, 15]] and key.dtype == torch.float64

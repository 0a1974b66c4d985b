"""Hand-built expectations for prefix.py.

A stand-in evaluator scores each candidate from its set of present features with a rule written here, and
records every candidate it sees, so the sizes probed, their order and the answers are checked against
sequences derived by hand from the algorithms' descriptions (FindSIS over a ranking; the exponential
search then bisection of boundary_prefix). Nothing here is computed with the module under test.

Every test here is marked ``mutation``: each was written for a survivor of a mutation run (mutmut) and pins,
with its expectation worked out by hand, a detail that the behavioural tests let through.
"""
import pytest
import torch
from overinterp_fast.methods.prefix import _Bracket, _speculate, boundary_prefix, first_passing_prefix, verify_prefix_sets
from helpers import RuleEvaluator, top1


def Recorder(rule):
    return RuleEvaluator(rule)


def at_least(need):
    """f = number of present features / 100; top-1 once ``need[image]`` features are present."""
    return lambda i, ids: (len(ids) / 100, len(ids) >= need[i])


def identity_positions(rows, p):
    """pos[r, j] = j: prefix k keeps features 0 .. k-1."""
    return torch.arange(p).repeat(rows, 1)


# ---------------------------------------------------------------------------------------------- boundary_prefix

@pytest.mark.mutation
@pytest.mark.timeout(30)
def test_boundary_prefix_grows_from_10_then_bisects():
    """count 100, passing from 37 on: 10 fails, grow by 10 (20 fails), stride doubles (40 passes), then
    bisection 30, 35, 37, 36: boundary 37. A row passing from 1: 10 passes, nothing below is known to fail:
    step down by 10 (to 1, clamped above lo = 0), which passes: boundary 1."""
    ev = Recorder(at_least({0: 37, 1: 1}))
    hits, queries = boundary_prefix(ev, identity_positions(2, 100), [0, 1], [100, 100], top1)
    assert [s for i, s in ev.seen if i == 0] == [10, 20, 40, 30, 35, 37, 36]
    assert [s for i, s in ev.seen if i == 1] == [10, 1]
    assert hits == [(37, 0.37), (1, 0.01)] and queries == [7, 2]
    # round by round: both rows probe together while both are open (row 0 first), then row 0 alone
    assert ev.seen[:4] == [(0, 10), (1, 10), (0, 20), (1, 1)]


@pytest.mark.mutation
@pytest.mark.timeout(30)
def test_boundary_prefix_from_a_start_shrinks_by_doubling_strides():
    """start 64 (stride 64 // 32 = 2), count 100, passing from 5: 64 passes; only the assumed empty prefix
    fails below, so step down by 2, 4, 8, 16, 32 (62, 58, 50, 34, then 2, which fails), then bisect
    (2, 34): 18, 10, 6, 4, 5. A second row (image 3) starting at 64 with count 40 starts at 40 (clamped), grows
    to nothing (40 fails): None. A row of count 0 is not searched."""
    ev = Recorder(at_least({0: 5, 3: 1000}))
    hits, queries = boundary_prefix(ev, identity_positions(3, 100), [0, 3, 0], [100, 40, 0], top1,
                                    starts=[64, 64, 7])
    assert [s for i, s in ev.seen if i == 0] == [64, 62, 58, 50, 34, 2, 18, 10, 6, 4, 5]
    assert [s for i, s in ev.seen if i == 3] == [40]
    assert hits == [(5, 0.05), None, None] and queries == [11, 1, 0]
    assert type(hits[0][0]) is int  # sizes stay ints (a stride of start / 32 would make them floats)


@pytest.mark.mutation
@pytest.mark.timeout(30)
def test_boundary_prefix_grows_past_a_start_and_stops_at_the_count():
    """start 32 (stride 1), passing from 45: 32 fails; grow 33 (stride 1), then strides 2, 4, 8: 35, 39, 47
    (passes); bisect (39, 47): 43, 45, 44. start 3 (stride max(1, 0) = 1) on count 5 with nothing passing:
    3, 4, then 5 = count (min(4 + 2, 5)), which fails: None."""
    ev = Recorder(at_least({0: 45, 1: 1000}))
    hits, queries = boundary_prefix(ev, identity_positions(2, 60), [0, 1], [60, 5], top1, starts=[32, 3])
    assert [s for i, s in ev.seen if i == 0] == [32, 33, 35, 39, 47, 43, 45, 44]
    assert [s for i, s in ev.seen if i == 1] == [3, 4, 5]
    assert hits == [(45, 0.45), None] and queries == [8, 3]


@pytest.mark.mutation
@pytest.mark.timeout(30)
def test_boundary_prefix_brackets_only_bisect():
    """brackets (lo, hi, f_hi): only the bisection between them runs; a bracket of adjacent sizes costs no
    query and returns hi with the given f; None: the ordinary search from 10."""
    ev = Recorder(at_least({0: 23, 1: 1, 2: 12}))
    hits, queries = boundary_prefix(ev, identity_positions(3, 50), [0, 1, 2], [50, 50, 50], top1,
                                    brackets=[(20, 30, 0.7), (7, 8, 0.25), None])
    assert [s for i, s in ev.seen if i == 0] == [25, 22, 23]  # 20 + 10 // 2, 20 + 5 // 2, 22 + 1
    assert [s for i, s in ev.seen if i == 1] == []
    assert [s for i, s in ev.seen if i == 2] == [10, 20, 15, 12, 11]
    assert hits == [(23, 0.23), (8, 0.25), (12, 0.12)] and queries == [3, 0, 5]


@pytest.mark.mutation
@pytest.mark.timeout(30)
def test_boundary_prefix_uses_the_rows_image_and_positions():
    """pos reorders the features (row 0 ranks feature 9 first, ...); the rule needs features {9, 8, 7}, so the
    boundary is 3 in row 0's order (start 2 fails, 3 = 2 + stride 1 passes) and 10 in row 1's (feature 7 last:
    10 passes, 1 = max(10 - 10, 0 + 1) fails, then bisection 5, 7, 8, 9)."""
    need = {7, 8, 9}
    ev = Recorder(lambda i, ids: (len(ids & need) / 3, need <= ids))
    pos = torch.stack([torch.arange(9, -1, -1), torch.arange(10)])
    hits, queries = boundary_prefix(ev, pos, [4, 5], [10, 10], top1, starts=[2, None])
    assert hits == [(3, 1.0), (10, 1.0)]
    assert [s for i, s in ev.seen if i == 4] == [2, 3] and [s for i, s in ev.seen if i == 5] == [10, 1, 5, 7, 8, 9]
    assert queries == [2, 6]


@pytest.mark.mutation
def test_boundary_prefix_refuses_non_finite_scores():
    ev = Recorder(lambda i, ids: (float("nan"), True))
    with pytest.raises(FloatingPointError, match="NaN or inf"):
        boundary_prefix(ev, identity_positions(1, 20), [0], [20], top1)
    with pytest.raises(FloatingPointError, match="NaN or inf"):
        first_passing_prefix(ev, identity_positions(1, 20), [0], [[1, 2]], top1)


@pytest.mark.mutation
def test_bracket_one_probe_at_a_time():
    """_Bracket.probe/update: grow by doubling strides, bisect, shrink from a passing start, clamps."""
    b = _Bracket(10, 100, 10)
    assert (b.lo, b.hi, b.start, b.stride, b.phase) == (0, None, 10, 10, "start")
    steps = [(10, False), (20, False), (40, False), (80, True), (60, False), (70, True), (65, True), (62, False)]
    probed = []
    for size, passed in steps:
        probed.append(b.probe())
        assert b.update(size, passed, size / 100) is False
    # grow: 10, 10 + 10, 20 + 20, 40 + 40; bisect (40, 80): 60; (60, 80): 70; (60, 70): 65; (60, 65): 62
    assert probed == [10, 20, 40, 80, 60, 70, 65, 62]
    assert (b.lo, b.hi, b.f_hi, b.phase) == (62, 65, 0.65, "bisect")
    assert b.probe() == 63 and b.update(63, True, 0.63) is True and (b.lo, b.hi, b.f_hi) == (62, 63, 0.63)
    # shrink from a passing start: 64 - 2, then 62 - 4; a failure there bisects
    b = _Bracket(64, 100, 2)
    assert b.probe() == 64 and b.update(64, True, 0.64) is False and (b.phase, b.stride, b.hi) == ("shrink", 2, 64)
    assert b.probe() == 62 and b.update(62, True, 0.62) is False and (b.phase, b.stride, b.hi) == ("shrink", 4, 62)
    assert b.probe() == 58 and b.update(58, False, 0.58) is False and (b.lo, b.hi, b.phase) == (58, 62, "bisect")
    assert b.probe() == 60
    # a shrink never probes below lo + 1
    b = _Bracket(5, 100, 8)
    b.update(5, True, 0.05)
    assert b.probe() == 1
    # the start is clamped into [1, count]; a stride below 1 becomes 1; grow stops at the count
    b = _Bracket(0, 7, 0)
    assert (b.start, b.stride) == (1, 1)
    assert _Bracket(50, 7, 3).start == 7
    b = _Bracket(6, 7, 4)
    assert b.update(6, False, 0.0) is False and b.probe() == 7
    # a size at the count that fails resolves the row (nothing passes)
    b = _Bracket(7, 7, 1)
    assert b.update(7, False, 0.0) is True and b.hi is None and b.lo == 7


@pytest.mark.mutation
def test_speculate_lists_every_probe_of_the_next_levels():
    """From start 10 (count 100, stride 10): 10; on failure 20, on success a shrink to max(10 - 10, 1) = 1; then
    after 10, 20 both failing 40, 10 failing and 20 passing 15 (bisect (10, 20)), 10 passing and 1 failing 5
    (bisect (1, 10)); 10 and 1 passing resolve the row (nothing more to probe)."""
    assert _speculate(_Bracket(10, 100, 10), 1) == [10]
    assert _speculate(_Bracket(10, 100, 10), 2) == [1, 10, 20]
    assert _speculate(_Bracket(10, 100, 10), 3) == [1, 5, 10, 15, 20, 40]
    b = _Bracket(5, 9, 1)
    b.lo, b.hi, b.phase = 3, 5, "bisect"
    assert _speculate(b, 3) == [4]  # 4 resolves the row either way


@pytest.mark.timeout(30)
def test_boundary_prefix_gives_the_one_probe_answer_whatever_the_speculation(monkeypatch):
    """A criterion far from monotone: prefixes of 7, 8 and 30 or more features pass. One probe at a time from 10:
    10, 20 fail, 40 passes, then bisection 30 (passes), 25, 27, 28, 29 (fail): the boundary is 30 (7 is never
    seen). With the GPU's speculation (3 levels per round) the answer is the same, from fewer rounds."""
    from overinterp_fast.methods import prefix

    rule = lambda i, ids: (len(ids) / 100, len(ids) in (7, 8) or len(ids) >= 30)  # noqa: E731
    for levels, rounds_at_most in ((1, 9), (3, 3)):
        monkeypatch.setattr(prefix, "SPECULATION", {"cpu": levels})
        calls = []
        ev = RuleEvaluator(rule)
        real = ev.__call__
        ev_calls = lambda *a, **k: (calls.append(1), real(*a, **k))[1]  # noqa: E731
        counted = type("Counted", (), {"__call__": lambda self, *a, **k: ev_calls(*a, **k), "prep": ev.prep,
                                        "runner": ev.runner})()
        hits, queries = boundary_prefix(counted, identity_positions(1, 100), [0], [100], top1)
        assert hits == [(30, 0.3)]
        sizes = [s for _, s in ev.seen]
        if levels == 1:
            assert sizes == [10, 20, 40, 30, 25, 27, 28, 29] and queries == [8] and len(calls) == 8
        else:
            assert set(sizes) >= {10, 20, 40, 30, 25, 27, 28, 29} and queries == [len(sizes)]
            assert len(calls) <= rounds_at_most


# --------------------------------------------------------------------------------- first_passing_prefix

@pytest.mark.mutation
@pytest.mark.timeout(30)
def test_first_passing_prefix_rows_images_and_sizes():
    """Three rows over two images with their own sizes; chunks 2, 4, 8 per round on a CPU: row 0 (sizes 1..20,
    passing from 13) sees 1, 2 | 3-6 | 7-14 and answers index 12; row 1 (image 1, sizes 5, 10, 15, passing
    from 10) answers index 1 in round 1; row 2 (image 2, sizes 30, 40, nothing passes) fails both in round 1;
    an empty row is skipped."""
    ev = Recorder(at_least({0: 13, 1: 10, 2: 1000}))
    sizes = [list(range(1, 21)), [5, 10, 15], [30, 40], []]
    hits = first_passing_prefix(ev, identity_positions(4, 60), [0, 1, 2, 1], sizes, top1)
    assert hits == [(12, 0.13), (1, 0.10), None, None]
    assert ev.seen == ([(0, 1), (0, 2), (1, 5), (1, 10), (2, 30), (2, 40)]
                       + [(0, s) for s in range(3, 7)] + [(0, s) for s in range(7, 15)])


@pytest.mark.mutation
@pytest.mark.timeout(30)
def test_first_passing_prefix_takes_the_first_passing_size_of_a_chunk():
    """A criterion that is not monotone (passes at sizes 3 and 5 only): the first, 3, in the chunk 3-6."""
    ev = Recorder(lambda i, ids: (len(ids) / 10, len(ids) in (3, 5)))
    assert first_passing_prefix(ev, identity_positions(1, 10), [0], [list(range(1, 11))], top1) == [(2, 0.3)]
    # passes(r, f, top1) gets the row, f and the flag: a threshold on f ignores top-1
    ev = Recorder(lambda i, ids: (len(ids) / 10, False))
    seen = []

    def thr(r, f, t):
        seen.append((r, f, t))
        return f >= 0.4

    assert first_passing_prefix(ev, identity_positions(1, 10), [0], [list(range(1, 11))], thr) == [(3, 0.4)]
    # round 2 scores sizes 3-6 together; passes is asked in order up to the first that passes
    assert seen == [(0, 0.1, False), (0, 0.2, False), (0, 0.3, False), (0, 0.4, False)]
    assert [s for _, s in ev.seen] == [1, 2, 3, 4, 5, 6]


# ---------------------------------------------------------------------------------------- verify_prefix_sets

@pytest.mark.mutation
@pytest.mark.timeout(30)
def test_verify_prefix_sets_continues_in_the_join_order():
    """Row 0: features join in the order 7, 2, 5, 0, 9 and the rule needs {2, 5, 0}: size 2 ({7, 2}) fails,
    size 4 passes (index 1 of sizes [2, 4, 5]); features that never join stay masked. Row 1 (image 2): set
    {3} passes at once (its sizes 1 and 2 are scored in the same round: chunks of 2)."""
    need = {0: {0, 2, 5}, 2: {3}}
    sets = []

    def rule(i, ids):
        sets.append((i, sorted(ids)))
        return len(ids) / 10, need[i] <= ids

    ev = Recorder(rule)
    hits = verify_prefix_sets(ev, [0, 2], [torch.tensor([7, 2, 5, 0, 9]), torch.tensor([3, 1])], [[2, 4, 5], [1, 2]],
                              top1, 10)
    assert hits == [(1, 0.4), (0, 0.1)]
    assert sets == [(0, [2, 7]), (0, [0, 2, 5, 7]), (2, [3]), (2, [1, 3])]
    # a row whose sizes all fail: None
    assert verify_prefix_sets(Recorder(rule), [0], [torch.tensor([7, 2])], [[1, 2]], top1, 10) == [None]


@pytest.mark.mutation
@pytest.mark.timeout(30)
def test_boundary_prefix_edge_brackets_counts_and_threshold_passes():
    """A bracket from 0 (the first scanned size passed) bisects, never shrinks: (0, 20) passing from 3 probes 10,
    5, 2, 3 (a shrink would probe 10 - 20 -> 1). A bracket (7, 9) with a gap of 2 still probes 8. A row of count 1
    is searched (its one prefix). passes gets f: a threshold on f (top-1 never set) finds 6."""
    ev = RuleEvaluator(at_least({0: 3, 1: 8, 2: 1}))
    hits, queries = boundary_prefix(ev, identity_positions(3, 30), [0, 1, 2], [30, 30, 1], top1,
                                    brackets=[(0, 20, 0.2), (7, 9, 0.09), None])
    assert [s for i, s in ev.seen if i == 0] == [10, 5, 2, 3]
    assert [s for i, s in ev.seen if i == 1] == [8] and [s for i, s in ev.seen if i == 2] == [1]
    assert hits == [(3, 0.03), (8, 0.08), (1, 0.01)] and queries == [4, 1, 1]
    ev = RuleEvaluator(lambda i, ids: (len(ids) / 100, False))
    hits, _ = boundary_prefix(ev, identity_positions(1, 30), [0], [30], lambda r, f, t: f >= 0.06)
    assert hits == [(6, 0.06)]

"""Hand-built expectations for minimal.py's pruning (added for mutmut survivors; see TESTING.md).

A stand-in evaluator (conftest.RuleEvaluator) scores each candidate with a rule written here and records every
candidate set; a wrapper records how many candidates each call (each round) held. The expected candidate sets,
rounds, results and query counts below were traced by hand from the algorithm as minimal.py's docstring states
it: a greedy pass in the given order; adaptive blocks (a passing block doubles B, a failing one halves it, and
a failing block resets W to 1); at B = 1, W single removals side by side (the first passing one is taken, W
doubles while all fail; a taken single sets B = 2, W = 1); each pass starts at B = W = 1; after a pass, the kept
features whose failing removal was seen before a later removal are tested again, until a pass removes nothing;
one batch per round across all rows; a per-row budget. Nothing here is computed with the module under test.
"""
import pytest
import torch

from overinterp_fast.minimal import prune_to_minimal

from conftest import RuleEvaluator, top1


class Rounds(RuleEvaluator):
    """RuleEvaluator that also records the number of candidates of every call (one call per round)."""

    def __init__(self, rule):
        super().__init__(rule)
        self.calls: list[int] = []

    def __call__(self, present, image, row, feature):
        self.calls.append(int(image.numel()))
        return super().__call__(present, image, row, feature)


def needs(essential):
    """Passes (top-1) while every feature of ``essential`` is present; f = present features / 100."""
    return lambda ids: (len(ids) / 100, set(essential) <= ids)


def staleness(ids):
    """Not monotone: 3 must stay, and 0 may go only once 1 has gone (0 absent and 1 present fails)."""
    return len(ids) / 100, 3 in ids and (0 in ids or 1 not in ids)


# case A: blocks that pass, double, fail and halve, then widening singles (p = 13)
A_ESSENTIAL = {1, 8, 9, 10, 11, 12}
A_ORDER = [0, 2, 3, 4, 5, 6, 7, 1, 8, 9, 10, 11, 12]
A_SETS = [  # every candidate, in order, traced by hand (S: the set at that point)
    set(range(1, 13)),  # single: remove 0 (passes; B = 2)
    {1} | set(range(4, 13)),  # block [2, 3] (passes; B = 4)
    {1, 8, 9, 10, 11, 12},  # block [4, 5, 6, 7] (passes; B = 8)
    set(),  # block [1, 8, 9, 10, 11, 12] (fails; B = 4)
    {11, 12},  # block [1, 8, 9, 10] (fails; B = 2)
    {9, 10, 11, 12},  # block [1, 8] (fails; B = 1)
    {8, 9, 10, 11, 12},  # single: remove 1 (fails; W = 2)
    {1, 9, 10, 11, 12}, {1, 8, 10, 11, 12},  # singles: remove 8, 9 (fail; W = 4)
    {1, 8, 9, 11, 12}, {1, 8, 9, 10, 12}, {1, 8, 9, 10, 11},  # singles: remove 10, 11, 12 (fail); pass over
]
A_CALLS = [1, 1, 1, 1, 1, 1, 1, 2, 3]

# case B: a kept feature (0) whose removal failed becomes removable after a later removal (1): a second pass
B_ORDER = [0, 1, 2, 3]
B_SETS = [
    {1, 2, 3},  # single: remove 0 (fails: 1 present; W = 2)
    {0, 2, 3}, {0, 1, 3},  # singles: remove 1 (passes, taken: B = 2), remove 2 (evaluated beside it, not taken)
    {0},  # block [2, 3] (fails; B = 1)
    {0, 3},  # single: remove 2 (passes; B = 2)
    {0},  # block [3] (fails; B = 1)
    {0},  # single: remove 3 (fails). End of pass 1: 0 failed before two removals: tested again
    {3},  # pass 2, B = W = 1: single: remove 0 (passes)
    set(),  # pass 3: 3 failed before that removal: remove 3 (fails). Pass 4 has nothing to test.
]
B_CALLS = [1, 2, 1, 1, 1, 1, 1, 1]

# case C: known_failing = 0 (not queried), one removal in pass 1, then 0 is tested again and goes
C_START, C_ORDER = {0, 1, 3}, [0, 1, 3]
C_SETS = [{0, 3}, {0}, {0}, {3}, set()]  # remove 1 (passes), block [3], single 3 (fail); pass 2: 0 (passes); 3
C_CALLS = [1, 1, 1, 1, 1]

# case E: the first single of a window fails and the second passes (hit at 1); its successor is a block
E_ESSENTIAL, E_ORDER = {0, 1}, [0, 1, 2, 3]
E_SETS = [{1, 2, 3}, {0, 2, 3}, {0, 1, 3}, {0, 1}, {1}, {0}]  # 0; 1 and 2 (2 taken); block [3]; pass 2: 0; 1
E_CALLS = [1, 2, 1, 1, 1]

# case F: as E, but the single taken at 1 is the last removal: the f returned is that candidate's
F_ORDER = [0, 1, 2]
F_SETS = [{1, 2}, {0, 2}, {0, 1}, {1}, {0}]  # 0; 1 and 2 (2 taken); pass 2: 0; 1
F_CALLS = [1, 2, 1, 1]


def as_threshold(rule):
    """The same sets pass, told by f >= 1 (f = 1 + present / 100 on a passing set) while top-1 says the opposite."""
    def scored(ids):
        f, ok = rule(ids)
        return f + ok, not ok
    return scored


def run(rules, starts, orders, scores, known=None, budget=None, p=13, criterion="top1"):
    """prune_to_minimal on rows whose image i has rule ``rules[i]``; returns (result, evaluator).
    criterion "threshold": each rule through :func:`as_threshold`, passing on f >= 1."""
    if criterion == "threshold":
        rules = [as_threshold(rule) for rule in rules]
    ev = Rounds(lambda i, ids: rules[i](ids))
    sets = torch.zeros(len(starts), p, dtype=torch.bool)
    for r, s in enumerate(starts):
        sets[r, sorted(s)] = True
    passes = top1 if criterion == "top1" else (lambda r, f, t: f >= 1.0)
    out = prune_to_minimal(ev, sets, orders, list(range(len(starts))), scores, passes, known, budget)
    return out, ev


def sets_of(ev, image):
    return [set(ids) for i, ids in ev.sets if i == image]


@pytest.mark.timeout(30)
def test_one_row_traces_blocks_and_widening_singles():
    (pruned, f, q, cert), ev = run([needs(A_ESSENTIAL)], [set(range(13))], [A_ORDER], [0.13])
    assert sets_of(ev, 0) == A_SETS
    assert ev.calls == A_CALLS
    assert set(torch.nonzero(pruned[0]).flatten().tolist()) == A_ESSENTIAL
    assert f == [pytest.approx(0.06)] and q == [12] and cert == [True]


@pytest.mark.timeout(30)
@pytest.mark.parametrize("criterion", ["top1", "threshold"])
def test_rows_prune_together_one_batch_per_round(criterion):
    """Cases A, B, C, E and F in one call: each row's candidates are its own trace, every round is one call holding
    each active row's candidates, and the rounds are as many as the longest row needs. Passing told by the top-1
    or by f (each candidate's own f: the f returned is the last removal's)."""
    rules = [needs(A_ESSENTIAL), staleness, staleness, needs(E_ESSENTIAL), needs(E_ESSENTIAL)]
    starts = [set(range(13)), set(B_ORDER), C_START, set(E_ORDER), set(F_ORDER)]
    extra = 1.0 if criterion == "threshold" else 0.0
    (pruned, f, q, cert), ev = run(rules, starts, [A_ORDER, B_ORDER, C_ORDER, E_ORDER, F_ORDER],
                                   [extra + x for x in (0.13, 0.04, 0.03, 0.04, 0.03)],
                                   known=[None, None, 0, None, None], criterion=criterion)
    assert [sets_of(ev, i) for i in range(5)] == [A_SETS, B_SETS, C_SETS, E_SETS, F_SETS]
    traces = [A_CALLS, B_CALLS, C_CALLS, E_CALLS, F_CALLS]
    assert ev.calls == [sum(t[k] for t in traces if k < len(t)) for k in range(max(map(len, traces)))]
    assert [set(torch.nonzero(row).flatten().tolist()) for row in pruned] == [A_ESSENTIAL, {3}, {3}, E_ESSENTIAL,
                                                                             E_ESSENTIAL]
    assert f == [pytest.approx(extra + x) for x in (0.06, 0.01, 0.01, 0.02, 0.02)]
    assert q == [12, 9, 5, 6, 5] and cert == [True] * 5


@pytest.mark.timeout(30)
def test_nothing_removable_keeps_the_given_score():
    (pruned, f, q, cert), ev = run([needs({3})], [{3}], [[3]], [0.77])
    assert sets_of(ev, 0) == [set()] and f == [0.77] and q == [1] and cert == [True]
    assert pruned[0].tolist() == [i == 3 for i in range(13)]


@pytest.mark.timeout(30)
def test_single_width_is_capped_at_32_on_the_cpu():
    """100 features, all needed: widths 1, 2, 4, 8, 16, 32, then capped at 32 (and the 5 left)."""
    (pruned, f, q, cert), ev = run([needs(set(range(100)))], [set(range(100))], [list(range(100))], [1.0], p=100)
    assert ev.calls == [1, 2, 4, 8, 16, 32, 32, 5]
    assert q == [100] and cert == [True] and bool(pruned[0].all())


@pytest.mark.timeout(30)
@pytest.mark.parametrize("budget, kept, queries, calls", [
    (5, {1, 8, 9, 10, 11, 12}, 5, [1, 1, 1, 1, 1]),  # stops before the block [1, 8]
    (8, {1, 8, 9, 10, 11, 12}, 8, [1, 1, 1, 1, 1, 1, 1, 1]),  # one query left: a window of 1, not 2
    (12, {1, 8, 9, 10, 11, 12}, 12, A_CALLS),
])
def test_budget_is_spent_exactly_and_not_certified_short_of_the_end(budget, kept, queries, calls):
    (pruned, f, q, cert), ev = run([needs(A_ESSENTIAL)], [set(range(13))], [A_ORDER], [0.13], budget=budget)
    assert ev.calls == calls and q == [queries]
    assert set(torch.nonzero(pruned[0]).flatten().tolist()) == kept
    assert cert == [budget == 12]  # 12 queries finish case A; with fewer the pass is cut short


@pytest.mark.timeout(30)
def test_a_row_out_of_budget_does_not_hold_back_the_rows_after_it():
    """Budget 5: case A (first) runs out in round 6, the round in which case C (after it) ends its last pass with
    nothing left to test: C is still certified."""
    (pruned, f, q, cert), ev = run([needs(A_ESSENTIAL), staleness], [set(range(13)), C_START], [A_ORDER, C_ORDER],
                                   [0.13, 0.03], known=[None, 0], budget=5)
    assert q == [5, 5] and cert == [False, True]
    assert set(torch.nonzero(pruned[1]).flatten().tolist()) == {3}

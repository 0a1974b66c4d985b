"""Monotone inference across descents (overinterp_fast/experimental/mutant_memory.py, monotone_memory=True).

Expectations come from arithmetic by hand on small masks, and from the descents without the memory: on a
criterion that is monotone in the pixels kept (PatchReader on an image of ones) every remembered answer is
right, so the maps must be those of the same descents scored by the model, for fewer queries.
"""
import pytest
import torch
import overinterp_fast as of
from overinterp_fast.attr._base import Data
from overinterp_fast.experimental import SurrogateMinimalPixelSet, SurrogateResponsibility
from overinterp_fast.experimental.mutant_memory import MutantMemory, RememberingEvaluator, remembered_responsibility
from overinterp_fast.methods.responsibility import MutantCache, compute_responsibility
from helpers import fake_terminal
from helpers import PatchReader, responsibility_evaluator, top1 as _top1


def research_maps(model, x, progress=False, **kw):
    """of.responsibility with the research options: experimental.SurrogateResponsibility."""
    return SurrogateResponsibility(model, **kw).compute_maps(x, show_progress=progress)


def research_sets(model, x, progress=False, **kw):
    """of.fast_sis(method="responsibility") with the research options: experimental.SurrogateMinimalPixelSet."""
    return SurrogateMinimalPixelSet(model, **kw).find_sis(x, show_progress=progress)


ROWS, COLS = slice(8, 16), slice(12, 20)


def _m(*rows):
    return torch.tensor(rows, dtype=torch.float32)


def test_memory_by_hand():
    mem = MutantMemory(2)
    assert mem.infer(0, _m([1, 1, 1, 1])).tolist() == [-1]  # nothing remembered
    mem.add(0, _m(1, 1, 0, 0), True)
    # keeps both pixels of the pass: 1; keeps one of them: unknown
    assert mem.infer(0, _m([1, 1, 1, 0], [1, 1, 0, 0], [1, 0, 1, 1])).tolist() == [1, 1, -1]
    mem.add(0, _m(0, 0, 1, 1), False)
    # inside the fail: 0 (also the empty mutant); reaching outside it: unknown; containing the pass: 1
    assert mem.infer(0, _m([0, 0, 1, 0], [0, 0, 0, 0], [0, 1, 1, 0], [1, 1, 1, 1])).tolist() == [0, 0, -1, 1]
    assert mem.infer(1, _m([1, 1, 1, 1], [0, 0, 0, 0])).tolist() == [-1, -1]  # another image: its own memory
    # only minimal passes are kept: a superset of a remembered pass adds nothing, a subset replaces it
    mem.add(0, _m(1, 1, 1, 0), True)
    assert mem.passing[0].tolist() == [[1, 1, 0, 0]]
    mem.add(0, _m(1, 0, 0, 0), True)
    assert mem.passing[0].tolist() == [[1, 0, 0, 0]]
    mem.add(0, _m(0, 1, 0, 0), True)  # neither contains the other: both kept, in the order added
    assert mem.passing[0].tolist() == [[1, 0, 0, 0], [0, 1, 0, 0]]
    # only maximal fails: a subset of a remembered fail adds nothing, a superset replaces it
    mem.add(0, _m(0, 0, 1, 0), False)
    assert mem.failing[0].tolist() == [[0, 0, 1, 1]]
    mem.add(0, _m(0, 0, 1, 1), False)  # the same mask again
    assert mem.failing[0].tolist() == [[0, 0, 1, 1]]
    mem.add(1, _m(0, 1, 1, 1), False)
    mem.add(1, _m(1, 0, 0, 0), False)
    assert mem.failing[1].tolist() == [[0, 1, 1, 1], [1, 0, 0, 0]]
    mem.add(1, _m(1, 1, 1, 1), False)
    assert mem.failing[1].tolist() == [[1, 1, 1, 1]]
    assert mem.passing[1] is None


def test_a_remembered_pass_wins_over_a_remembered_fail():
    """A non-monotone model can leave a pass inside a fail; a mutant between them is taken as passing."""
    mem = MutantMemory(1)
    mem.add(0, _m(0, 0, 1, 0), True)
    mem.add(0, _m(0, 1, 1, 1), False)
    assert mem.infer(0, _m([0, 1, 1, 0], [0, 1, 0, 0])).tolist() == [1, 0]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("need,seed", [(0.4, 0), (0.7, 5)])
def test_on_a_monotone_criterion_the_maps_are_the_descents_own(need, seed):
    model = PatchReader(ROWS, COLS, need=need).eval()
    x = torch.ones(2, 1, 28, 28, dtype=torch.float64)
    without = of.responsibility(model, x, iterations=6, min_box=4, seed=seed, monotone=True, show_progress=False)
    got = research_maps(model, x, iterations=6, min_box=4, seed=seed, monotone=True, monotone_memory=True,
                            progress=False)
    for a, b in zip(without, got):
        assert a.map.abs().sum() > 0 and torch.equal(a.map, b.map)
        assert b.queries < a.queries and b.iterations == 6 and b.target == a.target
    # the same with every mutant scored (monotone=False) and with gated descents after the remembered ones
    full = of.responsibility(model, x, iterations=3, min_box=4, seed=seed, show_progress=False)
    full_mem = research_maps(model, x, iterations=3, min_box=4, seed=seed, monotone_memory=True, progress=False)
    assert all(torch.equal(a.map, b.map) and b.queries < a.queries for a, b in zip(full, full_mem))


@pytest.mark.timeout(120)
def test_remembered_answers_are_no_query():
    """The queries reported are the rows the model saw; every other mutant of the cache was remembered."""

    class Counting(PatchReader):
        rows = 0

        def forward(self, x):
            Counting.rows += x.shape[0]
            return super().forward(x)

    model = Counting(ROWS, COLS, need=0.4).eval()
    with torch.inference_mode():
        ev, prep = responsibility_evaluator(model, torch.ones(3, 1, 28, 28, dtype=torch.float64))
        ev.fn.pad_to = None  # rows padded to a fixed batch shape are copies, not queries: count the queries alone
        present = torch.ones(3, 28 * 28, dtype=torch.bool)
        present[2, : 28 * 10] = False  # image 2 may not keep its first ten rows
        cache = MutantCache()
        Counting.rows = 0
        maps, queries = remembered_responsibility(ev, prep, present, _top1, 5, 10, 4, 11, False, True, cache)
        rows = Counting.rows
        want, want_q = compute_responsibility(ev, prep, present, _top1, 5, 10, 4, 11, False, monotone=True)
    assert sum(queries) == rows > 0
    assert len(cache.guessed) > 0 and len(cache.scores) == sum(queries) + len(cache.guessed)
    assert torch.equal(maps, want) and all(a < b for a, b in zip(queries, want_q))
    # a remembered answer has no f, and counts the pixels it keeps among those present
    key = next(iter(cache.guessed))
    f, _, kept = cache.scores[key]
    assert f != f and 0 < kept <= int(present[key[0]].sum())


def test_remembering_evaluator_by_hand():
    """Two mutants of a 4x4 image: the first asked (and remembered), then a superset of it answered."""
    model = PatchReader(slice(0, 2), slice(0, 2), need=0.5).eval()  # passes while 2 of the 4 patch pixels are kept
    with torch.inference_mode():
        ev, _ = responsibility_evaluator(model, torch.ones(1, 1, 4, 4, dtype=torch.float64))
        scorer = RememberingEvaluator(ev, MutantMemory(1), _top1, 4, 4)
        present = torch.ones(1, 16, dtype=torch.bool)
        one = scorer.score_rectangles(torch.tensor([[0, 0, 1, 2]]), torch.tensor([0]), torch.tensor([0]), present)
        # a row of 2 patch pixels: f = softmax([2 - 2, 0])[0] = 1/2 is not above 1/2: top-1 is class 0 on a tie
        assert one.tolist() == [[0.5, 1.0, 2.0, 1.0]]
        two = scorer.score_rectangles(torch.tensor([[0, 0, 1, 4], [3, 3, 4, 4], [2, 0, 4, 2]]),
                                      torch.tensor([0, 0, 1]), torch.tensor([0, 0]), present)
    assert two[0, 0] != two[0, 0] and two[0, 1:].tolist() == [1.0, 5.0, 0.0]  # contains the pass: no query
    assert two[1, 1:].tolist() == [0.0, 4.0, 1.0]  # rows 2-3, columns 0-1: no patch pixel, asked, fails
    assert scorer.memory.failing[0].view(4, 4)[2:, :2].all() and int(scorer.memory.failing[0].sum()) == 4


def test_fast_sis_with_the_memory():
    model = PatchReader(ROWS, COLS, need=0.4).eval()
    x = torch.ones(2, 1, 28, 28, dtype=torch.float64)
    plain = of.fast_sis(model, x, method="responsibility", show_progress=False,
                        options=of.MinimalPixelSetOptions(iterations=5))
    got = research_sets(model, x, iterations=5, monotone_memory=True, progress=False)
    for a, b in zip(plain, got):  # the same maps (monotone criterion), so the same sets
        assert torch.equal(a.mask, b.mask) and torch.equal(a.order, b.order)
        assert b.mask[ROWS, COLS].sum() == b.mask.sum() > 0 and b.total_queries < a.total_queries


@pytest.mark.parametrize("kw,message", [
    ({"monotone_memory": 1}, "monotone_memory must be True or False, got 1"),
    ({"monotone_memory": None}, "monotone_memory must be True or False, got None"),
    ({"monotone_memory": True, "iterations": "auto"}, 'monotone_memory needs an int number of iterations, not '
                                                      'iterations="auto"'),
    ({"monotone_memory": True, "criterion": "threshold"}, 'monotone_memory needs criterion="top1" (a remembered '
                                                          "answer has no f to compare with a threshold), got "
                                                          "'threshold'"),
])
def test_bad_options(kw, message):
    model = PatchReader(ROWS, COLS).eval()
    x = torch.ones(1, 1, 28, 28)
    with pytest.raises(ValueError) as err:
        research_sets(model, x, **kw)
    assert str(err.value) == message
    if kw.get("iterations") != "auto":
        with pytest.raises(ValueError) as err:
            research_maps(model, x, **kw)
        assert str(err.value) == message


@pytest.mark.parametrize("progress,shown", [(True, True), (False, False), (None, True)])
def test_progress_bar_counts_the_waves(monkeypatch, progress, shown):
    terminal = fake_terminal(monkeypatch)
    model = PatchReader(ROWS, COLS, need=0.4).eval()
    maps = SurrogateResponsibility(model, iterations=3, min_box=4, monotone_memory=True)
    if progress is None:  # the runtime's progress=None (a bar on a terminal), as the function forms take it
        maps._maps(Data(torch.ones(1, 1, 28, 28), progress=None))
    else:
        maps.compute_maps(torch.ones(1, 1, 28, 28), show_progress=progress)
    terminal.assert_finished_bar(shown, "responsibility", 3, "descent")


def test_the_waves_pass_monotone_and_the_scorer_on():
    """monotone=True scores a split's mutants in rounds and skips those whose supersets all failed; without it all 14
    are asked in one round, before the memory knows their supersets' answers: the same maps on a monotone criterion,
    more queries. A scorer given is the one that remembers."""
    model = PatchReader(ROWS, COLS, need=0.4).eval()
    with torch.inference_mode():
        ev, prep = responsibility_evaluator(model, torch.ones(2, 1, 28, 28, dtype=torch.float64))
        present = torch.ones(2, 28 * 28, dtype=torch.bool)
        runs = {}
        for monotone in (True, False):
            cache = MutantCache()
            scorer = RememberingEvaluator(ev, MutantMemory(2), _top1, 28, 28)
            maps, q = remembered_responsibility(ev, prep, present, _top1, 4, 10, 4, 2, False, monotone, cache,
                                                scorer=scorer)
            runs[monotone] = (maps, q, len(cache.scores))
            assert all(scorer.memory.passing[i] is not None and scorer.memory.failing[i] is not None for i in (0, 1))
    assert torch.equal(runs[True][0], runs[False][0]) and runs[True][0].abs().sum() > 0
    assert all(a < b for a, b in zip(runs[True][1], runs[False][1])) and runs[True][2] < runs[False][2]

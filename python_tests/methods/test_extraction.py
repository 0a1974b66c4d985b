"""Hand-built expectations for extraction.py.

A stand-in evaluator (helpers.RuleEvaluator) scores each candidate set with a rule written here:
f = |set & need| / |need|, top-1 exactly when the set holds all of ``need``. Rankings are given, so every
prefix, boundary, pruned set, collection round and query count below is derived by hand.

Tests marked ``mutation`` were written for survivors of a mutation run (mutmut): they pin details that the behavioural tests above let through, with every expectation worked out by hand.
"""
import pytest
import torch
from overinterp_fast.methods.extraction import CountingEvaluator, ExtractionConfig, extract_sets
from overinterp_fast.runtime.inputs import prepare
from helpers import RuleEvaluator, top1


def needs(**by_image):
    """rule(image, ids): f = share of the image's needed features present; top-1 when all are."""
    want = {int(k[1:]): frozenset(v) for k, v in by_image.items()}
    return lambda i, ids: (len(ids & want[i]) / len(want[i]), want[i] <= ids)


def run(evaluator, scores, *, n=None, p=None, step=1, collection=False, verifier=None, refine=False,
        refine_budget=None, refine_scan=None, queries=None, ranks=None, passes=top1):
    """extract_sets on images of ones [n, p] (one feature per element) with a fixed ranking ``scores``."""
    n, p = scores.shape
    prep = prepare(torch.ones(n, p, dtype=torch.float64))

    def rank_fn(present):
        if ranks is not None:
            ranks.append(present.clone())
        return scores, queries

    return extract_sets(evaluator, prep, torch.arange(n) + 1, torch.linspace(0.5, 0.9, n, dtype=torch.float64),
                        [0.25 + 0.125 * i for i in range(n)], rank_fn, passes,
                        ExtractionConfig(step=step, collection=collection, verifier=verifier, engine="stand-in",
                                         refine=refine, refine_budget=refine_budget, refine_scan=refine_scan))


DESC = torch.arange(11, -1, -1, dtype=torch.float64)  # feature 0 ranked first, then 1, ...


@pytest.mark.mutation
@pytest.mark.timeout(30)
def test_first_passing_prefix_in_steps_and_every_field():
    """Image 0 needs {0, 4, 7}, ranked 0, 1, 2, ...: sizes 3, 6 (round 1), 9, 12 (round 2): 9, after 4
    candidates. Image 1: all scores equal (ties: higher id first: 11, 10, ...) and needs {11}: size 3 in round 1
    (2 candidates). Image 2 needs feature 99, which no set holds: None after all 4 sizes."""
    ev = RuleEvaluator(needs(i0={0, 4, 7}, i1={11}, i2={99}))
    scores = torch.stack([DESC, torch.zeros(12, dtype=torch.float64), DESC])
    res = run(ev, scores, step=3, queries=[5, 6, 7])
    a, b, c = res
    assert a.order.tolist() == list(range(12)) and b.order.tolist() == list(range(11, -1, -1))
    assert a.values.tolist() == DESC.tolist() and a.values.dtype == torch.float64
    assert a.sis.tolist() == list(range(9)) and b.sis.tolist() == [11, 10, 9] and c.sis is None
    assert a.mask.tolist() == [True] * 9 + [False] * 3 and b.mask.tolist() == [False] * 9 + [True] * 3
    assert c.mask is None and c.sis_score is None
    assert a.sis_score == 1.0 and b.sis_score == 1.0
    assert [r.extraction_queries for r in res] == [4, 2, 4]
    assert [ev.count(i) for i in range(3)] == [4, 2, 4]
    assert [r.target for r in res] == [1, 2, 3] and [r.queries for r in res] == [5, 6, 7]
    assert [r.score for r in res] == pytest.approx([0.5, 0.7, 0.9]) and [r.threshold for r in res] == [0.25, 0.375, 0.5]
    assert all(r.engine == "stand-in" for r in res)
    assert all(r.size_before_refine is None and r.refine_queries is None and r.minimal is None for r in res)
    # queries None (a ranking that costs no forward pass) stays None
    assert run(RuleEvaluator(needs(i0={0})), DESC[None], step=5)[0].queries is None


@pytest.mark.mutation
@pytest.mark.timeout(30)
def test_collection_masks_each_set_and_ranks_the_rest_while_it_passes():
    """Image 0 passes with any 2 of {0..5} (f = share of them): rounds {0, 1}, {2, 3}, {4, 5}; what is left
    after each passes with 4, then 2 of them (the next round's score) and then with none: 3 rounds. Image 1
    needs all 12 features: its set is everything, nothing is left: one round."""
    g = frozenset(range(6))

    def rule(i, ids):
        if i == 0:
            return len(ids & g) / 6, len(ids & g) >= 2
        return len(ids) / 12, len(ids) == 12

    ev = RuleEvaluator(rule)
    ranks = []
    res = run(ev, torch.stack([DESC, DESC]), collection=True, ranks=ranks)
    rounds = res[0].collection
    assert [r.sis.tolist() for r in rounds] == [[0, 1], [2, 3], [4, 5]]
    assert [r.order.tolist() for r in rounds] == [list(range(k, 12)) for k in (0, 2, 4)]
    assert [r.score for r in rounds] == pytest.approx([0.5, 4 / 6, 2 / 6])
    assert [r.sis_score for r in rounds] == pytest.approx([2 / 6] * 3)
    assert rounds[0] is res[0]
    assert [r.sis.tolist() for r in res[1].collection] == [list(range(12))]
    # the ranking is recomputed on what is left: all, then without {0, 1}, then without {0..3}
    assert len(ranks) == 3
    assert [ranks[t][0].nonzero().flatten().tolist() for t in range(3)] == [list(range(k, 12)) for k in (0, 2, 4)]
    assert ranks[1][1].all()  # image 1 keeps all its features (no second round for it)
    # the checks of what is left: image 0 after rounds 1, 2, 3 ({2..11}, {4..11}, {6..11})
    left = [s for i, s in ev.sets if i == 0 and len(s) in (10, 8, 6) and s[-1] == 11 and s == list(range(s[0], 12))]
    assert left == [list(range(2, 12)), list(range(4, 12)), list(range(6, 12))]
    # without collection: one round, nothing masked
    res = run(RuleEvaluator(rule), torch.stack([DESC, DESC]), collection=False)
    assert res[0].sis.tolist() == [0, 1]


P40 = torch.arange(39, -1, -1, dtype=torch.float64)  # 40 features, feature 0 ranked first


@pytest.mark.mutation
@pytest.mark.timeout(30)
@pytest.mark.parametrize("scan", [None, 10])
def test_refine_true_boundary_then_pruned_to_the_needed_features(scan):
    """Needs {3, 17, 25}, ranked 0, 1, ...: the boundary is 26. Exponential search: 10, 20 fail, 40 passes,
    then 30, 25 (fails), 27, 26: 7 queries. With a scan of 10: 10, 20 | 30, 40 (4), then bisection of (20, 30):
    25, 27, 26 (3). Pruned (least ranked first; removing 25 is known to fail) to {3, 17, 25}."""
    ev = RuleEvaluator(needs(i0={3, 17, 25}))
    (r,) = run(ev, P40[None], refine=True, refine_scan=scan)
    assert r.sis.tolist() == [3, 17, 25] and r.sis_score == 1.0
    assert r.size_before_refine == 26 and r.minimal is True
    assert r.extraction_queries == 7
    sizes = [s for _, s in ev.seen]
    assert sizes[:7] == ([10, 20, 40, 30, 25, 27, 26] if scan is None else [10, 20, 30, 40, 25, 27, 26])
    assert r.refine_queries == len(ev.seen) - 7 > 0
    # the pruning never tries to remove feature 25 alone from the boundary prefix (known to fail: that set is
    # prefix 25, probed once by the boundary search)
    assert ev.sets.count((0, list(range(25)))) == 1


@pytest.mark.mutation
@pytest.mark.timeout(30)
def test_refine_boundary_is_not_pruned_and_a_budget_stops_the_pruning():
    ev = RuleEvaluator(needs(i0={3, 17, 25}, i1={99}))
    a, b = run(ev, torch.stack([P40, P40]), refine="boundary")
    assert a.sis.tolist() == list(range(26)) and a.size_before_refine == 26 and a.refine_queries == 0
    assert a.minimal is None and a.extraction_queries == 7 and a.sis_score == 1.0
    assert b.sis is None and b.size_before_refine is None and b.minimal is None and b.refine_queries == 0
    assert b.extraction_queries == ev.count(1) == 3  # 10, 20, 40: the count fails
    ev = RuleEvaluator(needs(i0={3, 17, 25}))
    (c,) = run(ev, P40[None], refine=True, refine_budget=2)
    assert c.minimal is False and c.refine_queries <= 2 and c.refine_queries == len(ev.seen) - 7
    assert {3, 17, 25} <= set(c.sis.tolist()) and len(c.sis) < 26 and c.size_before_refine == 26
    # a boundary of 1 (feature 0 alone): no removal is known to fail, the pruning tests it
    ev = RuleEvaluator(needs(i0={0}))
    (d,) = run(ev, P40[None], refine=True)
    assert d.sis.tolist() == [0] and d.size_before_refine == 1 and d.minimal is True
    assert (0, []) in ev.sets  # the empty set was tried


@pytest.mark.mutation
@pytest.mark.timeout(30)
def test_verifier_continues_past_the_engines_prefix():
    """The stand-in engine passes image 0 at size 3 ({0}); the user's model needs {0, 7}: it continues with
    sizes 3, 6 | 9, 12 and takes 9 (its f). Image 1 passes on both at size 3; image 2 fails on the model at
    every size: None. extraction_queries add both models' candidates."""
    ev = RuleEvaluator(needs(i0={0}, i1={0}, i2={0}))
    model = RuleEvaluator(needs(i0={0, 7}, i1={0}, i2={99}))
    a, b, c = run(ev, torch.stack([DESC, DESC, DESC]), step=3, verifier=model)
    assert a.sis.tolist() == list(range(9)) and a.sis_score == 1.0
    assert b.sis.tolist() == [0, 1, 2] and c.sis is None and c.sis_score is None
    assert [model.count(i) for i in range(3)] == [4, 2, 4] and [ev.count(i) for i in range(3)] == [2, 2, 2]
    assert [r.extraction_queries for r in (a, b, c)] == [6, 4, 6]
    # the model is asked from the engine's size on: its first set is {0, 1, 2}
    assert model.sets[0] == (0, [0, 1, 2])
    # nothing found by the engine: the model is not asked
    quiet = RuleEvaluator(needs(i0={0}))
    (d,) = run(RuleEvaluator(needs(i0={99})), DESC[None], step=3, verifier=quiet)
    assert d.sis is None and quiet.seen == [] and d.extraction_queries == 4


@pytest.mark.mutation
@pytest.mark.timeout(30)
def test_verifier_of_refined_sets_redoes_a_failing_row_on_the_model():
    """Engine: image 0 needs {3, 17, 25}; the model needs feature 30 too: the engine's pruned set fails
    there (1 query), and the row is refined again on the model (boundary 31: 10, 20, 40, 30, 35, 32, 31),
    pruned to the four. Image 1 needs {5} on both: its set {5} passes on the model (1 query) with the model's f."""
    ev = RuleEvaluator(needs(i0={3, 17, 25}, i1={5}))
    model = RuleEvaluator(lambda i, ids: ((len(ids & {3, 17, 25, 30}) / 4, {3, 17, 25, 30} <= ids) if i == 0
                                          else (0.5 + 0.5 * (5 in ids), 5 in ids)))
    a, b = run(ev, torch.stack([P40, P40]), refine=True, verifier=model)
    assert a.sis.tolist() == [3, 17, 25, 30] and a.size_before_refine == 31 and a.minimal is True
    assert b.sis.tolist() == [5] and b.sis_score == 1.0 and b.minimal is True
    model_sizes = [s for i, s in model.seen if i == 0]
    assert model_sizes[:8] == [3, 10, 20, 40, 30, 35, 32, 31]
    assert a.extraction_queries == 7 + 7 and b.extraction_queries == ev.count(1) - (b.refine_queries - 1)
    assert a.refine_queries == (ev.count(0) - 7) + 1 + (model.count(0) - 8)
    assert b.refine_queries == (ev.count(1) - b.extraction_queries) + 1 and model.count(1) == 1
    # refine="boundary" with a verifier: the boundary prefix fails on the model and is redone there, unpruned
    ev = RuleEvaluator(needs(i0={3, 17, 25}))
    model = RuleEvaluator(needs(i0={3, 17, 25, 30}))
    (c,) = run(ev, P40[None], refine="boundary", verifier=model)
    assert c.sis.tolist() == list(range(31)) and c.minimal is None and c.extraction_queries == 14
    assert c.refine_queries == 1


@pytest.mark.mutation
def test_counting_evaluator_counts_candidates_per_image():
    ev = RuleEvaluator(lambda i, ids: (0.0, False))
    counted = CountingEvaluator(ev, 4)
    present = torch.ones(5, 3, dtype=torch.bool)
    f, t = counted(present, torch.tensor([2, 0, 2, 2, 3]), torch.arange(5), torch.full((5,), -1))
    assert counted.counts == [1, 0, 3, 1] and f.shape == (5,) and counted.prep is ev.prep and counted.runner is ev.runner


@pytest.mark.mutation
@pytest.mark.timeout(30)
def test_verifier_continues_from_a_later_engine_size_with_a_threshold():
    """Steps of 2 (sizes 2, 4, ..., 12). Engine: image 0 passes at 4 (index 1); the model needs feature 7 as well:
    sizes 4, 6 | 8, 10, 12: 8 (index 1 + 2 = 3). Image 1 with a threshold on f (top-1 never set): the engine's share of
    {0, 1, 2, 3} reaches 0.5 at size 2; the model's share of {0, 5, 6, 7} at size 6 (sizes 2, 4 | 6, 8, 10, 12)."""
    ev = RuleEvaluator(lambda i, ids: ((len(ids & {0, 2}) / 2, {0, 2} <= ids) if i == 0
                                       else (len(ids & {0, 1, 2, 3}) / 4, False)))
    model = RuleEvaluator(lambda i, ids: ((len(ids & {0, 2, 7}) / 3, {0, 2, 7} <= ids) if i == 0
                                          else (len(ids & {0, 5, 6, 7}) / 4, False)))
    passes = lambda i, f, t: bool(t) if i == 0 else f >= 0.5  # noqa: E731
    a, b = run(ev, torch.stack([DESC, DESC]), step=2, verifier=model, passes=passes)
    assert a.sis.tolist() == list(range(8)) and a.sis_score == 1.0
    assert b.sis.tolist() == list(range(6)) and b.sis_score == 0.5
    # chunks of 2, then 4: the rest of the sizes are scored in round 2
    assert [s for i, s in model.seen if i == 0] == [4, 6, 8, 10, 12]
    assert [s for i, s in model.seen if i == 1] == [2, 4, 6, 8, 10, 12]
    assert [r.extraction_queries for r in (a, b)] == [2 + 5, 2 + 6]


@pytest.mark.mutation
@pytest.mark.timeout(30)
def test_verifier_of_refined_sets_keeps_scan_budget_and_threshold():
    """refine=True with a scan of 10 and a budget of 2: the engine's pruned set fails on the model, and the row is
    refined again there with the same scan (10, 20 | 30, 40, then 35, 32, 31) and budget (not certified). Image 1
    passes by a threshold on f on both (f >= 0.5 with 2 of {1, 2, 3, 4}): its set is checked on the model once,
    and keeps its size before refinement (the engine's boundary, 3: 10, then 1 (fails), 5, 3, 2)."""
    ev = RuleEvaluator(lambda i, ids: ((len(ids & {3, 17, 25}) / 3, {3, 17, 25} <= ids) if i == 0
                                       else (len(ids & {1, 2, 3, 4}) / 4, False)))
    model = RuleEvaluator(lambda i, ids: ((len(ids & {3, 17, 25, 30}) / 4, {3, 17, 25, 30} <= ids) if i == 0
                                          else (len(ids & {1, 2, 3, 4}) / 4, False)))
    passes = lambda i, f, t: bool(t) if i == 0 else f >= 0.5  # noqa: E731
    a, b = run(ev, torch.stack([P40, P40]), refine=True, refine_scan=10, refine_budget=2, verifier=model,
               passes=passes)
    # image 1 again, the model now sharing only feature 1 with the engine ({1, 5, 6, 7}): the engine's pruned
    # set {1, 2} has f 0.25 there, so the row is redone on the model, by the threshold on f: scan 10 passes (20
    # scored in the same round), bisection of (0, 10): 5 fails ({1}), 7, 6 pass: boundary 6
    other = RuleEvaluator(lambda i, ids: ((len(ids & {3, 17, 25, 30}) / 4, {3, 17, 25, 30} <= ids) if i == 0
                                          else (len(ids & {1, 5, 6, 7}) / 4, False)))
    _, c = run(RuleEvaluator(ev.rule), torch.stack([P40, P40]), refine=True, refine_scan=10, verifier=other,
               passes=passes)
    assert [s for i, s in other.seen if i == 1][:6] == [2, 10, 20, 5, 7, 6] and c.size_before_refine == 6
    assert c.sis.tolist() == [1, 5] and c.sis_score == 0.5 and c.minimal is True
    assert [s for i, s in model.seen if i == 0][1:8] == [10, 20, 30, 40, 35, 32, 31]  # after the check of its set
    assert a.size_before_refine == 31 and a.minimal is False and {3, 17, 25, 30} <= set(a.sis.tolist())
    assert a.refine_queries == (ev.count(0) - 7) + 1 + (model.count(0) - 8) and model.count(0) - 8 <= 2
    assert b.size_before_refine == 3 and model.count(1) == 1 and b.sis_score == 0.5


@pytest.mark.mutation
@pytest.mark.timeout(30)
def test_refine_scan_brackets_from_zero_and_rows_that_never_pass():
    """refine=True, scan 10. Image 0 needs {0}: size 10 passes at once, bracket (0, 10): 5, 2, 1 pass: boundary 1.
    Image 1 needs {3} (prefix 4 holds features 0..3): bracket (0, 10): 5 passes, 2 and 3 fail, 4 passes: boundary 4. Image 2 needs feature 99: the
    scan (10, 20 | 30, 40) fails, no bisection: None after 4 queries. Image 3 needs {0, 1}: the boundary 2 (10,
    20, 5, 2 pass, 1 fails); removing feature 1 from it is known to fail (prefix 1): that set is probed once."""
    ev = RuleEvaluator(needs(i0={0}, i1={3}, i2={99}, i3={0, 1}))
    a, b, c, d = run(ev, torch.stack([P40] * 4), refine=True, refine_scan=10)
    assert [s for i, s in ev.seen if i == 0][:5] == [10, 20, 5, 2, 1] and a.size_before_refine == 1
    assert [s for i, s in ev.seen if i == 1][:6] == [10, 20, 5, 2, 3, 4] and b.size_before_refine == 4
    assert [s for i, s in ev.seen if i == 2] == [10, 20, 30, 40] and c.sis is None and c.extraction_queries == 4
    assert c.refine_queries == 0 and c.minimal is None and c.size_before_refine is None
    assert a.sis.tolist() == [0] and b.sis.tolist() == [3] and d.sis.tolist() == [0, 1]
    assert [r.extraction_queries for r in (a, b, d)] == [5, 6, 5]
    assert d.size_before_refine == 2 and ev.sets.count((3, [0])) == 1


@pytest.mark.mutation
def test_extract_sets_defaults_name_the_torch_engine_and_do_not_refine():
    ev = RuleEvaluator(needs(i0={0, 4}))
    prep = prepare(torch.ones(1, 12, dtype=torch.float64))
    (r,) = extract_sets(ev, prep, torch.tensor([0]), torch.tensor([0.5], dtype=torch.float64), [0.5],
                        lambda present: (DESC[None], None), top1, ExtractionConfig(step=3))
    assert r.engine == "torch" and r.sis.tolist() == list(range(6)) and r.refine_queries is None
    assert r.size_before_refine is None and r.minimal is None


@pytest.mark.mutation
@pytest.mark.timeout(30)
def test_collection_of_single_features_by_a_threshold_and_an_empty_set_ends_it():
    """Image 0 passes by f >= 1/3, f = share of {0, 1, 2} present: rounds {0}, {1}, {2} (sets of one feature go
    on); what is left scores 2/3 ({1..11}), then 1/3, then 0 (stop). Image 1 passes by top-1 on everything, even
    the empty set: refine=True prunes its set to nothing, and an empty set ends the collection (masking nothing
    would give the same round forever)."""
    g = frozenset({0, 1, 2})
    ev = RuleEvaluator(lambda i, ids: (len(ids & g) / 3, False) if i == 0 else (0.5, True))
    passes = lambda i, f, t: f >= 1 / 3 if i == 0 else bool(t)  # noqa: E731
    a, b = run(ev, torch.stack([DESC, DESC]), collection=True, passes=passes)
    assert [r.sis.tolist() for r in a.collection] == [[0], [1], [2]]
    assert [r.score for r in a.collection] == pytest.approx([0.5, 2 / 3, 1 / 3])
    assert [r.sis_score for r in a.collection] == pytest.approx([1 / 3] * 3)
    (c,) = run(RuleEvaluator(lambda i, ids: (0.5, True)), DESC[None], collection=True, refine=True)
    assert c.sis.tolist() == [] and len(c.collection) == 1 and c.size_before_refine == 1


# ----------------------------------------------------------------------------------------------------
# Minimal pixel sets on a device: the host waits for it only in runtime.sync.to_host (the counted reads) and
# in the index checks of the rect_fill and mask_apply ops; on CUDA any other wait raises (sync debug mode).
# ----------------------------------------------------------------------------------------------------

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.mark.timeout(300)
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=cuda)])
@pytest.mark.parametrize("options", [{}, {"refine": False}, {"iterations": "auto", "block": 1, "prefix_search": "scan"},
                                     {"refine": "boundary", "criterion": "threshold"}])
def test_minimal_pixel_sets_wait_for_the_device_only_to_read_it(monkeypatch, device, options):
    """fast_sis(method="responsibility") with a collection: the ranking and the extraction (everything
    extract_sets runs, the descents included) on ``device`` under torch.cuda.set_sync_debug_mode("error") on
    CUDA, but for the reads through to_host (every index is checked on the host); the same sets and queries as on
    the CPU run outside it, twice over (the GPU's maps add in a fixed order); on a GPU the boundary search also
    evaluates its speculative probes (more extraction queries, the same sets)."""
    import overinterp_fast as of
    from overinterp_fast.attr import minimal
    from helpers import assert_same_result, make_cnn, make_images, strict_sync, sync_errors

    model, x = make_cnn(3, h=12, w=14), make_images(2, h=12, w=14, seed=4)
    opts = of.MinimalPixelSetOptions(**{"iterations": 3, **options})

    def sets(model, x):
        tau = 0.6 if opts.criterion == "threshold" else None  # the top-1 criterion has no threshold
        return of.fast_sis(model, x, tau, method="responsibility", engine="torch", collection=True, options=opts,
                           show_progress=False)

    want = sets(model, x)
    calls = strict_sync(monkeypatch, device)
    extract = minimal.extract_sets

    def strict(*args, **kwargs):
        with sync_errors(device):
            return extract(*args, **kwargs)

    monkeypatch.setattr(minimal, "extract_sets", strict)
    model, x = model.to(device), x.to(device)
    for _ in range(2):
        got = sets(model, x)
        for a, b in zip(want, got):
            assert_same_result(a, b, rel=1e-9, atol=1e-9)
            assert (a.queries, a.refine_queries) == (b.queries, b.refine_queries)
            # the boundary search evaluates the next probes of every outcome together on a GPU (the same answer)
            assert a.extraction_queries == b.extraction_queries if device == "cpu" else \
                a.extraction_queries <= b.extraction_queries
            assert [c.sis.tolist() for c in a.collection or []] == [c.sis.tolist() for c in b.collection or []]
    assert set(calls) == {"to_host"}  # rect_fill's owners and mask_apply's candidates: checked on the host


@pytest.mark.timeout(120)
@pytest.mark.parametrize("options", [{}, {"refine": False}])
def test_minimal_pixel_sets_are_the_same_with_the_gpus_boundary_speculation(monkeypatch, options):
    """The boundary search evaluates 3 levels of its probes per round on a GPU: run so on the CPU, the sets (and
    the responsibility queries) are those of one probe at a time, with at least as many extraction queries."""
    import overinterp_fast as of
    from overinterp_fast.methods import prefix
    from helpers import make_cnn, make_images

    model, x = make_cnn(3, h=12, w=14), make_images(2, h=12, w=14, seed=4)
    opts = of.MinimalPixelSetOptions(**{"iterations": 3, **options})

    def sets():
        tau = 0.6 if opts.criterion == "threshold" else None  # the top-1 criterion has no threshold
        return of.fast_sis(model, x, tau, method="responsibility", engine="torch", collection=True, options=opts,
                           show_progress=False)

    want = sets()
    monkeypatch.setattr(prefix, "SPECULATION", {"cpu": 3})
    got = sets()
    for a, b in zip(want, got):
        assert [c.sis.tolist() for c in a.collection] == [c.sis.tolist() for c in b.collection]
        assert a.queries == b.queries and a.extraction_queries <= b.extraction_queries
    if not options:  # the default refines with the boundary search: more probes evaluated
        assert sum(b.extraction_queries for b in got) > sum(a.extraction_queries for a in want)

"""Batch sizes, ChunkRunner's out-of-memory back-off (halving, the same items re-run, memory released in the
right order) and CandidateEvaluator, with expectations written out by hand.
"""
import weakref
import pytest
import torch
from overinterp_fast.runtime.batching import CandidateEvaluator, ChunkRunner, auto_batch_size, check_batch_size
from overinterp_fast.runtime.inputs import prepare
from overinterp_fast.runtime.model import ModelFn
from helpers import whole_message as _whole


def test_empty_cache_runs_after_the_failed_batch_is_released(monkeypatch):
    """Inside the except block the traceback still holds the failed batch; empty_cache must come after it."""
    failed, at_empty_cache = [], []

    def work(sl):
        batch = torch.arange(sl.start, sl.stop)
        if batch.numel() > 2:
            failed.append(weakref.ref(batch))
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return batch

    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: at_empty_cache.append([r() is None for r in failed]))
    runner = ChunkRunner(8, torch.device("cuda"))  # no GPU needed: work never touches one
    with pytest.warns(UserWarning) as caught:
        out = runner.run(7, work)
    assert [str(w.message) for w in caught] == ["out of memory at 7 candidates per forward call; retrying with 3",
                                                 "out of memory at 3 candidates per forward call; retrying with 1"]
    assert torch.equal(out, torch.arange(7)) and runner.chunk == 1
    assert at_empty_cache == [[True], [True, True]]  # after each failure, every failed batch already freed


def test_one_item_that_does_not_fit_raises():
    def work(sl):
        raise torch.OutOfMemoryError("out of memory")

    with pytest.warns(UserWarning), pytest.raises(torch.OutOfMemoryError, match="single candidate"):
        ChunkRunner(2, torch.device("cpu")).run(3, work)


# ---------------------------------------------------------------------------- by hand, for the mutation score
def test_auto_batch_size_on_the_cpu():
    # 2^17 elements per forward call, at least 16 and at most 4096 samples, at most the candidates
    assert auto_batch_size(torch.zeros(1, 3, 32, 32), 1000) == 42  # 131072 // 3072
    assert auto_batch_size(torch.zeros(5, 3, 32, 32), 41) == 41
    assert auto_batch_size(torch.zeros(1, 16), 10**6) == 4096  # 8192 capped
    assert auto_batch_size(torch.zeros(1, 32), 10**6) == 4096  # exactly 4096
    assert auto_batch_size(torch.zeros(1, 33), 10**6) == 3971  # 131072 // 33
    assert auto_batch_size(torch.zeros(1, 8192), 10**6) == 16  # exactly 16
    assert auto_batch_size(torch.zeros(1, 100, 100), 10**6) == 16  # 13 raised to 16
    assert auto_batch_size(torch.zeros(1, 100, 100), 3) == 3
    assert auto_batch_size(torch.zeros(1, 100, 100), 0) == 1  # never below one
    assert auto_batch_size(torch.zeros(2, 4, dtype=torch.float16), 10**6) == 4096


class _CudaImages:
    """Stands in for a CUDA batch [N, 3, 32, 32] of float32 (auto_batch_size reads only these)."""

    device = torch.device("cuda", 1)

    def __getitem__(self, i):
        return torch.empty(3, 32, 32)

    def element_size(self):
        return 4


def test_auto_batch_size_on_cuda_from_free_memory(monkeypatch):
    asked = []
    per_sample_bytes = 3 * 32 * 32 * 4 * 48  # elements x bytes x the activation factor
    free = {"bytes": 0}

    def mem_get_info(device):
        asked.append(device)
        return free["bytes"], 80 << 30

    monkeypatch.setattr(torch.cuda, "mem_get_info", mem_get_info)
    free["bytes"] = 2 * 1000 * per_sample_bytes  # half of the free memory holds 1000 samples
    assert auto_batch_size(_CudaImages(), 10**6) == 1000
    assert asked == [torch.device("cuda", 1)]
    assert auto_batch_size(_CudaImages(), 999) == 999
    free["bytes"] = 2 * 1000 * per_sample_bytes - 1  # 999.99...: rounded down
    assert auto_batch_size(_CudaImages(), 10**6) == 999
    free["bytes"] = 2 * 10 * per_sample_bytes  # at least 64
    assert auto_batch_size(_CudaImages(), 10**6) == 64
    assert auto_batch_size(_CudaImages(), 5) == 5
    free["bytes"] = 2 * 10**6 * per_sample_bytes  # at most 32768
    assert auto_batch_size(_CudaImages(), 10**7) == 32768


def test_check_batch_size():
    assert check_batch_size(None) is None
    assert check_batch_size(1) == 1 and check_batch_size(4096) == 4096
    for bad in (0, -3, True, False, 2.0, "8"):
        with pytest.raises(ValueError, match=_whole(f"batch_size must be a positive int or None, got {bad!r}")):
            check_batch_size(bad)


def test_chunk_runner_chunks_tuples_and_keeps_the_smaller_chunk(recwarn):
    calls = []

    def work(sl):
        calls.append((sl.start, sl.stop))
        if sl.stop - sl.start > 2:
            raise torch.OutOfMemoryError("planted")
        r = torch.arange(sl.start, sl.stop)
        return r, r * 10

    runner = ChunkRunner(5, torch.device("cpu"))
    a, b = runner.run(7, work)
    assert a.tolist() == list(range(7)) and b.tolist() == [10 * i for i in range(7)]
    assert calls == [(0, 5), (0, 2), (2, 4), (4, 6), (6, 7)] and runner.chunk == 2
    assert [str(w.message) for w in recwarn] == ["out of memory at 5 candidates per forward call; retrying with 2"]
    calls.clear()
    a, b = runner.run(3, work)  # the smaller chunk is kept for later calls
    assert calls == [(0, 2), (2, 3)] and a.tolist() == [0, 1, 2]
    one = torch.arange(4)
    assert ChunkRunner(4, torch.device("cpu")).run(4, lambda sl: one) is one  # one part: returned as is
    pair = (one, one)
    assert ChunkRunner(9, torch.device("cpu")).run(4, lambda sl: pair) is pair
    done = []  # work for its effects (e.g. incremental inference's base runs): None over several chunks
    assert ChunkRunner(2, torch.device("cpu")).run(5, lambda sl: done.append((sl.start, sl.stop))) is None
    assert done == [(0, 2), (2, 4), (4, 5)]


def test_chunk_runner_single_item_message_and_no_empty_cache_on_the_cpu(monkeypatch):
    emptied = []
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: emptied.append(1))
    original = torch.OutOfMemoryError("planted 1 GiB")

    def work(sl):
        raise original

    with pytest.warns(UserWarning, match=_whole("out of memory at 2 candidates per forward call; retrying with 1")):
        with pytest.raises(torch.OutOfMemoryError, match=_whole(
            "out of memory evaluating a single candidate; the model does not fit beside the images on cpu: "
            "planted 1 GiB")) as err:
            ChunkRunner(2, torch.device("cpu")).run(3, work)
    assert err.value.__cause__ is original
    assert emptied == []


def test_candidate_evaluator_builds_the_candidates_by_hand():
    # two images [1, 2, 2], four pixel features, baseline -1
    images = torch.tensor([[[[1.0, 2.0], [3.0, 4.0]]], [[[10.0, 20.0], [30.0, 40.0]]]], dtype=torch.float64)
    prep = prepare(images, mask_value=-1.0)
    present = torch.tensor([[True, True, True, True], [True, False, True, False]])
    seen = []

    def measure(x, targets):
        seen.append((x.clone(), targets.clone()))
        return x.flatten(1).sum(1)

    targets = torch.tensor([7, 8])
    runner = ChunkRunner(2, torch.device("cpu"))
    ev = CandidateEvaluator(ModelFn(lambda t: t.flatten(1)), prep, targets, runner, measure=measure)
    image = torch.tensor([1, 0, 1])
    row = torch.tensor([0, 1, 1])
    feature = torch.tensor([2, -1, 0])
    out = ev(present, image, row, feature)
    # image 1, all present, feature 2 masked: 10 + 20 - 1 + 40; image 0, features 0 and 2 present: 1 - 1 + 3 - 1;
    # image 1, features 0 and 2 present, 0 masked: -1 - 1 + 30 - 1
    assert out.tolist() == [69.0, 2.0, 27.0]
    assert [t.tolist() for _, t in seen] == [[8, 7], [8]]  # each candidate's own image's target, two per call
    assert seen[0][0][1].tolist() == [[[1.0, -1.0], [3.0, -1.0]]]

    # the default measure is f: here the model's output read as probabilities
    def probs(t):
        s = t.flatten(1).sum(1) / 100
        return torch.stack([s, 1 - s], 1)

    fn = ModelFn(probs, outputs="probabilities")
    ev = CandidateEvaluator(fn, prep, torch.tensor([0, 1]), runner)
    assert ev.fn is fn and ev.prep is prep and ev.runner is runner and ev.targets.tolist() == [0, 1]
    f = ev(present, image, row, feature)
    assert f.dtype == torch.float64 and f.tolist() == pytest.approx([1 - 0.69, 0.02, 1 - 0.27], abs=1e-12)


@pytest.mark.parametrize("bad, message", [
    ({"image": [0, 2, 1]}, r"mask_apply: cand_image 2 out of range \[0, 2\)"),
    ({"row": [0, 1, -1]}, r"mask_apply: cand_row -1 out of range \[0, 2\)"),
    ({"feature": [4, -1, 0]}, r"mask_apply: cand_feature 4 out of range \[-1, 4\)"),
])
def test_candidate_evaluator_checks_indices_once_per_call_before_any_chunk(monkeypatch, bad, message):
    """3 candidates in chunks of 1: one index check for the whole call (a device wait on CUDA), each chunk's
    mask_apply with its own check off, and a bad index raises the op's error before the first chunk is scored;
    check_indices=False (per call or on the evaluator) skips it, and check_candidates gives the same error on
    host lists."""
    from overinterp_fast.ops import kernels
    from overinterp_fast.runtime import batching

    images = torch.arange(8, dtype=torch.float64).view(2, 1, 2, 2)
    prep = prepare(images, mask_value=-1.0)
    present = torch.ones(2, 4, dtype=torch.bool)
    checks, op_checks, scored = [], [], []
    real_check, real_op = batching.check_candidates, kernels.mask_apply
    monkeypatch.setattr(batching, "check_candidates", lambda *a, **k: (checks.append(1), real_check(*a, **k)))
    monkeypatch.setattr(kernels, "mask_apply", lambda *a: (op_checks.append(a[7]), real_op(*a))[1])

    def measure(x, targets):
        scored.append(x.shape[0])
        return x.flatten(1).sum(1)

    runner = ChunkRunner(1, torch.device("cpu"))
    ev = CandidateEvaluator(ModelFn(lambda t: t.flatten(1)), prep, torch.tensor([0, 0]), runner, measure=measure)
    good = {"image": [0, 1, 1], "row": [0, 1, 0], "feature": [-1, 3, 0]}
    args = [torch.tensor(v) for v in good.values()]
    out = ev(present, *args)
    assert out.tolist() == [0 + 1 + 2 + 3, 4 + 5 + 6 - 1, -1 + 5 + 6 + 7]
    assert checks == [1] and op_checks == [False] * 3 and scored == [1, 1, 1]
    case = {**good, **bad}
    with pytest.raises(RuntimeError, match=message):
        ev(present, *[torch.tensor(v) for v in case.values()])
    assert checks == [1, 1] and scored == [1, 1, 1]  # nothing of the bad call was scored
    with pytest.raises(RuntimeError, match=message):
        batching.check_candidates(prep, case["image"], case["row"], case["feature"], rows=2)
    checks.clear()
    assert ev(present, *args, check_indices=False).tolist() == out.tolist() and checks == []
    unchecked = CandidateEvaluator(ev.fn, prep, ev.targets, ev.runner, measure=measure, check_indices=False)
    assert unchecked.measuring(measure).check_indices is False
    assert unchecked(present, *args).tolist() == out.tolist() and checks == []
    assert unchecked(present, *args, check_indices=True).tolist() == out.tolist() and checks == [1]


# ------------------------------------------------------------------ fixed batch shapes


def test_bucket_sizes_by_hand():
    from overinterp_fast.runtime.batching import bucket_sizes

    # 300: granule ceil(300 / 8) = 38; its multiples below 300, then 300 itself
    assert bucket_sizes(300) == (38, 76, 114, 152, 190, 228, 266, 300)
    assert bucket_sizes(64) == (8, 16, 24, 32, 40, 48, 56, 64)
    assert bucket_sizes(17) == (3, 6, 9, 12, 15, 17)
    assert bucket_sizes(8) == tuple(range(1, 9))
    assert bucket_sizes(1) == (1,)
    assert bucket_sizes(3) == (1, 2, 3)


@pytest.mark.parametrize("chunk", [1, 2, 7, 16, 17, 64, 100, 288, 303, 1000, 4096, 32768])
def test_buckets_are_at_most_eight_and_waste_less_than_a_granule(chunk):
    """At most 8 shapes whatever the chunk; every row count of at least the granule g = ceil(chunk / 8) is padded by
    less than g rows, and a smaller one by less than itself (to a power of two)."""
    from overinterp_fast.runtime.batching import bucket, bucket_sizes

    g = -(-chunk // 8)
    assert len(bucket_sizes(chunk)) <= 8
    for rows in range(1, chunk + 1):
        padded = bucket(rows, chunk)
        assert rows <= padded < (rows + g if rows >= g else 2 * rows)


@pytest.mark.parametrize("rows,chunk,want", [(288, 303, 303), (286, 303, 303), (152, 303, 152), (153, 303, 190),
                                             (76, 303, 76), (77, 303, 114), (38, 303, 38), (39, 303, 76),
                                             (20, 303, 32), (11, 303, 16), (6, 303, 8), (1, 303, 1), (2, 303, 2),
                                             (4, 303, 4), (303, 303, 303), (400, 303, 400), (33, 64, 40),
                                             (32, 64, 32), (5, 64, 8)])
def test_bucket_pads_to_the_smallest_size_that_holds_the_rows(rows, chunk, want):
    from overinterp_fast.runtime.batching import bucket

    assert bucket(rows, chunk) == want
    assert ChunkRunner(chunk, torch.device("cpu")).bucket(rows) == want


def test_largest_bucket_under_a_size():
    from overinterp_fast.runtime.batching import largest_bucket

    assert largest_bucket(303, 303) == 303 and largest_bucket(300, 303) == 266
    assert largest_bucket(37, 303) == 38  # below the smallest: the smallest
    assert largest_bucket(1000, 303) == 303


class RowsSeen(torch.nn.Module):
    """Logits [B, 3] that depend on each row alone; records the batch sizes it is called with."""

    def __init__(self):
        super().__init__()
        self.rows = []

    def forward(self, x):
        self.rows.append(x.shape[0])
        s = x.flatten(1).sum(1)
        return torch.stack([s, 2 * s, -s], 1)


@pytest.mark.parametrize("channels_last", [False, True])
def test_forward_pads_to_the_bucket_and_drops_the_padding(channels_last):
    model = RowsSeen()
    fn = ModelFn(model)
    x = torch.arange(5 * 2 * 2 * 3, dtype=torch.float64).view(5, 2, 2, 3)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    want = torch.stack([x.flatten(1).sum(1), 2 * x.flatten(1).sum(1), -x.flatten(1).sum(1)], 1)
    runner = ChunkRunner(64, torch.device("cpu"))  # shapes 8, 16, ..., 64: 5 rows run as 8
    fn.pad_to = runner.bucket
    seen = []
    model.forward = lambda t, f=model.forward: seen.append(t.is_contiguous(memory_format=torch.channels_last)) or f(t)
    out = fn.forward(x)
    assert model.rows == [8] and out.shape == (5, 3) and torch.equal(out, want)
    assert seen == [channels_last]
    fn.pad_to = None
    fn.forward(x)
    assert model.rows == [8, 5]


def test_fast_sis_calls_the_model_in_a_few_fixed_shapes_and_equals_the_reference():
    """Exact SIS of 2 images of 25 pixels at batch_size 20: without padding the model would see the step sizes
    (50, 48, 46, ... split at 20: 10, 8, 6, ...); padded, every call is one of the bucket sizes of 20. The answer
    is still the reference's."""
    import overinterp_fast as of
    from overinterp_fast.methods import reference
    from overinterp_fast.runtime.batching import bucket_sizes
    from helpers import assert_same_lists, assert_same_result, make_cnn, make_images

    model = make_cnn(0)
    rows = []
    model.register_forward_pre_hook(lambda m, a: rows.append(a[0].shape[0]))
    images = make_images(2, seed=3)
    fast = of.fast_sis(model, images, 0.2, batch_size=20, engine="torch",
                       options=of.ExactOptions(incremental=False))
    assert rows[0] == 2 and set(rows[1:]) <= set(bucket_sizes(20)) and len(rows) > 20
    assert_same_lists(fast, reference.sis(model.eval(), images, 0.2), assert_same_result, False)


def test_ladder_sizes_by_hand():
    from overinterp_fast.runtime.batching import ladder, ladder_sizes, power_of_two_floor

    assert ladder_sizes(16) == (1, 2, 4, 8, 16) and ladder_sizes(1) == (1,)
    assert ladder_sizes(2048) == (16, 32, 64, 128, 256, 512, 1024, 2048)  # 8 shapes at most
    assert [ladder(r, 16) for r in (1, 2, 3, 5, 8, 9, 16, 17)] == [1, 2, 4, 8, 8, 16, 16, 17]
    assert [ladder(r, 2048) for r in (1, 16, 17, 100, 1024, 1025, 2048, 3000)] == [16, 16, 32, 128, 1024, 2048,
                                                                                     2048, 3000]
    assert [power_of_two_floor(n) for n in (1, 2, 3, 16, 17, 300, 4096)] == [1, 2, 2, 16, 16, 256, 4096]


def test_each_method_gets_its_shape_policy():
    from overinterp_fast.runtime import job
    from overinterp_fast.runtime.batching import ladder_sizes
    from helpers import make_images, tiny_cnn

    model = tiny_cnn(3)
    images = make_images(3, h=16, w=16, dtype=torch.float32)
    exact = job.setup(model, images, 0.5, None, 0.0, "logits", None, "exact")
    assert exact.top is None and exact.fn.pad_to == exact.runner.bucket
    first = job.setup(model, images, 0.5, None, 0.0, "logits", None, "responsibility")
    top = first.top  # the element budget (2^17 elements) of 3 x 16 x 16 images, rounded down to a power of two
    assert top == 128 and first.runner.chunk <= top
    assert {first.fn.pad_to(r) for r in range(1, top + 1)} == set(ladder_sizes(top))
    more = job.setup(model, make_images(7, h=16, w=16, dtype=torch.float32), 0.5, None, 0.0, "logits", None,
                     "responsibility")
    assert more.top == top  # kept for the model's later jobs
    assert job.setup(model, images, 0.5, None, 0.0, "logits", 300, "responsibility").top == 256  # the user's size

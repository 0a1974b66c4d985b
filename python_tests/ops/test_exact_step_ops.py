"""The exact SIS step's ops: exact_candidates, exact_scores and schedule_window, kernel and pure version, each
against independent references (mask_apply_ref and backselect_update_ref of test_ops.py, a slot-by-slot FIFO for
the schedule), hand-built cases, their errors and torch.library.opcheck."""
import numpy as np
import pytest
import torch

from overinterp_fast.ops import kernels as _ops
from overinterp_fast.ops.pure import PURE_OPS
from helpers import backselect_update_ref, cuda, mask_apply_ref


IMPLS = {"kernel": lambda name: _ops.kernel(name), "torch": lambda name: PURE_OPS[name].fn}


@pytest.fixture(params=sorted(IMPLS))
def impl(request):
    return lambda name: IMPLS[request.param](name)


def cases(name, seeds=range(6), device="cpu"):
    return [c for s in seeds for c in PURE_OPS[name].sample(torch.device(device), torch.Generator().manual_seed(s))]


def clone(case):
    return [a.clone() if isinstance(a, torch.Tensor) else a for a in case]


# ------------------------------------------------------------------ exact_candidates


def test_exact_candidates_are_mask_apply_of_the_slots_features(impl):
    f = impl("exact_candidates")
    for base, baseline, fm, present, remaining, sched, out, *memo in cases("exact_candidates"):
        image, slot = sched[0], sched[1]
        feature = torch.tensor([remaining.view(-1)[s].item() if s >= 0 else -1 for s in slot.tolist()])
        want = mask_apply_ref(base, baseline, fm, present, image, image, feature)
        got = out.clone()
        f(base, baseline, fm, present, remaining, sched, got, *memo)
        assert torch.equal(got, want.contiguous(memory_format=torch.preserve_format)) and got.stride() == out.stride()
        assert bool((slot < 0).any()) and bool((feature >= 0).any())  # padding rows and masked features


def test_exact_candidates_by_hand(impl):
    """Two 1x1x3 images, features = pixels; image 1 has features 0 and 2 present (remaining [2, 0, -1, -1])."""
    base = torch.tensor([[[[1.0, 2.0, 3.0]]], [[[4.0, 5.0, 6.0]]]])
    baseline = torch.zeros(1, 1, 1, 3)
    fm = torch.tensor([[[0, 1, 2]]])
    present = torch.tensor([[True, True, True], [True, False, True]])
    remaining = torch.tensor([[0, 1, 2, -1], [2, 0, -1, -1]])
    sched = torch.tensor([[1, 1, 0, 1], [4, 5, 3, -1]])  # image 1 without feature 2, without 0; image 0 intact; pad
    out = torch.empty(4, 1, 1, 3)
    impl("exact_candidates")(base, baseline, fm, present, remaining, sched, out)
    assert out.view(4, 3).tolist() == [[4, 0, 0], [0, 0, 6], [1, 2, 3], [4, 0, 6]]


def test_exact_candidates_rejects_bad_arguments(impl):
    f = impl("exact_candidates")
    base, baseline, fm, present, remaining, sched, out = cases("exact_candidates", [0])[0][:7]
    bad = sched.clone()
    bad[0, 2] = base.shape[0]
    with pytest.raises(RuntimeError, match=rf"exact_candidates: image {base.shape[0]} out of range"):
        f(base, baseline, fm, present, remaining, bad, out)
    bad = sched.clone()
    bad[1, 0] = remaining.numel()
    with pytest.raises(RuntimeError, match=r"exact_candidates: slot \d+ out of range"):
        f(base, baseline, fm, present, remaining, bad, out)
    with pytest.raises(RuntimeError, match="out must be"):
        f(base, baseline, fm, present, remaining, sched, out[:-1])
    with pytest.raises(RuntimeError, match="sched must be an int64"):
        f(base, baseline, fm, present, remaining, sched[:1], out)


# ------------------------------------------------------------------ exact_candidates: the row memo


def row_memo_ref(image, feature, present, held, snap, version):
    """The memo's update, image by image and row by row: independent of both implementations."""
    for i in dict.fromkeys(image.tolist()):
        if not torch.equal(snap[i], present[i]):
            version[i] += 1
            snap[i] = present[i]
    for b, (i, f) in enumerate(zip(image.tolist(), feature.tolist())):
        held[:, b] = torch.tensor([i, f, int(version[i])])


class StepWorld:
    """Images and their present features, changed as a step loop changes them: a step removes one feature (the
    last slot moves into its place), a new round brings features back, and batches hold one image's step (rows
    that line up with the previous batch), several images, or shuffled rows."""

    def __init__(self, g, dtype, channels_last, per_image, n=3, c=2, h=5, w=6, p=11):
        self.g, self.n, self.p = g, n, p
        self.base = torch.randn(n, c, h, w, generator=g).to(dtype)
        self.baseline = torch.randn(n if per_image else 1, c, h, w, generator=g).to(dtype)
        if channels_last:
            self.base = self.base.contiguous(memory_format=torch.channels_last)
        self.fm = torch.randint(0, p, (c, h, w), generator=g)
        self.remaining = torch.full((n, p + 1), -1, dtype=torch.int64)
        self.present = torch.zeros(n, p, dtype=torch.bool)
        for i in range(n):
            self.new_round(i)

    def rand(self, k):
        return int(torch.randint(0, k, (1,), generator=self.g))

    def new_round(self, i):
        ids = torch.randperm(self.p, generator=self.g)[: 2 + self.rand(self.p - 1)]
        self.present[i] = False
        self.present[i, ids] = True
        self.remaining[i] = -1
        self.remaining[i, : ids.numel()] = ids

    def count(self, i):
        return int((self.remaining[i] >= 0).sum())

    def step(self, i):
        r = self.count(i)
        if r <= 1:
            return self.new_round(i)
        j = self.rand(r)
        self.present[i, self.remaining[i, j]] = False
        self.remaining[i, j] = self.remaining[i, r - 1]
        self.remaining[i, r - 1] = -1

    def batch(self, rows):
        """sched [2, rows]: the candidates of one image's step, of several images, or shuffled, padded."""
        kind = self.rand(4)
        pick = [self.rand(self.n)] if kind < 2 else list(range(self.n))
        image = [i for i in pick for _ in range(self.count(i))]
        slot = [i * (self.p + 1) + j for i in pick for j in range(self.count(i))]
        image, slot = image[:rows], slot[:rows]
        pad = rows - len(image)
        image += [pick[0]] * pad
        slot += [-1] * pad
        sched = torch.tensor([image, slot])
        if kind == 3:
            sched = sched[:, torch.randperm(rows, generator=self.g)]
        return sched.contiguous()


@pytest.mark.parametrize("dtype, channels_last, per_image", [(torch.float32, False, False),
                                                             (torch.float64, True, True),
                                                             (torch.bfloat16, False, True)])
def test_the_row_memo_gives_every_batch_as_written_whole(impl, dtype, channels_last, per_image):
    """A kept buffer and its memo through 120 batches of a changing step loop (steps, new rounds, lined-up and
    mixed batches, two batch shapes): every batch equals the element-by-element reference, and the memo follows
    its definition."""
    g = torch.Generator().manual_seed(5)
    world = StepWorld(g, dtype, channels_last, per_image)
    f = impl("exact_candidates")
    snap = torch.zeros(world.n, world.p, dtype=torch.bool)
    version = torch.zeros(world.n, dtype=torch.int64)
    want_snap, want_version = snap.clone(), version.clone()
    kept = {}
    for call in range(120):
        rows = 12 if call % 17 else 30
        if rows not in kept:
            fmt = torch.channels_last if channels_last else torch.contiguous_format
            out = torch.empty(rows, *world.base.shape[1:], dtype=dtype).contiguous(memory_format=fmt)
            kept[rows] = (out, torch.full((3, rows), -1, dtype=torch.int64), torch.full((3, rows), -1))
        out, held, want_held = kept[rows]
        sched = world.batch(rows)
        f(world.base, world.baseline, world.fm, world.present, world.remaining, sched, out, False, held, snap, version)
        flat = world.remaining.view(-1)
        feature = torch.tensor([int(flat[s]) if s >= 0 else -1 for s in sched[1].tolist()])
        want = mask_apply_ref(world.base, world.baseline, world.fm, world.present, sched[0], sched[0], feature)
        assert torch.equal(out, want), f"batch {call}"
        row_memo_ref(sched[0], feature, world.present, want_held, want_snap, want_version)
        assert torch.equal(held, want_held) and torch.equal(snap, want_snap) and torch.equal(version, want_version)
        for _ in range(world.rand(3)):  # zero to two steps before the next batch
            world.step(world.rand(world.n))


def test_rows_that_hold_their_candidate_are_patched_not_rewritten():
    """The CPU kernel writes only what changed: an element it has no reason to touch keeps whatever is there (so
    nothing else may write into the buffer while the memo is in use); a memo reset to -1, or a row whose memo
    names no feature of the image, is written whole."""
    g = torch.Generator().manual_seed(2)
    world = StepWorld(g, torch.float32, False, False, n=1, p=6)
    f = _ops.kernel("exact_candidates")
    rows = world.count(0)
    sched = torch.stack([torch.zeros(rows, dtype=torch.int64), torch.arange(rows)])
    out = torch.empty(rows, *world.base.shape[1:])
    held, snap, version = torch.full((3, rows), -1), torch.zeros(1, 6, dtype=torch.bool), torch.zeros(1).long()
    args = (world.base, world.baseline, world.fm, world.present, world.remaining, sched, out, False)
    f(*args, held, snap, version)
    want = out.clone()
    removed = (world.fm.unsqueeze(0) == world.remaining[0, :rows].view(rows, 1, 1, 1))  # each row's own feature
    out.fill_(float("nan"))  # the same batch again: nothing changed, only each row's removed feature is written
    f(*args, held, snap, version)
    assert torch.equal(out.isnan(), ~removed) and torch.equal(out[removed], want[removed])
    held[1, 0] = 99  # no such feature: row 0 is written whole
    f(*args, held, snap, version)
    assert torch.equal(out[0], want[0]) and out[1:].isnan().any()
    held[0] = -1
    f(*args, held, snap, version)
    assert torch.equal(out, want)


def test_the_row_memo_rejects_bad_arguments(impl):
    f = impl("exact_candidates")
    base, baseline, fm, present, remaining, sched, out, _, held, snap, version = cases("exact_candidates", [0])[2]
    args = (base, baseline, fm, present, remaining, sched, out, False)
    with pytest.raises(RuntimeError, match="exact_candidates: held, snap and version go together"):
        f(*args, held, None, version)
    with pytest.raises(RuntimeError, match=r"exact_candidates: held must be a contiguous int64 \[3, 11\]"):
        f(*args, held[:, :-1], snap, version)
    with pytest.raises(RuntimeError, match=r"exact_candidates: snap must be a contiguous bool \[3, 7\]"):
        f(*args, held, snap[:, :-1], version)
    with pytest.raises(RuntimeError, match=r"exact_candidates: version must be a contiguous int64 \[3\]"):
        f(*args, held, snap, version.int())


# ------------------------------------------------------------------ exact_scores


def exact_scores_ref(probs, targets, sched, done, scores, total, remaining, present, order, values):
    """Row by row: independent of both implementations."""
    for b, (i, s) in enumerate(zip(sched[0].tolist(), sched[1].tolist())):
        if s >= 0:
            f = float(probs[b, targets[i]].double())
            scores.view(-1)[s] = f
            total += f * 0
    keep = done[0] >= 0
    backselect_update_ref(scores, done[0][keep], done[1][keep], done[2][keep], remaining, present, order, values)


def test_exact_scores_matches_the_row_by_row_reference(impl):
    f = impl("exact_scores")
    seen = {}
    for case in cases("exact_scores"):
        got, want = clone(case), clone(case)
        f(*got)
        exact_scores_ref(*want)
        for a, b in zip(got, want):
            assert torch.equal(a, b)
        sched, done = case[2], case[3]
        for key, hit in (("padding rows", (sched[1] < 0).any()), ("no real row", (sched[1] < 0).all()),
                         ("real rows", (sched[1] >= 0).any()), ("padding entries", (done[0] < 0).any()),
                         ("no step", (done[0] < 0).all()), ("steps", (done[0] >= 0).any())):
            seen[key] = seen.get(key, False) or bool(hit)
    assert all(seen.values()), seen  # the cases hold every kind of row and entry


def test_exact_scores_by_hand(impl):
    """One image of 3 features, all present: the three candidates' probabilities of the target (class 1) are
    written to slots 0-2, the step picks the best (slot 1: feature 1); a padding row and entry change nothing."""
    probs = torch.tensor([[0.5, 0.25], [0.25, 0.75], [0.5, 0.5], [0.0, 1.0]], dtype=torch.float32)
    sched = torch.tensor([[0, 0, 0, 0], [0, 1, 2, -1]])
    done = torch.tensor([[0, -1], [3, 1], [0, 0]])
    scores = torch.zeros(1, 4, dtype=torch.float64)
    total = torch.zeros((), dtype=torch.float64)
    remaining = torch.tensor([[0, 1, 2, -1]])
    present = torch.ones(1, 3, dtype=torch.bool)
    order = torch.full((1, 3), -1)
    values = torch.zeros(1, 3, dtype=torch.float64)
    impl("exact_scores")(probs, torch.tensor([1]), sched, done, scores, total, remaining, present, order, values)
    assert scores.tolist() == [[0.25, 0.75, 0.5, 0.0]] and total.item() == 0.0
    assert order.tolist() == [[1, -1, -1]] and values.tolist() == [[0.75, 0, 0]]
    assert present.tolist() == [[True, False, True]] and remaining.tolist() == [[0, 2, -1, -1]]


def test_exact_scores_total_turns_nan_on_a_non_finite_score(impl):
    f = impl("exact_scores")
    case = cases("exact_scores", [0])[0]
    probs = case[0].clone()
    real = int((case[2][1] >= 0).nonzero()[0])
    for bad in (float("inf"), float("nan")):
        args = clone(case)
        args[0] = probs.clone()
        args[0][real, case[1][case[2][0, real]]] = bad
        f(*args)
        assert args[5].isnan()
    pad = int((case[2][1] < 0).nonzero()[0])  # a padding row's score is dropped, whatever it is
    args = clone(case)
    args[0] = probs.clone()
    args[0][pad] = float("nan")
    f(*args)
    assert args[5].item() == 0.0


def test_exact_scores_rejects_bad_arguments(impl):
    f = impl("exact_scores")
    for k, row, col, value, message in ((2, 0, 0, 5, r"image 5 out of range \[0, 5\)"),
                                        (3, 0, 0, 5, r"row 5 out of range \[-1, 5\)"),
                                        (3, 1, 0, 0, r"count 0 out of range \[1, 10\)"),
                                        (3, 2, 0, 9, r"step 9 out of range \[0, 9\)"),
                                        (1, 0, None, 4, r"target 4 out of range \[0, 4\)")):
        args = clone(cases("exact_scores", [0])[0])
        if col is None:
            args[k][row] = value
        else:
            args[k][row, col] = value
        with pytest.raises(RuntimeError, match="exact_scores: " + message):
            f(*args)
    args = clone(cases("exact_scores", [0])[0])
    args[0] = args[0][:-1]
    with pytest.raises(RuntimeError, match="probs must be a floating"):
        f(*args)


# ------------------------------------------------------------------ schedule_window


def schedule_ref(segments, count, step, full, sizes, batch_size, stride, rescore, stop_at_round_end, max_batches):
    """A plain FIFO of (image, slot, tag, last?) slot entries, one batch of batch_size entries at a time."""
    count, step = count.clone(), step.clone()
    fifo = [(i, j, t, j == b - 1) for i, a, b, t in segments.t().tolist() for j in range(a, b)]
    blocks, done = [], []
    for w in range(max_batches):
        if not fifo:
            break
        batch, fifo = fifo[:batch_size], fifo[batch_size:]
        steps, going, stop = [], [[], []], False
        for i, _, t, last in batch:
            if not last:
                continue
            done.append((w, i, t, int(count[i]), int(step[i])))
            if t == 1:
                stop = True
                continue
            steps.append((i, int(count[i]), int(step[i])))
            count[i] -= 1
            step[i] += 1
            if count[i] > 0:
                going[0 if t == 0 else 1].append(i)
            else:
                stop |= stop_at_round_end
        for i in going[0] + going[1]:
            t = 2 if rescore > 0 and not bool(full[i]) and int(count[i]) > rescore else 0
            fifo += [(i, j, t, j == int(count[i]) - 1) for j in range(int(count[i]))]
        n = len(batch)
        bp = min([s for s in sizes.tolist() if s >= n], default=n)
        blocks.append(([i for i, *_ in batch] + [batch[-1][0]] * (bp - n),
                       [i * stride + j for i, j, *_ in batch] + [-1] * (bp - n),
                       [s[0] for s in steps] + [-1] * (bp - len(steps)),
                       [s[1] for s in steps] + [1] * (bp - len(steps)),
                       [s[2] for s in steps] + [0] * (bp - len(steps)),
                       [t for _, _, t, _ in batch] + [-1] * (bp - n)))
        if stop:
            break
    return blocks, done, count, step, fifo


def check_window(f, case):
    want_blocks, want_done, want_count, want_step, want_fifo = schedule_ref(*case)
    args = clone(case)
    records, batches, done, left = f(*args)
    assert torch.equal(args[1], want_count) and torch.equal(args[2], want_step)
    assert done.tolist() == [list(d) for d in want_done]
    got_blocks = [records[o: o + 6 * bp].view(6, bp).tolist() for o, bp, *_ in batches.tolist()]
    assert got_blocks == [[list(r) for r in b] for b in want_blocks]
    assert [b[2] for b in batches.tolist()] == [sum(s >= 0 for s in b[1]) for b in want_blocks]
    first = [b[3] for b in batches.tolist()]
    assert first == sorted(first) and sum(b[4] for b in batches.tolist()) == len(want_done)
    rest = [(i, j) for i, a, b, _ in left.t().tolist() for j in range(a, b)]
    assert rest == [(i, j) for i, j, *_ in want_fifo]
    return len(batches)


def test_schedule_window_matches_a_slot_by_slot_fifo(impl):
    f = impl("schedule_window")
    lengths = set()
    for case in cases("schedule_window", range(10)):
        lengths.add(check_window(f, case))
    assert len(lengths) > 2  # windows end early (events, an empty queue) and run to max_batches


@pytest.mark.parametrize("seed", range(8))
def test_schedule_window_many_windows_run_a_whole_job(impl, seed):
    """Windows taken one after another until the queue is empty (as the loop takes them): every image goes
    through all its steps, one batch after another, the same as the slot-by-slot FIFO."""
    g = torch.Generator().manual_seed(seed)
    n, p = 5, 9
    count = torch.randint(1, p + 1, (n,), generator=g)
    step = torch.zeros(n, dtype=torch.int64)
    segments = torch.stack([torch.arange(n), torch.zeros(n, dtype=torch.int64), count.clone(), torch.zeros(n, dtype=torch.int64)])
    total = int((count * (count + 1) // 2).sum())
    f = impl("schedule_window")
    seen = 0
    while segments.shape[1]:
        case = [segments, count, step, torch.zeros(n, dtype=torch.bool), torch.tensor([2, 4, 8]), 7, p + 1, 0,
                bool(seed % 2), 3]
        want = schedule_ref(*clone(case))
        records, batches, done, segments = f(*case)
        assert torch.equal(count, want[2]) and torch.equal(step, want[3])
        seen += int(batches[:, 2].sum())
    assert seen == total and int(count.sum()) == 0


def test_schedule_window_rejects_bad_segments(impl):
    f = impl("schedule_window")
    case = clone(cases("schedule_window", [0])[0])
    for row, value, message in ((0, 6, r"segment image 6 out of range \[0, 6\)"),
                                (2, 9, r"segment slots \[\d+, 9\) out of range \[0, 8\)"),
                                (3, 5, "segment tag 5 unknown")):
        bad = clone(case)
        bad[0][row, 0] = value
        with pytest.raises(RuntimeError, match="schedule_window: " + message):
            f(*bad)
    bad = clone(case)
    bad[4] = bad[4].double()
    with pytest.raises(RuntimeError, match="sizes must be int64"):
        f(*bad)


# ------------------------------------------------------------------ opcheck, CUDA


def test_opcheck_exact_step_ops():
    for name in ("exact_candidates", "exact_scores"):
        for case in cases(name, [0]):
            torch.library.opcheck(getattr(torch.ops.overinterp_fast, name).default, case)
    # data-dependent output sizes: the schema, fake and autograd registration checks
    torch.library.opcheck(torch.ops.overinterp_fast.schedule_window.default, cases("schedule_window", [0])[0],
                          test_utils=("test_schema", "test_autograd_registration", "test_faketensor"))


@cuda
def test_exact_step_kernels_equal_pure_versions_cuda():
    for name in ("exact_candidates", "exact_scores"):
        for case in cases(name, range(4), "cuda"):
            got, want = clone(case), [a.cpu() if isinstance(a, torch.Tensor) else a for a in case]
            _ops.kernel(name)(*got)
            PURE_OPS[name].fn(*want)
            for a, b in zip(got, want):
                assert torch.equal(a.cpu(), b)


def test_the_schedule_is_the_hosts_op_alone(monkeypatch):
    """schedule_window works on the host's tensors whatever device a job runs on: ops_info gives it a CPU row only
    (on a device the extension has no kernel for, every other op falls back and is listed)."""
    monkeypatch.setattr(_ops, "_choices", {})
    with pytest.warns(RuntimeWarning):
        rows = _ops.ops_info(["meta"])
    assert {r.op for r in rows} == set(PURE_OPS) - {"schedule_window"}
    assert {r.op for r in _ops.ops_info(["cpu"])} == set(PURE_OPS)
    assert PURE_OPS["schedule_window"].host_only and not PURE_OPS["exact_scores"].host_only

"""exact_sis called directly on planted dyadic models: every order, value, set, score and round
(and the progress bar's totals) written out by hand.

The model outputs probabilities that are sums of dyadic weights of {0, 1} inputs, so every f is
exact in float64 and every tie is exact (the lowest feature id is masked first).
"""
import contextlib

import pytest
import torch
from torch import nn

from overinterp_fast import exact
from overinterp_fast.batching import CandidateEvaluator, ChunkRunner
from overinterp_fast.inputs import prepare
from overinterp_fast.model import ModelFn

W = [0.25, 0.125, 0.25, 0.125, 0.125, 0.125]  # six features (a 2 x 3 image), summing to 1


class Dyadic(nn.Module):
    """Class 0 gets bias + sum_j w_j x_j, class 1 the rest (already probabilities)."""

    def __init__(self, weights, bias=0.0, nan_at=None):
        super().__init__()
        self.register_buffer("w", torch.as_tensor(weights, dtype=torch.float64).flatten())
        self.bias = bias
        self.nan_at = nan_at

    def forward(self, x):
        s = self.bias + (x.flatten(1) * self.w).sum(1)
        if self.nan_at is not None:
            s = torch.where(s == self.nan_at, torch.full_like(s, float("nan")), s)
        return torch.stack([s, 1 - s], 1)


class Bar:
    """Records what exact_sis tells its progress bar."""

    made = []

    def __init__(self, total, **kw):
        self.total, self.kw, self.n, self.first_total, self.closed = total, kw, 0, total, False
        Bar.made.append(self)

    def update(self, k):
        self.n += k

    def close(self):
        self.closed = True


def run(model, x, thresholds, collection, batch_size, monkeypatch, progress=None, stand_in=None, chunk=1000,
        default_device=None):
    Bar.made = []
    monkeypatch.setattr(exact, "tqdm", Bar)
    user = ModelFn(model, outputs="probabilities")
    fn = ModelFn(stand_in, outputs="probabilities") if stand_in is not None else user
    prep = prepare(x)
    with torch.no_grad():
        f0 = user.forward(x)
    targets = f0.argmax(1)
    scores0 = f0.gather(1, targets[:, None]).flatten().double()
    runner = ChunkRunner(chunk, x.device)
    verifier = None
    if stand_in is not None:
        verifier = CandidateEvaluator(user, prep, targets, runner, measure=user.score_and_top1)
    # default_device: torch's default device while exact_sis runs (only exact_sis: the setup above is the caller's)
    with contextlib.nullcontext() if default_device is None else torch.device(default_device):
        res = exact.exact_sis(fn, prep, targets, scores0, thresholds, collection, batch_size, runner, progress,
                              verifier=verifier, engine="planted")
    return res, Bar.made[0]


def images(*rows):
    return torch.tensor(rows, dtype=torch.float64).view(len(rows), 1, 2, 3)


FULL = (1, 1, 1, 1, 1, 1)
HALF = (1, 1, 1, 1, 0, 0)  # f = 0.75


@pytest.mark.timeout(30)
@pytest.mark.parametrize("batch_size,chunk", [(1, 1000), (4, 3), (1000, 1000)])
def test_collections_of_three_images_by_hand(monkeypatch, batch_size, chunk):
    x = images(FULL, HALF, FULL)
    res, bar = run(Dyadic(W), x, [0.375, 0.8, 0.5], True, batch_size, monkeypatch, chunk=chunk)
    a, b, c = res
    # image 0, round 1 from f = 1: the 0.125 pixels go first (ties: lowest id), then 0 and 2
    assert a.order.tolist() == [1, 3, 4, 5, 0, 2]
    assert a.values.tolist() == [0.875, 0.75, 0.625, 0.5, 0.25, 0.0]
    assert a.sis.tolist() == [2, 0] and a.sis_score == 0.5 and a.score == 1.0
    assert a.mask.tolist() == [[True, False, True], [False, False, False]]
    assert (a.target, a.threshold, a.engine) == (0, 0.375, "planted")
    # round 2 on {1, 3, 4, 5} from f = 0.5; round 3 on {1} starts at 0.125 < tau: not recorded
    assert len(a.collection) == 2 and a.collection[0] is a
    r2 = a.collection[1]
    assert r2.order.tolist() == [1, 3, 4, 5] and r2.values.tolist() == [0.375, 0.25, 0.125, 0.0]
    assert r2.sis.tolist() == [5, 4, 3] and r2.sis_score == 0.375 and r2.score == 0.5
    assert r2.mask.tolist() == [[False, False, False], [True, True, True]]
    assert (r2.target, r2.threshold, r2.engine) == (0, 0.375, "planted")
    # image 1: f = 0.75 < 0.8, one round (backward selection still runs), no set, no collection
    assert b.order.tolist() == [4, 5, 1, 3, 0, 2]
    assert b.values.tolist() == [0.75, 0.75, 0.625, 0.5, 0.25, 0.0]
    assert b.sis is None and b.mask is None and b.sis_score is None and b.score == 0.75
    assert b.collection == []
    # image 2, tau 0.5: round 2 from f = 0.5 needs all four features (the SIS is the whole round): stop
    assert c.sis.tolist() == [2, 0] and c.sis_score == 0.5
    assert len(c.collection) == 2
    assert c.collection[1].sis.tolist() == [5, 4, 3, 1] and c.collection[1].sis_score == 0.5
    assert c.collection[1].values.tolist() == [0.375, 0.25, 0.125, 0.0]
    # the bar: 3 x 21 candidates in round 1; image 0: 1 + 10 (round 2), 1 (round 3's score, which
    # then fails); image 2: 1 + 10. It ends at its total, with every candidate counted once.
    assert bar.first_total == 63 and bar.total == 63 + 11 + 1 + 11 and bar.n == bar.total and bar.closed
    assert type(bar.first_total) is int and type(bar.total) is int  # a count of candidates, not 63.0
    assert bar.kw == {"unit": "cand", "desc": "exact SIS", "disable": None}


@pytest.mark.timeout(30)
def test_without_collection_and_progress_flags(monkeypatch):
    x = images(FULL, HALF)
    res, bar = run(Dyadic(W), x, [0.375, 0.5], False, 7, monkeypatch, progress=True)
    assert [r.sis.tolist() for r in res] == [[2, 0], [2, 0]]
    assert res[1].order.tolist() == [4, 5, 1, 3, 0, 2] and res[1].sis_score == 0.5
    assert all(r.collection is None for r in res)
    assert bar.total == 42 and bar.n == 42 and bar.kw["disable"] is False
    _, bar = run(Dyadic(W), x, [0.375, 0.5], False, 7, monkeypatch, progress=False)
    assert bar.kw["disable"] is True


@pytest.mark.timeout(30)
def test_empty_sis_and_tau_zero_stop_the_collection(monkeypatch):
    # bias 0.5: the fully masked input already passes tau = 0.5: the SIS is empty, one round
    (r,), _ = run(Dyadic([0.125] * 6, bias=0.25), images(FULL), [0.25], True, 5, monkeypatch)
    assert r.values.tolist() == [0.875, 0.75, 0.625, 0.5, 0.375, 0.25]
    assert r.sis.tolist() == [] and r.sis_score == 0.25 and len(r.collection) == 1
    assert r.mask.tolist() == [[False] * 3] * 2


@pytest.mark.timeout(30)
def test_a_set_failing_on_the_users_model_is_repaired(monkeypatch):
    # the stand-in adds 0.25 to f: its round-1 SIS {2, 0} (f 0.5 on the user's model) fails tau 0.6;
    # FindSIS goes on, last masked first: {2, 0, 5} gives 0.625 on the user's model.
    # Round 2 on {1, 3, 4}: the stand-in starts at 0.625 >= tau and takes all three, but on the user's
    # model they give 0.375: no set, and the collection stops there.
    (r,), bar = run(Dyadic(W), images(FULL), [0.6], True, 3, monkeypatch, stand_in=Dyadic(W, bias=0.25))
    assert r.order.tolist() == [1, 3, 4, 5, 0, 2]
    assert r.values.tolist() == [1.125, 1.0, 0.875, 0.75, 0.5, 0.25]  # the stand-in's values
    assert r.sis.tolist() == [2, 0, 5] and r.sis_score == 0.625
    assert r.mask.tolist() == [[True, False, True], [False, False, True]]
    assert len(r.collection) == 1
    assert bar.total == 21 + 1 + 6 and bar.n == bar.total


@pytest.mark.timeout(30)
def test_a_set_passing_on_the_users_model_is_kept(monkeypatch):
    # tau 0.5: the stand-in's {2, 0} gives exactly 0.5 on the user's model: kept, with the user's f;
    # round 2 on {1, 3, 4, 5}: the stand-in's {5, 4, 3} gives 0.375 on the user's model, so one more
    # (feature 1): 0.5, the whole round.
    (r,), _ = run(Dyadic(W), images(FULL), [0.5], True, 2, monkeypatch, stand_in=Dyadic(W, bias=0.25))
    assert r.sis.tolist() == [2, 0] and r.sis_score == 0.5
    assert [c.sis.tolist() for c in r.collection] == [[2, 0], [5, 4, 3, 1]]
    assert [c.sis_score for c in r.collection] == [0.5, 0.5]
    assert [c.score for c in r.collection] == [1.0, 0.75]  # round 2's start is the stand-in's f


@pytest.mark.timeout(30)
@pytest.mark.parametrize("collection", [False, True])
def test_non_finite_scores_raise(monkeypatch, collection):
    # NaN for f = 0.625 only: three candidates of round 1's third step, in a middle batch of four;
    # the steps after it are finite again, so the flag must remember the NaN
    with pytest.raises(FloatingPointError, match="NaN or inf scores on masked inputs"):
        run(Dyadic(W, nan_at=0.625), images(FULL), [0.375], collection, 4, monkeypatch)
    (r,), _ = run(Dyadic(W, nan_at=0.3), images(FULL), [0.375], collection, 4, monkeypatch)
    assert r.sis.tolist() == [2, 0]  # the planted model is finite when 0.3 never occurs


@pytest.mark.timeout(30)
def test_default_engine_name_and_evaluator(monkeypatch):
    # no engine, no evaluator: the CandidateEvaluator of fn, reported as "torch"
    monkeypatch.setattr(exact, "tqdm", Bar)
    fn = ModelFn(Dyadic(W), outputs="probabilities")
    x = images(FULL)
    prep = prepare(x)
    (r,) = exact.exact_sis(fn, prep, torch.tensor([0]), torch.tensor([1.0], dtype=torch.float64), [0.375],
                           False, 3, ChunkRunner(100, x.device), None)
    assert r.engine == "torch" and r.sis.tolist() == [2, 0] and r.target == 0


@pytest.mark.timeout(30)
def test_a_pessimistic_stand_ins_set_is_kept_not_shrunk(monkeypatch):
    # the stand-in subtracts 0.25: its SIS {2, 0, 5} (0.375 there) gives 0.625 on the user's model, so it
    # is kept as it is, although {2, 0} would pass there too (the check only ever adds features).
    # Round 2 on {1, 3, 4} starts at 0.125 on the stand-in: below tau, its 3 + 2 + 1 candidates are
    # taken off the bar.
    (r,), bar = run(Dyadic(W), images(FULL), [0.375], True, 5, monkeypatch, stand_in=Dyadic(W, bias=-0.25))
    assert r.values.tolist() == [0.625, 0.5, 0.375, 0.25, 0.0, -0.25]
    assert r.sis.tolist() == [2, 0, 5] and r.sis_score == 0.625 and len(r.collection) == 1
    assert bar.total == 21 + 1 and bar.n == bar.total and type(bar.total) is int


@pytest.mark.timeout(30)
@pytest.mark.parametrize("batch_size,chunk", [(4, 3), (1000, 1000)])
def test_every_tensor_is_made_on_the_images_device_not_torchs_default(monkeypatch, batch_size, chunk):
    """CPU images while torch's default device is ``meta`` (as a user's ``torch.set_default_device("cuda")``
    would be): a tensor that exact_sis made on the default device instead of the images' one holds no data, so
    reading it or mixing it with the CPU state fails. The answer is the hand-built one of the test above."""
    x = images(FULL, HALF, FULL)
    res, bar = run(Dyadic(W), x, [0.375, 0.8, 0.5], True, batch_size, monkeypatch, chunk=chunk,
                   default_device="meta")
    a, b, c = res
    assert a.order.tolist() == [1, 3, 4, 5, 0, 2] and a.values.tolist() == [0.875, 0.75, 0.625, 0.5, 0.25, 0.0]
    assert [r.sis.tolist() for r in a.collection] == [[2, 0], [5, 4, 3]]
    assert [r.order.tolist() for r in a.collection] == [[1, 3, 4, 5, 0, 2], [1, 3, 4, 5]]
    assert b.order.tolist() == [4, 5, 1, 3, 0, 2] and b.sis is None and b.collection == []
    assert [r.sis.tolist() for r in c.collection] == [[2, 0], [5, 4, 3, 1]]
    assert a.collection[1].mask.tolist() == [[False, False, False], [True, True, True]]
    tensors = [t for r in (a, b, c) for s in [r, *r.collection] for t in (s.order, s.values, s.sis, s.mask)
               if t is not None]
    assert {t.device.type for t in tensors} == {"cpu"}
    assert bar.total == 63 + 11 + 1 + 11 and bar.n == bar.total


@pytest.mark.timeout(30)
def test_float32_images_are_scored_in_float64(monkeypatch):
    """float32 images and model: the scores and values held inside stay float64 whatever the images' dtype (the
    update kernel takes float64 only). Every f here is a dyadic sum, exact in float32 too: the hand-built answer
    of the float64 test."""
    x = images(FULL, HALF, FULL).float()
    res, bar = run(Dyadic(W).float(), x, [0.375, 0.8, 0.5], True, 4, monkeypatch, chunk=3)
    a, b, c = res
    assert a.values.dtype == torch.float64
    assert a.order.tolist() == [1, 3, 4, 5, 0, 2] and a.values.tolist() == [0.875, 0.75, 0.625, 0.5, 0.25, 0.0]
    assert [r.sis.tolist() for r in a.collection] == [[2, 0], [5, 4, 3]]
    assert b.order.tolist() == [4, 5, 1, 3, 0, 2] and b.sis is None
    assert [r.sis.tolist() for r in c.collection] == [[2, 0], [5, 4, 3, 1]]

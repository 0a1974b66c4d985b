"""Input reduction (docs: algorithms.md, Input reduction): the packed engine against the plain transcription,
hand-built tie cases,
the Hugging Face adapter and clear errors.

text/sis.py and text/mitigation.py checked by hand: token_sis's checks with whole messages and what it hands
fast_sis per length group (a recorder in fast_sis's place), the float-to-id wrapper, and entropy_finetune's
checks, reductions, padding, step count and loss written out. The tests above run both end to end.

Tests marked ``mutation`` were written for survivors of a mutation run (mutmut): they pin details that the
behavioural tests above let through, with every expectation worked out by hand.
"""
import math
import pytest
import torch
from torch import nn
import overinterp_fast as of
from overinterp_fast.methods import reference
from overinterp_fast.zoo import text as zt
from overinterp_fast.zoo.text import WordCNN
from helpers import fake_terminal, recording_adam
from overinterp_fast import api
from overinterp_fast.text import mitigation
from overinterp_fast.text.reduction import InputReduction, Reduction
from overinterp_fast.text.sis import _IdsFromFloat, token_sis
from overinterp_fast.text.model import TextModelFn
from helpers import whole_message


def sig(z):
    return 1.0 / (1.0 + math.exp(-z))


class BagOfWords(nn.Module):
    """Two classes; logit difference = sum of the token weights of the real positions - bias (float64)."""

    def __init__(self, weights, bias=0.0):
        super().__init__()
        self.embedding = nn.Embedding(len(weights), 1).double()
        with torch.no_grad():
            self.embedding.weight[:, 0] = torch.tensor(weights, dtype=torch.float64)
        self.bias = bias

    def forward(self, ids, attention_mask):
        s = (self.embedding(ids)[..., 0] * attention_mask).sum(1) - self.bias
        return torch.stack([-s / 2, s / 2], 1)


def tiny_cnn(seed=0, vocab=40):
    torch.manual_seed(seed)
    return WordCNN(vocab, dim=8, filters=8, widths=(3,), dropout=0.0).double().eval()


def random_sequences(n, vocab=40, max_len=13, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(2, vocab, (int(torch.randint(1, max_len + 1, (1,), generator=g)),), generator=g)
            for _ in range(n)]


def assert_same(fast, ref):
    assert len(fast) == len(ref)
    for r, q in zip(fast, ref):
        assert r.kept.tolist() == q["kept"]
        assert [tuple(b.kept.tolist()) for b in r.beam] == [b[0] for b in q["beam"]]
        for b, (_, f) in zip(r.beam, q["beam"]):
            assert b.confidence == pytest.approx(f, rel=1e-12, abs=1e-15)
        assert (r.steps, r.queries, r.target) == (q["steps"], q["queries"], q["target"])
        assert r.original_confidence == pytest.approx(q["original_confidence"], rel=1e-12)


@pytest.mark.parametrize("importance", ["leave_one_out", "gradient"])
@pytest.mark.parametrize("beam_size", [1, 5])
@pytest.mark.parametrize("seed", [0, 1])
def test_packed_equals_transcription(importance, beam_size, seed):
    model = tiny_cnn(seed)
    seqs = random_sequences(10, seed=seed + 1)
    ref = reference.input_reduction(model, seqs, beam_size=beam_size, importance=importance,
                                    embedding=model.embedding)
    # small batches force chunks of several widths; the default packs everything together. The word CNN's
    # deletion_logits computes leave-one-out children incrementally; incremental=False builds every row.
    for bs, incremental in ((7, True), (None, True), (7, False), (None, False)):
        fast = of.input_reduction(model, seqs, beam_size=beam_size, importance=importance, batch_size=bs,
                                  incremental=incremental)
        assert_same(fast, ref)
        for r, s in zip(fast, seqs):
            assert torch.equal(r.ids, s[r.kept])
            assert all(b.kept.numel() == r.kept.numel() for b in r.beam)
            assert r.steps == s.numel() - r.kept.numel()


@pytest.mark.parametrize("importance", ["leave_one_out", "gradient"])
def test_repeated_tokens_keep_exact_ties(importance):
    # ids 2..4 only: runs of equal tokens, whose deletions give identical children (exact ties)
    model = tiny_cnn(4)
    seqs = random_sequences(8, vocab=5, seed=11)
    assert any(bool((s[1:] == s[:-1]).any()) for s in seqs)
    ref = reference.input_reduction(model, seqs, beam_size=3, importance=importance, embedding=model.embedding)
    assert_same(of.input_reduction(model, seqs, beam_size=3, importance=importance, batch_size=5), ref)


def test_word_cnn_deletion_logits_are_the_deleted_rows():
    torch.manual_seed(0)
    model = WordCNN(30, dim=6, filters=5, widths=(3, 5, 7)).double().eval()
    seqs = random_sequences(8, vocab=30, max_len=10, seed=7) + [torch.tensor([4, 5])]
    ids, mask = zt.pad_batch(seqs)
    got = model.deletion_logits(ids, mask)
    for b, s in enumerate(seqs):
        for i in range(s.numel() if s.numel() > 1 else 0):  # a one-token row has no deletion
            child = torch.cat([s[:i], s[i + 1:]])
            want = model(child[None], torch.ones(1, child.numel(), dtype=torch.bool))[0]
            assert torch.allclose(got[b, i], want, rtol=1e-12, atol=1e-12)


def test_padded_tensor_input_and_given_target():
    model = tiny_cnn(2)
    seqs = random_sequences(6, seed=5)
    ids = torch.zeros(6, 13, dtype=torch.int64)
    mask = torch.zeros(6, 13, dtype=torch.bool)
    for i, s in enumerate(seqs):
        ids[i, : s.numel()], mask[i, : s.numel()] = s, True
    targets = [i % 2 for i in range(6)]
    fast = of.input_reduction(model, ids, attention_mask=mask, target=torch.tensor(targets), beam_size=3)
    ref = reference.input_reduction(model, seqs, beam_size=3, target=targets)
    assert_same(fast, ref)
    assert [r.target for r in fast] == targets


@pytest.mark.parametrize("importance", ["leave_one_out", "gradient"])
def test_importance_tie_deletes_the_lower_position(importance):
    # ids 2 and 3 weigh the same: deleting either leaves f = sigmoid(1); the lower position goes first
    model = BagOfWords([0.0, 0.0, 1.0, 1.0]).eval()
    (r,) = of.input_reduction(model, [torch.tensor([2, 3])], beam_size=1, importance=importance)
    assert r.kept.tolist() == [1] and r.ids.tolist() == [3]
    assert r.confidence == pytest.approx(sig(1.0), rel=1e-12)
    assert r.original_confidence == pytest.approx(sig(2.0), rel=1e-12)
    assert (r.steps, r.queries) == (1, 3)  # LOO: 1 + 2 children; gradient: 1 + 1 backward + 1 child


@pytest.mark.parametrize("importance", ["leave_one_out", "gradient"])
def test_beam_ties_dedupe_kb_and_stop(importance):
    # six tokens of weight 1, bias 3.5: four tokens are still class 1 (f = sigmoid(0.5)), three are not.
    # Round 1 (L=6, k_b=min(3, 3)=3): delete positions 0, 1, 2 (all tie) -> ranked by the kept tuple.
    # Round 2 (L=5, k_b=2): children (1,3,4,5) (0,3,4,5) | (2,3,4,5) (0,3,4,5) | (2,3,4,5) (1,3,4,5): three unique.
    # Round 3 (L=4, k_b=1): every child keeps three tokens: invalid, stop.
    model = BagOfWords([0.0, 0.0, 1.0], bias=3.5).eval()
    (r,) = of.input_reduction(model, [torch.full((6,), 2)], beam_size=3, importance=importance)
    assert [b.kept.tolist() for b in r.beam] == [[0, 3, 4, 5], [1, 3, 4, 5], [2, 3, 4, 5]]
    assert all(b.confidence == pytest.approx(sig(0.5), rel=1e-12) for b in r.beam)
    assert r.kept.tolist() == [0, 3, 4, 5] and r.steps == 2
    expected = 1 + 6 + 3 * 5 + 3 * 4 if importance == "leave_one_out" else 1 + (1 + 3) + 3 * (1 + 2) + 3 * (1 + 1)
    assert r.queries == expected


def test_ranking_prefers_higher_confidence_over_the_tuple():
    # weights 1, 2, 3, 5, 5, 5 (sum 21), bias 18.5: five tokens can stay class 1 (sums 20, 19), four cannot.
    # Round 1 (L=6, k_b=min(2, 3)=2): delete position 0 (sum 20) or 1 (sum 19).
    # Round 2 (k_b=2): the best four-token child sums to 18 < 18.5: stop. The beam is ranked by f, so the
    # lexicographically larger tuple (1,2,3,4,5) comes first.
    model = BagOfWords([0.0, 1.0, 2.0, 3.0, 5.0], bias=18.5).eval()
    (r,) = of.input_reduction(model, [torch.tensor([1, 2, 3, 4, 4, 4])], beam_size=2)
    assert [b.kept.tolist() for b in r.beam] == [[1, 2, 3, 4, 5], [0, 2, 3, 4, 5]]
    assert [b.confidence for b in r.beam] == pytest.approx([sig(1.5), sig(0.5)], rel=1e-12)
    assert (r.steps, r.queries) == (1, 1 + 6 + 2 * 5)


def test_length_one_and_batch_independence():
    model = tiny_cnn(3)
    seqs = [torch.tensor([5])] + random_sequences(5, seed=9)
    res = of.input_reduction(model, seqs, beam_size=2)
    assert res[0].kept.tolist() == [0] and res[0].steps == 0 and res[0].queries == 1
    alone = [of.input_reduction(model, [s], beam_size=2)[0] for s in seqs]
    for a, b in zip(res, alone):
        assert a.kept.tolist() == b.kept.tolist() and a.queries == b.queries


def test_errors():
    model = tiny_cnn(0)
    with pytest.raises(ValueError, match="empty"):
        of.input_reduction(model, [torch.tensor([3, 4]), torch.tensor([], dtype=torch.int64)])
    with pytest.raises(ValueError, match="outside the vocabulary"):
        of.input_reduction(model, [torch.tensor([3, 40])])
    with pytest.raises(ValueError, match="outside the vocabulary"):
        of.input_reduction(model, [torch.tensor([-1, 3])])
    with pytest.raises(ValueError, match=r"lie in \[0, 2\)"):
        of.input_reduction(model, [torch.tensor([3, 4])], target=2)
    with pytest.raises(ValueError, match="to logits"):
        of.input_reduction(lambda ids, mask: torch.zeros(ids.shape[0], 2, 2), [torch.tensor([3, 4])])
    with pytest.raises(ValueError, match="no sequences"):
        of.input_reduction(model, [])
    with pytest.raises(ValueError, match="attention_mask"):
        of.input_reduction(model, torch.ones(2, 3, dtype=torch.int64))
    with pytest.raises(ValueError, match="left-aligned"):
        of.input_reduction(model, torch.ones(1, 3, dtype=torch.int64), attention_mask=torch.tensor([[0, 1, 1]]).bool())
    with pytest.raises(ValueError, match="beam_size"):
        of.input_reduction(model, [torch.tensor([3, 4])], beam_size=0)
    with pytest.raises(ValueError, match="importance"):
        of.input_reduction(model, [torch.tensor([3, 4])], importance="saliency")
    with pytest.raises(ValueError, match="embedding"):
        of.input_reduction(lambda ids, mask: model(ids, mask), [torch.tensor([3, 4])], importance="gradient")
    with pytest.raises(ValueError, match="training mode"):
        of.input_reduction(tiny_cnn(0).train(), [torch.tensor([3, 4])])


def test_hugging_face_adapter():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.BertConfig(vocab_size=30, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                  intermediate_size=32, num_labels=3, max_position_embeddings=32)
    torch.manual_seed(0)
    hf = transformers.BertForSequenceClassification(cfg).double().eval()

    class Plain(nn.Module):  # the contract written out here, independent of the adapter
        def __init__(self):
            super().__init__()
            self.hf = hf

        def forward(self, ids, mask):
            return self.hf(input_ids=ids, attention_mask=mask.long()).logits

    seqs = random_sequences(3, vocab=30, max_len=7, seed=4)
    for importance in ("leave_one_out", "gradient"):
        fast = of.input_reduction(hf, seqs, beam_size=3, importance=importance, batch_size=5)
        ref = reference.input_reduction(Plain(), seqs, beam_size=3, importance=importance,
                                        embedding=hf.get_input_embeddings())
        assert_same(fast, ref)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        of.input_reduction(hf, [torch.tensor([1, 30])])


def test_token_sis_masks_with_attention_kept():
    # logit difference = sum of weights - 1 per attended position. Masked tokens (id 1, weight 0) stay attended:
    # [w 3, 1, 2] scores 6 - 3 = 3; BackSelect masks position 1 (f = sig(2)), then 2 (sig(0)), then 0 (sig(-3)).
    # tau = sig(1.5) needs weights >= 4.5 with all three positions attended: the SIS is {0, 2}. (Deleting the
    # masked tokens instead would let {0} alone pass: 3 - 1 = 2.)
    class Counting(BagOfWords):
        def forward(self, ids, attention_mask):
            s = (self.embedding(ids)[..., 0] * attention_mask).sum(1) - attention_mask.sum(1)
            return torch.stack([-s / 2, s / 2], 1)

    model = Counting([0.0, 0.0, 3.0, 1.0, 2.0]).eval()
    (r,) = of.text.token_sis(model, [torch.tensor([2, 3, 4])], threshold=sig(1.5), mask_id=1)
    assert r.order.tolist() == [1, 2, 0]
    assert r.values.tolist() == pytest.approx([sig(2.0), sig(0.0), sig(-3.0)], rel=1e-12)
    assert r.sis.tolist() == [0, 2] and r.target == 1


def test_token_sis_equals_reference_sis():
    model = tiny_cnn(5)

    def on_floats(x):  # the reference engine sees rows of ids as floats, as written out here
        ids = x.round().long()
        return model(ids, torch.ones(ids.shape, dtype=torch.bool))

    seqs = random_sequences(6, max_len=7, seed=3)
    fast = of.text.token_sis(model, seqs, threshold=0.6, mask_id=1, collection=True)
    for s, r in zip(seqs, fast):
        (q,) = reference.sis(on_floats, s[None].double(), 0.6, baselines=1.0, collection=True)
        assert r.order.tolist() == q.order.tolist()
        assert r.values.tolist() == pytest.approx(q.values.tolist(), rel=1e-12)
        assert (r.sis is None and q.sis is None) or r.sis.tolist() == q.sis.tolist()
        assert len(r.collection or []) == len(q.collection or [])
    with pytest.raises(ValueError, match="mask_id"):
        of.text.token_sis(model, seqs, mask_id=40)


def test_entropy_finetune_raises_entropy_on_reduced_inputs():
    torch.manual_seed(0)
    model = WordCNN(40, dim=8, filters=8, widths=(3,), dropout=0.0).eval()
    with torch.no_grad():
        model.head.weight *= 30  # a confident model (entropy well below log 2 on its reduced inputs)
    seqs = random_sequences(64, seed=21)
    labels = torch.tensor([int(s.float().mean() > 20) for s in seqs])
    before = {k: v.clone() for k, v in model.state_dict().items()}

    def reduced_entropy(m, red):
        rows = [s[r.kept] for s, r in zip(seqs, red)]
        ids, mask = zt.pad_batch(rows)
        with torch.no_grad():
            p = torch.softmax(m(ids, mask), 1)
        return float(-(p * p.clamp_min(1e-30).log()).sum(1).mean())

    red = of.input_reduction(model, seqs, beam_size=2)
    res = of.text.entropy_finetune(model, (seqs, labels), 5.0, beam_size=2, epochs=3, lr=1e-2, batch=16)
    assert res.reduced_examples >= len(seqs) and res.steps == 3 * 4 and not res.model.training
    assert reduced_entropy(model, red) < 0.4 and reduced_entropy(res.model, red) > reduced_entropy(model, red) + 0.1
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())  # the original is untouched
    with pytest.raises(ValueError, match="lam"):
        of.text.entropy_finetune(model, (seqs, labels), -1.0)


# ---------------------------------------------------- input reduction's pieces by hand (fast; mutation kills)


def test_reduction_options_are_checked_with_whole_messages():
    model = BagOfWords([0.0, 0.0, 1.0, 1.0]).eval()
    seq = [torch.tensor([2, 3])]
    bad = [({"beam_size": 0}, r"beam_size must be a positive int, got 0"),
           ({"beam_size": True}, r"beam_size must be a positive int, got True"),
           ({"beam_size": 2.0}, r"beam_size must be a positive int, got 2.0"),
           ({"importance": "saliency"}, r"importance must be one of \('leave_one_out', 'gradient'\), got 'saliency'"),
           ({"pad_id": -1}, r"pad_id must be a non-negative int, got -1"),
           ({"pad_id": False}, r"pad_id must be a non-negative int, got False"),
           ({"pad_id": 1.0}, r"pad_id must be a non-negative int, got 1.0"),
           ({"batch_size": 0}, r"batch_size must be a positive int or None, got 0"),
           ({"batch_size": True}, r"batch_size must be a positive int or None, got True"),
           ({"batch_size": 2.0}, r"batch_size must be a positive int or None, got 2.0")]
    for kw, msg in bad:
        with pytest.raises(ValueError, match=f"^{msg}$"):
            of.input_reduction(model, seq, **kw)
    for kw in ({"beam_size": 1, "pad_id": 0, "batch_size": None}, {"pad_id": 7, "batch_size": 1}):
        (r,) = of.input_reduction(model, seq, **kw)
        assert r.kept.tolist() == [1]


def test_reduction_reprs_and_length():
    model = BagOfWords([0.0, 0.0, 1.0, 1.0]).eval()
    (r,) = of.input_reduction(model, [torch.tensor([2, 3])], beam_size=1)
    assert (r.length, r.original_length) == (1, 2)
    assert repr(r) == ("InputReduction(kept=[1], confidence=0.7311, original_confidence=0.8808, target=1, "
                       "length 2->1, beam=1, queries=3)")
    assert repr(r.beam[0]) == "Reduction(kept=[1], confidence=0.7311)"


def test_reduction_pads_with_pad_id_behind_the_attention_mask():
    seen = []

    class Recording(BagOfWords):
        def forward(self, ids, attention_mask):
            seen.append(ids[~attention_mask].unique().tolist())
            return super().forward(ids, attention_mask)

    model = Recording([0.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.5]).eval()
    of.input_reduction(model, [torch.tensor([2, 3, 2]), torch.tensor([3])], beam_size=2, pad_id=7,
                       incremental=False)
    assert {v for s in seen for v in s} == {7}  # every padded slot holds pad_id (weight 0.5, masked out)


class NaNBelow(BagOfWords):
    """BagOfWords whose logits are NaN on rows shorter than ``short`` tokens."""

    def __init__(self, weights, short):
        super().__init__(weights)
        self.short = short

    def forward(self, ids, attention_mask):
        out = super().forward(ids, attention_mask)
        bad = attention_mask.sum(1, keepdim=True) < self.short
        return torch.where(bad, torch.full_like(out, float("nan")), out)

    def deletion_logits(self, ids, attention_mask):
        rows = [self(torch.cat([ids[:, :i], ids[:, i + 1:]], 1), torch.cat([attention_mask[:, :i],
                                                                              attention_mask[:, i + 1:]], 1))
                for i in range(ids.shape[1])]
        return torch.stack(rows, 1)


def test_non_finite_scores_are_refused_with_one_line():
    seq = [torch.tensor([2, 3, 2, 3])]
    with pytest.raises(FloatingPointError, match=r"^the model's output on the full sequences contains NaN or inf$"):
        of.input_reduction(NaNBelow([0.0, 0.0, 1.0, 1.0], short=5).eval(), seq)
    for incremental in (True, False):  # through deletion_logits, and through rows built one by one
        with pytest.raises(FloatingPointError, match=r"^the model produced NaN or inf scores on reduced inputs$"):
            of.input_reduction(NaNBelow([0.0, 0.0, 1.0, 1.0], short=4).eval(), seq, incremental=incremental)
    with pytest.raises(FloatingPointError, match=r"^the model produced NaN or inf scores on reduced inputs$"):
        of.input_reduction(NaNBelow([0.0, 0.0, 1.0, 1.0], short=4).eval(), seq, importance="gradient")

    class NaNGradient(BagOfWords):
        def forward(self, ids, attention_mask):
            e = self.embedding(ids)[..., 0]
            s = (torch.sqrt(e - 1.0) * attention_mask).sum(1)  # d sqrt(u) / du at u = 0: inf
            return torch.stack([-s / 2, s / 2], 1)

    with pytest.raises(FloatingPointError, match=r"^the model produced NaN or inf gradients$"):
        of.input_reduction(NaNGradient([0.0, 0.0, 1.0, 2.0]).eval(), [torch.tensor([2, 3, 3])], importance="gradient")


def test_scorer_chunks_by_tokens_or_rows():
    from overinterp_fast.text.reduction import _Scorer

    cpu = _Scorer(None, None, torch.device("cpu"))
    assert (cpu.tokens, cpu.deletion_tokens) == (4096, 1024)
    gpu = _Scorer(None, None, torch.device("cuda"))  # only the device type is read
    assert (gpu.tokens, gpu.deletion_tokens) == (1 << 19, 1 << 17)
    assert list(cpu._chunks([5, 5, 3, 1], 10)) == [(0, 2, 5), (2, 4, 3)]  # 10 // 5 rows, then 10 // 3
    assert list(cpu._chunks([3, 3, 3], 2)) == [(0, 1, 3), (1, 2, 3), (2, 3, 3)]  # at least one row per chunk
    assert list(cpu._chunks([0, 0], 1)) == [(0, 1, 1), (1, 2, 1)]  # width at least 1
    assert list(cpu._chunks([2] * 3000)) == [(0, 2048, 2), (2048, 3000, 2)]  # default: 4096 tokens
    assert list(_Scorer(None, 2, torch.device("cpu"))._chunks([5, 4, 4, 1], 100)) == [(0, 2, 5), (2, 4, 4)]
    assert list(cpu._chunks([])) == []


def test_delete_bit_words_and_rank_pool_by_hand():
    from overinterp_fast.text.reduction import _bit_words, _delete, _rank_pool, _stable_order

    t = torch.tensor
    pos = t([[0, 1, 2, 3], [5, 6, 7, -1]])
    got = _delete(pos, t([4, 3]), t([0, 0, 1, 1]), t([0, 2, 1, 2]))
    assert got.tolist() == [[1, 2, 3], [0, 1, 3], [5, 7, -1], [5, 6, -1]]
    assert _delete(t([[4]]), t([1]), t([0]), t([0])).tolist() == [[-1]]
    words = _bit_words(t([[0, 61, 62, -1], [1, -1, -1, -1]]), 2)
    assert words.tolist() == [[(1 << 61) + 1, 1 << 61], [1 << 60, 0]]
    # keys of the order's entries: 2, 3, 1, 1 (the tied 1 and 3 keep their order)
    assert _stable_order(t([2, 0, 1, 3]), t([3, 1, 2, 1]), True).tolist() == [0, 2, 1, 3]
    assert _stable_order(t([2, 0, 1, 3]), t([3, 1, 2, 1]), False).tolist() == [1, 3, 2, 0]
    # sequence 0: children 0..3 (1 and 2 are the same kept set; 2 scores higher), sequence 1: children 4, 5
    seq = t([0, 0, 0, 0, 1, 1])
    f = t([0.5, 0.6, 0.7, 0.7, 0.2, 0.9], dtype=torch.float64)
    kept = t([[0, 1], [0, 2], [0, 2], [1, 2], [0, 1], [1, 2]])
    keep = _rank_pool(seq, f, _bit_words(kept, 1), 2)
    # ties in f (children 2 and 3) go to the lexicographically smaller kept tuple (0, 2)
    assert keep.tolist() == [2, 3, 5, 4]
    assert _rank_pool(seq, f, _bit_words(kept, 1), 1).tolist() == [2, 5]
    assert _rank_pool(seq, f, _bit_words(kept, 1), 3).tolist() == [2, 3, 0, 5, 4]


@pytest.mark.parametrize("progress,shown", [(True, True), (False, False), (None, True)])
def test_reduction_progress_bar(monkeypatch, progress, shown):
    terminal = fake_terminal(monkeypatch)
    model = BagOfWords([0.0, 0.0, 1.0, 1.0]).eval()
    of.input_reduction(model, [torch.tensor([2, 3]), torch.tensor([3]), torch.tensor([2, 2, 3])], beam_size=3,
                       show_progress=progress)
    terminal.assert_finished_bar(shown, "input reduction (beam 3)", 3, "seq")


def test_deletion_logits_run_in_chunks_of_1024_tokens_on_a_cpu():
    """Kills the mutants of ``_Scorer.deletions`` that chunk by the forward pass's 4096 tokens: with rows of
    300 tokens, deletion_logits gets 1024 // 300 = 3 rows per call (not 4096 // 300 = 13)."""

    class Recorded(BagOfWords):
        def __init__(self, weights, bias):
            super().__init__(weights, bias)
            self.deletion_shapes = []

        def deletion_logits(self, ids, attention_mask):  # row b without token i, built by hand
            self.deletion_shapes.append(tuple(ids.shape))
            e = self.embedding(ids)[..., 0] * attention_mask
            s = e.sum(1, keepdim=True) - e - self.bias  # [B, T]: the row's sum minus token i
            return torch.stack([-s / 2, s / 2], 2)

    # every token weighs 1 and the bias is 299.5: class 1 on the full rows, class 0 after any deletion, so
    # the beam stops after one round
    model = Recorded([0.0, 0.0, 1.0], 299.5).eval()
    out = of.input_reduction(model, [torch.full((300,), 2)] * 4, beam_size=1)
    assert model.deletion_shapes == [(3, 300), (1, 300)]  # 4 rows of 300 tokens: 3 per call, then 1
    assert [(r.length, r.steps, r.queries) for r in out] == [(300, 0, 301)] * 4


def test_rank_pool_breaks_ties_on_the_first_word_of_a_long_kept_set():
    """Kept sets over 62 positions span two words; a tie in f goes to the lexicographically smaller tuple, which
    is decided by word 0 even when word 1 says otherwise (kills the mutants that skip or re-sort a word)."""
    from overinterp_fast.text.reduction import _bit_words, _rank_pool

    t = torch.tensor
    # child 0: (1, 62) -> words [1 << 60, 1 << 61]; child 1: (0, 63) -> words [1 << 61, 1 << 60]
    words = _bit_words(t([[1, 62], [0, 63]]), 2)
    assert words.tolist() == [[1 << 60, 1 << 61], [1 << 61, 1 << 60]]
    f = t([0.5, 0.5], dtype=torch.float64)
    assert _rank_pool(t([0, 0]), f, words, 2).tolist() == [1, 0]  # (0, 63) < (1, 62)
    assert _rank_pool(t([0, 0]), f, words, 1).tolist() == [1]


def test_delete_and_bit_words_stay_on_their_inputs_device():
    """Tensors built inside ``_delete`` and ``_bit_words`` follow the input's device (checked on torch's
    ``meta`` device, which every CPU build has: a tensor made on the CPU instead cannot be combined with it)."""
    from overinterp_fast.text.reduction import _bit_words, _delete

    def z(*shape):
        return torch.zeros(shape, dtype=torch.int64, device="meta")

    child = _delete(z(2, 4), z(2), z(3), z(3))
    assert (child.device.type, tuple(child.shape)) == ("meta", (3, 3))
    words = _bit_words(z(2, 4), 2)
    assert (words.device.type, tuple(words.shape)) == ("meta", (2, 2))


def test_reduction_defaults_pad_with_0_and_use_the_embedding_given():
    """pad_id defaults to 0; an ``embedding=`` passed is the one used (here: its vocabulary is checked, on a
    model with two embeddings where none would be found by itself)."""
    seen = []

    class Recording(BagOfWords):
        def forward(self, ids, attention_mask):
            seen.append(ids[~attention_mask].unique().tolist())
            return super().forward(ids, attention_mask)

    model = Recording([0.5, 0.5, 1.0, 1.0]).eval()
    of.input_reduction(model, [torch.tensor([2, 3, 2]), torch.tensor([3])], beam_size=2)
    assert {v for s in seen for v in s} == {0}

    class TwoEmbeddings(BagOfWords):
        def __init__(self, weights):
            super().__init__(weights)
            self.other = nn.Embedding(10, 1)

    two = TwoEmbeddings([0.0, 0.0, 1.0, 1.0]).eval()
    assert of.input_reduction(two, [torch.tensor([2, 3])], beam_size=1)[0].original_length == 2
    with pytest.raises(ValueError, match=r"^sequence 0 has token id 5, outside the vocabulary \[0, 4\)$"):
        of.input_reduction(two, [torch.tensor([2, 5])], beam_size=1, embedding=two.embedding)


def test_reduction_batch_size_is_rows_per_forward_call():
    rows = []

    class Recording(BagOfWords):
        def forward(self, ids, attention_mask):
            rows.append(ids.shape[0])
            return super().forward(ids, attention_mask)

    model = Recording([0.0, 0.0, 1.0, 1.0]).eval()
    seqs = [torch.tensor([2, 3, 2]), torch.tensor([3, 3]), torch.tensor([2])]
    of.input_reduction(model, seqs, beam_size=1, batch_size=2, incremental=False)
    assert rows[0] == 2 and max(rows) == 2  # the full sequences: 2 rows, then 1; children likewise
    assert rows[:2] == [2, 1]


def test_reduction_of_63_tokens_uses_two_bit_words():
    """Position 62 is bit 61 of the second int64 word: a 63-token sequence needs two (kills a word count one
    short). All weights 1, bias 61.5: one deletion keeps class 1 (f = sig(0.5)), a second one flips it."""
    model = BagOfWords([0.0, 0.0, 1.0], 61.5).eval()
    (r,) = of.input_reduction(model, [torch.full((63,), 2)], beam_size=2)
    # queries: the full row, its 63 deletions, then 62 deletions of each of the 2 beam members (none passes)
    assert (r.length, r.steps, r.queries) == (62, 1, 1 + 63 + 2 * 62)
    # all importances tie: positions 0 and 1 are deleted (k_b = 2, lower first); of the two children
    # (1..62) and (0, 2..62), the lexicographically smaller is reported first
    assert [b.kept.tolist() for b in r.beam] == [[0, *range(2, 63)], list(range(1, 63))]
    assert r.confidence == pytest.approx(sig(0.5), rel=1e-12)


def test_reduction_target_shape_error_names_sequences():
    model = BagOfWords([0.0, 0.0, 1.0]).eval()
    with pytest.raises(ValueError, match=r"^target must be an int or have one entry per sequence \(2\), got shape "
                                         r"\(3,\)$"):
        of.input_reduction(model, [torch.tensor([2]), torch.tensor([2, 2])], target=torch.tensor([0, 1, 1]))


@pytest.mark.parametrize("importance,incremental", [("leave_one_out", True), ("leave_one_out", False),
                                                    ("gradient", True)])
def test_reduction_makes_its_tensors_on_the_models_device_not_torchs_default(importance, incremental):
    """A CPU model while torch's default device is ``meta`` (as a user's ``torch.set_default_device("cuda")``
    would be): a tensor made on the default device instead of the model's holds no data, so reading it or mixing
    it with the CPU state fails. The answer is the plain transcription's, computed outside."""
    model = tiny_cnn(0)
    seqs = random_sequences(6, seed=3)
    ref = reference.input_reduction(model, seqs, beam_size=2, importance=importance, embedding=model.embedding)
    with torch.device("meta"):
        got = of.input_reduction(model, seqs, beam_size=2, batch_size=3, importance=importance,
                                 incremental=incremental)
    assert_same(got, ref)
    assert {t.device.type for r in got for t in (r.kept, r.ids, *(b.kept for b in r.beam))} == {"cpu"}


def test_reduction_beam_size_defaults_to_5():
    """Ten tokens of weight 1, bias 8.5: nine stay class 1 (f = sig(0.5)), eight do not. Round 1 deletes
    k_b = min(10 - 3, 5) = 5 positions (all tie: 0..4, lower first); round 2's children all fail, so the beam is
    round 1's five children, ranked by the kept tuple: deleting position 4 keeps the smallest tuple."""
    model = BagOfWords([0.0, 0.0, 1.0], 8.5).eval()
    (r,) = of.input_reduction(model, [torch.full((10,), 2)])
    assert [b.kept.tolist() for b in r.beam] == [[i for i in range(10) if i != d] for d in (4, 3, 2, 1, 0)]
    assert all(b.confidence == pytest.approx(sig(0.5), rel=1e-12) for b in r.beam)
    assert (r.steps, r.queries) == (1, 1 + 10 + 5 * 9)


@pytest.mark.parametrize("importance", ["leave_one_out", "gradient"])
def test_reduction_children_run_in_chunks_of_4096_tokens_on_a_cpu(importance):
    """With batch_size=None, rows of children of a 67-token sequence (66 tokens each) go 4096 // 66 = 62 to a
    forward call (rows counted at 68 tokens would give 60). All weights 1, bias 66.5: no deletion keeps class 1,
    so one round runs: the full row, [the gradient pass,] then the children (LOO: all 67; gradient: k_b = 64)."""
    calls = []

    class Recording(BagOfWords):
        def forward(self, ids, attention_mask):
            calls.append(tuple(ids.shape))
            return super().forward(ids, attention_mask)

    model = Recording([0.0, 0.0, 1.0], 66.5).eval()
    (r,) = of.input_reduction(model, [torch.full((67,), 2)], beam_size=64, importance=importance)
    if importance == "leave_one_out":
        assert calls == [(1, 67), (62, 66), (5, 66)]
        assert r.queries == 1 + 67
    else:
        assert calls == [(1, 67), (1, 67), (62, 66), (2, 66)]
        assert r.queries == 1 + 1 + 64
    assert (r.length, r.steps) == (67, 0)


# ----------------------------------------------------------------------------------------------------
# text/sis.py and text/mitigation.py checked by hand: token_sis's checks with whole messages and what it hands
# ----------------------------------------------------------------------------------------------------


class Weights(nn.Module):
    """Two classes; logit difference = sum over attended positions of the token's weight (float64)."""

    def __init__(self, weights):
        super().__init__()
        self.embedding = nn.Embedding(len(weights), 1).double()
        with torch.no_grad():
            self.embedding.weight[:, 0] = torch.tensor(weights, dtype=torch.float64)

    def forward(self, ids, attention_mask):
        s = (self.embedding(ids)[..., 0] * attention_mask).sum(1)
        return torch.stack([-s / 2, s / 2], 1)


@pytest.mark.mutation
def test_token_sis_checks_with_whole_messages():
    model = Weights([0.0] * 6).eval()
    seqs = [torch.tensor([2, 3]), torch.tensor([4])]
    for bad in (-1, 6, True, 1.0, None):
        with pytest.raises(ValueError, match=whole_message(
                f"mask_id must be a token id in the vocabulary [0, 6), got {bad!r}")):
            token_sis(model, seqs, mask_id=bad)
    token_sis(model, seqs, 0.5, mask_id=0)
    token_sis(model, seqs, 0.5, mask_id=5)
    def unknown_vocabulary(ids, mask):
        return torch.zeros(ids.shape[0], 2, dtype=torch.float64)

    with pytest.raises(ValueError, match=whole_message(
            "mask_id must be a token id in the vocabulary [0, inf), got -2")):
        token_sis(unknown_vocabulary, seqs, mask_id=-2)
    token_sis(unknown_vocabulary, seqs, 0.5, mask_id=10 ** 6)  # no vocabulary known: any id
    with pytest.raises(ValueError, match=whole_message("threshold must be a number or have one entry per sequence (2)")):
        token_sis(model, seqs, [0.5, 0.5, 0.5], mask_id=1)
    with pytest.raises(ValueError, match=whole_message(
            "target must be an int or have one entry per sequence (2), got shape (3,)")):
        token_sis(model, seqs, mask_id=1, target=torch.tensor([0, 1, 1]))


@pytest.mark.mutation
def test_token_sis_groups_by_length_and_passes_every_option(monkeypatch):
    calls = []

    def fake_fast_sis(fn, rows, taus, **kw):
        calls.append({"fn": fn, "rows": rows, "taus": taus, **kw})
        return [f"result of row {r.tolist()}" for r in rows]

    monkeypatch.setattr(api, "fast_sis", fake_fast_sis)
    model = Weights([0.0] * 9).eval()
    seqs = [torch.tensor([2, 3, 4]), torch.tensor([5]), torch.tensor([6, 7, 8]), torch.tensor([1, 2])]
    out = token_sis(model, seqs, [0.1, 0.2, 0.3, 0.4], mask_id=7, target=torch.tensor([1, 0, 0, 1]),
                    collection=True, batch_size=3, show_progress=False)
    assert out == ["result of row [2.0, 3.0, 4.0]", "result of row [5.0]", "result of row [6.0, 7.0, 8.0]",
                   "result of row [1.0, 2.0]"]
    assert [c["rows"].tolist() for c in calls] == [[[5.0]], [[1.0, 2.0]], [[2.0, 3.0, 4.0], [6.0, 7.0, 8.0]]]
    assert all(c["rows"].dtype == torch.float64 for c in calls)  # float64 holds every id exactly
    assert [c["taus"].tolist() for c in calls] == [[0.2], [0.4], [0.1, 0.3]]
    assert [c["target"].tolist() for c in calls] == [[0], [1], [1, 0]]
    for c in calls:
        assert c["baselines"] == 7.0 and isinstance(c["baselines"], float)
        assert c["collection"] is True and c["batch_size"] == 3 and c["show_progress"] is False
        assert isinstance(c["fn"], _IdsFromFloat) and c["fn"].fn.model is model
    calls.clear()
    token_sis(model, seqs[:2], mask_id=0, target=1)  # one target for all; the defaults
    assert [c["target"].tolist() for c in calls] == [1, 1]
    assert [c["taus"].tolist() for c in calls] == [[0.9], [0.9]]
    assert all(c["collection"] is False and c["batch_size"] is None and c["show_progress"] is None for c in calls)
    calls.clear()
    token_sis(model, seqs[:1], 0.5, mask_id=0)
    assert calls[0]["target"] is None and calls[0]["taus"].dtype == torch.float64


@pytest.mark.mutation
def test_token_sis_takes_padded_rows_and_checks_the_vocabulary(monkeypatch):
    calls = []
    monkeypatch.setattr(api, "fast_sis", lambda fn, rows, taus, **kw: calls.append(rows) or [None] * len(rows))
    model = Weights([0.0] * 9).eval()
    padded = torch.tensor([[2, 3, 4], [5, 0, 0]])
    token_sis(model, padded, 0.5, mask_id=1, attention_mask=torch.tensor([[1, 1, 1], [1, 0, 0]]).bool())
    assert [r.tolist() for r in calls] == [[[5.0]], [[2.0, 3.0, 4.0]]]  # the real tokens only
    with pytest.raises(ValueError, match="outside the vocabulary"):
        token_sis(model, [torch.tensor([2, 9])], mask_id=1)


@pytest.mark.mutation
def test_ids_from_float_rounds_and_attends_everywhere():
    seen = []

    def model(ids, mask):
        seen.append((ids, mask))
        return torch.zeros(ids.shape[0], 2)

    wrapper = _IdsFromFloat(TextModelFn(model))
    wrapper(torch.tensor([[2.9999999, 4.0000001, 0.4]], dtype=torch.float64))
    ids, mask = seen[0]
    assert ids.tolist() == [[3, 4, 0]] and ids.dtype == torch.int64
    assert mask.dtype == torch.bool and mask.tolist() == [[True, True, True]]


@pytest.mark.mutation
def test_entropy_finetune_checks_with_whole_messages():
    model = Weights([0.0, 1.0, -1.0])
    seqs = [torch.tensor([1, 2])]
    with pytest.raises(ValueError, match=whole_message(
            "data must be (sequences, labels [N]) with N >= 1; got 1 sequences and labels of shape (2,)")):
        mitigation.entropy_finetune(model, (seqs, torch.tensor([0, 1])), 1.0)
    with pytest.raises(ValueError, match=whole_message(
            "data must be (sequences, labels [N]) with N >= 1; got 0 sequences and labels of shape (0,)")):
        mitigation.entropy_finetune(model, ([], torch.tensor([], dtype=torch.int64)), 1.0)
    for bad in (-0.5, "1", None):
        with pytest.raises(ValueError, match=whole_message(f"lam must be a number >= 0, got {bad!r}")):
            mitigation.entropy_finetune(model, (seqs, torch.tensor([1])), bad)


def _fake_reduction(kept_lists):
    beam = [Reduction(torch.tensor(k), 0.5) for k in kept_lists]
    return InputReduction(beam[0].kept, beam[0].kept, 0.5, 0.9, 1, beam, 1, 1, 2)


@pytest.mark.mutation
def test_entropy_finetune_loss_steps_and_reductions_by_hand(monkeypatch):
    model = Weights([0.0, 1.0, -1.0, 2.0]).train()
    seqs = [torch.tensor([1, 2, 3]), torch.tensor([3]), torch.tensor([2, 2])]
    labels = torch.tensor([1, 0, 1])
    seen = {}

    def fake_reduction(m, to_reduce, *, beam_size, pad_id, show_progress):
        seen.update(training=m.training, n=len(to_reduce), beam_size=beam_size, pad_id=pad_id,
                    show_progress=show_progress)
        return [_fake_reduction([[0, 2]])] + [_fake_reduction([[0]]) for _ in to_reduce[1:]]

    monkeypatch.setattr(mitigation, "input_reduction", fake_reduction)
    res = mitigation.entropy_finetune(model, (seqs, labels), 2.0, beam_size=3, epochs=1, lr=0.0, batch=8,
                                      pad_id=0, reduce_limit=1, show_progress=False)
    assert seen == {"training": False, "n": 1, "beam_size": 3, "pad_id": 0, "show_progress": False}
    assert model.training  # the caller's mode comes back
    assert res.reduced_examples == 1 and res.steps == 1 and not res.model.training and res.model is not model
    # one batch of all three (lr 0: the model does not move): CE over them minus 2 x the entropy of the only
    # reduced example, tokens [1, 3] (kept positions 0 and 2 of the first sequence): logit difference 3
    s = torch.tensor([1.0 + (-1.0) + 2.0, 2.0, -2.0], dtype=torch.float64)
    ce = torch.nn.functional.cross_entropy(torch.stack([-s / 2, s / 2], 1), labels).item()
    p = 1 / (1 + math.exp(-3.0))
    entropy = -(p * math.log(p) + (1 - p) * math.log(1 - p))
    assert res.final_loss == pytest.approx(ce - 2.0 * entropy, rel=1e-12)
    # labels of any integer type (here int32 in a tensor) are taken as class indices
    res32 = mitigation.entropy_finetune(model, (seqs, labels.to(torch.int32)), 2.0, beam_size=3, epochs=1, lr=0.0,
                                        batch=8, reduce_limit=1)
    assert res32.final_loss == res.final_loss
    # lam = 0: the log-likelihood alone
    res0 = mitigation.entropy_finetune(model, (seqs, labels), 0, epochs=2, lr=0.0, batch=2)
    assert res0.final_loss == pytest.approx(_ce_of_last_batch(seqs, labels, seed=0, epochs=2, batch=2), rel=1e-12)
    assert res0.steps == 2 * 2 and res0.reduced_examples == 3  # every sequence reduced (no limit): one beam each
    # the defaults: beam 5, pad 0
    mitigation.entropy_finetune(model.eval(), (seqs, labels), 1.0, lr=0.0)
    assert seen["beam_size"] == 5 and seen["pad_id"] == 0 and seen["show_progress"] is None and seen["n"] == 3
    assert not model.training


def _ce_of_last_batch(seqs, labels, seed, epochs, batch):
    """The loss of the last batch of the seeded shuffles, written out: weights 1, -1, 2 for ids 1, 2, 3."""
    g = torch.Generator().manual_seed(seed)
    w = {0: 0.0, 1: 1.0, 2: -1.0, 3: 2.0}
    for _ in range(epochs):
        perm = torch.randperm(len(seqs), generator=g).tolist()
    last = perm[(len(seqs) - 1) // batch * batch:]
    s = torch.tensor([sum(w[int(t)] for t in seqs[i]) for i in last], dtype=torch.float64)
    return torch.nn.functional.cross_entropy(torch.stack([-s / 2, s / 2], 1), labels[last]).item()


@pytest.mark.mutation
def test_entropy_finetune_pads_with_pad_id(monkeypatch):
    class ReadsPads(nn.Module):
        """Counts the pad id wherever it is, attended or not: pads must be pad_id."""

        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.zeros(1, dtype=torch.float64))
            self.pads = []

        def forward(self, ids, attention_mask):
            self.pads.append(int((ids == 9).sum()))
            s = self.w * ids.shape[1] * torch.ones(ids.shape[0], dtype=torch.float64)
            return torch.stack([-s, s], 1)

    model = ReadsPads()
    monkeypatch.setattr(mitigation, "input_reduction",
                        lambda m, to_reduce, **kw: [_fake_reduction([[0]]) for _ in to_reduce])
    res = mitigation.entropy_finetune(model, ([torch.tensor([1, 2, 3]), torch.tensor([1])], torch.tensor([0, 1])),
                                      1.0, pad_id=9, lr=0.0)
    # the tuned copy saw one regular batch (2 pads behind the short sequence) and one reduced batch of two
    # one-token reductions (no pads); the original model ran nothing (input_reduction is the recorder)
    assert res.model.pads == [2, 0] and model.pads == []


@pytest.mark.mutation
@pytest.mark.parametrize("progress,shown", [(True, True), (False, False), (None, True)])
def test_entropy_finetune_progress_bar(monkeypatch, progress, shown):
    from helpers import fake_terminal

    monkeypatch.setattr(mitigation, "input_reduction",
                        lambda m, to_reduce, **kw: [_fake_reduction([[0]]) for _ in to_reduce])
    terminal = fake_terminal(monkeypatch)
    seqs = [torch.tensor([1, 2])] * 5
    mitigation.entropy_finetune(Weights([0.0, 1.0, -1.0]).eval(), (seqs, torch.zeros(5, dtype=torch.int64)), 1.0,
                                epochs=3, batch=2, show_progress=progress)
    terminal.assert_finished_bar(shown, "entropy fine-tuning", 9, "batch")  # 3 epochs of ceil(5 / 2) = 3 batches


@pytest.mark.mutation
def test_entropy_finetune_defaults_seeding_and_padding_of_reductions(monkeypatch):
    adam = recording_adam(monkeypatch)

    class ReadsPads(nn.Module):
        """Logits from the token ids; records, per call, the pad ids seen and the masked positions."""

        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(10, 2).double()
            self.calls = []

        def forward(self, ids, attention_mask):
            self.calls.append((int((ids == 9).sum()), int((~attention_mask).sum())))
            return (self.emb(ids) * attention_mask[..., None]).sum(1)

    torch.manual_seed(0)
    model = ReadsPads().eval()
    seqs = [torch.tensor([1, 2, 3])[: 2 + i % 2] for i in range(65)]
    labels = torch.tensor([i % 2 for i in range(65)])
    # every sequence reduces to two members, of 2 and 1 tokens: the reduced batches need padding
    monkeypatch.setattr(mitigation, "input_reduction",
                        lambda m, to_reduce, **kw: [_fake_reduction([[0, 1], [0]]) for _ in to_reduce])
    res = mitigation.entropy_finetune(model, (seqs, labels), 1.0, pad_id=9)
    assert adam == [{"lr": 1e-3}] and res.steps == 2  # the defaults: lr 1e-3, batches of 64 (65 sequences: 2 batches)
    assert res.reduced_examples == 130
    calls = res.model.calls
    assert len(calls) == 4 and all(pads == masked for pads, masked in calls)  # padding is pad_id, and only there
    assert calls[1][0] > 0  # the first reduced batch (64 draws of 1- and 2-token reductions) was padded
    # seeded by ``seed`` alone, not by torch's global generator
    torch.manual_seed(123)
    again = mitigation.entropy_finetune(model, (seqs, labels), 1.0, pad_id=9)
    assert again.final_loss == res.final_loss and again.model.calls == calls
    other = mitigation.entropy_finetune(model, (seqs, labels), 1.0, pad_id=9, seed=1)
    assert other.model.calls != calls or other.final_loss != res.final_loss


# ---------------------------------------------------- text/model.py: every check's whole message


@pytest.mark.mutation
def test_text_model_fn_output_checks():
    def returning(out):
        return TextModelFn(lambda ids, mask: out)

    ids, mask = torch.zeros(2, 3, dtype=torch.int64), torch.ones(2, 3, dtype=torch.bool)
    with pytest.raises(TypeError, match=whole_message("model must return a tensor of logits [B, K], got list")):
        returning([1.0, 2.0]).logits(ids, mask)
    for shape in ((2,), (3, 2), (2, 0), (2, 2, 1)):
        with pytest.raises(ValueError, match=whole_message(
                f"model must map ids [B, T] and attention_mask [B, T] to logits [B, K]; for B = 2 it returned shape "
                f"{shape}")):
            returning(torch.zeros(shape)).logits(ids, mask)
    assert returning(torch.zeros(2, 1)).logits(ids, mask).shape == (2, 1)  # one class is a valid output
    with pytest.raises(TypeError, match=whole_message("model must return floating-point logits, got torch.int64")):
        returning(torch.zeros(2, 2, dtype=torch.int64)).logits(ids, mask)


@pytest.mark.mutation
def test_deletion_scores_checks():
    class Deleting:
        def __init__(self, out):
            self.out = out

        def __call__(self, ids, mask):
            return torch.zeros(ids.shape[0], 2)

        def deletion_logits(self, ids, mask):
            return self.out

    ids, mask, y = torch.zeros(2, 3, dtype=torch.int64), torch.ones(2, 3, dtype=torch.bool), torch.tensor([0, 1])
    for out, shown in ((torch.zeros(2, 3), "(2, 3)"), (torch.zeros(2, 4, 2), "(2, 4, 2)"),
                       (torch.zeros(3, 3, 2), "(3, 3, 2)"), ([0.0], "list")):
        with pytest.raises(ValueError, match=whole_message(
                f"model.deletion_logits must return logits [B, T, K] for ids (2, 3), got {shown}")):
            TextModelFn(Deleting(out)).deletion_scores(ids, mask, y)
    f, top = TextModelFn(Deleting(torch.zeros(2, 3, 2))).deletion_scores(ids, mask, y)
    assert f.tolist() == [[0.5] * 3] * 2 and f.dtype == torch.float64 and top.shape == (2, 3)


@pytest.mark.mutation
def test_gradient_importance_checks():
    fn = TextModelFn(lambda ids, mask: torch.zeros(ids.shape[0], 2))
    ids, mask, y = torch.zeros(1, 2, dtype=torch.int64), torch.ones(1, 2, dtype=torch.bool), torch.tensor([0])
    with pytest.raises(ValueError, match=whole_message(
            'importance="gradient" needs the token embedding layer: pass embedding=<the nn.Embedding module> (the '
            "model has no get_input_embeddings() and not exactly one nn.Embedding)")):
        fn.gradient_importance(ids, mask, y)

    class Twice(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(4, 3)

        def forward(self, ids, mask):
            return (self.emb(ids) + self.emb(ids)).sum(1)[:, :2]

    with pytest.raises(ValueError, match=whole_message(
            "the embedding module ran 2 times in one forward call; expected once")):
        TextModelFn(Twice().eval()).gradient_importance(ids, mask, y)

    class Flat(nn.Module):
        """Its "embedding" maps the ids [1, 2] to [2, 2], not [B, T, dim]."""

        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(2, 2)

        def forward(self, ids, mask):
            e = self.lin(ids.float().view(-1, 1).expand(-1, 2))
            return e.sum(0, keepdim=True)

    flat = Flat().eval()
    with pytest.raises(ValueError, match=whole_message(
            "the embedding output has shape (2, 2); expected [B, T, dim] for ids (1, 2)")):
        TextModelFn(flat, embedding=flat.lin).gradient_importance(ids, mask, y)


@pytest.mark.mutation
def test_check_sequences_messages_and_pad_batch():
    from overinterp_fast.text.model import HFSequenceClassifier, check_sequences, pad_batch

    with pytest.raises(ValueError, match=whole_message(
            "a tensor of sequences must be padded [N, T] with attention_mask=; got shape (3,) (or pass a list of "
            "1-D tensors)")):
        check_sequences(torch.tensor([1, 2, 3]), None, None)
    with pytest.raises(ValueError, match=whole_message(
            "a padded [N, T] tensor of sequences needs attention_mask= (bool [N, T], False on padding)")):
        check_sequences(torch.ones(2, 3, dtype=torch.int64), None, None)
    for bad in (torch.ones(2, 2, dtype=torch.bool), [[True] * 3] * 2):
        with pytest.raises(ValueError, match=whole_message(
                "attention_mask must be a tensor of the sequences' shape (2, 3)")):
            check_sequences(torch.ones(2, 3, dtype=torch.int64), bad, None)
    ids, m = pad_batch([torch.tensor([4, 5]), torch.tensor([6])])
    assert ids.tolist() == [[4, 5], [6, 0]] and ids.dtype == torch.int64 and m.tolist() == [[True, True],
                                                                                               [True, False]]
    ids, _ = pad_batch([torch.tensor([4, 5], dtype=torch.int32), torch.tensor([6], dtype=torch.int32)], 9)
    assert ids.tolist() == [[4, 5], [6, 9]] and ids.dtype == torch.int64

    class FakeHF(nn.Module):
        pass

    hf = FakeHF().eval()
    assert HFSequenceClassifier(hf).training is False and HFSequenceClassifier(hf.train()).training is True


@pytest.mark.mutation
def test_check_sequences_every_message():
    from overinterp_fast.text.model import check_sequences

    ones = torch.ones(2, 3, dtype=torch.int64)
    with pytest.raises(ValueError, match=whole_message(
            "attention_mask rows must be left-aligned: True on the tokens, then False on padding")):
        check_sequences(ones, torch.tensor([[1, 1, 0], [0, 1, 1]]).bool(), None)
    got = check_sequences(ones * 3, torch.tensor([[1, 1, 0], [1, 1, 1]]), None)  # 0/1 ints as a mask
    assert [s.tolist() for s in got] == [[3, 3], [3, 3, 3]]
    with pytest.raises(ValueError, match=whole_message(
            "attention_mask= goes with a padded [N, T] tensor, not with a list of sequences")):
        check_sequences([torch.tensor([1])], torch.ones(1, 1, dtype=torch.bool), None)
    with pytest.raises(TypeError, match=whole_message(
            "sequences must be a list of 1-D int64 tensors or a padded [N, T] tensor, got str")):
        check_sequences("1 2 3", None, None)
    assert [s.tolist() for s in check_sequences((torch.tensor([2]),), None, None)] == [[2]]  # a tuple is fine
    with pytest.raises(ValueError, match=whole_message("no sequences given (N = 0)")):
        check_sequences([], None, None)
    with pytest.raises(ValueError, match=whole_message("no sequences given (N = 0)")):
        check_sequences(torch.ones(0, 3, dtype=torch.int64), torch.ones(0, 3, dtype=torch.bool), None)
    for bad in ([1, 2], torch.ones(1, 2, dtype=torch.int64)):
        with pytest.raises(TypeError, match=whole_message("sequence 1 must be a 1-D tensor of token ids")):
            check_sequences([torch.tensor([1]), bad], None, None)
    for dtype in (torch.float32, torch.complex64, torch.bool):
        with pytest.raises(TypeError, match=whole_message(f"sequence 0 must hold integer token ids, got {dtype}")):
            check_sequences([torch.ones(2, dtype=dtype)], None, None)
    with pytest.raises(ValueError, match=whole_message(
            "sequence 1 is empty; every sequence needs at least one token")):
        check_sequences([torch.tensor([1]), torch.tensor([], dtype=torch.int64)], None, None)
    with pytest.raises(ValueError, match=whole_message(
            "sequence 0 has token id -1, outside the vocabulary [0, 5)")):
        check_sequences([torch.tensor([-1, 7])], None, 5)  # the negative id is named first
    with pytest.raises(ValueError, match=whole_message("sequence 0 has token id 5, outside the vocabulary [0, 5)")):
        check_sequences([torch.tensor([0, 4, 5])], None, 5)
    with pytest.raises(ValueError, match=whole_message(
            "sequence 0 has token id -2, outside the vocabulary [0, inf)")):
        check_sequences([torch.tensor([-2])], None, None)
    got = check_sequences([torch.tensor([0, 4], dtype=torch.int32), torch.tensor([10 ** 6])], None, None)
    assert [s.dtype for s in got] == [torch.int64, torch.int64] and got[1].tolist() == [10 ** 6]
    assert check_sequences([torch.tensor([4])], None, 5)[0].tolist() == [4]  # the last id of the vocabulary


@pytest.mark.mutation
def test_text_model_fn_argument_messages_and_the_embedding_found():
    from overinterp_fast.text.model import find_embedding

    with pytest.raises(TypeError, match=whole_message("model must be a torch.nn.Module or a callable, got str")):
        TextModelFn("model.pt")
    with pytest.raises(TypeError, match=whole_message(
            "embedding must be the model's token embedding module, got int")):
        TextModelFn(Weights([0.0]).eval(), embedding=3)

    class Two(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Embedding(3, 2), nn.Embedding(4, 2)

    assert find_embedding(Two()) is None and find_embedding(nn.Linear(2, 2)) is None  # not exactly one
    w = Weights([0.0, 1.0])
    assert find_embedding(w) is w.embedding and find_embedding(lambda ids, mask: ids) is None

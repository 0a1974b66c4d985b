"""text/sis.py and text/mitigation.py checked by hand: token_sis's checks with whole messages and what it hands
fast_sis per length group (a recorder in fast_sis's place), the float-to-id wrapper, and entropy_finetune's
checks, reductions, padding, step count and loss written out. test_text.py runs both end to end."""
import math

import pytest
import torch
from torch import nn

from overinterp_fast import api
from overinterp_fast.text import mitigation
from overinterp_fast.text.reduction import InputReduction, Reduction
from overinterp_fast.text.sis import _IdsFromFloat, token_sis
from overinterp_fast.text.model import TextModelFn

from conftest import whole_message


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


def test_token_sis_groups_by_length_and_passes_every_option(monkeypatch):
    calls = []

    def fake_fast_sis(fn, rows, taus, **kw):
        calls.append({"fn": fn, "rows": rows, "taus": taus, **kw})
        return [f"result of row {r.tolist()}" for r in rows]

    monkeypatch.setattr(api, "fast_sis", fake_fast_sis)
    model = Weights([0.0] * 9).eval()
    seqs = [torch.tensor([2, 3, 4]), torch.tensor([5]), torch.tensor([6, 7, 8]), torch.tensor([1, 2])]
    out = token_sis(model, seqs, [0.1, 0.2, 0.3, 0.4], mask_id=7, target=torch.tensor([1, 0, 0, 1]),
                    collection=True, batch_size=3, progress=False)
    assert out == ["result of row [2.0, 3.0, 4.0]", "result of row [5.0]", "result of row [6.0, 7.0, 8.0]",
                   "result of row [1.0, 2.0]"]
    assert [c["rows"].tolist() for c in calls] == [[[5.0]], [[1.0, 2.0]], [[2.0, 3.0, 4.0], [6.0, 7.0, 8.0]]]
    assert all(c["rows"].dtype == torch.float64 for c in calls)  # float64 holds every id exactly
    assert [c["taus"].tolist() for c in calls] == [[0.2], [0.4], [0.1, 0.3]]
    assert [c["target"].tolist() for c in calls] == [[0], [1], [1, 0]]
    for c in calls:
        assert c["mask_value"] == 7.0 and isinstance(c["mask_value"], float)
        assert c["collection"] is True and c["batch_size"] == 3 and c["progress"] is False
        assert isinstance(c["fn"], _IdsFromFloat) and c["fn"].fn.model is model
    calls.clear()
    token_sis(model, seqs[:2], mask_id=0, target=1)  # one target for all; the defaults
    assert [c["target"].tolist() for c in calls] == [1, 1]
    assert [c["taus"].tolist() for c in calls] == [[0.9], [0.9]]
    assert all(c["collection"] is False and c["batch_size"] is None and c["progress"] is None for c in calls)
    calls.clear()
    token_sis(model, seqs[:1], 0.5, mask_id=0)
    assert calls[0]["target"] is None and calls[0]["taus"].dtype == torch.float64


def test_token_sis_takes_padded_rows_and_checks_the_vocabulary(monkeypatch):
    calls = []
    monkeypatch.setattr(api, "fast_sis", lambda fn, rows, taus, **kw: calls.append(rows) or [None] * len(rows))
    model = Weights([0.0] * 9).eval()
    padded = torch.tensor([[2, 3, 4], [5, 0, 0]])
    token_sis(model, padded, 0.5, mask_id=1, attention_mask=torch.tensor([[1, 1, 1], [1, 0, 0]]).bool())
    assert [r.tolist() for r in calls] == [[[5.0]], [[2.0, 3.0, 4.0]]]  # the real tokens only
    with pytest.raises(ValueError, match="outside the vocabulary"):
        token_sis(model, [torch.tensor([2, 9])], mask_id=1)


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


def test_entropy_finetune_loss_steps_and_reductions_by_hand(monkeypatch):
    model = Weights([0.0, 1.0, -1.0, 2.0]).train()
    seqs = [torch.tensor([1, 2, 3]), torch.tensor([3]), torch.tensor([2, 2])]
    labels = torch.tensor([1, 0, 1])
    seen = {}

    def fake_reduction(m, to_reduce, *, beam_size, pad_id, progress):
        seen.update(training=m.training, n=len(to_reduce), beam_size=beam_size, pad_id=pad_id, progress=progress)
        return [_fake_reduction([[0, 2]])] + [_fake_reduction([[0]]) for _ in to_reduce[1:]]

    monkeypatch.setattr(mitigation, "input_reduction", fake_reduction)
    res = mitigation.entropy_finetune(model, (seqs, labels), 2.0, beam_size=3, epochs=1, lr=0.0, batch=8,
                                      pad_id=0, reduce_limit=1, progress=False)
    assert seen == {"training": False, "n": 1, "beam_size": 3, "pad_id": 0, "progress": False}
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
    assert seen["beam_size"] == 5 and seen["pad_id"] == 0 and seen["progress"] is None and seen["n"] == 3
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


@pytest.mark.parametrize("progress,shown", [(True, True), (False, False), (None, True)])
def test_entropy_finetune_progress_bar(monkeypatch, progress, shown):
    from conftest import fake_terminal

    monkeypatch.setattr(mitigation, "input_reduction",
                        lambda m, to_reduce, **kw: [_fake_reduction([[0]]) for _ in to_reduce])
    terminal = fake_terminal(monkeypatch)
    seqs = [torch.tensor([1, 2])] * 5
    mitigation.entropy_finetune(Weights([0.0, 1.0, -1.0]).eval(), (seqs, torch.zeros(5, dtype=torch.int64)), 1.0,
                                epochs=3, batch=2, progress=progress)
    terminal.assert_finished_bar(shown, "entropy fine-tuning", 9, "batch")  # 3 epochs of ceil(5 / 2) = 3 batches


def test_entropy_finetune_defaults_seeding_and_padding_of_reductions(monkeypatch):
    rates = []

    class RecordingAdam(torch.optim.Adam):
        def __init__(self, params, lr):
            rates.append(lr)
            super().__init__(params, lr=lr)

    monkeypatch.setattr(torch.optim, "Adam", RecordingAdam)

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
    assert rates == [1e-3] and res.steps == 2  # the defaults: lr 1e-3, batches of 64 (65 sequences: 2 batches)
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

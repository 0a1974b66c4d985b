"""Input reduction (Feng et al. 2018) with beam search, packed across sequences.

(docs: algorithms.md, Input reduction)

Every round, the members of the beams of all sequences still running are expanded together. Their candidates
(leave-one-out: every one-token deletion of every member; gradient: the k_b chosen deletions) are built on the
device by one gather from index tensors, left-aligned and padded, and scored in shared batches whose width is
the longest row of the batch (rows are kept in non-increasing length: sequences are processed longest first and
each round removes one token from every running sequence, so their order never changes). Selection, validity,
de-duplication and ranking are tensor operations too; the host only learns, once per round, how many members
each sequence keeps.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import torch
from tqdm.auto import tqdm

from ..runtime.renames import renamed_keywords
from ..runtime.model import check_targets
from .model import TextModelFn, check_sequences

IMPORTANCES = ("leave_one_out", "gradient")
BEAM_SIZE, IMPORTANCE = 5, IMPORTANCES[0]  # the defaults of input reduction (Feng et al.: beam 5), here only
_BITS = 62  # positions per int64 word of a kept-set bit pattern (sign bit unused)
# CPU: tokens per forward call. Measured on the bundled word CNN (1 thread): 2^12 tokens per call is fastest,
# 2^15 is 3x slower (activations spill the caches); its deletion_logits is fastest at about 2^10 rows' tokens.
_CPU_TOKENS_PER_BATCH = 1 << 12
_CPU_DELETION_TOKENS = 1 << 10
_CUDA_TOKENS_PER_BATCH = 1 << 19
_CUDA_DELETION_TOKENS = 1 << 17


@dataclass(repr=False)
class Reduction:
    """One reduced input: ``kept`` int64 [L'] ascending original positions; ``confidence`` f_y on it."""

    kept: torch.Tensor
    confidence: float

    def __repr__(self) -> str:
        return f"Reduction(kept={self.kept.tolist()}, confidence={self.confidence:.4g})"


@dataclass(repr=False)
class InputReduction:
    """Input reduction of one sequence.

    Attributes:
        kept: int64 [L'], ascending original positions of the reduction reported (the beam's best).
        ids: int64 [L'], its token ids.
        confidence: f_y on the reduction. original_confidence: f_y on the full sequence.
        target: y, the class held (the prediction on the full sequence unless given).
        beam: every final reduction, best first (all of the same, shortest length reached).
        steps: tokens removed (rounds in which the beam advanced). queries: sequences passed through the model.
        original_length: L.
    """

    kept: torch.Tensor
    ids: torch.Tensor
    confidence: float
    original_confidence: float
    target: int
    beam: list[Reduction]
    steps: int
    queries: int
    original_length: int = field(default=0)

    @property
    def length(self) -> int:
        return int(self.kept.numel())

    def __repr__(self) -> str:
        return (f"InputReduction(kept={self.kept.tolist()}, confidence={self.confidence:.4g}, "
                f"original_confidence={self.original_confidence:.4g}, target={self.target}, "
                f"length {self.original_length}->{self.length}, beam={len(self.beam)}, queries={self.queries})")


def _check_options(beam_size, importance, pad_id, batch_size) -> None:
    if isinstance(beam_size, bool) or not isinstance(beam_size, int) or beam_size < 1:
        raise ValueError(f"beam_size must be a positive int, got {beam_size!r}")
    if importance not in IMPORTANCES:
        raise ValueError(f"importance must be one of {IMPORTANCES}, got {importance!r}")
    if isinstance(pad_id, bool) or not isinstance(pad_id, int) or pad_id < 0:
        raise ValueError(f"pad_id must be a non-negative int, got {pad_id!r}")
    if batch_size is not None and (isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1):
        raise ValueError(f"batch_size must be a positive int or None, got {batch_size!r}")


class _Scorer:
    """Runs rows of non-increasing length through the model in chunks trimmed to each chunk's widest row."""

    def __init__(self, fn: TextModelFn, batch_size: int | None, device: torch.device):
        self.fn = fn
        self.batch_size = batch_size
        cuda = device.type == "cuda"
        self.tokens = _CUDA_TOKENS_PER_BATCH if cuda else _CPU_TOKENS_PER_BATCH
        self.deletion_tokens = _CUDA_DELETION_TOKENS if cuda else _CPU_DELETION_TOKENS

    def _chunks(self, lengths, tokens: int | None = None):
        """(start, stop, width) of each chunk of rows; ``lengths``: each row's length, non-increasing."""
        start, n = 0, len(lengths)
        while start < n:
            width = max(1, int(lengths[start]))
            rows = self.batch_size or max(1, (tokens or self.tokens) // width)
            yield start, min(n, start + rows), width
            start += rows

    def score(self, ids, mask, target, lengths: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """(f_y float64 [R], valid bool [R]) of rows ids [R, W] (``lengths``: each row's length, non-increasing)."""
        fs, oks = [], []
        for a, b, w in self._chunks(lengths):
            f, ok = self.fn.score_and_valid(ids[a:b, :w], mask[a:b, :w], target[a:b])
            fs.append(f)
            oks.append(ok)
        f = torch.cat(fs)
        if not bool(torch.isfinite(f).all()):
            raise FloatingPointError("the model produced NaN or inf scores on reduced inputs")
        return f, torch.cat(oks)

    def deletions(self, ids, mask, target, lengths: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """(f_y float64 [R, W], valid bool [R, W]) of every one-token deletion of rows ids [R, W], through the
        model's ``deletion_logits`` (chunked by the rows' tokens, as ``score``)."""
        fs, oks = [], []
        width = ids.shape[1]
        for a, b, w in self._chunks(lengths, self.deletion_tokens):
            f, ok = self.fn.deletion_scores(ids[a:b, :w], mask[a:b, :w], target[a:b])
            fs.append(torch.nn.functional.pad(f, (0, width - w)))
            oks.append(torch.nn.functional.pad(ok, (0, width - w)))
        f = torch.cat(fs)
        if not bool(torch.isfinite(f[mask]).all()):
            raise FloatingPointError("the model produced NaN or inf scores on reduced inputs")
        return f, torch.cat(oks)

    def gradient(self, ids, mask, target, lengths: Sequence[int]) -> torch.Tensor:
        """Gradient importance float64 [R, W] of rows ids [R, W]."""
        parts = []
        width = ids.shape[1]
        for a, b, w in self._chunks(lengths):
            imp = self.fn.gradient_importance(ids[a:b, :w], mask[a:b, :w], target[a:b])
            parts.append(torch.nn.functional.pad(imp, (0, width - w)))
        imp = torch.cat(parts)
        if not bool(torch.isfinite(imp).all()):
            raise FloatingPointError("the model produced NaN or inf gradients")
        return imp


def _rows(x: torch.Tensor, seq: torch.Tensor, pos: torch.Tensor, pad_id: int):
    """Token rows of kept positions: pos int64 [R, W] (-1 = padding) of sequences seq [R] -> (ids, mask)."""
    mask = pos >= 0
    ids = x[seq[:, None], pos.clamp(min=0)]
    return ids.masked_fill(~mask, pad_id), mask


def _delete(pos: torch.Tensor, length: torch.Tensor, member: torch.Tensor, drop: torch.Tensor) -> torch.Tensor:
    """Children: member rows of ``pos`` [M, W] (-1 padded) without their slot ``drop``: int64 [C, W - 1]."""
    w = max(1, pos.shape[1] - 1)
    t = torch.arange(w, device=pos.device)
    src = t[None, :] + (t[None, :] >= drop[:, None])
    child = pos[member[:, None], src.clamp(max=pos.shape[1] - 1)]
    return child.masked_fill(t[None, :] >= (length[member] - 1)[:, None], -1)


def _bit_words(pos: torch.Tensor, num_words: int) -> torch.Tensor:
    """Kept sets as bit patterns, int64 [R, num_words]; position p is bit 61 - p % 62 of word p // 62.

    For kept tuples of equal length, the lexicographically smaller tuple has the larger pattern (compared word
    by word): at the first position where the sets differ, the smaller tuple holds it.
    """
    valid = pos >= 0
    p = pos.clamp(min=0)
    val = torch.where(valid, torch.bitwise_left_shift(torch.ones_like(p), _BITS - 1 - p % _BITS),
                      torch.zeros_like(p))
    words = torch.zeros((pos.shape[0], num_words), dtype=torch.int64, device=pos.device)
    return words.scatter_add_(1, p // _BITS, val)


def _stable_order(order: torch.Tensor, key: torch.Tensor, descending: bool) -> torch.Tensor:
    """Reorder ``order`` by key[order], stably (earlier keys keep their order among equals)."""
    return order[torch.sort(key[order], stable=True, descending=descending).indices]


def _rank_pool(seq: torch.Tensor, f: torch.Tensor, words: torch.Tensor, k: int) -> torch.Tensor:
    """Pool of valid children -> indices of each sequence's new beam, grouped by sequence, best first.

    Duplicates (same sequence, same kept set) keep their highest f. Ranking: f descending, then the kept tuple
    lexicographically ascending; the first ``k`` per sequence stay.
    """
    order = torch.arange(seq.numel(), device=seq.device)
    order = _stable_order(order, f, True)
    for w in range(words.shape[1] - 1, -1, -1):
        order = _stable_order(order, words[:, w], True)
    order = _stable_order(order, seq, False)  # now (seq, kept tuple, f descending)
    s, wd = seq[order], words[order]
    dup = torch.zeros_like(order, dtype=torch.bool)
    dup[1:] = (s[1:] == s[:-1]) & (wd[1:] == wd[:-1]).all(1)
    order = order[~dup]
    order = _stable_order(order, f, True)
    order = _stable_order(order, seq, False)  # (seq, f descending, kept tuple)
    s = seq[order]
    first = torch.ones_like(s, dtype=torch.bool)
    first[1:] = s[1:] != s[:-1]
    idx = torch.arange(s.numel(), device=s.device)
    start = torch.cummax(torch.where(first, idx, torch.zeros_like(idx)), 0).values
    return order[(idx - start) < k]


@renamed_keywords(progress="show_progress")
def input_reduction(
    model,
    sequences,
    *,
    beam_size: int = BEAM_SIZE,
    importance: str = IMPORTANCE,
    target: int | torch.Tensor | None = None,
    pad_id: int = 0,
    batch_size: int | None = None,
    show_progress: bool | None = None,
    embedding: torch.nn.Module | None = None,
    attention_mask: torch.Tensor | None = None,
    incremental: bool = True,
) -> list[InputReduction]:
    """Input reduction by beam search (Feng et al. 2018; docs: algorithms.md, Input reduction), all sequences packed together.

    Args:
        model: ``model(ids int64 [B, T], attention_mask bool [B, T]) -> logits [B, K]`` (eval mode), or a
            Hugging Face sequence classifier (wrapped automatically).
        sequences: a list of 1-D int64 tensors of token ids, or a padded [N, T] tensor with ``attention_mask``
            (bool [N, T], True on the tokens, left-aligned).
        beam_size: k, the maximum beam size (1 = greedy reduction).
        importance: "leave_one_out" (f_y(b) - f_y(b without i); its children's scores come free) or
            "gradient" (<e_i, d f_y / d e_i>, one backward pass per member; needs the embedding layer).
        target: class y per sequence (int or [N]); None = the prediction on the full sequence.
        pad_id: token id written into padding (its attention mask is False).
        batch_size: rows per forward call; None = about 4k tokens per call on a CPU (1k for deletion_logits).
        show_progress: a progress bar (None: only on a terminal; ``progress``, its name before, still works with
            a FutureWarning).
        embedding: the token embedding module (gradient importance; also gives the vocabulary size checked);
            None = ``get_input_embeddings()`` or the model's only ``nn.Embedding``.
        incremental: leave-one-out through the model's ``deletion_logits(ids, mask) -> [B, T, K]`` when it has
            one (the bundled word CNN computes all L deletions of a row for about two forward passes); False
            builds and runs every deleted-token row. Queries count L per member either way.

    Returns:
        One :class:`InputReduction` per sequence, tensors on the CPU.
    """
    _check_options(beam_size, importance, pad_id, batch_size)
    fn = TextModelFn(model, embedding)
    use_deletions = bool(incremental) and fn.has_deletion_logits
    seqs = check_sequences(sequences, attention_mask, fn.vocab_size)
    packed = _pack(seqs, pad_id, fn.device)
    scorer = _Scorer(fn, batch_size, fn.device)
    with torch.no_grad():
        pos, targets, score0 = _full_sequences(fn, scorer, packed, target, pad_id)
    search = _BeamSearch.start(scorer, packed, targets, score0, pos, pad_id, beam_size, importance, use_deletions)
    search.bar = tqdm(total=len(seqs), unit="seq", desc=f"input reduction (beam {beam_size})",
                      disable=None if show_progress is None else not show_progress)
    search.run()
    search.bar.close()
    return search.results(score0)


@dataclass
class _Packed:
    """The sequences of one call in the internal order, longest first (stable), so that rows stay in
    non-increasing length every round."""

    x: torch.Tensor  # int64 [N, T] on the model's device, padded with pad_id (T: the longest)
    perm: list[int]  # perm[r]: the caller's index of row r
    lengths: list[int]  # the length of each row


def _pack(seqs: list[torch.Tensor], pad_id: int, dev: torch.device) -> _Packed:
    """:class:`_Packed` of the checked sequences ``seqs`` (1-D int64 on the host)."""
    n = len(seqs)
    lengths0 = [int(s.numel()) for s in seqs]
    perm = sorted(range(n), key=lambda i: -lengths0[i])
    t_max = lengths0[perm[0]]
    x = seqs[0].new_full((n, t_max), pad_id)  # int64 on the host (check_sequences), never torch's default device
    for r, i in enumerate(perm):
        x[r, : lengths0[i]] = seqs[i]
    return _Packed(x.to(dev), perm, [lengths0[i] for i in perm])


def _full_sequences(fn: TextModelFn, scorer: _Scorer, packed: _Packed, target, pad_id: int
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The full sequences through the model: (kept positions int64 [N, T] (-1 padded), targets int64 [N],
    f_y float64 [N]), rows in the internal order."""
    x, slen = packed.x, packed.lengths
    n, t_max = x.shape
    dev = x.device
    pos = torch.arange(t_max, device=dev).expand(n, t_max)
    slen_t = torch.tensor(slen, device=dev)
    pos = pos.masked_fill(pos >= slen_t[:, None], -1)
    ids0, mask0 = _rows(x, torch.arange(n, device=dev), pos, pad_id)
    logits = torch.cat([fn.logits(ids0[a:b, :w], mask0[a:b, :w]) for a, b, w in scorer._chunks(slen)])
    if not bool(torch.isfinite(logits).all()):
        raise FloatingPointError("the model's output on the full sequences contains NaN or inf")
    tgt_in = None if target is None else torch.as_tensor(target)
    if tgt_in is not None and tgt_in.dim() == 1 and tgt_in.numel() == n:
        tgt_in = tgt_in[torch.tensor(packed.perm)]
    targets = check_targets(tgt_in, n, logits.shape[1], logits.argmax(1), unit="sequence")
    score0 = torch.softmax(logits, 1).gather(1, targets[:, None]).view(-1).double()
    return pos, targets, score0


@dataclass
class _Active:
    """The beam members expanded in a round (those of at least 2 tokens)."""

    members: list[int]  # their indices among the beam's members
    pos: torch.Tensor  # int64 [A, W] kept positions, -1 padded (W: the longest of them)
    length: torch.Tensor  # int64 [A]
    length_h: list[int]  # the same on the host
    seq: torch.Tensor  # int64 [A] their sequences
    score: torch.Tensor  # float64 [A] f_y on each


@dataclass
class _BeamSearch:
    """The beam search of one call: the beams of all sequences, members grouped by sequence (internal order),
    each sequence's members best first, and what each sequence has spent and found."""

    scorer: _Scorer
    packed: _Packed
    targets: torch.Tensor  # int64 [N]
    pad_id: int
    beam_size: int
    importance: str
    use_deletions: bool
    m_pos: torch.Tensor  # int64 [M, T] each member's kept positions, -1 padded
    m_seq: torch.Tensor  # int64 [M] its sequence
    m_score: torch.Tensor  # float64 [M] f_y on it
    m_len: torch.Tensor  # int64 [M] its length
    host_seq: list[int]  # m_seq on the host
    host_len: list[int]  # m_len on the host
    queries: list[int]
    steps: list[int]
    final: dict[int, tuple[list[torch.Tensor], list[float]]] = field(default_factory=dict)
    bar: tqdm | None = None

    @classmethod
    def start(cls, scorer: _Scorer, packed: _Packed, targets: torch.Tensor, score0: torch.Tensor,
              pos: torch.Tensor, pad_id: int, beam_size: int, importance: str, use_deletions: bool) -> "_BeamSearch":
        """One member per sequence: the full sequence (its full-sequence query counted)."""
        n, dev = len(packed.lengths), packed.x.device
        return cls(scorer, packed, targets, pad_id, beam_size, importance, use_deletions, pos.clone(),
                   torch.arange(n, device=dev), score0.clone(), torch.tensor(packed.lengths, device=dev),
                   list(range(n)), list(packed.lengths), [1] * n, [0] * n)

    def run(self) -> None:
        """Rounds until every sequence has stopped (no valid child, or no member of 2 tokens left)."""
        while self.host_seq:
            active = [i for i, length in enumerate(self.host_len) if length >= 2]
            if not active:
                self.finish(list(range(len(self.host_seq))))
                break
            self.round(active)

    def round(self, active: list[int]) -> None:
        """Expand members ``active``: choose the k_b least important deletions of each, score those children,
        and keep each sequence's best ``beam_size`` valid ones as its new beam."""
        x = self.packed.x
        dev = x.device
        a_idx = torch.tensor(active, device=dev)
        a_len_h = [self.host_len[i] for i in active]
        w = max(a_len_h)
        a = _Active(active, self.m_pos[a_idx][:, :w], self.m_len[a_idx], a_len_h, self.m_seq[a_idx],
                    self.m_score[a_idx])
        kb = (a.length - 3).clamp(max=self.beam_size).clamp(min=1)
        with torch.no_grad():
            if self.importance == "leave_one_out":
                imp, f_all, ok_all, starts = self._leave_one_out(a)
            else:
                imp = self._gradient(a)
            sel_member, sel_drop = _least_important(imp, kb)
            if self.importance == "leave_one_out":
                c = starts[sel_member] + sel_drop
                f, ok = f_all[c], ok_all[c]
                child = _delete(a.pos, a.length, sel_member, sel_drop)
            else:
                child, f, ok = self._score_children(a, kb, sel_member, sel_drop)
            c_seq = a.seq[sel_member][ok]
            child, f = child[ok], f[ok]
            num_words = (x.shape[1] + _BITS - 1) // _BITS
            keep = _rank_pool(c_seq, f, _bit_words(child, num_words), self.beam_size)
            new_seq = c_seq[keep]
            new_seq_h = new_seq.tolist()
        self._advance(child, f, keep, new_seq, new_seq_h)

    def _leave_one_out(self, a: _Active) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Every one-token deletion of every member scored: (importance float64 [A, W] (inf past a member's
        end), f_y and validity of the children (member by member, slot by slot), each member's first child)."""
        x, dev = self.packed.x, self.packed.x.device
        w = a.pos.shape[1]
        slot = torch.arange(w, device=dev)
        member = torch.repeat_interleave(a.length)  # member m repeated a_len[m] times
        starts = torch.cumsum(a.length, 0) - a.length
        drop = torch.arange(member.numel(), device=dev) - starts[member]
        m_ids, m_mask = _rows(x, a.seq, a.pos, self.pad_id)
        if self.use_deletions:
            f_mat, ok_mat = self.scorer.deletions(m_ids, m_mask, self.targets[a.seq], a.length_h)
            f_all, ok_all = f_mat[member, drop], ok_mat[member, drop]
        else:
            child = _delete(a.pos, a.length, member, drop)
            c_ids, c_mask = _rows(x, a.seq[member], child, self.pad_id)
            f_all, ok_all = self.scorer.score(c_ids, c_mask, self.targets[a.seq[member]],
                                              np.repeat(np.asarray(a.length_h) - 1, a.length_h))
        # Deleting any token of a run of equal ids gives the same child: give every such child the
        # score of the run's first, so that exact ties stay exact (whatever batch each row ran in).
        run_start = torch.ones_like(a.pos, dtype=torch.bool)
        run_start[:, 1:] = m_ids[:, 1:] != m_ids[:, :-1]
        first = torch.cummax(torch.where(run_start, slot[None, :], torch.zeros_like(a.pos)), 1).values
        src = starts[member] + first[member, drop]
        f_all, ok_all = f_all[src], ok_all[src]
        imp = torch.full((len(a.members), w), float("inf"), dtype=torch.float64, device=dev)
        imp[member, drop] = a.score[member] - f_all
        for i, L in zip(a.members, a.length_h):
            self.queries[self.host_seq[i]] += L
        return imp, f_all, ok_all, starts

    def _gradient(self, a: _Active) -> torch.Tensor:
        """Gradient importance of every member's positions: float64 [A, W] (inf past a member's end)."""
        m_ids, m_mask = _rows(self.packed.x, a.seq, a.pos, self.pad_id)
        imp = self.scorer.gradient(m_ids, m_mask, self.targets[a.seq], a.length_h)
        slot = torch.arange(a.pos.shape[1], device=a.pos.device)
        imp = imp.masked_fill(slot[None, :] >= a.length[:, None], float("inf"))
        for i in a.members:
            self.queries[self.host_seq[i]] += 1
        return imp

    def _score_children(self, a: _Active, kb: torch.Tensor, sel_member: torch.Tensor, sel_drop: torch.Tensor
                        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Gradient importance: build and score the chosen children: (kept positions, f_y, valid)."""
        child = _delete(a.pos, a.length, sel_member, sel_drop)
        c_ids, c_mask = _rows(self.packed.x, a.seq[sel_member], child, self.pad_id)
        kb_h = kb.tolist()
        f, ok = self.scorer.score(c_ids, c_mask, self.targets[a.seq[sel_member]],
                                  np.repeat(np.asarray(a.length_h) - 1, kb_h))
        for i, k in zip(a.members, kb_h):
            self.queries[self.host_seq[i]] += k
        return child, f, ok

    def _advance(self, child: torch.Tensor, f: torch.Tensor, keep: torch.Tensor, new_seq: torch.Tensor,
                 new_seq_h: list[int]) -> None:
        """Finish the sequences that kept no child; the kept children ``child[keep]`` become the beams."""
        advanced = set(new_seq_h)
        stopped = [i for i, s in enumerate(self.host_seq) if s not in advanced]
        self.finish(stopped)
        for s in advanced:
            self.steps[s] += 1
        t_max = self.packed.x.shape[1]
        self.m_pos = torch.nn.functional.pad(child[keep], (0, t_max - child.shape[1]), value=-1)
        self.m_seq, self.m_score = new_seq, f[keep]
        self.host_seq = new_seq_h
        self.m_len = (self.m_pos >= 0).sum(1)
        self.host_len = self.m_len.tolist()

    def finish(self, members: list[int]) -> None:
        """The beams of ``members``' sequences are final: record every member (best first)."""
        if not members:
            return
        idx = torch.tensor(members, device=self.packed.x.device)
        rows, scores = self.m_pos[idx].cpu(), self.m_score[idx].cpu()
        for r, mi in enumerate(members):
            s = self.host_seq[mi]
            if s not in self.final:
                self.final[s] = ([], [])
            self.final[s][0].append(rows[r, : self.host_len[mi]])
            self.final[s][1].append(float(scores[r]))
        self.bar.update(len({self.host_seq[m] for m in members}))

    def results(self, score0: torch.Tensor) -> list[InputReduction]:
        """One :class:`InputReduction` per sequence, in the caller's order (``score0``: f_y on the full ones)."""
        packed = self.packed
        n = len(packed.lengths)
        out: list[InputReduction | None] = [None] * n
        targets_h = self.targets.tolist()
        score0_h = score0.tolist()
        x_cpu = packed.x.cpu()
        for s in range(n):
            rows, scores = self.final[s]
            beam = [Reduction(r.clone(), sc) for r, sc in zip(rows, scores)]
            best = beam[0].kept
            out[packed.perm[s]] = InputReduction(best, x_cpu[s, best], beam[0].confidence, score0_h[s],
                                                 targets_h[s], beam, self.steps[s], self.queries[s],
                                                 packed.lengths[s])
        return out


def _least_important(imp: torch.Tensor, kb: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The k_b least important positions of each member (ties: the lower position; slots ascend):
    (member, slot) of each, member by member. ``imp``: float64 [A, W]; ``kb``: int64 [A]."""
    ma, w = imp.shape
    slot = torch.arange(w, device=imp.device)
    rank = torch.sort(imp, dim=1, stable=True).indices
    chosen = slot[None, :] < kb[:, None]
    sel_member = torch.arange(ma, device=imp.device)[:, None].expand(ma, w)[chosen]
    return sel_member, rank[chosen]

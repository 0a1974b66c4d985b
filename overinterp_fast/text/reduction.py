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

from ..runtime.model import check_targets
from .model import TextModelFn, check_sequences

IMPORTANCES = ("leave_one_out", "gradient")
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


def input_reduction(
    model,
    sequences,
    *,
    beam_size: int = 5,
    importance: str = "leave_one_out",
    target: int | torch.Tensor | None = None,
    pad_id: int = 0,
    batch_size: int | None = None,
    progress: bool | None = None,
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
    dev = fn.device
    n = len(seqs)
    lengths0 = [int(s.numel()) for s in seqs]
    # Internal order: longest first (stable), so rows stay in non-increasing length every round.
    perm = sorted(range(n), key=lambda i: -lengths0[i])
    t_max = lengths0[perm[0]]
    x = seqs[0].new_full((n, t_max), pad_id)  # int64 on the host (check_sequences), never torch's default device
    for r, i in enumerate(perm):
        x[r, : lengths0[i]] = seqs[i]
    x = x.to(dev)
    slen = [lengths0[i] for i in perm]
    scorer = _Scorer(fn, batch_size, dev)
    num_words = (t_max + _BITS - 1) // _BITS

    with torch.no_grad():
        pos = torch.arange(t_max, device=dev).expand(n, t_max)
        slen_t = torch.tensor(slen, device=dev)
        pos = pos.masked_fill(pos >= slen_t[:, None], -1)
        ids0, mask0 = _rows(x, torch.arange(n, device=dev), pos, pad_id)
        logits = torch.cat([fn.logits(ids0[a:b, :w], mask0[a:b, :w]) for a, b, w in scorer._chunks(slen)])
        if not bool(torch.isfinite(logits).all()):
            raise FloatingPointError("the model's output on the full sequences contains NaN or inf")
        tgt_in = None if target is None else torch.as_tensor(target)
        if tgt_in is not None and tgt_in.dim() == 1 and tgt_in.numel() == n:
            tgt_in = tgt_in[torch.tensor(perm)]
        targets = check_targets(tgt_in, n, logits.shape[1], logits.argmax(1), unit="sequence")
        score0 = torch.softmax(logits, 1).gather(1, targets[:, None]).view(-1).double()

    # Beam state: members grouped by sequence (internal order), each sequence's members best first.
    m_pos, m_seq, m_score = pos.clone(), torch.arange(n, device=dev), score0.clone()
    m_len = slen_t.clone()
    host_seq = list(range(n))  # m_seq on the host
    host_len = list(slen)  # m_len on the host
    queries = [1] * n
    steps = [0] * n
    final: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    bar = tqdm(total=n, unit="seq", desc=f"input reduction (beam {beam_size})",
               disable=None if progress is None else not progress)

    def finish(members: list[int]) -> None:
        if not members:
            return
        idx = torch.tensor(members, device=dev)
        rows, scores = m_pos[idx].cpu(), m_score[idx].cpu()
        for r, mi in enumerate(members):
            s = host_seq[mi]
            if s not in final:
                final[s] = ([], [])
            final[s][0].append(rows[r, : host_len[mi]])
            final[s][1].append(float(scores[r]))
        bar.update(len({host_seq[m] for m in members}))

    while host_seq:
        active = [i for i, length in enumerate(host_len) if length >= 2]
        if not active:
            finish(list(range(len(host_seq))))
            break
        a_idx = torch.tensor(active, device=dev)
        a_len_h = [host_len[i] for i in active]
        a_pos, a_len, a_seq, a_score = m_pos[a_idx], m_len[a_idx], m_seq[a_idx], m_score[a_idx]
        w = max(a_len_h)
        a_pos = a_pos[:, :w]
        ma = len(active)
        kb = (a_len - 3).clamp(max=beam_size).clamp(min=1)
        slot = torch.arange(w, device=dev)
        with torch.no_grad():
            if importance == "leave_one_out":
                member = torch.repeat_interleave(a_len)  # member m repeated a_len[m] times
                starts = torch.cumsum(a_len, 0) - a_len
                drop = torch.arange(member.numel(), device=dev) - starts[member]
                m_ids, m_mask = _rows(x, a_seq, a_pos, pad_id)
                if use_deletions:
                    f_mat, ok_mat = scorer.deletions(m_ids, m_mask, targets[a_seq], a_len_h)
                    f_all, ok_all = f_mat[member, drop], ok_mat[member, drop]
                else:
                    child = _delete(a_pos, a_len, member, drop)
                    c_ids, c_mask = _rows(x, a_seq[member], child, pad_id)
                    f_all, ok_all = scorer.score(c_ids, c_mask, targets[a_seq[member]],
                                                 np.repeat(np.asarray(a_len_h) - 1, a_len_h))
                # Deleting any token of a run of equal ids gives the same child: give every such child the
                # score of the run's first, so that exact ties stay exact (whatever batch each row ran in).
                run_start = torch.ones_like(a_pos, dtype=torch.bool)
                run_start[:, 1:] = m_ids[:, 1:] != m_ids[:, :-1]
                first = torch.cummax(torch.where(run_start, slot[None, :], torch.zeros_like(a_pos)), 1).values
                src = starts[member] + first[member, drop]
                f_all, ok_all = f_all[src], ok_all[src]
                imp = torch.full((ma, w), float("inf"), dtype=torch.float64, device=dev)
                imp[member, drop] = a_score[member] - f_all
                for i, L in zip(active, a_len_h):
                    queries[host_seq[i]] += L
            else:
                m_ids, m_mask = _rows(x, a_seq, a_pos, pad_id)
                imp = scorer.gradient(m_ids, m_mask, targets[a_seq], a_len_h)
                imp = imp.masked_fill(slot[None, :] >= a_len[:, None], float("inf"))
                for i in active:
                    queries[host_seq[i]] += 1
            # The k_b least important positions of each member (ties: the lower position; slots ascend).
            rank = torch.sort(imp, dim=1, stable=True).indices
            chosen = slot[None, :] < kb[:, None]
            sel_member = torch.arange(ma, device=dev)[:, None].expand(ma, w)[chosen]
            sel_drop = rank[chosen]
            if importance == "leave_one_out":
                c = starts[sel_member] + sel_drop
                f, ok = f_all[c], ok_all[c]
                child = _delete(a_pos, a_len, sel_member, sel_drop)
            else:
                child = _delete(a_pos, a_len, sel_member, sel_drop)
                c_ids, c_mask = _rows(x, a_seq[sel_member], child, pad_id)
                kb_h = kb.tolist()
                f, ok = scorer.score(c_ids, c_mask, targets[a_seq[sel_member]],
                                     np.repeat(np.asarray(a_len_h) - 1, kb_h))
                for i, k in zip(active, kb_h):
                    queries[host_seq[i]] += k
            c_seq = a_seq[sel_member][ok]
            child, f = child[ok], f[ok]
            keep = _rank_pool(c_seq, f, _bit_words(child, num_words), beam_size)
            new_seq = c_seq[keep]
            new_seq_h = new_seq.tolist()
        advanced = set(new_seq_h)
        stopped = [i for i, s in enumerate(host_seq) if s not in advanced]
        finish(stopped)
        for s in advanced:
            steps[s] += 1
        m_pos = torch.nn.functional.pad(child[keep], (0, t_max - child.shape[1]), value=-1)
        m_seq, m_score = new_seq, f[keep]
        host_seq = new_seq_h
        m_len = (m_pos >= 0).sum(1)
        host_len = m_len.tolist()
    bar.close()

    out: list[InputReduction | None] = [None] * n
    targets_h = targets.tolist()
    score0_h = score0.tolist()
    x_cpu = x.cpu()
    for s in range(n):
        rows, scores = final[s]
        beam = [Reduction(r.clone(), sc) for r, sc in zip(rows, scores)]
        best = beam[0].kept
        out[perm[s]] = InputReduction(best, x_cpu[s, best], beam[0].confidence, score0_h[s], targets_h[s], beam,
                                      steps[s], queries[s], slen[s])
    return out

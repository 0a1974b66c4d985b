"""Token SIS with masking (Carter et al. 2019 on review text): exact SIS over token positions.

(docs: algorithms.md, Input reduction)

A masked token is replaced by ``mask_id`` and keeps its attention, so the length never changes. The exact engine
(overinterp_fast.methods.exact, through :func:`overinterp_fast.fast_sis`) runs unchanged: sequences of one length form
one batch of float64 "images" [n, L] holding the token ids, one feature per position, mask value ``mask_id``;
a thin wrapper hands the model the ids back (exact: float64 holds integers up to 2^53) with a full attention mask.
"""
from __future__ import annotations

import torch

from ..methods.results import SISResult
from ..runtime.renames import renamed_keywords
from .model import TextModelFn, check_sequences


class _IdsFromFloat:
    """Model of the engine's float rows [B, L] of token ids: the text model on (ids, all-True mask)."""

    def __init__(self, fn: TextModelFn):
        self.fn = fn

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        ids = x.round().to(torch.int64)
        return self.fn.logits(ids, torch.ones(ids.shape, dtype=torch.bool, device=ids.device))


@renamed_keywords(progress="show_progress")
def token_sis(
    model,
    sequences,
    threshold: float | list[float] | torch.Tensor = 0.9,
    *,
    mask_id: int,
    target: int | torch.Tensor | None = None,
    collection: bool = False,
    batch_size: int | None = None,
    show_progress: bool | None = None,
    attention_mask: torch.Tensor | None = None,
) -> list[SISResult]:
    """Exact SIS of every sequence over its token positions (docs: algorithms.md, Exact SIS and Input reduction).

    Args:
        model: ``model(ids int64 [B, T], attention_mask bool [B, T]) -> logits [B, K]`` or a Hugging Face
            sequence classifier.
        sequences: list of 1-D int64 tensors, or padded [N, T] with ``attention_mask``.
        threshold: tau, one for all or one per sequence.
        mask_id: the id a masked token becomes (e.g. the tokenizer's [UNK] or [MASK], or the pad id); its
            attention stays True.
        target, collection, batch_size, show_progress: as :func:`overinterp_fast.fast_sis` (``progress``, the
            name of ``show_progress`` before, still works with a FutureWarning).

    Returns:
        One :class:`~overinterp_fast.SISResult` per sequence; ``sis`` and ``order`` hold token positions.
    """
    from ..api import fast_sis  # the public engine; imported here, as api imports this package's parent

    fn = TextModelFn(model)
    seqs = check_sequences(sequences, attention_mask, fn.vocab_size)
    if isinstance(mask_id, bool) or not isinstance(mask_id, int) or mask_id < 0 or (
            fn.vocab_size is not None and mask_id >= fn.vocab_size):
        raise ValueError(f"mask_id must be a token id in the vocabulary [0, {fn.vocab_size or 'inf'}), got {mask_id!r}")
    n = len(seqs)
    taus = torch.as_tensor(threshold, dtype=torch.float64)
    taus = taus.expand(n) if taus.dim() == 0 else taus
    if taus.shape != (n,):
        raise ValueError(f"threshold must be a number or have one entry per sequence ({n})")
    tgt = None if target is None else torch.as_tensor(target)
    if tgt is not None and tgt.dim() == 1 and tgt.shape[0] != n:
        raise ValueError(f"target must be an int or have one entry per sequence ({n}), got shape {tuple(tgt.shape)}")
    wrapper = _IdsFromFloat(fn)
    out: list[SISResult | None] = [None] * n
    by_length: dict[int, list[int]] = {}
    for i, s in enumerate(seqs):
        by_length.setdefault(int(s.numel()), []).append(i)
    for length, idx in sorted(by_length.items()):
        rows = torch.stack([seqs[i] for i in idx]).to(device=fn.device, dtype=torch.float64)
        t = None if tgt is None else (tgt if tgt.dim() == 0 else tgt[idx])
        res = fast_sis(wrapper, rows, taus[idx], baselines=float(mask_id), target=t, collection=collection,
                       batch_size=batch_size, show_progress=show_progress)
        for i, r in zip(idx, res):
            out[i] = r
    return out

"""Paper 003's mitigation (section 4): fine-tune with log-likelihood on regular examples plus lambda times the
output entropy on reduced examples (every final beam member of input reduction on the training inputs)."""
from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from torch import nn
from tqdm.auto import tqdm

from ..runtime.renames import renamed_keywords
from .model import pad_batch
from .reduction import BEAM_SIZE, input_reduction


@dataclass
class EntropyFinetune:
    """The fine-tuned model (a copy, in eval mode) and what it was trained on."""

    model: nn.Module
    reduced_examples: int
    steps: int
    final_loss: float


@renamed_keywords(progress="show_progress")
def entropy_finetune(model: nn.Module, data: tuple[list[torch.Tensor], torch.Tensor], lam: float, *,
                     beam_size: int = BEAM_SIZE, epochs: int = 1, lr: float = 1e-3, batch: int = 64, seed: int = 0,
                     pad_id: int = 0, reduce_limit: int | None = None,
                     show_progress: bool | None = None) -> EntropyFinetune:
    """Fine-tune a copy of ``model``: minimise CE(regular batch) - lam * mean entropy(f(reduced batch)).

    Args:
        model: a text classifier ``model(ids, attention_mask) -> logits`` (nn.Module; left unchanged).
        data: (sequences: list of 1-D int64 tensors, labels: int64 [N]); the reduced examples X~ are every
            final beam member of input reduction (``beam_size``) of these sequences by ``model``.
        lam: lambda >= 0, the weight of the entropy term.
        reduce_limit: reduce only the first this many sequences (None: all); the log-likelihood term uses all.
    """
    seqs, labels = data
    labels = torch.as_tensor(labels, dtype=torch.int64)
    if len(seqs) == 0 or labels.shape != (len(seqs),):
        raise ValueError(f"data must be (sequences, labels [N]) with N >= 1; got {len(seqs)} sequences and labels "
                         f"of shape {tuple(labels.shape)}")
    if not (isinstance(lam, (int, float)) and lam >= 0):
        raise ValueError(f"lam must be a number >= 0, got {lam!r}")
    was_training = model.training
    model.eval()
    to_reduce = seqs if reduce_limit is None else seqs[:reduce_limit]
    reductions = input_reduction(model, to_reduce, beam_size=beam_size, pad_id=pad_id, show_progress=show_progress)
    model.train(was_training)
    reduced = [s[b.kept] for s, r in zip(to_reduce, reductions) for b in r.beam]
    tuned = copy.deepcopy(model).train()
    opt = torch.optim.Adam(tuned.parameters(), lr=lr)
    g = torch.Generator().manual_seed(seed)
    n, m = len(seqs), len(reduced)
    steps, loss_value = 0, float("nan")
    bar = tqdm(total=epochs * ((n + batch - 1) // batch), desc="entropy fine-tuning", unit="batch",
               disable=None if show_progress is None else not show_progress)
    for _ in range(epochs):
        perm = torch.randperm(n, generator=g).tolist()
        for s in range(0, n, batch):
            idx = perm[s : s + batch]
            ids, mask = pad_batch([seqs[i] for i in idx], pad_id)
            loss = nn.functional.cross_entropy(tuned(ids, mask), labels[idx])
            if lam > 0:
                ridx = torch.randint(m, (len(idx),), generator=g).tolist()
                rids, rmask = pad_batch([reduced[i] for i in ridx], pad_id)
                logp = torch.log_softmax(tuned(rids, rmask), dim=1)
                entropy = -(logp.exp() * logp).sum(1).mean()
                loss = loss - lam * entropy
            opt.zero_grad()
            loss.backward()
            opt.step()
            steps += 1
            loss_value = float(loss.detach())
            bar.update(1)
    bar.close()
    return EntropyFinetune(tuned.eval(), m, steps, loss_value)

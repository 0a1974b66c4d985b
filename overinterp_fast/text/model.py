"""Text classifiers as scores: the model contract, the Hugging Face adapter, input checks and scoring.

Contract: ``model(ids int64 [B, T], attention_mask bool [B, T]) -> logits [B, K]``; rows are left-aligned, the mask
is False on padding. Hugging Face sequence classifiers (``input_ids``, ``attention_mask`` -> ``.logits``) are
wrapped by :class:`HFSequenceClassifier`.
"""
from __future__ import annotations

import torch
from torch import nn


def is_hf_model(model) -> bool:
    """A transformers PreTrainedModel (detected by class name, so transformers is never imported here)."""
    return isinstance(model, nn.Module) and any(c.__name__ == "PreTrainedModel" for c in type(model).__mro__)


class HFSequenceClassifier(nn.Module):
    """Adapter: a Hugging Face sequence classifier as ``model(ids, attention_mask) -> logits``."""

    def __init__(self, hf_model: nn.Module):
        super().__init__()
        self.hf = hf_model
        self.training = hf_model.training

    def forward(self, ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.hf(input_ids=ids, attention_mask=attention_mask.long()).logits

    def get_input_embeddings(self) -> nn.Module:
        return self.hf.get_input_embeddings()


def find_embedding(model) -> nn.Embedding | None:
    """The model's token embedding: ``get_input_embeddings()`` where it exists, else its only nn.Embedding."""
    if hasattr(model, "get_input_embeddings"):
        return model.get_input_embeddings()
    if not isinstance(model, nn.Module):
        return None
    found = [m for m in model.modules() if isinstance(m, nn.Embedding)]
    return found[0] if len(found) == 1 else None


def model_device(model) -> torch.device | None:
    if isinstance(model, nn.Module):
        for t in model.parameters():
            return t.device
    return None


class TextModelFn:
    """A text classifier as the score f_y (softmax probability of class y), with checks on every output.

    ``embedding``: the token embedding module (needed for gradient importance and used to know the vocabulary
    size); None finds it (:func:`find_embedding`).
    """

    def __init__(self, model, embedding: nn.Module | None = None):
        if is_hf_model(model):
            model = HFSequenceClassifier(model)
        if not callable(model):
            raise TypeError(f"model must be a torch.nn.Module or a callable, got {type(model).__name__}")
        if isinstance(model, nn.Module) and any(m.training for m in model.modules()):
            raise ValueError("model is in training mode; call model.eval() first (dropout changes f between calls)")
        if embedding is not None and not isinstance(embedding, nn.Module):
            raise TypeError(f"embedding must be the model's token embedding module, got {type(embedding).__name__}")
        self.model = model
        self.embedding = embedding if embedding is not None else find_embedding(model)
        self.vocab_size = getattr(self.embedding, "num_embeddings", None)
        self.device = model_device(model) or torch.device("cpu")

    def logits(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Model output [B, K], checked for type and shape."""
        out = self.model(ids, mask)
        if not isinstance(out, torch.Tensor):
            raise TypeError(f"model must return a tensor of logits [B, K], got {type(out).__name__}")
        if out.dim() != 2 or out.shape[0] != ids.shape[0] or out.shape[1] < 1:
            raise ValueError(
                f"model must map ids [B, T] and attention_mask [B, T] to logits [B, K]; for B = {ids.shape[0]} "
                f"it returned shape {tuple(out.shape)}"
            )
        if not out.is_floating_point():
            raise TypeError(f"model must return floating-point logits, got {out.dtype}")
        return out

    def score_and_valid(self, ids, mask, target) -> tuple[torch.Tensor, torch.Tensor]:
        """(f_y float64 [B], bool [B]: argmax of the logits is y)."""
        out = self.logits(ids, mask)
        f = torch.softmax(out, dim=1).gather(1, target.view(-1, 1)).view(-1).double()
        return f, out.argmax(1) == target

    @property
    def has_deletion_logits(self) -> bool:
        return callable(getattr(self.model, "deletion_logits", None))

    def deletion_scores(self, ids, mask, target) -> tuple[torch.Tensor, torch.Tensor]:
        """Through the model's ``deletion_logits(ids, mask) -> [B, T, K]`` (row b without token i, for every i):
        (f_y float64 [B, T], argmax is y bool [B, T]); entries at padded positions are meaningless."""
        out = self.model.deletion_logits(ids, mask)
        if not isinstance(out, torch.Tensor) or out.dim() != 3 or tuple(out.shape[:2]) != tuple(ids.shape):
            raise ValueError(f"model.deletion_logits must return logits [B, T, K] for ids {tuple(ids.shape)}, got "
                             f"{tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__}")
        y = target.view(-1, 1, 1).expand(-1, ids.shape[1], 1)
        f = torch.softmax(out, dim=2).gather(2, y).squeeze(2).double()
        return f, out.argmax(2) == y.squeeze(2)

    def gradient_importance(self, ids, mask, target) -> torch.Tensor:
        """imp[b, i] = <e_i, d f_y / d e_i> for every position: float64 [B, T] (padding included; ignore it)."""
        if self.embedding is None:
            raise ValueError(
                'importance="gradient" needs the token embedding layer: pass embedding=<the nn.Embedding module> '
                "(the model has no get_input_embeddings() and not exactly one nn.Embedding)"
            )
        grabbed = []

        def hook(module, args, out):
            e = out.detach().requires_grad_(True)
            grabbed.append(e)
            return e

        handle = self.embedding.register_forward_hook(hook)
        try:
            with torch.enable_grad():
                out = self.logits(ids, mask)
                f = torch.softmax(out, dim=1).gather(1, target.view(-1, 1)).sum()
                if len(grabbed) != 1:
                    raise ValueError(f"the embedding module ran {len(grabbed)} times in one forward call; expected once")
                (g,) = torch.autograd.grad(f, grabbed[0])
        finally:
            handle.remove()
        e = grabbed[0].detach()
        if e.shape[:2] != ids.shape:
            raise ValueError(f"the embedding output has shape {tuple(e.shape)}; expected [B, T, dim] for ids "
                             f"{tuple(ids.shape)}")
        return (e * g).sum(-1).double()


def pad_batch(seqs: list[torch.Tensor], pad_id: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-aligned, padded: (ids int64 [B, T], attention_mask bool [B, T])."""
    t = max(1, max(int(s.numel()) for s in seqs))
    ids = torch.full((len(seqs), t), pad_id, dtype=torch.int64)
    mask = torch.zeros((len(seqs), t), dtype=torch.bool)
    for i, s in enumerate(seqs):
        ids[i, : s.numel()] = s
        mask[i, : s.numel()] = True
    return ids, mask


def check_sequences(sequences, attention_mask, vocab_size: int | None) -> list[torch.Tensor]:
    """Validate and split the input into a list of 1-D int64 tensors (the real tokens of each sequence)."""
    if isinstance(sequences, torch.Tensor):
        if sequences.dim() != 2:
            raise ValueError(f"a tensor of sequences must be padded [N, T] with attention_mask=; got shape "
                             f"{tuple(sequences.shape)} (or pass a list of 1-D tensors)")
        if attention_mask is None:
            raise ValueError("a padded [N, T] tensor of sequences needs attention_mask= (bool [N, T], False on padding)")
        if not isinstance(attention_mask, torch.Tensor) or attention_mask.shape != sequences.shape:
            raise ValueError(f"attention_mask must be a tensor of the sequences' shape {tuple(sequences.shape)}")
        m = attention_mask.bool().cpu()
        lengths = m.sum(1)
        if bool((m != (torch.arange(m.shape[1]) < lengths[:, None])).any()):
            raise ValueError("attention_mask rows must be left-aligned: True on the tokens, then False on padding")
        seqs = [sequences[i, : int(lengths[i])] for i in range(sequences.shape[0])]
    else:
        if attention_mask is not None:
            raise ValueError("attention_mask= goes with a padded [N, T] tensor, not with a list of sequences")
        if not isinstance(sequences, (list, tuple)):
            raise TypeError(f"sequences must be a list of 1-D int64 tensors or a padded [N, T] tensor, got "
                            f"{type(sequences).__name__}")
        seqs = list(sequences)
    if len(seqs) == 0:
        raise ValueError("no sequences given (N = 0)")
    out = []
    for i, s in enumerate(seqs):
        if not isinstance(s, torch.Tensor) or s.dim() != 1:
            raise TypeError(f"sequence {i} must be a 1-D tensor of token ids")
        if s.dtype.is_floating_point or s.dtype.is_complex or s.dtype == torch.bool:
            raise TypeError(f"sequence {i} must hold integer token ids, got {s.dtype}")
        if s.numel() == 0:
            raise ValueError(f"sequence {i} is empty; every sequence needs at least one token")
        lo, hi = int(s.min()), int(s.max())
        if lo < 0 or (vocab_size is not None and hi >= vocab_size):
            bad = lo if lo < 0 else hi
            raise ValueError(f"sequence {i} has token id {bad}, outside the vocabulary [0, {vocab_size or 'inf'})")
        out.append(s.to(torch.int64))
    return out

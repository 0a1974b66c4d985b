"""A stored audit's plan and estimate (audit/planning.py), ``audit --dry-run``, and the progress bar's count of the
chunk in progress and its time left from the estimate (audit/stream.py's _Progress).

The estimate's arithmetic is checked with a clock that moves one second per reading (planning's own ``time``), so
every expectation is worked out by hand; the dry run through the command line.
"""
import os
import re
import time
import types

import numpy as np
import pytest
import torch

from overinterp_fast.audit import planning, store, stream, work
from overinterp_fast.audit.config import AuditConfig
from overinterp_fast.audit.sources import ImageSource
from overinterp_fast.cli import main
from overinterp_fast.runtime.estimate import Estimate
from helpers import export_tiny_cnn, fake_terminal, tiny_cnn

pytestmark = pytest.mark.usefixtures("one_torch_thread")
SIDE = 6  # 36 features: 666 candidates per image


class Photos(ImageSource):
    def photo(self, i):
        return np.random.default_rng(i).integers(0, 256, (SIDE, SIDE, 3), dtype=np.uint8)


def source(n):
    return Photos([f"im{i}" for i in range(n)], [i % 5 for i in range(n)], SIDE, description={"kind": "photos"})


@pytest.fixture
def ticking(monkeypatch):
    """planning's clock: 1.0, 2.0, 3.0, ... at its successive readings (the library's other clocks are real)."""
    count = iter(range(1, 10_000))
    monkeypatch.setattr(planning, "time", types.SimpleNamespace(perf_counter=lambda: float(next(count))))
    monkeypatch.setattr(planning, "TRIAL_WINDOW_S", 0.0)  # one batch per window


def test_a_trial_times_the_chunk_s_own_first_windows(ticking, tmp_path, monkeypatch):
    x = torch.stack([source(2)[i]["x"] for i in range(2)])
    config = AuditConfig(method="exact", threshold=0.5, batch_size=20, channels_last=False)
    rows = 2 * 666
    # readings: t0 = 1; the loop starts at 2 (nothing scored), the first window (20 candidates, with its warm-up)
    # ends at 5, the second (20 more) at 6, where 4 s have passed since the loop's start: the trial stops
    readings = iter([1.0, 2.0, 5.0, 6.0, 7.0, 8.0, 11.0, 12.0])
    monkeypatch.setattr(planning, "time", types.SimpleNamespace(perf_counter=lambda: next(readings)))
    full, left = planning.trial(tiny_cnn(3), x, [0.5, 0.5], config, rows)
    set_up, first_window, rate = 2 - 1, 5 - 2, (40 - 20) / (6 - 5)
    assert full == set_up + first_window + (rows - 20) / rate == 69.6
    assert left == full  # a dry run keeps nothing: the chunk starts over
    # a real run keeps the trial's work in the chunk's work folder: what is left is the set-up and the rest
    os.makedirs(os.path.join(tmp_path, store.PARTS_DIR))
    kept = work.ChunkWork(str(tmp_path), 0, [0, 1], 1, exact=True, every=1e9)
    kept.start(store.images_table([0, 1], ["a", "b"], [0, 1], [np.zeros((2, 2, 3), np.uint8)] * 2))
    full, left = planning.trial(tiny_cnn(3), x, [0.5, 0.5], config, rows, (kept, 0))  # readings 7, 8, 11, 12
    assert full == 69.6 and left == set_up + (rows - 40) / rate == 65.6
    saved = torch.load(work.state_path(str(tmp_path), 0, 0), weights_only=True)
    assert saved["bar"] == [40, rows]  # the state the chunk continues from


def test_a_long_audit_s_trial_runs_longer(ticking, tmp_path):
    """An audit of 5 such chunks is predicted at 5 x 67.6 s: the trial goes on to 5% of that (16.9 s, a reading a
    second, a window of 20 candidates between two), and what it scored is kept."""
    x = torch.stack([source(2)[i]["x"] for i in range(2)])
    config = AuditConfig(method="exact", threshold=0.5, batch_size=20, channels_last=False)
    os.makedirs(os.path.join(tmp_path, store.PARTS_DIR))
    kept = work.ChunkWork(str(tmp_path), 0, [0, 1], 1, exact=True, every=1e9)
    kept.start(store.images_table([0, 1], ["a", "b"], [0, 1], [np.zeros((2, 2, 3), np.uint8)] * 2))
    full, left = planning.trial(tiny_cnn(3), x, [0.5, 0.5], config, 2 * 666, (kept, 0), scale=5.0)
    assert full == 1 + 1 + (1332 - 20) / 20  # t0 = 1, the loop's start 2, windows end at 3, 4, ...
    # it stops at the first window that ends 17 s after the loop's start (17 >= 0.05 x 5 x 67.6): 17 windows
    assert torch.load(work.state_path(str(tmp_path), 0, 0), weights_only=True)["bar"][0] == 17 * 20
    assert left == 1 + (1332 - 17 * 20) / 20


def test_the_estimate_covers_every_chunk_left_of_the_busiest_rank(ticking, monkeypatch):
    # 10 images in chunks of 3: (0, 3), (3, 6), (6, 9), (9, 10); chunk 1 committed; 2 ranks deal chunks 0, 2, 3
    # round robin: rank 0 takes 0 and 3 (1 image), rank 1 takes 2
    calls = []

    def chunk(model, images, taus, config, kept=None, scale=1.0):
        calls.append((images.shape[0], kept, scale))
        return Estimate("a chunk", 100, "forward rows", 9.0, "here"), 4.0

    monkeypatch.setattr(planning, "chunk_estimate", chunk)
    monkeypatch.setattr(planning, "predict", lambda model, x, outputs="logits": (None, torch.full((x.shape[0],), 0.9)))
    plan = planning.plan_audit({"a": tiny_cnn(3)}, source(10), "out", AuditConfig(method="exact"), 3, {1},
                               torch.device("cpu"), world=2, report=False)
    # timed on the first chunk left (3 images), keeping nothing (no work folder given); rank 0's work: chunks 0 and
    # 3, 4 images, 4/3 of that chunk's
    assert calls == [(3, None, 4 / 3)]
    (m,) = plan.models
    assert m.predict_s == 1.0  # one reading apart
    # the first chunk: its predictions and what is left of it; chunk 3 (1 image of 3): a third of a chunk's time
    assert m.seconds == pytest.approx(1.0 + 4.0 + (9.0 + 1.0) / 3)
    final = planning.FINAL_PER_IMAGE_S * 10
    assert plan.seconds == pytest.approx(m.seconds + 2 * planning.CHUNK_FIXED_S + final)
    assert (plan.chunks, plan.committed, plan.left_chunks, plan.left_images) == (4, 1, 3, 7)
    assert plan.line().startswith("audit of 7 images (3 committed before) x 1 model (exact SIS, 3 chunks, 2 ranks): "
                                  "about 8.6 s on this CPU")
    assert plan.line().endswith(", 3.0 s per image")  # a chunk of 3 images in 9 s


def test_the_report_s_figures_at_the_time_of_one(monkeypatch):
    drawn = []
    monkeypatch.setattr("overinterp_fast.audit.report.image_figure", lambda *a: drawn.append(a))
    readings = iter([10.0, 10.5])  # the second figure, timed: 0.5 s (the first, with the library's start, is not)
    monkeypatch.setattr(planning, "time", types.SimpleNamespace(perf_counter=lambda: next(readings)))
    # 30 images, gallery 24, 2 models: 48 gallery figures and 2 x (3 + 2) = 10 others
    assert planning.report_seconds((8, 8, 3), 30, 2, 24) == (48 + 10) * 0.5
    assert len(drawn) == 2 and drawn[0][0].shape == (8, 8, 3) and drawn[0][2] is True


def test_dry_run_prints_the_plan_and_writes_nothing(tmp_path, capsys):
    from PIL import Image

    (tmp_path / "images").mkdir()
    for i in range(3):
        Image.fromarray(Photos.photo(None, i)).save(tmp_path / "images" / f"im{i}.png")
    model = export_tiny_cnn(tmp_path / "net.pt2", SIDE)
    out = tmp_path / "audit"
    argv = ["audit", "--model", model, "--images", str(tmp_path / "images"), "--size", str(SIDE), "--method",
            "exact", "--threshold", "0.5", "--chunk-size", "2", "--workers", "0", "--quiet", "--batch-size", "30",
            "--out", str(out)]
    assert main(argv + ["--dry-run"]) == 0
    said = capsys.readouterr().out.splitlines()
    assert said[:5] == [f"folder: {out}", "images: 3 x [3, 6, 6] (36 features); 3 left",
                        "chunks: 2 of 2 images; 0 committed, 2 to compute", "method: exact, threshold 0.5 (auto)",
                        "device: this CPU (1 threads); batch: 30 candidates per call"]  # given: channels_last off
    assert said[5].startswith("model net: a chunk: exact SIS of 2 images x 36 features: 1,332 forward rows")
    assert said[6].startswith("merge and report: ") and said[7].startswith("estimate: audit of 3 images x 1 model")
    assert said[-1] == "dry run: nothing was computed or written"
    assert not out.exists()
    # a folder with a chunk committed: the plan leaves it out; a changed option is refused as the run refuses it
    assert main(argv) == 0
    os.remove(store.part_path(str(out), 1, "results"))
    capsys.readouterr()
    assert main(argv + ["--dry-run"]) == 0
    said = capsys.readouterr().out
    assert "images: 3 x [3, 6, 6] (36 features); 1 left" in said and "1 committed, 1 to compute" in said
    assert main(argv + ["--dry-run", "--threshold", "0.6"]) == 2
    assert "threshold is 0.5 there, 0.6 here" in capsys.readouterr().err


def _commit(folder, chunk):
    os.makedirs(os.path.join(folder, store.PARTS_DIR), exist_ok=True)
    open(store.part_path(folder, chunk, "results"), "w").close()


def test_progress_counts_the_chunk_in_progress_and_says_the_estimate_until_a_job_is_done(monkeypatch, tmp_path):
    folder = str(tmp_path)
    ranges = store.chunk_ranges(7, 3)  # (0, 3), (3, 6), (6, 7)
    _commit(folder, 0)
    bar = stream._Progress(folder, ranges, 2, enabled=False, estimate_s=100.0)
    posted = []
    monkeypatch.setattr(bar.bar, "set_postfix_str", lambda s, refresh: posted.append(s))
    monkeypatch.setattr(bar.bar, "refresh", lambda: None)
    clock = iter([bar.t0 + 2.0, bar.t0 + 4.0, bar.t0 + 200.0])
    monkeypatch.setattr(stream.time, "perf_counter", lambda: next(clock))
    bar.update()  # nothing done since the start: the estimate, less the 2 s spent
    assert posted[-1] == "0 images/h, 01:38 left" and bar.bar.n == 6
    done = [3]
    bar.in_flight = lambda: done[0]  # 3 (model, image) jobs of chunk 1 finished: 1.5 images in 4 s
    bar.update()
    assert bar.bar.n == 9 and posted[-1] == "1,350 images/h, 00:06 left"  # 2.5 images left at 0.375 per second
    bar.in_flight = None  # the chunk's jobs leave the count before its commit: nothing done again, and the
    bar.update()  # estimate is spent (200 s of 100)
    assert posted[-1] == "0 images/h, - left"
    bar.stop.set()


def test_the_audit_says_one_estimate_for_all_its_chunks(tmp_path, capsys, monkeypatch):
    """Every run counts as long here: the audit says its own estimate, of its 3 images, once, whatever the log
    level, and none of its chunks' runs says theirs (each of 1 image)."""
    from overinterp_fast.runtime import estimate

    monkeypatch.setattr(estimate, "LONG_RUN_S", 0.0)
    from PIL import Image

    (tmp_path / "images").mkdir()
    for i in range(3):
        Image.fromarray(Photos.photo(None, i)).save(tmp_path / "images" / f"im{i}.png")
    model = export_tiny_cnn(tmp_path / "net.pt2", SIDE)
    assert main(["audit", "--model", model, "--images", str(tmp_path / "images"), "--size", str(SIDE), "--method",
                 "exact", "--threshold", "0.5", "--chunk-size", "1", "--workers", "0", "--quiet",
                 "--out", str(tmp_path / "audit")]) == 0
    said = [line for line in capsys.readouterr().err.splitlines() if line.startswith("overinterp-fast: ")]
    assert len(said) == 1 and said[0].startswith("overinterp-fast: audit of 3 images x 1 model (exact SIS, 3 chunks)")
    doc = store.read_doc(str(tmp_path / "audit"))
    assert doc["meta"]["estimate"] == said[0][len("overinterp-fast: "):]  # kept in the run's metadata


def test_the_chunk_s_candidates_have_their_own_bar_under_the_audit_s(tmp_path, monkeypatch):
    from overinterp_fast.audit.config import RunOptions, StoreOptions

    monkeypatch.setattr(planning, "TRIAL_S", 0.0)  # the estimate's trial stops after its first two windows,
    monkeypatch.setattr(planning, "TRIAL_WINDOW_S", 0.0)  # of one batch each (100 candidates at most)
    tty = fake_terminal(monkeypatch)
    stream.run_stored_audit({"net": tiny_cnn(3)}, source(2), str(tmp_path / "audit"),
                            AuditConfig(method="exact", threshold=0.5, batch_size=100),
                            StoreOptions(chunk_size=2, workers=0, report=False), RunOptions(show_progress=True))
    text = "".join(tty.text)
    assert "audit:" in text and "job" in text  # the audit's bar
    bars = [line for line in text.replace("\r", "\n").splitlines() if line.startswith("exact SIS:")]
    assert bars and all("cand" in b for b in bars)
    done, total = map(int, re.search(r"(\d+)/(\d+) \[", bars[0]).groups())
    assert total == 2 * 666 and 0 < done <= 200  # it starts where the estimate's trial left the chunk

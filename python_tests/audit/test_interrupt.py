"""Interrupted audits: Ctrl-C (SIGINT), SIGTERM and SIGKILL sent to ``overinterp-fast audit`` from outside, after
the first saved state or the first committed chunk. The interrupted run ends in one line (what it keeps, the
command that resumes), results.json says "interrupted" (SIGKILL: "running"), the chunk in progress keeps exact
SIS's state, and the rerun ends identical to an uninterrupted run, bit for bit.

Also: a partial audit's report, the progress bar over the chunk in progress, and a chunk's work folder by hand
(audit/work.py).
"""
import json
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import torch

from overinterp_fast.audit import store, work
from overinterp_fast.audit.config import AuditConfig, RunOptions, StoreOptions
from overinterp_fast.audit.persist import load_audit
from overinterp_fast.audit.sources import ImageSource
from overinterp_fast.audit.stream import run_stored_audit
from overinterp_fast.cli import main
from overinterp_fast.errors import Interrupted
from helpers import export_tiny_cnn, tiny_cnn

SIDE, N = 12, 4  # 144 features: 10,440 candidates per image, many windows of one batch at --checkpoint-every 0
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    from PIL import Image

    root = tmp_path_factory.mktemp("inputs")
    (root / "images").mkdir()
    rng = np.random.default_rng(5)
    for i in range(N):
        Image.fromarray(rng.integers(0, 256, (SIDE, SIDE, 3), dtype=np.uint8)).save(root / "images" / f"im{i}.png")
    export_tiny_cnn(root / "net.pt2", SIDE)
    return root


def cli_args(files, out, chunk, *extra):
    return ["audit", "--model", str(files / "net.pt2"), "--images", str(files / "images"), "--size", str(SIDE),
            "--method", "exact", "--threshold", "0.5", "--chunk-size", str(chunk), "--workers", "0", "--quiet",
            "--gallery", "2", "--out", str(out), *extra]


def uninterrupted(out, tmp_path):
    """The uninterrupted run of the audit stored in ``out`` (in this process, one thread, as the subprocesses): its
    stored configuration (and so the batch size and memory format its first run fixed, which a CPU measures) in a
    new folder, computed from scratch by ``audit --resume``."""
    fresh = tmp_path / "uninterrupted"
    fresh.mkdir()
    doc = store.read_doc(str(out))
    store.write_json(str(fresh / "results.json"), dict(doc, status="running"))
    assert main(["audit", "--resume", str(fresh)]) == 0
    return str(fresh)


def start(argv):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop(store.CRASH_ENV, None)
    return subprocess.Popen([sys.executable, "-m", "overinterp_fast", *argv], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def wait_for(path, p, timeout=120):
    deadline = time.time() + timeout
    while not os.path.exists(path):
        assert p.poll() is None, f"the audit ended first: {p.communicate()}"
        assert time.time() < deadline, f"{path} never appeared"
        time.sleep(0.005)


def assert_same_audit(out, reference):
    """Every order, value and SIS, and sis.parquet's rows, equal the uninterrupted run's; no work left behind."""
    a, b = load_audit(str(out)), load_audit(reference)
    assert a.image_names == b.image_names
    for ra, rb in zip(a.models[0].results, b.models[0].results, strict=True):
        assert torch.equal(ra.order, rb.order) and torch.equal(ra.values, rb.values)
        assert (ra.sis is None) == (rb.sis is None) and (ra.sis is None or torch.equal(ra.sis, rb.sis))
        assert (ra.target, ra.score, ra.threshold) == (rb.target, rb.score, rb.threshold)
    assert pq.read_table(os.path.join(out, "sis.parquet")).equals(pq.read_table(os.path.join(reference, "sis.parquet")))
    assert work.chunks_in_progress(str(out)) == [] and store.read_doc(str(out))["status"] == "complete"


def status(out):
    with open(os.path.join(out, "results.json")) as fh:
        return json.load(fh)["status"]


LINE = re.compile(r"^overinterp-fast: interrupted by (SIG\w+): (.+) keeps (.+); resume with: overinterp-fast audit "
                  r"--resume (.+)$")


def interrupted(argv, path, sig, code):
    """The command ``argv`` in a subprocess, sent ``sig`` once ``path`` exists: it exits with ``code``, without a
    traceback, on one line that says so (:data:`LINE`'s match)."""
    p = start(argv)
    wait_for(path, p)
    p.send_signal(sig)
    _, err = p.communicate(timeout=60)
    assert p.returncode == code, err
    assert "Traceback" not in err and len([ln for ln in err.splitlines() if "interrupted" in ln]) == 1, err
    m = LINE.match(err.strip().splitlines()[-1])
    assert m and m.group(1) == sig.name, err
    return m


@pytest.mark.slow  # a subprocess audit, then two in this process
@pytest.mark.timeout(150)  # measured 52 s wall on 2 shared cores at a load average of about 6.5
def test_ctrl_c_keeps_the_chunk_s_state_and_the_rerun_equals_an_uninterrupted_run(files, tmp_path, capsys):
    out = tmp_path / "audit"
    # once exact SIS saved chunk 0's state: mid-chunk
    m = interrupted(cli_args(files, out, 2, "--checkpoint-every", "0"), work.state_path(str(out), 0, 0),
                    signal.SIGINT, 130)
    assert m.group(2) == str(out) and m.group(4) == str(out)
    assert re.fullmatch(r"0 of 2 chunks committed \(0 of 4 images\), and work in progress \(chunk 0: 0 of 2 images "
                        r"finished, exact SIS saved at \d+(\.\d)?%\)", m.group(3)), m.group(3)
    assert status(out) == "interrupted"
    saved = torch.load(work.state_path(str(out), 0, 0), weights_only=True)["bar"]
    assert 0 < saved[0] < saved[1]  # part of the chunk's candidates
    assert main(["audit", "--resume", str(out), "-v"]) == 0  # the rerun, in this process (one thread alike)
    assert "exact SIS continues from its saved state" in capsys.readouterr().err
    assert_same_audit(out, uninterrupted(out, tmp_path))


@pytest.mark.slow  # a subprocess audit, then two in this process
@pytest.mark.timeout(150)  # measured 47 s wall on 2 shared cores at a load average of about 6.5
def test_sigterm_after_the_first_commit_says_one_line_and_the_report_is_partial(files, tmp_path, capsys):
    out = tmp_path / "audit"
    m = interrupted(cli_args(files, out, 1, "--checkpoint-every", "0"), store.part_path(str(out), 0, "results"),
                    signal.SIGTERM, 143)
    committed = len(store.committed_chunks(str(out)))
    assert m.group(3).startswith(f"{committed} of 4 chunks committed ({committed} of 4 images)")
    assert status(out) == "interrupted"
    # the report of the partial audit: marked, with the images committed so far
    assert main(["report", str(out)]) == 0
    said = capsys.readouterr().out
    assert said.startswith(f"wrote {out}/report.html (a partial audit: ")
    assert f"of 4 images ({committed} of 4 chunks committed" in said and "the audit is interrupted" in said
    html = open(out / "report.html").read()
    assert '<p class="partial" id="partial"><strong>Partial audit:</strong>' in html and "(partial)</h1>" in html
    assert f"overinterp-fast audit --resume {out}" in html  # the run table says how to go on
    assert main(cli_args(files, out, 1)) == 0  # the same command resumes
    assert f"4 chunks: {committed} already committed" in capsys.readouterr().out
    assert_same_audit(out, uninterrupted(out, tmp_path))


@pytest.mark.slow  # a subprocess audit, then two in this process
@pytest.mark.timeout(150)  # measured 35 s wall on 2 shared cores at a load average of about 6.5
def test_sigkill_after_a_saved_state_resumes_from_it(files, tmp_path, capsys):
    out = tmp_path / "audit"
    p = start(cli_args(files, out, 2, "--checkpoint-every", "0"))
    wait_for(work.state_path(str(out), 0, 0), p)
    p.send_signal(signal.SIGKILL)
    p.communicate(timeout=60)
    assert p.returncode == -signal.SIGKILL
    assert status(out) == "running"  # nothing ran after the kill
    assert main(cli_args(files, out, 2, "-v")) == 0
    assert "exact SIS continues from its saved state" in capsys.readouterr().err
    assert_same_audit(out, uninterrupted(out, tmp_path))


# ---------------------------------------------------------------------------------------------- in this process


class Photos(ImageSource):
    """Seeded random 8 x 8 photos; loading photo ``stop_at`` sends this process SIGINT (``stop_at`` None: never)."""

    stop_at = None

    def photo(self, i):
        if i == self.stop_at:
            os.kill(os.getpid(), signal.SIGINT)
        return np.random.default_rng(i).integers(0, 256, (SIDE, SIDE, 3), dtype=np.uint8)


def _source(stop_at=None):
    src = Photos([f"im{i}" for i in range(N)], [i % 5 for i in range(N)], SIDE, description={"kind": "photos"})
    src.stop_at = stop_at
    return src


def test_python_api_raises_interrupted_naming_what_is_kept(tmp_path):
    out = str(tmp_path / "audit")
    config = AuditConfig(method="exact", threshold=0.5)
    storage = StoreOptions(chunk_size=2, workers=0, report=False)
    quiet = RunOptions(show_progress=False)
    before = signal.getsignal(signal.SIGINT)
    with pytest.raises(Interrupted) as err:
        run_stored_audit({"net": tiny_cnn(3)}, _source(stop_at=2), out, config, storage, quiet)
    assert err.value.signal == "SIGINT" and err.value.folder == out
    assert err.value.kept == "1 of 2 chunks committed (2 of 4 images)"
    assert str(err.value) == (f"interrupted by SIGINT: {out} keeps 1 of 2 chunks committed (2 of 4 images); the "
                              f"same call resumes it")
    assert status(out) == "interrupted" and isinstance(err.value, KeyboardInterrupt)
    assert signal.getsignal(signal.SIGINT) is before  # put back
    run = run_stored_audit({"net": tiny_cnn(3)}, _source(), out, config, storage, quiet)
    assert (run.skipped, run.computed) == (1, 1) and status(out) == "complete"


def test_a_model_s_finished_images_are_read_back_not_computed_again(tmp_path):
    """ChunkWork by hand: a model whose finished images cover the chunk is read back; the rows equal what was
    stored; a committed chunk's work folder is removed when the folder is tidied."""
    from overinterp_fast import fast_sis

    folder = str(tmp_path)
    os.makedirs(os.path.join(folder, store.PARTS_DIR))
    x = torch.stack([_source()[i]["x"] for i in range(2)])
    results = fast_sis(tiny_cnn(3), x, 0.5, engine="torch", batch_size=64)
    w = work.ChunkWork(folder, 3, [6, 7], 4, exact=False, class_name=lambda c: f"class {c}")
    w.start(store.images_table([6, 7], ["a", "b"], [0, 1], [np.zeros((2, 2, 3), np.uint8)] * 2))
    calls = []
    got, seconds = w.model(0, lambda: calls.append(1) or results)
    assert calls == [1] and got is results and seconds >= 0
    again = work.ChunkWork(folder, 3, [6, 7], 4, exact=False)
    back, spent = again.model(0, lambda: pytest.fail("computed again"))
    assert spent == seconds and again.jobs_done() == 2
    for a, b in zip(back, results, strict=True):
        assert torch.equal(a.order, b.order) and torch.equal(a.values, b.values)
        assert (a.sis is None and b.sis is None) or torch.equal(a.sis, b.sis)
    done, meta = work.finished_results(folder, 3, 0)
    assert sorted(done) == [6, 7] and meta["class_names"] == {str(r.target): f"class {r.target}" for r in results}
    kept = work.in_progress(folder, 3, 1)
    assert kept.indices == [6, 7] and kept.done() == {6, 7} and kept.saved == [None]
    assert work.tidy(folder) == 0 and work.chunks_in_progress(folder) == [3]  # not committed: kept
    open(store.part_path(folder, 3, "results"), "w").close()  # committed (an empty stand-in part)
    assert work.tidy(folder) == 1 and work.chunks_in_progress(folder) == []


def test_a_partial_audit_reads_the_committed_chunks_and_the_images_finished_since(tmp_path):
    """load_partial by hand: chunk 0 committed, chunk 1 in progress with image 3 finished (its row moved from the
    committed part into a work folder, as a run interrupted there leaves it); the report is marked partial; the
    rerun completes the audit (chunk 1 again: no state was saved here) and removes the work folder a killed commit
    left behind."""
    import shutil

    from overinterp_fast.audit.partial import load_partial, partial_note
    from overinterp_fast.audit.report import rebuild_report

    out = str(tmp_path / "audit")
    config, quiet = AuditConfig(method="exact", threshold=0.5), RunOptions(show_progress=False)
    storage = StoreOptions(chunk_size=2, workers=0, report=False)
    first = run_stored_audit({"net": tiny_cnn(3)}, _source(), out, config, storage, quiet)
    complete = first.record
    where = work.work_dir(out, 1)
    os.makedirs(where)
    shutil.move(store.part_path(out, 1, "images"), os.path.join(where, work.IMAGES_FILE))
    part = pq.read_table(store.part_path(out, 1, "results"))
    os.remove(store.part_path(out, 1, "results"))
    kept = part.filter(pc.equal(part["image_index"], 3))  # as ChunkWork writes it: its seconds, its class names
    kept = kept.replace_schema_metadata({"overinterp_fast": json.dumps({"seconds": 1.5, "class_names": {}})})
    pq.write_table(kept, work.results_path(out, 1, 0))
    doc = store.read_doc(out)
    store.write_json(os.path.join(out, store.RESULTS_FILE), dict(doc, status="interrupted"))
    record = load_partial(out)
    assert record.image_names == ["im0", "im1", "im3"]
    for got, want in zip(record.models[0].results, [complete.models[0].results[i] for i in (0, 1, 3)]):
        assert torch.equal(got.order, want.order) and torch.equal(got.values, want.values)
    assert record.partial == ("3 of 4 images (1 of 2 chunks committed, and 1 images finished in chunks in progress; "
                              "the audit is interrupted)")
    assert partial_note(out) == f"a partial audit: {record.partial}"
    html = open(rebuild_report(out), encoding="utf-8").read()
    assert f"<strong>Partial audit:</strong> {record.partial}." in html
    os.makedirs(work.work_dir(out, 0))  # a commit killed before it removed its work folder
    again = run_stored_audit({"net": tiny_cnn(3)}, _source(), out, config, storage, quiet)
    assert (again.skipped, again.computed) == (1, 1) and work.chunks_in_progress(out) == []
    assert partial_note(out) is None and load_partial(out).partial is None
    for got, want in zip(again.record.models[0].results, complete.models[0].results, strict=True):
        assert torch.equal(got.order, want.order) and torch.equal(got.values, want.values)


def test_what_is_kept_shows_a_long_image_s_first_minutes(tmp_path, monkeypatch):
    """The saved share of a chunk in progress: one decimal below 10% (a 32 x 32 image's first minutes are about
    1% of it), whole percents above."""
    import types

    monkeypatch.setattr(work, "chunks_in_progress", lambda folder: [0])
    for share, said in ((0.012, "saved at 1.2%"), (0.0004, "saved at 0.0%"), (0.41, "saved at 41%")):
        monkeypatch.setattr(work, "in_progress", lambda folder, c, n, s=share: types.SimpleNamespace(
            done=lambda: [], saved=[s, 0.9]))
        text = work.kept(str(tmp_path), [(0, 4)], 2)
        assert text == f"0 of 1 chunks committed (0 of 4 images), and work in progress (chunk 0: 0 of 4 images " \
                       f"finished, exact SIS {said})", text

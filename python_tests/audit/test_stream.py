"""Audits at dataset scale: image sources, the durable store, resume after SIGKILL, torchrun sharding, gallery.

audit/stream.py's small pieces by hand: the images' digest, the stored configuration, the fixed batch size, the
count of committed images and rank 0's progress bar. The tests above run whole stored audits (resumes,
SIGKILL, two ranks).

Tests marked ``mutation`` were written for survivors of a mutation run (mutmut): they pin details that the behavioural tests above let through, with every expectation worked out by hand.
"""
import os
import pickle
import signal
import subprocess
import sys
import time
from dataclasses import replace

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
import overinterp_fast as of
from overinterp_fast.audit import lock, store
from overinterp_fast.audit.persist import load_audit
from overinterp_fast.audit.runner import thresholds_for
from overinterp_fast.audit.config import AuditConfig, RunOptions, StoreOptions
from overinterp_fast.audit.stream import fixed_batch_size, run_stored_audit
from overinterp_fast.cli import main
from overinterp_fast.audit.sources import open_images, select_range
from overinterp_fast.zoo.preprocessing import Preprocessing
import helpers  # noqa: E402
import hashlib
from overinterp_fast.audit import store, stream
from overinterp_fast.audit.sources import ImageSource
from helpers import fake_terminal
from helpers import run_cli, write_cifar  # noqa: F811

SIDE = 8
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TREE_CLASSES = 2  # the ImageFolder of these tests names two classes: its models have two outputs


def tiny_cnn(seed: int) -> torch.nn.Module:
    """helpers.tiny_cnn with the tree's two classes."""
    return helpers.tiny_cnn(seed, TREE_CLASSES)


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    """An ImageFolder: classes 'b_cat' (3 images) and 'a_dog' (4 images): a_dog is class 0."""
    from PIL import Image

    root = tmp_path_factory.mktemp("tree")
    rng = np.random.default_rng(0)
    for cls, count in (("b_cat", 3), ("a_dog", 4)):
        (root / cls).mkdir()
        for i in range(count):
            Image.fromarray(rng.integers(0, 256, (10, 12, 3), dtype=np.uint8)).save(root / cls / f"{i}.png")
    return root


@pytest.fixture(scope="module")
def model_file(tmp_path_factory):
    return helpers.export_tiny_cnn(tmp_path_factory.mktemp("model") / "net.pt2", SIDE, classes=TREE_CLASSES)




# ---------------------------------------------------------------------------------------------- inputs


def test_image_folder_labels_in_torchvision_class_order(tree):
    src = open_images(str(tree), SIDE)
    assert src.classes == ["a_dog", "b_cat"]
    assert src.image_names == ["a_dog/0", "a_dog/1", "a_dog/2", "a_dog/3", "b_cat/0", "b_cat/1", "b_cat/2"]
    assert src.image_labels == [0, 0, 0, 0, 1, 1, 1]
    flat = open_images(str(tree / "b_cat"), SIDE)
    assert flat.image_names == ["0", "1", "2"] and flat.image_labels == [None] * 3 and flat.classes is None
    with pytest.raises(ValueError, match="flat folder"):
        open_images(str(tree), SIDE, labels_file="labels.json")


def test_cifar_batches_and_select(tmp_path):
    data = write_cifar(tmp_path, 12)
    src = open_images(dataset="cifar10", data_dir=str(tmp_path), mean=0.5, std=0.25)
    assert len(src) == 12 and src.size == 32 and src.classes[3] == "class3" and src.image_labels[:3] == [0, 1, 2]
    item = src[5]
    photo = data[5].reshape(3, 32, 32).transpose(1, 2, 0)  # CIFAR rows: 1024 red, 1024 green, 1024 blue
    assert np.array_equal(item["display"], photo) and item["label"] == 5
    torch.testing.assert_close(item["x"], (torch.from_numpy(photo).permute(2, 0, 1).float() / 255 - 0.5) / 0.25)
    part = src.subset(select_range(len(src), "3:9", limit=4))
    assert part.image_names == ["test/00003", "test/00004", "test/00005", "test/00006"]
    assert np.array_equal(part[2]["display"], photo)
    assert list(select_range(10, ":3")) == [0, 1, 2] and list(select_range(10, "8:")) == [8, 9]
    for bad in ("3", "a:b", "1:2:3"):
        with pytest.raises(ValueError, match="A:B"):
            select_range(10, bad)
    with pytest.raises(ValueError, match="no images selected"):
        select_range(10, "5:5")
    with pytest.raises(FileNotFoundError, match="cifar-10-batches-py"):
        open_images(dataset="cifar10", data_dir=str(tmp_path / "nowhere"))


# ---------------------------------------------------------------------------------------------- the store


def expected_chunks(model, src, chunk, folder, threshold=0.5):
    """fast_sis on each chunk of the source, built directly (what a stored audit must hold, bit for bit), in the
    memory format the audit in ``folder`` fixed when it started (measured, on its first model)."""
    channels_last = store.read_doc(folder)["config"]["channels_last"]
    out = []
    for a, b in store.chunk_ranges(len(src), chunk):
        x = torch.stack([src[i]["x"] for i in range(a, b)])
        with torch.no_grad():
            f0 = torch.softmax(model(x), 1).max(1).values
        # a stored audit runs the torch engine at a batch size fixed by the configuration
        out += of.fast_sis(model, x, thresholds_for(f0, threshold, "auto"), engine="torch",
                           batch_size=fixed_batch_size(src, chunk),
                           options=of.ExactOptions(channels_last=channels_last))
    return out


def assert_identical(a, b):
    assert len(a) == len(b)
    for ra, rb in zip(a, b):
        assert torch.equal(ra.order, rb.order) and torch.equal(ra.values, rb.values)
        assert (ra.sis is None) == (rb.sis is None) and (ra.sis is None or torch.equal(ra.sis, rb.sis))
        assert ra.target == rb.target and ra.score == rb.score and ra.threshold == rb.threshold


def test_stored_audit_resumes_and_checks_its_configuration(tree, tmp_path):
    model = tiny_cnn(3)
    src = open_images(str(tree), SIDE)
    out = str(tmp_path / "audit")
    config = AuditConfig(method="exact", threshold=0.5)
    storage = StoreOptions(chunk_size=3, workers=0, report=False)
    quiet = RunOptions(show_progress=False)
    run = run_stored_audit({"net": model}, src, out, config, storage, quiet)
    assert (run.chunks, run.skipped, run.computed) == (3, 0, 3)
    assert_identical(run.record.models[0].results, expected_chunks(model, src, 3, out))
    assert run.record.image_names == src.image_names and run.record.labels == src.image_labels
    assert sorted(os.listdir(os.path.join(out, "parts"))) == [f"c00000{c}.{k}.parquet" for c in range(3)
                                                               for k in ("images", "results")]
    rows = pq.read_table(os.path.join(out, "sis.parquet")).to_pylist()
    assert [r["image_index"] for r in rows] == list(range(7)) and [r["label"] for r in rows] == src.image_labels
    # delete one committed chunk: the rerun computes only that one and gives the same audit
    os.remove(store.part_path(out, 1, "results"))
    again = run_stored_audit({"net": model}, src, out, config, storage, quiet)
    assert (again.skipped, again.computed) == (2, 1)
    assert_identical(again.record.models[0].results, run.record.models[0].results)
    # another configuration is refused with one line naming the difference; --restart starts over
    with pytest.raises(ValueError, match=r"threshold is 0.5 there, 0.6 here.*--restart"):
        run_stored_audit({"net": model}, src, out, replace(config, threshold=0.6), storage, quiet)
    with pytest.raises(ValueError, match="chunk_size is 3 there, 2 here"):
        run_stored_audit({"net": model}, src, out, config, replace(storage, chunk_size=2), quiet)
    fresh = run_stored_audit({"net": model}, src, out, config, replace(storage, chunk_size=2, restart=True), quiet)
    assert (fresh.chunks, fresh.skipped, fresh.computed) == (4, 0, 4)
    assert_identical(fresh.record.models[0].results, expected_chunks(model, src, 2, out))


class PhotoPairs(torch.utils.data.Dataset):
    """(PIL image, label) pairs read from files: a torchvision-style dataset over the same photos as a folder."""

    def __init__(self, paths, labels):
        self.paths, self.targets = paths, labels

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, i):
        from PIL import Image

        with Image.open(self.paths[i]) as im:
            return im.convert("RGB"), self.targets[i]


def test_stored_audit_of_any_dataset_equals_the_folder_s(tree, tmp_path):
    """The same photos as a map-style dataset, streamed through DataLoader workers: the same results, bit for bit,
    as the folder source gives, and the labels and classes of the dataset."""
    from overinterp_fast.audit.sources import from_dataset

    folder = open_images(str(tree), SIDE)
    data = PhotoPairs(folder.paths, folder.labels)
    data.classes = folder.classes
    src = from_dataset(data, SIDE)
    model = tiny_cnn(3)
    run = run_stored_audit({"net": model}, src, str(tmp_path / "d"), AuditConfig(method="exact", threshold=0.5),
                           StoreOptions(chunk_size=3, workers=2, report=False), RunOptions(show_progress=False))
    assert_identical(run.record.models[0].results, expected_chunks(model, folder, 3, run.folder))
    assert run.record.labels == folder.image_labels and src.classes == ["a_dog", "b_cat"]
    assert [d.tolist() for d in run.record.displays] == [folder[i]["display"].tolist() for i in range(7)]
    assert store.read_doc(str(tmp_path / "d"))["config"]["images"]["type"].endswith("PhotoPairs")


def test_stored_preprocessing_is_part_of_the_configuration(tree, tmp_path):
    """A timm-style crop (8 x 8 from the shorter side at floor(8 / 0.875) = 9) is another configuration than the
    plain transform; a folder written before the preprocessing was recorded counts as the plain transform."""
    from overinterp_fast.zoo.preprocessing import from_timm_config

    out = str(tmp_path / "audit")
    config, storage, quiet = (AuditConfig(method="exact", threshold=0.5),
                              StoreOptions(chunk_size=4, workers=0, report=False), RunOptions(show_progress=False))
    model = tiny_cnn(3)
    first = run_stored_audit({"net": model}, open_images(str(tree), SIDE), out, config, storage, quiet)
    assert first.record.meta["preprocessing"] == {"size": 8, "library": "overinterp_fast", "resize": 8,
                                                  "crop_pct": 1.0, "interpolation": "bicubic",
                                                  "crop_mode": "center", "mean": 0.5, "std": 0.5}
    stored = store.read_doc(out)["config"]
    assert stored["preprocessing"] == {"library": "overinterp_fast", "resize": 8, "crop_pct": 1.0,
                                       "interpolation": "bicubic", "crop_mode": "center"}
    cropped = from_timm_config({"input_size": (3, SIDE, SIDE), "interpolation": "bilinear", "mean": (0.5,) * 3,
                                "std": (0.5,) * 3, "crop_pct": 0.875, "crop_mode": "center"})
    with pytest.raises(ValueError, match=r"^'.*audit' holds an audit with another configuration: preprocessing is "
                                         r"\{'library': 'overinterp_fast', 'resize': 8, .*\} there, \{'library': "
                                         r"'timm', 'resize': 9, 'crop_pct': 0\.875, 'interpolation': 'bilinear', "
                                         r"'crop_mode': 'center'\} here; rerun with --restart"):
        run_stored_audit({"net": model}, open_images(str(tree), cropped), out, config, storage, quiet)
    doc = store.read_doc(out)
    del doc["config"]["preprocessing"]  # as written before it was recorded
    store.write_json(os.path.join(out, store.RESULTS_FILE), doc)
    again = run_stored_audit({"net": model}, open_images(str(tree), SIDE), out, config, storage, quiet)
    assert (again.skipped, again.computed) == (2, 0)
    assert store.read_doc(out)["config"]["preprocessing"] == stored["preprocessing"]  # recorded from now on
    store.write_json(os.path.join(out, store.RESULTS_FILE), doc)  # the older folder again: the crop is refused
    with pytest.raises(ValueError, match=r"preprocessing is \{'library': 'overinterp_fast'.*\} there, "
                                         r"\{'library': 'timm'"):
        run_stored_audit({"net": model}, open_images(str(tree), cropped), out, config, storage, quiet)


def test_incomplete_audit_is_not_loaded(tree, tmp_path):
    src = open_images(str(tree), SIDE)
    out = str(tmp_path / "audit")
    run_stored_audit({"net": tiny_cnn(3)}, src, out, AuditConfig(method="exact", threshold=0.5),
                     StoreOptions(chunk_size=3, workers=0, report=False, load=False), RunOptions(show_progress=False))
    doc = store.read_doc(out)
    store.write_json(os.path.join(out, store.RESULTS_FILE), dict(doc, status="running"))
    with pytest.raises(ValueError, match="not complete"):
        load_audit(out)


def test_stored_audit_two_models_streams_through_workers(tree, tmp_path, capsys):
    """Two models, an ensemble, transfer counts summed over chunks, DataLoader worker processes, one progress bar."""
    a, b = tiny_cnn(3), tiny_cnn(4)
    src = open_images(str(tree), SIDE)
    run = run_stored_audit({"a": a, "b": b}, src, str(tmp_path / "o"),
                           AuditConfig(method="exact", threshold=0.5, ensemble=True),
                           StoreOptions(chunk_size=4, workers=2, gallery=2), RunOptions(show_progress=True))
    bar = capsys.readouterr().err
    assert "21/21" in bar and "images/h" in bar  # jobs: 7 images x 3 models, counted from the committed parts
    rec = run.record
    assert [m.name for m in rec.models] == ["a", "b", "ensemble (mean logits)"]
    assert_identical(rec.models[1].results, expected_chunks(b, src, 4, run.folder))
    # transfer[a][b]: b's accuracy against the labels on a's 5% subsets, over every image (by hand)
    subsets, _ = of.audit.pixel_subsets(torch.stack([src[i]["x"] for i in range(7)]), rec.models[0].results, 0.05)
    with torch.no_grad():
        acc = (b(subsets).argmax(1) == torch.tensor(src.image_labels)).double().mean().item()
    assert rec.transfer["reference"] == "labels" and rec.transfer["accuracy"][0][1] == pytest.approx(acc)
    html = open(os.path.join(run.folder, "report.html")).read()
    assert "A sample of 2 of the 7 images" in html and html.count('<div class="card">') == 2 * 3


def test_gallery_sample_picks_extremes_wrong_and_random():
    from overinterp_fast.audit.records import AuditRecord, ModelRecord
    from overinterp_fast.audit.report import gallery_sample
    from overinterp_fast.methods.results import SISResult

    def result(size, target):
        sis = None if size is None else torch.arange(size)
        return SISResult(order=torch.arange(10), values=torch.zeros(10), sis=sis, mask=None, target=target,
                         score=1.0, threshold=0.5)

    sizes = [5, 1, None, 9, 3, 4, 6, 2]
    targets = [0, 0, 0, 0, 1, 0, 0, 0]  # image 4 is wrong
    rec = AuditRecord("t", list("abcdefgh"), [np.zeros((2, 2), np.uint8)] * 8, [0] * 8, {}, [
        ModelRecord("m", "exact", [result(s, t) for s, t in zip(sizes, targets)])])
    picked = dict(gallery_sample(rec, 4, seed=0))
    assert picked[1] == ["smallest SIS of m"] and picked[3] == ["largest SIS of m"]
    assert picked[4] == ["wrong prediction of m"]
    assert len(picked) == 4 and list(picked.values()).count(["random sample"]) == 1
    assert [i for i, _ in gallery_sample(rec, 8)] == list(range(8))


# ---------------------------------------------------------------------------------------------- crashes, ranks


def cli_args(model_file, tree, out, *extra):
    return ["audit", "--model", model_file, "--images", str(tree), "--size", str(SIDE), "--method", "exact",
            "--threshold", "0.5", "--chunk-size", "2", "--workers", "0", "--quiet", "--gallery", "3",
            "--channels-last", "off", "--out", str(out), *extra]  # format fixed: runs compared bit for bit


def committed_rows(out):
    return pq.read_table(os.path.join(out, "sis.parquet")).to_pylist()


@pytest.fixture(scope="module")
def reference(model_file, tree, tmp_path_factory):
    """The uninterrupted single-process audit (one thread, as the subprocesses)."""
    out = tmp_path_factory.mktemp("ref") / "audit"
    assert main(cli_args(model_file, tree, out)) == 0
    return load_audit(str(out)), committed_rows(str(out))


def assert_same_audit(out, reference):
    record, rows = reference
    back = load_audit(str(out))
    assert back.image_names == record.image_names
    for ma, mb in zip(record.models, back.models):
        assert_identical(mb.results, ma.results)
    got = committed_rows(str(out))
    assert [(r["model"], r["image_index"]) for r in got] == [(r["model"], r["image_index"]) for r in rows]
    assert got == rows, "sis.parquet differs from the uninterrupted run's"
    assert len(store.committed_chunks(str(out))) == 4 and not [f for f in os.listdir(os.path.join(out, "parts"))
                                                                  if ".tmp-" in f]


@pytest.mark.slow  # one subprocess audit killed at each commit stage, then resumed, and the reference audit
@pytest.mark.timeout(450)  # measured 238 s wall (27 s CPU, mostly in subprocesses) on 2 shared cores at a load
# average of about 11, 34 s at 5
def test_sigkill_at_every_commit_stage_then_resume(model_file, tree, tmp_path, reference):
    out = tmp_path / "audit"
    argv = cli_args(model_file, tree, out)
    # killed while writing chunk 1's results part (a temporary file is left), after chunk 2's images part,
    # and right after chunk 3's commit: every rerun continues where the last commit left off
    for crash, committed in (("1:written", {0}), ("2:images", {0, 1}), ("3:committed", {0, 1, 2, 3})):
        p = run_cli(argv, crash)
        assert p.returncode == -signal.SIGKILL, p.stderr
        assert store.committed_chunks(str(out)) == committed
        # the killed writer's record stays behind (its lock went with its process), naming it
        held = lock.read_holder(str(out))
        assert held is not None and held.pid != os.getpid()
    assert store.read_doc(str(out))["status"] == "running"
    p = run_cli(argv)
    assert p.returncode == 0, p.stderr
    assert p.stderr.count("ended without releasing it") == 1
    assert lock.read_holder(str(out)) is None  # released: its record removed
    assert "4 chunks: 4 already committed" in p.stdout
    assert_same_audit(out, reference)


@pytest.mark.slow  # a subprocess audit killed from outside, then resumed by two torchrun ranks
@pytest.mark.timeout(300)  # measured 101 s wall (22 s CPU, mostly in subprocesses) on 2 shared cores at a load
# average of about 11, 15 s at 5
def test_sigkill_after_the_first_commit_then_resume_with_two_ranks(model_file, tree, tmp_path, reference):
    """Killed from outside once a chunk is committed; the rest is shared by 2 ranks (torchrun, gloo), and the
    audit equals the uninterrupted single-process one bit for bit."""
    out = tmp_path / "audit"
    argv = cli_args(model_file, tree, out)
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=ROOT)
    env.pop(store.CRASH_ENV, None)
    p = subprocess.Popen([sys.executable, "-m", "overinterp_fast", *argv], env=env, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while not store.committed_chunks(str(out)) and time.time() < deadline and p.poll() is None:
        time.sleep(0.005)
    p.send_signal(signal.SIGKILL)
    p.wait()
    before = store.committed_chunks(str(out))
    assert 1 <= len(before) <= 2, before
    q = run_cli(argv, torchrun=2)
    assert q.returncode == 0, q.stderr + q.stdout
    assert f"4 chunks: {len(before)} already committed" in q.stdout and "of 2" in q.stdout
    assert_same_audit(out, reference)
    assert lock.read_holder(str(out)) is None  # rank 0 took the folder after the killed writer and released it
    after = {c: store.chunk_meta(str(out), c) for c in set(range(4)) - before}
    assert {m["world"] for m in after.values()} == {2} and {m["rank"] for m in after.values()} == {0, 1}


# ----------------------------------------------------------------------------------------------------
# audit/stream.py's small pieces by hand: the images' digest, the stored configuration, the fixed batch size, the
# ----------------------------------------------------------------------------------------------------


class Squares(ImageSource):
    """Flat grey photos: photo i is a 6 x 6 RGB image of value 10 i."""

    def photo(self, i):
        return np.full((6, 6, 3), 10 * i, dtype=np.uint8)


def _source(n=5, labels=None, mean=0.5, std=0.5, **kw):
    return Squares([f"im{i}" for i in range(n)], labels or [i % 3 for i in range(n)], Preprocessing(6, mean, std),
                   description={"kind": "squares", "n": n}, **kw)


@pytest.mark.mutation
def test_source_digest_by_hand():
    src = _source(3, labels=[2, None, 0])
    want = hashlib.sha1("im0\t2\nim1\tNone\nim2\t0\n".encode()).hexdigest()
    assert stream.source_digest(src) == want
    assert stream.source_digest(src.subset([2, 0])) == hashlib.sha1("im2\t0\nim0\t2\n".encode()).hexdigest()
    assert stream.source_digest(_source(3, labels=[2, 1, 0])) != want  # a label changed: another configuration


@pytest.mark.mutation
def test_audit_config_every_field():
    src = _source(4, mean=(0.5, 0.25, 0.125), std=0.5)
    config = AuditConfig(method="gradient", threshold=0.9, threshold_mode="auto", k=50, collection=False,
                         ensemble=True, transfer=True, fraction=0.05, baselines=torch.tensor([0.0, 0.0]),
                         autocast="bf16", batch_size=32, noise_sigma=torch.tensor([0.25, 0.25, 0.25]))
    extra = {"model_files": ("a.onnx",), "chunk_size": 2}
    cfg = stream.audit_config(src, {"a": 1, "b": 2}, config, 2, torch.device("cpu"), extra)
    assert cfg == {
        "models": ["a", "b"], "method": "gradient", "threshold": 0.9, "threshold_mode": "auto", "k": 50,
        "autocast": "bf16", "collection": False, "ensemble": True, "transfer": True, "fraction": 0.05,
        "baselines": 0.0, "images": {"kind": "squares", "n": 4}, "n_images": 4,
        "images_digest": stream.source_digest(src), "size": 6, "mean": [0.5, 0.25, 0.125], "std": 0.5,
        "preprocessing": {"library": "overinterp_fast", "resize": 6, "crop_pct": 1.0, "interpolation": "bicubic",
                          "crop_mode": "center"},  # the plain transform: shorter side to 6, centre crop
        "grey": False, "object_masks": None, "noise_sigma": None, "chunk_size": 2, "device_type": "cpu",
        "batch_size": 32, "seed": 0, "score_dtype": None, "channels_last": False,  # exact SIS's only
        "outputs": "logits",
        "model_files": ["a.onnx"]}  # the caller's extra entries merged in, as JSON
    # k matters only for the gradient method; the noise only with object masks
    cfg = stream.audit_config(_source(4, object_dir="/masks"), {"a": 1}, replace(config, method="exact"), 2,
                              torch.device("cpu"), None)
    assert cfg["k"] is None and cfg["noise_sigma"] == 0.25 and cfg["object_masks"] == "/masks"
    cfg = stream.audit_config(_source(4), {"a": 1}, replace(config, method="exact", score_dtype="bfloat16",
                                                            channels_last=True), 2, torch.device("cpu"), None)
    assert cfg["score_dtype"] == "bfloat16" and cfg["channels_last"] is True
    cfg = stream.audit_config(_source(4), {"a": 1}, replace(config, score_dtype="bfloat16", channels_last=True), 2,
                              torch.device("cpu"), None)
    assert cfg["score_dtype"] is None and cfg["channels_last"] is False  # the gradient method has neither
    assert "model_files" not in cfg and cfg["n_images"] == 4
    cfg = stream.audit_config(_source(4, object_dir="/m"), {"a": 1},
                              replace(config, noise_sigma=torch.tensor([0.1, 0.2, 0.3])), 2, torch.device("meta"),
                              extra)
    assert cfg["noise_sigma"] == pytest.approx([0.1, 0.2, 0.3]) and cfg["device_type"] == "meta"


@pytest.mark.mutation
def test_fixed_batch_size_is_the_cpu_default_for_the_chunk(monkeypatch):
    import overinterp_fast.runtime.batching as batching

    seen = []
    monkeypatch.setattr(batching, "auto_batch_size", lambda images, total_candidates: seen.append(
        (tuple(images.shape), images.device.type, total_candidates)) or 77)
    assert stream.fixed_batch_size(_source(3), 4) == 77
    assert seen == [((1, 3, 6, 6), "cpu", 4 * 6 * 6)]  # one image's shape; the chunk's candidates
    assert stream.fixed_batch_size(_source(1), 2) == 77 and seen[-1][2] == 2 * 36  # a single image is enough


def _commit(folder, chunk):
    os.makedirs(os.path.join(folder, store.PARTS_DIR), exist_ok=True)
    open(store.part_path(folder, chunk, "results"), "w").close()


@pytest.mark.mutation
def test_committed_images_counts_the_committed_chunks(tmp_path):
    folder = str(tmp_path)
    ranges = store.chunk_ranges(7, 3)  # (0, 3), (3, 6), (6, 7)
    assert stream._committed_images(folder, ranges) == 0
    _commit(folder, 2)
    assert stream._committed_images(folder, ranges) == 1
    _commit(folder, 0)
    assert stream._committed_images(folder, ranges) == 4
    _commit(folder, 5)  # a chunk past the ranges (another chunk size's part) is not counted
    assert stream._committed_images(folder, ranges) == 4


@pytest.mark.mutation
def test_progress_bar_counts_jobs_from_the_folder(monkeypatch, tmp_path):
    folder = str(tmp_path)
    ranges = store.chunk_ranges(7, 3)
    _commit(folder, 0)
    terminal = fake_terminal(monkeypatch)
    bar = stream._Progress(folder, ranges, 2, enabled=True, every=0.01)
    assert bar.bar.total == 14 and bar.bar.n == 6 and bar.start_images == 3  # 7 images x 2 models; 3 x 2 done
    assert bar.thread.is_alive() and bar.thread.daemon  # never keeps a crashed job's process alive
    assert bar.bar.smoothing == 0.1 and callable(bar.bar.dynamic_ncols)  # follows the terminal's width
    _commit(folder, 1)
    deadline = time.time() + 10
    while bar.bar.n != 12 and time.time() < deadline:  # the thread sees the other ranks' commits
        time.sleep(0.01)
    assert bar.bar.n == 12
    _commit(folder, 2)
    bar.close()
    assert not bar.thread.is_alive() and bar.bar.n == 14
    last = terminal.last_line()
    assert last.startswith("audit: 100%") and "14/14" in last and "images/h" in last and " left" in last
    assert "job/s" in last or "s/job" in last
    # disabled (another rank, or --quiet): no thread, no output
    terminal.text.clear()
    off = stream._Progress(folder, ranges, 2, enabled=False)
    assert not off.thread.is_alive() and off.every == 1.0  # counts once a second by default
    off.close()
    assert "".join(terminal.text) == ""
    empty = stream._Progress(folder, [], 1, enabled=False)
    assert empty.bar.total == 0
    empty.close()


@pytest.mark.mutation
def test_progress_rate_is_images_per_hour_since_the_start_and_the_time_left(monkeypatch, tmp_path):
    folder = str(tmp_path)
    ranges = store.chunk_ranges(6, 2)
    _commit(folder, 0)
    bar = stream._Progress(folder, ranges, 3, enabled=False)
    posted = []
    monkeypatch.setattr(bar.bar, "set_postfix_str", lambda s, refresh: posted.append((s, refresh)))
    monkeypatch.setattr(bar.bar, "refresh", lambda: posted.append("refresh"))
    clock = iter([bar.t0 + 0.25, bar.t0 + 2.0, bar.t0 + 2.5])
    monkeypatch.setattr(stream.time, "perf_counter", lambda: next(clock))
    bar.update()  # nothing committed since the start: no rate yet, no time left to tell
    assert posted == [("0 images/h, - left", False), "refresh"]
    _commit(folder, 1)
    bar.update()  # 2 new images in 2 s: 3,600 per hour; 2 images left: 2 s
    assert posted[2:] == [("3,600 images/h, 00:02 left", False), "refresh"] and bar.bar.n == 12
    _commit(folder, 2)
    bar.update()  # 4 new images in 2.5 s: 5,760 per hour; none left
    assert posted[4:] == [("5,760 images/h, 00:00 left", False), "refresh"] and bar.bar.n == 18
    bar.stop.set()


def test_an_audit_stored_under_the_earlier_names_continues(tree, tmp_path):
    """A folder whose stored configuration says "mask_value" (now "baselines") and has no "seed" (now stored; the
    earlier versions ran with 0) continues with the same configuration; another seed is refused."""
    src = open_images(str(tree), SIDE)
    out = str(tmp_path / "audit")
    config, quiet = AuditConfig(method="exact", threshold=0.5), RunOptions(show_progress=False)
    storage = StoreOptions(chunk_size=3, workers=0, report=False)
    first = run_stored_audit({"net": tiny_cnn(3)}, src, out, config, storage, quiet)
    doc = store.read_doc(out)
    old = {("mask_value" if k == "baselines" else k): v for k, v in doc["config"].items() if k != "seed"}
    assert old["mask_value"] == 0.0 and "baselines" not in old and "seed" not in old
    store.write_json(os.path.join(out, store.RESULTS_FILE), dict(doc, config=old, status="running"))
    os.remove(store.part_path(out, 2, "results"))
    again = run_stored_audit({"net": tiny_cnn(3)}, src, out, config, storage, quiet)
    assert (again.skipped, again.computed) == (2, 1)
    assert_identical(again.record.models[0].results, first.record.models[0].results)
    store.write_json(os.path.join(out, store.RESULTS_FILE), dict(doc, config=old, status="running"))
    with pytest.raises(ValueError, match="seed is None there, 5 here"):
        run_stored_audit({"net": tiny_cnn(3)}, src, out, replace(config, seed=5), storage, quiet)
    with pytest.raises(ValueError, match="mask_value is 0.0 there, 0.5 here"):
        run_stored_audit({"net": tiny_cnn(3)}, src, out, replace(config, baselines=0.5), storage, quiet)


def test_as_stored_there_by_hand():
    new = {"baselines": 0.0, "seed": 0, "k": None}
    assert stream.as_stored_there(new, None) == new  # no audit there
    assert stream.as_stored_there(new, dict(new)) == new  # written by this version
    assert stream.as_stored_there(new, {"mask_value": 0.0, "k": None}) == {"mask_value": 0.0, "k": None}
    assert stream.as_stored_there(dict(new, seed=3), {"mask_value": 0.0}) == {"mask_value": 0.0, "seed": 3, "k": None}

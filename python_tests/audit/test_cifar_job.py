"""The CIFAR-10 job as one command: ``overinterp-fast audit --dataset cifar10 --split all --method exact
--pixel-subsets``: both splits in one audit, the backward-selection orders and the pixel-subset datasets per split,
resumed, and sharded by torchrun with the one-process results; the subset files' pieces by hand."""
import math
import os

import numpy as np
import pytest
import torch

from overinterp_fast.audit import store
from overinterp_fast.audit.persist import load_audit
from overinterp_fast.audit.sources import open_images
from overinterp_fast.audit.store import ChunkImages
from overinterp_fast.audit.subset_files import (SUBSETS_DIR, SubsetFiles, load_pixel_subsets, random_keep, safe_name,
                                                split_of)
from overinterp_fast.cli import main
from overinterp_fast.methods.results import SISResult
from overinterp_fast.zoo.imagenet import normalize
from helpers import export_tiny_cnn, run_cli, tiny_cnn, write_cifar


SIDE = 8  # the 32 x 32 images resized to 8 x 8: 64 pixel features, so the exact SIS of a few images takes seconds
TRAIN = (2, 1, 0, 2, 1)  # training images per batch file: 6 in all

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def cifar(tmp_path_factory):
    root = tmp_path_factory.mktemp("cifar")
    write_cifar(root, 4, seed=3, train=TRAIN)
    return root


@pytest.fixture(scope="module")
def net(tmp_path_factory):
    return export_tiny_cnn(tmp_path_factory.mktemp("model") / "net.pt2", SIDE, classes=10)  # CIFAR-10's classes


def argv(net, cifar, out, *extra):
    return ["audit", "--model", net, "--dataset", "cifar10", "--data-dir", str(cifar), "--split", "all", "--size",
            str(SIDE), "--method", "exact", "--threshold", "0.5", "--chunk-size", "3", "--workers", "0", "--quiet",
            "--channels-last", "off",
            "--gallery", "2", "--pixel-subsets", "--out", str(out), *extra]


def test_split_all_is_train_then_test(cifar):
    src = open_images(dataset="cifar10", data_dir=str(cifar), split="all")
    assert src.image_names == [f"train/{i:05d}" for i in range(6)] + [f"test/{i:05d}" for i in range(4)]
    # per training file (i + 3) % 10 (files of 2, 1, 0, 2, 1 images), then the test batch's i % 10
    assert src.image_labels == [3, 4, 3, 3, 4, 3, 0, 1, 2, 3]
    assert src.description["split"] == "all"
    test = open_images(dataset="cifar10", data_dir=str(cifar), split="test")
    assert np.array_equal(src.display(7), test.display(1))
    with pytest.raises(ValueError, match="cifar10 has the splits"):
        open_images(dataset="cifar10", data_dir=str(cifar), split="val")


def test_split_of_and_safe_name():
    assert split_of("train/00012", "all") == "train" and split_of("test/00001", "all") == "test"
    assert split_of("test/00001", "test") == "test" and split_of("cat/0001", None) == "images"
    assert safe_name("ensemble (mean logits)") == "ensemble__mean_logits_" and safe_name("net-v1.2") == "net-v1.2"


def test_random_keep_is_per_image_and_seeded():
    a = random_keep(64, 4, seed=0, index=5)
    assert a.dtype == bool and a.shape == (64,) and a.sum() == 4
    assert np.array_equal(a, random_keep(64, 4, seed=0, index=5))  # the same image: the same pixels
    assert not np.array_equal(a, random_keep(64, 4, seed=0, index=6))  # another image, another draw
    assert not np.array_equal(a, random_keep(64, 4, seed=1, index=5))  # another seed


def result(order, target=1):
    o = torch.tensor(order, dtype=torch.int64)
    return SISResult(order=o, values=torch.zeros(len(order), dtype=torch.float64), sis=None, mask=None,
                     target=target, score=0.5, threshold=0.9)


def test_subset_files_by_hand(tmp_path):
    """Two 2 x 3 images (p = 6, 5%: ceil(0.3) = 1 pixel; 50%: 3), one model; split by name."""
    photos = [np.arange(18, dtype=np.uint8).reshape(2, 3, 3) * 10, np.full((2, 3, 3), 200, np.uint8)]
    chunk = ChunkImages([4, 9], ["train/00000", "test/00000"], [7, None], photos, None)  # images 4 and 9 of the audit
    orders = [[5, 0, 1, 2, 3, 4], [0, 1, 2, 3, 4, 5]]  # last masked: pixel 4 of image 0, pixel 5 of image 1
    files = SubsetFiles(["m"], "all", 0.5, seed=2, mean=0.5, std=0.25, mask_value=0.0)
    files.add(chunk, [[result(orders[0], 3), result(orders[1], 4)]])
    paths = files.write(str(tmp_path))
    assert paths == [str(tmp_path / SUBSETS_DIR / "m" / "test.npz"), str(tmp_path / SUBSETS_DIR / "m" / "train.npz")]
    train = load_pixel_subsets(paths[1])
    assert list(train.names) == ["train/00000"] and train.labels.tolist() == [7] and train.targets.tolist() == [3]
    assert train.model == "m" and train.split == "train" and train.fraction == 0.5 and train.seed == 2
    assert train.order.dtype == np.int16 and train.order.tolist() == [orders[0]]
    # the last 3 of the order (2, 3, 4), on the 2 x 3 grid
    assert train.backselect.tolist() == [[[False, False, True], [True, True, False]]]
    assert train.random.sum() == 3 and np.array_equal(train.random[0].ravel(), random_keep(6, 3, 2, 4))
    x = normalize(photos[0], 0.5, 0.25)
    assert torch.equal(train.inputs("full")[0], x)
    kept = torch.from_numpy(train.backselect[0])
    assert torch.equal(train.inputs("backselect")[0], torch.where(kept, x, torch.zeros(())))
    assert torch.equal(train.inputs("random")[0], torch.where(torch.from_numpy(train.random[0]), x, 0.0))
    test = load_pixel_subsets(paths[0])
    assert test.labels.tolist() == [-1] and test.backselect[0].ravel().nonzero()[0].tolist() == [3, 4, 5]
    assert test.random[0].ravel().tolist() == random_keep(6, 3, 2, 9).tolist()  # drawn by the image's position
    with pytest.raises(ValueError, match="which must be"):
        train.inputs("all")
    short = SubsetFiles(["m"], None, 0.05, 0, 0.5, 0.5, [0.0, 0.1, 0.2])
    with pytest.raises(ValueError, match="an order of 2 features for 6 pixels"):
        short.add(chunk, [[result([0, 1]), result([0, 1])]])
    short.add(ChunkImages([0], ["a"], [None], photos[:1], None), [[result(orders[0])]])
    (path,) = short.write(str(tmp_path / "per-channel"))
    per_channel = load_pixel_subsets(path)
    assert per_channel.split == "images" and per_channel.mask_value.tolist() == [0.0, 0.1, 0.2]
    masked = per_channel.inputs("backselect")[0]  # ceil(0.05 * 6) = 1 pixel kept: pixel 4 (row 1, column 1)
    assert torch.equal(masked[:, 1, 1], normalize(photos[0], 0.5, 0.5)[:, 1, 1])
    assert masked[:, 0, 0].tolist() == pytest.approx([0.0, 0.1, 0.2])


def assert_subsets_of(out, record):
    """The subset files hold, per split, the audit's images, orders and the last ceil(5% p) of each order."""
    (model,) = record.models
    got = {split: load_pixel_subsets(os.path.join(out, SUBSETS_DIR, safe_name(model.name), f"{split}.npz"))
           for split in ("train", "test")}
    names = [n for s in ("train", "test") for n in got[s].names]
    assert names == record.image_names
    orders = np.concatenate([got["train"].order, got["test"].order]).astype(np.int64)
    assert np.array_equal(orders, np.stack([r.order.numpy() for r in model.results]))
    k = math.ceil(0.05 * SIDE * SIDE)  # 4 of 64
    for sub in got.values():
        flat = sub.backselect.reshape(len(sub), -1)
        assert (flat.sum(1) == k).all() and (sub.random.reshape(len(sub), -1).sum(1) == k).all()
        for o, kept in zip(sub.order, flat):
            assert sorted(o[-k:].tolist()) == kept.nonzero()[0].tolist()
    return got


def test_one_command_writes_orders_and_subsets_per_split_and_resumes(net, cifar, tmp_path, capsys):
    out = tmp_path / "audit"
    assert main(argv(net, cifar, out)) == 0
    printed = capsys.readouterr().out
    assert "wrote " + str(out / "subsets" / "net" / "train.npz") in printed
    record = load_audit(str(out))
    assert len(record.image_names) == 10 and store.read_doc(str(out))["subsets"] == ["subsets/net/test.npz",
                                                                                        "subsets/net/train.npz"]
    first = assert_subsets_of(str(out), record)
    assert main(["audit", "--resume", str(out), "--quiet"]) == 0  # nothing left to compute: the files again
    assert "4 chunks: 4 already committed" in capsys.readouterr().out
    again = assert_subsets_of(str(out), load_audit(str(out)))
    for split in ("train", "test"):
        for key in ("order", "backselect", "random", "photos", "labels", "targets"):
            assert np.array_equal(getattr(first[split], key), getattr(again[split], key))


@pytest.mark.slow  # one audit in a subprocess, then the same by two torchrun ranks
@pytest.mark.timeout(300)
def test_two_torchrun_ranks_write_the_one_process_orders_and_subsets(net, cifar, tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    p = run_cli(argv(net, cifar, one, "--threads", "2"))
    assert p.returncode == 0, p.stderr
    q = run_cli(argv(net, cifar, two, "--threads", "2"), torchrun=2)  # torchrun's processes start with one thread
    assert q.returncode == 0, q.stderr + q.stdout
    assert "computed by rank 0 of 2" in q.stdout
    ranks = {store.chunk_meta(str(two), c)["rank"] for c in range(4)}
    assert ranks == {0, 1}  # both ranks computed chunks
    # --threads reached every process: each chunk ran with two threads, whichever rank computed it
    assert {(store.chunk_meta(str(f), c)["threads"]) for f in (one, two) for c in range(4)} == {2}
    a, b = load_audit(str(one)), load_audit(str(two))
    for ra, rb in zip(a.models[0].results, b.models[0].results):
        assert torch.equal(ra.order, rb.order) and torch.equal(ra.values, rb.values)
    for split in ("train", "test"):
        fa = np.load(one / SUBSETS_DIR / "net" / f"{split}.npz")
        fb = np.load(two / SUBSETS_DIR / "net" / f"{split}.npz")
        assert sorted(fa.files) == sorted(fb.files)
        for key in fa.files:
            assert np.array_equal(fa[key], fb[key]), key


# ---------------------------------------------------------------------------------------------- the device's settings

def test_a_stored_audit_fixes_its_batch_size_and_format_when_it_starts(monkeypatch, cifar):
    from overinterp_fast.audit import stream
    from overinterp_fast.audit.config import AuditConfig
    from overinterp_fast.audit.distributed import Ranks

    src = open_images(dataset="cifar10", data_dir=str(cifar), split="test", size=SIDE)
    measured = []
    monkeypatch.setattr(stream, "measure_settings", lambda models, source, config, chunk, device, cl, batch=None:
                        measured.append((chunk, device.type, cl, batch)) or (batch or 4096, True))
    models, cpu, gpu = {"net": tiny_cnn(0, 10)}, Ranks(), Ranks(device=torch.device("cuda"))
    exact = AuditConfig(method="exact")
    settle = lambda config, ranks, stored=None: stream.device_settings(models, src, config, 3, ranks, stored)  # noqa
    fixed = stream.fixed_batch_size(src, 3)
    # the caller's batch size and format, whatever the folder holds
    got = settle(AuditConfig(method="exact", batch_size=7, channels_last=True), gpu, {"batch_size": 9})
    assert (got.batch_size, got.channels_last) == (7, True)
    # a resume: the folder's, also for the format
    got = settle(exact, gpu, {"batch_size": 9, "channels_last": True})
    assert (got.batch_size, got.channels_last) == (9, True)
    got = settle(exact, cpu, {"batch_size": 9})  # a folder stored before the format was: the images' format
    assert (got.batch_size, got.channels_last) == (9, False)
    assert measured == []
    # a GPU: measured once by exact SIS's own choice on the first chunk
    got = settle(exact, gpu)
    assert (got.batch_size, got.channels_last) == (4096, True) and measured == [(3, "cuda", None, None)]
    # a CPU: the CPU default for the input shape, the format measured once at it (the caller's where given);
    # other methods: no format
    got = settle(exact, cpu)
    assert (got.batch_size, got.channels_last) == (fixed, True) and measured[1:] == [(3, "cpu", None, fixed)]
    got = settle(AuditConfig(method="exact", channels_last=False), cpu)
    assert (got.batch_size, got.channels_last) == (fixed, False) and len(measured) == 2
    got = settle(AuditConfig(method="gradient"), gpu)
    assert (got.batch_size, got.channels_last) == (fixed, False) and len(measured) == 2


def test_exact_sis_choices_are_the_call_s(monkeypatch):
    """ExactSIS.choices measures what a call would choose, and runs no SIS: the dense path's calibrated batch size
    (or the low copy's with score_dtype), the format measured by timing unless given."""
    import overinterp_fast as of
    from overinterp_fast.attr import exact as attr_exact
    from overinterp_fast.runtime import calibration
    from helpers import make_cnn, make_images

    monkeypatch.setattr(attr_exact, "exact_sis", lambda *a, **k: pytest.fail("choices ran exact SIS"))
    model, x = make_cnn(0, torch.float32), make_images(3, dtype=torch.float32)
    info = of.ExactSIS(model, engine="torch").choices(x)
    # the format measured (both formats timed): channels_last kept only where at least 5% faster
    given, cl = info.layout_s["given"], info.layout_s["channels_last"]
    assert info.engine == "torch" and info.candidates == 0 and given > 0 and cl > 0
    assert info.channels_last == (cl <= 0.95 * given)
    assert info.batch_size == calibration.LAST[0].batch_size and info.batch_source == calibration.LAST[0].source
    info = of.ExactSIS(model, engine="torch", channels_last=False).choices(x)
    assert not info.channels_last and info.layout_s == {}
    info = of.ExactSIS(model, batch_size=11, score_dtype=torch.bfloat16, channels_last=True).choices(x)
    assert (info.batch_size, info.batch_source, info.channels_last) == (11, "user", True)
    assert info.low["score_dtype"] == "bfloat16" and info.low["channels_last"]


def test_the_audit_s_format_applies_where_it_can():
    """A format chosen on an audit's first model (a CNN) reaches a model without convolutions as 'no'."""
    from torch import nn

    from overinterp_fast.audit.config import AuditConfig
    from overinterp_fast.audit.runner import explain
    from helpers import make_images

    x = make_images(1, h=4, w=4, dtype=torch.float32)
    config = AuditConfig(method="exact", batch_size=9, channels_last=True)
    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Flatten(), nn.Linear(48, 5)).eval()
    (r,) = explain(mlp, x, [0.1], config, None, False)
    assert r.info.channels_last is False and r.info.batch_size == 9
    (r,) = explain(tiny_cnn(0), x, [0.1], config, None, False)
    assert r.info.channels_last is True

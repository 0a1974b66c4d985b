"""Retraining on pixel subsets (audit/retrain.py, the ``retrain`` command; zoo/training.py, zoo/architectures.py):
the spread over seeds and the table by hand, the order of the runs and their resumption, the files of an audit
found or refused, models that learn from subsets that carry the class and not from random ones, and the whole
experiment on generated CIFAR-format data: audit with --pixel-subsets, then retrain, each model's accuracy on its
own subsets in results.json, deterministic given the seeds."""
import json
import math
import os

import numpy as np
import pytest
import torch
from torch.utils.data import TensorDataset

from overinterp_fast.audit import PixelSubsetDataset, RetrainOptions, retraining as retrain_module
from overinterp_fast.audit import store
from overinterp_fast.audit.retraining import Run, format_table, retrain, seeded_runs, spread, subset_files
from overinterp_fast.audit.subset_files import load_pixel_subsets
from overinterp_fast.cli import main
from overinterp_fast.zoo.architectures import architecture
from overinterp_fast.zoo.training import TrainOptions, evaluate, fit
from helpers import export_tiny_cnn, whole_message, write_cifar

pytestmark = pytest.mark.usefixtures("one_torch_thread")

T_975 = {1: 12.706204736174698, 2: 4.302652729911275}  # Student's t, 0.975 quantile, by degrees of freedom


# ---------------------------------------------------------------------------------------------- the runs and the table

def test_spread_by_hand():
    s = spread([0.5, 0.7, 0.9])
    sd = 0.2  # sqrt(((0.2)^2 + 0 + (0.2)^2) / 2)
    half = T_975[2] * sd / math.sqrt(3)
    assert s["accuracy"] == pytest.approx(0.7) and s["std"] == pytest.approx(sd)
    assert (s["min"], s["max"], s["runs"]) == (0.5, 0.9, [0.5, 0.7, 0.9])
    assert s["ci95"] == pytest.approx([0.7 - half, 0.7 + half])
    one = spread([0.25])
    assert one == {"accuracy": 0.25, "std": None, "min": 0.25, "max": 0.25, "ci95": None, "runs": [0.25]}
    assert spread([0.5, 0.5])["ci95"] == [0.5, 0.5] and spread([0.5, 0.5])["std"] == 0.0
    with pytest.raises(ValueError, match="no runs"):
        spread([])


def test_seeded_runs_go_seed_by_seed_and_keep_the_runs_done():
    trained, tested = [], []

    def train(kind, seed):
        trained.append((kind, seed))
        return (kind, seed)

    def test(model, kind):
        tested.append((model, kind))
        return len(tested) / 8

    done = [Run("random", 3, {"backselect": 0.0, "random": 1.0}, 2.5)]
    told = []
    runs = seeded_runs(train, test, (1, 3), done=done, on_run=told.append)
    assert trained == [("backselect", 1), ("random", 1), ("backselect", 3)]  # (random, 3) was done
    assert tested == [(("backselect", 1), "backselect"), (("backselect", 1), "random"), (("random", 1), "backselect"),
                      (("random", 1), "random"), (("backselect", 3), "backselect"), (("backselect", 3), "random")]
    assert [(r.trained_on, r.seed) for r in runs] == [("backselect", 1), ("random", 1), ("backselect", 3),
                                                      ("random", 3)]
    assert runs[0].accuracy == {"backselect": 0.125, "random": 0.25} and runs[3] is done[0]
    assert told == runs[:3] and all(r.seconds >= 0 for r in runs)


def test_format_table_with_several_runs_by_hand():
    result = {"rows": [{"trained_on": "full images", "evaluated_on": "full images", "accuracy": 0.5},
                       {"trained_on": "a", "evaluated_on": "b", "accuracy": 0.75, "std": 0.0125, "min": 0.74,
                        "max": 0.7625, "runs": [0.74, 0.7625, 0.7475]}]}
    assert format_table(result).splitlines()[1:] == [
        "full images" + " " * 24 + "full images" + " " * 30 + "   0.500",
        "a" + " " * 34 + "b" + " " * 40 + "   0.750 ± 0.013 [0.740, 0.762] (3 runs)"]


# ---------------------------------------------------------------------------------------------- training

def test_fit_is_the_same_given_the_seed_and_learns():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 1, 4, 4, generator=g)
    y = (x[:, 0, 0, 0] > 0).long()  # the class is the sign of one pixel
    data = TensorDataset(x, y)
    build = architecture("small-cnn", 1, 4, 2)
    opts = TrainOptions(epochs=30, batch_size=16, lr=1e-2)
    a, b, c = fit(build, data, opts, seed=4), fit(build, data, opts, seed=4), fit(build, data, opts, seed=5)
    assert all(torch.equal(a.state_dict()[k], b.state_dict()[k]) for k in a.state_dict())
    assert not all(torch.equal(a.state_dict()[k], c.state_dict()[k]) for k in a.state_dict())
    assert not a.training and evaluate(a, data, batch_size=7) > 0.9
    steps = []
    fit(build, data, TrainOptions(epochs=2, batch_size=24), seed=0, on_step=lambda: steps.append(1))
    assert len(steps) == 2 * 3  # ceil(64 / 24) = 3 steps an epoch
    with pytest.raises(FloatingPointError, match="not finite in epoch 1"):
        fit(build, TensorDataset(x * float("nan"), y), TrainOptions(epochs=1), seed=0)
    for bad, message in ((dict(epochs=-1), "epochs must be an integer >= 0, got -1"),
                         (dict(batch_size=0), "batch_size must be a positive integer, got 0"),
                         (dict(lr=0.0), "lr must be above 0, got 0.0"),
                         (dict(workers=-1), "workers must be an integer >= 0, got -1")):
        with pytest.raises(ValueError, match=whole_message(message)):
            TrainOptions(**bad)


def test_architectures_by_name():
    assert architecture("resnet20", 3, 8, 10)()(torch.zeros(1, 3, 8, 8)).shape == (1, 10)
    assert architecture("digits-cnn", 1, 8, 10)()(torch.zeros(1, 1, 8, 8)).shape == (1, 10)
    tv = architecture("torchvision:resnet18", 3, 16, 4)()
    assert tv(torch.zeros(2, 3, 16, 16)).shape == (2, 4)
    cases = [(("vit", 3, 8, 10), "unknown architecture 'vit': the zoo has resnet20, small-cnn, digits-cnn; or "
                                  "timm:NAME, torchvision:NAME"),
             (("resnet20", 1, 8, 10), "resnet20 takes 3 channels; these images have 1"),
             (("digits-cnn", 1, 16, 10), "digits-cnn takes one channel of 8 x 8 pixels and 10 classes; these "
                                          "images have 1 channel(s) of 16 x 16 pixels and 10 classes"),
             (("torchvision:nonet", 3, 8, 10), "torchvision has no classification architecture 'nonet' "
                                               "(torchvision.models.list_models() lists them)")]
    for args, message in cases:
        with pytest.raises(ValueError, match=whole_message(message)):
            architecture(*args)


def test_a_timm_architecture_from_scratch():
    pytest.importorskip("timm")
    build = architecture("timm:resnet10t", 1, 16, 3)
    assert build()(torch.zeros(2, 1, 16, 16)).shape == (2, 3)


# ---------------------------------------------------------------------------------------------- subsets with a signal

SIDE, KEPT = 8, 4


def planted(folder, n_train=48, n_test=24, seed=0):
    """subsets/net/{train,test}.npz of noise photos whose backward-selection pixels carry the class (red for
    class 0, blue for class 1) while the random pixels are noise: a model can learn from the first, not the second."""
    rng = np.random.default_rng(seed)
    os.makedirs(folder / "subsets" / "net")
    for split, n in (("train", n_train), ("test", n_test)):
        labels = np.arange(n) % 2
        photos = rng.integers(60, 200, (n, SIDE, SIDE, 3), dtype=np.uint8)
        back = np.zeros((n, SIDE * SIDE), bool)
        rand = np.zeros((n, SIDE * SIDE), bool)
        for i in range(n):
            back[i, rng.permutation(SIDE * SIDE)[:KEPT]] = True
            rand[i, rng.permutation(SIDE * SIDE)[:KEPT]] = True
            colour = [255, 0, 0] if labels[i] == 0 else [0, 0, 255]
            photos[i].reshape(-1, 3)[back[i] & ~rand[i]] = colour
        np.savez(folder / "subsets" / "net" / f"{split}.npz", names=np.array([f"{split}/{i}" for i in range(n)]),
                 labels=labels.astype(np.int64), targets=labels.astype(np.int64), photos=photos,
                 order=np.zeros((n, SIDE * SIDE), np.int16), backselect=back.reshape(n, SIDE, SIDE),
                 random=rand.reshape(n, SIDE, SIDE), mean=np.full(3, 0.5, np.float32),
                 std=np.full(3, 0.25, np.float32), mask_value=np.zeros(1), fraction=np.float64(0.05),
                 seed=np.int64(0), model=np.str_("net"), split=np.str_(split))
    return str(folder)


def test_models_learn_from_subsets_that_carry_the_class_and_not_from_random_ones(tmp_path):
    folder = planted(tmp_path / "audit")
    out = str(tmp_path / "r.json")
    r = retrain(folder, RetrainOptions(arch="small-cnn", seeds=(0, 1), epochs=25, batch_size=16, lr=3e-3,
                                       device="cpu"), out, show_progress=False)
    rows = {(x["trained_on"], x["evaluated_on"]): x for x in r["rows"]}
    bs, rnd = "5% backward-selection subsets", "5% random subsets"
    assert min(rows[(bs, bs)]["runs"]) >= 0.9, rows[(bs, bs)]
    assert max(rows[(rnd, rnd)]["runs"]) <= 0.75, rows[(rnd, rnd)]
    assert rows[(bs, bs)]["seeds"] == [0, 1] and r["status"] == "complete"
    # the audited model's rows come from the test file (no own-subset columns here: the full images only)
    assert rows[("full images (the audited model)", "full images")]["accuracy"] == 1.0
    assert [x["trained_on"] for x in r["rows"]].count("full images (the audited model)") == 1
    assert json.load(open(out)) == json.loads(json.dumps(r))


# ---------------------------------------------------------------------------------------------- the whole experiment

@pytest.fixture(scope="module")
def audited(tmp_path_factory):
    """Generated CIFAR-format data (6 training, 4 test images, resized to 8 x 8) audited by a tiny CNN with exact
    SIS and --pixel-subsets, in this process; returns the audit folder."""
    root = tmp_path_factory.mktemp("cifar")
    write_cifar(root, 4, seed=3, train=(2, 1, 0, 2, 1))
    net = export_tiny_cnn(root / "net.pt2", 8, classes=10)  # a model of CIFAR-10's classes
    out = root / "audit"
    assert main(["audit", "--model", net, "--dataset", "cifar10", "--data-dir", str(root), "--split", "all",
                 "--size", "8", "--method", "exact", "--threshold", "0.5", "--chunk-size", "4", "--workers", "0",
                 "--quiet", "--gallery", "2", "--pixel-subsets", "--threads", "2", "--out", str(out)]) == 0
    return str(out)


def test_one_model_s_accuracy_on_its_own_subsets_is_in_results_json(audited):
    doc = store.read_doc(audited)
    (entry,) = doc["models"]
    s = entry["subsets"]
    assert doc["transfer"] is None  # one model: no transfer table, but its own subsets
    assert (s["fraction"], s["images"], s["reference"]) == (0.05, 10, "labels")
    files = [load_pixel_subsets(os.path.join(audited, "subsets", "net", f"{x}.npz")) for x in ("train", "test")]
    labels = np.concatenate([f.labels for f in files])
    for kind in ("backselect", "random"):
        pred = np.concatenate([getattr(f, f"{kind}_class") for f in files])
        assert s["accuracy"][kind] == pytest.approx(float(np.mean(pred == labels)))
        assert s["confidence"][kind] == pytest.approx(float(np.mean(np.concatenate(
            [getattr(f, f"{kind}_score") for f in files]))))
    assert s["accuracy"]["full"] == pytest.approx(float(np.mean(np.concatenate([f.targets for f in files]) == labels)))
    # --threads 2 ran every chunk with two threads, and the count is restored after the command
    assert {store.chunk_meta(audited, c)["threads"] for c in range(3)} == {2}
    assert torch.get_num_threads() == 1


def test_the_own_subset_confidence_is_backward_selection_s_value_there(audited):
    """Exact SIS's values[t] is f with only order[t+1:] present: on the last 4 of 64 pixels, values[59]. The
    audit's backselect_score, from a forward pass on the subset, is that value."""
    from overinterp_fast.audit.persist import load_audit

    record = load_audit(audited)
    (m,) = record.models
    got = m.subset_columns["backselect_score"]
    want = [float(r.values[64 - 4 - 1]) for r in m.results]
    assert got == pytest.approx(want, rel=1e-5)


def test_retrain_on_the_audit_is_deterministic_and_resumes(audited, tmp_path, monkeypatch, capsys):
    out = str(tmp_path / "r.json")
    argv = ["retrain", audited, "--arch", "small-cnn", "--seeds", "0,1", "--epochs", "2", "--batch-size", "4",
            "--device", "cpu", "--quiet", "--threads", "1", "--out", out]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    first = json.load(open(out))
    assert first["status"] == "complete" and first["experiment"] == "retrain"
    assert first["commit"] and first["versions"]["torch"] == torch.__version__ and first["threads"] == 1
    assert first["config"]["arch"] == "small-cnn" and first["config"]["model"] == "net"
    data = dict(first["data"])
    assert data.pop("train") == os.path.join(audited, "subsets", "net", "train.npz")
    assert data.pop("test") == os.path.join(audited, "subsets", "net", "test.npz")
    assert data == {"train_images": 6, "test_images": 4, "channels": 3, "size": 8, "pixels": 64, "pixels_kept": 4}
    assert [(r["trained_on"], r["seed"]) for r in first["runs"]] == [("backselect", 0), ("random", 0),
                                                                     ("backselect", 1), ("random", 1)]
    assert [r["evaluated_on"] for r in first["rows"]] == [
        "full images", "5% backward-selection subsets", "5% random subsets"] + [
        "5% backward-selection subsets", "5% random subsets"] * 2
    assert format_table(first) in printed and open(out[:-5] + ".txt").read() == format_table(first) + "\n"
    # the audited model's rows: from the test file
    test = load_pixel_subsets(os.path.join(audited, "subsets", "net", "test.npz"))
    assert first["rows"][1]["accuracy"] == pytest.approx(float(np.mean(test.backselect_class == test.labels)))
    # the same again from scratch: the same accuracies
    assert main(argv + ["--restart"]) == 0
    again = json.load(open(out))
    assert [r["accuracy"] for r in again["runs"]] == [r["accuracy"] for r in first["runs"]]
    # interrupted after its first run: the rerun trains the three runs left, and ends as the first did
    partial = dict(first, status="running", runs=first["runs"][:1], rows=[])
    json.dump(partial, open(out, "w"))
    calls = []
    real_fit = retrain_module.fit
    monkeypatch.setattr(retrain_module, "fit", lambda *a, **k: calls.append(k["seed"]) or real_fit(*a, **k))
    assert main(argv) == 0
    assert calls == [0, 1, 1]
    resumed = json.load(open(out))
    assert resumed["runs"] == [dict(r, seconds=s["seconds"]) for r, s in zip(first["runs"], resumed["runs"])]
    assert resumed["rows"] == first["rows"]
    # other settings against the same file: one line
    capsys.readouterr()
    assert main([a if a != "2" else "3" for a in argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"overinterp-fast: error: {out!r} holds runs of another configuration: epochs is 2 there, "
                          f"3 here") and "\n" not in err


def test_subset_files_are_found_or_refused_in_one_line(audited, tmp_path):
    train, test = subset_files(audited)
    assert train.endswith(os.path.join("subsets", "net", "train.npz")) and test.endswith("test.npz")
    assert subset_files(os.path.join(audited, "subsets", "net")) == (train, test)
    assert subset_files(audited, model="net") == (train, test)
    with pytest.raises(ValueError, match=whole_message(f"{audited!r} has no pixel subsets of model 'other'; it has "
                                                       f"net")):
        subset_files(audited, model="other")
    with pytest.raises(FileNotFoundError, match="no val split in"):
        subset_files(audited, test_split="val")
    with pytest.raises(FileNotFoundError, match="is not a folder"):
        subset_files(str(tmp_path / "nothing"))
    # the dataset reads a split of the folder alike
    folder = PixelSubsetDataset(audited, "random", split="test")
    file = PixelSubsetDataset(test, "random")
    assert len(folder) == len(file) == 4 and torch.equal(folder[3][0], file[3][0])
    assert np.array_equal(PixelSubsetDataset(audited, split="train", model="net").subsets.order,
                          load_pixel_subsets(train).order)
    with pytest.raises(ValueError, match=whole_message(f"{audited!r} is a folder: give the split to read "
                                                       f"(split='train', 'test', ...)")):
        PixelSubsetDataset(audited)


@pytest.mark.parametrize("argv, message", [
    (["--threads", "0"], "argument --threads: must be a positive integer, got 0"),
    (["--threads", "two"], "argument --threads: must be a positive integer, got 'two'"),
    (["--seeds", "0,x"], "argument --seeds: expected integers separated by commas, got '0,x'"),
    (["--seeds", "1,1"], "argument --seeds: expected different integers >= 0, got '1,1'"),
])
def test_bad_options_are_one_line(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        main(["retrain", "somewhere", *argv])
    assert e.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == f"overinterp-fast: error: {message}"


def test_audit_threads_is_checked_too(capsys):
    with pytest.raises(SystemExit):
        main(["audit", "--model", "x.pt2", "--out", "o", "--threads", "-3"])
    assert capsys.readouterr().err.strip().splitlines()[-1] == \
        "overinterp-fast: error: argument --threads: must be a positive integer, got -3"


def test_retrain_without_subsets_is_one_line(tmp_path, capsys):
    (tmp_path / "audit").mkdir()
    assert main(["retrain", str(tmp_path / "audit"), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("overinterp-fast: error: no train split in") and "\n" not in err

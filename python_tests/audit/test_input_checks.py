"""An audit's inputs checked before any work, each refused in one line (``overinterp-fast: error: ...`` on the
command line, nothing written): the CIFAR batches' labels (range, count) and keys (str or bytes), the models'
classes against the dataset's and the labels, a model that ends in a softmax (``--outputs probabilities`` takes
it, and a resume keeps it), and a channel count the model does not take."""
import json
import os
import pickle

import numpy as np
import pytest
import torch
from torch import nn

from overinterp_fast.audit import store
from overinterp_fast.audit.checks import check_models
from overinterp_fast.audit.config import AuditConfig, StoreOptions
from overinterp_fast.audit.persist import load_audit
from overinterp_fast.audit.runner import run_audit
from overinterp_fast.audit.sources import open_images
from overinterp_fast.audit.stream import run_stored_audit
from overinterp_fast.cli import main
from helpers import Calls, run_cli

SIDE = 4  # the 32 x 32 images resized to 4 x 4: 16 pixel features, exact SIS of two images in a moment
NAMES = [f"c{i}" for i in range(10)]

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def net(classes, softmax=False, seed=0):
    """A seeded CNN of ``classes`` outputs for [N, 3, S, S] images (ending in a softmax with ``softmax``)."""
    torch.manual_seed(seed)
    layers = [nn.Conv2d(3, 6, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(2), nn.Flatten(), nn.Linear(24, classes)]
    return nn.Sequential(*layers, *([nn.Softmax(1)] if softmax else [])).eval()


def export(path, model) -> str:
    batch = torch.export.Dim("batch")
    torch.export.save(torch.export.export(model, (torch.zeros(2, 3, SIDE, SIDE),), dynamic_shapes=({0: batch},)),
                      str(path))
    return str(path)


def write_cifar(root, n=40, labels=None, text=str, classes=NAMES):
    """A CIFAR-10 test batch of ``n`` images (labels i % 10 unless given) and its meta file, the keys and class
    names made by ``text`` (``str``, or ``str.encode`` for bytes, as the original batches hold them)."""
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    data = np.random.default_rng(0).integers(0, 256, (n, 3072), dtype=np.uint8)
    labels = [i % 10 for i in range(n)] if labels is None else labels
    with open(folder / "test_batch", "wb") as fh:
        pickle.dump({text("batch_label"): text("testing batch 1 of 1"), text("data"): data, text("labels"): labels},
                    fh, protocol=2)
    with open(folder / "batches.meta", "wb") as fh:
        pickle.dump({text("label_names"): [text(c) for c in classes]}, fh, protocol=2)
    return root


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    return {name: export(root / f"{name}.pt2", model) for name, model in
            {"net10": net(10), "net5": net(5), "net12": net(12), "soft": net(10, softmax=True)}.items()}


@pytest.fixture(scope="module")
def cifar(tmp_path_factory):
    return write_cifar(tmp_path_factory.mktemp("cifar"))


def argv(model, data, out, *more):
    return ["audit", "--model", model, "--dataset", "cifar10", "--data-dir", str(data), "--size", str(SIDE),
            "--method", "exact", "--threshold", "0.5", "--chunk-size", "1", "--workers", "0", "--quiet",
            "--out", str(out), *more]


def refused(capsys, args, out) -> str:
    """main(args) ends with exit status 2 and one line on stderr, ``overinterp-fast: error: ...`` (returned without
    the prefix), and leaves no audit folder: no chunk, no record."""
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.endswith("\n") and err.count("\n") == 1, err
    assert err.startswith("overinterp-fast: error: ")
    assert not os.path.exists(out)
    return err[len("overinterp-fast: error: "):-1]


# ---------------------------------------------------------------------------------------------- the CIFAR batches

def test_a_label_out_of_range_is_refused_before_any_work(models, tmp_path, capsys):
    """A label 10 in CIFAR-10 crashed with IndexError once every chunk was computed, and again on the rerun."""
    data = write_cifar(tmp_path, labels=[i % 10 for i in range(40)][:3] + [10] + [i % 10 for i in range(4, 40)])
    batch = os.path.join(data, "cifar-10-batches-py", "test_batch")
    for _ in range(2):  # and the same on a rerun
        assert refused(capsys, argv(models["net10"], data, tmp_path / "out"), tmp_path / "out") == (
            f"{batch!r}: the label 10 of image 3 is not a class: batches.meta names 10 classes (0 to 9); 1 label out "
            f"of range")
    negative = write_cifar(tmp_path / "neg", labels=[-1] * 40)
    assert refused(capsys, argv(models["net10"], negative, tmp_path / "out"), tmp_path / "out").endswith(
        "the label -1 of image 0 is not a class: batches.meta names 10 classes (0 to 9); 40 labels out of range")


def test_a_label_out_of_range_gives_one_line_in_a_real_process(models, tmp_path):
    data = write_cifar(tmp_path, labels=[12] * 40)
    proc = run_cli(argv(models["net10"], data, tmp_path / "out"))
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith("overinterp-fast: error: ")
    assert "the label 12 of image 0 is not a class" in proc.stderr
    assert not os.path.exists(tmp_path / "out")


@pytest.mark.parametrize("count", [10, 60])
def test_labels_that_do_not_match_the_images_are_refused(models, tmp_path, capsys, count):
    """10 labels for 40 images audited 10 images without a word; 60 gave an IndexError traceback."""
    data = write_cifar(tmp_path, labels=[i % 10 for i in range(count)])
    batch = os.path.join(data, "cifar-10-batches-py", "test_batch")
    assert refused(capsys, argv(models["net10"], data, tmp_path / "out"), tmp_path / "out") == (
        f"{batch!r} holds 40 images and {count} labels ('labels'): one label per image is needed")


def test_keys_stored_as_bytes_read_as_str(tmp_path):
    """The original batches' keys and class names are bytes (b'data', b'labels', b'label_names'); read as str."""
    as_str = open_images(dataset="cifar10", data_dir=str(write_cifar(tmp_path / "str")), size=SIDE)
    as_bytes = open_images(dataset="cifar10", data_dir=str(write_cifar(tmp_path / "bytes", text=str.encode)),
                           size=SIDE)
    assert as_bytes.classes == NAMES and as_bytes.image_labels == [i % 10 for i in range(40)]
    assert as_bytes.image_labels == as_str.image_labels and as_bytes.classes == as_str.classes
    assert all(np.array_equal(as_bytes.photo(i), as_str.photo(i)) for i in range(40))


def test_a_batch_without_its_entries_names_what_it_has(tmp_path, capsys, models):
    data = write_cifar(tmp_path)
    batch = os.path.join(data, "cifar-10-batches-py", "test_batch")
    with open(batch, "wb") as fh:
        pickle.dump({b"images": np.zeros((1, 3072), np.uint8), b"labels": [0]}, fh, protocol=2)
    assert refused(capsys, argv(models["net10"], data, tmp_path / "out"), tmp_path / "out") == (
        f"{batch!r} has no 'data' entry (its keys: 'images', 'labels'), so it is not a CIFAR python batch")
    with open(batch, "wb") as fh:
        pickle.dump({"data": np.zeros((2, 3000), np.uint8), "labels": [0, 1]}, fh, protocol=2)
    assert refused(capsys, argv(models["net10"], data, tmp_path / "out"), tmp_path / "out") == (
        f"{batch!r}: its 'data' must be uint8 rows of 3072 values (3 x 32 x 32 pixels); it is uint8 of shape "
        f"[2, 3000]")


# ---------------------------------------------------------------------------------------------- the models

@pytest.mark.parametrize("name, k", [("net5", 5), ("net12", 12)])
def test_a_model_of_other_classes_than_the_dataset_is_refused(models, cifar, tmp_path, capsys, name, k):
    """A 5- or 12-output model on CIFAR-10 ran without a word (and 12 turned the class names into numbers)."""
    assert refused(capsys, argv(models[name], cifar, tmp_path / "out"), tmp_path / "out") == (
        f"model {name!r} has {k} outputs, and the image source (cifar10) has 10 classes (c0, c1, c2, ...): a model "
        f"of the source's classes is needed (output j for its class j)")


def test_a_label_that_is_not_a_class_of_the_model_is_refused(models, tmp_path, capsys):
    """A flat folder has no classes of its own; its labels are checked against the model's."""
    from PIL import Image

    folder = tmp_path / "photos"
    folder.mkdir()
    for i in range(2):
        Image.fromarray(np.full((6, 6, 3), 40 * i, np.uint8)).save(folder / f"p{i}.png")
    (tmp_path / "labels.json").write_text(json.dumps({"p0": 1, "p1": 7}))
    args = ["audit", "--model", models["net5"], "--images", str(folder), "--labels", str(tmp_path / "labels.json"),
            "--size", str(SIDE), "--method", "exact", "--quiet", "--workers", "0", "--out", str(tmp_path / "out")]
    assert refused(capsys, args, tmp_path / "out") == ("the label 7 of image 'p1' is not a class of model 'net5', "
                                                       "which has 5 outputs (classes 0 to 4)")
    # in memory: the same check, before any work
    x = torch.zeros(2, 3, SIDE, SIDE)
    with pytest.raises(ValueError, match=r"^the label 5 of image 'b' is not a class of model 'm', which has 5 "
                                         r"outputs \(classes 0 to 4\)$"):
        run_audit({"m": net(5)}, x, ["a", "b"], np.zeros((2, SIDE, SIDE, 3), np.uint8), labels=[0, 5])


def test_an_image_folder_of_other_classes_says_how_to_audit_some_of_the_model_s(models, tmp_path, capsys):
    from PIL import Image

    for cls in ("cat", "dog"):
        (tmp_path / "tree" / cls).mkdir(parents=True)
        Image.fromarray(np.zeros((6, 6, 3), np.uint8)).save(tmp_path / "tree" / cls / "0.png")
    args = ["audit", "--model", models["net5"], "--images", str(tmp_path / "tree"), "--size", str(SIDE), "--quiet",
            "--workers", "0", "--out", str(tmp_path / "out")]
    assert refused(capsys, args, tmp_path / "out") == (
        "model 'net5' has 5 outputs, and the image source (ImageFolder) has 2 classes (cat, dog): a model of the "
        "source's classes is needed (output j for its class j); for photos of some of the model's classes, give a "
        "flat folder and --labels (the model's class indices)")


def test_models_with_different_classes_are_refused():
    with pytest.raises(ValueError, match=r"^model 'a' has 10 outputs and model 'b' 5: the models of one audit share "
                                         r"their classes$"):
        check_models({"a": net(10), "b": net(5)}, torch.zeros(1, 3, SIDE, SIDE), "logits")


def test_a_wrong_channel_count_is_one_line_naming_the_images_shape(models, cifar, tmp_path, capsys):
    message = refused(capsys, argv(models["net10"], cifar, tmp_path / "out", "--grey"), tmp_path / "out")
    assert message.startswith("model 'net10': the model fails on the inputs, shape [40, 1, 4, 4]: ")
    assert message.endswith(" (check --size, --grey)")


# ---------------------------------------------------------------------------------------------- --outputs

SOFTMAX = ("model 'soft': the model's outputs are probabilities already (on the 40 inputs every row lies in [0, 1] and "
           "sums to 1: a final softmax?), and outputs='logits' would take their softmax again; pass "
           "outputs='probabilities' (--outputs probabilities), or the model without its softmax")


def test_a_softmax_ending_model_is_refused_unless_outputs_says_so(models, cifar, tmp_path, capsys):
    """Sequential(resnet20, Softmax) reported f = 0.218 where the model said 0.928."""
    assert refused(capsys, argv(models["soft"], cifar, tmp_path / "out"), tmp_path / "out") == SOFTMAX
    assert refused(capsys, argv(models["net10"], cifar, tmp_path / "out", "--outputs", "probabilities"),
                   tmp_path / "out").startswith("model 'net10': outputs='probabilities', but the model's outputs on "
                                                "the inputs lie in [")


def test_the_sis_command_takes_outputs_too(models, cifar, tmp_path, capsys):
    sis = ["sis", "--model", models["soft"], "--dataset", "cifar10", "--data-dir", str(cifar), "--size", str(SIDE),
           "--limit", "1", "--method", "exact", "--threshold", "0.5", "--quiet", "--out", str(tmp_path / "out")]
    assert refused(capsys, sis, tmp_path / "out") == SOFTMAX.replace("the 40 inputs", "the 1 input")
    assert main([*sis, "--outputs", "probabilities"]) == 0
    x = open_images(dataset="cifar10", data_dir=str(cifar), size=SIDE)[0]["x"][None]
    with torch.no_grad():
        want = float(net(10, softmax=True)(x).max())
    assert load_audit(str(tmp_path / "out")).models[0].results[0].score == pytest.approx(want, rel=1e-6)


def test_outputs_probabilities_audits_the_model_as_it_is_and_a_resume_keeps_it(models, cifar, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(argv(models["soft"], cifar, out, "--outputs", "probabilities", "--limit", "2")) == 0
    capsys.readouterr()
    doc = json.load(open(out / store.RESULTS_FILE))
    assert doc["config"]["outputs"] == "probabilities" and doc["command"]["outputs"] == "probabilities"
    # f(x): the model's own output for its top class, by hand
    x = torch.stack([open_images(dataset="cifar10", data_dir=str(cifar), size=SIDE)[i]["x"] for i in range(2)])
    with torch.no_grad():
        want = net(10, softmax=True)(x).max(1)
    results = load_audit(str(out)).models[0].results
    assert [r.target for r in results] == want.indices.tolist()
    assert [r.score for r in results] == pytest.approx(want.values.double().tolist(), rel=1e-6)
    before = [(r.order.tolist(), r.score) for r in results]
    # a lost chunk: --resume alone recomputes it with the stored --outputs (logits would refuse the model)
    os.remove(store.part_path(str(out), 1, "results"))
    os.remove(out / store.TABLE_FILE)
    assert main(["audit", "--resume", str(out), "--quiet"]) == 0
    assert "2 chunks: 1 already committed, 1 computed" in capsys.readouterr().out
    assert [(r.order.tolist(), r.score) for r in load_audit(str(out)).models[0].results] == before


def test_a_stored_audit_checks_before_it_measures_computes_or_writes(cifar, tmp_path):
    """In Python: the softmax-ending model is refused after one call on the first images, before the batch size
    or memory format is measured and before the folder is made; with outputs="probabilities" it runs."""
    src = open_images(dataset="cifar10", data_dir=str(cifar), size=SIDE).subset(range(2))
    model = Calls(net(10, softmax=True))
    out = tmp_path / "out"
    with pytest.raises(ValueError, match=r"^model 'soft': the model's outputs are probabilities already"):
        run_stored_audit({"soft": model}, src, str(out), AuditConfig(method="exact"),
                         StoreOptions(chunk_size=2, workers=0, report=False, device="cpu"))
    assert not os.path.exists(out)
    first = torch.stack([src[i]["x"] for i in range(2)])
    assert len(model.inputs) == 1 and torch.equal(model.inputs[0], first)
    run = run_stored_audit({"soft": model}, src, str(out), AuditConfig(method="exact", outputs="probabilities"),
                           StoreOptions(chunk_size=2, workers=0, report=False, device="cpu"))
    assert run.computed == 1 and run.record.models[0].options["outputs"] == "probabilities"


def test_audit_config_refuses_an_unknown_output_kind():
    with pytest.raises(ValueError, match=r"^outputs must be one of \('logits', 'probabilities'\), got 'probs'$"):
        AuditConfig(outputs="probs")


def test_minimal_pixel_sets_in_an_audit_record_the_audit_s_tau():
    """The audit's responsibility method runs minimal pixel sets with their top-1 criterion, which takes no
    threshold; each result still records the audit's tau for its image, as the other methods' do."""
    x = torch.randn(2, 3, 6, 6, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        f = torch.softmax(net(5)(x), 1).max(1).values.double()
    rec = run_audit({"m": net(5)}, x, ["a", "b"], np.zeros((2, 6, 6, 3), np.uint8),
                    AuditConfig(method="responsibility", threshold=0.99, threshold_mode="relative", transfer=False))
    assert [r.threshold for r in rec.models[0].results] == pytest.approx((0.99 * f).tolist(), rel=1e-12)

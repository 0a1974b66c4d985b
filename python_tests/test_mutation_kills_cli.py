"""The command line's small pieces by hand: argument types, parser defaults, the noise units of --object-masks,
--device checks, the printed table, the bench command's script lookup and main's one-line errors.
test_audit_cli.py, test_demo.py and test_text_zoo.py run the commands whole."""
import argparse
import os
import sys
import types

import numpy as np
import pytest
import torch

from overinterp_fast import cli
from overinterp_fast.audit.records import AuditRecord, ModelRecord
from overinterp_fast.results import SISResult


def test_argument_types():
    assert cli._unit_interval("0") == 0.0 and cli._unit_interval("1") == 1.0 and cli._unit_interval("0.25") == 0.25
    for bad, shown in (("1.5", "1.5"), ("-0.01", "-0.01")):
        with pytest.raises(argparse.ArgumentTypeError, match=rf"^must lie in \[0, 1\], got {shown}$"):
            cli._unit_interval(bad)
    assert cli._positive("1") == 1 and cli._positive("12") == 12
    for bad in ("0", "-3"):
        with pytest.raises(argparse.ArgumentTypeError, match=rf"^must be a positive integer, got {bad}$"):
            cli._positive(bad)
    assert cli._floats("0.5") == [0.5] and cli._floats("0.485,0.456,0.406") == [0.485, 0.456, 0.406]
    with pytest.raises(argparse.ArgumentTypeError, match=r"^expected numbers separated by commas, got '0\.5;1'$"):
        cli._floats("0.5;1")


def test_parser_defaults():
    p = cli.build_parser()
    a = p.parse_args(["audit", "--model", "m.onnx", "--model", "n.onnx", "--out", "o"])
    assert a.model == ["m.onnx", "n.onnx"] and a.method == "gradient" and a.threshold == 0.9
    assert a.threshold_mode == "auto" and a.fraction == 0.05 and a.chunk_size == 64 and a.noise_sigma == 0.1
    assert a.workers == 2 and a.gallery == 24 and a.device == "cpu" and a.split == "test" and a.k is None
    assert a.images is None and a.batch_size is None and not a.restart and not a.ensemble and not a.quiet
    assert a.title == "Overinterpretation audit" and p.prog == "overinterp-fast"
    s = p.parse_args(["sis", "--model", "m.onnx", "--out", "o", "--mean", "0.1,0.2,0.3", "--limit", "5"])
    assert s.model == "m.onnx" and s.mean == [0.1, 0.2, 0.3] and s.limit == 5 and s.std is None
    d = p.parse_args(["demo"])
    assert (d.out, d.images, d.threshold, d.no_reference, d.no_imagenet, d.no_text, d.k, d.device) == \
        ("out/demo", 12, 0.9, False, False, False, None, "cpu")
    r = p.parse_args(["reduce", "--out", "o"])
    assert (r.model, r.text, r.limit, r.beam_size, r.importance) == ("bundled", "bundled", None, 5, "leave_one_out")
    g = p.parse_args(["digits-pipeline"])
    assert (g.fraction, g.train, g.test, g.epochs, g.out) == (0.05, None, None, 15, None)
    b = p.parse_args(["bench", "exact", "--", "--rounds", "2"])
    assert b.name == "exact" and b.args == ["--rounds", "2"]  # argparse drops the "--" before a remainder
    rep = p.parse_args(["report", "folder"])
    assert rep.folder == "folder" and rep.out is None and rep.gallery == 24


def test_noise_units_follow_the_normalization():
    args = types.SimpleNamespace(object_masks=None, noise_sigma=0.1)
    assert cli._noise_units(args, 0.5, 0.5) == {}
    args = types.SimpleNamespace(object_masks="masks/", noise_sigma=0.1)
    out = cli._noise_units(args, [0.485, 0.456, 0.406], [0.229, 0.224, 0.225])
    std = torch.tensor([0.229, 0.224, 0.225]).view(3, 1, 1)
    mean = torch.tensor([0.485, 0.456, 0.406]).view(3, 1, 1)
    torch.testing.assert_close(out["noise_sigma"], 0.1 / std)
    low, high = out["value_range"]
    torch.testing.assert_close(low, -mean / std)
    torch.testing.assert_close(high, (1 - mean) / std)
    one = cli._noise_units(args, 0.5, 0.25)
    assert one["noise_sigma"].shape == (1, 1, 1) and float(one["noise_sigma"]) == pytest.approx(0.4)
    assert float(one["value_range"][0]) == -2.0 and float(one["value_range"][1]) == 2.0
    for sigma in (0.0, -0.1):
        with pytest.raises(ValueError, match="^--noise-sigma must be above 0$"):
            cli._noise_units(types.SimpleNamespace(object_masks="m", noise_sigma=sigma), 0.5, 0.5)


def test_device_checks(monkeypatch):
    cli._check_device("cpu")
    with pytest.raises(ValueError, match=r"^--device: 'gpu0' is not a device \(cpu, cuda, cuda:1, \.\.\.\)$"):
        cli._check_device("gpu0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for dev in ("cuda", "cuda:1"):
        with pytest.raises(ValueError, match="^--device cuda: no CUDA GPU is available here$"):
            cli._check_device(dev)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    cli._check_device("cuda:1")


def _result(sis, target=1, score=0.987, threshold=0.9):
    mask = None
    if sis is not None:
        mask = torch.zeros(4, 5, dtype=torch.bool)
        mask.view(-1)[torch.tensor(sis, dtype=torch.long)] = True
    return SISResult(order=torch.arange(20), values=torch.zeros(20), target=target, score=score, threshold=threshold,
                     sis=None if sis is None else torch.tensor(sis), mask=mask)


def _record(models: dict[str, list]) -> AuditRecord:
    n = len(next(iter(models.values())))
    return AuditRecord("t", [f"image-with-a-long-name-{i}" for i in range(n)], [np.zeros((4, 5), np.uint8)] * n,
                       [None] * n, {1: "a class name longer than twenty-two", 2: "two"},
                       [ModelRecord(name, "exact", res) for name, res in models.items()])


def test_print_table_rows_and_summary(capsys):
    rec = _record({"a model name longer than twenty": [_result([0, 1, 2]), _result(None, target=2, score=0.5)]})
    cli._print_table(rec)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == (f"{'model':<20} {'image':<14} {'prediction':<22} {'f(x)':>6} {'tau':>6} {'SIS':>7} "
                        f"{'of image':>9}")
    # columns of 20, 14, 22, 6, 6, 7 and 9 characters, one space apart; long names cut
    assert lines[1] == " ".join(["a model name longer ", "image-with-a-l", "a class name longer th", " 0.987", " 0.900",
                                 "      3", "    15.0%"])
    assert lines[2] == " ".join(["a model name longer ", "image-with-a-l", "two" + " " * 19, " 0.500", " 0.900",
                                 "      -", "        -"])
    assert len(lines) == 3
    # more rows than ``most``: one summary line per model (the median of the sizes with a SIS)
    rec = _record({"m": [_result([0]), _result([0, 1, 2, 3]), _result([0, 1]), _result(None), _result([0, 1, 2])],
                   "none": [_result(None)] * 5})
    cli._print_table(rec, most=9)  # 10 rows; sizes 5%, 10%, 15%, 20%: the upper median
    assert capsys.readouterr().out.splitlines() == ["m: 4 of 5 images have a SIS; median size 15.0%",
                                                    "none: 0 of 5 images have a SIS; median size -"]
    cli._print_table(rec, most=10)
    assert len(capsys.readouterr().out.splitlines()) == 11  # the header and 10 rows
    # the default: a table up to 60 rows
    rec = _record({"m": [_result([0])] * 30, "n": [_result([0])] * 30})
    cli._print_table(rec)
    assert len(capsys.readouterr().out.splitlines()) == 61
    rec = _record({"m": [_result([0])] * 61})
    cli._print_table(rec)
    assert capsys.readouterr().out.splitlines() == ["m: 61 of 61 images have a SIS; median size 5.0%"]


def test_bench_finds_the_script_and_passes_the_arguments(monkeypatch, tmp_path):
    calls = []
    monkeypatch.setattr("subprocess.call", lambda argv: calls.append(argv) or 7)
    root = os.path.dirname(os.path.dirname(os.path.abspath(cli.__file__)))
    script = os.path.join(root, "benchmarks", "bench_exact.py")
    if os.path.isfile(script):
        assert cli._bench("exact", ["--", "--rounds", "2"]) == 7
        assert cli._bench("exact", ["--rounds", "--", "x"]) == 7
        assert calls == [[sys.executable, script, "--rounds", "2"], [sys.executable, script, "--rounds", "--", "x"]]
    fake = tmp_path / "overinterp_fast" / "cli.py"
    monkeypatch.setattr(cli, "__file__", str(fake))
    missing = str(tmp_path / "benchmarks" / "bench_scale.py")
    with pytest.raises(FileNotFoundError) as err:
        cli._bench("scale", [])
    assert str(err.value) == f"{missing} not found: benchmarks run from a source checkout of overinterp_fast"
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "benchmarks" / "bench_scale.py").write_text("")
    calls.clear()
    assert cli._bench("scale", []) == 7 and calls == [[sys.executable, missing]]
    calls.clear()  # a leading "--" (argparse leaves one when the user writes two) is dropped, only that one
    assert cli._bench("scale", ["--", "--", "--rounds", "1"]) == 7
    assert cli._bench("scale", ["--rounds", "--"]) == 7
    assert calls == [[sys.executable, missing, "--", "--rounds", "1"], [sys.executable, missing, "--rounds", "--"]]


def test_main_errors_are_one_line_with_exit_code_2(monkeypatch, capsys):
    for exc in (ValueError("bad value"), TypeError("bad type"), FileNotFoundError("no file"),
                FloatingPointError("nan")):
        def boom(args, exc=exc):
            raise exc

        monkeypatch.setattr(cli, "_run_sis", boom)
        assert cli.main(["sis", "--model", "m", "--out", "o"]) == 2
        assert capsys.readouterr().err == f"overinterp-fast: error: {exc}\n"
    monkeypatch.setattr(cli, "_run_sis", lambda args: (_ for _ in ()).throw(KeyError("k")))
    with pytest.raises(KeyError):  # a bug is not dressed up as a user error
        cli.main(["sis", "--model", "m", "--out", "o"])
    assert cli.main(["digits-pipeline", "--fraction", "0"]) == 2
    assert capsys.readouterr().err == "overinterp-fast: error: --fraction must be above 0\n"


def _rejects(argv) -> bool:
    try:
        cli.build_parser().parse_args(argv)
    except SystemExit as exc:
        return exc.code == 2
    return False


def test_parser_choices_types_and_required_options(capsys):
    """Every choice the README names is accepted and spelt exactly; numbers come back as numbers; --model and
    --out are required where the README says so."""
    base = {"sis": ["sis", "--model", "m", "--out", "o"], "audit": ["audit", "--model", "m", "--out", "o"]}
    choices = {"--method": ("exact", "gradient", "responsibility"), "--threshold-mode": ("auto", "absolute", "relative"),
               "--dataset": ("cifar10", "cifar100"), "--split": ("test", "train")}
    for cmd, argv in base.items():
        p = cli.build_parser()
        for opt, values in choices.items():
            dest = opt[2:].replace("-", "_")
            for v in values:
                assert getattr(p.parse_args(argv + [opt, v]), dest) == v, (cmd, opt, v)
            assert _rejects(argv + [opt, values[0].upper()]) and _rejects(argv + [opt, "other"]), (cmd, opt)
        a = p.parse_args(argv + ["--size", "32", "--k", "64", "--threshold", "0.5", "--select", "0:10",
                                 "--labels", "l.json", "--class-names", "c.txt", "--data-dir", "d", "--grey",
                                 "--collection", "--quiet", "--device", "cuda:1", "--std", "0.25"])
        assert (a.size, a.k, a.threshold, a.select, a.labels, a.class_names, a.data_dir) == \
            (32, 64, 0.5, "0:10", "l.json", "c.txt", "d")
        assert a.grey and a.collection and a.quiet and a.device == "cuda:1" and a.std == [0.25]
        assert _rejects([cmd, "--out", "o"]) and _rejects([cmd, "--model", "m"])  # both required
        assert _rejects(argv + ["--size", "0"]) and _rejects(argv + ["--limit", "x"])
    assert not hasattr(cli.build_parser().parse_args(base["sis"]), "ensemble")  # audit's options only
    a = cli.build_parser().parse_args(base["audit"] + ["--ensemble", "--restart", "--fraction", "0.1", "--title", "T",
                                                       "--object-masks", "om", "--noise-sigma", "0.2",
                                                       "--chunk-size", "8", "--batch-size", "3", "--workers", "0",
                                                       "--gallery", "5"])
    assert a.ensemble and a.restart and (a.fraction, a.title, a.object_masks, a.noise_sigma) == (0.1, "T", "om", 0.2)
    assert (a.chunk_size, a.batch_size, a.workers, a.gallery) == (8, 3, 0, 5)
    r = cli.build_parser().parse_args(["reduce", "--out", "o", "--model", "m.pt", "--text", "t.txt", "--limit", "3",
                                       "--beam-size", "1", "--importance", "gradient", "--quiet"])
    assert (r.model, r.text, r.limit, r.beam_size, r.importance, r.quiet) == ("m.pt", "t.txt", 3, 1, "gradient", True)
    assert _rejects(["reduce", "--out", "o", "--importance", "attention"]) and _rejects(["reduce"])
    assert cli.build_parser().parse_args(["reduce", "--out", "o", "--importance", "leave_one_out"]).importance == \
        "leave_one_out"
    for name in ("exact", "onnx", "gradient", "responsibility", "scale"):
        assert cli.build_parser().parse_args(["bench", name]).name == name
    assert _rejects(["bench", "text"]) and _rejects([])
    d = cli.build_parser().parse_args(["demo", "--out", "x", "--images", "3", "--threshold", "0.5", "--no-reference",
                                       "--no-imagenet", "--no-text", "--k", "9", "--device", "cuda"])
    assert (d.out, d.images, d.threshold, d.no_reference, d.no_imagenet, d.no_text, d.k, d.device) == \
        ("x", 3, 0.5, True, True, True, 9, "cuda")
    g = cli.build_parser().parse_args(["digits-pipeline", "--fraction", "0.1", "--train", "60", "--test", "30",
                                       "--epochs", "2", "--out", "r.json"])
    assert (g.fraction, g.train, g.test, g.epochs, g.out) == (0.1, 60, 30, 2, "r.json")
    rep = cli.build_parser().parse_args(["report", "f", "--out", "r.html", "--gallery", "3"])
    assert (rep.folder, rep.out, rep.gallery) == ("f", "r.html", 3)
    capsys.readouterr()

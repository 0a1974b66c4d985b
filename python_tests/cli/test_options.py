"""The command line's conventions, through its real entry point (main(argv) or a subprocess): every default read
from the options objects it fills, --version, -v/--log-level and the package's logging, --seed, --device auto, and
``audit --resume OUT`` from the folder alone."""
import ast
import json
import logging
import os
import random
import shutil
import signal
import subprocess
import sys
from dataclasses import fields

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

import overinterp_fast as of
from overinterp_fast import cli
from overinterp_fast.audit import store
from overinterp_fast.audit.config import AuditConfig, RetrainOptions, RunOptions, StoreOptions
from overinterp_fast.audit.distributed import resolve_device
from overinterp_fast.cli import main
from helpers import tiny_cnn

SIDE = 8
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PACKAGE = os.path.join(ROOT, "overinterp_fast")


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    """A torch.export file of the tiny 5-class CNN and a folder of 3 photos (12 x 10)."""
    from PIL import Image

    root = tmp_path_factory.mktemp("inputs")
    batch = torch.export.Dim("batch")
    torch.export.save(torch.export.export(tiny_cnn(3), (torch.zeros(2, 3, SIDE, SIDE),),
                                          dynamic_shapes=({0: batch},)), str(root / "net.pt2"))
    (root / "photos").mkdir()
    rng = np.random.default_rng(0)
    for i in range(3):
        Image.fromarray(rng.integers(0, 256, (12, 10, 3), dtype=np.uint8)).save(root / "photos" / f"p{i}.png")
    return root


def audit_argv(inputs, out, *more):
    return ["audit", "--model", str(inputs / "net.pt2"), "--images", str(inputs / "photos"), "--size", str(SIDE),
            "--threshold", "0.5", "--chunk-size", "1", "--workers", "0", "--quiet", "--out", str(out), *more]


@pytest.fixture(scope="module")
def completed(inputs, tmp_path_factory):
    """An audit run to the end through main(argv) (3 chunks of 1 image; method auto: exact on 8 x 8)."""
    out = tmp_path_factory.mktemp("done") / "audit"
    assert main(audit_argv(inputs, out, "--seed", "7")) == 0
    return out


def copy_of(folder, tmp_path):
    dest = tmp_path / "copy"
    shutil.copytree(folder, dest)
    return dest


def rows(folder):
    """sis.parquet's rows: one per (model, image)."""
    return pq.read_table(os.path.join(folder, store.TABLE_FILE)).to_pylist()


# ---------------------------------------------------------------------------------------------- one source


def _defaults(parser) -> dict:
    return {a.dest: a.default for a in parser._actions if a.dest != "help"}


def test_every_cli_default_is_its_options_objects_default():
    """Read off the dataclass fields: an option named like a field of the object it fills has that field's
    default (a default typed again in the parser, and changed on one side only, fails here)."""
    import inspect

    from overinterp_fast.attr.options import RunOptions as MethodRun
    from overinterp_fast.audit.pipeline import digits_pipeline
    from overinterp_fast.text import input_reduction

    parser = cli.build_parser()
    objects = (AuditConfig, StoreOptions, RunOptions)
    for command, expected in (
            ("sis", {"method", "threshold", "threshold_mode", "k", "collection", "seed", "device", "outputs"}),
            ("audit", {"method", "threshold", "threshold_mode", "k", "collection", "seed", "device", "outputs", "ensemble",
                       "fraction", "noise_sigma", "batch_size", "chunk_size", "workers", "restart", "gallery",
                       "title", "score_dtype", "pixel_subsets", "channels_last", "checkpoint_every"})):
        defaults, matched = _defaults(parser.commands[command]), set()
        for cls in objects:
            for f in fields(cls):
                if f.name in defaults:
                    assert defaults[f.name] == f.default, (command, cls.__name__, f.name)
                    matched.add(f.name)
        assert matched == expected, command  # every option with a counterpart is compared
    demo = _defaults(parser.commands["demo"])
    assert demo["threshold"] == MethodRun().threshold and demo["device"] == StoreOptions().device
    assert _defaults(parser.commands["report"])["gallery"] == StoreOptions().gallery
    reduce_, pipe = _defaults(parser.commands["reduce"]), _defaults(parser.commands["digits-pipeline"])
    signature = inspect.signature(input_reduction).parameters
    assert (reduce_["beam_size"], reduce_["importance"]) == (signature["beam_size"].default,
                                                             signature["importance"].default)
    signature = inspect.signature(digits_pipeline).parameters
    assert (pipe["fraction"], pipe["epochs"]) == (signature["fraction"].default, signature["epochs"].default)
    assert pipe["seeds"] is signature["seeds"].default is None
    retrain = _defaults(parser.commands["retrain"])
    matched = {f.name for f in fields(RetrainOptions) if f.name in retrain}
    assert matched == {"arch", "seeds", "epochs", "batch_size", "lr", "weight_decay", "device", "workers", "classes",
                       "target"}
    for f in fields(RetrainOptions):
        assert retrain[f.name] == f.default, ("retrain", f.name)


def test_the_defaults_agree_and_say_their_units():
    """The documented choices: method auto, k 100 on every device, noise in pixel units (0.1 of [0, 1]), device
    auto; and the help states the unit of --noise-sigma."""
    a = cli.parse_args(["audit", "--model", "m.pt2", "--out", "o"])
    assert (a.method, a.k, a.noise_sigma, a.device, a.seed) == ("auto", 100, 0.1, "auto", 0)
    assert AuditConfig().method == "auto" and StoreOptions().device == "auto"
    helps = {x.dest: x.help for x in cli.build_parser().commands["audit"]._actions}
    assert "pixel units" in helps["noise_sigma"] and "default 0.1" in helps["noise_sigma"]


# ---------------------------------------------------------------------------------------------- --version, logging


def run_module(*argv, env=None, timeout=120):
    """``python -m overinterp_fast ARGV`` in a subprocess (``env`` added to this one's, the crash hook unset unless
    ``env`` sets it)."""
    full = {k: v for k, v in os.environ.items() if k != store.CRASH_ENV}
    full.update(env or {}, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", "overinterp_fast", *argv], env=full, capture_output=True,
                          text=True, timeout=timeout)


def test_version(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0 and capsys.readouterr().out == f"overinterp-fast {of.__version__}\n"


@pytest.mark.parametrize("argv, level", [
    (["report", "f"], logging.WARNING), (["-v", "report", "f"], logging.INFO), (["report", "f", "-v"], logging.INFO),
    (["-vv", "report", "f"], logging.DEBUG), (["report", "f", "-vvv"], logging.DEBUG),
    (["--log-level", "error", "report", "f"], logging.ERROR), (["report", "f", "--log-level", "CRITICAL"], 50),
    (["-v", "report", "f", "--log-level", "WARNING"], logging.WARNING),  # --log-level wins over -v
])
def test_log_level_from_verbose_or_log_level_before_or_after_the_command(argv, level):
    assert cli.log_level(cli.parse_args(argv)) == level


def test_verbose_shows_the_librarys_decisions_and_leaves_logging_as_it_was(inputs, tmp_path, capsys):
    package = logging.getLogger("overinterp_fast")
    before = (package.level, list(package.handlers))
    argv = ["sis", "--model", str(inputs / "net.pt2"), "--images", str(inputs / "photos"), "--size", str(SIDE),
            "--quiet", "--out", str(tmp_path / "o")]
    assert main(argv) == 0
    assert "INFO" not in capsys.readouterr().err  # warnings only by default
    assert main(["-v"] + argv) == 0
    err = capsys.readouterr().err
    assert "INFO overinterp_fast.methods.choice: method 'auto' runs 'exact': 64 features (at most 1024)\n" in err
    assert (package.level, list(package.handlers)) == before


def test_the_package_logs_through_a_null_handler_one_logger_per_module_without_prefixes():
    """The package logger has a NullHandler; every logger is logging.getLogger(__name__) (the command line alone
    configures the package logger by name); no message of a log call or warning starts with the package's name."""
    assert any(isinstance(h, logging.NullHandler) for h in logging.getLogger("overinterp_fast").handlers)
    named, prefixed = [], []
    for folder, _, files in os.walk(PACKAGE):
        for f in files:
            if not f.endswith(".py"):
                continue
            path = os.path.join(folder, f)
            rel = os.path.relpath(path, ROOT)
            for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
                if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
                    continue
                if node.func.attr == "getLogger":
                    arg = ast.unparse(node.args[0]) if node.args else ""
                    if arg != "__name__" and not (rel == os.path.join("overinterp_fast", "cli", "__init__.py")
                                                  and arg == "'overinterp_fast'"):
                        named.append(f"{rel}: getLogger({arg})")
                if node.func.attr in ("debug", "info", "warning", "error", "exception", "warn") and node.args:
                    first = node.args[0]
                    text = first.value if isinstance(first, ast.Constant) else \
                        first.values[0].value if isinstance(first, ast.JoinedStr) and first.values and \
                        isinstance(first.values[0], ast.Constant) else ""
                    if isinstance(text, str) and text.startswith("overinterp_fast:"):
                        prefixed.append(f"{rel}:{node.lineno}")
    assert named == [] and prefixed == []


# ---------------------------------------------------------------------------------------------- --seed, --device


def test_seed_everything_seeds_random_numpy_and_torch():
    cli.seed_everything(3)
    got = (random.random(), float(np.random.rand()), float(torch.rand(())))
    random.seed(3), np.random.seed(3), torch.manual_seed(3)
    assert got == (random.random(), float(np.random.rand()), float(torch.rand(())))
    cli.seed_everything(4)
    assert random.random() != got[0]


def test_the_seed_is_recorded_with_the_audit(completed):
    doc = json.load(open(completed / store.RESULTS_FILE))
    assert doc["config"]["seed"] == 7 and doc["command"]["seed"] == 7 and doc["meta"]["seed"] == 7
    assert doc["config"]["method"] == "exact"  # "auto" on 8 x 8 images, recorded as what it ran


def test_device_auto_is_the_gpu_when_there_is_one(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == torch.device("cpu") and resolve_device("cpu") == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_device("auto") == torch.device("cuda") and resolve_device("cuda:1") == torch.device("cuda:1")
    assert resolve_device(torch.device("cpu")) == torch.device("cpu")


# ---------------------------------------------------------------------------------------------- --resume


def test_resume_continues_from_the_folder_alone_from_anywhere(completed, inputs, tmp_path, monkeypatch, capsys):
    """A committed chunk lost (as after a kill): ``audit --resume OUT`` alone, from another working directory,
    recomputes it and gives the uninterrupted audit's rows."""
    out = copy_of(completed, tmp_path)
    os.remove(store.part_path(str(out), 2, "results"))
    os.remove(out / store.TABLE_FILE)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert main(["audit", "--resume", str(out), "--quiet"]) == 0
    assert "3 chunks: 2 already committed, 1 computed" in capsys.readouterr().out
    assert rows(out) == rows(completed)
    doc = json.load(open(out / store.RESULTS_FILE))
    assert doc["status"] == "complete" and doc["command"] == json.load(open(completed / store.RESULTS_FILE))["command"]


def test_resume_takes_the_options_that_agree_or_do_not_fix_results(completed, inputs, tmp_path, capsys):
    out = copy_of(completed, tmp_path)
    assert main(["audit", "--resume", str(out), "--threshold", "0.5", "--model", str(inputs / "net.pt2"),
                 "--title", "Another title", "--workers", "1", "--gallery", "2", "--quiet", "--out", str(out)]) == 0
    assert "3 chunks: 3 already committed, 0 computed" in capsys.readouterr().out
    assert json.load(open(out / store.RESULTS_FILE))["title"] == "Another title"


@pytest.mark.parametrize("more, message", [
    (["--threshold", "0.7"], "--resume {out}: --threshold is 0.7 here, 0.5 in the stored configuration; leave it "
                             "out to continue the audit, or start over with --restart and the full command"),
    (["--method", "gradient"], "--resume {out}: --method is 'gradient' here, 'auto' in the stored configuration"),
    (["--seed", "8"], "--resume {out}: --seed is 8 here, 7 in the stored configuration"),
    (["--restart"], "--resume continues the audit stored in its folder and --restart starts over: give one"),
    (["--out", "elsewhere"], "--resume {out}: --out elsewhere is another folder; leave --out out"),
])
def test_resume_refuses_options_that_conflict_with_the_stored_ones(completed, tmp_path, capsys, more, message):
    out = copy_of(completed, tmp_path)
    before = (out / store.RESULTS_FILE).read_bytes()
    assert main(["audit", "--resume", str(out), "--quiet", *more]) == 2
    err = capsys.readouterr().err
    assert err.startswith("overinterp-fast: error: " + message.format(out=out)) and err.count("\n") == 1
    assert (out / store.RESULTS_FILE).read_bytes() == before  # nothing touched


def test_resume_refuses_a_folder_without_a_stored_configuration(completed, tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    for folder, message in ((empty, f"--resume: '{empty}' holds no stored audit configuration (results.json); "
                                    f"start the audit with --model ... --out {empty}"),
                            (tmp_path / "nowhere", f"--resume: '{tmp_path / 'nowhere'}' is not a folder")):
        assert main(["audit", "--resume", str(folder)]) == 2
        assert capsys.readouterr().err == f"overinterp-fast: error: {message}\n"
    out = copy_of(completed, tmp_path)  # written without the command line, as by an earlier version
    doc = json.load(open(out / store.RESULTS_FILE))
    del doc["command"]
    store.write_json(str(out / store.RESULTS_FILE), doc)
    assert main(["audit", "--resume", str(out)]) == 2
    assert capsys.readouterr().err == (f"overinterp-fast: error: --resume: the audit in '{out}' was stored without "
                                       f"its command line (by an earlier version); rerun its full command with "
                                       f"--out {out}\n")


@pytest.mark.parametrize("argv, message", [
    (["audit", "--model", "m", "--out", "o", "--threshold", "2"], "argument --threshold: must lie in [0, 1], got 2.0"),
    (["sis", "--model", "m", "--out", "o", "--method", "fast"], "argument --method: invalid choice: 'fast'"),
    (["audit", "--out", "o"], "the following arguments are required: --model (or --resume OUT)"),
    (["nonsense"], "argument command: invalid choice: 'nonsense'"),
])
def test_argument_errors_end_in_the_line_every_error_ends_in(capsys, argv, message):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.startswith("usage: overinterp-fast"), err
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"overinterp-fast: error: {message}"), last


def test_audit_needs_model_and_out_or_resume(capsys):
    for argv, missing in ((["audit", "--out", "o"], "--model"), (["audit", "--model", "m"], "--out"),
                          (["audit"], "--model, --out")):
        with pytest.raises(SystemExit) as exit_:
            main(argv)
        assert exit_.value.code == 2
        assert f"error: the following arguments are required: {missing} (or --resume OUT)" in capsys.readouterr().err


@pytest.mark.slow  # an audit in a subprocess killed by SIGKILL after its second commit, resumed in another
@pytest.mark.timeout(240)  # measured 35 s wall on 2 shared cores at a load average of about 4
def test_a_killed_audit_resumes_from_the_folder_alone(completed, inputs, tmp_path):
    out = tmp_path / "audit"
    p = run_module(*audit_argv(inputs, out, "--seed", "7"), env={"OMP_NUM_THREADS": "1",
                                                                 store.CRASH_ENV: "1:committed"})
    assert p.returncode == -signal.SIGKILL, p.stderr
    assert store.committed_chunks(str(out)) == {0, 1} and store.read_doc(str(out))["status"] == "running"
    q = run_module("audit", "--resume", str(out), "--quiet", env={"OMP_NUM_THREADS": "1"})
    assert q.returncode == 0, q.stderr
    assert "3 chunks: 2 already committed, 1 computed" in q.stdout
    assert rows(out) == rows(completed)

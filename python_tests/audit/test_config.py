"""The audit's options objects: their documented defaults, the options a model's record lists, and the one-line
refusal of anything else in their place."""
import pytest

from overinterp_fast.audit.config import AuditConfig, RunOptions, StoreOptions, check_type
from overinterp_fast.audit.runner import run_audit


def test_defaults():
    c = AuditConfig()
    assert (c.method, c.threshold, c.threshold_mode, c.k, c.autocast, c.collection) == (
        "exact", 0.9, "auto", 100, None, False)
    assert (c.mask_value, c.batch_size, c.ensemble, c.transfer, c.fraction, c.noise_sigma, c.value_range) == (
        0.0, None, False, True, 0.05, 0.25, None)
    r = RunOptions()
    assert (r.class_name(3), r.title, r.meta, r.progress) == ("3", "Overinterpretation audit", None, None)
    s = StoreOptions()
    assert (s.chunk_size, s.restart, s.workers, s.device, s.identity, s.report, s.gallery, s.load) == (
        64, False, 2, "cpu", None, True, 24, True)


def test_model_options_list_k_and_autocast_for_the_gradient_method_only():
    assert AuditConfig(threshold=0.5, baselines=0.25, k=3).model_options() == {
        "threshold": 0.5, "threshold_mode": "auto", "mask_value": 0.25}
    assert AuditConfig(method="gradient", threshold_mode="relative", k=3, autocast="bf16").model_options() == {
        "threshold": 0.9, "threshold_mode": "relative", "mask_value": 0.0, "k": 3, "autocast": "bf16"}


def test_check_type():
    given = AuditConfig(k=5)
    assert check_type(given, AuditConfig, "config") is given and check_type(None, AuditConfig, "config") == AuditConfig()
    with pytest.raises(TypeError, match="^config must be of type AuditConfig \\(or None for the defaults\\), got dict$"):
        check_type({"k": 5}, AuditConfig, "config")
    with pytest.raises(TypeError, match="^run must be of type RunOptions"):
        run_audit({"m": None}, None, [], [], AuditConfig(), {"progress": False})

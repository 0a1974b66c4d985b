"""The audit's options objects: their documented defaults, the options a model's record lists, and the one-line
refusal of anything else in their place."""
import pytest

from overinterp_fast.audit.config import AuditConfig, RunOptions, StoreOptions, check_type
from overinterp_fast.audit.runner import run_audit


def test_defaults():
    c = AuditConfig()
    assert (c.method, c.threshold, c.threshold_mode, c.k, c.autocast, c.collection) == (
        "auto", 0.9, "auto", 100, None, False)
    assert (c.baselines, c.batch_size, c.ensemble, c.transfer, c.fraction, c.noise_sigma, c.value_range, c.seed) == (
        None, None, False, True, 0.05, 0.1, None, 0)
    r = RunOptions()
    assert (r.class_name(3), r.title, r.meta, r.show_progress) == ("3", "Overinterpretation audit", None, None)
    s = StoreOptions()
    assert (s.chunk_size, s.restart, s.workers, s.device, s.identity, s.report, s.gallery, s.load, s.command) == (
        64, False, 2, "auto", None, True, 24, True, None)


def test_the_method_defaults_are_the_method_options_ones():
    """One source: the audit's threshold, k, collection, batch size and seed are the method options' defaults."""
    import overinterp_fast as of

    c = AuditConfig()
    assert c.threshold == of.attr.RunOptions().threshold and c.collection == of.attr.RunOptions().collection
    assert c.batch_size == of.attr.RunOptions().batch_size and c.k == of.GradientOptions().k
    assert c.seed == of.MinimalPixelSetOptions().seed


def test_model_options_list_k_and_autocast_for_the_gradient_method_and_the_seed_for_responsibility():
    assert AuditConfig(threshold=0.5, baselines=0.25, k=3).model_options() == {
        "threshold": 0.5, "threshold_mode": "auto", "baselines": 0.25}
    assert AuditConfig(method="gradient", threshold_mode="relative", k=3, autocast="bf16").model_options() == {
        "threshold": 0.9, "threshold_mode": "relative", "baselines": 0.0, "k": 3, "autocast": "bf16"}
    assert AuditConfig(method="responsibility", seed=4, k=3).model_options() == {
        "threshold": 0.9, "threshold_mode": "auto", "baselines": 0.0, "seed": 4}


def test_the_old_names_still_work_with_a_future_warning():
    with pytest.warns(FutureWarning, match="^AuditConfig\\(\\): 'mask_value' is now 'baselines'; the name 'mask_value' "
                      "will be removed in overinterp_fast 0.2$"):
        c = AuditConfig(mask_value=0.5, k=3)
    assert c == AuditConfig(baselines=0.5, k=3)
    with pytest.warns(FutureWarning, match="^AuditConfig: 'mask_value' is now 'baselines'"):
        assert c.mask_value == 0.5
    with pytest.warns(FutureWarning, match="^RunOptions\\(\\): 'progress' is now 'show_progress'"):
        r = RunOptions(progress=False, title="T")
    assert r == RunOptions(show_progress=False, title="T")
    with pytest.warns(FutureWarning, match="^RunOptions: 'progress' is now 'show_progress'"):
        assert r.progress is False
    with pytest.raises(TypeError, match="got both 'mask_value' and 'baselines'"):
        AuditConfig(mask_value=0.5, baselines=0.5)


def test_check_type():
    given = AuditConfig(k=5)
    assert check_type(given, AuditConfig, "config") is given and check_type(None, AuditConfig, "config") == AuditConfig()
    with pytest.raises(TypeError, match="^config must be of type AuditConfig \\(or None for the defaults\\), got dict$"):
        check_type({"k": 5}, AuditConfig, "config")
    with pytest.raises(TypeError, match="^run must be of type RunOptions"):
        run_audit({"m": None}, None, [], [], AuditConfig(), {"progress": False})

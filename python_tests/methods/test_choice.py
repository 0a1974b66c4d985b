"""method="auto" (methods/choice.py): one rule for fast_sis and the audits, by features and gradients."""
import torch

from overinterp_fast.methods.choice import AUTO_EXACT_FEATURES, has_gradients, resolve_method
from overinterp_fast.runtime import runinfo
from overinterp_fast.runtime.model import Ensemble


def test_auto_by_features_gradients_and_pixels():
    net = torch.nn.Linear(2, 2)
    assert AUTO_EXACT_FEATURES == 1024
    assert resolve_method("auto", 1024, [net]) == "exact" and resolve_method("auto", 1025, [net]) == "gradient"
    assert resolve_method("auto", 1025, ["m.onnx"]) == "responsibility"
    assert resolve_method("auto", 1025, [net, "m.onnx"]) == "responsibility"  # every model needs gradients
    assert resolve_method("auto", 1025, ["m.onnx"], pixels=False) == "exact"  # no pixel features: no maps
    assert resolve_method("gradient", 4, ["m.onnx"]) == "gradient"  # a method named is the method run
    with runinfo.collecting() as info:
        resolve_method("auto", 2000, [net])
    assert info == {"method": "gradient (auto: 2000 features, more than 1024)"}


def test_has_gradients_looks_inside_lists_and_ensembles():
    net = torch.nn.Linear(2, 2)
    assert has_gradients(net) and has_gradients(lambda x: x) and has_gradients([net, net])
    assert not has_gradients("m.onnx") and not has_gradients([net, "m.onnx"])
    assert has_gradients(Ensemble([net, net])) and not has_gradients(Ensemble([net, "m.onnx"]))

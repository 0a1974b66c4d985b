"""The research classes (overinterp_fast/experimental/research.py): their options reach the descents as a hook,
and the public classes carry none."""
import pytest
import torch

import overinterp_fast as of
from overinterp_fast.attr import minimal as attr_minimal, responsibility as attr_resp
from overinterp_fast.experimental import SurrogateMinimalPixelSet, SurrogateOptions, SurrogateResponsibility
from overinterp_fast.experimental.mutant_memory import remembered_responsibility
from helpers import PatchReader, whole_message


def _plans(monkeypatch, module):
    plans = []

    def record(evaluator, prep, present, passes, plan):
        plans.append(plan)
        n, _, h, w = prep.images.shape
        return torch.zeros(n, h, w, dtype=torch.float64), [0] * n

    monkeypatch.setattr(module, "ranking_maps", record)
    return plans


@pytest.mark.mutation
@pytest.mark.parametrize("cls, module, run", [
    (SurrogateResponsibility, attr_resp, "compute_maps"), (SurrogateMinimalPixelSet, attr_minimal, "find_sis")])
def test_the_options_reach_the_descents_as_a_hook(monkeypatch, cls, module, run):
    plans = _plans(monkeypatch, module)
    x = torch.ones(1, 1, 28, 28)
    model = PatchReader(slice(0, 4), slice(0, 4)).eval()
    getattr(cls(model, iterations=3, seed=5, monotone_memory=True, gated_iterations=2), run)(x)
    getattr(cls(model, iterations=3, virtual_iterations=4), run)(x)
    public_cls = of.MinimalPixelSet if cls is SurrogateMinimalPixelSet else of.Responsibility
    getattr(public_cls(model, iterations=3), run)(x)
    memory, virtual, public = plans
    assert memory.hook.descents is remembered_responsibility and memory.seed == 5 and memory.iterations == 3
    assert virtual.hook.descents is None and virtual.hook.after is not None
    assert public.hook is None


def test_the_options_are_checked():
    model = PatchReader(slice(0, 4), slice(0, 4)).eval()
    assert SurrogateOptions() == SurrogateOptions(0, 0, False)
    with pytest.raises(ValueError, match=whole_message("virtual_iterations must be an int >= 0, got -1")):
        SurrogateResponsibility(model, virtual_iterations=-1)
    with pytest.raises(ValueError, match=whole_message(
            'gated_iterations needs an int number of iterations, not iterations="auto"')):
        SurrogateMinimalPixelSet(model, iterations="auto", gated_iterations=1)
    with pytest.raises(ValueError, match=whole_message("monotone_memory must be True or False, got 1")):
        SurrogateMinimalPixelSet(model, monotone_memory=1)
    with pytest.raises(TypeError, match="unexpected keyword argument 'k'"):
        SurrogateMinimalPixelSet(model, k=3)

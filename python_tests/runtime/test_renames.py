"""The one vocabulary: renamed keywords and attributes keep working for one release with a FutureWarning that names
the new name and points at the caller's line; every public function takes the new names (Captum's:
``baselines``, ``feature_mask``, ``show_progress``) and none of the old ones."""
import inspect
import warnings
from dataclasses import dataclass

import pytest
import torch

import overinterp_fast as of
from overinterp_fast import audit, text
from overinterp_fast.audit.pipeline import digits_pipeline
from overinterp_fast.cli.demo import run_demo
from overinterp_fast.methods import reference
from overinterp_fast.runtime.renames import moved_keywords, renamed_attribute, renamed_keywords
from overinterp_fast.zoo.text import bundled_text_model, train_text_cnn

OLD = {"mask_value", "features", "progress"}
NEW = {"mask_value": "baselines", "features": "feature_mask", "progress": "show_progress"}


@renamed_keywords(colour="color", size="shape")
def paint(x, *, color=None, shape=1):
    """Paint ``x``."""
    return (x, color, shape)


def test_an_old_keyword_runs_as_the_new_one_with_a_future_warning_at_the_callers_line():
    with pytest.warns(FutureWarning) as caught:
        assert paint(1, colour="red") == (1, "red", 1)
    (w,) = caught
    assert str(w.message) == ("paint(): 'colour' is now 'color'; the name 'colour' will be removed in "
                              "overinterp_fast 0.2")
    assert w.filename == __file__  # the caller's line, not the decorator's
    with pytest.warns(FutureWarning) as caught:
        assert paint(2, colour="blue", size=3) == (2, "blue", 3)
    assert [str(w.message).split(";")[0] for w in caught] == ["paint(): 'colour' is now 'color'",
                                                              "paint(): 'size' is now 'shape'"]


def test_the_new_names_run_without_a_warning_and_both_names_together_are_refused():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert paint(1, color="red", shape=2) == (1, "red", 2)
        assert paint(1) == (1, None, 1)
    with pytest.raises(TypeError, match="^paint\\(\\) got both 'colour' and 'color', which is its new name; give "
                                        "'color' only$"):
        paint(1, colour="red", color="blue")
    with pytest.raises(TypeError, match="unexpected keyword argument 'hue'"):  # anything else: the function's own
        paint(1, hue="red")


def test_the_signature_and_docstring_are_the_functions_own():
    assert list(inspect.signature(paint).parameters) == ["x", "color", "shape"]
    assert paint.__doc__ == "Paint ``x``." and paint.__name__ == "paint"
    assert paint.renamed_keywords == {"colour": "color", "size": "shape"}


def test_moved_keywords_alone():
    with pytest.warns(FutureWarning, match="^f\\(\\): 'a' is now 'b'") as caught:
        assert moved_keywords("f()", {"a": 1, "c": 2}, {"a": "b"}) == {"b": 1, "c": 2}
    assert caught[0].filename == __file__
    assert moved_keywords("f()", {"c": 2}, {"a": "b"}) == {"c": 2}


@dataclass(frozen=True)
class Options:
    shape: int = 1

    size = renamed_attribute("size", "shape", "Options")


Options.__init__ = renamed_keywords(size="shape")(Options.__init__)


def test_a_renamed_dataclass_field_by_keyword_and_attribute():
    with pytest.warns(FutureWarning, match="^Options\\(\\): 'size' is now 'shape'"):
        o = Options(size=4)
    assert o == Options(shape=4) and o.shape == 4
    with pytest.warns(FutureWarning, match="^Options: 'size' is now 'shape'") as caught:
        assert o.size == 4
    assert caught[0].filename == __file__
    assert [f for f in Options.__dataclass_fields__] == ["shape"]


# Every public function and options object that took the old names: what each renames.
RENAMED = [
    (of.fast_sis, NEW),
    (of.responsibility, {"mask_value": "baselines", "progress": "show_progress"}),
    (of.sufficient_subset, {"mask_value": "baselines", "features": "feature_mask"}),
    (reference.sis, {"mask_value": "baselines", "features": "feature_mask"}),
    (reference.gradient_sis, {"mask_value": "baselines", "features": "feature_mask"}),
    (reference.responsibility, {"mask_value": "baselines"}),
    (audit.pixel_subsets, {"mask_value": "baselines", "features": "feature_mask"}),
    (audit.random_subsets, {"mask_value": "baselines", "features": "feature_mask"}),
    (audit.AuditConfig.__init__, {"mask_value": "baselines"}),
    (audit.RunOptions.__init__, {"progress": "show_progress"}),
    (digits_pipeline, {"progress": "show_progress"}),
    (text.input_reduction, {"progress": "show_progress"}),
    (text.token_sis, {"progress": "show_progress"}),
    (text.entropy_finetune, {"progress": "show_progress"}),
    (train_text_cnn, {"progress": "show_progress"}),
    (bundled_text_model, {"progress": "show_progress"}),
    (run_demo, {"progress": "show_progress"}),
]


@pytest.mark.parametrize("fn, renames", RENAMED, ids=[f.__qualname__ for f, _ in RENAMED])
def test_every_public_function_takes_the_new_names_and_accepts_the_old(fn, renames):
    params = set(inspect.signature(fn).parameters)
    assert fn.renamed_keywords == renames
    assert set(renames.values()) <= params and not (OLD & params)


def test_no_public_callable_of_the_package_keeps_an_old_name():
    """The functions and classes the package exports (and their methods) take none of the old names."""
    seen, wrong = set(), []
    for module in (of, of.attr, of.audit, of.text, of.reference):
        for name in getattr(module, "__all__", [n for n in dir(module) if not n.startswith("_")]):
            obj = getattr(module, name)
            methods = [m for n, m in inspect.getmembers(obj, inspect.isfunction) if not n.startswith("_")] \
                if inspect.isclass(obj) else []
            for fn in [obj, *methods]:
                if callable(fn) and id(fn) not in seen:
                    seen.add(id(fn))
                    try:
                        params = set(inspect.signature(fn).parameters)
                    except (TypeError, ValueError):
                        continue
                    wrong += [f"{getattr(fn, '__qualname__', name)}({p})" for p in sorted(OLD & params)]
    assert wrong == [] and len(seen) > 40


def test_fast_sis_with_the_old_names_gives_the_new_names_result():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(12, 3)).eval()
    x = torch.randn(2, 3, 2, 2)
    patches = torch.tensor([[0, 0], [1, 1]])
    new = of.fast_sis(model, x, 0.4, baselines=0.25, feature_mask=patches, show_progress=False)
    with pytest.warns(FutureWarning) as caught:
        old = of.fast_sis(model, x, 0.4, mask_value=0.25, features=patches, progress=False)
    assert sorted(str(w.message).split(";")[0] for w in caught) == [
        "fast_sis(): 'features' is now 'feature_mask'", "fast_sis(): 'mask_value' is now 'baselines'",
        "fast_sis(): 'progress' is now 'show_progress'"]
    assert all(w.filename == __file__ for w in caught)
    for a, b in zip(old, new):
        assert torch.equal(a.order, b.order) and torch.equal(a.values, b.values)
    # the baseline and the features arrive: another baseline gives other values (patches: 2 features)
    other = of.fast_sis(model, x, 0.4, baselines=-3.0, feature_mask=patches, show_progress=False)
    assert new[0].order.numel() == 2 and not torch.equal(other[0].values, new[0].values)
    ref = reference.sis(model, x, 0.4, baselines=0.25, feature_mask=patches)
    assert [r.order.tolist() for r in ref] == [r.order.tolist() for r in new]

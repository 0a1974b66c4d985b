"""Renamed keyword arguments and attributes: the old name keeps working for one release, with a ``FutureWarning``
that names the new one (docs: conventions.md, Names).

    @renamed_keywords(mask_value="baselines", features="feature_mask", progress="show_progress")
    def fast_sis(model, images, threshold=0.9, *, baselines=None, feature_mask=None, show_progress=None): ...

    fast_sis(model, images, mask_value=0.5)   # FutureWarning: ... 'mask_value' is now 'baselines' ...; runs as
                                              # fast_sis(model, images, baselines=0.5)

Every rename of the package goes through :func:`renamed_keywords` (functions and dataclass constructors) or
:func:`renamed_attribute` (reading a renamed dataclass field), so every old name warns alike.
"""
from __future__ import annotations

import functools
import warnings
from typing import Callable, TypeVar

F = TypeVar("F", bound=Callable)
REMOVED_IN = "0.2"  # the release that drops the old names


def _warn(where: str, old: str, new: str, stacklevel: int) -> None:
    """The warning; ``stacklevel`` as :func:`warnings.warn`'s, counted from here (1: this function)."""
    warnings.warn(f"{where}: {old!r} is now {new!r}; the name {old!r} will be removed in overinterp_fast "
                  f"{REMOVED_IN}", FutureWarning, stacklevel=stacklevel)


def _callable_name(fn: Callable) -> str:
    """What a warning calls a function: ``fast_sis()``; a constructor: ``AuditConfig()``."""
    return fn.__qualname__.removesuffix(".__init__") + "()"


def moved_keywords(where: str, kwargs: dict, renames: dict[str, str], stacklevel: int = 1) -> dict:
    """``kwargs`` with every old name of ``renames`` (old -> new) replaced by its new name, warning once per old
    name given (``where`` names the callable; ``stacklevel`` 1: the warning points at the line calling this, 2: at
    its caller, ...). Giving an old name and its new name together is a TypeError."""
    out = dict(kwargs)
    for old, new in renames.items():
        if old in out:
            if new in out:
                raise TypeError(f"{where} got both {old!r} and {new!r}, which is its new name; give {new!r} only")
            _warn(where, old, new, stacklevel + 2)
            out[new] = out.pop(old)
    return out


def renamed_keywords(**renames: str) -> Callable[[F], F]:
    """Decorator: the keyword arguments ``old=new`` are accepted under their old names for one release (a
    ``FutureWarning`` naming the new name, pointing at the caller's line). The signature shown by ``help()`` and
    the documentation is the function's own, with the new names. ``wrapper.renamed_keywords`` holds ``renames``."""

    def decorate(fn: F) -> F:
        where = _callable_name(fn)

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            if not renames.keys().isdisjoint(kwargs):
                kwargs = moved_keywords(where, kwargs, renames, stacklevel=2)
            return fn(*args, **kwargs)

        wrapper.renamed_keywords = dict(renames)
        return wrapper  # type: ignore[return-value]

    return decorate


def renamed_attribute(old: str, new: str, owner: str) -> property:
    """A read-only property ``old`` that returns ``new`` with a ``FutureWarning`` (a renamed field of
    ``owner``, a class name for the message)."""

    def get(self):
        _warn(owner, old, new, 3)
        return getattr(self, new)

    return property(get, doc=f"Renamed {new!r}; the old name warns and will be removed in {REMOVED_IN}.")

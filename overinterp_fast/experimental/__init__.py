"""Research options of the responsibility method: surrogate (virtual and gated) descents and the mutant memory.

They are measured and tested but no default uses them, and their interface may change; the public classes and
:func:`overinterp_fast.fast_sis` do not take them. Use them through:

- :class:`SurrogateResponsibility` and :class:`SurrogateMinimalPixelSet`: the public
  :class:`~overinterp_fast.attr.Responsibility` and :class:`~overinterp_fast.attr.MinimalPixelSet` with three more
  constructor keywords, ``virtual_iterations``, ``gated_iterations`` and ``monotone_memory``
  (:class:`SurrogateOptions`)::

      from overinterp_fast.experimental import SurrogateMinimalPixelSet
      sets = SurrogateMinimalPixelSet(model, iterations=8, gated_iterations=9, virtual_iterations=100,
                                      monotone_memory=True).find_sis(images)

- or, at the level of the descents, :func:`~overinterp_fast.experimental.surrogate.research_hook`, a
  :class:`~overinterp_fast.methods.responsibility.RankingHook` for
  :func:`~overinterp_fast.methods.responsibility.ranking_maps`.

Modules: :mod:`.surrogate` (virtual and gated descents), :mod:`.mutant_memory` (the memory),
:mod:`.research` (the classes).
"""
from .research import SurrogateMinimalPixelSet, SurrogateOptions, SurrogateResponsibility
from .surrogate import research_hook

__all__ = ["SurrogateResponsibility", "SurrogateMinimalPixelSet", "SurrogateOptions", "research_hook"]

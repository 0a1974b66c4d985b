"""The research options as classes: :class:`SurrogateResponsibility` and :class:`SurrogateMinimalPixelSet` are
:class:`~overinterp_fast.attr.Responsibility` and :class:`~overinterp_fast.attr.MinimalPixelSet` with the
surrogate (virtual and gated) descents and the mutant memory plugged into their descents
(:func:`~overinterp_fast.experimental.surrogate.research_hook`)."""
from __future__ import annotations

from dataclasses import dataclass

from ..attr.minimal import MinimalPixelSet
from ..attr.responsibility import Responsibility
from ..methods.responsibility import RankingHook
from ..runtime.job import check_flag
from .mutant_memory import check_monotone_memory
from .surrogate import check_gated_iterations, check_virtual_iterations, research_hook


@dataclass(frozen=True)
class SurrogateOptions:
    """The research options (all off by default; their interface may change).

    Attributes:
        virtual_iterations: after the real descents, this many more per image on a surrogate of the criterion
            (a logistic model per image on the share of each cell of a 14x14 grid kept, fitted to the mutants
            the real descents scored), at no query; their log maps are added
            (:mod:`~overinterp_fast.experimental.surrogate`; the map is then an estimate of ReX's).
        gated_iterations: with an int number of iterations: after the real descents, this many more per image
            (seeds seed + iterations + t) in which a surrogate refitted to every mutant scored so far answers the
            mutants it is sure of and the model the others
            (:func:`~overinterp_fast.experimental.surrogate.add_gated_descents`).
        monotone_memory: with an int number of iterations and the "top1" criterion: the real descents run in
            waves, and a mutant that keeps every pixel of a mutant of its image that passed before, or no pixel
            outside one that failed, takes that answer without a query
            (:mod:`~overinterp_fast.experimental.mutant_memory`; about 12% of those answers are wrong on
            EfficientNet-Lite0, so the map estimates ReX's).
    """

    virtual_iterations: int = 0
    gated_iterations: int = 0
    monotone_memory: bool = False

    def __post_init__(self):
        check_virtual_iterations(self.virtual_iterations)
        check_gated_iterations(self.gated_iterations, 1)
        check_flag("monotone_memory", self.monotone_memory, none=False)

    def check_with(self, iterations: int | str, criterion: str) -> None:
        """The checks against the method's options: gated descents and the memory need an int number of
        iterations; the memory the "top1" criterion."""
        check_gated_iterations(self.gated_iterations, iterations)
        check_monotone_memory(self.monotone_memory, iterations, criterion)

    def hook(self) -> RankingHook:
        """The hook into :func:`~overinterp_fast.methods.responsibility.ranking_maps`."""
        return research_hook(self.virtual_iterations, self.gated_iterations, self.monotone_memory)


_D = SurrogateOptions  # the defaults' single source


class _WithResearch:
    """The research options' keywords and hook, for a class whose descents take a hook (Responsibility,
    MinimalPixelSet); ``research``: its :class:`SurrogateOptions`."""

    def __init__(self, forward_func, *, virtual_iterations: int = _D.virtual_iterations,
                 gated_iterations: int = _D.gated_iterations, monotone_memory: bool = _D.monotone_memory,
                 **kwargs) -> None:
        super().__init__(forward_func, **kwargs)
        self.research = SurrogateOptions(virtual_iterations, gated_iterations, monotone_memory)
        self.research.check_with(self.options.iterations, self.options.criterion)

    def _hook(self) -> RankingHook:
        return self.research.hook()


class SurrogateResponsibility(_WithResearch, Responsibility):
    """:class:`~overinterp_fast.attr.Responsibility` with the research options of :class:`SurrogateOptions`.

    Args:
        forward_func, **kwargs: as :class:`~overinterp_fast.attr.Responsibility`.
        virtual_iterations, gated_iterations, monotone_memory: :class:`SurrogateOptions`.

    Example:
        >>> maps = SurrogateResponsibility(model, iterations=4, gated_iterations=9,
        ...                                virtual_iterations=100).compute_maps(images)
    """


class SurrogateMinimalPixelSet(_WithResearch, MinimalPixelSet):
    """:class:`~overinterp_fast.attr.MinimalPixelSet` with the research options of :class:`SurrogateOptions`
    (the sets are extracted and checked on the model as always).

    Args:
        forward_func, **kwargs: as :class:`~overinterp_fast.attr.MinimalPixelSet`.
        virtual_iterations, gated_iterations, monotone_memory: :class:`SurrogateOptions`.

    Example:
        >>> sets = SurrogateMinimalPixelSet(model, iterations=8, gated_iterations=9, virtual_iterations=100,
        ...                                 monotone_memory=True).find_sis(images)
    """

"""Comparing designs with computed uncertainty: :mod:`~modkit.experiments.compare` (several specs under one recipe,
one report), :mod:`~modkit.experiments.ladder` (loss against compute fits) and
:mod:`~modkit.experiments.ladder_intervals` (their intervals, with measured coverage), :mod:`~modkit.experiments.stats`
(intervals and tests), :mod:`~modkit.experiments.scaling` (a design at other widths and depths),
:mod:`~modkit.experiments.coordcheck` (the coordinate check of a parametrization)."""

from modkit.core._lazy import make_lazy

make_lazy(__name__, {})  # a submodule loads on first attribute access (modkit.nn.cache), as after an import

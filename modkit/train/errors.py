"""The error of the training package: a run that cannot start or continue."""

from __future__ import annotations

from modkit.core.errors import ModkitError


class TrainError(ModkitError, ValueError):
    """A training run cannot start or continue (bad combination of config, model and data); says what to change."""

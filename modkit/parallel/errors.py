"""The errors and warnings of :mod:`modkit.parallel`."""

from __future__ import annotations

from modkit.core.errors import ModkitError


class ParallelError(ModkitError, ValueError):
    """A parallel layout cannot be applied (degree not dividing a sharded size, a malformed plan, a bad mesh).

    Raised before any collective runs; the message names the module path and the offending values.
    """


class PlanWarning(UserWarning):
    """A component is replicated under tensor parallelism for lack of a plan (or an unshardable vocabulary)."""

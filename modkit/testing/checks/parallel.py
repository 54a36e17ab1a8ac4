"""``shards``: a component's declared ``tp_plan`` gives the single-process logits under tensor parallelism.

The work is done by :mod:`modkit.testing.shards` (2 gloo processes on the CPU, one session for every component
checked); this module adapts it to the check interface.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

from modkit.core.config import ComponentConfig
from modkit.core.registry import Component
from ..harness import Bench
from .base import CheckFailed, CheckSkipped


def applies_shards(entry: Component, config: ComponentConfig) -> Optional[str]:
    """Entries whose capabilities declare a non-empty ``tp_plan``."""
    plan = entry.capabilities.get("tp_plan")
    return None if isinstance(plan, dict) and plan else "the entry declares no non-empty tp_plan capability"


def outcome(value: Any) -> str:
    """A detail string, or raise what ``run_many`` returned as the bench's outcome."""
    from ..shards import Skip

    if isinstance(value, Skip):
        raise CheckSkipped(str(value))
    if isinstance(value, AssertionError) and not isinstance(value, CheckFailed):
        raise CheckFailed(str(value))
    if isinstance(value, BaseException):
        raise value
    return value


def check_shards(bench: Bench) -> str:
    """The component's ``tp_plan`` is right: under tensor parallelism (tp = 2) one training step equals the single
    process's.

    The tiny model holding the component is built by :func:`modkit.build` (the reference) and, in 2 gloo
    processes on the CPU, by :func:`modkit.parallel.build_parallel` (``make_mesh(tp=2)``, ``parallelize``,
    ``materialize`` with the same seed); both run forward, cross entropy (+ aux loss), backward and one AdamW
    step. ``max |Δ|`` of the logits, of every parameter's gradient, of the gradient w.r.t. the input embeddings
    and of the parameters after the step must be at most ``1e-5``, and parameters that are not sharded must be
    identical on both ranks. A plan that shards a projection the wrong way fails with the value (or the shape
    error it raises); a replicated weight declared on a sharded activation fails on its gradient. Head counts not divisible by 2
    are raised to multiples of 2 when the config accepts it, else the check is skipped with the reason. Slow
    (process start): opt-in, see the module docstring. Source: Megatron-LM's column/row split (arXiv:1909.08053);
    the plan is the component's own ``tp_plan`` capability (:mod:`modkit.parallel`).

    Catches: a projection sharded the wrong way (rowwise where colwise is needed), a head count the plan cannot
    split, a replicated parameter that reads a sharded activation.
    """
    from ..shards import run_benches

    return outcome(run_benches([bench])[0])


def shards_many(benches: Sequence[Bench]) -> list:
    from ..shards import run_benches

    return run_benches(benches)

"""``modkit.testing``: the contract kit a plugin author runs on their own components.

Three ways to run the same suite of checks (:data:`~modkit.testing.checks.CHECKS`) over the live registry:

* pytest: ``pytest --modkit-contracts [--modkit-plugin NAME] [--modkit-kind K] [--modkit-type T]`` (the plugin is
  registered under the ``pytest11`` entry point, so no ``conftest.py`` is needed); ids read
  ``attention/gqa::causality``.
* the command line: ``modkit check [--plugin NAME] [--kind K] [--type T]`` prints a component x check table (and
  the neighbours used) and exits non-zero naming each failed check.
* Python::

      from modkit.testing import check_component
      for r in check_component("norm", "rmsnorm"):
          print(r.id, r.status, r.detail)

``shards`` (a declared ``tp_plan`` trains like the single process under tensor parallelism, tp = 2, in 2 gloo
processes on the CPU: logits, parameter and input gradients, one AdamW step, replicated parameters equal on all
ranks) is slow and opt-in: ``modkit check --distributed``, ``pytest --modkit-contracts
--modkit-distributed`` or ``check_component(..., distributed=True)``; otherwise it is reported skipped.

Which checks apply is decided by the entry's kind and capabilities; each component is built inside tiny models
(``d_model`` 32, 2 layers, vocabulary 64) from its ``example`` config, its neighbours taken from modkit's built-in
components only (or named: ``neighbours={"attention": "my-attention"}``, ``modkit check --neighbour
attention=my-attention``), so another installed plugin never changes a verdict (see :mod:`modkit.testing.harness`).
The checks live in :mod:`modkit.testing.checks`, one family per module, each saying which fault it catches.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from modkit.core._lazy import make_lazy

if TYPE_CHECKING:  # for type checkers and editors; at run time the names load on first use (modkit.core._lazy)
    from .checks import (
        CHECK_NAMES,
        CHECKS,
        Check,
        CheckFailed,
        CheckResult,
        CheckSkipped,
        ComponentChecks,
        check_component,
        get_check,
        run_checks,
        select_components,
    )
    from .harness import Bench

#: exported name -> the module defining it
_EXPORTS = {
    "CHECK_NAMES": "modkit.testing.checks",
    "CHECKS": "modkit.testing.checks",
    "Check": "modkit.testing.checks",
    "CheckFailed": "modkit.testing.checks",
    "CheckResult": "modkit.testing.checks",
    "CheckSkipped": "modkit.testing.checks",
    "ComponentChecks": "modkit.testing.checks",
    "check_component": "modkit.testing.checks",
    "get_check": "modkit.testing.checks",
    "run_checks": "modkit.testing.checks",
    "select_components": "modkit.testing.checks",
    "Bench": "modkit.testing.harness",
}

__all__ = [
    "Bench",
    "CHECKS",
    "CHECK_NAMES",
    "Check",
    "CheckFailed",
    "CheckResult",
    "CheckSkipped",
    "ComponentChecks",
    "check_component",
    "get_check",
    "run_checks",
    "select_components",
]

make_lazy(__name__, _EXPORTS)

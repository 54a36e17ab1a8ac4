"""Contract-kit results of a test registry's components, each computed once per test process.

Under pytest-xdist the tests of one module run on several workers, and a module-scoped cache is per worker: a test
that reads one check's result of a component used to run the whole kit on it again on every worker that had not.
:meth:`KitResults.one` runs just that check there (each check seeds its own random state, so alone it gives the
result it gives among all of them); where the whole kit already ran on the component, it reads that result.
"""

from __future__ import annotations

import modkit
from modkit.testing import CheckResult, check_component


class KitResults:
    """``results(kind, type)``: ``{check: CheckResult}`` of every check; ``results.one(kind, type, check)``: one."""

    def __init__(self, registry: modkit.Registry) -> None:
        self.registry = registry
        self._all: dict[tuple[str, str], dict[str, CheckResult]] = {}
        self._one: dict[tuple[str, str, str], CheckResult] = {}

    def __call__(self, kind: str, type_: str) -> dict[str, CheckResult]:
        """Every check's result on ``kind/type_``, in ``CHECK_NAMES`` order (the kit runs once per component)."""
        if (kind, type_) not in self._all:
            results = check_component(kind, type_, registry=self.registry)
            self._all[(kind, type_)] = {r.check: r for r in results}
        return self._all[(kind, type_)]

    def one(self, kind: str, type_: str, check: str) -> CheckResult:
        """The result of ``check`` on ``kind/type_``: from the whole run when there is one, else that check alone."""
        if (kind, type_) in self._all:
            return self._all[(kind, type_)][check]
        if (kind, type_, check) not in self._one:
            (self._one[(kind, type_, check)],) = check_component(kind, type_, registry=self.registry, checks=[check])
        return self._one[(kind, type_, check)]

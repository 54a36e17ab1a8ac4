"""pytest plugin (entry point ``pytest11``): the contract suite as test items, one per component x check.

Usage, in any repository where modkit and the plugin under test are installed (no ``conftest.py`` needed)::

    pytest --modkit-contracts                                   # every registered component
    pytest --modkit-contracts --modkit-plugin my-norms          # one plugin (entry-point or distribution name)
    pytest --modkit-contracts --modkit-kind attention --modkit-type 'g*'
    pytest --modkit-contracts --modkit-check causality -k gqa
    pytest --modkit-contracts --modkit-plugin my-ffns --modkit-neighbour attention=my-attention
    pytest --modkit-contracts --modkit-distributed --modkit-check shards   # tensor parallelism, 2 gloo processes

Items are named ``kind/type::check`` (e.g. ``attention/gqa::causality``), so ``-k``, ``--deselect``, ``--lf`` and
``-v`` work as usual; a non-applicable check is reported as a skip with the reason, a failure shows the measured
values. ``shards`` (slow: it starts 2 gloo processes) runs only with ``--modkit-distributed``, every selected
``::shards`` item in one session (run when the first of them runs); otherwise it is skipped. Without ``--modkit-contracts`` the plugin adds nothing (and imports neither torch nor modkit).

Mechanism: the items are appended in ``pytest_collection_modifyitems`` (run first, so ``-k``/``-m``/``--deselect``
and ``--lf`` filter them like collected tests). They are not tied to a test file, which is what lets a plugin
author run the suite from a repository holding no tests at all.
"""

from __future__ import annotations

from typing import Any, Optional

import pytest

_STASH_KEY = pytest.StashKey[dict]()


def pytest_addoption(parser: pytest.Parser) -> None:
    """Register ``--modkit-contracts`` and its filters."""
    group = parser.getgroup("modkit", "modkit contract kit")
    group.addoption(
        "--modkit-contracts",
        action="store_true",
        default=False,
        help="run the modkit contract suite over the registered components (ids: kind/type::check)",
    )
    group.addoption(
        "--modkit-plugin",
        action="append",
        default=[],
        metavar="NAME",
        help="only components of this plugin (entry-point or distribution name; repeatable; wildcards)",
    )
    group.addoption(
        "--modkit-kind",
        action="append",
        default=[],
        metavar="KIND",
        help="only this kind, e.g. attention (repeatable; wildcards)",
    )
    group.addoption(
        "--modkit-type",
        action="append",
        default=[],
        metavar="TYPE",
        help="only this type, e.g. gqa (repeatable; wildcards)",
    )
    group.addoption(
        "--modkit-check",
        action="append",
        default=[],
        metavar="CHECK",
        help="only this check, e.g. causality (repeatable)",
    )
    group.addoption(
        "--modkit-distributed",
        action="store_true",
        default=False,
        help="also run the 'shards' check (tp = 2 in 2 gloo processes on the CPU; slow; skipped without this flag)",
    )
    group.addoption(
        "--modkit-neighbour",
        action="append",
        default=[],
        metavar="KIND=TYPE",
        help="fill the KIND slot of the tiny models with this TYPE instead of the built-in (repeatable)",
    )
    group.addoption(
        "--modkit-device", default="cpu", metavar="DEVICE", help="device the tiny models run on (default cpu)"
    )


class ContractFailure(AssertionError):
    """A contract check failed; carries the :class:`~modkit.testing.CheckResult`."""

    def __init__(self, result: Any):
        super().__init__(result.detail)
        self.result = result


class ContractItem(pytest.Item):
    """One ``kind/type::check`` test: runs one check of :mod:`modkit.testing.checks` on one component."""

    def __init__(self, *, runner: Any, check: str, **kwargs: Any):
        super().__init__(**kwargs)
        self.runner = runner
        self.check = check

    def runtest(self) -> None:
        """Run the check; a skip becomes ``pytest.skip(reason)``, a failure raises :class:`ContractFailure`."""
        result = self._result()
        self.user_properties.append(("modkit_detail", result.detail))
        if result.status == "skipped":
            reason = f"{self.check}: {result.detail}"
            try:  # report the skip at the component's source (reportinfo), not inside this plugin
                raise pytest.skip.Exception(reason, _use_item_location=True)
            except TypeError:  # pragma: no cover - a pytest without the keyword
                pytest.skip(reason)
        if result.status == "failed":
            raise ContractFailure(result)

    def _result(self) -> Any:
        """This item's result; a batched check (``shards``) runs once for every selected item of that check."""
        from modkit.testing.checks import get_check, run_many

        chk = get_check(self.check)
        if chk.run_many is None:
            return self.runner.run(self.check)
        done = self.session.stash.setdefault(_STASH_KEY, {})
        if (id(self.runner), self.check) not in done:
            peers = [i for i in self.session.items if isinstance(i, ContractItem) and i.check == self.check]
            peers = peers if self in peers else [self]
            for item, res in zip(peers, run_many([i.runner for i in peers], chk)):
                done[(id(item.runner), self.check)] = res
        return done[(id(self.runner), self.check)]

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Optional[str] = None) -> Any:
        """The check's own message (measured values), no traceback into the kit."""
        if isinstance(excinfo.value, ContractFailure):
            r = excinfo.value.result
            return f"{r.id} failed: {r.detail}"
        return super().repr_failure(excinfo, style=style)

    def reportinfo(self) -> tuple[Any, Optional[int], str]:
        """Location shown in reports: the source of the component's factory (else the rootdir) and the item id."""
        import inspect
        from pathlib import Path

        factory = self.runner.entry.factory
        try:
            lines, lineno = inspect.getsourcelines(factory)
            return Path(inspect.getsourcefile(factory) or self.path), lineno - 1, self.name
        except (OSError, TypeError):
            return self.path, None, self.name


def _neighbours(config: pytest.Config) -> dict[str, str]:
    """``{kind: type}`` from ``--modkit-neighbour KIND=TYPE`` options.

    Raises:
        ValueError: an option not of the form ``KIND=TYPE``.
    """
    out = {}
    for text in config.getoption("modkit_neighbour") or []:
        kind, sep, type_ = text.partition("=")
        if not sep or not kind.strip() or not type_.strip():
            raise ValueError(f"--modkit-neighbour: expected KIND=TYPE, e.g. attention=gqa; got {text!r}")
        out[kind.strip()] = type_.strip()
    return out


def _items(session: pytest.Session, config: pytest.Config) -> list[ContractItem]:
    import warnings

    from modkit.core.errors import RegistryError, SpecError
    from modkit.core.registry import get_registry
    from modkit.testing.harness import named_neighbour
    from modkit.testing.checks import CHECK_NAMES, ComponentChecks, neighbours_for, get_check, select_components

    registry = get_registry()
    try:
        entries = select_components(
            registry,
            plugin=config.getoption("modkit_plugin") or None,
            kind=config.getoption("modkit_kind") or None,
            type=config.getoption("modkit_type") or None,
        )
        checks = config.getoption("modkit_check") or list(CHECK_NAMES)
        for c in checks:
            get_check(c)
        neighbours = _neighbours(config)
        for kind, type_ in neighbours.items():
            named_neighbour(registry, kind, type_)
    except (RegistryError, SpecError, ValueError) as exc:
        raise pytest.UsageError(f"--modkit-contracts: {exc}") from None
    skipped = registry.skipped_plugins()
    for name, why in skipped.items():
        warnings.warn(f"modkit plugin {name} was not loaded, so its components are not checked: {why}", stacklevel=1)
    device = config.getoption("modkit_device")
    distributed = bool(config.getoption("modkit_distributed"))
    items = []
    for entry in entries:
        runner = ComponentChecks(entry, registry, None, device, distributed, neighbours_for(neighbours, entry))
        for check in checks:
            name = f"{entry.kind}/{entry.type}::{check}"
            items.append(ContractItem.from_parent(session, name=name, nodeid=name, runner=runner, check=check))
    return items


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    """With ``--modkit-contracts``: append one :class:`ContractItem` per selected component x check."""
    if not config.getoption("modkit_contracts", default=False):
        return
    added = _items(session, config)
    items.extend(added)
    # tell the terminal reporter (and other listeners) what was collected, so "collected N items" counts them
    config.hook.pytest_collectreport(report=pytest.CollectReport("modkit-contracts", "passed", None, list(added)))


def pytest_report_header(config: pytest.Config) -> Optional[str]:
    """One header line naming the selection when ``--modkit-contracts`` is on."""
    if not config.getoption("modkit_contracts", default=False):
        return None
    parts = [
        f"{k}={','.join(v)}"
        for k, v in (
            ("plugin", config.getoption("modkit_plugin")),
            ("kind", config.getoption("modkit_kind")),
            ("type", config.getoption("modkit_type")),
            ("check", config.getoption("modkit_check")),
        )
        if v
    ]
    named = ", ".join(config.getoption("modkit_neighbour") or [])
    return (
        "modkit contracts: "
        + (" ".join(parts) if parts else "every registered component")
        + f" on {config.getoption('modkit_device')}; neighbours: built-ins"
        + (f" and {named}" if named else "")
    )

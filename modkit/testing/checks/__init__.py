"""The contract checks, and the function API that runs them.

Each check tests one invariant of the contracts in :mod:`modkit.core.interfaces` (what a component must do for the
kit to accept it), and exists to catch a fault real plugin authors make (its docstring names the fault, the fixture in
``tests/testing/test_kit_catches_faults.py`` that commits it, and the public report it comes from). Which checks apply to a
component is decided by what it declares (its capabilities, its cache state, its position geometry, the fields of
its config), never by its type name; its kind says only how it is called (a token mixer of kind ``attention`` or
``mixer`` alike). One
family of checks per module:

========================  ==============================  ===========================================================
check                     module                          applies to
========================  ==============================  ===========================================================
``spec_roundtrip``        :mod:`.declarations`            every component
``shape_dtype``           :mod:`.shapes`                  every component (a norm also at widths other than d_model)
``gradients``             :mod:`.training`                every component with parameters
``causality``             :mod:`.causality`               every component; a token mixer only when it claims causal_safe
``per_token``             :mod:`.causality`               ffn and norm (a router through its ffn)
``kv_cache_decode``       :mod:`.cache`                   every component; a token mixer only with kv_cache
``cache_state``           :mod:`.state`                   components that declare kv_cache (any kind of token mixer)
``long_decode``           :mod:`.state`                   components that declare kv_cache (any kind of token mixer)
``masked_row``            :mod:`.cache`                   token mixers (any kind) and position
``gqa_equals_mha``        :mod:`.attention`               token mixers whose config has n_heads and n_kv_heads
``position_sensitivity``  :mod:`.attention`               token mixers that declare a position geometry; position
                                                          schemes that act somewhere
``document_mask``         :mod:`.attention`               any token mixer with the document_mask capability
``meta_init``             :mod:`.init`                    every component
``param_count``           :mod:`.declarations`            components that declare param_count
``param_roles``           :mod:`.roles`                   every component with parameters
``flops``                 :mod:`.flops`                   components that declare flops (skipped, with the reason, without);
                                                          every workload modkit cost evaluates
``precision``             :mod:`.precision`               every component with a contract call (a router: its ffn)
``weight_formats``        :mod:`.weights`                 every component (skipped without an nn.Linear)
``dropout``               :mod:`.training`                attention_dropout (any token mixer) / residual_dropout
``aux_loss_grad``         :mod:`.training`                the aux_loss capability, and routers
``compile``               :mod:`.compile`                 the compile_safe capability
``grouped_form``          :mod:`.grouped`                 ffn with a grouped_factory
``stream``                :mod:`.stream`                  residual streams (the stream kind)
``kv_share``              :mod:`.sharing`                 token mixers with the kv_share capability
``optimizer``             :mod:`.optimizer`               optimizers (the optimizer kind)
``shards``                :mod:`.parallel`                a non-empty tp_plan (opt-in: distributed)
========================  ==============================  ===========================================================

Shared types and tolerances are in :mod:`.base`; the tiny models and their neighbours (built-ins only, or named)
in :mod:`modkit.testing.harness`.

``shards`` starts two gloo processes on the CPU (seconds), so it runs only when asked:
``check_component(..., distributed=True)``, ``run_checks(..., distributed=True)``, ``modkit check --distributed``
or ``pytest --modkit-contracts --modkit-distributed``; otherwise it is reported skipped ("pass --distributed to
run"). Run over several components, their ``shards`` checks share one session (:mod:`modkit.testing.shards`).

Use :func:`check_component` for one component and :func:`run_checks` for a selection of the registry; both
return :class:`CheckResult` objects whose ``detail`` carries the measured values.
"""

from __future__ import annotations

import fnmatch
import os
import traceback
from typing import Callable, Mapping, Optional, Sequence, Union

import torch

from modkit.core.config import ComponentConfig
from modkit.core.errors import RegistryError, SpecError
from modkit.core.registry import Component, Registry, get_registry
from ...spec import load_component
from ..harness import Bench, Named, Unavailable, named_neighbour
from .attention import (
    applies_document_mask,
    applies_gqa,
    applies_position_sensitivity,
    check_document_mask,
    check_gqa_equals_mha,
    check_position_sensitivity,
)
from .base import Check, CheckFailed, CheckResult, CheckSkipped, Status, error_detail
from .cache import applies_kv, applies_masked, check_kv_cache_decode, check_masked_row
from .causality import applies_causality, applies_per_token, check_causality, check_per_token
from .compile import applies_compile, check_compile
from .declarations import applies_param_count, check_param_count, check_spec_roundtrip
from .flops import SUMMARY as FLOPS_SUMMARY, applies_flops, check_flops
from .grouped import applies_grouped, check_grouped_form
from .init import check_meta_init
from .parallel import applies_shards, check_shards, outcome, shards_many
from .optimizer import OptimizerBench, applies_optimizer, check_optimizer
from .precision import applies_precision, check_precision
from .weights import WEIGHT_FORMATS_SUMMARY, applies_weight_formats, check_weight_formats
from .roles import check_param_roles
from .sampling import SAMPLING_KINDS, SamplingBench, applies_sampling, check_sampling
from modkit.train.trackers import KIND as TRACKER_KIND
from .shapes import check_shape_dtype
from .sharing import SUMMARY as KV_SHARE_SUMMARY, applies_kv_share, check_kv_share
from .stream import SUMMARY as STREAM_SUMMARY, applies_stream, check_stream
from .state import LONG_SUMMARY, STATE_SUMMARY, applies_state, check_cache_state, check_long_decode
from .training import applies_aux, applies_dropout, check_aux_loss_grad, check_dropout, check_gradients

__all__ = [
    "CHECKS",
    "CHECK_NAMES",
    "Check",
    "CheckFailed",
    "CheckResult",
    "CheckSkipped",
    "ComponentChecks",
    "Status",
    "check_component",
    "get_check",
    "neighbours_for",
    "run_checks",
    "run_many",
    "select_components",
]

#: Every check, in the order results are reported.
CHECKS: tuple[Check, ...] = (
    Check(
        "spec_roundtrip",
        "load_spec(spec.to_json()) == spec; the config round-trips and has a JSON Schema",
        check_spec_roundtrip,
    ),
    Check(
        "shape_dtype",
        "[batch, seq, d_model], dtype and device preserved for several shapes (seq = 1 too), float32 and bfloat16; norms at other widths",
        check_shape_dtype,
    ),
    Check("gradients", "every parameter gets a finite non-zero gradient", check_gradients),
    Check(
        "causality",
        "changing tokens from position j on never changes earlier logits (64 tokens; eval, and train with dropout)",
        check_causality,
        applies_causality,
    ),
    Check(
        "per_token",
        "an ffn or norm acts on each token alone: other tokens never change its output",
        check_per_token,
        applies_per_token,
    ),
    Check(
        "kv_cache_decode",
        "cached decode of 64 tokens (chunks, sliding window) equals the full forward",
        check_kv_cache_decode,
        applies_kv,
    ),
    Check("cache_state", STATE_SUMMARY, check_cache_state, applies_state),
    Check("long_decode", LONG_SUMMARY, check_long_decode, applies_state),
    Check(
        "masked_row",
        "no NaN from queries that see no key (padding-only rows, all-padding row, chunked prefill); real tokens unaffected",
        check_masked_row,
        applies_masked,
    ),
    Check(
        "gqa_equals_mha",
        "n_kv_heads < n_heads equals n_heads key/value heads with repeated weights",
        check_gqa_equals_mha,
        applies_gqa,
    ),
    Check(
        "position_sensitivity",
        "the position scheme a layer is given changes its output (against no position scheme)",
        check_position_sensitivity,
        applies_position_sensitivity,
    ),
    Check(
        "document_mask",
        "with document ids, each document of a packed row gives the logits it gives alone",
        check_document_mask,
        applies_document_mask,
    ),
    Check(
        "meta_init",
        "modkit.build (meta, to_empty, init_weights) equals a direct build, tensor for tensor, and runs",
        check_meta_init,
    ),
    Check(
        "param_count",
        "declared param_count equals the module's parameter count",
        check_param_count,
        applies_param_count,
    ),
    Check(
        "param_roles",
        "every parameter has a declared role (modkit.core.roles) that fits its shape: what optimizers, weight "
        "decay and muP read",
        check_param_roles,
    ),
    Check("flops", FLOPS_SUMMARY, check_flops, applies_flops),
    Check(
        "precision",
        "bfloat16 and float16 agree with float64 on the same numbers within a few ulps",
        check_precision,
        applies_precision,
    ),
    Check("weight_formats", WEIGHT_FORMATS_SUMMARY, check_weight_formats, applies_weight_formats),
    Check(
        "dropout", "a declared dropout is random in train mode and absent in eval mode", check_dropout, applies_dropout
    ),
    Check(
        "aux_loss_grad",
        "the aux loss alone sends a gradient to every router parameter",
        check_aux_loss_grad,
        applies_aux,
    ),
    Check(
        "compile", "torch.compile(fullgraph=True) without graph breaks, equal to eager", check_compile, applies_compile
    ),
    Check(
        "grouped_form",
        "the stacked copies (mixture-of-experts experts) keep rows in their group, are independent, init, train, compile",
        check_grouped_form,
        applies_grouped,
    ),
    Check("stream", STREAM_SUMMARY, check_stream, applies_stream),
    Check("kv_share", KV_SHARE_SUMMARY, check_kv_share, applies_kv_share),
    Check(
        "sampling",
        "logits processors and stop conditions: shapes, dtype, no in-place change, never empty, deterministic, rows independent",
        check_sampling,
        applies_sampling,
    ),
    Check(
        "optimizer",
        "an optimizer trains a tiny model holding every parameter role, every parameter in one group, "
        "and resumes bitwise from its saved state",
        check_optimizer,
        applies_optimizer,
    ),
    Check(
        "shards",
        "tp_plan: tensor-parallel (tp = 2, gloo) logits, gradients and one AdamW step equal the single-process ones (opt-in: distributed)",
        check_shards,
        applies_shards,
        distributed=True,
        run_many=shards_many,
    ),
)

CHECK_NAMES: tuple[str, ...] = tuple(c.name for c in CHECKS)


def get_check(name: str) -> Check:
    """The check called ``name``.

    Raises:
        ValueError: unknown name (lists the valid ones).
    """
    for c in CHECKS:
        if c.name == name:
            return c
    raise ValueError(f"unknown check {name!r}; checks: {', '.join(CHECK_NAMES)}")


# ------------------------------------------------------------------------------------------------- running


class ComponentChecks:
    """Runs the checks of one component, sharing the bench (tiny spec, fillers) between them.

    Args:
        entry: the registry entry under test.
        registry: the registry it comes from (its built-ins, or the named neighbours, fill the other slots).
        config: a config (dict or validated) to test instead of the entry's example.
        device: where to build and run (``"cpu"`` default).
        distributed: also run the checks that start processes (``shards``); otherwise they are skipped.
        neighbours: ``{kind: type name or config}`` to fill those slots with instead of the built-ins (see
            :mod:`modkit.testing.harness`).
    """

    def __init__(
        self,
        entry: Component,
        registry: Registry,
        config: Union[dict, ComponentConfig, None] = None,
        device: str = "cpu",
        distributed: bool = False,
        neighbours: Optional[Mapping[str, Named]] = None,
    ):
        self.entry = entry
        self.registry = registry
        self.device = device
        self.distributed = distributed
        self.neighbours = dict(neighbours or {})
        self.name = f"{entry.kind}/{entry.type}"
        self._given = config
        self._setup: Optional[tuple[str, Union[Bench, str]]] = None

    def _bench(self) -> tuple[str, Union[Bench, str]]:
        """``("ok", bench)``, ``("skip", reason)``, ``("example", reason)`` (invalid example) or ``("fail", reason)``."""
        if self._setup is not None:
            return self._setup
        entry = self.entry
        if self._given is not None:
            try:  # a SpecError here is the caller's mistake: it names the component, not a spec
                config = load_component(entry.kind, self._given, registry=self.registry)
            except SpecError as exc:
                raise SpecError(exc.errors, source=self.name, subject="component config") from None
            if config.type != entry.type:
                raise SpecError(
                    [("type", f"the config is a {entry.kind} {config.type!r}, not {entry.type!r}")],
                    source=self.name,
                    subject="component config",
                )
        else:
            try:
                config = load_component(entry.kind, entry.example_config(), registry=self.registry)
            except SpecError as exc:
                why = "; ".join(f"{p}: {m}" if p else m for p, m in exc.errors[:3])
                if entry.example is None:
                    self._setup = (
                        "skip",
                        f"no example config: {{'type': {entry.type!r}}} does not validate ({why}); add example= to the Component",
                    )
                else:
                    self._setup = (
                        "example",
                        f"the entry's example config {dict(entry.example)} does not validate: {why}",
                    )
                return self._setup
        try:
            if entry.kind in (*SAMPLING_KINDS, TRACKER_KIND):  # not part of a model: no tiny model to build
                self._setup = ("ok", SamplingBench(entry, config, self.registry))
                return self._setup
            if applies_optimizer(entry, config) is None:  # an optimizer: trained on the check's own tiny model
                self._setup = ("ok", OptimizerBench(entry, config, self.registry))
                return self._setup
            self._setup = ("ok", Bench(entry, config, self.registry, self.device, self.neighbours))
        except Unavailable as exc:
            self._setup = ("skip", str(exc))
        except Exception as exc:  # noqa: BLE001
            self._setup = ("fail", "setting up the tiny model " + error_detail(exc))
        return self._setup

    def run(self, check: Union[str, Check]) -> CheckResult:
        """Run one check; never raises for a component fault (those become ``failed`` results).

        Runs with one intra-op CPU thread (restored afterwards): the tensors are tiny, and several threads only
        spin against each other (about 3x the CPU time on two cores, and worse under pytest-xdist).
        """
        threads = torch.get_num_threads()
        if threads != 1:
            torch.set_num_threads(1)
        try:
            return self._run(check)
        finally:
            if threads != 1:
                torch.set_num_threads(threads)

    def _settled(self, chk: Check) -> Optional[CheckResult]:
        """The result of ``chk`` when it is decided without running it (skips, a broken bench), else ``None``."""
        state, bench = self._bench()
        if state == "skip":
            return self._result(chk.name, "skipped", str(bench))
        if state == "example":
            if chk.name == "spec_roundtrip":
                return self._result(chk.name, "failed", str(bench))
            return self._result(chk.name, "skipped", "the example config does not validate (see spec_roundtrip)")
        reason = chk.applies(self.entry, bench.config) if state == "ok" else None
        if isinstance(bench, SamplingBench) and chk.name not in ("spec_roundtrip", "sampling"):
            reason = f"applies to model components; a {self.entry.kind} is " + (
                "checked by 'sampling'" if self.entry.kind in SAMPLING_KINDS else "not part of a model"
            )
        if isinstance(bench, OptimizerBench) and chk.name not in ("spec_roundtrip", "optimizer"):
            reason = "applies to model components; an optimizer is checked by 'optimizer'"
        if reason:
            return self._result(chk.name, "skipped", reason)
        if state == "fail":
            return self._result(chk.name, "failed", str(bench))
        if chk.distributed and not self.distributed:
            return self._result(
                chk.name,
                "skipped",
                "pass --distributed to run (starts 2 gloo processes; "
                "distributed=True in Python, --modkit-distributed under pytest)",
            )
        return None

    @property
    def neighbour_summary(self) -> str:
        """The neighbours of the tiny models (``""`` when the bench could not be set up)."""
        state, bench = self._bench()
        return bench.neighbour_summary() if state == "ok" and isinstance(bench, Bench) else ""

    def _result(self, check: str, status: str, detail: str) -> CheckResult:
        return CheckResult(self.name, check, status, detail, self.neighbour_summary)  # type: ignore[arg-type]

    def _run(self, check: Union[str, Check]) -> CheckResult:
        chk = get_check(check) if isinstance(check, str) else check
        settled = self._settled(chk)
        if settled is not None:
            return settled
        return self._conclude(chk, lambda: chk.run(self._bench()[1]))

    def _conclude(self, chk: Check, produce: Callable[[], str]) -> CheckResult:
        try:
            detail = produce()
            return self._result(chk.name, "passed", detail)
        except CheckSkipped as exc:
            return self._result(chk.name, "skipped", str(exc))
        except CheckFailed as exc:
            return self._result(chk.name, "failed", str(exc))
        except Exception as exc:  # noqa: BLE001 - a crash inside the component is a failure of this check
            return self._result(chk.name, "failed", error_detail(exc))

    def results(self, checks: Optional[Sequence[str]] = None) -> list[CheckResult]:
        """Run the named checks (default: all of :data:`CHECKS`, in order)."""
        return _results_of([self], checks)[0]


def run_many(runners: Sequence[ComponentChecks], check: Union[str, Check]) -> list[CheckResult]:
    """Run one check on several components; a check with ``run_many`` (``shards``) runs all of them in one batch.

    Returns one :class:`CheckResult` per runner, in order.
    """
    chk = get_check(check) if isinstance(check, str) else check
    if chk.run_many is None:
        return [r.run(chk) for r in runners]
    out: list[Optional[CheckResult]] = [r._settled(chk) for r in runners]
    todo = [i for i, res in enumerate(out) if res is None]
    if todo:
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            values = chk.run_many([runners[i]._bench()[1] for i in todo])
        except Exception as exc:  # noqa: BLE001 - the batch itself broke: every member fails with it
            values = [exc] * len(todo)
        finally:
            torch.set_num_threads(threads)
        for i, value in zip(todo, values):
            out[i] = runners[i]._conclude(chk, lambda v=value: outcome(v))
    return out  # type: ignore[return-value]


def _results_of(runners: Sequence[ComponentChecks], checks: Optional[Sequence[str]]) -> list[list[CheckResult]]:
    """``[[result per check] per runner]``; batched checks run once over all runners."""
    chosen = [get_check(n) for n in checks] if checks else list(CHECKS)
    table: dict[str, list[CheckResult]] = {}
    for c in chosen:
        if c.run_many is not None:
            table[c.name] = run_many(runners, c)
    return [[table[c.name][i] if c.name in table else r.run(c) for c in chosen] for i, r in enumerate(runners)]


def check_component(
    kind: str,
    type: str,
    config: Union[dict, ComponentConfig, None] = None,
    *,
    registry: Optional[Registry] = None,
    checks: Optional[Sequence[str]] = None,
    device: str = "cpu",
    distributed: bool = False,
    neighbours: Optional[Mapping[str, Named]] = None,
) -> list[CheckResult]:
    """Run the contract checks on one registered component.

    Args:
        kind, type: the component, e.g. ``("attention", "gqa")``.
        config: the config to test (dict or validated); default: the entry's ``example_config()``. An entry
            without ``example`` whose ``{"type": type}`` does not validate has every check skipped with
            "no example config".
        registry: defaults to :func:`modkit.get_registry` (every installed plugin).
        checks: names of the checks to run (default: all, see :data:`CHECK_NAMES`).
        device: where to build and run the tiny models.
        distributed: also run ``shards`` (2 gloo processes on the CPU, several seconds); without it ``shards``
            is skipped with "pass --distributed to run".
        neighbours: ``{kind: type name or config dict}``: fill those slots of the tiny models with these
            components instead of the built-ins (default: built-ins only, so the verdict never depends on another
            installed plugin). A kind without a built-in must be named here.

    Returns:
        One :class:`CheckResult` per check, in :data:`CHECKS` order (``skipped`` where a check does not apply);
            ``result.neighbours`` names the components the tiny models were filled with.

    Raises:
        RegistryError: unknown kind or type (of the component or of a named neighbour).
        SpecError: ``config`` (or a named neighbour's config) does not validate.
        ValueError: an unknown check name.
    """
    reg = registry or get_registry()
    entry = reg.get(kind, type)
    if checks:
        for n in checks:
            get_check(n)
    _validate_neighbours(reg, neighbours)
    return ComponentChecks(entry, reg, config, device, distributed, neighbours).results(checks)


def _as_list(value: Union[str, Sequence[str], None]) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    return [v for v in value if v]


def select_components(
    registry: Optional[Registry] = None,
    *,
    plugin: Union[str, Sequence[str], None] = None,
    kind: Union[str, Sequence[str], None] = None,
    type: Union[str, Sequence[str], None] = None,
) -> list[Component]:
    """Registry entries matching every given filter (each filter: one value or a list; ``fnmatch`` wildcards).

    ``plugin`` matches the providing plugin's name (the entry-point name) or its distribution name.

    Raises:
        RegistryError: a filter matches nothing (the message lists what is installed).
    """
    reg = registry or get_registry()
    plugins, kinds, types = _as_list(plugin), _as_list(kind), _as_list(type)

    def match(value: Optional[str], patterns: list[str]) -> bool:
        return value is not None and any(fnmatch.fnmatchcase(value, p) for p in patterns)

    out = []
    for c in reg.components():
        prov = c.provider
        if plugins and not (prov and (match(prov.plugin, plugins) or match(prov.distribution, plugins))):
            continue
        if kinds and not match(c.kind, kinds):
            continue
        if types and not match(c.type, types):
            continue
        out.append(c)
    if not out:
        broken = {n: why for n, why in reg.skipped_plugins().items() if plugins and match(n, plugins)}
        if broken:
            raise RegistryError(
                "; ".join(
                    f"plugin {n!r} failed to load, so it has no components to check: {why}" for n, why in broken.items()
                )
            )
        names = ", ".join(p.name for p in reg.plugins()) or "(none)"
        want = " and ".join(
            f"{k} {' or '.join(map(repr, v))}" for k, v in (("plugin", plugins), ("kind", kinds), ("type", types)) if v
        )
        raise RegistryError(
            f"no registered component matches {want or 'the selection'}; kinds: {reg.kinds()}; plugins: {names}"
        )
    return out


def run_checks(
    registry: Optional[Registry] = None,
    *,
    plugin: Union[str, Sequence[str], None] = None,
    kind: Union[str, Sequence[str], None] = None,
    type: Union[str, Sequence[str], None] = None,
    checks: Optional[Sequence[str]] = None,
    device: str = "cpu",
    distributed: bool = False,
    neighbours: Optional[Mapping[str, Named]] = None,
) -> list[CheckResult]:
    """Run the contract suite over the selected registry entries (see :func:`select_components`).

    ``distributed=True`` also runs ``shards``, all selected components in one session of 2 gloo processes.
    ``neighbours`` as in :func:`check_component` (a component is never its own neighbour: the kit then takes
    the built-in of that kind).

    Returns every :class:`CheckResult`, components in registry order, checks in :data:`CHECKS` order.
    """
    reg = registry or get_registry()
    if checks:
        for n in checks:
            get_check(n)
    _validate_neighbours(reg, neighbours)
    runners = [
        ComponentChecks(entry, reg, None, device, distributed, neighbours_for(neighbours, entry))
        for entry in select_components(reg, plugin=plugin, kind=kind, type=type)
    ]
    return [r for per_component in _results_of(runners, checks) for r in per_component]


def neighbours_for(neighbours: Optional[Mapping[str, Named]], entry: Component) -> dict:
    """``neighbours`` minus a neighbour that is ``entry`` itself (a component never fills its own slot)."""
    out = {}
    for kind, named in (neighbours or {}).items():
        typ = named if isinstance(named, str) else dict(named).get("type")
        if (kind, typ) != entry.key:
            out[kind] = named
    return out


def _validate_neighbours(registry: Registry, neighbours: Optional[Mapping[str, Named]]) -> None:
    """Raise RegistryError / SpecError for a named neighbour that is unknown or does not validate."""
    for kind, named in (neighbours or {}).items():
        named_neighbour(registry, kind, named)

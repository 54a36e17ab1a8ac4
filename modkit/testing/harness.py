"""The bench the contract checks run on: one component placed in tiny models, everything else filled in.

To exercise one registry entry the kit writes a tiny model spec (``d_model`` 32, 2 layers, vocabulary 64,
``max_seq_len`` 128, ``init_std`` 0.2) and puts the component in the slot of its kind (``block.attention``,
``block.ffn``, ``block.norm`` and ``final_norm``, ``block.placement``, ``position`` or ``stream``). A kind with no slot in a spec
(a ``router``) is nested in a *host*: a component whose config declares a :func:`~modkit.Slot` of that kind.

**Neighbours come from modkit's built-in components only** (the plugins modkit's own distribution registers),
or from components the caller names (``neighbours={"attention": "my-attention"}``, ``modkit check --neighbour
attention=my-attention``). Another installed plugin is never used to fill a slot, so a plugin's verdict does not
depend on what else is installed: with two third-party plugins side by side, a faulty one can never be chosen as
the good one's neighbour. Among the built-ins the choice is by capability, never by type name: the attention must be
``causal_safe`` and support ``kv_cache`` and see every key (not ``selects_keys``), the ffn must not return an aux loss, position schemes acting on q/k are
preferred, norms with parameters before stateless ones, placements that carry any residual stream (``streams``)
before others; then the first by name. Every component is configured with :meth:`~modkit.Component.example_config`.
A kind without a built-in must be named (else the checks are skipped, saying so).

``init_std`` 0.2 (instead of a real model's 0.02) makes attention scores O(1): attention is then sharp enough that
a position scheme, a mask or a cache fault changes the logits by O(0.1-1) rather than by 1e-4, so the checks fail a
fault by orders of magnitude.

Models are built through a :class:`RecordingRegistry`, which remembers every factory call
``(entry, config, BuildContext, module)``: that is how the checks find the component's modules inside a model
and the exact context a declared ``param_count`` must agree with.
"""

from __future__ import annotations

import copy
import functools
import importlib
import importlib.metadata as md
from dataclasses import dataclass, replace
from typing import Any, Iterable, Mapping, Optional, Union

import torch
from torch import nn

from modkit.core.config import ComponentConfig, is_mixer, slot_kind, slot_kinds
from modkit.core.errors import SpecError
from modkit.core.hooks import DISTRIBUTION
from modkit.core.registry import Component, Registry
from ..spec import BlockSpec, ModelSpec, load_component, load_spec, spec_model

#: Model-wide sizes of the tiny models (``d_model`` is the first of :data:`D_MODELS` the spec accepts);
#: ``max_seq_len`` leaves room for the 64-token sequences of the causality and cache checks.
TINY = {"vocab_size": 64, "n_layers": 2, "max_seq_len": 128, "init_std": 0.2}
#: ``d_model`` values tried in order until the component's example config fits (e.g. 6 heads need 48).
D_MODELS = (32, 48, 64, 96, 128)
#: The kinds whose calling convention :mod:`modkit.core.interfaces` defines; other kinds are exercised through a model.
CONTRACT_KINDS = ("attention", "mixer", "ffn", "norm", "placement", "position")


class Unavailable(Exception):
    """The bench cannot be set up for a reason that is not the component's fault (reported as a skip)."""


@dataclass
class Record:
    """One factory call seen while building: which entry, with which config and context, and what it returned."""

    entry: Component
    config: ComponentConfig
    ctx: Any
    module: nn.Module


class RecordingRegistry(Registry):
    """A view of a registry whose factories record each call in :attr:`records` (entries are shared, not copied).

    Used only by the contract kit; build with ``modkit.build(spec, registry=recording)``.
    """

    def __init__(self, base: Registry):  # noqa: D107 - shares the base registry's state instead of starting empty
        spec_model(base)  # make sure the live spec classes exist, so this view shares them
        self.__dict__.update(base.__dict__)
        self.base = base
        self.records: list[Record] = []

    def entry_for_config(self, config: ComponentConfig, kind: Optional[str] = None) -> Component:
        """The base registry's entry, with a factory that records ``(entry, config, ctx, module)``."""
        entry = super().entry_for_config(config, kind)
        records = self.records

        def factory(cfg: Any, ctx: Any, _entry: Component = entry) -> Any:
            module = _entry.factory(cfg, ctx)
            if isinstance(module, nn.Module):
                records.append(Record(_entry, cfg, ctx, module))
            return module

        return replace(entry, factory=factory)


def validate_config(entry: Component, data: Any, registry: Registry) -> ComponentConfig:
    """Validate ``data`` as a config of ``entry``'s kind (raises :class:`~modkit.SpecError`)."""
    return load_component(entry.kind, data, registry=registry)


def config_dict(config: ComponentConfig) -> dict:
    """The JSON form of a validated config (what a spec file would hold)."""
    return config.model_dump(mode="json")


def example_or_none(entry: Component, registry: Registry) -> Optional[dict]:
    """``entry.example_config()`` as validated JSON, or ``None`` if it does not validate."""
    try:
        return config_dict(validate_config(entry, entry.example_config(), registry))
    except SpecError:
        return None


def block_fields() -> dict[str, str]:
    """``{block field: slot kind}`` read from the spec model's slot markers (``attention``: ``"mixer"``, the token
    mixer of any kind)."""
    return {name: k for name, f in BlockSpec.model_fields.items() if (k := slot_kind(f)) is not None}


def spec_slots() -> tuple[dict[str, str], dict[str, str]]:
    """``({kind: block field}, {kind: required top-level field})`` read from the spec models' slot markers; every
    registry kind a slot accepts maps to it (``attention`` and ``mixer`` both to the token-mixing field)."""
    block = {}
    for name, k in block_fields().items():
        for kind in (k, *slot_kinds(k)):
            block.setdefault(kind, name)
    top = {}
    for name, f in ModelSpec.model_fields.items():
        k = slot_kind(f)
        if k is not None and f.is_required():
            top.setdefault(k, name)
    return block, top


def optional_top_slots() -> dict[str, str]:
    """``{kind: top-level field}`` of the model-level slots a spec may leave empty that only one kind fills (the
    residual ``stream``); a component of such a kind is placed there, its neighbours filling the rest."""
    required = set(spec_slots()[1])
    out = {}
    for name, f in ModelSpec.model_fields.items():
        k = slot_kind(f)
        if k is not None and not f.is_required() and k not in required and k not in spec_slots()[0]:
            out.setdefault(k, name)
    return out


def nested_slots(entry: Component) -> dict[str, str]:
    """``{field: kind}`` of the fields of ``entry``'s config that hold another component."""
    return {n: k for n, f in entry.config.model_fields.items() if (k := slot_kind(f)) is not None}


# ------------------------------------------------------------------------------------------------- fillers

#: a neighbour as the caller names it: a type name (configured by its example) or a config dict
Named = Union[str, Mapping[str, Any]]


@functools.lru_cache(maxsize=1)
def _builtin_modules() -> frozenset[str]:
    """Module names modkit's own distribution registers under the ``modkit`` entry-point group (its built-ins)."""
    from modkit.core.hooks import ENTRY_POINT_GROUP

    try:
        eps = md.distribution(DISTRIBUTION).entry_points
    except md.PackageNotFoundError:  # a source tree that is not installed: no entry points to read
        return frozenset()
    return frozenset(ep.value for ep in eps if ep.group == ENTRY_POINT_GROUP)


def is_builtin(entry: Component, registry: Registry) -> bool:
    """True for a component of one of modkit's built-in plugins, however it was registered.

    A plugin is built-in when its distribution is modkit's own (``modkit-lm``), or when its plugin object is one of the modules
    modkit's distribution registers (a test that copies the built-in plugins into a fresh :class:`~modkit.Registry`
    registers the same modules without a distribution).
    """
    prov = entry.provider
    if prov is None:
        return False
    if prov.distribution == DISTRIBUTION:
        return True
    info = next((p for p in registry.plugins() if p.name == prov.plugin), None)
    return info is not None and getattr(info.obj, "__name__", None) in _builtin_modules()


def _filler_rank(kind: str, entry: Component) -> tuple:
    caps = entry.capabilities
    if is_mixer(kind):  # a causal, cacheable token mixer; an attention before a recurrent mixer
        need = (0 if caps.get("causal_safe") else 1) + (0 if caps.get("kv_cache") else 1)
        need = 2 * need + (0 if entry.kind == "attention" else 1)
        need = 2 * need + (1 if caps.get("selects_keys") else 0)  # one that sees every key the mask allows
    elif kind == "ffn":
        need = 1 if caps.get("aux_loss") else 0
    elif kind == "position":
        need = {"qk": 0, "embedding": 1, "bias": 2, "none": 3}.get(caps.get("acts_on"), 4)
    elif kind == "norm":
        need = 1 if caps.get("stateless") else 0  # a norm with a gain: gradients and init reach it too
    elif kind == "placement":
        need = 0 if caps.get("streams") else 1  # one that carries any residual stream (a stream under test too)
    else:
        need = 0
    return (need, entry.example is None, entry.key)


def named_neighbour(registry: Registry, kind: str, named: Named) -> tuple[Component, dict]:
    """``(entry, config dict)`` of a neighbour the caller named (a type name or a config dict).

    Raises:
        RegistryError: unknown type. SpecError: the config (or the type's example) does not validate.
    """
    data = {"type": named} if isinstance(named, str) else dict(named)
    kinds = slot_kinds("mixer") if is_mixer(kind) else (kind,)  # a token mixer may be named as either kind
    found = [registry.components(k) for k in kinds]
    match = next(
        (k for k, es in zip(kinds, found) if any(e.type == registry.resolve(k, str(data.get("type"))) for e in es)),
        kind,
    )
    entry = registry.get(match, str(data.get("type")))
    if isinstance(named, str):
        data = entry.example_config()
    return entry, config_dict(validate_config(entry, data, registry))


def choose_filler(
    registry: Registry,
    kind: str,
    target: Component,
    exclude: Iterable[tuple[str, str]] = (),
    named: Optional[Mapping[str, Named]] = None,
) -> Optional[tuple[Component, dict]]:
    """The component of ``kind`` that fills a slot while ``target`` is under test, with its config.

    A neighbour named in ``named[kind]`` wins; otherwise the best *built-in* component (see the module docstring).
    Entries whose example does not validate are never chosen. Returns ``None`` when no built-in qualifies.
    """
    accepted = slot_kinds(kind)  # a token-mixing slot takes attentions and recurrent mixers
    for k in (kind, *accepted):
        if named and k in named:
            return named_neighbour(registry, k, named[k])
    excluded = set(exclude)
    candidates = sorted(
        (
            e
            for k in accepted
            for e in registry.components(k)
            if e.key != target.key and e.key not in excluded and is_builtin(e, registry)
        ),
        key=lambda e: _filler_rank(kind, e),
    )
    for e in candidates:
        cfg = example_or_none(e, registry)
        if cfg is not None:
            return e, cfg
    return None


# ------------------------------------------------------------------------------------------------- the bench


class Bench:
    """One component under test, with a validated tiny spec that contains it and helpers to build and feed it.

    Attributes:
        entry: the registry entry under test.
        config: its validated config (the example, or the config the caller gave).
        registry: the registry the component and its fillers come from.
        spec: the tiny spec (JSON dict, validated) holding the component.
        fillers: ``{kind: (entry, config dict)}`` used for the other slots.
        host: ``(entry, field)`` when the component is nested in another component, else ``None``.
        named: ``{kind: type name or config}``: the neighbours the caller named (the rest are built-ins).
        device: where models are built and run.

    Raises:
        Unavailable: no neighbour of a needed kind (no built-in, none named), or the example does not fit.
        RegistryError, SpecError: a named neighbour is unknown or its config does not validate.
    """

    def __init__(
        self,
        entry: Component,
        config: ComponentConfig,
        registry: Registry,
        device: str = "cpu",
        neighbours: Optional[Mapping[str, Named]] = None,
    ):
        self.entry = entry
        self.config = config
        self.registry = registry
        self.device = torch.device(device)
        self.named: dict[str, Named] = dict(neighbours or {})
        self.host: Optional[tuple[Component, str]] = None
        self.fillers: dict[str, tuple[Component, dict]] = {}
        self.notes: list[str] = []
        self.spec = self._make_spec()

    def neighbour_summary(self) -> str:
        """The neighbours used, e.g. ``"attention gqa, ffn geglu, ..."`` (``(named)`` after those the caller named).

        A host (the component a nested kind such as a router is placed in) comes first, as ``in ffn moe``.
        """

        def mark(e: Component) -> str:
            named = self.named.get(e.kind)
            typ = named if isinstance(named, str) else dict(named or {}).get("type")
            return " (named)" if typ == e.type else ""

        parts = []
        if self.host is not None:
            host = self.host[0]
            parts.append(f"in {host.kind} {host.type}{mark(host)}")
        for kind in sorted(self.fillers):
            e = self.fillers[kind][0]
            if self.host is not None and e.key == self.host[0].key:
                continue
            parts.append(f"{kind} {e.type}{mark(e)}")
        return ", ".join(parts)

    # ------------------------------------------------------------------ spec construction
    @property
    def name(self) -> str:
        """``kind/type`` of the component under test."""
        return f"{self.entry.kind}/{self.entry.type}"

    @property
    def config_json(self) -> dict:
        """The component's config as JSON."""
        return config_dict(self.config)

    def _fill(self, kind: str) -> dict:
        """The config filling a slot of ``kind`` (a token-mixing slot: an attention or a mixer, kept in
        :attr:`fillers` under the filler's own kind)."""
        got = next((self.fillers[k] for k in (kind, *slot_kinds(kind)) if k in self.fillers), None)
        if got is None:
            got = choose_filler(self.registry, kind, self.entry, named=self.named)
            if got is None:
                raise Unavailable(
                    f"no built-in {kind} with a valid example config to fill the tiny model; name one "
                    f"(neighbours={{'{kind}': TYPE}} in Python, --neighbour {kind}=TYPE on the command line)"
                )
            self.fillers[got[0].kind] = got
        return copy.deepcopy(got[1])

    @property
    def mixer_filler(self) -> Optional[tuple[Component, dict]]:
        """``(entry, config)`` of the token mixer filling the tiny model's mixing slot, or ``None`` when the component
        under test is the token mixer (or no mixer filler was chosen)."""
        return next((self.fillers[k] for k in slot_kinds("mixer") if k in self.fillers), None)

    def _placement(self) -> tuple[str, str, dict]:
        """``(where, field, config)``: where = 'block' | 'top', the field, and the config dict to put there."""
        block, top = spec_slots()
        kind = self.entry.kind
        if kind in block:
            return "block", block[kind], self.config_json
        if kind in top:
            return "top", top[kind], self.config_json
        optional = optional_top_slots()
        if kind in optional:  # a model-level slot that may stay empty (a residual stream): set it
            return "top", optional[kind], self.config_json

        # nested: a host whose config has a slot of this kind (a named one first, else a built-in)
        def slot_of(e: Component) -> Optional[str]:
            return next((f for f, k in nested_slots(e).items() if k == kind), None)

        named = [named_neighbour(self.registry, k, n) for k, n in self.named.items() if k in block or k in top]
        hosts = [(e, cfg) for e, cfg in named if slot_of(e)] or [
            (e, example_or_none(e, self.registry))
            for e in sorted(self.registry.components(), key=lambda e: e.key)
            if (e.kind in block or e.kind in top) and is_builtin(e, self.registry) and slot_of(e)
        ]
        reasons = []
        for host, base in hosts:
            if base is None:
                reasons.append(f"{host.kind}/{host.type}: example config does not validate")
                continue
            field_name = slot_of(host)
            try:
                cfg = validate_config(host, {**base, field_name: self.config_json}, self.registry)
            except SpecError as exc:
                reasons.append(f"{host.kind}/{host.type}: {exc.errors[0][1] if exc.errors else exc}")
                continue
            self.host = (host, field_name)
            self.fillers[host.kind] = (host, config_dict(cfg))
            where, field = ("block", block[host.kind]) if host.kind in block else ("top", top[host.kind])
            return where, field, config_dict(cfg)
        raise Unavailable(
            f"kind {kind!r} has no slot in a model spec and no built-in or named component holds a {kind!r} slot"
            + (f" that accepts it ({'; '.join(reasons)})" if reasons else "; name a host with neighbours={KIND: TYPE}")
        )

    def spec_with(self, **slots: Any) -> dict:
        """The tiny spec dict with top-level or ``block`` slots replaced (``attention=...``, ``position=...``)."""
        data = copy.deepcopy(self.spec)
        block_fields = set(spec_slots()[0].values())
        for key, value in slots.items():
            if key in block_fields:
                data["block"][key] = value
            else:
                data[key] = value
        return data

    def _make_spec(self) -> dict:
        block, top = spec_slots()
        where, field, target_cfg = self._placement()
        data: dict[str, Any] = {
            "schema_version": 1,
            "name": f"modkit-check-{self.entry.kind}-{self.entry.type}",
            **TINY,
        }
        data["block"] = {}
        for f, kind in block_fields().items():
            data["block"][f] = target_cfg if (where == "block" and f == field) else self._fill(kind)
        for kind, f in top.items():
            data[f] = target_cfg if (where == "top" and f == field) else self._fill(kind)
        if where == "top" and field not in data:  # an optional model-level slot (optional_top_slots)
            data[field] = target_cfg
        norm_field = block.get("norm")
        if norm_field is not None:
            data["final_norm"] = copy.deepcopy(data["block"][norm_field])
        errors: list[str] = []
        for d in D_MODELS:
            data["d_model"] = d
            try:
                load_spec(data, registry=self.registry)
                return data
            except SpecError as exc:
                errors.append(f"d_model {d}: " + "; ".join(f"{p}: {m}" for p, m in exc.errors[:2]))
        # a mixer that declares no per-head geometry (a recurrent one) takes no rotary or bias scheme: try the
        # next built-in position scheme in rank order, unless the caller named one
        field_ = top.get("position")
        if (
            field_ is not None
            and "position" in self.fillers
            and "position" not in self.named
            and self.entry.kind != "position"
        ):
            chosen = self.fillers["position"][0]
            others = sorted(
                (
                    e
                    for e in self.registry.components("position")
                    if e.key != chosen.key and is_builtin(e, self.registry)
                ),
                key=lambda e: _filler_rank("position", e),
            )
            for e in others:
                cfg = example_or_none(e, self.registry)
                if cfg is None:
                    continue
                data[field_] = cfg
                for d in D_MODELS:
                    data["d_model"] = d
                    try:
                        load_spec(data, registry=self.registry)
                    except SpecError:
                        continue
                    self.fillers["position"] = (e, cfg)
                    return data
        raise Unavailable("the example config does not fit a tiny model: " + errors[0])

    # ------------------------------------------------------------------ building
    def recorder(self) -> RecordingRegistry:
        """A fresh recording view of the registry."""
        return RecordingRegistry(self.registry)

    def build(
        self, spec: Optional[dict] = None, *, dtype: torch.dtype = torch.float32, seed: int = 0
    ) -> tuple[nn.Module, list[Record]]:
        """Construct ``spec`` (default: the bench's tiny spec) directly on the bench device, then ``init_weights(seed)``.

        The checks other than ``meta_init`` use this direct path, so a fault of the meta path (a buffer left
        as garbage by ``to_empty``) shows up in ``meta_init`` alone; ``meta_init`` proves both paths equal.
        Returns the model and the factory calls recorded while constructing it.
        """
        build_module = importlib.import_module("modkit.nn.build")  # the module; ``modkit.build`` is the function

        rec = self.recorder()
        spec_obj = load_spec(spec or self.spec, registry=rec)
        with torch.device(self.device), build_module._Construction(dtype):
            model = build_module._construct(spec_obj, rec)
        model.init_weights(seed)
        return model, rec.records

    def build_meta(
        self, spec: Optional[dict] = None, *, dtype: torch.dtype = torch.float32, seed: int = 0, device: Any = None
    ) -> tuple[nn.Module, list[Record]]:
        """:func:`modkit.build` (``meta`` first, ``to_empty``, one ``init_weights``); ``device="meta"`` stops after construction."""
        from modkit.nn.build import build

        rec = self.recorder()
        model = build(spec or self.spec, device=device or self.device, dtype=dtype, seed=seed, registry=rec)
        return model, rec.records

    def targets(self, records: list[Record]) -> list[Record]:
        """The records of the component under test (several for a norm: every norm of every block, final norm)."""
        return [r for r in records if r.entry.key == self.entry.key]

    # ------------------------------------------------------------------ inputs
    def generator(self, seed: int = 0) -> torch.Generator:
        """A seeded CPU generator (inputs are drawn on the CPU and moved, so every device sees the same data)."""
        return torch.Generator().manual_seed(seed)

    def ids(self, batch: int, seq: int, seed: int = 0) -> torch.Tensor:
        """Random token ids ``[batch, seq]`` on the bench device."""
        return torch.randint(0, self.spec["vocab_size"], (batch, seq), generator=self.generator(seed)).to(self.device)

    def randn(self, *shape: int, dtype: torch.dtype = torch.float32, seed: int = 0) -> torch.Tensor:
        """Standard normal tensor on the bench device."""
        return torch.randn(*shape, generator=self.generator(seed)).to(device=self.device, dtype=dtype)

    def positions(self, batch: int, seq: int) -> torch.Tensor:
        """``[batch, seq]`` int64 positions ``0..seq-1``."""
        return torch.arange(seq, device=self.device).expand(batch, seq)

    def position_for(self, model: nn.Module, layer_index: Optional[int]) -> Any:
        """The position scheme module a layer of ``model`` uses (layer 0 if ``layer_index`` is ``None``)."""
        i = 0 if layer_index is None else layer_index
        return model.positions[model.layer_position[i]]

    def d_model(self) -> int:
        """The tiny spec's ``d_model``."""
        return int(self.spec["d_model"])


def neighbour_positions(bench: Bench) -> list[tuple[Component, dict]]:
    """The position schemes an attention is exercised with: every built-in one with a valid example config, the
    one named as neighbour, and the component itself when it is a position scheme (never another plugin's)."""
    out = []
    named = bench.named.get("position")
    if named is not None:
        out.append(named_neighbour(bench.registry, "position", named))
    for e in bench.registry.components("position"):
        if e.key == bench.entry.key:
            out.append((e, bench.config_json))
        elif is_builtin(e, bench.registry) and all(e.key != o[0].key for o in out):
            cfg = example_or_none(e, bench.registry)
            if cfg is not None:
                out.append((e, cfg))
    return out


def qualified_names(model: nn.Module) -> dict[int, str]:
    """``{id(module): qualified name}`` for every submodule of ``model`` (first name wins for shared modules)."""
    out: dict[int, str] = {}
    for n, m in model.named_modules(remove_duplicate=False):
        out.setdefault(id(m), n or "<model>")
    return out

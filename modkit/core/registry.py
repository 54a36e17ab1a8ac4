"""The component registry, filled only through pluggy hooks.

Every component (attention, norm, ffn, router, position, placement, or any kind a plugin invents) is a
:class:`Component` entry: kind, type name, config model, factory, provider and capabilities as data.

Plugins are discovered from the ``modkit`` entry-point group and loaded one at a time, in isolation
(simonw/llm #1280): a plugin that fails to import, has a malformed hook implementation or registers a bad
entry produces one warning naming it and leaves nothing behind (pluggy #733); the others still load.
``MODKIT_STRICT_PLUGINS=1`` turns those warnings into :class:`~modkit.core.errors.RegistryError`.
"""

from __future__ import annotations

import difflib
import fnmatch
import importlib.metadata as md
import re
import threading
import typing
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Callable, Iterable, Mapping

import pluggy

from modkit.core.config import MIXER_KINDS, ComponentConfig, slot_kinds
from modkit.core.errors import RegistryError
from modkit.core.hooks import ENTRY_POINT_GROUP, PROJECT, ModkitHookSpecs

_NAME = re.compile(r"^[a-z][a-z0-9_\-]*$")

#: Capability keys the core understands. Plugins may add others; these drive validation, contract tests and docs.
KNOWN_CAPABILITIES: Mapping[str, str] = MappingProxyType(
    {
        "causal_safe": "never lets a position see later positions when used causally (attention)",
        "kv_cache": "supports incremental decoding with a cache (keys and values, or a recurrent state; any token mixer)",
        "compile_safe": "runs under torch.compile(fullgraph=True) without graph breaks",
        "aux_loss": "forward returns (output, aux_loss) instead of output (ffn)",
        "acts_on": "where a position scheme acts: 'embedding', 'qk', 'bias' or 'none' (position)",
        "unbounded_positions": "computes any position, not only those below max_seq_len (no table of max_seq_len rows), so "
        "generation may run past max_seq_len when asked (modkit.inference.generate max_len=, --max-len) (position)",
        "returns_weights": "has forward_with_weights(x, inputs) -> (out, weights [batch, n_heads, q_len, kv_len]) (attention, eager math)",
        "stateless": "has no parameters",
        "groups": "accepts BuildContext.groups: separate parameters per slice of the last-but-one dimension, "
        "statistics over the last (norm)",
        "tp_plan": "tensor-parallel plan relative to the module: {submodule: 'colwise'|'rowwise'|'grouped'|'per_head'|'replicate'|..., "
        "per-head parameter: 'heads'}",
        "token_mask": "forward takes token_mask [batch, seq] (True = real token) so padding can be excluded (ffn)",
        "attention_dropout": "applies BuildContext.attention_dropout to the attention probabilities in training mode (attention)",
        "residual_dropout": "applies BuildContext.residual_dropout to each sublayer output before it joins the residual (placement)",
        "argument": "{name, field}: the keyword of modkit.inference.generate.generate (and --flag of modkit generate) that sets this "
        "field (logits_processor, stop_condition)",
        "order": "where a pipeline built from keywords applies it: lower first (logits_processor, stop_condition)",
        "mup": "which column of muP's learning-rate table the update follows: 'adam' or 'sgd' (optimizer; modkit.core.parametrization)",
        "sharded": "the step is correct on FSDP2 / tensor-parallel shards, so it may train under torchrun (optimizer)",
        "overflow_prone": "its math can overflow float32 whatever its fields' bounds (exponentials in a scan, products of "
        "scales): modkit validate runs a tiny instance of a spec holding it (modkit.spec.finite)",
        "context_parallel": "how a token mixer runs with its sequence sharded over ranks (modkit.parallel.context): "
        "'allgather_kv' (it takes its keys through update_cache / update_cache_entries, which all-gather them from "
        "the ranks); false or absent: it cannot be sequence-sharded, and a context-parallel layout is refused naming it",
        "document_mask": "honours AttentionInputs.documents (document-masked packing; any token mixer): an attention's "
        "query sees only keys of its own document, a recurrent mixer's state and convolution restart at each document; "
        "a mixer that holds others (a parallel hybrid) passes them on and each inner mixer declares its own. A mixer "
        "without it is refused when documents are given",
        "absent": "a token mixer that stands for none: placements build no norm for it and skip its sublayer, so "
        "the block is its FFN alone (the 'none' mixer; Nemotron-H's MLP and mixture layers)",
        "selects_keys": "an attention whose queries see only a selected subset of the keys the mask lets through (an "
        "indexer's top-k: sparse attention); the contract kit fills tiny models with attentions that see every key",
        "selects_from": "the dense attention type a sparse or compressed attention is compared against in modkit cost "
        "(its dense twin: the same spec with that type, keeping the fields both have)",
        "dense_twin": "{field: value} the dense twin takes besides (an attention whose dense form is itself with other "
        "values: compressed_attention without compression or window)",
        "kv_share": "an attention whose keys and values another layer may read, and which may read another layer's "
        "instead of computing its own (spec 'kv_sharing'; its module has read_kv_from(source), e.g. through "
        "modkit.plugin.KVReader): a mixer without it is refused as a reader or a source",
        "streams": "a placement that reads its block input from a residual stream of several copies and writes its "
        "sublayers' outputs back through the stream's connections (BuildContext.extra['stream']; spec 'stream', "
        "hyper-connections); without it a placement is refused with a wide stream",
        "block_streams": "a placement whose block reads its input from a block-scope residual stream and writes its "
        "output back around the whole block (ResidualStream.block_connection; Gemma 3n's AltUp); without it a "
        "placement is refused with a block-scope stream",
        "scope": "how a residual stream is read and written (stream): 'sublayer' (the default: around each sublayer, "
        "placements with 'streams') or 'block' (around each block, placements with 'block_streams')",
        "d_in": "a token mixer that reads an input wider than d_model when built with BuildContext.d_in and still "
        "returns d_model features (the attention of a side block fed [stream, embeddings]: Zamba2)",
        "own_norm": "a token mixer that normalises its own input (it holds the norm): placements put no norm before "
        "it and hand it the residual stream itself (side_input: the side block reads the stream before any norm)",
    }
)


class PluginWarning(UserWarning):
    """Warning emitted when a plugin is skipped because it is broken (non-strict mode)."""


@dataclass(frozen=True)
class Provider:
    """Who provides a component: the plugin name and its distribution (package) name and version."""

    plugin: str
    distribution: str | None = None
    version: str | None = None

    def __str__(self) -> str:
        dist = f" ({self.distribution} {self.version})" if self.distribution else ""
        return f"{self.plugin}{dist}"


@dataclass(frozen=True)
class Component:
    """One registry entry.

    Attributes:
        kind: the slot it fills, e.g. ``"attention"``, ``"norm"``, ``"ffn"``, ``"router"``, ``"position"``,
            ``"placement"``.
        type: the name used in specs (``{"type": "rmsnorm"}``); unique within ``kind``.
        config: the pydantic config model (subclass of :class:`~modkit.core.config.ComponentConfig`) whose ``type``
            field is a ``Literal`` containing ``type``.
        factory: ``factory(config, ctx: BuildContext) -> torch.nn.Module``.
        description: one paragraph: what it computes, input/output shapes.
        reference: the paper or reference implementation its math follows.
        capabilities: data about behaviour (see :data:`KNOWN_CAPABILITIES`).
        param_count: optional analytic parameter count ``param_count(config, ctx) -> int``.
        flops: optional FLOPs declaration ``flops(config, ctx, work: Workload) -> {part: FLOPs}``: the matrix-product
            FLOPs (1 multiply-add = 2 FLOPs) of one call of the module on the workload :class:`~modkit.analysis.cost.Workload`
            (tokens, cached keys, mask), by part (``{"q_proj": ..., "scores": ...}``), excluding components it builds
            through ``ctx.build`` (they declare their own). Element-wise-only components declare
            :func:`modkit.analysis.cost.elementwise`; :mod:`modkit.analysis.cost` sums the declarations and the contract kit checks them
            against ``torch.utils.flop_counter.FlopCounterMode``.
        example: a valid config dict for this component (docs show it; the contract kit builds it); defaults to
            ``{"type": type}``.
        aliases: other names a spec may use for this component (``{"type": alias}`` validates as ``type`` and is
            stored under ``type``). An alias is not a second component: listings, ``modkit show`` and the docs show
            it as an alias of ``type``. Aliases share the type namespace of the kind (no clash with a type or
            another alias).
        alias_notes: ``{alias: message}`` for aliases whose use deserves a word (a name whose meaning changed):
            validating a spec that uses the alias emits the message as a :class:`~modkit.core.errors.SpecWarning`.
        grouped_factory: optional, for ``ffn`` components that can serve as mixture-of-experts experts:
            ``grouped_factory(config, ctx, n) -> nn.Module`` building ``n`` independent copies with stacked weights,
            whose ``forward(x [rows, d_model], offs [n] int32) -> [rows, d_model]`` runs copy ``g`` on the
            contiguous rows ``[offs[g-1], offs[g])`` (see :func:`modkit.nn.grouped.grouped_mm`), and whose
            ``init_weights(init)`` initialises every copy. A mixture of experts requires it of its expert type.
        math: optional key formulas in Markdown with LaTeX math (``$...$`` inline, ``$$...$$`` display, as
            pymdownx.arithmatex reads them), defining every symbol; the docs page shows it under *Math*. Kept out of
            ``description``, which terminals show.
        provider: filled in by the registry when the entry is registered.
    """

    kind: str
    type: str
    config: type[ComponentConfig]
    factory: Callable[..., Any]
    description: str
    reference: str = ""
    capabilities: Mapping[str, Any] = field(default_factory=dict)
    param_count: Callable[..., int] | None = None
    flops: Callable[..., Mapping[str, int]] | None = None
    example: Mapping[str, Any] | None = None
    grouped_factory: Callable[..., Any] | None = None
    aliases: tuple[str, ...] = ()
    alias_notes: Mapping[str, str] = field(default_factory=dict)
    math: str = ""
    provider: Provider | None = None

    def example_config(self) -> dict:
        """A config dict that validates for this component (``example`` or ``{"type": type}``)."""
        return dict(self.example) if self.example is not None else {"type": self.type}

    @property
    def key(self) -> tuple[str, str]:
        """``(kind, type)``."""
        return (self.kind, self.type)

    def validate(self) -> None:
        """Raise :class:`RegistryError` if the entry is malformed (bad names, config model, factory)."""
        where = f"component {self.kind}/{self.type}"
        for label, value in (("kind", self.kind), ("type", self.type)):
            if not isinstance(value, str) or not _NAME.match(value):
                raise RegistryError(f"{where}: {label} {value!r} must match {_NAME.pattern}")
        if not (isinstance(self.config, type) and issubclass(self.config, ComponentConfig)):
            raise RegistryError(f"{where}: config must be a subclass of modkit.ComponentConfig, got {self.config!r}")
        tags = config_tags(self.config)
        if self.type not in tags:
            raise RegistryError(
                f"{where}: config {self.config.__name__}.type must be Literal[...] including {self.type!r}; "
                f"it allows {sorted(tags)}"
            )
        if not callable(self.factory):
            raise RegistryError(f"{where}: factory {self.factory!r} is not callable")
        if self.flops is not None and not callable(self.flops):
            raise RegistryError(f"{where}: flops {self.flops!r} is not callable")
        if self.grouped_factory is not None and not callable(self.grouped_factory):
            raise RegistryError(f"{where}: grouped_factory {self.grouped_factory!r} is not callable")
        if not isinstance(self.capabilities, Mapping):
            raise RegistryError(f"{where}: capabilities must be a mapping, got {type(self.capabilities).__name__}")
        if not self.description:
            raise RegistryError(f"{where}: description is empty; say what it computes")
        if not isinstance(self.math, str):
            raise RegistryError(
                f"{where}: math must be Markdown text with $...$ formulas, got {type(self.math).__name__}"
            )
        if isinstance(self.aliases, str) or not all(isinstance(a, str) for a in self.aliases):
            raise RegistryError(f"{where}: aliases must be a tuple of names, got {self.aliases!r}")
        for alias in self.aliases:
            if not _NAME.match(alias):
                raise RegistryError(f"{where}: alias {alias!r} must match {_NAME.pattern}")
            if alias == self.type:
                raise RegistryError(f"{where}: alias {alias!r} is the type itself")
        if len(set(self.aliases)) != len(self.aliases):
            raise RegistryError(f"{where}: aliases {list(self.aliases)} name one alias twice")
        stray = sorted(set(self.alias_notes) - set(self.aliases))
        if stray:
            raise RegistryError(
                f"{where}: alias_notes for {stray}, which are not among its aliases {list(self.aliases)}"
            )


@dataclass(frozen=True)
class HFConverter:
    """A Hugging Face ``config.json`` → modkit spec converter for one ``model_type``.

    ``declaration`` is the object registered with ``register(declaration)`` (a declarative model type: its
    ``model_type``, ``convert`` and ``weights`` fill the other fields; its ``describe()``, when it has one, feeds the
    reference docs), ``None`` for the ``register(model_type, convert, weights=mapper)`` form.
    """

    model_type: str
    convert: Callable[[dict], dict]
    weights: Any = None
    provider: Provider | None = None
    declaration: Any = None


@dataclass
class PluginInfo:
    """A loaded plugin: its name, provider and what it registered."""

    name: str
    provider: Provider
    components: list[tuple[str, str]] = field(default_factory=list)
    converters: list[str] = field(default_factory=list)
    obj: Any = None


def config_tags(config: type[ComponentConfig]) -> tuple[str, ...]:
    """The ``type`` values a config model accepts (the args of its ``Literal`` annotation)."""
    f = config.model_fields.get("type")
    if f is None:
        return ()
    ann = f.annotation
    if typing.get_origin(ann) is typing.Literal:
        return tuple(str(a) for a in typing.get_args(ann))
    return ()


def close_matches(word: str, choices: Iterable[str]) -> list[str]:
    """Up to three entries of ``choices`` closest to ``word`` (difflib ratio ≥ 0.5)."""
    return difflib.get_close_matches(word, list(choices), n=3, cutoff=0.5)


def _one_of(words: list[str]) -> str:
    """``'a'``, ``'a' or 'b'``, ``'a', 'b' or 'c'``."""
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} or {words[-1]}"


class Registry:
    """Holds components and HF converters; filled by plugins through pluggy hooks.

    Use :func:`get_registry` for the process-wide instance (entry points loaded on first use); create a bare
    ``Registry()`` and call :meth:`register_plugin` for isolated experiments and tests.
    """

    def __init__(self) -> None:
        self._pm = pluggy.PluginManager(PROJECT)
        self._pm.add_hookspecs(ModkitHookSpecs)
        self._components: dict[tuple[str, str], Component] = {}
        self._converters: dict[str, HFConverter] = {}
        self._aliases: dict[tuple[str, str], str] = {}  # (kind, alias) -> canonical type
        self._plugins: dict[str, PluginInfo] = {}
        self._skipped: dict[str, str] = {}
        self.generation = 0
        self._lock = threading.RLock()
        self._derived: dict[str, tuple[int, Any]] = {}  # key -> (generation, value): see derived()

    # ---------------------------------------------------------------- plugins
    def register_plugin(
        self,
        obj: Any,
        name: str | None = None,
        *,
        distribution: str | None = None,
        version: str | None = None,
    ) -> PluginInfo:
        """Register a plugin object (module or instance with ``@hookimpl`` functions), atomically.

        The plugin is first validated and its hooks are called against a scratch plugin manager; only if
        everything succeeds are its entries added and the plugin registered for real. On failure nothing of
        it remains and it can be registered again once fixed.

        Raises:
            RegistryError: malformed hook implementation, a hook that raised, a malformed entry, a name
                already used by another plugin, or a (kind, type) / model_type already provided by another
                plugin (the message names both providers).
        """
        from modkit.core.plugin_loading import (
            collect_entries,
            scratch_manager,
        )  # it imports this module, so not at the top

        name = name or getattr(obj, "__name__", None) or type(obj).__name__
        provider = Provider(name, distribution, version)
        with self._lock:
            if name in self._plugins:
                raise RegistryError(f"plugin name {name!r} is already registered by {self._plugins[name].provider}")
            comps, convs = collect_entries(scratch_manager(obj, name, provider), provider)
            self._check_clashes(provider, comps, convs)
            return self._commit(obj, name, provider, comps, convs)

    def _commit(
        self, obj: Any, name: str, provider: Provider, comps: list[Component], convs: list[HFConverter]
    ) -> PluginInfo:
        """Register ``obj`` for real and add its checked entries (the caller holds the lock)."""
        self._pm.register(obj, name=name)
        for c in comps:
            self._components[c.key] = c
            for alias in c.aliases:
                self._aliases[(c.kind, alias)] = c.type
        for cv in convs:
            self._converters[cv.model_type] = cv
        info = PluginInfo(name, provider, [c.key for c in comps], [cv.model_type for cv in convs], obj)
        self._plugins[name] = info
        self.generation += 1
        return info

    def _check_clashes(self, provider: Provider, comps: list[Component], convs: list[HFConverter]) -> None:
        seen: dict[tuple[str, str], Component] = {}
        names: dict[tuple[str, str], tuple[str, Component]] = {}  # (kind, name) -> ("type"|"alias", entry)
        for c in self._components.values():
            names[c.key] = ("type", c)
            for a in c.aliases:
                names[(c.kind, a)] = ("alias", c)
        for c in comps:
            if c.kind in MIXER_KINDS:  # one token-mixing slot holds both kinds: their type names must differ
                rival = next(
                    (
                        o
                        for o in [*self._components.values(), *seen.values()]
                        if o.kind in MIXER_KINDS and o.kind != c.kind and c.type in (o.type, *o.aliases)
                    ),
                    None,
                )
                if rival is not None:
                    raise RegistryError(
                        f"{c.kind} type {c.type!r} (by {provider}) has the name of {rival.kind}/{rival.type} (by "
                        f"{rival.provider or provider}); attentions and mixers share the token-mixing slot, so their type "
                        "names must differ: rename one"
                    )
            other = self._components.get(c.key) or seen.get(c.key)
            if other is not None:
                raise RegistryError(
                    f"component {c.kind}/{c.type} is provided twice: by {other.provider} and by {provider}; "
                    "uninstall one of them or rename the type"
                )
            seen[c.key] = c
            for what, name in [("type", c.type)] + [("alias", a) for a in c.aliases]:
                taken = names.get((c.kind, name))
                if taken is not None and taken[1] is not c:
                    role, holder = taken
                    held = (
                        f"the type of {holder.kind}/{holder.type}"
                        if role == "type"
                        else f"an alias of {holder.kind}/{holder.type}"
                    )
                    raise RegistryError(
                        f"{c.kind} name {name!r} is provided twice: as the {what} of {c.kind}/{c.type} by {provider} "
                        f"and as {held} by {holder.provider or provider}; types and aliases of a kind must be unique"
                    )
                names[(c.kind, name)] = (what, c)
        seen_conv: dict[str, HFConverter] = {}
        for cv in convs:
            other = self._converters.get(cv.model_type) or seen_conv.get(cv.model_type)
            if other is not None:
                raise RegistryError(
                    f"HF converter for model_type {cv.model_type!r} is provided twice: by {other.provider} and by {provider}"
                )
            seen_conv[cv.model_type] = cv

    def unregister_plugin(self, name: str) -> None:
        """Remove a plugin and everything it registered (mainly for tests).

        Raises:
            RegistryError: no plugin of that name is registered.
        """
        with self._lock:
            info = self._plugins.pop(name, None)
            if info is None:
                raise RegistryError(f"no plugin named {name!r}; registered: {sorted(self._plugins)}")
            for key in info.components:
                entry = self._components.pop(key, None)
                for alias in entry.aliases if entry is not None else ():
                    self._aliases.pop((key[0], alias), None)
            for mt in info.converters:
                self._converters.pop(mt, None)
            self._pm.unregister(name=name)
            self.generation += 1

    def load_entry_points(self, *, strict: bool | None = None) -> None:
        """Discover and load every plugin advertised under the ``modkit`` entry-point group.

        Each plugin loads in isolation. A failure warns (:class:`PluginWarning`) naming the plugin and its
        distribution, unless ``strict`` (default: environment ``MODKIT_STRICT_PLUGINS=1``), which raises.
        The same (distribution, entry point) found twice, as editable installs can produce, loads once.
        A genuine clash between two plugins always raises :class:`RegistryError`. The loop:
        :func:`modkit.core.plugin_loading.load_plugins`.
        """
        from modkit.core.plugin_loading import load_plugins  # it imports this module, so not at the top

        load_plugins(self, md.entry_points(group=ENTRY_POINT_GROUP), self._skipped, strict=strict)

    # ---------------------------------------------------------------- lookups
    def get(self, kind: str, type_: str) -> Component:
        """The entry for ``(kind, type_)``.

        Raises:
            RegistryError: unknown kind or type; the message names the close matches and, for a type, the
                ``modkit list KIND`` command that lists the valid ones.
        """
        entry = self._components.get((kind, self.resolve(kind, type_)))
        if entry is not None:
            return entry
        if kind not in self.kinds():
            raise RegistryError(self.unknown_kind_message(kind))
        raise RegistryError(self.unknown_type_message(kind, type_))

    def unknown_kind_message(self, kind: str) -> str:
        """Human message for an unknown component ``kind``: the known kinds and the closest match."""
        kinds = self.kinds()
        hint = close_matches(str(kind), kinds)
        owners = [k for k in kinds if kind in self.types(k)]  # a type name given where the kind goes
        if owners:
            return (
                f"unknown component kind {kind!r}; {kind!r} is a type of kind {' and '.join(map(repr, owners))}: give "
                f"the kind first ({owners[0]} {kind}); known kinds: {', '.join(kinds)}"
            )
        return f"unknown component kind {kind!r}; known kinds: {', '.join(kinds) or '(none installed)'}" + (
            f"; did you mean {hint[0]!r}?" if hint else ""
        )

    def unknown_type_message(self, kind: str, type_: str) -> str:
        """Human message for an unknown ``type`` of ``kind``: the close matches (difflib) among that kind's types and
        aliases, and the ``modkit list`` command that lists them all (plus the plugins that failed to load).

        For ``kind = "mixer"`` (a token-mixing slot) the types are those of every token-mixer kind.
        """
        kinds = [k for k in slot_kinds(kind) if self.types(k)] or [kind]
        types = sorted({t for k in kinds for t in self.types(k)})
        aliases = {a: t for k in kinds for a, t in self.aliases(k).items()}
        hint = [
            f"{h!r} (an alias of {aliases[h]!r})" if h in aliases else repr(h)
            for h in close_matches(str(type_), types + list(aliases))
        ]
        msg = f"unknown {kind} type {type_!r}; " + (
            f"did you mean {_one_of(hint)}?" if hint else f"no {kind} type is close to it"
        )
        known = [k for k in kinds if k in self.kinds()]
        if len(known) > 1:
            msg += (
                f" ({' and '.join(f'modkit list {k}' for k in known)} list the {len(types)} types a {kind} slot takes)"
            )
        elif known:
            msg += f" (modkit list {known[0]} lists the {len(types)} {kind} type{'s' if len(types) != 1 else ''})"
        else:
            msg += " (modkit list lists every registered component)"
        if self._skipped:
            msg += "; plugins that failed to load (their components are missing): " + ", ".join(
                f"{name} ({reason})" for name, reason in sorted(self._skipped.items())
            )
        return msg

    def kinds(self) -> list[str]:
        """Sorted list of kinds with at least one registered component."""
        return sorted({k for k, _ in self._components})

    def types(self, kind: str) -> list[str]:
        """Sorted type names registered for ``kind`` (aliases not included: see :meth:`aliases`)."""
        return sorted(t for k, t in self._components if k == kind)

    def aliases(self, kind: str) -> dict[str, str]:
        """``{alias: type}`` of the aliases registered for ``kind``."""
        return {a: t for (k, a), t in sorted(self._aliases.items()) if k == kind}

    def resolve(self, kind: str, name: str) -> str:
        """The type ``name`` denotes in ``kind``: the type an alias stands for, else ``name`` unchanged."""
        return self._aliases.get((kind, name), name)

    def components(
        self, kind: str | None = None, *, plugin: str | None = None, pattern: str | None = None
    ) -> list[Component]:
        """Entries filtered by kind, providing plugin and ``fnmatch`` pattern on the type (timm-style listing)."""
        out = [
            c
            for c in self._components.values()
            if (kind is None or c.kind == kind)
            and (plugin is None or c.provider.plugin == plugin)
            and (pattern is None or fnmatch.fnmatch(c.type, pattern))
        ]
        return sorted(out, key=lambda c: c.key)

    def entry_for_config(self, config: ComponentConfig, kind: str | None = None) -> Component:
        """The entry whose config model produced ``config`` (looked up by its ``type`` tag).

        Raises:
            RegistryError: no entry of that type (and kind, if given) is registered.
        """
        matches = [c for c in self._components.values() if c.type == config.type and isinstance(config, c.config)]
        if kind is not None:
            matches = [c for c in matches if c.kind == kind]
        if not matches:
            raise RegistryError(f"no registered component for config {type(config).__name__}(type={config.type!r})")
        return matches[0]

    def plugins(self) -> list[PluginInfo]:
        """Loaded plugins, sorted by name."""
        return [self._plugins[k] for k in sorted(self._plugins)]

    def skipped_plugins(self) -> dict[str, str]:
        """Plugins that failed to load in non-strict mode: ``{name: reason}``."""
        return dict(self._skipped)

    def hf_converter(self, model_type: str) -> HFConverter:
        """The converter for a Hugging Face ``model_type``.

        Raises:
            RegistryError: none registered; lists the supported model types and the closest match.
        """
        conv = self._converters.get(model_type)
        if conv is None:
            types = sorted(self._converters)
            hint = close_matches(str(model_type), types)
            raise RegistryError(
                f"no converter for Hugging Face model_type {model_type!r}; supported: {', '.join(types) or '(none)'}"
                + (f"; did you mean {hint[0]!r}?" if hint else "")
            )
        return conv

    def hf_model_types(self) -> list[str]:
        """Sorted Hugging Face model types with a registered converter."""
        return sorted(self._converters)

    def derived(self, key: str, build: Callable[[], Any]) -> Any:
        """``build()``, computed once and kept under ``key`` until the registry changes (a plugin registered or
        removed: :attr:`generation`), for values derived from the registered components (the live spec model of
        :func:`modkit.spec.spec_model`). Whatever ``build`` raises propagates, and nothing is kept."""
        with self._lock:
            held = self._derived.get(key)
            if held is None or held[0] != self.generation:
                held = self._derived[key] = (self.generation, build())
            return held[1]

    @property
    def plugin_manager(self) -> pluggy.PluginManager:
        """The underlying pluggy manager (holds only successfully registered plugins)."""
        return self._pm


_default: Registry | None = None
_default_lock = threading.Lock()


def get_registry() -> Registry:
    """The process-wide registry, with every installed plugin loaded (on first call)."""
    global _default
    if _default is None:
        with _default_lock:
            if _default is None:
                reg = Registry()
                reg.load_entry_points()
                _default = reg
    return _default


def reset_registry() -> None:
    """Forget the process-wide registry; the next :func:`get_registry` reloads entry points (tests, after installs)."""
    global _default
    with _default_lock:
        _default = None

"""The config side of a Hugging Face model type: a table of ``config.json`` keys and what each one is.

A model type's table maps each key it knows (in transformers' configuration class of that type) to one of:

* **mapped**: :class:`Key` reads one key into one or more fields of the network description (:data:`._spec.FIELDS`),
  with transformers' class default for an absent key, and writes the field back on export; group rows read
  several keys that only mean something together (:class:`HeadDim`, :class:`KVHeads`, :class:`Rope`,
  :class:`RopeByLayerType`, :class:`SlidingWindow`, :class:`QwenWindows`, :class:`LayerTypes`);
* **ignored** harmlessly (:class:`Ignore`): the key does not change the network (carried over on export);
* **refused** (:class:`Refuse`): the key changes the network in a way modkit cannot express, so any value but the
  one modkit can express is an error naming the key, the value and why. Never dropped.

A key a table does not list is either irrelevant for every model type (:data:`._reader.IRRELEVANT`: provenance,
tokenizer ids, generation defaults) or unknown: dropped with one :class:`modkit.UnknownConfigKeyWarning`, or
refused with ``strict=True``.

Every row has ``read(r, f, name)`` (config → fields, through the recording reader :class:`._reader.HFConfig`),
``write(f, base, name)`` (fields → config keys; ``base`` is the config the model was imported from) and
``describe(name)`` (the rows of the reference page). Semantics follow transformers' configuration classes (read,
not copied).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Mapping, Optional, Union

from modkit.plugin import json_value

from ._reader import ACTIVATIONS, HFConfig
from ._rope import rope, rope_fields
from ._weights import hf_activation

#: ``(config key, status, transformers' default, what it becomes or why)``: one row of the reference page
Row = tuple[str, str, str, str]

LAYER_TYPES = ("full_attention", "sliding_attention")


def _text(value: Any) -> str:
    if callable(value):
        return "computed"
    return "–" if value is None else f"`{json_value(value)}`"


class Entry:
    """One row of a config table (subclasses are frozen dataclasses).

    ``SETS``: the fields (:data:`._spec.FIELDS`) the row can set; what the reference page's "supports" summary reads.
    """

    status: ClassVar[str] = "mapped"
    SETS: ClassVar[tuple[str, ...]] = ()

    def sets(self) -> tuple[str, ...]:
        """The fields this row can set (``SETS`` unless a row knows better)."""
        return self.SETS

    def config_keys(self, name: str) -> tuple[str, ...]:
        """The config keys this row reads (its name, aliases, the other keys of a group)."""
        return (name,)

    def read(self, r: HFConfig, f: dict, name: str) -> None:
        """Read the row's key(s) from ``r`` into fields ``f``."""

    def write(self, f: Mapping[str, Any], base: Mapping[str, Any], name: str) -> dict:
        """The config keys this row writes for fields ``f`` (``base``: the source config, or ``{}``)."""
        return {}

    def describe(self, name: str) -> list[Row]:
        """The reference-page rows of this entry."""
        return [(name, self.status, "–", "")]


# ---------------------------------------------------------------------------------------------- one key


def _read(r: HFConfig, name: str, kind: str, default: Any, aliases: tuple[str, ...]) -> Any:
    if kind == "int":
        return r.number(name, default, aliases=aliases, integer=True)
    if kind == "count":
        return r.number(name, default, aliases=aliases, integer=True, positive=False)
    if kind == "number":
        return r.number(name, default, aliases=aliases)
    if kind == "nonneg":
        return r.number(name, default, aliases=aliases, positive=False, minimum=0)
    if kind == "prob":
        value = r.number(name, default, aliases=aliases, positive=False)
        if value is not None and not 0 <= value < 1:
            r.error(name, f"a dropout probability must lie in [0, 1), got {json_value(value)}")
            value = default
        return float(value)
    if kind == "flag":
        return r.flag(name, default, aliases=aliases)
    if kind == "act":
        return r.activation(name, default)
    if kind == "nullable":  # a present null switches the feature off; an absent key means the class default
        return r.number(name, None) if name in r.cfg else default
    if kind == "window":  # likewise, an integer
        return r.number(name, None, integer=True) if name in r.cfg else default
    raise ValueError(f"unknown key kind {kind!r}")


@dataclass(frozen=True)
class Key(Entry):
    """A config key mapped to field(s).

    Attributes:
        field: the field (or fields, all set to the value; the first one is written back) the key becomes.
        default: transformers' value when the key is absent or null; a function of the fields read so far
            (GPT-2's ``n_inner``: ``4 * n_embd``).
        kind: ``int`` (positive integer), ``count`` (integer >= 0), ``number`` (positive), ``nonneg`` (>= 0),
            ``prob`` (a dropout probability in [0, 1)), ``flag`` (boolean), ``act`` (an activation name, mapped to
            modkit's), ``nullable`` (a positive number; a present null means "off", unlike other kinds, where null
            means the default), ``window`` (a positive integer, null meaning "off").
        aliases: other names of the key (transformers' ``attribute_map``).
        tanh: for ``act``: the name written for modkit's ``gelu_tanh`` (``gelu_new`` in GPT-2's family).
        read_as, write_as: ``(value, fields) -> value`` between the config's value and the field's.
        values: for ``act``: config values that mean another modkit activation in this type than in general
            (Gemma's legacy ``"gelu"``, which ``GemmaConfig`` turns into the tanh GELU).
        from_base: the spec does not hold the value (it is checked, not used): an export writes the source
            config's value, else ``default`` (BERT's ``type_vocab_size``).
        note: what the key is, for the reference page.
    """

    field: Union[str, tuple[str, ...]]
    default: Any = None
    kind: str = "int"
    aliases: tuple[str, ...] = ()
    tanh: str = "gelu_pytorch_tanh"
    read_as: Optional[Callable[[Any, Mapping[str, Any]], Any]] = None
    write_as: Optional[Callable[[Any, Mapping[str, Any]], Any]] = None
    values: Optional[Mapping[str, str]] = None
    from_base: bool = False
    note: str = ""

    @property
    def fields(self) -> tuple[str, ...]:
        return (self.field,) if isinstance(self.field, str) else tuple(self.field)

    def config_keys(self, name):
        return (name, *self.aliases)

    def sets(self):
        return self.fields

    def read(self, r, f, name):
        default = self.default(f) if callable(self.default) else self.default
        raw = r.get(name, default) if self.values else None
        if isinstance(raw, str) and raw in self.values:
            value = self.values[raw]
        else:
            value = _read(r, name, self.kind, default, self.aliases)
        if self.read_as is not None:
            value = self.read_as(value, f)
        for fld in self.fields:
            f[fld] = value
            r.key_of.setdefault(fld, name)

    def write(self, f, base, name):
        if self.from_base:
            value = base.get(name) or self.default
            return {name: int(value) if self.kind == "int" else value}
        value = f[self.fields[0]]
        if value is None and self.kind not in ("nullable", "window") and self.read_as is None and self.write_as is None:
            # a field the spec does not have (the router's of a model without mixtures): null reads as the default,
            # so write the source config's value, else the default, which configuration classes type-check (a row
            # converting values, GPT-2's softmax_scale, gives None a meaning of its own)
            value = base.get(name)
            value = value if value is not None else (self.default(f) if callable(self.default) else self.default)
        if self.write_as is not None:
            value = self.write_as(value, f)
        if self.kind == "act":
            value = hf_activation(value or ACTIVATIONS.get(self.default), self.tanh, base.get(name))
        elif self.kind == "flag":
            value = bool(value)
        elif self.kind == "prob":
            value = float(value)
        return {name: value}

    def describe(self, name):
        key = " / ".join(f"`{k}`" for k in (name, *self.aliases))
        becomes = ", ".join(f"`{x}`" for x in self.fields)
        return [(key, self.status, _text(self.default), becomes + (f": {self.note}" if self.note else ""))]


def sizes(*, vocab_size: int, hidden_size: int, num_hidden_layers: int, num_attention_heads: int,
          max_position_embeddings: int) -> dict[str, Key]:
    """The size rows under the names most configuration classes use, with one type's transformers defaults."""
    return {
        "vocab_size": Key("vocab_size", vocab_size),
        "hidden_size": Key("d_model", hidden_size),
        "num_hidden_layers": Key("n_layers", num_hidden_layers),
        "num_attention_heads": Key("n_heads", num_attention_heads),
        "max_position_embeddings": Key("max_seq_len", max_position_embeddings),
    }


@dataclass(frozen=True)
class Ignore(Entry):
    """A key that does not change the network: read by nobody, carried over on export (unless ``carry`` is off)."""

    note: str
    carry: bool = True
    status: ClassVar[str] = "ignored"

    def read(self, r, f, name):
        r.ignore(name)

    def describe(self, name):
        return [(f"`{name}`", self.status, "–", self.note)]


@dataclass(frozen=True)
class Refuse(Entry):
    """A key that changes the network in a way modkit cannot express: any value but ``allowed`` (absent and null
    are ``allowed``) is an error naming the key, the value and ``why``."""

    allowed: Any
    why: str
    status: ClassVar[str] = "refused"

    def read(self, r, f, name):
        r.expect(name, self.allowed, self.why)

    def describe(self, name):
        return [(f"`{name}`", self.status, _text(self.allowed), f"only `{json_value(self.allowed)}`: {self.why}")]


@dataclass(frozen=True)
class Same(Entry):
    """A legacy duplicate of another key: it must equal the value of ``field`` (GPT-2's ``n_ctx``); not exported."""

    field: str
    why: str
    status: ClassVar[str] = "refused"

    def read(self, r, f, name):
        value = r.get(name)
        if value is not None and value != f[self.field]:
            other = r.key_of.get(self.field, self.field)
            r.error(name, f"{name} = {value} differs from {other} = {f[self.field]}; {self.why}")

    def describe(self, name):
        return [(f"`{name}`", self.status, "–", f"must equal `{self.field}`: {self.why}")]


@dataclass(frozen=True)
class Own(Entry):
    """Keys that the type's own code reads (``read_own``) and writes (``write_own``), listed for the reference page."""

    keys: tuple[str, ...]
    note: str
    fields: tuple[str, ...] = ()

    def config_keys(self, name):
        return self.keys

    def sets(self):
        return self.fields

    def describe(self, name):
        return [(", ".join(f"`{k}`" for k in self.keys), self.status, "–", self.note)]


# ---------------------------------------------------------------------------------------------- heads


def _divisible(r: HFConfig, d: int, n: int, extra: str = "") -> None:
    d_key, n_key = r.key_of.get("d_model", "hidden_size"), r.key_of.get("n_heads", "num_attention_heads")
    if d % n:
        r.error(n_key, f"{d_key} = {d} is not divisible by {n_key} = {n}{extra}")


@dataclass(frozen=True)
class HeadDim(Entry):
    """``head_dim``: the config's value, else ``default``, else ``d_model // n_heads`` (transformers' fallback).

    ``derived`` (a reason): the type always derives ``head_dim = d_model // n_heads`` and refuses another value
    (Phi, OLMoE size their norms from it). ``in_config=False``: the config has no such key (GPT-2, BERT, Falcon).
    """

    SETS: ClassVar[tuple[str, ...]] = ('head_dim',)

    default: Optional[int] = None
    derived: Optional[str] = None
    in_config: bool = True

    def config_keys(self, name):
        return (name,) if self.in_config else ()

    def read(self, r, f, name):
        d, n = f["d_model"], f["n_heads"]
        if not self.in_config or self.derived:
            _divisible(r, d, n)
            f["head_dim"] = d // n
            if self.derived:
                r.expect(name, d // n, self.derived)
            return
        value = r.number(name, self.default, integer=True)
        if value is None:
            _divisible(r, d, n, " and head_dim is not given")
            value = d // n
        f["head_dim"] = value

    def write(self, f, base, name):
        if not self.in_config or self.derived:
            return {}
        hd = f["head_dim"]
        if hd is None:  # no attention layer (a recurrent model): the source config's value, if any
            return {name: base[name]} if base.get(name) is not None else {}
        return {name: hd} if self.default is not None or hd != f["d_model"] // f["n_heads"] else {}

    def describe(self, name):
        derived = "hidden_size // num_attention_heads"
        if not self.in_config:
            return [("(no key)", "mapped", "–", f"`head_dim` = {derived}")]
        if self.derived:
            return [(f"`{name}`", "refused", derived, f"only {derived}: {self.derived}")]
        return [(f"`{name}`", "mapped", _text(self.default) if self.default is not None else derived, "`head_dim`")]


@dataclass(frozen=True)
class KVHeads(Entry):
    """The key/value head count (absent or null: ``default``, else ``n_heads``), checked to divide ``n_heads``."""

    SETS: ClassVar[tuple[str, ...]] = ('n_kv_heads',)

    default: Optional[int] = None

    def read(self, r, f, name):
        n = f["n_heads"]
        kv = r.number(name, self.default, integer=True)
        kv = n if kv is None else kv
        if n % kv:
            r.error(name, f"{name} = {kv} does not divide {r.key_of.get('n_heads', 'num_attention_heads')} = {n}")
        f["n_kv_heads"] = kv

    def write(self, f, base, name):
        kv = f["n_kv_heads"]
        if kv is None:  # no attention layer (a recurrent model): the source config's value, else the default
            kv = base.get(name) or self.default
        return {name: kv} if kv is not None else {}

    def describe(self, name):
        return [(f"`{name}`", "mapped", _text(self.default) if self.default is not None else "n_heads", "`n_kv_heads`")]


# ---------------------------------------------------------------------------------------------- RoPE

#: the keys of one RoPE: transformers 5's dict, and the 4.x top-level keys
ROPE_KEYS = ("rope_parameters", "rope_theta", "rope_scaling", "partial_rotary_factor")


@dataclass(frozen=True)
class Rope(Entry):
    """One RoPE for every layer, from ``rope_parameters`` (transformers 5) or ``rope_theta`` + ``rope_scaling`` +
    ``partial_rotary_factor`` (4.x files); see :func:`._rope.rope` for the scalings.

    Attributes:
        default: ``rope_theta`` when absent.
        partial: ``partial_rotary_factor`` when absent (Phi: 0.5).
        original_at_top: the config class holds ``original_max_position_embeddings`` at the top level, which wins
            over the scaling dict's and is written there on export (Phi-3).
        always_partial: write ``partial_rotary_factor`` even when it is 1 (when the class default is not 1).
        layout: the layout of the rotated pairs in the checkpoint's q/k rows (GLM: ``interleaved``).
        theta_key, partial_key: the 4.x top-level keys of the base and of the rotated fraction (GPT-NeoX:
            ``rotary_emb_base``, ``rotary_pct``), read under ``rope_parameters``' values and written on export.
        default_parameters: the ``rope_parameters`` a config class assumes when a config has neither them nor
            ``rope_scaling`` (gpt-oss: YaRN, factor 32); an export then writes ``rope_parameters`` too.
    """

    SETS: ClassVar[tuple[str, ...]] = ('position',)

    default: float = 10000.0
    partial: float = 1.0
    original_at_top: bool = False
    always_partial: bool = False
    layout: str = "half_split"
    theta_key: str = "rope_theta"
    partial_key: str = "partial_rotary_factor"
    default_parameters: Optional[Mapping[str, Any]] = None

    def config_keys(self, name):
        keys = ("rope_parameters", self.theta_key, "rope_scaling", self.partial_key)
        return keys + (("original_max_position_embeddings",) if self.original_at_top else ())

    def read(self, r, f, name):
        f["position"] = rope(r, default_theta=self.default, default_partial=self.partial, layout=self.layout,
                             original_at_top=self.original_at_top, max_seq_len=f["max_seq_len"],
                             theta_key=self.theta_key, partial_key=self.partial_key,
                             default_parameters=dict(self.default_parameters or {}))

    def write(self, f, base, name):
        out = rope_fields(f["position"], original_at_top=self.original_at_top, always_partial=self.always_partial,
                          theta_key=self.theta_key, partial_key=self.partial_key)
        if self.default_parameters and out:  # a null rope_scaling would mean the class default: say "default"
            out["rope_parameters"] = rope_parameters(f["position"])
        return out

    def describe(self, name):
        keys = f"`rope_parameters` / `{self.theta_key}`, `rope_scaling`, `{self.partial_key}`"
        if self.original_at_top:
            keys += ", `original_max_position_embeddings`"
        how = "`position` (rope: theta, partial rotary, scaling linear / llama3 / dynamic / yarn / longrope)"
        if self.layout != "half_split":
            how += f", {self.layout} pairs"
        default = f"theta {self.default:g}" + (f", partial {self.partial:g}" if self.partial != 1 else "")
        if self.default_parameters:
            extra = ", ".join(f"{k} {v}" for k, v in self.default_parameters.items() if k != "rope_theta")
            default += f" ({extra})"
        return [(keys, "mapped", default, how)]


@dataclass(frozen=True)
class RopeByLayerType(Entry):
    """Two RoPEs: one for ``full_attention`` layers (``default`` base, with the scaling), one for
    ``sliding_attention`` layers (``local_default`` base; 4.x files hold it at ``local_key``, without scaling),
    from ``rope_parameters`` nested per layer type (transformers 5) or the 4.x top-level keys (Gemma 3, OLMo 3).

    ``nested``: export writes ``rope_parameters`` nested per layer type (when ``local_key`` is ``rope_theta``
    itself, the 4.x form cannot hold two bases).
    """

    SETS: ClassVar[tuple[str, ...]] = ('position', 'position_by_type')

    default: float = 1_000_000.0
    local_default: float = 10_000.0
    local_key: str = "rope_local_base_freq"
    nested: bool = False

    def config_keys(self, name):
        return tuple(dict.fromkeys(ROPE_KEYS + (self.local_key,)))

    def read(self, r, f, name):
        local = rope(r, default_theta=self.local_default, layer_type="sliding_attention", theta_key=self.local_key,
                     scaling_key=None, max_seq_len=f["max_seq_len"])
        glob = rope(r, default_theta=self.default, layer_type="full_attention", max_seq_len=f["max_seq_len"])
        f["position"] = glob
        f["position_by_type"] = {"sliding_attention": local, "full_attention": glob}

    def write(self, f, base, name):
        by_type = f["position_by_type"]
        glob, loc = by_type.get("full_attention"), by_type.get("sliding_attention")
        if self.nested:
            return {"rope_parameters": {t: rope_parameters(p) for t, p in (("full_attention", glob or loc),
                                                                            ("sliding_attention", loc or glob))}}
        cfg = rope_fields(glob) if glob is not None else {"rope_theta": self.default, "rope_scaling": None}
        if loc is not None:
            local = rope_fields(loc, theta_key=self.local_key, scaling_key=None)
            cfg[self.local_key] = local.get(self.local_key, self.local_default)
            if glob is None and "partial_rotary_factor" in local:
                cfg["partial_rotary_factor"] = local["partial_rotary_factor"]
        return cfg

    def describe(self, name):
        keys = f"`rope_parameters` / `rope_theta`, `rope_scaling`, `{self.local_key}`"
        how = "`position` of full-attention layers (with the scaling) and of sliding layers (without)"
        return [(keys, "mapped", f"theta {self.default:g} (full), {self.local_default:g} (sliding)", how)]


def rope_parameters(position) -> dict:
    """A ``rope`` position spec as one transformers 5 ``rope_parameters`` dict (``rope_type``, ``rope_theta``,
    the scaling's keys, ``partial_rotary_factor``)."""
    legacy = rope_fields(position)
    out = {"rope_type": "default", "rope_theta": legacy.pop("rope_theta")}
    scaling = legacy.pop("rope_scaling", None) or {}
    out.update(scaling)
    out.update(legacy)
    return out


# ---------------------------------------------------------------------------------------------- layers


def _types(r: HFConfig, types: Any, n_layers: int, allowed: tuple[str, ...] = LAYER_TYPES) -> Optional[list]:
    """``layer_types`` checked: one known type per layer (``None`` after an error on its shape)."""
    if not isinstance(types, list) or len(types) != n_layers:
        r.error("layer_types", f"must list one type per layer ({n_layers}), got {json_value(types)}")
        return None
    bad = sorted({t for t in types if t not in allowed}, key=str)
    if bad:
        r.error("layer_types", f"unsupported layer types {bad}; supported: {', '.join(repr(a) for a in allowed)}")
    return types


def _types_of(f: Mapping[str, Any]) -> list[str]:
    return ["sliding_attention" if w is not None else "full_attention" for w in f["windows"]]


@dataclass(frozen=True)
class SlidingWindow(Entry):
    """``sliding_window`` on every layer (a present null: global attention everywhere, as transformers' mask then
    is; Mistral, Mixtral, Phi-3)."""

    SETS: ClassVar[tuple[str, ...]] = ('layer_types', 'sliding_window')

    default: Optional[int] = None

    def read(self, r, f, name):
        window = _read(r, name, "window", self.default, ())
        f["sliding_window"] = window
        f["layer_types"] = None if window is None else ["sliding_attention"] * f["n_layers"]

    def write(self, f, base, name):
        return {name: f["windows"][0]}

    def describe(self, name):
        return [(f"`{name}`", "mapped", _text(self.default), "`sliding_window` of every layer (null: global)")]


@dataclass(frozen=True)
class QwenWindows(Entry):
    """Qwen's windows: ``sliding_window`` applies only with ``use_sliding_window``, then on the layers that
    ``layer_types`` marks ``sliding_attention`` or, in files without ``layer_types``, on every layer from
    ``max_window_layers`` on (``Qwen2Config.__post_init__``); with ``alternate`` (Qwen2-MoE), on every other layer
    (0, 2, 4, ...) below ``max_window_layers`` (``Qwen2MoeConfig.__post_init__``). Without ``use_sliding_window`` the
    window is not read (Qwen2-MoE writes 0 there). Export writes ``layer_types`` and, when the sliding layers form a
    suffix, the matching ``max_window_layers``."""

    SETS: ClassVar[tuple[str, ...]] = ('layer_types', 'sliding_window')

    default: Optional[int] = 4096
    max_window_layers: int = 28
    alternate: bool = False

    def config_keys(self, name):
        return ("use_sliding_window", name, "max_window_layers", "layer_types")

    def read(self, r, f, name):
        n = f["n_layers"]
        use = r.flag("use_sliding_window", False)
        # a present null: no window (Qwen2Config.__post_init__); not read at all without use_sliding_window
        window = _read(r, name, "window", self.default, ()) if use else r.get(name) and None
        first = r.number("max_window_layers", self.max_window_layers, integer=True, positive=False)
        types = r.get("layer_types")
        f["layer_types"], f["sliding_window"] = None, window
        if not use or window is None:
            return
        if types is not None:
            f["layer_types"] = _types(r, types, n)
            return
        if self.alternate:
            slides = [i % 2 == 0 and i < (first or 0) for i in range(n)]
        else:
            slides = [i >= (first or 0) for i in range(n)]
        f["layer_types"] = ["sliding_attention" if s else "full_attention" for s in slides]

    def write(self, f, base, name):
        windows = f["windows"]
        sliding = [w for w in windows if w is not None]
        if not sliding:
            return {"use_sliding_window": False, name: None, "max_window_layers": f["n_layers"]}
        first = next(i for i, w in enumerate(windows) if w is not None)
        suffix = all(w is not None for w in windows[first:])
        return {"use_sliding_window": True, name: sliding[0], "layer_types": _types_of(f),
                "max_window_layers": first if suffix else f["n_layers"]}

    def describe(self, name):
        where = (f"every other layer below {self.max_window_layers}" if self.alternate
                 else f"from layer {self.max_window_layers}")
        return [("`use_sliding_window`, `sliding_window`, `max_window_layers`, `layer_types`", "mapped",
                 f"off; window {self.default}, {where}",
                 "`sliding_window` of the sliding layers (per-layer overrides)")]


@dataclass(frozen=True)
class LayerTypes(Entry):
    """``layer_types`` (transformers 5), else layer ``i`` slides unless ``(i + 1) % pattern == 0``; sliding layers use
    ``sliding_window`` (Gemma 2: every other layer; Gemma 3: ``sliding_window_pattern``, default 6; OLMo 3: 4).

    ``pattern_key``: the 4.x config key holding the pattern (read whenever present; also under ``_`` + the key).
    """

    SETS: ClassVar[tuple[str, ...]] = ('layer_types', 'sliding_window')

    default: Optional[int] = 4096
    pattern: int = 2
    pattern_key: Optional[str] = None

    def config_keys(self, name):
        pattern = (self.pattern_key, "_" + self.pattern_key) if self.pattern_key else ()
        return (name, "sliding_window", *pattern)

    def read(self, r, f, name):
        n = f["n_layers"]
        pattern = self.pattern
        if self.pattern_key:
            pattern = r.number(self.pattern_key, self.pattern, aliases=("_" + self.pattern_key,), integer=True)
        window = _read(r, "sliding_window", "window", self.default, ())
        types = r.get(name)
        if types is None:  # transformers derives layer_types from the pattern when they are absent
            types = ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(n)]
        f["layer_types"] = _types(r, types, n)
        f["sliding_window"] = window
        if window is None and "sliding_attention" in (f["layer_types"] or ()):
            r.error("sliding_window", f"is null, but {name} has sliding_attention layers, whose mask transformers cannot "
                    "build without a window; give the window or mark those layers full_attention")

    def write(self, f, base, name):
        window = next((w for w in f["windows"] if w is not None), base.get("sliding_window") or self.default)
        return {name: _types_of(f), "sliding_window": window}

    def describe(self, name):
        keys = "`layer_types`, `sliding_window`" + (f", `{self.pattern_key}`" if self.pattern_key else "")
        return [(keys, "mapped", f"window {self.default}; every layer but each {self.pattern}th slides",
                 "`sliding_window` per layer (overrides)")]


@dataclass(frozen=True)
class UseSlidingWindow(Entry):
    """``sliding_window`` on every layer, only with ``use_sliding_window`` (Qwen3-MoE: ``Qwen3MoeConfig`` sets the window
    to null otherwise, and its attention and mask then read it for every layer)."""

    SETS: ClassVar[tuple[str, ...]] = ('layer_types', 'sliding_window')

    default: Optional[int] = 4096

    def config_keys(self, name):
        return ("use_sliding_window", name)

    def read(self, r, f, name):
        use = r.flag("use_sliding_window", False)
        window = _read(r, name, "window", self.default, ())
        on = use and window is not None
        f["sliding_window"] = window if on else None
        f["layer_types"] = ["sliding_attention"] * f["n_layers"] if on else None

    def write(self, f, base, name):
        windows = f["windows"]
        if windows[0] is None:
            return {"use_sliding_window": False, name: base.get(name, self.default)}
        return {"use_sliding_window": True, name: windows[0]}

    def describe(self, name):
        return [("`use_sliding_window`, `sliding_window`", "mapped", f"off; window {self.default}",
                 "`sliding_window` of every layer when use_sliding_window")]


# ---------------------------------------------------------------------------------------------- MoE layers


def _experts(f: Mapping[str, Any]) -> int:
    return f["n_experts"] or 0


@dataclass(frozen=True)
class SparseStep(Entry):
    """Qwen-MoE's mixture layers: layer ``i`` is a mixture iff ``num_experts > 0``, ``(i + 1) % decoder_sparse_step ==
    0`` and ``i`` is not in ``mlp_only_layers``; the others are dense FFNs of ``intermediate_size``
    (``Qwen2MoeDecoderLayer``, ``Qwen3MoeDecoderLayer``). Export writes the source's step when it explains the
    mixture layers, else 1, and lists every other dense layer in ``mlp_only_layers``."""

    SETS: ClassVar[tuple[str, ...]] = ('moe', 'moe_layers')

    def config_keys(self, name):
        return (name, "mlp_only_layers")

    def read(self, r, f, name):
        n = f["n_layers"]
        step = r.number(name, 1, integer=True)
        only = r.get("mlp_only_layers", [])
        if not (isinstance(only, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in only)):
            r.error("mlp_only_layers", f"must list layer indices, got {json_value(only)}")
            only = []
        bad = sorted({i for i in only if not 0 <= i < n})
        if bad:
            r.error("mlp_only_layers", f"layers {bad} outside 0..{n - 1} (num_hidden_layers = {n})")
        flags = [_experts(f) > 0 and (i + 1) % (step or 1) == 0 and i not in only for i in range(n)]
        f["moe"] = any(flags)
        f["moe_layers"] = flags

    def write(self, f, base, name):
        flags = f["moe_layers"] if f["moe"] else [False] * f["n_layers"]
        for step in dict.fromkeys((base.get(name) or 1, 1)):
            explained = [(i + 1) % step == 0 for i in range(len(flags))]
            if all(e or not m for e, m in zip(explained, flags)):
                return {name: step, "mlp_only_layers": [i for i, (e, m) in enumerate(zip(explained, flags)) if e and not m]}
        raise AssertionError("a step of 1 explains every layer")

    def describe(self, name):
        return [("`decoder_sparse_step`, `mlp_only_layers`", "mapped", "every layer a mixture",
                 "`moe_layers`: a mixture where (i + 1) % step = 0 and i is not listed, else a dense FFN of d_ff")]


@dataclass(frozen=True)
class FirstDense(Entry):
    """DeepSeek's mixture layers: the first ``first_k_dense_replace`` layers are dense FFNs of ``intermediate_size``,
    every later one a mixture (``DeepseekV3DecoderLayer``)."""

    SETS: ClassVar[tuple[str, ...]] = ('moe', 'moe_layers')

    default: int = 3

    def read(self, r, f, name):
        n = f["n_layers"]
        k = r.number(name, self.default, integer=True, positive=False)
        flags = [i >= (k or 0) for i in range(n)]
        f["moe"], f["moe_layers"] = any(flags), flags

    def write(self, f, base, name):
        flags = f["moe_layers"] if f["moe"] else [False] * f["n_layers"]
        k = next((i for i, m in enumerate(flags) if m), len(flags))
        return {name: k}

    def describe(self, name):
        return [(f"`{name}`", "mapped", _text(self.default), "`moe_layers`: dense FFNs of d_ff on the first k layers, "
                 "mixtures after")]


__all__ = [
    "Entry", "HeadDim", "Ignore", "KVHeads", "Key", "LAYER_TYPES", "LayerTypes", "Own", "QwenWindows", "Refuse", "Rope",
    "RopeByLayerType", "Row", "Same", "SlidingWindow", "rope_parameters", "sizes", "UseSlidingWindow", "SparseStep",
    "FirstDense",
]

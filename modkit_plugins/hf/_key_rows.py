"""The rows of a config table that read one key, and the base of every row (:class:`Entry`): :class:`Key`
(mapped), :class:`Ignore`, :class:`Refuse`, :class:`Same`, :class:`Own`, and :func:`sizes` (the size keys every
model type has). What a table is and how its rows are used: :mod:`._keys`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Mapping, Optional, Union

from modkit.plugin import json_value

from ._reader import ACTIVATIONS, HFConfig
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


def sizes(
    *, vocab_size: int, hidden_size: int, num_hidden_layers: int, num_attention_heads: int, max_position_embeddings: int
) -> dict[str, Key]:
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

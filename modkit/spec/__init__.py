"""Model specs: strict JSON documents validated by pydantic models built from the live registry.

A spec describes a decoder-only Transformer: model-wide sizes, a position scheme, one ``block`` (token mixer,
ffn, norm, placement) used by every layer, optional per-layer ``overrides`` and the model head. The token mixer is
written ``mixer`` or ``attention`` (the same slot: any attention or recurrent mixer, :data:`~modkit.core.config.MIXER_KINDS`),
so a hybrid is a block plus overrides (Gated DeltaNet everywhere, attention every fourth layer); a block's ``ffn``
may be ``null`` (Mamba-2's blocks are a mixer alone). Each component
slot is a discriminated union on ``type`` over every registered component of that kind, built *after*
plugins load, so a third-party component validates exactly like a built-in. Specs never name Python import
paths: component names resolve only through the registry.

Errors are collected into one :class:`~modkit.core.errors.SpecError` listing every ``(path, message)``.
"""

from __future__ import annotations

import json
import typing
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Iterable, Literal, Optional, Union

from pydantic import (
    AliasChoices,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    TypeAdapter,
    ValidationError,
    create_model,
    field_validator,
    model_serializer,
    model_validator,
)

from modkit.core.config import SLOT_KEY, STRICT, ComponentConfig, Slot, StrictModel, slot_kind, slot_kinds
from modkit.core.errors import SpecError, SpecWarning
from modkit.core.jsonio import JSONInputError, check_document, parse_json, read_json_file
from modkit.nn.parametrization import Parametrization
from modkit.core.limits import BOUNDS, MAX_LAYERS, DModel, LayerCount, SeqLen, VocabSize
from modkit.core.registry import Registry, close_matches, get_registry
from modkit.core.validation import ErrorFormatter, extend_path, join_path, json_kind, json_value, last_key, models_in

if TYPE_CHECKING:
    from modkit.core.interfaces import PositionGeometry

SCHEMA_VERSION = 1


class _Strict(StrictModel):
    model_config = ConfigDict(**{**STRICT, "populate_by_name": True})


LayerIndex = Annotated[int, Field(ge=0, lt=MAX_LAYERS)]


class LayerRange(_Strict):
    """A Python-style slice of layer indices: ``start``, ``start + step``, ... below ``stop`` (``stop > start``)."""

    start: LayerIndex = Field(0, description="first layer index (0-based)")
    stop: Optional[Annotated[int, Field(gt=0, le=MAX_LAYERS)]] = Field(None, description="exclusive end; null means n_layers")
    step: Annotated[int, Field(gt=0, le=MAX_LAYERS)] = Field(1, description="stride between selected layers")

    @model_validator(mode="after")
    def _not_empty(self) -> "LayerRange":
        if self.stop is not None and self.stop <= self.start:
            raise ValueError(f"stop = {self.stop} must exceed start = {self.start}; this range selects no layer")
        return self

    def indices(self, n_layers: int) -> list[int]:
        """The selected layer indices for a model of ``n_layers`` layers."""
        stop = n_layers if self.stop is None else min(self.stop, n_layers)
        return list(range(self.start, stop, self.step))

    def selects(self, index: int, n_layers: int) -> bool:
        """Whether layer ``index`` of a model of ``n_layers`` layers is in the range (without listing it)."""
        stop = n_layers if self.stop is None else min(self.stop, n_layers)
        return self.start <= index < stop and (index - self.start) % self.step == 0


class DropoutSpec(_Strict):
    """Dropout probabilities of the model (training-time regularisation; identity in ``eval()``).

    Semantics follow GPT-2 (``embd_pdrop``, ``attn_pdrop``, ``resid_pdrop``; Radford et al. 2019) and nanoGPT's
    ``model.py``: ``embedding`` drops elements of the input to the first block (token + position embeddings),
    ``attention`` drops attention probabilities, ``residual`` drops each sublayer's output before it is added to
    the residual stream. Dropout draws from torch's global generator, so ``torch.manual_seed`` makes it repeatable.
    A probability of 0 adds no operation to the forward pass.
    """

    embedding: float = Field(0.0, ge=0.0, lt=1.0, description="dropout on the embeddings before the first block (GPT-2 embd_pdrop)")
    attention: float = Field(0.0, ge=0.0, lt=1.0, description="dropout on the attention probabilities (GPT-2 attn_pdrop)")
    residual: float = Field(0.0, ge=0.0, lt=1.0, description="dropout on each sublayer output before the residual add (GPT-2 resid_pdrop)")


#: the two names of the token-mixing slot of a block or an override: ``mixer`` (any token mixer) and ``attention``
#: (the name specs used before recurrent mixers existed); both hold the same slot, stored as ``attention``
MIXER_KEYS = ("mixer", "attention")


class _MixerSlot(_Strict):
    """A model with the token-mixing slot (the ``attention`` field), written ``mixer`` or ``attention`` in a spec.

    The key a document used is remembered (:attr:`mixer_key`) and written back by ``model_dump``, so a spec
    round-trips as written; giving both keys is an error naming both.
    """

    _mixer_key: str = PrivateAttr("attention")

    @model_validator(mode="wrap")
    @classmethod
    def _remember_mixer_key(cls, data: Any, handler: Any) -> Any:
        key = None
        if isinstance(data, dict):
            if all(k in data for k in MIXER_KEYS):
                raise ValueError(
                    "give the token mixer once: 'mixer' and 'attention' name the same slot (write 'mixer' for any "
                    "mixer, 'attention' still works for an attention)"
                )
            key = next((k for k in MIXER_KEYS if k in data), None)
        out = handler(data)
        if key is not None and isinstance(out, _MixerSlot):
            out._mixer_key = key
        return out

    @model_serializer(mode="wrap")
    def _write_mixer_key(self, handler: Any) -> Any:
        data = handler(self)
        if isinstance(data, dict) and self._mixer_key != "attention" and "attention" in data:
            data = {(self._mixer_key if k == "attention" else k): v for k, v in data.items()}
        return data

    @property
    def mixer_key(self) -> str:
        """The key the token mixer was written under: ``"mixer"`` or ``"attention"``."""
        return self._mixer_key

    @property
    def mixer(self) -> Optional[ComponentConfig]:
        """The token mixer (the ``attention`` field, whatever key the spec used)."""
        return self.attention


class BlockSpec(_MixerSlot):
    """The components of one Transformer block. The placement creates the norms it needs from ``norm``.

    The token mixer is written ``mixer`` (any mixer: an attention, Mamba-2, Gated DeltaNet, several side by side) or
    ``attention`` (the same slot); it is read as ``block.attention`` or ``block.mixer``. ``ffn`` may be ``null`` for a
    block that is a mixer alone (Mamba-2).
    """

    attention: ComponentConfig = Field(
        ..., validation_alias=AliasChoices("attention", "mixer"),
        description="token-mixing sublayer (written 'mixer' or 'attention': any attention or recurrent mixer), "
        "[batch, seq, d_model] -> same", json_schema_extra={SLOT_KEY: "mixer"},
    )
    ffn: Optional[ComponentConfig] = Slot(
        "ffn", description="position-wise sublayer, [batch, seq, d_model] -> same; null for a block without one (Mamba-2)"
    )
    norm: ComponentConfig = Slot("norm", description="norm config instantiated by the placement wherever it puts a norm")
    placement: ComponentConfig = Slot("placement", description="how norms, sublayers and residuals compose")


class LayerOverride(_MixerSlot):
    """Replace whole block slots (and the position scheme) for selected layers; later overrides win."""

    layers: Union[Annotated[list[LayerIndex], Field(min_length=1, max_length=MAX_LAYERS)], LayerRange] = Field(
        ..., description="layer indices (0-based; at least one), or a range {start, stop, step}"
    )
    attention: Optional[ComponentConfig] = Field(
        None, validation_alias=AliasChoices("attention", "mixer"),
        description="replacement token mixer (written 'mixer' or 'attention')", json_schema_extra={SLOT_KEY: "mixer"},
    )
    ffn: Optional[ComponentConfig] = Slot("ffn", default=None, description="replacement ffn")
    norm: Optional[ComponentConfig] = Slot("norm", default=None, description="replacement norm config")
    placement: Optional[ComponentConfig] = Slot("placement", default=None, description="replacement placement")
    position: Optional[ComponentConfig] = Slot(
        "position", default=None, description="replacement position scheme (q/k or bias schemes only)"
    )

    def indices(self, n_layers: int) -> list[int]:
        """The layer indices this override selects."""
        return self.layers.indices(n_layers) if isinstance(self.layers, LayerRange) else list(self.layers)


def slot_path(owner: Any, slot: str) -> str:
    """The key a block's or an override's ``slot`` is written under (``"mixer"`` or ``"attention"`` for the token
    mixer, as the spec wrote it); other slots are their own name."""
    return getattr(owner, "mixer_key", "attention") if slot == "attention" else slot


class ModelSpec(_Strict):
    """A decoder-only language model: ``input_ids [batch, seq]`` -> ``logits [batch, seq, vocab_size]``.

    Use :func:`load_spec` to get a validated instance (the class returned by :func:`spec_model` has its slots
    bound to the registered components).
    """

    schema_uri: Optional[str] = Field(None, alias="$schema", description="JSON Schema URI for editors (ignored)")
    schema_version: Literal[1] = Field(..., description="version of the spec format; currently 1")
    name: Optional[str] = Field(None, description="model name")
    description: Optional[str] = Field(None, description="free text")
    metadata: dict[str, Union[str, int, float, bool, None]] = Field(
        default_factory=dict,
        description="free-form provenance (e.g. hf_model_type, source); never affects the model",
    )
    vocab_size: VocabSize = Field(..., description="number of token ids (at most 2**24)")
    d_model: DModel = Field(..., description="residual stream width (at most 2**17)")
    n_layers: LayerCount = Field(..., description="number of Transformer blocks (at most 512)")
    max_seq_len: SeqLen = Field(..., description="longest sequence (tokens) the model is specified for (at most 2**27)")
    position: ComponentConfig = Slot("position", description="position scheme of every layer unless overridden")
    block: BlockSpec = Field(..., description="components of every block unless overridden")
    overrides: list[LayerOverride] = Field(default_factory=list, description="per-layer replacements of block slots")
    embedding_norm: Optional[ComponentConfig] = Slot(
        "norm", default=None, description="norm applied to the embeddings before the first block (BERT); null for none"
    )
    embedding_scale: Union[Annotated[float, Field(gt=0)], Literal["sqrt_d_model"], None] = Field(
        None, description="multiply token embeddings by this (Gemma: 'sqrt_d_model', rounded to the model dtype)"
    )
    final_norm: Optional[ComponentConfig] = Slot("norm", default=None, description="norm after the last block; null for none")
    tie_embeddings: bool = Field(False, description="LM head shares the token-embedding matrix (one parameter)")
    lm_head_bias: bool = Field(False, description="LM head has a bias vector [vocab_size]")
    logit_scale: Optional[float] = Field(
        None, gt=0, description="multiply the logits by this before any soft-cap (Cohere's logit_scale; Granite's "
        "1 / logits_scaling); null for 1"
    )
    final_logit_softcap: Optional[float] = Field(
        None, gt=0, description="logits = cap * tanh(logits / cap) (Gemma 2); null for none"
    )
    init_std: float = Field(0.02, gt=0, description="standard deviation of the normal init of weight matrices")
    dropout: DropoutSpec = Field(
        default_factory=DropoutSpec, description="dropout probabilities (embedding, attention, residual); all 0 by default"
    )
    parametrization: Optional[Parametrization] = Field(
        None,
        description="how init, learning rates, logits and attention scale with width: null or {\"type\": \"sp\"} for "
        "standard parametrization; {\"type\": \"mup\", \"base_d_model\": N} for muP (modkit.nn.parametrization)",
    )

    @field_validator("schema_version", mode="before")
    @classmethod
    def _version_not_bool(cls, v: Any) -> Any:
        if isinstance(v, bool):  # Literal[1] alone would take true (== 1 in Python)
            raise ValueError("schema_version must be the integer 1, not a boolean")
        return v

    @field_validator("overrides")
    @classmethod
    def _no_empty_override(cls, v: list[LayerOverride]) -> list[LayerOverride]:
        for i, o in enumerate(v):
            if not any(getattr(o, k) is not None for k in ("attention", "ffn", "norm", "placement", "position")):
                raise ValueError(f"overrides[{i}] replaces nothing; give at least one of mixer (or attention), ffn, norm, placement, position")
        return v

    def layer(self, index: int) -> "LayerSpec":
        """The effective components of layer ``index`` after applying overrides in order.

        Raises:
            IndexError: ``index`` outside ``[0, n_layers)``.
        """
        if not 0 <= index < self.n_layers:
            raise IndexError(f"layer {index} out of range for n_layers = {self.n_layers}")
        parts = dict(
            attention=self.block.attention,
            ffn=self.block.ffn,
            norm=self.block.norm,
            placement=self.block.placement,
            position=self.position,
        )
        for o in self.overrides:
            if o.layers.selects(index, self.n_layers) if isinstance(o.layers, LayerRange) else index in o.layers:
                for k in parts:
                    v = getattr(o, k)
                    if v is not None:
                        parts[k] = v
        return LayerSpec(index=index, **parts)

    def to_json(self, *, indent: int | None = 2) -> str:
        """Serialise to spec JSON (round-trips through :func:`load_spec`)."""
        return json.dumps(self.to_dict(), indent=indent)

    def to_dict(self) -> dict:
        """Serialise to a plain dict (aliases used, ``$schema`` omitted when unset)."""
        data = self.model_dump(mode="json", by_alias=True)
        if data.get("$schema") is None:
            data.pop("$schema", None)
        if data.get("parametrization") is None:  # standard parametrization: the spec as it was written before muP
            data.pop("parametrization", None)
        return data


@dataclass(frozen=True)
class LayerSpec:
    """The resolved components of one layer: ``attention`` is the layer's token mixer (also :attr:`mixer`);
    ``ffn`` is ``None`` for a block without one."""

    index: int
    attention: ComponentConfig
    ffn: Optional[ComponentConfig]
    norm: ComponentConfig
    placement: ComponentConfig
    position: ComponentConfig

    @property
    def mixer(self) -> ComponentConfig:
        """The layer's token mixer (an attention or a recurrent mixer)."""
        return self.attention


@dataclass(frozen=True)
class SpecContext:
    """Model-wide sizes handed to component configs' cross-field ``check(ctx)`` methods.

    A position scheme is checked once per attention geometry it serves: ``n_heads`` and ``head_dim`` are then those
    of the layers' attention (read from its config's ``n_heads`` and ``resolved_head_dim(d_model)``, when it has
    them); elsewhere they are ``None``.
    """

    d_model: int
    n_layers: int
    vocab_size: int
    max_seq_len: int
    registry: Registry
    n_heads: Optional[int] = None
    head_dim: Optional[int] = None


# ---------------------------------------------------------------------------------------------------------
# live model construction


def _ident(kind: str) -> str:
    return "_slot_" + "".join(ch if ch.isalnum() else "_" for ch in kind)


def _slot_fields(cls: type[BaseModel]) -> dict[str, str]:
    return {name: k for name, f in cls.model_fields.items() if (k := slot_kind(f)) is not None}


def _live_copy(cls: type[BaseModel], extra: dict[str, Any] | None = None) -> type[BaseModel]:
    slots = _slot_fields(cls)
    if not slots and not extra:
        return cls
    overrides: dict[str, Any] = dict(extra or {})
    for name, kind in slots.items():
        f = cls.model_fields[name]
        listed = typing.get_origin(f.annotation) is list  # list[ComponentConfig]: a list of slots
        optional = f.default is None or type(None) in typing.get_args(f.annotation)
        ann = f"list[{_ident(kind)}]" if listed else _ident(kind)
        ann = f"Optional[{ann}]" if optional else ann
        default = ... if f.is_required() else f.default
        extra_args = {"validation_alias": f.validation_alias} if f.validation_alias is not None else {}
        if listed and getattr(f, "metadata", None):  # length bounds of the list
            extra_args.update({k: getattr(m, k) for m in f.metadata for k in ("min_length", "max_length") if hasattr(m, k)})
        overrides[name] = (ann, Field(default, description=f.description, json_schema_extra=f.json_schema_extra, **extra_args))
    return create_model(cls.__name__, __base__=cls, __module__=cls.__module__, __doc__=cls.__doc__, **overrides)


def _alias_resolver(kind: str, registry: Registry):
    """The function of a before-validator replacing an alias ``{"type": alias}`` by the type it stands for (a
    :class:`~modkit.core.errors.SpecWarning` carries the alias note, if the entry gives one)."""

    def resolve(v: Any) -> Any:
        if isinstance(v, dict) and isinstance(v.get("type"), str):
            for k in slot_kinds(kind):  # a mixer slot resolves the aliases of attentions and of mixers
                name = registry.resolve(k, v["type"])
                if name != v["type"]:
                    note = registry.get(k, name).alias_notes.get(v["type"])
                    if note:
                        warnings.warn(note, SpecWarning, stacklevel=2)
                    return {**v, "type": name}
        return v

    return resolve


def _missing_kind(kind: str, registry: Registry):
    def check(v: Any) -> Any:
        raise ValueError(
            f"no component of kind {kind!r} is installed; installed plugins: "
            f"{', '.join(p.name for p in registry.plugins()) or '(none)'}"
        )

    return Annotated[Any, BeforeValidator(check)]


def spec_model(registry: Registry | None = None) -> type[ModelSpec]:
    """The :class:`ModelSpec` subclass whose component slots are unions over ``registry``'s components.

    Rebuilt whenever the registry changes (it carries a generation counter).
    """
    reg = registry or get_registry()
    cached = reg._spec_model_cache
    if cached and cached[0] == reg.generation:
        return cached[1]
    entries = reg.components()
    kinds = set(reg.kinds())
    for cls in [e.config for e in entries] + [BlockSpec, LayerOverride, ModelSpec]:
        kinds.update(_slot_fields(cls).values())
    live: dict[type, type] = {}
    for e in entries:
        if e.config not in live:
            live[e.config] = _live_copy(e.config)
    ns: dict[str, Any] = {"Optional": Optional}
    kinds.add("mixer")  # the block's token-mixing slot exists whatever is installed
    for kind in sorted(kinds):
        accepted = slot_kinds(kind)  # a mixer slot takes attentions and recurrent mixers alike
        classes = list(dict.fromkeys(live[e.config] for e in entries if e.kind in accepted))
        if not classes:
            ns[_ident(kind)] = _missing_kind(kind, reg)
        else:  # a one-member union too, so an unknown type gets the same helpful error
            union = Annotated[Union[tuple(classes)], Field(discriminator="type")]
            aliased = any(reg.aliases(k) for k in accepted)
            ns[_ident(kind)] = Annotated[union, BeforeValidator(_alias_resolver(kind, reg))] if aliased else union
    block = _live_copy(BlockSpec)
    override = _live_copy(LayerOverride)
    ns["_BlockSpec"], ns["_LayerOverride"] = block, override
    model = _live_copy(
        ModelSpec,
        extra={
            "block": ("_BlockSpec", Field(..., description=ModelSpec.model_fields["block"].description)),
            "overrides": (
                "list[_LayerOverride]",
                Field(default_factory=list, description=ModelSpec.model_fields["overrides"].description),
            ),
        },
    )
    originals = set(live) | {BlockSpec, LayerOverride, ModelSpec}
    for cls in dict.fromkeys([*live.values(), block, override, model]):
        if cls not in originals:  # a copy with forward references to the unions above
            cls.model_rebuild(_types_namespace=ns, force=True)
    reg._spec_model_cache = (reg.generation, model)
    reg._slot_types = ns
    return model


def load_component(kind: str, data: Union[dict, ComponentConfig], *, registry: Registry | None = None) -> ComponentConfig:
    """Validate one component config of ``kind`` (e.g. ``{"type": "rmsnorm", "eps": 1e-6}``) on its own.

    Nested slots resolve against the live registry, as in a full spec.

    Raises:
        SpecError: with ``(path, message)`` pairs relative to the component.
    """

    reg = registry or get_registry()
    spec_model(reg)
    if isinstance(data, ComponentConfig):
        data = data.model_dump(mode="json")
    adapter = TypeAdapter(reg._slot_types[_ident(kind)]) if _ident(kind) in reg._slot_types else None
    if adapter is None:
        raise SpecError([("", reg.unknown_kind_message(kind))])
    try:
        return adapter.validate_python(data)
    except ValidationError as exc:
        raise SpecError(_format_errors(exc.errors(), data, reg)) from None


# ---------------------------------------------------------------------------------------------------------
# loading and error reporting


def _kind_for_tags(expected: str, registry: Registry) -> str | None:
    """The slot kind whose union has exactly these tags (``"mixer"`` for the token-mixing slot: attentions and
    recurrent mixers; a slot of kind ``attention`` lists attentions only)."""
    tags = {t.strip().strip("'\"") for t in expected.split(",")}
    for kind in ["mixer", *registry.kinds()]:
        if {t for k in slot_kinds(kind) for t in registry.types(k)} == tags:
            return kind if kind != "mixer" or registry.types("mixer") else "attention"
    return None


class _SpecErrorFormatter(ErrorFormatter):
    """:class:`~modkit.core.validation.ErrorFormatter` with the registry's messages: unknown component types (valid
    types, the closest match, the installed plugins), a missing ``type``, the valid fields of a component, and the
    documented bound of a size (:mod:`modkit.core.limits`). A renamed field (``dff`` for the required ``d_ff``) is one
    error, not that plus ``d_ff: Field required``; a field one level off (``block.qk_norm``) names the component
    it belongs to."""

    def __init__(self, registry: Registry):
        roots = [spec_model(registry), ModelSpec, *(e.config for e in registry.components())]
        super().__init__(models_in(roots).values())
        self.registry = registry
        self._data: Any = None
        self._renamed: dict[tuple, str] = {}  # loc of an unknown field -> the missing required field it stands for

    def special(self, err: dict, path: str, parent: Any, tags: list[str]) -> Optional[tuple[str, str]]:
        etype = err.get("type")
        reg = self.registry
        if etype == "union_tag_invalid":
            ctx = err.get("ctx", {})
            kind = _kind_for_tags(str(ctx.get("expected_tags", "")), reg) or "component"
            return (join_path(path, "type"), reg.unknown_type_message(kind, ctx.get("tag")))
        if etype == "union_tag_not_found":
            return (path, "missing 'type'; every component needs a \"type\" naming a registered component")
        if etype == "extra_forbidden":
            field = str(err.get("loc", ("",))[-1])
            tag = parent.get("type") if isinstance(parent, dict) else None
            where = "this object" if not isinstance(parent, dict) or "type" not in parent else repr(tag) if isinstance(tag, str) else json_value(tag)
            allowed = self.allowed_fields(parent, tags)
            msg = f"unknown field {field!r} for {where}"
            renamed = self._renamed.get(tuple(err.get("loc", ())))
            if allowed:
                hint = [renamed] if renamed else close_matches(field, allowed)
                msg += f"; valid fields: {', '.join(allowed)}" + (f"; did you mean {hint[0]!r}?" if hint else "")
            moved = self._misplaced(err, path, field, parent)
            if moved:
                msg += "; " + moved
            return (path, msg)
        return None

    # a renamed field ("dff" for "d_ff") is one problem: the "Field required" of the name it stands for is dropped
    def format(self, errs: list[dict], data: Any) -> list[tuple[str, str]]:
        self._data, self._renamed = data, {}
        missing: dict[tuple, list[str]] = {}
        for e in errs:
            if e.get("type") == "missing" and e.get("loc"):
                missing.setdefault(tuple(e["loc"][:-1]), []).append(str(e["loc"][-1]))
        dropped = set()
        for e in errs:
            loc = tuple(e.get("loc", ()))
            if e.get("type") == "extra_forbidden" and loc:
                hint = close_matches(str(loc[-1]), missing.get(loc[:-1], []))
                if hint:
                    self._renamed[loc] = hint[0]
                    dropped.add(loc[:-1] + (hint[0],))
        errs = [e for e in errs if not (e.get("type") == "missing" and tuple(e.get("loc", ())) in dropped)]
        return super().format(errs, data)

    def _misplaced(self, err: dict, path: str, field: str, parent: Any) -> str:
        """``it is a field of block.attention ('gqa'): move it there (block.attention.qk_norm)`` when the unknown
        ``field`` is a field of a component one level below its object, or beside it; else ``""``."""
        loc = tuple(err.get("loc", ()))
        nodes = [self._data]  # the objects and arrays along loc that the document holds (union tags skipped)
        for item in loc[:-1]:
            node = nodes[-1]
            if isinstance(node, dict) and item in node:
                nodes.append(node[item])
            elif isinstance(item, int) and isinstance(node, list) and -len(node) <= item < len(node):
                nodes.append(node[item])
        base = path[: -len(field)].rstrip(".") if path.endswith(field) else ""
        up = base.rsplit(".", 1)[0] if "." in base else ""
        places = []
        for prefix, holder, skip in ((base, parent, None), (up, nodes[-2] if len(nodes) > 1 else None, parent)):
            if not isinstance(holder, dict):
                continue
            for key, value in holder.items():
                if value is skip or not isinstance(value, dict) or not isinstance(value.get("type"), str):
                    continue
                if field in self.allowed_fields(value, []):
                    where = f"{prefix}.{key}" if prefix else str(key)
                    places.append(f"{where} ({value['type']!r})")
        if not places:
            return ""
        target = places[0].split(" ", 1)[0]
        return f"it is a field of {' and '.join(places)}: move it there ({target}.{field})"

    def allowed_fields(self, parent: Any, tags: list[str]) -> list[str]:
        if isinstance(parent, dict) and isinstance(parent.get("type"), str):
            for c in self.registry.components():
                if c.type == parent["type"]:
                    return [n for n in c.config.model_fields if n != "type"]
            return []
        return super().allowed_fields(parent, tags)

    def hint(self, err: dict, path: str) -> str:
        field = last_key(path)
        if err.get("type") == "less_than_equal" and field in BOUNDS:
            return f"; {BOUNDS[field]:,} is modkit's bound for {field} (modkit.core.limits), far above any published model"
        return ""


def _format_errors(errs: list[dict], data: Any, registry: Registry) -> list[tuple[str, str]]:
    """``(path, message)`` per problem pydantic found in ``data`` (JSON paths, JSON values, the union branch the
    input meant; see :mod:`modkit.core.validation`)."""
    return _SpecErrorFormatter(registry).format(errs, data)


def _within(cfg: Any) -> Iterable[ComponentConfig]:
    """``cfg`` and every component config nested in it (slots, lists of slots), depth first."""
    if isinstance(cfg, ComponentConfig):
        yield cfg
        for name in type(cfg).model_fields:
            value = getattr(cfg, name)
            for item in value if isinstance(value, (list, tuple)) else (value,):
                yield from _within(item)


def _dropout_errors(spec: ModelSpec, registry: Registry) -> list[tuple[str, str]]:
    """A non-zero dropout needs every component that applies it to declare the capability (else it is ignored).

    ``dropout.attention`` is checked on the attentions (kind ``attention``) of the layers' token mixers, nested ones
    included (an attention beside a recurrent mixer); a recurrent mixer has no attention probabilities to drop, so it
    is not asked for the capability, but a spec with no attention at all is refused (the dropout would apply nowhere).
    """
    errors: list[tuple[str, str]] = []
    for field_name, kind, capability in (("attention", "attention", "attention_dropout"), ("residual", "placement", "residual_dropout")):
        if getattr(spec.dropout, field_name) == 0:
            continue
        configs = [getattr(spec.block, kind)] + [getattr(o, kind) for o in spec.overrides if getattr(o, kind) is not None]
        checked = []
        for cfg in configs:
            if cfg is None:  # a component that failed the schema (see _valid_parts_errors)
                continue
            if kind == "attention":  # the attentions among the token mixers (recurrent mixers hold no probabilities)
                inner = [c for c in _within(cfg) if registry.entry_for_config(c).kind == "attention"]
                checked += inner
                continue
            checked.append(cfg)
        if kind == "attention" and not checked and any(c is not None for c in configs):
            errors.append((f"dropout.{field_name}", f"dropout.{field_name} = {getattr(spec.dropout, field_name)} drops attention "
                           "probabilities, but no layer's token mixer holds an attention; set it to 0"))
            continue
        for cfg in checked:
            entry = registry.entry_for_config(cfg, kind)
            if not entry.capabilities.get(capability):
                errors.append(
                    (
                        f"dropout.{field_name}",
                        f"{kind} type {entry.type!r} ({entry.provider}) does not declare the {capability!r} capability, so "
                        f"dropout.{field_name} = {getattr(spec.dropout, field_name)} would be ignored; set it to 0 or use a "
                        f"{kind} that applies it",
                    )
                )
                break
    return errors


def position_geometry(attention: Any, ctx: Any, module: Any = None) -> Optional["PositionGeometry"]:
    """The :class:`~modkit.PositionGeometry` a layer's position scheme acts on, as its attention declares it.

    The attention config's ``position_geometry(ctx)`` method when it has one (the declaration: multi-head latent
    attention rotates only its ``qk_rope_head_dim`` part); otherwise its ``n_heads`` and ``resolved_head_dim(d_model)``
    (or ``head_dim``) fields, key heads from ``kv_heads`` / ``n_kv_heads``; otherwise, at build time, the built
    module's ``n_heads`` / ``head_dim`` / ``n_kv_heads`` attributes. ``None`` when nothing tells.

    Used at spec time (each position config is checked against the geometry it serves) and by ``build`` (the
    scheme is built from it), so a spec that validates builds the scheme it was checked with.

    Args:
        attention: the layer's attention config. ctx: a :class:`SpecContext` or :class:`~modkit.BuildContext`
            (both carry ``d_model``). module: the built attention module (build time), or ``None``.

    Raises:
        TypeError: a ``position_geometry`` that returns something else than a ``PositionGeometry``.
    """
    from modkit.core.interfaces import PositionGeometry

    declare = getattr(attention, "position_geometry", None)
    if callable(declare):
        geo = declare(ctx)
        if geo is not None and not isinstance(geo, PositionGeometry):
            raise TypeError(f"{type(attention).__name__}.position_geometry() returned {type(geo).__name__}, not a modkit.PositionGeometry")
        return geo

    def ints(*values: Any) -> Optional[int]:
        return next((v for v in values if isinstance(v, int) and not isinstance(v, bool)), None)

    resolve = getattr(attention, "resolved_head_dim", None)
    try:
        head_dim = resolve(ctx.d_model) if callable(resolve) else getattr(attention, "head_dim", None)
    except Exception:  # noqa: BLE001 - an inconsistent attention config reports its own error
        head_dim = None
    kv = getattr(attention, "kv_heads", None)
    n_heads = ints(getattr(attention, "n_heads", None), getattr(module, "n_heads", None))
    head_dim = ints(head_dim, getattr(module, "head_dim", None))
    n_kv = ints(kv, getattr(attention, "n_kv_heads", None), getattr(module, "n_kv_heads", None))
    if n_heads is None and head_dim is None:
        return None
    return PositionGeometry(n_heads, head_dim, n_kv)


def _head_geometry(attention: Any, ctx: Any) -> tuple[Optional[int], Optional[int]]:
    """``(n_heads, head_dim)`` of :func:`position_geometry` (``(None, None)`` when unknown)."""
    try:
        geo = position_geometry(attention, ctx)
    except Exception:  # noqa: BLE001 - an inconsistent attention config reports its own error
        geo = None
    return (geo.n_heads, geo.head_dim) if geo is not None else (None, None)


def _geometry_errors(spec: ModelSpec, registry: Registry) -> list[tuple[str, str]]:
    """A position scheme acting on q/k or on the scores that no layer using it can take: every layer using that
    scheme has a token mixer declaring no per-head geometry for it (its ``position_geometry(ctx)`` returns ``None``: a
    recurrent mixer). A layer whose mixer declares none while other layers with the same scheme do (a hybrid: Gated
    DeltaNet layers beside attention layers) is fine: its mixer has no queries or keys and ignores the scheme."""
    ctx = SpecContext(spec.d_model, spec.n_layers, spec.vocab_size, spec.max_seq_len, registry)
    served: dict[str, bool] = {}  # position config (JSON) -> some layer declares the geometry it needs
    first: dict[str, tuple[str, int, Any, Any, str, str]] = {}
    for i in range(spec.n_layers):
        layer = spec.layer(i)
        if layer.position is None:
            continue
        acts = registry.entry_for_config(layer.position, "position").capabilities.get("acts_on")
        if acts not in ("qk", "bias"):
            continue
        need = "head_dim" if acts == "qk" else "n_heads"
        key = layer.position.model_dump_json()
        declare = getattr(layer.attention, "position_geometry", None)
        if not callable(declare):  # an attention without the declaration: its fields tell (checked elsewhere)
            served[key] = True
            continue
        try:
            geo = declare(ctx)
        except Exception:  # noqa: BLE001 - an inconsistent attention config reports its own error
            served[key] = True
            continue
        ok = geo is not None and getattr(geo, need) is not None
        served[key] = served.get(key, False) or ok
        if not ok and key not in first:
            path = "position"
            for j, o in enumerate(spec.overrides):
                if o.position is not None and i in o.indices(spec.n_layers):
                    path = f"overrides[{j}].position"
            first[key] = (path, i, layer, geo, need, acts)
    errors: dict[str, str] = {}
    for key, (path, i, layer, geo, need, acts) in first.items():
        if served.get(key):
            continue
        errors.setdefault(path, (
            f"position type {layer.position.type!r} acts on {'queries and keys' if acts == 'qk' else 'the attention scores'}, "
            f"but no layer using it has a mixer that declares a {need} for it (layer {i}'s {layer.attention.type!r} declares "
            f"no {need}: its position_geometry() gives {geo!r}); use position type 'none', or give such layers an "
            "attention"))
    return list(errors.items())


def _position_uses(spec: ModelSpec, registry: Registry) -> list[tuple[str, Any, tuple[Optional[int], Optional[int]]]]:
    """``(path, position config, (n_heads, head_dim))`` for each position config and each attention geometry of the
    layers that use it (the top-level scheme once without geometry when every layer overrides it)."""
    uses: dict[tuple[str, tuple], Any] = {}
    ctx = SpecContext(spec.d_model, spec.n_layers, spec.vocab_size, spec.max_seq_len, registry)
    for i in range(spec.n_layers):
        path = "position"
        for j, o in enumerate(spec.overrides):
            if o.position is not None and i in o.indices(spec.n_layers):
                path = f"overrides[{j}].position"
        layer = spec.layer(i)
        uses.setdefault((path, _head_geometry(layer.attention, ctx)), layer.position)
    if not any(p == "position" for p, _ in uses):
        uses[("position", (None, None))] = spec.position
    for j, o in enumerate(spec.overrides):
        if o.position is not None and not any(p == f"overrides[{j}].position" for p, _ in uses):
            uses[(f"overrides[{j}].position", (None, None))] = o.position
    return [(path, cfg, geometry) for (path, geometry), cfg in uses.items()]


def _semantic_errors(spec: ModelSpec, registry: Registry, *, geometry: bool = True) -> list[tuple[str, str]]:
    """Cross-field errors of a spec: component configs' ``check(ctx)``, dropout capabilities, override ranges.

    Components that are ``None`` are skipped. ``geometry=False`` checks position schemes without the attention
    geometry of the layers they serve (``n_heads`` / ``head_dim`` unknown), for a spec whose attention configs did not
    all validate.
    """
    ctx = SpecContext(spec.d_model, spec.n_layers, spec.vocab_size, spec.max_seq_len, registry)
    errors: list[tuple[str, str]] = []

    def visit(cfg: Any, path: str, at: SpecContext = ctx) -> None:
        if not isinstance(cfg, ComponentConfig):
            return
        check = getattr(cfg, "check", None)
        if callable(check):
            for sub, msg in check(at) or ():
                errors.append((extend_path(path, sub), msg))
        for name in type(cfg).model_fields:
            value = getattr(cfg, name)
            if isinstance(value, (list, tuple)):  # a list of slots (the mixers of a parallel hybrid)
                for k, item in enumerate(value):
                    visit(item, f"{path}.{name}[{k}]", at)
            else:
                visit(value, f"{path}.{name}", at)

    errors.extend(_dropout_errors(spec, registry))
    errors.extend(_geometry_errors(spec, registry) if geometry else [])
    if geometry:
        for path, position, shape in _position_uses(spec, registry):
            visit(position, path, SpecContext(spec.d_model, spec.n_layers, spec.vocab_size, spec.max_seq_len, registry, *shape))
    else:
        visit(spec.position, "position")
        for i, o in enumerate(spec.overrides):
            visit(o.position, f"overrides[{i}].position")
    for slot in ("attention", "ffn", "norm", "placement"):
        visit(getattr(spec.block, slot), f"block.{slot_path(spec.block, slot)}")
    for name in ("embedding_norm", "final_norm"):
        visit(getattr(spec, name), name)
    for i, o in enumerate(spec.overrides):
        if o.layers is None:  # the selection failed the schema
            pass
        elif isinstance(o.layers, list):
            for j, idx in enumerate(o.layers):
                if not 0 <= idx < spec.n_layers:
                    errors.append((f"overrides[{i}].layers[{j}]", f"layer {idx} out of range; n_layers = {spec.n_layers}"))
        elif o.layers.start >= spec.n_layers:
            errors.append((f"overrides[{i}].layers.start", f"start = {o.layers.start} selects no layer; n_layers = {spec.n_layers}"))
        for slot in ("attention", "ffn", "norm", "placement"):
            visit(getattr(o, slot), f"overrides[{i}].{slot_path(o, slot)}")
        if o.position is not None:
            acts = registry.entry_for_config(o.position, "position").capabilities.get("acts_on")
            if acts == "embedding":
                errors.append(
                    (
                        f"overrides[{i}].position",
                        f"position type {o.position.type!r} acts on the input embeddings, so it cannot differ per layer; "
                        "set it in the top-level 'position' instead",
                    )
                )
    return errors


_SLOTS = ("attention", "ffn", "norm", "placement")
_SIZES = ("vocab_size", "d_model", "n_layers", "max_seq_len")


def _valid_parts_errors(data: dict, schema_errors: list[tuple[str, str]], registry: Registry) -> list[tuple[str, str]]:
    """The cross-field errors of the parts of a spec that failed the schema which passed it on their own.

    A spec with a schema error (``block.ffn.d_ff = -1``) may hold independent cross-field errors elsewhere
    (``d_model`` not divisible by ``block.attention.n_heads``); reporting them in the same run saves a round trip.
    Every component config without a schema error at or below its path is validated alone and checked with the
    model-wide sizes, when those are valid; a component with a schema error is not (its own values are unknown, so
    a check would guess). Position schemes are checked without the attention geometry unless every attention
    config and layer selection is valid.
    """
    bad = [p for p, _ in schema_errors]
    if "" in bad or any(n in bad or n not in data for n in _SIZES):
        return []

    def clean(path: str) -> bool:
        return not any(b == path or b.startswith((path + ".", path + "[")) for b in bad)

    def component(kind: str, path: str, value: Any) -> Optional[ComponentConfig]:
        if not isinstance(value, dict) or not clean(path):
            return None
        try:
            return load_component(kind, value, registry=registry)
        except SpecError:
            return None

    def slots_of(holder: dict, where: str, cls: type) -> Any:
        """A block or override built from its valid slots, the mixer under the key the document used."""
        key = next((k for k in MIXER_KEYS if k in holder), "attention")
        got = {s: component("mixer" if s == "attention" else s, f"{where}.{key if s == 'attention' else s}",
                            holder.get(key if s == "attention" else s)) for s in _SLOTS}
        return got, key

    block = data.get("block") if isinstance(data.get("block"), dict) else {}
    parts: dict[str, Any] = {n: data[n] for n in _SIZES}
    parts["position"] = component("position", "position", data.get("position"))
    got, key = slots_of(block, "block", BlockSpec)
    parts["block"] = BlockSpec.model_construct(**got)
    parts["block"]._mixer_key = key
    for name in ("embedding_norm", "final_norm"):
        parts[name] = component("norm", name, data.get(name))
    complete = parts["position"] is not None and parts["block"].attention is not None
    parts["dropout"] = None
    if clean("dropout"):
        try:
            parts["dropout"] = DropoutSpec.model_validate(data.get("dropout", {}))
        except ValidationError:
            pass
    overrides = []
    for i, o in enumerate(data.get("overrides") or [] if isinstance(data.get("overrides"), list) else []):
        o = o if isinstance(o, dict) else {}
        where = f"overrides[{i}]"
        layers = None
        if "layers" in o and clean(f"{where}.layers"):
            try:
                layers = TypeAdapter(LayerOverride.model_fields["layers"].annotation).validate_python(o["layers"])
            except ValidationError:
                layers = None
        slots, key = slots_of(o, where, LayerOverride)
        slots["position"] = component("position", f"{where}.position", o.get("position"))
        complete = complete and clean(where)
        override = LayerOverride.model_construct(layers=layers, **slots)
        override._mixer_key = key
        overrides.append(override)
    parts["overrides"] = overrides
    if parts["dropout"] is None:
        parts["dropout"] = DropoutSpec()  # unknown: its checks are skipped (all probabilities 0)
    partial = ModelSpec.model_construct(**parts)
    try:
        return _semantic_errors(partial, registry, geometry=complete)
    except Exception:  # noqa: BLE001 - a check written for valid specs only; the schema errors stand on their own
        return []


def load_spec(source: Union[str, Path, dict, ModelSpec], *, registry: Registry | None = None) -> ModelSpec:
    """Parse and validate a spec.

    Args:
        source: a path to a ``.json`` file, a JSON string, a dict, or an already-validated :class:`ModelSpec`
            (re-validated against ``registry``).
        registry: defaults to the process-wide registry with every installed plugin.

    Returns:
        A validated :class:`ModelSpec` (instance of the live subclass).

    Raises:
        SpecError: with every ``(path, message)``: unreadable file (missing, not a regular file, over 16 MiB,
            not UTF-8), malformed JSON (line and column), duplicate keys, nesting over 64 levels (see
            :mod:`modkit.core.jsonio`), schema violations (strict types, non-finite floats, sizes over the bounds of
            :mod:`modkit.core.limits`), unknown component types (valid types and closest match listed) and
            cross-field problems such as ``block.attention: n_kv_heads = 5 does not divide n_heads = 32``.
    """
    reg = registry or get_registry()
    label: str | None = None
    read_errors: list[tuple[str, str]] = []  # duplicate keys: reported with the schema's errors of the same document
    if isinstance(source, ModelSpec):
        data = source.to_dict()
    elif isinstance(source, dict):
        data = source
        try:  # the nesting bound a file gets (modkit.core.jsonio), for a dict built in Python
            check_document(data)
        except JSONInputError as exc:
            raise SpecError(exc.errors) from None
    else:
        text = source if isinstance(source, str) else None
        try:
            if text is not None and text.lstrip().startswith("{"):
                data = parse_json(text)
            else:
                label = str(source)
                data = read_json_file(source)
        except JSONInputError as exc:
            if exc.document is None:
                raise SpecError(exc.errors, source=label) from None
            data, read_errors = exc.document, exc.errors
    if not isinstance(data, dict):
        raise SpecError(read_errors + [("", f"a spec is a JSON object, got {json_kind(data)}")], source=label)
    model = spec_model(reg)
    try:
        spec = model.model_validate(data)
    except ValidationError as exc:
        errors = read_errors + _format_errors(exc.errors(), data, reg)
        errors += _valid_parts_errors(data, errors, reg)
        raise SpecError(list(dict.fromkeys(errors)), source=label) from None
    errors = list(dict.fromkeys(read_errors + _semantic_errors(spec, reg)))
    if errors:
        raise SpecError(errors, source=label)
    return spec


def json_schema(registry: Registry | None = None) -> dict:
    """JSON Schema (draft 2020-12) of specs with the installed components, for editors (``"$schema"`` key)."""
    schema = spec_model(registry).model_json_schema(by_alias=True)
    for name in ("BlockSpec", "LayerOverride"):  # the token mixer may be written 'mixer' or 'attention'
        d = schema.get("$defs", {}).get(name)
        if d is None or "attention" not in d.get("properties", {}):
            continue
        d["properties"]["mixer"] = d["properties"]["attention"]
        if "attention" in d.get("required", []):
            d["required"] = [r for r in d["required"] if r != "attention"]
            d["oneOf"] = [{"required": ["mixer"]}, {"required": ["attention"]}]
        else:
            d["not"] = {"required": ["mixer", "attention"]}
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema.setdefault("title", "modkit model spec")
    return schema


def iter_configs(spec: ModelSpec) -> Iterable[tuple[str, ComponentConfig]]:
    """Every component config in ``spec`` with its JSON path (nested slots included)."""

    def walk(cfg: Any, path: str):
        if isinstance(cfg, ComponentConfig):
            yield path, cfg
            for name in type(cfg).model_fields:
                value = getattr(cfg, name)
                if isinstance(value, (list, tuple)):  # a list of slots
                    for k, item in enumerate(value):
                        yield from walk(item, f"{path}.{name}[{k}]")
                else:
                    yield from walk(value, f"{path}.{name}")

    yield from walk(spec.position, "position")
    for slot in ("attention", "ffn", "norm", "placement"):
        yield from walk(getattr(spec.block, slot), f"block.{slot_path(spec.block, slot)}")
    for name in ("embedding_norm", "final_norm"):
        yield from walk(getattr(spec, name), name)
    for i, o in enumerate(spec.overrides):
        for slot in ("attention", "ffn", "norm", "placement", "position"):
            yield from walk(getattr(o, slot), f"overrides[{i}].{slot_path(o, slot)}")

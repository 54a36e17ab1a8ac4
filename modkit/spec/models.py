"""The pydantic models of a spec, before any component is known: :class:`ModelSpec` and its parts.

Their component slots are typed :class:`~modkit.core.config.ComponentConfig`; :func:`modkit.spec.unions.spec_model`
copies them with each slot a discriminated union over the live registry's components. :class:`LayerSpec` is one
layer after overrides, :class:`SpecContext` the model-wide sizes a component's ``check(ctx)`` reads.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Annotated, Any, Iterable, Literal, Optional, Union

from pydantic import AliasChoices, ConfigDict, Field, PrivateAttr, field_validator, model_serializer, model_validator

from modkit.core.config import SLOT_KEY, STRICT, ComponentConfig, Slot, StrictModel
from modkit.core.limits import (
    MAX_INIT_STD,
    MAX_LAYERS,
    MAX_MULTIPLIER,
    MAX_OVERRIDES,
    MAX_SOFTCAP,
    MIN_SOFTCAP,
    DModel,
    LayerCount,
    Multiplier,
    SeqLen,
    VocabSize,
)
from modkit.core.registry import Registry
from modkit.core.parametrization import Parametrization

SCHEMA_VERSION = 1


class _Strict(StrictModel):
    model_config = ConfigDict(**{**STRICT, "populate_by_name": True})


LayerIndex = Annotated[int, Field(ge=0, lt=MAX_LAYERS)]


class LayerRange(_Strict):
    """A Python-style slice of layer indices: ``start``, ``start + step``, ... below ``stop`` (``stop > start``)."""

    start: LayerIndex = Field(0, description="first layer index (0-based)")
    stop: Optional[Annotated[int, Field(gt=0, le=MAX_LAYERS)]] = Field(
        None, description="exclusive end; null means n_layers"
    )
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

    embedding: float = Field(
        0.0, ge=0.0, lt=1.0, description="dropout on the embeddings before the first block (GPT-2 embd_pdrop)"
    )
    attention: float = Field(
        0.0, ge=0.0, lt=1.0, description="dropout on the attention probabilities (GPT-2 attn_pdrop)"
    )
    residual: float = Field(
        0.0, ge=0.0, lt=1.0, description="dropout on each sublayer output before the residual add (GPT-2 resid_pdrop)"
    )


class MTPSpec(_Strict):
    """Multi-token prediction (DeepSeek-V3, arXiv:2412.19437 section 2.2): ``depth`` extra modules after the model,
    module ``k`` predicting the token ``k + 1`` positions after the next one from the previous depth's hidden state
    and the embedding of the token ``k`` ahead (:mod:`modkit.nn.mtp`). Each module's block has the components of the
    model's last layer; the token embedding and the head are the model's. The loss weight is training config
    (``mtp_loss_weight``); generation ignores the modules."""

    depth: Annotated[int, Field(ge=1, le=16)] = Field(
        1, description="number of chained MTP modules (DeepSeek-V3: 1); module k predicts the token k + 1 ahead"
    )


class AdapterSpec(_Strict):
    """A per-use low-rank adapter (LoRA, Hu et al. 2021, arXiv:2106.09685) on the linear layers of a shared block:
    each use ``u`` computes ``W x + b + scale · B_u (A_u x)`` with its own ``A_u [rank, in]`` and ``B_u [out, rank]``
    (``B_u`` starts at 0, so every use starts as the shared block), as Zamba2 gives each use of its shared block."""

    rank: Annotated[int, Field(ge=1, le=65536)] = Field(..., description="rank r of A [r, in] and B [out, r]")
    alpha: Optional[Annotated[float, Field(gt=0, le=MAX_MULTIPLIER)]] = Field(
        None, description="scale = alpha / rank (PEFT's lora_alpha); null: scale 1 (Zamba2's adapters)"
    )
    targets: Optional[Annotated[list[str], Field(min_length=1, max_length=64)]] = Field(
        None,
        description="names of the block's linear layers to adapt (their last path component: 'q_proj', 'w1'); "
        "null: every linear layer of the block",
    )
    fuse: Optional[Annotated[list[Annotated[list[str], Field(min_length=2, max_length=8)]], Field(max_length=16)]] = (
        Field(
            None,
            description="groups of adapted linear layers that read the same input and share one A per use (a LoRA on "
            "a fused projection: Zamba2's gate_up_proj adapter is one A and a B over [gate; up], so "
            "[['gate', 'up']]); each name must be among the targets. null: every layer its own A",
        )
    )

    @property
    def scale(self) -> float:
        """The adapter's multiplier: ``alpha / rank``, or 1."""
        return 1.0 if self.alpha is None else self.alpha / self.rank


LayerSelection = Union[Annotated[list[LayerIndex], Field(min_length=1, max_length=MAX_LAYERS)], LayerRange]


def _select(layers: LayerSelection, n_layers: int) -> list[int]:
    return layers.indices(n_layers) if isinstance(layers, LayerRange) else list(layers)


class BlockShare(_Strict):
    """One block's parameters used at several depths (Zamba2's shared attention block; Universal Transformers,
    Dehghani et al. 2018, arXiv:1807.03819; ALBERT's cross-layer sharing, arXiv:1909.11942).

    The first (lowest) layer listed owns the parameters; every other listed layer runs the same block with the same
    tensors (one parameter each, counted once, gradients summed over the uses), and keeps its own cache entries.
    The listed layers must have the same components (after overrides). With ``part`` only that module of each block
    is shared (Zamba2 shares its attention block, not the Mamba-2 layer beside it)."""

    layers: LayerSelection = Field(
        ..., description="the layers that run one block, at least two (0-based; a list or a range); the first owns it"
    )
    adapter: Optional[AdapterSpec] = Field(
        None, description="a low-rank adapter per use on the block's linear layers (Zamba2); null: none"
    )
    part: Optional[Annotated[str, Field(min_length=1, max_length=200, pattern=r"^[A-Za-z_][\w.]*$")]] = Field(
        None,
        description="the module inside each layer's block that the layers share, as a path ('attention.side': the side "
        "block of a side_input mixer, Zamba2's shared attention block); the rest of each block stays its own. null: "
        "the whole block",
    )

    def indices(self, n_layers: int) -> list[int]:
        """The sharing layers, ascending."""
        return sorted(set(_select(self.layers, n_layers)))


class KVShare(_Strict):
    """Layers whose attention reads the keys and values an earlier layer computed instead of computing their own
    (Gemma 3n's ``num_kv_shared_layers``; YOCO, Sun et al. 2024, arXiv:2405.05254): they keep no cache of their own
    and have no key/value projections; the source's cache is read in prefill and decode."""

    layers: LayerSelection = Field(..., description="the reading layers (0-based; a list or a range)")
    source: LayerIndex = Field(..., description="the layer whose keys and values they read; before every reader")

    def indices(self, n_layers: int) -> list[int]:
        """The reading layers, ascending."""
        return sorted(set(_select(self.layers, n_layers)))


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
        ...,
        validation_alias=AliasChoices("attention", "mixer"),
        description="token-mixing sublayer (written 'mixer' or 'attention': any attention or recurrent mixer), "
        "[batch, seq, d_model] -> same",
        json_schema_extra={SLOT_KEY: "mixer"},
    )
    ffn: Optional[ComponentConfig] = Slot(
        "ffn",
        description="position-wise sublayer, [batch, seq, d_model] -> same; null for a block without one (Mamba-2)",
    )
    norm: ComponentConfig = Slot(
        "norm", description="norm config instantiated by the placement wherever it puts a norm"
    )
    placement: ComponentConfig = Slot("placement", description="how norms, sublayers and residuals compose")


class LayerOverride(_MixerSlot):
    """Replace whole block slots (and the position scheme) for selected layers; later overrides win."""

    layers: Union[Annotated[list[LayerIndex], Field(min_length=1, max_length=MAX_LAYERS)], LayerRange] = Field(
        ..., description="layer indices (0-based; at least one), or a range {start, stop, step}"
    )
    attention: Optional[ComponentConfig] = Field(
        None,
        validation_alias=AliasChoices("attention", "mixer"),
        description="replacement token mixer (written 'mixer' or 'attention')",
        json_schema_extra={SLOT_KEY: "mixer"},
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
    overrides: list[LayerOverride] = Field(
        default_factory=list,
        max_length=MAX_OVERRIDES,
        description=f"per-layer replacements of block slots (at most {MAX_OVERRIDES:,}: twice the layer bound, far "
        "above one per layer of any published model; a longer list only slows validation down)",
    )
    stream: Optional[ComponentConfig] = Slot(
        "stream",
        default=None,
        description="the residual stream between blocks when it is more than one d_model-wide copy (hyper-"
        "connections: 'modkit list stream'); every layer's placement must declare the 'streams' capability; "
        "null: the plain residual stream [batch, seq, d_model]",
    )
    embedding_norm: Optional[ComponentConfig] = Slot(
        "norm", default=None, description="norm applied to the embeddings before the first block (BERT); null for none"
    )
    embedding_scale: Union[Multiplier, Literal["sqrt_d_model"], None] = Field(
        None,
        description="multiply token embeddings by this (Gemma: 'sqrt_d_model', rounded to the model dtype); at most "
        f"{MAX_MULTIPLIER:g}, far above published values (Granite 12, Gemma's sqrt(d_model) 73), so the "
        "embeddings stay finite",
    )
    final_norm: Optional[ComponentConfig] = Slot(
        "norm", default=None, description="norm after the last block; null for none"
    )
    tie_embeddings: bool = Field(False, description="LM head shares the token-embedding matrix (one parameter)")
    lm_head_bias: bool = Field(False, description="LM head has a bias vector [vocab_size]")
    logit_scale: Optional[Multiplier] = Field(
        None,
        description="multiply the logits by this before any soft-cap (Cohere's logit_scale; Granite's "
        f"1 / logits_scaling); null for 1. At most {MAX_MULTIPLIER:g}: published models use 0.03-1, and a larger "
        "scale only pushes the logits toward float overflow",
    )
    final_logit_softcap: Optional[float] = Field(
        None,
        ge=MIN_SOFTCAP,
        le=MAX_SOFTCAP,
        description="logits = cap * tanh(logits / cap) (Gemma 2: 30); null for none. Within "
        f"[{MIN_SOFTCAP:g}, {MAX_SOFTCAP:g}]: a smaller cap overflows logits / cap in float16, and a larger one "
        "caps nothing (cap · tanh(x / cap) is x) while cap itself nears float16's range",
    )
    mtp: Optional[MTPSpec] = Field(
        None,
        description='multi-token prediction: {"depth": D} extra modules trained beside the next-token head '
        "(DeepSeek-V3); null: none",
    )
    share: list[BlockShare] = Field(
        default_factory=list,
        max_length=MAX_LAYERS,
        description='blocks whose parameters serve several layers: [{"layers": [2, 5, 8], "adapter": {"rank": 8}}] '
        "(the first layer listed owns them; Zamba2, Universal Transformers); empty: every layer its own",
    )
    kv_sharing: list[KVShare] = Field(
        default_factory=list,
        max_length=MAX_LAYERS,
        description='layers whose attention reads an earlier layer\'s keys and values: [{"layers": [6, 7], '
        '"source": 5}] (Gemma 3n, YOCO); empty: every layer computes its own',
    )
    init_std: float = Field(
        0.02,
        gt=0,
        le=MAX_INIT_STD,
        description=f"standard deviation of the normal init of weight matrices; at most {MAX_INIT_STD:g} (published "
        "models use 0.006-0.02; a larger std makes activations, then logits, overflow)",
    )
    dropout: DropoutSpec = Field(
        default_factory=DropoutSpec,
        description="dropout probabilities (embedding, attention, residual); all 0 by default",
    )
    parametrization: Optional[Parametrization] = Field(
        None,
        description='how init, learning rates, logits and attention scale with width: null or {"type": "sp"} for '
        'standard parametrization; {"type": "mup", "base_d_model": N} for muP (modkit.core.parametrization)',
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
                raise ValueError(
                    f"overrides[{i}] replaces nothing; give at least one of mixer (or attention), ffn, norm, "
                    "placement, position"
                )
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
            if self._selects(o, index):
                for k in parts:
                    v = getattr(o, k)
                    if v is not None:
                        parts[k] = v
        return LayerSpec(index=index, **parts)

    def _selects(self, override: "LayerOverride", index: int) -> bool:
        """Whether ``override`` applies to layer ``index``."""
        layers = override.layers
        return layers.selects(index, self.n_layers) if isinstance(layers, LayerRange) else index in layers

    def layer_source(self, index: int, slot: str) -> str:
        """The spec field that sets ``slot`` (attention, ffn, norm, placement, position) of layer ``index``:
        ``overrides[k].slot`` for the last override that sets it there, else ``block.slot`` (``position``).

        Raises:
            IndexError: ``index`` outside ``[0, n_layers)``.
        """
        if not 0 <= index < self.n_layers:
            raise IndexError(f"layer {index} out of range for n_layers = {self.n_layers}")
        where = "position" if slot == "position" else f"block.{slot}"
        for k, o in enumerate(self.overrides):
            if getattr(o, slot, None) is not None and self._selects(o, index):
                where = f"overrides[{k}].{slot}"
        return where

    def to_json(self, *, indent: int | None = 2) -> str:
        """Serialise to spec JSON (round-trips through :func:`load_spec`)."""
        return json.dumps(self.to_dict(), indent=indent)

    def to_dict(self) -> dict:
        """Serialise to a plain dict (aliases used, ``$schema`` omitted when unset)."""
        data = self.model_dump(mode="json", by_alias=True)
        if data.get("$schema") is None:
            data.pop("$schema", None)
        if data.get("stream") is None:  # the plain residual stream: as specs were written before streams
            data.pop("stream", None)
        if data.get("mtp") is None:  # no extra heads: the spec as it was written before multi-token prediction
            data.pop("mtp", None)
        for name in ("share", "kv_sharing"):  # no sharing: the spec as it was written before sharing existed
            if not data.get(name):
                data.pop(name, None)
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
    for name in ("embedding_norm", "final_norm", "stream"):
        yield from walk(getattr(spec, name), name)
    for i, o in enumerate(spec.overrides):
        for slot in ("attention", "ffn", "norm", "placement", "position"):
            yield from walk(getattr(o, slot), f"overrides[{i}].{slot_path(o, slot)}")

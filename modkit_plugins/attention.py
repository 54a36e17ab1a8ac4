"""Multi-head attention with grouped key/value heads: ``mha``, ``mqa`` and ``gqa`` are one module.

``[batch, seq, d_model] -> [batch, seq, d_model]``. MHA is GQA with ``n_kv_heads = n_heads``, MQA with
``n_kv_heads = 1``. Options: ``head_dim`` independent of ``d_model / n_heads``; separate q/k/v/output bias
flags; QK-norm per head (Qwen3, Gemma 3), per head with a weight of each head's own (Cohere) or over the full
projection width (OLMo 2), any norm component (Llama 4's weightless ``l2norm`` too); sliding window; chunked local
attention (Llama 4's ``attention_chunk_size``); attention sinks (gpt-oss); attention temperature tuning of the
queries by position (Llama 4's NoPE layers); causal or bidirectional; softmax scale override (Granite's
``attention_multiplier``); tanh soft-capping of the scores (Gemma 2); an output gate, the attention output times
``sigmoid`` of a second query-width projection before ``o_proj`` (Qwen3-Next's gated attention), or of one gate per
head (``output_gate_scope: head``, LFM3's ``g_proj``); ``sdpa`` (default)
or ``eager`` backend; dropout on the attention probabilities in training mode (the spec's ``dropout.attention``,
GPT-2's ``attn_pdrop``).

How many past positions a query can see is :attr:`Attention.attention_span` (the sliding window, the chunk size,
the smaller of the two, or ``None`` for unbounded): the KV cache keeps a ring of that many slots for the layer.

The mask, the dead-row guard and the cache update are modkit's public attention helpers (:mod:`modkit.nn.attention`,
the same a third-party attention uses): the mask is built from absolute positions, so it is aligned bottom-right
whenever the query length differs from the key length (cached decode, chunked prefill), and left padding is
honoured; with a KV cache (:mod:`modkit.nn.cache`) the new keys are stored and attention runs over every key handed
back (unwritten slots come back invalid and are masked like padding); rows with no visible key (padding queries)
output exactly 0 instead of NaN (pytorch #103749).

References: Vaswani et al. 2017 (arXiv:1706.03762); MQA, Shazeer 2019 (arXiv:1911.02150); GQA, Ainslie
et al. 2023 (arXiv:2305.13245); logit soft-capping, Gemma Team 2024, Gemma 2 (arXiv:2408.00118) §2; attention sinks,
Xiao et al. 2024, Efficient Streaming Language Models with Attention Sinks (arXiv:2309.17453), in the learned-logit
form of OpenAI 2025, gpt-oss-120b & gpt-oss-20b Model Card (arXiv:2508.10925) and transformers ``GptOssAttention``;
the output gate, Qiu et al. 2025, Gated Attention for Large Language Models (arXiv:2505.06708), as in transformers
``Qwen3NextAttention``; chunked attention and temperature tuning, Meta 2025, Llama 4 (transformers ``Llama4TextAttention``; the temperature
follows Nakanishi 2025, Scalable-Softmax Is Superior for Attention, arXiv:2501.19399); layout of the module follows
torchtune ``modules/attention.py``.
"""

from __future__ import annotations

from typing import Literal, Optional

import torch
from pydantic import Field, ValidationInfo, field_validator
from torch import Tensor, nn

from modkit.plugin import (
    AttentionInputs,
    BuildContext,
    CacheEntry,
    CacheSpec,
    Component,
    ComponentConfig,
    HeadCount,
    HeadDim,
    Multiplier,
    hookimpl,
    is_plain_causal,
    masked_attention,
    MAX_MULTIPLIER,
    MAX_SEQ_LEN,
    MAX_SOFTCAP,
    MIN_SOFTCAP,
    MIN_SOFTMAX_SCALE,
    SoftmaxScale,
    position_bias,
    PositionGeometry,
    prepare_mask,
    SeqLen,
    Slot,
    StrictModel,
    KVReader,
)

from .attention_cost import flops as _flops, param_count as _param_count


class TemperatureTuning(StrictModel):
    """Llama 4's attention temperature tuning: queries at position ``p`` are multiplied by
    ``log(floor((p + 1) / floor_scale) + 1) · attn_scale + 1`` (1 for the first ``floor_scale - 1`` positions, then
    growing with the log of the position), so attention stays sharp at long context on layers without RoPE."""

    floor_scale: float = Field(
        8192.0,
        ge=1,
        le=MAX_SEQ_LEN,
        description="positions per step of the floor (Llama 4 floor_scale: 8192); a count of positions, so at least 1 "
        "(below, (p + 1) / floor_scale overflows float32) and at most the longest sequence modkit allows",
    )
    attn_scale: float = Field(
        0.1,
        ge=0,
        le=10,
        description="strength: the multiplier of the log (Llama 4 attn_scale: 0.1); at most 10, which already "
        "multiplies the queries by about 190 at 2**27 positions",
    )


class AttentionConfig(ComponentConfig):
    """Config shared by ``mha``, ``mqa`` and ``gqa``."""

    type: Literal["mha", "mqa", "gqa"]
    n_heads: HeadCount = Field(..., description="number of query heads")
    n_kv_heads: Optional[HeadCount] = Field(
        None,
        validate_default=True,
        description="number of key/value heads; must divide n_heads. Default: n_heads (mha), 1 (mqa); required for gqa",
    )
    head_dim: Optional[HeadDim] = Field(
        None, description="width of one head; default d_model / n_heads (which must then be an integer)"
    )
    v_head_dim: Optional[HeadDim] = Field(
        None,
        description="width of one value head, narrower or wider than the query/key head (MiMo-V2-Flash: 128 beside "
        "192); sizes v_proj, the cache's values and o_proj's input. Default head_dim",
    )
    value_scale: Multiplier = Field(
        1.0, description="multiplier of the values (MiMo-V2-Flash's attention_value_scale, 0.707); 1 for none"
    )
    v_norm_eps: Optional[float] = Field(
        None, gt=0, le=0.1, description="RMS-normalise each value head, without a gain, with this epsilon (Gemma 3n)"
    )
    q_bias: bool = Field(False, description="bias on the query projection")
    k_bias: bool = Field(False, description="bias on the key projection")
    v_bias: bool = Field(False, description="bias on the value projection")
    o_bias: bool = Field(False, description="bias on the output projection")
    qk_norm: Optional[ComponentConfig] = Slot(
        "norm", default=None, description="norm applied to queries and keys before the position scheme; null for none"
    )
    qk_norm_scope: Literal["head", "each_head", "full"] = Field(
        "head",
        description="'head': normalise each head over head_dim, one weight shared by the heads (Qwen3, Gemma 3); "
        "'each_head': the same statistics with a weight of each head's own, [n_heads, head_dim] (Cohere; the norm must "
        "declare the groups capability); 'full': over the whole projection (OLMo 2)",
    )
    qk_norm_after_position: bool = Field(
        False,
        description="apply qk_norm after the position scheme has rotated q and k, not before (Hunyuan's "
        "query_layernorm / key_layernorm); needs qk_norm with qk_norm_scope 'head'",
    )
    sliding_window: Optional[SeqLen] = Field(
        None,
        description="each query sees only keys with 0 <= q_pos - k_pos < sliding_window; null for global attention",
    )
    attention_chunk_size: Optional[SeqLen] = Field(
        None,
        description="chunked local attention (Llama 4): each query sees only keys of its own chunk of "
        "attention_chunk_size positions, q_pos // attention_chunk_size = k_pos // attention_chunk_size (with the causal "
        "mask and any sliding window); the KV cache keeps a ring of that many slots. null for none",
    )
    sinks: bool = Field(
        False,
        description="attention sinks (gpt-oss): a learned logit per query head, parameter sinks [n_heads], joins "
        "the softmax denominator and takes probability mass without contributing a value",
    )
    temperature_tuning: Optional[TemperatureTuning] = Field(
        None,
        description="multiply the queries at position p by log(floor((p + 1) / floor_scale) + 1) · attn_scale + 1 "
        "(Llama 4's attn_temperature_tuning, on its layers without RoPE); null for none",
    )
    output_gate: bool = Field(
        False,
        description="gated attention (Qwen3-Next): the merged head outputs [batch, seq, n_heads · head_dim] are "
        "multiplied element-wise by sigmoid(gate_proj(x)) before o_proj; gate_proj is a second query-width projection "
        "[n_heads · head_dim, d_model], with a bias when q_bias (Qwen3-Next fuses it into q_proj). false: no gate",
    )
    output_gate_scope: Literal["element", "head"] = Field(
        "element",
        description="what one gate value scales, with output_gate. 'element' (Qwen3-Next): gate_proj is "
        "[n_heads · v_head_dim, d_model], one gate per feature; 'head' (LFM3's g_proj): gate_proj is [n_heads, "
        "d_model], one sigmoid per head scaling all v_head_dim features of that head's output",
    )
    gate_bias: Optional[bool] = Field(
        None,
        description="bias on gate_proj, with output_gate; null: q_bias (Qwen3-Next fuses the gate into q_proj; "
        "LFM3's g_proj has none)",
    )
    clip_qkv: Optional[float] = Field(
        None,
        gt=0,
        le=1e6,
        allow_inf_nan=False,
        description="clamp the q, k and v projections (before any QK-norm and the position scheme) to [-clip_qkv, "
        "clip_qkv] (DBRX's clip_qkv: 8; OLMo's); null for none",
    )
    causal: bool = Field(True, description="true: decoder (causal) mask; false: bidirectional (encoder)")
    softmax_scale: Optional[SoftmaxScale] = Field(
        None,
        description=f"multiplier of q·k; default 1/sqrt(head_dim). Between {MIN_SOFTMAX_SCALE:g} and "
        f"{MAX_MULTIPLIER:g}: published models use 1/sqrt(head_dim) or 1/head_dim (μP), between 1e-3 and 1; a larger "
        "scale only pushes the scores toward overflow, a smaller one underflows them (1e-300 made the logits "
        "non-finite)",
    )
    logit_softcap: Optional[float] = Field(
        None,
        ge=MIN_SOFTCAP,
        le=MAX_SOFTCAP,
        description="scores = cap · tanh(scores / cap) before the mask (Gemma 2's attn_logit_softcapping: 50); "
        "null for none. SDPA has no softcap, so a capped layer runs the eager float32 math. Within "
        f"[{MIN_SOFTCAP:g}, {MAX_SOFTCAP:g}]: a smaller cap overflows scores / cap, a larger one caps nothing",
    )
    backend: Literal["sdpa", "eager"] = Field(
        "sdpa", description="'sdpa': torch scaled_dot_product_attention; 'eager': explicit softmax (can return weights)"
    )

    @field_validator("qk_norm_after_position")
    @classmethod
    def _norm_after(cls, after: bool, info: ValidationInfo) -> bool:
        if after and info.data.get("qk_norm", 0) is None:
            raise ValueError("is true, but qk_norm is null: give qk_norm a norm spec or set it false")
        if after and info.data.get("qk_norm_scope", "head") != "head":
            raise ValueError(
                f"is true, which needs qk_norm_scope 'head' (one norm over each head after the rotation), got "
                f"{info.data.get('qk_norm_scope')!r}"
            )
        return after

    @field_validator("output_gate_scope")
    @classmethod
    def _gate_scope(cls, scope: str, info: ValidationInfo) -> str:
        if scope != "element" and not info.data.get("output_gate", True):
            raise ValueError(f"is {scope!r}, but output_gate is false: set output_gate true or leave the scope out")
        return scope

    @field_validator("gate_bias")
    @classmethod
    def _gate_bias(cls, bias: Optional[bool], info: ValidationInfo) -> Optional[bool]:
        if bias is not None and not info.data.get("output_gate", True):
            raise ValueError(f"is {bias}, but output_gate is false: set output_gate true or leave gate_bias out")
        return bias

    @property
    def gate_has_bias(self) -> bool:
        """Whether ``gate_proj`` has a bias: ``gate_bias``, else ``q_bias``."""
        return self.q_bias if self.gate_bias is None else self.gate_bias

    @field_validator("n_kv_heads")
    @classmethod
    def _kv_heads(cls, kv: Optional[int], info: ValidationInfo) -> Optional[int]:
        kind, n_heads = info.data.get("type"), info.data.get("n_heads")
        if kind == "gqa" and kv is None:
            raise ValueError("gqa needs n_kv_heads (use mha for n_kv_heads = n_heads, mqa for 1)")
        if n_heads is None:  # n_heads itself is invalid; that error is reported on its own
            return kv
        if kind == "mha" and kv is not None and kv != n_heads:
            raise ValueError(f"mha has n_kv_heads = n_heads = {n_heads}, got n_kv_heads = {kv}; use gqa")
        if kind == "mqa" and kv is not None and kv != 1:
            raise ValueError(f"mqa has n_kv_heads = 1, got n_kv_heads = {kv}; use gqa")
        if kv is not None and (kv > n_heads or n_heads % kv):
            fits = ", ".join(str(d) for d in range(1, n_heads + 1) if n_heads % d == 0)
            how = "exceeds" if kv > n_heads else "does not divide"
            raise ValueError(f"n_kv_heads = {kv} {how} n_heads = {n_heads}; use a divisor of n_heads: {fits}")
        return kv

    @property
    def kv_heads(self) -> int:
        """The effective number of key/value heads."""
        if self.n_kv_heads is not None:
            return self.n_kv_heads
        return 1 if self.type == "mqa" else self.n_heads

    def resolved_head_dim(self, d_model: int) -> int:
        """``head_dim``, or ``d_model // n_heads`` when not given."""
        return self.head_dim if self.head_dim is not None else d_model // self.n_heads

    def value_width(self, d_model: int) -> int:
        """The width of one value head: ``v_head_dim``, else the head width."""
        return self.v_head_dim if self.v_head_dim is not None else self.resolved_head_dim(d_model)

    def position_geometry(self, ctx) -> PositionGeometry:
        """The position scheme acts on every query head and key/value head at full ``head_dim``."""
        return PositionGeometry(self.n_heads, self.resolved_head_dim(ctx.d_model), self.kv_heads)

    def check(self, ctx) -> list[tuple[str, str]]:
        """Cross-field check against the model: a derived head_dim needs n_heads to divide d_model; a QK-norm with a
        weight per head (``each_head``) needs a norm that declares the ``groups`` capability."""
        errors = []
        if self.head_dim is None and ctx.d_model % self.n_heads:
            errors.append(
                (
                    "n_heads",
                    f"d_model = {ctx.d_model} is not divisible by n_heads = {self.n_heads}; set head_dim explicitly or change n_heads",
                )
            )
        if self.qk_norm is not None and self.qk_norm_scope == "each_head":
            entry = ctx.registry.entry_for_config(self.qk_norm, "norm")
            if not entry.capabilities.get("groups"):
                errors.append(
                    (
                        "qk_norm_scope",
                        f"'each_head' gives every head a weight of its own, but norm type "
                        f"{entry.type!r} ({entry.provider}) does not declare the 'groups' capability (parameters per "
                        "group); use a norm that does (layernorm, rmsnorm) or qk_norm_scope 'head'",
                    )
                )
        return errors


def _merge_heads(out: Tensor) -> Tensor:
    """``[batch, n_heads, seq, head_dim] -> [batch, seq, n_heads · head_dim]``."""
    b, h, s, d = out.shape
    return out.transpose(1, 2).reshape(b, s, h * d)


class Attention(KVReader, nn.Module):
    """Grouped-query attention. ``forward(x [batch, seq, d_model], inputs) -> [batch, seq, d_model]``.

    Attributes ``n_heads``, ``n_kv_heads``, ``head_dim``, ``sliding_window`` and ``attention_chunk_size`` describe the
    geometry; the KV cache stores ``n_kv_heads`` heads in :attr:`attention_span` slots (a ring) or all of them.
    ``sinks`` is the ``[n_heads]`` sink-logit parameter, or ``None``; ``gate_proj`` the output gate's projection
    (``output_gate``), or ``None``. A layer of spec ``kv_sharing`` reads another's keys and values (:class:`KVReader`).
    """

    #: parameter roles (:mod:`modkit.core.roles`): the projections are ``nn.Linear`` (hidden, bias) and a QK-norm declares
    #: its own; the sink logits are one scalar per head, a ``vector``: no weight decay, AdamW under Muon, width-
    #: independent under muP (gpt-oss trains them without decay)
    param_roles = {"sinks": "vector"}

    def __init__(self, cfg: AttentionConfig, ctx: BuildContext):
        super().__init__()
        d = ctx.d_model
        self.n_heads, self.n_kv_heads = cfg.n_heads, cfg.kv_heads
        self.head_dim = cfg.resolved_head_dim(d)
        self.v_head_dim, self.value_scale, self.v_norm_eps = cfg.value_width(d), cfg.value_scale, cfg.v_norm_eps
        self.sliding_window = cfg.sliding_window
        self.attention_chunk_size = cfg.attention_chunk_size
        self.causal = cfg.causal
        self.backend = cfg.backend
        self.attention_dropout = ctx.attention_dropout  # applied to the probabilities in training mode only
        # 1/sqrt(head_dim) under standard parametrization, the 1/head_dim form under muP (BuildContext.attention_scale)
        self.scale = cfg.softmax_scale if cfg.softmax_scale is not None else ctx.attention_scale(self.head_dim)
        self.logit_softcap = cfg.logit_softcap
        q_width, kv_width = self.n_heads * self.head_dim, self.n_kv_heads * self.head_dim
        o_width = self.n_heads * self.v_head_dim  # the merged value heads
        d_in = ctx.d_in or d  # a wider input (BuildContext.d_in: Zamba2's [stream, embeddings]); the output is d
        self.q_proj = nn.Linear(d_in, q_width, bias=cfg.q_bias)
        self.k_proj = nn.Linear(d_in, kv_width, bias=cfg.k_bias)
        self.v_proj = nn.Linear(d_in, self.n_kv_heads * self.v_head_dim, bias=cfg.v_bias)
        self.o_proj = nn.Linear(o_width, d, bias=cfg.o_bias)
        self.gate_per_head = cfg.output_gate_scope == "head"  # LFM3: one gate per head, else one per feature
        g_width = self.n_heads if self.gate_per_head else o_width
        self.gate_proj = nn.Linear(d_in, g_width, bias=cfg.gate_has_bias) if cfg.output_gate else None
        self.qk_norm_scope = cfg.qk_norm_scope
        self.qk_norm_after = cfg.qk_norm_after_position
        self.clip_qkv = cfg.clip_qkv
        if cfg.qk_norm is None:
            self.q_norm = self.k_norm = None
        elif cfg.qk_norm_scope == "full":
            self.q_norm, self.k_norm = ctx.build(cfg.qk_norm, dim=q_width), ctx.build(cfg.qk_norm, dim=kv_width)
        else:  # 'each_head': statistics per head as for 'head', and one weight per head (a [n_heads, head_dim] gain)
            each = cfg.qk_norm_scope == "each_head"
            self.q_norm = ctx.build(cfg.qk_norm, dim=self.head_dim, groups=self.n_heads if each else None)
            self.k_norm = ctx.build(cfg.qk_norm, dim=self.head_dim, groups=self.n_kv_heads if each else None)
        self.sinks = nn.Parameter(torch.empty(self.n_heads)) if cfg.sinks else None
        tuning = cfg.temperature_tuning
        self.floor_scale = tuning.floor_scale if tuning is not None else None
        self.attn_scale = tuning.attn_scale if tuning is not None else None

    @property
    def attention_span(self) -> Optional[int]:
        """How many of the latest positions (its own included) a query can attend to: ``sliding_window``,
        ``attention_chunk_size`` or the smaller of the two; ``None`` when unbounded. The KV cache keeps a ring of
        this many slots for the layer (:meth:`modkit.Model.new_cache`)."""
        spans = [n for n in (self.sliding_window, self.attention_chunk_size) if n is not None]
        return min(spans) if spans else None

    def init_weights(self, init) -> None:
        """Draw the sink logits N(0, init_std) (transformers' gpt-oss init); the projections are ``nn.Linear``
        children initialised by the model's rule."""
        if self.sinks is not None:
            init.normal_(self.sinks)

    def _tune_temperature(self, q: Tensor, positions: Tensor) -> Tensor:
        """``q [b, h, s, d]`` times ``log(floor((p + 1) / floor_scale) + 1) · attn_scale + 1`` of each token's position.

        Computed in float32 as transformers' ``Llama4TextAttention`` does. The positions are the tokens' own (those
        RoPE would use), so a left-padded row scales its tokens as the unpadded sequence would; transformers uses the
        cache slot index there, which counts the padding.
        """
        pos = positions.to(torch.float32)
        scale = torch.log1p(torch.floor((pos + 1.0) / self.floor_scale)) * self.attn_scale + 1.0  # [b, s]
        out = q * scale[:, None, :, None]
        return out if out.dtype == q.dtype else out.to(q.dtype)

    def cache_spec(self) -> CacheSpec:
        """Keys and values ``[batch, n_kv_heads, slots, head_dim]`` each; a ring of ``attention_span`` slots (the
        sliding window or the attention chunk) when set. Nothing when it reads another layer's (:meth:`read_kv_from`)."""
        if self.reads_kv:
            return CacheSpec((), self.attention_span)
        if self.v_head_dim == self.head_dim:
            return CacheSpec.kv(self.n_kv_heads, self.head_dim, self.attention_span)
        k, v = ((name, (self.n_kv_heads, w)) for name, w in (("k", self.head_dim), ("v", self.v_head_dim)))
        return CacheSpec((CacheEntry(*k, slot_axis=2), CacheEntry(*v, slot_axis=2)), self.attention_span)

    def head_layout(self) -> dict[str, tuple[int, int]]:
        """``{projection: (heads, width per head)}`` of the projections whose outputs split into heads."""
        layout = {"q_proj": (self.n_heads, self.head_dim)}
        if not self.reads_kv:
            layout.update(k_proj=(self.n_kv_heads, self.head_dim), v_proj=(self.n_kv_heads, self.v_head_dim))
        if self.gate_proj is not None:
            layout["gate_proj"] = (self.n_heads, 1 if self.gate_per_head else self.v_head_dim)
        return layout

    def _output(self, out: Tensor, x: Tensor) -> Tensor:
        """``o_proj`` of the merged heads ``out [batch, n_heads, seq, head_dim]``, gated by ``sigmoid(gate_proj(x))``
        first with ``output_gate`` (``output_gate_scope: head``: ``gate [batch, seq, n_heads]`` scales each head)."""
        if self.gate_proj is not None and self.gate_per_head:
            return self.o_proj(_merge_heads(out * torch.sigmoid(self.gate_proj(x)).transpose(1, 2).unsqueeze(-1)))
        merged = _merge_heads(out)
        if self.gate_proj is not None:
            merged = merged * torch.sigmoid(self.gate_proj(x))
        return self.o_proj(merged)

    def _project(self, x: Tensor, inputs: AttentionInputs) -> tuple[Tensor, Optional[Tensor], Optional[Tensor]]:
        """Rotated q, k and v ``[batch, heads, seq, head_dim]``; k and v ``None`` for a reader (:meth:`read_kv_from`)."""
        own = not self.reads_kv  # a reader's stand-in keys are its queries (with q's norm), dropped at the end
        k_norm = self.k_norm if own else self.q_norm
        q, k, v = self.q_proj(x), self.k_proj(x) if own else None, self.v_proj(x) if own else None
        if self.clip_qkv is not None:  # DBRX: the fused projection's output clamped
            q, k, v = (t.clamp(-self.clip_qkv, self.clip_qkv) if t is not None else None for t in (q, k, v))
        k = k if own else q
        if self.q_norm is not None and self.qk_norm_scope == "full":
            q, k = self.q_norm(q), k_norm(k)
        b, s, _ = x.shape  # [b, s, h·d] -> [b, h, s, d] (plain views: einops costs ~20 µs a call in a decode step)
        q = q.view(b, s, self.n_heads, self.head_dim)
        k = k.view(b, s, self.n_kv_heads if own else self.n_heads, self.head_dim)
        if (
            self.q_norm is not None and self.qk_norm_scope == "each_head"
        ):  # per-head weights [heads, d] on [b, s, heads, d]
            q, k = self.q_norm(q), k_norm(k)
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        v = v.view(b, s, self.n_kv_heads, self.v_head_dim).transpose(1, 2) if own else None
        if own and self.value_scale != 1.0:  # MiMo-V2-Flash: the values (and so the cached values) scaled
            v = v * self.value_scale
        if own and self.v_norm_eps is not None:  # Gemma 3n's v_norm: RMS per value head, no gain, in float32
            v = nn.functional.rms_norm(v.float(), (self.v_head_dim,), eps=self.v_norm_eps).to(v.dtype)
        if self.q_norm is not None and self.qk_norm_scope == "head" and not self.qk_norm_after:
            q, k = self.q_norm(q), k_norm(k)
        if inputs.position is not None:
            q, k = inputs.position.rotate(q, k, inputs.positions)
        if self.q_norm is not None and self.qk_norm_after:  # Hunyuan: normalise the rotated heads
            q, k = self.q_norm(q), k_norm(k)
        k = k if own else None
        if self.floor_scale is not None:
            q = self._tune_temperature(q, inputs.positions)
        return q, k, v

    def forward(self, x: Tensor, inputs: AttentionInputs) -> Tensor:
        """Attend. ``x [batch, seq, d_model]`` → ``[batch, seq, d_model]``; updates ``inputs.cache`` if given."""
        out, _ = self._attend(x, inputs, need_weights=False)
        return out

    def forward_with_weights(self, x: Tensor, inputs: AttentionInputs) -> tuple[Tensor, Tensor]:
        """Like :meth:`forward`, also returning the attention weights ``[batch, n_heads, q_len, kv_len]`` (eager math)."""
        return self._attend(x, inputs, need_weights=True)

    def _attend(self, x: Tensor, inputs: AttentionInputs, need_weights: bool) -> tuple[Tensor, Optional[Tensor]]:
        q, k, v = self._project(x, inputs)
        dropout_p = self.attention_dropout if self.training else 0.0
        k, v, k_pos, k_valid = self.keys_values(inputs, k, v)  # stored; every key handed back (or a source's)
        bias = position_bias(inputs, k_pos, self.n_heads)
        simple = (
            self.causal
            and is_plain_causal(inputs, k_pos, k_valid, bias)
            and self.sliding_window is None
            and self.attention_chunk_size is None
            and self.sinks is None
            and not need_weights
            and self.backend == "sdpa"
            and self.logit_softcap is None
        )
        if simple:  # causal self-attention of one fresh sequence (no cache, or an empty one): SDPA's fastest kernel
            out = nn.functional.scaled_dot_product_attention(
                q,
                k,
                v,
                is_causal=True,
                dropout_p=dropout_p,
                scale=self.scale,
                enable_gqa=self.n_kv_heads != self.n_heads,
            )
            return self._output(out, x), None
        prepared = prepare_mask(
            inputs,
            k_pos,
            k_valid,
            q.dtype,
            causal=self.causal,
            window=self.sliding_window,
            chunk=self.attention_chunk_size,
            mixer=self,
        )
        # an additive bias (ALiBi) in bf16/fp16 loses precision at long range: take the float32 eager path then
        eager = self.backend == "eager" or need_weights or (bias is not None and q.dtype != torch.float32)
        eager = eager or self.logit_softcap is not None  # SDPA has no softcap
        out, weights = masked_attention(
            q,
            k,
            v,
            prepared,
            bias,
            self.scale,
            eager=eager,
            dropout_p=dropout_p,
            softcap=self.logit_softcap,
            sinks=self.sinks,
        )
        return self._output(out, x), weights


#: Key formulas of the docs pages (pymdownx.arithmatex); one paragraph per type on the grouping of heads.
_MATH = r"""Per query head $h$, with $q_i$ the query at position $i$, $k_j, v_j$ the key and value of key position $j$ (of
the key/value head $g(h)$ that $h$ reads) and $d_h$ = head_dim:

$$s_{hij} = c \tanh\!\left(\frac{\alpha\, \tau_i\, q_i^\top k_j}{c}\right) + B_{hij} + M_{ij}, \qquad
o_{hi} = \frac{\sum_j e^{s_{hij}}\, v_j}{e^{z_h} + \sum_j e^{s_{hij}}}$$

With clip_qkv $\kappa$ the projections are clamped first: $q, k, v \leftarrow \min(\max(\cdot, -\kappa), \kappa)$.
$\alpha = 1/\sqrt{d_h}$ (softmax_scale when set); the soft cap $c$ = logit_softcap applies only when it is set
(otherwise the first term is $\alpha\, \tau_i\, q_i^\top k_j$); $B$ is the position scheme's bias (ALiBi, else 0) and
$M_{ij}$ is $0$ where query $i$ may see key $j$ (causal: $j \le i$; within sliding_window: $i - j <$ sliding_window;
within attention_chunk_size $C$: $\lfloor i / C \rfloor = \lfloor j / C \rfloor$; not padding) and $-\infty$
elsewhere. The sink logit $z_h$ (a parameter, with sinks) joins the denominator only: its term $e^{z_h}$ takes
probability mass and adds no value; without sinks it is absent ($e^{z_h} = 0$, a plain softmax). The temperature
$\tau_i = \ln\!\big(\lfloor (i + 1) / f \rfloor + 1\big)\, a + 1$ with $f$ = floor_scale and $a$ = attn_scale
(temperature_tuning; else $\tau_i = 1$). The heads are concatenated and projected by $W_O$; with output_gate the
concatenation is first multiplied element-wise by $\sigma(W_G\, x_i)$ (gated attention, $W_G$ as wide as the
concatenation; with output_gate_scope head $W_G$ has one row per head and $\sigma(W_G x_i)_h$ scales all of $o_{hi}$).
Query head $h$ reads key/value head $g(h) = \lfloor h \cdot n_{kv} / n_{heads} \rfloor$; the values $v_j$ have width
$d_v$ = v_head_dim (default $d_h$) and are multiplied by value_scale (1 by default); a KV cache holds
$n_{kv} (d_h + d_v)$ numbers per token and layer, in a ring of min(sliding_window, attention_chunk_size) slots when
either is set."""

_GROUPS = {
    "mha": r"Multi-head: $n_{kv} = n_{heads}$, every query head has its own keys and values.",
    "mqa": r"Multi-query: $n_{kv} = 1$, every query head reads the same key/value head.",
    "gqa": r"Grouped-query: $n_{kv}$ = n_kv_heads divides $n_{heads}$; groups of $n_{heads} / n_{kv}$ query heads "
    "share a key/value head.",
}


@hookimpl
def register_components(register) -> None:
    """Register ``mha``, ``mqa`` and ``gqa`` (one module)."""
    refs = {
        "mha": "Vaswani et al. 2017, Attention Is All You Need, arXiv:1706.03762",
        "mqa": "Shazeer 2019, Fast Transformer Decoding: One Write-Head is All You Need, arXiv:1911.02150",
        "gqa": "Ainslie et al. 2023, GQA: Training Generalized Multi-Query Transformer Models, arXiv:2305.13245",
    }
    names = {"mha": "multi-head", "mqa": "multi-query (one key/value head)", "gqa": "grouped-query"}
    for t in ("mha", "mqa", "gqa"):
        register(
            Component(
                kind="attention",
                type=t,
                config=AttentionConfig,
                factory=lambda cfg, ctx: Attention(cfg, ctx),
                description=f"{names[t].capitalize()} scaled dot-product attention with optional biases, QK-norm, "
                "sliding window, chunked local attention, attention sinks, query temperature tuning, an output gate and KV "
                "cache. "
                "[batch, seq, d_model] -> [batch, seq, d_model]; the cache holds [batch, n_kv_heads, seq, head_dim] keys "
                "and values (a ring of min(sliding_window, attention_chunk_size) slots when either is set).",
                reference=refs[t],
                capabilities={
                    "causal_safe": True,
                    "kv_cache": True,
                    "compile_safe": True,
                    "returns_weights": True,
                    "attention_dropout": True,
                    "document_mask": True,  # prepare_mask keeps each query inside its document
                    "kv_share": True,  # may read another layer's keys and values (KVReader.read_kv_from)
                    # reads an input wider than d_model when built with BuildContext.d_in (o_proj returns d_model)
                    "d_in": True,
                    # sequence sharded over ranks: update_cache all-gathers every rank's keys and values
                    "context_parallel": "allgather_kv",
                    # q/k/v by heads, o on its input; the QK-norm (when present) acts on this rank's heads, and the
                    # sink logits (when present) are sharded with the query heads
                    "tp_plan": {
                        "q_proj": "colwise",
                        "k_proj": "colwise",
                        "v_proj": "colwise",
                        "o_proj": "rowwise",
                        "gate_proj": "colwise",
                        "q_norm": "per_head",
                        "k_norm": "per_head",
                        "sinks": "heads",
                    },
                },
                param_count=_param_count,
                flops=_flops,
                example={"type": t, "n_heads": 4, **({"n_kv_heads": 2} if t == "gqa" else {})},
                math=_MATH + "\n\n" + _GROUPS[t],
            )
        )

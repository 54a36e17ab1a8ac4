"""Dense position-wise FFNs: ``mlp`` (one activation), ``swiglu`` and ``geglu`` (gated).

``[batch, seq, d_model] -> [batch, seq, d_model]``.

* ``mlp``:    ``down(act(up(x)))`` with act in gelu, gelu_tanh, relu, silu (GPT-2 uses gelu_tanh), or an activation
  component in ``activation_unit`` (``relu2``, ``xielu``: :mod:`modkit_plugins.activations`, registered here).
* ``swiglu``: ``down(silu(gate(x)) * up(x))`` (Llama, Mistral, Qwen, OLMo).
* ``geglu``:  ``down(gelu_tanh(gate(x)) * up(x))`` (Gemma's ``gelu_pytorch_tanh``; ``activation`` selects exact gelu).
  Both take μP-style multipliers, ``m_out · down(act(m_gate · gate(x)) * up(x))`` (``gate_multiplier``,
  ``output_multiplier``, 1 by default; Falcon-H1's ``mlp_multipliers``, transformers ``FalconH1MLP``).
* ``swiglu_clamped``: gpt-oss's form, ``down(g * sigmoid(alpha * g) * (u + 1))`` with ``g = min(gate(x), limit)``,
  ``u = clamp(up(x), -limit, limit)`` (``alpha`` 1.702, ``limit`` 7.0; :class:`ClampedGLU`).

In float16 the gated product ``act(gate(x)) * up(x)`` can exceed 65504 (the largest float16) while the FFN's output
is representable: plain float16 math (and transformers) then gives ``inf``, and ``inf`` or NaN downstream. The gated
FFNs therefore form the product in float32 and feed ``down`` a row-scaled copy: each row of the product is divided
by a power of two ``s >= 1`` chosen so that its largest entry stays below 2^14, ``down`` runs in float16 on that, and
the result is multiplied by ``s`` (bias added after). Powers of two scale exactly, so rows that need no scaling
(``s = 1``) get exactly the float16 rounding of the float32 product, one rounding fewer than plain float16. Other
dtypes take the plain path; the cost in float16 is measured in ``benchmarks/bench_features.py``.

Each also has a *grouped* form (``Component.grouped_factory``), ``n`` independent copies with stacked weights that an
``moe`` uses as its experts: ``forward(x [rows, d_model], offs [n] int32) -> [rows, d_model]`` runs copy ``g`` on the
contiguous rows ``[offs[g-1], offs[g])`` with one :func:`modkit.nn.grouped.grouped_mm` per projection. Stacked weights
are stored ``[n, in, out]`` (``x @ W``, the transpose of ``nn.Linear``'s ``[out, in]``), the layout the grouped GEMM
reads contiguously.

References: Vaswani et al. 2017 (arXiv:1706.03762); Shazeer 2020, GLU Variants Improve Transformer
(arXiv:2002.05202); OpenAI 2025, gpt-oss-120b & gpt-oss-20b Model Card (arXiv:2508.10925) and its reference
implementation's ``swiglu`` (transformers ``GptOssExperts._apply_gate``) for the clamped form.
"""

from __future__ import annotations

import math
from typing import Any, Literal, Optional

import torch
from pydantic import Field
from torch import Tensor, nn

from modkit.plugin import (
    BuildContext,
    Component,
    ComponentConfig,
    FFNWidth,
    grouped_mm,
    hookimpl,
    Init,
    MAX_MULTIPLIER,
    Multiplier,
    Slot,
    Workload,
)

from . import activations

ACTIVATIONS = {
    "gelu": lambda x: nn.functional.gelu(x),
    "gelu_tanh": lambda x: nn.functional.gelu(x, approximate="tanh"),
    "relu": nn.functional.relu,
    "silu": nn.functional.silu,
}


class MLPConfig(ComponentConfig):
    """Config of ``mlp``: ``down(act(up(x)))``."""

    type: Literal["mlp"] = "mlp"
    d_ff: FFNWidth = Field(..., description="hidden width")
    activation: Literal["gelu", "gelu_tanh", "relu", "silu"] = Field(
        "gelu", description="activation between the projections"
    )
    bias: bool = Field(True, description="biases on both projections")
    activation_unit: Optional[ComponentConfig] = Slot(
        "activation",
        default=None,
        description="an activation component (relu2, xielu, ...) used in place of activation, which is then not "
        "read; null: activation",
    )


class GatedConfig(ComponentConfig):
    """Config of ``swiglu`` / ``geglu``: ``down(act(gate(x)) * up(x))``."""

    type: Literal["swiglu", "geglu"]
    d_ff: FFNWidth = Field(..., description="hidden width")
    bias: bool = Field(False, description="biases on the three projections")
    activation: Literal["gelu", "gelu_tanh", "relu", "silu", None] = Field(
        None, description="gate activation; default silu for swiglu, gelu_tanh for geglu"
    )
    gate_multiplier: Multiplier = Field(
        1.0,
        description="multiplier of the gate projection before the activation, "
        "act(gate_multiplier · gate(x)) (Falcon-H1's mlp_multipliers[0], μP); 1 for none. At most "
        f"{MAX_MULTIPLIER:g}, far above published values (0.5-1), so activations stay finite",
    )
    output_multiplier: Multiplier = Field(
        1.0,
        description="multiplier of the FFN's output, output_multiplier · down(...) "
        f"(Falcon-H1's mlp_multipliers[1], μP); 1 for none. At most {MAX_MULTIPLIER:g}, far above published values "
        "(0.5-1), so activations stay finite",
    )
    activation_sparsity: float = Field(
        0.0,
        ge=0.0,
        lt=1.0,
        description="Gaussian top-k on the gate before the activation: relu(g - mean(g) - std(g) · Φ⁻¹(p)) over "
        "d_ff keeps about the top 1 - p of each token's gate entries (Gemma 3n's activation_sparsity_pattern: 0.95 "
        "on its first layers); 0 for none",
    )

    @property
    def act(self) -> str:
        """The effective gate activation."""
        return self.activation or ("silu" if self.type == "swiglu" else "gelu_tanh")


#: the largest clamp of ``swiglu_clamped`` (gpt-oss: 7): limit² = 65,536 is about float16's largest value
MAX_CLAMP_LIMIT = 256.0


class ClampedSwiGLUConfig(ComponentConfig):
    """Config of ``swiglu_clamped`` (gpt-oss): ``down(g * sigmoid(alpha * g) * (u + 1))``, ``g``, ``u`` the clamped
    gate and up projections."""

    type: Literal["swiglu_clamped"] = "swiglu_clamped"
    d_ff: FFNWidth = Field(..., description="hidden width")
    bias: bool = Field(False, description="biases on the three projections (gpt-oss's experts have them)")
    alpha: Multiplier = Field(
        1.702,
        description="slope of the gate's sigmoid, g * sigmoid(alpha * g) (gpt-oss swiglu_alpha: 1.702); at most "
        f"{MAX_MULTIPLIER:g}, far above it",
    )
    limit: float = Field(
        7.0,
        gt=0,
        le=MAX_CLAMP_LIMIT,
        allow_inf_nan=False,
        description="the gate is clamped to at most limit and the up projection to [-limit, limit] (gpt-oss swiglu_limit: "
        f"7); at most {MAX_CLAMP_LIMIT:g}, so the product of the two, up to limit², stays within float16's range",
    )
    up_offset: float = Field(
        1.0,
        ge=0,
        le=1,
        allow_inf_nan=False,
        description="added to the clamped up projection: (u + up_offset); gpt-oss 1, DeepSeek-V4 0 (its experts and "
        "shared MLP compute silu(min(gate, limit)) * clamp(up, -limit, limit): alpha 1, up_offset 0)",
    )


class ClampedGLU:
    """gpt-oss's clamped gated unit, as the two element-wise maps of a gated FFN (transformers ``GptOssExperts``).

    ``act(gate) = g * sigmoid(alpha * g)`` with ``g = gate.clamp(max=limit)`` and ``up_map(up) = up.clamp(-limit,
    limit) + up_offset`` (1; DeepSeek-V4's experts: 0, with alpha 1); the hidden activation is ``act(gate) * up_map(up)``. Shapes are preserved (``[..., d_ff]``).
    """

    def __init__(self, alpha: float, limit: float, up_offset: float = 1.0):
        self.alpha, self.limit, self.up_offset = float(alpha), float(limit), float(up_offset)

    def act(self, gate: Tensor) -> Tensor:
        """``g * sigmoid(alpha * g)``, ``g = min(gate, limit)``."""
        g = gate.clamp(max=self.limit)
        return g * torch.sigmoid(g * self.alpha)

    def up_map(self, up: Tensor) -> Tensor:
        """``clamp(up, -limit, limit) + up_offset`` (1 in gpt-oss, 0 in DeepSeek-V4)."""
        u = up.clamp(min=-self.limit, max=self.limit)
        return u + self.up_offset if self.up_offset else u


def _clamp(cfg: ClampedSwiGLUConfig) -> ClampedGLU:
    """The element-wise maps of a ``swiglu_clamped`` config."""
    return ClampedGLU(cfg.alpha, cfg.limit, cfg.up_offset)


def _identity(t: Tensor) -> Tensor:
    return t


#: float16 rows of the gated product are scaled to keep their largest entry below this (2^14, a quarter of the
#: float16 range: ``down``'s float32-accumulated sums of such values times weights of magnitude < 1 stay finite)
FP16_ROW_LIMIT = 2.0**14


def gated_product(act, gate: Tensor, up: Tensor) -> tuple[Tensor, Optional[Tensor]]:
    """``act(gate) * up`` and, in float16, the per-row scale that keeps it finite.

    Args:
        act: the gate activation. gate, up: ``[..., d_ff]`` projections (any float dtype).

    Returns:
        ``(h, scale)``: outside float16, ``(act(gate) * up, None)``. In float16, ``h = (act(gate) · up) / scale``
        computed in float32 and rounded to float16 once, with ``scale [..., 1]`` (float32) the smallest power of two
        ``>= 1`` that brings each row's largest ``|entry|`` to at most :data:`FP16_ROW_LIMIT`; the caller multiplies
        ``down(h)`` (without bias) by ``scale``.
    """
    if gate.dtype != torch.float16:
        return act(gate) * up, None
    h = act(gate.float()) * up.float()
    peak = h.abs().amax(-1, keepdim=True)
    scale = torch.exp2(torch.ceil(torch.log2(peak / FP16_ROW_LIMIT))).clamp_(min=1.0)
    scale = torch.where(torch.isfinite(scale), scale, torch.ones_like(scale))  # inf/NaN rows stay as they are
    return (h / scale).to(torch.float16), scale


def _down(linear: nn.Linear, h: Tensor, scale: Optional[Tensor]) -> Tensor:
    """``linear(h)``, or ``linear`` without bias times ``scale`` plus the bias (float16 rows scaled by :func:`gated_product`).

    A layer that is no ``nn.Linear`` (weight-only decoding's bfloat16 or int8 layer, :mod:`modkit.inference.weights`,
    which holds no float16 weight to multiply by) runs its own product on the rows in float32, its bias taken off."""
    if scale is None:
        return linear(h)
    if isinstance(linear, nn.Linear):
        out = nn.functional.linear(h, linear.weight)
    else:
        out = linear(h.float())
        out = out if linear.bias is None else out - linear.bias.float()
    out = out * scale
    out = out if linear.bias is None else out + linear.bias.float()
    return out.to(h.dtype)


class MLP(nn.Module):
    """Two-layer MLP. ``[batch, seq, d_model] -> [batch, seq, d_model]``; ``unit``: a built activation component
    (child ``act``, with its parameters if it has any) in place of the named ``activation``."""

    def __init__(self, d_model: int, d_ff: int, activation: str, bias: bool, unit: Optional[nn.Module] = None):
        super().__init__()
        self.up = nn.Linear(d_model, d_ff, bias=bias)
        self.down = nn.Linear(d_ff, d_model, bias=bias)
        self.activation = activation
        self.act = unit  # a child module (its parameters, if any, are the MLP's)
        self._act = unit.__call__ if unit is not None else ACTIVATIONS[activation]

    def forward(self, x: Tensor) -> Tensor:
        """``down(act(up(x)))``."""
        return self.down(self._act(self.up(x)))


def _scaled(t: Tensor, m: float) -> Tensor:
    """``t · m``, or ``t`` itself when ``m`` is 1."""
    return t if m == 1.0 else t * m


class GatedMLP(nn.Module):
    """Gated MLP (SwiGLU/GeGLU, or gpt-oss's clamped SwiGLU with ``unit``). ``[batch, seq, d_model] -> [batch, seq,
    d_model]``; ``multipliers``: ``(gate, output)`` multipliers (Falcon-H1's ``mlp_multipliers``)."""

    def __init__(
        self,
        d_model: int,
        d_ff: int,
        activation: str,
        bias: bool,
        unit: Optional[ClampedGLU] = None,
        multipliers: tuple[float, float] = (1.0, 1.0),
        sparsity: float = 0.0,
    ):
        super().__init__()
        self.sparsity = float(sparsity)
        self.gate = nn.Linear(d_model, d_ff, bias=bias)
        self.up = nn.Linear(d_model, d_ff, bias=bias)
        self.down = nn.Linear(d_ff, d_model, bias=bias)
        self.activation = activation
        self._act = unit.act if unit is not None else ACTIVATIONS[activation]
        self._up = unit.up_map if unit is not None else _identity
        self.gate_multiplier, self.output_multiplier = (float(m) for m in multipliers)

    def forward(self, x: Tensor) -> Tensor:
        """``m_out · down(act(m_gate · gate(x)) * up(x))`` (float16: the product in float32, rows scaled; see
        :func:`gated_product`)."""
        gate = _scaled(self.gate(x), self.gate_multiplier)
        if self.sparsity > 0.0:
            if hasattr(self.gate.weight, "device_mesh"):  # a tensor-parallel shard of d_ff: wrong statistics
                raise ValueError(
                    f"ffn with activation_sparsity = {self.sparsity}: the Gaussian top-k takes its mean and std over "
                    "the whole d_ff, which tensor parallelism splits across ranks; run it with tp = 1"
                )
            gate = gaussian_topk(gate, self.sparsity)
        h, scale = gated_product(self._act, gate, self._up(self.up(x)))
        return _scaled(_down(self.down, h, scale), self.output_multiplier)


def gaussian_topk(gate: Tensor, sparsity: float) -> Tensor:
    """``relu(g - (mean(g) + std(g) · Φ⁻¹(sparsity)))`` over the last dimension of ``gate [..., d_ff]`` (population
    std; Φ⁻¹ the standard normal quantile, ``sqrt(2) · erfinv(2p - 1)`` in float32, then in ``gate``'s dtype): if the
    entries were Gaussian, about ``1 - sparsity`` of them stay positive. The statistics are over the whole ``d_ff``,
    so a gate split across tensor-parallel ranks would change them. Source: Gemma 3n's activation sparsity,
    transformers ``Gemma3nTextMLP._gaussian_topk`` (which takes the quantile from ``torch.distributions.Normal``)."""
    p = torch.tensor(sparsity, dtype=torch.float32, device=gate.device)
    z = (torch.erfinv(2 * p - 1) * math.sqrt(2)).to(gate.dtype)
    mean = gate.mean(dim=-1, keepdim=True)
    std = gate.std(dim=-1, keepdim=True, unbiased=False)
    return nn.functional.relu(gate - (mean + std * z))


def _local(t: Tensor) -> Tensor:
    """This rank's shard of a tensor-parallel (``DTensor``) parameter; a plain tensor as it is."""
    return t.to_local() if hasattr(t, "to_local") else t


class _Stacked(nn.Module):
    """Base of the grouped FFNs: stacked ``[n, in, out]`` projections and their per-group biases."""

    def __init__(self, activation: str, bias: bool, unit: Optional[ClampedGLU] = None):
        super().__init__()
        self.bias, self.activation = bias, activation
        self._act = unit.act if unit is not None else ACTIVATIONS[activation]
        self._up = unit.up_map if unit is not None else _identity

    def _projection(self, name: str, n: int, d_in: int, d_out: int, bias: bool) -> None:
        """Register ``name [n, d_in, d_out]`` (and ``{name}_bias [n, d_out]``), filled like ``nn.Linear``'s
        defaults, U(-1/sqrt(d_in), 1/sqrt(d_in)), so a directly constructed module is usable (a model build
        skips these fills and calls :meth:`init_weights`)."""
        bound = d_in**-0.5
        self.register_parameter(name, nn.Parameter(nn.init.uniform_(torch.empty(n, d_in, d_out), -bound, bound)))
        b = nn.Parameter(nn.init.uniform_(torch.empty(n, d_out), -bound, bound)) if bias else None
        self.register_parameter(f"{name}_bias", b)

    def _apply_projection(self, name: str, x: Tensor, offs: Tensor, groups: Optional[Tensor]) -> Tensor:
        y = grouped_mm(x, _local(getattr(self, name)), offs)
        bias = getattr(self, f"{name}_bias")
        return y if bias is None else y + _local(bias)[groups]

    @property
    def tp_shard_dims(self) -> Optional[dict[str, int]]:
        """Tensor parallelism (the ``grouped`` style of :mod:`modkit.parallel`): every projection into the hidden
        width sharded on its output dim, ``down`` on its input dim, so each rank's output is a partial sum.
        ``None`` with an output bias (it would be added once per rank): the copies then stay replicated."""
        if self.down_bias is not None:
            return None
        dims = {}
        for name, _ in self.named_parameters(recurse=False):
            if name == "down" or name.endswith("_bias"):
                dims[name] = 1  # down [n, d_ff, d_model]; gate_bias / up_bias [n, d_ff]
            else:
                dims[name] = 2  # gate / up [n, d_model, d_ff]
        return dims

    def param_roles(self) -> dict[str, str]:
        """Parameter roles (:mod:`modkit.core.roles`): stacked matrices are ``expert``, stacked biases ``bias``."""
        return {
            name: "bias" if name.endswith("_bias") else "expert" for name, _ in self.named_parameters(recurse=False)
        }

    @staticmethod
    def _groups(x: Tensor, offs: Tensor) -> Tensor:
        """``[rows]`` int64 group of each row (``g`` for rows ``[offs[g-1], offs[g])``), without a host sync."""
        rows = torch.arange(x.shape[0], device=x.device, dtype=offs.dtype)
        return torch.searchsorted(offs, rows, right=True).clamp_(max=offs.shape[0] - 1)

    def init_weights(self, init: Init) -> None:
        """N(0, init_std) weights and zero biases, like the ``nn.Linear`` projections of the single form."""
        for name, p in self.named_parameters(recurse=False):
            if name.endswith("_bias"):
                init.zeros_(p)
            else:
                init.normal_(p)


class GroupedMLP(_Stacked):
    """``n`` independent :class:`MLP` copies with stacked weights (mixture-of-experts experts).

    Parameters: ``up [n, d_model, d_ff]``, ``down [n, d_ff, d_model]`` and, with ``bias``, ``up_bias [n, d_ff]``,
    ``down_bias [n, d_model]``. Copy ``g`` of the single form has ``up.weight == up[g].T``. ``unit``: a built
    activation component without parameters (``relu2``), shared by the copies.

    Raises:
        ValueError: ``unit`` has parameters (each copy would need its own).
    """

    def __init__(self, n: int, d_model: int, d_ff: int, activation: str, bias: bool, unit: Optional[nn.Module] = None):
        super().__init__(activation, bias)
        if unit is not None:
            if any(True for _ in unit.parameters()):
                raise ValueError(
                    f"ffn mlp: activation_unit {getattr(unit, 'modkit_type', type(unit).__name__)!r} has learned "
                    "parameters, which mixture-of-experts copies cannot share; use it in a dense mlp, or an expert "
                    "activation without parameters (relu2)"
                )
            self.act = unit
            self._act = unit.__call__
        self._projection("up", n, d_model, d_ff, bias)
        self._projection("down", n, d_ff, d_model, bias)

    def forward(self, x: Tensor, offs: Tensor) -> Tensor:
        """``x [rows, d_model]``, ``offs [n]`` int32 cumulative row ends -> ``[rows, d_model]``."""
        groups = self._groups(x, offs) if self.bias else None
        return self._apply_projection("down", self._act(self._apply_projection("up", x, offs, groups)), offs, groups)


class GroupedGatedMLP(_Stacked):
    """``n`` independent :class:`GatedMLP` copies with stacked weights (mixture-of-experts experts).

    Parameters: ``gate [n, d_model, d_ff]``, ``up [n, d_model, d_ff]``, ``down [n, d_ff, d_model]`` and, with
    ``bias``, ``gate_bias``/``up_bias [n, d_ff]``, ``down_bias [n, d_model]``. Copy ``g`` of the single form has
    ``gate.weight == gate[g].T`` (Mixtral's ``experts.{g}.w1.weight``), ``up.weight == up[g].T`` (``w3``),
    ``down.weight == down[g].T`` (``w2``). gpt-oss's ``experts.gate_up_proj [n, d_model, 2 d_ff]`` interleaves the
    two: ``gate == gate_up_proj[..., ::2]``, ``up == gate_up_proj[..., 1::2]`` (``unit``: its clamped form).
    """

    def __init__(
        self,
        n: int,
        d_model: int,
        d_ff: int,
        activation: str,
        bias: bool,
        unit: Optional[ClampedGLU] = None,
        multipliers: tuple[float, float] = (1.0, 1.0),
    ):
        super().__init__(activation, bias, unit)
        self._projection("gate", n, d_model, d_ff, bias)
        self._projection("up", n, d_model, d_ff, bias)
        self._projection("down", n, d_ff, d_model, bias)
        self.gate_multiplier, self.output_multiplier = (float(m) for m in multipliers)

    def forward(self, x: Tensor, offs: Tensor) -> Tensor:
        """``x [rows, d_model]``, ``offs [n]`` int32 cumulative row ends -> ``[rows, d_model]`` (float16: the gated
        product in float32, rows scaled as in :func:`gated_product`); the multipliers as in :class:`GatedMLP`."""
        groups = self._groups(x, offs) if self.bias else None
        up = self._up(self._apply_projection("up", x, offs, groups))
        gate = _scaled(self._apply_projection("gate", x, offs, groups), self.gate_multiplier)
        h, scale = gated_product(self._act, gate, up)
        if scale is None:
            return _scaled(self._apply_projection("down", h, offs, groups), self.output_multiplier)
        out = grouped_mm(h, _local(self.down), offs).float() * scale
        if self.down_bias is not None:
            out = out + _local(self.down_bias)[groups].float()
        return _scaled(out.to(h.dtype), self.output_multiplier)


def _mlp_count(cfg: MLPConfig, ctx: BuildContext) -> int:
    d = ctx.dim or ctx.d_model
    n = 2 * d * cfg.d_ff + (cfg.d_ff + d if cfg.bias else 0)
    if cfg.activation_unit is not None:
        unit = ctx.registry.entry_for_config(cfg.activation_unit)
        n += unit.param_count(cfg.activation_unit, ctx) if unit.param_count is not None else 0
    return n


def _unit(cfg: MLPConfig, ctx: BuildContext) -> Optional[nn.Module]:
    """The ``activation_unit`` built at width ``d_ff``, or ``None``."""
    return None if cfg.activation_unit is None else ctx.build(cfg.activation_unit, dim=cfg.d_ff)


def _mlp(cfg: MLPConfig, ctx: BuildContext) -> MLP:
    return MLP(ctx.dim or ctx.d_model, cfg.d_ff, cfg.activation, cfg.bias, _unit(cfg, ctx))


def _grouped_mlp(cfg: MLPConfig, ctx: BuildContext, n: int) -> Any:
    return GroupedMLP(n, ctx.dim or ctx.d_model, cfg.d_ff, cfg.activation, cfg.bias, _unit(cfg, ctx))


def _gated_count(cfg: GatedConfig, ctx: BuildContext) -> int:
    d = ctx.dim or ctx.d_model
    return 3 * d * cfg.d_ff + (2 * cfg.d_ff + d if cfg.bias else 0)


def _grouped_gated(cfg: GatedConfig, ctx: BuildContext, n: int) -> "GroupedGatedMLP":
    """``n`` stacked copies of a ``swiglu`` / ``geglu`` (experts); ``activation_sparsity`` is refused there."""
    if cfg.activation_sparsity:
        raise ValueError(
            f"ffn {cfg.type}: activation_sparsity = {cfg.activation_sparsity} is not supported in stacked experts; "
            "set it to 0 or use a dense ffn"
        )
    multipliers = (cfg.gate_multiplier, cfg.output_multiplier)
    return GroupedGatedMLP(n, ctx.dim or ctx.d_model, cfg.d_ff, cfg.act, cfg.bias, multipliers=multipliers)


def _mlp_flops(cfg: MLPConfig, ctx: BuildContext, work: Workload) -> dict[str, int]:
    """``up`` and ``down`` on ``work.tokens`` rows, ``2 · d · d_ff`` FLOPs each per row (activation, biases: not counted)."""
    d, t = ctx.dim or ctx.d_model, work.tokens
    return {"up": 2 * t * d * cfg.d_ff, "down": 2 * t * cfg.d_ff * d}


def _gated_flops(cfg: GatedConfig, ctx: BuildContext, work: Workload) -> dict[str, int]:
    """``gate``, ``up`` and ``down``, ``2 · d · d_ff`` FLOPs each per row (the gating product is element-wise)."""
    d, t = ctx.dim or ctx.d_model, work.tokens
    return {"gate": 2 * t * d * cfg.d_ff, "up": 2 * t * d * cfg.d_ff, "down": 2 * t * cfg.d_ff * d}


#: Key formulas of the docs pages (pymdownx.arithmatex).
_MATH = {
    "mlp": r"""$$\mathrm{FFN}(x) = W_{down}\, \phi(W_{up}\, x + b_{up}) + b_{down}$$

$W_{up}$: $d_{model} \to d_{ff}$, $W_{down}$: $d_{ff} \to d_{model}$, $\phi$ the activation (GELU, its tanh
approximation, ReLU or SiLU: activation, GELU by default; or the activation component of activation_unit); the
biases with bias: true (the default).""",
    "swiglu": r"""$$\mathrm{FFN}(x) = W_{down}\big(\mathrm{SiLU}(W_{gate}\, x) \odot W_{up}\, x\big), \qquad
\mathrm{SiLU}(z) = z\, \sigma(z) = \frac{z}{1 + e^{-z}}$$

$W_{gate}, W_{up}$: $d_{model} \to d_{ff}$, $W_{down}$: $d_{ff} \to d_{model}$, $\odot$ the element-wise product
(Shazeer 2020, eq. 6); activation replaces SiLU when set; biases only with bias: true. gate_multiplier and
output_multiplier (1 by default; Falcon-H1's μP mlp_multipliers) make it
$m_{out}\, W_{down}\big(\mathrm{SiLU}(m_{gate}\, W_{gate}\, x) \odot W_{up}\, x\big)$.""",
    "geglu": r"""$$\mathrm{FFN}(x) = W_{down}\big(\mathrm{GELU}(W_{gate}\, x) \odot W_{up}\, x\big), \qquad
\mathrm{GELU}(z) \approx \tfrac{z}{2}\left(1 + \tanh\!\left(\sqrt{2/\pi}\,(z + 0.044715\, z^3)\right)\right)$$

$W_{gate}, W_{up}$: $d_{model} \to d_{ff}$, $W_{down}$: $d_{ff} \to d_{model}$, $\odot$ the element-wise product
(Shazeer 2020, eq. 6; the tanh form of GELU unless activation says otherwise); biases only with bias: true;
gate_multiplier and output_multiplier as in swiglu.""",
    "swiglu_clamped": r"""$$\mathrm{FFN}(x) = W_{down}\big(g\, \sigma(\alpha\, g) \odot (u + 1)\big), \qquad
g = \min(W_{gate}\, x,\ L), \qquad u = \max(\min(W_{up}\, x,\ L),\ -L)$$

$W_{gate}, W_{up}$: $d_{model} \to d_{ff}$, $W_{down}$: $d_{ff} \to d_{model}$ (biases with bias: true, added before
the clamps), $\sigma$ the logistic sigmoid, $\alpha$ = alpha (1.702, which makes $g\,\sigma(\alpha g)$ close to
GELU), $L$ = limit (7.0). gpt-oss's experts (OpenAI 2025, arXiv:2508.10925).""",
}


@hookimpl
def register_components(register) -> None:
    """Register ``mlp``, ``swiglu``, ``geglu`` and ``swiglu_clamped``, and the activation components their
    ``activation_unit`` slot takes (:mod:`modkit_plugins.activations`)."""
    for entry in activations.components():
        register(entry)
    plan_mlp = {"up": "colwise", "down": "rowwise"}
    plan_gated = {"gate": "colwise", "up": "colwise", "down": "rowwise"}
    register(
        Component(
            kind="ffn",
            type="mlp",
            config=MLPConfig,
            factory=_mlp,
            description="Two-layer position-wise MLP down(act(up(x))) with gelu, gelu_tanh, relu or silu, or an "
            "activation component (activation_unit). [batch, seq, d_model] -> [batch, seq, d_model].",
            reference="Vaswani et al. 2017, Attention Is All You Need, arXiv:1706.03762",
            capabilities={"compile_safe": True, "tp_plan": plan_mlp},
            param_count=_mlp_count,
            flops=_mlp_flops,
            example={"type": "mlp", "d_ff": 128, "activation": "gelu_tanh"},
            math=_MATH["mlp"],
            grouped_factory=_grouped_mlp,
        )
    )
    for t, what in (("swiglu", "SiLU"), ("geglu", "GELU (tanh)")):
        register(
            Component(
                kind="ffn",
                type=t,
                config=GatedConfig,
                factory=lambda cfg, ctx: GatedMLP(
                    ctx.dim or ctx.d_model,
                    cfg.d_ff,
                    cfg.act,
                    cfg.bias,
                    multipliers=(cfg.gate_multiplier, cfg.output_multiplier),
                    sparsity=cfg.activation_sparsity,
                ),
                description=f"Gated MLP down({what}(gate(x)) * up(x)). [batch, seq, d_model] -> [batch, seq, d_model].",
                reference="Shazeer 2020, GLU Variants Improve Transformer, arXiv:2002.05202",
                capabilities={"compile_safe": True, "tp_plan": plan_gated},
                param_count=_gated_count,
                flops=_gated_flops,
                example={"type": t, "d_ff": 96},
                math=_MATH[t],
                grouped_factory=_grouped_gated,
            )
        )
    register(
        Component(
            kind="ffn",
            type="swiglu_clamped",
            config=ClampedSwiGLUConfig,
            factory=lambda cfg, ctx: GatedMLP(ctx.dim or ctx.d_model, cfg.d_ff, "clamped", cfg.bias, _clamp(cfg)),
            description="gpt-oss's clamped SwiGLU down(g * sigmoid(alpha * g) * (u + 1)), g = min(gate(x), limit), "
            "u = clamp(up(x), -limit, limit). [batch, seq, d_model] -> [batch, seq, d_model]. As mixture-of-experts "
            "experts with bias: true it is gpt-oss's GptOssExperts.",
            reference="OpenAI 2025, gpt-oss-120b & gpt-oss-20b Model Card, arXiv:2508.10925 (transformers GptOssExperts)",
            capabilities={"compile_safe": True, "tp_plan": plan_gated},  # the clamps act per feature: shardable on d_ff
            param_count=_gated_count,
            flops=_gated_flops,
            example={"type": "swiglu_clamped", "d_ff": 96, "bias": True},
            math=_MATH["swiglu_clamped"],
            grouped_factory=lambda cfg, ctx, n: GroupedGatedMLP(
                n,
                ctx.dim or ctx.d_model,
                cfg.d_ff,
                "clamped",
                cfg.bias,
                _clamp(cfg),
            ),
        )
    )

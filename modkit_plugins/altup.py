"""``altup``: Gemma 3n's residual stream, AltUp predictions of ``n`` copies with per-layer embeddings.

Alternating updates (AltUp, Baykal et al. 2023, NeurIPS, arXiv:2301.13310) carry ``n`` copies (predictions) of the
residual stream ``S [b, s, n, d]``; each block runs on one of them (``active``) and its result corrects all of them.
It is a ``"block"``-scope stream (:mod:`modkit.nn.stream`): read once before a block, written once after it, with
the block itself (any placement; Gemma 3n's is ``sandwich`` with a LAuReL residual) running on ``[b, s, d]`` in
between. For one block, with ``r(x) = tanh(router(rms(x) / d))`` (``[b, s, n]``, ``router [n, d]``)::

    P = S + C(S_a) · S,   C(x) = (predict · r(x)) as [n, n]       # predict: [n², n]; the prediction step
    x = P_a                                                      # the block's input
    y = block(x)                                                 # [b, s, d], the block's output
    S' = P + (correct · r(y) + 1) ⊗ (y - P_a)                    # correct: [n, n]; the correction step
    g = layer_norm(layer_proj(act(layer_gate(S'_a · output_scale)) · e_l))   # per-layer input e_l [b, s, p]
    S'_k += g  for every copy k >= 1                             # layer_gate [p, d], layer_proj [d, p]

``output_scale [d]`` multiplies only with ``correct_scale``; in training the ``predict`` and ``correct`` weights are
clamped to ``[-coef_clip, coef_clip]`` in the forward (transformers clamps the stored ``predict`` weight in place
instead; the values used are the same).

Per-layer embeddings (:meth:`AltUpStream.layer_inputs`, once per forward; ``L`` layers, ``p`` = ``layer_input_width``)::

    e = (rms(layer_proj(x) / sqrt(d)) [b, s, L, p] + layer_embed[ids] · sqrt(p)) / sqrt(2)

with ``x`` the scaled token embeddings and ids at or above ``layer_input_vocab`` read as 0. The embeddings enter as
``S_0 = x`` and ``S_k = enter_proj_k(x)`` rescaled to ``x``'s RMS (``sqrt(max(mean(c²), 1e-5))``); the head reads the
mean of ``S_0`` and ``exit_proj_k(S_k)`` rescaled to ``S_0``'s RMS, before the final norm. Every RMS norm here is
``x / sqrt(mean(x²) + eps) · weight`` in float32.

Source: transformers ``Gemma3nTextAltUp``, ``Gemma3nTextDecoderLayer``, ``Gemma3nTextModel`` (``altup_projections``,
``altup_unembed_projections``, ``get_per_layer_inputs``, ``project_per_layer_inputs``) in
``models/gemma3n/modeling_gemma3n.py``, whose operations these follow in the same order.
"""

from __future__ import annotations

from typing import Literal, Optional

import torch
import torch.nn.functional as F
from pydantic import Field, ValidationInfo, field_validator
from torch import Tensor, nn

from modkit.plugin import BuildContext, Component, ComponentConfig, Init, ResidualStream, hookimpl

_ACTS = {
    "gelu": lambda x: F.gelu(x),
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
    "silu": F.silu,
}


class AltUpConfig(ComponentConfig):
    """Config of ``altup``: the copies, the active one, the coefficient clip and the per-layer embeddings."""

    type: Literal["altup"] = "altup"
    n_streams: int = Field(4, ge=2, le=16, description="copies (predictions) of the stream (altup_num_inputs)")
    active: int = Field(0, ge=0, le=15, description="the copy each block runs on (altup_active_idx)")
    coef_clip: Optional[float] = Field(
        120.0, gt=0, le=1e6, description="training clamps the predict/correct weights to ±coef_clip; null: none"
    )
    correct_scale: bool = Field(True, description="the active corrected copy times output_scale before the gate")
    layer_input_width: int = Field(
        256, ge=1, le=1 << 14, description="width p of each layer's input (hidden_size_per_layer_input)"
    )
    layer_input_vocab: Optional[int] = Field(
        None, ge=1, le=1 << 24, description="rows of the per-layer table (vocab_size_per_layer_input); null: vocab"
    )
    activation: Literal["gelu", "gelu_tanh", "relu", "silu"] = Field(
        "gelu_tanh", description="activation of the per-layer gate (Gemma 3n's hidden_activation)"
    )
    eps: float = Field(1e-6, gt=0, le=0.1, description="epsilon of every RMS norm of the stream")
    output_scale_init: float = Field(
        0.0,
        ge=-1e3,
        le=1e3,
        allow_inf_nan=False,
        description="every output_scale's initial value: 0 as Gemma 3n initialises it (the per-layer inputs then "
        "add nothing and their tables get no gradient until output_scale has moved, after the first step)",
    )

    @field_validator("active")
    @classmethod
    def _active(cls, active: int, info: ValidationInfo) -> int:
        n = info.data.get("n_streams")
        if n is not None and active >= n:
            raise ValueError(f"= {active} names no copy; n_streams = {n}: use 0..{n - 1}")
        return active


class RMS(nn.Module):
    """``x / sqrt(mean(x²) + eps) · weight`` over the last dimension, in float32, back in ``x``'s dtype
    (transformers ``Gemma3nRMSNorm``). ``[..., dim] -> [..., dim]``; ``weight [dim]`` starts at 1."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def init_weights(self, init: Init) -> None:
        """``weight`` 1."""
        init.ones_(self.weight)

    def param_roles(self) -> dict[str, str]:
        """``weight`` is a norm gain."""
        return {"weight": "norm_gain"}

    def forward(self, x: Tensor) -> Tensor:
        """The normalised ``x``, same shape and dtype."""
        return F.rms_norm(x.float(), (x.shape[-1],), self.weight.float(), self.eps).type_as(x)


def _rescaled(c: Tensor, target: Tensor) -> Tensor:
    """``c [.., d]`` scaled to the RMS ``target [.., 1]``: ``c · target / sqrt(max(mean(c²), 1e-5))``."""
    return c * target / torch.sqrt(torch.mean(c**2, dim=-1, keepdim=True).clamp(min=1e-5))


class AltUpLink(nn.Module):
    """One block's AltUp connection: ``read(s [b, s, n, d]) -> (x [b, s, d], P [b, s, n, d])`` (the prediction) and
    ``write(s, P, y [b, s, d], e [b, s, p]) -> s' [b, s, n, d]`` (the correction and the per-layer input); the
    formulas are in the module docstring. Parameters ``predict [n², n]``, ``correct [n, n]``, ``router [n, d]``,
    ``router_norm [d]``, ``output_scale [d]``, ``layer_gate [p, d]``, ``layer_proj [d, p]``, ``layer_norm [d]``."""

    def __init__(self, d_model: int, cfg: AltUpConfig):
        super().__init__()
        n, p = cfg.n_streams, cfg.layer_input_width
        self.cfg, self.n, self.d_model = cfg, n, d_model
        self.output_scale = nn.Parameter(torch.zeros(d_model))
        self.correct = nn.Linear(n, n, bias=False)
        self.predict = nn.Linear(n, n * n, bias=False)
        self.router = nn.Linear(d_model, n, bias=False)
        self.router_norm = RMS(d_model, cfg.eps)
        self.layer_gate = nn.Linear(d_model, p, bias=False)
        self.layer_proj = nn.Linear(p, d_model, bias=False)
        self.layer_norm = RMS(d_model, cfg.eps)
        self._act = _ACTS[cfg.activation]

    def init_weights(self, init: Init) -> None:
        """``output_scale`` ``output_scale_init`` (0: as transformers initialises it); the linears follow the
        model's rule."""
        init.constant_(self.output_scale, self.cfg.output_scale_init)

    #: read as matrices (clamped in training, :meth:`_coefs`): decoding with low-precision weights keeps them as built
    matrix_weights = ("predict.weight", "correct.weight")

    def param_roles(self) -> dict[str, str]:
        """``output_scale`` is a vector; the coefficient maps are read out of the stream like a router."""
        return {"output_scale": "vector", "router.weight": "router"}

    def _coefs(self, linear: nn.Linear, r: Tensor) -> Tensor:
        """``linear(r)``, its weight clamped to ``±coef_clip`` in training."""
        w, clip = linear.weight, self.cfg.coef_clip
        if self.training and clip is not None:
            w = w.clamp(-clip, clip)
        return F.linear(r, w)

    def _route(self, x: Tensor) -> Tensor:
        """``tanh(router(rms(x) / d))``: ``[b, s, d] -> [b, s, n]`` (tanh in float32)."""
        scale = torch.tensor(self.d_model**-1.0, dtype=torch.float32, device=x.device)
        return torch.tanh(self.router(self.router_norm(x) * scale).float()).type_as(x)

    def read(self, s: Tensor) -> tuple[Tensor, Tensor]:
        """The prediction ``P = S + C(S_a) · S`` and its active copy: ``(P_a [b, s, d], P [b, s, n, d])``."""
        n, a = self.n, self.cfg.active
        coefs = self._coefs(self.predict, self._route(s[:, :, a])).unflatten(-1, (n, n))  # [b, s, n, n]
        pred = (torch.matmul(coefs, s) + s).type_as(s)
        return pred[:, :, a], pred

    def write(self, s: Tensor, pred: Tensor, y: Tensor, layer_input: Optional[Tensor]) -> Tensor:
        """The corrected copies plus the gated per-layer input on copies ``1..n-1``: ``[b, s, n, d]``.

        Raises:
            ValueError: ``layer_input`` is ``None`` (the model did not pass the stream's per-layer inputs).
        """
        if layer_input is None:
            raise ValueError("altup: a block was run without its per-layer input (AttentionInputs.stream_inputs)")
        a = self.cfg.active
        coefs = self._coefs(self.correct, self._route(y)) + 1.0  # [b, s, n]
        corrected = ((y - pred[:, :, a]).unsqueeze(2) * coefs.unsqueeze(-1) + pred).type_as(y)
        first = corrected[:, :, a]
        if self.cfg.correct_scale:
            first = (first.type_as(self.output_scale) * self.output_scale).type_as(first)
        g = self.layer_norm(self.layer_proj(self._act(self.layer_gate(first)) * layer_input))
        return torch.cat([corrected[:, :, :1], corrected[:, :, 1:] + g.unsqueeze(2)], dim=2)


class AltUpStream(ResidualStream):
    """The ``altup`` stream (module docstring): ``enter`` ``[b, s, d] -> [b, s, n, d]`` (``enter_proj``, ``n - 1``
    maps ``[d, d]``), ``exit`` ``[b, s, n, d] -> [b, s, d]`` (``exit_proj``), ``layer_inputs`` ``[b, s, L, p]``
    (``layer_embed [V_p, L·p]``, ``layer_proj [L·p, d]``, ``layer_proj_norm [p]``) and one :class:`AltUpLink` per
    block. Baykal et al. 2023 (arXiv:2301.13310); transformers ``Gemma3nTextModel``."""

    scope = "block"

    def __init__(self, cfg: AltUpConfig, ctx: BuildContext):
        super().__init__()
        n, d, p, layers = cfg.n_streams, ctx.d_model, cfg.layer_input_width, ctx.n_layers
        self.n_streams, self.cfg, self.d_model, self.n_layers = n, cfg, d, layers
        self.vocab = cfg.layer_input_vocab or ctx.vocab_size
        self.layer_embed = nn.Embedding(self.vocab, layers * p)
        self.layer_proj = nn.Linear(d, layers * p, bias=False)
        self.layer_proj_norm = RMS(p, cfg.eps)
        self.enter_proj = nn.ModuleList(nn.Linear(d, d, bias=False) for _ in range(n - 1))
        self.exit_proj = nn.ModuleList(nn.Linear(d, d, bias=False) for _ in range(n - 1))

    def init_weights(self, init: Init) -> None:
        """``layer_embed`` normal(0, init_std); the linears follow the model's rule."""
        init.normal_(self.layer_embed.weight)

    def param_roles(self) -> dict[str, str]:
        """``layer_embed`` is a table read by token id."""
        return {"layer_embed.weight": "embedding"}

    def layer_inputs(self, input_ids: Tensor, x: Tensor) -> Tensor:
        """Every layer's input ``[b, s, L, p]`` from ``input_ids [b, s]`` and the embeddings ``x [b, s, d]``."""
        p = self.cfg.layer_input_width
        ids = torch.where((input_ids >= 0) & (input_ids < self.vocab), input_ids, 0)
        w = self.layer_embed.weight
        emb = self.layer_embed(ids) * torch.tensor(p**0.5, device=w.device).to(w.dtype)
        proj = self.layer_proj(x) * torch.tensor(self.d_model**-0.5, device=x.device).to(x.dtype)
        proj = self.layer_proj_norm(proj.unflatten(-1, (self.n_layers, p)))
        half = torch.rsqrt(torch.tensor(2.0, device=x.device)).to(x.dtype)
        return (proj + emb.unflatten(-1, (self.n_layers, p))) * half

    def enter(self, x: Tensor) -> Tensor:
        """``[x, rescaled enter_proj_k(x)...]``: ``[b, s, n, d]``."""
        target = torch.mean(x**2, dim=-1, keepdim=True) ** 0.5
        return torch.stack([x] + [_rescaled(proj(x), target) for proj in self.enter_proj], dim=2)

    def exit(self, s: Tensor) -> Tensor:
        """The mean of ``S_0`` and the rescaled ``exit_proj_k(S_k)``: ``[b, s, d]``."""
        first = s[:, :, 0]
        target = torch.mean(first**2, dim=-1, keepdim=True) ** 0.5
        outs = [first] + [_rescaled(proj(s[:, :, k + 1]), target) for k, proj in enumerate(self.exit_proj)]
        return torch.stack(outs, dim=2).mean(dim=2)

    def connection(self) -> nn.Module:
        """Not for a block-scope stream: raises ``NotImplementedError`` (blocks call :meth:`block_connection`)."""
        raise NotImplementedError("altup is a block-scope stream: blocks build block_connection(ctx)")

    def connection_flops(self, tokens: int) -> int:
        """Matrix-product FLOPs of one block's :class:`AltUpLink` on ``tokens`` tokens (:func:`link_flops`)."""
        return tokens * link_flops(self.n_streams, self.d_model, self.cfg.layer_input_width)

    def block_connection(self, ctx: BuildContext) -> AltUpLink:
        """A new :class:`AltUpLink` for one block."""
        return AltUpLink(self.d_model, self.cfg)


def link_flops(n: int, d: int, p: int) -> int:
    """Matrix-product FLOPs per token of one :class:`AltUpLink` (``n`` copies of width ``d``, per-layer inputs of
    ``p``): the two routings ``2 · 2 d n``, the coefficients ``2 (n³ + n²)``, ``C · S`` ``2 n² d``, the gate and the
    projection ``2 · 2 d p``."""
    return 4 * d * n + 2 * (n**3 + n * n) + 2 * n * n * d + 4 * d * p


def _count(cfg: AltUpConfig, ctx: BuildContext) -> int:
    """The stream module's own parameters (each block's :class:`AltUpLink` belongs to the block)."""
    n, d, p, layers = cfg.n_streams, ctx.d_model, cfg.layer_input_width, ctx.n_layers
    vocab = cfg.layer_input_vocab or ctx.vocab_size
    return vocab * layers * p + d * layers * p + p + 2 * (n - 1) * d * d


def _flops(cfg: AltUpConfig, ctx, workload) -> dict:
    """Matrix-product FLOPs of the stream: ``enter`` and ``exit`` ``2 (n - 1) d²`` each per token, the per-layer
    projection ``2 d L p``, and every block's link (:meth:`AltUpStream.connection_flops`, which the blocks hold)."""
    n, d, p, layers, t = cfg.n_streams, ctx.d_model, cfg.layer_input_width, ctx.n_layers, workload.tokens
    link = link_flops(n, d, p)
    return {
        "enter": t * 2 * (n - 1) * d * d,
        "exit": t * 2 * (n - 1) * d * d,
        "layer_inputs": t * 2 * d * layers * p,
        "links": t * layers * link,
    }


@hookimpl
def register_components(register) -> None:
    """Register the ``altup`` residual stream."""
    register(
        Component(
            kind="stream",
            type="altup",
            config=AltUpConfig,
            factory=lambda cfg, ctx: AltUpStream(cfg, ctx),
            description="AltUp (Gemma 3n): n_streams predictions of the residual stream; each block runs on the "
            "active one and corrects all of them, and adds a gated per-layer embedding to the others. Read before "
            "and written after each block (scope 'block', every placement). Sublayers keep [batch, seq, d_model].",
            reference="Baykal et al. 2023, Alternating Updates for Efficient Transformers, arXiv:2301.13310; "
            "transformers Gemma3nTextAltUp / Gemma3nTextModel",
            capabilities={"compile_safe": True, "scope": "block"},
            param_count=_count,
            flops=_flops,
            # output_scale starts at 1 here so every parameter gets a gradient from the first step (the kit's check)
            example={"type": "altup", "n_streams": 4, "layer_input_width": 8, "output_scale_init": 1.0},
        )
    )

"""``side_input``: a token mixer fed the output of a side block that reads the residual stream concatenated with the
embeddings (Zamba2's hybrid layer). Registered by :mod:`modkit_plugins.hybrid`.

``[batch, seq, d_model] -> [batch, seq, d_model]``. The mixer normalises its own input (capability ``own_norm``: the
placement puts no norm before it and hands it the residual stream ``x`` itself) and computes

    s = [x, e]                                            (concat_embeddings; else s = x)
    t = side_ffn(side_ffn_norm(side_mixer(side_norm(s))))  (no residual inside the side block)
    y = mixer(norm(x + P t))                               (P: d_model × d_model, no bias; proj false: P = I)

with ``e = inputs.embeddings`` (:class:`~modkit.core.interfaces.AttentionInputs`: what the first block received), so
a ``pre`` block computes Zamba2's ``x + mamba(norm(x + P · T([x, e])))``: the side block's output joins the mixer's
input, not the residual stream. The side block is the module ``side`` (``attention.side`` inside the block); a spec's
``share`` group with ``"part": "attention.side"`` shares it across layers (Zamba2's one or two alternating shared
blocks, with per-use LoRA adapters) while the mixer, its norm and ``P`` stay each layer's own. The side mixer is built
with ``BuildContext.d_in`` = 2·d_model (it must declare the ``d_in`` capability) and returns d_model features; it keeps
its own state in the layer's cache (key ``attention.side.mixer``) beside the main mixer's (``attention.mixer``), so
cache bytes count both. Document boundaries reach both mixers; the layer honours them when both declare
``document_mask``.

References: Glorioso et al. 2024, Zamba: A Compact 7B SSM Hybrid Model (arXiv:2405.16712), §2 and fig. 2 (the shared
block fed the stream concatenated with the embeddings, its output projected and added to the Mamba input); Glorioso
et al. 2024, The Zamba2 Suite: Technical Report (arXiv:2411.15242) (two alternating shared blocks, per-use LoRA);
transformers ``Zamba2HybridLayer``, ``Zamba2AttentionDecoderLayer`` (modeling_zamba2.py, read, not copied).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Literal, Optional

import torch
from pydantic import Field
from torch import Tensor, nn

from modkit.plugin import (
    AttentionInputs,
    BuildContext,
    Component,
    ComponentConfig,
    position_geometry,
    run_ffn,
    Slot,
    Workload,
)

from .nested_counts import nested_param_count


class SideInputConfig(ComponentConfig):
    """Config of ``side_input``: a token mixer whose input also receives a side block's projected output."""

    type: Literal["side_input"] = "side_input"
    mixer: ComponentConfig = Slot(
        "mixer", description="the layer's own token mixer (Zamba2: Mamba-2), reading norm(x + P · side output)"
    )
    side_mixer: ComponentConfig = Slot(
        "mixer",
        description="the side block's token mixer (Zamba2: attention), reading [x, embeddings] (2·d_model wide) with "
        "concat_embeddings; it must declare the 'd_in' capability then",
    )
    side_ffn: Optional[ComponentConfig] = Slot(
        "ffn", default=None, description="the side block's ffn after its mixer (no residual); null: none"
    )
    norm: ComponentConfig = Slot(
        "norm", description="the norm before the mixer, before the side mixer (2·d_model wide) and before the side ffn"
    )
    concat_embeddings: bool = Field(
        True, description="the side block reads [x, embeddings] (Zamba2); false: x alone (d_model wide)"
    )
    proj: bool = Field(
        True, description="a d_model × d_model projection (no bias) of the side output, each layer's own (Zamba2)"
    )

    def side_width(self, d_model: int) -> int:
        """The side block's input width: ``2 · d_model`` with ``concat_embeddings``, else ``d_model``."""
        return 2 * d_model if self.concat_embeddings else d_model

    def position_geometry(self, ctx):
        """The side mixer's geometry (the attention of Zamba2's shared block), else the main mixer's."""
        for m in (self.side_mixer, self.mixer):
            geo = position_geometry(m, ctx)
            if geo is not None and (geo.n_heads or geo.head_dim):
                return geo
        return None

    def check(self, ctx) -> list[tuple[str, str]]:
        """A side mixer that takes the wider input (``d_in``); a side ffn without an auxiliary loss."""
        errors = []
        side = ctx.registry.entry_for_config(self.side_mixer)
        if self.concat_embeddings and not side.capabilities.get("d_in"):
            kinds = ("attention", "mixer")  # every kind of token mixer
            able = sorted({e.type for k in kinds for e in ctx.registry.components(k) if e.capabilities.get("d_in")})
            errors.append(
                (
                    "side_mixer",
                    f"type {side.type!r} does not declare the 'd_in' capability: it cannot read [x, embeddings] "
                    f"({2 * ctx.d_model} wide); use one that does ({', '.join(able) or 'none installed'}) or set "
                    "concat_embeddings false",
                )
            )
        if self.side_ffn is not None and ctx.registry.entry_for_config(self.side_ffn).capabilities.get("aux_loss"):
            errors.append(("side_ffn", "an ffn with an auxiliary loss (a mixture) cannot sit in a side block"))
        return errors


class SideBlock(nn.Module):
    """The side block: ``forward(s [batch, seq, width], inputs) -> [batch, seq, d_model]`` =
    ``ffn(ffn_norm(mixer(mixer_norm(s))))`` (``ffn`` optional), no residual (Zamba2's
    ``Zamba2AttentionDecoderLayer``)."""

    def __init__(self, cfg: SideInputConfig, ctx: BuildContext):
        super().__init__()
        width = cfg.side_width(ctx.d_model)
        self.mixer_norm = ctx.build(cfg.norm, dim=width)
        self.mixer = ctx.build(cfg.side_mixer, d_in=width if width != ctx.d_model else None)
        self.ffn_norm = ctx.build(cfg.norm) if cfg.side_ffn is not None else None
        self.ffn = ctx.build(cfg.side_ffn) if cfg.side_ffn is not None else None

    def forward(self, s: Tensor, inputs: AttentionInputs) -> Tensor:
        """``s [batch, seq, width]`` -> ``[batch, seq, d_model]``; the mixer updates its cached state."""
        t = self.mixer(self.mixer_norm(s), inputs)
        if self.ffn is None:
            return t
        return run_ffn(self.ffn, self.ffn_norm(t), inputs)[0]


class SideInput(nn.Module):
    """``forward(x [batch, seq, d_model], inputs) = mixer(norm(x + proj(side([x, inputs.embeddings]))))``.

    Attributes: ``side`` (:class:`SideBlock`), ``proj`` (``nn.Linear(d_model, d_model, bias=False)`` or ``None``),
    ``input_norm`` (the norm before the mixer) and ``mixer``.
    """

    def __init__(self, cfg: SideInputConfig, ctx: BuildContext):
        super().__init__()
        self.concat = cfg.concat_embeddings
        self.side = SideBlock(cfg, ctx)
        self.proj = nn.Linear(ctx.d_model, ctx.d_model, bias=False) if cfg.proj else None
        self.input_norm = ctx.build(cfg.norm)
        self.mixer = ctx.build(cfg.mixer)

    def forward(self, x: Tensor, inputs: AttentionInputs) -> Tensor:
        """``x [batch, seq, d_model]`` (the residual stream, not normalised) -> ``[batch, seq, d_model]``.

        Raises:
            ValueError: ``inputs.embeddings`` missing or of another shape than ``x`` while the side block reads them
                (blocks run outside a model's forward).
        """
        s = x
        if self.concat:
            e = inputs.embeddings
            if e is None or e.shape != x.shape:
                raise ValueError(
                    "side_input reads the embeddings beside the residual stream (AttentionInputs.embeddings), but "
                    f"got {None if e is None else tuple(e.shape)} for a stream of shape {tuple(x.shape)}: run it "
                    "through Model.forward, which hands every layer the embeddings"
                )
            s = torch.cat([x, e.to(x.dtype)], dim=-1)
        t = self.side(s, inputs)
        if self.proj is not None:
            t = self.proj(t)
        return self.mixer(self.input_norm(x + t), inputs)


def _param_count(cfg: SideInputConfig, ctx: BuildContext) -> int:
    d, width = ctx.d_model, cfg.side_width(ctx.d_model)
    n = (
        nested_param_count(cfg.mixer, ctx)
        + nested_param_count(cfg.norm, ctx)
        + nested_param_count(cfg.norm, replace(ctx, dim=width))
    )
    n += nested_param_count(cfg.side_mixer, replace(ctx, d_in=width if width != d else None))
    if cfg.side_ffn is not None:
        n += nested_param_count(cfg.side_ffn, ctx) + nested_param_count(cfg.norm, ctx)
    return n + d * d * cfg.proj


def _flops(cfg: SideInputConfig, ctx: BuildContext, work: Workload) -> dict[str, int]:
    """The projection ``P``: ``2 · tokens · d_model²`` (1 multiply-add = 2 FLOPs); the mixers, the ffn and the norms
    declare their own, the concatenation and the addition are element-wise."""
    return {"proj": 2 * work.tokens * ctx.d_model * ctx.d_model} if cfg.proj else {}


_MATH = r"""$$s = [x, e], \qquad t = F\!\left(N_f\!\left(A\!\left(N_a(s)\right)\right)\right), \qquad
y = M\!\left(N(x + P\, t)\right)$$

$x$ is the residual stream (not normalised: the mixer holds its norm $N$), $e$ the embeddings the first block
received, $A$ = side_mixer (reading $2 d_{model}$ features), $F$ = side_ffn, $P$ the $d_{model} \times d_{model}$
projection, $M$ = mixer. In a pre block the layer computes $x + y$ (Zamba2's hybrid layer)."""

SIDE_INPUT = Component(
    kind="mixer",
    type="side_input",
    config=SideInputConfig,
    factory=lambda cfg, ctx: SideInput(cfg, ctx),
    description="A token mixer fed a side block's output (Zamba2's hybrid layer): the side block (a mixer, then an "
    "ffn, no residual) reads the stream concatenated with the embeddings, its output is projected and added to the "
    "mixer's input before the mixer's own norm. [batch, seq, d_model] -> [batch, seq, d_model]; the side mixer and "
    "the mixer each keep their own cache state; share the side block across layers with share[].part.",
    reference="Glorioso et al. 2024, Zamba, arXiv:2405.16712; The Zamba2 Suite, arXiv:2411.15242; transformers "
    "Zamba2HybridLayer (modeling_zamba2.py)",
    capabilities={
        "causal_safe": True,
        "kv_cache": True,
        "compile_safe": True,
        "document_mask": True,  # hands inputs.documents to both mixers; each is checked for its own
        "own_norm": True,  # the placement puts no norm before it: the side block reads the stream itself
        # no cross-rank scan: a shard of the sequence would start from a zero state
        "context_parallel": False,
    },
    param_count=_param_count,
    flops=_flops,
    math=_MATH,
    example={
        "type": "side_input",
        "mixer": {"type": "mamba2", "d_state": 8, "head_dim": 8, "chunk_size": 4},
        "side_mixer": {"type": "gqa", "n_heads": 4, "n_kv_heads": 2},
        "side_ffn": {"type": "geglu", "d_ff": 64, "activation": "gelu"},
        "norm": {"type": "rmsnorm"},
    },
)

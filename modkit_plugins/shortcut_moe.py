"""``shortcut-moe``: LongCat-Flash's layer, two sublayer pairs with a shortcut-connected FFN across them.

``[batch, seq, d_model] -> ([batch, seq, d_model], aux_loss | None)``. The block's mixer ``A1`` and ffn ``S`` (the
shortcut branch, LongCat-Flash's mixture of experts) are the block's slots as in every placement; the placement's
config adds the second pair's mixer ``A2`` (``mixer``) and the dense FFN both pairs hold (``dense``: two copies,
``D1`` and ``D2``)::

    h = x + A1(N1(x))
    u = N2(h)
    s = S(u)                      # the shortcut branch reads the first pair's ffn input ...
    h = h + D1(u)
    h = h + A2(N3(h))
    y = h + D2(N4(h)) + s         # ... and is added after the second pair

``N1`` = attn_norm, ``N2`` = ffn_norm, ``N3`` = attn_2_norm, ``N4`` = ffn_2_norm, built from the block's norm config
(``N1`` or ``N3`` is the identity before a mixer that normalises its own input: capability ``own_norm``).
The shortcut branch runs beside ``D1``, ``A2`` and ``D2`` (nothing it computes feeds them), so its expert dispatch
can overlap the second pair's computation: the point of the design (ScMoE, Cai et al. 2024; LongCat-Flash).

The placement contract is unchanged but for two optional additions: the placement receives the block's mixer and
ffn and returns a block module; what is new is that a placement may hold sublayers of its own, declared as
:func:`~modkit.Slot` fields of its config (built with ``ctx.build``, so the cache, the cost model and the parameter
breakdown see them like the block's own). The second mixer keeps its own cache state, keyed by its path ``attention_2`` (:mod:`modkit.nn.cache`),
as a parallel hybrid's mixers do; it is rotated by the layer's position scheme, so it must have the block mixer's
head geometry (LongCat-Flash: the same MLA config): spec validation refuses another one, and a block whose mixer is
``none``, through the config's ``check_layer`` (an optional hook of placement configs, called per layer with the
layer's components: :mod:`modkit.spec.checks`). Every auxiliary loss (the shortcut mixture's) is returned. The
spec's ``dropout.residual`` applies to everything added to the stream, in training mode.

Module names (state_dict keys, in build order): ``attn_norm``, ``attention``, ``ffn_norm``, ``dense``, ``ffn``,
``attn_2_norm``, ``attention_2``, ``ffn_2_norm``, ``dense_2``.

References: Meituan LongCat Team 2025, LongCat-Flash Technical Report (arXiv:2509.01322) §2.1 (shortcut-connected MoE);
Cai et al. 2024, Shortcut-connected Expert Parallelism for Accelerating Mixture-of-Experts (arXiv:2404.05019);
transformers ``LongcatFlashDecoderLayer`` (``models/longcat_flash/modeling_longcat_flash.py``) for the exact form.
"""

from __future__ import annotations

from typing import Literal, Optional

from torch import Tensor, nn

from modkit_plugins.no_mixer import owns_norm
from modkit.plugin import (
    add_aux,
    AttentionInputs,
    BuildContext,
    Component,
    ComponentConfig,
    dropout,
    elementwise,
    hookimpl,
    layer_input,
    position_geometry,
    run_ffn,
    Slot,
    stream_of,
)


class ShortcutMoEConfig(ComponentConfig):
    """Config of ``shortcut-moe``: the second pair's mixer and the dense FFN of both pairs (the block's ffn is the
    shortcut branch)."""

    type: Literal["shortcut-moe"] = "shortcut-moe"
    mixer: ComponentConfig = Slot(
        "mixer",
        description="the token mixer of the second sublayer pair (LongCat-Flash: the same MLA as the block's "
        "attention; it must have the block mixer's head geometry, since the layer's position scheme rotates both)",
    )
    dense: ComponentConfig = Slot(
        "ffn",
        description="the dense FFN of each sublayer pair, built twice (LongCat-Flash: a SwiGLU of ffn_hidden_size); "
        "the block's ffn is the shortcut branch (LongCat-Flash's mixture of experts)",
    )

    def check_layer(self, layer, ctx) -> list[tuple[str, str]]:
        """The layer's own mixer must be a token mixer (not ``none``); where the layer's position scheme acts per
        head (its ``acts_on`` capability is ``qk`` or ``bias``: it is built for one geometry), that mixer's position
        geometry (heads, rotated width) must equal the second mixer's, since the one scheme serves both."""
        if layer.attention.type == "none":
            return [
                (
                    "",
                    "placement 'shortcut-moe' needs a token mixer in the block (its second mixer shares the layer's "
                    "position scheme), got the mixer 'none'; give the layer a mixer or use placement 'pre'",
                )
            ]
        scheme = ctx.registry.get("position", layer.position.type)
        if scheme.capabilities.get("acts_on") not in ("qk", "bias"):  # embeddings or nothing: no per-head geometry
            return []
        first, second = position_geometry(layer.attention, ctx), position_geometry(self.mixer, ctx)
        shape = [(g.n_heads, g.head_dim) if g is not None else None for g in (first, second)]
        if shape[0] != shape[1]:
            return [
                (
                    "mixer",
                    f"the second mixer's position geometry (heads, rotated width) {shape[1]} differs from the block "
                    f"mixer's {shape[0]}: the layer's one position scheme rotates both; give the second mixer the "
                    "block mixer's heads and head width (LongCat-Flash: the same config)",
                )
            ]
        return []


class ShortcutMoEBlock(nn.Module):
    """Two sublayer pairs and a shortcut branch across them (see the module docstring for the math).

    ``forward(x [batch, seq, d_model], inputs) -> (y [batch, seq, d_model], aux_loss or None)``. Attributes:
    ``attention``, ``attention_2`` (the mixers), ``dense``, ``dense_2`` (the dense FFNs), ``ffn`` (the shortcut
    branch, or ``None``: the block has no ffn) and the four norms ``attn_norm``, ``ffn_norm``, ``attn_2_norm``,
    ``ffn_2_norm``.

    Raises:
        ValueError: the block has no token mixer (the ``none`` mixer): the second pair's mixer would have no
            position geometry to share.
    """

    def __init__(self, cfg: ShortcutMoEConfig, ctx: BuildContext):
        super().__init__()
        if getattr(ctx.attention, "modkit_type", None) == "none":
            raise ValueError(
                "placement 'shortcut-moe' needs a token mixer in the block (its second mixer shares the block "
                "mixer's position scheme), got the mixer 'none'; give block.attention a mixer or use placement 'pre'"
            )
        self.drop = dropout(ctx.residual_dropout)
        # a mixer holding its own norm (capability own_norm: side_input) reads the stream itself
        self.attn_norm = nn.Identity() if owns_norm(ctx.attention) else ctx.build(ctx.norm)
        self.attention = ctx.attention
        self.ffn_norm = ctx.build(ctx.norm)
        self.dense = ctx.build(cfg.dense)
        self.ffn = ctx.ffn
        own = ctx.registry.entry_for_config(cfg.mixer).capabilities.get("own_norm")
        self.attn_2_norm = nn.Identity() if own else ctx.build(ctx.norm)
        self.attention_2 = ctx.build(cfg.mixer)
        self.ffn_2_norm = ctx.build(ctx.norm)
        self.dense_2 = ctx.build(cfg.dense)
        stream = stream_of(ctx)  # a block-scope stream (Gemma 3n's AltUp) is read before and written after the layer
        self.stream_link = stream.block_connection(ctx) if getattr(stream, "scope", None) == "block" else None
        self.layer_index = ctx.layer_index

    def forward(self, x: Tensor, inputs: AttentionInputs) -> tuple[Tensor, Optional[Tensor]]:
        """Returns ``(y [batch, seq, d_model], aux_loss or None)``: the shortcut branch's and the dense FFNs' aux
        losses summed. On a block-scope stream ``x`` and ``y`` are ``[batch, seq, n_streams, d_model]``: the layer
        runs on what the stream's connection reads and hands it its output (:mod:`modkit.nn.stream`)."""
        if self.stream_link is None:
            return self._run(x, inputs)
        u, state = self.stream_link.read(x)
        y, aux = self._run(u, inputs)
        return self.stream_link.write(x, state, y, layer_input(inputs, self.layer_index)), aux

    def _run(self, x: Tensor, inputs: AttentionInputs) -> tuple[Tensor, Optional[Tensor]]:
        """The layer on the plain stream ``x [batch, seq, d_model]``: the module docstring's formula."""
        h = x + self.drop(self.attention(self.attn_norm(x), inputs))
        u = self.ffn_norm(h)
        shortcut, aux = run_ffn(self.ffn, u, inputs) if self.ffn is not None else (None, None)
        d1, aux1 = run_ffn(self.dense, u, inputs)
        h = h + self.drop(d1)
        h = h + self.drop(self.attention_2(self.attn_2_norm(h), inputs))
        d2, aux2 = run_ffn(self.dense_2, self.ffn_2_norm(h), inputs)
        y = h + self.drop(d2)
        if shortcut is not None:
            y = y + self.drop(shortcut)
        return y, add_aux(add_aux(aux, aux1), aux2)


_MATH = r"""$$h_1 = x + A_1(N_1(x)),\quad u = N_2(h_1),\quad h_2 = h_1 + D_1(u),\quad h_3 = h_2 + A_2(N_3(h_2)),$$
$$y = h_3 + D_2(N_4(h_3)) + S(u)$$

$A_1$, $S$: the block's mixer and ffn (the shortcut branch: LongCat-Flash's mixture of experts); $A_2$ = mixer and
$D_1, D_2$ = two copies of dense from the placement's config; $N_1 \ldots N_4$ = attn_norm, ffn_norm, attn_2_norm,
ffn_2_norm. $S$ reads the first pair's ffn input and is added after the second pair, so its dispatch overlaps
$D_1$, $A_2$ and $D_2$."""


@hookimpl
def register_components(register) -> None:
    """Register the ``shortcut-moe`` placement."""
    register(
        Component(
            kind="placement",
            type="shortcut-moe",
            config=ShortcutMoEConfig,
            factory=lambda cfg, ctx: ShortcutMoEBlock(cfg, ctx),
            description="LongCat-Flash's layer: two pre-norm sublayer pairs (the block's mixer with a dense FFN, then "
            "a second mixer with a second dense FFN) and the block's ffn as a shortcut branch that reads the first "
            "pair's ffn input and is added after the second pair. Four norms. [batch, seq, d_model] -> [batch, seq, "
            "d_model]; the second mixer keeps its own cache state (attention_2).",
            reference="Meituan LongCat Team 2025, LongCat-Flash Technical Report, arXiv:2509.01322 §2.1; Cai et al. "
            "2024, ScMoE, arXiv:2404.05019; transformers LongcatFlashDecoderLayer",
            math=_MATH,
            capabilities={"compile_safe": True, "residual_dropout": True, "block_streams": True},
            # the sublayers it builds (ctx.build) declare their own FLOPs; the block itself only adds residuals
            flops=elementwise("a placement adds residuals around sublayers that declare their own FLOPs: element-wise"),
            example={
                "type": "shortcut-moe",
                "mixer": {"type": "gqa", "n_heads": 4, "n_kv_heads": 2},
                "dense": {"type": "swiglu", "d_ff": 64},
            },
        )
    )

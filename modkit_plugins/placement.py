"""Placements: how a block composes its norms, sublayers and residuals. ``[batch, seq, d_model]`` in and out.

Every placement builds the norms it needs from the block's norm config and returns a block module with
``forward(x, inputs) -> (x, aux_loss | None)``; the ffn may return ``(out, aux_loss)`` (MoE). ``attn`` below is the
block's token mixer, whatever its kind (an attention, Mamba-2, Gated DeltaNet, mixers side by side): every mixer is
called ``mixer(x, inputs)``. A block without an ffn (``"ffn": null``, Mamba-2) has only the mixer's half, and
builds no ffn norm; a block whose mixer is ``none`` (capability ``absent``, :mod:`modkit_plugins.no_mixer`) has only
the ffn's half, and builds no mixer norm; a mixer that normalises its own input (capability ``own_norm``: ``side_input``,
:mod:`modkit_plugins.hybrid`) reads the residual stream itself: an identity stands in place of an ``attn_norm`` that
feeds the mixer (``pre``, ``sandwich``, ``parallel``, whose shared norm still feeds the ffn), ``post`` keeps its norm
after the addition, and ``deepnorm``, whose normalised stream is also the residual, refuses such a mixer.

* ``pre``:       ``x = x + attn(attn_norm(x)); x = x + ffn(ffn_norm(x))`` (GPT-2, Llama).
* ``post``:      ``x = attn_norm(x + attn(x)); x = ffn_norm(x + ffn(x))`` (original Transformer, BERT).
* ``sandwich`` (alias ``peri``): ``x = x + attn_post_norm(attn(attn_norm(x))); x = x + ffn_post_norm(ffn(ffn_norm(x)))``:
  norms on each sublayer's input and output, inside the residual (Gemma 2/3). Kim et al. 2025 call this placement
  Peri-LN.
* ``reordered`` (alias ``olmo2``): ``x = x + attn_post_norm(attn(x)); x = x + ffn_post_norm(ffn(x))``: a norm on
  each sublayer's output only (OLMo 2's "reordered norm").
* ``parallel``:  ``x = x + attn(attn_norm(x)) + ffn(n2(x))`` with ``n2 = attn_norm`` when ``shared_norm``
  (GPT-J, Falcon, Phi) else a separate ``ffn_norm`` (GPT-NeoX ``use_parallel_residual``).
* ``deepnorm``:  ``h = attn_norm(x); x = α_a·h + β_a·attn(h); h = ffn_norm(x); x = α_f·h + β_f·ffn(h)``: the residual
  is the normalised stream, scaled (DeepNet's post-norm ``N(α x + G(x))`` with its norms moved to the sublayer
  inputs: the model's final_norm closes the last block; MiniMax-01's decoder layer).
* ``pre-no-residual``: ``x = attn(attn_norm(x)); x = ffn(ffn_norm(x))``: ``pre`` with both residual adds removed.
  An ablation for experiments (what the residual stream buys, He et al. 2016), not a placement for real models:
  without the identity path the signal and its gradient must pass through every sublayer, and deep stacks train
  badly or not at all.

Earlier modkit versions used ``peri`` for OLMo 2's output-only placement (now ``reordered``). In the literature Peri-LN
puts a norm on both the input and the output of each sublayer, which is ``sandwich``, so ``peri`` is now an alias of
``sandwich``; a spec using it gets a :class:`modkit.SpecWarning` saying so (a spec written for the old meaning must
say ``reordered``).

Every placement applies the spec's ``dropout.residual`` (``BuildContext.residual_dropout``) to what each sublayer
adds to the residual stream (after a post-sublayer norm, where there is one), in training mode only: GPT-2's
``resid_pdrop`` (nanoGPT's ``resid_dropout`` and MLP dropout).

Every placement with a residual (all but ``pre-no-residual``) has ``residual_multiplier`` (default 1): what each
sublayer adds to the residual stream is multiplied by it, ``x + m · f(x)`` (Granite's ``residual_multiplier``,
transformers ``GraniteDecoderLayer``; a μP-style depth scaling). At 1 no operation is added.

References: pre-norm, Xiong et al. 2020, On Layer Normalization in the Transformer Architecture
(arXiv:2002.04745); post-norm, Vaswani et al. 2017 (arXiv:1706.03762); sandwich, Gemma Team 2024, Gemma 2
(arXiv:2408.00118), and as Peri-LN, Kim et al. 2025, Peri-LN: Revisiting Normalization Layer in the Transformer
Architecture (arXiv:2502.02732); reordered, OLMo Team 2024, 2 OLMo 2 Furious (arXiv:2501.00656) §3.2; parallel,
Wang & Komatsuzaki 2021 (GPT-J) and Chowdhery et al. 2022, PaLM (arXiv:2204.02311) §2; residual connections, He et
al. 2016, Deep Residual Learning for Image Recognition (arXiv:1512.03385).
"""

from __future__ import annotations

import math
from typing import Callable, Literal, Optional

from pydantic import Field
from torch import Tensor, nn

from modkit_plugins.no_mixer import is_absent, owns_norm
from modkit.plugin import (
    AttentionInputs,
    BuildContext,
    Component,
    ComponentConfig,
    dropout,
    elementwise,
    hookimpl,
    layer_input,
    MAX_MULTIPLIER,
    Multiplier,
    placement_stream_flops,
    run_ffn,
    stream_of,
)


#: a sublayer as a block runs it: ``h [b, s, d] -> (out [b, s, d], aux_loss or None)``
_Sublayer = Callable[[Tensor], tuple[Tensor, Optional[Tensor]]]


class _ResidualConfig(ComponentConfig):
    """Fields of every placement with a residual stream."""

    residual_multiplier: Multiplier = Field(
        1.0,
        description="multiply what each sublayer adds to the residual stream: x + residual_multiplier · "
        f"sublayer(...) (Granite's residual_multiplier: 0.22); 1 for the plain residual. At most {MAX_MULTIPLIER:g}, "
        "far above published values, so the residual stream stays finite",
    )


class PreConfig(_ResidualConfig):
    """Config of ``pre``: a norm before each sublayer, residual around it."""

    type: Literal["pre"] = "pre"


class PostConfig(_ResidualConfig):
    """Config of ``post``: residual first, then a norm after each sublayer (original Transformer, BERT)."""

    type: Literal["post"] = "post"


class SandwichConfig(_ResidualConfig):
    """Config of ``sandwich`` (alias ``peri``): a norm before and after each sublayer, inside the residual (Gemma 2/3;
    Peri-LN in Kim et al. 2025; GLM-4's input / post_self_attn / post_attention / post_mlp layernorms), and
    optionally a LAuReL residual around the mixer (Gemma 3n)."""

    type: Literal["sandwich"] = "sandwich"
    laurel_rank: Optional[int] = Field(
        None,
        ge=1,
        le=1 << 16,
        description="a learned low-rank residual (LAuReL) around the mixer of this rank: x' = (x + attn_post_norm("
        "attn(h)) + h + laurel_norm(right(left(h)))) / sqrt(2), h = attn_norm(x) (Gemma 3n's laurel_rank: 64); "
        "null: none",
    )


class ReorderedConfig(_ResidualConfig):
    """Config of ``reordered`` (alias ``olmo2``): a norm on each sublayer's output only, inside the residual (OLMo 2)."""

    type: Literal["reordered"] = "reordered"


class DeepNormConfig(ComponentConfig):
    """Config of ``deepnorm``: a norm before each sublayer whose output is also the residual, scaled (MiniMax-01)."""

    type: Literal["deepnorm"] = "deepnorm"
    attn_alpha: Multiplier = Field(
        1.0,
        description="α_a: the normalised stream's weight around the mixer (MiniMax's "
        "full_attn_alpha_factor / linear_attn_alpha_factor; 3.557 in MiniMax-Text-01)",
    )
    attn_beta: Multiplier = Field(1.0, description="β_a: the mixer output's weight (full/linear_attn_beta_factor)")
    ffn_alpha: Multiplier = Field(
        1.0, description="α_f: the normalised stream's weight around the ffn (mlp_alpha_factor)"
    )
    ffn_beta: Multiplier = Field(1.0, description="β_f: the ffn output's weight (mlp_beta_factor)")

    def check_layer(self, layer, ctx) -> list[tuple[str, str]]:
        """A mixer that normalises its own input (capability ``own_norm``) is refused: deepnorm's ``attn_norm``
        output is both the mixer's input and the residual, so it can neither be dropped nor kept."""
        entry = ctx.registry.entry_for_config(layer.attention)
        if not entry.capabilities.get("own_norm"):
            return []
        return [("", f"{OWN_NORM_REFUSAL.format(type=entry.type)}; use placement 'pre' or 'sandwich'")]


#: why ``deepnorm`` refuses a mixer that declares ``own_norm`` (:meth:`DeepNormConfig.check_layer`)
OWN_NORM_REFUSAL = (
    "placement 'deepnorm' takes the normalised stream as the residual, but mixer {type!r} declares own_norm (it reads "
    "the stream unnormalised and holds its own norm)"
)


class PreNoResidualConfig(ComponentConfig):
    """Config of ``pre-no-residual``: ``pre`` without the residual adds. An ablation for experiments, not for real
    models."""

    type: Literal["pre-no-residual"] = "pre-no-residual"


class ParallelConfig(_ResidualConfig):
    """Config of ``parallel``: attention and ffn read the same block input and are added to one residual."""

    type: Literal["parallel"] = "parallel"
    shared_norm: bool = Field(
        True,
        description="true: one norm feeds both sublayers (GPT-J, Falcon-7B, Phi); false: separate attn_norm and "
        "ffn_norm (GPT-NeoX use_parallel_residual)",
    )


class _Residual(nn.Module):
    """What every block with a residual shares: the residual dropout and the residual multiplier."""

    def __init__(self, cfg: Optional[ComponentConfig], ctx: BuildContext):
        super().__init__()
        self.drop = dropout(ctx.residual_dropout)
        self.residual_multiplier = float(getattr(cfg, "residual_multiplier", 1.0))

    def _add(self, h: Tensor) -> Tensor:
        """What a sublayer output ``h`` adds to the residual stream: ``dropout(h) · residual_multiplier``."""
        h = self.drop(h)
        return h if self.residual_multiplier == 1.0 else h * self.residual_multiplier


class _Block(_Residual):
    """A block that runs its mixer, then its ffn, each wrapped by :meth:`_sublayer`, the one thing a placement
    writes; a block without an ffn (Mamba-2) is its mixer's half alone. ``[b, s, d] -> ([b, s, d], aux)``.

    The modules are built in the order :attr:`parts` names them, which is the order of the block's parameters
    (state_dict keys) and of their initialisation.
    """

    #: the block's modules in order: ``attention``, ``ffn`` and the norms (``attn_*``, ``ffn_*``), see :meth:`_part`
    parts: tuple[str, ...] = ()
    #: whether ``attn_norm`` normalises the mixer's input (pre, sandwich, parallel), so that a mixer holding its own
    #: norm (capability ``own_norm``) gets an identity there; ``post``'s normalises the stream after the addition
    attn_norm_feeds_mixer: bool = True

    def __init__(self, ctx: BuildContext, cfg: Optional[ComponentConfig] = None):
        super().__init__(cfg, ctx)
        #: the mixer is 'none' (capability ``absent``): the block is its ffn alone (decided once, not per forward)
        self.mixer_absent = is_absent(ctx.attention)
        for name in self.parts:
            setattr(self, name, self._part(name, ctx, cfg))
        stream = stream_of(ctx)  # a block-scope stream (Gemma 3n's AltUp) is read before and written after the block
        #: the connection of a ``"block"``-scope residual stream around the whole block (:mod:`modkit.nn.stream`)
        self.stream_link = stream.block_connection(ctx) if getattr(stream, "scope", None) == "block" else None
        self.layer_index = ctx.layer_index

    def forward(self, x: Tensor, inputs: AttentionInputs) -> tuple[Tensor, Optional[Tensor]]:
        """Returns ``(x, aux_loss or None)``: ``x [batch, seq, d_model]``, or ``[batch, seq, n_streams, d_model]`` on
        a block-scope stream, which the block reads before and writes after running as on a plain stream."""
        link = self.stream_link
        if link is None:
            return self._run(x, inputs)
        u, state = link.read(x)  # x: [b, s, n_streams, d]; u: [b, s, d]
        y, aux = self._run(u, inputs)
        return link.write(x, state, y, layer_input(inputs, self.layer_index)), aux

    def _part(self, name: str, ctx: BuildContext, cfg: Optional[ComponentConfig]) -> Optional[nn.Module]:
        """The module ``name`` stands for: the block's ``attention`` (its token mixer) or ``ffn`` as built, or a
        norm built from the block's norm config; an ``ffn_*`` norm is ``None`` in a block without an ffn, an
        ``attn_*`` norm ``None`` in a block whose mixer is ``none`` (capability ``absent``)."""
        if name == "attention":
            return ctx.attention
        if name == "ffn":
            return ctx.ffn
        if name.startswith("ffn_") and ctx.ffn is None:
            return None
        if name.startswith("attn_") and is_absent(ctx.attention):
            return None
        if name == "attn_norm" and self.attn_norm_feeds_mixer and owns_norm(ctx.attention):
            return nn.Identity()  # the mixer normalises its own input
        return ctx.build(ctx.norm)

    def _sublayer(self, x: Tensor, side: str, run: _Sublayer) -> tuple[Tensor, Optional[Tensor]]:
        """The residual stream ``x [b, s, d]`` after the sublayer ``run`` (``h -> (out, aux or None)``) of ``side``
        (``"attn"`` or ``"ffn"``, which names its norms: ``{side}_norm``, ``{side}_post_norm``)."""
        raise NotImplementedError

    def _run(self, x: Tensor, inputs: AttentionInputs) -> tuple[Tensor, Optional[Tensor]]:
        """The block on the plain stream: ``(x [batch, seq, d_model], aux_loss or None)``."""
        if not self.mixer_absent:  # the mixer 'none': the block is its ffn alone
            x, _ = self._sublayer(x, "attn", lambda h: (self.attention(h, inputs), None))
        if self.ffn is None:  # a block that is a mixer alone (Mamba-2)
            return x, None
        return self._sublayer(x, "ffn", lambda h: run_ffn(self.ffn, h, inputs))


class PreNormBlock(_Block):
    """``x + m · attention(attn_norm(x))`` then ``x + m · ffn(ffn_norm(x))`` (``m`` = residual_multiplier, 1 by
    default). ``[b, s, d] -> ([b, s, d], aux)``."""

    parts = ("attn_norm", "attention", "ffn_norm", "ffn")

    def __init__(self, ctx: BuildContext, cfg: Optional[ComponentConfig] = None):
        super().__init__(ctx, cfg)
        stream = stream_of(ctx)  # a residual stream of several copies: one connection per sublayer
        if stream is not None and stream.scope == "sublayer":
            self.attn_hc = stream.connection() if not self.mixer_absent else None
            self.ffn_hc = stream.connection() if self.ffn is not None else None

    def _sublayer(self, x: Tensor, side: str, run: _Sublayer) -> tuple[Tensor, Optional[Tensor]]:
        connection = getattr(self, f"{side}_hc", None)
        if connection is None:  # the plain residual stream
            h, aux = run(getattr(self, f"{side}_norm")(x))
            return x + self._add(h), aux
        u, state = connection.read(x)  # x: [b, s, n_streams, d]; u: [b, s, d]
        h, aux = run(getattr(self, f"{side}_norm")(u))
        return connection.write(x, state, self._add(h)), aux


class PostNormBlock(_Block):
    """``attn_norm(x + m · attention(x))`` then ``ffn_norm(x + m · ffn(x))`` (Vaswani et al. 2017; ``m`` =
    residual_multiplier). ``[b, s, d] -> ([b, s, d], aux)``."""

    parts = ("attention", "attn_norm", "ffn", "ffn_norm")
    #: the mixer reads the stream itself; attn_norm normalises the sum after it, whatever the mixer holds
    attn_norm_feeds_mixer = False

    def _sublayer(self, x: Tensor, side: str, run: _Sublayer) -> tuple[Tensor, Optional[Tensor]]:
        h, aux = run(x)
        return getattr(self, f"{side}_norm")(x + self._add(h)), aux


class Laurel(nn.Module):
    """LAuReL, a learned low-rank residual: ``h + norm(right(left(h)))`` of ``h [b, s, d]`` (``left [rank, d]``,
    ``right [d, rank]``, no biases). Menghani et al. 2024, LAuReL: Learned Augmented Residual Layer,
    arXiv:2411.07501 (the low-rank form); transformers ``Gemma3nTextLaurelBlock``."""

    def __init__(self, d_model: int, rank: int, norm: nn.Module):
        super().__init__()
        self.left = nn.Linear(d_model, rank, bias=False)
        self.right = nn.Linear(rank, d_model, bias=False)
        self.norm = norm

    def forward(self, h: Tensor) -> Tensor:
        """``h + norm(right(left(h)))``: ``[b, s, d] -> [b, s, d]``."""
        return h + self.norm(self.right(self.left(h)))


class SandwichNormBlock(_Block):
    """``x + attn_post_norm(attention(attn_norm(x)))`` then ``x + ffn_post_norm(ffn(ffn_norm(x)))`` (Gemma 2;
    GLM-4's ``Glm4DecoderLayer``: input, post_self_attn, post_attention and post_mlp layernorms in that order).

    ``[b, s, d] -> ([b, s, d], aux)``; each addition times residual_multiplier. With ``laurel_rank`` (Gemma 3n's
    ``Gemma3nTextDecoderLayer``) the mixer's half is ``(x + attn_post_norm(attention(h)) + laurel(h)) / sqrt(2)``,
    ``h = attn_norm(x)`` (:class:`Laurel`).
    """

    parts = ("attn_norm", "attention", "attn_post_norm", "ffn_norm", "ffn", "ffn_post_norm")

    def __init__(self, ctx: BuildContext, cfg: Optional[SandwichConfig] = None):
        super().__init__(ctx, cfg)
        rank = getattr(cfg, "laurel_rank", None)
        self.laurel = Laurel(ctx.d_model, rank, ctx.build(ctx.norm)) if rank and not self.mixer_absent else None

    def _sublayer(self, x: Tensor, side: str, run: _Sublayer) -> tuple[Tensor, Optional[Tensor]]:
        h = getattr(self, f"{side}_norm")(x)
        out, aux = run(h)
        out = x + self._add(getattr(self, f"{side}_post_norm")(out))
        if side == "attn" and self.laurel is not None:
            out = (out + self.laurel(h)) / math.sqrt(2)
        return out, aux


class ReorderedNormBlock(_Block):
    """``x + attn_post_norm(attention(x))`` then ``x + ffn_post_norm(ffn(x))`` (OLMo 2; each addition times
    residual_multiplier). ``[b, s, d] -> ([b, s, d], aux)``."""

    parts = ("attention", "attn_post_norm", "ffn", "ffn_post_norm")

    def _sublayer(self, x: Tensor, side: str, run: _Sublayer) -> tuple[Tensor, Optional[Tensor]]:
        h, aux = run(x)
        return x + self._add(getattr(self, f"{side}_post_norm")(h)), aux


class DeepNormBlock(_Block):
    """``h = attn_norm(x)``, ``x' = α_a·h + β_a·attention(h)``, then ``h' = ffn_norm(x')``, ``y = α_f·h' + β_f·ffn(h')``.
    ``[b, s, d] -> ([b, s, d], aux)``.

    The residual is the normalised stream (transformers ``MiniMaxDecoderLayer``: ``hidden_states =
    input_layernorm(hidden_states); residual = hidden_states``), which is DeepNet's post-norm ``N(α x + β G(x))`` (Wang
    et al. 2022) with each norm moved from a sublayer's output to the next sublayer's input (the model's final_norm
    closes the last block). The modules are ``pre``'s, so are its parameter names; dropout applies to what each
    sublayer adds.
    """

    parts = PreNormBlock.parts

    def __init__(self, cfg: DeepNormConfig, ctx: BuildContext):
        """Raises:
        ValueError: the block's mixer declares ``own_norm`` (spec validation refuses it first, naming the layers)."""
        if owns_norm(ctx.attention):
            raise ValueError(OWN_NORM_REFUSAL.format(type=getattr(ctx.attention, "modkit_type", "?")))
        super().__init__(ctx, cfg)
        self.scales = {
            "attn": (float(cfg.attn_alpha), float(cfg.attn_beta)),
            "ffn": (float(cfg.ffn_alpha), float(cfg.ffn_beta)),
        }

    def _sublayer(self, x: Tensor, side: str, run: _Sublayer) -> tuple[Tensor, Optional[Tensor]]:
        alpha, beta = self.scales[side]
        h = getattr(self, f"{side}_norm")(x)
        out, aux = run(h)
        out = self.drop(out)
        return (h if alpha == 1.0 else alpha * h) + (out if beta == 1.0 else beta * out), aux


class PreNormNoResidualBlock(PreNormBlock):
    """``attention(attn_norm(x))`` then ``ffn(ffn_norm(x))``: a pre-norm block with no residual adds.

    ``[b, s, d] -> ([b, s, d], aux)``. An ablation for experiments (He et al. 2016, arXiv:1512.03385, measure what the
    identity shortcut buys), not a placement for real models: each block's output is its ffn's output alone, so the
    embeddings reach the head only through every sublayer in turn. The spec's ``dropout.residual`` applies to each
    sublayer's output, as in ``pre`` (there it is what the sublayer adds to the stream). The modules are ``pre``'s,
    so its parameter names and counts are too.
    """

    def _sublayer(self, x: Tensor, side: str, run: _Sublayer) -> tuple[Tensor, Optional[Tensor]]:
        h, aux = run(getattr(self, f"{side}_norm")(x))
        return self.drop(h), aux


class ParallelBlock(_Block):
    """``x + attention(attn_norm(x)) + ffn(n2(x))``, ``n2`` = ``attn_norm`` (shared) or ``ffn_norm``.

    GPT-J / Falcon / Phi / Cohere (shared) and GPT-NeoX ``use_parallel_residual`` (separate); both additions times
    residual_multiplier. ``[b, s, d] -> ([b, s, d], aux)``.
    """

    parts = PreNormBlock.parts

    def __init__(self, cfg: ParallelConfig, ctx: BuildContext):
        super().__init__(ctx, cfg)
        self.shared_norm = cfg.shared_norm

    def _part(self, name: str, ctx: BuildContext, cfg: Optional[ComponentConfig]) -> Optional[nn.Module]:
        """As :meth:`_Block._part`, but no ``ffn_norm`` with ``shared_norm``: ``attn_norm`` feeds both sublayers
        (so it is built for the ffn even when the mixer is ``none``)."""
        if name == "ffn_norm" and cfg.shared_norm:
            return None
        if name == "attn_norm" and cfg.shared_norm and ctx.ffn is not None:
            return ctx.build(ctx.norm)
        return super()._part(name, ctx, cfg)

    def _run(self, x: Tensor, inputs: AttentionInputs) -> tuple[Tensor, Optional[Tensor]]:
        """Returns ``(x [batch, seq, d_model], aux_loss or None)``."""
        if self.mixer_absent:  # the mixer 'none': the ffn alone
            if self.ffn is None:
                return x, None
            norm = self.attn_norm if self.attn_norm is not None else self.ffn_norm
            h, aux = run_ffn(self.ffn, norm(x), inputs)
            return x + self._add(h), aux
        h_attn = self.attn_norm(x)
        if self.ffn is None:
            return x + self._add(self.attention(h_attn, inputs)), None
        h_ffn = h_attn if self.ffn_norm is None else self.ffn_norm(x)
        h, aux = run_ffn(self.ffn, h_ffn, inputs)
        # a mixer holding its own norm reads the stream itself, also where the shared norm feeds the ffn
        mixer_in = x if self.shared_norm and owns_norm(self.attention) else h_attn
        return x + self._add(self.attention(mixer_in, inputs)) + self._add(h), aux


#: what a spec using ``peri`` is told (the name changed meaning; see the module docstring)
PERI_NOTE = (
    "placement 'peri' is read as 'sandwich': Peri-LN (Kim et al. 2025, arXiv:2502.02732) puts a norm on the input and "
    "on the output of each sublayer. Earlier modkit versions used 'peri' for OLMo 2's norm on the sublayer output "
    "only, now called 'reordered': write 'reordered' if the spec was written for that, or 'sandwich' to silence this warning"
)


#: Key formulas of the docs pages (pymdownx.arithmatex): one block of input $x$, output $y$.
_MATH = {
    "pre": r"""$$h = x + m\,\mathrm{Attn}(N_1(x)), \qquad y = h + m\,\mathrm{FFN}(N_2(h))$$

$N_1$ = attn_norm and $N_2$ = ffn_norm normalise each sublayer's input; the residual stream itself is never
normalised (the model applies final_norm after the last block). $m$ = residual_multiplier (1 by default; Granite).""",
    "post": r"""$$h = N_1\big(x + m\,\mathrm{Attn}(x)\big), \qquad y = N_2\big(h + m\,\mathrm{FFN}(h)\big)$$

$N_1$ = attn_norm, $N_2$ = ffn_norm normalise the residual stream after each addition; $m$ = residual_multiplier.""",
    "sandwich": r"""$$h = x + m\,N_2\big(\mathrm{Attn}(N_1(x))\big), \qquad y = h + m\,N_4\big(\mathrm{FFN}(N_3(h))\big)$$

$N_1$ = attn_norm, $N_2$ = attn_post_norm, $N_3$ = ffn_norm, $N_4$ = ffn_post_norm: each sublayer's input and
output are normalised, inside the residual (GLM-4's input, post_self_attn, post_attention and post_mlp layernorms).
$m$ = residual_multiplier.""",
    "reordered": r"""$$h = x + m\,N_1\big(\mathrm{Attn}(x)\big), \qquad y = h + m\,N_2\big(\mathrm{FFN}(h)\big)$$

$N_1$ = attn_post_norm, $N_2$ = ffn_post_norm normalise each sublayer's output; the sublayers read the raw residual
stream. $m$ = residual_multiplier.""",
    "parallel": r"""$$y = x + m\,\mathrm{Attn}(N_1(x)) + m\,\mathrm{FFN}(N_2(x))$$

$N_1$ = attn_norm; $N_2 = N_1$ with shared_norm (one norm per block: GPT-J, Cohere), else ffn_norm (GPT-NeoX).
Both sublayers read the same input, so they can run concurrently. $m$ = residual_multiplier.""",
}

_MATH["deepnorm"] = r"""$$h_1 = N_1(x),\quad h = \alpha_a h_1 + \beta_a\,\mathrm{Attn}(h_1), \qquad h_2 = N_2(h),\quad
y = \alpha_f h_2 + \beta_f\,\mathrm{FFN}(h_2)$$

$N_1$ = attn_norm, $N_2$ = ffn_norm; the residual is the normalised stream. Across blocks this is DeepNet's post-norm
$x_{l+1} = N(\alpha x_l + \beta G(x_l))$ with every norm moved to the next sublayer's input (final_norm closes the last
block)."""

#: each placement's entry, less what they share (kind, math, capabilities, FLOPs): see :func:`register_components`
_ENTRIES = (
    dict(
        type="pre",
        config=PreConfig,
        factory=lambda cfg, ctx: PreNormBlock(ctx, cfg),
        description="Pre-norm residual block: x + attn(norm(x)), then x + ffn(norm(x)). Two norms per block "
        "(attn_norm, ffn_norm). [batch, seq, d_model] -> [batch, seq, d_model].",
        reference="Xiong et al. 2020, On Layer Normalization in the Transformer Architecture, arXiv:2002.04745",
    ),
    dict(
        type="post",
        config=PostConfig,
        factory=lambda cfg, ctx: PostNormBlock(ctx, cfg),
        description="Post-norm residual block: attn_norm(x + attn(x)), then ffn_norm(x + ffn(x)). Two norms per "
        "block; the block output is normalised. [batch, seq, d_model] -> [batch, seq, d_model].",
        reference="Vaswani et al. 2017, Attention Is All You Need, arXiv:1706.03762; BERT, arXiv:1810.04805",
    ),
    dict(
        type="sandwich",
        config=SandwichConfig,
        factory=lambda cfg, ctx: SandwichNormBlock(ctx, cfg),
        description="Sandwich norm (Peri-LN): x + attn_post_norm(attn(attn_norm(x))), then "
        "x + ffn_post_norm(ffn(ffn_norm(x))): a norm on the input and on the output of each sublayer, inside the "
        "residual. Four norms per block. [batch, seq, d_model] -> [batch, seq, d_model].",
        reference="Gemma Team 2024, Gemma 2: Improving Open Language Models at a Practical Size, arXiv:2408.00118; "
        "as Peri-LN: Kim et al. 2025, Peri-LN: Revisiting Normalization Layer in the Transformer Architecture, "
        "arXiv:2502.02732",
        aliases=("peri",),
        alias_notes={"peri": PERI_NOTE},
        example={"type": "sandwich", "laurel_rank": 4},
    ),
    dict(
        type="reordered",
        config=ReorderedConfig,
        factory=lambda cfg, ctx: ReorderedNormBlock(ctx, cfg),
        description="Reordered norm (OLMo 2): x + attn_post_norm(attn(x)), then x + ffn_post_norm(ffn(x)); a norm "
        "on each sublayer's output only, inside the residual, so the sublayers read the raw residual stream. Two "
        "norms per block. [batch, seq, d_model] -> [batch, seq, d_model].",
        reference="OLMo Team 2024, 2 OLMo 2 Furious, arXiv:2501.00656, §3.2 (reordered norm)",
        aliases=("olmo2",),
    ),
    dict(
        type="parallel",
        config=ParallelConfig,
        factory=lambda cfg, ctx: ParallelBlock(cfg, ctx),
        description="Parallel block: x + attn(attn_norm(x)) + ffn(n2(x)), n2 = attn_norm when shared_norm "
        "(one norm per block) else ffn_norm (two). [batch, seq, d_model] -> [batch, seq, d_model].",
        reference="Wang & Komatsuzaki 2021, GPT-J-6B (github.com/kingoflolz/mesh-transformer-jax); Chowdhery et al. "
        "2022, PaLM, arXiv:2204.02311",
        example={"type": "parallel", "shared_norm": True},
    ),
    dict(
        type="deepnorm",
        config=DeepNormConfig,
        factory=lambda cfg, ctx: DeepNormBlock(cfg, ctx),
        description="DeepNorm-style block with the residual taken after the norm (MiniMax-01): h = attn_norm(x), "
        "x = attn_alpha * h + attn_beta * attn(h), then h = ffn_norm(x), x = ffn_alpha * h + ffn_beta * ffn(h). Two "
        "norms per block. [batch, seq, d_model] -> [batch, seq, d_model].",
        reference="Wang et al. 2022, DeepNet: Scaling Transformers to 1,000 Layers, arXiv:2203.00555; MiniMax et al. "
        "2025, MiniMax-01, arXiv:2501.08313; transformers MiniMaxDecoderLayer",
        example={"type": "deepnorm", "attn_alpha": 2.0, "ffn_alpha": 2.0},
    ),
    dict(
        type="pre-no-residual",
        config=PreNoResidualConfig,
        factory=lambda cfg, ctx: PreNormNoResidualBlock(ctx),
        description="Ablation, not for real models: a pre-norm block without residual adds, x = attn(attn_norm(x)), "
        "then x = ffn(ffn_norm(x)). Two norms per block. For experiments on what residual connections buy. "
        "[batch, seq, d_model] -> [batch, seq, d_model].",
        reference="He et al. 2016, Deep Residual Learning for Image Recognition, arXiv:1512.03385 (the residual it "
        "removes); Xiong et al. 2020, arXiv:2002.04745 (the pre-norm block it ablates)",
    ),
)


def _pre_flops(cfg: PreConfig, ctx: BuildContext, work) -> dict[str, int]:
    """``pre`` adds residuals (element-wise) around sublayers that declare their own FLOPs; on a residual stream of
    several copies, its connections' matrix products (:func:`~modkit.nn.stream.placement_stream_flops`)."""
    return placement_stream_flops(cfg, ctx, work)


def _sandwich_flops(cfg: SandwichConfig, ctx: BuildContext, work) -> dict[str, int]:
    """``sandwich`` adds residuals (element-wise); with ``laurel_rank`` r, LAuReL's two projections ``2 · 2 d r`` per
    token (none in a block whose mixer is ``none``)."""
    if not cfg.laurel_rank or is_absent(ctx.attention):
        return {}
    return {"laurel": work.tokens * 4 * ctx.d_model * cfg.laurel_rank}


@hookimpl
def register_components(register) -> None:
    """Register ``pre``, ``post``, ``sandwich`` (alias ``peri``), ``reordered`` (alias ``olmo2``), ``parallel``,
    ``deepnorm`` and the ``pre-no-residual`` ablation."""
    # every block here is a _Block, which reads and writes a block-scope stream around itself (modkit.nn.stream)
    caps = {"compile_safe": True, "residual_dropout": True, "block_streams": True}
    # the sublayers and norms it composes declare their own FLOPs; the block itself only adds residuals
    flops = elementwise("a placement adds residuals around sublayers that declare their own FLOPs: element-wise")
    ablation_flops = elementwise("the ablation only chains sublayers that declare their own FLOPs (no residual adds)")
    for entry in _ENTRIES:
        register(
            Component(
                kind="placement",
                math=_MATH.get(entry["type"], ""),
                # pre reads and writes a residual stream of several copies (modkit.nn.stream)
                capabilities={**caps, "streams": True} if entry["type"] == "pre" else caps,
                flops={"pre-no-residual": ablation_flops, "pre": _pre_flops, "sandwich": _sandwich_flops}.get(
                    entry["type"], flops
                ),
                **entry,
            )
        )

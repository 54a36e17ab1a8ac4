"""Token mixers side by side in one layer: the ``parallel`` mixer (Falcon-H1's parallel hybrid, Hymba's heads).

``[batch, seq, d_model] -> [batch, seq, d_model]``: every mixer of ``mixers`` reads the layer's (normalised) input,
each scaled by its input multiplier, and their outputs, each scaled by its output multiplier, are summed:

    y = Σ_i m_out_i · mixer_i(m_in_i · x, inputs)

Falcon-H1 runs attention and Mamba-2 this way in every layer, with μP multipliers (``attention_in_multiplier``,
``attention_out_multiplier``, ``ssm_in_multiplier``, ``ssm_out_multiplier``). The mixers are any token mixers (an
attention, a recurrent mixer); each keeps its own state in the layer's cache (keyed by its path,
``attention.mixers.0``, ``attention.mixers.1``: :mod:`modkit.nn.cache`), so a hybrid layer decodes like its parts. Any
placement holds it, as it holds one mixer: the placement contract is unchanged. Document boundaries
(``inputs.documents``) reach every mixer as they are; the layer honours them when each of its mixers declares the
``document_mask`` capability (:func:`modkit.nn.documents.document_mask_problems` looks inside it).

References: Zuo et al. 2025, Falcon-H1: A Family of Hybrid-Head Language Models Redefining Efficiency and Performance
(arXiv:2507.22448), §2 (the parallel hybrid design and its multipliers) and transformers ``FalconH1DecoderLayer``;
Dong et al. 2024, Hymba: A Hybrid-head Architecture for Small Language Models (arXiv:2411.13676).
"""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import Field
from torch import Tensor, nn

from modkit.plugin import (
    AttentionInputs,
    bounded_float,
    BuildContext,
    Component,
    ComponentConfig,
    elementwise,
    hookimpl,
    MAX_MULTIPLIER,
    position_geometry,
    Slot,
)

from .nested_counts import nested_param_count


class ParallelConfig(ComponentConfig):
    """Config of ``parallel``: several token mixers reading the same input, their outputs summed."""

    type: Literal["parallel"] = "parallel"
    mixers: list[ComponentConfig] = Slot(
        "mixer",
        description="the token mixers (attention or recurrent), at least two, in the order their outputs are summed",
    )
    in_multipliers: Optional[list[bounded_float(-MAX_MULTIPLIER, MAX_MULTIPLIER)]] = Field(
        None,
        description="multiplier of each mixer's input (Falcon-H1's ssm_in_multiplier, attention_in_multiplier); "
        f"null for 1 each. Each within ±{MAX_MULTIPLIER:g}, far beyond published values (0.5-2), so activations stay "
        "finite",
    )
    out_multipliers: Optional[list[bounded_float(-MAX_MULTIPLIER, MAX_MULTIPLIER)]] = Field(
        None,
        description="multiplier of each mixer's output (Falcon-H1's ssm_out_multiplier, attention_out_multiplier); "
        f"null for 1 each. Each within ±{MAX_MULTIPLIER:g}, far beyond published values (0.5-2), so activations stay "
        "finite",
    )

    def position_geometry(self, ctx):
        """The geometry of the first mixer that declares one (the attention of an attention + SSM layer)."""
        for m in self.mixers:
            geo = position_geometry(m, ctx)
            if geo is not None and (geo.n_heads or geo.head_dim):
                return geo
        return None

    def check(self, ctx) -> list[tuple[str, str]]:
        """At least two mixers; one multiplier per mixer; no mixer that normalises its own input (capability
        ``own_norm``: ``side_input``), since the placement normalises the hybrid's input for all of them."""
        errors = []
        for j, m in enumerate(self.mixers):
            if ctx.registry.entry_for_config(m).capabilities.get("own_norm"):
                errors.append(
                    (
                        f"mixers[{j}]",
                        f"type {m.type!r} normalises its own input and reads the residual stream itself, but a "
                        "parallel mixer's mixers read the placement's normalised input; give it a layer of its own",
                    )
                )
        if len(self.mixers) < 2:
            errors.append(
                ("mixers", f"a parallel mixer holds at least two mixers, got {len(self.mixers)}; use the mixer itself")
            )
        for name in ("in_multipliers", "out_multipliers"):
            values = getattr(self, name)
            if values is not None and len(values) != len(self.mixers):
                errors.append((name, f"{len(values)} multipliers for {len(self.mixers)} mixers; give one per mixer"))
        return errors


class Parallel(nn.Module):
    """``forward(x [batch, seq, d_model], inputs) = Σ_i out_i · mixers[i](in_i · x, inputs)``.

    Attributes: ``mixers`` (an ``nn.ModuleList``), ``in_multipliers``, ``out_multipliers`` (floats). The attention
    geometry (``n_heads``, ``head_dim``, ``n_kv_heads``) of the first mixer that has one is exposed, for the tools that
    label heads.
    """

    def __init__(self, cfg: ParallelConfig, ctx: BuildContext):
        super().__init__()
        self.mixers = nn.ModuleList([ctx.build(m) for m in cfg.mixers])
        n = len(self.mixers)
        self.in_multipliers = [float(v) for v in (cfg.in_multipliers or [1.0] * n)]
        self.out_multipliers = [float(v) for v in (cfg.out_multipliers or [1.0] * n)]

    def forward(self, x: Tensor, inputs: AttentionInputs) -> Tensor:
        """``x [batch, seq, d_model]`` → ``[batch, seq, d_model]``; each mixer updates its own cached state."""
        out = None
        for mixer, m_in, m_out in zip(self.mixers, self.in_multipliers, self.out_multipliers):
            y = mixer(x if m_in == 1.0 else x * m_in, inputs)
            y = y if m_out == 1.0 else y * m_out
            out = y if out is None else out + y
        return out


def _param_count(cfg: ParallelConfig, ctx: BuildContext) -> int:
    return sum(nested_param_count(m, ctx) for m in cfg.mixers)


_MATH = r"""$$y = \sum_i m^{out}_i\, \mathrm{Mixer}_i\!\left(m^{in}_i\, x\right)$$

Every mixer reads the same (normalised) layer input $x$; $m^{in}_i$ = in_multipliers, $m^{out}_i$ = out_multipliers
(1 by default; Falcon-H1's μP multipliers). Each mixer keeps its own cache state (keys and values for an attention, a
fixed-size state for a recurrent mixer)."""


@hookimpl
def register_components(register) -> None:
    """Register ``parallel``, ``none`` (the empty mixer slot, :mod:`modkit_plugins.no_mixer`) and ``side_input`` (a
    mixer fed a side block's output, Zamba2's hybrid layer: :mod:`modkit_plugins.side_input`), kind ``mixer``."""
    from modkit_plugins.no_mixer import NO_MIXER
    from modkit_plugins.side_input import SIDE_INPUT

    register(NO_MIXER)
    register(SIDE_INPUT)
    register(
        Component(
            kind="mixer",
            type="parallel",
            config=ParallelConfig,
            factory=lambda cfg, ctx: Parallel(cfg, ctx),
            description="Token mixers side by side (Falcon-H1's parallel hybrid: attention and Mamba-2 in every layer): "
            "each reads the same input times its input multiplier, the outputs times their output multipliers are "
            "summed. [batch, seq, d_model] -> [batch, seq, d_model]; each mixer keeps its own cache state.",
            reference="Zuo et al. 2025, Falcon-H1: A Family of Hybrid-Head Language Models, arXiv:2507.22448",
            # document_mask: hands inputs.documents to every mixer; each inner mixer is checked for its own
            capabilities={
                "causal_safe": True,
                "kv_cache": True,
                "compile_safe": True,
                "document_mask": True,
                # no cross-rank scan: a shard of the sequence would start from a zero state
                "context_parallel": False,
            },
            param_count=_param_count,
            flops=elementwise(
                "sums the outputs of mixers that declare their own FLOPs (the multipliers are element-wise)"
            ),
            math=_MATH,
            example={
                "type": "parallel",
                "mixers": [
                    {"type": "gqa", "n_heads": 4, "n_kv_heads": 2},
                    {"type": "mamba2", "d_state": 8, "head_dim": 8, "chunk_size": 4},
                ],
                "in_multipliers": [1.0, 0.5],
                "out_multipliers": [0.5, 2.0],
            },
        )
    )

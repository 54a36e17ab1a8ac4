"""Parameter count and matrix-product FLOPs of the ``mha``/``mqa``/``gqa`` attention (:mod:`.attention`), read by
``modkit cost``, the parameter tables and the contract kit.

Sources: the projections as built by :class:`modkit_plugins.attention.Attention`; FLOPs as ``torch.utils.flop_counter``
counts them (1 multiply-add = 2 FLOPs).
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from modkit.plugin import BuildContext, Workload

if TYPE_CHECKING:
    from .attention import AttentionConfig


def param_count(cfg: "AttentionConfig", ctx: BuildContext) -> int:
    """Parameters of one ``mha``/``mqa``/``gqa`` layer: the four projections and their biases, the output gate's
    ``gate_proj`` (``[n_heads · v_head_dim, d_model]``, or ``[n_heads, d_model]`` with ``output_gate_scope: head``),
    the QK-norm (as its norm component counts it) and the sink logits ``[n_heads]``."""
    d, hd, vd = ctx.d_model, cfg.resolved_head_dim(ctx.d_model), cfg.value_width(ctx.d_model)
    qw, kvw, vw, ow = cfg.n_heads * hd, cfg.kv_heads * hd, cfg.kv_heads * vd, cfg.n_heads * vd
    n = d * (qw + kvw + vw + ow)
    n += qw * cfg.q_bias + kvw * cfg.k_bias + vw * cfg.v_bias + d * cfg.o_bias
    if (
        cfg.output_gate
    ):  # gate_proj: as wide as the merged value heads (one per head), with its bias (gate_bias, default q_bias)
        gw = cfg.n_heads if cfg.output_gate_scope == "head" else ow
        n += d * gw + gw * cfg.gate_has_bias
    if cfg.qk_norm is not None:
        norm = ctx.registry.entry_for_config(cfg.qk_norm)
        for width, heads in ((qw, cfg.n_heads), (kvw, cfg.kv_heads)):
            if cfg.qk_norm_scope == "full":
                n += norm.param_count(cfg.qk_norm, replace(ctx, dim=width))
            else:
                n += norm.param_count(
                    cfg.qk_norm, replace(ctx, dim=hd, groups=heads if cfg.qk_norm_scope == "each_head" else None)
                )
    return n + cfg.n_heads * cfg.sinks


def flops(cfg: "AttentionConfig", ctx: BuildContext, work: Workload) -> dict[str, int]:
    """Matrix-product FLOPs of one call (1 multiply-add = 2 FLOPs): the four projections (five with the output gate's
    ``gate_proj``; the gating itself is element-wise) on ``work.tokens`` rows, and
    per query head ``2 · head_dim`` for each scored (query, key) pair in ``q·kᵀ`` and as much in ``p·v``.

    GQA/MQA save nothing in the scores (every query head scores every key it sees) but narrow k_proj and v_proj.
    The pairs are those the mask lets through (causal, sliding window, chunk: :meth:`Workload.pairs`), or the whole
    ``[new, past + new]`` rectangle when ``work.dense``. The QK-norm (a norm component) declares its own; the
    softmax, the scaling, the temperature tuning and the biases are element-wise and not counted. A sink is not a
    key (its logit joins the softmax), except that the dense SDPA kernel scores it as one more zero key per query
    (``work.dense`` with the sdpa backend counts that column).
    """
    d, hd, vd = ctx.d_model, cfg.resolved_head_dim(ctx.d_model), cfg.value_width(ctx.d_model)
    qw, kvw, t = cfg.n_heads * hd, cfg.kv_heads * hd, work.tokens
    pairs = work.pairs(causal=cfg.causal, window=cfg.sliding_window, chunk=cfg.attention_chunk_size)
    if work.dense and cfg.sinks and cfg.backend == "sdpa" and cfg.logit_softcap is None:
        pairs += t  # the zero key column the SDPA path appends for the sink
    out = {
        "q_proj": 2 * t * d * qw,
        "k_proj": 2 * t * d * kvw,
        "v_proj": 2 * t * d * cfg.kv_heads * vd,
        "o_proj": 2 * t * cfg.n_heads * vd * d,
        "scores": 2 * cfg.n_heads * hd * pairs,
        "weighted_sum": 2 * cfg.n_heads * vd * pairs,
    }
    if cfg.output_gate:
        out["gate_proj"] = 2 * t * d * cfg.n_heads * (1 if cfg.output_gate_scope == "head" else vd)
    return out

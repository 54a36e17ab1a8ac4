"""The ``moe``'s declared sizes: its parameter count, its FLOPs, its expert capacity and its latent projections.

Split from :mod:`modkit_plugins.moe` (which re-exports :func:`expert_capacity`) so that the module stays readable.
The latent form (Nemotron 3's latent mixture, transformers ``NemotronHMoE`` with ``moe_latent_size``; NVIDIA,
Nemotron 3 technical report 2025) runs the routed experts in a narrower space of ``latent_dim`` features:

    z = latent_down(x)                            # [tokens, latent_dim], dense: every token
    y = latent_up(sum_k w[:, k] * expert[idx[:, k]](z)) + shared(x)

The router (and the shared expert, and its gate) read the full-width ``x``; the routed weights apply in the latent
space, before ``latent_up``, whose bias is therefore added once per token whatever the weights.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import TYPE_CHECKING


from modkit.plugin import BuildContext, declared_flops, Workload

from .nested_counts import nested_param_count

if TYPE_CHECKING:  # pragma: no cover - annotations only
    from .moe import MoEConfig


def expert_capacity(capacity_factor: float, n_tokens: int, top_k: int, n_experts: int) -> int:
    """Slots each expert processes under fixed-capacity dispatch (Switch Transformer, Fedus et al. 2021,
    arXiv:2101.03961, eq. 3; GShard, arXiv:2006.16668): ``min(T, max(1, ceil(c * T * k / n)))`` for ``T`` =
    ``n_tokens`` tokens, ``c`` = ``capacity_factor``, ``k`` = ``top_k`` and ``n`` = ``n_experts``: the ``T * k``
    assignments spread evenly, times ``c``, at least one slot and never more slots than tokens (a token takes one
    slot of an expert at most). ``expert_capacity(1.25, 64, 2, 8)`` is 20."""
    return min(n_tokens, max(1, math.ceil(capacity_factor * n_tokens * top_k / n_experts)))


def expert_context(cfg: "MoEConfig", ctx: BuildContext) -> BuildContext:
    """The context the routed experts are built (and counted, and costed) in: ``ctx`` itself, or with
    ``latent_dim`` set, ``ctx`` at ``dim = latent_dim`` (the experts map ``[rows, latent_dim]`` to the same)."""
    return ctx if cfg.latent_dim is None else replace(ctx, dim=cfg.latent_dim)


def latent_count(cfg: "MoEConfig", d_model: int) -> int:
    """Parameters of the two latent projections: ``latent_down [latent_dim, d_model]`` and ``latent_up [d_model,
    latent_dim]`` weights, plus with ``latent_bias`` their biases ``[latent_dim]`` and ``[d_model]``; 0 without
    ``latent_dim``. They serve every token (active parameters)."""
    if cfg.latent_dim is None:
        return 0
    return 2 * d_model * cfg.latent_dim + ((cfg.latent_dim + d_model) if cfg.latent_bias else 0)


def moe_count(cfg: "MoEConfig", ctx: BuildContext) -> int:
    """``n_experts`` experts (at ``latent_dim`` wide when set) + the router (over ``n_experts + n_zero_experts``
    choices; zero experts have no parameters) + the shared expert + the shared gate's ``d_model`` weights + the
    latent projections (:func:`latent_count`)."""
    d = ctx.dim or ctx.d_model
    rctx = replace(ctx, extra={**ctx.extra, "n_experts": cfg.n_experts + cfg.n_zero_experts, "top_k": cfg.top_k})
    total = cfg.n_experts * nested_param_count(cfg.expert, expert_context(cfg, ctx))
    total += nested_param_count(cfg.router, rctx)
    if cfg.shared is not None:
        total += nested_param_count(cfg.shared, ctx)
    if cfg.shared_gate:
        total += d
    return total + latent_count(cfg, d)


def moe_flops(cfg: "MoEConfig", ctx: BuildContext, work: Workload) -> dict[str, int]:
    """The experts' FLOPs (the router and the shared expert, built through ``ctx.build``, declare their own): the
    expert type's declaration on the rows the experts process, ``tokens · top_k`` when dropless (each token through
    exactly its experts), or ``n_experts · capacity(tokens)`` slots with a capacity factor (empty slots are computed
    too). With ``n_zero_experts`` the ``tokens · top_k`` rows are still declared: they are the grouped call's static
    shape, which FlopCounterMode counts (shapes, not group ends); the rows of zero experts lie past the last group
    end and are not computed, so the work done is lower by the assignments routed to zero experts (data-dependent:
    a share ``z / (n + z)`` under routing balanced over all choices). Parts are the expert's, prefixed
    ``experts.`` (at ``latent_dim`` wide when set); with ``shared_gate``, ``shared_gate``: ``2 · d_model`` per token;
    with ``latent_dim``, ``latent_down`` and ``latent_up``: ``2 · d_model · latent_dim`` per token each. The weighting
    and the gather/scatter are not matrix products."""
    t, d = work.tokens, ctx.dim or ctx.d_model
    if cfg.capacity_factor is None:
        rows = t * cfg.top_k
    else:
        rows = cfg.n_experts * expert_capacity(cfg.capacity_factor, t, cfg.top_k, cfg.n_experts)
    expert = ctx.registry.entry_for_config(cfg.expert)
    ectx = expert_context(cfg, ctx)
    out = {f"experts.{k}": v for k, v in declared_flops(expert, cfg.expert, ectx, work.rows(rows)).items()}
    if cfg.shared_gate:
        out["shared_gate"] = 2 * t * d
    if cfg.latent_dim is not None:
        out["latent_down"] = out["latent_up"] = 2 * t * d * cfg.latent_dim
    return out

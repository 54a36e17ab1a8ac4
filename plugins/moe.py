"""Sparse mixture of experts: the ``moe`` FFN and its ``topk`` router.

``moe``: ``forward(x [batch, seq, d_model]) -> (y [batch, seq, d_model], aux_loss [] float32)``.
Each token is sent to ``top_k`` of ``n_experts`` experts (each expert is itself a full ``ffn`` spec, e.g. a
SwiGLU) chosen by a learned router; the output is the router-weighted sum of those experts' outputs:

    probs   = softmax(router(x))                      # [tokens, n_experts], float32
    w, idx  = top_k(probs)                            # [tokens, top_k]; w renormalised to sum 1 if asked
    y       = sum_k w[:, k] * expert[idx[:, k]](x)

Auxiliary losses (returned, never hidden in side channels), computed per MoE layer over that layer's tokens:

* load balancing (Switch Transformer): ``n_experts * sum_e f_e * P_e`` with ``f_e`` the fraction of the
  ``tokens * top_k`` routing assignments that went to expert ``e`` (no gradient) and ``P_e`` the mean router
  probability of ``e`` (gradient flows into the router). Perfectly balanced routing gives 1. This is Megatron-LM's
  normalisation; Hugging Face Mixtral's ``load_balancing_loss_func`` gives ``top_k`` times this value.
* router z-loss (ST-MoE): mean over tokens of ``logsumexp(logits)^2`` (computed with ``torch.logsumexp``, so
  logits of 100 stay finite).

``aux_loss = aux_loss_coef * load_balancing + z_loss_coef * z_loss``.

Routing does no host synchronisation (no ``.item()``, ``.tolist()``, ``.nonzero()`` or data-dependent Python
control flow), so the layer compiles with ``torch.compile(fullgraph=True)`` (torchtune #2771). Two dispatch
schemes, chosen statically by ``capacity_factor``:

* ``null`` (default), dropless and exact: the ``tokens * top_k`` assignments are sorted by expert (a stable
  ``argsort``; group ends counted on the device), the tokens' rows gathered in that order, and one grouped GEMM per
  projection (:func:`modkit.grouped.grouped_mm`) runs every expert on exactly its rows; the weighted outputs are
  added back per token with ``index_add``. Cost: the active FLOPs, plus a gather and a scatter of ``tokens * top_k``
  rows (MegaBlocks, Gale et al. 2022, arXiv:2211.15841, without the block-sparse kernels).
* a number ``c``: each expert processes a fixed ``capacity = min(tokens, ceil(c * tokens * top_k / n_experts))``
  slots (Switch Transformer / GShard). Assignments are served first choices first, then in token order;
  assignments beyond an expert's capacity are dropped (that expert contributes 0 for that token). Cost:
  ``c`` times the active FLOPs. With ``c >= n_experts / top_k`` nothing is ever dropped.

The experts are one module with stacked weights, built by the expert type's ``grouped_factory`` (``mlp``,
``swiglu`` and ``geglu`` have one): SwiGLU experts hold ``experts.gate``/``experts.up`` ``[n_experts, d_model, d_ff]``
and ``experts.down`` ``[n_experts, d_ff, d_model]``.

Padding: ``forward`` takes an optional ``token_mask [batch, seq]`` (True = real token; the module sets
``takes_token_mask`` so placements pass it through :func:`modkit.run_ffn`): padding tokens count in neither
loss and take no expert capacity (Megatron-LM #2121).

References: Shazeer et al. 2017, Outrageously Large Neural Networks: The Sparsely-Gated Mixture-of-Experts
Layer (arXiv:1701.06538); Lepikhin et al. 2020, GShard (arXiv:2006.16668); Fedus et al. 2021, Switch
Transformers (arXiv:2101.03961); Zoph et al. 2022, ST-MoE: Designing Stable and Transferable Sparse Expert
Models (arXiv:2202.08906); Jiang et al. 2024, Mixtral of Experts (arXiv:2401.04088).
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Literal, Optional

import torch
from pydantic import Field, model_validator
from torch import Tensor, nn

from modkit import BuildContext, Component, ComponentConfig, Slot, Workload, hookimpl
from modkit.cost import declared_flops
from modkit.limits import ExpertCount

# ----------------------------------------------------------------------------------------------------- losses


def z_loss(logits: Tensor, token_mask: Optional[Tensor] = None) -> Tensor:
    """Router z-loss of ST-MoE (Zoph et al. 2022, arXiv:2202.08906, eq. 5): ``mean_tokens(logsumexp(logits)^2)``.

    Args:
        logits: ``[tokens, n_experts]`` router logits (any float dtype; computed in float32).
        token_mask: optional ``[tokens]`` bool, True for tokens that count (padding excluded).

    Returns:
        Scalar float32. Logits ``[[0, 0], [2, 2]]`` give 3.866747 (the mean of the squares, not the square of the
        mean); ``[[100, 0]]`` gives 10000, finite, because ``torch.logsumexp`` is used.
    """
    lse = torch.logsumexp(logits.float(), dim=-1)
    if token_mask is None:
        return (lse * lse).mean() if lse.numel() else lse.new_zeros(())
    m = token_mask.to(lse.dtype)
    return (lse * lse * m).sum() / m.sum().clamp(min=1.0)


def load_balancing_loss(
    probs: Tensor, indices: Tensor, n_experts: int, token_mask: Optional[Tensor] = None
) -> Tensor:
    """Switch Transformer load-balancing loss (Fedus et al. 2021, arXiv:2101.03961, eq. 4) for top-k routing.

    ``n_experts * sum_e f_e * P_e`` where ``f_e`` is the fraction of routing assignments (``tokens * top_k`` of
    them) sent to expert ``e`` and ``P_e`` the mean router probability of ``e``. Only ``P`` carries gradient.
    Uniform routing gives 1; the minimum over probabilities for a fixed assignment is reached when both are uniform.

    Args:
        probs: ``[tokens, n_experts]`` softmax of the router logits (float32), before top-k.
        indices: ``[tokens, top_k]`` int64 chosen experts.
        n_experts: number of experts.
        token_mask: optional ``[tokens]`` bool, True for tokens that count (padding excluded).

    Returns:
        Scalar float32.
    """
    probs = probs.float()
    top_k = indices.shape[-1]
    experts = torch.arange(n_experts, device=indices.device)
    chosen = (indices[..., None] == experts).to(probs.dtype).sum(-2)  # [tokens, n_experts]: 0/1 per expert
    if token_mask is None:
        m = probs.new_ones(probs.shape[0])
    else:
        m = token_mask.to(probs.dtype)
    n_tok = m.sum().clamp(min=1.0)
    f = (chosen * m[:, None]).sum(0) / (n_tok * top_k)
    p = (probs * m[:, None]).sum(0) / n_tok
    return n_experts * (f * p).sum()


# ----------------------------------------------------------------------------------------------------- router


class TopKRouterConfig(ComponentConfig):
    """Config of the ``topk`` router. ``n_experts`` and ``top_k`` come from the enclosing ``moe``."""

    type: Literal["topk"] = "topk"
    renormalize: bool = Field(
        ...,
        description="true: divide the top-k probabilities by their sum (Mixtral, Qwen3-MoE: the weights sum to 1); "
        "false: use the softmax probabilities as they are (Switch, Qwen2-MoE default). Required: no silent default",
    )
    bias: bool = Field(False, description="bias on the router projection")


class TopKRouter(nn.Module):
    """Softmax-then-top-k router.

    ``forward(x [..., d_model]) -> (weights [..., top_k] in x's dtype, indices [..., top_k] int64,
    logits [..., n_experts] float32)``. The logits are computed in float32 whatever the model dtype (ST-MoE's
    selective precision, arXiv:2202.08906 section 3.2). Logits ``[2, 1, 0, -1]`` with top-2 pick experts ``[0, 1]``
    with weights ``[0.731059, 0.268941]`` renormalised, ``[0.643914, 0.236883]`` not (litgpt #2013, Qwen3 #687).

    ``proj`` is ``nn.Linear(d_model, n_experts)``; its weight ``[n_experts, d_model]`` is Hugging Face Mixtral's
    ``block_sparse_moe.gate.weight``.
    """

    #: parameter roles (:mod:`modkit.roles`): the projection is a router, not a hidden matrix
    param_roles = {"proj.weight": "router", "proj.bias": "bias"}

    def __init__(self, d_model: int, n_experts: int, top_k: int, renormalize: bool, bias: bool):
        super().__init__()
        if not 1 <= top_k <= n_experts:
            raise ValueError(f"router needs 1 <= top_k <= n_experts, got top_k = {top_k}, n_experts = {n_experts}")
        self.n_experts, self.top_k, self.renormalize = n_experts, top_k, renormalize
        self.proj = nn.Linear(d_model, n_experts, bias=bias)

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Route ``x [..., d_model]``; see the class docstring for the outputs."""
        bias = self.proj.bias.float() if self.proj.bias is not None else None
        logits = nn.functional.linear(x.float(), self.proj.weight.float(), bias)
        probs = torch.softmax(logits, dim=-1)
        weights, indices = torch.topk(probs, self.top_k, dim=-1)
        if self.renormalize:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return weights.to(x.dtype), indices, logits


def _router_sizes(ctx: BuildContext) -> tuple[int, int]:
    try:
        return int(ctx.extra["n_experts"]), int(ctx.extra["top_k"])
    except KeyError:
        raise ValueError(
            "a router is built by an MoE, which passes n_experts and top_k in BuildContext.extra; "
            f"got extra = {dict(ctx.extra)!r}"
        ) from None


def _make_router(cfg: TopKRouterConfig, ctx: BuildContext) -> TopKRouter:
    n, k = _router_sizes(ctx)
    return TopKRouter(ctx.dim or ctx.d_model, n, k, cfg.renormalize, cfg.bias)


def _router_flops(cfg: TopKRouterConfig, ctx: BuildContext, work: Workload) -> dict[str, int]:
    """The logits: ``2 · d_model · n_experts`` FLOPs per token (softmax and top-k are not matrix products)."""
    n, _ = _router_sizes(ctx)
    return {"proj": 2 * work.tokens * (ctx.dim or ctx.d_model) * n}


def _router_count(cfg: TopKRouterConfig, ctx: BuildContext) -> int:
    n, _ = _router_sizes(ctx)
    return n * (ctx.dim or ctx.d_model) + (n if cfg.bias else 0)


# ----------------------------------------------------------------------------------------------------- moe


class MoEConfig(ComponentConfig):
    """Config of ``moe``: ``n_experts`` copies of an ``ffn`` spec and a ``router`` (both required).

    The router is required, not defaulted, so that its ``renormalize`` flag is always explicit in the spec.
    """

    type: Literal["moe"] = "moe"
    n_experts: ExpertCount = Field(..., description="number of experts")
    top_k: ExpertCount = Field(2, description="experts per token; must be <= n_experts")
    expert: ComponentConfig = Slot(
        "ffn",
        description="spec of one expert (an ffn type with a grouped form: mlp, swiglu, geglu), e.g. "
        "{\"type\": \"swiglu\", \"d_ff\": 14336}; the n_experts independent copies are stored stacked "
        "(experts.gate [n_experts, d_model, d_ff] ...)",
    )
    router: ComponentConfig = Slot(
        "router",
        description="router spec, e.g. {\"type\": \"topk\", \"renormalize\": true}; it gets n_experts and top_k from here",
    )
    aux_loss_coef: float = Field(
        0.01,
        ge=0,
        allow_inf_nan=False,
        description="weight of the Switch Transformer load-balancing loss n_experts * sum_e f_e * P_e (1 when balanced)",
    )
    z_loss_coef: float = Field(
        0.0, ge=0, allow_inf_nan=False, description="weight of the ST-MoE router z-loss mean(logsumexp(logits)^2)"
    )
    capacity_factor: Optional[float] = Field(
        None,
        gt=0,
        allow_inf_nan=False,
        description="null: dropless (each token goes through exactly its top_k experts; exact); c: each expert processes "
        "ceil(c * tokens * top_k / n_experts) tokens and drops the overflow (Switch/GShard)",
    )

    @model_validator(mode="after")
    def _check(self) -> "MoEConfig":
        if self.top_k > self.n_experts:
            raise ValueError(f"top_k = {self.top_k} exceeds n_experts = {self.n_experts}; top_k must be <= n_experts")
        if isinstance(self.expert, MoEConfig):
            raise ValueError(
                "expert is itself an 'moe'; nested mixtures are not supported: give a dense ffn "
                "(e.g. {\"type\": \"swiglu\", \"d_ff\": ...}) as the expert"
            )
        return self

    def check(self, ctx) -> list[tuple[str, str]]:
        """Cross-field check against the registry: the expert type must be a dense ffn with a grouped form."""
        entry = ctx.registry.entry_for_config(self.expert)
        if entry.capabilities.get("aux_loss"):
            return [("expert", f"expert type {self.expert.type!r} returns an aux loss (it is a mixture itself); use a dense ffn")]
        if entry.grouped_factory is None:
            able = sorted(e.type for e in ctx.registry.components("ffn") if e.grouped_factory is not None)
            return [("expert", f"expert type {self.expert.type!r} ({entry.provider}) has no grouped form (Component."
                     f"grouped_factory) to stack n_experts copies; use one that has: {', '.join(able)}, or give it one")]
        return []


class MoE(nn.Module):
    """Top-k mixture of experts. ``forward(x [batch, seq, d_model], token_mask=None) -> (y, aux_loss)``.

    Attributes:
        router: the router module (``router.proj.weight [n_experts, d_model]``).
        experts: the expert type's grouped form: ``n_experts`` copies with stacked weights, ``forward(rows
            [N, d_model], offs [n_experts] int32) -> [N, d_model]`` (SwiGLU: ``experts.gate``/``experts.up``
            ``[n_experts, d_model, d_ff]``, ``experts.down`` ``[n_experts, d_ff, d_model]``).
        n_experts, top_k, aux_loss_coef, z_loss_coef, capacity_factor: from the config.

    See the module docstring for the math, the two dispatch schemes and their cost.
    """

    def __init__(self, cfg: MoEConfig, ctx: BuildContext):
        super().__init__()
        self.n_experts, self.top_k = cfg.n_experts, cfg.top_k
        self.aux_loss_coef, self.z_loss_coef = cfg.aux_loss_coef, cfg.z_loss_coef
        self.capacity_factor = cfg.capacity_factor
        self.router = ctx.build(cfg.router, extra={**ctx.extra, "n_experts": cfg.n_experts, "top_k": cfg.top_k})
        self.experts = ctx.build_grouped(cfg.expert, cfg.n_experts)

    def inactive_params_per_token(self) -> int:
        """Parameters a token does not use: ``(n_experts - top_k) *`` one expert's parameters."""
        per_expert = sum(p.numel() for p in self.experts.parameters()) // self.n_experts
        return (self.n_experts - self.top_k) * per_expert

    def capacity(self, n_tokens: int) -> int:
        """Slots per expert for ``n_tokens`` tokens (``capacity_factor`` mode): ``min(T, ceil(c * T * k / n))``."""
        c = math.ceil(self.capacity_factor * n_tokens * self.top_k / self.n_experts)
        return min(n_tokens, max(1, c))

    takes_token_mask = True  # placements pass the padding mask through modkit.run_ffn

    def forward(self, x: Tensor, token_mask: Optional[Tensor] = None) -> tuple[Tensor, Tensor]:
        """Mix experts.

        Args:
            x: ``[batch, seq, d_model]``.
            token_mask: optional ``[batch, seq]`` bool, True for real tokens; padding is excluded from the aux
                losses and from expert capacity (its output is unspecified).

        Returns:
            ``(y [batch, seq, d_model] in x's dtype, aux_loss [] float32)``.
        """
        flat = x.reshape(-1, x.shape[-1])
        mask = token_mask.reshape(-1).to(torch.bool) if token_mask is not None else None
        weights, indices, logits = self.router(flat)  # [T, k], [T, k], [T, n]
        if self.capacity_factor is None:
            y = self._dropless(flat, weights, indices)
        else:
            y = self._capacity(flat, weights, indices, mask)
        return y.view(x.shape), self._aux_loss(logits, indices, mask)

    #: on the CPU, expert rows go through the experts in blocks of this many rows, so that each block's
    #: ``[rows, d_ff]`` intermediates stay in cache (measured on the 8 x SwiGLU(512, 1408) benchmark, 8192 rows:
    #: 0.79 s unblocked, 0.65-0.67 s with blocks of 256 to 2048 rows); one block per call elsewhere
    CPU_BLOCK_ROWS = 1024

    def _run_experts(self, rows: Tensor, offs: Tensor) -> Tensor:
        """``experts(rows [N, d], offs [n_experts] int32) -> [N, d]``, in row blocks on the CPU (static sizes:
        each block gets the group ends clamped to it, computed on the device)."""
        n_rows = rows.shape[0]
        block = self.CPU_BLOCK_ROWS if rows.device.type == "cpu" else n_rows
        if n_rows <= block:
            return self.experts(rows, offs)
        outs = []
        for start in range(0, n_rows, block):
            stop = min(n_rows, start + block)
            outs.append(self.experts(rows[start:stop], (offs - start).clamp(0, stop - start)))
        return torch.cat(outs)

    def _dropless(self, flat: Tensor, weights: Tensor, indices: Tensor) -> Tensor:
        """Each token through exactly its top-k experts: sort assignments by expert, one grouped call, scatter back."""
        k = self.top_k
        experts = indices.reshape(-1)  # [T*k]: assignment a is token a // k's choice a % k
        order = experts.argsort(stable=True)  # assignments grouped by expert, token order inside a group
        tok = order // k
        counts = torch.zeros(self.n_experts, dtype=torch.int32, device=flat.device)
        counts = counts.scatter_add(0, experts, torch.ones_like(experts, dtype=torch.int32))
        out = self._run_experts(flat[tok], counts.cumsum(0, dtype=torch.int32))  # [T*k, d]
        out = out * weights.reshape(-1)[order, None]
        return flat.new_zeros(flat.shape).index_add(0, tok, out)

    def _capacity(self, flat: Tensor, weights: Tensor, indices: Tensor, mask: Optional[Tensor]) -> Tensor:
        """Fixed-capacity dispatch (GShard/Switch) with static shapes: gather into ``[n_experts, C]`` slots."""
        n_tok, d = flat.shape
        n, k = self.n_experts, self.top_k
        cap = self.capacity(n_tok)
        e_flat = indices.t().reshape(-1)  # [k*T], first choices of all tokens first (GShard priority)
        w_flat = weights.t().reshape(-1)
        tok = torch.arange(n_tok, device=flat.device).repeat(k)
        onehot = (e_flat[:, None] == torch.arange(n, device=flat.device)).long()  # [k*T, n]
        if mask is not None:
            onehot = onehot * mask.repeat(k)[:, None].long()
        pos = (onehot.cumsum(0) * onehot).sum(-1) - 1  # position of the assignment in its expert's queue; -1: padding
        keep = (pos >= 0) & (pos < cap)
        trash = n * cap
        slot = torch.where(keep, e_flat * cap + pos, torch.full_like(pos, trash))
        buf = flat.new_zeros(trash + 1, d).index_add(0, slot, flat[tok])
        offs = torch.arange(1, n + 1, device=flat.device, dtype=torch.int32) * cap  # expert e owns slots [e*C, (e+1)*C)
        out = torch.cat([self._run_experts(buf[:trash], offs), flat.new_zeros(1, d)], dim=0)  # the trash row outputs 0
        contrib = out[slot] * (w_flat * keep.to(w_flat.dtype))[:, None]
        return flat.new_zeros(n_tok, d).index_add(0, tok, contrib)

    def _aux_loss(self, logits: Tensor, indices: Tensor, mask: Optional[Tensor]) -> Tensor:
        aux = logits.new_zeros(())
        if self.aux_loss_coef:
            probs = torch.softmax(logits, dim=-1)
            aux = aux + self.aux_loss_coef * load_balancing_loss(probs, indices, self.n_experts, mask)
        if self.z_loss_coef:
            aux = aux + self.z_loss_coef * z_loss(logits, mask)
        return aux


def _moe_count(cfg: MoEConfig, ctx: BuildContext) -> int:
    reg = ctx.registry
    expert_entry = reg.entry_for_config(cfg.expert)
    if expert_entry.param_count is not None:
        per_expert = expert_entry.param_count(cfg.expert, ctx)
    else:  # no analytic count declared: build one expert on meta and count
        with torch.device("meta"):
            per_expert = sum(p.numel() for p in ctx.build(cfg.expert).parameters())
    rctx = replace(ctx, extra={**ctx.extra, "n_experts": cfg.n_experts, "top_k": cfg.top_k})
    router_entry = reg.entry_for_config(cfg.router)
    if router_entry.param_count is not None:
        router = router_entry.param_count(cfg.router, rctx)
    else:
        with torch.device("meta"):
            router = sum(p.numel() for p in rctx.build(cfg.router).parameters())
    return cfg.n_experts * per_expert + router


def _moe_flops(cfg: MoEConfig, ctx: BuildContext, work: Workload) -> dict[str, int]:
    """The experts' FLOPs (the router, built through ``ctx.build``, declares its own): the expert type's declaration
    on the rows the experts process, ``tokens · top_k`` when dropless (each token through exactly its experts), or
    ``n_experts · capacity(tokens)`` slots with a capacity factor (empty slots are computed too). Parts are the
    expert's, prefixed ``experts.``. The weighting and the gather/scatter are not matrix products."""
    t = work.tokens
    if cfg.capacity_factor is None:
        rows = t * cfg.top_k
    else:
        rows = cfg.n_experts * min(t, max(1, math.ceil(cfg.capacity_factor * t * cfg.top_k / cfg.n_experts)))
    expert = ctx.registry.entry_for_config(cfg.expert)
    return {f"experts.{k}": v for k, v in declared_flops(expert, cfg.expert, ctx, work.rows(rows)).items()}


#: Key formulas of the docs pages (pymdownx.arithmatex).
_MATH = {
    "topk": r"""For a token $x$, with $W_r$: $d_{model} \to N$ ($N$ = n_experts) and $k$ = top_k:

$$z = W_r\, x \ \text{(float32)}, \qquad p = \mathrm{softmax}(z), \qquad \mathcal{T} = \operatorname{top-}k(p), \qquad
g_e = \begin{cases} p_e \,/ \sum_{e' \in \mathcal{T}} p_{e'} & \text{renormalize} \\ p_e & \text{otherwise}
\end{cases} \quad (e \in \mathcal{T})$$

It returns the weights $g_e$ and indices $\mathcal{T}$ of the $k$ chosen experts and the logits $z$.""",
    "moe": r"""Each token $x$ goes to the $k$ = top_k experts $\mathcal{T}$ its router picks, with weights $g_e$ (see the
router):

$$y = \sum_{e \in \mathcal{T}} g_e\, E_e(x), \qquad p = \mathrm{softmax}(W_r\, x), \qquad
\mathcal{T} = \operatorname{top-}k(p)$$

The auxiliary loss over the $T$ tokens of the layer (padding excluded), $N$ = n_experts:

$$\mathcal{L}_{aux} = \alpha\, N \sum_{e=1}^{N} f_e\, P_e + \beta\, \frac{1}{T} \sum_{t=1}^{T}
\Big(\log \sum_{e=1}^{N} e^{z_{te}}\Big)^2$$

$f_e$: the fraction of the $T k$ assignments sent to expert $e$ (no gradient); $P_e$: the mean router probability
of $e$; $z_t$: the router logits of token $t$; $\alpha$ = aux_loss_coef (Switch load balancing, 1 when routing is
uniform), $\beta$ = z_loss_coef (ST-MoE z-loss). With capacity_factor $c$ an expert takes at most
$\min(T, \lceil c\, T k / N \rceil)$ tokens and the rest of its assignments are dropped.""",
}

@hookimpl
def register_components(register) -> None:
    """Register the ``topk`` router and the ``moe`` FFN."""
    register(
        Component(
            kind="router",
            type="topk",
            config=TopKRouterConfig,
            factory=_make_router,
            math=_MATH["topk"],
            description="Linear router: float32 logits, softmax, top-k experts, optionally renormalised weights. "
            "[tokens, d_model] -> (weights [tokens, top_k], indices [tokens, top_k] int64, logits [tokens, n_experts] "
            "float32). Built by an moe, which supplies n_experts and top_k.",
            reference="Shazeer et al. 2017, arXiv:1701.06538; Fedus et al. 2021, arXiv:2101.03961; "
            "Jiang et al. 2024, Mixtral of Experts, arXiv:2401.04088",
            capabilities={"compile_safe": True, "tp_plan": {}},  # replicated: small, float32 logits
            param_count=_router_count,
            flops=_router_flops,
            example={"type": "topk", "renormalize": True},
        )
    )
    register(
        Component(
            kind="ffn",
            type="moe",
            config=MoEConfig,
            factory=lambda cfg, ctx: MoE(cfg, ctx),
            math=_MATH["moe"],
            description="Sparse mixture of experts: a router sends each token to top_k of n_experts ffn experts and "
            "mixes their outputs. [batch, seq, d_model] -> ([batch, seq, d_model], aux_loss scalar: Switch "
            "load-balancing loss and ST-MoE z-loss). No host synchronisation: dropless grouped-GEMM dispatch by "
            "default, fixed-capacity dispatch with capacity_factor. Experts need an ffn type with a grouped form.",
            reference="Shazeer et al. 2017, arXiv:1701.06538; Fedus et al. 2021, Switch Transformers, arXiv:2101.03961; "
            "Zoph et al. 2022, ST-MoE, arXiv:2202.08906; Jiang et al. 2024, Mixtral of Experts, arXiv:2401.04088",
            capabilities={
                "aux_loss": True,
                "compile_safe": True,
                # stacked experts sharded on d_ff; the router reads the replicated input, whole on every rank
                "tp_plan": {"experts": "grouped", "router": "replicate"},
                "token_mask": True,  # forward(x, token_mask=None): padding leaves the aux losses
            },
            param_count=_moe_count,
            flops=_moe_flops,
            example={
                "type": "moe",
                "n_experts": 4,
                "top_k": 2,
                "expert": {"type": "swiglu", "d_ff": 64},
                "router": {"type": "topk", "renormalize": True},
            },
        )
    )

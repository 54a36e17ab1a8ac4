"""The ``topk``, ``sigmoid_topk`` and ``sqrtsoftplus_topk`` routers of the ``moe`` FFN (:mod:`modkit_plugins.moe`).

``forward(x [..., d_model], token_mask=None) -> (weights [..., top_k], indices [..., top_k] int64, logits [...,
n_experts] float32)``: float32 logits of a linear projection, softmax, sigmoid or sqrt(softplus) scores, the ``top_k`` experts
(optionally inside the ``topk_group`` best of ``n_group`` groups, chosen with a selection-only correction bias),
their weights optionally renormalised and scaled. An ``moe`` builds its router and gives it ``n_experts`` and
``top_k`` (``BuildContext.extra``); ``moe.py``'s ``register_components`` registers both router types.

Each published router is a setting of the two router types:

* Mixtral, Qwen3-MoE, OLMoE, Qwen2-MoE: ``topk``, ``renormalize`` true (Mixtral, Qwen3) or false (OLMoE, Qwen2).
* gpt-oss: ``topk``, ``renormalize`` true, ``bias`` true (a softmax over the top-k logits is this).
* DeepSeek-V2: ``topk``, ``n_group``, ``topk_group``, ``group_score`` "max", ``routed_scaling_factor``.
* DeepSeek-V3, Kimi K2: ``sigmoid_topk``, ``correction_bias``, ``n_group``, ``topk_group``, ``renormalize`` true,
  ``routed_scaling_factor`` (2.5; Kimi K2: 2.827).
* Llama 4: ``sigmoid_topk``, ``renormalize`` false, and the moe's ``weight_on`` "input".
* DeepSeek-V4: ``sqrtsoftplus_topk`` (scores ``sqrt(softplus(logits))``), ``correction_bias``, ``renormalize`` true,
  ``routed_scaling_factor``; its first layers route by token id (the ``hash`` router, :mod:`modkit_plugins.hash_router`).
* DBRX: ``topk``, ``renormalize`` true with ``renormalize_p`` = ``moe_normalize_expert_weights`` (a p-norm).
* LFM2-MoE: ``sigmoid_topk``, ``correction_bias`` (its ``expert_bias``), ``renormalize`` true with
  ``renormalize_eps`` 1e-6, ``routed_scaling_factor``.
* Phi-3.5-MoE: the ``sparsemixer`` router (:mod:`modkit_plugins.sparsemixer_router`).

Auxiliary-loss-free balancing (DeepSeek-V3; Wang et al. 2024, arXiv:2408.15664): the routers count each expert's
load (assignments of real tokens, the ``expert_load`` buffer) and, with ``correction_bias``, keep a float32 bias
that is added to the scores for the choice of experts only; the training loop moves it after each optimizer step
(:meth:`TopKRouter.update_balance`).

References: Shazeer et al. 2017 (arXiv:1701.06538); Fedus et al. 2021, Switch Transformers (arXiv:2101.03961);
Zoph et al. 2022, ST-MoE (arXiv:2202.08906); DeepSeek-AI 2024, DeepSeek-V2 (arXiv:2405.04434) and DeepSeek-V3
(arXiv:2412.19437); Wang et al. 2024 (arXiv:2408.15664); the transformers modules ``DeepseekV3MoE``,
``GptOssMLP`` and ``Llama4Router`` for the exact forms.
"""

from __future__ import annotations

from typing import Literal, Optional

import torch
from pydantic import Field, model_validator
from torch import Tensor, nn

from modkit.plugin import (
    BuildContext,
    Component,
    ComponentConfig,
    ExpertCount,
    Init,
    MAX_MULTIPLIER,
    Multiplier,
    Workload,
)


class RouterConfig(ComponentConfig):
    """Fields shared by the top-k routers (``topk``: softmax scores, ``sigmoid_topk``: sigmoid scores).

    ``n_experts`` and ``top_k`` come from the enclosing ``moe``. Each published router is a setting of these fields
    (see the module docstring's list).
    """

    type: str
    renormalize: bool = Field(
        ...,
        description="true: divide the top-k gate weights by their sum (Mixtral, Qwen3-MoE, gpt-oss, DeepSeek-V3: the "
        "weights sum to 1 before routed_scaling_factor); false: use the scores as they are (Switch, Qwen2-MoE default, "
        "Llama 4). Required: no silent default",
    )
    renormalize_p: float = Field(
        1.0,
        gt=0,
        le=1000,
        allow_inf_nan=False,
        description="with renormalize, the p of the norm the top-k weights are divided by: 1, their sum (the weights "
        "are positive); another p, their p-norm (sum w^p)^(1/p) (DBRX's moe_normalize_expert_weights, 1 in DBRX). "
        "Needs renormalize",
    )
    renormalize_eps: float = Field(
        1e-20,
        ge=0,
        le=1e-3,
        allow_inf_nan=False,
        description="with renormalize (p = 1), added to the sum the top-k weights are divided by: 1e-20 keeps all-zero "
        "weights at 0 (DeepSeek-V3); LFM2-MoE's router adds 1e-6 (transformers Lfm2MoeTopKRouter). At most 1e-3",
    )
    bias: bool = Field(False, description="bias on the router projection (gpt-oss)")
    routed_scaling_factor: Multiplier = Field(
        1.0,
        description="multiplies the gate weights after renormalisation (DeepSeek-V2/V3 routed_scaling_factor: 2.5 in "
        f"DeepSeek-V3, 2.827 in Kimi K2); 1: none. At most {MAX_MULTIPLIER:g}, far above those, so the experts' "
        "weighted sum stays finite",
    )
    n_group: Optional[ExpertCount] = Field(
        None,
        description="group-limited selection: the experts form n_group groups of consecutive indices and a token picks "
        "its top_k experts inside its topk_group best groups only (DeepSeek-V2/V3 n_group); null: no limit",
    )
    topk_group: Optional[ExpertCount] = Field(
        None, description="groups a token may pick experts from (DeepSeek topk_group); given with n_group"
    )
    group_score: Literal["top2_sum", "max"] = Field(
        "top2_sum",
        description="a group's score: the sum of its two highest selection scores (DeepSeek-V3, Kimi K2) or its "
        "highest score (DeepSeek-V2's group_limited_greedy)",
    )
    correction_bias: bool = Field(
        False,
        description="a per-expert bias added to the scores only to choose the experts; the gate weights come from the "
        "unbiased scores (DeepSeek-V3's auxiliary-loss-free balancing, e_score_correction_bias). A float32 buffer "
        "saved in checkpoints and moved by the training loop after each optimizer step (bias_update_speed)",
    )
    bias_update_speed: float = Field(
        0.001,
        ge=0,
        le=1,
        allow_inf_nan=False,
        description="with correction_bias, after each optimizer step: bias_e += bias_update_speed * sign(mean load - "
        "load_e), loads counted over the step's real tokens on every data-parallel rank (DeepSeek-V3's gamma: 0.001); "
        "0 freezes the bias; ignored without correction_bias. At most 1, the whole range of a sigmoid score: a larger "
        "step swings the choice of experts from step to step",
    )

    @model_validator(mode="after")
    def _check_groups(self) -> "RouterConfig":
        if self.renormalize_p != 1.0 and not self.renormalize:
            raise ValueError(
                f"renormalize_p = {self.renormalize_p:g} sets the norm renormalize divides by, but renormalize is "
                "false; set renormalize true or drop renormalize_p"
            )
        if (self.n_group is None) != (self.topk_group is None):
            given = "n_group" if self.topk_group is None else "topk_group"
            raise ValueError(
                f"{given} is set but {'topk_group' if given == 'n_group' else 'n_group'} is not: group-limited "
                "selection needs both (e.g. n_group = 8, topk_group = 4), or neither"
            )
        if self.n_group is not None and self.topk_group > self.n_group:
            raise ValueError(
                f"topk_group = {self.topk_group} exceeds n_group = {self.n_group}; a token can pick at most n_group "
                "groups"
            )
        return self


class TopKRouterConfig(RouterConfig):
    """Config of the ``topk`` router: softmax scores."""

    type: Literal["topk"] = "topk"


class SigmoidTopKRouterConfig(RouterConfig):
    """Config of the ``sigmoid_topk`` router: an independent sigmoid score per expert."""

    type: Literal["sigmoid_topk"] = "sigmoid_topk"


class SqrtSoftplusTopKRouterConfig(RouterConfig):
    """Config of the ``sqrtsoftplus_topk`` router: an independent ``sqrt(softplus(z))`` score per expert
    (DeepSeek-V4's ``scoring_func`` "sqrtsoftplus", transformers ``DeepseekV4TopKRouter``)."""

    type: Literal["sqrtsoftplus_topk"] = "sqrtsoftplus_topk"


#: the score function of each router type
SCORE_OF = {"topk": "softmax", "sigmoid_topk": "sigmoid", "sqrtsoftplus_topk": "sqrtsoftplus"}


def score_fn(score: str, logits: Tensor) -> Tensor:
    """Per-expert scores of float32 ``logits [..., n_experts]``: ``softmax`` over the experts, element-wise
    ``sigmoid`` (DeepSeek-V3), or element-wise ``sqrtsoftplus`` = ``sqrt(softplus(z))`` = ``sqrt(log(1 + e^z))``
    (DeepSeek-V4, transformers ``ACT2FN["sqrtsoftplus"]``): positive, monotone in ``z``, growing like ``sqrt(z)``.

    Raises:
        ValueError: another score name.
    """
    if score == "softmax":
        return torch.softmax(logits, dim=-1)
    if score == "sigmoid":
        return torch.sigmoid(logits)
    if score == "sqrtsoftplus":
        return torch.sqrt(nn.functional.softplus(logits))
    raise ValueError(f"router score must be one of {sorted(SCORE_OF.values())}, got {score!r}")


def normalise_weights(weights: Tensor, p: float, eps: float = 1e-20) -> Tensor:
    """``weights [..., top_k]`` (non-negative) divided by their p-norm over the last dim: the sum for ``p`` = 1 (plus
    ``eps``: 1e-20 so all-zero weights stay 0, DeepSeek-V3; LFM2-MoE's 1e-6), ``(sum w^p)^(1/p)`` otherwise (DBRX's
    ``moe_normalize_expert_weights``, transformers ``DbrxRouter``: ``torch.norm(w, p=p)``)."""
    if p == 1.0:
        return weights / (weights.sum(dim=-1, keepdim=True) + eps)
    return weights / torch.linalg.vector_norm(weights, ord=p, dim=-1, keepdim=True).clamp(min=1e-20)


def check_groups(
    n_experts: int, top_k: int, n_group: Optional[int], topk_group: Optional[int], group_score: str
) -> Optional[str]:
    """Why group-limited selection cannot work at these sizes (``None`` when it can, or when there are no groups)."""
    if n_group is None:
        return None
    if n_experts % n_group:
        return f"n_group = {n_group} does not divide n_experts = {n_experts}; the groups must be equal"
    per = n_experts // n_group
    if group_score == "top2_sum" and per < 2:
        return (
            f"group_score 'top2_sum' needs 2 or more experts per group; n_experts = {n_experts} in n_group = "
            f"{n_group} groups gives {per}; use fewer groups or group_score 'max'"
        )
    if top_k > topk_group * per:
        return (
            f"top_k = {top_k} exceeds the {topk_group * per} experts of topk_group = {topk_group} groups of {per}; "
            "raise topk_group or lower top_k"
        )
    return None


class TopKRouter(nn.Module):
    """Top-k router with softmax or sigmoid scores, optional correction bias, group limit and scaling.

    ``forward(x [..., d_model], token_mask=None) -> (weights [..., top_k] in x's dtype, indices [..., top_k] int64,
    logits [..., n_experts] float32)``. The logits are computed in float32 whatever the model dtype (ST-MoE's
    selective precision, arXiv:2202.08906 section 3.2)::

        s       = softmax(logits) | sigmoid(logits)                    # scores [..., n_experts]
        choice  = s + correction_bias                                  # selection only (zero without the bias)
        choice  = -inf outside the topk_group best groups              # with n_group (group score: top-2 sum or max)
        indices = top_k(choice)
        weights = s[indices] (/ their sum with renormalize) * routed_scaling_factor

    Softmax logits ``[2, 1, 0, -1]`` with top-2 pick experts ``[0, 1]`` with weights ``[0.731059, 0.268941]``
    renormalised, ``[0.643914, 0.236883]`` not (litgpt #2013, Qwen3 #687). A sigmoid score is monotone in its logit, so
    top-k over sigmoid scores is top-k over logits (Llama 4), and softmax-then-top-k renormalised equals a softmax
    over the top-k logits (gpt-oss).

    Loads: the ``expert_load [n_experts]`` int64 buffer (not saved) adds, at every forward, the assignments of the
    tokens ``token_mask`` marks real (all without a mask); see :mod:`modkit.nn.balance`. The correction bias is the
    float32 buffer ``correction_bias [n_experts]`` (saved; ``None`` without ``correction_bias``), moved only by
    :meth:`update_balance`, which the training loop calls after each optimizer step.

    ``proj`` is ``nn.Linear(d_model, n_experts)``; its weight ``[n_experts, d_model]`` is Hugging Face Mixtral's
    ``block_sparse_moe.gate.weight`` (DeepSeek-V3: ``mlp.gate.weight``, its buffer ``mlp.gate.e_score_correction_bias``
    is ``correction_bias``).

    Raises:
        ValueError: ``top_k`` outside ``[1, n_experts]``, a score other than softmax / sigmoid, or group sizes that
            cannot work (:func:`check_groups`).
    """

    #: parameter roles (:mod:`modkit.core.roles`): the projection is a router, not a hidden matrix
    param_roles = {"proj.weight": "router", "proj.bias": "bias"}
    #: read in float32 (the scores): decoding with low-precision weights keeps it as built
    matrix_weights = ("proj.weight",)

    takes_token_mask = True  # the holder passes token_mask so padding never counts as load

    # size: one keyword per router config field, the public constructor's signature as it was
    def __init__(
        self,
        d_model: int,
        n_experts: int,
        top_k: int,
        renormalize: bool,
        bias: bool,
        *,
        score: str = "softmax",
        renormalize_p: float = 1.0,
        routed_scaling_factor: float = 1.0,
        n_group: Optional[int] = None,
        topk_group: Optional[int] = None,
        group_score: str = "top2_sum",
        correction_bias: bool = False,
        bias_update_speed: float = 0.0,
        renormalize_eps: float = 1e-20,
    ):
        super().__init__()
        if not 1 <= top_k <= n_experts:
            raise ValueError(f"router needs 1 <= top_k <= n_experts, got top_k = {top_k}, n_experts = {n_experts}")
        if score not in SCORE_OF.values():
            raise ValueError(f"router score must be one of {sorted(SCORE_OF.values())}, got {score!r}")
        problem = check_groups(n_experts, top_k, n_group, topk_group, group_score)
        if problem:
            raise ValueError(problem)
        self.n_experts, self.top_k, self.renormalize, self.score = n_experts, top_k, renormalize, score
        self.routed_scaling_factor, self.renormalize_p = float(routed_scaling_factor), float(renormalize_p)
        self.n_group, self.topk_group, self.group_score = n_group, topk_group, group_score
        self.bias_update_speed, self.renormalize_eps = float(bias_update_speed), float(renormalize_eps)
        self.proj = nn.Linear(d_model, n_experts, bias=bias)
        self.register_buffer("expert_load", torch.zeros(n_experts, dtype=torch.int64), persistent=False)
        bias_buffer = torch.zeros(n_experts, dtype=torch.float32) if correction_bias else None
        self.register_buffer("correction_bias", bias_buffer)

    def init_weights(self, init: Init) -> None:
        """Zero loads and correction bias (``proj`` gets the default normal init as a child ``nn.Linear``)."""
        init.zeros_(self.expert_load)
        if self.correction_bias is not None:
            init.zeros_(self.correction_bias)

    def scores(self, logits: Tensor) -> Tensor:
        """The per-expert scores of float32 ``logits [..., n_experts]`` (:func:`score_fn`)."""
        return score_fn(self.score, logits)

    def probabilities(self, logits: Tensor) -> Tensor:
        """The scores normalised to sum 1 over the experts ``[..., n_experts]``, what the balance losses read: the
        softmax itself, or ``sigmoid / sum(sigmoid)`` (DeepSeek-V3's normalised affinities, arXiv:2412.19437 eq. 19)."""
        s = self.scores(logits)
        return s if self.score == "softmax" else s / s.sum(dim=-1, keepdim=True)

    def _limit_groups(self, choice: Tensor) -> Tensor:
        """``choice`` with the experts outside each token's ``topk_group`` best groups set to ``-inf``."""
        per = self.n_experts // self.n_group
        grouped = choice.view(*choice.shape[:-1], self.n_group, per)
        if self.group_score == "top2_sum":
            group_scores = grouped.topk(2, dim=-1).values.sum(dim=-1)
        else:
            group_scores = grouped.amax(dim=-1)
        best = group_scores.topk(self.topk_group, dim=-1).indices
        keep = torch.zeros_like(group_scores, dtype=torch.bool).scatter(-1, best, True)
        keep = keep[..., None].expand(grouped.shape).reshape(choice.shape)
        return choice.masked_fill(~keep, float("-inf"))

    def forward(self, x: Tensor, token_mask: Optional[Tensor] = None) -> tuple[Tensor, Tensor, Tensor]:
        """Route ``x [..., d_model]`` (``token_mask [...]`` bool: True for real tokens); see the class docstring."""
        bias = self.proj.bias.float() if self.proj.bias is not None else None
        logits = nn.functional.linear(x.float(), self.proj.weight.float(), bias)
        scores = self.scores(logits)
        choice = scores if self.correction_bias is None else scores + self.correction_bias.float()
        if self.n_group is not None:
            choice = self._limit_groups(choice)
        if choice is scores:
            weights, indices = torch.topk(scores, self.top_k, dim=-1)
        else:
            indices = torch.topk(choice, self.top_k, dim=-1).indices
            weights = scores.gather(-1, indices)
        if self.renormalize:
            weights = normalise_weights(weights, self.renormalize_p, self.renormalize_eps)
        if self.routed_scaling_factor != 1.0:
            weights = weights * self.routed_scaling_factor
        self._count(indices, token_mask)
        return weights.to(x.dtype), indices, logits

    def _count(self, indices: Tensor, token_mask: Optional[Tensor]) -> None:
        """Add this forward's assignments of real tokens to ``expert_load`` (on the device, no host sync)."""
        flat = indices.reshape(-1)
        if token_mask is None:
            ones = torch.ones_like(flat)
        else:
            ones = token_mask.to(torch.int64)[..., None].expand(indices.shape).reshape(-1)
        self.expert_load.scatter_add_(0, flat, ones)

    @torch.no_grad()
    def update_balance(self, load: Tensor) -> None:
        """DeepSeek-V3's bias update (arXiv:2412.19437 section 2.1.2; Wang et al. 2024, arXiv:2408.15664, Algorithm 1):
        ``correction_bias += bias_update_speed * sign(mean(load) - load)``; an expert above the mean load is chosen
        less often, one below more. ``load [n_experts]``: one optimizer step's assignments over every data-parallel
        rank. No gradient; a no-op without a correction bias or at speed 0."""
        if self.correction_bias is None or self.bias_update_speed == 0.0:
            return
        load = load.to(device=self.correction_bias.device, dtype=torch.float32)
        self.correction_bias.add_(torch.sign(load.mean() - load), alpha=self.bias_update_speed)


def _router_sizes(ctx: BuildContext) -> tuple[int, int]:
    try:
        return int(ctx.extra["n_experts"]), int(ctx.extra["top_k"])
    except KeyError:
        raise ValueError(
            "a router is built by an MoE, which passes n_experts and top_k in BuildContext.extra; "
            f"got extra = {dict(ctx.extra)!r}"
        ) from None


def _make_router(cfg: RouterConfig, ctx: BuildContext) -> TopKRouter:
    n, k = _router_sizes(ctx)
    return TopKRouter(
        ctx.dim or ctx.d_model,
        n,
        k,
        cfg.renormalize,
        cfg.bias,
        score=SCORE_OF[cfg.type],
        renormalize_p=cfg.renormalize_p,
        routed_scaling_factor=cfg.routed_scaling_factor,
        n_group=cfg.n_group,
        topk_group=cfg.topk_group,
        group_score=cfg.group_score,
        correction_bias=cfg.correction_bias,
        bias_update_speed=cfg.bias_update_speed,
        renormalize_eps=cfg.renormalize_eps,
    )


def _router_flops(cfg: RouterConfig, ctx: BuildContext, work: Workload) -> dict[str, int]:
    """The logits: ``2 · d_model · n_experts`` FLOPs per token (scores, groups and top-k are not matrix products)."""
    n, _ = _router_sizes(ctx)
    return {"proj": 2 * work.tokens * (ctx.dim or ctx.d_model) * n}


def _router_count(cfg: RouterConfig, ctx: BuildContext) -> int:
    """``n_experts · d_model`` (+ ``n_experts`` with a bias); the correction bias is a buffer, not a parameter."""
    n, _ = _router_sizes(ctx)
    return n * (ctx.dim or ctx.d_model) + (n if cfg.bias else 0)


#: Key formulas of the docs pages (pymdownx.arithmatex).
_ROUTER_MATH = r"""For a token $x$, with $W_r$: $d_{model} \to N$ ($N$ = n_experts), $k$ = top_k and $b$ the correction
bias (zero without correction_bias):

$$z = W_r\, x \ \text{(float32)}, \qquad s = SCORE, \qquad \mathcal{T} = \operatorname{top-}k(s + b), \qquad
g_e = \rho \cdot \begin{cases} s_e \,/ \sum_{e' \in \mathcal{T}} s_{e'} & \text{renormalize} \\ s_e & \text{otherwise}
\end{cases} \quad (e \in \mathcal{T})$$

$\rho$ = routed_scaling_factor; with renormalize_p $p \ne 1$ the weights are divided by their $p$-norm
$(\sum_{e' \in \mathcal{T}} s_{e'}^p)^{1/p}$ instead of their sum (DBRX). The bias changes which experts are chosen, never the weights $g_e$. With n_group $G$
and topk_group $M$ the $N$ experts form $G$ groups of $N/G$ consecutive experts, each group is scored by the sum of its
two largest $s_e + b_e$ (group_score top2_sum) or the largest (max), and $\mathcal{T}$ is taken among the experts of
the $M$ best groups only. After each optimizer step the training loop moves the bias from the step's loads $c_e$
(assignments of real tokens, summed over data-parallel ranks), $\gamma$ = bias_update_speed:

$$b_e \leftarrow b_e + \gamma\, \operatorname{sign}(\bar c - c_e), \qquad \bar c = \tfrac{1}{N} \textstyle\sum_{e} c_e$$

It returns the weights $g_e$ and indices $\mathcal{T}$ of the $k$ chosen experts and the logits $z$."""

_MATH = {
    "topk": _ROUTER_MATH.replace("SCORE", r"\mathrm{softmax}(z)"),
    "sigmoid_topk": _ROUTER_MATH.replace("SCORE", r"\sigma(z) \ \text{(element-wise)}")
    + r"""

The balance loss of the holding mixture reads the normalised scores $s'_e = s_e / \sum_{e'} s_{e'}$ (DeepSeek-V3,
eq. 19).""",
    "sqrtsoftplus_topk": _ROUTER_MATH.replace("SCORE", r"\sqrt{\log(1 + e^{z})} \ \text{(element-wise)}")
    + r"""

The balance loss of the holding mixture reads the normalised scores $s'_e = s_e / \sum_{e'} s_{e'}$ (as for the sigmoid
scores of DeepSeek-V3).""",
}

_ROUTER_REFERENCE = (
    "Shazeer et al. 2017, arXiv:1701.06538; Fedus et al. 2021, arXiv:2101.03961; Jiang et al. 2024, Mixtral of "
    "Experts, arXiv:2401.04088; DeepSeek-AI 2024, DeepSeek-V2 (arXiv:2405.04434) and DeepSeek-V3 (arXiv:2412.19437); "
    "Wang et al. 2024, Auxiliary-Loss-Free Load Balancing Strategy for Mixture-of-Experts, arXiv:2408.15664"
)


def register_routers(register) -> None:
    """Register the ``topk``, ``sigmoid_topk``, ``sqrtsoftplus_topk`` and ``hash`` routers through ``register`` (called by ``moe.py``'s
    ``register_components``, so the routers keep the ``builtin-moe`` provider)."""
    router_caps = {"compile_safe": True, "tp_plan": {}}  # replicated: small, float32 logits
    register(
        Component(
            kind="router",
            type="topk",
            config=TopKRouterConfig,
            factory=_make_router,
            math=_MATH["topk"],
            description="Linear router: float32 logits, softmax scores, top-k experts (optionally within the best "
            "groups, chosen with a selection-only correction bias), weights optionally renormalised and scaled. "
            "[tokens, d_model] -> (weights [tokens, top_k], indices [tokens, top_k] int64, logits [tokens, n_experts] "
            "float32); counts each expert's load. Built by an moe, which supplies n_experts and top_k. Mixtral, "
            "Qwen-MoE, OLMoE, gpt-oss (bias: true), DeepSeek-V2 (groups, group_score max).",
            reference=_ROUTER_REFERENCE,
            capabilities=router_caps,
            param_count=_router_count,
            flops=_router_flops,
            example={"type": "topk", "renormalize": True},
        )
    )
    register(
        Component(
            kind="router",
            type="sigmoid_topk",
            config=SigmoidTopKRouterConfig,
            factory=_make_router,
            math=_MATH["sigmoid_topk"],
            description="Linear router with an independent sigmoid score per expert: float32 logits, top-k experts "
            "(optionally within the best groups), chosen with an optional selection-only correction bias that the "
            "training loop moves from each step's expert loads (auxiliary-loss-free balancing); weights optionally "
            "renormalised and scaled. Same outputs as topk. DeepSeek-V3 / Kimi K2 (correction_bias, n_group, "
            "renormalize, routed_scaling_factor), Llama 4 (renormalize: false).",
            reference=_ROUTER_REFERENCE + "; Meta 2025, Llama 4 (transformers Llama4Router)",
            capabilities=router_caps,
            param_count=_router_count,
            flops=_router_flops,
            example={
                "type": "sigmoid_topk",
                "renormalize": True,
                "correction_bias": True,
                "n_group": 2,
                "topk_group": 1,
                "routed_scaling_factor": 2.5,
            },
        )
    )
    register(
        Component(
            kind="router",
            type="sqrtsoftplus_topk",
            config=SqrtSoftplusTopKRouterConfig,
            factory=_make_router,
            math=_MATH["sqrtsoftplus_topk"],
            description="Linear router with an independent sqrt(softplus(logit)) score per expert (DeepSeek-V4's "
            "sqrtsoftplus affinity): float32 logits, top-k experts (optionally within the best groups, with a "
            "selection-only correction bias), weights optionally renormalised and scaled. Same outputs as topk. "
            "DeepSeek-V4 (correction_bias, renormalize, routed_scaling_factor).",
            reference=_ROUTER_REFERENCE + "; DeepSeek-AI 2026, DeepSeek-V4 (transformers DeepseekV4TopKRouter, "
            "scoring_func sqrtsoftplus)",
            capabilities=router_caps,
            param_count=_router_count,
            flops=_router_flops,
            example={"type": "sqrtsoftplus_topk", "renormalize": True, "correction_bias": True},
        )
    )
    from .hash_router import register_hash_router
    from .sparsemixer_router import register_sparsemixer_router

    register_hash_router(register, router_caps)
    register_sparsemixer_router(register, router_caps)

"""Sparse mixture of experts: the ``moe`` FFN (its ``topk`` / ``sigmoid_topk`` routers: :mod:`modkit_plugins.routers`).

``moe``: ``forward(x [batch, seq, d_model]) -> (y [batch, seq, d_model], aux_loss [] float32)``.
Each token is sent to ``top_k`` of ``n_experts`` experts (each expert is itself a full ``ffn`` spec, e.g. a
SwiGLU, at its own width) chosen by a learned router; the output is the router-weighted sum of those experts'
outputs, plus an optional shared expert every token passes through (with ``latent_dim``, the routed experts work between
two dense projections, Nemotron 3's latent mixture: :mod:`modkit_plugins.moe_sizes`):

    s       = softmax(router(x)) | sigmoid(router(x))  # [tokens, n_experts], float32
    idx     = top_k(s + correction_bias)              # inside the topk_group best of n_group groups, if asked
    w       = s[idx] (/ sum, if renormalize) * routed_scaling_factor
    y       = sum_k w[:, k] * expert[idx[:, k]](x)    # weight_on "input": expert[idx[:, k]](w[:, k] * x)
            + sigmoid(shared_gate . x) * shared(x)    # the gate only with shared_gate

Zero-computation experts (LongCat-Flash, arXiv:2509.01322; ``n_zero_experts``): the router picks among
``n_experts + n_zero_experts`` choices and a choice ``>= n_experts`` returns its input, ``y += w * x``, with no
parameters and no FLOPs, so a token's compute varies with its routing. Hash routing by token id (the ``hash``
router) gets the ids through ``token_ids`` (``AttentionInputs.token_ids``, passed by :func:`modkit.run_ffn`).

Each published router (Mixtral, Qwen-MoE, OLMoE, gpt-oss, DeepSeek-V2/V3, Kimi K2, Llama 4) is a setting of the
two router types: the list is in :mod:`modkit_plugins.routers`, which defines them; this module registers them
beside the ``moe`` and re-exports their names.

Auxiliary losses (returned, never hidden in side channels), computed per MoE layer over that layer's tokens:

* load balancing (Switch Transformer): ``n_experts * sum_e f_e * P_e`` with ``f_e`` the fraction of the
  ``tokens * top_k`` routing assignments that went to expert ``e`` (no gradient) and ``P_e`` the mean router
  probability of ``e`` (the router's ``probabilities``: softmax, or DeepSeek-V3's normalised sigmoid scores;
  gradient flows into the router). Perfectly balanced routing gives 1. This is Megatron-LM's normalisation; Hugging
  Face Mixtral's ``load_balancing_loss_func`` gives ``top_k`` times this value. With ``aux_loss_scope`` "sequence"
  it is computed per sequence and averaged: DeepSeek-V3's sequence-wise balance loss (arXiv:2412.19437, eq. 17-20).
* router z-loss (ST-MoE): mean over tokens of ``logsumexp(logits)^2`` (computed with ``torch.logsumexp``, so
  logits of 100 stay finite).

``aux_loss = aux_loss_coef * load_balancing + z_loss_coef * z_loss``.

Auxiliary-loss-free balancing (DeepSeek-V3; Wang et al. 2024, arXiv:2408.15664): the routers count each expert's
load (assignments of real tokens, the ``expert_load`` buffer) and, with ``correction_bias``, keep a float32 bias
that is added to the scores for the choice of experts only; the training loop moves it after each optimizer step,
``b_e += bias_update_speed * sign(mean load - load_e)`` (:meth:`TopKRouter.update_balance`,
:mod:`modkit.nn.balance`). No gradient reaches it; it is saved in checkpoints.

Routing does no host synchronisation (no ``.item()``, ``.tolist()``, ``.nonzero()`` or data-dependent Python
control flow), so the layer compiles with ``torch.compile(fullgraph=True)`` (torchtune #2771). Two dispatch
schemes, chosen statically by ``capacity_factor``:

* ``null`` (default), dropless and exact: the ``tokens * top_k`` assignments are sorted by expert (a stable
  ``argsort``; group ends counted on the device), the tokens' rows gathered in that order, and one grouped GEMM per
  projection (:func:`modkit.nn.grouped.grouped_mm`) runs every expert on exactly its rows; the weighted outputs are
  added back per token with ``index_add``. Cost: the active FLOPs, plus a gather and a scatter of ``tokens * top_k``
  rows (MegaBlocks, Gale et al. 2022, arXiv:2211.15841, without the block-sparse kernels).
* a number ``c``: each expert processes a fixed ``capacity = min(tokens, ceil(c * tokens * top_k / n_experts))``
  slots (Switch Transformer / GShard). Assignments are served first choices first, then in token order;
  assignments beyond an expert's capacity are dropped (that expert contributes 0 for that token). Cost:
  ``c`` times the active FLOPs. With ``c >= n_experts / top_k`` nothing is ever dropped.

The experts are one module with stacked weights, built by the expert type's ``grouped_factory`` (``mlp``,
``swiglu``, ``geglu`` and ``swiglu_clamped`` have one): SwiGLU experts hold ``experts.gate``/``experts.up``
``[n_experts, d_model, d_ff]`` and ``experts.down`` ``[n_experts, d_ff, d_model]`` (with ``bias``, also
``experts.gate_bias``... ``[n_experts, d_ff]``: gpt-oss). The shared expert is an ordinary ffn module (``shared``).

Expert parallelism (:mod:`modkit.parallel.expert`, capability ``ep_plan``): the stacked experts are split on the
expert index over the ``ep`` ranks; the dropless path hands its sorted rows and per-expert counts to the module's
``dispatcher``, which sends them to their experts' ranks by all-to-all and back; with ``token_group`` set the aux
losses are computed over every data-parallel rank's tokens (:func:`modkit_plugins.moe_losses.global_aux_loss`).

Padding: ``forward`` takes an optional ``token_mask [batch, seq]`` (True = real token; the module sets
``takes_token_mask`` so placements pass it through :func:`modkit.run_ffn`): padding tokens count in neither
loss nor the router's loads and take no expert capacity (Megatron-LM #2121).

References: Shazeer et al. 2017, Outrageously Large Neural Networks: The Sparsely-Gated Mixture-of-Experts
Layer (arXiv:1701.06538); Lepikhin et al. 2020, GShard (arXiv:2006.16668); Fedus et al. 2021, Switch
Transformers (arXiv:2101.03961); Zoph et al. 2022, ST-MoE: Designing Stable and Transferable Sparse Expert
Models (arXiv:2202.08906); Jiang et al. 2024, Mixtral of Experts (arXiv:2401.04088); Dai et al. 2024, DeepSeekMoE
(arXiv:2401.06066); DeepSeek-AI 2024, DeepSeek-V2 (arXiv:2405.04434) and DeepSeek-V3 (arXiv:2412.19437); Wang et
al. 2024, Auxiliary-Loss-Free Load Balancing Strategy for Mixture-of-Experts (arXiv:2408.15664); the transformers
modules ``DeepseekV3MoE``, ``Qwen2MoeSparseMoeBlock``, ``GptOssMLP`` and ``Llama4TextMoe`` for the exact forms.
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
    hookimpl,
    LossCoef,
    MAX_EXPERTS,
    MAX_LOSS_COEF,
    Slot,
)
from .moe_sizes import (  # noqa: F401 - importable from here as before the sizes had a module
    expert_capacity,
    expert_context,
    moe_count as _moe_count,
    moe_flops as _moe_flops,
)
from .moe_losses import global_aux_loss, load_balancing_loss, z_loss  # noqa: F401 - importable from here as before
from .routers import (  # noqa: F401 - the router names, importable from here as before the routers had a module
    _MATH as _ROUTER_MATHS,
    _ROUTER_MATH,
    _ROUTER_REFERENCE,
    _make_router,
    _router_count,
    _router_flops,
    _router_sizes,
    check_groups,
    register_routers,
    RouterConfig,
    SigmoidTopKRouterConfig,
    TopKRouter,
    TopKRouterConfig,
)

# ----------------------------------------------------------------------------------------------------- moe


class MoEConfig(ComponentConfig):
    """Config of ``moe``: ``n_experts`` copies of an ``ffn`` spec and a ``router`` (both required), optionally a
    shared expert beside them.

    The router is required, not defaulted, so that its ``renormalize`` flag is always explicit in the spec.
    """

    type: Literal["moe"] = "moe"
    n_experts: ExpertCount = Field(..., description="number of routed experts")
    top_k: ExpertCount = Field(2, description="experts per token; must be <= n_experts")
    expert: ComponentConfig = Slot(
        "ffn",
        description="spec of one routed expert (an ffn type with a grouped form: mlp, swiglu, geglu, swiglu_clamped), "
        'e.g. {"type": "swiglu", "d_ff": 14336}; its d_ff is the expert\'s own width (fine-grained experts: '
        "DeepSeek's moe_intermediate_size). The n_experts independent copies are stored stacked "
        "(experts.gate [n_experts, d_model, d_ff] ...)",
    )
    router: ComponentConfig = Slot(
        "router",
        description='router spec, e.g. {"type": "topk", "renormalize": true}; it gets n_experts and top_k from here',
    )
    shared: Optional[ComponentConfig] = Slot(
        "ffn",
        default=None,
        description="a shared expert every token passes through beside the routed ones: any dense ffn spec with its "
        "own d_ff (DeepSeek: n_shared_experts * moe_intermediate_size; Qwen2-MoE: shared_expert_intermediate_size; "
        "Llama 4: intermediate_size); its output is added to the routed mixture. null: none",
    )
    shared_gate: bool = Field(
        False,
        description="multiply the shared expert's output by sigmoid(w . x), w a learned [d_model] vector (Qwen2-MoE's "
        "shared_expert_gate); needs shared",
    )
    weight_on: Literal["output", "input"] = Field(
        "output",
        description="where a routed expert's gate weight applies: 'output' (y = sum_e g_e E_e(x): Mixtral, DeepSeek, "
        "Qwen, gpt-oss) or 'input' (y = sum_e E_e(g_e x): Llama 4 scales the expert's input)",
    )
    aux_loss_coef: LossCoef = Field(
        0.01,
        description="weight of the Switch Transformer load-balancing loss n_experts * sum_e f_e * P_e (1 when balanced); "
        f"at most {MAX_LOSS_COEF:g} (published models use 1e-4-0.02; a larger weight swamps the language-model loss)",
    )
    aux_loss_scope: Literal["batch", "sequence"] = Field(
        "batch",
        description="the tokens the load-balancing loss is computed over: 'batch', all tokens of the layer (Switch); "
        "'sequence', each sequence on its own, then the mean over sequences (DeepSeek-V3's sequence-wise balance "
        "loss, aux_loss_coef 0.0001 there)",
    )
    z_loss_coef: LossCoef = Field(
        0.0,
        description="weight of the ST-MoE router z-loss mean(logsumexp(logits)^2); at most "
        f"{MAX_LOSS_COEF:g} (ST-MoE uses 0.001)",
    )
    n_zero_experts: int = Field(
        0,
        ge=0,
        le=MAX_EXPERTS,
        description="zero-computation experts beside the n_experts routed ones (LongCat-Flash's zero_expert_num): the "
        "router scores n_experts + n_zero_experts choices and a token sent to a zero expert gets g * x back, its input "
        "times the gate weight, for no FLOPs and no parameters (their slots are the last n_zero_experts indices). "
        "Needs dropless dispatch (capacity_factor null). 0: none",
    )
    latent_dim: Optional[int] = Field(
        None,
        ge=1,
        le=1 << 20,
        description="the routed experts work in a latent space of this width between two dense projections every "
        "token passes through, latent_down [d_model -> latent_dim] before the experts and latent_up [latent_dim -> "
        "d_model] after their weighted sum; the router, the shared expert and its gate still read the full-width "
        "input (Nemotron 3's latent mixture: moe_latent_size). Its expert spec's d_ff is then the latent experts' "
        "width. null: the experts read and write d_model",
    )
    latent_bias: bool = Field(
        False,
        description="biases on latent_down and latent_up (Nemotron 3: mlp_bias); needs latent_dim",
    )
    capacity_factor: Optional[float] = Field(
        None,
        gt=0,
        le=MAX_EXPERTS,
        allow_inf_nan=False,
        description="null: dropless (each token goes through exactly its top_k experts; exact); c: each expert processes "
        "ceil(c * tokens * top_k / n_experts) tokens and drops the overflow (Switch/GShard: 1-2). At most "
        f"{MAX_EXPERTS:,} (the expert bound): a factor of n_experts already keeps every token",
    )

    @model_validator(mode="after")
    def _check(self) -> "MoEConfig":
        if self.top_k > self.n_experts + self.n_zero_experts:
            zero = f" + n_zero_experts = {self.n_zero_experts} choices" if self.n_zero_experts else ""
            raise ValueError(
                f"top_k = {self.top_k} exceeds n_experts = {self.n_experts}{zero}; top_k must be <= n_experts"
                + (" + n_zero_experts" if zero else "")
            )
        if self.n_zero_experts and self.capacity_factor is not None:
            raise ValueError(
                f"n_zero_experts = {self.n_zero_experts} needs dropless dispatch, but capacity_factor = "
                f"{self.capacity_factor:g}; set capacity_factor null or n_zero_experts 0"
            )
        for name in ("expert", "shared"):
            if isinstance(getattr(self, name), MoEConfig):
                raise ValueError(
                    f"{name} is itself an 'moe'; nested mixtures are not supported: give a dense ffn "
                    '(e.g. {"type": "swiglu", "d_ff": ...}) as the '
                    + ("expert" if name == "expert" else "shared expert")
                )
        if self.latent_bias and self.latent_dim is None:
            raise ValueError(
                "latent_bias = true puts biases on the latent projections, but latent_dim is null; give latent_dim "
                "(the experts' latent width) or drop latent_bias"
            )
        if self.latent_dim is not None and self.n_zero_experts:
            raise ValueError(
                f"latent_dim = {self.latent_dim} with n_zero_experts = {self.n_zero_experts}: a zero expert returns "
                "its input, and whether that is the latent or the full-width input is not defined by any reference; "
                "set latent_dim null or n_zero_experts 0"
            )
        if self.shared_gate and self.shared is None:
            raise ValueError(
                "shared_gate = true gates a shared expert, but shared is null; give shared an ffn spec or drop shared_gate"
            )
        n_group = getattr(self.router, "n_group", None)
        problem = check_groups(
            self.n_experts + self.n_zero_experts,
            self.top_k,
            n_group,
            getattr(self.router, "topk_group", None),
            getattr(self.router, "group_score", "top2_sum"),
        )
        if problem:
            raise ValueError(f"router: {problem}")
        return self

    def check(self, ctx) -> list[tuple[str, str]]:
        """Cross-field check against the registry: the expert type must be a dense ffn with a grouped form and no
        ``activation_sparsity`` (the grouped form has none); the shared expert a dense ffn."""
        problems = []
        entry = ctx.registry.entry_for_config(self.expert)
        if entry.capabilities.get("aux_loss"):
            problems.append(
                (
                    "expert",
                    f"expert type {self.expert.type!r} returns an aux loss (it is a mixture itself); use a dense ffn",
                )
            )
        elif entry.grouped_factory is None:
            able = sorted(e.type for e in ctx.registry.components("ffn") if e.grouped_factory is not None)
            problems.append(
                (
                    "expert",
                    f"expert type {self.expert.type!r} ({entry.provider}) has no grouped form (Component."
                    f"grouped_factory) to stack n_experts copies; use one that has: {', '.join(able)}, or give it one",
                )
            )
        sparsity = getattr(self.expert, "activation_sparsity", 0.0)  # a gated ffn's Gaussian top-k (Gemma 3n)
        if sparsity:
            problems.append(
                (
                    "expert.activation_sparsity",
                    f"= {sparsity}: the stacked experts have no Gaussian top-k; set it to 0 (a dense ffn may keep it)",
                )
            )
        if self.shared is not None and ctx.registry.entry_for_config(self.shared).capabilities.get("aux_loss"):
            problems.append(
                (
                    "shared",
                    f"shared type {self.shared.type!r} returns an aux loss (it is a mixture itself); use a dense ffn",
                )
            )
        return problems


class MoE(nn.Module):
    """Top-k mixture of experts. ``forward(x [batch, seq, d_model], token_mask=None) -> (y, aux_loss)``.

    Attributes:
        router: the router module (``router.proj.weight [n_experts, d_model]``).
        experts: the expert type's grouped form: ``n_experts`` copies with stacked weights, ``forward(rows
            [N, d_model], offs [n_experts] int32) -> [N, d_model]`` (SwiGLU: ``experts.gate``/``experts.up``
            ``[n_experts, d_model, d_ff]``, ``experts.down`` ``[n_experts, d_ff, d_model]``).
        shared: the shared expert (a dense ffn module) or ``None``.
        shared_gate: ``nn.Linear(d_model, 1, bias=False)`` gating the shared expert, or ``None``.
        latent_down, latent_up: with ``latent_dim``, ``nn.Linear(d_model, latent_dim)`` and ``nn.Linear(latent_dim,
            d_model)`` (biases with ``latent_bias``) around the routed experts, which then map ``[N, latent_dim]``
            to the same (:mod:`modkit_plugins.moe_sizes`); ``None`` otherwise.
        n_experts, top_k, aux_loss_coef, aux_loss_scope, z_loss_coef, capacity_factor, weight_on: from the config.

    See the module docstring for the math, the two dispatch schemes and their cost.
    """

    #: parameter roles (:mod:`modkit.core.roles`): the router, the experts and the shared expert declare their own; the
    #: shared gate ``[1, d_model]`` maps the width to one score like a router's row, so it is a ``router`` (AdamW
    #: under Muon, muP's readout rule), not a hidden matrix
    param_roles = {"shared_gate.weight": "router"}

    def __init__(self, cfg: MoEConfig, ctx: BuildContext):
        super().__init__()
        self.n_experts, self.top_k = cfg.n_experts, cfg.top_k
        self.aux_loss_coef, self.z_loss_coef = cfg.aux_loss_coef, cfg.z_loss_coef
        self.aux_loss_scope, self.weight_on = cfg.aux_loss_scope, cfg.weight_on
        self.capacity_factor = cfg.capacity_factor
        #: routed experts plus zero-computation experts: the router's choices (indices >= n_experts: zero experts)
        self.n_choices = cfg.n_experts + cfg.n_zero_experts
        self.router = ctx.build(cfg.router, extra={**ctx.extra, "n_experts": self.n_choices, "top_k": cfg.top_k})
        #: the router routes by token id (a hash router): placements pass token_ids through modkit.run_ffn
        self.takes_token_ids = bool(getattr(self.router, "takes_token_ids", False))
        self.experts = expert_context(cfg, ctx).build_grouped(cfg.expert, cfg.n_experts)
        self.shared = ctx.build(cfg.shared) if cfg.shared is not None else None
        d = ctx.dim or ctx.d_model
        self.shared_gate = nn.Linear(d, 1, bias=False) if cfg.shared_gate else None
        latent = cfg.latent_dim
        self.latent_down = nn.Linear(d, latent, bias=cfg.latent_bias) if latent is not None else None
        self.latent_up = nn.Linear(latent, d, bias=cfg.latent_bias) if latent is not None else None
        #: set by expert parallelism (:mod:`modkit.parallel.expert`): ``dispatcher(rows [N, d] sorted by expert,
        #: counts [n_experts] int32, run) -> [N, d]`` sends each row to its expert's rank and back; ``None``: all local
        self.dispatcher = None
        #: set by expert parallelism: the process group over which the layer's tokens are spread (the data-parallel
        #: ranks); the aux losses are then computed over the global token set, as one process would
        self.token_group = None

    def ep_refusal(self, ep: int) -> Optional[str]:
        """Why this layer cannot be split over ``ep`` expert-parallel ranks (``None`` when it can): ``ep`` must
        divide ``n_experts``, and the dispatch must be dropless (the capacity form counts an expert's slots over
        the tokens of one process)."""
        if self.n_experts % ep:
            return (
                f"n_experts = {self.n_experts} is not divisible by ep = {ep} (each rank holds n_experts / ep experts)"
            )
        if self.n_choices != self.n_experts:
            return f"n_zero_experts = {self.n_choices - self.n_experts}: zero experts are not expert-parallel yet"
        if self.capacity_factor is not None:
            return (
                f"capacity_factor = {self.capacity_factor:g}: fixed-capacity dispatch is not expert-parallel yet "
                "(its slots are counted over one process's tokens); set capacity_factor null (dropless)"
            )
        return None

    def inactive_params_per_token(self) -> int:
        """Parameters a token does not use: ``(n_experts - top_k) *`` one routed expert's parameters (the router,
        the shared expert and the latent projections serve every token); with zero experts the fewest a token can leave unused,
        ``max(0, n_experts - top_k)`` experts' (a token whose top_k choices are all real experts)."""
        per_expert = sum(p.numel() for p in self.experts.parameters()) // self.n_experts
        return max(0, self.n_experts - self.top_k) * per_expert

    def capacity(self, n_tokens: int) -> int:
        """Slots per expert for ``n_tokens`` tokens (``capacity_factor`` mode): ``min(T, ceil(c * T * k / n))``
        (:func:`expert_capacity`)."""
        return expert_capacity(self.capacity_factor, n_tokens, self.top_k, self.n_experts)

    takes_token_mask = True  # placements pass the padding mask through modkit.run_ffn

    def forward(
        self, x: Tensor, token_mask: Optional[Tensor] = None, token_ids: Optional[Tensor] = None
    ) -> tuple[Tensor, Tensor]:
        """Mix experts.

        Args:
            x: ``[batch, seq, d_model]``.
            token_mask: optional ``[batch, seq]`` bool, True for real tokens; padding is excluded from the aux
                losses, from the router's loads and from expert capacity (its output is unspecified).
            token_ids: optional ``[batch, seq]`` int64 token ids, handed to a router that routes by them (its
                ``takes_token_ids``; such a router raises ValueError without them).

        Returns:
            ``(y [batch, seq, d_model] in x's dtype, aux_loss [] float32)``.
        """
        flat = x.reshape(-1, x.shape[-1])
        mask = token_mask.reshape(-1).to(torch.bool) if token_mask is not None else None
        kwargs = {}
        if getattr(self.router, "takes_token_mask", False):
            kwargs["token_mask"] = mask
        if self.takes_token_ids:
            kwargs["token_ids"] = token_ids.reshape(-1) if token_ids is not None else None
        weights, indices, logits = self.router(flat, **kwargs)  # [T, k], [T, k], [T, n_choices]
        # [T, d_model or latent_dim], in x's dtype: under autocast latent_down gives bfloat16 rows, which the stacked
        # experts' float32 weights refuse (the rows of the plain form are x itself)
        rows = flat if self.latent_down is None else self.latent_down(flat).to(flat.dtype)
        if self.capacity_factor is None:
            y = self._dropless(rows, weights, indices)
        else:
            y = self._capacity(rows, weights, indices, mask)
        y = (y if self.latent_up is None else self.latent_up(y).to(x.dtype)).view(x.shape)
        if self.shared is not None:
            s = self.shared(x)
            if self.shared_gate is not None:
                s = torch.sigmoid(self.shared_gate(x)) * s
            y = y + s
        return y, self._aux_loss(logits, indices, mask, x.shape[0])

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
        """Each token through exactly its top-k experts: sort assignments by expert, one grouped call, scatter back.

        Zero experts (indices ``>= n_experts``) sort last, past the last real expert's group end, so the grouped
        call computes none of their rows (:func:`modkit.nn.grouped.grouped_mm`: rows past ``offs[-1]`` are not
        computed); they enter the experts as zeros and leave as their input rows, so no unspecified value reaches
        the output or the gradient (LongCat-Flash's zero-computation experts)."""
        k = self.top_k
        experts = indices.reshape(-1)  # [T*k]: assignment a is token a // k's choice a % k
        order = experts.argsort(stable=True)  # assignments grouped by expert, token order inside a group
        tok = order // k
        counts = torch.zeros(self.n_choices, dtype=torch.int32, device=flat.device)
        counts = counts.scatter_add(0, experts, torch.ones_like(experts, dtype=torch.int32))[: self.n_experts]
        w = weights.reshape(-1)[order, None]
        rows = flat[tok] * w if self.weight_on == "input" else flat[tok]
        zero = experts[order, None] >= self.n_experts if self.n_choices != self.n_experts else None
        run = rows if zero is None else rows.masked_fill(zero, 0.0)
        if self.dispatcher is None:
            out = self._run_experts(run, counts.cumsum(0, dtype=torch.int32))  # [T*k, d]
        else:  # expert parallelism: the rows travel to their experts' ranks and back (modkit.parallel.expert)
            out = self.dispatcher(run, counts, self._run_experts)
        if zero is not None:
            out = torch.where(zero, rows, out)
        out = out if self.weight_on == "input" else out * w
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
        rows = flat[tok] * w_flat[:, None] if self.weight_on == "input" else flat[tok]
        buf = flat.new_zeros(trash + 1, d).index_add(0, slot, rows)
        offs = torch.arange(1, n + 1, device=flat.device, dtype=torch.int32) * cap  # expert e owns slots [e*C, (e+1)*C)
        out = torch.cat([self._run_experts(buf[:trash], offs), flat.new_zeros(1, d)], dim=0)  # the trash row outputs 0
        scale = keep.to(w_flat.dtype) if self.weight_on == "input" else w_flat * keep.to(w_flat.dtype)
        return flat.new_zeros(n_tok, d).index_add(0, tok, out[slot] * scale[:, None])

    def _balance_probs(self, logits: Tensor) -> Tensor:
        """The router's probabilities for the balance loss (its ``probabilities(logits)``; softmax without one)."""
        fn = getattr(self.router, "probabilities", None)
        return fn(logits) if fn is not None else torch.softmax(logits, dim=-1)

    def _aux_loss(self, logits: Tensor, indices: Tensor, mask: Optional[Tensor], batch: int) -> Tensor:
        if self.token_group is not None:
            return global_aux_loss(self, logits, indices, mask, batch)
        aux, n = logits.new_zeros(()), self.n_choices
        if self.aux_loss_coef:
            probs = self._balance_probs(logits)
            if self.aux_loss_scope == "sequence":  # one group of tokens per sequence
                probs, indices = probs.view(batch, -1, probs.shape[-1]), indices.view(batch, -1, indices.shape[-1])
                mask = mask.view(batch, -1) if mask is not None else None
            aux = aux + self.aux_loss_coef * load_balancing_loss(probs, indices, n, mask)
        if self.z_loss_coef:
            aux = aux + self.z_loss_coef * z_loss(logits, mask)
        return aux


#: Key formulas of the docs pages (pymdownx.arithmatex); the routers' are in :mod:`modkit_plugins.routers`.
_MATH = {
    **_ROUTER_MATHS,
    "moe": r"""Each token $x$ goes to the $k$ = top_k experts $\mathcal{T}$ its router picks, with weights $g_e$ (see the
router), plus the shared expert $S$ when there is one:

$$y = \sum_{e \in \mathcal{T}} g_e\, E_e(x) + \gamma(x)\, S(x), \qquad \mathcal{T} = \operatorname{top-}k(p), \qquad
\gamma(x) = \begin{cases} \sigma(w_s \cdot x) & \text{shared\_gate} \\ 1 & \text{otherwise} \end{cases}$$

$p$: the router's selection scores (its softmax or sigmoid of $W_r\, x$, plus the correction bias when it has one).

With weight_on input (Llama 4) the weight scales the expert's input instead: $\sum_{e \in \mathcal{T}} E_e(g_e\, x)$.

With latent_dim (Nemotron 3's latent mixture) the routed experts work in a narrower space: $\sum_{e \in \mathcal{T}}
g_e\, E_e(x)$ becomes $U \big(\sum_{e \in \mathcal{T}} g_e\, E_e(D x)\big)$, $D$ = latent_down
($d_{model} \to$ latent_dim) and $U$ = latent_up (back), each with a bias under latent_bias; the router and $S$ read $x$.

The auxiliary loss over the $T$ tokens of the layer (padding excluded), $N$ = n_experts:

$$\mathcal{L}_{aux} = \alpha\, N \sum_{e=1}^{N} f_e\, P_e + \beta\, \frac{1}{T} \sum_{t=1}^{T}
\Big(\log \sum_{e=1}^{N} e^{z_{te}}\Big)^2$$

$f_e$: the fraction of the $T k$ assignments sent to expert $e$ (no gradient); $P_e$: the mean router probability
of $e$ (the router's scores normalised over experts); $z_t$: the router logits of token $t$; $\alpha$ = aux_loss_coef
(Switch load balancing, 1 when routing is uniform), $\beta$ = z_loss_coef (ST-MoE z-loss). With aux_loss_scope
sequence the first term is computed per sequence and averaged (DeepSeek-V3's sequence-wise balance loss). With
capacity_factor $c$ an expert takes at most $\min(T, \lceil c\, T k / N \rceil)$ tokens and the rest of its
assignments are dropped.""",
}


@hookimpl
def register_components(register) -> None:
    """Register the ``topk`` and ``sigmoid_topk`` routers and the ``moe`` FFN."""
    register_routers(register)
    register(
        Component(
            kind="ffn",
            type="moe",
            config=MoEConfig,
            factory=lambda cfg, ctx: MoE(cfg, ctx),
            math=_MATH["moe"],
            description="Sparse mixture of experts: a router sends each token to top_k of n_experts ffn experts and "
            "mixes their outputs, optionally beside a (gated) shared expert. [batch, seq, d_model] -> ([batch, seq, "
            "d_model], aux_loss scalar: Switch load-balancing loss, batch- or sequence-wise, and ST-MoE z-loss). No "
            "host synchronisation: dropless grouped-GEMM dispatch by default, fixed-capacity dispatch with "
            "capacity_factor. Experts need an ffn type with a grouped form.",
            reference="Shazeer et al. 2017, arXiv:1701.06538; Fedus et al. 2021, Switch Transformers, arXiv:2101.03961; "
            "Zoph et al. 2022, ST-MoE, arXiv:2202.08906; Jiang et al. 2024, Mixtral of Experts, arXiv:2401.04088; "
            "Dai et al. 2024, DeepSeekMoE (shared and fine-grained experts), arXiv:2401.06066; DeepSeek-AI 2024, "
            "DeepSeek-V3, arXiv:2412.19437; Qwen2-MoE (transformers Qwen2MoeSparseMoeBlock); Llama 4 "
            "(transformers Llama4TextMoe)",
            capabilities={
                "overflow_prone": True,
                "aux_loss": True,
                "compile_safe": True,
                # stacked experts sharded on d_ff; the router and the shared gate read the replicated input, whole on
                # every rank; the shared expert is an ffn with its own plan (it answers for itself)
                # the latent projections read and write replicated activations (the grouped experts all-reduce
                # their latent output and their input gradient), so they stay whole on every rank
                "tp_plan": {
                    "experts": "grouped",
                    "router": "replicate",
                    "shared_gate": "replicate",
                    "latent_down": "replicate",
                    "latent_up": "replicate",
                },
                # expert parallelism: the stacked experts split on dim 0 (the expert index) over the ep ranks, the
                # rows sent to them by all-to-all (the module's dispatcher; ep_refusal says when it cannot split)
                "ep_plan": {"experts": "experts"},
                "token_mask": True,  # forward(x, token_mask=None): padding leaves the aux losses and the loads
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

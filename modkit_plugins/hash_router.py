"""The ``hash`` router of the ``moe`` FFN: the experts of a token are a fixed function of its token id.

``forward(x [tokens, d_model], token_mask=None, token_ids=None) -> (weights [tokens, top_k], indices [tokens, top_k]
int64, logits [tokens, n_experts] float32)``, the router contract of :mod:`modkit.core.interfaces` plus the token ids
(``takes_token_ids``): the ``moe`` hands on the ids the model's forward was given (``AttentionInputs.token_ids``,
passed by :func:`modkit.run_ffn`). Nothing learned chooses the experts: ``indices = table[token_id]``, with
``table [vocab_size, top_k]`` int64 a buffer (saved, so a checkpoint's table, DeepSeek-V4's ``tid2eid``, loads over
it). A new table is Roller et al.'s "random hash": for each token id, ``top_k`` distinct experts drawn uniformly from a
generator seeded with ``hash_seed`` alone (never the model's seed), so every build of a spec routes alike.

The weights: with ``gate`` (DeepSeek-V4's ``DeepseekV4HashRouter``) a learned projection scores every expert
(softmax, sigmoid or sqrtsoftplus of float32 logits) and the chosen experts' scores are the weights, optionally
renormalised (sum or p-norm) and scaled; the projection is trained through the weights only. Without ``gate``
(Roller et al. 2021) each chosen expert weighs 1 (``1 / top_k`` with renormalize) and there are no parameters; the
logits are then zeros (a uniform softmax for the balance loss, which has no gradient to give).

References: Roller, Sukhbaatar, Szlam and Weston 2021, Hash Layers For Large Sparse Models (arXiv:2106.04426);
DeepSeek-AI 2026, DeepSeek-V4 (section 2.1; transformers ``DeepseekV4HashRouter``).
"""

from __future__ import annotations

from typing import Literal, Optional

import torch
from pydantic import Field, model_validator
from torch import Tensor, nn

from modkit.plugin import BuildContext, Component, ComponentConfig, Init, MAX_MULTIPLIER, Multiplier, Workload

from .routers import _router_sizes, normalise_weights, score_fn


class HashRouterConfig(ComponentConfig):
    """Config of the ``hash`` router (``n_experts`` and ``top_k`` come from the enclosing ``moe``)."""

    type: Literal["hash"] = "hash"
    renormalize: bool = Field(
        ...,
        description="true: divide the top-k weights by their sum (or renormalize_p norm): DeepSeek-V4; false: use "
        "them as they are. Required: no silent default",
    )
    renormalize_p: float = Field(
        1.0, gt=0, le=1000, allow_inf_nan=False, description="the norm renormalize divides by (1: the sum)"
    )
    gate: bool = Field(
        True,
        description="true: a learned projection d_model -> n_experts scores the experts and the hashed experts' "
        "scores are the weights (DeepSeek-V4); false: no parameters, each hashed expert weighs 1 (Roller et al.)",
    )
    score: Literal["softmax", "sigmoid", "sqrtsoftplus"] = Field(
        "sqrtsoftplus", description="score of the gate's float32 logits (DeepSeek-V4: sqrtsoftplus); with gate"
    )
    bias: bool = Field(False, description="bias on the gate projection; with gate")
    routed_scaling_factor: Multiplier = Field(
        1.0, description=f"multiplies the weights after renormalisation (DeepSeek-V4: 1.5); at most {MAX_MULTIPLIER:g}"
    )
    hash_seed: int = Field(
        0, ge=0, le=2**62, description="seed of the fixed random token-id -> experts table (not the model's seed)"
    )

    @model_validator(mode="after")
    def _check(self) -> "HashRouterConfig":
        if self.renormalize_p != 1.0 and not self.renormalize:
            raise ValueError(
                f"renormalize_p = {self.renormalize_p:g} needs renormalize true; set it or drop renormalize_p"
            )
        if self.bias and not self.gate:
            raise ValueError("bias = true is a bias on the gate projection, but gate is false; drop bias or set gate")
        return self


@torch.no_grad()
def hash_table(vocab_size: int, n_experts: int, top_k: int, seed: int) -> Tensor:
    """Roller et al.'s random hash (arXiv:2106.04426, section 3): ``[vocab_size, top_k]`` int64, row ``t`` holding
    ``top_k`` distinct experts drawn uniformly for token id ``t`` (the ``top_k`` largest of ``n_experts`` uniform
    draws, from a CPU generator seeded with ``seed``, in blocks of 4096 ids so memory stays small). The same on every
    machine and device for the same arguments."""
    g = torch.Generator(device="cpu").manual_seed(int(seed))
    rows = [
        torch.rand(min(4096, vocab_size - s), n_experts, generator=g).topk(top_k, dim=-1).indices
        for s in range(0, vocab_size, 4096)
    ]
    return torch.cat(rows).to(torch.int64)


class HashRouter(nn.Module):
    """Token-id hash router. ``forward(x [tokens, d_model], token_mask=None, token_ids=None)`` -> ``(weights [tokens,
    top_k] in x's dtype, indices [tokens, top_k] int64, logits [tokens, n_experts] float32)``::

        indices = table[token_ids]                                    # fixed, no gradient
        weights = score(proj(x))[indices] (/ p-norm) * routed_scaling_factor     # gate
                = 1 (/ top_k with renormalize) * routed_scaling_factor            # no gate

    ``table [vocab_size, top_k]`` int64 buffer (saved; :func:`hash_table` at init); ``proj`` (with ``gate``) is
    ``nn.Linear(d_model, n_experts)``, DeepSeek-V4's ``mlp.gate.weight`` (its table: ``mlp.gate.tid2eid``). Counts each
    expert's load of real tokens in ``expert_load`` like the top-k routers.

    Raises:
        ValueError: ``top_k`` outside ``[1, n_experts]`` (at build); no ``token_ids`` or ids of another shape than
            ``x``'s rows (at forward).
    """

    param_roles = {"proj.weight": "router", "proj.bias": "bias"}
    #: read in float32: decoding with low-precision weights keeps it as built
    matrix_weights = ("proj.weight",)
    takes_token_mask = True
    takes_token_ids = True  # the holder passes token_ids [tokens] int64

    # size: one keyword per config field
    def __init__(
        self,
        d_model: int,
        n_experts: int,
        top_k: int,
        vocab_size: int,
        renormalize: bool,
        *,
        gate: bool = True,
        score: str = "sqrtsoftplus",
        bias: bool = False,
        renormalize_p: float = 1.0,
        routed_scaling_factor: float = 1.0,
        hash_seed: int = 0,
    ):
        super().__init__()
        if not 1 <= top_k <= n_experts:
            raise ValueError(f"router needs 1 <= top_k <= n_experts, got top_k = {top_k}, n_experts = {n_experts}")
        self.n_experts, self.top_k, self.vocab_size, self.hash_seed = n_experts, top_k, vocab_size, int(hash_seed)
        self.renormalize, self.renormalize_p, self.score = renormalize, float(renormalize_p), score
        self.routed_scaling_factor = float(routed_scaling_factor)
        self.proj = nn.Linear(d_model, n_experts, bias=bias) if gate else None
        meta = torch.empty(0).device.type == "meta"
        table = torch.empty(vocab_size, top_k, dtype=torch.int64) if meta else self._table()
        self.register_buffer("table", table)
        self.register_buffer("expert_load", torch.zeros(n_experts, dtype=torch.int64), persistent=False)

    def _table(self) -> Tensor:
        return hash_table(self.vocab_size, self.n_experts, self.top_k, self.hash_seed)

    def init_weights(self, init: Init) -> None:
        """The hash table (:func:`hash_table`, from ``hash_seed``) and zero loads; ``proj`` gets the default init."""
        init.copy_(self.table, self._table())
        init.zeros_(self.expert_load)

    def probabilities(self, logits: Tensor) -> Tensor:
        """The gate's scores normalised to sum 1 over the experts (softmax as is), what the balance loss reads."""
        s = score_fn(self.score, logits)
        return s if self.score == "softmax" else s / s.sum(dim=-1, keepdim=True)

    def forward(
        self, x: Tensor, token_mask: Optional[Tensor] = None, token_ids: Optional[Tensor] = None
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Route ``x [tokens, d_model]`` by ``token_ids [tokens]`` int64; see the class docstring."""
        if token_ids is None or token_ids.shape != x.shape[:-1]:
            got = None if token_ids is None else tuple(token_ids.shape)
            raise ValueError(
                f"the hash router picks experts from token ids and needs token_ids of shape {tuple(x.shape[:-1])}, got "
                f"{got}; call the model with input_ids (not embeddings), so the moe can pass them on"
            )
        indices = self.table[token_ids.long()]
        if self.proj is None:
            logits = x.new_zeros(*x.shape[:-1], self.n_experts, dtype=torch.float32)
            weights = torch.ones(indices.shape, dtype=torch.float32, device=x.device)
        else:
            bias = self.proj.bias.float() if self.proj.bias is not None else None
            logits = nn.functional.linear(x.float(), self.proj.weight.float(), bias)
            weights = score_fn(self.score, logits).gather(-1, indices)
        if self.renormalize:
            weights = normalise_weights(weights, self.renormalize_p)
        if self.routed_scaling_factor != 1.0:
            weights = weights * self.routed_scaling_factor
        ones = torch.ones_like(indices) if token_mask is None else token_mask.long()[..., None].expand(indices.shape)
        self.expert_load.scatter_add_(0, indices.reshape(-1), ones.reshape(-1))
        return weights.to(x.dtype), indices, logits


def _make(cfg: HashRouterConfig, ctx: BuildContext) -> HashRouter:
    n, k = _router_sizes(ctx)
    return HashRouter(
        ctx.dim or ctx.d_model,
        n,
        k,
        ctx.vocab_size,
        cfg.renormalize,
        gate=cfg.gate,
        score=cfg.score,
        bias=cfg.bias,
        renormalize_p=cfg.renormalize_p,
        routed_scaling_factor=cfg.routed_scaling_factor,
        hash_seed=cfg.hash_seed,
    )


def _count(cfg: HashRouterConfig, ctx: BuildContext) -> int:
    """The gate: ``n_experts · d_model`` (+ ``n_experts`` with a bias); 0 without a gate (the table is a buffer)."""
    n, _ = _router_sizes(ctx)
    return (n * (ctx.dim or ctx.d_model) + (n if cfg.bias else 0)) if cfg.gate else 0


def _flops(cfg: HashRouterConfig, ctx: BuildContext, work: Workload) -> dict[str, int]:
    """The gate's logits, ``2 · d_model · n_experts`` per token; none without a gate (a table lookup)."""
    n, _ = _router_sizes(ctx)
    return {"proj": 2 * work.tokens * (ctx.dim or ctx.d_model) * n} if cfg.gate else {}


_MATH = r"""For a token $x$ with id $t$, a fixed table $H$: vocab $\to$ $k$ distinct experts (a random hash drawn once
from hash_seed, Roller et al. 2021; or a checkpoint's), and with gate a learned $W_r$: $d_{model} \to N$:

$$\mathcal{T} = H[t], \qquad g_e = \rho \cdot \begin{cases} s_e / \lVert s_{\mathcal{T}} \rVert_p & \text{renormalize}
\\ s_e & \text{otherwise} \end{cases}, \qquad s = \mathrm{SCORE}(W_r\, x) \ \text{(gate)},\ s_e = 1 \ \text{(no gate)}$$

The choice of experts has no parameters and no gradient; $\rho$ = routed_scaling_factor, $p$ = renormalize_p."""


def register_hash_router(register, capabilities: dict) -> None:
    """Register the ``hash`` router through ``register`` (called by :func:`modkit_plugins.routers.register_routers`)."""
    register(
        Component(
            kind="router",
            type="hash",
            config=HashRouterConfig,
            factory=_make,
            math=_MATH,
            description="Hash router: a fixed table of the token id picks the top_k experts (no learned selection); "
            "weights from a learned gate's scores (DeepSeek-V4's hash layers) or 1 each (Roller et al.'s Hash "
            "Layers). Needs the token ids, which the moe passes on from the model's input_ids. Same outputs as topk.",
            reference="Roller et al. 2021, Hash Layers For Large Sparse Models, arXiv:2106.04426; DeepSeek-AI 2026, "
            "DeepSeek-V4 (transformers DeepseekV4HashRouter)",
            capabilities=capabilities,
            param_count=_count,
            flops=_flops,
            example={"type": "hash", "renormalize": True},
        )
    )

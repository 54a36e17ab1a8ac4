"""The auxiliary losses of the ``moe`` FFN (:mod:`modkit_plugins.moe`): Switch load balancing, ST-MoE z-loss, and
their global form under expert parallelism (every data-parallel rank's tokens, one process's value).

References: Fedus et al. 2021, Switch Transformers (arXiv:2101.03961); Zoph et al. 2022, ST-MoE (arXiv:2202.08906);
DeepSeek-AI 2024, DeepSeek-V3 (arXiv:2412.19437, eqs. 17-20); Megatron-Core's global-batch load balancing
(``moe_router_load_balancing_type`` "global_aux_loss").
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor


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
    probs: Tensor, indices: Tensor, n_experts: int, token_mask: Optional[Tensor] = None, *, per_sequence: bool = False
) -> Tensor:
    """Switch Transformer load-balancing loss (Fedus et al. 2021, arXiv:2101.03961, eq. 4) for top-k routing.

    ``n_experts * sum_e f_e * P_e`` where ``f_e`` is the fraction of routing assignments (``tokens * top_k`` of
    them) sent to expert ``e`` and ``P_e`` the mean router probability of ``e``. Only ``P`` carries gradient.
    Uniform routing gives 1; the minimum over probabilities for a fixed assignment is reached when both are uniform.

    With leading dimensions (``probs [batch, seq, n_experts]``) the loss is computed per group of tokens (per
    sequence) and averaged over the groups that hold a real token: DeepSeek-V3's sequence-wise balance loss
    (arXiv:2412.19437, eqs. 17-20: its ``f_i = N / (K T) * count_i`` is ``n_experts`` times the fraction here).

    Args:
        probs: ``[..., tokens, n_experts]`` router probabilities (summing to 1 over experts), before top-k.
        indices: ``[..., tokens, top_k]`` int64 chosen experts.
        n_experts: number of experts.
        token_mask: optional ``[..., tokens]`` bool, True for tokens that count (padding excluded).
        per_sequence: return the loss of each group ``[...]`` instead of their mean (expert parallelism averages
            them over every rank's sequences).

    Returns:
        Scalar float32 (``[...]`` with ``per_sequence``).
    """
    probs = probs.float()
    top_k = indices.shape[-1]
    experts = torch.arange(n_experts, device=indices.device)
    chosen = (indices[..., None] == experts).to(probs.dtype).sum(-2)  # [..., tokens, n_experts]: 0/1 per expert
    m = probs.new_ones(probs.shape[:-1]) if token_mask is None else token_mask.to(probs.dtype)
    n_tok = m.sum(-1)
    denom = n_tok.clamp(min=1.0)
    f = (chosen * m[..., None]).sum(-2) / (denom * top_k)[..., None]
    p = (probs * m[..., None]).sum(-2) / denom[..., None]
    per_group = n_experts * (f * p).sum(-1)
    if per_group.dim() == 0 or per_sequence:
        return per_group
    real = (n_tok > 0).to(per_group.dtype)
    return (per_group * real).sum() / real.sum().clamp(min=1.0)


def global_aux_loss(moe, logits: Tensor, indices: Tensor, mask: Optional[Tensor], batch: int) -> Tensor:
    """This rank's share of the aux losses of the ``moe`` module ``moe`` over the tokens of every rank of
    ``moe.token_group`` (the data-parallel ranks under expert parallelism).

    The statistics without gradient (each expert's assignments, the numbers of real tokens and of sequences holding
    one) are summed over the group in one all-reduce; the terms with gradient (the probabilities, ``logsumexp^2``)
    stay local and are divided by the global counts, times the group size ``W``. The mean of the ranks' values,
    which data-parallel gradient averaging takes, is then the loss of one process on all the tokens: batch scope
    ``N sum_e f_e P_e`` with global ``f`` and ``P`` (Megatron-Core's global-batch load balancing), sequence scope
    the mean over every real sequence, the z-loss the mean over every real token. Equal to
    ``moe._aux_loss`` on one process when ``W`` is 1.

    Args:
        moe: the mixture (``n_experts``, ``top_k``, the coefficients, ``aux_loss_scope``, ``token_group``).
        logits: ``[T, n_experts]`` router logits of this rank's ``T`` tokens.
        indices: ``[T, top_k]`` int64 chosen experts.
        mask: ``[T]`` bool (True: a real token) or ``None``.
        batch: this rank's number of sequences (``T / batch`` tokens each).

    Returns:
        Scalar float32.
    """
    import torch.distributed as dist

    n, k = getattr(moe, "n_choices", moe.n_experts), moe.top_k  # zero experts are choices too
    w = dist.get_world_size(moe.token_group)
    lg = logits.float()
    m = lg.new_ones(lg.shape[0]) if mask is None else mask.to(lg.dtype)
    chosen = (indices[..., None] == torch.arange(n, device=lg.device)).to(lg.dtype).sum(-2)  # [T, n]
    seq_real = (m.view(batch, -1).sum(-1) > 0).to(lg.dtype)
    stats = torch.cat([(chosen * m[:, None]).sum(0), m.sum()[None], seq_real.sum()[None]]).double().detach()
    dist.all_reduce(stats, group=moe.token_group)
    counts, tokens, seqs = stats[:n].float(), stats[n].float().clamp(min=1.0), stats[n + 1].float().clamp(min=1.0)
    aux = lg.new_zeros(())
    if moe.aux_loss_coef:
        probs = moe._balance_probs(lg)
        if moe.aux_loss_scope == "sequence":  # each sequence's own loss, summed here, averaged over all of them
            seq_mask = m.view(batch, -1).bool() if mask is not None else None
            per_seq = load_balancing_loss(
                probs.view(batch, -1, n), indices.view(batch, -1, k), n, seq_mask, per_sequence=True
            )
            balance = w * (per_seq * seq_real).sum() / seqs
        else:
            f = counts / (tokens * k)
            balance = n * (f * (w * (probs * m[:, None]).sum(0) / tokens)).sum()
        aux = aux + moe.aux_loss_coef * balance
    if moe.z_loss_coef:
        lse = torch.logsumexp(lg, dim=-1)
        aux = aux + moe.z_loss_coef * w * (lse * lse * m).sum() / tokens
    return aux

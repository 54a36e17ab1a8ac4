"""Multi-token prediction (MTP): extra heads that predict the tokens after the next one, trained beside it.

DeepSeek-V3 (arXiv:2412.19437, section 2.2) chains ``depth`` modules after the model. Module ``k`` (1-based) at
position ``i`` combines the previous depth's hidden state ``h[k-1, i]`` (depth 0: the last block's output, before
the final norm) with the embedding of token ``t[i + k]``::

    h'[k, i] = W_k · concat(norm_h(h[k-1, i]), norm_e(embed(t[i + k])))     # W_k: [d_model, 2 d_model]
    h[k, i]  = block_k(h'[k, 0 .. T-k-1])[i]                                # a causal block, like the model's
    logits[k, i] = head(norm_out(h[k, i]))                                  # predicts t[i + k + 1]

so depth ``k`` keeps ``T - k`` positions of a ``T``-token row, its sequence is causal like the model's, and the
token embedding and the output head are the model's own (shared, counted once). The training loss adds
``mtp_loss_weight / depth · Σ_k CE_k`` (:mod:`modkit.train.step`); generation never runs these modules (the
model's forward computes them only when asked, ``Model.forward(mtp=True)``), and their blocks keep no cache.

Names follow DeepSeek-V3's checkpoint (``enorm``, ``hnorm``, ``eh_proj``, the module's ``shared_head.norm`` is
``final_norm`` here); Megatron-Core's ``MultiTokenPredictionLayer`` is the same computation.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor, nn

from modkit.core.interfaces import AttentionInputs, add_aux


class MTPModule(nn.Module):
    """One depth of multi-token prediction: two norms, a ``[d_model, 2 d_model]`` projection without bias, one block
    and a final norm (the head is the model's).

    Args:
        block: a block built from the spec's components (``[batch, seq, d_model] -> ([batch, seq, d_model], aux)``).
        hnorm, enorm, final_norm: norms over ``d_model`` (the spec's block norm).
        d_model: the residual width.
    """

    def __init__(self, block: nn.Module, hnorm: nn.Module, enorm: nn.Module, final_norm: nn.Module, d_model: int):
        super().__init__()
        self.hnorm, self.enorm = hnorm, enorm
        self.eh_proj = nn.Linear(2 * d_model, d_model, bias=False)
        self.block = block
        self.final_norm = final_norm

    def param_roles(self) -> dict[str, str]:
        """The projection is a hidden matrix (its input width is ``2 d_model``); the norms and the block declare
        their own roles."""
        return {"eh_proj.weight": "hidden"}

    def forward(self, h: Tensor, embedded: Tensor, inputs: AttentionInputs) -> tuple[Tensor, Tensor, Optional[Tensor]]:
        """One depth on rows of ``T`` positions.

        Args:
            h: ``[batch, T, d_model]`` the previous depth's hidden states (positions ``0 .. T-1``).
            embedded: ``[batch, T, d_model]`` the embeddings of the tokens one further ahead.
            inputs: the block's inputs for ``T`` positions (causal mask, positions).

        Returns:
            ``(hidden [batch, T, d_model] before the final norm, normed [batch, T, d_model], aux_loss or None)``.
        """
        x = self.eh_proj(torch.cat([self.hnorm(h), self.enorm(embedded)], dim=-1))
        x, aux = self.block(x, inputs)
        return x, self.final_norm(x), aux


def mtp_hidden(model: nn.Module, hidden: Tensor, input_ids: Tensor, embed) -> tuple[list[Tensor], Optional[Tensor]]:
    """The normed hidden states of every MTP depth of ``model`` and the sum of their blocks' auxiliary losses.

    Args:
        model: a :class:`modkit.nn.model.Model` with ``mtp`` modules.
        hidden: ``[batch, T, d_model]`` the last block's output (before the final norm).
        input_ids: ``[batch, T]`` the row's tokens.
        embed: ``(input_ids, positions) -> [batch, T, d_model]``, the model's embedding (scale and position scheme
            included).

    Returns:
        ``([normed [batch, T - k, d_model] for k = 1 .. depth], aux)``; depth ``k``'s position ``i`` predicts token
            ``i + k + 1`` of the row.

    Raises:
        ValueError: a row of ``T <= depth`` tokens (depth ``T`` would keep no position).
    """
    depth = len(model.mtp)
    t = input_ids.shape[1]
    if t <= depth:
        raise ValueError(f"multi-token prediction of depth {depth} needs rows longer than {depth} tokens, got {t}")
    position = model.positions[model.layer_position[-1]]
    outs, aux = [], None
    for k, module in enumerate(model.mtp, start=1):
        # the row's ids were checked by the model's forward: a slice of them needs only its positions 0 .. t-k-1
        ids = input_ids[:, k:]
        positions = torch.arange(t - k, device=ids.device).expand(ids.shape[0], -1)
        inputs = AttentionInputs(positions=positions, token_ids=ids, scratch={}).for_layer(position, None)
        hidden, normed, layer_aux = module(hidden[:, : t - k], embed(ids, positions), inputs)
        outs.append(normed)
        aux = add_aux(aux, layer_aux)
    return outs, aux

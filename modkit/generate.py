"""Sampling and autoregressive generation with the KV cache.

``generate`` prefills the prompt once, then decodes one token at a time against a *fresh* cache per call
(state never leaks between calls: litgpt #1596, torchtune #959). Sampling follows the usual order:
temperature, then top-k, then top-p (nucleus, Holtzman et al. 2019, arXiv:1904.09751); temperature 0 is
greedy (argmax).
"""

from __future__ import annotations

from typing import Iterator, Optional, Sequence, Union

import torch
from torch import Tensor

from .model import Model


def top_p_mask(probs: Tensor, top_p: float) -> Tensor:
    """Boolean mask ``[..., vocab]`` of the smallest set of tokens whose probability mass reaches ``top_p``.

    A token is kept when the mass of the strictly more probable tokens is below ``top_p``, so the most probable
    token is always kept (never empty) and ties at the boundary are resolved by sort order
    (llama.cpp #1953, transformers #18976). ``top_p >= 1`` keeps everything.
    """
    if top_p >= 1.0:
        return torch.ones_like(probs, dtype=torch.bool)
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    mass_before = sorted_probs.cumsum(-1) - sorted_probs
    keep_sorted = mass_before < top_p
    keep_sorted[..., 0] = True
    return torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)


def filter_logits(logits: Tensor, *, temperature: float = 1.0, top_k: Optional[int] = None, top_p: Optional[float] = None) -> Tensor:
    """Apply temperature, top-k and top-p to ``logits [..., vocab]``; removed tokens get ``-inf``.

    Raises:
        ValueError: temperature < 0, top_k < 1 or top_p outside (0, 1].
    """
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if top_k is not None and top_k < 1:
        raise ValueError(f"top_k must be >= 1, got {top_k}")
    if top_p is not None and not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    logits = logits.float()
    if temperature > 0:
        logits = logits / temperature
    if top_k is not None and top_k < logits.shape[-1]:
        kth = logits.topk(top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1:
        keep = top_p_mask(torch.softmax(logits, -1), top_p)
        logits = logits.masked_fill(~keep, float("-inf"))
    return logits


def sample(
    logits: Tensor,
    *,
    temperature: float = 1.0,
    top_k: Optional[int] = None,
    top_p: Optional[float] = None,
    generator: Optional[torch.Generator] = None,
) -> Tensor:
    """Draw one token per row of ``logits [batch, vocab]`` → ``[batch]`` int64. ``temperature == 0`` is argmax."""
    if temperature == 0:
        return logits.argmax(-1)
    probs = torch.softmax(filter_logits(logits, temperature=temperature, top_k=top_k, top_p=top_p), -1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


def _as_batch(input_ids: Union[Tensor, Sequence[int], Sequence[Sequence[int]]]) -> Tensor:
    ids = torch.as_tensor(input_ids, dtype=torch.long)
    if ids.dim() == 1:
        ids = ids[None]
    if ids.dim() != 2 or ids.shape[1] == 0:
        raise ValueError(f"input_ids must be a non-empty [batch, seq] sequence, got shape {tuple(ids.shape)}")
    return ids


@torch.no_grad()
def stream_generate(
    model: Model,
    input_ids: Union[Tensor, Sequence[int], Sequence[Sequence[int]]],
    *,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: Optional[int] = None,
    top_p: Optional[float] = None,
    seed: Optional[int] = None,
    eos_token_id: Optional[Union[int, Sequence[int]]] = None,
    attention_mask: Optional[Tensor] = None,
) -> Iterator[Tensor]:
    """Yield the next token ``[batch]`` at each step (finished rows repeat their EOS token).

    Args:
        input_ids: prompt ``[batch, seq]`` (or one sequence); left-pad ragged batches and pass ``attention_mask``.
        max_new_tokens: number of steps. temperature/top_k/top_p: see :func:`sample`.
        seed: seeds a private generator, so seeded runs are reproducible.
        eos_token_id: stop a row once it emits one of these; iteration ends when every row has.
        attention_mask: ``[batch, seq]``, 1 for real tokens.
    """
    ids = _as_batch(input_ids).to(model.embed.weight.device)
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    gen = torch.Generator(device=ids.device)
    gen.manual_seed(seed if seed is not None else torch.seed())
    eos = torch.tensor([] if eos_token_id is None else ([eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id)), device=ids.device)
    mask = attention_mask.to(ids.device).long() if attention_mask is not None else torch.ones_like(ids)
    cache = model.new_cache()
    logits = model(ids, attention_mask=mask, cache=cache).logits[:, -1]
    done = torch.zeros(ids.shape[0], dtype=torch.bool, device=ids.device)
    for _ in range(max_new_tokens):
        token = sample(logits, temperature=temperature, top_k=top_k, top_p=top_p, generator=gen)
        if eos.numel():
            token = torch.where(done, eos[0].to(token.dtype), token)
            done = done | torch.isin(token, eos)
        yield token
        if eos.numel() and bool(done.all()):
            return
        mask = torch.cat([mask, mask.new_ones(mask.shape[0], 1)], 1)
        logits = model(token[:, None], attention_mask=mask, cache=cache).logits[:, -1]


def generate(model: Model, input_ids, *, max_new_tokens: int, **kwargs) -> Tensor:
    """Generate and return ``[batch, prompt_len + new]`` tokens (prompt included). Arguments as :func:`stream_generate`."""
    ids = _as_batch(input_ids)
    new = list(stream_generate(model, ids, max_new_tokens=max_new_tokens, **kwargs))
    if not new:
        return ids
    return torch.cat([ids.to(new[0].device), torch.stack(new, 1)], 1)

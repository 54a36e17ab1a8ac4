"""Helpers for comparing one modkit sublayer or block with the transformers module it reimplements.

The modkit side runs through :meth:`modkit.Model.forward` (a full forward, or a prefill then chunks and single tokens
through the KV cache, with left padding as generation feeds it); forward hooks record what each layer's module of
interest received and returned. The transformers module is then applied to the very inputs recorded, over the whole
sequence at once, so each layer is compared on its own: a cached decode must give, token by token, what the reference
computes over the full sequence.
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence

import torch
from torch import Tensor, nn

import modkit

#: the tolerance of every parity test (float32)
TOL = 1e-5
#: ``[start, end)`` chunks of a cached run over 12 tokens: a prefill, single tokens, a chunk of 4, single tokens
CHUNKS = ((0, 5), (5, 6), (6, 10), (10, 11), (11, 12))


def record(
    model: modkit.Model,
    module_of: Callable[[modkit.Model, int], nn.Module],
    ids: Tensor,
    mask: Optional[Tensor] = None,
    chunks: Optional[Sequence[tuple[int, int]]] = None,
) -> dict[int, tuple[Tensor, Tensor]]:
    """``{layer: (input [batch, seq, d_model], output [batch, seq, d_model])}`` of ``module_of(model, layer)``.

    Without ``chunks``: one forward of ``ids [batch, seq]`` (``mask`` 1 = real token, 0 = left padding). With
    ``chunks``: a fresh KV cache fed ``ids[:, a:e]`` for each ``(a, e)`` in order (the mask over every token so far),
    the recorded pieces concatenated along the sequence. A block's ``(x, aux)`` output is recorded as ``x``.
    """
    seen: dict[int, list[tuple[Tensor, Tensor]]] = {i: [] for i in range(len(model.layers))}
    hooks = []
    for i in range(len(model.layers)):

        def hook(mod, args, out, i=i):
            out = out[0] if isinstance(out, tuple) else out
            seen[i].append((args[0].detach(), out.detach()))

        hooks.append(module_of(model, i).register_forward_hook(hook))
    try:
        with torch.no_grad():
            if chunks is None:
                model(ids, attention_mask=mask)
            else:
                cache = model.new_cache(ids.shape[0], ids.shape[1])
                for a, e in chunks:
                    model(ids[:, a:e], attention_mask=None if mask is None else mask[:, :e], cache=cache)
    finally:
        for h in hooks:
            h.remove()
    return {i: (torch.cat([x for x, _ in parts], 1), torch.cat([o for _, o in parts], 1)) for i, parts in seen.items()}


def positions_of(mask: Tensor) -> Tensor:
    """``[batch, seq]`` positions counting real tokens only (what modkit and transformers' generate derive)."""
    return (mask.long().cumsum(-1) - 1).clamp(min=0)


def left_padded(batch: int, seq: int, pad: int, vocab: int, seed: int = 0) -> tuple[Tensor, Tensor]:
    """``(ids [batch, seq], mask [batch, seq])``: random ids, row 0 with ``pad`` left-padding tokens."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (batch, seq), generator=g)
    mask = torch.ones(batch, seq, dtype=torch.long)
    mask[0, :pad] = 0
    return ids, mask


def hf_mask(kind: str, config, x: Tensor, mask: Tensor):
    """transformers' 4-d mask of ``kind`` (``causal``, ``sliding``, ``chunked``) for ``x [batch, seq, d]`` and the
    2-d padding ``mask``, as its models build it (no cache)."""
    from transformers import masking_utils as mu

    make = {
        "causal": mu.create_causal_mask,
        "sliding": mu.create_sliding_window_causal_mask,
        "chunked": mu.create_chunked_causal_mask,
    }[kind]
    return make(config=config, inputs_embeds=x, attention_mask=mask, cache=None)


def assert_close(got: Tensor, ref: Tensor, mask: Tensor, what: str, tol: float = TOL) -> float:
    """Max |got - ref| over the real tokens (``mask`` 1); fails above ``tol``, naming ``what``. Returns it."""
    real = mask.bool()
    diff = (got[real] - ref[real]).abs().max().item()
    assert diff <= tol, f"{what}: max |Δ| = {diff:.3g} over the real tokens (tolerance {tol})"
    return diff


def set_seeded(params: Sequence[Tensor], seed: int, std: float) -> None:
    """Fill ``params`` in place with N(0, std²) from ``seed`` (larger than a real init, so the math is exercised)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in params:
            p.copy_(torch.randn(p.shape, generator=g) * std)

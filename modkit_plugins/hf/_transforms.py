"""The layout changes between a Hugging Face checkpoint's tensors and modkit's, one per weight-table row.

Transforms for the layouts transformers 5 saves:

* :data:`RENAME` (one tensor, the same layout) and :class:`Transpose` (``Conv1D``'s ``[in, out]``; expert stacks);
* :class:`Concat`: one fused tensor ↔ several modkit tensors side by side along a dimension (fused q/k/v,
  fused gate/up, MLA's ``kv_a_proj_with_mqa``), or ``interleaved`` (gpt-oss's ``gate_up_proj``: even columns gate,
  odd columns up);
* :class:`FusedQKV`: q/k/v fused per head or per KV group (Falcon, GPT-NeoX's ``query_key_value``);
  :class:`PerHead`: any parts fused head by head (MLA's ``kv_b_proj``: per head its key rows, then its value rows);
* :class:`StackExperts`: one ``nn.Linear`` per expert ↔ modkit's stacked ``[n_experts, in, out]`` experts;
* :class:`Chain`: transforms applied in turn (e.g. a stacked ``[n_experts, 2 * d_ff, d_model]`` ``gate_up_proj``:
  ``Chain(Transpose(), Concat(dim=-1))``).

Each transform's :meth:`Transform.to_ours` and :meth:`Transform.to_hf` are exact inverses (split, concatenate,
transpose, permute), so that round trips are bitwise.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional, Union

import torch
from torch import Tensor


@dataclass(frozen=True)
class Ctx:
    """What a transform may look at: the model's spec and ``state_dict`` shapes, the checkpoint's config, the layer
    (``None`` outside the blocks) and the names the entry resolved to."""

    spec: Any
    shapes: Mapping[str, tuple]
    config: Mapping[str, Any]
    layer: Optional[int]
    ours: tuple[str, ...]
    hf: tuple[str, ...]

    def shape(self, k: int) -> tuple:
        """The shape of the ``k``-th modkit tensor."""
        return tuple(self.shapes[self.ours[k]])


class Transform:
    """Hugging Face tensors ↔ modkit tensors of one :class:`W` entry; the base class renames (identity).

    Subclasses override :meth:`to_ours` and :meth:`to_hf`, exact inverses of each other (split, concatenate,
    transpose, permute), and :meth:`describe` (a few words for the reference docs).
    """

    def to_ours(self, ts: list[Tensor], ctx: Ctx) -> list[Tensor]:
        """Checkpoint tensors (in the entry's ``hf`` order) → modkit tensors (in its ``ours`` order)."""
        return list(ts)

    def to_hf(self, ts: list[Tensor], ctx: Ctx, extras: Mapping[str, Tensor]) -> list[Tensor]:
        """Modkit tensors → checkpoint tensors; ``extras`` are the kept source tensors (``model.checkpoint_extras``)."""
        return list(ts)

    def describe(self) -> str:
        """What the transform does, for the reference docs."""
        return "renamed"


#: the identity transform: the same tensor under another name
RENAME = Transform()


def _dim(t: Tensor, dim: int) -> int:
    return dim if dim >= 0 else t.dim() + dim


@dataclass(frozen=True)
class Transpose(Transform):
    """The last two dimensions swapped: ``Conv1D`` weights ``[in, out]`` (GPT-2) vs ``nn.Linear``'s ``[out, in]``;
    stacked experts ``[n_experts, out, in]`` vs modkit's ``[n_experts, in, out]``. 1-D tensors pass unchanged."""

    def to_ours(self, ts, ctx):
        return [t.transpose(-2, -1) if t.dim() >= 2 else t for t in ts]

    def to_hf(self, ts, ctx, extras):
        return self.to_ours(ts, ctx)

    def describe(self) -> str:
        return "transposed"


@dataclass(frozen=True)
class Concat(Transform):
    """One fused checkpoint tensor ↔ the modkit tensors side by side along ``dim`` (their sizes along ``dim`` split
    it), e.g. Phi-3's ``qkv_proj`` (q, k, v rows) and ``gate_up_proj`` (gate, up rows).

    Attributes:
        dim: the dimension of the modkit tensors along which they are fused (``-1``: columns of ``[in, out]``).
        transpose: the fused tensor is stored transposed (GPT-2's ``c_attn``: ``[in, 3 * out]``).
        interleaved: the parts alternate along ``dim`` (part ``k`` at positions ``k, k + n, k + 2n, ...``; gpt-oss's
            ``gate_up_proj``: gate at even, up at odd columns) instead of following each other.
    """

    dim: int = 0
    transpose: bool = False
    interleaved: bool = False

    def to_ours(self, ts, ctx):
        t = ts[0].transpose(-2, -1) if self.transpose and ts[0].dim() >= 2 else ts[0]
        dim = _dim(t, self.dim)
        n = len(ctx.ours)
        if self.interleaved:
            return [t.unflatten(dim, (-1, n)).select(dim + 1, k) for k in range(n)]
        return list(torch.split(t, [ctx.shape(k)[dim] for k in range(n)], dim=dim))

    def to_hf(self, ts, ctx, extras):
        dim = _dim(ts[0], self.dim)
        if self.interleaved:
            t = torch.stack(list(ts), dim=dim + 1).flatten(dim, dim + 1)
        else:
            t = torch.cat(list(ts), dim=dim)
        return [t.transpose(-2, -1) if self.transpose and t.dim() >= 2 else t]

    def describe(self) -> str:
        how = "interleaved" if self.interleaved else "concatenated"
        return f"fused: the parts {how} along dim {self.dim}" + (", stored transposed" if self.transpose else "")


@dataclass(frozen=True)
class PerHead(Transform):
    """Several projections fused head by head: the checkpoint's rows are ``[n_heads, s_1 + s_2 + ..., ...]``, the
    modkit tensors ``[n_heads * s_k, ...]`` each (their sizes give the ``s_k``). MLA's ``kv_b_proj`` (per head its
    ``qk_nope_head_dim`` key rows, then its ``v_head_dim`` value rows, ``DeepseekV3Attention``); GPT-NeoX's
    ``query_key_value`` is the case of three equal parts (:class:`FusedQKV` ``"per_head"``).

    Attributes:
        heads: the head count, a function of the :class:`Ctx` (default: the layer's attention ``n_heads``).
    """

    heads: Optional[Callable[[Ctx], int]] = None

    def _sizes(self, ctx: Ctx) -> tuple[int, list[int]]:
        n = self.heads(ctx) if self.heads is not None else ctx.spec.layer(ctx.layer).attention.n_heads
        return n, [ctx.shape(k)[0] // n for k in range(len(ctx.ours))]

    def to_ours(self, ts, ctx):
        n, sizes = self._sizes(ctx)
        rest = tuple(ts[0].shape[1:])
        parts = torch.split(ts[0].reshape(n, sum(sizes), *rest), sizes, dim=1)
        return [p.reshape(n * s, *rest) for p, s in zip(parts, sizes)]

    def to_hf(self, ts, ctx, extras):
        n, sizes = self._sizes(ctx)
        rest = tuple(ts[0].shape[1:])
        return [torch.cat([t.reshape(n, s, *rest) for t, s in zip(ts, sizes)], dim=1).reshape(-1, *rest)]

    def describe(self) -> str:
        return "fused head by head: per head the rows of each part in turn"


@dataclass(frozen=True)
class FusedQKV(Transform):
    """q, k and v fused in one tensor (weight ``[rows, d_model]`` or bias ``[rows]``) head by head.

    Layouts (``layout``, or a function of the checkpoint's config returning one):

    * ``"per_head"``: per head its query, key and value rows, ``[n_heads, 3, head_dim]`` (GPT-NeoX, Falcon-RW);
    * ``"grouped"``: per KV group its ``n_heads / n_kv_heads`` query heads, then its key, then its value head,
      ``[n_kv_heads, n_heads / n_kv_heads + 2, head_dim]`` (Falcon-40B/180B, ``FalconAttention._split_heads``);
    * ``"blocks"``: all query heads, then all key heads, then all value heads (Falcon-7B's multi-query).
    """

    layout: Union[str, Callable[[Mapping[str, Any]], str]] = "per_head"

    def _geometry(self, ctx: Ctx) -> tuple[str, int, int, int]:
        att = ctx.spec.layer(ctx.layer).attention
        layout = self.layout(ctx.config) if callable(self.layout) else self.layout
        return layout, att.n_heads, att.kv_heads, att.resolved_head_dim(ctx.spec.d_model)

    def to_ours(self, ts, ctx):
        layout, n_heads, n_kv, hd = self._geometry(ctx)
        if layout == "per_head":
            return PerHead().to_ours(ts, ctx)
        f = ts[0]
        rest = tuple(f.shape[1:])
        if layout == "grouped":
            r = n_heads // n_kv
            g = f.reshape(n_kv, r + 2, hd, *rest)
            q, k, v = g[:, :r], g[:, r], g[:, r + 1]
        else:
            q, k, v = torch.split(f, [n_heads * hd, n_kv * hd, n_kv * hd], dim=0)
        return [q.reshape(-1, *rest), k.reshape(-1, *rest), v.reshape(-1, *rest)]

    def to_hf(self, ts, ctx, extras):
        layout, n_heads, n_kv, hd = self._geometry(ctx)
        if layout == "per_head":
            return PerHead().to_hf(ts, ctx, extras)
        q, k, v = ts
        rest = tuple(q.shape[1:])
        if layout == "grouped":
            r = n_heads // n_kv
            g = torch.cat(
                [q.reshape(n_kv, r, hd, *rest), k.reshape(n_kv, 1, hd, *rest), v.reshape(n_kv, 1, hd, *rest)], dim=1
            )
        else:
            g = torch.cat([q, k, v], dim=0)
        return [g.reshape(-1, *rest)]

    def describe(self) -> str:
        if callable(self.layout):
            layout = "per head or per KV group, as the config says"
        else:
            layout = self.layout.replace("_", " ")
        return f"q, k, v fused ({layout})"


@dataclass(frozen=True)
class StackExperts(Transform):
    """One ``nn.Linear`` weight ``[out, in]`` per expert (the checkpoint's ``{e}`` names, in expert order) ↔ one
    modkit tensor of stacked experts ``[n_experts, in, out]`` (the grouped-GEMM layout of ``moe``'s experts)."""

    def to_ours(self, ts, ctx):
        return [torch.stack([t.t() for t in ts])]

    def to_hf(self, ts, ctx, extras):
        return [w.t().contiguous() for w in ts[0].unbind(0)]

    def describe(self) -> str:
        return "one tensor per expert, stacked (transposed) into [n_experts, in, out]"


@dataclass(frozen=True)
class Chain(Transform):
    """``steps`` applied in turn when loading (the last one produces modkit's tensors), in reverse when exporting."""

    steps: tuple[Transform, ...] = ()

    def to_ours(self, ts, ctx):
        for step in self.steps:
            ts = step.to_ours(ts, ctx)
        return ts

    def to_hf(self, ts, ctx, extras):
        for step in reversed(self.steps):
            ts = step.to_hf(ts, ctx, extras)
        return ts

    def describe(self) -> str:
        return ", then ".join(step.describe() for step in self.steps)

"""Context parallelism: every row's sequence cut into ``cp`` contiguous slices, one per rank of a ``cp`` group.

Each rank embeds, projects and runs the token-wise parts (norms, feed-forwards, the head, its share of the loss) on
its slice ``[batch, seq / cp]`` only. Attention is the one place a token meets the others: a mixer that declares
``context_parallel: "allgather_kv"`` takes its keys through :func:`modkit.nn.attention.update_cache` /
:func:`~modkit.nn.attention.update_cache_entries`, which under context parallelism all-gather the keys and values
(or a latent attention's latent and rotated key) of every rank along the sequence with an autograd-aware functional
collective (``all_gather_single_autograd``: the backward sums each rank's key gradients back to the rank that
computed them). The local queries then attend to the whole row with the mask built from absolute positions
(:func:`~modkit.nn.attention.attention_mask`: ``q_pos >= k_pos``, so the causal offset of the slice is right by
construction), including sliding windows, chunked attention and document masks (the whole row's document ids on the
key side). This is the all-gather form Llama 3 trained its long context with (Dubey et al. 2024,
arXiv:2407.21783, §3.3.2: "we all-gather the key and value tensors, then compute attention output for the local
query tensor chunk") and torchtitan's ``context_parallel`` offers beside ring attention; the ring form of
``torch.distributed.tensor.experimental.context_parallel`` patches SDPA's fused kernels (flash / efficient / cuDNN),
which the CPU and the masked (``attn_mask``) path modkit's attention takes under a shard do not use, hence this form.

The slices are contiguous (rank ``r`` holds positions ``[r · s, (r + 1) · s)`` with ``s = seq / cp``): under a
causal mask the later ranks score more pairs (the load-balanced zig-zag order of torchtitan is not done here).

**Who may be sequence-sharded** is declared, like the tensor-parallel plans: a recurrent mixer (Mamba, Mamba-2,
Gated DeltaNet, a hybrid holding one) declares ``context_parallel: false`` (its state runs through the sequence in
order, and no scan across ranks is implemented), and :func:`apply_context_parallel` refuses a model holding one,
naming every such layer, its type and the reason, before any collective.

Gradients: every parameter is replicated over the ``cp`` ranks and each computes the gradient of its own slice's
mean loss; the mean over the ranks (FSDP2 over the flattened ``dp x cp`` ranks, as torchtitan does, or an
all-reduce) is the gradient of the whole sequence's mean loss, because every slice holds the same number of tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch
from torch import Tensor, nn

from modkit.core.config import is_mixer

from .errors import ParallelError

#: the value of the ``context_parallel`` capability of a mixer that can be sequence-sharded
ALLGATHER_KV = "allgather_kv"


@dataclass(frozen=True)
class SequenceShard:
    """This rank's view of one context-parallel forward (what :attr:`AttentionInputs.sequence` holds).

    Attributes:
        group: the ``cp`` process group.
        key_positions: ``[batch, seq]`` int64 positions of the whole rows (every rank's slice, in rank order).
        key_mask: ``[batch, seq]`` bool validity of the whole rows, or ``None`` (all real).
        key_documents: ``[batch, seq]`` int64 document ids of the whole rows, or ``None``.
    """

    group: Any
    key_positions: Tensor
    key_mask: Optional[Tensor] = None
    key_documents: Optional[Tensor] = None

    def gather(self, t: Tensor, dim: int) -> Tensor:
        """The whole sequence of ``t`` (this rank's slice along ``dim``), concatenated in rank order along ``dim``.

        Autograd-aware (``torch.distributed._functional_collectives.all_gather_single_autograd``): the gradient of
        the result is summed over the ranks and each rank keeps its slice's part.
        """
        return _all_gather(t, dim, self.group, autograd=True)


def _all_gather(t: Tensor, dim: int, group, *, autograd: bool) -> Tensor:
    """``t`` from every rank of ``group`` concatenated along ``dim`` (a functional collective, waited on)."""
    import torch.distributed._functional_collectives as fc

    dim = dim % t.dim()
    if autograd:
        gather = getattr(fc, "all_gather_single_autograd", None) or fc.all_gather_tensor_autograd
        out = gather(t.contiguous(), gather_dim=dim, group=group)
    else:
        out = fc.all_gather_tensor(t.contiguous(), gather_dim=dim, group=group)
    return fc.wait_tensor(out) if isinstance(out, fc.AsyncCollectiveTensor) else out


class ContextParallel:
    """The ``cp`` group of a context-parallel model (``model.context_parallel``, set by :func:`apply_context_parallel`).

    Args:
        group: the process group of the ranks that share one sequence (a ``DeviceMesh``'s ``"cp"`` dim group).
    """

    def __init__(self, group):
        import torch.distributed as dist

        self.group = group
        self.size = dist.get_world_size(group)
        self.rank = dist.get_rank(group)

    def local_positions(self, batch: int, seq: int, device) -> Tensor:
        """``[batch, seq]`` int64 positions of this rank's slice of rows without padding or documents:
        ``rank · seq ... (rank + 1) · seq - 1``."""
        start = self.rank * seq
        return torch.arange(start, start + seq, device=device).expand(batch, seq)

    def split(self, t: Optional[Tensor], dim: int = 1) -> Optional[Tensor]:
        """This rank's contiguous slice of ``t`` along ``dim`` (``None`` stays ``None``).

        Raises:
            ParallelError: ``cp`` does not divide the length of ``dim``.
        """
        if t is None:
            return None
        n = t.shape[dim]
        if n % self.size:
            raise ParallelError(
                f"context parallelism over cp = {self.size} ranks needs a sequence length divisible by {self.size}, "
                f"got {n}; choose seq_len as a multiple of cp"
            )
        return t.narrow(dim, self.rank * (n // self.size), n // self.size)

    def split_batch(self, input_ids: Tensor, documents: Optional[Tensor] = None) -> dict[str, Optional[Tensor]]:
        """The keyword arguments of ``model(**out)`` for this rank from whole rows ``input_ids [batch, seq]``:
        ``input_ids``, ``positions`` (of the slice, counted over the row: from each document's start with
        ``documents``) and ``documents``, each ``[batch, seq / cp]``."""
        from modkit.nn.documents import document_positions

        b, s = input_ids.shape
        positions = (
            document_positions(documents)
            if documents is not None
            else torch.arange(s, device=input_ids.device).expand(b, s)
        )
        out = {"input_ids": self.split(input_ids), "positions": self.split(positions)}
        if documents is not None:
            out["documents"] = self.split(documents)
        return out

    def shard(self, positions: Tensor, token_mask: Optional[Tensor], documents: Optional[Tensor]) -> SequenceShard:
        """The :class:`SequenceShard` of one forward: the whole rows' positions, validity and documents gathered
        (without gradient) from this rank's ``[batch, seq / cp]`` slices."""
        gather = lambda t: None if t is None else _all_gather(t, 1, self.group, autograd=False)  # noqa: E731
        mask = None if token_mask is None else gather(token_mask.to(torch.uint8)).bool()
        return SequenceShard(self.group, gather(positions), mask, gather(documents))


def context_parallel_problems(model: nn.Module) -> list[tuple[str, str, str]]:
    """``[(layer path, kind/type, reason)]`` of every component in ``model`` that cannot be sequence-sharded: a token
    mixer whose entry does not declare ``context_parallel: "allgather_kv"`` (a recurrent mixer declares ``false``),
    and a component with an auxiliary loss (a mixture of experts: capability ``aux_loss``) that does not declare
    ``context_parallel: true`` (its balance loss and its routers' loads are statistics over whole sequences and the
    whole batch, which each ``cp`` rank would take over its slice only). Empty when the model may run under context
    parallelism."""
    out = []
    for path, module in model.named_modules():
        kind = getattr(module, "modkit_kind", None)
        caps = getattr(module, "modkit_capabilities", None) or {}
        declared = caps.get("context_parallel")
        typ = getattr(module, "modkit_type", type(module).__name__)
        if not is_mixer(kind):
            if caps.get("aux_loss") and declared is not True:
                reason = (
                    "its auxiliary losses and its routers' expert loads are statistics over whole sequences and the "
                    "whole batch, which each cp rank would take over its slice only (not reduced over cp)"
                )
                out.append((path, f"{kind}/{typ}", reason))
            continue
        if declared == ALLGATHER_KV:
            continue
        if declared is False:
            reason = (
                "it declares context_parallel: false: its state runs through the sequence in order and a slice "
                "would start from a zero state (no scan across ranks)"
            )
        else:
            reason = f"it does not declare context_parallel: '{ALLGATHER_KV}' (it may not take its keys through update_cache)"
        out.append((path, f"{kind}/{typ}", reason))
    return out


def apply_context_parallel(model: nn.Module, cp_mesh) -> nn.Module:
    """Make ``model`` context-parallel over the 1-D ``cp_mesh`` (a ``DeviceMesh``, or a process group), in place.

    Sets ``model.context_parallel`` (a :class:`ContextParallel`): its ``forward`` then takes this rank's slice of
    every row (:meth:`ContextParallel.split_batch`) and its mixers attend over the whole rows' keys.

    Raises:
        ParallelError: a component that cannot be sequence-sharded (every one named with its layer path, type and
            reason; the fix: drop cp, or use components that declare ``context_parallel``).
    """
    problems = context_parallel_problems(model)
    if problems:
        listed = "; ".join(f"{path} ({typ}): {why}" for path, typ, why in problems)
        raise ParallelError(
            f"context parallelism (cp = {cp_mesh.size()}) cannot shard the sequence of {len(problems)} "
            f"component(s): {listed}. Train this model without --cp, or use components that declare context_parallel"
        )
    group = cp_mesh.get_group() if hasattr(cp_mesh, "get_group") else cp_mesh
    model.context_parallel = ContextParallel(group)
    return model


def mixer_layouts(registry=None) -> list[dict[str, Any]]:
    """``[{"kind", "type", "fsdp", "tp", "pp", "cp", "ep"}]`` for every registered token mixer and feed-forward,
    from their declarations: ``tp`` whether it declares a ``tp_plan``; ``cp`` for a mixer its ``context_parallel``
    capability (``"allgather_kv"`` or ``"no"``), for a feed-forward ``"yes"`` (it acts per token) unless it has an
    auxiliary loss without declaring ``context_parallel: true`` (``"no"``: :func:`context_parallel_problems`);
    ``ep`` ``"yes"`` for a component declaring an ``ep_plan`` (its experts split over the ``ep`` ranks), ``"no"``
    for one with an auxiliary loss and no ``ep_plan`` (refused), ``"dense"`` otherwise (FSDP2 over the
    data-parallel ranks, ``ep`` included). FSDP2 and pipeline parallelism cut between parameters and between
    layers, so every component takes them."""
    from modkit.core.registry import get_registry

    registry = registry or get_registry()
    rows = []
    for entry in registry.components():
        if not (is_mixer(entry.kind) or entry.kind == "ffn"):
            continue
        caps = entry.capabilities
        cp = caps.get("context_parallel")
        if entry.kind == "ffn":
            cp = "no" if caps.get("aux_loss") and cp is not True else "yes"
        ep = "yes" if caps.get("ep_plan") else ("no" if caps.get("aux_loss") else "dense")
        rows.append(
            {
                "kind": entry.kind,
                "type": entry.type,
                "fsdp": "yes",
                "tp": "yes" if caps.get("tp_plan") else "replicated",
                "pp": "yes",
                "cp": cp if cp in (ALLGATHER_KV, "yes") else "no",
                "ep": ep,
            }
        )
    return rows


#: markers around the generated table in ``docs/guides/scaling-out.md`` (:func:`mixer_layout_table`)
TABLE_BEGIN = "<!-- modkit:mixer-layouts (generated by modkit.parallel.context.mixer_layout_table; do not edit) -->"
TABLE_END = "<!-- /modkit:mixer-layouts -->"

_CP_CELLS = {
    ALLGATHER_KV: "`allgather_kv`",
    "yes": "yes (per token)",
    "no": "refused (declares it cannot be sequence-sharded)",
}
_EP_CELLS = {
    "yes": "`ep_plan`: experts split over ep",
    "no": "refused (no `ep_plan`)",
    "dense": "dense (FSDP2)",
}


def mixer_layout_table(registry=None) -> str:
    """The Markdown table of :func:`mixer_layouts` (one row per registered token mixer and feed-forward), between
    the markers the scaling-out guide holds it in."""
    lines = [
        TABLE_BEGIN,
        "| kind | type | FSDP2 | tensor parallel | pipeline | context parallel | expert parallel |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in mixer_layouts(registry):
        cp = _CP_CELLS[r["cp"]]
        if r["kind"] == "ffn" and r["cp"] == "no":
            cp = "refused (aux loss and router loads over whole sequences)"
        tp = "`tp_plan`" if r["tp"] == "yes" else "replicated (no `tp_plan`)"
        lines.append(f"| {r['kind']} | `{r['type']}` | yes | {tp} | yes | {cp} | {_EP_CELLS[r['ep']]} |")
    return "\n".join([*lines, TABLE_END])

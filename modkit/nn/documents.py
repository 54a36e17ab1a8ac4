"""Document-masked packing: which document each token of a packed row belongs to, and where it sits in it.

Pretraining data is many documents run together, each followed by an end-of-text token (``modkit data prepare``
appends one; nanoGPT's OpenWebText preparation appends GPT-2's ``<|endoftext|>``). A training window then holds the
tail of one document, some whole ones and the head of another. With document masking a token attends only to
earlier tokens of its own document and its position counts from the start of that document, so every document in
the row is computed exactly as if it ran alone (Llama 3, Dubey et al. 2024, arXiv:2407.21783, §3.2: "we use an
attention mask that prevents self-attention between different documents within the same sequence"; torchtitan's
document mask builds the same from the end-of-text positions).

The rule, from token ids alone (built once per batch): a token belongs to the document that the end-of-text tokens
*before* it delimit, so the end-of-text token is the last token of its document; with a begin-of-text token, that
token is the first of a new document. ``[a, b, EOT, c, EOT, EOT, d]`` gives documents ``[0, 0, 0, 1, 1, 2, 3]``
(an empty record is a document of its end-of-text token alone) and positions ``[0, 1, 2, 0, 1, 0, 0]``.

:func:`document_ids` and :func:`document_positions` compute both; ``Model.forward(input_ids, documents=...)``
takes the ids, restarts the positions and hands the ids to every token mixer through
:class:`~modkit.core.interfaces.AttentionInputs` (``documents``). A mixer honours them when its registry entry
declares the ``document_mask`` capability, whatever its kind: an attention masks the keys of other documents, a
recurrent mixer (Mamba-2, Gated DeltaNet, Mamba) restarts its state and its short convolution at every document
start (:mod:`modkit.nn.recurrent`, as mamba_ssm's ``seq_idx`` and flash-linear-attention's ``cu_seqlens`` do), a
mixer holding others (a parallel hybrid) passes them on. :func:`document_mask_problems` names every mixer of a spec
that does not declare it (the mixers inside a hybrid too), so a run is refused at configuration time, with the same
message in ``forward``, ``modkit train`` and ``modkit eval``, rather than trained with information leaking across
documents.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterator, Optional

import torch
from torch import Tensor

from modkit.core.config import MIXER_KINDS, ComponentConfig, is_mixer, slot_kind, slot_kinds
from modkit.core.errors import RegistryError

if TYPE_CHECKING:
    from torch import nn

    from modkit.core.registry import Registry
    from modkit.spec import ModelSpec

__all__ = [
    "document_ids",
    "document_mask_problems",
    "document_mask_refusal",
    "document_mask_types",
    "document_positions",
    "mixer_configs",
    "undeclared_mixers",
]


def document_ids(input_ids: Tensor, *, eot_id: Optional[int] = None, bos_id: Optional[int] = None) -> Tensor:
    """Document index ``[batch, seq]`` int64 of every token of packed rows, counted from 0 in each row.

    Args:
        input_ids: ``[batch, seq]`` token ids.
        eot_id: the end-of-text id: the token after one starts a new document (the end-of-text token itself is the
            last token of the document it ends).
        bos_id: the begin-of-text id: a new document starts at it (besides after each end-of-text token).

    Returns:
        ``[batch, seq]`` int64, non-decreasing along each row, 0 at the first token.

    Raises:
        ValueError: ``input_ids`` is not 2-D, or neither ``eot_id`` nor ``bos_id`` is given.
    """
    if input_ids.dim() != 2:
        raise ValueError(f"input_ids must be [batch, seq], got shape {tuple(input_ids.shape)}")
    if eot_id is None and bos_id is None:
        raise ValueError(
            "document_ids needs the end-of-text id (eot_id) or the begin-of-text id (bos_id) that delimits documents"
        )
    starts = torch.zeros_like(input_ids, dtype=torch.bool)
    if eot_id is not None:
        starts[:, 1:] |= input_ids[:, :-1] == eot_id
    if bos_id is not None:
        starts[:, 1:] |= input_ids[:, 1:] == bos_id
    return starts.long().cumsum(-1)


def document_positions(documents: Tensor, token_mask: Optional[Tensor] = None) -> Tensor:
    """Position of every token within its document ``[batch, seq]`` int64: 0 at each document's first token.

    Args:
        documents: ``[batch, seq]`` from :func:`document_ids` (non-decreasing along each row).
        token_mask: ``[batch, seq]`` bool, False for padding, which does not advance the count (its position is
            that of the previous real token, or 0), as :meth:`modkit.nn.model.Model.forward` counts without documents.

    Returns:
        ``[batch, seq]`` int64.
    """
    real = torch.ones_like(documents) if token_mask is None else token_mask.long()
    counted = real.cumsum(-1)
    seq = documents.shape[-1]
    index = torch.arange(seq, device=documents.device).expand_as(documents)
    first = torch.ones_like(documents, dtype=torch.bool)
    first[:, 1:] = documents[:, 1:] != documents[:, :-1]
    start = torch.where(first, index, torch.zeros_like(index)).cummax(-1).values  # first token of each one's document
    before = (counted - real).gather(-1, start)  # real tokens of the row before the document starts
    return (counted - before - 1).clamp(min=0)


def mixer_configs(config: ComponentConfig, path: str) -> Iterator[tuple[str, ComponentConfig]]:
    """``(path, config)`` of a token mixer's config and of every token mixer nested in it (the mixers of a parallel
    hybrid: fields declared with ``Slot("mixer")`` or ``Slot("attention")``, alone or in lists), depth first, the
    outer one first. ``path`` names ``config``; a nested one is ``path.field`` or ``path.field.index``."""
    yield path, config
    for name, field in type(config).model_fields.items():
        kind = slot_kind(field)
        if kind is None or not any(is_mixer(k) for k in slot_kinds(kind)):
            continue
        value = getattr(config, name)
        if isinstance(value, (list, tuple)):
            for j, inner in enumerate(value):
                yield from mixer_configs(inner, f"{path}.{name}.{j}")
        elif isinstance(value, ComponentConfig):
            yield from mixer_configs(value, f"{path}.{name}")


def document_mask_types(registry: Optional["Registry"] = None) -> list[str]:
    """Sorted type names of the registered token mixers (every kind of :data:`~modkit.core.config.MIXER_KINDS`) that
    declare the ``document_mask`` capability: what an error suggests instead of one that does not."""
    from modkit.core.registry import get_registry

    reg = registry or get_registry()
    return sorted({e.type for k in MIXER_KINDS for e in reg.components(k) if e.capabilities.get("document_mask")})


def document_mask_problems(spec: "ModelSpec", registry: Optional["Registry"] = None) -> list[tuple[str, str]]:
    """``(path, message)`` for every token mixer of ``spec`` that does not declare the ``document_mask`` capability.

    Every layer's mixer is looked at, whatever its kind (an attention or a recurrent mixer), and every mixer nested
    in it (:func:`mixer_configs`): a parallel hybrid passes the documents to its mixers, and each must honour them.
    An empty list means document-masked packing is safe for this spec (every document of a packed row is computed
    as if alone). A mixer type is reported once, at the first path where it occurs (``layer 3.mixer``, or
    ``layer 0.mixer.mixers.1`` inside a hybrid); the message names its kind, type and provider, and the types
    that declare the capability (:func:`document_mask_types`).

    Raises:
        RegistryError: a mixer config whose type is not registered.
    """
    from modkit.core.registry import get_registry

    reg = registry or get_registry()
    problems: list[tuple[str, str]] = []
    seen: set[tuple[str, str]] = set()
    for i in range(spec.n_layers):
        for path, cfg in mixer_configs(spec.layer(i).attention, f"layer {i}.mixer"):
            entry = _mixer_entry(reg, cfg)
            if entry.capabilities.get("document_mask") or (entry.kind, entry.type) in seen:
                continue
            seen.add((entry.kind, entry.type))
            able = ", ".join(document_mask_types(reg)) or "none installed"
            problems.append(
                (
                    path,
                    f"{entry.kind} type {entry.type!r} ({entry.provider}) does not declare the document_mask "
                    "capability, so it would carry information across the documents of a packed row; train without "
                    f"document masking, or use a token mixer that supports it ({able})",
                )
            )
    return problems


def _mixer_entry(reg: "Registry", cfg: ComponentConfig):
    """The registry entry of a token mixer's config (kind ``attention`` or ``mixer``), else of any kind."""
    for kind in MIXER_KINDS:
        try:
            return reg.entry_for_config(cfg, kind)
        except RegistryError:
            continue
    return reg.entry_for_config(cfg)


def undeclared_mixers(model: "nn.Module") -> list[str]:
    """What a built model cannot honour, from the capabilities its modules were built with (no registry needed, so
    a model of a plugin's components is judged as built): ``layer i: <kind> type '<type>' does not declare the
    document_mask capability`` for every token mixer module (tagged ``modkit_kind`` attention or mixer,
    :func:`~modkit.core.config.is_mixer`) of ``model.layers`` without it. A mixer inside the layer's mixer (a hybrid's)
    is named with its path in the block, ``layer 0 (attention.mixers.1)``. Empty: every mixer honours documents."""
    problems = []
    for i, block in enumerate(model.layers):
        outer = None  # the path of the layer's own (outermost) mixer
        for name, module in block.named_modules():
            kind = getattr(module, "modkit_kind", None)
            if not is_mixer(kind):
                continue
            inner = outer is not None and name.startswith(outer + ".")
            outer = outer if inner else name
            if not getattr(module, "modkit_capabilities", {}).get("document_mask"):
                where = f"layer {i} ({name})" if inner else f"layer {i}"
                problems.append(
                    f"{where}: {kind} type {module.modkit_type!r} does not declare the document_mask capability"
                )
    return problems


def document_mask_refusal(problems: list[str]) -> str:
    """The one message that refuses documents for a model, from :func:`undeclared_mixers` (the first four, then a
    count), with the types that declare the capability (:func:`document_mask_types`) and the fix: what
    ``Model.forward(documents=...)`` raises and ``modkit eval --document-mask`` says."""
    more = f" (and {len(problems) - 4} more)" if len(problems) > 4 else ""
    able = ", ".join(document_mask_types()) or "none installed"
    return (
        "document-masked packing: "
        + "; ".join(problems[:4])
        + more
        + f"; such a mixer would carry information across the documents of a row: use one that supports it ({able}), "
        "or no documents"
    )

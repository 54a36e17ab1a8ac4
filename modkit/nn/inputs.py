"""The inputs of one :meth:`~modkit.nn.model.Model.forward`, checked and completed before the embedding.

:meth:`ForwardInputs.prepare` checks the shapes and the token ids, reduces an attention mask to the new tokens,
and gives every token its position: explicit ``positions``; else, with a cache, each row continuing its count of
real tokens (:meth:`modkit.nn.cache.KVCache.prepare`, which also starts the cache's write); else counted from
each document's start (:func:`modkit.nn.documents.document_positions`); else counted over the real tokens of the
row (0, 1, 2, ... without padding). :meth:`ForwardInputs.attention_inputs` then hands them to every layer as one
:class:`~modkit.core.interfaces.AttentionInputs`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional

import torch
from torch import Tensor

from modkit.core.interfaces import AttentionInputs
from modkit.nn.cache import KVCache
from modkit.nn.documents import document_mask_refusal, document_positions, undeclared_mixers

if TYPE_CHECKING:
    from modkit.nn.model import Model


@dataclass(frozen=True)
class ForwardInputs:
    """What every layer of one forward sees besides the hidden states: the tokens' positions and validity.

    Attributes:
        positions: ``[batch, seq]`` int64 absolute position of each new token.
        token_mask: ``[batch, seq]`` bool, True for a real token, False for padding; ``None``: all real.
        documents: ``[batch, seq]`` int64 document index of each token of a packed row; ``None``: one sequence.
        sequence: under context parallelism (a model :func:`modkit.parallel.apply_context_parallel` prepared), this
            rank's :class:`~modkit.parallel.SequenceShard`; ``None``: the whole sequence is here.
        token_ids: ``[batch, seq]`` int64, the forward's ``input_ids`` (handed to every layer, for routing by token
            id); ``None``: not given.
    """

    positions: Tensor
    token_mask: Optional[Tensor] = None
    documents: Optional[Tensor] = None
    sequence: Optional[Any] = None
    token_ids: Optional[Tensor] = None

    @classmethod
    def prepare(
        cls,
        model: "Model",
        input_ids: Tensor,
        *,
        attention_mask: Optional[Tensor] = None,
        positions: Optional[Tensor] = None,
        cache: Optional[KVCache] = None,
        documents: Optional[Tensor] = None,
        logits_to_keep: Optional[int] = None,
    ) -> "ForwardInputs":
        """Check the arguments of ``model.forward`` (see there for each) and complete the positions and the mask.

        With a ``cache`` this starts its write (:meth:`~modkit.nn.cache.KVCache.prepare`: the slots of the new
        tokens, allocated on first use). On a context-parallel model (``model.context_parallel``) ``input_ids`` is
        this rank's slice of each row and ``positions`` (and ``documents``) must be that slice's, counted over the
        whole row; the whole row's keys are gathered (:meth:`modkit.parallel.ContextParallel.shard`). Under ``torch.compile`` the checks that read values on the host (token
        range, mask length against the cache, documents' shape and capability) are skipped: eager calls make them.

        Raises:
            ValueError: ``input_ids`` not ``[batch, seq]`` or outside ``[0, vocab_size)`` (with the offending
                values); ``logits_to_keep < 1``; an ``attention_mask`` of another shape than ``[batch, seq]`` or
                ``[batch, past + seq]``; ``documents`` with a cache, of another shape, or with a token mixer (an
                attention or a recurrent mixer, or one inside a hybrid) that does not declare the ``document_mask``
                capability (named with its layer and type, and the types that declare it); a cache on a
                context-parallel model.
        """
        if input_ids.dim() != 2:
            raise ValueError(f"input_ids must be [batch, seq], got shape {tuple(input_ids.shape)}")
        if logits_to_keep is not None and logits_to_keep < 1:
            raise ValueError(f"logits_to_keep must be >= 1 or None, got {logits_to_keep}")
        bsz, seq = input_ids.shape
        eager = not torch.compiler.is_compiling()
        if eager:
            _check_token_range(input_ids, model.spec.vocab_size)
        context = getattr(model, "context_parallel", None)
        if context is not None and positions is None:  # this rank's slice of each row: positions count from its start
            if documents is not None or attention_mask is not None:
                raise ValueError(
                    "a context-parallel model given documents or an attention mask needs the slice's positions "
                    "counted over the whole row: split the batch with modkit.parallel.ContextParallel.split"
                )
            positions = context.local_positions(bsz, seq, input_ids.device)
        token_mask = None
        if attention_mask is not None:
            token_mask = _new_token_mask(attention_mask, bsz, seq, cache, eager)
        if documents is not None:
            _check_documents(model, documents, input_ids, cache, eager)
            if positions is None:
                positions = document_positions(documents, token_mask)
        if cache is not None:
            positions, token_mask = cache.prepare(bsz, seq, token_mask, positions)
        elif positions is None:
            if token_mask is None:
                positions = torch.arange(seq, device=input_ids.device).expand(bsz, seq)
            else:
                positions = (token_mask.long().cumsum(-1) - 1).clamp(min=0)
        if context is None:
            return cls(positions, token_mask, documents, token_ids=input_ids)
        if cache is not None:
            raise ValueError("a context-parallel model (sequence sharded over ranks) runs without a KV cache")
        return cls(positions, token_mask, documents, context.shard(positions, token_mask, documents), input_ids)

    def attention_inputs(self) -> AttentionInputs:
        """The :class:`~modkit.core.interfaces.AttentionInputs` every layer gets (bound to its position scheme and
        cache with ``for_layer``). It carries a ``scratch`` dict the layers share: with documents the document mask
        is built once, by the first layer, and reused (:func:`modkit.nn.attention.prepare_mask`); a sparse attention
        may hand its selection to later layers there (``dsa``'s ``index_source``)."""
        if self.sequence is not None:  # the mask of the local queries over the whole sequence, built once
            return AttentionInputs(
                positions=self.positions,
                token_mask=self.token_mask,
                documents=self.documents,
                scratch={},
                sequence=self.sequence,
                token_ids=self.token_ids,
            )
        if self.documents is None:  # a dict the layers of this forward share (a sparse attention's selection)
            return AttentionInputs(
                positions=self.positions, token_mask=self.token_mask, token_ids=self.token_ids, scratch={}
            )
        return AttentionInputs(
            positions=self.positions,
            token_mask=self.token_mask,
            documents=self.documents,
            scratch={},
            token_ids=self.token_ids,
        )


def _fake(t: Tensor) -> bool:
    """Whether ``t`` has no values to read: a fake tensor of shape analysis (its storage is on ``meta``); a tensor
    subclass without a storage of its own (a DTensor) is read as it always was."""
    try:
        return t.untyped_storage().device.type == "meta"
    except (RuntimeError, NotImplementedError, TypeError):
        return False


def _check_token_range(input_ids: Tensor, vocab_size: int) -> None:
    """Refuse token ids outside ``[0, vocab_size)`` with one host sync (min and max together), naming both. Ids
    without values (``meta``, or a fake tensor of shape analysis, whose storage is on ``meta``) pass."""
    if input_ids.is_meta or not input_ids.numel() or _fake(input_ids):
        return
    lo, hi = torch.stack(torch.aminmax(input_ids)).tolist()  # one host sync, not two
    if lo < 0 or hi >= vocab_size:
        raise ValueError(f"input_ids must lie in [0, {vocab_size}); got min {lo}, max {hi}")


def _new_token_mask(attention_mask: Tensor, bsz: int, seq: int, cache: Optional[KVCache], eager: bool) -> Tensor:
    """``[batch, seq]`` bool validity of the new tokens from a ``[batch, seq]`` or ``[batch, past + seq]`` mask (the
    cached tokens' validity was recorded when they were written)."""
    if eager:  # (under torch.compile the host-side token count is not read: no recompile per token)
        past = cache.seen_tokens if cache is not None else 0
        shape = tuple(attention_mask.shape)
        if len(shape) != 2 or shape[0] != bsz or shape[1] not in (seq, past + seq):
            raise ValueError(
                f"attention_mask must be [batch, seq] = {(bsz, seq)} or [batch, past + seq] = {(bsz, past + seq)}, "
                f"got {shape}"
            )
    token_mask = attention_mask.to(torch.bool)
    return token_mask[:, -seq:] if token_mask.shape[1] != seq else token_mask


def _check_documents(
    model: "Model", documents: Tensor, input_ids: Tensor, cache: Optional[KVCache], eager: bool
) -> None:
    """Refuse document ids ``model`` cannot honour: with a cache, of another shape, or a token mixer (any module
    tagged with a mixer kind, attention or recurrent, the mixers inside a hybrid too) whose entry does not declare
    the ``document_mask`` capability (found once per model, from the capabilities each mixer was built with)."""
    if cache is not None:
        raise ValueError("documents (document-masked packing) cannot be combined with a KV cache; drop one of them")
    if not eager:  # under torch.compile: checked by the eager calls (and by the trainer at setup), not traced
        return
    if tuple(documents.shape) != tuple(input_ids.shape):
        raise ValueError(
            f"documents must be [batch, seq] = {tuple(input_ids.shape)} like input_ids, got {tuple(documents.shape)}"
        )
    problems = getattr(model, "_document_problems", None)
    if problems is None:  # once per model: the capability each mixer was built with
        problems = model._document_problems = undeclared_mixers(model)
    if problems:
        raise ValueError(document_mask_refusal(problems))

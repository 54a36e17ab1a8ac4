"""Cross-entropy, perplexity and bits per byte of a model on a token array, in non-overlapping or strided windows.

Windows. A window of ``seq_len`` input tokens ``tokens[b : b + seq_len]`` predicts their next tokens
``tokens[b + 1 : b + seq_len + 1]``. *Non-overlapping* windows (the default; what training's final figure uses)
start at ``0, seq_len, 2 seq_len, ...``; every target is scored once with the context its window gives it, and the
tail that fills no whole window is not scored. *Strided* windows (``stride < seq_len``; the sliding-window
perplexity of Hugging Face's perplexity guide) start every ``stride`` tokens; each scores only the targets the
previous window did not, so every target but the first ``seq_len`` has at least ``seq_len - stride`` tokens of
context, and the last window (shorter, if need be) reaches the end of the split.

Figures (Shannon 1951; the bits-per-byte convention of Gao et al. 2020, The Pile, arXiv:2101.00027, §4):

* loss: mean cross-entropy in nats per scored token, ``L = -(1/T) sum_t ln p(x_t | x_<t)``;
* perplexity: ``exp(L)``;
* bits per byte: ``L * T / (B ln 2)``, with ``B`` the UTF-8 bytes of the scored target tokens
  (:meth:`modkit.data.Tokenizer.token_bytes`: exact for byte-level BPE and ``char``; special tokens count 0). Unlike
  the loss per token it does not depend on the tokenizer, so models with different vocabularies compare fairly.

With document masking (``documents=(eot_id, bos_id)``) each window is run with the document mask a training run
with ``document_mask`` uses (:func:`modkit.nn.documents.document_ids`).
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import asdict, dataclass
from typing import Any, Optional, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from modkit.nn.documents import document_ids
from modkit.core.errors import ModkitError

__all__ = ["EvalError", "Score", "ScoreRequest", "score_request", "score_tokens", "windows"]


class EvalError(ModkitError, ValueError):
    """An evaluation cannot run as asked (too few tokens, a bad window or stride, data that does not fit the model)."""


@dataclass(frozen=True)
class Score:
    """What :func:`score_tokens` measured.

    Attributes:
        loss: mean cross-entropy, nats per scored token.
        tokens: targets scored.
        bytes: UTF-8 bytes of the scored targets (``None`` when no byte table was given).
        windows: forwards (windows) run.
        seq_len, stride: the windows.
    """

    loss: float
    tokens: int
    bytes: Optional[int]
    windows: int
    seq_len: int
    stride: int

    @property
    def perplexity(self) -> float:
        """``exp(loss)``."""
        return math.exp(self.loss) if self.loss < 700 else math.inf

    @property
    def bits_per_byte(self) -> Optional[float]:
        """``loss * tokens / (bytes * ln 2)``; ``None`` without a byte count (or with no bytes)."""
        if not self.bytes:
            return None
        return self.loss * self.tokens / self.bytes / math.log(2)

    def to_json(self) -> dict:
        """The fields and the derived figures as a JSON-ready dict."""
        return {**asdict(self), "perplexity": self.perplexity, "bits_per_byte": self.bits_per_byte}


def windows(
    n_tokens: int, seq_len: int, *, stride: Optional[int] = None, max_tokens: Optional[int] = None
) -> list[tuple[int, int, int]]:
    """The windows over the first ``max_tokens + 1`` tokens (all when ``None``): ``(begin, end, first_scored)``.

    A window's inputs are ``tokens[begin:end]`` and its targets ``tokens[begin + 1 : end + 1]``; targets of inputs
    ``first_scored..end - 1`` are scored. Non-overlapping (``stride`` ``None`` or ``seq_len``): full windows only.

    Raises:
        EvalError: ``seq_len`` or ``stride`` not positive, ``stride > seq_len``, or fewer than ``seq_len + 1``
            tokens (non-overlapping) / 2 tokens (strided).
    """
    if seq_len < 1:
        raise EvalError(f"seq_len = {seq_len} must be a positive number of tokens")
    stride = seq_len if stride is None else stride
    if not 1 <= stride <= seq_len:
        raise EvalError(f"stride = {stride} must be in [1, seq_len = {seq_len}]")
    n = n_tokens if max_tokens is None else min(n_tokens, max_tokens + 1)
    if stride == seq_len:
        k = (n - 1) // seq_len
        if k < 1:
            raise EvalError(
                f"{n_tokens:,} tokens are fewer than the seq_len + 1 = {seq_len + 1} one window needs; use a smaller --seq-len"
            )
        return [(i * seq_len, (i + 1) * seq_len, i * seq_len) for i in range(k)]
    if n < 2:
        raise EvalError(f"{n_tokens:,} tokens: nothing to score (a target needs a token before it)")
    out, prev_end, begin = [], 0, 0
    last = n - 1  # inputs 0..n-2 predict targets 1..n-1
    while prev_end < last:
        end = min(begin + seq_len, last)
        out.append((begin, end, prev_end))
        prev_end, begin = end, begin + stride
    return out


@dataclass(frozen=True)
class ScoreRequest:
    """How :func:`score_tokens` scores: its keyword arguments (documented there) as one value.

    Attributes:
        seq_len: input tokens per window.
        stride: start a window every ``stride`` tokens (``None``: non-overlapping windows).
        max_tokens: score the first ``max_tokens`` targets at most (``None``: the whole array).
        batch_size: windows per forward.
        documents: ``(eot_id, bos_id)`` for document-masked windows; ``None``: plain causal windows.
        token_bytes: ``[vocab]`` UTF-8 bytes per id for bits per byte (``None``: no byte count).
        device: where to run (``None``: the model's device).
        autocast: run under ``torch.autocast`` in this dtype (``None``: the model's own dtype).
    """

    seq_len: int
    stride: Optional[int] = None
    max_tokens: Optional[int] = None
    batch_size: int = 8
    documents: Optional[Sequence[Optional[int]]] = None
    token_bytes: Optional[np.ndarray] = None
    device: Optional[torch.device] = None
    autocast: Optional[torch.dtype] = None


def score_tokens(model: nn.Module, tokens: np.ndarray, **options: Any) -> Score:
    """Score ``tokens`` with ``model`` in windows (see :func:`windows` and the module docstring).

    The keyword arguments are the fields of :class:`ScoreRequest` (:func:`score_request` takes one whole).

    Args:
        model: a :class:`~modkit.nn.model.Model` (its ``max_seq_len`` must cover ``seq_len``); put in eval mode here.
        tokens: 1-D integer array (a :class:`~modkit.data.TokenData` split: a memmap, read one batch at a time).
        seq_len: input tokens per window (required).
        stride: start a window every ``stride`` tokens (``None``: non-overlapping windows).
        max_tokens: score the first ``max_tokens`` targets at most (``None``: the whole array).
        batch_size: windows per forward.
        documents: ``(eot_id, bos_id)`` for document-masked windows; ``None``: plain causal windows.
        token_bytes: ``[vocab]`` UTF-8 bytes per id (:meth:`modkit.data.Tokenizer.token_bytes`) for bits per byte.
        device: where to run (default: the model's).
        autocast: run under ``torch.autocast`` in this dtype (``None``: the model's own dtype).

    Returns:
        :class:`Score`.

    Raises:
        EvalError: bad windows, too few tokens, a window longer than the model's ``max_seq_len``, ids outside the
            model's vocabulary.
        TypeError: no ``seq_len``, or a keyword that is not a field of :class:`ScoreRequest`.
    """
    return score_request(model, tokens, ScoreRequest(**options))


@torch.no_grad()
def score_request(model: nn.Module, tokens: np.ndarray, request: ScoreRequest) -> Score:
    """Score ``tokens`` with ``model`` as ``request`` says (see :func:`score_tokens`); the model is put in eval mode
    and back in the mode it was in.

    Returns:
        :class:`Score`.

    Raises:
        EvalError: as :func:`score_tokens`.
    """
    r = request
    spans = windows(len(tokens), r.seq_len, stride=r.stride, max_tokens=r.max_tokens)
    limit = getattr(getattr(model, "spec", None), "max_seq_len", None)
    if limit is not None and r.seq_len > limit:
        raise EvalError(
            f"seq_len = {r.seq_len} exceeds the model's max_seq_len = {limit}; use --seq-len {limit} or less"
        )
    device = r.device or next(model.parameters()).device
    was_training = model.training
    model.eval()
    loss_sum, count, n_bytes = 0.0, 0, 0
    try:
        for lo in range(0, len(spans), r.batch_size):
            batch_loss, batch_count, batch_bytes = _score_batch(model, tokens, spans[lo : lo + r.batch_size], r, device)
            loss_sum, count, n_bytes = loss_sum + batch_loss, count + batch_count, n_bytes + batch_bytes
    finally:
        model.train(was_training)
    return Score(
        loss_sum / count,
        count,
        n_bytes if r.token_bytes is not None else None,
        len(spans),
        r.seq_len,
        r.stride or r.seq_len,
    )


def _score_batch(
    model: nn.Module, tokens: np.ndarray, batch: Sequence[tuple[int, int, int]], r: ScoreRequest, device: torch.device
) -> tuple[float, int, int]:
    """One forward over the windows ``batch``: ``(sum of the scored targets' cross-entropy in nats, targets scored,
    their UTF-8 bytes (0 without a byte table))``.

    Raises:
        EvalError: the model rejects the inputs (ids outside its vocabulary, ...).
    """
    rows = np.zeros((len(batch), r.seq_len + 1), dtype=np.int64)
    keep = np.zeros((len(batch), r.seq_len), dtype=bool)
    for i, (b, e, first) in enumerate(batch):
        rows[i, : e - b + 1] = tokens[b : e + 1]
        keep[i, first - b : e - b] = True
    x = torch.from_numpy(rows[:, :-1]).to(device)
    y = torch.from_numpy(rows[:, 1:]).to(device)
    kwargs = {}
    if r.documents is not None:
        kwargs["documents"] = document_ids(x, eot_id=r.documents[0], bos_id=r.documents[1])
    context = torch.autocast(device.type, dtype=r.autocast) if r.autocast is not None else contextlib.nullcontext()
    try:
        with context:
            logits = model(x, **kwargs).logits
    except ValueError as exc:
        raise EvalError(f"the model cannot score this data: {exc}") from None
    ce = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1), reduction="none").view(y.shape)
    mask = torch.from_numpy(keep).to(device)
    n_bytes = int(r.token_bytes[rows[:, 1:][keep]].sum()) if r.token_bytes is not None else 0
    return float((ce * mask).sum().double()), int(keep.sum()), n_bytes

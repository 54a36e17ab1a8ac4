"""One optimizer step of a training run: ``grad_accum`` micro-batches forward and backward under the run's
precision, cross-entropy over every position plus the model's auxiliary loss, gradient clipping, the optimizer
step at the scheduled learning rate (:func:`modkit.train.schedule.lr_at`) and the routers' balance update.

A mixin of :class:`modkit.train.loop.Trainer`; the recipe follows nanoGPT's ``train.py`` (Karpathy).
"""

from __future__ import annotations

import contextlib
import math
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from modkit.nn.documents import document_ids
from .schedule import lr_at


class StepMixin:
    """The step methods of :class:`modkit.train.loop.Trainer`: they read the attributes its ``setup`` sets
    (``config``, ``device``, ``procs``, ``model``, ``forward``, ``optimizer``, ``scaler``, ``sampler``, ``params``,
    ``balance``, ``separators``) and advance ``step`` and ``tokens``."""

    def _autocast(self):
        """The autocast context of the run's precision (none in float32)."""
        p = self.config.precision
        if p == "float32":
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=torch.bfloat16 if p == "bfloat16" else torch.float16)

    def _forward(self, x: Tensor) -> tuple[Tensor, Optional[Tensor]]:
        """``(logits [rows, seq, vocab] as full tensors, aux_loss or None)`` under the run's precision; with
        ``document_mask`` the document ids of the batch come from its end-of-text / begin-of-text tokens."""
        docs = None
        if self.config.document_mask:
            docs = document_ids(x, eot_id=self.separators[0], bos_id=self.separators[1])
        with self._autocast():
            out = self.forward(x) if docs is None else self.forward(x, documents=docs)
        logits = out.logits
        if hasattr(logits, "full_tensor"):  # a DTensor head output under tensor parallelism
            logits = logits.full_tensor()
        return logits, out.aux_loss

    def _loss(self, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        """``(total loss for backward, cross-entropy alone)`` of one micro-batch: mean over every position."""
        logits, aux = self._forward(x)
        ce = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1))
        total = ce if aux is None else ce + aux.float()
        return total, ce.detach()

    def _rows(self, t: Tensor) -> Tensor:
        """``t`` on the run's device."""
        return t.to(self.device, non_blocking=True)

    def train_step(self) -> dict:
        """One optimizer step; returns its loss, learning rate and gradient norm (as tensors until logged).

        Returns:
            ``{"loss": mean cross-entropy [] (nats, the step's batch), "lr": float, "grad_norm": [] (before
                clipping), "balance": the routers' load imbalance of the step or None}``.
        """
        c = self.config
        lr = lr_at(self.step, c)
        for group in self.optimizer.param_groups:
            group["lr"] = lr * group.get("lr_mult", 1.0)  # 1, or muP's factor for the group's roles
        ce_sum = torch.zeros((), device=self.device)
        self.balance.begin_step()
        for micro in range(c.grad_accum):
            if self.procs.distributed and hasattr(self.model, "set_requires_gradient_sync"):
                self.model.set_requires_gradient_sync(micro == c.grad_accum - 1)
            x, y = self.sampler.next()
            total, ce = self._loss(self._rows(x), self._rows(y))
            self.scaler.scale(total / c.grad_accum).backward()
            ce_sum += ce
        self.scaler.unscale_(self.optimizer)
        max_norm = c.grad_clip if c.grad_clip is not None else math.inf  # inf: the norm is measured, nothing clipped
        if self.procs.distributed:  # gradients are a mix of plain tensors and DTensor shards
            from ..parallel import clip_grad_norm_

            norm = clip_grad_norm_(self.params, max_norm)
        else:
            norm = torch.nn.utils.clip_grad_norm_(self.params, max_norm)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        balance = self.balance.end_step()  # the routers' bias update from this step's loads (no gradient)
        self.step += 1
        self.tokens += c.tokens_per_step
        return {"loss": ce_sum / c.grad_accum, "lr": lr, "grad_norm": norm, "balance": balance}

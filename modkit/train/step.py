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
from .errors import TrainError
from .schedule import lr_at


def check_mtp_config(config, spec) -> None:
    """Refuse, before the run folder is written, a spec with multi-token prediction (``mtp``) or a residual stream of
    several copies (``stream``) under a layout or mode they do not run in yet: tensor, context, expert or pipeline
    parallelism (the MTP modules and the stream's head sit outside the layers these split; pipeline stages pass a
    one-copy stream), and for ``mtp`` ``document_mask`` (a depth's row would mix documents) and rows too short.

    Raises:
        TrainError: naming the setting and the way out.
    """
    split = [f"{name} = {getattr(config, name)}" for name in ("tp", "cp", "ep", "pp") if getattr(config, name) > 1]
    if spec.stream is not None and split:
        raise TrainError(
            f"the spec's residual stream of several copies (stream {spec.stream.type!r}) trains in one process or under "
            f"FSDP only, not with {', '.join(split)}: drop those settings, or the spec's stream"
        )
    if spec.mtp is None or config.mtp_loss_weight == 0:
        return
    if split:
        raise TrainError(
            f"the spec's multi-token prediction (mtp, depth {spec.mtp.depth}) trains in one process or under FSDP "
            f"only, not with {', '.join(split)}: drop those settings, or set mtp_loss_weight = 0 to train without it"
        )
    if config.document_mask:
        raise TrainError(
            "the spec's multi-token prediction (mtp) does not run with document_mask = true (its shifted rows would "
            "cross documents): set document_mask = false, or mtp_loss_weight = 0 to train without it"
        )
    if config.seq_len <= spec.mtp.depth:
        raise TrainError(
            f"seq_len = {config.seq_len} leaves no position to the multi-token prediction of depth {spec.mtp.depth}: "
            f"use seq_len > {spec.mtp.depth}"
        )


def check_sharing_config(config, spec, world: int) -> None:
    """Refuse, before the run folder is written, sharing across layers (spec ``share``, ``kv_sharing``) under a
    layout it does not run in yet: a shared block's parameters sit in several layers, which FSDP2 and tensor
    parallelism shard layer by layer, so it trains in one process; a layer reading another's keys and values needs
    that layer on its own pipeline stage, so ``kv_sharing`` is refused with ``pp`` > 1.

    Raises:
        TrainError: naming the setting and the way out.
    """
    if getattr(spec, "share", None) and world > 1:
        raise TrainError(
            f"the spec shares blocks across layers (share: {len(spec.share)} group(s)), which trains in one process "
            f"only (FSDP2 and tensor parallelism shard each layer's parameters apart), not with {world} processes: "
            "run without torchrun, or drop 'share'"
        )
    if getattr(spec, "kv_sharing", None) and config.pp > 1:
        raise TrainError(
            f"the spec's kv_sharing has layers reading an earlier layer's keys and values, which pp = {config.pp} "
            "may put on another pipeline stage: set pp = 1, or drop 'kv_sharing'"
        )


class StepMixin:
    """The step methods of :class:`modkit.train.loop.Trainer`: they read the attributes its ``setup`` sets
    (``config``, ``device``, ``procs``, ``model``, ``forward``, ``optimizer``, ``scaler``, ``sampler``, ``params``,
    ``balance``, ``separators``, ``skipped_steps``, ``consecutive_skips``) and advance ``step`` and ``tokens``."""

    def _autocast(self):
        """The autocast context of the run's precision (none in float32)."""
        p = self.config.precision
        if p == "float32":
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=torch.bfloat16 if p == "bfloat16" else torch.float16)

    def _forward(
        self, x: Tensor, *, local: bool = False, mtp: bool = False
    ) -> tuple[Tensor, Optional[Tensor], Optional[list]]:
        """``(logits [rows, seq, vocab] as full tensors, aux_loss or None, mtp logits or None)`` under the run's
        precision (``mtp``: also the multi-token-prediction depths' logits, ``[rows, seq - k, vocab]``); with
        ``document_mask`` the document ids of the batch come from its end-of-text / begin-of-text tokens. Under
        context parallelism the model runs on this rank's slice of every row (``[rows, seq / cp]``): ``local``
        returns that slice's logits, else the whole rows' are gathered (no gradient through the gather)."""
        docs = None
        if self.config.document_mask:
            docs = document_ids(x, eot_id=self.separators[0], bos_id=self.separators[1])
        context = getattr(self.model, "context_parallel", None)
        kwargs = {"input_ids": x} if docs is None else {"input_ids": x, "documents": docs}
        if context is not None:
            kwargs = context.split_batch(x, docs)
        if mtp:
            kwargs["mtp"] = True
        with self._autocast():
            out = self.forward(**kwargs)
        logits = out.logits
        if hasattr(logits, "full_tensor"):  # a DTensor head output under tensor parallelism
            logits = logits.full_tensor()
        if context is not None and not local:
            from ..parallel.context import _all_gather

            logits = _all_gather(logits.detach(), 1, context.group, autograd=False)
        return logits, out.aux_loss, out.mtp_logits

    def _loss(self, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        """``(total loss for backward, cross-entropy alone)`` of one micro-batch: mean over every position (under
        context parallelism: over this rank's slice; the slices' mean is the rows' mean, and the gradient mean over
        the ranks FSDP2 takes is the rows' gradient). In training mode, a spec with ``mtp`` adds
        ``mtp_loss_weight / D · Σ_k CE_k`` (depth ``k``'s position ``i`` predicts ``y[i + k]``; DeepSeek-V3's
        ``L_MTP``, arXiv:2412.19437 eq. 25), whose sum is kept in ``self.mtp_ce`` for the step's record."""
        weight = self.config.mtp_loss_weight if self.model.training and self.spec.mtp is not None else 0.0
        logits, aux, extra = self._forward(x, local=True, mtp=weight > 0)
        context = getattr(self.model, "context_parallel", None)
        if context is not None:
            y = context.split(y)
        ce = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1))
        total = ce if aux is None else ce + aux.float()
        if extra:
            depths = [
                F.cross_entropy(z.float().reshape(-1, z.shape[-1]), y[:, k:].reshape(-1))
                for k, z in enumerate(extra, 1)
            ]
            mtp = torch.stack(depths).mean()
            total = total + weight * mtp
            self.mtp_ce = self.mtp_ce + mtp.detach()
        return total, ce.detach()

    def _rows(self, t: Tensor) -> Tensor:
        """``t`` on the run's device."""
        return t.to(self.device, non_blocking=True)

    def train_step(self) -> dict:
        """One optimizer step; returns its loss, learning rate and gradient norm (as tensors until logged).

        Returns:
            ``{"loss": mean cross-entropy [] (nats, the step's batch), "lr": float, "grad_norm": [] (before
                clipping), "balance": the routers' load imbalance of the step or None, "skipped": what was not
                finite in a step skipped under ``on_nonfinite = "skip"``, else None}``; with multi-token
                prediction also ``"mtp_loss"``: the depths' mean cross-entropy [] (nats).

        Raises:
            TrainError: the loss or gradient norm is not finite (``on_nonfinite = "stop"``, or too many skipped
                steps in a row), or the update made a weight non-finite; nothing of the step is saved.
        """
        c = self.config
        lr = lr_at(self.step, c)
        for group in self.optimizer.param_groups:
            group["lr"] = lr * group.get("lr_mult", 1.0)  # 1, or muP's factor for the group's roles
        ce_sum = torch.zeros((), device=self.device)
        self.mtp_ce = torch.zeros((), device=self.device)  # the micro-batches' multi-token-prediction CE (_loss)
        self.balance.begin_step()
        if self.pipe is not None:  # the whole batch through the pipeline's schedule (grad_accum is 1)
            from .pipelined import pipeline_step_loss

            x, y = self.sampler.next()
            ce_sum += pipeline_step_loss(self, self._rows(x), self._rows(y))
        for micro in range(c.grad_accum if self.pipe is None else 0):
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

            norm = clip_grad_norm_(self.params, max_norm, pp=self.procs.pp)
        else:
            norm = torch.nn.utils.clip_grad_norm_(self.params, max_norm)
        loss = ce_sum / c.grad_accum
        problem = self._nonfinite_problem(loss, norm)
        if problem is not None:  # stop (raises), or skip the batch: no update, no balancing update
            self.optimizer.zero_grad(set_to_none=True)
            self.scaler.update()
            self._skip_or_stop(problem)
            self.step += 1
            self.tokens += c.tokens_per_step
            return {"loss": loss, "lr": lr, "grad_norm": norm, "balance": None, "skipped": problem}
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        self.consecutive_skips = 0
        balance = self.balance.end_step()  # the routers' bias update from this step's loads (no gradient)
        self.step += 1
        self.tokens += c.tokens_per_step
        out = {"loss": loss, "lr": lr, "grad_norm": norm, "balance": balance, "skipped": None}
        if self.spec.mtp is not None and c.mtp_loss_weight > 0:
            out["mtp_loss"] = self.mtp_ce / c.grad_accum
        return out

    # ------------------------------------------------------------------ non-finite steps
    def _any_rank(self, flag: Tensor) -> bool:
        """Whether ``flag`` (a 0/1 float tensor) is 1 on any rank (collective under several processes)."""
        return float(self.procs.mean(flag)) > 0

    def _nonfinite_problem(self, loss: Tensor, norm: Tensor) -> Optional[str]:
        """What is not finite in this step before its update: the loss, or (without a float16 grad scaler, which
        skips such steps itself) the gradient norm; ``None`` when both are finite. Collective: every rank gets the
        same answer, in one host synchronisation per step, which also checks the weights the previous step's
        update left (the norm of each tensor, :meth:`_weights_flag`): a weight made non-finite by step N's update stops the run
        at the start of step N + 1, before anything else runs on it, and the checkpoint and evaluation of step N
        refuse it themselves (:meth:`_check_weights`).

        Raises:
            TrainError: the weights hold a NaN or infinite value (``step N: after the optimizer update, ...``).
        """
        checks = [loss.float()] + ([] if self.scaler.is_enabled() else [norm.float()])
        flags = torch.stack([(~torch.isfinite(torch.stack(checks))).any().float(), self._weights_flag(fast=True)])
        bad = self.procs.mean(flags.to(self.device)) > 0
        bad_values, bad_weights = bad.tolist()  # the one host synchronisation
        if bad_weights:
            self._check_weights("after the optimizer update, the weights", step=self.step)
        if not bad_values:
            return None
        mean_loss = float(self.procs.mean(loss.detach().float()))
        if not math.isfinite(mean_loss):
            return f"the training loss is {mean_loss}"
        return f"the gradient norm is {float(norm)} (the loss {mean_loss:.4f} is finite)"

    def _skip_or_stop(self, problem: str) -> None:
        """Count a skipped step, or stop the run: always with ``on_nonfinite = "stop"``, after
        ``max_nonfinite_skips`` skipped steps in a row with ``"skip"``.

        Raises:
            TrainError: naming the step, what is not finite, and the last checkpoint (nothing of this step is saved).
        """
        c = self.config
        n = self.step + 1
        fix = "lower lr or raise warmup_steps, check the data at this step"
        if c.on_nonfinite == "stop":
            raise TrainError(
                f"step {n}: {problem}; the run stopped before the update ({self._saved_note()}). To go on: {fix}, "
                "or pass --on-nonfinite skip to skip such batches (counted, at most --max-nonfinite-skips in a row)"
            )
        self.skipped_steps += 1
        self.consecutive_skips += 1
        if self.consecutive_skips > c.max_nonfinite_skips:
            raise TrainError(
                f"step {n}: {problem}: {self.consecutive_skips} non-finite steps in a row, over max_nonfinite_skips = "
                f"{c.max_nonfinite_skips}; the run stopped ({self._saved_note()}). To go on: {fix}"
            )

    def _weights_flag(self, fast: bool = False) -> Tensor:
        """``[]`` float: 1 when a trainable parameter (this rank's shard) holds a NaN or infinite value, else 0 (one
        pass over the weights; no host synchronisation).

        ``fast``: the flag of the per-step check, from each tensor's Euclidean norm (``torch._foreach_norm``, one
        vectorised pass: about 20x cheaper on the CPU than the largest magnitude, whose kernel is not vectorised). A
        NaN or infinite entry makes its tensor's norm non-finite, so nothing is missed; a finite tensor whose norm
        overflows float32 (entries near 1e19) raises the flag too, and :meth:`_check_weights` then looks again with
        the exact test (the largest magnitude per tensor) before it stops anything."""
        held = [t for t in self._local_params() if t.numel()]  # a rank's shard of a small tensor may be empty
        if not held:
            return torch.zeros((), device=self.device)
        norms = torch._foreach_norm(held) if fast else torch._foreach_norm(held, ord=math.inf)
        return (~torch.isfinite(torch.stack(norms))).any().float().to(self.device)

    def _local_params(self) -> list[Tensor]:
        """The trainable parameters as this rank holds them (a DTensor's local shard), detached."""
        return [(p.to_local() if hasattr(p, "to_local") else p).detach() for p in self.params]

    def _check_weights(self, what: str, step: Optional[int] = None) -> None:
        """Stop the run when a trainable parameter holds a NaN or infinite value (collective).

        Args:
            what: the subject of the message (``"after the optimizer update, the weights"``).
            step: the step the message names; default the next one (``self.step + 1``).

        Raises:
            TrainError: ``step N: {what} hold NaN or infinite values: name (count of size), ...``.
        """
        if not self._any_rank(self._weights_flag()):
            return
        from modkit.io.checkpoint.state import nonfinite_counts

        local = self._local_params()
        counts = nonfinite_counts(dict(zip(self.param_names, local)))
        sizes = dict(zip(self.param_names, local))
        listed = ", ".join(f"{n} ({k:,} of {sizes[n].numel():,})" for n, k in list(counts.items())[:5])
        more = f" and {len(counts) - 5} more" if len(counts) > 5 else ""
        raise TrainError(
            f"step {self.step + 1 if step is None else step}: {what} hold NaN or infinite values: "
            f"{listed or 'on another rank'}{more}; the run stopped ({self._saved_note()}). The update was not "
            "finite: lower lr, or check the optimizer's settings"
        )

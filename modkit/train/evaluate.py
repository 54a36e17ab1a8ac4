"""Evaluation during a training run: the loss estimates on fixed train and validation windows at each eval interval
(with the ``best`` checkpoint and the loss plot), the final validation loss over a whole stretch of the split (and
its bits per byte), and the text sample of the ``best`` model at the end.

A mixin of :class:`modkit.train.loop.Trainer`.
"""

from __future__ import annotations

import math
from typing import Optional

import numpy as np
import torch
import torch.nn.functional as F

from .errors import TrainError


class EvalMixin:
    """The evaluation methods of :class:`modkit.train.loop.Trainer`: they read the attributes its ``setup`` sets
    (``config``, ``run``, ``procs``, ``device``, ``data``, ``spec``, ``model``, ``rows``, ``eval_train``,
    ``eval_val``, ``balance``, ``best_val``) and the step methods' ``_loss`` / ``_forward`` / ``_rows``."""

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """Mean cross-entropy on the fixed train and validation windows (eval mode: no dropout)."""
        self.model.eval()
        out = {}
        lo, hi = self.procs.dp_rank * self.rows, (self.procs.dp_rank + 1) * self.rows
        for split, batches in (("train", self.eval_train), ("val", self.eval_val)):
            losses = []
            for x, y in batches:
                if self.pipe is not None:  # a forward-only pass of the pipeline's schedule
                    from .pipelined import pipeline_eval_loss

                    losses.append(pipeline_eval_loss(self, self._rows(x[lo:hi]), self._rows(y[lo:hi])))
                    continue
                _, ce = self._loss(self._rows(x[lo:hi]), self._rows(y[lo:hi]))
                losses.append(ce)
            out[split] = float(self.procs.mean(torch.stack(losses).mean()))
        self.model.train()
        return out

    @torch.no_grad()
    def score_split(self, tokens, max_tokens: int) -> float:
        """Mean cross-entropy over the first ``max_tokens`` tokens of ``tokens`` in non-overlapping ``seq_len``
        windows (every position scored once, each with the context its window gives it). Collective: the
        windows are dealt to the data-parallel ranks, sums and counts all-reduced. The UTF-8 bytes of the scored
        targets (:meth:`modkit.data.Tokenizer.token_bytes`) are left in ``self.scored_bytes`` (bits per byte).

        Args:
            tokens: the split's token ids ``[n]`` (a numpy array or memmap).
            max_tokens: how many tokens to score at most.

        Returns:
            The mean cross-entropy in nats per token.

        Raises:
            TrainError: the split is shorter than ``seq_len + 1`` tokens.
        """
        c = self.config
        t = c.seq_len
        n = (min(len(tokens), max_tokens + 1) - 1) // t
        if n < 1:
            raise TrainError(f"the validation split has {len(tokens)} tokens, fewer than seq_len + 1 = {t + 1}")
        per = self.rows * self.procs.dp
        sums = torch.zeros(3, dtype=torch.float64, device=self.device)
        table = torch.from_numpy(self.data.tokenizer.token_bytes()).to(self.device)
        self.model.eval()
        for b in range(-(-n // per)):  # every rank runs the same number of forwards (FSDP needs it)
            idx = torch.arange(self.rows) + b * per + self.procs.dp_rank * self.rows
            real = idx < n
            starts = torch.where(real, idx, torch.zeros_like(idx)).numpy() * t
            rows = torch.from_numpy(np.stack([tokens[s : s + t + 1] for s in starts]).astype(np.int64))
            x, y = self._rows(rows[:, :-1]), self._rows(rows[:, 1:])
            mask = self._rows(real)[:, None].float()
            if self.pipe is not None:  # the summed loss of the real rows, through the pipeline (the same on its ranks)
                from .pipelined import pipeline_masked_sum

                ce_total = pipeline_masked_sum(self, x, y, self._rows(real)).double() / self.procs.pp
            else:
                logits, _, _ = self._forward(x)
                ce = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1), reduction="none")
                ce_total = (ce.view(len(idx), t) * mask).sum().double()
            sums += torch.stack([ce_total, (mask.sum() * t).double(), (table[y] * mask).sum().double()])
        self.model.train()
        if self.procs.distributed:
            torch.distributed.all_reduce(sums)
            sums[1:] /= self.procs.pp  # every stage counted the same positions and bytes
        self.scored_bytes = int(sums[2])
        return float(sums[0] / sums[1])

    def _eval_and_record(self) -> dict[str, float]:
        """Evaluate, log the ``eval`` line, save ``best`` when the validation loss is the lowest yet, plot (at every
        evaluation with ``live_plot``, else at the run's last one when no final evaluation follows).

        Raises:
            TrainError: a loss estimate is not finite (nothing is logged or saved).
        """
        losses, balance = self.balance.measure(self.evaluate)  # expert loads on the fixed eval windows (MoE)
        for split in ("val", "train"):
            if not math.isfinite(losses[split]):
                name = "validation" if split == "val" else "training"
                raise TrainError(
                    f"step {self.step}: the {name} loss estimate is {losses[split]} (train {losses['train']}, val "
                    f"{losses['val']}): the weights give non-finite outputs and are not saved as best; "
                    f"{self._saved_note()}"
                )
        record = {
            "kind": "eval",
            "step": self.step,
            "tokens": self.tokens,
            "train_loss": losses["train"],
            "val_loss": losses["val"],
        }
        record.update(balance or {})
        self._metric(record)
        if self.best_val is None or losses["val"] < self.best_val:
            self.best_val = losses["val"]
            self.save_best()
        c = self.config
        if c.live_plot or (self.step >= c.total_steps and not c.final_eval_tokens):  # else the final evaluation's
            self._plot()
        return losses

    def _final_eval(self) -> Optional[float]:
        """The validation loss over the first ``final_eval_tokens`` of the split (``None`` when 0), logged as the
        ``final`` line with its bits per byte (``loss * tokens / bytes / ln 2``); collective."""
        c = self.config
        if not c.final_eval_tokens:
            return None
        full_val = self.score_split(self.data.val, c.final_eval_tokens)
        scored = min(len(self.data.val) - 1, c.final_eval_tokens) // c.seq_len * c.seq_len
        bpb = full_val * scored / self.scored_bytes / math.log(2) if self.scored_bytes else None
        self._metric(
            {
                "kind": "final",
                "step": self.step,
                "tokens": self.tokens,
                "val_loss": full_val,
                "val_tokens_scored": scored,
                "val_bytes_scored": self.scored_bytes,
                "val_bits_per_byte": bpb,
            }
        )
        per_byte = f" ({bpb:.4f} bits per byte)" if bpb is not None else ""
        self._say(f"validation loss over {scored:,} tokens of the validation split: {full_val:.4f}{per_byte}")
        self._plot()
        return full_val

    def _plot(self) -> None:
        """Redraw ``loss.png`` from ``metrics.jsonl`` (rank 0)."""
        if self.procs.main:
            from .plot import plot_run

            plot_run(self.run / "metrics.jsonl", self.run / "loss.png", title=self.spec.name or "run")

    def _sample(self) -> str:
        """Text generated by the ``best`` model from ``sample_prompt``, also written to ``sample.txt`` (rank 0)."""
        from modkit.io.checkpoint import load
        from modkit.inference.generate import generate, sample

        c = self.config
        model = load(self.run / "best", device=self.device).eval()
        tok = self.data.tokenizer
        ids = tok.encode(c.sample_prompt) or [0]
        limit = model.spec.max_seq_len
        kwargs = dict(temperature=c.sample_temperature, top_k=c.sample_top_k)
        if len(ids) + c.sample_tokens <= limit:
            ids = generate(model, [ids], max_new_tokens=c.sample_tokens, seed=c.seed, **kwargs)[0].tolist()
        else:  # past the context: each token from the last max_seq_len tokens, as nanoGPT's sample.py does
            gen = torch.Generator(device=self.device).manual_seed(c.seed)
            with torch.no_grad():
                for _ in range(c.sample_tokens):
                    window = torch.tensor([ids[-limit:]], device=self.device)
                    logits = model(window, logits_to_keep=1).logits[:, -1]
                    ids.append(int(sample(logits, generator=gen, **kwargs)[0]))
        text = tok.decode(ids)
        (self.run / "sample.txt").write_text(text + "\n")
        return text

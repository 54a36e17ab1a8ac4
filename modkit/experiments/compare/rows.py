"""The table of a comparison from its runs: a :class:`~modkit.experiments.compare.results.SpecRow` per variant at
its chosen learning rate (:func:`table_rows`), and the loss by position at twice the training context
(:func:`position_losses`, :func:`bucket_means`, :func:`score_positions`).
"""

from __future__ import annotations

import copy
import statistics
from typing import Optional

import numpy as np
import torch
import torch.nn.functional as F

from .plan import ComparePlan, _Variant
from .results import CompareError, RunSummary, SpecRow, _finite, mean_std


@torch.no_grad()
def position_losses(
    model: torch.nn.Module, tokens: np.ndarray, length: int, max_tokens: int, *, batch: int = 8
) -> np.ndarray:
    """Mean cross-entropy per position ``[length]`` over non-overlapping windows of ``length`` tokens.

    Window ``w`` holds inputs ``tokens[w * length : (w + 1) * length]`` and their next tokens; the windows cover
    at most the first ``max_tokens + 1`` tokens (at least one window). Position ``p``'s loss is the mean over
    windows of the cross-entropy (nats) of predicting token ``p + 1`` from tokens ``0..p`` of its window.

    Raises:
        CompareError: ``tokens`` is shorter than ``length + 1``.
    """
    n = (min(len(tokens), max(max_tokens, length) + 1) - 1) // length
    if n < 1:
        raise CompareError(
            f"the validation split has {len(tokens)} tokens, fewer than the {length + 1} one window of {length} needs"
        )
    device = next(model.parameters()).device
    sums = torch.zeros(length, dtype=torch.float64)
    for b in range(0, n, batch):
        windows = [tokens[s * length : s * length + length + 1] for s in range(b, min(b + batch, n))]
        rows = torch.from_numpy(np.stack(windows).astype(np.int64)).to(device)
        logits = model(rows[:, :-1]).logits.float()
        ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), rows[:, 1:].reshape(-1), reduction="none")
        sums += ce.view(len(rows), length).double().sum(0).cpu()
    return (sums / n).numpy()


def bucket_means(per_position: np.ndarray, n_buckets: int) -> list[float]:
    """Mean of ``per_position`` over ``n_buckets`` consecutive, (nearly) equal slices of the positions."""
    return [float(chunk.mean()) for chunk in np.array_split(per_position, n_buckets)]


def _make_row(plan: ComparePlan, v: _Variant, lr: float, runs: list[RunSummary]) -> SpecRow:
    """Variant ``v``'s row at ``lr``: its parameters (of the spec as trained), FLOPs per token (``None`` when
    :mod:`modkit.analysis.cost` cannot count them) and the means / sample stds over ``runs``."""
    import modkit
    from modkit.analysis.cost import CostError, training_flops_per_token
    from modkit.experiments.stats import is_unstable

    spec = modkit.load_spec(runs[0].run_dir / "spec.json")  # as trained: vocab_size set from the data
    train_mean, train_std = mean_std([r.train_loss for r in runs])
    val_mean, val_std = mean_std([r.val_loss for r in runs])
    try:
        fpt: Optional[int] = training_flops_per_token(spec, plan.config_of(v).seq_len)
    except CostError:
        fpt = None
    bpb = [r.val_bpb for r in runs]
    bpb_mean, bpb_std = mean_std(bpb) if all(x is not None for x in bpb) else (None, None)
    return SpecRow(
        spec=v.label,
        path=str(v.path),
        params=modkit.count_params(spec),
        active_params=modkit.active_params_per_token(spec),
        lr=lr,
        tokens_per_s=statistics.fmean(r.tokens_per_s for r in runs),
        train_loss_mean=train_mean,
        train_loss_std=train_std,
        val_loss_mean=val_mean,
        val_loss_std=val_std,
        diverged=sum(r.diverged for r in runs),
        runs=sorted(runs, key=lambda r: r.seed),
        design=v.design,
        size=v.size,
        flops_per_token=fpt,
        tokens=runs[0].tokens,
        holdout=v.holdout,
        unstable=sum(1 for r in runs if is_unstable(r.above_min, r.spikes) or r.stall is not None),
        val_bpb_mean=bpb_mean,
        val_bpb_std=bpb_std,
    )


def table_rows(
    plan: ComparePlan, by_variant: dict[str, dict[float, list[RunSummary]]]
) -> tuple[list[SpecRow], list[SpecRow]]:
    """``(rows, grid)``: each variant's row at its chosen learning rate, and with a grid every (variant, rate) row.

    A grid's rate is the one of the lowest mean validation loss over seeds, a sweep's the one of the lowest first-seed
    loss; the chosen row's ``sweep`` holds the validation loss at every rate tried.
    """
    rows: list[SpecRow] = []
    grid: list[SpecRow] = []
    mode = plan.request.mode
    for v in plan.variants:
        per_lr = by_variant[v.label]
        if mode == "grid":
            lr_rows = [_make_row(plan, v, lr, per_lr[lr]) for lr in plan.request.lrs]
            grid += lr_rows
            chosen = copy.copy(min(lr_rows, key=lambda r: _finite(r.val_loss_mean)))
            chosen.sweep = {r.lr: r.val_loss_mean for r in lr_rows}
        elif mode == "sweep":
            lr = min(per_lr, key=lambda lr: _finite(per_lr[lr][0].val_loss))
            chosen = _make_row(plan, v, lr, per_lr[lr])
            chosen.sweep = {lr_: runs[0].val_loss for lr_, runs in per_lr.items()}
        else:
            lr = next(iter(per_lr))
            chosen = _make_row(plan, v, lr, per_lr[lr])
        rows.append(chosen)
    return rows, grid


def score_positions(plan: ComparePlan, rows: list[SpecRow], eval_len: int) -> None:
    """Score each run's best checkpoint on the validation split in windows of ``eval_len`` tokens (at most the
    config's ``final_eval_tokens``): its position buckets and its loss over every position (``long_val_loss``), and
    the rows' means over seeds. A row whose model cannot read ``eval_len`` tokens, or whose validation split is
    shorter than one window, gets a ``buckets_note`` instead.
    """
    import modkit
    from modkit.data import TokenData
    from modkit.train.loop import _resolve_device

    base = plan.base
    device = _resolve_device(base.device)
    val_tokens = TokenData.open(plan.data_folder, verify=False).val
    for row in rows:
        spec = modkit.load_spec(row.runs[0].run_dir / "spec.json")
        if spec.max_seq_len < eval_len:
            row.buckets_note = f"max_seq_len = {spec.max_seq_len} < {eval_len}"
            continue
        if len(val_tokens) < eval_len + 1:
            row.buckets_note = f"the validation split has {len(val_tokens)} tokens, fewer than {eval_len + 1}"
            continue
        for r in row.runs:
            model = modkit.load(r.run_dir / "best", device=device).eval()
            per_position = position_losses(model, val_tokens, eval_len, base.final_eval_tokens or eval_len)
            r.buckets = bucket_means(per_position, plan.request.n_buckets)
            r.long_val_loss = float(per_position.mean())
        row.buckets = [float(np.mean(col)) for col in zip(*(r.buckets for r in row.runs))]
        row.long_val_loss_mean, row.long_val_loss_std = mean_std([r.long_val_loss for r in row.runs])

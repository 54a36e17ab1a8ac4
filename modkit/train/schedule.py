"""Learning-rate schedules: warmup, then cosine / linear / constant / warmup-stable-decay down to ``min_lr``.

A pure function of the step, so a resumed run needs no scheduler state: the step number is the state.
"""

from __future__ import annotations

import math

from .config import TrainConfig


def lr_at(step: int, config: TrainConfig) -> float:
    """Learning rate of optimizer step ``step`` (0-based).

    With ``W = warmup_steps``, ``T = decay_steps`` (default: the step budget) and ``r = (step - W) / (T - W)``
    clipped to ``[0, 1]``:

    * warmup (``step < W``): ``lr * (step + 1) / (W + 1)`` (never 0, so the first step moves; nanoGPT's
      ``lr * (it + 1) / (warmup_iters + 1)``);
    * ``cosine``: ``min_lr + (lr - min_lr) * (1 + cos(pi * r)) / 2`` (Loshchilov & Hutter 2017, SGDR,
      arXiv:1608.03983, without restarts);
    * ``linear``: ``lr - (lr - min_lr) * r``;
    * ``constant``: ``lr``;
    * ``wsd``: ``lr`` until ``T - D`` with ``D = wsd_decay_fraction * (T - W)``, then linear to ``min_lr`` at ``T``
      (Hu et al. 2024, MiniCPM, arXiv:2404.06395).

    After ``T`` every decaying schedule stays at ``min_lr``.

    Args:
        step: optimizer step, ``>= 0``.
        config: the training config.

    Raises:
        ValueError: a negative step.
    """
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    peak, low, warm = config.lr, config.min_lr, config.warmup_steps
    if step < warm:
        return peak * (step + 1) / (warm + 1)
    if config.schedule == "constant":
        return peak
    total = config.decay_steps if config.decay_steps is not None else config.total_steps
    span = max(total - warm, 1)
    r = min(max((step - warm) / span, 0.0), 1.0)
    if config.schedule == "cosine":
        return low + (peak - low) * 0.5 * (1.0 + math.cos(math.pi * r))
    if config.schedule == "linear":
        return peak - (peak - low) * r
    # wsd: stable at the peak, then a linear decay over the last fraction of the span
    decay = config.wsd_decay_fraction
    if r <= 1.0 - decay:
        return peak
    return peak - (peak - low) * (r - (1.0 - decay)) / decay

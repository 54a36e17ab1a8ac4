"""Stalls: a run whose training loss stops improving for a large share of its steps while it sits above where its
design got to.

The instability reading (:func:`modkit.experiments.stats.instability`) measures a curve against its own running
minimum, so a run that falls quickly to a plateau and stays there reads as perfectly stable (every later step sits
*at* its running minimum): at lr 0.1 a run that sat at a train loss of about 3.0 from step 30 to step 200, while the
same design reached 2.30 at its best rate, read "0.0% of steps above the running minimum, 0 spikes". A stall is read
against two references instead:

* **the best run of its design**: the lowest smoothed train loss any run of the same variant (the same design at the
  same size, every learning rate and seed) reached; a run that plateaus well above it has stopped
  where its design did not;
* **its own earlier minimum**: a plateau well above the run's own best before it (a run knocked
  up by a spike that never recovers); the design's best includes it, so this is the reference named when the run
  itself set its design's best before the plateau.

A *stretch without improvement* is a run of consecutive logged steps over which the smoothed loss (trailing mean of
``window`` logged steps, as the instability reading) never falls more than the threshold below its level at the
stretch's first step. The threshold is the instability reading's: the margin (``--spike-margin``, 0.1 nats unless
changed) plus the dip that the run's batch noise alone gives a running minimum over its length
(:attr:`modkit.experiments.stats.Instability.threshold`), so noise neither breaks a stall nor makes one. A run is
*stalled* when its longest such stretch covers at least ``share`` (:data:`STALL_SHARE`, 50%) of its logged steps
after the first ``skip`` and the stretch's mean smoothed loss is above either reference by more than twice the
threshold (:data:`STALL_GAP`: the design's best is the lowest dip of many runs).
The best run of a design never stalls against the design (it *is* the reference); a run still improving, however
slowly, makes a new low every few steps and has no long stretch.

What it cannot see: a design whose every run plateaus at the same level (post-norm stuck near the unigram loss at
every seed of its only rate) has no lower reference of its own; compare its level with the other designs' losses.

Pure numpy over the logged ``(step, loss)`` pairs; no source beyond the instability reading it extends.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

import numpy as np

from .results import RunSummary

#: the share of a run's logged steps a stretch without improvement must cover to count as a stall
STALL_SHARE = 0.5
#: how far above its reference (in thresholds) a stretch must sit to be a stall: a design's best is the lowest
#: dip of many runs, so a healthy run at another rate or seed can end a threshold above it
STALL_GAP = 2.0
#: logged steps averaged by the trailing mean (the instability reading's window)
WINDOW = 5
#: first logged steps left out (the fast initial fall; the instability reading's skip)
SKIP = 10


def smoothed(losses: Sequence[float], window: int = WINDOW) -> np.ndarray:
    """Trailing mean of ``losses`` over ``window`` logged steps, ``[len(losses)]`` (nats; non-finite stays so)."""
    y = np.asarray(losses, dtype=np.float64)
    return np.array([y[max(0, i - window + 1) : i + 1].mean() for i in range(len(y))])


def longest_flat_stretch(smooth: np.ndarray, threshold: float, start: int = 0) -> tuple[int, int]:
    """``(first, last)`` indices (inclusive) of the longest stretch from ``start`` over which ``smooth`` never falls
    more than ``threshold`` below its value at the stretch's first index; ``(start, start)`` for a short curve.

    A new stretch begins at every index where the curve does fall that far (an improvement). Non-finite values end
    a stretch and begin none.
    """
    best = (start, start)
    first, anchor = None, math.inf
    for i in range(start, len(smooth)):
        v = smooth[i]
        if not math.isfinite(v):
            first, anchor = None, math.inf
            continue
        if first is None or v < anchor - threshold:
            first, anchor = i, v
        if i - first > best[1] - best[0]:
            best = (first, i)
    return best


def _threshold(run: RunSummary, margin: float) -> float:
    """The run's instability threshold (kept by :func:`~modkit.experiments.compare.run.read_run`), else ``margin``."""
    return run.above_threshold if run.above_threshold > 0 else margin


def find_stall(
    run: RunSummary,
    design_best: float,
    *,
    margin: float = 0.1,
    share: float = STALL_SHARE,
) -> Optional[dict]:
    """The stall of one run (see the module docstring), or ``None``.

    Args:
        run: the run (its ``train_curve``, ``(step, batch loss)`` in nats, and ``above_threshold``).
        design_best: the lowest smoothed train loss of any run of the run's variant, nats (``inf``: none finite).
        margin: the threshold used when the run kept none (an older report). share: the share of the logged steps
            after the first ``SKIP`` the stretch must cover, in ``(0, 1]``.

    Returns:
        ``{"start", "end"}`` (the stretch's first and last logged step), ``"share"`` (of the counted logged steps),
            ``"level"`` (its mean smoothed loss, nats), ``"reference"`` (the loss it is above, nats) and ``"against"``
            (``"the best run of its design"`` or ``"its own earlier minimum"``); ``None`` when the run did not stall.
    """
    steps = [s for s, _ in run.train_curve]
    smooth = smoothed([v for _, v in run.train_curve])
    skip = min(SKIP, max(0, len(smooth) - 1))
    counted = len(smooth) - skip
    if counted < 2:
        return None
    threshold = _threshold(run, margin)
    first, last = longest_flat_stretch(smooth, threshold, skip)
    if (last - first + 1) / counted < share:
        return None
    level = float(np.mean(smooth[first : last + 1]))
    reached = smooth[: last + 1][np.isfinite(smooth[: last + 1])]
    own = float(reached.min()) if len(reached) else math.inf
    # the design's best includes this run's own minimum, so it is the lower reference; it is the run's own when the
    # run itself reached it (a run knocked up from its best that never came back)
    ref = min(design_best, own)
    against = "its own earlier minimum" if own <= design_best else "the best run of its design"
    if not math.isfinite(ref) or level <= ref + STALL_GAP * threshold:
        return None
    return {
        "start": int(steps[first]),
        "end": int(steps[last]),
        "share": (last - first + 1) / counted,
        "level": level,
        "reference": ref,
        "against": against,
    }


def mark_stalls(runs: Sequence[RunSummary], *, margin: float = 0.1, share: float = STALL_SHARE) -> int:
    """Set ``run.stall`` (:func:`find_stall`) of every run, each against the best run of its own variant (``spec``
    label: every learning rate and seed of one design at one size); the number of stalled runs.

    Args:
        runs: every run of a comparison (a sweep's and a grid's included).
        margin: the instability margin (nats), used for runs that kept no threshold. share: see :func:`find_stall`.
    """
    best: dict[str, float] = {}
    for run in runs:
        finite = [v for v in smoothed([v for _, v in run.train_curve]) if math.isfinite(v)]
        best[run.spec] = min([best.get(run.spec, math.inf)] + finite)
    for run in runs:
        run.stall = find_stall(run, best[run.spec], margin=margin, share=share)
    return sum(1 for r in runs if r.stall is not None)


def stall_text(stall: Optional[dict]) -> str:
    """``"steps 30-200 (85%) at 3.000, 0.700 above the best run of its design"``; ``""`` for ``None``."""
    if not stall:
        return ""
    return (
        f"steps {stall['start']}-{stall['end']} ({stall['share']:.0%}) at {stall['level']:.3f}, "
        f"{stall['level'] - stall['reference']:.3f} above {stall['against']}"
    )

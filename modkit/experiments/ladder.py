"""Scaling ladders: each design's validation loss against training compute, fitted, compared and checked on a size
the fit did not see (``modkit compare --ladder``).

Per design (a spec label of :func:`modkit.experiments.compare.compare`), the fitted points are its sizes' ``(C, mean loss over
seeds)`` with ``C`` = training FLOPs (FLOPs per token from the components' declarations, :mod:`modkit.analysis.cost`, times the
tokens trained). The fit is ``L(C) = E + A · C^(-alpha)`` (:func:`modkit.experiments.stats.fit_power_law`; Hoffmann et al. 2022,
Chinchilla, arXiv:2203.15556; OLMo's ladders, arXiv:2412.04403, predict large runs from small ones the same way); with
sizes at two or more token budgets per parameter it is also ``L(N, D) = E + A N^-alpha + B D^-beta``
(:func:`modkit.experiments.stats.fit_chinchilla`).

Intervals (95%): a parametric bootstrap of the seed noise with a small-sample correction
(:mod:`modkit.experiments.ladder_intervals`): the noise is estimated from the seeds at every size, pooled, each resample
draws its scale from that estimate's uncertainty, then the means around the fits, refits and recomputes every
quantity. On synthetic ladders the intervals hold the true value in at least 93% of ladders at 3 and 5 seeds
(:data:`MEASURED_COVERAGE`; ``benchmarks/ladder_coverage.py``); one seed per size gives no intervals.

Against the first design (the baseline), at the largest fitted compute ``C_max`` and extrapolated tenfold:

* the **compute multiplier** of a design: how many times the baseline's compute reaches the design's loss,
  ``C_base(L_design(C)) / C`` (above 1: the design is worth that much more compute; ``inf`` when the design's loss
  is below the baseline's fitted floor ``E``);
* the **gap** ``L_design(C) - L_base(C)`` at the smallest fitted compute, at ``C_max`` and at ``10 C_max``, and its
  change from the smallest to the largest: whether the difference grows or shrinks with compute (said only when
  the change's interval excludes zero and neither fit is degenerate).

The **held-out check**: a larger size each design trained but the fit did not see; the fit's prediction at its
compute (with its interval), the measured mean loss (with its t interval over seeds), and the verdict: measured
minus predicted with an interval that accounts for both (holding 0: the size is where the fit and the noise put it).

**Degenerate fits** (:func:`degenerate_flags`) are called out beside the table and in the reading: a parameter at
its bound (``E = 0``), an unidentified parameter, a fit no better than a constant; comparisons that rest on such a
fit are not read as results.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np

from modkit.experiments.ladder_intervals import N_BOOT, LadderArrays, bootstrap_ladder, seed_noise, statistics
from modkit.experiments.stats import ALPHA_RANGE, Chinchilla, PowerLaw, fit_chinchilla, fit_power_law, mean_interval

#: bootstrap resamples of the L(N, D) fit (which costs more than the power law's)
N_BOOT_ND = 100

#: the share of synthetic ladders whose 95% interval held the true value, by seeds per size (the range over E, A,
#: alpha, the held-out prediction and verdict, the gaps, their change and the compute multipliers;
#: ``benchmarks/ladder_coverage.py``, 2000 ladders each)
MEASURED_COVERAGE = {2: (0.939, 0.955), 3: (0.940, 0.948), 5: (0.943, 0.957)}


@dataclass
class Point:
    """One size of a design: ``params``, ``tokens`` trained, ``flops`` (training FLOPs), per-seed validation losses."""

    spec: str
    params: int
    tokens: int
    flops: float
    losses: list[float]
    holdout: bool = False
    seeds: list[int] = field(default_factory=list)

    @property
    def mean(self) -> float:
        """The mean loss over seeds."""
        return float(np.mean(self.losses))


@dataclass
class DesignFit:
    """The ladder of one design.

    Attributes:
        design: the label. points: the fitted sizes. holdout: the held-out size, if any.
        law: the fit; intervals: ``{"E" | "A" | "alpha": (low, high)}`` (``None`` with one seed per size).
        chinchilla, chinchilla_intervals: the ``L(N, D)`` fit when the ladder varies both.
        predicted, predicted_ci: the fit's loss at the held-out compute; measured: ``(mean, low, high)`` there.
        verdict: ``(measured - predicted, low, high)``. drop: ``(L(C_first) - L(C_last), low, high)`` of the fit.
        flags: what the fit cannot tell (:func:`degenerate_flags`; empty: nothing).
    """

    design: str
    points: list[Point]
    holdout: Optional[Point]
    law: PowerLaw
    intervals: Optional[dict[str, tuple[float, float]]] = None
    chinchilla: Optional[Chinchilla] = None
    chinchilla_intervals: Optional[dict[str, tuple[float, float]]] = None
    predicted: Optional[float] = None
    predicted_ci: Optional[tuple[float, float]] = None
    measured: Optional[tuple[float, Optional[float], Optional[float]]] = None
    verdict: Optional[tuple[float, Optional[float], Optional[float]]] = None
    drop: Optional[tuple[float, Optional[float], Optional[float]]] = None
    flags: list[str] = field(default_factory=list)


@dataclass
class Ladder:
    """Every design's fit, and each design against the first (see the module docstring).

    ``multipliers[design]`` and ``gaps[design]``: ``{where: (value, low, high)}`` with ``where`` in ``"C_min"``
    (gaps only), ``"C_max"``, ``"10 C_max"``, and ``gaps[design]["change"]``: ``gap(C_max) - gap(C_min)``.
    ``df``: the degrees of freedom of the seed-noise estimate; ``paired``: the designs share seeds (their noise
    covariance is used).
    """

    fits: list[DesignFit]
    c_min: float
    c_max: float
    multipliers: dict[str, dict[str, tuple[float, Optional[float], Optional[float]]]] = field(default_factory=dict)
    gaps: dict[str, dict[str, tuple[float, Optional[float], Optional[float]]]] = field(default_factory=dict)
    n_boot: int = N_BOOT
    seeds: int = 1
    df: int = 0
    paired: bool = False

    def to_json(self) -> dict:
        """A JSON-able summary."""
        return {
            "c_min": self.c_min,
            "c_max": self.c_max,
            "n_boot": self.n_boot,
            "seeds": self.seeds,
            "df": self.df,
            "paired": self.paired,
            "fits": [
                {
                    "design": f.design,
                    "E": f.law.E,
                    "A": f.law.A,
                    "alpha": f.law.alpha,
                    "intervals": f.intervals,
                    "chinchilla": None if f.chinchilla is None else vars(f.chinchilla),
                    "chinchilla_intervals": f.chinchilla_intervals,
                    "points": [vars(p) for p in f.points],
                    "holdout": None if f.holdout is None else vars(f.holdout),
                    "predicted": f.predicted,
                    "predicted_ci": f.predicted_ci,
                    "measured": f.measured,
                    "verdict": f.verdict,
                    "drop": f.drop,
                    "flags": f.flags,
                }
                for f in self.fits
            ],
            "multipliers": self.multipliers,
            "gaps": self.gaps,
        }


def points_of(rows: Sequence[Any]) -> dict[str, list[Point]]:
    """``{design: [Point]}`` from comparison rows (:class:`modkit.experiments.compare.SpecRow`), sorted by compute."""
    out: dict[str, list[Point]] = {}
    for r in rows:
        if r.flops is None:
            raise ValueError(f"{r.spec}: no training FLOPs (a component without a FLOPs declaration)")
        out.setdefault(r.design, []).append(
            Point(
                r.spec, r.params, r.tokens, r.flops, [x.val_loss for x in r.runs], r.holdout, [x.seed for x in r.runs]
            )
        )
    return {d: sorted(ps, key=lambda p: p.flops) for d, ps in out.items()}


def _both_vary(points: Sequence[Point]) -> bool:
    return (
        len({p.params for p in points}) >= 2
        and len({round(p.tokens / p.params, 6) for p in points}) >= 2
        and len(points) >= 5
    )


def _arrays(designs: list[str], fitted: dict, held: dict) -> tuple[LadderArrays, bool]:
    """The ladder's numbers as :func:`modkit.experiments.ladder_intervals.bootstrap_ladder` reads them (one ladder),
    and whether the seeds are paired across designs."""
    groups = [[p for p in fitted[d]] + ([held[d]] if held[d] is not None else []) for d in designs]
    cov, df, paired = seed_noise([[p.losses for p in g] for g in groups], [[p.seeds for p in g] for g in groups])
    arrays = LadderArrays(
        c=[np.array([p.flops for p in fitted[d]], dtype=np.float64) for d in designs],
        n=[np.array([len(p.losses) for p in fitted[d]]) for d in designs],
        means=[np.array([[p.mean for p in fitted[d]]]) for d in designs],
        held_c=[held[d].flops if held[d] is not None else None for d in designs],
        held_n=[len(held[d].losses) if held[d] is not None else 0 for d in designs],
        held_means=[np.array([held[d].mean]) if held[d] is not None else None for d in designs],
        cov=cov[None],
        df=df,
    )
    return arrays, paired


def fit_ladder(rows: Sequence[Any], *, n_boot: int = N_BOOT, seed: int = 0) -> Ladder:
    """Fit every design's ladder from comparison rows, compare each with the first, and flag degenerate fits (see the
    module docstring; intervals from :func:`modkit.experiments.ladder_intervals.bootstrap_ladder`).

    Raises:
        ValueError: a design with fewer than three fitted sizes, rows without FLOPs, a non-finite loss.
    """
    per = points_of(rows)
    designs = list(per)
    fitted = {d: [p for p in ps if not p.holdout] for d, ps in per.items()}
    held = {d: next((p for p in ps if p.holdout), None) for d, ps in per.items()}
    for d, ps in fitted.items():
        if len(ps) < 3:
            raise ValueError(f"design {d}: a ladder fit needs three or more fitted sizes, got {len(ps)}")
    laws = {d: fit_power_law([p.flops for p in ps], [p.mean for p in ps]) for d, ps in fitted.items()}
    c_min = min(p.flops for ps in fitted.values() for p in ps)
    c_max = max(p.flops for ps in fitted.values() for p in ps)
    seeds = min(len(p.losses) for ps in fitted.values() for p in ps)
    arrays, paired = _arrays(designs, fitted, held)
    if arrays.df >= 1:
        point, iv = bootstrap_ladder(arrays, c_min, c_max, n_boot=n_boot, seed=seed)
    else:  # one seed per size: no noise estimate, no intervals
        fits = [{k: np.array([getattr(laws[d], k)]) for k in ("E", "A", "alpha")} for d in designs]
        point, iv = statistics(fits, arrays, c_min, c_max), {}

    def value(i: int, key: str) -> tuple[float, Optional[float], Optional[float]]:
        k = f"{i}|{key}"
        lo, hi = iv[k] if k in iv else (None, None)
        return float(point[k][0]), (None if lo is None else float(lo[0])), (None if hi is None else float(hi[0]))

    fits = []
    for i, d in enumerate(designs):
        f = DesignFit(d, fitted[d], held[d], laws[d])
        if iv:
            f.intervals = {k: value(i, k)[1:] for k in ("E", "A", "alpha")}
        f.drop = value(i, "drop")
        if held[d] is not None:
            f.predicted, *ci = value(i, "pred")
            f.predicted_ci = tuple(ci) if ci[0] is not None else None
            f.measured = mean_interval(held[d].losses)
            f.verdict = value(i, "verdict") if iv else (held[d].mean - f.predicted, None, None)
        if _both_vary(fitted[d]):
            ps = fitted[d]
            f.chinchilla = fit_chinchilla([p.params for p in ps], [p.tokens for p in ps], [p.mean for p in ps])
            if arrays.df >= 1:
                f.chinchilla_intervals = _chinchilla_intervals(ps, arrays.cov[0, i, i], arrays.df, f.chinchilla, seed)
        f.flags = degenerate_flags(f)
        fits.append(f)
    lad = Ladder(fits, c_min, c_max, n_boot=n_boot, seeds=seeds, df=arrays.df, paired=paired)
    for i, d in enumerate(designs[1:], start=1):
        lad.multipliers[d] = {w: value(i, f"mult|{w}") for w in ("C_max", "10 C_max")}
        lad.gaps[d] = {w: value(i, f"gap|{w}") for w in ("C_min", "C_max", "10 C_max", "change")}
    return lad


def degenerate_flags(f: DesignFit) -> list[str]:
    """What a design's fit cannot tell (empty: nothing flagged): a parameter at its bound (``E`` within 0.1% of the
    smallest mean loss of 0, ``A = 0``, an
    exponent at the edge of :data:`~modkit.experiments.stats.ALPHA_RANGE`), no resolved decrease over the fitted
    sizes (the fit is no better than a constant), an unidentified parameter (an interval that reaches ``E``'s bound
    or spans more than tenfold for ``E`` or ``alpha``, a thousandfold for ``A``, the coefficient at ``C = 1`` FLOP, far
    outside the data, whose healthy intervals span up to about 300x at 2 seeds)."""
    flags = []
    law, iv = f.law, f.intervals or {}
    if law.A <= 0 or (f.drop is not None and f.drop[1] is not None and f.drop[1] <= 0):
        flags.append(
            "no better than a constant: the fitted sizes do not resolve a decrease of the loss with compute "
            "(A = 0, or the interval of the drop from the smallest to the largest size holds 0), so the fit says "
            "nothing about how it scales"
        )
    if law.E <= 1e-3 * min(p.mean for p in f.points):
        flags.append(
            f"E = {_num(law.E)} sits at its bound 0: the sizes show no loss floor, so E, the extrapolation past the largest size "
            "and the compute multiplier rest on the bound, not on the data"
        )
    lo_a, hi_a = ALPHA_RANGE
    if law.alpha <= lo_a * 1.01 or law.alpha >= hi_a * 0.99:
        flags.append(f"alpha = {law.alpha:.3g} sits at the edge of the searched range {lo_a:g}-{hi_a:g}")
    wide = []
    for name, span in (("E", 10.0), ("A", 1e3), ("alpha", 10.0)):
        lo, hi = iv.get(name) or (None, None)
        if lo is not None and (lo <= 0 or hi / lo > span):
            wide.append(f"{name} [{_num(lo)}, {_num(hi)}]")
    if wide:
        flags.append(
            "not identified by these sizes: "
            + ", ".join(wide)
            + " (an interval reaching the bound or spanning orders of magnitude); more sizes, a wider compute range "
            "or more seeds are needed before reading it"
        )
    return flags


def _chinchilla_intervals(
    points: Sequence[Point], var: float, df: int, fit: Chinchilla, seed: int
) -> dict[str, tuple[float, float]]:
    """Percentile intervals of the L(N, D) fit by the same parametric bootstrap as the power law's (per-seed
    variance ``var`` on ``df`` degrees of freedom; :mod:`modkit.experiments.ladder_intervals`), ``N_BOOT_ND``
    resamples."""
    rng = np.random.default_rng(seed + 1)
    centre = np.array([float(fit(p.params, p.tokens)) for p in points])
    n = np.array([len(p.losses) for p in points])
    vals: dict[str, list[float]] = {k: [] for k in ("E", "A", "alpha", "B", "beta")}
    for _ in range(N_BOOT_ND):
        g = df / rng.chisquare(df)
        means = centre + rng.standard_normal(len(points)) * np.sqrt(g * var / n)
        try:
            f = fit_chinchilla([p.params for p in points], [p.tokens for p in points], means)
        except ValueError:
            continue
        for k in vals:
            vals[k].append(getattr(f, k))
    return {k: tuple(float(x) for x in np.quantile(v, [0.025, 0.975])) for k, v in vals.items() if v}


def _num(x: Optional[float], digits: int = 4) -> str:
    if x is None:
        return "-"
    if not math.isfinite(x):
        return "inf"
    return f"{x:.{digits}g}" if abs(x) >= 1e4 or (abs(x) < 1e-3 and x != 0) else f"{x:.{digits}f}"


def _with_ci(v: tuple[float, Optional[float], Optional[float]], digits: int = 4) -> str:
    value, lo, hi = v
    return _num(value, digits) + (f" [{_num(lo, digits)}, {_num(hi, digits)}]" if lo is not None else "")


def _trend(
    gap: tuple[float, Optional[float], Optional[float]],
    change: tuple[float, Optional[float], Optional[float]],
    degenerate: Sequence[str] = (),
) -> str:
    """The reading of a design's gap: grows / shrinks with compute only when the change's interval excludes zero and
    neither fit is degenerate."""
    g, (c, lo, hi) = gap[0], change
    if degenerate:
        return f"not concluded: the fit of {' and '.join(degenerate)} is degenerate (flagged above)"
    if lo is None:
        return "no interval (one seed)"
    if lo <= 0 <= hi:
        return "no resolved change with compute (the interval holds 0)"
    return "the gap grows with compute" if (c < 0) == (g < 0) else "the gap shrinks with compute"


def report_lines(ladder: Ladder) -> list[str]:
    """The ladder section of a comparison report (Markdown lines)."""
    return [
        *_fit_lines(ladder),
        *_flag_lines(ladder),
        *_chinchilla_lines(ladder),
        *_point_lines(ladder),
        *_multiplier_lines(ladder),
        *_holdout_lines(ladder),
        "",
        "![loss against compute with the fits](ladder.png)",
    ]


def _coverage_note(seeds: int) -> str:
    """What the intervals' coverage was measured at, for this many seeds per size."""
    near = min(MEASURED_COVERAGE, key=lambda k: (abs(k - seeds), -k))
    lo, hi = MEASURED_COVERAGE[near]
    text = f"on synthetic ladders with {near} seeds per size they held the true value {lo:.1%}-{hi:.1%} of the time"
    if seeds < min(MEASURED_COVERAGE):
        return text + f"; {seeds} seeds were not measured"
    if lo < 0.93:
        return text + ", below the 93% they are meant to keep: read them as approximate"
    return text


def _fit_lines(ladder: Ladder) -> list[str]:
    """The section's heading, what the fit is and how sure, and the table of L(C) = E + A C^-alpha per design."""
    ci_note = (
        f"95% intervals from a parametric bootstrap of the seed noise ({ladder.n_boot} resamples; the noise pooled "
        f"over the sizes ({ladder.seeds} or more seeds each, {ladder.df} degrees of freedom)"
        + (", paired across designs" if ladder.paired and len(ladder.fits) > 1 else "")
        + ", its scale resampled too, the small-sample correction); "
        + _coverage_note(ladder.seeds)
        if ladder.df >= 1
        else "one seed per size: no intervals"
    )
    lines = [
        "## Ladder",
        "",
        f"Validation loss against training compute C (FLOPs per token from modkit cost x tokens trained), fitted per "
        f"design as L(C) = E + A C^-alpha on the sizes below (not the held-out one); {ci_note}.",
        "",
        "| design | sizes fitted | E | A | alpha | flagged |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for f in ladder.fits:
        iv = f.intervals or {}
        cells = [_with_ci((getattr(f.law, k), *(iv.get(k) or (None, None)))) for k in ("E", "A", "alpha")]
        flag = f"**degenerate** ({len(f.flags)})" if f.flags else ""
        lines.append(f"| {f.design} | {len(f.points)} | " + " | ".join(cells) + f" | {flag} |")
    return lines


def _flag_lines(ladder: Ladder) -> list[str]:
    """The degenerate fits, each with what it cannot conclude (none: no lines)."""
    flagged = [f for f in ladder.fits if f.flags]
    if not flagged:
        return []
    lines = ["", "**Degenerate fits** (their numbers above are not results):", ""]
    for f in flagged:
        lines += [f"- {f.design}: {flag}." for flag in f.flags]
    lines += [
        "",
        "What this ladder cannot conclude: "
        + ", ".join(f.design for f in flagged)
        + "'s extrapolation (the held-out prediction), "
        + ("and every comparison with it (multipliers, gaps and their trend); " if len(ladder.fits) > 1 else "")
        + "fit more sizes over a wider compute range, or more seeds, before reading them.",
    ]
    return lines


def _chinchilla_lines(ladder: Ladder) -> list[str]:
    """The table of L(N, D) = E + A N^-alpha + B D^-beta per design that has one (none: no lines)."""
    nd = [f for f in ladder.fits if f.chinchilla is not None]
    if not nd:
        return []
    lines = [
        "",
        "The ladder varies parameters N and tokens D independently, so also L(N, D) = E + A N^-alpha + B D^-beta:",
        "",
        "| design | E | A | alpha | B | beta |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for f in nd:
        iv = f.chinchilla_intervals or {}
        lines.append(
            f"| {f.design} | "
            + " | ".join(
                _with_ci((getattr(f.chinchilla, k), *(iv.get(k) or (None, None))))
                for k in ("E", "A", "alpha", "B", "beta")
            )
            + " |"
        )
    return lines


def _point_lines(ladder: Ladder) -> list[str]:
    """The table of every size of every design (the held-out one last): parameters, tokens, compute, loss, fit."""
    lines = [
        "",
        "| design | size | parameters | tokens | C (FLOPs) | validation loss (mean) | fit |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for f in ladder.fits:
        for p in f.points + ([f.holdout] if f.holdout else []):
            lines.append(
                f"| {f.design} | {p.spec}{' (held out)' if p.holdout else ''} | {p.params:,} | {p.tokens:,} | "
                f"{p.flops:.3g} | {p.mean:.4f} | {float(f.law(p.flops)):.4f} |"
            )
    return lines


def _multiplier_lines(ladder: Ladder) -> list[str]:
    """The table of every design against the first: compute multipliers and loss gaps (none: no lines)."""
    if not ladder.multipliers:
        return []
    base = ladder.fits[0]
    lines = [
        "",
        f"Against {base.design}: the compute multiplier (how many times {base.design}'s compute reaches the design's "
        "loss; above 1 the design is ahead) and the gap L_design - L_base of the fits, at the smallest and largest "
        f"fitted compute (C_min = {ladder.c_min:.3g}, C_max = {ladder.c_max:.3g} FLOPs) and extrapolated tenfold. "
        "The gap grows or shrinks with compute only where its change's interval excludes 0.",
        "",
        "| design | multiplier at C_max | multiplier at 10 C_max | gap at C_min | gap at C_max | gap at 10 C_max | "
        "change C_min -> C_max | reading |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for f in ladder.fits[1:]:
        d = f.design
        m, g = ladder.multipliers[d], ladder.gaps[d]
        degenerate = [x.design for x in (base, f) if x.flags]
        lines.append(
            f"| {d} | {_with_ci(m['C_max'], 3)} | {_with_ci(m['10 C_max'], 3)} | {_with_ci(g['C_min'])} | "
            f"{_with_ci(g['C_max'])} | {_with_ci(g['10 C_max'])} | {_with_ci(g['change'])} | "
            f"{_trend(g['C_max'], g['change'], degenerate)} |"
        )
    return lines


def _held_reading(f: DesignFit) -> str:
    """The held-out verdict in words."""
    d, lo, hi = f.verdict
    if f.flags:
        return "not concluded: the fit is degenerate (flagged above)"
    if lo is None:
        return "no interval (one seed)"
    if lo <= 0 <= hi:
        return "consistent with the fit (the interval holds 0)"
    return f"the measured loss is {'above' if d > 0 else 'below'} the prediction: the fit does not extrapolate here"


def _holdout_lines(ladder: Ladder) -> list[str]:
    """The held-out check: each design's prediction for its held-out size against the measurement (none: no lines)."""
    held = [f for f in ladder.fits if f.holdout is not None]
    if not held:
        return []
    lines = [
        "",
        "Held-out check: a larger size each design trained, which its fit did not see. Measured - predicted has a "
        "95% interval from the same bootstrap, the measurement's own seed noise included; it holds 0 when the size "
        "is where the fit and the noise put it.",
        "",
        "| design | held-out size | C (FLOPs) | predicted loss | measured loss | measured - predicted | verdict |",
        "|---|---|---:|---:|---:|---:|---|",
    ]
    for f in held:
        pred = (f.predicted, *(f.predicted_ci or (None, None)))
        d, lo, hi = f.verdict
        diff = f"{d:+.4f}" + (f" [{lo:+.4f}, {hi:+.4f}]" if lo is not None else "")
        lines.append(
            f"| {f.design} | {f.holdout.spec} | {f.holdout.flops:.3g} | {_with_ci(pred)} | "
            f"{_with_ci(f.measured)} | {diff} | {_held_reading(f)} |"
        )
    return lines


def plot_ladder(ladder: Ladder, out: Path) -> Path:
    """Loss against compute (log x): each seed, the means, the fits to ten times the largest fitted compute, and the
    held-out size (a star) with its prediction (an open circle)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.4), dpi=110)
    grid = np.exp(np.linspace(math.log(ladder.c_min / 1.5), math.log(10 * ladder.c_max), 100))
    for i, f in enumerate(ladder.fits):
        colour = f"C{i % 10}"
        for p in f.points:
            ax.plot([p.flops] * len(p.losses), p.losses, ".", color=colour, alpha=0.4, ms=4)
        ax.plot([p.flops for p in f.points], [p.mean for p in f.points], "o", color=colour, ms=5)
        ax.plot(
            grid,
            f.law(grid),
            "-",
            color=colour,
            lw=1.2,
            label=f"{f.design}: {f.law.E:.3f} + {f.law.A:.3g} C^-{f.law.alpha:.3f}",
        )
        if f.holdout is not None:
            ax.plot(
                [f.holdout.flops], [f.holdout.mean], "*", color=colour, ms=11, label=f"{f.design} held out (measured)"
            )
            ax.plot([f.holdout.flops], [f.predicted], "o", mfc="none", mec=colour, ms=9)
    ax.axvline(ladder.c_max, color="k", lw=0.6, ls=":")
    ax.set_xscale("log")
    ax.set_xlabel("training compute C (FLOPs)")
    ax.set_ylabel("validation loss (nats / token)")
    ax.set_title("loss against compute, fitted L(C) = E + A C^-alpha")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)
    return out

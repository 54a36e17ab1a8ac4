"""Scaling ladders: each design's validation loss against training compute, fitted, compared and checked on a size
the fit did not see (``modkit compare --ladder``).

Per design (a spec label of :func:`modkit.experiments.compare.compare`), the fitted points are its sizes' ``(C, mean loss over
seeds)`` with ``C`` = training FLOPs (FLOPs per token from the components' declarations, :mod:`modkit.analysis.cost`, times the
tokens trained). The fit is ``L(C) = E + A · C^(-alpha)`` (:func:`modkit.experiments.stats.fit_power_law`; Hoffmann et al. 2022,
Chinchilla, arXiv:2203.15556; OLMo's ladders, arXiv:2412.04403, predict large runs from small ones the same way); with
sizes at two or more token budgets per parameter it is also ``L(N, D) = E + A N^-alpha + B D^-beta``
(:func:`modkit.experiments.stats.fit_chinchilla`). Intervals are bootstrap percentiles over seeds: the seeds of every size are
resampled with replacement (one resample for every design at once), and every quantity is recomputed.

Against the first design (the baseline), at the largest fitted compute ``C_max`` and extrapolated tenfold:

* the **compute multiplier** of a design: how many times the baseline's compute reaches the design's loss,
  ``C_base(L_design(C)) / C`` (above 1: the design is worth that much more compute; ``inf`` when the design's loss
  is below the baseline's fitted floor ``E``);
* the **gap** ``L_design(C) - L_base(C)`` at the smallest fitted compute, at ``C_max`` and at ``10 C_max``, and its
  change from the smallest to the largest: whether the difference grows or shrinks with compute (called only when
  the change's interval excludes zero).

The **held-out check**: a larger size each design trained but the fit did not see; the fit's prediction at its
compute (with its interval) against the measured mean loss (with its t interval over seeds).

With few seeds the bootstrap intervals are narrower than their nominal 95%: a resample of 3 values has only 10
distinct means and no tails (the t quantile of 2 degrees of freedom is 4.30 where the normal one is 1.96). Read them
as the spread the seeds show, not as calibrated intervals; the verdicts of :mod:`modkit.experiments.stats` (t intervals) are.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np

from modkit.experiments.stats import Chinchilla, PowerLaw, fit_chinchilla, fit_power_law, mean_interval

#: bootstrap resamples of the power-law fits (and of the L(N, D) fit, which costs more)
N_BOOT, N_BOOT_ND = 300, 100


@dataclass
class Point:
    """One size of a design: ``params``, ``tokens`` trained, ``flops`` (training FLOPs), per-seed validation losses."""

    spec: str
    params: int
    tokens: int
    flops: float
    losses: list[float]
    holdout: bool = False

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


@dataclass
class Ladder:
    """Every design's fit, and each design against the first (see the module docstring).

    ``multipliers[design]`` and ``gaps[design]``: ``{where: (value, low, high)}`` with ``where`` in ``"C_min"``
    (gaps only), ``"C_max"``, ``"10 C_max"``, and ``gaps[design]["change"]``: ``gap(C_max) - gap(C_min)``.
    """

    fits: list[DesignFit]
    c_min: float
    c_max: float
    multipliers: dict[str, dict[str, tuple[float, Optional[float], Optional[float]]]] = field(default_factory=dict)
    gaps: dict[str, dict[str, tuple[float, Optional[float], Optional[float]]]] = field(default_factory=dict)
    n_boot: int = N_BOOT
    seeds: int = 1

    def to_json(self) -> dict:
        """A JSON-able summary."""
        return {
            "c_min": self.c_min,
            "c_max": self.c_max,
            "n_boot": self.n_boot,
            "seeds": self.seeds,
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
            Point(r.spec, r.params, r.tokens, r.flops, [x.val_loss for x in r.runs], r.holdout)
        )
    return {d: sorted(ps, key=lambda p: p.flops) for d, ps in out.items()}


def _multiplier(base: PowerLaw, law: PowerLaw, c: float) -> float:
    return base.compute_for(float(law(c))) / c


def _both_vary(points: Sequence[Point]) -> bool:
    return (
        len({p.params for p in points}) >= 2
        and len({round(p.tokens / p.params, 6) for p in points}) >= 2
        and len(points) >= 5
    )


def fit_ladder(rows: Sequence[Any], *, n_boot: int = N_BOOT, seed: int = 0) -> Ladder:
    """Fit every design's ladder from comparison rows and compare each with the first (see the module docstring).

    Raises:
        ValueError: a design with fewer than three fitted sizes, or rows without FLOPs.
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
    wheres = {"C_min": c_min, "C_max": c_max, "10 C_max": 10 * c_max}
    base = designs[0]

    def statistics_of(ls: dict[str, PowerLaw]) -> dict[str, float]:
        out: dict[str, float] = {}
        for d in designs:
            for k in ("E", "A", "alpha"):
                out[f"{d}|{k}"] = getattr(ls[d], k)
            if held[d] is not None:
                out[f"{d}|pred"] = float(ls[d](held[d].flops))
            if d != base:
                for w in ("C_max", "10 C_max"):
                    out[f"{d}|mult|{w}"] = _multiplier(ls[base], ls[d], wheres[w])
                for w, c in wheres.items():
                    out[f"{d}|gap|{w}"] = float(ls[d](c) - ls[base](c))
                out[f"{d}|gap|change"] = out[f"{d}|gap|C_max"] - out[f"{d}|gap|C_min"]
        return out

    point = statistics_of(laws)
    boots: dict[str, list[float]] = {k: [] for k in point}
    if seeds >= 2:
        rng = np.random.default_rng(seed)
        for _ in range(n_boot):
            try:
                ls = {}
                for d, ps in fitted.items():
                    means = [
                        float(np.asarray(p.losses)[rng.integers(0, len(p.losses), len(p.losses))].mean()) for p in ps
                    ]
                    ls[d] = fit_power_law([p.flops for p in ps], means)
            except ValueError:
                continue
            for k, v in statistics_of(ls).items():
                boots[k].append(v)

    def ci(key: str) -> tuple[Optional[float], Optional[float]]:
        vals = [v for v in boots.get(key, []) if math.isfinite(v)]
        if len(vals) < max(10, n_boot // 4):
            return None, None
        lo, hi = np.quantile(vals, [0.025, 0.975])
        return float(lo), float(hi)

    fits = []
    for d in designs:
        f = DesignFit(d, fitted[d], held[d], laws[d])
        if seeds >= 2:
            f.intervals = {k: ci(f"{d}|{k}") for k in ("E", "A", "alpha")}
        if held[d] is not None:
            f.predicted = point[f"{d}|pred"]
            lo, hi = ci(f"{d}|pred")
            f.predicted_ci = (lo, hi) if lo is not None else None
            f.measured = mean_interval(held[d].losses)
        if _both_vary(fitted[d]):
            ps = fitted[d]
            f.chinchilla = fit_chinchilla([p.params for p in ps], [p.tokens for p in ps], [p.mean for p in ps])
            if seeds >= 2:
                f.chinchilla_intervals = _chinchilla_intervals(ps, seed)
        fits.append(f)
    lad = Ladder(fits, c_min, c_max, n_boot=n_boot, seeds=seeds)
    for d in designs[1:]:
        lad.multipliers[d] = {w: (point[f"{d}|mult|{w}"], *ci(f"{d}|mult|{w}")) for w in ("C_max", "10 C_max")}
        lad.gaps[d] = {w: (point[f"{d}|gap|{w}"], *ci(f"{d}|gap|{w}")) for w in (*wheres, "change")}
    return lad


def _chinchilla_intervals(points: Sequence[Point], seed: int) -> dict[str, tuple[float, float]]:
    rng = np.random.default_rng(seed + 1)
    vals: dict[str, list[float]] = {k: [] for k in ("E", "A", "alpha", "B", "beta")}
    for _ in range(N_BOOT_ND):
        means = [float(np.asarray(p.losses)[rng.integers(0, len(p.losses), len(p.losses))].mean()) for p in points]
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
    gap: tuple[float, Optional[float], Optional[float]], change: tuple[float, Optional[float], Optional[float]]
) -> str:
    g, (c, lo, hi) = gap[0], change
    if lo is None:
        return "no interval (one seed)"
    if lo <= 0 <= hi:
        return "no resolved change (the interval holds 0)"
    return "the gap grows with compute" if (c < 0) == (g < 0) else "the gap shrinks with compute"


def report_lines(ladder: Ladder) -> list[str]:
    """The ladder section of a comparison report (Markdown lines)."""
    return [
        *_fit_lines(ladder),
        *_chinchilla_lines(ladder),
        *_point_lines(ladder),
        *_multiplier_lines(ladder),
        *_holdout_lines(ladder),
        "",
        "![loss against compute with the fits](ladder.png)",
    ]


def _fit_lines(ladder: Ladder) -> list[str]:
    """The section's heading, what the fit is and how sure, and the table of L(C) = E + A C^-alpha per design."""
    ci_note = (
        f"95% bootstrap intervals over seeds ({ladder.n_boot} resamples of the {ladder.seeds} seeds of every size"
        + (
            "; with this few seeds they are narrower than a calibrated 95%: the spread the seeds show"
            if ladder.seeds < 5
            else ""
        )
        + ")"
        if ladder.seeds >= 2
        else "one seed per size: no intervals"
    )
    lines = [
        "## Ladder",
        "",
        f"Validation loss against training compute C (FLOPs per token from modkit cost x tokens trained), fitted per "
        f"design as L(C) = E + A C^-alpha on the sizes below (not the held-out one); {ci_note}.",
        "",
        "| design | sizes fitted | E | A | alpha |",
        "|---|---:|---:|---:|---:|",
    ]
    for f in ladder.fits:
        iv = f.intervals or {}
        cells = [_with_ci((getattr(f.law, k), *(iv.get(k) or (None, None)))) for k in ("E", "A", "alpha")]
        lines.append(f"| {f.design} | {len(f.points)} | " + " | ".join(cells) + " |")
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
    base = ladder.fits[0].design
    lines = [
        "",
        f"Against {base}: the compute multiplier (how many times {base}'s compute reaches the design's loss; "
        "above 1 the design is ahead) and the gap L_design - L_base of the fits, at the smallest and largest "
        f"fitted compute (C_min = {ladder.c_min:.3g}, C_max = {ladder.c_max:.3g} FLOPs) and extrapolated tenfold.",
        "",
        "| design | multiplier at C_max | multiplier at 10 C_max | gap at C_min | gap at C_max | gap at 10 C_max | "
        "change C_min -> C_max | reading |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for d, m in ladder.multipliers.items():
        g = ladder.gaps[d]
        lines.append(
            f"| {d} | {_with_ci(m['C_max'], 3)} | {_with_ci(m['10 C_max'], 3)} | {_with_ci(g['C_min'])} | "
            f"{_with_ci(g['C_max'])} | {_with_ci(g['10 C_max'])} | {_with_ci(g['change'])} | "
            f"{_trend(g['C_max'], g['change'])} |"
        )
    return lines


def _holdout_lines(ladder: Ladder) -> list[str]:
    """The held-out check: each design's prediction for its held-out size against the measurement (none: no lines)."""
    held = [f for f in ladder.fits if f.holdout is not None]
    if not held:
        return []
    lines = [
        "",
        "Held-out check: a larger size each design trained, which its fit did not see.",
        "",
        "| design | held-out size | C (FLOPs) | predicted loss | measured loss | measured - predicted |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for f in held:
        m, lo, hi = f.measured
        pred = (f.predicted, *(f.predicted_ci or (None, None)))
        lines.append(
            f"| {f.design} | {f.holdout.spec} | {f.holdout.flops:.3g} | {_with_ci(pred)} | "
            f"{_with_ci((m, lo, hi))} | {m - f.predicted:+.4f} |"
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

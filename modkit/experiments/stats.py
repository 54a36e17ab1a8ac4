"""The statistics of comparisons: differences of means with confidence intervals, bootstrap, power-law fits and the
instability reading of a training curve. numpy only (no scipy in the base install).

* :func:`mean_difference`: the difference of two designs' mean losses over seeds with a ``level`` (95%) interval:
  paired Student t when both ran the same seeds (seed ``i`` of every spec reads the same batches in the same order,
  so the seed's share of the noise cancels in the difference), Welch's t otherwise (Welch 1947, Biometrika 34). A
  difference is *resolved* only when its interval excludes zero.
* :func:`t_quantile`: Student's t quantiles from the regularized incomplete beta function (continued fraction,
  Press et al., Numerical Recipes, 3rd ed., §6.4) and bisection.
* :func:`fit_power_law`: ``L(C) = E + A · C^(-alpha)`` by variable projection: for a fixed ``alpha`` the model is
  linear in ``(E, A)`` and solved exactly by non-negative least squares over the (at most four) active sets; ``alpha``
  by a grid and golden-section search on the remaining one-dimensional sum of squares (the Chinchilla form, Hoffmann et
  al. 2022, arXiv:2203.15556, approach 3, fitted in squared error rather than their Huber loss on logs);
  :func:`fit_power_laws` fits many loss vectors at once, vectorised (the ladder's bootstrap refits thousands).
  :func:`fit_chinchilla`: ``L(N, D) = E + A · N^(-alpha) + B · D^(-beta)`` the same way over ``(alpha, beta)``.
* :func:`bootstrap_seeds`: resample the seeds of every size with replacement (Efron & Tibshirani 1993, *An
  Introduction to the Bootstrap*, percentile intervals). With 2-5 seeds its intervals are too narrow (on synthetic
  ladders they covered 67-90% at nominal 95%); the ladder uses :mod:`modkit.experiments.ladder_intervals`.
* :func:`instability`: the fraction of logged steps whose smoothed loss sits above its running minimum by a margin
  (stalls and loss spikes, which the "last above first" divergence rule misses) and the gradient-norm spikes.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import numpy as np

# ----------------------------------------------------------------------------------------------------- Student t


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta function (modified Lentz; Numerical Recipes §6.4)."""
    tiny, eps = 1e-300, 1e-15
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 400):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < eps:
            break
    return h


def betainc(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function ``I_x(a, b)`` for ``a, b > 0``, ``0 <= x <= 1``."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    """``P(T <= t)`` for Student's t with ``df > 0`` degrees of freedom."""
    tail = 0.5 * betainc(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t > 0 else tail


def t_pdf(t: float, df: float) -> float:
    """The density of Student's t with ``df`` degrees of freedom at ``t``."""
    return math.exp(
        math.lgamma((df + 1) / 2)
        - math.lgamma(df / 2)
        - 0.5 * math.log(df * math.pi)
        - (df + 1) / 2 * math.log1p(t * t / df)
    )


@functools.lru_cache(maxsize=4096)
def t_quantile(p: float, df: float) -> float:
    """The ``p`` quantile of Student's t with ``df`` degrees of freedom (``t_quantile(0.975, 2) = 4.3027``): Newton's
    method on :func:`t_cdf`, kept inside a bisection bracket.

    Raises:
        ValueError: ``p`` outside ``(0, 1)`` or ``df <= 0``.
    """
    if not 0.0 < p < 1.0 or not df > 0:
        raise ValueError(f"t_quantile needs 0 < p < 1 and df > 0, got p = {p}, df = {df}")
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    if p == 0.5:
        return 0.0
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < p:
        lo, hi = hi, hi * 2.0
    x = 0.5 * (lo + hi)
    for _ in range(100):
        f = t_cdf(x, df) - p
        if f < 0:
            lo = x
        else:
            hi = x
        step = f / max(t_pdf(x, df), 1e-300)
        nxt = x - step
        if not lo < nxt < hi:
            nxt = 0.5 * (lo + hi)
        if abs(nxt - x) < 1e-13 * max(1.0, abs(x)):
            return nxt
        x = nxt
    return x


# ----------------------------------------------------------------------------------------------------- differences


@dataclass(frozen=True)
class Difference:
    """``mean(a) - mean(b)`` with its confidence interval.

    Attributes:
        diff: the difference of means. low, high: the interval (``None`` with fewer than two seeds on a side).
        level: the confidence level (0.95). method: ``"paired t"``, ``"Welch t"`` or ``"one seed"``. df: degrees of
        freedom. n_a, n_b: seeds on each side.
    """

    diff: float
    low: Optional[float]
    high: Optional[float]
    level: float
    method: str
    df: Optional[float]
    n_a: int
    n_b: int

    @property
    def resolved(self) -> bool:
        """True only when the interval exists and excludes zero."""
        return self.low is not None and (self.low > 0 or self.high < 0)

    def text(self, a: str = "A", b: str = "B", digits: int = 4) -> str:
        """``"a - b = -0.0898 [-0.1213, -0.0583] (95% CI, paired t over 3 seeds): resolved, a lower"``."""
        f = f"{{:+.{digits}f}}"
        if self.low is None:
            return f"{a} - {b} = {f.format(self.diff)} (one seed: no interval): not resolved"
        n = f"{self.n_a} seeds" if self.n_a == self.n_b else f"{self.n_a} and {self.n_b} seeds"
        verdict = (
            f"resolved, {a if self.diff < 0 else b} lower" if self.resolved else "not resolved (the interval holds 0)"
        )
        return (
            f"{a} - {b} = {f.format(self.diff)} [{f.format(self.low)}, {f.format(self.high)}] "
            f"({self.level:.0%} CI, {self.method} over {n}): {verdict}"
        )


def mean_difference(a: Sequence[float], b: Sequence[float], *, paired: bool = False, level: float = 0.95) -> Difference:
    """``mean(a) - mean(b)`` with a ``level`` confidence interval.

    Args:
        a, b: the per-seed values of two designs (finite). paired: ``a[i]`` and ``b[i]`` share seed ``i`` (same
            length): the interval is the paired t interval of ``a[i] - b[i]``; otherwise Welch's.
        level: confidence level in ``(0, 1)``.

    Returns:
        :class:`Difference` (no interval when a side has one value, or paired with one pair; when every difference
            is equal the paired interval has width 0).

    Raises:
        ValueError: empty inputs, non-finite values, ``paired`` with unequal lengths, ``level`` outside ``(0, 1)``.
    """
    x, y = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if len(x) == 0 or len(y) == 0:
        raise ValueError("mean_difference needs at least one value on each side")
    if not (np.isfinite(x).all() and np.isfinite(y).all()):
        raise ValueError("mean_difference needs finite values (a diverged run has no loss to compare)")
    if not 0 < level < 1:
        raise ValueError(f"level = {level}: give a confidence level in (0, 1)")
    diff = float(x.mean() - y.mean())
    q = 0.5 + level / 2.0
    if paired:
        if len(x) != len(y):
            raise ValueError(f"paired differences need as many values on each side, got {len(x)} and {len(y)}")
        if len(x) < 2:
            return Difference(diff, None, None, level, "one seed", None, 1, 1)
        d = x - y
        se = float(d.std(ddof=1) / math.sqrt(len(d)))
        df = len(d) - 1.0
        half = t_quantile(q, df) * se
        return Difference(diff, diff - half, diff + half, level, "paired t", df, len(x), len(y))
    if len(x) < 2 or len(y) < 2:
        return Difference(diff, None, None, level, "one seed", None, len(x), len(y))
    va, vb = float(x.var(ddof=1)) / len(x), float(y.var(ddof=1)) / len(y)
    se = math.sqrt(va + vb)
    if se == 0.0:
        return Difference(diff, diff, diff, level, "Welch t", float("inf"), len(x), len(y))
    df = (va + vb) ** 2 / ((va * va / (len(x) - 1) if va else 0.0) + (vb * vb / (len(y) - 1) if vb else 0.0))
    half = t_quantile(q, df) * se
    return Difference(diff, diff - half, diff + half, level, "Welch t", df, len(x), len(y))


def mean_interval(values: Sequence[float], level: float = 0.95) -> tuple[float, Optional[float], Optional[float]]:
    """``(mean, low, high)``: the t interval of a mean (no interval for one value)."""
    x = np.asarray(values, dtype=np.float64)
    m = float(x.mean())
    if len(x) < 2:
        return m, None, None
    half = t_quantile(0.5 + level / 2.0, len(x) - 1.0) * float(x.std(ddof=1)) / math.sqrt(len(x))
    return m, m - half, m + half


# ----------------------------------------------------------------------------------------------------- fits


def _nnls(X: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, float]:
    """Non-negative least squares of a few columns, exactly: the best of every active set (``2^k`` solves)."""
    k = X.shape[1]
    best, best_sse = np.zeros(k), float(((y) ** 2).sum())
    for mask in range(1, 1 << k):
        cols = [j for j in range(k) if mask >> j & 1]
        coef, *_ = np.linalg.lstsq(X[:, cols], y, rcond=None)
        if (coef < 0).any():
            continue
        full = np.zeros(k)
        full[cols] = coef
        sse = float(((X @ full - y) ** 2).sum())
        if sse < best_sse:
            best, best_sse = full, sse
    return best, best_sse


def _golden(f: Callable[[float], float], lo: float, hi: float, iters: int = 80) -> float:
    g = (math.sqrt(5) - 1) / 2
    a, b = lo, hi
    c, d = b - g * (b - a), a + g * (b - a)
    fc, fd = f(c), f(d)
    for _ in range(iters):
        if fc < fd:
            b, d, fd = d, c, fc
            c = b - g * (b - a)
            fc = f(c)
        else:
            a, c, fc = c, d, fd
            d = a + g * (b - a)
            fd = f(d)
    return (a + b) / 2


@dataclass(frozen=True)
class PowerLaw:
    """``L(C) = E + A · C^(-alpha)`` (``C`` in FLOPs, ``L`` in nats per token); ``sse``: the sum of squared residuals."""

    E: float
    A: float
    alpha: float
    sse: float = 0.0

    def __call__(self, c):
        """The fitted loss at compute ``c`` (a number or an array)."""
        return self.E + self.A * np.power(np.asarray(c, dtype=np.float64), -self.alpha)

    def compute_for(self, loss: float) -> float:
        """The compute at which the fit reaches ``loss``: ``(A / (loss - E))^(1/alpha)``; ``inf`` at or below ``E``."""
        if loss <= self.E or self.A <= 0:
            return math.inf
        return (self.A / (loss - self.E)) ** (1.0 / self.alpha)


#: the range of exponents the fits search (losses of language models fall with alpha of about 0.05-0.5)
ALPHA_RANGE = (0.005, 3.0)


def _nnls_rows(z: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(E, A, sse)`` of ``y ≈ E + A z`` with ``E, A >= 0`` in closed form, for every pair of rows at once.

    ``z`` ``[..., k]`` and ``y`` ``[..., k]`` broadcast against each other (a row of ``y`` against a grid of ``z``, or a
    row of each): the unconstrained solution where it is feasible, else the better of ``A = 0`` (``E`` the mean) and
    ``E = 0`` (``A`` by least squares through the origin).
    """
    zm, ym = z.mean(-1), y.mean(-1)
    zc, yc = z - zm[..., None], y - ym[..., None]
    var, cov, syy = (zc * zc).sum(-1), (zc * yc).sum(-1), (yc * yc).sum(-1)
    A = np.where(var > 0, cov / np.where(var > 0, var, 1.0), 0.0)
    E = ym - A * zm
    feasible = (A >= 0) & (E >= 0)
    sse_full = np.maximum(syy - A * cov, 0.0)
    zz, zy = (z * z).sum(-1), (z * y).sum(-1)
    a_only = np.maximum(zy / np.maximum(zz, 1e-300), 0.0)
    sse_a = np.maximum((y * y).sum(-1) - 2 * a_only * zy + a_only * a_only * zz, 0.0)
    e_only = np.maximum(ym, 0.0)
    sse_e = syy + np.where(ym < 0, ym * ym * y.shape[-1], 0.0)
    use_e = sse_e <= sse_a
    E_c, A_c = np.where(use_e, e_only, 0.0), np.where(use_e, 0.0, a_only)
    return (
        np.where(feasible, E, E_c),
        np.where(feasible, A, A_c),
        np.where(feasible, sse_full, np.minimum(sse_e, sse_a)),
    )


#: rows of :func:`fit_power_laws` fitted at once (bounds the grid's memory to about 40 MB)
_FIT_CHUNK = 8192


def fit_power_laws(
    c: Sequence[float],
    losses: np.ndarray,
    alpha_range: tuple[float, float] = ALPHA_RANGE,
    *,
    grid: int = 80,
    iters: int = 45,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """:func:`fit_power_law` of many loss vectors at the same computes at once (the ladder's bootstrap refits
    thousands): ``alpha`` on a log grid of ``grid`` points, refined by ``iters`` golden-section steps in ``log alpha``
    between the best grid point's neighbours, ``(E, A)`` by closed-form non-negative least squares at each ``alpha``.

    Args:
        c: ``[k]`` computes (FLOPs, > 0). losses: ``[m, k]`` losses (finite). alpha_range: the exponents searched.

    Returns:
        ``(E, A, alpha, sse)``, each ``[m]``.
    """
    x = np.asarray(c, dtype=np.float64)
    y = np.asarray(losses, dtype=np.float64).reshape(-1, len(x))
    x0 = float(x.min())
    logu = np.log(x / x0)
    alphas = np.exp(np.linspace(math.log(alpha_range[0]), math.log(alpha_range[1]), grid))
    z_grid = np.exp(-alphas[:, None] * logu[None])  # [grid, k]
    out = [np.empty(len(y)) for _ in range(4)]
    g = (math.sqrt(5) - 1) / 2
    for s in range(0, len(y), _FIT_CHUNK):
        yy = y[s : s + _FIT_CHUNK]

        def sse(log_alpha: np.ndarray) -> np.ndarray:
            return _nnls_rows(np.exp(-np.exp(log_alpha)[:, None] * logu[None]), yy)[2]

        i = _nnls_rows(z_grid[None], yy[:, None, :])[2].argmin(1)
        a, b = np.log(alphas[np.maximum(i - 1, 0)]), np.log(alphas[np.minimum(i + 1, grid - 1)])
        lc, ld = b - g * (b - a), a + g * (b - a)
        fc, fd = sse(lc), sse(ld)
        for _ in range(iters):
            left = fc < fd  # the minimum lies in [a, ld]
            a, b = np.where(left, a, lc), np.where(left, ld, b)
            lc, ld = np.where(left, b - g * (b - a), ld), np.where(left, lc, a + g * (b - a))
            new = sse(np.where(left, lc, ld))
            fc, fd = np.where(left, new, fd), np.where(left, fc, new)
        alpha = np.exp((a + b) / 2)
        E, A, s2 = _nnls_rows(np.exp(-alpha[:, None] * logu[None]), yy)
        for o, v in zip(out, (E, A * x0**alpha, alpha, s2)):
            o[s : s + len(yy)] = v
    return out[0], out[1], out[2], out[3]


def fit_power_law(
    c: Sequence[float], loss: Sequence[float], alpha_range: tuple[float, float] = ALPHA_RANGE
) -> PowerLaw:
    """Least-squares fit of ``L = E + A · C^(-alpha)`` with ``E, A >= 0`` (see the module docstring;
    :func:`fit_power_laws` of one row).

    Args:
        c: compute of each point (> 0); loss: the loss there. Three or more points at two or more computes.

    Raises:
        ValueError: fewer than three points, fewer than two distinct computes, a non-positive compute.
    """
    x, y = np.asarray(c, dtype=np.float64), np.asarray(loss, dtype=np.float64)
    if len(x) < 3 or len(set(x.tolist())) < 2:
        raise ValueError(f"a power-law fit needs three or more points at two or more computes, got {len(x)}")
    if (x <= 0).any() or not np.isfinite(y).all():
        raise ValueError("a power-law fit needs positive computes and finite losses")
    E, A, alpha, sse = (float(v[0]) for v in fit_power_laws(x, y[None], alpha_range))
    return PowerLaw(E, A, alpha, sse)


@dataclass(frozen=True)
class Chinchilla:
    """``L(N, D) = E + A · N^(-alpha) + B · D^(-beta)`` (``N`` parameters, ``D`` training tokens)."""

    E: float
    A: float
    alpha: float
    B: float
    beta: float
    sse: float = 0.0

    def __call__(self, n, d):
        """The fitted loss at ``n`` parameters and ``d`` tokens."""
        n, d = np.asarray(n, dtype=np.float64), np.asarray(d, dtype=np.float64)
        return self.E + self.A * n**-self.alpha + self.B * d**-self.beta


def fit_chinchilla(
    n: Sequence[float], d: Sequence[float], loss: Sequence[float], alpha_range: tuple[float, float] = ALPHA_RANGE
) -> Chinchilla:
    """Least-squares fit of ``L = E + A N^-alpha + B D^-beta`` with ``E, A, B >= 0``: ``(alpha, beta)`` on a grid,
    refined by alternating golden-section searches, the coefficients by exact non-negative least squares.

    Raises:
        ValueError: fewer than five points, or ``N`` or ``D`` with fewer than two distinct values.
    """
    N, D, y = (np.asarray(v, dtype=np.float64) for v in (n, d, loss))
    if len(y) < 5 or len(set(N.tolist())) < 2 or len(set(D.tolist())) < 2:
        raise ValueError("an L(N, D) fit needs five or more points with two or more sizes and token budgets")
    n0, d0 = float(N.min()), float(D.min())
    un, ud = N / n0, D / d0

    def solve(a: float, b: float) -> tuple[np.ndarray, float]:
        return _nnls(np.stack([np.ones_like(un), un**-a, ud**-b], axis=1), y)

    grid = np.exp(np.linspace(math.log(alpha_range[0]), math.log(alpha_range[1]), 24))
    best = min(((solve(a, b)[1], a, b) for a in grid for b in grid))
    _, a, b = best
    for _ in range(6):
        a = math.exp(_golden(lambda la: solve(math.exp(la), b)[1], math.log(a / 2), math.log(a * 2), 40))
        b = math.exp(_golden(lambda lb: solve(a, math.exp(lb))[1], math.log(b / 2), math.log(b * 2), 40))
    coef, sse = solve(a, b)
    return Chinchilla(float(coef[0]), float(coef[1] * n0**a), float(a), float(coef[2] * d0**b), float(b), sse)


def bootstrap_seeds(
    groups: Sequence[Sequence[float]],
    statistic: Callable[[list[float]], float],
    *,
    n: int = 1000,
    seed: int = 0,
    level: float = 0.95,
) -> tuple[float, float]:
    """Percentile interval of ``statistic(means)`` where ``means[k]`` is the mean of a resample (with replacement)
    of ``groups[k]`` (the seeds of size ``k``). Deterministic for a given ``seed``.

    Resamples on which ``statistic`` raises ``ValueError`` or returns a non-finite value are dropped.

    Returns:
        ``(low, high)`` (``nan`` when every resample failed).
    """
    rng = np.random.default_rng(seed)
    arrays = [np.asarray(g, dtype=np.float64) for g in groups]
    values = []
    for _ in range(n):
        means = [float(g[rng.integers(0, len(g), len(g))].mean()) for g in arrays]
        try:
            v = float(statistic(means))
        except ValueError:
            continue
        if math.isfinite(v):
            values.append(v)
    if not values:
        return math.nan, math.nan
    lo, hi = np.quantile(values, [(1 - level) / 2, 1 - (1 - level) / 2])
    return float(lo), float(hi)


# ----------------------------------------------------------------------------------------------------- instability


@dataclass(frozen=True)
class Instability:
    """The instability reading of one run's logged training steps.

    Attributes:
        above_min: fraction of logged steps (after the first ``skip``) whose smoothed loss exceeds the running minimum of
            the smoothed loss by more than ``threshold`` nats. spikes: logged steps whose gradient norm exceeds
            ``spike_factor`` times the median of the norms logged before it. max_grad_norm: the largest logged norm.
        steps: logged steps read. noise: the estimated standard deviation of one batch's loss, nats (0 when not
            estimated). threshold: ``margin`` plus the dip that batch noise alone gives the running minimum, nats.
        margin, spike_factor, window: the settings.
    """

    above_min: float
    spikes: int
    max_grad_norm: float
    steps: int
    margin: float
    spike_factor: float
    window: int
    noise: float = 0.0
    threshold: float = 0.0

    @property
    def unstable(self) -> bool:
        """More than 5% of the steps above the running minimum, or a gradient-norm spike (:func:`is_unstable`)."""
        return is_unstable(self.above_min, self.spikes)


def is_unstable(above_min: float, spikes: int) -> bool:
    """The rule a reading is judged by: ``above_min`` (a fraction of logged steps) over 5%, or any gradient-norm spike."""
    return above_min > 0.05 or spikes > 0


def batch_noise(losses: Sequence[float]) -> float:
    """Robust standard deviation of one logged batch's loss around the curve's trend, nats.

    ``1.4826 * median |y[i+1] - y[i]| / sqrt(2)``: the median absolute first difference, which a slowly varying trend
    barely moves and a spike or a stall (a few large differences) does not move at all, scaled to a normal's standard
    deviation (the median absolute deviation, Rousseeuw & Croux 1993; the difference of two independent draws has
    variance ``2 sigma^2``). Non-finite losses are skipped; fewer than 3 finite differences give 0.
    """
    d = np.diff(np.asarray(losses, dtype=np.float64))
    d = d[np.isfinite(d)]
    if len(d) < 3:
        return 0.0
    return float(1.4826 * np.median(np.abs(d)) / math.sqrt(2.0))


def instability(
    losses: Sequence[float],
    grad_norms: Sequence[float],
    *,
    margin: float = 0.1,
    spike_factor: float = 5.0,
    window: int = 5,
    skip: int = 10,
    noise: bool = True,
) -> Instability:
    """The instability reading (see :class:`Instability`) of a run's logged train losses and gradient norms.

    The loss is smoothed by a trailing mean over ``window`` logged steps (one batch's loss is noisy; a stall or a
    spike lasts); the gradient-norm median covers every earlier logged step after the first ``skip`` (the first steps'
    norms are large by nature). A non-finite loss counts as above the minimum.

    The running minimum of a noisy curve is its lowest dip, which sits lower the longer the run: about
    ``s sqrt(2 ln n)`` below the trend for ``n`` independent smoothed values of standard deviation ``s`` (the
    expected maximum of ``n`` normals). With ``noise`` (the default) a step counts as above the minimum only when it
    exceeds it by ``margin`` plus that dip, with ``s = batch_noise(losses) / sqrt(window)`` and ``n`` the counted steps
    over ``window``, so a healthy run of any length reads stable; ``noise=False`` keeps the bare ``margin``. The noise
    comes from the run's own step-to-step differences (:func:`batch_noise`), which persistent rises and spikes do
    not inflate.
    """
    y = np.asarray(losses, dtype=np.float64)
    g = np.asarray(grad_norms, dtype=np.float64)
    if len(y) == 0:
        return Instability(0.0, 0, math.nan, 0, margin, spike_factor, window, 0.0, margin)
    smooth = np.array([y[max(0, i - window + 1) : i + 1].mean() for i in range(len(y))])
    run_min = np.minimum.accumulate(np.where(np.isfinite(smooth), smooth, np.inf))
    counted = range(min(skip, len(y) - 1), len(y))
    sigma = batch_noise(y[counted.start :]) if noise else 0.0
    threshold = margin + sigma / math.sqrt(window) * math.sqrt(2.0 * math.log(max(2.0, len(counted) / window)))
    above = sum(1 for i in counted if not np.isfinite(smooth[i]) or smooth[i] > run_min[i] + threshold)
    spikes = 0
    for i in range(skip + 1, len(g)):
        base = np.median(g[skip:i])
        if np.isfinite(g[i]) and base > 0 and g[i] > spike_factor * base:
            spikes += 1
        elif not np.isfinite(g[i]):
            spikes += 1
    finite = g[np.isfinite(g)]
    return Instability(
        above / max(1, len(counted)),
        spikes,
        float(finite.max()) if len(finite) else math.nan,
        len(y),
        margin,
        spike_factor,
        window,
        sigma,
        threshold,
    )

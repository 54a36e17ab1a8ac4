"""Coverage of the ladder's 95% intervals on synthetic ladders: how often each interval holds the true value.

Ladders ``L = E + A C^-alpha`` (two designs, ``modkit.experiments.ladder_intervals.SYNTHETIC``: E 1.6 and 1.55, A 1e3,
alpha 0.25, a constant true gap), 4 sizes over 1e12-1e14 FLOPs, held-out at 1e15, seed noise sd 0.01, at 2, 3 and 5
seeds per size: the parametric bootstrap of :mod:`modkit.experiments.ladder_intervals` (what ``modkit compare
--ladder`` reports) against the reference measured in the same run, the seed resample it replaced (each size's seeds
resampled with replacement, percentile intervals). ``claim``: the share of ladders whose report would say "the gap
grows / shrinks with compute" although the true gap is constant.

    python benchmarks/ladder_coverage.py [--replicates 2000] [--boot 400] [--rho 0.0]

The test suite runs a smaller deterministic version (``tests/experiments/test_ladder_coverage.py``, 200 ladders,
looser bounds); this one is the measurement the closing numbers come from (2000 ladders: a rate's standard error
is about 0.5 percentage points).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from modkit.experiments.ladder_intervals import (
    SYNTHETIC,
    SYNTHETIC_C,
    SYNTHETIC_HELD,
    SYNTHETIC_SD,
    synthetic_coverage,
)
from modkit.experiments.stats import fit_power_laws


def seed_resample_coverage(seeds: int, replicates: int, n_boot: int, seed: int) -> dict[str, float]:
    """The reference: the coverage of the seed resample (percentile intervals) for design 0's E, A, alpha and
    held-out prediction."""
    rng = np.random.default_rng(seed)
    E0, A0, a0 = SYNTHETIC[0]
    c = SYNTHETIC_C
    y = E0 + A0 * c**-a0 + rng.normal(0, SYNTHETIC_SD, (replicates, seeds, len(c)))
    idx = rng.integers(0, seeds, (replicates, n_boot, seeds, len(c)))
    picked = np.take_along_axis(y[:, None], idx, axis=2)  # [R, B, seeds, k]
    E, A, alpha, _ = fit_power_laws(c, picked.mean(2).reshape(-1, len(c)))
    boots = {"E": E, "A": A, "alpha": alpha, "pred": E + A * SYNTHETIC_HELD**-alpha}
    true = {"E": E0, "A": A0, "alpha": a0, "pred": E0 + A0 * SYNTHETIC_HELD**-a0}
    out = {}
    for k, v in boots.items():
        lo, hi = np.quantile(v.reshape(replicates, n_boot), [0.025, 0.975], axis=1)
        out[k] = float(np.mean((lo <= true[k]) & (true[k] <= hi)))
    return out


def main() -> None:
    """Print the coverage per quantity and seed count, and the reference's."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    ap.add_argument("--replicates", type=int, default=2000)
    ap.add_argument("--boot", type=int, default=400)
    ap.add_argument("--rho", type=float, default=0.0, help="correlation of the two designs' seed noise")
    args = ap.parse_args()
    print(f"{args.replicates} synthetic ladders per seed count, {args.boot} resamples each, rho {args.rho}")
    for seeds in (2, 3, 5):
        start = time.perf_counter()
        cov = synthetic_coverage(seeds, args.replicates, n_boot=args.boot, seed=seeds, rho=args.rho)
        ref = seed_resample_coverage(seeds, min(args.replicates, 1000), args.boot, seed=100 + seeds)
        claim = cov.pop("claim")
        print(f"\n{seeds} seeds ({time.perf_counter() - start:.0f} s): quantity, parametric bootstrap, seed resample")
        for k, v in cov.items():
            print(f"  {k:14s} {v:6.1%}  " + (f"{ref[k]:6.1%}" if k in ref else "     -"))
        lo = min(cov.values())
        print(f"  lowest {lo:.1%} ({'>=' if lo >= 0.93 else 'BELOW'} 93%); false gap-trend claims {claim:.1%}")


if __name__ == "__main__":
    main()

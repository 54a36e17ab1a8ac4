"""The stall reading of ``modkit compare`` (:mod:`modkit.experiments.compare.stalls`): a run that plateaus above the
best run of its design (or above its own earlier minimum) is reported stalled with its step range, where the
running-minimum reading alone reads it as stable."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from modkit.experiments.compare import Comparison, RunSummary
from modkit.experiments.compare.report import _instability_lines
from modkit.experiments.compare.stalls import find_stall, longest_flat_stretch, mark_stalls, smoothed
from modkit.experiments.stats import instability

STEPS = np.arange(0, 201)


def _run(spec: str, lr: float, losses: np.ndarray, seed: int = 0) -> RunSummary:
    """A run of ``spec`` whose logged train losses are ``losses`` at steps 0..200, read as compare reads it."""
    reading = instability(list(losses), [1.0] * len(losses))
    return RunSummary(
        spec=spec,
        lr=lr,
        seed=seed,
        run_dir=Path(f"runs/{spec}-lr{lr:g}-seed{seed}"),
        train_loss=float(losses[-1]),
        val_loss=float(losses[-1]),
        initial_val_loss=float(losses[0]),
        tokens_per_s=1.0,
        diverged=False,
        curve=[],
        train_curve=[(int(s), float(v)) for s, v in zip(STEPS, losses)],
        above_min=reading.above_min,
        spikes=reading.spikes,
        above_threshold=reading.threshold,
    )


def _noise(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).normal(0.0, 0.03, len(STEPS))


def _healthy() -> np.ndarray:
    """lr 0.01: falls from 4.2 toward 2.30 all run long."""
    return 2.30 + 1.9 * np.exp(-STEPS / 40.0) + _noise(1)


def _plateau() -> np.ndarray:
    """lr 0.1: falls from 4.2 to 3.0 by step 30, then sits at 3.0 to step 200."""
    return np.where(STEPS < 30, 4.2 - 1.2 * STEPS / 30.0, 3.0) + _noise(2)


def test_a_plateau_above_the_best_rate_is_a_stall_with_its_step_range():
    """The case the running-minimum reading missed: at lr 0.1 a run sat at about 3.0 from step 30 to 200 while the
    best rate reached 2.30. It reads 0% of steps above its running minimum and 0 spikes; the stall reading gives
    steps 30-200, 0.7 nats above the design's best."""
    good, stuck = _run("d", 0.01, _healthy()), _run("d", 0.1, _plateau())
    assert stuck.above_min == 0.0 and stuck.spikes == 0  # what the reading said before: stable
    assert mark_stalls([good, stuck]) == 1
    assert good.stall is None
    s = stuck.stall
    best = float(smoothed(_healthy()).min())  # the design's best: the healthy run's lowest smoothed loss
    assert s["against"] == "the best run of its design"
    assert s["reference"] == pytest.approx(best, abs=1e-12)
    assert 26 <= s["start"] <= 34 and s["end"] == 200  # the trailing mean reaches the plateau a few steps late
    assert s["share"] == pytest.approx((s["end"] - s["start"] + 1) / (201 - 10), abs=1e-12)
    level = float(smoothed(_plateau())[s["start"] : 201].mean())
    assert s["level"] == pytest.approx(level, abs=1e-12) and 2.98 < level < 3.02
    assert 0.65 < s["level"] - s["reference"] < 0.75


def test_a_run_knocked_up_that_never_recovers_stalls_against_its_own_earlier_minimum():
    """A run alone in its design falls to 2.3 by step 50, jumps to 3.5 at step 60 and stays there."""
    losses = np.where(STEPS < 50, 4.2 - 1.9 * STEPS / 50.0, np.where(STEPS < 60, 2.3, 3.5)) + _noise(3)
    run = _run("solo", 0.03, losses)
    assert mark_stalls([run]) == 1
    assert run.stall["against"] == "its own earlier minimum"
    # the stretch without improvement starts at its minimum (the jump up does not end it) and runs to the end
    assert run.stall["end"] == 200 and 45 <= run.stall["start"] <= 60
    assert run.stall["reference"] == pytest.approx(float(smoothed(losses).min()), abs=1e-12)
    assert 3.1 < run.stall["level"] < 3.5


def test_healthy_runs_and_the_best_runs_own_plateau_do_not_stall():
    """A run still falling never stalls; the best run of a design that flattens at its minimum does not either (it is
    the reference); a run that plateaus within the threshold of the best does not."""
    converged = np.where(STEPS < 80, 4.2 - 1.9 * STEPS / 80.0, 2.30) + _noise(4)  # flat for 60% of its steps
    near = np.where(STEPS < 80, 4.2 - 1.85 * STEPS / 80.0, 2.35) + _noise(5)  # 0.05 above the best
    runs = [_run("d", 0.01, _healthy()), _run("d", 0.02, converged), _run("d", 0.03, near)]
    assert mark_stalls(runs) == 0
    assert [r.stall for r in runs] == [None, None, None]


def test_the_longest_flat_stretch_restarts_at_every_improvement():
    y = np.array([5.0, 4.0, 3.95, 3.9, 3.0, 3.0, 3.05, 2.99, 3.02, 1.0])
    assert longest_flat_stretch(y, 0.1) == (4, 8)  # 4.0 -> 3.9 is within 0.1; 3.0 .. 3.02 is the longest
    assert longest_flat_stretch(y, 0.1, start=9) == (9, 9)
    assert longest_flat_stretch(np.array([2.0, np.nan, 2.0, 2.0]), 0.1) == (2, 3)
    assert find_stall(_run("x", 0.1, _plateau()[:5]), 0.0) is None  # too short to read


def test_the_report_names_the_stall_and_counts_the_run_unstable():
    good, stuck = _run("d", 0.01, _healthy()), _run("d", 0.1, _plateau())
    mark_stalls([good, stuck])
    result = Comparison(rows=[], out_dir=Path("."), report=Path("report.md"), seq_len=32, eval_len=64, n_buckets=8)
    result.all_runs = [good, stuck]
    lines = _instability_lines(result)
    s = stuck.stall
    row = next(line for line in lines if line.startswith("| d | 0.1 |"))
    assert row.endswith(
        f"| steps {s['start']}-200 ({s['share']:.0%}) at {s['level']:.3f}, {s['level'] - s['reference']:.3f} above "
        "the best run of its design |"
    )
    assert next(line for line in lines if line.startswith("| d | 0.01 |")).endswith("| no |")
    assert any("stalled" in line and "50%" in line for line in lines)

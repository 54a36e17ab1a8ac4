"""Scaling ladders (modkit.experiments.ladder, ``modkit compare --ladder``): the fit recovers known parameters from synthetic
losses, the compute multiplier, gaps and held-out prediction equal their closed forms, the intervals cover the truth,
and a tiny ladder runs end to end."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

import modkit
from modkit.experiments.compare import RunSummary, SpecRow, compare
from modkit.analysis.cost import training_flops_per_token
from modkit.experiments.ladder import fit_ladder
from modkit.experiments.stats import PowerLaw

from conftest import tiny_spec

C = [1e12, 3e12, 1e13, 3e13]
HELD = 1e14
TRUE = {"a": (1.5, 6000.0, 0.3), "b": (1.4, 5000.0, 0.3)}


def _rows(noise: float = 0.0, seeds: int = 3, rng_seed: int = 0) -> list[SpecRow]:
    rng = np.random.default_rng(rng_seed)
    rows = []
    for design, (E, A, alpha) in TRUE.items():
        for c in C + [HELD]:
            losses = E + A * c**-alpha + rng.normal(0, noise, seeds) if noise else np.full(seeds, E + A * c**-alpha)
            runs = [
                RunSummary(f"{design}-{c:g}", 1e-3, s, Path("."), 0.0, float(v), 4.0, 0.0, False, [])
                for s, v in enumerate(losses)
            ]
            rows.append(
                SpecRow(
                    f"{design}-{c:g}",
                    "",
                    int(c / 1e9),
                    0,
                    1e-3,
                    0.0,
                    0,
                    None,
                    float(np.mean(losses)),
                    None,
                    0,
                    runs,
                    design=design,
                    size=(int(c / 1e9), 2),
                    flops_per_token=int(c / 1000),
                    tokens=1000,
                    holdout=c == HELD,
                )
            )
    return rows


def test_the_fit_recovers_known_parameters_and_closed_forms():
    lad = fit_ladder(_rows())
    for f in lad.fits:
        E, A, alpha = TRUE[f.design]
        assert (f.law.E, f.law.A, f.law.alpha) == (
            pytest.approx(E, abs=1e-7),
            pytest.approx(A, rel=1e-5),
            pytest.approx(alpha, rel=1e-6),
        )
        assert f.predicted == pytest.approx(E + A * HELD**-alpha, abs=1e-7)  # the held-out point the fit never saw
        assert len(f.points) == 4 and f.holdout.flops == HELD
    a, b = (PowerLaw(*TRUE[d]) for d in ("a", "b"))
    for where, c in (("C_max", 3e13), ("10 C_max", 3e14)):
        # the baseline's compute that reaches b's loss at c, over c
        expected = (a.A / (float(b(c)) - a.E)) ** (1 / a.alpha) / c
        assert lad.multipliers["b"][where][0] == pytest.approx(expected, rel=1e-4)
    for where, c in (("C_min", 1e12), ("C_max", 3e13), ("10 C_max", 3e14)):
        assert lad.gaps["b"][where][0] == pytest.approx(float(b(c) - a(c)), abs=1e-7)
    assert lad.gaps["b"]["change"][0] == pytest.approx(float(b(3e13) - a(3e13) - b(1e12) + a(1e12)), abs=1e-7)
    assert lad.multipliers["b"]["C_max"][1] is not None  # three identical seeds: a zero-width interval
    assert lad.multipliers["b"]["C_max"][1] == pytest.approx(lad.multipliers["b"]["C_max"][0], rel=1e-6)


def test_noisy_seeds_fit_close_to_the_truth_and_the_prediction_interval_covers_it():
    lad = fit_ladder(_rows(noise=0.004), seed=1)
    for f in lad.fits:
        E, A, alpha = TRUE[f.design]
        assert abs(f.law.E - E) < 0.05 and abs(f.law.alpha - alpha) < 0.02
        for name in ("E", "A", "alpha"):
            lo, hi = f.intervals[name]
            assert lo <= getattr(f.law, name) <= hi
        lo, hi = f.predicted_ci
        assert lo <= E + A * HELD**-alpha <= hi
        m, mlo, mhi = f.measured
        assert mlo < m < mhi and len(f.holdout.losses) == 3
    a, b = (PowerLaw(*TRUE[d]) for d in ("a", "b"))
    lo, hi = lad.gaps["b"]["C_max"][1:]
    assert lo <= float(b(3e13) - a(3e13)) <= hi
    assert fit_ladder(_rows(noise=0.004), seed=1).to_json() == lad.to_json()  # deterministic


def test_one_seed_has_no_intervals_and_too_few_sizes_are_refused():
    lad = fit_ladder(_rows(seeds=1))
    assert lad.fits[0].intervals is None and lad.multipliers["b"]["C_max"][1] is None
    with pytest.raises(ValueError, match="three or more fitted sizes"):
        fit_ladder([r for r in _rows() if r.flops >= 1e13])


def test_a_tiny_ladder_end_to_end(tmp_path):
    from modkit.data import default_corpus, prepare

    (tmp_path / "head.txt").write_text(default_corpus().read_text()[:20_000])
    prepare([tmp_path / "head.txt"], tmp_path / "data", tokenizer="char", show_progress=False)
    spec = tmp_path / "base.json"
    spec.write_text(json.dumps(tiny_spec(name="base", d_model=16, block__ffn={"type": "swiglu", "d_ff": 32})))
    cfg = {
        "data": str(tmp_path / "data"),
        "batch_size": 4,
        "seq_len": 16,
        "warmup_steps": 2,
        "lr": 3e-3,
        "eval_interval": 50,
        "eval_batches": 1,
        "log_interval": 2,
        "final_eval_tokens": 1024,
        "sample_tokens": 0,
        "device": "cpu",
        "threads": 1,
    }
    result = compare(
        [spec],
        cfg,
        tmp_path / "r",
        seeds=2,
        widths=[16, 24, 32],
        ladder=True,
        tokens=[640, 960, 1280],
        holdout=(48, None),
        echo=lambda line: None,
    )
    assert [r.spec for r in result.rows] == ["base-d16-l2", "base-d24-l2", "base-d32-l2", "base-d48-l2"]
    assert [r.holdout for r in result.rows] == [False, False, False, True]
    for row, tokens in zip(result.rows, [640, 960, 1280]):
        spec_obj = modkit.load_spec(row.runs[0].run_dir / "spec.json")
        assert row.tokens == tokens and row.flops == training_flops_per_token(spec_obj, 16) * tokens
        assert (
            spec_obj.d_model == row.size[0] and spec_obj.block.ffn.d_ff == 2 * row.size[0]
        )  # d_ff scaled with d_model
    held = result.rows[-1]
    per_param = 1280 / result.rows[2].params  # the held-out budget: the last size's tokens per parameter
    assert held.tokens == math.ceil(math.ceil(per_param * held.params) / 64) * 64
    fit = result.ladder.fits[0]
    assert fit.predicted == pytest.approx(float(fit.law(held.flops)))
    report = result.report.read_text()
    assert "## Ladder" in report and "Held-out check" in report and f"| base | {held.spec} |" in report
    assert (tmp_path / "r" / "ladder.png").read_bytes()[:4] == b"\x89PNG"
    saved = json.loads((tmp_path / "r" / "results.json").read_text())
    assert saved["ladder"]["fits"][0]["predicted"] == fit.predicted


def test_a_ladder_size_the_spec_cannot_take_is_refused_before_any_run(tmp_path):
    """d_model 36 with 4 heads: head_dim 9, odd under RoPE. The comparison names the design, the size, the field and
    the widths nearby that fit, and trains nothing."""
    from modkit.experiments.compare import CompareError
    from modkit.data import default_corpus, prepare

    (tmp_path / "head.txt").write_text(default_corpus().read_text()[:5_000])
    prepare([tmp_path / "head.txt"], tmp_path / "data", tokenizer="char", show_progress=False)
    spec = tmp_path / "base.json"
    spec.write_text(json.dumps(tiny_spec(name="base", d_model=16, block__ffn={"type": "swiglu", "d_ff": 32})))
    cfg = {
        "data": str(tmp_path / "data"),
        "batch_size": 2,
        "seq_len": 16,
        "max_steps": 2,
        "warmup_steps": 0,
        "sample_tokens": 0,
        "device": "cpu",
        "threads": 1,
    }
    with pytest.raises(CompareError) as info:
        compare(
            [spec],
            cfg,
            tmp_path / "r",
            seeds=1,
            widths=[16, 36, 48],
            ladder=True,
            tokens_per_param=[1],
            echo=lambda line: None,
        )
    text = str(info.value)
    assert text.startswith("design base: base at d_model = 36 (scaled from 16) is not a valid spec:")
    assert (
        "head_dim = 9 gives a rotary width of 9, which is odd" in text
        and "widths near 36 that give a valid spec: 32, 40" in text
    )
    assert list((tmp_path / "r" / "runs").iterdir()) == []

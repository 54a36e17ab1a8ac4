"""The ladder's intervals keep their coverage, degenerate fits are called out, and what cannot give a report is refused
before training (modkit.experiments.ladder, modkit.experiments.ladder_intervals, ``modkit compare --ladder``).

Coverage here is measured on 200 synthetic ladders per seed count (deterministic): a rate's standard error is about
1.6 percentage points, so the bound asserted is 90% (the plain seed resample it replaced scored 73-84%); the 2000-ladder
measurement behind the 93% claim is ``benchmarks/ladder_coverage.py``.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from modkit.experiments.compare import CompareError, RunSummary, SpecRow, compare
from modkit.experiments.ladder import _trend, fit_ladder, report_lines
from modkit.experiments.ladder_intervals import LadderArrays, bootstrap_ladder, seed_noise, synthetic_coverage

from conftest import tiny_spec

QUANTITIES = (
    "E",
    "A",
    "alpha",
    "pred",
    "verdict",
    "gap|C_min",
    "gap|C_max",
    "gap|10 C_max",
    "gap|change",
    "mult|C_max",
    "mult|10 C_max",
)


@pytest.mark.parametrize("seeds", [2, 3, 5])
def test_intervals_cover_the_truth_on_synthetic_ladders(seeds):
    """E 1.6 / 1.55, A 1e3, alpha 0.25, 4 sizes over 1e12-1e14 FLOPs, held-out 1e15, noise 0.01: every quantity's
    interval holds the truth in >= 90% of 200 ladders (the benchmark's 2000 give 94-96%), and a constant true gap is
    called growing or shrinking in at most 10% (the benchmark: 5-6%)."""
    cov = synthetic_coverage(seeds, 200, n_boot=300, seed=seeds)
    assert set(cov) == {*QUANTITIES, "claim"}
    low = {k: v for k, v in cov.items() if k != "claim" and v < 0.90}
    assert low == {}, f"{seeds} seeds: coverage below 90%: {low}"
    assert cov["claim"] <= 0.10
    assert synthetic_coverage(seeds, 20, n_boot=50, seed=seeds) == synthetic_coverage(seeds, 20, n_boot=50, seed=seeds)


def test_the_seed_noise_is_pooled_and_paired_when_designs_share_seeds():
    a = [[1.0, 1.2], [2.0, 2.4]]  # deviations +-0.1, +-0.2
    b = [[3.0, 3.2], [4.0, 3.6]]  # +-0.1, -+0.2
    cov, df, paired = seed_noise([a, b], [[[0, 1], [0, 1]]] * 2)
    assert paired and df == 2
    # sum of products over the 4 deviations / 2: var (0.01 + 0.01 + 0.04 + 0.04) / 2, cov (0.01 + 0.01 - 0.04 - 0.04) / 2
    np.testing.assert_allclose(cov, [[0.05, -0.03], [-0.03, 0.05]], atol=1e-12)
    cov, df, paired = seed_noise([a, b], [[[0, 1], [0, 1]], [[0, 2], [0, 2]]])
    assert not paired and df == 2
    np.testing.assert_allclose(cov, np.diag([0.05, 0.05]), atol=1e-12)


def test_a_noiseless_ladder_has_zero_width_intervals_at_the_truth():
    c = np.geomspace(1e12, 1e14, 4)
    y = 1.6 + 1e3 * c**-0.25
    arrays = LadderArrays([c], [np.full(4, 3)], [y[None]], [1e15], [3], [np.array([1.6 + 1e3 * 1e15**-0.25])],
                          np.zeros((1, 1, 1)), 8)  # fmt: skip
    point, iv = bootstrap_ladder(arrays, 1e12, 1e14, n_boot=50)
    for key, true in (("0|E", 1.6), ("0|alpha", 0.25), ("0|pred", 1.6 + 1e3 * 1e15**-0.25), ("0|verdict", 0.0)):
        assert point[key][0] == pytest.approx(true, abs=1e-6)
        assert iv[key][0][0] == pytest.approx(true, abs=1e-6) and iv[key][1][0] == pytest.approx(true, abs=1e-6)


def _rows(losses: dict[str, list[list[float]]], flops: list[float], held: bool = True) -> list[SpecRow]:
    """Comparison rows of designs whose sizes have these per-seed losses at these FLOPs (the last size held out)."""
    rows = []
    for design, per_size in losses.items():
        for k, (c, ls) in enumerate(zip(flops, per_size)):
            runs = [
                RunSummary(f"{design}-{k}", 1e-3, s, Path("."), 0.0, v, 4.0, 0.0, False, []) for s, v in enumerate(ls)
            ]
            rows.append(
                SpecRow(
                    f"{design}-{k}",
                    "",
                    int(c / 1e9),
                    0,
                    1e-3,
                    0.0,
                    0,
                    None,
                    float(np.mean(ls)),
                    None,
                    0,
                    runs,
                    design=design,
                    size=(k, 2),
                    flops_per_token=int(c / 1000),
                    tokens=1000,
                    holdout=held and k == len(flops) - 1,
                )  # fmt: skip
            )
    return rows


FLOPS = [1e12, 1e13, 1e14, 1e15, 1e16]
NOISE = [0.004, -0.003, -0.001]


def _ladder(E: float, A: float, alpha: float, shift: float = 0.0) -> list[list[float]]:
    return [
        [E + A * c**-alpha + e + (shift if k == len(FLOPS) - 1 else 0.0) for e in NOISE] for k, c in enumerate(FLOPS)
    ]


def test_a_fit_on_the_bound_e_0_is_flagged_and_its_comparisons_are_not_read():
    """No loss floor in the data (true E = 0): E sits at its bound; the report says so, names what it cannot
    conclude, and reads neither the gap trend nor the held-out check."""
    lad = fit_ladder(_rows({"base": _ladder(0.0, 60.0, 0.12), "b": _ladder(1.5, 500.0, 0.2)}, FLOPS))
    base, b = lad.fits
    assert base.law.E < 1e-6 and any("sits at its bound 0" in f for f in base.flags)
    assert not any("bound" in f for f in b.flags)
    text = "\n".join(report_lines(lad))
    assert "**Degenerate fits**" in text and "What this ladder cannot conclude: base's extrapolation" in text
    assert "| base | 4 |" in text and "**degenerate**" in text
    assert "not concluded: the fit of base is degenerate" in text
    assert "| base | base-4 |" in text and text.count("not concluded: the fit is degenerate") == 1


def test_flat_losses_are_no_better_than_a_constant():
    flat = [[2.0 + e for e in NOISE] for _ in FLOPS]
    lad = fit_ladder(_rows({"flat": flat}, FLOPS))
    assert any(f.startswith("no better than a constant") for f in lad.fits[0].flags)


def test_a_healthy_ladder_is_not_flagged_and_its_held_out_verdict_reads_both_ways():
    good = fit_ladder(_rows({"a": _ladder(1.6, 1e3, 0.25)}, FLOPS), seed=1).fits[0]
    assert good.flags == []
    d, lo, hi = good.verdict
    assert d == pytest.approx(good.holdout.mean - good.predicted) and lo < 0 < hi
    assert "consistent with the fit" in "\n".join(
        report_lines(fit_ladder(_rows({"a": _ladder(1.6, 1e3, 0.25)}, FLOPS)))
    )
    off = fit_ladder(_rows({"a": _ladder(1.6, 1e3, 0.25, shift=0.1)}, FLOPS), seed=1)
    d, lo, hi = off.fits[0].verdict
    assert lo > 0 and d == pytest.approx(0.1, abs=0.02)
    assert "the measured loss is above the prediction" in "\n".join(report_lines(off))


def test_the_gap_trend_is_said_only_when_its_interval_excludes_zero():
    assert _trend((-0.1, -0.2, 0.0), (-0.05, -0.08, -0.01)) == "the gap grows with compute"
    assert _trend((-0.1, -0.2, 0.0), (0.05, 0.01, 0.08)) == "the gap shrinks with compute"
    assert _trend((-0.1, -0.2, 0.0), (0.05, -0.01, 0.08)).startswith("no resolved change")
    assert _trend((-0.1, -0.2, 0.0), (-0.05, -0.08, -0.01), ["a"]).startswith("not concluded")


# ----------------------------------------------------------------------------------------------------- compare


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    from modkit.data import default_corpus, prepare

    root = tmp_path_factory.mktemp("ladder")
    (root / "head.txt").write_text(default_corpus().read_text()[:5_000])
    prepare([root / "head.txt"], root / "data", tokenizer="char", show_progress=False)
    spec = root / "base.json"
    spec.write_text(json.dumps(tiny_spec(name="base", d_model=16, block__ffn={"type": "swiglu", "d_ff": 32})))
    cfg = {
        "data": str(root / "data"),
        "batch_size": 2,
        "seq_len": 16,
        "max_steps": 2,
        "warmup_steps": 0,
        "eval_interval": 2,
        "eval_batches": 1,
        "final_eval_tokens": 256,
        "sample_tokens": 0,
        "device": "cpu",
        "threads": 1,
    }
    return spec, cfg


def test_a_ladder_of_two_sizes_is_refused_before_any_run(data, tmp_path):
    spec, cfg = data
    with pytest.raises(CompareError, match="three or more fitted sizes per design, got 2"):
        compare([spec], cfg, tmp_path / "r", seeds=1, widths=[16, 32], ladder=True, echo=lambda line: None)
    assert not (tmp_path / "r").exists()


def test_a_held_out_size_below_the_fitted_ones_is_refused_before_any_run(data, tmp_path):
    spec, cfg = data
    with pytest.raises(CompareError) as info:
        compare(
            [spec], cfg, tmp_path / "r", seeds=1, widths=[32, 40, 48], ladder=True, holdout=(24, None),
            echo=lambda line: None,
        )  # fmt: skip
    text = str(info.value)
    assert text.startswith("design base: the held-out size d_model 24, n_layers 2 (")
    assert "is not above the fitted sizes (largest: d_model 48, n_layers 2" in text
    assert list((tmp_path / "r" / "runs").iterdir()) == []


@pytest.mark.slow
def test_a_failed_fit_or_report_step_still_writes_a_report(data, tmp_path, monkeypatch):
    """The fit fails (here: patched to): report.md says so in its Ladder section. The report step fails: a partial
    report.md lists every finished run and the error names it."""
    import modkit.experiments.compare.report as report
    import modkit.experiments.ladder as ladder

    spec, cfg = data

    def fail(rows, **kw):
        raise ValueError("design base: a power-law fit needs positive computes and finite losses")

    monkeypatch.setattr(ladder, "fit_ladder", fail)
    result = compare([spec], cfg, tmp_path / "a", seeds=1, widths=[16, 24, 32], ladder=True, echo=lambda line: None)
    text = result.report.read_text()
    assert result.ladder is None and result.ladder_error.startswith("design base: a power-law fit")
    assert "## Ladder" in text and "**The ladder fit failed**: design base: a power-law fit" in text

    def broken(*args, **kw):
        raise RuntimeError("plotting failed")

    monkeypatch.setattr(report, "write_files", broken)
    with pytest.raises(CompareError, match="3 runs finished, but writing its report failed .RuntimeError: plotting"):
        compare([spec], cfg, tmp_path / "b", seeds=1, widths=[16, 24, 32], ladder=True, echo=lambda line: None)
    partial = (tmp_path / "b" / "report.md").read_text()
    assert partial.startswith("# Design comparison (partial)") and "RuntimeError: plotting failed" in partial
    assert sum(line.startswith("| base-d") for line in partial.splitlines()) == 3

"""``modkit compare``: the table, the sweep and the position buckets equal the runs' own numbers; report files; CLI errors."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import modkit
from modkit.cli import main
from modkit.experiments.compare import CompareError, compare, fmt_pm, mean_std, parse_lrs, read_run, verdicts_of
from modkit.data import TokenData, default_corpus, prepare
from modkit.train.plot import read_metrics

from conftest import tiny_spec

LRS = [1e-3, 3e-3]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """Two specs (RoPE with max_seq_len 64, learned positions with 32), a training config, and a finished comparison."""
    root = tmp_path_factory.mktemp("compare")
    text = root / "head.txt"
    text.write_text(default_corpus().read_text()[:30_000])
    prepare([text], root / "data", tokenizer="char", show_progress=False)
    rope = root / "rope.json"
    rope.write_text(json.dumps(tiny_spec(name="rope")))
    learned = root / "learned.json"
    learned.write_text(json.dumps({**tiny_spec(name="learned", max_seq_len=32), "position": {"type": "learned"}}))
    cfg = {
        "data": str(root / "data"),
        "batch_size": 4,
        "seq_len": 32,
        "max_steps": 20,
        "warmup_steps": 2,
        "lr": 1e-3,
        "eval_interval": 10,
        "eval_batches": 2,
        "log_interval": 5,
        "final_eval_tokens": 2048,
        "sample_tokens": 0,
        "device": "cpu",
        "threads": 1,
        "seed": 3,
    }
    (root / "train.json").write_text(json.dumps(cfg))
    result = compare(
        [rope, learned], root / "train.json", root / "report", seeds=2, lr_sweep=LRS, echo=lambda line: None
    )
    return root, result


def _run_numbers(run_dir: Path) -> tuple[float, float, bool]:
    records = read_metrics(run_dir / "metrics.jsonl")
    evals = [r for r in records if r["kind"] == "eval"]
    final = [r for r in records if r["kind"] == "final"][-1]
    return evals[-1]["train_loss"], final["val_loss"], evals[-1]["val_loss"] > evals[0]["val_loss"]


def test_table_equals_the_runs_metrics(setup):
    root, result = setup
    report = result.report.read_text()
    assert [r.spec for r in result.rows] == ["rope", "learned"]
    for row in result.rows:
        dirs = sorted((root / "report" / "runs").glob(f"{row.spec}-lr{row.lr:g}-seed*"))
        assert [d.name for d in dirs] == [f"{row.spec}-lr{row.lr:g}-seed3", f"{row.spec}-lr{row.lr:g}-seed4"]
        train, val, div = zip(*(_run_numbers(d) for d in dirs))
        assert row.train_loss_mean == pytest.approx(np.mean(train), rel=1e-12)
        assert row.train_loss_std == pytest.approx(np.std(train, ddof=1), rel=1e-9)
        assert row.val_loss_mean == pytest.approx(np.mean(val), rel=1e-12)
        assert row.val_loss_std == pytest.approx(np.std(val, ddof=1), rel=1e-9)
        assert row.diverged == sum(div)
        assert f"{np.mean(val):.4f} ± {np.std(val, ddof=1):.4f}" in report
        assert f"{np.mean(train):.4f} ± {np.std(train, ddof=1):.4f}" in report
        spec = modkit.load_spec(dirs[0] / "spec.json")
        assert spec.vocab_size == TokenData.open(root / "data").vocab_size
        assert (row.params, row.active_params) == (modkit.count_params(spec), modkit.count_params(spec))  # dense
        assert f"| {row.spec} | {row.params:,} | {row.active_params:,} | {row.lr:g} |" in report
        finals = [
            json.loads(line)["val_loss"]
            for line in (dirs[0] / "metrics.jsonl").read_text().splitlines()
            if '"final"' in line
        ]
        assert finals and row.runs[0].val_loss == finals[-1]


def test_sweep_picks_the_argmin(setup):
    root, result = setup
    report = result.report.read_text()
    for row in result.rows:
        got = {lr: _run_numbers(root / "report" / "runs" / f"{row.spec}-lr{lr:g}-seed3")[1] for lr in LRS}
        assert row.sweep == got
        assert row.lr == min(got, key=got.get)
        assert f"- {row.spec}: learning rate {row.lr:g} won." in report
        assert row.runs[0].run_dir.name == f"{row.spec}-lr{row.lr:g}-seed3"  # the sweep's run is reused
    losing = [lr for lr in LRS if lr != result.rows[0].lr][0]
    assert not list((root / "report" / "runs").glob(f"rope-lr{losing:g}-seed4"))  # other seeds only at the winner


def test_report_files(setup):
    root, result = setup
    out = root / "report"
    for name in ("curves.png", "positions.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    saved = json.loads((out / "results.json").read_text())
    assert [r["spec"] for r in saved["rows"]] == ["rope", "learned"]
    assert saved["rows"][0]["val_loss_mean"] == result.rows[0].val_loss_mean
    assert "![validation loss of every run](curves.png)" in result.report.read_text()


def test_wall_time_and_run_count(setup):
    root, result = setup
    folders = sorted(p.name for p in (root / "report" / "runs").iterdir())
    # 2 specs x (2 sweep runs + 1 more seed at the winner)
    assert result.n_runs == len(folders) == 2 * (len(LRS) + 1)
    # the whole comparison takes at least as long as the runs it kept, each timed by the training loop
    elapsed = [r.elapsed_s for row in result.rows for r in row.runs]
    assert all(e > 0 for e in elapsed) and result.wall_s >= sum(elapsed)
    saved = json.loads((root / "report" / "results.json").read_text())
    assert saved["wall_s"] == result.wall_s and saved["n_runs"] == 6 and saved["command"] is None
    report = result.report.read_text()
    assert (
        f"Wall time of the whole comparison: {result.wall_s:,.0f} s ({result.wall_s / 60:.1f} min) for 6 training runs, one at a time."
        in report
    )
    assert "Generated by:" not in report  # called from Python without a command line


def _loss_by_position(root: Path, run_dir: Path, length: int = 64, max_tokens: int = 2048) -> np.ndarray:
    """Cross-entropy per position of the best checkpoint, one window of ``length`` at a time (``[length]``)."""
    model = modkit.load(run_dir / "best").eval()
    val = np.asarray(TokenData.open(root / "data").val, dtype=np.int64)
    n = min(len(val) - 1, max_tokens) // length
    per_pos = np.zeros(length)
    with torch.no_grad():
        for w in range(n):
            window = torch.from_numpy(val[w * length : w * length + length + 1])
            logits = model(window[None, :-1]).logits[0]
            per_pos += F.cross_entropy(logits, window[1:], reduction="none").numpy()
    return per_pos / n


def test_position_buckets_equal_an_independent_computation(setup):
    root, result = setup
    rope, learned = result.rows
    assert learned.buckets is None and learned.buckets_note == "max_seq_len = 32 < 64"
    report = result.report.read_text()
    assert "| learned | " not in report.split("## Loss by position")[1].split("## Runs")[0]  # left out, not "n/a"
    assert "Not scored at this context: learned (max_seq_len = 32 < 64)." in report and "n/a" not in report
    run = rope.runs[0]
    per_pos = _loss_by_position(root, run.run_dir)
    expected = [per_pos[8 * b : 8 * b + 8].mean() for b in range(8)]
    assert run.buckets == pytest.approx(expected, rel=1e-5)
    means = np.mean([r.buckets for r in rope.runs], axis=0)
    assert rope.buckets == pytest.approx(list(means), rel=1e-12)
    assert f"| rope | {rope.buckets[0]:.4f} |" in result.report.read_text()


def test_divergence_and_stats_rules(tmp_path):
    records = [
        {"kind": "eval", "step": 0, "tokens": 0, "train_loss": 4.0, "val_loss": 4.1},
        {"kind": "train", "step": 5, "tokens": 5, "loss": float("nan")},
        {"kind": "eval", "step": 10, "tokens": 10, "train_loss": 3.0, "val_loss": 3.2},
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    fake = type("R", (), {"tokens_per_s": 10.0, "elapsed_s": 2.5})()
    assert read_run(tmp_path, "x", 1e-3, 0, fake).diverged  # a NaN batch loss
    records[1]["loss"] = 3.5
    records[2]["val_loss"] = 4.2  # ends above the start
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    summary = read_run(tmp_path, "x", 1e-3, 0, fake)
    assert (
        summary.diverged
        and summary.val_loss == 4.2
        and summary.train_loss == 3.0
        and summary.curve == [(0, 4.1), (10, 4.2)]
    )
    assert (summary.tokens_per_s, summary.elapsed_s) == (10.0, 2.5)
    records[2]["val_loss"] = 4.0
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    assert not read_run(tmp_path, "x", 1e-3, 0, fake).diverged
    assert mean_std([1.0, 2.0, 4.0]) == (pytest.approx(7 / 3), pytest.approx(math.sqrt(7 / 3)))
    assert mean_std([2.5]) == (2.5, None)
    assert parse_lrs("1e-3, 3e-3") == [1e-3, 3e-3]


@pytest.mark.parametrize("text", ["1e-3,abc", "0", "-1e-3", "nan", "1e-3,1e-3", ""])
def test_bad_lr_sweep(text):
    with pytest.raises(CompareError, match="--lr-sweep"):
        parse_lrs(text)


def test_cli_errors(setup, tmp_path, capsys):
    root, _ = setup
    train = str(root / "train.json")
    spec = str(root / "rope.json")
    cases = [
        ([str(tmp_path / "missing.json"), "--train", train], "missing.json: no such file"),
        ([spec, "--train", str(tmp_path / "nope.json")], "--train"),
        ([spec, "--train", train, "--lr-sweep", "1e-3,fast"], "--lr-sweep: 'fast' is not a number"),
        ([spec, "--train", train, "--seeds", "0"], "--seeds must be >= 1"),
        ([spec, "--train", train, "--jobs", "0"], "--jobs must be >= 1"),
    ]
    for argv, message in cases:
        assert main(["compare", *argv, "-o", str(tmp_path / "r")]) == 1
        err = capsys.readouterr().err
        assert err.startswith("modkit: error: ") and message in err, err
    assert not (tmp_path / "r").exists()
    with pytest.raises(CompareError, match="already holds a comparison"):
        compare([spec], train, root / "report", seeds=1)


def test_cli_runs_a_comparison(setup, tmp_path, capsys):
    root, _ = setup
    out = tmp_path / "r"
    assert (
        main(
            [
                "compare",
                str(root / "rope.json"),
                "--train",
                str(root / "train.json"),
                "--seeds",
                "1",
                "--max-steps",
                "4",
                "-o",
                str(out),
            ]
        )
        == 0
    )
    stdout = capsys.readouterr().out
    assert f"report: {out / 'report.md'}" in stdout
    records = read_metrics(out / "runs" / "rope-lr0.001-seed3" / "metrics.jsonl")
    assert records[-1]["kind"] == "final" and records[-1]["step"] == 4
    assert f"rope: val {records[-1]['val_loss']:.4f} ({records[-1]['val_bits_per_byte']:.4f} bits/byte)," in stdout
    command = f"modkit compare {root / 'rope.json'} --train {root / 'train.json'} --seeds 1 --max-steps 4 -o {out}"
    assert f"Generated by:\n\n```bash\n{command}\n```\n" in (out / "report.md").read_text()
    saved = json.loads((out / "results.json").read_text())
    assert saved["command"] == command and saved["n_runs"] == 1 and saved["wall_s"] > 0


def test_command_line_is_shell_quoted_and_reruns_the_same_arguments():
    import argparse
    import shlex

    from modkit.cli.compare import add_subcommands, command_line

    parser = argparse.ArgumentParser(prog="modkit")
    add_subcommands(parser.add_subparsers(dest="command"))
    argv = [
        "compare",
        "a b.json",
        "c.json",
        "--train",
        "t.json",
        "--lr-sweep",
        "1e-3,3e-3",
        "--seeds",
        "4",
        "--max-steps",
        "50",
        "--jobs",
        "2",
        "-o",
        "out dir",
    ]
    args = parser.parse_args(argv)
    line = command_line(args, args.out)
    assert (
        line
        == "modkit compare 'a b.json' c.json --train t.json --seeds 4 --lr-sweep 1e-3,3e-3 --max-steps 50 --jobs 2 -o 'out dir'"
    )
    again = parser.parse_args(shlex.split(line)[1:])
    assert vars(again) == vars(args)


@pytest.mark.slow  # end to end (processes, compile or a browser): left out of make test-fast
def test_parallel_runs_equal_serial_ones(setup, tmp_path):
    """``jobs=2`` trains the same runs in worker processes: every table figure and sweep loss equals the serial run's."""
    root, serial = setup
    parallel = compare(
        [root / "rope.json", root / "learned.json"],
        root / "train.json",
        tmp_path / "report",
        seeds=2,
        lr_sweep=LRS,
        jobs=2,
        echo=lambda line: None,
    )
    assert parallel.n_runs == serial.n_runs == 6 and parallel.jobs == 2
    for p, s in zip(parallel.rows, serial.rows):
        assert (p.spec, p.lr, p.sweep) == (s.spec, s.lr, s.sweep)
        assert [(r.seed, r.train_loss, r.val_loss, r.curve, r.buckets) for r in p.runs] == [
            (r.seed, r.train_loss, r.val_loss, r.curve, r.buckets) for r in s.runs
        ]
    assert "6 training runs, 2 at a time." in parallel.report.read_text()
    assert json.loads((tmp_path / "report" / "results.json").read_text())["jobs"] == 2


def test_text_data_is_prepared_once_for_every_run(tmp_path):
    """A config naming a text file: the comparison tokenizes it once into REPORT/data, and every run reads that folder."""
    text = tmp_path / "head.txt"
    text.write_text(default_corpus().read_text()[:20_000])
    spec = tmp_path / "a.json"
    spec.write_text(json.dumps(tiny_spec(name="a")))
    cfg = {
        "data": "head.txt",
        "tokenizer": "char",
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
    (tmp_path / "train.json").write_text(json.dumps(cfg))
    result = compare([spec], tmp_path / "train.json", tmp_path / "r", seeds=2, echo=lambda line: None)
    folders = {json.loads((r.run_dir / "data.json").read_text())["folder"] for r in result.rows[0].runs}
    assert folders == {str(tmp_path / "r" / "data")}
    assert TokenData.open(tmp_path / "r" / "data").meta["tokenizer"] and not any(
        (r.run_dir / "data").exists() for r in result.rows[0].runs
    )


@pytest.mark.slow  # end to end (processes, compile or a browser): left out of make test-fast
def test_a_failing_run_in_a_worker_raises_its_own_error(setup, tmp_path):
    """With jobs > 1 a run that fails in its worker (here: weights too large for this machine, refused before any
    allocation) raises its own error, type, message and attributes intact."""
    from modkit.core.errors import MemoryLimitError

    root, _ = setup
    huge = tmp_path / "huge.json"
    huge.write_text(
        json.dumps(
            tiny_spec(
                name="huge",
                d_model=16384,
                n_layers=64,
                block={
                    "attention": {"type": "mha", "n_heads": 16},
                    "ffn": {"type": "mlp", "d_ff": 65536, "activation": "gelu"},
                    "norm": {"type": "layernorm"},
                    "placement": {"type": "pre"},
                },
            )
        )
    )
    with pytest.raises(MemoryLimitError, match="would need about") as info:
        compare(
            [root / "rope.json", huge], root / "train.json", tmp_path / "r", seeds=1, jobs=2, echo=lambda line: None
        )
    spec = modkit.load_spec({**json.loads(huge.read_text()), "vocab_size": TokenData.open(root / "data").vocab_size})
    assert info.value.needed >= 4 * modkit.count_params(spec) > info.value.available  # float32 weights alone


def test_every_spec_is_checked_before_any_run_trains(setup, tmp_path):
    """A spec that is invalid, or does not fit the config, fails the comparison before the first run starts."""
    from modkit import SpecError
    from modkit.train import TrainError

    root, _ = setup
    typo = tmp_path / "typo.json"
    typo.write_text(json.dumps({**tiny_spec(name="typo"), "final_norm": "rms"}))
    short = tmp_path / "short.json"
    short.write_text(json.dumps({**tiny_spec(name="short", max_seq_len=16), "position": {"type": "learned"}}))
    for bad, error, message in (
        (typo, SpecError, "final_norm: Input should be an object or null"),
        (short, TrainError, "seq_len = 32 exceeds the model's max_seq_len = 16"),
    ):
        out = tmp_path / bad.stem
        with pytest.raises(error, match=message):
            compare([root / "rope.json", bad], root / "train.json", out, seeds=1, echo=lambda line: None)
        assert list((out / "runs").iterdir()) == []  # nothing trained
    with pytest.raises(CompareError, match="already holds runs"):
        (tmp_path / "typo" / "runs" / "rope-lr0.001-seed3").mkdir()
        compare([root / "rope.json"], root / "train.json", tmp_path / "typo", seeds=1, echo=lambda line: None)


def test_the_report_says_how_much_of_the_validation_split_was_scored(setup):
    root, result = setup
    n_val = len(TokenData.open(root / "data").val)
    assert (
        f"validation the score over the first 2,048 of the validation split's {n_val:,} tokens (`final_val_loss`)"
        in result.report.read_text()
    )


# ------------------------------------------------------------------------------------------------ grids, verdicts, merges


@pytest.fixture(scope="module")
def grid(setup, tmp_path_factory):
    """One spec as two designs (AdamW and Lion by a per-spec override), every seed at every learning rate."""
    root, _ = setup
    out = tmp_path_factory.mktemp("grid") / "report"
    result = compare(
        [f"adamw={root / 'rope.json'}", f"lion={root / 'rope.json'}"],
        root / "train.json",
        out,
        seeds=2,
        lr_grid=LRS,
        overrides={"max_steps": 10, "log_interval": 1},
        throughput_steps=2,
        spec_overrides={"lion": {"optimizer": {"type": "lion"}}},
        echo=lambda line: None,
    )
    return root, result


def test_a_grid_trains_every_seed_at_every_rate_and_picks_the_lowest_mean(grid):
    _, result = grid
    assert result.n_runs == 2 * len(LRS) * 2 and [r.spec for r in result.rows] == ["adamw", "lion"]
    for row in result.rows:
        per_lr = {g.lr: g for g in result.grid if g.spec == row.spec}
        assert sorted(per_lr) == LRS
        for lr, g in per_lr.items():
            vals = [_run_numbers(r.run_dir)[1] for r in g.runs]
            assert [r.run_dir.name for r in g.runs] == [f"{row.spec}-lr{lr:g}-seed{s}" for s in (3, 4)]
            assert g.val_loss_mean == pytest.approx(np.mean(vals), rel=1e-12)
        assert row.lr == min(per_lr, key=lambda lr: per_lr[lr].val_loss_mean)
        optimizer = json.loads((row.runs[0].run_dir / "config.json").read_text())["optimizer"]["type"]
        assert optimizer == row.spec  # the per-spec override reached the runs
    report = result.report.read_text()
    assert "## Learning-rate grid" in report and 'Per spec: lion: optimizer = {"type": "lion"}.' in report


def test_verdicts_are_computed_from_the_runs(grid):
    from modkit.experiments.stats import mean_difference

    _, result = grid
    adamw, lion = result.rows
    chosen = [v for v in result.verdicts if v.lr is None]
    assert len(chosen) == 1 and (chosen[0].a, chosen[0].b) == ("lion", "adamw")
    expected = mean_difference([r.val_loss for r in lion.runs], [r.val_loss for r in adamw.runs], paired=True)
    assert chosen[0].difference == expected and expected.method == "paired t"
    per_lr = [v for v in result.verdicts if v.lr is not None]
    assert [v.lr for v in per_lr] == LRS
    report = result.report.read_text()
    assert f"- {expected.text('lion', 'adamw')}" in report
    for v in per_lr:
        assert f"- lr {v.lr:g}: {v.text()}" in report
    saved = json.loads((result.out_dir / "results.json").read_text())
    assert saved["verdicts"][0]["diff"] == expected.diff and saved["verdicts"][0]["resolved"] == expected.resolved


def test_verdicts_at_twice_the_training_length(setup, grid, tmp_path):
    """Each run's loss over every position of the windows of twice seq_len, the row's mean and std of it, and the
    verdicts on it: equal to an independent computation; a model that cannot read that far has none and gets none."""
    from modkit.experiments.compare import merge_reports
    from modkit.experiments.stats import mean_difference

    root, first = setup
    rope, learned = first.rows
    assert learned.long_val_loss_mean is None and all(r.long_val_loss is None for r in learned.runs)
    assert first.long_verdicts == []  # only rope can be scored at 64: nothing to compare it with
    assert rope.runs[0].long_val_loss == pytest.approx(_loss_by_position(root, rope.runs[0].run_dir).mean(), rel=1e-5)
    _, result = grid
    adamw, lion = result.rows
    for row in result.rows:
        losses = [_loss_by_position(root, r.run_dir).mean() for r in row.runs]
        assert [r.long_val_loss for r in row.runs] == pytest.approx(losses, rel=1e-5)
        assert (row.long_val_loss_mean, row.long_val_loss_std) == mean_std([r.long_val_loss for r in row.runs])
    expected = mean_difference([r.long_val_loss for r in lion.runs], [r.long_val_loss for r in adamw.runs], paired=True)
    assert len(result.long_verdicts) == 1
    v = result.long_verdicts[0]
    assert (v.a, v.b, v.lr, v.metric, v.difference) == ("lion", "adamw", None, "long_val_loss", expected)
    assert (
        expected != next(x for x in result.verdicts if x.lr is None).difference
    )  # not the verdict at the training length
    report = result.report.read_text()
    section = report.split("## Loss by position")[1].split("## Runs")[0]
    assert "| all 64 (mean ± std) |" in section and f"- {expected.text('lion', 'adamw')}" in section
    assert f"{fmt_pm(lion.long_val_loss_mean, lion.long_val_loss_std)} |" in section
    saved = json.loads((result.out_dir / "results.json").read_text())
    assert [(x["a"], x["b"], x["diff"], x["resolved"]) for x in saved["long_verdicts"]] == [
        ("lion", "adamw", expected.diff, expected.resolved)
    ]
    merged = merge_reports([first.out_dir, result.out_dir], tmp_path / "merged")
    assert [(x.a, x.b) for x in merged.long_verdicts] == [("adamw", "rope"), ("lion", "rope")]  # learned left out
    again = mean_difference([r.long_val_loss for r in lion.runs], [r.long_val_loss for r in rope.runs], paired=True)
    assert merged.long_verdicts[1].difference == again
    with pytest.raises(CompareError, match="metric = 'loss'"):
        verdicts_of(result.rows, metric="loss")


def test_merged_reports_that_repeat_labels_compare_each_source_within_itself(setup, grid, tmp_path):
    """The same designs merged from two folders (as one compare per learning rate would give): every verdict pairs
    rows of one source; none compares a design with itself or with the reference of another source."""
    from modkit.experiments.compare import merge_reports

    root, first = setup
    _, second = grid
    twice = merge_reports([first.out_dir, first.out_dir], tmp_path / "twice")
    assert [r.spec for r in twice.rows] == ["rope@1", "learned@1", "rope@2", "learned@2"]
    assert [r.design for r in twice.rows] == ["rope@1", "learned@1", "rope@2", "learned@2"]
    (original,) = first.verdicts
    assert [(v.a, v.b, v.difference) for v in twice.verdicts] == [
        ("learned@1", "rope@1", original.difference),
        ("learned@2", "rope@2", original.difference),
    ]
    # a new source joins the first table; the one that repeats its labels is compared within itself, grid included
    merged = merge_reports([first.out_dir, second.out_dir, second.out_dir], tmp_path / "three")
    assert [r.spec for r in merged.rows] == ["rope", "learned", "adamw@2", "lion@2", "adamw@3", "lion@3"]
    assert {r.spec for r in merged.grid} == {"adamw@2", "lion@2", "adamw@3", "lion@3"}
    chosen = [(v.a, v.b) for v in merged.verdicts if v.lr is None]
    assert chosen == [("learned", "rope"), ("adamw@2", "rope"), ("lion@2", "rope"), ("lion@3", "adamw@3")]
    per_lr = {v.lr: v for v in second.verdicts if v.lr is not None}
    for lr in LRS:
        at = [v for v in merged.verdicts if v.lr == lr]
        assert [(v.a, v.b) for v in at] == [("lion@2", "adamw@2"), ("lion@3", "adamw@3")]
        assert all(v.difference == per_lr[lr].difference for v in at)
    report = merged.report.read_text()
    assert "| adamw@3 | " in report and "lion@3 - adamw@3" in report
    grid_table = report.split("## Learning-rate grid")[1].split("\n\n")[2]  # only the rows that have a grid
    assert [line.split(" | ")[0] for line in grid_table.splitlines()[2:]] == [
        "| adamw@2",
        "| lion@2",
        "| adamw@3",
        "| lion@3",
    ]
    with pytest.raises(CompareError, match="no comparison folders"):
        merge_reports([], tmp_path / "none")


def test_instability_curves_and_throughput_are_reported(grid):
    from modkit.experiments.stats import instability

    _, result = grid
    for row in result.rows:
        for r in row.runs:
            train = [x for x in read_metrics(r.run_dir / "metrics.jsonl") if x["kind"] == "train"]
            reading = instability([x["loss"] for x in train], [x["grad_norm"] for x in train])
            assert (r.above_min, r.spikes, r.max_grad_norm) == (
                reading.above_min,
                reading.spikes,
                reading.max_grad_norm,
            )
            assert r.above_threshold == reading.threshold >= 0.1  # the margin plus the noise's dip, kept per run
            assert r.train_curve == [(x["step"], x["loss"]) for x in train] and len(r.grad_curve) == 10
            assert len(r.load) == 2 and r.cores >= 1
    for name in ("train-curves.png", "grad-norm.png", "curves.png"):
        assert (result.out_dir / name).read_bytes()[:4] == b"\x89PNG"
    report = result.report.read_text()
    assert "## Instability" in report and "load average" in report
    table = report.split("## Instability")[1].split("## Throughput")[0]
    assert (
        sum(line.startswith(("| adamw |", "| lion |")) for line in table.splitlines())
        == result.n_runs
        == len(result.all_runs)
    )
    first = next(run for run in result.all_runs)
    assert (
        f"| {first.spec} | {first.lr:g} | {first.seed} | {first.above_min:.1%} | {first.above_threshold:.3f} | "
        in table
    )
    assert set(result.throughput) == {"adamw", "lion"} and all(v > 0 for v in result.throughput.values())
    assert "## Throughput, measured interleaved" in report
    assert "## Loss by position" in report  # rope can be scored at twice the context


def test_reports_merge_into_one_table_with_recomputed_verdicts(setup, grid, tmp_path):
    from modkit.experiments.compare import merge_reports

    root, first = setup
    _, second = grid
    merged = merge_reports([first.out_dir, second.out_dir], tmp_path / "merged")
    assert [r.spec for r in merged.rows] == ["rope", "learned", "adamw", "lion"]
    assert [r.val_loss_mean for r in merged.rows] == [r.val_loss_mean for r in first.rows + second.rows]
    assert [(v.a, v.b) for v in merged.verdicts if v.lr is None] == [
        ("learned", "rope"),
        ("adamw", "rope"),
        ("lion", "rope"),
    ]
    report = merged.report.read_text()
    assert report.startswith("# Design comparison\n\nMerged from ") and str(first.out_dir) in report
    assert "| learned | " in report and (tmp_path / "merged" / "curves.png").is_file()
    with pytest.raises(CompareError, match="no results.json"):
        merge_reports([tmp_path], tmp_path / "m2")


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(spec_overrides={"nope": {"lr": 1e-3}}), "not a spec label"),
        (dict(spec_overrides={"rope": {"seed": 1}}), "sets seed itself"),
        (dict(spec_overrides={"rope": {"lr_typo": 1}}), "not a training-config field"),
        (dict(spec_overrides={"rope": {"lr": 1e-3}}, lr_grid=[1e-3]), "sweep it or set it"),
        (dict(lr_grid=[1e-3], lr_sweep=[1e-3]), "not both"),
        (dict(ladder=True), "three or more sizes"),
        (dict(ladder=True, widths=[16, 24]), "three or more fitted sizes per design, got 2"),
        (dict(tokens=[10]), "needs sizes"),
    ],
)
def test_bad_comparison_arguments(setup, tmp_path, kwargs, message):
    root, _ = setup
    with pytest.raises(CompareError, match=message):
        compare([root / "rope.json"], root / "train.json", tmp_path / "r", seeds=1, echo=lambda line: None, **kwargs)


def test_a_request_object_is_the_same_comparison(tmp_path):
    """compare(request) takes a CompareRequest, compare's own arguments build one, and a request is checked before
    anything is made; a request with more arguments, no report folder or an unknown option is refused."""
    import dataclasses

    from modkit.experiments.compare import CompareRequest, check_request

    spec = tmp_path / "a.json"
    spec.write_text("{}")
    request = CompareRequest([spec, f"b={spec}"], None, tmp_path / "r", seeds=2, overrides={"max_steps": 4})
    assert check_request(request) == [("a", spec.resolve()), ("b", spec.resolve())]
    assert request.mode == "single" and request.overrides == {"max_steps": 4} and request.spec_overrides == {}
    assert CompareRequest([spec], None, tmp_path / "r", lr_grid=[1e-3, 3e-3]).lrs == [1e-3, 3e-3]
    with pytest.raises(CompareError, match="seeds = 0"):
        compare(CompareRequest([spec], None, tmp_path / "r", seeds=0))
    with pytest.raises(TypeError, match="no other arguments"):
        compare(request, seeds=3)
    with pytest.raises(TypeError, match="out_dir"):
        compare([spec])
    with pytest.raises(TypeError):
        compare([spec], None, tmp_path / "r", seed=3)  # not a field of the request
    with pytest.raises(dataclasses.FrozenInstanceError):
        request.seeds = 3
    assert not (tmp_path / "r").exists()


def test_cli_takes_every_training_field_and_per_spec_overrides(setup, tmp_path, capsys):
    root, _ = setup
    out = tmp_path / "r"
    argv = [
        "compare",
        f"a={root / 'rope.json'}",
        f"b={root / 'rope.json'}",
        "--train",
        str(root / "train.json"),
        "--seeds",
        "1",
        "--max-steps",
        "2",
        "--weight-decay",
        "0",
        "--override",
        'b:optimizer={"type": "sgd"}',
        "--override",
        "b:lr=0.01",
        "-o",
        str(out),
    ]
    assert main(argv) == 0
    stdout = capsys.readouterr().out
    cfg_a = json.loads((out / "runs" / "a-lr0.001-seed3" / "config.json").read_text())
    cfg_b = json.loads((out / "runs" / "b-lr0.01-seed3" / "config.json").read_text())
    assert (cfg_a["max_steps"], cfg_a["weight_decay"], cfg_a["optimizer"]["type"]) == (2, 0.0, "adamw")
    assert (cfg_b["lr"], cfg_b["optimizer"]["type"]) == (0.01, "sgd")
    assert "b - a = " in stdout and "one seed: no interval" in stdout
    command = (
        f"modkit compare a={root / 'rope.json'} b={root / 'rope.json'} --train {root / 'train.json'} --seeds 1 "
        f'--max-steps 2 --weight-decay 0 --override \'b:optimizer={{"type": "sgd"}}\' --override b:lr=0.01 -o {out}'
    )
    assert json.loads((out / "results.json").read_text())["command"] == command
    assert main(["compare", str(root / "rope.json"), "--override", "rope-lr=1", "-o", str(tmp_path / "x")]) == 1
    assert "LABEL:FIELD=VALUE" in capsys.readouterr().err


def test_moe_runs_get_an_expert_load_table(setup, tmp_path):
    """Runs whose routers report loads add the imbalance at step 0 and at the end (mean ± std over seeds, from
    their eval records) and a plot; a dense spec beside them is named under the table, not filled with n/a."""
    root, _ = setup
    moe = tmp_path / "moe.json"
    moe.write_text(
        json.dumps(
            tiny_spec(
                name="moe",
                block__ffn={
                    "type": "moe",
                    "n_experts": 4,
                    "top_k": 2,
                    "expert": {"type": "swiglu", "d_ff": 16},
                    "router": {
                        "type": "sigmoid_topk",
                        "renormalize": True,
                        "correction_bias": True,
                        "bias_update_speed": 0.01,
                    },
                },
            )
        )
    )
    result = compare(
        [moe, root / "rope.json"],
        root / "train.json",
        tmp_path / "report",
        seeds=2,
        overrides={"max_steps": 4, "eval_interval": 2, "final_eval_tokens": 256},
        echo=lambda line: None,
    )
    report = result.report.read_text()
    assert "## Expert load imbalance" in report and (tmp_path / "report" / "imbalance.png").is_file()
    dirs = sorted((tmp_path / "report" / "runs").glob("moe-*"))
    curves = [
        [(r["step"], r["load_imbalance"]) for r in read_metrics(d / "metrics.jsonl") if r["kind"] == "eval"]
        for d in dirs
    ]
    assert [r.imbalance_curve for r in result.rows[0].runs] == curves and [s for s, _ in curves[0]] == [0, 2, 4]
    start, end = mean_std([c[0][1] for c in curves]), mean_std([c[-1][1] for c in curves])
    assert f"| moe | {start[0]:.4f} ± {start[1]:.4f} | {end[0]:.4f} ± {end[1]:.4f} |" in report
    table = report.split("## Expert load imbalance")[1].split("## ")[0]
    assert "| rope |" not in table and "Not in this table (no router reports expert loads): rope." in table
    assert all(not r.imbalance_curve for r in result.rows[1].runs)

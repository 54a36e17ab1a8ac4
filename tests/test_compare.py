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
from modkit.compare import CompareError, compare, mean_std, parse_lrs, read_run
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
        "data": str(root / "data"), "batch_size": 4, "seq_len": 32, "max_steps": 20, "warmup_steps": 2, "lr": 1e-3,
        "eval_interval": 10, "eval_batches": 2, "log_interval": 5, "final_eval_tokens": 2048, "sample_tokens": 0,
        "device": "cpu", "threads": 1, "seed": 3,
    }
    (root / "train.json").write_text(json.dumps(cfg))
    result = compare([rope, learned], root / "train.json", root / "report", seeds=2, lr_sweep=LRS, echo=lambda line: None)
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
        finals = [json.loads(line)["val_loss"] for line in (dirs[0] / "metrics.jsonl").read_text().splitlines() if "\"final\"" in line]
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
    assert f"Wall time of the whole comparison: {result.wall_s:,.0f} s ({result.wall_s / 60:.1f} min) for 6 training runs, one at a time." in report
    assert "Generated by:" not in report  # called from Python without a command line


def test_position_buckets_equal_an_independent_computation(setup):
    root, result = setup
    rope, learned = result.rows
    assert learned.buckets is None and learned.buckets_note.startswith("n/a: max_seq_len = 32 < 64")
    assert "| learned | n/a: max_seq_len = 32 < 64 |" in result.report.read_text()
    run = rope.runs[0]
    model = modkit.load(run.run_dir / "best").eval()
    val = np.asarray(TokenData.open(root / "data").val, dtype=np.int64)
    n = min(len(val) - 1, 2048) // 64
    per_pos = np.zeros(64)
    with torch.no_grad():
        for w in range(n):
            window = torch.from_numpy(val[w * 64 : w * 64 + 65])
            logits = model(window[None, :-1]).logits[0]
            per_pos += F.cross_entropy(logits, window[1:], reduction="none").numpy()
    per_pos /= n
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
    assert summary.diverged and summary.val_loss == 4.2 and summary.train_loss == 3.0 and summary.curve == [(0, 4.1), (10, 4.2)]
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
    assert main(["compare", str(root / "rope.json"), "--train", str(root / "train.json"), "--seeds", "1", "--max-steps", "4", "-o", str(out)]) == 0
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
    argv = ["compare", "a b.json", "c.json", "--train", "t.json", "--lr-sweep", "1e-3,3e-3", "--seeds", "4", "--max-steps", "50",
            "--jobs", "2", "-o", "out dir"]
    args = parser.parse_args(argv)
    line = command_line(args, args.out)
    assert line == "modkit compare 'a b.json' c.json --train t.json --seeds 4 --lr-sweep 1e-3,3e-3 --max-steps 50 --jobs 2 -o 'out dir'"
    again = parser.parse_args(shlex.split(line)[1:])
    assert vars(again) == vars(args)


def test_parallel_runs_equal_serial_ones(setup, tmp_path):
    """``jobs=2`` trains the same runs in worker processes: every table figure and sweep loss equals the serial run's."""
    root, serial = setup
    parallel = compare([root / "rope.json", root / "learned.json"], root / "train.json", tmp_path / "report", seeds=2,
                       lr_sweep=LRS, jobs=2, echo=lambda line: None)
    assert parallel.n_runs == serial.n_runs == 6 and parallel.jobs == 2
    for p, s in zip(parallel.rows, serial.rows):
        assert (p.spec, p.lr, p.sweep) == (s.spec, s.lr, s.sweep)
        assert [(r.seed, r.train_loss, r.val_loss, r.curve, r.buckets) for r in p.runs] == \
               [(r.seed, r.train_loss, r.val_loss, r.curve, r.buckets) for r in s.runs]
    assert "6 training runs, 2 at a time." in parallel.report.read_text()
    assert json.loads((tmp_path / "report" / "results.json").read_text())["jobs"] == 2


def test_text_data_is_prepared_once_for_every_run(tmp_path):
    """A config naming a text file: the comparison tokenizes it once into REPORT/data, and every run reads that folder."""
    text = tmp_path / "head.txt"
    text.write_text(default_corpus().read_text()[:20_000])
    spec = tmp_path / "a.json"
    spec.write_text(json.dumps(tiny_spec(name="a")))
    cfg = {"data": "head.txt", "tokenizer": "char", "batch_size": 2, "seq_len": 16, "max_steps": 2, "warmup_steps": 0,
           "eval_interval": 2, "eval_batches": 1, "final_eval_tokens": 256, "sample_tokens": 0, "device": "cpu", "threads": 1}
    (tmp_path / "train.json").write_text(json.dumps(cfg))
    result = compare([spec], tmp_path / "train.json", tmp_path / "r", seeds=2, echo=lambda line: None)
    folders = {json.loads((r.run_dir / "data.json").read_text())["folder"] for r in result.rows[0].runs}
    assert folders == {str(tmp_path / "r" / "data")}
    assert TokenData.open(tmp_path / "r" / "data").meta["tokenizer"] and not any((r.run_dir / "data").exists() for r in result.rows[0].runs)


def test_a_failing_run_in_a_worker_raises_its_own_error(setup, tmp_path):
    """With jobs > 1 a run that fails in its worker (here: weights too large for this machine, refused before any
    allocation) raises its own error, type, message and attributes intact."""
    from modkit.errors import MemoryLimitError

    root, _ = setup
    huge = tmp_path / "huge.json"
    huge.write_text(json.dumps(tiny_spec(name="huge", d_model=16384, n_layers=64, block={
        "attention": {"type": "mha", "n_heads": 16}, "ffn": {"type": "mlp", "d_ff": 65536, "activation": "gelu"},
        "norm": {"type": "layernorm"}, "placement": {"type": "pre"}})))
    with pytest.raises(MemoryLimitError, match="would need about") as info:
        compare([root / "rope.json", huge], root / "train.json", tmp_path / "r", seeds=1, jobs=2, echo=lambda line: None)
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
    for bad, error, message in ((typo, SpecError, "final_norm: Input should be an object or null"),
                                (short, TrainError, "seq_len = 32 exceeds the model's max_seq_len = 16")):
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
    assert f"validation the score over the first 2,048 of the validation split's {n_val:,} tokens (`final_val_loss`)" \
        in result.report.read_text()


def test_moe_runs_get_an_expert_load_table(setup, tmp_path):
    """Runs whose routers report loads add the imbalance at step 0 and at the end (mean ± std over seeds, from
    their eval records) and a plot; a dense spec beside them reads n/a."""
    root, _ = setup
    moe = tmp_path / "moe.json"
    moe.write_text(json.dumps(tiny_spec(name="moe", block__ffn={
        "type": "moe", "n_experts": 4, "top_k": 2, "expert": {"type": "swiglu", "d_ff": 16},
        "router": {"type": "sigmoid_topk", "renormalize": True, "correction_bias": True, "bias_update_speed": 0.01}})))
    result = compare([moe, root / "rope.json"], root / "train.json", tmp_path / "report", seeds=2,
                     overrides={"max_steps": 4, "eval_interval": 2, "final_eval_tokens": 256}, echo=lambda line: None)
    report = result.report.read_text()
    assert "## Expert load imbalance" in report and (tmp_path / "report" / "imbalance.png").is_file()
    dirs = sorted((tmp_path / "report" / "runs").glob("moe-*"))
    curves = [[(r["step"], r["load_imbalance"]) for r in read_metrics(d / "metrics.jsonl") if r["kind"] == "eval"] for d in dirs]
    assert [r.imbalance_curve for r in result.rows[0].runs] == curves and [s for s, _ in curves[0]] == [0, 2, 4]
    start, end = mean_std([c[0][1] for c in curves]), mean_std([c[-1][1] for c in curves])
    assert f"| moe | {start[0]:.4f} ± {start[1]:.4f} | {end[0]:.4f} ± {end[1]:.4f} |" in report
    assert "| rope | n/a: no router reports expert loads | |" in report
    assert all(not r.imbalance_curve for r in result.rows[1].runs)

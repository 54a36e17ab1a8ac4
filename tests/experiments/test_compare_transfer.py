"""The learning-rate transfer table of ``modkit compare`` (widths with a grid), spec-field overrides (``--set``) and
the ``[k/N]`` progress lines."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from modkit.cli import main
from modkit.data import default_corpus, prepare
from modkit.experiments.compare import CompareError, RunSummary, SpecRow
from modkit.experiments.compare.spec_fields import edited_spec, parse_spec_field, set_field
from modkit.experiments.compare.transfer import transfer_lines, transfer_table
from modkit.experiments.stats import mean_difference

from conftest import tiny_spec


def _row(spec: str, design: str, width: int, lr: float, losses: list[float]) -> SpecRow:
    runs = [
        RunSummary(spec, lr, s, Path("."), v, v, 4.0, 1.0, False, []) for s, v in enumerate(losses)
    ]  # fmt: skip
    mean = sum(losses) / len(losses)
    return SpecRow(spec, "", 0, 0, lr, 1.0, mean, None, mean, None, 0, runs, design=design, size=(width, 2))


def test_the_transfer_table_is_the_loss_at_the_smallest_widths_rate_minus_each_widths_best():
    """Two widths, two rates, three seeds: at d_model 16 rate 0.03 wins; at 64 rate 0.01 does. The cost at 64 is the
    paired difference of the seeds' losses at 0.03 and at 0.01; at 16 it is 0."""
    l16 = {0.01: [2.50, 2.52, 2.49], 0.03: [2.40, 2.43, 2.41]}
    l64 = {0.01: [2.20, 2.22, 2.19], 0.03: [2.31, 2.36, 2.30]}
    grid = [_row("sp-d16", "sp", 16, lr, v) for lr, v in l16.items()]
    grid += [_row("sp-d64", "sp", 64, lr, v) for lr, v in l64.items()]
    rows = [grid[1], grid[2]]  # each width's winner
    table = transfer_table(rows, grid)
    assert [(t.width, t.base_lr, t.best_lr) for t in table] == [(16, 0.03, 0.03), (64, 0.03, 0.01)]
    assert table[0].difference.diff == 0.0
    expected = mean_difference(l64[0.03], l64[0.01], paired=True)
    assert table[1].difference == expected and table[1].difference.method == "paired t"
    assert table[1].at_base == pytest.approx(sum(l64[0.03]) / 3) and table[1].best == pytest.approx(sum(l64[0.01]) / 3)
    lines = transfer_lines(table)
    assert "| sp | 16 | 2 | 0.03 | 0.03 | 2.4133 | 2.4133 | 0 (the same rate wins) |" in lines
    d = expected
    assert f"| sp | 64 | 2 | 0.03 | 0.01 | 2.3233 | 2.2033 | {d.diff:+.4f} [{d.low:+.4f}, {d.high:+.4f}] |" in lines
    assert transfer_table(rows[:1], grid) == [] and transfer_table(rows, []) == []  # one width; no grid


def test_spec_fields_parse_set_and_validate_naming_the_field(tmp_path):
    assert parse_spec_field('qk:block.attention.qk_norm={"type": "rmsnorm"}') == (
        "qk",
        "block.attention.qk_norm",
        {"type": "rmsnorm"},
    )
    assert parse_spec_field("g:block.ffn.type=gelu_mlp") == ("g", "block.ffn.type", "gelu_mlp")
    with pytest.raises(CompareError, match=r"--set 'qk': write LABEL:FIELD.PATH=JSON"):
        parse_spec_field("qk")
    data = {"a": [{"b": 1}], "c": 3}
    set_field(data, "a.0.b", 2, "here")
    set_field(data, "d.e", True, "here")
    assert data == {"a": [{"b": 2}], "c": 3, "d": {"e": True}}
    with pytest.raises(CompareError, match=r"here: a.5: the list has 1 entries"):
        set_field(data, "a.5.b", 0, "here")
    with pytest.raises(CompareError, match=r"here: c.x: c is 3, not an object or a list"):
        set_field(data, "c.x", 0, "here")
    spec = tmp_path / "s.json"
    spec.write_text(json.dumps(tiny_spec()))
    edited = edited_spec("qk", spec, {"block.attention.qk_norm": {"type": "rmsnorm"}})
    assert edited["block"]["attention"]["qk_norm"]["type"] == "rmsnorm"
    with pytest.raises(CompareError) as info:
        edited_spec("qk", spec, {"block.attention.qk_norm": {"type": "rmsnrm"}})
    text = str(info.value)
    assert text.startswith('design qk: s.json with block.attention.qk_norm = {"type": "rmsnrm"} is not a valid spec')
    assert "block.attention.qk_norm.type: unknown norm type 'rmsnrm'" in text and "did you mean 'rmsnorm'" in text


@pytest.mark.slow
def test_widths_with_a_grid_report_the_transfer_table_and_set_makes_a_variant(tmp_path, capsys):
    """One spec file as two designs (``--set`` turns QK-norm on in the second) at d_model 16 and 32, a two-rate
    grid, two seeds: 16 runs with ``[k/16]`` progress; the report's transfer table equals one computed from the
    grid's runs; the variant's runs trained with QK-norm; an invalid ``--set`` is refused before anything trains."""
    text = tmp_path / "head.txt"
    text.write_text(default_corpus().read_text()[:20_000])
    prepare([text], tmp_path / "data", tokenizer="char", show_progress=False)
    spec = tmp_path / "s.json"
    spec.write_text(json.dumps(tiny_spec(name="s", n_layers=1)))
    cfg = {
        "data": str(tmp_path / "data"), "batch_size": 2, "seq_len": 16, "max_steps": 4, "warmup_steps": 1,
        "eval_interval": 4, "eval_batches": 1, "log_interval": 1, "final_eval_tokens": 256, "device": "cpu",
        "threads": 1,
    }  # fmt: skip
    (tmp_path / "train.json").write_text(json.dumps(cfg))
    args = ["compare", f"base={spec}", f"qk={spec}", "--train", str(tmp_path / "train.json"), "--seeds", "2"]
    args += ["--lr-grid", "3e-3,3e-2", "--widths", "16,32"]
    bad = args + ["--set", 'qk:block.attention.qk_norm={"type": "rmsnrm"}', "-o", str(tmp_path / "bad")]
    assert main(bad) == 1
    assert "design qk:" in capsys.readouterr().err and not (tmp_path / "bad" / "runs").exists()
    out = tmp_path / "report"
    assert main(args + ["--set", 'qk:block.attention.qk_norm={"type": "rmsnorm"}', "-o", str(out)]) == 0
    stdout = capsys.readouterr().out
    progress = re.findall(r"^\[(\d+)/16\] \d[\w ]* elapsed, about \d[\w ]* left: done ", stdout, flags=re.M)
    assert progress == [str(k) for k in range(1, 17)]
    assert (
        json.loads((out / "runs" / "qk-d32-l1-lr0.03-seed1337" / "spec.json").read_text())["block"]["attention"][
            "qk_norm"
        ]["type"]
        == "rmsnorm"
    )
    saved = json.loads((out / "results.json").read_text())
    grid = {(g["spec"], g["lr"]): [r["val_loss"] for r in g["runs"]] for g in saved["grid"]}
    chosen = {r["spec"]: r["lr"] for r in saved["rows"]}
    assert [(t["design"], t["width"]) for t in saved["transfer"]] == [
        ("base", 16),
        ("base", 32),
        ("qk", 16),
        ("qk", 32),
    ]
    report = (out / "report.md").read_text()
    assert "## Learning-rate transfer across widths" in report and "Spec fields set: qk: block.attention" in report
    for t in saved["transfer"]:
        base_lr = chosen[f"{t['design']}-d16-l1"]
        own = chosen[t["spec"]]
        expected = mean_difference(grid[(t["spec"], base_lr)], grid[(t["spec"], own)], paired=True)
        assert (t["base_lr"], t["best_lr"]) == (base_lr, own)
        assert t["difference"]["diff"] == pytest.approx(expected.diff, abs=1e-15)
        if own != base_lr:
            assert (t["difference"]["low"], t["difference"]["high"]) == pytest.approx((expected.low, expected.high))
            assert f"{expected.diff:+.4f} [{expected.low:+.4f}, {expected.high:+.4f}] |" in report

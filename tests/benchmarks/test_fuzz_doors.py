"""Smoke test of ``benchmarks/fuzz_doors.py``: every door runs on a few inputs and leaves one complete record per
input. Nothing here depends on what the outcomes are (before or after the fixes they measure), only on their
shape and on the inputs being the same from run to run."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH))

import fuzz_doors  # noqa: E402
import fuzz_doors_core as core  # noqa: E402

FIELDS = {"door", "input", "bad", "outcome", "error", "seconds", "detail"}


@pytest.mark.slow
def test_every_door_leaves_one_record_per_input(tmp_path, capsys):
    n = {"forward": 3, "prepare": 3, "resume": 2, "merge": 2, "flags": 2}
    records = fuzz_doors.fuzz(list(n), n, seed=0, timeout=60, tmp=tmp_path)
    assert [r.door for r in records] == [d for d, k in n.items() for _ in range(k)]
    for r in records:
        d = r.as_dict()
        assert set(d) == FIELDS
        assert d["outcome"] in core.CLASSES
        assert isinstance(d["bad"], bool) and isinstance(d["input"], str) and d["input"]
        assert isinstance(d["error"], str) and isinstance(d["seconds"], float)
    table = core.table(records)
    assert table.splitlines()[0].startswith("| door | inputs | bad |") and "| all | 12 |" in table
    assert "forward  3 inputs" in capsys.readouterr().out


def test_the_same_seed_gives_the_same_inputs(tmp_path):
    first = fuzz_doors.fuzz(["forward", "prepare"], 4, seed=3, tmp=tmp_path)
    again = fuzz_doors.fuzz(["forward", "prepare"], 4, seed=3, tmp=tmp_path)
    assert [(r.input, r.bad) for r in first] == [(r.input, r.bad) for r in again]
    other = fuzz_doors.fuzz(["forward"], 4, seed=4, tmp=tmp_path)
    assert [r.input for r in other] != [r.input for r in first[:4]]


def test_classification_of_a_child_result():
    c = core.Child
    assert core.classify(c(rc=None, hang=True), bad=True) == ("hang", "no answer")
    assert core.classify(c(rc=None, signal=9), bad=False)[0] == "crash-or-loss"
    assert core.classify(c(rc=0), bad=False, harm="0 tokens recorded") == ("crash-or-loss", "0 tokens recorded")
    assert core.classify(c(rc=0), bad=True, hints=["x.jsonl"])[0] == "accepted-bad"
    assert core.classify(c(rc=0, stderr="note: skipped x.jsonl\n"), bad=True, hints=["x.jsonl"])[0] == "named"
    assert core.classify(c(rc=0), bad=False)[0] == "harmless"
    err = "modkit: error: x.jsonl:3: not valid JSON\n"
    assert core.classify(c(rc=1, stderr=err, exc={"ours": True}), bad=True, hints=["x.jsonl"]) == ("named", err.strip())
    assert core.classify(c(rc=1, stderr="modkit: error: embedded null byte\n", exc={"ours": True}), bad=True,
                         hints=["x.jsonl"])[0] == "raw"  # fmt: skip
    assert core.classify(c(rc=1, stderr="modkit: internal error: KeyError: 'step'\n"), bad=True)[0] == "raw"
    assert core.classify(c(rc=1, stderr=err, exc={"ours": False}), bad=True, hints=["x.jsonl"])[0] == "raw"
    assert core.classify(c(rc=0, seconds=99), bad=False, slow_s=10)[0] == "slow"

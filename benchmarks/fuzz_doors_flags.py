"""Doors ``merge`` and ``flags`` of :mod:`fuzz_doors`.

``merge``: a real comparison of two micro specs (2 seeds, 3 steps) is written once; each input is a copy of its
report folder with ``results.json`` damaged (a fixed list: ``[]``, ``rows: "x"``, a row without ``runs``,
``val_loss: "1.0"``, truncated, binary, duplicate keys, ``size: "abc"``, ...; then mutations drawn by
``fuzz_inputs.mutate``), merged alone or after the intact folder with ``modkit compare --merge``.

``flags``: bad values of the flags of ``modkit eval`` (on the tiny run's best checkpoint), ``modkit compare`` (one
micro spec, one seed, 2 steps) and ``modkit train`` (2 steps), and a few good values beside them. An error must
name the flag (or its field).
"""

from __future__ import annotations

import copy
import json
import random
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fuzz_doors_core as core  # noqa: E402
from fuzz_doors_core import Record, fi  # noqa: E402
from fuzz_doors_runs import RECIPE, Tiny  # noqa: E402

REPO = core.REPO
#: the top-level keys of results.json that a merge reads (the others are recomputed)
MERGE_READS = {"command", "recipe", "scope", "seq_len", "eval_len", "n_buckets", "rows", "grid"}
#: free-form strings: any value is fine
MERGE_FREE = {"path", "run_dir", "buckets_note", "command", "recipe", "scope", "wall_s", "load", "cores"}


def _compare_argv(tiny: Tiny, specs, out: Path, seeds: int = 1, steps: int = 2) -> list:
    recipe = [a for a in RECIPE if a != "--no-progress"]
    return [
        "compare",
        *specs,
        "--seeds",
        str(seeds),
        "--data",
        tiny.data,
        "--max-steps",
        str(steps),
        *recipe,
        "-o",
        out,
    ]


def _fixed_merges(doc: dict) -> list[tuple[str, object, bool]]:
    """``(label, results.json text or document, bad)``: the damage a careful user's files could show."""
    row = doc["rows"][0]

    def with_row(**change):
        d = copy.deepcopy(doc)
        d["rows"][0].update(change)
        return d

    def with_run(**change):
        d = copy.deepcopy(doc)
        d["rows"][0]["runs"][0].update(change)
        return d

    no_runs = copy.deepcopy(doc)
    del no_runs["rows"][0]["runs"]
    text = json.dumps(doc, indent=1)
    return [
        ("a list", "[]", True),
        ("null", "null", True),
        ("an empty object", "{}", True),
        ('rows: "x"', {**doc, "rows": "x"}, True),
        ("rows: [1]", {**doc, "rows": [1]}, True),
        ("rows: [[]]", {**doc, "rows": [[]]}, True),
        ("a row without runs", no_runs, True),
        ('runs: "x"', with_row(runs="x"), True),
        ("runs: [1]", with_row(runs=[1]), True),
        ('val_loss_mean: "1.0"', with_row(val_loss_mean="1.0"), True),
        ('run val_loss: "1.0"', with_run(val_loss="1.0"), True),
        ("run val_loss NaN", with_run(val_loss=float("nan")), True),
        ('size: "abc"', with_row(size="abc"), True),
        ("size: [1]", with_row(size=[1]), True),
        ('params: "abc"', with_row(params="abc"), True),
        ('curve: "x"', with_run(curve="x"), True),
        ("curve: [[1]]", with_run(curve=[[1]]), True),
        ("buckets of another length", with_row(buckets=row.get("buckets", [])[:3]), True),
        ('seq_len: "x"', {**doc, "seq_len": "x"}, True),
        ("n_buckets: -1", {**doc, "n_buckets": -1}, True),
        ('grid: "x"', {**doc, "grid": "x"}, True),
        ('sweep: {"x": 1}', with_row(sweep={"x": 1}), True),
        ("truncated", text[: len(text) // 2], True),
        ("binary", bytes(range(256)) * 3, True),
        ("UTF-16", text.encode("utf-16"), True),
        ("empty", b"", True),
        ("duplicate key rows", text[:-2] + ', "rows": []\n}', True),
        (
            "duplicate key val_loss_mean",
            text.replace('"val_loss_mean":', '"val_loss_mean": 9.0, "val_loss_mean":', 1),
            True,
        ),
        ("5000-digit seq_len", text.replace('"seq_len": 16', '"seq_len": ' + "9" * 5000, 1), True),
        ("a folder named results.json", "@dir", True),
        ("unknown top-level key", {**doc, "extra": 1}, False),
    ]


def run_merge(n: int, rng: random.Random, tmp: Path, timeout: float, emit) -> None:
    tiny = Tiny.get(tmp.parent / "tiny", timeout)
    (tmp / "micro2.json").write_text(json.dumps({**json.loads(tiny.spec.read_text()), "name": "micro2", "n_layers": 1}))
    base = tmp / "base-report"
    argv = _compare_argv(tiny, [tiny.spec, tmp / "micro2.json"], base, seeds=2, steps=2)
    child = core.fork_call(core.cli_child(argv), timeout=max(timeout, 180), workdir=tmp)
    if child.rc != 0:
        raise RuntimeError(f"the base comparison failed: {child.stderr[-2000:]}")
    doc = json.loads((base / "results.json").read_text())
    cases = _fixed_merges(doc)
    while len(cases) < n:
        desc, data, bad = fi.mutate(doc, rng, free=MERGE_FREE, read=lambda p: bool(p) and str(p[0]) in MERGE_READS)
        cases.append((f"mutated: {desc}", data, bad))
    for i, (label, content, bad) in enumerate(cases[:n]):
        folder = tmp / f"report-{i}"
        shutil.rmtree(folder, ignore_errors=True)
        shutil.copytree(base, folder, symlinks=True)
        f = folder / "results.json"
        f.unlink()
        if content == "@dir":
            f.mkdir()
        elif isinstance(content, (dict, list)):
            f.write_text(json.dumps(content, indent=1))
        else:
            f.write_bytes(content if isinstance(content, bytes) else content.encode())
        both = i % 2 == 1
        out = tmp / f"merged-{i}"
        argv = ["compare", *([base] if both else []), folder, "--merge", "-o", out]
        child = core.fork_call(core.cli_child(argv), timeout=timeout, workdir=tmp)
        hints = ["results.json", folder.name]
        outcome, error = core.classify(child, bad=bad, hints=hints, slow_s=30)
        emit(
            Record(
                "merge",
                label + (" (after an intact folder)" if both else ""),
                bad,
                outcome,
                error,
                round(child.seconds, 3),
            )
        )
        shutil.rmtree(folder, ignore_errors=True)
        shutil.rmtree(out, ignore_errors=True)


# ------------------------------------------------------------------------------------------------ flags

EVAL = {
    "--seq-len": (["0", "-1", "100000"], ["32"]),
    "--batch-size": (["0", "-1"], ["2"]),
    "--stride": (["0", "-1", "100000"], ["8"]),
    "--max-tokens": (["0", "-1"], ["64"]),
    "--tasks": (["", ",", " ", "no_such_task"], []),
    "--limit": (["nan", "-1", "0", "inf"], ["2"]),
    "--num-fewshot": (["-1"], []),
    "--device": (["meta", "mps", "bogus", "cuda:99", ""], ["cpu"]),
    "--data": (["@other", "@missing", "@empty", "@run"], []),
    "--text-field": ([""], []),
    "--output": (["@dir", "@nowhere"], []),
    "--include-path": (["@missing"], []),
}
COMPARE = {
    "--spike-margin": (["nan", "-1", "inf", "-inf"], ["0.2"]),
    "--throughput-steps": (["-1"], []),
    "--tokens-per-param": (["inf", "nan", "-1", "0", "1e308", "x"], []),
    "--seeds": (["0", "-1"], []),
    "--jobs": (["0", "-1"], []),
    "--widths": (["0", "-1", "a", "16,16"], []),
    "--depths": (["0", "-1"], []),
    "--tokens": (["0", "-1", "x"], []),
    "--holdout-width": (["-1", "0"], []),
    "--lr-grid": (["nan", "-1", "0", "inf", ""], []),
    "--lr-sweep": (["nan", "-1", ""], []),
    "--override": (["x", "micro:lr=nan", "nolabel:lr=0.1", "micro:bogus=1"], []),
}
TRAIN = {
    "--device": (["meta", "mps", "bogus", "cuda:99"], []),
    "--seq-len": (["0", "-1", "128"], []),
    "--batch-size": (["0", "-1"], []),
    "--lr": (["nan", "inf", "-1", "0"], []),
    "--max-steps": (["-1", "0"], []),
    "--warmup-steps": (["-1"], []),
    "--grad-clip": (["nan", "-1", "inf"], []),
    "--eval-interval": (["0"], []),
    "--threads": (["0", "-1"], ["1"]),
    "--keep-checkpoints": (["0", "-1"], []),
    "--checkpoint-interval": (["0", "-1"], []),
    "--tokenizer": (["bpe:abc", "bpe:0", "bpe:300"], []),
    "--seed": (["-1", str(2**64)], []),
    "--sample-temperature": (["nan", "-1"], []),
    "--precision": (["float8", "int8"], []),
    "--data": (["@missing", "@empty", "@json"], []),
    "--model": (["@missing", "@garbage"], []),
    "--beta1": (["1", "nan"], []),
    "--adam-eps": (["0", "nan"], []),
    "--optimizer": (['{"type": "bogus"}', "x", '{"type": "adamw", "lr": "x"}'], []),
    "--weight-decay": (["nan"], []),
    "--schedule": (["bogus"], []),
    "--decay-steps": (["-1"], []),
    "--log-interval": (["0"], []),
    "--peak-flops": (["nan", "-1"], []),
    "--tp": (["0"], []),
}

#: what else an error may name for a value: the field inside an --override
EXTRA_HINTS = {"micro:lr=nan": ["lr"], "micro:bogus=1": ["bogus"], "nolabel:lr=0.1": ["nolabel"]}


def flag_cases() -> list[tuple[str, str, str, bool]]:
    """``(command, flag, value, bad)`` in a fixed order."""
    out = []
    for command, table in (("eval", EVAL), ("compare", COMPARE), ("train", TRAIN)):
        for flag, (bad_values, good_values) in table.items():
            out += [(command, flag, v, True) for v in bad_values]
            out += [(command, flag, v, False) for v in good_values]
    return out


def run_flags(n: int, rng: random.Random, tmp: Path, timeout: float, emit) -> None:
    tiny = Tiny.get(tmp.parent / "tiny", timeout)
    try:  # imported once here rather than in every child
        import lm_eval  # noqa: F401
        import lm_eval.tasks  # noqa: F401
    except ImportError:
        pass
    tasks = REPO / "tests" / "data" / "lm_eval_tasks"
    files = {
        "@other": tiny.other_data,
        "@missing": tmp / "missing" / "x.json",
        "@empty": tmp / "empty.txt",
        "@run": tiny.run,
        "@dir": tmp,
        "@nowhere": tmp / "no" / "such" / "out.json",
        "@json": tmp / "records.json",
        "@garbage": tmp / "garbage.json",
    }
    (tmp / "empty.txt").write_text("")
    (tmp / "records.json").write_text(json.dumps([{"text": "hello"}]))
    (tmp / "garbage.json").write_bytes(bytes(range(256)))
    cases = flag_cases()
    for i in range(n):
        command, flag, value, bad = cases[i % len(cases)]
        arg = str(files.get(value, value))
        out = tmp / f"out-{i}"
        shutil.rmtree(out, ignore_errors=True)
        if command == "eval":
            argv = ["eval", tiny.run / "best", flag, arg]
            if flag in ("--limit", "--num-fewshot", "--include-path") or (
                flag == "--tasks" and value == "no_such_task"
            ):
                argv += ["--tasks", "modkit_tiny_choice"] if flag != "--tasks" else []
                argv += ["--include-path", str(tasks)] if flag != "--include-path" else []
                argv += ["--limit", "2"] if flag != "--limit" else []
            if flag == "--text-field":
                argv += ["--data", tiny.root / "text.txt"]
        elif command == "compare":
            argv = _compare_argv(tiny, [f"micro={tiny.spec}"], out) + [flag, arg]
            if flag in ("--tokens-per-param", "--holdout-width"):  # they need sizes
                argv += ["--widths", "16,32"]
        else:
            argv = ["train", "--model", tiny.spec, "--data", tiny.data, "-o", out, "--max-steps", "2", *RECIPE]
            argv = [a for a in argv if a not in ("--device", "cpu")] if flag == "--device" else argv
            argv += [flag, arg]
        name = flag.lstrip("-")
        hints = [flag, name, name.replace("-", "_"), *EXTRA_HINTS.get(value, [])]
        if value in files:
            hints.append(Path(arg).name)
        child = core.fork_call(core.cli_child(argv), timeout=timeout, workdir=tmp)
        outcome, error = core.classify(child, bad=bad, hints=hints, slow_s=30)
        emit(Record("flags", f"{command} {flag} {value!r}", bad, outcome, error, round(child.seconds, 3)))
        shutil.rmtree(out, ignore_errors=True)

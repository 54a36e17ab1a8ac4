"""Door ``resume`` of :mod:`fuzz_doors`: damaged run folders resumed, and runs killed at every file-system step.

A tiny run (a 22K-parameter llama on 20 KB of tiny shakespeare, 4 steps, checkpoints at steps 2 and 4) is trained
once; each input is a copy of it with one thing damaged (the optimizer state, the weights, the trainer JSON, the
metrics, the checkpoints folder, the ``last`` link, the run files, or a flag of the resume), then ``modkit train
--resume RUN --max-steps 6``. A loss: a checkpoint with non-finite weights written, or a finite checkpoint that
existed before pruned while nothing finite newer was written.

Kills: a fresh ``modkit train`` of the same run in a child that counts its file-system steps inside the run folder
(Python's audit events: files opened for writing, renames, links, removals, folders made) and SIGKILLs itself just
before step ``k``; then ``--resume``, else a restart with ``-o``. A folder that is neither resumable nor
restartable is a loss (a dead end). Every step of the run is tried, up to the door's count.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import signal
import struct
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fuzz_doors_core as core  # noqa: E402
from fuzz_doors_core import Record  # noqa: E402

REPO = core.REPO
MICRO = {
    "schema_version": 1,
    "name": "micro",
    "vocab_size": 1024,
    "d_model": 32,
    "n_layers": 2,
    "max_seq_len": 64,
    "position": {"type": "rope", "theta": 10000.0},
    "block": {
        "attention": {"type": "gqa", "n_heads": 2, "n_kv_heads": 1},
        "ffn": {"type": "swiglu", "d_ff": 64},
        "norm": {"type": "rmsnorm", "eps": 1e-5},
        "placement": {"type": "pre"},
    },
    "final_norm": {"type": "rmsnorm", "eps": 1e-5},
    "tie_embeddings": False,
}
#: the recipe of every tiny run: a few steps of 2 x 16 tokens, checkpoints and evaluations every 2 steps
RECIPE = [
    "--batch-size", "2", "--seq-len", "16", "--checkpoint-interval", "2", "--eval-interval", "2",
    "--eval-batches", "1", "--sample-tokens", "0", "--final-eval-tokens", "64", "--device", "cpu",
    "--warmup-steps", "2", "--no-progress",
]  # fmt: skip


class Tiny:
    """The shared pieces, made once under ``root``: ``data`` (a prepared char folder), ``spec`` / ``other_spec``
    (micro specs, the other one wider), ``run`` (a run trained 4 steps)."""

    def __init__(self, root: Path, timeout: float):
        from modkit.data.prepare import prepare

        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        text = (REPO / "modkit" / "data" / "tinyshakespeare.txt").read_text()[:20000]
        (root / "text.txt").write_text(text)
        self.data = root / "data"
        prepare([root / "text.txt"], self.data, tokenizer="char", show_progress=False)
        (root / "digits.txt").write_text("0123456789 " * 500)
        self.other_data = root / "digits"
        prepare([root / "digits.txt"], self.other_data, tokenizer="char", show_progress=False)
        self.spec = root / "micro.json"
        self.spec.write_text(json.dumps(MICRO))
        self.other_spec = root / "wider.json"
        self.other_spec.write_text(json.dumps({**MICRO, "name": "wider", "d_model": 48}))
        self.run = root / "base-run"
        child = core.fork_call(core.cli_child(self.train_argv(self.run, 4)), timeout=max(timeout, 120), workdir=root)
        if child.rc != 0 or not (self.run / "last").exists():
            raise RuntimeError(f"the tiny base run failed: {child.stderr[-2000:]}")

    _made: dict = {}

    @classmethod
    def get(cls, root: Path, timeout: float) -> "Tiny":
        """The pieces under ``root``, made on first use (the doors of one fuzzing run share them)."""
        if root not in cls._made or not (root / "base-run" / "last").exists():
            cls._made[root] = cls(root, timeout)
        return cls._made[root]

    def train_argv(self, run: Path, steps: int) -> list[str]:
        return ["train", "--model", self.spec, "--data", self.data, "-o", run, "--max-steps", str(steps), *RECIPE]

    def copy(self, name: str) -> Path:
        dst = self.root / name
        shutil.rmtree(dst, ignore_errors=True)
        shutil.copytree(self.run, dst, symlinks=True)
        return dst


# ------------------------------------------------------------------------------------------------ damage


def _tensors(path: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(path))


def _save(path: Path, tensors: dict) -> None:
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path), metadata={"format": "pt"})


def _edit_tensors(name: str, change):
    def damage(run: Path, rng: random.Random):
        f = run / "last" / name
        t = _tensors(f)
        change(t, rng)
        _save(f, t)

    return damage


def _pick(t: dict, rng: random.Random, suffix: str) -> str:
    return rng.choice(sorted(k for k in t if k.endswith(suffix)))


def _nan(t, rng, suffix):
    k = _pick(t, rng, suffix)
    t[k] = t[k].clone()
    t[k].view(-1)[0] = float("nan")


def _edit_json(name: str, change):
    def damage(run: Path, rng: random.Random):
        f = run / "last" / name if name == "trainer.json" else run / name
        doc = json.loads(f.read_text())
        out = change(doc)
        f.write_text(out if isinstance(out, str) else json.dumps(doc if out is None else out, indent=1))

    return damage


def _bytes(rel: str, change):
    def damage(run: Path, rng: random.Random):
        f = run / rel
        f.write_bytes(change(f.read_bytes(), rng))

    return damage


def _del(d: dict, *keys):
    for k in keys[:-1]:
        d = d[k]
    d.pop(keys[-1], None)


def _shape(t, rng):
    k = _pick(t, rng, ".exp_avg")
    t[k] = t[k].new_zeros(t[k].shape[0] + 1, *t[k].shape[1:])


def _neg_sq(t, rng):
    k = _pick(t, rng, ".exp_avg_sq")
    t[k] = -t[k].abs() - 1.0


def damages() -> list[tuple[str, object, bool, list[str], list[str]]]:
    """``(label, damage(run, rng), bad, hints, extra resume flags)`` for every kind of damage."""
    import torch

    ts, tj, ms, mj = "trainer.safetensors", "trainer.json", "model.safetensors", "metrics.jsonl"
    cases: list = []

    def add(label, fn, bad=True, hints=(), flags=()):
        hints = list(hints)
        if any(h in (ts, tj, ms) for h in hints):  # a file of the last checkpoint: naming the folder names it too
            hints.append("step-0000004")
        cases.append((label, fn, bad, hints, list(flags)))

    # the optimizer state (trainer.safetensors of the last checkpoint)
    add("exp_avg of the wrong shape", _edit_tensors(ts, _shape), hints=[ts, "exp_avg", "shape"])
    add("NaN in exp_avg", _edit_tensors(ts, lambda t, r: _nan(t, r, ".exp_avg")), hints=[ts, "exp_avg", "finite"])
    add("NaN in exp_avg_sq", _edit_tensors(ts, lambda t, r: _nan(t, r, ".exp_avg_sq")), hints=[ts, "exp_avg_sq"])
    add("negative exp_avg_sq", _edit_tensors(ts, _neg_sq), hints=[ts, "exp_avg_sq", "negative"])
    add(
        "inf in exp_avg",
        _edit_tensors(ts, lambda t, r: t[_pick(t, r, ".exp_avg")].view(-1).__setitem__(0, float("inf"))),
        hints=[ts, "exp_avg"],
    )
    add(
        "exp_avg as float16",
        _edit_tensors(ts, lambda t, r: t.__setitem__(k := _pick(t, r, ".exp_avg"), t[k].half())),
        hints=[ts, "exp_avg", "dtype"],
    )
    add("a state.N.step missing", _edit_tensors(ts, lambda t, r: t.pop(_pick(t, r, ".step"))), hints=[ts, "step"])
    add("an exp_avg missing", _edit_tensors(ts, lambda t, r: t.pop(_pick(t, r, ".exp_avg"))), hints=[ts, "exp_avg"])
    add(
        "a state.N.step NaN",
        _edit_tensors(ts, lambda t, r: t.__setitem__(_pick(t, r, ".step"), torch.tensor(float("nan")))),
        hints=[ts, "step"],
    )
    add(
        "a state.N.step negative",
        _edit_tensors(ts, lambda t, r: t.__setitem__(_pick(t, r, ".step"), torch.tensor(-5.0))),
        hints=[ts, "step"],
    )
    add(
        "an extra state.999.exp_avg",
        _edit_tensors(ts, lambda t, r: t.__setitem__("state.999.exp_avg", torch.zeros(3))),
        hints=[ts, "999"],
    )
    add(
        "rng.cpu of the wrong size",
        _edit_tensors(ts, lambda t, r: t.__setitem__("rng.cpu", t["rng.cpu"][:100].clone())),
        hints=[ts, "rng"],
    )
    add(
        "rng.cpu as float32",
        _edit_tensors(ts, lambda t, r: t.__setitem__("rng.cpu", t["rng.cpu"].float())),
        hints=[ts, "rng"],
    )
    add("rng.cpu missing", _edit_tensors(ts, lambda t, r: t.pop("rng.cpu")), hints=[ts, "rng"])
    for how, fn in [
        ("truncated", lambda b, r: b[: len(b) // 2]),
        ("empty", lambda b, r: b""),
        ("garbage", lambda b, r: r.randbytes(len(b))),
        ("header length 2**60", lambda b, r: struct.pack("<Q", 2**60) + b[8:]),
    ]:
        add(f"{ts} {how}", _bytes(f"last/{ts}", fn), hints=[ts])
    # the trainer JSON
    for label, change, hints in [
        ("best_val_loss a string", lambda d: d.update(best_val_loss="abc"), ["best_val_loss"]),
        ("best_val_loss NaN", lambda d: json.dumps({**d, "best_val_loss": float("nan")}), ["best_val_loss"]),
        ("best_val_loss -1e300", lambda d: d.update(best_val_loss=-1e300), ["best_val_loss"]),
        ("step missing", lambda d: _del(d, "step"), ["step"]),
        ("step a string", lambda d: d.update(step="4"), ["step"]),
        ("step negative", lambda d: d.update(step=-1), ["step"]),
        ("step 10**20", lambda d: d.update(step=10**20), ["step"]),
        ("step disagrees with the folder", lambda d: d.update(step=3), ["step"]),
        ("tokens missing", lambda d: _del(d, "tokens"), ["tokens"]),
        ("sampler missing", lambda d: _del(d, "sampler"), ["sampler"]),
        ("sampler garbage", lambda d: d.update(sampler={"sampler": "X"}), ["sampler"]),
        ("sampler position past the data", lambda d: d["sampler"].update(step=-7), ["sampler", "step"]),
        ("param_names shuffled", lambda d: d["param_names"].reverse(), ["param_names", "parameters"]),
        ("param_names missing", lambda d: _del(d, "param_names"), ["param_names", "parameters"]),
        ("optimizer lr a string", lambda d: d["optimizer"]["param_groups"][0].update(lr="x"), ["lr", "optimizer"]),
        ("optimizer missing", lambda d: _del(d, "optimizer"), ["optimizer"]),
        ("optimizer param_groups empty", lambda d: d["optimizer"].update(param_groups=[]), ["param_groups"]),
        ("duplicate key step", lambda d: json.dumps(d)[:-1] + ', "step": 2}', ["step", "duplicate"]),
        ("truncated", lambda d: json.dumps(d)[:200], []),
        ("version 2", lambda d: d.update(version=2), ["version"]),
        ("a list", lambda d: "[]", []),
    ]:
        add(f"{tj}: {label}", _edit_json(tj, change), hints=[tj, *hints])
    # the weights of the last checkpoint
    add(f"{ms} truncated", _bytes(f"last/{ms}", lambda b, r: b[: len(b) // 2]), hints=[ms])
    add(f"{ms} empty", _bytes(f"last/{ms}", lambda b, r: b""), hints=[ms])
    add(f"{ms} NaN weights", _edit_tensors(ms, lambda t, r: _nan(t, r, ".weight")), hints=[ms, "finite", "nan"])
    add(
        f"{ms} a tensor of the wrong shape",
        _edit_tensors(ms, lambda t, r: t.__setitem__(k := _pick(t, r, ".weight"), t[k][:1].clone())),
        hints=[ms, "shape"],
    )
    add(f"{ms} a tensor missing", _edit_tensors(ms, lambda t, r: t.pop(_pick(t, r, ".weight"))), hints=[ms])
    # the metrics
    for label, text, bad in [
        ("a line without step", '{"kind": "eval", "val_loss": 1.0}\n', True),
        ("a line that is not JSON", "{not json\n", True),
        ("binary bytes", "\udcff\udcfe\x00\n", True),
        ("step a string", '{"kind": "eval", "step": "x"}\n', True),
        ("a line that is a list", "[1, 2]\n", True),
        ("blank lines", "\n\n  \n", False),
    ]:
        add(
            f"{mj}: {label}",
            _bytes(mj, lambda b, r, text=text: b + text.encode("utf-8", "surrogateescape")),
            bad=bad,
            hints=[mj, "line"],
        )
    # the checkpoints folder and the links
    add("empty stray folder checkpoints/step-abc", lambda run, r: (run / "checkpoints/step-abc").mkdir(), bad=False)
    add(
        "a checkpoint copied to checkpoints/step-abc",
        lambda run, r: shutil.copytree(run / "last", run / "checkpoints/step-abc"),
        hints=["step-abc"],
    )
    add(
        "stray file checkpoints/step-0000010",
        lambda run, r: (run / "checkpoints/step-0000010").write_text("x"),
        hints=["step-0000010"],
    )
    add(
        "empty newer folder checkpoints/step-0000009",
        lambda run, r: (run / "checkpoints/step-0000009").mkdir(),
        bad=False,
    )

    def partial(run, r):
        d = run / "checkpoints/step-0000009"
        d.mkdir()
        (d / tj).write_text((run / "last" / tj).read_text())

    add("newer step-0000009 with only trainer.json", partial, hints=["step-0000009", ts, ms])
    add(
        "stale temporary .step-0000006.tmp-123",
        lambda run, r: shutil.copytree(run / "last", run / "checkpoints/.step-0000006.tmp-123", symlinks=True),
        bad=False,
    )

    def relink(target):
        def damage(run, r):
            (run / "last").unlink()
            if target == "file":
                (run / "last").write_text("checkpoints/step-0000004\n")
            elif target == "outside":
                out = run.parent / f"{run.name}-outside"
                shutil.rmtree(out, ignore_errors=True)
                shutil.copytree(run / "checkpoints/step-0000004", out)
                os.symlink(out, run / "last")
            elif target is not None:
                os.symlink(target, run / "last")

        return damage

    add("last points outside the run", relink("outside"), hints=["last", "outside"])
    add("last dangling", relink("checkpoints/step-0000099"), hints=["last", "step-0000099"])
    add("last points to the best (model-only)", relink("checkpoints/best-0000004"), hints=["last", "best"])
    add("last points to /", relink("/"), hints=["last"])
    add("last a regular file", relink("file"), hints=["last"])
    add("last removed", relink(None), bad=False)
    # the run's own files
    add("config.json truncated", _bytes("config.json", lambda b, r: b[: len(b) // 2]), hints=["config.json"])
    add("config.json lr a string", _edit_json("config.json", lambda d: d.update(lr="x")), hints=["config.json", "lr"])
    add("config.json missing", lambda run, r: (run / "config.json").unlink(), hints=["config.json"])
    add("spec.json wider", _edit_json("spec.json", lambda d: d.update(d_model=48)), hints=["spec", "param", "shape"])
    add("spec.json missing", lambda run, r: (run / "spec.json").unlink(), hints=["spec.json"])
    add("tokenizer.json garbage", _bytes("tokenizer.json", lambda b, r: r.randbytes(200)), hints=["tokenizer.json"])
    add("data.json garbage", _bytes("data.json", lambda b, r: b"\x00\xff"), hints=["data.json"])
    # flags of the resume
    add("--model another spec", lambda run, r: None, hints=["--model", "model"], flags=["--model", "@other_spec"])
    add("--model the same spec", lambda run, r: None, bad=False, flags=["--model", "@spec"])
    add("--data another tokenizer's data", lambda run, r: None, hints=["data", "tokenizer"], flags=["--data", "@other"])
    add("--max-steps below the last step", lambda run, r: None, bad=False, flags=["--max-steps", "2"])
    add(
        "--seq-len 128 past max_seq_len",
        lambda run, r: None,
        hints=["seq_len", "max_seq_len"],
        flags=["--seq-len", "128"],
    )
    add("--resume a checkpoint folder", lambda run, r: None, hints=["checkpoint", "run"], flags=["@resume", "last"])
    add("--resume a file", lambda run, r: None, hints=["config.json", "run"], flags=["@resume", "config.json"])
    add("--resume a missing folder", lambda run, r: None, hints=["nowhere"], flags=["@resume", "nowhere"])
    return cases


# ------------------------------------------------------------------------------------------------ findings


def _finite(folder: Path) -> bool | None:
    """Whether ``folder/model.safetensors`` holds only finite values (``None``: unreadable)."""
    import torch

    try:
        return all(bool(torch.isfinite(v).all()) for v in _tensors(folder / "model.safetensors").values())
    except Exception:  # noqa: BLE001
        return None


def _checkpoints(run: Path) -> dict[str, float]:
    folder = run / "checkpoints"
    if not folder.is_dir():
        return {}
    return {
        p.name: (p / "model.safetensors").stat().st_mtime_ns if (p / "model.safetensors").is_file() else 0
        for p in folder.iterdir()
        if p.is_dir() and not p.is_symlink() and p.name.startswith(("step-", "best-"))
    }


def harm_of(run: Path, before: dict[str, float], good_before: set[str]) -> str:
    """A non-finite checkpoint written (and linked), or a finite one pruned with nothing finite newer written."""
    after = _checkpoints(run)
    written = [n for n, t in after.items() if before.get(n) != t]
    bad = [n for n in written if _finite(run / "checkpoints" / n) is False]
    linked = {
        name: (run / name).resolve().name
        for name in ("last", "best")
        if (run / name).is_symlink() and (run / name).resolve().name in bad
    }
    gone = sorted(good_before - set(after))
    good_new = [n for n in written if n.startswith("step-") and _finite(run / "checkpoints" / n)]
    if bad:
        text = f"non-finite checkpoint written: {', '.join(sorted(bad))}"
        if linked:
            text += " (" + ", ".join(f"{k} -> {v}" for k, v in linked.items()) + ")"
        if gone:
            text += f"; pruned {', '.join(gone)}"
        return text
    if gone and not good_new:
        return f"pruned good checkpoint(s) {', '.join(gone)} with nothing finite newer"
    return ""


# ------------------------------------------------------------------------------------------------ the door


def run_resume(n: int, rng: random.Random, tmp: Path, timeout: float, emit) -> None:
    """The damage kinds first (each once, in order), then kills at evenly spread file-system steps."""
    tiny = Tiny.get(tmp.parent / "tiny", timeout)
    cases = damages()
    n_damage = min(n, len(cases))
    for i, (label, damage, bad, hints, flags) in enumerate(cases[:n_damage]):
        run = tiny.copy(f"run-{i}")
        damage(run, random.Random(rng.random()))
        subst = {"@other_spec": tiny.other_spec, "@spec": tiny.spec, "@other": tiny.other_data}
        flags = [str(subst.get(f, f)) for f in flags]
        target = run
        if flags[:1] == ["@resume"]:
            target, flags = run / flags[1], flags[2:]
        before = _checkpoints(run)
        good = {k for k in before if _finite(run / "checkpoints" / k)}
        argv = ["train", "--resume", target, "--max-steps", "6", "--no-progress", *flags]
        child = core.fork_call(core.cli_child(argv), timeout=timeout, workdir=tiny.root)
        harm = harm_of(run, before, good)
        outcome, error = core.classify(child, bad=bad, hints=hints, harm=harm, slow_s=30)
        emit(Record("resume", label, bad, outcome, error, round(child.seconds, 3)))
        shutil.rmtree(run, ignore_errors=True)
        shutil.rmtree(run.parent / f"{run.name}-outside", ignore_errors=True)
    if n > n_damage:
        run_kills(n - n_damage, tiny, timeout, emit)


def _kill_hook(run: Path, k: int, log_fd: int | None):
    """A child ``before`` function: an audit hook counting file-system steps under ``run``; SIGKILL before step
    ``k`` (``k = 0``: only count, writing one line per step to ``log_fd``)."""
    writes = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
    events = {"os.rename", "os.remove", "os.rmdir", "os.mkdir", "os.symlink", "shutil.rmtree", "os.link", "os.truncate"}
    root = str(run)

    def install():
        count = [0]

        def hook(event, args):
            if event == "open":
                path, mode, flags = (list(args) + [None, None, None])[:3]
                is_write = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
                    isinstance(flags, int) and flags & writes
                )
                if not is_write:
                    return
            elif event not in events:
                return
            else:
                path = args[0] if args else None
            if not isinstance(path, (str, os.PathLike)) or not os.fspath(path).startswith(root):
                return
            count[0] += 1
            if log_fd is not None:
                os.write(log_fd, f"{count[0]} {event} {os.path.relpath(os.fspath(path), root)}\n".encode())
            if count[0] == k:
                os.kill(os.getpid(), signal.SIGKILL)

        sys.addaudithook(hook)

    return install


def run_kills(n: int, tiny: Tiny, timeout: float, emit) -> None:
    """Kill a fresh run before its ``k``-th file-system step for ``n`` values of ``k`` spread over all of them."""
    count_run = tiny.root / "count-run"
    shutil.rmtree(count_run, ignore_errors=True)
    log = tiny.root / "steps.log"
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    before = _kill_hook(count_run, 0, fd)
    core.fork_call(core.cli_child(tiny.train_argv(count_run, 4), before), timeout=timeout, workdir=tiny.root)
    os.close(fd)
    steps = log.read_text().splitlines()
    shutil.rmtree(count_run, ignore_errors=True)
    total = len(steps)
    picks = sorted({1 + (j * total) // n for j in range(n)}) if n < total else list(range(1, total + 1))
    for k in picks:
        run = tiny.root / f"kill-{k}"
        shutil.rmtree(run, ignore_errors=True)
        what = re.sub(r"tmp([.-])\d+(\.\w+)?", r"tmp\1PID", steps[k - 1].split(" ", 1)[1])
        label = f"SIGKILL before step {k}/{total} ({what})"
        child = core.fork_call(
            core.cli_child(tiny.train_argv(run, 4), _kill_hook(run, k, None)), timeout=timeout, workdir=tiny.root
        )
        if child.signal != signal.SIGKILL:
            emit(Record("resume", label, False, "harmless", "", round(child.seconds, 3), "the kill did not land"))
            continue
        resumed = core.fork_call(
            core.cli_child(["train", "--resume", run, "--max-steps", "4", "--no-progress"]),
            timeout=timeout,
            workdir=tiny.root,
        )
        seconds = child.seconds + resumed.seconds
        detail = "resumed"
        if resumed.rc == 0 and (run / "last").exists() and _finite(run / "last"):
            outcome, error = "harmless", ""
        else:
            restarted = core.fork_call(core.cli_child(tiny.train_argv(run, 4)), timeout=timeout, workdir=tiny.root)
            seconds += restarted.seconds
            if restarted.rc == 0:
                detail = "restarted"
                outcome, error = core.classify(
                    resumed, bad=True, hints=["without --resume", "start it again", "-o", "restart", "config.json"]
                )
                outcome = "named" if outcome in ("accepted-bad", "harmless") else outcome
            elif resumed.hang or restarted.hang:
                outcome, error = "hang", core.first_error_line(resumed)
            else:
                outcome = "crash-or-loss"
                error = (
                    f"dead end: resume: {core.first_error_line(resumed)} / restart: {core.first_error_line(restarted)}"
                )
        leftovers = sorted(p.name for p in run.rglob(".*tmp-*"))
        if outcome == "harmless" and leftovers:
            detail += f"; leftovers {leftovers}"
        emit(Record("resume", label, False, outcome, error[:400], round(seconds, 3), detail))
        shutil.rmtree(run, ignore_errors=True)

#!/usr/bin/env python
"""``modkit train`` against a plain-PyTorch training loop (nanoGPT's), on nanoGPT's CPU recipe, measured so it tells.

The recipe: tiny shakespeare, characters; nanoGPT's GPT with 4 layers, 4 heads, d_model 128, context 64, batch 12;
AdamW lr 1e-3 (betas 0.9/0.99, weight decay 0.1 on matrices), 100 warmup steps and a cosine decay to 1e-4 over
the run, gradient clipping at 1.0; evaluation every 250 steps (and at the end) on 20 batches of each split,
``log_interval`` 10; float32, eager, one thread (``torch.set_num_threads(1)``).

* **reference**: ``_reference_loop.py``, nanoGPT's model and ``train.py`` loop written out (``torch.optim.AdamW``
  with its CPU defaults, a ``torch.save`` checkpoint when the validation loss improves), started from modkit's
  initial weights and reading the same windows in the same order.
* **modkit**: :func:`modkit.train.train` with the same config fields (what ``modkit train --threads 1
  --final-eval-tokens 0 --sample-tokens 0`` runs), progress bar on, into a fresh run folder (``metrics.jsonl``,
  checkpoints at the evaluations). The end-of-run extras both can do differently (the whole-split validation
  score, the sample) are off on both sides.

Each run is its own process (the timing starts after the imports, ``torch._dynamo`` included, which torch imports
at the first optimizer either side builds: the model, optimizer, data and run folder setup, the evaluations and
checkpoints are all inside it; ``cpu_process`` is the whole child process's CPU time, imports included, as the
parent's ``getrusage(RUSAGE_CHILDREN)`` sees it). Repeats alternate the order (reference then modkit, then
modkit then reference, ...) so that load drifts hit both alike; every run is timed in wall time and in process CPU
time (``time.process_time``: all threads of the process, the progress bar's included), which a loaded shared
machine inflates much less than wall time. Reported: the medians, the per-repeat ratio modkit / reference, its
median, interquartile range and a bootstrap 95% interval of the median (10,000 resamples of the repeats, seed 0).
Both runs' final losses are printed: they differ only by float rounding (separate q/k/v projections against
nanoGPT's fused one, fused AdamW, and modkit's CPU defaults: linear layers through oneDNN, ``onednn_linear``).

Then, in this process, **modkit's per-step overhead**: a :class:`modkit.train.loop.Trainer` on the same config
times its full step (:meth:`~modkit.train.step.StepMixin.train_step` plus the loop's bookkeeping) and each piece
modkit adds besides forward, loss, backward, clipping and the optimizer: the data path, the learning rate per role
group, the routers' balance hooks, the non-finite check, the model's input checks, the progress bar, the metrics
line (every ``log_interval`` steps, amortised), each as a share of the median step. Usage::

    .venv/bin/python benchmarks/bench_train_vs_loop.py                   # 300 steps x 5 repeats, + overhead
    .venv/bin/python benchmarks/bench_train_vs_loop.py --full            # nanoGPT's 2,000 steps
    .venv/bin/python benchmarks/bench_train_vs_loop.py --steps 100 --repeats 3 -o /tmp/r.md

A script, not a timed test: absolute times depend on the machine and its load (both in the report).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import numpy as np  # noqa: E402
import torch  # noqa: E402

import _bench as B  # noqa: E402  (puts the repository root on sys.path)


def overrides(steps: int, compile: bool = False) -> dict:
    """The training-config fields of the recipe (nanoGPT's CPU defaults are modkit's; these fix the rest)."""
    from modkit.data import default_dataset

    return {
        "max_steps": steps,
        "device": "cpu",
        "threads": 1,
        "final_eval_tokens": 0,
        "sample_tokens": 0,
        "data": str(default_dataset()),
        "compile": compile,
    }


def clocks() -> tuple[float, float]:
    """``(wall seconds, process CPU seconds)`` now."""
    return time.perf_counter(), time.process_time()


# ------------------------------------------------------------------------------------------------ one run (child)


def run_reference(steps: int, folder: Path) -> dict:
    """One reference run; the clocks start once the weights are copied in (model construction is not timed)."""
    import _reference_loop as R
    import modkit
    from modkit.data import TokenData, eval_batches
    from modkit.train.config import load_train_config
    from modkit.train.resolve import resolve_spec

    cfg, base = load_train_config(None, overrides(steps))
    torch.set_num_threads(1)
    data = TokenData.open(cfg.data)
    spec = resolve_spec(cfg, base, data.vocab_size)
    ref = R.GPT(spec.vocab_size, cfg.seq_len, spec.n_layers, spec.block.attention.n_heads, spec.d_model)
    R.copy_from_modkit(ref, modkit.build(spec, seed=cfg.seed))
    w0, c0 = clocks()
    evals = {
        "train": eval_batches(data.train, cfg.batch_size, cfg.seq_len, cfg.eval_batches, seed=cfg.seed + 1),
        "val": eval_batches(data.val, cfg.batch_size, cfg.seq_len, cfg.eval_batches, seed=cfg.seed + 2),
    }
    out = R.run(ref, cfg, Path(cfg.data), evals, folder / "ckpt.pt")
    w1, c1 = clocks()
    return {"wall": w1 - w0, "cpu": c1 - c0, "train_loss": out["train_loss"], "val_loss": out["val_loss"]}


def run_modkit(steps: int, folder: Path, compile: bool) -> dict:
    """One ``modkit train`` run into a fresh folder, progress bar on (into this process's stdout)."""
    from modkit.train import train

    w0, c0 = clocks()
    res = train(None, folder / "run", overrides=overrides(steps, compile), progress=True, echo=lambda s: None)
    w1, c1 = clocks()
    return {"wall": w1 - w0, "cpu": c1 - c0, "train_loss": res.train_loss, "val_loss": res.val_loss}


def worker(kind: str, steps: int, compile: bool) -> None:
    """Child process: one run of ``kind``; prints one JSON line (the last line of its output)."""
    import torch._dynamo  # noqa: F401  torch's lazy import at the first optimizer either side builds: not timed

    with tempfile.TemporaryDirectory() as d:
        with contextlib.redirect_stdout(io.StringIO()):  # the progress bar renders, to nowhere
            out = run_reference(steps, Path(d)) if kind == "reference" else run_modkit(steps, Path(d), compile)
    print(json.dumps(out), flush=True)


def spawn(kind: str, steps: int, compile: bool) -> dict:
    """Run :func:`worker` in a fresh process; its JSON result."""
    cmd = [sys.executable, __file__, "--worker", kind, "--steps", str(steps)] + (["--compile"] if compile else [])
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise RuntimeError(f"{kind} run failed:\n{proc.stderr[-3000:]}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    # the whole process with its imports and any compile workers it waited for
    out["cpu_process"] = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return out


# ------------------------------------------------------------------------------------------------ statistics


def spread(ratios: list[float], resamples: int = 10_000) -> dict:
    """Median, interquartile range and a bootstrap 95% interval of the median of ``ratios`` (seed 0)."""
    r = np.asarray(ratios, dtype=float)
    boot = np.median(np.random.default_rng(0).choice(r, size=(resamples, len(r)), replace=True), axis=1)
    return {
        "median": float(np.median(r)),
        "q1": float(np.percentile(r, 25)),
        "q3": float(np.percentile(r, 75)),
        "lo": float(np.percentile(boot, 2.5)),
        "hi": float(np.percentile(boot, 97.5)),
    }


def compare_runs(steps: int, repeats: int, compile: bool) -> tuple[list[dict], list[str]]:
    """``repeats`` interleaved pairs (order alternating); per-repeat rows and the markdown lines of the result."""
    rows = []
    for r in range(repeats):
        order = ["reference", "modkit"] if r % 2 == 0 else ["modkit", "reference"]
        row = {"order": order[0], "load": B.load_average()}
        for kind in order:
            row[kind] = spawn(kind, steps, compile)
        rows.append(row)
        ref, mk = row["reference"], row["modkit"]
        print(
            f"  repeat {r + 1}/{repeats} ({order[0]} first): reference {ref['wall']:.1f} s wall / {ref['cpu']:.1f} s "
            f"CPU, modkit {mk['wall']:.1f} / {mk['cpu']:.1f} s: ratio wall {mk['wall'] / ref['wall']:.3f}, CPU "
            f"{mk['cpu'] / ref['cpu']:.3f}; load {row['load']}",
            flush=True,
        )
    lines = [
        "| repeat | first | load (1, 5, 15 min) | reference wall s | modkit wall s | wall ratio | reference CPU s | "
        "modkit CPU s | CPU ratio | val loss reference / modkit |",
        "|---:|---|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for i, row in enumerate(rows):
        ref, mk = row["reference"], row["modkit"]
        lines.append(
            f"| {i + 1} | {row['order']} | {row['load']} | {ref['wall']:.2f} | {mk['wall']:.2f} | "
            f"{mk['wall'] / ref['wall']:.3f} | {ref['cpu']:.2f} | {mk['cpu']:.2f} | {mk['cpu'] / ref['cpu']:.3f} | "
            f"{ref['val_loss']:.4f} / {mk['val_loss']:.4f} |"
        )
    lines += ["", "| clock | reference median s | modkit median s | ratio median | IQR | bootstrap 95% of median |"]
    lines.append("|---|---:|---:|---:|---|---|")
    for clock in ("wall", "cpu", "cpu_process"):
        s = spread([row["modkit"][clock] / row["reference"][clock] for row in rows])
        ref_m = B.med([row["reference"][clock] for row in rows])
        mk_m = B.med([row["modkit"][clock] for row in rows])
        lines.append(
            f"| {clock} | {ref_m:.2f} | {mk_m:.2f} | **{s['median']:.3f}** | {s['q1']:.3f}–{s['q3']:.3f} | "
            f"{s['lo']:.3f}–{s['hi']:.3f} |"
        )
    return rows, lines


# ------------------------------------------------------------------------------------------------ overhead


def per_call(fn: Callable[[], object], n: int) -> float:
    """Process CPU seconds per call of ``fn``: the median of 5 blocks of ``n // 5`` calls (at least 1 each)."""
    per_block = max(1, n // 5)
    out = []
    for _ in range(5):
        t = time.process_time()
        for _ in range(per_block):
            fn()
        out.append((time.process_time() - t) / per_block)
    return B.med(out)


def loop_step(trainer, bar) -> dict:
    """One step as :meth:`Trainer._train_until` takes it without evaluations and checkpoints: the step, then the
    metrics line and bar text every ``log_interval`` steps, else the bar's position."""
    out = trainer.train_step()
    if trainer.step % trainer.config.log_interval == 0:
        loss = float(trainer.procs.mean(out["loss"]))
        trainer._metric(trainer._train_record(out, loss, 1.0))
        bar.update(trainer.step, loss=loss, lr=out["lr"], tps=1.0)
    else:
        bar.update(trainer.step)
    return out


# size: one measurement per piece, listed in order
def overhead(steps: int, compile: bool) -> list[str]:
    """Per-step CPU time of the full step and of each piece modkit adds to it; markdown lines."""
    from modkit.nn.inputs import ForwardInputs
    from modkit.train.config import load_train_config
    from modkit.train.loop import Trainer
    from modkit.train.progress import _ProgressBar
    from modkit.train.schedule import lr_at

    torch.set_num_threads(1)
    cfg, base = load_train_config(None, overrides(steps, compile))
    with tempfile.TemporaryDirectory() as d, contextlib.redirect_stdout(io.StringIO()):
        t = Trainer(cfg, Path(d) / "run", base_dir=base, progress=False, echo=lambda s: None)
        t.setup()
        with _ProgressBar(10**9, 0, enabled=True, echo=lambda s: None) as bar:
            for _ in range(10):  # warm up (and compile, with --compile)
                out = loop_step(t, bar)
            n = max(20, min(steps, 100))
            full = per_call(lambda: loop_step(t, bar), n)
            step_only = per_call(t.train_step, n)
            x, y = t.sampler.next()
            norm = torch.nn.utils.clip_grad_norm_(t.params, float("inf"))

            def set_lr():
                lr = lr_at(t.step, cfg)
                for group in t.optimizer.param_groups:
                    group["lr"] = lr * group.get("lr_mult", 1.0)

            def metrics():
                loss = float(t.procs.mean(out["loss"]))
                t._metric(t._train_record(out, loss, 1.0))
                bar.update(t.step, loss=loss, lr=out["lr"], tps=1.0)

            pieces = [
                ("data: sampler.next() and the move to the device", lambda: [t._rows(z) for z in t.sampler.next()], 1),
                ("learning rate per role group (lr_at, lr_mult)", set_lr, 1),
                (
                    "routers' balance hooks (begin_step, end_step; no routers here)",
                    lambda: (t.balance.begin_step(), t.balance.end_step()),
                    1,
                ),
                (
                    "non-finite check (loss, gradient norm, weights; one host sync)",
                    lambda: t._nonfinite_problem(out["loss"], norm),
                    1,
                ),
                ("model input checks (ForwardInputs.prepare)", lambda: ForwardInputs.prepare(t.model, x), 1),
                ("document handling (document_mask off: one branch)", lambda: t.config.document_mask, 1),
                ("progress bar position", lambda: bar.update(t.step), 1),
                (f"metrics line + bar text (every {cfg.log_interval} steps)", metrics, cfg.log_interval),
            ]
            measured = [(name, per_call(fn, 200) / every) for name, fn, every in pieces]
    lines = [
        f"Full step (train_step + the loop's per-step bookkeeping): **{1e3 * full:.2f} ms** CPU; train_step alone "
        f"{1e3 * step_only:.2f} ms (medians of 5 blocks of {n // 5} steps).",
        "",
        "| piece modkit adds | µs per step | share of the step |",
        "|---|---:|---:|",
    ]
    for name, sec in measured:
        lines.append(f"| {name} | {1e6 * sec:.1f} | {100 * sec / full:.2f}% |")
    total = sum(sec for _, sec in measured)
    lines.append(f"| **all of them** | **{1e6 * total:.1f}** | **{100 * total / full:.2f}%** |")
    lines += [
        "",
        "Not per step: parameter roles and the optimizer's groups are resolved once at setup; the instability "
        "reading is computed by `modkit compare` from `metrics.jsonl` after the run, not in the loop.",
    ]
    return lines


# ------------------------------------------------------------------------------------------------ main


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], allow_abbrev=False)
    p.add_argument("--steps", type=int, default=300, help="optimizer steps per run (default 300)")
    p.add_argument("--repeats", type=int, default=5, help="interleaved pairs of runs (default 5)")
    p.add_argument("--full", action="store_true", help="nanoGPT's whole recipe: 2,000 steps")
    p.add_argument("--compile", action="store_true", help="modkit runs with compile = true")
    p.add_argument("--no-overhead", action="store_true", help="skip the per-step overhead measurement")
    p.add_argument("-o", "--output", default=None, help="also write the markdown report here")
    p.add_argument("--worker", choices=["reference", "modkit"], help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    steps = 2000 if args.full else args.steps
    if args.worker:
        worker(args.worker, steps, args.compile)
        return 0
    load_before, start = B.load_average(), time.perf_counter()
    print(f"load average {load_before}; torch {torch.__version__}; {steps} steps x {args.repeats} repeats", flush=True)
    _, lines = compare_runs(steps, args.repeats, args.compile)
    out = [
        f"### {steps} steps x {args.repeats} repeats{' (modkit compile = true)' if args.compile else ''}",
        "",
        f"torch {torch.__version__}, one thread per run; load average (1, 5, 15 min) before: {load_before}, "
        f"after the runs: {B.load_average()}.",
        "",
        *lines,
    ]
    if not args.no_overhead:
        out += ["", "#### modkit's per-step overhead (process CPU time, in this process)", ""]
        out += overhead(steps, args.compile)
    out += ["", f"Load average after everything: {B.load_average()}; {time.perf_counter() - start:.0f} s in all."]
    text = "\n".join(out) + "\n"
    print("\n" + text)
    if args.output:
        Path(args.output).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

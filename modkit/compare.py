"""Compare model designs under one training recipe: same data, token budget, schedule and seeds for every spec.

    from modkit.compare import compare
    result = compare(["specs/a.json", "specs/b.json"], "train.json", "reports/ab", seeds=3, lr_sweep=[1e-3, 3e-3])
    result.rows[0].val_loss_mean, result.report   # report.md, curves.png, positions.png, results.json

Every run goes through :func:`modkit.train.train` (one training loop in modkit); the runs live under
``REPORT/runs/<spec>-lr<lr>-seed<seed>``, and with ``jobs > 1`` several train at once, each in its own process.
Run ``i`` of every spec uses seed ``config.seed + i``. With a learning-rate sweep, each spec first trains its first
seed at every learning rate; the one with the lowest final validation loss (``final_val_loss``) wins and the
other seeds train at it (the sweep's run at the winner is reused). A swept run keeps the config's ``min_lr / lr``
ratio, so every learning rate follows the same schedule shape.

A run has diverged when any loss it logged is not finite, or when its last validation estimate is above its
step-0 one (the same ``eval_batches`` windows at both ends).

Position buckets: each run's best checkpoint scores the validation split at twice the training ``seq_len`` (in
non-overlapping windows of that length, at most ``final_eval_tokens`` tokens); the mean cross-entropy of the
positions in each of ``buckets`` equal slices of the window shows how a position scheme extrapolates past the
context it was trained on (Press et al. 2022, ALiBi, arXiv:2108.12409, figure 1 does the same per length). A model
whose ``max_seq_len`` is below twice ``seq_len`` cannot be scored there (learned positions): ``n/a``.
"""

from __future__ import annotations

import contextlib
import json
import math
import multiprocessing
import statistics
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable, Optional, Sequence, Union

import numpy as np
import torch
import torch.nn.functional as F

from .errors import ModkitError


class CompareError(ModkitError, ValueError):
    """A comparison cannot run as asked (no specs, bad seeds or learning rates, a taken report folder)."""


@dataclass
class RunSummary:
    """One training run of a comparison, read back from its run folder.

    Attributes:
        spec: the spec's label; lr: its peak learning rate; seed: its seed; run_dir: its folder.
        train_loss: the last ``eval`` record's train estimate; val_loss: ``final_val_loss`` (the whole validation
            split, nats / token), or the last val estimate when the config skips the final evaluation.
        initial_val_loss: the step-0 val estimate; tokens_per_s: the run's training throughput; elapsed_s: the
            run's wall time (seconds, :attr:`modkit.train.RunResult.elapsed_s`).
        diverged: a non-finite loss, or a last val estimate above the step-0 one.
        curve: ``(step, val estimate)`` of every ``eval`` record.
        buckets: mean cross-entropy per position bucket at twice ``seq_len`` (``None``: not measurable).
        val_bpb: bits per byte of the final validation score (``val_loss * tokens / bytes / ln 2``: comparable across
            tokenizers); ``None`` when the run made no final evaluation.
        imbalance_curve: ``(step, load imbalance)`` of every ``eval`` record of a model whose routers report expert
            loads (mean over layers of max load / mean load on the evaluation windows; empty without routers).
    """

    spec: str
    lr: float
    seed: int
    run_dir: Path
    train_loss: float
    val_loss: float
    initial_val_loss: float
    tokens_per_s: float
    diverged: bool
    curve: list[tuple[int, float]]
    buckets: Optional[list[float]] = None
    elapsed_s: float = 0.0
    val_bpb: Optional[float] = None
    imbalance_curve: list[tuple[int, float]] = field(default_factory=list)


@dataclass
class SpecRow:
    """A spec's line of the comparison table: counts, and mean / sample std (n - 1) over its seeds."""

    spec: str
    path: str
    params: int
    active_params: int
    lr: float
    tokens_per_s: float
    train_loss_mean: float
    train_loss_std: Optional[float]
    val_loss_mean: float
    val_loss_std: Optional[float]
    diverged: int
    runs: list[RunSummary]
    sweep: dict[float, float] = field(default_factory=dict)
    buckets: Optional[list[float]] = None
    buckets_note: str = ""
    val_bpb_mean: Optional[float] = None
    val_bpb_std: Optional[float] = None


@dataclass
class Comparison:
    """What :func:`compare` returns: one :class:`SpecRow` per spec, the report folder and its files.

    ``command`` is the command line that ran the comparison (``None`` when called from Python without one);
    ``wall_s`` the wall time of the whole comparison in seconds (every run, the position scoring, the plots);
    ``n_runs`` the training runs it made (a sweep's runs included); ``jobs`` how many ran at once.
    """

    rows: list[SpecRow]
    out_dir: Path
    report: Path
    seq_len: int
    eval_len: int
    n_buckets: int
    command: Optional[str] = None
    wall_s: float = 0.0
    n_runs: int = 0
    jobs: int = 1


# ------------------------------------------------------------------------------------------------- numbers


def mean_std(values: Sequence[float]) -> tuple[float, Optional[float]]:
    """``(mean, sample standard deviation)``; the std is ``None`` for a single value (Python's ``statistics``)."""
    values = [float(v) for v in values]
    if not all(math.isfinite(v) for v in values):
        return math.nan, None if len(values) < 2 else math.nan
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else None)


def parse_lrs(text: str) -> list[float]:
    """``"1e-3,3e-3"`` -> ``[0.001, 0.003]``.

    Raises:
        CompareError: an entry that is not a number, not finite or not positive, a repeated value, or an empty list.
    """
    out: list[float] = []
    for part in text.split(","):
        part = part.strip()
        try:
            value = float(part)
        except ValueError:
            raise CompareError(f"--lr-sweep: {part!r} is not a number; give learning rates separated by commas, e.g. 1e-3,3e-3") from None
        if not math.isfinite(value) or value <= 0:
            raise CompareError(f"--lr-sweep: {part!r} is not a positive learning rate")
        if value in out:
            raise CompareError(f"--lr-sweep: {part} is listed twice")
        out.append(value)
    return out


def read_run(run_dir: Path, spec: str, lr: float, seed: int, result: Any) -> RunSummary:
    """Summarize a finished run from its ``metrics.jsonl`` (and the :class:`~modkit.train.RunResult`)."""
    from .train.plot import read_metrics

    records = read_metrics(run_dir / "metrics.jsonl")
    evals = [r for r in records if r["kind"] == "eval"]
    finals = [r for r in records if r["kind"] == "final"]
    losses = [r["loss"] for r in records if r["kind"] == "train"]
    losses += [r[k] for r in evals for k in ("train_loss", "val_loss")] + [r["val_loss"] for r in finals]
    val = finals[-1]["val_loss"] if finals else evals[-1]["val_loss"]
    nonfinite = not all(math.isfinite(v) for v in losses)
    return RunSummary(
        spec=spec,
        lr=lr,
        seed=seed,
        run_dir=run_dir,
        train_loss=evals[-1]["train_loss"],
        val_loss=val,
        initial_val_loss=evals[0]["val_loss"],
        tokens_per_s=float(result.tokens_per_s),
        elapsed_s=float(result.elapsed_s),
        diverged=nonfinite or evals[-1]["val_loss"] > evals[0]["val_loss"],
        curve=[(r["step"], r["val_loss"]) for r in evals],
        val_bpb=finals[-1].get("val_bits_per_byte") if finals else None,
        imbalance_curve=[(r["step"], r["load_imbalance"]) for r in evals if r.get("load_imbalance") is not None],
    )


@torch.no_grad()
def position_losses(model: torch.nn.Module, tokens: np.ndarray, length: int, max_tokens: int, *, batch: int = 8) -> np.ndarray:
    """Mean cross-entropy per position ``[length]`` over non-overlapping windows of ``length`` tokens.

    Window ``w`` holds inputs ``tokens[w * length : (w + 1) * length]`` and their next tokens; the windows cover
    at most the first ``max_tokens + 1`` tokens (at least one window). Position ``p``'s loss is the mean over
    windows of the cross-entropy (nats) of predicting token ``p + 1`` from tokens ``0..p`` of its window.

    Raises:
        CompareError: ``tokens`` is shorter than ``length + 1``.
    """
    n = (min(len(tokens), max(max_tokens, length) + 1) - 1) // length
    if n < 1:
        raise CompareError(f"the validation split has {len(tokens)} tokens, fewer than the {length + 1} one window of {length} needs")
    device = next(model.parameters()).device
    sums = torch.zeros(length, dtype=torch.float64)
    for b in range(0, n, batch):
        rows = np.stack([tokens[s * length : s * length + length + 1] for s in range(b, min(b + batch, n))]).astype(np.int64)
        rows = torch.from_numpy(rows).to(device)
        logits = model(rows[:, :-1]).logits.float()
        ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), rows[:, 1:].reshape(-1), reduction="none")
        sums += ce.view(len(rows), length).double().sum(0).cpu()
    return (sums / n).numpy()


def bucket_means(per_position: np.ndarray, n_buckets: int) -> list[float]:
    """Mean of ``per_position`` over ``n_buckets`` consecutive, (nearly) equal slices of the positions."""
    return [float(chunk.mean()) for chunk in np.array_split(per_position, n_buckets)]


# ------------------------------------------------------------------------------------------------- runs


def _label_specs(paths: Sequence[Union[str, Path]]) -> list[tuple[str, Path]]:
    out, seen = [], {}
    for p in paths:
        path = Path(p)
        if not path.is_file():
            raise CompareError(f"spec {p}: no such file; give spec .json files")
        stem = path.stem
        seen[stem] = seen.get(stem, 0) + 1
        out.append((stem if seen[stem] == 1 else f"{stem}-{seen[stem]}", path.resolve()))
    return out


def _train_run(config: Any, run_dir: Path, overrides: dict[str, Any]) -> SimpleNamespace:
    """One training run of a comparison (in this process, or in a worker process with ``jobs > 1``)."""
    from .train import train

    result = train(config, run_dir, overrides=overrides, echo=lambda line: None)
    return SimpleNamespace(tokens_per_s=result.tokens_per_s, elapsed_s=result.elapsed_s)


def compare(
    specs: Sequence[Union[str, Path]],
    config: Union[str, Path, dict, None],
    out_dir: Union[str, Path],
    *,
    seeds: int = 3,
    lr_sweep: Optional[Sequence[float]] = None,
    overrides: Optional[dict[str, Any]] = None,
    n_buckets: int = 8,
    jobs: int = 1,
    command: Optional[str] = None,
    echo: Callable[[str], None] = print,
) -> Comparison:
    """Train every spec under one training config and write a report folder.

    The runs are independent: with ``jobs > 1`` up to ``jobs`` of them train at once, each in its own process
    (``spawn``), and each gives the same losses as it would alone (every run is seeded; on CPU each uses the config's
    ``threads``, so ``jobs x threads`` should not exceed the cores). The first seed of every spec (at every swept
    learning rate) trains first, then the other seeds at each spec's winning rate.

    Args:
        specs: spec JSON files (labelled by file name).
        config: the training config (file, dict or ``None`` for the defaults); its ``model`` is replaced by each spec.
        out_dir: the report folder (``report.md``, ``curves.png``, ``positions.png``, ``results.json``, ``runs/``,
            and ``data/`` when the config names text files rather than a prepared folder).
        seeds: runs per spec, seeds ``config.seed + 0 .. seeds - 1``.
        lr_sweep: learning rates to try on the first seed of each spec (``None``: the config's ``lr``).
        overrides: training-config fields to replace for every run (e.g. ``{"max_steps": 100}``).
        n_buckets: position buckets of the extrapolation table.
        jobs: training runs at once (1: one after another, in this process).
        command: the command line that runs this comparison, recorded in ``report.md`` and ``results.json`` so a
            published report says how to regenerate it (``modkit compare`` passes its own).
        echo: where progress lines go.

    Returns:
        :class:`Comparison`.

    Raises:
        CompareError: no specs, ``seeds < 1``, ``jobs < 1``, an empty or invalid sweep, a missing spec file, a report
            folder that already holds a comparison or runs.
        SpecError / TrainError / DataError: an invalid config or spec, a spec that does not fit the config or data
            (every spec is checked before the first run), missing data; or from :func:`modkit.train.train`.
    """
    import modkit
    from .data import TokenData
    from .train import load_train_config
    from .train.loop import _resolve_device, prepared_data, resolve_spec

    started = time.perf_counter()
    if not specs:
        raise CompareError("give at least one spec to compare")
    if seeds < 1:
        raise CompareError(f"seeds = {seeds}: give 1 or more")
    if jobs < 1:
        raise CompareError(f"jobs = {jobs}: give 1 or more")
    if n_buckets < 1:
        raise CompareError(f"n_buckets = {n_buckets}: give 1 or more")
    if lr_sweep is not None and not lr_sweep:
        raise CompareError("the learning-rate sweep is empty; give one or more learning rates or none")
    labelled = _label_specs(specs)
    base, base_dir = load_train_config(config, {**(overrides or {}), "model": str(labelled[0][1])})  # fail early, whole config
    out = Path(out_dir)
    if (out / "results.json").exists():
        raise CompareError(f"{out} already holds a comparison; choose another report folder")
    if (out / "runs").is_dir() and any((out / "runs").iterdir()):
        raise CompareError(f"{out / 'runs'} already holds runs (of a comparison that stopped?); choose another report "
                           "folder or delete that one")
    (out / "runs").mkdir(parents=True, exist_ok=True)
    lrs = list(lr_sweep) if lr_sweep else [base.lr]
    data_folder = str(prepared_data(base, base_dir, out / "data"))  # every run reads these same tokens
    vocab_size = TokenData.open(data_folder, verify=False).vocab_size
    for _, path in labelled:  # every spec against the config and data before any run trains: a typo costs no runs
        resolve_spec(load_train_config(config, {**(overrides or {}), "model": str(path)})[0], base_dir, vocab_size)

    def execute(pool: Optional[ProcessPoolExecutor], runs: list[tuple[str, Path, float, int]]) -> list[RunSummary]:
        calls = []
        for label, path, lr, i in runs:
            seed = base.seed + i
            changes = {**(overrides or {}), "model": str(path), "seed": seed, "lr": lr, "data": data_folder,
                       "min_lr": min(lr, base.min_lr * lr / base.lr), "sample_tokens": 0}
            run_dir = out / "runs" / f"{label}-lr{lr:g}-seed{seed}"
            echo(f"{label}: lr {lr:g}, seed {seed} -> {run_dir}")
            calls.append((config, run_dir, changes))
        summaries: list[Any] = [None] * len(calls)  # filled as the runs finish, in any order

        def finish(k: int, result: SimpleNamespace) -> None:
            (label, _, lr, _), (_, run_dir, changes) = runs[k], calls[k]
            summaries[k] = read_run(run_dir, label, lr, changes["seed"], result)
            echo(f"done {run_dir.name}: validation loss {summaries[k].val_loss:.4f}, {result.elapsed_s:.0f} s")

        if pool is None:
            for k, call in enumerate(calls):
                finish(k, _train_run(*call))
            return summaries
        futures = {pool.submit(_train_run, *call): k for k, call in enumerate(calls)}
        try:
            for future in as_completed(futures):
                finish(futures[future], future.result())
        except BaseException:
            for future in futures:
                future.cancel()  # a failed run stops the queue (runs already training finish)
            raise
        return summaries

    workers = ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn")) if jobs > 1 else contextlib.nullcontext()
    with workers as pool:
        first = execute(pool, [(label, path, lr, 0) for label, path in labelled for lr in lrs])
        sweeps = {label: first[k * len(lrs):(k + 1) * len(lrs)] for k, (label, _) in enumerate(labelled)}
        best = {label: min(runs, key=lambda r: r.val_loss if math.isfinite(r.val_loss) else math.inf) for label, runs in sweeps.items()}
        rest = execute(pool, [(label, path, best[label].lr, i) for label, path in labelled for i in range(1, seeds)])
    n_runs = len(first) + len(rest)

    rows: list[SpecRow] = []
    for k, (label, path) in enumerate(labelled):
        sweep = {r.lr: r.val_loss for r in sweeps[label]}
        runs = [best[label]] + rest[k * (seeds - 1):(k + 1) * (seeds - 1)]
        spec = modkit.load_spec(best[label].run_dir / "spec.json")  # as trained: vocab_size set from the data
        train_mean, train_std = mean_std([r.train_loss for r in runs])
        val_mean, val_std = mean_std([r.val_loss for r in runs])
        bpb_mean, bpb_std = mean_std([r.val_bpb for r in runs]) if all(r.val_bpb is not None for r in runs) else (None, None)
        rows.append(SpecRow(
            spec=label, path=str(path), params=modkit.count_params(spec), active_params=modkit.active_params_per_token(spec),
            lr=best[label].lr, tokens_per_s=statistics.fmean(r.tokens_per_s for r in runs),
            train_loss_mean=train_mean, train_loss_std=train_std, val_loss_mean=val_mean, val_loss_std=val_std,
            diverged=sum(r.diverged for r in runs),
            runs=runs, sweep=sweep if lr_sweep else {}, val_bpb_mean=bpb_mean, val_bpb_std=bpb_std,
        ))

    # position buckets at twice the training context
    eval_len = 2 * base.seq_len
    device = _resolve_device(base.device)
    val_tokens = TokenData.open(data_folder, verify=False).val
    for row in rows:
        spec = modkit.load_spec(row.runs[0].run_dir / "spec.json")
        if spec.max_seq_len < eval_len:
            row.buckets_note = f"n/a: max_seq_len = {spec.max_seq_len} < {eval_len}"
            continue
        if len(val_tokens) < eval_len + 1:
            row.buckets_note = f"n/a: the validation split has {len(val_tokens)} tokens, fewer than {eval_len + 1}"
            continue
        for r in row.runs:
            model = modkit.load(r.run_dir / "best", device=device).eval()
            r.buckets = bucket_means(position_losses(model, val_tokens, eval_len, base.final_eval_tokens or eval_len), n_buckets)
        row.buckets = [float(np.mean(col)) for col in zip(*(r.buckets for r in row.runs))]

    result = Comparison(rows=rows, out_dir=out, report=out / "report.md", seq_len=base.seq_len, eval_len=eval_len,
                        n_buckets=n_buckets, command=command, n_runs=n_runs, jobs=jobs)
    plot_curves(rows, out / "curves.png")
    if any(r.imbalance_curve for row in rows for r in row.runs):
        plot_curves(rows, out / "imbalance.png", imbalance=True)
    if any(row.buckets for row in rows):
        plot_buckets(result, out / "positions.png")
    result.wall_s = time.perf_counter() - started
    write_report(result, base, data_folder, lr_sweep=bool(lr_sweep))
    saved = {"command": command, "wall_s": result.wall_s, "n_runs": n_runs, "jobs": jobs, "rows": [_row_json(r) for r in rows]}
    (out / "results.json").write_text(json.dumps(saved, indent=1, default=str) + "\n")
    return result


def _row_json(row: SpecRow) -> dict:
    data = asdict(row)
    data["sweep"] = {f"{k:g}": v for k, v in row.sweep.items()}
    return data


# ------------------------------------------------------------------------------------------------- report


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_curves(rows: Sequence[SpecRow], out: Path, *, imbalance: bool = False) -> Path:
    """Validation estimates (or, with ``imbalance``, expert load imbalances) against optimizer steps: one colour per
    spec, one thin line per seed."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=110)
    for i, row in enumerate(rows):
        colour = f"C{i % 10}"
        for j, r in enumerate(row.runs):
            curve = r.imbalance_curve if imbalance else r.curve
            if not curve:
                continue
            steps, vals = zip(*curve)
            ax.plot(steps, vals, color=colour, lw=0.9, alpha=0.8, label=f"{row.spec} (lr {row.lr:g})" if j == 0 else None)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("max expert load / mean load (mean over MoE layers)" if imbalance else "validation cross-entropy (nats / token)")
    ax.set_title("expert load imbalance on the evaluation windows, every seed" if imbalance else "validation loss, every seed")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)
    return out


def plot_buckets(result: Comparison, out: Path) -> Path:
    """Mean loss per position bucket (mean over seeds) with the training context marked."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=110)
    edges = np.array_split(np.arange(result.eval_len), result.n_buckets)
    mids = [float(e.mean()) for e in edges]
    for i, row in enumerate(result.rows):
        if row.buckets:
            ax.plot(mids, row.buckets, "o-", color=f"C{i % 10}", ms=3, label=row.spec)
    ax.axvline(result.seq_len - 0.5, color="k", ls="--", lw=0.8, label=f"training seq_len {result.seq_len}")
    ax.set_xlabel("position in the window")
    ax.set_ylabel("validation cross-entropy (nats / token)")
    ax.set_title(f"loss by position at context {result.eval_len}")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)
    return out


def fmt_pm(mean: float, std: Optional[float]) -> str:
    """``"1.2345 ± 0.0123"`` (the std left out for one seed)."""
    return f"{mean:.4f}" if std is None else f"{mean:.4f} ± {std:.4f}"


def _validation_scope(config: Any, data_folder: str) -> str:
    """What a run's validation loss covers: the whole split, its first N tokens, or the last estimate."""
    from .data import TokenData

    if not config.final_eval_tokens:
        return f"the last estimate on {config.eval_batches} fixed batches (the config skips the final evaluation)"
    n_val = len(TokenData.open(data_folder, verify=False).val)
    whole = (n_val - 1) // config.seq_len * config.seq_len
    scored = min(n_val - 1, config.final_eval_tokens) // config.seq_len * config.seq_len
    if scored >= whole:
        return f"the score over the whole validation split (`final_val_loss`, {scored:,} tokens)"
    return f"the score over the first {scored:,} of the validation split's {n_val:,} tokens (`final_val_loss`)"


def _imbalance_section(rows: Sequence[SpecRow]) -> list[str]:
    """The expert-load table and plot of a comparison whose runs have routers that report loads (else nothing)."""
    if not any(r.imbalance_curve for row in rows for r in row.runs):
        return []
    lines = [
        "## Expert load imbalance", "",
        "Max expert load / mean expert load on the fixed evaluation windows (1 = every expert gets the same number of "
        "token assignments), mean over the MoE layers, then mean ± sample std over seeds.", "",
        "| spec | load imbalance at step 0 | load imbalance at the end |", "|---|---:|---:|",
    ]
    for row in rows:
        if not all(r.imbalance_curve for r in row.runs):
            lines.append(f"| {row.spec} | n/a: no router reports expert loads | |")
            continue
        first, last = (mean_std([r.imbalance_curve[i][1] for r in row.runs]) for i in (0, -1))
        lines.append(f"| {row.spec} | {fmt_pm(*first)} | {fmt_pm(*last)} |")
    return lines + ["", "![expert load imbalance of every run](imbalance.png)", ""]


def write_report(result: Comparison, config: Any, data_folder: str, *, lr_sweep: bool) -> Path:
    """``report.md``: the recipe, the table, the sweep, the curves and the position buckets."""
    rows = result.rows
    seeds = len(rows[0].runs)
    pace = "one at a time" if result.jobs == 1 else f"{result.jobs} at a time"
    lines = [
        "# Design comparison",
        "",
        f"Every spec trained on the same data (`{data_folder}`), {config.total_steps} steps of {config.tokens_per_step:,} tokens "
        f"(batch {config.batch_size} x grad_accum {config.grad_accum} x seq_len {config.seq_len}), {config.schedule} schedule "
        f"with {config.warmup_steps} warmup steps, seeds {config.seed}..{config.seed + seeds - 1}. "
        "Losses are cross-entropy in nats per token: train is the last estimate on fixed training windows, validation "
        f"{_validation_scope(config, data_folder)}; bits per byte is that validation score per UTF-8 byte of the scored "
        "text (loss x tokens / bytes / ln 2), which does not depend on the tokenizer; mean ± sample std over seeds. "
        "A run diverged when a loss was not "
        "finite or its last validation estimate ended above its step-0 one.",
        "",
    ]
    if result.command:
        lines += ["Generated by:", "", "```bash", result.command, "```", ""]
    lines += [
        f"Wall time of the whole comparison: {result.wall_s:,.0f} s ({result.wall_s / 60:.1f} min) for {result.n_runs} "
        f"training runs, {pace}.",
        "",
        "| spec | parameters | active parameters | lr | tokens/s | train loss | validation loss | validation bits/byte | diverged |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        bpb = fmt_pm(r.val_bpb_mean, r.val_bpb_std) if r.val_bpb_mean is not None else "n/a"
        lines.append(
            f"| {r.spec} | {r.params:,} | {r.active_params:,} | {r.lr:g} | {r.tokens_per_s:,.0f} | "
            f"{fmt_pm(r.train_loss_mean, r.train_loss_std)} | {fmt_pm(r.val_loss_mean, r.val_loss_std)} | {bpb} | {r.diverged}/{len(r.runs)} |"
        )
    if lr_sweep:
        lrs = sorted({lr for r in rows for lr in r.sweep})
        lines += ["", "## Learning-rate sweep", "",
                  f"Seed {config.seed} of each spec at every learning rate (validation loss); the lowest wins and the other seeds train at it.",
                  "", "| spec | " + " | ".join(f"lr {lr:g}" for lr in lrs) + " | winner |",
                  "|---|" + "---:|" * len(lrs) + "---:|"]
        for r in rows:
            cells = [f"**{r.sweep[lr]:.4f}**" if lr == r.lr else f"{r.sweep[lr]:.4f}" for lr in lrs]
            lines.append(f"| {r.spec} | " + " | ".join(cells) + f" | {r.lr:g} |")
        lines += [""] + [f"- {r.spec}: learning rate {r.lr:g} won." for r in rows]
    lines += ["", "## Validation loss", "", "![validation loss of every run](curves.png)", ""]
    lines += _imbalance_section(rows)
    edges = np.array_split(np.arange(result.eval_len), result.n_buckets)
    lines += [
        f"## Loss by position at context {result.eval_len} (trained at {result.seq_len})", "",
        "Best checkpoint of each run on the validation split in windows of "
        f"{result.eval_len} tokens; mean loss of the positions in each bucket, mean over seeds. Buckets past "
        f"position {result.seq_len - 1} are beyond the training context.", "",
        "| spec | " + " | ".join(f"{int(e[0])}-{int(e[-1])}" for e in edges) + " |",
        "|---|" + "---:|" * len(edges),
    ]
    for r in rows:
        cells = [f"{v:.4f}" for v in r.buckets] if r.buckets else [r.buckets_note] + [""] * (len(edges) - 1)
        lines.append(f"| {r.spec} | " + " | ".join(cells) + " |")
    if any(r.buckets for r in rows):
        lines += ["", "![loss by position](positions.png)"]
    lines += ["", "## Runs", "", "| spec | lr | seed | train loss | validation loss | diverged | folder |", "|---|---:|---:|---:|---:|---|---|"]
    for r in rows:
        for run in r.runs:
            lines.append(f"| {r.spec} | {run.lr:g} | {run.seed} | {run.train_loss:.4f} | {run.val_loss:.4f} | "
                         f"{'yes' if run.diverged else 'no'} | runs/{run.run_dir.name} |")
    result.report.write_text("\n".join(lines) + "\n")
    return result.report

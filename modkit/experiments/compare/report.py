"""The report of a comparison: the verdicts (:func:`verdicts_of`), ``report.md`` section by section
(:func:`write_report`), and the files of a report folder (:func:`write_files`: the plots, ``report.md`` and
``results.json``, whose rows :func:`_row_from_json` reads back); :func:`write_partial` when a step after training
failed.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np

from .plan import CompareRequest
from .plots import plot_buckets, plot_curves, plot_lr, plot_train_curves
from .results import CompareError, Comparison, RunSummary, SpecRow, Verdict, fmt_pm, mean_std
from .stalls import STALL_SHARE, stall_text
from .transfer import transfer_lines, transfer_table


def verdicts_of(rows: Sequence[SpecRow], grid: Sequence[SpecRow] = (), *, metric: str = "val_loss") -> list[Verdict]:
    """Each design against the first at every size (chosen learning rates), and with a grid at every rate.

    ``metric`` is the :class:`RunSummary` field compared: ``"val_loss"`` (the validation loss at the training length)
    or ``"long_val_loss"`` (at twice it). Paired over seeds when both rows ran the same seeds
    (:func:`modkit.experiments.stats.mean_difference`). Rows with a non-finite or missing value are skipped (a diverged
    run has no loss to compare; a model that cannot read twice the training length has no long loss); with
    ``"long_val_loss"`` the first row that has one is the reference.

    Raises:
        CompareError: an unknown ``metric``.
    """
    from modkit.experiments.stats import mean_difference

    if metric not in ("val_loss", "long_val_loss"):
        raise CompareError(f"metric = {metric!r}: give 'val_loss' or 'long_val_loss'")
    out: list[Verdict] = []

    def values(row: SpecRow) -> Optional[list[float]]:
        got = [getattr(r, metric) for r in row.runs]
        return got if all(x is not None and math.isfinite(x) for x in got) else None

    def pairs(items: Sequence[SpecRow], lr: Optional[float]) -> None:
        by_size: dict[tuple, list[SpecRow]] = {}
        for r in items:
            by_size.setdefault(r.size, []).append(r)
        for group in by_size.values():
            if metric != "val_loss":  # rows a metric does not reach are left out, the reference included
                group = [r for r in group if values(r) is not None]
            if not group:
                continue
            first = group[0]
            for other in group[1:]:
                if other.design == first.design and other.design:
                    continue
                a, b = values(other), values(first)
                if a is None or b is None:
                    continue
                paired = [r.seed for r in other.runs] == [r.seed for r in first.runs]
                out.append(Verdict(other.spec, first.spec, lr, mean_difference(a, b, paired=paired), metric))

    pairs(rows, None)
    lrs = sorted({r.lr for r in grid})
    for lr in lrs:
        pairs([r for r in grid if r.lr == lr], lr)
    return out


def _recipe(config: Any, data_folder: str, request: CompareRequest) -> str:
    """The paragraph that says how every run was trained (``config``: the base training config)."""
    tokens_per_param, tokens = request.tokens_per_param, request.tokens
    steps = (
        f"steps of {config.tokens_per_step:,} tokens (batch {config.batch_size} x grad_accum "
        f"{config.grad_accum} x seq_len {config.seq_len})"
    )
    budget = f"{config.total_steps} {steps}"
    if tokens_per_param:
        ratios = ", ".join(f"{r:g}" for r in tokens_per_param)
        budget = f"a token budget per size of {ratios} tokens per parameter, in {steps}"
    elif tokens:
        budget = (
            f"an explicit token budget per size ({', '.join(f'{t:,}' for t in tokens)}), in steps of "
            f"{config.tokens_per_step:,} tokens"
        )
    opt = config.optimizer.get("type", "adamw")
    seeds = request.seeds
    text = (
        f"Every spec trained on the same data (`{data_folder}`), {budget}, {config.schedule} schedule with "
        f"{config.warmup_steps} warmup steps, optimizer {opt}, seeds {config.seed}..{config.seed + seeds - 1}."
    )
    if request.spec_fields:
        text += (
            " Spec fields set: "
            + "; ".join(
                f"{label}: " + ", ".join(f"{k} = {json.dumps(v)}" for k, v in f.items())
                for label, f in request.spec_fields.items()
            )
            + "."
        )
    if request.spec_overrides:
        text += (
            " Per spec: "
            + "; ".join(
                f"{label}: " + ", ".join(f"{k} = {json.dumps(v)}" for k, v in f.items())
                for label, f in request.spec_overrides.items()
            )
            + "."
        )
    return text


# ------------------------------------------------------------------------------------------------- results.json


def _row_json(row: SpecRow) -> dict:
    data = asdict(row)
    data["sweep"] = {f"{k:g}": v for k, v in row.sweep.items()}
    return data


def _row_from_json(data: dict) -> SpecRow:
    """A :class:`SpecRow` as ``results.json`` holds it (``rows`` or ``grid``), its runs included; fields an older
    report lacks get their defaults, fields this version does not know are left out."""
    runs = []
    for r in data["runs"]:
        r = dict(r)
        r["run_dir"] = Path(r["run_dir"])
        r["curve"] = [tuple(x) for x in r.get("curve", [])]
        r["train_curve"] = [tuple(x) for x in r.get("train_curve", [])]
        r["grad_curve"] = [tuple(x) for x in r.get("grad_curve", [])]
        r["imbalance_curve"] = [tuple(x) for x in r.get("imbalance_curve", [])]
        r["load"] = tuple(r.get("load", (math.nan, math.nan)))
        runs.append(RunSummary(**{k: v for k, v in r.items() if k in RunSummary.__dataclass_fields__}))
    fields = {k: v for k, v in data.items() if k in SpecRow.__dataclass_fields__ and k not in ("runs", "sweep")}
    fields["size"] = tuple(fields.get("size", (0, 0)))
    row = SpecRow(**fields, runs=runs, sweep={float(k): v for k, v in data.get("sweep", {}).items()})
    return row


def _plot_all(result: Comparison) -> None:
    """Every plot the report links: curves, training curves, and those of the sections that apply."""
    out = result.out_dir
    plot_curves(result.rows, out / "curves.png")
    plot_train_curves(result.rows, out / "train-curves.png", out / "grad-norm.png")
    if any(r.imbalance_curve for row in result.rows for r in row.runs):
        plot_curves(result.rows, out / "imbalance.png", imbalance=True)
    if any(row.buckets for row in result.rows):
        plot_buckets(result, out / "positions.png")
    if any(row.sweep for row in result.rows):
        plot_lr(result.rows, out / "lr.png")
    if result.ladder is not None:
        from modkit.experiments.ladder import plot_ladder

        plot_ladder(result.ladder, out / "ladder.png")


def write_files(result: Comparison, config: Any, data_folder: str, *, started: float) -> None:
    """Plots, ``report.md`` and ``results.json`` of a comparison; ``started`` is the :func:`time.perf_counter`
    reading at which it began (the wall time runs to now), ``config`` the base training config (``None``: merged)."""
    out = result.out_dir
    _plot_all(result)
    result.wall_s = time.perf_counter() - started
    scope = _validation_scope(config, data_folder) if config is not None else "as each source report says"
    write_report(result, scope, lr_sweep=result.mode == "sweep")
    saved = {
        "command": result.command,
        "wall_s": result.wall_s,
        "n_runs": result.n_runs,
        "jobs": result.jobs,
        "mode": result.mode,
        "seq_len": result.seq_len,
        "eval_len": result.eval_len,
        "n_buckets": result.n_buckets,
        "recipe": result.recipe,
        "scope": scope,
        "sources": result.sources,
        "rows": [_row_json(r) for r in result.rows],
        "grid": [_row_json(r) for r in result.grid],
        "all_runs": [asdict(r) for r in result.all_runs],
        "verdicts": [v.to_json() for v in result.verdicts],
        "long_verdicts": [v.to_json() for v in result.long_verdicts],
        "throughput": result.throughput,
        "ladder": result.ladder.to_json() if result.ladder is not None else None,
        "transfer": [t.to_json() for t in transfer_table(result.rows, result.grid)],
    }
    (out / "results.json").write_text(json.dumps(saved, indent=1, default=str) + "\n")


# ------------------------------------------------------------------------------------------------- report.md


def _validation_scope(config: Any, data_folder: str) -> str:
    """What a run's validation loss covers: the whole split, its first N tokens, or the last estimate."""
    from modkit.data import TokenData

    if not config.final_eval_tokens:
        return f"the last estimate on {config.eval_batches} fixed batches (the config skips the final evaluation)"
    n_val = len(TokenData.open(data_folder, verify=False).val)
    whole = (n_val - 1) // config.seq_len * config.seq_len
    scored = min(n_val - 1, config.final_eval_tokens) // config.seq_len * config.seq_len
    if scored >= whole:
        return f"the score over the whole validation split (`final_val_loss`, {scored:,} tokens)"
    return f"the score over the first {scored:,} of the validation split's {n_val:,} tokens (`final_val_loss`)"


def _imbalance_section(rows: Sequence[SpecRow]) -> list[str]:
    """The expert-load table and plot of a comparison whose runs have routers that report loads (else nothing); a
    row without routers is named under the table, not filled in."""
    if not any(r.imbalance_curve for row in rows for r in row.runs):
        return []
    lines = [
        "## Expert load imbalance",
        "",
        "Max expert load / mean expert load on the fixed evaluation windows (1 = every expert gets the same number of "
        "token assignments), mean over the MoE layers, then mean ± sample std over seeds.",
        "",
        "| spec | load imbalance at step 0 | load imbalance at the end |",
        "|---|---:|---:|",
    ]
    left = []
    for row in rows:
        if not all(r.imbalance_curve for r in row.runs):
            left.append(row.spec)
            continue
        first, last = (mean_std([r.imbalance_curve[i][1] for r in row.runs]) for i in (0, -1))
        lines.append(f"| {row.spec} | {fmt_pm(*first)} | {fmt_pm(*last)} |")
    if left:
        lines += ["", "Not in this table (no router reports expert loads): " + ", ".join(left) + "."]
    return lines + ["", "![expert load imbalance of every run](imbalance.png)"]


def _load_note(rows: Sequence[SpecRow]) -> str:
    """What the tokens/s column was measured under (the load averages the runs saw)."""
    loads = [x for r in rows for run in r.runs for x in run.load if math.isfinite(x)]
    cores = max((run.cores for r in rows for run in r.runs), default=0)
    if not loads or not cores:
        return "tokens/s: each run's training throughput (the load it ran under was not recorded)."
    lo, hi = min(loads), max(loads)
    shared = hi > 0.75 * cores
    text = (
        f"tokens/s: the mean over seeds of each run's own training throughput, measured while the machine's "
        f"1-minute load average was {lo:.1f}-{hi:.1f} on {cores} cores"
    )
    if shared:
        return text + (
            ": the machine was shared, so runs made at different moments are not comparable by these "
            "figures (the interleaved measurement below, where given, is)."
        )
    return text + "."


def _intro_lines(result: Comparison, scope: str) -> list[str]:
    """The title, the sources of a merged report, the recipe paragraph, the command and the wall time."""
    bpb = any(r.val_bpb_mean is not None for r in result.rows)
    pace = "one at a time" if result.jobs == 1 else f"{result.jobs} at a time"
    lines = ["# Design comparison", ""]
    if result.sources:
        lines += ["Merged from " + "; ".join(result.sources) + ".", ""]
    lines += [
        (result.recipe + " " if result.recipe else "")
        + "Losses are cross-entropy in nats per token: train is the last estimate on fixed training windows, "
        f"validation {scope}; "
        + (
            "bits per byte is that validation score per UTF-8 byte of the scored text (loss x tokens / bytes / ln 2), "
            "which does not depend on the tokenizer; "
            if bpb
            else ""
        )
        + "mean ± sample std over seeds. A run diverged when a loss was not finite or its last validation "
        "estimate ended above its step-0 one.",
        "",
    ]
    if result.command:
        lines += ["Generated by:", "", "```bash", result.command, "```", ""]
    if not result.sources:
        lines += [
            f"Wall time of the whole comparison: {result.wall_s:,.0f} s ({result.wall_s / 60:.1f} min) for "
            f"{result.n_runs} training runs, {pace}.",
            "",
        ]
    return lines


def _table_lines(result: Comparison) -> list[str]:
    """The main table (a row per variant at its chosen rate) and the note on the load its tokens/s ran under."""
    rows = result.rows
    ladder = result.ladder is not None
    bpb = any(r.val_bpb_mean is not None for r in rows)
    head = (
        "| spec | parameters | active parameters | lr |"
        + (" training FLOPs |" if ladder else "")
        + " tokens/s | train loss | validation loss |"
        + (" validation bits/byte |" if bpb else "")
        + " diverged | unstable |"
    )
    rule = (
        "|---|---:|---:|---:|"
        + ("---:|" if ladder else "")
        + "---:|---:|---:|"
        + ("---:|" if bpb else "")
        + "---:|---:|"
    )
    lines = [head, rule]
    for r in rows:
        flops = f" {r.flops:.3g} |" if ladder and r.flops is not None else (" |" if ladder else "")
        bits = (f" {fmt_pm(r.val_bpb_mean, r.val_bpb_std)} |" if r.val_bpb_mean is not None else " |") if bpb else ""
        lines.append(
            f"| {r.spec}{' (held out)' if r.holdout else ''} | {r.params:,} | {r.active_params:,} | {r.lr:g} |{flops} "
            f"{r.tokens_per_s:,.0f} | {fmt_pm(r.train_loss_mean, r.train_loss_std)} | "
            f"{fmt_pm(r.val_loss_mean, r.val_loss_std)} |{bits} {r.diverged}/{len(r.runs)} | "
            f"{r.unstable}/{len(r.runs)} |"
        )
    return lines + ["", _load_note(rows)]


def _verdict_lines(result: Comparison) -> list[str]:
    """The verdicts at the chosen rates (nothing when there are none)."""
    chosen = [v for v in result.verdicts if v.lr is None]
    if not chosen:
        return []
    return [
        "",
        "## Verdicts",
        "",
        "Each design against the first at the same size, validation loss: the difference of means with its 95% "
        "confidence interval over seeds (paired t when both ran the same seeds, Welch's t otherwise); "
        "*resolved* only when the interval excludes zero.",
        "",
    ] + [f"- {v.text()}" for v in chosen]


def _sweep_lines(rows: Sequence[SpecRow]) -> list[str]:
    """The learning-rate sweep: each swept row's first-seed loss at every rate, the winner in bold."""
    lrs = sorted({lr for r in rows for lr in r.sweep})
    lines = [
        "",
        "## Learning-rate sweep",
        "",
        "The first seed of each spec at every learning rate (validation loss); the lowest wins and the other "
        "seeds train at it.",
        "",
        "| spec | " + " | ".join(f"lr {lr:g}" for lr in lrs) + " | winner |",
        "|---|" + "---:|" * len(lrs) + "---:|",
    ]
    swept = [r for r in rows if r.sweep]  # a merged report may hold rows that were never swept
    for r in swept:
        cells = [
            (f"**{r.sweep[lr]:.4f}**" if lr == r.lr else f"{r.sweep[lr]:.4f}") if lr in r.sweep else "" for lr in lrs
        ]
        lines.append(f"| {r.spec} | " + " | ".join(cells) + f" | {r.lr:g} |")
    lines += [""] + [f"- {r.spec}: learning rate {r.lr:g} won." for r in swept]
    return lines + ["", "![validation loss against learning rate](lr.png)"]


def _grid_lines(result: Comparison) -> list[str]:
    """The learning-rate grid: every row's mean ± std at every rate (the chosen one bold), and the verdicts at each
    rate; nothing without a grid."""
    if not result.grid:
        return []
    rows = result.rows
    seeds = max(len(r.runs) for r in rows)
    lrs = sorted({r.lr for r in result.grid})
    lines = [
        "",
        "## Learning-rate grid",
        "",
        f"Every seed of every spec at every learning rate (validation loss, mean ± std over {seeds} seeds); "
        "the lowest mean wins (bold).",
        "",
        "| spec | " + " | ".join(f"lr {lr:g}" for lr in lrs) + " | winner |",
        "|---|" + "---:|" * len(lrs) + "---:|",
    ]
    gridded = {g.spec for g in result.grid}  # a merged report may hold rows from a source without a grid
    for chosen_row in (r for r in rows if r.spec in gridded):
        cells = []
        for lr in lrs:
            g = next((x for x in result.grid if x.spec == chosen_row.spec and x.lr == lr), None)
            text = fmt_pm(g.val_loss_mean, g.val_loss_std) if g is not None else ""
            cells.append(f"**{text}**" if g is not None and lr == chosen_row.lr else text)
        lines.append(f"| {chosen_row.spec} | " + " | ".join(cells) + f" | {chosen_row.lr:g} |")
    if any(r.sweep for r in rows):  # the plot is written under the same condition (one rate: no plot)
        lines += ["", "![validation loss against learning rate](lr.png)"]
    per_lr = [v for v in result.verdicts if v.lr is not None]
    if per_lr:
        lines += ["", "At each learning rate:", ""] + [f"- lr {v.lr:g}: {v.text()}" for v in per_lr]
    return lines


def _instability_lines(result: Comparison) -> list[str]:
    """The instability reading of every run (:func:`modkit.experiments.stats.instability`)."""
    lines = [
        "",
        "## Instability",
        "",
        "Per run, from the logged training steps: the fraction of steps whose train loss (mean of the last 5 "
        "logged batches) exceeds its running minimum by more than the run's threshold (stalls and loss "
        "spikes), the gradient-norm spikes (a logged norm above 5x the median of those logged before it, "
        "after the first 10) and the largest norm. The threshold is the margin (`--spike-margin`, 0.1 nats "
        "unless changed) plus the dip that the run's batch noise alone gives the running minimum over its "
        "length (noise / sqrt(5) x sqrt(2 ln(steps / 5)), the noise estimated from the step-to-step changes "
        "of the loss), so that a long healthy run does not count as unstable. A plateau sits at its own running "
        "minimum, so that fraction misses it: a run is *stalled* when its smoothed loss goes without falling by "
        f"more than the threshold for at least {STALL_SHARE:.0%} of its logged steps (after the first 10) while "
        "that stretch sits more than twice the threshold above the best run of its design (the lowest smoothed loss of "
        "any run of that spec at that size, every rate and seed) or above its own earlier minimum; the column "
        "gives the stretch's steps, its share of the steps, its mean loss and how far above. A run counts as "
        "unstable above 5%, with any spike, or stalled. Every run of the comparison, the sweep's and the grid's "
        "included.",
        "",
        "| spec | lr | seed | steps above the running minimum | threshold (nats) | gradient-norm spikes | "
        "largest gradient norm | stalled |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for run in result.all_runs or [run for r in result.rows for run in r.runs]:
        threshold = f"{run.above_threshold:.3f}" if run.above_threshold > 0 else ""  # older reports did not keep it
        lines.append(
            f"| {run.spec} | {run.lr:g} | {run.seed} | {run.above_min:.1%} | {threshold} | {run.spikes} | "
            f"{run.max_grad_norm:.3g} | {stall_text(run.stall) or 'no'} |"
        )
    return lines


def _throughput_lines(result: Comparison) -> list[str]:
    """The interleaved throughput table (nothing when it was not measured)."""
    if not result.throughput:
        return []
    lines = [
        "",
        "## Throughput, measured interleaved",
        "",
        "Every variant timed again in one process, round-robin (a few optimizer steps each, three rounds, "
        "median), so each saw the same load; the ratio is against the first.",
        "",
        "| spec | tokens/s | ratio |",
        "|---|---:|---:|",
    ]
    first = next(iter(result.throughput.values()))
    for label, tps in result.throughput.items():
        lines.append(f"| {label} | {tps:,.0f} | {tps / first:.3f} |")
    return lines


def _position_lines(result: Comparison) -> list[str]:
    """The loss by position at twice the training context and its verdicts (nothing when no row was scored)."""
    rows = result.rows
    scored = [r for r in rows if r.buckets]
    if not scored:
        return []
    edges = np.array_split(np.arange(result.eval_len), result.n_buckets)
    lines = [
        "",
        f"## Loss by position at context {result.eval_len} (trained at {result.seq_len})",
        "",
        "Best checkpoint of each run on the validation split in windows of "
        f"{result.eval_len} tokens; mean loss of the positions in each bucket, mean over seeds. Buckets past "
        f"position {result.seq_len - 1} are beyond the training context.",
        "",
        "| spec | "
        + " | ".join(f"{int(e[0])}-{int(e[-1])}" for e in edges)
        + f" | all {result.eval_len} (mean ± std) |",
        "|---|" + "---:|" * (len(edges) + 1),
    ]
    for r in scored:
        long = fmt_pm(r.long_val_loss_mean, r.long_val_loss_std) if r.long_val_loss_mean is not None else ""
        lines.append(f"| {r.spec} | " + " | ".join(f"{v:.4f}" for v in r.buckets) + f" | {long} |")
    left = [r for r in rows if not r.buckets]
    if left:
        lines += ["", "Not scored at this context: " + "; ".join(f"{r.spec} ({r.buckets_note})" for r in left) + "."]
    if result.long_verdicts:
        lines += [
            "",
            (
                f"Verdicts at context {result.eval_len}: the validation loss over every position of those "
                "windows (the last column), each scored design against the first, as above."
            ),
            "",
        ]
        lines += [f"- {v.text()}" for v in result.long_verdicts]
    return lines + ["", "![loss by position](positions.png)"]


def _run_lines(rows: Sequence[SpecRow]) -> list[str]:
    """Every run of every row with its losses and its folder."""
    lines = [
        "",
        "## Runs",
        "",
        "| spec | lr | seed | train loss | validation loss | diverged | folder |",
        "|---|---:|---:|---:|---:|---|---|",
    ]
    for r in rows:
        for run in r.runs:
            lines.append(
                f"| {r.spec} | {run.lr:g} | {run.seed} | {run.train_loss:.4f} | {run.val_loss:.4f} | "
                f"{'yes' if run.diverged else 'no'} | runs/{run.run_dir.name} |"
            )
    return lines


def write_report(result: Comparison, scope: str, *, lr_sweep: bool) -> Path:
    """``report.md``: the recipe, the table, the verdicts, the learning rates, the instability reading, the
    throughput, the ladder, the curves and the position buckets; sections that do not apply are left out.

    ``scope`` says what a run's validation loss covers; ``lr_sweep`` adds the sweep's section. Returns
    ``result.report``.
    """
    lines = _intro_lines(result, scope) + _table_lines(result) + _verdict_lines(result)
    if lr_sweep:
        lines += _sweep_lines(result.rows)
    lines += _grid_lines(result) + transfer_lines(transfer_table(result.rows, result.grid))
    lines += _instability_lines(result) + _throughput_lines(result)
    if result.ladder is not None:
        from modkit.experiments.ladder import report_lines

        lines += [""] + report_lines(result.ladder)
    elif result.ladder_error:
        lines += [
            "",
            "## Ladder",
            "",
            f"**The ladder fit failed**: {result.ladder_error}. The runs above are complete; no fit, interval or "
            "held-out check is reported.",
        ]
    lines += [
        "",
        "## Curves",
        "",
        "![validation loss of every run](curves.png)",
        "",
        "![training batch loss of every run](train-curves.png)",
        "",
        "![gradient norm of every run](grad-norm.png)",
    ]
    imbalance = _imbalance_section(result.rows)
    if imbalance:
        lines += [""] + imbalance
    lines += _position_lines(result) + _run_lines(result.rows)
    result.report.write_text("\n".join(lines) + "\n")
    return result.report


def write_partial(out: Path, runs: Sequence[RunSummary], error: str, *, command: Optional[str] = None) -> Path:
    """``out/report.md`` when a step after training failed: the error and every finished run (spec, rate, seed,
    losses, folder), so the training is not lost. Returns the path."""
    lines = ["# Design comparison (partial)", ""]
    if command:
        lines += ["Generated by:", "", "```bash", command, "```", ""]
    lines += [
        f"The comparison stopped after training: {error}. Its {len(runs)} runs finished; below is what each "
        "measured (their folders hold the metrics). No verdicts, fits or plots were made.",
        "",
        "| spec | lr | seed | train loss | validation loss | diverged | folder |",
        "|---|---:|---:|---:|---:|---|---|",
    ]
    for run in runs:
        lines.append(
            f"| {run.spec} | {run.lr:g} | {run.seed} | {run.train_loss:.4f} | {run.val_loss:.4f} | "
            f"{'yes' if run.diverged else 'no'} | runs/{run.run_dir.name} |"
        )
    path = out / "report.md"
    path.write_text("\n".join(lines) + "\n")
    return path

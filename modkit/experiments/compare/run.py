"""Training a comparison's runs: one after another in this process, or several at once in worker processes
(:func:`train_runs`); each run read back from its folder (:func:`read_run`); throughput timed round-robin
(:func:`measure_throughput`); and :func:`compare`, which does all of it and writes the report.
"""

from __future__ import annotations

import contextlib
import math
import multiprocessing
import os
import statistics
import time
from concurrent.futures import Executor, ProcessPoolExecutor, as_completed
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable, Optional, Sequence, Union

from .plan import CompareRequest, ComparePlan, _Variant, make_plan
from .results import CompareError, Comparison, RunSummary, _finite

#: one training run of a plan: (variant, learning rate or ``None`` for the config's, seed index)
RunKey = tuple[_Variant, Optional[float], int]


def _instability_of(records: list[dict], margin: float) -> Any:
    from modkit.experiments.stats import instability

    train = [r for r in records if r["kind"] == "train"]
    return instability([r["loss"] for r in train], [r.get("grad_norm", math.nan) for r in train], margin=margin)


def read_run(run_dir: Path, spec: str, lr: float, seed: int, result: Any, *, spike_margin: float = 0.1) -> RunSummary:
    """Summarize a finished run from its ``metrics.jsonl`` (and the :class:`~modkit.train.RunResult`)."""
    from modkit.train.plot import read_metrics

    records = read_metrics(run_dir / "metrics.jsonl")
    evals = [r for r in records if r["kind"] == "eval"]
    finals = [r for r in records if r["kind"] == "final"]
    train = [r for r in records if r["kind"] == "train"]
    losses = [r["loss"] for r in train]
    losses += [r[k] for r in evals for k in ("train_loss", "val_loss")] + [r["val_loss"] for r in finals]
    val = finals[-1]["val_loss"] if finals else evals[-1]["val_loss"]
    nonfinite = not all(math.isfinite(v) for v in losses)
    reading = _instability_of(records, spike_margin)
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
        train_curve=[(r["step"], r["loss"]) for r in train],
        grad_curve=[(r["step"], r["grad_norm"]) for r in train if "grad_norm" in r],
        above_min=reading.above_min,
        spikes=reading.spikes,
        max_grad_norm=reading.max_grad_norm,
        above_threshold=reading.threshold,
        load=tuple(getattr(result, "load", (math.nan, math.nan))),
        cores=int(getattr(result, "cores", 0)),
        tokens=int(evals[-1]["tokens"]) if evals else 0,
        val_bpb=finals[-1].get("val_bits_per_byte") if finals else None,
        imbalance_curve=[(r["step"], r["load_imbalance"]) for r in evals if r.get("load_imbalance") is not None],
    )


def _load_average() -> float:
    try:
        return float(os.getloadavg()[0])
    except (OSError, AttributeError):  # pragma: no cover - non-POSIX
        return math.nan


def _train_run(config: Any, run_dir: Path, overrides: dict[str, Any]) -> SimpleNamespace:
    """One training run of a comparison (in this process, or in a worker process with ``jobs > 1``)."""
    from modkit.train import train

    before = _load_average()
    result = train(config, run_dir, overrides=overrides, echo=lambda line: None)
    return SimpleNamespace(
        tokens_per_s=result.tokens_per_s,
        elapsed_s=result.elapsed_s,
        load=(before, _load_average()),
        cores=os.cpu_count() or 0,
    )


class _Progress:
    """``[k/N]`` with the elapsed time and an estimate of the time left, for the progress line of each finished run.

    The estimate is the mean wall time per finished run so far (runs training side by side included) times the runs
    left: a comparison's runs are alike in size unless it has several sizes, where it is only a rough guide.
    """

    def __init__(self, total: int) -> None:
        self.total, self.done, self.start = total, 0, time.perf_counter()

    def tick(self) -> str:
        """Count one finished run; ``"[k/N] 1 min 05 s elapsed, about 3 min 10 s left"``."""
        self.done += 1
        elapsed = time.perf_counter() - self.start
        left = elapsed / self.done * (self.total - self.done)
        return f"[{self.done}/{self.total}] {_duration(elapsed)} elapsed, about {_duration(left)} left"


def _duration(seconds: float) -> str:
    """``"42 s"``, ``"3 min 05 s"``, ``"1 h 02 min"``."""
    s = int(round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


# size: the plan, the pool, the runs, and the comparison's tracker group and progress counter
def _execute(
    plan: ComparePlan,
    pool: Optional[Executor],
    runs: list[RunKey],
    group: Optional[str] = None,
    progress: Optional[_Progress] = None,
) -> list[RunSummary]:
    """Train ``runs`` (in ``pool``'s worker processes, or here when ``pool`` is ``None``); their summaries in the
    order of ``runs``; ``group``: the trackers' group of the comparison (``tracker_group``). A run that fails stops
    the queue (runs already training finish) and its error is raised. ``progress`` counts the finished runs for the
    ``[k/N]`` lines (default: these runs alone)."""
    request = plan.request
    progress = progress or _Progress(len(runs))
    calls = []
    for v, lr, i in runs:
        changes = plan.run_changes(v, lr, i)
        if group is not None:
            changes["tracker_group"] = group
        run_dir = plan.out / "runs" / f"{v.label}-lr{changes['lr']:g}-seed{changes['seed']}"
        request.echo(f"{v.label}: lr {changes['lr']:g}, seed {changes['seed']} -> {run_dir}")
        calls.append((request.config, run_dir, changes))
    summaries: list[Any] = [None] * len(calls)  # filled as the runs finish, in any order

    def finish(k: int, result: SimpleNamespace) -> None:
        (v, _, _), (_, run_dir, changes) = runs[k], calls[k]
        summaries[k] = read_run(
            run_dir, v.label, changes["lr"], changes["seed"], result, spike_margin=request.spike_margin
        )
        request.echo(
            f"{progress.tick()}: done {run_dir.name}: validation loss {summaries[k].val_loss:.4f}, "
            f"{result.elapsed_s:.0f} s"
        )

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


def train_runs(
    plan: ComparePlan, group: Optional[str] = None
) -> tuple[dict[str, dict[float, list[RunSummary]]], list[RunSummary]]:
    """Train every run of ``plan``: ``({variant label: {lr: runs}}, every run in the order trained)``; ``group``:
    the name the runs' trackers log them under (``tracker_group``), ``None`` to keep the config's.

    A grid trains every seed of every variant at every rate; a sweep the first seed at every rate, then the other
    seeds at the rate whose first seed scored the lowest validation loss (the sweep's run is reused); otherwise every
    seed at the config's rate. With ``request.jobs > 1`` the runs train in that many ``spawn`` worker processes.
    """
    request, variants = plan.request, plan.variants
    by_variant: dict[str, dict[float, list[RunSummary]]] = {v.label: {} for v in variants}
    jobs = request.jobs
    workers = (
        ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn"))
        if jobs > 1
        else contextlib.nullcontext()
    )
    with workers as pool:
        if request.mode == "grid":
            runs = [(v, lr, i) for v in variants for lr in request.lrs for i in range(request.seeds)]
        elif request.mode == "sweep":
            runs = [(v, lr, 0) for v in variants for lr in request.lrs]
        else:
            runs = [(v, None, i) for v in variants for i in range(request.seeds)]
        rest_count = len(variants) * (request.seeds - 1) if request.mode == "sweep" else 0
        progress = _Progress(len(runs) + rest_count)
        done = _execute(plan, pool, runs, group, progress)
        for r in done:
            by_variant[r.spec].setdefault(r.lr, []).append(r)
        if request.mode == "sweep":
            best = {
                label: min(per_lr, key=lambda lr: _finite(per_lr[lr][0].val_loss))
                for label, per_lr in by_variant.items()
            }
            rest = _execute(
                plan, pool, [(v, best[v.label], i) for v in variants for i in range(1, request.seeds)], group, progress
            )
            for r in rest:
                by_variant[r.spec][r.lr].append(r)
            done = done + rest
    return by_variant, done


def measure_throughput(
    variants: Sequence[_Variant],
    config: Any,
    data_folder: str,
    steps: int,
    *,
    rounds: int = 3,
    echo: Callable[[str], None] = print,
) -> dict[str, float]:
    """Training tokens/s of every variant measured round-robin in this process (each round times ``steps`` optimizer
    steps of every variant in turn after one warm-up step), median over ``rounds``: every variant sees the same load.

    Uses the training loop's own step (:meth:`modkit.train.loop.Trainer.train_step`) in a scratch run folder.
    """
    import shutil
    import tempfile

    from modkit.train import load_train_config
    from modkit.train.loop import Trainer

    trainers = {}
    scratch = Path(tempfile.mkdtemp(prefix="modkit-throughput-"))
    try:
        for k, v in enumerate(variants):
            changes = {**v.changes, "model": str(v.path), "data": data_folder, "sample_tokens": 0, "trackers": []}
            cfg, base = load_train_config(config, changes)
            t = Trainer(cfg, scratch / f"run{k}", base_dir=base, progress=False, echo=lambda line: None)
            t.setup()
            t.train_step()  # warm-up
            trainers[v.label] = t
        times: dict[str, list[float]] = {label: [] for label in trainers}
        for _ in range(rounds):
            for label, t in trainers.items():
                start = time.perf_counter()
                for _ in range(steps):
                    t.train_step()
                times[label].append(t.config.tokens_per_step * steps / (time.perf_counter() - start))
        out = {label: float(statistics.median(v)) for label, v in times.items()}
        echo("throughput (interleaved): " + ", ".join(f"{k} {v:,.0f} tokens/s" for k, v in out.items()))
        return out
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _request_of(specs: Any, config: Any, out_dir: Any, options: dict[str, Any]) -> CompareRequest:
    """``specs`` itself when it is a :class:`CompareRequest` (then nothing else may be given), else a request built
    from the arguments.

    Raises:
        TypeError: a request together with other arguments, or no ``out_dir``; an unknown option.
    """
    if isinstance(specs, CompareRequest):
        if config is not None or out_dir is not None or options:
            raise TypeError("compare(request) takes no other arguments; set them in the CompareRequest")
        return specs
    if out_dir is None:
        raise TypeError("compare() needs out_dir, the report folder")
    return CompareRequest(specs, config, out_dir, **options)


def compare(
    specs: Union[CompareRequest, Sequence[Union[str, Path, tuple]]],
    config: Union[str, Path, dict, None] = None,
    out_dir: Union[str, Path, None] = None,
    **options: Any,
) -> Comparison:
    """Train every spec under one training config and write a report folder (see :mod:`modkit.experiments.compare`).

    Called as ``compare(request)`` with a :class:`~modkit.experiments.compare.plan.CompareRequest`, or as
    ``compare(specs, config, out_dir, seeds=3, lr_grid=[...], ...)``, whose arguments are the request's fields (their
    meaning is documented there): ``seeds``, ``lr_sweep``, ``lr_grid``, ``overrides``, ``spec_overrides``,
    ``widths``, ``depths``, ``ladder``, ``tokens_per_param``, ``tokens``, ``holdout``, ``throughput_steps``,
    ``spike_margin``, ``n_buckets``, ``jobs``, ``command``, ``echo``.

    The runs are independent: with ``jobs > 1`` up to ``jobs`` of them train at once, each in its own process
    (``spawn``), and each gives the same losses as it would alone (every run is seeded; on CPU each uses the config's
    ``threads``, so ``jobs x threads`` should not exceed the cores).

    Args:
        specs: a request, or spec JSON files (labelled by file name), ``"LABEL=FILE"`` strings or ``(label, file)``
            pairs.
        config: the training config (file, dict or ``None`` for the defaults); its ``model`` is replaced by each spec.
        out_dir: the report folder (``report.md``, ``curves.png``, ``train-curves.png``, ``grad-norm.png``,
            ``positions.png``, ``ladder.png``, ``results.json``, ``specs/``, ``runs/``, and ``data/`` when the config
            names text files rather than a prepared folder).
        **options: the other fields of the request.

    Returns:
        :class:`~modkit.experiments.compare.results.Comparison`.

    Raises:
        CompareError: no specs, ``seeds < 1``, ``jobs < 1``, an empty or invalid sweep or grid, both a sweep and a
            grid, a missing spec file, a per-spec override of an unknown label or a reserved field, a ladder with
            fewer than three fitted sizes or a held-out size not above them (all before any run trains), a report
            folder that already holds a comparison or runs; a step after training that fails (``report.md`` then
            holds a partial report of the finished runs). A ladder fit that fails does not raise: the report says
            why in its Ladder section (``Comparison.ladder_error``).
        SpecError / TrainError / DataError: an invalid config or spec, a spec (or a size of it) that does not fit the
            config or data (every run is checked before the first trains), missing data; or from
            :func:`modkit.train.train`.
        TypeError: a request with other arguments, no ``out_dir``, or an option that is not a request field.
    """
    from .report import write_partial
    from .stalls import mark_stalls

    started = time.perf_counter()
    request = _request_of(specs, config, out_dir, options)
    plan = make_plan(request, started)
    trackers, group = _open_group(plan)
    try:
        by_variant, done = train_runs(plan, group)
        mark_stalls(done, margin=request.spike_margin)
        try:
            result = _finish(plan, by_variant, done)
        except Exception as exc:  # a step after training: keep what the finished runs say
            path = write_partial(plan.out, done, f"{type(exc).__name__}: {exc}", command=request.command)
            raise CompareError(
                f"the comparison's {len(done)} runs finished, but writing its report failed ({type(exc).__name__}: "
                f"{exc}); a partial report of the runs is at {path}"
            ) from exc
    except BaseException:
        trackers.finish(False)
        raise
    trackers.log_summary(_summary(result))
    trackers.finish(True)
    return result


def _open_group(plan: ComparePlan) -> tuple[Any, Optional[str]]:
    """The comparison's own trackers (``role = "group"``; none when the config lists none) and the group name its
    runs are logged under: the report folder's name and the start time, so comparisons into one folder name differ.

    Raises:
        TrackerError: a tracker that cannot start (before any run trains).
    """
    from modkit.train.trackers import Trackers, TrackerSetup, open_trackers

    if not plan.base.trackers:
        return Trackers(), None
    group = plan.base.tracker_group or f"{plan.out.resolve().name}-{time.strftime('%Y%m%d-%H%M%S')}"
    setup = TrackerSetup(
        run_dir=plan.out.resolve(), name=group, role="group", config=plan.base.model_dump(mode="json"), spec=None
    )
    return open_trackers(plan.base.trackers, setup, echo=plan.request.echo), group


def _summary(result: Comparison) -> dict[str, Any]:
    """What the comparison's trackers get (:meth:`modkit.train.trackers.Tracker.log_summary`)."""
    from modkit.train.trackers import finite_or_none

    runs = [
        {"name": r.run_dir.name, "spec": r.spec, "lr": r.lr, "seed": r.seed, "val_loss": finite_or_none(r.val_loss)}
        for r in result.all_runs
    ]
    return {"verdicts": [v.text() for v in result.verdicts], "runs": runs, "report": str(result.report.resolve())}


def _finish(plan: ComparePlan, by_variant: dict, done: list[RunSummary]) -> Comparison:
    """Rows, verdicts, positions, the ladder fit (a failed fit is reported in its section), throughput and the
    report folder's files, from the finished runs."""
    from .report import _recipe, verdicts_of, write_files
    from .rows import score_positions, table_rows

    request = plan.request
    rows, grid = table_rows(plan, by_variant)
    eval_len = 2 * plan.base.seq_len
    score_positions(plan, rows, eval_len)
    result = Comparison(
        rows=rows,
        out_dir=plan.out,
        report=plan.out / "report.md",
        seq_len=plan.base.seq_len,
        eval_len=eval_len,
        n_buckets=request.n_buckets,
        command=request.command,
        n_runs=len(done),
        jobs=request.jobs,
        grid=grid,
        mode=request.mode,
    )
    order = [v.label for v in plan.variants]
    result.all_runs = sorted(done, key=lambda r: (order.index(r.spec), r.lr, r.seed))
    result.verdicts = verdicts_of(rows, grid)
    result.long_verdicts = verdicts_of(rows, metric="long_val_loss")
    if request.ladder:
        from modkit.experiments.ladder import fit_ladder

        try:
            result.ladder = fit_ladder(rows)
        except ValueError as exc:
            result.ladder_error = str(exc)
            request.echo(f"the ladder fit failed: {exc}; the report says so in its Ladder section")
    if request.throughput_steps > 0:
        result.throughput = measure_throughput(
            plan.variants, request.config, plan.data_folder, request.throughput_steps, echo=request.echo
        )
    result.recipe = _recipe(plan.base, plan.data_folder, request)
    write_files(result, plan.base, plan.data_folder, started=plan.started)
    return result

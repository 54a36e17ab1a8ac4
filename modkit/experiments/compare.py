"""Compare model designs under one training recipe: same data, token budget, schedule and seeds for every spec.

    from modkit.experiments.compare import compare
    result = compare(["specs/a.json", "specs/b.json"], "train.json", "reports/ab", seeds=3, lr_grid=[1e-3, 3e-3])
    result.rows[0].val_loss_mean, result.differences, result.report   # report.md, curves.png, results.json

Every run goes through :func:`modkit.train.train` (one training loop in modkit); the runs live under
``REPORT/runs/<variant>-lr<lr>-seed<seed>``, and with ``jobs > 1`` several train at once, each in its own process.
Run ``i`` of every spec uses seed ``config.seed + i`` (so seed ``i`` of every spec reads the same batches).

**Designs and variants.** A spec given as ``LABEL=PATH`` is labelled ``LABEL`` (else by its file name), so one spec
file can be two designs that differ only in training (``spec_overrides``: any training-config field per design, e.g.
``{"muon": {"optimizer": {"type": "muon"}}}``). With ``widths`` / ``depths`` every design trains at every size
(:func:`modkit.experiments.scaling.resize`); a design at a size is a *variant* (``label-d128``).

**Learning rates.** ``lr_grid``: every seed trains at every rate; each variant's rate is the one with the lowest mean
validation loss. ``lr_sweep`` (one seed): the first seed trains at every rate, the winner is taken by that seed, the
other seeds train at it (the sweep's run is reused). A swept run keeps the config's ``min_lr / lr`` ratio.

**Verdicts.** At each size every design is compared with the first: the difference of mean validation losses with
a 95% confidence interval over seeds (:func:`modkit.experiments.stats.mean_difference`: paired t when both ran the same seeds,
which they do unless reports were merged, Welch otherwise); *resolved* only when the interval excludes zero. With an
lr grid the same at every rate.

**Ladders** (``ladder=True``, two or more sizes): each size trains for a token budget of its own (``tokens_per_param``
times its parameters, or an explicit ``tokens`` list), FLOPs from :mod:`modkit.analysis.cost`; :mod:`modkit.experiments.ladder` fits
``L(C) = E + A C^-alpha`` per design with bootstrap intervals over seeds, the compute multiplier of each design over
the first, and checks the fit on a held-out larger size (``holdout``) it did not see.

A run has *diverged* when any loss it logged is not finite, or its last validation estimate is above its step-0 one.
The *instability* reading (:func:`modkit.experiments.stats.instability`) also catches stalls and spikes: the fraction of logged
steps whose smoothed train loss sits above its running minimum by ``spike_margin`` nats plus the dip that the run's
batch noise alone gives that minimum over the run's length, and the gradient-norm spikes.

Position buckets: each run's best checkpoint scores the validation split at twice the training ``seq_len`` (in
non-overlapping windows of that length, at most ``final_eval_tokens`` tokens); the mean cross-entropy of the
positions in each of ``buckets`` equal slices of the window shows how a position scheme extrapolates past the
context it was trained on (Press et al. 2022, ALiBi, arXiv:2108.12409, figure 1 does the same per length). A model
whose ``max_seq_len`` is below twice ``seq_len`` cannot be scored there (learned positions): it is left out of that
table, and the table is left out when no model can be scored. The mean over every position of those windows is
the run's validation loss at twice the training length (``long_val_loss``), and the designs get verdicts on it too
(``long_verdicts``: each against the first, as for the validation loss), so a design that wins within the training
length and loses past it shows both.

Throughput: each run's tokens/s is measured while it trains, so runs made at different moments on a shared machine
are not comparable; the report says the load average they ran under. ``throughput_steps > 0`` also measures every
variant again in this process, round-robin (every variant sees the same load), median of three rounds.
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
import multiprocessing
import os
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

from modkit.core.errors import ModkitError


class CompareError(ModkitError, ValueError):
    """A comparison cannot run as asked (no specs, bad seeds or learning rates, a taken report folder)."""


@dataclass
class RunSummary:
    """One training run of a comparison, read back from its run folder.

    Attributes:
        spec: the variant's label; lr: its peak learning rate; seed: its seed; run_dir: its folder.
        train_loss: the last ``eval`` record's train estimate; val_loss: ``final_val_loss`` (the whole validation
            split, nats / token), or the last val estimate when the config skips the final evaluation.
        initial_val_loss: the step-0 val estimate; tokens_per_s: the run's training throughput; elapsed_s: the
            run's wall time (seconds, :attr:`modkit.train.RunResult.elapsed_s`).
        diverged: a non-finite loss, or a last val estimate above the step-0 one.
        curve: ``(step, val estimate)`` of every ``eval`` record; train_curve, grad_curve: ``(step, batch loss)`` and
            ``(step, gradient norm)`` of every logged ``train`` record.
        buckets: mean cross-entropy per position bucket at twice ``seq_len`` (``None``: not measurable).
        long_val_loss: mean cross-entropy (nats / token) over every position of the validation windows of twice
            ``seq_len`` (the mean of the per-position losses; ``None``: not measurable).
        above_min, spikes, max_grad_norm: the instability reading (:func:`modkit.experiments.stats.instability`);
            above_threshold: the nats above the running minimum that it counts as above (0: an older report).
        load: ``(1-minute load average at the start, at the end)`` of the run; cores: the machine's CPU count.
        tokens: tokens trained.
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
    train_curve: list[tuple[int, float]] = field(default_factory=list)
    grad_curve: list[tuple[int, float]] = field(default_factory=list)
    above_min: float = 0.0
    spikes: int = 0
    max_grad_norm: float = math.nan
    above_threshold: float = 0.0
    load: tuple[float, float] = (math.nan, math.nan)
    cores: int = 0
    tokens: int = 0
    val_bpb: Optional[float] = None
    imbalance_curve: list[tuple[int, float]] = field(default_factory=list)
    long_val_loss: Optional[float] = None


@dataclass
class SpecRow:
    """A variant's line of the comparison table at one learning rate: counts, and mean / sample std (n - 1) over its
    seeds. ``design`` is the spec label the variant came from, ``size`` its ``(d_model, n_layers)``;
    ``long_val_loss_mean`` / ``_std`` the runs' validation loss at twice ``seq_len`` (``None``: not measurable)."""

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
    design: str = ""
    size: tuple[int, int] = (0, 0)
    flops_per_token: Optional[int] = None
    tokens: int = 0
    holdout: bool = False
    unstable: int = 0
    val_bpb_mean: Optional[float] = None
    val_bpb_std: Optional[float] = None
    long_val_loss_mean: Optional[float] = None
    long_val_loss_std: Optional[float] = None

    @property
    def flops(self) -> Optional[float]:
        """Training FLOPs of one run: FLOPs per token (:mod:`modkit.analysis.cost`) x tokens trained."""
        return None if self.flops_per_token is None else float(self.flops_per_token) * self.tokens


@dataclass
class Verdict:
    """One computed verdict: ``a - b`` (mean over seeds) of ``metric`` at a size and learning rate: ``"val_loss"``
    (the validation loss at the training length) or ``"long_val_loss"`` (at twice it)."""

    a: str
    b: str
    lr: Optional[float]
    difference: Any  # modkit.experiments.stats.Difference
    metric: str = "val_loss"

    def to_json(self) -> dict:
        """``{"a", "b", "lr", every field of the difference, "resolved"}``, as ``results.json`` holds it."""
        return {"a": self.a, "b": self.b, "lr": self.lr, **asdict(self.difference), "resolved": self.difference.resolved}

    def text(self) -> str:
        """The verdict sentence (:meth:`modkit.experiments.stats.Difference.text`)."""
        return self.difference.text(self.a, self.b)


@dataclass
class Comparison:
    """What :func:`compare` returns: one :class:`SpecRow` per variant (at its chosen learning rate), the report folder
    and its files.

    ``grid`` holds every (variant, learning rate) row of an lr grid; ``verdicts`` the computed differences (each
    design against the first at every size; with a grid, at every rate too), ``long_verdicts`` the same on the
    validation loss at twice the training length (chosen rates only); ``ladder`` the fits
    (:class:`modkit.experiments.ladder.Ladder`) of a ladder. ``command`` is the command line that ran the comparison (``None``
    from Python); ``wall_s`` the wall time of the whole comparison in seconds; ``n_runs`` the training runs it made;
    ``jobs`` how many ran at once; ``throughput`` the interleaved tokens/s per variant when measured.
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
    grid: list[SpecRow] = field(default_factory=list)
    verdicts: list[Verdict] = field(default_factory=list)
    long_verdicts: list[Verdict] = field(default_factory=list)
    ladder: Any = None
    throughput: dict[str, float] = field(default_factory=dict)
    recipe: str = ""
    mode: str = "single"
    sources: list[str] = field(default_factory=list)
    all_runs: list[RunSummary] = field(default_factory=list)

    @property
    def differences(self) -> list[Verdict]:
        """Alias of :attr:`verdicts`."""
        return self.verdicts


# ------------------------------------------------------------------------------------------------- numbers


def mean_std(values: Sequence[float]) -> tuple[float, Optional[float]]:
    """``(mean, sample standard deviation)``; the std is ``None`` for a single value (Python's ``statistics``)."""
    values = [float(v) for v in values]
    if not all(math.isfinite(v) for v in values):
        return math.nan, None if len(values) < 2 else math.nan
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else None)


def parse_lrs(text: str, flag: str = "--lr-sweep") -> list[float]:
    """``"1e-3,3e-3"`` -> ``[0.001, 0.003]``.

    Raises:
        CompareError: an entry that is not a number, not finite or not positive, a repeated value, or an empty list
            (the message names ``flag``).
    """
    out: list[float] = []
    for part in text.split(","):
        part = part.strip()
        try:
            value = float(part)
        except ValueError:
            raise CompareError(f"{flag}: {part!r} is not a number; give learning rates separated by commas, e.g. 1e-3,3e-3") from None
        if not math.isfinite(value) or value <= 0:
            raise CompareError(f"{flag}: {part!r} is not a positive learning rate")
        if value in out:
            raise CompareError(f"{flag}: {part} is listed twice")
        out.append(value)
    return out


def parse_ints(text: str, flag: str) -> list[int]:
    """``"64,128"`` -> ``[64, 128]`` (positive, increasing).

    Raises:
        CompareError: an entry that is not a positive integer, or a list that does not increase (names ``flag``).
    """
    try:
        values = [int(p) for p in text.split(",")]
    except ValueError:
        raise CompareError(f"{flag} {text!r}: give positive integers separated by commas, e.g. 64,128,256") from None
    if any(v < 1 for v in values) or values != sorted(set(values)):
        raise CompareError(f"{flag} {text!r}: give positive integers in increasing order")
    return values


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


def _label_specs(paths: Sequence[Union[str, Path, tuple]]) -> list[tuple[str, Path]]:
    """``(label, resolved path)`` per spec: ``LABEL=PATH`` (or a ``(label, path)`` pair) or the file name (``-2``,
    ``-3`` for repeats).

    Raises:
        CompareError: a missing file, a repeated or malformed label.
    """
    out, seen = [], {}
    for p in paths:
        label = None
        if isinstance(p, tuple):
            label, p = p
        elif isinstance(p, str) and "=" in p and not Path(p).is_file():
            label, p = p.split("=", 1)
            if not label or not all(ch.isalnum() or ch in "-_." for ch in label):
                raise CompareError(f"spec {label}={p}: a label is letters, digits, '-', '_' and '.'")
        path = Path(p)
        if not path.is_file():
            raise CompareError(f"spec {p}: no such file; give spec .json files (or LABEL=FILE)")
        if label is None:
            stem = path.stem
            seen[stem] = seen.get(stem, 0) + 1
            label = stem if seen[stem] == 1 else f"{stem}-{seen[stem]}"
        if any(label == o for o, _ in out):
            raise CompareError(f"two specs are labelled {label!r}; give each a label of its own (LABEL=FILE)")
        out.append((label, path.resolve()))
    return out


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
    return SimpleNamespace(tokens_per_s=result.tokens_per_s, elapsed_s=result.elapsed_s, load=(before, _load_average()),
                           cores=os.cpu_count() or 0)


#: training-config fields a comparison sets itself (a per-spec override may not)
RESERVED_FIELDS = ("model", "data", "seed", "sample_tokens")


@dataclass
class _Variant:
    design: str
    label: str
    path: Path
    size: tuple[int, int]
    holdout: bool
    changes: dict[str, Any]
    spec: Any = None  # resolved ModelSpec


def compare(
    specs: Sequence[Union[str, Path, tuple]],
    config: Union[str, Path, dict, None],
    out_dir: Union[str, Path],
    *,
    seeds: int = 3,
    lr_sweep: Optional[Sequence[float]] = None,
    lr_grid: Optional[Sequence[float]] = None,
    overrides: Optional[dict[str, Any]] = None,
    spec_overrides: Optional[dict[str, dict[str, Any]]] = None,
    widths: Optional[Sequence[int]] = None,
    depths: Optional[Sequence[int]] = None,
    ladder: bool = False,
    tokens_per_param: Optional[Sequence[float]] = None,
    tokens: Optional[Sequence[int]] = None,
    holdout: Optional[tuple[Optional[int], Optional[int]]] = None,
    throughput_steps: int = 0,
    spike_margin: float = 0.1,
    n_buckets: int = 8,
    jobs: int = 1,
    command: Optional[str] = None,
    echo: Callable[[str], None] = print,
) -> Comparison:
    """Train every spec under one training config and write a report folder (see the module docstring).

    The runs are independent: with ``jobs > 1`` up to ``jobs`` of them train at once, each in its own process
    (``spawn``), and each gives the same losses as it would alone (every run is seeded; on CPU each uses the config's
    ``threads``, so ``jobs x threads`` should not exceed the cores).

    Args:
        specs: spec JSON files (labelled by file name), ``"LABEL=FILE"`` strings or ``(label, file)`` pairs.
        config: the training config (file, dict or ``None`` for the defaults); its ``model`` is replaced by each spec.
        out_dir: the report folder (``report.md``, ``curves.png``, ``train-curves.png``, ``grad-norm.png``,
            ``positions.png``, ``ladder.png``, ``results.json``, ``specs/``, ``runs/``, and ``data/`` when the config
            names text files rather than a prepared folder).
        seeds: runs per variant, seeds ``config.seed + 0 .. seeds - 1``.
        lr_sweep: learning rates tried on the first seed of each variant (the others train at the winner).
        lr_grid: learning rates every seed trains at (not with ``lr_sweep``).
        overrides: training-config fields to replace for every run (e.g. ``{"max_steps": 100}``).
        spec_overrides: ``{label: {field: value}}``: training-config fields for one design's runs (not ``model``,
            ``data``, ``seed``, ``sample_tokens``; not ``lr`` together with a sweep or grid).
        widths, depths: ``d_model`` / ``n_layers`` values; every design trains at every combination.
        ladder: fit losses against compute (needs sizes; see :mod:`modkit.experiments.ladder`).
        tokens_per_param: token budget(s) of each size as a multiple of its parameter count (several: every size
            at every budget, and an ``L(N, D)`` fit); tokens: one explicit budget per size (in size order).
        holdout: ``(d_model, n_layers)`` (either may be ``None``: the spec's) of a larger size each design also
            trains, which the ladder fit does not see and predicts.
        throughput_steps: optimizer steps per round of the interleaved throughput measurement (0: none).
        spike_margin: the instability reading's margin in nats.
        n_buckets: position buckets of the extrapolation table.
        jobs: training runs at once (1: one after another, in this process).
        command: the command line that runs this comparison, recorded in ``report.md`` and ``results.json``.
        echo: where progress lines go.

    Returns:
        :class:`Comparison`.

    Raises:
        CompareError: no specs, ``seeds < 1``, ``jobs < 1``, an empty or invalid sweep or grid, both a sweep and a
            grid, a missing spec file, a per-spec override of an unknown label or a reserved field, a ladder without
            sizes, a report folder that already holds a comparison or runs.
        SpecError / TrainError / DataError: an invalid config or spec, a spec (or a size of it) that does not fit the
            config or data (every run is checked before the first trains), missing data; or from :func:`modkit.train.train`.
    """
    import modkit
    from modkit.analysis.cost import CostError, training_flops_per_token
    from modkit.data import TokenData
    from modkit.experiments.scaling import ScalingError, resize_checked
    from modkit.train import load_train_config
    from modkit.train.config import TrainConfig
    from modkit.train.loop import _resolve_device, prepared_data, resolve_spec

    started = time.perf_counter()
    if not specs:
        raise CompareError("give at least one spec to compare")
    if seeds < 1:
        raise CompareError(f"seeds = {seeds}: give 1 or more")
    if jobs < 1:
        raise CompareError(f"jobs = {jobs}: give 1 or more")
    if n_buckets < 1:
        raise CompareError(f"n_buckets = {n_buckets}: give 1 or more")
    if lr_sweep is not None and lr_grid is not None:
        raise CompareError("give a learning-rate sweep (one seed) or a grid (every seed), not both")
    for name, lrs_ in (("sweep", lr_sweep), ("grid", lr_grid)):
        if lrs_ is not None and not lrs_:
            raise CompareError(f"the learning-rate {name} is empty; give one or more learning rates or none")
    labelled = _label_specs(specs)
    labels = [label for label, _ in labelled]
    spec_overrides = {k: dict(v) for k, v in (spec_overrides or {}).items()}
    for label, fields in spec_overrides.items():
        if label not in labels:
            raise CompareError(f"per-spec override for {label!r}, which is not a spec label; labels: {', '.join(labels)}")
        for name in fields:
            if name in RESERVED_FIELDS:
                raise CompareError(f"per-spec override {label}:{name}: the comparison sets {name} itself")
            if name not in TrainConfig.model_fields:
                raise CompareError(f"per-spec override {label}:{name}: not a training-config field ('modkit schema --train')")
            if name == "lr" and (lr_sweep or lr_grid):
                raise CompareError(f"per-spec override {label}:lr with a learning-rate sweep or grid: sweep it or set it, not both")
    sizes = _sizes(widths, depths)
    if ladder and len(sizes) < 2:
        raise CompareError("a ladder needs two or more sizes: give widths and/or depths")
    if (tokens_per_param or tokens) and not sizes:
        raise CompareError("a token budget per size needs sizes: give widths and/or depths")
    if tokens_per_param and tokens:
        raise CompareError("give tokens_per_param or tokens, not both")
    if tokens is not None and len(tokens) != len(sizes):
        raise CompareError(f"{len(tokens)} token budgets for {len(sizes)} sizes; give one per size, in size order")
    if holdout is not None and not sizes:
        raise CompareError("a held-out size needs a ladder of sizes")

    overrides = dict(overrides or {})
    base, base_dir = load_train_config(config, {**overrides, "model": str(labelled[0][1])})  # fail early, whole config
    out = Path(out_dir)
    if (out / "results.json").exists():
        raise CompareError(f"{out} already holds a comparison; choose another report folder")
    if (out / "runs").is_dir() and any((out / "runs").iterdir()):
        raise CompareError(f"{out / 'runs'} already holds runs (of a comparison that stopped?); choose another report "
                           "folder or delete that one")
    (out / "runs").mkdir(parents=True, exist_ok=True)
    lrs = list(lr_grid or lr_sweep or [])
    mode = "grid" if lr_grid else "sweep" if lr_sweep else "single"
    data_folder = str(prepared_data(base, base_dir, out / "data"))  # every run reads these same tokens
    vocab_size = TokenData.open(data_folder, verify=False).vocab_size

    # every variant, checked against the config and data before any run trains: a typo costs no runs
    variants: list[_Variant] = []
    for label, path in labelled:
        design_changes = spec_overrides.get(label, {})
        own = {**overrides, **design_changes}
        if not sizes:
            variants.append(_Variant(label, label, path, (0, 0), False, own))
            continue
        data = modkit.load_spec(path).to_dict()
        plan = [(s, False) for s in sizes] + ([((holdout[0] or data["d_model"], holdout[1] or data["n_layers"]), True)] if holdout else [])
        budgets = list(tokens_per_param) if tokens_per_param else [None]
        for k, ((d, n), held) in enumerate(plan):
            for ratio in budgets:
                try:
                    resized = resize_checked(data, d_model=d or data["d_model"], n_layers=n or data["n_layers"], name=None)
                except ScalingError as exc:
                    raise CompareError(f"design {label}: {exc}") from None
                vlabel = f"{label}-d{resized['d_model']}-l{resized['n_layers']}" + (f"-t{ratio:g}" if len(budgets) > 1 else "")
                resized["name"] = vlabel
                (out / "specs").mkdir(exist_ok=True)
                vpath = out / "specs" / f"{vlabel}.json"
                vpath.write_text(json.dumps(resized, indent=1) + "\n")
                changes = dict(own)
                if tokens is not None and not held:
                    changes.update(max_tokens=int(tokens[k]), max_steps=None)
                variants.append(_Variant(label, vlabel, vpath, (resized["d_model"], resized["n_layers"]), held, changes))
                if ratio is not None:
                    variants[-1].changes["_ratio"] = ratio
    for v in variants:
        ratio = v.changes.pop("_ratio", None)
        cfg, _ = load_train_config(config, {**v.changes, "model": str(v.path)})
        v.spec = resolve_spec(cfg, base_dir, vocab_size)
        if ratio is not None:
            v.changes.update(max_tokens=max(1, int(math.ceil(ratio * modkit.count_params(v.spec)))), max_steps=None)
        elif v.holdout and tokens_per_param is None and tokens is not None:
            # a held-out size with explicit budgets: extrapolate the budget from the last two sizes' tokens per parameter
            v.changes.update(max_tokens=_holdout_tokens(variants, v, tokens), max_steps=None)
        load_train_config(config, {**v.changes, "model": str(v.path)})  # the budget fits the config's rules
    if ladder:
        for v in variants:
            cfg, _ = load_train_config(config, {**v.changes, "model": str(v.path)})
            try:
                training_flops_per_token(v.spec, cfg.seq_len)
            except CostError as exc:
                raise CompareError(f"a ladder needs FLOPs from modkit cost; {v.label}: {exc}") from None

    def run_changes(v: _Variant, lr: Optional[float], i: int) -> dict[str, Any]:
        cfg, _ = load_train_config(config, {**v.changes, "model": str(v.path)})
        rate = lr if lr is not None else cfg.lr
        return {**v.changes, "model": str(v.path), "seed": base.seed + i, "lr": rate, "data": data_folder,
                "min_lr": min(rate, cfg.min_lr * rate / cfg.lr), "sample_tokens": 0}

    def execute(pool: Optional[ProcessPoolExecutor], runs: list[tuple[_Variant, Optional[float], int]]) -> list[RunSummary]:
        calls = []
        for v, lr, i in runs:
            changes = run_changes(v, lr, i)
            run_dir = out / "runs" / f"{v.label}-lr{changes['lr']:g}-seed{changes['seed']}"
            echo(f"{v.label}: lr {changes['lr']:g}, seed {changes['seed']} -> {run_dir}")
            calls.append((config, run_dir, changes))
        summaries: list[Any] = [None] * len(calls)  # filled as the runs finish, in any order

        def finish(k: int, result: SimpleNamespace) -> None:
            (v, _, _), (_, run_dir, changes) = runs[k], calls[k]
            summaries[k] = read_run(run_dir, v.label, changes["lr"], changes["seed"], result, spike_margin=spike_margin)
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

    by_variant: dict[str, dict[float, list[RunSummary]]] = {v.label: {} for v in variants}
    workers = ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn")) if jobs > 1 else contextlib.nullcontext()
    with workers as pool:
        if mode == "grid":
            plan = [(v, lr, i) for v in variants for lr in lrs for i in range(seeds)]
        elif mode == "sweep":
            plan = [(v, lr, 0) for v in variants for lr in lrs]
        else:
            plan = [(v, None, i) for v in variants for i in range(seeds)]
        done = execute(pool, plan)
        for r in done:
            by_variant[r.spec].setdefault(r.lr, []).append(r)
        if mode == "sweep":
            best = {label: min(runs, key=lambda lr: _finite(runs[lr][0].val_loss)) for label, runs in by_variant.items()}
            rest = execute(pool, [(v, best[v.label], i) for v in variants for i in range(1, seeds)])
            for r in rest:
                by_variant[r.spec][r.lr].append(r)
            done = done + rest
    n_runs = len(done)

    def make_row(v: _Variant, lr: float, runs: list[RunSummary]) -> SpecRow:
        from modkit.experiments.stats import is_unstable

        spec = modkit.load_spec(runs[0].run_dir / "spec.json")  # as trained: vocab_size set from the data
        train_mean, train_std = mean_std([r.train_loss for r in runs])
        val_mean, val_std = mean_std([r.val_loss for r in runs])
        cfg, _ = load_train_config(config, {**v.changes, "model": str(v.path)})
        try:
            fpt: Optional[int] = training_flops_per_token(spec, cfg.seq_len)
        except CostError:
            fpt = None
        bpb_mean, bpb_std = mean_std([r.val_bpb for r in runs]) if all(r.val_bpb is not None for r in runs) else (None, None)
        return SpecRow(
            spec=v.label, path=str(v.path), params=modkit.count_params(spec), active_params=modkit.active_params_per_token(spec),
            lr=lr, tokens_per_s=statistics.fmean(r.tokens_per_s for r in runs),
            train_loss_mean=train_mean, train_loss_std=train_std, val_loss_mean=val_mean, val_loss_std=val_std,
            diverged=sum(r.diverged for r in runs), runs=sorted(runs, key=lambda r: r.seed), design=v.design, size=v.size,
            flops_per_token=fpt, tokens=runs[0].tokens, holdout=v.holdout,
            unstable=sum(1 for r in runs if is_unstable(r.above_min, r.spikes)), val_bpb_mean=bpb_mean, val_bpb_std=bpb_std,
        )

    rows: list[SpecRow] = []
    grid: list[SpecRow] = []
    for v in variants:
        per_lr = by_variant[v.label]
        if mode == "grid":
            lr_rows = [make_row(v, lr, per_lr[lr]) for lr in lrs]
            grid += lr_rows
            chosen = min(lr_rows, key=lambda r: _finite(r.val_loss_mean))
            chosen = copy.copy(chosen)
            chosen.sweep = {r.lr: r.val_loss_mean for r in lr_rows}
        elif mode == "sweep":
            lr = min(per_lr, key=lambda lr: _finite(per_lr[lr][0].val_loss))
            chosen = make_row(v, lr, per_lr[lr])
            chosen.sweep = {lr_: runs[0].val_loss for lr_, runs in per_lr.items()}
        else:
            lr = next(iter(per_lr))
            chosen = make_row(v, lr, per_lr[lr])
        rows.append(chosen)

    # position buckets at twice the training context
    eval_len = 2 * base.seq_len
    device = _resolve_device(base.device)
    val_tokens = TokenData.open(data_folder, verify=False).val
    for row in rows:
        spec = modkit.load_spec(row.runs[0].run_dir / "spec.json")
        if spec.max_seq_len < eval_len:
            row.buckets_note = f"max_seq_len = {spec.max_seq_len} < {eval_len}"
            continue
        if len(val_tokens) < eval_len + 1:
            row.buckets_note = f"the validation split has {len(val_tokens)} tokens, fewer than {eval_len + 1}"
            continue
        for r in row.runs:
            model = modkit.load(r.run_dir / "best", device=device).eval()
            per_position = position_losses(model, val_tokens, eval_len, base.final_eval_tokens or eval_len)
            r.buckets = bucket_means(per_position, n_buckets)
            r.long_val_loss = float(per_position.mean())
        row.buckets = [float(np.mean(col)) for col in zip(*(r.buckets for r in row.runs))]
        row.long_val_loss_mean, row.long_val_loss_std = mean_std([r.long_val_loss for r in row.runs])

    result = Comparison(rows=rows, out_dir=out, report=out / "report.md", seq_len=base.seq_len, eval_len=eval_len,
                        n_buckets=n_buckets, command=command, n_runs=n_runs, jobs=jobs, grid=grid, mode=mode)
    result.all_runs = sorted(done, key=lambda r: ([v.label for v in variants].index(r.spec), r.lr, r.seed))
    result.verdicts = verdicts_of(rows, grid)
    result.long_verdicts = verdicts_of(rows, metric="long_val_loss")
    if ladder:
        from modkit.experiments.ladder import fit_ladder

        result.ladder = fit_ladder(rows)
    if throughput_steps > 0:
        result.throughput = measure_throughput(variants, config, data_folder, throughput_steps, echo=echo)
    result.recipe = _recipe(base, data_folder, seeds, overrides, spec_overrides, variants, tokens_per_param, tokens)
    write_files(result, base, data_folder, started=started)
    return result


def _finite(x: float) -> float:
    return x if math.isfinite(x) else math.inf


def _sizes(widths: Optional[Sequence[int]], depths: Optional[Sequence[int]]) -> list[tuple[Optional[int], Optional[int]]]:
    if not widths and not depths:
        return []
    return [(w, d) for d in (depths or [None]) for w in (widths or [None])]


def _holdout_tokens(variants: list[_Variant], held: _Variant, tokens: Sequence[int]) -> int:
    """The held-out size's budget from the last explicit budget's tokens per parameter."""
    import modkit

    fitted = [v for v in variants if v.design == held.design and not v.holdout]
    last = fitted[-1]
    per_param = tokens[len(fitted) - 1] / modkit.count_params(last.spec)
    return max(1, int(math.ceil(per_param * modkit.count_params(held.spec))))


def verdicts_of(rows: Sequence[SpecRow], grid: Sequence[SpecRow] = (), *, metric: str = "val_loss") -> list[Verdict]:
    """Each design against the first at every size (chosen learning rates), and with a grid at every rate.

    ``metric`` is the :class:`RunSummary` field compared: ``"val_loss"`` (the validation loss at the training length)
    or ``"long_val_loss"`` (at twice it). Paired over seeds when both rows ran the same seeds
    (:func:`modkit.experiments.stats.mean_difference`). Rows with a non-finite or missing value are skipped (a diverged run has no
    loss to compare; a model that cannot read twice the training length has no long loss); with ``"long_val_loss"``
    the first row that has one is the reference.

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


def measure_throughput(variants: Sequence[_Variant], config: Any, data_folder: str, steps: int, *, rounds: int = 3,
                       echo: Callable[[str], None] = print) -> dict[str, float]:
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
            cfg, base = load_train_config(config, {**v.changes, "model": str(v.path), "data": data_folder, "sample_tokens": 0})
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


def _recipe(config: Any, data_folder: str, seeds: int, overrides: dict, spec_overrides: dict, variants: Sequence[_Variant],
            tokens_per_param: Optional[Sequence[float]], tokens: Optional[Sequence[int]]) -> str:
    """The paragraph that says how every run was trained."""
    budget = (f"{config.total_steps} steps of {config.tokens_per_step:,} tokens (batch {config.batch_size} x grad_accum "
              f"{config.grad_accum} x seq_len {config.seq_len})")
    if tokens_per_param:
        budget = (f"a token budget per size of {', '.join(f'{r:g}' for r in tokens_per_param)} tokens per parameter, in "
                  f"steps of {config.tokens_per_step:,} tokens (batch {config.batch_size} x grad_accum {config.grad_accum} x "
                  f"seq_len {config.seq_len})")
    elif tokens:
        budget = (f"an explicit token budget per size ({', '.join(f'{t:,}' for t in tokens)}), in steps of "
                  f"{config.tokens_per_step:,} tokens")
    opt = config.optimizer.get("type", "adamw")
    text = (f"Every spec trained on the same data (`{data_folder}`), {budget}, {config.schedule} schedule with "
            f"{config.warmup_steps} warmup steps, optimizer {opt}, seeds {config.seed}..{config.seed + seeds - 1}.")
    if spec_overrides:
        text += " Per spec: " + "; ".join(f"{label}: " + ", ".join(f"{k} = {json.dumps(v)}" for k, v in f.items())
                                        for label, f in spec_overrides.items()) + "."
    return text


# ------------------------------------------------------------------------------------------------- report


def _row_json(row: SpecRow) -> dict:
    data = asdict(row)
    data["sweep"] = {f"{k:g}": v for k, v in row.sweep.items()}
    return data


def _row_from_json(data: dict) -> SpecRow:
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


def write_files(result: Comparison, config: Any, data_folder: str, *, started: float) -> None:
    """Plots, ``report.md`` and ``results.json`` of a comparison."""
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
    result.wall_s = time.perf_counter() - started
    scope = _validation_scope(config, data_folder) if config is not None else "as each source report says"
    write_report(result, scope, lr_sweep=result.mode == "sweep")
    saved = {
        "command": result.command, "wall_s": result.wall_s, "n_runs": result.n_runs, "jobs": result.jobs,
        "mode": result.mode, "seq_len": result.seq_len, "eval_len": result.eval_len, "n_buckets": result.n_buckets,
        "recipe": result.recipe, "scope": scope, "sources": result.sources,
        "rows": [_row_json(r) for r in result.rows], "grid": [_row_json(r) for r in result.grid],
        "all_runs": [asdict(r) for r in result.all_runs],
        "verdicts": [v.to_json() for v in result.verdicts],
        "long_verdicts": [v.to_json() for v in result.long_verdicts],
        "throughput": result.throughput,
        "ladder": result.ladder.to_json() if result.ladder is not None else None,
    }
    (out / "results.json").write_text(json.dumps(saved, indent=1, default=str) + "\n")


def merge_reports(dirs: Sequence[Union[str, Path]], out_dir: Union[str, Path], *, command: Optional[str] = None) -> Comparison:
    """One report from several comparison folders: every row of each, the verdicts recomputed, the curves replotted.
    Nothing trains.

    Sources whose labels are all new join one table, and each design in it is compared with the first row of the
    merged table at every size (paired where the seeds match). A source that repeats a label of an earlier source
    (the same designs again, typically at another learning rate or budget) has every label of its rows suffixed
    ``@K`` (``K``: the source's position in ``dirs``, from 1; the earlier source's rows get theirs too) and is
    compared within itself, each design against that source's first row: a verdict never pairs the runs of one
    source with the reference of another when the same label names both.

    Raises:
        CompareError: no folder, a folder without ``results.json``, or ``out_dir`` already holding a comparison.
    """
    started = time.perf_counter()
    out = Path(out_dir)
    if not dirs:
        raise CompareError("no comparison folders to merge; give one or more folders written by modkit compare")
    if (out / "results.json").exists():
        raise CompareError(f"{out} already holds a comparison; choose another report folder")
    loaded: list[tuple[list[SpecRow], list[SpecRow]]] = []
    sources, recipes, scopes = [], [], []
    seq_len = eval_len = n_buckets = None
    for d in dirs:
        path = Path(d) / "results.json"
        if not path.is_file():
            raise CompareError(f"{d}: no results.json; give folders written by modkit compare")
        saved = json.loads(path.read_text())
        sources.append(f"{d}" + (f" (`{saved['command']}`)" if saved.get("command") else ""))
        recipes.append(saved.get("recipe") or "")
        scopes.append(saved.get("scope") or "")
        seq_len = seq_len or saved.get("seq_len", 0)
        eval_len = eval_len or saved.get("eval_len", 0)
        n_buckets = n_buckets or saved.get("n_buckets", 8)
        loaded.append(([_row_from_json(x) for x in saved.get("rows", [])], [_row_from_json(x) for x in saved.get("grid", [])]))
    # which sources repeat a label of an earlier one: those are compared within themselves
    labels = [{r.spec for r in rows} for rows, _ in loaded]
    repeats = [any(labels[k] & labels[j] for j in range(len(loaded)) if j != k) for k in range(len(loaded))]
    own = [any(labels[k] & labels[j] for j in range(k)) for k in range(len(loaded))]
    groups: list[tuple[list[SpecRow], list[SpecRow]]] = [([], [])]
    for k, (src_rows, src_grid) in enumerate(loaded, 1):
        if repeats[k - 1]:
            for row in src_rows + src_grid:
                row.spec, row.design = f"{row.spec}@{k}", f"{row.design or row.spec}@{k}"
        target = ([], []) if own[k - 1] else groups[0]
        target[0].extend(src_rows)
        target[1].extend(src_grid)
        if own[k - 1]:
            groups.append(target)
    rows = [r for rows_k, _ in loaded for r in rows_k]
    grid = [r for _, grid_k in loaded for r in grid_k]
    out.mkdir(parents=True, exist_ok=True)
    result = Comparison(rows=rows, out_dir=out, report=out / "report.md", seq_len=seq_len or 0, eval_len=eval_len or 0,
                        n_buckets=n_buckets or 8, command=command, n_runs=sum(len(r.runs) for r in rows), jobs=1,
                        grid=grid, mode="grid" if grid else "single", sources=sources)
    result.verdicts = [v for g_rows, g_grid in groups for v in verdicts_of(g_rows, g_grid)]
    result.long_verdicts = [v for g_rows, _ in groups for v in verdicts_of(g_rows, metric="long_val_loss")]
    result.recipe = " ".join(f"Source {k}: {text}" for k, text in enumerate(recipes, 1) if text)
    write_files(result, None, "", started=started)
    return result


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_curves(rows: Sequence[SpecRow], out: Path, *, imbalance: bool = False) -> Path:
    """Validation estimates (or, with ``imbalance``, expert load imbalances) against optimizer steps: one colour per
    row, one thin line per seed."""
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
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)
    return out


def plot_train_curves(rows: Sequence[SpecRow], loss_out: Path, grad_out: Path) -> tuple[Path, Path]:
    """The logged batch losses and gradient norms against optimizer steps, one colour per row, every seed."""
    plt = _pyplot()
    for key, out, label, log in (("train_curve", loss_out, "training batch loss (nats / token)", False),
                                 ("grad_curve", grad_out, "gradient norm (before clipping)", True)):
        fig, ax = plt.subplots(figsize=(7, 4.2), dpi=110)
        for i, row in enumerate(rows):
            for j, r in enumerate(row.runs):
                curve = getattr(r, key)
                if curve:
                    steps, vals = zip(*curve)
                    ax.plot(steps, vals, color=f"C{i % 10}", lw=0.6, alpha=0.7, label=f"{row.spec} (lr {row.lr:g})" if j == 0 else None)
        if log:
            ax.set_yscale("log")
        ax.set_xlabel("optimizer step")
        ax.set_ylabel(label)
        ax.set_title(label.split(" (")[0] + ", every seed")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(out)
        plt.close(fig)
    return loss_out, grad_out


def plot_lr(rows: Sequence[SpecRow], out: Path) -> Path:
    """Validation loss against learning rate (log x) of a sweep or grid, one line per row: one line style per design,
    darker for larger sizes, the winner marked."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=110)
    designs = list(dict.fromkeys(r.design or r.spec for r in rows))
    styles = ["-", "--", ":", "-."]
    for k, design in enumerate(designs):
        mine = [r for r in rows if (r.design or r.spec) == design and r.sweep]
        cmap = plt.get_cmap(["Blues", "Oranges", "Greens", "Purples"][k % 4])
        for j, r in enumerate(mine):
            lrs = sorted(r.sweep)
            colour = cmap(0.4 + 0.6 * (j + 1) / max(1, len(mine)))
            ax.plot(lrs, [r.sweep[lr] for lr in lrs], styles[k % 4], marker="o", ms=3, color=colour, label=r.spec)
            ax.plot([r.lr], [r.sweep[r.lr]], "*", ms=10, color=colour)
    ax.set_xscale("log")
    ax.set_xlabel("peak learning rate")
    ax.set_ylabel("validation loss (nats / token)")
    ax.set_title("validation loss against learning rate (star: each row's best)")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7, ncol=2)
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
        "## Expert load imbalance", "",
        "Max expert load / mean expert load on the fixed evaluation windows (1 = every expert gets the same number of "
        "token assignments), mean over the MoE layers, then mean ± sample std over seeds.", "",
        "| spec | load imbalance at step 0 | load imbalance at the end |", "|---|---:|---:|",
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
    text = (f"tokens/s: the mean over seeds of each run's own training throughput, measured while the machine's 1-minute "
            f"load average was {lo:.1f}-{hi:.1f} on {cores} cores")
    if shared:
        return text + (": the machine was shared, so runs made at different moments are not comparable by these "
                       "figures (the interleaved measurement below, where given, is).")
    return text + "."


def write_report(result: Comparison, scope: str, *, lr_sweep: bool) -> Path:
    """``report.md``: the recipe, the table, the verdicts, the learning rates, the instability reading, the
    throughput, the ladder, the curves and the position buckets; sections that do not apply are left out."""
    rows = result.rows
    seeds = max(len(r.runs) for r in rows)
    pace = "one at a time" if result.jobs == 1 else f"{result.jobs} at a time"
    bpb = any(r.val_bpb_mean is not None for r in rows)
    lines = ["# Design comparison", ""]
    if result.sources:
        lines += ["Merged from " + "; ".join(result.sources) + ".", ""]
    lines += [
        (result.recipe + " " if result.recipe else "")
        + "Losses are cross-entropy in nats per token: train is the last estimate on fixed training windows, validation "
        f"{scope}; "
        + ("bits per byte is that validation score per UTF-8 byte of the scored text (loss x tokens / bytes / ln 2), "
           "which does not depend on the tokenizer; " if bpb else "")
        + "mean ± sample std over seeds. A run diverged when a loss was not finite or its last validation "
        "estimate ended above its step-0 one.",
        "",
    ]
    if result.command:
        lines += ["Generated by:", "", "```bash", result.command, "```", ""]
    if not result.sources:
        lines += [
            f"Wall time of the whole comparison: {result.wall_s:,.0f} s ({result.wall_s / 60:.1f} min) for {result.n_runs} "
            f"training runs, {pace}.",
            "",
        ]
    ladder = result.ladder is not None
    head = "| spec | parameters | active parameters | lr |" + (" training FLOPs |" if ladder else "") + \
        " tokens/s | train loss | validation loss |" + (" validation bits/byte |" if bpb else "") + " diverged | unstable |"
    lines += [head, "|---|---:|---:|---:|" + ("---:|" if ladder else "") + "---:|---:|---:|" + ("---:|" if bpb else "") + "---:|---:|"]
    for r in rows:
        flops = f" {r.flops:.3g} |" if ladder and r.flops is not None else (" |" if ladder else "")
        bits = (f" {fmt_pm(r.val_bpb_mean, r.val_bpb_std)} |" if r.val_bpb_mean is not None else " |") if bpb else ""
        lines.append(
            f"| {r.spec}{' (held out)' if r.holdout else ''} | {r.params:,} | {r.active_params:,} | {r.lr:g} |{flops} {r.tokens_per_s:,.0f} | "
            f"{fmt_pm(r.train_loss_mean, r.train_loss_std)} | {fmt_pm(r.val_loss_mean, r.val_loss_std)} |{bits} {r.diverged}/{len(r.runs)} | "
            f"{r.unstable}/{len(r.runs)} |"
        )
    lines += ["", _load_note(rows)]
    chosen = [v for v in result.verdicts if v.lr is None]
    if chosen:
        lines += ["", "## Verdicts", "",
                  "Each design against the first at the same size, validation loss: the difference of means with its 95% "
                  "confidence interval over seeds (paired t when both ran the same seeds, Welch's t otherwise); "
                  "*resolved* only when the interval excludes zero.", ""]
        lines += [f"- {v.text()}" for v in chosen]
    if lr_sweep:
        lrs = sorted({lr for r in rows for lr in r.sweep})
        lines += ["", "## Learning-rate sweep", "",
                  "The first seed of each spec at every learning rate (validation loss); the lowest wins and the other seeds train at it.",
                  "", "| spec | " + " | ".join(f"lr {lr:g}" for lr in lrs) + " | winner |",
                  "|---|" + "---:|" * len(lrs) + "---:|"]
        swept = [r for r in rows if r.sweep]  # a merged report may hold rows that were never swept
        for r in swept:
            cells = [(f"**{r.sweep[lr]:.4f}**" if lr == r.lr else f"{r.sweep[lr]:.4f}") if lr in r.sweep else "" for lr in lrs]
            lines.append(f"| {r.spec} | " + " | ".join(cells) + f" | {r.lr:g} |")
        lines += [""] + [f"- {r.spec}: learning rate {r.lr:g} won." for r in swept]
        lines += ["", "![validation loss against learning rate](lr.png)"]
    if result.grid:
        lrs = sorted({r.lr for r in result.grid})
        lines += ["", "## Learning-rate grid", "",
                  f"Every seed of every spec at every learning rate (validation loss, mean ± std over {seeds} seeds); "
                  "the lowest mean wins (bold).", "",
                  "| spec | " + " | ".join(f"lr {lr:g}" for lr in lrs) + " | winner |", "|---|" + "---:|" * len(lrs) + "---:|"]
        gridded = {g.spec for g in result.grid}  # a merged report may hold rows from a source without a grid
        for chosen_row in (r for r in rows if r.spec in gridded):
            cells = []
            for lr in lrs:
                g = next((x for x in result.grid if x.spec == chosen_row.spec and x.lr == lr), None)
                text = fmt_pm(g.val_loss_mean, g.val_loss_std) if g is not None else ""
                cells.append(f"**{text}**" if g is not None and lr == chosen_row.lr else text)
            lines.append(f"| {chosen_row.spec} | " + " | ".join(cells) + f" | {chosen_row.lr:g} |")
        if any(r.sweep for r in result.rows):  # the plot is written under the same condition (one rate: no plot)
            lines += ["", "![validation loss against learning rate](lr.png)"]
        per_lr = [v for v in result.verdicts if v.lr is not None]
        if per_lr:
            lines += ["", "At each learning rate:", ""] + [f"- lr {v.lr:g}: {v.text()}" for v in per_lr]
    lines += ["", "## Instability", "",
              "Per run, from the logged training steps: the fraction of steps whose train loss (mean of the last 5 logged "
              "batches) exceeds its running minimum by more than the run's threshold (stalls and loss spikes), the "
              "gradient-norm spikes (a logged norm above 5x the median of those logged before it, after the first 10) "
              "and the largest norm. The threshold is the margin (`--spike-margin`, 0.1 nats unless changed) plus the "
              "dip that the run's batch noise alone gives the running minimum over its length (noise / sqrt(5) x "
              "sqrt(2 ln(steps / 5)), the noise estimated from the step-to-step changes of the loss), so that a long "
              "healthy run does not count as unstable. A run counts as unstable above 5% or with any spike. Every run "
              "of the comparison, the sweep's and the grid's included.", "",
              "| spec | lr | seed | steps above the running minimum | threshold (nats) | gradient-norm spikes | "
              "largest gradient norm |",
              "|---|---:|---:|---:|---:|---:|---:|"]
    for run in result.all_runs or [run for r in rows for run in r.runs]:
        threshold = f"{run.above_threshold:.3f}" if run.above_threshold > 0 else ""  # older reports did not keep it
        lines.append(f"| {run.spec} | {run.lr:g} | {run.seed} | {run.above_min:.1%} | {threshold} | {run.spikes} | "
                     f"{run.max_grad_norm:.3g} |")
    if result.throughput:
        lines += ["", "## Throughput, measured interleaved", "",
                  "Every variant timed again in one process, round-robin (a few optimizer steps each, three rounds, "
                  "median), so each saw the same load; the ratio is against the first.", "",
                  "| spec | tokens/s | ratio |", "|---|---:|---:|"]
        first = next(iter(result.throughput.values()))
        for label, tps in result.throughput.items():
            lines.append(f"| {label} | {tps:,.0f} | {tps / first:.3f} |")
    if result.ladder is not None:
        from modkit.experiments.ladder import report_lines

        lines += [""] + report_lines(result.ladder)
    lines += ["", "## Curves", "", "![validation loss of every run](curves.png)", "",
              "![training batch loss of every run](train-curves.png)", "", "![gradient norm of every run](grad-norm.png)"]
    imbalance = _imbalance_section(rows)
    if imbalance:
        lines += [""] + imbalance
    scored = [r for r in rows if r.buckets]
    if scored:
        edges = np.array_split(np.arange(result.eval_len), result.n_buckets)
        lines += [
            "", f"## Loss by position at context {result.eval_len} (trained at {result.seq_len})", "",
            "Best checkpoint of each run on the validation split in windows of "
            f"{result.eval_len} tokens; mean loss of the positions in each bucket, mean over seeds. Buckets past "
            f"position {result.seq_len - 1} are beyond the training context.", "",
            "| spec | " + " | ".join(f"{int(e[0])}-{int(e[-1])}" for e in edges) + f" | all {result.eval_len} (mean ± std) |",
            "|---|" + "---:|" * (len(edges) + 1),
        ]
        for r in scored:
            long = fmt_pm(r.long_val_loss_mean, r.long_val_loss_std) if r.long_val_loss_mean is not None else ""
            lines.append(f"| {r.spec} | " + " | ".join(f"{v:.4f}" for v in r.buckets) + f" | {long} |")
        left = [r for r in rows if not r.buckets]
        if left:
            lines += ["", "Not scored at this context: " + "; ".join(f"{r.spec} ({r.buckets_note})" for r in left) + "."]
        if result.long_verdicts:
            lines += ["", (f"Verdicts at context {result.eval_len}: the validation loss over every position of those "
                           "windows (the last column), each scored design against the first, as above."), ""]
            lines += [f"- {v.text()}" for v in result.long_verdicts]
        lines += ["", "![loss by position](positions.png)"]
    lines += ["", "## Runs", "", "| spec | lr | seed | train loss | validation loss | diverged | folder |", "|---|---:|---:|---:|---:|---|---|"]
    for r in rows:
        for run in r.runs:
            lines.append(f"| {r.spec} | {run.lr:g} | {run.seed} | {run.train_loss:.4f} | {run.val_loss:.4f} | "
                         f"{'yes' if run.diverged else 'no'} | runs/{run.run_dir.name} |")
    result.report.write_text("\n".join(lines) + "\n")
    return result.report

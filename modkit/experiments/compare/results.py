"""The records of a comparison: one run (:class:`RunSummary`), a variant's table row (:class:`SpecRow`), a verdict
(:class:`Verdict`), the whole comparison (:class:`Comparison`), its error (:class:`CompareError`), and the mean ± sample
std figures every table shows (:func:`mean_std`, :func:`fmt_pm`)."""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

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
        stall: the run's stall (:func:`modkit.experiments.compare.stalls.find_stall`: ``{"start", "end", "share",
            "level", "reference", "against"}``), ``None`` when it did not stall.
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
    stall: Optional[dict] = None


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
        return {
            "a": self.a,
            "b": self.b,
            "lr": self.lr,
            **asdict(self.difference),
            "resolved": self.difference.resolved,
        }

    def text(self) -> str:
        """The verdict sentence (:meth:`modkit.experiments.stats.Difference.text`)."""
        return self.difference.text(self.a, self.b)


@dataclass
class Comparison:
    """What :func:`~modkit.experiments.compare.compare` returns: one :class:`SpecRow` per variant (at its chosen
    learning rate), the report folder and its files.

    ``grid`` holds every (variant, learning rate) row of an lr grid; ``verdicts`` the computed differences (each
    design against the first at every size; with a grid, at every rate too), ``long_verdicts`` the same on the
    validation loss at twice the training length (chosen rates only); ``ladder`` the fits
    (:class:`modkit.experiments.ladder.Ladder`) of a ladder. ``command`` is the command line that ran the comparison
    (``None`` from Python); ``wall_s`` the wall time of the whole comparison in seconds; ``n_runs`` the training runs
    it made; ``jobs`` how many ran at once; ``throughput`` the interleaved tokens/s per variant when measured;
    ``ladder_error`` why a ladder's fit failed (the report says so in place of the fit).
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
    ladder_error: Optional[str] = None

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


def fmt_pm(mean: float, std: Optional[float]) -> str:
    """``"1.2345 ± 0.0123"`` (the std left out for one seed)."""
    return f"{mean:.4f}" if std is None else f"{mean:.4f} ± {std:.4f}"


def _finite(x: float) -> float:
    """``x``, or ``inf`` when it is not finite (a diverged run's loss never wins a minimum)."""
    return x if math.isfinite(x) else math.inf

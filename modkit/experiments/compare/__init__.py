"""Compare model designs under one training recipe: same data, token budget, schedule and seeds for every spec.

    from modkit.experiments.compare import compare
    result = compare(["specs/a.json", "specs/b.json"], "train.json", "reports/ab", seeds=3, lr_grid=[1e-3, 3e-3])
    result.rows[0].val_loss_mean, result.differences, result.report   # report.md, curves.png, results.json

    from modkit.experiments.compare import CompareRequest, compare
    result = compare(CompareRequest(["specs/a.json", "specs/b.json"], "train.json", "reports/ab", seeds=3))

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
a 95% confidence interval over seeds (:func:`modkit.experiments.stats.mean_difference`: paired t when both ran the
same seeds, which they do unless reports were merged, Welch otherwise); *resolved* only when the interval excludes
zero. With an lr grid the same at every rate.

**Ladders** (``ladder=True``, two or more sizes): each size trains for a token budget of its own (``tokens_per_param``
times its parameters, or an explicit ``tokens`` list), FLOPs from :mod:`modkit.analysis.cost`;
:mod:`modkit.experiments.ladder` fits ``L(C) = E + A C^-alpha`` per design with bootstrap intervals over seeds, the
compute multiplier of each design over the first, and checks the fit on a held-out larger size (``holdout``) it did
not see.

A run has *diverged* when any loss it logged is not finite, or its last validation estimate is above its step-0 one.
The *instability* reading (:func:`modkit.experiments.stats.instability`) catches rises and spikes: the fraction of
logged steps whose smoothed train loss sits above its running minimum by ``spike_margin`` nats plus the dip that the
run's batch noise alone gives that minimum over the run's length, and the gradient-norm spikes. A plateau sits at its
own running minimum, so the *stall* reading (:mod:`~modkit.experiments.compare.stalls`) catches it: a run whose loss
goes without improving for half or more of its logged steps while above the best run of its design (or its own
earlier minimum) is reported stalled, with the step range. Unstable = above 5%, a spike, or stalled.

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

The package, by what each part does: :mod:`~modkit.experiments.compare.plan` (the request, its checks and the
variants it trains), :mod:`~modkit.experiments.compare.run` (training the runs, throughput, :func:`compare`),
:mod:`~modkit.experiments.compare.rows` (the table rows and the loss by position),
:mod:`~modkit.experiments.compare.report` (verdicts, ``report.md``, ``results.json``),
:mod:`~modkit.experiments.compare.plots`, :mod:`~modkit.experiments.compare.merge` (one report from several) and
:mod:`~modkit.experiments.compare.results` (the records: runs, rows, verdicts, the comparison).
"""

# the private names stay importable from here as they were from the single module (docs and tests use some)
from .merge import merge_reports
from .plan import RESERVED_FIELDS, ComparePlan, CompareRequest, check_request, make_plan, parse_ints, parse_lrs
from .plan import _holdout_tokens, _label_specs, _sizes, _Variant  # noqa: F401
from .plots import plot_buckets, plot_curves, plot_lr, plot_train_curves
from .plots import _pyplot  # noqa: F401
from .report import verdicts_of, write_files, write_partial, write_report
from .report import _imbalance_section, _load_note, _recipe, _row_from_json, _row_json, _validation_scope  # noqa: F401
from .results import CompareError, Comparison, RunSummary, SpecRow, Verdict, fmt_pm, mean_std
from .results import _finite  # noqa: F401
from .rows import bucket_means, position_losses, score_positions, table_rows
from .run import compare, measure_throughput, read_run, train_runs
from .run import _instability_of, _load_average, _train_run  # noqa: F401

__all__ = [
    "CompareError",
    "ComparePlan",
    "CompareRequest",
    "Comparison",
    "RESERVED_FIELDS",
    "RunSummary",
    "SpecRow",
    "Verdict",
    "bucket_means",
    "check_request",
    "compare",
    "fmt_pm",
    "make_plan",
    "mean_std",
    "measure_throughput",
    "merge_reports",
    "parse_ints",
    "parse_lrs",
    "plot_buckets",
    "plot_curves",
    "plot_lr",
    "plot_train_curves",
    "position_losses",
    "read_run",
    "score_positions",
    "table_rows",
    "train_runs",
    "verdicts_of",
    "write_files",
    "write_partial",
    "write_report",
]

"""What a comparison trains: the request (:class:`CompareRequest`), its checks before any run trains
(:func:`check_request`), and the plan made from it (:func:`make_plan`): the report folder, the prepared data, and every
variant (a design at a size and token budget) resolved against the config and data.

Every check that can fail runs here, before the first run trains: a typo costs no runs.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Sequence, Union

from .results import CompareError
from .spec_fields import check_spec_fields, write_edited

#: training-config fields a comparison sets itself (a per-spec override may not)
RESERVED_FIELDS = ("model", "data", "seed", "sample_tokens")


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
            raise CompareError(
                f"{flag}: {part!r} is not a number; give learning rates separated by commas, e.g. 1e-3,3e-3"
            ) from None
        if not math.isfinite(value) or value <= 0:
            raise CompareError(f"{flag}: {part!r} is not a positive learning rate")
        if value in out:
            raise CompareError(f"{flag}: {part} is listed twice")
        out.append(value)
    return out


#: the largest margin of the instability reading (nats): far above any rise of a loss (a uniform guess over the
#: 2**24 tokens of the largest vocabulary costs 16.6 nats)
MAX_SPIKE_MARGIN = 100.0
#: the largest token budget per parameter [Chinchilla: 20; Llama 3 8B: about 1,900]
MAX_TOKENS_PER_PARAM = 1e6


def parse_ratios(text: str, flag: str = "--tokens-per-param") -> list[float]:
    """``"20,40"`` -> ``[20.0, 40.0]``: token budgets per parameter, each a finite number in
    ``(0, MAX_TOKENS_PER_PARAM]``.

    Raises:
        CompareError: an entry that is not a number or is outside the range (the message names ``flag``).
    """
    out = []
    for part in text.split(","):
        try:
            value = float(part)
        except ValueError:
            raise CompareError(
                f"{flag} {text!r}: {part.strip()!r} is not a number; give numbers separated by commas"
            ) from None
        out.append(value)
    check_options(tokens_per_param=out, names={"tokens_per_param": flag})
    return out


def check_options(
    *,
    spike_margin: float = 0.1,
    throughput_steps: int = 0,
    tokens_per_param: Optional[Sequence[float]] = None,
    names: Optional[dict[str, str]] = None,
) -> None:
    """Refuse a meaningless reading option: ``spike_margin`` not a finite number in ``(0, MAX_SPIKE_MARGIN]`` nats
    (NaN read every run as stable), ``throughput_steps`` below 0, a ``tokens_per_param`` budget not a finite number
    in ``(0, MAX_TOKENS_PER_PARAM]``. ``names`` maps a field to the name the message uses (a command's flag).

    Raises:
        CompareError: naming the option, the value and the range.
    """
    names = names or {}
    margin = names.get("spike_margin", "spike_margin")
    if not (isinstance(spike_margin, (int, float)) and 0 < spike_margin <= MAX_SPIKE_MARGIN):
        raise CompareError(
            f"{margin} = {spike_margin!r}: give a number of nats in (0, {MAX_SPIKE_MARGIN:g}] (default 0.1); a loss "
            "counts as unstable while it is more than this above its running minimum"
        )
    if not isinstance(throughput_steps, int) or throughput_steps < 0:
        raise CompareError(
            f"{names.get('throughput_steps', 'throughput_steps')} = {throughput_steps!r}: give 0 (no throughput "
            "timing) or a positive number of steps"
        )
    for ratio in tokens_per_param or ():
        if not (isinstance(ratio, (int, float)) and 0 < ratio <= MAX_TOKENS_PER_PARAM):
            raise CompareError(
                f"{names.get('tokens_per_param', 'tokens_per_param')}: {ratio!r} is not a token budget per "
                f"parameter; give finite numbers in (0, {MAX_TOKENS_PER_PARAM:g}] (Chinchilla: 20)"
            )


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


@dataclass(frozen=True)
class CompareRequest:
    """A comparison as asked: which specs, under which training config, with which seeds, rates and sizes.

    :func:`modkit.experiments.compare.compare` takes one (``compare(request)``) or builds one from its arguments
    (``compare(specs, config, out_dir, seeds=3, ...)``: the same names). Nothing is checked on construction but the
    types the fields are copied as; :func:`check_request` checks the rest before any run trains.

    Attributes:
        specs: spec JSON files (labelled by file name), ``"LABEL=FILE"`` strings or ``(label, file)`` pairs.
        config: the training config (file, dict or ``None`` for the defaults); its ``model`` is replaced by each spec.
        out_dir: the report folder (``report.md``, ``curves.png``, ``train-curves.png``, ``grad-norm.png``,
            ``positions.png``, ``ladder.png``, ``results.json``, ``specs/``, ``runs/``, and ``data/`` when the config
            names text files rather than a prepared folder).
        seeds: runs per variant, seeds ``config.seed + 0 .. seeds - 1``.
        lr_sweep: learning rates tried on the first seed of each variant (the others train at the winner).
        lr_grid: learning rates every seed trains at (not with ``lr_sweep``).
        overrides: training-config fields to replace for every run (e.g. ``{"max_steps": 100}``); a dict (a copy)
            after construction, ``{}`` for ``None``.
        spec_overrides: ``{label: {field: value}}``: training-config fields for one design's runs (not ``model``,
            ``data``, ``seed``, ``sample_tokens``; not ``lr`` together with a sweep or grid); copied, ``{}`` for
            ``None``.
        spec_fields: ``{label: {dotted spec path: value}}``: spec fields replaced in one design's spec
            (:mod:`~modkit.experiments.compare.spec_fields`; ``--set LABEL:PATH=JSON``); copied, ``{}`` for ``None``.
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
    """

    specs: Sequence[Union[str, Path, tuple]]
    config: Union[str, Path, dict, None]
    out_dir: Union[str, Path]
    seeds: int = 3
    lr_sweep: Optional[Sequence[float]] = None
    lr_grid: Optional[Sequence[float]] = None
    overrides: Optional[dict[str, Any]] = None
    spec_overrides: Optional[dict[str, dict[str, Any]]] = None
    spec_fields: Optional[dict[str, dict[str, Any]]] = None
    widths: Optional[Sequence[int]] = None
    depths: Optional[Sequence[int]] = None
    ladder: bool = False
    tokens_per_param: Optional[Sequence[float]] = None
    tokens: Optional[Sequence[int]] = None
    holdout: Optional[tuple[Optional[int], Optional[int]]] = None
    throughput_steps: int = 0
    spike_margin: float = 0.1
    n_buckets: int = 8
    jobs: int = 1
    command: Optional[str] = None
    echo: Callable[[str], None] = print

    def __post_init__(self) -> None:
        object.__setattr__(self, "overrides", dict(self.overrides or {}))
        object.__setattr__(self, "spec_overrides", {k: dict(v) for k, v in (self.spec_overrides or {}).items()})
        object.__setattr__(self, "spec_fields", {k: dict(v) for k, v in (self.spec_fields or {}).items()})

    @property
    def mode(self) -> str:
        """``"grid"`` (every seed at every rate), ``"sweep"`` (the first seed at every rate) or ``"single"``."""
        return "grid" if self.lr_grid else "sweep" if self.lr_sweep else "single"

    @property
    def lrs(self) -> list[float]:
        """The learning rates of the grid or sweep (``[]``: the config's own rate)."""
        return list(self.lr_grid or self.lr_sweep or [])


@dataclass
class _Variant:
    design: str
    label: str
    path: Path
    size: tuple[int, int]
    holdout: bool
    changes: dict[str, Any]
    spec: Any = None  # resolved ModelSpec


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


def _sizes(
    widths: Optional[Sequence[int]], depths: Optional[Sequence[int]]
) -> list[tuple[Optional[int], Optional[int]]]:
    """``(d_model, n_layers)`` of every size, widths varying fastest (``None``: the spec's); ``[]`` without sizes."""
    if not widths and not depths:
        return []
    return [(w, d) for d in (depths or [None]) for w in (widths or [None])]


def _check_counts(request: CompareRequest) -> None:
    """The checks that need no file: specs, seeds, jobs, buckets, the reading options (:func:`check_options`), the
    sweep or grid."""
    if not request.specs:
        raise CompareError("give at least one spec to compare")
    if request.seeds < 1:
        raise CompareError(f"seeds = {request.seeds}: give 1 or more")
    if request.jobs < 1:
        raise CompareError(f"jobs = {request.jobs}: give 1 or more")
    if request.n_buckets < 1:
        raise CompareError(f"n_buckets = {request.n_buckets}: give 1 or more")
    check_options(
        spike_margin=request.spike_margin,
        throughput_steps=request.throughput_steps,
        tokens_per_param=request.tokens_per_param,
    )
    if request.lr_sweep is not None and request.lr_grid is not None:
        raise CompareError("give a learning-rate sweep (one seed) or a grid (every seed), not both")
    for name, lrs in (("sweep", request.lr_sweep), ("grid", request.lr_grid)):
        if lrs is not None and not lrs:
            raise CompareError(f"the learning-rate {name} is empty; give one or more learning rates or none")


def _check_spec_overrides(request: CompareRequest, labels: Sequence[str]) -> None:
    """Each per-spec override names a spec label and a training-config field the comparison does not set itself."""
    from modkit.train.config import TrainConfig

    for label, fields in request.spec_overrides.items():
        if label not in labels:
            raise CompareError(
                f"per-spec override for {label!r}, which is not a spec label; labels: {', '.join(labels)}"
            )
        for name in fields:
            if name in RESERVED_FIELDS:
                raise CompareError(f"per-spec override {label}:{name}: the comparison sets {name} itself")
            if name not in TrainConfig.model_fields:
                raise CompareError(
                    f"per-spec override {label}:{name}: not a training-config field ('modkit schema --train')"
                )
            if name == "lr" and (request.lr_sweep or request.lr_grid):
                raise CompareError(
                    f"per-spec override {label}:lr with a learning-rate sweep or grid: sweep it or set it, not both"
                )


def _check_sizes(request: CompareRequest, sizes: Sequence[tuple]) -> None:
    """A ladder, token budgets per size and a held-out size all need sizes; budgets one per size."""
    tokens_per_param, tokens = request.tokens_per_param, request.tokens
    if request.ladder and not sizes:
        raise CompareError("a ladder needs three or more sizes: give widths and/or depths")
    fitted = len(sizes) * max(1, len(tokens_per_param or []))
    if request.ladder and fitted < 3:
        raise CompareError(
            f"a ladder fit needs three or more fitted sizes per design, got {fitted} "
            f"(widths {list(request.widths or []) or 'the spec'}, depths {list(request.depths or []) or 'the spec'}"
            + (f", {len(tokens_per_param)} token budgets" if tokens_per_param else "")
            + "): give another width or depth (a held-out size is not fitted), so that the comparison does not "
            "train runs it cannot fit"
        )
    if (tokens_per_param or tokens) and not sizes:
        raise CompareError("a token budget per size needs sizes: give widths and/or depths")
    if tokens_per_param and tokens:
        raise CompareError("give tokens_per_param or tokens, not both")
    if tokens is not None and len(tokens) != len(sizes):
        raise CompareError(f"{len(tokens)} token budgets for {len(sizes)} sizes; give one per size, in size order")
    if request.holdout is not None and not sizes:
        raise CompareError("a held-out size needs a ladder of sizes")


def check_request(request: CompareRequest) -> list[tuple[str, Path]]:
    """Check what a request asks for without reading the config or data; ``(label, resolved path)`` of each spec.

    Raises:
        CompareError: no specs, ``seeds < 1``, ``jobs < 1``, ``n_buckets < 1``, an empty sweep or grid, both a sweep
            and a grid, a missing spec file or a repeated or malformed label, a per-spec override of an unknown label,
            a reserved or unknown field or ``lr`` with a sweep or grid, a ladder with fewer than three fitted sizes, token
            budgets or a held-out size without sizes, both budgets, or a number of budgets other than of sizes; a
            spec-field override of an unknown label or one that leaves the spec invalid.
    """
    _check_counts(request)
    labelled = _label_specs(request.specs)
    _check_spec_overrides(request, [label for label, _ in labelled])
    check_spec_fields(request.spec_fields, labelled)
    _check_sizes(request, _sizes(request.widths, request.depths))
    return labelled


@dataclass
class ComparePlan:
    """A checked request made concrete: the base training config (of the first spec), the report folder, the
    prepared data every run reads and every variant with its resolved spec and its own config changes.

    ``started`` is the :func:`time.perf_counter` reading at which the comparison began (seconds).
    """

    request: CompareRequest
    base: Any  # modkit.train.config.TrainConfig
    base_dir: Path
    out: Path
    data_folder: str
    started: float
    variants: list[_Variant] = field(default_factory=list)

    def config_of(self, v: _Variant) -> Any:
        """The training config of variant ``v`` (the request's config with ``v``'s changes and spec).

        Raises:
            SpecError / TrainError: the changes do not fit the config's rules.
        """
        from modkit.train import load_train_config

        cfg, _ = load_train_config(self.request.config, {**v.changes, "model": str(v.path)})
        return cfg

    def run_changes(self, v: _Variant, lr: Optional[float], i: int) -> dict[str, Any]:
        """Training-config changes of run ``i`` (seed ``base.seed + i``) of ``v`` at ``lr`` (``None``: the config's
        rate); the schedule keeps the config's ``min_lr / lr`` ratio at a swept rate."""
        cfg = self.config_of(v)
        rate = lr if lr is not None else cfg.lr
        return {
            **v.changes,
            "model": str(v.path),
            "seed": self.base.seed + i,
            "lr": rate,
            "data": self.data_folder,
            "min_lr": min(rate, cfg.min_lr * rate / cfg.lr),
            "sample_tokens": 0,
        }


def _open_report_folder(out: Path) -> None:
    """Make ``out/runs``.

    Raises:
        CompareError: ``out`` already holds a comparison, or runs of one that stopped.
    """
    if (out / "results.json").exists():
        raise CompareError(f"{out} already holds a comparison; choose another report folder")
    if (out / "runs").is_dir() and any((out / "runs").iterdir()):
        raise CompareError(
            f"{out / 'runs'} already holds runs (of a comparison that stopped?); choose another report "
            "folder or delete that one"
        )
    (out / "runs").mkdir(parents=True, exist_ok=True)


def _sized_variants(request: CompareRequest, label: str, path: Path, own: dict[str, Any], out: Path) -> list[_Variant]:
    """Design ``label`` at every size (and every ``tokens_per_param`` budget), each resized spec written to
    ``out/specs/<variant>.json``; the held-out size last.

    Raises:
        CompareError: a size the design cannot take (:func:`modkit.experiments.scaling.resize_checked`).
    """
    import modkit
    from modkit.experiments.scaling import ScalingError, resize_checked

    data = modkit.load_spec(path).to_dict()
    holdout = request.holdout
    plan = [(s, False) for s in _sizes(request.widths, request.depths)]
    if holdout:
        plan.append(((holdout[0] or data["d_model"], holdout[1] or data["n_layers"]), True))
    budgets = list(request.tokens_per_param) if request.tokens_per_param else [None]
    variants = []
    for k, ((d, n), held) in enumerate(plan):
        for ratio in budgets:
            try:
                resized = resize_checked(data, d_model=d or data["d_model"], n_layers=n or data["n_layers"], name=None)
            except ScalingError as exc:
                raise CompareError(f"design {label}: {exc}") from None
            vlabel = f"{label}-d{resized['d_model']}-l{resized['n_layers']}"
            vlabel += f"-t{ratio:g}" if len(budgets) > 1 else ""
            resized["name"] = vlabel
            (out / "specs").mkdir(exist_ok=True)
            vpath = out / "specs" / f"{vlabel}.json"
            vpath.write_text(json.dumps(resized, indent=1) + "\n")
            changes = dict(own)
            if request.tokens is not None and not held:
                changes.update(max_tokens=int(request.tokens[k]), max_steps=None)
            if ratio is not None:
                changes["_ratio"] = ratio
            variants.append(_Variant(label, vlabel, vpath, (resized["d_model"], resized["n_layers"]), held, changes))
    return variants


def _holdout_tokens(variants: list[_Variant], held: _Variant, tokens: Sequence[int]) -> int:
    """The held-out size's budget from the last explicit budget's tokens per parameter."""
    import modkit

    fitted = [v for v in variants if v.design == held.design and not v.holdout]
    last = fitted[-1]
    per_param = tokens[len(fitted) - 1] / modkit.count_params(last.spec)
    return max(1, int(math.ceil(per_param * modkit.count_params(held.spec))))


def _resolve_variants(plan: ComparePlan, vocab_size: int) -> None:
    """Resolve every variant's spec against the config and data and set its token budget; each budget is checked
    against the config's rules (:func:`modkit.train.load_train_config`)."""
    import modkit
    from modkit.train.loop import resolve_spec

    request = plan.request
    for v in plan.variants:
        ratio = v.changes.pop("_ratio", None)
        v.spec = resolve_spec(plan.config_of(v), plan.base_dir, vocab_size)
        if ratio is not None:
            v.changes.update(max_tokens=max(1, int(math.ceil(ratio * modkit.count_params(v.spec)))), max_steps=None)
        elif v.holdout and request.tokens_per_param is None and request.tokens is not None:
            # a held-out size with explicit budgets: extrapolate the budget from the last sizes' tokens per parameter
            v.changes.update(max_tokens=_holdout_tokens(plan.variants, v, request.tokens), max_steps=None)
        plan.config_of(v)  # the budget fits the config's rules


def _check_ladder(plan: ComparePlan) -> None:
    """Every variant of a ladder has training FLOPs (:mod:`modkit.analysis.cost`), and each design's held-out size
    is above its fitted sizes in parameters and in training compute (the fit predicts it by extrapolation).

    Raises:
        CompareError: a variant whose FLOPs modkit cost cannot count; a held-out size at or below a fitted one.
    """
    import modkit
    from modkit.analysis.cost import CostError, training_flops_per_token

    compute: dict[str, tuple[int, float]] = {}
    for v in plan.variants:
        cfg = plan.config_of(v)
        try:
            per_token = training_flops_per_token(v.spec, cfg.seq_len)
        except CostError as exc:
            raise CompareError(f"a ladder needs FLOPs from modkit cost; {v.label}: {exc}") from None
        compute[v.label] = (modkit.count_params(v.spec), per_token * cfg.total_steps * cfg.tokens_per_step)
    for held in (v for v in plan.variants if v.holdout):
        fitted = [v for v in plan.variants if v.design == held.design and not v.holdout]
        top = max(fitted, key=lambda v: compute[v.label][1])
        (n_h, c_h), (n_top, c_top) = compute[held.label], compute[top.label]
        if n_h <= max(compute[v.label][0] for v in fitted) or c_h <= c_top:
            raise CompareError(
                f"design {held.design}: the held-out size d_model {held.size[0]}, n_layers {held.size[1]} "
                f"({n_h:,} parameters, {c_h:.3g} training FLOPs) is not above the fitted sizes (largest: "
                f"d_model {top.size[0]}, n_layers {top.size[1]}, {n_top:,} parameters, {c_top:.3g} FLOPs); "
                "a held-out check extrapolates: give a held-out width or depth above the ladder's"
            )


def make_plan(request: CompareRequest, started: float) -> ComparePlan:
    """Check ``request``, open its report folder, prepare the data and resolve every variant (no run trains).

    Raises:
        CompareError: what :func:`check_request` raises; a report folder that already holds a comparison or runs; a
            size a design cannot take; a ladder variant without FLOPs; a held-out size not above the fitted ones.
        SpecError / TrainError / DataError: an invalid config or spec, a spec (or a size of it) that does not fit the
            config or data, missing data.
    """
    from modkit.data import TokenData
    from modkit.train import load_train_config
    from modkit.train.config import schedule_warning
    from modkit.train.loop import prepared_data

    labelled = check_request(request)
    first = {**request.overrides, "model": str(labelled[0][1])}
    base, base_dir = load_train_config(request.config, first)  # fail early, whole config
    warning = schedule_warning(base)
    if warning:
        request.echo(f"warning: {warning}")
    out = Path(request.out_dir)
    _open_report_folder(out)
    data_folder = str(prepared_data(base, base_dir, out / "data"))  # every run reads these same tokens
    plan = ComparePlan(request, base, base_dir, out, data_folder, started)
    for label, path in labelled:
        if label in request.spec_fields:
            path = write_edited(label, path, request.spec_fields[label], out)
        own = {**request.overrides, **request.spec_overrides.get(label, {})}
        if request.widths or request.depths:
            plan.variants += _sized_variants(request, label, path, own, out)
        else:
            plan.variants.append(_Variant(label, label, path, (0, 0), False, own))
    _resolve_variants(plan, TokenData.open(data_folder, verify=False).vocab_size)
    if request.ladder:
        _check_ladder(plan)
    return plan

"""Reading a comparison's ``results.json`` back (``modkit compare --merge``): strictly, as every JSON file modkit
reads (:func:`modkit.core.jsonio.read_json_file`: UTF-8, no duplicate keys, bounded size and nesting), then checked
against the structure :func:`~modkit.experiments.compare.report.write_files` writes.

Every problem is named by file, row and field (``results.json: rows[0].runs[1].val_loss: Input should be a number,
not a string (got "1.0")``), so a damaged, truncated or hand-edited file is refused before any of it is used. Fields
an older report lacks take their defaults; a key this version does not know is refused inside a row, a run or a
stall (where a typo would silently drop a value) and ignored at the top level. ``NaN`` and ``Infinity`` are accepted
only where modkit writes them: in a run marked ``diverged`` (its losses, curves, buckets), as a run's
``max_grad_norm`` (``NaN``: not measured), and in a row's mean / std or bucket when one of its runs holds a non-finite
value there (the mean over a diverged run); every other number must be finite. Position buckets hold ``n_buckets``
values each, in every row and run.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from modkit.core.jsonio import JSONInputError, read_json_file
from modkit.core.validation import ErrorFormatter, json_kind, models_in

from .results import CompareError

#: the largest ``results.json`` read back (bytes): its curves grow with runs and logged steps, far below this
MAX_RESULTS_BYTES = 256 * 2**20

#: a run's numbers that only a run marked diverged may write as NaN / Infinity
DIVERGED_FIELDS = ("train_loss", "val_loss", "initial_val_loss", "curve", "train_curve", "grad_curve", "buckets")
DIVERGED_FIELDS += ("above_min", "above_threshold", "val_bpb", "imbalance_curve", "long_val_loss", "max_grad_norm")

Count = Annotated[int, Field(ge=0)]
#: a curve point ``[step, value]``
Point = Annotated[list[float], Field(min_length=2, max_length=2)]


class _Saved(BaseModel):
    """Base of the models of ``results.json``: strict types (``"1.0"`` is not a number), unknown keys refused."""

    model_config = ConfigDict(strict=True, extra="forbid", protected_namespaces=())


def _nonfinite(value: object) -> list[tuple[str, float]]:
    """``(where, value)`` of every non-finite number in ``value`` (a number, a list of them, a list of points);
    ``where`` is ``""`` for ``value`` itself, else ``".i"`` / ``".i.j"``."""
    if isinstance(value, float):
        return [] if math.isfinite(value) else [("", value)]
    if isinstance(value, (list, tuple)):
        return [(f".{i}{w}", v) for i, item in enumerate(value) for w, v in _nonfinite(item)]
    return []


def _refuse_nonfinite(obj: BaseModel, fields: list[str], why: str) -> None:
    """Raise ``ValueError`` naming the first non-finite number among ``fields`` of ``obj``."""
    for name in fields:
        for where, v in _nonfinite(getattr(obj, name)):
            raise ValueError(f"{name}{where} = {v}: not a finite number ({why}); give a finite number")


def _values(x: object) -> str:
    return f"{len(x)} value(s)" if isinstance(x, list) else "none"


class _Stall(_Saved):
    start: int
    end: int
    share: float
    level: float
    reference: float
    against: str


class _Run(_Saved):
    spec: str
    lr: float
    seed: int
    run_dir: str
    train_loss: float
    val_loss: float
    initial_val_loss: float
    tokens_per_s: float
    diverged: bool
    curve: list[Point]
    buckets: Optional[list[float]] = None
    elapsed_s: float = 0.0
    train_curve: list[Point] = []
    grad_curve: list[Point] = []
    above_min: float = 0.0
    spikes: Count = 0
    max_grad_norm: float = 0.0
    above_threshold: float = 0.0
    load: Point = [0.0, 0.0]
    cores: Count = 0
    tokens: Count = 0
    val_bpb: Optional[float] = None
    imbalance_curve: list[Point] = []
    long_val_loss: Optional[float] = None
    stall: Optional[_Stall] = None

    @model_validator(mode="after")
    def _finite(self) -> "_Run":
        _refuse_nonfinite(self, ["lr", "tokens_per_s", "elapsed_s"], "modkit writes it finite")
        if self.stall is not None:
            _refuse_nonfinite(self.stall, ["share", "level", "reference"], "modkit writes it finite")
        if not self.diverged:
            nan_ok = self.max_grad_norm != self.max_grad_norm  # NaN: no gradient norm was logged
            fields = [f for f in DIVERGED_FIELDS if not (f == "max_grad_norm" and nan_ok)]
            _refuse_nonfinite(self, fields, "only a run marked diverged holds one")
        return self


class _Row(_Saved):
    spec: str
    path: str
    params: Count
    active_params: Count
    lr: float
    tokens_per_s: float
    train_loss_mean: float
    train_loss_std: Optional[float]
    val_loss_mean: float
    val_loss_std: Optional[float]
    diverged: Count
    runs: Annotated[list[_Run], Field(min_length=1)]
    sweep: dict[str, float] = {}
    buckets: Optional[list[float]] = None
    buckets_note: str = ""
    design: str = ""
    size: Annotated[list[Count], Field(min_length=2, max_length=2)] = [0, 0]
    flops_per_token: Optional[Count] = None
    tokens: Count = 0
    holdout: bool = False
    unstable: Count = 0
    val_bpb_mean: Optional[float] = None
    val_bpb_std: Optional[float] = None
    long_val_loss_mean: Optional[float] = None
    long_val_loss_std: Optional[float] = None

    @field_validator("sweep")
    @classmethod
    def _rates(cls, sweep: dict[str, float]) -> dict[str, float]:
        for key in sweep:
            try:
                float(key)
            except ValueError:
                raise ValueError(f"the key {key!r} is not a learning rate (a number written as text)") from None
        return sweep

    @model_validator(mode="after")
    def _consistent(self) -> "_Row":
        _refuse_nonfinite(self, ["lr", "tokens_per_s"], "modkit writes it finite")
        for stat in ("train_loss", "val_loss", "val_bpb", "long_val_loss"):
            self._means_of(stat)
        lengths = {len(r.buckets) for r in self.runs if r.buckets is not None}
        for i, r in enumerate(self.runs):
            if r.buckets is not None and self.buckets is not None and len(r.buckets) != len(self.buckets):
                raise ValueError(
                    f"runs.{i}.buckets has {_values(r.buckets)} but the row's buckets {_values(self.buckets)}; "
                    "every run of a row and the row itself hold one value per position bucket"
                )
        if len(lengths) > 1:
            raise ValueError(f"the runs' buckets have {sorted(lengths)} values; they hold one per position bucket")
        if self.buckets is not None:
            runs = [r.buckets for r in self.runs if r.buckets is not None]
            for j, v in enumerate(self.buckets):
                if not math.isfinite(v) and all(j < len(b) and math.isfinite(b[j]) for b in runs):
                    raise ValueError(f"buckets.{j} = {v}: not a finite number (no run's bucket {j} is one)")
        return self

    def _means_of(self, stat: str) -> None:
        """Refuse a non-finite ``{stat}_mean`` / ``{stat}_std`` when every run's ``stat`` is finite."""
        if not any(_nonfinite(getattr(r, stat)) for r in self.runs):
            _refuse_nonfinite(self, [f"{stat}_mean", f"{stat}_std"], f"every run's {stat} is finite")


class _Results(_Saved):
    model_config = ConfigDict(extra="ignore")

    rows: list[_Row]
    grid: list[_Row] = []
    command: Optional[str] = None
    recipe: Optional[str] = None
    scope: Optional[str] = None
    seq_len: Count = 0
    eval_len: Count = 0
    n_buckets: Annotated[int, Field(ge=1)] = 8

    @model_validator(mode="after")
    def _bucket_counts(self) -> "_Results":
        for part in ("rows", "grid"):
            for i, row in enumerate(getattr(self, part)):
                found = [("", row.buckets)] + [(f".runs.{j}", r.buckets) for j, r in enumerate(row.runs)]
                for where, b in found:
                    if b is not None and len(b) != self.n_buckets:
                        raise ValueError(
                            f"{part}.{i}{where}.buckets has {len(b)} value(s) but n_buckets = {self.n_buckets}; "
                            "every row and run holds one value per position bucket"
                        )
        return self


def read_results(path: Path) -> dict:
    """The document of the ``results.json`` at ``path``, checked (see the module docstring).

    Raises:
        CompareError: naming the file and, for each problem, the row and field (``rows[2].runs[0].val_loss``).
    """
    try:
        data = read_json_file(path, max_bytes=MAX_RESULTS_BYTES)
    except JSONInputError as exc:
        problems = "; ".join(f"{p + ': ' if p else ''}{m}" for p, m in exc.errors)
        raise CompareError(f"{path}: {problems}; is it a results.json written by modkit compare?") from None
    if not isinstance(data, dict):
        raise CompareError(
            f"{path}: a results.json is a JSON object with rows, got {json_kind(data)}; give folders written by "
            "modkit compare"
        )
    try:
        _Results.model_validate(data)
    except ValidationError as exc:
        problems = ErrorFormatter(models_in([_Results]).values()).format(exc.errors(), data)
        lines = "".join(f"\n  {p or '<root>'}: {m}" for p, m in problems[:20])
        more = f"\n  ... and {len(problems) - 20} more" if len(problems) > 20 else ""
        raise CompareError(
            f"{path}: not a results.json modkit compare wrote ({len(problems)} problem(s)):{lines}{more}"
        ) from None
    return data

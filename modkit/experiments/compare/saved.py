"""Reading a comparison's ``results.json`` back (``modkit compare --merge``): strictly, as every JSON file modkit
reads (:func:`modkit.core.jsonio.read_json_file`: UTF-8, no duplicate keys, bounded size and nesting), then checked
against the structure :func:`~modkit.experiments.compare.report.write_files` writes.

Every problem is named by file, row and field (``results.json: rows[0].runs[1].val_loss: Input should be a number,
not a string (got "1.0")``), so a damaged, truncated or hand-edited file is refused before any of it is used. Fields
an older report lacks take their defaults; fields this version does not know are ignored. ``NaN`` and
``Infinity`` are accepted where a number is: a diverged run's loss is written that way.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from modkit.core.jsonio import JSONInputError, read_json_file
from modkit.core.validation import ErrorFormatter, json_kind, models_in

from .results import CompareError

#: the largest ``results.json`` read back (bytes): its curves grow with runs and logged steps, far below this
MAX_RESULTS_BYTES = 256 * 2**20

Count = Annotated[int, Field(ge=0)]
#: a curve point ``[step, value]``
Point = Annotated[list[float], Field(min_length=2, max_length=2)]


class _Saved(BaseModel):
    """Base of the models of ``results.json``: strict types (``"1.0"`` is not a number), unknown keys ignored."""

    model_config = ConfigDict(strict=True, extra="ignore", protected_namespaces=())


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


class _Results(_Saved):
    rows: list[_Row] = []
    grid: list[_Row] = []
    command: Optional[str] = None
    recipe: Optional[str] = None
    scope: Optional[str] = None
    seq_len: Count = 0
    eval_len: Count = 0
    n_buckets: Annotated[int, Field(ge=1)] = 8


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

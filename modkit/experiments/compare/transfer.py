"""The transfer table of a comparison with sizes and a learning-rate grid: how much a design loses at each width by
reusing the rate that won at its smallest width instead of tuning the rate again.

The question μP answers (Yang et al. 2022, Tensor Programs V, arXiv:2203.03466, figure 1): tune at a small width,
train at a large one. Per design and depth, with ``w0`` the smallest width and ``lr0`` its winning rate (the lowest
mean validation loss over seeds), each width ``w`` gets ``L(w, lr0) - L(w, lr*(w))``: the mean validation loss at
``lr0`` minus the mean at ``w``'s own winning rate, with the 95% interval of
:func:`modkit.experiments.stats.mean_difference` (paired t over the seeds both rates ran, which in one comparison
they all do; Welch's otherwise). It is 0 where ``lr0`` also wins at ``w``. The interval is over seeds at fixed rates;
it does not widen for ``lr*(w)`` having been picked as the lowest of the grid, which biases the difference up by a
little.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Optional, Sequence

from .results import SpecRow


@dataclass
class TransferRow:
    """One width of one design in the transfer table.

    Attributes:
        design: the spec label. depth, width: ``n_layers`` and ``d_model`` of the size. spec: the variant's label.
        base_width: the smallest width of the design at this depth; base_lr: its winning rate. best_lr: this width's
            own winning rate. at_base, best: mean validation loss (nats / token) at ``base_lr`` and at ``best_lr``.
        difference: ``at_base - best`` with its interval (:class:`modkit.experiments.stats.Difference`); ``None``
            when a run at either rate has no finite loss (diverged).
    """

    design: str
    depth: int
    width: int
    spec: str
    base_width: int
    base_lr: float
    best_lr: float
    at_base: float
    best: float
    difference: Any = None

    def to_json(self) -> dict:
        """Every field, the difference's as a dict (``None`` when there is none)."""
        out = {k: v for k, v in asdict(self).items() if k != "difference"}
        out["difference"] = asdict(self.difference) if self.difference is not None else None
        return out


def _values(row: SpecRow) -> Optional[list[float]]:
    got = [r.val_loss for r in row.runs]
    return got if all(math.isfinite(v) for v in got) else None


def transfer_table(rows: Sequence[SpecRow], grid: Sequence[SpecRow]) -> list[TransferRow]:
    """The transfer table (see the module docstring) of a comparison's chosen ``rows`` and its ``grid`` rows.

    Returns:
        one :class:`TransferRow` per (design, depth, width), widths increasing, for every design that trained at two
            or more widths of one depth at every rate of the grid; ``[]`` without a grid or without two widths.
    """
    from modkit.experiments.stats import mean_difference

    by_group: dict[tuple[str, int], list[SpecRow]] = {}
    for r in rows:
        if r.design and r.size[0]:
            by_group.setdefault((r.design, r.size[1]), []).append(r)
    cells = {(g.spec, g.lr): g for g in grid}
    out: list[TransferRow] = []
    for (design, depth), group in by_group.items():
        group = sorted(group, key=lambda r: r.size[0])
        if len({r.size[0] for r in group}) < 2:
            continue
        base = group[0]
        for r in group:
            at, best = cells.get((r.spec, base.lr)), cells.get((r.spec, r.lr))
            if at is None or best is None:
                continue
            a, b = _values(at), _values(best)
            diff = None
            if a is not None and b is not None:
                paired = [x.seed for x in at.runs] == [x.seed for x in best.runs]
                diff = mean_difference(a, b, paired=paired)
            out.append(
                TransferRow(
                    design,
                    depth,
                    r.size[0],
                    r.spec,
                    base.size[0],
                    base.lr,
                    r.lr,
                    at.val_loss_mean,
                    best.val_loss_mean,
                    diff,
                )  # fmt: skip
            )
    return out


def transfer_lines(table: Sequence[TransferRow]) -> list[str]:
    """The report's section on ``table`` (nothing when it is empty)."""
    if not table:
        return []
    lines = [
        "",
        "## Learning-rate transfer across widths",
        "",
        "What reusing the smallest width's winning rate costs at each width: the validation loss at that rate minus "
        "the width's own best (mean over seeds, nats per token) with its 95% confidence interval (paired t over "
        "the seeds); 0 where the rate also wins there. The interval is over seeds at fixed rates: it does not count "
        "the choice of each width's best rate from the grid, which biases the difference up a little.",
        "",
        "| design | d_model | n_layers | rate of the smallest width | own best rate | loss at that rate | own best | "
        "cost of reusing it |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for t in table:
        if t.difference is None:
            cost = "a run diverged"
        elif t.best_lr == t.base_lr:
            cost = "0 (the same rate wins)"
        elif t.difference.low is None:
            cost = f"{t.difference.diff:+.4f} (one seed: no interval)"
        else:
            d = t.difference
            cost = f"{d.diff:+.4f} [{d.low:+.4f}, {d.high:+.4f}]"
        lines.append(
            f"| {t.design} | {t.width} | {t.depth} | {t.base_lr:g} | {t.best_lr:g} | {t.at_base:.4f} | "
            f"{t.best:.4f} | {cost} |"
        )
    return lines

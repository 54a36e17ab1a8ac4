"""The plots of a comparison report (matplotlib, ``Agg``): validation curves (:func:`plot_curves`), training loss and
gradient norm (:func:`plot_train_curves`), loss against learning rate (:func:`plot_lr`) and loss by position
(:func:`plot_buckets`)."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np

from modkit.experiments.compare.results import Comparison, SpecRow


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
            label = f"{row.spec} (lr {row.lr:g})" if j == 0 else None
            ax.plot(steps, vals, color=colour, lw=0.9, alpha=0.8, label=label)
    ax.set_xlabel("optimizer step")
    if imbalance:
        ax.set_ylabel("max expert load / mean load (mean over MoE layers)")
        ax.set_title("expert load imbalance on the evaluation windows, every seed")
    else:
        ax.set_ylabel("validation cross-entropy (nats / token)")
        ax.set_title("validation loss, every seed")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)
    return out


def plot_train_curves(rows: Sequence[SpecRow], loss_out: Path, grad_out: Path) -> tuple[Path, Path]:
    """The logged batch losses and gradient norms against optimizer steps, one colour per row, every seed."""
    plt = _pyplot()
    for key, out, label, log in (
        ("train_curve", loss_out, "training batch loss (nats / token)", False),
        ("grad_curve", grad_out, "gradient norm (before clipping)", True),
    ):
        fig, ax = plt.subplots(figsize=(7, 4.2), dpi=110)
        for i, row in enumerate(rows):
            for j, r in enumerate(row.runs):
                curve = getattr(r, key)
                if curve:
                    steps, vals = zip(*curve)
                    ax.plot(
                        steps,
                        vals,
                        color=f"C{i % 10}",
                        lw=0.6,
                        alpha=0.7,
                        label=f"{row.spec} (lr {row.lr:g})" if j == 0 else None,
                    )
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

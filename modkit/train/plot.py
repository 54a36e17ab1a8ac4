"""Loss curves of a run (matplotlib's Agg canvas, without pyplot: no display needed)."""

from __future__ import annotations

from pathlib import Path
from typing import Union


def read_metrics(path: Union[str, Path]) -> list[dict]:
    """The records of a ``metrics.jsonl`` file, in order, read strictly (blank lines skipped; a last line cut by a
    kill dropped): see :func:`modkit.train.checks.metrics_lines`.

    Raises:
        CheckpointError: naming the file and line of a line that is not a JSON object with ``step`` and ``kind``.
    """
    from .checks import metrics_lines

    return [record for _, record in metrics_lines(Path(path))]


def plot_run(metrics: Union[str, Path], out: Union[str, Path], *, title: str = "run") -> Path:
    """Write a PNG with the training loss per logged step and the evaluated train / validation losses.

    Args:
        metrics: the run's ``metrics.jsonl``.
        out: the PNG path (written under a temporary name, then renamed).
        title: plot title.

    Returns:
        ``out``.
    """
    # a Figure on the Agg canvas directly: pyplot (its backend selection and global figure manager) is not imported,
    # which is most of the first plot's cost in a training run
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    records = read_metrics(metrics)
    train = [r for r in records if r["kind"] == "train"]
    evals = [r for r in records if r["kind"] == "eval"]
    finals = [r for r in records if r["kind"] == "final"]
    fig = Figure(figsize=(7, 4.2), dpi=110)
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    if train:
        ax.plot([r["step"] for r in train], [r["loss"] for r in train], lw=0.8, alpha=0.6, label="train (batch)")
    if evals:
        steps = [r["step"] for r in evals]
        ax.plot(steps, [r["train_loss"] for r in evals], "o-", ms=3, label="train (eval)")
        ax.plot(steps, [r["val_loss"] for r in evals], "s-", ms=3, label="validation")
    for r in finals:
        ax.plot([r["step"]], [r["val_loss"]], "k*", ms=9, label=f"whole validation split: {r['val_loss']:.4f}")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("cross-entropy (nats / token)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    out = Path(out)
    tmp = out.with_name(f".{out.name}.tmp.png")
    fig.savefig(tmp)
    tmp.replace(out)
    return out

"""What a training run shows while it runs: the progress bar on rank 0 and the peak memory of its logged lines."""

from __future__ import annotations

import sys
import time
from typing import Callable, Optional, TextIO

import torch


def _peak_memory(device: torch.device) -> int:
    """Peak memory in bytes: CUDA's peak allocation on ``device``, else the process's peak resident set (0 where the
    platform does not say)."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    try:
        import resource

        return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # kilobytes on Linux
    except (ImportError, OSError):  # pragma: no cover - non-POSIX
        return 0


def _clock(seconds: float) -> str:
    """``seconds`` as ``H:MM:SS`` (rich's elapsed / remaining columns)."""
    s = int(max(seconds, 0))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


def _stats(loss: float, lr: float, tps: float) -> str:
    """``loss 1.2345 lr 3.00e-04 recent 51,200 tok/s``: ``loss`` in nats, ``tps`` tokens per second over the recent
    steps."""
    return f"loss {loss:.4f} lr {lr:.2e} recent {tps:,.0f} tok/s"


class _ProgressBar:
    """A rich progress bar (step, loss, learning rate, recent tokens/s, ETA) on stderr, rank 0; silent when disabled.

    The tokens/s shown is ``recent``: the rate over the steps since the previous logged step (evaluations and
    checkpoints left out), not the run's mean, which ``modkit train`` prints at the end.
    When ``stream`` (default stderr) is not a terminal (a log file, a pipe, CI) there is no bar, which rich would
    draw once, cut to 80 columns: plain lines instead, ``step 2000/20000 loss 1.2345 lr 3.00e-04 recent 51,200 tok/s
    ETA 0:09:18`` (under 80 columns up to 6-digit step counts and 7-digit rates), one per twentieth of the run (and
    the last step), written as they come.
    """

    def __init__(
        self,
        total: int,
        done: int,
        *,
        enabled: bool,
        echo: Callable[[str], None],
        stream: Optional[TextIO] = None,
    ):
        self.enabled, self.echo = enabled, echo
        self.total, self.done = total, done
        self.stream = stream if stream is not None else sys.stderr
        self.plain = enabled and not _is_terminal(self.stream)
        self.every = max(1, total // 20)
        self.started = time.perf_counter()
        self.printed = done

    def __enter__(self) -> "_ProgressBar":
        if self.enabled and not self.plain:
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )

            from rich.console import Console

            self.bar = Progress(
                TextColumn("step"),
                MofNCompleteColumn(),
                BarColumn(),
                TextColumn("{task.fields[stats]}"),
                TimeElapsedColumn(),
                TextColumn("ETA"),
                TimeRemainingColumn(),
                console=Console(file=self.stream),
            )
            self.bar.__enter__()
            self.task = self.bar.add_task("train", total=self.total, completed=self.done, stats="")
        return self

    def update(
        self, step: int, *, loss: Optional[float] = None, lr: Optional[float] = None, tps: Optional[float] = None
    ) -> None:
        """Move the bar to ``step``; with ``loss`` (nats), ``lr`` and ``tps`` (tokens per second) show them."""
        if not self.enabled:
            return
        if self.plain:
            self._plain_line(step, loss, lr, tps)
            return
        fields = {}
        if loss is not None:
            fields["stats"] = _stats(loss, lr, tps)
        self.bar.update(self.task, completed=step, **fields)

    def _plain_line(self, step: int, loss: Optional[float], lr: Optional[float], tps: Optional[float]) -> None:
        """One plain progress line when a twentieth of the run has passed since the last one, or at the end."""
        if loss is None or (step - self.printed < self.every and step < self.total):
            return
        elapsed = time.perf_counter() - self.started
        rate = (step - self.done) / elapsed if elapsed > 0 and step > self.done else 0.0
        eta = _clock((self.total - step) / rate) if rate > 0 else "-:--:--"
        width = len(str(self.total))
        print(f"step {step:>{width}}/{self.total} {_stats(loss, lr, tps)} ETA {eta}", file=self.stream, flush=True)
        self.printed = step

    def note(self, line: str) -> None:
        """A status line above the bar (or through ``echo`` when there is no bar)."""
        if self.enabled and not self.plain:
            self.bar.console.print(line)
        else:
            self.echo(line)

    def __exit__(self, *exc) -> None:
        if self.enabled and not self.plain:
            self.bar.__exit__(*exc)


def _is_terminal(stream: TextIO) -> bool:
    """Whether ``stream`` is a terminal (a closed or odd stream is not)."""
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False

"""What a training run shows while it runs: the progress bar on rank 0 and the peak memory of its logged lines."""

from __future__ import annotations

from typing import Callable, Optional

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


class _ProgressBar:
    """A rich progress bar (step, loss, learning rate, tokens/s, ETA) on rank 0; silent when disabled."""

    def __init__(self, total: int, done: int, *, enabled: bool, echo: Callable[[str], None]):
        self.enabled, self.echo = enabled, echo
        self.total, self.done = total, done

    def __enter__(self) -> "_ProgressBar":
        if self.enabled:
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )

            self.bar = Progress(
                TextColumn("step"),
                MofNCompleteColumn(),
                BarColumn(),
                TextColumn("{task.fields[stats]}"),
                TimeElapsedColumn(),
                TextColumn("ETA"),
                TimeRemainingColumn(),
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
        fields = {}
        if loss is not None:
            fields["stats"] = f"loss {loss:.4f}  lr {lr:.2e}  {tps:,.0f} tok/s"
        self.bar.update(self.task, completed=step, **fields)

    def note(self, line: str) -> None:
        """A status line above the bar (or through ``echo`` when there is no bar)."""
        if self.enabled:
            self.bar.console.print(line)
        else:
            self.echo(line)

    def __exit__(self, *exc) -> None:
        if self.enabled:
            self.bar.__exit__(*exc)

"""Training: a strict training config, the loop (one process or torchrun), resumable run folders.

    from modkit.train import train
    result = train({"max_steps": 200}, "runs/demo")      # nanoGPT's shakespeare-char GPT on tiny shakespeare
    result.val_loss, result.run_dir / "best"             # an ordinary modkit checkpoint

See :mod:`modkit.train.config` (every field and its default), :mod:`modkit.train.loop` (the loop),
:mod:`modkit.train.state` (the run folder and checkpoints) and :mod:`modkit.train.schedule` (learning rates).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from modkit.core._lazy import make_lazy

if TYPE_CHECKING:  # for type checkers and editors; at run time the names load on first use (modkit.core._lazy)
    from .config import DEFAULT_MODEL, TrainConfig, load_train_config
    from .loop import RunResult, TrainError, Trainer, decay_groups, flops_per_token, train
    from .schedule import lr_at

#: exported name -> the module defining it
_EXPORTS = {
    "DEFAULT_MODEL": "modkit.train.config",
    "TrainConfig": "modkit.train.config",
    "load_train_config": "modkit.train.config",
    "RunResult": "modkit.train.loop",
    "TrainError": "modkit.train.loop",
    "Trainer": "modkit.train.loop",
    "decay_groups": "modkit.train.loop",
    "flops_per_token": "modkit.train.loop",
    "train": "modkit.train.loop",
    "lr_at": "modkit.train.schedule",
}

__all__ = [
    "DEFAULT_MODEL",
    "RunResult",
    "TrainConfig",
    "TrainError",
    "Trainer",
    "decay_groups",
    "flops_per_token",
    "load_train_config",
    "lr_at",
    "train",
]

make_lazy(__name__, _EXPORTS)

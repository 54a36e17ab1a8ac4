"""Training: a strict training config, the loop (one process or torchrun), resumable run folders.

    from modkit.train import train
    result = train({"max_steps": 200}, "runs/demo")      # nanoGPT's shakespeare-char GPT on tiny shakespeare
    result.val_loss, result.run_dir / "best"             # an ordinary modkit checkpoint

See :mod:`modkit.train.config` (every field and its default), :mod:`modkit.train.loop` (the loop),
:mod:`modkit.train.state` (the run folder and checkpoints) and :mod:`modkit.train.schedule` (learning rates).
"""

from .config import DEFAULT_MODEL, TrainConfig, load_train_config
from .loop import RunResult, TrainError, Trainer, decay_groups, flops_per_token, train
from .schedule import lr_at

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

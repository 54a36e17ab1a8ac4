"""The trainer's side of pipeline parallelism (``modkit train --pp N`` under torchrun): what a pipelined run
refuses, the module of this rank's stages that stands in for the model, and the step, the loss estimates and the
consolidated weights through the pipeline.

The model is cut by :func:`modkit.parallel.build_pipeline` (stages by layer, the schedules
``torch.distributed.pipelining`` ships); :class:`StageView` holds this rank's stages' modules under their
whole-model names (``layers.3.attention.q_proj.weight``), so the optimizer, the gradient clipping, the weight checks
and the DCP checkpoints read it as they read the model: a checkpoint saved under ``pp`` 2 holds the names of the
whole model and resumes on one process (or any other layout). Each step feeds the whole batch of this data-parallel
rank to the schedule, which cuts its rows into ``pp_microbatches`` parts; the loss (on the last stage) is broadcast
to the pipeline's ranks for logging. The gradient is that of the batch's mean loss: one process with the same batch
gives the same losses to float32 rounding (a mixture of experts' auxiliary loss, computed per microbatch, equals
one process's accumulating over the same microbatches; a sequence-wise balance loss, the shipped DeepSeek-style
one, equals one process's on the whole batch). With ``ep`` > 1 every stage's experts are split over the ``ep``
data-parallel ranks of its stage (:mod:`modkit.parallel.expert`); the routers' loads are summed over the
data-parallel ranks of each stage for the bias update, and the load imbalance logged gathers every stage's layers.

References: PyTorch ``torch.distributed.pipelining``; torchtitan ``train.py`` (``pp_schedule.step`` with the
targets on the last stage, the loss broadcast for logging; ``flatten_optimizer_state_dict`` checkpoints).
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .errors import TrainError


def check_pipeline_config(config, spec=None) -> None:
    """Refuse what a pipelined run (``pp`` > 1) does not support, naming the field, its value and the fix.

    Raises:
        TrainError: ``cp`` > 1, ``grad_accum`` > 1, a precision other than float32, ``compile``, a
            ``spec`` whose head is tied to its embedding, or that a stage cannot carry
            (:func:`modkit.parallel.pipeline.stage_problems`: a wide residual stream, a mixer reading the embeddings).
    """
    if config.pp <= 1:
        return
    problems = []
    if spec is not None and spec.tie_embeddings:
        problems.append(
            "tie_embeddings = true (the head would share the first stage's embedding weight: untie them, or train "
            "without --pp)"
        )
    if spec is not None:
        from modkit.parallel.pipeline import stage_problems

        problems += stage_problems(spec)
    if config.cp > 1:
        problems.append(f"cp = {config.cp} (context parallelism with pipeline stages is not supported yet: cp = 1)")
    if config.grad_accum != 1:
        problems.append(
            f"grad_accum = {config.grad_accum} (the pipeline accumulates over its microbatches: set grad_accum = 1 "
            "and raise pp_microbatches, or batch_size)"
        )
    if config.precision != "float32":
        problems.append(f"precision = {config.precision!r} (pipeline stages run in float32 for now)")
    if config.compile:
        problems.append("compile = true (the pipeline's stages are not compiled: compile = false)")
    if problems:
        raise TrainError(f"pp = {config.pp}: not supported with " + "; ".join(problems))


def check_pipeline_model(config, model_source: Optional[str], rows: int) -> None:
    """Refuse a pipelined run that starts from a checkpoint's weights, or whose rows per data-parallel process do
    not divide into ``pp_microbatches``.

    Raises:
        TrainError: naming the field and the fix.
    """
    m = microbatches(config)
    if rows % m:
        raise TrainError(
            f"pp_microbatches = {m} does not divide the {rows} rows of each data-parallel process's batch "
            f"(batch_size = {config.batch_size}); choose a divisor, or another batch_size"
        )
    if model_source is not None:
        raise TrainError(
            f"model = {model_source!r}: starting a pipelined run (pp = {config.pp}) from a checkpoint's weights is "
            "not supported yet; train from its spec, or without --pp"
        )


def microbatches(config) -> int:
    """The pipeline's microbatches per step: ``pp_microbatches``, default ``pp``."""
    return config.pp_microbatches or config.pp


class StageView(nn.Module):
    """This rank's pipeline stages as one module under the whole model's names: ``embed`` (first stage),
    ``embedding_norm``, ``layers`` (the stages' layers, by their whole-model index), ``final_norm`` and ``lm_head``
    (last stage); absent parts are ``None``. It holds the stages' own modules (no copy): its parameters are theirs.
    Not callable: the pipeline's schedule runs the stages."""

    def __init__(self, stages):
        super().__init__()
        self.layers = nn.ModuleDict()
        for name in ("embed", "embedding_norm", "final_norm", "lm_head"):
            setattr(self, name, None)
        for stage in stages:
            for name in ("embed", "embedding_norm", "final_norm", "lm_head"):
                if getattr(stage, name, None) is not None:
                    setattr(self, name, getattr(stage, name))
            for key, block in stage.layers.items():
                self.layers[key] = block
        self.layers = nn.ModuleDict(dict(sorted(self.layers.items(), key=lambda kv: int(kv[0]))))

    def forward(self, *args, **kwargs):
        """Refused: the pipeline's schedule runs the stages.

        Raises:
            TrainError: always.
        """
        raise TrainError("a pipelined model runs through its schedule, not as one module")


class _Loss:
    """The pipeline's per-microbatch loss: mean cross entropy (training, the loss estimates), or the sum over the
    positions whose target is not -100 (the final evaluation's masked windows)."""

    def __init__(self):
        self.reduction = "mean"

    def __call__(self, logits: Tensor, targets: Tensor) -> Tensor:
        flat = logits.float().reshape(-1, logits.shape[-1])
        return F.cross_entropy(flat, targets.reshape(-1), ignore_index=-100, reduction=self.reduction)


def build_trainer_pipeline(config, spec, mesh, device):
    """``(pipeline, loss)``: this rank's stages of ``spec`` (weights of ``modkit.build(spec, seed=config.seed)``)
    and the loss object whose reduction the final evaluation switches.

    Raises:
        TrainError: the pipeline library's refusal (a tied head, more stages than layers), its message kept.
    """
    from ..parallel import ParallelError
    from ..parallel.pipeline import build_pipeline

    loss = _Loss()
    try:
        pipe = build_pipeline(
            spec,
            mesh,
            schedule=config.pp_schedule,
            microbatches=microbatches(config),
            seed=config.seed,
            device=device,
            loss_fn=loss,
        )
    except ParallelError as exc:
        raise TrainError(f"pp = {config.pp}: {exc}") from None
    return pipe, loss


def pipeline_step_loss(trainer, x: Tensor, y: Tensor) -> Tensor:
    """Forward and backward of the batch ``x, y [rows, seq]`` through the schedule; the mean cross entropy
    (the same on every rank of the pipeline; no gradient)."""
    return trainer.pipe.step(x, y, _documents(trainer, x))


def pipeline_eval_loss(trainer, x: Tensor, y: Tensor) -> Tensor:
    """The mean cross entropy of ``x, y [rows, seq]`` by a forward-only pass of the schedule."""
    return trainer.pipe.eval_loss(x, y, _documents(trainer, x))


def pipeline_masked_sum(trainer, x: Tensor, y: Tensor, mask: Tensor) -> Tensor:
    """The summed cross entropy of the positions of ``x, y [rows, seq]`` whose row ``mask [rows]`` is true (the
    other rows' targets set to -100), by a forward-only pass; the same on every rank of the pipeline."""
    y = torch.where(mask[:, None], y, torch.full_like(y, -100))
    trainer.pipe_loss.reduction = "sum"
    try:
        mean_of_sums = trainer.pipe.eval_loss(x, y, _documents(trainer, x))
    finally:
        trainer.pipe_loss.reduction = "mean"
    return mean_of_sums * microbatches(trainer.config)


def _documents(trainer, x: Tensor) -> Optional[Tensor]:
    if not trainer.config.document_mask:
        return None
    from modkit.nn.documents import document_ids

    return document_ids(x, eot_id=trainer.separators[0], bos_id=trainer.separators[1])


def gather_full_state(model: nn.Module) -> Optional[dict]:
    """The whole model's weights on rank 0 (CPU tensors; ``None`` elsewhere) from every pipeline rank's stages:
    each rank's full state dict (gathered over its FSDP / tensor-parallel shards) sent to rank 0 (collective)."""
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    sd = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    sd = {k: v.detach().cpu() for k, v in sd.items()}
    box = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object(sd, box, dst=0)
    if box is None:
        return None
    whole: dict = {}
    for part in box:
        whole.update(part)
    return whole

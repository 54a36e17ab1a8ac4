"""Pipeline parallelism: a model cut into stages by layer, run with the schedules ``torch.distributed.pipelining`` ships.

The flow (every rank of a ``pp`` group)::

    pipe = modkit.parallel.build_pipeline(spec, mesh, schedule="1f1b", microbatches=4, seed=0)
    loss = pipe.step(input_ids, targets)        # forward + backward of every microbatch; mean cross entropy
    opt = torch.optim.AdamW(pipe.parameters())  # this rank's stages' parameters only

**Stages.** The layers are cut into ``n_stages = pp x stages_per_rank`` contiguous runs (:func:`split_layers`:
even, the earlier stages taking one more when ``pp`` does not divide them, or the uneven ``cuts`` given); the token
embedding (and the embedding norm and position table) sits on the first stage, the final norm and the LM head on
the last. A :class:`StageModule` holds its layers under their own indices (``layers.3.attention.q_proj.weight``
keeps its name), so a distributed checkpoint (DCP) written under any layout loads under any other. A tied head
(``tie_embeddings``) would need the embedding on two stages: refused.

**Schedules** (:data:`SCHEDULES`): ``gpipe`` and ``1f1b`` run one stage per rank; ``interleaved_1f1b``,
``looped_bfs`` and ``interleaved_zero_bubble`` run ``virtual_stages`` per rank in a loop (stage ``s`` on rank
``s mod pp``); ``zbv_zero_bubble`` and ``dualpipev`` run two per rank in a V (rank ``r`` holds stages ``r`` and
``2 pp - 1 - r``), as DeepSeek-V3's DualPipe does. The zero-bubble schedules split each backward into the input's
and the weights' gradient; ``PipelineStage`` does that with autograd, so every component takes them.

**The auxiliary loss** (a mixture of experts' balance loss) is summed into the loss on the stage that computes it:
each stage adds its layers' auxiliary losses ``a`` to its output ``h`` with an identity whose backward also hands
``a`` a gradient of 1 (Megatron-Core's ``MoEAuxLossAutoScaler``), so the gradient is that of ``loss + a`` without
carrying ``a`` between stages. Each microbatch's auxiliary loss is of its own tokens; a single process equals it
when it accumulates gradients over the same microbatches.

**Expert parallelism** (a mesh from ``make_mesh(ep=N, pp=K)``): every stage's experts are split over the ``ep``
ranks of its stage (:mod:`~modkit.parallel.expert`); the all-to-all runs inside each microbatch's forward and
backward, the same on every rank of a stage (they run the same schedule). A mixture's aux losses are then those
of the microbatch's tokens on every data-parallel rank (the global microbatch), and the routers' loads, which the
bias update reads after the step, count every microbatch of every data-parallel rank: one process that
accumulates over the same global microbatches gives the same gradient, loss and biases.

**Metadata inference.** ``torch.distributed.pipelining`` runs each stage once on a stand-in microbatch (at the
first step and when a step follows an evaluation, or the reverse) to learn the shapes it sends; the routers'
loads that forward adds are put back, so the bias update and the load imbalance see the real microbatches only.

**Microbatches.** ``step`` splits the batch's rows into ``microbatches`` equal parts; each part's loss is its
mean cross entropy and the schedule divides the summed gradients by their number (``scale_grads``), which is the
gradient of the batch's mean loss.

**Weights.** The whole model is built on ``meta``; each stage is parallelised (tensor parallelism and FSDP2 over
the rest of the mesh: :func:`~modkit.parallel.parallelize`) and allocated; then the whole model's
``init_weights`` runs with an initialiser that draws every parameter in the single-process order and writes only
those this rank holds (the rest stay on ``meta``), so the stages hold exactly the weights of
``modkit.build(spec, seed=seed)``.

References: Huang et al. 2019, GPipe (arXiv:1811.06965); Narayanan et al. 2021, Megatron-LM interleaved 1F1B
(arXiv:2104.04473); Qi et al. 2023, Zero Bubble Pipeline Parallelism (arXiv:2401.10241); DeepSeek-AI 2024,
DeepSeek-V3 (arXiv:2412.19437) §3.2.1 DualPipe; PyTorch ``torch.distributed.pipelining``; torchtitan
``distributed/pipeline_parallel.py`` (stage splitting by FQN, one module per stage).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence, Union

import torch
from torch import Tensor, nn

from modkit.core.interfaces import add_aux

from .apply import ShardedInit, parallelize
from .errors import ParallelError
from .mesh import _sub_mesh

#: schedule name -> (``torch.distributed.pipelining`` class name, stage placement: "single", "loop" or "v")
SCHEDULES: dict[str, tuple[str, str]] = {
    "gpipe": ("ScheduleGPipe", "single"),
    "1f1b": ("Schedule1F1B", "single"),
    "interleaved_1f1b": ("ScheduleInterleaved1F1B", "loop"),
    "looped_bfs": ("ScheduleLoopedBFS", "loop"),
    "interleaved_zero_bubble": ("ScheduleInterleavedZeroBubble", "loop"),
    "zbv_zero_bubble": ("ScheduleZBVZeroBubble", "v"),
    "dualpipev": ("ScheduleDualPipeV", "v"),
}


#: the schedules that split each backward into the input's and the weights' gradient (zero bubble, DualPipeV)
SPLIT_BACKWARD = ("interleaved_zero_bubble", "zbv_zero_bubble", "dualpipev")


def check_schedule(schedule: str, fsdp: int) -> None:
    """Refuse a schedule that does not train correctly with FSDP2 over ``fsdp`` ranks (the data-parallel ranks,
    times ``cp``): the split-backward schedules (:data:`SPLIT_BACKWARD`) give gradients that differ from one
    process's when the stages are FSDP2-sharded (measured on gloo with torch 2.13: ``tiny-llama`` at pp 2 x dp 2,
    gradient norm 0.93 apart after three steps; pp 2 x tp 2 and pp 2 alone are equal to 5e-6), so they are run
    with tensor and pipeline parallelism only.

    Raises:
        ParallelError: naming the schedule, the degree and the schedules that work.
    """
    if schedule in SPLIT_BACKWARD and fsdp > 1:
        raise ParallelError(
            f"pipeline schedule {schedule!r} splits each backward into the input's and the weights' gradients, and "
            f"with the stages FSDP2-sharded over {fsdp} data-parallel ranks its gradients differ from one process's "
            "(torch.distributed.pipelining's split backward with FSDP2's gradient reduction); use gpipe, 1f1b, "
            "interleaved_1f1b or looped_bfs, or one data-parallel rank (pp and tp only)"
        )


class _CarryAux(torch.autograd.Function):
    """``h`` unchanged; backward also gives the auxiliary loss ``aux`` a gradient of 1 (Megatron-Core's
    ``MoEAuxLossAutoScaler``): the auxiliary loss joins the loss on the stage that computed it. The output is a
    copy, not a view of ``h``: the zero-bubble schedules detach a stage's output in place after its input's
    backward, which autograd refuses for a view (a custom function returning its input returns a view)."""

    @staticmethod
    def forward(ctx, h: Tensor, aux: Tensor) -> Tensor:
        ctx.save_for_backward(aux)
        return h.clone()

    @staticmethod
    def backward(ctx, grad: Tensor):
        (aux,) = ctx.saved_tensors
        return grad, torch.ones_like(aux)


class StageModule(nn.Module):
    """One pipeline stage of a :class:`~modkit.nn.model.Model`: layers ``layers`` (kept under their own indices),
    with the embedding on the first stage and the final norm and head on the last.

    ``forward(x, documents=None)``: ``x`` is ``input_ids [batch, seq]`` on the first stage, else the hidden states
    ``[batch, seq, d_model]``; returns the hidden states, or the logits ``[batch, seq, vocab]`` on the last stage.
    ``documents [batch, seq]`` (document-masked packing) is given to every stage.
    """

    #: a part of a model: expert parallelism accepts a stage without experts (:func:`~modkit.parallel.expert_plan`)
    modkit_stage = True

    def __init__(self, model: nn.Module, layers: range, *, first: bool, last: bool):
        super().__init__()
        self.spec, self.first, self.last = model.spec, first, last
        self.layer_position = model.layer_position
        self.positions = model.positions
        self.embed = model.embed if first else None
        self.embedding_norm = model.embedding_norm if first else None
        self.embed_dropout = model.embed_dropout
        self.layers = nn.ModuleDict({str(i): model.layers[i] for i in layers})
        self.final_norm = model.final_norm if last else None
        self.lm_head = model.lm_head if last else None
        self._output_multiplier = model._output_multiplier

    def forward(self, x: Tensor, documents: Optional[Tensor] = None) -> Tensor:
        """Run the stage; see the class docstring for the shapes."""
        from modkit.nn.inputs import ForwardInputs
        from modkit.nn.model import Model

        ids = x if self.first else torch.zeros(x.shape[:2], dtype=torch.long, device=x.device)
        inputs = ForwardInputs.prepare(self, ids, documents=documents)
        if self.first:
            x = Model._embed_tokens(self, x, inputs.positions)
        shared, aux = inputs.attention_inputs(), None
        for key, block in self.layers.items():
            i = int(key)
            x, layer_aux = block(x, shared.for_layer(self.positions[self.layer_position[i]], None))
            aux = add_aux(aux, layer_aux)
        if aux is not None and aux.requires_grad:
            x = _CarryAux.apply(x, aux)
        if not self.last:
            return x
        if self.final_norm is not None:
            x = self.final_norm(x)
        return Model.head_logits(self, x)


def stage_problems(spec: Any) -> list[str]:
    """What a pipeline stage cannot carry, as ``field = value (why; fix)`` phrases: a stage hands the next one the
    hidden states ``[batch, seq, d_model]`` alone, so a residual stream of several copies (spec ``stream``: its
    ``enter`` and ``exit`` and the copies between the blocks) and a mixer that reads the embeddings beside the stream
    (a config field ``concat_embeddings`` true: ``side_input``, which reads ``AttentionInputs.embeddings``) cannot be
    cut. Empty: the spec pipelines.

    Source: :class:`StageModule`, which runs the blocks of a stage on that one tensor.
    """
    from modkit.nn.documents import mixer_configs

    out = []
    if getattr(spec, "stream", None) is not None:
        out.append(
            f"stream {spec.stream.type!r} (a stage hands the next one [batch, seq, d_model], not the stream's "
            "copies: drop the stream, or train without --pp)"
        )
    for i in range(spec.n_layers):
        for path, cfg in mixer_configs(spec.layer(i).attention, f"layer {i}.mixer"):
            if getattr(cfg, "concat_embeddings", False):
                out.append(
                    f"{path} of type {cfg.type!r} with concat_embeddings = true (it reads the embeddings, which only "
                    "the first stage holds: set concat_embeddings false, or train without --pp)"
                )
    return out


def split_layers(n_layers: int, n_stages: int, cuts: Optional[Sequence[int]] = None) -> list[range]:
    """The layers of each stage: ``cuts`` (layer counts per stage, summing to ``n_layers``) or as even as can be,
    the earlier stages taking one more.

    Raises:
        ParallelError: more stages than layers, or ``cuts`` of another length or sum.
    """
    if cuts is None:
        if n_stages > n_layers:
            raise ParallelError(
                f"{n_stages} pipeline stages for {n_layers} layers: every stage needs a layer; lower pp or "
                "the virtual stages per rank"
            )
        base, extra = divmod(n_layers, n_stages)
        cuts = [base + (s < extra) for s in range(n_stages)]
    cuts = [int(c) for c in cuts]
    if len(cuts) != n_stages or sum(cuts) != n_layers or min(cuts) < 0:
        raise ParallelError(
            f"pipeline cuts {cuts} must give {n_stages} stages a layer count each (>= 0), summing to n_layers = "
            f"{n_layers}"
        )
    starts = [sum(cuts[:s]) for s in range(n_stages)]
    return [range(a, a + c) for a, c in zip(starts, cuts)]


def stage_ids(schedule: str, pp: int, rank: int, virtual_stages: int = 2) -> list[int]:
    """The stage indices rank ``rank`` of ``pp`` runs under ``schedule`` (see :data:`SCHEDULES`).

    Raises:
        ParallelError: an unknown schedule name.
    """
    if schedule not in SCHEDULES:
        raise ParallelError(f"unknown pipeline schedule {schedule!r}; choose one of {', '.join(SCHEDULES)}")
    placement = SCHEDULES[schedule][1]
    if placement == "single":
        return [rank]
    if placement == "v":
        return [rank, 2 * pp - 1 - rank]
    return [rank + k * pp for k in range(virtual_stages)]


class _StageInit(ShardedInit):
    """A :class:`ShardedInit` that draws every tensor in the single-process order and writes only those this rank
    holds: a tensor still on ``meta`` (another stage's) is skipped, counted as seen."""

    @torch.no_grad()
    def copy_(self, t: Tensor, value: Tensor) -> Tensor:
        if t.is_meta:
            self.seen.add(id(t))
            return t
        return super().copy_(t, value)

    @torch.no_grad()
    def constant_(self, t: Tensor, value: float) -> Tensor:
        if t.is_meta:
            self.seen.add(id(t))
            return t
        return super().constant_(t, value)


@dataclass
class Pipeline:
    """This rank's part of a pipeline-parallel model: its stages, their ``torch.distributed.pipelining`` stages and
    the schedule (built by :func:`build_pipeline`).

    Attributes:
        model: the whole model (the layers of other ranks' stages on ``meta``).
        stages: this rank's :class:`StageModule` s, in stage order.
        schedule: the ``torch.distributed.pipelining`` schedule.
        group: the ``pp`` process group.
        has_last: whether this rank runs the last stage (it computes the losses).
    """

    model: nn.Module
    stages: list[StageModule]
    schedule: Any
    group: Any
    has_last: bool
    has_first: bool
    losses: list = field(default_factory=list)

    def parameters(self):
        """The parameters of this rank's stages (each once)."""
        seen, out = set(), []
        for stage in self.stages:
            for p in stage.parameters():
                if id(p) not in seen:
                    seen.add(id(p))
                    out.append(p)
        return out

    def named_parameters(self):
        """``(name, parameter)`` of this rank's stages, named as in the whole model (each once)."""
        seen, out = set(), []
        for stage in self.stages:
            for n, p in stage.named_parameters():
                if id(p) not in seen:
                    seen.add(id(p))
                    out.append((n, p))
        return out

    def _run(self, method: str, input_ids: Tensor, targets: Tensor, documents: Optional[Tensor]) -> Tensor:
        losses: list = []
        kwargs = {} if documents is None else {"documents": documents}
        args = (input_ids,) if self.has_first else ()
        getattr(self.schedule, method)(*args, target=targets if self.has_last else None, losses=losses, **kwargs)
        local = torch.stack([v.detach().float() for v in losses]).mean() if losses else torch.zeros(())
        return _from_last(local.to(input_ids.device), self.has_last, self.group)

    def step(self, input_ids: Tensor, targets: Tensor, documents: Optional[Tensor] = None) -> Tensor:
        """Forward and backward of every microbatch of ``input_ids [batch, seq]`` against ``targets [batch, seq]``;
        the gradients accumulate on this rank's parameters. Returns the mean loss (a float32 scalar, the same on
        every rank of the pipeline)."""
        return self._run("step", input_ids, targets, documents)

    @torch.no_grad()
    def eval_loss(self, input_ids: Tensor, targets: Tensor, documents: Optional[Tensor] = None) -> Tensor:
        """The mean loss of a forward over every microbatch, without gradients (``schedule.eval``)."""
        return self._run("eval", input_ids, targets, documents)


def _from_last(local: Tensor, has_last: bool, group) -> Tensor:
    """The last stage's ``local`` on every rank of ``group`` (a sum over the group of zeros and it)."""
    import torch.distributed as dist

    out = local.clone() if has_last else torch.zeros_like(local)
    dist.all_reduce(out, group=group)
    return out


def cross_entropy(logits: Tensor, targets: Tensor) -> Tensor:
    """Mean next-token cross entropy of ``logits [batch, seq, vocab]`` (float32) against ``targets [batch, seq]``."""
    return nn.functional.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1))


# size: the layout of a pipeline is these options together; each is a field of the training config
def build_pipeline(
    spec,
    mesh,
    *,
    schedule: str = "1f1b",
    microbatches: int = 2,
    virtual_stages: int = 2,
    cuts: Optional[Sequence[int]] = None,
    seed: int = 0,
    device: Union[str, torch.device, None] = None,
    loss_fn: Callable[[Tensor, Tensor], Tensor] = cross_entropy,
    registry=None,
) -> Pipeline:
    """This rank's stages of ``spec`` on the ``"pp"`` dim of ``mesh``, parallelised over its other dims, with weights
    equal to ``modkit.build(spec, seed=seed)``, and the schedule that runs them.

    Args:
        spec: anything :func:`modkit.build` accepts.
        mesh: a ``DeviceMesh`` with a ``"pp"`` dim (:func:`~modkit.parallel.make_mesh` with ``pp``); its ``dp`` /
            ``tp`` / ``cp`` / ``ep`` dims parallelise each stage (:func:`~modkit.parallel.parallelize`).
        schedule: a name of :data:`SCHEDULES`.
        microbatches: how many parts :meth:`Pipeline.step` cuts a batch's rows into (>= the stages the schedule
            runs at once: ``pp``; the interleaved schedules want a multiple of ``pp``).
        virtual_stages: stages per rank of the looped schedules.
        cuts: layers per stage (uneven cuts); default as even as can be.
        seed: the weight-init seed.
        device: default ``cuda:<current>`` when CUDA is available, else ``cpu``.
        loss_fn: ``loss_fn(logits, targets) -> scalar``, per microbatch.

    Raises:
        ParallelError: no ``pp`` dim, a tied head, a spec a stage cannot carry (:func:`stage_problems`), an unknown
            schedule, more stages than layers, bad cuts; a
            split-backward schedule with FSDP2 (:func:`check_schedule`); under ``ep``, a model with no experts to
            split or a mixture that cannot be split (named).
    """
    from torch.distributed.pipelining import PipelineStage, schedules

    from modkit.nn.build import build, to_empty_poisoned

    names = getattr(mesh, "mesh_dim_names", None) or ()
    if "pp" not in names:
        raise ParallelError(f"mesh dims {names} have no 'pp' dim; build it with make_mesh(pp=...)")
    pp_mesh = mesh["pp"]
    pp, rank = pp_mesh.size(), pp_mesh.get_local_rank()
    model = build(spec, device="meta", seed=seed, registry=registry)
    if stage_problems(model.spec):
        raise ParallelError("pipeline parallelism cannot cut this model: " + "; ".join(stage_problems(model.spec)))
    if model.spec.tie_embeddings:
        raise ParallelError(
            "pipeline parallelism cannot cut a model whose head is tied to its embedding (tie_embeddings = true): "
            "the first and last stages would share one weight; untie them or train without --pp"
        )
    check_schedule(schedule, math.prod(m.size() for m in (_sub_mesh(mesh, "dp"), _sub_mesh(mesh, "cp")) if m))
    if "ep" in names and mesh["ep"].size() > 1:  # the model as a whole (a stage may hold dense layers only)
        from .expert import expert_plan

        expert_plan(model, mesh["ep"].size(), registry=registry)
    ids = stage_ids(schedule, pp, rank, virtual_stages)
    n_stages = len(ids) * pp
    runs = split_layers(len(model.layers), n_stages, cuts)
    device = _device(device)
    stages = [StageModule(model, runs[s], first=s == 0, last=s == n_stages - 1) for s in ids]
    for stage in stages:
        if _rest_of_mesh(mesh):  # parallelize reads the mesh's other dims by name (and the flattened "dp")
            parallelize(stage, mesh, registry=registry)
        to_empty_poisoned(stage, device)
    std = float(getattr(model.spec, "init_std", 0.02))
    model.init_weights(seed, init=_StageInit(seed, std))
    group = pp_mesh.get_group()
    pipe_stages = [PipelineStage(m, s, n_stages, device, group=group) for m, s in zip(stages, ids)]
    for pipe_stage, stage in zip(pipe_stages, stages):
        _keep_loads_through_inference(pipe_stage, stage)
    cls = getattr(schedules, SCHEDULES[schedule][0])
    runner = (
        cls(pipe_stages[0], microbatches, loss_fn=loss_fn)
        if SCHEDULES[schedule][1] == "single"
        else cls(pipe_stages, microbatches, loss_fn=loss_fn)
    )
    return Pipeline(model, stages, runner, group, n_stages - 1 in ids, 0 in ids)


def _device(device) -> torch.device:
    if device is None:
        return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    return torch.device(device)


def _rest_of_mesh(mesh) -> bool:
    """Whether the mesh has a dim besides ``pp`` of size > 1 (something to parallelise each stage over)."""
    return any(mesh[n].size() > 1 for n in mesh.mesh_dim_names if n != "pp")


def _keep_loads_through_inference(pipe_stage, stage: nn.Module) -> None:
    """Put the routers' loads of ``stage`` back after the pipeline's metadata inference forward (a stand-in
    microbatch run to learn the shapes; ``PipelineStage._forward_metadata_inference`` in torch 2.13), so that only
    the real microbatches count toward the bias update. A no-op for a stage without routers, or a torch whose stages
    infer shapes without a forward."""
    from modkit.nn import balance as bal

    infer = getattr(pipe_stage, "_forward_metadata_inference", None)
    if infer is None or not bal.load_reporters(stage):
        return

    def infer_keeping_loads(*args, **kwargs):
        saved = bal.read_loads(stage)
        try:
            return infer(*args, **kwargs)
        finally:
            with torch.no_grad():
                for name, m in bal.load_reporters(stage).items():
                    m._buffers[bal.LOAD_BUFFER].copy_(saved[name])

    pipe_stage._forward_metadata_inference = infer_keeping_loads

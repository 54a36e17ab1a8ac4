"""Scaling out: tensor parallelism composed from per-component plans, FSDP2, sharded init and checkpoints.

The flow, for a model that never exists whole on any rank::

    mesh  = modkit.parallel.make_mesh(tp=2)                      # ("dp", "tp") device mesh over the world
    model = modkit.build(spec, device="meta")                    # structure only, no memory
    modkit.parallel.parallelize(model, mesh)                     # TP styles + fully_shard, still on meta
    modkit.parallel.materialize(model, seed=0)                   # to_empty: each rank allocates its shard;
                                                                 # init_weights writes each rank's slice
    # or all of it at once: modkit.parallel.build_parallel(spec, mesh, seed=0)

**Plans as data.** Each registry entry with weights declares a ``tp_plan`` capability relative to its own
module, ``{submodule path: style}`` (attention: q/k/v ``colwise``, o ``rowwise``, a per-head QK-norm
``per_head``; gated FFN: gate/up ``colwise``, down ``rowwise``; MoE: experts ``grouped``, router ``replicate``;
norms, routers, learned positions: ``{}``, replicated). :func:`model_plan` walks
``model.named_modules()``, looks each tagged module (``modkit_kind`` / ``modkit_type``) up in the registry and
prefixes its plan with the module's path. Nothing here names a component: the only structure it knows is the
core's own (modules tagged ``embedding`` and ``lm_head``, and blocks tagged ``placement`` as FSDP units). This is
torchtitan's ``parallelize_llama`` layout (pytorch/torchtitan, ``models/llama3/infra/parallelize.py``) without
sequence parallelism, so every activation between sublayers stays replicated on the TP ranks:

| style | meaning (PyTorch ``torch.distributed.tensor.parallel``) |
|---|---|
| ``colwise`` | ``ColwiseParallel()``: ``nn.Linear`` weight ``[out, in]`` and bias sharded on ``out``; input replicated, output the local shard ``[..., out / tp]`` (a plain tensor) |
| ``rowwise`` | ``RowwiseParallel()``: weight sharded on ``in``, bias replicated; input the local shard ``[..., in / tp]``, output all-reduced ``[..., out]``. On an ``nn.Embedding``: vocab-parallel lookup (rows sharded, token ids replicated, output all-reduced) |
| ``colwise_gather`` | ``ColwiseParallel(output_layouts=Replicate())``: like ``colwise`` but the output is all-gathered to the full ``[..., out]`` (the vocab-parallel LM head: full logits) |
| ``grouped`` | stacked copies (a component's grouped form, e.g. mixture-of-experts experts): every parameter sharded on the dim its module's ``tp_shard_dims`` names (the hidden ``d_ff`` dim of each copy); input replicated (its gradient all-reduced: :func:`copy_to_tp`), the module computes on its local shards, output all-reduced |
| ``per_head`` | ``SequenceParallel(sequence_dim=1)`` with heads for the sequence: weights left whole (``Replicate`` DTensors) and applied to this rank's heads ``[batch, heads / tp, seq, head_dim]`` (a per-head QK-norm); their gradient is summed over the TP group |
| ``heads`` | a *parameter* (not a submodule) whose dim 0 indexes the module's heads (``[n_heads, ...]`` or ``[n_kv_heads, ...]``, e.g. a per-head gain or temperature): sharded on dim 0 in the blocks the colwise q/k/v shard the heads; during ``forward`` the module reads its local heads as a plain tensor |
| ``replicate`` | explicit "leave this submodule (or parameter) whole on every TP rank": it reads only replicated activations |

Choices made here (and why):

* **Embedding and LM head: vocab-parallel** when the head is untied and ``tp`` divides ``vocab_size``
  (embedding ``rowwise``, head ``colwise_gather`` so ``forward`` still returns full logits ``[b, s, vocab]``).
  A tied head multiplies by ``embed.weight`` inside ``Model.forward`` (no module call), so tied models keep
  both replicated under TP (FSDP still shards them); a vocabulary ``tp`` does not divide is replicated with a
  :class:`PlanWarning`.
* **Head counts.** ``tp`` must divide both ``n_heads`` and ``n_kv_heads`` of every attention module whose
  plan shards something: q is sharded by query heads and k/v by key/value heads, and each rank must hold
  whole GQA groups. Checked before any collective (:class:`ParallelError` names the layer path and values).
  After sharding, the local module's ``n_heads`` / ``n_kv_heads`` attributes are divided by ``tp`` (as
  torchtitan does), so its ``rearrange(..., h=self.n_heads)`` sees the local heads. Position schemes that act
  as an attention bias (capability ``acts_on = "bias"``, e.g. ALiBi) get the full head count and return this
  rank's slice of heads.
* **Gradients of replicated tensors next to a shard.** A tensor that every TP rank holds whole but that each
  rank then uses against its own shard gets, on each rank, only that rank's part of its gradient; the full
  gradient is the sum over the group. Activations entering a sharded module are summed on the way back by the
  styles themselves (``colwise``: DTensor's ``Replicate`` input; ``grouped`` and sliced attention biases:
  :func:`copy_to_tp`, Megatron-LM's ``f`` operator). An activation a component computes whole on every rank and
  feeds to its local heads without a sharded projection in between (multi-head latent attention's rotated key,
  shared by every head) goes through :func:`shared_by_heads` in the component's forward. Parameters cannot be told apart by structure, so in a
  component whose plan shards something **every parameter must be declared**: by a sharding style, ``per_head``
  (summed over the group), or ``replicate`` (reads only replicated activations); :func:`model_plan` refuses an
  undeclared one, naming it, rather than train it silently wrong. Nested components whose own plan shards
  answer for themselves; a plan entry for an optional submodule that is ``None`` (no QK-norm) is skipped. Every
  DTensor parameter's gradient is brought to the parameter's own placements (``p.grad`` has ``p``'s layout).
  Position schemes with parameters that act on q/k (this rank's heads) are refused.
* **Replicated parameters that would read a shard.** A 1-D replicated parameter inside a sharded component
  whose length equals the full output width of a ``colwise`` sibling (OLMo 2's full-width QK-norm) would see
  only ``1/tp`` of the features; :func:`model_plan` rejects it instead of computing wrong statistics.
* **Third-party components without a plan** are replicated, with a :class:`PlanWarning` naming the component,
  its plugin and the layer paths.
* **MoE.** The router is replicated; the stacked experts take the ``grouped`` style (expert-tensor-parallelism:
  every rank holds ``1/tp`` of the hidden width of every expert, computes every token's assignments on it, and
  the partial outputs are all-reduced). A grouped module with an output bias (``tp_shard_dims`` is ``None``)
  stays replicated with a :class:`PlanWarning`: the bias would be added ``tp`` times. Expert parallelism
  (``make_mesh(ep=N)``: the experts split over ``ep`` data-parallel ranks, all-to-all token dispatch, aux losses
  over the global token set) is declared by the ``ep_plan`` capability: :mod:`~modkit.parallel.expert`. Without
  it FSDP shards experts with the rest of their block.
* **FSDP2** (``torch.distributed.fsdp.fully_shard``): one unit per block (modules tagged ``placement``), then
  the root (embedding, final norm, head); mixed precision with ``param_dtype`` / ``reduce_dtype``.

**Init without the whole model.** ``materialize`` calls ``model.to_empty`` (each rank allocates only its shards)
and then ``Model.init_weights(init=ShardedInit(...))``. :class:`ShardedInit` draws exactly the values a
single-process build draws, one parameter at a time (a full ``[out, in]`` float32 tensor for the duration of one
copy, generated on the CPU), and keeps this rank's slice with ``distribute_tensor(..., src_data_rank=None)`` (a
local slice, no communication), so a sharded model equals ``modkit.build`` with the same seed.

**Checkpoints.** :func:`save_sharded` / :func:`load_sharded` use ``torch.distributed.checkpoint`` (each rank
writes and reads its own shards; resharding to another mesh on load is DCP's job). :func:`export_consolidated`
gathers the full state dict to rank 0 (``get_model_state_dict`` with ``full_state_dict=True``,
``cpu_offload=True``) and writes one safetensors file; :func:`load_consolidated` reads it on rank 0 and
broadcasts (``set_model_state_dict`` with ``broadcast_from_rank0=True``), each rank keeping its shard.

References: PyTorch tensor parallel docs (``torch.distributed.tensor.parallel``), FSDP2 docs
(``torch.distributed.fsdp.fully_shard``), DCP docs (``torch.distributed.checkpoint``); Shoeybi et al. 2019,
Megatron-LM (arXiv:1909.08053) for the column/row split; torchtitan ``parallelize_llama`` for the plan layout.

The package, by what each module does: :mod:`~modkit.parallel.styles` (the style vocabulary, the
``ParallelStyle`` objects and gradient hooks), :mod:`~modkit.parallel.plans` (:func:`model_plan`, :class:`TPPlan`)
with its checks in :mod:`~modkit.parallel.plan_checks`, :mod:`~modkit.parallel.mesh` (:func:`make_mesh`),
:mod:`~modkit.parallel.apply` (:func:`parallelize`, :func:`materialize`, :func:`build_parallel`) with the FSDP2
wrapping in :mod:`~modkit.parallel.fsdp`, :mod:`~modkit.parallel.training` (:func:`clip_grad_norm_`,
:func:`mean_across_ranks`), :mod:`~modkit.parallel.stats` (:func:`param_stats`),
:mod:`~modkit.parallel.checkpoint` (sharded and consolidated checkpoints), :mod:`~modkit.parallel.expert` (expert
parallelism), :mod:`~modkit.parallel.planner` (``modkit plan``) and :mod:`~modkit.parallel.errors`.
Every name is imported from ``modkit.parallel`` itself.
"""

from __future__ import annotations

from .apply import ShardedInit, build_parallel, materialize, parallelize
from .context import ContextParallel, SequenceShard, apply_context_parallel, context_parallel_problems, mixer_layouts
from .checkpoint import export_consolidated, load_consolidated, load_sharded, save_sharded
from .errors import ParallelError, PlanWarning
from .expert import EPPlan, expert_plan
from .mesh import make_mesh
from .pipeline import SCHEDULES, Pipeline, StageModule, build_pipeline, split_layers
from .plans import CORE_PLAN, TPPlan, model_plan  # noqa: F401 - CORE_PLAN importable here, outside __all__ as before
from .stats import param_stats
from .styles import STYLES, GroupedParallel, PerHeadParallel, copy_to_tp, shared_by_heads  # noqa: F401 - as CORE_PLAN
from .training import clip_grad_norm_, mean_across_ranks

__all__ = [
    "STYLES",
    "copy_to_tp",
    "shared_by_heads",
    "ParallelError",
    "PlanWarning",
    "TPPlan",
    "ShardedInit",
    "model_plan",
    "EPPlan",
    "expert_plan",
    "make_mesh",
    "parallelize",
    "materialize",
    "build_parallel",
    "clip_grad_norm_",
    "mean_across_ranks",
    "param_stats",
    "save_sharded",
    "load_sharded",
    "export_consolidated",
    "load_consolidated",
    "ContextParallel",
    "SequenceShard",
    "apply_context_parallel",
    "context_parallel_problems",
    "mixer_layouts",
    "SCHEDULES",
    "Pipeline",
    "StageModule",
    "build_pipeline",
    "split_layers",
]

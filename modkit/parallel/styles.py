"""Tensor-parallel styles: the vocabulary of a ``tp_plan`` and the ``ParallelStyle`` objects and hooks behind it.

:data:`STYLES` names what a component's ``tp_plan`` may ask for (the table in :mod:`modkit.parallel`); the
PyTorch styles ``colwise`` / ``rowwise`` / ``colwise_gather`` come from ``torch.distributed.tensor.parallel``,
the others are built here: :func:`GroupedParallel`, :func:`PerHeadParallel`, the ``heads`` parameter sharding
(:func:`_shard_heads`) and the head slice of a bias-type position scheme (:func:`_slice_heads_bias`), with the
gradient plumbing they need (:func:`copy_to_tp`, Megatron-LM's ``f`` operator, Shoeybi et al. 2019,
arXiv:1909.08053; :func:`_grads_like_params`).
"""

from __future__ import annotations

from typing import Mapping

from torch import Tensor, nn

#: Tensor-parallel styles a ``tp_plan`` may use (see the module docstring for their meaning).
STYLES: Mapping[str, str] = {
    "colwise": "shard weight/bias on the output features; input replicated, output the local shard",
    "rowwise": "shard weight on the input features (an Embedding: on the vocabulary); output all-reduced",
    "colwise_gather": "colwise with the output all-gathered (vocab-parallel LM head returning full logits)",
    "grouped": "stacked copies: parameters sharded on the dims the module's tp_shard_dims names; input gradient and "
    "output all-reduced",
    "per_head": "weights replicated, applied to this rank's heads of a [batch, heads, seq, head_dim] activation "
    "(e.g. a per-head QK-norm); their gradient is summed over the tensor-parallel group",
    "heads": "a parameter [n_heads or n_kv_heads, ...] sharded on its head dim; the module reads its local heads",
    "replicate": "leave whole on every tensor-parallel rank; it reads only replicated activations",
}

_SHARDING = {"colwise", "rowwise", "colwise_gather", "grouped", "heads"}


def copy_to_tp(x: Tensor, mesh) -> Tensor:
    """Identity in the forward pass; in the backward pass the gradient is summed over the ranks of ``mesh``.

    Megatron-LM's ``copy_to_tensor_model_parallel_region`` (the ``f`` operator of Shoeybi et al. 2019,
    arXiv:1909.08053, section 3): a tensor that every tensor-parallel rank holds whole (a replicated activation)
    and that each rank then consumes through its own shard of the weights receives, on each rank, only that
    shard's part of its gradient; the full gradient is their sum. Built from DTensor's own collectives:
    ``DTensor.from_local(x, [Replicate()]).to_local(grad_placements=[Partial()])``, whose backward turns the
    ``Partial`` gradient into a ``Replicate`` one (one all-reduce). A tensor that does not require a gradient is
    returned as it is (nothing to reduce).

    Args:
        x: any shape, the same values on every rank of ``mesh``.
        mesh: the 1-D tensor-parallel ``DeviceMesh``.

    Returns:
        ``x`` (same values, shape and dtype), a plain tensor.
    """
    from torch.distributed.tensor import DTensor, Partial, Replicate

    if not x.requires_grad:
        return x
    return DTensor.from_local(x, mesh, [Replicate()], run_check=False).to_local(grad_placements=[Partial()])


def shared_by_heads(x: Tensor, sharded: Tensor) -> Tensor:
    """``x`` as this rank's heads read it: its gradient summed over the tensor-parallel group of ``sharded``.

    For a component whose plan shards its heads: a tensor that every rank computes whole (from replicated
    weights) and that its local heads then consume directly, not through a ``colwise`` projection (whose input
    gradient the style already sums), gets only this rank's heads' part of its gradient; this restores the sum
    (:func:`copy_to_tp` on the mesh of ``sharded``). Without tensor parallelism (``sharded`` a plain tensor) it
    returns ``x`` itself, so a component may call it unconditionally.

    Args:
        x: any shape, the same values on every rank (e.g. MLA's rotated key ``[batch, 1, seq, qk_rope_head_dim]``).
        sharded: a parameter of the component that the plan shards (a DTensor under tensor parallelism).
    """
    mesh = getattr(sharded, "device_mesh", None)
    return x if mesh is None else copy_to_tp(x, mesh)


def _grads_like_params(module: nn.Module, inputs) -> None:
    """Forward pre-hook: the gradient of each DTensor parameter of ``module`` arrives in the parameter's placements.

    DTensor's autograd gives a gradient the placements its sharding rules produce, not the parameter's: a
    ``Replicate`` weight applied to a sharded activation (``per_head``) gets a ``Partial`` gradient (each rank's
    part), and a vocab-parallel embedding (``Shard(0)``) a ``Replicate`` one (the whole ``[vocab, d_model]``
    gradient on every rank). A hook on the parameter redistributes it before it is accumulated into ``.grad``
    (``Partial -> Replicate``: one all-reduce; ``Replicate -> Shard``: a local slice), so ``p.grad`` always has
    ``p``'s layout: optimisers, gradient clipping and ``p.grad.to_local()`` see this rank's part of the full
    gradient, and gradient accumulation adds like to like. The hook goes on the tensor the module holds at call
    time (FSDP2 swaps in its unsharded parameters before the forward, ``to_empty`` replaces parameter objects);
    each is hooked once.
    """
    from torch.distributed.tensor import DTensor

    for p in module.parameters(recurse=False):
        if isinstance(p, DTensor) and p.requires_grad and not getattr(p, "_modkit_grad_hooked", False):
            placements = tuple(p.placements)

            def to_placements(g, placements=placements):
                if isinstance(g, DTensor) and tuple(g.placements) != placements:
                    return g.redistribute(g.device_mesh, placements)
                return g

            p.register_hook(to_placements)
            p._modkit_grad_hooked = True


def GroupedParallel():
    """The ``grouped`` style as a ``ParallelStyle``: shard each parameter of stacked copies on its ``tp_shard_dims``
    dim; the input ``[rows, d_model]`` enters through :func:`copy_to_tp` (its gradient is all-reduced) and the
    module's partial output is all-reduced (``Partial -> Replicate``, differentiable).

    The module computes on local shards (``t.to_local()`` of its DTensor parameters): with gate/up sharded on the
    hidden dim and down on its input (hidden) dim, each rank's output is a partial sum over its slice of the hidden
    features (Megatron-LM's column-then-row split, Shoeybi et al. 2019, arXiv:1909.08053), here per expert. The
    backward mirrors it: each rank's gradient w.r.t. the input covers only its slice of the hidden features, so it
    is summed over the group (Megatron's ``f`` operator); without that every parameter before the layer would get
    a wrong gradient.
    """
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
    from torch.distributed.tensor.parallel import ParallelStyle

    class _Grouped(ParallelStyle):
        def _apply(self, module: nn.Module, device_mesh) -> nn.Module:
            for name, dim in module.tp_shard_dims.items():
                p = getattr(module, name)
                shard = distribute_tensor(p.data, device_mesh, [Shard(dim)], src_data_rank=None)
                module.register_parameter(name, nn.Parameter(shard, requires_grad=p.requires_grad))

            def enter(mod, inputs):
                return (copy_to_tp(inputs[0], device_mesh), *inputs[1:])

            def reduce(mod, inputs, out):
                partial = DTensor.from_local(out, device_mesh, [Partial()], run_check=False)
                return partial.redistribute(device_mesh, [Replicate()]).to_local()

            module.register_forward_pre_hook(enter)
            module.register_forward_hook(reduce)
            return module

    return _Grouped()


def PerHeadParallel():
    """The ``per_head`` style as a ``ParallelStyle``: replicated weights applied to this rank's heads.

    PyTorch's ``SequenceParallel(sequence_dim=1, use_local_output=True)`` with the heads in the place of the
    sequence: the module's parameters become ``Replicate`` DTensors, its input ``[batch, heads / tp, seq,
    head_dim]`` is taken as this rank's ``Shard(1)`` of the full ``[batch, heads, seq, head_dim]``, the module runs
    in DTensor and returns the local tensor. DTensor's autograd then gives each weight the sum over all heads of
    all ranks (a ``Partial`` gradient, reduced to the weight's ``Replicate`` layout by the hook :func:`parallelize`
    puts on every DTensor parameter).
    The module must act on each head independently (a norm over ``head_dim``, a per-head scale): a module mixing
    heads would see only this rank's.
    """
    from torch.distributed.tensor.parallel import SequenceParallel

    class _PerHead(SequenceParallel):
        def __init__(self):
            super().__init__(sequence_dim=1, use_local_output=True)

        def _replicate_module_fn(self, name: str, module: nn.Module, device_mesh) -> None:
            # distribute_module visits every submodule: each replicates its own parameters (the values are
            # already equal on every rank: the model is built on meta and initialised with one seed)
            from torch.distributed.tensor import DTensor, Replicate

            for p_name, param in list(module.named_parameters(recurse=False)):
                replicated = DTensor.from_local(param.data, device_mesh, [Replicate()], run_check=False)
                module.register_parameter(p_name, nn.Parameter(replicated, requires_grad=param.requires_grad))

        # (the Partial gradients of the replicated weights are reduced by the hook parallelize puts on them)

    return _PerHead()


def _shard_heads(model: nn.Module, path: str, mesh) -> None:
    """Shard the per-head parameter at ``path`` on dim 0; its module reads the local heads as a plain tensor.

    The parameter becomes a ``DTensor`` (``Shard(0)``: optimizers, checkpoints and :class:`ShardedInit` see the
    sharded parameter); for the duration of each forward of its module, the attribute resolves to
    ``to_local()`` (differentiable, so the gradient reaches the shard).
    """
    from torch.distributed.tensor import Shard, distribute_tensor

    owner_path, _, name = path.rpartition(".")
    owner = model.get_submodule(owner_path)
    p = owner._parameters[name]
    shard = distribute_tensor(p.data, mesh, [Shard(0)], src_data_rank=None)
    owner.register_parameter(name, nn.Parameter(shard, requires_grad=p.requires_grad))

    def local(mod, args):
        mod.__dict__[name] = mod._parameters[name].to_local()  # found before Module.__getattr__ looks in _parameters

    def restore(mod, args, out):
        mod.__dict__.pop(name, None)

    owner.register_forward_pre_hook(local)
    owner.register_forward_hook(restore)


def _slice_heads_bias(position: nn.Module, mesh) -> None:
    """Make ``position.attention_bias(q, k, n_local)`` return this rank's heads of the ``n_local * tp`` bias.

    The full bias goes through :func:`copy_to_tp` before the slice: a bias computed from parameters (a learned
    relative-position bias) gets, on each rank, the gradient of its own heads only, and the sum over the group is
    the full one (ALiBi's bias needs no gradient: nothing is communicated).
    """
    full_bias = position.attention_bias
    tp, rank = mesh.size(), mesh.get_local_rank()

    def attention_bias(q_positions: Tensor, k_positions: Tensor, n_heads: int):
        bias = full_bias(q_positions, k_positions, n_heads * tp)
        if bias is None:
            return bias
        bias = copy_to_tp(bias, mesh)
        return bias if bias.shape[1] == 1 else bias[:, rank * n_heads : (rank + 1) * n_heads]

    position.attention_bias = attention_bias

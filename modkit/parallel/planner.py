"""``modkit plan``: which parallel layouts of a spec fit a cluster, and how fast each would run, before any launch.

For every layout that divides the model and the cluster (data parallel with FSDP2 / ZeRO-3 or ZeRO-1, tensor ``tp``,
pipeline ``pp``, expert ``ep``, context ``cp``, microbatches, activation checkpointing on or off) it computes, from
the spec's own declarations, on a ``meta`` model (nothing is allocated):

* **Parameters, gradients and optimizer state per rank**, exactly, parameter by parameter, as the layout places
  them: a tensor-parallel shard from the composed ``tp_plan`` (:func:`~modkit.parallel.model_plan`), the expert
  split of the ``ep_plan`` (:func:`~modkit.parallel.expert.expert_plan`), the pipeline stage's layers (an even cut,
  the first stages one layer more; embedding on the first stage, final norm and head on the last), then FSDP2's
  dim-0 chunk (``ceil(rows / n)``: rank 0's, the largest) over ``dp x cp`` (the experts over ``dp / ep``). Bytes are
  ``modkit train``'s: float32 weights and gradients, AdamW's two float32 moments
  (:data:`~modkit.analysis.cost.TRAIN_STATE_BYTES`). ZeRO-1 keeps whole weights and gradients and shards the
  moments (``numel / dp``). The worst pipeline stage is reported.
* **Activations per rank**: what autograd saves for the backward, part by part (the embedding, each block, the
  head and loss), measured on fake tensors under the run's ``precision`` (``modkit train``'s autocast: the saved
  bfloat16 copies of the weights and the float32 residual stream included) at the rank's length, linear in the rows
  (:mod:`modkit.analysis.step_activations`); at the microbatch's rows and the rank's ``seq_len / cp`` tokens, for
  the stage's own layers (the embedding on the first stage, head and loss on the last), times the microbatches in
  flight under 1F1B (``min(pp - stage, m)``). With activation checkpointing each block keeps its arguments (the
  input hidden states and shared inputs) and, in the backward, one block's saved bytes are live during its
  recomputation (:func:`~modkit.analysis.step_activations.peak_bytes`). The ``[T, T]`` matrices of a math
  attention kernel are left out unless ``attention_matrix`` (the GPU's fused kernels keep none). **Stated error** (``benchmarks/
  bench_plan_activations.py`` against real CPU runs of dense, MoE, MLA and hybrid specs, with and without
  checkpointing, float32 and bfloat16): within :data:`ACTIVATION_ERROR` of the bytes a single process
  (``tp = cp = 1``) saves. Outside the bound: under ``tp`` the per-sequence bytes are divided by ``tp`` (as if
  sequence parallel; modkit's tensor parallelism replicates the residual stream, so the figure is low); under
  ``cp`` the keys and values a rank gathers from the others are not counted; under ``ep`` a rank's experts are
  assumed to receive their even share of the tokens; transient gradients of the backward are not counted.
* **KV cache per rank** (shown, not added): what a rank of this layout would hold to serve its local batch at the
  training context (:meth:`~modkit.analysis.cost.CostModel.kv_cache_bytes`, ``/ (tp cp pp)``).
* **Step time**: the declared training FLOPs (3 x the forward, 4 x with checkpointing) over ``world x peak x
  mfu``, stretched by the pipeline bubble ``(pp - 1) / m``; plus, without overlap, each collective's bytes over its
  link (NVLink inside a node of ``gpus_per_node``, the network across): FSDP2 all-gathers (forward, backward) and
  reduce-scatters the stage's bf16 weights (ZeRO-1: one reduce-scatter, one all-gather), tensor parallelism
  all-reduces each layer's output twice forward and twice backward, expert parallelism sends every token's
  ``top_k`` rows to the experts and back, forward and backward (four all-to-alls per MoE layer), context
  parallelism all-gathers each layer's keys and values, pipeline stages send their boundary activation. Mesh
  order, inner to outer: tp, cp, ep, the rest of dp, pp (a dim is inside a node when the product of it and the
  dims inside it is at most ``gpus_per_node``).

In the spirit of Calculon (Isaev et al. 2023, "Calculon: a methodology and tool for high-level co-design of
systems and large language models", SC '23) and Megatron-LM's memory estimates (Korthikanti et al. 2022,
arXiv:2205.05198; Narayanan et al. 2021, arXiv:2104.04473 for the pipeline bubble), but read from the spec.
"""

from __future__ import annotations

import itertools
import math
import warnings
from dataclasses import asdict, dataclass, field
from typing import Any, Optional

from torch import nn

from .errors import ParallelError

#: Bytes of a bf16 value: the weights FSDP2 gathers, the activations collectives move.
WIRE_BYTES = 2

#: The stated relative error of :meth:`Planner.activations` at ``tp = cp = 1`` (see the module docstring).
ACTIVATION_ERROR = 0.05


@dataclass(frozen=True)
class Cluster:
    """The machine: ``gpus`` devices of ``gpu_memory`` bytes, ``peak_flops`` each at ``mfu``, links in bytes/s.

    Defaults: an H800/H100 SXM node of 8 (989e12 bf16 dense FLOP/s; NVLink 400e9 B/s per direction on an H800,
    450e9 on an H100; 50e9 B/s of InfiniBand, 400 Gb/s, per GPU).
    """

    gpus: int
    gpu_memory: float
    mfu: float = 0.4
    peak_flops: float = 989e12
    nvlink_bandwidth: float = 400e9
    network_bandwidth: float = 50e9
    gpus_per_node: int = 8


@dataclass(frozen=True)
class Layout:
    """A parallel layout: ``world = pp x dp x tp x cp``; ``ep`` divides ``dp``; ``zero`` 3 (FSDP2) or 1."""

    dp: int
    tp: int = 1
    pp: int = 1
    ep: int = 1
    cp: int = 1
    microbatches: int = 1
    checkpointing: bool = False
    zero: int = 3

    def name(self) -> str:
        """``dp128(zero1) x ep64 x pp16 x m32 +ckpt``: the degrees above 1."""
        parts = [f"dp{self.dp}" + ("" if self.zero == 3 else f"(zero{self.zero})")]
        parts += [f"{k}{getattr(self, k)}" for k in ("tp", "ep", "cp", "pp") if getattr(self, k) > 1]
        return " x ".join(parts) + f" m{self.microbatches}" + (" +ckpt" if self.checkpointing else "")


@dataclass
class PlanRow:
    """One layout's figures: bytes per rank (the worst pipeline stage) and the estimated step time in seconds."""

    layout: Layout
    params: int
    grads: int
    optimizer: int
    activations: int
    kv_cache: int
    step_time: float
    compute_time: float
    comm_time: float
    fits: bool
    detail: dict[str, float] = field(default_factory=dict)

    @property
    def total(self) -> int:
        """Parameters, gradients, optimizer state and activations (the KV cache is not a training cost)."""
        return self.params + self.grads + self.optimizer + self.activations

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready: the layout's fields, the byte counts, the times, ``fits`` and ``name``."""
        out = {k: v for k, v in asdict(self).items() if k != "layout"}
        return {**asdict(self.layout), "name": self.layout.name(), **out, "total": self.total}


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _layer_of(path: str) -> Optional[int]:
    """The block index of a parameter path ``layers.{i}.…`` (``None``: embedding, final norm, head)."""
    parts = path.split(".")
    return int(parts[1]) if len(parts) > 2 and parts[0] == "layers" and parts[1].isdigit() else None


def stage_layers(n_layers: int, pp: int) -> list[range]:
    """The layers of each of ``pp`` stages: an even cut, the first ``n_layers % pp`` stages one layer more."""
    base, extra = divmod(n_layers, pp)
    out, start = [], 0
    for s in range(pp):
        size = base + (1 if s < extra else 0)
        out.append(range(start, start + size))
        start += size
    return out


class Planner:
    """The layouts of one spec on one cluster (the model is built once on ``meta``).

    Args:
        spec: anything :func:`modkit.build` accepts.
        batch: global batch in sequences; seq_len: tokens per sequence.
        registry: defaults to the process-wide registry.
        precision: ``modkit train``'s ``precision`` the activations are estimated for (``"bfloat16"``: autocast
            over float32 weights; ``"float32"``).
        attention_matrix: count the ``[T, T]`` matrices a math attention kernel keeps (the CPU's for some
            attentions); default ``False``: a fused kernel (FlashAttention, memory-efficient SDPA) keeps none.

    Raises:
        SpecError: the spec is invalid.
        ParallelError: an unknown precision.
    """

    # size: the workload (spec, batch, length) and the two choices the activations are estimated for
    def __init__(
        self,
        spec,
        *,
        batch: int,
        seq_len: int,
        registry=None,
        precision: str = "bfloat16",
        attention_matrix: bool = False,
    ):
        from modkit.analysis.cost import CostModel
        from modkit.core.registry import get_registry

        if precision not in ("float32", "bfloat16", "float16"):
            raise ParallelError(f"precision must be float32, bfloat16 or float16 (modkit train's), got {precision!r}")
        self.precision, self.attention_matrix = precision, attention_matrix

        self.registry = registry or get_registry()
        self.costs = CostModel(spec, registry=self.registry)
        self.spec, self.model = self.costs.spec, self.costs.model
        self.batch, self.seq_len = batch, seq_len
        self.params = _unique_params(self.model)
        self._tp_dims: dict[int, Optional[dict[str, int]]] = {}
        self._ep_ok: dict[int, bool] = {}
        self._experts = _expert_paths(self.model, self.registry)
        self._fwd_flops: Optional[int] = None
        self._cache: dict[tuple, dict] = {}
        self._memo: dict[Any, Any] = {}

    # ---------------------------------------------------------------------------------------- exact sharding
    def tp_dims(self, tp: int) -> Optional[dict[str, int]]:
        """``{parameter path: dim sharded by tp}`` of the composed ``tp_plan``; ``None`` when ``tp`` cannot split
        the model (a head count or width it does not divide)."""
        if tp not in self._tp_dims:
            from .plans import model_plan

            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    plan = model_plan(self.model, tp, registry=self.registry)
            except ParallelError:
                self._tp_dims[tp] = None
            else:
                self._tp_dims[tp] = _style_dims(plan, dict(self.model.named_modules()))
        return self._tp_dims[tp]

    def ep_ok(self, ep: int) -> bool:
        """Whether every mixture can be split ``ep`` ways (:func:`~modkit.parallel.expert.expert_plan`)."""
        if ep not in self._ep_ok:
            from .expert import expert_plan

            try:
                expert_plan(self.model, ep, registry=self.registry)
                self._ep_ok[ep] = True
            except ParallelError:
                self._ep_ok[ep] = ep == 1
        return self._ep_ok[ep]

    def cp_ok(self) -> bool:
        """Whether every component may run under context parallelism, from the declarations
        (:func:`~modkit.parallel.context_parallel_problems`: a recurrent mixer or a mixture of experts that does not
        declare it is refused, so no layout with ``cp > 1`` is planned)."""
        if "cp_ok" not in self._memo:
            from .context import context_parallel_problems

            self._memo["cp_ok"] = not context_parallel_problems(self.model)
        return self._memo["cp_ok"]

    def rank_elements(self, layout: Layout, stage: int = 0) -> dict[str, int]:
        """Elements rank 0 of pipeline ``stage`` stores: ``params``, ``grads`` and ``optimizer`` (AdamW: 2 per
        element of its shard) under ``layout``, parameter by parameter (see the module docstring).

        Raises:
            ParallelError: ``layout.tp`` cannot split the model.
        """
        totals = self._totals(layout.tp, layout.ep, layout.dp * layout.cp, layout.zero)
        keys = [*stage_layers(self.spec.n_layers, layout.pp)[stage]]
        keys += ["first"] * (stage == 0) + ["last"] * (stage == layout.pp - 1)
        held = sum(totals.get(k, (0, 0))[0] for k in keys)
        opt = sum(totals.get(k, (0, 0))[1] for k in keys)
        return {"params": held, "grads": held, "optimizer": opt}

    def _totals(self, tp: int, ep: int, dp: int, zero: int) -> dict[Any, tuple[int, int]]:
        """``{layer index, "first" (embedding) or "last" (final norm, head): (elements held, AdamW elements)}``;
        ``dp`` is the FSDP degree: the data-parallel ranks times the context-parallel ones (the cp ranks shard the
        weights too, :func:`~modkit.parallel.parallelize`)."""
        key = (tp, ep, dp, zero)
        if key in self._cache:
            return self._cache[key]
        dims = self.tp_dims(tp)
        if dims is None:
            raise ParallelError(f"tp = {tp} cannot split {self.spec.name or 'this model'}")
        out: dict[Any, tuple[int, int]] = {}
        for path, p in self.params.items():
            shape = list(p.shape)
            if path in dims:
                shape[dims[path]] //= tp
            expert = any(path.startswith(e + ".") for e in self._experts)
            if expert and ep > 1:
                shape[0] //= ep
            fsdp = dp // ep if expert else dp
            full = math.prod(shape)
            if zero == 3 and shape:
                local = -(-shape[0] // fsdp) * math.prod(shape[1:])
                held, opt = local, 2 * local
            else:
                held, opt = full, 2 * -(-full // fsdp)
            layer = _layer_of(path)
            where = layer if layer is not None else ("first" if path.startswith(("embed", "position")) else "last")
            a, b = out.get(where, (0, 0))
            out[where] = (a + held, b + opt)
        self._cache[key] = out
        return out

    # ---------------------------------------------------------------------------------------- estimates
    def activation_parts(self, layout: Layout):
        """The :class:`~modkit.analysis.step_activations.StepParts` of one microbatch of ``layout`` on a rank: the
        parts measured on fake tensors (:func:`~modkit.analysis.step_activations.estimator`) at the rank's
        ``seq_len / cp`` tokens and the microbatch's rows; the per-sequence bytes divided by ``tp``, the weights' autocast
        copies scaled to the share of each part's weights the rank computes with (``tp`` and ``ep`` split)."""
        from modkit.analysis.step_activations import estimator

        if "fits" not in self._memo:
            self._memo["fits"] = estimator(self.spec, self.precision, self.registry)
        key = ("parts", layout.dp, layout.microbatches, layout.tp, layout.cp, layout.ep)
        if key not in self._memo:
            full = self._totals(1, 1, 1, 1)
            mine = self._totals(layout.tp, layout.ep, layout.ep, 1)  # ZeRO-1 arithmetic: the whole (tp, ep) shard

            def share(part) -> float:
                return mine.get(part, (0, 0))[0] / max(1, full.get(part, (1, 0))[0])

            rows = self.batch // layout.dp / layout.microbatches / layout.tp
            est = self._memo["fits"]
            self._memo[key] = est.at(rows, self.seq_len // layout.cp, share, attention_matrix=self.attention_matrix)
        return self._memo[key]

    def forward_flops(self) -> int:
        """Declared FLOPs of one forward over the global batch."""
        if self._fwd_flops is None:
            from modkit.analysis.workload import Workload

            self._fwd_flops = self.costs.total(Workload(batch=self.batch, new=self.seq_len, past=0))
        return self._fwd_flops

    def row(self, layout: Layout, cluster: Cluster) -> PlanRow:
        """The figures of ``layout`` on ``cluster`` (the pipeline stage with the most bytes)."""
        stages = [self.rank_elements(layout, s) for s in range(layout.pp)]
        acts_by_stage = [self.activations(layout, s) for s in range(layout.pp)]
        worst = max(range(layout.pp), key=lambda s: 4 * sum(stages[s].values()) + acts_by_stage[s])
        el, acts = stages[worst], acts_by_stage[worst]
        local_rows = self.batch // layout.dp
        kv = self._kv_cache(local_rows) // (layout.tp * layout.cp * layout.pp)
        compute, comm, detail = self._time(layout, cluster, stages[worst])
        state = el["params"] * 4, el["grads"] * 4, el["optimizer"] * 4
        row = PlanRow(layout, *state, acts, kv, compute + comm, compute, comm, False, detail)
        row.fits = row.total <= cluster.gpu_memory
        return row

    def activations(self, layout: Layout, stage: int = 0) -> int:
        """Activation bytes at the peak of a rank of pipeline ``stage``: the microbatches in flight under 1F1B
        (``min(pp - stage, m)``) hold what their forwards leave for their backward, and the one in its backward
        reaches :func:`~modkit.analysis.step_activations.peak_bytes` (see the module docstring)."""
        from modkit.analysis.step_activations import held_bytes, peak_bytes

        parts = self.activation_parts(layout)
        layers = stage_layers(self.spec.n_layers, layout.pp)[stage]
        where = dict(first=stage == 0, last=stage == layout.pp - 1, checkpointing=layout.checkpointing)
        in_flight = min(layout.pp - stage, layout.microbatches)
        return (in_flight - 1) * held_bytes(parts, layers, **where) + peak_bytes(parts, layers, **where)

    def _time(self, layout: Layout, cluster: Cluster, stage: dict[str, int]) -> tuple[float, float, dict]:
        """(compute seconds with the bubble, communication seconds, the communication by kind)."""
        world = layout.dp * layout.tp * layout.pp * layout.cp
        factor = 4 if layout.checkpointing else 3
        compute = factor * self.forward_flops() / (world * cluster.peak_flops * cluster.mfu)
        compute *= 1 + (layout.pp - 1) / layout.microbatches
        link = _links(layout, cluster)
        tokens = self.batch * self.seq_len / (layout.dp * layout.cp)  # a rank's tokens per step
        d, n_stage = self.spec.d_model, len(stage_layers(self.spec.n_layers, layout.pp)[0])
        shards = layout.dp * layout.cp  # FSDP2 shards over the dp x cp ranks
        weights = stage["params"] * (shards if layout.zero == 3 else 1) * WIRE_BYTES  # the stage's bf16 weights
        comm = {
            "dp": (3 if layout.zero == 3 else 2) * weights * (shards - 1) / shards / link["dp"],
            "tp": 4 * n_stage * 2 * tokens * d * WIRE_BYTES * (layout.tp - 1) / layout.tp / link["tp"],
            "ep": 4
            * self._moe_layers(n_stage)
            * tokens
            * self._top_k()
            * d
            * WIRE_BYTES
            * (layout.ep - 1)
            / layout.ep
            / link["ep"],
            "cp": 2 * n_stage * tokens * self._kv_width() * WIRE_BYTES * (layout.cp - 1) / link["cp"],
            "pp": 2
            * layout.microbatches
            * (tokens / layout.microbatches)
            * d
            * WIRE_BYTES
            * (layout.pp > 1)
            / link["pp"],
        }
        return compute, sum(comm.values()), comm

    def _moe_layers(self, n_stage: int) -> float:
        """MoE layers on a stage: the model's share of them."""
        return len(self._experts) * n_stage / self.spec.n_layers

    def _top_k(self) -> int:
        """The largest ``top_k`` of the expert-parallel mixtures (1 without any)."""
        if "top_k" not in self._memo:
            ks = [getattr(m, "top_k", 1) for m in self.model.modules() if getattr(m, "ep_refusal", None)]
            self._memo["top_k"] = max(ks, default=1)
        return self._memo["top_k"]

    def _kv_width(self) -> int:
        """Key plus value width per token of one layer (bf16 KV cache bytes per token per layer / 2)."""
        if "kv" not in self._memo:
            per_token = self.costs.kv_cache_bytes_per_token("bfloat16")
            self._memo["kv"] = int(per_token / max(1, self.spec.n_layers) / WIRE_BYTES)
        return self._memo["kv"]

    def _kv_cache(self, rows: int) -> int:
        """The bf16 KV cache of ``rows`` sequences at the training context."""
        if ("kv_cache", rows) not in self._memo:
            self._memo[("kv_cache", rows)] = self.costs.kv_cache_bytes(self.seq_len, rows)
        return self._memo[("kv_cache", rows)]

    # ---------------------------------------------------------------------------------------- enumeration
    def layouts(self, cluster: Cluster, *, zero: tuple[int, ...] = (3, 1)) -> list[Layout]:
        """Every layout dividing the cluster and the model: ``tp`` within a node and able to split the model,
        ``pp`` at most the layer count, ``ep`` dividing ``dp`` and every mixture, ``cp`` dividing ``seq_len``,
        ``dp`` dividing the batch; ``cp`` only when every component declares it may be sequence-sharded (:meth:`cp_ok`); microbatches: the divisors of the local batch from ``pp`` to ``8 pp`` and the
        local batch itself (one sequence each), at most six of them; checkpointing off and on; ZeRO-3 and ZeRO-1."""
        out = []
        g = cluster.gpus
        for tp, cp, pp in itertools.product(_divisors(g), repeat=3):
            if g % (tp * cp * pp) or tp > cluster.gpus_per_node or pp > self.spec.n_layers:
                continue
            dp = g // (tp * cp * pp)
            if self.batch % dp or self.seq_len % cp or cp > 1 and not (_powers_of_two(cp) and self.cp_ok()):
                continue
            if self.tp_dims(tp) is None:
                continue
            micro = _microbatches(self.batch // dp, pp)
            for ep in [e for e in _divisors(dp) if self.ep_ok(e) and (e == 1 or self._experts)]:
                for m, ckpt, z in itertools.product(micro, (False, True), zero if dp > 1 else (3,)):
                    out.append(Layout(dp=dp, tp=tp, pp=pp, ep=ep, cp=cp, microbatches=m, checkpointing=ckpt, zero=z))
        return out

    def plan(self, cluster: Cluster, *, zero: tuple[int, ...] = (3, 1)) -> list[PlanRow]:
        """Every layout's row, those that fit first, each group by step time (then total bytes)."""
        rows = [self.row(lay, cluster) for lay in self.layouts(cluster, zero=zero)]
        return sorted(rows, key=lambda r: (not r.fits, r.step_time, r.total))


def _microbatches(local: int, pp: int) -> list[int]:
    """Microbatch counts for a local batch of ``local`` sequences and ``pp`` stages (see :meth:`Planner.layouts`)."""
    found = [m for m in _divisors(local) if pp <= m <= 8 * pp]
    found = found[:: max(1, -(-len(found) // 5))]
    return sorted(set(found + ([local] if local >= pp else [])))


def _powers_of_two(n: int) -> bool:
    return n & (n - 1) == 0


def _unique_params(model: nn.Module) -> dict[str, nn.Parameter]:
    """``{path: parameter}``, a tied parameter once (its first path)."""
    out, seen = {}, set()
    for path, p in model.named_parameters():
        if id(p) not in seen:
            seen.add(id(p))
            out[path] = p
    return out


def _expert_paths(model: nn.Module, registry) -> list[str]:
    """Paths of the stacked experts of every component declaring an ``ep_plan`` (no check of any degree)."""
    out = []
    for path, module in model.named_modules():
        typ = getattr(module, "modkit_type", None)
        if typ is None:
            continue
        plan = registry.get(module.modkit_kind, typ).capabilities.get("ep_plan") or {}
        out += [f"{path}.{sub}" for sub, style in plan.items() if style == "experts"]
    return out


def _style_dims(plan, modules: dict[str, nn.Module]) -> dict[str, int]:
    """``{parameter path: sharded dim}`` of a :class:`~modkit.parallel.plans.TPPlan`."""
    out: dict[str, int] = {}
    for path, style in plan.styles.items():
        if style == "heads":
            out[path] = 0
            continue
        mod = modules[path]
        if style == "grouped":
            out.update({f"{path}.{n}": d for n, d in (mod.tp_shard_dims or {}).items()})
        elif style in ("colwise", "colwise_gather") or (style == "rowwise" and isinstance(mod, nn.Embedding)):
            out.update({f"{path}.{n}": 0 for n, _ in mod.named_parameters(recurse=False)})
        elif style == "rowwise":
            out[f"{path}.weight"] = 1  # the bias stays whole
    return out


def _links(layout: Layout, cluster: Cluster) -> dict[str, float]:
    """Bandwidth of each mesh dim's collectives: NVLink when the dim and those inside it fit in a node."""
    inner, out = 1, {}
    for name, size in (("tp", layout.tp), ("cp", layout.cp), ("ep", layout.ep), ("dp", layout.dp // layout.ep)):
        inner *= size
        out[name] = cluster.nvlink_bandwidth if inner <= cluster.gpus_per_node else cluster.network_bandwidth
    out["pp"] = cluster.nvlink_bandwidth if inner * layout.pp <= cluster.gpus_per_node else cluster.network_bandwidth
    return out


def launch_command(layout: Layout, spec_path: str, cluster: Cluster) -> str:
    """The ``torchrun`` line of ``layout`` (flags ``modkit train`` takes today: ``--pp`` with ``--pp-microbatches``
    beside ``--tp``, ``--cp``, ``--ep``; what it does not take named in a note)."""
    nodes = max(1, cluster.gpus // cluster.gpus_per_node)
    per_node = min(cluster.gpus, cluster.gpus_per_node)
    flags = [f"--{k} {getattr(layout, k)}" for k in ("pp", "tp", "cp", "ep") if getattr(layout, k) > 1]
    flags += [f"--pp-microbatches {layout.microbatches}"] * (layout.pp > 1)
    cmd = f"torchrun --nnodes {nodes} --nproc-per-node {per_node} -m modkit train --model {spec_path} " + " ".join(
        flags
    )
    missing = ["activation checkpointing"] * layout.checkpointing + ["ZeRO-1"] * (layout.zero == 1)
    missing += ["pp with cp"] * (layout.pp > 1 and layout.cp > 1)
    missing += ["ep with tp (expert-tensor parallelism)"] * (layout.ep > 1 and layout.tp > 1)
    missing += ["ep with cp"] * (layout.ep > 1 and layout.cp > 1)
    return cmd.strip() + (f"   # needs {', '.join(missing)}: not yet a modkit train flag" if missing else "")

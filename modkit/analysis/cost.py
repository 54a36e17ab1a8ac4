"""What a model costs: FLOPs by part, KV-cache and weight bytes, a training-memory estimate, a roofline decode latency.

FLOPs come from the components themselves, the way parameter counts do: every registry entry declares
``Component.flops(config, ctx, work) -> {part: FLOPs}`` for one call of its module on a :class:`Workload`, and this
module sums the declarations of every component a spec builds (on ``meta``: nothing is allocated, a 405B spec takes
about a second). The core names no component; the LM head (a matrix product the model itself owns) is the only
term computed here. The contract kit checks each declaration against ``torch.utils.flop_counter.FlopCounterMode``
(:mod:`modkit.testing.flops`), as it checks ``param_count``.

Conventions:

* **1 multiply-add = 2 FLOPs.** A ``[m, k] @ [k, n]`` product costs ``2·m·k·n``.
* **Matrix products only.** Linear projections, attention scores ``q·kᵀ`` and the weighted sum ``p·v``, the MoE
  router and experts, the LM head. Element-wise work (softmax, activations, gating products, norms, RoPE, residual
  adds, biases) is not counted: it is well under 1 % of a real model's FLOPs, and it is what ``FlopCounterMode``
  leaves out too, so the two can be compared to the FLOP. Components that do only element-wise work declare
  :func:`elementwise` (0, with the reason).
* **Useful pairs.** Attention counts the (query, key) pairs its mask lets through: causal, within the sliding
  window or the attention chunk, ``min(context, window)`` keys for a decoded token and ``(T + 1) / 2`` on average
  over a causal prefill of ``T`` tokens. Dense kernels compute the whole ``[new, past + new]`` score rectangle (masked entries included);
  ``Workload(dense=True)`` counts that instead, which is what ``FlopCounterMode`` measures.
* **Phases.** *prefill at context N*: one forward over ``N`` tokens, per token (every position's logits, as in
  training; generation skips the head for all but the last prompt token). *decode at context N*: one new token
  whose cache holds the ``N - 1`` tokens before it, so it attends to ``N`` keys (``min(N, window)`` in a
  sliding-window layer). *training*: forward + backward = 3 x forward (the backward of every matrix product is
  two products of the same size: the input and the weight gradients; kernels that recompute attention scores in
  the backward, FlashAttention, do one product more there, which is recomputation, not model FLOPs).

References: Kaplan et al. 2020, Scaling Laws for Neural Language Models (arXiv:2001.08361) §2.1 (FLOPs per token
``2N + 2·n_layer·n_ctx·d_attn``); Hoffmann et al. 2022, Chinchilla (arXiv:2203.15556) appendix F; Korthikanti et al.
2022, Reducing Activation Recomputation in Large Transformer Models (arXiv:2205.05198) for what a layer keeps for the
backward; Williams et al. 2009, Roofline (CACM 52(4)) for the latency bound.

The pieces: :mod:`modkit.analysis.workload` (the workload a declaration is evaluated on, the declarations checked),
:mod:`modkit.analysis.activations` (the measured activation memory) and :mod:`modkit.analysis.flop_counting` (the
FLOPs torch measures); every name they define is importable from here too.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from fractions import Fraction
from pathlib import Path
from typing import Any, Iterable, Optional, Union

import torch
from torch import nn

from modkit.nn.build import _parse_dtype, active_params_per_token, breakdown, build
from modkit.nn.build import cache_state_bytes_per_sequence as _state_bytes
from modkit.nn.build import kv_cache_bytes as _kv_cache_bytes
from modkit.nn.build import kv_cache_bytes_per_token as _kv_bytes_per_token
from modkit.analysis.hardware import DEFAULT_BANDWIDTH, DEFAULT_PEAK_FLOPS  # noqa: F401  (re-exported: the roofline defaults)
from modkit.core.registry import Component, Registry, get_registry
from modkit.spec import ModelSpec, load_spec, spec_model
from modkit.nn.sharing import sharing_flops
from .layer_slots import layer_slots as _slots
from .activations import _FIT_CACHE, _saved_bytes, _saved_fit  # noqa: F401  (re-exported: they lived here)
from .flop_counting import (  # noqa: F401  (re-exported: they lived here)
    _grouped_mm_flops,
    _grouped_mm_weight_grad_flops,
    _sdpa_cpu,
    _sdpa_cpu_backward,
    _solve_triangular_flops,
    flop_counter,
)
from .workload import (  # noqa: F401  (re-exported: the declarations' side, which modkit.plugin hands to plugins)
    FLOPS_PER_MAC,
    CostError,
    Elementwise,
    Workload,
    _causal_prefix,
    _chunked_pairs,
    _reach,
    declared_flops,
    GROWTH_CONTEXTS,
    declared_growth,
    elementwise,
    varying_parts,
)

#: Bytes per parameter of modkit's training state: float32 weights, float32 gradients and AdamW's two float32
#: moments (``modkit train`` keeps float32 parameters and runs the forward under autocast).
TRAIN_STATE_BYTES = {"weights": 4, "gradients": 4, "adamw_states": 8}
#: Weight storage formats shown by ``modkit cost``: bytes per parameter (float8: one byte, scales not counted).
WEIGHT_FORMATS = {"float32": 4, "bfloat16": 2, "float8": 1}
PHASES = ("prefill", "decode")


# ------------------------------------------------------------------------------------------------- the model's components


class _Recorder(Registry):
    """A view of a registry that remembers each factory call ``(entry, config, ctx, module)`` while building."""

    def __init__(self, base: Registry):  # noqa: D107 - shares the base registry's state
        spec_model(base)
        self.__dict__.update(base.__dict__)
        self.records: list[_Record] = []

    def entry_for_config(self, config, kind=None) -> Component:
        entry = super().entry_for_config(config, kind)
        records = self.records

        def factory(cfg, ctx, _entry=entry):
            module = _entry.factory(cfg, ctx)
            if isinstance(module, nn.Module):
                records.append(_Record(_entry, cfg, ctx, module))
            return module

        return replace(entry, factory=factory)


@dataclass
class _Record:
    entry: Component
    config: Any
    ctx: Any
    module: nn.Module


@dataclass
class _Use:
    """A built component, the layer it belongs to, how many times one forward calls it and the spec slot it sits in
    (``"mixer"``: built by the layer's token-mixing slot, nested components included; ``"ffn"``; ``None``: other)."""

    entry: Component
    config: Any
    ctx: Any
    layer: Optional[int]
    calls: int
    slot: Optional[str] = None


@dataclass(frozen=True)
class MixerGroup:
    """The layers whose token-mixing slot holds one config, and how its declared FLOPs grow.

    Attributes:
        type: the mixer's registered type (``"gqa"``, ``"mamba2"``, ...).
        config: its config (every layer of the group has an equal one).
        layers: the layer indices, increasing.
        growing: the ``"kind.part"`` keys of the slot's components whose declared FLOPs per decoded token grow with
            the context (:func:`~modkit.analysis.workload.declared_growth`); empty: constant FLOPs per token, so the
            mixer never overtakes the FFN.
        has_ffn: whether those layers have an FFN to compare with.
    """

    type: str
    config: Any
    layers: tuple[int, ...]
    growing: frozenset[str]
    has_ffn: bool


def _uses(model: nn.Module, records: Iterable[Any]) -> list[_Use]:
    """One :class:`_Use` per factory call. A position scheme is shared by the layers with the same config: acting on
    q/k or on the scores it runs once per such layer, acting on the embeddings once (the model-level scheme only)."""
    positions = list(getattr(model, "positions", []))
    layer_position = list(getattr(model, "layer_position", []))
    records = list(records)
    slots = _slots(model, records)
    out = []
    for r in records:
        calls = 1
        if r.entry.kind == "position":
            index = next((i for i, m in enumerate(positions) if m is r.module), None)
            acts_on = r.entry.capabilities.get("acts_on")
            per_layer = layer_position.count(index) if index is not None else 0
            if acts_on == "embedding":
                calls = 1 if index == 0 else 0
            elif acts_on in ("qk", "bias"):
                calls = per_layer
            else:
                calls = per_layer + (1 if index == 0 else 0)
        layer = getattr(r.ctx, "layer_index", None)
        out.append(_Use(r.entry, r.config, r.ctx, layer, calls, slots.get(id(r.module))))
    return out


def _as_spec(spec: Union[ModelSpec, dict, str, Path], reg: Registry) -> ModelSpec:
    return spec if isinstance(spec, spec_model(reg)) else load_spec(spec, registry=reg)


class CostModel:
    """The costs of one spec, from its components' declarations (built once on ``meta``).

    Args:
        spec: a :class:`~modkit.ModelSpec`, a dict, a JSON string or a path.
        registry: defaults to the process-wide registry.

    Raises:
        SpecError: the spec is invalid. CostError (on use): a component declares no FLOPs.
    """

    def __init__(self, spec: Union[ModelSpec, dict, str, Path], *, registry: Optional[Registry] = None):
        reg = registry or get_registry()
        self.registry = reg
        self.spec = _as_spec(spec, reg)
        recorder = _Recorder(reg)
        self.model = build(self.spec, device="meta", registry=recorder)
        self._uses = _uses(self.model, recorder.records)
        self._varying: Optional[set[str]] = None

    @classmethod
    def from_records(cls, model: nn.Module, records: Iterable[Any], registry: Registry) -> "CostModel":
        """A cost model of an already built model, given the factory calls recorded while building it (objects with
        ``entry``, ``config``, ``ctx`` and ``module``, as the contract kit's bench records them)."""
        self = cls.__new__(cls)
        self.registry, self.spec, self.model = registry, model.spec, model
        self._uses = _uses(model, records)
        self._varying = None
        return self

    # ------------------------------------------------------------------ FLOPs
    def _head(self, work: Workload) -> int:
        return FLOPS_PER_MAC * work.tokens * self.spec.d_model * self.spec.vocab_size

    def flops_by_layer(self, work: Workload) -> dict[Optional[int], dict[str, int]]:
        """FLOPs of one forward on ``work`` by layer (``None``: model-level parts) and ``"kind.part"``.

        The head is ``{"head.proj": 2 · tokens · d_model · vocab_size}`` under ``None``; embedding lookups cost 0.
        Sharing across layers (:func:`modkit.nn.sharing.sharing_flops`): a layer reading another's keys and values
        runs no key/value projections, a per-use adapter adds ``adapter.lora``.

        Raises:
            CostError: a component declares no FLOPs or returns a malformed declaration.
        """
        out: dict[Optional[int], dict[str, int]] = {}
        for u in self._uses:
            parts = declared_flops(u.entry, u.config, u.ctx, work)
            if not u.calls:
                continue
            bucket = out.setdefault(u.layer, {})
            for part, n in parts.items():
                key = f"{u.entry.kind}.{part}"
                bucket[key] = bucket.get(key, 0) + u.calls * n
        out.setdefault(None, {})["head.proj"] = self._head(work)
        sharing_flops(self.model, out, work.tokens)  # readers of another layer's keys; per-use adapters
        return out

    def flops(self, work: Workload) -> dict[str, int]:
        """FLOPs of one forward on ``work`` by ``"kind.part"`` summed over layers (see :meth:`flops_by_layer`)."""
        total: dict[str, int] = {}
        for parts in self.flops_by_layer(work).values():
            for k, n in parts.items():
                total[k] = total.get(k, 0) + n
        return total

    def total(self, work: Workload) -> int:
        """All FLOPs of one forward on ``work``."""
        return sum(self.flops(work).values())

    @staticmethod
    def workload(phase: str, context: int, batch: int = 1) -> Workload:
        """The workload of a phase: ``prefill`` = ``context`` new tokens; ``decode`` = 1 new token after ``context - 1``.

        Raises:
            CostError: unknown phase or ``context < 1``.
        """
        if phase not in PHASES:
            raise CostError(f"phase must be one of {', '.join(PHASES)}, got {phase!r}")
        if context < 1:
            raise CostError(f"context must be >= 1 token, got {context}")
        if phase == "prefill":
            return Workload(batch=batch, new=context, past=0)
        return Workload(batch=batch, new=1, past=context - 1)

    def per_token(self, phase: str, context: int) -> dict[str, Fraction]:
        """FLOPs per token by ``"kind.part"`` in ``phase`` at ``context`` (exact fractions; see the module docstring)."""
        work = self.workload(phase, context)
        return {k: Fraction(n, work.tokens) for k, n in self.flops(work).items()}

    def context_parts(self) -> set[str]:
        """The ``"kind.part"`` keys whose FLOPs per decoded token change with the context (attention scores, a
        block-compressed attention's indexer...): present at two consecutive contexts of
        :data:`~modkit.analysis.workload.GROWTH_CONTEXTS` and different there (:func:`varying_parts`), as
        :func:`~modkit.analysis.workload.declared_growth` reads one component."""
        if self._varying is None:
            self._varying = varying_parts([self.flops(self.workload("decode", n)) for n in GROWTH_CONTEXTS])
        return self._varying

    def _slot_flops(self, uses: list[_Use], work: Workload, keys: Optional[set[str]] = None) -> int:
        """FLOPs of one forward on ``work`` of ``uses`` (only their ``"kind.part"`` in ``keys`` when given)."""
        total = 0
        for u in uses:
            if u.calls:
                for part, n in declared_flops(u.entry, u.config, u.ctx, work).items():
                    if keys is None or f"{u.entry.kind}.{part}" in keys:
                        total += u.calls * n
        return total

    def _growing(self, uses: list[_Use]) -> set[str]:
        """The ``"kind.part"`` keys of ``uses`` whose declared FLOPs per decoded token grow with the context."""
        return {f"{u.entry.kind}.{part}" for u in uses if u.calls for part in declared_growth(u.entry, u.config, u.ctx)}

    def mixers(self) -> list[MixerGroup]:
        """The model's token mixers, one :class:`MixerGroup` per distinct config of the token-mixing slot, in order
        of their first layer; each says which of its parts' declared FLOPs grow with the context.

        Raises:
            CostError: a component of a mixer or FFN slot declares no FLOPs, or a malformed declaration.
        """
        groups: dict[str, list[int]] = {}
        configs = {}
        for i in range(self.spec.n_layers):
            cfg = self.spec.layer(i).attention
            key = f"{type(cfg).__name__}:{cfg.model_dump_json()}"
            groups.setdefault(key, []).append(i)
            configs[key] = cfg
        out = []
        for key, layers in groups.items():
            uses = [u for u in self._uses if u.slot == "mixer" and u.layer in layers]
            entry = self.registry.entry_for_config(configs[key])
            has_ffn = any(u.slot == "ffn" and u.layer in layers for u in self._uses)
            out.append(MixerGroup(entry.type, configs[key], tuple(layers), frozenset(self._growing(uses)), has_ffn))
        return out

    def crossover(
        self, phase: str, *, projections: bool = False, limit: int = 2**40, layers: Optional[Iterable[int]] = None
    ) -> Optional[int]:
        """The smallest context at which the token mixers' FLOPs per token reach the FFN's (router included), in
        ``phase``: what sits in the layers' mixer slot against what sits in their ffn slot, whatever the kinds.

        The mixers' part that grows with the context is read from their declarations (:meth:`mixers`,
        :func:`~modkit.analysis.workload.declared_growth`): an attention's scores and weighted sum, a retention
        whose declared FLOPs grow the same way; a mixer whose FLOPs per token are constant (a recurrent scan over
        a fixed-size state) never overtakes.

        Args:
            projections: count the whole mixer (q/k/v/o or in/out projections too); default only the parts whose
                declared FLOPs grow with the context.
            limit: search bound.
            layers: compare only these layers' mixers and FFNs (default: every layer).

        Returns:
            The context in tokens, or ``None`` when the mixers never reach the FFN below ``limit`` (no mixer's FLOPs
                grow with the context, or they stop growing first: a sliding window on every layer), or when the
                layers have no FFN to compare with (Mamba-2's mixer-only blocks).

        Raises:
            CostError: an unknown phase, or a component without a (well-formed) FLOPs declaration.
        """
        chosen = None if layers is None else set(layers)
        pick = lambda slot: [  # noqa: E731
            u for u in self._uses if u.slot == slot and (chosen is None or u.layer in chosen)
        ]
        mixers, ffns = pick("mixer"), pick("ffn")
        growing = self._growing(mixers)
        if not growing or not ffns:
            return None
        keys = None if projections else growing

        def mixer_wins(n: int) -> bool:
            work = self.workload(phase, n)
            return self._slot_flops(mixers, work, keys) >= self._slot_flops(ffns, work)

        if not mixer_wins(limit):
            return None
        lo, hi = 1, limit
        while lo < hi:
            mid = (lo + hi) // 2
            if mixer_wins(mid):
                hi = mid
            else:
                lo = mid + 1
        return lo

    def mixer_crossovers(self) -> list[dict[str, Any]]:
        """Each token mixer's crossover against the FFN of its own layers (JSON-ready, ``modkit cost``'s table).

        Returns:
            One row per :class:`MixerGroup` (and, when there are several, a last row ``"mixer": "all"`` over every
                layer): ``{"mixer", "layers", "grows", "growing_parts", "has_ffn", "decode": {"growing_parts",
                "whole_mixer"}, "prefill": {...}}``, each context in tokens or ``None`` (never / nothing to compare).
        """
        groups = self.mixers()
        rows = [(g.type, g.layers, g.growing, g.has_ffn) for g in groups]
        if len(groups) > 1:
            every = frozenset().union(*(g.growing for g in groups))
            rows.append(("all", tuple(range(self.spec.n_layers)), every, any(g.has_ffn for g in groups)))
        out = []
        for name, layers, growing, has_ffn in rows:
            row = {"mixer": name, "layers": list(layers), "grows": bool(growing), "growing_parts": sorted(growing)}
            row["has_ffn"] = has_ffn
            for ph in PHASES:
                row[ph] = {
                    "growing_parts": self.crossover(ph, layers=layers),
                    "whole_mixer": self.crossover(ph, projections=True, layers=layers),
                }
            out.append(row)
        return out

    # ------------------------------------------------------------------ bytes
    def params(self) -> dict[str, int]:
        """Parameter breakdown (:func:`modkit.breakdown`)."""
        return breakdown(self.model)

    def weight_bytes(self, dtype: Union[str, torch.dtype, int]) -> int:
        """Bytes of all parameters stored in ``dtype`` (a torch dtype, or bytes per parameter)."""
        size = dtype if isinstance(dtype, int) else torch.empty((), dtype=_parse_dtype(dtype)).element_size()
        return self.params()["total"] * size

    def kv_cache_bytes(self, context: int, batch: int = 1, dtype: Union[str, torch.dtype] = "bfloat16") -> int:
        """Bytes of the cache held for ``batch`` rows of ``context`` tokens, from what each token mixer declares
        (:func:`modkit.nn.build.kv_cache_bytes`: ``Σ batch · (bytes_per_token · min(context, window) +
        bytes_per_sequence)``; the built-in attention's ``bytes_per_token`` is ``2 · n_kv_heads · head_dim ·
        bytes(dtype)``, MLA's ``(kv_lora_rank + qk_rope_head_dim) · bytes(dtype)``)."""
        if context < 1 or batch < 1:
            raise CostError(f"context and batch must be >= 1, got context {context}, batch {batch}")
        return _kv_cache_bytes(self.model, context, batch, dtype)

    def kv_cache_bytes_per_token(self, dtype: Union[str, torch.dtype] = "bfloat16") -> int:
        """Bytes one token adds to the cache over all layers (:func:`modkit.kv_cache_bytes_per_token`)."""
        return _kv_bytes_per_token(self.model, dtype)

    def cache_state_bytes_per_sequence(self, dtype: Union[str, torch.dtype] = "bfloat16") -> int:
        """Bytes of fixed-size (recurrent) state one sequence holds (:func:`modkit.nn.build.cache_state_bytes_per_sequence`)."""
        return _state_bytes(self.model, dtype)

    def weights_read_per_step(self, batch: int = 1) -> int:
        """Parameters one decode step reads: every matrix-product weight (the head's too when it is tied), not the
        embedding and position tables (a lookup reads ``batch`` rows), and at batch 1 not the experts a token skips
        (``inactive_params_per_token``). At batch > 1 every expert is assumed read: an upper bound."""
        p = self.params()
        read = p["total"] - p["embedding"] - p["position"]
        if self.spec.tie_embeddings:
            read += self.spec.vocab_size * self.spec.d_model
        if batch == 1:
            read -= p["total"] - active_params_per_token(self.model)
        return read

    def decode_latency(
        self,
        context: int,
        batch: int = 1,
        dtype: Union[str, torch.dtype] = "bfloat16",
        bandwidth: float = DEFAULT_BANDWIDTH,
        peak_flops: float = DEFAULT_PEAK_FLOPS,
    ) -> dict[str, Any]:
        """Roofline latency of one decode step of ``batch`` rows at ``context``: ``max(bytes / bandwidth, FLOPs / peak)``.

        Bytes: the weights read (:meth:`weights_read_per_step`) and the whole KV cache at ``context``, in ``dtype``.
        A lower bound: no kernel overheads, perfect overlap of memory and compute.

        Returns:
            ``{"seconds", "bound" ("memory" | "compute"), "bytes", "flops", "memory_s", "compute_s", "tokens_per_s"}``.

        Raises:
            CostError: a non-positive bandwidth or peak.
        """
        if bandwidth <= 0 or peak_flops <= 0:
            raise CostError(f"bandwidth and peak FLOP/s must be > 0, got {bandwidth} and {peak_flops}")
        size = torch.empty((), dtype=_parse_dtype(dtype)).element_size()
        nbytes = self.weights_read_per_step(batch) * size + self.kv_cache_bytes(context, batch, dtype)
        flops = self.total(self.workload("decode", context, batch))
        memory_s, compute_s = nbytes / bandwidth, flops / peak_flops
        seconds = max(memory_s, compute_s)
        return {
            "seconds": seconds,
            "bound": "memory" if memory_s >= compute_s else "compute",
            "bytes": nbytes,
            "flops": flops,
            "memory_s": memory_s,
            "compute_s": compute_s,
            "tokens_per_s": batch / seconds,
        }

    def training_memory(self, batch: int, seq_len: int, dtype: Union[str, torch.dtype] = "bfloat16") -> dict[str, int]:
        """An estimate of the memory one training step holds: weights, gradients, AdamW states, activations.

        Weights, gradients and AdamW's two moments are float32 (:data:`TRAIN_STATE_BYTES`, as ``modkit train`` keeps
        them). Activations are what autograd saves for the backward, measured: the model is built on ``meta`` in
        ``dtype`` (the autocast dtype), run in training mode with the training loss at ``batch`` rows and three short
        lengths under ``torch.autograd.graph.saved_tensors_hooks``, and the saved bytes (parameters excluded, each
        storage once) fitted exactly by ``a + b·T + c·T²`` (at 2, 3 and 4 chunks when a mixer computes in chunks,
        a module attribute ``chunk_size``: below two chunks its saved bytes are not yet linear in ``T``). ``activations`` is ``a + b·seq_len``: attention kernels
        that keep no ``[seq, seq]`` matrix (FlashAttention, memory-efficient SDPA); ``attention_matrix`` is
        ``c·seq_len²``, what an eager (math) attention would keep on top. Not counted: temporaries of the backward,
        allocator fragmentation, the CUDA context.

        Raises:
            CostError: ``batch`` or ``seq_len`` below 1.
        """
        if batch < 1 or seq_len < 1:
            raise CostError(f"batch and seq_len must be >= 1, got batch {batch}, seq_len {seq_len}")
        n = self.params()["total"]
        out = {k: n * b for k, b in TRAIN_STATE_BYTES.items()}
        a, b, c = _saved_fit(self.spec, batch, _parse_dtype(dtype), self.registry)
        out["activations"] = int(round(a + b * seq_len))
        out["attention_matrix"] = int(round(c * seq_len * seq_len))
        out["total"] = sum(out[k] for k in ("weights", "gradients", "adamw_states", "activations"))
        return out

    # ------------------------------------------------------------------ report
    def report(
        self,
        *,
        context: int,
        batch: int = 1,
        dtype: Union[str, torch.dtype] = "bfloat16",
        bandwidth: float = DEFAULT_BANDWIDTH,
        peak_flops: float = DEFAULT_PEAK_FLOPS,
        train_seq_len: Optional[int] = None,
    ) -> dict[str, Any]:
        """Everything ``modkit cost`` shows, as JSON-ready data (FLOPs per token as floats)."""
        from .dense_twin import against_dense

        dname = str(_parse_dtype(dtype)).replace("torch.", "")
        seq = train_seq_len or context
        per_token = {ph: {k: float(v) for k, v in self.per_token(ph, context).items()} for ph in PHASES}
        train = {k: 3 * v for k, v in per_token["prefill"].items()}
        return {
            "name": self.spec.name,
            "context": context,
            "batch": batch,
            "dtype": dname,
            "convention": "matrix-product FLOPs only, 1 multiply-add = 2 FLOPs; attention counts the (query, key) pairs its mask lets through",
            "flops_per_token": {**per_token, "train": train},  # train: 3 x prefill at the context
            "flops_per_token_total": {ph: sum(v.values()) for ph, v in {**per_token, "train": train}.items()},
            "context_dependent_parts": sorted(self.context_parts()),
            # every layer's token mixers against every FFN; the key's name predates recurrent mixers
            "attention_overtakes_ffn": {
                ph: {"scores": self.crossover(ph), "with_projections": self.crossover(ph, projections=True)}
                for ph in PHASES
            },
            "mixer_overtakes_ffn": self.mixer_crossovers(),
            # a sparse attention (capability selects_from) against the dense one it selects from; None without
            "against_dense": against_dense(self, context, dtype),
            "params": self.params(),
            "active_params_per_token": active_params_per_token(self.model),
            "weight_bytes": {k: self.weight_bytes(b) for k, b in WEIGHT_FORMATS.items()},
            "kv_cache_bytes": self.kv_cache_bytes(context, batch, dtype),
            "kv_cache_bytes_per_token": self.kv_cache_bytes_per_token(dtype),
            "cache_state_bytes_per_sequence": self.cache_state_bytes_per_sequence(dtype),
            "training_memory": {
                "batch": batch,
                "seq_len": seq,
                "dtype": dname,
                "estimate": True,
                **self.training_memory(batch, seq, dtype),
            },
            "decode_roofline": {
                "bandwidth_bytes_per_s": bandwidth,
                "peak_flops_per_s": peak_flops,
                **self.decode_latency(context, batch, dtype, bandwidth, peak_flops),
            },
        }


# ------------------------------------------------------------------------------------------------- shortcuts


def flops_per_token(
    spec: Union[ModelSpec, dict, str, Path], context: int, phase: str = "decode", *, registry: Optional[Registry] = None
) -> float:
    """FLOPs per token of ``spec`` in ``phase`` (``"prefill"``, ``"decode"`` or ``"train"`` = 3 x prefill) at ``context``.

    Raises:
        CostError: unknown phase, bad context, or a component without a FLOPs declaration.
        SpecError: invalid spec.
    """
    model = CostModel(spec, registry=registry)
    if phase == "train":
        return 3 * float(sum(model.per_token("prefill", context).values()))
    return float(sum(model.per_token(phase, context).values()))


def training_flops_per_token(
    spec: Union[ModelSpec, dict, str, Path], seq_len: int, *, registry: Optional[Registry] = None
) -> int:
    """Training FLOPs per token at ``seq_len``: 3 x the forward FLOPs of one causal sequence / ``seq_len``, rounded.

    Raises:
        CostError: as :func:`flops_per_token`.
    """
    model = CostModel(spec, registry=registry)
    return round(Fraction(3 * model.total(model.workload("prefill", seq_len)), seq_len))

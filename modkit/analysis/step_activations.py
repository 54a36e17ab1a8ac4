"""The activation memory of a training step, part by part: what autograd saves for the backward in the embedding,
in each block and in the head and loss, and what activation checkpointing keeps of each block (its inputs); on
real tensors (a measurement) or on fake ones (the same forward with no memory, for any size: ``modkit plan``).

**What is counted.** Every tensor autograd saves for the backward (``torch.autograd.graph.saved_tensors_hooks``)
during one training forward and its loss (cross entropy over the logits in float32, plus the auxiliary loss),
each storage once, parameters excluded, attributed to the part running when it is first saved (block forward
hooks): ``"first"`` before the first block (embedding), the block's index, ``"last"`` after the last block (final
norm, head, loss). Under ``precision="bfloat16"`` the forward runs under ``torch.autocast`` as ``modkit train
--precision bfloat16`` runs it (float32 weights): the saved bfloat16 copies of the weights autocast makes and the
float32 residual stream are counted, as they are held. With ``checkpointing`` each block is
``torch.utils.checkpoint`` (non-reentrant): it saves nothing, and keeps its tensor arguments (its input hidden
states and the shared inputs: positions, masks) for the recomputation; ``kept`` counts those storages.

**The step's activation peak** (:func:`peak_bytes`): without checkpointing, everything saved at the end of the
forward (the backward frees it as it goes). With checkpointing, the backward first frees the head's part, then
recomputes each block from its kept input: the peak is the larger of the end of the forward (first + kept + last)
and, for each block ``i``, first + the kept inputs of blocks ``<= i`` + block ``i``'s saved bytes. Transient
gradients of the backward, allocator fragmentation and the CUDA context are not counted.

**Fake tensors.** The model is built on ``meta`` and its parameters and buffers replaced by ``FakeTensor`` s on
the CPU (``torch._subclasses.fake_tensor.FakeTensorMode``), so autocast and the kernels' choices are the CPU's and
the saved tensors have their real shapes and dtypes; the bytes equal a real CPU run's (the tests check it on dense,
MoE, MLA and hybrid specs). :class:`StepEstimator` runs them at the lengths asked for, through two layers of each
distinct configuration, linear in the rows.

What a layer keeps for the backward: Korthikanti et al. 2022, Reducing Activation Recomputation in Large
Transformer Models (arXiv:2205.05198); the recomputation is Chen et al. 2016, Training Deep Nets with Sublinear
Memory Cost (arXiv:1604.06174), as ``torch.utils.checkpoint`` implements it.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Callable, Optional, Union

import torch
from torch import Tensor, nn

Part = Union[str, int]


@dataclass
class StepParts:
    """Bytes of one training forward by part (``"first"``, block index, ``"last"``): ``saved`` for the backward;
    ``kept``: each block's tensor arguments, what a checkpointed block keeps (each storage once over the blocks)."""

    saved: dict[Part, int]
    kept: dict[Part, int]


def _storages(obj: Any, depth: int = 0) -> list[Tensor]:
    """The tensors in a block's arguments: tensors, and those in lists, tuples, dicts and objects' attributes."""
    if isinstance(obj, Tensor):
        return [obj]
    if depth > 2:
        return []
    if isinstance(obj, (list, tuple)):
        items = obj
    elif isinstance(obj, dict):
        items = obj.values()
    elif hasattr(obj, "__dict__") and not isinstance(obj, nn.Module):
        items = vars(obj).values()
    else:
        return []
    return [t for item in items for t in _storages(item, depth + 1)]


@contextlib.contextmanager
def _recording(model: nn.Module, checkpointing: bool):
    """Hooks that attribute saved storages and the blocks' argument storages to parts; yields the
    :class:`StepParts`."""
    from torch.utils.checkpoint import checkpoint

    params = {p.untyped_storage()._cdata for p in model.parameters()}
    out, seen, keep = StepParts({}, {}), {"saved": set(), "kept": set()}, []
    current: list[Part] = ["first"]

    def note(t: Tensor, part: Part, field: str) -> None:
        s, into = t.untyped_storage(), getattr(out, field)
        if s._cdata not in params and s._cdata not in seen[field]:
            seen[field].add(s._cdata)
            into[part] = into.get(part, 0) + s.nbytes()
        keep.append(t)  # held: a freed storage's address could be reused and counted once for two

    def pack(t: Tensor) -> Tensor:
        note(t, current[0], "saved")
        return t

    originals = {}
    for i, block in enumerate(model.layers):
        originals[i] = block.forward

        def run(*args, _i=i, _fwd=block.forward, **kwargs):
            current[0] = _i
            try:
                for t in _storages((args, kwargs)):
                    note(t, _i, "kept")
                if not checkpointing:
                    return _fwd(*args, **kwargs)
                return checkpoint(_fwd, *args, use_reentrant=False, **kwargs)
            finally:
                current[0] = "last"

        block.forward = run
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            yield out
    finally:
        for i, block in enumerate(model.layers):
            block.forward = originals[i]


def measure_step(
    model: nn.Module, input_ids: Tensor, *, precision: str = "float32", checkpointing: bool = False
) -> StepParts:
    """The saved (and kept) bytes of one training forward of ``model`` on ``input_ids [batch, seq]`` and its loss.

    Args:
        model: a :class:`~modkit.nn.model.Model` (real or fake tensors, see the module docstring), in training mode.
        precision: ``"float32"`` or ``"bfloat16"`` / ``"float16"`` (autocast on the model's device type).
        checkpointing: each block under ``torch.utils.checkpoint``.

    Raises:
        ValueError: another precision.
    """
    if precision not in ("float32", "bfloat16", "float16"):
        raise ValueError(f"precision must be float32, bfloat16 or float16, got {precision!r}")
    device = next(model.parameters()).device.type
    cast = (
        contextlib.nullcontext() if precision == "float32" else torch.autocast(device, dtype=getattr(torch, precision))
    )
    with _recording(model, checkpointing) as parts, cast:
        out = model(input_ids)
        logits = out.logits
        loss = nn.functional.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), input_ids.reshape(-1))
        if out.aux_loss is not None:
            loss = loss + out.aux_loss.float()
    return parts


def peak_bytes(parts: StepParts, layers: range, *, first: bool, last: bool, checkpointing: bool) -> int:
    """The activation peak of one microbatch on the stage holding ``layers`` (with the embedding when ``first``, the
    head and loss when ``last``): see the module docstring."""
    emb = parts.saved.get("first", 0) if first else 0
    head = parts.saved.get("last", 0) if last else 0
    if not checkpointing:
        return emb + head + sum(parts.saved.get(i, 0) for i in layers)
    kept = [parts.kept.get(i, 0) for i in layers]
    end = emb + sum(kept) + head
    recompute = [emb + sum(kept[: k + 1]) + parts.saved.get(i, 0) for k, i in enumerate(layers)]
    return max([end, *recompute])


def held_bytes(parts: StepParts, layers: range, *, first: bool, last: bool, checkpointing: bool) -> int:
    """What one microbatch's forward leaves held on the stage until its backward (the end of its forward)."""
    emb = parts.saved.get("first", 0) if first else 0
    head = parts.saved.get("last", 0) if last else 0
    inner = parts.kept if checkpointing else parts.saved
    return emb + head + sum(inner.get(i, 0) for i in layers)


@contextlib.contextmanager
def fake_model(spec, registry=None, dtype: Optional[torch.dtype] = None):
    """``spec`` built on ``meta`` with ``FakeTensor`` parameters and buffers on the CPU; yields ``(model, mode)``
    (run the model inside ``with mode:``). Nothing is allocated."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from modkit.nn.build import build

    model = build(spec, device="meta", dtype=dtype, registry=registry).train()
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    with mode:
        for mod in model.modules():
            for name, p in list(mod._parameters.items()):
                if p is not None:
                    fake = torch.empty(p.shape, dtype=p.dtype, device="cpu")
                    mod._parameters[name] = nn.Parameter(fake, requires_grad=p.requires_grad)
            for name, b in list(mod._buffers.items()):
                if b is not None:
                    mod._buffers[name] = torch.zeros(b.shape, dtype=b.dtype, device="cpu")
    yield model, mode


class StepEstimator:
    """A spec's activation parts at any rows and length, from forwards on fake tensors through the first two layers
    of each distinct layer configuration (:func:`_representatives`; nothing is allocated).

    At each sequence length asked for, two forwards (one row and two) give every part's bytes as
    ``step(T) + rows·row(T)`` exactly at that length (a chunked mixer's padding included); the part of ``step``
    that does not depend on the length (the weights' autocast copies) comes from three more lengths
    (:func:`_lengths`: a quadratic through them) so that :meth:`at` can scale it to a rank's share of the weights.
    Instances are cached per spec and precision (:func:`estimator`).

    Raises:
        SpecError: an invalid spec.
    """

    def __init__(self, spec, precision: str = "bfloat16", registry=None):
        self.precision = precision
        self._cm = fake_model(spec, registry)
        model, self.mode = self._cm.__enter__()
        keep, self.source = _representatives(model.spec)
        model.layers = nn.ModuleList([model.layers[i] for i in keep])
        model.layer_position = [model.layer_position[i] for i in keep]
        self.model = model
        self._at: dict[int, tuple[StepParts, StepParts]] = {}
        ts = _lengths(model, model.spec.max_seq_len)
        fits = {}
        for which in (0, 1):  # step, row
            for f in ("saved", "kept"):
                parts = set().union(*(getattr(self.measure(t)[which], f) for t in ts))
                fits[which, f] = {
                    p: _quadratic(ts, [getattr(self.measure(t)[which], f).get(p, 0) for t in ts]) for p in parts
                }
        #: per field and part: the length-independent bytes of a step (the weights' copies)
        self.weights = {f: {p: q[0] for p, q in fits[0, f].items()} for f in ("saved", "kept")}
        #: per field and part: ``(per step, per row)`` coefficients of ``T²`` (``[T, T]`` attention matrices)
        self.square = {
            f: {
                p: (fits[0, f].get(p, (0, 0, 0))[2], fits[1, f].get(p, (0, 0, 0))[2])
                for p in set(fits[0, f]) | set(fits[1, f])
            }
            for f in ("saved", "kept")
        }

    def measure(self, seq: int) -> tuple[StepParts, StepParts]:
        """``(step, row)`` parts at ``seq`` tokens: bytes at ``rows`` rows ``= step + rows·row``."""
        if seq not in self._at:
            with self.mode:
                one, two = (
                    measure_step(self.model, torch.zeros(r, seq, dtype=torch.long), precision=self.precision)
                    for r in (1, 2)
                )
            fields = ("saved", "kept")
            one = StepParts(*(_spread(getattr(one, f), self.source) for f in fields))
            two = StepParts(*(_spread(getattr(two, f), self.source) for f in fields))
            step = StepParts(
                *({p: 2 * v - getattr(two, f).get(p, 0) for p, v in getattr(one, f).items()} for f in fields)
            )
            row = StepParts(*({p: v - getattr(one, f).get(p, 0) for p, v in getattr(two, f).items()} for f in fields))
            self._at[seq] = (step, row)
        return self._at[seq]

    def at(
        self,
        rows: float,
        seq: int,
        scale_w: Optional[Callable[[Part], float]] = None,
        *,
        attention_matrix: bool = True,
    ) -> StepParts:
        """The :class:`StepParts` of ``rows`` sequences (a fraction allowed) of ``seq`` tokens; ``scale_w(part)``
        scales each part's length-independent bytes (the weights' copies: the share a rank computes with);
        ``attention_matrix=False`` leaves out the bytes quadratic in ``seq`` (the ``[T, T]`` matrices a math
        attention kernel keeps, as the CPU's does for heads whose value width differs from their key width, and
        that fused kernels such as FlashAttention never hold)."""
        step, row = self.measure(int(seq))

        def value(field: str, part) -> int:
            w = self.weights[field].get(part, 0)
            w_scaled = w * (scale_w(part) if scale_w else 1)
            total = getattr(step, field).get(part, 0) - w + w_scaled + rows * getattr(row, field).get(part, 0)
            if not attention_matrix:
                per_step, per_row = self.square[field].get(part, (0, 0))
                total -= (per_step + rows * per_row) * seq * seq
            return int(round(total))

        parts = {f: set(getattr(step, f)) | set(getattr(row, f)) for f in ("saved", "kept")}
        return StepParts(*({p: value(f, p) for p in parts[f]} for f in ("saved", "kept")))


_ESTIMATORS: dict[tuple, StepEstimator] = {}


def estimator(spec, precision: str = "bfloat16", registry=None) -> StepEstimator:
    """The cached :class:`StepEstimator` of ``spec`` (a :class:`~modkit.spec.ModelSpec` or anything
    :func:`modkit.load_spec` reads) under ``precision``.

    Raises:
        SpecError: an invalid spec.
    """
    from modkit.core.registry import get_registry
    from modkit.spec import load_spec

    registry = registry or get_registry()
    spec = spec if hasattr(spec, "model_dump_json") else load_spec(spec, registry=registry)
    key = (spec.model_dump_json(), precision, id(registry))
    if key not in _ESTIMATORS:
        _ESTIMATORS[key] = StepEstimator(spec, precision, registry)
    return _ESTIMATORS[key]


def _quadratic(ts: list[int], s: list[int]) -> tuple[float, float, float]:
    """``(c0, c1, c2)`` of the quadratic through ``(ts[k], s[k])``, ``ts`` equally spaced (exact, in fractions)."""
    step = ts[1] - ts[0]
    c = Fraction(s[2] - 2 * s[1] + s[0], 2 * step * step)
    b = Fraction(s[1] - s[0], step) - c * (ts[0] + ts[1])
    return float(s[0] - b * ts[0] - c * ts[0] * ts[0]), float(b), float(c)


def _lengths(model: nn.Module, max_seq_len: int) -> list[int]:
    """Three equally spaced lengths where the saved bytes are a quadratic in ``T``: 64, 128, 192 (or a third of
    the context each when shorter); 2, 3 and 4 chunks of a mixer computing in chunks (a module attribute
    ``chunk_size``: below two chunks its saved bytes are not yet smooth in ``T``) when they fit."""
    chunks = {m.chunk_size for m in model.modules() if isinstance(getattr(m, "chunk_size", None), int)}
    chunks.discard(0)
    if chunks and 4 * math.lcm(*chunks) <= max_seq_len:
        step = math.lcm(*chunks)
        return [2 * step, 3 * step, 4 * step]
    step = max(1, min(64, max_seq_len // 3))
    return [step, 2 * step, 3 * step]


def _representatives(spec) -> tuple[list[int], list[int]]:
    """The layers a fake forward runs (the first two of each distinct layer configuration, in layer order) and,
    for each layer, the position among them of the run standing for it: a layer's own when it is one of them,
    else the second of its configuration (whose bytes leave out what the first layer of the kind already saved,
    such as tables shared by the layers)."""
    import json

    seen: dict[str, list[int]] = {}
    for i in range(spec.n_layers):
        layer = spec.layer(i)
        parts = [layer.attention, layer.ffn, layer.norm, layer.placement, layer.position]
        key = json.dumps([None if c is None else c.model_dump(mode="json") for c in parts], sort_keys=True)
        seen.setdefault(key, []).append(i)
    keep = sorted(i for group in seen.values() for i in group[:2])
    where = {i: k for k, i in enumerate(keep)}
    source = [0] * spec.n_layers
    for group in seen.values():
        for i in group:
            source[i] = where[i] if i in where else where[group[1]]
    return keep, source


def _spread(parts: dict[Part, int], source: list[int]) -> dict[Part, int]:
    """Bytes by part of the reduced model's forward, given to every layer of the whole model."""
    out: dict[Part, int] = {k: v for k, v in parts.items() if not isinstance(k, int)}
    for i, k in enumerate(source):
        if k in parts:
            out[i] = parts[k]
    return out

"""A token's journey through a model: the shape after every stage and per-layer statistics (``modkit trace``).

::

    from modkit.analysis.trace import trace
    t = trace(model, [5, 17, 9], tokenizer=tok)      # model: a modkit Model (meta: shapes only)
    t.groups[0].stages                               # block stages in execution order, with shapes
    t.layers[0].attention_entropy                    # [n_heads] nats (None on meta)

Everything is read through :func:`modkit.inspect` (forward hooks on the registry-tagged modules), so a
third-party component is traced like a built-in; what a component does not expose is listed in
:attr:`Trace.unavailable`.

Stages, in execution order: token ids, token embedding, the position scheme where it acts on the embeddings,
the embedding norm, then for each distinct block structure: block input, each norm, every linear of the
attention (``q_proj``... with the per-head view ``[batch, heads, seq, head_dim]``), queries and keys per head after
QK-norm and position, the position bias, the attention scores ``[batch, heads, seq, seq]``, the attention output,
the FFN's linears (the expansion to ``d_ff``), its hidden activation, its output, the block output and the residual
update (output - input); then the final norm and the logits. Layers with the same stage names and shapes are
shown once (``layers 0-11``); a model whose layers differ (mixture of experts every other layer) gets one group per
structure.

Per layer (real weights only; a meta model gives shapes alone), with ``h_i`` the block output of layer ``i``
(``h_{-1}`` the block input of layer 0), each token ``t`` of the sequence:

* ``residual_norm``: mean over tokens of ``||h_i[t]||_2``.
* ``update_ratio``: mean over tokens of ``||h_i[t] - h_{i-1}[t]|| / ||h_{i-1}[t]||`` (relative update size).
* ``cosine_prev``: mean over tokens of ``cos(h_i[t], h_{i-1}[t])``.
* ``ffn_sparsity``: fraction of exactly-zero entries of the FFN hidden activation (the input of its down
  projection); ReLU MLPs are sparse, smooth activations (GELU, SiLU) almost never give exact zeros. Li et al.
  2023, The Lazy Neuron Phenomenon (arXiv:2210.06313) count the same nonzeros.
* ``ffn_near_zero``: fraction of entries of that activation with ``|a| < 0.1 RMS(a)`` (RMS over the layer's whole
  activation of the traced text): a scale-free reading of "sparse" that smooth activations can show.
* ``expert_load``, ``load_imbalance``: for a layer whose router reports expert loads (:mod:`modkit.nn.balance`), the
  number of the traced tokens' assignments each expert received and ``max / mean`` of those counts (1: balanced;
  ``n_experts / top_k`` at most).
* ``attention_entropy``: per head, mean over query positions of ``-Σ_k p log p`` (nats; ``0 log 0 = 0``) of the
  attention probabilities; ``log(t + 1)`` is the most a causal query ``t`` can reach.
* ``top_tokens``: the logit lens (nostalgebraist 2020, "interpreting GPT: the logit lens"): ``h_i`` at the last
  position read through the model's own final norm and head, softmax, top ``k``. The last layer's reading is the
  model's prediction.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

import torch
from torch import Tensor, nn

from modkit.nn import balance
from modkit.core.errors import ModkitError
from modkit.core.config import is_mixer
from modkit.analysis.inspection import Recording, inspect


class TraceError(ModkitError, ValueError):
    """Input a trace cannot run on: ids out of the vocabulary or longer than ``max_seq_len``, an empty sequence.
    The message names the value and the limit."""


@dataclass
class Stage:
    """One step of the journey.

    Attributes:
        name: the :func:`modkit.inspect` name (``layers.0.attention:weights``), ``ids`` or ``logits``.
        label: what it is, in words (``attention scores (softmax) [batch, heads, q, k]``).
        shape: the tensor's shape.
        note: extra reading of the shape (the per-head view of a projection, ``vocab_size → d_model``, ...).
    """

    name: str
    label: str
    shape: tuple[int, ...]
    note: str = ""


@dataclass
class StageGroup:
    """Blocks with the same stages and shapes. ``stages`` names are those of the first layer in ``layers``."""

    layers: list[int]
    stages: list[Stage]

    @property
    def title(self) -> str:
        """``layer 0``, ``layers 0-11`` or ``layers 1, 3, 5``."""
        ls = self.layers
        if len(ls) == 1:
            return f"layer {ls[0]}"
        if ls == list(range(ls[0], ls[-1] + 1)):
            return f"layers {ls[0]}-{ls[-1]}"
        return "layers " + ", ".join(map(str, ls))


@dataclass
class LayerStats:
    """Statistics of one block (see the module docstring for the definitions).

    Attributes:
        index: the layer.
        residual_norm: mean L2 norm of the block output per token.
        update_ratio: mean ``||output - input|| / ||input||`` per token.
        cosine_prev: mean cosine similarity between the block output and its input (the previous layer's output).
        ffn_sparsity: fraction of exact zeros of the FFN hidden activation, ``None`` where it is not exposed.
        ffn_near_zero: fraction of its entries within a tenth of its RMS of zero, ``None`` where it is not exposed.
        attention_entropy: ``[n_heads]`` mean entropy (nats) per head, ``None`` where weights are not exposed.
        top_tokens: logit lens at the last position: ``(token id, text, probability)``, most likely first.
        expert_load: ``[n_experts]`` assignments of the traced tokens per expert of the layer's router, ``None``
            for a layer without one (the first router of the layer when it has several).
        load_imbalance: ``max(expert_load) / mean(expert_load)``, ``None`` without a router.
    """

    index: int
    residual_norm: float
    update_ratio: float
    cosine_prev: float
    ffn_sparsity: Optional[float]
    ffn_near_zero: Optional[float]
    attention_entropy: Optional[list[float]]
    top_tokens: list[tuple[int, str, float]]
    expert_load: Optional[list[int]] = None
    load_imbalance: Optional[float] = None


@dataclass
class PositionMap:
    """What a position scheme does, probed through its interface on positions ``0..n-1``.

    Attributes:
        title: e.g. ``positions.0 (sinusoidal): vector added to the embedding``.
        values: 2-D (``[n, d_model]``, ``[n, head_dim]`` or ``[n, n]``) float32 on the CPU.
        xlabel, ylabel: axis names.
    """

    title: str
    values: Tensor
    xlabel: str
    ylabel: str


@dataclass
class Trace:
    """Everything ``modkit trace`` shows; see :func:`trace`.

    Attributes:
        name: the spec's name.
        weights: ``"trained: PATH"``, ``"untrained (random init, seed 0)"`` or ``"none (meta device): shapes only"``.
        ids: the token ids traced (one sequence).
        tokens: the text of each token (its id when there is no tokenizer).
        before: stages before the blocks (ids, embedding, position, embedding norm).
        groups: block stages, one group per distinct block structure.
        after: stages after the blocks (final norm, logits).
        layers: per-layer statistics (empty on meta).
        attention: ``{layer: [n_heads, seq, seq]}`` float32 CPU probabilities (empty on meta or without weights).
        positions: probes of the position schemes (empty on meta).
        unavailable: ``{name: reason}`` for what the components do not expose.
        dims: model sizes shown with the shapes (d_model, n_layers, vocab_size, ...).
        tokenizer: which tokenizer made the ids and where it came from (shown in the header); empty when the ids
            were given as numbers without one.
    """

    name: str
    weights: str
    ids: list[int]
    tokens: list[str]
    before: list[Stage]
    groups: list[StageGroup]
    after: list[Stage]
    layers: list[LayerStats] = field(default_factory=list)
    attention: dict[int, Tensor] = field(default_factory=dict)
    positions: list[PositionMap] = field(default_factory=list)
    unavailable: dict[str, str] = field(default_factory=dict)
    dims: dict[str, Any] = field(default_factory=dict)
    tokenizer: str = ""

    @property
    def has_stats(self) -> bool:
        """Whether the model had weights (statistics, attention maps and the logit lens are filled)."""
        return bool(self.layers)

    def stages(self) -> list[Stage]:
        """Every stage of the first layer of each group, in order, with ``before`` and ``after``."""
        return [*self.before, *(s for g in self.groups for s in g.stages), *self.after]


def _token_text(tokenizer: Any, i: int) -> str:
    if tokenizer is None:
        return str(i)
    try:
        return tokenizer.decode([i])
    except Exception:  # noqa: BLE001 - an id the tokenizer does not know (model vocab larger than the tokenizer's)
        return f"<{i}>"


def _dims(model: nn.Module) -> dict[str, Any]:
    spec = model.spec
    return {
        "d_model": spec.d_model,
        "n_layers": spec.n_layers,
        "vocab_size": spec.vocab_size,
        "max_seq_len": spec.max_seq_len,
    }


def _heads_view(owner: nn.Module, projection: str, shape: tuple[int, ...]) -> str:
    """``[b, s, h·hd]`` read as ``[b, h, s, hd]`` for a projection the attention declares per head.

    The declaration is the attention module's ``head_layout() -> {projection: (heads, width per head)}`` (the
    built-in attention: q/k/v; MLA: its per-head up-projections, not its latent ones). An attention without one is
    read from its ``n_heads`` / ``n_kv_heads`` / ``head_dim`` only where the width is exactly ``n_heads · head_dim``
    or ``n_kv_heads · head_dim``: never by dividing an arbitrary width by ``head_dim``.
    """
    if len(shape) != 3:
        return ""
    b, s, w = shape
    declare = getattr(owner, "head_layout", None)
    if callable(declare):
        heads = declare().get(projection)
        if heads is None or heads[0] * heads[1] != w:
            return ""
        return f"per head: [{b}, {heads[0]}, {s}, {heads[1]}]"
    hd = getattr(owner, "head_dim", None)
    counts = [getattr(owner, a, None) for a in ("n_heads", "n_kv_heads")]
    for h in counts:
        if isinstance(h, int) and isinstance(hd, int) and h * hd == w:
            return f"per head: [{b}, {h}, {s}, {hd}]"
    return ""


def _capability(kind: str, type_: Optional[str], key: str) -> Any:
    from modkit.core.registry import get_registry

    try:
        return get_registry().get(kind, type_).capabilities.get(key)
    except Exception:  # noqa: BLE001 - not registered here: no declared capability
        return None


def _into_heads(rec: Recording, name: str, attention: str) -> bool:
    """Whether an attention's linear runs before its queries/keys are recorded (a projection into heads), as
    opposed to the output projection after them; without ``:q`` records every linear but the last one counts."""
    order = rec.entry(name).order
    if f"{attention}:q" in rec:
        return order < rec.entry(f"{attention}:q").order
    mine = [e.order for n in rec.names() if n.startswith(attention + ".") for e in [rec.entry(n)] if e.kind == "linear"]
    return order < max(mine)


def mixer_spec_path(spec: Any, layer: int) -> str:
    """Where the spec sets layer ``layer``'s token mixer: ``overrides[j].mixer`` for the last override that gives one,
    else ``block.mixer`` (``attention`` instead of ``mixer`` when the document used that key).

    Raises:
        IndexError: ``layer`` outside ``[0, n_layers)``.
    """
    from modkit.spec.models import LayerRange

    if not 0 <= layer < spec.n_layers:
        raise IndexError(f"layer {layer} out of range for n_layers = {spec.n_layers}")
    where = f"block.{spec.block.mixer_key}"
    for j, o in enumerate(spec.overrides):
        chosen = o.layers.selects(layer, spec.n_layers) if isinstance(o.layers, LayerRange) else layer in o.layers
        if chosen and o.attention is not None:
            where = f"overrides[{j}].{o.mixer_key}"
    return where


def _slot_mixer(model: nn.Module, path: str) -> Optional[str]:
    """The spec path of the token mixer at module ``path`` when it is what a layer's mixing slot built (a direct
    child of a block whose registry kind is a token mixer's, :func:`modkit.core.config.is_mixer`), else ``None``."""
    parts = path.split(".")
    if len(parts) != 3 or parts[0] != "layers" or not parts[1].isdigit() or getattr(model, "spec", None) is None:
        return None
    module = model.get_submodule(path)
    return mixer_spec_path(model.spec, int(parts[1])) if is_mixer(getattr(module, "modkit_kind", None)) else None


def _describe(model: nn.Module, rec: Recording, name: str) -> Stage:
    """The :class:`Stage` of one recorded name (label and note from its module's kind and type; a layer's token
    mixer is labelled ``mixer`` with the spec path that sets it, whatever its kind)."""
    entry = rec.entry(name)
    shape = tuple(entry.tensor.shape)
    path, _, what = name.partition(":")
    module = model.get_submodule(path) if path else model
    slot = _slot_mixer(model, path) if what == "output" else None
    if slot is not None:
        return Stage(name, f"mixer output ({entry.type})", shape, f"spec: {slot}")
    kind, type_ = entry.kind, entry.type
    short = path.rsplit(".", 1)[-1]
    label, note = f"{short} {what}", ""
    if kind == "embedding":
        label, note = "token embedding", f"rows of the {list(module.weight.shape)} table"
    elif kind == "position" and what == "embed":
        label, note = f"+ position ({type_})", "[batch, seq, d_model]"
    elif kind == "position" and what in ("q", "k"):
        heads = "n_heads" if what == "q" else "n_kv_heads"
        acts = _capability("position", type_, "acts_on")
        normed = any(n.startswith(path + ".") and rec.entry(n).kind == "norm" for n in rec.names())
        steps = (["QK-norm"] if normed else []) + ([type_] if acts == "qk" else [])
        how = f"after {' and '.join(steps)}" if steps else "as it enters the scores"
        # the width is what the attention declares its position scheme acts on (PositionGeometry.head_dim):
        # head_dim for the built-in attention, qk_rope_head_dim for MLA's rotated part
        label, note = (
            f"{what} per head {how}",
            f"[batch, {heads}, seq, the width the mixer declares for its position scheme]",
        )
    elif kind == "position" and what == "position_bias":
        label, note = f"position bias ({type_}) added to the scores", "[batch, heads, q, k]"
    elif kind == "placement" and what in ("input", "output", "update"):
        label = {
            "input": "block input (residual stream)",
            "output": "block output (residual stream)",
            "update": "residual update = output - input",
        }[what]
    elif kind == "norm":
        label = f"{short} ({type_})"
    elif kind == "linear":
        owner = model.get_submodule(path.rsplit(".", 1)[0])
        label = f"{short}: linear {module.in_features} -> {module.out_features}"
        declared = callable(
            getattr(owner, "head_layout", None)
        )  # the attention says which projections split into heads
        if is_mixer(getattr(owner, "modkit_kind", None)) and (
            declared or _into_heads(rec, name, path.rsplit(".", 1)[0])
        ):
            note = _heads_view(owner, short, shape)
        elif getattr(owner, "modkit_kind", None) == "ffn" and module.out_features != getattr(
            model.spec, "d_model", None
        ):
            note = f"expansion to {module.out_features}"
    elif kind == "attention" and what == "weights":
        label, note = "attention scores (softmax)", "[batch, heads, q, k]"
    elif kind == "attention":
        label = f"attention output ({type_})" if what == "output" else f"attention {what}"
    elif kind == "ffn" and what == "hidden":
        label, note = "FFN hidden activation", f"input of the down projection; d_ff = {shape[-1]}"
    elif kind == "ffn":
        label = (
            f"FFN output ({type_})" if what == "output" else ("FFN aux loss" if what == "output.1" else f"FFN {what}")
        )
    elif kind == "lm_head":
        label, note = f"LM head: linear {module.in_features} -> {module.out_features}", "[batch, seq, vocab_size]"
    elif kind == "placement" and what == "output.1":
        label = "block aux loss"
    elif kind is not None:
        label = f"{short} ({type_ or kind}) {what}"
    return Stage(name, label, shape, note)


def _group_layers(model: nn.Module, rec: Recording, n_layers: int) -> list[StageGroup]:
    """One group per distinct sequence of (relative name, shape) among the blocks."""
    per_layer: dict[int, list[str]] = {i: [] for i in range(n_layers)}
    for name in rec.names():
        layer = rec.entry(name).layer
        if layer is not None and layer in per_layer:
            per_layer[layer].append(name)
    groups: dict[tuple, StageGroup] = {}
    for i in range(n_layers):
        prefix = f"layers.{i}"
        key = tuple((n[len(prefix) :], tuple(rec[n].shape)) for n in per_layer[i])
        if key in groups:
            groups[key].layers.append(i)
        else:
            groups[key] = StageGroup([i], [_describe(model, rec, n) for n in per_layer[i]])
    return list(groups.values())


def check_ids(model: nn.Module, ids: Sequence[int]) -> list[int]:
    """Validate a token sequence for ``model``.

    Returns:
        the ids as a list of ints.

    Raises:
        TraceError: empty, longer than ``max_seq_len``, or an id outside ``[0, vocab_size)`` (named).
    """
    ids = [int(i) for i in ids]
    spec = model.spec
    if not ids:
        raise TraceError("no tokens to trace: give at least one token id (or a non-empty --text)")
    if len(ids) > spec.max_seq_len:
        raise TraceError(f"{len(ids)} tokens exceed the model's max_seq_len = {spec.max_seq_len}; trace a shorter text")
    bad = [i for i in ids if not 0 <= i < spec.vocab_size]
    if bad:
        raise TraceError(
            f"token id {bad[0]} is outside the model's vocabulary [0, {spec.vocab_size}) (vocab_size = {spec.vocab_size}); "
            "use the tokenizer the model was trained with"
        )
    return ids


def read_out(model: nn.Module, h: Tensor) -> Tensor:
    """Logits of hidden states ``h [..., d_model]`` through the model's final norm and head (the logit lens).

    Applies ``final_norm`` (when the spec has one), then :meth:`Model.head_logits` (the head, tied or not, with its bias,
    the logit scale and the final logit soft-cap), exactly as :meth:`Model.forward` does, so the reading of the last
    block's output equals the model's logits. Returns ``[..., vocab_size]``. With a spec ``stream``, ``h`` is
    ``[batch, seq, n_streams, d_model]``, read through the stream's ``exit`` first, as the forward does.
    """
    if getattr(model, "stream", None) is not None:
        h = model.stream.exit(h)
    if model.final_norm is not None:
        h = model.final_norm(h)
    return model.head_logits(h)


def attention_entropy(weights: Tensor) -> Tensor:
    """Mean entropy per head of attention probabilities ``[heads, q, k]`` -> ``[heads]`` (nats, ``0 log 0 = 0``)."""
    p = weights.float()
    return -torch.special.xlogy(p, p).sum(-1).mean(-1)


def _layer_stats(model: nn.Module, rec: Recording, i: int, tokenizer: Any, top_k: int) -> LayerStats:
    inp = rec[f"layers.{i}:input"][0].float()  # [seq, d_model] of the one traced sequence
    out = rec[f"layers.{i}:output"][0].float()
    upd = rec[f"layers.{i}:update"][0].float()
    if getattr(model, "stream", None) is not None:  # [seq, n_streams, d_model]: the streams as one vector per token
        inp, out, upd = inp.flatten(-2), out.flatten(-2), upd.flatten(-2)
    in_norm = inp.norm(dim=-1)
    ratio = (upd.norm(dim=-1) / in_norm.clamp_min(torch.finfo(torch.float32).tiny)).mean()
    cos = nn.functional.cosine_similarity(out, inp, dim=-1).mean()
    hidden = next((t for n, t in rec.layer(i).items() if n.endswith(":hidden")), None)
    sparsity = near_zero = None
    if hidden is not None:
        a = hidden.float()
        sparsity = int((a == 0).sum()) / a.numel()
        near_zero = int((a.abs() < 0.1 * a.square().mean().sqrt()).sum()) / a.numel()
    weights = next((t for n, t in rec.layer(i).items() if n.endswith(":weights")), None)
    entropy = attention_entropy(weights[0]).tolist() if weights is not None else None
    last = rec[f"layers.{i}:output"][:, -1:]  # [1, 1, d_model] in the model dtype
    probs = torch.softmax(read_out(model, last)[0, -1].float(), dim=-1)
    top = torch.topk(probs, min(top_k, probs.numel()))
    lens = [(int(t), _token_text(tokenizer, int(t)), float(p)) for p, t in zip(top.values, top.indices)]
    return LayerStats(i, float(out.norm(dim=-1).mean()), float(ratio), float(cos), sparsity, near_zero, entropy, lens)


def _served_geometry(model: nn.Module, index: int):
    """The :class:`~modkit.PositionGeometry` the attention of the first layer using position module ``index``
    declares (the geometry the module was built with; layer 0's for the model-level scheme)."""
    from modkit.core.registry import get_registry
    from modkit.spec import SpecContext, position_geometry

    spec = model.spec
    layers = [i for i, p in enumerate(getattr(model, "layer_position", [])) if p == index] or [0]
    ctx = SpecContext(spec.d_model, spec.n_layers, spec.vocab_size, spec.max_seq_len, get_registry())
    attn = next((m for m in model.layers[layers[0]].modules() if is_mixer(getattr(m, "modkit_kind", None))), None)
    try:
        return position_geometry(spec.layer(layers[0]).attention, ctx, attn)
    except Exception:  # noqa: BLE001 - an attention whose declaration fails gets no rotation map
        return None


def position_maps(model: nn.Module, n: int = 64) -> list[PositionMap]:
    """Probe each position scheme of ``model`` on positions ``0..n-1`` (``n`` capped at ``max_seq_len``).

    Through the :class:`~modkit.core.interfaces.PositionScheme` interface only: ``embed(0, pos)`` is the vector a scheme
    adds to the embeddings ``[n, d_model]``; ``rotate`` of all-ones queries shows a rotary scheme's ``cos θ ± sin θ``
    pattern ``[n, head_dim]`` (the width the layers' attention declares for it: :class:`~modkit.PositionGeometry`);
    ``attention_bias(pos, pos, n_heads)`` of head 0 is a bias scheme's ``[n, n]``. A scheme
    that leaves all three as identities (``none``) gives no map.
    """
    spec = model.spec
    n = min(n, spec.max_seq_len)
    weight = model.embed.weight
    device, dtype = weight.device, weight.dtype
    pos = torch.arange(n, device=device)[None]
    maps = []
    with torch.no_grad():
        for j, scheme in enumerate(model.positions):
            geo = _served_geometry(model, j)
            head_dim, n_heads = (geo.head_dim, geo.n_heads) if geo is not None else (None, None)
            name = f"positions.{j} ({getattr(scheme, 'modkit_type', type(scheme).__name__)})"
            x = torch.zeros(1, n, spec.d_model, device=device, dtype=dtype)
            added = scheme.embed(x, pos)
            if added is not x and bool(added.ne(0).any()):
                maps.append(
                    PositionMap(
                        f"{name}: vector added to the embedding",
                        added[0].float().cpu(),
                        "feature (d_model)",
                        "position",
                    )
                )
            if head_dim:
                ones = torch.ones(1, 1, n, head_dim, device=device, dtype=dtype)
                q, _ = scheme.rotate(ones, ones.clone(), pos)
                if q is not ones and not torch.equal(q, ones):
                    maps.append(
                        PositionMap(
                            f"{name}: all-ones query after rotation",
                            q[0, 0].float().cpu(),
                            "feature (head_dim)",
                            "position",
                        )
                    )
            if n_heads:
                bias = scheme.attention_bias(pos, pos, n_heads)
                if bias is not None:
                    maps.append(
                        PositionMap(
                            f"{name}: attention bias of head 0",
                            bias[0, 0].float().cpu(),
                            "key position",
                            "query position",
                        )
                    )
    return maps


@torch.no_grad()
def trace(
    model: nn.Module, ids: Sequence[int], *, tokenizer: Any = None, top_k: int = 5, weights: Optional[str] = None
) -> Trace:
    """Run one sequence through ``model`` under :func:`modkit.inspect` and collect shapes and statistics.

    Args:
        model: a :class:`~modkit.nn.model.Model`, on ``meta`` (shapes only: no statistics, maps or lens) or with
            weights on any device. Run in eval mode (dropout off) and restored to its mode afterwards.
        ids: the token ids of one sequence (``[seq]``; traced as ``[1, seq]``).
        tokenizer: anything with ``decode(list[int]) -> str`` to show tokens as text; default ids.
        top_k: tokens per layer in the logit lens.
        weights: how to describe the weights in the report; default ``"none (meta device): shapes only"`` on meta,
            else ``"untrained or unknown"``.

    Returns:
        a :class:`Trace`.

    Raises:
        TraceError: bad ids (:func:`check_ids`) or ``top_k < 1``.
    """
    if top_k < 1:
        raise TraceError(f"top_k must be >= 1, got {top_k}")
    ids = check_ids(model, ids)
    device = model.embed.weight.device
    meta = device.type == "meta"
    if weights is None:
        weights = "none (meta device): shapes only" if meta else "untrained or unknown"
    tokens = [_token_text(tokenizer, i) for i in ids]
    x = torch.tensor([ids], device=device)
    was_training = model.training
    model.eval()
    try:
        if not meta:
            balance.reset_loads(model)  # the routers' loads then count exactly this forward's assignments
        with inspect(model) as rec:
            out = model(x)
        n_layers = len(model.layers)
        before = [Stage("ids", "token ids", tuple(x.shape), "[batch, seq]")]
        after = []
        for name in rec.names():
            if rec.entry(name).layer is not None:
                continue
            stage = _describe(model, rec, name)
            # everything recorded outside the blocks before block 0 ran comes first
            (before if rec.entry(name).order < rec.entry("layers.0:input").order else after).append(stage)
        after.append(Stage("logits", "logits", tuple(out.logits.shape), "[batch, seq, vocab_size]"))
        result = Trace(
            name=model.spec.name or "(unnamed)",
            weights=weights,
            ids=ids,
            tokens=tokens,
            before=before,
            groups=_group_layers(model, rec, n_layers),
            after=after,
            unavailable=dict(rec.unavailable),
            dims=_dims(model),
        )
        if not meta:
            result.layers = [_layer_stats(model, rec, i, tokenizer, top_k) for i in range(n_layers)]
            for path, load in balance.read_loads(model).items():
                i = balance.layer_of(path)
                if i is not None and i < n_layers and result.layers[i].expert_load is None:
                    result.layers[i].expert_load = [int(v) for v in load.tolist()]
                    result.layers[i].load_imbalance = balance.imbalance(load)
            for i in range(n_layers):
                w = next((t for n, t in rec.layer(i).items() if n.endswith(":weights")), None)
                if w is not None:
                    result.attention[i] = w[0].float().cpu()
            result.positions = position_maps(model)
    finally:
        model.train(was_training)
    return result


__all__ = [
    "LayerStats",
    "PositionMap",
    "Stage",
    "StageGroup",
    "Trace",
    "TraceError",
    "attention_entropy",
    "check_ids",
    "position_maps",
    "read_out",
    "trace",
]

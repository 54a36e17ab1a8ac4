"""The weight side of a Hugging Face model type: a table of checkpoint names ↔ modkit ``state_dict`` names.

A model type lists its tensors as :class:`W` entries (plus one :class:`Head`): a modkit name pattern, the
Hugging Face name pattern and the :class:`Transform` between the two layouts (:mod:`._transforms`, re-exported
here). Placeholders: ``{i}`` a layer, ``{p}`` ``weight`` or ``bias``, ``{e}`` an expert (on the Hugging Face side:
one tensor per expert, as many as the modkit tensor stacks). The same entry serves both directions:
:meth:`Transform.to_ours` when loading, :meth:`Transform.to_hf` when exporting, exact inverses so that round trips
are bitwise.

RoPE layout (which features form a rotated pair): Hugging Face checkpoints rotate half-split pairs (GLM: interleaved ones; a type says so with
``checkpoint_layout``). A spec asking for the other layout gets the rows of Wq and Wk (biases and QK-norm weights
too) permuted per head, so the logits are unchanged; export permutes back, bitwise.

The reverse config conversion is checked by :class:`HFWeights`: the config an export writes must convert back to
the very spec it came from (RoPE layout aside, which the weights carry), otherwise the export is refused naming
each field that would change.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional, Sequence, Union

import torch
from torch import Tensor

from modkit.plugin import CheckpointError, Link, load_spec, SpecError

from ._reader import ACTIVATIONS, IMPLEMENTATION_KEYS, IRRELEVANT, PROVENANCE

# the layout changes of the weight table's rows, importable from here too
from ._transforms import (
    RENAME,
    Chain,
    Concat,
    Ctx,
    FusedQKV,
    PerHead,
    StackExperts,
    Transform,  # noqa: F401
    Transpose,
    _dim,
)

#: keys of a source config copied into an export (tokenizer ids, generation defaults, task heads...): they do
#: not change the network, so the spec does not hold them, but a checkpoint without them would lose them
CARRY: frozenset[str] = frozenset(IRRELEVANT) - IMPLEMENTATION_KEYS - PROVENANCE

#: modkit activation → the Hugging Face name written on export, unless a model type prefers another
HF_ACTIVATION = {"silu": "silu", "gelu": "gelu", "gelu_tanh": "gelu_pytorch_tanh", "relu": "relu"}


# ------------------------------------------------------------------------------------------------ the table


_SLOTS = {"i": r"\d+", "e": r"\d+", "j": r"\d+", "p": r"weight|bias"}


def _regex(pattern: str) -> re.Pattern:
    out, pos = "", 0
    for m in re.finditer(r"\{(\w)\}", pattern):
        out += re.escape(pattern[pos : m.start()]) + f"(?P<{m.group(1)}>{_SLOTS[m.group(1)]})"
        pos = m.end()
    return re.compile(out + re.escape(pattern[pos:]))


def _names(x: Union[str, Sequence[str]]) -> tuple[str, ...]:
    return (x,) if isinstance(x, str) else tuple(x)


@dataclass(frozen=True)
class W:
    """One row of a weight table: modkit name pattern(s) ↔ Hugging Face name pattern(s), and the layout change.

    ``W("layers.{i}.attention.o_proj.{p}", "model.layers.{i}.self_attn.o_proj.{p}")`` renames;
    ``W(("layers.{i}.ffn.gate.weight", "layers.{i}.ffn.up.weight"), "model.layers.{i}.mlp.gate_up_proj.weight",
    Concat())`` splits a fused tensor. An entry applies where every modkit name it resolves to exists in the model
    (and ``when``, a test of the checkpoint's config, holds); earlier entries claim tensors first.
    """

    ours: Union[str, tuple[str, ...]]
    hf: Union[str, tuple[str, ...]]
    transform: Transform = RENAME
    when: Optional[Callable[[Mapping[str, Any]], bool]] = None

    def __post_init__(self):
        object.__setattr__(self, "ours", _names(self.ours))
        object.__setattr__(self, "hf", _names(self.hf))

    @property
    def grouped(self) -> bool:
        """Resolved layer by layer (several tensors on a side, or one tensor per expert), not by name matching."""
        return len(self.ours) > 1 or len(self.hf) > 1 or any("{e}" in h for h in self.hf)


@dataclass(frozen=True)
class Head:
    """The LM head: a plain link when untied; when tied, an *optional* one, so a checkpoint storing the head too is
    accepted if it equals the embedding and refused if it differs (the model checks)."""

    hf: str = "lm_head.weight"

    @property
    def ours(self) -> tuple[str, ...]:
        return ("lm_head.weight",)


def weight_table(base: Sequence[Any], *entries: Any, drop: Sequence[str] = ()) -> tuple:
    """``base`` with ``entries`` in place of the rows for the same modkit names (others appended) and the rows for
    the modkit names in ``drop`` removed: how a derived model type changes a few rows of its parent's table."""
    new = {e.ours: e for e in entries}
    dropped = {_names(d) for d in drop}
    out = [new.pop(e.ours, e) for e in base if e.ours not in dropped]
    return tuple(out) + tuple(new.values())


def _link(entry: W, hf: tuple[str, ...], ours: tuple[str, ...], ctx: Ctx) -> Link:
    t = entry.transform
    if t is RENAME:
        return Link(hf, ours)
    return Link(hf, ours, lambda ts: t.to_ours(list(ts), ctx), lambda ts, extras: t.to_hf(list(ts), ctx, extras))


def table_links(table: Sequence[Any], spec, shapes: Mapping[str, Any], config: Mapping[str, Any]) -> list[Link]:
    """Every :class:`Link` of a model built from ``spec`` (``shapes``: its ``state_dict`` shapes) under ``table``.

    Grouped entries are resolved first, layer by layer (the tensors of a layer stay together), then every remaining
    model tensor takes the first one-to-one entry whose pattern matches it, then the head.
    """
    active = [e for e in table if not isinstance(e, W) or e.when is None or e.when(config)]
    grouped = [e for e in active if isinstance(e, W) and e.grouped]
    single = [(e, [_regex(o) for o in e.ours]) for e in active if isinstance(e, W) and not e.grouped]
    claimed: set[str] = set()
    out: list[Link] = []
    layers = [None] + list(range(spec.n_layers))
    for i in layers:
        for e in grouped:
            has_i = any("{i}" in o for o in e.ours)
            if has_i == (i is None):
                continue
            for p in ("weight", "bias") if any("{p}" in o for o in e.ours + e.hf) else (None,):
                ours = tuple(o.format(i=i, p=p) for o in e.ours)
                if not all(o in shapes for o in ours) or claimed & set(ours):
                    continue
                if any("{e}" in h for h in e.hf):
                    n = shapes[ours[0]][0]
                    hf = tuple(h.format(i=i, p=p, e=x) for x in range(n) for h in e.hf)
                else:
                    hf = tuple(h.format(i=i, p=p) for h in e.hf)
                out.append(_link(e, hf, ours, Ctx(spec, shapes, config, i, ours, hf)))
                claimed.update(ours)
    for name in shapes:
        if name in claimed:
            continue
        for e, (regex,) in single:
            m = regex.fullmatch(name)
            if m:
                groups = m.groupdict()
                hf = (e.hf[0].format(**groups),)
                layer = int(groups["i"]) if "i" in groups else None
                out.append(_link(e, hf, (name,), Ctx(spec, shapes, config, layer, (name,), hf)))
                claimed.add(name)
                break
    for e in active:
        if isinstance(e, Head):
            out.append(Link((e.hf,), ("lm_head.weight",), optional="lm_head.weight" not in shapes))
    return out


# ------------------------------------------------------------------------------------------------ RoPE layout


def rope_index(head_dim: int, rotary_dim: int, to_interleaved: bool) -> Tensor:
    """Per-head feature order converting between RoPE layouts (half-split and interleaved pairs).

    ``P = [0, 2, 4, ..., 1, 3, 5, ...]`` over the rotary dims (identity beyond them) satisfies
    ``half_split(x[P], m) == interleaved(x, m)[P]``. Rows of a half-split checkpoint reordered by ``P⁻¹`` serve an
    interleaved model (``to_interleaved``); rows of an interleaved one reordered by ``P`` serve a half-split one.
    """
    half = rotary_dim // 2
    p = list(range(0, rotary_dim, 2)) + list(range(1, rotary_dim, 2))
    inv = [0] * rotary_dim
    for new, old in enumerate(p):
        inv[old] = new
    order = inv if to_interleaved else p
    assert len(order) == 2 * half
    return torch.tensor(order + list(range(rotary_dim, head_dim)), dtype=torch.long)


def _permute_rows(t: Tensor, index: Tensor) -> Tensor:
    hd = index.numel()
    shape = t.shape
    return t.reshape(shape[0] // hd, hd, *shape[1:])[:, index.to(t.device)].reshape(shape)


_QK = re.compile(r"layers\.(\d+)\.attention\.(q_proj|k_proj|q_norm|k_norm)\.(weight|bias)")
#: MLA's tensors with rotated rows: the query projection (per head: ``qk_nope_head_dim`` rows, then
#: ``qk_rope_head_dim`` rotated ones) and the latent projection (``kv_lora_rank`` latent rows, then the rotated key)
_MLA = re.compile(r"layers\.(\d+)\.attention\.(q_proj|q_b_proj|kv_a_proj_with_mqa)\.(weight|bias)")


def _mla_index(att, rot_index: Tensor, name: str) -> Tensor:
    """The row order of an MLA tensor that reorders only its rotated rows by ``rot_index`` (over
    ``qk_rope_head_dim``): per head of the query projection, or the shared key at the end of ``kv_a_proj_with_mqa``."""
    nope, rope = att.qk_nope_head_dim, att.qk_rope_head_dim
    if name == "kv_a_proj_with_mqa":
        r = att.kv_lora_rank
        return torch.cat([torch.arange(r), r + rot_index])
    per = torch.cat([torch.arange(nope), nope + rot_index])
    return torch.cat([h * (nope + rope) + per for h in range(att.n_heads)])


def with_rope_layout(links: Sequence[Link], spec, checkpoint_layout: str = "half_split") -> list[Link]:
    """Wrap ``links`` so that every layer whose RoPE ``layout`` differs from the checkpoint's gets its rotated rows
    permuted, in both directions: per head, the q/k rows of projection weights and biases and QK-norm weights and
    biases; for latent attention (``mla``, which declares ``qk_rope_head_dim``), only the rotated rows: the last
    ``qk_rope_head_dim`` of each query head and the shared key rows of ``kv_a_proj_with_mqa`` (DeepSeek's
    ``rope_interleave``)."""
    plans: dict[int, tuple[Tensor, Tensor]] = {}
    mla: dict[int, Any] = {}
    for i in range(spec.n_layers):
        ls = spec.layer(i)
        pos = ls.position
        layout = getattr(pos, "layout", None)
        if pos.type != "rope" or layout is None or layout == checkpoint_layout:
            continue
        att = ls.attention
        if getattr(att, "qk_rope_head_dim", None) is not None:
            hd = att.qk_rope_head_dim
            mla[i] = att
        else:
            hd = (
                att.resolved_head_dim(spec.d_model)
                if hasattr(att, "resolved_head_dim")
                else spec.d_model // att.n_heads
            )
        rot = int(hd * getattr(pos, "partial_rotary", 1.0))
        rot -= rot % 2
        to_inter = layout == "interleaved"
        plans[i] = (rope_index(hd, rot, to_inter), rope_index(hd, rot, not to_inter))
    if not plans:
        return list(links)
    out = []
    for link in links:
        slots = []
        for k, name in enumerate(link.ours):
            m = (_MLA if (m0 := re.match(r"layers\.(\d+)\.", name)) and int(m0.group(1)) in mla else _QK).fullmatch(
                name
            )
            if not m or int(m.group(1)) not in plans:
                continue
            i = int(m.group(1))
            if i in mla:
                fwd, back = plans[i]
                att, proj = mla[i], m.group(2)
                slots.append((k, (_mla_index(att, fwd, proj), _mla_index(att, back, proj)), False))
            else:
                slots.append((k, plans[i], True))
        if not slots:
            out.append(link)
            continue
        out.append(_permuted(link, slots))
    return out


def _permuted(link: Link, slots: list[tuple[int, tuple[Tensor, Tensor], bool]]) -> Link:
    """``link`` with the rows of tensor ``k`` reordered by each slot's index, per head (repeated every
    ``len(index)`` rows) or over the whole first dimension (``per_head`` false)."""

    def move(t: Tensor, index: Tensor, per_head: bool) -> Tensor:
        return _permute_rows(t, index) if per_head else t[index.to(t.device)]

    def to_ours(ts: Sequence[Tensor]) -> list[Tensor]:
        res = link.forward(ts)
        for k, (fwd, _), per_head in slots:
            res[k] = move(res[k], fwd, per_head)
        return res

    def to_hf(ts: Sequence[Tensor], extras: Mapping[str, Tensor]) -> list[Tensor]:
        ts = list(ts)
        for k, (_, back), per_head in slots:
            ts[k] = move(ts[k], back, per_head)
        return link.backward(ts, extras)

    return Link(link.hf, link.ours, to_ours, to_hf, link.optional)


# ------------------------------------------------------------------------------------------------ configs


def hf_activation(act: str, tanh_name: str = "gelu_pytorch_tanh", base: Any = None) -> str:
    """The Hugging Face activation name for modkit's ``act`` (``gelu_tanh`` → ``tanh_name``); the source config's
    name ``base`` is kept when it denotes the same function (``gelu_fast`` stays ``gelu_fast``)."""
    if isinstance(base, str) and ACTIVATIONS.get(base) == act:
        return base
    return tanh_name if act == "gelu_tanh" else HF_ACTIVATION.get(act, act)


def carried(base: Optional[Mapping[str, Any]], extra: Sequence[str] = ()) -> dict:
    """The keys of a source config an export keeps as they were (:data:`CARRY` and ``extra``)."""
    if not base:
        return {}
    keys = CARRY | set(extra)
    return {k: copy.deepcopy(v) for k, v in base.items() if k in keys}


def _normalised(cfg: Any) -> Any:
    """A component config dumped to JSON data, with the RoPE layout (carried by the weights) left out."""
    if cfg is None:
        return None
    data = cfg.model_dump(mode="json")
    if data.get("type") == "rope":
        data.pop("layout", None)
    return data


def spec_differences(spec, other) -> list[tuple[str, Any, Any]]:
    """``(path, value in spec, value in other)`` for every difference that changes the network.

    Compared: sizes, head and embedding fields, init std, sharing across layers (``share``, ``kv_sharing``), the
    residual ``stream`` and multi-token prediction (``mtp``), and every layer's resolved components (so two specs
    that express the same layers with different override lists are equal). Name, description, metadata and the
    RoPE layout are not compared.
    """
    diffs = []
    for key in (
        "vocab_size",
        "d_model",
        "n_layers",
        "max_seq_len",
        "embedding_scale",
        "tie_embeddings",
        "lm_head_bias",
        "logit_scale",
        "final_logit_softcap",
        "init_std",
    ):
        a, b = getattr(spec, key), getattr(other, key)
        if a != b:
            diffs.append((key, a, b))
    for key in ("share", "kv_sharing"):  # sharing across layers changes the parameters and the cache
        a, b = ([g.model_dump() for g in getattr(s, key, ())] for s in (spec, other))
        if a != b:
            diffs.append((key, a, b))
    a, b = (getattr(s, "mtp", None) for s in (spec, other))  # extra modules a type without them would drop
    if (a and a.model_dump()) != (b and b.model_dump()):
        diffs.append(("mtp", a and a.model_dump(), b and b.model_dump()))
    for key in ("embedding_norm", "final_norm", "stream"):
        a, b = _normalised(getattr(spec, key, None)), _normalised(getattr(other, key, None))
        if a != b:
            diffs.append((key, a, b))
    if spec.position.type in ("learned", "sinusoidal") or other.position.type in ("learned", "sinusoidal"):
        a, b = _normalised(spec.position), _normalised(other.position)
        if a != b:
            diffs.append(("position", a, b))
    if spec.n_layers == other.n_layers:
        for i in range(spec.n_layers):
            la, lb = spec.layer(i), other.layer(i)
            for slot in ("attention", "ffn", "norm", "placement", "position"):
                a, b = _normalised(getattr(la, slot)), _normalised(getattr(lb, slot))
                if a != b:
                    diffs.append((f"layers[{i}].{slot}", a, b))
    return diffs


_LAYER_SLOT = re.compile(r"layers\[(\d+)\]\.(\w+)")


def _leaves(path: str, a: Any, b: Any) -> list[tuple[str, Any, Any]]:
    """The first differing fields under ``path`` of two component dumps: ``path.type`` when the types differ, else
    each differing field (nested components followed), else ``path`` itself for values that are not components."""
    if not (isinstance(a, dict) and isinstance(b, dict)):
        return [(path, a, b)]
    if a.get("type") != b.get("type"):
        return [(f"{path}.type", a.get("type"), b.get("type"))]
    return [
        leaf
        for k in dict.fromkeys([*a, *b])
        if a.get(k) != b.get(k)
        for leaf in _leaves(f"{path}.{k}", a.get(k), b.get(k))
    ]


def field_differences(spec, other) -> list[tuple[str, Any, str, Any]]:
    """:func:`spec_differences` named by the spec fields a user edits: ``(field path, value in spec, layers, value in
    other)``. A layer's component is named where the spec sets it (``block.ffn``, ``overrides[1].ffn``,
    ``position``) down to its first differing field (``block.norm.type``, ``final_norm.eps``); ``layers`` is
    ``" (every layer)"``, ``" (layers 1, 3)"`` or ``""`` for a field outside the layers."""
    found: dict[tuple[str, str, str], tuple[str, Any, Any, list[int]]] = {}
    for path, a, b in spec_differences(spec, other):
        m = _LAYER_SLOT.fullmatch(path)
        base = spec.layer_source(int(m.group(1)), m.group(2)) if m else path
        for leaf, x, y in _leaves(base, a, b):
            entry = found.setdefault((leaf, repr(x), repr(y)), (leaf, x, y, []))
            if m:
                entry[3].append(int(m.group(1)))
    out = []
    for leaf, x, y, layers in found.values():
        many = "s" if len(layers) > 1 else ""
        where = " (every layer)" if len(layers) == spec.n_layers else f" (layer{many} {', '.join(map(str, layers))})"
        out.append((leaf, x, where if layers else "", y))
    return out


@dataclass
class HFWeights:
    """The weight mapper of one Hugging Face ``model_type`` (see :class:`modkit.io.checkpoint.WeightMapper`).

    Attributes:
        model_type: the Hugging Face ``model_type``.
        convert: the forward config converter (``config dict -> spec dict``).
        make_links: ``(spec, shapes, config) -> list[Link]`` (a model type's :func:`table_links`); the RoPE layout
            permutation is added here.
        to_config: ``(spec, base) -> dict``: the architecture keys of the reverse conversion.
        keep: ``(regex, reason)`` for checkpoint tensors carried along but not computed by modkit.
        aliases: ``(canonical prefix, alternative prefix)`` accepted when reading.
        carry: model-specific keys kept from the source config on export (besides :data:`CARRY`).
        architecture: the ``architectures`` entry written when the source config gave none.
        checkpoint_layout: the RoPE layout of the checkpoint's q/k rows (``half_split``; GLM: ``interleaved``), or a
            function of the checkpoint's config returning it (DeepSeek-V3's ``rope_interleave``).
    """

    model_type: str
    convert: Callable[[dict], dict]
    make_links: Callable[..., list[Link]]
    to_config: Callable[..., dict]
    keep: Sequence[tuple[str, str]] = ()
    aliases: Sequence[tuple[str, str]] = ()
    carry: Sequence[str] = ()
    architecture: str = ""
    checkpoint_layout: Union[str, Callable[[Mapping[str, Any]], str]] = "half_split"

    def links(self, spec, shapes: Mapping[str, Any], config: Mapping[str, Any]) -> list[Link]:
        """Every :class:`Link` of a model built from ``spec`` for a checkpoint described by ``config``."""
        layout = self.checkpoint_layout(config) if callable(self.checkpoint_layout) else self.checkpoint_layout
        return with_rope_layout(self.make_links(spec, shapes, config), spec, layout)

    def hf_config(self, spec, base: Optional[Mapping[str, Any]] = None) -> dict:
        """The Hugging Face ``config.json`` dict for ``spec`` (keys of ``base`` that do not shape the network kept).

        Raises:
            CheckpointError: the spec cannot be expressed as this model type: the config would convert back to a
                different network (each differing spec field named, ``block.norm.type``, with both values and the
                layers it sets, then the fix); its ``fields`` hold the same as ``(path, spec value, layers, config
                value)``, ``None`` when the config converts back to no valid spec.
        """
        cfg = carried(base, self.carry)
        cfg.update(self.to_config(spec, base or {}))
        cfg["model_type"] = self.model_type
        if not cfg.get("architectures") and self.architecture:
            cfg["architectures"] = [self.architecture]
        lines, fields, back = self._differences(spec, cfg)
        if back is not None:  # dropout is training-time only (so loading ignores it), but an export must keep it
            for path, a, b in _leaves("dropout", spec.dropout.model_dump(), back.dropout.model_dump()):
                lines.append(f"{path}: spec has {a!r}, the {self.model_type} config can hold only {b!r}")
                fields.append((path, a, "", b))
        if lines:
            fix = f"set these fields to what the {self.model_type} config gives, " if back is not None else ""
            err = CheckpointError(
                f"spec {spec.name or ''!s} cannot be written as a Hugging Face {self.model_type!r} checkpoint; the config "
                f"would describe a different network:\n  " + "\n  ".join(lines) + f"\n  fix: {fix}name another type "
                "with --model-type (left out: the types that express the spec are named), or keep the spec as it is "
                "in modkit's own format (modkit.save)"
            )
            err.fields = fields if back is not None else None  # for modkit.io.hf_types: which fields do not map
            raise err
        return cfg

    def compatibility(self, spec, config: Mapping[str, Any]) -> list[str]:
        """Why the network ``config`` describes differs from ``spec`` (empty when they agree, RoPE layout aside):
        one line per spec field, ``block.norm.type: spec has 'l2norm' (every layer), the llama config gives
        'rmsnorm'``."""
        return self._differences(spec, config)[0]

    def _differences(self, spec, config: Mapping[str, Any]) -> tuple[list[str], list[tuple], Any]:
        """``(lines, fields, network)``: :meth:`compatibility`'s lines, the same as ``(field path, spec value, layers,
        config value)`` (:func:`field_differences`), and the spec ``config`` describes (``None``, with no fields,
        when it describes none: the lines are then its errors)."""
        try:
            back = load_spec(self.convert(dict(config)))
        except SpecError as exc:
            return [f"{p or '<root>'}: {m}" for p, m in exc.errors], [], None
        fields = field_differences(spec, back)
        lines = [f"{p}: spec has {a!r}{layers}, the {self.model_type} config gives {b!r}" for p, a, layers, b in fields]
        return lines, fields, back

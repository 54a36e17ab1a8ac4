"""Shared pieces of the Hugging Face weight mappers: name tables, fused-tensor links, RoPE layout, reverse configs.

Each converter module builds an :class:`HFWeights` (registered with ``register(model_type, convert,
weights=mapper)``) from three functions of its own:

* ``links(spec, shapes, config) -> list[Link]``: the correspondence between modkit ``state_dict`` names and the
  checkpoint's names, usually a :class:`Renames` table (modkit pattern → Hugging Face pattern, ``{i}`` a layer,
  ``{e}`` an expert, ``{p}`` ``weight``/``bias``) plus a few fused links (:func:`split_link`);
* ``to_config(spec, base) -> dict``: the reverse config conversion (spec → ``config.json`` dict);
* and the module's forward ``convert``, with which :meth:`HFWeights.hf_config` checks the reverse conversion:
  the config it writes must convert back to the very spec it came from (RoPE layout aside, which the weights
  carry), otherwise the export is refused naming each field that would change.

RoPE layout (C01): Hugging Face checkpoints rotate half-split pairs. A spec asking for ``interleaved`` pairs
gets the rows of Wq and Wk (biases and QK-norm weights too) permuted per head, so the logits are unchanged;
export permutes back, bitwise.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional, Sequence

import torch
from torch import Tensor

from modkit import CheckpointError, SpecError, load_spec
from modkit.checkpoint import Link

from ._common import IMPLEMENTATION_KEYS, IRRELEVANT, dropout_config

#: keys of a source config copied into an export (tokenizer ids, generation defaults, task heads...): they do
#: not change the network, so the spec does not hold them, but a checkpoint without them would lose them
CARRY: frozenset[str] = frozenset(IRRELEVANT) - IMPLEMENTATION_KEYS - {
    "model_type",
    "transformers_version",
    "_name_or_path",
    "name_or_path",
    "_commit_hash",
    "torch_dtype",
    "dtype",
    "use_bfloat16",
    "quantization_config",
}

#: modkit activation → the Hugging Face name written on export, unless a model type prefers another
HF_ACTIVATION = {"silu": "silu", "gelu": "gelu", "gelu_tanh": "gelu_pytorch_tanh", "relu": "relu"}


# ------------------------------------------------------------------------------------------------ names


class Renames:
    """A table of modkit-name patterns → Hugging Face-name patterns for one-to-one tensors.

    Placeholders: ``{i}`` (layer), ``{e}`` (expert) and ``{j}`` match digits, ``{p}`` matches ``weight`` or
    ``bias``. ``Renames([("layers.{i}.attention.o_proj.{p}", "model.layers.{i}.self_attn.o_proj.{p}")])``.
    """

    _SLOTS = {"i": r"\d+", "e": r"\d+", "j": r"\d+", "p": r"weight|bias"}

    def __init__(self, pairs: Sequence[tuple[str, str]]):
        self.pairs = list(pairs)
        self._compiled = [(self._regex(ours), theirs) for ours, theirs in self.pairs]

    @classmethod
    def _regex(cls, pattern: str) -> re.Pattern:
        out, pos = "", 0
        for m in re.finditer(r"\{(\w)\}", pattern):
            out += re.escape(pattern[pos : m.start()]) + f"(?P<{m.group(1)}>{cls._SLOTS[m.group(1)]})"
            pos = m.end()
        return re.compile(out + re.escape(pattern[pos:]))

    def hf_name(self, ours: str) -> Optional[str]:
        """The Hugging Face name of modkit tensor ``ours``, or ``None`` when no pattern matches."""
        for regex, theirs in self._compiled:
            m = regex.fullmatch(ours)
            if m:
                return theirs.format(**m.groupdict())
        return None

    def links(self, shapes: Mapping[str, Any], skip: Sequence[str] = ()) -> list[Link]:
        """One identity :class:`Link` per model tensor the table maps (names in ``skip`` are left to other links)."""
        skipped = set(skip)
        out = []
        for name in shapes:
            if name in skipped:
                continue
            hf = self.hf_name(name)
            if hf is not None:
                out.append(Link((hf,), (name,)))
        return out


def head_link(spec, shapes: Mapping[str, Any], hf_name: str = "lm_head.weight") -> list[Link]:
    """The LM head: a plain link when untied; when tied, an *optional* link so that a checkpoint storing the head
    too is accepted if it equals the embedding and refused if it differs (the model checks, C10)."""
    if "lm_head.weight" in shapes:
        return [Link((hf_name,), ("lm_head.weight",))]
    return [Link((hf_name,), ("lm_head.weight",), optional=True)]


def split_link(hf: str, ours: Sequence[str], sizes: Sequence[int], *, transpose: bool = False) -> Link:
    """One fused Hugging Face tensor ↔ several modkit tensors concatenated along dim 0 (``sizes`` rows each).

    ``transpose``: the fused tensor is stored transposed (GPT-2's ``Conv1D`` keeps ``[in, out]``).
    """

    def to_ours(ts: Sequence[Tensor]) -> list[Tensor]:
        t = ts[0].t() if transpose and ts[0].dim() == 2 else ts[0]
        return list(torch.split(t, list(sizes), dim=0))

    def to_hf(ts: Sequence[Tensor], extras: Mapping[str, Tensor]) -> list[Tensor]:
        t = torch.cat(list(ts), dim=0)
        return [t.t() if transpose and t.dim() == 2 else t]

    return Link((hf,), tuple(ours), to_ours, to_hf)


def stacked_link(hf: Sequence[str], ours: str) -> Link:
    """Per-expert ``nn.Linear`` weights ``[out, in]`` (one Hugging Face tensor per expert, in expert order) ↔ one
    modkit tensor of stacked experts ``[n_experts, in, out]`` (the grouped-GEMM layout of the ``moe`` experts)."""

    def to_ours(ts: Sequence[Tensor]) -> list[Tensor]:
        return [torch.stack([t.t() for t in ts])]

    def to_hf(ts: Sequence[Tensor], extras: Mapping[str, Tensor]) -> list[Tensor]:
        return [w.t().contiguous() for w in ts[0].unbind(0)]

    return Link(tuple(hf), (ours,), to_ours, to_hf)


def transposed_link(hf: str, ours: str) -> Link:
    """A weight stored transposed (``Conv1D``: ``[in, out]`` instead of ``nn.Linear``'s ``[out, in]``)."""
    return Link((hf,), (ours,), lambda ts: [ts[0].t()], lambda ts, extras: [ts[0].t()])


# ------------------------------------------------------------------------------------------------ RoPE layout


def rope_index(head_dim: int, rotary_dim: int, to_interleaved: bool) -> Tensor:
    """Per-head feature order converting between RoPE layouts (C01).

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


def with_rope_layout(links: Sequence[Link], spec, checkpoint_layout: str = "half_split") -> list[Link]:
    """Wrap ``links`` so that every layer whose RoPE ``layout`` differs from the checkpoint's gets its q/k rows
    (projection weights and biases, QK-norm weights and biases) permuted per head, in both directions."""
    plans: dict[int, tuple[Tensor, Tensor]] = {}
    for i in range(spec.n_layers):
        ls = spec.layer(i)
        pos = ls.position
        layout = getattr(pos, "layout", None)
        if pos.type != "rope" or layout is None or layout == checkpoint_layout:
            continue
        att = ls.attention
        hd = att.resolved_head_dim(spec.d_model) if hasattr(att, "resolved_head_dim") else spec.d_model // att.n_heads
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
            m = _QK.fullmatch(name)
            if m and int(m.group(1)) in plans:
                slots.append((k, plans[int(m.group(1))]))
        if not slots:
            out.append(link)
            continue
        out.append(_permuted(link, slots))
    return out


def _permuted(link: Link, slots: list[tuple[int, tuple[Tensor, Tensor]]]) -> Link:
    def to_ours(ts: Sequence[Tensor]) -> list[Tensor]:
        res = link.forward(ts)
        for k, (fwd, _) in slots:
            res[k] = _permute_rows(res[k], fwd)
        return res

    def to_hf(ts: Sequence[Tensor], extras: Mapping[str, Tensor]) -> list[Tensor]:
        ts = list(ts)
        for k, (_, back) in slots:
            ts[k] = _permute_rows(ts[k], back)
        return link.backward(ts, extras)

    return Link(link.hf, link.ours, to_ours, to_hf, link.optional)


# ------------------------------------------------------------------------------------------------ configs


def layer_windows(spec) -> list[Optional[int]]:
    """The sliding window of every layer (``None``: global)."""
    return [getattr(spec.layer(i).attention, "sliding_window", None) for i in range(spec.n_layers)]


def rope_fields(
    position,
    *,
    theta_key: str = "rope_theta",
    scaling_key: Optional[str] = "rope_scaling",
    always_partial: bool = False,
    original_at_top: bool = False,
) -> dict:
    """A ``rope`` position spec as 4.x-style config keys (read by transformers 4.x and 5.x alike).

    ``always_partial``: write ``partial_rotary_factor`` even when it is 1 (Phi's default is 0.5).
    ``original_at_top``: also write LongRoPE's/YaRN's trained length as the top-level
    ``original_max_position_embeddings`` (Phi-3, whose config class reads it there first).
    """
    if position.type != "rope":
        return {}
    out: dict[str, Any] = {theta_key: position.theta}
    if position.partial_rotary != 1.0 or always_partial:
        out["partial_rotary_factor"] = position.partial_rotary
    sc = position.scaling
    if scaling_key is None:
        return out
    if sc is None:
        out[scaling_key] = None
        return out
    if sc.type == "linear":
        d: dict[str, Any] = {"rope_type": "linear", "factor": sc.factor}
    elif sc.type == "llama3":
        d = {"rope_type": "llama3", "factor": sc.factor, "low_freq_factor": sc.low_freq_factor,
             "high_freq_factor": sc.high_freq_factor, "original_max_position_embeddings": sc.original_max_seq_len}
    elif sc.type == "dynamic":  # its trained length is max_position_embeddings, checked by the reverse conversion
        d = {"rope_type": "dynamic", "factor": sc.factor}
    elif sc.type == "yarn":
        d = {"rope_type": "yarn", "factor": sc.factor, "original_max_position_embeddings": sc.original_max_seq_len,
             "beta_fast": sc.beta_fast, "beta_slow": sc.beta_slow}
        for key in ("mscale", "mscale_all_dim", "attention_factor"):
            if getattr(sc, key) is not None:
                d[key] = getattr(sc, key)
        if not sc.truncate:
            d["truncate"] = False
    elif sc.type == "longrope":
        d = {"rope_type": "longrope", "short_factor": list(sc.short_factor), "long_factor": list(sc.long_factor),
             "original_max_position_embeddings": sc.original_max_seq_len}
        for key in ("factor", "attention_factor"):
            if getattr(sc, key) is not None:
                d[key] = getattr(sc, key)
    else:
        raise CheckpointError(f"RoPE scaling {sc.type!r} has no Hugging Face form")
    out[scaling_key] = d
    if original_at_top and "original_max_position_embeddings" in d:
        out["original_max_position_embeddings"] = d["original_max_position_embeddings"]
    return out


def hf_activation(act: str, tanh_name: str = "gelu_pytorch_tanh", base: Any = None) -> str:
    """The Hugging Face activation name for modkit's ``act`` (``gelu_tanh`` → ``tanh_name``); the source config's
    name ``base`` is kept when it denotes the same function (``gelu_fast`` stays ``gelu_fast``)."""
    from ._common import ACTIVATIONS

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

    Compared: sizes, head and embedding fields, init std, and every layer's resolved components (so two specs
    that express the same layers with different override lists are equal). Name, description, metadata and the
    RoPE layout are not compared.
    """
    diffs = []
    for key in ("vocab_size", "d_model", "n_layers", "max_seq_len", "embedding_scale", "tie_embeddings", "lm_head_bias",
                "logit_scale", "final_logit_softcap", "init_std"):
        a, b = getattr(spec, key), getattr(other, key)
        if a != b:
            diffs.append((key, a, b))
    for key in ("embedding_norm", "final_norm"):
        a, b = _normalised(getattr(spec, key)), _normalised(getattr(other, key))
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


@dataclass
class HFWeights:
    """The weight mapper of one Hugging Face ``model_type`` (see :class:`modkit.checkpoint.WeightMapper`).

    Attributes:
        model_type: the Hugging Face ``model_type``.
        convert: the forward config converter (``config dict -> spec dict``).
        make_links: ``(spec, shapes, config) -> list[Link]``; RoPE layout permutation is added here.
        to_config: ``(spec, base) -> dict``: the architecture keys of the reverse conversion.
        keep: ``(regex, reason)`` for checkpoint tensors carried along but not computed by modkit.
        aliases: ``(canonical prefix, alternative prefix)`` accepted when reading.
        carry: model-specific keys kept from the source config on export (besides :data:`CARRY`).
        architecture: the ``architectures`` entry written when the source config gave none.
    """

    model_type: str
    convert: Callable[[dict], dict]
    make_links: Callable[..., list[Link]]
    to_config: Callable[..., dict]
    keep: Sequence[tuple[str, str]] = ()
    aliases: Sequence[tuple[str, str]] = ()
    carry: Sequence[str] = ()
    architecture: str = ""
    checkpoint_layout: str = "half_split"
    notes: dict = field(default_factory=dict)

    def links(self, spec, shapes: Mapping[str, Any], config: Mapping[str, Any]) -> list[Link]:
        """Every :class:`Link` of a model built from ``spec`` for a checkpoint described by ``config``."""
        return with_rope_layout(self.make_links(spec, shapes, config), spec, self.checkpoint_layout)

    def hf_config(self, spec, base: Optional[Mapping[str, Any]] = None) -> dict:
        """The Hugging Face ``config.json`` dict for ``spec`` (keys of ``base`` that do not shape the network kept).

        Raises:
            CheckpointError: the spec cannot be expressed as this model type: the config would convert back to a
                different network (each differing field named, with both values).
        """
        cfg = carried(base, self.carry)
        cfg.update(self.to_config(spec, base or {}))
        cfg.update(dropout_config(spec, self.model_type))
        cfg["model_type"] = self.model_type
        if not cfg.get("architectures") and self.architecture:
            cfg["architectures"] = [self.architecture]
        problems = self.compatibility(spec, cfg)
        back_dropout = load_spec(self.convert(dict(cfg))).dropout if not problems else spec.dropout
        if back_dropout != spec.dropout:  # training-time only (so loading ignores it), but an export must keep it
            problems.append(
                f"dropout: spec has {spec.dropout.model_dump()}, the {self.model_type} config can hold only "
                f"{back_dropout.model_dump()}"
            )
        if problems:
            raise CheckpointError(
                f"spec {spec.name or ''!s} cannot be written as a Hugging Face {self.model_type!r} checkpoint; the config "
                f"would describe a different network:\n  " + "\n  ".join(problems)
            )
        return cfg

    def compatibility(self, spec, config: Mapping[str, Any]) -> list[str]:
        """Why the network ``config`` describes differs from ``spec`` (empty when they agree, RoPE layout aside)."""
        try:
            back = load_spec(self.convert(dict(config)))
        except SpecError as exc:
            return [f"{p or '<root>'}: {m}" for p, m in exc.errors]
        return [f"{path}: spec has {a!r}, the {self.model_type} config gives {b!r}" for path, a, b in spec_differences(spec, back)]

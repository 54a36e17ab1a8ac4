"""A Hugging Face model type as data: :class:`HFType`, its config table and weight table, both directions.

``HFType`` ties together what a model type *is*:

* ``keys``: the config table (:mod:`._keys`): every key of the type's transformers configuration class, mapped to
  fields of the network description (:data:`._spec.FIELDS`), ignored, or refused;
* ``fixed``: the fields the type never reads from a config (its architecture: the norm, the block placement,
  which projections carry biases, ...);
* ``tensors``: the weight table (:mod:`._weights`): checkpoint names ↔ modkit names and the layout change;
* ``read_own`` / ``write_own``: only the code really the type's own (Falcon's three architectures), run after the
  table in each direction.

From these, :meth:`HFType.convert` is the forward config conversion (config → fields → spec dict,
:func:`._spec.assemble`) and :attr:`HFType.weights` the checkpoint mapper (:class:`._weights.HFWeights`: links
from the weight table, the reverse config conversion from the same config table, checked by converting back).

:meth:`HFType.derive` makes a neighbour the way transformers' "modular" model files do: the parent's tables with a
few rows replaced, added or dropped, and other class defaults (``QWEN3 = QWEN2.derive("qwen3", ...)``).

Registration: ``register(TYPE)`` in a ``register_hf_converters`` hook (the older ``register(model_type, convert,
weights=mapper)`` form still works for converters written as plain functions).
"""

from __future__ import annotations

import copy
import sys
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any, Callable, Mapping, Optional, Sequence

from ._keys import Entry, Ignore
from ._reader import HFConfig
from ._spec import FIELDS, assemble, fields_of
from ._weights import RENAME, HFWeights, StackExperts, table_links, weight_table

#: ``(label, fields)``: what the reference page's "supports" column says when a type's table can set (or its fixed
#: values set away from the default) any of the fields
FEATURES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("recurrent mixer", ("mixer", "mixers")),
    ("attention and recurrent layers", ("mixers",)),
    ("placement per layer", ("placements",)),
    ("gated attention output", ("attn_output_gate",)),
    ("GQA / MQA", ("n_kv_heads",)),
    ("latent attention (MLA)", ("mla",)),
    ("QK-norm", ("qk_norm", "attention_by_layer")),
    ("sliding windows", ("sliding_window",)),
    ("chunked attention", ("attention_chunk_size",)),
    ("attention sinks", ("sinks",)),
    ("temperature tuning", ("attention_by_layer",)),
    ("NoPE layers", ("positions",)),
    ("RoPE per layer type", ("position_by_type",)),
    ("soft-caps", ("attn_softcap", "final_logit_softcap")),
    ("softmax scale", ("softmax_scale",)),
    ("embedding / residual / logit multipliers", ("embedding_scale", "residual_multiplier", "logit_scale")),
    ("FFN gate / output multipliers", ("ffn_multipliers",)),
    ("biases", ("qkv_bias", "o_bias", "mlp_bias", "lm_head_bias", "expert_bias", "router_bias")),
    ("(1 + w) RMSNorm", ("unit_offset",)),
    ("embedding norm", ("embedding_norm",)),
    ("MoE", ("moe",)),
    ("dense and MoE layers", ("moe_layers",)),
    ("shared experts", ("shared_d_ff",)),
    ("zero-computation experts", ("n_zero_experts",)),
    ("gated shared expert", ("shared_gate",)),
    ("sigmoid router", ("router",)),
    ("group-limited routing", ("n_group",)),
    ("correction bias", ("correction_bias",)),
    ("routed scaling", ("routed_scaling_factor",)),
    ("input-side expert weighting", ("weight_on",)),
    ("clamped SwiGLU experts", ("expert_clamp",)),
    ("dropout", ("dropout_embedding", "dropout_attention", "dropout_residual")),
)

#: the name of a fixed placement on the reference page
PLACEMENTS = {
    "parallel": "parallel blocks",
    "sandwich": "sandwich norms",
    "reordered": "reordered norms",
    "post": "post-norm",
    "shortcut-moe": "two sublayer pairs with a shortcut-connected MoE",
}


@dataclass(frozen=True)
class HFType:
    """One Hugging Face ``model_type``: config table, fixed fields, weight table, and its own code if any.

    Attributes:
        model_type: the ``model_type`` of ``config.json``.
        architecture: the ``architectures`` entry written on export (``LlamaForCausalLM``).
        keys: the config table, ``{config key: row}`` in reading order (a row may read several keys).
        tensors: the weight table (:class:`._weights.W` rows and one :class:`._weights.Head`).
        fixed: fields the type never reads (:data:`._spec.FIELDS`), over the fields' defaults.
        notes: what the converter reads and how (the type module's docstring; shown in the reference docs).
        parent: the model type this one derives from.
        keep: ``(regex, reason)`` for checkpoint tensors carried along but not computed.
        aliases: ``(canonical prefix, alternative prefix)`` accepted when reading weights.
        checkpoint_layout: the RoPE layout of the checkpoint's q/k rows, or a function of its config returning it.
        read_own: ``(r, fields) -> None``, run after the config table (the type's own reading code).
        write_own: ``(fields, base, config) -> None``, run after the table writes ``config`` on export.
        module: the module that defined the type (set automatically).
    """

    model_type: str
    architecture: str
    keys: Mapping[str, Entry]
    tensors: tuple
    fixed: Mapping[str, Any] = field(default_factory=dict)
    notes: str = ""
    parent: Optional[str] = None
    keep: tuple = ()
    aliases: tuple = ()
    checkpoint_layout: Any = "half_split"
    read_own: Optional[Callable[[HFConfig, dict], None]] = None
    write_own: Optional[Callable[[Mapping[str, Any], Mapping[str, Any], dict], None]] = None
    module: str = ""

    def __post_init__(self):
        unknown = sorted(set(self.fixed) - set(FIELDS))
        if unknown:
            raise ValueError(f"HFType {self.model_type!r}: unknown fields {unknown}; the fields are {sorted(FIELDS)}")
        if not self.module:
            object.__setattr__(self, "module", sys._getframe(2).f_globals.get("__name__", ""))

    # ------------------------------------------------------------------ derive
    # size: the keywords are the documented derivation API (docs/guides/hugging-face.md, third-party types call
    # derive with them): one keyword per kind of table change, each applied by its own helper
    def derive(
        self,
        model_type: str,
        *,
        architecture: str,
        notes: str = "",
        keys: Optional[Mapping[str, Entry]] = None,
        defaults: Optional[Mapping[str, Any]] = None,
        drop: Sequence[str] = (),
        fixed: Optional[Mapping[str, Any]] = None,
        tensors: Optional[Sequence[Any]] = None,
        drop_tensors: Sequence[Any] = (),
        **changes: Any,
    ) -> "HFType":
        """A neighbouring model type: this one's tables with a few changes.

        Args:
            keys: rows replacing the parent's rows of the same key (in place) or added (at the end).
            defaults: new transformers defaults for the parent's rows (``{"intermediate_size": 14336}``).
            drop: config keys the new type does not have.
            fixed: fields changed over the parent's.
            tensors: weight rows replacing the parent's rows for the same modkit names, or added.
            drop_tensors: modkit names (or tuples of them) whose weight rows are removed.
            changes: other attributes (``keep``, ``read_own``, ...).

        Raises:
            KeyError: a ``defaults`` or ``drop`` key the parent's table does not have.
        """
        return replace(
            self,
            model_type=model_type,
            architecture=architecture,
            notes=notes,
            keys=self._edited_keys(keys or {}, defaults or {}, drop),
            fixed={**self.fixed, **(fixed or {})},
            tensors=weight_table(self.tensors, *(tensors or ()), drop=drop_tensors),
            parent=self.model_type,
            module=sys._getframe(1).f_globals.get("__name__", ""),
            **changes,
        )

    def _edited_keys(self, keys: Mapping[str, Entry], defaults: Mapping[str, Any], drop: Sequence[str]) -> dict:
        """This type's config table with the keys in ``drop`` removed, new transformers ``defaults`` for some rows,
        then ``keys`` replacing rows in place or added at the end.

        Raises:
            KeyError: a ``defaults`` or ``drop`` key the table does not have.
        """
        table = dict(self.keys)
        for key in drop:
            if key not in table:
                raise KeyError(f"{self.model_type} has no config key {key!r} to drop")
            del table[key]
        for key, value in defaults.items():
            if key not in table:
                raise KeyError(f"{self.model_type} has no config key {key!r} to give a default")
            table[key] = replace(table[key], default=value)
        table.update(keys)
        return table

    # ------------------------------------------------------------------ config -> spec
    def fields(self, r: HFConfig) -> dict[str, Any]:
        """The fields a config describes (the table's reads, then ``read_own``); errors are recorded in ``r``."""
        f = {name: copy.deepcopy(default) for name, (default, _) in FIELDS.items()}
        f.update(copy.deepcopy(dict(self.fixed)))
        for key, entry in self.keys.items():
            entry.read(r, f, key)
        if self.read_own is not None:
            self.read_own(r, f)
        return f

    def convert(self, cfg: dict) -> dict:
        """Hugging Face config → modkit spec dict (``metadata.hf_model_type`` set).

        Raises:
            SpecError: every unsupported field named with its value (with strict conversion, every unknown key too).
        """
        r = HFConfig(cfg, self.model_type)
        return r.finish(assemble(r, self.fields(r)))

    # ------------------------------------------------------------------ spec -> config
    def to_config(self, spec, base: Mapping[str, Any]) -> dict:
        """The architecture keys of the config for ``spec`` (every mapped row's write, then ``write_own``)."""
        f = fields_of(spec)
        cfg: dict[str, Any] = {}
        for key, entry in self.keys.items():
            cfg.update(entry.write(f, base, key))
        if self.write_own is not None:
            self.write_own(f, base, cfg)
        return cfg

    @property
    def carry(self) -> tuple[str, ...]:
        """The ignored keys an export keeps from the source config."""
        return tuple(k for k, e in self.keys.items() if isinstance(e, Ignore) and e.carry)

    @cached_property
    def weights(self) -> HFWeights:
        """The checkpoint mapper (:class:`modkit.io.checkpoint.WeightMapper`) built from both tables."""
        tensors = self.tensors
        return HFWeights(
            model_type=self.model_type,
            convert=self.convert,
            make_links=lambda spec, shapes, config: table_links(tensors, spec, shapes, config),
            to_config=self.to_config,
            keep=self.keep,
            aliases=self.aliases,
            carry=self.carry,
            architecture=self.architecture,
            checkpoint_layout=self.checkpoint_layout,
        )

    # ------------------------------------------------------------------ docs
    def supports(self) -> list[str]:
        """What the type converts, read from its tables: a label of :data:`FEATURES` for every field a config row can
        set or a fixed value sets away from the default, then the position scheme, the placement, the norm, the
        encoder mask and the checkpoint layouts (fused or stacked tensors)."""
        fixed = {k: v for k, v in self.fixed.items() if v != FIELDS[k][0]}
        settable = {name for entry in self.keys.values() for name in entry.sets()}
        have = settable | set(fixed)
        out = [label for label, names in FEATURES if have & set(names)]
        if "position" in settable:
            out.append("RoPE scalings")
        if any(getattr(e, "layout", "half_split") != "half_split" for e in self.keys.values()):
            out.append("interleaved RoPE")
        position = fixed.get("position") or {}
        if position.get("type") == "learned":
            out.append("learned positions")
        placement = fixed.get("placement") or {}
        if "placement" in settable:
            out.append("parallel or sequential blocks")
        elif placement.get("type") in PLACEMENTS:
            out.append(PLACEMENTS[placement["type"]])
        if "ffn" in fixed and fixed["ffn"] is None:
            out.append("no FFN")
        if fixed.get("norm") == "layernorm":
            out.append("LayerNorm")
        if fixed.get("causal") is False:
            out.append("encoder (bidirectional)")
        transforms = {type(getattr(e, "transform", RENAME)) for e in self.tensors}
        if transforms - {type(RENAME), StackExperts} - {t for t in transforms if t.__name__ == "Transpose"}:
            out.append("fused weights")
        if StackExperts in transforms:
            out.append("per-expert tensors")
        return out

    def describe(self) -> dict[str, Any]:
        """What the reference page shows: ``parent``, ``notes``, ``module``, ``config`` rows ``(key, status, default,
        becomes)``, ``fixed`` fields, ``weights`` rows ``(modkit name, Hugging Face name, layout)`` and ``supports``
        (:meth:`supports`)."""
        rows = [row for key, entry in self.keys.items() for row in entry.describe(key)]
        tensors = []
        for e in self.tensors:
            describe = getattr(getattr(e, "transform", None), "describe", None)
            how = describe() if describe else "the head (optional when tied)"
            if getattr(e, "when", None) is not None:
                how += " (depending on the config)"
            hf = e.hf if isinstance(e.hf, str) else ", ".join(e.hf)
            tensors.append((", ".join(e.ours), hf, how))
        return {
            "parent": self.parent,
            "notes": self.notes,
            "module": self.module,
            "config": rows,
            "fixed": dict(self.fixed),
            "weights": tensors,
            "supports": self.supports(),
        }

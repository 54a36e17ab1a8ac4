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
from ._weights import HFWeights, table_links, weight_table


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
        table = dict(self.keys)
        for key in drop:
            if key not in table:
                raise KeyError(f"{self.model_type} has no config key {key!r} to drop")
            del table[key]
        for key, value in (defaults or {}).items():
            if key not in table:
                raise KeyError(f"{self.model_type} has no config key {key!r} to give a default")
            table[key] = replace(table[key], default=value)
        table.update(keys or {})
        return replace(
            self,
            model_type=model_type,
            architecture=architecture,
            notes=notes,
            keys=table,
            fixed={**self.fixed, **(fixed or {})},
            tensors=weight_table(self.tensors, *(tensors or ()), drop=drop_tensors),
            parent=self.model_type,
            module=sys._getframe(1).f_globals.get("__name__", ""),
            **changes,
        )

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
        """The checkpoint mapper (:class:`modkit.checkpoint.WeightMapper`) built from both tables."""
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
    def describe(self) -> dict[str, Any]:
        """What the reference page shows: ``parent``, ``notes``, ``module``, ``config`` rows ``(key, status, default,
        becomes)``, ``fixed`` fields and ``weights`` rows ``(modkit name, Hugging Face name, layout)``."""
        rows = [row for key, entry in self.keys.items() for row in entry.describe(key)]
        tensors = []
        for e in self.tensors:
            describe = getattr(getattr(e, "transform", None), "describe", None)
            how = describe() if describe else "the head (optional when tied)"
            if getattr(e, "when", None) is not None:
                how += " (depending on the config)"
            hf = e.hf if isinstance(e.hf, str) else ", ".join(e.hf)
            tensors.append((", ".join(e.ours), hf, how))
        return {"parent": self.parent, "notes": self.notes, "module": self.module, "config": rows,
                "fixed": dict(self.fixed), "weights": tensors}

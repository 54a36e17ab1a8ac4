"""Config-table rows that read several keys that only mean something together: the attention heads
(:class:`HeadDim`, :class:`KVHeads`) and RoPE (:class:`Rope`, :class:`RopeByLayerType`, through :mod:`._rope`).
What a table is and how its rows are used: :mod:`._keys`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Mapping, Optional

from ._key_rows import Entry, _text
from ._reader import HFConfig
from ._rope import rope, rope_fields

# ---------------------------------------------------------------------------------------------- heads


def _divisible(r: HFConfig, d: int, n: int, extra: str = "") -> None:
    d_key, n_key = r.key_of.get("d_model", "hidden_size"), r.key_of.get("n_heads", "num_attention_heads")
    if d % n:
        r.error(n_key, f"{d_key} = {d} is not divisible by {n_key} = {n}{extra}")


@dataclass(frozen=True)
class HeadDim(Entry):
    """``head_dim``: the config's value, else ``default``, else ``d_model // n_heads`` (transformers' fallback).

    ``derived`` (a reason): the type always derives ``head_dim = d_model // n_heads`` and refuses another value
    (Phi, OLMoE size their norms from it). ``in_config=False``: the config has no such key (GPT-2, BERT, Falcon).
    """

    SETS: ClassVar[tuple[str, ...]] = ("head_dim",)

    default: Optional[int] = None
    derived: Optional[str] = None
    in_config: bool = True

    def config_keys(self, name):
        return (name,) if self.in_config else ()

    def read(self, r, f, name):
        d, n = f["d_model"], f["n_heads"]
        if not self.in_config or self.derived:
            _divisible(r, d, n)
            f["head_dim"] = d // n
            if self.derived:
                r.expect(name, d // n, self.derived)
            return
        value = r.number(name, self.default, integer=True)
        if value is None:
            _divisible(r, d, n, " and head_dim is not given")
            value = d // n
        f["head_dim"] = value

    def write(self, f, base, name):
        if not self.in_config or self.derived:
            return {}
        hd = f["head_dim"]
        if hd is None:  # no attention layer (a recurrent model): the source config's value, if any
            return {name: base[name]} if base.get(name) is not None else {}
        return {name: hd} if self.default is not None or hd != f["d_model"] // f["n_heads"] else {}

    def describe(self, name):
        derived = "hidden_size // num_attention_heads"
        if not self.in_config:
            return [("(no key)", "mapped", "–", f"`head_dim` = {derived}")]
        if self.derived:
            return [(f"`{name}`", "refused", derived, f"only {derived}: {self.derived}")]
        return [(f"`{name}`", "mapped", _text(self.default) if self.default is not None else derived, "`head_dim`")]


@dataclass(frozen=True)
class KVHeads(Entry):
    """The key/value head count (absent or null: ``default``, else ``n_heads``), checked to divide ``n_heads``."""

    SETS: ClassVar[tuple[str, ...]] = ("n_kv_heads",)

    default: Optional[int] = None

    def read(self, r, f, name):
        n = f["n_heads"]
        kv = r.number(name, self.default, integer=True)
        kv = n if kv is None else kv
        if n % kv:
            r.error(name, f"{name} = {kv} does not divide {r.key_of.get('n_heads', 'num_attention_heads')} = {n}")
        f["n_kv_heads"] = kv

    def write(self, f, base, name):
        kv = f["n_kv_heads"]
        if kv is None:  # no attention layer (a recurrent model): the source config's value, else the default
            kv = base.get(name) or self.default
        return {name: kv} if kv is not None else {}

    def describe(self, name):
        return [(f"`{name}`", "mapped", _text(self.default) if self.default is not None else "n_heads", "`n_kv_heads`")]


# ---------------------------------------------------------------------------------------------- RoPE

#: the keys of one RoPE: transformers 5's dict, and the 4.x top-level keys
ROPE_KEYS = ("rope_parameters", "rope_theta", "rope_scaling", "partial_rotary_factor")


@dataclass(frozen=True)
class Rope(Entry):
    """One RoPE for every layer, from ``rope_parameters`` (transformers 5) or ``rope_theta`` + ``rope_scaling`` +
    ``partial_rotary_factor`` (4.x files); see :func:`._rope.rope` for the scalings.

    Attributes:
        default: ``rope_theta`` when absent.
        partial: ``partial_rotary_factor`` when absent (Phi: 0.5).
        original_at_top: the config class holds ``original_max_position_embeddings`` at the top level, which wins
            over the scaling dict's and is written there on export (Phi-3).
        always_partial: write ``partial_rotary_factor`` even when it is 1 (when the class default is not 1).
        layout: the layout of the rotated pairs in the checkpoint's q/k rows (GLM: ``interleaved``).
        theta_key, partial_key: the 4.x top-level keys of the base and of the rotated fraction (GPT-NeoX:
            ``rotary_emb_base``, ``rotary_pct``), read under ``rope_parameters``' values and written on export.
        default_parameters: the ``rope_parameters`` a config class assumes when a config has neither them nor
            ``rope_scaling`` (gpt-oss: YaRN, factor 32); an export then writes ``rope_parameters`` too.
        ntk_alpha: ``dynamic`` scaling with an ``alpha`` is the static NTK-alpha base (Hunyuan).
    """

    SETS: ClassVar[tuple[str, ...]] = ("position",)

    default: float = 10000.0
    partial: float = 1.0
    original_at_top: bool = False
    always_partial: bool = False
    layout: str = "half_split"
    theta_key: str = "rope_theta"
    partial_key: str = "partial_rotary_factor"
    default_parameters: Optional[Mapping[str, Any]] = None
    ntk_alpha: bool = False

    def config_keys(self, name):
        keys = ("rope_parameters", self.theta_key, "rope_scaling", self.partial_key)
        return keys + (("original_max_position_embeddings",) if self.original_at_top else ())

    def read(self, r, f, name):
        f["position"] = rope(
            r,
            default_theta=self.default,
            default_partial=self.partial,
            layout=self.layout,
            original_at_top=self.original_at_top,
            max_seq_len=f["max_seq_len"],
            theta_key=self.theta_key,
            partial_key=self.partial_key,
            default_parameters=dict(self.default_parameters or {}),
            ntk_alpha=self.ntk_alpha,
        )

    def write(self, f, base, name):
        out = rope_fields(
            f["position"],
            original_at_top=self.original_at_top,
            always_partial=self.always_partial,
            theta_key=self.theta_key,
            partial_key=self.partial_key,
        )
        if self.default_parameters and out:  # a null rope_scaling would mean the class default: say "default"
            out["rope_parameters"] = rope_parameters(f["position"])
        return out

    def describe(self, name):
        keys = f"`rope_parameters` / `{self.theta_key}`, `rope_scaling`, `{self.partial_key}`"
        if self.original_at_top:
            keys += ", `original_max_position_embeddings`"
        how = "`position` (rope: theta, partial rotary, scaling linear / llama3 / dynamic / yarn / longrope)"
        if self.layout != "half_split":
            how += f", {self.layout} pairs"
        default = f"theta {self.default:g}" + (f", partial {self.partial:g}" if self.partial != 1 else "")
        if self.default_parameters:
            extra = ", ".join(f"{k} {v}" for k, v in self.default_parameters.items() if k != "rope_theta")
            default += f" ({extra})"
        return [(keys, "mapped", default, how)]


@dataclass(frozen=True)
class RopeByLayerType(Entry):
    """Two RoPEs: one for ``full_attention`` layers (``default`` base, with the scaling), one for
    ``sliding_attention`` layers (``local_default`` base; 4.x files hold it at ``local_key``, without scaling),
    from ``rope_parameters`` nested per layer type (transformers 5) or the 4.x top-level keys (Gemma 3, OLMo 3).

    ``nested``: export writes ``rope_parameters`` nested per layer type (when ``local_key`` is ``rope_theta``
    itself, the 4.x form cannot hold two bases).
    """

    SETS: ClassVar[tuple[str, ...]] = ("position", "position_by_type")

    default: float = 1_000_000.0
    local_default: float = 10_000.0
    local_key: str = "rope_local_base_freq"
    nested: bool = False

    def config_keys(self, name):
        return tuple(dict.fromkeys(ROPE_KEYS + (self.local_key,)))

    def read(self, r, f, name):
        local = rope(
            r,
            default_theta=self.local_default,
            layer_type="sliding_attention",
            theta_key=self.local_key,
            scaling_key=None,
            max_seq_len=f["max_seq_len"],
        )
        glob = rope(r, default_theta=self.default, layer_type="full_attention", max_seq_len=f["max_seq_len"])
        f["position"] = glob
        f["position_by_type"] = {"sliding_attention": local, "full_attention": glob}

    def write(self, f, base, name):
        by_type = f["position_by_type"]
        glob, loc = by_type.get("full_attention"), by_type.get("sliding_attention")
        if self.nested:
            return {
                "rope_parameters": {
                    t: rope_parameters(p)
                    for t, p in (("full_attention", glob or loc), ("sliding_attention", loc or glob))
                }
            }
        cfg = rope_fields(glob) if glob is not None else {"rope_theta": self.default, "rope_scaling": None}
        if loc is not None:
            local = rope_fields(loc, theta_key=self.local_key, scaling_key=None)
            cfg[self.local_key] = local.get(self.local_key, self.local_default)
            if glob is None and "partial_rotary_factor" in local:
                cfg["partial_rotary_factor"] = local["partial_rotary_factor"]
        return cfg

    def describe(self, name):
        keys = f"`rope_parameters` / `rope_theta`, `rope_scaling`, `{self.local_key}`"
        how = "`position` of full-attention layers (with the scaling) and of sliding layers (without)"
        return [(keys, "mapped", f"theta {self.default:g} (full), {self.local_default:g} (sliding)", how)]


def rope_parameters(position) -> dict:
    """A ``rope`` position spec as one transformers 5 ``rope_parameters`` dict (``rope_type``, ``rope_theta``,
    the scaling's keys, ``partial_rotary_factor``); ``partial_mode: proportional`` is ``rope_type: proportional``."""
    legacy = rope_fields(position)
    out = {"rope_type": "default", "rope_theta": legacy.pop("rope_theta")}
    scaling = legacy.pop("rope_scaling", None) or {}
    out.update(scaling)
    out.update(legacy)
    if getattr(position, "partial_mode", "leading") == "proportional":  # a linear factor rides along as its factor
        out["rope_type"] = "proportional"
    return out

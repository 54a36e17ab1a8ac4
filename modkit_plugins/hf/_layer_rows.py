"""Config-table rows about the layers: which type each layer is and its sliding window (:class:`SlidingWindow`,
:class:`QwenWindows`, :class:`LayerTypes`, :class:`UseSlidingWindow`), and which layers hold a mixture of experts
(:class:`SparseStep`, :class:`FirstDense`). What a table is and how its rows are used: :mod:`._keys`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Mapping, Optional

from modkit.plugin import json_value

from ._key_rows import LAYER_TYPES, Entry, _read, _text
from ._reader import HFConfig

# ---------------------------------------------------------------------------------------------- layers


def _types(r: HFConfig, types: Any, n_layers: int, allowed: tuple[str, ...] = LAYER_TYPES) -> Optional[list]:
    """``layer_types`` checked: one known type per layer (``None`` after an error on its shape)."""
    if not isinstance(types, list) or len(types) != n_layers:
        r.error("layer_types", f"must list one type per layer ({n_layers}), got {json_value(types)}")
        return None
    bad = sorted({t for t in types if t not in allowed}, key=str)
    if bad:
        r.error("layer_types", f"unsupported layer types {bad}; supported: {', '.join(repr(a) for a in allowed)}")
    return types


def _types_of(f: Mapping[str, Any]) -> list[str]:
    return ["sliding_attention" if w is not None else "full_attention" for w in f["windows"]]


@dataclass(frozen=True)
class SlidingWindow(Entry):
    """``sliding_window`` on every layer (a present null: global attention everywhere, as transformers' mask then
    is; Mistral, Mixtral, Phi-3)."""

    SETS: ClassVar[tuple[str, ...]] = ("layer_types", "sliding_window")

    default: Optional[int] = None

    def read(self, r, f, name):
        window = _read(r, name, "window", self.default, ())
        f["sliding_window"] = window
        f["layer_types"] = None if window is None else ["sliding_attention"] * f["n_layers"]

    def write(self, f, base, name):
        return {name: f["windows"][0]}

    def describe(self, name):
        return [(f"`{name}`", "mapped", _text(self.default), "`sliding_window` of every layer (null: global)")]


@dataclass(frozen=True)
class QwenWindows(Entry):
    """Qwen's windows: ``sliding_window`` applies only with ``use_sliding_window``, then on the layers that
    ``layer_types`` marks ``sliding_attention`` or, in files without ``layer_types``, on every layer from
    ``max_window_layers`` on (``Qwen2Config.__post_init__``); with ``alternate`` (Qwen2-MoE), on every other layer
    (0, 2, 4, ...) below ``max_window_layers`` (``Qwen2MoeConfig.__post_init__``). Without ``use_sliding_window`` the
    window is not read (Qwen2-MoE writes 0 there). Export writes ``layer_types`` and, when the sliding layers form a
    suffix, the matching ``max_window_layers``."""

    SETS: ClassVar[tuple[str, ...]] = ("layer_types", "sliding_window")

    default: Optional[int] = 4096
    max_window_layers: int = 28
    alternate: bool = False

    def config_keys(self, name):
        return ("use_sliding_window", name, "max_window_layers", "layer_types")

    def read(self, r, f, name):
        n = f["n_layers"]
        use = r.flag("use_sliding_window", False)
        # a present null: no window (Qwen2Config.__post_init__); not read at all without use_sliding_window
        window = _read(r, name, "window", self.default, ()) if use else r.get(name) and None
        first = r.number("max_window_layers", self.max_window_layers, integer=True, positive=False)
        types = r.get("layer_types")
        f["layer_types"], f["sliding_window"] = None, window
        if not use or window is None:
            return
        if types is not None:
            f["layer_types"] = _types(r, types, n)
            return
        if self.alternate:
            slides = [i % 2 == 0 and i < (first or 0) for i in range(n)]
        else:
            slides = [i >= (first or 0) for i in range(n)]
        f["layer_types"] = ["sliding_attention" if s else "full_attention" for s in slides]

    def write(self, f, base, name):
        windows = f["windows"]
        sliding = [w for w in windows if w is not None]
        if not sliding:
            return {"use_sliding_window": False, name: None, "max_window_layers": f["n_layers"]}
        first = next(i for i, w in enumerate(windows) if w is not None)
        suffix = all(w is not None for w in windows[first:])
        return {
            "use_sliding_window": True,
            name: sliding[0],
            "layer_types": _types_of(f),
            "max_window_layers": first if suffix else f["n_layers"],
        }

    def describe(self, name):
        where = (
            f"every other layer below {self.max_window_layers}"
            if self.alternate
            else f"from layer {self.max_window_layers}"
        )
        return [
            (
                "`use_sliding_window`, `sliding_window`, `max_window_layers`, `layer_types`",
                "mapped",
                f"off; window {self.default}, {where}",
                "`sliding_window` of the sliding layers (per-layer overrides)",
            )
        ]


@dataclass(frozen=True)
class LayerTypes(Entry):
    """``layer_types`` (transformers 5), else layer ``i`` slides unless ``(i + 1) % pattern == 0``; sliding layers use
    ``sliding_window`` (Gemma 2: every other layer; Gemma 3: ``sliding_window_pattern``, default 6; OLMo 3: 4).

    ``pattern_key``: the 4.x config key holding the pattern (read whenever present; also under ``_`` + the key).
    """

    SETS: ClassVar[tuple[str, ...]] = ("layer_types", "sliding_window")

    default: Optional[int] = 4096
    pattern: int = 2
    pattern_key: Optional[str] = None

    def config_keys(self, name):
        pattern = (self.pattern_key, "_" + self.pattern_key) if self.pattern_key else ()
        return (name, "sliding_window", *pattern)

    def read(self, r, f, name):
        n = f["n_layers"]
        pattern = self.pattern
        if self.pattern_key:
            pattern = r.number(self.pattern_key, self.pattern, aliases=("_" + self.pattern_key,), integer=True)
        window = _read(r, "sliding_window", "window", self.default, ())
        types = r.get(name)
        if types is None:  # transformers derives layer_types from the pattern when they are absent
            types = ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(n)]
        f["layer_types"] = _types(r, types, n)
        f["sliding_window"] = window
        if window is None and "sliding_attention" in (f["layer_types"] or ()):
            r.error(
                "sliding_window",
                f"is null, but {name} has sliding_attention layers, whose mask transformers cannot "
                "build without a window; give the window or mark those layers full_attention",
            )

    def write(self, f, base, name):
        window = next((w for w in f["windows"] if w is not None), base.get("sliding_window") or self.default)
        return {name: _types_of(f), "sliding_window": window}

    def describe(self, name):
        keys = "`layer_types`, `sliding_window`" + (f", `{self.pattern_key}`" if self.pattern_key else "")
        return [
            (
                keys,
                "mapped",
                f"window {self.default}; every layer but each {self.pattern}th slides",
                "`sliding_window` per layer (overrides)",
            )
        ]


@dataclass(frozen=True)
class UseSlidingWindow(Entry):
    """``sliding_window`` on every layer, only with ``use_sliding_window`` (Qwen3-MoE: ``Qwen3MoeConfig`` sets the window
    to null otherwise, and its attention and mask then read it for every layer)."""

    SETS: ClassVar[tuple[str, ...]] = ("layer_types", "sliding_window")

    default: Optional[int] = 4096

    def config_keys(self, name):
        return ("use_sliding_window", name)

    def read(self, r, f, name):
        use = r.flag("use_sliding_window", False)
        window = _read(r, name, "window", self.default, ())
        on = use and window is not None
        f["sliding_window"] = window if on else None
        f["layer_types"] = ["sliding_attention"] * f["n_layers"] if on else None

    def write(self, f, base, name):
        windows = f["windows"]
        if windows[0] is None:
            return {"use_sliding_window": False, name: base.get(name, self.default)}
        return {"use_sliding_window": True, name: windows[0]}

    def describe(self, name):
        return [
            (
                "`use_sliding_window`, `sliding_window`",
                "mapped",
                f"off; window {self.default}",
                "`sliding_window` of every layer when use_sliding_window",
            )
        ]


# ---------------------------------------------------------------------------------------------- MoE layers


def _experts(f: Mapping[str, Any]) -> int:
    return f["n_experts"] or 0


@dataclass(frozen=True)
class SparseStep(Entry):
    """Qwen-MoE's mixture layers: layer ``i`` is a mixture iff ``num_experts > 0``, ``(i + 1) % decoder_sparse_step ==
    0`` and ``i`` is not in ``mlp_only_layers``; the others are dense FFNs of ``intermediate_size``
    (``Qwen2MoeDecoderLayer``, ``Qwen3MoeDecoderLayer``). Export writes the source's step when it explains the
    mixture layers, else 1, and lists every other dense layer in ``mlp_only_layers``."""

    SETS: ClassVar[tuple[str, ...]] = ("moe", "moe_layers")

    def config_keys(self, name):
        return (name, "mlp_only_layers")

    def read(self, r, f, name):
        n = f["n_layers"]
        step = r.number(name, 1, integer=True)
        only = r.get("mlp_only_layers", [])
        if not (isinstance(only, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in only)):
            r.error("mlp_only_layers", f"must list layer indices, got {json_value(only)}")
            only = []
        bad = sorted({i for i in only if not 0 <= i < n})
        if bad:
            r.error("mlp_only_layers", f"layers {bad} outside 0..{n - 1} (num_hidden_layers = {n})")
        flags = [_experts(f) > 0 and (i + 1) % (step or 1) == 0 and i not in only for i in range(n)]
        f["moe"] = any(flags)
        f["moe_layers"] = flags

    def write(self, f, base, name):
        flags = f["moe_layers"] if f["moe"] else [False] * f["n_layers"]
        for step in dict.fromkeys((base.get(name) or 1, 1)):
            explained = [(i + 1) % step == 0 for i in range(len(flags))]
            if all(e or not m for e, m in zip(explained, flags)):
                return {
                    name: step,
                    "mlp_only_layers": [i for i, (e, m) in enumerate(zip(explained, flags)) if e and not m],
                }
        raise AssertionError("a step of 1 explains every layer")

    def describe(self, name):
        return [
            (
                "`decoder_sparse_step`, `mlp_only_layers`",
                "mapped",
                "every layer a mixture",
                "`moe_layers`: a mixture where (i + 1) % step = 0 and i is not listed, else a dense FFN of d_ff",
            )
        ]


@dataclass(frozen=True)
class FirstDense(Entry):
    """DeepSeek's mixture layers: the first ``first_k_dense_replace`` layers are dense FFNs of ``intermediate_size``,
    every later one a mixture (``DeepseekV3DecoderLayer``)."""

    SETS: ClassVar[tuple[str, ...]] = ("moe", "moe_layers")

    default: int = 3

    def read(self, r, f, name):
        n = f["n_layers"]
        k = r.number(name, self.default, integer=True, positive=False, minimum=0)
        flags = [i >= (k or 0) for i in range(n)]
        f["moe"], f["moe_layers"] = any(flags), flags

    def write(self, f, base, name):
        flags = f["moe_layers"] if f["moe"] else [False] * f["n_layers"]
        k = next((i for i, m in enumerate(flags) if m), len(flags))
        return {name: k}

    def describe(self, name):
        return [
            (
                f"`{name}`",
                "mapped",
                _text(self.default),
                "`moe_layers`: dense FFNs of d_ff on the first k layers, mixtures after",
            )
        ]

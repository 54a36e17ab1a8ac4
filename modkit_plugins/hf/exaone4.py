"""Hugging Face ``exaone4`` (LG EXAONE 4.0) → modkit: OLMo 2's blocks (norms on the sublayer outputs) with a
per-head QK-norm, three sliding-window layers out of four, and no rotary embedding (NoPE) on the full layers.

Semantics: ``transformers/models/exaone4/{configuration,modular}_exaone4.py``:

* ``Exaone4DecoderLayer`` is OLMo 2's: ``x + post_attention_layernorm(attn(x))`` then
  ``x + post_feedforward_layernorm(mlp(x))``; SwiGLU MLP without biases; no attention biases;
* ``Exaone4Attention``: ``q_norm`` / ``k_norm`` RMSNorms over ``head_dim`` (``hidden_size //
  num_attention_heads``) before RoPE; RoPE only ``if sliding_window is None or is_sliding``: with a window, the
  ``full_attention`` layers are NoPE (``position: none`` as a per-layer override), without one every layer
  rotates;
* ``layer_types`` (default: layer ``i`` is ``full_attention`` iff ``(i + 1) % sliding_window_pattern == 0``,
  pattern 4; ``sliding_window`` default 4096; a null window sets the pattern to 0, so the layer types must then
  be given, all ``full_attention``); one RoPE (``rope_parameters``, base 10000) for the rotating layers.
"""

from __future__ import annotations

from dataclasses import dataclass

from ._keys import Entry, _read, _types
from ._rope import rope_fields
from .olmo2 import OLMO2

MODEL_TYPE = "exaone4"


@dataclass(frozen=True)
class NoPEOnFullLayers(Entry):
    """``layer_types``, ``sliding_window``, ``sliding_window_pattern`` → the sliding layers and, with a window, NoPE
    on the full layers (``positions``)."""

    SETS = ("layer_types", "sliding_window", "positions")

    default: int = 4096
    pattern: int = 4

    def config_keys(self, name):
        return (name, "sliding_window", "sliding_window_pattern")

    def read(self, r, f, name):
        n = f["n_layers"]
        window = _read(r, "sliding_window", "window", self.default, ())
        pattern = r.number("sliding_window_pattern", self.pattern, integer=True)
        types = r.get(name)
        if types is None:
            if window is None or not pattern:
                r.error(
                    name,
                    "is absent while sliding_window is null (Exaone4Config then derives it from a pattern of 0, "
                    "which fails); list one type per layer",
                )
                types = ["full_attention"] * n
            else:
                types = ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(n)]
        types = _types(r, types, n, ("full_attention", "sliding_attention"))
        if types and window is None and "sliding_attention" in types:
            r.error(
                "sliding_window",
                f"is null, but {name} has sliding_attention layers, whose mask transformers cannot build without a "
                "window; give the window or mark those layers full_attention",
            )
        f["layer_types"], f["sliding_window"] = types, window
        nope = window is not None
        f["positions"] = [
            {"type": "none"} if nope and t == "full_attention" else f["position"] for t in types or ["x"] * n
        ]

    def write(self, f, base, name):
        windows = f["windows"]
        nope = any(getattr(p, "type", None) == "none" for p in f["positions"])
        window = next((w for w in windows if w is not None), None)
        if window is None and nope:
            window = base.get("sliding_window") or self.default
        out = {
            name: ["sliding_attention" if w is not None else "full_attention" for w in windows],
            "sliding_window": window,
            "sliding_window_pattern": base.get("sliding_window_pattern") or self.pattern,
        }
        rotating = next((p for p in f["positions"] if getattr(p, "type", None) == "rope"), None)
        if rotating is not None and getattr(f["position"], "type", None) != "rope":
            out.update(rope_fields(rotating))  # layer 0 is NoPE: the RoPE row wrote nothing, the rotating layers' RoPE
        return out

    def describe(self, name):
        return [
            (
                "`layer_types`, `sliding_window`, `sliding_window_pattern`",
                "mapped",
                f"window {self.default}; every layer but each {self.pattern}th slides",
                "`sliding_window` per layer, and `positions`: `none` on the full layers when there is a window "
                "(overrides)",
            )
        ]


EXAONE4 = OLMO2.derive(
    MODEL_TYPE,
    architecture="Exaone4ForCausalLM",
    notes=__doc__,
    drop=("attention_bias", "head_dim"),
    # transformers Exaone4Config defaults
    defaults={
        "vocab_size": 102400,
        "intermediate_size": 16384,
        "num_key_value_heads": 32,
        "rms_norm_eps": 1e-5,
    },
    keys={"layer_types": NoPEOnFullLayers()},
    fixed={"qk_norm": "head"},
)

TYPE = EXAONE4

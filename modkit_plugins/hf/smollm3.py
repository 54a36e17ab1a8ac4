"""Hugging Face ``smollm3`` → modkit: Llama with NoPE layers (no rotary embedding on every fourth layer) and
optional sliding windows.

Semantics: ``transformers/models/smollm3/{configuration,modeling}_smollm3.py``: ``no_rope_layers`` holds one flag
per layer, 1 for a RoPE layer and 0 for a NoPE layer (default: layer ``i`` is NoPE iff ``(i + 1) %
no_rope_layer_interval == 0``, interval 4); a NoPE layer's attention applies no rotation (``position: none`` as a
per-layer override). ``layer_types`` (default: ``sliding_attention`` on the NoPE layers when
``use_sliding_window`` and ``sliding_window`` are set, else ``full_attention``) chooses the sliding layers; the
attention slides only with ``use_sliding_window`` (``SmolLM3Attention``) while transformers' mask follows
``layer_types``, so sliding ``layer_types`` without ``use_sliding_window`` are refused. RoPE base 2,000,000.
"""

from __future__ import annotations

from dataclasses import dataclass

from modkit.plugin import json_value

from ._keys import Entry, _types
from .llama import LLAMA

MODEL_TYPE = "smollm3"


@dataclass(frozen=True)
class NoRopeLayers(Entry):
    """``no_rope_layers`` / ``no_rope_layer_interval`` → ``positions`` (NoPE layers); then the sliding layers."""

    SETS = ("positions", "layer_types", "sliding_window")

    default: int = 4

    def config_keys(self, name):
        return (name, "no_rope_layer_interval", "use_sliding_window", "sliding_window", "layer_types")

    def read(self, r, f, name):
        n = f["n_layers"]
        interval = r.number("no_rope_layer_interval", self.default, integer=True)
        flags = r.get(name)
        if flags is None:
            flags = [int((i + 1) % interval != 0) for i in range(n)]
        elif not (
            isinstance(flags, list) and len(flags) >= n and all(v in (0, 1) and not isinstance(v, float) for v in flags)
        ):
            r.error(name, f"must list 1 (RoPE) or 0 (NoPE) for each of the {n} layers, got {json_value(flags)}")
            flags = [1] * n
        f["positions"] = [f["position"] if flags[i] else {"type": "none"} for i in range(n)]
        # the sliding layers (SmolLM3Config.__post_init__, SmolLM3Attention)
        use = r.flag("use_sliding_window", False)
        window = r.number("sliding_window", None, integer=True)
        types = r.get("layer_types")
        if types is None:
            types = [
                "sliding_attention" if use and window is not None and not flags[i] else "full_attention"
                for i in range(n)
            ]
        types = _types(r, types, n)
        if types and "sliding_attention" in types and not (use and window is not None):
            r.error(
                "layer_types",
                "marks sliding_attention layers but use_sliding_window is false or sliding_window is "
                "null: transformers' attention would not slide there while its mask does; set both or mark them full",
            )
        f["layer_types"], f["sliding_window"] = types, window

    def write(self, f, base, name):
        flags = [0 if getattr(p, "type", None) == "none" else 1 for p in f["positions"]]
        windows = f["windows"]
        sliding = any(w is not None for w in windows)
        return {
            name: flags,
            "no_rope_layer_interval": base.get("no_rope_layer_interval") or self.default,
            "use_sliding_window": sliding,
            "sliding_window": f["sliding_window"],
            "layer_types": ["sliding_attention" if w is not None else "full_attention" for w in windows],
        }

    def describe(self, name):
        return [
            (
                "`no_rope_layers`, `no_rope_layer_interval`",
                "mapped",
                f"NoPE on every {self.default}th layer",
                "`positions`: `none` on NoPE layers (overrides)",
            ),
            (
                "`use_sliding_window`, `sliding_window`, `layer_types`",
                "mapped",
                "off",
                "`sliding_window` of the sliding layers (overrides)",
            ),
        ]


SMOLLM3 = LLAMA.derive(
    MODEL_TYPE,
    architecture="SmolLM3ForCausalLM",
    notes=__doc__,
    drop=("pretraining_tp",),
    # transformers SmolLM3Config defaults
    defaults={
        "vocab_size": 128256,
        "hidden_size": 2048,
        "num_hidden_layers": 36,
        "num_attention_heads": 16,
        "num_key_value_heads": 4,
        "max_position_embeddings": 32768,
        "tie_word_embeddings": True,
        "rope_theta": 2_000_000.0,
    },
    keys={"no_rope_layers": NoRopeLayers(4)},
)

TYPE = SMOLLM3

"""Hugging Face ``olmo3`` → modkit: OLMo 2's blocks (norms on the sublayer outputs, full-width QK-norm) with
three sliding-window layers out of four, each kind with its own RoPE.

Semantics: ``transformers/models/olmo3/{configuration,modeling}_olmo3.py`` (modular over OLMo 2): ``layer_types``
(default: layer ``i`` is ``full_attention`` iff ``(i + 1) % 4 == 0``, else ``sliding_attention`` with
``sliding_window``, default 4096); ``rope_parameters`` per layer type (``Olmo3RotaryEmbedding``, as Gemma 3's), base
500000 for both; a 4.x-style ``rope_scaling`` applies to the full-attention layers only, ``rope_theta`` to both.
Exports write ``rope_parameters`` nested per layer type, the form that holds two bases.
"""

from __future__ import annotations

from ._keys import LayerTypes, RopeByLayerType
from .olmo2 import OLMO2

MODEL_TYPE = "olmo3"

OLMO3 = OLMO2.derive(
    MODEL_TYPE,
    architecture="Olmo3ForCausalLM",
    notes=__doc__,
    keys={
        "rope_theta": RopeByLayerType(500_000.0, local_default=500_000.0, local_key="rope_theta", nested=True),
        "layer_types": LayerTypes(4096, pattern=4),
    },
)

TYPE = OLMO3

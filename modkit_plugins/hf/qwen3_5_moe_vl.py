"""Hugging Face ``qwen3_5_moe`` (Qwen3.5-MoE's vision-language checkpoints) → its language model, a
``qwen3_5_moe_text``.

Semantics: ``transformers/models/qwen3_5_moe/{configuration,modeling}_qwen3_5_moe.py``, laid out as ``qwen3_5``
(:mod:`.qwen3_5_vl`): the text model at ``model.language_model``, the head at ``lm_head`` (tied by the wrapper's
``tie_word_embeddings``, default false), the vision tower at ``model.visual`` (left out, counted in one notice).
An export writes ``qwen3_5_moe_text``.
"""

from __future__ import annotations

from ._wrapper import LanguageModelOf
from .qwen3_5_moe import QWEN3_5_MOE
from .qwen3_5_vl import VISION_KEYS

MODEL_TYPE = "qwen3_5_moe"

TYPE = LanguageModelOf(
    MODEL_TYPE,
    architecture="Qwen3_5MoeForConditionalGeneration",
    text=QWEN3_5_MOE,
    prefixes=(("model.", "model.language_model."), ("lm_head.", "lm_head.")),
    left_out=("model.visual.",),
    lifted={"tie_word_embeddings": False},
    ignore=VISION_KEYS,
    notes=__doc__,
)

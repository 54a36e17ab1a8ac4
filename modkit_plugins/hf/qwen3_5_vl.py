"""Hugging Face ``qwen3_5`` (Qwen3.5's vision-language checkpoints) → its language model, a ``qwen3_5_text``.

Semantics: ``transformers/models/qwen3_5/{configuration,modeling}_qwen3_5.py``: ``Qwen3_5Config`` holds the text
model's config under ``text_config`` and the vision tower's under ``vision_config``; ``Qwen3_5ForConditionalGeneration``
keeps the text model at ``model.language_model`` (its tensors ``model.language_model.*``), the head at ``lm_head``
(tied to the embedding by the wrapper's ``tie_word_embeddings``, default false) and the vision tower with its merger
at ``model.visual`` (left out, counted in one notice). On text alone the wrapper runs the text model: its
multimodal RoPE gives every section the same position. The published checkpoints' ``mtp.*`` tensors are kept as
the text type keeps them. An export writes ``qwen3_5_text``.
"""

from __future__ import annotations

from ._wrapper import LanguageModelOf
from .qwen3_5 import QWEN3_5

MODEL_TYPE = "qwen3_5"

#: the wrapper keys that describe the vision side, not the language model
VISION_KEYS = {
    "vision_config": "the vision tower (left out)",
    "image_token_id": "the image placeholder token (vision input only)",
    "video_token_id": "the video placeholder token (vision input only)",
    "vision_start_token_id": "a vision-input delimiter token",
    "vision_end_token_id": "a vision-input delimiter token",
}

TYPE = LanguageModelOf(
    MODEL_TYPE,
    architecture="Qwen3_5ForConditionalGeneration",
    text=QWEN3_5,
    prefixes=(("model.", "model.language_model."), ("lm_head.", "lm_head.")),
    left_out=("model.visual.",),
    lifted={"tie_word_embeddings": False},
    ignore=VISION_KEYS,
    notes=__doc__,
)

"""Hugging Face ``gemma3`` (Gemma 3's vision-language checkpoints) → its language model, a ``gemma3_text``.

Semantics: ``transformers/models/gemma3/{configuration,modeling}_gemma3.py``: ``Gemma3Config`` holds the text
model's config under ``text_config`` and the SigLIP vision tower's under ``vision_config``;
``Gemma3ForConditionalGeneration`` keeps the text model at ``model.language_model``, the head at ``lm_head`` (tied
by the wrapper's ``tie_word_embeddings``, default true), the vision tower at ``model.vision_tower`` and the projector
at ``model.multi_modal_projector`` (both left out, counted in one notice). transformers saves, and the published
checkpoints store, the older layout: ``language_model.model.*``, ``language_model.lm_head.weight``,
``vision_tower.*``, ``multi_modal_projector.*``; both are read. On text alone the wrapper runs the text model. An
export writes ``gemma3_text``.
"""

from __future__ import annotations

from ._wrapper import LanguageModelOf
from .gemma3_text import GEMMA3_TEXT

MODEL_TYPE = "gemma3"

TYPE = LanguageModelOf(
    MODEL_TYPE,
    architecture="Gemma3ForConditionalGeneration",
    text=GEMMA3_TEXT,
    prefixes=(("model.", "model.language_model."), ("lm_head.", "lm_head.")),
    alternatives=(("model.language_model.", "language_model.model."), ("lm_head.", "language_model.lm_head.")),
    left_out=("model.vision_tower.", "model.multi_modal_projector.", "vision_tower.", "multi_modal_projector."),
    lifted={"tie_word_embeddings": True},
    ignore={
        "vision_config": "the vision tower (left out)",
        "mm_tokens_per_image": "image tokens per image (vision input only)",
        "boi_token_index": "the begin-of-image token (vision input only)",
        "eoi_token_index": "the end-of-image token (vision input only)",
        "image_token_index": "the image placeholder token (vision input only)",
        "initializer_range": "the initialisation of the wrapper's own layers (the projector)",
    },
    notes=__doc__,
)

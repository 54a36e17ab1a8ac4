"""Hugging Face ``llama4`` (Llama 4's vision-language checkpoints) → its language model, a ``llama4_text``.

Semantics: ``transformers/models/llama4/{configuration,modeling}_llama4.py``: ``Llama4Config`` holds the text
model's config under ``text_config`` and the vision encoder's under ``vision_config``;
``Llama4ForConditionalGeneration`` keeps a whole ``Llama4ForCausalLM`` at ``language_model`` (its tensors
``language_model.model.*`` and ``language_model.lm_head.weight``, tied by the wrapper's ``tie_word_embeddings``,
default false), the vision encoder at ``vision_model`` and the projector at ``multi_modal_projector`` (both left
out, counted in one notice). On text alone the wrapper runs the causal LM. An export writes ``llama4_text``.
"""

from __future__ import annotations

from ._wrapper import LanguageModelOf
from .llama4_text import LLAMA4_TEXT

MODEL_TYPE = "llama4"

TYPE = LanguageModelOf(
    MODEL_TYPE,
    architecture="Llama4ForConditionalGeneration",
    text=LLAMA4_TEXT,
    prefixes=(("model.", "language_model.model."), ("lm_head.", "language_model.lm_head.")),
    left_out=("vision_model.", "multi_modal_projector."),
    lifted={"tie_word_embeddings": False},
    ignore={
        "vision_config": "the vision encoder (left out)",
        "boi_token_index": "the begin-of-image token (vision input only)",
        "eoi_token_index": "the end-of-image token (vision input only)",
        "image_token_index": "the image placeholder token (vision input only)",
    },
    notes=__doc__,
)

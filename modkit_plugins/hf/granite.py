"""Hugging Face ``granite`` (IBM Granite 3) → modkit: Llama with four μP-style multipliers.

Semantics: ``transformers/models/granite/{configuration,modeling}_granite.py`` (modular over Llama):

* ``embedding_multiplier``: token embeddings times it (``embedding_scale``; ``GraniteModel``);
* ``attention_multiplier``: the scores ``q·k`` times it in place of ``1 / sqrt(head_dim)`` (``softmax_scale``);
* ``residual_multiplier``: ``x + residual_multiplier · sublayer(...)`` in both residual adds of each block
  (the placement's ``residual_multiplier``; ``GraniteDecoderLayer``);
* ``logits_scaling``: the logits divided by it (``GraniteForCausalLM``), i.e. ``logit_scale = 1 / logits_scaling``.

Every multiplier at 1 is Llama. The export writes ``logits_scaling`` back as the shortest decimal whose inverse is
the spec's ``logit_scale`` (16, not 16.000000000000004).
"""

from __future__ import annotations

from ._keys import Key
from .llama import LLAMA

MODEL_TYPE = "granite"


def shortest_inverse(scale, f) -> float:
    """``logits_scaling`` for a ``logit_scale``: the shortest decimal ``v`` with ``1 / v == scale`` (1 for none)."""
    if scale is None:
        return 1.0
    for digits in range(1, 18):
        v = float(f"{1.0 / scale:.{digits}g}")
        if 1.0 / v == scale:
            return int(v) if v.is_integer() else v
    return 1.0 / scale


def _unless_one(value, f):
    return None if value == 1 else float(value)


GRANITE = LLAMA.derive(
    MODEL_TYPE,
    architecture="GraniteForCausalLM",
    notes=__doc__,
    drop=("pretraining_tp",),
    keys={
        "embedding_multiplier": Key(
            "embedding_scale",
            1.0,
            kind="number",
            read_as=_unless_one,
            write_as=lambda v, f: 1.0 if v is None else v,
            note="times the token embeddings",
        ),
        "logits_scaling": Key(
            "logit_scale",
            1.0,
            kind="number",
            read_as=lambda v, f: None if v == 1 else 1.0 / v,
            write_as=shortest_inverse,
            note="logit_scale = 1 / logits_scaling",
        ),
        "residual_multiplier": Key("residual_multiplier", 1.0, kind="number", note="of both residual adds"),
        "attention_multiplier": Key(
            "softmax_scale",
            1.0,
            kind="number",
            write_as=lambda v, f: f["head_dim"] ** -0.5 if v is None else v,
            note="replaces 1 / sqrt(head_dim)",
        ),
    },
)

TYPE = GRANITE

"""Hugging Face ``glm_moe_dsa`` (GLM-5) → modkit: DeepSeek-V3.2 (:mod:`.deepseek_v32`) whose indexer rotates
interleaved pairs and whose ``shared`` layers reuse the selection of the last ``full`` layer before them.

Semantics: ``transformers/models/glm_moe_dsa/{configuration,modeling}_glm_moe_dsa.py`` (``GlmMoeDsaIndexer``,
``GlmMoeDsaAttention``, ``GlmMoeDsaModel``):

* ``indexer_types`` lists ``full`` (the layer runs its own indexer) or ``shared`` (no indexer: the top-k of the
  previous layer is handed on) per layer; a ``shared`` layer becomes ``dsa`` with ``index_source`` = the last
  ``full`` layer before it (the first layer must be ``full``). transformers derives the list from
  ``index_topk_freq`` / ``index_skip_topk_offset`` or ``index_topk_pattern`` when it is absent, and writes it;
* the indexer applies interleaved RoPE (``index_rope_layout: interleaved``), DeepSeek-V3.2's half-split;
* the defaults are GLM-5's (``GlmMoeDsaConfig``): 78 layers of 6144, 64 heads, ``q_lora_rank`` 2048, values of 256,
  ``qk_nope_head_dim`` 192, 32 indexer heads, no expert groups, ``rms_norm_eps`` 1e-5; the multi-token-prediction
  layer (``model.layers.78``) is not part of the causal LM.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ._key_rows import Entry, _text
from .deepseek_v32 import DEEPSEEK_V32, SparseLatentAttention

MODEL_TYPE = "glm_moe_dsa"

#: ``GlmMoeDsaConfig``'s defaults of the latent and indexer keys (where they differ from DeepSeek's)
LATENT_DEFAULTS = (("q_lora_rank", 2048), ("qk_nope_head_dim", 192), ("v_head_dim", 256), ("index_n_heads", 32))


@dataclass(frozen=True)
class GlmLatentAttention(SparseLatentAttention):
    """DeepSeek-V3.2's rows with GLM-5's defaults and the indexer's interleaved RoPE."""

    def read(self, r, f, name):
        missing = {k: v for k, v in LATENT_DEFAULTS if k not in r.cfg}
        if missing:  # GLM-5's defaults for the keys the DeepSeek rows would default otherwise
            r.cfg = {**r.cfg, **missing}
        super().read(r, f, name)
        f["mla"] = {**f["mla"], "index_rope_layout": "interleaved"}


@dataclass(frozen=True)
class IndexerTypes(Entry):
    """``indexer_types``: ``full`` or ``shared`` per layer; a shared layer reuses the last full layer's selection."""

    #: sets ``attention_by_layer``, but only to give shared layers the dsa field ``index_source``: the reference
    #: page's summary reads it as part of the latent attention, not as Llama 4's per-layer attention features
    SETS: ClassVar[tuple[str, ...]] = ("mla",)

    def read(self, r, f, name):
        types = r.get(name)
        n = f["n_layers"]
        if types is None:
            return
        if not isinstance(types, list) or len(types) != n or set(types) - {"full", "shared"} or types[0] != "full":
            r.error(
                name, f"must list 'full' or 'shared' for each of the {n} layers, the first 'full'; got {_text(types)}"
            )
            return
        extras, source = [], 0
        for i, kind in enumerate(types):
            source = i if kind == "full" else source
            extras.append(None if kind == "full" else {"index_source": source})
        f["attention_by_layer"] = extras if any(extras) else None

    def write(self, f, base, name):
        atts = f.get("attentions") or [None] * f["n_layers"]
        return {name: ["full" if getattr(a, "index_source", None) is None else "shared" for a in atts]}

    def describe(self, name):
        return [(f"`{name}`", "mapped", "computed", "per layer: `shared` layers get `dsa.index_source`")]


GLM_MOE_DSA = DEEPSEEK_V32.derive(
    MODEL_TYPE,
    architecture="GlmMoeDsaForCausalLM",
    notes=__doc__,
    defaults={
        "vocab_size": 154880,
        "hidden_size": 6144,
        "intermediate_size": 12288,
        "num_hidden_layers": 78,
        "num_attention_heads": 64,
        "max_position_embeddings": 202752,
        "n_group": 1,
        "topk_group": 1,
        "rms_norm_eps": 1e-5,
    },
    keys={"q_lora_rank": GlmLatentAttention(), "indexer_types": IndexerTypes()},
    keep=((r"model\.layers\.78\..*", "GLM-5's multi-token-prediction layer (not computed by the causal LM)"),),
)

TYPE = GLM_MOE_DSA

"""Hugging Face ``deepseek_v32`` (DeepSeek-V3.2) → modkit: DeepSeek-V3 (:mod:`.deepseek_v3`) whose attention is
``dsa``, multi-head latent attention restricted per query to the ``index_topk`` keys a lightning indexer selects.

Semantics: ``transformers/models/deepseek_v32/{configuration,modeling}_deepseek_v32.py`` (``DeepseekV32Indexer``,
``DeepseekV32Attention``, ``DeepseekV32Config``):

* the indexer of every layer: ``index_n_heads`` query heads of ``index_head_dim`` from the query latent (``wq_b``),
  one key per token from the hidden state (``wk``, then a LayerNorm with a bias, eps 1e-6: ``k_norm``), head weights
  (``weights_proj``); RoPE on the first ``qk_rope_head_dim`` features in half-split pairs, while the attention's own
  rotated rows stay interleaved (transformers has no ``rope_interleave`` here: always interleaved). Each query keeps
  the ``index_topk`` best-scored keys (``dsa``'s ``index_topk``; ``index_rope_layout`` ``half_split``);
* the queries are always low-rank (``q_lora_rank`` null is refused: the indexer reads the query latent);
* ``mlp_layer_types`` lists ``dense`` / ``sparse`` per layer (derived from ``first_k_dense_replace`` when absent);
  ``layer_types`` is ``indexed_attention`` on every layer, the one kind transformers builds;
* the rest is DeepSeek-V3's: the mixture of experts, the router, the YaRN softmax-scale correction.

On disk the indexer is ``self_attn.indexer.{wq_b, wk, k_norm, weights_proj}``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ._key_rows import Entry, Ignore, _text
from ._spec import layernorm
from ._weights import W
from .deepseek_v3 import DEEPSEEK_V3, LatentAttention
from .llama import L

MODEL_TYPE = "deepseek_v32"

#: ``DeepseekV32Indexer``'s ``k_norm``: ``nn.LayerNorm(index_head_dim, eps=1e-6)``
INDEX_EPS = 1e-6
#: the one layer kind transformers' DeepseekV32Model builds
INDEXED = "indexed_attention"


@dataclass(frozen=True)
class SparseLatentAttention(LatentAttention):
    """DeepSeek-V3's latent attention rows with the indexer's (``index_n_heads``, ``index_head_dim``,
    ``index_topk``): a ``dsa`` config. The attention rotates interleaved rows whatever ``rope_interleave`` says."""

    SETS = ("mla", "position")
    KEYS = (
        *(k for k in LatentAttention.KEYS if k != "rope_interleave"),
        "index_n_heads",
        "index_head_dim",
        "index_topk",
    )

    def read(self, r, f, name):
        if name in r.cfg and r.cfg[name] is None:
            r.error(name, "is null, but DeepSeek-V3.2's indexer reads the query latent: give q_lora_rank a rank")
        super().read(r, f, name)
        f["position"] = {**f["position"], "layout": "interleaved"}
        f["mla"] = {
            **f["mla"],
            "type": "dsa",
            "index_n_heads": r.number("index_n_heads", 64, integer=True),
            "index_head_dim": r.number("index_head_dim", 128, integer=True),
            "index_topk": r.number("index_topk", 2048, integer=True),
            "index_norm": layernorm(INDEX_EPS, True),
        }

    def write(self, f, base, name):
        out = super().write(f, base, name)
        out.pop("rope_interleave")
        mla = f["mla"] or {}
        return {**out, **{k: mla.get(k) for k in ("index_n_heads", "index_head_dim", "index_topk")}}

    def describe(self, name):
        rows = [row for row in super().describe(name) if row[0] != "`rope_interleave`"]
        return rows + [
            (
                "`index_n_heads`, `index_head_dim`, `index_topk`",
                "mapped",
                "`64`, `128`, `2048`",
                "`dsa`: the lightning indexer (its key norm a LayerNorm with bias, eps 1e-6; half-split RoPE)",
            )
        ]


@dataclass(frozen=True)
class MlpLayerTypes(Entry):
    """``mlp_layer_types``: ``dense`` or ``sparse`` per layer, which wins over ``first_k_dense_replace``."""

    SETS: ClassVar[tuple[str, ...]] = ("moe", "moe_layers")

    def read(self, r, f, name):
        types = r.get(name)
        if types is None:
            return
        if not isinstance(types, list) or len(types) != f["n_layers"] or set(types) - {"dense", "sparse"}:
            r.error(name, f"must list 'dense' or 'sparse' for each of the {f['n_layers']} layers, got {_text(types)}")
            return
        flags = [t == "sparse" for t in types]
        f["moe"], f["moe_layers"] = any(flags), flags

    def write(self, f, base, name):
        flags = f["moe_layers"] if f["moe"] else [False] * f["n_layers"]
        return {name: ["sparse" if m else "dense" for m in flags]}

    def describe(self, name):
        return [(f"`{name}`", "mapped", "computed", "`moe_layers`: a mixture on 'sparse' layers, else a dense FFN")]


@dataclass(frozen=True)
class IndexedLayers(Entry):
    """``layer_types``: every layer ``indexed_attention`` (the kind transformers builds); anything else refused."""

    def read(self, r, f, name):
        types = r.get(name)
        if types is not None and (not isinstance(types, list) or set(types) != {INDEXED}):
            r.error(name, f"every layer of DeepSeek-V3.2 is {INDEXED!r} (DeepseekV32Model), got {_text(types)}")

    def write(self, f, base, name):
        return {name: [INDEXED] * f["n_layers"]}

    def describe(self, name):
        return [(f"`{name}`", "refused", "computed", f"only {INDEXED!r} on every layer")]


IDX = "layers.{i}.attention.indexer."

DEEPSEEK_V32 = DEEPSEEK_V3.derive(
    MODEL_TYPE,
    architecture="DeepseekV32ForCausalLM",
    notes=__doc__,
    defaults={"max_position_embeddings": 163840},
    keys={
        "q_lora_rank": SparseLatentAttention(),
        "mlp_layer_types": MlpLayerTypes(),
        "layer_types": IndexedLayers(),
        "mlp_bias": Ignore("DeepseekV32MLP builds its projections without biases whatever its value"),
    },
    tensors=(
        *(W(IDX + f"{x}.weight", L + f"self_attn.indexer.{x}.weight") for x in ("wq_b", "wk", "weights_proj")),
        W(IDX + "k_norm.{p}", L + "self_attn.indexer.k_norm.{p}"),
    ),
    checkpoint_layout="interleaved",
)

TYPE = DEEPSEEK_V32

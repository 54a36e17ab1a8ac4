"""DeepSeek-V4 written as a modkit spec (``specs/deepseek-v4.json``): its parameter count equals transformers' on
meta, and a tiny version of the same spec, given a tiny random ``DeepseekV4ForCausalLM``'s weights, computes its
float32 logits within 1e-5 and its greedy tokens with the cache.

The parts: the ``mhc`` stream (4 copies), ``compressed_attention`` (heavily compressed and compressed-sparse layers
with a lightning indexer), mixtures of ``swiglu_clamped`` experts (alpha 1, up_offset 0: DeepSeek-V4's clamp) with a
shared one, routed by token id (``hash``) on the first layer and by ``sqrtsoftplus_topk`` with a correction bias on
the others. Weights are mapped by hand here (the rows a converter would declare).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import modkit
from modkit.inference.generate import generate

transformers = pytest.importorskip("transformers")

SPEC = Path(__file__).resolve().parents[2] / "specs" / "deepseek-v4.json"
#: DeepseekV4Config() counted on meta (43 layers, d_model 4096, 256 experts), trainable parameters
FLAGSHIP = 284_325_869_015
HF = dict(
    vocab_size=97,
    hidden_size=32,
    num_hidden_layers=4,
    num_attention_heads=4,
    head_dim=16,
    q_lora_rank=12,
    qk_rope_head_dim=8,
    sliding_window=4,
    compress_rates={"compressed_sparse_attention": 2, "heavily_compressed_attention": 4},
    layer_types=["heavily_compressed_attention", "compressed_sparse_attention"] * 2,
    mlp_layer_types=["hash_moe", "moe", "moe", "moe"],
    o_groups=2,
    o_lora_rank=8,
    index_n_heads=8,
    index_head_dim=8,
    index_topk=2,
    n_routed_experts=4,
    num_experts_per_tok=2,
    moe_intermediate_size=16,
    max_position_embeddings=64,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=None,
)
SIZES = dict(n_heads=4, head_dim=16, q_lora_rank=12, rope_dim=8, window=4, o_groups=2, o_lora_rank=8)


def _tiny_spec() -> dict:
    """The flagship spec at the sizes of :data:`HF`: HCA (m 4) on even layers, CSA (m 2, indexer 8 x 8 keeping 2)
    on odd ones, 4 experts of 16 top-2, token-id routing on layer 0."""
    s = json.loads(SPEC.read_text())
    s.update(vocab_size=97, d_model=32, n_layers=4, max_seq_len=64)
    s["block"]["attention"].update(SIZES, compress_ratio=4)
    s["overrides"][0]["attention"].update(SIZES, compress_ratio=2, index_n_heads=8, index_head_dim=8, index_topk=2)
    s["overrides"][0]["layers"] = {"start": 1, "step": 2}
    s["overrides"][1]["layers"] = {"stop": 1}
    for f in (s["block"]["ffn"], s["overrides"][1]["ffn"]):
        f.update(n_experts=4, top_k=2, expert=dict(f["expert"], d_ff=16), shared=dict(f["shared"], d_ff=16))
    return s


RENAMES = (
    ("attention.indexer.compressor.", "self_attn.compressor.indexer."),
    ("attention.indexer.weights_proj", "self_attn.compressor.indexer.scorer.weights_proj"),
    ("attention.indexer.", "self_attn.compressor.indexer."),
    ("attention.", "self_attn."),
    ("attn_norm", "input_layernorm"),
    ("ffn_norm", "post_attention_layernorm"),
    ("ffn.shared.gate", "mlp.shared_experts.gate_proj"),
    ("ffn.shared.up", "mlp.shared_experts.up_proj"),
    ("ffn.shared.down", "mlp.shared_experts.down_proj"),
    ("ffn.router.proj", "mlp.gate"),
    ("ffn.router.table", "mlp.gate.tid2eid"),
    ("ffn.router.correction_bias", "mlp.gate.e_score_correction_bias"),
)


def _hf_name(name: str) -> str:
    """transformers' state-dict name of a modkit parameter or buffer (experts apart)."""
    for a, b in RENAMES:
        name = name.replace(a, b)
    if name.endswith(("q_a_norm", "kv_norm")):
        name += ".weight"
    top = {"final_norm.weight": "model.norm.weight", "embed.weight": "model.embed_tokens.weight"}
    if name.startswith("stream."):
        return "model.hc_head." + name[len("stream.") :]
    return top.get(name, "model." + name if name.startswith("layers.") else name)


def _load(model, hf) -> None:
    """Copy transformers' weights into ``model``: experts' fused ``gate_up_proj [E, 2I, d]`` split and transposed to
    modkit's ``[E, d, I]``, ``down_proj [E, d, I]`` transposed."""
    sd = hf.state_dict()
    with torch.no_grad():
        for n, t in [*model.named_parameters(), *model.named_buffers()]:
            if n.endswith("expert_load"):  # modkit's balance statistics: no transformers counterpart
                continue
            if ".ffn.experts." in n:
                i, part = n.split(".")[1], n.split(".")[-1]
                gu, down = (sd[f"model.layers.{i}.mlp.experts.{k}"] for k in ("gate_up_proj", "down_proj"))
                half = gu.shape[1] // 2
                src = {"gate": gu[:, :half], "up": gu[:, half:], "down": down}[part].transpose(1, 2)
            else:
                src = sd[_hf_name(n)]
            assert src.shape == t.shape, n
            t.copy_(src)


def test_flagship_spec_counts_transformers_parameters():
    assert modkit.count_params(modkit.load_spec(SPEC)) == FLAGSHIP
    with torch.device("meta"):
        hf = transformers.AutoModelForCausalLM.from_config(transformers.DeepseekV4Config())
    assert sum(p.numel() for p in hf.parameters() if p.requires_grad) == FLAGSHIP


def test_tiny_model_equals_transformers_logits_and_greedy_tokens():
    torch.manual_seed(0)
    hf = transformers.AutoModelForCausalLM.from_config(transformers.DeepseekV4Config(**HF), attn_implementation="eager")
    hf.eval()
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in hf.parameters():  # every parameter off its init (sinks, gate biases, norms)
            p.add_(torch.randn(p.shape, generator=g) * 0.1)
        for n, b in hf.named_buffers():
            if n.endswith("tid2eid"):  # two distinct experts per token id
                first = torch.randint(0, 4, (b.shape[0],), generator=g)
                b.copy_(torch.stack([first, (first + 1) % 4], dim=-1))
            elif n.endswith("e_score_correction_bias"):
                b.copy_(torch.randn(b.shape, generator=g) * 0.2)
    model = modkit.build(modkit.load_spec(_tiny_spec())).eval()
    assert modkit.count_params(model) == sum(p.numel() for p in hf.parameters())
    _load(model, hf)
    ids = torch.randint(2, 97, (2, 13), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        diff = (model(ids).logits - hf(ids).logits).abs().max().item()
        theirs = hf.generate(ids[:, :7], attention_mask=torch.ones_like(ids[:, :7]), max_new_tokens=12, do_sample=False)
    assert diff <= 1e-5
    assert torch.equal(generate(model, ids[:, :7], max_new_tokens=12, temperature=0), theirs)

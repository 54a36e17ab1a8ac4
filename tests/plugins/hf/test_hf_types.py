"""The harness a Hugging Face model type joins with one fixture description (:data:`FIXTURES`).

For each fixture, a tiny random transformers model with the type's structural features switched on (sliding
windows shorter than the test sequence, NoPE layers, biases, fused layouts...) is saved with transformers' own
``save_pretrained`` (safetensors), then:

1. ``modkit.from_hf`` builds a model with transformers' parameter count (unique parameters);
2. float32 logits of a left-padded batch agree with transformers' on every real token to 1e-5;
3. left padding changes nothing: each padded row's real-token logits equal those of the row run alone, unpadded;
4. greedy decoding with modkit's KV cache gives the tokens of transformers' ``generate``;
5. ``modkit.to_hf`` writes a folder that transformers loads with the same logits (1e-5), every tensor bitwise
   equal to the original file's, and whose ``config.json`` converts back to the same spec;
6. sharded both ways: transformers' ``save_pretrained`` in small shards loads to the same weights, and
   ``modkit.to_hf`` in small shards writes the same tensors under the same index a transformers model loads.

A new model type costs one entry: ``(id, transformers config class name, config kwargs)``. The decoder cases of
``tests/plugins/hf/test_hf_parity.py`` run here too, so all model types get the same six checks. transformers is a
test-only reference (nothing under ``modkit/`` or ``plugins/`` imports it).
"""

from __future__ import annotations

import json
import re

import pytest
import torch

import modkit
from modkit.inference.generate import generate

transformers = pytest.importorskip("transformers")

from hf_fallback import force_torch_fallback  # noqa: E402

force_torch_fallback()  # the recurrent types (mamba2) run transformers' PyTorch paths

from test_hf_parity import CASES as PARITY_CASES  # noqa: E402
from test_hf_parity import _quiet, batch, file_tensors, hf_output, make_hf, max_real_diff, ours_output  # noqa: E402

TOL = 1e-5
#: no end-of-sequence token: greedy decoding runs its full length on both sides
SMALL = dict(vocab_size=97, max_position_embeddings=64, pad_token_id=0, bos_token_id=1, eos_token_id=None)
GQA = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, intermediate_size=96)

#: the hybrid layers of the Qwen3-Next family's fixtures: Gated DeltaNet on layers 0 and 2, gated attention on 1 and 3
QWEN3_NEXT_LAYERS = dict(
    hidden_size=32,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    num_hidden_layers=4,
    full_attention_interval=2,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    linear_key_head_dim=8,
    linear_value_head_dim=12,
    attention_bias=True,
)

#: (id, config class, kwargs): every structural feature of the type switched on; windows (4) shorter than the
#: 9-token batch and the 7 + 12 generated tokens
FIXTURES = [
    # Gemma 1: (1 + w) RMSNorm, GeGLU with the legacy "gelu" name (the tanh GELU), sqrt(d) embedding scale, MQA,
    # attention biases, tied head
    (
        "gemma-mqa",
        "GemmaConfig",
        dict(
            hidden_size=64,
            num_attention_heads=4,
            num_key_value_heads=1,
            head_dim=16,
            intermediate_size=96,
            num_hidden_layers=2,
            attention_bias=True,
            hidden_act="gelu",
            **SMALL,
        ),
    ),
    # Gemma 1 with multi-head attention and head_dim != hidden_size / heads, untied
    (
        "gemma-mha",
        "GemmaConfig",
        dict(
            hidden_size=48,
            num_attention_heads=2,
            num_key_value_heads=2,
            head_dim=32,
            intermediate_size=64,
            num_hidden_layers=2,
            tie_word_embeddings=False,
            **SMALL,
        ),
    ),
    # StarCoder2: sliding-window GQA on every layer, biases on every projection, LayerNorm, gelu (tanh) MLP
    ("starcoder2", "Starcoder2Config", dict(**GQA, num_hidden_layers=2, sliding_window=4, use_bias=True, **SMALL)),
    # OLMo 3: reordered norms, full-width QK-norm, three sliding layers out of four, per-type RoPE (linear scaling
    # and another base on the full layer), attention biases
    (
        "olmo3",
        "Olmo3Config",
        dict(
            **GQA,
            num_hidden_layers=4,
            sliding_window=4,
            attention_bias=True,
            rope_parameters={
                "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 500000.0},
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            },
            **SMALL,
        ),
    ),
    # SmolLM3: NoPE on every second layer, those layers sliding (window 4), attention and MLP biases, tied
    (
        "smollm3",
        "SmolLM3Config",
        dict(
            **GQA,
            num_hidden_layers=4,
            no_rope_layer_interval=2,
            use_sliding_window=True,
            sliding_window=4,
            attention_bias=True,
            mlp_bias=True,
            **SMALL,
        ),
    ),
    # GLM-4: sandwich norms, q/k/v biases (no output bias), interleaved partial RoPE (0.5), fused gate_up, head_dim 16
    ("glm4", "Glm4Config", dict(**GQA, head_dim=16, num_hidden_layers=2, attention_bias=True, **SMALL)),
    # GPT-NeoX (Pythia): parallel residual with two LayerNorms, fused per-head query_key_value, rotary on a quarter
    # of each head (4.x keys rotary_pct / rotary_emb_base), biases everywhere, erf GELU, untied embed_out
    (
        "gpt_neox-parallel",
        "GPTNeoXConfig",
        dict(
            hidden_size=64,
            num_attention_heads=4,
            intermediate_size=96,
            num_hidden_layers=2,
            rotary_pct=0.25,
            rotary_emb_base=5000,
            use_parallel_residual=True,
            **SMALL,
        ),
    ),
    # GPT-NeoX with the sequential residual (use_parallel_residual false: a pre-norm block), half the head rotated
    (
        "gpt_neox-sequential",
        "GPTNeoXConfig",
        dict(
            hidden_size=64,
            num_attention_heads=4,
            intermediate_size=96,
            num_hidden_layers=2,
            rotary_pct=0.5,
            use_parallel_residual=False,
            **SMALL,
        ),
    ),
    # Granite: every multiplier away from 1 (embedding 6, attention 0.4 in place of 1/sqrt(d), residual 0.22,
    # logits divided by 6), GQA, attention and MLP biases, untied
    (
        "granite",
        "GraniteConfig",
        dict(
            **GQA,
            num_hidden_layers=2,
            embedding_multiplier=6.0,
            attention_multiplier=0.4,
            residual_multiplier=0.22,
            logits_scaling=6.0,
            attention_bias=True,
            mlp_bias=True,
            **SMALL,
        ),
    ),
    # Cohere: one shared bias-free LayerNorm per parallel block, interleaved RoPE, per-head QK LayerNorm with a weight
    # per head, attention biases, logits times 0.3, tied
    (
        "cohere",
        "CohereConfig",
        dict(**GQA, num_hidden_layers=2, use_qk_norm=True, attention_bias=True, logit_scale=0.3, **SMALL),
    ),
    # Qwen3-MoE: 4 experts top-2 renormalised at width 32, a dense SwiGLU (96) on layer 2 (mlp_only_layers), window 4
    # on every layer (use_sliding_window), per-head QK-RMSNorm, attention biases, head_dim 16 != 64 / 4
    (
        "qwen3_moe",
        "Qwen3MoeConfig",
        dict(
            **GQA,
            head_dim=16,
            num_hidden_layers=4,
            moe_intermediate_size=32,
            num_experts=4,
            num_experts_per_tok=2,
            norm_topk_prob=True,
            mlp_only_layers=[2],
            use_sliding_window=True,
            sliding_window=4,
            attention_bias=True,
            **SMALL,
        ),
    ),
    # Qwen2-MoE: 4 experts top-2 (not renormalised) of width 32 beside a sigmoid-gated shared expert (48), mixtures
    # on every second layer (decoder_sparse_step 2) except layer 3 (mlp_only_layers), dense SwiGLU (96) elsewhere;
    # windows on layers 0 and 2 (every other layer below max_window_layers 3), q/k/v biases
    (
        "qwen2_moe",
        "Qwen2MoeConfig",
        dict(
            **GQA,
            num_hidden_layers=6,
            moe_intermediate_size=32,
            shared_expert_intermediate_size=48,
            num_experts=4,
            num_experts_per_tok=2,
            decoder_sparse_step=2,
            mlp_only_layers=[3],
            use_sliding_window=True,
            sliding_window=4,
            max_window_layers=3,
            **SMALL,
        ),
    ),
    # gpt-oss: sinks, sliding (window 4) / full layers, attention biases, router with a bias, 4 clamped-SwiGLU
    # experts with biases top-2 (limit 1.5, so the clamps bind), interleaved gate_up_proj, YaRN over 16 positions
    (
        "gpt_oss",
        "GptOssConfig",
        dict(
            **GQA,
            head_dim=16,
            num_hidden_layers=4,
            num_local_experts=4,
            num_experts_per_tok=2,
            sliding_window=4,
            swiglu_limit=1.5,
            rope_parameters={
                "rope_type": "yarn",
                "factor": 4.0,
                "beta_fast": 32.0,
                "beta_slow": 1.0,
                "truncate": False,
                "original_max_position_embeddings": 16,
                "rope_theta": 150000.0,
            },
            **SMALL,
        ),
    ),
    # Llama 4: chunked attention (chunk 4) on the RoPE layers, NoPE on every third layer with temperature tuning
    # (floor_scale 4, so it acts within the test), L2 QK-norm on the RoPE layers, mixtures on every second layer
    # (interleave_moe_layer_step 2) of 4 experts top-1 weighting their input, a shared expert, dense SwiGLU (80)
    (
        "llama4_text",
        "Llama4TextConfig",
        dict(
            hidden_size=64,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            num_hidden_layers=6,
            intermediate_size=32,
            intermediate_size_mlp=80,
            num_local_experts=4,
            num_experts_per_tok=1,
            interleave_moe_layer_step=2,
            no_rope_layer_interval=3,
            attention_chunk_size=4,
            floor_scale=4,
            attn_scale=0.5,
            **SMALL,
        ),
    ),
    # DeepSeek-V3: latent attention (q_lora_rank 24, kv_lora_rank 16, rope/nope/v head widths 8/8/12, interleaved
    # rotary rows, YaRN with mscale_all_dim), a dense first layer, then 8 experts top-2 in 4 groups of which 2 are
    # kept, routed scaling 2.5, renormalised, 2 shared experts
    (
        "deepseek_v3",
        "DeepseekV3Config",
        dict(
            hidden_size=64,
            num_attention_heads=4,
            num_key_value_heads=4,
            num_hidden_layers=3,
            intermediate_size=96,
            moe_intermediate_size=16,
            n_routed_experts=8,
            num_experts_per_tok=2,
            n_group=4,
            topk_group=2,
            n_shared_experts=2,
            first_k_dense_replace=1,
            q_lora_rank=24,
            kv_lora_rank=16,
            qk_rope_head_dim=8,
            qk_nope_head_dim=8,
            v_head_dim=12,
            rope_parameters={
                "rope_type": "yarn",
                "factor": 4.0,
                "original_max_position_embeddings": 16,
                "beta_fast": 32.0,
                "beta_slow": 1.0,
                "mscale": 1.0,
                "mscale_all_dim": 1.0,
                "rope_theta": 10000.0,
            },
            **SMALL,
        ),
    ),
    # Mamba-2: no attention, no FFN; 2 groups of B/C, a step-size clamp, chunks (4) shorter than the batch, untied.
    # No in_proj bias: transformers zeroes padding before in_proj, so with use_bias its padding tokens put the bias
    # into the convolution window of the first real tokens (0.6 on these logits; modkit's padding changes nothing);
    # the biases are compared without padding in tests/plugins/test_mixers.py
    (
        "mamba2",
        "Mamba2Config",
        dict(
            hidden_size=32,
            num_heads=8,
            head_dim=8,
            state_size=8,
            n_groups=2,
            expand=2,
            conv_kernel=3,
            use_bias=False,
            time_step_limit=(0.01, 2.0),
            chunk_size=4,
            num_hidden_layers=2,
            vocab_size=97,
            pad_token_id=0,
            bos_token_id=1,
            eos_token_id=None,
        ),
    ),
    # Falcon-H1: attention (GQA, head_dim 16 != 64 / 4, biases) and Mamba-2 (its own width 48 in 6 heads, the gated
    # norm over 2 groups, gate first, out_proj bias, chunks of 4) side by side in every layer; every μP multiplier
    # away from 1 (embeddings, logits, keys, the two halves' inputs and outputs, in_proj's five parts, the FFN's
    # gate and output). No in_proj bias, for the padding reason of mamba2 above; no step-size clamp: transformers
    # clamps Δ in its chunked scan but not in its one-token step, so its generate would not be the model its
    # forward computes (modkit clamps in both; the clamp is compared in tests/plugins/test_mixers.py)
    (
        "falcon_h1",
        "FalconH1Config",
        dict(
            **GQA,
            head_dim=16,
            num_hidden_layers=2,
            attention_bias=True,
            mlp_bias=True,
            mamba_d_ssm=48,
            mamba_n_heads=6,
            mamba_d_head=8,
            mamba_d_state=8,
            mamba_n_groups=2,
            mamba_d_conv=3,
            mamba_chunk_size=4,
            mamba_rms_norm=True,
            mamba_norm_before_gate=False,
            projectors_bias=True,
            embedding_multiplier=2.5,
            lm_head_multiplier=0.4,
            key_multiplier=0.7,
            attention_in_multiplier=1.3,
            attention_out_multiplier=0.6,
            ssm_in_multiplier=0.8,
            ssm_out_multiplier=1.7,
            ssm_multipliers=[0.5, 2.0, 0.25, 1.5, 0.75],
            mlp_multipliers=[1.25, 0.6],
            **SMALL,
        ),
    ),
    # Qwen3-Next: Gated DeltaNet on layers 0 and 2 (2 key heads, 4 value heads, key width 8 != value width 12), gated
    # attention on layers 1 and 3 (full_attention_interval 2: GQA 4/2, head_dim 16 != 32 / 4, partial RoPE 0.25,
    # per-head QK-norm, biases on every projection, the gate's too); (1 + w) RMSNorms everywhere; 4 experts top-2
    # renormalised beside a sigmoid-gated shared expert (24), a dense SwiGLU (48) on layer 2 (mlp_only_layers)
    (
        "qwen3_next",
        "Qwen3NextConfig",
        dict(
            hidden_size=32,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            intermediate_size=48,
            num_hidden_layers=4,
            full_attention_interval=2,
            linear_num_key_heads=2,
            linear_num_value_heads=4,
            linear_key_head_dim=8,
            linear_value_head_dim=12,
            moe_intermediate_size=16,
            shared_expert_intermediate_size=24,
            num_experts=4,
            num_experts_per_tok=2,
            mlp_only_layers=[2],
            attention_bias=True,
            **SMALL,
        ),
    ),
    # Jamba: Mamba on layers 0 and 2 (d_state 8, Δ rank 4, Δ/B/C RMSNorms, convolution bias), attention on layers 1
    # and 3 (attn_layer_period 2, offset 1: GQA 4/2, head_dim 16 != 32 / 4, no position encoding), mixtures of 4
    # experts top-2 (not renormalised) on layers 0 and 2 (expert_layer_period 2, offset 0), dense SwiGLU elsewhere.
    # No mamba_proj_bias, for the reason of mamba2's fixture (transformers zeroes padding before in_proj)
    (
        "jamba",
        "JambaConfig",
        dict(
            hidden_size=32,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            intermediate_size=48,
            num_hidden_layers=4,
            attn_layer_period=2,
            attn_layer_offset=1,
            expert_layer_period=2,
            expert_layer_offset=0,
            num_experts=4,
            num_experts_per_tok=2,
            mamba_d_state=8,
            mamba_dt_rank=4,
            **SMALL,
        ),
    ),
    # --- 2026 hybrid types ---
    # LFM2: gated short convolutions (kernel 3) on layers 0 and 2, GQA with per-head QK-RMSNorm and RoPE on layers 1
    # and 3, the FFN width auto-adjusted (int(2/3 · 100) · 1.5 rounded up to 16: 112), tied. No conv_bias, for the
    # padding reason of mamba2's fixture (transformers zeroes padding before in_proj, whose bias then reaches the
    # convolution); the biases are compared without padding in tests/plugins/test_short_conv.py
    (
        "lfm2",
        "Lfm2Config",
        dict(
            **dict(GQA, intermediate_size=100),
            num_hidden_layers=4,
            layer_types=["conv", "full_attention", "conv", "full_attention"],
            block_multiple_of=16,
            block_ffn_dim_multiplier=1.5,
            **SMALL,
        ),
    ),
    # Qwen3.5 (text): Qwen3-Next's layers (Gated DeltaNet on 0 and 2 with 2 key heads, 4 value heads, key width 8 !=
    # value width 12; gated attention on 1 and 3, head_dim 16, partial RoPE 0.25 with the multimodal sections, QK-norm,
    # biases) with the unfused in_proj_qkv / z / b / a and a dense SwiGLU (48) in every layer
    (
        "qwen3_5_text",
        "Qwen3_5TextConfig",
        dict(
            **QWEN3_NEXT_LAYERS,
            intermediate_size=48,
            rope_parameters={
                "rope_type": "default",
                "rope_theta": 10000.0,
                "partial_rotary_factor": 0.25,
                "mrope_section": [1, 1, 0],
                "mrope_interleaved": True,
            },
            **SMALL,
        ),
    ),
    # Qwen3.5-MoE (text): the same layers, a mixture in every layer (4 experts top-2, always renormalised) beside a
    # sigmoid-gated shared expert (24)
    (
        "qwen3_5_moe_text",
        "Qwen3_5MoeTextConfig",
        dict(
            **QWEN3_NEXT_LAYERS,
            moe_intermediate_size=16,
            shared_expert_intermediate_size=24,
            num_experts=4,
            num_experts_per_tok=2,
            **SMALL,
        ),
    ),
    # OLMo Hybrid: Gated DeltaNet with negative eigenvalues (β = 2 sigmoid) in pre-norm blocks on layers 0, 1 and 3
    # (2 key heads of 8, 4 value heads of 12), OLMo 3 attention in a reordered block on layer 2 (GQA, full-width
    # QK-norm, biases), untied
    (
        "olmo_hybrid",
        "OlmoHybridConfig",
        dict(
            **GQA,
            num_hidden_layers=4,
            layer_types=["linear_attention", "linear_attention", "full_attention", "linear_attention"],
            linear_num_key_heads=2,
            linear_num_value_heads=4,
            linear_key_head_dim=8,
            linear_value_head_dim=12,
            attention_bias=True,
            **SMALL,
        ),
    ),
    # LFM2-MoE: LFM2's layers (convolutions on 0 and 2, attention on 1 and 3), a dense SwiGLU (48) on layer 0, then
    # 4 experts (16) top-2 by sigmoid scores plus the expert-bias buffer (perturbed, so it changes the choice),
    # renormalised with the 1e-6 epsilon, times 1.5
    (
        "lfm2_moe",
        "Lfm2MoeConfig",
        dict(
            hidden_size=32,
            num_attention_heads=4,
            num_key_value_heads=2,
            intermediate_size=48,
            moe_intermediate_size=16,
            num_hidden_layers=4,
            num_dense_layers=1,
            num_experts=4,
            num_experts_per_tok=2,
            routed_scaling_factor=1.5,
            layer_types=["conv", "full_attention", "conv", "full_attention"],
            **SMALL,
        ),
    ),
    # Kimi Linear: Kimi Delta Attention (2 heads of 8, convolution 4) on layers 0, 2 and 3, latent attention without
    # any rotary embedding on layer 1 (kv_lora_rank 16, q_lora_rank 24, nope/rope/v widths 8/8/12); a dense SwiGLU (48)
    # on layer 0, then 4 experts (16) top-2 in 2 groups of which 1 is kept, sigmoid scores with the correction bias,
    # renormalised, times 2.5, one shared expert
    (
        "kimi_linear",
        "KimiLinearConfig",
        dict(
            hidden_size=32,
            num_attention_heads=4,
            num_key_value_heads=4,
            num_hidden_layers=4,
            intermediate_size=48,
            moe_intermediate_size=16,
            num_local_experts=4,
            num_experts_per_tok=2,
            n_group=2,
            topk_group=1,
            n_shared_experts=1,
            routed_scaling_factor=2.5,
            kv_lora_rank=16,
            q_lora_rank=24,
            qk_rope_head_dim=8,
            qk_nope_head_dim=8,
            v_head_dim=12,
            linear_head_dim=8,
            linear_num_heads=2,
            layer_types=["linear_attention", "full_attention", "linear_attention", "linear_attention"],
            **SMALL,
        ),
    ),
    # MiniMax: lightning attention (4 heads of 8, blocks of 4 tokens, per-layer decays) on layers 1 and 3, GQA with a
    # window of 4 on layers 0 and 2, every block DeepNorm-style with all six factors away from 1 (so the attention
    # and lightning layers' placements differ), 4 Mixtral experts top-2
    (
        "minimax",
        "MiniMaxConfig",
        dict(
            hidden_size=32,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=8,
            intermediate_size=16,
            num_hidden_layers=4,
            num_local_experts=4,
            num_experts_per_tok=2,
            block_size=4,
            sliding_window=4,
            full_attn_alpha_factor=1.7,
            full_attn_beta_factor=0.8,
            linear_attn_alpha_factor=1.3,
            linear_attn_beta_factor=1.1,
            mlp_alpha_factor=1.5,
            mlp_beta_factor=0.9,
            **SMALL,
        ),
    ),
    # --- 2026 dense types ---
    # Arcee AFM: a two-projection ReLU-squared MLP, GQA, attention and MLP biases, head_dim 16 = 64 / 4
    ("arcee", "ArceeConfig", dict(**GQA, num_hidden_layers=2, attention_bias=True, mlp_bias=True, **SMALL)),
    # Apertus: per-head QK-RMSNorm before RoPE, a two-projection xIELU MLP (its learned scalars and saved buffers off
    # their init), Llama 3 RoPE scaling over 16 positions, attention biases
    (
        "apertus",
        "ApertusConfig",
        dict(
            **GQA,
            num_hidden_layers=2,
            attention_bias=True,
            rope_parameters={
                "rope_type": "llama3",
                "factor": 4.0,
                "original_max_position_embeddings": 16,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "rope_theta": 12000000.0,
            },
            **SMALL,
        ),
    ),
    # Seed-OSS: the output projection biased and q/k/v not (the reverse of its defaults), MLP biases, head_dim 24 != 64 / 4,
    # residual and attention dropout 0.1 (off in eval)
    (
        "seed_oss",
        "SeedOssConfig",
        dict(
            **GQA,
            head_dim=24,
            num_hidden_layers=2,
            attention_bias=False,
            attention_out_bias=True,
            mlp_bias=True,
            **SMALL,
        ),
    ),
    # EXAONE 4: OLMo 2's reordered norms, per-head QK-norm, layers 0-2 sliding (window 4) with RoPE and layer 3 full
    # without it (NoPE), GQA
    ("exaone4", "Exaone4Config", dict(**GQA, num_hidden_layers=4, sliding_window=4, **SMALL)),
    # Hunyuan-A13B: per-head QK-RMSNorm after RoPE, NTK-alpha frequencies (alpha 4), 4 experts top-2 renormalised
    # beside an ungated shared MLP of the same width (32) in every layer, attention biases, head_dim 16
    (
        "hunyuan_v1_moe",
        "HunYuanMoEV1Config",
        dict(
            **{**GQA, "intermediate_size": 32},
            head_dim=16,
            num_hidden_layers=2,
            num_experts=4,
            moe_topk=2,
            attention_bias=True,
            rope_parameters={"rope_type": "dynamic", "alpha": 4.0, "factor": 1.0, "rope_theta": 10000.0},
            **SMALL,
        ),
    ),
    # MiMo-V2-Flash: layer 0 full (1 key/value head, RoPE on half the head, base 5e6), layers 1-3 sliding (window 4,
    # 2 key/value heads, sinks, RoPE on int(24 · 0.334) = 8 features, base 1e4); query/key heads of 24, value heads
    # of 16, values times 0.707; q/k/v biases; layer 0 a dense SwiGLU (32), then 4 experts of 16 top-2 in 2 groups
    # of which 1 is kept, sigmoid scores with the correction bias, renormalised, routed scaling 2
    (
        "mimo_v2_flash",
        "MiMoV2FlashConfig",
        dict(
            hidden_size=64,
            num_attention_heads=4,
            num_key_value_heads=1,
            head_dim=24,
            v_head_dim=16,
            num_hidden_layers=4,
            intermediate_size=32,
            moe_intermediate_size=16,
            n_routed_experts=4,
            num_experts_per_tok=2,
            n_group=2,
            topk_group=1,
            routed_scaling_factor=2.0,
            sliding_window=4,
            attention_bias=True,
            rope_parameters={
                "full_attention": {"rope_type": "default", "rope_theta": 5000000.0, "partial_rotary_factor": 0.5},
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.334},
            },
            **SMALL,
        ),
    ),
    # --- 2026 MoE types ---
    # DeepSeek-V2: latent attention with complex-valued (interleaved) RoPE (q_lora_rank 24, kv_lora_rank 16, rope/nope/v
    # widths 8/8/12), attention biases, a dense first layer, then 8 experts top-2 under a softmax router limited to the
    # 2 best of 4 groups (a group's score: its best expert), routed scaling 1.5, 2 shared experts, MLP biases
    (
        "deepseek_v2",
        "DeepseekV2Config",
        dict(
            hidden_size=64,
            num_attention_heads=4,
            num_hidden_layers=3,
            intermediate_size=96,
            moe_intermediate_size=16,
            n_routed_experts=8,
            num_experts_per_tok=2,
            topk_method="group_limited_greedy",
            n_group=4,
            topk_group=2,
            routed_scaling_factor=1.5,
            n_shared_experts=2,
            first_k_dense_replace=1,
            q_lora_rank=24,
            kv_lora_rank=16,
            qk_rope_head_dim=8,
            qk_nope_head_dim=8,
            v_head_dim=12,
            attention_bias=True,
            mlp_bias=True,
            **SMALL,
        ),
    ),
    # GLM-4.5: GQA with q/k/v biases, per-head QK-norm, half the head rotated (the class default), a dense first layer,
    # then 8 experts top-2 under DeepSeek-V3's sigmoid router (correction bias, 2 of 4 groups, routed scaling 2.5,
    # renormalised) beside 2 shared experts
    (
        "glm4_moe",
        "Glm4MoeConfig",
        dict(
            **GQA,
            num_hidden_layers=3,
            moe_intermediate_size=16,
            n_routed_experts=8,
            num_experts_per_tok=2,
            n_group=4,
            topk_group=2,
            routed_scaling_factor=2.5,
            n_shared_experts=2,
            first_k_dense_replace=1,
            attention_bias=True,
            use_qk_norm=True,
            **SMALL,
        ),
    ),
    # dots.llm1: GLM-4.5's mixture (8 experts top-2, sigmoid router with correction bias, 2 of 4 groups, not
    # renormalised, 1 shared expert) from layer 1, per-head QK-norm, biases on every attention projection, window 4
    # on the layers from max_window_layers 2 on
    (
        "dots1",
        "Dots1Config",
        dict(
            **GQA,
            head_dim=16,
            num_hidden_layers=4,
            moe_intermediate_size=16,
            n_routed_experts=8,
            num_experts_per_tok=2,
            n_group=4,
            topk_group=2,
            n_shared_experts=1,
            first_k_dense_replace=1,
            attention_bias=True,
            sliding_window=4,
            max_window_layers=2,
            **SMALL,
        ),
    ),
    # ERNIE 4.5 MoE: biases on every projection, the shared experts and the head (tied), interleaved RoPE, mixtures
    # on layers 1 and 3 only (start 1, end 3, interval 2) of 8 experts top-2 under a softmax router whose correction
    # bias only selects, renormalised, beside 2 shared experts
    (
        "ernie4_5_moe",
        "Ernie4_5_MoeConfig",
        dict(
            **GQA,
            num_hidden_layers=5,
            moe_intermediate_size=16,
            moe_num_experts=8,
            moe_k=2,
            moe_num_shared_experts=2,
            moe_layer_start_index=1,
            moe_layer_end_index=3,
            moe_layer_interval=2,
            use_bias=True,
            **SMALL,
        ),
    ),
    # MiniMax-M2: full-width QK-norm, half the head rotated (the legacy rotary_dim 8 of head_dim 16), 4 experts top-2
    # under a sigmoid router with a selection-only correction bias, renormalised
    (
        "minimax_m2",
        "MiniMaxM2Config",
        dict(
            **{**GQA, "intermediate_size": 32},
            head_dim=16,
            num_hidden_layers=2,
            num_local_experts=4,
            num_experts_per_tok=2,
            rotary_dim=8,
            **SMALL,
        ),
    ),
    # FlexOlmo: OLMo 2's reordered norms and full-width QK-norm, attention biases, 4 experts (width 32) top-2
    # renormalised in every layer
    (
        "flex_olmo",
        "FlexOlmoConfig",
        dict(
            **{**GQA, "intermediate_size": 32},
            num_hidden_layers=2,
            num_experts=4,
            num_experts_per_tok=2,
            norm_topk_prob=True,
            attention_bias=True,
            **SMALL,
        ),
    ),
    # Granite MoE with a shared expert: every Granite multiplier away from 1, attention biases, 4 experts (width 32)
    # top-2 beside a shared SwiGLU (48), stacked input_linear / output_linear experts
    (
        "granitemoeshared",
        "GraniteMoeSharedConfig",
        dict(
            **{**GQA, "intermediate_size": 32},
            num_hidden_layers=2,
            num_local_experts=4,
            num_experts_per_tok=2,
            shared_intermediate_size=48,
            embedding_multiplier=6.0,
            attention_multiplier=0.4,
            residual_multiplier=0.22,
            logits_scaling=6.0,
            attention_bias=True,
            **SMALL,
        ),
    ),
    # AFMoE (Trinity): sandwich norms, gated attention with per-head QK-norm, window 4 on every other layer with RoPE
    # only there (NoPE on the global layers), muP embedding scale, a dense first layer, then 8 experts top-2 under a
    # sigmoid router with a selection-only expert bias, renormalised, route scale 1.5, beside 2 shared experts
    (
        "afmoe",
        "AfmoeConfig",
        dict(
            **GQA,
            head_dim=16,
            num_hidden_layers=4,
            moe_intermediate_size=16,
            num_experts=8,
            num_experts_per_tok=2,
            num_shared_experts=2,
            route_scale=1.5,
            num_dense_layers=1,
            global_attn_every_n_layers=2,
            sliding_window=4,
            mup_enabled=True,
            **SMALL,
        ),
    ),
    # Phi-3.5-MoE: LayerNorms with biases, attention and head biases, window 4 on every layer, 4 experts (width 32)
    # under the SparseMixer top-2 router (jitter 0.3, so several experts share each pick's softmax)
    (
        "phimoe",
        "PhimoeConfig",
        dict(
            **{**GQA, "intermediate_size": 32},
            num_hidden_layers=2,
            num_local_experts=4,
            router_jitter_noise=0.3,
            sliding_window=4,
            attention_bias=True,
            lm_head_bias=True,
            **SMALL,
        ),
    ),
    # DBRX: bias-free LayerNorms, GQA from a fused Wqkv clamped at 0.3 (binding on these projections), 4 experts
    # (width 32) top-2 whose softmax weights are divided by their 2-norm
    (
        "dbrx",
        "DbrxConfig",
        dict(
            d_model=64,
            n_heads=4,
            n_layers=2,
            max_seq_len=64,
            attn_config={"kv_n_heads": 2, "clip_qkv": 0.3, "rope_theta": 10000.0},
            ffn_config={
                "ffn_hidden_size": 32,
                "moe_num_experts": 4,
                "moe_top_k": 2,
                "moe_normalize_expert_weights": 2.0,
            },
            **{k: v for k, v in SMALL.items() if k != "max_position_embeddings"},
        ),
    ),
    # --- 2026 Mamba-2 hybrids ---
    # Bamba: Mamba-2 on layers 0 and 2 (8 heads of 8, 2 groups of B/C of 8, convolution 3, chunks of 4 shorter than
    # the batch), attention on layer 1 (GQA 4/2, RoPE on half of each head, biases), SwiGLU with biases in every
    # layer. No mamba_proj_bias and no step-size clamp, for the reasons of the mamba2 and falcon_h1 fixtures
    (
        "bamba",
        "BambaConfig",
        dict(
            **dict(GQA, hidden_size=32, intermediate_size=48),
            num_hidden_layers=3,
            attn_layer_indices=[1],
            attention_bias=True,
            mlp_bias=True,
            mamba_n_heads=8,
            mamba_d_state=8,
            mamba_n_groups=2,
            mamba_d_conv=3,
            mamba_chunk_size=4,
            **SMALL,
        ),
    ),
    # Granite 4.0-H: Bamba's Mamba-2 layers on 0 and 2, attention on 1 (GQA 4/2, biases, RoPE by
    # position_embedding_type), every Granite multiplier away from 1, 4 experts (16) top-2 renormalised beside a
    # shared SwiGLU (24) in every layer
    (
        "granitemoehybrid",
        "GraniteMoeHybridConfig",
        dict(
            **dict(GQA, hidden_size=32, intermediate_size=16),
            num_hidden_layers=3,
            layer_types=["linear_attention", "full_attention", "linear_attention"],
            position_embedding_type="rope",
            attention_bias=True,
            embedding_multiplier=6.0,
            attention_multiplier=0.4,
            residual_multiplier=0.22,
            logits_scaling=6.0,
            num_local_experts=4,
            num_experts_per_tok=2,
            shared_intermediate_size=24,
            mamba_n_heads=8,
            mamba_d_state=8,
            mamba_n_groups=2,
            mamba_d_conv=3,
            mamba_chunk_size=4,
            **SMALL,
        ),
    ),
    # Nemotron-H: blocks of one sublayer each: Mamba-2 alone on layers 0 and 4 (8 heads of 8, 2 groups of B/C of 8,
    # convolution 3, chunks of 4), a mixture alone on layer 1 (4 ReLU² experts of 16 top-2 by sigmoid scores and the
    # perturbed correction bias, in 2 groups of which 1 is kept, renormalised, times 1.5, beside a shared ReLU² MLP
    # of 24 with biases), GQA without positions alone on layer 2, a ReLU² MLP (48, biases) alone on layer 3
    (
        "nemotron_h",
        "NemotronHConfig",
        dict(
            **dict(GQA, hidden_size=32, intermediate_size=48),
            head_dim=8,
            layers_block_type=["linear_attention", "moe", "full_attention", "mlp", "linear_attention"],
            mlp_bias=True,
            mamba_num_heads=8,
            mamba_head_dim=8,
            ssm_state_size=8,
            n_groups=2,
            conv_kernel=3,
            chunk_size=4,
            n_routed_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=16,
            moe_shared_expert_intermediate_size=24,
            n_group=2,
            topk_group=1,
            routed_scaling_factor=1.5,
            **SMALL,
        ),
    ),
    # BAILING_HYBRID: Ling 3. Kimi Delta Attention with full-rank forget and output gates and the bounded forget gate
    # (kda_safe_gate, lower bound -3) on layers 0, 2 and 3 (4 heads of 8, convolution 4); gated latent attention on
    # layer 1 (a sigmoid gate per head; q_lora_rank 24, kv_lora_rank 16, nope/rope/v widths 8/4/12, interleaved RoPE,
    # attention biases); a dense SwiGLU (48) on layer 0, then 4 experts (16) top-2 in 2 groups of which 1 is kept,
    # sigmoid scores with the correction bias, renormalised, times 2.5, one shared expert
    (
        "bailing_hybrid",
        "BailingHybridConfig",
        dict(
            hidden_size=32,
            num_attention_heads=4,
            num_key_value_heads=4,
            num_hidden_layers=4,
            head_dim=8,
            intermediate_size=48,
            moe_intermediate_size=16,
            num_local_experts=4,
            num_experts_per_tok=2,
            n_group=2,
            topk_group=1,
            n_shared_experts=1,
            first_k_dense_replace=1,
            kv_lora_rank=16,
            q_lora_rank=24,
            qk_rope_head_dim=4,
            qk_nope_head_dim=8,
            v_head_dim=12,
            attention_bias=True,
            kda_lower_bound=-3.0,
            layer_types=["linear_attention", "full_attention", "linear_attention", "linear_attention"],
            **SMALL,
        ),
    ),
    # XLSTM: xLSTM 7B's blocks: an mLSTM (4 heads, queries and keys of 16, values and output gate of 32: v_dim_factor
    # 2 against qk_dim_factor 1, widths that are multiples of 64 as transformers' cache needs) with gates soft-capped
    # at 5 and eps 1e-5, chunks of 4 shorter than the batch (transformers: chunks, then its step kernel for the rest),
    # a SwiGLU of 1.5 · 64 rounded to 32, logits soft-capped at 10; transformers reads no attention mask, so its rows
    # are compared unpadded (UNPADDED_REFERENCE)
    (
        "xlstm",
        "xLSTMConfig",
        dict(
            hidden_size=64,
            num_heads=4,
            qk_dim_factor=1.0,
            v_dim_factor=2.0,
            num_hidden_layers=2,
            ffn_proj_factor=1.5,
            ffn_round_up_to_multiple_of=32,
            chunk_size=4,
            gate_soft_cap=5.0,
            eps=1e-5,
            norm_eps=1e-5,
            output_logit_soft_cap=10.0,
            **{k: v for k, v in SMALL.items() if k != "max_position_embeddings"},
        ),
    ),
    # LFM3: every per-layer-type feature: short convolutions (kernel 3) on layers 0 and 3, a sliding layer (window 4,
    # shorter than the test sequences) with the default RoPE over the whole head (base 1e4) on layer 1, a full layer
    # with proportional RoPE (base 1e6, 4 of the 8 pairs of a 16-wide head turn) on layer 2; per-head QK-RMSNorm,
    # q/k/v/o biases, the sigmoid gate per head (g_proj), sandwich norms, a SwiGLU of 48, tied
    (
        "lfm3",
        "Lfm3Config",
        dict(
            **dict(GQA, hidden_size=32, intermediate_size=48),
            head_dim=16,
            num_hidden_layers=4,
            layer_types=["conv", "sliding_attention", "full_attention", "conv"],
            sliding_window=4,
            conv_L_cache=3,
            attention_bias=True,
            **SMALL,
        ),
    ),
    # GEMMA3N_TEXT: the AltUp stream of 3 copies (the second active) with per-layer embeddings of 8 from a table of 90
    # rows (ids 90-96 read row 0), LAuReL of rank 4, widths 48/64/48/48 with activation sparsity on layers 0 and 1,
    # sliding (window 4) and full layers alternating, the last two layers reading layers 0 and 1's keys and values,
    # the value norm, soft-capped logits
    (
        "gemma3n_text",
        "Gemma3nTextConfig",
        dict(
            **dict(GQA, hidden_size=32, intermediate_size=[48, 64, 48, 48]),
            head_dim=8,
            num_hidden_layers=4,
            layer_types=["sliding_attention", "full_attention"] * 2,
            sliding_window=4,
            num_kv_shared_layers=2,
            altup_num_inputs=3,
            altup_active_idx=1,
            hidden_size_per_layer_input=8,
            vocab_size_per_layer_input=90,
            laurel_rank=4,
            activation_sparsity_pattern=[0.95, 0.95, 0.0, 0.0],
        ),
    ),
    # NEMOTRON_H: Nemotron 3's latent mixture (moe_latent_size) on layers 1 and 3: the 4 routed ReLU² experts (24,
    # top-2 by sigmoid scores and the perturbed correction bias, not renormalised, times 2.5) work on 16 latent
    # features between a projection from the width of 32 and one back, both with biases (mlp_bias), while the router
    # and the shared ReLU² MLP (16) read the full width; Mamba-2 alone on layer 0 (4 heads of 16, 2 groups of B/C of
    # 8, convolution 4, chunks of 4), GQA without positions alone on layer 2
    (
        "nemotron_h_latent",
        "NemotronHConfig",
        dict(
            **dict(GQA, hidden_size=32, intermediate_size=48),
            head_dim=8,
            layers_block_type=["linear_attention", "moe", "full_attention", "moe"],
            mlp_bias=True,
            mamba_num_heads=4,
            mamba_head_dim=16,
            ssm_state_size=8,
            n_groups=2,
            conv_kernel=4,
            chunk_size=4,
            n_routed_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=24,
            moe_shared_expert_intermediate_size=16,
            moe_latent_size=16,
            norm_topk_prob=False,
            routed_scaling_factor=2.5,
        ),
    ),
    # LONGCAT_FLASH: 2 layers of two MLA + SwiGLU (48) sublayer pairs (q_lora_rank 24, kv_lora_rank 16, nope/rope/v
    # head widths 8/8/12, interleaved RoPE with YaRN and mscale_all_dim, the latent scalings sqrt(32/24) and
    # sqrt(32/16)), the shortcut mixture across them: 4 experts of 16 and 2 zero-computation experts, top-3 by a
    # softmax over all 6 choices plus the (perturbed) correction bias, not renormalised, times 1.5
    (
        "longcat_flash",
        "LongcatFlashConfig",
        dict(
            hidden_size=32,
            num_layers=2,
            num_attention_heads=4,
            ffn_hidden_size=48,
            q_lora_rank=24,
            kv_lora_rank=16,
            qk_nope_head_dim=8,
            qk_rope_head_dim=8,
            head_dim=8,
            v_head_dim=12,
            n_routed_experts=4,
            zero_expert_num=2,
            moe_topk=3,
            expert_ffn_hidden_size=16,
            routed_scaling_factor=1.5,
            rope_parameters={
                "rope_type": "yarn",
                "factor": 4.0,
                "original_max_position_embeddings": 16,
                "beta_fast": 32.0,
                "beta_slow": 1.0,
                "mscale": 1.0,
                "mscale_all_dim": 1.0,
                "rope_theta": 10000.0,
            },
            **SMALL,
        ),
    ),
    # DEEPSEEK_V4: 4 layers on the mhc stream (4 copies, 20 Sinkhorn iterations) of compressed_attention (4 heads of
    # 16 through a query rank of 12, one key/value head, sinks, RoPE on the last 8 features, grouped output 2 x 8, a
    # window of 4): heavily compressed (blocks of 4), compressed-sparse (overlapping blocks of 2, an indexer of 8 heads
    # of 8 keeping 2: 8 heads avoid top-k ties), sliding only (the main RoPE base), compressed-sparse; 4 clamped SwiGLU
    # experts of 16 top-2 plus a shared one, routed by token id on layer 0 (tid2eid given distinct random experts)
    # and by sqrt(softplus) scores with the (perturbed) correction bias elsewhere, times 1.5. transformers compresses
    # left padding into its blocks: compared unpadded (UNPADDED_REFERENCE)
    (
        "deepseek_v4",
        "DeepseekV4Config",
        dict(
            hidden_size=32,
            num_hidden_layers=4,
            num_attention_heads=4,
            head_dim=16,
            q_lora_rank=12,
            qk_rope_head_dim=8,
            sliding_window=4,
            compress_rates={"compressed_sparse_attention": 2, "heavily_compressed_attention": 4},
            layer_types=[
                "heavily_compressed_attention",
                "compressed_sparse_attention",
                "sliding_attention",
                "compressed_sparse_attention",
            ],
            mlp_layer_types=["hash_moe", "moe", "moe", "moe"],
            o_groups=2,
            o_lora_rank=8,
            index_n_heads=8,
            index_head_dim=8,
            index_topk=2,
            n_routed_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=16,
            **SMALL,
        ),
    ),
]

# The decoder cases of tests/plugins/hf/test_hf_parity.py (GPT-2, Llama, Mistral, Mixtral, Qwen2/3, Falcon, Phi, OLMo 2, ...)
# join the same checks, so every decoder model type, old or new, is held to the same six: counts, left-padded logits,
# padding invariance, greedy decoding with the cache, export, sharded checkpoints. Their end-of-sequence id is
# cleared as in SMALL above, so that greedy generation runs its 12 tokens in both. Left out: the RoPE scalings whose
# frequencies depend on the sequence's length (dynamic NTK, LongRoPE), by definition not invariant to left padding,
# and stateful in transformers (its dynamic table changes after a longer input), so their reference would depend on
# which test ran first; tests/plugins/hf/test_hf_parity.py checks them on fresh models.
LENGTH_DEPENDENT_ROPE = {"dynamic", "longrope"}
FIXTURES += [
    (name, cls.__name__, dict(kwargs, eos_token_id=None))
    for name, cls, kwargs, kind in PARITY_CASES
    if kind == "causal"
    and name not in {f[0] for f in FIXTURES}
    and (kwargs.get("rope_parameters") or {}).get("rope_type") not in LENGTH_DEPENDENT_ROPE
]


#: fixtures whose transformers reference changes with left padding, so its logits are compared row by row, each row
#: unpadded (modkit's own padding invariance is still checked on the padded batch): Llama 4's temperature tuning
#: takes the cache slot index as the position, which counts the padding; xLSTM reads no attention mask, so its
#: padding tokens enter the recurrent state; DeepSeek-V4 compresses the padding tokens into its blocks
UNPADDED_REFERENCE = {"llama4_text", "xlstm", "deepseek_v4"}

_BUILT: dict = {}


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny models gain nothing from intra-op threads, and on a shared machine they cost a lot of waiting."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _perturb_saved_buffers(hf) -> None:
    """Saved float buffers off their init too (DeepSeek-V3's ``e_score_correction_bias``, zeros at init, which then
    changes which experts are chosen) and DeepSeek-V4's token -> experts tables (``tid2eid``, zeros at init) distinct
    random experts, seeded; not the tables the converter declares computed from the config (its ``keep`` rows:
    MiniMax's lightning-attention decays), which no checkpoint holds other than so."""
    g = torch.Generator().manual_seed(3)
    recomputed = [re.compile(p) for p, _ in modkit.get_registry().hf_converter(hf.config.model_type).declaration.keep]
    saved = {n for n in hf.state_dict() if not any(p.fullmatch(n) for p in recomputed)}
    params = {name for name, _ in hf.named_parameters()}
    with torch.no_grad():
        for name, buf in hf.named_buffers():
            if name in saved and name not in params and buf.is_floating_point():
                buf.add_(torch.randn(buf.shape, generator=g, dtype=buf.dtype) * 0.2)
            elif name.endswith("tid2eid"):  # a hash router's token -> experts table (zeros at init): distinct experts
                n_experts = hf.config.n_routed_experts
                rows = torch.stack([torch.randperm(n_experts, generator=g) for _ in range(buf.shape[0])])
                buf.copy_(rows[:, : buf.shape[1]])


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """``name -> (transformers model, saved folder, modkit model)``, each built once."""

    def get(name):
        if name not in _BUILT:
            _, cls, kwargs = next(f for f in FIXTURES if f[0] == name)
            w = _quiet()
            try:
                hf = make_hf(getattr(transformers, cls), kwargs, "causal")  # every parameter off its init
                _perturb_saved_buffers(hf)
                folder = tmp_path_factory.mktemp(name) / "hf"
                hf.save_pretrained(folder)
            finally:
                w.__exit__(None, None, None)
            _BUILT[name] = (hf, folder, modkit.from_hf(folder))
        return _BUILT[name]

    return get


IDS = [f[0] for f in FIXTURES]


def test_every_registered_decoder_type_is_in_the_harness():
    """Each Hugging Face model type a plugin registers runs the six checks; BERT, an encoder with no causal decoding
    to compare, is checked for parity and round trips in tests/plugins/hf/test_hf_parity.py; the language models of
    vision-language checkpoints (their text types run here) in tests/plugins/hf/test_hf_multimodal.py."""
    from modkit_plugins.hf._wrapper import LanguageModelOf

    registry = modkit.get_registry()
    covered = {getattr(transformers, cls).model_type for _, cls, _ in FIXTURES}
    wrappers = {
        t for t in registry.hf_model_types() if isinstance(registry.hf_converter(t).declaration, LanguageModelOf)
    }
    assert wrappers == {"gemma3", "llama4", "qwen3_5", "qwen3_5_moe"}
    assert set(registry.hf_model_types()) - covered - wrappers == {"bert"}
    assert len(covered) == 65


def test_fixtures_name_registered_types():
    types = set(modkit.get_registry().hf_model_types())
    for name, cls, _ in FIXTURES:
        assert getattr(transformers, cls).model_type in types, name


@pytest.mark.parametrize("name", IDS)
def test_parameter_count_equals_transformers(name, built):
    """Trainable parameters: a tensor transformers holds as a parameter that never trains (ERNIE 4.5's correction
    bias, ``requires_grad=False``) is a buffer in modkit, as DeepSeek-V3's is in both."""
    hf, _, model = built(name)
    assert model.spec.metadata["hf_model_type"] == hf.config.model_type
    theirs = sum(p.numel() for p in hf.parameters() if p.requires_grad)
    assert modkit.count_params(model) == theirs == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("name", IDS)
def test_logits_equal_transformers_on_a_left_padded_batch(name, built):
    hf, _, model = built(name)
    ids, mask = batch(97)
    got = ours_output(model, ids, mask, "causal")
    assert torch.isfinite(got[mask.bool()]).all()
    if name in UNPADDED_REFERENCE:
        diff = 0.0
        for row in range(ids.shape[0]):
            real = ids[row : row + 1, mask[row].bool()]
            ones = torch.ones_like(real)
            diff = max(
                diff, max_real_diff(got[row : row + 1, mask[row].bool()], hf_output(hf, real, ones, "causal"), ones)
            )
    else:
        diff = max_real_diff(got, hf_output(hf, ids, mask, "causal"), mask)
    print(f"\n[types] {name:12s} max|modkit - transformers| = {diff:.2e}")
    assert diff <= TOL


@pytest.mark.parametrize("name", IDS)
def test_left_padding_gives_the_unpadded_rows_logits(name, built):
    _, _, model = built(name)
    ids, mask = batch(97)
    padded = ours_output(model, ids, mask, "causal")
    for row in range(ids.shape[0]):
        real = mask[row].bool()
        alone = ours_output(model, ids[row : row + 1, real], None, "causal")[0]
        assert (padded[row, real] - alone).abs().max().item() <= TOL, f"row {row}"


@pytest.mark.parametrize("name", IDS)
def test_greedy_decoding_with_the_cache_equals_transformers_generate(name, built):
    hf, _, model = built(name)
    ids = torch.randint(3, 97, (2, 7), generator=torch.Generator().manual_seed(5))
    w = _quiet()
    try:
        with torch.no_grad():
            theirs = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=12, do_sample=False)
    finally:
        w.__exit__(None, None, None)
    assert torch.equal(generate(model, ids, max_new_tokens=12, temperature=0), theirs)


@pytest.mark.parametrize("name", IDS)
def test_export_loads_back_in_transformers(name, built, tmp_path):
    hf, folder, model = built(name)
    out = modkit.to_hf(model, tmp_path / "export")
    original, exported = file_tensors(folder), file_tensors(out)
    assert sorted(exported) == sorted(original)
    for k, t in original.items():
        assert exported[k].dtype == t.dtype and torch.equal(exported[k], t), k
    w = _quiet()
    try:
        back = transformers.AutoModelForCausalLM.from_pretrained(out, attn_implementation="eager").eval()
    finally:
        w.__exit__(None, None, None)
    ids, mask = batch(97)
    assert max_real_diff(hf_output(back, ids, mask, "causal"), hf_output(hf, ids, mask, "causal"), mask) <= TOL
    a, b = model.spec.to_dict(), modkit.from_hf_config(out / "config.json").to_dict()
    for d in (a, b):
        d.pop("name"), d.pop("description")
    assert a == b


#: shard limit of the sharded round trip: a few tensors per shard, so fused and stacked tensors land in
#: different files from their neighbours
SHARD_BYTES = 20_000


@pytest.mark.parametrize("name", IDS)
def test_sharded_checkpoints_both_ways(name, built, tmp_path):
    hf, folder, model = built(name)
    w = _quiet()
    try:
        hf.save_pretrained(tmp_path / "theirs", max_shard_size=SHARD_BYTES)
    finally:
        w.__exit__(None, None, None)
    assert (tmp_path / "theirs" / "model.safetensors.index.json").is_file()
    loaded = modkit.from_hf(tmp_path / "theirs")
    want = model.state_dict()
    got = loaded.state_dict()
    assert sorted(got) == sorted(want)
    for k, t in want.items():
        assert torch.equal(got[k], t), k
    out = modkit.to_hf(model, tmp_path / "ours", max_shard_size=SHARD_BYTES)
    assert len(list(out.glob("model-*-of-*.safetensors"))) > 1 and not (out / "model.safetensors").exists()
    original, exported = file_tensors(folder), file_tensors(out)
    assert sorted(exported) == sorted(original)
    for k, t in original.items():
        assert torch.equal(exported[k], t), k
    w = _quiet()
    try:
        back = transformers.AutoModelForCausalLM.from_pretrained(out, attn_implementation="eager").eval()
    finally:
        w.__exit__(None, None, None)
    for k, t in hf.state_dict().items():
        assert torch.equal(back.state_dict()[k], t), k


# ------------------------------------------------------------------------------------------------- Falcon-H1's own rows


def _falcon_h1_config(**changes) -> dict:
    """The falcon_h1 fixture's config as transformers writes it, with ``changes``."""
    _, cls, kwargs = next(f for f in FIXTURES if f[0] == "falcon_h1")
    return {**getattr(transformers, cls)(**kwargs).to_dict(), **changes}


@pytest.mark.parametrize(
    "changes,field,says",
    [
        ({"hidden_act": "gelu"}, "hidden_act", "Mamba-2 convolution"),
        ({"mamba_use_mlp": False}, "mamba_use_mlp", "FFN in every layer"),
        ({"attn_layer_indices": [0]}, "attn_layer_indices", "in every layer"),
        (
            {"rope_parameters": {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5}},
            "partial_rotary_factor",
            "rotates the whole head",
        ),
        ({"mlp_multipliers": [1.25]}, "mlp_multipliers", "a list of 2 numbers"),
        ({"ssm_multipliers": [0.5, 2.0]}, "ssm_multipliers", "a list of 5 numbers"),
        ({"key_multiplier": 0.0}, "key_multiplier", "positive"),
        ({"embedding_multiplier": -1.0}, "embedding_multiplier", "positive"),
        ({"mamba_d_head": 7}, "mamba_d_head", "must equal the Mamba-2 width 48"),
        ({"mamba_n_groups": 4}, "mamba_n_groups", "does not divide mamba_n_heads = 6"),
    ],
    ids=lambda v: v if isinstance(v, str) and "_" in v else None,
)
def test_falcon_h1_refuses_by_name_what_modkit_cannot_express(changes, field, says):
    with pytest.raises(modkit.SpecError) as info:
        modkit.from_hf_config(_falcon_h1_config(**changes))
    assert any(p == field and says in m for p, m in info.value.errors), info.value.errors


def test_falcon_h1_export_refuses_a_mixer_it_cannot_hold(tmp_path):
    spec = modkit.from_hf_config(_falcon_h1_config()).to_dict()
    for mixer in (
        spec["block"]["mixer"]["mixers"][0],
        {**spec["block"]["mixer"], "mixers": spec["block"]["mixer"]["mixers"][::-1]},
    ):
        bad = {**spec, "block": {**spec["block"], "mixer": mixer}}
        with pytest.raises(modkit.CheckpointError, match="parallel mixer of an attention and a mamba2 mixer"):
            modkit.to_hf(modkit.build(bad, device="meta"), tmp_path / "out")


def test_falcon_h1_export_writes_infinity_as_transformers_5_does(built, tmp_path):
    """transformers 5 writes the default time_step_limit (0, inf) as [0.0, {"__float__": "Infinity"}] (plain JSON);
    the fixture's file is read that way and the export writes it back so."""
    _, folder, model = built("falcon_h1")
    assert json.loads((folder / "config.json").read_text())["time_step_limit"] == [0.0, {"__float__": "Infinity"}]
    text = (modkit.to_hf(model, tmp_path / "export") / "config.json").read_text()
    cfg = json.loads(text, parse_constant=lambda c: pytest.fail(f"config.json holds the non-JSON constant {c}"))
    assert cfg["time_step_limit"] == [0.0, {"__float__": "Infinity"}]
    assert model.spec.layer(0).attention.mixers[1].dt_clamp_max is None


@pytest.mark.parametrize("head_dim", [12, 64, 80])
def test_falcon_h1_key_multiplier_is_written_back_to_the_same_softmax_scale(head_dim):
    from modkit_plugins.hf.falcon_h1 import key_multiplier

    for km in (0.390625, 0.7, 1 / 3, 2.2, 0.1234567890123):
        scale = km * head_dim**-0.5  # as the converter reads it
        assert key_multiplier(scale, head_dim) * head_dim**-0.5 == scale
        assert key_multiplier(scale, head_dim, base=km) == km  # the source config's own value when it fits
    assert key_multiplier(0.7 * 12**-0.5, 12) == 0.7 and key_multiplier(None, 12) == 1.0  # the shortest decimal


# ------------------------------------------------------------------------------------------------ the hybrids

#: transformers' parameter counts at the configuration classes' defaults (Qwen3-Next-80B-A3B, Jamba v0.1): the sum
#: over ``AutoModelForCausalLM.from_config(Qwen3NextConfig())`` / ``(JambaConfig())`` built on meta, transformers
#: 5.24 (the Qwen3-Next build alone takes about 10 s, so the counts are written here)
DEFAULT_COUNTS = {"qwen3_next": 79_674_391_296, "jamba": 51_570_323_328}
#: the 2026 hybrids at their classes' defaults, counted the same way with transformers 5.25 (LFM2: every layer
#: attention, as Lfm2Config builds it without layer_types or full_attn_idxs)
DEFAULT_COUNTS.update(lfm2=2_705_497_600, qwen3_5_text=8_953_803_264, qwen3_5_moe_text=34_660_610_688)
DEFAULT_COUNTS.update(olmo_hybrid=7_430_870_688)
#: Lfm2MoeConfig() sets no layer_types, so transformers builds no model from its defaults alone; the count is the one
#: of those defaults with attention on every layer, what the converter (as LFM2's) reads an absent pattern as
DEFAULT_COUNTS.update(lfm2_moe=11_129_591_808, kimi_linear=49_133_074_464, minimax=47_373_946_880)
#: the Mamba-2 hybrids at their classes' defaults (transformers 5.25, on meta). Bamba: BambaConfig() lists no attention
#: layer, so every layer is Mamba-2 (and the RoPE acts nowhere); GraniteMoeHybridConfig() too (every layer Mamba-2)
DEFAULT_COUNTS.update(bamba=9_992_765_440, granitemoehybrid=38_601_064_448, nemotron_h=1_968_355_712)
#: Ling 3 at BailingHybridConfig's defaults (transformers 5.25, on meta): 42 layers, latent attention on every 6th,
#: 512 experts (768) top-8 after 2 dense layers
DEFAULT_COUNTS.update(bailing_hybrid=124_414_191_072)
#: xLSTM 7B (xLSTMConfig's defaults, transformers 5.25, on meta)
DEFAULT_COUNTS.update(xlstm=6_865_424_896)
#: Lfm3Config() (transformers 5.25, on meta): 24 layers, convolutions but for full attention on i % 4 == 2 and sliding
#: on i % 4 == 0 (i > 0), the per-head gate and sandwich norms, tied
DEFAULT_COUNTS.update(lfm3=1_728_801_536)
#: Gemma 3n (E4B text) at Gemma3nTextConfig's defaults (transformers 5.25, on meta): the per-layer embedding table
#: (262,144 x 35 x 256) included, the last 15 layers without key/value projections
DEFAULT_COUNTS.update(gemma3n_text=6_835_235_568)
#: LongCat-Flash at LongcatFlashConfig's defaults (transformers 5.25, on meta): 28 layers of two MLA + dense pairs and a
#: mixture of 512 experts beside 256 zero-computation ones
DEFAULT_COUNTS.update(longcat_flash=560_664_958_976)
#: Zamba2Config() (Zamba2-2.7B: 54 layers, 9 of them hybrid running one shared block with rank-128 adapters on its MLP)
DEFAULT_COUNTS.update(zamba2=2_481_848_336)
#: DeepseekV4Config() counted on meta (43 layers, d_model 4096, 256 experts; specs/deepseek-v4.json)
DEFAULT_COUNTS.update(deepseek_v4=284_325_869_015)


@pytest.mark.parametrize("model_type", sorted(DEFAULT_COUNTS))
def test_hybrid_defaults_give_transformers_parameter_count(model_type):
    """An absent key means transformers' class default: a config naming only the model type is the default model,
    its layers in the class's pattern (Qwen3-Next: gated attention on every 4th layer, mixtures everywhere; Jamba:
    attention on layers 4, 12, ..., mixtures on odd layers)."""
    spec = modkit.from_hf_config({"model_type": model_type})
    assert modkit.count_params(spec) == DEFAULT_COUNTS[model_type]
    kinds = [spec.layer(i).attention.type for i in range(spec.n_layers)]
    moe = [getattr(spec.layer(i).ffn, "type", None) == "moe" for i in range(spec.n_layers)]
    if model_type == "nemotron_h":  # single-sublayer blocks: Mamba-2, the mixture, attention, the MLP
        assert kinds == ["mamba2", "none", "gqa", "none"]
        assert [getattr(spec.layer(i).ffn, "type", None) for i in range(4)] == [None, "moe", None, "mlp"]
    if model_type not in ("qwen3_next", "jamba"):
        return
    if model_type == "qwen3_next":
        assert kinds == ["gated_deltanet", "gated_deltanet", "gated_deltanet", "gqa"] * 12 and all(moe)
        assert spec.layer(3).attention.output_gate and spec.layer(3).position.partial_rotary == 0.25
    else:
        assert kinds == (["mamba"] * 4 + ["gqa"] + ["mamba"] * 3) * 4
        assert moe == [i % 2 == 1 for i in range(32)]


#: Nemotron 3's latent mixture at NemotronHConfig's defaults with moe_latent_size = 1024 (transformers documents no
#: published latent width; 1024 is a quarter of the default hidden_size of 4096): the sum over
#: AutoModelForCausalLM.from_config(NemotronHConfig(moe_latent_size=1024)) built on meta, transformers 5.25
NEMOTRON_H_LATENT_COUNT = 1_598_863_744


def test_nemotron_h_latent_mixture_gives_transformers_parameter_count():
    """The latent projections (``fc1_latent_proj`` 4096 -> 1024, ``fc2_latent_proj`` back, no biases) are counted
    and serve every token: a token leaves only 6 of the 8 experts (1024 -> 7688 -> 1024, ReLU²) unused."""
    spec = modkit.from_hf_config({"model_type": "nemotron_h", "moe_latent_size": 1024})
    moe = spec.layer(1).ffn
    assert (moe.latent_dim, moe.latent_bias, moe.expert.d_ff) == (1024, False, 7688)
    assert modkit.count_params(spec) == NEMOTRON_H_LATENT_COUNT
    assert NEMOTRON_H_LATENT_COUNT - modkit.active_params_per_token(spec) == 6 * 2 * 1024 * 7688


def _fixture_config(name: str) -> dict:
    _, cls, kwargs = next(f for f in FIXTURES if f[0] == name)
    return getattr(transformers, cls)(**kwargs).to_dict()


#: (fixture, config change, the key each error names): what modkit cannot express is refused by name, never dropped
REFUSED = [
    # the Gated DeltaNet convolution's activation (modkit's gated_deltanet: silu)
    ("qwen3_next", {"hidden_act": "gelu"}, "hidden_act"),
    # a layer type Qwen3NextDecoderLayer builds no mixer for
    (
        "qwen3_next",
        {"layer_types": ["linear_attention", "sliding_attention", "linear_attention", "full_attention"]},
        "layer_types",
    ),
    # value heads that the key heads do not divide
    ("qwen3_next", {"linear_num_value_heads": 3}, "linear_num_value_heads"),
    # the Mamba layers' activation (modkit's mamba: silu)
    ("jamba", {"hidden_act": "gelu"}, "hidden_act"),
    # an offset at or past its period (JambaConfig.validate_architecture refuses it too)
    ("jamba", {"attn_layer_offset": 2}, "attn_layer_offset"),
    ("jamba", {"mamba_dt_rank": "full"}, "mamba_dt_rank"),
    # a layer type Lfm2DecoderLayer builds no mixer for; a convolution of one tap
    ("lfm2", {"layer_types": ["conv", "sliding_attention", "conv", "full_attention"]}, "layer_types"),
    ("lfm2", {"conv_L_cache": 1}, "conv_L_cache"),
    ("olmo_hybrid", {"hidden_act": "gelu"}, "hidden_act"),
    ("olmo_hybrid", {"layer_types": ["linear_attention", "sliding_attention"] * 2}, "layer_types"),
    ("lfm2_moe", {"layer_types": ["conv", "full_attention", "conv", "sliding_attention"]}, "layer_types"),
    ("kimi_linear", {"hidden_act": "gelu"}, "hidden_act"),
    ("kimi_linear", {"layer_types": ["linear_attention", "sliding_attention"] * 2}, "layer_types"),
    ("kimi_linear", {"num_key_value_heads": 2}, "num_key_value_heads"),
    ("minimax", {"hidden_act": "gelu"}, "hidden_act"),
    ("minimax", {"layer_types": ["full_attention", "sliding_attention"] * 2}, "layer_types"),
    # the Mamba-2 activation (modkit's mamba2: silu); Granite 4's position schemes; Nemotron-H's latent width of 0
    ("bamba", {"hidden_act": "gelu"}, "hidden_act"),
    ("granitemoehybrid", {"hidden_act": "gelu"}, "hidden_act"),
    ("granitemoehybrid", {"position_embedding_type": "alibi"}, "position_embedding_type"),
    ("granitemoehybrid", {"layer_types": ["linear_attention", "sliding_attention", "full_attention"]}, "layer_types"),
    ("nemotron_h", {"mamba_hidden_act": "gelu"}, "mamba_hidden_act"),
    ("nemotron_h", {"moe_latent_size": 0}, "moe_latent_size"),
    # xLSTM's fused layout; query/key widths the heads do not divide
    ("xlstm", {"weight_mode": "fused"}, "weight_mode"),
    ("xlstm", {"qk_dim_factor": 0.3}, "qk_dim_factor"),
    # a layer type Lfm3DecoderLayer builds no mixer for; a convolution of one tap
    ("lfm3", {"layer_types": ["conv", "sliding_attention", "linear_attention", "full_attention"]}, "layer_types"),
    ("lfm3", {"conv_L_cache": 1}, "conv_L_cache"),
]


@pytest.mark.parametrize("name,change,key", REFUSED, ids=[f"{n}-{k}" for n, _, k in REFUSED])
def test_hybrid_config_modkit_cannot_express_is_refused_by_key(name, change, key):
    cfg = {**_fixture_config(name), **change}
    with pytest.raises(modkit.SpecError) as info:
        modkit.from_hf_config(cfg)
    assert [path for path, _ in info.value.errors] == [key], info.value.errors
    value = str(change[key]) if not isinstance(change[key], list) else "sliding_attention"
    assert value in info.value.errors[0][1], info.value.errors


def test_jamba_export_refuses_layers_no_period_places(built, tmp_path):
    """Attention on layers 1 and 2 of 4: no ``attn_layer_period`` and offset put it there, so no jamba config holds the
    spec; the export says so (the mixture layers, 0 and 3, have a period: 3, offset 0)."""
    _, _, model = built("jamba")
    d = model.spec.to_dict()
    (override,) = [o for o in d["overrides"] if o.get("mixer")]
    override["layers"] = [1, 2]
    other = modkit.build(d, seed=0)
    with pytest.raises(modkit.CheckpointError, match=r"attention layers are on layers \[1, 2\].*attn_layer_period"):
        modkit.to_hf(other, tmp_path / "out")


def test_qwen3_next_carries_the_multi_token_prediction_module(built, tmp_path):
    """A published checkpoint's ``mtp.*`` tensors (which transformers does not load) load into
    ``checkpoint_extras`` and are written back bitwise."""
    from safetensors.torch import save_file

    _, folder, _ = built("qwen3_next")
    src = tmp_path / "hf"
    src.mkdir()
    (src / "config.json").write_text((folder / "config.json").read_text())
    tensors = file_tensors(folder)
    mtp = torch.randn(8, 32, generator=torch.Generator().manual_seed(7))
    save_file({**tensors, "mtp.fc.weight": mtp}, str(src / "model.safetensors"), metadata={"format": "pt"})
    model = modkit.from_hf(src)
    assert torch.equal(model.checkpoint_extras["mtp.fc.weight"], mtp)
    exported = file_tensors(modkit.to_hf(model, tmp_path / "out"))
    assert sorted(exported) == sorted([*tensors, "mtp.fc.weight"]) and torch.equal(exported["mtp.fc.weight"], mtp)


#: hybrids whose layers leave out a part: no mixture (Jamba with num_experts 1, Qwen3-Next with none), no attention
#: layer (Jamba's period past the depth), mixtures on every second layer only (decoder_sparse_step 2)
PATTERNS = [
    (
        "jamba-dense",
        "JambaConfig",
        dict(
            hidden_size=32,
            num_attention_heads=4,
            num_key_value_heads=2,
            intermediate_size=48,
            num_hidden_layers=9,
            num_experts=1,
            mamba_dt_rank=4,
        ),
    ),
    (
        "jamba-no-attention",
        "JambaConfig",
        dict(
            hidden_size=32,
            num_attention_heads=4,
            num_key_value_heads=2,
            intermediate_size=48,
            num_hidden_layers=3,
            attn_layer_period=4,
            attn_layer_offset=3,
        ),
    ),
    (
        "qwen3_next-attention-only",
        "Qwen3NextConfig",
        dict(
            hidden_size=32,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=8,
            num_hidden_layers=2,
            layer_types=["full_attention"] * 2,
            num_experts=0,
            intermediate_size=40,
        ),
    ),
    (
        "qwen3_next-sparse-step",
        "Qwen3NextConfig",
        dict(
            hidden_size=32,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=8,
            num_hidden_layers=4,
            decoder_sparse_step=2,
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=8,
            shared_expert_intermediate_size=8,
            intermediate_size=40,
            linear_num_key_heads=2,
            linear_num_value_heads=2,
            linear_key_head_dim=8,
            linear_value_head_dim=8,
        ),
    ),
    # Granite 4.0-H without experts (the shared SwiGLU is the whole FFN) and without RoPE (the default)
    (
        "granitemoehybrid-dense-nope",
        "GraniteMoeHybridConfig",
        dict(
            hidden_size=32,
            num_attention_heads=4,
            num_key_value_heads=2,
            num_hidden_layers=3,
            layer_types=["linear_attention", "full_attention", "linear_attention"],
            num_local_experts=0,
            shared_intermediate_size=40,
            mamba_n_heads=8,
            mamba_d_state=8,
        ),
    ),
    # Bamba with no attention layer (the default): every layer Mamba-2, the RoPE acting nowhere
    (
        "bamba-no-attention",
        "BambaConfig",
        dict(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2, mamba_n_heads=8),
    ),
]


@pytest.mark.parametrize("name,cls,kwargs", PATTERNS, ids=[p[0] for p in PATTERNS])
def test_hybrid_layer_patterns_convert_both_ways(name, cls, kwargs):
    """transformers' parameter count (both built on meta), and the config an export writes (for the fields a spec
    without mixtures or without attention does not hold: the source's values) builds the same network again in
    transformers and in modkit."""
    import warnings

    config_class = getattr(transformers, cls)
    cfg = config_class(**kwargs)
    spec = modkit.from_hf_config(cfg.to_dict())
    written = modkit.get_registry().hf_converter(cfg.model_type).declaration.weights.hf_config(spec, cfg.to_dict())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with torch.device("meta"):
            counts = [
                sum(p.numel() for p in transformers.AutoModelForCausalLM.from_config(c).parameters())
                for c in (cfg, config_class(**{k: v for k, v in written.items() if k != "model_type"}))
            ]
    assert modkit.count_params(spec) == counts[0] == counts[1]
    a, b = spec.to_dict(), modkit.from_hf_config(written).to_dict()
    for d in (a, b):
        d.pop("name"), d.pop("description")
    assert a == b


# ------------------------------------------------------------------------------------------------ the 2026 hybrids


def test_per_layer_placements_that_no_config_holds_are_refused_on_export(built, tmp_path):
    """MiniMax writes one set of factors per layer type and OLMo Hybrid's placements follow its layer types: a spec
    whose lightning layers differ from each other, or whose attention layer is pre-norm, is refused by name (the
    export's converted-back check), not written as another network."""
    _, _, model = built("minimax")
    d = model.spec.to_dict()
    d["overrides"].append({"layers": [3], "placement": {"type": "deepnorm", "attn_alpha": 2.0}})
    with pytest.raises(modkit.CheckpointError, match="placement"):
        modkit.to_hf(modkit.build(d, seed=0), tmp_path / "minimax")
    _, _, model = built("olmo_hybrid")
    d = model.spec.to_dict()
    (override,) = [o for o in d["overrides"] if o.get("placement")]
    override["placement"] = {"type": "pre"}
    with pytest.raises(modkit.CheckpointError, match="placement"):
        modkit.to_hf(modkit.build(d, seed=0), tmp_path / "olmo_hybrid")


def test_lfm2_ffn_width_is_written_as_the_source_config_sized_it():
    """LFM2's FFN width comes from intermediate_size through the auto-adjustment; the export writes the source's four
    sizing keys when they give the width again, else the width itself without adjustment, and both convert back."""
    from modkit_plugins.hf.lfm2 import ffn_width

    assert ffn_width(100, True, 1.5, 16) == 112 and ffn_width(12288, True, 1.0, 256) == 8192
    assert ffn_width(100, True, None, 16) == 66 and ffn_width(100, False, 1.5, 16) == 100
    cfg = _fixture_config("lfm2")
    spec = modkit.from_hf_config(cfg)
    weights = modkit.get_registry().hf_converter("lfm2").declaration.weights
    again = weights.hf_config(spec, cfg)
    assert (again["intermediate_size"], again["block_auto_adjust_ff_dim"]) == (100, True)
    fresh = weights.hf_config(spec, {})
    assert (fresh["intermediate_size"], fresh["block_auto_adjust_ff_dim"]) == (112, False)
    for written in (again, fresh):
        assert modkit.from_hf_config(written).layer(0).ffn.d_ff == 112
    assert again["full_attn_idxs"] == [1, 3] and again["layer_types"] == cfg["layer_types"]


# --- sparse attention types ---
# Appended here (the parametrised tests above read FIXTURES and IDS when pytest collects, after the module ran).
SPARSE_FIXTURES = [
    # DeepSeek-V3.2: DeepSeek-V3's fixture with the lightning indexer on every layer (8 heads of 16, half-split RoPE
    # on its first 8 features) keeping the top 4 keys per query: fewer than the 9-token batch and the 7 + 12
    # generated tokens, so selection happens; one dense layer, then mixtures as in deepseek_v3
    (
        "deepseek_v32",
        "DeepseekV32Config",
        dict(
            hidden_size=64,
            num_attention_heads=4,
            num_key_value_heads=4,
            num_hidden_layers=3,
            intermediate_size=96,
            moe_intermediate_size=16,
            n_routed_experts=8,
            num_experts_per_tok=2,
            n_group=4,
            topk_group=2,
            n_shared_experts=2,
            first_k_dense_replace=1,
            q_lora_rank=24,
            kv_lora_rank=16,
            qk_rope_head_dim=8,
            qk_nope_head_dim=8,
            v_head_dim=12,
            index_n_heads=8,
            index_head_dim=16,
            index_topk=4,
            rope_parameters={
                "rope_type": "yarn",
                "factor": 4.0,
                "original_max_position_embeddings": 16,
                "beta_fast": 32.0,
                "beta_slow": 1.0,
                "mscale": 1.0,
                "mscale_all_dim": 1.0,
                "rope_theta": 10000.0,
            },
            **SMALL,
        ),
    ),
]
# GLM-5: the same with interleaved RoPE in the indexer and 4 layers, of which 1 and 3 reuse the selection of
# layers 0 and 2 (indexer_types shared): no indexer, no index keys there
SPARSE_FIXTURES.append(
    (
        "glm_moe_dsa",
        "GlmMoeDsaConfig",
        dict(
            SPARSE_FIXTURES[0][2],
            num_hidden_layers=4,
            n_group=1,
            topk_group=1,
            indexer_types=["full", "shared", "full", "shared"],
        ),
    )
)
FIXTURES += SPARSE_FIXTURES
IDS += [f[0] for f in SPARSE_FIXTURES]

# ZAMBA2: Mamba-2 alone on layer 0 (8 heads of 8, 2 groups of B/C of 8, convolution 3, chunks of 4: shorter than the
# 9-token batch); layers 1-4 hybrid, running two shared blocks alternately (num_mem_blocks 2: layers 1 and 3 share
# block 0, layers 2 and 4 block 1), each block RMSNorm, attention over [stream, embeddings] (64 wide: 4 heads of 16,
# RoPE), RMSNorm, a GELU-gated MLP of 48, every use with its own rank-4 LoRA adapters on q, k, v and on the fused
# gate/up projection, and its own projection of the block's output into its Mamba-2 input. add_bias_linear stays
# off: with it transformers lets in_proj's bias at padding positions into the convolution, so its own left-padded
# logits differ from its unpadded ones
FIXTURES.append(
    (
        "zamba2",
        "Zamba2Config",
        dict(
            hidden_size=32,
            num_attention_heads=4,
            intermediate_size=48,
            layers_block_type=["linear_attention", "hybrid", "hybrid", "hybrid", "hybrid"],
            num_hidden_layers=5,
            num_mem_blocks=2,
            use_shared_attention_adapter=True,
            adapter_rank=4,
            use_mem_rope=True,
            n_mamba_heads=8,
            mamba_d_state=8,
            mamba_ngroups=2,
            mamba_d_conv=3,
            chunk_size=4,
            **SMALL,
        ),
    )
)
IDS.append("zamba2")

"""Today's mixtures of experts as ``moe`` specs equal transformers' modules on the same weights (float32, 1e-5).

DeepSeek-V3 (sigmoid router, selection-only correction bias, group-limited top-k, routed scaling, shared experts),
Qwen2-MoE (sigmoid-gated shared expert, ``norm_topk_prob`` both ways), Qwen3-MoE, gpt-oss (router with a bias,
experts with biases and the clamped SwiGLU, interleaved gate/up) and Llama 4 (sigmoid of the top logit scaling the
expert's *input*, shared expert). Each transformers module is built from a small config, filled with seeded
random weights, and its weights are copied into the modkit module: the math is compared, not the init.
Dense first layers and interleaved MoE layers (``first_k_dense_replace``, ``decoder_sparse_step``,
``interleave_moe_layer_step``) are written as overrides and give transformers' layer pattern.
"""

from __future__ import annotations

import pytest
import torch

import modkit
from modkit import BuildContext

transformers = pytest.importorskip("transformers")

ATOL = 1e-5
D = 16


def build(cfg: dict, d_model: int = D) -> torch.nn.Module:
    """The modkit ``moe`` of ``cfg`` (a config dict), built alone."""
    from modkit.spec import load_component

    ctx = BuildContext(d_model, 1, 32, 64, modkit.get_registry())
    return ctx.build(load_component("ffn", cfg))


def fill(module: torch.nn.Module, seed: int, std: float = 0.5) -> None:
    """Seeded N(0, std^2) values in every parameter (transformers leaves expert weights uninitialised)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * std)


def set_(param: torch.Tensor, value: torch.Tensor) -> None:
    with torch.no_grad():
        assert param.shape == value.shape, (param.shape, value.shape)
        param.copy_(value)


def copy_mlp(ours: torch.nn.Module, gate: torch.nn.Linear, up: torch.nn.Linear, down: torch.nn.Linear) -> None:
    """A transformers gate/up/down MLP into a modkit ``swiglu``."""
    set_(ours.gate.weight, gate.weight)
    set_(ours.up.weight, up.weight)
    set_(ours.down.weight, down.weight)


def copy_concat_experts(ours, gate_up_proj: torch.Tensor, down_proj: torch.Tensor) -> None:
    """transformers' ``gate_up_proj [n, 2 d_ff, d]`` (gate first) and ``down_proj [n, d, d_ff]`` into stacked experts."""
    ff = gate_up_proj.shape[1] // 2
    set_(ours.gate, gate_up_proj[:, :ff].transpose(1, 2))
    set_(ours.up, gate_up_proj[:, ff:].transpose(1, 2))
    set_(ours.down, down_proj.transpose(1, 2))


def inputs(seed: int = 7, std: float = 1.0, shape=(3, 7, D)) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * std


# ------------------------------------------------------------------------------------------------ DeepSeek-V3


def deepseek_pair(norm_topk_prob: bool = True):
    from transformers import DeepseekV3Config
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3MoE

    cfg = DeepseekV3Config(
        hidden_size=D,
        intermediate_size=48,
        moe_intermediate_size=8,
        n_routed_experts=8,
        num_experts_per_tok=3,
        n_group=4,
        topk_group=2,
        n_shared_experts=2,
        routed_scaling_factor=2.5,
        norm_topk_prob=norm_topk_prob,
        hidden_act="silu",
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
    )
    hf = DeepseekV3MoE(cfg).eval()
    fill(hf, 0)
    with torch.no_grad():
        hf.gate.weight.normal_(0.0, 1.0, generator=torch.Generator().manual_seed(1))
        hf.gate.e_score_correction_bias.copy_(torch.randn(8, generator=torch.Generator().manual_seed(2)) * 0.3)
        hf.experts.down_proj.mul_(
            0.3
        )  # outputs of order 1 despite the scaling by 2.5: 1e-5 compares math, not rounding
    ours = build(
        {
            "type": "moe",
            "n_experts": 8,
            "top_k": 3,
            "expert": {"type": "swiglu", "d_ff": 8},
            "shared": {"type": "swiglu", "d_ff": 16},  # n_shared_experts x moe_intermediate_size
            "router": {
                "type": "sigmoid_topk",
                "renormalize": norm_topk_prob,
                "correction_bias": True,
                "n_group": 4,
                "topk_group": 2,
                "routed_scaling_factor": 2.5,
            },
        }
    )
    set_(ours.router.proj.weight, hf.gate.weight)
    set_(ours.router.correction_bias, hf.gate.e_score_correction_bias)
    copy_concat_experts(ours.experts, hf.experts.gate_up_proj, hf.experts.down_proj)
    e = hf.shared_experts
    copy_mlp(ours.shared, e.gate_proj, e.up_proj, e.down_proj)
    return hf, ours


@pytest.mark.parametrize("norm_topk_prob", [True, False])
def test_deepseek_v3_moe(norm_topk_prob):
    hf, ours = deepseek_pair(norm_topk_prob)
    x = inputs()
    with torch.no_grad():
        want = hf(x)
        got, _ = ours(x)
    torch.testing.assert_close(got, want, atol=ATOL, rtol=0)
    # the case exercises what it claims: the bias and the group limit change some token's experts
    with torch.no_grad():
        _, idx, logits = ours.router(x.reshape(-1, D))
        plain = torch.topk(torch.sigmoid(logits), 3, dim=-1).indices
        biased = torch.topk(torch.sigmoid(logits) + ours.router.correction_bias, 3, dim=-1).indices
    same = lambda a, b: (a.sort(-1).values == b.sort(-1).values).all(-1)  # noqa: E731
    assert not same(biased, plain).all(), "the correction bias changes no selection: the case is too weak"
    assert not same(idx, biased).all(), "the group limit changes no selection: the case is too weak"


def test_deepseek_correction_bias_selects_but_does_not_weigh():
    """The same logits with and without the bias: the weights of an expert chosen both ways are equal."""
    _, ours = deepseek_pair(norm_topk_prob=False)
    x = inputs(seed=3).reshape(-1, D)
    with torch.no_grad():
        w, idx, logits = ours.router(x)
    s = torch.sigmoid(logits)
    torch.testing.assert_close(w, 2.5 * s.gather(-1, idx), atol=1e-6, rtol=0)  # unbiased scores, scaled


# ------------------------------------------------------------------------------------------------ Qwen2 / Qwen3


@pytest.mark.parametrize("norm_topk_prob", [True, False])
def test_qwen2_moe_sparse_block_with_gated_shared_expert(norm_topk_prob):
    from transformers import Qwen2MoeConfig
    from transformers.models.qwen2_moe.modeling_qwen2_moe import Qwen2MoeSparseMoeBlock

    cfg = Qwen2MoeConfig(
        hidden_size=D,
        moe_intermediate_size=8,
        shared_expert_intermediate_size=24,
        num_experts=6,
        num_experts_per_tok=2,
        norm_topk_prob=norm_topk_prob,
        hidden_act="silu",
    )
    hf = Qwen2MoeSparseMoeBlock(cfg).eval()
    fill(hf, 4)
    ours = build(
        {
            "type": "moe",
            "n_experts": 6,
            "top_k": 2,
            "expert": {"type": "swiglu", "d_ff": 8},
            "shared": {"type": "swiglu", "d_ff": 24},
            "shared_gate": True,
            "router": {"type": "topk", "renormalize": norm_topk_prob},
        }
    )
    set_(ours.router.proj.weight, hf.gate.weight)
    copy_concat_experts(ours.experts, hf.experts.gate_up_proj, hf.experts.down_proj)
    copy_mlp(ours.shared, hf.shared_expert.gate_proj, hf.shared_expert.up_proj, hf.shared_expert.down_proj)
    set_(ours.shared_gate.weight, hf.shared_expert_gate.weight)
    x = inputs(seed=5)
    with torch.no_grad():
        torch.testing.assert_close(ours(x)[0], hf(x), atol=ATOL, rtol=0)


def test_qwen3_moe_sparse_block():
    from transformers import Qwen3MoeConfig
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

    cfg = Qwen3MoeConfig(
        hidden_size=D,
        moe_intermediate_size=8,
        num_experts=8,
        num_experts_per_tok=2,
        norm_topk_prob=True,
        hidden_act="silu",
    )
    hf = Qwen3MoeSparseMoeBlock(cfg).eval()
    fill(hf, 6)
    ours = build(
        {
            "type": "moe",
            "n_experts": 8,
            "top_k": 2,
            "expert": {"type": "swiglu", "d_ff": 8},
            "router": {"type": "topk", "renormalize": True},
        }
    )
    set_(ours.router.proj.weight, hf.gate.weight)
    copy_concat_experts(ours.experts, hf.experts.gate_up_proj, hf.experts.down_proj)
    x = inputs(seed=8)
    with torch.no_grad():
        torch.testing.assert_close(ours(x)[0], hf(x), atol=ATOL, rtol=0)


# ------------------------------------------------------------------------------------------------ gpt-oss


def test_gpt_oss_mlp_router_bias_expert_biases_and_swiglu_clamped():
    from transformers import GptOssConfig
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssMLP

    cfg = GptOssConfig(
        hidden_size=D,
        intermediate_size=8,
        num_local_experts=4,
        num_experts_per_tok=2,
        swiglu_limit=7.0,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=8,
    )
    hf = GptOssMLP(cfg).eval()
    fill(hf, 9, std=1.0)  # large enough that the clamps act (checked below)
    with torch.no_grad():  # outputs of order 1, so that 1e-5 is a float32 comparison, not a rounding one
        hf.experts.down_proj.mul_(0.05)
        hf.experts.down_proj_bias.mul_(0.05)
    ours = build(
        {
            "type": "moe",
            "n_experts": 4,
            "top_k": 2,
            "expert": {"type": "swiglu_clamped", "d_ff": 8, "bias": True, "alpha": 1.702, "limit": 7.0},
            "router": {"type": "topk", "renormalize": True, "bias": True},
        }
    )
    set_(ours.router.proj.weight, hf.router.weight)
    set_(ours.router.proj.bias, hf.router.bias)
    ex = hf.experts  # gate_up_proj [n, d, 2 d_ff] interleaved: gate at even columns, up at odd ones
    set_(ours.experts.gate, ex.gate_up_proj[..., ::2])
    set_(ours.experts.up, ex.gate_up_proj[..., 1::2])
    set_(ours.experts.gate_bias, ex.gate_up_proj_bias[..., ::2])
    set_(ours.experts.up_bias, ex.gate_up_proj_bias[..., 1::2])
    set_(ours.experts.down, ex.down_proj)
    set_(ours.experts.down_bias, ex.down_proj_bias)
    x = inputs(seed=10, std=2.0)
    with torch.no_grad():
        want, _ = hf(x)
        got, _ = ours(x)
        gate_up = x.reshape(-1, D) @ ex.gate_up_proj[0] + ex.gate_up_proj_bias[0]
    assert (gate_up[:, ::2] > 7.0).any() and (gate_up[:, 1::2].abs() > 7.0).any(), "the clamps never act: case too weak"
    torch.testing.assert_close(got, want, atol=ATOL, rtol=0)


def test_swiglu_clamped_dense_equals_gpt_oss_gate():
    """The dense ``swiglu_clamped`` equals ``GptOssExperts._apply_gate`` followed by the down projection."""
    from transformers import GptOssConfig
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssExperts

    cfg = GptOssConfig(hidden_size=D, intermediate_size=8, num_local_experts=1, num_experts_per_tok=1)
    ex = GptOssExperts(cfg)
    fill(ex, 11, std=1.0)
    with torch.no_grad():  # outputs of order 1 (the clamps still act on the gate/up values)
        ex.down_proj.mul_(0.05)
        ex.down_proj_bias.mul_(0.05)
    from modkit.spec import load_component

    ours = BuildContext(D, 1, 32, 64, modkit.get_registry()).build(
        load_component("ffn", {"type": "swiglu_clamped", "d_ff": 8, "bias": True})
    )
    set_(ours.gate.weight, ex.gate_up_proj[0, :, ::2].t())
    set_(ours.gate.bias, ex.gate_up_proj_bias[0, ::2])
    set_(ours.up.weight, ex.gate_up_proj[0, :, 1::2].t())
    set_(ours.up.bias, ex.gate_up_proj_bias[0, 1::2])
    set_(ours.down.weight, ex.down_proj[0].t())
    set_(ours.down.bias, ex.down_proj_bias[0])
    x = inputs(seed=12, std=2.0, shape=(2, 5, D))
    with torch.no_grad():
        want = ex._apply_gate(x @ ex.gate_up_proj[0] + ex.gate_up_proj_bias[0]) @ ex.down_proj[0] + ex.down_proj_bias[0]
        torch.testing.assert_close(ours(x), want, atol=ATOL, rtol=0)


# ------------------------------------------------------------------------------------------------ Llama 4


@pytest.mark.parametrize("top_k", [1, 2])
def test_llama4_text_moe_scales_the_expert_input(top_k):
    from transformers import Llama4TextConfig
    from transformers.models.llama4.modeling_llama4 import Llama4TextMoe

    cfg = Llama4TextConfig(
        hidden_size=D,
        intermediate_size=8,
        intermediate_size_mlp=32,
        num_local_experts=4,
        num_experts_per_tok=top_k,
        hidden_act="silu",
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=8,
    )
    hf = Llama4TextMoe(cfg).eval()
    fill(hf, 13)
    ours = build(
        {
            "type": "moe",
            "n_experts": 4,
            "top_k": top_k,
            "expert": {"type": "swiglu", "d_ff": 8},
            "shared": {"type": "swiglu", "d_ff": 8},
            "weight_on": "input",
            "router": {"type": "sigmoid_topk", "renormalize": False},
        }
    )
    set_(ours.router.proj.weight, hf.router.weight)
    ex = hf.experts  # gate_up_proj [n, d, 2 d_ff]: gate is the first half (chunk)
    set_(ours.experts.gate, ex.gate_up_proj[..., :8])
    set_(ours.experts.up, ex.gate_up_proj[..., 8:])
    set_(ours.experts.down, ex.down_proj)
    copy_mlp(ours.shared, hf.shared_expert.gate_proj, hf.shared_expert.up_proj, hf.shared_expert.down_proj)
    x = inputs(seed=14)
    with torch.no_grad():
        want, _ = hf(x)
        got, _ = ours(x)
    torch.testing.assert_close(got.reshape(-1, D), want, atol=ATOL, rtol=0)
    # scaling the output instead of the input is a different function (SwiGLU is not linear)
    other = build({**ours_cfg_output(top_k)})
    other.load_state_dict(ours.state_dict())
    with torch.no_grad():
        assert (other(x)[0].reshape(-1, D) - want).abs().max() > 1e-3


def ours_cfg_output(top_k: int) -> dict:
    return {
        "type": "moe",
        "n_experts": 4,
        "top_k": top_k,
        "expert": {"type": "swiglu", "d_ff": 8},
        "shared": {"type": "swiglu", "d_ff": 8},
        "weight_on": "output",
        "router": {"type": "sigmoid_topk", "renormalize": False},
    }


# ------------------------------------------------------------------------------------------------ layer patterns


def _spec(ffn: dict, overrides: list, n_layers: int = 6) -> dict:
    return {
        "schema_version": 1,
        "vocab_size": 64,
        "d_model": D,
        "n_layers": n_layers,
        "max_seq_len": 32,
        "position": {"type": "rope", "theta": 10000.0},
        "block": {
            "attention": {"type": "gqa", "n_heads": 2, "n_kv_heads": 1},
            "ffn": ffn,
            "norm": {"type": "rmsnorm", "eps": 1e-6},
            "placement": {"type": "pre"},
        },
        "overrides": overrides,
        "final_norm": {"type": "rmsnorm", "eps": 1e-6},
    }


MOE = {
    "type": "moe",
    "n_experts": 4,
    "top_k": 2,
    "expert": {"type": "swiglu", "d_ff": 8},
    "router": {"type": "topk", "renormalize": True},
}
DENSE = {"type": "swiglu", "d_ff": 32}


def _moe_layers(spec: dict) -> list[int]:
    model = modkit.build(spec, device="meta")
    return [i for i, layer in enumerate(model.layers) if layer.ffn.modkit_type == "moe"]


@pytest.mark.parametrize("k", [1, 3])
def test_first_k_dense_replace_is_an_override(k):
    """DeepSeek: layer i is MoE when i >= first_k_dense_replace (transformers DeepseekV3DecoderLayer)."""
    spec = _spec(MOE, [{"layers": {"start": 0, "stop": k}, "ffn": DENSE}])
    assert _moe_layers(spec) == [i for i in range(6) if i >= k]


@pytest.mark.parametrize("step, mlp_only", [(1, []), (2, []), (3, [5])])
def test_decoder_sparse_step_and_mlp_only_layers_are_overrides(step, mlp_only):
    """Qwen2-MoE: layer i is MoE when i not in mlp_only_layers and (i + 1) % decoder_sparse_step == 0."""
    overrides = [{"layers": {"start": step - 1, "step": step}, "ffn": MOE}]
    if mlp_only:
        overrides.append({"layers": mlp_only, "ffn": DENSE})
    spec = _spec(DENSE, overrides)
    assert _moe_layers(spec) == [i for i in range(6) if i not in mlp_only and (i + 1) % step == 0]


@pytest.mark.parametrize("step", [1, 2, 4])
def test_interleave_moe_layer_step_is_an_override(step):
    """Llama 4: moe_layers = range(interleave_moe_layer_step - 1, n_layers, interleave_moe_layer_step)."""
    from transformers import Llama4TextConfig

    cfg = Llama4TextConfig(num_hidden_layers=6, interleave_moe_layer_step=step)
    spec = _spec(DENSE, [{"layers": {"start": step - 1, "step": step}, "ffn": MOE}])
    assert _moe_layers(spec) == list(cfg.moe_layers)

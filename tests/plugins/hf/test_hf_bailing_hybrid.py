"""``bailing_hybrid`` (Ling 3) beyond the six checks of ``test_hf_types.py``: the softplus forget gate
(``kda_safe_gate: false``) on a tiny transformers model, what modkit cannot express refused by key, and exports that
a Ling checkpoint cannot hold refused by name."""

from __future__ import annotations

import pytest

import modkit
from modkit.plugin import CheckpointError
from modkit_plugins.hf.bailing_hybrid import GatedLatent, write_layers
from modkit_plugins.kimi_delta import KimiDeltaConfig

transformers = pytest.importorskip("transformers")

from hf_fallback import force_torch_fallback  # noqa: E402

force_torch_fallback()

from test_hf_parity import _quiet, batch, hf_output, make_hf, max_real_diff, ours_output  # noqa: E402
from test_hf_types import FIXTURES  # noqa: E402

KWARGS = next(kw for name, _, kw in FIXTURES if name == "bailing_hybrid")


def _config(**changes) -> dict:
    return transformers.BailingHybridConfig(**{**KWARGS, **changes}).to_dict()


#: DeepSeek's YaRN on the latent attention: the rotary frequencies and the softmax scale's mscale²
YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 4}
YARN.update(beta_fast=32.0, beta_slow=1.0, mscale=1.0, mscale_all_dim=0.8)


def test_softplus_forget_gate_and_yarn_equal_transformers(tmp_path):
    """kda_safe_gate false: kimi_delta's softplus gate (no lower bound); YaRN with mscale_all_dim on the latent
    attention; logits within 1e-5 on a left-padded batch, and the export writes kda_safe_gate false back."""
    w = _quiet()
    try:
        kwargs = {**KWARGS, "kda_safe_gate": False, "rope_parameters": YARN}
        hf = make_hf(transformers.BailingHybridConfig, kwargs, "causal", seed=2)
        hf.save_pretrained(tmp_path / "hf")
    finally:
        w.__exit__(None, None, None)
    model = modkit.from_hf(tmp_path / "hf")
    mixer = model.spec.layer(0).attention
    assert (mixer.type, mixer.forget_gate, mixer.gate_lower_bound, mixer.full_rank_gates) == (
        "kimi_delta",
        "softplus",
        None,
        True,
    )
    assert model.spec.layer(1).attention.yarn_mscale.mscale_all_dim == 0.8
    ids, mask = batch(97)
    diff = max_real_diff(ours_output(model, ids, mask, "causal"), hf_output(hf, ids, mask, "causal"), mask)
    print(f"\n[bailing_hybrid] softplus gate, YaRN: max|modkit - transformers| = {diff:.2e}")
    assert diff <= 1e-5
    out = modkit.to_hf(model, tmp_path / "export")
    back = transformers.AutoConfig.from_pretrained(out)
    assert back.kda_safe_gate is False and back.linear_head_dim == 8 and back.linear_num_heads == 4


def test_bounded_gate_and_layer_pattern_by_default():
    spec = modkit.from_hf_config(_config(layer_types=None, layer_group_size=2, mlp_layer_types=None))
    kinds = [spec.layer(i).attention.type for i in range(4)]
    assert kinds == ["kimi_delta", "mla", "kimi_delta", "mla"]
    assert spec.layer(0).attention.forget_gate == "bounded" and spec.layer(0).attention.gate_lower_bound == -3.0
    assert spec.layer(1).attention.head_gate and spec.layer(1).position.layout == "interleaved"
    assert [getattr(spec.layer(i).ffn, "type", None) for i in range(4)] == ["swiglu", "moe", "moe", "moe"]


REFUSED = [
    ({"hidden_act": "gelu"}, "hidden_act", "gelu"),
    ({"layer_types": ["linear_attention", "sliding_attention"] * 2}, "layer_types", "sliding_attention"),
    ({"num_key_value_heads": 2}, "num_key_value_heads", "2"),
    ({"kda_lower_bound": 0.5}, "kda_lower_bound", "0.5"),
    ({"expert_swiglu_limit_list": [0, 7.0, 7.0, 7.0]}, "expert_swiglu_limit_list", "7.0"),
    ({"share_expert_swiglu_limit_list": [0, 0, 0, 3]}, "share_expert_swiglu_limit_list", "3"),
]


@pytest.mark.parametrize("change,key,says", REFUSED, ids=[r[1] for r in REFUSED])
def test_what_modkit_cannot_express_is_refused_by_key(change, key, says):
    cfg = {**_config(), **change}
    with pytest.raises(modkit.SpecError) as info:
        modkit.from_hf_config(cfg)
    assert [path for path, _ in info.value.errors] == [key], info.value.errors
    assert says in info.value.errors[0][1]


def _fields(mixer: KimiDeltaConfig, head_gate: bool = True) -> dict:
    return {
        "n_layers": 2,
        "mixers": [mixer, None],
        "mixer": mixer,
        "moe": False,
        "moe_layers": None,
        "n_heads": 4,
        "mla": {"kv_lora_rank": 16, "head_gate": head_gate},
    }


def test_exports_a_ling_checkpoint_cannot_hold_are_refused():
    full = KimiDeltaConfig(n_heads=4, head_dim=8, full_rank_gates=True, forget_gate="bounded", gate_lower_bound=-2.0)
    cfg: dict = {}
    write_layers(_fields(full), {}, cfg)
    assert cfg["kda_safe_gate"] is True and cfg["kda_lower_bound"] == -2.0 and cfg["linear_head_dim"] == 8
    assert cfg["layer_types"] == ["linear_attention", "full_attention"]
    assert cfg["expert_swiglu_limit_list"] == [0, 0]
    with pytest.raises(CheckpointError, match="full_rank_gates true"):
        write_layers(_fields(KimiDeltaConfig(n_heads=4, head_dim=8)), {}, {})
    with pytest.raises(CheckpointError, match="set head_gate true"):
        GatedLatent().write(_fields(full, head_gate=False), {}, "q_lora_rank")

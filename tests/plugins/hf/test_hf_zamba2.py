"""Zamba2's own rows (``modkit_plugins/hf/zamba2.py``): the default layer pattern as one shared block over the nine
hybrid layers, alternating blocks as one share group each, and what modkit cannot express refused by key. The six
checks against transformers run in ``test_hf_types.py`` (fixture ``zamba2``)."""

from __future__ import annotations

import pytest

import modkit

#: a tiny Zamba2 config: Mamba-2 on layer 0, hybrid layers 1-4
TINY = {
    "model_type": "zamba2",
    "vocab_size": 97,
    "hidden_size": 32,
    "num_attention_heads": 4,
    "intermediate_size": 48,
    "layers_block_type": ["linear_attention", "hybrid", "hybrid", "hybrid", "hybrid"],
    "num_hidden_layers": 5,
    "n_mamba_heads": 8,
    "mamba_d_state": 8,
    "chunk_size": 4,
    "adapter_rank": 4,
}


def test_the_default_config_shares_one_block_over_its_nine_hybrid_layers_with_mlp_adapters():
    spec = modkit.from_hf_config({"model_type": "zamba2"})
    hybrid = [i for i in range(54) if spec.layer(i).attention.type == "side_input"]
    assert hybrid == [6, 12, 18, 24, 30, 36, 42, 47, 51]
    (group,) = spec.share
    assert group.indices(54) == hybrid and group.part == "attention.side"
    assert (group.adapter.rank, group.adapter.targets, group.adapter.fuse) == (128, ["gate", "up"], [["gate", "up"]])
    side = spec.layer(6).attention
    assert (side.side_mixer.n_heads, side.side_mixer.head_dim, side.side_ffn.d_ff) == (32, 160, 10240)
    assert side.side_mixer.softmax_scale == 80**-0.5 and spec.position.type == "none"


def test_alternating_blocks_are_one_share_group_each_with_attention_adapters():
    spec = modkit.from_hf_config(
        {**TINY, "num_mem_blocks": 2, "use_shared_attention_adapter": True, "use_mem_rope": True}
    )
    assert [g.indices(5) for g in spec.share] == [[1, 3], [2, 4]]
    assert spec.share[0].adapter.targets == ["q_proj", "k_proj", "v_proj", "gate", "up"]
    assert spec.position.type == "rope" and spec.layer(0).attention.type == "mamba2"
    assert spec.layer(1).attention.mixer.dt_clamp_min == 0.001 and spec.layer(1).attention.mixer.conv_bias


@pytest.mark.parametrize(
    "change, key, says",
    [
        ({"num_mem_blocks": 3}, "num_mem_blocks", "layer(s) [2, 3] with a block of their own"),
        ({"use_shared_attention_adapter": True, "num_key_value_heads": 2}, "num_key_value_heads", "2 key/value heads"),
        ({"layers_block_type": ["linear_attention", "hybrid", "attention"]}, "layers_block_type", "['attention']"),
        ({"num_attention_heads": 5}, "num_attention_heads", "does not divide 2 · hidden_size = 64"),
    ],
)
def test_what_modkit_cannot_express_is_refused_by_key(change, key, says):
    with pytest.raises(modkit.SpecError) as info:
        modkit.from_hf_config({**TINY, **change})
    assert any(path == key and says in msg for path, msg in info.value.errors), info.value.errors

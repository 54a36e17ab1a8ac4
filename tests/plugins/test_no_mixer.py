"""The ``none`` mixer: a block that is its FFN alone (Nemotron-H's MLP and mixture layers).

Its block holds no mixer norm and no mixer parameter, and computes exactly ``x + ffn(ffn_norm(x))`` (``pre``) or
``x + ffn(attn_norm(x))`` (``parallel`` with the shared norm); the model decodes with the cache like the full forward.
"""

from __future__ import annotations

import torch

import modkit
from modkit.inference.generate import generate

RELU2 = {"type": "mlp", "d_ff": 48, "activation_unit": {"type": "relu2"}, "bias": False}


def _spec(placement: dict) -> dict:
    """Three layers: Mamba-2 alone, the MLP alone (mixer ``none``), attention alone."""
    return {
        "schema_version": 1,
        "vocab_size": 64,
        "d_model": 32,
        "n_layers": 3,
        "max_seq_len": 64,
        "position": {"type": "none"},
        "block": {
            "mixer": {"type": "mamba2", "d_state": 8, "head_dim": 8, "n_groups": 1, "chunk_size": 4},
            "ffn": None,
            "norm": {"type": "rmsnorm"},
            "placement": placement,
        },
        "overrides": [
            {"layers": [1], "mixer": {"type": "none"}, "ffn": RELU2},
            {"layers": [2], "mixer": {"type": "gqa", "n_heads": 4, "n_kv_heads": 2}},
        ],
    }


def test_the_block_is_its_ffn_alone():
    model = modkit.build(_spec({"type": "pre"}), seed=1)
    block = model.layers[1]
    names = [n for n, _ in block.named_parameters()]
    assert names == ["ffn_norm.weight", "ffn.up.weight", "ffn.down.weight"]
    assert block.attn_norm is None
    # exact count: Mamba-2 layer + its norm, the MLP + its norm, the attention + its norm, embeddings, head
    assert modkit.count_params(model) == modkit.count_params(model.spec) == sum(p.numel() for p in model.parameters())
    x = torch.randn(2, 5, 32, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        got, aux = block(x, _inputs(model, x))
        want = x + block.ffn.down(torch.relu(block.ffn.up(block.ffn_norm(x))) ** 2)
    assert aux is None and torch.equal(got, want)


def test_parallel_with_a_shared_norm_keeps_the_norm_for_the_ffn():
    model = modkit.build(_spec({"type": "parallel", "shared_norm": True}), seed=1)
    block = model.layers[1]
    assert [n for n, _ in block.named_parameters()] == ["attn_norm.weight", "ffn.up.weight", "ffn.down.weight"]
    x = torch.randn(2, 5, 32, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        got, _ = block(x, _inputs(model, x))
        want = x + block.ffn.down(torch.relu(block.ffn.up(block.attn_norm(x))) ** 2)
    assert torch.equal(got, want)


def test_cached_decoding_equals_the_full_forward():
    model = modkit.build(_spec({"type": "pre"}), seed=2).eval()
    ids = torch.randint(0, 64, (2, 9), generator=torch.Generator().manual_seed(3))
    out = generate(model, ids, max_new_tokens=6, temperature=0)
    with torch.no_grad():
        full = model(out[:, :-1]).logits
    assert torch.equal(full[:, ids.shape[1] - 1 :].argmax(-1), out[:, ids.shape[1] :])
    assert model.cache_layout()[1] == {"attention": modkit.CacheSpec(())}


def _inputs(model, x):
    from modkit.nn.inputs import AttentionInputs

    b, s, _ = x.shape
    return AttentionInputs(positions=torch.arange(s).expand(b, s))

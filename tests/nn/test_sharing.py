"""Sharing across layers (spec ``share`` and ``kv_sharing``, :mod:`modkit.nn.sharing`): exact parameter counts and
cache bytes, a shared model equal to one whose layers hold copies of the same weights, gradients summed over the
uses, per-use adapters equal to merged weights, state_dict once and reloaded tied, a reader attending over its
source's keys and values (and its gradient reaching them), cached decode equal to the full forward, and the
validation errors."""

from __future__ import annotations

import pytest
import torch

import modkit
from modkit.core.errors import CheckpointError
from modkit.nn.build import kv_cache_bytes, kv_cache_bytes_per_token

from conftest import tiny_spec

PER_LAYER = 9280  # gqa 4/2 heads at d_model 32 (3072) + swiglu d_ff 64 (6144) + two rmsnorms (64)
KV_PROJ = 2 * 32 * 16  # k_proj and v_proj, [16, 32] each


def spec(n_layers: int = 4, **changes) -> dict:
    return tiny_spec(n_layers=n_layers, **changes)


def built(s: dict, seed: int = 0, dtype=torch.float64):
    return modkit.build(s, dtype=dtype, seed=seed).eval()


def ids(batch: int = 2, seq: int = 12, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, 64, (batch, seq), generator=torch.Generator().manual_seed(seed))


def copies_of(shared, plain) -> None:
    """Load into ``plain`` the weights of ``shared`` with every use of a shared block given its owner's tensors."""
    state = shared.state_dict()
    for owner, uses in shared.shared_blocks.items():
        for key in list(state):
            if key.startswith(f"layers.{owner}."):
                for use in uses:
                    state[key.replace(f"layers.{owner}.", f"layers.{use}.", 1)] = state[key].clone()
    plain.load_state_dict(state, strict=True)


# ---------------------------------------------------------------- block sharing


def test_a_shared_block_counts_once_and_each_adapter_per_use():
    base = modkit.count_params(spec())
    assert base == 4 * PER_LAYER + 2 * 64 * 32 + 32
    assert modkit.count_params(spec(share=[{"layers": [1, 3]}])) == base - PER_LAYER
    assert modkit.count_params(spec(share=[{"layers": {"start": 0}}])) == base - 3 * PER_LAYER
    # rank 2 on every linear: q, o (32 -> 32), k, v (32 -> 16), gate, up (32 -> 64), down (64 -> 32): r · (in + out)
    lora = 2 * (2 * 64 + 2 * 48 + 3 * 96)
    assert modkit.count_params(spec(share=[{"layers": [1, 3], "adapter": {"rank": 2}}])) == base - PER_LAYER + 2 * lora
    only_q = spec(share=[{"layers": [0, 1, 2], "adapter": {"rank": 4, "targets": ["q_proj"]}}])
    assert modkit.count_params(only_q) == base - 2 * PER_LAYER + 3 * 4 * 64


def test_the_shared_model_equals_copies_of_the_weights_bitwise_and_its_gradients_are_the_sum_over_uses():
    shared = built(spec(share=[{"layers": [1, 3]}]))
    plain = built(spec(), seed=5)
    copies_of(shared, plain)
    x = ids()
    a, b = shared(x).logits, plain(x).logits
    assert torch.equal(a, b)
    a.square().sum().backward()
    b.square().sum().backward()
    for name, p in shared.layers[1].named_parameters():
        summed = plain.layers[1].get_parameter(name).grad + plain.layers[3].get_parameter(name).grad
        assert torch.allclose(p.grad, summed, rtol=1e-12, atol=1e-12), name
        assert shared.layers[3].get_parameter(name) is p
    for name, p in shared.layers[0].named_parameters():  # an unshared layer: its own gradient
        assert torch.equal(p.grad, plain.layers[0].get_parameter(name).grad)


def test_a_shared_block_is_initialised_once_and_deterministically():
    a, b = built(spec(share=[{"layers": [0, 2]}])), built(spec(share=[{"layers": [0, 2]}]))
    for (name, p), q in zip(a.named_parameters(), b.parameters()):
        assert torch.equal(p, q), name
    assert a.layers[2].attention.q_proj.weight is a.layers[0].attention.q_proj.weight
    assert len(list(a.parameters())) == len(list(built(spec()).parameters())) - len(list(a.layers[2].parameters()))


def test_per_use_adapters_equal_the_merged_weights_of_each_use():
    s = spec(share=[{"layers": [1, 2, 3], "adapter": {"rank": 3, "alpha": 6.0}}])
    shared = built(s)
    gen = torch.Generator().manual_seed(7)
    with torch.no_grad():  # B starts at 0 (LoRA): give every use an adapter that changes something
        for layer in (1, 2, 3):
            for m in shared.layers[layer].modules():
                if hasattr(m, "lora_b"):
                    m.lora_b.copy_(torch.randn(m.lora_b.shape, generator=gen, dtype=m.lora_b.dtype) * 0.1)
    plain = built(spec(), seed=3)
    state = shared.state_dict()
    merged = {}
    for key in plain.state_dict():
        layer = int(key.split(".")[1]) if key.startswith("layers.") else None
        own = key.replace(f"layers.{layer}.", "layers.1.", 1) if layer in (2, 3) else key
        value = state[own].clone()
        if key.endswith(".weight") and f"{key[: -len('weight')]}lora_a" in state:
            a, b = state[f"{key[: -len('weight')]}lora_a"], state[f"{key[: -len('weight')]}lora_b"]
            value = value + 2.0 * b @ a  # scale = alpha / rank = 2
        merged[key] = value
    plain.load_state_dict(merged, strict=True)
    x = ids()
    assert torch.allclose(shared(x).logits, plain(x).logits, rtol=1e-10, atol=1e-10)
    uses = [shared.layers[i].attention.q_proj for i in (1, 2, 3)]
    assert uses[0].weight is uses[2].weight and uses[0].lora_a is not uses[2].lora_a


def test_state_dict_holds_a_shared_block_once_and_a_reload_stays_tied(tmp_path):
    s = spec(share=[{"layers": [1, 3], "adapter": {"rank": 2, "targets": ["q_proj"]}}])
    model = built(s)
    keys = set(model.state_dict())
    assert not any(k.startswith("layers.3.") and "lora" not in k for k in keys)
    assert {"layers.3.attention.q_proj.lora_a", "layers.3.attention.q_proj.lora_b"} <= keys
    other = built(s, seed=9)
    other.load_state_dict(model.state_dict(), strict=True)
    assert other.layers[3].ffn.gate.weight is other.layers[1].ffn.gate.weight
    x = ids()
    assert torch.equal(other(x).logits, model(x).logits)
    modkit.save(model, tmp_path / "ckpt")
    back = modkit.load(tmp_path / "ckpt", dtype=torch.float64).eval()
    assert back.layers[3].attention.o_proj.weight is back.layers[1].attention.o_proj.weight
    assert modkit.count_params(back) == modkit.count_params(model)
    assert torch.equal(back(x).logits, model(x).logits)
    bad = dict(model.state_dict())
    bad["layers.3.ffn.gate.weight"] = bad["layers.1.ffn.gate.weight"] + 1
    with pytest.raises(CheckpointError, match="layers.3.ffn.gate.weight"):
        other.load_state_dict(bad)


def test_each_use_of_a_shared_block_keeps_its_own_cache_and_decodes_as_the_full_forward():
    s = spec(share=[{"layers": [0, 1, 2, 3], "adapter": {"rank": 2}}])
    model = built(s)
    assert kv_cache_bytes(s, 64) == kv_cache_bytes(spec(), 64)
    _decode_equals_full(model, ids())


# ---------------------------------------------------------------- cache sharing


def _decode_equals_full(model, x, prefill: int = 5) -> None:
    full = model(x).logits
    cache = model.new_cache(x.shape[0], 32)
    parts = [model(x[:, :prefill], cache=cache).logits, model(x[:, prefill : prefill + 3], cache=cache).logits]
    parts += [model(x[:, i : i + 1], cache=cache).logits for i in range(prefill + 3, x.shape[1])]
    assert torch.allclose(torch.cat(parts, 1), full, rtol=1e-10, atol=1e-10)


def test_a_reader_has_no_key_value_projections_and_no_cache_of_its_own():
    s = spec(kv_sharing=[{"layers": [2, 3], "source": 1}])
    assert modkit.count_params(s) == modkit.count_params(spec()) - 2 * KV_PROJ
    per_layer = 2 * 2 * 8 * 2  # k and v, 2 heads of 8, bfloat16
    assert kv_cache_bytes_per_token(spec()) == 4 * per_layer
    assert kv_cache_bytes_per_token(s) == 2 * per_layer
    assert kv_cache_bytes(s, 64, 3, "float32") == 3 * 64 * 2 * (2 * 2 * 8) * 4  # rows, slots, layers, k+v, bytes
    model = built(s)
    cache = model.new_cache(1, 16)
    model(ids(1, 4), cache=cache)
    assert cache.nbytes() == cache.declared_nbytes() == 2 * 16 * (2 * 2 * 8) * 8  # float64 entries


def test_a_reader_attends_over_its_source_keys_and_values():
    model = built(spec(kv_sharing=[{"layers": [3], "source": 1}]))
    seen = {}
    for i in (1, 3):
        model.layers[i].attention.register_forward_hook(lambda m, a, out, i=i: seen.update({i: (a[0], out)}))
    x = ids()
    model(x)
    src, reader = model.layers[1].attention, model.layers[3].attention
    pos = torch.arange(x.shape[1]).expand(x.shape[0], -1)
    rope = model.positions[model.layer_position[3]]
    b, t = x.shape
    q = reader.q_proj(seen[3][0]).view(b, t, 4, 8).transpose(1, 2)
    k = src.k_proj(seen[1][0]).view(b, t, 2, 8).transpose(1, 2)
    v = src.v_proj(seen[1][0]).view(b, t, 2, 8).transpose(1, 2)
    q, k = rope.rotate(q, k, pos)
    k, v = k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)
    scores = (q @ k.transpose(-1, -2)) / 8**0.5
    scores = scores.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
    out = reader.o_proj((scores.softmax(-1) @ v).transpose(1, 2).reshape(b, t, 32))
    assert torch.allclose(seen[3][1], out, rtol=1e-10, atol=1e-10)
    # the reader's output reaches the source's key/value projections: the same gradient as the reference's
    for weight in (src.k_proj.weight, src.v_proj.weight):
        (got,) = torch.autograd.grad(seen[3][1].square().sum(), weight, retain_graph=True)
        (want,) = torch.autograd.grad(out.square().sum(), weight, retain_graph=True)
        assert got.abs().sum() > 0 and torch.allclose(got, want, rtol=1e-6, atol=1e-10)
    assert reader.k_proj is None and reader.v_proj is None and reader.k_norm is None


@pytest.mark.parametrize("window", [None, 4])
def test_cached_decode_with_shared_keys_and_values_equals_the_full_forward(window):
    attention = {"type": "gqa", "n_heads": 4, "n_kv_heads": 2, "sliding_window": window}
    s = spec(block__attention=attention, kv_sharing=[{"layers": {"start": 2}, "source": 1}])
    _decode_equals_full(built(s), ids(seq=14))


# ---------------------------------------------------------------- the spec


def test_a_spec_without_sharing_writes_no_sharing_keys():
    out = modkit.load_spec(spec()).to_dict()
    assert "share" not in out and "kv_sharing" not in out
    s = modkit.load_spec(spec(share=[{"layers": [0, 1]}], kv_sharing=[{"layers": [3], "source": 2}]))
    assert modkit.load_spec(s.to_dict()).to_dict() == s.to_dict()


def _errors(s: dict) -> list[tuple[str, str]]:
    with pytest.raises(modkit.SpecError) as info:
        modkit.load_spec(s)
    return info.value.errors


@pytest.mark.parametrize(
    "changes, path, words",
    [
        ({"kv_sharing": [{"layers": [1], "source": 2}]}, "kv_sharing[0].source", "source = 2 is not before"),
        ({"kv_sharing": [{"layers": [1], "source": 9}]}, "kv_sharing[0].source", "layer 9 out of range"),
        (
            {"kv_sharing": [{"layers": [1], "source": 0}, {"layers": [3], "source": 1}]},
            "kv_sharing[1].source",
            "layer 1 itself reads layer 0",
        ),
        ({"share": [{"layers": [2]}]}, "share[0].layers", "at least two layers"),
        ({"share": [{"layers": [0, 1]}, {"layers": [1, 2]}]}, "share[1].layers", "layer 1 is already in share[0]"),
    ],
)
def test_sharing_errors_name_the_field_and_the_value(changes, path, words):
    errors = _errors(spec(**changes))
    assert any(p == path and words in m for p, m in errors), errors


def test_readers_whose_sizes_differ_and_shared_layers_whose_components_differ_are_refused():
    wide = {"layers": [3], "attention": {"type": "gqa", "n_heads": 4, "n_kv_heads": 4}}
    errors = _errors(spec(overrides=[wide], kv_sharing=[{"layers": [3], "source": 1}]))
    assert any(p == "kv_sharing[0].layers" and "n_kv_heads 4 vs 2" in m for p, m in errors), errors
    errors = _errors(spec(overrides=[wide], share=[{"layers": [1, 3]}]))
    assert any(p == "share[0].layers" and "layer 3's mixer" in m and "differs from layer 1's" in m for p, m in errors)


def test_a_mixer_that_cannot_share_its_cache_is_named():
    mamba = modkit.get_registry().get("mixer", "mamba2").example_config()
    errors = _errors(
        spec(overrides=[{"layers": [3], "mixer": mamba, "ffn": None}], kv_sharing=[{"layers": [3], "source": 1}])
    )
    assert any(
        p == "kv_sharing[0].layers" and "'mamba2'" in m and "'kv_share' capability" in m and "gqa" in m
        for p, m in errors
    ), errors


def test_an_adapter_target_that_names_no_linear_layer_is_named():
    with pytest.raises(ValueError, match=r"share\[0\]\.adapter\.targets: \['qproj'\].*'q_proj'"):
        modkit.build(spec(share=[{"layers": [0, 1], "adapter": {"rank": 2, "targets": ["qproj"]}}]), device="meta")


# ---------------------------------------------------------------- training


def test_a_shared_model_trains_tied_in_one_process_and_other_layouts_are_refused(tmp_path):
    from types import SimpleNamespace

    from modkit.data import default_corpus, prepare
    from modkit.train import Trainer
    from modkit.train.config import load_train_config
    from modkit.train.errors import TrainError
    from modkit.train.step import check_sharing_config

    (tmp_path / "head.txt").write_text(default_corpus().read_text()[:5_000])
    prepare([tmp_path / "head.txt"], tmp_path / "data", tokenizer="char", show_progress=False)
    s = spec(
        vocab_size=65, share=[{"layers": [1, 3], "adapter": {"rank": 2}}], kv_sharing=[{"layers": [2], "source": 0}]
    )
    cfg = {"model": s, "data": str(tmp_path / "data"), "batch_size": 2, "seq_len": 12, "max_steps": 2}
    cfg.update(warmup_steps=0, eval_interval=2, eval_batches=1, sample_tokens=0, device="cpu", seed=3)
    t = Trainer(load_train_config(cfg)[0], tmp_path / "run", progress=False, echo=lambda line: None)
    t.setup()
    before = t.model.layers[1].attention.o_proj.weight.detach().clone()
    for _ in range(2):
        assert torch.isfinite(t.train_step()["loss"])
    after = t.model.layers[3].attention.o_proj.weight
    assert after is t.model.layers[1].attention.o_proj.weight and not torch.equal(after, before)
    loaded = modkit.load_spec(s)
    with pytest.raises(TrainError, match="2 processes"):
        check_sharing_config(SimpleNamespace(pp=1), loaded, 2)
    with pytest.raises(TrainError, match="pp = 2"):
        check_sharing_config(SimpleNamespace(pp=2), loaded, 1)


def test_declared_flops_equal_the_flop_counter_with_readers_and_adapters():
    from modkit.analysis.cost import CostModel, Workload, flop_counter

    s = spec(share=[{"layers": [1, 3], "adapter": {"rank": 2}}], kv_sharing=[{"layers": [2], "source": 0}])
    costs, model = CostModel(s), modkit.build(s).eval()
    x = ids(2, 6)
    with torch.no_grad(), flop_counter() as counter:
        model(x)
    assert counter.get_total_flops() == costs.total(Workload(2, 6, dense=True))
    plain = CostModel(spec()).flops_by_layer(Workload(2, 6))
    by_layer = costs.flops_by_layer(Workload(2, 6))
    assert by_layer[1]["adapter.lora"] == 2 * 12 * 2 * (2 * 64 + 2 * 48 + 3 * 96)  # 2 FLOPs · tokens · r · (in + out)
    assert "attention.k_proj" not in by_layer[2] and plain[2]["attention.k_proj"] == 2 * 12 * 32 * 16


@pytest.mark.parametrize("extra", [{"share": [{"layers": [1, 3]}]}, {"kv_sharing": [{"layers": [3], "source": 1}]}])
def test_no_hugging_face_type_is_said_to_express_sharing(extra, tmp_path):
    model = modkit.build(spec(**extra), device="meta")
    key = next(iter(extra))
    with pytest.raises(CheckpointError, match=f"do not map: {key} "):
        modkit.to_hf(model, tmp_path / "auto")
    with pytest.raises(CheckpointError, match=f"{key}: spec has"):
        modkit.to_hf(model, tmp_path / "llama", model_type="llama")


def test_generation_with_the_cache_gives_the_greedy_tokens_of_full_forwards():
    from modkit.inference.generate import generate

    attention = {"type": "gqa", "n_heads": 4, "n_kv_heads": 2, "sliding_window": 5}
    s = spec(share=[{"layers": [1, 3], "adapter": {"rank": 2}}], kv_sharing=[{"layers": [2], "source": 0}])
    model = built({**s, "block": {**s["block"], "attention": attention}})
    prompt = ids(2, 7)
    out = generate(model, prompt, max_new_tokens=10, temperature=0.0)
    seq = prompt
    for _ in range(10):  # greedy, every step a full forward without a cache
        seq = torch.cat([seq, model(seq).logits[:, -1].argmax(-1, keepdim=True)], 1)
    assert torch.equal(out, seq)

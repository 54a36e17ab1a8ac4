"""The ``mhc`` residual stream (``modkit_plugins/hyper_connections.py``, contract in ``modkit.nn.stream``): each
connection and the head equal transformers' DeepSeek-V4 modules on the same weights, a pre-norm block with them is
DeepSeek-V4's decoder-layer formula, parameter counts are exact, decoding with the cache equals the full forward, and
specs the stream cannot run in are refused by field."""

from __future__ import annotations

import pytest
import torch

import modkit
from modkit.inference.generate import generate
from modkit.nn.inputs import ForwardInputs

from conftest import tiny_spec

transformers = pytest.importorskip("transformers")
v4 = pytest.importorskip("transformers.models.deepseek_v4.modeling_deepseek_v4")

N = 4


def spec(**changes) -> dict:
    return {**tiny_spec(**changes), "stream": {"type": "mhc", "n_streams": N, "sinkhorn_iters": 20}}


def model(dtype=torch.float32, seed=0, **changes):
    m = modkit.build(spec(**changes), dtype=dtype)
    m.init_weights(seed)
    for name, p in m.named_parameters():  # base and scale off their 0 / 1 start, so every term is exercised
        if name.endswith(("base", "scale")):
            with torch.no_grad():
                p.add_(0.3 * torch.randn(p.shape, generator=torch.Generator().manual_seed(len(name)), dtype=p.dtype))
    return m.eval()


def reference_config(d: int):
    return transformers.DeepseekV4Config(hidden_size=d, hc_mult=N, hc_sinkhorn_iters=20, hc_eps=1e-6, rms_norm_eps=1e-6)


def streams(d: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(2, 5, N, d, generator=torch.Generator().manual_seed(seed))


def test_a_connection_and_the_head_equal_transformers_deepseek_v4_modules():
    m = model()
    d = m.spec.d_model
    conn = m.layers[0].attn_hc
    ref = v4.DeepseekV4HyperConnection(reference_config(d))
    ref.load_state_dict({"fn": conn.fn, "base": conn.base, "scale": conn.scale})
    s = streams(d)
    post, comb, collapsed = ref(s)
    x, (got_post, got_comb) = conn.read(s)
    torch.testing.assert_close(x, collapsed, rtol=0, atol=1e-6)
    torch.testing.assert_close(got_post, post, rtol=0, atol=1e-6)
    torch.testing.assert_close(got_comb, comb, rtol=0, atol=1e-6)
    head = v4.DeepseekV4HyperHead(reference_config(d))
    head.load_state_dict({"hc_fn": m.stream.hc_fn, "hc_base": m.stream.hc_base, "hc_scale": m.stream.hc_scale})
    torch.testing.assert_close(m.stream.exit(s), head(s), rtol=0, atol=1e-6)


def test_the_mixing_matrix_is_doubly_stochastic():
    m = model()
    _, (_, comb) = m.layers[1].ffn_hc.read(streams(m.spec.d_model, 1))
    ones = torch.ones(comb.shape[:-1])
    torch.testing.assert_close(comb.sum(-2), ones, rtol=0, atol=1e-5)  # columns: normalised last
    torch.testing.assert_close(comb.sum(-1), ones, rtol=0, atol=1e-3)  # rows: after 20 Sinkhorn iterations
    assert bool((comb > 0).all())


def test_a_pre_norm_block_is_deepseek_v4_s_decoder_layer_formula():
    """DeepseekV4DecoderLayer.forward: ``post · sublayer(norm(collapsed)) + comb^T @ streams``, twice, with the
    weights of transformers' own connection module."""
    m = model()
    block, d = m.layers[0], m.spec.d_model
    ids = torch.randint(0, m.spec.vocab_size, (2, 5), generator=torch.Generator().manual_seed(2))
    inputs = ForwardInputs.prepare(m, ids).attention_inputs().for_layer(m.positions[m.layer_position[0]], None)
    s = streams(d, 3)
    ref = s
    for side, run in (("attn", lambda h: block.attention(h, inputs)), ("ffn", lambda h: block.ffn(h))):
        conn = getattr(block, f"{side}_hc")
        hc = v4.DeepseekV4HyperConnection(reference_config(d))
        hc.load_state_dict({"fn": conn.fn, "base": conn.base, "scale": conn.scale})
        post, comb, collapsed = hc(ref)
        out = run(getattr(block, f"{side}_norm")(collapsed))
        ref = post.unsqueeze(-1) * out.unsqueeze(-2) + torch.matmul(comb.transpose(-1, -2), ref)
    got, _ = block(s, inputs)
    torch.testing.assert_close(got, ref, rtol=0, atol=1e-5)


def test_each_layer_adds_two_connections_and_the_model_one_head():
    d, layers = tiny_spec()["d_model"], tiny_spec()["n_layers"]
    connection = (2 + N) * N * N * d + (2 + N) * N + 3
    head = N * N * d + N + 1
    assert modkit.count_params(spec()) - modkit.count_params(tiny_spec()) == layers * 2 * connection + head
    mixer_only = {"type": "mamba2", "d_state": 8, "head_dim": 8, "n_groups": 1, "expand": 2}
    alone = spec(block__attention=mixer_only, block__ffn=None, position={"type": "none"})
    plain = tiny_spec(block__attention=mixer_only, block__ffn=None, position={"type": "none"})
    assert modkit.count_params(alone) - modkit.count_params(plain) == layers * connection + head  # no ffn half


def test_decoding_with_the_cache_gives_the_full_forward_s_logits():
    m = model(torch.float64)
    ids = torch.randint(0, m.spec.vocab_size, (2, 6), generator=torch.Generator().manual_seed(4))
    out = generate(m, ids, max_new_tokens=5, temperature=0)
    cache = m.new_cache(2, 16)
    steps = [m(out[:, :6], cache=cache).logits[:, -1]]
    for t in range(6, out.shape[1] - 1):
        steps.append(m(out[:, t : t + 1], cache=cache).logits[:, -1])
    full = m(out[:, :-1]).logits[:, 5:]
    torch.testing.assert_close(torch.stack(steps, 1), full, rtol=0, atol=1e-10)
    assert torch.equal(full.argmax(-1), out[:, 6:])


def test_a_placement_without_the_streams_capability_or_mtp_is_refused_by_field():
    with pytest.raises(modkit.SpecError) as err:
        modkit.load_spec(spec(block__placement={"type": "post"}))
    text = str(err.value)
    assert "stream" in text and "'post'" in text and "layers 0-1" in text and "pre" in text
    with pytest.raises(modkit.SpecError, match="mtp"):
        modkit.load_spec({**spec(), "mtp": {"depth": 1}})


def test_the_logit_lens_reads_the_streams_through_the_head_s_exit():
    """``modkit trace`` on a wide stream: the last layer's lens is the model's own next-token distribution, and the
    residual statistics treat a token's streams as one vector."""
    from modkit.analysis.trace import trace

    m = model()
    ids = torch.randint(0, m.spec.vocab_size, (7,), generator=torch.Generator().manual_seed(5))
    result = trace(m, ids.tolist(), top_k=3)
    probs = torch.softmax(m(ids[None]).logits[0, -1].float(), -1)
    top = torch.topk(probs, 3)
    last = result.layers[-1].top_tokens
    assert [t for t, _, _ in last] == top.indices.tolist()
    torch.testing.assert_close(torch.tensor([p for _, _, p in last]), top.values, rtol=0, atol=1e-6)
    seen = {}
    m.layers[-1].register_forward_hook(lambda mod, a, out: seen.update(h=out[0]))
    m(ids[None])
    flat = seen["h"][0].flatten(-2).float().norm(dim=-1).mean()  # [seq, n, d] -> one vector per token
    assert result.layers[-1].residual_norm == pytest.approx(float(flat), rel=1e-6)


def test_layouts_that_split_the_model_are_refused_before_the_run():
    from modkit.train.config import load_train_config
    from modkit.train.errors import TrainError
    from modkit.train.step import check_mtp_config

    s = modkit.load_spec(spec())
    for layout in ({"tp": 2}, {"pp": 2}, {"cp": 2}, {"ep": 2}):
        cfg, _ = load_train_config({"model": spec(), **layout})
        with pytest.raises(TrainError, match=f"stream 'mhc'.*not with {next(iter(layout))} = 2"):
            check_mtp_config(cfg, s)
    check_mtp_config(load_train_config({"model": spec()})[0], s)  # one process (or FSDP): accepted

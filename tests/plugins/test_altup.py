"""Gemma 3n's parts (``modkit_plugins/altup.py``, LAuReL in ``placement.py``, activation sparsity in ``ffn.py``): each
equals transformers' Gemma 3n module on the same weights, in eval and in training mode (the coefficient clip); a
block-scope stream runs with any placement and is validated by field. The whole model against transformers'
``Gemma3nForCausalLM`` is the ``gemma3n_text`` fixture of ``tests/plugins/hf/test_hf_types.py``."""

from __future__ import annotations

import pytest
import torch

import modkit
from modkit_plugins.altup import AltUpConfig, AltUpLink
from modkit_plugins.ffn import GatedMLP, gaussian_topk
from modkit_plugins.placement import Laurel

from conftest import tiny_spec

transformers = pytest.importorskip("transformers")
g3n = pytest.importorskip("transformers.models.gemma3n.modeling_gemma3n")

D, N, ACTIVE, P = 32, 3, 1, 8


def reference_config(**changes):
    kw = dict(
        vocab_size=97,
        hidden_size=D,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        intermediate_size=48,
        altup_num_inputs=N,
        altup_active_idx=ACTIVE,
        hidden_size_per_layer_input=P,
        vocab_size_per_layer_input=90,
        laurel_rank=4,
        num_kv_shared_layers=0,
        activation_sparsity_pattern=[0.95, 0.0],
    )
    return transformers.Gemma3nTextConfig(**{**kw, **changes})


def randomise(module: torch.nn.Module, seed: int = 0) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.5)


def rand(*shape, seed=0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def link_and_reference(clip: float = 120.0):
    link = AltUpLink(D, AltUpConfig(n_streams=N, active=ACTIVE, layer_input_width=P, coef_clip=clip))
    randomise(link)
    ref = g3n.Gemma3nTextAltUp(reference_config(altup_coef_clip=clip))
    ref.load_state_dict(
        {
            "correct_output_scale": link.output_scale,
            "correction_coefs.weight": link.correct.weight,
            "prediction_coefs.weight": link.predict.weight,
            "modality_router.weight": link.router.weight,
            "router_norm.weight": link.router_norm.weight,
        }
    )
    return link, ref


def reference_write(link: AltUpLink, ref, predictions: torch.Tensor, y: torch.Tensor, e: torch.Tensor):
    """``Gemma3nTextDecoderLayer.forward`` after the FFN: correct, scale, gate the per-layer input, add to copies 1.."""
    corrected = ref.correct(predictions, y)
    first = ref.scale_corrected_output(corrected[ACTIVE].clone())
    first = torch.nn.functional.gelu(link.layer_gate(first), approximate="tanh") * e
    norm = g3n.Gemma3nRMSNorm(D, eps=1e-6)
    norm.load_state_dict({"weight": link.layer_norm.weight})
    corrected[1:] += norm(link.layer_proj(first))
    return corrected


@pytest.mark.parametrize("training", [False, True], ids=["eval", "train-clipped"])
def test_a_block_link_equals_transformers_gemma3n_altup_predict_and_correct(training):
    link, ref = link_and_reference(clip=0.3)  # weights ~N(0, 0.5): the clip changes most of them in training
    link.train(training)
    ref.train(training)
    s = rand(2, 5, N, D, seed=1)
    y, e = rand(2, 5, D, seed=2), rand(2, 5, P, seed=3)
    with torch.no_grad():
        x, pred = link.read(s)
        got = link.write(s, pred, y, e)
        ref_pred = ref.predict(s.permute(2, 0, 1, 3).clone())  # transformers: [n, b, s, d]; clamps in place
        want = reference_write(link, ref, ref_pred, y, e)
    torch.testing.assert_close(pred.permute(2, 0, 1, 3), ref_pred, rtol=0, atol=1e-6)
    torch.testing.assert_close(x, ref_pred[ACTIVE], rtol=0, atol=1e-6)
    torch.testing.assert_close(got.permute(2, 0, 1, 3), want, rtol=0, atol=1e-6)
    if training:  # the clip acted: without it the prediction differs
        unclipped, _ = link_and_reference(clip=1e6)
        assert (unclipped.read(s)[1] - pred).abs().max() > 1e-2


def test_laurel_equals_transformers_gemma3n_laurel_block():
    norm = g3n.Gemma3nRMSNorm(D, eps=1e-6)
    ours = Laurel(D, 4, norm)
    randomise(ours, seed=4)
    ref = g3n.Gemma3nTextLaurelBlock(reference_config())
    ref.load_state_dict(
        {
            "linear_left.weight": ours.left.weight,
            "linear_right.weight": ours.right.weight,
            "post_laurel_norm.weight": ours.norm.weight,
        }
    )
    h = rand(2, 5, D, seed=5)
    with torch.no_grad():
        torch.testing.assert_close(ours(h), ref(h), rtol=0, atol=0)


def test_activation_sparsity_equals_transformers_gemma3n_mlp():
    ref = g3n.Gemma3nTextMLP(reference_config(), layer_idx=0)  # sparsity 0.95 on layer 0
    ours = GatedMLP(D, 48, "gelu_tanh", bias=False, sparsity=0.95)
    randomise(ours, seed=6)
    ref.load_state_dict({f"{x}_proj.weight": getattr(ours, x).weight for x in ("gate", "up", "down")})
    x = rand(2, 5, D, seed=7)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), ref(x), rtol=0, atol=1e-6)
        gate = ours.gate(x)
        kept = gaussian_topk(gate, 0.95)
        torch.testing.assert_close(kept, ref._gaussian_topk(gate), rtol=0, atol=0)
    # the entries kept are those above mean + Φ⁻¹(0.95) · std of each token (Φ⁻¹(0.95) = 1.6448536...)
    cut = gate.mean(-1, keepdim=True) + 1.6448536 * gate.std(-1, keepdim=True, unbiased=False)
    assert torch.equal(kept > 0, gate > cut)
    assert 0 < int((kept > 0).sum()) < 0.1 * gate.numel()


def altup_spec(placement: str = "sandwich", **stream) -> dict:
    spec = tiny_spec(block__placement={"type": placement})
    spec["stream"] = {"type": "altup", "n_streams": N, "active": ACTIVE, "layer_input_width": P, **stream}
    return spec


def test_layer_inputs_equal_transformers_per_layer_embeddings():
    m = modkit.build(altup_spec(layer_input_vocab=90))
    m.init_weights(3)
    n_layers, st = m.spec.n_layers, m.stream
    ref = g3n.Gemma3nTextModel(reference_config(num_hidden_layers=n_layers, hidden_size=m.spec.d_model)).eval()
    ref.embed_tokens_per_layer.weight.data.copy_(st.layer_embed.weight)
    ref.per_layer_model_projection.weight.data.copy_(st.layer_proj.weight)
    ref.per_layer_projection_norm.weight.data.copy_(rand(P, seed=8))
    st.layer_proj_norm.weight.data.copy_(ref.per_layer_projection_norm.weight)
    ids = torch.tensor([[1, 5, 89, 90, 96]])  # 90 and 96 are past the per-layer table: they read row 0
    x = rand(1, 5, m.spec.d_model, seed=9)
    with torch.no_grad():
        want = ref.project_per_layer_inputs(x, ref.get_per_layer_inputs(ids))
        got = st.layer_inputs(ids, x)
    assert got.shape == (1, 5, n_layers, P)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
    torch.testing.assert_close(got[0, 3] - got[0, 4], (want[0, 3] - want[0, 4]), rtol=0, atol=1e-6)


def test_a_block_stream_runs_with_any_placement_and_decodes_as_the_full_forward():
    for placement in ("pre", "sandwich", "post", "parallel"):
        m = modkit.build(altup_spec(placement, output_scale_init=1.0))
        m.init_weights(1)
        m.eval()
        ids = torch.randint(0, m.spec.vocab_size, (2, 7), generator=torch.Generator().manual_seed(2))
        with torch.no_grad():
            full = m(ids).logits
            cache = m.new_cache(2, 7)
            steps = [m(ids[:, :4], cache=cache).logits] + [m(ids[:, i : i + 1], cache=cache).logits for i in (4, 5, 6)]
        torch.testing.assert_close(torch.cat(steps, 1), full, rtol=0, atol=1e-5)
        assert isinstance(m.layers[0].stream_link, AltUpLink)


def test_bad_stream_specs_are_refused_by_field():
    with pytest.raises(modkit.SpecError) as err:
        modkit.load_spec(altup_spec(active=N))
    assert "stream.active" in str(err.value) and f"n_streams = {N}" in str(err.value)
    mhc = tiny_spec(block__placement={"type": "sandwich"})
    mhc["stream"] = {"type": "mhc", "n_streams": 2}
    with pytest.raises(modkit.SpecError, match="does not declare the 'streams' capability"):
        modkit.load_spec(mhc)
    modkit.load_spec(altup_spec("sandwich"))  # a block-scope stream asks 'block_streams', which every built-in has


def test_a_placement_without_block_streams_is_refused_with_a_block_scope_stream():
    from typing import Literal

    from modkit_plugins.placement import PreConfig, PreNormBlock

    from conftest import registry_with

    class PlainConfig(PreConfig):
        type: Literal["plain_pre"] = "plain_pre"

    plain = modkit.Component(
        kind="placement",
        type="plain_pre",
        config=PlainConfig,
        factory=lambda cfg, ctx: PreNormBlock(ctx, cfg),
        description="pre without the block_streams capability (a third-party placement)",
    )
    reg = registry_with("plain-placement", plain)
    with pytest.raises(modkit.SpecError) as err:
        modkit.load_spec(altup_spec("plain_pre"), registry=reg)
    assert "placement 'plain_pre' (layers 0-1) does not declare the 'block_streams' capability" in str(err.value)


def test_activation_sparsity_is_refused_in_stacked_experts():
    from modkit_plugins.ffn import GatedConfig, _grouped_gated

    with pytest.raises(ValueError, match="activation_sparsity = 0.5 is not supported in stacked experts"):
        _grouped_gated(GatedConfig(type="geglu", d_ff=8, activation_sparsity=0.5), None, 2)


def test_gemma3n_config_keys_convert_both_ways():
    """A config's own keys (a null clip, per-layer widths and sparsity, sharing) reach the spec and come back."""
    cfg = reference_config(
        num_hidden_layers=4,
        intermediate_size=[48, 64, 48, 48],
        activation_sparsity_pattern=[0.95, 0.5, 0.0, 0.0],
        layer_types=["sliding_attention", "full_attention"] * 2,
        num_kv_shared_layers=2,
    ).to_dict()
    cfg["altup_coef_clip"] = None  # a present null: transformers' `is not None` test, no clip
    spec = modkit.from_hf_config(cfg)
    assert spec.stream.coef_clip is None and spec.stream.active == ACTIVE and spec.stream.layer_input_vocab == 90
    assert [spec.layer(i).ffn.d_ff for i in range(4)] == [48, 64, 48, 48]
    assert [spec.layer(i).ffn.activation_sparsity for i in range(4)] == [0.95, 0.5, 0.0, 0.0]
    assert [(s.layers, s.source) for s in spec.kv_sharing] == [([3], 1), ([2], 0)]
    assert spec.layer(0).placement.laurel_rank == 4 and spec.layer(0).attention.v_norm_eps == 1e-6
    from modkit_plugins.hf.gemma3n_text import TYPE

    back = TYPE.to_config(spec, cfg)
    for key in ("intermediate_size", "activation_sparsity_pattern", "altup_coef_clip", "num_kv_shared_layers"):
        assert back[key] == cfg[key], key
    assert modkit.from_hf_config({**cfg, **back}).to_dict() == spec.to_dict()


@pytest.mark.parametrize(
    "key, value",
    [("laurel_rank", "64x"), ("num_kv_shared_layers", "two"), ("altup_num_inputs", [4]), ("altup_coef_clip", "big")],
)
def test_gemma3n_own_keys_of_the_wrong_type_are_spec_errors_naming_the_key(key, value):
    # not a raw ValueError or TypeError from int() / float()
    cfg = reference_config().to_dict()
    cfg[key] = value
    with pytest.raises(modkit.SpecError) as err:
        modkit.from_hf_config(cfg)
    assert any(path == key for path, _ in err.value.errors), err.value.errors

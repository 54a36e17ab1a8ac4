"""``short_conv`` (LFM2's gated short convolution) against its step-by-step form, its cache, packed documents, the
contract kit and transformers' ``Lfm2ShortConv``.

* float64, in a model: the full forward equals decoding one token at a time through the cached window and a
  prefill in uneven pieces (1e-12); each document of a packed row equals the document alone (1e-12), and without
  the document flags they differ;
* float32: equal to ``Lfm2ShortConv`` on the same weights (with and without biases) to 1e-5; the contract kit passes
  every applicable check; the declared parameter count is the module's, biases included.
"""

from __future__ import annotations

import warnings

import pytest
import torch

import modkit
from modkit import AttentionInputs
from modkit_plugins import short_conv as sc
from modkit_plugins.short_conv import ShortConvConfig, _param_count

TOL = 1e-5
EXACT = 1e-12
D = 32
T = 19


def _registry():
    """The process registry with ``short_conv`` in it (registered here when the installed package's entry points
    predate the module: an editable install reads them at install time)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        reg = modkit.get_registry()
    if "short_conv" not in reg.types("mixer"):
        reg.register_plugin(sc, "builtin-short-conv", distribution="modkit-lm")
    return reg


@pytest.fixture(autouse=True)
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _spec(mixer: dict) -> dict:
    return {
        "schema_version": 1,
        "vocab_size": 64,
        "d_model": D,
        "n_layers": 2,
        "max_seq_len": 64,
        "position": {"type": "none"},
        "init_std": 0.2,
        "block": {
            "mixer": mixer,
            "ffn": {"type": "mlp", "d_ff": 64, "activation": "gelu"},
            "norm": {"type": "rmsnorm"},
            "placement": {"type": "pre"},
        },
        "final_norm": {"type": "rmsnorm"},
    }


def _model(**cfg):
    _registry()
    return modkit.build(_spec({"type": "short_conv", **cfg}), seed=0).eval()


@pytest.mark.parametrize("bias", [False, True], ids=["plain", "biases"])
def test_step_by_step_and_pieces_equal_the_full_forward_in_float64(bias):
    model = _model(d_conv=4, bias=bias).double()
    ids = torch.randint(0, 64, (2, T), generator=torch.Generator().manual_seed(8))
    with torch.no_grad():
        full = model(ids).logits
        cache = model.new_cache(2, T)
        steps = torch.cat([model(ids[:, t : t + 1], cache=cache).logits for t in range(T)], 1)
        cache = model.new_cache(2, T)
        pieces = ((0, 2), (2, 3), (3, 11), (11, 12), (12, T))
        chunks = torch.cat([model(ids[:, a:b], cache=cache).logits for a, b in pieces], 1)
    assert full.dtype == torch.float64
    assert (steps - full).abs().max().item() <= EXACT
    assert (chunks - full).abs().max().item() <= EXACT
    (entry,) = next(iter(cache.layers[0].mixers.values())).spec.sequence_entries
    assert entry.name == "conv" and entry.shape == (D, 3) and entry.growth == "sequence"


def test_packed_documents_equal_each_document_alone_in_float64():
    model = _model(d_conv=3, bias=True).double()
    ids = torch.randint(3, 64, (2, 24), generator=torch.Generator().manual_seed(4))
    docs = torch.tensor([[0] * 5 + [1] + [2] * 13 + [3] * 5, [0] * 2 + [1] * 22])
    with torch.no_grad():
        packed = model(ids, documents=docs).logits
        for r, pieces in enumerate([[(0, 5), (5, 6), (6, 19), (19, 24)], [(0, 2), (2, 24)]]):
            for a, b in pieces:
                assert (packed[r, a:b] - model(ids[r : r + 1, a:b]).logits[0]).abs().max().item() <= EXACT
        assert (model(ids).logits - packed).abs().max().item() > 1e-3  # without the flags the documents mix


def test_the_contract_kit_passes():
    from modkit.testing import check_component

    _registry()
    results = check_component("mixer", "short_conv")
    assert not [f"{r.id}: {r.detail}" for r in results if r.status == "failed"]
    passed = {r.check for r in results if r.status == "passed"}
    assert {"kv_cache_decode", "document_mask", "masked_row", "flops", "param_count", "compile"} <= passed


@pytest.mark.parametrize("bias", [False, True], ids=["plain", "biases"])
def test_equals_transformers_lfm2_short_conv(bias):
    transformers = pytest.importorskip("transformers")
    from transformers.models.lfm2.modeling_lfm2 import Lfm2ShortConv

    cfg = transformers.Lfm2Config(
        hidden_size=D, num_hidden_layers=1, conv_L_cache=3, conv_bias=bias, layer_types=["conv"]
    )
    hf = Lfm2ShortConv(cfg, layer_idx=0).eval()
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in hf.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    ours = _model(d_conv=3, bias=bias).layers[0].attention
    ours.load_state_dict(hf.state_dict())
    n = sum(p.numel() for p in ours.parameters())
    assert n == sum(p.numel() for p in hf.parameters()) == _param_count(ShortConvConfig(d_conv=3, bias=bias), _ctx())
    x = torch.randn(2, T, D, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = hf(x)
        got = ours(x, AttentionInputs(positions=torch.arange(T).expand(2, T)))
    diff = (got - want).abs().max().item()
    print(f"\n[short_conv] ({'biases' if bias else 'plain'}) max |modkit - Lfm2ShortConv| = {diff:.2e}")
    assert diff <= TOL


def _ctx():
    from modkit.plugin import BuildContext

    return BuildContext(d_model=D, n_layers=1, vocab_size=64, max_seq_len=64, registry=_registry())

"""The members by which a one-mixer ``LayerKVCache`` read as its mixer's state (``layer.k``, ``layer.update``, ...)
are deprecated aliases of ``layer.only``'s: each still works, warns once (a ``DeprecationWarning`` naming its
replacement), and modkit's own decode path (every built-in mixer kind) uses none of them.
"""

from __future__ import annotations

import warnings

import pytest
import torch

import modkit
from modkit import AttentionInputs
from modkit.inference.generate import generate
from modkit.nn.attention import prepare_mask, update_cache, update_cache_entries
from modkit.nn.cache import CacheEntry, CacheSpec, KVCache, LayerGeometry, LayerKVCache, MixerCache
from modkit.nn.cache import kvcache as kvcache_module
from tests.conftest import SPECS

DEPRECATED = ("k", "v", "group", "window", "spec", "scratch", "slots", "update", "append")


@pytest.fixture
def fresh_warnings(monkeypatch):
    """Each deprecated member warns once per process: start the test as if none had warned yet."""
    monkeypatch.setattr(kvcache_module, "_warned", set())


def _prefilled_cache() -> KVCache:
    """A one-layer k/v cache (2 rows, 2 heads of width 4, window 3 in 6 slots: a ring) holding two tokens."""
    cache = KVCache([LayerGeometry(2, 4, window=3)], max_len=6, batch_size=2)
    positions, _ = cache.prepare(2, 2)
    cache.layers[0].only.update(torch.ones(2, 2, 2, 4), torch.ones(2, 2, 2, 4), positions)
    return cache


def _deprecation_messages(caught) -> list[str]:
    return [
        str(w.message)
        for w in caught
        if issubclass(w.category, DeprecationWarning) and "LayerKVCache." in str(w.message)
    ]


@pytest.mark.parametrize("name", DEPRECATED)
def test_each_old_member_works_and_warns_once_naming_its_replacement(name, fresh_warnings):
    cache = _prefilled_cache()
    layer, only = cache.layers[0], cache.layers[0].only
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = getattr(layer, name)
        second = getattr(layer, name)
    (message,) = _deprecation_messages(caught)  # the second access is silent
    assert f"LayerKVCache.{name} is deprecated" in message
    assert f"LayerKVCache.only.{name}" in message and f"inputs.cache_for(self).{name}" in message
    assert caught[0].filename == __file__  # the warning points at the caller's line
    if name in ("update", "append"):
        assert first == getattr(only, name) == second  # the single mixer's bound method
    else:
        assert first is getattr(only, name) and second is first


def test_the_old_methods_still_store_and_return_what_the_new_ones_do(fresh_warnings):
    old, new = _prefilled_cache(), _prefilled_cache()
    k, v = torch.randn(2, 2, 1, 4), torch.randn(2, 2, 1, 4)
    positions = old.prepare(2, 1)[0]
    assert torch.equal(positions, new.prepare(2, 1)[0])
    with pytest.warns(DeprecationWarning, match=r"LayerKVCache\.update .*LayerKVCache\.only\.update"):
        got = old.layers[0].update(k, v, positions)
    want = new.layers[0].only.update(k, v, positions)
    for a, b in zip(got, want):
        assert (a is None and b is None) or torch.equal(a, b)
    assert torch.equal(old.layers[0].only.k, new.layers[0].only.k)

    latent = KVCache([CacheSpec((CacheEntry("c", (3,)),))], max_len=4, batch_size=1)
    positions = latent.prepare(1, 2)[0]
    with pytest.warns(DeprecationWarning, match=r"LayerKVCache\.append .*LayerKVCache\.only\.append"):
        seen, pos, valid = latent.layers[0].append({"c": torch.ones(1, 2, 3)}, positions)
    assert torch.equal(seen["c"], torch.ones(1, 2, 3)) and torch.equal(pos, positions) and valid is None


def test_in_a_layer_of_several_mixers_the_old_members_behave_as_before(fresh_warnings):
    kv = CacheSpec.kv(2, 4)
    state = CacheSpec((CacheEntry("s", (4,), growth="sequence"),))
    layer = KVCache([{"attention": kv, "recurrent": state}], max_len=4, batch_size=1).layers[0]
    assert isinstance(layer, LayerKVCache) and all(isinstance(m, MixerCache) for m in layer.mixers.values())
    with pytest.warns(DeprecationWarning, match=r"LayerKVCache\.scratch"):
        assert layer.scratch is None  # as before: no shared per-forward dict without naming the mixer
    with pytest.warns(DeprecationWarning, match=r"LayerKVCache\.k "), pytest.raises(KeyError, match="2 mixers"):
        layer.k


def test_class_access_gives_the_documented_descriptor_without_warning(fresh_warnings):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for name in DEPRECATED:
            member = getattr(LayerKVCache, name)
            assert member.__doc__.startswith("Deprecated:") and f"only.{name}" in member.__doc__


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-gemma", "tiny-mla", "tiny-mamba2", "tiny-hybrid"])
def test_modkits_decode_path_uses_no_deprecated_member(name, fresh_warnings):
    """Prefill, chunked prefill of left-padded rows and token-by-token decode (eager) of every built-in mixer kind
    (attention, sliding window, latent attention, Mamba-2, a hybrid) read the cache through the new members only."""
    model = modkit.build(SPECS / f"{name}.json", seed=0).eval()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ids = torch.tensor([[1, 2, 3, 4, 5], [0, 0, 0, 6, 7]])  # the second row left-padded
        mask = torch.tensor([[1, 1, 1, 1, 1], [0, 0, 0, 1, 1]])
        out = generate(model, ids, attention_mask=mask, max_new_tokens=4, temperature=0)
        cache = model.new_cache(1, 8)
        with torch.no_grad():
            model(torch.tensor([[1, 2, 3]]), cache=cache)  # a chunk, then one token
            model(torch.tensor([[4]]), cache=cache)
    assert out.shape[0] == 2
    assert _deprecation_messages(caught) == []


def test_the_attention_helpers_called_without_the_mixer_use_no_deprecated_member(fresh_warnings):
    """An attention that calls ``update_cache(inputs, k, v)`` / ``prepare_mask(...)`` without ``mixer=self`` (as a
    third-party attention written before the contract does) gets its layer's single state through the new members."""
    cache = KVCache([LayerGeometry(2, 4, window=3)], max_len=6, batch_size=2)
    latent = KVCache([CacheSpec((CacheEntry("c", (3,)),))], max_len=6, batch_size=2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):  # a fresh cache, then one that holds tokens (a ring fed a chunk)
            positions = cache.prepare(2, 2)[0]
            inputs = AttentionInputs(positions=positions, cache=cache.layers[0])
            k_all, v_all, k_pos, k_valid = update_cache(inputs, torch.randn(2, 2, 2, 4), torch.randn(2, 2, 2, 4))
            mask = prepare_mask(inputs, k_pos, k_valid, torch.float32)
            assert mask.allowed.shape == (2, 1, 2, k_all.shape[2])
            latent_positions = latent.prepare(2, 2)[0]
            inputs = AttentionInputs(positions=latent_positions, cache=latent.layers[0])
            seen, _, _ = update_cache_entries(inputs, {"c": torch.randn(2, 2, 3)})
        assert seen["c"].shape == (2, 6, 3)  # the whole buffer after the second write
    assert _deprecation_messages(caught) == []
    assert ("mask", True, None, None, torch.float32) in cache.layers[0].only.scratch  # shared through the group


def test_an_attention_without_a_cache_declaration_warns_once_per_type_naming_the_declaration():
    """An attention written before the cache contract (``n_kv_heads`` / ``head_dim``, no ``cache_spec()``) still gets
    its keys and values, with one DeprecationWarning per component type naming the method to add."""
    from torch import nn

    from modkit.nn import model as model_module

    class Old(nn.Module):
        n_kv_heads, head_dim, sliding_window = 2, 8, 5
        modkit_kind, modkit_type = "attention", "old-attention"

    model_module._UNDECLARED_WARNED.discard("attention/old-attention")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = model_module._declared(Old(), "layers.0.attention")
        second = model_module._declared(Old(), "layers.1.attention")
    assert first == second == CacheSpec.kv(2, 8, 5)
    said = [str(w.message) for w in caught if w.category is DeprecationWarning]
    assert len(said) == 1 and said[0].startswith("attention/old-attention declares no cache_spec()")
    assert "def cache_spec(self): return CacheSpec.kv(" in said[0]


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-mla", "tiny-hybrid", "tiny-mamba2", "tiny-gpt2"])
def test_the_built_in_mixers_all_declare_their_cache(name):
    """No built-in mixer relies on the inferred layout: every module the cache holds state for declares it."""
    from modkit.nn.model import mixer_specs

    model = modkit.build(SPECS / f"{name}.json", seed=0).eval()
    for i, block in enumerate(model.layers):
        paths = list(mixer_specs(block))
        assert paths, f"layer {i}: no mixer found"
        for path in paths:
            assert callable(getattr(block.get_submodule(path), "cache_spec", None)), f"layers.{i}.{path}"


def test_which_undeclared_mixer_gets_inferred_keys_and_values_is_decided_by_its_declaration():
    """Without ``cache_spec()``, keys and values are inferred for a token mixer exposing ``n_kv_heads`` / ``head_dim``
    that declares the ``kv_cache`` capability, whatever its kind; an attention keeps them without declaring it (as
    before declarations decided); a recurrent mixer that does not declare it, or a module of another kind, gets none."""
    from torch import nn

    from modkit.nn.model import _mixers

    def old(kind: str, capabilities: dict) -> nn.Module:
        module = nn.Module()
        module.n_kv_heads, module.head_dim = 2, 8
        module.modkit_kind, module.modkit_type, module.modkit_capabilities = kind, f"old-{kind}", capabilities
        return module

    cases = {
        ("attention", False): True,  # backwards compatible: every old attention was cached
        ("attention", True): True,
        ("mixer", True): True,  # the declaration decides, not the kind
        ("mixer", False): False,
        ("ffn", True): False,  # not a token mixer
    }
    for (kind, declared), cached in cases.items():
        block = nn.Module()
        block.attention = old(kind, {"kv_cache": True} if declared else {})
        assert _mixers(block) == (["attention"] if cached else []), (kind, declared)

"""The language model of a vision-language checkpoint (``qwen3_5``, ``qwen3_5_moe``, ``gemma3``, ``llama4``): a tiny
``ForConditionalGeneration`` made and saved by transformers loads with ``from_hf`` as its text model, with the
language model's exact parameter count, transformers' text-only logits, one notice naming the vision tensors left
out, a stray tensor refused by name, and an export as the text type that transformers reads back."""

from __future__ import annotations

import json
import warnings

import pytest
import torch

import modkit
from modkit.core.errors import LeftOutTensorsWarning

transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")

SMALL = dict(vocab_size=97, max_position_embeddings=64, pad_token_id=0, bos_token_id=1, eos_token_id=None)
QWEN_LAYERS = dict(
    hidden_size=32,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    num_hidden_layers=2,
    full_attention_interval=2,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    linear_key_head_dim=8,
    linear_value_head_dim=12,
    **SMALL,
)
#: the smallest Qwen3.5 vision tower the config accepts (one block, 16 wide, its merger out to the text width)
QWEN_VISION = dict(
    depth=1,
    hidden_size=16,
    num_heads=2,
    intermediate_size=16,
    out_hidden_size=32,
    patch_size=2,
    temporal_patch_size=1,
    spatial_merge_size=1,
)

#: (wrapper type, config class, config kwargs, the text model type, the left-out prefixes the notice names)
CASES = [
    (
        "qwen3_5",
        "Qwen3_5Config",
        dict(text_config=dict(intermediate_size=48, **QWEN_LAYERS), vision_config=QWEN_VISION),
        "qwen3_5_text",
        ["model.visual."],
    ),
    (
        "qwen3_5_moe",
        "Qwen3_5MoeConfig",
        dict(
            text_config=dict(
                moe_intermediate_size=16,
                shared_expert_intermediate_size=24,
                num_experts=4,
                num_experts_per_tok=2,
                **QWEN_LAYERS,
            ),
            vision_config=QWEN_VISION,
        ),
        "qwen3_5_moe_text",
        ["model.visual."],
    ),
    (
        "gemma3",  # sliding and global layers, tied head (the wrapper's default)
        "Gemma3Config",
        dict(
            text_config=dict(
                hidden_size=32,
                num_attention_heads=2,
                num_key_value_heads=1,
                head_dim=16,
                num_hidden_layers=2,
                intermediate_size=48,
                sliding_window=4,
                layer_types=["sliding_attention", "full_attention"],
                **SMALL,
            ),
            vision_config=dict(
                model_type="siglip_vision_model",
                hidden_size=16,
                intermediate_size=16,
                num_hidden_layers=1,
                num_attention_heads=2,
                image_size=8,
                patch_size=4,
            ),
            mm_tokens_per_image=4,
        ),
        "gemma3_text",
        ["vision_tower.", "multi_modal_projector."],
    ),
    (
        "llama4",  # a dense layer then an MoE layer, chunked attention on RoPE layers
        "Llama4Config",
        dict(
            text_config=dict(
                hidden_size=32,
                num_attention_heads=2,
                num_key_value_heads=1,
                head_dim=16,
                num_hidden_layers=2,
                intermediate_size=16,
                intermediate_size_mlp=48,
                num_local_experts=2,
                num_experts_per_tok=1,
                interleave_moe_layer_step=2,
                attention_chunk_size=4,
                **SMALL,
            ),
            vision_config=dict(
                hidden_size=16,
                num_hidden_layers=1,
                num_attention_heads=2,
                intermediate_size=16,
                vision_output_dim=16,
                projector_input_dim=16,
                projector_output_dim=32,
                image_size=8,
                patch_size=4,
                pixel_shuffle_ratio=0.5,
            ),
        ),
        "llama4_text",
        ["vision_model.", "multi_modal_projector."],
    ),
]
IDS = [c[0] for c in CASES]
CLASSES = {
    "qwen3_5": "Qwen3_5ForConditionalGeneration",
    "qwen3_5_moe": "Qwen3_5MoeForConditionalGeneration",
    "gemma3": "Gemma3ForConditionalGeneration",
    "llama4": "Llama4ForConditionalGeneration",
}


def _language_model(hf) -> list[torch.nn.Module]:
    """The text model and the head of a transformers ``ForConditionalGeneration``."""
    if hasattr(hf, "lm_head"):  # Qwen3.5, Gemma 3: the text model inside ``model``, the head beside it
        return [hf.model.language_model, hf.lm_head]
    return [hf.language_model]  # Llama 4: a whole ForCausalLM


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """``{wrapper type: (transformers model, folder)}``, each made (seed 0) and saved by transformers."""
    out = {}
    for name, cls, kwargs, _, _ in CASES:
        torch.manual_seed(0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            hf = getattr(transformers, CLASSES[name])(getattr(transformers, cls)(**kwargs)).eval()
            folder = tmp_path_factory.mktemp(name)
            hf.save_pretrained(folder)
        out[name] = (hf, folder)
    return out


def _load(folder):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = modkit.from_hf(folder, dtype=torch.float32)
    return model, [w.message for w in caught if issubclass(w.category, LeftOutTensorsWarning)]


@pytest.mark.parametrize("name", IDS)
def test_language_model_loads_with_exact_count_and_logits(name, saved):
    hf, folder = saved[name]
    _, _, _, text_type, prefixes = next(c for c in CASES if c[0] == name)
    model, notices = _load(folder)
    assert model.spec.metadata["hf_model_type"] == text_type
    theirs = {id(p): p.numel() for m in _language_model(hf) for p in m.parameters()}  # a tied head counted once
    assert modkit.count_params(model) == sum(theirs.values()) == sum(p.numel() for p in model.parameters())
    ids = torch.randint(2, 97, (2, 11), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = hf(input_ids=ids).logits
        ours = model(ids).logits
    torch.testing.assert_close(ours, ref, rtol=0, atol=1e-5)
    # one notice, counting every stored tensor under each left-out prefix
    assert len(notices) == 1
    stored = list(safetensors_torch.load_file(folder / "model.safetensors"))
    counts = {p: sum(n.startswith(p) for n in stored) for p in prefixes}
    assert all(counts.values())
    text = str(notices[0])
    assert f"{sum(counts.values())} tensors" in text
    for p, n in counts.items():
        assert f"{n} under {p!r}" in text


@pytest.mark.parametrize("name", IDS)
def test_a_stray_tensor_is_refused_by_name(name, saved, tmp_path):
    _, folder = saved[name]
    tensors = safetensors_torch.load_file(folder / "model.safetensors")
    tensors["model.projector_of_something.weight"] = torch.zeros(2)
    safetensors_torch.save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    (tmp_path / "config.json").write_text((folder / "config.json").read_text())
    with pytest.raises(modkit.CheckpointError, match=r"model\.projector_of_something\.weight"):
        _load(tmp_path)


@pytest.mark.parametrize("name", IDS)
def test_export_writes_the_text_type(name, saved, tmp_path):
    """``to_hf`` writes the text type, which transformers loads as its ForCausalLM with the same logits; the
    wrapper type itself is refused as an export target, naming the text type."""
    hf, folder = saved[name]
    _, _, _, text_type, _ = next(c for c in CASES if c[0] == name)
    model, _ = _load(folder)
    modkit.to_hf(model, tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["model_type"] == text_type
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    ids = torch.randint(2, 97, (1, 9), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        torch.testing.assert_close(back(input_ids=ids).logits, hf(input_ids=ids).logits, rtol=0, atol=1e-5)
    with pytest.raises(modkit.CheckpointError, match=f"read only.*{text_type}"):
        modkit.to_hf(model, tmp_path / "again", model_type=name)


def test_wrapper_config_errors_name_the_text_config_key():
    with pytest.raises(modkit.SpecError, match=r"text_config\.model_type.*'llama'"):
        modkit.from_hf_config({"model_type": "gemma3", "text_config": {"model_type": "llama"}})
    with pytest.raises(modkit.SpecError, match=r"text_config\.num_attention_heads"):
        modkit.from_hf_config({"model_type": "gemma3", "text_config": {"num_attention_heads": 0}})
    with pytest.raises(modkit.SpecError, match=r"mystery_key"):
        modkit.from_hf_config({"model_type": "llama4", "mystery_key": 3}, strict=True)


def test_lifted_tie_word_embeddings_follows_the_wrapper():
    """transformers ties a wrapper's head by the wrapper's ``tie_word_embeddings`` (its class default when absent),
    whatever the text config says."""
    spec = modkit.from_hf_config({"model_type": "gemma3", "text_config": {"tie_word_embeddings": False}})
    assert spec.tie_embeddings is True
    spec = modkit.from_hf_config(
        {"model_type": "qwen3_5", "tie_word_embeddings": True, "text_config": {"tie_word_embeddings": False}}
    )
    assert spec.tie_embeddings is True


#: the language model of each wrapper class's defaults (transformers 5.25, built on meta: the text model and the
#: head, a tied head counted once); the whole ForConditionalGeneration adds the vision tower and projector
DEFAULT_COUNTS = {
    "qwen3_5": 8_953_803_264,  # of 9_407_453_936
    "qwen3_5_moe": 34_660_610_688,  # of 35_114_261_360
    "gemma3": 2_628_658_432,  # of 2_723_312_896 (Gemma3Config ties the head)
    "llama4": 107_769_861_120,  # of 108_225_039_360
}


@pytest.mark.parametrize("model_type", sorted(DEFAULT_COUNTS))
def test_defaults_give_the_language_model_count(model_type):
    """A config naming only the wrapper type is the wrapper class's default: its text class's defaults, tied as
    the wrapper's ``tie_word_embeddings`` says."""
    assert modkit.count_params(modkit.from_hf_config({"model_type": model_type})) == DEFAULT_COUNTS[model_type]

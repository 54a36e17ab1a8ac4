"""Checkpoint safety and fidelity: safetensors only, every mismatch named, atomic saves, tying (a stored head must
equal the tied embedding), RoPE layout conversion, sharding, kept source tensors, dtypes, and the ``modkit convert``
subcommands for weights.

Hugging Face folders are made with transformers (a test-only dependency) or written by hand with safetensors.
"""

from __future__ import annotations

import json
import pickle
import warnings
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

import modkit
from modkit import CheckpointError, cli

from conftest import HANG_TIMEOUT

transformers = pytest.importorskip("transformers")
T = transformers

SMALL = dict(vocab_size=61, max_position_embeddings=32)
LLAMA = dict(
    hidden_size=32, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2, intermediate_size=48, **SMALL
)


@pytest.fixture(autouse=True)
def _quiet_transformers():
    transformers.logging.set_verbosity_error()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def hf_model(cls=T.LlamaConfig, kind="causal", seed=0, **kwargs):
    torch.manual_seed(seed)
    auto = transformers.AutoModelForCausalLM if kind == "causal" else transformers.AutoModel
    hf = auto.from_config(cls(**kwargs), attn_implementation="eager").eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return hf


def saved(tmp_path, name="hf", cls=T.LlamaConfig, kind="causal", **kwargs) -> tuple:
    kwargs = kwargs or dict(LLAMA)
    hf = hf_model(cls, kind, **kwargs)
    folder = tmp_path / name
    hf.save_pretrained(folder)
    return hf, folder


def tensors(path: Path) -> dict:
    with safe_open(str(path), "pt") as h:
        return {k: h.get_tensor(k) for k in h.keys()}


def padded_batch(vocab=61):
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(1, vocab, (2, 7), generator=g)
    mask = torch.ones(2, 7, dtype=torch.long)
    mask[1, :3] = 0
    return ids, mask


def hf_logits(hf, ids, mask):
    with torch.no_grad():
        return hf(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0)).logits


def our_logits(model, ids, mask):
    with torch.no_grad():
        return model(ids, attention_mask=mask).logits


def real_diff(a, b, mask):
    return (a - b).abs()[mask.bool()].max().item()


# ------------------------------------------------------------------------------------------------ pickle refusal


class _Boom:
    """Unpickling this creates a marker file: proof that a loader executed code from the file."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def test_pickle_checkpoint_is_refused_without_unpickling(tmp_path):
    _, folder = saved(tmp_path)
    marker = tmp_path / "code-ran"
    (folder / "model.safetensors").unlink()
    (folder / "pytorch_model.bin").write_bytes(pickle.dumps(_Boom(marker)))
    with pytest.raises(CheckpointError) as info:
        modkit.from_hf(folder)
    msg = str(info.value)
    assert "pytorch_model.bin" in msg and "pickle" in msg and "arbitrary code" in msg
    assert "safetensors" in msg and "weights_only=True" in msg and "save_pretrained" in msg  # how to convert
    assert not marker.exists()
    for path in (folder / "pytorch_model.bin", tmp_path / "model.pt", tmp_path / "x.ckpt"):
        path.write_bytes(pickle.dumps(_Boom(marker)))
        with pytest.raises(CheckpointError, match="arbitrary code"):
            modkit.load(path)
    with pytest.raises(CheckpointError, match="arbitrary code"):
        modkit.from_hf(folder / "pytorch_model.bin")
    assert not marker.exists()


def test_index_naming_a_pickle_shard_is_refused(tmp_path):
    _, folder = saved(tmp_path)
    (folder / "model.safetensors").unlink()
    (folder / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"model.norm.weight": "pytorch_model-00001-of-00001.bin"}})
    )
    (folder / "pytorch_model-00001-of-00001.bin").write_bytes(b"not read")
    with pytest.raises(CheckpointError, match="arbitrary code"):
        modkit.from_hf(folder)


def test_folder_without_weights(tmp_path):
    _, folder = saved(tmp_path)
    (folder / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="no safetensors weights"):
        modkit.from_hf(folder)


# ------------------------------------------------------------------------------------------------ mismatches


def test_missing_and_unexpected_tensors_are_all_listed(tmp_path):
    _, folder = saved(tmp_path)
    data = tensors(folder / "model.safetensors")
    del data["model.layers.1.mlp.up_proj.weight"]
    del data["model.norm.weight"]
    data["model.layers.0.self_attn.extra_proj.weight"] = torch.zeros(3, 3)
    data["something.else"] = torch.zeros(2)
    save_file(data, str(folder / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(CheckpointError) as info:
        modkit.from_hf(folder)
    msg = str(info.value)
    assert "missing 2 tensor(s)" in msg
    assert "model.layers.1.mlp.up_proj.weight (for layers.1.ffn.up.weight)" in msg
    assert "model.norm.weight (for final_norm.weight)" in msg
    assert "unexpected 2 tensor(s)" in msg
    assert "model.layers.0.self_attn.extra_proj.weight" in msg and "something.else" in msg


def test_shape_mismatch_names_tensor_and_both_shapes(tmp_path):
    _, folder = saved(tmp_path)
    data = tensors(folder / "model.safetensors")
    data["model.layers.0.mlp.gate_proj.weight"] = torch.zeros(40, 32)
    save_file(data, str(folder / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(CheckpointError) as info:
        modkit.from_hf(folder)
    msg = str(info.value)
    assert "model.layers.0.mlp.gate_proj.weight: the checkpoint stores shape [40, 32], the model needs [48, 32]" in msg
    assert "layers.0.ffn.gate.weight" in msg


def test_fused_shape_mismatch_is_named_before_splitting(tmp_path):
    _, folder = saved(tmp_path, cls=T.Phi3Config, **dict(LLAMA, pad_token_id=0, eos_token_id=1))
    data = tensors(folder / "model.safetensors")
    data["model.layers.1.self_attn.qkv_proj.weight"] = data["model.layers.1.self_attn.qkv_proj.weight"][:60]
    save_file(data, str(folder / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(
        CheckpointError, match=r"qkv_proj.weight: the checkpoint stores shape \[60, 32\], the model needs \[64, 32\]"
    ):
        modkit.from_hf(folder)


def test_modkit_checkpoint_mismatch_is_named(tmp_path):
    model = modkit.build(modkit.from_hf_config(T.LlamaConfig(**LLAMA).to_dict()), seed=1)
    modkit.save(model, tmp_path / "ck")
    data = tensors(tmp_path / "ck" / "model.safetensors")
    meta = safe_open(str(tmp_path / "ck" / "model.safetensors"), "pt").metadata()
    data["layers.0.attention.k_proj.weight"] = torch.zeros(8, 32)
    del data["final_norm.weight"]
    data["stray"] = torch.zeros(1)
    save_file(data, str(tmp_path / "ck" / "model.safetensors"), metadata=meta)
    with pytest.raises(CheckpointError) as info:
        modkit.load(tmp_path / "ck")
    msg = str(info.value)
    assert "missing 1 tensor(s): final_norm.weight" in msg and "stray" in msg
    assert "layers.0.attention.k_proj.weight: the checkpoint stores shape [8, 32], the model needs [16, 32]" in msg


# ------------------------------------------------------------------------------------------------ tying


def test_tied_head_equal_to_embedding_loads_as_one_parameter(tmp_path):
    _, folder = saved(tmp_path, **dict(LLAMA, tie_word_embeddings=True))
    data = tensors(folder / "model.safetensors")
    assert "lm_head.weight" not in data  # transformers stores a tied head once
    data["lm_head.weight"] = data["model.embed_tokens.weight"].clone()
    save_file(data, str(folder / "model.safetensors"), metadata={"format": "pt"})
    model = modkit.from_hf(folder)
    assert model.spec.tie_embeddings and model.lm_head_weight is model.embed.weight


def test_tied_head_that_differs_is_an_error(tmp_path):
    _, folder = saved(tmp_path, **dict(LLAMA, tie_word_embeddings=True))
    data = tensors(folder / "model.safetensors")
    data["lm_head.weight"] = data["model.embed_tokens.weight"] + 1.0
    save_file(data, str(folder / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match="lm_head.weight.*differs.*embed.weight"):
        modkit.from_hf(folder)


# ------------------------------------------------------------------------------------------------ RoPE layout


ROPE_CASES = [
    ("llama", T.LlamaConfig, LLAMA),
    # partial rotary (half the head rotated) and per-head LayerNorm QK-norm with bias
    (
        "phi",
        T.PhiConfig,
        dict(
            hidden_size=32,
            num_attention_heads=2,
            num_hidden_layers=2,
            intermediate_size=48,
            qk_layernorm=True,
            partial_rotary_factor=0.5,
            **SMALL,
        ),
    ),
    # full-width QK-norm over GQA projections
    ("olmo2", T.Olmo2Config, LLAMA),
]


@pytest.mark.parametrize("name,cls,kwargs", ROPE_CASES, ids=[c[0] for c in ROPE_CASES])
def test_interleaved_spec_loads_half_split_checkpoint(name, cls, kwargs, tmp_path):
    hf, folder = saved(tmp_path, cls=cls, **kwargs)
    data = modkit.from_hf_config(folder).to_dict()
    data["position"]["layout"] = "interleaved"
    model = modkit.from_hf(folder, spec=data)
    assert model.spec.position.layout == "interleaved"
    ids, mask = padded_batch()
    assert real_diff(our_logits(model, ids, mask), hf_logits(hf, ids, mask), mask) <= 1e-5
    # the rows really moved (per head), and they move back bitwise on export
    plain = modkit.from_hf(folder)
    q_i, q_h = (
        model.state_dict()["layers.0.attention.q_proj.weight"],
        plain.state_dict()["layers.0.attention.q_proj.weight"],
    )
    assert not torch.equal(q_i, q_h) and torch.equal(q_i.sort(0).values, q_h.sort(0).values)
    modkit.to_hf(model, tmp_path / "out")
    a, b = tensors(folder / "model.safetensors"), tensors(tmp_path / "out" / "model.safetensors")
    assert sorted(a) == sorted(b) and all(torch.equal(a[k], b[k]) for k in a)
    # a modkit checkpoint keeps the interleaved rows and the layout
    modkit.save(model, tmp_path / "ck")
    again = modkit.load(tmp_path / "ck")
    assert again.spec.position.layout == "interleaved"
    assert torch.equal(again.state_dict()["layers.0.attention.q_proj.weight"], q_i)


def test_c01_permutation_matches_the_case_numbers():
    from modkit_plugins.hf._weights import rope_index

    assert rope_index(8, 8, to_interleaved=False).tolist() == [0, 2, 4, 6, 1, 3, 5, 7]  # half-split -> interleaved
    assert rope_index(8, 8, to_interleaved=True).tolist() == [0, 4, 1, 5, 2, 6, 3, 7]  # its inverse
    assert rope_index(8, 4, to_interleaved=True).tolist() == [0, 2, 1, 3, 4, 5, 6, 7]  # partial: the rest stays


def test_spec_that_describes_another_network_is_refused(tmp_path):
    _, folder = saved(tmp_path)
    data = modkit.from_hf_config(folder).to_dict()
    data["block"]["ffn"]["d_ff"] = 64
    with pytest.raises(CheckpointError) as info:
        modkit.from_hf(folder, spec=data)
    # the field of the given spec, not the resolved layer
    assert str(info.value).splitlines()[1:] == [
        "  block.ffn.d_ff: spec has 64 (every layer), the llama config gives 48"
    ]


# ------------------------------------------------------------------------------------------------ export refusals


def test_to_hf_needs_the_model_type_when_several_fit(tmp_path):
    model = modkit.build(Path(__file__).resolve().parents[2] / "specs" / "tiny-llama.json")
    # the dense Llama block fits llama and its relatives (and mixtures with every layer dense: glm4_moe, ernie4_5_moe)
    with pytest.raises(CheckpointError, match=r"\d+ Hugging Face model types express it: ([a-z0-9_]+, )*llama, "):
        modkit.to_hf(model, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_to_hf_refuses_a_spec_the_type_cannot_express(tmp_path):
    data = modkit.from_hf_config(T.LlamaConfig(**LLAMA).to_dict()).to_dict()
    data["block"]["placement"] = {"type": "sandwich"}
    data["block"]["attention"]["qk_norm"] = {"type": "rmsnorm", "eps": 1e-6}
    model = modkit.build(data)
    with pytest.raises(CheckpointError) as info:
        modkit.to_hf(model, tmp_path / "out")
    # each line names the spec field that sets the layers (not the resolved layer), its value and what llama holds
    assert str(info.value).splitlines() == [
        "spec llama cannot be written as a Hugging Face 'llama' checkpoint; the config would describe a different "
        "network:",
        "  block.attention.qk_norm: spec has {'type': 'rmsnorm', 'eps': 1e-06, 'unit_offset': False} (every layer), "
        "the llama config gives None",
        "  block.placement.type: spec has 'sandwich' (every layer), the llama config gives 'pre'",
        "  fix: set these fields to what the llama config gives, name another type with --model-type (left out: the "
        "types that express the spec are named), or keep the spec as it is in modkit's own format (modkit.save)",
    ]
    assert not (tmp_path / "out").exists()


# ------------------------------------------------------------------------------------------------ atomic saves


def test_interrupted_save_leaves_the_existing_checkpoint_intact(tmp_path, monkeypatch):
    import safetensors.torch as st

    spec = modkit.from_hf_config(T.LlamaConfig(**LLAMA).to_dict())
    first, second = modkit.build(spec, seed=1), modkit.build(spec, seed=2)
    modkit.save(first, tmp_path / "ck")
    before = {p.name: p.read_bytes() for p in (tmp_path / "ck").iterdir()}
    real = st.save_file

    def dies_halfway(data, filename, metadata=None):
        real(data, filename, metadata=metadata)
        with open(filename, "r+b") as fh:  # a torn write
            fh.truncate(100)
        raise KeyboardInterrupt("power cut")

    monkeypatch.setattr(st, "save_file", dies_halfway)
    with pytest.raises(KeyboardInterrupt):
        modkit.save(second, tmp_path / "ck")
    with pytest.raises(KeyboardInterrupt):
        modkit.to_hf(first, tmp_path / "ck")  # the same folder name as a target of another format
    monkeypatch.setattr(st, "save_file", real)
    after = {p.name: p.read_bytes() for p in (tmp_path / "ck").iterdir()}
    assert after == before  # no temporary files left, nothing replaced
    loaded = modkit.load(tmp_path / "ck")
    assert all(torch.equal(loaded.state_dict()[k], v) for k, v in first.state_dict().items())


def test_export_interrupted_after_its_commit_point_is_completed_by_the_next_reader(tmp_path, monkeypatch):
    """A rename failing after the journal is committed: the next access finishes the export (all files new)."""
    hf, folder = saved(tmp_path)
    model = modkit.from_hf(folder)
    modkit.to_hf(model, tmp_path / "out")
    import modkit.io.checkpoint as ck

    real = ck.os.replace
    calls = []

    def fail_second(src, dst):
        calls.append(dst)
        if len(calls) == 2:  # the first is the journal's own rename, the commit point
            raise OSError("disk gone")
        return real(src, dst)

    other = modkit.from_hf(folder, dtype="bfloat16")
    monkeypatch.setattr(ck.os, "replace", fail_second)
    with pytest.raises(OSError):
        modkit.to_hf(other, tmp_path / "out")
    monkeypatch.setattr(ck.os, "replace", real)
    assert (tmp_path / "out" / ".modkit-commit.json").is_file()
    reloaded = modkit.from_hf(tmp_path / "out")  # recovers first
    names = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert names == ["config.json", "model.safetensors"], names
    assert json.loads((tmp_path / "out" / "config.json").read_text())["torch_dtype"] == "bfloat16"
    for k, v in other.state_dict().items():
        assert reloaded.state_dict()[k].dtype == torch.bfloat16 and torch.equal(reloaded.state_dict()[k], v), k


# ------------------------------------------------------------------------------------------------ sharding


def test_sharded_export_and_import(tmp_path):
    hf, folder = saved(tmp_path)
    model = modkit.from_hf(folder)
    out = tmp_path / "sharded"
    modkit.to_hf(model, out, max_shard_size=20_000)
    index = json.loads((out / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 2 and not (out / "model.safetensors").exists()
    assert index["metadata"]["total_size"] == sum(t.numel() * t.element_size() for t in model.state_dict().values())
    back = modkit.from_hf(out)
    assert all(torch.equal(back.state_dict()[k], v) for k, v in model.state_dict().items())
    ids, mask = padded_batch()
    again = transformers.AutoModelForCausalLM.from_pretrained(out, attn_implementation="eager").eval()
    assert torch.equal(hf_logits(again, ids, mask), hf_logits(hf, ids, mask))
    # an unsharded export into the same folder removes the stale shards and index
    modkit.to_hf(model, out)
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]
    # a shard listed in the index but missing is named
    modkit.to_hf(model, out, max_shard_size=20_000)
    (out / shards[0]).unlink()
    with pytest.raises(CheckpointError, match=shards[0]):
        modkit.from_hf(out)


# ------------------------------------------------------------------------------------------------ modkit format


def test_modkit_format_layout_and_spec_checks(tmp_path):
    _, folder = saved(tmp_path)
    model = modkit.from_hf(folder)
    ck = modkit.save(model, tmp_path / "ck")
    assert sorted(p.name for p in ck.iterdir()) == ["model.safetensors", "spec.json"]
    meta = safe_open(str(ck / "model.safetensors"), "pt").metadata()
    assert json.loads(meta["modkit.spec"]) == json.loads((ck / "spec.json").read_text()) == model.spec.to_dict()
    assert json.loads(meta["modkit.hf_config"])["model_type"] == "llama"
    # the lone safetensors file is enough
    alone = modkit.load(ck / "model.safetensors")
    assert all(torch.equal(alone.state_dict()[k], v) for k, v in model.state_dict().items())
    assert not alone.training
    # an edited spec.json is not silently ignored
    spec = json.loads((ck / "spec.json").read_text())
    spec["n_layers"] = 1
    (ck / "spec.json").write_text(json.dumps(spec))
    with pytest.raises(CheckpointError, match="spec.json differs"):
        modkit.load(ck)


def test_wrong_loader_is_named(tmp_path):
    _, folder = saved(tmp_path)
    with pytest.raises(CheckpointError, match="modkit.from_hf"):
        modkit.load(folder)
    with pytest.raises(CheckpointError, match="modkit.from_hf"):
        modkit.load(folder / "model.safetensors")
    modkit.save(modkit.from_hf(folder), tmp_path / "ck")
    with pytest.raises(CheckpointError, match="modkit.load"):
        modkit.from_hf(tmp_path / "ck")


def test_dtype_on_load_and_export(tmp_path):
    hf, folder = saved(tmp_path)
    model = modkit.from_hf(folder, dtype="bfloat16")
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert model.positions[0].inv_freq.dtype == torch.float32  # buffers keep their own dtype
    modkit.to_hf(model, tmp_path / "bf16")
    cfg = json.loads((tmp_path / "bf16" / "config.json").read_text())
    assert cfg["torch_dtype"] == "bfloat16"
    assert {t.dtype for t in tensors(tmp_path / "bf16" / "model.safetensors").values()} == {torch.bfloat16}
    again = modkit.from_hf(tmp_path / "bf16")  # default: the stored dtype
    assert {p.dtype for p in again.parameters()} == {torch.bfloat16}


def test_source_config_keys_survive_the_export(tmp_path):
    _, folder = saved(tmp_path, **dict(LLAMA, bos_token_id=5, eos_token_id=7, pretraining_tp=1))
    modkit.to_hf(modkit.from_hf(folder), tmp_path / "out")
    cfg = json.loads((tmp_path / "out" / "config.json").read_text())
    assert (cfg["bos_token_id"], cfg["eos_token_id"], cfg["pretraining_tp"]) == (5, 7, 1)
    assert cfg["architectures"] == ["LlamaForCausalLM"] and cfg["model_type"] == "llama"


# ------------------------------------------------------------------------------------------------ kept tensors


def test_gpt2_file_without_prefix_and_with_mask_buffers(tmp_path):
    """GPT2Model-style files (openai-community/gpt2) name tensors without ``transformer.`` and may hold the causal
    mask buffers ``h.{i}.attn.bias``: both load, the buffers are carried and written back."""
    kwargs = dict(n_embd=32, n_head=4, n_layer=2, n_positions=16, vocab_size=61)
    hf, folder = saved(tmp_path, cls=T.GPT2Config, **kwargs)
    data = tensors(folder / "model.safetensors")
    bare = {k.removeprefix("transformer."): v for k, v in data.items()}
    for i in range(2):
        bare[f"h.{i}.attn.bias"] = torch.tril(torch.ones(16, 16, dtype=torch.bool))[None, None]
    save_file(bare, str(folder / "model.safetensors"), metadata={"format": "pt"})
    model = modkit.from_hf(folder)
    assert sorted(model.checkpoint_extras) == ["transformer.h.0.attn.bias", "transformer.h.1.attn.bias"]
    ids, mask = padded_batch()
    assert real_diff(our_logits(model, ids, mask), hf_logits(hf, ids, mask), mask) <= 1e-5
    modkit.to_hf(model, tmp_path / "out")
    out = tensors(tmp_path / "out" / "model.safetensors")
    assert sorted(out) == sorted(["transformer." + k for k in bare])
    assert all(torch.equal(out["transformer." + k], v) for k, v in bare.items())


def test_bert_fold_pooler_and_a_changed_position_table(tmp_path):
    kwargs = dict(hidden_size=32, num_attention_heads=4, num_hidden_layers=1, intermediate_size=48, **SMALL)
    hf, folder = saved(tmp_path, cls=T.BertConfig, kind="encoder", **kwargs)
    data = tensors(folder / "model.safetensors")
    model = modkit.from_hf(folder)
    assert {"pooler.dense.weight", "pooler.dense.bias"} <= set(model.checkpoint_extras)
    learned = model.positions[0].weight
    tt = data["embeddings.token_type_embeddings.weight"]
    assert torch.equal(learned, data["embeddings.position_embeddings.weight"] + tt[0])
    # fine-tuned positions: the export unfolds them by subtracting the token-type row
    with torch.no_grad():
        learned.add_(0.5)
    modkit.to_hf(model, tmp_path / "out")
    out = tensors(tmp_path / "out" / "model.safetensors")
    assert torch.equal(out["embeddings.token_type_embeddings.weight"], tt)
    assert torch.allclose(
        out["embeddings.position_embeddings.weight"], data["embeddings.position_embeddings.weight"] + 0.5, atol=1e-6
    )
    assert torch.equal(out["pooler.dense.weight"], data["pooler.dense.weight"])
    # a bert built from a spec alone (no source tensors) exports zero token types, exactly the folded model
    fresh = modkit.build(model.spec, seed=3)
    modkit.to_hf(fresh, tmp_path / "fresh")
    f = tensors(tmp_path / "fresh" / "model.safetensors")
    assert torch.equal(f["embeddings.token_type_embeddings.weight"], torch.zeros(2, 32))
    assert torch.equal(f["embeddings.position_embeddings.weight"], fresh.positions[0].weight.detach())
    ref = transformers.AutoModel.from_pretrained(tmp_path / "fresh").eval()
    ids, mask = padded_batch()
    with torch.no_grad():
        h = ref(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0)).last_hidden_state
        ours = fresh.eval()(ids, attention_mask=mask).hidden
    assert real_diff(ours, h, mask) <= 1e-5


def test_bert_for_masked_lm_heads_are_listed_as_unexpected(tmp_path):
    kwargs = dict(hidden_size=32, num_attention_heads=4, num_hidden_layers=1, intermediate_size=48, **SMALL)
    torch.manual_seed(0)
    mlm = transformers.BertForMaskedLM(T.BertConfig(**kwargs))
    mlm.save_pretrained(tmp_path / "mlm")
    with pytest.raises(CheckpointError, match=r"unexpected .*cls\.predictions"):
        modkit.from_hf(tmp_path / "mlm")


# ------------------------------------------------------------------------------------------------ CLI


def run(capsys, *argv):
    code = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_convert_weights_both_ways(capsys, tmp_path):
    hf, folder = saved(tmp_path)
    code, out, err = run(capsys, "convert", "hf", folder, "-o", tmp_path / "ck")
    assert code == 0, err
    assert out == "" and "wrote" in err and "parameters" in err
    assert sorted(p.name for p in (tmp_path / "ck").iterdir()) == ["model.safetensors", "spec.json"]
    code, out, err = run(capsys, "convert", "modkit", tmp_path / "ck", "--to", "hf", "-o", tmp_path / "back")
    assert code == 0, err
    a, b = tensors(folder / "model.safetensors"), tensors(tmp_path / "back" / "model.safetensors")
    assert sorted(a) == sorted(b) and all(torch.equal(a[k], b[k]) for k in a)
    again = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "back", attn_implementation="eager").eval()
    ids, mask = padded_batch()
    assert torch.equal(hf_logits(again, ids, mask), hf_logits(hf, ids, mask))
    code, _, err = run(
        capsys, "convert", "modkit", tmp_path / "ck", "--to", "hf", "-o", tmp_path / "sh", "--max-shard-size", "20KB"
    )
    assert code == 0, err
    assert (tmp_path / "sh" / "model.safetensors.index.json").is_file()
    # the config alone still converts to a spec on stdout
    code, out, _ = run(capsys, "convert", "hf", folder / "config.json")
    assert code == 0 and json.loads(out)["metadata"] == {"hf_model_type": "llama"}


def test_cli_convert_errors(capsys, tmp_path):
    _, folder = saved(tmp_path)
    (folder / "model.safetensors").unlink()
    (folder / "pytorch_model.bin").write_bytes(b"never unpickled")
    code, _, err = run(capsys, "convert", "hf", folder, "-o", tmp_path / "ck")
    assert code == 1 and "arbitrary code" in err and "Traceback" not in err
    code, _, err = run(capsys, "convert", "modkit", tmp_path / "nope", "--to", "hf", "-o", tmp_path / "x")
    assert code == 1 and "no such file" in err
    code, _, err = run(capsys, "convert", "modkit", folder, "--to", "hf", "-o", tmp_path / "x")
    assert code == 1 and "modkit.from_hf" in err
    code, _, err = run(
        capsys, "convert", "modkit", folder, "--to", "hf", "-o", tmp_path / "x", "--max-shard-size", "lots"
    )
    assert code == 1 and "invalid size" in err


def test_cli_convert_hf_folder_with_weights_to_a_json_name_writes_the_spec_only(capsys, tmp_path):
    _, folder = saved(tmp_path)
    code, out, err = run(capsys, "convert", "hf", folder, "-o", tmp_path / "spec.json")
    assert code == 0, err
    assert modkit.load_spec(tmp_path / "spec.json").metadata == {"hf_model_type": "llama"}


# ------------------------------------------------------------------------------------------------ extensibility


class _ToyMapper:
    """A third-party weight mapper written against the protocol alone: tensors stored as ``toy.<modkit name>``."""

    keep = ((r"toy\.notes", "free-form tensor the model does not use"),)
    aliases = ()

    def links(self, spec, shapes, config):
        return [modkit.io.checkpoint.Link((f"toy.{n}",), (n,)) for n in shapes]

    def hf_config(self, spec, base=None):
        return {"model_type": "modkit-toy", "spec": spec.to_dict()}


class _ToyPlugin:
    def __init__(self, weights):
        self.weights = weights

    @modkit.hookimpl
    def register_hf_converters(self, register):
        register(
            "modkit-toy", lambda cfg: dict(cfg["spec"], metadata={"hf_model_type": "modkit-toy"}), weights=self.weights
        )


@pytest.mark.parametrize("with_weights", [True, False])
def test_a_plugin_adds_a_model_type_with_weights(tmp_path, with_weights):
    spec = modkit.load_spec(Path(__file__).resolve().parents[2] / "specs" / "tiny-llama.json").to_dict()
    spec["metadata"] = {"hf_model_type": "modkit-toy"}
    source = modkit.build(spec, seed=4)
    folder = tmp_path / "toy"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "modkit-toy", "spec": spec}))
    data = {f"toy.{k}": v for k, v in source.state_dict().items()}
    data["toy.notes"] = torch.arange(3)
    save_file(data, str(folder / "model.safetensors"))
    reg = modkit.get_registry()
    reg.register_plugin(_ToyPlugin(_ToyMapper() if with_weights else None), "test-toy-weights")
    try:
        if not with_weights:
            with pytest.raises(CheckpointError, match="converts configs only"):
                modkit.from_hf(folder)
            return
        model = modkit.from_hf(folder)
        assert all(torch.equal(model.state_dict()[k], v) for k, v in source.state_dict().items())
        assert torch.equal(model.checkpoint_extras["toy.notes"], torch.arange(3))
        modkit.to_hf(model, tmp_path / "out")
        out = tensors(tmp_path / "out" / "model.safetensors")
        assert sorted(out) == sorted(data) and all(torch.equal(out[k], v) for k, v in data.items())
    finally:
        reg.unregister_plugin("test-toy-weights")


def test_save_killed_midway_by_sigkill_leaves_the_old_checkpoint_loadable(tmp_path):
    """A real kill (no exception handlers run): the process dies right after writing the new weights file."""
    import subprocess
    import sys
    import textwrap

    spec = modkit.from_hf_config(T.LlamaConfig(**LLAMA).to_dict())
    first = modkit.build(spec, seed=1)
    modkit.save(first, tmp_path / "ck")
    (tmp_path / "spec.json").write_text(spec.to_json())
    script = textwrap.dedent(
        f"""
        import os, signal
        import safetensors.torch as st
        import modkit
        real = st.save_file
        def save_then_die(data, filename, metadata=None):
            real(data, filename, metadata=metadata)
            os.kill(os.getpid(), signal.SIGKILL)
        st.save_file = save_then_die
        modkit.save(modkit.build({str(tmp_path / "spec.json")!r}, seed=2), {str(tmp_path / "ck")!r})
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=HANG_TIMEOUT)
    assert proc.returncode == -9, proc.stderr[-2000:]
    loaded = modkit.load(tmp_path / "ck")
    assert all(torch.equal(loaded.state_dict()[k], v) for k, v in first.state_dict().items())

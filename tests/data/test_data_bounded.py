"""Memory of ``modkit data prepare`` bounded by constants, not by the input: a record, row or file of any length is
read ``READ_BYTES`` at a time and encoded in pieces of at most ``PIECE_CHARS`` characters, cut before a space that
follows a non-space (so a BPE gives the whole record's tokens), or at the bound when a run has no such space.

The bounds are lowered here (a few dozen bytes) so kilobytes of text exercise every cut."""

from __future__ import annotations

import gzip
import importlib
import io
import json
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from modkit.data import DataError, TokenData, prepare

sources = importlib.import_module("modkit.data.sources")
compressed = importlib.import_module("modkit.data.compressed")
encode_mod = importlib.import_module("modkit.data.encode")

zstandard = pytest.importorskip("zstandard")
pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

# one long document: prose with line breaks, tabs, quotes and backslashes (JSON escapes), multi-byte characters,
# astral characters (a surrogate pair when escaped), runs of spaces; no run of 64 characters without a space
WORDS = [
    "to be,",
    "or not\tto be:",
    'that is "the" question\\',
    "Ünïcödé —",
    "日本語の",
    "🤖🚀",
    "e\u0301",
    "\n\n  indented",
    "x" * 40,
]
LONG = " ".join(WORDS[(i * 7) % len(WORDS)] for i in range(600)) + " end"


@pytest.fixture(scope="module")
def bpe(tmp_path_factory):
    """A byte-level BPE trained on the long document (its merges span the words of the text)."""
    root = tmp_path_factory.mktemp("bpe")
    (root / "t.txt").write_text(LONG, encoding="utf-8")
    prepare([root / "t.txt"], root / "out", tokenizer="bpe:400", show_progress=False)
    return TokenData.open(root / "out").tokenizer


@pytest.fixture
def small(monkeypatch):
    """Bounds of a few dozen bytes: reads of 32 bytes, pieces of at most 50 characters, records over 100 bytes
    streamed."""
    monkeypatch.setattr(sources, "READ_BYTES", 32)
    monkeypatch.setattr(sources, "PIECE_CHARS", 50)
    monkeypatch.setattr(sources, "LINE_BYTES", 100)
    monkeypatch.setattr(encode_mod, "BATCH_CHARS", 120)


class _Recorder(io.RawIOBase):
    """A stream that records the size of every read asked of it (``None`` / -1: an unbounded read)."""

    def __init__(self, inner, sizes: list):
        self.inner, self.sizes = inner, sizes

    def readable(self) -> bool:
        return True

    def read(self, n=-1):
        self.sizes.append(n)
        return self.inner.read(n)

    def readline(self, n=-1):
        self.sizes.append(("readline", n))
        return self.inner.readline(n)

    def close(self) -> None:
        self.inner.close()
        super().close()


def _record_reads(monkeypatch) -> list:
    sizes: list = []
    real = compressed.open_stream

    def recording(src, on_bytes):
        stream, raw = real(src, on_bytes)
        return _Recorder(stream, sizes), raw

    monkeypatch.setattr(compressed, "open_stream", recording)
    return sizes


def _pieces(path: Path) -> list:
    src = sources.find_sources([path])[0]
    return list(sources.pieces(src, "text", lambda raw: None, lambda n: None))


def test_a_long_jsonl_gz_record_is_read_and_encoded_in_bounded_pieces_with_the_whole_records_tokens(
    tmp_path, monkeypatch, small, bpe
):
    line = json.dumps({"id": 7, "meta": {"tags": ["a", "b"], "n": None}, "text": LONG, "after": [1.5, True]})
    path = tmp_path / "long.jsonl.gz"
    path.write_bytes(gzip.compress((line + "\n" + json.dumps({"text": "short one"}) + "\n").encode("utf-8")))
    sizes = _record_reads(monkeypatch)
    pieces = _pieces(path)
    # every read of the decompressed stream asks for READ_BYTES at most; no readline, no read to the end
    assert sizes and all(isinstance(n, int) and 0 < n <= 32 for n in sizes), sizes
    first = [p for p in pieces if p.line == 1]
    assert len(first) > len(LONG) // 50 and max(len(p.text) for p in first) <= 50
    assert "".join(p.text for p in first) == LONG
    assert [(p.starts, p.ends) for p in first] == [(True, False)] + [(False, False)] * (len(first) - 2) + [
        (False, True)
    ]
    assert [p.offset for p in first] == [sum(len(q.text) for q in first[:i]) for i in range(len(first))]
    assert all(p.text[0] == " " for p in first[1:])  # cut before a space that follows a non-space
    assert [p.text for p in pieces if p.line == 2] == ["short one"]
    # the pieces' tokens are the whole record's
    assert sum((bpe.encode(p.text) for p in first), []) == bpe.encode(LONG)


def test_a_long_record_takes_memory_bounded_by_the_constants_not_by_its_length(tmp_path, monkeypatch):
    monkeypatch.setattr(sources, "READ_BYTES", 4096)
    monkeypatch.setattr(sources, "PIECE_CHARS", 8192)
    monkeypatch.setattr(sources, "LINE_BYTES", 16384)
    text = ("word " * 200 + "\n") * 4000  # 4 MB in one record
    path = tmp_path / "big.jsonl.gz"
    path.write_bytes(gzip.compress(json.dumps({"text": text}).encode("utf-8")))
    src = sources.find_sources([path])[0]
    tracemalloc.start()
    try:
        total = sum(len(p.text) for p in sources.pieces(src, "text", lambda raw: None, lambda n: None))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert total == len(text)
    # the fixed buffers (the file's 256 KiB read buffer, gzip's window) and the bounds; a whole-record read holds
    # the 4 MB line and its 4 MB text at once
    assert peak < 1_000_000, peak


@pytest.mark.parametrize("spec", ["char", "bpe"])
def test_every_format_streams_a_long_document_to_the_whole_documents_ids(tmp_path, monkeypatch, small, bpe, spec):
    raw = (json.dumps({"text": LONG}) + "\n").encode("utf-8")
    inputs = {
        "a.jsonl": raw,
        "b.jsonl.gz": gzip.compress(raw),
        "c.jsonl.zst": zstandard.ZstdCompressor().compress(raw),
        "d.txt": LONG.encode("utf-8"),
        "e.txt.zst": zstandard.ZstdCompressor().compress(LONG.encode("utf-8")),
    }
    for name, data in inputs.items():
        (tmp_path / name).write_bytes(data)
    pq.write_table(pa.table({"text": [LONG]}), tmp_path / "f.parquet")
    tok = tmp_path / "tok"
    tok.mkdir()
    if spec == "bpe":
        bpe.set_special(eot=None)
        bpe.save(tok)
        expected = bpe.encode(LONG)
    for name in [*inputs, "f.parquet"]:
        out = tmp_path / f"out-{name}"
        tokenizer = "char" if spec == "char" else str(tok)
        prepare([tmp_path / name], out, tokenizer=tokenizer, eot="none", show_progress=False)
        data = TokenData.open(out)
        ids = np.concatenate([data.train, data.val]).tolist()
        if spec == "char":
            assert data.tokenizer.decode(ids) == LONG, name
        else:
            assert ids == expected, name


def test_pieces_are_cut_at_a_space_after_a_non_space_else_at_the_bound(monkeypatch):
    monkeypatch.setattr(sources, "PIECE_CHARS", 10)
    assert sources.split_text("aaaa bbbb cccc dddd") == ["aaaa bbbb", " cccc dddd"]
    assert sources.split_text("a" * 25) == ["a" * 10, "a" * 10, "a" * 5]  # no space: cut at the bound
    assert sources.split_text("ab  cd  ef  gh") == ["ab  cd  ef", "  gh"]  # before the first space of a run
    assert sources.split_text("") == [""]
    text = "one two three four five six seven eight nine ten"
    assert "".join(sources.split_text(text)) == text
    assert max(map(len, sources.split_text(text))) <= 10


def _prepare_error(tmp_path, name: str, data: bytes) -> str:
    path = tmp_path / name
    path.write_bytes(data)
    with pytest.raises(DataError) as info:
        prepare([path], tmp_path / "o", show_progress=False)
    return str(info.value)


@pytest.mark.parametrize("streamed", [False, True], ids=["whole", "streamed"])
def test_bad_records_name_the_file_the_line_and_the_value(tmp_path, monkeypatch, streamed):
    if streamed:  # every record over 100 bytes is read by the streaming reader
        monkeypatch.setattr(sources, "READ_BYTES", 16)
        monkeypatch.setattr(sources, "PIECE_CHARS", 40)
        monkeypatch.setattr(sources, "LINE_BYTES", 20)
    pad = '"pad": "' + "p " * 60 + '", '
    good = json.dumps({"text": "fine words " * 12}) + "\n"

    def err(line: str) -> str:
        return _prepare_error(tmp_path, "r.jsonl", (good + line + "\n").encode("utf-8"))

    where = f"{(tmp_path / 'r.jsonl').resolve()}:2: "
    msg = err("{" + pad + '"text": "a lone \\ud800 half", "x": 1}')
    assert msg.startswith(where) and "lone surrogate '\\ud800' (U+D800)" in msg and "character 7" in msg
    msg = err("{" + pad + '"text": "two", "text": "texts"}')
    assert msg.startswith(where) and "field 'text' given twice" in msg
    msg = err("{" + pad + '"text": 12}')
    assert msg.startswith(where) and "field 'text' is a number, not a string of text" in msg
    msg = err("{" + pad + '"body": "b"}')
    assert msg.startswith(where) and "no field 'text' (fields: 'pad', 'body')" in msg
    msg = err("{" + pad + '"text": "a \\q escape"}')
    assert msg.startswith(where) and "not valid JSON" in msg and "escape" in msg
    msg = err("{" + pad + '"text": "a \x01 control"}')
    assert msg.startswith(where) and "Invalid control character '\\x01' (write it as a \\u0001 escape)" in msg
    msg = err("{" + pad + '"text": "unclosed')
    assert msg.startswith(where) and "not valid JSON" in msg
    msg = err("{" + pad + '"n": ' + "[" * 5000 + "]" * 5000 + ', "text": "t"}')
    assert msg.startswith(where) and "nested" in msg
    msg = err('["' + "p " * 60 + '", {"text": "t"}]')
    assert msg.startswith(where) and "a JSON list, not an object with a 'text' field" in msg
    msg = err("{" + pad + '"text": "t"} trailing')
    assert msg.startswith(where) and "not valid JSON" in msg
    # an unused field may hold any valid JSON: a 5,000-digit integer (over Python's default digit limit) too
    ok = "{" + pad + '"n": ' + "9" * 5000 + ', "f": -1.5e-3, "l": [true, false, null, {"k": []}], "text": "ok"}'
    (tmp_path / "ok.jsonl").write_text(good + ok + "\n", encoding="utf-8")
    meta = prepare([tmp_path / "ok.jsonl"], tmp_path / "ok", show_progress=False)
    assert meta["documents"]["count"] == 2


@pytest.mark.parametrize("streamed", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity"])
def test_nan_and_infinity_literals_are_refused_naming_the_file_line_and_literal(
    tmp_path, monkeypatch, streamed, literal
):
    """``NaN`` / ``Infinity`` are not JSON (RFC 8259 section 6), though Python's ``json.loads`` takes them."""
    if streamed:
        monkeypatch.setattr(sources, "READ_BYTES", 16)
        monkeypatch.setattr(sources, "PIECE_CHARS", 40)
        monkeypatch.setattr(sources, "LINE_BYTES", 20)
    good = json.dumps({"text": "fine words " * 12}) + "\n"
    bad = '{"pad": "' + "p " * 60 + '", "score": [1, ' + literal + '], "text": "t"}\n'
    msg = _prepare_error(tmp_path, "r.jsonl", (good + bad).encode("utf-8"))
    where = f"{(tmp_path / 'r.jsonl').resolve()}:2: "
    assert msg.startswith(where) and f"the literal {literal} is not JSON" in msg and "null" in msg

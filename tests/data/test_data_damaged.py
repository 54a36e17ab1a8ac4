"""Damaged inputs and leftovers of ``modkit data prepare``: truncated compressed files and Parquet pages are errors
naming the file, temporary files of killed runs are removed, ``.json`` files are read as JSON Lines (or refused
with the reason), skipped files of a folder input are listed, symlinks out of a folder are followed only when
asked, and errors name the file and the record instead of passing Python's text through."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from modkit import cli
from modkit.data import DataError, TokenData, prepare

zstandard = pytest.importorskip("zstandard")
pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

LINES = "".join(json.dumps({"text": f"record {i}: " + "to be or not to be " * (i % 5 + 1)}) + "\n" for i in range(200))


def _err(*args, **kwargs) -> str:
    with pytest.raises(DataError) as info:
        prepare(*args, show_progress=False, **kwargs)
    return str(info.value)


def _ids(folder: Path) -> list[int]:
    data = TokenData.open(folder)
    return np.concatenate([data.train, data.val]).tolist()


def test_a_truncated_zstd_file_is_an_error_naming_the_file(tmp_path):
    raw = LINES.encode("utf-8")
    whole = zstandard.ZstdCompressor(write_checksum=True).compress(raw)
    (tmp_path / "good.jsonl.zst").write_bytes(whole)
    half = tmp_path / "half.jsonl.zst"
    half.write_bytes(whole[: len(whole) // 2])
    msg = _err([tmp_path / "good.jsonl.zst", half], tmp_path / "o")
    assert msg.startswith(f"{half.resolve()}: cut short: zstd frame 1 (from byte 0) needs ") and "fetch" in msg
    no_checksum_end = tmp_path / "end.jsonl.zst"
    no_checksum_end.write_bytes(whole[:-2])  # only the frame's checksum is missing
    assert "cut short: zstd frame 1" in _err([no_checksum_end], tmp_path / "o")
    two = zstandard.ZstdCompressor().compress(raw[:4000]) + zstandard.ZstdCompressor().compress(raw[4000:])
    cut_in_second = tmp_path / "two.jsonl.zst"
    cut_in_second.write_bytes(two[:-10])
    assert f"{cut_in_second.resolve()}: cut short: zstd frame 2" in _err([cut_in_second], tmp_path / "o")
    garbage = tmp_path / "garbage.jsonl.zst"
    garbage.write_bytes(whole + b"not zstd")
    assert "not a zstd frame at byte" in _err([garbage], tmp_path / "o")
    (tmp_path / "empty.jsonl.zst").write_bytes(b"")
    assert "empty.jsonl.zst: an empty file, not a zstd file" in _err([tmp_path / "empty.jsonl.zst"], tmp_path / "o")
    (tmp_path / "empty.jsonl.gz").write_bytes(b"")
    assert "empty.jsonl.gz: an empty file, not a gzip file" in _err([tmp_path / "empty.jsonl.gz"], tmp_path / "o")
    # a file of two frames cut exactly between them holds only whole frames: it reads as the shorter file it is
    boundary = tmp_path / "boundary.jsonl.zst"
    first = raw[: raw.index(b"\n", 4000) + 1]
    two = zstandard.ZstdCompressor().compress(first) + zstandard.ZstdCompressor().compress(raw[len(first) :])
    boundary.write_bytes(two[: len(zstandard.ZstdCompressor().compress(first))])
    assert prepare([boundary], tmp_path / "b", show_progress=False)["documents"]["count"] == first.count(b"\n")
    prepare([tmp_path / "good.jsonl.zst"], tmp_path / "g", show_progress=False)


def test_a_truncated_or_damaged_parquet_file_is_an_error_naming_the_file(tmp_path):
    texts = [f"row {i} " + "words and more words " * 20 for i in range(400)]
    pq.write_table(pa.table({"text": texts}), tmp_path / "p.parquet", row_group_size=100, compression="snappy")
    data = (tmp_path / "p.parquet").read_bytes()
    cut = tmp_path / "cut.parquet"
    cut.write_bytes(data[: len(data) // 2])
    msg = _err([cut], tmp_path / "o")
    assert msg.startswith(f"{cut.resolve()}: not a Parquet file") and "cut short" in msg
    # damage the text of the second row group (its dictionary page, past the page header)
    meta = pq.ParquetFile(tmp_path / "p.parquet").metadata
    start = meta.row_group(1).column(0).dictionary_page_offset
    damaged = bytearray(data)
    damaged[start + 40 : start + 400] = bytes(range(256)) + bytes(104)
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(bytes(damaged))
    msg = _err([bad], tmp_path / "o")
    assert msg.startswith(f"{bad.resolve()}: row group 2 (rows 101 to 200): cannot be read (")
    assert "damaged or cut short" in msg


def test_stale_temporary_files_of_dead_processes_are_removed_and_live_ones_kept(tmp_path):
    (tmp_path / "in.txt").write_text("to be or not to be " * 50, encoding="utf-8")
    out = tmp_path / "out"
    out.mkdir()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(dead.stdout)
    for name in ("train.bin", "val.bin", "meta.json", "tokenizer.json"):
        (out / f".{name}.tmp-{dead_pid}").write_bytes(b"left by a killed run")
    live = out / f".train.bin.tmp-{os.getppid()}"  # a running process's file: not ours to remove
    live.write_bytes(b"in use")
    other = out / ".notes.tmp-1"
    other.write_bytes(b"not a prepare file")
    with pytest.warns(
        UserWarning, match=rf"removed 4 temporary files of runs that did not finish \(process {dead_pid}\)"
    ):
        prepare([tmp_path / "in.txt"], out, show_progress=False)
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["meta.json", "tokenizer.json", "tokenizer_config.json", "train.bin", "val.bin", live.name, other.name]
    )


def test_json_files_are_read_as_json_lines_or_refused_with_the_reason(tmp_path):
    (tmp_path / "lines.json").write_text(LINES, encoding="utf-8")
    (tmp_path / "lines.jsonl").write_text(LINES, encoding="utf-8")
    prepare([tmp_path / "lines.json"], tmp_path / "a", show_progress=False)
    prepare([tmp_path / "lines.jsonl"], tmp_path / "b", show_progress=False)
    assert _ids(tmp_path / "a") == _ids(tmp_path / "b")  # records, not the text of the file with its braces
    pretty = tmp_path / "pretty.json"
    pretty.write_text(json.dumps([{"text": "a"}, {"text": "b"}], indent=2), encoding="utf-8")
    msg = _err([pretty], tmp_path / "o")
    assert msg.startswith(f"{pretty.resolve()}:1: not valid JSON (Expecting value at column 2, near '[')")
    assert "a .json file is read as JSON Lines (one object per line)" in msg and "jq -c '.[]' pretty.json" in msg
    array = tmp_path / "array.json"
    array.write_text(json.dumps([{"text": "a"}, {"text": "b"}]), encoding="utf-8")
    msg = _err([array], tmp_path / "o")
    assert msg.startswith(f"{array.resolve()}:1: a JSON list, not an object with a 'text' field")
    assert "a .json file is read as JSON Lines" in msg and "jq -c" in msg
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "x.json").write_text(LINES, encoding="utf-8")
    meta = prepare([folder], tmp_path / "c", show_progress=False)
    assert [Path(s["path"]).name for s in meta["sources"]] == ["x.json"] and meta["sources"][0]["format"] == "jsonl"


def test_a_folder_input_lists_the_files_it_skips(tmp_path):
    folder = tmp_path / "corpus"
    (folder / "sub").mkdir(parents=True)
    (folder / ".git").mkdir()
    (folder / "a.txt").write_text("to be or not to be " * 40, encoding="utf-8")
    (folder / "sub" / "b.md").write_text("that is the question " * 40, encoding="utf-8")
    (folder / "notes.csv").write_text("a,b\n", encoding="utf-8")
    (folder / "sub" / "image.png").write_bytes(b"\x89PNG")
    (folder / ".hidden.txt").write_text("hidden", encoding="utf-8")
    (folder / ".git" / "HEAD").write_text("ref", encoding="utf-8")
    with pytest.warns(UserWarning) as caught:
        meta = prepare([folder], tmp_path / "o", show_progress=False)
    assert [Path(s["path"]).name for s in meta["sources"]] == ["a.txt", "b.md"]
    notes = [str(w.message) for w in caught]
    assert notes == [
        f"{folder}: skipped 4 entries that are not inputs: .git/ (hidden), .hidden.txt (hidden), notes.csv "
        "(not an input name), sub/image.png (not an input name)"
    ]


def test_symlinks_out_of_a_folder_are_skipped_unless_allowed(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("outside words " * 40, encoding="utf-8")
    folder = tmp_path / "corpus"
    (folder / "inner").mkdir(parents=True)
    (folder / "a.txt").write_text("inside words " * 40, encoding="utf-8")
    (folder / "inner" / "b.txt").write_text("more inside " * 40, encoding="utf-8")
    (folder / "link.txt").symlink_to(outside / "secret.txt")
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "c.txt").write_text("elsewhere words " * 40, encoding="utf-8")
    (folder / "linkdir").symlink_to(tmp_path / "elsewhere")
    (folder / "loop").symlink_to(folder)  # inside: read once, never twice
    with pytest.warns(UserWarning) as caught:
        meta = prepare([folder], tmp_path / "o", show_progress=False)
    assert [Path(s["path"]).name for s in meta["sources"]] == ["a.txt", "b.txt"]
    note = str(caught[0].message)
    assert "link.txt (a link to a file outside the folder" in note and "linkdir/ (a link to a folder outside" in note
    assert "--follow-symlinks" in note
    meta = prepare([folder], tmp_path / "f", follow_symlinks=True, show_progress=False)
    assert [Path(s["path"]).name for s in meta["sources"]] == ["a.txt", "b.txt", "secret.txt", "c.txt"]


def test_errors_name_the_file_and_record_not_pythons_text(tmp_path, capsys):
    path = tmp_path / "s.jsonl"
    path.write_text('{"text": "fine"}\n{"text": "bad \\udc80 half"}\n', encoding="utf-8")
    assert cli.main(["data", "prepare", str(path), "-o", str(tmp_path / "o")]) == 1
    err = capsys.readouterr().err
    assert f"{path.resolve()}:2: " in err and "lone surrogate" in err and "codec" not in err
    msg = _err(["a\x00b.txt"], tmp_path / "o")
    assert msg == "'a\\x00b.txt': not a usable path (it holds a NUL byte); check the input path"
    (tmp_path / "t.txt").write_text("to be or not to be " * 40, encoding="utf-8")
    msg = _err([tmp_path / "t.txt"], tmp_path / "o\x00x")
    assert msg.startswith("'") and "not a usable path (it holds a NUL byte)" in msg
    # an output folder whose name is not UTF-8 prints as the CLI's summary, escaped
    odd = os.fsdecode(bytes(tmp_path / "o") + b"-\xff")
    assert cli.main(["data", "prepare", str(tmp_path / "t.txt"), "-o", odd]) == 0
    assert "o-\\udcff" in capsys.readouterr().out
    (tmp_path / "a-file").write_text("not a folder", encoding="utf-8")
    msg = _err([tmp_path / "t.txt"], tmp_path / "a-file" / "out")
    assert msg.startswith(f"{tmp_path / 'a-file' / 'out'}: cannot write the dataset (") and "-o" in msg
    gz = tmp_path / "cut.jsonl.gz"
    gz.write_bytes(gzip.compress(LINES.encode())[:300])
    assert _err([gz], tmp_path / "o").startswith(f"{gz.resolve()}: cut short: the gzip stream ends before its end")


def test_the_cli_prints_notes_and_reads_links_out_of_a_folder_when_asked(tmp_path, capsys):
    folder = tmp_path / "corpus"
    folder.mkdir()
    (folder / "a.txt").write_text("inside words " * 40, encoding="utf-8")
    (folder / "notes.csv").write_text("a,b\n", encoding="utf-8")
    (tmp_path / "secret.txt").write_text("outside words " * 40, encoding="utf-8")
    (folder / "link.txt").symlink_to(tmp_path / "secret.txt")
    assert cli.main(["data", "prepare", str(folder), "-o", str(tmp_path / "o")]) == 0
    err = capsys.readouterr().err
    assert f"modkit: note: {folder}: skipped 2 entries that are not inputs: link.txt (a link to a file outside" in err
    assert "notes.csv (not an input name); --follow-symlinks" in err
    assert cli.main(["data", "prepare", str(folder), "-o", str(tmp_path / "f"), "--follow-symlinks"]) == 0
    assert "skipped 1 entry that is not an input: notes.csv (not an input name)\n" in capsys.readouterr().err
    assert [Path(s["path"]).name for s in TokenData.open(tmp_path / "f").meta["sources"]] == ["a.txt", "secret.txt"]


def test_default_dataset_removes_temporary_folders_of_killed_runs(tmp_path, monkeypatch):
    from modkit.data import default_dataset

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = tmp_path / "data" / f".tinyshakespeare-char.tmp-{int(dead.stdout)}"
    stale.mkdir(parents=True)
    (stale / "train.bin").write_bytes(b"left by a killed run")
    live = tmp_path / "data" / f".tinyshakespeare-char.tmp-{os.getppid()}"
    live.mkdir()

    def stop(*a, **k):
        raise RuntimeError("stop here")

    monkeypatch.setattr("modkit.data.corpus.prepare", stop)
    with pytest.raises(RuntimeError, match="stop here"):
        default_dataset(tmp_path)
    assert not stale.exists() and live.exists()

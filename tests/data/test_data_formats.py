"""Inputs as corpora come: Parquet files and folders of shards, ``datasets`` ``save_to_disk`` folders (a Dataset,
a DatasetDict's splits), gzip- and zstd-compressed JSON Lines. Each gives exactly the ids of the same records as
plain JSON Lines (the ``data`` extra: pyarrow, datasets, zstandard)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from modkit.data import DataError, TokenData, prepare

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
zstandard = pytest.importorskip("zstandard")
datasets = pytest.importorskip("datasets")

RECORDS = [f"record {i}: " + "to be or not to be, " * (i % 7) + "that is the question" for i in range(120)] + [
    "",
    "last ü 🤖",
]


def _ids(folder: Path) -> list[int]:
    data = TokenData.open(folder)
    return np.concatenate([data.train, data.val]).tolist()


def _lines(records) -> bytes:
    return "".join(json.dumps({"text": r, "id": i}, ensure_ascii=False) + "\n" for i, r in enumerate(records)).encode(
        "utf-8"
    )


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The records as a plain .jsonl file, prepared with a bpe tokenizer saved for the other formats to reuse."""
    root = tmp_path_factory.mktemp("ref")
    (root / "plain.jsonl").write_bytes(_lines(RECORDS))
    prepare([root / "plain.jsonl"], root / "out", tokenizer="bpe:300", show_progress=False)
    return root / "out", _ids(root / "out")


def _same(reference, inputs, tmp_path, **kwargs) -> dict:
    folder, ids = reference
    meta = prepare(inputs, tmp_path / "out", tokenizer=str(folder / "tokenizer.json"), show_progress=False, **kwargs)
    assert _ids(tmp_path / "out") == ids
    assert meta["documents"]["count"] == len(RECORDS)
    return meta


def test_gzip_and_zstd_json_lines(reference, tmp_path):
    raw = _lines(RECORDS)
    (tmp_path / "a.jsonl.gz").write_bytes(gzip.compress(raw))
    meta = _same(reference, [tmp_path / "a.jsonl.gz"], tmp_path)
    src = meta["sources"][0]
    assert (
        src["format"] == "jsonl"
        and src["compression"] == "gzip"
        and src["bytes"] == (tmp_path / "a.jsonl.gz").stat().st_size
    )
    import hashlib

    assert src["sha256"] == hashlib.sha256((tmp_path / "a.jsonl.gz").read_bytes()).hexdigest()  # of the file as stored
    (tmp_path / "b.json.zst").write_bytes(zstandard.ZstdCompressor().compress(raw))
    (tmp_path / "out" / "meta.json").unlink()
    assert _same(reference, [tmp_path / "b.json.zst"], tmp_path)["sources"][0]["compression"] == "zstd"
    (tmp_path / "bad.jsonl.gz").write_bytes(b"not gzip at all")
    with pytest.raises(DataError, match=r"bad.jsonl.gz: not a valid gzip file"):
        prepare([tmp_path / "bad.jsonl.gz"], tmp_path / "bad", show_progress=False)


def test_parquet_file_and_a_folder_of_shards(reference, tmp_path):
    table = pa.table({"id": list(range(len(RECORDS))), "text": RECORDS})
    pq.write_table(table, tmp_path / "all.parquet", row_group_size=17)
    meta = _same(reference, [tmp_path / "all.parquet"], tmp_path)
    assert meta["sources"][0]["format"] == "parquet"
    shards = tmp_path / "shards"
    shards.mkdir()
    for k, lo in enumerate(range(0, len(RECORDS), 50)):  # FineWeb-style: a folder of numbered shards
        pq.write_table(table.slice(lo, 50), shards / f"{k:05d}.parquet")
    (tmp_path / "out" / "meta.json").unlink()
    meta = _same(reference, [shards], tmp_path)
    assert [Path(s["path"]).name for s in meta["sources"]] == ["00000.parquet", "00001.parquet", "00002.parquet"]
    assert sum(s["documents"] for s in meta["sources"]) == len(RECORDS)


def test_parquet_errors(tmp_path):
    pq.write_table(pa.table({"body": ["a", "b"]}), tmp_path / "x.parquet")
    with pytest.raises(
        DataError, match=r"x.parquet: no column 'text' \(columns: 'body'\); name the text column with --text-field"
    ):
        prepare([tmp_path / "x.parquet"], tmp_path / "o", show_progress=False)
    pq.write_table(pa.table({"text": ["a", None, "c"]}), tmp_path / "n.parquet")
    with pytest.raises(DataError, match=r"n.parquet: row 2: 'text' is null, not a string of text"):
        prepare([tmp_path / "n.parquet"], tmp_path / "o", show_progress=False)


def test_datasets_save_to_disk_folders(reference, tmp_path):
    ds = datasets.Dataset.from_dict({"text": RECORDS, "id": list(range(len(RECORDS)))})
    ds.save_to_disk(str(tmp_path / "ds"))
    meta = _same(reference, [tmp_path / "ds"], tmp_path)
    assert meta["sources"][0]["format"] == "dataset"
    half = len(RECORDS) // 2
    dd = datasets.DatasetDict({"train": ds.select(range(half)), "validation": ds.select(range(half, len(RECORDS)))})
    dd.save_to_disk(str(tmp_path / "dd"))
    folder, ids = reference
    meta = prepare(
        [tmp_path / "dd"],
        tmp_path / "split",
        tokenizer=str(folder / "tokenizer.json"),
        val_inputs=[tmp_path / "dd"],
        show_progress=False,
    )
    data = TokenData.open(tmp_path / "split")
    assert np.concatenate([data.train, data.val]).tolist() == ids  # train split, then the validation split
    assert data.tokenizer.decode(data.val.tolist()).count("<|endoftext|>") == len(RECORDS) - half
    assert meta["sources"][0]["split"] == "train" and meta["val_sources"][0]["split"] == "validation"
    with pytest.raises(DataError, match=r"a DatasetDict without split 'test' \(splits: 'train', 'validation'\)"):
        prepare([tmp_path / "dd"], tmp_path / "o", split="test", show_progress=False)

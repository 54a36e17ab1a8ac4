"""Peak memory and throughput of ``modkit data prepare`` on one 300 MB record: a ``.jsonl.gz`` of a single line
``{"id": 0, "text": "..."}``, against a plain ``tokenizers`` loop over the same text in the same run.

    .venv/bin/python benchmarks/bench_prepare_long_record.py                # 300 MB; writes results_prepare_long_record.md
    .venv/bin/python benchmarks/bench_prepare_long_record.py --mb 50 --char-mb 10 -o /tmp/long.md

Before the pieces were bounded, this input (1.4 MB compressed when the text repeats) drove ``prepare`` past 22 GB
of resident memory: the record was read with one ``readline()`` and encoded whole. Now the record is read
``READ_BYTES`` at a time and encoded in pieces of at most ``PIECE_CHARS`` characters (:mod:`modkit.data.jsonl`,
:mod:`modkit.data.cutting`), so the peak is a constant.

The text: speeches of tiny shakespeare drawn with a fixed seed and joined by blank lines (real prose, so the BPE
merges behave as on prose; every line break is a ``\\n`` escape in the JSON string) until it holds ``--mb`` MB
(10^6 characters). The tokenizer: byte-level ``bpe:8192`` trained on tiny shakespeare with ``<|endoftext|>``
reserved, saved as a ``tokenizer.json``.

Measured, one after the other:

* **modkit**: ``python -m modkit data prepare corpus.jsonl.gz -o out --tokenizer tokenizer.json`` in a subprocess
  (reading, gzip, JSON parsing, encoding, writing, the sha256 passes, the validation cut: end to end, wall time),
  its peak resident memory from ``wait4`` (the child alone), under an address-space limit (``--limit-gb``) so that
  a regression fails with a MemoryError instead of taking the machine;
* **reference**: ``tokenizers.Tokenizer.encode_batch_fast`` over the same text, already in memory (not timed), cut
  into the same pieces and batched as modkit batches them, with the library's own threads: encoding alone, the
  ceiling of any pipeline built on the library.

The ids of both are compared (sha256 of the ``uint16`` ids; modkit's without its final ``<|endoftext|>``).
``--char-mb`` also prepares a record of that size with ``--tokenizer char`` (a training pass and an encoding pass)
and reports its peak memory. The load average is recorded: on a shared machine absolute figures move.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import platform
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from modkit.data import default_corpus, train_tokenizer  # noqa: E402
from modkit.data.cutting import TextCutter  # noqa: E402
from modkit.data.encode import BATCH_CHARS  # noqa: E402
from modkit.data.sources import PIECE_CHARS  # noqa: E402
from modkit.data.tokenizer import EOT_TOKEN  # noqa: E402


def speeches(chars: int, seed: int = 0) -> Iterator[str]:
    """Chunks of the document (speeches and the blank lines between them), ``chars`` characters in all."""
    pool = [s for s in default_corpus().read_text(encoding="utf-8").split("\n\n") if s.strip()]
    rng, left = random.Random(seed), chars
    while left > 0:
        chunk = (rng.choice(pool) + "\n\n")[:left]
        left -= len(chunk)
        yield chunk


def write_record(path: Path, chars: int) -> int:
    """Write one JSON Lines record holding ``chars`` characters of text, gzip-compressed; returns its bytes."""
    with gzip.open(path, "wb", compresslevel=6) as f:
        f.write(b'{"id": 0, "text": "')
        buf: list[str] = []
        for chunk in speeches(chars):
            buf.append(chunk)
            if len(buf) >= 4096:
                f.write(json.dumps("".join(buf))[1:-1].encode("utf-8"))
                buf = []
        f.write(json.dumps("".join(buf))[1:-1].encode("utf-8") + b'"}\n')
    return path.stat().st_size


def run_prepare(corpus: Path, out: Path, tokenizer: str, limit_gb: float) -> dict:
    """``modkit data prepare`` in a child under an address-space limit: wall seconds, peak RSS (bytes), exit status."""

    def limit() -> None:
        cap = int(limit_gb * 2**30)
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))

    cmd = [sys.executable, "-m", "modkit", "data", "prepare", str(corpus), "-o", str(out), "--tokenizer", tokenizer]
    env = {**os.environ, "PYTHONPATH": str(HERE.parent)}
    start = time.perf_counter()
    child = subprocess.Popen(cmd, cwd=HERE.parent, env=env, preexec_fn=limit, stdout=subprocess.PIPE, text=True)
    output = child.stdout.read()
    _, status, usage = os.wait4(child.pid, 0)
    seconds = time.perf_counter() - start
    child.returncode = os.waitstatus_to_exitcode(status)
    return {"seconds": seconds, "rss": usage.ru_maxrss * 1024, "status": child.returncode, "output": output}


def reference(tok_path: Path, chars: int) -> tuple[float, int, str]:
    """(seconds encoding, tokens, sha256 of the uint16 ids) of ``encode_batch_fast`` over the text's pieces."""
    import tokenizers

    backend = tokenizers.Tokenizer.from_file(str(tok_path))
    backend.encode_special_tokens = True  # documents are encoded ordinarily, as modkit does
    cutter, pieces = TextCutter(PIECE_CHARS), []
    for chunk in speeches(chars):
        pieces += [p for p, _ in cutter.feed(chunk)]
    pieces.append(cutter.finish()[0])
    batches, batch, size = [], [], 0
    for p in pieces:  # batches of about BATCH_CHARS characters, as modkit's encoder forms them
        batch.append(p)
        size += len(p)
        if size >= BATCH_CHARS:
            batches.append(batch)
            batch, size = [], 0
    batches.append(batch)
    h, n, seconds = hashlib.sha256(), 0, 0.0
    for batch in batches:
        start = time.perf_counter()
        enc = backend.encode_batch_fast(batch, add_special_tokens=False)
        seconds += time.perf_counter() - start
        for e in enc:
            h.update(np.asarray(e.ids, dtype=np.uint16).tobytes())
            n += len(e.ids)
    return seconds, n, h.hexdigest()


def modkit_ids_digest(out: Path) -> tuple[int, str]:
    """(tokens, sha256) of train.bin + val.bin without the final end-of-text id."""
    h, n = hashlib.sha256(), 0
    total = sum((out / f).stat().st_size for f in ("train.bin", "val.bin")) - 2
    left = total
    for name in ("train.bin", "val.bin"):
        with open(out / name, "rb") as f:
            while left > 0:
                block = f.read(min(1 << 22, left))
                if not block:
                    break
                h.update(block)
                left -= len(block)
    n = total // 2
    return n, h.hexdigest()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    ap.add_argument("--mb", type=int, default=300, help="characters of the record's text, in millions (default 300)")
    ap.add_argument("--char-mb", type=int, default=40, help="record size for the char tokenizer run (0: skip)")
    ap.add_argument("--limit-gb", type=float, default=3.0, help="address-space limit of the prepare child (GiB)")
    ap.add_argument("-o", "--output", default=str(HERE / "results_prepare_long_record.md"))
    ap.add_argument("--keep", metavar="DIR", help="write the files here and keep them (default: a temporary folder)")
    args = ap.parse_args()
    load_before = os.getloadavg()
    chars = args.mb * 10**6
    with tempfile.TemporaryDirectory(prefix="modkit-bench-long-record-") as tmp:
        root = Path(args.keep or tmp)
        root.mkdir(parents=True, exist_ok=True)
        corpus = root / "one-record.jsonl.gz"
        t0 = time.perf_counter()
        size = write_record(corpus, chars)
        print(
            f"corpus: one record of {chars / 1e6:,.0f} M characters, {size / 1e6:,.1f} MB gzip-compressed, "
            f"written in {time.perf_counter() - t0:.0f} s"
        )
        tok = train_tokenizer("bpe:8192", [default_corpus().read_text(encoding="utf-8")], special_tokens=[EOT_TOKEN])
        tok_path = tok.save(root / "tokenizer.json")
        m = run_prepare(corpus, root / "out", str(tok_path), args.limit_gb)
        if m["status"] != 0:
            raise SystemExit(
                f"modkit data prepare failed (exit status {m['status']}), peak RSS {m['rss'] / 2**20:,.0f} MiB"
            )
        n_modkit, sha_modkit = modkit_ids_digest(root / "out")
        print(
            f"modkit data prepare: {m['seconds']:.1f} s, {chars / 1e6 / m['seconds']:.2f} MB/s, "
            f"{n_modkit / 1e6 / m['seconds']:.2f} M tokens/s, peak RSS {m['rss'] / 2**20:,.0f} MiB"
        )
        load_mid = os.getloadavg()
        ref_s, n_ref, sha_ref = reference(tok_path, chars)
        print(
            f"tokenizers encode_batch_fast: {ref_s:.1f} s, {chars / 1e6 / ref_s:.2f} MB/s, {n_ref / 1e6 / ref_s:.2f} M tokens/s"
        )
        same = (n_ref, sha_ref) == (n_modkit, sha_modkit)
        print(f"modkit's ids equal the reference's: {same}")
        char = None
        if args.char_mb:
            small = root / "char-record.jsonl.gz"
            write_record(small, args.char_mb * 10**6)
            char = run_prepare(small, root / "out-char", "char", args.limit_gb)
            print(
                f"char, {args.char_mb} M characters: {char['seconds']:.1f} s (two passes), peak RSS "
                f"{char['rss'] / 2**20:,.0f} MiB, exit status {char['status']}"
            )
    load_after = os.getloadavg()
    lines = [
        "# `modkit data prepare` on one long record: peak memory and throughput",
        "",
        f"Generated by `.venv/bin/python benchmarks/bench_prepare_long_record.py --mb {args.mb} --char-mb {args.char_mb}` "
        f"on {platform.node() or 'this machine'} ({os.cpu_count()} CPUs), load average {load_before[0]:.1f} before, "
        f"{load_mid[0]:.1f} between and {load_after[0]:.1f} after (a machine shared with other work: absolute figures "
        "move with the load).",
        "",
        f"Input: one JSON Lines record, {chars / 1e6:,.0f} M characters of text (speeches of tiny shakespeare, seeded), "
        f"{size / 1e6:,.1f} MB gzip-compressed; byte-level `bpe:8192` with `<|endoftext|>` reserved. The prepare child "
        f"ran under an address-space limit of {args.limit_gb:g} GiB.",
        "",
        "| what | seconds | MB/s of text | M tokens/s | peak RSS |",
        "|---|---:|---:|---:|---:|",
        f"| modkit data prepare (end to end, subprocess) | {m['seconds']:.1f} | {chars / 1e6 / m['seconds']:.2f} | "
        f"{n_modkit / 1e6 / m['seconds']:.2f} | {m['rss'] / 2**20:,.0f} MiB |",
        f"| tokenizers encode_batch_fast (encoding alone, text in memory) | {ref_s:.1f} | {chars / 1e6 / ref_s:.2f} | "
        f"{n_ref / 1e6 / ref_s:.2f} | (the text in memory) |",
    ]
    if char is not None:
        lines.append(
            f"| modkit data prepare --tokenizer char, {args.char_mb} M characters (train + encode passes) | "
            f"{char['seconds']:.1f} | {2 * args.char_mb / char['seconds']:.2f} (both passes) | | {char['rss'] / 2**20:,.0f} MiB |"
        )
    lines += [
        "",
        f"modkit's ids (without the final `<|endoftext|>`) equal the reference's, sha256 of the uint16 ids: {same}.",
    ]
    Path(args.output).write_text("\n".join(lines) + "\n")
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()

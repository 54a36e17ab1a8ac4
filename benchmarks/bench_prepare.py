"""Throughput of ``modkit data prepare`` on a generated corpus of >= 200 MB, against ``tokenizers``' own batch
encoding of the same text in the same run.

    .venv/bin/python benchmarks/bench_prepare.py                  # 200 MB, workers 1 and 2; writes benchmarks/results_prepare.md
    .venv/bin/python benchmarks/bench_prepare.py --mb 400 --workers 1 2 4 -o /tmp/prepare.md

The corpus: JSON Lines documents of 1 to 12 speeches of tiny shakespeare each, drawn with a fixed seed (real
text, so the BPE merges behave as on prose), written to a temporary folder. The tokenizer: byte-level ``bpe:8192``
trained on tiny shakespeare, with ``<|endoftext|>`` reserved, saved as a ``tokenizer.json``.

Measured, in one process run after the other on the same files:

* **reference**: the records already parsed into memory (not timed), then ``tokenizers.Tokenizer.encode_batch``
  (with offsets, the library's general call) and ``encode_batch_fast`` (no offsets, what modkit calls) over the same
  batches of about ``BATCH_CHARS`` characters that modkit hands it, with the library's own threads: encoding alone,
  the ceiling of any pipeline built on the library;
* **modkit**: ``prepare([corpus], out, tokenizer=tokenizer.json, workers=N)`` in a fresh subprocess per N: reading,
  JSON parsing, encoding, writing, hashing, the validation split, everything end to end (wall time). The subprocess
  also reports its peak resident memory (its own and its workers'), which stays bounded by the chunk sizes.

Printed: MB/s of text, million tokens/s, and modkit's throughput as a ratio of each reference's. The outputs of
every N are checked byte for byte against each other and against the reference ids (the documents' ids, each
followed by the end-of-text id). The machine's load average is recorded before and after: on a shared machine
the absolute figures move, the ratios less.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from modkit.data import default_corpus, train_tokenizer  # noqa: E402
from modkit.data.encode import BATCH_CHARS  # noqa: E402
from modkit.data.tokenizer import EOT_TOKEN  # noqa: E402

CHILD = r"""
import json, resource, sys, time
from modkit.data import prepare
corpus, out, tok, workers = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
start = time.perf_counter()
meta = prepare([corpus], out, tokenizer=tok, workers=workers, show_progress=False)
seconds = time.perf_counter() - start
me = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
print(json.dumps({"seconds": seconds, "tokens": sum(meta["tokens"].values()), "rss": me, "worker_rss": kids,
                  "sha": [meta["files"][f]["sha256"] for f in ("train.bin", "val.bin")]}))
"""


def make_corpus(path: Path, megabytes: int, seed: int = 0) -> tuple[int, int]:
    """Write ``megabytes`` MB (10^6 bytes) or more of JSON Lines documents; returns (documents, bytes of text)."""
    speeches = [s for s in default_corpus().read_text(encoding="utf-8").split("\n\n") if s.strip()]
    rng = random.Random(seed)
    target, written, docs, text_bytes = megabytes * 10**6, 0, 0, 0
    with open(path, "w", encoding="utf-8") as f:
        while written < target:
            doc = "\n\n".join(rng.choice(speeches) for _ in range(rng.randint(1, 12)))
            line = json.dumps({"text": doc}) + "\n"
            f.write(line)
            written += len(line.encode("utf-8"))
            text_bytes += len(doc.encode("utf-8"))
            docs += 1
    return docs, text_bytes


def batches(texts: list[str]) -> list[list[str]]:
    """The texts in batches of about BATCH_CHARS characters, as modkit's encoder forms them."""
    out, batch, size = [], [], 0
    for t in texts:
        batch.append(t)
        size += len(t)
        if size >= BATCH_CHARS:
            out.append(batch)
            batch, size = [], 0
    if batch:
        out.append(batch)
    return out


def reference(tok_path: Path, texts: list[str], eot_id: int, fast: bool) -> tuple[float, int, str]:
    """(seconds encoding, tokens incl. one separator per document, sha256 of the uint16 ids) of tokenizers alone."""
    import tokenizers

    backend = tokenizers.Tokenizer.from_file(str(tok_path))
    backend.encode_special_tokens = True  # documents are encoded ordinarily, as modkit does
    h, n, seconds = hashlib.sha256(), 0, 0.0
    for batch in batches(texts):
        start = time.perf_counter()
        enc = (
            backend.encode_batch_fast(batch, add_special_tokens=False)
            if fast
            else backend.encode_batch(batch, add_special_tokens=False)
        )
        seconds += time.perf_counter() - start
        for e in enc:
            ids = np.asarray(e.ids + [eot_id], dtype=np.uint16)
            h.update(ids.tobytes())
            n += len(ids)
    return seconds, n, h.hexdigest()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    ap.add_argument("--mb", type=int, default=200, help="corpus size in MB (>= 200 for the reported figure)")
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2], help="process counts to run modkit with")
    ap.add_argument("-o", "--output", default=str(HERE / "results_prepare.md"))
    ap.add_argument(
        "--keep", metavar="DIR", help="write the corpus and outputs here and keep them (default: a temporary folder)"
    )
    args = ap.parse_args()
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="modkit-bench-prepare-") as tmp:
        root = Path(args.keep or tmp)
        root.mkdir(parents=True, exist_ok=True)
        corpus = root / "corpus.jsonl"
        t0 = time.perf_counter()
        docs, text_bytes = make_corpus(corpus, args.mb)
        size = corpus.stat().st_size
        print(
            f"corpus: {docs:,} documents, {size / 1e6:,.1f} MB of JSON Lines ({text_bytes / 1e6:,.1f} MB of text), "
            f"written in {time.perf_counter() - t0:.0f} s"
        )
        tok = train_tokenizer("bpe:8192", [default_corpus().read_text(encoding="utf-8")], special_tokens=[EOT_TOKEN])
        tok_path = tok.save(root / "tokenizer.json")
        with open(corpus, encoding="utf-8") as f:
            texts = [json.loads(line)["text"] for line in f]
        rows = []
        for fast in (False, True):
            seconds, n, digest = reference(tok_path, texts, tok.eot_id, fast)
            name = "tokenizers encode_batch_fast" if fast else "tokenizers encode_batch"
            rows.append({"what": name, "seconds": seconds, "tokens": n, "sha": digest, "load": os.getloadavg()[0]})
            print(f"{name}: {seconds:.1f} s, {text_bytes / 1e6 / seconds:.1f} MB/s, {n / 1e6 / seconds:.2f} M tokens/s")
        del texts
        for w in args.workers:
            out = root / f"out-{w}"
            done = subprocess.run(
                [sys.executable, "-c", CHILD, str(corpus), str(out), str(tok_path), str(w)],
                check=True,
                capture_output=True,
                text=True,
                cwd=HERE.parent,
            )
            r = json.loads(done.stdout.strip().splitlines()[-1])
            joined = hashlib.sha256((out / "train.bin").read_bytes() + (out / "val.bin").read_bytes()).hexdigest()
            rows.append(
                {
                    "what": f"modkit prepare, {w} process{'es' if w > 1 else ''}",
                    "seconds": r["seconds"],
                    "tokens": r["tokens"],
                    "sha": joined,
                    "rss": r["rss"],
                    "worker_rss": r["worker_rss"],
                    "files": r["sha"],
                    "load": os.getloadavg()[0],
                }
            )
            print(
                f"modkit prepare workers={w}: {r['seconds']:.1f} s, {text_bytes / 1e6 / r['seconds']:.1f} MB/s, "
                f"{r['tokens'] / 1e6 / r['seconds']:.2f} M tokens/s, peak RSS {r['rss'] / 2**20:,.0f} MiB "
                f"(workers {r['worker_rss'] / 2**20:,.0f} MiB)"
            )
    load_after = os.getloadavg()
    ref = {r["what"]: r for r in rows}
    same = len({r["sha"] for r in rows}) == 1
    print(f"every output equal to the reference ids, byte for byte: {same}")
    lines = [
        "# `modkit data prepare` throughput against `tokenizers`",
        "",
        f"Generated by `.venv/bin/python benchmarks/bench_prepare.py --mb {args.mb} --workers {' '.join(map(str, args.workers))}` "
        f"on {platform.node() or 'this machine'} ({os.cpu_count()} CPUs, {platform.processor() or platform.machine()}), "
        f"load average {load_before[0]:.1f} before and {load_after[0]:.1f} after (a machine shared with other work: "
        "absolute figures move with the load, the ratios less).",
        "",
        f"Corpus: {docs:,} JSON Lines documents (speeches of tiny shakespeare, 1-12 each, seeded), {size / 1e6:,.1f} MB "
        f"on disk, {text_bytes / 1e6:,.1f} MB of text; byte-level `bpe:8192` with `<|endoftext|>` reserved.",
        "",
        "| what | seconds | MB/s of text | M tokens/s | ÷ encode_batch | ÷ encode_batch_fast | peak RSS | load after |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    base, fast = ref["tokenizers encode_batch"], ref["tokenizers encode_batch_fast"]
    for r in rows:
        rss = (
            f"{r['rss'] / 2**20:,.0f} MiB"
            + (f" (+ workers {r['worker_rss'] / 2**20:,.0f} MiB each at most)" if r.get("worker_rss") else "")
            if "rss" in r
            else "(texts in memory)"
        )
        lines.append(
            f"| {r['what']} | {r['seconds']:.1f} | {text_bytes / 1e6 / r['seconds']:.1f} | {r['tokens'] / 1e6 / r['seconds']:.2f} | "
            f"{base['seconds'] / r['seconds']:.2f} | {fast['seconds'] / r['seconds']:.2f} | {rss} | {r['load']:.1f} |"
        )
    lines += [
        "",
        "Ratios are throughput ÷ the reference's (above 1: faster). The references time the encoding calls alone, with "
        "the texts already parsed in memory; modkit's time is the whole preparation from the file on disk to the "
        "finished dataset folder (reading, JSON parsing, encoding, writing, two sha256 passes, the split).",
        "",
        f"Every output equals the reference ids byte for byte (documents, each followed by `<|endoftext|>`): {same}.",
    ]
    Path(args.output).write_text("\n".join(lines) + "\n")
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()

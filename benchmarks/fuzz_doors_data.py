"""Doors ``forward`` and ``prepare`` of :mod:`fuzz_doors`.

``forward``: the tiny shipped specs (``specs/tiny-*.json``) with one or two numeric fields of the spec or of its
components set to another value (extremes such as ``1e300`` or ``1e-300`` are bad by construction; ordinary values
and small sizes are not), read with ``load_spec``, built on cpu and run forward on real token ids, in this
process under an alarm. Accepted with non-finite logits (or auxiliary loss) is ``accepted-bad`` whatever the label.

``prepare``: ``modkit data prepare`` on generated inputs (truncated and garbage compressed files, ``.json`` files,
bad records, binary garbage, empty files, symlinks pointing out of a folder, one long record under an address-space
cap, tokenizer mismatches, bad flags), each in a forked child. An accepted run whose ``meta.json`` records 0 tokens
for a non-empty input is a loss.
"""

from __future__ import annotations

import copy
import gzip
import json
import random
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fuzz_doors_core as core  # noqa: E402
from fuzz_doors_core import Record, fi  # noqa: E402

REPO = core.REPO
TINY_SPECS = sorted((REPO / "specs").glob("tiny-*.json"))
SHAKESPEARE = REPO / "modkit" / "data" / "tinyshakespeare.txt"

# ------------------------------------------------------------------------------------------------ forward

#: numbers beyond what any real model uses: bad by construction
EXTREME = [1e300, 1e308, -1e300, 1e30, -1e30, 1e-300, 5e-324, 1e-30, -1e-300]
#: ordinary numbers (some out of a field's range: then the refusal is expected, and acceptance is fine)
ORDINARY = [0.0, -1.0, 0.5, 2.0, 10.0, 1e4, 1e-6, 0.1]
SMALL_INTS = [0, -1, 1, 2, 3, 4, 8, 16]
#: parent key of a component -> its registry kind
KIND_OF = {
    "attention": "attention",
    "ffn": "ffn",
    "norm": "norm",
    "final_norm": "norm",
    "embedding_norm": "norm",
    "qk_norm": "norm",
    "latent_norm": "norm",
    "position": "position",
    "placement": "placement",
    "router": "router",
    "mixer": "mixer",
}


def _numeric_props(schema: dict, node: dict, depth: int = 0) -> dict[tuple, str]:
    """``{(name, ...): "number" | "integer"}`` of a JSON Schema's properties, nested plain models included."""
    out: dict[tuple, str] = {}
    for name, prop in node.get("properties", {}).items():
        if prop.get("x-modkit-slot"):
            continue
        variants = [prop, *prop.get("anyOf", []), *prop.get("oneOf", [])]
        types = {v.get("type") for v in variants}
        if "number" in types:
            out[(name,)] = "number"
        elif "integer" in types:
            out[(name,)] = "integer"
        if depth < 2:
            for v in variants:
                ref = v.get("$ref", "")
                target = schema.get("$defs", {}).get(ref.rsplit("/", 1)[-1]) if ref else None
                if target and target.get("properties") and not target.get("x-modkit-slot"):
                    for sub, t in _numeric_props(schema, target, depth + 1).items():
                        out[(name, *sub)] = t
    return out


def numeric_slots(doc: dict) -> list[tuple[tuple, str]]:
    """Every ``(path, "number" | "integer")`` a spec document can hold a number at: the spec's own fields and each
    component's (present or not; a nested model only where the document has it)."""
    import modkit
    from modkit.spec import ModelSpec

    reg = modkit.get_registry()
    top = ModelSpec.model_json_schema()
    slots = [(p, t) for p, t in _numeric_props(top, top).items() if len(p) == 1 and p[0] != "schema_version"]
    for path, node in fi._nodes(doc):
        if not (isinstance(node, dict) and isinstance(node.get("type"), str) and path):
            continue
        key = next((str(p) for p in reversed(path) if isinstance(p, str)), "")
        kinds = [KIND_OF[key]] if key in KIND_OF else reg.kinds()
        entry = None
        for kind in kinds:
            try:
                entry = reg.get(kind, node["type"])
                break
            except Exception:  # noqa: BLE001 - not of this kind
                continue
        if entry is None or entry.config is None:
            continue
        schema = entry.config.model_json_schema()
        for sub, t in _numeric_props(schema, schema).items():
            holder = node
            for part in sub[:-1]:
                holder = holder.get(part) if isinstance(holder, dict) else None
            if isinstance(holder, dict):
                slots.append((path + sub, t))
    return slots


def _put(doc: dict, path: tuple, value) -> None:
    node = doc
    for p in path[:-1]:
        node = node[p]
    node[path[-1]] = value


def forward_case(doc: dict, slots, rng: random.Random) -> tuple[str, dict, bool]:
    """One or two numeric changes of ``doc``: ``(label, document, bad)``."""
    doc = copy.deepcopy(doc)
    parts, bad = [], False
    for _ in range(1 if rng.random() < 0.7 else 2):
        path, t = rng.choice(slots)
        key = str(path[-1])
        if t == "integer":
            value = rng.choice(SMALL_INTS)
            bad = bad or (value <= 0 and key in fi.SIZE_KEYS)
        elif rng.random() < 0.6:
            value = rng.choice(EXTREME)
            bad = True
        else:
            value = rng.choice(ORDINARY)
        _put(doc, path, value)
        parts.append(f"{'.'.join(map(str, path))}={value!r}")
    return ", ".join(parts), doc, bad


def run_forward(n: int, rng: random.Random, tmp: Path, timeout: float, emit) -> None:
    import torch

    import modkit
    from modkit.core.errors import SpecError

    docs = [(p.stem, json.loads(p.read_text())) for p in TINY_SPECS]
    slots = {name: numeric_slots(doc) for name, doc in docs}
    for i in range(n):
        name, doc = docs[i % len(docs)]
        label, mutated, bad = forward_case(doc, slots[name], rng)
        label = f"{name}: {label}"
        start = time.perf_counter()
        outcome, error, detail = "harmless", "", ""
        try:
            with fi.deadline(timeout):
                spec = modkit.load_spec(mutated)
                meta = modkit.build(spec, device="meta")
                params = sum(p.numel() for p in meta.parameters())
                if params > 20_000_000:
                    outcome, detail = ("accepted-bad" if bad else "harmless"), f"{params:,} parameters: not run"
                else:
                    model = modkit.build(spec, seed=i).eval()
                    g = torch.Generator().manual_seed(i)
                    seq = max(1, min(8, spec.max_seq_len))
                    ids = torch.randint(0, spec.vocab_size, (2, seq), generator=g)
                    with torch.no_grad():
                        out = model(ids)
                    finite = bool(torch.isfinite(out.logits).all())
                    aux = out.aux_loss
                    if aux is not None and not bool(torch.isfinite(aux).all()):
                        finite, detail = False, "non-finite aux_loss"
                    if not finite:
                        outcome = "accepted-bad"
                        detail = detail or f"non-finite logits ({int((~torch.isfinite(out.logits)).sum())} values)"
            if outcome == "harmless" and time.perf_counter() - start > 5.0:
                outcome = "slow"
        except fi.Timeout:
            outcome = "hang"
        except SpecError as exc:
            outcome, error = "named", str(exc).splitlines()[0][:300]
        except MemoryError as exc:
            outcome, error = "crash-or-loss", f"MemoryError: {exc}"[:300]
        except Exception as exc:  # noqa: BLE001
            outcome = "named" if fi._ours(exc) else "raw"
            error = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300]
        emit(Record("forward", label, bad, outcome, error, round(time.perf_counter() - start, 3), detail))


# ------------------------------------------------------------------------------------------------ prepare


def _text(rng: random.Random, chars: int = 2000) -> str:
    data = SHAKESPEARE.read_text()
    start = rng.randrange(0, len(data) - chars)
    return data[start : start + chars]


def _records(rng: random.Random, n: int = 20) -> list[dict]:
    return [{"text": _text(rng, rng.randrange(50, 400)), "id": k} for k in range(n)]


def _jsonl(records) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in records).encode()


def _zst(data: bytes, frames: int = 1) -> bytes:
    import zstandard

    if frames == 1:
        return zstandard.ZstdCompressor().compress(data)
    step = max(1, len(data) // frames)
    return b"".join(zstandard.ZstdCompressor().compress(data[k : k + step]) for k in range(0, len(data), step))


def _parquet(path: Path, records) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"text": [r["text"] for r in records]}), path)


class Prep:
    """One prepare input: files written under ``d``, the argv after ``data prepare``, label, bad, hints."""

    def __init__(self, d: Path, label: str, bad: bool):
        self.d, self.label, self.bad = d, label, bad
        self.inputs: list[str] = []
        self.flags: list[str] = []
        self.hints: list[str] = []
        self.timeout, self.mem_gb, self.slow_s = 60.0, 2.0, 20.0

    def file(self, name: str, data: bytes, *, given: bool = True, hint: bool = True) -> Path:
        p = self.d / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
        if given:
            self.inputs.append(str(p))
        if hint:
            self.hints.append(p.name)
        return p

    def good(self, rng: random.Random, name: str = "good.jsonl") -> Path:
        return self.file(name, _jsonl(_records(rng)), hint=False)


def _bad_line(rng: random.Random, record: bytes, name: str) -> tuple[str, bytes, bool]:
    """A JSON Lines file of good records with ``record`` at a random line: ``(label, bytes, bad)``."""
    recs = [json.dumps(r).encode() for r in _records(rng, 12)]
    at = rng.randrange(len(recs) + 1)
    recs.insert(at, record)
    return f"{name} at line {at + 1}", b"\n".join(recs) + b"\n", True


def _record_kinds(rng: random.Random) -> list[tuple[str, bytes, bool]]:
    """Records that a careful user's JSON Lines could hold, each ``(label, raw line, bad)``."""
    digits = "9" * 5000
    return [
        ("lone surrogate", b'{"text": "abc\\ud800def"}', True),
        ("lone low surrogate", b'{"text": "\\udc80 tail"}', True),
        ("raw null byte", b'{"text": "a\x00b"}', True),
        ("escaped null", b'{"text": "a\\u0000b"}', False),
        ("text a number", b'{"text": 5}', True),
        ("text null", b'{"text": null}', True),
        ("text a list", b'{"text": ["a", "b"]}', True),
        ("text an object", b'{"text": {"a": 1}}', True),
        ("text true", b'{"text": true}', True),
        ("no text field", b'{"body": "hello"}', True),
        ("text 1e999", b'{"text": 1e999}', True),
        ("other field 1e999", b'{"text": "fine", "n": 1e999}', False),
        ("text 5000 digits", b'{"text": ' + digits.encode() + b"}", True),
        ("other field 5000 digits", b'{"text": "fine", "id": ' + digits.encode() + b"}", False),
        ("truncated line", b'{"text": "half a rec', True),
        ("a list record", b'["text", "x"]', True),
        ("a string record", b'"just text"', True),
        ("duplicate text key", b'{"text": "a", "text": "b"}', True),
        ("NaN literal", b'{"text": "a", "score": NaN}', True),
        ("invalid UTF-8", b'{"text": "caf\xe9"}', True),
        ("deeply nested", b'{"text": "a", "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", True),
        ("CRLF line", b'{"text": "crlf"}\r', False),
        ("BOM line", b'\xef\xbb\xbf{"text": "bom"}', True),
    ]


def _nth(fn, options: list):
    """The next of ``options`` for the kind ``fn`` (cycled in order, so every variant is tried)."""
    fn.count = getattr(fn, "count", -1) + 1
    return options[fn.count % len(options)]


def prepare_kinds():
    """``name -> make(rng, d) -> Prep``: one entry per kind of input; cycled through, varied by the seed."""
    K = {}

    def kind(fn):
        K[fn.__name__] = fn
        return fn

    @kind
    def gz_truncated(rng, d):
        p = Prep(d, "", True)
        data = gzip.compress(_jsonl(_records(rng)))
        cut = rng.randrange(len(data) // 10, len(data) - 8)
        if rng.random() < 0.5:
            p.good(rng)
        p.file("cut.jsonl.gz", data[:cut])
        p.label = f"truncated .jsonl.gz at {cut}/{len(data)}" + (" beside a good file" if len(p.inputs) > 1 else "")
        return p

    @kind
    def zst_truncated(rng, d):
        p = Prep(d, "", True)
        data = _zst(_jsonl(_records(rng)))
        cut = len(data) // 2 + rng.randrange(-len(data) // 4, len(data) // 4)
        if rng.random() < 0.7:
            p.good(rng)
        p.file("cut.jsonl.zst", data[:cut])
        p.label = f"single-frame .jsonl.zst cut at {cut}/{len(data)}" + (
            " beside a good file" if len(p.inputs) > 1 else ""
        )
        return p

    @kind
    def zst_frame_boundary(rng, d):
        p = Prep(d, "multi-frame .jsonl.zst cut at a frame boundary (cannot be told from a shorter file)", False)
        import zstandard

        body = _jsonl(_records(rng))
        lines = body.splitlines(keepends=True)
        half = len(lines) // 2
        first = zstandard.ZstdCompressor().compress(b"".join(lines[:half]))
        p.file("frames.jsonl.zst", first)
        return p

    @kind
    def compressed_garbage(rng, d):
        name = _nth(
            compressed_garbage, ["junk.jsonl.gz", "junk.jsonl.zst", "junk.txt.gz", "junk.txt.zst", "junk.json.gz"]
        )
        p = Prep(d, f"random bytes named {name}", True)
        p.file(name, rng.randbytes(rng.choice([3, 100, 5000])))
        return p

    @kind
    def plain_named_compressed(rng, d):
        name = rng.choice(["plain.jsonl.gz", "plain.jsonl.zst"])
        p = Prep(d, f"uncompressed JSON Lines named {name}", True)
        p.file(name, _jsonl(_records(rng)))
        return p

    @kind
    def json_named(rng, d):
        form = _nth(json_named, ["array", "object", "lines"])
        recs = _records(rng, 5)
        data = {"array": json.dumps(recs), "object": json.dumps({"data": recs}), "lines": _jsonl(recs).decode()}[form]
        # a .json file holding JSON Lines is read as JSON Lines (docs/guides/data.md): not bad
        p = Prep(d, f".json file ({form}) given by name", form != "lines")
        p.file("records.json", data.encode())
        return p

    @kind
    def json_in_folder(rng, d):
        p = Prep(d, ".json file inside a folder beside a good .jsonl", True)
        p.good(rng, "corpus/a.jsonl")
        p.file("corpus/b.json", json.dumps(_records(rng, 5)).encode(), given=False)
        p.inputs = [str(d / "corpus")]
        return p

    @kind
    def bad_record(rng, d):
        label, line, bad = _nth(bad_record, _record_kinds(rng))
        label, data, _ = _bad_line(rng, line, label)
        suffix = rng.choice([".jsonl", ".jsonl", ".jsonl.gz", ".jsonl.zst"])
        if suffix == ".jsonl.gz":
            data = gzip.compress(data)
        elif suffix == ".jsonl.zst":
            data = _zst(data)
        p = Prep(d, f"record: {label} ({suffix})", bad)
        p.file("records" + suffix, data)
        p.hints.append("line")
        return p

    @kind
    def binary_garbage(rng, d):
        name = _nth(binary_garbage, ["junk.txt", "junk.jsonl", "junk.parquet", "junk.md", "corpus/junk.txt"])
        p = Prep(d, f"binary garbage as {name}", True)
        p.file(name, rng.randbytes(rng.choice([16, 700, 20000])) + b"\xff\xfe\x00")
        if name.startswith("corpus/"):
            p.good(rng, "corpus/good.jsonl")
            p.inputs = [str(d / "corpus")]
        return p

    @kind
    def parquet_damaged(rng, d):
        p = Prep(d, "", True)
        f = d / "rows.parquet"
        _parquet(f, _records(rng, 50))
        data = bytearray(f.read_bytes())
        how = _nth(parquet_damaged, ["truncated", "flipped", "zeroed"])
        if how == "truncated":
            data = data[: rng.randrange(8, len(data) - 8)]
        else:
            at = rng.randrange(8, max(9, len(data) // 2))
            for k in range(at, min(len(data) - 8, at + 64)):
                data[k] = (data[k] ^ 0xFF) if how == "flipped" else 0
        p.label = f"parquet {how}"
        p.file("rows.parquet", bytes(data))
        return p

    @kind
    def empty(rng, d):
        name = _nth(empty, ["empty.txt", "empty.jsonl", "empty.jsonl.gz", "empty.parquet"])
        beside = rng.random() < 0.5
        p = Prep(d, f"empty {name}" + (" beside a good file" if beside else " alone"), not beside)
        if beside:
            p.good(rng)
        p.file(name, b"")
        if name == "empty.jsonl.gz" or name == "empty.parquet":
            p.bad = True  # a 0-byte file is not a gzip stream / parquet file
        return p

    @kind
    def symlink_outside(rng, d):
        how = _nth(symlink_outside, ["file", "folder", "dangling", "loop"])
        p = Prep(d, f"folder with a symlink pointing outside ({how})", True)
        p.good(rng, "corpus/a.jsonl")
        outside = d / "outside"
        outside.mkdir()
        (outside / "secret.txt").write_text("outside text " * 50)
        link = d / "corpus" / ("z.txt" if how != "folder" else "zdir")
        if how == "file":
            link.symlink_to(outside / "secret.txt")
        elif how == "folder":
            link.symlink_to(outside)
        elif how == "dangling":
            link.symlink_to(d / "nowhere.txt")
        else:
            link = d / "corpus" / "zloop"
            link.symlink_to(d / "corpus")
        p.inputs = [str(d / "corpus")]
        p.hints += [link.name, "symlink", "link"]
        p.outside = str(outside)
        return p

    @kind
    def tokenizer_mismatch(rng, d):
        which = _nth(
            tokenizer_mismatch,
            ["other char tokenizer", "garbage tokenizer.json", "bpe:abc", "bpe:0", "bpe:-5", "bpe:100", "bpe:1e9"]
            + ["char:3", "bpe:", "missing tokenizer"],
        )
        p = Prep(d, f"--tokenizer {which}", True)
        p.file("text.txt", _text(rng, 3000).encode(), hint=False)
        if which == "other char tokenizer":
            p.flags += ["--tokenizer", str(d / "digits" / "tokenizer.json")]
            p.pre = ("digits", "0123456789 " * 30)
            p.hints += ["tokenizer", "not in the vocabulary", "unknown"]
        elif which == "garbage tokenizer.json":
            p.file("tok/tokenizer.json", rng.randbytes(300), given=False)
            p.flags += ["--tokenizer", str(d / "tok" / "tokenizer.json")]
        elif which == "missing tokenizer":
            p.flags += ["--tokenizer", str(d / "none" / "tokenizer.json")]
            p.hints += ["tokenizer.json", "none"]
        else:
            p.flags += ["--tokenizer", which]
            p.hints += ["--tokenizer", "tokenizer", which]
        return p

    @kind
    def bad_flag(rng, d):
        flag, value = _nth(
            bad_flag,
            [
                ("--val-fraction", "0"),
                ("--val-fraction", "1"),
                ("--val-fraction", "nan"),
                ("--val-fraction", "-0.5"),
                ("--val-fraction", "inf"),
                ("--workers", "0"),
                ("--workers", "-1"),
                ("--text-field", ""),
                ("--eot", "zz-not-a-token"),
                ("--bos", "zz-not-a-token"),
                ("--val", "__empty__"),
                ("-o", "__file__"),
            ],
        )
        p = Prep(d, f"{flag} {value!r}", True)
        p.good(rng)
        if value == "__empty__":
            value = str(p.file("empty-val.jsonl", b"", given=False))
        if value == "__file__":
            value = str(p.file("out-is-a-file", b"x", given=False))
        p.flags += [flag, value]
        p.hints += [flag, flag.strip("-").replace("-", "_"), value]
        return p

    @kind
    def odd_text(rng, d):
        how = _nth(odd_text, ["utf-16", "latin-1", "BOM + CRLF", "only blank lines", "NUL bytes in text"])
        text = _text(rng, 1500)
        data = {
            "utf-16": text.encode("utf-16"),
            "latin-1": (text + " café").encode("latin-1"),
            "BOM + CRLF": b"\xef\xbb\xbf" + text.replace("\n", "\r\n").encode(),
            "only blank lines": b"\n\n\n   \n",
            "NUL bytes in text": text.encode().replace(b" ", b"\x00", 5),
        }[how]
        bad = how in ("utf-16", "latin-1")
        p = Prep(d, f"text file: {how}", bad)
        p.file("doc.txt", data)
        if how == "only blank lines":
            p.good(rng)
        return p

    @kind
    def long_record(rng, d):
        fmt = _nth(long_record, ["jsonl.gz", "jsonl", "txt"])
        mb = 20
        text = ("abcdefghij" * (mb * 100_000))[: mb * 1_000_000]
        p = Prep(d, f"one {mb} MB record as .{fmt} (char, address space +1 GiB)", False)
        if fmt == "txt":
            p.file("long.txt", text.encode())
        else:
            line = json.dumps({"text": text}).encode() + b"\n"
            p.file(f"long.{fmt}", gzip.compress(line, compresslevel=1) if fmt.endswith("gz") else line)
        p.timeout, p.mem_gb, p.slow_s = 180.0, 1.0, 120.0
        return p

    return K


#: how many times a kind comes in one cycle (bad records, tokenizers and flags have many variants)
WEIGHT = {"bad_record": 5, "tokenizer_mismatch": 2, "bad_flag": 2}
#: kinds tried at most this many times in all (expensive)
LIMITED = {"long_record": 3}


def _loss(p: Prep, out: Path) -> str:
    """A finding of data loss or of a path leaving the folder, from an accepted run's ``meta.json``."""
    meta_path = out / "meta.json"
    if not meta_path.is_file():
        return ""
    try:
        meta = json.loads(meta_path.read_text())
    except ValueError:
        return "meta.json unreadable after success"
    for s in meta.get("sources", []) + meta.get("val_sources", []):
        if s.get("bytes", 0) > 0 and s.get("tokens", 1) == 0 and Path(s.get("path", "")).name != "frames.jsonl.zst":
            return f"0 tokens recorded for {Path(s['path']).name} ({s['bytes']} bytes)"
    return ""


def run_prepare(n: int, rng: random.Random, tmp: Path, timeout: float, emit) -> None:
    kinds = prepare_kinds()
    names = [name for name in kinds for _ in range(WEIGHT.get(name, 1))]
    used: dict[str, int] = {}
    i = 0
    k = 0
    while i < n:
        name = names[k % len(names)]
        k += 1
        if used.get(name, 0) >= LIMITED.get(name, 10**9):
            continue
        used[name] = used.get(name, 0) + 1
        d = tmp / f"prep-{i}"
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
        p = kinds[name](random.Random(rng.random()), d)
        if getattr(p, "pre", None):  # a tokenizer of other text, prepared first (in this process)
            sub, text = p.pre
            (d / f"{sub}.txt").write_text(text)
            from modkit.data.prepare import prepare

            prepare([d / f"{sub}.txt"], d / sub, tokenizer="char", show_progress=False)
        out = d / "out"
        argv = ["data", "prepare", *p.inputs, "-o", str(out), *p.flags]
        if "-o" in p.flags:
            argv = ["data", "prepare", *p.inputs, *p.flags]
        child = core.fork_call(core.cli_child(argv), timeout=max(timeout, p.timeout), mem_gb=p.mem_gb, workdir=d)
        harm = _loss(p, out) if child.rc == 0 else ""
        outcome, error = core.classify(child, bad=p.bad, hints=p.hints, harm=harm, slow_s=p.slow_s)
        emit(Record("prepare", f"{name}: {p.label}", p.bad, outcome, error, round(child.seconds, 3)))
        shutil.rmtree(d, ignore_errors=True)
        i += 1

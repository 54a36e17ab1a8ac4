#!/usr/bin/env python
"""Bad-input fuzzing of modkit's front door: counts of inputs tried per surface and what became of them.

Surfaces (each input runs in this process, under a wall-clock alarm, with the address space capped so that an
attempt to allocate terabytes fails instead of taking the machine down):

* ``spec``: mutations of the shipped specs (``specs/*.json``), written to a file and read with ``load_spec``;
  an accepted spec is then built on ``meta`` (timed);
* ``hf``: mutations of the real Hugging Face configs (``tests/data/real-models/*/config.json``) through
  ``from_hf_config``;
* ``checkpoint``: damaged modkit checkpoints and Hugging Face folders through ``load`` / ``from_hf``;
* ``cli``: bad command lines through ``modkit.cli.main``;
* ``generate``: bad arguments to ``modkit.inference.generate``.

Each mutation that makes the input wrong by construction (a bool or a string where a number belongs, a
non-finite float, a size beyond the documented bound, a duplicate key, an empty layer selection, undecodable
bytes...) is labelled *bad*; a bad input that is accepted counts as ``accepted-bad``. Other outcomes:
``named`` (an error of :mod:`modkit.core.errors`, or a ``ValueError`` raised by modkit's own code; for specs the
SpecError names a path, ``named-root`` when it names only the document), ``raw`` (any other exception: a
Python or torch error escaping, or the CLI's "internal error"), ``hang`` (the alarm fired), ``slow`` (an
accepted spec that takes over 1 s to build on meta).

Usage::

    .venv/bin/python benchmarks/fuzz_inputs.py                      # every surface, default counts, summary table
    .venv/bin/python benchmarks/fuzz_inputs.py --surface spec --n-spec 10000 --json out.json
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import io
import json
import math
import os
import random
import resource
import signal
import sys
import tempfile
import time
import traceback
import warnings
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SPECS = sorted((REPO / "specs").glob("*.json"))
CONFIGS = sorted((REPO / "tests" / "data" / "real-models").glob("*/config.json"))


class Timeout(BaseException):
    """Raised by the alarm; a BaseException so that no ``except Exception`` in the code under test eats it."""


def _alarm(signum, frame):
    raise Timeout()


@contextlib.contextmanager
def deadline(seconds: float):
    signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)


def _ours(exc: BaseException) -> bool:
    """An error modkit raised on purpose: a ModkitError, or a ValueError whose raising frame is modkit's code."""
    from modkit.core.errors import ModkitError

    if isinstance(exc, ModkitError):
        return True
    if type(exc) is ValueError or (isinstance(exc, ValueError) and type(exc).__module__.startswith("modkit")):
        frames = traceback.extract_tb(exc.__traceback__)
        return bool(frames) and any(part in frames[-1].filename for part in ("/modkit/", "/plugins/"))
    return False


# ------------------------------------------------------------------------------------------------ mutations

#: sizes (ints) beyond which a value is wrong by construction: the documented bounds, with a margin
SIZE_KEYS = {
    "vocab_size": 2**31,
    "d_model": 2**20,
    "n_layers": 10**5,
    "max_seq_len": 2**31,
    "n_heads": 2**20,
    "n_kv_heads": 2**20,
    "head_dim": 2**20,
    "d_ff": 2**31,
    "n_experts": 2**20,
    "top_k": 2**20,
    "sliding_window": 2**31,
    "original_max_seq_len": 2**31,
    # Hugging Face names
    "hidden_size": 2**20,
    "num_hidden_layers": 10**5,
    "num_attention_heads": 2**20,
    "num_key_value_heads": 2**20,
    "intermediate_size": 2**31,
    "max_position_embeddings": 2**31,
    "num_local_experts": 2**20,
    "num_experts_per_tok": 2**20,
    "n_embd": 2**20,
    "n_layer": 10**5,
    "n_head": 2**20,
    "n_positions": 2**31,
    "n_inner": 2**31,
    "moe_intermediate_size": 2**31,
    "num_experts": 2**20,
}
HUGE = [10**5, 10**8, 2**31, 2**40, 2**63 - 1, 2**63, 2**64, 10**30]


def _nodes(doc, path=()):
    """Every (path, value) in a JSON document, containers included."""
    yield path, doc
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield from _nodes(v, path + (k,))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield from _nodes(v, path + (i,))


def _set(doc, path, value):
    node = doc
    for p in path[:-1]:
        node = node[p]
    node[path[-1]] = value


def _delete(doc, path):
    node = doc
    for p in path[:-1]:
        node = node[p]
    del node[path[-1]]


def _dumps(doc) -> str:
    return json.dumps(doc, indent=1)


def mutate(doc: dict, rng: random.Random, *, free: set[str], read: "callable") -> tuple[str, bytes, bool]:
    """One mutation of ``doc``: ``(description, file bytes, bad by construction)``.

    ``free``: keys whose subtree holds free-form values (never labelled bad); ``read(path)``: whether the key at
    ``path`` is one the reader interprets (bad labels only apply there).
    """
    doc = copy.deepcopy(doc)
    nodes = [(p, v) for p, v in _nodes(doc) if p and not (set(map(str, p)) & free)]
    path, value = rng.choice(nodes)
    key = next((str(p) for p in reversed(path) if isinstance(p, str)), "")
    interpreted = read(path) and key not in ("embedding_scale",)  # a number or a keyword: both kinds are valid
    op = rng.choice(
        ["type", "type", "nonfinite", "huge", "small", "struct", "delete", "unknown", "dup", "text", "layers"]
    )
    where = ".".join(map(str, path))
    if op == "type":
        if isinstance(value, bool):
            new = rng.choice(["yes", "true", 1, 0, "false"])
        elif isinstance(value, int):
            new = rng.choice([True, False, str(value), float(value) + 0.5, 1e12, "1e3", float(value)])
        elif isinstance(value, float):
            new = rng.choice([True, False, str(value), "1e-5", [value], {"v": value}])
        elif isinstance(value, str):
            new = rng.choice([1, True, 3.5, {"type": value}, [value]])
        else:
            new = rng.choice([True, "x", 7])
        # an int turned into a float is wrong only where an integer is required (a size); 1e4 is a fine theta
        bad = interpreted and not (
            isinstance(value, int) and not isinstance(value, bool) and isinstance(new, float) and key not in SIZE_KEYS
        )
        if isinstance(value, (dict, list)):
            bad = interpreted
        if value is None:
            bad = interpreted and new != 7  # a null (absent) option given a plausible value may be fine
        _set(doc, path, new)
        return f"type {where}: {value!r:.40} -> {new!r:.40}", _dumps(doc).encode(), bad
    if op == "nonfinite":
        new = rng.choice([math.nan, math.inf, -math.inf])
        _set(doc, path, new)
        return f"nonfinite {where} = {new}", _dumps(doc).encode(), interpreted
    if op == "huge":
        new = rng.choice(HUGE)
        _set(doc, path, new)
        bad = interpreted and (
            key in SIZE_KEYS and new > SIZE_KEYS[key] or not isinstance(value, (int, float)) or isinstance(value, bool)
        )
        return f"huge {where} = {new}", _dumps(doc).encode(), bad
    if op == "small":
        new = rng.choice([0, -1, -(2**63), 0.0, -1e-5])
        _set(doc, path, new)
        bad = interpreted and (key in SIZE_KEYS or isinstance(value, (bool, str, dict, list)))
        return f"small {where} = {new}", _dumps(doc).encode(), bad
    if op == "struct":
        new = rng.choice([[], {}, None, [[[]]]])
        _set(doc, path, new)
        bad = interpreted and new is not None and not isinstance(value, type(new)) and not (value is None and not new)
        return f"struct {where} = {new!r}", _dumps(doc).encode(), bad
    if op == "delete":
        _delete(doc, path)
        return f"delete {where}", _dumps(doc).encode(), False
    if op == "unknown":
        parents = [(p, v) for p, v in _nodes(doc) if isinstance(v, dict) and not (set(map(str, p)) & free)]
        p, v = rng.choice(parents)
        v["n_layer_typo"] = 3
        return (
            f"unknown key under {'.'.join(map(str, p)) or '<root>'}",
            _dumps(doc).encode(),
            read(p + ("n_layer_typo",)) or not p,
        )
    if op == "dup":
        parents = [(p, v) for p, v in _nodes(doc) if isinstance(v, dict) and v and not (set(map(str, p)) & free)]
        p, v = rng.choice(parents)
        k = rng.choice(list(v))
        marker = "__DUP__"
        v[marker] = 0
        text = _dumps(doc).replace(
            f'"{marker}": 0', f'"{k}": {json.dumps(v[k])}' if rng.random() < 0.5 else f'"{k}": 1'
        )
        return f"duplicate key {k!r} under {'.'.join(map(str, p)) or '<root>'}", text.encode(), True
    if op == "text":
        kind = rng.choice(["utf16", "binary", "deep", "digits", "truncated", "empty", "bom", "latin1"])
        text = _dumps(doc)
        if kind == "utf16":
            return "text: UTF-16", text.encode("utf-16"), True
        if kind == "binary":
            return "text: binary", bytes(rng.randrange(256) for _ in range(256)), True
        if kind == "deep":
            depth = rng.choice([1000, 100_000])
            _set(doc, path, "__DEEP__")
            return (
                f"text: nested {depth} deep at {where}",
                _dumps(doc).replace('"__DEEP__"', "[" * depth + "]" * depth).encode(),
                interpreted or depth > 1000,
            )
        if kind == "digits":
            _set(doc, path, "__BIG__")
            return f"text: 5000-digit integer at {where}", _dumps(doc).replace('"__BIG__"', "9" * 5000).encode(), True
        if kind == "truncated":
            return "text: truncated", text[: rng.randrange(1, len(text))].encode(), True
        if kind == "empty":
            return "text: empty", b"", True
        if kind == "bom":
            return "text: UTF-8 BOM", b"\xef\xbb\xbf" + text.encode(), False
        return "text: latin-1 byte in a string", text.replace('"', '"\xe9', 1).encode("latin-1", "replace"), True
    # layers
    layers = [(p, v) for p, v in _nodes(doc) if p and p[-1] == "layers"]
    if not layers:
        return mutate(doc, rng, free=free, read=read)
    p, _ = rng.choice(layers)
    new = rng.choice([[], {"start": 3, "stop": 1}, {"start": 2, "stop": 2}, [True], [1.0], {"step": 0}])
    _set(doc, p, new)
    return f"layers {'.'.join(map(str, p))} = {new!r}", _dumps(doc).encode(), True


# ------------------------------------------------------------------------------------------------ surfaces


def _classify_spec_error(exc) -> str:
    paths = [p for p, _ in exc.errors]
    return "named" if paths and all(paths) else "named-root"


def run_specs(n: int, rng: random.Random, tmp: Path, timeout: float, log) -> Counter:
    import modkit
    from modkit.core.errors import SpecError

    docs = [(p.name, json.loads(p.read_text())) for p in SPECS]
    out: Counter = Counter()
    for i in range(n):
        name, doc = docs[i % len(docs)]
        desc, data, bad = mutate(doc, rng, free={"metadata", "name", "description", "$schema"}, read=lambda p: True)
        f = tmp / f"spec-{i}.json"
        f.write_bytes(data)
        outcome = None
        try:
            with deadline(timeout):
                spec = modkit.load_spec(f)
                start = time.perf_counter()
                modkit.build(spec, device="meta")
                took = time.perf_counter() - start
            outcome = "accepted-bad" if bad else ("slow" if took > 1.0 else "accepted")
        except Timeout:
            outcome = "hang"
        except SpecError as exc:
            outcome = _classify_spec_error(exc)
        except BaseException as exc:  # noqa: BLE001
            if isinstance(exc, KeyboardInterrupt):
                raise
            outcome = "named-root" if _ours(exc) else "raw"
            if outcome == "raw":
                log(f"spec raw {type(exc).__name__}: {str(exc)[:120]!r} <- {name}: {desc}")
        if outcome in ("accepted-bad", "hang", "slow"):
            log(f"spec {outcome} <- {name}: {desc}")
        out[outcome] += 1
        f.unlink()
    return out


_CONSUMED: dict[str, set[str]] = {}


def _consumed_keys(name: str, doc: dict) -> set[str]:
    """The top-level keys the converter of ``doc`` interprets (read and not declared irrelevant)."""
    if name not in _CONSUMED:
        from modkit_plugins.hf import _common

        seen: list = []
        original = _common.HFConfig.finish

        def finish(self, spec):
            seen.append(self.used - self.ignored)
            return original(self, spec)

        _common.HFConfig.finish = finish
        try:
            import modkit

            modkit.from_hf_config(copy.deepcopy(doc))
        finally:
            _common.HFConfig.finish = original
        _CONSUMED[name] = set().union(*seen)
    return _CONSUMED[name]


def run_hf(n: int, rng: random.Random, tmp: Path, timeout: float, log) -> Counter:
    import modkit
    from modkit.core.errors import SpecError

    docs = [(p.parent.name, json.loads(p.read_text())) for p in CONFIGS]
    out: Counter = Counter()
    for i in range(n):
        name, doc = docs[i % len(docs)]
        used = _consumed_keys(name, doc)
        desc, data, bad = mutate(doc, rng, free=set(), read=lambda p, used=used: bool(p) and str(p[0]) in used)
        f = tmp / f"config-{i}.json"
        f.write_bytes(data)
        try:
            mutated = {**doc, **json.loads(data, parse_int=str)}
        except Exception:  # noqa: BLE001
            mutated = doc
        try:
            with deadline(timeout):
                modkit.from_hf_config(f)
            outcome = "accepted-bad" if bad else "accepted"
        except Timeout:
            outcome = "hang"
        except SpecError as exc:
            keys = [p.split(".")[0].split("[")[0] for p, _ in exc.errors]
            if all(not k for k in keys):
                outcome = "named-root"
            elif isinstance(mutated, dict) and all(k in mutated or not k for k in keys):
                outcome = "named"
            else:
                outcome = "named-spec-path"
                log(f"hf spec-path {exc.errors[:2]} <- {name}: {desc}")
        except BaseException as exc:  # noqa: BLE001
            if isinstance(exc, KeyboardInterrupt):
                raise
            outcome = "named-root" if _ours(exc) else "raw"
            if outcome == "raw":
                log(f"hf raw {type(exc).__name__}: {str(exc)[:120]!r} <- {name}: {desc}")
        if outcome in ("accepted-bad", "hang"):
            log(f"hf {outcome} <- {name}: {desc}")
        out[outcome] += 1
        f.unlink()
    return out


# ---------------------------------------------------------------------------------------------- checkpoints


def _tiny_model(seed=0):
    import modkit

    return modkit.build(json.loads((REPO / "specs" / "tiny-llama.json").read_text()), seed=seed).eval()


def _rewrite_weights(folder: Path, change=None, metadata=None):
    """Rewrite ``folder/model.safetensors`` with tensors changed by ``change(dict)`` and/or new metadata."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    f = folder / "model.safetensors"
    with safe_open(str(f), "pt") as h:
        tensors = {k: h.get_tensor(k) for k in h.keys()}
        meta = dict(h.metadata())
    if change:
        change(tensors)
    if metadata is not None:
        meta.update(metadata)
    save_file(tensors, str(f), metadata=meta)


def checkpoint_cases(tmp: Path):
    """``(name, make() -> (callable loading it), bad)`` for damaged checkpoints."""
    import torch

    import modkit

    base = tmp / "ckpt-base"
    modkit.save(_tiny_model(), base)
    hf_base = tmp / "hf-base"
    llama = modkit.from_hf_config(REPO / "tests" / "data" / "real-models" / "llama-3.2-1b" / "config.json")
    small = llama.to_dict()
    small.update(vocab_size=256, d_model=64, n_layers=2, max_seq_len=128)
    small["block"]["attention"].update(n_heads=4, n_kv_heads=2)
    small["block"]["attention"].pop("head_dim", None)
    small["block"]["ffn"]["d_ff"] = 96
    modkit.to_hf(modkit.build(small), hf_base)
    cases = []

    def copy_of(src: Path, name: str) -> Path:
        import shutil

        dst = tmp / name
        if dst.exists():
            shutil.rmtree(dst)
        shutil.copytree(src, dst)
        return dst

    def load(folder):
        return lambda: modkit.load(folder)

    def from_hf(folder):
        return lambda: modkit.from_hf(folder)

    size = (base / "model.safetensors").stat().st_size
    for k, cut in enumerate([0, 4, 8, 9, 50, 200, size // 3, size // 2, size - 100, size - 1]):

        def make(cut=cut, k=k):
            d = copy_of(base, f"trunc-{k}")
            data = (d / "model.safetensors").read_bytes()[:cut]
            (d / "model.safetensors").write_bytes(data)
            return load(d)

        cases.append((f"weights truncated at {cut}", make, True))
    for name, header in [
        ("header length 2**60", (2**60).to_bytes(8, "little") + b"{}"),
        ("header not JSON", (5).to_bytes(8, "little") + b"{{{{{"),
        ("header a list", (2).to_bytes(8, "little") + b"[]"),
        ("header UTF-16", (len("{}".encode("utf-16"))).to_bytes(8, "little") + "{}".encode("utf-16")),
        ("header wrong offsets", None),
    ]:

        def make(header=header, name=name):
            d = copy_of(base, "hdr-" + name.replace(" ", "-").replace("*", ""))
            f = d / "model.safetensors"
            if header is None:
                data = bytearray(f.read_bytes())
                n = int.from_bytes(data[:8], "little")
                h = json.loads(data[8 : 8 + n])
                first = next(k for k in h if k != "__metadata__")
                h[first]["data_offsets"] = [0, 10**12]
                hb = json.dumps(h).encode()
                data = len(hb).to_bytes(8, "little") + hb + data[8 + n :]
                f.write_bytes(bytes(data))
            else:
                f.write_bytes(header)
            return load(d)

        cases.append((name, make, True))
    spec_text = json.loads((base / "spec.json").read_text())
    metas = {
        "spec metadata not JSON": "{not json",
        "spec metadata a list": "[1, 2]",
        "spec metadata a number": "3",
        "spec metadata null": "null",
        "spec metadata empty": "",
        "spec metadata NaN eps": json.dumps(spec_text).replace("1e-05", "NaN"),
        "spec metadata duplicate key": json.dumps(spec_text)[:-1] + ', "d_model": 64}',
        "spec metadata nested deep": "[" * 100_000 + "]" * 100_000,
        "spec metadata 5000 digits": json.dumps(spec_text).replace('"d_model": 128', '"d_model": ' + "9" * 5000),
        "hf_config metadata not JSON": None,
        "hf_config metadata a list": None,
        "format version 99": None,
    }
    for name, value in metas.items():

        def make(name=name, value=value):
            d = copy_of(base, "meta-" + str(abs(hash(name))))
            if name.startswith("hf_config"):
                meta = {"modkit.hf_config": "{oops" if "not JSON" in name else "[1]"}
            elif name.startswith("format"):
                meta = {"modkit.format": "99"}
            else:
                meta = {"modkit.spec": value}
            _rewrite_weights(d, metadata=meta)
            (d / "spec.json").unlink()
            return load(d)

        cases.append((name, make, name != "format version 99"))
    for name, content in [
        ("spec.json binary", bytes(range(256))),
        ("spec.json UTF-16", json.dumps(spec_text).encode("utf-16")),
        ("spec.json empty", b""),
        ("spec.json a list", b"[]"),
        ("spec.json differs", json.dumps({**spec_text, "d_model": 64}).encode()),
        ("spec.json duplicate key", (json.dumps(spec_text)[:-1] + ', "n_layers": 4}').encode()),
    ]:

        def make(content=content, name=name):
            d = copy_of(base, "sj-" + str(abs(hash(name))))
            (d / "spec.json").write_bytes(content)
            return load(d)

        cases.append((name, make, True))

    def special_spec(kind):
        def make():
            d = copy_of(base, "special-" + kind)
            (d / "spec.json").unlink()
            if kind == "fifo":
                os.mkfifo(d / "spec.json")
            elif kind == "devzero":
                os.symlink("/dev/zero", d / "spec.json")
            else:
                (d / "spec.json").mkdir()
            return load(d)

        return make

    for kind in ("fifo", "devzero", "dir"):
        cases.append((f"spec.json is a {kind}", special_spec(kind), True))

    def tensor_case(name, change, bad=True):
        def make():
            d = copy_of(base, "t-" + str(abs(hash(name))))
            _rewrite_weights(d, change=change)
            return load(d)

        cases.append((name, make, bad))

    first = "layers.0.attention.q_proj.weight"
    tensor_case("int32 weight", lambda t: t.__setitem__(first, t[first].to(torch.int32)))
    tensor_case("int64 weight", lambda t: t.__setitem__(first, t[first].to(torch.int64)))
    tensor_case("uint8 weight", lambda t: t.__setitem__(first, t[first].to(torch.uint8)))
    tensor_case("bool weight", lambda t: t.__setitem__(first, t[first] > 0))
    tensor_case("float8 e4m3 weight", lambda t: t.__setitem__(first, t[first].to(torch.float8_e4m3fn)))
    tensor_case("float8 e5m2 weight", lambda t: t.__setitem__(first, t[first].to(torch.float8_e5m2)))
    tensor_case("all weights float8", lambda t: t.update({k: v.to(torch.float8_e4m3fn) for k, v in t.items()}))
    tensor_case("NaN weights", lambda t: t[first].view(-1)[:5].fill_(float("nan")), bad=False)
    tensor_case("inf weights", lambda t: t[first].view(-1)[:5].fill_(float("inf")), bad=False)
    tensor_case("missing tensor", lambda t: t.pop(first))
    tensor_case("extra tensor", lambda t: t.__setitem__("extra.weight", torch.zeros(3)))
    tensor_case("wrong shape", lambda t: t.__setitem__(first, torch.zeros(3, 3)))
    tensor_case("0-dim tensor", lambda t: t.__setitem__(first, torch.tensor(1.0)))
    tensor_case("float64 weights", lambda t: t.update({k: v.double() for k, v in t.items()}), bad=False)
    tensor_case("mixed f16/f32", lambda t: t.__setitem__(first, t[first].half()), bad=False)

    def path_case(name, path_fn, bad=True):
        cases.append((name, lambda: lambda: modkit.load(path_fn()), bad))

    path_case("path with NUL byte", lambda: str(base) + "\x00x")
    path_case("nonexistent path", lambda: tmp / "nope")
    path_case("/dev/zero as checkpoint", lambda: "/dev/zero")
    path_case("a .pt file", lambda: (tmp / "x.pt").write_bytes(b"x") and tmp / "x.pt")
    path_case("a directory without weights", lambda: (tmp / "emptydir").mkdir(exist_ok=True) or tmp / "emptydir")

    def fifo_weights():
        d = copy_of(base, "fifo-weights")
        (d / "model.safetensors").unlink()
        os.mkfifo(d / "model.safetensors")
        return load(d)

    cases.append(("model.safetensors is a FIFO", fifo_weights, True))

    hf_cfg = json.loads((hf_base / "config.json").read_text())
    for name, content in [
        ("config.json a list", b"[]"),
        ("config.json null", b"null"),
        ("config.json a string", b'"llama"'),
        ("config.json binary", bytes(range(256)) * 3),
        ("config.json UTF-16", json.dumps(hf_cfg).encode("utf-16")),
        ("config.json model_type a dict", json.dumps({**hf_cfg, "model_type": {"a": 1}}).encode()),
        ("config.json model_type a list", json.dumps({**hf_cfg, "model_type": ["llama"]}).encode()),
        ("config.json model_type unknown", json.dumps({**hf_cfg, "model_type": "nope"}).encode()),
        (
            "config.json rope_scaling.factor []",
            json.dumps({**hf_cfg, "rope_scaling": {"rope_type": "linear", "factor": []}}).encode(),
        ),
        (
            "config.json rope_scaling llama3 factor {}",
            json.dumps(
                {
                    **hf_cfg,
                    "rope_scaling": {"rope_type": "llama3", "factor": {}, "low_freq_factor": 1, "high_freq_factor": 4},
                }
            ).encode(),
        ),
        ("config.json rms_norm_eps NaN", json.dumps({**hf_cfg, "rms_norm_eps": math.nan}).encode()),
        ("config.json rms_norm_eps true", json.dumps({**hf_cfg, "rms_norm_eps": True}).encode()),
        ("config.json vocab 2**63", json.dumps({**hf_cfg, "vocab_size": 2**63}).encode()),
        ("config.json duplicate key", (json.dumps(hf_cfg)[:-1] + ', "hidden_size": 32}').encode()),
        ("config.json nested deep", b"[" * 100_000 + b"]" * 100_000),
    ]:

        def make(content=content, name=name):
            d = copy_of(hf_base, "hf-" + str(abs(hash(name))))
            (d / "config.json").write_bytes(content)
            return from_hf(d)

        cases.append((name, make, True))

    index_base = {"metadata": {"total_size": 1}, "weight_map": {}}
    from safetensors import safe_open

    with safe_open(str(hf_base / "model.safetensors"), "pt") as h:
        names = list(h.keys())
    for name, wm in [
        ("index weight_map values ints", {n: 1 for n in names}),
        ("index weight_map values lists", {n: ["model.safetensors"] for n in names}),
        ("index weight_map values null", {n: None for n in names}),
        ("index weight_map a list", names),
        ("index weight_map points outside the folder", {n: "../../../etc/passwd" for n in names}),
        ("index weight_map names a missing shard", {n: "model-00001-of-00009.safetensors" for n in names}),
        ("index weight_map names a .bin", {n: "pytorch_model.bin" for n in names}),
        ("index weight_map empty", {}),
    ]:

        def make(wm=wm, name=name):
            d = copy_of(hf_base, "idx-" + str(abs(hash(name))))
            (d / "model.safetensors.index.json").write_text(json.dumps({**index_base, "weight_map": wm}))
            return from_hf(d)

        cases.append((name, make, True))
    for name, content in [
        ("index not JSON", b"{"),
        ("index a list", b"[]"),
        ("index binary", bytes(range(256))),
        (
            "index metadata a list",
            json.dumps({"metadata": [1], "weight_map": {n: "model.safetensors" for n in names}}).encode(),
        ),
    ]:

        def make(content=content, name=name):
            d = copy_of(hf_base, "idx2-" + str(abs(hash(name))))
            (d / "model.safetensors.index.json").write_bytes(content)
            return from_hf(d)

        cases.append((name, make, True))

    def hf_tensor(name, change, bad=True):
        def make():
            d = copy_of(hf_base, "hft-" + str(abs(hash(name))))
            _rewrite_weights(d, change=change)
            return from_hf(d)

        cases.append(("HF " + name, make, bad))

    hfirst = "model.layers.0.self_attn.q_proj.weight"
    hf_tensor("int32 weight", lambda t: t.__setitem__(hfirst, t[hfirst].to(torch.int32)))
    hf_tensor("float8 weight", lambda t: t.__setitem__(hfirst, t[hfirst].to(torch.float8_e4m3fn)))
    hf_tensor("bool weight", lambda t: t.__setitem__(hfirst, t[hfirst] > 0))
    hf_tensor("NaN weight", lambda t: t[hfirst].view(-1)[:3].fill_(float("nan")), bad=False)
    hf_tensor("missing tensor", lambda t: t.pop(hfirst))
    hf_tensor("wrong shape", lambda t: t.__setitem__(hfirst, torch.zeros(2, 2)))
    return cases


def run_checkpoints(rng: random.Random, tmp: Path, timeout: float, log) -> Counter:
    out: Counter = Counter()
    for name, make, bad in checkpoint_cases(tmp):
        try:
            with deadline(timeout):
                fn = make()
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    fn()
            outcome = "accepted-bad" if bad else "accepted"
        except Timeout:
            outcome = "hang"
        except BaseException as exc:  # noqa: BLE001
            if isinstance(exc, KeyboardInterrupt):
                raise
            outcome = "named" if _ours(exc) else "raw"
            if outcome == "raw":
                log(f"checkpoint raw {type(exc).__name__}: {str(exc)[:120]!r} <- {name}")
        if outcome in ("accepted-bad", "hang"):
            log(f"checkpoint {outcome} <- {name}")
        out[outcome] += 1
    return out


# ------------------------------------------------------------------------------------------------ CLI


def cli_cases(tmp: Path) -> list[tuple[str, list[str], bool]]:
    """``(name, argv, bad)``."""
    import modkit

    good = str(REPO / "specs" / "tiny-llama.json")
    gpt2 = str(REPO / "specs" / "tiny-gpt2.json")
    files = {}
    spec = json.loads(Path(good).read_text())

    def put(name, data: bytes) -> str:
        f = tmp / name
        f.write_bytes(data)
        return str(f)

    files["binary"] = put("binary.json", bytes(range(256)) * 4)
    files["utf16"] = put("utf16.json", json.dumps(spec).encode("utf-16"))
    files["dup"] = put("dup.json", (json.dumps(spec)[:-1] + ', "d_model": 64}').encode())
    files["deep"] = put("deep.json", b"[" * 100_000 + b"]" * 100_000)
    files["digits"] = put(
        "digits.json", json.dumps(spec).replace('"d_model": 128', '"d_model": ' + "9" * 5000).encode()
    )
    files["layers"] = put("layers.json", json.dumps({**spec, "n_layers": 100000}).encode())
    files["vocab"] = put("vocab.json", json.dumps({**spec, "vocab_size": 2**63}).encode())
    files["nan"] = put("nan.json", json.dumps({**spec, "final_norm": {"type": "rmsnorm", "eps": math.nan}}).encode())
    files["true"] = put("true.json", json.dumps({**spec, "n_layers": True}).encode())
    files["list"] = put("list.json", b"[]")
    files["huge_model"] = put(
        "huge.json",
        json.dumps(
            {
                **spec,
                "d_model": 16384,
                "vocab_size": 2**20,
                "block": {**spec["block"], "ffn": {"type": "swiglu", "d_ff": 65536}},
                "n_layers": 64,
            }
        ).encode(),
    )
    fifo = tmp / "fifo.json"
    if not fifo.exists():
        os.mkfifo(fifo)
    files["fifo"] = str(fifo)
    files["devzero"] = "/dev/zero"
    files["nul"] = good + "\x00.json"
    files["missing"] = str(tmp / "missing.json")
    files["dir"] = str(tmp)
    ckpt = tmp / "cli-ckpt"
    modkit.save(_tiny_model(), ckpt)
    hfcfg = tmp / "cli-hf"
    hfcfg.mkdir(exist_ok=True)
    base_cfg = json.loads((REPO / "tests" / "data" / "real-models" / "llama-3.2-1b" / "config.json").read_text())
    hf_files = {
        "hf-list": b"[]",
        "hf-null": b"null",
        "hf-binary": bytes(range(256)),
        "hf-utf16": json.dumps(base_cfg).encode("utf-16"),
        "hf-layers": json.dumps({**base_cfg, "num_hidden_layers": 10**8}).encode(),
        "hf-eps-nan": json.dumps({**base_cfg, "rms_norm_eps": math.nan}).encode(),
        "hf-factor-list": json.dumps({**base_cfg, "rope_scaling": {**base_cfg["rope_scaling"], "factor": []}}).encode(),
        "hf-model-type-dict": json.dumps({**base_cfg, "model_type": {"x": 1}}).encode(),
        "hf-vocab-2**63": json.dumps({**base_cfg, "vocab_size": 2**63}).encode(),
        "hf-dup": (json.dumps(base_cfg)[:-1] + ', "hidden_size": 64}').encode(),
    }
    cases: list[tuple[str, list[str], bool]] = []
    for key, f in files.items():
        bad = key != "huge_model"  # a valid spec, too big for this machine: fine on meta, refused on cpu
        cases.append((f"validate {key}", ["validate", f], bad))
        cases.append((f"validate {key} then good", ["validate", f, good], bad))
        cases.append((f"build {key}", ["build", f, "--device", "meta"], bad))
    for key, data in hf_files.items():
        f = put(key + ".json", data)
        cases.append((f"convert hf {key}", ["convert", "hf", f], True))
    cases.append(("build huge model on cpu", ["build", files["huge_model"], "--device", "cpu"], True))
    for flag, values in {
        "--device": ["bogus", "cuda:99", "", "cpu:0:1"],
        "--dtype": ["int32", "bogus", "float8_e4m3fn", "bool", ""],
        "--seed": ["-1", str(2**64), "1.5", "nan"],
    }.items():
        for v in values:
            cases.append((f"build {flag} {v!r}", ["build", good, flag, v], True))
    gen = ["generate", good, "--prompt", "1 2 3"]
    for flag, values in {
        "--max-new-tokens": ["0", "-1", "1000000000000", str(2**63), "1.5", "nan"],
        "--temperature": ["nan", "-1", "inf", "-inf", "1e309", "x"],
        "--top-k": ["0", "-1", str(2**63), "1.5"],
        "--top-p": ["0", "-0.5", "1.5", "nan", "inf"],
        "--seed": ["-1", str(2**64), str(2**70), "1.5"],
        "--device": ["meta", "bogus"],
        "--dtype": ["int64", "bogus"],
        "--prompt": ["", "1.5 2", "-1", "99999999999999999999999", "1024", "abc", "1," * 600],
        "--tokenizer": [files["binary"], files["missing"], files["fifo"], "/dev/zero"],
    }.items():
        for v in values:
            argv = [a for a in gen]
            if flag == "--prompt":
                argv[3] = v
            else:
                argv += [flag, v]
            cases.append(
                (f"generate {flag} {v!r:.30}", argv, not (flag == "--top-k" and v == str(2**63)))
            )  # keeps all tokens
    cases.append(
        ("generate past max_seq_len (learned)", ["generate", gpt2, "--prompt", "1 2", "--max-new-tokens", "300"], True)
    )
    cases.append(
        ("generate past max_seq_len (rope)", ["generate", good, "--prompt", "1 2", "--max-new-tokens", "600"], True)
    )
    for key in ("binary", "utf16", "fifo", "devzero", "nul", "dup", "layers"):
        cases.append((f"generate model {key}", ["generate", files[key], "--prompt", "1 2"], True))
    cases.append(
        (
            "convert modkit bad shard size",
            ["convert", "modkit", str(ckpt), "--to", "hf", "-o", str(tmp / "o"), "--max-shard-size", "nan"],
            True,
        )
    )
    return cases


def run_cli(tmp: Path, timeout: float, log) -> Counter:
    from modkit import cli

    out: Counter = Counter()
    for name, argv, bad in cli_cases(tmp):
        err, std = io.StringIO(), io.StringIO()
        try:
            with (
                deadline(timeout),
                contextlib.redirect_stderr(err),
                contextlib.redirect_stdout(std),
                warnings.catch_warnings(),
            ):
                warnings.simplefilter("ignore")
                code = cli.main(argv)
            text = err.getvalue()
            if "internal error" in text or "Traceback" in text:
                outcome = "raw"
                log(f"cli raw <- {name}: {text.strip().splitlines()[0][:160]!r}")
            elif code == 0:
                outcome = "accepted-bad" if bad else "accepted"
                log(f"cli {outcome} <- {name}")
            else:
                outcome = "named"
        except Timeout:
            outcome = "hang"
            log(f"cli hang <- {name}")
        except BaseException as exc:  # noqa: BLE001
            if isinstance(exc, KeyboardInterrupt):
                raise
            outcome = "raw"
            log(f"cli raw (escaped main) {type(exc).__name__}: {str(exc)[:100]!r} <- {name}")
        out[outcome] += 1
    return out


# ------------------------------------------------------------------------------------------------ generate


def generate_cases():
    import torch

    ok = dict(max_new_tokens=2)
    ids = [[1, 2, 3]]
    cases = []
    for k, values in {
        "temperature": [math.nan, math.inf, -1.0, "0.5", None, True],
        "max_new_tokens": [None, -1, 1.5, True, 10**12, 2**63, "3"],
        "seed": [-1, 2**64, 2**70, 1.5, "1", True],
        "top_k": [0, -1, 1.5, True, 2**63],
        "top_p": [0.0, 1.5, math.nan, -0.1, "0.9"],
        "eos_token_id": [-1, 2**70, "2", [1.5], 10**6],
        "prefill_chunk": [0, -1, 1.5],
    }.items():
        for v in values:
            kw = {**ok, k: v}
            cases.append((f"{k}={v!r:.20}", ids, kw, not (k == "top_k" and v == 2**63)))
    for name, x in [
        ("float ids", [[1.7, 2.2]]),
        ("empty", []),
        ("empty row", [[]]),
        ("2**63 id", [[2**63]]),
        ("negative id", [[-1]]),
        ("id = vocab", [[1024]]),
        ("ragged", [[1, 2], [3]]),
        ("3-D", [[[1, 2]]]),
        ("bool tensor", torch.tensor([[True, False]])),
        ("float tensor", torch.tensor([[1.0, 2.0]])),
        ("strings", [["a"]]),
        ("None", None),
    ]:
        cases.append((f"input_ids {name}", x, ok, True))
    for name, mask in [
        ("right padded", torch.tensor([[1, 1, 0]])),
        ("all zeros", torch.tensor([[0, 0, 0]])),
        ("wrong shape", torch.tensor([[1, 1]])),
        ("values 2", torch.tensor([[2, 1, 1]])),
        ("float 0.5", torch.tensor([[0.5, 1.0, 1.0]])),
        ("list", [[0, 1, 1]]),
    ]:
        cases.append((f"attention_mask {name}", ids, {**ok, "attention_mask": mask}, name != "list"))
    cases.append(("past max_seq_len (rope)", ids, {"max_new_tokens": 600}, True))
    cases.append(("past max_seq_len (learned)", ids, {"max_new_tokens": 300, "_model": "gpt2"}, True))
    return cases


def run_generate(timeout: float, log) -> Counter:
    import modkit
    from modkit.inference.generate import generate

    models = {
        "llama": modkit.build(json.loads((REPO / "specs" / "tiny-llama.json").read_text())).eval(),
        "gpt2": modkit.build(json.loads((REPO / "specs" / "tiny-gpt2.json").read_text())).eval(),
    }
    out: Counter = Counter()
    for name, ids, kw, bad in generate_cases():
        kw = dict(kw)
        model = models[kw.pop("_model", "llama")]
        try:
            with deadline(timeout):
                generate(model, ids, **kw)
            outcome = "accepted-bad" if bad else "accepted"
        except Timeout:
            outcome = "hang"
        except BaseException as exc:  # noqa: BLE001
            if isinstance(exc, KeyboardInterrupt):
                raise
            outcome = "named" if _ours(exc) else "raw"
            if outcome == "raw":
                log(f"generate raw {type(exc).__name__}: {str(exc)[:100]!r} <- {name}")
        if outcome in ("accepted-bad", "hang"):
            log(f"generate {outcome} <- {name}")
        out[outcome] += 1
    return out


# ------------------------------------------------------------------------------------------------ timing


def run_timing(timeout: float, log) -> dict:
    """Seconds: the slowest meta build of a shipped spec grown to 512 layers (a valid spec at the bound), a spec
    with ``n_layers: 100000`` (load + meta build, or the refusal), a config with ``num_hidden_layers: 10**8``."""
    import modkit

    out: dict = {}

    def timed(fn, limit):
        start = time.perf_counter()
        try:
            with deadline(limit):
                fn()
            what = "accepted"
        except Timeout:
            what = "hang"
        except BaseException as exc:  # noqa: BLE001
            if isinstance(exc, KeyboardInterrupt):
                raise
            what = type(exc).__name__
        return round(time.perf_counter() - start, 3), what

    worst = 0.0
    for f in SPECS:
        doc = json.loads(f.read_text())
        doc["n_layers"] = 512
        spec = modkit.load_spec(doc)
        modkit.build(spec, device="meta")  # warm
        start = time.perf_counter()
        modkit.build(spec, device="meta")
        worst = max(worst, time.perf_counter() - start)
    out["meta_build_512_layers_worst_s"] = round(worst, 3)
    doc = json.loads((REPO / "specs" / "tiny-llama.json").read_text())
    doc["n_layers"] = 100_000
    out["n_layers_100000_s"] = timed(lambda: modkit.build(modkit.load_spec(doc), device="meta"), max(timeout, 120))
    cfg = json.loads((REPO / "tests" / "data" / "real-models" / "gemma-3-1b-pt" / "config.json").read_text())
    cfg["num_hidden_layers"] = 10**8
    out["hf_num_hidden_layers_1e8_s"] = timed(lambda: modkit.from_hf_config(cfg), max(timeout, 120))
    return out


# ------------------------------------------------------------------------------------------------ main


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], allow_abbrev=False)
    p.add_argument("--surface", action="append", choices=["spec", "hf", "checkpoint", "cli", "generate", "timing"])
    p.add_argument("--n-spec", type=int, default=3000, help="mutated specs (default 3000)")
    p.add_argument("--n-hf", type=int, default=1500, help="mutated Hugging Face configs (default 1500)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=10.0, help="seconds per input before it counts as a hang")
    p.add_argument("--memory-gb", type=float, default=6.0, help="address-space cap of this process (GiB)")
    p.add_argument("--json", metavar="FILE", help="write the counts as JSON")
    p.add_argument("--log", metavar="FILE", help="write one line per notable input (raw, accepted-bad, hang)")
    args = p.parse_args(argv)
    cap = int(args.memory_gb * 2**30)
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    import torch

    torch.set_num_threads(1)
    surfaces = args.surface or ["spec", "hf", "checkpoint", "cli", "generate", "timing"]
    lines: list[str] = []
    log = lines.append
    results = {}
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        for s in surfaces:
            start = time.perf_counter()
            if s == "spec":
                c = run_specs(args.n_spec, rng, tmp, args.timeout, log)
            elif s == "hf":
                c = run_hf(args.n_hf, rng, tmp, args.timeout, log)
            elif s == "checkpoint":
                c = run_checkpoints(rng, tmp, args.timeout, log)
            elif s == "cli":
                c = run_cli(tmp, args.timeout, log)
            elif s == "timing":
                results[s] = run_timing(args.timeout, log)
                print(f"{s:<11} {json.dumps(results[s])}", flush=True)
                continue
            else:
                c = run_generate(args.timeout, log)
            results[s] = {
                "total": sum(c.values()),
                **dict(sorted(c.items())),
                "seconds": round(time.perf_counter() - start, 1),
            }
            print(f"{s:<11} {json.dumps(results[s])}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    if args.log:
        Path(args.log).write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

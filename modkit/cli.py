"""The ``modkit`` command line.

Subcommands::

    modkit list [KIND] [--pattern GLOB]      registered components (kind, type, plugin, description)
    modkit show KIND TYPE [--schema]         one component: fields, types, defaults, capabilities, provider
    modkit plugins                           installed plugins, what each registers, skipped ones and why
    modkit validate SPEC...                  one line per problem ``SPEC: path: message``; ``ok SPEC`` otherwise
    modkit schema [-o FILE]                  JSON Schema of specs (with the installed components)
    modkit convert hf CONFIG [-o SPEC]       Hugging Face config.json -> modkit spec
    modkit convert hf DIR -o OUT [--dtype]   a Hugging Face folder with safetensors weights -> modkit checkpoint
    modkit convert modkit DIR --to hf -o OUT a modkit checkpoint -> Hugging Face folder (config.json + safetensors)
    modkit build SPEC [--device] [--dtype] [--seed] [--json]
                                             components, parameter table, weight / KV-cache bytes and, on a real
                                             device, one forward pass (shape, initial loss vs ln(vocab), tokens/s)
    modkit generate MODEL --prompt TEXT [--tokenizer JSON] [--max-new-tokens N] [--temperature T] [--top-k K]
                    [--top-p P] [--min-p P] [--repetition-penalty R] [--stop-strings S...] [--sampling JSON]
                    [--seed S]               stream a continuation (text, or token ids without a tokenizer), then
                                             prefill ms and decode tokens/s on stderr; one flag per registered
                                             sampling keyword, or the whole pipeline as a JSON list

Every handler is ``func(args) -> int``. User errors print one clear message to stderr and exit 1 (argparse usage
errors exit 2); ``MODKIT_DEBUG=1`` re-raises instead, for a traceback. Other modules may add subcommands through
``add_subcommands(subparsers)`` (see :data:`EXTENSION_MODULES`).
"""

from __future__ import annotations

import argparse
import contextlib
import fnmatch
import importlib
import json
import math
import os
import shutil
import sys
import textwrap
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Iterable, Optional, Sequence

#: Modules that may contribute subcommands with ``add_subcommands(subparsers)``; a missing one is skipped.
EXTENSION_MODULES = (
    "modkit.testing.cli",
    "modkit.scaffold",
    "modkit.docs",
    "modkit.train.cli",
    "modkit.data.cli",
    "modkit.cost_cli",
    "modkit.trace_cli",
    "modkit.compare_cli",
)

PROG = "modkit"


# ------------------------------------------------------------------------------------------------ output helpers


def _out(line: str = "") -> None:
    print(line, file=sys.stdout)


def _err(line: str) -> None:
    print(line, file=sys.stderr)


def _debug() -> bool:
    return os.environ.get("MODKIT_DEBUG", "").strip().lower() in {"1", "true", "yes", "on"}


def _table(headers: Sequence[str], rows: Iterable[Sequence[Any]], *, right: Sequence[int] = (), indent: str = "") -> list[str]:
    """Plain aligned text table; columns listed in ``right`` are right-aligned, the last one is never padded."""
    rows = [[("" if c is None else str(c)) for c in r] for r in rows]
    widths = [len(h) for h in headers]
    for r in rows:
        for i, c in enumerate(r):
            widths[i] = max(widths[i], len(c))

    def fmt(cells: Sequence[str]) -> str:
        parts = []
        for i, c in enumerate(cells):
            if i == len(cells) - 1 and i not in right:
                parts.append(c)
            elif i in right:
                parts.append(c.rjust(widths[i]))
            else:
                parts.append(c.ljust(widths[i]))
        return (indent + "  ".join(parts)).rstrip()

    return [fmt(list(headers))] + [fmt(r) for r in rows]


def _one_line(text: str) -> str:
    """First sentence (or first line) of a description."""
    text = " ".join((text or "").split())
    for sep in (". ", "; "):
        if sep in text:
            text = text.split(sep, 1)[0] + ("." if sep == ". " else "")
            break
    return text


def _fit(line: str) -> str:
    """Truncate to the terminal width when stdout is a terminal (pipes get the full line)."""
    if not sys.stdout.isatty():
        return line
    width = shutil.get_terminal_size((120, 24)).columns
    return line if len(line) <= width else line[: max(width - 1, 10)] + "…"


def _count(n: int) -> str:
    return f"{n:,}"


def _short_count(n: int) -> str:
    for div, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if abs(n) >= div:
            return f"{n / div:.2f}{suffix}"
    return str(n)


def _bytes(n: float) -> str:
    for div, suffix in ((2**40, "TiB"), (2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if abs(n) >= div:
            return f"{n / div:.2f} {suffix}"
    return f"{int(n)} B"


def _spec_error_lines(exc: Any, source: Optional[str]) -> list[str]:
    """``SOURCE: path: message`` per error of a :class:`~modkit.errors.SpecError` (path omitted when empty)."""
    src = source or getattr(exc, "source", None)
    lines = []
    for path, message in exc.errors:
        head = ": ".join(p for p in (src, path) if p)
        lines.append(f"{head}: {message}" if head else message)
    return lines


class UserError(Exception):
    """A problem with the command's input, reported as ``modkit: error: ...`` with exit status 1."""


# ------------------------------------------------------------------------------------------------ list / show


def _registry():
    import modkit

    return modkit.get_registry()


def _check_kind(reg, kind: str) -> None:
    kinds = reg.kinds()
    if kind not in kinds:
        from modkit.registry import close_matches

        hint = close_matches(kind, kinds)
        raise UserError(
            f"unknown component kind {kind!r}; known kinds: {', '.join(kinds) or '(none installed)'}"
            + (f"; did you mean {hint[0]!r}?" if hint else "")
        )


def cmd_list(args: argparse.Namespace) -> int:
    """``modkit list [KIND] [--pattern GLOB]``."""
    reg = _registry()
    if args.kind is not None:
        _check_kind(reg, args.kind)
    comps = reg.components(args.kind, pattern=args.pattern)
    if not comps:
        where = f" of kind {args.kind!r}" if args.kind else ""
        pat = f" matching {args.pattern!r}" if args.pattern else ""
        _err(f"no components{where}{pat}; installed types: " + ", ".join(f"{c.kind}/{c.type}" for c in reg.components()))
        return 1
    rows = []
    for c in comps:
        plugin = c.provider.plugin if c.provider else ""
        rows.append((c.kind, c.type, plugin, _one_line(c.description)))
        for alias in c.aliases:  # an alias is a second name of the entry above, not a second component
            note = " (name changed meaning; see modkit show)" if alias in c.alias_notes else ""
            rows.append((c.kind, f"{alias} -> {c.type}", plugin, f"alias of {c.type}{note}"))
    for line in _table(("KIND", "TYPE", "PLUGIN", "DESCRIPTION"), rows):
        _out(_fit(line))
    return 0


def _resolve(schema: dict, node: dict) -> dict:
    ref = node.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/$defs/"):
        return schema.get("$defs", {}).get(ref.split("/")[-1], {})
    return node


def _type_str(schema: dict, node: dict) -> str:
    """Short human rendering of a JSON Schema node: ``integer > 0``, ``'head'|'full'``, ``norm component | null``."""
    if "anyOf" in node or "oneOf" in node:
        return " | ".join(_type_str(schema, n) for n in node.get("anyOf", node.get("oneOf", [])))
    if "$ref" in node:
        target = _resolve(schema, node)
        return str(target.get("title") or node["$ref"].split("/")[-1])
    if "const" in node:
        return repr(node["const"])
    if "enum" in node:
        return "|".join(repr(v) if v is not None else "null" for v in node["enum"])
    t = node.get("type")
    if isinstance(t, list):
        return " | ".join(map(str, t))
    if t == "array":
        return f"list[{_type_str(schema, node.get('items', {})) or 'any'}]"
    if t == "object" and isinstance(node.get("additionalProperties"), dict):
        return f"dict[str, {_type_str(schema, node['additionalProperties'])}]"
    out = str(t) if t else "any"
    for key, op in (("exclusiveMinimum", ">"), ("minimum", ">="), ("exclusiveMaximum", "<"), ("maximum", "<=")):
        if key in node:
            out += f" {op} {node[key]}"
    return out


def _field_rows(schema: dict, node: dict, prefix: str = "", slot_key: str = "x-modkit-slot") -> list[tuple[str, str, str, str]]:
    rows = []
    required = set(node.get("required", []))
    for name, prop in node.get("properties", {}).items():
        if not prefix and name == "type":
            continue  # the discriminator is shown in the header
        kind = prop.get(slot_key)
        if kind:
            nullable = any(n.get("type") == "null" for n in prop.get("anyOf", []))
            type_s = f"{kind} component" + (" | null" if nullable else "")
        else:
            type_s = _type_str(schema, prop)
        if name in required:
            default = "required"
        elif "default" in prop:
            default = json.dumps(prop["default"])
        else:
            default = ""
        rows.append((prefix + name, type_s, default, prop.get("description", "")))
        if not kind:  # expand nested plain models (e.g. rope.scaling) as dotted sub-fields
            for variant in prop.get("anyOf", [prop]):
                target = _resolve(schema, variant)
                if target is not variant or "properties" in variant:
                    if target.get("properties"):
                        rows += _field_rows(schema, target, prefix + name + ".", slot_key)
    return rows


def cmd_show(args: argparse.Namespace) -> int:
    """``modkit show KIND TYPE``: fields from the config's JSON Schema, capabilities, provider, reference."""
    from modkit.config import SLOT_KEY

    reg = _registry()
    _check_kind(reg, args.kind)
    entry = reg.get(args.kind, args.type)
    schema = entry.config.model_json_schema()
    if args.schema:
        _out(json.dumps(schema, indent=2))
        return 0
    _out(f"{entry.kind}/{entry.type}    spec: {json.dumps({'type': entry.type})}")
    if args.type != entry.type:
        _out(f"({args.type!r} is an alias of {entry.type!r}; specs that use it are stored with {entry.type!r})")
    if entry.aliases:
        _out("aliases: " + ", ".join(entry.aliases))
    _out(f"provider: {entry.provider}")
    _out("")
    for alias, note in entry.alias_notes.items():
        for para in textwrap.wrap(f"note on alias {alias!r}: " + " ".join(note.split()), width=100):
            _out(para)
        _out("")
    for para in textwrap.wrap(" ".join(entry.description.split()), width=100):
        _out(para)
    _out("")
    rows = _field_rows(schema, schema, slot_key=SLOT_KEY)
    _out("fields:")
    if rows:
        for line in _table(("FIELD", "TYPE", "DEFAULT", "DESCRIPTION"), rows, indent="  "):
            _out(line)
    else:
        _out("  (none besides type)")
    _out("")
    _out("capabilities:")
    if entry.capabilities:
        from modkit.registry import KNOWN_CAPABILITIES

        caps = [(k, json.dumps(v, default=str), KNOWN_CAPABILITIES.get(k, "")) for k, v in sorted(entry.capabilities.items())]
        name_w = max(len(k) for k, _, _ in caps)
        short = [v for _, v, _ in caps if len(v) <= 16]
        value_w = max((len(v) for v in short), default=0)
        for k, v, meaning in caps:
            if len(v) <= value_w:
                _out(f"  {k.ljust(name_w)}  {v.ljust(value_w)}  {meaning}".rstrip())
            else:  # a long value (e.g. a tensor-parallel plan) gets its own line
                _out(f"  {k.ljust(name_w)}  {v}")
                if meaning:
                    _out(f"  {' ' * name_w}  {' ' * value_w}  {meaning}")
    else:
        _out("  (none declared)")
    _out("")
    _out(f"reference: {entry.reference or '(none given)'}")
    return 0


# ------------------------------------------------------------------------------------------------ plugins


def cmd_plugins(args: argparse.Namespace) -> int:
    """``modkit plugins``: loaded plugins, versions, what each registers; skipped plugins with the reason."""
    reg = _registry()
    plugins = reg.plugins()
    skipped = reg.skipped_plugins()
    if args.json:
        data = {
            "plugins": [
                {
                    "name": p.name,
                    "distribution": p.provider.distribution,
                    "version": p.provider.version,
                    "components": [f"{k}/{t}" for k, t in p.components],
                    "hf_converters": list(p.converters),
                }
                for p in plugins
            ],
            "skipped": skipped,
        }
        _out(json.dumps(data, indent=2))
        return 0
    rows = []
    for p in plugins:
        what = [f"{k}/{t}" for k, t in p.components] + [f"hf:{m}" for m in p.converters]
        dist = p.provider.distribution or "-"
        rows.append((p.name, dist, p.provider.version or "-", ", ".join(what) or "(nothing)"))
    if rows:
        for line in _table(("PLUGIN", "PACKAGE", "VERSION", "REGISTERS"), rows):
            _out(_fit(line))
    else:
        _out("no plugins loaded")
    if skipped:
        _out("")
        _out("skipped (broken) plugins:")
        for name, reason in sorted(skipped.items()):
            _out(f"  {name}: {reason}")
        _out("set MODKIT_STRICT_PLUGINS=1 to make a broken plugin an error")
    return 0


# ------------------------------------------------------------------------------------------------ validate / schema


def _spec_path(text: str) -> Path:
    path = Path(text)
    if not path.exists():
        raise FileNotFoundError(f"{text}: no such file")
    if path.is_dir():
        raise UserError(f"{text} is a directory; give a spec .json file")
    return path


def cmd_validate(args: argparse.Namespace) -> int:
    """``modkit validate SPEC...``: ``ok SPEC`` per good spec; ``SPEC: path: message`` per error (stderr)."""
    import modkit

    reg = _registry()
    failed = 0
    for name in args.specs:
        path = Path(name)
        if path.is_dir():
            _err(f"{name}: is a directory; give a spec .json file")
            failed += 1
            continue
        try:  # a missing, special (FIFO, device) or unreadable file is a SpecError naming it: go on to the next
            modkit.load_spec(path, registry=reg)
        except modkit.SpecError as exc:
            for line in _spec_error_lines(exc, name):
                _err(line)
            failed += 1
        else:
            _out(f"ok {name}")
    if failed and len(args.specs) > 1:
        _err(f"{failed} of {len(args.specs)} spec(s) invalid")
    return 1 if failed else 0


def cmd_schema(args: argparse.Namespace) -> int:
    """``modkit schema [--train] [-o FILE]``: JSON Schema of specs with the installed components, or of training configs."""
    import modkit

    if args.train:
        from modkit.train.config import json_schema as train_schema

        schema = train_schema()
    else:
        schema = modkit.json_schema()
    text = json.dumps(schema, indent=2) + "\n"
    if args.output and args.output != "-":
        Path(args.output).write_text(text)
        _err(f"wrote {args.output}")
    else:
        sys.stdout.write(text)
    return 0


# ------------------------------------------------------------------------------------------------ convert


def cmd_convert_hf(args: argparse.Namespace) -> int:
    """``modkit convert hf CONFIG [-o SPEC]``: Hugging Face ``config.json`` (file or folder) -> validated spec."""
    import modkit
    from modkit.hf import convert_hf_config

    src = Path(args.config)
    if not src.exists():
        raise FileNotFoundError(f"{args.config}: no such file")
    if src.is_dir() and args.output and args.output != "-" and not args.output.endswith(".json") and _has_weights(src):
        return _convert_hf_weights(src, Path(args.output), args.dtype, args.strict)
    reg = _registry()
    try:
        data, spec = convert_hf_config(src, registry=reg, strict=args.strict)
    except modkit.SpecError as exc:
        for line in _spec_error_lines(exc, args.config):
            _err(line)
        return 1
    text = json.dumps(data, indent=2) + "\n"
    if args.output and args.output != "-":
        Path(args.output).write_text(text)
        total = modkit.count_params(spec, registry=reg)
        _err(f"wrote {args.output} ({spec.name or 'unnamed'}: {_count(total)} parameters, {_short_count(total)})")
    else:
        sys.stdout.write(text)
    return 0


def _has_weights(folder: Path) -> bool:
    """Whether a model folder holds weights: safetensors, or pickle files (refused when converting)."""
    from modkit.checkpoint import PICKLE_SUFFIXES

    return any(p.suffix == ".safetensors" or p.name.endswith(".safetensors.index.json") or p.suffix.lower() in PICKLE_SUFFIXES
               for p in folder.iterdir() if p.is_file())


def _weights_summary(model) -> str:
    total = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
    dtype = next((str(p.dtype).replace("torch.", "") for p in model.parameters()), "-")
    extras = len(getattr(model, "checkpoint_extras", None) or {})
    kept = f", {extras} source tensor(s) kept alongside" if extras else ""
    return f"{model.spec.name or 'unnamed'}: {_count(total)} parameters, {_short_count(total)}, {dtype}{kept}"


def _convert_hf_weights(src: Path, out: Path, dtype: Optional[str], strict: bool = False) -> int:
    """``modkit convert hf DIR -o OUT``: load the folder's safetensors weights and save a modkit checkpoint."""
    import modkit

    model = modkit.from_hf(src, dtype=dtype, registry=_registry(), strict=strict)
    modkit.save(model, out)
    _err(f"wrote {out}/ (spec.json + model.safetensors; {_weights_summary(model)})")
    return 0


def cmd_convert_modkit(args: argparse.Namespace) -> int:
    """``modkit convert modkit DIR --to hf -o OUT``: a modkit checkpoint -> Hugging Face folder."""
    import modkit

    src = Path(args.checkpoint)
    if not src.exists():
        raise FileNotFoundError(f"{args.checkpoint}: no such file")
    kwargs = {} if args.max_shard_size is None else {"max_shard_size": _parse_size(args.max_shard_size)}
    model = modkit.load(src, dtype=args.dtype, registry=_registry())
    out = Path(args.output)
    modkit.to_hf(model, out, registry=_registry(), **kwargs)
    model_type = model.spec.metadata.get("hf_model_type")
    tokenizer = (src if src.is_dir() else src.parent) / "tokenizer.json"
    if tokenizer.is_file():  # a training run's checkpoint carries its tokenizer; the export keeps it beside the weights
        shutil.copyfile(tokenizer, out / "tokenizer.json")
    _err(f"wrote {out}/ (Hugging Face {model_type}: config.json + safetensors{' + tokenizer.json' if tokenizer.is_file() else ''}; "
         f"{_weights_summary(model)})")
    return 0


def _parse_size(text: str) -> int:
    """``5GB``, ``500MB``, ``2GiB``, ``1000`` -> bytes."""
    units = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30}
    t = text.strip().upper()
    num = t.rstrip("KMGIB")
    try:
        value = float(num) * units[t[len(num):]]
    except (ValueError, KeyError):
        raise UserError(f"invalid size {text!r}; use e.g. 5GB, 500MB, 2GiB or a number of bytes") from None
    if not math.isfinite(value):
        raise UserError(f"invalid size {text!r}: not a finite number of bytes")
    if value < 1:
        raise UserError(f"invalid size {text!r}: must be at least 1 byte")
    return int(value)


# ------------------------------------------------------------------------------------------------ build


def _sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _forward_check(model, device, seed: int) -> dict:
    """One seeded forward pass of a small random batch; output shape, initial loss vs ln(vocab), tokens/s."""
    import torch

    spec = model.spec
    batch, seq = 2, min(64, spec.max_seq_len)
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, spec.vocab_size, (batch, seq), generator=gen).to(device)
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            start = time.perf_counter()
            out = model(ids)
            _sync(device)
            first = time.perf_counter() - start
            logits = out.logits.float()
            if seq > 1:  # next-token loss: position t predicts token t + 1
                loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, spec.vocab_size), ids[:, 1:].reshape(-1))
            else:
                loss = torch.nn.functional.cross_entropy(logits.reshape(-1, spec.vocab_size), ids.reshape(-1))
            aux = out.aux_loss
            # time a few more passes after the warm-up one (stop early when a pass is slow)
            runs, elapsed = 0, 0.0
            while runs < 3 and elapsed < 2.0 and first < 2.0:
                start = time.perf_counter()
                model(ids)
                _sync(device)
                elapsed += time.perf_counter() - start
                runs += 1
            if runs == 0:
                runs, elapsed = 1, first
    finally:
        model.train(was_training)
    loss_v = float(loss)
    return {
        "device": str(device),
        "input_shape": [batch, seq],
        "output_shape": list(out.logits.shape),
        "output_dtype": str(out.logits.dtype).replace("torch.", ""),
        "loss": loss_v,
        "ln_vocab": math.log(spec.vocab_size),
        "aux_loss": None if aux is None else float(aux),
        "finite": bool(torch.isfinite(logits).all()) and math.isfinite(loss_v),
        "seconds_per_pass": elapsed / runs,
        "tokens_per_s": batch * seq * runs / elapsed if elapsed > 0 else None,
    }


def _check_device(text: str):
    import torch

    try:
        device = torch.device(text)
    except (RuntimeError, ValueError) as exc:
        raise UserError(f"invalid device {text!r}; use cpu, meta, cuda or cuda:N (any torch device type works)") from None
    if device.type == "meta":
        return device
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UserError(f"device {text!r} requested but CUDA is not available here; use --device cpu or meta")
    try:
        torch.empty(1, device=device)
    except Exception as exc:  # noqa: BLE001 - any backend failure means the device is unusable
        raise UserError(f"device {text!r} is not usable: {type(exc).__name__}: {exc}") from None
    return device


def _print_build(spec_name: str, model, summary, device, seed: int) -> None:
    spec = model.spec
    title = spec.name or Path(spec_name).stem
    _out(f"{title}  ({spec_name})")
    if spec.description:
        _out(spec.description)
    _out(
        f"vocab {_count(spec.vocab_size)}, d_model {spec.d_model}, {spec.n_layers} layers, "
        f"max_seq_len {_count(spec.max_seq_len)}; device {device}, dtype {summary.dtype}, seed {seed}"
    )
    _out("")
    _out("components")
    rows = []
    for c in summary.components:
        prov = c.get("plugin") or ""
        if c.get("distribution"):
            prov += f" ({c['distribution']} {c.get('version') or ''})".rstrip()
        rows.append((c["kind"], c["type"], prov, ", ".join(c.get("paths", []))))
    for line in _table(("KIND", "TYPE", "PROVIDER", "USED AT"), rows, indent="  "):
        _out(line)
    _out("")
    _out("parameters")
    params = summary.params
    total = params["total"]
    share = lambda n: f"{100.0 * n / total:.1f}%" if total else "-"  # noqa: E731
    rows = [(k, _count(v), share(v), _short_count(v)) for k, v in params.items() if k != "total"]
    rows.append(("total", _count(total), share(total), _short_count(total)))
    lines = _table(("PART", "COUNT", "SHARE", ""), rows, right=(1, 2, 3), indent="  ")
    for i, line in enumerate(lines):
        if i == len(lines) - 1:
            _out("  " + "-" * (len(max(lines, key=len)) - 2))
        _out(line)
    active = summary.active_params_per_token
    if active != total:
        _out(f"  active per token: {_count(active)} ({_short_count(active)}, {share(active)} of total)")
    else:
        _out(f"  active per token: {_count(active)} (dense: every parameter)")
    _out("")
    _out(f"weights:  {_bytes(summary.weight_bytes)} ({_count(summary.weight_bytes)} bytes at {summary.dtype})")
    kv = summary.kv_cache_bytes_per_token
    _out(
        f"KV cache: {_count(kv)} bytes/token at {summary.dtype}; "
        f"{_bytes(kv * spec.max_seq_len)} per sequence of max_seq_len {_count(spec.max_seq_len)}"
    )


def _print_forward(fw: dict) -> None:
    _out("")
    _out(f"forward pass on {fw['device']} (random tokens, batch {fw['input_shape'][0]}, seq {fw['input_shape'][1]})")
    _out(f"  input  {fw['input_shape']} -> logits {fw['output_shape']} {fw['output_dtype']}")
    _out(f"  initial loss {fw['loss']:.4f} (ln(vocab) = {fw['ln_vocab']:.4f})")
    if fw["aux_loss"] is not None:
        _out(f"  aux loss {fw['aux_loss']:.4f}")
    tps = fw["tokens_per_s"]
    _out(f"  throughput {_count(round(tps)) if tps else '-'} tokens/s ({1000 * fw['seconds_per_pass']:.1f} ms per pass)")


def cmd_build(args: argparse.Namespace) -> int:
    """``modkit build SPEC``: build the model, print its card and (on a real device) run one forward pass."""
    import modkit
    from modkit.build import summarize

    path = _spec_path(args.spec)
    device = _check_device(args.device)
    reg = _registry()
    try:
        spec = modkit.load_spec(path, registry=reg)
    except modkit.SpecError as exc:
        for line in _spec_error_lines(exc, args.spec):
            _err(line)
        return 1
    model = modkit.build(spec, device=device, dtype=args.dtype, seed=args.seed, registry=reg,
                         check_memory=not args.no_memory_check)
    summary = summarize(model, args.dtype, registry=reg)
    data = summary.to_json()
    data.update(spec=args.spec, device=str(device), seed=args.seed)
    if not args.json:
        _print_build(args.spec, model, summary, device, args.seed)
        if device.type == "meta":
            _out("")
            _out("built on meta: no memory allocated, no forward pass (use --device cpu to run one)")
    status = 0
    if device.type != "meta":
        fw = _forward_check(model, device, args.seed)
        data["forward"] = fw
        if not args.json:
            _print_forward(fw)
        if not fw["finite"]:
            _err(f"{args.spec}: the forward pass produced non-finite logits or loss (loss = {fw['loss']})")
            status = 1
    if args.json:
        _out(json.dumps(data, indent=2))
    return status


# ------------------------------------------------------------------------------------------------ generate


def _load_model(text: str, device, dtype: Optional[str], seed: int, check_memory: bool = True):
    """A spec ``.json`` (built with random weights from ``seed``), a modkit checkpoint folder (``spec.json``) or a
    Hugging Face folder (``config.json``, through ``modkit.from_hf``)."""
    import modkit

    path = Path(text)
    if "\x00" not in text and not path.exists():
        raise FileNotFoundError(f"{text}: no such file")
    if not path.is_dir():  # a spec file; load_spec refuses special files (FIFO, device) and NUL bytes by name
        if path.suffix != ".json":
            raise UserError(f"{text}: give a spec .json file or a checkpoint folder")
        reg = _registry()
        return modkit.build(modkit.load_spec(path, registry=reg), device=device, dtype=dtype, seed=seed, registry=reg,
                            check_memory=check_memory)
    if (path / "spec.json").is_file():
        return modkit.load(path, device=device, dtype=dtype, check_memory=check_memory)
    if (path / "config.json").is_file():
        return modkit.from_hf(path, device=device, dtype=dtype, check_memory=check_memory)
    raise UserError(f"{text}: a folder without spec.json (modkit checkpoint) or config.json (Hugging Face model)")


def _load_tokenizer(path: str):
    """The tokenizer at ``path`` (:func:`modkit.data.load_tokenizer`: a regular ``tokenizer.json``, its padding and
    truncation switched off so a prompt is encoded as it is), or a :class:`UserError`."""
    from modkit.data import DataError, load_tokenizer

    try:
        return load_tokenizer(path)
    except DataError as exc:
        raise UserError(f"--tokenizer {exc}") from None


def _prompt_ids(text: str, tokenizer) -> list[int]:
    """The prompt's token ids: encoded by ``tokenizer``, or parsed from ids separated by commas or spaces."""
    if tokenizer is not None:
        ids = tokenizer.encode(text)
        if not ids:
            raise UserError("the prompt encodes to no tokens")
        return ids
    parts = [p for p in text.replace(",", " ").split() if p]
    try:
        ids = [int(p) for p in parts]
    except ValueError:
        raise UserError(
            f"without --tokenizer the prompt is token ids separated by commas or spaces, got {text!r}"
        ) from None
    if not ids:
        raise UserError("the prompt is empty; give at least one token id")
    return ids


class _TextStream:
    """Print the text of a growing list of token ids as it becomes stable (whole UTF-8 characters only)."""

    def __init__(self, tokenizer):
        self.tokenizer, self.ids, self.shown = tokenizer, [], ""

    def push(self, token: int) -> None:
        self.ids.append(token)
        if self.tokenizer is None:
            sys.stdout.write(("" if len(self.ids) == 1 else " ") + str(token))
        else:
            text = self.tokenizer.decode(self.ids)
            if text.startswith(self.shown) and not text.endswith("\ufffd"):  # wait for a split character to complete
                sys.stdout.write(text[len(self.shown) :])
                self.shown = text
        sys.stdout.flush()

    def close(self) -> None:
        if self.tokenizer is not None:
            text = self.tokenizer.decode(self.ids)
            sys.stdout.write(text[len(self.shown) :] if text.startswith(self.shown) else "\n" + text)
        sys.stdout.write("\n")
        sys.stdout.flush()


def cmd_generate(args: argparse.Namespace) -> int:
    """``modkit generate MODEL --prompt TEXT``: stream a continuation, then one summary line on stderr."""
    import torch

    import modkit

    from modkit.generate import build_sampler, check_generation, check_sampling, column_major_linears, stream_generate

    if args.max_new_tokens < 1:
        raise UserError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    flags = {"temperature": "--temperature", "top_k": "--top-k", "top_p": "--top-p", "seed": "--seed",
             "max_new_tokens": "--max-new-tokens"}
    check_sampling(args.temperature, args.top_k, args.top_p, names=flags)  # every argument before any work
    check_generation(args.max_new_tokens, seed=args.seed, names=flags)
    found = Path(args.model) / "tokenizer.json"  # a training run's checkpoints (and HF folders) carry their tokenizer
    if not args.tokenizer and Path(args.model).is_dir() and found.is_file():
        args.tokenizer = str(found)
        _err(f"tokenizer: {found}")
    tokenizer = _load_tokenizer(args.tokenizer) if args.tokenizer else None
    ids = _prompt_ids(args.prompt, tokenizer)
    device = _check_device(args.device)
    if device.type == "meta":
        raise UserError("generate needs a real device (cpu, cuda, ...), not meta")
    model = _load_model(args.model, device, args.dtype, args.seed, not args.no_memory_check).eval()
    if device.type == "cpu":  # batch-1 decoding streams column-major weights faster (same values; see the docstring)
        column_major_linears(model)
    stream = _TextStream(tokenizer)
    sampling = _sampling_from_args(args)
    decode = tokenizer.decode if tokenizer is not None else None
    try:  # the pipeline is checked before anything is printed
        build_sampler(model.spec.vocab_size, decode=decode, **sampling)
    except modkit.SamplingError as exc:
        if "sampling" in sampling:
            lines = _spec_error_lines(exc, "--sampling")
        else:
            lines = [f"--{p.replace('_', '-')}: {m}" for p, m in exc.errors]
        for line in lines:
            _err(line)
        return 1
    tokens = stream_generate(  # checks the prompt against the model (vocabulary, max_seq_len) before any output
        model, torch.tensor([ids]), max_new_tokens=args.max_new_tokens, seed=args.seed, compile=args.compile,
        decode=decode, check_memory=not args.no_memory_check, **sampling,
    )
    start = time.perf_counter()
    first = None
    n = 0
    for token in tokens:
        if first is None:
            _sync(device)
            first = time.perf_counter()
        stream.push(int(token[0]))
        n += 1
    _sync(device)
    end = time.perf_counter()
    stream.close()
    prefill_ms = 1000 * ((first or end) - start)
    rate = (n - 1) / (end - first) if n > 1 and end > first else float("nan")
    kv = model.new_cache(1, len(ids) + args.max_new_tokens, device="meta").nbytes()  # what generate allocated
    _err(
        f"prompt {len(ids)} tokens, prefill {prefill_ms:.1f} ms (with the first token); "
        f"decode {n - 1} tokens at {rate:.1f} tokens/s; KV cache {_bytes(kv)}; "
        f"{device}, {str(model.embed.weight.dtype).replace('torch.', '')}"
    )
    return 0


# ------------------------------------------------------------------------------------------------ parser


class _Parser(argparse.ArgumentParser):
    """ArgumentParser whose usage errors say which subcommand they belong to (exit status 2)."""


def build_parser() -> argparse.ArgumentParser:
    """The ``modkit`` argument parser (subcommands, then extension modules' ``add_subcommands``)."""
    from modkit import __version__

    parser = _Parser(
        prog=PROG,
        description="Compose decoder-only Transformers from registry components declared in JSON specs.",
        epilog="Set MODKIT_DEBUG=1 for tracebacks, MODKIT_STRICT_PLUGINS=1 to make a broken plugin an error.",
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True

    p = sub.add_parser("list", help="list registered components", description="List registered components.")
    p.add_argument("kind", nargs="?", help="only this kind (attention, norm, ffn, position, placement, ...)")
    p.add_argument("--pattern", "-p", help="fnmatch pattern on the type name, e.g. '*norm'")
    p.set_defaults(func=cmd_list)

    p = sub.add_parser("show", help="describe one component", description="Fields, capabilities and provider of one component.")
    p.add_argument("kind", help="component kind, e.g. norm")
    p.add_argument("type", help="component type, e.g. rmsnorm")
    p.add_argument("--schema", action="store_true", help="print the config's JSON Schema instead")
    p.set_defaults(func=cmd_show)

    p = sub.add_parser("plugins", help="list installed plugins", description="Installed plugins and what each registers.")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=cmd_plugins)

    p = sub.add_parser("validate", help="validate spec files", description="Validate spec files; one line per error.")
    p.add_argument("specs", nargs="+", metavar="SPEC", help="spec .json file(s)")
    p.set_defaults(func=cmd_validate)

    p = sub.add_parser("schema", help="print the JSON Schema of specs", description="JSON Schema of specs (installed components).")
    p.add_argument("-o", "--output", metavar="FILE", help="write to FILE instead of stdout")
    p.add_argument("--train", action="store_true", help="the JSON Schema of training configs (modkit train --config) instead")
    p.set_defaults(func=cmd_schema)

    p = sub.add_parser(
        "convert",
        help="convert a foreign config or checkpoint",
        description="Convert a foreign config into a modkit spec, or a checkpoint between formats (safetensors only).",
    )
    conv = p.add_subparsers(dest="source", metavar="SOURCE", parser_class=_Parser)
    conv.required = True
    h = conv.add_parser(
        "hf",
        help="Hugging Face config.json or model folder",
        description="Hugging Face config.json (file or model folder) -> spec. A folder holding safetensors weights "
        "with -o OUT becomes a modkit checkpoint folder OUT (spec.json + model.safetensors). Pickle weights "
        "(pytorch_model.bin, *.pt) are refused: unpickling can execute arbitrary code.",
    )
    h.add_argument("config", metavar="CONFIG", help="config.json, or a model folder holding one (and its weights)")
    h.add_argument(
        "-o",
        "--output",
        metavar="OUT",
        help="where to write: for a folder with weights, the checkpoint folder OUT (unless OUT ends in .json: the spec "
        "only); otherwise the spec (default: the spec to stdout)",
    )
    h.add_argument("--dtype", default=None, help="with weights: float32, bfloat16 or float16 (default: as stored)")
    h.add_argument(
        "--strict",
        action="store_true",
        help="refuse config keys the converter does not know (default: drop them with one warning naming each key and value)",
    )
    h.set_defaults(func=cmd_convert_hf)
    m = conv.add_parser(
        "modkit",
        help="modkit checkpoint -> Hugging Face folder",
        description="A modkit checkpoint folder (spec.json + model.safetensors) -> a Hugging Face folder "
        "(config.json + model.safetensors, sharded above --max-shard-size) that transformers loads. The model "
        "type is the spec's metadata.hf_model_type.",
    )
    m.add_argument("checkpoint", metavar="DIR", help="modkit checkpoint folder (or its model.safetensors)")
    m.add_argument("--to", required=True, choices=["hf"], help="target format (hf)")
    m.add_argument("-o", "--output", required=True, metavar="OUT", help="output folder")
    m.add_argument("--dtype", default=None, help="float32, bfloat16 or float16 (default: as stored)")
    m.add_argument("--max-shard-size", default=None, metavar="SIZE", help="largest shard, e.g. 5GB (default), 500MB")
    m.set_defaults(func=cmd_convert_modkit)

    p = sub.add_parser(
        "build",
        help="build a model and print its card",
        description="Build a model from a spec: components, parameter table, weight and KV-cache bytes; "
        "on a real device also one forward pass of a random batch.",
    )
    p.add_argument("spec", metavar="SPEC", help="spec .json file")
    p.add_argument("--device", default="cpu", help="cpu (default), meta (no memory, no forward pass), cuda, cuda:N, ...")
    p.add_argument("--dtype", default="float32", help="float32 (default), bfloat16 or float16")
    p.add_argument("--seed", type=int, default=0, help="seed of the weight init and the random batch (default 0)")
    p.add_argument("--json", action="store_true", help="print one JSON object and nothing else on stdout")
    p.add_argument("--no-memory-check", action="store_true",
                   help="allocate even when the estimated weight bytes exceed the memory free on the device")
    p.set_defaults(func=cmd_build)

    p = sub.add_parser(
        "generate",
        help="generate text or token ids from a model",
        description="Stream a continuation of a prompt from a spec (random weights), a modkit checkpoint folder or a "
        "Hugging Face folder, then print one summary line (prefill ms, decode tokens/s) on stderr.",
    )
    p.add_argument("model", metavar="MODEL", help="spec .json (random init), modkit checkpoint folder or Hugging Face folder")
    p.add_argument("--prompt", required=True, help="text (with --tokenizer) or token ids separated by commas or spaces")
    p.add_argument(
        "--tokenizer", metavar="JSON",
        help="a tokenizers tokenizer.json (default: MODEL/tokenizer.json when there is one); without one, prompt and output are token ids",
    )
    p.add_argument("--max-new-tokens", type=int, default=32, metavar="N", help="tokens to generate (default 32)")
    p.add_argument("--temperature", type=float, default=None, metavar="T", help="0 (default) is greedy; > 0 samples")
    p.add_argument("--top-k", type=int, default=None, metavar="K", help="sample among the K most likely tokens")
    p.add_argument("--top-p", type=float, default=None, metavar="P", help="nucleus sampling: smallest set with mass >= P")
    _add_sampling_flags(p)
    p.add_argument(
        "--sampling",
        metavar="JSON",
        help="the sampling pipeline as a JSON list (or a file holding one), applied in list order, e.g. "
        "'[{\"type\": \"temperature\", \"value\": 0.7}, {\"type\": \"min_p\", \"p\": 0.05}]'; instead of the flags above",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the sampling (and of random weights for a spec; default 0)")
    p.add_argument("--device", default="cpu", help="cpu (default), cuda, cuda:N, ...")
    p.add_argument("--dtype", default=None, help="float32, bfloat16 or float16 (default: float32 for a spec, as stored otherwise)")
    p.add_argument("--compile", action="store_true", help="decode with torch.compile (fullgraph; pays a one-off compilation)")
    p.add_argument("--no-memory-check", action="store_true",
                   help="allocate even when the estimated weight or KV-cache bytes exceed the memory free on the device")
    p.set_defaults(func=cmd_generate)

    _add_extensions(sub)
    return parser


def _sampling_arguments() -> dict:
    """``{keyword: (entry, field)}`` of the registered sampling steps (empty if the registry cannot load)."""
    try:
        from modkit.sampling import arguments

        return arguments(_registry())
    except Exception:  # noqa: BLE001 - a broken registry must not take the parser down; commands report it
        if _debug():
            raise
        return {}


def _add_sampling_flags(p: argparse.ArgumentParser) -> None:
    """One ``--flag`` per sampling keyword a registered logits processor or stop condition declares (its
    ``argument`` capability), typed from its config field; flags already defined are left as they are."""
    import typing

    taken = {a.dest for a in p._actions}
    for name, (entry, field) in sorted(_sampling_arguments().items()):
        if name in taken:
            continue
        def base(t: Any) -> Any:  # int for Annotated[int, Ge(0)] (PositiveInt and friends)
            return typing.get_args(t)[0] if typing.get_origin(t) is typing.Annotated else t

        info = entry.config.model_fields.get(field)
        ann = base(info.annotation if info is not None else str)
        kwargs: dict[str, Any] = {"default": None, "dest": name}
        if typing.get_origin(ann) is list:
            item = base((typing.get_args(ann) or (str,))[0])
            kwargs.update(nargs="+", type=item if item in (int, float, str) else str)
        elif ann in (int, float):
            kwargs["type"] = ann
        text = (info.description or "") if info is not None else ""
        kwargs["help"] = f"{entry.kind} {entry.type}: {text}".replace("%", "%%")
        kwargs["metavar"] = field.upper()
        p.add_argument("--" + name.replace("_", "-"), **kwargs)


def _sampling_from_args(args: argparse.Namespace) -> dict:
    """``generate`` keyword arguments for the sampling pipeline from the parsed flags (``--sampling`` or flags)."""
    values = {name: getattr(args, name, None) for name in _sampling_arguments()}
    for name in ("temperature", "top_k", "top_p"):
        values[name] = getattr(args, name, None)
    given = {k: v for k, v in values.items() if v is not None}
    if args.sampling is None:
        given.setdefault("temperature", 0.0)  # the command line decodes greedily unless told otherwise
        return given
    if given:
        raise UserError(f"--sampling replaces the sampling flags; drop {', '.join('--' + k.replace('_', '-') for k in sorted(given))}")
    from modkit.jsonio import JSONInputError, parse_json, read_json_file

    text = args.sampling
    try:
        if text.lstrip().startswith("["):
            steps = parse_json(text, source="--sampling")
        elif "\x00" not in text and Path(text).exists():
            steps = read_json_file(text)  # a regular file of bounded size, UTF-8, no duplicate keys
        else:
            raise UserError(f"--sampling takes a JSON list or a file holding one; {text!r} is neither")
    except JSONInputError as exc:
        where = exc.source or "--sampling"
        raise UserError("; ".join(f"{where}{': ' + p if p else ''}: {m}" for p, m in exc.errors)) from None
    return {"sampling": steps}


def _add_extensions(subparsers) -> None:
    for name in EXTENSION_MODULES:
        try:
            module = importlib.import_module(name)
        except ImportError as exc:
            missing = getattr(exc, "name", None)
            if _debug() and not (missing and name.startswith(missing)):
                _err(f"{PROG}: warning: skipped subcommands of {name}: {type(exc).__name__}: {exc}")
            continue
        except Exception as exc:  # noqa: BLE001 - a broken extension must not take the whole CLI down
            if _debug():
                raise
            _err(f"{PROG}: warning: skipped subcommands of {name}: {type(exc).__name__}: {exc}")
            continue
        add = getattr(module, "add_subcommands", None)
        if callable(add):
            add(subparsers)


# ------------------------------------------------------------------------------------------------ main


@contextlib.contextmanager
def _plugin_warnings_to_stderr():
    """Show modkit's plugin and spec warnings as one ``modkit: warning: ...`` line on stderr (never on stdout)."""
    from modkit.errors import SpecWarning

    with warnings.catch_warnings():
        default = warnings.showwarning

        def show(message, category, filename, lineno, file=None, line=None):
            if category.__name__ == "PluginWarning" or issubclass(category, SpecWarning):
                _err(f"{PROG}: warning: {message}")
            else:
                default(message, category, filename, lineno, file, line)

        warnings.showwarning = show
        yield


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the CLI; returns the exit status (0 ok, 1 error, 2 usage error)."""
    with _plugin_warnings_to_stderr():
        try:
            parser = build_parser()
            if argv is None:
                argv = sys.argv[1:]
            if not argv:
                parser.print_help(sys.stderr)
                return 2
            try:
                args = parser.parse_args(argv)
            except SystemExit as exc:  # --help, --version, usage errors
                return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
            func: Callable[[argparse.Namespace], int] = args.func
            return int(func(args) or 0)
        except KeyboardInterrupt:
            _err(f"{PROG}: interrupted")
            return 130
        except BrokenPipeError:  # `modkit list | head`: the reader left; exit quietly like other Unix tools
            try:
                sys.stdout = open(os.devnull, "w")
            except OSError:
                pass
            return 0
        except Exception as exc:  # noqa: BLE001
            if _debug():
                raise
            return _report(exc)


def _report(exc: BaseException) -> int:
    from modkit.errors import ModkitError, SpecError

    if isinstance(exc, SpecError):
        what = exc.source if (exc.source or "").startswith("training config") else f"spec {exc.source}" if exc.source else "spec"
        _err(f"{PROG}: error: invalid {what}")
        for line in _spec_error_lines(exc, None):
            _err("  " + line)
    elif isinstance(exc, UserError):
        _err(f"{PROG}: error: {exc}")
    elif isinstance(exc, FileNotFoundError):
        name = exc.filename
        _err(f"{PROG}: error: " + (f"{name}: no such file" if name else str(exc)))
    elif isinstance(exc, (ModkitError, ValueError)):
        _err(f"{PROG}: error: {exc}")
    elif isinstance(exc, OSError):
        _err(f"{PROG}: error: {exc.filename + ': ' if exc.filename else ''}{exc.strerror or exc}")
    else:
        _err(f"{PROG}: internal error: {type(exc).__name__}: {exc}")
        _err(f"{PROG}: this is a bug in modkit or a plugin; rerun with MODKIT_DEBUG=1 for the traceback")
    return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

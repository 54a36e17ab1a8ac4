"""``modkit build SPEC``: the model card (components and providers, a parameter table, weight and KV-cache bytes)
and, on a real device, one forward pass of a random batch (shape, initial loss against ln(vocab), tokens/s)."""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

from .common import _check_device, _registry, _spec_path, _sync
from .output import _bytes, _count, _err, _out, _short_count, _spec_error_lines, _table


def add_subcommands(sub) -> None:
    """Add ``build``."""
    p = sub.add_parser(
        "build",
        help="build a model and print its card",
        description="Build a model from a spec: components, parameter table, weight and KV-cache bytes; "
        "on a real device also one forward pass of a random batch.",
    )
    p.add_argument("spec", metavar="SPEC", help="spec .json file")
    p.add_argument(
        "--device", default="cpu", help="cpu (default), meta (no memory, no forward pass), cuda, cuda:N, ..."
    )
    p.add_argument("--dtype", default="float32", help="float32 (default), bfloat16 or float16")
    p.add_argument("--seed", type=int, default=0, help="seed of the weight init and the random batch (default 0)")
    p.add_argument("--json", action="store_true", help="print one JSON object and nothing else on stdout")
    p.add_argument(
        "--no-memory-check",
        action="store_true",
        help="allocate even when the estimated weight bytes exceed the memory free on the device",
    )
    p.set_defaults(func=cmd_build)


#: untimed passes before the timed ones (the first pass pays one-off costs: kernel selection, allocator growth, caches)
WARMUP_PASSES = 1
#: timed passes: at most this many, and no more once they add up to TIMED_SECONDS (always at least one)
TIMED_PASSES, TIMED_SECONDS = 3, 2.0


def _forward_check(model, device, seed: int) -> dict:
    """A seeded forward pass of a small random batch (output shape, initial loss against ln(vocab)), which is also the
    warm-up, then 1 to :data:`TIMED_PASSES` timed passes for the throughput; the warm-up is never timed."""
    import torch

    spec = model.spec
    batch, seq = 2, min(64, spec.max_seq_len)
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, spec.vocab_size, (batch, seq), generator=gen).to(device)
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            out = model(ids)  # the warm-up pass: its loss is reported, its time is not
            _sync(device)
            logits = out.logits.float()
            if seq > 1:  # next-token loss: position t predicts token t + 1
                loss = torch.nn.functional.cross_entropy(
                    logits[:, :-1].reshape(-1, spec.vocab_size), ids[:, 1:].reshape(-1)
                )
            else:
                loss = torch.nn.functional.cross_entropy(logits.reshape(-1, spec.vocab_size), ids.reshape(-1))
            aux = out.aux_loss
            runs, elapsed = 0, 0.0
            while runs == 0 or (runs < TIMED_PASSES and elapsed < TIMED_SECONDS):
                start = time.perf_counter()
                model(ids)
                _sync(device)
                elapsed += time.perf_counter() - start
                runs += 1
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
        "warmup_passes": WARMUP_PASSES,
        "timed_passes": runs,
        "seconds_per_pass": elapsed / runs,
        "tokens_per_s": batch * seq * runs / elapsed if elapsed > 0 else None,
    }


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
    line = (
        f"KV cache: {_count(kv)} bytes/token at {summary.dtype}; "
        f"{_bytes(summary.kv_cache_bytes_per_sequence)} per sequence of max_seq_len {_count(spec.max_seq_len)}"
    )
    if summary.cache_state_bytes_per_sequence:  # recurrent mixers: a fixed-size state, whatever the length
        line += f", of which {_bytes(summary.cache_state_bytes_per_sequence)} fixed-size state"
    windowed = [w for w in summary.windows if w is not None and w < spec.max_seq_len]
    if windowed:  # ring buffers: those layers keep only the last `window` tokens
        sizes = ", ".join(_count(w) for w in sorted(set(windowed)))
        blocked = sorted(
            {b for w, b in zip(summary.windows, summary.blocks) if b and w is not None and w < spec.max_seq_len}
        )
        grows = (
            f"; {sum(1 for b in summary.blocks if b)} of them also keep one compressed entry per block of "
            f"{' or '.join(_count(b) for b in blocked)} tokens, which grows with the context"
            if blocked
            else ""
        )
        line += (
            f" ({len(windowed)} of {len(summary.windows)} layers cache at most {sizes} {'raw ' if blocked else ''}tokens: "
            f"their sliding window or attention chunk{grows})"
        )
    _out(line)


def _print_forward(fw: dict) -> None:
    _out("")
    _out(f"forward pass on {fw['device']} (random tokens, batch {fw['input_shape'][0]}, seq {fw['input_shape'][1]})")
    _out(f"  input  {fw['input_shape']} -> logits {fw['output_shape']} {fw['output_dtype']}")
    _out(f"  initial loss {fw['loss']:.4f} (ln(vocab) = {fw['ln_vocab']:.4f})")
    if fw["aux_loss"] is not None:
        _out(f"  aux loss {fw['aux_loss']:.4f}")
    tps = fw["tokens_per_s"]
    runs, warm = fw["timed_passes"], fw["warmup_passes"]
    _out(
        f"  throughput {_count(round(tps)) if tps else '-'} tokens/s ({1000 * fw['seconds_per_pass']:.1f} ms per pass, "
        f"mean of {runs} pass{'es' if runs != 1 else ''} after {warm} warm-up pass{'es' if warm != 1 else ''})"
    )


def cmd_build(args: argparse.Namespace) -> int:
    """``modkit build SPEC``: build the model, print its card and (on a real device) run one forward pass."""
    import modkit
    from modkit.nn.build import summarize

    path = _spec_path(args.spec)
    device = _check_device(args.device)
    reg = _registry()
    try:
        spec = modkit.load_spec(path, registry=reg)
    except modkit.SpecError as exc:
        for line in _spec_error_lines(exc, args.spec):
            _err(line)
        return 1
    model = modkit.build(
        spec, device=device, dtype=args.dtype, seed=args.seed, registry=reg, check_memory=not args.no_memory_check
    )
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

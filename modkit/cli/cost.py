"""``modkit cost SPEC [--context N] [--batch B] [--dtype D] [--bandwidth BYTES_PER_S] [--peak-flops FLOPS] [--json]``.

Prints, from the components' own FLOPs declarations (:mod:`modkit.analysis.cost`): FLOPs per token by part for a prefill, a
decoded token and a training step at the context; the contexts at which each token mixer's FLOPs overtake the FFN's (read from the
mixers' declared growth, whatever their kind); weight
bytes per format; KV-cache bytes at context x batch; a training-memory estimate; a roofline decode latency.
A component without a FLOPs declaration stops it with one ``modkit: error: ...`` line naming it (exit status 1).
"""

from __future__ import annotations

import argparse
import json
from typing import Optional

from modkit.analysis.hardware import DEFAULT_BANDWIDTH, DEFAULT_PEAK_FLOPS

KIND_ORDER = ("attention", "ffn", "router")


def add_subcommands(subparsers) -> None:
    """Add ``modkit cost`` to the ``modkit`` subcommands (a command module of :mod:`modkit.cli`)."""
    p = subparsers.add_parser(
        "cost",
        help="FLOPs per token by part, KV-cache / weight / training memory, roofline decode latency",
        description="What a spec costs, from its components' FLOPs declarations, computed on meta (nothing allocated). "
        "FLOPs are matrix products only (1 multiply-add = 2 FLOPs); attention counts the (query, key) pairs its mask "
        "lets through. Prefill: one forward over --context tokens, per token; decode: one token attending to --context "
        "keys; train: 3 x prefill. The roofline defaults are an H100 SXM's (3.35e12 bytes/s, 989e12 bf16 dense FLOP/s).",
    )
    p.add_argument("spec", metavar="SPEC", help="spec .json file")
    p.add_argument(
        "--context",
        type=int,
        default=None,
        metavar="N",
        help="context length in tokens (default: the spec's max_seq_len)",
    )
    p.add_argument(
        "--batch",
        type=int,
        default=1,
        metavar="B",
        help="rows for the KV cache, the roofline and the training memory (default 1)",
    )
    p.add_argument(
        "--dtype",
        default="bfloat16",
        metavar="D",
        help="dtype of weights read, KV cache and activations (default bfloat16)",
    )
    p.add_argument(
        "--train-seq-len",
        type=int,
        default=None,
        metavar="T",
        help="sequence length of the training-memory estimate (default: --context)",
    )
    p.add_argument(
        "--bandwidth",
        type=float,
        default=DEFAULT_BANDWIDTH,
        metavar="BYTES_PER_S",
        help=f"memory bandwidth of the roofline (default {DEFAULT_BANDWIDTH:.3g}: H100 SXM HBM3)",
    )
    p.add_argument(
        "--peak-flops",
        type=float,
        default=DEFAULT_PEAK_FLOPS,
        metavar="FLOPS",
        help=f"peak FLOP/s of the roofline (default {DEFAULT_PEAK_FLOPS:.3g}: H100 SXM bf16 dense)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    p.set_defaults(func=cmd_cost)


def _flops(x: float) -> str:
    for div, suffix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "K")):
        if abs(x) >= div:
            return f"{x / div:.3f} {suffix}"
    return f"{x:.0f} "


def _rank(key: str) -> int:
    """Attention, ffn, router, other kinds, head; the declarations' own order within a kind (a stable sort)."""
    kind = key.split(".", 1)[0]
    return (
        KIND_ORDER.index(kind) if kind in KIND_ORDER else (len(KIND_ORDER) + 1 if kind == "head" else len(KIND_ORDER))
    )


def _layers(layers: list[int]) -> str:
    """``0-31``; ``1, 3, ..., 35`` (a stride); ``0-4, 6-10, 24`` (runs)."""
    if len(layers) >= 3 and len({b - a for a, b in zip(layers, layers[1:])}) == 1 and layers[1] - layers[0] > 1:
        return f"{layers[0]}, {layers[1]}, ..., {layers[-1]}"
    runs: list[list[int]] = []
    for i in layers:
        if runs and i == runs[-1][-1] + 1:
            runs[-1].append(i)
        else:
            runs.append([i])
    return ", ".join(str(r[0]) if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs)


def _context_cell(value: Optional[int], max_seq_len: int) -> str:
    from . import _count

    return "never" if value is None else _count(value) + ("\u2020" if value > max_seq_len else "")


def _crossover_lines(out, rows: list[dict], max_seq_len: int) -> None:
    """The mixer table: each token mixer (``*``: its declared FLOPs per token grow with the context) and the
    context at which it overtakes its layers' FFN, for the growing parts and for the whole mixer."""
    from . import _table

    out("a mixer overtakes the FFN of its layers (FLOPs per token) at context")
    table = []
    for r in rows:
        name = ("all mixers" if r["mixer"] == "all" else r["mixer"]) + (" *" if r["grows"] else "")
        cells = (
            [
                _context_cell(r[ph][k], max_seq_len)
                for k in ("growing_parts", "whole_mixer")
                for ph in ("decode", "prefill")
            ]
            if r["has_ffn"]
            else ["no FFN"] * 4
        )
        table.append((name, _layers(r["layers"]), *cells))
    head = ("MIXER", "LAYERS", "GROWING: DECODE", "PREFILL", "WHOLE MIXER: DECODE", "PREFILL")
    for line in _table(head, table, right=(2, 3, 4, 5), indent="  "):
        out(line)
    out(
        "  * its declared FLOPs per token grow with the context; never: they do not, or stop below the FFN's (a window)"
    )
    out("  growing: the parts that grow only; whole mixer: its projections too")
    if any(v is not None and v > max_seq_len for r in rows for ph in ("decode", "prefill") for v in r[ph].values()):
        out(f"  \u2020 beyond max_seq_len {max_seq_len:,}")


def cmd_cost(args: argparse.Namespace) -> int:
    """Print the cost tables of a spec (or ``--json``).

    Raises:
        UserError: a ``--context`` / ``--batch`` / ``--train-seq-len`` out of range, or a KV cache too large to size.
        CostError: a component without a FLOPs declaration. SpecError: an invalid spec.
    """
    import modkit

    from . import _count, _err, _registry, _spec_path
    from modkit.analysis.cost import CostModel

    reg = _registry()
    spec = modkit.load_spec(_spec_path(args.spec), registry=reg)
    context = _checked_context(args, spec, reg)
    costs = CostModel(spec, registry=reg)
    data = costs.report(
        context=context,
        batch=args.batch,
        dtype=args.dtype,
        bandwidth=args.bandwidth,
        peak_flops=args.peak_flops,
        train_seq_len=args.train_seq_len,
    )
    data["spec"] = args.spec
    beyond = context > spec.max_seq_len
    data["context_beyond_max_seq_len"] = beyond
    if beyond:  # the figures extrapolate a model that cannot run there: said on stderr and on every line at it
        _err(
            f"modkit: warning: --context {_count(context)} is beyond the spec's max_seq_len = "
            f"{_count(spec.max_seq_len)}: the model is built for at most max_seq_len tokens (generate refuses more); "
            "every figure at this context extrapolates the components' declarations"
        )
    at = _count(context) + (f" (beyond max_seq_len {_count(spec.max_seq_len)})" if beyond else "")
    if args.json:
        print(json.dumps(data, indent=2))
        return 0
    out = print
    _flops_lines(out, data, f"{spec.name or args.spec}", at)
    _crossover_section(out, data, spec.max_seq_len)
    _dense_lines(out, data, at)
    _memory_lines(out, data, context, args.batch, at)
    _roofline_lines(out, data, args.batch, at)
    return 0


def _checked_context(args: argparse.Namespace, spec, reg) -> int:
    """The context of the tables (``--context``, else the spec's ``max_seq_len``), the flags checked.

    Raises:
        UserError: a value below 1, a length above :data:`modkit.core.limits.MAX_SEQ_LEN`, or a KV cache of
            ``--batch`` x ``--context`` tokens of 2**63 bytes or more (a tensor's byte size is an int64).
    """
    import modkit

    from . import UserError
    from modkit.core.limits import MAX_SEQ_LEN

    context = args.context if args.context is not None else spec.max_seq_len
    for name, value in (("--context", context), ("--batch", args.batch), ("--train-seq-len", args.train_seq_len or 1)):
        if value < 1:
            raise UserError(f"{name} must be >= 1, got {value}")
    for name, value in (("--context", context), ("--train-seq-len", args.train_seq_len or 1)):
        if value > MAX_SEQ_LEN:
            raise UserError(
                f"{name} must be at most {MAX_SEQ_LEN:,} (modkit.core.limits.MAX_SEQ_LEN, modkit's bound "
                f"on a context length), got {value:,}"
            )
    per_token = modkit.kv_cache_bytes_per_token(spec, args.dtype, registry=reg)
    if per_token * context * args.batch >= 2**63:  # a tensor's byte size is an int64: torch would overflow
        raise UserError(
            f"--batch {args.batch:,} x --context {context:,} tokens would need "
            f"{per_token * context * args.batch:,} bytes of KV cache, past the 2**63 bytes a tensor size "
            "can express; lower --batch or --context"
        )
    return context


def _flops_lines(out, data: dict, name: str, at: str) -> None:
    """The FLOPs-per-token table: a row per part (``*``: grows with the context) and the total, per phase."""
    from . import _table
    from modkit.analysis.cost import PHASES

    per = data["flops_per_token"]
    varying = set(data["context_dependent_parts"])
    out(
        f"{name}: FLOPs per token at context {at} "
        "(matrix products only, 1 multiply-add = 2 FLOPs; * grows with the context)"
    )
    keys = sorted(dict.fromkeys([*per["prefill"], *per["decode"]]), key=_rank)
    rows = [
        (k + (" *" if k in varying else ""), *(_flops(per[ph].get(k, 0)) for ph in (*PHASES, "train"))) for k in keys
    ]
    totals = data["flops_per_token_total"]
    rows.append(("total", *(_flops(totals[ph]) for ph in (*PHASES, "train"))))
    lines = _table(("PART", "PREFILL", "DECODE", "TRAIN"), rows, right=(1, 2, 3), indent="  ")
    for i, line in enumerate(lines):
        if i == len(lines) - 1:
            out("  " + "-" * (len(max(lines, key=len)) - 2))
        out(line)


def _crossover_section(out, data: dict, max_seq_len: int) -> None:
    """Where each token mixer's FLOPs per token overtake the FFN's, read from what the mixers declare."""
    out("")
    _crossover_lines(out, data["mixer_overtakes_ffn"], max_seq_len)


def _dense_lines(out, data: dict, at: str) -> None:
    """A sparse attention against the dense attention it selects from (its dense twin), when the spec has one."""
    from . import _count

    cmp = data.get("against_dense")
    if not cmp:
        return
    pairs = ", ".join(
        f"{d} in place of {s}" if d != s else f"{s} without its window, compression and selection"
        for s, d in cmp["replaced"].items()
    )
    out("")
    out(f"against dense attention ({pairs}; everything else equal) at context {at}, FLOPs per token")
    for label, key in (("token mixers", "mixer_flops_per_token"), ("whole model", "flops_per_token")):
        cells = []
        for ph in ("prefill", "decode"):
            s, d = cmp[key][ph]["sparse"], cmp[key][ph]["dense"]
            a, b = _flops(s).strip(), _flops(d).strip()
            cells.append(f"{ph} {a} vs {b} ({d / s:.2f}x fewer)" if s else f"{ph} {a} vs {b}")
        out(f"  {label + ':':14s} " + "; ".join(cells))
    kv = cmp["kv_cache_bytes_per_token"]
    out(f"  KV cache:      {_count(kv['sparse'])} bytes per token vs {_count(kv['dense'])} (as the mixers declare)")
    held = cmp["kv_cache_bytes"]
    if held["sparse"] != held["dense"]:
        a, b = held["sparse"], held["dense"]
        how = f"{b / a:.2f}x less" if a <= b else f"{a / b:.2f}x more"
        out(f"  KV cache held: {_count(a)} bytes per row at context {at} vs {_count(b)} ({how})")


def _memory_lines(out, data: dict, context: int, batch: int, at: str) -> None:
    """Parameters, weight bytes per format, the KV cache at ``context`` x ``batch`` and the training-memory table."""
    from . import _bytes, _count, _table

    params = data["params"]
    out("")
    active = data["active_params_per_token"]
    out(
        f"parameters: {_count(params['total'])}"
        + (f" ({_count(active)} active per token)" if active != params["total"] else "")
    )
    out("weights:    " + ", ".join(f"{k} {_bytes(v)}" for k, v in data["weight_bytes"].items()))
    kv = data["kv_cache_bytes"]
    state = data["cache_state_bytes_per_sequence"]
    out(
        f"KV cache:   {_bytes(kv)} at context {at} x batch {batch} in {data['dtype']} "
        f"({_count(data['kv_cache_bytes_per_token'])} bytes per token as the mixers declare, "
        f"{_count(kv // (context * batch))} per token held on average"
        + (f"; {_bytes(state)} of fixed-size state per sequence)" if state else ")")
    )
    mem = data["training_memory"]
    out("")
    out(
        f"training memory, an estimate (AdamW; float32 weights, gradients and moments; {mem['dtype']} activations at "
        f"batch {mem['batch']} x {_count(mem['seq_len'])} tokens)"
    )
    rows = [(k.replace("_", " "), _bytes(mem[k])) for k in ("weights", "gradients", "adamw_states", "activations")]
    rows.append(("total", _bytes(mem["total"])))
    for line in _table(("PART", "BYTES"), rows, right=(1,), indent="  "):
        out(line)
    if mem["attention_matrix"]:  # measured: saved bytes quadratic in the length (an eager attention's [seq, seq])
        out(
            f"  + {_bytes(mem['attention_matrix'])} if the attention kernel keeps the [seq, seq] probabilities "
            "(eager/math)"
        )


def _roofline_lines(out, data: dict, batch: int, at: str) -> None:
    """The decode roofline: bytes read and FLOPs, their times at the bandwidth and peak, the bound and tokens/s."""
    from . import _bytes

    roof = data["decode_roofline"]
    out("")
    out(
        f"decode roofline (batch {batch}, context {at}, {data['dtype']}; {roof['bandwidth_bytes_per_s']:.3g} "
        f"bytes/s, {roof['peak_flops_per_s']:.3g} FLOP/s)"
    )
    out(f"  memory  {_bytes(roof['bytes'])} read -> {1e3 * roof['memory_s']:.3f} ms")
    out(f"  compute {_flops(roof['flops'])}FLOP -> {1e3 * roof['compute_s']:.3f} ms")
    out(
        f"  {roof['bound']}-bound: {1e3 * roof['seconds']:.3f} ms per step, "
        f"{roof['tokens_per_s']:,.1f} tokens/s at best"
    )

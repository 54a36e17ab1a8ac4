"""``modkit plan SPEC --gpus N --gpu-memory 80GB [--mfu 0.4] [--batch B] [--seq-len T] [--precision P] [--json]``: the parallel
layouts of a spec that fit a cluster, ranked by estimated step time, with the launch command of the best
(:mod:`modkit.parallel.planner`)."""

from __future__ import annotations

import argparse
import json
import re

_UNITS = {"": 1, "B": 1, "KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30}


def add_subcommands(subparsers) -> None:
    """Add ``modkit plan`` to the ``modkit`` subcommands (a command module of :mod:`modkit.cli`)."""
    p = subparsers.add_parser(
        "plan",
        help="parallel layouts that fit N GPUs: bytes per rank, estimated step time, launch command",
        description="For every layout that divides the model and the GPUs (data parallel with FSDP2/ZeRO-3 or "
        "ZeRO-1, tensor tp, pipeline pp, expert ep, context cp, microbatches, activation checkpointing), the bytes "
        "per rank of parameters, gradients, AdamW state and activations (float32 state; activations as saved under "
        "--precision, within a stated error) and an "
        "estimated step time from the declared FLOPs at --mfu and each collective's bytes at the stated bandwidths "
        "(no overlap); the layouts that fit, fastest first, and the launch command of the best. Computed on meta.",
    )
    p.add_argument("spec", metavar="SPEC", help="spec .json file")
    p.add_argument("--gpus", type=int, required=True, metavar="N", help="number of GPUs")
    p.add_argument("--gpu-memory", required=True, metavar="SIZE", help="memory per GPU: 80GB (1e9), 80GiB (2^30)")
    p.add_argument("--mfu", type=float, default=0.4, metavar="F", help="model FLOPs utilisation (default 0.4)")
    p.add_argument("--peak-flops", type=float, default=989e12, metavar="FLOPS", help="peak FLOP/s per GPU (989e12)")
    p.add_argument(
        "--bandwidth", type=float, default=400e9, metavar="BYTES_PER_S", help="NVLink per GPU (default 400e9: H800)"
    )
    p.add_argument(
        "--network-bandwidth", type=float, default=50e9, metavar="BYTES_PER_S", help="network per GPU (50e9: 400 Gb/s)"
    )
    p.add_argument("--gpus-per-node", type=int, default=8, metavar="G", help="GPUs per node (default 8)")
    p.add_argument("--batch", type=int, default=None, metavar="B", help="global batch in sequences (default: --gpus)")
    p.add_argument(
        "--seq-len", type=int, default=None, metavar="T", help="tokens per sequence (default min(4096, max))"
    )
    p.add_argument(
        "--precision",
        choices=("bfloat16", "float32"),
        default="bfloat16",
        help="modkit train's precision the activations are estimated for (default bfloat16: autocast)",
    )
    p.add_argument(
        "--attention-matrix",
        action="store_true",
        help="count the [T, T] matrices a math attention kernel keeps (default: a fused kernel, none)",
    )
    p.add_argument("--zero", default="3,1", metavar="S", help="ZeRO stages to try: 3 (FSDP2), 1, or 3,1 (default)")
    p.add_argument("--top", type=int, default=10, metavar="K", help="rows shown (default 10)")
    p.add_argument("--json", action="store_true", help="one JSON object: every layout's row")
    p.set_defaults(func=cmd_plan)


def parse_size(text: str) -> float:
    """``"80GB"`` -> 80e9, ``"80GiB"`` -> 80 * 2^30, ``"8.5e10"`` -> 8.5e10 bytes.

    Raises:
        UserError: not a positive size with one of the units B, KB, MB, GB, TB, KiB, MiB, GiB.
    """
    from . import UserError

    m = re.fullmatch(r"\s*([0-9.]+(?:e[0-9]+)?)\s*([A-Za-z]*)\s*", text)
    unit = m.group(2).upper() if m else None
    if m is None or unit not in _UNITS or float(m.group(1)) <= 0:
        raise UserError(f"--gpu-memory {text!r} is not a size; write e.g. 80GB (80e9 bytes) or 80GiB (80 x 2^30)")
    return float(m.group(1)) * _UNITS[unit]


def cmd_plan(args: argparse.Namespace) -> int:
    """Print the ranked layouts (or ``--json``).

    Raises:
        UserError: a count out of range, a bad size or ZeRO list, or no layout dividing the batch and GPUs.
        SpecError: an invalid spec.
    """
    import modkit

    from . import UserError, _bytes, _registry, _spec_path, _table
    from modkit.parallel.planner import ACTIVATION_ERROR, Cluster, Planner, launch_command

    memory = parse_size(args.gpu_memory)
    for name in ("gpus", "top", "gpus_per_node"):
        if getattr(args, name) < 1:
            raise UserError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    zero = tuple(int(z) for z in args.zero.split(",") if z.strip() in ("1", "3"))
    if not zero or len(zero) != len(args.zero.split(",")):
        raise UserError(f"--zero {args.zero!r}: give 3, 1 or 3,1")
    reg = _registry()
    spec = modkit.load_spec(_spec_path(args.spec), registry=reg)
    seq = args.seq_len or min(4096, spec.max_seq_len)
    batch = args.batch or args.gpus
    if seq < 1 or batch < 1:
        raise UserError(f"--batch and --seq-len must be >= 1, got {batch} and {seq}")
    cluster = Cluster(
        gpus=args.gpus,
        gpu_memory=memory,
        mfu=args.mfu,
        peak_flops=args.peak_flops,
        nvlink_bandwidth=args.bandwidth,
        network_bandwidth=args.network_bandwidth,
        gpus_per_node=args.gpus_per_node,
    )
    planner = Planner(
        spec, batch=batch, seq_len=seq, registry=reg, precision=args.precision, attention_matrix=args.attention_matrix
    )
    rows = planner.plan(cluster, zero=zero)
    if not rows:
        raise UserError(f"no layout divides --gpus {args.gpus} and --batch {batch}; make the batch a multiple of them")
    fit = [r for r in rows if r.fits]
    best = launch_command(fit[0].layout, args.spec, cluster) if fit else None
    if args.json:
        print(
            json.dumps(
                {
                    "spec": args.spec,
                    "batch": batch,
                    "seq_len": seq,
                    "precision": args.precision,
                    "activation_error": ACTIVATION_ERROR,
                    "best": best,
                    "rows": [r.as_dict() for r in rows],
                }
            )
        )
        return 0
    print(
        f"{spec.name or args.spec}: {len(rows)} layouts of {args.gpus} GPUs x {_bytes(memory)}, batch {batch} x "
        f"{seq} tokens, MFU {args.mfu:g}; {len(fit)} fit"
    )
    print(
        f"  activations: {args.precision} saved bytes, within {ACTIVATION_ERROR:.0%} at tp = cp = 1 (low under tp, "
        "no gathered keys/values under cp)"
    )
    head = ("LAYOUT", "PARAMS", "GRADS", "OPTIMIZER", "ACTIVATIONS", "TOTAL", "KV CACHE", "STEP S", "COMM S")
    shown = (fit or rows)[: args.top]
    table = [
        (
            r.layout.name(),
            *(_bytes(x) for x in (r.params, r.grads, r.optimizer, r.activations, r.total, r.kv_cache)),
            f"{r.step_time:.2f}",
            f"{r.comm_time:.2f}",
        )
        for r in shown
    ]
    for line in _table(head, table, right=tuple(range(1, 9)), indent="  "):
        print(line)
    print(f"best: {best}" if best else "none fits: the smallest total is shown first; add GPUs or memory")
    return 0

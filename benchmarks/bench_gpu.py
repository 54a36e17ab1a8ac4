#!/usr/bin/env python
"""GPU benchmark: modkit against transformers in bfloat16 on a larger llama-like model; one command.

Same workloads, formulas and report as ``bench_cpu.py`` (see ``benchmarks/_bench.py``), on ``cuda`` in bfloat16:
d_model 2048, 16 layers, 16 heads / 4 KV heads, d_ff 5632, vocab 32000 (about 1.1B parameters); prefill
``[8, 1024]``; decode batch 1, 128-token prompt, 256 greedy tokens; MoE 8 experts top-2 with d_model 2048 /
d_ff 5632 on 16384 tokens. Timings synchronise the device around every measured call. Usage (where a GPU is
available; nothing here runs on the CPU)::

    .venv/bin/python benchmarks/bench_gpu.py                    # writes benchmarks/results-gpu.md
    .venv/bin/python benchmarks/bench_gpu.py --only decode --repeats 3

Greedy bfloat16 generations of the two libraries may part after a near tie (different but equally valid
reduction orders); the report says where.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import torch  # noqa: E402

import _bench as B  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], allow_abbrev=False)
    p.add_argument("--repeats", type=int, default=5, help="timed runs per measurement (median reported; default 5)")
    p.add_argument("--only", choices=["prefill", "decode", "moe"], action="append", help="run only these workloads")
    p.add_argument("--no-compile", action="store_true", help="skip the torch.compile measurements")
    p.add_argument("--no-profile", action="store_true", help="skip the torch.profiler tables")
    p.add_argument("--device", default="cuda", help="CUDA device (default cuda)")
    p.add_argument(
        "-o",
        "--output",
        default=str(HERE / "results-gpu.md"),
        help="markdown report (default benchmarks/results-gpu.md)",
    )
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_gpu.py: no CUDA device here; run benchmarks/bench_cpu.py instead", file=sys.stderr)
        return 1
    torch.backends.cuda.matmul.allow_tf32 = True
    cfg = B.Config(
        d_model=2048,
        n_layers=16,
        n_heads=16,
        n_kv_heads=4,
        d_ff=5632,
        vocab=32000,
        dtype=torch.bfloat16,
        device=args.device,
        prefill_batch=8,
        prefill_seq=1024,
        prompt=128,
        new=256,
        moe_tokens=16384,
        repeats=args.repeats,
        compile=not args.no_compile,
        compile_hf=not args.no_compile,
        profile=not args.no_profile,
    )
    B.run_workloads(
        cfg,
        set(args.only or ["prefill", "decode", "moe"]),
        "GPU benchmark: modkit vs transformers (bfloat16)",
        "bench_gpu.py",
        argv,
        Path(args.output),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

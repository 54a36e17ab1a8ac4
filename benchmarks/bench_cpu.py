#!/usr/bin/env python
"""CPU benchmark: modkit against transformers, same weights, same run; prints ratios, writes ``results.md``.

Reference: llama-like, d_model 512, 8 layers, 8 heads / 2 KV heads, d_ff 1408, vocab 32000, float32 on the CPU.
Workloads, formulas and sources are described in ``benchmarks/_bench.py``. Targets:

* prefill ``[4, 256]``: modkit time / transformers time <= 1.0 eager, <= 0.85 with ``torch.compile``;
* decode (batch 1, 32-token prompt, 128 greedy tokens): modkit tokens/s / transformers ``generate`` tokens/s
  >= 1.8 eager, >= 2.5 compiled; decode tokens/s >= 0.5 of the memory-bandwidth roofline; the decode step compiles
  with ``fullgraph=True``, zero graph breaks and one graph for every step;
* MoE (8 experts top-2 SwiGLU, 4096 tokens) against ``MixtralSparseMoeBlock``: not slower.

This is a script, not a timed test: absolute figures depend on the machine and its load (recorded in the report);
the ratios are measured in the same run, interleaved. Usage::

    .venv/bin/python benchmarks/bench_cpu.py                  # full run, writes benchmarks/results.md
    .venv/bin/python benchmarks/bench_cpu.py --quick          # fewer repeats, smaller decode, no compile (a smoke run)
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
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's choice)")
    p.add_argument("--only", choices=["prefill", "decode", "moe"], action="append", help="run only these workloads")
    p.add_argument("--no-compile", action="store_true", help="skip the torch.compile measurements")
    p.add_argument(
        "--no-compile-hf", action="store_true", help="do not compile transformers for the prefill comparison"
    )
    p.add_argument("--no-profile", action="store_true", help="skip the torch.profiler tables")
    p.add_argument("--quick", action="store_true", help="smoke run: 2 repeats, 32 new tokens, no compile, no profiles")
    p.add_argument(
        "-o", "--output", default=str(HERE / "results.md"), help="markdown report (default benchmarks/results.md)"
    )
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    cfg = B.Config(
        repeats=args.repeats,
        compile=not args.no_compile,
        compile_hf=not args.no_compile_hf,
        profile=not args.no_profile,
    )
    if args.quick:
        cfg.repeats, cfg.new, cfg.compile, cfg.profile = 2, 32, False, False
    B.run_workloads(
        cfg,
        set(args.only or ["prefill", "decode", "moe"]),
        "CPU benchmark: modkit vs transformers",
        "bench_cpu.py",
        argv,
        Path(args.output),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python
"""How close to its bandwidth roofline can an MLA decode step get on this CPU? The parts of ``bench_mla.py``'s step,
timed alone, against the limits of the machine measured in the same run.

One thread, float32, batch 1, DeepSeek-V3's per-head sizes with 8 heads (``bench_mla.py``'s defaults): the layer's
weights (every matrix of ``mla``, as ``[out, in]``) and a latent cache ``[context, kv_lora_rank + qk_rope_head_dim]``.
Each part is timed in this thread's CPU time (median of ``--repeats``), twice: **warm** (run just before, so its data
sits in the caches) and **cold** (after a 128 MiB copy has pushed everything out, as in a step, where the other
parts' reads come between two uses). The parts:

* ``read cache`` / ``read weights``: a plain ``sum`` of the same bytes, the fastest a kernel could stream them;
* ``scores`` ``[h, 576] x [576, kv]`` and ``weighted sum`` ``[h, kv] x [kv, 576]``: the two products over the cache,
  as ``modkit.nn.onednn`` computes them (oneDNN);
* ``weight GEMVs``: ``F.linear`` of one row through every weight matrix (MKL), as the step's projections, with the
  weights row-major and column-major (``modkit generate``'s layout on a CPU).

Limits (same run): the copy bandwidth of a 512 MiB ``copy_`` (read + write) and the GEMM rate, the faster of MKL's
``matmul`` and oneDNN's on a 1024 square. From them:

* the **roofline** step time: the step's bytes over the copy bandwidth (``bench_mla.py``'s);
* the step time at 0.6 of it (``1 / 0.6`` of the roofline);
* the **ideal floor**: the products' FLOPs at the GEMM rate (their cache reads hidden under the arithmetic) plus the
  weights at the copy bandwidth: what perfect kernels that never wait could do, ignoring everything else a step does;
* the **library floor**: the cold products plus the cold GEMVs (the faster layout): the kernels this step calls, with
  nothing between.

A script, not a test: the absolute figures move with the load; the fractions are of limits measured beside them.

    .venv/bin/python benchmarks/bench_mla_bound.py --context 4096
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_mla import add_shape_arguments  # noqa: E402
from modkit.nn.onednn import _ONEDNN, _onednn_scores, _onednn_sum  # noqa: E402


def _median_ms(fn, repeats: int, flush=None) -> float:
    """Median thread CPU milliseconds of ``fn()``; ``flush()`` (untimed) before each call when given, else one
    untimed call first so that the timed ones find their data warm."""
    times = []
    if flush is None:
        fn()
    for _ in range(repeats):
        if flush is not None:
            flush()
        start = time.thread_time()
        fn()
        times.append(time.thread_time() - start)
    return 1e3 * statistics.median(times)


def _weights(args) -> list[torch.Tensor]:
    """Every weight matrix of the ``mla`` layer ``bench_mla.py`` builds, ``[out, in]`` (norm gains left out: bytes
    only of the matrices, which are all but 0.1% of them)."""
    h, qk = args.heads, args.nope + args.rope
    shapes = [
        (args.q_lora, args.d_model),  # q_a_proj
        (h * qk, args.q_lora),  # q_b_proj
        (args.kv_lora + args.rope, args.d_model),  # kv_a_proj (latent and rotated key)
        (h * (args.nope + args.v), args.kv_lora),  # kv_b_proj (W_UK and W_UV, read by the absorbed form)
        (args.d_model, h * args.v),  # o_proj
    ]
    return [torch.randn(s) * 0.02 for s in shapes]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], allow_abbrev=False)
    p.add_argument("--context", type=int, default=4096)
    p.add_argument("--repeats", type=int, default=30)
    add_shape_arguments(p)
    args = p.parse_args(argv)
    if not _ONEDNN:
        print("this torch build has no oneDNN matmul: nothing to measure")
        return 1
    torch.set_num_threads(1)
    torch.manual_seed(0)
    width = args.kv_lora + args.rope
    cache, q = torch.randn(args.context, width), torch.randn(args.heads, width)
    probs = torch.softmax(torch.randn(args.heads, args.context), -1)
    weights = _weights(args)
    columns = [w.t().contiguous().t() for w in weights]  # the same values, stored [in, out]
    xs = {w.shape[1]: torch.randn(1, w.shape[1]) for w in weights}
    big, dst = torch.ones(128 * 2**20), torch.empty(128 * 2**20)
    flush_src, flush_dst = torch.ones(32 * 2**20), torch.empty(32 * 2**20)
    a, b = torch.randn(1024, 1024), torch.randn(1024, 1024)

    def flush():
        flush_dst.copy_(flush_src)  # 128 MiB read and 128 MiB written: far beyond L2 and L3

    parts = {
        "read cache": lambda: cache.sum(),
        "scores": lambda: _onednn_scores(q, cache),
        "weighted sum": lambda: _onednn_sum(probs, cache),
        "read weights": lambda: [w.sum() for w in weights],
        "weight GEMVs": lambda: [F.linear(xs[w.shape[1]], w) for w in weights],
        "GEMVs col-maj": lambda: [F.linear(xs[w.shape[1]], w) for w in columns],
    }
    warm = {k: _median_ms(fn, args.repeats) for k, fn in parts.items()}
    cold = {k: _median_ms(fn, args.repeats, flush) for k, fn in parts.items()}
    copy_ms = _median_ms(lambda: dst.copy_(big), 5)
    gemm_ms = min(_median_ms(lambda: a @ b, 10), _median_ms(lambda: _onednn_scores(a, b), 10))
    bandwidth, rate = 2 * big.numel() * 4 / (copy_ms / 1e3), 2 * 1024**3 / (gemm_ms / 1e3)  # bytes/s, FLOP/s

    cache_bytes, weight_bytes = cache.numel() * 4, sum(w.numel() for w in weights) * 4
    product_flops = 2 * args.heads * args.context * (width + args.kv_lora)
    roof = 1e3 * (cache_bytes + weight_bytes) / bandwidth
    ideal = 1e3 * product_flops / rate + 1e3 * weight_bytes / bandwidth
    gemv = min(("weight GEMVs", "GEMVs col-maj"), key=cold.get)  # the faster layout
    library = cold["scores"] + cold["weighted sum"] + cold[gemv]
    library_warm = warm["scores"] + warm["weighted sum"] + warm[gemv]
    print(
        f"MLA decode bound, context {args.context}, {args.heads} heads, float32, 1 thread; torch {torch.__version__}; "
        f"load average {os.getloadavg()[0]:.1f}\n"
        f"  cache {cache_bytes / 1e6:.1f} MB, weights {weight_bytes / 1e6:.1f} MB, products {product_flops / 1e6:.1f} "
        f"MFLOP; copy bandwidth {bandwidth / 1e9:.1f} GB/s, GEMM {rate / 1e9:.0f} GFLOP/s"
    )
    for k in parts:
        nbytes = cache_bytes if k in ("read cache", "scores", "weighted sum") else weight_bytes
        print(
            f"  {k:<13} warm {warm[k]:.3f} ms ({nbytes / warm[k] / 1e6:.1f} GB/s)   cold {cold[k]:.3f} ms "
            f"({nbytes / cold[k] / 1e6:.1f} GB/s)"
        )
    print(
        f"  roofline {roof:.3f} ms; 0.6 of it allows {roof / 0.6:.3f} ms a step\n"
        f"  ideal floor {ideal:.3f} ms = {roof / ideal:.2f} of the roofline (products at the GEMM rate, weights at "
        f"the copy bandwidth, nothing else)\n"
        f"  library floor {library:.3f} ms = {roof / library:.2f} of the roofline (cold scores + weighted sum + "
        f"{gemv}, nothing else); warm {library_warm:.3f} ms = {roof / library_warm:.2f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

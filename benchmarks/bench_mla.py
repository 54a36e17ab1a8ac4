#!/usr/bin/env python
"""MLA decode step: modkit's ``mla`` (absorbed: attends over the cached latent) against transformers'
``DeepseekV3Attention`` (which caches the latent too, but expands per-head keys and values of the whole context at
every step), same weights, same run, interleaved.

The attention layer alone, batch 1, float32 on the CPU, at contexts 1K and 4K (``--contexts``), modkit's weights stored
column-major as ``modkit generate`` stores them on a CPU (``--row-major`` keeps them as built): each side's cache is
prefilled with the same ``context`` tokens, then decode steps of one token are timed (median over ``--repeats``
rounds of ``--steps`` steps, the sides alternating round by round). With ``--compile`` (the default; ``--no-compile``
skips it) modkit's step is also timed under ``torch.compile(fullgraph=True, dynamic=False)`` (the cache update and
the layer, as ``modkit generate --compile`` traces them; compiled in the warm-up, not timed), as a third side with
its own roofline fractions. Sizes (``--heads`` etc.) default to
DeepSeek-V3's per-head sizes with fewer heads: d_model 1024, 8 heads, q_lora_rank 384, kv_lora_rank 512,
qk_nope_head_dim 128, qk_rope_head_dim 64, v_head_dim 128. Prints the seconds per step of each and the ratio
transformers / modkit (above 1: modkit is faster), and the largest difference of the first decoded outputs.

**Roofline** (as ``bench_cpu.py``): the bytes one modkit step must read (the layer's weights and the cached latent
and rotated key of the context, float32) over the bandwidth of a large tensor copy (read + write, 512 MiB) measured
in the same run, its rounds interleaved with the steps'; the ratio roofline time / step time (1 = at the
bandwidth limit). Also the compute floor: the step's matrix-product FLOPs (its projections, the scores against the
latent and the rotated key, the weighted sum of latents) over the FLOP/s of a 1024-square product measured in the
same run, the faster of ``matmul`` (MKL) and oneDNN's (AVX-512 on a CPU where MKL takes its AVX2 path); a step can
be no faster than the larger of the two. Both in wall time and in this thread's CPU time (on a
loaded machine the wall time of every side, the copy included, stretches with the load).

A script, not a test: on a shared machine absolute figures move with the load, the ratios are measured in one
process.

    .venv/bin/python benchmarks/bench_mla.py --threads 1
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import modkit  # noqa: E402
from modkit import AttentionInputs  # noqa: E402
from modkit.inference.generate import column_major_linears  # noqa: E402
from modkit.nn.onednn import _ONEDNN  # noqa: E402


def _onednn_mm(a, b):
    """``a @ bᵀ`` through oneDNN's matmul: the other GEMM library of a CPU build, often the faster (AVX-512) one."""
    return torch.ops.mkldnn._linear_pointwise(a, b, None, "none", [], "")


def build_pair(args, max_len: int):
    """``(modkit model, its mla, its rope, transformers attention, transformers rotary)`` with the same weights."""
    from transformers.models.deepseek_v3.configuration_deepseek_v3 import DeepseekV3Config
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3Attention, DeepseekV3RotaryEmbedding

    cfg = DeepseekV3Config(
        hidden_size=args.d_model,
        num_attention_heads=args.heads,
        num_key_value_heads=args.heads,
        q_lora_rank=args.q_lora,
        kv_lora_rank=args.kv_lora,
        qk_nope_head_dim=args.nope,
        qk_rope_head_dim=args.rope,
        v_head_dim=args.v,
        rope_interleave=True,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        max_position_embeddings=max_len,
        num_hidden_layers=1,
        vocab_size=64,
    )
    cfg._attn_implementation = "sdpa"  # transformers' fastest CPU path
    torch.manual_seed(0)
    hf = DeepseekV3Attention(cfg, layer_idx=0).eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.normal_(0, 0.02) if p.dim() > 1 else p.fill_(1.0)
    spec = {
        "schema_version": 1,
        "vocab_size": 64,
        "d_model": args.d_model,
        "n_layers": 1,
        "max_seq_len": max_len,
        "position": {"type": "rope", "theta": 10000.0, "layout": "interleaved"},
        "block": {
            "attention": {
                "type": "mla",
                "n_heads": args.heads,
                "q_lora_rank": args.q_lora,
                "kv_lora_rank": args.kv_lora,
                "qk_nope_head_dim": args.nope,
                "qk_rope_head_dim": args.rope,
                "v_head_dim": args.v,
                "latent_norm": {"type": "rmsnorm", "eps": 1e-6},
            },
            "ffn": {"type": "swiglu", "d_ff": 64},
            "norm": {"type": "rmsnorm"},
            "placement": {"type": "pre"},
        },
    }
    model = modkit.build(spec, seed=0).eval()
    mla = model.layers[0].attention
    mla.load_state_dict(hf.state_dict())
    return model, mla, model.positions[model.layer_position[0]], hf, DeepseekV3RotaryEmbedding(cfg)


def _clocks(fn) -> tuple[float, float]:
    """``(wall seconds, this thread's CPU seconds)`` of one call."""
    wall, cpu = time.perf_counter(), time.thread_time()
    fn()
    return time.perf_counter() - wall, time.thread_time() - cpu


def step_cost(args, mla, context: int) -> tuple[int, int]:
    """``(bytes read, matrix-product FLOPs)`` of one decode step of ``mla`` over ``context`` cached tokens, float32:
    every weight once, the cached latent and rotated key once; FLOPs of the projections (2 per weight), the scores
    against the latent and the rotated key and the weighted sum of latents."""
    params = sum(p.numel() for p in mla.parameters())
    per_token = args.kv_lora + args.rope
    flops = 2 * params + 2 * args.heads * (per_token + args.kv_lora) * context
    return 4 * (params + context * per_token), flops


def add_shape_arguments(p: argparse.ArgumentParser) -> None:
    """The layer's sizes (DeepSeek-V3's per head, 8 heads), shared with ``bench_mla_bound.py``."""
    p.add_argument("--d-model", dest="d_model", type=int, default=1024)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--q-lora", dest="q_lora", type=int, default=384)
    p.add_argument("--kv-lora", dest="kv_lora", type=int, default=512)
    p.add_argument("--nope", type=int, default=128)
    p.add_argument("--rope", type=int, default=64)
    p.add_argument("--v", type=int, default=128)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], allow_abbrev=False)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--contexts", type=int, nargs="+", default=[1024, 4096])
    p.add_argument("--steps", type=int, default=8, help="decode steps per timed round")
    p.add_argument("--repeats", type=int, default=5, help="timed rounds per side (median reported)")
    p.add_argument("--no-compile", dest="compile", action="store_false", help="skip the torch.compile side")
    p.add_argument(
        "--row-major",
        action="store_true",
        help="keep modkit's weights row-major (default: column-major, as `modkit generate` stores them on a CPU)",
    )
    add_shape_arguments(p)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    from transformers import DynamicCache

    print(
        f"MLA decode step, batch 1, float32, {args.threads} thread(s); d_model {args.d_model}, {args.heads} heads, "
        f"q_lora {args.q_lora}, kv_lora {args.kv_lora}, nope {args.nope}, rope {args.rope}, v {args.v}; "
        f"torch {torch.__version__}; load average at start {os.getloadavg()[0]:.1f} ({os.cpu_count()} CPUs)"
    )
    for context in args.contexts:
        max_len = context + 3 + args.steps * (2 * args.repeats + 1)  # the eager steps, the compiled ones, warm-ups
        model, mla, rope, hf, rotary = build_pair(args, max_len)
        if not args.row_major:  # the layout generate() decodes with on a CPU (its weight GEMVs stream faster)
            column_major_linears(model)
        gen = torch.Generator().manual_seed(context)
        prompt = torch.randn(1, context, args.d_model, generator=gen)
        ours_cache, hf_cache = model.new_cache(1, max_len), DynamicCache(config=hf.config)

        def ours_step(x):
            positions, mask = ours_cache.prepare(1, x.shape[1])
            return mla(
                x, AttentionInputs(positions=positions, token_mask=mask, position=rope, cache=ours_cache.layers[0])
            )

        def hf_step(x):
            n = hf_cache.get_seq_length()
            ids = torch.arange(n, n + x.shape[1])[None]
            mask = None if x.shape[1] == 1 else torch.full((x.shape[1], x.shape[1]), float("-inf")).triu(1)[None, None]
            return hf(x, rotary(x, ids), mask, cache=hf_cache)[0]

        with torch.no_grad():
            ours_step(prompt)
            hf_step(prompt)
            x = torch.randn(1, 1, args.d_model, generator=gen)
            diff = (ours_step(x) - hf_step(x)).abs().max().item()  # the first decoded token, both sides
            steps = [torch.randn(1, 1, args.d_model, generator=gen) for _ in range(args.steps)]
            compiled = torch.compile(ours_step, fullgraph=True, dynamic=False) if args.compile else None
            if compiled is not None:  # compiled here, in the warm-up (two calls: the second must not recompile)
                start = time.perf_counter()
                compiled(steps[0]), compiled(steps[1])
                print(f"\ncontext {context}: torch.compile of the step took {time.perf_counter() - start:.1f} s")
            src = torch.ones(128 * 2**20)  # 512 MiB: far beyond the caches
            dst, a, b = torch.empty_like(src), torch.randn(1024, 1024), torch.randn(1024, 1024)
            sides = {
                "modkit": lambda: [ours_step(t) for t in steps],
                **({"compiled": lambda: [compiled(t) for t in steps]} if compiled is not None else {}),
                "transformers": lambda: [hf_step(t) for t in steps],
                "copy": lambda: dst.copy_(src),
                "matmul": lambda: [a @ b for _ in range(8)],
                **({"onednn": lambda: [_onednn_mm(a, b) for _ in range(8)]} if _ONEDNN else {}),
            }
            wall, cpu = {k: [] for k in sides}, {k: [] for k in sides}
            for _ in range(args.repeats):
                for name, fn in sides.items():
                    w, c = _clocks(fn)
                    wall[name].append(w)
                    cpu[name].append(c)
        per = {"modkit": args.steps, "compiled": args.steps, "transformers": args.steps, "copy": 1, "matmul": 8}
        per["onednn"] = 8
        nbytes, flops = step_cost(args, mla, context)
        print(f"\ncontext {context}: {nbytes / 1e6:.1f} MB read and {flops / 1e6:.1f} MFLOP per modkit step")
        for clock, t in (("wall", wall), ("CPU", cpu)):
            m = {k: statistics.median(v) / per[k] for k, v in t.items()}
            # the compute floor at the faster of the two GEMM libraries on this CPU (MKL and oneDNN)
            bw, fps = 2 * src.numel() * 4 / m["copy"], 2 * 1024**3 / min(m["matmul"], m.get("onednn", m["matmul"]))
            roof, floor = nbytes / bw, max(nbytes / bw, flops / fps)
            print(
                f"  {clock}: modkit {1e3 * m['modkit']:.3f} ms/step, transformers {1e3 * m['transformers']:.3f} "
                f"ms/step, ratio transformers / modkit {m['transformers'] / m['modkit']:.2f}; copy bandwidth "
                f"{bw / 1e9:.2f} GB/s, bandwidth roofline {1e3 * roof:.3f} ms = {roof / m['modkit']:.2f} of the step; "
                f"GEMM {fps / 1e9:.1f} GFLOP/s, compute floor {1e3 * flops / fps:.3f} ms; "
                f"max(bandwidth, compute) = {floor / m['modkit']:.2f} of the step"
            )
            if "compiled" in m:
                print(
                    f"  {clock}: modkit compiled {1e3 * m['compiled']:.3f} ms/step = {roof / m['compiled']:.2f} of the "
                    f"bandwidth roofline, max(bandwidth, compute) = {floor / m['compiled']:.2f}; ratio transformers / "
                    f"modkit compiled {m['transformers'] / m['compiled']:.2f}"
                )
        print(
            f"  first step max |Δ| = {diff:.2e}; cache bytes per token: modkit "
            f"{mla.cache_spec().bytes_per_token('float32')}; load average {os.getloadavg()[0]:.1f}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

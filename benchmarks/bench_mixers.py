#!/usr/bin/env python
"""Recurrent token mixers: forward + backward against transformers' PyTorch fallback of the same layer and against
causal attention of the same width; decode step time against the context.

1. **Forward + backward** of one mixer layer alone (``[1, T, d_model]`` float32 on the CPU, ``out.sum()``
   backpropagated to the input and every weight) at ``T`` = 256, 1K and 4K (``--lengths``): modkit's ``mamba2``,
   ``gated_deltanet`` and ``mamba`` (their chunked forms; ``mlstm`` too with ``--mixers``) against transformers'
   ``Mamba2Mixer``, ``Qwen3NextGatedDeltaNet`` and ``JambaMambaMixer`` (``xLSTMLayer``) with the kernel packages
   made unimportable (their ``torch_forward`` / ``torch_chunk_gated_delta_rule`` / ``slow_forward`` paths; xLSTM's
   native chunkwise kernel), loaded with the same weights, and
   against modkit's causal ``mha`` of the same width (heads of 64, SDPA). Median over ``--repeats`` rounds, the
   sides alternating; ratios transformers / modkit and attention / modkit (above 1: the modkit mixer is faster), in
   wall time and in the thread's CPU time (on a loaded machine the CPU time is what the load does not inflate).
2. **Chunk size** (``--chunk-sizes``): forward + backward of modkit's ``mamba2`` and ``gated_deltanet`` at each
   length with each chunk size, interleaved, CPU time; the fastest per length. The configs' default
   ``chunk_size`` is set from this table (their docstrings cite it; ``results_mixers.md``).
3. **Decode step**: a one-layer model with each mixer (and the attention), its cache prefilled in chunks of 1,024
   tokens to a context of 1K, 4K and 16K (``--contexts``), then one-token steps timed (median of ``--repeats``
   rounds of ``--steps``). A recurrent mixer's step reads a fixed-size state, so its time stays flat; the
   attention's grows with the keys it reads.

A script, not a test: absolute figures move with the machine's load (printed); each ratio is measured in one run.

    .venv/bin/python benchmarks/bench_mixers.py --threads 1
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
sys.path.insert(0, str(ROOT / "tests"))

from hf_fallback import force_torch_fallback  # noqa: E402

force_torch_fallback()

import modkit  # noqa: E402
from modkit import AttentionInputs  # noqa: E402


def _spec(d: int, mixer: dict, max_len: int) -> dict:
    return {
        "schema_version": 1,
        "vocab_size": 256,
        "d_model": d,
        "n_layers": 1,
        "max_seq_len": max_len,
        "position": {"type": "none"},
        "block": {"mixer": mixer, "ffn": None, "norm": {"type": "rmsnorm"}, "placement": {"type": "pre"}},
    }


def mixers(d: int) -> dict:
    """``{name: modkit mixer config}`` at width ``d``: Mamba-2 (heads of 64, state 128, expand 2, 1 group),
    Gated DeltaNet (Qwen3-Next's head sizes 128, d/128 key heads, twice as many value heads), Mamba-1 (state 16,
    expand 2), the mLSTM (xLSTM 7B's widths: queries and keys d/2, values d, heads of 64 / 128), and multi-head
    attention with heads of 64."""
    return {
        "mamba2": {"type": "mamba2", "d_state": 128, "head_dim": 64, "expand": 2, "n_groups": 1},
        "gated_deltanet": {
            "type": "gated_deltanet",
            "n_heads": max(1, d // 128),
            "n_value_heads": max(2, d // 64),
            "key_head_dim": 128,
            "value_head_dim": 128,
        },
        "mamba": {"type": "mamba", "d_state": 16, "expand": 2, "chunk_size": 64, "inner_norm": {"type": "rmsnorm"}},
        "mlstm": {"type": "mlstm", "n_heads": max(1, d // 128)},
        "attention": {"type": "mha", "n_heads": d // 64},
    }


class _FirstOutput(torch.nn.Module):
    """``layer(x)[0]``: the output of a layer that returns ``(output, state)`` (transformers' ``xLSTMLayer``)."""

    def __init__(self, layer: torch.nn.Module):
        super().__init__()
        self.layer = layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x)[0]


def reference(name: str, d: int, ours: torch.nn.Module):
    """transformers' layer for ``name`` with ``ours``' weights (``None`` for the attention)."""
    import transformers
    from transformers.models.jamba.modeling_jamba import JambaMambaMixer
    from transformers.models.mamba2.modeling_mamba2 import Mamba2Mixer
    from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextGatedDeltaNet

    if name == "mamba2":
        cfg = transformers.Mamba2Config(
            hidden_size=d, num_heads=2 * d // 64, head_dim=64, state_size=128, n_groups=1, expand=2, chunk_size=64
        )
        hf = Mamba2Mixer(cfg, 0)
        hf.load_state_dict(ours.state_dict())
    elif name == "gated_deltanet":
        nk, nv = ours.n_heads, ours.n_value_heads
        cfg = transformers.Qwen3NextConfig(
            hidden_size=d,
            linear_num_key_heads=nk,
            linear_num_value_heads=nv,
            linear_key_head_dim=128,
            linear_value_head_dim=128,
            num_hidden_layers=1,
        )
        hf = Qwen3NextGatedDeltaNet(cfg, 0)
        r, dk, dv = nv // nk, 128, 128
        sd = ours.state_dict()
        per = lambda t, w: t.view(nk, w, d)  # noqa: E731
        qkvz = torch.cat(
            [
                per(sd["q_proj.weight"], dk),
                per(sd["k_proj.weight"], dk),
                per(sd["v_proj.weight"], r * dv),
                per(sd["g_proj.weight"], r * dv),
            ],
            1,
        ).reshape(-1, d)
        ba = torch.cat([per(sd["b_proj.weight"], r), per(sd["a_proj.weight"], r)], 1).reshape(-1, d)
        hf.load_state_dict(
            {
                "in_proj_qkvz.weight": qkvz,
                "in_proj_ba.weight": ba,
                "conv1d.weight": sd["conv1d.weight"],
                "dt_bias": sd["dt_bias"],
                "A_log": sd["A_log"],
                "norm.weight": sd["norm.weight"],
                "out_proj.weight": sd["out_proj.weight"],
            }
        )
    elif name == "mamba":
        cfg = transformers.JambaConfig(
            hidden_size=d,
            mamba_d_state=16,
            mamba_d_conv=4,
            mamba_expand=2,
            num_hidden_layers=1,
            use_mamba_kernels=False,
        )
        hf = JambaMambaMixer(cfg, 0)
        names = {"dt_norm": "dt_layernorm", "b_norm": "b_layernorm", "c_norm": "c_layernorm"}
        hf.load_state_dict(
            {
                names.get(k.split(".")[0], k.split(".")[0]) + k[len(k.split(".")[0]) :]: v
                for k, v in ours.state_dict().items()
            }
        )
    elif name == "mlstm":  # xLSTMLayer returns (output, state): the output alone, as the other layers return
        from transformers.models.xlstm.modeling_xlstm import xLSTMLayer

        cfg = transformers.xLSTMConfig(hidden_size=d, num_heads=ours.n_heads, chunk_size=ours.chunk_size)
        hf = _FirstOutput(xLSTMLayer(cfg))
        hf.layer.load_state_dict(ours.state_dict())
    else:
        return None
    return hf.train()


def _time(fn, repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        out.append(time.perf_counter() - start)
    return out


def _both(fn) -> tuple[float, float]:
    """``(wall seconds, this thread's CPU seconds)`` of one call."""
    wall, cpu = time.perf_counter(), time.thread_time()
    fn()
    return time.perf_counter() - wall, time.thread_time() - cpu


def forward_backward(args) -> None:
    d = args.d_model
    print(f"\n## forward + backward, batch 1, float32, d_model {d} (median of {args.repeats}; seconds)\n")
    print(
        "| mixer | T | modkit | transformers | attention | transformers / modkit | attention / modkit | "
        "modkit CPU s | transformers / modkit (CPU) | max abs diff |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    configs = mixers(d)
    attn_model = modkit.build(_spec(d, configs["attention"], max(args.lengths)), seed=0)
    attn = attn_model.layers[0].attention.train()
    for name in args.mixers:
        model = modkit.build(_spec(d, configs[name], max(args.lengths)), seed=0)
        ours = model.layers[0].attention.train()
        hf = reference(name, d, ours)
        for T in args.lengths:
            x = torch.randn(1, T, d, generator=torch.Generator().manual_seed(T)).requires_grad_()
            inputs = AttentionInputs(positions=torch.arange(T)[None])
            with torch.no_grad():
                diff = (ours(x, inputs) - hf(x)).abs().max().item()

            def run(f):
                return lambda: f().sum().backward()

            sides = {
                "modkit": run(lambda: ours(x, inputs)),
                "transformers": run(lambda: hf(x)),
                "attention": run(lambda: attn(x, inputs)),
            }
            for fn in sides.values():  # warm-up
                fn()
            wall, cpu = {k: [] for k in sides}, {k: [] for k in sides}
            for _ in range(args.repeats):
                for k, fn in sides.items():
                    w, c = _both(fn)
                    wall[k].append(w)
                    cpu[k].append(c)
            m = {k: statistics.median(v) for k, v in wall.items()}
            mc = {k: statistics.median(v) for k, v in cpu.items()}
            print(
                f"| {name} | {T} | {m['modkit']:.4f} | {m['transformers']:.4f} | {m['attention']:.4f} | "
                f"{m['transformers'] / m['modkit']:.2f} | {m['attention'] / m['modkit']:.2f} | {mc['modkit']:.4f} | "
                f"{mc['transformers'] / mc['modkit']:.2f} | {diff:.1e} |",
                flush=True,
            )


def chunk_sizes(args) -> None:
    """Forward + backward CPU seconds of each recurrent mixer at each length and chunk size (interleaved)."""
    d = args.d_model
    sizes = args.chunk_sizes
    print(f"\n## chunk size: forward + backward, batch 1, float32, d_model {d} (median of {args.repeats}; CPU s)\n")
    print("| mixer | T | " + " | ".join(f"chunk {c}" for c in sizes) + " | fastest | default |")
    print("|---|---:|" + "---:|" * len(sizes) + "---:|---:|")
    for name in [n for n in args.mixers if n in ("mamba2", "gated_deltanet")]:
        layers = {}
        for c in sizes:
            model = modkit.build(_spec(d, {**mixers(d)[name], "chunk_size": c}, max(args.lengths)), seed=0)
            layers[c] = model.layers[0].attention.train()
        default = modkit.build(_spec(d, mixers(d)[name], 16), seed=0).layers[0].attention.chunk_size
        for T in args.lengths:
            x = torch.randn(1, T, d, generator=torch.Generator().manual_seed(T)).requires_grad_()
            inputs = AttentionInputs(positions=torch.arange(T)[None])
            runs = {c: (lambda m=m: m(x, inputs).sum().backward()) for c, m in layers.items()}
            for fn in runs.values():  # warm-up
                fn()
            cpu = {c: [] for c in runs}
            for _ in range(args.repeats):
                for c, fn in runs.items():
                    cpu[c].append(_both(fn)[1])
            m = {c: statistics.median(v) for c, v in cpu.items()}
            print(
                f"| {name} | {T} | "
                + " | ".join(f"{m[c]:.4f}" for c in sizes)
                + f" | {min(m, key=m.get)} | {default} |",
                flush=True,
            )


def decode(args) -> None:
    d = args.d_model
    print(
        f"\n## decode step, batch 1, float32, d_model {d} (median of {args.repeats} rounds of {args.steps} steps; ms, wall / CPU)\n"
    )
    print("| mixer | " + " | ".join(f"context {c}" for c in args.contexts) + " | cache bytes at each context |")
    print("|---|" + "---:|" * len(args.contexts) + "---|")
    for name, cfg in mixers(d).items():
        if name != "attention" and name not in args.mixers:
            continue
        max_len = max(args.contexts) + args.steps * (args.repeats + 1) + 1
        model = modkit.build(_spec(d, cfg, max_len), seed=0).eval()
        row, sizes = [], []
        for context in args.contexts:
            cache = model.new_cache(1, context + args.steps * (args.repeats + 1) + 1)
            gen = torch.Generator().manual_seed(context)
            with torch.no_grad():
                for start in range(0, context, 1024):  # chunked prefill: memory bounded by the chunk
                    model(torch.randint(0, 256, (1, min(1024, context - start)), generator=gen), cache=cache)
                tokens = torch.randint(0, 256, (args.steps, 1, 1), generator=gen)

                def steps():
                    for t in tokens:
                        model(t, cache=cache)

                steps()  # warm-up
                rounds = [_both(steps) for _ in range(args.repeats)]
                row.append(tuple(1e3 * statistics.median(r[i] for r in rounds) / args.steps for i in (0, 1)))
            sizes.append(cache.nbytes())
        print(
            f"| {name} | "
            + " | ".join(f"{w:.3f} / {c:.3f}" for w, c in row)
            + " | "
            + ", ".join(f"{s:,}" for s in sizes)
            + " |",
            flush=True,
        )


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], allow_abbrev=False)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--d-model", dest="d_model", type=int, default=256)
    p.add_argument("--lengths", type=int, nargs="+", default=[256, 1024, 4096])
    p.add_argument("--contexts", type=int, nargs="+", default=[1024, 4096, 16384])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--mixers", nargs="+", default=["mamba2", "gated_deltanet", "mamba"])
    p.add_argument("--chunk-sizes", dest="chunk_sizes", type=int, nargs="+", default=[32, 64, 128, 256])
    p.add_argument("--skip", nargs="*", default=[], choices=["train", "chunks", "decode"])
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    import transformers

    transformers.logging.set_verbosity_error()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(
        f"# recurrent mixers, {args.threads} thread(s), torch {torch.__version__}, transformers "
        f"{transformers.__version__}, load average at start {load:.1f} ({os.cpu_count()} CPUs)"
    )
    if "train" not in args.skip:
        forward_backward(args)
    if "chunks" not in args.skip:
        chunk_sizes(args)
    if "decode" not in args.skip:
        decode(args)
    print(f"\nload average at the end {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

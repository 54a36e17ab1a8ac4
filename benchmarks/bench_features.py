#!/usr/bin/env python
"""What the configuration features cost: float16-safe gated FFNs, the sampling pipeline, RoPE scalings, attention
logit soft-capping and resizing the vocabulary. Writes ``results-features.md`` (CPU) or the ``-o`` file.

Each figure is the median of interleaved samples (A, B, A, B, ...), each sample timing ``loops`` calls, against
the plain computation it replaces in the same run:

* **float16 gated FFN**: a ``swiglu`` forward in float16 (product in float32, rows scaled into ``down``) against the
  plain float16 formula ``down(silu(gate(x)) * up(x))``, at a prefill shape and a decode shape; float16 matmuls on
  a CPU are emulated and slow, so the GPU run (``--device cuda``) is the figure that matters;
* **sampling**: one sampling step on ``[batch, vocab]`` logits: plain ``argmax`` against the pipeline's greedy
  (``temperature=0``), a sampled ``temperature + top_p`` and a full pipeline (repetition, presence and frequency
  penalties over 512 tokens of history, temperature, top-k, top-p, min-p); and greedy ``generate`` on the
  reference llama-like model (d_model 512, 8 layers, vocab 32000) against a hand loop with ``argmax`` on the same
  cache, so the pipeline's share of a decode step shows;
* **RoPE**: ``rotate(q, k, positions)`` with static frequencies against ``dynamic`` and ``longrope`` (chosen per call
  from the positions) and ``yarn`` (cos/sin scaled), at a prefill shape and a decode shape;
* **logit soft-cap**: a ``gqa`` attention forward with ``logit_softcap`` (eager float32 math: SDPA has no
  soft-cap) against the same layer without it (SDPA), prefill and decode with a cache;
* **resize_vocab**: growing the reference model's 32000-token vocabulary by 100 (a one-off).

Usage::

    .venv/bin/python benchmarks/bench_features.py                       # CPU, writes benchmarks/results-features.md
    .venv/bin/python benchmarks/bench_features.py --device cuda -o /tmp/features-gpu.md
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import modkit  # noqa: E402
from modkit.inference.generate import build_sampler, column_major_linears  # noqa: E402
from modkit.inference.sampling import GenerationState  # noqa: E402


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def timed(fns: dict, device: str, samples: int, loops: int) -> dict[str, float]:
    """Median seconds per call of each function (samples interleaved, each timing ``loops`` calls; one warm-up)."""
    out: dict[str, list[float]] = {k: [] for k in fns}
    for s in range(samples + 1):
        for name, fn in fns.items():
            sync(device)
            t = time.perf_counter()
            for _ in range(loops):
                fn()
            sync(device)
            if s:
                out[name].append((time.perf_counter() - t) / loops)
    return {k: statistics.median(v) for k, v in out.items()}


def us(x: float) -> str:
    return f"{x * 1e6:,.1f} µs" if x < 1e-3 else f"{x * 1e3:,.2f} ms"


class Table:
    def __init__(self):
        self.rows: list[tuple[str, str, str, str]] = []

    def add(self, what: str, base: float, new: float, note: str = "") -> None:
        self.rows.append((what, us(base), us(new), f"{new / base:.2f}" + (f" ({note})" if note else "")))
        print(f"{what:70s} {us(base):>12s} {us(new):>12s}  x{new / base:.2f} {note}", flush=True)


def reference_spec(vocab: int = 32000, **block) -> dict:
    return {
        "schema_version": 1,
        "vocab_size": vocab,
        "d_model": 512,
        "n_layers": 8,
        "max_seq_len": 4096,
        "position": {"type": "rope", "theta": 10000.0},
        "block": {
            "attention": {"type": "gqa", "n_heads": 8, "n_kv_heads": 2},
            "ffn": {"type": "swiglu", "d_ff": 1408},
            "norm": {"type": "rmsnorm"},
            "placement": {"type": "pre"},
            **block,
        },
        "final_norm": {"type": "rmsnorm"},
    }


def bench_ffn(tab: Table, device: str, samples: int) -> None:
    from modkit_plugins.ffn import GatedMLP

    gpu = device.startswith("cuda")
    d, d_ff = (2048, 5632) if gpu else (512, 1408)
    for tokens, loops in ((4096 if gpu else 256, 20 if gpu else 3), (1, 200 if gpu else 50)):
        m = GatedMLP(d, d_ff, "silu", False).to(device=device, dtype=torch.float16)
        x = torch.randn(tokens, d, device=device, dtype=torch.float16)
        with torch.no_grad():
            t = timed(
                {"plain": lambda: m.down(torch.nn.functional.silu(m.gate(x)) * m.up(x)), "guarded": lambda: m(x)},
                device,
                samples,
                loops,
            )
        tab.add(f"float16 swiglu d {d} d_ff {d_ff}, {tokens} tokens: plain -> finite-safe", t["plain"], t["guarded"])


def bench_sampling(tab: Table, device: str, samples: int) -> None:
    g = torch.Generator(device=device).manual_seed(0)
    for vocab in (32000, 128256):
        for batch in (1, 8):
            logits = torch.randn(batch, vocab, device=device) * 3
            ids = torch.randint(0, vocab, (batch, 512), device=device)
            st = GenerationState(ids, None, 256)
            pipes = {
                "greedy (temperature=0)": build_sampler(vocab, temperature=0),
                "temperature 0.8 + top_p 0.9": build_sampler(vocab, temperature=0.8, top_p=0.9),
                "penalties + temperature + top_k + top_p + min_p": build_sampler(
                    vocab,
                    repetition_penalty=1.1,
                    presence_penalty=0.3,
                    frequency_penalty=0.2,
                    temperature=0.8,
                    top_k=50,
                    top_p=0.95,
                    min_p=0.05,
                ),
            }
            fns = {"argmax": lambda: logits.argmax(-1)}
            for name, sampler in pipes.items():
                fns[name] = lambda s=sampler: s.choose(logits, st, g)
            t = timed(fns, device, samples, 20)
            for name in pipes:
                tab.add(f"sampling step [{batch}, {vocab}]: argmax -> {name}", t["argmax"], t[name])


@torch.no_grad()
def bench_generate(tab: Table, device: str, samples: int) -> None:
    model = modkit.build(reference_spec(), device=device, seed=0).eval()
    if device == "cpu":
        column_major_linears(model)
    prompt, new = torch.randint(0, 32000, (1, 32), device=device), 64

    def hand():
        cache = model.new_cache(1, 32 + new)
        logits = model(prompt, cache=cache, logits_to_keep=1).logits[:, -1]
        out = []
        for _ in range(new):
            token = logits.argmax(-1)
            out.append(token)
            logits = model(token[:, None], cache=cache).logits[:, -1]
        return out

    from modkit.inference.generate import generate

    t = timed(
        {"hand": hand, "generate": lambda: generate(model, prompt, max_new_tokens=new, temperature=0)},
        device,
        samples,
        1,
    )
    tab.add(
        f"greedy decode of {new} tokens, reference model: argmax loop -> generate(temperature=0)",
        t["hand"],
        t["generate"],
        f"{(t['generate'] - t['hand']) / new * 1e6:,.0f} µs per token",
    )


def bench_rope(tab: Table, device: str, samples: int) -> None:
    reg = modkit.get_registry()
    base = {"type": "rope", "theta": 10000.0}
    variants = {
        "dynamic": {"type": "dynamic", "factor": 2.0, "original_max_seq_len": 1024},
        "longrope": {
            "type": "longrope",
            "short_factor": [1.0] * 32,
            "long_factor": [2.0] * 32,
            "original_max_seq_len": 1024,
        },
        "yarn": {"type": "yarn", "factor": 4.0, "original_max_seq_len": 1024},
    }

    def make(scaling):
        cfg = modkit.load_component("position", {**base, "scaling": scaling}, registry=reg)
        m = modkit.BuildContext(512, 1, 32, 8192, reg, head_dim=64).build(cfg).to(device)
        m.init_weights(modkit.Init(0, 0.02))
        return m

    static = make(None)
    for seq, start, loops in ((2048, 0, 20), (1, 2047, 500)):
        q = torch.randn(1, 8, seq, 64, device=device)
        k = torch.randn(1, 2, seq, 64, device=device)
        pos = torch.arange(start, start + seq, device=device)[None]
        fns = {"static": lambda: static.rotate(q, k, pos)}
        for name, sc in variants.items():
            fns[name] = lambda m=make(sc): m.rotate(q, k, pos)
        t = timed(fns, device, samples, loops)
        for name in variants:
            tab.add(
                f"rope rotate q [1, 8, {seq}, 64], k [1, 2, {seq}, 64]: static -> {name}",
                t["static"],
                t[name],
                "past the trained length" if start + seq > 1024 else "",
            )


@torch.no_grad()
def bench_softcap(tab: Table, device: str, samples: int) -> None:
    from modkit.inference.generate import generate

    plain = modkit.build(reference_spec(), device=device, seed=0).eval()
    capped_spec = reference_spec()
    capped_spec["block"]["attention"] = {**capped_spec["block"]["attention"], "logit_softcap": 50.0}
    capped = modkit.build(capped_spec, device=device, seed=0).eval()
    seq = 512
    attn_p, attn_c = plain.layers[0].attention, capped.layers[0].attention
    x = torch.randn(1, seq, 512, device=device)
    inputs = modkit.AttentionInputs(positions=torch.arange(seq, device=device)[None], position=plain.positions[0])
    t = timed({"sdpa": lambda: attn_p(x, inputs), "softcap": lambda: attn_c(x, inputs)}, device, samples, 10)
    tab.add(f"gqa attention prefill [1, {seq}, 512]: SDPA -> soft-capped (eager float32)", t["sdpa"], t["softcap"])
    ids, new = torch.randint(0, 32000, (1, seq), device=device), 32
    t = timed(
        {
            "sdpa": lambda: generate(plain, ids, max_new_tokens=new, temperature=0),
            "softcap": lambda: generate(capped, ids, max_new_tokens=new, temperature=0),
        },
        device,
        samples,
        1,
    )
    tab.add(
        f"greedy generate, {seq}-token prompt + {new} tokens, reference model: SDPA -> soft-capped attention",
        t["sdpa"],
        t["softcap"],
        f"{(t['softcap'] - t['sdpa']) / new * 1e6:,.0f} µs per token incl. prefill share",
    )


@torch.no_grad()
def bench_resize(tab: Table, device: str, samples: int) -> None:
    def fresh():
        return modkit.build(reference_spec(), device=device, seed=0)

    models = [fresh() for _ in range(samples + 1)]
    times = []
    for m in models:
        sync(device)
        t = time.perf_counter()
        m.resize_vocab(32100)
        sync(device)
        times.append(time.perf_counter() - t)
    build = []
    for _ in range(samples):
        sync(device)
        t = time.perf_counter()
        fresh()
        sync(device)
        build.append(time.perf_counter() - t)
    tab.add(
        "resize_vocab 32000 -> 32100, reference model (one-off): vs building the model",
        statistics.median(build),
        statistics.median(times[1:]),
    )


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], allow_abbrev=False)
    p.add_argument("--device", default="cpu")
    p.add_argument("--samples", type=int, default=7, help="interleaved samples per figure (median reported)")
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    p.add_argument("--only", action="append", choices=["ffn", "sampling", "generate", "rope", "softcap", "resize"])
    p.add_argument("-o", "--output", default=str(HERE / "results-features.md"))
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    chosen = args.only or ["ffn", "sampling", "generate", "rope", "softcap", "resize"]
    tab = Table()
    start = time.perf_counter()
    for name in chosen:
        globals()[f"bench_{name}"](tab, args.device, args.samples)
    machine = (
        f"{platform.processor() or platform.machine()}, torch {torch.__version__}, threads {torch.get_num_threads()}"
    )
    if args.device.startswith("cuda"):
        machine += f", {torch.cuda.get_device_name()}"
    lines = [
        "# What the configuration features cost",
        "",
        f"Generated by `.venv/bin/python benchmarks/bench_features.py {' '.join(argv if argv is not None else sys.argv[1:])}` "
        f"in {time.perf_counter() - start:.0f} s on {args.device} ({machine}). Medians of {args.samples} interleaved "
        "samples; see the script's docstring for what each row compares.",
        "",
        "| what (baseline -> feature) | baseline | feature | ratio |",
        "|---|---:|---:|---|",
    ]
    lines += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in tab.rows]
    Path(args.output).write_text("\n".join(lines) + "\n")
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

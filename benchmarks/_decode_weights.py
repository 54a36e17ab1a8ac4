"""Weight formats for batch-1 greedy decoding (``bench_decode.py --weights``): float32, bfloat16 and int8 linear
weights in modkit, against transformers with the same weights and the same quantization, in one run.

Variants (each its own copy of the same random weights, seed 0, the llama-like model of ``_bench.Config``):

* modkit ``float32`` (column-major linear weights, as ``generate`` stores them on a CPU with MKL), ``bfloat16``
  and ``int8`` (``generate(weights=...)``: linear layers only, activations and KV cache float32), and
  ``bfloat16 model`` (the whole model cast to bfloat16, then its linear layers converted as ``bfloat16``: the same
  products, with the embedding, activations and KV cache in bfloat16 too), the alternative the weight-only bfloat16
  was chosen against;
* the three formats again with ``compile=True`` (the decode step under ``torch.compile``; compiled in the warm-up);
* transformers ``float32``, ``bfloat16`` (the whole model cast) and ``int8`` (torchao's ``Int8WeightOnlyConfig`` on
  every linear layer, head included) when torchao is installed.

Each round runs every variant once, interleaved, after one warm-up round: ``--new`` greedy tokens after a
``--prompt-len`` prompt; decode tokens/s = ``(new - 1) / (time of the last token - time of the first)``, on the
process's CPU clock (one thread) and on the wall clock. Agreement with float32 (same library) over ``--agree``
greedy tokens: the length of the common prefix of the two greedy continuations, and teacher-forced top-1 agreement
(each variant's argmax at every position of float32's greedy sequence, one forward). Then one linear layer per
weight shape of the model, batch 1, each product timed alone (float32, modkit bfloat16 and int8, torchao int8).
Not a timed test.
"""

from __future__ import annotations

import copy
import statistics
import time

import torch

import modkit
from _bench import Config, hf_llama, load_average, modkit_from
from modkit.inference.generate import column_major_linears, stream_generate
from modkit.inference.weights import linear_weight_bytes, quantize_linears


class _Compiled:
    """A modkit variant decoded with ``compile=True`` (the same model object as its eager row)."""

    def __init__(self, model: modkit.Model):
        self.model = model


def _plain(model):
    return model.model if isinstance(model, _Compiled) else model


def _modkit_variants(model: modkit.Model) -> dict[str, object]:
    """The modkit copies: float32 (column-major), bfloat16 and int8 linear weights, the whole model in bfloat16."""
    out = {}
    out["float32"] = copy.deepcopy(model)
    column_major_linears(out["float32"])
    for fmt in ("bfloat16", "int8"):
        out[fmt] = copy.deepcopy(model)
        quantize_linears(out[fmt], fmt)
    out["bfloat16 model"] = copy.deepcopy(model).to(torch.bfloat16)
    quantize_linears(out["bfloat16 model"], "bfloat16")  # the same packed products, bfloat16 activations
    for fmt in ("float32", "bfloat16", "int8"):
        out[f"{fmt}, compiled"] = _Compiled(out[fmt])
    return out


def _hf_variants(hf) -> dict[str, object]:
    """The transformers copies: float32, bfloat16 (whole model) and, with torchao, int8 weight-only."""
    out = {"float32": hf, "bfloat16": copy.deepcopy(hf).to(torch.bfloat16)}
    try:
        from torchao.quantization import Int8WeightOnlyConfig, quantize_
    except ImportError:
        print("  torchao not installed: no transformers int8 (pip install modkit[quant])", flush=True)
        return out
    q = copy.deepcopy(hf)
    quantize_(q, Int8WeightOnlyConfig())
    out["int8 (torchao)"] = q
    return out


def _stamps() -> tuple[float, float]:
    return time.process_time(), time.perf_counter()


def _modkit_decode(model, ids: torch.Tensor, new: int) -> tuple[torch.Tensor, float, float]:
    """(tokens ``[1, prompt + new]``, CPU seconds, wall seconds from the first new token to the last)."""
    compile, model = isinstance(model, _Compiled), _plain(model)
    column_major = False if model.embed.weight.dtype == torch.bfloat16 else None  # (row-major bf16 is faster)
    steps = stream_generate(model, ids, max_new_tokens=new, temperature=0, column_major=column_major, compile=compile)
    first = next(steps)
    c0, w0 = _stamps()
    rest = list(steps)
    c1, w1 = _stamps()
    return torch.cat([ids, torch.stack([first] + rest, 1)], 1), c1 - c0, w1 - w0


def _hf_decode(hf, ids: torch.Tensor, new: int) -> tuple[torch.Tensor, float, float]:
    """As :func:`_modkit_decode`, for transformers' greedy ``generate`` (a streamer stamps each token)."""
    from transformers.generation.streamers import BaseStreamer

    stamps: list[tuple[float, float]] = []

    class Clock(BaseStreamer):
        def put(self, value):
            stamps.append(_stamps())

        def end(self):
            pass

    out = hf.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        do_sample=False,
        max_new_tokens=new,
        min_new_tokens=new,
        streamer=Clock(),
    )
    (c0, w0), (c1, w1) = stamps[1], stamps[-1]  # stamps[0]: the prompt; stamps[1]: the first new token
    return out, c1 - c0, w1 - w0


def _logits(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return _plain(model)(ids).logits[0].float()


def _agreement(runner: str, models: dict, ids: torch.Tensor, n: int, prompt: int) -> dict[str, dict]:
    """Per variant: the common prefix of its greedy tokens with float32's, teacher-forced top-1 agreement on
    float32's greedy sequence, and max |Δ logits| ÷ max |logit| there."""
    decode = _modkit_decode if runner == "modkit" else _hf_decode
    seqs = {k: decode(m, ids, n)[0][0, prompt:] for k, m in models.items()}
    ref_seq = torch.cat([ids[0], seqs["float32"]])[None]
    ref = _logits(models["float32"], ref_seq)[prompt - 1 : -1]
    out = {}
    for k, m in models.items():
        same = (seqs[k] == seqs["float32"]).tolist()
        prefix = same.index(False) if False in same else len(same)
        got = _logits(m, ref_seq)[prompt - 1 : -1]
        out[k] = {
            "prefix": prefix,
            "top1": float((got.argmax(-1) == ref.argmax(-1)).float().mean()),
            "rel_logit_diff": float((got - ref).abs().max() / ref.abs().max()),
        }
    return out


def _kernels(repeats: int) -> list[str]:
    """Markdown rows: one batch-1 product ``[1, in] @ W^T`` per weight shape of the model, microseconds (median of
    ``repeats`` rounds of 100 calls, CPU clock, interleaved): float32 column-major, modkit bfloat16 and int8, torchao's
    int8 weight-only (when installed)."""
    from modkit.inference.weights import BFloat16Linear, Int8Linear

    rows = []
    for d_out, d_in in ((1408, 512), (512, 1408), (32000, 512)):
        lin = torch.nn.Linear(d_in, d_out, bias=False)
        fns = {"float32 (column-major)": copy.deepcopy(lin), "modkit bfloat16": BFloat16Linear.from_linear(lin)}
        column_major_linears(fns["float32 (column-major)"])
        fns["modkit int8"] = Int8Linear.from_linear(lin)
        try:
            from torchao.quantization import Int8WeightOnlyConfig, quantize_

            ao = torch.nn.Sequential(copy.deepcopy(lin))
            quantize_(ao, Int8WeightOnlyConfig())
            fns["torchao int8"] = ao
        except ImportError:
            pass
        x = torch.randn(1, d_in)
        times: dict = {k: [] for k in fns}
        with torch.inference_mode():
            for r in range(repeats + 1):
                for k, f in fns.items():
                    t = time.process_time()
                    for _ in range(100):
                        f(x)
                    if r:
                        times[k].append((time.process_time() - t) / 100 * 1e6)
        ref = statistics.median(times["float32 (column-major)"])
        for k, v in times.items():
            t = statistics.median(v)
            rows.append(f"| {d_out} x {d_in} | {k} | {t:,.1f} | {ref / t:.2f} |")
    return ["| weight [out x in] | product | µs per call | speed ÷ float32 |", "|---|---|---:|---:|", *rows]


def _fmt_bytes(model) -> str:
    if any(type(p.data) is not torch.Tensor for p in _plain(model).parameters()):
        return "(torchao tensors)"
    b = linear_weight_bytes(_plain(model))
    return f"{(b['weights'] + b['scales']) / 2**20:.1f} MiB"


def run(args) -> str:
    """Measure, print, and return the markdown report (``args``: ``repeats``, ``new``, ``prompt_len``, ``agree``)."""
    cfg = Config()
    load_before = load_average()
    print(f"load average {load_before}; torch threads {torch.get_num_threads()}", flush=True)
    hf = hf_llama(cfg)
    base = modkit_from(hf)
    runs = {("modkit", k): m for k, m in _modkit_variants(base).items()}
    runs.update({("transformers", k): m for k, m in _hf_variants(hf).items()})
    ids = torch.randint(0, cfg.vocab, (1, args.prompt_len), generator=torch.Generator().manual_seed(0))
    cpu: dict = {k: [] for k in runs}
    wall: dict = {k: [] for k in runs}
    for r in range(args.repeats + 1):  # interleaved rounds, the first a warm-up
        for key, m in runs.items():
            decode = _modkit_decode if key[0] == "modkit" else _hf_decode
            _, c, w = decode(m, ids, args.new)
            if r:
                cpu[key].append((args.new - 1) / c)
                wall[key].append((args.new - 1) / w)
        print(f"  round {r}{' (warm-up)' if not r else ''} done, load {load_average()}", flush=True)
    tps = {k: statistics.median(v) for k, v in cpu.items()}
    agree = {}
    for runner in ("modkit", "transformers"):
        models = {k: m for (lib, k), m in runs.items() if lib == runner}
        agree.update({(runner, k): v for k, v in _agreement(runner, models, ids, args.agree, args.prompt_len).items()})
    kernels = _kernels(args.repeats)
    print("\n".join(kernels), flush=True)
    load_after = load_average()
    lines = _table(runs, tps, cpu, wall, agree, args)
    report = "\n".join(
        [
            "# Decode with fewer weight bytes: float32, bfloat16 and int8 linear weights (`bench_decode.py --weights`)",
            "",
            f"Generated by `.venv/bin/python benchmarks/bench_decode.py --weights --repeats {args.repeats} "
            f"--new {args.new} --agree {args.agree}` on {time.strftime('%Y-%m-%d %H:%M')}; torch {torch.__version__}, "
            f"{torch.get_num_threads()} thread(s).",
            "",
            f"- model: llama-like, d_model {cfg.d_model}, {cfg.n_layers} layers, GQA {cfg.n_heads}/{cfg.n_kv_heads}, "
            f"SwiGLU {cfg.d_ff}, vocabulary {cfg.vocab}, untied head; random weights (seed 0), the same in both libraries",
            f"- batch 1, prompt {args.prompt_len} tokens, {args.new} greedy tokens; decode tokens/s from the first to the "
            f"last new token, median of {args.repeats} interleaved rounds after a warm-up, on the process CPU clock "
            "(one thread; wall clock in brackets)",
            f"- load average (1, 5, 15 min) before: {load_before}; after: {load_after}",
            f"- agreement with float32 of the same library over {args.agree} greedy tokens: common prefix; teacher-forced "
            "top-1 agreement on float32's sequence; max |Δ logits| ÷ max |logit| there",
            "",
            *lines,
            "",
            "One linear layer, batch 1, the model's weight shapes (the kernels behind the rows above):",
            "",
            *kernels,
        ]
    )
    print("\n".join(lines), flush=True)
    return report


def _table(runs, tps, cpu, wall, agree, args) -> list[str]:
    """The markdown table: one row per variant."""
    hf_of = {"bfloat16": "bfloat16", "bfloat16 model": "bfloat16", "int8": "int8 (torchao)", "float32": "float32"}
    hf_of.update({f"{k}, compiled": hf_of[k] for k in ("float32", "bfloat16", "int8")})
    out = [
        "| library | weights | linear weight bytes | decode tokens/s (wall) | ÷ float32 | ÷ transformers, same format | "
        "common prefix | top-1 agreement | max rel. Δ logits |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for key, m in runs.items():
        lib, fmt = key
        ref = tps[(lib, "float32")]
        other = ("transformers", hf_of.get(fmt, "")) if lib == "modkit" else None
        vs_hf = f"{tps[key] / tps[other]:.2f}" if other in tps else ""
        a = agree[key]
        out.append(
            f"| {lib} | {fmt} | {_fmt_bytes(m)} | {tps[key]:,.1f} ({statistics.median(wall[key]):,.1f}) | "
            f"{tps[key] / ref:.2f} | {vs_hf} | {a['prefix']} / {args.agree} | {a['top1']:.3f} | "
            f"{a['rel_logit_diff']:.2g} |"
        )
    return out

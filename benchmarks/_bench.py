"""Shared machinery of ``bench_cpu.py`` and ``bench_gpu.py``: modkit against transformers, same weights, same run.

Every figure that is compared is measured in the same process, interleaved (A, B, A, B, ...) so that load drifts
on a shared machine hit both sides alike, and reported as the median of several runs. Ratios measured this way
are what counts; absolute times depend on the machine and its load (the report states both).

Workloads (``Config`` sizes):

* **prefill**: one forward of ``[batch, seq]`` random tokens (logits of every position, no cache) in modkit and in
  transformers (``use_cache=False``); eager and ``torch.compile``. Achieved FLOP/s is compared with plain
  ``torch.matmul`` running the model's own GEMMs at the same token count (same run).
* **decode**: greedy generation of ``new`` tokens after a ``prompt``-token prompt, batch 1: modkit's
  :func:`modkit.inference.generate.generate` (eager; ``compile=True``) against transformers' ``generate``; tokens/s counted
  end to end (prefill included, both sides alike) and per decode step. The decode roofline is
  ``bandwidth / weight bytes per token`` with the bandwidth of a large tensor copy (read + write) measured in the
  same run; weight bytes per token = every parameter except the embedding table (one row of it is read).
* **moe**: an 8-expert top-2 SwiGLU block on ``moe_tokens`` tokens against transformers' ``MixtralSparseMoeBlock``
  with the same weights; FLOP/s counted on the active experts only (``tokens · top_k · 3 · 2 · d · d_ff`` plus the
  router), compared with a plain matmul of one expert's per-expert GEMM (same run).

Sources: transformers ``LlamaForCausalLM`` / ``MixtralSparseMoeBlock`` (test-only dependency); weights go through
``modkit.from_hf`` on a ``save_pretrained`` folder when available, else through the explicit name map below.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import os
import platform
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import modkit  # noqa: E402
from modkit.inference.generate import column_major_linears, compiled_decode, decode_logits, stream_generate  # noqa: E402


@dataclass
class Config:
    """Sizes of one benchmark run (a llama-like model plus the workloads)."""

    d_model: int = 512
    n_layers: int = 8
    n_heads: int = 8
    n_kv_heads: int = 2
    d_ff: int = 1408
    vocab: int = 32000
    dtype: torch.dtype = torch.float32
    device: str = "cpu"
    prefill_batch: int = 4
    prefill_seq: int = 256
    prompt: int = 32
    new: int = 128
    moe_tokens: int = 4096
    moe_experts: int = 8
    moe_top_k: int = 2
    repeats: int = 5
    compile: bool = True
    compile_hf: bool = True
    profile: bool = True


@dataclass
class Row:
    """One line of the results table."""

    metric: str
    value: float
    target: Optional[str] = None
    met: Optional[bool] = None
    note: str = ""


@dataclass
class Report:
    """Everything ``results.md`` shows."""

    cfg: Config
    rows: list[Row] = field(default_factory=list)
    facts: list[str] = field(default_factory=list)
    profiles: list[tuple[str, str]] = field(default_factory=list)

    def add(
        self, metric: str, value: float, target: Optional[str] = None, met: Optional[bool] = None, note: str = ""
    ) -> None:
        self.rows.append(Row(metric, value, target, met, note))
        flag = "" if met is None else ("  [target met]" if met else "  [TARGET MISSED]")
        tgt = f"  (target {target})" if target else ""
        print(f"  {metric:58s} {value:12.4g}{tgt}{flag}  {note}", flush=True)

    def fact(self, line: str) -> None:
        self.facts.append(line)
        print(f"  {line}", flush=True)


# ------------------------------------------------------------------------------------------------ timing


def sync(device: str) -> None:
    """Wait for queued device work (no-op on CPU)."""
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def interleaved(
    fns: dict[str, Callable[[], object]], repeats: int, device: str, warmup: int = 1
) -> dict[str, list[float]]:
    """Seconds per call of each function, calls interleaved A, B, A, B... (``warmup`` untimed rounds first)."""
    times: dict[str, list[float]] = {k: [] for k in fns}
    for r in range(warmup + repeats):
        for name, fn in fns.items():
            gc.collect()
            sync(device)
            t = time.perf_counter()
            fn()
            sync(device)
            if r >= warmup:
                times[name].append(time.perf_counter() - t)
    return times


def med(xs: list[float]) -> float:
    """Median."""
    return statistics.median(xs)


def load_average() -> str:
    """``uptime``-style 1/5/15-minute load averages (``n/a`` where unsupported)."""
    try:
        return "{:.2f}, {:.2f}, {:.2f}".format(*os.getloadavg())
    except OSError:
        return "n/a"


# ------------------------------------------------------------------------------------------------ models


def hf_llama(cfg: Config, seed: int = 0):
    """A transformers ``LlamaForCausalLM`` with random weights (SDPA attention), eval mode, in ``cfg.dtype``."""
    import transformers

    transformers.logging.set_verbosity_error()
    config = transformers.LlamaConfig(
        vocab_size=cfg.vocab,
        hidden_size=cfg.d_model,
        num_hidden_layers=cfg.n_layers,
        num_attention_heads=cfg.n_heads,
        num_key_value_heads=cfg.n_kv_heads,
        intermediate_size=cfg.d_ff,
        max_position_embeddings=2048,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    hf = transformers.LlamaForCausalLM(config).to(dtype=cfg.dtype, device=cfg.device).eval()
    hf.generation_config.eos_token_id = None  # generate exactly `new` tokens, like modkit
    hf.generation_config.pad_token_id = 0
    return hf


def modkit_from(hf) -> "modkit.Model":
    """The same weights in modkit: ``modkit.from_hf`` on a ``save_pretrained`` folder of ``hf``."""
    with tempfile.TemporaryDirectory() as d:
        hf.save_pretrained(d)
        return modkit.from_hf(d, device=hf.device, dtype=hf.dtype).eval()


def linear_shapes(cfg: Config) -> list[tuple[int, int]]:
    """``(in, out)`` of every GEMM of one forward: per layer q, k, v, o, gate, up, down; then the head."""
    hd = cfg.d_model // cfg.n_heads
    per_layer = [
        (cfg.d_model, cfg.n_heads * hd),
        (cfg.d_model, cfg.n_kv_heads * hd),
        (cfg.d_model, cfg.n_kv_heads * hd),
        (cfg.n_heads * hd, cfg.d_model),
        (cfg.d_model, cfg.d_ff),
        (cfg.d_model, cfg.d_ff),
        (cfg.d_ff, cfg.d_model),
    ]
    return per_layer * cfg.n_layers + [(cfg.d_model, cfg.vocab)]


def forward_flops(cfg: Config, batch: int, seq: int) -> float:
    """FLOPs of one causal forward: 2 · tokens · Σ GEMM weights + attention (QKᵀ and PV over the causal half)."""
    tokens = batch * seq
    gemm = 2.0 * tokens * sum(i * o for i, o in linear_shapes(cfg))
    attn = cfg.n_layers * 2 * 2.0 * batch * cfg.n_heads * (cfg.d_model // cfg.n_heads) * seq * (seq + 1) / 2
    return gemm + attn


# ------------------------------------------------------------------------------------------------ references


def matmul_seconds(cfg: Config, tokens: int, repeats: int) -> float:
    """Median seconds of plain ``torch.matmul`` over the model's GEMMs at ``tokens`` rows (fresh inputs, same dtype)."""
    ws = [torch.randn(i, o, dtype=cfg.dtype, device=cfg.device) * 0.02 for i, o in linear_shapes(cfg)]
    xs = {i: torch.randn(tokens, i, dtype=cfg.dtype, device=cfg.device) for i in {i for i, _ in linear_shapes(cfg)}}

    def run():
        for w in ws:
            torch.matmul(xs[w.shape[0]], w)

    with torch.inference_mode():
        return med(interleaved({"mm": run}, repeats, cfg.device)["mm"])


def copy_bandwidth(cfg: Config, nbytes: int = 512 * 2**20, repeats: int = 5) -> float:
    """Bytes/s of a large tensor copy, counting read + write (``2 · nbytes / seconds``)."""
    src = torch.ones(nbytes // 4, dtype=torch.float32, device=cfg.device)
    dst = torch.empty_like(src)
    t = med(interleaved({"copy": lambda: dst.copy_(src)}, repeats, cfg.device)["copy"])
    return 2 * nbytes / t


def profile_table(fn: Callable[[], object], device: str, rows: int = 12) -> str:
    """torch.profiler's operator table (self time) for one call of ``fn``."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.startswith("cuda") else [])
    with profile(activities=acts) as prof:
        fn()
        sync(device)
    key = "self_cuda_time_total" if device.startswith("cuda") else "self_cpu_time_total"
    return prof.key_averages().table(sort_by=key, row_limit=rows)


# ------------------------------------------------------------------------------------------------ workloads


def bench_prefill(cfg: Config, rep: Report, hf, model) -> None:
    """Prefill forward of ``[prefill_batch, prefill_seq]``: time ratios and FLOP/s against plain matmul."""
    b, s = cfg.prefill_batch, cfg.prefill_seq
    print(f"\nprefill [{b}, {s}]", flush=True)
    ids = torch.randint(0, cfg.vocab, (b, s), generator=torch.Generator().manual_seed(1)).to(cfg.device)
    with torch.inference_mode():
        diff = (model(ids).logits.float() - hf(ids, use_cache=False).logits.float()).abs().max().item()
        rep.fact(f"prefill logits max |modkit - transformers| = {diff:.2e}")
        fns = {"modkit": lambda: model(ids), "hf": lambda: hf(ids, use_cache=False)}
        t = interleaved(fns, cfg.repeats, cfg.device)
    flops = forward_flops(cfg, b, s)
    mm = matmul_seconds(cfg, b * s, cfg.repeats)
    mm_rate = 2.0 * b * s * sum(i * o for i, o in linear_shapes(cfg)) / mm
    m_t, h_t = med(t["modkit"]), med(t["hf"])
    rep.fact(
        f"prefill eager: modkit {1e3 * m_t:.1f} ms, transformers {1e3 * h_t:.1f} ms (medians of {cfg.repeats}); "
        f"plain matmul of the same GEMMs {1e3 * mm:.1f} ms = {mm_rate / 1e9:.1f} GFLOP/s"
    )
    rep.add("prefill eager: modkit time / transformers time", m_t / h_t, "<= 1.0", m_t / h_t <= 1.0)
    rep.add(
        "prefill eager: modkit FLOP/s / plain-matmul FLOP/s",
        flops / m_t / mm_rate,
        note=f"{flops / m_t / 1e9:.1f} GFLOP/s",
    )
    rep.add(
        "prefill eager: transformers FLOP/s / plain-matmul FLOP/s",
        flops / h_t / mm_rate,
        note=f"{flops / h_t / 1e9:.1f} GFLOP/s",
    )
    if cfg.profile and m_t / h_t > 1.0:
        with torch.inference_mode():
            rep.profiles.append(("prefill eager, modkit", profile_table(lambda: model(ids), cfg.device)))
            rep.profiles.append(
                ("prefill eager, transformers", profile_table(lambda: hf(ids, use_cache=False), cfg.device))
            )
    if not cfg.compile:
        return
    start = time.perf_counter()
    cm = torch.compile(model, fullgraph=True, dynamic=False)
    with torch.inference_mode():
        cm(ids)
    rep.fact(f"prefill: torch.compile(modkit) (fullgraph) compiled in {time.perf_counter() - start:.1f} s")
    fns = {"modkit_compiled": lambda: cm(ids), "hf": lambda: hf(ids, use_cache=False)}
    if cfg.compile_hf:
        start = time.perf_counter()
        ch = torch.compile(hf, dynamic=False)
        with torch.inference_mode():
            ch(ids, use_cache=False)
        rep.fact(f"prefill: torch.compile(transformers) compiled in {time.perf_counter() - start:.1f} s")
        fns["hf_compiled"] = lambda: ch(ids, use_cache=False)
    with torch.inference_mode():
        t = interleaved(fns, cfg.repeats, cfg.device)
    c_t, h_t = med(t["modkit_compiled"]), med(t["hf"])
    rep.fact(
        f"prefill compiled: modkit {1e3 * c_t:.1f} ms, transformers eager {1e3 * h_t:.1f} ms"
        + (f", transformers compiled {1e3 * med(t['hf_compiled']):.1f} ms" if "hf_compiled" in t else "")
    )
    rep.add("prefill compiled: modkit time / transformers eager time", c_t / h_t, "<= 0.85", c_t / h_t <= 0.85)
    if "hf_compiled" in t:
        rep.add("prefill compiled: modkit time / transformers compiled time", c_t / med(t["hf_compiled"]))
    rep.add(
        "prefill compiled: modkit FLOP/s / plain-matmul FLOP/s",
        flops / c_t / mm_rate,
        note=f"{flops / c_t / 1e9:.1f} GFLOP/s",
    )
    if cfg.profile and c_t / h_t > 0.85:
        with torch.inference_mode():
            rep.profiles.append(("prefill compiled, modkit", profile_table(lambda: cm(ids), cfg.device)))


def _modkit_run(model, ids, new: int, compile: bool, column_major=None) -> tuple[torch.Tensor, float, float]:
    """(tokens, total seconds, seconds from the first to the last new token); ``column_major`` as in ``stream_generate``."""
    sync(str(ids.device))
    t0 = time.perf_counter()
    steps = stream_generate(model, ids, max_new_tokens=new, temperature=0, compile=compile, column_major=column_major)
    first = next(steps)
    sync(str(ids.device))
    t1 = time.perf_counter()
    rest = list(steps)
    sync(str(ids.device))
    t2 = time.perf_counter()
    return torch.cat([ids, torch.stack([first] + rest, 1)], 1), t2 - t0, t2 - t1


def _hf_run(hf, ids, new: int) -> tuple[torch.Tensor, float, float]:
    """(tokens, total seconds, seconds from the first to the last new token) of transformers' greedy generate."""
    from transformers.generation.streamers import BaseStreamer

    stamps: list[float] = []

    class Clock(BaseStreamer):
        def put(self, value):
            sync(str(ids.device))
            stamps.append(time.perf_counter())

        def end(self):
            pass

    sync(str(ids.device))
    t0 = time.perf_counter()
    out = hf.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        do_sample=False,
        max_new_tokens=new,
        min_new_tokens=new,
        streamer=Clock(),
    )
    sync(str(ids.device))
    t2 = time.perf_counter()
    return out, t2 - t0, t2 - stamps[1]  # stamps[0]: the prompt, stamps[1]: the first new token


def bench_decode(cfg: Config, rep: Report, hf, model) -> None:
    """Greedy decode, batch 1: tokens/s ratios, roofline fraction, compile checks.

    modkit runs twice eagerly: as ``stream_generate`` runs by default (on a CPU with MKL it stores the
    ``nn.Linear`` weights column-major first, :func:`modkit.inference.generate.column_major_linears`) and on a row-major copy
    with ``column_major=False``; the compiled step runs by default too. transformers runs with its default layout.
    """
    import copy

    print(f"\ndecode: batch 1, prompt {cfg.prompt}, {cfg.new} new tokens, greedy", flush=True)
    ids = torch.randint(0, cfg.vocab, (1, cfg.prompt), generator=torch.Generator().manual_seed(2)).to(cfg.device)
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    weight_bytes -= (
        model.embed.weight.numel() * model.embed.weight.element_size() - cfg.d_model * model.embed.weight.element_size()
    )
    bw = copy_bandwidth(cfg)
    roof = bw / weight_bytes
    rep.fact(
        f"weight bytes per decoded token {weight_bytes / 2**20:.1f} MiB; large-copy bandwidth {bw / 1e9:.2f} GB/s "
        f"(read + write) -> roofline {roof:.1f} tokens/s ({1e3 / roof:.1f} ms per token)"
    )
    row = copy.deepcopy(model)  # row-major weights, decoded with column_major=False
    column_major_linears(row, enable=False)

    with torch.inference_mode():
        ours, _, _ = _modkit_run(model, ids, cfg.new, False)
        ours_row, _, _ = _modkit_run(row, ids, cfg.new, False, column_major=False)
        theirs, _, _ = _hf_run(hf, ids, cfg.new)
    w = model.layers[0].attention.q_proj.weight
    rep.fact(f"generate's default weight layout here: {'column' if w.stride()[0] == 1 else 'row'}-major")
    same = torch.equal(ours.cpu(), theirs.cpu())
    first = int((ours.cpu() != theirs.cpu()).any(0).nonzero()[0]) - cfg.prompt if not same else None
    rep.fact(
        f"greedy tokens identical to transformers: {same}"
        + ("" if same else f" (first difference at new token {first})")
        + f"; row-major weights give the same tokens: {torch.equal(ours_row, ours)}"
    )

    runs: dict[str, Callable[[], tuple]] = {
        "modkit": lambda: _modkit_run(model, ids, cfg.new, False),
        "modkit_rowmajor": lambda: _modkit_run(row, ids, cfg.new, False, column_major=False),
        "hf": lambda: _hf_run(hf, ids, cfg.new),
    }
    if cfg.compile:
        torch._dynamo.reset()
        with torch.inference_mode():
            cache = model.new_cache(1, cfg.prompt + cfg.new)
            model(ids, cache=cache)
            explained = torch._dynamo.explain(functools.partial(decode_logits, model))(ids[:, :1], cache)
        rep.add(
            "decode step: graph breaks (torch._dynamo.explain)",
            explained.graph_break_count,
            "0",
            explained.graph_break_count == 0,
            note=f"{explained.graph_count} graph(s)",
        )
        torch._dynamo.reset()
        from torch._dynamo.utils import counters

        before = counters["stats"]["unique_graphs"]
        start = time.perf_counter()
        with torch.inference_mode():
            compiled_decode(model)  # fullgraph=True, dynamic=False
            ours_c, _, _ = _modkit_run(model, ids, cfg.new, True)
        rep.fact(
            f"decode: compiled step (fullgraph=True, dynamic=False) first call incl. compilation {time.perf_counter() - start:.1f} s"
        )
        with torch.inference_mode():
            _modkit_run(model, ids, cfg.new, True)  # a second generation: must not recompile
        graphs = counters["stats"]["unique_graphs"] - before
        rep.add(f"decode step: graphs compiled over 2 generations x {cfg.new - 1} steps", graphs, "1", graphs == 1)
        rep.fact(f"compiled greedy tokens identical to eager: {torch.equal(ours_c, ours)}")
        runs["modkit_compiled"] = lambda: _modkit_run(model, ids, cfg.new, True)

    results: dict[str, list[tuple]] = {k: [] for k in runs}
    with torch.inference_mode():
        for r in range(cfg.repeats):
            for name, fn in runs.items():
                gc.collect()
                results[name].append(fn())
    total = {k: med([r[1] for r in v]) for k, v in results.items()}
    step = {k: med([r[2] for r in v]) for k, v in results.items()}
    tps = {k: cfg.new / total[k] for k in total}
    dps = {k: (cfg.new - 1) / step[k] for k in step}
    for k in runs:
        rep.fact(
            f"decode {k}: {tps[k]:.1f} tokens/s end to end (prefill included), {dps[k]:.1f} tokens/s per decode step, "
            f"{1e3 * step[k] / (cfg.new - 1):.2f} ms/step"
        )
    for k, label in (("modkit", "generate's default weight layout"), ("modkit_rowmajor", "row-major weights")):
        r = tps[k] / tps["hf"]
        rep.add(f"decode eager ({label}): modkit tokens/s / transformers tokens/s", r, ">= 1.8", r >= 1.8)
        rep.add(
            f"decode eager ({label}): modkit step tokens/s / roofline", dps[k] / roof, ">= 0.5", dps[k] / roof >= 0.5
        )
    rep.add("decode eager: transformers step tokens/s / roofline", dps["hf"] / roof)
    if "modkit_compiled" in tps:
        rc = tps["modkit_compiled"] / tps["hf"]
        rep.add("decode compiled: modkit tokens/s / transformers tokens/s", rc, ">= 2.5", rc >= 2.5)
        rep.add(
            "decode compiled: modkit step tokens/s / roofline",
            dps["modkit_compiled"] / roof,
            ">= 0.5",
            dps["modkit_compiled"] / roof >= 0.5,
        )
    if cfg.profile:
        with torch.inference_mode():
            cache = model.new_cache(1, cfg.prompt + 17)
            model(ids, cache=cache)
            tok = ids[:, :1]

            def sixteen_steps():
                for _ in range(16):
                    decode_logits(model, tok, cache)

            rep.profiles.append(
                (
                    "decode eager, modkit (generate's default layout): 16 decode steps",
                    profile_table(sixteen_steps, cfg.device),
                )
            )
            rep.profiles.append(
                (
                    "decode, transformers generate (16 new tokens)",
                    profile_table(lambda: _hf_run(hf, ids, 16), cfg.device),
                )
            )


def bench_moe(cfg: Config, rep: Report) -> None:
    """8-expert top-2 SwiGLU MoE block against ``MixtralSparseMoeBlock`` with the same weights.

    modkit's dropless dispatch sorts the ``T * top_k`` assignments by expert and runs one grouped GEMM per
    projection (modkit_plugins/moe.py); transformers loops in Python over the experts that were hit (a host sync per
    forward). Also: the fixed-capacity mode (not the same function: it drops overflow), active-expert FLOP/s
    against a plain matmul of one expert's GEMM size, and ``torch.compile(fullgraph=True)`` of the block.
    """
    import transformers

    n, k, d, f, T = cfg.moe_experts, cfg.moe_top_k, cfg.d_model, cfg.d_ff, cfg.moe_tokens
    print(f"\nmoe: {n} experts, top-{k}, SwiGLU d_model {d} d_ff {f}, {T} tokens", flush=True)
    hcfg = transformers.MixtralConfig(hidden_size=d, intermediate_size=f, num_local_experts=n, num_experts_per_tok=k)
    torch.manual_seed(3)
    from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock

    block = MixtralSparseMoeBlock(hcfg).to(dtype=cfg.dtype, device=cfg.device).eval()
    with torch.no_grad():
        for p in block.parameters():
            p.normal_(0, 0.02)
    reg = modkit.get_registry()
    ctx = modkit.BuildContext(d_model=d, n_layers=1, vocab_size=cfg.vocab, max_seq_len=2048, registry=reg)

    def ours(capacity: Optional[float]):
        conf = {
            "type": "moe",
            "n_experts": n,
            "top_k": k,
            "expert": {"type": "swiglu", "d_ff": f},
            "router": {"type": "topk", "renormalize": True},
            "aux_loss_coef": 0.0,
            "capacity_factor": capacity,
        }
        with torch.device(cfg.device):
            m = ctx.build(modkit.load_component("ffn", conf)).to(cfg.dtype).eval()
        with torch.no_grad():  # transformers stores gate_up [E, 2f, d] and down [E, d, f]; modkit [E, in, out]
            m.router.proj.weight.copy_(block.gate.weight)
            gate, up = block.experts.gate_up_proj.chunk(2, dim=1)
            m.experts.gate.copy_(gate.transpose(1, 2))
            m.experts.up.copy_(up.transpose(1, 2))
            m.experts.down.copy_(block.experts.down_proj.transpose(1, 2))
        return m

    dropless, capacity = ours(None), ours(1.25)
    x = torch.randn(4, T // 4, d, dtype=cfg.dtype, device=cfg.device)
    with torch.inference_mode():
        ref = block(x)
        rep.fact(f"moe output max |modkit dropless - transformers| = {(dropless(x)[0] - ref).abs().max().item():.2e}")
        fns = {"dropless": lambda: dropless(x), "capacity": lambda: capacity(x), "hf": lambda: block(x)}
    if cfg.compile:
        explained = torch._dynamo.explain(dropless)(x)
        rep.add(
            "moe: graph breaks in the dropless block (torch._dynamo.explain)",
            explained.graph_break_count,
            "0",
            explained.graph_break_count == 0,
            note=f"{explained.graph_count} graph(s)",
        )
        torch._dynamo.reset()
        compiled = torch.compile(dropless, fullgraph=True, dynamic=False)
        with torch.inference_mode():
            start = time.perf_counter()
            cdiff = (compiled(x)[0] - ref).abs().max().item()
        rep.fact(
            f"moe: torch.compile(dropless, fullgraph=True) compiled in {time.perf_counter() - start:.1f} s; "
            f"max |compiled - transformers| = {cdiff:.2e}"
        )
        fns["compiled"] = lambda: compiled(x)
    with torch.inference_mode():
        t = interleaved(fns, cfg.repeats, cfg.device)
    active = T * k * 3 * 2.0 * d * f + 2.0 * T * d * n
    per_expert = T * k // n
    a = torch.randn(per_expert, d, dtype=cfg.dtype, device=cfg.device)
    w = torch.randn(d, f, dtype=cfg.dtype, device=cfg.device)
    mm = med(interleaved({"mm": lambda: torch.matmul(a, w)}, cfg.repeats, cfg.device)["mm"])
    mm_rate = 2.0 * per_expert * d * f / mm
    dl, cp, hf_t = med(t["dropless"]), med(t["capacity"]), med(t["hf"])
    rep.fact(
        f"moe: modkit dropless {1e3 * dl:.1f} ms, modkit capacity 1.25 {1e3 * cp:.1f} ms, transformers {1e3 * hf_t:.1f} ms; "
        f"plain matmul [{per_expert}x{d}]·[{d}x{f}] {mm_rate / 1e9:.1f} GFLOP/s"
    )
    rep.add(
        "moe eager: modkit dropless time / transformers time",
        dl / hf_t,
        "<= 1.0",
        dl / hf_t <= 1.0,
        note="both exact; grouped GEMM vs a Python loop over the hit experts",
    )
    rep.add(
        "moe eager: modkit capacity-1.25 time / transformers time",
        cp / hf_t,
        note="fixed capacity drops overflow tokens: not the same function",
    )
    rep.add(
        "moe: modkit dropless active-FLOP/s / plain-matmul FLOP/s",
        active / dl / mm_rate,
        ">= 0.85",
        active / dl / mm_rate >= 0.85,
    )
    rep.add("moe: transformers active-FLOP/s / plain-matmul FLOP/s", active / hf_t / mm_rate)
    if "compiled" in t:
        c = med(t["compiled"])
        rep.fact(f"moe: modkit dropless compiled {1e3 * c:.1f} ms")
        rep.add("moe compiled: modkit dropless time / transformers eager time", c / hf_t)
    if cfg.profile:
        with torch.inference_mode():
            rep.profiles.append(("moe, modkit dropless", profile_table(lambda: dropless(x), cfg.device)))
            rep.profiles.append(
                ("moe, transformers MixtralSparseMoeBlock", profile_table(lambda: block(x), cfg.device))
            )


def run_workloads(
    cfg: Config, only: set[str], title: str, script: str, argv: Optional[list[str]], output: Path
) -> None:
    """Run the chosen workloads (``prefill``, ``decode``, ``moe``) on ``cfg`` and write the markdown report.

    The llama-like model is built once in transformers and copied into modkit with :func:`modkit_from` (its
    memory is released before the MoE block, which matters on a GPU). ``script`` and ``argv`` make the command
    line quoted in the report.
    """
    load_before = load_average()
    start = time.perf_counter()
    print(f"load average {load_before}; torch threads {torch.get_num_threads()}", flush=True)
    rep = Report(cfg)
    if only & {"prefill", "decode"}:
        hf = hf_llama(cfg)
        model = modkit_from(hf)
        rep.fact(
            f"weights copied into modkit by modkit.from_hf(save_pretrained folder); "
            f"{sum(p.numel() for p in model.parameters()):,} parameters"
        )
        if "prefill" in only:
            bench_prefill(cfg, rep, hf, model)
        if "decode" in only:
            bench_decode(cfg, rep, hf, model)
        del hf, model
        if cfg.device.startswith("cuda"):
            torch.cuda.empty_cache()
    if "moe" in only:
        bench_moe(cfg, rep)
    load_after = load_average()
    command = f"python benchmarks/{script} " + " ".join(argv if argv is not None else sys.argv[1:])
    write_markdown(rep, output, title, command.strip(), load_before, load_after, time.perf_counter() - start)
    print(f"\nload average after: {load_after}; wrote {output}")


# ------------------------------------------------------------------------------------------------ report


def machine(cfg: Config) -> list[str]:
    """Lines describing the machine and software."""
    import transformers

    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    lines = [
        f"CPU: {cpu}, {os.cpu_count()} logical CPUs, torch threads {torch.get_num_threads()}",
        f"torch {torch.__version__}, transformers {transformers.__version__}, Python {platform.python_version()}",
    ]
    if cfg.device.startswith("cuda"):
        lines.append(f"GPU: {torch.cuda.get_device_name()}")
    return lines


def write_markdown(
    rep: Report, path: Path, title: str, command: str, load_before: str, load_after: str, seconds: float
) -> None:
    """Write the results table, facts, machine and profiles to ``path``."""
    c = rep.cfg
    out = [f"# {title}", "", f"Generated by `{command}` on {time.strftime('%Y-%m-%d %H:%M:%S')} ({seconds:.0f} s).", ""]
    out += ["## Machine", ""] + [f"- {x}" for x in machine(c)]
    out += [f"- load average (1, 5, 15 min) before: {load_before}; after: {load_after}", ""]
    out += [
        "## Configuration",
        "",
        f"llama-like: d_model {c.d_model}, {c.n_layers} layers, {c.n_heads} heads / {c.n_kv_heads} KV heads, d_ff {c.d_ff}, "
        f"vocab {c.vocab}, {str(c.dtype).replace('torch.', '')}, {c.device}; same weights in both libraries. "
        f"Prefill [{c.prefill_batch}, {c.prefill_seq}]; decode batch 1, prompt {c.prompt}, {c.new} new tokens greedy; "
        f"MoE {c.moe_experts} experts top-{c.moe_top_k} on {c.moe_tokens} tokens. Medians of {c.repeats} interleaved runs.",
        "",
    ]
    out += ["## Results", "", "| metric | value | target | met |", "|---|---:|---|---|"]
    for r in rep.rows:
        met = "" if r.met is None else ("yes" if r.met else "**no**")
        note = f" ({r.note})" if r.note else ""
        out.append(f"| {r.metric}{note} | {r.value:.3g} | {r.target or ''} | {met} |")
    out += ["", "## Measurements", ""] + [f"- {f}" for f in rep.facts]
    if rep.profiles:
        out += ["", "## Profiles (torch.profiler, self time)", ""]
        for name, table in rep.profiles:
            out += [f"### {name}", "", "```", table.rstrip(), "```", ""]
    path.write_text("\n".join(out) + "\n")

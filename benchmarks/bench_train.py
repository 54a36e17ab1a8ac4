#!/usr/bin/env python
"""Training-step benchmark: modkit against transformers' GPT-2, same config, weights, batches and optimizer.

One training step is what :meth:`modkit.train.loop.Trainer.train_step` does with ``grad_accum = 1``: set the
scheduled learning rate, forward (under ``torch.autocast`` with ``--bf16``), ``F.cross_entropy(logits.float())``
over every position, backward, ``clip_grad_norm_`` at 1.0, ``AdamW.step`` with the loop's decay grouping
(:func:`modkit.train.loop.decay_groups`: matrices and embeddings decay, vectors do not) and hyper-parameters
(:class:`modkit.train.config.TrainConfig` defaults: lr 1e-3 with warmup, betas 0.9/0.99, eps 1e-8, weight decay
0.1; ``fused=True`` on CUDA like the loop), ``zero_grad(set_to_none=True)``. The same step function runs on:

* ``modkit``: the nanoGPT spec (``specs/nanogpt-shakespeare-char.json`` at the size's shape) built with
  :func:`modkit.build` (seed 0), eager;
* ``hf``: transformers ``GPT2LMHeadModel`` loaded from :func:`modkit.to_hf` of that model (bitwise the same
  weights), ``attn_implementation="sdpa"``, ``resid/embd/attn_pdrop = 0`` (modkit's spec has dropout 0), called
  with ``use_cache=False``; the loss is computed outside the model exactly as for modkit (no ``labels``);
* ``modkit_onednn`` (CPU, where torch has oneDNN): ``modkit`` with its linear layers through oneDNN
  (:func:`modkit.nn.onednn.use_onednn_linears`), what ``modkit train`` runs on a CPU by default (``onednn_linear``);
* ``hf_eager_attn``: the same with ``attn_implementation="eager"``;
* ``modkit_compiled`` / ``hf_compiled``: ``torch.compile`` of the model (the loop compiles the model the same way;
  loss, backward and optimizer stay eager).

Every variant holds its own copy of the same initial weights and its own optimizer and takes the same batches in
the same order: random windows of the shipped tiny-shakespeare corpus (:class:`modkit.data.RandomWindows`, seed 0,
nanoGPT's sampler). Equal work is checked first: the loss of step 0 and every gradient of step 0 are compared with
transformers' (gradients through the same export mapping as the weights), and after the run the last losses and
the final weights of all variants.

Timing: step 0 (checks, compilation) and ``--warmup`` more steps are untimed; then ``--rounds`` rounds, each running
``steps`` timed steps of every variant in turn (A, A, B, B, ..., the order rotated every round), so that load
drifts on a shared machine hit every variant alike. Figures are medians of the per-step times; ratios are of the
medians. Peak memory: one extra step per variant, on CUDA ``torch.cuda.max_memory_allocated`` above the memory
allocated before the step; on the CPU the peak of the live bytes allocated through torch's CPU allocator during the
step (``torch.profiler`` with ``profile_memory=True``: its allocation events carry the running total of live bytes
allocated while profiling), i.e. activations, gradients and temporaries, not the weights and optimizer state that
existed before the step (those are reported separately, from the tensors). Buffers that oneDNN/MKL allocate on
their own are not seen on either side.

Where the time goes: modkit eager and transformers eager then run a few more steps each under ``torch.profiler``
(interleaved); the report lists each op's self time, median over those steps, largest differences first.

Sizes: ``small`` is nanoGPT's CPU recipe (4 layers, 4 heads, d_model 128, context 64, batch 12, vocab 65: per-op
overhead dominates); ``big`` nanoGPT's GPU-recipe shape (6 layers, 6 heads, d_model 384, context 256) at batch 8
(GEMM-bound). Usage::

    .venv/bin/python benchmarks/bench_train.py                       # both sizes, writes benchmarks/results_train.md
    .venv/bin/python benchmarks/bench_train.py --rounds 12 --threads 1
    .venv/bin/python benchmarks/bench_train.py --size small --no-compile --rounds 3   # a quick look
    .venv/bin/python benchmarks/bench_train.py --device cuda --bf16  # where a GPU is available

A script, not a timed test: absolute times depend on the machine and its load (both recorded in the report).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import gc
import json
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Callable, Optional

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import _bench as B  # noqa: E402  (puts the repository root on sys.path, helpers for the report)
import modkit  # noqa: E402
from modkit.data import RandomWindows, TokenData, default_dataset  # noqa: E402
from modkit.train.config import TrainConfig  # noqa: E402
from modkit.train.loop import decay_groups  # noqa: E402
from modkit.train.schedule import lr_at  # noqa: E402
from modkit.nn.onednn import onednn_available, use_onednn_linears  # noqa: E402

SPEC = B.ROOT / "specs" / "nanogpt-shakespeare-char.json"


@dataclass
class Size:
    """One model and batch shape, with its default number of rounds and timed steps per round."""

    name: str
    label: str
    n_layers: int
    n_heads: int
    d_model: int
    seq_len: int
    batch_size: int
    rounds: int
    steps: int
    warmup: int
    profile_steps: int

    @property
    def tokens(self) -> int:
        """Tokens per step."""
        return self.batch_size * self.seq_len


SIZES = {
    "small": Size("small", "nanoGPT CPU recipe", 4, 4, 128, 64, 12, rounds=6, steps=4, warmup=2, profile_steps=8),
    "big": Size(
        "big", "nanoGPT GPU-recipe shape, batch 8", 6, 6, 384, 256, 8, rounds=4, steps=1, warmup=0, profile_steps=3
    ),
}

REFERENCE = "hf"  # the denominator of the time ratios


@dataclass
class Variant:
    """One model under test with its optimizer, its forward (returning logits) and its measurements."""

    name: str
    model: torch.nn.Module
    forward: Callable[[torch.Tensor], torch.Tensor]
    compiled: bool = False
    optimizer: Optional[torch.optim.Optimizer] = None
    params: list[torch.nn.Parameter] = field(default_factory=list)
    step: int = 0
    times: list[float] = field(default_factory=list)
    round_times: list[list[float]] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    first_step_s: float = 0.0
    peak_bytes: int = 0
    state_bytes: int = 0
    graphs: Optional[int] = None
    graph_breaks: Optional[int] = None


# ------------------------------------------------------------------------------------------------ models


def spec_for(size: Size, vocab_size: int) -> dict:
    """The nanoGPT spec at ``size``'s shape (d_ff = 4 d_model, max_seq_len = seq_len)."""
    spec = json.loads(SPEC.read_text())
    spec.update(n_layers=size.n_layers, d_model=size.d_model, max_seq_len=size.seq_len, vocab_size=vocab_size)
    spec["name"] = f"nanogpt-{size.name}"
    spec["block"]["attention"]["n_heads"] = size.n_heads
    spec["block"]["ffn"]["d_ff"] = 4 * size.d_model
    return spec


def hf_from_folder(folder: str, attn: str, device: str):
    """transformers' ``GPT2LMHeadModel`` from a :func:`modkit.to_hf` folder, dropout 0, training mode."""
    import transformers

    model = transformers.GPT2LMHeadModel.from_pretrained(
        folder, attn_implementation=attn, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0
    )
    if model.config.activation_function != "gelu":
        raise RuntimeError(f"exported activation is {model.config.activation_function!r}, expected exact 'gelu'")
    return model.to(device).train()


def make_variants(reference: "modkit.Model", folder: str, args) -> list[Variant]:
    """The variants of one size; every model holds ``reference``'s weights (``folder``: its ``to_hf`` export)."""
    dev = args.device

    def ours(compiled: bool, onednn: bool = False) -> Variant:
        m = copy.deepcopy(reference).to(dev).train()
        if onednn:  # what modkit train runs on a CPU by default (its onednn_linear option)
            use_onednn_linears(m)
        fwd = torch.compile(m) if compiled else m
        name = "modkit_onednn" if onednn else "modkit_compiled" if compiled else "modkit"
        return Variant(name, m, lambda x: fwd(x).logits, compiled=compiled)

    def theirs(name: str, attn: str, compiled: bool) -> Variant:
        h = hf_from_folder(folder, attn, dev)
        fwd = torch.compile(h) if compiled else h
        return Variant(name, h, lambda x: fwd(input_ids=x, use_cache=False).logits, compiled=compiled)

    out = [ours(False), theirs("hf", "sdpa", False)]
    if dev == "cpu" and onednn_available():
        out.append(ours(False, onednn=True))
    if not args.no_hf_eager_attn:
        out.append(theirs("hf_eager_attn", "eager", False))
    if not args.no_compile:
        out.append(ours(True))
        if not args.no_compile_hf:
            out.append(theirs("hf_compiled", "sdpa", True))
    cfg = TrainConfig()
    fused = {"fused": True} if dev.startswith("cuda") else {}
    for v in out:
        v.optimizer = torch.optim.AdamW(
            decay_groups(v.model, cfg.weight_decay), lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.adam_eps, **fused
        )
        v.params = [p for group in v.optimizer.param_groups for p in group["params"]]
    return out


# ------------------------------------------------------------------------------------------------ the step


def train_step(v: Variant, x: torch.Tensor, y: torch.Tensor, cfg: TrainConfig, autocast, inspect=None) -> torch.Tensor:
    """One optimizer step of ``v`` on ``(x, y)``, as :meth:`Trainer.train_step` with ``grad_accum = 1``.

    ``inspect(v, loss)`` (if given) runs after the backward, before clipping: the gradients are complete there.
    Returns the detached loss.
    """
    lr = lr_at(v.step, cfg)
    for group in v.optimizer.param_groups:
        group["lr"] = lr
    with autocast():
        logits = v.forward(x)
    loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1))
    loss.backward()
    if inspect is not None:
        inspect(v, loss)
    torch.nn.utils.clip_grad_norm_(v.params, cfg.grad_clip)
    v.optimizer.step()
    v.optimizer.zero_grad(set_to_none=True)
    v.step += 1
    return loss.detach()


# ------------------------------------------------------------------------------------------------ equality checks


def hf_named(model: "modkit.Model", tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``tensors`` (modkit parameter name -> tensor of that shape, e.g. gradients) under transformers' names,
    through :func:`modkit.to_hf`'s own mapping (q/k/v fused into ``c_attn``, ``Conv1D`` transposes)."""
    from safetensors.torch import load_file

    shadow = copy.deepcopy(model).cpu()
    with torch.no_grad():
        for name, p in shadow.named_parameters():
            p.copy_(tensors[name])
    with tempfile.TemporaryDirectory() as d:
        modkit.to_hf(shadow, d)
        return load_file(str(Path(d) / "model.safetensors"))


def max_diff(ours: dict[str, torch.Tensor], theirs: dict[str, torch.Tensor]) -> tuple[float, str]:
    """Largest ``|a - b|`` over the tensors both name, and the name where it occurs; raises if a name is missing."""
    missing = sorted(set(theirs) - set(ours))
    if missing:
        raise RuntimeError(f"no counterpart in modkit's export for {missing}")
    worst, where = 0.0, ""
    for name, t in theirs.items():
        d = (ours[name].float().cpu() - t.float().cpu()).abs().max().item()
        if d >= worst:
            worst, where = d, name
    return worst, where


def hf_tensors(model, grads: bool) -> dict[str, torch.Tensor]:
    """transformers' parameters (or their gradients) by name, the tied head under ``lm_head.weight`` dropped."""
    out = {}
    for name, p in model.named_parameters():  # tied: lm_head.weight is not listed separately
        out[name] = (p.grad if grads else p).detach().clone()
    return out


# ------------------------------------------------------------------------------------------------ measurements


def profile_peak_bytes(fn: Callable[[], object]) -> int:
    """Peak live bytes allocated through torch's CPU allocator while ``fn`` runs (not counting earlier tensors).

    ``torch.profiler`` with ``profile_memory=True`` records every allocation and free on the CPU with the running
    total of the bytes allocated since profiling began (``total_allocated``); frees of tensors allocated before do
    not lower it. The maximum of that total is the peak.
    """
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    peak, stack = 0, list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        node = stack.pop()
        if node.tag == _EventType.Allocation and node.extra_fields.device.type == "cpu":
            peak = max(peak, int(node.extra_fields.total_allocated))
        stack.extend(node.children)
    return peak


def step_peak_bytes(fn: Callable[[], object], device: str) -> int:
    """Peak bytes allocated during ``fn`` above what was allocated before it (CUDA: allocator statistics)."""
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        fn()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - base
    return profile_peak_bytes(fn)


def persistent_bytes(v: Variant) -> int:
    """Bytes of the parameters and the optimizer state (each tensor counted once)."""
    seen, total = set(), 0
    tensors = list(v.model.parameters()) + [
        t for s in v.optimizer.state.values() for t in s.values() if torch.is_tensor(t)
    ]
    for t in tensors:
        if id(t) not in seen:
            seen.add(id(t))
            total += t.numel() * t.element_size()
    return total


def op_times(fn: Callable[[], object], device: str) -> dict[str, tuple[int, float]]:
    """``{op name: (calls, self seconds)}`` of one call of ``fn`` under torch.profiler (device time on CUDA)."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.startswith("cuda") else [])
    with profile(activities=acts) as prof:
        fn()
        B.sync(device)
    attr = "self_device_time_total" if device.startswith("cuda") else "self_cpu_time_total"
    return {e.key: (e.count, getattr(e, attr) / 1e6) for e in prof.key_averages()}


def op_comparison(runs: dict[str, list[dict[str, tuple[int, float]]]], a: str, b: str, rows: int) -> str:
    """A markdown table of per-op self time, median over the profiled steps, ``a`` against ``b``, by |difference|."""

    def medians(name: str) -> dict[str, tuple[int, float]]:
        keys = {k for r in runs[name] for k in r}
        return {
            k: (max(r.get(k, (0, 0.0))[0] for r in runs[name]), B.med([r.get(k, (0, 0.0))[1] for r in runs[name]]))
            for k in keys
        }

    ma, mb = medians(a), medians(b)
    total_a = B.med([sum(t for _, t in r.values()) for r in runs[a]])
    total_b = B.med([sum(t for _, t in r.values()) for r in runs[b]])
    keys = sorted(set(ma) | set(mb), key=lambda k: -abs(ma.get(k, (0, 0.0))[1] - mb.get(k, (0, 0.0))[1]))
    lines = [f"| op | {a} calls | {a} ms | {b} calls | {b} ms | {a} − {b} ms |", "|---|---:|---:|---:|---:|---:|"]
    for k in keys[:rows]:
        (ca, ta), (cb, tb) = ma.get(k, (0, 0.0)), mb.get(k, (0, 0.0))
        lines.append(f"| `{k}` | {ca} | {1e3 * ta:.2f} | {cb} | {1e3 * tb:.2f} | {1e3 * (ta - tb):+.2f} |")
    lines.append(
        f"| **all ops (self time)** | {sum(c for c, _ in ma.values())} | {1e3 * total_a:.2f} | "
        f"{sum(c for c, _ in mb.values())} | {1e3 * total_b:.2f} | {1e3 * (total_a - total_b):+.2f} |"
    )
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------ one size


@dataclass
class SizeResult:
    """What the report shows for one size."""

    size: Size
    variants: list[Variant]
    facts: list[str]
    n_params: int
    profiles: list[tuple[str, str]]


def run_size(size: Size, args, data: TokenData) -> SizeResult:
    """Build the variants, check equal work, time them interleaved, measure memory; returns the figures."""
    dev, cfg = args.device, TrainConfig()
    facts: list[str] = []

    def fact(line: str) -> None:
        facts.append(line)
        print(f"  {line}", flush=True)

    rounds = args.rounds if args.rounds is not None else size.rounds
    steps = args.steps if args.steps is not None else size.steps
    warmup = args.warmup if args.warmup is not None else size.warmup
    print(
        f"\n{size.name}: {size.label}: {size.n_layers} layers, {size.n_heads} heads, d_model {size.d_model}, "
        f"context {size.seq_len}, batch {size.batch_size}",
        flush=True,
    )
    torch._dynamo.reset()
    spec = spec_for(size, data.vocab_size)
    total_steps = 1 + warmup + rounds * steps + 1
    sampler = RandomWindows(data.train, size.batch_size, size.seq_len, seed=0)
    batches = [tuple(t.to(dev) for t in sampler.next()) for _ in range(total_steps)]
    with tempfile.TemporaryDirectory() as folder:
        reference = modkit.build(spec, seed=0)
        modkit.to_hf(reference, folder)
        variants = make_variants(reference, folder, args)
    by_name = {v.name: v for v in variants}
    n_params = sum(p.numel() for p in by_name["modkit"].model.parameters())
    fact(
        f"{n_params:,} parameters; {size.tokens:,} tokens per step; weights: modkit.build(seed 0) -> modkit.to_hf -> "
        "GPT2LMHeadModel.from_pretrained"
    )
    autocast = (
        (lambda: torch.autocast(torch.device(dev).type, dtype=torch.bfloat16)) if args.bf16 else contextlib.nullcontext
    )

    # weights equal: eval logits of the two eager models on the first batch
    with torch.no_grad():
        m, h = by_name["modkit"].model.eval(), by_name["hf"].model.eval()
        x0 = batches[0][0]
        with autocast():
            d = (m(x0).logits.float() - h(input_ids=x0, use_cache=False).logits.float()).abs().max().item()
        m.train(), h.train()
    fact(f"same weights: eval logits max |modkit - transformers| = {d:.2e}")

    # step 0: losses and gradients compared with transformers (sdpa), then the step is taken
    grads: dict[str, dict[str, torch.Tensor]] = {}
    losses0: dict[str, float] = {}

    inspect_s: dict[str, float] = {}

    def inspect(v: Variant, loss: torch.Tensor) -> None:
        t = time.perf_counter()
        losses0[v.name] = loss.item()
        if v.name.startswith("modkit"):
            grads[v.name] = hf_named(v.model, {n: p.grad.detach() for n, p in v.model.named_parameters()})
        else:
            grads[v.name] = hf_tensors(v.model, grads=True)
        inspect_s[v.name] = time.perf_counter() - t

    for v in variants:
        x, y = batches[0]
        before = _graph_counters()
        B.sync(dev)
        t = time.perf_counter()
        train_step(v, x, y, cfg, autocast, inspect)
        B.sync(dev)
        v.first_step_s = time.perf_counter() - t - inspect_s[v.name]  # the comparison's export is not the step's
        if v.compiled:
            after = _graph_counters()
            v.graphs, v.graph_breaks = after[0] - before[0], after[1] - before[1]
            fact(
                f"{v.name}: first step (compilation included) {v.first_step_s:.1f} s; {v.graphs} graph(s), "
                f"{v.graph_breaks} graph break(s)"
            )
    ref = grads["hf"]
    for name in losses0:
        if name == "hf":
            continue
        gd, where = max_diff(grads[name], ref)
        fact(
            f"step 0, {name} vs hf: loss |Δ| = {abs(losses0[name] - losses0['hf']):.2e} "
            f"({losses0[name]:.6f} vs {losses0['hf']:.6f}); gradients max |Δ| = {gd:.2e} (at {where}; "
            f"largest gradient entry {max(t.abs().max().item() for t in ref.values()):.2e})"
        )
    grads.clear()  # the gradients of every variant are no longer needed

    # untimed warmup, then interleaved timed rounds (each variant runs `steps` steps in turn, order rotated)
    for v in variants:
        for _ in range(warmup):
            x, y = batches[v.step]
            train_step(v, x, y, cfg, autocast)
    for r in range(rounds):
        order = variants[r % len(variants) :] + variants[: r % len(variants)]
        for v in order:
            v.round_times.append([])
            for _ in range(steps):
                x, y = batches[v.step]
                gc.collect()
                B.sync(dev)
                t = time.perf_counter()
                loss = train_step(v, x, y, cfg, autocast)
                B.sync(dev)
                v.times.append(time.perf_counter() - t)
                v.round_times[-1].append(v.times[-1])
                v.losses.append(loss.item())
        print(
            f"  round {r + 1}/{rounds}: "
            + ", ".join(f"{v.name} {1e3 * B.med(v.times):.1f}" for v in variants)
            + " ms/step (running medians)",
            flush=True,
        )

    # memory: one more step per variant, measured
    for v in variants:
        x, y = batches[v.step]
        v.state_bytes = persistent_bytes(v)
        gc.collect()
        v.peak_bytes = step_peak_bytes(lambda: v.losses.append(train_step(v, x, y, cfg, autocast).item()), dev)
    fact("peak step bytes: " + ", ".join(f"{v.name} {v.peak_bytes:,}" for v in variants))

    # after the run: every variant took the same steps on the same batches
    ref_v = by_name["hf"]
    final_ref = hf_tensors(ref_v.model, grads=False)
    for v in variants:
        if v is ref_v:
            continue
        ours = (
            hf_named(v.model, dict(v.model.named_parameters()))
            if v.name.startswith("modkit")
            else hf_tensors(v.model, grads=False)
        )
        wd, where = max_diff(ours, final_ref)
        ld = max(abs(a - b) for a, b in zip(v.losses, ref_v.losses))
        fact(
            f"after {v.step} steps, {v.name} vs hf: losses max |Δ| = {ld:.2e}; weights max |Δ| = {wd:.2e} (at {where})"
        )

    profiles: list[tuple[str, str]] = []
    if not args.no_profile:
        pair = [by_name["modkit"], ref_v]
        runs: dict[str, list] = {v.name: [] for v in pair}
        n = args.profile_steps if args.profile_steps is not None else size.profile_steps
        for i in range(n):  # interleaved like the timing; the batch of the last timed step, again and again
            for v in pair if i % 2 == 0 else pair[::-1]:
                x, y = batches[total_steps - 2]
                gc.collect()
                runs[v.name].append(op_times(lambda: train_step(v, x, y, cfg, autocast), dev))
        profiles.append(
            (
                f"{size.name}: self time per op, median of {n} profiled steps each (largest differences first)",
                op_comparison(runs, "modkit", "hf", args.profile_rows),
            )
        )
    return SizeResult(size, variants, facts, n_params, profiles)


def _graph_counters() -> tuple[int, int]:
    """(unique graphs compiled, graph breaks) so far, from torch._dynamo's counters."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"]), int(sum(counters["graph_break"].values()))


# ------------------------------------------------------------------------------------------------ report


def paired_ratios(res: SizeResult, a: str, b: str) -> list[float]:
    """Per round, median step time of ``a`` over that of ``b`` (the two ran back to back in that round)."""
    va, vb = (next(v for v in res.variants if v.name == n) for n in (a, b))
    return [B.med(x) / B.med(y) for x, y in zip(va.round_times, vb.round_times)]


def ratio_lines(res: SizeResult) -> list[tuple[str, float, str, Optional[bool]]]:
    """``(what, value, target, met)`` of the ratios for one size."""
    t = {v.name: B.med(v.times) for v in res.variants}
    mem = {v.name: v.peak_bytes for v in res.variants}
    out: list[tuple[str, float, str, Optional[bool]]] = []
    r = t["modkit"] / t["hf"]
    out.append(("eager step time: modkit / transformers (sdpa)", r, "<= 1.0", r <= 1.0))
    per_round = paired_ratios(res, "modkit", "hf")
    out.append(
        (
            f"eager, per-round ratios (modkit / transformers sdpa, {len(per_round)} rounds): median "
            f"(range {min(per_round):.3f}–{max(per_round):.3f})",
            B.med(per_round),
            "",
            None,
        )
    )
    if "modkit_onednn" in t:
        r = t["modkit_onednn"] / t["hf"]
        out.append(
            (
                "eager step time: modkit with oneDNN linears (modkit train's CPU default) / transformers (sdpa)",
                r,
                "<= 1.0",
                r <= 1.0,
            )
        )
    if "hf_eager_attn" in t:
        out.append(
            ("eager step time: modkit / transformers (eager attention)", t["modkit"] / t["hf_eager_attn"], "", None)
        )
    if "modkit_compiled" in t:
        out.append(
            (
                "compiled step time: modkit compiled / transformers eager (sdpa)",
                t["modkit_compiled"] / t["hf"],
                "",
                None,
            )
        )
        out.append(("compiled step time: modkit compiled / modkit eager", t["modkit_compiled"] / t["modkit"], "", None))
    if "hf_compiled" in t:
        out.append(
            (
                "compiled step time: modkit compiled / transformers compiled",
                t["modkit_compiled"] / t["hf_compiled"],
                "",
                None,
            )
        )
    r = mem["modkit"] / mem["hf"]
    out.append(("peak step memory, eager: modkit / transformers (sdpa)", r, "<= 1.0", r <= 1.0))
    if "hf_compiled" in mem:
        r = mem["modkit_compiled"] / mem["hf_compiled"]
        out.append(("peak step memory, compiled: modkit / transformers", r, "<= 1.0", r <= 1.0))
    return out


def print_table(res: SizeResult) -> list[str]:
    """Print and return the markdown table of one size."""
    ref = B.med(next(v for v in res.variants if v.name == REFERENCE).times)
    s = res.size
    lines = [
        f"### {s.name}: {s.label} ({s.n_layers} layers, {s.n_heads} heads, d_model {s.d_model}, context "
        f"{s.seq_len}, batch {s.batch_size}; {res.n_params:,} parameters)",
        "",
        "| variant | median ms/step | (min–max) | tokens/s | time ÷ transformers (sdpa) | peak step MiB | weights + AdamW state MiB |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for v in res.variants:
        m = B.med(v.times)
        lines.append(
            f"| {v.name} | {1e3 * m:.1f} | {1e3 * min(v.times):.1f}–{1e3 * max(v.times):.1f} | "
            f"{s.tokens / m:,.0f} | {m / ref:.3f} | {v.peak_bytes / 2**20:.2f} | {v.state_bytes / 2**20:.2f} |"
        )
    lines += ["", "| ratio | value | target | met |", "|---|---:|---|---|"]
    for what, value, target, met in ratio_lines(res):
        flag = "" if met is None else ("yes" if met else "**no**")
        lines.append(f"| {what} | {value:.3f} | {target} | {flag} |")
    print("\n" + "\n".join(lines), flush=True)
    return lines


def write_report(
    path: Path, results: list[SizeResult], args, argv, load_before: str, load_after: str, seconds: float
) -> None:
    """The markdown report: machine, load, settings, per-size tables, checks, profiles."""
    command = ".venv/bin/python benchmarks/bench_train.py " + " ".join(argv if argv is not None else sys.argv[1:])
    out = [
        "# Training-step benchmark: modkit vs transformers GPT-2",
        "",
        f"Generated by `{command.strip()}` on {time.strftime('%Y-%m-%d %H:%M:%S')} ({seconds:.0f} s).",
        "",
        "## Machine",
        "",
    ]
    out += [f"- {x}" for x in B.machine(SimpleNamespace(device=args.device))]
    out += [f"- load average (1, 5, 15 min) before: {load_before}; after: {load_after}", ""]
    cfg = TrainConfig()
    out += [
        "## Settings",
        "",
        f"A step = lr schedule, forward{' (bf16 autocast)' if args.bf16 else ''}, cross-entropy on float32 logits, "
        f"backward, clip_grad_norm_ {cfg.grad_clip}, AdamW (lr {cfg.lr} with {cfg.warmup_steps} warmup steps, betas "
        f"{cfg.beta1}/{cfg.beta2}, eps {cfg.adam_eps}, weight decay {cfg.weight_decay} on matrices and embeddings), "
        "zero_grad(set_to_none=True); dropout 0; device "
        f"{args.device}, {'bfloat16 autocast' if args.bf16 else 'float32'}. Same initial weights, same batches "
        "(random windows of tiny shakespeare, seed 0) in every variant. Timed steps run interleaved in rounds "
        "(every variant in turn, order rotated each round); medians of the per-step times. Peak step memory: "
        + (
            "torch.cuda.max_memory_allocated during a step above the memory allocated before it."
            if args.device.startswith("cuda")
            else "peak of the live bytes allocated through torch's CPU allocator during one step (torch.profiler "
            "profile_memory allocation events), not counting the weights and AdamW state that exist before it "
            "(listed separately); oneDNN/MKL scratch buffers are not seen on either side."
        ),
        "",
    ]
    out += ["## Results", ""]
    for res in results:
        out += print_table(res) + ["", "Checks and notes:", ""] + [f"- {f}" for f in res.facts] + [""]
    profiles = [p for res in results for p in res.profiles]
    if profiles:
        out += ["## Where the time goes (torch.profiler, modkit eager against transformers eager)", ""]
        for name, table in profiles:
            out += [f"### {name}", "", table, ""]
    path.write_text("\n".join(out) + "\n")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], allow_abbrev=False)
    p.add_argument(
        "--size", choices=sorted(SIZES), action="append", help="run only these sizes (default: small and big)"
    )
    p.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default: small 6, big 4)")
    p.add_argument(
        "--steps", type=int, default=None, help="timed steps of each variant per round (default: small 4, big 1)"
    )
    p.add_argument("--warmup", type=int, default=None, help="untimed steps after step 0 (default: small 2, big 0)")
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's choice)")
    p.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    p.add_argument(
        "--bf16", action="store_true", help="forward under torch.autocast(bfloat16), as the loop's precision=bfloat16"
    )
    p.add_argument("--no-compile", action="store_true", help="skip the torch.compile variants")
    p.add_argument("--no-compile-hf", action="store_true", help="do not compile transformers")
    p.add_argument("--no-hf-eager-attn", action="store_true", help="skip transformers with attn_implementation='eager'")
    p.add_argument(
        "--no-profile", action="store_true", help="skip the per-op profile of modkit eager against transformers eager"
    )
    p.add_argument("--profile-rows", type=int, default=25, help="rows of the per-op comparison")
    p.add_argument(
        "--profile-steps", type=int, default=None, help="profiled steps of each side (default: small 8, big 3)"
    )
    p.add_argument(
        "-o",
        "--output",
        default=str(HERE / "results_train.md"),
        help="markdown report (default benchmarks/results_train.md)",
    )
    args = p.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        p.error("--device cuda but CUDA is not available here")
    if args.threads:
        torch.set_num_threads(args.threads)
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    load_before = B.load_average()
    start = time.perf_counter()
    print(
        f"load average {load_before}; torch {torch.__version__}, threads {torch.get_num_threads()}, device {args.device}",
        flush=True,
    )
    data = TokenData.open(default_dataset())
    results = [run_size(SIZES[name], args, data) for name in (args.size or ["small", "big"])]
    load_after = B.load_average()
    write_report(Path(args.output), results, args, argv, load_before, load_after, time.perf_counter() - start)
    print(f"\nload average after: {load_after}; {time.perf_counter() - start:.0f} s; wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Prefill against decode, with and without the KV cache, measured and set against ``modkit cost``'s prediction.

    .venv/bin/python benchmarks/bench_decode.py --threads 1                     # what docs/experiments/prefill-vs-decode.md shows
    .venv/bin/python benchmarks/bench_decode.py --spec specs/tiny-llama.json --contexts 64,256 --repeats 3
    .venv/bin/python benchmarks/bench_decode.py --weights -o benchmarks/results_decode_weights.md  # weight formats

With ``--weights`` it compares float32, bfloat16 and int8 linear weights for greedy decoding instead, in modkit and in
transformers with the same quantization (``_decode_weights.py`` says how).

For each model (random weights, seed 0, float32, eval, ``nn.Linear`` weights column-major as ``modkit generate``
stores them on a CPU with MKL), and each context ``N``:

* **prefill**: one forward over ``N`` prompt tokens with the logits of every position (the ``prefill`` of
  ``modkit cost``); tokens/s = ``N / seconds``;
* **decode, cached**: one new token at a time through a :class:`modkit.nn.cache.KVCache` allocated for ``N`` tokens (a
  static cache attends over every slot it allocated, masked or not, so it is sized to the run) that holds the
  ``N - steps`` before the first timed step; each round times ``steps`` consecutive steps on a fresh copy of that
  cache, the last of them attending to ``N`` keys; per-step median;
* **decode, uncached**: the same next token by re-running the whole ``N``-token prefix (head on the last position
  only, ``logits_to_keep=1``), as a loop without a cache does at every step.

The references are measured in the same run: the bandwidth of a 512 MiB tensor copy (read + write) and the FLOP/s
of a plain ``[N, d_model] @ [d_model, d_ff]`` ``torch.matmul`` at the largest prefill (the model's own FFN GEMM
size). ``modkit cost``'s model (:class:`modkit.CostModel`, the code behind ``modkit cost SPEC --dtype float32
--bandwidth B --peak-flops F``) turns them into predictions: prefill seconds = FLOPs / matmul FLOP/s; a decode
step's roofline = ``max(weight + KV bytes / bandwidth, FLOPs / matmul FLOP/s)``. Ratios are measured ÷ predicted
within this run; absolute times move with the machine's load (the report gives the load average).

Correctness: after a short prompt, ``--check-steps`` greedy steps are decoded with the cache and each step's logits
are compared with a full recomputation of the prefix; the report prints the max |difference| and whether the greedy
tokens agree. Medians of ``--repeats`` rounds after one warm-up; the cases of a context are interleaved. Not a
timed test.
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Callable

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import modkit  # noqa: E402
from modkit.analysis.cost import CostModel, Workload  # noqa: E402
from modkit.inference.generate import column_major_linears, decode_logits  # noqa: E402

#: (spec, contexts) measured by default: nanoGPT's shakespeare-char shape with a 1,024-token position table, and the
#: benchmarks' llama-like reference model as a spec.
DEFAULTS = [
    ("docs/experiments/specs/nanogpt-shakespeare-char-1k.json", (64, 256, 1024)),
    ("docs/experiments/specs/llama-like-55m.json", (128, 512, 2048)),
]


def med(xs: list[float]) -> float:
    """Median."""
    return statistics.median(xs)


def load_average() -> str:
    """1/5/15-minute load averages, ``n/a`` where unsupported."""
    try:
        return "{:.2f}, {:.2f}, {:.2f}".format(*os.getloadavg())
    except OSError:
        return "n/a"


def cpu_name() -> str:
    """The CPU model from /proc/cpuinfo, else ``platform.processor()``."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


#: What the timings count: "cpu" (the process's CPU time, ``time.process_time``) or "wall" (``time.perf_counter``).
CLOCK = {"name": "cpu"}


def timed(fn: Callable[[], object], walls: list[float] | None = None) -> float:
    """Seconds of one call of ``fn`` on the clock of :data:`CLOCK` (a garbage collection first, outside the timing).

    With one torch thread the work runs on the calling thread, so on a machine shared with other jobs the
    process's CPU time counts the work and not the time spent waiting for a core; the wall time is appended to
    ``walls`` when given, so the report can say how much waiting there was.
    """
    gc.collect()
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    if walls is not None:
        walls.append(wall)
    return cpu if CLOCK["name"] == "cpu" else wall


def copy_bandwidth(repeats: int, nbytes: int = 512 * 2**20) -> float:
    """Bytes/s of a large float32 tensor copy, counting read + write (``2 · nbytes / seconds``, median)."""
    src = torch.ones(nbytes // 4)
    dst = torch.empty_like(src)
    dst.copy_(src)
    return 2 * nbytes / med([timed(lambda: dst.copy_(src)) for _ in range(repeats)])


def matmul_flops(rows: int, d_in: int, d_out: int, repeats: int) -> float:
    """FLOP/s of a plain float32 ``[rows, d_in] @ [d_in, d_out]`` (median of ``repeats`` after one warm-up)."""
    a, w = torch.randn(rows, d_in), torch.randn(d_in, d_out)
    torch.matmul(a, w)
    return 2.0 * rows * d_in * d_out / med([timed(lambda: torch.matmul(a, w)) for _ in range(repeats)])


def d_ff_of(spec: modkit.ModelSpec) -> int:
    """The block FFN's ``d_ff`` (the width of the prefill GEMM used as the FLOP/s reference)."""
    return int(getattr(spec.block.ffn, "d_ff", 4 * spec.d_model))


def primed_cache(model: modkit.Model, ids: torch.Tensor, n: int, max_len: int, steps: int):
    """A cache for ``max_len`` tokens holding ``ids[:, :n - steps]`` (the prefix before ``steps`` timed steps)."""
    cache = model.new_cache(1, max_len)
    with torch.inference_mode():
        model(ids[:, : n - steps], cache=cache, logits_to_keep=1)
    return cache


def decode_steps(model: modkit.Model, ids: torch.Tensor, cache, n: int, steps: int) -> None:
    """Feed ``ids[:, n - steps : n]`` one token at a time through ``cache`` (the last step attends to ``n`` keys)."""
    for p in range(n - steps, n):
        decode_logits(model, ids[:, p : p + 1], cache)


def check_cache(model: modkit.Model, prompt: int, steps: int) -> dict:
    """Greedy decoding with the cache against recomputing the prefix at every step.

    Returns ``{"max_abs_diff", "max_abs_logit", "tokens_equal", "steps", "prompt"}``: the largest
    ``|cached - recomputed|`` over every step's next-token logits, the largest |logit| for scale, and whether the two
    greedy continuations are the same tokens.
    """
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, model.spec.vocab_size, (1, prompt), generator=g)
    cache = model.new_cache(1, prompt + steps)
    cached = [model(ids, cache=cache, logits_to_keep=1).logits[:, -1]]
    seq_c, seq_r = ids, ids
    recomputed = [model(seq_r, logits_to_keep=1).logits[:, -1]]
    for _ in range(steps - 1):
        seq_c = torch.cat([seq_c, cached[-1].argmax(-1, keepdim=True)], dim=1)
        seq_r = torch.cat([seq_r, recomputed[-1].argmax(-1, keepdim=True)], dim=1)
        cached.append(decode_logits(model, seq_c[:, -1:], cache))
        recomputed.append(model(seq_r, logits_to_keep=1).logits[:, -1])
    c, r = torch.stack(cached), torch.stack(recomputed)
    return {
        "prompt": prompt,
        "steps": steps,
        "max_abs_diff": float((c - r).abs().max()),
        "max_abs_logit": float(r.abs().max()),
        "tokens_equal": bool(torch.equal(seq_c, seq_r)),
    }


def bench_model(path: str, contexts: tuple[int, ...], args: argparse.Namespace) -> dict:
    """All measurements and predictions for one spec (see the module docstring)."""
    model = modkit.build(path, seed=0, dtype=torch.float32).eval()
    spec = model.spec
    column_major_linears(model)
    costs = CostModel(path)
    too_long = [n for n in contexts if n > spec.max_seq_len]
    if too_long:
        raise SystemExit(
            f"{path}: contexts {too_long} exceed max_seq_len {spec.max_seq_len}; give --contexts within it"
        )
    n_max = max(contexts)
    bw = copy_bandwidth(args.repeats)
    peak = matmul_flops(n_max, spec.d_model, d_ff_of(spec), args.repeats)
    print(
        f"\n{spec.name} ({path}): {costs.params()['total']:,} parameters; copy bandwidth {bw / 1e9:.2f} GB/s; "
        f"matmul [{n_max}, {spec.d_model}] @ [{spec.d_model}, {d_ff_of(spec)}] {peak / 1e9:.1f} GFLOP/s",
        flush=True,
    )
    print(
        f"  prediction: modkit cost {path} --dtype float32 --bandwidth {bw:.3g} --peak-flops {peak:.3g} --context N",
        flush=True,
    )
    with torch.inference_mode():
        check = check_cache(model, args.check_prompt, args.check_steps)
    print(
        f"  cached decode vs recomputation: max |diff| {check['max_abs_diff']:.3g} over {check['steps']} greedy steps "
        f"(max |logit| {check['max_abs_logit']:.3g}); greedy tokens equal: {check['tokens_equal']}",
        flush=True,
    )
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, spec.vocab_size, (1, n_max), generator=g)
    if min(contexts) <= args.steps:
        raise SystemExit(f"--steps {args.steps} must be below the smallest context {min(contexts)}")
    rows = []
    for n in contexts:
        base = primed_cache(model, ids, n, n, args.steps)

        def prefill():
            model(ids[:, :n])

        def uncached():
            model(ids[:, :n], logits_to_keep=1)

        def cached():
            decode_steps(model, ids, copy.deepcopy(base), n, args.steps)

        times: dict[str, list[float]] = {"prefill": [], "uncached": [], "cached": []}
        walls: dict[str, list[float]] = {"prefill": [], "uncached": [], "cached": []}
        with torch.inference_mode():
            for r in range(args.repeats + 1):
                for name, fn in (("prefill", prefill), ("uncached", uncached), ("cached", cached)):
                    per = args.steps if name == "cached" else 1
                    wall: list[float] = []
                    t = timed(fn, wall)
                    if r:
                        times[name].append(t / per)
                        walls[name].append(wall[0] / per)
        t_pre, t_unc, t_dec = med(times["prefill"]), med(times["uncached"]), med(times["cached"])
        f_pre = costs.total(Workload(batch=1, new=n, past=0))
        f_unc = f_pre - 2 * (n - 1) * spec.d_model * spec.vocab_size  # head on the last position only
        roof = costs.decode_latency(n, 1, "float32", bandwidth=bw, peak_flops=peak)
        row = {
            "context": n,
            "prefill_s": t_pre,
            "prefill_tokens_per_s": n / t_pre,
            "prefill_flops": f_pre,
            "prefill_flops_per_s": f_pre / t_pre,
            "prefill_predicted_s": f_pre / peak,
            "uncached_step_s": t_unc,
            "uncached_flops": f_unc,
            "uncached_predicted_s": f_unc / peak,
            "cached_step_s": t_dec,
            "cached_flops": roof["flops"],
            "cached_bytes": roof["bytes"],
            "kv_cache_bytes": costs.kv_cache_bytes(n, 1, "float32"),
            "cached_roofline_s": roof["seconds"],
            "cached_roofline_bound": roof["bound"],
            "cache_speedup": t_unc / t_dec,
            "flops_ratio_uncached_over_cached": f_unc / roof["flops"],
            "wall_s": {k: med(v) for k, v in walls.items()},
            "wall_over_clock": {k: med(walls[k]) / med(times[k]) for k in times},
        }
        rows.append(row)
        print(
            f"  context {n:>5}: prefill {n / t_pre:>9,.0f} tok/s ({f_pre / t_pre / 1e9:5.1f} GFLOP/s, "
            f"{f_pre / t_pre / peak:.2f} of matmul) | decode cached {1 / t_dec:>7,.1f} tok/s "
            f"({roof['seconds'] / t_dec:.2f} of roofline) | uncached {1 / t_unc:>7,.2f} tok/s | "
            f"cache speedup {t_unc / t_dec:,.1f}x (FLOPs ratio {f_unc / roof['flops']:,.1f}x)",
            flush=True,
        )
    # what a static cache allocated for max_seq_len costs a short context (it attends over every slot)
    n = min(contexts)
    big = primed_cache(model, ids, n, spec.max_seq_len, args.steps)
    with torch.inference_mode():
        t_big = med(
            [
                timed(lambda: decode_steps(model, ids, copy.deepcopy(big), n, args.steps)) / args.steps
                for _ in range(args.repeats + 1)
            ][1:]
        )
    t_tight = rows[0]["cached_step_s"]
    print(
        f"  context {n} in a cache allocated for max_seq_len {spec.max_seq_len}: {1 / t_big:,.1f} tok/s "
        f"({t_big / t_tight:.2f}x the step time of a cache sized to the run)",
        flush=True,
    )
    return {
        "spec": path,
        "name": spec.name,
        "params": costs.params()["total"],
        "weights_read_per_step": costs.weights_read_per_step(1),
        "copy_bandwidth_bytes_per_s": bw,
        "matmul_flops_per_s": peak,
        "matmul_shape": [n_max, spec.d_model, d_ff_of(spec)],
        "check": check,
        "rows": rows,
        "static_cache": {"context": n, "max_len": spec.max_seq_len, "step_s": t_big, "ratio_to_sized": t_big / t_tight},
    }


def markdown(results: list[dict], args: argparse.Namespace, header: dict) -> str:
    """The report: machine, command, one table per model, the correctness check."""
    out = [
        "# Prefill and decode, with and without the KV cache (`benchmarks/bench_decode.py`)",
        "",
        f"Generated by `{header['command']}` on {header['date']} ({header['seconds']:.0f} s).",
        "",
        f"- CPU: {header['cpu']}, {os.cpu_count()} logical CPUs, torch threads {torch.get_num_threads()}",
        f"- torch {torch.__version__}, Python {platform.python_version()}",
        f"- load average (1, 5, 15 min) before: {header['load_before']}; after: {header['load_after']}",
        f"- medians of {args.repeats} rounds after one warm-up; cached decode timed over {args.steps} consecutive steps per round",
        f"- clock: {'CPU time of the process (time.process_time; one torch thread)' if args.clock == 'cpu' else 'wall time'}; "
        f"median wall ÷ clock over every timing: {header['wall_over_clock']:.2f}",
        "",
    ]
    for res in results:
        out += [
            f"## {res['name']} ({res['params']:,} parameters)",
            "",
            f"`{res['spec']}`. References measured in this run: copy bandwidth "
            f"{res['copy_bandwidth_bytes_per_s'] / 1e9:.2f} GB/s (read + write), matmul "
            f"[{res['matmul_shape'][0]}, {res['matmul_shape'][1]}] @ [{res['matmul_shape'][1]}, {res['matmul_shape'][2]}] "
            f"{res['matmul_flops_per_s'] / 1e9:.1f} GFLOP/s. Weights read per decode step: "
            f"{res['weights_read_per_step'] * 4 / 2**20:.1f} MiB (float32).",
            "",
            "| context | prefill tokens/s | prefill GFLOP/s (÷ matmul) | decode tokens/s, cached | cached step ms (÷ roofline ms) | "
            "KV cache MiB | decode tokens/s, uncached | cache speedup | FLOPs ratio |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for r in res["rows"]:
            out.append(
                f"| {r['context']:,} | {r['prefill_tokens_per_s']:,.0f} | {r['prefill_flops_per_s'] / 1e9:.1f} "
                f"({r['prefill_flops_per_s'] / res['matmul_flops_per_s']:.2f}) | {1 / r['cached_step_s']:,.1f} | "
                f"{1e3 * r['cached_step_s']:.2f} ({r['cached_step_s'] / r['cached_roofline_s']:.1f}x of "
                f"{1e3 * r['cached_roofline_s']:.3f}, {r['cached_roofline_bound']}) | {r['kv_cache_bytes'] / 2**20:.2f} | "
                f"{1 / r['uncached_step_s']:,.2f} | {r['cache_speedup']:,.1f}x | {r['flops_ratio_uncached_over_cached']:,.1f}x |"
            )
        c, s = res["check"], res["static_cache"]
        out += [
            "",
            f"- cached decode against recomputing the prefix: max |Δ logits| = {c['max_abs_diff']:.3g} over "
            f"{c['steps']} greedy steps after a {c['prompt']}-token prompt (max |logit| {c['max_abs_logit']:.3g}); "
            f"greedy tokens equal: {'yes' if c['tokens_equal'] else 'no'}",
            f"- a cache allocated for max_seq_len {s['max_len']:,} at context {s['context']}: "
            f"{1e3 * s['step_s']:.2f} ms per step, {s['ratio_to_sized']:.2f}x the cache sized to the run",
            "",
        ]
    return "\n".join(out)


def main() -> None:
    """Parse arguments, run every model, print and write the report."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    p.add_argument("--spec", action="append", help="spec to measure (repeatable; default: the two models of the page)")
    p.add_argument("--contexts", help="comma-separated contexts for every --spec (default per model)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--steps", type=int, default=8, help="decode steps timed per round")
    p.add_argument("--check-prompt", type=int, default=16)
    p.add_argument("--check-steps", type=int, default=32)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument(
        "--weights",
        action="store_true",
        help="compare float32, bfloat16 and int8 linear weights instead (llama-like 55M model; --spec and --contexts unused)",
    )
    p.add_argument("--new", type=int, default=64, help="--weights: greedy tokens timed per round")
    p.add_argument("--prompt-len", type=int, default=32, help="--weights: prompt tokens")
    p.add_argument("--agree", type=int, default=128, help="--weights: greedy tokens compared with float32")
    p.add_argument(
        "--clock",
        choices=("cpu", "wall"),
        default="cpu",
        help="cpu: the process's CPU time (default; robust to other jobs on a shared machine with 1 thread); wall",
    )
    p.add_argument(
        "-o", "--out", type=Path, help="write the markdown report here (and the raw numbers next to it as .json)"
    )
    args = p.parse_args()
    for name in ("repeats", "steps", "check_prompt", "check_steps", "threads", "new", "prompt_len", "agree"):
        if getattr(args, name) < 1:
            raise SystemExit(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    torch.set_num_threads(args.threads)
    if args.clock == "cpu" and args.threads != 1:
        raise SystemExit("--clock cpu adds up the CPU time of every thread: use it with --threads 1, or --clock wall")
    CLOCK["name"] = args.clock
    if args.weights:
        from _decode_weights import run

        report = run(args)
        if args.out:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(report + "\n")
            print(f"wrote {args.out}")
        return
    if args.spec:
        contexts = tuple(int(x) for x in args.contexts.split(",")) if args.contexts else (64, 256)
        plan = [(s, contexts) for s in args.spec]
    else:
        plan = DEFAULTS
    header = {
        "command": ".venv/bin/python benchmarks/bench_decode.py " + " ".join(sys.argv[1:]),
        "cpu": cpu_name(),
        "load_before": load_average(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    print(f"load average {header['load_before']}; torch threads {torch.get_num_threads()}", flush=True)
    start = time.perf_counter()
    results = [bench_model(path, contexts, args) for path, contexts in plan]
    header["seconds"] = time.perf_counter() - start
    header["wall_over_clock"] = med([v for res in results for r in res["rows"] for v in r["wall_over_clock"].values()])
    header["load_after"] = load_average()
    print(f"\nload average after: {header['load_after']}; {header['seconds']:.0f} s")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(markdown(results, args, header) + "\n")
        args.out.with_suffix(".json").write_text(json.dumps({"header": header, "results": results}, indent=1) + "\n")
        print(f"wrote {args.out} and {args.out.with_suffix('.json')}")


if __name__ == "__main__":
    main()

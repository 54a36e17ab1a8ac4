"""The ``shards`` check: a component's declared ``tp_plan`` trains like the single process under tensor parallelism.

For every bench (see :mod:`modkit.testing.harness`) the parent process builds the single-process reference with
:func:`modkit.build` (seed :data:`SEED`) and runs one training step on it: forward, next-token cross entropy (plus
the aux loss, if any), backward, one AdamW step (:func:`optimizer`). It keeps the logits, every parameter's
gradient, the gradient w.r.t. the input embeddings (the embedding module's output) and the parameters after the
step. Then one session of :data:`TP` gloo processes on the CPU (``init_process_group("gloo",
init_method="file://<temp dir>/store")``: no port, no ``torchrun``) builds each model with
:func:`modkit.parallel.build_parallel` on a ``1 x TP`` mesh from :func:`modkit.parallel.make_mesh` (meta build,
:func:`~modkit.parallel.parallelize`, :func:`~modkit.parallel.materialize` with the same seed), runs the same step
and compares, rank by rank: logits, gradients (a DTensor's gathered with ``full_tensor()``), input gradient and
stepped parameters must be within ``TOL`` of the reference, and every parameter that is not sharded over the TP
group must be bitwise identical on all ranks after the step. The kit adds no parallel logic of its own.

The backward pass is what catches a replicated parameter that reads a sharded activation (a per-head norm weight
declared ``replicate``): its forward is right, but each rank gets only its part of the gradient and the copies
drift apart (``modkit.parallel`` refuses such a parameter when the plan does not declare it at all).

Several benches share one session (starting processes costs seconds; a model costs milliseconds). Processes are
forked where the platform allows it, so a registry built in memory (a test's plugin) reaches them as it is; with
``spawn`` (no ``fork``, or a process group already initialised here) only the process-wide registry can be used.

Geometry: ``tp`` must divide the head counts of every sharded attention. When the bench's model does not shard
(an ``n_kv_heads`` of 1), the component's ``n_heads`` / ``n_kv_heads`` are rounded up to multiples of ``tp`` if its
config has them and accepts the new values; otherwise the check is skipped with the reason.
"""

from __future__ import annotations

import json
import math
import multiprocessing
import os
import tempfile
import time
import traceback
import warnings
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Optional, Sequence, Union

import torch

from modkit.core.errors import SpecError
from modkit.core.registry import Registry, get_registry
from ..spec import load_component
from .harness import Bench, Unavailable

#: Tensor-parallel degree (= number of processes) of the check.
TP = 2
#: Largest accepted ``max |Δ|`` between the sharded and the single-process logits.
TOL = 1e-5
#: Weight-init seed of both models.
SEED = 0
#: ``(batch, seq)`` of the token ids fed to both models.
BATCH, SEQ = 2, 8
#: Collective timeout inside a session, and the parent's wait per model on top of the start-up allowance.
PG_TIMEOUT_S, START_S, PER_MODEL_S = 60, 120, 30
#: AdamW learning rate and eps of the step. Adam's first step is ``lr * g / (|g| + eps)`` per element, so a
#: gradient near ``eps`` would turn float32 rounding (~1e-8) into a step difference of order ``lr``; eps = 1e-3
#: bounds the step's sensitivity to ``lr * |Δg| / eps`` and the check measures the layout, not Adam's conditioning.
LR, EPS = 1e-2, 1e-3


def optimizer(model: torch.nn.Module) -> torch.optim.Optimizer:
    """The AdamW optimiser of the check's step (``lr`` :data:`LR`, ``eps`` :data:`EPS`, torch's other defaults)."""
    return torch.optim.AdamW(model.parameters(), lr=LR, eps=EPS)


def loss_of(out, ids: torch.Tensor) -> torch.Tensor:
    """Next-token cross entropy of ``out.logits [batch, seq, vocab]`` against ``ids [batch, seq]`` (mean over
    ``batch * (seq - 1)`` tokens, float32), plus ``out.aux_loss`` when the model returns one."""
    logits = out.logits
    loss = torch.nn.functional.cross_entropy(
        logits[:, :-1].reshape(-1, logits.shape[-1]).float(), ids[:, 1:].reshape(-1)
    )
    return loss + out.aux_loss if getattr(out, "aux_loss", None) is not None else loss


def keep_input_grad(model: torch.nn.Module):
    """Hook ``model.embed`` so that its output ``[batch, seq, d_model]`` keeps its gradient; returns a getter."""
    kept: dict = {}

    def hook(module, args, out):
        out.retain_grad()
        kept["x"] = out

    model.embed.register_forward_hook(hook)
    return lambda: kept["x"].grad


class Skip(Exception):
    """The bench cannot be sharded for a reason that is not the component's plan (reported as a skip)."""


@dataclass
class Job:
    """One model the session shards: its spec, registry, inputs and the single-process results of one step.

    Attributes:
        reference: logits ``[BATCH, SEQ, vocab]`` (float32).
        grads: ``{parameter name: gradient}`` (parameters without a gradient are absent).
        input_grad: gradient of the loss w.r.t. the embedding output ``[BATCH, SEQ, d_model]``.
        stepped: ``{parameter name: value after one AdamW step}``.
    """

    spec: dict
    registry: Optional[Registry]  # None: the process-wide registry (what a spawned process loads)
    ids: torch.Tensor
    reference: torch.Tensor
    grads: dict = field(default_factory=dict)
    input_grad: Optional[torch.Tensor] = None
    stepped: dict = field(default_factory=dict)
    note: str = ""
    sharded: list[str] = field(default_factory=list)


def _plan(spec: dict, registry: Registry):
    from modkit.nn.build import build
    from ..parallel import model_plan

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # PlanWarning: replicated neighbours are fine here
        return model_plan(build(spec, device="meta", registry=registry), TP, registry=registry)


def _regeometry(bench: Bench, problem: str) -> tuple[Bench, str]:
    """A bench whose component has ``n_heads`` / ``n_kv_heads`` divisible by :data:`TP`, or :class:`Skip`."""
    cfg = bench.config_json
    heads = {k: cfg[k] for k in ("n_heads", "n_kv_heads") if isinstance(cfg.get(k), int)}
    if "n_heads" not in heads:
        raise Skip(
            f"the tiny model does not shard for tp = {TP} ({problem}) and {bench.name}'s config has no n_heads to change"
        )
    # the module's own head counts (what modkit.parallel reads): a config may leave n_kv_heads to a default
    _, records = bench.build_meta(device="meta")
    modules = [r.module for r in bench.targets(records)]
    kv = (
        next((m.n_kv_heads for m in modules if isinstance(getattr(m, "n_kv_heads", None), int)), None)
        or heads.get("n_kv_heads")
        or heads["n_heads"]
    )
    new_kv = -(-int(kv) // TP) * TP
    new_heads = math.lcm(-(-heads["n_heads"] // TP) * TP, new_kv)
    data = {**cfg, "n_heads": new_heads}
    if "n_kv_heads" in cfg or kv != heads["n_heads"]:
        data["n_kv_heads"] = new_kv
    try:
        config = load_component(bench.entry.kind, data, registry=bench.registry)
        again = Bench(bench.entry, config, bench.registry, str(bench.device))
    except (SpecError, Unavailable) as exc:
        why = "; ".join(f"{p}: {m}" if p else m for p, m in exc.errors[:2]) if isinstance(exc, SpecError) else str(exc)
        raise Skip(
            f"the tiny model does not shard for tp = {TP} ({problem}), and {bench.name}'s config does not accept "
            f"n_heads = {new_heads}, n_kv_heads = {new_kv} ({why})"
        ) from None
    changed = ", ".join(
        f"{k} {cfg.get(k, kv if k == 'n_kv_heads' else None)} -> {v}"
        for k, v in data.items()
        if k in ("n_heads", "n_kv_heads") and cfg.get(k) != v
    )
    return again, f" (geometry changed to shard: {changed})"


def prepare(bench: Bench) -> Job:
    """Choose a shardable spec for ``bench`` and compute the single-process reference logits.

    Raises:
        Skip: the geometry cannot be sharded by :data:`TP` (head counts, widths, a full-width QK-norm) and the
            component's config cannot be changed to fix it.
        ParallelError: the plan itself is malformed (unknown style, missing submodule, not a Linear): a failure.
    """
    from modkit.nn.build import build
    from ..parallel import ParallelError

    note = ""
    try:
        plan = _plan(bench.spec, bench.registry)
    except ParallelError as exc:
        text = str(exc)
        if "n_heads" in text and "does not divide" in text:
            bench, note = _regeometry(bench, text)
            try:
                plan = _plan(bench.spec, bench.registry)
            except ParallelError as again:
                raise Skip(f"the tiny model does not shard for tp = {TP}{note}: {again}") from None
        elif "does not divide" in text or "as wide as the full output" in text:
            raise Skip(f"the tiny model does not shard for tp = {TP}: {text}") from None
        else:
            raise
    sharded = [p for p, s in plan.styles.items() if plan.sources.get(p) == bench.name]
    if not sharded:
        raise Skip(f"{bench.name} declares a tp_plan but shards nothing in the tiny model (plan: {plan.describe()})")
    registry = None if bench.registry is get_registry() else bench.registry
    ref = build(bench.spec, device="cpu", seed=SEED, registry=bench.registry).eval()
    ids = bench.ids(BATCH, SEQ, seed=71).cpu()
    input_grad = keep_input_grad(ref)
    out = ref(ids)
    loss_of(out, ids).backward()
    grads = {n: p.grad.detach().clone() for n, p in ref.named_parameters() if p.grad is not None}
    optimizer(ref).step()
    stepped = {n: p.detach().clone() for n, p in ref.named_parameters()}
    return Job(
        bench.spec,
        registry,
        ids,
        out.logits.detach().float(),
        grads,
        input_grad().detach().clone(),
        stepped,
        note,
        sharded,
    )


# ------------------------------------------------------------------------------------------------- the session


def _worker(rank: int, jobs: Sequence[Job], store: str, out: str) -> None:
    """One rank: join the gloo group, shard every job's model, write ``{index: result}`` to ``out/rank<r>.json``."""
    import torch.distributed as dist

    from ..parallel import build_parallel, make_mesh

    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"file://{store}", rank=rank, world_size=TP, timeout=timedelta(seconds=PG_TIMEOUT_S)
    )
    results: dict[int, dict] = {}
    try:
        mesh = make_mesh(tp=TP, device_type="cpu")
        for i, job in enumerate(jobs):
            try:
                registry = job.registry if job.registry is not None else get_registry()
                model = build_parallel(job.spec, mesh, device="cpu", seed=SEED, registry=registry).eval()
                results[i] = _train_step(model, job)
            except Exception as exc:  # noqa: BLE001 - reported as this job's failure
                frames = traceback.extract_tb(exc.__traceback__)
                where = next(
                    (
                        f" (at {os.path.basename(f.filename)}:{f.lineno} in {f.name})"
                        for f in reversed(frames)
                        if "/torch/" not in f.filename
                    ),
                    "",
                )
                msg = " ".join(str(exc).split())[:400]
                results[i] = {"error": f"raised {type(exc).__name__}: {msg}{where}"}
            Path(out, f"rank{rank}.json").write_text(json.dumps(results))
            dist.barrier()  # keep the ranks on the same job
    finally:
        Path(out, f"rank{rank}.json").write_text(json.dumps(results))
        dist.destroy_process_group()


def _full(t: torch.Tensor) -> torch.Tensor:
    """The global value of a DTensor (a collective), or the tensor itself; detached, float32."""
    from torch.distributed.tensor import DTensor

    return (t.full_tensor() if isinstance(t, DTensor) else t).detach().float()


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    if a.shape != b.shape:
        return float("inf")
    return float(torch.nan_to_num((a - b.float()).abs(), nan=float("inf")).max()) if a.numel() else 0.0


def _worst(diffs: dict[str, float]) -> tuple[float, str]:
    return max(((v, k) for k, v in diffs.items()), default=(0.0, ""))


def _train_step(model: torch.nn.Module, job: Job) -> dict:
    """One rank's step on the sharded model and its differences from the single-process step.

    Every collective (``full_tensor``, the replica gather) runs in ``named_parameters`` order on all ranks.
    """
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    input_grad = keep_input_grad(model)
    out = model(job.ids)
    res: dict = {"diff": _max_diff(_full(out.logits), job.reference)}
    loss_of(out, job.ids).backward()
    grads, missing = {}, []
    for n, p in model.named_parameters():
        g = p.grad if p.grad is not None else torch.zeros_like(p)  # zeros keep the ranks' collectives in step
        if (p.grad is None) != (n not in job.grads):
            missing.append(n)
        grads[n] = _max_diff(_full(g), job.grads.get(n, torch.zeros(p.shape)))
    res["grad"], res["grad_worst"] = _worst(grads)
    res["missing"] = missing
    res["input_grad"] = _max_diff(_full(input_grad()), job.input_grad)
    optimizer(model).step()
    stepped, spread = {}, {}
    for n, p in model.named_parameters():
        stepped[n] = _max_diff(_full(p), job.stepped[n])
        if isinstance(p, DTensor) and any(pl.is_shard() for pl in p.placements):
            continue
        local = (p.to_local() if isinstance(p, DTensor) else p).detach().contiguous()
        copies = [torch.empty_like(local) for _ in range(dist.get_world_size())]
        dist.all_gather(copies, local)
        spread[n] = max(_max_diff(c, copies[0]) for c in copies)
    res["step"], res["step_worst"] = _worst(stepped)
    res["spread"], res["spread_worst"] = _worst(spread)
    return res


def _start_method(jobs: Sequence[Job]) -> str:
    import torch.distributed as dist

    if "fork" in multiprocessing.get_all_start_methods() and not (dist.is_available() and dist.is_initialized()):
        return "fork"
    if any(j.registry is not None for j in jobs):
        raise Skip(
            "spawned processes load only the process-wide registry, and this one was built in memory "
            "(fork is unavailable here or a process group is already initialised)"
        )
    return "spawn"


def run_session(jobs: Sequence[Job]) -> list[Union[dict, str]]:
    """Shard every job in one session of :data:`TP` gloo processes.

    Returns, per job, the worst rank's ``{"diff" (logits), "grad", "grad_worst", "input_grad", "step",
    "step_worst", "spread", "spread_worst", "missing"}`` (max |Δ| values and the parameter names they belong to,
    see :func:`_train_step`) with ``"seconds"`` (session wall time) added, or an error string.
    """
    if not jobs:
        return []
    import torch.distributed as dist
    import torch.multiprocessing as mp

    if not (dist.is_available() and dist.is_gloo_available()):
        raise Skip("torch.distributed with gloo is not available")
    method = _start_method(jobs)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="modkit-shards-") as tmp:
        ctx = mp.start_processes(
            _worker, args=(list(jobs), os.path.join(tmp, "store"), tmp), nprocs=TP, join=False, start_method=method
        )
        deadline = time.monotonic() + START_S + PER_MODEL_S * len(jobs)
        crash = ""
        try:
            while not ctx.join(timeout=max(0.1, min(5.0, deadline - time.monotonic()))):
                if time.monotonic() > deadline:
                    crash = f"the {TP} processes did not finish within {START_S + PER_MODEL_S * len(jobs)} s"
                    break
        except Exception as exc:  # noqa: BLE001 - a rank died outside a job
            crash = f"a process of the session failed: {' '.join(str(exc).split())[-400:]}"
        finally:
            for p in ctx.processes:
                if p.is_alive():
                    p.kill()
        per_rank = []
        for r in range(TP):
            f = Path(tmp, f"rank{r}.json")
            per_rank.append({int(k): v for k, v in json.loads(f.read_text()).items()} if f.exists() else {})
    seconds = time.perf_counter() - t0
    out: list[Union[dict, str]] = []
    for i in range(len(jobs)):
        got = [rk.get(i) for rk in per_rank]
        errors = [g["error"] for g in got if g and "error" in g]
        if errors:
            out.append(errors[0])
        elif any(g is None for g in got):
            out.append(crash or "no result from a rank")
        else:
            res = {"seconds": seconds, "missing": sorted({n for g in got for n in g["missing"]})}
            for key in ("diff", "input_grad"):
                res[key] = max(g[key] for g in got)
            for key in ("grad", "step", "spread"):
                worst = max(got, key=lambda g: g[key])
                res[key], res[f"{key}_worst"] = worst[key], worst[f"{key}_worst"]
            out.append(res)
    return out


def run_benches(benches: Sequence[Bench]) -> list[Union[str, BaseException]]:
    """The ``shards`` check on several benches in one session: per bench a detail (passed) or the exception to report.

    Exceptions: :class:`Skip` (skipped), ``AssertionError`` carrying the measured value (failed), anything else
    (failed, as raised).
    """
    out: list[Union[str, BaseException, None]] = [None] * len(benches)
    jobs: dict[int, Job] = {}
    for i, bench in enumerate(benches):
        try:
            jobs[i] = prepare(bench)
        except Exception as exc:  # noqa: BLE001 - Skip, ParallelError or a crash: that bench's outcome
            out[i] = exc
    order = list(jobs)
    try:
        done = run_session([jobs[i] for i in order])
    except Skip as exc:
        done = [exc] * len(order)
    for i, res in zip(order, done):
        job = jobs[i]
        if isinstance(res, BaseException):
            out[i] = res
        elif isinstance(res, str):
            out[i] = AssertionError(f"under tp = {TP} (gloo, {TP} processes) the sharded model {res}{job.note}")
        else:
            out[i] = _verdict(res, job)
    return out  # type: ignore[return-value]


def _verdict(res: dict, job: Job) -> Union[str, AssertionError]:
    """The detail of one bench's step: a string when everything is within :data:`TOL`, else an AssertionError."""
    where = f"tp = {TP} over {TP} gloo processes, {len(job.sharded)} module(s) of the component sharded ({', '.join(job.sharded[:4])}{', ...' if len(job.sharded) > 4 else ''})"
    worst = max(res["diff"], res["grad"], res["input_grad"], res["step"])
    parts = (
        f"logits {res['diff']:.3g}, parameter gradients {res['grad']:.3g} ({res['grad_worst']}), "
        f"input-embedding gradient {res['input_grad']:.3g}, parameters after one AdamW step {res['step']:.3g} ({res['step_worst']})"
    )
    problems = []
    if res["missing"]:
        problems.append(f"gradient present in one model only for {res['missing'][:4]}")
    if res["spread"] != 0.0:
        problems.append(
            f"replicated parameter {res['spread_worst']} differs between the {TP} ranks by {res['spread']:.3g} "
            "after one AdamW step (each rank got a different gradient: a replicated parameter reading a "
            "sharded activation?)"
        )
    msg = (
        f"max |Δ| = {worst:.3g} between the sharded and the single-process training step (tolerance {TOL:g}): {parts}"
        f"{'; ' + '; '.join(problems) if problems else '; replicated parameters identical on all ranks'}; {where}{job.note}"
    )
    return msg if worst <= TOL and not problems else AssertionError(msg)

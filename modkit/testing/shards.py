"""The ``shards`` check: a component's declared ``tp_plan`` gives the single-process logits under tensor parallelism.

For every bench (see :mod:`modkit.testing.harness`) the parent process builds the single-process reference with
:func:`modkit.build` (seed :data:`SEED`) and computes its logits; then one session of :data:`TP` gloo processes on
the CPU (``init_process_group("gloo", init_method="file://<temp dir>/store")``: no port, no ``torchrun``) builds
each model with :func:`modkit.parallel.build_parallel` on a ``1 x TP`` mesh from :func:`modkit.parallel.make_mesh`
(meta build, :func:`~modkit.parallel.parallelize`, :func:`~modkit.parallel.materialize` with the same seed) and
compares its logits with the reference: ``max |Δ| <= TOL`` passes. The kit adds no parallel logic of its own.

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

from ..errors import SpecError
from ..registry import Registry, get_registry
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


class Skip(Exception):
    """The bench cannot be sharded for a reason that is not the component's plan (reported as a skip)."""


@dataclass
class Job:
    """One model the session shards: its spec, registry, inputs and the single-process logits."""

    spec: dict
    registry: Optional[Registry]  # None: the process-wide registry (what a spawned process loads)
    ids: torch.Tensor
    reference: torch.Tensor
    note: str = ""
    sharded: list[str] = field(default_factory=list)


def _plan(spec: dict, registry: Registry):
    from ..build import build
    from ..parallel import model_plan

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # PlanWarning: replicated neighbours are fine here
        return model_plan(build(spec, device="meta", registry=registry), TP, registry=registry)


def _regeometry(bench: Bench, problem: str) -> tuple[Bench, str]:
    """A bench whose component has ``n_heads`` / ``n_kv_heads`` divisible by :data:`TP`, or :class:`Skip`."""
    cfg = bench.config_json
    heads = {k: cfg[k] for k in ("n_heads", "n_kv_heads") if isinstance(cfg.get(k), int)}
    if "n_heads" not in heads:
        raise Skip(f"the tiny model does not shard for tp = {TP} ({problem}) and {bench.name}'s config has no n_heads to change")
    # the module's own head counts (what modkit.parallel reads): a config may leave n_kv_heads to a default
    _, records = bench.build_meta(device="meta")
    modules = [r.module for r in bench.targets(records)]
    kv = next((m.n_kv_heads for m in modules if isinstance(getattr(m, "n_kv_heads", None), int)), None) or heads.get("n_kv_heads") or heads["n_heads"]
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
        raise Skip(f"the tiny model does not shard for tp = {TP} ({problem}), and {bench.name}'s config does not accept "
                   f"n_heads = {new_heads}, n_kv_heads = {new_kv} ({why})") from None
    changed = ", ".join(f"{k} {cfg.get(k, kv if k == 'n_kv_heads' else None)} -> {v}" for k, v in data.items() if k in ("n_heads", "n_kv_heads") and cfg.get(k) != v)
    return again, f" (geometry changed to shard: {changed})"


def prepare(bench: Bench) -> Job:
    """Choose a shardable spec for ``bench`` and compute the single-process reference logits.

    Raises:
        Skip: the geometry cannot be sharded by :data:`TP` (head counts, widths, a full-width QK-norm) and the
            component's config cannot be changed to fix it.
        ParallelError: the plan itself is malformed (unknown style, missing submodule, not a Linear): a failure.
    """
    from ..build import build
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
    with torch.no_grad():
        logits = ref(ids).logits.float()
    return Job(bench.spec, registry, ids, logits, note, sharded)


# ------------------------------------------------------------------------------------------------- the session


def _worker(rank: int, jobs: Sequence[Job], store: str, out: str) -> None:
    """One rank: join the gloo group, shard every job's model, write ``{index: result}`` to ``out/rank<r>.json``."""
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    from ..parallel import build_parallel, make_mesh

    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=TP, timeout=timedelta(seconds=PG_TIMEOUT_S))
    results: dict[int, dict] = {}
    try:
        mesh = make_mesh(tp=TP, device_type="cpu")
        for i, job in enumerate(jobs):
            try:
                registry = job.registry if job.registry is not None else get_registry()
                model = build_parallel(job.spec, mesh, device="cpu", seed=SEED, registry=registry).eval()
                with torch.no_grad():
                    logits = model(job.ids).logits
                if isinstance(logits, DTensor):
                    logits = logits.full_tensor()
                d = (logits.float() - job.reference).abs()
                results[i] = {"diff": float(torch.nan_to_num(d, nan=float("inf")).max())}
            except Exception as exc:  # noqa: BLE001 - reported as this job's failure
                frames = traceback.extract_tb(exc.__traceback__)
                where = next((f" (at {os.path.basename(f.filename)}:{f.lineno} in {f.name})" for f in reversed(frames) if "/torch/" not in f.filename), "")
                msg = " ".join(str(exc).split())[:400]
                results[i] = {"error": f"raised {type(exc).__name__}: {msg}{where}"}
            Path(out, f"rank{rank}.json").write_text(json.dumps(results))
            dist.barrier()  # keep the ranks on the same job
    finally:
        Path(out, f"rank{rank}.json").write_text(json.dumps(results))
        dist.destroy_process_group()


def _start_method(jobs: Sequence[Job]) -> str:
    import torch.distributed as dist

    if "fork" in multiprocessing.get_all_start_methods() and not (dist.is_available() and dist.is_initialized()):
        return "fork"
    if any(j.registry is not None for j in jobs):
        raise Skip("spawned processes load only the process-wide registry, and this one was built in memory "
                   "(fork is unavailable here or a process group is already initialised)")
    return "spawn"


def run_session(jobs: Sequence[Job]) -> list[Union[dict, str]]:
    """Shard every job in one session of :data:`TP` gloo processes.

    Returns, per job, ``{"diff": max |Δ| over the ranks, "seconds": session wall time}`` or an error string.
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
        ctx = mp.start_processes(_worker, args=(list(jobs), os.path.join(tmp, "store"), tmp), nprocs=TP, join=False, start_method=method)
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
            out.append({"diff": max(g["diff"] for g in got), "seconds": seconds})
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
            where = f"tp = {TP} over {TP} gloo processes, {len(job.sharded)} module(s) of the component sharded ({', '.join(job.sharded[:4])}{', ...' if len(job.sharded) > 4 else ''})"
            msg = f"max |Δ| = {res['diff']:.3g} between sharded and single-process logits (tolerance {TOL:g}); {where}{job.note}"
            out[i] = msg if res["diff"] <= TOL else AssertionError(msg)
    return out  # type: ignore[return-value]

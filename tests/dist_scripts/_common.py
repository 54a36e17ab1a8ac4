"""Helpers shared by the scripts that ``tests/parallel/test_parallel.py`` launches with ``torchrun`` (CPU, gloo).

Each script compares a parallel model against the single-process ``modkit.build`` of the same spec and seed,
which every rank builds in full: the models are tiny, and the reference is the point of the test.
"""

from __future__ import annotations

import json
import os
import sys
import time
import warnings
from pathlib import Path

import torch
import torch.distributed as dist

TINY_LLAMA = {
    "schema_version": 1,
    "name": "dist-tiny-llama",
    "vocab_size": 256,
    "d_model": 64,
    "n_layers": 2,
    "max_seq_len": 64,
    "position": {"type": "rope", "theta": 10000.0},
    "block": {
        "attention": {"type": "gqa", "n_heads": 4, "n_kv_heads": 2},
        "ffn": {"type": "swiglu", "d_ff": 128},
        "norm": {"type": "rmsnorm", "eps": 1e-5},
        "placement": {"type": "pre"},
    },
    "final_norm": {"type": "rmsnorm", "eps": 1e-5},
    "tie_embeddings": False,
    "init_std": 0.1,
}


def setup() -> tuple[int, int]:
    """Initialise gloo from the torchrun environment; one thread per rank; returns ``(rank, world)``."""
    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    return dist.get_rank(), dist.get_world_size()


def full(t: torch.Tensor) -> torch.Tensor:
    """The global value of a DTensor (collective), or the tensor itself."""
    from torch.distributed.tensor import DTensor

    return t.full_tensor() if isinstance(t, DTensor) else t


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    """Max absolute difference as a Python float."""
    return float((full(a).detach().float() - full(b).detach().float()).abs().max())


def param_diff(model, ref, *, grads: bool = False) -> tuple[float, str]:
    """Max over parameters of the max abs difference of values (or ``.grad``) against ``ref``; and the worst name."""
    ref_params = dict(ref.named_parameters())
    worst, name = 0.0, ""
    for n, p in model.named_parameters():
        a, b = (p.grad, ref_params[n].grad) if grads else (p, ref_params[n])
        if a is None or b is None:
            raise AssertionError(f"{n}: missing gradient (parallel {a is None}, reference {b is None})")
        d = max_diff(a, b)
        if d > worst:
            worst, name = d, n
    return worst, name


def loss_fn(logits: torch.Tensor, ids: torch.Tensor, aux=None) -> torch.Tensor:
    """Next-token cross entropy, mean over the given tokens (+ aux loss)."""
    loss = torch.nn.functional.cross_entropy(
        logits[:, :-1].reshape(-1, logits.shape[-1]).float(), ids[:, 1:].reshape(-1)
    )
    return loss + aux if aux is not None else loss


class Timer:
    """Collects ``{section: seconds}``."""

    def __init__(self):
        self.times: dict[str, float] = {}
        self._t = time.perf_counter()

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.times[name] = round(now - self._t, 3)
        self._t = now


def finish() -> None:
    """End a rank after its results are written: wait for every rank, destroy the process group, flush, and leave
    without interpreter finalisation. On a loaded machine torch 2.13's gloo could still abort a rank while the
    interpreter tore down ("terminate called without an active exception"), after the results were complete: the
    outcome of a numerics test then depended on the load. ``os._exit`` skips that teardown, and nothing is lost,
    since everything the test reads is on disk and flushed."""
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def write_results(out: dict, rank: int) -> None:
    """Rank-wise JSON to ``$MODKIT_DIST_OUT/rank{r}.json`` (the test reads them) and a printed summary."""
    out_dir = Path(os.environ.get("MODKIT_DIST_OUT", "."))
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"rank{rank}.json").write_text(json.dumps(out, indent=1, sort_keys=True))
    print(f"[rank {rank}] " + json.dumps(out, sort_keys=True), file=sys.stdout, flush=True)

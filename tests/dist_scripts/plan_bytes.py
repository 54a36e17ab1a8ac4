"""What each rank of a parallel layout holds, for ``modkit plan``'s exact bytes (``torchrun --nproc_per_node 4``,
gloo on CPU), run by ``tests/parallel/test_planner_bytes.py``.

For each case (a small spec under one layout of 4 ranks) every rank builds its part of the model the way
``modkit train`` does (:func:`modkit.parallel.build_parallel`, or :func:`~modkit.parallel.build_pipeline` under
``pp``), runs one training step (forward, backward, one AdamW step) and records the elements it stores: its
parameters' local shards, their gradients and AdamW's two moments; and its pipeline stage. The test compares the
largest of each stage's ranks with :meth:`modkit.parallel.planner.Planner.rank_elements` of the same layout.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, os.path.dirname(__file__))
from _common import TINY_LLAMA, finish, setup, write_results  # noqa: E402

from modkit import parallel as mp  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
BATCH, SEQ = 4, 16


def specs() -> dict[str, dict]:
    """The small specs: the dense llama of ``_common`` (five layers, 4 key/value heads and a vocabulary of 250, so
    FSDP2's chunks and the pipeline cuts are uneven and tp = 4 leaves the vocabulary whole), a
    two-layer ``tiny-deepseek-moe`` (8 experts, the first layer dense) and a two-layer ``tiny-mla``."""
    llama = {**TINY_LLAMA, "vocab_size": 250, "n_layers": 5}
    llama["block"] = {**llama["block"], "attention": {"type": "gqa", "n_heads": 4, "n_kv_heads": 4}}
    moe = json.loads((REPO / "specs" / "tiny-deepseek-moe.json").read_text())
    moe.update(max_seq_len=SEQ, vocab_size=256, n_layers=2, d_model=64)
    moe["overrides"][0]["ffn"]["d_ff"] = 128
    moe["block"]["ffn"]["expert"]["d_ff"] = moe["block"]["ffn"]["shared"]["d_ff"] = 32
    mla = json.loads((REPO / "specs" / "tiny-mla.json").read_text())
    mla.update(max_seq_len=SEQ, n_layers=2)
    return {"llama": llama, "moe": moe, "mla": mla}


#: case name -> (spec name, make_mesh degrees, pipeline microbatches or 0 for no pipeline)
CASES: dict[str, tuple[str, dict, int]] = {
    "llama-fsdp4": ("llama", {}, 0),
    "llama-tp2-fsdp2": ("llama", {"tp": 2}, 0),
    "llama-tp4": ("llama", {"tp": 4}, 0),
    "llama-cp2-fsdp2": ("llama", {"cp": 2}, 0),
    "llama-cp2-tp2": ("llama", {"cp": 2, "tp": 2}, 0),
    "llama-pp2-fsdp2": ("llama", {"pp": 2}, 2),
    "llama-pp2-tp2": ("llama", {"pp": 2, "tp": 2}, 2),
    "llama-pp4": ("llama", {"pp": 4}, 4),
    "moe-tp2-fsdp2": ("moe", {"tp": 2}, 0),
    "moe-ep4": ("moe", {"ep": 4}, 0),
    "moe-ep2-fsdp2": ("moe", {"ep": 2}, 0),
    "moe-ep2-pp2": ("moe", {"ep": 2, "pp": 2}, 2),
    "mla-tp2-fsdp2": ("mla", {"tp": 2}, 0),
    "mla-cp2-fsdp2": ("mla", {"cp": 2}, 0),
}


def held(params, optim) -> dict[str, int]:
    """Elements this rank stores: parameters, gradients and AdamW's two moments (local shards)."""

    def n(t) -> int:
        return (t.to_local() if hasattr(t, "to_local") else t).numel()

    state = sum(n(v) for s in optim.state.values() for k, v in s.items() if k in ("exp_avg", "exp_avg_sq"))
    return {
        "params": sum(n(p) for p in params),
        "grads": sum(n(p.grad) for p in params if p.grad is not None),
        "optimizer": state,
    }


def run_case(spec: dict, degrees: dict, micro: int) -> dict:
    """One training step of ``spec`` under ``degrees``; this rank's elements and pipeline stage."""
    ids = torch.randint(0, spec["vocab_size"], (BATCH, SEQ + 1), generator=torch.Generator().manual_seed(0))
    mesh = mp.make_mesh(**degrees)
    if micro:
        pipe = mp.build_pipeline(spec, mesh, microbatches=micro, seed=0, device="cpu")
        params = pipe.parameters()
        opt = torch.optim.AdamW(params, lr=1e-3)
        pipe.step(ids[:, :-1], ids[:, 1:])
        stage = mesh["pp"].get_local_rank()
    else:
        model = mp.build_parallel(spec, mesh, seed=0, device="cpu")
        params = list(model.parameters())
        opt = torch.optim.AdamW(params, lr=1e-3)
        x, y = ids[:, :-1], ids[:, 1:]
        context = getattr(model, "context_parallel", None)
        out = model(**context.split_batch(x, None)) if context is not None else model(x)
        logits = out.logits.full_tensor() if hasattr(out.logits, "full_tensor") else out.logits
        target = context.split(y) if context is not None else y
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), target.reshape(-1))
        (loss + out.aux_loss if out.aux_loss is not None else loss).backward()
        stage = 0
    opt.step()
    return {"stage": stage, **held(params, opt)}


def main() -> None:
    rank, world = setup()
    all_specs, res = specs(), {"world": world}
    wanted = sys.argv[1:] or list(CASES)
    for name in wanted:
        spec_name, degrees, micro = CASES[name]
        res[name] = run_case(all_specs[spec_name], degrees, micro)
    write_results(res, rank)
    finish()


if __name__ == "__main__":
    main()

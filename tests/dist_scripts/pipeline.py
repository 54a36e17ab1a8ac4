"""Pipeline parallelism (``torchrun``, gloo on CPU), run by ``tests/parallel/test_pipeline_context.py``.

``pipeline.py schedules`` (2 ranks, pp = 2): ``tiny-llama`` under every schedule torch ships (GPipe, 1F1B,
interleaved 1F1B, looped BFS, interleaved zero bubble, ZBV zero bubble, DualPipeV), 1F1B with the uneven cut 1 + 3
layers, and ``tiny-deepseek-moe`` (its balance loss at coefficient 0.1, summed in on the stages that compute it) under 1F1B,
interleaved 1F1B and ZBV zero bubble. ``pipeline.py tp`` (4 ranks): ``tiny-llama`` at pp = 2 x tp = 2 under 1F1B.

Each case runs ``STEPS`` AdamW steps of ``MICRO`` microbatches on the same batches as the single-process model of
the same spec and seed, which accumulates the gradients of the same microbatches (cross entropy + auxiliary loss,
divided by ``MICRO``). Per step each rank records the mean cross entropy and the global gradient norm.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, os.path.dirname(__file__))
from _common import finish, setup, write_results  # noqa: E402

import modkit  # noqa: E402
from modkit import parallel as mp  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
STEPS, BATCH, SEQ, MICRO = 3, 4, 16, 4


def spec(name: str) -> dict:
    """A shipped spec as it is (4 layers)."""
    return json.loads((REPO / "specs" / f"{name}.json").read_text())


def batches(vocab: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return [torch.randint(0, vocab, (BATCH, SEQ + 1), generator=g) for _ in range(STEPS)]


def reference(s: dict, data) -> list[dict]:
    """One process: per step the gradients of ``MICRO`` microbatches accumulated, then AdamW."""
    model = modkit.build(s, seed=3)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    out = []
    for ids in data:
        ce_sum = 0.0
        for x, y in zip(ids[:, :-1].chunk(MICRO), ids[:, 1:].chunk(MICRO)):
            res = model(x)
            ce = mp.pipeline.cross_entropy(res.logits, y)
            total = ce if res.aux_loss is None else ce + res.aux_loss
            (total / MICRO).backward()
            ce_sum += float(ce)
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), float("inf"))
        opt.step()
        opt.zero_grad(set_to_none=True)
        out.append({"loss": ce_sum / MICRO, "grad_norm": float(norm)})
    return out


def pipelined(s: dict, data, mesh, pp: int, **options) -> list[dict]:
    pipe = mp.build_pipeline(s, mesh, microbatches=MICRO, seed=3, **options)
    opt = torch.optim.AdamW(pipe.parameters(), lr=3e-3)
    out = []
    for ids in data:
        loss = pipe.step(ids[:, :-1], ids[:, 1:])
        norm = mp.clip_grad_norm_(pipe.parameters(), float("inf"), pp=pp)
        opt.step()
        opt.zero_grad(set_to_none=True)
        out.append({"loss": float(loss), "grad_norm": float(norm)})
    return out


def main() -> None:
    rank, world = setup()
    which = sys.argv[1]
    out: dict = {}
    if which == "schedules":
        mesh = mp.make_mesh(pp=2, dp=1)
        llama, moe = spec("tiny-llama"), spec("tiny-deepseek-moe")
        moe["block"]["ffn"]["aux_loss_coef"] = 0.1  # large enough that a dropped auxiliary loss would show
        cases = {name: (llama, {"schedule": name}) for name in mp.pipeline.SCHEDULES}
        cases["1f1b-cut-1-3"] = (llama, {"schedule": "1f1b", "cuts": [1, 3]})
        cases["moe-1f1b"] = (moe, {"schedule": "1f1b"})
        cases["moe-interleaved_1f1b"] = (moe, {"schedule": "interleaved_1f1b"})
        cases["moe-zbv_zero_bubble"] = (moe, {"schedule": "zbv_zero_bubble"})  # the split backward with an aux loss
        pp = 2
    else:
        mesh = mp.make_mesh(pp=2, tp=2, dp=1)
        cases = {"tp2-1f1b": (spec("tiny-llama"), {"schedule": "1f1b"})}
        pp = 2
    refs: dict = {}
    for name, (s, options) in cases.items():
        data = batches(s["vocab_size"])
        if s["name"] not in refs:
            refs[s["name"]] = reference(s, data)
        try:
            out[name] = {"ref": refs[s["name"]], "pp": pipelined(s, data, mesh, pp, **options)}
        except Exception as exc:  # reported by the test, naming the schedule
            out[name] = {"error": f"{type(exc).__name__}: {exc}"}
    write_results(out, rank)
    finish()


if __name__ == "__main__":
    main()

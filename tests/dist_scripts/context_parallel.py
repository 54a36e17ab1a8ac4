"""Context parallelism (``torchrun --nproc_per_node 2``, gloo on CPU), run by ``tests/parallel/test_pipeline_context.py``.

Each row's sequence is cut in two contiguous halves, one per rank (cp = 2; FSDP2 over the two ranks averages their
gradients). For each case, the single-process model of the same spec and seed and the context-parallel one run
``STEPS`` AdamW steps on the same batches; per step each rank records the loss (mean over the ranks of their
halves' mean cross entropy) and the global gradient norm, against the reference's. Cases: ``tiny-llama`` and
``tiny-mla`` as shipped; ``tiny-llama`` with a sliding window of 8 and document masks (documents from an
end-of-text id inside the rows); ``tiny-hybrid``: refused, naming its recurrent layers.
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
from modkit.nn.documents import document_ids  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
STEPS, BATCH, SEQ, EOT = 3, 2, 32, 7


def spec(name: str, **attention) -> dict:
    """A shipped spec (two layers, but for the hybrid) with ``attention`` fields merged into its block's attention."""
    out = json.loads((REPO / "specs" / f"{name}.json").read_text())
    if name != "tiny-hybrid":
        out["n_layers"] = 2
    if attention:
        out["block"]["attention"] = {**out["block"]["attention"], **attention}
    return out


def batches(vocab: int) -> list[torch.Tensor]:
    """``STEPS`` batches ``[BATCH, SEQ + 1]`` with end-of-text ids sprinkled in (the same on every rank)."""
    g = torch.Generator().manual_seed(0)
    out = []
    for _ in range(STEPS):
        ids = torch.randint(8, vocab, (BATCH, SEQ + 1), generator=g)
        ids[ids % 9 == 0] = EOT
        out.append(ids)
    return out


def run(model, data, documents: bool, context=None) -> list[dict]:
    """``STEPS`` AdamW steps; per step ``{"loss", "grad_norm"}`` (the loss's mean over the cp ranks)."""
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    out = []
    for ids in data:
        x, y = ids[:, :-1], ids[:, 1:]
        docs = document_ids(x, eot_id=EOT) if documents else None
        if context is None:
            logits = model(x, documents=docs).logits
        else:
            logits, y = model(**context.split_batch(x, docs)).logits, context.split(y)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), y.reshape(-1))
        loss.backward()
        if context is None:
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), float("inf"))
        else:
            norm = mp.clip_grad_norm_(model.parameters(), float("inf"))
            loss = mp.mean_across_ranks(loss)
        opt.step()
        opt.zero_grad(set_to_none=True)
        out.append({"loss": float(loss), "grad_norm": float(norm)})
    return out


def main() -> None:
    rank, world = setup()
    mesh = init_device_mesh("cpu", (1, world, 1), mesh_dim_names=("dp", "cp", "tp"))
    cases = {
        "tiny-llama": (spec("tiny-llama"), False),
        "tiny-mla": (spec("tiny-mla"), False),
        "window-documents": (spec("tiny-llama", sliding_window=8), True),
    }
    out: dict = {}
    for name, (s, documents) in cases.items():
        data = batches(s["vocab_size"])
        ref = run(modkit.build(s, seed=3), data, documents)
        model = mp.build_parallel(s, mesh, seed=3)
        got = run(model, data, documents, model.context_parallel)
        out[name] = {"ref": ref, "cp": got}
    try:
        mp.build_parallel(spec("tiny-hybrid"), mesh, seed=3)
        out["hybrid_refusal"] = None
    except mp.ParallelError as exc:
        out["hybrid_refusal"] = str(exc)
    write_results(out, rank)
    finish()


if __name__ == "__main__":
    main()

"""Two-rank checks of today's MoE parts (``torchrun --nproc_per_node 2``, gloo on CPU), run by ``tests/parallel/test_parallel.py``.

Against the single-process model of the tiny DeepSeek-style spec (sigmoid router with a correction bias, groups,
a shared expert, a dense first layer), each rank measures:

* fsdp: FSDP2 (mesh 2 x 1), each rank on half the batch, one training step through
  :class:`modkit.train.balance.ExpertBalance` (loads all-reduced over the data-parallel group, then the bias
  update): the global loads and the updated biases against the single process on the whole batch.
* tp: tensor parallel (mesh 1 x 2: the shared expert colwise/rowwise, the stacked experts grouped, the router
  replicated): logits and aux loss against the single process; the loads (tp ranks see the same tokens and are
  not summed) and the bias after the update.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, os.path.dirname(__file__))
from _common import loss_fn, max_diff, finish, setup, write_results  # noqa: E402

import modkit  # noqa: E402
from modkit.nn import balance  # noqa: E402
from modkit import parallel as mp  # noqa: E402
from modkit.train.balance import ExpertBalance  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


def spec() -> dict:
    s = json.loads((REPO / "specs" / "tiny-deepseek-moe.json").read_text())
    s.update(max_seq_len=32, vocab_size=256)
    s["block"]["ffn"]["router"]["bias_update_speed"] = 0.125
    s["block"]["ffn"]["shared_gate"] = True
    return s


def reference_step(ids: torch.Tensor) -> tuple[dict, dict]:
    """Loads and biases of the single-process model after one step on the whole batch."""
    ref = modkit.build(spec(), seed=0)
    bal = ExpertBalance(ref)
    bal.begin_step()
    out = ref(ids)
    loss_fn(out.logits, ids, out.aux_loss).backward()
    loads = balance.read_loads(ref)
    bal.end_step()
    biases = {n: b.detach().clone() for n, b in ref.named_buffers() if n.endswith("correction_bias")}
    return loads, biases


def main() -> None:
    rank, world = setup()
    assert world == 2, world
    res: dict = {"world": world}
    ids = torch.randint(0, 256, (4, 32), generator=torch.Generator().manual_seed(11))
    ref_loads, ref_biases = reference_step(ids)

    # ---------------------------------------------------------------- FSDP2, half the batch per rank
    dp_mesh = mp.make_mesh(tp=1, dp=2)
    model = mp.build_parallel(spec(), dp_mesh, seed=0, device="cpu")
    bal = ExpertBalance(model, dp_mesh["dp"].get_group())
    bal.begin_step()
    local = ids[rank * 2 : (rank + 1) * 2]
    out = model(local)
    loss_fn(out.logits, local, out.aux_loss).backward()
    mine = balance.read_loads(model)
    summary = bal.end_step()
    glob = balance.all_reduce_loads(balance.read_loads(model), dp_mesh["dp"].get_group())
    res["fsdp"] = {
        "local_load_total": {n: int(v.sum()) for n, v in mine.items()},
        "global_loads_equal_reference": all(torch.equal(glob[n], ref_loads[n]) for n in ref_loads),
        "bias_equal_reference": all(torch.equal(dict(model.named_buffers())[n], b) for n, b in ref_biases.items()),
        "bias_nonzero": int(sum(torch.count_nonzero(b) for b in ref_biases.values())),
        "imbalance": summary["load_imbalance"],
        "reference_imbalance": balance.mean_imbalance({n: balance.imbalance(v) for n, v in ref_loads.items()}),
    }

    # ---------------------------------------------------------------- tensor parallel
    tp_mesh = mp.make_mesh(tp=2, dp=1)
    ref = modkit.build(spec(), seed=0)
    tp = mp.build_parallel(spec(), tp_mesh, seed=0, device="cpu")
    bal = ExpertBalance(tp, None)  # dp = 1: nothing to sum (the tp ranks see the same tokens)
    bal.begin_step()
    o, ro = tp(ids), ref(ids)
    loads = balance.read_loads(tp)
    bal.end_step()
    plan = mp.model_plan(modkit.build(spec(), device="meta"), 2)
    res["tp"] = {
        "logits_max_abs_diff": max_diff(o.logits, ro.logits),
        "aux_abs_diff": float((o.aux_loss - ro.aux_loss).abs()),
        "loads_equal_reference": all(torch.equal(loads[n], ref_loads[n]) for n in ref_loads),
        "bias_equal_reference": all(torch.equal(dict(tp.named_buffers())[n], b) for n, b in ref_biases.items()),
        "shared_styles": [plan.styles.get(f"layers.1.ffn.shared.{p}") for p in ("gate", "up", "down")],
        "shared_gate_local_numel": tp.layers[1].ffn.shared_gate.weight.numel(),
        "shared_up_local_rows": int(mp_local(tp.layers[1].ffn.shared.up.weight).shape[0]),
    }
    write_results(res, rank)
    finish()


def mp_local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


if __name__ == "__main__":
    main()

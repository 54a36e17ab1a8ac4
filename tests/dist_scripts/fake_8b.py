"""Shard Llama 3.1 8B on ``meta`` across 8 simulated ranks (PyTorch's fake process group), rank by rank.

Run as ``python tests/dist_scripts/fake_8b.py [OUT.json]`` (no torchrun: one process plays each rank in turn with
``init_process_group("fake", store=FakeStore(), rank=r, world_size=8)``; collectives are no-ops and no memory is
allocated, only shapes and placements are real). For three layouts, FSDP 8, TP 8 and FSDP 2 x TP 4, it records
each rank's parameter count and bf16 bytes; the test checks that per-rank ``owned`` counts sum to the model total
(8,030,261,248) and, for FSDP 8, that the plain per-rank counts do.
"""

from __future__ import annotations

import json
import sys
import time
import warnings
from pathlib import Path

import torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore

import modkit
from modkit import parallel as mp

REPO = Path(__file__).resolve().parents[2]
LAYOUTS = {"fsdp8": (8, 1), "tp8": (1, 8), "fsdp2_tp4": (2, 4)}  # name: (dp, tp)


def main() -> None:
    warnings.simplefilter("ignore")
    spec = modkit.load_spec(REPO / "specs" / "llama-3.1-8b.json")
    total = modkit.count_params(spec)
    out: dict = {"total_params": total, "layouts": {}}
    for name, (dp, tp) in LAYOUTS.items():
        ranks = []
        t0 = time.perf_counter()
        for r in range(8):
            dist.init_process_group("fake", store=FakeStore(), rank=r, world_size=8)
            mesh = mp.make_mesh(tp=tp, dp=dp, device_type="cpu")
            model = modkit.build(spec, device="meta", dtype="bfloat16")
            mp.parallelize(model, mesh, param_dtype="bfloat16", reduce_dtype="float32")
            stats = mp.param_stats(model)
            stats["rank"] = r
            ranks.append(stats)
            dist.destroy_process_group()
        out["layouts"][name] = {
            "dp": dp,
            "tp": tp,
            "ranks": ranks,
            "sum_local_params": sum(s["local_params"] for s in ranks),
            "sum_owned_params": sum(s["owned_params"] for s in ranks),
            "max_local_bytes": max(s["local_bytes"] for s in ranks),
            "seconds": round(time.perf_counter() - t0, 2),
        }
        lay = out["layouts"][name]
        print(
            f"{name}: per-rank params {[s['local_params'] for s in ranks]}; max {lay['max_local_bytes'] / 2**30:.3f} GiB "
            f"bf16 per rank (whole model {total * 2 / 2**30:.3f} GiB); sum of local {lay['sum_local_params']:,}, "
            f"sum of owned {lay['sum_owned_params']:,}, total {total:,}; {lay['seconds']} s",
            flush=True,
        )
    if len(sys.argv) > 1:
        Path(sys.argv[1]).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()

"""Expert parallelism's dispatch overhead against FSDP2 alone, same tiny MoE, same processes, same run.

    .venv/bin/python benchmarks/bench_ep.py [--nproc 2] [--rounds 7] [--batch 8] [--seq 128]

Launches itself under ``torchrun --standalone`` (gloo on the CPU, or NCCL where CUDA is available). Each rank
builds two models of ``tiny-deepseek-moe`` with the same seed: FSDP2 over every rank (each rank runs all 8 experts
on its own tokens) and EP over every rank x FSDP2 (each rank holds 8 / ep experts; the rows go to them and back by
all-to-all). One training step (forward, backward, AdamW) of each is timed, interleaved (A, B, A, B, ...) so that
load drifts hit both alike; the medians and their ratio EP / FSDP are printed by rank 0. On CPU processes the
all-to-all is a memory copy through gloo, so the ratio measures the dispatch's own cost (the count exchange, the
host synchronisation, the regrouping and two all-to-alls per MoE layer, forward and backward) against the
saving of computing fewer experts per rank, not a network.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _spec() -> dict:
    s = json.loads((REPO / "specs" / "tiny-deepseek-moe.json").read_text())
    s.update(vocab_size=256)
    return s


def _step(model, opt, ids) -> float:
    import torch

    t0 = time.perf_counter()
    out = model(ids)
    loss = torch.nn.functional.cross_entropy(out.logits[:, :-1].flatten(0, 1).float(), ids[:, 1:].flatten())
    (loss + out.aux_loss).backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter() - t0


def _rank_main(args) -> None:
    import torch
    import torch.distributed as dist

    from modkit import parallel as mp

    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl" if cuda else "gloo")
    torch.set_num_threads(1)
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    models = {}
    for name, ep in (("fsdp", 1), ("ep", world)):
        mesh = mp.make_mesh(tp=1, ep=ep, device_type=device.type)
        model = mp.build_parallel(_spec(), mesh, seed=0, device=device)
        models[name] = (model, torch.optim.AdamW(model.parameters(), lr=1e-4))
    g = torch.Generator().manual_seed(rank)
    ids = torch.randint(0, 256, (args.batch, args.seq), generator=g).to(device)
    times: dict[str, list[float]] = {"fsdp": [], "ep": []}
    for r in range(args.rounds + 1):  # round 0 warms up
        for name in ("fsdp", "ep") if r % 2 else ("ep", "fsdp"):
            dist.barrier()
            t = _step(*models[name], ids)
            if r:
                times[name].append(t)
    med = {k: statistics.median(v) for k, v in times.items()}
    slowest = torch.tensor([med["fsdp"], med["ep"]], dtype=torch.float64)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)  # a step lasts as long as its slowest rank
    if rank == 0:
        load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
        print(
            f"tiny-deepseek-moe, {world} ranks ({device.type}), batch {args.batch} x {args.seq} tokens per rank, "
            f"{args.rounds} rounds, load {load:.1f}\n"
            f"  FSDP2 only          {slowest[0] * 1e3:8.1f} ms / step (median, slowest rank)\n"
            f"  EP {world} (dense FSDP2) {slowest[1] * 1e3:8.1f} ms / step\n"
            f"  ratio EP / FSDP     {float(slowest[1] / slowest[0]):8.3f}"
        )
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=128)
    args = p.parse_args()
    if "RANK" in os.environ:
        return _rank_main(args)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={args.nproc}", __file__]
    cmd += ["--rounds", str(args.rounds), "--batch", str(args.batch), "--seq", str(args.seq)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore", "PYTHONPATH": str(REPO)}
    sys.exit(subprocess.run(cmd, env=env).returncode)


if __name__ == "__main__":
    main()

"""Expert parallelism composed with pipeline parallelism against one process (``torchrun --nproc_per_node 4``, gloo).

EP 2 x PP 2: the model cut into two stages (layers 0-1 and 2), each stage's experts split over the two
data-parallel ranks of that stage (all-to-all dispatch inside every microbatch), the dense parts FSDP2-sharded
over them. Each data-parallel rank reads half of a fixed batch and the 1F1B schedule cuts it into ``MICRO``
microbatches; the single-process model accumulates the gradients of the same *global* microbatches (microbatch
``m`` of every data-parallel rank together: the tokens the aux losses' global statistics are taken over), then
AdamW with gradient clipping and DeepSeek-V3's bias update from the step's loads. Per step: the loss (the mean
over the ranks) and the gradient norm, for the tiny DeepSeek-style spec as shipped (sequence-wise balance loss,
correction bias) over ``STEPS`` steps and with the batch-wise balance loss and z-loss over ``BATCH_STEPS``.

Checkpoints (DCP, model and AdamW state, the optimizer flattened as pipeline stages need): the run saves after
``SAVE_AT`` steps, for the test to resume at one process; and it loads the one-process checkpoint the test wrote
at ``$MODKIT_DIST_OUT/one/dcp`` (the reference after ``SAVE_AT`` steps) into a fresh EP 2 x PP 2 pipeline and
trains ``RESUMED`` steps from it. And the elements each rank holds (parameters, gradients, AdamW state) for the
planner's figures.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, os.path.dirname(__file__))
from _common import finish, setup, write_results  # noqa: E402
from expert_parallel import allocated  # noqa: E402

import modkit  # noqa: E402
from modkit import parallel as mp  # noqa: E402
from modkit.nn import balance as nb  # noqa: E402
from modkit.train.balance import ExpertBalance  # noqa: E402
from modkit.train.pipelined import StageView  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
STEPS, BATCH_STEPS, SAVE_AT, RESUMED = 20, 5, 3, 2
BATCH, SEQ, MICRO, DP = 8, 16, 2, 2  # 8 rows: 4 per data-parallel rank, microbatches of 2 rows


def spec(variant: str = "shipped") -> dict:
    """``tiny-deepseek-moe`` made smaller: d_model 64, 3 layers (the first dense), vocabulary 256, experts of width
    32, a faster bias update; ``variant`` "batch": batch-wise balance loss (0.01) and z-loss (0.001)."""
    s = json.loads((REPO / "specs" / "tiny-deepseek-moe.json").read_text())
    s.update(max_seq_len=SEQ, vocab_size=256, n_layers=3, d_model=64)
    s["overrides"][0]["ffn"]["d_ff"] = 128
    ffn = s["block"]["ffn"]
    ffn["expert"]["d_ff"] = ffn["shared"]["d_ff"] = 32
    ffn["router"]["bias_update_speed"] = 0.01
    if variant == "batch":
        ffn.update(aux_loss_scope="batch", aux_loss_coef=0.01, z_loss_coef=0.001)
    return s


def batches() -> list[torch.Tensor]:
    """``STEPS`` batches of ``BATCH`` rows of ``SEQ + 1`` token ids (inputs and next-token targets)."""
    g = torch.Generator().manual_seed(7)
    return [torch.randint(0, 256, (BATCH, SEQ + 1), generator=g) for _ in range(STEPS)]


def global_microbatches(ids: torch.Tensor) -> list[torch.Tensor]:
    """The rows of each global microbatch: microbatch ``m`` of every data-parallel rank (rank ``r`` reads rows
    ``[r BATCH / DP, (r + 1) BATCH / DP)`` and the schedule cuts them into ``MICRO`` equal parts)."""
    per = BATCH // DP
    return [torch.cat([ids[r * per :][: per][m * per // MICRO : (m + 1) * per // MICRO] for r in range(DP)])
            for m in range(MICRO)]  # fmt: skip


def reference_step(model, opt, ids: torch.Tensor) -> dict:
    """One process: the global microbatches' gradients (cross entropy + aux loss) accumulated, clipped, AdamW, the
    bias update from the step's loads. Returns ``{"loss", "grad_norm"}``."""
    nb.reset_loads(model)
    ce_sum = 0.0
    for rows in global_microbatches(ids):
        out = model(rows[:, :-1])
        ce = mp.pipeline.cross_entropy(out.logits, rows[:, 1:])
        ((ce + out.aux_loss) / MICRO).backward()
        ce_sum += float(ce)
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    nb.update_balance(model, nb.read_loads(model))
    return {"loss": ce_sum / MICRO, "grad_norm": float(norm)}


def pipelined(s: dict, mesh, seed: int = 0):
    """``(pipeline, its StageView, AdamW over its parameters)`` of ``s`` on ``mesh`` (1F1B, ``MICRO``)."""
    pipe = mp.build_pipeline(s, mesh, schedule="1f1b", microbatches=MICRO, seed=seed, device="cpu")
    view = StageView(pipe.stages)
    return pipe, view, torch.optim.AdamW(pipe.parameters(), lr=3e-3)


def pipelined_step(pipe, view, opt, balance, ids: torch.Tensor, dp_rank: int) -> dict:
    """This data-parallel rank's rows of ``ids`` through the schedule, clipped, AdamW, the bias update."""
    per = BATCH // DP
    rows = ids[dp_rank * per : (dp_rank + 1) * per]
    balance.begin_step()
    loss = pipe.step(rows[:, :-1], rows[:, 1:])
    norm = mp.clip_grad_norm_(pipe.parameters(), 1.0, pp=2)
    opt.step()
    opt.zero_grad(set_to_none=True)
    balance.end_step()
    return {"loss": float(mp.mean_across_ranks(loss)), "grad_norm": float(norm)}


def run_variant(variant: str, mesh, out_dir: Path) -> dict:
    """The reference and the EP 2 x PP 2 run step by step; ``{"ref", "pp": [{"loss", "grad_norm"}] per step,
    "bias_max_abs_diff", "biases", "local_experts", "allocated"}`` and, for the shipped variant, ``"resumed"``."""
    steps = STEPS if variant == "shipped" else BATCH_STEPS
    data = batches()[:steps]
    ref = modkit.build(spec(variant), seed=0)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=3e-3)
    pipe, view, opt = pipelined(spec(variant), mesh)
    dp_group, dp_rank = mesh["dp"].get_group(), mesh["dp"].get_local_rank()
    balance = ExpertBalance(view, dp_group)
    out: dict = {"ref": [], "pp": []}
    for step, ids in enumerate(data, start=1):
        out["ref"].append(reference_step(ref, ref_opt, ids))
        out["pp"].append(pipelined_step(pipe, view, opt, balance, ids, dp_rank))
        if variant == "shipped" and step == SAVE_AT:
            mp.save_sharded(out_dir / "ckpt" / "dcp", view, opt, flatten_optimizer=True)
    ref_buffers = dict(ref.named_buffers())
    biases = {n: b for n, b in view.named_buffers() if "correction_bias" in n}
    out["bias_max_abs_diff"] = max(float((b - ref_buffers[n]).abs().max()) for n, b in biases.items())
    out["biases"] = sorted(biases)
    out["local_experts"] = {n: int(p.to_local().shape[0]) for n, p in view.named_parameters() if "experts.gate" in n}
    per = BATCH // DP  # one more forward and backward, so that the gradients exist while they are counted
    pipe.step(data[0][dp_rank * per : (dp_rank + 1) * per, :-1], data[0][dp_rank * per : (dp_rank + 1) * per, 1:])
    out["allocated"] = allocated(view, opt)  # elements this rank holds: its stage's shards, their grads, AdamW
    opt.zero_grad(set_to_none=True)
    if variant == "shipped" and (out_dir / "one" / "dcp").is_dir():
        out["resumed"] = resume_from_one_process(out_dir / "one" / "dcp", mesh, data)
    return out


def resume_from_one_process(dcp, mesh, data) -> list[dict]:
    """A fresh EP 2 x PP 2 pipeline (another seed) loads the one-process checkpoint of step ``SAVE_AT`` and trains
    steps ``SAVE_AT + 1 ...`` on the same batches."""
    pipe, view, opt = pipelined(spec(), mesh, seed=1)  # another seed: every value must come from the checkpoint
    mp.load_sharded(dcp, view, opt, flatten_optimizer=True)
    balance = ExpertBalance(view, mesh["dp"].get_group())
    dp_rank = mesh["dp"].get_local_rank()
    return [pipelined_step(pipe, view, opt, balance, ids, dp_rank) for ids in data[SAVE_AT : SAVE_AT + RESUMED]]


def main() -> None:
    """Both variants on the ``("pp", "dp_mod_ep", "ep", "tp")`` mesh; rank-wise results for the test."""
    rank, world = setup()
    assert world == 4, "run on 4 ranks: EP 2 x PP 2"
    mesh = mp.make_mesh(ep=2, pp=2)
    out_dir = Path(os.environ["MODKIT_DIST_OUT"])
    res = {variant: run_variant(variant, mesh, out_dir) for variant in ("shipped", "batch")}
    res["mesh"] = list(mesh.mesh_dim_names)
    write_results(res, rank)
    finish()


if __name__ == "__main__":
    main()

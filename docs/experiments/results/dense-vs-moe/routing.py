"""Expert load of every MoE layer of a comparison's MoE runs, on the validation split.

    .venv/bin/python docs/experiments/results/dense-vs-moe/routing.py REPORT_DIR

For each run under ``REPORT_DIR/runs/*moe*`` the best checkpoint reads the whole validation split in windows of
64 tokens; the router's choices are recorded with :func:`modkit.inspect` (``layers.I.ffn.router:output.1``, the
``[tokens, top_k]`` expert indices, and ``:output.2``, the ``[tokens, n_experts]`` logits). Printed per layer: each
expert's share of the ``tokens x top_k`` assignments (1 / n_experts when balanced) and the Switch Transformer
balance ``n_experts * sum_e f_e * P_e`` (Fedus et al. 2021, eq. 4; 1 when balanced), the quantity the
load-balancing loss penalises.
"""

import json
import sys
from pathlib import Path

import numpy as np
import torch

import modkit
from modkit.data import TokenData

torch.set_num_threads(1)
for run in sorted((Path(sys.argv[1]) / "runs").glob("*moe*")):
    model = modkit.load(run / "best").eval()
    val = TokenData.open(json.loads((run / "data.json").read_text())["folder"], verify=False).val
    n = len(val) // 64
    windows = torch.from_numpy(val[: n * 64].astype(np.int64)).view(n, 64)
    with torch.no_grad(), modkit.inspect(model, include=["layers.*.ffn.router:output.*"]) as rec:
        model(windows)
    for layer in range(len(model.layers)):
        indices = rec[f"layers.{layer}.ffn.router:output.1"]  # [tokens, top_k]
        probs = rec[f"layers.{layer}.ffn.router:output.2"].softmax(-1)  # [tokens, n_experts]
        n_experts = probs.shape[-1]
        share = torch.bincount(indices.flatten(), minlength=n_experts).double() / indices.numel()
        balance = n_experts * float((share * probs.double().mean(0)).sum())
        print(
            f"{run.name} layer {layer}: expert shares "
            + " ".join(f"{s:.3f}" for s in share)
            + f" (max {share.max():.3f}, min {share.min():.3f}, balanced {1 / n_experts:.3f}); balance {balance:.4f}"
        )

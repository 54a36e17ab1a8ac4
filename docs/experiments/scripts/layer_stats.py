"""Per-layer statistics of a trained model and the same model untrained, over many windows of validation text.

    .venv/bin/python docs/experiments/scripts/layer_stats.py RUN -o docs/experiments/results/trained-vs-untrained/layer_stats.json

``modkit trace`` reports these statistics for one text; this script averages them over ``--windows``
non-overlapping ``seq_len``-token windows from the start of tiny shakespeare's validation split (text neither model
was trained on), so that a verdict does not rest on one line. The two models:

* trained: the checkpoint of RUN (``RUN/best``, else ``RUN/last``), as ``modkit trace RUN`` loads it;
* untrained: ``modkit.build(SPEC, seed=0)``, as ``modkit trace SPEC --random-init`` builds it (seed 0).

Per layer ``i`` (``h`` its block output, ``h_prev`` its input; the same definitions as :mod:`modkit.analysis.trace`, every
token of every window averaged alike): mean ``||h||``, mean ``||h - h_prev|| / ||h_prev||``, mean
``cos(h, h_prev)``, attention entropy (nats, mean over heads and queries) next to the entropy of uniform causal
attention over the same queries (``mean log(t + 1)``), and three readings of the FFN hidden activation (the input
of the FFN's down projection, ``GELU(up(x))`` in nanoGPT's MLP):

* ``exact_zero``: the share of entries equal to 0 (``modkit trace``'s "FFN zeros");
* ``negative``: the share below 0. GELU(x) < 0 exactly when x < 0, so this is the share of units on GELU's "off"
  side, whose outputs lie in [-0.17, 0): the closest GELU analogue of a ReLU zero;
* ``small``: the share with ``|h| < 0.1 · RMS(h)`` of that layer in that model (a scale-free "near zero");
* ``negative_energy``: the share of ``Σ h²`` that the negative entries carry (how much of the signal passed to the
  down projection comes from units on the "off" side).

Also the cross-entropy of each model on the windows (nats per token) as a check that "trained" means trained.
One torch thread.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import torch
from torch import nn

import modkit
from modkit.data.corpus import default_dataset
from modkit.data.dataset import TokenData
from modkit.analysis.trace import attention_entropy
from modkit.cli.trace import _checkpoint_folder


def layer_stats(model: modkit.Model, windows: torch.Tensor) -> dict:
    """Statistics of ``model`` on ``windows [n, seq]`` (see the module docstring); one window per forward."""
    n_layers = model.spec.n_layers
    keys = ("residual_norm", "update_ratio", "cosine_prev", "entropy", "uniform_entropy", "exact_zero", "negative")
    sums = [{k: 0.0 for k in keys} for _ in range(n_layers)]
    hidden_sq = [0.0] * n_layers
    hidden_n = [0] * n_layers
    hiddens: list[list[torch.Tensor]] = [[] for _ in range(n_layers)]
    loss = 0.0
    seq = windows.shape[1] - 1  # query positions per window
    uniform = sum(math.log(t + 1) for t in range(seq)) / seq
    for w in windows:
        ids = w[None]  # [1, seq + 1]: inputs ids[:, :-1], targets ids[:, 1:]
        with modkit.inspect(
            model, include=["layers.*:input", "layers.*:output", "layers.*:update", "*:weights", "*:hidden"]
        ) as rec:
            logits = model(ids[:, :-1]).logits
        loss += float(nn.functional.cross_entropy(logits[0].float(), ids[0, 1:]))
        for i in range(n_layers):
            inp, out, upd = (rec[f"layers.{i}:{k}"][0].float() for k in ("input", "output", "update"))
            s = sums[i]
            s["residual_norm"] += float(out.norm(dim=-1).mean())
            s["update_ratio"] += float((upd.norm(dim=-1) / inp.norm(dim=-1)).mean())
            s["cosine_prev"] += float(nn.functional.cosine_similarity(out, inp, dim=-1).mean())
            weights = next(t for n, t in rec.layer(i).items() if n.endswith(":weights"))
            s["entropy"] += float(attention_entropy(weights[0]).mean())
            s["uniform_entropy"] += sum(math.log(t + 1) for t in range(weights.shape[-2])) / weights.shape[-2]
            h = next(t for n, t in rec.layer(i).items() if n.endswith(":hidden")).float()
            s["exact_zero"] += float((h == 0).float().mean())
            s["negative"] += float((h < 0).float().mean())
            hiddens[i].append(h.flatten())
            hidden_sq[i] += float((h * h).sum())
            hidden_n[i] += h.numel()
    n = len(windows)
    layers = []
    for i in range(n_layers):
        rms = math.sqrt(hidden_sq[i] / hidden_n[i])
        allh = torch.cat(hiddens[i])
        row = {k: v / n for k, v in sums[i].items()}
        row["small"] = float((allh.abs() < 0.1 * rms).float().mean())
        row["negative_energy"] = float((allh.clamp(max=0) ** 2).sum() / (allh**2).sum())
        row["hidden_rms"] = rms
        row["hidden_min"] = float(allh.min())
        layers.append({"layer": i, **row})
    return {"loss": loss / n, "uniform_entropy_all_queries": uniform, "layers": layers}


def main() -> None:
    """Load both models, measure, print a table, write the JSON."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    p.add_argument("run", type=Path, help="training run folder (or checkpoint folder)")
    p.add_argument("--spec", default="specs/nanogpt-shakespeare-char.json", help="spec of the untrained model")
    p.add_argument("--seed", type=int, default=0, help="seed of the untrained model (modkit trace --seed)")
    p.add_argument("--windows", type=int, default=64)
    p.add_argument("-o", "--out", type=Path, required=True)
    args = p.parse_args()
    torch.set_num_threads(1)
    folder = _checkpoint_folder(args.run)
    if folder is None:
        raise SystemExit(f"{args.run}: no checkpoint (best/ or last/) found")
    trained = modkit.load(folder).eval()
    untrained = modkit.build(args.spec, seed=args.seed).eval()
    seq = trained.spec.max_seq_len + 1  # inputs of max_seq_len tokens and their next-token targets
    val = TokenData.open(default_dataset(), verify=False).val
    if args.windows * seq > len(val):
        raise SystemExit(f"--windows {args.windows} x {seq} tokens exceeds the validation split ({len(val):,} tokens)")
    windows = torch.tensor(val[: args.windows * seq].astype("int64")).view(args.windows, seq)
    out = {
        "run": str(args.run),
        "checkpoint": str(folder),
        "spec": args.spec,
        "seed": args.seed,
        "windows": args.windows,
        "tokens_per_window": seq - 1,
        "definitions": {
            "exact_zero": "share of FFN hidden entries == 0",
            "negative": "share < 0 (GELU input < 0)",
            "small": "share with |h| < 0.1 * RMS(h) of the layer",
            "negative_energy": "share of sum(h^2) carried by entries < 0",
            "entropy": "nats, mean over heads and queries",
            "uniform_entropy": "mean over queries t of log(t + 1)",
        },
    }
    with torch.inference_mode():
        for name, model in (("trained", trained), ("untrained", untrained)):
            out[name] = layer_stats(model, windows)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    print(
        f"{args.windows} validation windows of {seq - 1} tokens; loss trained {out['trained']['loss']:.4f}, "
        f"untrained {out['untrained']['loss']:.4f} nats/token"
    )
    cols = (
        "residual_norm",
        "update_ratio",
        "cosine_prev",
        "entropy",
        "uniform_entropy",
        "exact_zero",
        "negative",
        "small",
        "negative_energy",
    )
    print(f"{'model':<10} {'layer':>5} " + " ".join(f"{c:>15}" for c in cols))
    for name in ("trained", "untrained"):
        for row in out[name]["layers"]:
            print(f"{name:<10} {row['layer']:>5} " + " ".join(f"{row[c]:>15.4f}" for c in cols))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

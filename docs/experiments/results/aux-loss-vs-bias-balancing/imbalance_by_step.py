"""Expert load imbalance by training step, from the ``train`` records of a ``modkit compare`` report folder.

Usage: ``python imbalance_by_step.py REPORT_DIR``. Every ``log_interval`` steps the training loop records that step's
``load_imbalance`` (max expert load / mean expert load over the step's token assignments, mean over the MoE layers);
this prints, per spec, the mean and the range over seeds at each logged step, and per layer at the last one.
"""

from __future__ import annotations

import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path


def main(report: Path) -> None:
    """Print the table for every spec of the comparison in ``report`` (its ``runs/`` folder)."""
    by_spec: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    last_layers: dict[str, list[dict[str, float]]] = defaultdict(list)
    for run in sorted((report / "runs").iterdir()):
        spec = run.name.rsplit("-lr", 1)[0]
        last = None
        for line in (run / "metrics.jsonl").read_text().splitlines():
            rec = json.loads(line)
            if rec.get("kind") == "train" and rec.get("load_imbalance") is not None:
                by_spec[spec][rec["step"]].append(rec["load_imbalance"])
                last = rec
        if last is not None:
            last_layers[spec].append(last["load_imbalance_layers"])
    for spec, steps in by_spec.items():
        print(f"{spec}: load imbalance of the training step (mean over MoE layers), mean [min, max] over seeds")
        for step, values in sorted(steps.items()):
            print(f"  step {step:4d}: {statistics.mean(values):.3f} [{min(values):.3f}, {max(values):.3f}]")
        layers = sorted(last_layers[spec][0])
        cells = ", ".join(f"{name} {statistics.mean(d[name] for d in last_layers[spec]):.3f}" for name in layers)
        print(f"  last logged step, per layer (mean over seeds): {cells}")


if __name__ == "__main__":
    main(Path(sys.argv[1]))

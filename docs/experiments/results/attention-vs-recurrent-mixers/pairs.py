"""The pairs among the recurrent designs that ``modkit compare`` does not compute (it compares every design with the
first, attention): the same paired-t difference (:func:`modkit.experiments.stats.mean_difference`) on the per-run losses of
``results.json``, at the training length (``val_loss``) and at twice it (``long_val_loss``).

Run from the repository root: ``.venv/bin/python docs/experiments/results/attention-vs-recurrent-mixers/pairs.py``.
"""

import json
from pathlib import Path

from modkit.experiments.stats import mean_difference

saved = json.loads((Path(__file__).parent / "results.json").read_text())
rows = {r["spec"]: sorted(r["runs"], key=lambda run: run["seed"]) for r in saved["rows"]}
for metric, what in (("val_loss", "validation loss at 128"), ("long_val_loss", "validation loss at 256")):
    print(what)
    for a, b in (("mamba2", "gated-deltanet"), ("hybrid", "gated-deltanet"), ("hybrid", "mamba2")):
        d = mean_difference([r[metric] for r in rows[a]], [r[metric] for r in rows[b]], paired=True)
        print("  " + d.text(a, b))

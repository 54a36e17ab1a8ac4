"""Evaluating trained models: cross-entropy, perplexity and bits per byte on token data (:mod:`.score`), and
lm-evaluation-harness tasks through the ``modkit`` model type (:mod:`.harness`, ``pip install 'modkit-lm[eval]'``).

::

    from modkit.evaluation import evaluate_checkpoint
    result = evaluate_checkpoint("runs/x/best")            # the run's data, seq_len and document mask
    result.score.loss, result.score.perplexity, result.score.bits_per_byte

``modkit eval CHECKPOINT [--data ...]`` prints the same; ``modkit eval CHECKPOINT --tasks ...`` runs lm-eval tasks.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from modkit.core._lazy import make_lazy

if TYPE_CHECKING:
    from .run import EvalResult, evaluate_checkpoint, run_defaults
    from .score import EvalError, Score, score_tokens, windows

_EXPORTS = {
    "EvalError": "modkit.evaluation.score",
    "Score": "modkit.evaluation.score",
    "score_tokens": "modkit.evaluation.score",
    "windows": "modkit.evaluation.score",
    "EvalResult": "modkit.evaluation.run",
    "evaluate_checkpoint": "modkit.evaluation.run",
    "run_defaults": "modkit.evaluation.run",
}

__all__ = sorted(_EXPORTS)

make_lazy(__name__, _EXPORTS)

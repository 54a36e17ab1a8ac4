"""Score a checkpoint on token data: what ``modkit eval CHECKPOINT [--data ...]`` runs.

A checkpoint that lives in a run folder (``runs/x/best``, ``runs/x/last``, ``runs/x/checkpoints/step-...``) takes its
defaults from the run (:func:`run_defaults`): the run's data folder, its ``seq_len``, ``batch_size``,
``document_mask`` and ``final_eval_tokens``, so ``modkit eval runs/x/best`` repeats the whole-split validation
score the run reported for that checkpoint. ``--data`` takes a prepared folder (``--split`` ``val`` or ``train``) or
text inputs of any format ``modkit data prepare`` reads, encoded with the checkpoint's tokenizer (end-of-text
token after each document when the tokenizer has one) and scored whole.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence, Union

import numpy as np
import torch

from .score import EvalError, Score, score_tokens


@dataclass
class EvalResult:
    """What :func:`evaluate_checkpoint` measured: the :class:`Score` and the settings it used (``settings``:
    data, split, seq_len, stride, max_tokens, batch_size, document_mask, tokens in the split)."""

    score: Score
    settings: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        """Score and settings as one JSON-ready dict."""
        return {**self.score.to_json(), **self.settings}


def run_folder_of(checkpoint: Union[str, Path]) -> Optional[Path]:
    """The run folder a checkpoint belongs to (it holds ``config.json`` and ``data.json``), or ``None``."""
    path = Path(checkpoint).expanduser().resolve()
    for candidate in (path.parent.parent, path.parent):
        if (candidate / "config.json").is_file() and (candidate / "data.json").is_file():
            return candidate
    return None


def run_defaults(checkpoint: Union[str, Path]) -> dict[str, Any]:
    """Defaults from the checkpoint's run folder: ``data``, ``seq_len``, ``batch_size``, ``document_mask``,
    ``max_tokens`` (the run's ``final_eval_tokens``); ``{}`` when the checkpoint is not in a run folder."""
    run = run_folder_of(checkpoint)
    if run is None:
        return {}
    config = json.loads((run / "config.json").read_text())
    data = json.loads((run / "data.json").read_text())
    return {
        "run": str(run),
        "data": data.get("folder"),
        "seq_len": config.get("seq_len"),
        "batch_size": config.get("batch_size"),
        "document_mask": bool(config.get("document_mask", False)),
        "max_tokens": config.get("final_eval_tokens") or None,
    }


def _is_prepared(path: Path) -> bool:
    return path.is_dir() and (path / "meta.json").is_file()


def evaluate_checkpoint(
    checkpoint: Union[str, Path],
    data: Union[str, Path, Sequence[Union[str, Path]], None] = None,
    *,
    split: str = "val",
    seq_len: Optional[int] = None,
    stride: Optional[int] = None,
    max_tokens: Optional[int] = None,
    batch_size: Optional[int] = None,
    document_mask: Optional[bool] = None,
    text_field: str = "text",
    device: Optional[str] = None,
    model: Any = None,
) -> EvalResult:
    """Cross-entropy, perplexity and bits per byte of a checkpoint on a data split or text inputs.

    Args:
        checkpoint: a modkit checkpoint folder (with its ``tokenizer.json``).
        data: a prepared data folder, or text inputs (files, folders; any format of ``modkit data prepare``);
            default: the run's data folder.
        split: ``"val"`` or ``"train"`` of a prepared folder.
        seq_len: tokens per window; default the run's ``seq_len``, else the model's ``max_seq_len``.
        stride: strided windows (``None``: non-overlapping).
        max_tokens: score at most this many targets; default the run's ``final_eval_tokens`` (so a run's figure is
            repeated), else the whole split.
        batch_size: windows per forward; default the run's ``batch_size``, else 8.
        document_mask: document-masked windows; default the run's setting, else off.
        text_field: field / column of the text in JSON Lines, Parquet or ``datasets`` inputs.
        device: where to run (default cuda when available).
        model: an already loaded model to use instead of loading ``checkpoint`` (its tokenizer still comes from
            the checkpoint folder).

    Raises:
        EvalError: no data (and no run folder), a split that does not exist, data the model's vocabulary does not
            cover, document masking on data without separators; as :func:`~modkit.evaluation.score.score_tokens`.
        DataError: unreadable inputs or text the tokenizer cannot encode.
        CheckpointError: not a checkpoint.
    """
    from modkit.io.checkpoint import load
    from ..data import TokenData, load_tokenizer
    from ..data.prepare import Separators, dtype_for, encode_sources
    from ..data.sources import find_sources

    defaults = run_defaults(checkpoint)
    dev = torch.device(device) if device else torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = model if model is not None else load(checkpoint, device=str(dev))
    folder = Path(checkpoint).expanduser()
    if not (folder / "tokenizer.json").is_file():
        raise EvalError(f"{checkpoint}: no tokenizer.json in the checkpoint folder; evaluate a checkpoint that training saved")
    tokenizer = load_tokenizer(folder)
    data = data if data is not None else defaults.get("data")
    if data is None:
        raise EvalError(f"{checkpoint} is not in a run folder, so there is no default data; give --data (a prepared folder or text files)")
    inputs = [data] if isinstance(data, (str, Path)) else list(data)
    separators: tuple = (tokenizer.eot_id, tokenizer.bos_id)
    tmp = None
    if len(inputs) == 1 and _is_prepared(Path(inputs[0]).expanduser()):
        prepared = TokenData.open(Path(inputs[0]).expanduser(), verify=False)
        if split not in ("val", "train"):
            raise EvalError(f"split = {split!r}: a prepared folder has the splits 'train' and 'val'")
        tokens = prepared.val if split == "val" else prepared.train
        separators = prepared.separators
        table = prepared.tokenizer.token_bytes()
        label, whole = str(prepared.path), f"{split} split"
    else:
        srcs = find_sources(inputs)
        tmp = tempfile.NamedTemporaryFile(prefix="modkit-eval-", suffix=".bin")
        with open(tmp.name, "wb") as f:
            encode_sources(srcs, tokenizer, f, separators=Separators(tokenizer.eot_id, tokenizer.bos_id), text_field=text_field)
        tokens = np.fromfile(tmp.name, dtype=dtype_for(tokenizer.vocab_size))
        table = tokenizer.token_bytes()
        label, whole = ", ".join(str(i) for i in inputs), "whole text"
    if len(tokens) and int(tokens.max()) >= model.spec.vocab_size:
        raise EvalError(f"{label}: token id {int(tokens.max())} is outside the model's vocabulary ({model.spec.vocab_size}); "
                        "evaluate on data prepared with the checkpoint's tokenizer")
    masked = defaults.get("document_mask", False) if document_mask is None else bool(document_mask)
    if masked and separators == (None, None):
        raise EvalError(f"document masking needs document separators, and {label} has none (prepared with --eot none?); "
                        "evaluate without --document-mask")
    seq = seq_len or defaults.get("seq_len") or model.spec.max_seq_len
    limit = max_tokens if max_tokens is not None else defaults.get("max_tokens")
    rows = batch_size or defaults.get("batch_size") or 8
    try:
        score = score_tokens(model, tokens, seq_len=seq, stride=stride, max_tokens=limit, batch_size=rows,
                             documents=separators if masked else None, token_bytes=table, device=dev)
    finally:
        if tmp is not None:
            tmp.close()
    settings = {"checkpoint": str(checkpoint), "data": label, "split": whole, "split_tokens": int(len(tokens)),
                "batch_size": rows, "document_mask": masked, "max_tokens": limit}
    return EvalResult(score, settings)

"""Score a checkpoint on token data: what ``modkit eval CHECKPOINT [--data ...]`` runs.

A checkpoint that lives in a run folder (``runs/x/best``, ``runs/x/last``, ``runs/x/checkpoints/step-...``) takes its
defaults from the run (:func:`run_defaults`): the run's data folder, its ``seq_len``, ``batch_size``,
``document_mask`` and ``final_eval_tokens``, so ``modkit eval runs/x/best`` repeats the whole-split validation
score the run reported for that checkpoint. ``--data`` takes a prepared folder (``--split`` ``val`` or ``train``) or
text inputs of any format ``modkit data prepare`` reads, encoded with the checkpoint's tokenizer (end-of-text
token after each document when the tokenizer has one) and scored whole.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence, Union

import numpy as np
import torch

from modkit.core.errors import reading

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
    ``max_tokens`` (the run's ``final_eval_tokens``); ``{}`` when the checkpoint is not in a run folder.

    Raises:
        EvalError: the run's ``config.json`` or ``data.json`` is not a JSON object (read strictly: duplicate keys
            refused), naming the file.
    """
    from modkit.core.jsonio import JSONInputError, read_json_file

    run = run_folder_of(checkpoint)
    if run is None:
        return {}
    files = {}
    for name in ("config.json", "data.json"):
        try:
            files[name] = read_json_file(run / name)
        except JSONInputError as exc:
            raise EvalError(f"the checkpoint's run folder: {exc}") from None
        if not isinstance(files[name], dict):
            raise EvalError(
                f"{run / name}: a {type(files[name]).__name__}, not a JSON object; is the run folder damaged?"
            )
    config, data = files["config.json"], files["data.json"]
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


@dataclass(frozen=True)
class EvalRequest:
    """One evaluation: the arguments of :func:`evaluate_checkpoint` (documented there) as one value.

    Attributes:
        checkpoint: a modkit checkpoint folder. data: a prepared folder or text inputs (``None``: the run's data).
        split: ``"val"`` or ``"train"`` of a prepared folder. seq_len, stride, max_tokens, batch_size: the windows
            (tokens; ``None``: the run's or the model's defaults). document_mask: document-masked windows (``None``:
            the run's setting). text_field: the text's field / column in structured inputs. device: where to run.
        model: an already loaded model (``None``: load ``checkpoint``).
    """

    checkpoint: Union[str, Path]
    data: Union[str, Path, Sequence[Union[str, Path]], None] = None
    split: str = "val"
    seq_len: Optional[int] = None
    stride: Optional[int] = None
    max_tokens: Optional[int] = None
    batch_size: Optional[int] = None
    document_mask: Optional[bool] = None
    text_field: str = "text"
    device: Optional[str] = None
    model: Any = None


@dataclass
class _EvalData:
    """The tokens to score and what describes them: the separators, the byte table, a label and the split's name
    (``tmp``: the temporary file text inputs were encoded into, closed after scoring)."""

    tokens: np.ndarray
    separators: tuple
    table: np.ndarray
    label: str
    whole: str
    tmp: Any = None


def evaluate_checkpoint(
    checkpoint: Union[str, Path], data: Union[str, Path, Sequence[Union[str, Path]], None] = None, **options: Any
) -> EvalResult:
    """Cross-entropy, perplexity and bits per byte of a checkpoint on a data split or text inputs.

    The keyword arguments are the fields of :class:`EvalRequest` (:func:`run_eval` takes one whole).

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
        EvalError: a window option (``seq_len``, ``stride``, ``max_tokens``, ``batch_size``) given but not a positive
            integer, no data (and no run folder), a split that does not exist, a prepared folder tokenized with
            another tokenizer than the checkpoint's, data the model's vocabulary does not cover, document masking on
            data without separators; as :func:`~modkit.evaluation.score.score_tokens`.
        DataError: unreadable inputs or text the tokenizer cannot encode.
        CheckpointError: not a checkpoint.
        TypeError: a keyword that is not a field of :class:`EvalRequest`.
    """
    return run_eval(EvalRequest(checkpoint, data, **options))


def run_eval(request: EvalRequest) -> EvalResult:
    """Run one :class:`EvalRequest`: load the model and the tokenizer, read or encode the data, score it.

    Returns:
        :class:`EvalResult`.

    Raises:
        EvalError, DataError, CheckpointError: as :func:`evaluate_checkpoint`.
    """
    from modkit.io.checkpoint import load
    from ..data import load_tokenizer

    r = request
    _check_sizes(r)
    defaults = run_defaults(r.checkpoint)
    dev = torch.device(r.device) if r.device else torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = r.model if r.model is not None else load(r.checkpoint, device=str(dev))
    folder = Path(r.checkpoint).expanduser()
    if not (folder / "tokenizer.json").is_file():
        raise EvalError(
            f"{r.checkpoint}: no tokenizer.json in the checkpoint folder; evaluate a checkpoint that training saved"
        )
    tokenizer = load_tokenizer(folder)
    data = r.data if r.data is not None else defaults.get("data")
    if data is None:
        raise EvalError(
            f"{r.checkpoint} is not in a run folder, so there is no default data; give --data (a prepared "
            "folder or text files)"
        )
    found = _eval_data([data] if isinstance(data, (str, Path)) else list(data), r, tokenizer)
    try:
        return _score(model, found, r, defaults, dev)
    finally:
        if found.tmp is not None:
            found.tmp.close()


#: the window options of a request: ``(field, what a value counts, the default when it is left out)``
_SIZES = (
    ("seq_len", "tokens per window", "the run's seq_len, else the model's max_seq_len"),
    ("stride", "tokens between window starts", "non-overlapping windows"),
    ("max_tokens", "tokens to score", "the run's final_eval_tokens, else the whole split"),
    ("batch_size", "windows per forward", "the run's batch_size, else 8"),
)


def _check_sizes(r: EvalRequest) -> None:
    """Refuse a window option that is given but not a positive integer: 0 used to fall back to the default.

    Raises:
        EvalError: naming the option (and its ``modkit eval`` flag), the value and what leaving it out gives.
    """
    for name, unit, default in _SIZES:
        value = getattr(r, name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise EvalError(
                f"{name} = {value!r} (--{name.replace('_', '-')}): give a positive number of {unit}, or leave it out "
                f"for the default ({default})"
            )


def _check_tokenizer(data_tokenizer, tokenizer, folder: Path, checkpoint: Any) -> None:
    """Refuse a prepared folder tokenized with another tokenizer than the checkpoint's: its ids may all lie in the
    model's vocabulary (two char tokenizers of different texts), yet they mean other tokens, and the scores would
    measure nothing.

    Raises:
        EvalError: naming the folder, the checkpoint, a token the two number differently, and the fix.
    """
    from ..data.tokenizer import vocab_difference

    differs = vocab_difference(tokenizer, data_tokenizer, "the checkpoint", "the data")
    if differs is None:
        return
    raise EvalError(
        f"{folder} was tokenized with another tokenizer ({data_tokenizer.spec}) than the checkpoint {checkpoint}: "
        f"{differs}, so its ids mean other tokens to the model and the scores would measure nothing; "
        "evaluate on data prepared with the checkpoint's tokenizer, or give the text files (--data FILE...), which "
        "are encoded with it"
    )


def _eval_data(inputs: list, request: EvalRequest, tokenizer) -> _EvalData:
    """The split of a prepared folder (one input that is one), else the text inputs encoded with ``tokenizer``
    into a temporary file (an end-of-text id after each document when the tokenizer has one).

    Raises:
        EvalError: a split a prepared folder does not have. DataError: unreadable inputs or unencodable text.
    """
    from ..data import TokenData
    from ..data.encode import encode_sources
    from ..data.prepare_format import Separators, dtype_for
    from ..data.sources import find_sources

    if len(inputs) == 1 and _is_prepared(Path(inputs[0]).expanduser()):
        with reading(f"the prepared data folder {inputs[0]}"):
            prepared = TokenData.open(Path(inputs[0]).expanduser(), verify=False)
        _check_tokenizer(prepared.tokenizer, tokenizer, prepared.path, request.checkpoint)
        if request.split not in ("val", "train"):
            raise EvalError(f"split = {request.split!r}: a prepared folder has the splits 'train' and 'val'")
        tokens = prepared.val if request.split == "val" else prepared.train
        return _EvalData(
            tokens, prepared.separators, prepared.tokenizer.token_bytes(), str(prepared.path), f"{request.split} split"
        )
    with reading(f"the inputs {', '.join(str(i) for i in inputs)}"):
        srcs = find_sources(inputs)
    tmp = tempfile.NamedTemporaryFile(prefix="modkit-eval-", suffix=".bin")
    try:
        with open(tmp.name, "wb") as f, reading(f"the inputs {', '.join(str(i) for i in inputs)}"):
            encode_sources(
                srcs,
                tokenizer,
                f,
                separators=Separators(tokenizer.eot_id, tokenizer.bos_id),
                text_field=request.text_field,
            )
        tokens = np.fromfile(tmp.name, dtype=dtype_for(tokenizer.vocab_size))
    except BaseException:
        tmp.close()
        raise
    return _EvalData(
        tokens,
        (tokenizer.eot_id, tokenizer.bos_id),
        tokenizer.token_bytes(),
        ", ".join(str(i) for i in inputs),
        "whole text",
        tmp,
    )


def _score(model, found: _EvalData, r: EvalRequest, defaults: dict, dev: torch.device) -> EvalResult:
    """Check the data against the model and the masking asked for, then score it with the run's defaults filled in.

    Raises:
        EvalError: ids outside the model's vocabulary, document masking without separators or with a token mixer
            that does not declare the ``document_mask`` capability (its layer, type and the types that do, as
            ``modkit train`` says); as :func:`~modkit.evaluation.score.score_tokens`.
    """
    tokens, label = found.tokens, found.label
    if len(tokens) and int(tokens.max()) >= model.spec.vocab_size:
        raise EvalError(
            f"{label}: token id {int(tokens.max())} is outside the model's vocabulary "
            f"({model.spec.vocab_size}); evaluate on data prepared with the checkpoint's tokenizer"
        )
    masked = defaults.get("document_mask", False) if r.document_mask is None else bool(r.document_mask)
    if masked and found.separators == (None, None):
        raise EvalError(
            f"document masking needs document separators, and {label} has none (prepared with --eot "
            "none?); evaluate without --document-mask"
        )
    if masked:  # refused before scoring, with the message Model.forward(documents=...) gives
        from modkit.nn.documents import document_mask_refusal, undeclared_mixers

        problems = undeclared_mixers(model)
        if problems:
            raise EvalError(f"--document-mask: {document_mask_refusal(problems)}; evaluate with --no-document-mask")
    seq = r.seq_len if r.seq_len is not None else defaults.get("seq_len") or model.spec.max_seq_len
    limit = r.max_tokens if r.max_tokens is not None else defaults.get("max_tokens")
    rows = r.batch_size if r.batch_size is not None else defaults.get("batch_size") or 8
    try:
        score = score_tokens(
            model,
            tokens,
            seq_len=seq,
            stride=r.stride,
            max_tokens=limit,
            batch_size=rows,
            documents=found.separators if masked else None,
            token_bytes=found.table,
            device=dev,
        )
    except EvalError as exc:  # too few tokens, ...: name the data they came from
        raise EvalError(f"{label} ({found.whole}): {exc}") from None
    settings = {
        "checkpoint": str(r.checkpoint),
        "data": label,
        "split": found.whole,
        "split_tokens": int(len(tokens)),
        "batch_size": rows,
        "document_mask": masked,
        "max_tokens": limit,
    }
    return EvalResult(score, settings)

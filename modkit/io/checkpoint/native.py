"""modkit's own format: :func:`save` (a folder with ``spec.json`` and ``model.safetensors``, replaced as one
atomic step) and :func:`load`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, Union

import torch

from modkit.core.errors import CheckpointError
from modkit.core.jsonio import JSONInputError, parse_json
from modkit.io.atomic import commit, discard, recover, write_safetensors_tmp, write_text_tmp

from .files import (
    EXTRAS_PREFIX,
    FORMAT_KEY,
    FORMAT_VERSION,
    HF_CONFIG_FILE,
    HF_CONFIG_KEY,
    SPEC_FILE,
    SPEC_KEY,
    WEIGHTS_FILE,
    _json_kind,
    _pickles_in,
    checked_path,
    pickle_message,
    refuse_pickle,
)
from .source import TensorSource
from .state import materialize

if TYPE_CHECKING:
    from modkit.core.registry import Registry
    from modkit.nn.model import Model
    from modkit.spec import ModelSpec


def _prepare_folder(path: Path) -> None:
    if path.exists() and not path.is_dir():
        raise CheckpointError(f"{path} exists and is not a folder")
    path.mkdir(parents=True, exist_ok=True)


def save(model: "Model", path: Union[str, Path]) -> Path:
    """Save ``model`` in modkit's own format: a folder with ``spec.json`` and ``model.safetensors``.

    ``model.safetensors`` holds ``model.state_dict()`` (a tied head once, as the embedding), the spec JSON in its
    metadata entry ``modkit.spec`` and, for models imported from another format, the kept source tensors
    (``model.checkpoint_extras``, under ``checkpoint_extras.``) and the source config (``modkit.hf_config``), so
    ``load(save(m))`` reproduces every tensor bitwise.

    The two files are replaced as one step (:mod:`modkit.io.atomic`): both are written under temporary names, then
    a journal is committed and the renames carried out. If the process dies at any instant, :func:`load` finds
    the old checkpoint or the new one, complete; temporaries left by a killed save are deleted by the next
    ``save`` or ``load`` of the folder.

    Args:
        model: a :class:`~modkit.nn.model.Model`.
        path: the folder (created if needed; existing files of the same names are replaced).

    Returns:
        the folder path.

    Raises:
        CheckpointError: ``path`` exists and is not a folder, or holds a NUL byte.
    """
    path = checked_path(path)
    _prepare_folder(path)
    recover(path)
    spec_json = model.spec.to_json()
    tensors = dict(model.state_dict())
    for name, t in (getattr(model, "checkpoint_extras", None) or {}).items():
        tensors[EXTRAS_PREFIX + name] = t
    meta = {"format": "pt", FORMAT_KEY: FORMAT_VERSION, SPEC_KEY: spec_json}
    hf_cfg = getattr(model, "hf_config", None)
    if hf_cfg:
        meta[HF_CONFIG_KEY] = json.dumps(hf_cfg)
    weights = write_safetensors_tmp(tensors, path / WEIGHTS_FILE, meta)
    try:
        spec_tmp = write_text_tmp(spec_json + "\n", path / SPEC_FILE)
    except BaseException:
        discard(weights)
        raise
    commit([(weights, path / WEIGHTS_FILE), (spec_tmp, path / SPEC_FILE)])
    return path


def _metadata_json(source: "TensorSource", key: str, what: str) -> Any:
    """Parse the JSON text of metadata entry ``key`` strictly; ``None`` when absent."""
    text = source.metadata.get(key)
    if text is None:
        return None
    try:
        value = parse_json(text)
    except JSONInputError as exc:
        raise CheckpointError(f"{source.origin}: the '{key}' metadata ({what}) is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise CheckpointError(
            f"{source.origin}: the '{key}' metadata ({what}) must be a JSON object, got {_json_kind(value)}"
        )
    return value


def load(
    path: Union[str, Path],
    *,
    device: Union[str, torch.device, None] = None,
    dtype: Union[str, torch.dtype, None] = None,
    registry: Optional["Registry"] = None,
    nonfinite: str = "warn",
    check_memory: bool = True,
) -> "Model":
    """Load a checkpoint written by :func:`save` (a folder, or its ``model.safetensors`` alone).

    The model is built from the spec stored in the safetensors metadata (``spec.json`` is a readable copy; if it
    was edited so that it differs, loading refuses rather than guessing which one is meant). A save interrupted
    in the folder is first completed or discarded (:func:`modkit.io.atomic.recover`), so the checkpoint loaded is
    the old one or the new one, never a mix.

    Args:
        path: the folder or the ``.safetensors`` file.
        device: target device (default CPU).
        dtype: parameter dtype; default: the stored one.
        registry: defaults to the process-wide registry.
        nonfinite: ``"warn"`` (default): a :class:`~modkit.core.errors.NonFiniteWeightsWarning` counts NaN and infinite
            values tensor by tensor; ``"error"``: refuse such a checkpoint.
        check_memory: refuse (:class:`~modkit.core.errors.MemoryLimitError`) when the weights would not fit in the
            memory available on ``device``; ``False`` skips the estimate.

    Returns:
        the :class:`~modkit.nn.model.Model` in eval mode; ``checkpoint_extras`` and ``hf_config`` restored when saved.

    Raises:
        CheckpointError: a pickle file (refused: unpickling can execute code), not a modkit checkpoint (no
            ``modkit.spec`` metadata; a Hugging Face folder needs :func:`modkit.from_hf`), unreadable or malformed
            files or metadata, ``spec.json`` differing from the stored spec, missing/unexpected tensors, shape
            mismatches, tensors of a dtype the model cannot take (each named), non-finite values with
            ``nonfinite="error"``.
        SpecError: the stored spec does not validate against the installed components.
        MemoryLimitError: the weights would not fit (see ``check_memory``).
    """
    if nonfinite not in ("warn", "error"):
        raise ValueError(f"nonfinite must be 'warn' or 'error', got {nonfinite!r}")
    path = checked_path(path)
    source, folder, pending = _open_weights(path)
    spec = _stored_spec(source, path, folder, pending, registry)
    state, extras = {}, {}
    for name in source.names():
        if name.startswith(EXTRAS_PREFIX):
            extras[name[len(EXTRAS_PREFIX) :]] = source.get(name)
        else:
            state[name] = source.get(name)
    model = materialize(
        spec,
        state,
        device=device,
        dtype=dtype,
        registry=registry,
        nonfinite=nonfinite,
        check_memory=check_memory,
        origin=str(source.origin),
    )
    model.checkpoint_extras = extras
    model.hf_config = _metadata_json(source, HF_CONFIG_KEY, "the Hugging Face config the model came from")
    return model


def _open_weights(path: Path) -> tuple[TensorSource, Path, dict[str, Path]]:
    """The weights file of the checkpoint at ``path`` (a folder or its ``model.safetensors``), opened after an
    interrupted save in the folder was completed or discarded.

    Returns:
        ``(source, folder, pending)``: the opened weights, the checkpoint's folder, and ``{file name: path}`` of
            the files :func:`modkit.io.atomic.recover` says to read in place of the folder's.

    Raises:
        CheckpointError: a pickle file, a Hugging Face folder, a folder without ``model.safetensors``, or weights
            that cannot be opened.
    """
    refuse_pickle(path)
    folder = path if path.is_dir() else path.parent
    pending = recover(folder)
    if path.is_dir() and not (path / WEIGHTS_FILE).exists() and WEIGHTS_FILE not in pending:
        if (path / HF_CONFIG_FILE).is_file():
            raise CheckpointError(
                f"{path} is a Hugging Face folder (config.json), not a modkit checkpoint; use modkit.from_hf"
            )
        pickles = _pickles_in(path)
        if pickles:
            raise CheckpointError(pickle_message(pickles[0]))
        raise CheckpointError(f"{path}: no {WEIGHTS_FILE}; not a modkit checkpoint")
    weights_path = path / WEIGHTS_FILE if path.is_dir() else path
    if weights_path.parent == folder:
        weights_path = pending.get(weights_path.name, weights_path)
    return TensorSource.from_path(weights_path), folder, pending


def _stored_spec(
    source: TensorSource, path: Path, folder: Path, pending: dict[str, Path], registry: Optional["Registry"]
) -> "ModelSpec":
    """The spec stored in the weights' metadata, checked against the folder's ``spec.json`` when there is one.

    Raises:
        CheckpointError: no ``modkit.spec`` metadata (not a modkit checkpoint), malformed metadata, or a
            ``spec.json`` that differs from the stored spec.
        SpecError: the stored spec does not validate against the installed components.
    """
    from modkit.spec import load_spec

    data = _metadata_json(source, SPEC_KEY, "the model's spec")
    if data is None:
        raise CheckpointError(
            f"{source.origin} holds no '{SPEC_KEY}' metadata, so it is not a modkit checkpoint; "
            "for a Hugging Face folder use modkit.from_hf"
        )
    spec = load_spec(data, registry=registry)
    spec_file = pending.get(SPEC_FILE, folder / SPEC_FILE)
    if path.is_dir() and (spec_file.exists() or spec_file.is_symlink()):
        on_disk = load_spec(spec_file, registry=registry)
        if on_disk.to_dict() != spec.to_dict():
            raise CheckpointError(
                f"{folder / SPEC_FILE} differs from the spec stored in {source.origin} (the one the weights were "
                "saved with); restore it, delete it, or build the edited spec and load the weights into it explicitly"
            )
    return spec

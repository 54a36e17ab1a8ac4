"""The on-disk names of modkit's checkpoints (metadata keys, file names, safetensors dtype codes) and the checks
every path goes through: no NUL byte, regular files only, pickle files refused."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Sequence, Union

import torch

from modkit.core.errors import CheckpointError
from modkit.core.jsonio import JSONInputError, check_regular_file


#: safetensors metadata key holding the spec JSON in modkit's own format
SPEC_KEY = "modkit.spec"
#: safetensors metadata key holding the version of modkit's checkpoint format
FORMAT_KEY = "modkit.format"
FORMAT_VERSION = "1"
#: safetensors metadata key holding the Hugging Face config a model was imported from (JSON), if any
HF_CONFIG_KEY = "modkit.hf_config"
#: name prefix of kept source tensors (``model.checkpoint_extras``) inside a modkit checkpoint
EXTRAS_PREFIX = "checkpoint_extras."
#: file names of modkit's own format
SPEC_FILE = "spec.json"
WEIGHTS_FILE = "model.safetensors"
#: file names of the Hugging Face layout
HF_CONFIG_FILE = "config.json"
HF_INDEX_FILE = "model.safetensors.index.json"

#: suffixes of files that hold pickled tensors (never loaded)
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")

_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}


#: safetensors dtype codes of the floating tensors a model weight may be read from
_LOADABLE_CODES = ("F16", "BF16", "F32", "F64")


def pickle_message(path: Union[str, Path]) -> str:
    """Why a pickle checkpoint is refused and how to convert it (the text of the :class:`CheckpointError`)."""
    p = Path(path)
    src = p.name
    return (
        f"refusing to load {p}: it is a pickle file, and unpickling can execute arbitrary code hidden in the "
        "file; modkit reads weights only from safetensors. Convert it once, in an environment where you trust "
        "the file, e.g.\n"
        f'  python -c "import torch; from safetensors.torch import save_file; '
        f"sd = torch.load('{src}', map_location='cpu', weights_only=True); "
        "save_file({k: v.contiguous() for k, v in sd.items()}, 'model.safetensors', metadata={'format': 'pt'})\"\n"
        "(weights_only=True refuses code objects), or with transformers: "
        "AutoModel.from_pretrained(folder).save_pretrained(out, safe_serialization=True)"
    )


def _json_kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a bool"
    kinds = {dict: "an object", list: "an array", str: "a string", int: "an integer", float: "a number"}
    return kinds.get(type(value), type(value).__name__)


def checked_path(path: Union[str, Path]) -> Path:
    """``path`` as a :class:`Path`, refusing a NUL byte (which no file name can hold).

    Raises:
        CheckpointError: the path holds a NUL byte.
    """
    if "\x00" in os.fspath(path):
        raise CheckpointError(f"{str(path)!r}: the path contains a NUL byte")
    return Path(path)


def _regular(path: Path) -> None:
    """Refuse anything but a regular file (a FIFO would block, a device would stream forever)."""
    try:
        check_regular_file(path)
    except JSONInputError as exc:
        raise CheckpointError(str(exc)) from None


def refuse_pickle(path: Union[str, Path]) -> None:
    """Raise :class:`CheckpointError` if ``path`` names a pickle checkpoint (``.bin``, ``.pt``, ``.pth``, ...)."""
    if Path(path).suffix.lower() in PICKLE_SUFFIXES:
        raise CheckpointError(pickle_message(path))


def _pickles_in(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.is_file() and p.suffix.lower() in PICKLE_SUFFIXES)


def _fmt_names(names: Sequence[str], limit: int = 40) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f", ... ({len(names) - limit} more)" if len(names) > limit else "")

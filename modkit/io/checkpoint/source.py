"""Reading safetensors: :class:`TensorSource`, a lazy view of one file or of a sharded set listed by an index."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Optional, Union

import torch
from torch import Tensor

from modkit.core.errors import CheckpointError
from modkit.core.jsonio import JSONInputError, read_json_file

from .files import (
    _DTYPES,
    HF_INDEX_FILE,
    WEIGHTS_FILE,
    _json_kind,
    _pickles_in,
    _regular,
    checked_path,
    pickle_message,
    refuse_pickle,
)


class TensorSource:
    """Lazy, read-only view of the tensors of one safetensors file or of a sharded set.

    Args:
        files: ``{tensor name: safetensors file}``; every file is opened once, on first use.
        metadata: the safetensors metadata (of the single file, or of the index).
        origin: the path shown in messages.

    Use :meth:`from_path` to open a file, a folder (``model.safetensors`` or a sharded index) or an index.
    """

    def __init__(self, files: Mapping[str, Path], metadata: Optional[Mapping[str, str]], origin: Path):
        self._files = dict(files)
        self.metadata: dict[str, str] = dict(metadata or {})
        self.origin = origin
        self._handles: dict[Path, Any] = {}

    @classmethod
    def from_path(cls, path: Union[str, Path]) -> "TensorSource":
        """Open ``path``: a ``.safetensors`` file, a ``model.safetensors.index.json``, or a folder holding one.

        Raises:
            CheckpointError: pickle files (refused, with the reason and a conversion recipe), no safetensors
                weights found (lists what the folder holds), a malformed index or a shard it names missing.
        """
        path = checked_path(path)
        if not path.exists():
            raise CheckpointError(f"{path}: no such file or folder")
        if path.is_dir():
            index, single = path / HF_INDEX_FILE, path / WEIGHTS_FILE
            if index.is_file():
                return cls._from_index(index)
            if single.exists():  # (a special file of that name is refused by _from_file, naming what it is)
                return cls._from_file(single)
            others = sorted(path.glob("*.safetensors"))
            if len(others) == 1:
                return cls._from_file(others[0])
            pickles = _pickles_in(path)
            if pickles:
                raise CheckpointError(pickle_message(pickles[0]))
            if others:
                raise CheckpointError(
                    f"{path}: several .safetensors files ({', '.join(p.name for p in others)}) but no {HF_INDEX_FILE} "
                    "saying which tensor lives where"
                )
            held = ", ".join(sorted(p.name for p in path.iterdir())) or "nothing"
            raise CheckpointError(
                f"{path}: no safetensors weights ({WEIGHTS_FILE} or {HF_INDEX_FILE}); the folder holds {held}"
            )
        refuse_pickle(path)
        if path.name.endswith(".index.json"):
            return cls._from_index(path)
        if path.suffix != ".safetensors":
            raise CheckpointError(f"{path}: not a .safetensors file; modkit reads weights only from safetensors")
        return cls._from_file(path)

    @classmethod
    def _from_file(cls, path: Path) -> "TensorSource":
        from safetensors import safe_open

        _regular(path)
        try:
            handle = safe_open(str(path), framework="pt")
        except Exception as exc:  # noqa: BLE001 - safetensors raises several types for a bad header
            raise CheckpointError(f"{path}: not a readable safetensors file: {exc}") from None
        src = cls({name: path for name in handle.keys()}, handle.metadata(), path)
        src._handles[path] = handle
        return src

    @classmethod
    def _from_index(cls, index: Path) -> "TensorSource":
        try:
            data = read_json_file(index)
        except JSONInputError as exc:
            raise CheckpointError(f"not a valid safetensors index: {exc}") from None
        problems = []
        if not isinstance(data, dict):
            raise CheckpointError(
                f"{index}: not a valid safetensors index: a JSON object is needed, got {_json_kind(data)}"
            )
        weight_map = data.get("weight_map")
        if not isinstance(weight_map, dict):
            raise CheckpointError(
                f"{index}: not a valid safetensors index: 'weight_map' must be an object of tensor name -> "
                f"shard file name, got {_json_kind(weight_map)}"
            )
        meta = data.get("metadata")
        if meta is not None and not isinstance(meta, dict):
            problems.append(f"'metadata' must be an object, got {_json_kind(meta)}")
        files = {}
        for name, fname in weight_map.items():
            if not isinstance(fname, str):
                problems.append(f"weight_map[{name!r}] must be a shard file name (a string), got {_json_kind(fname)}")
                continue
            if fname in ("", ".", "..") or "/" in fname or "\\" in fname or "\x00" in fname:
                problems.append(f"weight_map[{name!r}] = {fname!r} is not a file name in the index's folder")
                continue
            refuse_pickle(fname)
            if not fname.endswith(".safetensors"):
                problems.append(f"weight_map[{name!r}] = {fname!r} is not a .safetensors file")
                continue
            files[name] = index.parent / fname
        if problems:
            shown = problems[:5] + ([f"... and {len(problems) - 5} more"] if len(problems) > 5 else [])
            raise CheckpointError(f"{index}: not a valid safetensors index:\n  " + "\n  ".join(shown))
        missing = sorted({str(p.name) for p in files.values() if not p.is_file()})
        if missing:
            raise CheckpointError(f"{index}: shard file(s) listed in the index are missing: {', '.join(missing)}")
        return cls(files, {str(k): str(v) for k, v in (meta or {}).items()}, index)

    def _handle(self, name: str):
        from safetensors import safe_open

        path = self._files[name]
        handle = self._handles.get(path)
        if handle is None:
            _regular(path)
            try:
                handle = safe_open(str(path), framework="pt")
            except Exception as exc:  # noqa: BLE001
                raise CheckpointError(f"{path}: not a readable safetensors file: {exc}") from None
            self._handles[path] = handle
        return handle

    def names(self) -> list[str]:
        """Every tensor name, sorted."""
        return sorted(self._files)

    def __contains__(self, name: str) -> bool:
        return name in self._files

    def shape(self, name: str) -> tuple[int, ...]:
        """Shape of tensor ``name`` (read from the header; no data is loaded)."""
        return tuple(self._handle(name).get_slice(name).get_shape())

    def dtype_code(self, name: str) -> str:
        """The safetensors dtype code of tensor ``name`` (``F32``, ``BF16``, ``I64``, ``F8_E4M3``...)."""
        return str(self._handle(name).get_slice(name).get_dtype())

    def dtype(self, name: str) -> torch.dtype:
        """Stored dtype of tensor ``name``."""
        code = self._handle(name).get_slice(name).get_dtype()
        try:
            return _DTYPES[code]
        except KeyError:
            raise CheckpointError(
                f"{self.origin}: tensor {name!r} has dtype {code}, which modkit does not load"
            ) from None

    def get(self, name: str) -> Tensor:
        """Tensor ``name`` on the CPU, in its stored dtype.

        Raises:
            CheckpointError: the index names a tensor its shard does not hold.
        """
        try:
            return self._handle(name).get_tensor(name)
        except Exception as exc:  # noqa: BLE001 - a shard without the tensor the index promised
            raise CheckpointError(f"{self._files[name]}: cannot read tensor {name!r}: {exc}") from None

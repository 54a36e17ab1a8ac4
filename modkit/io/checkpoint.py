"""Checkpoints: safetensors only, checked name by name and shape by shape, written atomically.

Two on-disk formats go through this module:

* **modkit's own** (:func:`save` / :func:`load`): a folder holding ``spec.json`` (the spec, for people and
  editors) and ``model.safetensors`` (the model's ``state_dict``; its safetensors metadata entry
  ``modkit.spec`` holds the same spec, which is what :func:`load` builds). A lone ``.safetensors`` file written
  by :func:`save` loads too.
* **Hugging Face** (``config.json`` + ``model.safetensors``, or shards listed in
  ``model.safetensors.index.json``), through :func:`modkit.from_hf` / :func:`modkit.to_hf` in :mod:`modkit.io.hf`.
  This module supplies the engine they use: a :class:`WeightMapper` registered by a plugin per ``model_type``
  (``register(model_type, convert, weights=mapper)``) describes the correspondence as :class:`Link` objects;
  the core names no model type.

Safety and no data loss:

* weights are read only from safetensors; pickle checkpoints (``pytorch_model.bin``, ``*.pt``, ``*.pth``,
  ``*.ckpt``...) are refused with :class:`~modkit.core.errors.CheckpointError`, because unpickling can execute
  arbitrary code; the message says how to convert them once in a trusted environment;
* every missing tensor, unexpected tensor and shape mismatch is collected into one ``CheckpointError`` that
  names each tensor (and both shapes); nothing is skipped silently. A checkpoint whose head differs from a tied
  embedding is refused by :class:`~modkit.nn.model.Model` itself (a tied pair holds one tensor);
* tensors of a source checkpoint that modkit's model does not compute (BERT's pooler, a buffer such as
  ``position_ids``) are not dropped either: a mapper declares them as *kept*; they travel with the model in
  ``model.checkpoint_extras`` (and in :func:`save` files) and are written back on export;
* a folder's files are written under temporary names and replaced as one atomic step (:mod:`modkit.io.atomic`:
  a journal is committed, then the renames are done; readers finish an interrupted step first), so a save
  killed at any instant leaves the old checkpoint or the new one, complete, never a mix;
* every file is read strictly (:mod:`modkit.core.jsonio`: regular files only, bounded sizes, UTF-8, no duplicate
  keys); tensors of a dtype the model cannot take are refused by name, and NaN or infinite weights are counted
  tensor by tensor (a warning, or an error with ``nonfinite="error"``).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, Optional, Protocol, Sequence, Union, runtime_checkable

import torch
from torch import Tensor

from modkit.io.atomic import commit, discard, recover, write_safetensors_tmp, write_text_tmp
from modkit.core.errors import CheckpointError, NonFiniteWeightsWarning
from modkit.core.interfaces import Init
from modkit.core.jsonio import JSONInputError, check_regular_file, parse_json, read_json_file

if TYPE_CHECKING:
    from modkit.nn.model import Model
    from modkit.core.registry import Registry
    from modkit.spec import ModelSpec

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

# ------------------------------------------------------------------------------------------------ safety


def pickle_message(path: Union[str, Path]) -> str:
    """Why a pickle checkpoint is refused and how to convert it (the text of the :class:`CheckpointError`)."""
    p = Path(path)
    src = p.name
    return (
        f"refusing to load {p}: it is a pickle file, and unpickling can execute arbitrary code hidden in the "
        "file; modkit reads weights only from safetensors. Convert it once, in an environment where you trust "
        "the file, e.g.\n"
        f"  python -c \"import torch; from safetensors.torch import save_file; "
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
    return {dict: "an object", list: "an array", str: "a string", int: "an integer", float: "a number"}.get(type(value), type(value).__name__)


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


# ------------------------------------------------------------------------------------------------ reading


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
            raise CheckpointError(f"{path}: no safetensors weights ({WEIGHTS_FILE} or {HF_INDEX_FILE}); the folder holds {held}")
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
            raise CheckpointError(f"{index}: not a valid safetensors index: a JSON object is needed, got {_json_kind(data)}")
        weight_map = data.get("weight_map")
        if not isinstance(weight_map, dict):
            raise CheckpointError(f"{index}: not a valid safetensors index: 'weight_map' must be an object of tensor name -> "
                                  f"shard file name, got {_json_kind(weight_map)}")
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
            raise CheckpointError(f"{self.origin}: tensor {name!r} has dtype {code}, which modkit does not load") from None

    def get(self, name: str) -> Tensor:
        """Tensor ``name`` on the CPU, in its stored dtype.

        Raises:
            CheckpointError: the index names a tensor its shard does not hold.
        """
        try:
            return self._handle(name).get_tensor(name)
        except Exception as exc:  # noqa: BLE001 - a shard without the tensor the index promised
            raise CheckpointError(f"{self._files[name]}: cannot read tensor {name!r}: {exc}") from None


# ------------------------------------------------------------------------------------------------ mapping


def _identity(tensors: Sequence[Tensor], *_: Any) -> list[Tensor]:
    return list(tensors)


@dataclass(frozen=True)
class Link:
    """One correspondence between tensors of a foreign checkpoint and of modkit's ``state_dict``.

    Attributes:
        hf: the foreign (e.g. Hugging Face) tensor names, in the order the transforms use.
        ours: the modkit ``state_dict`` names, in the order the transforms use.
        to_ours: ``to_ours(hf_tensors) -> ours_tensors``; default: identity (``len(hf) == len(ours)``).
            Must be exact (split, concatenate, transpose, permute, add): round trips are compared bitwise.
        to_hf: ``to_hf(ours_tensors, extras) -> hf_tensors``, the exact inverse of ``to_ours``; ``extras`` are the
            kept source tensors (``model.checkpoint_extras``), for inverting a fold (BERT's token types).
        optional: the foreign tensors may be absent (e.g. a head that a tied checkpoint may or may not store).
    """

    hf: tuple[str, ...]
    ours: tuple[str, ...]
    to_ours: Optional[Callable[[Sequence[Tensor]], Sequence[Tensor]]] = None
    to_hf: Optional[Callable[[Sequence[Tensor], Mapping[str, Tensor]], Sequence[Tensor]]] = None
    optional: bool = False

    def forward(self, tensors: Sequence[Tensor]) -> list[Tensor]:
        """Foreign tensors → modkit tensors."""
        return list((self.to_ours or _identity)(tensors))

    def backward(self, tensors: Sequence[Tensor], extras: Mapping[str, Tensor]) -> list[Tensor]:
        """Modkit tensors → foreign tensors."""
        return list((self.to_hf or _identity)(tensors, extras))


@runtime_checkable
class WeightMapper(Protocol):
    """What a plugin registers with ``register(model_type, convert, weights=mapper)`` for one ``model_type``.

    ``links(spec, shapes, config)`` returns the :class:`Link` list that covers every tensor of a model built from
    ``spec`` (``shapes``: ``{state_dict name: shape}``) for a checkpoint described by the foreign ``config``.
    ``keep`` lists ``(regex, reason)`` for foreign tensors the model does not compute but that are carried along
    (never dropped). ``aliases`` lists ``(canonical prefix, alternative prefix)`` pairs accepted when reading
    (e.g. GPT-2 files saved without ``transformer.``). ``hf_config(spec, base)`` is the reverse config
    conversion; it must raise :class:`~modkit.core.errors.CheckpointError` when the spec cannot be expressed.
    """

    keep: Sequence[tuple[str, str]]
    aliases: Sequence[tuple[str, str]]

    def links(self, spec: "ModelSpec", shapes: Mapping[str, tuple[int, ...]], config: Mapping[str, Any]) -> list[Link]:
        """Every :class:`Link` of a model built from ``spec`` (``shapes``: its ``state_dict`` shapes) for a
        checkpoint described by the foreign ``config`` (which may choose a fused layout)."""
        ...

    def hf_config(self, spec: "ModelSpec", base: Optional[Mapping[str, Any]] = None) -> dict:
        """The foreign config dict for ``spec``; ``base`` is the config the model was imported from, if any.

        Raises:
            CheckpointError: ``spec`` cannot be expressed in this format (name each field).
        """
        ...


def _check_coverage(links: Sequence[Link], shapes: Mapping[str, tuple[int, ...]], what: str) -> None:
    """Every modkit tensor is produced by exactly one link, and no link names a tensor the model lacks."""
    seen: dict[str, int] = {}
    for link in links:
        for name in link.ours:
            seen[name] = seen.get(name, 0) + 1
    uncovered = [n for n in shapes if n not in seen]
    unknown = [n for n in seen if n not in shapes and not n.endswith("lm_head.weight")]
    twice = [n for n, c in seen.items() if c > 1]
    problems = []
    if uncovered:
        problems.append(
            f"{len(uncovered)} model tensor(s) have no counterpart in {what}: {', '.join(uncovered)} "
            "(the spec holds components this checkpoint format cannot store)"
        )
    if unknown:
        problems.append(f"the mapper names tensor(s) the model does not have: {', '.join(unknown)}")
    if twice:
        problems.append(f"the mapper produces tensor(s) twice: {', '.join(twice)}")
    if problems:
        raise CheckpointError("; ".join(problems))


def expected_foreign_shapes(links: Sequence[Link], shapes: Mapping[str, tuple[int, ...]]) -> dict[str, tuple[tuple[int, ...], Link]]:
    """``{foreign name: (expected shape, link)}``, computed by running every ``to_hf`` on ``meta`` tensors.

    Raises:
        CheckpointError: two links produce the same foreign name, or a link returns the wrong number of tensors.
    """
    out: dict[str, tuple[tuple[int, ...], Link]] = {}
    for link in links:
        # a name the model lacks is the optional head of a tied model: it has the embedding's shape
        ours = [torch.empty(shapes[n] if n in shapes else _tied_shape(n, shapes), device="meta") for n in link.ours]
        theirs = link.backward(ours, {})
        if len(theirs) != len(link.hf):
            raise CheckpointError(f"weight mapper bug: link {link.hf} <- {link.ours} returned {len(theirs)} tensors")
        for name, t in zip(link.hf, theirs):
            if name in out:
                raise CheckpointError(f"weight mapper bug: foreign tensor {name!r} is produced by two links")
            out[name] = (tuple(t.shape), link)
    return out


def _tied_shape(name: str, shapes: Mapping[str, tuple[int, ...]]) -> tuple[int, ...]:
    emb = name[: -len("lm_head.weight")] + "embed.weight"
    return tuple(shapes.get(emb, (0,)))


def _resolve(name: str, source: TensorSource, aliases: Sequence[tuple[str, str]]) -> Optional[str]:
    if name in source:
        return name
    for canonical, alternative in aliases:
        if name.startswith(canonical):
            alt = alternative + name[len(canonical) :]
            if alt in source:
                return alt
    return None


def _fmt_names(names: Sequence[str], limit: int = 40) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f", ... ({len(names) - limit} more)" if len(names) > limit else "")


def gather(
    source: TensorSource,
    links: Sequence[Link],
    shapes: Mapping[str, tuple[int, ...]],
    *,
    keep: Sequence[tuple[str, str]] = (),
    aliases: Sequence[tuple[str, str]] = (),
    what: str = "the checkpoint",
) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """Read ``source`` through ``links`` into a modkit state dict, checking everything first.

    Returns:
        ``(state_dict, extras)``: modkit tensors by ``state_dict`` name (CPU, stored dtype), and the kept
            foreign tensors (``keep`` patterns) by their canonical name.

    Raises:
        CheckpointError: listing every missing foreign tensor (with the modkit tensor it would feed), every
            unexpected one (neither mapped nor kept), and every shape mismatch (tensor name, expected and stored
            shapes). Nothing is read when any problem is found.
    """
    _check_coverage(links, shapes, what)
    expected = expected_foreign_shapes(links, shapes)
    keep_res = [(re.compile(p), why) for p, why in keep]
    missing, mismatched, wrong_dtype, used = [], [], [], {}
    for link in links:
        resolved = [_resolve(n, source, aliases) for n in link.hf]
        if all(r is None for r in resolved) and link.optional:
            continue
        for name, real in zip(link.hf, resolved):
            if real is None:
                missing.append(f"{name} (for {', '.join(link.ours)})")
                continue
            used[name] = real
            want, got = expected[name][0], source.shape(real)
            if tuple(want) != tuple(got):
                mismatched.append(
                    f"{real}: the checkpoint stores shape {list(got)}, the model needs {list(want)} (for {', '.join(link.ours)})"
                )
            code = source.dtype_code(real)
            if code not in _LOADABLE_CODES:
                why = "a quantised 8-bit float format; dequantise the checkpoint first" if code.startswith("F8") else "not a floating-point type"
                wrong_dtype.append(f"{real}: stored as {code} ({why}); the model needs F16, BF16, F32 or F64 (for {', '.join(link.ours)})")
    extras: dict[str, str] = {}
    unexpected = []
    used_real = set(used.values())
    for real in source.names():
        canonical = _canonical(real, aliases, expected)
        if any(r.fullmatch(canonical) for r, _ in keep_res):
            extras[canonical] = real
        elif real not in used_real:
            unexpected.append(real)
    if missing or unexpected or mismatched or wrong_dtype:
        parts = [f"{what} ({source.origin}) does not match the model:"]
        if missing:
            parts.append(f"  missing {len(missing)} tensor(s): {_fmt_names(missing)}")
        if unexpected:
            parts.append(
                f"  unexpected {len(unexpected)} tensor(s) (not part of this model; refusing to drop them): {_fmt_names(unexpected)}"
            )
        if mismatched:
            parts.append(f"  {len(mismatched)} shape mismatch(es):")
            parts += [f"    {m}" for m in mismatched]
        if wrong_dtype:
            parts.append(f"  {len(wrong_dtype)} tensor(s) of a dtype the model cannot take:")
            parts += [f"    {m}" for m in wrong_dtype]
        raise CheckpointError("\n".join(parts))
    state: dict[str, Tensor] = {}
    for link in links:
        if link.hf[0] not in used and link.optional:
            continue
        outs = link.forward([source.get(used[n]) for n in link.hf])
        for name, t in zip(link.ours, outs):
            state[name] = t
    return state, {name: source.get(real) for name, real in extras.items()}


def _canonical(real: str, aliases: Sequence[tuple[str, str]], expected: Mapping[str, Any]) -> str:
    """The canonical name of a stored tensor: itself, or with an alternative prefix replaced by the canonical one."""
    if real in expected:
        return real
    for canonical, alternative in aliases:
        if alternative and real.startswith(alternative):
            return canonical + real[len(alternative) :]
        if not alternative and not real.startswith(canonical):
            return canonical + real
    return real


def export(model: "Model", links: Sequence[Link], *, what: str = "the target format") -> dict[str, Tensor]:
    """Map ``model``'s ``state_dict`` (and its kept ``checkpoint_extras``) through ``links`` to foreign names.

    Returns:
        ``{foreign name: CPU tensor}``: every tensor produced by a link, then every kept extra not produced by one.

    Raises:
        CheckpointError: a model tensor no link covers (the spec holds components the format cannot store).
    """
    state = model.state_dict()
    shapes = {k: tuple(v.shape) for k, v in state.items()}
    _check_coverage([lk for lk in links if not lk.optional or all(n in state for n in lk.ours)], shapes, what)
    extras = dict(getattr(model, "checkpoint_extras", None) or {})
    out: dict[str, Tensor] = {}
    for link in links:
        if not all(n in state for n in link.ours):
            continue  # an optional link for a tensor the model does not have (a tied head)
        theirs = link.backward([state[n].detach() for n in link.ours], extras)
        for name, t in zip(link.hf, theirs):
            out[name] = t
    for name, t in extras.items():
        out.setdefault(name, t)
    return out


# ------------------------------------------------------------------------------------------------ materialise


#: floating dtypes a checkpoint tensor may hold where the model has a floating-point tensor
LOADABLE_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _float_dtype_of(tensors: Iterable[Tensor]) -> torch.dtype:
    """The common floating dtype of ``tensors``, or the widest of them when they differ (upcasting is exact)."""
    found = {t.dtype for t in tensors if t.dtype in LOADABLE_FLOAT_DTYPES}
    if not found:
        return torch.float32
    if len(found) == 1:
        return found.pop()
    return torch.float64 if torch.float64 in found else torch.float32


def _dtype_problems(state: Mapping[str, Tensor], own: Mapping[str, Tensor]) -> list[str]:
    """Tensors whose stored dtype the model cannot take: an integer, bool or float8 tensor for a floating one."""
    problems = []
    for name, want in own.items():
        t = state.get(name)
        if t is None:
            continue
        got = str(t.dtype).replace("torch.", "")
        if want.is_floating_point() and t.dtype not in LOADABLE_FLOAT_DTYPES:
            why = ("a quantised 8-bit float format; dequantise the checkpoint first" if "float8" in got
                   else "not a floating-point type")
            problems.append(f"{name}: stored as {got} ({why}); the model needs float16, bfloat16, float32 or float64")
        elif not want.is_floating_point() and t.dtype != want.dtype:
            problems.append(f"{name}: stored as {got}; the model needs {str(want.dtype).replace('torch.', '')}")
    return problems


def nonfinite_counts(tensors: Mapping[str, Tensor], *, chunk: int = 2**24) -> dict[str, int]:
    """``{name: number of NaN or infinite values}`` for every floating tensor that holds any (in chunks of
    ``chunk`` elements, so the check needs little extra memory)."""
    out = {}
    for name, t in tensors.items():
        if not t.is_floating_point() or t.is_meta:
            continue
        flat = t.detach().reshape(-1)
        bad = 0
        for start in range(0, flat.numel(), chunk):
            part = flat[start : start + chunk]
            bad += int(part.numel() - torch.isfinite(part).sum())
        if bad:
            out[name] = bad
    return out


def report_nonfinite(tensors: Mapping[str, Tensor], origin: str, nonfinite: str) -> None:
    """Warn (:class:`~modkit.core.errors.NonFiniteWeightsWarning`) or, with ``nonfinite="error"``, raise
    :class:`CheckpointError` when ``tensors`` hold NaN or infinite values; the message counts them by tensor."""
    counts = nonfinite_counts(tensors)
    if not counts:
        return
    total = sum(counts.values())
    listed = ", ".join(f"{n} ({c:,} of {tensors[n].numel():,})" for n, c in list(counts.items())[:10])
    more = f" and {len(counts) - 10} more tensor(s)" if len(counts) > 10 else ""
    msg = f"{origin}: {total:,} NaN or infinite value(s) in {len(counts)} tensor(s): {listed}{more}"
    if nonfinite == "error":
        raise CheckpointError(msg + "; refusing to load them (nonfinite='error')")
    import warnings

    warnings.warn(msg + "; outputs computed from them will not be finite (pass nonfinite='error' to refuse such "
                  "checkpoints)", NonFiniteWeightsWarning, stacklevel=3)


def materialize(
    spec: "ModelSpec",
    state: Mapping[str, Tensor],
    *,
    device: Union[str, torch.device, None] = None,
    dtype: Union[str, torch.dtype, None] = None,
    registry: Optional["Registry"] = None,
    nonfinite: str = "warn",
    check_memory: bool = True,
    origin: str = "checkpoint",
) -> "Model":
    """Build ``spec`` on ``meta`` and fill it from ``state`` (a complete modkit state dict), without a random init.

    Parameters are assigned from ``state`` (cast to ``dtype``: default, the checkpoint's floating dtype, or the
    widest one when it mixes several); buffers (RoPE tables...) are recomputed by their modules'
    ``init_weights``. The model's own ``load_state_dict`` checks run (strict names; a head that differs from a
    tied embedding raises :class:`CheckpointError`).

    Non-finite values (NaN, +-inf) are counted tensor by tensor: a :class:`~modkit.core.errors.NonFiniteWeightsWarning`
    with ``nonfinite="warn"``, a :class:`CheckpointError` with ``nonfinite="error"``.

    Returns:
        the :class:`~modkit.nn.model.Model` in eval mode on ``device``.

    Raises:
        CheckpointError: missing or unexpected tensors, a shape mismatch (names the tensor and both shapes), a
            tensor of a dtype the model cannot take (an integer or float8 tensor where a float is expected), a
            tied head that differs from the embedding, non-finite values with ``nonfinite="error"``.
        MemoryLimitError: with ``check_memory``, the model would not fit in the memory free on ``device``.
    """
    from modkit.nn.build import _parse_dtype, build
    from modkit.nn.memory import check_fits, module_bytes

    if nonfinite not in ("warn", "error"):
        raise ValueError(f"nonfinite must be 'warn' or 'error', got {nonfinite!r}")
    target = torch.device(device) if device is not None else torch.device("cpu")
    tdtype = _float_dtype_of(state.values()) if dtype is None else _parse_dtype(dtype)
    model = build(spec, device="meta", dtype=tdtype, registry=registry)
    own = model.state_dict()
    bad_dtypes = _dtype_problems(state, own)
    if bad_dtypes:
        shown = bad_dtypes[:10] + ([f"... and {len(bad_dtypes) - 10} more"] if len(bad_dtypes) > 10 else [])
        raise CheckpointError(f"{origin}: {len(bad_dtypes)} tensor(s) of a dtype the model cannot take:\n  " + "\n  ".join(shown))
    if check_memory:
        check_fits(module_bytes(model), target, f"the weights and buffers of this model ({str(tdtype).replace('torch.', '')})",
                   hint="load it with a smaller dtype or on another device")
    missing = [n for n in own if n not in state]
    unexpected = [n for n in state if n not in own and not (n.endswith("lm_head.weight") and spec.tie_embeddings)]
    mismatched = [
        f"{n}: the checkpoint stores shape {list(state[n].shape)}, the model needs {list(own[n].shape)}"
        for n in own
        if n in state and tuple(state[n].shape) != tuple(own[n].shape)
    ]
    if missing or unexpected or mismatched:
        parts = ["checkpoint does not match the spec:"]
        if missing:
            parts.append(f"  missing {len(missing)} tensor(s): {_fmt_names(missing)}")
        if unexpected:
            parts.append(f"  unexpected {len(unexpected)} tensor(s) (refusing to drop them): {_fmt_names(unexpected)}")
        if mismatched:
            parts.append(f"  {len(mismatched)} shape mismatch(es):")
            parts += [f"    {m}" for m in mismatched]
        raise CheckpointError("\n".join(parts))
    # buffers first: materialise them and let their modules recompute them (parameters stay on meta)
    init = Init(0, spec.init_std)
    for name, module in model.named_modules():
        bufs = {k: b for k, b in module._buffers.items() if b is not None}
        if not bufs:
            continue
        for k, b in bufs.items():
            module._buffers[k] = torch.empty_like(b, device=target)
        fn = getattr(type(module), "init_weights", None)
        if fn is not None:
            module.init_weights(init)
    cast = {}
    for n, t in state.items():
        mine = own.get(n)  # a float32 buffer of a bfloat16 model (a router's correction bias) keeps its own dtype
        want = mine.dtype if mine is not None and mine.is_floating_point() else tdtype
        t = t.to(device=target, dtype=want if t.is_floating_point() else t.dtype)
        cast[n] = t if t.is_contiguous() else t.contiguous()
    report_nonfinite(cast, origin, nonfinite)
    model.load_state_dict(cast, strict=True, assign=True)
    left = [n for n, t in list(model.named_parameters()) + list(model.named_buffers()) if t.is_meta]
    if left:
        raise CheckpointError(
            f"after loading, {len(left)} tensor(s) are still uninitialised: {_fmt_names(left)}; a buffer's module must "
            "recompute it in init_weights(init)"
        )
    return model.eval()


# ------------------------------------------------------------------------------------------------ writing


def _prepare_folder(path: Path) -> None:
    if path.exists() and not path.is_dir():
        raise CheckpointError(f"{path} exists and is not a folder")
    path.mkdir(parents=True, exist_ok=True)


# ------------------------------------------------------------------------------------------------ modkit format


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
        raise CheckpointError(f"{source.origin}: the '{key}' metadata ({what}) must be a JSON object, got {_json_kind(value)}")
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
    from modkit.spec import load_spec

    if nonfinite not in ("warn", "error"):
        raise ValueError(f"nonfinite must be 'warn' or 'error', got {nonfinite!r}")
    path = checked_path(path)
    refuse_pickle(path)
    folder = path if path.is_dir() else path.parent
    pending = recover(folder)
    if path.is_dir() and not (path / WEIGHTS_FILE).exists() and WEIGHTS_FILE not in pending:
        if (path / HF_CONFIG_FILE).is_file():
            raise CheckpointError(f"{path} is a Hugging Face folder (config.json), not a modkit checkpoint; use modkit.from_hf")
        pickles = _pickles_in(path)
        if pickles:
            raise CheckpointError(pickle_message(pickles[0]))
        raise CheckpointError(f"{path}: no {WEIGHTS_FILE}; not a modkit checkpoint")
    weights_path = path / WEIGHTS_FILE if path.is_dir() else path
    source = TensorSource.from_path(pending.get(weights_path.name, weights_path) if weights_path.parent == folder else weights_path)
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
                f"{folder / SPEC_FILE} differs from the spec stored in {source.origin} (the one the weights were saved with); "
                "restore it, delete it, or build the edited spec and load the weights into it explicitly"
            )
    state, extras = {}, {}
    for name in source.names():
        if name.startswith(EXTRAS_PREFIX):
            extras[name[len(EXTRAS_PREFIX) :]] = source.get(name)
        else:
            state[name] = source.get(name)
    model = materialize(spec, state, device=device, dtype=dtype, registry=registry, nonfinite=nonfinite,
                        check_memory=check_memory, origin=str(source.origin))
    model.checkpoint_extras = extras
    model.hf_config = _metadata_json(source, HF_CONFIG_KEY, "the Hugging Face config the model came from")
    return model


__all__ = [
    "Link",
    "TensorSource",
    "WeightMapper",
    "export",
    "gather",
    "load",
    "materialize",
    "pickle_message",
    "refuse_pickle",
    "save",
]

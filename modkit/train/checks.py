"""Checks of a run folder's files before a resume uses them, and the strict reading of ``metrics.jsonl``.

A resume reads a checkpoint's ``trainer.json`` (counters, sampler, optimizer hyper-parameters) and
``trainer.safetensors`` (optimizer moments and step counts, RNG states). A damaged file must not become the state of
a run that then writes NaN weights as its ``last`` checkpoint, so each is checked against the run's model and
optimizer before the first step:

* ``trainer.json``: every field of its type and range (``step`` and ``tokens`` non-negative integers, ``step`` the
  one the folder's name says, ``best_val_loss`` a finite non-negative number or null, ...);
* the optimizer state: its param groups those of the run's optimizer (the same parameter indices, numbers where the
  optimizer has numbers, all finite); per parameter, every state tensor a floating-point tensor of the parameter's
  shape and dtype (scalars aside), finite, a second moment (``exp_avg_sq`` and its kin) never negative, a step count an
  integer between 0 and the run's step, and each parameter of a group holding the same state names as the others;
* the RNG states: ``rng.cpu`` present and the size of this torch's CPU generator state.

Each problem raises :class:`~modkit.core.errors.CheckpointError` naming the file, the field or tensor and the value.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any, Optional

import torch
from torch import nn

from modkit.core.errors import CheckpointError
from modkit.core.jsonio import JSONInputError, parse_json
from modkit.core.validation import json_value
from modkit.io.checkpoint.state import LOADABLE_FLOAT_DTYPES, nonfinite_counts

#: per-parameter optimizer state that is a running mean of squares or of absolute values: never negative
#: (torch's Adam/AdamW ``exp_avg_sq`` and ``max_exp_avg_sq``, RMSprop/Adadelta ``square_avg`` and ``acc_delta``,
#: Adamax ``exp_inf``, Adagrad ``sum``)
NONNEGATIVE_STATE = frozenset({"exp_avg_sq", "max_exp_avg_sq", "square_avg", "acc_delta", "exp_inf", "sum"})

_STATE_KEY = re.compile(r"state\.(\d+)\.([A-Za-z_][A-Za-z0-9_]*)")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def check_trainer_json(data: dict, path: Path, *, folder_step: Optional[int], with_optimizer: bool) -> None:
    """Check the fields of a checkpoint's ``trainer.json`` (``data``, read from ``path``).

    Args:
        folder_step: the step the checkpoint folder's name says (``step-0000004``: 4), or ``None``.
        with_optimizer: the file holds the optimizer's JSON part (one process; sharded runs keep it in ``dcp/``).

    Raises:
        CheckpointError: ``path: field = value is not ...``, for the first field of a wrong type or range.
    """

    def bad(field: str, what: str) -> CheckpointError:
        return CheckpointError(f"{path}: {field} = {json_value(data.get(field), 80)} is not {what}")

    for field in ("step", "tokens"):
        if not _is_int(data.get(field)) or data[field] < 0:
            raise bad(field, "a non-negative integer")
    if folder_step is not None and data["step"] != folder_step:
        raise CheckpointError(f"{path}: step = {data['step']} but the folder is step-{folder_step:07d}")
    best = data.get("best_val_loss")
    if best is not None and (not _is_number(best) or best < 0):
        raise bad("best_val_loss", "a finite non-negative number or null (a cross-entropy is never negative)")
    for field in ("skipped_steps", "consecutive_skips"):
        if field in data and (not _is_int(data[field]) or data[field] < 0):
            raise bad(field, "a non-negative integer")
    for field in ("world", "tp"):
        if field in data and (not _is_int(data[field]) or data[field] < 1):
            raise bad(field, "a positive integer")
    if not isinstance(data.get("sampler"), dict):
        raise bad("sampler", "an object (the sampler's position)")
    if data.get("scaler") is not None and not isinstance(data["scaler"], dict):
        raise bad("scaler", "an object or null")
    names = data.get("param_names")
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise bad("param_names", "a list of parameter names")
    if with_optimizer:
        opt = data.get("optimizer")
        if not isinstance(opt, dict) or not isinstance(opt.get("param_groups"), list):
            raise bad("optimizer", "an object with a list param_groups")
        if not isinstance(opt.get("scalars", {}), dict):
            raise CheckpointError(f"{path}: optimizer.scalars = {json_value(opt['scalars'], 80)} is not an object")


def check_rng(tensors: dict[str, torch.Tensor], path: Path) -> None:
    """Check the RNG states of ``trainer.safetensors`` (read from ``path``): byte tensors, ``rng.cpu`` present and the size of
    this torch's CPU generator state, ``rng.cuda.<i>`` the size of GPU ``i``'s where the same GPUs are present.

    Raises:
        CheckpointError: naming the tensor, its size and the size expected.
    """
    if "rng.cpu" not in tensors:
        raise CheckpointError(
            f"{path}: rng.cpu is missing (the CPU generator state every checkpoint saves); the file is damaged"
        )
    cuda = sorted(k for k in tensors if k.startswith("rng.cuda."))
    expected = {"rng.cpu": (torch.get_rng_state().numel(), "torch's CPU generator state")}
    if cuda and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
        for k in cuda:
            index = k.rsplit(".", 1)[1]
            if index.isdigit() and int(index) < torch.cuda.device_count():
                expected[k] = (torch.cuda.get_rng_state(int(index)).numel(), f"GPU {index}'s generator state")
    for key, t in tensors.items():
        if not key.startswith("rng."):
            continue
        if t.dtype != torch.uint8 or t.dim() != 1:
            raise CheckpointError(
                f"{path}: {key} is a {str(t.dtype).replace('torch.', '')} tensor of shape {list(t.shape)}; an RNG "
                "state is a 1-D uint8 tensor"
            )
        if key in expected and t.numel() != expected[key][0]:
            size, what = expected[key]
            raise CheckpointError(f"{path}: {key} holds {t.numel():,} bytes; {what} is {size:,} bytes")


def _check_groups(saved: list, live: list[dict], path: Path) -> None:
    """The saved param groups against the run's optimizer's (``optimizer.state_dict()["param_groups"]``).

    Raises:
        CheckpointError: another number of groups, other parameter indices, or a hyper-parameter of another type or
            not finite (named ``optimizer.param_groups[g].key``).
    """
    if len(saved) != len(live):
        raise CheckpointError(
            f"{path}: optimizer.param_groups holds {len(saved)} group(s); the run's optimizer has {len(live)}"
        )
    for g, (s, want) in enumerate(zip(saved, live)):
        field = f"optimizer.param_groups[{g}]"
        if not isinstance(s, dict):
            raise CheckpointError(f"{path}: {field} = {json_value(s, 60)} is not an object")
        if s.get("params") != want["params"]:
            raise CheckpointError(
                f"{path}: {field}.params = {json_value(s.get('params'), 60)}; the run's optimizer has "
                f"{json_value(want['params'], 60)} (was the spec or the optimizer changed?)"
            )
        for key, value in want.items():
            if key == "params" or key not in s or value is None:
                continue
            got = s[key]
            if isinstance(value, bool) or isinstance(value, str):
                ok = type(got) is type(value)
            elif isinstance(value, (int, float)):
                ok = _is_number(got)
            elif isinstance(value, (list, tuple)) and all(_is_number(v) for v in value):
                ok = isinstance(got, list) and len(got) == len(value) and all(_is_number(v) for v in got)
            else:
                continue
            if not ok:
                raise CheckpointError(
                    f"{path}: {field}.{key} = {json_value(got, 60)}; the run's optimizer has {json_value(value, 60)} "
                    "(a finite value of that type)"
                )


def _state_by_index(tensors: dict[str, torch.Tensor], scalars: dict, n_params: int, path: Path) -> dict:
    """``{parameter index: {state name: tensor or number}}`` of the optimizer state in ``tensors`` and the JSON
    ``scalars``.

    Raises:
        CheckpointError: a tensor name that is neither ``rng.*`` nor ``state.<index>.<name>``, or an index past the
            optimizer's parameters.
    """
    state: dict[int, dict[str, Any]] = {}
    for key, t in tensors.items():
        if key.startswith("rng."):
            continue
        m = _STATE_KEY.fullmatch(key)
        if m is None:
            raise CheckpointError(f"{path}: unexpected tensor {key!r} (expected state.<index>.<name> or rng.*)")
        state.setdefault(int(m[1]), {})[m[2]] = t
    for index, values in scalars.items():
        if not str(index).isdigit() or not isinstance(values, dict):
            raise CheckpointError(f"{path}: optimizer.scalars[{index!r}] = {json_value(values, 60)} is not valid")
        state.setdefault(int(index), {}).update(values)
    for index in state:
        if index >= n_params:
            raise CheckpointError(
                f"{path}: state.{index}.*: parameter index {index}, but the run's optimizer has {n_params} parameters"
            )
    return state


def check_optimizer_state(
    tensors: dict[str, torch.Tensor], data: dict, optimizer: Any, model: nn.Module, step: int, path: Path
) -> None:
    """Check a saved optimizer state (``trainer.safetensors`` tensors, ``trainer.json``'s ``optimizer`` part
    ``data``) against the run's ``optimizer`` over ``model`` at the run's ``step`` (see the module docstring).

    Raises:
        CheckpointError: naming ``path`` (the tensors' file), the tensor and the value; the JSON part's problems name
            ``trainer.json``'s field.
    """
    jpath = path.with_name("trainer.json")
    _check_groups(data["param_groups"], optimizer.state_dict()["param_groups"], jpath)
    params = [p for g in optimizer.param_groups for p in g["params"]]
    names = {id(p): n for n, p in model.named_parameters()}
    state = _state_by_index(tensors, data.get("scalars", {}), len(params), path)
    for group in optimizer.state_dict()["param_groups"]:
        held = {i: set(state[i]) for i in group["params"] if i in state}
        every = set().union(*held.values()) if held else set()
        for i, keys in held.items():
            if every - keys:
                raise CheckpointError(
                    f"{path}: state.{i}.{sorted(every - keys)[0]} is missing (the other parameters of its param "
                    f"group have {', '.join(sorted(every))})"
                )
    for i, entries in sorted(state.items()):
        p = params[i]
        for name, value in sorted(entries.items()):
            _check_state_value(f"state.{i}.{name}", name, value, p, f"{names.get(id(p), '?')} (index {i})", step, path)


def _check_state_value(key: str, name: str, value: Any, param: nn.Parameter, who: str, step: int, path: Path) -> None:
    """One per-parameter state value (see :func:`check_optimizer_state`); ``who`` names the parameter.

    Raises:
        CheckpointError: naming ``key`` and what is wrong with it.
    """
    if name == "step":
        t = torch.as_tensor(value)
        if t.numel() != 1:
            raise CheckpointError(f"{path}: {key} has shape {list(t.shape)}; a step count is one number")
        v = float(t.reshape(()))
        if not (math.isfinite(v) and v == int(v) and 0 <= v <= step):
            raise CheckpointError(f"{path}: {key} = {v:g} is not a step count between 0 and the run's step {step}")
        return
    if not isinstance(value, torch.Tensor):
        if not _is_number(value):
            raise CheckpointError(f"{path}: {key} = {json_value(value, 60)} is not a finite number")
        return
    dtype = str(value.dtype).replace("torch.", "")
    if value.dtype not in LOADABLE_FLOAT_DTYPES:
        raise CheckpointError(
            f"{path}: {key} is stored as {dtype}; optimizer state is floating point like its parameter {who}"
        )
    if value.dim() > 0 and value.dtype != param.dtype:
        raise CheckpointError(
            f"{path}: {key} is stored as {dtype}; its parameter {who} is "
            f"{str(param.dtype).replace('torch.', '')} (the optimizer keeps its moments in the parameter's dtype)"
        )
    if value.dim() > 0 and tuple(value.shape) != tuple(param.shape):
        raise CheckpointError(
            f"{path}: {key} has shape {list(value.shape)}; its parameter {who} has shape {list(param.shape)}"
        )
    bad = nonfinite_counts({key: value}).get(key)
    if bad:
        raise CheckpointError(f"{path}: {key} holds {bad:,} NaN or infinite value(s) of {value.numel():,}")
    if name in NONNEGATIVE_STATE:
        negative = int((value < 0).sum())
        if negative:
            raise CheckpointError(
                f"{path}: {key} holds {negative:,} negative value(s) (the lowest {float(value.min()):g}); a second "
                "moment is a mean of squares, never negative"
            )


# ------------------------------------------------------------------------------------------------ metrics.jsonl


def metrics_lines(path: Path, notes: Optional[list[str]] = None) -> list[tuple[str, dict]]:
    """The ``(line, record)`` pairs of a ``metrics.jsonl`` file, read strictly (:func:`modkit.core.jsonio.parse_json`
    per line: no duplicate keys), blank lines skipped. A last line without its newline that does not parse (a run
    killed while appending it) is dropped, with a note appended to ``notes``.

    Raises:
        CheckpointError: ``path line N: ...``: a line that is not JSON, not an object, or without an integer ``step``
            and a string ``kind``.
    """
    text = path.read_bytes().decode("utf-8", errors="replace")
    lines = text.split("\n")
    out = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = parse_json(line)
        except JSONInputError as exc:
            if number == len(lines):  # no newline after it: cut by a kill while it was written
                if notes is not None:
                    notes.append(f"{path} line {number}: incomplete (a run killed while writing it); dropped")
                continue
            raise CheckpointError(f"{path} line {number}: {exc}; fix or remove the line") from None
        if not isinstance(record, dict):
            raise CheckpointError(f"{path} line {number}: {json_value(record, 60)} is not a JSON object")
        if not _is_int(record.get("step")) or not isinstance(record.get("kind"), str):
            field = "step" if not _is_int(record.get("step")) else "kind"
            what = "integer 'step'" if field == "step" else "string 'kind'"
            raise CheckpointError(
                f"{path} line {number}: no {what} in {json_value(record, 80)}; each line is an object with an "
                "integer step and a string kind: fix or remove the line"
            )
        out.append((line, record))
    return out

"""Run folders and resumable checkpoints: atomic folders of ordinary modkit checkpoints plus the trainer's state.

A run folder::

    RUN/
      config.json        the resolved training config
      spec.json          the resolved model spec
      tokenizer.json     the run's tokenizer (also copied into every checkpoint)
      data.json          the data folder used and its meta.json
      components.json    {kind/type: {provider, distribution, version}}: the plugin and version of each component
                         the spec uses (modkit.train.provenance); spec.json's metadata repeats it as "plugin:..." keys
      metrics.jsonl      one JSON object per log / eval line
      loss.png           loss curves (written at the end of the run; at each evaluation with live_plot)
      sample.txt         text sampled from the best checkpoint at the end
      checkpoints/step-0000250/   a resumable checkpoint (see below), keep_checkpoints of them
      checkpoints/best-0000250/   the best checkpoint by validation loss (model only)
      last -> checkpoints/step-...   symbolic links, swapped atomically
      best -> checkpoints/best-...

A checkpoint folder is an ordinary :func:`modkit.save` checkpoint (``spec.json``, with the same ``plugin:...``
metadata, + ``model.safetensors``: it loads with :func:`modkit.load`, ``modkit generate`` and ``modkit convert
modkit ... --to hf``) plus
``tokenizer.json`` and, for resumable ones, ``trainer.json`` (step, tokens, sampler position, best loss,
optimizer hyper-parameters, gradient-scaler state, parameter names, steps skipped as non-finite) and
``trainer.safetensors`` (AdamW moments and step counts by parameter index, torch RNG states). Under several
processes the model and optimizer are saved sharded with ``torch.distributed.checkpoint`` in ``dcp/`` instead, and
one RNG file per rank. A resume checks every one of these files before it uses them (:mod:`modkit.train.checks`).

Each checkpoint is written under a temporary name and renamed into place when complete, and the links are
swapped with ``os.replace``: a run killed at any instant leaves the previous checkpoint whole. No file is
pickled: safetensors and JSON only (DCP's own metadata aside).
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any, Optional

import torch
from safetensors.torch import load_file, save_file

from modkit.core.errors import CheckpointError
from modkit.core.jsonio import JSONInputError, read_json_file

TRAINER_JSON = "trainer.json"
TRAINER_TENSORS = "trainer.safetensors"
TOKENIZER_FILE = "tokenizer.json"
STATE_VERSION = 1


def fsync_tree(path: Path) -> None:
    """fsync every file under ``path`` and the folder itself (so a rename publishes complete contents)."""
    for p in sorted(path.rglob("*")):
        if p.is_file():
            with open(p, "rb") as f:
                os.fsync(f.fileno())
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def publish(tmp: Path, final: Path) -> None:
    """Rename the complete folder ``tmp`` to ``final`` (replacing an older ``final`` folder of that name)."""
    fsync_tree(tmp)
    if final.exists():
        old = final.with_name(final.name + ".old")
        shutil.rmtree(old, ignore_errors=True)
        os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, final)


def point(link: Path, target: Path) -> None:
    """Make ``link`` a relative symbolic link to ``target``, atomically (``os.replace`` of a fresh link)."""
    tmp = link.with_name(f".{link.name}.tmp-{os.getpid()}")
    tmp.unlink(missing_ok=True)
    os.symlink(os.path.relpath(target, link.parent), tmp)
    os.replace(tmp, link)


def clean_temporaries(folder: Path) -> None:
    """Remove what interrupted saves left in ``folder`` (``.*.tmp-*`` folders and links, ``*.old`` folders)."""
    if not folder.is_dir():
        return
    for p in folder.iterdir():
        if (p.name.startswith(".") and ".tmp-" in p.name) or p.name.endswith(".old"):
            if p.is_symlink() or p.is_file():
                p.unlink(missing_ok=True)
            else:
                shutil.rmtree(p, ignore_errors=True)


# ------------------------------------------------------------------------------------------------ optimizer


def optimizer_to_files(optimizer: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Split ``optimizer.state_dict()`` into tensors (``state.<index>.<name>``) and JSON (hyper-parameters).

    Non-tensor per-parameter state is kept in the JSON part; the parameter indices are those of the param
    groups, in order.
    """
    sd = optimizer.state_dict()
    tensors: dict[str, torch.Tensor] = {}
    scalars: dict[str, dict[str, Any]] = {}
    for index, state in sd["state"].items():
        for name, value in state.items():
            if isinstance(value, torch.Tensor):
                tensors[f"state.{index}.{name}"] = value.detach().cpu().contiguous()
            else:
                scalars.setdefault(str(index), {})[name] = value
    return tensors, {"param_groups": sd["param_groups"], "scalars": scalars}


def optimizer_from_files(tensors: dict[str, torch.Tensor], data: dict[str, Any]) -> dict[str, Any]:
    """The inverse of :func:`optimizer_to_files`: a dict for ``optimizer.load_state_dict``."""
    state: dict[int, dict[str, Any]] = {}
    for key, value in tensors.items():
        if not key.startswith("state."):
            continue
        _, index, name = key.split(".", 2)
        state.setdefault(int(index), {})[name] = value
    for index, values in data.get("scalars", {}).items():
        state.setdefault(int(index), {}).update(values)
    return {"state": state, "param_groups": data["param_groups"]}


def rng_tensors() -> dict[str, torch.Tensor]:
    """This process's torch RNG states: ``rng.cpu`` and ``rng.cuda.<i>`` per visible GPU."""
    out = {"rng.cpu": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        for i, s in enumerate(torch.cuda.get_rng_state_all()):
            out[f"rng.cuda.{i}"] = s
    return out


def restore_rng(tensors: dict[str, torch.Tensor]) -> None:
    """Restore what :func:`rng_tensors` saved (GPU states only where the same GPUs are present)."""
    if "rng.cpu" in tensors:
        torch.set_rng_state(tensors["rng.cpu"])
    cuda = sorted((k for k in tensors if k.startswith("rng.cuda.")), key=lambda k: int(k.rsplit(".", 1)[1]))
    if cuda and torch.cuda.is_available():
        states = [tensors[k] for k in cuda]
        if len(states) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(states)


def write_trainer_files(
    folder: Path, optimizer: torch.optim.Optimizer, trainer: dict[str, Any], *, with_optimizer: bool = True
) -> None:
    """Write ``trainer.json`` and ``trainer.safetensors`` (optimizer moments unless saved elsewhere, RNG)."""
    tensors = rng_tensors()
    data = dict(trainer, version=STATE_VERSION)
    if with_optimizer:
        opt_tensors, opt_data = optimizer_to_files(optimizer)
        tensors.update(opt_tensors)
        data["optimizer"] = opt_data
    save_file(tensors, str(folder / TRAINER_TENSORS), metadata={"format": "pt"})
    (folder / TRAINER_JSON).write_text(json.dumps(data, indent=1) + "\n")


def read_trainer_files(folder: Path) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """``(trainer.json dict, trainer.safetensors tensors)`` of a resumable checkpoint.

    Raises:
        CheckpointError: the folder is not a resumable checkpoint, or its files do not parse (names the file).
    """
    jpath, tpath = folder / TRAINER_JSON, folder / TRAINER_TENSORS
    if not jpath.is_file() or not tpath.is_file():
        raise CheckpointError(
            f"{folder} is not a resumable checkpoint (no {TRAINER_JSON} / {TRAINER_TENSORS}); the best checkpoint holds "
            "the model only: resume from the run folder or its 'last' checkpoint"
        )
    try:  # strictly (modkit.core.jsonio): a regular file of bounded size, UTF-8, no duplicate keys
        data = read_json_file(jpath)
    except JSONInputError as exc:
        raise CheckpointError(f"unreadable trainer state: {exc}") from None
    if not isinstance(data, dict) or data.get("version") != STATE_VERSION:
        raise CheckpointError(f"{jpath}: not a version-{STATE_VERSION} trainer state")
    try:
        tensors = load_file(str(tpath))
    except Exception as exc:  # safetensors raises its own error types
        raise CheckpointError(f"{tpath}: unreadable ({type(exc).__name__}: {exc})") from None
    return data, tensors


#: the name of a resumable checkpoint folder: ``step-`` and the step, seven digits or more
STEP_FOLDER = re.compile(r"step-(\d{7,})")


def _complete(folder: Path) -> bool:
    """A step checkpoint the trainer finished: ``trainer.json`` with the sharded state (``dcp/``) or the weights
    and the optimizer state (``model.safetensors``, ``trainer.safetensors``)."""
    if not (folder / TRAINER_JSON).is_file():
        return False
    return (folder / "dcp").is_dir() or all((folder / n).is_file() for n in ("model.safetensors", TRAINER_TENSORS))


def step_checkpoints(run: Path) -> list[Path]:
    """The complete resumable checkpoints of a run (``checkpoints/step-NNNNNNN`` folders with their trainer state
    and weights), oldest first; other entries are not checkpoints (:func:`ignored_step_entries`)."""
    folder = run / "checkpoints"
    if not folder.is_dir():
        return []
    found = [p for p in folder.iterdir() if p.is_dir() and STEP_FOLDER.fullmatch(p.name) and _complete(p)]
    return sorted(found, key=lambda p: int(p.name.split("-", 1)[1]))


def ignored_step_entries(run: Path) -> list[tuple[Path, str]]:
    """``(path, why)`` for each entry of ``checkpoints/`` named ``step-*`` that a resume does not read: another
    name (``step-abc``), a file, or a folder without the files of a complete checkpoint (never pruned either:
    they may not be the trainer's). An empty folder is left out (nothing in it to lose)."""
    folder = run / "checkpoints"
    if not folder.is_dir():
        return []
    out = []
    for p in sorted(folder.iterdir()):
        if not p.name.startswith("step-"):
            continue
        if not STEP_FOLDER.fullmatch(p.name):
            out.append((p, "not a checkpoint name (step-NNNNNNN)"))
        elif not p.is_dir():
            out.append((p, "a file, not a checkpoint folder"))
        elif any(p.iterdir()) and not _complete(p):
            missing = [n for n in (TRAINER_JSON, "model.safetensors", TRAINER_TENSORS) if not (p / n).is_file()]
            out.append((p, f"an incomplete checkpoint (no {', '.join(missing)})"))
    return out


def folder_step(folder: Path) -> Optional[int]:
    """The step a checkpoint folder's name says (``step-0000004``: 4), ``None`` for another name."""
    m = STEP_FOLDER.fullmatch(folder.name)
    return int(m[1]) if m else None


def prune(run: Path, keep: int, protect: Optional[Path] = None) -> None:
    """Delete all but the newest ``keep`` step checkpoints (by step; never ``protect`` nor the one ``last`` leads
    to, which a run resumed from an older checkpoint may have written below a newer one) and the best folders
    ``best`` leaves. Called only after the new checkpoint is in place."""
    kept = {p.resolve() for p in (protect, run / "last") if p is not None and (p.is_symlink() or p.exists())}
    for old in step_checkpoints(run)[:-keep]:
        if old.resolve() not in kept:
            shutil.rmtree(old, ignore_errors=True)
    best = (run / "best").resolve() if (run / "best").is_symlink() else None
    for p in (run / "checkpoints").glob("best-*"):
        if best is not None and p.resolve() != best:
            shutil.rmtree(p, ignore_errors=True)

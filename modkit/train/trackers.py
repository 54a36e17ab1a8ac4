"""Experiment trackers as registered components: the ``tracker`` kind, what a tracker gets, several as one.

A training config lists its trackers like a spec names components (``"trackers": ["tensorboard", {"type":
"mlflow", "tracking_uri": "http://127.0.0.1:5000"}]``), each validated strictly against the registry; the flag
``--tracker TYPE[:VALUE]`` (repeatable) gives the same list (``--tracker tensorboard --tracker mlflow:URI``). The
built-ins (``jsonl``, ``tensorboard``, ``wandb``, ``mlflow``) live in ``modkit_plugins.trackers`` and a plugin adds
one the same way::

    register(modkit.Component(kind="tracker", type="my-tracker", config=MyTrackerConfig,
                              factory=lambda cfg, setup: MyTracker(cfg, setup),
                              description="...", capabilities={"flag_value": "url"}))

``factory(config, setup: TrackerSetup) -> Tracker`` starts the tracker (imports its package, reaches its server):
it runs before the first training step (before the run folder is written), so a tracker that cannot start is a
:class:`TrackerError` before training, never a crash mid-run. A :class:`Tracker` then gets the config and spec
(:meth:`Tracker.log_config`), every metrics line (:meth:`Tracker.log_metrics`: the very records of
``metrics.jsonl``), the final checkpoint paths (:meth:`Tracker.log_checkpoints`) and :meth:`Tracker.finish`. A
tracker that raises after it started is dropped with one warning line and the run goes on.

Trackers run on rank 0 only under torchrun. ``modkit compare`` opens each tracker once more for the comparison
itself (``setup.role == "group"``) before the runs, which carry its name in ``setup.group`` (a W&B group, an MLflow
parent run, TensorBoard subfolders of one log folder); the group gets the verdicts through :meth:`Tracker.log_summary`.

``metrics.jsonl`` in the run folder is always written: resume, ``compare`` and the plots read it, so it is the run's
own record rather than an optional tracker; the ``jsonl`` tracker copies the same lines to another file.

Capabilities of a tracker entry: ``flag_value`` (the config field the ``VALUE`` of ``--tracker TYPE:VALUE``
sets) and ``extra`` (the ``pip install modkit-lm[EXTRA]`` that installs what it needs).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Literal, Mapping, Optional, Sequence

from modkit.core.errors import ModkitError, SpecError

#: the registry kind of trackers
KIND = "tracker"


class TrackerError(ModkitError, ValueError):
    """A tracker that cannot start (its package is not installed, its server is unreachable) or is misconfigured."""


def missing_package(tracker: str, package: str, extra: str) -> TrackerError:
    """The error of a tracker whose package is not installed: names the extra that installs it."""
    return TrackerError(
        f"tracker {tracker!r} needs the {package!r} package, which is not installed; install it with "
        f"pip install 'modkit-lm[{extra}]' (or drop {tracker!r} from the trackers)"
    )


@dataclass
class TrackerSetup:
    """What a tracker factory gets (``factory(config, setup) -> Tracker``).

    Attributes:
        run_dir: the run folder (a comparison's report folder when ``role`` is ``"group"``); trackers that write
            files (TensorBoard event files, W&B offline runs, an MLflow ``file:`` store) write under it by default.
        name: the run's name (its folder name), or the comparison's.
        role: ``"run"`` (one training run) or ``"group"`` (a comparison of runs: ``modkit compare``).
        group: the name of the comparison the run belongs to, ``None`` for a run of its own.
        config: the training config (JSON values).
        spec: the model spec (JSON values); ``None`` for a group.
        start_step: the step the run starts from (0, or the resumed checkpoint's step).
    """

    run_dir: Path
    name: str
    role: Literal["run", "group"] = "run"
    group: Optional[str] = None
    config: dict[str, Any] = field(default_factory=dict)
    spec: Optional[dict[str, Any]] = None
    start_step: int = 0


class Tracker:
    """The calls a tracker gets; every method does nothing here, so a tracker overrides only what it logs.

    Units: losses in nats, learning rates as the optimizer sees them, throughput in tokens per second, memory in
    bytes; ``step`` is the optimizer step (0 before the first).
    """

    def log_config(self, config: Mapping[str, Any], spec: Optional[Mapping[str, Any]]) -> None:
        """The training config and the model spec (``None`` for a group), once, before training."""

    def log_metrics(self, record: Mapping[str, Any]) -> None:
        """One ``metrics.jsonl`` record: ``kind`` (``train``, ``eval`` or ``final``), ``step`` and its figures
        (:func:`scalars` gives them as ``{"train/loss": ...}``)."""

    def log_checkpoints(self, paths: Mapping[str, str]) -> None:
        """The final checkpoints: ``{"last": folder, "best": folder}`` (absolute paths), once, at the end."""

    def log_summary(self, summary: Mapping[str, Any]) -> None:
        """A group's results (``modkit compare``): ``{"verdicts": [...], "runs": [{name, spec, lr, seed,
        val_loss, ...}], "report": path}``, once, at the end."""

    def finish(self, ok: bool) -> None:
        """Close the run (``ok`` false when training stopped with an error)."""


def scalars(record: Mapping[str, Any]) -> dict[str, float]:
    """The numeric figures of a metrics record as ``{"KIND/NAME": value}`` (``"train/loss"``, ``"eval/val_loss"``,
    ``"final/val_bits_per_byte"``): every int or float but ``step`` (booleans and ``None`` left out), unchanged."""
    kind = record.get("kind", "metrics")
    out = {}
    for key, value in record.items():
        if key in ("kind", "step") or isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        out[f"{kind}/{key}"] = float(value)
    return out


def flat_params(data: Any, prefix: str = "") -> dict[str, str]:
    """A nested config as ``{"optimizer.type": "adamw", "lr": "0.001"}`` (JSON text of each leaf), for trackers
    whose parameters are flat strings (MLflow)."""
    import json

    if isinstance(data, Mapping):
        out: dict[str, str] = {}
        for key, value in data.items():
            out.update(flat_params(value, f"{prefix}{key}."))
        return out
    if isinstance(data, list) and data and all(isinstance(v, Mapping) for v in data):
        out = {}
        for i, value in enumerate(data):
            out.update(flat_params(value, f"{prefix}{i}."))
        return out
    return {prefix.rstrip("."): data if isinstance(data, str) else json.dumps(data)}


def load_tracker_configs(items: Any, registry=None) -> list:
    """Validate a ``trackers`` list (names or ``{"type": ...}`` objects) against the registry.

    Raises:
        SpecError: not a list, an unknown type (with close matches), invalid fields (paths ``[i].field``), or a
            type listed twice.
    """
    from ..spec import load_component

    if not isinstance(items, list):
        raise SpecError([("", f"trackers is a list of tracker types or objects, got {type(items).__name__}")])
    out, errors, seen = [], [], set()
    for i, item in enumerate(items):
        data = {"type": item} if isinstance(item, str) else item
        try:
            cfg = load_component(KIND, data, registry=registry)
        except SpecError as exc:
            errors += [(f"[{i}]" + (f".{p}" if p else ""), m) for p, m in exc.errors]
            continue
        if cfg.type in seen:
            errors.append((f"[{i}]", f"tracker {cfg.type!r} is listed twice; list each tracker once"))
        seen.add(cfg.type)
        out.append(cfg)
    if errors:
        raise SpecError(errors)
    return out


def parse_tracker_flag(text: str, registry=None) -> dict[str, Any]:
    """``--tracker TYPE[:VALUE]`` as a tracker config dict; ``VALUE`` sets the field the entry's ``flag_value``
    capability names (``mlflow:http://127.0.0.1:5000`` sets ``tracking_uri``).

    Raises:
        TrackerError: an unknown type (valid types and the closest match), or a ``VALUE`` for a tracker that takes
            none.
    """
    from modkit.core.errors import RegistryError
    from modkit.core.registry import get_registry

    reg = registry or get_registry()
    name, sep, value = text.partition(":")
    try:
        entry = reg.get(KIND, name)
    except RegistryError as exc:
        raise TrackerError(f"--tracker {text!r}: {exc}") from None
    if not sep:
        return {"type": entry.type}
    field_name = entry.capabilities.get("flag_value")
    if not field_name:
        raise TrackerError(f"--tracker {text!r}: tracker {entry.type!r} takes no value; write --tracker {entry.type}")
    return {"type": entry.type, field_name: value}


class Trackers:
    """Several trackers as one: each call goes to every tracker still running; one that raises is dropped with a
    warning line (through ``echo``) and the others go on. Empty (and free) when no tracker is configured."""

    def __init__(self, trackers: Sequence[tuple[str, Tracker]] = (), echo: Callable[[str], None] = print):
        self.trackers = list(trackers)
        self.echo = echo

    def __bool__(self) -> bool:
        return bool(self.trackers)

    def _each(self, method: str, *args: Any) -> None:
        for name, tracker in list(self.trackers):
            try:
                getattr(tracker, method)(*args)
            except Exception as exc:  # noqa: BLE001 - a tracker never stops a run once it has started
                self.trackers.remove((name, tracker))
                self.echo(
                    f"warning: tracker {name!r} failed in {method} ({type(exc).__name__}: {exc}); it logs nothing "
                    "more, the run goes on"
                )
                try:
                    tracker.finish(False)
                except Exception:  # noqa: BLE001 - already reported
                    pass

    def log_config(self, config: Mapping[str, Any], spec: Optional[Mapping[str, Any]]) -> None:
        """:meth:`Tracker.log_config` on every tracker."""
        self._each("log_config", config, spec)

    def log_metrics(self, record: Mapping[str, Any]) -> None:
        """:meth:`Tracker.log_metrics` on every tracker (non-finite values kept: the run's record holds them)."""
        if self.trackers:
            self._each("log_metrics", record)

    def log_checkpoints(self, paths: Mapping[str, str]) -> None:
        """:meth:`Tracker.log_checkpoints` on every tracker."""
        self._each("log_checkpoints", paths)

    def log_summary(self, summary: Mapping[str, Any]) -> None:
        """:meth:`Tracker.log_summary` on every tracker."""
        self._each("log_summary", summary)

    def finish(self, ok: bool) -> None:
        """:meth:`Tracker.finish` on every tracker, then none is left."""
        self._each("finish", ok)
        self.trackers = []


def open_trackers(
    configs: Sequence[Any], setup: TrackerSetup, *, echo: Callable[[str], None] = print, registry=None
) -> Trackers:
    """Start the trackers a training config lists (``configs``: dicts or validated configs), in order, and give
    each ``setup.config`` and ``setup.spec`` (:meth:`Tracker.log_config`).

    Returns:
        :class:`Trackers` (empty when ``configs`` is).

    Raises:
        TrackerError: one cannot start: its message (a built-in names the extra to install, the unreachable URL),
            or for a plugin's tracker the exception it raised, named with the tracker and its provider; the trackers
            started before it are closed first. SpecError: an invalid tracker config.
    """
    from modkit.core.registry import get_registry

    reg = registry or get_registry()
    started: list[tuple[str, Tracker]] = []
    try:
        for cfg in load_tracker_configs([c if isinstance(c, (dict, str)) else c.model_dump() for c in configs], reg):
            entry = reg.get(KIND, cfg.type)
            try:
                tracker = entry.factory(cfg, setup)
            except TrackerError:
                raise
            except ImportError as exc:
                extra = entry.capabilities.get("extra")
                hint = f"pip install 'modkit-lm[{extra}]'" if extra else "install the package it needs"
                raise TrackerError(f"tracker {cfg.type!r} ({entry.provider}) cannot start: {exc}; {hint}") from None
            except Exception as exc:  # noqa: BLE001 - a plugin's own error, reported before training
                raise TrackerError(
                    f"tracker {cfg.type!r} ({entry.provider}) cannot start: {type(exc).__name__}: {exc}"
                ) from None
            if not isinstance(tracker, Tracker):
                raise TrackerError(
                    f"factory of tracker/{cfg.type} ({entry.provider}) returned {type(tracker).__name__}, not a "
                    "modkit.train.trackers.Tracker"
                )
            started.append((cfg.type, tracker))
            try:  # the first call reaches the tracker's store: a failure here is still one before training
                tracker.log_config(setup.config, setup.spec)
            except Exception as exc:  # noqa: BLE001
                raise TrackerError(
                    f"tracker {cfg.type!r} ({entry.provider}) cannot log the config: {type(exc).__name__}: {exc}"
                ) from None
    except BaseException:
        Trackers(started, echo=lambda line: None).finish(False)
        raise
    return Trackers(started, echo=echo)


def finite_or_none(value: Any) -> Any:
    """``value``, or ``None`` when it is a non-finite float (for trackers whose summaries refuse NaN)."""
    return None if isinstance(value, float) and not math.isfinite(value) else value

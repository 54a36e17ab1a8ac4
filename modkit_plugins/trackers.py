"""Built-in experiment trackers: ``jsonl``, ``tensorboard``, ``wandb`` and ``mlflow``.

Each is a ``tracker`` component (:mod:`modkit.train.trackers`): ``factory(config, setup) -> Tracker``, started
before training (a missing package or an unreachable server is an error then, naming the extra to install). Every
tracker logs the same figures under the same names (:func:`modkit.train.trackers.scalars`: ``train/loss``,
``train/lr``, ``train/grad_norm``, ``train/tokens_per_s``, ``eval/val_loss``, ``final/val_loss``, ...), the config,
the spec and the final checkpoint paths.

* ``jsonl``: the run's ``metrics.jsonl`` is always written; with ``path`` the same records, preceded by a
  ``config`` line and followed by a ``checkpoints`` line, are appended to that file too.
* ``tensorboard``: event files under ``RUN/tensorboard`` (``torch.utils.tensorboard.SummaryWriter``), scalars in
  float64 so they equal the run's record; a comparison's runs are subfolders of its report folder.
* ``wandb``: Weights & Biases, ``online`` or ``offline`` into ``RUN/wandb`` (``wandb sync`` uploads it later); a
  comparison's runs share a W&B group.
* ``mlflow``: an MLflow tracking URI (a server ``http://...``, ``file:`` folder or ``sqlite:`` database; default
  MLflow's own: ``MLFLOW_TRACKING_URI``, else ``sqlite:///mlflow.db`` in the working directory); a comparison is a
  parent run and its runs are nested runs.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Literal, Mapping, Optional

from pydantic import Field

from modkit.plugin import (
    Component,
    ComponentConfig,
    Tracker,
    TrackerError,
    TrackerSetup,
    flat_params,
    hookimpl,
    missing_package,
    scalars,
)


class JsonlConfig(ComponentConfig):
    """Config of ``jsonl``: where the extra copy of the records goes (the run's metrics.jsonl is always written)."""

    type: Literal["jsonl"] = "jsonl"
    path: Optional[str] = Field(
        None,
        description="a second JSON Lines file receiving the same records (appended), with a config line first and a "
        "checkpoints line last; null: only the run's metrics.jsonl (always written)",
    )


class TensorBoardConfig(ComponentConfig):
    """Config of ``tensorboard``: the event-file folder."""

    type: Literal["tensorboard"] = "tensorboard"
    log_dir: Optional[str] = Field(None, description="folder of the event files; null: RUN/tensorboard")


class WandbConfig(ComponentConfig):
    """Config of ``wandb``: project, entity and mode."""

    type: Literal["wandb"] = "wandb"
    project: str = Field("modkit", min_length=1, description="the W&B project")
    entity: Optional[str] = Field(None, description="the W&B entity (user or team); null: the login's default")
    mode: Literal["online", "offline"] = Field(
        "online",
        description="'online': stream to W&B (needs wandb login); 'offline': files in RUN/wandb, uploaded "
        "later by 'wandb sync'",
    )


class MLflowConfig(ComponentConfig):
    """Config of ``mlflow``: the tracking URI and experiment."""

    type: Literal["mlflow"] = "mlflow"
    tracking_uri: Optional[str] = Field(
        None,
        description="an MLflow tracking URI: http(s)://HOST:PORT of a tracking server, file:FOLDER or sqlite:///FILE; "
        "null: MLflow's own default (MLFLOW_TRACKING_URI, else sqlite:///mlflow.db in the working directory)",
    )
    experiment: str = Field("modkit", min_length=1, description="the MLflow experiment (created when missing)")


def _json_block(data: Any) -> str:
    """``data`` as indented JSON in a Markdown code block (4-space indent: TensorBoard's text plugin)."""
    return "\n".join("    " + line for line in json.dumps(data, indent=1, default=str).splitlines())


# ----------------------------------------------------------------------------------------------------- jsonl


class JsonlTracker(Tracker):
    """Appends every call as one JSON line to ``path`` (the run's own metrics.jsonl is written by the trainer)."""

    def __init__(self, cfg: JsonlConfig, setup: TrackerSetup):
        self.path = Path(cfg.path) if cfg.path else None
        self.setup = setup
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.path, "a"):
                pass  # a folder or an unwritable path is refused now, before training

    def _write(self, record: Mapping[str, Any]) -> None:
        if self.path is not None:
            with open(self.path, "a") as f:
                f.write(json.dumps(dict(record)) + "\n")

    def log_config(self, config, spec) -> None:
        """A ``config`` line: run name, group, config and spec."""
        s = self.setup
        self._write(
            {"kind": "config", "step": s.start_step, "run": s.name, "group": s.group, "config": config, "spec": spec}
        )

    def log_metrics(self, record) -> None:
        """The record as it stands."""
        self._write(record)

    def log_checkpoints(self, paths) -> None:
        """A ``checkpoints`` line."""
        self._write({"kind": "checkpoints", **paths})

    def log_summary(self, summary) -> None:
        """A ``summary`` line."""
        self._write({"kind": "summary", **summary})


# ----------------------------------------------------------------------------------------------------- TensorBoard


class TensorBoardTracker(Tracker):
    """Scalars (float64, new-style summaries), the config, spec, checkpoints and verdicts as text."""

    def __init__(self, cfg: TensorBoardConfig, setup: TrackerSetup):
        try:
            import tensorboard  # noqa: F401 - torch's writer needs it
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise missing_package("tensorboard", "tensorboard", "tensorboard") from None
        folder = Path(cfg.log_dir) if cfg.log_dir else setup.run_dir / "tensorboard"
        self.writer = SummaryWriter(str(folder), purge_step=setup.start_step or None)
        self.step = setup.start_step

    def log_config(self, config, spec) -> None:
        """The config and spec as text."""
        self.writer.add_text("config", _json_block(config), self.step)
        if spec is not None:
            self.writer.add_text("spec", _json_block(spec), self.step)

    def log_metrics(self, record) -> None:
        """Each figure as a float64 scalar at the record's step."""
        self.step = int(record["step"])
        for key, value in scalars(record).items():
            self.writer.add_scalar(key, value, self.step, new_style=True, double_precision=True)
        self.writer.flush()

    def log_checkpoints(self, paths) -> None:
        """Each checkpoint path as text."""
        for name, path in paths.items():
            self.writer.add_text(f"checkpoints/{name}", path, self.step)

    def log_summary(self, summary) -> None:
        """The verdicts as text, each run's validation loss as a scalar at its index."""
        self.writer.add_text("verdicts", "\n".join(f"- {v}" for v in summary.get("verdicts", [])) or "(none)", 0)
        for i, run in enumerate(summary.get("runs", [])):
            self.writer.add_scalar("compare/val_loss", run["val_loss"], i, new_style=True, double_precision=True)
            self.writer.add_text("compare/runs", f"{i}: {run['name']}", i)

    def finish(self, ok: bool) -> None:
        """Flush and close the event file."""
        self.writer.close()


# ----------------------------------------------------------------------------------------------------- W&B


class WandbTracker(Tracker):
    """One W&B run (``reinit="create_new"``: a comparison's group run and its runs may be open together).

    ``Run.finish`` returns before W&B's service has written the run's file: its stream is closed asynchronously,
    so a ``run-ID.wandb`` read right after ``finish`` (by ``wandb sync`` or by a script in the same process) can
    still be the 7-byte header alone. When the last open run of this process finishes, :meth:`finish` therefore
    calls ``wandb.teardown()``, which waits for the service to flush and close every stream; the next run starts
    a new service.
    """

    #: runs of this process not finished yet (teardown finishes every open run, so it waits for the last)
    open_runs = 0

    def __init__(self, cfg: WandbConfig, setup: TrackerSetup):
        try:
            import wandb
        except ImportError:
            raise missing_package("wandb", "wandb", "wandb") from None
        if cfg.mode == "online" and not _wandb_logged_in(wandb):
            raise TrackerError(
                "tracker 'wandb' in online mode needs a W&B login (run 'wandb login' or set WANDB_API_KEY); or log "
                'offline into the run folder: {"type": "wandb", "mode": "offline"} (--tracker wandb:offline)'
            )
        setup.run_dir.mkdir(parents=True, exist_ok=True)
        group = setup.group if setup.role == "run" else setup.name
        self.run = wandb.init(
            project=cfg.project,
            entity=cfg.entity,
            dir=str(setup.run_dir),
            mode=cfg.mode,
            name=setup.name if setup.role == "run" else f"{setup.name} (comparison)",
            group=group,
            job_type="train" if setup.role == "run" else "compare",
            reinit="create_new",
        )
        WandbTracker.open_runs += 1

    def log_config(self, config, spec) -> None:
        """The config (and spec) as the run's config."""
        self.run.config.update({"train": dict(config), **({"spec": dict(spec)} if spec is not None else {})})

    def log_metrics(self, record) -> None:
        """The figures at the record's step."""
        self.run.log(scalars(record), step=int(record["step"]))

    def log_checkpoints(self, paths) -> None:
        """Paths in the run's summary (``checkpoint/last``, ``checkpoint/best``)."""
        for name, path in paths.items():
            self.run.summary[f"checkpoint/{name}"] = path

    def log_summary(self, summary) -> None:
        """Verdicts and a table of the runs in the summary."""
        import wandb

        self.run.summary["verdicts"] = list(summary.get("verdicts", []))
        runs = summary.get("runs", [])
        if runs:
            cols = list(runs[0])
            self.run.log({"runs": wandb.Table(columns=cols, data=[[r[c] for c in cols] for r in runs])})

    def finish(self, ok: bool) -> None:
        """Finish the run (exit code 1 when training failed); after the process's last open run, wait for W&B's
        service to write every run file (``wandb.teardown``)."""
        import wandb

        self.run.finish(exit_code=0 if ok else 1)
        WandbTracker.open_runs -= 1
        if WandbTracker.open_runs == 0:
            wandb.teardown()


def _wandb_logged_in(wandb) -> bool:
    """Whether an API key is at hand (environment or netrc), without a network call."""
    import os

    if os.environ.get("WANDB_API_KEY"):
        return True
    try:
        return bool(wandb.Api().api_key)  # reads the netrc / settings; raises without any
    except Exception:  # noqa: BLE001 - no key is a refusal, named above
        return False


# ----------------------------------------------------------------------------------------------------- MLflow


def _probe(uri: str) -> None:
    """Refuse an ``http(s)`` tracking URI whose server does not answer ``/health`` within 10 s."""
    import urllib.request

    url = uri.rstrip("/") + "/health"
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            if response.status != 200:
                raise OSError(f"HTTP {response.status}")
    except (OSError, ValueError) as exc:
        raise TrackerError(
            f"tracker 'mlflow': the tracking server {uri} is unreachable ({url}: {exc}); start it (mlflow server "
            "--host 127.0.0.1 --port 5000 --backend-store-uri sqlite:///mlflow.db) or fix tracking_uri"
        ) from None


class MLflowTracker(Tracker):
    """One MLflow run through ``MlflowClient`` (no global active run): nested under the comparison's parent run
    (tag ``mlflow.parentRunId``) when the run belongs to one."""

    def __init__(self, cfg: MLflowConfig, setup: TrackerSetup):
        try:
            from mlflow.tracking import MlflowClient
        except ImportError:
            raise missing_package("mlflow", "mlflow", "mlflow") from None
        import mlflow

        uri = cfg.tracking_uri or mlflow.get_tracking_uri()  # MLFLOW_TRACKING_URI, else MLflow's default
        if uri.startswith(("http://", "https://")):
            _probe(uri)
        self.client = MlflowClient(tracking_uri=uri)
        exp = self.client.get_experiment_by_name(cfg.experiment)
        if exp is None:
            try:
                exp_id = self.client.create_experiment(cfg.experiment)
            except Exception:  # noqa: BLE001 - another process created it meanwhile
                exp_id = self.client.get_experiment_by_name(cfg.experiment).experiment_id
        else:
            exp_id = exp.experiment_id
        tags = {"modkit.role": setup.role, "modkit.run_dir": str(setup.run_dir.resolve())}
        group = setup.group if setup.role == "run" else setup.name
        if group:
            tags["modkit.group"] = group
            parent = self._parent(exp_id, group) if setup.role == "run" else None
            if parent is not None:
                tags["mlflow.parentRunId"] = parent
        self.run_id = self.client.create_run(exp_id, tags=tags, run_name=setup.name).info.run_id

    def _parent(self, exp_id: str, group: str) -> Optional[str]:
        """The run id of the comparison ``group``'s parent run, ``None`` when it has none."""
        found = self.client.search_runs(
            [exp_id], f"tags.`modkit.group` = '{group}' and tags.`modkit.role` = 'group'", max_results=1
        )
        return found[0].info.run_id if found else None

    def log_config(self, config, spec) -> None:
        """The config as flat parameters (``optimizer.type``), config and spec as JSON artifacts."""
        from mlflow.entities import Param

        params = [Param(k[:250], v[:6000]) for k, v in flat_params(dict(config)).items()]
        for i in range(0, len(params), 100):  # a batch holds at most 100 parameters
            self.client.log_batch(self.run_id, params=params[i : i + 100])
        self.client.log_dict(self.run_id, dict(config), "config.json")
        if spec is not None:
            self.client.log_dict(self.run_id, dict(spec), "spec.json")

    def log_metrics(self, record) -> None:
        """The figures at the record's step."""
        from mlflow.entities import Metric

        now, step = int(time.time() * 1000), int(record["step"])
        metrics = [Metric(k, v, now, step) for k, v in scalars(record).items()]
        if metrics:
            self.client.log_batch(self.run_id, metrics=metrics)

    def log_checkpoints(self, paths) -> None:
        """Tags ``modkit.checkpoint.last`` / ``.best``."""
        for name, path in paths.items():
            self.client.set_tag(self.run_id, f"modkit.checkpoint.{name}", path)

    def log_summary(self, summary) -> None:
        """The verdicts as a tag and ``summary.json``."""
        self.client.set_tag(self.run_id, "modkit.verdicts", "\n".join(summary.get("verdicts", []))[:5000])
        self.client.log_dict(self.run_id, dict(summary), "summary.json")

    def finish(self, ok: bool) -> None:
        """End the run, ``FINISHED`` or ``FAILED``."""
        self.client.set_terminated(self.run_id, "FINISHED" if ok else "FAILED")


@hookimpl
def register_components(register) -> None:
    """Register ``jsonl``, ``tensorboard``, ``wandb`` and ``mlflow``."""
    what = "the config, the spec, losses, learning rate, gradient norm, throughput, evaluation figures and the final checkpoint paths"
    register(
        Component(
            kind="tracker",
            type="jsonl",
            config=JsonlConfig,
            factory=JsonlTracker,
            description="JSON Lines: the run's metrics.jsonl (always written; resume, compare and the plots read it); "
            "with path, the same records and the config and checkpoint lines appended to a second file.",
            reference="JSON Lines (jsonlines.org); nanoGPT's and torchtune's disk loggers",
            capabilities={"flag_value": "path"},
        )
    )
    register(
        Component(
            kind="tracker",
            type="tensorboard",
            config=TensorBoardConfig,
            factory=TensorBoardTracker,
            description=f"TensorBoard event files in RUN/tensorboard (float64 scalars): {what}. A comparison's runs are "
            "subfolders of its report folder: tensorboard --logdir REPORT.",
            reference="torch.utils.tensorboard.SummaryWriter; torchtitan's and torchtune's TensorBoard loggers",
            capabilities={"flag_value": "log_dir", "extra": "tensorboard"},
        )
    )
    register(
        Component(
            kind="tracker",
            type="wandb",
            config=WandbConfig,
            factory=WandbTracker,
            description=f"Weights & Biases, online or offline into RUN/wandb: {what}. A comparison's runs share a "
            "W&B group, with one more run holding the verdicts.",
            reference="wandb.init / Run.log (docs.wandb.ai); torchtitan's and litgpt's W&B loggers",
            capabilities={"flag_value": "mode", "extra": "wandb"},
            example={"type": "wandb", "mode": "offline"},
        )
    )
    register(
        Component(
            kind="tracker",
            type="mlflow",
            config=MLflowConfig,
            factory=MLflowTracker,
            description=f"MLflow, a tracking server or a local store (default: MLflow's own): {what}. A comparison is "
            "a parent run holding the verdicts and its runs are nested runs.",
            reference="mlflow.tracking.MlflowClient (mlflow.org/docs); torchtune's and litgpt's MLflow loggers",
            capabilities={"flag_value": "tracking_uri", "extra": "mlflow"},
        )
    )

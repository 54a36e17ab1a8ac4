"""Experiment trackers (modkit.train.trackers, modkit_plugins.trackers): what each logged for a short run, read back
through the tracker's own reader, equals the run's metrics.jsonl; a plugin's tracker gets every call; a tracker that
cannot start stops the run before training.

* TensorBoard: the event files through tensorboard's EventAccumulator;
* MLflow: a tracking server started here on 127.0.0.1 (SQLite backend), queried through MlflowClient;
* W&B: an offline run, read from its ``run-ID.wandb`` file (LevelDB log records of ``wandb_internal_pb2.Record``).
"""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
import types
import urllib.request
from pathlib import Path
from typing import Literal

import pytest

import modkit
from modkit.data import default_corpus, prepare
from modkit.train import train
from modkit.train.plot import read_metrics
from modkit.train.trackers import Tracker, TrackerError, TrackerSetup, parse_tracker_flag, scalars

from conftest import HANG_TIMEOUT, tiny_spec


def _has(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


needs_tensorboard = pytest.mark.skipif(
    not _has("tensorboard"), reason="tensorboard is not installed (extra: tensorboard)"
)
needs_mlflow = pytest.mark.skipif(not _has("mlflow"), reason="mlflow is not installed (extra: mlflow)")
needs_wandb = pytest.mark.skipif(not _has("wandb"), reason="wandb is not installed (extra: wandb)")


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    """The first 20,000 characters of tiny shakespeare, character tokenizer."""
    root = tmp_path_factory.mktemp("data")
    text = root / "head.txt"
    text.write_text(default_corpus().read_text()[:20_000])
    prepare([text], root / "prepared", tokenizer="char", show_progress=False)
    return root / "prepared"


def config(data_dir: Path, trackers: list, **changes) -> dict:
    """Five steps of a tiny model: a train line every step, evaluations at 0 and 5 and a final one."""
    return {
        "model": {**tiny_spec(max_seq_len=32), "position": {"type": "learned"}},
        "data": str(data_dir),
        "batch_size": 2,
        "seq_len": 16,
        "max_steps": 5,
        "warmup_steps": 1,
        "eval_interval": 5,
        "eval_batches": 1,
        "log_interval": 1,
        "final_eval_tokens": 160,
        "sample_tokens": 0,
        "device": "cpu",
        "seed": 5,
        "trackers": trackers,
        **changes,
    }


def expected(run: Path) -> dict[str, dict[int, float]]:
    """``{"train/loss": {step: value}}`` of every figure in the run's metrics.jsonl."""
    out: dict[str, dict[int, float]] = {}
    for record in read_metrics(run / "metrics.jsonl"):
        for key, value in scalars(record).items():
            out.setdefault(key, {})[record["step"]] = value
    return out


def test_scalars_name_every_figure_of_a_record():
    record = {"kind": "train", "step": 3, "loss": 2.5, "lr": 1e-3, "grad_norm": 0.5, "mfu": None, "skipped": True}
    assert scalars(record) == {"train/loss": 2.5, "train/lr": 1e-3, "train/grad_norm": 0.5}


# ----------------------------------------------------------------------------------------------------- a plugin


class Recorder(Tracker):
    """Records every call; ``fail_at`` names a method that raises."""

    calls: list = []

    def __init__(self, cfg, setup):
        self.setup = setup
        if cfg.fail_at == "start":
            raise ImportError("No module named 'recorder_backend'")
        self.fail_at = cfg.fail_at
        Recorder.calls.append(("start", setup.name, setup.role, setup.group))

    def _call(self, name, *args):
        if self.fail_at == name:
            raise RuntimeError(f"{name} broke")
        Recorder.calls.append((name, *args))

    def log_config(self, config, spec):
        self._call("log_config", config, spec)

    def log_metrics(self, record):
        self._call("log_metrics", dict(record))

    def log_checkpoints(self, paths):
        self._call("log_checkpoints", dict(paths))

    def finish(self, ok):
        Recorder.calls.append(("finish", ok))


def _recorder_plugin() -> types.ModuleType:
    from modkit.plugin import Component, ComponentConfig, hookimpl

    class RecorderConfig(ComponentConfig):
        type: Literal["recorder"] = "recorder"
        fail_at: str = "never"

    mod = types.ModuleType("recorder_plugin")

    @hookimpl
    def register_components(register):
        register(
            Component(
                kind="tracker",
                type="recorder",
                config=RecorderConfig,
                factory=Recorder,
                description="records every call (tests)",
                capabilities={"flag_value": "fail_at", "extra": "recorder"},
            )
        )

    mod.register_components = register_components
    return mod


@pytest.fixture
def recorder():
    """The recorder tracker registered globally (training reads the global registry) for one test."""
    reg = modkit.get_registry()
    reg.register_plugin(_recorder_plugin(), "recorder-plugin")
    Recorder.calls = []
    yield Recorder.calls
    reg.unregister_plugin("recorder-plugin")


def test_a_plugin_tracker_gets_the_config_spec_every_record_and_the_checkpoints(data_dir, tmp_path, recorder):
    run = tmp_path / "run"
    train(config(data_dir, ["recorder"]), run, echo=lambda line: None)
    assert recorder[0] == ("start", "run", "run", None)
    name, logged_config, logged_spec = recorder[1]
    assert name == "log_config"
    assert logged_config == json.loads((run / "config.json").read_text())
    assert logged_spec == json.loads((run / "spec.json").read_text())
    records = [c[1] for c in recorder if c[0] == "log_metrics"]
    assert records == read_metrics(run / "metrics.jsonl")
    assert [r["kind"] for r in records].count("train") == 5 and records[-1]["kind"] == "final"
    assert recorder[-2] == (
        "log_checkpoints",
        {"last": str((run / "last").resolve()), "best": str((run / "best").resolve())},
    )
    assert recorder[-1] == ("finish", True)


def test_a_tracker_that_cannot_start_stops_the_run_before_training(data_dir, tmp_path, recorder):
    run = tmp_path / "run"
    with pytest.raises(TrackerError) as info:
        train(config(data_dir, [{"type": "recorder", "fail_at": "start"}]), run, echo=lambda line: None)
    assert "tracker 'recorder'" in str(info.value) and "recorder_backend" in str(info.value)
    assert "pip install 'modkit-lm[recorder]'" in str(info.value)
    assert not (run / "config.json").exists(), "no run folder is written: the same command runs once fixed"
    assert not any(c[0] == "log_metrics" for c in recorder)


def test_a_tracker_failing_mid_run_is_dropped_and_the_run_goes_on(data_dir, tmp_path, recorder):
    lines: list[str] = []
    run = tmp_path / "run"
    result = train(config(data_dir, [{"type": "recorder", "fail_at": "log_metrics"}]), run, echo=lines.append)
    assert result.steps == 5
    assert [line for line in lines if "tracker 'recorder' failed in log_metrics" in line] == [
        "warning: tracker 'recorder' failed in log_metrics (RuntimeError: log_metrics broke); it logs nothing more, "
        "the run goes on"
    ]
    assert recorder[-1] == ("finish", False) and not any(c[0] == "log_checkpoints" for c in recorder)


def test_the_tracker_flag_sets_the_field_the_tracker_names(recorder):
    assert parse_tracker_flag("recorder:log_config") == {"type": "recorder", "fail_at": "log_config"}
    assert parse_tracker_flag("mlflow:http://127.0.0.1:5000") == {
        "type": "mlflow",
        "tracking_uri": "http://127.0.0.1:5000",
    }
    assert parse_tracker_flag("tensorboard") == {"type": "tensorboard"}
    with pytest.raises(TrackerError, match="did you mean 'tensorboard'"):
        parse_tracker_flag("tensorbord")


def test_a_tracker_listed_twice_or_misspelt_is_refused_with_its_position(data_dir):
    from modkit.core.errors import SpecError
    from modkit.train import load_train_config

    with pytest.raises(SpecError) as info:
        load_train_config(config(data_dir, ["jsonl", {"type": "jsonl", "pth": "x"}, "jsonl"]))
    text = str(info.value)
    assert "[1].pth: unknown field 'pth'" in text and "did you mean 'path'" in text
    assert "[2]: tracker 'jsonl' is listed twice" in text


def test_the_jsonl_tracker_copies_the_records_with_config_and_checkpoint_lines(data_dir, tmp_path):
    run, copy = tmp_path / "run", tmp_path / "elsewhere" / "copy.jsonl"
    train(config(data_dir, [{"type": "jsonl", "path": str(copy)}]), run, echo=lambda line: None)
    lines = [json.loads(line) for line in copy.read_text().splitlines()]
    assert lines[0]["kind"] == "config" and lines[0]["config"] == json.loads((run / "config.json").read_text())
    assert lines[1:-1] == read_metrics(run / "metrics.jsonl")
    assert lines[-1] == {
        "kind": "checkpoints",
        "last": str((run / "last").resolve()),
        "best": str((run / "best").resolve()),
    }


# ----------------------------------------------------------------------------------------------------- TensorBoard


@needs_tensorboard
def test_tensorboard_event_files_hold_the_values_of_metrics_jsonl(data_dir, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.util import tensor_util

    run = tmp_path / "run"
    train(config(data_dir, ["tensorboard"]), run, echo=lambda line: None)
    acc = EventAccumulator(str(run / "tensorboard"), size_guidance={"tensors": 0})
    acc.Reload()
    want = expected(run)
    assert {
        "train/loss",
        "train/lr",
        "train/grad_norm",
        "train/tokens_per_s",
        "eval/val_loss",
        "final/val_loss",
    } <= set(want)
    tags = set(acc.Tags()["tensors"])
    for key, by_step in want.items():
        assert key in tags, key
        got = {e.step: float(tensor_util.make_ndarray(e.tensor_proto)) for e in acc.Tensors(key)}
        assert got == by_step, key
    texts = {
        t.removesuffix("/text_summary"): tensor_util.make_ndarray(acc.Tensors(t)[-1].tensor_proto).item().decode()
        for t in tags
        if t.endswith("/text_summary")
    }
    assert texts["checkpoints/last"] == str((run / "last").resolve())
    assert json.loads(texts["config"].replace("\n    ", "\n")) == json.loads((run / "config.json").read_text())


# ----------------------------------------------------------------------------------------------------- W&B


def wandb_records(path: Path) -> list:
    """The protobuf records of a W&B ``.wandb`` file: a 7-byte header (``:W&B``, magic, version), then LevelDB log
    records (4-byte checksum, 2-byte little-endian length, 1-byte type: 1 full, 2 first, 3 middle, 4 last) in 32 KiB
    blocks whose tails shorter than a record header are padding."""
    from wandb.proto import wandb_internal_pb2

    data, block = path.read_bytes(), 32768
    assert data[:4] == b":W&B"
    pos, pending, out = 7, b"", []
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:
            pos += left
            continue
        length, kind = int.from_bytes(data[pos + 4 : pos + 6], "little"), data[pos + 6]
        if kind == 0:
            pos += left
            continue
        pending += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            out.append(record)
            pending = b""
    return out


def test_wandb_tracker_waits_for_the_service_after_the_last_open_run_only(tmp_path, monkeypatch):
    """``Run.finish`` returns before W&B's service has written the run file (read right after, the file was the
    7-byte header alone in 2 of 12 runs): the tracker calls ``wandb.teardown`` (which flushes every stream) once the
    last open run of the process has finished, and not before, since teardown finishes every open run. A stand-in
    ``wandb`` module records the order of the calls."""
    from modkit_plugins.trackers import WandbConfig, WandbTracker

    calls = []

    class FakeRun:
        def __init__(self, name):
            self.name = name

        def finish(self, exit_code):
            calls.append(("finish", self.name, exit_code))

    fake = types.ModuleType("wandb")
    fake.init = lambda **kw: FakeRun(kw["name"])
    fake.teardown = lambda: calls.append(("teardown",))
    monkeypatch.setitem(sys.modules, "wandb", fake)
    monkeypatch.setattr(WandbTracker, "open_runs", 0)
    cfg = WandbConfig(type="wandb", mode="offline")
    group = WandbTracker(cfg, TrackerSetup(tmp_path / "cmp", "cmp", role="group"))
    first = WandbTracker(cfg, TrackerSetup(tmp_path / "a", "a", group="cmp"))
    first.finish(True)
    second = WandbTracker(cfg, TrackerSetup(tmp_path / "b", "b", group="cmp"))
    second.finish(False)
    group.finish(True)
    assert calls == [("finish", "a", 0), ("finish", "b", 1), ("finish", "cmp (comparison)", 0), ("teardown",)]
    alone = WandbTracker(cfg, TrackerSetup(tmp_path / "c", "c"))
    alone.finish(True)
    assert calls[-2:] == [("finish", "c", 0), ("teardown",)]


@needs_wandb
@pytest.mark.slow  # starts the W&B service process
def test_wandb_offline_run_files_hold_the_values_of_metrics_jsonl(data_dir, tmp_path, monkeypatch):
    for name in ("WANDB_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):  # nothing shared with other W&B processes
        monkeypatch.setenv(name, str(tmp_path / name.lower()))
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))
    run = tmp_path / "run"
    train(config(data_dir, [{"type": "wandb", "mode": "offline"}]), run, echo=lambda line: None)
    (found,) = list((run / "wandb").glob("offline-run-*/run-*.wandb"))
    records = wandb_records(found)
    got: dict[str, dict[int, float]] = {}
    summary, config_keys = {}, set()
    for r in records:
        kind = r.WhichOneof("record_type")
        if kind == "history":
            items = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item}
            step = r.history.step.num
            for key, value in items.items():
                if not key.startswith("_"):
                    got.setdefault(key, {})[step] = value
        elif kind == "summary":
            for i in r.summary.update:
                summary[i.key or "/".join(i.nested_key)] = json.loads(i.value_json)
        elif kind == "config":
            config_keys |= {i.key for i in r.config.update}
        elif kind == "run":
            assert r.run.display_name == "run" and r.run.job_type == "train"
    assert got == expected(run)
    assert summary["checkpoint/last"] == str((run / "last").resolve())
    assert {"train", "spec"} <= config_keys


# ----------------------------------------------------------------------------------------------------- MLflow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory):
    """An MLflow tracking server on 127.0.0.1 (SQLite backend, no job runner), its URI; polled on /health until it
    answers (HANG_TIMEOUT guards a hang only), always terminated."""
    root = tmp_path_factory.mktemp("mlflow")
    port = _free_port()
    uri = f"http://127.0.0.1:{port}"
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    cmd = [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1"]
    cmd += [
        "--backend-store-uri",
        f"sqlite:///{root / 'mlflow.db'}",
        "--artifacts-destination",
        str(root / "artifacts"),
    ]
    log = open(root / "server.log", "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=root, start_new_session=True)
    try:
        import time

        deadline = time.monotonic() + HANG_TIMEOUT
        while True:
            if proc.poll() is not None:
                pytest.fail(f"mlflow server exited with {proc.returncode}: {(root / 'server.log').read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(uri + "/health", timeout=5) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, "mlflow server did not answer /health"
            time.sleep(0.5)
        yield uri
    finally:
        import signal

        os.killpg(proc.pid, signal.SIGTERM)  # the server and the uvicorn worker it started (its own session)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()


@needs_mlflow
@pytest.mark.slow  # starts an MLflow tracking server
def test_mlflow_server_holds_the_values_of_metrics_jsonl(data_dir, tmp_path, mlflow_server):
    from mlflow.tracking import MlflowClient

    run = tmp_path / "run"
    train(config(data_dir, [parse_tracker_flag(f"mlflow:{mlflow_server}")]), run, echo=lambda line: None)
    client = MlflowClient(tracking_uri=mlflow_server)
    exp = client.get_experiment_by_name("modkit")
    (logged,) = client.search_runs([exp.experiment_id], f"tags.`modkit.run_dir` = '{run.resolve()}'")
    assert logged.info.status == "FINISHED" and logged.info.run_name == "run"
    want = expected(run)
    assert set(logged.data.metrics) == set(want)
    for key, by_step in want.items():
        assert {m.step: m.value for m in client.get_metric_history(logged.info.run_id, key)} == by_step, key
    saved = json.loads((run / "config.json").read_text())
    assert logged.data.params["lr"] == json.dumps(saved["lr"])
    assert logged.data.params["optimizer.type"] == "adamw"
    assert logged.data.tags["modkit.checkpoint.last"] == str((run / "last").resolve())


@needs_mlflow
def test_an_unreachable_mlflow_server_is_refused_before_training(data_dir, tmp_path):
    run = tmp_path / "run"
    uri = f"http://127.0.0.1:{_free_port()}"
    with pytest.raises(TrackerError) as info:
        train(config(data_dir, [{"type": "mlflow", "tracking_uri": uri}]), run, echo=lambda line: None)
    assert f"the tracking server {uri} is unreachable" in str(info.value) and "fix tracking_uri" in str(info.value)
    assert not (run / "config.json").exists() and not (run / "metrics.jsonl").exists()


def test_the_guide_s_example_tracker_prints_every_nth_train_line_and_every_evaluation(data_dir, tmp_path, capsys):
    """``docs/examples/print_tracker.py`` (the plugin guide's tracker, verbatim) registered as a plugin: it prints the
    train lines of steps 2 and 4 (``every = 2``) and each evaluation line, with the figures ``metrics.jsonl`` holds."""
    path = Path(__file__).resolve().parents[2] / "docs" / "examples" / "print_tracker.py"
    spec = importlib.util.spec_from_file_location("print_tracker_example", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    reg = modkit.get_registry()
    reg.register_plugin(module, "print-tracker-example")
    try:
        run = tmp_path / "run"
        train(config(data_dir, [{"type": "print", "every": 2}]), run, echo=lambda line: None)
    finally:
        reg.unregister_plugin("print-tracker-example")
    printed = [line.split(" ", 2) for line in capsys.readouterr().out.splitlines() if line.startswith("run ")]
    records = read_metrics(run / "metrics.jsonl")
    want = [r for r in records if r["kind"] != "train" or r["step"] % 2 == 0]
    assert [int(step) for _, step, _ in printed] == [r["step"] for r in want]
    assert [figures for _, _, figures in printed] == [str(module.scalars(r)) for r in want]

"""The training loop: any spec, on prepared token data, on one process or many (torchrun + FSDP2 / tensor parallel).

One optimizer step = ``grad_accum`` micro-batches of ``batch_size x seq_len`` tokens (the global batch; under
``N`` data-parallel processes each computes its ``batch_size / N`` rows), cross-entropy over every position
(plus the model's auxiliary loss, for MoE), gradient clipping, the configured optimizer (AdamW by default;
:mod:`modkit.train.optim`) at the scheduled learning rate. Evaluation
estimates the mean train and validation loss on fixed windows. Everything a run writes is described in
:mod:`modkit.train.state`.

Built on the rest of modkit: :func:`modkit.build` / :func:`modkit.parallel.build_parallel` for the model,
:func:`modkit.save` checkpoints, :func:`modkit.inference.generate.generate` for the sample, :mod:`modkit.data` for data.
The recipe follows nanoGPT's ``train.py`` (Karpathy): random-window batches, AdamW with decay on matrices only,
warmup + cosine, clipping at 1.0.

The run is split by what each part does: :mod:`modkit.train.resolve` (device, data folder, spec, FLOPs, parameter
groups), :mod:`modkit.train.processes` (the process layout), :mod:`modkit.train.step` (one optimizer step),
:mod:`modkit.train.evaluate` (evaluation during training), :mod:`modkit.train.pipelined` (pipeline-parallel
runs, ``--pp``), :mod:`modkit.train.checkpointing` (the run folder, checkpoints and resume) and :mod:`modkit.train.progress` (the progress bar); this module holds the run itself
(:class:`Trainer`, :func:`train`) and re-exports the names of those modules it always had.
"""

from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Union

import torch
from torch import nn

from modkit.analysis.cost import CostError
from modkit.nn.build import breakdown, build
from modkit.nn.onednn import use_onednn_linears
from ..spec import ModelSpec
from .allocator import keep_freed_memory
from .balance import ExpertBalance
from .checkpointing import CheckpointMixin
from .config import DEFAULT_MODEL, TrainConfig, schedule_warning
from .errors import TrainError
from .evaluate import EvalMixin
from .step import check_mtp_config, check_sharing_config
from .optim import build_optimizer
from .pipelined import StageView, build_trainer_pipeline, check_pipeline_config, check_pipeline_model
from .processes import Processes, init_processes  # noqa: F401 - Processes: re-exported
from .progress import _peak_memory, _ProgressBar
from .provenance import stamp_provenance
from .resolve import (  # noqa: F401 - _node, decay_groups: re-exported (modkit.train, benchmarks)
    _node,
    _resolve_device,
    check_document_mask,
    check_resume_model,
    decay_groups,
    flops_per_token,
    prepared_data,
    resolve_spec,
    run_data_folder,
)
from .step import StepMixin


# ------------------------------------------------------------------------------------------------- the run


@dataclass
class RunResult:
    """What :func:`train` returns (rank 0's view)."""

    run_dir: Path
    steps: int
    tokens: int
    train_loss: Optional[float]
    val_loss: Optional[float]
    best_val_loss: Optional[float]
    final_val_loss: Optional[float]
    #: wall seconds from the first step to the last, evaluations and checkpoints included
    elapsed_s: float
    #: the run's mean: tokens trained / ``step_s`` (this invocation's steps, on a resume)
    tokens_per_s: float
    #: wall seconds of the training steps: ``elapsed_s`` less the evaluations and checkpoints
    step_s: float = 0.0
    sample: Optional[str] = None
    history: list[dict] = field(default_factory=list)
    #: steps whose batch was skipped as non-finite (``on_nonfinite = "skip"``), over the whole run
    skipped_steps: int = 0


class Trainer(CheckpointMixin, StepMixin, EvalMixin):
    """One training run (see :func:`train`)."""

    def __init__(
        self,
        config: TrainConfig,
        run_dir: Union[str, Path],
        *,
        base_dir: Optional[Path] = None,
        resume: bool = False,
        progress: bool = True,
        echo: Callable[[str], None] = print,
    ):
        self.config = config
        self.run = Path(run_dir)
        self.base = base_dir
        self.resume = resume
        self.progress = progress
        self.echo = echo

    # ------------------------------------------------------------------ setup
    def _say(self, line: str) -> None:
        """A status line through ``echo``, on rank 0 only."""
        if self.procs.main:
            self.echo(line)

    def _note(self, line: str) -> None:
        """A ``modkit: note: ...`` line on stderr, on rank 0 only: something ignored or worked around."""
        if self.procs.main:
            print(f"modkit: note: {line}", file=sys.stderr)

    def _open_data(self):
        """The run's :class:`modkit.data.TokenData`, prepared by rank 0 first when it is text."""
        from ..data import TokenData

        folder = None
        if self.procs.main:
            folder = prepared_data(self.config, self.base, self.run / "data", show_progress=self.progress)
        self.procs.barrier()
        # the other ranks find the folder rank 0 prepared (the same call, now with nothing to do)
        return TokenData.open(folder or prepared_data(self.config, self.base, self.run / "data"))

    def _build(self, spec: ModelSpec) -> nn.Module:
        """The run's model (sharded on the mesh under several processes), with the weights of the checkpoint folder
        ``model`` names when it names one (not on resume: the run's checkpoint has them)."""
        c = self.config
        source = Path(c.model) if isinstance(c.model, str) else None
        if source is not None and not source.is_absolute() and self.base is not None:
            source = self.base / source
        from_weights = source is not None and source.is_dir() and (source / "model.safetensors").is_file()
        if self.procs.pp > 1:  # this rank's pipeline stages, under the whole model's names
            check_pipeline_model(c, str(source) if from_weights and not self.resume else None, self.rows)
            self.pipe, self.pipe_loss = build_trainer_pipeline(c, spec, self.procs.mesh, self.device)
            return StageView(self.pipe.stages)
        if self.procs.distributed:
            from ..parallel import build_parallel

            model = build_parallel(spec, self.procs.mesh, device=self.device, seed=c.seed)
        else:
            model = build(spec, device=self.device, seed=c.seed)
        if from_weights and not self.resume:
            self._load_weights(model, source)
            self._say(f"weights from {source}")
        return model

    def _onednn_linears(self) -> bool:
        """Whether the run's ``nn.Linear`` layers go through oneDNN (``onednn_linear``): on the CPU in float32, on
        one process without a pipeline, not compiled (the compiler picks its own kernels)."""
        c = self.config
        return (
            c.onednn_linear
            and self.device.type == "cpu"
            and c.precision == "float32"
            and not self.procs.distributed
            and self.pipe is None
            and not c.compile
        )

    def _open_trackers(self) -> None:
        """Start the config's trackers on rank 0 (:mod:`modkit.train.trackers`), giving them the config and spec.

        Raises:
            TrackerError: on every rank, when one cannot start on rank 0 (its message).
        """
        from .trackers import TrackerError, Trackers, TrackerSetup, open_trackers

        c = self.config
        self.trackers = Trackers()
        if not c.trackers:
            return
        failure = None
        if self.procs.main:
            setup = TrackerSetup(
                run_dir=self.run.resolve(),
                name=self.run.name,
                group=c.tracker_group,
                config=c.model_dump(mode="json"),
                spec=self.spec.to_dict(),
                start_step=self.step,
            )
            try:
                self.trackers = open_trackers(c.trackers, setup, echo=self._say)
            except TrackerError as exc:
                failure = str(exc)
        failure = self.procs.broadcast(failure)
        if failure:
            raise TrackerError(failure)

    def close_trackers(self, ok: bool) -> None:
        """Give the trackers the final checkpoints (when ``ok``) and finish them."""
        trackers = getattr(self, "trackers", None)
        if not trackers:
            return
        if ok:
            paths = {name: str((self.run / name).resolve()) for name in ("last", "best") if (self.run / name).exists()}
            trackers.log_checkpoints(paths)
        trackers.finish(ok)

    # ------------------------------------------------------------------ main
    def setup(self) -> None:
        """Processes, device, data, spec, model, optimizer, sampler; resume state when asked.

        Raises:
            TrainError: a config that does not fit the model, data or processes; ``--resume`` of a folder that is
                not a run; a fresh run into a folder that holds one.
            SpecError: the model spec is invalid.
            CheckpointError: a resume from a damaged or mismatched checkpoint.
        """
        from ..data import RandomWindows, SequentialEpochs, eval_batches

        c = self.config
        self.device = _resolve_device(c.device)
        if c.threads is not None:
            torch.set_num_threads(c.threads)
        if c.reuse_host_memory and self.device.type == "cpu":
            keep_freed_memory()  # no page faults on every step's allocations (modkit.train.allocator)
        check_pipeline_config(c)
        self.procs = init_processes(c, self.device)
        self.pipe = None  # the pipeline schedule and its stages under pp > 1 (modkit.train.pipelined)
        self.data = self._open_data()
        # the spec records which plugin (distribution, version) provides each component (modkit.train.provenance)
        self.spec = stamp_provenance(resolve_spec(c, self.base, self.data.vocab_size))
        self.separators = self.data.separators
        check_pipeline_config(c, self.spec)  # before the run folder is written
        check_mtp_config(c, self.spec)
        check_sharing_config(c, self.spec, self.procs.world)
        if c.document_mask:
            check_document_mask(self.spec, self.data)
        self.history: list[dict] = []
        self.step = 0
        if not self.resume:  # a tracker that cannot start stops the run before its folder is written
            self._open_trackers()
            self._start_run_folder(self.spec)
        elif not (self.run / "config.json").is_file():
            raise TrainError(f"--resume {self.run}: not a run folder (no config.json)")
        self.procs.barrier()
        torch.manual_seed(c.seed + self.procs.dp_rank)  # dropout masks: one stream per data-parallel rank
        self.rows = c.batch_size // self.procs.dp
        self.model = self._build(self.spec)
        self.model.train()
        # routers' expert loads and balancing rules (modkit.nn.balance): summed over the data-parallel ranks
        dp_group = self.procs.mesh["dp"].get_group() if self.procs.distributed else None
        self.balance = ExpertBalance(self.model, dp_group, self.pipe.group if self.pipe is not None else None)
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.param_names = [n for n, p in self.model.named_parameters() if p.requires_grad]
        # the whole model's names (a checkpoint's): under pp this rank holds only its stages' parameters
        whole = build(self.spec, device="meta") if self.pipe is not None else self.model
        self.all_param_names = [n for n, p in whole.named_parameters() if p.requires_grad]
        # the registered optimizer the config names, over the parameters grouped by role (modkit.train.optim);
        # AdamW is fused on one process (one kernel per step on CPU and CUDA: benchmarks/results_train.md)
        self.optimizer = build_optimizer(self.model, self.spec, c, distributed=self.procs.distributed)
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=c.precision == "float16")
        sampler_cls = RandomWindows if c.sampler == "random" else SequentialEpochs
        self.sampler = sampler_cls(
            self.data.train, c.batch_size, c.seq_len, seed=c.seed, rank=self.procs.dp_rank, world_size=self.procs.dp
        )
        self.eval_train = eval_batches(self.data.train, c.batch_size, c.seq_len, c.eval_batches, seed=c.seed + 1)
        self.eval_val = eval_batches(self.data.val, c.batch_size, c.seq_len, c.eval_batches, seed=c.seed + 2)
        self.step, self.tokens, self.best_val = 0, 0, None
        self.skipped_steps, self.consecutive_skips = 0, 0
        if self.resume:
            self._restore()
            self._open_trackers()
        if self._onednn_linears():
            use_onednn_linears(self.model)  # the same products through oneDNN (modkit.nn.onednn)
        self.forward = torch.compile(self.model) if c.compile else self.model
        try:
            self.flops_per_token: Optional[int] = flops_per_token(self.spec, c.seq_len)
        except CostError as exc:  # a component without a FLOPs declaration: no model FLOP/s rather than a wrong one
            self.flops_per_token = None
            self._say(f"model FLOP/s and MFU not reported: {exc}")

    def fit(self) -> RunResult:
        """Run to the end of the budget; returns the losses and throughput.

        Raises:
            TrainError: the validation split is shorter than ``seq_len + 1`` tokens (the final evaluation).
        """
        c = self.config
        total = c.total_steps
        parts = breakdown(build(self.spec, device="meta"))
        self._say(
            f"model {self.spec.name or ''}: {parts['total']:,} parameters; data {self.data.path} "
            f"({len(self.data.train):,} train / {len(self.data.val):,} val tokens, vocab {self.data.vocab_size}); "
            f"{total} steps of {c.tokens_per_step:,} tokens on {self.procs.world} process(es), device {self.device}"
        )
        if self.step >= total and self.procs.broadcast(
            any(r["kind"] == "final" for r in self.history) or not c.final_eval_tokens
        ):
            return self._finished_result()
        if self.step == 0:
            losses = self._eval_and_record()
            self._say(
                f"step 0: train {losses['train']:.4f}, val {losses['val']:.4f} "
                f"(ln vocab = {math.log(self.spec.vocab_size):.4f})"
            )
        start = time.perf_counter()
        start_tokens = self.tokens
        losses, paused = self._train_until(total, start)
        elapsed = time.perf_counter() - start
        step_s = elapsed - paused
        tps = (self.tokens - start_tokens) / max(step_s, 1e-9)
        full_val = self._final_eval()
        sample = None
        if c.sample_tokens > 0 and self.pipe is not None:
            self._say(
                "sample not generated: generation through pipeline stages is not supported; the best weights are "
                f"saved whole, sample them with modkit generate {self.run / 'best'}"
            )
        elif self.procs.main and c.sample_tokens > 0:
            sample = self._sample()
        self.procs.barrier()
        return RunResult(
            run_dir=self.run,
            steps=self.step,
            tokens=self.tokens,
            train_loss=losses.get("train"),
            val_loss=losses.get("val"),
            best_val_loss=self.best_val,
            final_val_loss=full_val,
            elapsed_s=elapsed,
            tokens_per_s=tps,
            step_s=step_s,
            sample=sample,
            history=self.history,
            skipped_steps=self.skipped_steps,
        )

    def _train_until(self, total: int, start: float) -> tuple[dict[str, float], float]:
        """Steps up to ``total``, logging, evaluating and checkpointing at their intervals (and at the end); the
        tokens/s of a ``train`` line count training time since ``start`` or the last log, eval or checkpoint.
        Returns the last evaluation's losses (``{}`` without one) and the seconds its evaluations and checkpoints
        took."""
        c = self.config
        last_log, last_tokens = start, self.tokens
        losses: dict[str, float] = {}
        paused = 0.0
        with _ProgressBar(total, self.step, enabled=self.progress and self.procs.main, echo=self._say) as bar:
            while self.step < total:
                out = self.train_step()
                at_end = self.step == total
                if out["skipped"]:
                    bar.note(
                        f"step {self.step}: {out['skipped']}: batch skipped ({self.consecutive_skips} in a row, "
                        f"{self.skipped_steps} in all; the run stops after {c.max_nonfinite_skips} in a row)"
                    )
                if self.step % c.log_interval == 0 or at_end:
                    loss = float(self.procs.mean(out["loss"]))
                    now = time.perf_counter()
                    tps = (self.tokens - last_tokens) / max(now - last_log, 1e-9)
                    last_log, last_tokens = now, self.tokens
                    self._metric(self._train_record(out, loss, tps))
                    bar.update(self.step, loss=loss, lr=out["lr"], tps=tps)
                else:
                    bar.update(self.step)
                pause = time.perf_counter()
                if self.step % c.eval_interval == 0 or at_end:
                    losses = self._eval_and_record()
                    bar.note(f"step {self.step}: train {losses['train']:.4f}, val {losses['val']:.4f}")
                if self.step % c.checkpoint_every == 0 or at_end:
                    self.save_checkpoint(final=at_end)
                if self.step % c.eval_interval == 0 or self.step % c.checkpoint_every == 0 or at_end:
                    last_log, last_tokens = time.perf_counter(), self.tokens  # tokens/s counts training time only
                    paused += last_log - pause
        return losses, paused

    def _train_record(self, out: dict, loss: float, tps: float) -> dict[str, Any]:
        """The ``train`` line of a logged step: ``out`` of :meth:`train_step`, its mean ``loss`` over the ranks
        (nats) and ``tps`` tokens per second; model FLOP/s and MFU where the FLOPs are known."""
        c = self.config
        record = {
            "kind": "train",
            "step": self.step,
            "tokens": self.tokens,
            "loss": loss,  # this step's batch (eval lines hold the estimates)
            "lr": out["lr"],
            "grad_norm": float(out["grad_norm"]),
            **({"mtp_loss": float(self.procs.mean(out["mtp_loss"]))} if "mtp_loss" in out else {}),
            "tokens_per_s": tps,
            "model_flops_per_s": tps * self.flops_per_token if self.flops_per_token is not None else None,
            "peak_mem_bytes": _peak_memory(self.device),
        }
        if c.peak_flops and self.flops_per_token is not None:
            record["mfu"] = record["model_flops_per_s"] / (c.peak_flops * self.procs.world)
        record.update(out["balance"] or {})  # expert load imbalance of this step (MoE)
        if out["skipped"]:
            record["skipped"] = True  # its batch gave a non-finite loss or gradient: no update
        if self.skipped_steps:
            record["skipped_steps"] = self.skipped_steps
        return record

    def _finished_result(self) -> RunResult:
        """What a resumed run that had already finished returns: its logged losses, with nothing trained again."""
        self._say(
            f"{self.run} already finished its {self.step} steps: nothing to train (a larger --max-steps trains on)"
        )
        evals = [r for r in self.history if r["kind"] == "eval"]
        finals = [r for r in self.history if r["kind"] == "final"]
        loaded = self.procs.broadcast((evals[-1] if evals else {}, finals[-1]["val_loss"] if finals else None))
        return RunResult(
            run_dir=self.run,
            steps=self.step,
            tokens=self.tokens,
            train_loss=loaded[0].get("train_loss"),
            val_loss=loaded[0].get("val_loss"),
            best_val_loss=self.best_val,
            final_val_loss=loaded[1],
            elapsed_s=0.0,
            tokens_per_s=0.0,
            history=self.history,
            skipped_steps=self.skipped_steps,
        )


def train(
    config: Union[TrainConfig, dict, str, Path, None] = None,
    run_dir: Union[str, Path, None] = None,
    *,
    overrides: Optional[dict[str, Any]] = None,
    resume: bool = False,
    progress: bool = False,
    echo: Callable[[str], None] = print,
) -> RunResult:
    """Train a model as a training config says, writing a run folder (see :mod:`modkit.train.state`).

    Args:
        config: a :class:`TrainConfig`, a dict, a JSON file path, or ``None`` for the defaults (nanoGPT's
            shakespeare-char GPT on the shipped tiny shakespeare). Ignored with ``resume`` (the run's own
            ``config.json`` is used, with ``overrides`` on top).
        run_dir: the run folder; default ``runs/<model name>``.
        overrides: config fields to replace (what command-line flags give).
        resume: continue the run in ``run_dir`` from its last checkpoint, with the same losses as an
            uninterrupted run (bitwise on one process in float32).
        progress: show a progress bar.
        echo: where status lines go (rank 0 only).

    Returns:
        :class:`RunResult` (on every rank; the sample on rank 0 only).

    Raises:
        SpecError: an invalid training config or model spec (every field named).
        TrainError: a config that does not fit the model or data, a run folder that already holds a run, a
            ``model`` override on resume whose spec differs from the run's, a step that is not finite.
        DataError: unreadable or malformed data.
        CheckpointError: a resume from a damaged or mismatched checkpoint.
    """
    from .config import load_train_config

    if resume:
        if run_dir is None:
            raise TrainError("resume needs the run folder")
        run = Path(run_dir)
        if not (run / "config.json").is_file() or not (run / "data.json").is_file():
            raise TrainError(f"--resume {run}: not a run folder (no config.json / data.json)")
        # the run's own resolved spec and data folder: relative paths of the original config no longer matter
        data_folder = run_data_folder(run)
        # an explicit data override is read (its tokenizer is checked against the run's), not dropped
        data = (overrides or {}).get("data") or data_folder
        fixed = {"model": str((run / "spec.json").resolve()), "vocab_size": "spec", "data": data}
        cfg, _ = load_train_config(run / "config.json", {**(overrides or {}), **fixed})
        if (overrides or {}).get("model") is not None:
            check_resume_model(run, overrides, data_folder)
        base = None  # every path in `fixed` is absolute
    else:
        cfg, base = load_train_config(config, overrides)
        if run_dir is None:
            run_dir = _fresh_run_dir(cfg)
    trainer = Trainer(cfg, run_dir, base_dir=base, resume=resume, progress=progress, echo=echo)
    try:
        trainer.setup()
        warning = schedule_warning(cfg)
        if warning and not resume:
            trainer._say(f"warning: {warning}")
        result = trainer.fit()
    except BaseException:
        trainer.close_trackers(ok=False)
        raise
    trainer.close_trackers(ok=True)
    trainer.procs.close()  # under torchrun: the group this run joined, left once every rank has finished
    return result


def _fresh_run_dir(config: TrainConfig) -> Path:
    """``runs/<model name>``, or ``runs/<model name>-2``, ``-3``... when taken."""
    name = (
        Path(config.model).stem
        if isinstance(config.model, str)
        else (str(config.model.get("name") or "model") if isinstance(config.model, dict) else DEFAULT_MODEL["name"])
    )
    candidate, n = Path("runs") / name, 1
    while candidate.exists():
        n += 1
        candidate = Path("runs") / f"{name}-{n}"
    return candidate

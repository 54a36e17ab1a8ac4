"""The run folder of a training run as the trainer writes and reads it: its files at the start, the metrics lines,
the resumable step checkpoints and the ``best`` model, their pruning, and the resume from the last checkpoint.

The files themselves (their layout, atomic publication, pruning, RNG state) are :mod:`modkit.train.state`'s; this
module is the trainer's side of it, a mixin of :class:`modkit.train.loop.Trainer`.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from torch import nn

from modkit.core.errors import CheckpointError
from modkit.io.checkpoint import save as save_checkpoint
from modkit.nn.build import build
from ..spec import ModelSpec
from . import state as st
from .provenance import component_provenance
from .errors import TrainError


class CheckpointMixin:
    """The run-folder methods of :class:`modkit.train.loop.Trainer`: they read the attributes its ``setup`` sets
    (``config``, ``run``, ``procs``, ``device``, ``data``, ``spec``, ``model``, ``optimizer``, ``scaler``,
    ``sampler``, ``param_names``, ``step``, ``tokens``, ``best_val``, ``history``)."""

    def _load_weights(self, model: nn.Module, folder: Path) -> None:
        """``folder``'s ``model.safetensors`` into ``model`` (consolidated weights into the shards under several
        processes). Raises :class:`CheckpointError` when they do not fit the model."""
        from safetensors.torch import load_file

        if self.procs.distributed:
            from ..parallel import load_consolidated

            load_consolidated(folder / "model.safetensors", model)
        else:
            try:
                model.load_state_dict(load_file(str(folder / "model.safetensors"), device=str(self.device)))
            except (RuntimeError, OSError) as exc:
                raise CheckpointError(f"{folder}: the weights do not fit the run's model: {exc}") from None

    # ------------------------------------------------------------------ run files
    def _start_run_folder(self, spec: ModelSpec) -> None:
        """Write a fresh run folder's files (rank 0). Raises :class:`TrainError` when it already holds a run."""
        taken = self.procs.broadcast((self.run / "config.json").is_file())  # rank 0's view, before it writes
        if taken:
            raise TrainError(
                f"run folder {self.run} already holds a run; resume it with --resume {self.run} or choose another -o"
            )
        if not self.procs.main:
            return
        self.run.mkdir(parents=True, exist_ok=True)
        (self.run / "checkpoints").mkdir(exist_ok=True)
        (self.run / "config.json").write_text(self.config.model_dump_json(indent=2) + "\n")
        (self.run / "spec.json").write_text(spec.to_json() + "\n")
        self.data.tokenizer.save(self.run / st.TOKENIZER_FILE)
        source = {"folder": str(self.data.path), "meta": self.data.meta}
        (self.run / "data.json").write_text(json.dumps(source, indent=1) + "\n")
        components = component_provenance(spec)  # {kind/type: {provider, distribution, version}}
        (self.run / "components.json").write_text(json.dumps(components, indent=1) + "\n")
        (self.run / "metrics.jsonl").write_text("")

    def _metric(self, record: dict) -> None:
        """Append ``record`` to the history and (rank 0) as one line to ``metrics.jsonl``."""
        self.history.append(record)
        if self.procs.main:
            with open(self.run / "metrics.jsonl", "a") as f:
                f.write(json.dumps(record) + "\n")

    # ------------------------------------------------------------------ checkpoints
    def _save_model_folder(self, folder: Path) -> None:
        """An ordinary modkit checkpoint of the current weights into ``folder`` (rank 0 writes; collective)."""
        if self.procs.distributed:
            from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

            sd = get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
            if self.procs.main:
                whole = build(self.spec, device="meta")
                whole.load_state_dict(sd, assign=True)
                save_checkpoint(whole, folder)
        else:
            save_checkpoint(self.model, folder)
        if self.procs.main:
            self.data.tokenizer.save(folder / st.TOKENIZER_FILE)

    def _trainer_state(self) -> dict:
        return {
            "step": self.step,
            "tokens": self.tokens,
            "best_val_loss": self.best_val,
            "sampler": self.sampler.state_dict(),
            "scaler": self.scaler.state_dict() if self.scaler.is_enabled() else None,
            "param_names": self.param_names,
            "world": self.procs.world,
            "tp": self.procs.tp,
        }

    def save_checkpoint(self, final: bool) -> Path:
        """A resumable checkpoint of the current step; ``last`` points to it. Collective under several processes."""
        name = f"step-{self.step:07d}"
        final_dir = self.run / "checkpoints" / name
        tmp = self.run / "checkpoints" / f".{name}.tmp-{os.getpid()}"
        tmp = Path(self.procs.broadcast(str(tmp)))
        if self.procs.main:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
        self.procs.barrier()
        if self.procs.distributed:
            from ..parallel import save_sharded
            from safetensors.torch import save_file

            save_sharded(tmp / "dcp", self.model, self.optimizer)
            save_file(st.rng_tensors(), str(tmp / f"rng-rank{self.procs.rank}.safetensors"))
            if final:
                self._save_model_folder(tmp)
            if self.procs.main:
                st.write_trainer_files(tmp, self.optimizer, self._trainer_state(), with_optimizer=False)
        else:
            self._save_model_folder(tmp)
            st.write_trainer_files(tmp, self.optimizer, self._trainer_state())
        self.procs.barrier()
        if self.procs.main:
            st.publish(tmp, final_dir)
            st.point(self.run / "last", final_dir)
            st.prune(self.run, self.config.keep_checkpoints)
        self.procs.barrier()
        return final_dir

    def save_best(self) -> None:
        """The model-only ``best`` checkpoint (collective)."""
        folder = self.run / "checkpoints" / f"best-{self.step:07d}"
        tmp = folder.with_name(f".{folder.name}.tmp-{os.getpid()}")
        tmp = Path(self.procs.broadcast(str(tmp)))
        self._save_model_folder(tmp)
        if self.procs.main:
            st.publish(tmp, folder)
            st.point(self.run / "best", folder)
            st.prune(self.run, self.config.keep_checkpoints)
        self.procs.barrier()

    def _restore(self) -> None:
        """Continue from the last checkpoint: weights, optimizer, RNG, sampler, counters; the metrics after it dropped.

        Raises:
            TrainError: no resumable checkpoint, or a sharded one on one process.
            CheckpointError: the checkpoint's parameters differ from the model's.
        """
        if self.procs.main:  # what a killed run's interrupted saves left (.step-*.tmp-PID folders, *.old, links)
            st.clean_temporaries(self.run / "checkpoints")
            st.clean_temporaries(self.run)
        self.procs.barrier()
        last = self.run / "last"
        found = st.step_checkpoints(self.run)
        folder = last.resolve() if last.exists() else (found[-1] if found else None)
        if folder is None:
            raise TrainError(f"{self.run} holds no resumable checkpoint yet; start it again without --resume")
        trainer, tensors = st.read_trainer_files(folder)
        if trainer.get("param_names") != self.param_names:
            raise CheckpointError(
                f"{folder}: the checkpoint's parameters differ from the run's model (was the spec edited?)"
            )
        if self.procs.distributed:
            from safetensors.torch import load_file

            from ..parallel import load_sharded

            if trainer.get("world") != self.procs.world or trainer.get("tp") != self.procs.tp:
                self._say(
                    f"resuming a {trainer.get('world')}-process run on {self.procs.world} processes "
                    f"(tp {self.procs.tp})"
                )
            load_sharded(folder / "dcp", self.model, self.optimizer)
            rng = folder / f"rng-rank{self.procs.rank}.safetensors"
            if rng.is_file():
                st.restore_rng(load_file(str(rng)))
        else:
            if not (folder / "dcp").exists():
                self._load_weights(self.model, folder)
                self.optimizer.load_state_dict(st.optimizer_from_files(tensors, trainer["optimizer"]))
            else:
                raise TrainError(
                    f"{folder} was saved sharded by {trainer.get('world')} processes; resume it under torchrun"
                )
            st.restore_rng(tensors)
        self.step, self.tokens = int(trainer["step"]), int(trainer["tokens"])
        self.best_val = trainer.get("best_val_loss")
        self.sampler.load_state_dict(trainer["sampler"])
        if trainer.get("scaler") and self.scaler.is_enabled():
            self.scaler.load_state_dict(trainer["scaler"])
        # the metrics after the checkpoint are redone: drop them so the file reads as one uninterrupted run
        path = self.run / "metrics.jsonl"
        if self.procs.main and path.is_file():
            lines = path.read_text().splitlines()
            kept = [line for line in lines if line.strip() and json.loads(line)["step"] <= self.step]
            path.write_text("".join(line + "\n" for line in kept))
            self.history = [json.loads(line) for line in kept]
        self._say(f"resumed {self.run} at step {self.step} ({self.tokens:,} tokens) from {folder.name}")

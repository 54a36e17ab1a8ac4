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
from typing import Optional

from torch import nn

from modkit.core.errors import CheckpointError
from modkit.core.validation import json_value
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
        processes).

        Raises:
            CheckpointError: the file is unreadable (damaged or truncated), holds NaN or infinite values, or its
                tensors do not fit the model; each names the file.
        """
        from safetensors.torch import load_file

        from modkit.io.checkpoint.state import report_nonfinite

        path = folder / "model.safetensors"
        if self.procs.distributed:
            from ..parallel import load_consolidated

            load_consolidated(path, model)
            return
        try:
            tensors = load_file(str(path), device=str(self.device))
        except Exception as exc:  # safetensors raises its own error types
            raise CheckpointError(
                f"{path}: unreadable ({type(exc).__name__}: {exc}); the file is damaged or truncated"
            ) from None
        report_nonfinite(tensors, str(path), "error")
        try:
            model.load_state_dict(tensors)
        except (RuntimeError, OSError) as exc:
            raise CheckpointError(f"{folder}: the weights do not fit the run's model: {exc}") from None

    # ------------------------------------------------------------------ run files
    def _start_run_folder(self, spec: ModelSpec) -> None:
        """Write a fresh run folder's files (rank 0), ``config.json`` last and atomically: a folder without it is
        not a run yet and a later ``-o`` starts it afresh.

        Raises:
            TrainError: the folder already holds a run (its ``config.json``); one without a complete checkpoint is
                started again by ``--resume`` (the message says so).
        """
        taken = self.procs.broadcast((self.run / "config.json").is_file())  # rank 0's view, before it writes
        if taken:
            if not self.procs.broadcast(bool(st.step_checkpoints(self.run))):
                raise TrainError(
                    f"run folder {self.run} already holds a run with no complete checkpoint (it stopped before its "
                    f"first save); start it again from step 0 with its own config: --resume {self.run}; or remove the "
                    "folder, or choose another -o, to start one with this config"
                )
            raise TrainError(
                f"run folder {self.run} already holds a run; resume it with --resume {self.run} or choose another -o"
            )
        if not self.procs.main:
            return
        self.run.mkdir(parents=True, exist_ok=True)
        (self.run / "checkpoints").mkdir(exist_ok=True)
        st.clean_temporaries(self.run / "checkpoints")  # what an earlier, interrupted start left
        st.clean_temporaries(self.run)
        (self.run / "spec.json").write_text(spec.to_json() + "\n")
        self.data.tokenizer.save(self.run / st.TOKENIZER_FILE)
        source = {"folder": str(self.data.path), "meta": self.data.meta}
        (self.run / "data.json").write_text(json.dumps(source, indent=1) + "\n")
        components = component_provenance(spec)  # {kind/type: {provider, distribution, version}}
        (self.run / "components.json").write_text(json.dumps(components, indent=1) + "\n")
        (self.run / "metrics.jsonl").write_text("")
        tmp = self.run / f".config.json.tmp-{os.getpid()}"
        tmp.write_text(self.config.model_dump_json(indent=2) + "\n")
        os.replace(tmp, self.run / "config.json")

    def _metric(self, record: dict) -> None:
        """Append ``record`` to the history and (rank 0) as one line to ``metrics.jsonl`` and to the trackers."""
        self.history.append(record)
        if self.procs.main:
            with open(self.run / "metrics.jsonl", "a") as f:
                f.write(json.dumps(record) + "\n")
            trackers = getattr(self, "trackers", None)
            if trackers:  # the experiment trackers (modkit.train.trackers), rank 0 only
                trackers.log_metrics(record)

    # ------------------------------------------------------------------ checkpoints
    def _save_model_folder(self, folder: Path) -> None:
        """An ordinary modkit checkpoint of the current weights into ``folder`` (rank 0 writes; collective)."""
        if self.pipe is not None:  # every stage's weights, to rank 0
            from .pipelined import gather_full_state

            sd = gather_full_state(self.model)
            if self.procs.main:
                whole = build(self.spec, device="meta")
                whole.load_state_dict(sd, assign=True)
                save_checkpoint(whole, folder)
        elif self.procs.distributed:
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
            "param_names": self.all_param_names,  # the whole model's (under pp too)
            "world": self.procs.world,
            "tp": self.procs.tp,
            "ep": self.procs.ep,
            "pp": self.procs.pp,
            # the DCP optimizer state with one param-group entry per parameter (any layout, pipeline stages too)
            "flat_optimizer": self.procs.distributed,
            "skipped_steps": self.skipped_steps,
            "consecutive_skips": self.consecutive_skips,
        }

    def save_checkpoint(self, final: bool) -> Path:
        """A resumable checkpoint of the current step; ``last`` points to it, then older ones are pruned. Collective
        under several processes.

        Raises:
            TrainError: the weights or the optimizer state hold NaN or infinite values (checked before anything is
                written: the previous checkpoint stays ``last`` and nothing is pruned).
        """
        name = f"step-{self.step:07d}"
        self._verify_finite(name)
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

            save_sharded(tmp / "dcp", self.model, self.optimizer, flatten_optimizer=True)
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

    def _saved_note(self) -> str:
        """Where the run's last checkpoint stands, for the message of an error that stops the run."""
        last = self.run / "last"
        if last.is_symlink() and last.exists():
            return f"nothing of this step was saved; {last} is still {last.resolve().name}, resume from it with --resume {self.run}"
        return "nothing of this step was saved; the run has no checkpoint yet"

    def _verify_finite(self, name: str) -> None:
        """Refuse to save checkpoint ``name`` from weights or (one process) optimizer state with NaN or infinite
        values. Collective.

        Raises:
            TrainError: naming the checkpoint, the tensors and the count of bad values in each.
        """
        self._check_weights(f"refusing to save {name}: the weights", step=self.step)
        if self.procs.distributed:
            return
        from modkit.io.checkpoint.state import nonfinite_counts

        counts = nonfinite_counts(st.optimizer_to_files(self.optimizer)[0])
        if counts:
            listed = ", ".join(f"{n} ({c:,})" for n, c in list(counts.items())[:5])
            raise TrainError(
                f"step {self.step}: refusing to save {name}: the optimizer state holds NaN or infinite values: "
                f"{listed}; {self._saved_note()}"
            )

    def _resume_folder(self) -> Optional[Path]:
        """The checkpoint a resume continues from: the one ``last`` leads to (inside the run folder), else the
        newest complete step checkpoint (with a note naming the dangling link); ``None`` when there is none. Entries
        named ``step-*`` that are not complete checkpoints are left alone, with a note naming each.

        Raises:
            CheckpointError: ``last`` leads outside the run folder.
        """
        for stray, why in st.ignored_step_entries(self.run):
            self._note(f"ignored {stray}: {why}; left in place")
        last = self.run / "last"
        found = st.step_checkpoints(self.run)
        if last.is_symlink() or last.exists():
            target = last.resolve()
            if not target.is_relative_to(self.run.resolve()):
                raise CheckpointError(
                    f"{last} leads outside the run folder, to {target}; --resume reads only the run's own "
                    f"checkpoints: point it at one of them (ln -sfn checkpoints/step-NNNNNNN {last})"
                )
            if target.exists():
                return target
            newest = f"resuming from the newest complete checkpoint, {found[-1].name}" if found else "no checkpoint"
            self._note(
                f"{last} leads to {target}, which does not exist; {newest} (to resume from another, point the link "
                f"at it: ln -sfn checkpoints/step-NNNNNNN {last})"
            )
        return found[-1] if found else None

    def _older_hint(self, folder: Path) -> str:
        """How to resume from a checkpoint older than the damaged ``folder``."""
        older = [p for p in st.step_checkpoints(self.run) if p.resolve() != folder.resolve()]
        if not older:
            return f"the run has no other checkpoint: start a new run, or restore {folder} from a backup"
        return (
            f"to resume from the checkpoint before it, point the link at it "
            f"(ln -sfn checkpoints/{older[-1].name} {self.run / 'last'}) and run --resume {self.run} again"
        )

    def _restore(self) -> None:
        """Continue from the last checkpoint: weights, optimizer, RNG, sampler, counters; the metrics after it dropped.
        Every file is checked before anything is loaded (:mod:`modkit.train.checks`). A run without a complete
        checkpoint starts again from step 0.

        Raises:
            CheckpointError: a damaged or mismatched checkpoint (names the file, the field or tensor, the value and
                the older checkpoint to resume from); ``last`` leading outside the run; a malformed metrics line.
        """
        if self.procs.main:  # what a killed run's interrupted saves left (.step-*.tmp-PID folders, *.old, links)
            st.clean_temporaries(self.run / "checkpoints")
            st.clean_temporaries(self.run)
        self.procs.barrier()
        self._check_run_tokenizer()
        folder = self._resume_folder()
        if folder is None:
            self._say(
                f"{self.run} holds no complete checkpoint: starting it again from step 0 with its own config "
                "(interrupted saves removed)"
            )
            self._restore_metrics(again=True)
            return
        try:
            trainer = self._restore_state(folder)
        except CheckpointError as exc:
            raise CheckpointError(f"{exc}; {self._older_hint(folder)}") from None
        self._restore_metrics()
        self._say(f"resumed {self.run} at step {self.step} ({self.tokens:,} tokens) from {folder.name}")
        if trainer.get("skipped_steps"):
            self._say(f"{trainer['skipped_steps']} step(s) of the run so far were skipped as non-finite")

    def _check_run_tokenizer(self) -> None:
        """The run's ``tokenizer.json`` must be readable and the data's tokenizer (``--data`` may name other data):
        ids of another vocabulary mean other tokens to the model trained so far.

        Raises:
            CheckpointError: naming the file and the fix; or the run's and the data's tokenizers and a token they
                number differently.
        """
        from ..data import load_tokenizer
        from modkit.core.errors import DataError
        from ..data.tokenizer import vocab_difference

        path = self.run / st.TOKENIZER_FILE
        try:
            ours = load_tokenizer(path)
        except DataError as exc:
            raise CheckpointError(
                f"{path}: the run's tokenizer does not load ({exc}); every checkpoint holds a copy: "
                f"cp {self.run / 'last' / st.TOKENIZER_FILE} {path}"
            ) from None
        differs = vocab_difference(ours, self.data.tokenizer, "the run", "the data")
        if differs:
            raise CheckpointError(
                f"data {self.data.path} was tokenized with another tokenizer ({self.data.tokenizer.spec}) than the "
                f"run's {path}: {differs}, so its ids mean other tokens to the model; resume on the run's own data "
                "(drop --data), or prepare the text with the run's tokenizer"
            )

    def _restore_state(self, folder: Path) -> dict:
        """Check and load ``folder``'s trainer state, weights, optimizer state and RNG; returns ``trainer.json``.

        Raises:
            CheckpointError: a damaged or mismatched file. A sharded (DCP) checkpoint loads on any layout, one
                process included.
        """
        from .checks import check_optimizer_state, check_rng, check_trainer_json

        trainer, tensors = st.read_trainer_files(folder)
        jpath, tpath = folder / st.TRAINER_JSON, folder / st.TRAINER_TENSORS
        sharded = (folder / "dcp").exists()
        check_trainer_json(trainer, jpath, folder_step=st.folder_step(folder), with_optimizer=not sharded)
        if trainer["param_names"] != self.all_param_names:
            raise CheckpointError(
                f"{folder}: the checkpoint's parameters differ from the run's model (was the spec edited?)"
            )
        check_rng(tensors, tpath)
        if self.procs.distributed or sharded:  # DCP reshards, onto one process too
            self._restore_sharded(folder, trainer)
        else:
            check_optimizer_state(tensors, trainer["optimizer"], self.optimizer, self.model, trainer["step"], tpath)
            self._load_weights(self.model, folder)
            try:
                self.optimizer.load_state_dict(st.optimizer_from_files(tensors, trainer["optimizer"]))
            except (ValueError, KeyError, TypeError, RuntimeError) as exc:
                raise CheckpointError(f"{tpath}: the optimizer state does not load: {exc}") from None
            st.restore_rng(tensors)
        self.step, self.tokens = trainer["step"], trainer["tokens"]
        self.best_val = trainer.get("best_val_loss")
        self.skipped_steps = trainer.get("skipped_steps", 0)
        self.consecutive_skips = trainer.get("consecutive_skips", 0)
        for field, target in (("sampler", self.sampler), ("scaler", self.scaler)):
            value = trainer.get(field)
            if field == "scaler" and not (value and self.scaler.is_enabled()):
                continue
            try:
                target.load_state_dict(value)
            except (ValueError, KeyError, TypeError, RuntimeError) as exc:
                raise CheckpointError(
                    f"{jpath}: {field} = {json_value(value, 80)} does not fit the run: {exc}"
                ) from None
        return trainer

    def _restore_sharded(self, folder: Path, trainer: dict) -> None:
        """Load a checkpoint saved sharded (``dcp/``) and this rank's RNG state (collective)."""
        from safetensors.torch import load_file

        from ..parallel import load_sharded

        was = (trainer.get("world"), trainer.get("tp"), trainer.get("pp", 1))
        if was != (self.procs.world, self.procs.tp, self.procs.pp):
            self._say(
                f"resuming a {was[0]}-process run (tp {was[1]}, pp {was[2]}) on {self.procs.world} processes "
                f"(tp {self.procs.tp}, pp {self.procs.pp})"
            )
        load_sharded(folder / "dcp", self.model, self.optimizer, flatten_optimizer=bool(trainer.get("flat_optimizer")))
        rng = folder / f"rng-rank{self.procs.rank}.safetensors"
        if rng.is_file():
            try:
                tensors = load_file(str(rng))
            except Exception as exc:  # safetensors raises its own error types
                raise CheckpointError(f"{rng}: unreadable ({type(exc).__name__}: {exc})") from None
            from .checks import check_rng

            check_rng(tensors, rng)
            st.restore_rng(tensors)

    def _restore_metrics(self, again: bool = False) -> None:
        """Drop the metrics lines after the resumed step (they are redone, so the file reads as one uninterrupted
        run; every line when the run starts ``again`` from step 0) and load the rest as the history; a last line cut
        by a kill is dropped with a note.

        Raises:
            CheckpointError: a line that is not a JSON object with an integer ``step`` (names the file and line).
        """
        from .checks import metrics_lines

        path = self.run / "metrics.jsonl"
        if not self.procs.main or not path.is_file():
            return
        notes: list[str] = []
        kept = [(line, r) for line, r in metrics_lines(path, notes) if r["step"] <= self.step and not again]
        for note in notes:
            self._say(note)
        path.write_text("".join(line + "\n" for line, _ in kept))
        self.history = [r for _, r in kept]

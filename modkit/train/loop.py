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
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Union

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from modkit.nn.build import breakdown, build
from modkit.analysis.cost import CostError, training_flops_per_token
from modkit.nn.documents import document_ids
from modkit.io.checkpoint import save as save_checkpoint
from modkit.core.errors import CheckpointError, ModkitError
from ..spec import ModelSpec, iter_configs, load_spec
from . import state as st
from .balance import ExpertBalance
from .config import DEFAULT_MODEL, TrainConfig
from .optim import build_optimizer
from .schedule import lr_at


class TrainError(ModkitError, ValueError):
    """A training run cannot start or continue (bad combination of config, model and data); says what to change."""


# ------------------------------------------------------------------------------------------------- helpers


def flops_per_token(spec: ModelSpec, seq_len: int) -> int:
    """Training FLOPs per token (forward + backward) at ``seq_len``, from the components' FLOPs declarations.

    ``3 x`` the forward FLOPs of one causal sequence of ``seq_len`` tokens divided by ``seq_len``, rounded to an
    integer (:func:`modkit.analysis.cost.training_flops_per_token`): the backward of each matrix product is two products of
    its size (input and weight gradients). Matrix products only, 1 multiply-add = 2 FLOPs; attention counts the
    (query, key) pairs the causal mask lets through, ``(T + 1) / 2`` keys per token on average, where the PaLM
    paper's MFU (Chowdhery et al. 2022, arXiv:2204.02311, appendix B; nanoGPT's ``estimate_mfu``: ``6 N + 12 L H Q
    T``) counts the full ``T`` square, so the attention term here is about half of theirs.
    """
    return training_flops_per_token(spec, seq_len)


def decay_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """Two parameter groups, decay and no decay, by the parameters' roles (:mod:`modkit.core.roles`): hidden and expert
    matrices, embeddings, the head and routers decay; norm gains, biases and vectors do not. nanoGPT's
    ``configure_optimizers`` rule (GPT-3 likewise), read from roles instead of ``p.dim() >= 2`` (which decayed stacked
    expert biases).

    Raises:
        RoleError: a parameter without a role.
    """
    from modkit.core.roles import ROLES, param_roles

    params = dict(model.named_parameters())
    decay, no_decay = [], []
    for name, role in param_roles(model).items():
        if params[name].requires_grad:
            (decay if ROLES[role].decay else no_decay).append(params[name])
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def prepared_data(config: TrainConfig, base: Optional[Path], text_folder: Path, *, show_progress: bool = False) -> Path:
    """The prepared token folder a training config reads, preparing it first when it is not yet.

    ``config.data`` ``None`` is the shipped tiny shakespeare (:func:`modkit.data.default_dataset`, prepared once
    into the cache); a folder with a ``meta.json`` is already prepared and is returned as is; text files (or a
    folder of them) are tokenized with ``config.tokenizer`` into ``text_folder``, unless it already holds them.
    A relative ``config.data`` is relative to ``base`` (the config file's folder).

    Raises:
        TrainError: ``config.data`` does not exist.
        DataError: the text cannot be read or tokenized.
    """
    from ..data import default_dataset, prepare

    if config.data is None:
        return default_dataset()
    path = Path(config.data)
    if not path.is_absolute() and base is not None:
        path = base / path
    if not path.exists():
        raise TrainError(f"data = {config.data!r}: {path} does not exist; give a prepared data folder or text files")
    if path.is_dir() and (path / "meta.json").is_file():
        return path
    if not (text_folder / "meta.json").is_file():
        prepare([path], text_folder, tokenizer=config.tokenizer, show_progress=show_progress)
    return text_folder


def _resolve_device(text: str) -> torch.device:
    if text == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(text)
    except RuntimeError:
        raise TrainError(f"device = {text!r} is not a device; use cpu, cuda, cuda:N, mps or auto") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise TrainError(f"device = {text!r} but CUDA is not available here; use --device cpu")
    return device


def _node(data: dict, path: str) -> dict:
    """The dict at a JSON path such as ``block.ffn.router`` or ``overrides[0].ffn`` of a spec dict."""
    from modkit.core.validation import resolve_path

    return resolve_path(data, path)


def resolve_spec(config: TrainConfig, base: Optional[Path], vocab_size: int) -> ModelSpec:
    """The model spec of a run: ``config.model`` (file, inline object, checkpoint folder or the default) with the
    vocabulary and auxiliary-loss overrides applied, validated.

    Raises:
        SpecError: the spec is invalid (paths as in the spec).
        TrainError: the vocabulary or context does not fit the data and config.
    """
    model = config.model
    source: Any = DEFAULT_MODEL if model is None else model
    if isinstance(model, str):
        source = Path(model)
        if not source.is_absolute() and base is not None:
            source = base / source
        if source.is_dir():
            source = source / "spec.json"
        if not source.is_file():
            raise TrainError(f"model = {model!r}: no spec file at {source}; give a spec JSON file, a modkit checkpoint folder or an inline spec")
    data = load_spec(source).to_dict()  # a fresh dict with every default written out, so overrides find their slots
    if config.vocab_size == "data":
        data["vocab_size"] = vocab_size
    for name in ("aux_loss_coef", "z_loss_coef", "bias_update_speed"):  # a convention on field names: the core names no component
        value = getattr(config, name)
        if value is None:
            continue
        holders = [path for path, cfg in iter_configs(load_spec(data)) if name in type(cfg).model_fields]
        if not holders:
            raise TrainError(f"{name} = {value} but no component of the model has a field {name!r}; set it to null")
        for path in holders:
            _node(data, path)[name] = value
    spec = load_spec(data)
    if spec.vocab_size < vocab_size:
        raise TrainError(
            f"the model's vocab_size = {spec.vocab_size} is smaller than the tokenizer's {vocab_size}; "
            "set vocab_size to 'data' in the training config (or a larger vocab_size in the spec)"
        )
    if config.seq_len > spec.max_seq_len:
        raise TrainError(f"seq_len = {config.seq_len} exceeds the model's max_seq_len = {spec.max_seq_len}; lower seq_len")
    return spec


def check_document_mask(spec: ModelSpec, data) -> None:
    """Refuse ``document_mask`` when the data has no document separators or an attention cannot honour it.

    Raises:
        TrainError: names the data folder and what to prepare, or every layer whose attention lacks the
            ``document_mask`` capability.
    """
    from modkit.nn.documents import document_mask_problems

    if data.separators == (None, None):
        raise TrainError(
            f"document_mask = true, but {data.path} holds no document separators (prepared with --eot none, or before "
            "modkit separated documents); prepare it again with `modkit data prepare ... --eot auto`, or set "
            "document_mask to false"
        )
    problems = document_mask_problems(spec)
    if problems:
        raise TrainError("document_mask = true: " + "; ".join(f"{path}: {msg}" for path, msg in problems))


# ------------------------------------------------------------------------------------------------- processes


@dataclass
class Processes:
    """The process layout of a run: ``world = dp * tp`` ranks on a ``("dp", "tp")`` mesh (one process: all 1)."""

    world: int = 1
    rank: int = 0
    dp: int = 1
    dp_rank: int = 0
    tp: int = 1
    mesh: Any = None

    @property
    def main(self) -> bool:
        """Rank 0 writes the run folder's shared files."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        """More than one process."""
        return self.world > 1

    def barrier(self) -> None:
        """Wait for every rank (no-op on one process)."""
        if self.distributed:
            torch.distributed.barrier()

    def mean(self, value: Tensor) -> Tensor:
        """The mean of a scalar tensor over all ranks (tensor-parallel replicas hold equal values)."""
        if not self.distributed:
            return value
        from ..parallel import mean_across_ranks

        return mean_across_ranks(value)

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every rank."""
        if not self.distributed:
            return obj
        box = [obj]
        torch.distributed.broadcast_object_list(box, src=0)
        return box[0]


def init_processes(config: TrainConfig, device: torch.device) -> Processes:
    """Join the process group that ``torchrun`` describes (``WORLD_SIZE`` > 1) and build the mesh.

    gloo on the CPU, NCCL on CUDA (each rank on ``cuda:LOCAL_RANK``). One process: nothing to do.

    Raises:
        TrainError: ``tp`` does not divide the world size, or ``batch_size`` is not divisible by the data-parallel degree.
    """
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        if config.tp > 1:
            raise TrainError(f"tp = {config.tp} needs {config.tp} processes or more: launch with torchrun --nproc-per-node N")
        return Processes()
    import torch.distributed as dist

    from ..parallel import make_mesh

    if not dist.is_initialized():
        if device.type == "cuda":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    world, rank = dist.get_world_size(), dist.get_rank()
    if world % config.tp:
        raise TrainError(f"tp = {config.tp} does not divide the number of processes {world}")
    dp = world // config.tp
    if config.batch_size % dp:
        raise TrainError(f"batch_size = {config.batch_size} is not divisible by the {dp} data-parallel processes")
    mesh = make_mesh(tp=config.tp, dp=dp, device_type=device.type)
    return Processes(world=world, rank=rank, dp=dp, dp_rank=mesh.get_local_rank("dp"), tp=config.tp, mesh=mesh)


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
    elapsed_s: float
    tokens_per_s: float
    sample: Optional[str] = None
    history: list[dict] = field(default_factory=list)


def _peak_memory(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    try:
        import resource

        return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # kilobytes on Linux
    except (ImportError, OSError):  # pragma: no cover - non-POSIX
        return 0


class Trainer:
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
        if self.procs.main:
            self.echo(line)

    def _open_data(self):
        from ..data import TokenData

        folder = prepared_data(self.config, self.base, self.run / "data", show_progress=self.progress) if self.procs.main else None
        self.procs.barrier()
        # the other ranks find the folder rank 0 prepared (the same call, now with nothing to do)
        return TokenData.open(folder or prepared_data(self.config, self.base, self.run / "data"))

    def _build(self, spec: ModelSpec) -> nn.Module:
        c = self.config
        if self.procs.distributed:
            from ..parallel import build_parallel

            model = build_parallel(spec, self.procs.mesh, device=self.device, seed=c.seed)
        else:
            model = build(spec, device=self.device, seed=c.seed)
        source = Path(c.model) if isinstance(c.model, str) else None
        if source is not None and not source.is_absolute() and self.base is not None:
            source = self.base / source
        if source is not None and source.is_dir() and (source / "model.safetensors").is_file() and not self.resume:
            self._load_weights(model, source)
            self._say(f"weights from {source}")
        return model

    def _load_weights(self, model: nn.Module, folder: Path) -> None:
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
        taken = self.procs.broadcast((self.run / "config.json").is_file())  # rank 0's view, before it writes
        if taken:
            raise TrainError(f"run folder {self.run} already holds a run; resume it with --resume {self.run} or choose another -o")
        if not self.procs.main:
            return
        self.run.mkdir(parents=True, exist_ok=True)
        (self.run / "checkpoints").mkdir(exist_ok=True)
        (self.run / "config.json").write_text(self.config.model_dump_json(indent=2) + "\n")
        (self.run / "spec.json").write_text(spec.to_json() + "\n")
        self.data.tokenizer.save(self.run / st.TOKENIZER_FILE)
        (self.run / "data.json").write_text(json.dumps({"folder": str(self.data.path), "meta": self.data.meta}, indent=1) + "\n")
        (self.run / "metrics.jsonl").write_text("")

    def _metric(self, record: dict) -> None:
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
            raise CheckpointError(f"{folder}: the checkpoint's parameters differ from the run's model (was the spec edited?)")
        if self.procs.distributed:
            from safetensors.torch import load_file

            from ..parallel import load_sharded

            if trainer.get("world") != self.procs.world or trainer.get("tp") != self.procs.tp:
                self._say(f"resuming a {trainer.get('world')}-process run on {self.procs.world} processes (tp {self.procs.tp})")
            load_sharded(folder / "dcp", self.model, self.optimizer)
            rng = folder / f"rng-rank{self.procs.rank}.safetensors"
            if rng.is_file():
                st.restore_rng(load_file(str(rng)))
        else:
            if not (folder / "dcp").exists():
                self._load_weights(self.model, folder)
                self.optimizer.load_state_dict(st.optimizer_from_files(tensors, trainer["optimizer"]))
            else:
                raise TrainError(f"{folder} was saved sharded by {trainer.get('world')} processes; resume it under torchrun")
            st.restore_rng(tensors)
        self.step, self.tokens = int(trainer["step"]), int(trainer["tokens"])
        self.best_val = trainer.get("best_val_loss")
        self.sampler.load_state_dict(trainer["sampler"])
        if trainer.get("scaler") and self.scaler.is_enabled():
            self.scaler.load_state_dict(trainer["scaler"])
        # the metrics after the checkpoint are redone: drop them so the file reads as one uninterrupted run
        path = self.run / "metrics.jsonl"
        if self.procs.main and path.is_file():
            kept = [line for line in path.read_text().splitlines() if line.strip() and json.loads(line)["step"] <= self.step]
            path.write_text("".join(line + "\n" for line in kept))
            self.history = [json.loads(line) for line in kept]
        self._say(f"resumed {self.run} at step {self.step} ({self.tokens:,} tokens) from {folder.name}")

    # ------------------------------------------------------------------ steps
    def _autocast(self):
        p = self.config.precision
        if p == "float32":
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=torch.bfloat16 if p == "bfloat16" else torch.float16)

    def _forward(self, x: Tensor) -> tuple[Tensor, Optional[Tensor]]:
        """``(logits [rows, seq, vocab] as full tensors, aux_loss or None)`` under the run's precision; with
        ``document_mask`` the document ids of the batch come from its end-of-text / begin-of-text tokens."""
        docs = document_ids(x, eot_id=self.separators[0], bos_id=self.separators[1]) if self.config.document_mask else None
        with self._autocast():
            out = self.forward(x) if docs is None else self.forward(x, documents=docs)
        logits = out.logits
        if hasattr(logits, "full_tensor"):  # a DTensor head output under tensor parallelism
            logits = logits.full_tensor()
        return logits, out.aux_loss

    def _loss(self, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        """``(total loss for backward, cross-entropy alone)`` of one micro-batch: mean over every position."""
        logits, aux = self._forward(x)
        ce = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1))
        total = ce if aux is None else ce + aux.float()
        return total, ce.detach()

    def _rows(self, t: Tensor) -> Tensor:
        return t.to(self.device, non_blocking=True)

    def train_step(self) -> dict:
        """One optimizer step; returns its loss, learning rate and gradient norm (as tensors until logged)."""
        c = self.config
        lr = lr_at(self.step, c)
        for group in self.optimizer.param_groups:
            group["lr"] = lr * group.get("lr_mult", 1.0)  # 1, or muP's factor for the group's roles
        ce_sum = torch.zeros((), device=self.device)
        self.balance.begin_step()
        for micro in range(c.grad_accum):
            if self.procs.distributed and hasattr(self.model, "set_requires_gradient_sync"):
                self.model.set_requires_gradient_sync(micro == c.grad_accum - 1)
            x, y = self.sampler.next()
            total, ce = self._loss(self._rows(x), self._rows(y))
            self.scaler.scale(total / c.grad_accum).backward()
            ce_sum += ce
        self.scaler.unscale_(self.optimizer)
        max_norm = c.grad_clip if c.grad_clip is not None else math.inf  # inf: the norm is measured, nothing clipped
        if self.procs.distributed:  # gradients are a mix of plain tensors and DTensor shards
            from ..parallel import clip_grad_norm_

            norm = clip_grad_norm_(self.params, max_norm)
        else:
            norm = torch.nn.utils.clip_grad_norm_(self.params, max_norm)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        balance = self.balance.end_step()  # the routers' bias update from this step's loads (no gradient)
        self.step += 1
        self.tokens += c.tokens_per_step
        return {"loss": ce_sum / c.grad_accum, "lr": lr, "grad_norm": norm, "balance": balance}

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """Mean cross-entropy on the fixed train and validation windows (eval mode: no dropout)."""
        self.model.eval()
        out = {}
        lo, hi = self.procs.dp_rank * self.rows, (self.procs.dp_rank + 1) * self.rows
        for split, batches in (("train", self.eval_train), ("val", self.eval_val)):
            losses = []
            for x, y in batches:
                _, ce = self._loss(self._rows(x[lo:hi]), self._rows(y[lo:hi]))
                losses.append(ce)
            out[split] = float(self.procs.mean(torch.stack(losses).mean()))
        self.model.train()
        return out

    @torch.no_grad()
    def score_split(self, tokens, max_tokens: int) -> float:
        """Mean cross-entropy over the first ``max_tokens`` tokens of ``tokens`` in non-overlapping ``seq_len``
        windows (every position scored once, each with the context its window gives it). Collective: the
        windows are dealt to the data-parallel ranks, sums and counts all-reduced. The UTF-8 bytes of the scored
        targets (:meth:`modkit.data.Tokenizer.token_bytes`) are left in ``self.scored_bytes`` (bits per byte)."""
        c = self.config
        t = c.seq_len
        n = (min(len(tokens), max_tokens + 1) - 1) // t
        if n < 1:
            raise TrainError(f"the validation split has {len(tokens)} tokens, fewer than seq_len + 1 = {t + 1}")
        per = self.rows * self.procs.dp
        sums = torch.zeros(3, dtype=torch.float64, device=self.device)
        table = torch.from_numpy(self.data.tokenizer.token_bytes()).to(self.device)
        self.model.eval()
        for b in range(-(-n // per)):  # every rank runs the same number of forwards (FSDP needs it)
            idx = torch.arange(self.rows) + b * per + self.procs.dp_rank * self.rows
            real = idx < n
            starts = torch.where(real, idx, torch.zeros_like(idx)).numpy() * t
            rows = torch.from_numpy(np.stack([tokens[s : s + t + 1] for s in starts]).astype(np.int64))
            x, y = self._rows(rows[:, :-1]), self._rows(rows[:, 1:])
            logits, _ = self._forward(x)
            ce = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1), reduction="none").view(len(idx), t)
            mask = self._rows(real)[:, None].to(ce.dtype)
            sums += torch.stack([(ce * mask).sum().double(), (mask.sum() * t).double(), (table[y] * mask).sum().double()])
        self.model.train()
        if self.procs.distributed:
            torch.distributed.all_reduce(sums)
        self.scored_bytes = int(sums[2])
        return float(sums[0] / sums[1])

    def _eval_and_record(self) -> dict[str, float]:
        losses, balance = self.balance.measure(self.evaluate)  # expert loads on the fixed eval windows (MoE)
        record = {"kind": "eval", "step": self.step, "tokens": self.tokens, "train_loss": losses["train"], "val_loss": losses["val"]}
        record.update(balance or {})
        self._metric(record)
        if self.best_val is None or losses["val"] < self.best_val:
            self.best_val = losses["val"]
            self.save_best()
        if self.procs.main:
            from .plot import plot_run

            plot_run(self.run / "metrics.jsonl", self.run / "loss.png", title=self.spec.name or "run")
        return losses

    # ------------------------------------------------------------------ main
    def setup(self) -> None:
        """Processes, device, data, spec, model, optimizer, sampler; resume state when asked."""
        from ..data import RandomWindows, SequentialEpochs, eval_batches

        c = self.config
        self.device = _resolve_device(c.device)
        if c.threads is not None:
            torch.set_num_threads(c.threads)
        self.procs = init_processes(c, self.device)
        self.data = self._open_data()
        self.spec = resolve_spec(c, self.base, self.data.vocab_size)
        self.separators = self.data.separators
        if c.document_mask:
            check_document_mask(self.spec, self.data)
        self.history: list[dict] = []
        if not self.resume:
            self._start_run_folder(self.spec)
        elif not (self.run / "config.json").is_file():
            raise TrainError(f"--resume {self.run}: not a run folder (no config.json)")
        self.procs.barrier()
        torch.manual_seed(c.seed + self.procs.dp_rank)  # dropout masks: one stream per data-parallel rank
        self.model = self._build(self.spec)
        self.model.train()
        # routers' expert loads and balancing rules (modkit.nn.balance): summed over the data-parallel ranks
        self.balance = ExpertBalance(self.model, self.procs.mesh["dp"].get_group() if self.procs.distributed else None)
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.param_names = [n for n, p in self.model.named_parameters() if p.requires_grad]
        # the registered optimizer the config names, over the parameters grouped by role (modkit.train.optim);
        # AdamW is fused on one process (one kernel per step on CPU and CUDA: benchmarks/results_train.md)
        self.optimizer = build_optimizer(self.model, self.spec, c, distributed=self.procs.distributed)
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=c.precision == "float16")
        self.rows = c.batch_size // self.procs.dp
        sampler_cls = RandomWindows if c.sampler == "random" else SequentialEpochs
        self.sampler = sampler_cls(self.data.train, c.batch_size, c.seq_len, seed=c.seed, rank=self.procs.dp_rank, world_size=self.procs.dp)
        self.eval_train = eval_batches(self.data.train, c.batch_size, c.seq_len, c.eval_batches, seed=c.seed + 1)
        self.eval_val = eval_batches(self.data.val, c.batch_size, c.seq_len, c.eval_batches, seed=c.seed + 2)
        self.step, self.tokens, self.best_val = 0, 0, None
        if self.resume:
            self._restore()
        self.forward = torch.compile(self.model) if c.compile else self.model
        try:
            self.flops_per_token: Optional[int] = flops_per_token(self.spec, c.seq_len)
        except CostError as exc:  # a component without a FLOPs declaration: no model FLOP/s rather than a wrong one
            self.flops_per_token = None
            self._say(f"model FLOP/s and MFU not reported: {exc}")

    def fit(self) -> RunResult:
        """Run to the end of the budget; returns the losses and throughput."""
        c = self.config
        total = c.total_steps
        parts = breakdown(build(self.spec, device="meta"))
        self._say(
            f"model {self.spec.name or ''}: {parts['total']:,} parameters; data {self.data.path} "
            f"({len(self.data.train):,} train / {len(self.data.val):,} val tokens, vocab {self.data.vocab_size}); "
            f"{total} steps of {c.tokens_per_step:,} tokens on {self.procs.world} process(es), device {self.device}"
        )
        if self.step >= total and self.procs.broadcast(any(r["kind"] == "final" for r in self.history) or not c.final_eval_tokens):
            return self._finished_result()
        if self.step == 0:
            losses = self._eval_and_record()
            self._say(f"step 0: train {losses['train']:.4f}, val {losses['val']:.4f} (ln vocab = {math.log(self.spec.vocab_size):.4f})")
        start = time.perf_counter()
        start_tokens, last_log, last_tokens = self.tokens, start, self.tokens
        losses: dict[str, float] = {}
        with _ProgressBar(total, self.step, enabled=self.progress and self.procs.main, echo=self._say) as bar:
            while self.step < total:
                out = self.train_step()
                at_end = self.step == total
                if self.step % c.log_interval == 0 or at_end:
                    loss = float(self.procs.mean(out["loss"]))
                    now = time.perf_counter()
                    tps = (self.tokens - last_tokens) / max(now - last_log, 1e-9)
                    last_log, last_tokens = now, self.tokens
                    record = {
                        "kind": "train",
                        "step": self.step,
                        "tokens": self.tokens,
                        "loss": loss,  # this step's batch (eval lines hold the estimates)
                        "lr": out["lr"],
                        "grad_norm": float(out["grad_norm"]),
                        "tokens_per_s": tps,
                        "model_flops_per_s": tps * self.flops_per_token if self.flops_per_token is not None else None,
                        "peak_mem_bytes": _peak_memory(self.device),
                    }
                    if c.peak_flops and self.flops_per_token is not None:
                        record["mfu"] = record["model_flops_per_s"] / (c.peak_flops * self.procs.world)
                    record.update(out["balance"] or {})  # expert load imbalance of this step (MoE)
                    self._metric(record)
                    bar.update(self.step, loss=loss, lr=out["lr"], tps=tps)
                else:
                    bar.update(self.step)
                if self.step % c.eval_interval == 0 or at_end:
                    losses = self._eval_and_record()
                    bar.note(f"step {self.step}: train {losses['train']:.4f}, val {losses['val']:.4f}")
                if self.step % c.checkpoint_every == 0 or at_end:
                    self.save_checkpoint(final=at_end)
                if self.step % c.eval_interval == 0 or self.step % c.checkpoint_every == 0:
                    last_log, last_tokens = time.perf_counter(), self.tokens  # tokens/s counts training time only
        elapsed = time.perf_counter() - start
        tps = (self.tokens - start_tokens) / max(elapsed, 1e-9)
        full_val = None
        if c.final_eval_tokens:
            full_val = self.score_split(self.data.val, c.final_eval_tokens)
            scored = min(len(self.data.val) - 1, c.final_eval_tokens) // c.seq_len * c.seq_len
            bpb = full_val * scored / self.scored_bytes / math.log(2) if self.scored_bytes else None
            self._metric({"kind": "final", "step": self.step, "tokens": self.tokens, "val_loss": full_val, "val_tokens_scored": scored,
                          "val_bytes_scored": self.scored_bytes, "val_bits_per_byte": bpb})
            per_byte = f" ({bpb:.4f} bits per byte)" if bpb is not None else ""
            self._say(f"validation loss over {scored:,} tokens of the validation split: {full_val:.4f}{per_byte}")
            if self.procs.main:
                from .plot import plot_run

                plot_run(self.run / "metrics.jsonl", self.run / "loss.png", title=self.spec.name or "run")
        sample = self._sample() if self.procs.main and c.sample_tokens > 0 else None
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
            sample=sample,
            history=self.history,
        )

    def _finished_result(self) -> RunResult:
        """What a resumed run that had already finished returns: its logged losses, with nothing trained again."""
        self._say(f"{self.run} already finished its {self.step} steps: nothing to train (a larger --max-steps trains on)")
        evals = [r for r in self.history if r["kind"] == "eval"]
        finals = [r for r in self.history if r["kind"] == "final"]
        loaded = self.procs.broadcast((evals[-1] if evals else {}, finals[-1]["val_loss"] if finals else None))
        return RunResult(
            run_dir=self.run, steps=self.step, tokens=self.tokens, train_loss=loaded[0].get("train_loss"),
            val_loss=loaded[0].get("val_loss"), best_val_loss=self.best_val, final_val_loss=loaded[1],
            elapsed_s=0.0, tokens_per_s=0.0, history=self.history,
        )

    def _sample(self) -> str:
        from modkit.io.checkpoint import load
        from modkit.inference.generate import generate, sample

        c = self.config
        model = load(self.run / "best", device=self.device).eval()
        tok = self.data.tokenizer
        ids = tok.encode(c.sample_prompt) or [0]
        limit = model.spec.max_seq_len
        kwargs = dict(temperature=c.sample_temperature, top_k=c.sample_top_k)
        if len(ids) + c.sample_tokens <= limit:
            ids = generate(model, [ids], max_new_tokens=c.sample_tokens, seed=c.seed, **kwargs)[0].tolist()
        else:  # past the context: each token from the last max_seq_len tokens, as nanoGPT's sample.py does
            gen = torch.Generator(device=self.device).manual_seed(c.seed)
            with torch.no_grad():
                for _ in range(c.sample_tokens):
                    window = torch.tensor([ids[-limit:]], device=self.device)
                    ids.append(int(sample(model(window, logits_to_keep=1).logits[:, -1], generator=gen, **kwargs)[0]))
        text = tok.decode(ids)
        (self.run / "sample.txt").write_text(text + "\n")
        return text


class _ProgressBar:
    """A rich progress bar (step, loss, learning rate, tokens/s, ETA) on rank 0; silent when disabled."""

    def __init__(self, total: int, done: int, *, enabled: bool, echo: Callable[[str], None]):
        self.enabled, self.echo = enabled, echo
        self.total, self.done = total, done

    def __enter__(self) -> "_ProgressBar":
        if self.enabled:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

            self.bar = Progress(
                TextColumn("step"),
                MofNCompleteColumn(),
                BarColumn(),
                TextColumn("{task.fields[stats]}"),
                TimeElapsedColumn(),
                TextColumn("ETA"),
                TimeRemainingColumn(),
            )
            self.bar.__enter__()
            self.task = self.bar.add_task("train", total=self.total, completed=self.done, stats="")
        return self

    def update(self, step: int, *, loss: Optional[float] = None, lr: Optional[float] = None, tps: Optional[float] = None) -> None:
        if not self.enabled:
            return
        fields = {}
        if loss is not None:
            fields["stats"] = f"loss {loss:.4f}  lr {lr:.2e}  {tps:,.0f} tok/s"
        self.bar.update(self.task, completed=step, **fields)

    def note(self, line: str) -> None:
        """A status line above the bar (or through ``echo`` when there is no bar)."""
        if self.enabled:
            self.bar.console.print(line)
        else:
            self.echo(line)

    def __exit__(self, *exc) -> None:
        if self.enabled:
            self.bar.__exit__(*exc)


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
        TrainError: a config that does not fit the model or data, a run folder that already holds a run.
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
        data_folder = json.loads((run / "data.json").read_text())["folder"]
        fixed = {"model": str((run / "spec.json").resolve()), "vocab_size": "spec", "data": data_folder}
        cfg, _ = load_train_config(run / "config.json", {**(overrides or {}), **fixed})
        base = None  # every path in `fixed` is absolute
    else:
        cfg, base = load_train_config(config, overrides)
        if run_dir is None:
            run_dir = _fresh_run_dir(cfg)
    trainer = Trainer(cfg, run_dir, base_dir=base, resume=resume, progress=progress, echo=echo)
    trainer.setup()
    return trainer.fit()


def _fresh_run_dir(config: TrainConfig) -> Path:
    """``runs/<model name>``, or ``runs/<model name>-2``, ``-3``... when taken."""
    name = Path(config.model).stem if isinstance(config.model, str) else (
        str(config.model.get("name") or "model") if isinstance(config.model, dict) else DEFAULT_MODEL["name"]
    )
    candidate, n = Path("runs") / name, 1
    while candidate.exists():
        n += 1
        candidate = Path("runs") / f"{name}-{n}"
    return candidate

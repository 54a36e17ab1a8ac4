"""The training config: one strict pydantic model, every field with a working default (nanoGPT's CPU recipe).

A config is a flat JSON object (``modkit train --config train.json``); every field is also a command-line flag
(``--lr 3e-4``, ``--max-steps 500``) that overrides the file. Unknown keys, wrong types (``true`` for an integer,
``"3e-4"`` for a float in a file), NaN and out-of-range values are errors that name the field; all of them are
reported together as one :class:`~modkit.core.errors.SpecError`.

The defaults reproduce nanoGPT's CPU recipe for tiny shakespeare (``config/train_shakespeare_char.py`` with
``--device=cpu --compile=False --eval_iters=20 --block_size=64 --batch_size=12 --n_layer=4 --n_head=4
--n_embd=128 --max_iters=2000 --lr_decay_iters=2000 --dropout=0.0``): batch 12 x 64 tokens, 2000 steps, AdamW
lr 1e-3 (betas 0.9/0.99, weight decay 0.1) with 100 warmup steps and a cosine decay to 1e-4, clipping at 1.0,
evaluation every 250 steps on 20 batches. The default model is :data:`DEFAULT_MODEL`, nanoGPT's GPT at those
sizes; the default data is the shipped tiny shakespeare with a character tokenizer.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from modkit.core.errors import SpecError
from modkit.core.jsonio import JSONInputError, check_document, check_regular_file, read_json_file
from modkit.core.limits import MAX_JSON_BYTES
from modkit.core.validation import ErrorFormatter, models_in

#: nanoGPT's GPT (GPT-2 style: learned positions, LayerNorm with bias, GELU MLP 4x, pre-norm, tied embeddings,
#: biases everywhere) at the sizes of its CPU recipe for tiny shakespeare: the model of a config whose ``model`` is
#: null. A spec file shipped as package data (the same as ``specs/nanogpt-shakespeare-char.json``), read through
#: the registry like any other spec: the core names no component. ``vocab_size`` is replaced by the data's when
#: ``vocab_size = "data"`` (65 characters).
DEFAULT_MODEL_PATH = Path(__file__).resolve().parent / "defaults" / "nanogpt-shakespeare-char.json"
DEFAULT_MODEL: dict[str, Any] = json.loads(DEFAULT_MODEL_PATH.read_text())


class TrainConfig(BaseModel):
    """Everything a training run needs besides the model's weights (see the module docstring for the defaults).

    Batches: ``batch_size`` sequences of ``seq_len`` tokens per micro-batch, summed over all processes (each of
    ``N`` processes takes ``batch_size / N`` rows of the same global batch), ``grad_accum`` micro-batches per
    optimizer step: ``tokens_per_step = batch_size * grad_accum * seq_len``.

    Weight decay applies to the parameter roles that decay (:mod:`modkit.core.roles`: hidden and expert matrices,
    embeddings, the head, routers) and not to norm gains, biases and other vectors, nanoGPT's and GPT-3's rule read
    from the roles the components declare. ``optimizer`` names a registered optimizer component
    (:mod:`modkit.train.optim`); AdamW by default.

    Learning rate at optimizer step ``t`` (0-based), with ``W = warmup_steps`` and ``T = decay_steps`` (default:
    the step budget): ``lr * (t + 1) / (W + 1)`` while ``t < W``; then, with ``r = (t - W) / (T - W)`` clipped to
    ``[0, 1]``, ``cosine``: ``min_lr + (lr - min_lr) * (1 + cos(pi r)) / 2``; ``linear``: ``lr - (lr - min_lr) r``;
    ``constant``: ``lr``; ``wsd`` (warmup-stable-decay, Hu et al. 2024, MiniCPM, arXiv:2404.06395): ``lr`` until
    the last ``wsd_decay_fraction`` of ``T``, then linear down to ``min_lr``.
    """

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False, frozen=True)

    schema_version: Literal[1] = Field(1, description="version of the training-config format; currently 1")
    model: Union[str, dict[str, Any], None] = Field(
        None,
        description="the model: a spec file path (relative paths are relative to the config file), an inline spec "
        "object, a modkit checkpoint folder to fine-tune, or null for nanoGPT's shakespeare-char GPT",
    )
    vocab_size: Literal["data", "spec"] = Field(
        "data",
        description="'data': set the model's vocab_size to the tokenizer's; 'spec': keep the spec's (must be >= the tokenizer's)",
    )
    data: Optional[str] = Field(
        None,
        description="a prepared data folder (train.bin, val.bin, meta.json from 'modkit data prepare'), or text "
        "files/a folder prepared on first use; null: the shipped tiny shakespeare",
    )
    tokenizer: str = Field(
        "char", description="tokenizer used when 'data' is raw text: char, bpe:VOCAB_SIZE or a tokenizer.json path"
    )
    document_mask: bool = Field(
        False,
        description="document-masked packing: a token attends only to earlier tokens of its own document within a "
        "training window (documents delimited by the end-of-text tokens the data was prepared with; a recurrent "
        "mixer restarts its state there), and positions restart at each document; every token mixer of the model "
        "(attention or recurrent, the mixers of a hybrid too) must declare the document_mask capability",
    )
    sampler: Literal["random", "sequential"] = Field(
        "random",
        description="'random': random contiguous windows (nanoGPT); 'sequential': shuffled non-overlapping windows, epoch by epoch",
    )

    batch_size: int = Field(12, ge=1, le=1 << 20, description="sequences per micro-batch, over all processes")
    seq_len: int = Field(64, ge=1, le=1 << 24, description="tokens per sequence (at most the model's max_seq_len)")
    grad_accum: int = Field(1, ge=1, le=1 << 16, description="micro-batches per optimizer step")
    max_steps: Optional[int] = Field(
        2000, ge=1, le=1 << 40, description="optimizer steps to run (null when max_tokens is given)"
    )
    max_tokens: Optional[int] = Field(
        None, ge=1, le=1 << 60, description="tokens to train on instead of max_steps (rounded up to whole steps)"
    )

    lr: float = Field(1e-3, gt=0, le=10, description="peak learning rate")
    min_lr: float = Field(1e-4, ge=0, le=10, description="learning rate at the end of the decay")
    schedule: Literal["cosine", "linear", "constant", "wsd"] = Field(
        "cosine", description="shape of the decay after warmup"
    )
    warmup_steps: int = Field(100, ge=0, le=1 << 40, description="linear warmup steps")
    decay_steps: Optional[int] = Field(
        None, ge=1, le=1 << 40, description="step at which the decay ends (nanoGPT lr_decay_iters); default: the budget"
    )
    wsd_decay_fraction: float = Field(0.2, gt=0, le=1, description="wsd: fraction of decay_steps spent decaying")
    optimizer: dict[str, Any] = Field(
        default_factory=lambda: {"type": "adamw"},
        description='the optimizer, a registered optimizer component: {"type": "adamw"} (default), '
        '{"type": "muon"}, {"type": "lion"}, {"type": "sgd", "momentum": 0.9}, ... '
        "('modkit list optimizer'; its fields: 'modkit show optimizer TYPE')",
    )
    beta1: float = Field(0.9, ge=0, lt=1, description="AdamW beta1 (adamw, and the AdamW part of muon)")
    beta2: float = Field(0.99, ge=0, lt=1, description="AdamW beta2 (adamw, and the AdamW part of muon)")
    adam_eps: float = Field(1e-8, gt=0, le=1, description="AdamW epsilon (adamw, and the AdamW part of muon)")
    weight_decay: float = Field(
        0.1,
        ge=0,
        le=10,
        description="weight decay of the parameter roles that decay (matrices, embeddings, head, "
        "routers; not norm gains, biases, vectors); decoupled for adamw, muon and lion, L2 for sgd",
    )
    mtp_loss_weight: float = Field(
        0.3,
        ge=0,
        le=100,
        description="weight of the multi-token-prediction loss of a spec with 'mtp' (DeepSeek-V3: 0.3, then 0.1): "
        "the step's loss for backward is CE + weight / depth * (sum of the depths' CE); ignored without 'mtp'",
    )
    grad_clip: Optional[float] = Field(
        1.0, gt=0, description="clip the global gradient norm to this; null: no clipping"
    )
    on_nonfinite: Literal["stop", "skip"] = Field(
        "stop",
        description="a step whose loss or gradient norm is NaN or infinite: 'stop' the run with an error naming the "
        "step (nothing of it saved); 'skip' its batch (no update; counted in the metrics and the result) and go on. "
        "Weights made non-finite by an update always stop the run",
    )
    max_nonfinite_skips: int = Field(
        10, ge=1, le=1 << 20, description="on_nonfinite 'skip': non-finite steps in a row after which the run stops"
    )

    precision: Literal["float32", "bfloat16", "float16"] = Field(
        "float32",
        description="float32; bfloat16 autocast (weights and optimizer in float32); float16 autocast with a dynamic grad scaler",
    )
    aux_loss_coef: Optional[float] = Field(
        None,
        ge=0,
        description="override every component field named aux_loss_coef (MoE load balancing); null: as in the spec",
    )
    z_loss_coef: Optional[float] = Field(
        None, ge=0, description="override every component field named z_loss_coef (router z-loss); null: as in the spec"
    )
    bias_update_speed: Optional[float] = Field(
        None,
        ge=0,
        description="override every component field named bias_update_speed (the step of a router's correction-bias "
        "update after each optimizer step, DeepSeek-V3's auxiliary-loss-free balancing; 0: no update); null: as in the spec",
    )

    eval_interval: int = Field(
        250, ge=1, le=1 << 40, description="evaluate train and val loss every this many steps (and at the end)"
    )
    eval_batches: int = Field(20, ge=1, le=1 << 20, description="batches per loss estimate")
    final_eval_tokens: int = Field(
        10_000_000,
        ge=0,
        le=1 << 50,
        description="at the end, score the first this many tokens of the validation split (the whole split when "
        "shorter) in non-overlapping seq_len windows: the run's figure of merit; 0: skip",
    )
    checkpoint_interval: Optional[int] = Field(
        None, ge=1, le=1 << 40, description="save a resumable checkpoint every this many steps; default: eval_interval"
    )
    keep_checkpoints: int = Field(
        2, ge=1, le=1 << 20, description="resumable step checkpoints kept (the best one is kept besides)"
    )
    log_interval: int = Field(10, ge=1, le=1 << 40, description="write a metrics line every this many steps")
    live_plot: bool = Field(
        False,
        description="redraw loss.png at every evaluation (about 0.1 s of CPU each, plus matplotlib's import at the "
        "first); false: draw it once, at the end of the run",
    )
    trackers: list[Union[str, dict[str, Any]]] = Field(
        default_factory=list,
        description="experiment trackers logging the run besides its metrics.jsonl (always written), registered "
        'tracker components: ["tensorboard", {"type": "mlflow", "tracking_uri": "http://127.0.0.1:5000"}, {"type": '
        '"wandb", "mode": "offline"}] (\'modkit list tracker\'; flag: --tracker TYPE[:VALUE], repeatable)',
    )
    tracker_group: Optional[str] = Field(
        None,
        max_length=256,
        description="the group the run is logged in by its trackers (a W&B group, an MLflow parent run); "
        "modkit compare sets it to the comparison's name",
    )

    seed: int = Field(1337, ge=0, lt=1 << 63, description="seed of the weight init, the sampler and dropout")
    compile: bool = Field(False, description="torch.compile the model")
    onednn_linear: bool = Field(
        True,
        description="on the CPU in float32 (one process, not compiled), run the model's nn.Linear layers through "
        "oneDNN instead of torch's default BLAS: the same products up to float rounding, about 2x the throughput "
        "where MKL does not run its fastest kernels (AMD CPUs; benchmarks/results_train_vs_loop.md); false: torch's "
        "default",
    )
    reuse_host_memory: bool = Field(
        True,
        description="on the CPU under glibc, keep memory a step frees in the process for the next step (mallopt: "
        "mmap threshold 32 MiB, trim threshold 1 GiB) instead of returning it to the system and faulting it back "
        "in every step (modkit.train.allocator); false: glibc's defaults",
    )
    device: str = Field("auto", description="cpu, cuda, cuda:N, mps or auto (cuda when available)")
    threads: Optional[int] = Field(
        None, ge=1, le=4096, description="CPU threads (torch.set_num_threads); null: torch's default"
    )
    tp: int = Field(
        1,
        ge=1,
        le=1 << 16,
        description="tensor-parallel degree under torchrun (the rest of the processes shard data with FSDP2)",
    )
    cp: int = Field(
        1,
        ge=1,
        le=1 << 16,
        description="context-parallel degree under torchrun: each row's sequence cut into cp slices, one per rank, "
        "attention over all-gathered keys (every mixer must declare context_parallel; seq_len divisible by cp)",
    )
    ep: int = Field(
        1,
        ge=1,
        le=1 << 16,
        description="expert-parallel degree under torchrun: the experts of every mixture split over ep data-parallel "
        "processes, tokens sent to them by all-to-all (divides the data-parallel processes; with pp > 1 too, not "
        "with tp or cp > 1)",
    )
    pp: int = Field(
        1,
        ge=1,
        le=1 << 16,
        description="pipeline-parallel degree under torchrun: the layers cut into pp stages, one per process group "
        "(the embedding on the first, the head on the last); each batch split into pp_microbatches (float32, "
        "grad_accum 1, untied head, not with ep or cp)",
    )
    pp_microbatches: Optional[int] = Field(
        None,
        ge=1,
        le=1 << 16,
        description="microbatches the pipeline cuts each process's batch rows into (divides them); null: pp. The "
        "gradient is the batch's mean, as one process accumulating over the same microbatches",
    )
    pp_schedule: Literal[
        "gpipe", "1f1b", "interleaved_1f1b", "looped_bfs", "interleaved_zero_bubble", "zbv_zero_bubble", "dualpipev"
    ] = Field(
        "1f1b",
        description="pipeline schedule: gpipe, 1f1b (one stage per process), interleaved_1f1b, looped_bfs, "
        "interleaved_zero_bubble (two stages per process in a loop), zbv_zero_bubble or dualpipev (two in a V); the "
        "zero-bubble ones and dualpipev need one data-parallel process per stage (no FSDP2, so no ep either)",
    )
    peak_flops: Optional[float] = Field(
        None,
        gt=0,
        description="the device's peak FLOP/s for the MFU column (e.g. 989e12 for an H100's bf16); null: MFU not reported",
    )

    sample_prompt: str = Field("\n", description="prompt of the sample generated at the end")
    sample_tokens: int = Field(300, ge=0, le=1 << 20, description="tokens to sample at the end (0: none)")
    sample_temperature: float = Field(0.8, ge=0, le=100, description="temperature of the sample (0: greedy)")
    sample_top_k: Optional[int] = Field(200, ge=1, description="top-k of the sample; null: no top-k")

    @field_validator("optimizer")
    @classmethod
    def _optimizer(cls, value: dict[str, Any]) -> dict[str, Any]:
        """Validate against the registered optimizers; the stored dict has every default written out."""
        from .optim import load_optimizer_config

        try:
            return load_optimizer_config(value).model_dump(mode="json")
        except SpecError as exc:
            raise ValueError("; ".join(f"{p}: {m}" if p else m for p, m in exc.errors)) from None

    @field_validator("trackers")
    @classmethod
    def _trackers(cls, value: list) -> list[dict[str, Any]]:
        """Validate against the registered trackers; the stored dicts have every default written out."""
        from .trackers import load_tracker_configs

        try:
            return [c.model_dump(mode="json") for c in load_tracker_configs(value)]
        except SpecError as exc:
            raise ValueError("; ".join(f"{p}: {m}" if p else m for p, m in exc.errors)) from None

    @model_validator(mode="after")
    def _consistent(self) -> "TrainConfig":
        problems = []
        if (self.max_steps is None) == (self.max_tokens is None):
            problems.append("give exactly one of max_steps and max_tokens (set the other to null)")
        if self.min_lr > self.lr:
            problems.append(f"min_lr = {self.min_lr} exceeds lr = {self.lr}")
        if problems:
            raise ValueError("; ".join(problems))
        return self

    # ------------------------------------------------------------------ derived
    @property
    def tokens_per_step(self) -> int:
        """Tokens per optimizer step: ``batch_size * grad_accum * seq_len``."""
        return self.batch_size * self.grad_accum * self.seq_len

    @property
    def total_steps(self) -> int:
        """The step budget: ``max_steps``, or ``ceil(max_tokens / tokens_per_step)``."""
        if self.max_steps is not None:
            return self.max_steps
        return -(-self.max_tokens // self.tokens_per_step)

    @property
    def checkpoint_every(self) -> int:
        """Steps between resumable checkpoints."""
        return self.checkpoint_interval or self.eval_interval


#: Fields that may hold a path: relative to the config file's folder in a file, to the working directory as a flag.
PATH_FIELDS = ("model", "data", "tokenizer")


class _ConfigErrorFormatter(ErrorFormatter):
    """Training-config errors in JSON terms (:mod:`modkit.core.validation`); an unknown field names the close fields."""

    def special(self, err: dict, path: str, parent: Any, tags: list[str]) -> Optional[tuple[str, str]]:
        if err.get("type") == "extra_forbidden":
            close = [n for n in TrainConfig.model_fields if path and (path in n or n in path)]
            return (path, "unknown field" + (f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""))
        return None


def config_errors(exc: ValidationError, data: Any = None) -> list[tuple[str, str]]:
    """``(field path, message)`` for every error pydantic found in the config ``data``, paths and values in JSON
    terms (:class:`~modkit.core.validation.ErrorFormatter`)."""
    return _ConfigErrorFormatter(models_in([TrainConfig]).values()).format(exc.errors(), data)


def load_train_config(
    source: Union[str, Path, dict, TrainConfig, None] = None, overrides: Optional[dict[str, Any]] = None
) -> tuple[TrainConfig, Optional[Path]]:
    """Validate a training config, apply command-line overrides, and resolve relative paths.

    Args:
        source: a JSON file path, a dict, a :class:`TrainConfig`, or ``None`` for the defaults.
        overrides: field -> value, applied on top (values already typed, e.g. parsed by :func:`parse_flag_value`);
            relative paths in :data:`PATH_FIELDS` that exist from the working directory are made absolute.

    Returns:
        ``(config, base_dir)``: ``base_dir`` is the config file's folder (relative ``model`` / ``data`` paths
            are resolved against it), or ``None`` for a dict / the defaults (relative to the working directory).

    Raises:
        SpecError: every invalid field at once, each named by its path; an unreadable file (missing, a folder, a FIFO
            or device, over 16 MiB), text that is not UTF-8, malformed JSON or duplicate keys (read strictly with
            :func:`modkit.core.jsonio.read_json_file`).
    """
    base: Optional[Path] = None
    if source is None:
        data: dict[str, Any] = {}
    elif isinstance(source, TrainConfig):
        data = source.model_dump()
    elif isinstance(source, dict):
        data = dict(source)
        try:  # the nesting bound a file gets (modkit.core.jsonio), for a dict built in Python
            check_document(data)
        except JSONInputError as exc:
            raise SpecError(exc.errors, source="training config") from None
    else:
        path = Path(source)
        label = f"training config {path}"
        try:  # a regular file of bounded size (a FIFO or /dev/zero is refused, not read forever)
            check_regular_file(path, max_bytes=MAX_JSON_BYTES)
        except JSONInputError as exc:
            raise SpecError([(p, f"cannot read training config: {m}") for p, m in exc.errors], source=label) from None
        try:  # UTF-8, no duplicate keys, bounded nesting (modkit.core.jsonio)
            data = read_json_file(path)
        except JSONInputError as exc:
            raise SpecError(exc.errors, source=label) from None
        if not isinstance(data, dict):
            raise SpecError(
                [("", f"a training config is a JSON object, got {type(data).__name__}")],
                source=f"training config {path}",
            )
        data.pop("$schema", None)
        base = path.resolve().parent
    for key, value in (overrides or {}).items():
        # a path given on the command line is relative to the working directory, not to the config file
        if key in PATH_FIELDS and isinstance(value, str) and not Path(value).is_absolute() and Path(value).exists():
            value = str(Path(value).resolve())
        data[key] = value
    try:
        return TrainConfig.model_validate(data), base
    except ValidationError as exc:
        raise SpecError(
            config_errors(exc, data),
            source=f"training config {source}" if isinstance(source, (str, Path)) else "training config",
        ) from None


def parse_flag_value(field_name: str, text: str) -> Any:
    """A command-line value typed for ``field_name``: JSON (``3e-4``, ``null``, ``true``, ``{...}``) where it
    parses, else the string itself (``--device cuda``, ``--model specs/x.json``)."""
    try:
        value = json.loads(text)
    except ValueError:
        return text
    annotation = str(TrainConfig.model_fields[field_name].annotation)
    if (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and "float" in annotation
        and "int" not in annotation
    ):
        return float(value)  # --lr 1 means 1.0
    if isinstance(value, (int, float, bool, dict)) or value is None:
        return value
    return text


def json_schema() -> dict:
    """The JSON Schema of training configs (for editors; ``modkit schema --train``): the ``optimizer`` field is the
    union of the installed optimizers' configs."""
    from pydantic import TypeAdapter

    from ..spec import slot_type

    schema = TrainConfig.model_json_schema()
    union = slot_type("optimizer")
    if union is not None:
        sub = TypeAdapter(union).json_schema(ref_template="#/$defs/{model}")
        schema.setdefault("$defs", {}).update(sub.pop("$defs", {}))
        described = {
            "description": schema["properties"]["optimizer"].get("description", ""),
            "default": {"type": "adamw"},
        }
        schema["properties"]["optimizer"] = {**sub, **described}
    return schema


def schedule_warning(config: "TrainConfig") -> Optional[str]:
    """A warning when the learning rate never leaves its warmup: ``max_steps <= warmup_steps`` (with a warmup), so
    the run ends at ``lr * max_steps / warmup_steps`` at most and never reaches the peak rate or the decay a recipe
    names (``None`` otherwise). Said by ``modkit train`` and ``modkit compare`` before anything trains; a shortened
    recipe (``--max-steps 50`` with the default 100 warmup steps) otherwise compares designs at a fraction of
    their rate without a word."""
    if config.warmup_steps and config.max_steps is not None and config.max_steps <= config.warmup_steps:
        return (
            f"max_steps = {config.max_steps} is not above warmup_steps = {config.warmup_steps}: the learning rate never "
            f"leaves its warmup (it ends at {config.max_steps / config.warmup_steps:.0%} of lr); lower warmup_steps "
            "(e.g. --warmup-steps to a tenth of the steps) for a shortened run"
        )
    return None

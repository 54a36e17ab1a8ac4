"""What a training run is made of, resolved from its config: the device, the prepared data folder, the model spec
(with the config's overrides), its training FLOPs per token and its optimizer's parameter groups.

Each helper raises :class:`~modkit.train.errors.TrainError` naming what to change when the config does not fit the
model or the data. :mod:`modkit.train.loop` re-exports every name here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import torch
from torch import nn

from modkit.analysis.cost import training_flops_per_token
from ..spec import ModelSpec, iter_configs, load_spec
from .config import DEFAULT_MODEL, TrainConfig
from .errors import TrainError


def flops_per_token(spec: ModelSpec, seq_len: int) -> int:
    """Training FLOPs per token (forward + backward) at ``seq_len``, from the components' FLOPs declarations.

    ``3 x`` the forward FLOPs of one causal sequence of ``seq_len`` tokens divided by ``seq_len``, rounded to an
    integer (:func:`modkit.analysis.cost.training_flops_per_token`): the backward of each matrix product is two
    products of its size (input and weight gradients). Matrix products only, 1 multiply-add = 2 FLOPs; attention
    counts the (query, key) pairs the causal mask lets through, ``(T + 1) / 2`` keys per token on average, where the
    PaLM paper's MFU (Chowdhery et al. 2022, arXiv:2204.02311, appendix B; nanoGPT's ``estimate_mfu``: ``6 N + 12 L
    H Q T``) counts the full ``T`` square, so the attention term here is about half of theirs.

    Raises:
        CostError: a component of the spec declares no FLOPs.
    """
    return training_flops_per_token(spec, seq_len)


def decay_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """Two parameter groups, decay and no decay, by the parameters' roles (:mod:`modkit.core.roles`): hidden and expert
    matrices, embeddings, the head and routers decay; norm gains, biases and vectors do not. nanoGPT's
    ``configure_optimizers`` rule (GPT-3 likewise), read from roles instead of ``p.dim() >= 2`` (which decayed stacked
    expert biases).

    Raises:
        RoleError: an unknown role or a declaration naming no parameter (a parameter without a role takes the
            convention's: :func:`modkit.core.roles.param_roles`).
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
        TrainError: ``config.data`` does not exist, or is a prepared folder while ``config.tokenizer`` names another
            tokenizer than the folder's (it would be ignored).
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
        _check_tokenizer_unused(config, path)
        return path
    if not (text_folder / "meta.json").is_file():
        prepare([path], text_folder, tokenizer=config.tokenizer, show_progress=show_progress)
    return text_folder


def _check_tokenizer_unused(config: TrainConfig, folder: Path) -> None:
    """Refuse a ``tokenizer`` other than the default when ``data`` is a prepared folder: the folder is read as it was
    tokenized, so the field would be ignored without a word (``"bpe:abc"``, not even a tokenizer, was accepted). The
    tokenizer the folder was prepared with is accepted under its own name.

    Raises:
        TrainError: naming the field, its value, the folder and the tokenizer it holds.
    """
    from modkit.core.jsonio import JSONInputError, read_json_file

    if config.tokenizer == TrainConfig.model_fields["tokenizer"].default:
        return
    try:
        used = read_json_file(folder / "meta.json").get("tokenizer")
    except (JSONInputError, AttributeError):
        used = None  # opening the folder reports its meta.json
    if config.tokenizer != used:
        raise TrainError(
            f"tokenizer = {config.tokenizer!r}, but data = {config.data!r} is a prepared folder, already tokenized "
            f"(with {used!r}); tokenizer applies to text data only: remove it, or give the text files as data"
        )


def _resolve_device(text: str) -> torch.device:
    """The device a config's ``device`` names (``auto``: CUDA when available, else the CPU).

    Raises:
        TrainError: the text is not a device; names ``meta`` (no data: nothing to train) or a device type modkit
            does not train on; names CUDA or MPS where it is not available, or a GPU index this machine lacks.
    """
    if text == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(text)
    except RuntimeError:
        raise TrainError(f"device = {text!r} is not a device; use cpu, cuda, cuda:N, mps or auto") from None
    if device.type == "meta":
        raise TrainError(
            f"device = {text!r} holds no data and cannot train (it is for building models without memory); use cpu, "
            "cuda, cuda:N, mps or auto"
        )
    if device.type not in ("cpu", "cuda", "mps"):
        raise TrainError(f"device = {text!r}: modkit trains on cpu, cuda, cuda:N or mps; use one of them or auto")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise TrainError(f"device = {text!r} but CUDA is not available here; use --device cpu")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        n = torch.cuda.device_count()
        raise TrainError(f"device = {text!r} but this machine has {n} CUDA device(s): cuda:0 to cuda:{n - 1}")
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise TrainError(
            f"device = {text!r} but MPS is not available here (Apple silicon with a PyTorch built for it); use "
            "--device cpu"
        )
    return device


def run_data_folder(run: Path) -> str:
    """The prepared data folder a run trained on: ``data.json``'s ``folder``, read strictly.

    Raises:
        TrainError: ``data.json`` is unreadable, not JSON (duplicate keys included), or has no string ``folder``.
    """
    from modkit.core.jsonio import JSONInputError, read_json_file
    from modkit.core.validation import json_value

    path = run / "data.json"
    try:
        data = read_json_file(path)
    except JSONInputError as exc:
        raise TrainError(f"--resume {run}: {exc}") from None
    folder = data.get("folder") if isinstance(data, dict) else None
    if not isinstance(folder, str) or not folder:
        raise TrainError(
            f"{path}: folder = {json_value(folder, 80)} is not a path; the file names the run's prepared data "
            'folder ({"folder": "..."}): write the path there'
        )
    return folder


def _first_difference(a: Any, b: Any, path: str = "") -> Optional[tuple[str, Any, Any]]:
    """``(JSON path, value in a, value in b)`` of the first place two JSON documents differ, ``None`` if equal."""
    from modkit.core.validation import join_path

    if isinstance(a, dict) and isinstance(b, dict):
        for key in list(a) + [k for k in b if k not in a]:
            if key not in a or key not in b or a[key] != b[key]:
                found = _first_difference(a.get(key), b.get(key), join_path(path, key))
                return found if found is not None else (join_path(path, key), a.get(key), b.get(key))
        return None
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b)):
            if x != y:
                return _first_difference(x, y, join_path(path, i))
        return None
    return None if a == b else (path, a, b)


def check_resume_model(run: Path, overrides: dict[str, Any], data_folder: str) -> None:
    """Refuse a ``model`` override on resume whose spec differs from the run's ``spec.json``: the same spec (the
    command line that started the run, repeated with ``--resume``) passes, resolved as the run resolved its own (the
    run's ``vocab_size`` setting, the data's vocabulary, the auxiliary-loss overrides). The specs' ``metadata`` is
    not compared (it describes the model, it does not change it).

    Raises:
        TrainError: naming the given model, the run's ``spec.json`` and the first field where they differ.
        SpecError: the given model's spec is invalid.
    """
    from modkit.core.validation import json_value

    from ..data import TokenData
    from .config import load_train_config

    model = overrides["model"]
    given, _ = load_train_config(run / "config.json", overrides)
    candidate = resolve_spec(given, None, TokenData.open(data_folder).vocab_size).to_dict()
    own = load_spec(run / "spec.json").to_dict()
    for spec in (candidate, own):  # descriptive only (names, notes, the plugins' versions): not the model
        spec.pop("metadata", None)
    diff = _first_difference(candidate, own)
    if diff is None:
        return
    where, theirs, ours = diff
    label = model if isinstance(model, str) else "the inline spec"
    raise TrainError(
        f"--model {label}: its spec differs from the run's {run / 'spec.json'}: {where} = {json_value(theirs, 60)} "
        f"there, {json_value(ours, 60)} in the run; a resumed run keeps its own model: drop --model, or start a new "
        "run with -o"
    )


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
            raise TrainError(
                f"model = {model!r}: no spec file at {source}; give a spec JSON file, a modkit checkpoint folder or an "
                "inline spec"
            )
    data = load_spec(source).to_dict()  # a fresh dict with every default written out, so overrides find their slots
    if config.vocab_size == "data":
        data["vocab_size"] = vocab_size
    # a convention on field names: the core names no component
    for name in ("aux_loss_coef", "z_loss_coef", "bias_update_speed"):
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
        raise TrainError(
            f"seq_len = {config.seq_len} exceeds the model's max_seq_len = {spec.max_seq_len}; lower seq_len"
        )
    return spec


def check_document_mask(spec: ModelSpec, data) -> None:
    """Refuse ``document_mask`` when the data has no document separators or a token mixer cannot honour it.

    Raises:
        TrainError: names the data folder and what to prepare, or every token mixer (attention or recurrent, the
            mixers inside a hybrid too) that lacks the ``document_mask`` capability, with its layer, its type and
            the types that have it (:func:`modkit.nn.documents.document_mask_problems`).
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

"""Hugging Face checkpoints ↔ modkit: configs and weights, dispatched on ``model_type`` to plugin converters.

* :func:`from_hf_config`: ``config.json`` → validated spec (with ``metadata.hf_model_type``).
* :func:`from_hf`: a Hugging Face model folder (``config.json`` + ``model.safetensors``, or shards listed in
  ``model.safetensors.index.json``) → a :class:`~modkit.nn.model.Model` holding its weights.
* :func:`to_hf`: a model → a Hugging Face folder that transformers loads (``config.json`` + safetensors).

Configs convert as they are: keys that cannot change the network (provenance, tokenizer ids, generation defaults,
runtime switches) are dropped, and keys a converter does not know at all are dropped with one
:class:`~modkit.core.errors.UnknownConfigKeyWarning` naming each key and value, as transformers ignores keys its config
class does not read. ``strict=True`` refuses unknown keys instead (a :class:`~modkit.core.errors.SpecError` naming each).
Converters ask :func:`strict_conversion` which of the two applies.

The core names no model type: converters and their weight mappers arrive through the ``register_hf_converters``
hook (``register(model_type, convert, weights=mapper)``, see :class:`modkit.io.checkpoint.WeightMapper`). Weights are
read only from safetensors (pickle files are refused: unpickling runs arbitrary code), every missing, unexpected
or mis-shaped tensor is reported by name, and a folder's files are replaced as one atomic step (:mod:`modkit.io.atomic`).
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import math
from pathlib import Path
import re
import warnings
from typing import TYPE_CHECKING, Any, Iterator, Optional, Sequence, Union

from modkit.core.errors import CheckpointError, LeftOutTensorsWarning, RegistryError, SpecError
from modkit.core.jsonio import JSONInputError, check_document, read_json_file
from modkit.core.registry import Registry, get_registry
from modkit.spec import ModelSpec, load_spec
from modkit.core.validation import PathError, join_path, json_kind, json_value, last_key, resolve_path

if TYPE_CHECKING:
    from torch import Tensor

    from modkit.nn.model import Model

#: default largest shard :func:`to_hf` writes (bytes), as transformers' ``save_pretrained`` (5 GB)
DEFAULT_MAX_SHARD_SIZE = 5 * 10**9

#: the floats JSON cannot hold, as transformers 5 writes them in ``config.json``: ``{"__float__": "Infinity"}``
#: (``PreTrainedConfig._encode_special_floats``; Falcon-H1's and Mamba-2's ``time_step_limit`` default to ``(0, inf)``)
FLOAT_TAG = "__float__"
SPECIAL_FLOATS = {"Infinity": math.inf, "-Infinity": -math.inf, "NaN": math.nan}


def decode_special_floats(value: Any) -> Any:
    """``value`` with every ``{"__float__": "Infinity" | "-Infinity" | "NaN"}`` object, at any depth, replaced by its
    float (other values as they are; a new container where anything changed)."""
    if isinstance(value, dict):
        if set(value) == {FLOAT_TAG} and value[FLOAT_TAG] in SPECIAL_FLOATS:
            return SPECIAL_FLOATS[value[FLOAT_TAG]]
        return {k: decode_special_floats(v) for k, v in value.items()}
    if isinstance(value, list):
        return [decode_special_floats(v) for v in value]
    return value


def encode_special_floats(value: Any) -> Any:
    """The inverse of :func:`decode_special_floats`: infinite and NaN floats (in dicts, lists and tuples) as tagged
    objects, so an exported ``config.json`` is plain JSON, as transformers 5 writes it."""
    if isinstance(value, float) and not math.isfinite(value):
        return {FLOAT_TAG: "NaN" if math.isnan(value) else "Infinity" if value > 0 else "-Infinity"}
    if isinstance(value, dict):
        return {k: encode_special_floats(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [encode_special_floats(v) for v in value]
    return value


def read_config(source: Union[str, Path, dict]) -> dict:
    """Load a ``config.json`` (path to the file or its folder) or pass a dict through.

    The file is read strictly (:mod:`modkit.core.jsonio`: a regular file of at most 16 MiB, UTF-8, no duplicate keys)
    and must hold a JSON object; transformers 5's tagged floats become floats (:func:`decode_special_floats`).

    Raises:
        SpecError: unreadable file, malformed JSON, or a document that is not an object; naming the file.
    """
    label = None
    if isinstance(source, dict):
        cfg: Any = source
        try:  # the nesting bound a file gets (modkit.core.jsonio), for a dict built in Python
            check_document(cfg)
        except JSONInputError as exc:
            raise SpecError(exc.errors, source="Hugging Face config") from None
    else:
        path = Path(source) if "\x00" not in str(source) else source
        if isinstance(path, Path) and path.is_dir():
            path = path / "config.json"
        label = str(path)
        try:
            cfg = read_json_file(path)
        except JSONInputError as exc:
            raise SpecError(exc.errors, source=f"Hugging Face config {exc.source or label}") from None
    if not isinstance(cfg, dict):
        kind = "null" if cfg is None else "an array" if isinstance(cfg, list) else f"a {type(cfg).__name__}"
        raise SpecError([("", f"a Hugging Face config is a JSON object, got {kind}")], source=label)
    return decode_special_floats(cfg)


def _model_type(cfg: dict, label: Optional[str] = None) -> str:
    model_type = cfg.get("model_type")
    if model_type is None or model_type == "":
        raise SpecError([("model_type", "missing; cannot tell which architecture this config describes")], source=label)
    if not isinstance(model_type, str):
        raise SpecError(
            [
                (
                    "model_type",
                    f'must be a string naming the architecture (e.g. "llama"), got {json_kind(model_type)} {json_value(model_type, 40)}',
                )
            ],
            source=label,
        )
    return model_type


_STRICT: contextvars.ContextVar[bool] = contextvars.ContextVar("modkit_hf_strict", default=False)


def strict_conversion() -> bool:
    """Whether the conversion running in this context refuses unknown config keys (``strict=True``) instead of
    dropping them with an :class:`~modkit.core.errors.UnknownConfigKeyWarning`. Converters call this when they finish."""
    return _STRICT.get()


@contextlib.contextmanager
def _strictness(strict: bool) -> Iterator[None]:
    token = _STRICT.set(bool(strict))
    try:
        yield
    finally:
        _STRICT.reset(token)


def hf_config_to_dict(
    config: Union[str, Path, dict], *, registry: Optional[Registry] = None, strict: bool = False
) -> dict:
    """Convert a Hugging Face config to a modkit spec dict (not yet validated).

    Args:
        config: a ``config.json`` dict, file or folder.
        registry: defaults to the process-wide registry.
        strict: refuse keys the converter does not know (default: drop them with one
            :class:`~modkit.core.errors.UnknownConfigKeyWarning` naming each key and value).

    Raises:
        SpecError: an unreadable or malformed file, no ``model_type`` or one that is not a string, an unsupported
            one (lists the supported types), a field value the converter cannot express (each error names the
            config's own key: ``rms_norm_eps``, ``rope_scaling.factor``), or with ``strict``, every unknown key.
    """
    reg = registry or get_registry()
    cfg = read_config(config)
    model_type = _model_type(cfg)
    try:
        conv = reg.hf_converter(model_type)
    except RegistryError as exc:
        raise SpecError([("model_type", str(exc))]) from None
    with _strictness(strict):
        return conv.convert(cfg)


def from_hf_config(
    config: Union[str, Path, dict], *, registry: Optional[Registry] = None, strict: bool = False
) -> ModelSpec:
    """Convert a Hugging Face ``config.json`` (dict or path) into a validated :class:`ModelSpec`.

    Unknown keys are dropped with a warning, or refused with ``strict=True`` (see :func:`hf_config_to_dict`).

    Raises:
        SpecError: as :func:`hf_config_to_dict`, or if the converted spec fails validation (see
            :func:`convert_hf_config`: the errors name the config's keys).
    """
    return convert_hf_config(config, registry=registry, strict=strict)[1]


def convert_hf_config(
    config: Union[str, Path, dict], *, registry: Optional[Registry] = None, strict: bool = False
) -> tuple[dict, ModelSpec]:
    """``(spec dict, validated spec)`` for a Hugging Face config (dict or path).

    Converters check what they read, naming the config's keys; a problem only the spec's validation finds (a
    cross-field rule, say) is reported at the config key the offending value came from, found by value, with
    the spec path in the message; when no key holds it (a derived value), at the document with the spec path.

    Unknown keys are dropped with a warning, or refused with ``strict=True`` (see :func:`hf_config_to_dict`).

    Raises:
        SpecError: as :func:`hf_config_to_dict`, or the converted spec fails validation.
    """
    reg = registry or get_registry()
    cfg = read_config(config)
    data = hf_config_to_dict(cfg, registry=reg, strict=strict)
    try:
        return data, load_spec(dict(data), registry=reg)
    except SpecError as exc:
        label = None if isinstance(config, dict) else str(config)
        raise SpecError([_config_error(path, msg, data, cfg) for path, msg in exc.errors], source=label) from None


def _flatten(doc: Any):
    """``(path, value)`` of every value in a JSON document (paths as :mod:`modkit.core.validation` prints them): scalars,
    and lists (compared whole). Walked without recursion, in document order."""
    stack = [("", doc)]
    while stack:
        path, node = stack.pop()
        if isinstance(node, dict):
            stack.extend((join_path(path, k), v) for k, v in reversed(list(node.items())))
            continue
        yield path, node
        if isinstance(node, list):
            stack.extend((join_path(path, i), v) for i, v in reversed(list(enumerate(node))))


def _same_value(a: Any, b: Any) -> bool:
    if isinstance(a, list) or isinstance(b, list):  # a list the converter copied (LongRoPE factors)
        return isinstance(a, list) and isinstance(b, list) and len(a) == len(b) and all(map(_same_value, a, b))
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return float(a) == float(b)
    return isinstance(a, str) and a == b


def _config_error(path: str, message: str, spec: dict, cfg: dict) -> tuple[str, str]:
    """Re-home one error of the converted spec onto the config key its value came from (see
    :func:`convert_hf_config`)."""
    try:
        value: Any = resolve_path(spec, path, None)
    except PathError:
        value = None
    field = last_key(path) or ""
    if value is not None and not isinstance(value, dict) and value != []:
        keys = [k for k, v in _flatten(cfg) if k and _same_value(v, value)]
        if keys:  # several keys with that value: prefer the one whose name shares a word with the spec field
            words = set(field.split("_"))
            keys.sort(key=lambda k: -len(words & set((last_key(k) or "").split("_"))))
            return keys[0], f"{message} (becomes {path} in the converted spec)"
    return "", f"the converted spec is invalid at {path}: {message}"


# ------------------------------------------------------------------------------------------------ weights


def _mapper(model_type: str, reg: Registry):
    try:
        conv = reg.hf_converter(model_type)
    except RegistryError as exc:
        raise CheckpointError(str(exc)) from None
    if conv.weights is None:
        with_weights = [t for t in reg.hf_model_types() if reg.hf_converter(t).weights is not None]
        raise CheckpointError(
            f"the Hugging Face converter for model_type {model_type!r} ({conv.provider}) converts configs only and "
            f"registers no weight mapper; model types with weights: {', '.join(with_weights) or '(none)'}"
        )
    return conv.weights


def _hf_folder(path: Union[str, Path]) -> Path:
    from modkit.io.atomic import recover
    from modkit.io.checkpoint import checked_path, refuse_pickle

    p = checked_path(path)
    if not p.exists():
        raise CheckpointError(f"{p}: no such file or folder")
    if p.is_file():
        refuse_pickle(p)
        p = p.parent  # config.json, model.safetensors or the index: the folder holds the model
    if not (p / "config.json").is_file():
        hint = " (a modkit checkpoint: use modkit.load)" if (p / "spec.json").is_file() else ""
        raise CheckpointError(f"{p}: no config.json, so not a Hugging Face model folder{hint}")
    recover(p)  # a to_hf interrupted in this folder: finish it (or drop its temporaries)
    return p


def _spec_for(
    spec: Union[ModelSpec, dict, str, Path, None],
    config: dict,
    mapper: Any,
    model_type: str,
    folder: Path,
    reg: Registry,
    strict: bool,
) -> ModelSpec:
    """The spec :func:`from_hf` builds: ``config`` converted when ``spec`` is ``None``, else ``spec`` loaded and
    checked against the checkpoint by the mapper's ``compatibility`` (when it has one).

    Raises:
        CheckpointError: the given spec does not describe the checkpoint (each problem listed).
        SpecError: the config cannot be converted, or the given spec is invalid.
    """
    if spec is None:
        return from_hf_config(config, registry=reg, strict=strict)
    spec = load_spec(spec, registry=reg)
    check = getattr(mapper, "compatibility", None)
    problems = check(spec, config) if callable(check) else []
    if problems:
        raise CheckpointError(
            f"the given spec does not describe the {model_type} checkpoint in {folder}:\n  " + "\n  ".join(problems)
        )
    return spec


def _hf_state(
    source: Any, mapper: Any, spec: ModelSpec, config: dict, model_type: str, reg: Registry
) -> tuple[dict[str, "Tensor"], dict[str, "Tensor"]]:
    """``(state, extras)``: the checkpoint's tensors renamed, split and transposed by ``mapper`` onto the parameter
    names and shapes of ``spec``'s model (built on ``meta``), and the tensors kept aside (``mapper.keep``).

    Raises:
        CheckpointError: missing or unexpected tensors, shape mismatches (all listed together by name).
    """
    from modkit.nn.build import build
    from modkit.io.checkpoint import gather

    state = build(spec, device="meta", registry=reg).state_dict()
    shapes = {k: tuple(v.shape) for k, v in state.items()}
    links = mapper.links(spec, shapes, config)
    left_out = tuple(getattr(mapper, "left_out", ()))
    _notice_left_out(source, left_out, model_type)
    return gather(
        source,
        links,
        shapes,
        keep=getattr(mapper, "keep", ()),
        aliases=getattr(mapper, "aliases", ()),
        what=f"Hugging Face {model_type} checkpoint",
        skip=left_out,
        integer=[k for k, v in state.items() if not v.is_floating_point()],
    )


def _notice_left_out(source: Any, prefixes: Sequence[str], model_type: str) -> None:
    """One :class:`~modkit.core.errors.LeftOutTensorsWarning` counting the stored tensors under each of the
    mapper's ``left_out`` prefixes (the parts of a checkpoint outside the model loaded: a vision tower); nothing
    when none is stored."""
    counts = {p: sum(1 for n in source.names() if n.startswith(p)) for p in prefixes}
    counts = {p: n for p, n in counts.items() if n}
    if not counts:
        return
    parts = ", ".join(f"{n} under {p!r}" for p, n in counts.items())
    warnings.warn(
        LeftOutTensorsWarning(
            f"{sum(counts.values())} tensors of the Hugging Face {model_type} checkpoint are not part of its language "
            f"model and were left out: {parts}"
        ),
        stacklevel=4,  # the caller of from_hf,
    )


def from_hf(
    path: Union[str, Path],
    *,
    device: Any = None,
    dtype: Any = None,
    spec: Union[ModelSpec, dict, str, Path, None] = None,
    registry: Optional[Registry] = None,
    nonfinite: str = "warn",
    check_memory: bool = True,
    strict: bool = False,
) -> "Model":
    """Load a Hugging Face model folder into a modkit model.

    The spec comes from ``config.json`` (:func:`from_hf_config`); the tensors are read from ``model.safetensors``
    or the shards of ``model.safetensors.index.json`` and renamed, split (fused q/k/v, gate/up), transposed
    (GPT-2's ``Conv1D``) by the mapper that the ``model_type``'s plugin registered. Tensors that modkit's model
    does not compute but a lossless export needs (BERT's pooler and token-type table, derivable buffers of old
    checkpoints) are kept in ``model.checkpoint_extras``; the config itself in ``model.hf_config``.

    Args:
        path: the model folder (or a file in it).
        device: target device (default CPU).
        dtype: parameter dtype; default: the checkpoint's (the widest one if it mixes several).
        spec: build this spec instead of the converted one. It must describe the same network, except that its
            RoPE ``layout`` may differ: Hugging Face checkpoints are ``half_split``, and an ``interleaved`` spec gets
            the rows of Wq/Wk permuted per head (the RoPE layout conversion), giving the same logits.
        registry: defaults to the process-wide registry.
        nonfinite: ``"warn"`` (default) or ``"error"``: what to do about NaN or infinite weights (see
            :func:`modkit.load`).
        check_memory: refuse when the weights would not fit in the memory free on ``device``.
        strict: refuse config keys the converter does not know instead of dropping them with a warning.

    Returns:
        :class:`~modkit.nn.model.Model` in eval mode; ``model(input_ids).logits`` ``[batch, seq, vocab_size]``.

    Raises:
        CheckpointError: pickle weights (``pytorch_model.bin``, ``*.pt``: refused, unpickling can execute arbitrary
            code; the message says how to convert them), no weights, a model type without a weight mapper, a spec
            that does not describe this checkpoint, and, all listed together by name: missing tensors,
            unexpected tensors and shape mismatches (with both shapes); a stored head that differs from a tied
            embedding (a tied head is the embedding itself).
        SpecError: the config cannot be converted (each unsupported field named).
    """
    from modkit.io.checkpoint import TensorSource, materialize

    reg = registry or get_registry()
    folder = _hf_folder(path)
    config = read_config(folder)
    model_type = _model_type(config, str(folder / "config.json"))
    mapper = _mapper(model_type, reg)
    source = TensorSource.from_path(folder)
    spec = _spec_for(spec, config, mapper, model_type, folder, reg, strict)
    state, extras = _hf_state(source, mapper, spec, config, model_type, reg)
    model = materialize(
        spec,
        state,
        device=device,
        dtype=dtype,
        registry=reg,
        nonfinite=nonfinite,
        check_memory=check_memory,
        origin=str(source.origin),
    )
    # a wrapper type (the language model of a vision-language checkpoint) keeps what an export of the text type needs
    model.checkpoint_extras = getattr(mapper, "export_extras", lambda e: e)(extras)
    model.hf_config = json.loads(json.dumps(getattr(mapper, "export_config", lambda c: c)(config)))
    return model


def _dtype_name(model: "Model") -> str:
    for p in model.parameters():
        if p.is_floating_point():
            return str(p.dtype).replace("torch.", "")
    return "float32"


_SHARD = re.compile(r"model-\d{5}-of-\d{5}\.safetensors")


def to_hf(
    model: "Model",
    path: Union[str, Path],
    *,
    max_shard_size: int = DEFAULT_MAX_SHARD_SIZE,
    registry: Optional[Registry] = None,
    model_type: Optional[str] = None,
) -> Path:
    """Write ``model`` as a Hugging Face model folder that transformers loads with ``from_pretrained``.

    The model type is ``model_type`` when given, else ``model.spec.metadata["hf_model_type"]`` (set by every
    converted spec), else the one registered type that expresses the spec
    (:func:`modkit.io.hf_types.choose_hf_model_type`; a spec trained from scratch). The config comes
    from the plugin's reverse conversion, checked by converting it back: a spec the model type cannot express
    (e.g. a sandwich-norm block written as ``llama``) is refused, naming every field that would change. Keys of
    the source config that do not shape the network (token ids, generation defaults) are kept when the model came
    from :func:`from_hf`. Weights go to ``model.safetensors``, or to ``model-0000i-of-0000n.safetensors`` shards
    plus ``model.safetensors.index.json`` above ``max_shard_size`` bytes, each written under a temporary name and
    renamed into place together with ``config.json`` as one atomic step (:mod:`modkit.io.atomic`: a kill at any instant
    leaves the old folder or the new one); stale weight files of an earlier save are removed in the same step.

    Args:
        model: a :class:`~modkit.nn.model.Model`.
        path: the output folder (created if needed).
        max_shard_size: largest shard in bytes (default 5 GB).
        registry: defaults to the process-wide registry.
        model_type: the Hugging Face ``model_type`` to write (default: named by the spec or inferred).

    Returns:
        the folder path.

    Raises:
        CheckpointError: no model type named and not exactly one that expresses the spec (the candidates, or the
            components none maps, listed), no weight mapper for it, a spec it cannot express, or a model tensor
            without a counterpart in the format.
    """
    from modkit.io.atomic import commit, recover
    from modkit.io.checkpoint import HF_INDEX_FILE, WEIGHTS_FILE, checked_path

    config, tensors = _hf_export(model, registry or get_registry(), model_type)
    out = checked_path(path)
    if out.exists() and not out.is_dir():
        raise CheckpointError(f"{out} exists and is not a folder")
    out.mkdir(parents=True, exist_ok=True)
    recover(out)
    pairs, written = _write_tmp_files(out, config, tensors, max_shard_size)
    stale = [
        old
        for old in out.iterdir()  # weights of an earlier save that the new files replace
        if (old.name in (WEIGHTS_FILE, HF_INDEX_FILE) or _SHARD.fullmatch(old.name)) and old.name not in written
    ]
    commit(pairs, remove=stale)
    return out


def _hf_export(model: "Model", reg: Registry, model_type: Optional[str] = None) -> tuple[dict, dict[str, Tensor]]:
    """The Hugging Face ``config.json`` dict of ``model`` and its tensors under the checkpoint's names, in mapping
    order.

    Raises:
        CheckpointError: see :func:`to_hf`.
    """
    from modkit.io.checkpoint import export
    from modkit.io.hf_types import choose_hf_model_type

    spec = model.spec
    model_type, _ = choose_hf_model_type(spec, reg, model_type)
    mapper = _mapper(str(model_type), reg)
    config = mapper.hf_config(spec, getattr(model, "hf_config", None))
    config["torch_dtype"] = _dtype_name(model)
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    tensors = export(model, mapper.links(spec, shapes, config), what=f"a Hugging Face {model_type} checkpoint")
    return config, tensors


def _shards(tensors: dict[str, Tensor], max_shard_size: int) -> list[dict[str, Tensor]]:
    """``tensors`` cut into shards of at most ``max_shard_size`` bytes (a larger tensor alone in its shard), in
    mapping order, as transformers does: layers stay together."""
    shards: list[dict] = [{}]
    used = 0
    for name, t in tensors.items():
        size = t.numel() * t.element_size()
        if shards[-1] and used + size > max_shard_size:
            shards.append({})
            used = 0
        shards[-1][name] = t
        used += size
    return shards


def _write_tmp_files(
    out: Path, config: dict, tensors: dict[str, Tensor], max_shard_size: int
) -> tuple[list[tuple[Path, Path]], set[str]]:
    """Write the weights (one file, or shards and their index) and ``config.json`` under temporary names in ``out``;
    on any error the temporary files written so far are removed and the error raised.

    Returns:
        ``([(temporary path, final path)], names of the weight files written)`` for :func:`modkit.io.atomic.commit`.
    """
    from modkit.io.atomic import discard, write_safetensors_tmp, write_text_tmp
    from modkit.io.checkpoint import HF_CONFIG_FILE, HF_INDEX_FILE, WEIGHTS_FILE

    shards = _shards(tensors, max_shard_size)
    pairs = []
    try:
        if len(shards) == 1:
            pairs.append((write_safetensors_tmp(tensors, out / WEIGHTS_FILE, {"format": "pt"}), out / WEIGHTS_FILE))
            written = {WEIGHTS_FILE}
        else:
            weight_map, written = {}, set()
            for i, shard in enumerate(shards, 1):
                fname = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
                pairs.append((write_safetensors_tmp(shard, out / fname, {"format": "pt"}), out / fname))
                weight_map.update({k: fname for k in shard})
                written.add(fname)
            total = sum(t.numel() * t.element_size() for t in tensors.values())
            index = {"metadata": {"total_size": total}, "weight_map": weight_map}
            pairs.append((write_text_tmp(json.dumps(index, indent=2) + "\n", out / HF_INDEX_FILE), out / HF_INDEX_FILE))
            written.add(HF_INDEX_FILE)
        text = json.dumps(encode_special_floats(config), indent=2) + "\n"
        pairs.append((write_text_tmp(text, out / HF_CONFIG_FILE), out / HF_CONFIG_FILE))
    except BaseException:
        for tmp, _ in pairs:
            discard(tmp)
        raise
    return pairs, written

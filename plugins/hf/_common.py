"""Shared pieces of the Hugging Face converters: a config reader that tracks consumed keys, and spec builders.

A converter reads every key it understands through :class:`HFConfig`; :meth:`HFConfig.finish` then looks at
every key that was neither consumed nor listed as irrelevant to the architecture and whose value is not a "nothing"
value (``None``, ``False``, empty string/list/dict): such unknown keys (legacy keys, keys other libraries add, which
transformers ignores too) are dropped with one :class:`modkit.UnknownConfigKeyWarning` naming each key and value, or
refused when the conversion is strict (:func:`modkit.hf.strict_conversion`). Values a converter cannot express are
reported with :meth:`HFConfig.error`; all problems are raised together as one :class:`modkit.SpecError` naming
each field and value. Nothing is dropped silently.

Semantics follow transformers' own configuration and modeling code (read, not copied); where transformers 4.x
``config.json`` files and transformers 5.x ``to_dict()`` output differ (``rope_scaling`` + ``rope_theta`` vs
``rope_parameters``; ``sliding_window_pattern`` vs ``layer_types``), both forms are accepted.
"""

from __future__ import annotations

import json
import math
import warnings
from typing import Any, Callable, Iterable, Optional, Sequence

from modkit import SpecError, UnknownConfigKeyWarning
from modkit.limits import MAX_D_FF, MAX_D_MODEL, MAX_EXPERTS, MAX_HEAD_DIM, MAX_HEADS, MAX_LAYERS, MAX_SEQ_LEN, MAX_VOCAB_SIZE
from modkit.validation import join_path, json_value, last_key

_MISSING = object()

#: transformers' choice of kernels (attention, experts): runtime settings, never written to an export
IMPLEMENTATION_KEYS: frozenset[str] = frozenset(
    {
        "attn_implementation",
        "_attn_implementation",
        "_attn_implementation_autoset",
        "_attn_implementation_internal",
        "experts_implementation",
        "_experts_implementation",
        "_experts_implementation_internal",
    }
)

#: Keys that never change the architecture or the parameter count, for every model type.
IRRELEVANT: frozenset[str] = IMPLEMENTATION_KEYS | frozenset(
    {
        # provenance and storage
        "model_type",  # read by the dispatcher
        "architectures",
        "transformers_version",
        "_name_or_path",
        "name_or_path",
        "_commit_hash",
        "torch_dtype",
        "dtype",
        "use_bfloat16",
        "quantization_config",  # how a checkpoint stores its weights, not what the model is
        "auto_map",  # remote-code hints; model_type decides the architecture here
        # runtime switches of the reference implementation
        "use_cache",
        "cache_implementation",
        "output_hidden_states",
        "output_attentions",
        "return_dict",
        "torchscript",
        "tf_legacy_loss",
        "chunk_size_feed_forward",  # chunked FFN evaluation: same result
        "is_decoder",  # causal-LM classes are causal whatever this says
        "tie_encoder_decoder",  # meaningful only for encoder-decoder models (refused below)
        # task heads and tokenizer
        "id2label",
        "label2id",
        "num_labels",
        "problem_type",
        "finetuning_task",
        "task_specific_params",
        "tokenizer_class",
        "prefix",
        "bos_token_id",
        "eos_token_id",
        "pad_token_id",
        "sep_token_id",
        "decoder_start_token_id",
        # dropout probabilities: training-time regularisation only, no parameters, identity at inference
        "attention_dropout",
        "attn_pdrop",
        "resid_pdrop",
        "embd_pdrop",
        "hidden_dropout",
        "hidden_dropout_prob",
        "attention_probs_dropout_prob",
        "classifier_dropout",
        "summary_first_dropout",
        "activation_dropout",
        "dropout",
        # generation defaults (transformers.GenerationConfig): decoding settings, not the network
        "assistant_confidence_threshold",
        "assistant_lookbehind",
        "bad_words_ids",
        "begin_suppress_tokens",
        "diversity_penalty",
        "do_sample",
        "early_stopping",
        "encoder_no_repeat_ngram_size",
        "encoder_repetition_penalty",
        "epsilon_cutoff",
        "eta_cutoff",
        "exponential_decay_length_penalty",
        "forced_bos_token_id",
        "forced_eos_token_id",
        "length_penalty",
        "max_length",
        "min_length",
        "no_repeat_ngram_size",
        "num_assistant_tokens",
        "num_assistant_tokens_schedule",
        "num_beam_groups",
        "num_beams",
        "num_return_sequences",
        "output_scores",
        "remove_invalid_values",
        "repetition_penalty",
        "return_dict_in_generate",
        "suppress_tokens",
        "target_lookbehind",
        "temperature",
        "top_k",
        "top_p",
        "typical_p",
    }
)

#: Keys every model type must leave at one value: (allowed value, why).
EXPECTED: dict[str, tuple[Any, str]] = {
    "is_encoder_decoder": (False, "modkit builds decoder-only models"),
    "add_cross_attention": (False, "cross-attention to an encoder is not part of a decoder-only spec"),
    "cross_attention_hidden_size": (None, "cross-attention to an encoder is not part of a decoder-only spec"),
    "pruned_heads": ({}, "pruned attention heads give layers of different widths, which a spec cannot describe"),
}

#: Hugging Face activation names (transformers.activations.ACT2CLS) → modkit activation names.
ACTIVATIONS: dict[str, str] = {
    "silu": "silu",
    "swish": "silu",
    "gelu": "gelu",
    "gelu_python": "gelu",  # erf GELU in Python: same function
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu_python_tanh": "gelu_tanh",
    "gelu_fast": "gelu_tanh",  # 0.5x(1 + tanh(0.79788456 x (1 + 0.044715 x²))): the tanh approximation
    "relu": "relu",
}


#: modkit's bound (:mod:`modkit.limits`) on each size key of a Hugging Face config, checked where it is read
HF_BOUNDS: dict[str, int] = {
    **{k: MAX_VOCAB_SIZE for k in ("vocab_size", "type_vocab_size")},
    **{k: MAX_D_MODEL for k in ("hidden_size", "n_embd", "d_model")},
    **{k: MAX_LAYERS for k in ("num_hidden_layers", "n_layer", "num_layers", "sliding_window_pattern", "max_window_layers")},
    **{k: MAX_HEADS for k in ("num_attention_heads", "n_head", "num_key_value_heads", "num_kv_heads", "n_head_kv")},
    **{k: MAX_HEAD_DIM for k in ("head_dim",)},
    **{k: MAX_D_FF for k in ("intermediate_size", "n_inner", "ffn_hidden_size", "moe_intermediate_size")},
    **{k: MAX_SEQ_LEN for k in ("max_position_embeddings", "n_positions", "n_ctx", "sliding_window", "original_max_position_embeddings")},
    **{k: MAX_EXPERTS for k in ("num_local_experts", "num_experts", "num_experts_per_tok")},
}


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return "the bool"
    if isinstance(value, str):
        return "the string"
    if isinstance(value, (dict, list)):
        return "an object" if isinstance(value, dict) else "an array"
    return "null" if value is None else f"a {type(value).__name__}"


def _short(value: Any) -> str:
    if isinstance(value, (dict, list)):
        return ""
    text = repr(value)
    return text if len(text) <= 40 else text[:30] + f"... ({len(text)} characters)"


def _is_nothing(value: Any) -> bool:
    return value is None or value is False or (isinstance(value, (str, list, tuple, dict)) and len(value) == 0)


class HFConfig:
    """A Hugging Face config dict being converted: typed reads that record consumed keys, collected errors.

    Args:
        cfg: the ``config.json`` dict (or ``PretrainedConfig.to_dict()``).
        model_type: for messages.
        ignore: extra keys irrelevant to the architecture for this model type (say why where they are listed).
    """

    def __init__(self, cfg: dict, model_type: str, ignore: Iterable[str] = ()):
        if not isinstance(cfg, dict):
            raise SpecError([("", f"a Hugging Face config is a JSON object, got {type(cfg).__name__}")])
        self.cfg = cfg
        self.model_type = model_type
        self.ignored = set(IRRELEVANT) | set(ignore)
        self.used: set[str] = set()
        self.errors: list[tuple[str, str]] = []
        self.unknown: dict[str, Any] = {}  # nested keys nobody reads (e.g. "rope_scaling.foo"), reported by finish

    # ------------------------------------------------------------------ reads
    def __contains__(self, key: str) -> bool:
        return key in self.cfg

    def get(self, key: str, default: Any = None, *, aliases: Sequence[str] = ()) -> Any:
        """The value of ``key`` (or the first present alias), else ``default``; marks them all consumed.

        A present ``null`` counts as absent (transformers then falls back to its default), so ``default`` is
        returned for it too.
        """
        value = _MISSING
        for name in (key, *aliases):
            self.used.add(name)
            if value is _MISSING and name in self.cfg and self.cfg[name] is not None:
                value = self.cfg[name]
        return default if value is _MISSING else value

    def number(
        self,
        key: str,
        default: Any = None,
        *,
        aliases: Sequence[str] = (),
        integer: bool = False,
        positive: bool = True,
        minimum: Optional[float] = None,
        maximum: Optional[int] = None,
    ) -> Any:
        """Like :meth:`get`, checking the value (see :meth:`check_number`); records an error and returns
        ``default`` otherwise."""
        value = self.get(key, default, aliases=aliases)
        if value is None:
            return None
        present = next((n for n in (key, *aliases) if self.cfg.get(n) is not None), key)
        return self.check_number(present, value, default, integer=integer, positive=positive, minimum=minimum, maximum=maximum)

    def check_number(
        self,
        path: str,
        value: Any,
        default: Any = None,
        *,
        integer: bool = False,
        positive: bool = True,
        minimum: Optional[float] = None,
        maximum: Optional[int] = None,
    ) -> Any:
        """``value`` if it is a finite number (an int when ``integer``: JSON ``12.0`` and ``true`` are not), positive
        when ``positive``, at least ``minimum``, at most ``maximum`` (default: modkit's bound for the size ``path`` names, see
        :data:`HF_BOUNDS`; any integer is bounded by the largest one). Otherwise records an error on ``path`` (the
        config's own key) and returns ``default``."""
        kind = ("positive " if positive else "") + ("integer" if integer else "number")
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            self.error(path, f"must be a {kind}, got {_kind(value)} {_short(value)}")
            return default
        if integer and not isinstance(value, int):
            hint = "; write it without a decimal point or exponent" if math.isfinite(value) and value.is_integer() else ""
            self.error(path, f"must be an integer, got the float {_short(value)}{hint}")
            return default
        if isinstance(value, float) and not math.isfinite(value):
            self.error(path, f"must be a finite number, got {json_value(value)}")
            return default
        if not integer and isinstance(value, int) and abs(value) > 2**63:
            self.error(path, f"is out of the range of a float64 number: {_short(value)}")
            return default
        if positive and value <= 0:
            self.error(path, f"must be a {kind}, got {_short(value)}")
            return default
        if minimum is not None and value < minimum:
            self.error(path, f"must be >= {minimum}, got {_short(value)}")
            return default
        bound = maximum if maximum is not None else HF_BOUNDS.get(last_key(path) or "", MAX_SEQ_LEN if integer else None)
        if bound is not None and value > bound:
            self.error(path, f"= {_short(value)} exceeds {bound:,}, modkit's bound for this size (modkit.limits; far above any published model)")
            return default
        return value

    def flag(self, key: str, default: bool = False, *, aliases: Sequence[str] = ()) -> bool:
        """A boolean key; records an error for a non-boolean value."""
        value = self.get(key, default, aliases=aliases)
        if not isinstance(value, bool):
            self.error(key, f"must be true or false, got {json_value(value)}")
            return bool(default)
        return value

    def expect(self, key: str, allowed: Any, why: str) -> Any:
        """Consume ``key`` and record an error unless it is absent, null or equal to ``allowed``."""
        self.used.add(key)
        value = self.cfg.get(key)
        if value is not None and (value != allowed or type(value) is not type(allowed)):  # 0 is not false
            self.error(key, f"unsupported value {_short(value) or _kind(value)} (only {json.dumps(allowed)} is supported): {why}")
        return self.cfg.get(key, allowed)

    def ignore(self, *keys: str) -> None:
        """Declare ``keys`` irrelevant to the architecture for this model type."""
        self.ignored.update(keys)

    def error(self, key: str, message: str) -> None:
        """Record a problem with field ``key`` (a dotted path such as ``rope_scaling.rope_type``)."""
        self.errors.append((key, message))

    def activation(self, key: str, default: str) -> str:
        """A Hugging Face activation name mapped to modkit's (``silu``, ``gelu``, ``gelu_tanh``, ``relu``)."""
        name = self.get(key, default)
        act = ACTIVATIONS.get(name) if isinstance(name, str) else None
        if act is None:
            shown = repr(name) if isinstance(name, str) else json_value(name, 40)
            self.error(key, f"unsupported activation {shown}; supported: {', '.join(sorted(ACTIVATIONS))}")
            return "silu"
        return act

    # ------------------------------------------------------------------ finish
    def unknown_key(self, path: str, value: Any) -> None:
        """Record a nested key nobody reads (``rope_scaling.foo``); :meth:`finish` reports it with the top-level ones."""
        if not _is_nothing(value):
            self.unknown[path] = value

    def finish(self, spec: dict) -> dict:
        """Check every key was consumed or is irrelevant; return ``spec`` or raise every problem.

        Unknown keys (neither consumed nor irrelevant, with a value that is not "nothing") are dropped with one
        :class:`modkit.UnknownConfigKeyWarning` naming each key and value; a strict conversion refuses them.

        Raises:
            SpecError: one entry per unsupported field, and with strict conversion per unknown key, naming it and
                its value.
        """
        from modkit.hf import strict_conversion

        for key, (allowed, why) in EXPECTED.items():
            if key not in self.used:
                self.expect(key, allowed, why)
        unknown = {join_path("", k): self.cfg[k] for k in sorted(self.cfg)  # (as paths: a key "a.b" is ["a.b"])
                   if k not in self.used and k not in self.ignored and not _is_nothing(self.cfg[k])}
        unknown.update(self.unknown)
        if strict_conversion():
            for key, value in unknown.items():
                self.error(
                    key,
                    f"unknown field for model_type {self.model_type!r} with value {_short(value) or _kind(value)}; the "
                    "converter does not know it, and strict conversion refuses what it does not know (without strict it "
                    "is dropped with a warning, as transformers ignores it)",
                )
        if self.errors:
            raise SpecError(list(dict.fromkeys(self.errors)), source=f"Hugging Face {self.model_type} config")
        if unknown:
            warnings.warn(UnknownConfigKeyWarning(self.model_type, unknown), stacklevel=2)
        return spec


# ---------------------------------------------------------------------------------------------- RoPE


def rope(
    r: HFConfig,
    *,
    default_theta: float = 10000.0,
    layer_type: Optional[str] = None,
    theta_key: str = "rope_theta",
    scaling_key: Optional[str] = "rope_scaling",
    default_partial: float = 1.0,
    layout: str = "half_split",
    original_at_top: bool = False,
    max_seq_len: Optional[int] = None,
) -> dict:
    """The ``rope`` position spec from either config form.

    transformers 5 writes ``rope_parameters`` (``{"rope_type", "rope_theta", "partial_rotary_factor", ...}``, or
    one such dict per layer type); 4.x files have ``rope_theta``, ``rope_scaling`` (``type`` or ``rope_type``)
    and ``partial_rotary_factor`` at the top level. Values inside the dict win over top-level ones, as in
    ``RotaryEmbeddingConfigMixin.convert_rope_params_to_dict``. Scaling types (``modeling_rope_utils``):

    * ``linear``: ``factor``;
    * ``llama3``: ``factor``, ``low_freq_factor``, ``high_freq_factor``, ``original_max_position_embeddings``;
    * ``dynamic``: ``factor``; the trained length is ``max_position_embeddings`` (as in
      ``_compute_dynamic_ntk_parameters``);
    * ``yarn``: ``factor`` (default ``max_position_embeddings / original_max_position_embeddings``), ``beta_fast``
      (``or 32``), ``beta_slow`` (``or 1``), ``mscale``, ``mscale_all_dim``, ``attention_factor``, ``truncate``;
    * ``longrope`` (legacy ``su``): ``short_factor``, ``long_factor``, ``factor``, ``attention_factor``.

    ``original_max_position_embeddings`` comes from the scaling dict, else ``max_position_embeddings``; with
    ``original_at_top`` (Phi-3, whose config class has the key) the top-level key wins, as in
    ``standardize_rope_params``. Other keys of the dict are unknown keys (:meth:`HFConfig.unknown_key`).

    Args:
        layer_type: pick this entry when ``rope_parameters`` is nested per layer type (Gemma 3).
        theta_key: the 4.x top-level key of the base (Gemma 3 local layers: ``rope_local_base_freq``).
        scaling_key: the 4.x top-level scaling key, or ``None`` when it does not apply to these layers.
        original_at_top: the top-level ``original_max_position_embeddings`` overrides the dict's (Phi-3).
        max_seq_len: the model's ``max_position_embeddings`` (with the config class's default); default the key's
            value in the config.
    """
    params = r.get("rope_parameters")
    legacy = r.get(scaling_key) if scaling_key else None
    top_theta = r.number(theta_key)
    top_partial = r.number("partial_rotary_factor")
    path = "rope_parameters"
    source: Any = None
    for key, value in ((scaling_key, legacy), ("rope_parameters", params)):
        if value is not None and not isinstance(value, dict):  # [] is not "no scaling": it is not an object at all
            r.error(str(key), f"must be an object (or null), got {_kind(value)} {_short(value)}")
    legacy = legacy if isinstance(legacy, dict) else None
    params = params if isinstance(params, dict) else None
    if legacy:
        source, path = legacy, scaling_key
    elif params:
        source = params
        if isinstance(params, dict) and (
            any(isinstance(v, dict) for v in params.values()) or set(params) & {"full_attention", "sliding_attention"}
        ):
            if layer_type is None:
                r.error("rope_parameters", f"per-layer-type RoPE parameters {sorted(params)} are not used by {r.model_type}")
                source = {}
            else:
                source, path = params.get(layer_type) or {}, join_path("rope_parameters", layer_type)
    if source is None:
        source = {}
    if not isinstance(source, dict):
        r.error(path, f"must be an object, got {_kind(source)} {_short(source)}")
        source = {}
    d = dict(source)
    rtype = d.pop("rope_type", None)
    legacy_type = d.pop("type", None)
    rtype = rtype or legacy_type or "default"
    theta = d.pop("rope_theta", None)
    if theta is not None:
        theta = r.check_number(join_path(path, "rope_theta"), theta, default_theta)
    theta = theta if theta is not None else top_theta if top_theta is not None else default_theta
    partial = d.pop("partial_rotary_factor", None)
    if partial is not None:
        partial = r.check_number(join_path(path, "partial_rotary_factor"), partial, default_partial)
    partial = partial if partial is not None else top_partial if top_partial is not None else default_partial
    spec: dict[str, Any] = {"type": "rope", "theta": float(theta)}
    if layout != "half_split":
        spec["layout"] = layout
    if not (isinstance(partial, (int, float)) and not isinstance(partial, bool) and 0 < partial <= 1):
        r.error(join_path(path, "partial_rotary_factor"), f"must lie in (0, 1], got {json_value(partial)}")
    elif partial != 1:
        spec["partial_rotary"] = float(partial)
    if not isinstance(rtype, str):
        r.error(join_path(path, "rope_type" if "rope_type" in source else "type"), f"must be a string naming the RoPE scaling, got {_kind(rtype)} {_short(rtype)}")
        rtype, d = "default", {}
    max_pos = max_seq_len if max_seq_len is not None else r.cfg.get("max_position_embeddings")

    def number(key: str, what: str, *, required: bool = False, positive: bool = True, default: Any = None) -> Any:
        value = d.pop(key, None)
        if value is None:
            if required:
                r.error(join_path(path, key), f"required by {what}")
            return default
        value = r.check_number(join_path(path, key), value, None, positive=positive)
        return default if value is None else float(value)

    def original() -> Optional[int]:
        inside = d.pop("original_max_position_embeddings", None)
        top = r.get("original_max_position_embeddings") if original_at_top else None
        value = top if top is not None else inside if inside is not None else max_pos
        where = (
            "original_max_position_embeddings" if top is not None
            else join_path(path, "original_max_position_embeddings") if inside is not None
            else "max_position_embeddings"
        )
        if value is None:
            r.error(where, "must be a positive integer, got null")
            return None
        return r.check_number(where, value, None, integer=True)

    what = f"{rtype} RoPE scaling"
    if rtype == "default":
        pass
    elif rtype == "linear":
        factor = number("factor", what, required=True)
        if factor is not None:
            spec["scaling"] = {"type": "linear", "factor": factor}
    elif rtype == "llama3":
        scaling: dict[str, Any] = {"type": "llama3"}
        for key in ("factor", "low_freq_factor", "high_freq_factor"):
            scaling[key] = number(key, what, required=True)
        low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
        if low is not None and high is not None and high <= low:
            r.error(join_path(path, "high_freq_factor"), f"= {high} must exceed low_freq_factor = {low}")
        scaling["original_max_seq_len"] = original()
        spec["scaling"] = scaling
    elif rtype == "dynamic":
        factor = number("factor", what, required=True)
        if max_seq_len is None and max_pos is not None:
            max_pos = r.check_number("max_position_embeddings", max_pos, None, integer=True)
        spec["scaling"] = {"type": "dynamic", "factor": factor, "original_max_seq_len": max_pos}
    elif rtype == "yarn":
        omax = original()
        factor = number("factor", what)
        if factor is None and omax and isinstance(max_pos, int) and not isinstance(max_pos, bool):
            factor = max_pos / omax  # transformers: the ratio of the two lengths when factor is not given
        scaling = {"type": "yarn", "factor": factor, "original_max_seq_len": omax}
        # transformers reads these with `or` defaults: 0 and null mean the default too
        scaling["beta_fast"] = number("beta_fast", what, positive=False) or 32.0
        scaling["beta_slow"] = number("beta_slow", what, positive=False) or 1.0
        for key in ("mscale", "mscale_all_dim"):
            value = number(key, what, positive=False)
            if value is not None:
                scaling[key] = value
        af = number("attention_factor", what)
        if af is not None:
            scaling["attention_factor"] = af
        truncate = d.pop("truncate", None)
        if truncate is not None and not isinstance(truncate, bool):
            r.error(join_path(path, "truncate"), f"must be true or false, got {_kind(truncate)} {_short(truncate)}")
        elif truncate is False:
            scaling["truncate"] = False
        spec["scaling"] = scaling
    elif rtype in ("longrope", "su"):  # 'su' is the name of LongRoPE in Phi-3's first configs
        scaling = {"type": "longrope"}
        for key in ("short_factor", "long_factor"):
            value = d.pop(key, None)
            ok = isinstance(value, list) and value and all(
                isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and 0 < v <= 2**63 for v in value
            )
            if not ok:
                shown = _short(value) or (f"{_kind(value)} of {len(value)}" if isinstance(value, (list, dict)) else _kind(value))
                r.error(join_path(path, key), f"LongRoPE needs a non-empty list of positive finite numbers, got {shown}")
            scaling[key] = [float(v) for v in value] if ok else [1.0]
        scaling["original_max_seq_len"] = original()
        for key in ("factor", "attention_factor"):
            value = number(key, what)
            if value is not None:
                scaling[key] = value
        spec["scaling"] = scaling
    else:
        key = "rope_type" if "rope_type" in source else "type"
        r.error(
            join_path(path, key),
            f"unsupported RoPE scaling {rtype!r}; modkit's rope supports 'default', 'linear', 'llama3', 'dynamic', "
            "'yarn' and 'longrope' ('su')",
        )
        d.clear()
    for key, value in d.items():
        r.unknown_key(join_path(path, key), value)
    return spec


# ---------------------------------------------------------------------------------------------- pieces


def attention(
    d_model: int,
    n_heads: int,
    n_kv_heads: int,
    head_dim: Optional[int] = None,
    *,
    bias: Sequence[bool] = (False, False, False, False),
    qk_norm: Optional[dict] = None,
    qk_norm_scope: str = "head",
    sliding_window: Optional[int] = None,
    softmax_scale: Optional[float] = None,
    logit_softcap: Optional[float] = None,
) -> dict:
    """An attention spec (``mha``/``mqa``/``gqa`` chosen from the head counts), default-valued fields left out."""
    if n_kv_heads == n_heads:
        spec: dict[str, Any] = {"type": "mha", "n_heads": n_heads}
    elif n_kv_heads == 1:
        spec = {"type": "mqa", "n_heads": n_heads}
    else:
        spec = {"type": "gqa", "n_heads": n_heads, "n_kv_heads": n_kv_heads}
    if head_dim is not None and (d_model % n_heads or d_model // n_heads != head_dim):
        spec["head_dim"] = head_dim
    for name, on in zip(("q_bias", "k_bias", "v_bias", "o_bias"), bias):
        if on:
            spec[name] = True
    if qk_norm is not None:
        spec["qk_norm"] = qk_norm
        if qk_norm_scope != "head":
            spec["qk_norm_scope"] = qk_norm_scope
    if sliding_window is not None:
        spec["sliding_window"] = sliding_window
    if softmax_scale is not None:
        spec["softmax_scale"] = softmax_scale
    if logit_softcap is not None:
        spec["logit_softcap"] = float(logit_softcap)
    return spec


def gated_ffn(d_ff: int, activation: str, bias: bool = False) -> dict:
    """``swiglu`` for silu, ``geglu`` for the tanh GELU, else the gated MLP with an explicit activation."""
    if activation == "silu":
        spec: dict[str, Any] = {"type": "swiglu", "d_ff": d_ff}
    elif activation == "gelu_tanh":
        spec = {"type": "geglu", "d_ff": d_ff}
    elif activation == "gelu":
        spec = {"type": "geglu", "d_ff": d_ff, "activation": "gelu"}
    else:
        spec = {"type": "swiglu", "d_ff": d_ff, "activation": activation}
    if bias:
        spec["bias"] = True
    return spec


def rmsnorm(eps: float, unit_offset: bool = False) -> dict:
    """An ``rmsnorm`` spec."""
    return {"type": "rmsnorm", "eps": float(eps), **({"unit_offset": True} if unit_offset else {})}


def layernorm(eps: float, bias: bool = True) -> dict:
    """A ``layernorm`` spec."""
    return {"type": "layernorm", "eps": float(eps), **({} if bias else {"bias": False})}


def layer_selector(indices: Sequence[int], n_layers: int) -> Any:
    """The most readable ``layers`` value for sorted ``indices``: a range ``{start, stop, step}`` or a list."""
    idx = list(indices)
    if len(idx) >= 2:
        step = idx[1] - idx[0]
        if step > 0 and all(b - a == step for a, b in zip(idx, idx[1:])):
            sel: dict[str, int] = {}
            if idx[0]:
                sel["start"] = idx[0]
            if idx[-1] + step < n_layers:
                sel["stop"] = idx[-1] + 1
            if step != 1:
                sel["step"] = step
            return sel
    return idx


def per_layer(
    variants: Sequence[Any], n_layers: int, slots: Callable[[Any], dict]
) -> tuple[Any, list[dict]]:
    """Split per-layer variants into the block default (the most common; ties go to layer 0's) and overrides.

    Args:
        variants: one hashable description per layer.
        slots: maps a variant to the slots it sets, e.g. ``{"attention": {...}, "position": {...}}``.

    Returns:
        ``(default variant, overrides)`` with one override per other variant, in order of first appearance.
    """
    counts: dict[Any, int] = {}
    for v in variants:
        counts[v] = counts.get(v, 0) + 1
    default = max(counts, key=lambda v: (counts[v], v == variants[0]))
    overrides = []
    for v in counts:
        if v == default:
            continue
        layers = [i for i, x in enumerate(variants) if x == v]
        overrides.append({"layers": layer_selector(layers, n_layers), **slots(v)})
    return default, overrides


def model_spec(
    r: HFConfig,
    *,
    vocab_size: int,
    d_model: int,
    n_layers: int,
    max_seq_len: int,
    position: dict,
    block: dict,
    overrides: Sequence[dict] = (),
    final_norm: Optional[dict] = None,
    tie_embeddings: bool = False,
    lm_head_bias: bool = False,
    embedding_scale: Any = None,
    final_logit_softcap: Optional[float] = None,
    init_std: Optional[float] = None,
) -> dict:
    """Assemble the top-level spec dict (``name``/``description`` from the config's provenance)."""
    source = r.cfg.get("_name_or_path") or r.cfg.get("name_or_path")
    archs = r.cfg.get("architectures") or []
    arch = f" ({archs[0]})" if isinstance(archs, list) and archs else ""
    spec: dict[str, Any] = {
        "schema_version": 1,
        "name": str(source) if source else r.model_type,
        "description": f"Converted from a Hugging Face {r.model_type} config{arch}.",
        "metadata": {"hf_model_type": r.model_type},
        "vocab_size": vocab_size,
        "d_model": d_model,
        "n_layers": n_layers,
        "max_seq_len": max_seq_len,
        "position": position,
        "block": block,
    }
    if overrides:
        spec["overrides"] = list(overrides)
    if embedding_scale is not None:
        spec["embedding_scale"] = embedding_scale
    spec["final_norm"] = final_norm
    spec["tie_embeddings"] = bool(tie_embeddings)
    if lm_head_bias:
        spec["lm_head_bias"] = True
    if final_logit_softcap is not None:
        spec["final_logit_softcap"] = float(final_logit_softcap)
    if init_std is not None:
        spec["init_std"] = float(init_std)
    dropout = read_dropout(r)
    if any(dropout.values()):
        spec["dropout"] = dropout
    return spec


#: Where each model type keeps the spec's ``dropout`` fields: spec field -> (config key, transformers' default).
#: A field a model type cannot express is absent (its config then describes 0). Model types not listed keep
#: only ``attention_dropout`` (Llama and its relatives). BERT's ``hidden_dropout_prob`` serves the embeddings
#: and the residuals alike; GPT-2 and BERT default to 0.1 in transformers, the others to 0.
DROPOUT_KEYS: dict[str, dict[str, tuple[str, float]]] = {
    "gpt2": {"embedding": ("embd_pdrop", 0.1), "attention": ("attn_pdrop", 0.1), "residual": ("resid_pdrop", 0.1)},
    "phi": {"embedding": ("embd_pdrop", 0.0), "attention": ("attention_dropout", 0.0), "residual": ("resid_pdrop", 0.0)},
    "phi3": {"embedding": ("embd_pdrop", 0.0), "attention": ("attention_dropout", 0.0), "residual": ("resid_pdrop", 0.0)},
    "falcon": {"attention": ("attention_dropout", 0.0), "residual": ("hidden_dropout", 0.0)},
    "gemma2": {"attention": ("attention_dropout", 0.0)},  # Gemma2Attention's dropout on the probabilities
    "bert": {
        "embedding": ("hidden_dropout_prob", 0.1),
        "attention": ("attention_probs_dropout_prob", 0.1),
        "residual": ("hidden_dropout_prob", 0.1),
    },
}
_DEFAULT_DROPOUT_KEYS = {"attention": ("attention_dropout", 0.0)}


def read_dropout(r: HFConfig) -> dict[str, float]:
    """The spec's ``dropout`` object from the config's dropout probabilities (see :data:`DROPOUT_KEYS`)."""
    out = {}
    for name, (key, default) in DROPOUT_KEYS.get(r.model_type, _DEFAULT_DROPOUT_KEYS).items():
        value = r.number(key, default, positive=False)
        if value is not None and not 0 <= value < 1:
            r.error(key, f"a dropout probability must lie in [0, 1), got {json_value(value)}")
            value = default
        out[name] = float(value)
    return out


def dropout_config(spec: Any, model_type: str) -> dict[str, float]:
    """The config keys holding ``spec.dropout`` for ``model_type`` (the reverse of :func:`read_dropout`)."""
    return {key: float(getattr(spec.dropout, name)) for name, (key, _) in DROPOUT_KEYS.get(model_type, _DEFAULT_DROPOUT_KEYS).items()}


def sizes(r: HFConfig, defaults: dict, names: Optional[dict] = None) -> dict:
    """Read the core sizes with transformers' class defaults; ``names`` maps ours to (key, *aliases)."""
    names = names or {}
    keys = {
        "vocab_size": ("vocab_size",),
        "d_model": ("hidden_size",),
        "n_layers": ("num_hidden_layers",),
        "n_heads": ("num_attention_heads",),
        "max_seq_len": ("max_position_embeddings",),
        **names,
    }
    out = {}
    for ours, (key, *aliases) in keys.items():
        out[ours] = r.number(key, defaults.get(key), aliases=aliases, integer=True)
    return out


def head_dim_of(r: HFConfig, d_model: int, n_heads: int, default: Optional[int] = None) -> int:
    """``head_dim`` from the config, else ``default``, else ``d_model // n_heads`` (transformers' fallback)."""
    value = r.number("head_dim", default, integer=True)
    if value is None:
        if d_model % n_heads:
            r.error("num_attention_heads", f"hidden_size = {d_model} is not divisible by num_attention_heads = {n_heads} and head_dim is not given")
        return d_model // n_heads
    return value


def kv_heads_of(r: HFConfig, n_heads: int, key: str = "num_key_value_heads", default: Optional[int] = None) -> int:
    """KV head count (``None`` means ``n_heads``), checked to divide ``n_heads``."""
    kv = r.number(key, default, integer=True)
    kv = n_heads if kv is None else kv
    if n_heads % kv:
        r.error(key, f"{key} = {kv} does not divide num_attention_heads = {n_heads}")
    return kv


"""The config reader of the Hugging Face converters: typed reads that record consumed keys, collected errors.

A model type's table (:mod:`._keys`) reads every key it understands through :class:`HFConfig`;
:meth:`HFConfig.finish` then looks at every key that was neither consumed nor listed as irrelevant to the
architecture and whose value is not a "nothing" value (``None``, ``False``, empty string/list/dict): such unknown
keys (legacy keys, keys other libraries add, which transformers ignores too) are dropped with one
:class:`modkit.UnknownConfigKeyWarning` naming each key and value, or refused when the conversion is strict
(:func:`modkit.io.hf.strict_conversion`). Values a converter cannot express are reported with :meth:`HFConfig.error`;
all problems are raised together as one :class:`modkit.SpecError` naming each field and value. Nothing is dropped
silently.

Semantics follow transformers' own configuration and modeling code (read, not copied); where transformers 4.x
``config.json`` files and transformers 5.x ``to_dict()`` output differ (``rope_scaling`` + ``rope_theta`` vs
``rope_parameters``; ``sliding_window_pattern`` vs ``layer_types``), both forms are accepted.
"""

from __future__ import annotations

import json
import math
import warnings
from typing import Any, Iterable, Optional, Sequence

from modkit.plugin import (
    join_path,
    json_value,
    last_key,
    MAX_D_FF,
    MAX_D_MODEL,
    MAX_EXPERTS,
    MAX_HEAD_DIM,
    MAX_HEADS,
    MAX_LAYERS,
    MAX_SEQ_LEN,
    MAX_VOCAB_SIZE,
    SpecError,
    UnknownConfigKeyWarning,
)

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

#: where a config came from and how its checkpoint is stored: never written into an export by the carry-over
PROVENANCE: frozenset[str] = frozenset(
    {
        "model_type",  # read by the dispatcher
        "transformers_version",
        "_name_or_path",
        "name_or_path",
        "_commit_hash",
        "torch_dtype",
        "dtype",
        "use_bfloat16",
        "quantization_config",  # how a checkpoint stores its weights, not what the model is
    }
)

#: Keys that never change the architecture or the parameter count, for every model type.
IRRELEVANT: frozenset[str] = (
    IMPLEMENTATION_KEYS
    | PROVENANCE
    | frozenset(
        {
            "architectures",
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
    # activation components (modkit_plugins.activations): an mlp's activation_unit, not a gated FFN's activation
    "relu2": "relu2",
    "xielu": "xielu",
}

#: the modkit activations of :data:`ACTIVATIONS` that are activation components, held by an ``mlp``'s
#: ``activation_unit`` (the gated FFNs and the mixtures' experts take the named ones only)
UNIT_ACTIVATIONS = ("relu2", "xielu")


#: modkit's bound (:mod:`modkit.core.limits`) on each size key of a Hugging Face config, checked where it is read
HF_BOUNDS: dict[str, int] = {
    **{k: MAX_VOCAB_SIZE for k in ("vocab_size", "type_vocab_size")},
    **{k: MAX_D_MODEL for k in ("hidden_size", "n_embd", "d_model")},
    **{
        k: MAX_LAYERS
        for k in ("num_hidden_layers", "n_layer", "num_layers", "sliding_window_pattern", "max_window_layers")
    },
    **{k: MAX_HEADS for k in ("num_attention_heads", "n_head", "num_key_value_heads", "num_kv_heads", "n_head_kv")},
    **{k: MAX_HEAD_DIM for k in ("head_dim",)},
    **{k: MAX_D_FF for k in ("intermediate_size", "n_inner", "ffn_hidden_size", "moe_intermediate_size")},
    **{
        k: MAX_SEQ_LEN
        for k in (
            "max_position_embeddings",
            "n_positions",
            "n_ctx",
            "sliding_window",
            "original_max_position_embeddings",
        )
    },
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
        self.key_of: dict[str, str] = {}  # field -> the config key it was read from (for messages)

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
        return self.check_number(
            present, value, default, integer=integer, positive=positive, minimum=minimum, maximum=maximum
        )

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
            hint = (
                "; write it without a decimal point or exponent" if math.isfinite(value) and value.is_integer() else ""
            )
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
        bound = (
            maximum if maximum is not None else HF_BOUNDS.get(last_key(path) or "", MAX_SEQ_LEN if integer else None)
        )
        if bound is not None and value > bound:
            self.error(
                path,
                f"= {_short(value)} exceeds {bound:,}, modkit's bound for this size (modkit.core.limits; far above any published model)",
            )
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
            self.error(
                key,
                f"unsupported value {_short(value) or _kind(value)} (only {json.dumps(allowed)} is supported): {why}",
            )
        return self.cfg.get(key, allowed)

    def ignore(self, *keys: str) -> None:
        """Declare ``keys`` irrelevant to the architecture for this model type."""
        self.ignored.update(keys)

    def error(self, key: str, message: str) -> None:
        """Record a problem with field ``key`` (a dotted path such as ``rope_scaling.rope_type``)."""
        self.errors.append((key, message))

    def activation(self, key: str, default: str) -> str:
        """A Hugging Face activation name mapped to modkit's (``silu``, ``gelu``, ``gelu_tanh``, ``relu``, and the
        activation components ``relu2``, ``xielu``)."""
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
        from modkit.plugin import strict_conversion

        for key, (allowed, why) in EXPECTED.items():
            if key not in self.used:
                self.expect(key, allowed, why)
        unknown = {
            join_path("", k): self.cfg[k]
            for k in sorted(self.cfg)  # (as paths: a key "a.b" is ["a.b"])
            if k not in self.used and k not in self.ignored and not _is_nothing(self.cfg[k])
        }
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

"""The language model of a multimodal checkpoint, declared: :class:`LanguageModelOf`.

The published checkpoints of several model families are vision-language ones: transformers'
``<Family>ForConditionalGeneration`` holds a vision tower, a projector and the family's text model, and the
checkpoint's ``config.json`` has the wrapper's ``model_type`` (``qwen3_5``, ``gemma3``, ``llama4``) with the text
model's config under a key (``text_config``). A :class:`LanguageModelOf` declares, for one such wrapper:

* ``model_type``: the wrapper's ``model_type``; ``text``: the declared text type (:class:`._type.HFType`) that
  converts the language model; ``text_key``: the config key holding the text config;
* ``lifted``: wrapper keys that decide a text key (``tie_word_embeddings``: transformers ties the wrapper's head
  by the wrapper's config), each with the wrapper class's default;
* ``ignore``: the wrapper keys that are not part of the language model (the vision config, the image token ids),
  each with why;
* ``prefixes``: ``(text prefix, checkpoint prefix)``: where the text model's tensors sit in the checkpoint
  (``model.`` → ``model.language_model.``), and ``alternatives``: ``(checkpoint prefix, prefix of another layout)``
  also accepted when reading (transformers saves some wrappers in an older layout);
* ``left_out``: the name prefixes of the tensors that are not part of the language model (vision tower,
  projector): never read, and counted in one :class:`modkit.core.errors.LeftOutTensorsWarning` per load. A tensor
  outside the text model and outside these prefixes is still refused by name.

Conversion: the wrapper keys are checked as every config is (unknown ones warned about, or refused when strict),
the text config (``{}`` when absent: transformers then builds the text class's defaults) gets the lifted keys and
is converted by the text type; the spec's ``metadata.hf_model_type`` is the text type, so ``modkit.to_hf`` writes
the text type's checkpoint, which transformers loads as the text type's ``ForCausalLM``. The wrapper type itself is
read only (an export as the wrapper is refused, naming the text type).
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Mapping, Optional

from modkit.plugin import CheckpointError, SpecError, join_path

from ._reader import HFConfig
from ._type import HFType


@dataclass(frozen=True)
class LanguageModelOf:
    """A multimodal ``model_type`` read as its language model (see the module notes).

    Attributes:
        model_type: the wrapper's ``model_type`` (``qwen3_5``).
        architecture: the transformers class of the wrapper (``Qwen3_5ForConditionalGeneration``), for the docs.
        text: the text model's declared type (``QWEN3_5``, model type ``qwen3_5_text``).
        prefixes: ``(text prefix, checkpoint prefix)`` pairs, the text model's tensor names moved in the checkpoint.
        left_out: checkpoint name prefixes of the tensors outside the language model.
        text_key: the wrapper config key holding the text config.
        lifted: ``{wrapper key: wrapper class default}``: keys the wrapper's config decides for the text model.
        ignore: ``{wrapper key: why}``: keys that do not describe the language model.
        alternatives: ``(checkpoint prefix, alternative prefix)`` also accepted when reading.
        notes: what the wrapper is (the defining module's docstring).
        module: the defining module (set automatically).

    Source: the ``ForConditionalGeneration`` classes of ``transformers/models/{qwen3_5,qwen3_5_moe,gemma3,llama4}``.
    """

    model_type: str
    architecture: str
    text: HFType
    prefixes: tuple[tuple[str, str], ...]
    left_out: tuple[str, ...]
    text_key: str = "text_config"
    lifted: Mapping[str, Any] = field(default_factory=dict)
    ignore: Mapping[str, str] = field(default_factory=dict)
    alternatives: tuple[tuple[str, str], ...] = ()
    notes: str = ""
    module: str = ""

    def __post_init__(self):
        if not self.module:
            object.__setattr__(self, "module", sys._getframe(2).f_globals.get("__name__", ""))

    # ------------------------------------------------------------------ config
    def text_config(self, cfg: Mapping[str, Any], r: Optional[HFConfig] = None) -> dict:
        """The text model's config dict of wrapper config ``cfg``: ``cfg[text_key]`` (``{}`` when absent or null)
        with its ``model_type`` set and the ``lifted`` keys taken from ``cfg`` (or the wrapper's defaults).

        Raises:
            SpecError: the text config is not an object, or names another model type (the path and the fix named).
        """
        r = r or HFConfig(dict(cfg), self.model_type)
        text = r.get(self.text_key, {})
        where = f"Hugging Face {self.model_type} config"
        if not isinstance(text, dict):
            raise SpecError(
                [(self.text_key, f"must be an object holding the {self.text.model_type} config")], source=where
            )
        inner = text.get("model_type", self.text.model_type)
        if inner != self.text.model_type:
            raise SpecError(
                [
                    (
                        join_path(self.text_key, "model_type"),
                        f"is {inner!r}; a {self.model_type} checkpoint's language model is a {self.text.model_type!r} "
                        f"(write {self.text.model_type!r} or leave the key out)",
                    )
                ],
                source=where,
            )
        out = {**text, "model_type": self.text.model_type}
        out.update({key: r.get(key, default) for key, default in self.lifted.items()})
        return out

    def convert(self, cfg: dict) -> dict:
        """Wrapper config → the spec dict of its language model (``metadata.hf_model_type``: the text type).

        Raises:
            SpecError: the wrapper keys (unknown ones when strict) or the text config cannot be converted; the text
                config's errors are named by their path under ``text_key``.
        """
        r = HFConfig(cfg, self.model_type, ignore=self.ignore)
        text = self.text_config(cfg, r)
        r.finish({})
        try:
            return self.text.convert(text)
        except SpecError as exc:
            raise SpecError(
                [(join_path(self.text_key, p) if p else self.text_key, m) for p, m in exc.errors],
                source=f"Hugging Face {self.model_type} config",
            ) from None

    # ------------------------------------------------------------------ weights
    def checkpoint_name(self, name: str) -> str:
        """The checkpoint's name for the text model's tensor ``name`` (the longest matching text prefix moved)."""
        for text, ckpt in sorted(self.prefixes, key=lambda p: -len(p[0])):
            if name.startswith(text):
                return ckpt + name[len(text) :]
        return name

    def text_name(self, name: str) -> str:
        """The text model's name for the checkpoint's tensor ``name`` (inverse of :meth:`checkpoint_name`)."""
        for text, ckpt in sorted(self.prefixes, key=lambda p: -len(p[1])):
            if name.startswith(ckpt):
                return text + name[len(ckpt) :]
        return name

    def _pattern(self, pattern: str) -> str:
        """A text type's ``keep`` regex moved under the checkpoint prefix its literal start names."""
        for text, ckpt in sorted(self.prefixes, key=lambda p: -len(p[0])):
            if pattern.startswith(re.escape(text)):
                return re.escape(ckpt) + pattern[len(re.escape(text)) :]
        return pattern

    @cached_property
    def weights(self) -> "WrapperWeights":
        """The checkpoint mapper: the text type's, with names moved (:class:`WrapperWeights`)."""
        return WrapperWeights(self)

    def describe(self) -> dict[str, Any]:
        """What the reference page shows: the text type's tables with the checkpoint names moved, this type's notes."""
        out = self.text.describe()
        out["weights"] = [
            (ours, ", ".join(map(self.checkpoint_name, hf.split(", "))), how) for ours, hf, how in out["weights"]
        ]
        out.update(parent=self.text.model_type, notes=self.notes, module=self.module)
        return out

    def supports(self) -> list[str]:
        """The text type's features (:meth:`._type.HFType.supports`)."""
        return self.text.supports()


class WrapperWeights:
    """The weight mapper of a :class:`LanguageModelOf` (see :class:`modkit.io.checkpoint.WeightMapper`): the text
    type's links with the checkpoint names moved, its ``keep`` patterns and ``aliases`` moved too, the declared
    ``left_out`` prefixes, and what an export of the text type needs (:meth:`export_config`, :meth:`export_extras`).
    """

    def __init__(self, wrapper: LanguageModelOf):
        self.wrapper = wrapper
        self.model_type = wrapper.model_type
        self.convert = wrapper.convert
        self.left_out = tuple(wrapper.left_out)
        inner = wrapper.text.weights
        self.keep = tuple((wrapper._pattern(p), why) for p, why in inner.keep)
        moved = tuple((wrapper.checkpoint_name(a), wrapper.checkpoint_name(b)) for a, b in inner.aliases)
        self.aliases = moved + tuple(wrapper.alternatives)

    def links(self, spec, shapes: Mapping[str, Any], config: Mapping[str, Any]) -> list:
        """The text type's links for the text config of ``config``, each checkpoint name moved."""
        from dataclasses import replace

        inner = self.wrapper.text.weights.links(spec, shapes, self.wrapper.text_config(config))
        return [replace(lk, hf=tuple(self.wrapper.checkpoint_name(n) for n in lk.hf)) for lk in inner]

    def compatibility(self, spec, config: Mapping[str, Any]) -> list[str]:
        """Why ``spec`` differs from the language model ``config`` describes (empty when it does not)."""
        return self.wrapper.text.weights.compatibility(spec, self.wrapper.text_config(config))

    def export_config(self, config: Mapping[str, Any]) -> dict:
        """The config a later export starts from: the text config (lifted keys applied)."""
        return self.wrapper.text_config(config)

    def export_extras(self, extras: Mapping[str, Any]) -> dict:
        """Kept tensors renamed to the text model's names, for an export as the text type."""
        return {self.wrapper.text_name(k): v for k, v in extras.items()}

    def hf_config(self, spec, base: Optional[Mapping[str, Any]] = None) -> dict:
        """Refused: the wrapper is read only; its language model exports as the text type.

        Raises:
            CheckpointError: always, naming the text type to write instead.
        """
        w = self.wrapper
        raise CheckpointError(
            f"the Hugging Face {w.model_type!r} type is read only (the language model of a {w.architecture} "
            f"checkpoint); write the spec as {w.text.model_type!r} (to_hf(..., model_type={w.text.model_type!r}), "
            f"--model-type {w.text.model_type}), which transformers loads as its ForCausalLM"
        )

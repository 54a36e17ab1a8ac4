"""Sampling as composable, registered parts: logits processors and stop conditions.

Two component kinds, filled through the registry like every other kind (so a plugin can add one):

* ``logits_processor``: ``processor(logits, state) -> logits``, ``[batch, vocab]`` float32 in and out; a token it
  removes gets ``-inf``. Built by the entry's factory as ``factory(config, setup: SamplingSetup)`` and returning a
  :class:`LogitsProcessor`.
* ``stop_condition``: ``condition(state) -> [batch]`` bool, True where a row ends with the token just appended
  (which is kept). Returns a :class:`StopCondition`.

A sampling pipeline (:class:`Sampler`) is a list of them, given either

* as a *spec-like JSON list*, ``[{"type": "temperature", "value": 0.7}, {"type": "top_p", "p": 0.9},
  {"type": "stop_strings", "strings": ["\\n\\n"]}]``, applied **in list order** (each item validated like a spec
  component, with every problem named); or
* by *keyword*, ``generate(..., temperature=0.7, top_p=0.9)``: every entry whose ``argument`` capability
  (``{"name": "top_p", "field": "p"}``) names a given keyword is built with that field set, and the list is sorted
  by the entries' ``order`` capability. The built-in order (``modkit show logits_processor TYPE``) follows
  transformers' ``_get_logits_processor`` and vLLM: penalties on the raw logits first (repetition 10, presence 20,
  frequency 21), then temperature (30), then the truncations top-k (40), top-p (50) and min-p (60); so temperature
  comes before top-p, as in transformers.

The next token is drawn from ``softmax(processed logits)`` with ``torch.multinomial`` and a seeded generator; a
temperature of 0 makes the pipeline greedy: the argmax of the processed logits (first index on ties), so the
penalties before it still apply, as in transformers' greedy search.

Nothing here names a concrete processor: the built-ins live in ``modkit_plugins.sampling``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence

import torch
from torch import Tensor

from modkit.core.errors import SamplingError, SpecError
from modkit.core.registry import Component, Registry, get_registry
from modkit.core.validation import extend_path, join_path, json_value

#: the component kinds a sampling pipeline is made of
PROCESSOR_KIND = "logits_processor"
STOP_KIND = "stop_condition"
KINDS = (PROCESSOR_KIND, STOP_KIND)


@dataclass
class GenerationState:
    """What processors and stop conditions may look at, at one decoding step.

    Attributes:
        ids: ``[batch, seq]`` int64: the prompt (left padding included) followed by the tokens generated so far.
        real: ``[batch, seq]`` bool, False on prompt padding; ``None`` when every token is real.
        prompt_len: number of prompt columns in ``ids``; ``ids[:, prompt_len:]`` are the generated tokens.
        decode: token ids -> text (a tokenizer's ``decode``), or ``None``.
    """

    ids: Tensor
    real: Optional[Tensor]
    prompt_len: int
    decode: Optional[Callable[[list[int]], str]] = None

    @property
    def generated(self) -> Tensor:
        """``[batch, new]`` the tokens generated so far."""
        return self.ids[:, self.prompt_len :]

    def token_counts(self, vocab_size: int, *, generated_only: bool) -> Tensor:
        """``[batch, vocab_size]`` float32: how often each token id occurs in each row (real tokens only).

        Args:
            vocab_size: width of the result.
            generated_only: count the generated tokens only (else the prompt's real tokens too).
        """
        ids = self.generated if generated_only else self.ids
        counts = torch.zeros(ids.shape[0], vocab_size, dtype=torch.float32, device=ids.device)
        if ids.shape[1] == 0:
            return counts
        weight = torch.ones(ids.shape, dtype=torch.float32, device=ids.device)
        if self.real is not None and not generated_only:
            weight = weight * self.real.to(torch.float32)
        return counts.scatter_add_(1, ids, weight)


@dataclass(frozen=True)
class SamplingSetup:
    """What a processor or stop condition factory may know: ``factory(config, setup)``.

    Attributes:
        vocab_size: the model's number of token ids (logits are ``[batch, vocab_size]``).
        decode: token ids -> text, when a tokenizer is available (stop strings need it), else ``None``.
    """

    vocab_size: int
    decode: Optional[Callable[[list[int]], str]] = None


class LogitsProcessor:
    """Base of logits processors: ``__call__(logits [batch, vocab] float32, state) -> [batch, vocab] float32``.

    A processor returns a new tensor (it must not modify ``logits`` in place), removes tokens by setting them to
    ``-inf``, keeps at least one token per row and treats each row on its own.

    ``picks_argmax``: a processor that sets it (temperature 0) makes the pipeline greedy: the sampler then takes the
    argmax of the processed logits (first index on ties) instead of drawing from them.
    """

    picks_argmax: bool = False

    def __call__(self, logits: Tensor, state: GenerationState) -> Tensor:  # pragma: no cover - interface
        raise NotImplementedError


class StopCondition:
    """Base of stop conditions: ``__call__(state) -> [batch]`` bool, True where a row ends with its newest token.

    ``pad_token_id``: what a finished row emits afterwards when :func:`modkit.inference.generate.generate` is given no
    ``pad_token_id`` or ``eos_token_id`` (``None``: no suggestion).
    """

    pad_token_id: Optional[int] = None

    def __call__(self, state: GenerationState) -> Tensor:  # pragma: no cover - interface
        raise NotImplementedError


class Sampler:
    """An ordered list of logits processors and a list of stop conditions.

    ``process(logits, state)`` applies the processors in order; ``choose(logits, state, generator)`` draws the next
    token ``[batch]`` from ``softmax(process(logits))``; ``stopped(state)`` ORs the stop conditions.
    """

    def __init__(
        self,
        processors: Sequence[LogitsProcessor] = (),
        stops: Sequence[StopCondition] = (),
        configs: Sequence[Any] = (),
    ):
        self.processors = list(processors)
        self.stops = list(stops)
        self.configs = list(configs)

    def process(self, logits: Tensor, state: GenerationState) -> Tensor:
        """``logits [batch, vocab]`` (any float dtype) -> processed float32 logits, removed tokens at ``-inf``."""
        out = logits.float()
        for p in self.processors:
            out = p(out, state)
        return out

    @property
    def greedy(self) -> bool:
        """Whether a processor makes the pipeline greedy (``picks_argmax``)."""
        return any(p.picks_argmax for p in self.processors)

    def choose(self, logits: Tensor, state: GenerationState, generator: Optional[torch.Generator] = None) -> Tensor:
        """One token per row (``[batch]`` int64): the argmax of the processed logits when the pipeline is greedy,
        else a draw from their softmax (``torch.multinomial`` with ``generator``).

        Raises:
            ValueError: the processors removed every token of a row (names the pipeline).
        """
        processed = self.process(logits, state)
        top, index = processed.max(-1)
        if not torch.compiler.is_compiling() and not bool(torch.isfinite(top).all()):
            raise ValueError(f"the sampling pipeline {self.describe()} removed every token of a row (or produced NaN)")
        if self.greedy:
            return index
        probs = torch.softmax(processed, dim=-1)
        return torch.multinomial(probs, 1, generator=generator).squeeze(-1)

    def stopped(self, state: GenerationState) -> Optional[Tensor]:
        """``[batch]`` bool, True where any stop condition ends the row; ``None`` without stop conditions."""
        done = None
        for s in self.stops:
            hit = s(state)
            done = hit if done is None else done | hit
        return done

    def pad_token_id(self) -> Optional[int]:
        """The first stop condition's suggested padding token, if any."""
        return next((s.pad_token_id for s in self.stops if s.pad_token_id is not None), None)

    def describe(self) -> str:
        """The pipeline as its JSON list (for messages)."""
        import json

        return json.dumps([c.model_dump(mode="json", exclude_defaults=True) | {"type": c.type} for c in self.configs])


def _kind_of(item: Any, registry: Registry, where: str) -> str:
    t = item.get("type") if isinstance(item, Mapping) else getattr(item, "type", None)
    if not isinstance(t, str):
        raise SpecError([(where, f'each sampling step needs a "type", got {json_value(item)}')])
    kinds = [k for k in KINDS if registry.resolve(k, t) in registry.types(k)]
    if len(kinds) == 1:
        return kinds[0]
    if not kinds:
        known = [f"{k}: {', '.join(registry.types(k))}" for k in KINDS]
        raise SpecError([(join_path(where, "type"), f"unknown sampling step {t!r}; registered {'; '.join(known)}")])
    raise SpecError(
        [(join_path(where, "type"), f"{t!r} is both a {kinds[0]} and a {kinds[1]}; the registry is ambiguous")]
    )


def _build(entry: Component, config: Any, setup: SamplingSetup, where: str) -> Any:
    try:
        obj = entry.factory(config, setup)
    except (ValueError, TypeError) as exc:
        raise SpecError([(where, str(exc))]) from None
    base = LogitsProcessor if entry.kind == PROCESSOR_KIND else StopCondition
    if not isinstance(obj, base):
        raise TypeError(
            f"factory of {entry.kind}/{entry.type} ({entry.provider}) returned {type(obj).__name__}, not a {base.__name__}"
        )
    return obj


def sampler_from_list(steps: Iterable[Any], setup: SamplingSetup, *, registry: Optional[Registry] = None) -> Sampler:
    """A :class:`Sampler` from a spec-like JSON list (dicts or validated configs), processors in list order.

    Raises:
        SamplingError: an item of unknown type, an invalid config or one its factory refuses; paths are ``[i]`` and
            ``[i].field``, all problems of the list together.
    """
    from modkit.spec import load_component

    reg = registry or get_registry()
    if isinstance(steps, (str, bytes, Mapping)):
        raise SamplingError([("", f"sampling is a JSON list of steps, got {type(steps).__name__}")])
    processors, stops, configs, errors = [], [], [], []
    for i, item in enumerate(steps):
        where = f"[{i}]"
        try:
            kind = _kind_of(item, reg, where)
            config = load_component(
                kind, item if isinstance(item, Mapping) else item.model_dump(mode="json"), registry=reg
            )
        except SpecError as exc:
            errors += [
                (extend_path(where, p) if p and not p.startswith(where) else (p or where), m) for p, m in exc.errors
            ]
            continue
        try:
            obj = _build(reg.get(kind, config.type), config, setup, where)
        except SpecError as exc:
            errors += exc.errors
            continue
        (processors if kind == PROCESSOR_KIND else stops).append(obj)
        configs.append(config)
    if errors:
        raise SamplingError(errors, source="list")
    return Sampler(processors, stops, configs)


def arguments(registry: Optional[Registry] = None) -> dict[str, tuple[Component, str]]:
    """``{keyword: (entry, field)}`` of every sampling entry that declares an ``argument`` capability."""
    reg = registry or get_registry()
    out: dict[str, tuple[Component, str]] = {}
    for kind in KINDS:
        for entry in reg.components(kind):
            arg = entry.capabilities.get("argument")
            if isinstance(arg, Mapping) and isinstance(arg.get("name"), str):
                out[arg["name"]] = (entry, str(arg.get("field", "value")))
    return out


def sampler_from_arguments(
    values: Mapping[str, Any], setup: SamplingSetup, *, registry: Optional[Registry] = None
) -> Sampler:
    """A :class:`Sampler` from keyword arguments (``{"temperature": 0.7, "top_p": 0.9}``; ``None`` values skipped),
    processors sorted by their entries' ``order`` capability.

    Raises:
        TypeError: a keyword no registered processor or stop condition declares (the message lists them).
        SamplingError: a value the component refuses, named by its keyword (``top_p: ... (got 1.5)``).
    """
    from modkit.spec import load_component

    reg = registry or get_registry()
    known = arguments(reg)
    unknown = sorted(k for k in values if k not in known)
    if unknown:
        raise TypeError(f"unknown sampling argument(s) {unknown}; registered: {', '.join(sorted(known))}")
    chosen, errors = [], []
    for name, value in values.items():
        if value is None:
            continue
        entry, field = known[name]
        try:
            config = load_component(entry.kind, {"type": entry.type, field: value}, registry=reg)
            obj = _build(entry, config, setup, name)
        except SpecError as exc:
            errors += [(name, m) for _, m in exc.errors]
            continue
        chosen.append((entry.capabilities.get("order", 1000), len(chosen), entry.kind, obj, config))
    if errors:
        raise SamplingError(errors, source="arguments")
    chosen.sort(key=lambda c: (c[0], c[1]))
    processors = [c[3] for c in chosen if c[2] == PROCESSOR_KIND]
    stops = [c[3] for c in chosen if c[2] == STOP_KIND]
    return Sampler(processors, stops, [c[4] for c in chosen])

"""Built-in sampling steps: logits processors and stop conditions (see :mod:`modkit.inference.sampling`).

Logits processors, ``[batch, vocab]`` float32 in and out, removed tokens at ``-inf``; the keyword of
:func:`modkit.inference.generate.generate` and the order a keyword-built pipeline applies them in:

=======================  ==============================  =====  ==============================================================
type                     keyword (field)                 order  what it does
=======================  ==============================  =====  ==============================================================
``repetition_penalty``   ``repetition_penalty`` (penalty)  10   every token id present in the row (prompt and generated, padding
                                                                excluded): logit / penalty if logit > 0, else logit · penalty
``presence_penalty``     ``presence_penalty`` (penalty)    20   logit - penalty for every token id generated at least once
``frequency_penalty``    ``frequency_penalty`` (penalty)   21   logit - penalty · (times the token id was generated)
``temperature``          ``temperature`` (value)           30   logits / value; value 0 makes the pipeline greedy: the
                                                                argmax of the processed logits (first index on ties)
``top_k``                ``top_k`` (k)                     40   keeps tokens whose logit is at least the k-th largest (ties kept)
``top_p``                ``top_p`` (p)                     50   keeps the most probable tokens until their mass reaches p: a
                                                                token stays when the mass of the strictly more probable ones
                                                                (sort order) is below p; never empty
``min_p``                ``min_p`` (p)                     60   keeps tokens with probability >= p · (the top probability)
=======================  ==============================  =====  ==============================================================

Stop conditions: ``stop_tokens`` (keyword ``stop_token_ids``): a row ends when it emits one of ``ids``;
``stop_strings`` (keyword ``stop_strings``): a row ends once the decoded text of its generated tokens contains one
of ``strings`` (needs the tokenizer's ``decode``; the whole generated text of each live row is decoded at every
step, so the cost grows with the length; the prompt never matches). The stopping token is kept in the output.

Sources: temperature, Ackley et al. 1985 / Hinton et al. 2015; top-k, Fan et al. 2018 (arXiv:1805.04833); top-p,
Holtzman et al. 2019 (arXiv:1904.09751); min-p, Nguyen et al. 2024 (arXiv:2407.01082); repetition penalty,
Keskar et al. 2019, CTRL (arXiv:1909.05858), with transformers' ``RepetitionPenaltyLogitsProcessor`` semantics
(positive logits divided, negative multiplied); presence and frequency penalties, the OpenAI API
(``mu[j] - c[j]·frequency - [c[j] > 0]·presence``) counting generated tokens as vLLM does. The order of the
keyword-built pipeline follows transformers' ``_get_logits_processor`` (penalties, then temperature, then top-k,
top-p and min-p).
"""

from __future__ import annotations

import copy
from typing import Callable, Literal, Optional

import torch
from pydantic import Field, NonNegativeInt, PositiveInt, field_validator
from torch import Tensor

from modkit.plugin import Component, ComponentConfig, GenerationState, hookimpl, LogitsProcessor, StopCondition

_NEG_INF = float("-inf")


# ------------------------------------------------------------------------------------------------ processors


#: the largest temperature, and the largest repetition, presence or frequency penalty a pipeline takes
MAX_TEMPERATURE = 1e3
MAX_PENALTY = 1e3


class TemperatureConfig(ComponentConfig):
    """Config of ``temperature``: divide the logits by ``value`` (0: greedy)."""

    type: Literal["temperature"] = "temperature"
    value: float = Field(
        1.0,
        ge=0,
        le=MAX_TEMPERATURE,
        allow_inf_nan=False,
        description="divisor of the logits; 0 is greedy (the argmax of the processed logits). At most "
        f"{MAX_TEMPERATURE:g}: the distribution is already uniform to float32 precision there",
    )


class Temperature(LogitsProcessor):
    """``logits / value``; ``value == 0``: logits unchanged and the pipeline greedy (``picks_argmax``: the sampler
    takes the argmax, first index on ties, as transformers' greedy search)."""

    def __init__(self, value: float):
        self.value = float(value)
        self.picks_argmax = self.value == 0

    def __call__(self, logits: Tensor, state: GenerationState) -> Tensor:
        """``[batch, vocab] -> [batch, vocab]``."""
        if self.value in (0.0, 1.0):
            return logits
        return logits / self.value


class TopKConfig(ComponentConfig):
    """Config of ``top_k``: keep the ``k`` most probable tokens (and ties with the k-th)."""

    type: Literal["top_k"] = "top_k"
    k: PositiveInt = Field(
        ..., description="number of tokens kept (tokens tied with the k-th are kept too); k >= vocab keeps all"
    )


class TopK(LogitsProcessor):
    """Removes tokens whose logit is below the ``k``-th largest of the row (transformers' ``TopKLogitsWarper``)."""

    def __init__(self, k: int):
        self.k = int(k)

    def __call__(self, logits: Tensor, state: GenerationState) -> Tensor:
        """``[batch, vocab] -> [batch, vocab]``."""
        if self.k >= logits.shape[-1]:
            return logits
        kth = logits.topk(self.k, dim=-1).values[..., -1:]
        return logits.masked_fill(logits < kth, _NEG_INF)


def top_p_mask(probs: Tensor, top_p: float) -> Tensor:
    """Boolean mask ``[..., vocab]`` of the smallest set of tokens whose probability mass reaches ``top_p``.

    A token is kept when the mass of the strictly more probable tokens is below ``top_p``, so the most probable
    token is always kept (never empty) and ties at the boundary are resolved by sort order
    (llama.cpp #1953, transformers #18976). ``top_p >= 1`` keeps everything.
    """
    if top_p >= 1.0:
        return torch.ones_like(probs, dtype=torch.bool)
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    mass_before = sorted_probs.cumsum(-1) - sorted_probs
    keep_sorted = mass_before < top_p
    keep_sorted[..., 0] = True
    return torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)


class TopPConfig(ComponentConfig):
    """Config of ``top_p`` (nucleus sampling)."""

    type: Literal["top_p"] = "top_p"
    p: float = Field(..., gt=0, le=1, description="probability mass to keep, in (0, 1]; 1 keeps every token")


class TopP(LogitsProcessor):
    """Nucleus filtering (Holtzman et al. 2019): keeps the smallest most-probable set of mass >= ``p`` (:func:`top_p_mask`)."""

    def __init__(self, p: float):
        self.p = float(p)

    def __call__(self, logits: Tensor, state: GenerationState) -> Tensor:
        """``[batch, vocab] -> [batch, vocab]``."""
        if self.p >= 1:
            return logits
        return logits.masked_fill(~top_p_mask(torch.softmax(logits, -1), self.p), _NEG_INF)


class MinPConfig(ComponentConfig):
    """Config of ``min_p``."""

    type: Literal["min_p"] = "min_p"
    p: float = Field(
        ..., ge=0, le=1, description="keep tokens whose probability is at least p × the top probability; 0 keeps all"
    )


class MinP(LogitsProcessor):
    """Removes tokens with probability below ``p · max probability`` of the row (Nguyen et al. 2024; transformers'
    ``MinPLogitsWarper``); the most probable token always stays."""

    def __init__(self, p: float):
        self.p = float(p)

    def __call__(self, logits: Tensor, state: GenerationState) -> Tensor:
        """``[batch, vocab] -> [batch, vocab]``."""
        if self.p == 0:
            return logits
        probs = torch.softmax(logits, -1)
        return logits.masked_fill(probs < self.p * probs.amax(-1, keepdim=True), _NEG_INF)


class RepetitionPenaltyConfig(ComponentConfig):
    """Config of ``repetition_penalty``."""

    type: Literal["repetition_penalty"] = "repetition_penalty"
    penalty: float = Field(
        ...,
        gt=0,
        le=MAX_PENALTY,
        allow_inf_nan=False,
        description="> 1 discourages repeats, < 1 encourages them, 1 does nothing; at most "
        f"{MAX_PENALTY:g} (CTRL uses 1.2): a penalty beyond it multiplies logits toward float overflow",
    )


class RepetitionPenalty(LogitsProcessor):
    """For each token id present in the row (prompt and generated tokens; prompt padding excluded), once whatever
    its count: ``logit / penalty`` when the logit is positive, else ``logit · penalty`` (Keskar et al. 2019;
    transformers' ``RepetitionPenaltyLogitsProcessor``, which also penalises padding tokens of a left-padded
    prompt: modkit does not)."""

    def __init__(self, penalty: float, vocab_size: int):
        self.penalty, self.vocab_size = float(penalty), vocab_size

    def __call__(self, logits: Tensor, state: GenerationState) -> Tensor:
        """``[batch, vocab] -> [batch, vocab]``."""
        seen = state.token_counts(logits.shape[-1], generated_only=False) > 0
        penalised = torch.where(logits < 0, logits * self.penalty, logits / self.penalty)
        return torch.where(seen, penalised, logits)


class PenaltyConfig(ComponentConfig):
    """Config of ``presence_penalty`` / ``frequency_penalty`` (OpenAI API semantics)."""

    type: Literal["presence_penalty", "frequency_penalty"]
    penalty: float = Field(
        ...,
        ge=-MAX_PENALTY,
        le=MAX_PENALTY,
        allow_inf_nan=False,
        description="subtracted from the logits (OpenAI: -2 to 2); negative values encourage repeats. Within "
        f"±{MAX_PENALTY:g}: times a count of up to the sequence length, a larger one overflows float32",
    )


class AdditivePenalty(LogitsProcessor):
    """``logit - penalty · f(count)`` over the generated tokens of the row: ``f = [count > 0]`` (presence) or
    ``f = count`` (frequency), as the OpenAI API and vLLM."""

    def __init__(self, penalty: float, by_count: bool):
        self.penalty, self.by_count = float(penalty), by_count

    def __call__(self, logits: Tensor, state: GenerationState) -> Tensor:
        """``[batch, vocab] -> [batch, vocab]``."""
        counts = state.token_counts(logits.shape[-1], generated_only=True)
        return logits - self.penalty * (counts if self.by_count else (counts > 0).to(logits.dtype))


# ------------------------------------------------------------------------------------------------ stop conditions


class StopTokensConfig(ComponentConfig):
    """Config of ``stop_tokens``."""

    type: Literal["stop_tokens"] = "stop_tokens"
    ids: list[NonNegativeInt] = Field(
        ..., min_length=1, description="token ids that end a row (the id is kept in the output)"
    )


class StopTokens(StopCondition):
    """A row ends when its newest token is one of ``ids``; finished rows are padded with ``ids[0]`` by default."""

    def __init__(self, ids: list[int], vocab_size: int):
        bad = [i for i in ids if i >= vocab_size]
        if bad:
            raise ValueError(f"stop token ids {bad} lie outside the vocabulary [0, {vocab_size})")
        self.ids = list(ids)
        self.pad_token_id = self.ids[0]
        self._table: Optional[Tensor] = None

    def __call__(self, state: GenerationState) -> Tensor:
        """``[batch]`` bool."""
        newest = state.ids[:, -1]
        if self._table is None or self._table.device != newest.device:
            self._table = torch.tensor(self.ids, device=newest.device)
        return torch.isin(newest, self._table)


class StopStringsConfig(ComponentConfig):
    """Config of ``stop_strings``."""

    type: Literal["stop_strings"] = "stop_strings"
    strings: list[str] = Field(
        ..., min_length=1, description="texts that end a row once the generated text contains one (needs a tokenizer)"
    )

    @field_validator("strings")
    @classmethod
    def _not_empty(cls, v: list[str]) -> list[str]:
        if any(s == "" for s in v):
            raise ValueError("a stop string must not be empty (it would match before any token)")
        return v


class StopStrings(StopCondition):
    """A row ends once ``decode(generated tokens)`` contains one of ``strings`` (the prompt never matches)."""

    def __init__(self, strings: list[str], decode: Optional[Callable[[list[int]], str]]):
        if decode is None:
            raise ValueError(
                "stop_strings needs a tokenizer to read the generated text: pass decode= (e.g. "
                "tokenizer.decode) to generate, or --tokenizer to modkit generate"
            )
        self.strings, self.decode = list(strings), decode
        self._done: Optional[Tensor] = None

    def __call__(self, state: GenerationState) -> Tensor:
        """``[batch]`` bool; rows that already matched stay matched without decoding again."""
        gen = state.generated
        if self._done is None or self._done.shape[0] != gen.shape[0] or gen.shape[1] <= 1:
            self._done = torch.zeros(gen.shape[0], dtype=torch.bool)
        for row, ids in enumerate(gen.tolist()):
            if not self._done[row]:
                text = self.decode(ids)
                self._done[row] = any(s in text for s in self.strings)
        return self._done.to(gen.device)


# ------------------------------------------------------------------------------------------------ registration


def _processor(type_, config, factory, description, reference, argument, order, example):
    """The :class:`Component` of one stateless logits processor: ``argument`` names the ``generate`` keyword
    that builds it, ``order`` its place in the pipeline."""
    return Component(
        kind="logits_processor",
        type=type_,
        config=config,
        factory=factory,
        description=description,
        reference=reference,
        capabilities={"argument": argument, "order": order, "stateless": True},
        example=example,
    )


#: the logits processors, in registration order: the keyword arguments of :func:`_processor`
_PROCESSORS = (
    dict(
        type_="repetition_penalty",
        config=RepetitionPenaltyConfig,
        factory=lambda cfg, setup: RepetitionPenalty(cfg.penalty, setup.vocab_size),
        description="Repetition penalty: every token id already in the row (prompt or generated, padding excluded) gets logit / penalty "
        "when positive, logit · penalty when negative. [batch, vocab] -> [batch, vocab].",
        reference="Keskar et al. 2019, CTRL, arXiv:1909.05858 §4.1; transformers RepetitionPenaltyLogitsProcessor",
        argument={"name": "repetition_penalty", "field": "penalty"},
        order=10,
        example={"type": "repetition_penalty", "penalty": 1.2},
    ),
    dict(
        type_="presence_penalty",
        config=PenaltyConfig,
        factory=lambda cfg, setup: AdditivePenalty(cfg.penalty, by_count=False),
        description="Presence penalty: logit - penalty for every token id generated at least once. [batch, vocab] -> [batch, vocab].",
        reference="OpenAI API, presence_penalty (mu[j] - [c[j] > 0]·alpha_presence); vLLM SamplingParams",
        argument={"name": "presence_penalty", "field": "penalty"},
        order=20,
        example={"type": "presence_penalty", "penalty": 0.5},
    ),
    dict(
        type_="frequency_penalty",
        config=PenaltyConfig,
        factory=lambda cfg, setup: AdditivePenalty(cfg.penalty, by_count=True),
        description="Frequency penalty: logit - penalty × (times the token id was generated). [batch, vocab] -> [batch, vocab].",
        reference="OpenAI API, frequency_penalty (mu[j] - c[j]·alpha_frequency); vLLM SamplingParams",
        argument={"name": "frequency_penalty", "field": "penalty"},
        order=21,
        example={"type": "frequency_penalty", "penalty": 0.5},
    ),
    dict(
        type_="temperature",
        config=TemperatureConfig,
        factory=lambda cfg, setup: Temperature(cfg.value),
        description="Temperature: logits / value; value 0 makes decoding greedy (the argmax of the processed logits, first index "
        "on ties). [batch, vocab] -> [batch, vocab].",
        reference="Hinton et al. 2015, Distilling the Knowledge in a Neural Network, arXiv:1503.02531; transformers TemperatureLogitsWarper",
        argument={"name": "temperature", "field": "value"},
        order=30,
        example={"type": "temperature", "value": 0.7},
    ),
    dict(
        type_="top_k",
        config=TopKConfig,
        factory=lambda cfg, setup: TopK(cfg.k),
        description="Top-k: keeps the tokens whose logit is at least the k-th largest of the row (ties kept). [batch, vocab] -> [batch, vocab].",
        reference="Fan et al. 2018, Hierarchical Neural Story Generation, arXiv:1805.04833",
        argument={"name": "top_k", "field": "k"},
        order=40,
        example={"type": "top_k", "k": 40},
    ),
    dict(
        type_="top_p",
        config=TopPConfig,
        factory=lambda cfg, setup: TopP(cfg.p),
        description="Top-p (nucleus): keeps the most probable tokens until their mass reaches p; a token stays when the mass of the "
        "strictly more probable ones is below p, so the top token always stays. [batch, vocab] -> [batch, vocab].",
        reference="Holtzman et al. 2019, The Curious Case of Neural Text Degeneration, arXiv:1904.09751",
        argument={"name": "top_p", "field": "p"},
        order=50,
        example={"type": "top_p", "p": 0.9},
    ),
    dict(
        type_="min_p",
        config=MinPConfig,
        factory=lambda cfg, setup: MinP(cfg.p),
        description="Min-p: keeps the tokens whose probability is at least p × the top probability of the row. [batch, vocab] -> [batch, vocab].",
        reference="Nguyen et al. 2024, Turning Up the Heat: Min-p Sampling, arXiv:2407.01082; transformers MinPLogitsWarper",
        argument={"name": "min_p", "field": "p"},
        order=60,
        example={"type": "min_p", "p": 0.05},
    ),
)

#: the stop conditions, in registration order: the keyword arguments of their :class:`Component` but ``kind``
_STOP_CONDITIONS = (
    dict(
        type="stop_tokens",
        config=StopTokensConfig,
        factory=lambda cfg, setup: StopTokens(cfg.ids, setup.vocab_size),
        description="Stop tokens: a row ends when it emits one of ids (kept in the output); finished rows are padded "
        "with ids[0] unless generate is given a pad_token_id or eos_token_id. state -> [batch] bool.",
        reference="transformers EosTokenCriteria",
        capabilities={"argument": {"name": "stop_token_ids", "field": "ids"}, "order": 100},
        example={"type": "stop_tokens", "ids": [2]},
    ),
    dict(
        type="stop_strings",
        config=StopStringsConfig,
        factory=lambda cfg, setup: StopStrings(cfg.strings, setup.decode),
        description="Stop strings: a row ends once the decoded text of its generated tokens contains one of strings "
        "(the stopping token kept). Needs a tokenizer's decode; decodes each live row's generated text at every step. "
        "state -> [batch] bool.",
        reference="transformers StopStringCriteria; vLLM SamplingParams.stop",
        capabilities={"argument": {"name": "stop_strings", "field": "strings"}, "order": 101},
        example={"type": "stop_strings", "strings": ["\n\n"]},
    ),
)


@hookimpl
def register_components(register) -> None:
    """Register the built-in logits processors and stop conditions."""
    # copies: every registration gets dicts of its own (capabilities' argument, example), as when written out here
    for row in copy.deepcopy(_PROCESSORS):
        register(_processor(**row))
    for fields in copy.deepcopy(_STOP_CONDITIONS):
        register(Component(kind="stop_condition", **fields))

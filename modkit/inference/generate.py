"""Sampling and autoregressive generation with the static KV cache.

``generate`` allocates a *fresh* static cache of ``prompt_len + max_new_tokens`` slots per call (state never
leaks between calls: litgpt #1596, torchtune #959), prefills the prompt (at once or in chunks), then decodes one
token at a time; each decode step has the same shapes, so it can run compiled (``compile=True``: one
``torch.compile(fullgraph=True)`` trace reused for every token and every later call).

Sampling is a pipeline of registered logits processors and stop conditions (:mod:`modkit.inference.sampling`), given by
keyword (``temperature=0.7, top_p=0.9, repetition_penalty=1.1, min_p=0.05, stop_strings=[...]``, applied in the
documented order: penalties, temperature, top-k, top-p, min-p) or as a spec-like JSON list (``sampling=[{"type":
"temperature", "value": 0.7}, ...]``, applied in list order). Temperature 0 is greedy (argmax). On a CPU with MKL,
``generate`` stores the model's ``nn.Linear`` weights column-major first (:func:`column_major_linears`, same
values): the layout batch-1 decoding streams fastest.

The settings of a call (length, sampling, stopping, how the loop runs) are one :class:`GenerationRequest`, given
as keywords (``generate(model, ids, max_new_tokens=8, temperature=0)``) or as the object itself; the argument
checks live in :mod:`modkit.inference.checks`.
"""

from __future__ import annotations

import functools
import weakref
from dataclasses import KW_ONLY, dataclass, field, fields
from typing import Any, Callable, Iterator, Mapping, Optional, Sequence, Union

import torch
from torch import Tensor

from modkit.core.arguments import check_int
from modkit.inference.checks import (  # noqa: F401 - check_sampling, check_generation: public here too (the CLI's)
    _as_batch,
    _check_eos,
    _check_length,
    _check_mask,
    _check_range,
    _length_limit,
    check_generation,
    check_sampling,
)
from modkit.nn.build import kv_cache_bytes
from modkit.nn.cache import KVCache
from modkit.nn.model import Model
from modkit.inference.sampling import GenerationState, Sampler, SamplingSetup, sampler_from_arguments, sampler_from_list
from modkit.inference.weights import check_convertible, matrix_weights, quantize_linears


def build_sampler(
    vocab_size: int,
    *,
    sampling: Optional[Sequence[Any]] = None,
    decode: Optional[Callable[[list[int]], str]] = None,
    **arguments: Any,
) -> Sampler:
    """The sampling pipeline of a :func:`generate` call: from the ``sampling`` list, or from keyword ``arguments``.

    Args:
        vocab_size: the model's vocabulary size.
        sampling: spec-like JSON list of processors and stop conditions, applied in list order.
        decode: token ids -> text (stop strings need it).
        arguments: keyword form, e.g. ``temperature=0.7, top_k=50, stop_token_ids=[2]`` (``None`` = not given);
            every registered processor or stop condition that declares an ``argument`` capability adds one.

    Raises:
        ValueError: both a list and keyword arguments; SpecError (a ValueError) for an invalid step or value.
        TypeError: a keyword no registered component declares.
    """
    setup = SamplingSetup(vocab_size=vocab_size, decode=decode)
    if sampling is not None:
        given = sorted(k for k, v in arguments.items() if v is not None)
        if given:
            raise ValueError(
                f"give the sampling pipeline either as a list (sampling=...) or as keywords, not both; got both "
                f"sampling and {', '.join(given)}"
            )
        return sampler_from_list(sampling, setup)
    return sampler_from_arguments(arguments, setup)


def _no_history(logits: Tensor) -> GenerationState:
    return GenerationState(
        ids=torch.zeros(logits.shape[0], 0, dtype=torch.long, device=logits.device), real=None, prompt_len=0
    )


def filter_logits(
    logits: Tensor,
    *,
    temperature: float = 1.0,
    top_k: Optional[int] = None,
    top_p: Optional[float] = None,
    **arguments: Any,
) -> Tensor:
    """Apply the keyword pipeline (temperature, top-k, top-p, and any other processor keyword that needs no token
    history) to ``logits [batch, vocab]``; removed tokens get ``-inf``; float32 out.

    Raises:
        SamplingError: (a ``ValueError``) a value a processor refuses, naming it (e.g. ``top_p = 0``: it must lie
            in (0, 1]; a bool or string where a number belongs).
    """
    sampler = build_sampler(logits.shape[-1], temperature=temperature, top_k=top_k, top_p=top_p, **arguments)
    return sampler.process(logits, _no_history(logits))


def sample(
    logits: Tensor,
    *,
    temperature: float = 1.0,
    top_k: Optional[int] = None,
    top_p: Optional[float] = None,
    generator: Optional[torch.Generator] = None,
    **arguments: Any,
) -> Tensor:
    """Draw one token per row of ``logits [batch, vocab]`` → ``[batch]`` int64 with the keyword pipeline
    (:func:`filter_logits`). ``temperature == 0`` is argmax.

    Raises:
        SamplingError: as :func:`filter_logits`.
    """
    sampler = build_sampler(logits.shape[-1], temperature=temperature, top_k=top_k, top_p=top_p, **arguments)
    return sampler.choose(logits, _no_history(logits), generator)


def decode_logits(model: Model, token: Tensor, cache: KVCache) -> Tensor:
    """One decode step: feed ``token [batch, 1]`` through ``model`` with ``cache``; next-token logits ``[batch, vocab]``.

    Shapes are the same at every step and the write pointer is a tensor inside ``cache``, so a compiled version
    (:func:`compiled_decode`) traces once and is reused for every token.
    """
    return model(token, cache=cache).logits[:, -1]


_COMPILED: "weakref.WeakKeyDictionary[Model, Callable[[Tensor, KVCache], Tensor]]" = weakref.WeakKeyDictionary()


def compiled_decode(model: Model, **compile_kwargs) -> Callable[[Tensor, KVCache], Tensor]:
    """``(token [batch, 1], cache) -> logits [batch, vocab]``: :func:`decode_logits` under ``torch.compile``.

    Compiled with ``fullgraph=True`` (a graph break is an error, not a silent slowdown) and ``dynamic=False``;
    one compiled function per model (kept while the model lives), so later :func:`generate` calls reuse it.
    Extra keyword arguments go to ``torch.compile`` (they are only used the first time for a model).
    """
    fn = _COMPILED.get(model)
    if fn is None:
        options = {"fullgraph": True, "dynamic": False, **compile_kwargs}
        fn = torch.compile(functools.partial(decode_logits, model), **options)
        _COMPILED[model] = fn
    return fn


@torch.no_grad()
def column_major_linears(model: torch.nn.Module, enable: bool = True) -> int:
    """Store every ``nn.Linear`` weight column-major (``[in, out]`` in memory), or back to row-major.

    Values, shapes, parameter objects and ``state_dict`` names are unchanged: each weight becomes the transposed
    view of a contiguous ``[in, out]`` tensor, so ``F.linear`` hands BLAS a contiguous right operand. On x86 CPUs
    (MKL), batch-1 decoding is a chain of matrix-vector products bound by weight bandwidth, and the column-major
    layout streams them markedly faster (measured in ``benchmarks/results.md``, e.g. a 32000 x 512 head:
    about 1.7x); GEMMs of a prefill are about as fast either way. Checkpoints written afterwards are identical
    (they are saved contiguous). Embedding tables (a tied head) are left as they are, and so are the weights a
    module declares it reads as matrices (:func:`matrix_weights`): their products are written for rows.

    Args:
        model: any module; every ``nn.Linear`` inside it is converted.
        enable: ``False`` converts back to contiguous row-major weights.

    Returns:
        the number of weights whose layout changed.
    """
    changed, keep = 0, matrix_weights(model) if enable else set()
    for module in model.modules():
        if not isinstance(module, torch.nn.Linear) or type(module.weight.data) is not torch.Tensor:
            continue  # (tensor subclasses such as DTensor shards keep their own layout)
        w = module.weight
        if id(w) in keep:
            continue
        col = w.dim() == 2 and w.stride() == (1, w.shape[0])
        with torch.inference_mode(False):  # a normal tensor even when called under inference_mode (trainable later)
            if enable and not col:
                module.weight.data = w.data.t().contiguous().t()
                changed += 1
            elif not enable and not w.is_contiguous():
                module.weight.data = w.data.contiguous()
                changed += 1
    return changed


@dataclass(frozen=True)
class GenerationRequest:
    """What one :func:`generate` / :func:`stream_generate` call asks for: how many tokens, how to choose each one
    (the sampling settings), when a row stops, and how the loop runs.

    A plain holder: :func:`stream_generate` checks every field against the model when it is called (the errors
    are listed there). The keyword form ``generate(model, ids, max_new_tokens=8, temperature=0)`` builds one with
    :meth:`from_keywords`; ``generate(model, ids, GenerationRequest(8, temperature=0))`` is the same call.

    Attributes:
        max_new_tokens: number of steps (>= 0).
        temperature: keyword sampling: ``None`` is not given (temperature 1), 0 is greedy (argmax).
        top_k: keyword sampling: keep the ``top_k`` most likely tokens; ``None``: not given.
        top_p: keyword sampling: keep the most likely tokens whose probabilities sum to ``top_p``; ``None``: not given.
        seed: seeds a private generator, so seeded runs are reproducible; ``None``: a fresh seed.
        eos_token_id: stop a row once it emits one of these; iteration ends when every row has stopped.
        prefill_chunk: feed the prompt in chunks of this many tokens (bounds prefill memory); ``None``: at once.
        compile: run decode steps through :func:`compiled_decode` (``torch.compile``, fullgraph, static shapes);
            the first call for a model pays the compilation.
        weights: how the ``nn.Linear`` weights are stored for decoding (:mod:`modkit.inference.weights`): ``None``
            (default) or ``"float32"``: as loaded; ``"bfloat16"``: rounded to bfloat16, products in bfloat16;
            ``"int8"``: per-output-channel symmetric int8 with float32 scales. The model is converted in place
            before the first token (embeddings and a tied head stay as they are) and stays converted after the call.
        column_major: ``None`` (default): column-major ``nn.Linear`` weights when the model is on a CPU with MKL;
            ``True``: convert whatever the device; ``False``: leave the weight layout as it is.
        sampling: the pipeline as a spec-like JSON list (processors applied in list order, stop conditions), instead
            of keywords; see :mod:`modkit.inference.sampling`.
        decode: token ids -> text (``tokenizer.decode``), needed by ``stop_strings``.
        pad_token_id: what finished rows emit; default the first ``eos_token_id``, else the first stop condition's
            suggestion (``stop_tokens``: its first id), else 0.
        check_memory: refuse (:class:`~modkit.core.errors.MemoryLimitError`) a KV cache that would not fit in the
            memory free on the model's device; ``False`` skips the estimate.
        max_len: the most positions a row may reach (prompt + new tokens, padding included); default the spec's
            ``max_seq_len``. Below it, a tighter limit. Above it, only when every position scheme of the model
            declares the ``unbounded_positions`` capability (a scheme computed from the position, with no table of
            ``max_seq_len`` rows: RoPE, ALiBi, sinusoidal, none; as transformers generates past
            ``max_position_embeddings``); a :class:`~modkit.core.errors.MaxSeqLenWarning` then says the model was
            specified for less. A scheme with a table (learned positions) is refused past ``max_seq_len``.
        sampling_arguments: more keyword sampling, ``{keyword: value}``: every registered processor or stop
            condition with an ``argument`` capability (built-ins: ``min_p``, ``repetition_penalty``,
            ``presence_penalty``, ``frequency_penalty``, ``stop_token_ids``, ``stop_strings``).
    """

    max_new_tokens: int
    _: KW_ONLY
    temperature: Optional[float] = None
    top_k: Optional[int] = None
    top_p: Optional[float] = None
    seed: Optional[int] = None
    eos_token_id: Optional[Union[int, Sequence[int]]] = None
    prefill_chunk: Optional[int] = None
    compile: bool = False
    column_major: Optional[bool] = None
    weights: Optional[str] = None
    sampling: Optional[Sequence[Any]] = None
    decode: Optional[Callable[[list[int]], str]] = None
    pad_token_id: Optional[int] = None
    check_memory: bool = True
    max_len: Optional[int] = None
    sampling_arguments: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_keywords(cls, keywords: Mapping[str, Any], caller: str = "generate") -> "GenerationRequest":
        """The request of a keyword call: each field by its name; any other keyword is a sampling argument
        (:attr:`sampling_arguments`, checked when the sampler is built).

        Raises:
            TypeError: no ``max_new_tokens`` (as a missing keyword argument of ``caller``).
        """
        if "max_new_tokens" not in keywords:
            raise TypeError(f"{caller}() missing 1 required keyword-only argument: 'max_new_tokens'")
        named = _REQUEST_FIELDS & keywords.keys()
        rest = {k: v for k, v in keywords.items() if k not in named}
        return cls(**{k: keywords[k] for k in named}, sampling_arguments=rest)


#: the fields a keyword call sets by name (any other keyword is a sampling argument)
_REQUEST_FIELDS = frozenset(f.name for f in fields(GenerationRequest)) - {"_", "sampling_arguments"}


def _request(request: Any, settings: Mapping[str, Any], caller: str) -> GenerationRequest:
    """``request``, or the one the keyword ``settings`` give; refuses both, and a ``request`` of another type."""
    if request is None:
        return GenerationRequest.from_keywords(settings, caller)
    if not isinstance(request, GenerationRequest):
        raise TypeError(
            f"{caller}() takes a GenerationRequest as its third argument, got {type(request).__name__}; "
            "give the settings as keyword arguments (max_new_tokens=..., temperature=...)"
        )
    if settings:
        raise TypeError(
            f"{caller}() takes a GenerationRequest or keyword settings, not both; got both a request "
            f"and {', '.join(sorted(settings))}"
        )
    return request


@dataclass(frozen=True)
class _Checked:
    """A request checked against its model: what the generation loop (:func:`_stream`) runs on."""

    ids: Tensor  # [batch, prompt_len] int64 on the model's device
    mask: Optional[Tensor]  # [batch, prompt_len] bool (True = real token), left padding only; None: no mask
    eos: list[int]  # the end-of-sequence token ids (may be empty)
    pad_token_id: Optional[int]  # checked, as given
    sampler: Sampler
    request: GenerationRequest


def stream_generate(
    model: Model,
    input_ids: Union[Tensor, Sequence[int], Sequence[Sequence[int]]],
    request: Optional[GenerationRequest] = None,
    *,
    attention_mask: Optional[Tensor] = None,
    **settings: Any,
) -> Iterator[Tensor]:
    """Yield the next token ``[batch]`` at each step (finished rows yield the padding token).

    A fresh static cache of ``prompt_len + max_new_tokens`` slots is allocated for every call (state never
    leaks between calls); the prompt is prefilled (at once, or in chunks of ``prefill_chunk`` tokens), then
    each step feeds one token.

    On a CPU with MKL the model's ``nn.Linear`` weights are first stored column-major (:func:`column_major_linears`:
    values, names, parameter objects and saved checkpoints unchanged; the layout stays after the call): decode
    steps are matrix-vector products bound by weight bandwidth, which MKL streams faster from that layout
    (``benchmarks/results.md``). Later calls find the weights converted and copy nothing.

    Args:
        model: a built :class:`~modkit.nn.model.Model` (put it in ``eval()`` mode for dropout-free sampling).
        input_ids: prompt ``[batch, seq]`` (or one sequence); left-pad ragged batches and pass ``attention_mask``.
        request: a :class:`GenerationRequest`; or, instead, its fields as keyword ``settings``.
        attention_mask: ``[batch, seq]``, 1 for real tokens (padding on the left only).
        settings: ``max_new_tokens`` (required), the other fields of :class:`GenerationRequest` by name
            (``temperature``, ``top_k``, ``top_p``, ``seed``, ``eos_token_id``, ``prefill_chunk``, ``compile``,
            ``column_major``, ``weights``, ``sampling``, ``decode``, ``pad_token_id``, ``check_memory``, ``max_len``), and any
            other sampling keyword (``min_p``, ``stop_strings``, ...).

    Every argument is checked when the function is called, before anything is computed or yielded.

    Raises:
        ArgumentError: (a ``ValueError``, naming the parameter) an empty, ragged, float, bool or out-of-vocabulary
            prompt; ``max_new_tokens`` not an integer >= 0; a prompt plus ``max_new_tokens`` longer than
            ``max_len`` (default the model's ``max_seq_len``); ``max_len`` not an integer in [1, 2**27]
            (:data:`~modkit.core.limits.MAX_SEQ_LEN`), or above ``max_seq_len`` for a model whose position scheme
            does not declare ``unbounded_positions``; ``seed`` outside [0, 2**64 - 1]; an ``eos_token_id`` or
            ``pad_token_id`` outside the vocabulary; an ``attention_mask`` of another shape, with values other than
            0/1, a row of padding only, or padding after a real token (right padding); ``prefill_chunk < 1``;
            ``temperature``, ``top_k`` or ``top_p`` of the wrong type or range
            (:func:`~modkit.inference.checks.check_sampling`); ``weights`` not one of ``float32``, ``bfloat16``,
            ``int8``, or another format than the one the model was already converted to.
        SamplingError: (a ``ValueError``) a bad value of another sampling keyword or list item, naming it.
        ValueError: both ``sampling`` and sampling keywords.
        TypeError: a sampling keyword no registered component declares; no ``max_new_tokens``; both a ``request``
            and keyword settings.
        MemoryLimitError: the KV cache would not fit (see ``check_memory``).
    """
    checked = _checked(model, input_ids, attention_mask, _request(request, settings, "stream_generate"))
    return _stream(model, checked)


def _checked(model: Model, input_ids: Any, attention_mask: Any, request: GenerationRequest) -> _Checked:
    """Check every argument of a :func:`stream_generate` call against ``model`` (errors there), in a fixed order:
    the sampling keywords, the loop's integers, ``max_len``, the prompt, the mask, the token ids, the length, the
    sampling pipeline, the cache's memory."""
    from modkit.nn.memory import check_fits

    r = request
    check_sampling(r.temperature, r.top_k, r.top_p)
    check_generation(r.max_new_tokens, seed=r.seed, prefill_chunk=r.prefill_chunk)
    check_convertible(model, r.weights)
    spec = model.spec
    limit = _length_limit(model, r.max_len)
    ids = _as_batch(input_ids, spec.vocab_size)
    _check_range(ids, spec.vocab_size, "input_ids")
    device = model.embed.weight.device
    ids = ids.to(device)
    mask = _check_mask(attention_mask, ids) if attention_mask is not None else None
    eos_list = _check_eos(r.eos_token_id, spec.vocab_size)
    pad_token_id = r.pad_token_id
    if pad_token_id is not None:
        pad_token_id = check_int(
            pad_token_id, "pad_token_id", None, minimum=0, maximum=spec.vocab_size - 1, what="an integer token id"
        )
    batch, prompt_len = ids.shape
    _check_length(model, prompt_len, r.max_new_tokens, limit, r.max_len)
    sampler = build_sampler(  # validates every sampling argument before any work
        spec.vocab_size,
        sampling=r.sampling,
        decode=r.decode,
        temperature=r.temperature,
        top_k=r.top_k,
        top_p=r.top_p,
        **r.sampling_arguments,
    )
    if r.check_memory and r.max_new_tokens > 0:
        total = prompt_len + r.max_new_tokens
        cache_bytes = kv_cache_bytes(model, total, batch, None)  # as allocated (windows too)
        check_fits(
            cache_bytes,
            device,
            f"a KV cache for {batch} x {total} tokens",
            hint="generate fewer tokens or use a smaller batch",
        )
    return _Checked(ids, mask, eos_list, pad_token_id, sampler, r)


def _generator(seed: Optional[int], device: torch.device) -> torch.Generator:
    """A private generator on ``device``: seeded with ``seed``, or freshly (``torch.seed()`` would reseed the
    global generator)."""
    gen = torch.Generator(device=device)
    if seed is not None:
        gen.manual_seed(seed)
    else:
        gen.seed()
    return gen


def _prefill(model: Model, ids: Tensor, mask: Optional[Tensor], cache: KVCache, chunk: Optional[int]) -> Tensor:
    """Feed the prompt ``ids [batch, prompt_len]`` into ``cache`` (in pieces of ``chunk`` tokens; ``None``: at
    once); the logits of its last position ``[batch, vocab]``."""
    prompt_len = ids.shape[1]
    chunk = chunk or prompt_len
    for start in range(0, prompt_len, chunk):
        part = slice(start, start + chunk)
        logits = model(
            ids[:, part], attention_mask=None if mask is None else mask[:, part], cache=cache, logits_to_keep=1
        ).logits[:, -1]
    return logits


@torch.no_grad()
def _stream(model: Model, checked: _Checked) -> Iterator[Tensor]:
    """The generation loop of :func:`stream_generate`, on checked arguments: prefill, then one token per step."""
    r, ids, mask, eos_list, sampler = checked.request, checked.ids, checked.mask, checked.eos, checked.sampler
    max_new_tokens = r.max_new_tokens
    if max_new_tokens == 0:
        return
    gen = _generator(r.seed, ids.device)
    eos = torch.tensor(eos_list, dtype=torch.long, device=ids.device)
    pad = checked.pad_token_id
    pad = pad if pad is not None else eos_list[0] if eos_list else sampler.pad_token_id() or 0
    if mask is not None and bool(mask.all()):
        mask = None  # no padding: keep the plain causal prefill kernel
    if r.weights is not None:
        quantize_linears(model, r.weights)
    column_major = r.column_major
    if column_major is None:
        column_major = ids.device.type == "cpu" and torch.backends.mkl.is_available()
    if column_major:
        column_major_linears(model)
    batch, prompt_len = ids.shape
    cache = model.new_cache(batch, prompt_len + max_new_tokens)
    logits = _prefill(model, ids, mask, cache, r.prefill_chunk)
    step = compiled_decode(model) if r.compile else functools.partial(decode_logits, model)
    # the prompt and every generated token, for processors and stop conditions that look at the history
    tokens = torch.cat([ids, ids.new_full((batch, max_new_tokens), pad)], 1)
    real = None if mask is None else torch.cat([mask, mask.new_ones(batch, max_new_tokens)], 1)
    state = GenerationState(
        tokens[:, :prompt_len], None if real is None else real[:, :prompt_len], prompt_len, r.decode
    )
    stopping = bool(eos_list) or bool(sampler.stops)
    done = torch.zeros(batch, dtype=torch.bool, device=ids.device)
    for i in range(max_new_tokens):
        token = sampler.choose(logits, state, gen)
        if stopping:
            token = torch.where(done, torch.as_tensor(pad, dtype=token.dtype, device=token.device), token)
        tokens[:, prompt_len + i] = token
        state.ids = tokens[:, : prompt_len + i + 1]
        state.real = None if real is None else real[:, : prompt_len + i + 1]
        if stopping:
            if eos_list:
                done = done | torch.isin(token, eos)
            hit = sampler.stopped(state)
            if hit is not None:
                done = done | hit
        yield token
        if i == max_new_tokens - 1 or (stopping and bool(done.all())):
            return
        logits = step(token[:, None], cache)
        if r.compile:
            cache.seen_tokens += 1  # the compiled step does not touch host-side bookkeeping


def generate(
    model: Model,
    input_ids: Union[Tensor, Sequence[int], Sequence[Sequence[int]]],
    request: Optional[GenerationRequest] = None,
    *,
    attention_mask: Optional[Tensor] = None,
    **settings: Any,
) -> Tensor:
    """Generate and return ``[batch, prompt_len + new]`` int64 tokens (prompt included). Arguments (a
    :class:`GenerationRequest`, or its fields as keywords: ``max_new_tokens`` required) and errors as
    :func:`stream_generate`."""
    request = _request(request, settings, "generate")
    ids = _as_batch(input_ids, model.spec.vocab_size)
    new = list(stream_generate(model, ids, request, attention_mask=attention_mask))
    if not new:
        return ids
    return torch.cat([ids.to(new[0].device), torch.stack(new, 1)], 1)

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
"""

from __future__ import annotations

import functools
import math
import numbers
import warnings
import weakref
from typing import Any, Callable, Iterator, Mapping, Optional, Sequence, Union

import torch
from torch import Tensor

from modkit.core.arguments import MAX_SEED, check_int, is_int, is_real, param_name, shown
from modkit.nn.build import kv_cache_bytes
from modkit.nn.cache import KVCache
from modkit.core.errors import ArgumentError, MaxSeqLenWarning
from modkit.core.limits import MAX_SEQ_LEN
from modkit.nn.model import Model
from modkit.inference.sampling import GenerationState, Sampler, SamplingSetup, sampler_from_arguments, sampler_from_list


# ------------------------------------------------------------------------------------------------ argument checks

_name, _is_int, _is_real, _check_int = param_name, is_int, is_real, check_int


def check_sampling(
    temperature: Any = 1.0, top_k: Any = None, top_p: Any = None, *, names: Optional[Mapping[str, str]] = None
) -> None:
    """Check the three classic sampling keywords, each as a Python argument (before the pipeline is built):
    ``temperature`` a finite number >= 0 or ``None`` (not given), ``top_k`` an integer >= 1 or ``None``, ``top_p``
    a number in (0, 1] or ``None``. The pipeline (:func:`build_sampler`) then validates every processor's values
    against its config.

    Args:
        names: how to call each parameter in messages (the CLI passes ``{"temperature": "--temperature", ...}``).

    Raises:
        ArgumentError: (a ``ValueError``) naming the parameter and the value.
    """
    name = _name(names, "temperature")
    if temperature is not None and not _is_real(temperature) or temperature is not None and (not math.isfinite(temperature) or temperature < 0):
        raise ArgumentError(name, f"{name} must be a finite number >= 0 (0 is greedy), got {shown(temperature)}")
    if top_k is not None:
        _check_int(top_k, "top_k", names, minimum=1)
    if top_p is not None:
        name = _name(names, "top_p")
        if not _is_real(top_p) or not math.isfinite(top_p) or not 0 < top_p <= 1:
            raise ArgumentError(name, f"{name} must be in (0, 1], got {shown(top_p)}")


def check_generation(
    max_new_tokens: Any, *, seed: Any = None, prefill_chunk: Any = None, max_len: Any = None,
    names: Optional[Mapping[str, str]] = None,
) -> None:
    """Check ``max_new_tokens`` (an integer >= 0), ``seed`` (``None`` or an integer in [0, 2**64 - 1]),
    ``prefill_chunk`` (``None`` or an integer >= 1) and ``max_len`` (``None`` or an integer in [1, 2**27],
    :data:`~modkit.core.limits.MAX_SEQ_LEN`), each on its own (:func:`stream_generate` checks them against the model).

    Raises:
        ArgumentError: naming the parameter, the value and the bound.
    """
    check_int(max_new_tokens, "max_new_tokens", names, minimum=0)
    if seed is not None:
        check_int(seed, "seed", names, minimum=0, maximum=MAX_SEED)
    if prefill_chunk is not None:
        check_int(prefill_chunk, "prefill_chunk", names, minimum=1)
    if max_len is not None:
        check_int(max_len, "max_len", names, minimum=1, maximum=MAX_SEQ_LEN)


def _token_tensor(value: Any, name: str, vocab_size: Optional[int] = None) -> Tensor:
    """``value`` (a tensor or nested sequences) as an int64 tensor, refusing floats, bools and ints outside
    ``[0, vocab_size)`` (outside int64 when ``vocab_size`` is ``None``) before torch converts them (torch would
    truncate ``1.7``, read ``True`` as 1 and fail on ``2**64`` with ``Overflow when unpacking long long``)."""
    if isinstance(value, Tensor):
        if value.is_floating_point() or value.is_complex() or value.dtype == torch.bool:
            raise ArgumentError(name, f"{name} must hold integer token ids, got a {str(value.dtype).replace('torch.', '')} tensor")
        return value.long()
    if value is None or isinstance(value, (str, bytes, numbers.Number)):
        raise ArgumentError(name, f"{name} must be a [batch, seq] sequence of integer token ids, got {type(value).__name__}")
    stack, leaves = [value], 0
    while stack:  # refuse floats and bools before torch truncates 1.7 to 1 or reads True as 1
        node = stack.pop()
        if isinstance(node, Tensor):
            continue
        if isinstance(node, (list, tuple)):
            stack.extend(node)
            continue
        leaves += 1
        if not _is_int(node):
            raise ArgumentError(name, f"{name} must hold integer token ids, got {type(node).__name__} {shown(node)}")
        if vocab_size is not None and not 0 <= node < vocab_size:
            raise ArgumentError(name, f"{name} must lie in [0, {vocab_size}) (the vocabulary); got the token id {node}")
        if not -(2**63) <= node < 2**63:
            raise ArgumentError(name, f"{name} holds {node}, outside the int64 range [-2**63, 2**63) of token ids; "
                                "token ids lie in [0, vocab_size)")
    try:
        return torch.as_tensor(value, dtype=torch.long)
    except (ValueError, TypeError, RuntimeError) as exc:
        raise ArgumentError(name, f"{name} must be a rectangular [batch, seq] sequence of integer token ids ({exc})") from None


def _check_range(ids: Tensor, vocab_size: int, name: str) -> None:
    if ids.numel() and (bool((ids < 0).any()) or bool((ids >= vocab_size).any())):
        lo, hi = int(ids.min()), int(ids.max())
        raise ArgumentError(name, f"{name} must lie in [0, {vocab_size}) (the vocabulary); got min {lo}, max {hi}")


def _check_mask(mask: Any, ids: Tensor) -> Tensor:
    name = "attention_mask"
    if not isinstance(mask, Tensor):
        mask = _token_tensor(mask, name)
    if mask.is_floating_point() or mask.is_complex():
        raise ArgumentError(name, f"{name} must be bool or integer (1 for a real token, 0 for padding), got {mask.dtype}")
    if tuple(mask.shape) != tuple(ids.shape):
        raise ArgumentError(name, f"{name} must have the prompt's shape {tuple(ids.shape)}, got {tuple(mask.shape)}")
    if mask.dtype != torch.bool:
        if bool(((mask != 0) & (mask != 1)).any()):
            raise ArgumentError(name, f"{name} must hold only 0 (padding) and 1 (a real token)")
        mask = mask != 0
    mask = mask.to(ids.device)
    empty = ~mask.any(dim=1)
    if bool(empty.any()):
        raise ArgumentError(name, f"{name} row {int(empty.nonzero()[0])} is all padding; every row needs at least one real token")
    # left padding only: once a row has a real token, every later position is real (cumulative max stays 1)
    right = mask.int().cummax(dim=1).values.bool() & ~mask
    if bool(right.any()):
        row = int(right.any(dim=1).nonzero()[0])
        raise ArgumentError(name, f"{name} row {row} has padding after a real token; generate needs the padding on the left "
                            "(left-pad ragged prompts: the new tokens follow the last column)")
    return mask


def _check_eos(eos_token_id: Any, vocab_size: int) -> list[int]:
    name = "eos_token_id"
    if eos_token_id is None:
        return []
    values = [eos_token_id] if not isinstance(eos_token_id, (list, tuple, Tensor)) else list(eos_token_id)
    out = []
    for v in values:
        v = _check_int(v, name, None, minimum=0, maximum=vocab_size - 1, what="an integer token id (or a list of them)")
        out.append(v)
    return out


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
            raise ValueError(f"give the sampling pipeline either as a list (sampling=...) or as keywords, not both; got both "
                             f"sampling and {', '.join(given)}")
        return sampler_from_list(sampling, setup)
    return sampler_from_arguments(arguments, setup)


def _no_history(logits: Tensor) -> GenerationState:
    return GenerationState(ids=torch.zeros(logits.shape[0], 0, dtype=torch.long, device=logits.device), real=None, prompt_len=0)


def filter_logits(logits: Tensor, *, temperature: float = 1.0, top_k: Optional[int] = None, top_p: Optional[float] = None,
                  **arguments: Any) -> Tensor:
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


def _as_batch(input_ids: Union[Tensor, Sequence[int], Sequence[Sequence[int]]], vocab_size: Optional[int] = None) -> Tensor:
    ids = _token_tensor(input_ids, "input_ids", vocab_size)
    if ids.dim() == 1:
        ids = ids[None]
    if ids.dim() != 2 or ids.shape[0] == 0 or ids.shape[1] == 0:
        raise ArgumentError("input_ids", f"input_ids must be a non-empty [batch, seq] sequence, got shape {tuple(ids.shape)}")
    return ids


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
    (they are saved contiguous). Embedding tables (a tied head) are left as they are.

    Args:
        model: any module; every ``nn.Linear`` inside it is converted.
        enable: ``False`` converts back to contiguous row-major weights.

    Returns:
        the number of weights whose layout changed.
    """
    changed = 0
    for module in model.modules():
        if not isinstance(module, torch.nn.Linear) or type(module.weight.data) is not torch.Tensor:
            continue  # (tensor subclasses such as DTensor shards keep their own layout)
        w = module.weight
        col = w.dim() == 2 and w.stride() == (1, w.shape[0])
        with torch.inference_mode(False):  # a normal tensor even when called under inference_mode (trainable later)
            if enable and not col:
                module.weight.data = w.data.t().contiguous().t()
                changed += 1
            elif not enable and not w.is_contiguous():
                module.weight.data = w.data.contiguous()
                changed += 1
    return changed


def stream_generate(
    model: Model,
    input_ids: Union[Tensor, Sequence[int], Sequence[Sequence[int]]],
    *,
    max_new_tokens: int,
    temperature: Optional[float] = None,
    top_k: Optional[int] = None,
    top_p: Optional[float] = None,
    seed: Optional[int] = None,
    eos_token_id: Optional[Union[int, Sequence[int]]] = None,
    attention_mask: Optional[Tensor] = None,
    prefill_chunk: Optional[int] = None,
    compile: bool = False,
    column_major: Optional[bool] = None,
    sampling: Optional[Sequence[Any]] = None,
    decode: Optional[Callable[[list[int]], str]] = None,
    pad_token_id: Optional[int] = None,
    check_memory: bool = True,
    max_len: Optional[int] = None,
    **sampling_arguments: Any,
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
        max_new_tokens: number of steps (>= 0).
        temperature, top_k, top_p: keyword sampling (``None``: not given; temperature 1 by default, 0 is greedy).
        seed: seeds a private generator, so seeded runs are reproducible.
        eos_token_id: stop a row once it emits one of these; iteration ends when every row has stopped.
        attention_mask: ``[batch, seq]``, 1 for real tokens (padding on the left only).
        prefill_chunk: feed the prompt in chunks of this many tokens (bounds prefill memory); ``None``: at once.
        compile: run decode steps through :func:`compiled_decode` (``torch.compile``, fullgraph, static shapes);
            the first call for a model pays the compilation.
        column_major: ``None`` (default): column-major ``nn.Linear`` weights when the model is on a CPU with MKL;
            ``True``: convert whatever the device; ``False``: leave the weight layout as it is.
        sampling: the pipeline as a spec-like JSON list (processors applied in list order, stop conditions), instead
            of keywords; see :mod:`modkit.inference.sampling`.
        decode: token ids -> text (``tokenizer.decode``), needed by ``stop_strings``.
        pad_token_id: what finished rows emit; default the first ``eos_token_id``, else the first stop condition's
            suggestion (``stop_tokens``: its first id), else 0.
        sampling_arguments: more keyword sampling: every registered processor or stop condition with an
            ``argument`` capability (built-ins: ``min_p``, ``repetition_penalty``, ``presence_penalty``,
            ``frequency_penalty``, ``stop_token_ids``, ``stop_strings``).
        check_memory: refuse (:class:`~modkit.core.errors.MemoryLimitError`) a KV cache that would not fit in the memory
            free on the model's device; ``False`` skips the estimate.
        max_len: the most positions a row may reach (prompt + new tokens, padding included); default the spec's
            ``max_seq_len``. Below it, a tighter limit. Above it, only when every position scheme of the model
            declares the ``unbounded_positions`` capability (a scheme computed from the position, with no table of
            ``max_seq_len`` rows: RoPE, ALiBi, sinusoidal, none; as transformers generates past
            ``max_position_embeddings``); a :class:`~modkit.core.errors.MaxSeqLenWarning` then says the model was
            specified for less. A scheme with a table (learned positions) is refused past ``max_seq_len``.

    Every argument is checked when the function is called, before anything is computed or yielded.

    Raises:
        ArgumentError: (a ``ValueError``, naming the parameter) an empty, ragged, float, bool or out-of-vocabulary
            prompt; ``max_new_tokens`` not an integer >= 0; a prompt plus ``max_new_tokens`` longer than
            ``max_len`` (default the model's ``max_seq_len``); ``max_len`` not an integer in [1, 2**27]
            (:data:`~modkit.core.limits.MAX_SEQ_LEN`), or above ``max_seq_len`` for a model whose position scheme does not
            declare ``unbounded_positions``; ``seed`` outside [0, 2**64 - 1]; an ``eos_token_id`` or ``pad_token_id``
            outside the vocabulary; an ``attention_mask`` of another shape, with values other than 0/1, a row of
            padding only, or padding after a real token (right padding); ``prefill_chunk < 1``; ``temperature``,
            ``top_k`` or ``top_p`` of the wrong type or range (:func:`check_sampling`).
        SamplingError: (a ``ValueError``) a bad value of another sampling keyword or list item, naming it.
        ValueError: both ``sampling`` and sampling keywords.
        TypeError: a sampling keyword no registered component declares.
        MemoryLimitError: the KV cache would not fit (see ``check_memory``).
    """
    from modkit.nn.memory import check_fits

    check_sampling(temperature, top_k, top_p)
    check_generation(max_new_tokens, seed=seed, prefill_chunk=prefill_chunk)
    spec = model.spec
    limit = _length_limit(model, max_len)
    ids = _as_batch(input_ids, spec.vocab_size)
    _check_range(ids, spec.vocab_size, "input_ids")
    device = model.embed.weight.device
    ids = ids.to(device)
    mask = _check_mask(attention_mask, ids) if attention_mask is not None else None
    eos_list = _check_eos(eos_token_id, spec.vocab_size)
    if pad_token_id is not None:
        pad_token_id = _check_int(pad_token_id, "pad_token_id", None, minimum=0, maximum=spec.vocab_size - 1,
                                  what="an integer token id")
    batch, prompt_len = ids.shape
    if prompt_len + max_new_tokens > limit:
        bound = f"max_len = {limit}" if max_len is not None else f"the model's max_seq_len = {spec.max_seq_len}"
        hint = ""
        if max_len is None and not _table_positions(model):
            hint = (f"; or pass max_len={prompt_len + max_new_tokens} (the model's position schemes compute any position, "
                    "so generation may run past max_seq_len on request)")
        raise ArgumentError(
            "max_new_tokens",
            f"a prompt of {prompt_len} tokens plus max_new_tokens = {max_new_tokens} reaches position "
            f"{prompt_len + max_new_tokens - 1}, past {bound}; generate at most "
            f"{max(limit - prompt_len, 0)} new tokens or shorten the prompt{hint}",
        )
    if prompt_len + max_new_tokens > spec.max_seq_len:
        warnings.warn(MaxSeqLenWarning(
            f"generating up to position {prompt_len + max_new_tokens - 1} (max_len = {limit}), past the max_seq_len = "
            f"{spec.max_seq_len} the model was specified for; its position schemes compute any position, but it was "
            "trained (if at all) on at most max_seq_len tokens, so quality past that is not known"
        ), stacklevel=2)
    sampler = build_sampler(  # validates every sampling argument before any work
        spec.vocab_size, sampling=sampling, decode=decode, temperature=temperature, top_k=top_k, top_p=top_p,
        **sampling_arguments,
    )
    if check_memory and max_new_tokens > 0:
        cache_bytes = kv_cache_bytes(model, prompt_len + max_new_tokens, batch, None)  # as allocated (windows too)
        check_fits(cache_bytes, device, f"a KV cache for {batch} x {prompt_len + max_new_tokens} tokens",
                   hint="generate fewer tokens or use a smaller batch")
    return _stream(model, ids, mask, eos_list, pad_token_id, sampler, max_new_tokens, seed, prefill_chunk, compile,
                   column_major, decode)


def _table_positions(model: Model) -> list[str]:
    """``type (provider)`` of each position scheme of ``model``'s layers that does not declare the
    ``unbounded_positions`` capability (a table of ``max_seq_len`` rows, or a scheme the registry does not know)."""
    from modkit.core.registry import get_registry

    reg = get_registry()
    spec = model.spec
    found: dict[str, None] = {}
    for cfg in [spec.position] + [spec.layer(i).position for i in range(spec.n_layers)]:
        try:
            entry = reg.entry_for_config(cfg, "position")
        except Exception:  # noqa: BLE001 - not in this registry: nothing is declared
            found[f"{getattr(cfg, 'type', type(cfg).__name__)!r} (not registered here)"] = None
            continue
        if not entry.capabilities.get("unbounded_positions"):
            found[f"{entry.type!r} ({entry.provider})"] = None
    return list(found)


def _length_limit(model: Model, max_len: Any) -> int:
    """The most positions a row may reach: ``max_len`` checked (see :func:`stream_generate`), or ``max_seq_len``."""
    spec = model.spec
    if max_len is None:
        return spec.max_seq_len
    max_len = check_int(max_len, "max_len", None, minimum=1, maximum=MAX_SEQ_LEN)
    if max_len > spec.max_seq_len:
        tables = _table_positions(model)
        if tables:
            raise ArgumentError(
                "max_len",
                f"max_len = {max_len} is past the model's max_seq_len = {spec.max_seq_len}, and position type "
                f"{', '.join(tables)} does not declare 'unbounded_positions' (a table of max_seq_len rows has no row "
                "for a later position); generate at most max_seq_len positions, or raise max_seq_len in the spec and train",
            )
    return max_len


@torch.no_grad()
def _stream(model, ids, mask, eos_list, pad_token_id, sampler, max_new_tokens, seed, prefill_chunk, compile,
            column_major, decode):
    """The generation loop of :func:`stream_generate`, on checked arguments."""
    if max_new_tokens == 0:
        return
    gen = torch.Generator(device=ids.device)
    if seed is not None:
        gen.manual_seed(seed)
    else:  # a fresh non-deterministic seed for this generator only (torch.seed() would reseed the global generator)
        gen.seed()
    eos = torch.tensor(eos_list, dtype=torch.long, device=ids.device)
    pad = pad_token_id if pad_token_id is not None else eos_list[0] if eos_list else sampler.pad_token_id() or 0
    if mask is not None and bool(mask.all()):
        mask = None  # no padding: keep the plain causal prefill kernel
    if column_major is None:
        column_major = ids.device.type == "cpu" and torch.backends.mkl.is_available()
    if column_major:
        column_major_linears(model)
    batch, prompt_len = ids.shape
    cache = model.new_cache(batch, prompt_len + max_new_tokens)
    chunk = prefill_chunk or prompt_len
    for start in range(0, prompt_len, chunk):
        part = slice(start, start + chunk)
        logits = model(ids[:, part], attention_mask=None if mask is None else mask[:, part], cache=cache,
                       logits_to_keep=1).logits[:, -1]
    step = compiled_decode(model) if compile else functools.partial(decode_logits, model)
    # the prompt and every generated token, for processors and stop conditions that look at the history
    tokens = torch.cat([ids, ids.new_full((batch, max_new_tokens), pad)], 1)
    real = None if mask is None else torch.cat([mask, mask.new_ones(batch, max_new_tokens)], 1)
    state = GenerationState(tokens[:, :prompt_len], None if real is None else real[:, :prompt_len], prompt_len, decode)
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
        if compile:
            cache.seen_tokens += 1  # the compiled step does not touch host-side bookkeeping


def generate(model: Model, input_ids, *, max_new_tokens: int, **kwargs) -> Tensor:
    """Generate and return ``[batch, prompt_len + new]`` tokens (prompt included). Arguments and errors as
    :func:`stream_generate`."""
    ids = _as_batch(input_ids, model.spec.vocab_size)
    new = list(stream_generate(model, ids, max_new_tokens=max_new_tokens, **kwargs))
    if not new:
        return ids
    return torch.cat([ids.to(new[0].device), torch.stack(new, 1)], 1)

"""``modkit generate MODEL --prompt TEXT``: stream a continuation from a spec (random weights), a modkit checkpoint
or a Hugging Face folder, then one summary line (prefill ms, decode tokens/s, KV-cache bytes) on stderr. One flag
per sampling keyword a registered logits processor or stop condition declares, or the whole pipeline as a JSON
list (``--sampling``); those flags need the registry, so they are added only when ``generate`` is parsed."""

from __future__ import annotations

import argparse
import re
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Optional

from .common import _check_device, _registry, _sync
from .errors import UserError
from .output import _bytes, _debug, _err, _spec_error_lines


def add_subcommands(sub) -> None:
    """Add ``generate``; the sampling flags are deferred until it is parsed (they need the registry)."""
    p = sub.add_parser(
        "generate",
        help="generate text or token ids from a model",
        description="Stream a continuation of a prompt from a spec (random weights), a modkit checkpoint folder or a "
        "Hugging Face folder, then print one summary line (prefill ms, decode tokens/s) on stderr.",
    )
    p.add_argument(
        "model", metavar="MODEL", help="spec .json (random init), modkit checkpoint folder or Hugging Face folder"
    )
    p.add_argument("--prompt", required=True, help="text (with --tokenizer) or token ids separated by commas or spaces")
    p.add_argument(
        "--tokenizer",
        metavar="JSON",
        help="a tokenizers tokenizer.json (default: MODEL/tokenizer.json when there is one); without one, prompt and output are token ids",
    )
    p.add_argument("--max-new-tokens", type=int, default=32, metavar="N", help="tokens to generate (default 32)")
    p.add_argument(
        "--max-len",
        type=int,
        default=None,
        metavar="N",
        help="most positions the prompt plus the new tokens may reach (default: the spec's max_seq_len); above "
        "max_seq_len only for position schemes without a table (rope, alibi, sinusoidal, none), with a warning",
    )
    p.add_argument(
        "--seed", type=int, default=0, help="seed of the sampling (and of random weights for a spec; default 0)"
    )
    p.add_argument("--device", default="cpu", help="cpu (default), cuda, cuda:N, ...")
    p.add_argument(
        "--dtype", default=None, help="float32, bfloat16 or float16 (default: float32 for a spec, as stored otherwise)"
    )
    p.add_argument(
        "--weights",
        default=None,
        metavar="{float32,bfloat16,int8}",
        help="how the linear weights are stored for decoding: float32 (default: as loaded), bfloat16, or int8 "
        "(per-output-channel symmetric, float scales); embeddings and a tied head stay as loaded",
    )
    p.add_argument(
        "--compile", action="store_true", help="decode with torch.compile (fullgraph; pays a one-off compilation)"
    )
    p.add_argument(
        "--no-memory-check",
        action="store_true",
        help="allocate even when the estimated weight or KV-cache bytes exceed the memory free on the device",
    )
    defer = getattr(p, "defer", None)  # modkit's parser: when `generate` is parsed or its help shown; a plain one: now
    defer(_add_sampling_arguments, light=_add_sampling_help) if defer is not None else _add_sampling_arguments(p)
    p.set_defaults(func=cmd_generate)


def _load_model(text: str, device, dtype: Optional[str], seed: int, check_memory: bool = True):
    """A spec ``.json`` (built with random weights from ``seed``), a modkit checkpoint folder (``spec.json``) or a
    Hugging Face folder (``config.json``, through ``modkit.from_hf``)."""
    import modkit

    path = Path(text)
    if "\x00" not in text and not path.exists():
        raise FileNotFoundError(f"{text}: no such file")
    if not path.is_dir():  # a spec file; load_spec refuses special files (FIFO, device) and NUL bytes by name
        if path.suffix != ".json":
            raise UserError(f"{text}: give a spec .json file or a checkpoint folder")
        reg = _registry()
        return modkit.build(
            modkit.load_spec(path, registry=reg),
            device=device,
            dtype=dtype,
            seed=seed,
            registry=reg,
            check_memory=check_memory,
        )
    if (path / "spec.json").is_file():
        return modkit.load(path, device=device, dtype=dtype, check_memory=check_memory)
    if (path / "config.json").is_file():
        return modkit.from_hf(path, device=device, dtype=dtype, check_memory=check_memory)
    raise UserError(f"{text}: a folder without spec.json (modkit checkpoint) or config.json (Hugging Face model)")


def _load_tokenizer(path: str):
    """The tokenizer at ``path`` (:func:`modkit.data.load_tokenizer`: a regular ``tokenizer.json``, its padding and
    truncation switched off so a prompt is encoded as it is), or a :class:`UserError`."""
    from modkit.data import DataError, load_tokenizer

    try:
        return load_tokenizer(path)
    except DataError as exc:
        raise UserError(f"--tokenizer {exc}") from None


def _prompt_ids(text: str, tokenizer) -> list[int]:
    """The prompt's token ids: encoded by ``tokenizer``, or parsed from ids separated by commas or spaces."""
    if tokenizer is not None:
        ids = tokenizer.encode(text)
        if not ids:
            raise UserError("the prompt encodes to no tokens")
        return ids
    from modkit.core.limits import MAX_VOCAB_SIZE

    parts = [p for p in text.replace(",", " ").split() if p]
    if not all(re.fullmatch(r"[+-]?[0-9]+", p) for p in parts):
        raise UserError(f"without --tokenizer the prompt is token ids separated by commas or spaces, got {text!r}")
    ids = [int(p) for p in parts]
    if not ids:
        raise UserError("the prompt is empty; give at least one token id")
    for i in ids:  # before the model loads: no vocabulary reaches past modkit's bound (and torch holds int64 only)
        if not 0 <= i < MAX_VOCAB_SIZE:
            raise UserError(
                f"--prompt holds the token id {i}, outside [0, {MAX_VOCAB_SIZE:,}): token ids are >= 0 and "
                f"below vocab_size, which is at most {MAX_VOCAB_SIZE:,} (modkit.core.limits.MAX_VOCAB_SIZE)"
            )
    return ids


def _check_prompt(ids: list[int], vocab_size: int) -> None:
    """Every prompt id lies in the model's vocabulary ``[0, vocab_size)``, or a :class:`UserError` naming it."""
    for i in ids:
        if not 0 <= i < vocab_size:
            raise UserError(
                f"--prompt holds the token id {i}, outside the model's vocabulary [0, {vocab_size:,}) "
                f"(vocab_size = {vocab_size:,})"
            )


class _TextStream:
    """Print the text of a growing list of token ids as it becomes stable (whole UTF-8 characters only)."""

    def __init__(self, tokenizer):
        self.tokenizer, self.ids, self.shown = tokenizer, [], ""

    def push(self, token: int) -> None:
        self.ids.append(token)
        if self.tokenizer is None:
            sys.stdout.write(("" if len(self.ids) == 1 else " ") + str(token))
        else:
            text = self.tokenizer.decode(self.ids)
            if text.startswith(self.shown) and not text.endswith("\ufffd"):  # wait for a split character to complete
                sys.stdout.write(text[len(self.shown) :])
                self.shown = text
        sys.stdout.flush()

    def close(self) -> None:
        if self.tokenizer is not None:
            text = self.tokenizer.decode(self.ids)
            sys.stdout.write(text[len(self.shown) :] if text.startswith(self.shown) else "\n" + text)
        sys.stdout.write("\n")
        sys.stdout.flush()


def cmd_generate(args: argparse.Namespace) -> int:
    """``modkit generate MODEL --prompt TEXT``: stream a continuation, then one summary line on stderr."""
    from modkit.inference.generate import column_major_linears
    from modkit.inference.weights import quantize_linears

    _check_generate_args(args)
    tokenizer, by_hand = _find_tokenizer(args)
    ids = _prompt_ids(args.prompt, tokenizer)
    device = _check_device(args.device)
    if device.type == "meta":
        raise UserError("generate needs a real device (cpu, cuda, ...), not meta")
    model = _load_model(args.model, device, args.dtype, args.seed, not args.no_memory_check).eval()
    if tokenizer is not None:  # more ids than the model: an error naming both sizes; fewer, given by hand: a warning
        from modkit.data import check_fits

        warning = check_fits(tokenizer, model.spec.vocab_size)
        if warning and by_hand:
            _err(f"modkit: warning: {warning}")
    else:
        _check_prompt(ids, model.spec.vocab_size)
    if args.weights is not None:  # converted before the clock starts (the summary's prefill time is the prefill's)
        quantize_linears(model, args.weights)
    if device.type == "cpu":  # batch-1 decoding streams column-major weights faster (same values; see the docstring)
        column_major_linears(model)
    stream = _TextStream(tokenizer)
    sampling = _sampling_from_args(args)
    decode = tokenizer.decode if tokenizer is not None else None
    if not _sampler_builds(model.spec.vocab_size, decode, sampling):
        return 1
    tokens = _start_generation(model, ids, args, decode, sampling)
    _stream_and_report(tokens, stream, model, device, len(ids), args.max_new_tokens)
    return 0


def _check_generate_args(args: argparse.Namespace) -> None:
    """Every length, seed and sampling argument checked before any work; a :class:`UserError` naming the flag."""
    from modkit.inference.generate import check_generation, check_sampling
    from modkit.inference.weights import check_weights

    if args.max_new_tokens < 1:
        raise UserError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    flags = {
        "temperature": "--temperature",
        "top_k": "--top-k",
        "top_p": "--top-p",
        "seed": "--seed",
        "max_new_tokens": "--max-new-tokens",
        "max_len": "--max-len",
    }
    check_sampling(args.temperature, args.top_k, args.top_p, names=flags)  # every argument before any work
    check_generation(args.max_new_tokens, seed=args.seed, max_len=args.max_len, names=flags)
    check_weights(args.weights, "--weights")


def _find_tokenizer(args: argparse.Namespace) -> tuple[Any, bool]:
    """``(tokenizer or None, whether it was given by hand)``: ``--tokenizer``, else ``MODEL/tokenizer.json`` when
    MODEL is a folder holding one (named on stderr; ``args.tokenizer`` is set to it)."""
    found = Path(args.model) / "tokenizer.json"  # a training run's checkpoints (and HF folders) carry their tokenizer
    by_hand = bool(args.tokenizer)
    if not args.tokenizer and Path(args.model).is_dir() and found.is_file():
        args.tokenizer = str(found)
        _err(f"tokenizer: {found}")
    return (_load_tokenizer(args.tokenizer) if args.tokenizer else None), by_hand


def _sampler_builds(vocab_size: int, decode, sampling: dict) -> bool:
    """Whether the sampling pipeline builds; if not, its errors go to stderr, one line each, naming the flags."""
    import modkit

    from modkit.inference.generate import build_sampler

    try:  # the pipeline is checked before anything is printed
        build_sampler(vocab_size, decode=decode, **sampling)
    except modkit.SamplingError as exc:
        if "sampling" in sampling:
            lines = _spec_error_lines(exc, "--sampling")
        else:
            lines = [f"--{p.replace('_', '-')}: {m}" for p, m in exc.errors]
        for line in lines:
            _err(line)
        return False
    return True


def _start_generation(model, ids: list[int], args: argparse.Namespace, decode, sampling: dict):
    """The token stream of :func:`stream_generate`; a length warning it raises goes to stderr as one modkit line."""
    from modkit.core.errors import MaxSeqLenWarning
    from modkit.inference.generate import stream_generate

    with warnings.catch_warnings(record=True) as caught:  # (the length warning as one modkit line)
        warnings.simplefilter("always", MaxSeqLenWarning)
        tokens = stream_generate(  # checks the prompt against the model (vocabulary, max_seq_len) before any output
            model,
            [ids],
            max_new_tokens=args.max_new_tokens,
            seed=args.seed,
            compile=args.compile,
            decode=decode,
            check_memory=not args.no_memory_check,
            max_len=args.max_len,
            weights=args.weights,
            **sampling,
        )
    for w in caught:
        if issubclass(w.category, MaxSeqLenWarning):
            _err(f"modkit: warning: {w.message} (--max-len {args.max_len})")
        else:
            warnings.showwarning(w.message, w.category, w.filename, w.lineno)
    return tokens


def _stream_and_report(tokens, stream: _TextStream, model, device, n_prompt: int, max_new_tokens: int) -> None:
    """Write every token to ``stream`` as it comes, then the summary line on stderr: prefill time (ms, with the first
    token), decode rate (tokens/s), the KV cache's bytes, the device, the weights' dtype and the linear weights'
    format."""
    from modkit.inference.weights import weight_format

    start = time.perf_counter()
    first = None
    n = 0
    for token in tokens:
        if first is None:
            _sync(device)
            first = time.perf_counter()
        stream.push(int(token[0]))
        n += 1
    _sync(device)
    end = time.perf_counter()
    stream.close()
    prefill_ms = 1000 * ((first or end) - start)
    rate = (n - 1) / (end - first) if n > 1 and end > first else float("nan")
    kv = model.new_cache(1, n_prompt + max_new_tokens, device="meta").nbytes()  # what generate allocated
    _err(
        f"prompt {n_prompt} tokens, prefill {prefill_ms:.1f} ms (with the first token); "
        f"decode {n - 1} tokens at {rate:.1f} tokens/s; KV cache {_bytes(kv)}; "
        f"{device}, {str(model.embed.weight.dtype).replace('torch.', '')}; linear weights {weight_format(model)}"
    )


def _sampling_arguments() -> dict:
    """``{keyword: (entry, field)}`` of the registered sampling steps (empty if the registry cannot load)."""
    try:
        from modkit.inference.sampling import arguments

        return arguments(_registry())
    except Exception:  # noqa: BLE001 - a broken registry must not take the parser down; commands report it
        if _debug():
            raise
        return {}


def _add_sampling_arguments(p: argparse.ArgumentParser, *, plugins: bool = True) -> None:
    """The sampling arguments of ``generate``: ``--temperature``, ``--top-k``, ``--top-p``, one flag per registered
    sampling keyword (:func:`_add_sampling_flags`; this loads the plugins, and torch, unless ``plugins`` is false)
    and ``--sampling``."""
    p.add_argument("--temperature", type=float, default=None, metavar="T", help="0 (default) is greedy; > 0 samples")
    p.add_argument("--top-k", type=int, default=None, metavar="K", help="sample among the K most likely tokens")
    p.add_argument(
        "--top-p", type=float, default=None, metavar="P", help="nucleus sampling: smallest set with mass >= P"
    )
    if plugins:
        _add_sampling_flags(p)
    p.add_argument(
        "--sampling",
        metavar="JSON",
        help="the sampling pipeline as a JSON list (or a file holding one), applied in list order, e.g. "
        '\'[{"type": "temperature", "value": 0.7}, {"type": "min_p", "p": 0.05}]\'; instead of the flags above',
    )


def _add_sampling_help(p: argparse.ArgumentParser) -> None:
    """``generate --help`` without loading the plugins (torch takes seconds to import): the built-in sampling
    flags, and where the flags the registered sampling steps add are listed."""
    _add_sampling_arguments(p, plugins=False)
    p.epilog = (
        "Every registered logits processor and stop condition adds a flag of its own (--repetition-penalty, "
        "--min-p, --stop-strings, ...): `modkit list logits_processor` and `modkit list stop_condition` list them "
        "(their keyword, with - for _, is the flag), and the CLI reference page of the docs shows every flag."
    )


def _add_sampling_flags(p: argparse.ArgumentParser) -> None:
    """One ``--flag`` per sampling keyword a registered logits processor or stop condition declares (its
    ``argument`` capability), typed from its config field; flags already defined are left as they are."""
    import typing

    taken = {a.dest for a in p._actions}
    for name, (entry, field) in sorted(_sampling_arguments().items()):
        if name in taken:
            continue

        def base(t: Any) -> Any:  # int for Annotated[int, Ge(0)] (PositiveInt and friends)
            return typing.get_args(t)[0] if typing.get_origin(t) is typing.Annotated else t

        info = entry.config.model_fields.get(field)
        ann = base(info.annotation if info is not None else str)
        kwargs: dict[str, Any] = {"default": None, "dest": name}
        if typing.get_origin(ann) is list:
            item = base((typing.get_args(ann) or (str,))[0])
            kwargs.update(nargs="+", type=item if item in (int, float, str) else str)
        elif ann in (int, float):
            kwargs["type"] = ann
        text = (info.description or "") if info is not None else ""
        kwargs["help"] = f"{entry.kind} {entry.type}: {text}".replace("%", "%%")
        kwargs["metavar"] = field.upper()
        p.add_argument("--" + name.replace("_", "-"), **kwargs)


def _sampling_from_args(args: argparse.Namespace) -> dict:
    """``generate`` keyword arguments for the sampling pipeline from the parsed flags (``--sampling`` or flags)."""
    values = {name: getattr(args, name, None) for name in _sampling_arguments()}
    for name in ("temperature", "top_k", "top_p"):
        values[name] = getattr(args, name, None)
    given = {k: v for k, v in values.items() if v is not None}
    if args.sampling is None:
        given.setdefault("temperature", 0.0)  # the command line decodes greedily unless told otherwise
        return given
    if given:
        raise UserError(
            f"--sampling replaces the sampling flags; drop {', '.join('--' + k.replace('_', '-') for k in sorted(given))}"
        )
    from modkit.core.jsonio import JSONInputError, parse_json, read_json_file

    text = args.sampling
    try:
        if text.lstrip().startswith("["):
            steps = parse_json(text, source="--sampling")
        elif "\x00" not in text and Path(text).exists():
            steps = read_json_file(text)  # a regular file of bounded size, UTF-8, no duplicate keys
        else:
            raise UserError(f"--sampling takes a JSON list or a file holding one; {text!r} is neither")
    except JSONInputError as exc:
        where = exc.source or "--sampling"
        raise UserError("; ".join(f"{where}{': ' + p if p else ''}: {m}" for p, m in exc.errors)) from None
    return {"sampling": steps}

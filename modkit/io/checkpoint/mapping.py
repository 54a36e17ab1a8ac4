"""Foreign checkpoints mapped onto modkit's ``state_dict``: :class:`Link` (one correspondence), :class:`WeightMapper`
(what a plugin registers per ``model_type``), :func:`gather` (read through the links, everything checked first)
and :func:`export` (the way back)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Collection, Mapping, Optional, Protocol, Sequence, runtime_checkable

import torch
from torch import Tensor

from modkit.core.errors import CheckpointError

from .files import _LOADABLE_CODES, _fmt_names
from .source import TensorSource

#: safetensors codes of the integer types an index table (``integer`` in :func:`gather`) may be stored as
_INTEGER_CODES = ("I64", "I32", "I16", "I8", "U8")

if TYPE_CHECKING:
    from modkit.nn.model import Model
    from modkit.spec import ModelSpec


def _identity(tensors: Sequence[Tensor], *_: Any) -> list[Tensor]:
    return list(tensors)


@dataclass(frozen=True)
class Link:
    """One correspondence between tensors of a foreign checkpoint and of modkit's ``state_dict``.

    Attributes:
        hf: the foreign (e.g. Hugging Face) tensor names, in the order the transforms use.
        ours: the modkit ``state_dict`` names, in the order the transforms use.
        to_ours: ``to_ours(hf_tensors) -> ours_tensors``; default: identity (``len(hf) == len(ours)``).
            Must be exact (split, concatenate, transpose, permute, add): round trips are compared bitwise.
        to_hf: ``to_hf(ours_tensors, extras) -> hf_tensors``, the exact inverse of ``to_ours``; ``extras`` are the
            kept source tensors (``model.checkpoint_extras``), for inverting a fold (BERT's token types).
        optional: the foreign tensors may be absent (e.g. a head that a tied checkpoint may or may not store).
    """

    hf: tuple[str, ...]
    ours: tuple[str, ...]
    to_ours: Optional[Callable[[Sequence[Tensor]], Sequence[Tensor]]] = None
    to_hf: Optional[Callable[[Sequence[Tensor], Mapping[str, Tensor]], Sequence[Tensor]]] = None
    optional: bool = False

    def forward(self, tensors: Sequence[Tensor]) -> list[Tensor]:
        """Foreign tensors → modkit tensors."""
        return list((self.to_ours or _identity)(tensors))

    def backward(self, tensors: Sequence[Tensor], extras: Mapping[str, Tensor]) -> list[Tensor]:
        """Modkit tensors → foreign tensors."""
        return list((self.to_hf or _identity)(tensors, extras))


@runtime_checkable
class WeightMapper(Protocol):
    """What a plugin registers with ``register(model_type, convert, weights=mapper)`` for one ``model_type``.

    ``links(spec, shapes, config)`` returns the :class:`Link` list that covers every tensor of a model built from
    ``spec`` (``shapes``: ``{state_dict name: shape}``) for a checkpoint described by the foreign ``config``.
    ``keep`` lists ``(regex, reason)`` for foreign tensors the model does not compute but that are carried along
    (never dropped). ``aliases`` lists ``(canonical prefix, alternative prefix)`` pairs accepted when reading
    (e.g. GPT-2 files saved without ``transformer.``). ``hf_config(spec, base)`` is the reverse config
    conversion; it must raise :class:`~modkit.core.errors.CheckpointError` when the spec cannot be expressed.

    Optional, read by :func:`modkit.from_hf` when present (a wrapper type reading the language model of a
    vision-language checkpoint, :mod:`modkit_plugins.hf._wrapper`): ``left_out``, name prefixes of stored tensors
    outside the model (never read, counted in one :class:`~modkit.core.errors.LeftOutTensorsWarning`);
    ``export_config(config)`` and ``export_extras(extras)``, what the loaded model keeps as ``hf_config`` and
    ``checkpoint_extras`` for a later export (the text type's config and tensor names).
    """

    keep: Sequence[tuple[str, str]]
    aliases: Sequence[tuple[str, str]]

    def links(self, spec: "ModelSpec", shapes: Mapping[str, tuple[int, ...]], config: Mapping[str, Any]) -> list[Link]:
        """Every :class:`Link` of a model built from ``spec`` (``shapes``: its ``state_dict`` shapes) for a
        checkpoint described by the foreign ``config`` (which may choose a fused layout)."""
        ...

    def hf_config(self, spec: "ModelSpec", base: Optional[Mapping[str, Any]] = None) -> dict:
        """The foreign config dict for ``spec``; ``base`` is the config the model was imported from, if any.

        Raises:
            CheckpointError: ``spec`` cannot be expressed in this format (name each field).
        """
        ...


def _check_coverage(links: Sequence[Link], shapes: Mapping[str, tuple[int, ...]], what: str) -> None:
    """Every modkit tensor is produced by exactly one link, and no link names a tensor the model lacks."""
    seen: dict[str, int] = {}
    for link in links:
        for name in link.ours:
            seen[name] = seen.get(name, 0) + 1
    uncovered = [n for n in shapes if n not in seen]
    unknown = [n for n in seen if n not in shapes and not n.endswith("lm_head.weight")]
    twice = [n for n, c in seen.items() if c > 1]
    problems = []
    if uncovered:
        problems.append(
            f"{len(uncovered)} model tensor(s) have no counterpart in {what}: {', '.join(uncovered)} "
            "(the spec holds components this checkpoint format cannot store)"
        )
    if unknown:
        problems.append(f"the mapper names tensor(s) the model does not have: {', '.join(unknown)}")
    if twice:
        problems.append(f"the mapper produces tensor(s) twice: {', '.join(twice)}")
    if problems:
        raise CheckpointError("; ".join(problems))


def expected_foreign_shapes(
    links: Sequence[Link], shapes: Mapping[str, tuple[int, ...]]
) -> dict[str, tuple[tuple[int, ...], Link]]:
    """``{foreign name: (expected shape, link)}``, computed by running every ``to_hf`` on ``meta`` tensors.

    Raises:
        CheckpointError: two links produce the same foreign name, or a link returns the wrong number of tensors.
    """
    out: dict[str, tuple[tuple[int, ...], Link]] = {}
    for link in links:
        # a name the model lacks is the optional head of a tied model: it has the embedding's shape
        ours = [torch.empty(shapes[n] if n in shapes else _tied_shape(n, shapes), device="meta") for n in link.ours]
        theirs = link.backward(ours, {})
        if len(theirs) != len(link.hf):
            raise CheckpointError(f"weight mapper bug: link {link.hf} <- {link.ours} returned {len(theirs)} tensors")
        for name, t in zip(link.hf, theirs):
            if name in out:
                raise CheckpointError(f"weight mapper bug: foreign tensor {name!r} is produced by two links")
            out[name] = (tuple(t.shape), link)
    return out


def _tied_shape(name: str, shapes: Mapping[str, tuple[int, ...]]) -> tuple[int, ...]:
    emb = name[: -len("lm_head.weight")] + "embed.weight"
    return tuple(shapes.get(emb, (0,)))


def _resolve(name: str, source: TensorSource, aliases: Sequence[tuple[str, str]]) -> Optional[str]:
    if name in source:
        return name
    for canonical, alternative in aliases:
        if name.startswith(canonical):
            alt = alternative + name[len(canonical) :]
            if alt in source:
                return alt
    return None


def gather(
    source: TensorSource,
    links: Sequence[Link],
    shapes: Mapping[str, tuple[int, ...]],
    *,
    keep: Sequence[tuple[str, str]] = (),
    aliases: Sequence[tuple[str, str]] = (),
    what: str = "the checkpoint",
    skip: Sequence[str] = (),
    integer: Collection[str] = (),
) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """Read ``source`` through ``links`` into a modkit state dict, checking everything first.

    ``integer`` names the modkit tensors that hold integers (index tables), which a checkpoint may store as an
    integer type (any other tensor must be stored as a floating type).

    Stored tensors whose names start with a prefix of ``skip`` (parts of the checkpoint outside the model, declared
    by the caller, which says so: :func:`modkit.from_hf`) are neither read nor reported as unexpected.

    Returns:
        ``(state_dict, extras)``: modkit tensors by ``state_dict`` name (CPU, stored dtype), and the kept
            foreign tensors (``keep`` patterns) by their canonical name.

    Raises:
        CheckpointError: listing every missing foreign tensor (with the modkit tensor it would feed), every
            unexpected one (neither mapped nor kept), and every shape mismatch (tensor name, expected and stored
            shapes). Nothing is read when any problem is found.
    """
    _check_coverage(links, shapes, what)
    expected = expected_foreign_shapes(links, shapes)
    keep_res = [(re.compile(p), why) for p, why in keep]
    problems = _Problems()
    used = problems.check_links(links, source, aliases, expected, integer)
    extras: dict[str, str] = {}
    used_real = set(used.values())
    for real in source.names():
        canonical = _canonical(real, aliases, expected)
        if any(r.fullmatch(canonical) for r, _ in keep_res):
            extras[canonical] = real
        elif real not in used_real and skip and real.startswith(tuple(skip)):
            continue
        elif real not in used_real:
            problems.unexpected.append(real)
    problems.raise_if_any(f"{what} ({source.origin}) does not match the model:")
    state: dict[str, Tensor] = {}
    for link in links:
        if link.hf[0] not in used and link.optional:
            continue
        outs = link.forward([source.get(used[n]) for n in link.hf])
        for name, t in zip(link.ours, outs):
            state[name] = t
    return state, {name: source.get(real) for name, real in extras.items()}


@dataclass
class _Problems:
    """What :func:`gather` found wrong with a checkpoint, one message line per tensor.

    Attributes:
        missing: foreign tensors the links need that the checkpoint lacks (with the modkit tensors they feed).
        unexpected: stored tensors neither mapped nor kept.
        mismatched: stored shapes differing from the ones the links expect.
        wrong_dtype: stored dtypes the model cannot take (integers, bool, 8-bit floats).
    """

    missing: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    mismatched: list[str] = field(default_factory=list)
    wrong_dtype: list[str] = field(default_factory=list)

    def check_links(
        self,
        links: Sequence[Link],
        source: TensorSource,
        aliases: Sequence[tuple[str, str]],
        expected: Mapping[str, tuple[tuple[int, ...], Link]],
        integer: Collection[str] = (),
    ) -> dict[str, str]:
        """Resolve every foreign name of ``links`` in ``source`` (headers only), noting what is missing or wrong.

        A tensor feeding only modkit tensors in ``integer`` (index tables: a hash router's token → expert table) may
        be stored as an integer type; every other one must be a floating type.

        Returns:
            ``{foreign name: stored name}`` of the tensors found (an optional link wholly absent is skipped).
        """
        used: dict[str, str] = {}
        for link in links:
            resolved = [_resolve(n, source, aliases) for n in link.hf]
            if all(r is None for r in resolved) and link.optional:
                continue
            feeds = ", ".join(link.ours)
            for name, real in zip(link.hf, resolved):
                if real is None:
                    self.missing.append(f"{name} (for {feeds})")
                    continue
                used[name] = real
                want, got = expected[name][0], source.shape(real)
                if tuple(want) != tuple(got):
                    self.mismatched.append(
                        f"{real}: the checkpoint stores shape {list(got)}, the model needs {list(want)} (for {feeds})"
                    )
                code = source.dtype_code(real)
                if code in _INTEGER_CODES and set(link.ours) <= set(integer):
                    continue
                if code not in _LOADABLE_CODES:
                    why = (
                        "a quantised 8-bit float format; dequantise the checkpoint first"
                        if code.startswith("F8")
                        else "not a floating-point type"
                    )
                    self.wrong_dtype.append(
                        f"{real}: stored as {code} ({why}); the model needs F16, BF16, F32 or F64 (for {feeds})"
                    )
        return used

    def raise_if_any(self, heading: str) -> None:
        """Raise one error listing every problem under ``heading``; nothing when there is none.

        Raises:
            CheckpointError: missing, unexpected, mismatched and wrongly typed tensors, each named.
        """
        if not (self.missing or self.unexpected or self.mismatched or self.wrong_dtype):
            return
        parts = [heading]
        if self.missing:
            parts.append(f"  missing {len(self.missing)} tensor(s): {_fmt_names(self.missing)}")
        if self.unexpected:
            parts.append(
                f"  unexpected {len(self.unexpected)} tensor(s) (not part of this model; refusing to drop them): "
                f"{_fmt_names(self.unexpected)}"
            )
        if self.mismatched:
            parts.append(f"  {len(self.mismatched)} shape mismatch(es):")
            parts += [f"    {m}" for m in self.mismatched]
        if self.wrong_dtype:
            parts.append(f"  {len(self.wrong_dtype)} tensor(s) of a dtype the model cannot take:")
            parts += [f"    {m}" for m in self.wrong_dtype]
        raise CheckpointError("\n".join(parts))


def _canonical(real: str, aliases: Sequence[tuple[str, str]], expected: Mapping[str, Any]) -> str:
    """The canonical name of a stored tensor: itself, or with an alternative prefix replaced by the canonical one."""
    if real in expected:
        return real
    for canonical, alternative in aliases:
        if alternative and real.startswith(alternative):
            return canonical + real[len(alternative) :]
        if not alternative and not real.startswith(canonical):
            return canonical + real
    return real


def export(model: "Model", links: Sequence[Link], *, what: str = "the target format") -> dict[str, Tensor]:
    """Map ``model``'s ``state_dict`` (and its kept ``checkpoint_extras``) through ``links`` to foreign names.

    Returns:
        ``{foreign name: CPU tensor}``: every tensor produced by a link, then every kept extra not produced by one.

    Raises:
        CheckpointError: a model tensor no link covers (the spec holds components the format cannot store).
    """
    state = model.state_dict()
    shapes = {k: tuple(v.shape) for k, v in state.items()}
    _check_coverage([lk for lk in links if not lk.optional or all(n in state for n in lk.ours)], shapes, what)
    extras = dict(getattr(model, "checkpoint_extras", None) or {})
    out: dict[str, Tensor] = {}
    for link in links:
        if not all(n in state for n in link.ours):
            continue  # an optional link for a tensor the model does not have (a tied head)
        theirs = link.backward([state[n].detach() for n in link.ours], extras)
        for name, t in zip(link.hf, theirs):
            out[name] = t
    for name, t in extras.items():
        out.setdefault(name, t)
    return out

"""Checks of attention as such: ``gqa_equals_mha`` (grouping key/value heads) and ``position_sensitivity``
(the position scheme a layer is given must change what it computes); and ``document_mask`` (each document of a
packed row equals itself alone), which holds for any token mixer that declares it.
"""

from __future__ import annotations

from typing import Optional

import torch

from modkit.core.config import ComponentConfig, is_mixer
from modkit.core.errors import SpecError
from modkit.core.registry import Component
from ...spec import load_component, load_spec, position_geometry
from ..harness import Bench, example_or_none, is_builtin, neighbour_positions
from .base import (
    SAME_MATH_ULPS,
    CheckFailed,
    CheckSkipped,
    first_target,
    fmt,
    layer_of,
    max_abs_diff,
    tolerance,
    transplant,
)


def applies_gqa(entry: Component, config: ComponentConfig) -> Optional[str]:
    """Token mixers (any kind) whose config has ``n_heads`` and ``n_kv_heads`` fields."""
    if not is_mixer(entry.kind):
        return "not a token mixer"
    fields = entry.config.model_fields
    if "n_kv_heads" not in fields or "n_heads" not in fields:
        return "the config has no n_heads / n_kv_heads fields"
    return None


def divisors_below(n: int) -> list[int]:
    return [g for g in range(n - 1, 0, -1) if n % g == 0]


def check_gqa_equals_mha(bench: Bench) -> str:
    """Grouped-query attention equals multi-head attention whose key/value heads are the groups' copies.

    The component is built with ``n_kv_heads = g < n_heads`` and with ``n_kv_heads = n_heads``; every weight of
    the second is taken from the first, with each key/value head repeated ``n_heads / g`` times along the
    projection's output dimension (head-major layout; query head ``h`` reads key/value head ``h // (n_heads/g)``,
    the convention of GQA, Ainslie et al. 2023, torchtune and Hugging Face ``repeat_kv``). The two models must
    give the same logits (plain and left-padded input; tolerance :data:`~.base.SAME_MATH_ULPS` float32 ulps).
    Skipped when the config cannot express both head counts (e.g. an entry fixed to MHA).

    Catches: query heads paired with the wrong key/value head (``h % n_kv_heads`` instead of
    ``h // (n_heads / n_kv_heads)``), a cache or mask that assumes ``n_kv_heads = n_heads``, and a key/value
    projection laid out kv-head-minor. Source: the grouping convention of GQA (Ainslie et al. 2023,
    arXiv:2305.13245) and Hugging Face ``repeat_kv``.
    """
    n_heads, g, grouped_cfg, full = _head_counts(bench)
    rep = n_heads // g
    model_g, rec_g = bench.build(bench.spec_with(attention=grouped_cfg))
    model_f, rec_f = bench.build(bench.spec_with(attention=full))
    for model, recs, want in ((model_g, rec_g, g), (model_f, rec_f, n_heads)):
        att = layer_of(recs, bench.entry.kind, 0)
        got = getattr(att, "n_kv_heads", want)
        if got != want:
            raise CheckFailed(f"built with n_kv_heads = {want}, the module reports n_kv_heads = {got}")
    new, repeated = _repeated_state(model_g.state_dict(), model_f.state_dict(), g, n_heads)
    model_f.load_state_dict(new)
    model_g.eval(), model_f.eval()
    _compare_logits(bench, model_g, model_f, f"n_kv_heads = {g} and n_kv_heads = {n_heads}", repeated)
    return f"n_kv_heads = {g} equals n_kv_heads = {n_heads} with each key/value head repeated {rep}x ({len(repeated)} tensors)"


def _head_counts(bench: Bench) -> tuple[int, int, dict, dict]:
    """``(n_heads, g, grouped, full)``: the query heads of the bench's attention, the first key/value head count
    ``g < n_heads`` its config accepts (its own ``n_kv_heads`` first, then the divisors of ``n_heads``, largest
    first), and the validated configs (JSON) with ``n_kv_heads = g`` and ``n_kv_heads = n_heads``.

    Raises:
        CheckSkipped: fewer than 2 query heads, or the config accepts no such ``g`` or rejects ``n_heads``.
    """
    reg = bench.registry
    cfg = bench.config_json
    n_heads = cfg.get("n_heads")
    if not isinstance(n_heads, int) or n_heads < 2:
        raise CheckSkipped(f"n_heads = {n_heads!r}; grouping needs at least 2 query heads")
    candidates = [cfg["n_kv_heads"]] if isinstance(cfg.get("n_kv_heads"), int) and cfg["n_kv_heads"] < n_heads else []
    candidates += [g for g in divisors_below(n_heads) if g not in candidates]
    grouped = None
    for g in candidates:
        try:
            data = {**cfg, "n_kv_heads": g}
            grouped = (g, load_component(bench.entry.kind, data, registry=reg).model_dump(mode="json"))
            break
        except SpecError:
            continue
    if grouped is None:
        raise CheckSkipped(f"the config accepts no n_kv_heads below n_heads = {n_heads}")
    try:
        full = load_component(bench.entry.kind, {**cfg, "n_kv_heads": n_heads}, registry=reg).model_dump(mode="json")
    except SpecError as exc:
        raise CheckSkipped(
            f"the config rejects n_kv_heads = n_heads = {n_heads} ({exc.errors[0][1] if exc.errors else exc})"
        ) from None
    return n_heads, grouped[0], grouped[1], full


def _repeated_state(
    sd_g: dict[str, torch.Tensor], sd_f: dict[str, torch.Tensor], g: int, n_heads: int
) -> tuple[dict[str, torch.Tensor], list[str]]:
    """The state dict of the ``n_kv_heads = n_heads`` model made from the grouped one's (``g`` key/value heads):
    tensors of equal shape copied, the others with each key/value head (a block of rows) repeated
    ``n_heads / g`` times along dim 0; and the names of the repeated tensors.

    Raises:
        CheckSkipped: the two models' parameter names differ, or a tensor cannot be mapped by repeating heads.
    """
    rep = n_heads // g
    if set(sd_g) != set(sd_f):
        raise CheckSkipped(
            f"parameter names differ between n_kv_heads = {g} and {n_heads}: {sorted(set(sd_g) ^ set(sd_f))[:4]}"
        )
    new, repeated = {}, []
    for k, b in sd_f.items():
        a = sd_g[k]
        if a.shape == b.shape:
            new[k] = a
        elif (
            a.dim() == b.dim()
            and a.dim() >= 1
            and a.shape[1:] == b.shape[1:]
            and b.shape[0] == a.shape[0] * rep
            and a.shape[0] % g == 0
        ):
            new[k] = a.reshape(g, -1, *a.shape[1:]).repeat_interleave(rep, dim=0).reshape(b.shape)
            repeated.append(k)
        else:
            raise CheckSkipped(
                f"cannot map {k} of shape {tuple(a.shape)} onto {tuple(b.shape)} by repeating key/value heads"
            )
    return new, repeated


def _compare_logits(
    bench: Bench, model_g: torch.nn.Module, model_f: torch.nn.Module, what: str, repeated: list[str]
) -> None:
    """Both models' logits on the same ids ``[2, 8]``, plain and with the first row left-padded by 2, must agree
    within :data:`~.base.SAME_MATH_ULPS` float32 ulps.

    Raises:
        CheckFailed: they differ (``what`` names the two head counts; the worst position and the repeated tensors
            are given).
    """
    ids = bench.ids(2, 8, seed=31)
    mask = torch.ones(2, 8, dtype=torch.bool, device=ids.device)
    mask[0, :2] = False
    with torch.no_grad():
        pairs = [
            (model_g(ids).logits, model_f(ids).logits),
            (model_g(ids, attention_mask=mask).logits, model_f(ids, attention_mask=mask).logits),
        ]
    for label, (a, b) in zip(("plain", "left-padded"), pairs):
        tol = tolerance(a, torch.float32, SAME_MATH_ULPS)
        d = max_abs_diff(a, b)
        if d.max().item() > tol:
            pos = int(d.amax(dim=(0, 2)).argmax().item())
            raise CheckFailed(
                f"{what} with repeated key/value weights differ ({label} input): "
                f"max |Δ| = {fmt(d.max().item())} at position {pos} (tolerance {fmt(tol)}); repeated: {repeated}"
            )


#: A position scheme must move the logits by more than this many times the same-math tolerance.
SENSITIVITY = 100


def applies_position_sensitivity(entry: Component, config: ComponentConfig) -> Optional[str]:
    """Token mixers of any kind (skipped when the built mixer declares no position geometry, see
    :func:`_declared_geometry`), and position schemes that act somewhere (``acts_on`` other than ``"none"``)."""
    if is_mixer(entry.kind):
        return None
    if entry.kind == "position":
        acts = entry.capabilities.get("acts_on")
        return None if acts != "none" else "the scheme declares acts_on = 'none'"
    return "applies to token mixers and position schemes"


def _declared_geometry(bench: Bench) -> str:
    """The position geometry the mixer under test declares in the tiny model (``position_geometry(ctx)``, or what
    its fields give: :func:`modkit.spec.position_geometry`), as text.

    Raises:
        CheckSkipped: it declares none (a recurrent mixer: no queries or keys for a scheme to act on).
    """
    _, records = bench.build()
    rec = first_target(bench, records)
    geo = position_geometry(rec.config, rec.ctx, rec.module)
    if geo is None or not (geo.n_heads or geo.head_dim):
        raise CheckSkipped(
            f"the mixer declares no position geometry (position_geometry(ctx) gives {geo!r}): no rotary or bias "
            "scheme acts on it, and modkit validate refuses such a scheme where no other layer's mixer takes it"
        )
    return f"n_heads {geo.n_heads}, head_dim {geo.head_dim}"


def _no_position(bench: Bench) -> tuple[str, dict]:
    """``(type, config)`` of a built-in position scheme with ``acts_on = "none"`` (the 'no position' reference)."""
    for e in bench.registry.components("position"):
        if e.capabilities.get("acts_on") == "none" and is_builtin(e, bench.registry) and e.key != bench.entry.key:
            cfg = example_or_none(e, bench.registry)
            if cfg is not None:
                return e.type, cfg
    raise CheckSkipped("no built-in position scheme with acts_on = 'none' to compare with")


def _effect(bench: Bench, position: dict, reference: dict) -> tuple[float, float]:
    """``(max |Δ| of the logits, tolerance)`` between the tiny model with ``position`` and with ``reference``
    (every other weight equal)."""
    model, _ = bench.build(bench.spec_with(position=position))
    plain, _ = bench.build(bench.spec_with(position=reference))
    transplant(model, plain)
    model.eval(), plain.eval()
    ids = bench.ids(2, 24, seed=91)
    with torch.no_grad():
        a, b = model(ids).logits, plain(ids).logits
    return max_abs_diff(a, b).max().item(), tolerance(b, torch.float32, SAME_MATH_ULPS)


def check_position_sensitivity(bench: Bench) -> str:
    """The position scheme a layer is given changes its output; compared with no position scheme at all.

    For a token mixer of any kind that declares a position geometry (the per-head width a scheme acts on: an
    attention, a recurrent mixer with queries and keys; one that declares none is skipped): the tiny model with
    each neighbour scheme that acts inside the mixer (``acts_on`` ``qk``: rotary, or ``bias``: ALiBi) against the
    same model, same weights, with the built-in scheme that acts nowhere; the logits (24 tokens) must differ by
    more than :data:`SENSITIVITY` times the same-math tolerance. For a position scheme: the tiny model with it
    against the same model without positions (the built-in attention).

    Catches: an attention that never adds the bias it is given (``ignores_bias``: ALiBi has no effect, yet cached
    decoding is self-consistent, so no other check notices) or never calls ``rotate``; a mixer of kind ``mixer``
    that declares a geometry, so validation accepts RoPE and ALiBi for it, and applies neither
    (``ignores_position``, which the kit skipped when this check applied to kind ``attention`` only); a position
    scheme whose hooks are all identities although it declares where it acts.
    """
    none_type, none_cfg = _no_position(bench)
    if bench.entry.kind == "position":
        schemes = [(bench.entry, bench.config_json)]
    else:
        _declared_geometry(bench)
        schemes = [(e, c) for e, c in neighbour_positions(bench) if e.capabilities.get("acts_on") in ("qk", "bias")]
        if not schemes:
            raise CheckSkipped("no neighbour position scheme acts on q/k or as an attention bias")
    results, dead, unusable = [], [], []
    for entry, cfg in schemes:
        try:
            load_spec(bench.spec_with(position=cfg), registry=bench.registry)
        except SpecError as exc:
            unusable.append(f"{entry.type} ({exc.errors[0][1] if exc.errors else exc})")
            continue
        worst, tol = _effect(bench, cfg, none_cfg)
        label = f"{entry.type} (acts_on {entry.capabilities.get('acts_on')})"
        if worst <= SENSITIVITY * tol:
            dead.append(
                f"{label}: max |Δ| = {fmt(worst)} against position {none_type}, at most {SENSITIVITY} x the "
                f"tolerance {fmt(tol)}"
            )
        else:
            results.append(f"{label} moves the logits by {fmt(worst)}")
    if dead:
        what = (
            f"the {bench.entry.kind} declares a position geometry but ignores the position scheme it is given"
            if is_mixer(bench.entry.kind)
            else "the scheme changes nothing"
        )
        raise CheckFailed(f"{what}: " + "; ".join(dead))
    if not results:
        raise CheckSkipped("no position scheme could be combined with it: " + "; ".join(unusable))
    return "; ".join(results) + f" (against position {none_type}, same weights)"


#: Document pieces of the two packed rows of ``document_mask`` (24 tokens each): ``(row, start, end)``. Row 0 holds a
#: document, an empty record (one token), one starting at position 8 (a window boundary of 4 and 8) and one cut by
#: the row's end; row 1 the tail of a document and a document longer than the rest of the row.
DOCUMENT_PIECES = ((0, 0, 7), (0, 7, 8), (0, 8, 19), (0, 19, 24), (1, 0, 5), (1, 5, 24))


def applies_document_mask(entry: Component, config: ComponentConfig) -> Optional[str]:
    """Any token mixer (attention or recurrent, :func:`~modkit.core.config.is_mixer`) that declares the
    ``document_mask`` capability."""
    if not is_mixer(entry.kind):
        return "not a token mixer"
    if not entry.capabilities.get("document_mask"):
        return "the entry does not declare the document_mask capability"
    return None


def check_document_mask(bench: Bench) -> str:
    """Document-masked packing: every document of a packed row gives the logits it gives alone.

    Two rows of 24 tokens with document ids (:data:`DOCUMENT_PIECES`: an empty record, a document starting at a
    window boundary, one cut by the row's end) run through the tiny model with ``documents=``; each piece run alone
    (positions from 0, no other tokens) must give the same logits (tolerance :data:`~.base.SAME_MATH_ULPS` float32
    ulps of the largest logit). Any token mixer that declares the capability is checked, whatever its kind.

    Catches: an attention that declares ``document_mask`` but builds its mask without ``inputs.documents`` (a query
    then sees the earlier documents of its row: ``doc_leak``), or takes a causal fast path (SDPA ``is_causal``) that
    ignores them; a recurrent mixer that carries its state or its convolution window across a document start
    (``state_leak``). Source: the document mask of Llama 3 (Dubey et al. 2024, arXiv:2407.21783, §3.2); for
    recurrent mixers, the per-token sequence index of mamba_ssm (``seq_idx``) and flash-linear-attention's
    ``cu_seqlens``.
    """
    model, _ = bench.build()
    model.eval()
    ids = bench.ids(2, 24, seed=57)
    docs = torch.zeros(2, 24, dtype=torch.long, device=ids.device)
    for n, (row, start, end) in enumerate(DOCUMENT_PIECES):
        docs[row, start:end] = n
    with torch.no_grad():
        packed = model(ids, documents=docs).logits
        worst, where = 0.0, None
        for row, start, end in DOCUMENT_PIECES:
            alone = model(ids[row : row + 1, start:end]).logits[0]
            d = max_abs_diff(packed[row, start:end], alone).max().item()
            tol = tolerance(alone, torch.float32, SAME_MATH_ULPS)
            if d > tol and d > worst:
                worst, where = d, (row, start, end, tol)
    if where is not None:
        row, start, end, tol = where
        raise CheckFailed(
            f"the document at positions {start}..{end - 1} of row {row} gives other logits packed than alone: "
            f"max |Δ| = {fmt(worst)} (tolerance {fmt(tol)}); the mixer lets it see other documents of the row (an "
            "attention's mask without inputs.documents, or a recurrent state or convolution window not restarted at "
            "the document's first token)"
        )
    return f"{len(DOCUMENT_PIECES)} document pieces of 2 packed rows equal the documents run alone"

"""``meta_init``: a real :func:`modkit.build` (``meta`` first, then ``to_empty`` and one ``init_weights``) gives the
same model as constructing it directly, tensor for tensor, and that model runs.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..harness import Bench, qualified_names
from .base import SAME_MATH_ULPS, CheckFailed, fmt, max_abs_diff, nonfinite, tolerance, unique_modules


def _plain_tensors(model: nn.Module, names: dict[int, str]) -> list[str]:
    """``module.attr (device)`` of tensors held as plain attributes (neither parameters nor buffers) on ``meta``."""
    found = []
    for m in model.modules():
        for attr, value in vars(m).items():
            if isinstance(value, Tensor) and value.is_meta:
                found.append(f"{names.get(id(m), '?')}.{attr}")
    return found


def check_meta_init(bench: Bench) -> str:
    """``modkit.build`` (meta, ``to_empty``, ``init_weights``) gives tensors EQUAL to a direct build, and it runs.

    Both use the same seed; every parameter and every buffer (non-persistent ones too, e.g. RoPE tables) is
    compared exactly, then both models run the same 16 tokens and their logits must agree (tolerance
    :data:`~.base.SAME_MATH_ULPS` float32 ulps).

    Catches: a buffer computed only in ``__init__`` (``to_empty`` leaves garbage; transformers #45902, the
    ``stale_table`` fixture); a tensor kept as a plain attribute instead of a buffer (``plain_attr``): ``to_empty``
    never moves it, so the model built by ``modkit.build`` fails its first forward with "Tensor on device meta"
    although every parameter and buffer is right. Source: the model is built on ``meta`` first and every module
    fills its own tensors in ``init_weights``.
    """
    seed = 7
    meta, records = bench.build_meta(seed=seed)
    direct, _ = bench.build(seed=seed)
    ta, tb = _tensors(meta), _tensors(direct)
    if set(ta) != set(tb):
        raise CheckFailed(f"meta and direct builds hold different tensors: {sorted(set(ta) ^ set(tb))[:5]}")
    names = qualified_names(meta)
    own = tuple(names[id(m)] + "." for m in unique_modules(bench.targets(records)) if id(m) in names)
    _compare_tensors(ta, tb, own, seed)
    plain = _plain_tensors(meta, names)
    ids = bench.ids(2, 16, seed=77)
    meta.eval(), direct.eval()
    got, ref = _first_forward(meta, direct, ids, plain)
    if plain:
        raise CheckFailed(
            f"{', '.join(plain[:3])}: tensor attribute(s) left on meta by modkit.build; register them with "
            "register_buffer (to_empty moves buffers, not plain attributes)"
        )
    tol = tolerance(ref, torch.float32, SAME_MATH_ULPS)
    worst = max_abs_diff(got, ref).max().item()
    if worst > tol:
        raise CheckFailed(
            f"the logits of the model built by modkit.build differ from a direct build's: max |Δ| = "
            f"{fmt(worst)} (tolerance {fmt(tol)}, seed {seed})"
        )
    n_buf = sum(1 for k in ta if k.startswith("buffer"))
    return (
        f"{len(ta) - n_buf} parameters and {n_buf} buffers finite and equal to a direct build (seed {seed}); "
        f"its logits equal the direct build's (max |Δ| = {fmt(worst)})"
    )


def _tensors(model: nn.Module) -> dict[str, Tensor]:
    """``{"parameter <name>" | "buffer <name>": tensor}`` of every parameter and buffer (non-persistent ones too)."""
    return {
        **{f"parameter {n}": t for n, t in model.named_parameters()},
        **{f"buffer {n}": t for n, t in model.named_buffers()},
    }


def _compare_tensors(ta: dict[str, Tensor], tb: dict[str, Tensor], own: tuple[str, ...], seed: int) -> None:
    """Every tensor of the meta build (``ta``) must have the shape and dtype of the direct build's (``tb``), be
    finite and be exactly equal.

    Raises:
        CheckFailed: the first three problems, those of the component's own modules (names starting with ``own``)
            first when there are any, with the hint to compute buffers in ``init_weights``.
    """
    problems = []
    for k in sorted(ta):
        a, b = ta[k], tb[k]
        if a.shape != b.shape or a.dtype != b.dtype:
            problems.append(f"{k}: {tuple(a.shape)} {a.dtype} after meta build vs {tuple(b.shape)} {b.dtype} direct")
            continue
        bad = nonfinite(a)
        if bad:
            problems.append(f"{k}: {bad} non-finite value(s) after meta build + init_weights()")
            continue
        if not torch.equal(a, b):
            d = max_abs_diff(a, b).max().item()
            problems.append(
                f"{k}: max |Δ| = {fmt(d)} between meta build + init_weights() and a direct build (seed {seed})"
            )
    if problems:
        mine = [p for p in problems if p.split(": ")[0].split(" ", 1)[1].startswith(own)] or problems
        hint = " (compute buffers in init_weights(init) with init.copy_, not only in __init__; transformers #45902)"
        raise CheckFailed("; ".join(mine[:3]) + (f" (+{len(mine) - 3} more)" if len(mine) > 3 else "") + hint)


def _first_forward(meta: nn.Module, direct: nn.Module, ids: Tensor, plain: list[str]) -> tuple[Tensor, Tensor]:
    """``(logits of meta, logits of direct)`` on ``ids`` ``[batch, seq]`` -> ``[batch, seq, vocab]``, without grad.

    Raises:
        CheckFailed: the meta-built model's forward raises (naming the ``plain`` tensor attributes left on meta).
    """
    with torch.no_grad():
        try:
            got = meta(ids).logits
        except Exception as exc:  # noqa: BLE001 - the model modkit.build returns must run
            hint = (
                (
                    f"; {', '.join(plain[:3])} {'is a tensor' if len(plain) == 1 else 'are tensors'} still on meta: "
                    "register tensors with register_buffer (to_empty moves buffers, not plain attributes)"
                )
                if plain
                else ""
            )
            raise CheckFailed(
                f"the model built by modkit.build (meta, to_empty, init_weights) fails its first forward: "
                f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}{hint}"
            ) from None
        ref = direct(ids).logits
    return got, ref

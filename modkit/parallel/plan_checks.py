"""The checks :func:`modkit.parallel.model_plan` runs on a plan before any collective: degrees dividing the
sharded sizes, the targets of each style, every parameter of a sharding component declared, position schemes
and replicated parameters that would read a shard. Each raises :class:`~modkit.parallel.ParallelError` naming the
module path and the offending values."""

from __future__ import annotations

import math
from typing import Mapping

from torch import nn

from modkit.core.registry import Registry

from .errors import ParallelError
from .styles import _SHARDING


def _join(prefix: str, name: str) -> str:
    """``prefix.name``, or ``name`` at the root (``prefix`` empty)."""
    return f"{prefix}.{name}" if prefix else name


def _entry_name(entry) -> str:
    """``kind/type`` of a registry entry, as messages name a plan's source."""
    return f"{entry.kind}/{entry.type}"


def _check_linear(path: str, module: nn.Module, style: str, tp: int, source: str) -> None:
    """A ``colwise`` / ``rowwise`` / ``colwise_gather`` target is an ``nn.Linear`` (or a ``rowwise``
    ``nn.Embedding``) whose sharded width ``tp`` divides.

    Raises:
        ParallelError: another module type, or ``tp`` not dividing the sharded width.
    """
    if isinstance(module, nn.Embedding) and style == "rowwise":
        dim, size = "num_embeddings", module.num_embeddings
    elif isinstance(module, nn.Linear):
        dim, size = ("in_features", module.in_features) if style == "rowwise" else ("out_features", module.out_features)
    else:
        raise ParallelError(
            f"{path}: plan of {source} asks for {style!r} on a {type(module).__name__}; tensor-parallel styles "
            "apply to nn.Linear (and 'rowwise' to nn.Embedding)"
        )
    if size % tp:
        raise ParallelError(
            f"{path}: tensor-parallel degree tp = {tp} does not divide {dim} = {size} of this {style} "
            f"{type(module).__name__} (plan of {source}); choose a tp that divides {size}"
        )


def _check_grouped(path: str, module: nn.Module, tp: int, source: str) -> bool:
    """Validate a ``grouped`` target; False when it declares ``tp_shard_dims = None`` (to stay replicated)."""
    dims = getattr(module, "tp_shard_dims", "missing")
    if dims is None:
        return False
    own = dict(module.named_parameters(recurse=False))
    if not isinstance(dims, Mapping) or set(dims) != set(own):
        raise ParallelError(
            f"{path}: plan of {source} asks for 'grouped' on a {type(module).__name__}, which must define "
            f"tp_shard_dims {{parameter: dim}} covering exactly its parameters {sorted(own)}; got {dims!r}"
        )
    for name, dim in dims.items():
        size = own[name].shape[dim]
        if size % tp:
            raise ParallelError(
                f"{path}.{name}: tensor-parallel degree tp = {tp} does not divide its dim {dim} (size {size}) "
                f"(plan of {source}); choose a tp that divides {size}"
            )
    return True


def _check_head_param(full: str, module: nn.Module, sub: str, tp: int, source: str) -> None:
    """Validate a ``heads`` item: ``sub`` is a parameter of ``module`` whose dim 0 is its n_heads or n_kv_heads."""
    try:
        prm = module.get_parameter(sub)
    except AttributeError:
        names = [n for n, _ in module.named_parameters()]
        raise ParallelError(
            f"{full}: plan of {source} asks for 'heads' on {sub!r}, which is not a parameter of the "
            f"module; its parameters are {names}"
        ) from None
    heads = {getattr(module, a) for a in ("n_heads", "n_kv_heads") if isinstance(getattr(module, a, None), int)}
    if prm.dim() == 0 or prm.shape[0] not in heads:
        raise ParallelError(
            f"{full} (shape {list(prm.shape)}): plan of {source} asks for 'heads', but its dim 0 is not the module's "
            f"n_heads or n_kv_heads ({sorted(heads) or 'the module exposes neither'})"
        )
    if prm.shape[0] % tp:
        raise ParallelError(f"{full}: tensor-parallel degree tp = {tp} does not divide its {prm.shape[0]} heads")


def _check_heads(path: str, module: nn.Module, tp: int) -> None:
    """``tp`` divides both ``n_heads`` and ``n_kv_heads`` of ``module`` (those it has), so each rank holds whole
    query heads and whole GQA groups.

    Raises:
        ParallelError: naming the counts and the degrees that would divide them.
    """
    heads = {a: getattr(module, a) for a in ("n_heads", "n_kv_heads") if isinstance(getattr(module, a, None), int)}
    bad = {a: v for a, v in heads.items() if v % tp}
    if bad:
        values = ", ".join(f"{a} = {v}" for a, v in heads.items())
        raise ParallelError(
            f"{path}: tensor-parallel degree tp = {tp} does not divide {' and '.join(bad)} ({values}); every rank "
            f"must hold whole query heads and whole key/value heads, so tp must divide both n_heads and n_kv_heads "
            f"(here: one of {_divisors(math.gcd(*heads.values()))})"
        )


def _divisors(n: int) -> list[int]:
    """Every positive divisor of ``n``, ascending."""
    return [d for d in range(1, n + 1) if n % d == 0]


_MISSING = object()


def _attribute(module: nn.Module, dotted: str):
    """``module.a.b`` for ``"a.b"``, or :data:`_MISSING` (``None`` when an optional submodule is absent)."""
    obj = module
    for part in dotted.split("."):
        obj = getattr(obj, part, _MISSING)
        if obj is _MISSING or obj is None:
            return obj
    return obj


def _shards_itself(module: nn.Module, reg: Registry) -> bool:
    """A tagged component whose own plan shards something (its styles prepare its input and output)."""
    if getattr(module, "modkit_type", None) is None:
        return False
    comp_plan = reg.get(module.modkit_kind, module.modkit_type).capabilities.get("tp_plan")
    return isinstance(comp_plan, Mapping) and any(style in _SHARDING for style in comp_plan.values())


def _check_declared(
    path: str, module: nn.Module, source: str, declared: list[str], sharded: list[str], reg: Registry, tp: int
) -> None:
    """Every parameter of a component that shards something is declared by its plan.

    Between a ``colwise`` and a ``rowwise`` module the activations are this rank's shard; a parameter left whole
    on every rank that reads such an activation gets only this rank's part of its gradient (a per-head QK-norm
    weight sees only this rank's heads), and nothing would sum the parts: the ranks' copies drift apart and
    training is silently wrong. Whether a parameter reads a shard cannot be seen from the module's structure, so
    the plan must say it: a sharding style, ``per_head`` (gradient summed over the group) or ``replicate`` (reads
    only replicated activations). Nested components whose own plan shards something answer for themselves.
    """
    answering = [_join(path, sub) for sub, m in module.named_modules() if sub and _shards_itself(m, reg)]
    roots = declared + answering
    for name, prm in module.named_parameters():
        full = _join(path, name)
        if any(full == d or full.startswith(d + ".") for d in roots):
            continue
        child = name.split(".")[0]
        raise ParallelError(
            f"{full} (shape {list(prm.shape)}) is left whole on every tensor-parallel rank by the plan of {source}, "
            f"which shards {', '.join(sharded[:3])}{', ...' if len(sharded) > 3 else ''}; if it reads a sharded "
            f"activation it gets only this rank's part of its gradient (tp = {tp}) and training is silently wrong. "
            f"Declare {child!r} in the tp_plan: 'replicate' if it reads only replicated activations (the component's "
            "input or its all-reduced output), 'per_head' if it acts on this rank's heads (its gradient is summed "
            "over the tensor-parallel group), or a sharding style"
        )


def _check_positions(modules: dict[str, nn.Module], reg: Registry, tp: int) -> None:
    """Position schemes with parameters that act on this rank's heads of q/k are refused (partial gradients)."""
    for path, module in modules.items():
        if getattr(module, "modkit_kind", None) != "position" or getattr(module, "modkit_type", None) is None:
            continue
        entry = reg.get("position", module.modkit_type)
        names = [n for n, _ in module.named_parameters()]
        if entry.capabilities.get("acts_on") == "qk" and names:
            raise ParallelError(
                f"{path} ({_entry_name(entry)}, {entry.provider}) acts on queries and keys and has parameters "
                f"{names[:4]}; under tensor parallelism (tp = {tp}) each rank applies it to its own heads only, so "
                "those parameters would get a partial gradient. Not supported: use FSDP (tp = 1) for this model"
            )


def _check_replicated_consumers(
    path: str, module: nn.Module, sharded: dict[str, nn.Module], styles: dict[str, str], tp: int
) -> None:
    """Reject replicated 1-D parameters as wide as a colwise output (they would normalise/scale a shard)."""
    widths: dict[int, str] = {}
    for p, m in sharded.items():
        if styles[p] == "colwise" and isinstance(m, nn.Linear):
            widths.setdefault(m.out_features, p)
    for sub, child in module.named_modules():
        full = _join(path, sub)
        if not sub or full in sharded or any(full.startswith(s + ".") for s in sharded):
            continue
        for pname, prm in child.named_parameters(recurse=False):
            if prm.dim() == 1 and prm.shape[0] in widths and prm.shape[0] > 1:
                raise ParallelError(
                    f"{full}.{pname} (shape [{prm.shape[0]}]) is replicated but as wide as the full output of "
                    f"colwise {widths[prm.shape[0]]}; under tp = {tp} it would act on a 1/{tp} shard of those "
                    "features (e.g. a QK-norm over the whole projection, qk_norm_scope = 'full'); use a per-head "
                    "variant or tp = 1"
                )

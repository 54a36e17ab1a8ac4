"""``param_roles``: every parameter of the component has a declared role that fits its shape (:mod:`modkit.core.roles`).

Optimizers, weight decay and μP read roles, never names, so a parameter without a declared role trains only on a
guess (training infers the convention and warns); this check runs the same resolution strictly, on the tiny model,
before anyone trains it.
"""

from __future__ import annotations

from collections import Counter

from modkit.core.roles import RoleError, check_shapes, param_roles
from ..harness import Bench, qualified_names
from .base import CheckFailed, CheckSkipped, unique_modules


def check_param_roles(bench: Bench) -> str:
    """Every parameter of the tiny model has a role (:func:`modkit.core.roles.param_roles` raises nothing), and each of the
    component's parameters has the number of dimensions its role implies (``hidden`` 2, ``expert`` 3, ...).

    Catches: an ``nn.Parameter`` of a third-party component with no ``param_roles`` entry (the ``roleless_param``
    fixture; training infers the convention for it and warns, this check refuses it so authors declare it), a
    declaration naming a parameter that does not exist (a typo: the parameter it meant then gets the ``nn.Linear``
    default or none), an unknown role, a stacked ``[n, in, out]`` weight declared ``hidden`` (Muon would
    orthogonalise it as one matrix). Source: optimizers that pick tensors by name (``"bias" in name``, ``p.ndim``)
    silently mistreat new components; here every parameter carries a declared role instead.
    """
    model, records = bench.build_meta(device="meta")
    modules = unique_modules(bench.targets(records))
    names = qualified_names(model)
    mine = {}
    for m in modules:
        prefix = names.get(id(m), "?")
        for n, p in m.named_parameters():
            mine.setdefault(f"{prefix}.{n}" if prefix != "<model>" else n, p)
    if not mine:
        raise CheckSkipped("the component has no parameters")
    try:
        roles = param_roles(model, strict=True)  # no inferred roles here: authors declare them
    except RoleError as exc:
        raise CheckFailed(str(exc)) from None
    own = {n: r for n, r in roles.items() if n in mine}
    shapes = check_shapes(model, own)
    if shapes:
        raise CheckFailed("; ".join(shapes))
    counts = Counter(own.values())
    tied = len(mine) - len(own)
    return (
        f"{len(own)} parameter(s) with roles "
        + ", ".join(f"{r} {n}" for r, n in sorted(counts.items()))
        + (f" ({tied} shared with another module)" if tied else "")
    )

"""Checks of what an entry declares about itself: its config survives JSON, its ``param_count`` is exact.

* ``spec_roundtrip``: a spec holding the component, and the config alone, round-trip through JSON.
* ``param_count``: the declared analytic parameter count equals the built module's.
"""

from __future__ import annotations

from typing import Optional

from modkit.core.config import ComponentConfig
from modkit.core.registry import Component
from ...spec import load_component, load_spec
from ..harness import Bench
from .base import CheckFailed


def check_spec_roundtrip(bench: Bench) -> str:
    """A spec holding the component survives JSON: ``load_spec(spec.to_json()) == spec``; so does the config alone.

    Catches: a config that serialises to something it cannot read back (a tuple, a non-JSON float, an alias, a
    field excluded from the dump), which breaks saved specs, checkpoints and ``modkit convert``; and a config whose
    JSON Schema does not generate (editors and the docs use it). Source: a spec file is JSON that reads back into
    the very configs it was written from.
    """
    reg = bench.registry
    text = ""
    if isinstance(bench, Bench):  # a sampling step lives in a sampling list, not in a model spec
        spec = load_spec(bench.spec, registry=reg)
        text = spec.to_json()
        again = load_spec(text, registry=reg)
        if again != spec:
            a, b = spec.to_dict(), again.to_dict()
            diffs = [k for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
            raise CheckFailed(f"load_spec(spec.to_json()) != spec; differing keys: {diffs}")
    data = bench.config.model_dump(mode="json")
    cfg = load_component(bench.entry.kind, data, registry=reg)
    if cfg != bench.config:
        raise CheckFailed(f"config {data} does not round-trip: re-validated as {cfg.model_dump(mode='json')}")
    try:
        bench.entry.config.model_json_schema()
    except Exception as exc:  # noqa: BLE001
        raise CheckFailed(
            f"{bench.entry.config.__name__}.model_json_schema() failed: {type(exc).__name__}: {exc}"
        ) from None
    if not text:
        return f"config {data} round-trips"
    return f"spec ({len(text)} chars of JSON) and config {data} round-trip"


def applies_param_count(entry: Component, config: ComponentConfig) -> Optional[str]:
    """``param_count`` runs for entries that declare one."""
    return None if entry.param_count is not None else "the entry declares no param_count"


def check_param_count(bench: Bench) -> str:
    """The declared analytic ``param_count(config, ctx)`` equals the parameters the factory's module holds.

    Evaluated with the exact :class:`~modkit.BuildContext` the factory got inside the tiny model (built on
    ``meta``), for every distinct instance (a norm at ``d_model`` and, nested, at ``head_dim``).

    Catches: a count that forgets a parameter or a bias (the kit's ``miscounted`` fixture declares one too many);
    ``modkit.count_params``, ``modkit build`` and the docs trust the declared number. Source: every registry entry
    carries its analytic parameter count (as OLMo-core's do).
    """
    _, records = bench.build_meta(device="meta")
    targets = bench.targets(records)
    if not targets:
        raise CheckFailed(f"the tiny model holds no module built by {bench.name}'s factory")
    checked = []
    seen_ctx = set()
    for r in targets:
        key = (r.ctx.dim, r.ctx.n_heads, r.ctx.head_dim, repr(sorted(r.ctx.extra.items())))
        if key in seen_ctx:
            continue
        seen_ctx.add(key)
        declared = int(bench.entry.param_count(r.config, r.ctx))
        actual = sum(p.numel() for p in r.module.parameters())
        where = f"dim = {r.ctx.dim or r.ctx.d_model}" + (f", extra = {dict(r.ctx.extra)}" if r.ctx.extra else "")
        if declared != actual:
            raise CheckFailed(
                f"declared {declared:,} parameters, the module holds {actual:,} (difference {declared - actual:+,}; {where})"
            )
        checked.append(f"{actual:,} ({where})")
    return "declared = actual: " + "; ".join(checked)

"""Every float of a spec is bounded, and the count of overrides is too.

Before: 14 float fields had no upper bound (``init_std``, ``logit_scale``, MLA ``yarn_mscale``,
``routed_scaling_factor``, mamba2 ``dt_init_max``, ``aux_loss_coef``...) and two no useful lower bound (rope
``theta: 1e-300``, ``logit_softcap: 1e-300``): such specs validated and the first sign was a NaN at ``generate``;
mamba2 ``expand: 1e300`` validated and the build raised a raw torch error; a spec with 20,000 overrides took 100 s
to validate.
"""

from __future__ import annotations

import json
import math
import typing

import pytest
from annotated_types import Ge, Gt, Le, Lt
from pydantic import BaseModel

import modkit
from conftest import SPECS, tiny_spec
from modkit import SpecError
from modkit.core.limits import MAX_OVERRIDES
from modkit.spec.models import ModelSpec

#: float fields allowed to go without a finite bound on both sides, with the reason
UNBOUNDED: dict[str, str] = {
    "spec.metadata": "free-form provenance (numbers among strings and booleans); never reaches the model",
}


def _float_leaves(annotation, bounds=()) -> list[tuple]:
    """The bounds (annotated-types constraints) on each float an annotation holds (through Optional, Union, list,
    Annotated), one tuple of constraints per float."""
    origin = typing.get_origin(annotation)
    if annotation is float:
        return [tuple(bounds)]
    if origin is typing.Annotated:
        inner, *meta = typing.get_args(annotation)
        extra = [m for m in meta if isinstance(m, (Gt, Ge, Lt, Le))]
        extra += [c for m in meta for c in getattr(m, "metadata", ()) if isinstance(c, (Gt, Ge, Lt, Le))]
        return _float_leaves(inner, (*bounds, *extra))
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return []
    return [leaf for arg in typing.get_args(annotation) for leaf in _float_leaves(arg, bounds)]


def _models(annotation) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _models(arg)]


def _float_fields() -> dict[str, list[tuple]]:
    """``{"kind/type.field" or "spec.field": [constraints per float]}`` over the spec and every registered
    component config, nested option models (RoPE scaling, YaRN mscale, temperature tuning) included."""
    out: dict[str, list[tuple]] = {}
    seen: set = set()

    def walk(model: type[BaseModel], name: str) -> None:
        if model in seen:
            return
        seen.add(model)
        for field, info in model.model_fields.items():
            leaves = _float_leaves(info.annotation, [m for m in info.metadata if isinstance(m, (Gt, Ge, Lt, Le))])
            if leaves:
                out.setdefault(f"{name}.{field}", []).extend(leaves)
            for sub in _models(info.annotation):
                walk(sub, f"{name}.{field}")

    for entry in modkit.get_registry().components():
        walk(entry.config, f"{entry.kind}/{entry.type}")
    walk(ModelSpec, "spec")
    return out


def _finite_bounds(constraints: tuple) -> tuple[float, float]:
    low = [getattr(c, "gt", getattr(c, "ge", None)) for c in constraints if isinstance(c, (Gt, Ge))]
    high = [getattr(c, "lt", getattr(c, "le", None)) for c in constraints if isinstance(c, (Lt, Le))]
    return (max(low) if low else -math.inf, min(high) if high else math.inf)


def test_every_float_field_of_the_spec_and_of_every_component_has_finite_bounds():
    fields = _float_fields()
    assert "spec.init_std" in fields and "mixer/mamba2.expand" in fields and "position/rope.theta" in fields
    assert len(fields) > 50  # the walk reaches the nested models too
    unbounded = {
        name: _finite_bounds(c)
        for name, leaves in fields.items()
        for c in leaves
        if not all(math.isfinite(b) for b in _finite_bounds(c)) and name not in UNBOUNDED
    }
    assert unbounded == {}


def _spec(name: str) -> dict:
    return json.loads((SPECS / f"{name}.json").read_text())


def _errors(data: dict) -> list[tuple[str, str]]:
    with pytest.raises(SpecError) as info:
        modkit.load_spec(data)
    return info.value.errors


def _set(data: dict, path: str, value) -> dict:
    node = data
    *parents, last = path.split(".")
    for key in parents:
        node = node.setdefault(key, {})
    node[last] = value
    return data


#: (base spec, path, value, the message's bound clause): the values that validated before and made a NaN model
CASES = [
    ("tiny-llama", "init_std", 1e300, "less than or equal to 1 (got 1e+300)"),
    ("tiny-llama", "logit_scale", 1e300, "less than or equal to 1000 (got 1e+300)"),
    ("tiny-llama", "final_logit_softcap", 1e-300, "greater than or equal to 0.01 (got 1e-300)"),
    ("tiny-llama", "embedding_scale", 1e300, "less than or equal to 1000 (got 1e+300)"),
    ("tiny-llama", "position.theta", 1e-300, "greater than or equal to 1 (got 1e-300)"),
    ("tiny-llama", "block.attention.logit_softcap", 1e-300, "greater than or equal to 0.01 (got 1e-300)"),
    ("tiny-llama", "block.attention.softmax_scale", 1e300, "less than or equal to 1000 (got 1e+300)"),
    ("tiny-llama", "block.attention.softmax_scale", 1e-300, "greater than or equal to 0.0001 (got 1e-300)"),
    ("tiny-mla", "block.attention.softmax_scale", 1e-300, "greater than or equal to 0.0001 (got 1e-300)"),
    ("tiny-llama", "block.norm.eps", 1e-300, "greater than or equal to 1e-30 (got 1e-300)"),
    ("tiny-mla", "block.attention.yarn_mscale", {"factor": 1e308, "mscale_all_dim": 1.0}, "(got 1e+308)"),
    ("tiny-deepseek-moe", "block.ffn.router.routed_scaling_factor", 1e300, "less than or equal to 1000"),
    ("tiny-deepseek-moe", "block.ffn.aux_loss_coef", 1e300, "less than or equal to 100 (got 1e+300)"),
    ("tiny-mamba2", "block.mixer.dt_init_max", 1e300, "less than or equal to 10 (got 1e+300)"),
    ("tiny-mamba2", "block.mixer.dt_init_floor", 1e300, "less than or equal to 10 (got 1e+300)"),
    ("tiny-mamba2", "block.mixer.expand", 1e300, "less than or equal to 64 (got 1e+300)"),
]


@pytest.mark.parametrize("base, path, value, clause", CASES, ids=[c[1] for c in CASES])
def test_a_float_past_its_bound_is_a_field_error_naming_the_value_and_the_bound(base, path, value, clause):
    errors = _errors(_set(_spec(base), path, value))
    where = path + (".factor" if isinstance(value, dict) else "")
    assert [p for p, _ in errors] == [where]
    assert clause in errors[0][1]


def test_a_float_error_says_why_the_bound_is_there():
    (path, message), *_ = _errors(_set(_spec("tiny-llama"), "init_std", 1e300))
    assert (path, message) == (
        "init_std",
        "Input should be less than or equal to 1 (got 1e+300); modkit bounds init_std so that the model stays "
        "finite (modkit.core.limits): published models use 0.006-0.02",
    )


def test_mamba2_expand_1e300_is_a_field_error_not_a_torch_error_at_build():
    data = _set(_spec("tiny-mamba2"), "block.mixer.expand", 1e300)
    with pytest.raises(SpecError) as info:
        modkit.build(data, device="meta")
    assert info.value.errors[0][0] == "block.mixer.expand"


def test_the_published_specs_stay_within_the_bounds():
    for path in sorted(SPECS.glob("*.json")):
        modkit.load_spec(path)


def _override(i: int) -> dict:
    return {"layers": [i % 2], "ffn": {"type": "mlp", "d_ff": 8}}


def test_more_overrides_than_the_bound_is_one_error_naming_the_count_and_the_bound():
    errors = _errors(tiny_spec(overrides=[_override(i) for i in range(20_000)]))
    assert errors == [
        (
            "overrides",
            f"20,000 overrides exceed modkit's bound of {MAX_OVERRIDES:,} (modkit.core.limits: twice the 512-layer "
            "bound, far above one override per layer of any published model); give one override a list of layers or "
            "a range {start, stop, step} for layers that take the same replacement",
        )
    ]


def test_overrides_up_to_the_bound_validate():
    spec = modkit.load_spec(tiny_spec(overrides=[_override(i) for i in range(MAX_OVERRIDES)]))
    assert len(spec.overrides) == MAX_OVERRIDES == 1024

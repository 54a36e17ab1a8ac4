"""Parameter counts of a component built on ``meta`` on its own (or inside a host component), and the exact
quadratic ``P(d_model)`` recovered from counts at several widths."""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Mapping, Optional

from .markdown import _count, component_path


#: Model-wide sizes a component is built at for the parameter figures on its page.
EXAMPLE_CONTEXT = {"d_model": 256, "n_heads": 4, "n_layers": 2, "vocab_size": 32000, "max_seq_len": 2048}


#: ``d_model`` values the parameter count is evaluated at to recover it as a polynomial in ``d_model``.
FIT_D_MODELS = (64, 128, 256, 512, 1024)


def _stub(kind: str):
    from torch import nn

    class Stub(nn.Module):
        """A parameter-free stand-in sublayer (identity) for building a placement on its own."""

        def forward(self, x, *args, **kwargs):  # noqa: D102
            return x

    s = Stub()
    s.modkit_kind = kind
    s.modkit_type = kind
    return s


def _context(registry, d_model: int, norm_config: Any = None, **changes: Any):
    from modkit.core.interfaces import BuildContext

    sizes = dict(EXAMPLE_CONTEXT)
    n_heads = sizes.pop("n_heads")
    sizes["d_model"] = d_model
    return BuildContext(
        registry=registry,
        layer_index=0,
        n_heads=n_heads,
        head_dim=d_model // n_heads,
        attention=_stub("attention"),
        ffn=_stub("ffn"),
        norm=norm_config,
        **sizes,
        **changes,
    )


def _default_norm(registry):
    """A validated config of the first registered norm (placements need one to build their norms)."""
    from ..spec import load_component

    for entry in registry.components("norm"):
        try:
            return load_component("norm", entry.example_config(), registry=registry)
        except Exception:  # noqa: BLE001 - try the next norm
            continue
    return None


def _params(module) -> int:
    seen, total = set(), 0
    for p in module.parameters():
        if id(p) not in seen:
            seen.add(id(p))
            total += p.numel()
    return total


def _tagged_params(module, kind: str, type_: str) -> int:
    seen, total = set(), 0
    for m in module.modules():
        if getattr(m, "modkit_kind", None) == kind and getattr(m, "modkit_type", None) == type_:
            for p in m.parameters():
                if id(p) not in seen:
                    seen.add(id(p))
                    total += p.numel()
    return total


@dataclass
class ParamInfo:
    """Parameter count of a component at the example sizes, and as a polynomial in ``d_model`` if it is one."""

    count: Optional[int] = None
    counts: Optional[dict[int, int]] = None
    coefficients: Optional[tuple[Fraction, Fraction, Fraction]] = None
    how: str = ""
    norms: Optional[int] = None
    declared: Optional[int] = None
    error: str = ""


def _build_alone(entry, config, registry, d_model: int, norm_config):
    """Build ``config`` on meta on its own, or nested in a host component when it needs one (a router)."""
    import torch

    from modkit.core.config import slot_kind
    from ..spec import load_component

    ctx = _context(registry, d_model, norm_config)
    try:
        with torch.device("meta"):
            return ctx.build(config), "alone", ctx
    except Exception as direct_exc:  # noqa: BLE001 - retry inside a host
        example = config.model_dump(mode="json")
        for host in registry.components():
            fields = [n for n, f in host.config.model_fields.items() if slot_kind(f) == entry.kind]
            if not fields or host.key == entry.key:
                continue
            data = host.example_config()
            data[fields[0]] = example
            try:
                hcfg = load_component(host.kind, data, registry=registry)
                with torch.device("meta"):
                    return (
                        ctx.build(hcfg),
                        f"inside [`{host.type}`]({{to:{component_path(host.kind, host.type)}}})",
                        None,
                    )
            except Exception:  # noqa: BLE001 - try the next host
                continue
        raise direct_exc


def param_info(entry, config, registry) -> ParamInfo:
    """Count ``entry``'s parameters (built on meta) at :data:`FIT_D_MODELS`; fit ``a·d² + b·d + c`` exactly.

    Sampling steps (logits processors, stop conditions) are not part of a model: 0, ``how = "sampling"``."""
    from modkit.inference.sampling import KINDS as SAMPLING_KINDS

    if entry.kind in SAMPLING_KINDS:
        return ParamInfo(count=0, how="sampling")
    from ..train.optim import KIND as OPTIMIZER_KIND

    if entry.kind == OPTIMIZER_KIND:
        return ParamInfo(count=0, how="optimizer")
    from ..train.trackers import KIND as TRACKER_KIND

    if entry.kind == TRACKER_KIND:
        return ParamInfo(count=0, how="tracker")
    norm_config = _default_norm(registry)
    info = ParamInfo()
    counts: dict[int, int] = {}
    for d in FIT_D_MODELS:
        try:
            module, how, ctx = _build_alone(entry, config, registry, d, norm_config)
        except Exception as exc:  # noqa: BLE001 - reported on the page
            if d == EXAMPLE_CONTEXT["d_model"]:
                info.error = f"{type(exc).__name__}: {exc}"
            continue
        n = _tagged_params(module, entry.kind, entry.type)
        counts[d] = n
        if d == EXAMPLE_CONTEXT["d_model"]:
            info.count, info.how = n, how
            if entry.kind == "placement":
                info.norms = sum(1 for m in module.modules() if getattr(m, "modkit_kind", None) == "norm")
            if entry.param_count is not None and ctx is not None:
                try:
                    info.declared = int(entry.param_count(config, ctx))
                except Exception:  # noqa: BLE001 - the contract kit reports this properly
                    info.declared = None
    info.counts = counts
    if len(counts) >= 4:
        info.coefficients = fit_quadratic(counts)
    return info


def fit_quadratic(points: Mapping[int, int]) -> Optional[tuple[Fraction, Fraction, Fraction]]:
    """``(c0, c1, c2)`` with ``c0 + c1·d + c2·d² = points[d]`` for every point, or ``None`` if there is none."""
    ds = sorted(points)
    if len(ds) < 3:
        return None
    d0, d1, d2 = ds[:3]
    y0, y1, y2 = (Fraction(points[d]) for d in (d0, d1, d2))
    f01 = (y1 - y0) / (d1 - d0)
    f12 = (y2 - y1) / (d2 - d1)
    f012 = (f12 - f01) / (d2 - d0)
    c2 = f012
    c1 = f01 - f012 * (d0 + d1)
    c0 = y0 - f01 * d0 + f012 * d0 * d1
    if all(c0 + c1 * d + c2 * d * d == points[d] for d in ds):
        return (c0, c1, c2)
    return None


def _coef(c: Fraction) -> str:
    if c.denominator == 1:
        return _count(int(c))
    f = float(c)
    return f"{f:g}" if Fraction(f"{f:g}") == c else f"{c.numerator}/{c.denominator}"


def formula(coefficients: tuple[Fraction, Fraction, Fraction], var: str = "d") -> str:
    """``c2·d² + c1·d + c0`` with zero terms dropped."""
    c0, c1, c2 = coefficients
    terms = []
    for c, power in ((c2, f"{var}²"), (c1, var), (c0, "")):
        if c == 0:
            continue
        mag = _coef(abs(c))
        body = (power if mag == "1" else f"{mag}·{power}") if power else mag
        terms.append(("- " if c < 0 else "+ ") + body)
    if not terms:
        return "0"
    text = " ".join(terms)
    return text[2:] if text.startswith("+ ") else "-" + text[2:]

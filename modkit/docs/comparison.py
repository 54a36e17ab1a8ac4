"""The *Comparison* table of a kind's index page: every component of the kind built alone on ``meta`` with its
example config at the same stated sizes, measured with the project's own accounting: parameters and active
parameters (:mod:`modkit.nn.build`), KV-cache bytes per token (:func:`modkit.kv_cache_bytes_per_token`) and the FLOPs
its cost declaration gives for one decoded token (:mod:`modkit.analysis.cost`). Nothing is hard-coded per component."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence

from .markdown import _cell, component_path, _count, _rel, _table
from .params import EXAMPLE_CONTEXT, formula

#: Context (tokens) of the decode FLOPs column: one new token attending to this many keys.
COMPARE_CONTEXT = 2048

#: dtype of the KV-cache column.
COMPARE_DTYPE = "bfloat16"


@dataclass
class Figures:
    """What the comparison table shows for one component (``None``: does not apply or could not be measured)."""

    params: Optional[int] = None
    active: Optional[int] = None
    kv_bytes: Optional[int] = None
    decode_flops: Optional[int] = None
    norms: Optional[int] = None


def component_figures(entry, config, registry, norm_config: Any = None) -> Figures:
    """Build ``config`` alone on meta at :data:`~modkit.docs.params.EXAMPLE_CONTEXT` and measure it.

    A component that needs a host (a router) is built inside one; its parameters are then its own tagged ones and
    the host-dependent figures are left out.
    """
    from modkit.nn.build import active_params_per_token, kv_cache_bytes_per_token
    from modkit.analysis.cost import declared_flops, Workload
    from .params import _build_alone, _default_norm, _tagged_params

    norm_config = norm_config if norm_config is not None else _default_norm(registry)
    try:
        module, how, ctx = _build_alone(entry, config, registry, EXAMPLE_CONTEXT["d_model"], norm_config)
    except Exception:  # noqa: BLE001 - the page's parameter section reports why
        return Figures()
    fig = Figures(params=_tagged_params(module, entry.kind, entry.type))
    if how != "alone":
        return fig
    fig.active = active_params_per_token(module)
    # what the component's token mixers declare (cache_spec()); the stand-in sublayers a placement is built with
    # declare nothing of their own: no figure
    fig.kv_bytes = None if entry.kind == "placement" else kv_cache_bytes_per_token(module, COMPARE_DTYPE)
    if entry.kind == "placement":
        fig.norms = sum(1 for m in module.modules() if getattr(m, "modkit_kind", None) == "norm")
    if entry.flops is not None and ctx is not None:
        try:
            fig.decode_flops = sum(
                declared_flops(entry, config, ctx, Workload(new=1, past=COMPARE_CONTEXT - 1)).values()
            )
        except Exception:  # noqa: BLE001 - a declaration that fails here is the contract kit's to report
            fig.decode_flops = None
    return fig


def _example_text(example: dict) -> str:
    """The example's fields besides ``type``: scalars as ``k=v``, a nested component by its type."""
    bits = []
    for k, v in example.items():
        if k == "type":
            continue
        if isinstance(v, dict):
            bits.append(f"{k}={v.get('type', '…')}")
        elif isinstance(v, (list, tuple)):
            bits.append(f"{k}=[…]")
        else:
            bits.append(f"{k}={v}")
    return f"`{', '.join(bits)}`" if bits else "(defaults)"


def comparison_section(kind: str, docs: Sequence[Any], page: str) -> str:
    """Markdown of a kind's *Comparison* section, or ``""`` for kinds outside a model (sampling steps)."""
    from modkit.inference.sampling import KINDS as SAMPLING_KINDS

    mine = [d for d in docs if d.entry.kind == kind and d.figures is not None]
    if kind in SAMPLING_KINDS or not mine:
        return ""
    ctx = EXAMPLE_CONTEXT
    cols = [
        ("type", lambda d: f"[`{d.entry.type}`]({_rel(page, component_path(kind, d.entry.type))})"),
        ("example config", lambda d: _cell(_example_text(d.example))),
        (f"parameters at d_model {ctx['d_model']}", lambda d: _num(d.figures.params)),
        ("P(d)", lambda d: f"`{formula(d.params.coefficients)}`" if d.params.coefficients is not None else "–"),
    ]
    if any(d.figures.active is not None and d.figures.active != d.figures.params for d in mine):
        cols.append(("active per token", lambda d: _num(d.figures.active)))
    if any(d.figures.kv_bytes for d in mine):
        cols.append(("KV cache bytes / token (bf16)", lambda d: _num(d.figures.kv_bytes)))
    if any(d.figures.norms is not None for d in mine):
        cols.append(("norms per block", lambda d: _num(d.figures.norms)))
    if any(d.figures.decode_flops for d in mine):
        cols.append(
            (f"FLOPs / decoded token at context {_count(COMPARE_CONTEXT)}", lambda d: _num(d.figures.decode_flops))
        )
    rows = [[fn(d) for _, fn in cols] for d in mine]
    intro = (
        f"Each `{kind}` built alone on `meta` with its example config at d_model = {ctx['d_model']}, n_heads = "
        f"{ctx['n_heads']} (head_dim {ctx['d_model'] // ctx['n_heads']}), max_seq_len {_count(ctx['max_seq_len'])}: "
        "parameters counted on the built module (P(d): the same count as a polynomial in d_model, the example's other "
        "fields fixed)"
    )
    notes = []
    if any(c[0].startswith("active") for c in cols):
        notes.append(
            "active parameters as `modkit.active_params_per_token` counts them (a sparse layer runs only the experts it routes to)"
        )
    if any(c[0].startswith("KV") for c in cols):
        notes.append("KV-cache bytes per token and layer as `modkit.kv_cache_bytes_per_token` computes them")
    if any(c[0].startswith("FLOPs") for c in cols):
        notes.append(
            f"FLOPs from the component's cost declaration (`modkit.analysis.cost`: matrix products, 1 multiply-add = 2 "
            f"FLOPs) for one decoded token with {_count(COMPARE_CONTEXT)} tokens of context (only attention "
            "depends on the context)"
        )
    text = intro + ("; " + "; ".join(notes) if notes else "") + "."
    align = "ll" + "r" * (len(cols) - 2)
    return "\n".join(["## Comparison", "", text, "", _table([c[0] for c in cols], rows, align)])


def _num(n: Optional[int]) -> str:
    return "–" if n is None else _count(n)

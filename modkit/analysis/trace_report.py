"""Views of a :class:`~modkit.analysis.trace.Trace`: rich tables for the terminal and a self-contained HTML report.

The HTML file needs nothing but a browser: the plots are matplotlib PNGs embedded as base64 ``data:`` URLs, the
style is inline, and there is no script and no external link (no CDN, no network). It holds the shape table, the
per-layer table and curves (residual norm, relative update, cosine with the previous layer, FFN sparsity), the
attention entropy per layer and head, the attention heatmaps per head of every layer, the position-encoding
heatmaps and the logit lens.
"""

from __future__ import annotations

import base64
import html
import io
import math
from pathlib import Path
from typing import Optional, Union

from modkit.analysis.trace import Stage, Trace

# ------------------------------------------------------------------------------------------------ shared text


def token_display(text: str) -> str:
    """A token's text with control characters escaped, quoted: ``'\\n'``, ``' the'``."""
    return "'" + text.encode("unicode_escape").decode("ascii").replace("'", "\\'") + "'"


def _shape(shape: tuple[int, ...]) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


def _num(x: Optional[float], digits: int = 3) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    return f"{x:.{digits}f}"


def _header_lines(t: Trace) -> list[str]:
    dims = " · ".join(f"{k} {v:,}" for k, v in t.dims.items())
    toks = " ".join(token_display(s) for s in t.tokens)
    tokenizer = [f"tokenizer: {t.tokenizer}"] if t.tokenizer else []
    return [
        f"weights: {t.weights}",
        *tokenizer,
        dims,
        f"tokens ({len(t.ids)}): {toks}",
        f"ids: {', '.join(map(str, t.ids))}",
    ]


def _lens_text(layer) -> str:
    return "  ".join(f"{token_display(text)} {100 * p:.1f}%" for _, text, p in layer.top_tokens)


# ------------------------------------------------------------------------------------------------ terminal


def print_trace(t: Trace, console=None) -> None:
    """Print ``t`` as rich tables: the header, the stages with their shapes, per-layer statistics, what is missing.

    Args:
        t: the trace.
        console: a ``rich.console.Console``; default one on stdout (120 columns when stdout is not a terminal).
    """
    import sys

    from rich.console import Console
    from rich.text import Text

    if console is None:
        console = Console(width=None if sys.stdout.isatty() else 120, highlight=False)
    console.print(Text(f"modkit trace: {t.name}", style="bold"))
    for line in _header_lines(t):
        console.print(Text(line))
    console.print(_stages_table(t))
    if t.has_stats:
        console.print(_layers_table(t))
    else:
        console.print(
            Text(
                "no statistics: the model has no weights here (meta device); trace a checkpoint, or a spec "
                "with --random-init for an untrained model",
                style="italic",
            )
        )
    if t.unavailable:
        console.print(Text("not exposed by the components:", style="bold"))
        for name, why in t.unavailable.items():
            console.print(Text(f"  {name}: {why}"))


def _stages_table(t: Trace):
    """The rich table of every stage with its shape: before the blocks, one section per group, after them."""
    from rich.table import Table
    from rich.text import Text

    table = Table(title="The tokens' journey: shape after every stage", title_justify="left", show_lines=False)
    table.add_column("stage")
    longest = max(len(st.name) for st in t.stages())
    table.add_column("name", style="dim", no_wrap=True, min_width=longest, overflow="fold")
    table.add_column("shape", justify="right", no_wrap=True)
    table.add_column("reading")

    def rows(stages: list[Stage]) -> None:
        for s in stages:
            table.add_row(Text(s.label), Text(s.name), Text(_shape(s.shape)), Text(s.note))

    rows(t.before)
    for g in t.groups:
        table.add_section()
        table.add_row(
            Text(g.title, style="bold"),
            Text(f"layers.{g.layers[0]}" + ("" if len(g.layers) == 1 else " (first of the group)"), style="dim"),
            "",
            "",
        )
        rows(g.stages)
    table.add_section()
    rows(t.after)
    return table


def _layers_table(t: Trace):
    """The rich table of the per-layer statistics (a trace with statistics)."""
    from rich.table import Table
    from rich.text import Text

    layers = Table(title="Per layer (h: block output, h_prev: its input)", title_justify="left")
    moe = has_expert_loads(t)
    for name, justify in (
        ("layer", "right"),
        ("‖h‖", "right"),
        ("‖Δh‖/‖h_prev‖", "right"),
        ("cos(h, h_prev)", "right"),
        ("FFN zeros", "right"),
        ("FFN near 0", "right"),
        *([("expert load max/mean", "left")] if moe else []),
        ("attention entropy per head (nats)", "left"),
        ("logit lens: next token read from h", "left"),
    ):
        layers.add_column(name, justify=justify)
    for s in t.layers:
        ent = " ".join(f"{e:.2f}" for e in s.attention_entropy) if s.attention_entropy is not None else "n/a"
        layers.add_row(
            str(s.index),
            _num(s.residual_norm),
            _num(s.update_ratio),
            _num(s.cosine_prev),
            _num(s.ffn_sparsity),
            _num(s.ffn_near_zero),
            *([Text(load_text(s))] if moe else []),
            Text(ent),
            Text(_lens_text(s)),
        )
    return layers


def has_expert_loads(t: Trace) -> bool:
    """Whether any layer of the trace has a router that reported expert loads."""
    return any(s.expert_load is not None for s in t.layers)


def load_text(s) -> str:
    """``1.33 (2..6 of 8 assignments over 4 experts)``: a layer's load imbalance and its counts; ``-`` without a router."""
    if s.expert_load is None:
        return "-"
    imb = "n/a" if s.load_imbalance is None else f"{s.load_imbalance:.2f}"
    return f"{imb} ({min(s.expert_load)}..{max(s.expert_load)} of {sum(s.expert_load)} assignments over {len(s.expert_load)} experts)"


# ------------------------------------------------------------------------------------------------ figures


def _png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _img(data: str, alt: str) -> str:
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{data}">'


def layer_curves_png(t: Trace) -> str:
    """Base64 PNG of the per-layer curves (2 x 2 panels)."""
    from matplotlib.figure import Figure

    xs = [s.index for s in t.layers]

    def series(values):
        return [math.nan if v is None else v for v in values]

    panels = [
        ("residual-stream norm ‖h_i‖", [(None, [s.residual_norm for s in t.layers])]),
        ("relative update ‖h_i - h_{i-1}‖ / ‖h_{i-1}‖", [(None, [s.update_ratio for s in t.layers])]),
        ("cosine(h_i, h_{i-1})", [(None, [s.cosine_prev for s in t.layers])]),
        (
            "FFN activation sparsity",
            [
                ("exact zeros", series(s.ffn_sparsity for s in t.layers)),
                ("|a| < 0.1 rms", series(s.ffn_near_zero for s in t.layers)),
            ],
        ),
    ]
    fig = Figure(figsize=(FIGURE_WIDTH, 7))
    axes = fig.subplots(2, 2)
    for ax, (title, lines) in zip(axes.flat, panels):
        for label, ys in lines:
            ax.plot(xs, ys, "o-", ms=4, label=label)
        ax.set_title(title, fontsize=11)
        ax.set_xlabel("layer", fontsize=10)
        ax.tick_params(labelsize=9)
        ax.grid(alpha=0.3)
        if len(xs) <= 40:
            ax.set_xticks(xs)
        if title.startswith("FFN"):
            ax.set_ylim(-0.02, 1.02)
            ax.legend(fontsize=9)
    fig.tight_layout()
    return _png(fig)


#: Smallest font of any text in a figure (points). Figures are drawn at 100 dpi and shown at most 1,168 px wide
#: (the report's column), so each one keeps its width within :data:`FIGURE_WIDTH` inches and every label is at
#: least 11 px on screen.
MIN_FONT = 8
#: Width of the report's figures, inches (at 100 dpi: the report's 1,168 px column, never scaled down).
FIGURE_WIDTH = 11.5


def uniform_entropy(weights) -> float:
    """Mean over queries of ``ln(keys the query sees)`` for probabilities ``[heads, q, k]``: the entropy of
    uniform attention under the same mask (a causal query ``i`` sees ``i + 1`` keys), the top of the entropy
    colour scale. Keys masked out have probability exactly 0."""
    import torch

    seen = (weights[0] > 0).sum(-1).clamp_min(1).float()  # [q]
    return float(torch.log(seen).mean())


def entropy_scale(t: Trace) -> tuple[float, float]:
    """``(0, top)``: the range of the attention-entropy colours, ``top`` the largest :func:`uniform_entropy` of the
    layers (never below a measured value, nor 0)."""
    values = [v for s in t.layers for v in (s.attention_entropy or [])]
    top = max((uniform_entropy(w) for w in t.attention.values()), default=0.0)
    return 0.0, max(top, *values, 1e-6)


def entropy_png(t: Trace) -> Optional[str]:
    """Base64 PNG of the attention entropy per (layer, head), or ``None`` when no layer exposes weights.

    The colour scale is fixed to what entropy can be, not stretched over the values: from 0 (all weight on one
    key) to the entropy of uniform attention over the keys each query sees (:func:`uniform_entropy`, the largest
    over the layers), so an untrained model whose heads all sit at 1.5904 to 1.5910 nats reads as one colour, the
    top one. Each cell carries its value when the grid is small enough to read.
    """
    from matplotlib.figure import Figure

    rows = [(s.index, s.attention_entropy) for s in t.layers if s.attention_entropy is not None]
    if not rows:
        return None
    width = max(len(e) for _, e in rows)
    grid = [[e[h] if h < len(e) else math.nan for h in range(width)] for _, e in rows]
    _, top = entropy_scale(t)
    fig = Figure(figsize=(min(3.5 + 0.7 * width, FIGURE_WIDTH), min(1.8 + 0.45 * len(rows), 14)))
    ax = fig.subplots()
    im = ax.imshow(grid, aspect="auto", cmap="magma", vmin=0.0, vmax=top, interpolation="nearest")
    ax.set_xlabel("head", fontsize=10)
    ax.set_ylabel("layer", fontsize=10)
    ax.set_xticks(range(width), [str(h) for h in range(width)], fontsize=9)
    ax.set_yticks(range(len(rows)), [str(i) for i, _ in rows], fontsize=9)
    ax.set_title("attention entropy (nats, mean over queries)", fontsize=11)
    if width <= 16 and len(rows) <= 32:
        for r, row in enumerate(grid):
            for h, v in enumerate(row):
                if not math.isnan(v):
                    ax.text(
                        h,
                        r,
                        f"{v:.2f}",
                        ha="center",
                        va="center",
                        fontsize=MIN_FONT,
                        color="black" if v > 0.6 * top else "white",
                    )
    bar = fig.colorbar(im, ax=ax)
    bar.set_label(f"0 = one key; {top:.2f} = uniform over the keys seen", fontsize=9)
    bar.ax.tick_params(labelsize=9)
    fig.tight_layout()
    return _png(fig)


def _tick_labels(ax, labels: list[str], q: int, k: int, panel_px: float) -> None:
    """Token labels on both axes of one heatmap panel, at a readable size: every ``n``-th when they do not fit."""
    step = max(1, math.ceil(max(q, k) * 1.25 * MIN_FONT * 100 / 72 / panel_px))
    xs = list(range(0, k, step))
    ys = list(range(0, q, step))
    ax.set_xticks(xs, [labels[-k:][i] for i in xs], rotation=90, fontsize=MIN_FONT)
    ax.set_yticks(ys, [labels[-q:][i] for i in ys], fontsize=MIN_FONT)


def attention_png(t: Trace, layer: int) -> str:
    """Base64 PNG of the attention probabilities ``[q, k]`` of every head of ``layer`` (one panel per head), on
    one fixed colour scale from 0 to 1 (a shared colour bar says so), with token labels on the axes."""
    from matplotlib.figure import Figure

    w = t.attention[layer]  # [heads, q, k]
    heads, q, k = w.shape
    cols = min(heads, 4)
    rows = math.ceil(heads / cols)
    panel = (FIGURE_WIDTH - 1.2) / cols  # inches per panel, the colour bar beside them
    fig = Figure(figsize=(FIGURE_WIDTH, rows * (panel + 0.5) + 0.6))
    axes = fig.subplots(rows, cols, squeeze=False)
    labels = [token_display(s) for s in t.tokens]
    ent = next((s.attention_entropy for s in t.layers if s.index == layer), None)
    im = None
    for h in range(rows * cols):
        ax = axes[h // cols][h % cols]
        if h >= heads:
            ax.axis("off")
            continue
        im = ax.imshow(w[h].numpy(), vmin=0.0, vmax=1.0, cmap="viridis", interpolation="nearest")
        ax.set_title(f"head {h}" + (f"  entropy {ent[h]:.2f} nats" if ent else ""), fontsize=10)
        _tick_labels(ax, labels, q, k, panel * 100 * 0.8)
    fig.suptitle(f"layer {layer}: attention probabilities (rows: queries, columns: keys)", fontsize=11)
    fig.tight_layout(rect=(0, 0, 0.92, 1))
    if im is not None:
        bar = fig.colorbar(im, ax=axes.ravel().tolist(), fraction=0.03, pad=0.02)
        bar.set_label("probability (0 to 1)", fontsize=9)
        bar.ax.tick_params(labelsize=9)
    return _png(fig)


def position_png(pm) -> str:
    """Base64 PNG of one :class:`~modkit.analysis.trace.PositionMap`: a diverging scale symmetric about 0 (white), from
    ``-max |value|`` to ``+max |value|``, which the colour bar's label states."""
    from matplotlib.figure import Figure

    rows, cols = pm.values.shape
    fig = Figure(figsize=(min(3.5 + cols / 16, FIGURE_WIDTH), min(2.5 + rows / 16, 7)))
    ax = fig.subplots()
    limit = float(pm.values.abs().max()) or 1.0  # symmetric colours: white is 0
    im = ax.imshow(pm.values.numpy(), aspect="auto", cmap="RdBu_r", interpolation="nearest", vmin=-limit, vmax=limit)
    ax.set_title(pm.title, fontsize=10)
    ax.set_xlabel(pm.xlabel, fontsize=10)
    ax.set_ylabel(pm.ylabel, fontsize=10)
    ax.tick_params(labelsize=9)
    bar = fig.colorbar(im, ax=ax)
    bar.set_label(f"value: white 0, ±{limit:.3g} = the largest |value|", fontsize=9)
    bar.ax.tick_params(labelsize=9)
    fig.tight_layout()
    return _png(fig)


# ------------------------------------------------------------------------------------------------ HTML

_STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 24px auto; max-width: 1200px;
       color: #1d1d1f; padding: 0 16px; }
h1 { font-size: 1.5em; margin-bottom: 4px; } h2 { margin-top: 32px; border-bottom: 1px solid #ddd; }
h3 { font-size: 1.05em; margin: 18px 0 6px; }
table { border-collapse: collapse; font-size: 13px; margin: 8px 0; }
th, td { border: 1px solid #ddd; padding: 3px 8px; text-align: left; vertical-align: top; }
th { background: #f4f4f6; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
tr.group td { background: #eef3fb; font-weight: 600; }
code, .mono { font-family: ui-monospace, "SFMono-Regular", Menlo, monospace; font-size: 12px; }
.meta { color: #555; margin: 2px 0; } .note { color: #666; } .warn { color: #8a4b00; }
img { max-width: 100%; display: block; margin: 8px 0; }
.tokens span { display: inline-block; border: 1px solid #ccd; border-radius: 4px; padding: 1px 5px; margin: 2px;
               font-family: ui-monospace, Menlo, monospace; font-size: 12px; background: #fafaff; }
"""


def _e(text: object) -> str:
    return html.escape(str(text))


def _stage_rows(stages: list[Stage]) -> str:
    return "".join(
        f"<tr><td>{_e(s.label)}</td><td><code>{_e(s.name)}</code></td><td class='num mono'>{_e(_shape(s.shape))}</td>"
        f"<td class='note'>{_e(s.note)}</td></tr>"
        for s in stages
    )


def render_html(t: Trace) -> str:
    """The report as one self-contained HTML document (see the module docstring)."""
    parts = [
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
        f"<title>modkit trace: {_e(t.name)}</title><style>{_STYLE}</style></head><body>",
        f"<h1>modkit trace: {_e(t.name)}</h1>",
    ]
    parts += [f"<p class='meta'>{_e(line)}</p>" for line in _header_lines(t)[: 3 if t.tokenizer else 2]]
    parts.append(
        "<div class='tokens'>"
        + "".join(f"<span title='id {i}'>{_e(token_display(s))}</span>" for i, s in zip(t.ids, t.tokens))
        + "</div>"
    )

    parts.append("<h2>The tokens' journey: shape after every stage</h2>")
    parts.append(
        "<table><tr><th>stage</th><th>name (<code>modkit.inspect</code>)</th><th>shape</th><th>reading</th></tr>"
    )
    parts.append(_stage_rows(t.before))
    for g in t.groups:
        parts.append(f"<tr class='group'><td colspan='4'>{_e(g.title)}</td></tr>")
        parts.append(_stage_rows(g.stages))
    parts.append("<tr class='group'><td colspan='4'>after the blocks</td></tr>")
    parts.append(_stage_rows(t.after))
    parts.append("</table>")

    if not t.has_stats:
        parts.append(
            "<p class='warn'>No statistics: the model has no weights here (meta device). Trace a checkpoint, "
            "or a spec with <code>--random-init</code> for an untrained model.</p>"
        )
    else:
        parts.append("<h2>Per layer</h2>")
        moe = has_expert_loads(t)
        parts.append(
            "<table><tr><th>layer</th><th>‖h‖</th><th>‖Δh‖/‖h_prev‖</th><th>cos(h, h_prev)</th><th>FFN zeros</th>"
            "<th>FFN near 0</th>"
            + ("<th>expert load max/mean</th>" if moe else "")
            + "<th>attention entropy per head (nats)</th><th>logit lens: top tokens at the last position</th></tr>"
        )
        for s in t.layers:
            ent = " ".join(f"{e:.2f}" for e in s.attention_entropy) if s.attention_entropy is not None else "n/a"
            parts.append(
                f"<tr><td class='num'>{s.index}</td><td class='num'>{_num(s.residual_norm)}</td>"
                f"<td class='num'>{_num(s.update_ratio)}</td><td class='num'>{_num(s.cosine_prev)}</td>"
                f"<td class='num'>{_num(s.ffn_sparsity)}</td><td class='num'>{_num(s.ffn_near_zero)}</td>"
                + (f"<td class='mono'>{_e(load_text(s))}</td>" if moe else "")
                + f"<td class='mono'>{_e(ent)}</td>"
                f"<td class='mono'>{_e(_lens_text(s))}</td></tr>"
            )
        parts.append("</table>")
        parts.append("<h3>Per-layer curves</h3>" + _img(layer_curves_png(t), "per-layer curves"))
        ent_png = entropy_png(t)
        if ent_png:
            parts.append("<h3>Attention entropy per layer and head</h3>" + _img(ent_png, "attention entropy"))
        if t.attention:
            parts.append("<h2>Attention per head</h2>")
            for layer in sorted(t.attention):
                parts.append(f"<h3>layer {layer}</h3>" + _img(attention_png(t, layer), f"attention of layer {layer}"))
        if t.positions:
            parts.append("<h2>Position encoding</h2>")
            for pm in t.positions:
                parts.append(_img(position_png(pm), pm.title))
    if t.unavailable:
        parts.append("<h2>Not exposed by the components</h2><ul>")
        parts += [f"<li><code>{_e(n)}</code>: {_e(why)}</li>" for n, why in t.unavailable.items()]
        parts.append("</ul>")
    parts.append("</body></html>\n")
    return "".join(parts)


def write_html(t: Trace, path: Union[str, Path]) -> Path:
    """Write :func:`render_html` of ``t`` to ``path`` (UTF-8; the parent folder must exist). Returns the path."""
    path = Path(path)
    path.write_text(render_html(t), encoding="utf-8")
    return path


__all__ = [
    "attention_png",
    "entropy_png",
    "entropy_scale",
    "uniform_entropy",
    "layer_curves_png",
    "position_png",
    "print_trace",
    "render_html",
    "token_display",
    "write_html",
]

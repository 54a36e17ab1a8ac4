"""Views of a :class:`~modkit.trace.Trace`: rich tables for the terminal and a self-contained HTML report.

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

from .trace import Stage, Trace

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
    return [f"weights: {t.weights}", dims, f"tokens ({len(t.ids)}): {toks}", f"ids: {', '.join(map(str, t.ids))}"]


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
    from rich.table import Table
    from rich.text import Text

    if console is None:
        console = Console(width=None if sys.stdout.isatty() else 120, highlight=False)
    console.print(Text(f"modkit trace: {t.name}", style="bold"))
    for line in _header_lines(t):
        console.print(Text(line))

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
        table.add_row(Text(g.title, style="bold"), Text(f"layers.{g.layers[0]}" + ("" if len(g.layers) == 1 else " (first of the group)"), style="dim"), "", "")
        rows(g.stages)
    table.add_section()
    rows(t.after)
    console.print(table)

    if t.has_stats:
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
                str(s.index), _num(s.residual_norm), _num(s.update_ratio), _num(s.cosine_prev),
                _num(s.ffn_sparsity), _num(s.ffn_near_zero), *([Text(load_text(s))] if moe else []), Text(ent),
                Text(_lens_text(s)),
            )
        console.print(layers)
    else:
        console.print(Text("no statistics: the model has no weights here (meta device); trace a checkpoint, or a spec "
                           "with --random-init for an untrained model", style="italic"))
    if t.unavailable:
        console.print(Text("not exposed by the components:", style="bold"))
        for name, why in t.unavailable.items():
            console.print(Text(f"  {name}: {why}"))


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
        ("FFN activation sparsity", [("exact zeros", series(s.ffn_sparsity for s in t.layers)),
                                     ("|a| < 0.1 rms", series(s.ffn_near_zero for s in t.layers))]),
    ]
    fig = Figure(figsize=(10, 6))
    axes = fig.subplots(2, 2)
    for ax, (title, lines) in zip(axes.flat, panels):
        for label, ys in lines:
            ax.plot(xs, ys, "o-", ms=4, label=label)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("layer")
        ax.grid(alpha=0.3)
        if len(xs) <= 40:
            ax.set_xticks(xs)
        if title.startswith("FFN"):
            ax.set_ylim(-0.02, 1.02)
            ax.legend(fontsize=8)
    fig.tight_layout()
    return _png(fig)


def entropy_png(t: Trace) -> Optional[str]:
    """Base64 PNG of the attention entropy per (layer, head), or ``None`` when no layer exposes weights."""
    from matplotlib.figure import Figure

    rows = [(s.index, s.attention_entropy) for s in t.layers if s.attention_entropy is not None]
    if not rows:
        return None
    width = max(len(e) for _, e in rows)
    grid = [[e[h] if h < len(e) else math.nan for h in range(width)] for _, e in rows]
    fig = Figure(figsize=(min(2 + 0.5 * width, 14), min(1.5 + 0.35 * len(rows), 12)))
    ax = fig.subplots()
    im = ax.imshow(grid, aspect="auto", cmap="magma")
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    ax.set_yticks(range(len(rows)), [str(i) for i, _ in rows])
    ax.set_title("attention entropy (nats, mean over queries)", fontsize=10)
    fig.colorbar(im, ax=ax)
    fig.tight_layout()
    return _png(fig)


def attention_png(t: Trace, layer: int) -> str:
    """Base64 PNG of the attention probabilities ``[q, k]`` of every head of ``layer`` (one panel per head)."""
    from matplotlib.figure import Figure

    w = t.attention[layer]  # [heads, q, k]
    heads, q, k = w.shape
    cols = min(heads, 8)
    rows = math.ceil(heads / cols)
    panel = 2.6 if q <= 32 else 1.8
    fig = Figure(figsize=(cols * panel + 0.6, rows * panel + 0.4))
    axes = fig.subplots(rows, cols, squeeze=False)
    labels = [token_display(s) for s in t.tokens]
    ent = next((s.attention_entropy for s in t.layers if s.index == layer), None)
    for h in range(rows * cols):
        ax = axes[h // cols][h % cols]
        if h >= heads:
            ax.axis("off")
            continue
        ax.imshow(w[h].numpy(), vmin=0.0, vmax=1.0, cmap="viridis")
        ax.set_title(f"head {h}" + (f"  H={ent[h]:.2f}" if ent else ""), fontsize=8)
        if q <= 32:
            ax.set_xticks(range(k), labels[-k:], rotation=90, fontsize=6)
            ax.set_yticks(range(q), labels[-q:], fontsize=6)
        else:
            ax.set_xticks([])
            ax.set_yticks([])
    fig.suptitle(f"layer {layer}: attention probabilities (rows: queries, columns: keys)", fontsize=9)
    fig.tight_layout()
    return _png(fig)


def position_png(pm) -> str:
    """Base64 PNG of one :class:`~modkit.trace.PositionMap`."""
    from matplotlib.figure import Figure

    rows, cols = pm.values.shape
    fig = Figure(figsize=(min(2.5 + cols / 16, 10), min(2 + rows / 16, 6)))
    ax = fig.subplots()
    limit = float(pm.values.abs().max()) or 1.0  # symmetric colours: white is 0
    im = ax.imshow(pm.values.numpy(), aspect="auto", cmap="RdBu_r", interpolation="nearest", vmin=-limit, vmax=limit)
    ax.set_title(pm.title, fontsize=9)
    ax.set_xlabel(pm.xlabel)
    ax.set_ylabel(pm.ylabel)
    fig.colorbar(im, ax=ax)
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
    parts += [f"<p class='meta'>{_e(line)}</p>" for line in _header_lines(t)[:2]]
    parts.append("<div class='tokens'>" + "".join(f"<span title='id {i}'>{_e(token_display(s))}</span>" for i, s in zip(t.ids, t.tokens)) + "</div>")

    parts.append("<h2>The tokens' journey: shape after every stage</h2>")
    parts.append("<table><tr><th>stage</th><th>name (<code>modkit.inspect</code>)</th><th>shape</th><th>reading</th></tr>")
    parts.append(_stage_rows(t.before))
    for g in t.groups:
        parts.append(f"<tr class='group'><td colspan='4'>{_e(g.title)}</td></tr>")
        parts.append(_stage_rows(g.stages))
    parts.append("<tr class='group'><td colspan='4'>after the blocks</td></tr>")
    parts.append(_stage_rows(t.after))
    parts.append("</table>")

    if not t.has_stats:
        parts.append("<p class='warn'>No statistics: the model has no weights here (meta device). Trace a checkpoint, "
                     "or a spec with <code>--random-init</code> for an untrained model.</p>")
    else:
        parts.append("<h2>Per layer</h2>")
        moe = has_expert_loads(t)
        parts.append("<table><tr><th>layer</th><th>‖h‖</th><th>‖Δh‖/‖h_prev‖</th><th>cos(h, h_prev)</th><th>FFN zeros</th>"
                     "<th>FFN near 0</th>" + ("<th>expert load max/mean</th>" if moe else "")
                     + "<th>attention entropy per head (nats)</th><th>logit lens: top tokens at the last position</th></tr>")
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


__all__ = ["attention_png", "entropy_png", "layer_curves_png", "position_png", "print_trace", "render_html", "token_display", "write_html"]

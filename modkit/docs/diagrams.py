"""Mermaid diagrams: a block's data flow traced with :mod:`torch.fx` (placement pages, gallery blocks) and the
model-level flow of a built spec (gallery cards)."""

from __future__ import annotations

import operator
from typing import Any, Mapping, Optional

from .markdown import _count, _layer_ranges, _mermaid_text
from .params import EXAMPLE_CONTEXT, _build_alone, _default_norm


def trace_block(block, *, types: bool = True) -> Optional[list[tuple[str, str, list[str]]]]:
    """The tensor data flow of a block module as ``[(node id, label, [input node ids])]``, or ``None``.

    Traced with :mod:`torch.fx`; every module tagged with a kind (norms, sublayers) is a leaf. Only the path from
    the block input ``x`` to the block output is kept; item accesses are folded into their source. With
    ``types`` a module's label carries its registered type under its attribute name.
    """
    traced = _trace_ends(block)
    if traced is None:
        return None
    nodes, x, result = traced
    forward, backward = _reachable(nodes, x, result)
    keep = [n for n in nodes if n in forward and n in backward]
    modules = dict(block.named_modules())
    alias: dict[Any, Any] = {}

    def src(n):
        while n in alias:
            n = alias[n]
        return n

    out_nodes: list[tuple[str, str, list[str]]] = []
    for n in keep:
        if n.op == "call_function" and n.target is operator.getitem:
            alias[n] = n.args[0]
            continue
        ins = list(dict.fromkeys(src(a).name for a in _inputs_of(n) if src(a) in forward and src(a) in backward))
        out_nodes.append((n.name, _node_label(n, x, modules, types), ins))
    out_nodes.append(("__out__", "x", [src(result).name]))
    return out_nodes


def _trace_ends(block):
    """``(graph nodes, the input node x, the output's node)`` of ``block`` traced with :mod:`torch.fx` (modules
    tagged with a kind are leaves; a tuple output's first item), or ``None`` when tracing fails or finds no ends."""
    import torch.fx as fx

    class Tracer(fx.Tracer):
        def is_leaf_module(self, m, qualname):  # noqa: D102
            return hasattr(m, "modkit_kind") or super().is_leaf_module(m, qualname)

    try:
        graph = Tracer().trace(block)
    except Exception:  # noqa: BLE001 - data-dependent control flow: no diagram
        return None
    nodes = list(graph.nodes)
    placeholders = [n for n in nodes if n.op == "placeholder"]
    if not placeholders:
        return None
    x = placeholders[0]
    out = next((n for n in nodes if n.op == "output"), None)
    if out is None:
        return None
    result = out.args[0]
    if isinstance(result, (tuple, list)):
        result = result[0]
    if not isinstance(result, fx.Node):
        return None
    return nodes, x, result


def _inputs_of(n) -> list:
    """The nodes among ``n``'s arguments and keyword arguments (nested ones included), in order."""
    import torch.fx as fx

    found = []
    fx.node.map_arg((n.args, n.kwargs), lambda a: found.append(a))
    return found


def _reachable(nodes: list, x, result) -> tuple[set, set]:
    """``(nodes that depend on x, nodes the result depends on)``: the block's path is their intersection."""
    forward: set = {x}
    for n in nodes:
        if n is not x and any(a in forward for a in _inputs_of(n)):
            forward.add(n)
    backward: set = set()
    stack = [result]
    while stack:
        n = stack.pop()
        if n in backward:
            continue
        backward.add(n)
        stack.extend(_inputs_of(n))
    return forward, backward


def _node_label(n, x, modules: Mapping[str, Any], types: bool) -> str:
    """A node's label: ``x`` for the input, a module's attribute name (with its registered type under it when
    ``types`` and it differs from the kind), ``+`` / ``×`` for additions and products, else the function's name."""
    if n is x:
        return "x"
    if n.op == "call_module":
        m = modules.get(n.target)
        label = str(n.target)
        kind, type_ = getattr(m, "modkit_kind", None), getattr(m, "modkit_type", None)
        if types and type_ and type_ != kind:
            label += f"<br/>{type_}"
        return label
    if (
        n.op == "call_function"
        and n.target in (operator.add, operator.iadd)
        or getattr(n.target, "__name__", "") == "add"
    ):
        return "+"
    if n.op == "call_function" and n.target in (operator.mul, operator.imul):
        return "×"
    return str(getattr(n.target, "__name__", n.target))


def mermaid_block(
    flow: list[tuple[str, str, list[str]]], *, prefix: str = "", notes: Mapping[str, str] = {}
) -> list[str]:
    """Mermaid flowchart lines (without the ``flowchart`` header) for a traced block."""
    lines = []
    ids = {name: f"{prefix}n{i}" for i, (name, _, _) in enumerate(flow)}
    for i, (name, label, ins) in enumerate(flow):
        nid = ids[name]
        if name == "__out__":
            shape = f'(["{_mermaid_text("x out")}"])'
        elif i == 0:
            shape = f'(["{_mermaid_text("x in")}"])'
        elif label in ("+", "×"):
            shape = f'(("{label}"))'
        else:
            shape = f'["{_mermaid_text(label)}"]'
        lines.append(f"  {nid}{shape}")
        if name in notes:
            lines.append(f'  {nid}_note>"{_mermaid_text(notes[name])}"] -.-> {nid}')
        for a in ins:
            lines.append(f"  {ids[a]} --> {nid}")
    return lines


def _placement_diagram(entry, config, registry) -> Optional[str]:
    norm_config = _default_norm(registry)
    try:
        module, _, _ = _build_alone(entry, config, registry, EXAMPLE_CONTEXT["d_model"], norm_config)
    except Exception:  # noqa: BLE001
        return None
    flow = trace_block(module, types=False)
    if flow is None:
        return None
    return "```mermaid\nflowchart TB\n" + "\n".join(mermaid_block(flow)) + "\n```"


def _model_diagram(model, registry) -> tuple[str, list[tuple[str, str]]]:
    """Mermaid source of the model flow and of each distinct block; ``[(layers, block mermaid)]``."""
    spec = model.spec
    pos_cfg = spec.position
    pos_entry = registry.entry_for_config(pos_cfg)
    acts = pos_entry.capabilities.get("acts_on")
    head = "lm_head<br/>tied to the embedding" if spec.tie_embeddings else "lm_head"
    lines = [
        "flowchart TB",
        f'  ids(["input_ids #91;batch, seq#93;"]) --> emb["token embedding<br/>{_count(spec.vocab_size)} × {spec.d_model}"]',
    ]
    prev = "emb"
    if spec.embedding_scale is not None:
        scale = "√d_model" if spec.embedding_scale == "sqrt_d_model" else f"{spec.embedding_scale:g}"
        lines.append(f'  scale(("× {scale}"))')
        lines.append(f"  {prev} --> scale")
        prev = "scale"
    if acts == "embedding":
        lines.append(f'  pos(("+ {pos_cfg.type}"))')
        lines.append(f"  {prev} --> pos")
        prev = "pos"
    if spec.embedding_norm is not None:
        lines.append(f'  enorm["embedding_norm<br/>{spec.embedding_norm.type}"]')
        lines.append(f"  {prev} --> enorm")
        prev = "enorm"
    lines.append(f'  blocks[["{spec.n_layers} × block<br/>{_mermaid_text(spec.block.placement.type)} placement"]]')
    lines.append(f"  {prev} --> blocks")
    prev = "blocks"
    if acts in ("qk", "bias"):
        what = "rotates q, k" if acts == "qk" else "adds an attention bias"
        lines.append(f'  rope["{pos_cfg.type}: {what}"] -.-> blocks')
    if spec.final_norm is not None:
        lines.append(f'  fnorm["final_norm<br/>{spec.final_norm.type}"]')
        lines.append(f"  {prev} --> fnorm")
        prev = "fnorm"
    lines.append(f'  head["{head}"]')
    lines.append(f"  {prev} --> head")
    prev = "head"
    if spec.logit_scale is not None:
        lines.append(f'  lscale(("× {spec.logit_scale:g}"))')
        lines.append(f"  {prev} --> lscale")
        prev = "lscale"
    if spec.final_logit_softcap is not None:
        lines.append(f'  cap["softcap {spec.final_logit_softcap:g}·tanh(z / {spec.final_logit_softcap:g})"]')
        lines.append(f"  {prev} --> cap")
        prev = "cap"
    lines.append(f'  logits(["logits #91;batch, seq, {_count(spec.vocab_size)}#93;"])')
    lines.append(f"  {prev} --> logits")
    model_mermaid = "\n".join(lines)

    groups: dict[str, list[int]] = {}
    for i, block in enumerate(model.layers):
        flow = trace_block(block)
        notes = {}
        if flow is None:
            body = f'  b["{_mermaid_text(type(block).__name__)} (not traceable)"]'
        else:
            window = model.windows[i] if i < len(model.windows) else None
            layer_pos = model.positions[model.layer_position[i]] if hasattr(model, "layer_position") else None
            pos_type = getattr(layer_pos, "modkit_type", None)
            pos_entry_l = registry.get("position", pos_type) if pos_type in registry.types("position") else None
            l_acts = pos_entry_l.capabilities.get("acts_on") if pos_entry_l else None
            for name, label, _ in flow:
                if label.startswith("attention"):
                    bits = []
                    if l_acts in ("qk", "bias"):
                        bits.append(f"{pos_type}: " + ("rotates q, k" if l_acts == "qk" else "bias"))
                    if window is not None:
                        bits.append(f"sliding window {window}")
                    if bits:
                        notes[name] = "; ".join(bits)
            body = "\n".join(mermaid_block(flow, notes=notes))
        groups.setdefault(body, []).append(i)
    blocks = [(_layer_ranges(idx), "flowchart TB\n" + body) for body, idx in groups.items()]
    return model_mermaid, blocks

"""What a component page shows about using the component: the gallery models that use it, where its source lives,
its config class with the config's JSON Schema, and a Python snippet that puts its example in a model (the tests
execute every snippet, so none can rot)."""

from __future__ import annotations

import importlib
import inspect
import json
import sys
import textwrap
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

from .markdown import gallery_path, _rel


def gallery_usage(cards: Sequence[Any]) -> dict[tuple[str, str], list[tuple[Any, list[str]]]]:
    """``{(kind, type): [(card, spec paths where the model uses it), ...]}`` over the gallery's model cards."""
    out: dict[tuple[str, str], list[tuple[Any, list[str]]]] = {}
    for card in cards:
        for c in card.components:
            out.setdefault((c["kind"], c["type"]), []).append((card, list(c.get("paths", []))))
    return out


def usage_section(entry, uses: Sequence[tuple[Any, list[str]]], page: str) -> str:
    """Markdown of the *Used in the gallery* list of a component page (links to the model cards)."""
    if not uses:
        return "No model of the [gallery]({to:gallery/index.md}) uses it."
    lines = [
        f"{len(uses)} model{'s' if len(uses) != 1 else ''} of the [gallery]({{to:gallery/index.md}}) use{'s' if len(uses) == 1 else ''} it:",
        "",
    ]
    for card, paths in uses:
        where = ", ".join(f"`{p}`" for p in paths[:3]) + (f" and {len(paths) - 3} more" if len(paths) > 3 else "")
        lines.append(f"- [{card.stem}]({_rel(page, gallery_path(card.stem))}) at {where}")
    return "\n".join(lines)


def source_location(obj: Any, root: Optional[Path] = None, repo_url: Optional[str] = None) -> str:
    """Where ``obj`` (a component's config class, a function, or a module) is defined, as Markdown.

    Inside ``root`` (the repository of the site): the repository path and line, linked into ``repo_url``
    (``.../blob/HEAD/PATH#LN``) only when one is configured. Elsewhere (an installed plugin): the module and its
    file relative to the folder its top-level package is installed in; no link is made up.
    """
    module = obj.__name__ if inspect.ismodule(obj) else getattr(obj, "__module__", "") or ""
    try:
        path = Path(inspect.getsourcefile(obj) or "").resolve()
        line = max(inspect.getsourcelines(obj)[1], 1)  # a module starts at line 1 (inspect says 0)
    except (TypeError, OSError):
        return f"module `{module}`" if module else "(unknown)"
    if root is not None:
        try:
            rel = path.relative_to(Path(root).resolve()).as_posix()
        except ValueError:
            rel = None
        if rel is not None:
            label = f"`{rel}` line {line}"
            if repo_url:
                return f"[{label}]({repo_url.rstrip('/')}/blob/HEAD/{rel}#L{line})"
            return label + " in the repository"
    top = sys.modules.get(module.split(".")[0])
    top_file = getattr(top, "__file__", None)
    if top_file:
        base = Path(top_file).resolve().parent
        base = base.parent if Path(top_file).name == "__init__.py" else base
        try:
            return f"module `{module}`, file `{path.relative_to(base).as_posix()}` line {line}"
        except ValueError:
            pass
    return f"module `{module}`, file `{path.name}` line {line}"


def _importable(cls: Any) -> bool:
    """Whether ``cls`` is reachable as ``module.qualname`` (a snippet can import it)."""
    try:
        obj: Any = importlib.import_module(cls.__module__)
        for part in cls.__qualname__.split("."):
            obj = getattr(obj, part)
        return obj is cls
    except Exception:  # noqa: BLE001 - a class defined in a function or a test
        return False


def schema_block(entry) -> str:
    """A collapsed block with the JSON Schema of ``entry``'s config class (what ``modkit show --schema`` prints)."""
    schema = json.dumps(entry.config.model_json_schema(), indent=2)
    return "\n".join(
        [
            f'??? info "JSON Schema of `{entry.config.__name__}`"',
            "",
            textwrap.indent("```json\n" + schema + "\n```", "    "),
        ]
    )


def spec_route(kind: str, registry, _depth: int = 0) -> Optional[list[tuple[str, ...]]]:
    """How a component of ``kind`` enters a spec dict: ``[("block", "norm")]`` for a block field, ``[("position",)]``
    for a top-level field, and for a kind that only lives inside another component (a router inside an MoE) the
    route of the host followed by ``("host", kind, type, field)``. ``None`` when nothing holds the kind."""
    from modkit.core.config import slot_kind, slot_kinds
    from ..spec import BlockSpec, ModelSpec

    def holds(f) -> bool:  # a slot of kind "mixer" takes attentions and recurrent mixers alike
        return slot_kind(f) is not None and kind in slot_kinds(slot_kind(f))

    for prefix, cls in ((("block",), BlockSpec), ((), ModelSpec)):
        for name, f in cls.model_fields.items():
            if holds(f):
                return [prefix + (name,)]
    if _depth > 3:
        return None
    for host in registry.components():
        for name, f in host.config.model_fields.items():
            if holds(f) and host.kind != kind:
                outer = spec_route(host.kind, registry, _depth + 1)
                if outer is not None:
                    return outer + [("host", host.kind, host.type, name)]
    return None


def _py(value: Any, indent: int = 0) -> str:
    """A Python literal of a JSON value: one line when it fits in 80 characters, else one item per line."""
    flat = repr(value)
    if len(flat) + indent <= 80 or not isinstance(value, (dict, list)) or not value:
        return flat
    pad = " " * (indent + 4)
    if isinstance(value, dict):
        items = [f"{pad}{k!r}: {_py(v, indent + 4)}," for k, v in value.items()]
        return "{\n" + "\n".join(items) + "\n" + " " * indent + "}"
    items = [f"{pad}{_py(v, indent + 4)}," for v in value]
    return "[\n" + "\n".join(items) + "\n" + " " * indent + "]"


def python_usage(entry, example: Mapping[str, Any], registry, base: Optional[Any]) -> Optional[str]:
    """Python code that uses ``entry`` with its example config, or ``None`` when no snippet applies.

    Model components: the config is constructed from its class (or with :func:`modkit.load_component` when the
    class cannot be imported or holds other components), put in ``base`` (a small gallery spec, read from its file) where the kind goes, and
    the model is built on ``meta``. Sampling steps: the example goes in :func:`modkit.inference.generate.generate`'s
    ``sampling`` list. Run from the repository root (``base.source`` is a path relative to it).
    """
    from modkit.inference.sampling import KINDS as SAMPLING_KINDS

    if base is None:
        return None
    if entry.kind in SAMPLING_KINDS:
        return _sampling_usage(entry, example, base)
    from ..train.optim import KIND as OPTIMIZER_KIND

    if entry.kind == OPTIMIZER_KIND:  # not part of a model: a training config names it
        return _optimizer_usage(example, base)
    from ..train.trackers import KIND as TRACKER_KIND

    if entry.kind == TRACKER_KIND:  # not part of a model: a training config lists it
        return _tracker_usage(example)
    route = spec_route(entry.kind, registry)
    if route is None:
        return None
    lines = ["import modkit", *_config_lines(entry, example)]
    lines += [f"spec = modkit.load_spec({base.source!r}).to_dict()"]
    value = 'config.model_dump(mode="json")'
    # innermost first: wrap the value in its hosts (a router goes in an MoE's router field, the MoE in block.ffn)
    for step in reversed(route[1:]):
        _, host_kind, host_type, field = step
        host = registry.get(host_kind, host_type)
        lines.append(f"{host_kind} = {_py(host.example_config())}  # the example {host_type}")
        lines.append(f"{host_kind}[{field!r}] = {value}")
        value = host_kind
    keys = route[0]
    if keys == ("block", "attention") and "mixer" in base.spec.to_dict()["block"]:
        keys = ("block", "mixer")  # the base spec writes its token-mixing slot 'mixer' (one name per slot)
    target = "spec" + "".join(f"[{k!r}]" for k in keys)
    lines += [f"{target} = {value}"]
    if entry.kind == "mixer" and keys[0] == "block":  # a recurrent mixer takes no position scheme
        lines += ['spec["position"] = {"type": "none"}  # a recurrent mixer carries the order itself']
    elif keys[0] == "block" and _rotates_itself(entry, example):
        lines += ['spec["position"] = {"type": "none"}  # this attention rotates with its own RoPE']
    lines += [
        'model = modkit.build(spec, device="meta")  # no memory; device="cpu" for real weights',
        "print(modkit.count_params(model))",
    ]
    return "\n".join(lines)


def _rotates_itself(entry, example: Mapping[str, Any]) -> bool:
    """Whether a token mixer's example declares no position geometry (it takes no position scheme: DeepSeek-V4's
    ``compressed_attention`` carries its own RoPE)."""
    try:
        cfg = entry.config.model_validate(dict(example))
        declare = getattr(cfg, "position_geometry", None)
        return callable(declare) and declare(None) is None
    except Exception:  # a declaration that needs the model's context: it takes a scheme
        return False


def _sampling_usage(entry, example: Mapping[str, Any], base) -> str:
    """A snippet that puts the example of a sampling step in :func:`generate`'s ``sampling`` list."""
    decode = ""
    if entry.kind == "stop_condition":
        decode = ',\n               decode=lambda ids: " ".join(map(str, ids)))  # a tokenizer\'s decode in practice'
    else:
        decode = ")"
    return "\n".join(
        [
            "import modkit",
            "from modkit.inference.generate import generate",
            "",
            f"model = modkit.build({base.source!r}, seed=0).eval()",
            f"out = generate(model, [[1, 2, 3]], max_new_tokens=8, seed=0, sampling=[{_py(dict(example))}]{decode}",
            "print(out.shape)  # [1, 3 + new tokens]",
        ]
    )


def _tracker_usage(example: Mapping[str, Any]) -> str:
    """A snippet that lists the example tracker in a training config (validated against the registry); training
    with it is ``modkit.train.train(config, run_dir)``."""
    return "\n".join(
        [
            "from modkit.train import load_train_config",
            "",
            f'config, _ = load_train_config({{"max_steps": 50, "trackers": [{_py(dict(example))}]}})',
            "print(config.trackers)  # every field written out; modkit.train.train(config, run_dir) logs to it",
        ]
    )


def _optimizer_usage(example: Mapping[str, Any], base) -> str:
    """A snippet that names the example optimizer in a training config and builds it for the base model."""
    return "\n".join(
        [
            "import modkit",
            "from modkit.train import TrainConfig",
            "from modkit.train.optim import build_optimizer",
            "",
            f"config = TrainConfig(optimizer={_py(dict(example))}, lr=1e-3)  # validated against the registry",
            f"model = modkit.build({base.source!r}, seed=0)",
            "optimizer = build_optimizer(model, model.spec, config)  # parameters grouped by role",
            'print([g["roles"] for g in optimizer.param_groups])',
        ]
    )


def _config_lines(entry, example: Mapping[str, Any]) -> list[str]:
    """The snippet lines (after ``import modkit``) that make the component's config: its class constructed when
    it can be imported and holds no other component, else :func:`modkit.load_component`."""
    cls = entry.config
    from modkit.core.config import slot_kind

    # a config with component fields validates them against the registry: load_component, not the bare class
    if _importable(cls) and not any(slot_kind(f) for f in cls.model_fields.values()):
        call = f"config = {cls.__qualname__}({', '.join(f'{k}={v!r}' for k, v in example.items())})"
        if len(call) > 100:
            call = (
                f"config = {cls.__qualname__}(\n" + "".join(f"    {k}={_py(v, 4)},\n" for k, v in example.items()) + ")"
            )
        return [f"from {cls.__module__} import {cls.__qualname__}", "", call + "  # validated by pydantic"]
    return ["", f"config = modkit.load_component({entry.kind!r}, {_py(dict(example))})"]

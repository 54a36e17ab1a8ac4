"""Hugging Face ``config.json`` → modkit spec, dispatched on ``model_type`` to converters registered by plugins.

The core names no model type: converters arrive through the ``register_hf_converters`` hook.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional, Union

from .errors import RegistryError, SpecError
from .registry import Registry, get_registry
from .spec import ModelSpec, load_spec


def read_config(source: Union[str, Path, dict]) -> dict:
    """Load a ``config.json`` (path to the file or its folder) or pass a dict through.

    Raises:
        SpecError: unreadable file or malformed JSON.
    """
    if isinstance(source, dict):
        return source
    path = Path(source)
    if path.is_dir():
        path = path / "config.json"
    try:
        return json.loads(path.read_text())
    except OSError as exc:
        raise SpecError([("", f"cannot read Hugging Face config: {exc.strerror or exc}")], source=str(path)) from None
    except json.JSONDecodeError as exc:
        raise SpecError([("", f"not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}")], source=str(path)) from None


def hf_config_to_dict(config: Union[str, Path, dict], *, registry: Optional[Registry] = None) -> dict:
    """Convert a Hugging Face config to a modkit spec dict (not yet validated).

    Raises:
        SpecError: no ``model_type``, an unsupported one (lists the supported types), or a field value the
            converter cannot express (names the field and value).
    """
    reg = registry or get_registry()
    cfg = read_config(config)
    model_type = cfg.get("model_type")
    if not model_type:
        raise SpecError([("model_type", "missing; cannot tell which architecture this config describes")])
    try:
        conv = reg.hf_converter(model_type)
    except RegistryError as exc:
        raise SpecError([("model_type", str(exc))]) from None
    return conv.convert(cfg)


def from_hf_config(config: Union[str, Path, dict], *, registry: Optional[Registry] = None) -> ModelSpec:
    """Convert a Hugging Face ``config.json`` (dict or path) into a validated :class:`ModelSpec`.

    Raises:
        SpecError: as :func:`hf_config_to_dict`, or if the converted spec fails validation.
    """
    reg = registry or get_registry()
    return load_spec(hf_config_to_dict(config, registry=reg), registry=reg)

"""The package files of a plugin skeleton (:func:`modkit.cli.scaffold.plugin_files`): ``pyproject.toml``,
``README.md``, the package ``__init__.py`` with its hook, and the contract test.

Each is a :class:`string.Template` text; placeholders: ``$name`` (distribution), ``$mod`` (import name), ``$kind``,
``$type``, ``$Class``, ``$ident`` and ``$usage`` (the README's spec snippet). The component module of each kind is in
:mod:`modkit.cli.scaffold.components`.
"""

PYPROJECT = """\
[build-system]
requires = ["setuptools>=68"]
build-backend = "setuptools.build_meta"

[project]
name = "$name"
version = "0.1.0"
description = "A modkit plugin providing the $kind component '$type'."
readme = "README.md"
requires-python = ">=3.10"
dependencies = ["modkit-lm"]

[project.optional-dependencies]
test = ["pytest>=8"]

# modkit discovers plugins through the "modkit" entry-point group. The key ("$name") is the plugin name shown by
# `modkit plugins` and used by `modkit check --plugin $name`; the value is the module with the hook functions.
[project.entry-points.modkit]
$name = "$mod"

[tool.setuptools]
packages = ["$mod"]

[tool.pytest.ini_options]
testpaths = ["tests"]
pythonpath = ["."]
"""

README = """\
# $name

A modkit plugin providing the `$kind` component `$type`.

```sh
pip install -e .                            # registers the entry point: modkit = $name -> $mod
modkit list $kind                           # shows $type from plugin $name
modkit show $kind $type                     # fields, capabilities, provider
modkit check --plugin $name                 # the contract kit on every component of this plugin
pytest                                      # tests/testing/test_contracts.py (the same checks)
pytest --modkit-contracts --modkit-plugin $name
```

Use it in a spec: `$usage`.

Edit `$mod/$kind.py`: the config model (every field documented), the module, the factory, `param_count`
(exact) and the `Component` entry (description with shapes, reference, capabilities, example config).
"""

INIT = '''\
"""$name: a modkit plugin providing the $kind component ``$type``.

modkit imports this module through the entry point ``$name = "$mod"`` (group ``modkit``) and calls
:func:`register_components` with its ``register`` callback. Register one ``Component`` (``modkit.plugin``) per call.
"""

from __future__ import annotations

from modkit.plugin import hookimpl

from .$kind import COMPONENT

__version__ = "0.1.0"


@hookimpl
def register_components(register) -> None:
    """Register ``$kind/$type``."""
    register(COMPONENT)
'''

TEST = '''\
"""The modkit contract kit on ``$kind/$type``: shapes, dtypes, gradients, init, parameter count, ...

Works installed (``pip install -e .``: the entry point is found) and from a plain checkout (the module is
registered by hand). ``modkit check --plugin $name`` and ``pytest --modkit-contracts --modkit-plugin $name`` run
the same checks.
"""

from __future__ import annotations

import pytest

import modkit
from modkit.testing import check_component

import $mod


@pytest.fixture(scope="module")
def registry():
    reg = modkit.get_registry()
    if "$name" not in {p.name for p in reg.plugins()}:  # not installed: register the module by hand
        reg = modkit.Registry()
        reg.load_entry_points()
        reg.register_plugin($mod, "$name")
    return reg


def test_contracts(registry):
    results = check_component("$kind", "$type", registry=registry)
    failed = [r for r in results if r.status == "failed"]
    assert not failed, "\\n".join(f"{r.check}: {r.detail}" for r in failed)
    assert any(r.status == "passed" for r in results)


def test_example_config_validates(registry):
    entry = registry.get("$kind", "$type")
    cfg = modkit.load_component("$kind", entry.example_config(), registry=registry)
    assert cfg.type == "$type"
'''

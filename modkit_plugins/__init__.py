"""modkit's built-in components, installed under the import name ``modkit_plugins``.

Each module is a plugin advertised under the ``modkit`` entry-point group in ``pyproject.toml``, exactly
like a third-party package: the core (``modkit``) never imports these modules by name.
"""

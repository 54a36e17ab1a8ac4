"""The core every other part reads: the registry and its pluggy hooks, the contracts between the core and
components, and the checks shared by everything that reads user input.

* :mod:`~modkit.core.registry` (:class:`Registry`, :class:`Component`), :mod:`~modkit.core.hooks` (``hookimpl``)
* :mod:`~modkit.core.config` (``ComponentConfig``, ``Slot``), :mod:`~modkit.core.interfaces` (the contracts),
  :mod:`~modkit.core.roles` (parameter roles)
* :mod:`~modkit.core.errors`, :mod:`~modkit.core.validation`, :mod:`~modkit.core.limits`, :mod:`~modkit.core.jsonio`,
  :mod:`~modkit.core.arguments` (bounds and strict reading of every input)

Nothing here imports a concrete component, and nothing here imports from the packages above it (``nn``, ``io``,
``analysis``, ...). A plugin author imports from :mod:`modkit.plugin`, not from here.
"""

from modkit.core._lazy import make_lazy

make_lazy(__name__, {})  # a submodule loads on first attribute access (modkit.nn.cache), as after an import

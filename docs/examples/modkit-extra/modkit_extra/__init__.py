"""modkit-extra: two components for modkit, each from a paper, each in its own small file.

* ``norm/dyt`` (:mod:`modkit_extra.dyt`): Dynamic Tanh, ``weight * tanh(alpha * x) + bias`` in place of a norm
  (Zhu et al. 2025, Transformers without Normalization, arXiv:2503.10622).
* ``ffn/relu2`` (:mod:`modkit_extra.relu2`): the squared-ReLU MLP ``down(relu(up(x))²)``
  (So et al. 2021, Primer, arXiv:2109.08668).

modkit loads this module through the entry point ``extra = "modkit_extra"`` of the ``modkit`` group (see
``pyproject.toml``) and calls :func:`register_components` with its ``register`` callback.
"""

from __future__ import annotations

from modkit.plugin import hookimpl

from .dyt import DYT
from .relu2 import RELU2

__version__ = "0.1.0"

__all__ = ["DYT", "RELU2", "register_components"]


@hookimpl
def register_components(register) -> None:
    """Register ``norm/dyt`` and ``ffn/relu2``."""
    register(DYT)
    register(RELU2)

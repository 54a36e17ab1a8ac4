"""Reading and writing models: :mod:`~modkit.io.checkpoint` (modkit's own format), :mod:`~modkit.io.hf`
(Hugging Face folders, both directions), :mod:`~modkit.io.atomic` (several files written as one atomic step)."""

from modkit.core._lazy import make_lazy

make_lazy(__name__, {})  # a submodule loads on first attribute access (modkit.nn.cache), as after an import

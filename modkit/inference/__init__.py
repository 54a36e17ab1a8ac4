"""Generating text: :mod:`~modkit.inference.generate` (prefill, decode with the cache, streaming),
:mod:`~modkit.inference.sampling` (logits processors and stop conditions, registered as components) and
:mod:`~modkit.inference.weights` (bfloat16 and int8 linear weights for decoding)."""

from modkit.core._lazy import make_lazy

make_lazy(__name__, {})  # a submodule loads on first attribute access (modkit.nn.cache), as after an import

"""The model and what one forward pass runs through: :mod:`~modkit.nn.build` (spec -> module on a device and
dtype), :mod:`~modkit.nn.model` (embed, blocks, norm, head), :mod:`~modkit.nn.cache` (declared decode state),
:mod:`~modkit.nn.attention` and :mod:`~modkit.nn.recurrent` (helpers every mixer may use),
:mod:`~modkit.nn.documents` (packed-document masks), :mod:`~modkit.nn.grouped` and :mod:`~modkit.nn.balance`
(mixture-of-experts kernels and load reports), :mod:`~modkit.core.parametrization` (standard and μP),
:mod:`~modkit.nn.memory` (estimates before allocating)."""

from modkit.core._lazy import make_lazy

make_lazy(__name__, {})  # a submodule loads on first attribute access (modkit.nn.cache), as after an import

"""Looking inside a model without training it: :mod:`~modkit.analysis.cost` (FLOPs, bytes and roofline latency from
the components' declarations), :mod:`~modkit.analysis.trace` and :mod:`~modkit.analysis.trace_report` (a token's
journey, per-layer readings), :mod:`~modkit.analysis.inspection` (named intermediate tensors),
:mod:`~modkit.analysis.hardware` (reference hardware of the roofline)."""

from modkit.core._lazy import make_lazy

make_lazy(__name__, {})  # a submodule loads on first attribute access (modkit.nn.cache), as after an import

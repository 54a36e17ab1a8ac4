"""Reference hardware of the decode roofline in :mod:`modkit.analysis.cost` (``modkit cost --bandwidth / --peak-flops``).

A module of its own, without torch, so that the ``modkit cost`` parser states its defaults without importing
:mod:`modkit.analysis.cost`.
"""

#: Default memory bandwidth of the roofline, bytes/s: an H100 SXM5's HBM3 (NVIDIA H100 datasheet: 3.35 TB/s).
DEFAULT_BANDWIDTH = 3.35e12
#: Default peak compute of the roofline, FLOP/s: an H100 SXM5's dense BF16 tensor cores (datasheet: 989 TFLOP/s;
#: the 1,979 figure assumes 2:4 sparsity).
DEFAULT_PEAK_FLOPS = 989e12

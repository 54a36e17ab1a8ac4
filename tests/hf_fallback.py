"""transformers' non-kernel PyTorch paths as the reference of the recurrent mixers.

transformers runs Mamba, Mamba-2 and Gated DeltaNet through kernels from ``mamba_ssm``, ``causal_conv1d`` or ``fla``
when they are importable, and through its own PyTorch fallbacks otherwise. The tests compare with the fallbacks:
:func:`force_torch_fallback` makes those packages unimportable (``sys.modules[name] = None``) before the modeling
modules are imported, and reloads a modeling module imported earlier while a kernel package was importable.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys

#: the kernel packages transformers prefers to its PyTorch paths for these models
KERNEL_PACKAGES = ("mamba_ssm", "causal_conv1d", "fla")
#: the modeling modules whose kernels come from them
MODELING = (
    "mamba2",
    "qwen3_next",
    "falcon_h1",
    "jamba",
    "lfm2",
    "lfm2_moe",
    "qwen3_5",
    "qwen3_5_moe",
    "olmo_hybrid",
    "kimi_linear",
    "minimax",
    "bamba",
    "granitemoehybrid",
    "nemotron_h",
    "bailing_hybrid",
)


def force_torch_fallback() -> None:
    """Make the kernel packages unimportable, so transformers' recurrent models run their PyTorch fallback."""
    available = [
        n
        for n in KERNEL_PACKAGES
        if sys.modules.get(n) is not None or (n not in sys.modules and importlib.util.find_spec(n))
    ]
    for name in KERNEL_PACKAGES:
        sys.modules[name] = None  # import now raises ImportError: transformers keeps its torch functions
    for model in MODELING if available else ():
        module = sys.modules.get(f"transformers.models.{model}.modeling_{model}")
        if module is not None:  # bound to a kernel when it was imported: bind again
            importlib.reload(module)

"""``weight_formats``: decoding with bfloat16 or int8 linear weights (``generate(weights=...)``, ``modkit generate
--weights``) runs through the component to finite logits.

:func:`~modkit.inference.weights.quantize_linears` replaces every ``nn.Linear`` of a model by a ``BFloat16Linear``
or an ``Int8Linear``, which keep the layer's forward but not a float32 ``weight`` tensor (an ``Int8Linear`` has none
at all). A component that reads a linear's weight itself (per-head views of it, a product in float32, a clamp)
declares it in ``matrix_weights`` (:func:`~modkit.inference.weights.matrix_weights`) and the conversion leaves that
layer as built; an undeclared read breaks decoding (an ``Int8Linear`` has no ``weight``; a bfloat16 one mixes
dtypes in the product).

The logits are not compared with float32 ones: both converted layers round the activations to bfloat16 too, and a
top-k router of a tiny random model then picks other experts for some tokens (measured over the built-ins: max |Δ|
0.03-0.09 of logits of scale 1 where the routing holds, up to 2.3 where it flips). What holds whatever the numbers:
the conversion and the decode run, the logits are finite, and every declared weight is still the float32 tensor it
was built as.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from modkit.core.config import ComponentConfig
from modkit.core.registry import Component
from modkit.inference.weights import declared_matrix_weights, matrix_weights, quantize_linears
from ..harness import Bench
from .base import CheckFailed, CheckSkipped, error_detail, nonfinite

#: the formats ``generate(weights=...)`` converts to
FORMATS = ("int8", "bfloat16")

#: a prompt of 12 tokens, then 4 decoded one at a time from the cache
PROMPT, STEPS = 12, 4

WEIGHT_FORMATS_SUMMARY = (
    "decoding with bfloat16 and int8 linear weights runs to finite logits, the declared matrix_weights kept as "
    "built; every matrix_weights name resolves"
)


def applies_weight_formats(entry: Component, config: ComponentConfig) -> Optional[str]:
    """Every component (its tiny model decodes; one without a linear layer is reported skipped)."""
    return None


def _logits(model: nn.Module, ids: torch.Tensor, cached: bool) -> torch.Tensor:
    """The logits of ``ids``: a prefill of :data:`PROMPT` tokens and single-token steps from the cache when
    ``cached``, else one forward."""
    with torch.no_grad():
        if not cached:
            return model(ids).logits
        cache = model.new_cache()
        parts = [model(ids[:, :PROMPT], cache=cache).logits]
        parts += [model(ids[:, t : t + 1], cache=cache).logits for t in range(PROMPT, ids.shape[1])]
    return torch.cat(parts, dim=1)


def check_weight_formats(bench: Bench) -> str:
    """For ``int8`` and ``bfloat16``: the tiny model converted by ``quantize_linears`` decodes (a prefill of
    :data:`PROMPT` tokens, then :data:`STEPS` single-token steps from the cache where its float32 build can, else one
    forward); the decode must run, its logits be finite, and every weight a module declares in ``matrix_weights`` be
    the same float32 tensor, unconverted.

    Catches: a component that reads an ``nn.Linear``'s weight itself without declaring it in ``matrix_weights``
    (``undeclared_matrix``: a latent attention that views ``kv_b_proj.weight`` per head fails on an int8 layer,
    which has no ``weight``, and on a bfloat16 one mixes dtypes); a ``matrix_weights`` name that resolves to
    nothing (the read it was meant for is then converted after all). Source: weight-only quantization replaces a
    layer's forward, never the tensors other code reads (gpt-fast's ``WeightOnlyInt8Linear``, torchao's
    ``quantize_``), so whatever reads the tensors must keep them.
    """
    reference = bench.build()[0].eval()
    bad = declared_matrix_weights(reference)[1]
    if bad:
        raise CheckFailed(
            f"matrix_weights names {', '.join(map(repr, bad))}, which resolve to no parameter: name the weight "
            "relative to the declaring module (e.g. 'kv_b_proj.weight')"
        )
    ids = bench.ids(2, PROMPT + STEPS, seed=31)
    try:  # decode from the cache where the float32 tiny model can
        _logits(reference, ids, True)
        cached = True
    except (ValueError, RuntimeError, NotImplementedError):
        cached = False
    report = []
    for fmt_name in FORMATS:
        model = bench.build()[0].eval()
        declared = matrix_weights(model)
        kept = {id(p): p.detach().clone() for p in model.parameters() if id(p) in declared}
        if quantize_linears(model, fmt_name) == 0:
            raise CheckSkipped("the tiny model has no nn.Linear to convert")
        try:
            got = _logits(model, ids, cached)
        except Exception as exc:  # noqa: BLE001 - any failure of the converted model is the finding
            raise CheckFailed(
                f"{fmt_name} weights: decoding the converted model fails ({error_detail(exc)}); a module that reads "
                "an nn.Linear's weight itself must name it in matrix_weights (e.g. matrix_weights = "
                "('kv_b_proj.weight',)), which keeps that layer float32 as built"
            ) from None
        if not bool(torch.isfinite(got).all()):
            raise CheckFailed(f"{fmt_name} weights: {nonfinite(got)} non-finite logits after the conversion")
        now = {id(p): p for p in model.parameters()}
        changed = [i for i, t in kept.items() if i not in now or now[i].dtype != t.dtype or not torch.equal(now[i], t)]
        if changed:
            raise CheckFailed(f"{fmt_name} weights: {len(changed)} declared matrix weight(s) converted or changed")
        report.append(f"{fmt_name} {'decode' if cached else 'forward'} ran, logits finite")
    return "; ".join(report) + f"; {len(kept)} declared matrix weight(s) kept float32"

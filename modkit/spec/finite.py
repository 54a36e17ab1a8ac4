"""A finite-forward check for ``modkit validate``: a tiny instance of a spec runs one forward pass, whose logits
must be finite.

The bounds on every float (:mod:`modkit.core.limits`) keep each number of a spec within what float32 math holds,
but some components combine several of them in math that can still overflow: exponentials, scans and products of
scales. The check runs for a spec that holds one of them (:func:`overflow_prone`):

* a component whose registry entry declares the ``overflow_prone`` capability (the built-ins: the recurrent mixers,
  exp(Δ·A) in a scan and softplus⁻¹ of the initial Δ; latent attention, YaRN's mscale² on the scores; mixtures of
  experts, routed scaling of the gate weights), and a mixer holding one;
* any component setting a field of :data:`PRONE_FIELDS` (soft-caps, softmax scales, Llama 4's temperature tuning,
  RoPE scalings, residual, FFN and mixer multipliers), and a spec setting a logit or embedding scale, a final
  soft-cap, muP, or an ``init_std`` other than 0.02.

Other specs are plain linear maps, normalisations and softmaxes of bounded numbers, and are not built.

The tiny instance (:func:`tiny_instance`) keeps every number of the spec and shrinks the sizes: one layer per
distinct layer of the spec (the block, then one override per other kind of layer), a vocabulary of at most 256,
a context of at most 64 and, while it has more than :data:`MAX_CHECK_PARAMS` parameters, half the width (with the
width fields scaled as ``modkit compare --widths`` scales them). It runs 16 tokens on the CPU in float32, in well
under a second. A spec whose tiny instance still does not fit, or does not validate at a smaller size, is not
checked (``None`` from :func:`finite_forward_problem`).
"""

from __future__ import annotations

import json
from typing import Any, Optional

from modkit.core.errors import ModkitError, SpecError

#: component fields whose non-default values scale scores, activations or frequencies (see the module docstring)
PRONE_FIELDS = (
    "logit_softcap",
    "softmax_scale",
    "temperature_tuning",
    "scaling",
    "residual_multiplier",
    "gate_multiplier",
    "output_multiplier",
    "in_multipliers",
    "out_multipliers",
    "projection_multipliers",
    "routed_scaling_factor",
)
#: spec fields whose non-default values do
PRONE_SPEC_FIELDS = ("logit_scale", "final_logit_softcap", "embedding_scale", "parametrization")
#: the most parameters a tiny instance may have (float32: 16 MB)
MAX_CHECK_PARAMS = 4_000_000
#: tokens of the checked forward pass
CHECK_TOKENS = 16


def overflow_prone(spec, registry=None) -> list[str]:
    """The JSON paths of what makes ``spec`` (a validated :class:`~modkit.spec.ModelSpec`) worth a finite-forward
    check (see the module docstring: a component declaring ``overflow_prone``, a field of :data:`PRONE_FIELDS` off
    its default, a spec field of :data:`PRONE_SPEC_FIELDS`); empty when nothing does."""
    from modkit.core.registry import get_registry
    from modkit.spec.models import iter_configs

    reg = registry or get_registry()

    found = [name for name in PRONE_SPEC_FIELDS if getattr(spec, name, None) is not None]
    if spec.init_std != 0.02:
        found.append("init_std")
    for path, cfg in iter_configs(spec):
        if reg.entry_for_config(cfg).capabilities.get("overflow_prone"):
            found.append(path)
            continue
        fields = type(cfg).model_fields
        found += [
            f"{path}.{name}"
            for name in PRONE_FIELDS
            if name in fields and getattr(cfg, name) != fields[name].get_default(call_default_factory=True)
        ]
    return list(dict.fromkeys(found))


def _distinct_layers(spec) -> list[Any]:
    """One :class:`~modkit.spec.models.LayerSpec` per distinct layer of ``spec``, in layer order; a layer without
    an FFN first (an override can replace an FFN, not remove one)."""
    seen: dict[str, Any] = {}
    for i in range(spec.n_layers):
        layer = spec.layer(i)
        key = json.dumps(
            [
                None if c is None else c.model_dump(mode="json")
                for c in (layer.attention, layer.ffn, layer.norm, layer.placement, layer.position)
            ],
            sort_keys=True,
        )
        seen.setdefault(key, layer)
    layers = list(seen.values())
    return sorted(layers, key=lambda layer: layer.ffn is not None)


def _dump(cfg) -> Any:
    return None if cfg is None else cfg.model_dump(mode="json")


def tiny_instance(spec, registry=None) -> Optional[dict]:
    """A small spec dict with every number of ``spec`` and small sizes (see the module docstring), or ``None`` when
    none validates within :data:`MAX_CHECK_PARAMS` parameters."""
    from modkit.experiments.scaling import resize
    from modkit.nn.build import count_params
    from modkit.spec.load import load_spec

    layers = _distinct_layers(spec)
    data = spec.to_dict()
    first = layers[0]
    data["block"] = {
        "attention": _dump(first.attention),
        "ffn": _dump(first.ffn),
        "norm": _dump(first.norm),
        "placement": _dump(first.placement),
    }
    data.pop("mixer", None)
    data["overrides"] = [
        {
            "layers": [k],
            **{
                s: _dump(getattr(layer, s)) for s in ("attention", "norm", "placement") if getattr(layer, s) is not None
            },
            **({"ffn": _dump(layer.ffn)} if layer.ffn is not None and layer.ffn != first.ffn else {}),
            **({"position": _dump(layer.position)} if layer.position != spec.position else {}),
        }
        for k, layer in enumerate(layers[1:], 1)
    ]
    data["n_layers"] = len(layers)
    data["vocab_size"] = min(spec.vocab_size, 256)
    candidates = [dict(data, max_seq_len=min(spec.max_seq_len, 64)), data]
    width = spec.d_model
    try:  # parameters grow about as the width squared: start near the width that fits
        full = count_params(load_spec(candidates[0], registry=registry), registry=registry)
        while width >= 64 and full > 4 * MAX_CHECK_PARAMS:
            width, full = width // 2, full // 4
    except (SpecError, ModkitError):
        pass
    while True:
        for candidate in candidates:
            sized = resize(candidate, d_model=width) if width != spec.d_model else candidate
            try:
                tiny = load_spec(sized, registry=registry)
            except (SpecError, ModkitError):
                continue
            if count_params(tiny, registry=registry) <= MAX_CHECK_PARAMS:
                return tiny.to_dict()
        if width < 32:
            return None
        width //= 2


def finite_forward_problem(spec, registry=None) -> Optional[str]:
    """Run the finite-forward check of ``spec`` (a validated :class:`~modkit.spec.ModelSpec`): ``None`` when its
    tiny instance's logits are finite, when it is not overflow-prone, or when no tiny instance fits; else a message
    naming what made it prone, the tiny instance and the first layer whose output is not finite."""
    import torch

    from modkit.nn.build import build

    prone = overflow_prone(spec, registry)
    if not prone:
        return None
    tiny = tiny_instance(spec, registry)
    if tiny is None:
        return None
    with torch.random.fork_rng(devices=[]):
        model = build(tiny, device="cpu", seed=0, registry=registry).eval()
        ids = torch.randint(
            0,
            tiny["vocab_size"],
            (1, min(CHECK_TOKENS, tiny["max_seq_len"])),
            generator=torch.Generator().manual_seed(0),
        )
        bad: list[int] = []
        hooks = [
            block.register_forward_hook(
                lambda _m, _i, out, k=k: (
                    bad.append(k) if not torch.isfinite(out[0] if isinstance(out, tuple) else out).all() else None
                )
            )
            for k, block in enumerate(model.layers)
        ]
        try:
            with torch.no_grad():
                logits = model(ids).logits
        finally:
            for h in hooks:
                h.remove()
    if torch.isfinite(logits).all():
        return None
    where = (
        f"layer {bad[0]} of it (of {tiny['n_layers']}) is the first whose output is not finite"
        if bad
        else ("every layer's output is finite, the head's is not")
    )
    return (
        f"a tiny instance of this spec (d_model {tiny['d_model']}, one layer per distinct layer, every scale and "
        f"init of the spec kept) gives non-finite logits on its first forward pass: {where}. The spec's numbers that "
        f"can overflow together: {', '.join(prone)}; bring them closer to published values"
    )

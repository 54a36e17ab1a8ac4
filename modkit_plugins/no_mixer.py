"""``none``: the token-mixer slot left empty, so that a block is its FFN alone.

A block is a token mixer then an FFN; ``"ffn": null`` makes a block that is its mixer alone (Mamba-2). This is the
other half: with ``{"type": "none"}`` in the mixer slot the placement builds no norm for the mixer and skips its
sublayer (capability ``absent``), so a ``pre`` block computes ``x + ffn(ffn_norm(x))`` and nothing else. Nemotron-H
(transformers ``NemotronHBlock``) is built of such single-sublayer blocks: each layer is a Mamba-2 mixer, an
attention, an MLP or a mixture, one norm and one residual add; its MLP and mixture layers are blocks with the mixer
``none``.

The module has no parameters, keeps nothing in the cache and, if called, returns zeros ``[batch, seq, d_model]``
(what an absent sublayer adds to the residual stream), so tools that walk the blocks' mixers (cache layout, costs,
traces, tensor-parallel plans) see an empty mixer.

References: NVIDIA 2025, Nemotron-H: A Family of Accurate and Efficient Hybrid Mamba-Transformer Models
(arXiv:2504.03624), its blocks of one sublayer each; transformers ``NemotronHBlock`` (modeling_nemotron_h.py, read,
not copied).
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor, nn

from modkit.plugin import AttentionInputs, BuildContext, CacheSpec, Component, ComponentConfig, Workload


class NoMixerConfig(ComponentConfig):
    """Config of ``none``: no token mixer (the block is its FFN alone)."""

    type: Literal["none"] = "none"

    def position_geometry(self, ctx):
        """No queries or keys for a position scheme."""
        return None


class NoMixer(nn.Module):
    """The empty token mixer: no parameters, no cache state. ``forward(x [batch, seq, d_model], inputs) -> zeros``
    of the same shape; a placement never calls it (capability ``absent``: it skips the mixer's sublayer)."""

    def __init__(self, ctx: BuildContext):
        super().__init__()
        self.d_model = ctx.d_model

    def cache_spec(self) -> CacheSpec:
        """Nothing per token, nothing per sequence."""
        return CacheSpec(())

    def head_layout(self) -> dict[str, tuple[int, int]]:
        """No heads."""
        return {}

    def forward(self, x: Tensor, inputs: AttentionInputs) -> Tensor:
        """``x [batch, seq, d_model]`` → zeros of the same shape (nothing added to the residual stream)."""
        return torch.zeros_like(x)


def _flops(cfg: NoMixerConfig, ctx: BuildContext, work: Workload) -> dict[str, int]:
    """No matrix products."""
    return {}


#: what a placement reads to leave the mixer's sublayer and its norms out
ABSENT = "absent"


def is_absent(module: nn.Module) -> bool:
    """Whether a built token mixer declares capability ``absent`` (the ``none`` mixer): its block has no mixer
    sublayer."""
    return bool((getattr(module, "modkit_capabilities", None) or {}).get(ABSENT))


#: what a placement reads to put no norm before the mixer (it holds its own)
OWN_NORM = "own_norm"


def owns_norm(module: nn.Module) -> bool:
    """Whether a built token mixer declares capability ``own_norm`` (``side_input``): it normalises its own input,
    so its placement hands it the residual stream without a norm."""
    return bool((getattr(module, "modkit_capabilities", None) or {}).get(OWN_NORM))


NO_MIXER = Component(
    kind="mixer",
    type="none",
    config=NoMixerConfig,
    factory=lambda cfg, ctx: NoMixer(ctx),
    description="No token mixer: the placement builds no norm for it and skips its sublayer, so the block is its FFN "
    "alone (Nemotron-H's MLP and mixture layers). No parameters, no cache. [batch, seq, d_model] -> zeros.",
    reference="NVIDIA 2025, Nemotron-H, arXiv:2504.03624; transformers NemotronHBlock (modeling_nemotron_h.py)",
    capabilities={
        ABSENT: True,
        "stateless": True,
        "causal_safe": True,
        "kv_cache": True,
        "compile_safe": True,
        "document_mask": True,
    },
    param_count=lambda cfg, ctx: 0,
    flops=_flops,
    math=r"""The block has no mixer sublayer: with the ``pre`` placement, $y = x + \mathrm{FFN}(N_2(x))$.""",
    example={"type": "none"},
)

"""Parameter roles (:mod:`modkit.core.roles`): every parameter of every built-in has one, the counts are exact, and a
third-party parameter without one is a clear error (in training, in ``param_roles`` and in the contract kit)."""

from __future__ import annotations

import sys
import types
from typing import Literal

import pytest
import torch
from torch import nn

import modkit
from modkit.core.roles import ROLES, RoleError, check_shapes, param_roles, role_table
from modkit.testing import check_component
from modkit.train import decay_groups

from conftest import SPECS, tiny_spec

MOE = {
    **tiny_spec(),
    "tie_embeddings": False,
    "position": {"type": "learned"},
    "block": {
        "attention": {"type": "gqa", "n_heads": 4, "n_kv_heads": 2, "q_bias": True},
        "ffn": {
            "type": "moe",
            "n_experts": 4,
            "top_k": 2,
            "expert": {"type": "mlp", "d_ff": 16},
            "router": {"type": "topk", "renormalize": True, "bias": True},
        },
        "norm": {"type": "layernorm"},
        "placement": {"type": "pre"},
    },
    "final_norm": {"type": "layernorm"},
    "lm_head_bias": True,
}


@pytest.mark.parametrize("path", sorted(SPECS.glob("*.json")), ids=lambda p: p.stem)
def test_every_parameter_of_every_shipped_spec_has_a_role(path):
    model = modkit.build(path, device="meta")
    roles = param_roles(model)
    assert set(roles) == {n for n, _ in model.named_parameters()}
    assert check_shapes(model, roles) == []


def test_roles_of_a_model_with_every_builtin_role():
    model = modkit.build(MOE, device="meta")
    roles = param_roles(model)
    d, v, L, t, e, f = 32, 64, 2, 64, 4, 16
    assert (
        roles["embed.weight"] == "embedding" and roles["lm_head.weight"] == "head" and roles["lm_head.bias"] == "bias"
    )
    assert roles["positions.0.weight"] == "position"
    assert roles["layers.0.attention.q_proj.weight"] == "hidden" and roles["layers.0.attention.q_proj.bias"] == "bias"
    assert roles["layers.0.ffn.router.proj.weight"] == "router" and roles["layers.0.ffn.router.proj.bias"] == "bias"
    assert roles["layers.0.ffn.experts.up"] == "expert" and roles["layers.0.ffn.experts.up_bias"] == "bias"
    assert roles["layers.0.attn_norm.weight"] == "norm_gain" and roles["layers.0.attn_norm.bias"] == "bias"
    table = role_table(model)
    kv = 2 * 8
    assert table == {
        "embedding": {"tensors": 1, "values": v * d},
        "position": {"tensors": 1, "values": t * d},
        "hidden": {"tensors": 4 * L, "values": L * (2 * d * d + 2 * d * kv)},
        "bias": {
            "tensors": L * (1 + 1 + 2 + 2) + 2,  # q_bias, router bias, experts' 2, 2 norms' beta; final norm, head
            "values": L * (d + e + e * (f + d) + 2 * d) + d + v,
        },
        "router": {"tensors": L, "values": L * e * d},
        "expert": {"tensors": 2 * L, "values": L * 2 * e * d * f},
        "norm_gain": {"tensors": 2 * L + 1, "values": (2 * L + 1) * d},
        "head": {"tensors": 1, "values": v * d},
    }
    assert sum(r["values"] for r in table.values()) == modkit.count_params(MOE)


#: one model holding every component variant that owns parameters beyond nn.Linear defaults: attention sinks and a
#: per-head QK-norm gain, the clamped SwiGLU with biases, the parallel placement with separate norms (layer 0); latent
#: attention with a low-rank query and biases, a sigmoid router with its correction bias (a buffer), a shared expert
#: and its gate (layer 1); an L2 QK-norm without parameters (layer 2)
VARIANTS = {
    **tiny_spec(),
    "n_layers": 3,
    "tie_embeddings": False,
    "overrides": [
        {
            "layers": [0],
            "attention": {
                "type": "gqa",
                "n_heads": 4,
                "n_kv_heads": 2,
                "sinks": True,
                "qk_norm": {"type": "rmsnorm", "eps": 1e-6},
                "qk_norm_scope": "each_head",
            },
            "ffn": {"type": "swiglu_clamped", "d_ff": 16, "bias": True},
            "placement": {"type": "parallel", "shared_norm": False},
        },
        {
            "layers": [1],
            "attention": {
                "type": "mla",
                "n_heads": 4,
                "q_lora_rank": 16,
                "kv_lora_rank": 16,
                "qk_nope_head_dim": 8,
                "qk_rope_head_dim": 4,
                "v_head_dim": 8,
                "latent_norm": {"type": "rmsnorm"},
                "bias": True,
            },
            "ffn": {
                "type": "moe",
                "n_experts": 4,
                "top_k": 2,
                "expert": {"type": "swiglu", "d_ff": 16},
                "shared": {"type": "swiglu", "d_ff": 16},
                "shared_gate": True,
                "router": {"type": "sigmoid_topk", "correction_bias": True, "renormalize": True},
            },
        },
        {"layers": [2], "attention": {"type": "gqa", "n_heads": 4, "n_kv_heads": 2, "qk_norm": {"type": "l2norm"}}},
    ],
}


def test_roles_of_every_component_variant():
    model = modkit.build(VARIANTS, device="meta")
    roles = param_roles(model)
    assert check_shapes(model, roles) == []
    d, v, f, e, kv = 32, 64, 16, 4, 16  # d_model, vocab, d_ff of the small ffns, experts, n_kv_heads * head_dim
    a = "layers.0.attention."
    assert roles[a + "sinks"] == "vector" and roles[a + "q_norm.weight"] == "norm_gain"
    assert list(model.get_parameter(a + "q_norm.weight").shape) == [4, 8]  # one gain per head
    assert roles["layers.0.ffn.gate.bias"] == "bias" and roles["layers.0.ffn_norm.weight"] == "norm_gain"
    m = "layers.1.attention."
    assert {
        roles[m + n] for n in ("q_a_proj.weight", "q_b_proj.weight", "kv_a_proj_with_mqa.weight", "kv_b_proj.weight")
    } == {"hidden"}
    assert roles[m + "q_a_layernorm.weight"] == roles[m + "kv_a_layernorm.weight"] == "norm_gain"
    assert roles["layers.1.ffn.router.proj.weight"] == "router" and roles["layers.1.ffn.shared_gate.weight"] == "router"
    assert roles["layers.1.ffn.shared.up.weight"] == "hidden" and roles["layers.1.ffn.experts.down"] == "expert"
    # the selection-only correction bias is a buffer the training loop moves, never a parameter an optimizer steps
    assert "layers.1.ffn.router.correction_bias" in dict(model.named_buffers()) and not any(
        "correction" in n for n in roles
    )
    assert not any(n.startswith("layers.2.attention.") and "norm" in n for n in roles)  # l2norm has no gain
    mla_hidden = d * 16 + 16 * 4 * 12 + d * (16 + 4) + 16 * 4 * (8 + 8) + 4 * 8 * d
    gqa_hidden = 2 * d * d + 2 * d * kv
    assert role_table(model) == {
        "embedding": {"tensors": 1, "values": v * d},
        "head": {"tensors": 1, "values": v * d},
        "hidden": {
            "tensors": 4 + 3 + 5 + 3 + 4 + 3,
            "values": gqa_hidden + 3 * d * f + mla_hidden + 3 * d * f + gqa_hidden + 3 * d * 64,
        },
        "bias": {"tensors": 3 + 3, "values": (2 * f + d) + (16 + 20 + d)},
        "norm_gain": {"tensors": 2 + 2 + 2 + 2 + 2 + 1, "values": (4 * 8 + 2 * 8) + 6 * d + 2 * 16 + d},
        "vector": {"tensors": 1, "values": 4},
        "router": {"tensors": 2, "values": e * d + d},
        "expert": {"tensors": 3, "values": 3 * e * d * f},
    }
    assert sum(r["values"] for r in role_table(model).values()) == modkit.count_params(VARIANTS)


def test_a_declared_optional_part_that_is_switched_off_is_ignored():
    # MoE declares its shared gate's role as a class attribute; without a shared expert the gate is None
    roles = param_roles(modkit.build(MOE, device="meta"))
    assert not any("shared" in n for n in roles)


def test_muon_steps_matrices_and_leaves_sinks_routers_and_gates_to_adamw():
    from modkit.train import TrainConfig
    from modkit.train.optim import build_optimizer

    model = modkit.build(VARIANTS, device="meta")
    opt = build_optimizer(model, model.spec, TrainConfig(optimizer={"type": "muon"}, lr=1e-3))
    roles = param_roles(model)
    ids = {id(p): n for n, p in model.named_parameters()}
    by_part = {}
    for part in opt.optimizers:
        by_part.setdefault(type(part).__name__, set()).update(
            roles[ids[id(p)]] for g in part.param_groups for p in g["params"]
        )
    assert by_part == {
        "Muon": {"hidden"},
        "StackedMuon": {"expert"},
        "AdamW": {"embedding", "head", "bias", "norm_gain", "vector", "router"},
    }


def test_a_tied_head_is_the_embedding_and_its_bias_a_bias():
    roles = param_roles(modkit.build({**tiny_spec(), "tie_embeddings": True, "lm_head_bias": True}, device="meta"))
    assert roles["embed.weight"] == "embedding" and roles["lm_head_bias"] == "bias" and "lm_head.weight" not in roles


def test_weight_decay_reads_roles():
    model = modkit.build(MOE, device="meta")
    decay, no_decay = decay_groups(model, 0.1)
    roles = param_roles(model)
    ids = {id(p): n for n, p in model.named_parameters()}
    assert {roles[ids[id(p)]] for p in decay["params"]} == {
        "embedding",
        "position",
        "hidden",
        "router",
        "expert",
        "head",
    }
    assert {roles[ids[id(p)]] for p in no_decay["params"]} == {"bias", "norm_gain"}
    # the rule p.dim() >= 2 decayed the stacked expert biases [n_experts, d_ff]; roles do not
    assert model.layers[0].ffn.experts.up_bias.dim() == 2 and any(
        p is model.layers[0].ffn.experts.up_bias for p in no_decay["params"]
    )


@pytest.mark.parametrize("entry", modkit.get_registry().components(), ids=lambda c: f"{c.kind}/{c.type}")
def test_the_kit_finds_a_role_for_every_builtin_parameter(entry):
    """Every built-in model component's parameters have roles; the kinds outside a model (sampling, optimizers,
    trackers) are skipped by the check itself, saying so."""
    (result,) = check_component(entry.kind, entry.type, checks=["param_roles"])
    assert result.status in ("passed", "skipped"), str(result)
    if result.status == "skipped":
        assert result.detail == "the component has no parameters" or result.detail.startswith(
            "applies to model components"
        ), result.detail


# ------------------------------------------------------------------------------------------------ third parties


class ScaleConfig(modkit.ComponentConfig):
    """Config of ``scalenorm``."""

    type: Literal["scalenorm"] = "scalenorm"


class ScaleNorm(nn.Module):
    """``g * x / ||x||`` with a scalar ``g`` and no role declared (the fault under test)."""

    def __init__(self):
        super().__init__()
        self.g = nn.Parameter(torch.empty(()))

    def forward(self, x):
        return self.g * x / x.norm(dim=-1, keepdim=True).clamp(min=1e-5)

    def init_weights(self, init):
        init.ones_(self.g)


def _plugin(name: str, module_cls, roles=None):
    cls = type(module_cls.__name__, (module_cls,), {} if roles is None else {"param_roles": roles})
    mod = types.ModuleType(name)

    @modkit.hookimpl
    def register_components(register):
        register(
            modkit.Component(
                kind="norm",
                type="scalenorm",
                config=ScaleConfig,
                factory=lambda cfg, ctx: cls(),
                description="ScaleNorm. [batch, seq, d] -> [batch, seq, d].",
            )
        )

    mod.register_components = register_components
    sys.modules[name] = mod
    return mod


@pytest.fixture
def registered():
    reg = modkit.get_registry()
    names = []

    def add(name, roles=None):
        reg.register_plugin(_plugin(name, ScaleNorm, roles), name)
        names.append(name)

    yield add
    for n in names:
        reg.unregister_plugin(n)
        sys.modules.pop(n, None)


def test_an_undeclared_role_is_inferred_in_training_and_refused_by_the_kit(registered, tmp_path):
    from modkit.core import roles as roles_module
    from modkit.core.roles import RoleWarning

    registered("my-norms")
    spec = {**tiny_spec(), "final_norm": {"type": "scalenorm"}}
    model = modkit.build(spec, device="meta")
    with pytest.raises(RoleError) as info:
        param_roles(model, strict=True)
    message = str(info.value)
    assert message.startswith(
        "parameter 'final_norm.g' [] of norm/scalenorm (plugin my-norms) has no declared role: give ScaleNorm a "
        "param_roles = {'g': 'vector'} ('norm_gain' or 'bias' where one fits, roles: hidden, expert, embedding, "
    )
    (result,) = check_component("norm", "scalenorm", checks=["param_roles"])
    assert result.failed and "has no declared role" in result.detail
    # training infers the convention (a scalar: 'vector'), warning once for the type
    from modkit.train.optim import build_optimizer
    from modkit.train import TrainConfig

    roles_module._INFERRED_WARNED.discard("norm/scalenorm (plugin my-norms)")
    built = modkit.build(spec, seed=0)
    with pytest.warns(
        RoleWarning, match=r"^norm/scalenorm \(plugin my-norms\) declares no role for 'g' \[\] in final_norm"
    ):
        opt = build_optimizer(built, built.spec, TrainConfig())
    no_decay = [g for g in opt.param_groups if g["weight_decay"] == 0.0]
    assert any(p is built.final_norm.g for g in no_decay for p in g["params"])
    assert param_roles(built)["final_norm.g"] == "vector"


def test_declared_roles_pass_and_bad_declarations_are_named(registered):
    registered("good-norms", {"g": "norm_gain"})
    (result,) = check_component("norm", "scalenorm", checks=["param_roles"])
    assert result.status == "passed" and "norm_gain" in result.detail
    spec = {**tiny_spec(), "final_norm": {"type": "scalenorm"}}
    assert param_roles(modkit.build(spec, device="meta"))["final_norm.g"] == "norm_gain"


@pytest.mark.parametrize(
    "roles, message",
    [
        ({"g": "gain"}, "declares role 'gain' for 'g'; roles: hidden, expert"),
        ({"g": "norm_gain", "gg": "bias"}, "declares a role for 'gg', which is not one of its parameters (g)"),
        (
            {"g": "hidden"},
            # two layers of the pre-norm filler (attn_norm, ffn_norm) and the final norm: five scalenorms
            "'layers.0.attn_norm.g' [] (and 'g' in 4 more module(s) of norm/scalenorm (plugin bad-norms)) has role "
            "'hidden', which is 2-dimensional",
        ),
    ],
)
def test_the_kit_names_a_bad_declaration(registered, roles, message):
    registered("bad-norms", roles)
    (result,) = check_component("norm", "scalenorm", checks=["param_roles"])
    assert result.failed and message in result.detail, result.detail
    assert result.detail.count(message) == 1  # one sentence for the three modules of the type, not one each


def test_role_table_is_complete():
    assert set(ROLES) == {"hidden", "expert", "embedding", "position", "head", "router", "norm_gain", "bias", "vector"}
    assert {r.mup for r in ROLES.values()} == {"input", "hidden", "output", "readout", "vector"}
    assert [r.name for r in ROLES.values() if r.matrix] == ["hidden", "expert"]

"""A plugin written before parameter roles existed still trains (:mod:`modkit.core.roles`): its parameters take the
convention (matrices ``hidden``, the rest ``vector``) with one warning per component type, AdamW, Muon and μP follow
the inferred roles, the contract kit still fails it, and every run folder records which plugin and version provided
each component (:mod:`modkit.train.provenance`)."""

from __future__ import annotations

import json
import sys
import types
import warnings
from pathlib import Path
from typing import Literal

import pytest
import torch
from torch import nn

import modkit
from modkit.core import roles as roles_module
from modkit.core.roles import RoleError, RoleWarning, param_roles
from modkit.data import default_corpus, prepare
from modkit.testing import check_component
from modkit.train import train
from modkit.train.provenance import component_provenance, stamp_provenance
from modkit_plugins.attention import Attention, AttentionConfig

from conftest import tiny_spec

PLUGIN = "old-plugin"


class ScaleConfig(modkit.ComponentConfig):
    """Config of ``scalenorm``."""

    type: Literal["scalenorm"] = "scalenorm"


class ScaleNorm(nn.Module):
    """ScaleNorm (Nguyen & Salazar 2019): ``g * x / ||x||`` with one learned gain ``g [1]``; no ``param_roles``."""

    def __init__(self):
        super().__init__()
        self.g = nn.Parameter(torch.empty(1))

    def forward(self, x):
        return self.g * x / x.norm(dim=-1, keepdim=True).clamp(min=1e-5)

    def init_weights(self, init):
        init.constant_(self.g, 5.0)


class ReGLUConfig(modkit.ComponentConfig):
    """Config of ``reglu``."""

    type: Literal["reglu"] = "reglu"
    d_ff: int = 48


class ReGLU(nn.Module):
    """ReGLU (Shazeer 2020) with raw matrices ``w_in``, ``w_gate`` ``[d_ff, d]``, ``w_out`` ``[d, d_ff]`` and a gain
    ``[d_ff]`` on the hidden activation; no ``param_roles``."""

    def __init__(self, d: int, d_ff: int):
        super().__init__()
        self.w_in = nn.Parameter(torch.empty(d_ff, d))
        self.w_gate = nn.Parameter(torch.empty(d_ff, d))
        self.w_out = nn.Parameter(torch.empty(d, d_ff))
        self.gain = nn.Parameter(torch.empty(d_ff))

    def forward(self, x):
        h = torch.relu(x @ self.w_gate.T) * (x @ self.w_in.T) * self.gain
        return h @ self.w_out.T

    def init_weights(self, init):
        for w in (self.w_in, self.w_gate, self.w_out):
            init.normal_(w)
        init.ones_(self.gain)


class QKGainConfig(AttentionConfig):
    """Config of ``qkgain``: grouped-query attention with an RMS QK-norm of its own."""

    type: Literal["qkgain"] = "qkgain"


class _Gain(nn.Module):
    """RMS-normalise each head and scale it by a gain ``[head_dim]`` (a hand-written QK-norm, no role declared)."""

    def __init__(self, head_dim: int):
        super().__init__()
        self.g = nn.Parameter(torch.empty(head_dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.g

    def init_weights(self, init):
        init.ones_(self.g)


class QKGainAttention(Attention):
    """The built-in attention with :class:`_Gain` as its QK-norm: its ``param_roles`` (``sinks``) says nothing of the
    gains."""

    def __init__(self, cfg, ctx):
        super().__init__(cfg, ctx)
        self.q_norm, self.k_norm, self.qk_norm_scope = _Gain(self.head_dim), _Gain(self.head_dim), "head"


def _plugin() -> types.ModuleType:
    gqa = modkit.get_registry().get("attention", "gqa")
    mod = types.ModuleType("old_plugin")

    @modkit.hookimpl
    def register_components(register):
        register(
            modkit.Component(
                kind="norm",
                type="scalenorm",
                config=ScaleConfig,
                factory=lambda cfg, ctx: ScaleNorm(),
                description="ScaleNorm. [..., d] -> [..., d].",
            )
        )
        register(
            modkit.Component(
                kind="ffn",
                type="reglu",
                config=ReGLUConfig,
                factory=lambda cfg, ctx: ReGLU(ctx.d_model, cfg.d_ff),
                description="ReGLU. [batch, seq, d_model] -> [batch, seq, d_model].",
            )
        )
        register(
            modkit.Component(
                kind="attention",
                type="qkgain",
                config=QKGainConfig,
                factory=lambda cfg, ctx: QKGainAttention(cfg, ctx),
                description="Attention with a QK gain. [batch, seq, d_model] -> [batch, seq, d_model].",
                capabilities=dict(gqa.capabilities),
                flops=gqa.flops,
                example={"type": "qkgain", "n_heads": 4, "n_kv_heads": 2},
            )
        )

    mod.register_components = register_components
    return mod


@pytest.fixture
def old_plugin():
    """The plugin registered globally (training reads the global registry) for one test, and the per-process
    warning memory cleared so each test sees its own warnings."""
    reg = modkit.get_registry()
    sys.modules["old_plugin"] = _plugin()
    reg.register_plugin(sys.modules["old_plugin"], PLUGIN)
    roles_module._INFERRED_WARNED.clear()
    yield
    reg.unregister_plugin(PLUGIN)
    sys.modules.pop("old_plugin", None)
    roles_module._INFERRED_WARNED.clear()


SPEC = {
    **tiny_spec(max_seq_len=16),
    "block": {
        "attention": {"type": "qkgain", "n_heads": 4, "n_kv_heads": 2},
        "ffn": {"type": "reglu", "d_ff": 48},
        "norm": {"type": "scalenorm"},
        "placement": {"type": "pre"},
    },
    "final_norm": {"type": "scalenorm"},
}

#: the three warnings, one per component type, exactly as written
WARNINGS = [
    "norm/scalenorm (plugin old-plugin) declares no role for 'g' [1] in 5 modules: layers.0.attn_norm, "
    "layers.0.ffn_norm, layers.1.attn_norm, layers.1.ffn_norm, ... (5 in all); modkit inferred {'g': 'vector'} by "
    "the usual convention (matrices 'hidden', vectors and scalars 'vector'), and weight decay, Muon and muP follow "
    "these inferred roles. The contract kit's param_roles check fails until they are declared: give ScaleNorm a "
    "param_roles = {'g': 'vector'} ('norm_gain' or 'bias' where one fits; see 'Parameter roles' in "
    "docs/guides/writing-a-plugin.md)",
    "attention/qkgain (plugin old-plugin) declares no role for 'q_norm.g' [8], 'k_norm.g' [8] in 2 modules: "
    "layers.0.attention, layers.1.attention; modkit inferred {'q_norm.g': 'vector', 'k_norm.g': 'vector'} by the "
    "usual convention (matrices 'hidden', vectors and scalars 'vector'), and weight decay, Muon and muP follow these "
    "inferred roles. The contract kit's param_roles check fails until they are declared: add 'q_norm.g': 'vector', "
    "'k_norm.g': 'vector' to QKGainAttention.param_roles ('norm_gain' or 'bias' where one fits; see 'Parameter "
    "roles' in docs/guides/writing-a-plugin.md)",
    "ffn/reglu (plugin old-plugin) declares no role for 'w_in' [48, 32], 'w_gate' [48, 32], 'w_out' [32, 48], 'gain' "
    "[48] in 2 modules: layers.0.ffn, layers.1.ffn; modkit inferred {'w_in': 'hidden', 'w_gate': 'hidden', 'w_out': "
    "'hidden', 'gain': 'vector'} by the usual convention (matrices 'hidden', vectors and scalars 'vector'), and "
    "weight decay, Muon and muP follow these inferred roles. The contract kit's param_roles check fails until they "
    "are declared: give ReGLU a param_roles = {'w_in': 'hidden', 'w_gate': 'hidden', 'w_out': 'hidden', 'gain': "
    "'vector'} ('norm_gain' or 'bias' where one fits; see 'Parameter roles' in docs/guides/writing-a-plugin.md)",
]


def _role_warnings(caught) -> list[str]:
    return [str(w.message) for w in caught if issubclass(w.category, RoleWarning)]


def test_roles_are_inferred_with_one_warning_per_component_type(old_plugin):
    model = modkit.build(SPEC, device="meta")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        roles = param_roles(model)
        again = param_roles(model)  # once per type and process, not once per call
    assert _role_warnings(caught) == WARNINGS and roles == again
    assert roles["layers.1.ffn.w_in"] == roles["layers.1.ffn.w_out"] == "hidden"
    assert roles["layers.1.ffn.gain"] == roles["final_norm.g"] == roles["layers.0.attention.q_norm.g"] == "vector"
    assert roles["layers.0.attention.q_proj.weight"] == "hidden"  # nn.Linear defaults and declarations unchanged
    assert sum(r == "hidden" for r in roles.values()) == 2 * (4 + 3)


def test_strict_roles_refuse_with_one_sentence_per_component_type(old_plugin):
    model = modkit.build(SPEC, device="meta")
    with pytest.raises(RoleError) as info:
        param_roles(model, strict=True)
    message = str(info.value)
    assert message.count("has no declared role") == 3  # 3 component types, 19 parameters
    assert (
        "parameter 'layers.0.attn_norm.g' [1] of norm/scalenorm (plugin old-plugin) has no declared role, nor have "
        "the other 4 of that type ('g' [1] in 5 modules: layers.0.attn_norm, layers.0.ffn_norm, layers.1.attn_norm, "
        "layers.1.ffn_norm, ... (5 in all)): give ScaleNorm a param_roles = {'g': 'vector'}"
    ) in message
    assert (
        "parameter 'layers.0.ffn.w_in' [48, 32] of ffn/reglu (plugin old-plugin) has no declared role, nor have the "
        "other 7 of that type"
    ) in message
    assert "add 'q_norm.g': 'vector', 'k_norm.g': 'vector' to QKGainAttention.param_roles" in message


@pytest.mark.parametrize("kind, type_", [("norm", "scalenorm"), ("ffn", "reglu"), ("attention", "qkgain")])
def test_the_kit_still_fails_param_roles(old_plugin, kind, type_):
    (result,) = check_component(kind, type_, checks=["param_roles"])
    assert result.failed and f"of {kind}/{type_} (plugin old-plugin) has no declared role" in result.detail
    assert result.detail.count("has no declared role") == 1, result.detail


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("data")
    text = root / "head.txt"
    text.write_text(default_corpus().read_text()[:20_000])
    prepare([text], root / "prepared", tokenizer="char", show_progress=False)
    return root / "prepared"


def _train(data_dir: Path, run: Path, spec: dict, optimizer: dict) -> list[str]:
    """Two steps; the role warnings the run emitted."""
    roles_module._INFERRED_WARNED.clear()
    config = {
        "model": spec,
        "data": str(data_dir),
        "batch_size": 2,
        "seq_len": 16,
        "max_steps": 2,
        "warmup_steps": 1,
        "lr": 1e-3,
        "eval_interval": 2,
        "eval_batches": 1,
        "sample_tokens": 0,
        "device": "cpu",
        "seed": 0,
        "optimizer": optimizer,
    }
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = train(config, run, echo=lambda line: None)
    assert result.steps == 2 and torch.isfinite(torch.tensor(result.val_loss))
    return _role_warnings(caught)


MUP = {**SPEC, "parametrization": {"type": "mup", "base_d_model": 16}}


@pytest.mark.parametrize(
    "spec, optimizer",
    [(SPEC, {"type": "adamw"}), (SPEC, {"type": "muon"}), (MUP, {"type": "adamw"})],
    ids=["adamw", "muon", "mup"],
)
def test_a_plugin_without_roles_trains_warning_once_per_type(old_plugin, data_dir, tmp_path, spec, optimizer):
    assert _train(data_dir, tmp_path / "run", spec, optimizer) == WARNINGS
    last = modkit.load(tmp_path / "run" / "last")
    assert not torch.equal(last.layers[0].ffn.w_in, modkit.build(spec, seed=0).layers[0].ffn.w_in)


def test_muon_and_mup_use_the_inferred_roles(old_plugin):
    from modkit.train import TrainConfig
    from modkit.train.optim import build_optimizer

    model = modkit.build(MUP, device="meta")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RoleWarning)
        opt = build_optimizer(model, model.spec, TrainConfig(optimizer={"type": "muon"}, lr=1e-3))
    names = {id(p): n for n, p in model.named_parameters()}
    muon, adamw = opt.optimizers
    assert type(muon).__name__ == "Muon" and type(adamw).__name__ == "AdamW"
    in_muon = {names[id(p)] for g in muon.param_groups for p in g["params"]}
    assert {n for n in in_muon if ".ffn." in n} == {
        f"layers.{i}.ffn.{w}" for i in (0, 1) for w in ("w_in", "w_gate", "w_out")
    }
    in_adamw = {names[id(p)]: g for g in adamw.param_groups for p in g["params"]}
    # muP at m = 32 / 16 = 2: hidden matrices get lr x 1/2 (and decay x 2), vectors lr x 1 and no decay
    assert {g["lr_mult"] for g in muon.param_groups} == {0.5}
    assert in_adamw["final_norm.g"]["lr_mult"] == 1.0 and in_adamw["final_norm.g"]["weight_decay"] == 0.0
    assert in_adamw["layers.0.attention.q_norm.g"]["weight_decay"] == 0.0


def test_a_run_folder_records_each_components_plugin_and_version(old_plugin, data_dir, tmp_path):
    run = tmp_path / "run"
    _train(data_dir, run, SPEC, {"type": "adamw"})
    builtin = {"distribution": "modkit-lm", "version": modkit.__version__}
    expected = {
        "attention/qkgain": {"provider": PLUGIN, "distribution": None, "version": None},
        "ffn/reglu": {"provider": PLUGIN, "distribution": None, "version": None},
        "norm/scalenorm": {"provider": PLUGIN, "distribution": None, "version": None},
        "placement/pre": {"provider": "builtin-placement", **builtin},
        "position/rope": {"provider": "builtin-position", **builtin},
    }
    assert json.loads((run / "components.json").read_text()) == expected
    for spec_file in (run / "spec.json", run / "last" / "spec.json", run / "best" / "spec.json"):
        metadata = json.loads(spec_file.read_text())["metadata"]
        assert {k: v for k, v in metadata.items() if k.startswith("plugin:")} == {
            "plugin:attention/qkgain": PLUGIN,
            "plugin:ffn/reglu": PLUGIN,
            "plugin:norm/scalenorm": PLUGIN,
            "plugin:placement/pre": f"builtin-placement (modkit-lm {modkit.__version__})",
            "plugin:position/rope": f"builtin-position (modkit-lm {modkit.__version__})",
        }
    assert modkit.load(run / "last").spec.metadata["plugin:norm/scalenorm"] == PLUGIN


def test_provenance_of_builtins_and_of_a_plugin_with_a_distribution():
    spec = modkit.load_spec(tiny_spec())
    got = component_provenance(spec)
    assert got == {
        key: {"provider": provider, "distribution": "modkit-lm", "version": modkit.__version__}
        for key, provider in [
            ("attention/gqa", "builtin-attention"),
            ("ffn/swiglu", "builtin-ffn"),
            ("norm/rmsnorm", "builtin-norm"),
            ("placement/pre", "builtin-placement"),
            ("position/rope", "builtin-position"),
        ]
    }
    # a registry filled by hand (no entry-point metadata) still finds the built-ins' distribution from their module
    reg = modkit.Registry()
    for info in modkit.get_registry().plugins():
        reg.register_plugin(info.obj, info.name)
    assert component_provenance(spec, reg) == got
    stamped = stamp_provenance(spec.model_copy(update={"metadata": {"source": "test", "plugin:ffn/old": "x"}}))
    assert stamped.metadata == {
        "source": "test",
        **{f"plugin:{k}": f"{v['provider']} (modkit-lm {modkit.__version__})" for k, v in got.items()},
    }


def test_a_plugin_with_a_distribution_reports_it(old_plugin):
    reg = modkit.Registry()
    for info in modkit.get_registry().plugins():
        if info.name != PLUGIN:
            reg.register_plugin(info.obj, info.name)
    reg.register_plugin(_plugin(), "old-plugin-dist", distribution="old-plugin-pkg", version="0.9.2")
    spec = modkit.load_spec(SPEC, registry=reg)
    got = component_provenance(spec, reg)
    assert got["ffn/reglu"] == {"provider": "old-plugin-dist", "distribution": "old-plugin-pkg", "version": "0.9.2"}
    assert stamp_provenance(spec, reg).metadata["plugin:norm/scalenorm"] == "old-plugin-dist (old-plugin-pkg 0.9.2)"


def test_the_cli_shows_a_role_warning_as_one_line(capsys):
    from modkit.cli import _plugin_warnings_to_stderr

    with _plugin_warnings_to_stderr():
        warnings.simplefilter("always")
        warnings.warn("norm/scalenorm (plugin p) declares no role for 'g' [1] in final_norm", RoleWarning)
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == "modkit: warning: norm/scalenorm (plugin p) declares no role for 'g' [1] in final_norm\n"

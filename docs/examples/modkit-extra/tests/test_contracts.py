"""modkit-extra's own tests: the modkit contract kit on both components, their math, and a spec using them.

Run from this folder with ``pytest`` (after ``pip install -e .``, or from a plain checkout: the module is then
registered by hand). ``modkit check --plugin extra`` and ``pytest --modkit-contracts --modkit-plugin extra`` run
the same contract checks from the command line.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

import modkit
from modkit.testing import check_component

HERE = Path(__file__).resolve().parents[1]
SPEC = HERE / "specs" / "tiny-dyt-relu2.json"

try:
    import modkit_extra
except ImportError:  # a plain checkout that is not installed
    sys.path.insert(0, str(HERE))
    import modkit_extra


@pytest.fixture(scope="module")
def registry() -> modkit.Registry:
    """The process-wide registry if the package is installed, else one with the module registered by hand."""
    reg = modkit.get_registry()
    if "extra" not in {p.name for p in reg.plugins()}:
        reg = modkit.Registry()
        reg.load_entry_points()
        reg.register_plugin(modkit_extra, "extra")
    return reg


@pytest.mark.parametrize("kind, type_", [("norm", "dyt"), ("ffn", "relu2")])
def test_contracts(registry, kind, type_):
    results = check_component(kind, type_, registry=registry)
    failed = [r for r in results if r.status == "failed"]
    assert not failed, "\n".join(f"{r.check}: {r.detail}" for r in failed)
    assert sum(r.status == "passed" for r in results) >= 5


def test_dyt_math_and_dtype(registry):
    norm = registry.get("norm", "dyt")
    cfg = modkit.load_component("norm", {"type": "dyt", "alpha_init": 0.8}, registry=registry)
    ctx = modkit.BuildContext(d_model=8, n_layers=1, vocab_size=16, max_seq_len=8, registry=registry)
    module = norm.factory(cfg, ctx)
    module.init_weights(modkit.Init(seed=0, std=0.02))
    x = torch.randn(2, 3, 8) * 5
    torch.testing.assert_close(module(x), torch.tanh(0.8 * x))
    assert module(x.to(torch.bfloat16)).dtype == torch.bfloat16
    assert norm.param_count(cfg, ctx) == sum(p.numel() for p in module.parameters()) == 17
    per_head = norm.factory(cfg, modkit.BuildContext(8, 1, 16, 8, registry, dim=4))  # QK-norm width
    assert per_head.weight.shape == (4,)


def test_relu2_math(registry):
    ffn = registry.get("ffn", "relu2")
    cfg = modkit.load_component("ffn", {"type": "relu2", "d_ff": 16, "bias": True}, registry=registry)
    ctx = modkit.BuildContext(d_model=8, n_layers=1, vocab_size=16, max_seq_len=8, registry=registry)
    module = ffn.factory(cfg, ctx)
    x = torch.randn(2, 3, 8)
    expected = module.down(torch.relu(module.up(x)) ** 2)
    torch.testing.assert_close(module(x), expected)
    assert ffn.param_count(cfg, ctx) == sum(p.numel() for p in module.parameters()) == 2 * 8 * 16 + 16 + 8


def test_spec_builds_and_runs(registry):
    spec = modkit.load_spec(SPEC, registry=registry)
    model = modkit.build(spec, device="cpu", dtype="float32", seed=0, registry=registry)
    ids = torch.randint(0, spec.vocab_size, (2, 16))
    logits = model(ids).logits
    assert logits.shape == (2, 16, spec.vocab_size) and torch.isfinite(logits).all()
    assert modkit.count_params(spec, registry=registry) == sum(p.numel() for p in model.parameters())
    used = {(m.modkit_kind, m.modkit_type) for m in model.modules() if hasattr(m, "modkit_type")}
    assert {("norm", "dyt"), ("ffn", "relu2")} <= used

"""Optimizers as components (:mod:`modkit.train.optim`, ``modkit_plugins.optim``): each step equals its reference on a
tiny model (torch's own optimizer where it exists, the paper's formulas for Lion), configs validate strictly, μP sets
the documented multipliers, and a training run resumes bitwise with every optimizer."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

import modkit
from modkit import SpecError
from modkit.core.roles import param_roles
from modkit.testing import check_component
from modkit.train import TrainConfig, train
from modkit.train.optim import OptimizerChain, OptimizerError, build_optimizer
from modkit.train.plot import read_metrics
from modkit_plugins.optim import StackedMuon

from conftest import tiny_spec

#: every role but vector: learned positions, biases, LayerNorm, an untied head, a mixture of experts with a router
SPEC = {
    **tiny_spec(),
    "tie_embeddings": False,
    "position": {"type": "learned"},
    "block": {
        "attention": {"type": "gqa", "n_heads": 4, "n_kv_heads": 2, "q_bias": True},
        "ffn": {"type": "mlp", "d_ff": 64},
        "norm": {"type": "layernorm"},
        "placement": {"type": "pre"},
    },
    "overrides": [
        {
            "layers": [1],
            "ffn": {
                "type": "moe",
                "n_experts": 4,
                "top_k": 2,
                "expert": {"type": "swiglu", "d_ff": 16},
                "router": {"type": "topk", "renormalize": True},
            },
        }
    ],
    "final_norm": {"type": "layernorm"},
}
IDS = torch.randint(0, 64, (4, 17), generator=torch.Generator().manual_seed(0))
LR, WD = 3e-3, 0.1


def _model():
    return modkit.build(SPEC, seed=1)


def _grads(model):
    out = model(IDS[:, :-1])
    loss = F.cross_entropy(out.logits.reshape(-1, 64), IDS[:, 1:].reshape(-1)) + out.aux_loss
    loss.backward()


def _steps(model, opt, n=3, lr=LR):
    for _ in range(n):
        for g in opt.param_groups:
            g["lr"] = lr * g.get("lr_mult", 1.0)
        _grads(model)
        opt.step()
        opt.zero_grad(set_to_none=True)


def _ours(kind: dict, **fields):
    model = _model()
    cfg = TrainConfig(optimizer=kind, lr=LR, weight_decay=WD, **fields)
    return model, build_optimizer(model, model.spec, cfg)


def _by_role(model):
    roles = param_roles(model)
    params = dict(model.named_parameters())
    return {r: [params[n] for n, rr in roles.items() if rr == r] for r in sorted(set(roles.values()))}


def _decay_groups(model):
    """nanoGPT's two AdamW groups, written out by role (the reference's own grouping)."""
    roles = _by_role(model)
    decay = [
        p
        for n, p in model.named_parameters()
        if param_roles(model)[n] in ("hidden", "expert", "embedding", "position", "head", "router")
    ]
    rest = [p for n, p in model.named_parameters() if param_roles(model)[n] in ("bias", "norm_gain")]
    assert len(decay) + len(rest) == sum(len(v) for v in roles.values())
    return [{"params": decay, "weight_decay": WD}, {"params": rest, "weight_decay": 0.0}]


def _same(a, b):
    for (n, x), (_, y) in zip(a.named_parameters(), b.named_parameters()):
        assert torch.equal(x, y), n


def test_adamw_equals_torch_adamw():
    model, opt = _ours({"type": "adamw"})
    assert isinstance(opt, torch.optim.AdamW) and [g["lr_mult"] for g in opt.param_groups] == [1.0, 1.0]
    ref = _model()
    ref_opt = torch.optim.AdamW(_decay_groups(ref), lr=LR, betas=(0.9, 0.99), eps=1e-8, fused=True)
    _steps(model, opt)
    _steps(ref, ref_opt)
    _same(model, ref)


def test_muon_equals_torch_muon_on_hidden_matrices_and_adamw_on_the_rest():
    model, opt = _ours({"type": "muon"})
    assert isinstance(opt, OptimizerChain) and [type(o).__name__ for o in opt.optimizers] == [
        "Muon",
        "StackedMuon",
        "AdamW",
    ]
    ref = _model()
    roles = _by_role(ref)
    hidden = torch.optim.Muon(
        [{"params": roles["hidden"], "weight_decay": WD}],
        lr=LR,
        momentum=0.95,
        nesterov=True,
        adjust_lr_fn="match_rms_adamw",
    )
    # stacked experts: torch's Muon on each expert's [out, in] matrix (the slice's transpose), its own parameter
    slices = {id(p): [torch.nn.Parameter(p.detach()[e].T.clone()) for e in range(p.shape[0])] for p in roles["expert"]}
    experts = torch.optim.Muon(
        [{"params": [s for v in slices.values() for s in v], "weight_decay": WD}],
        lr=LR,
        momentum=0.95,
        nesterov=True,
        adjust_lr_fn="match_rms_adamw",
    )
    rest = [p for r, ps in roles.items() if r not in ("hidden", "expert") for p in ps]
    decay_rest = [p for r in ("embedding", "position", "head", "router") for p in roles.get(r, [])]
    adamw = torch.optim.AdamW(
        [
            {"params": [p for p in rest if any(p is q for q in decay_rest)], "weight_decay": WD},
            {"params": [p for p in rest if not any(p is q for q in decay_rest)], "weight_decay": 0.0},
        ],
        lr=LR,
        betas=(0.9, 0.99),
        eps=1e-8,
        fused=True,
    )
    _steps(model, opt)
    for _ in range(3):
        _grads(ref)
        for p in roles["expert"]:
            for e, s in enumerate(slices[id(p)]):
                s.grad = p.grad[e].T.clone()
        hidden.step()
        experts.step()
        adamw.step()
        with torch.no_grad():
            for p in roles["expert"]:
                for e, s in enumerate(slices[id(p)]):
                    p[e].copy_(s.T)
        ref.zero_grad(set_to_none=True)
    _same(model, ref)


def test_stacked_muon_refuses_matrices():
    with pytest.raises(ValueError, match=r"\[n, in, out\] stacks"):
        StackedMuon([torch.nn.Parameter(torch.zeros(3, 4))])


def test_lion_equals_the_papers_update():
    model, opt = _ours({"type": "lion", "beta1": 0.9, "beta2": 0.99})
    ref = _model()
    groups = _decay_groups(ref)
    m = {id(p): torch.zeros_like(p) for g in groups for p in g["params"]}
    _steps(model, opt)
    for _ in range(3):
        _grads(ref)
        with torch.no_grad():
            for g in groups:
                for p in g["params"]:  # Chen et al. 2023, Program 1
                    c = 0.9 * m[id(p)] + (1 - 0.9) * p.grad
                    p.copy_(p - LR * (torch.sign(c) + g["weight_decay"] * p))
                    m[id(p)] = 0.99 * m[id(p)] + (1 - 0.99) * p.grad
        ref.zero_grad(set_to_none=True)
    for (n, x), (_, y) in zip(model.named_parameters(), ref.named_parameters()):
        torch.testing.assert_close(x, y, rtol=0, atol=1e-6, msg=n)


def test_sgd_equals_torch_sgd():
    model, opt = _ours({"type": "sgd", "momentum": 0.9, "nesterov": True})
    ref = _model()
    ref_opt = torch.optim.SGD(_decay_groups(ref), lr=LR, momentum=0.9, nesterov=True)
    _steps(model, opt)
    _steps(ref, ref_opt)
    _same(model, ref)


@pytest.mark.parametrize(
    "bad, message",
    [
        ({"type": "adam"}, "unknown optimizer type 'adam'"),
        ({"type": "muon", "momentum": 1.5}, "momentum"),
        ({"type": "muon", "roles": ["embedding"]}, "roles"),
        ({"type": "sgd", "nesterov": True, "momentum": 0.0}, "nesterov needs momentum > 0"),
        ({"type": "lion", "beta3": 0.5}, "beta3"),
    ],
)
def test_optimizer_configs_are_validated(bad, message):
    from modkit.train import load_train_config

    with pytest.raises(SpecError, match="optimizer") as info:
        load_train_config({"optimizer": bad})
    assert message in str(info.value) and "Traceback" not in str(info.value)


def test_mup_sets_the_documented_multipliers():
    wide = {
        **SPEC,
        "d_model": 64,
        "block": {**SPEC["block"], "ffn": {"type": "mlp", "d_ff": 128}},
        "parametrization": {"type": "mup", "base_d_model": 16},
    }  # m = 4
    model = modkit.build(wide, device="meta")
    cfg = TrainConfig(optimizer={"type": "adamw"}, lr=LR, weight_decay=WD)
    groups = lambda c: {
        frozenset(g["roles"]): (g["lr_mult"], g["weight_decay"])
        for g in build_optimizer(model, model.spec, c).param_groups
    }
    # Adam: hidden and expert matrices lr / m (decay x m), the router (readout) likewise; the rest unchanged
    assert groups(cfg) == {
        frozenset({"embedding", "position", "head"}): (1.0, WD),
        frozenset({"hidden", "expert", "router"}): (0.25, pytest.approx(WD * 4)),
        frozenset({"bias", "norm_gain"}): (1.0, 0.0),
    }
    sgd = TrainConfig(optimizer={"type": "sgd"}, lr=LR, weight_decay=WD)
    assert groups(sgd) == {
        frozenset({"embedding", "position", "head"}): (4.0, pytest.approx(WD / 4)),
        frozenset({"hidden", "expert"}): (1.0, WD),
        frozenset({"router"}): (0.25, pytest.approx(WD * 4)),
        frozenset({"bias", "norm_gain"}): (4.0, 0.0),
    }


def test_an_optimizer_without_a_mup_rule_is_refused_for_a_mup_spec():
    reg = modkit.get_registry()
    entry = reg.get("optimizer", "adamw")
    spec = {**SPEC, "parametrization": {"type": "mup", "base_d_model": 16}}
    model = modkit.build(spec, device="meta")
    import dataclasses

    bare = dataclasses.replace(entry, capabilities={"sharded": True})
    reg._components[entry.key] = bare
    try:
        with pytest.raises(OptimizerError, match="declares no muP rule"):
            build_optimizer(model, model.spec, TrainConfig())
    finally:
        reg._components[entry.key] = entry


@pytest.mark.parametrize("kind", ["adamw", "muon", "lion", "sgd"])
def test_the_kit_passes_every_builtin_optimizer(kind):
    results = {r.check: r for r in check_component("optimizer", kind)}
    assert results["optimizer"].status == "passed", str(results["optimizer"])
    assert results["spec_roundtrip"].status == "passed"
    assert all(r.status == "skipped" for n, r in results.items() if n not in ("optimizer", "spec_roundtrip"))


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    from modkit.data import default_corpus, prepare

    root = tmp_path_factory.mktemp("optim-data")
    (root / "head.txt").write_text(default_corpus().read_text()[:20_000])
    prepare([root / "head.txt"], root / "prepared", tokenizer="char", show_progress=False)
    return root / "prepared"


@pytest.mark.parametrize("kind", ["adamw", "muon", "lion", "sgd"])
def test_a_run_resumes_bitwise_with_every_optimizer(kind, data_dir, tmp_path):
    """A run stopped at step 6 and resumed to step 12 equals the uninterrupted 12 steps, weights and optimizer state."""
    model = {**SPEC, "vocab_size": 64, "max_seq_len": 32}
    cfg = dict(
        model=model,
        data=str(data_dir),
        batch_size=4,
        seq_len=16,
        max_steps=12,
        decay_steps=12,
        warmup_steps=2,
        lr=3e-3,
        eval_interval=6,
        eval_batches=1,
        log_interval=1,
        sample_tokens=0,
        final_eval_tokens=0,
        device="cpu",
        seed=5,
        threads=1,
        optimizer={"type": kind},
    )
    train(cfg, tmp_path / "whole", echo=lambda line: None)
    train({**cfg, "max_steps": 6}, tmp_path / "part", echo=lambda line: None)
    train(None, tmp_path / "part", resume=True, overrides={"max_steps": 12}, echo=lambda line: None)
    steps = lambda run: [
        (r["step"], r["loss"], r["grad_norm"]) for r in read_metrics(run / "metrics.jsonl") if r["kind"] == "train"
    ]
    assert steps(tmp_path / "part") == steps(tmp_path / "whole")
    a, b = modkit.load(tmp_path / "part" / "last"), modkit.load(tmp_path / "whole" / "last")
    for (name, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items()):
        assert torch.equal(x, y), name
    part, whole = (
        json.loads((run / "last" / "trainer.json").read_text())["optimizer"]
        for run in (tmp_path / "part", tmp_path / "whole")
    )
    assert part == whole

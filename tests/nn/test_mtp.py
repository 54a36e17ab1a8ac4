"""Multi-token prediction (spec ``mtp``, :mod:`modkit.nn.mtp`): exact parameter counts, the shift of each depth,
causality, generation that never runs the modules, and the training loss ``CE + w / D · Σ_k CE_k``."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

import modkit
from modkit.data import default_corpus, prepare
from modkit.inference.generate import generate
from modkit.train import Trainer
from modkit.train.config import load_train_config
from modkit.train.errors import TrainError

from conftest import tiny_spec


def built(spec: dict, dtype=torch.float64, seed: int = 0):
    model = modkit.build(spec, dtype=dtype)
    model.init_weights(seed)
    return model.eval()


def with_mtp(depth: int, **changes) -> dict:
    return {**tiny_spec(**changes), "mtp": {"depth": depth}}


def test_each_depth_adds_exactly_a_last_layer_block_three_norms_and_a_2d_by_d_projection():
    base = built(tiny_spec())
    d = base.spec.d_model
    block = sum(p.numel() for p in base.layers[-1].parameters())
    norm = sum(p.numel() for p in modkit.build(tiny_spec()).layers[-1].attn_norm.parameters())
    for depth in (1, 3):
        model = built(with_mtp(depth))
        assert modkit.count_params(model) - modkit.count_params(base) == depth * (block + 3 * norm + 2 * d * d)
    meta = modkit.build(
        {**modkit.load_spec("specs/tiny-deepseek-moe.json").to_dict(), "mtp": {"depth": 1}}, device="meta"
    )
    assert type(meta.mtp[0].block.ffn) is type(meta.layers[-1].ffn)  # the last layer's components (an MoE here)


def test_depth_k_at_position_i_is_the_module_applied_to_the_hidden_state_at_i_and_the_token_at_i_plus_k():
    model = built(with_mtp(2))
    ids = torch.randint(0, model.spec.vocab_size, (2, 10), generator=torch.Generator().manual_seed(1))
    seen = {}
    model.layers[-1].register_forward_hook(lambda m, a, out: seen.update(h=out[0]))
    out = model(ids, mtp=True)
    assert [tuple(z.shape) for z in out.mtp_logits] == [(2, 9, model.spec.vocab_size), (2, 8, model.spec.vocab_size)]
    h = seen["h"]  # the last block's output, before the final norm
    for k, module in enumerate(model.mtp, start=1):
        t = ids.shape[1] - k
        x = module.eh_proj(torch.cat([module.hnorm(h[:, :t]), module.enorm(model.embed(ids[:, k:]))], -1))
        # the block alone on a fresh row of t positions: the model's causal attention from position 0
        inner = modkit.build(tiny_spec(n_layers=1), dtype=torch.float64)
        inner.layers[0].load_state_dict(module.block.state_dict())
        h = inner._run_blocks(x, modkit.nn.inputs.ForwardInputs.prepare(inner, ids[:, k:]).attention_inputs())[0]
        ref = model.head_logits(module.final_norm(h))
        torch.testing.assert_close(out.mtp_logits[k - 1], ref, rtol=0, atol=1e-12)


def test_depth_k_at_position_i_reads_tokens_up_to_i_plus_k_and_no_further():
    model = built(with_mtp(2))
    ids = torch.randint(0, model.spec.vocab_size, (1, 10), generator=torch.Generator().manual_seed(2))
    base = model(ids, mtp=True).mtp_logits
    for j in range(10):
        changed = ids.clone()
        changed[0, j] = (changed[0, j] + 1) % model.spec.vocab_size
        after = model(changed, mtp=True).mtp_logits
        for k in (1, 2):
            moved = (after[k - 1] - base[k - 1]).abs().amax(-1)[0]  # [10 - k]
            for i in range(10 - k):
                assert bool(moved[i] > 0) == (j <= i + k), (j, k, i, float(moved[i]))


def test_forward_and_generation_never_run_the_modules():
    plain = built(tiny_spec())
    model = built(with_mtp(2))
    missing, unexpected = model.load_state_dict(plain.state_dict(), strict=False)
    assert not unexpected and all(name.startswith("mtp.") for name in missing) and missing
    ids = torch.randint(0, model.spec.vocab_size, (2, 7), generator=torch.Generator().manual_seed(3))
    assert torch.equal(model(ids).logits, plain(ids).logits) and model(ids).mtp_logits is None
    assert torch.equal(
        generate(model, ids, max_new_tokens=6, temperature=0), generate(plain, ids, max_new_tokens=6, temperature=0)
    )
    assert model.cache_layout() == plain.cache_layout()
    with pytest.raises(ValueError, match="whole unpadded rows"):
        model(ids, mtp=True, logits_to_keep=1)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("mtp-data")
    (root / "head.txt").write_text(default_corpus().read_text()[:20_000])
    prepare([root / "head.txt"], root / "prepared", tokenizer="char", show_progress=False)
    return root / "prepared"


def trainer(data_dir, run, spec, **changes):
    cfg = {
        "model": spec,
        "data": str(data_dir),
        "batch_size": 2,
        "seq_len": 12,
        "max_steps": 2,
        "warmup_steps": 0,
        "eval_interval": 2,
        "eval_batches": 1,
        "final_eval_tokens": 24,
        "sample_tokens": 0,
        "device": "cpu",
        "seed": 3,
        **changes,
    }
    t = Trainer(load_train_config(cfg)[0], run, progress=False, echo=lambda line: None)
    t.setup()
    return t


def test_the_training_loss_adds_the_weighted_mean_of_the_depths_cross_entropies(data_dir, tmp_path):
    spec = with_mtp(2, vocab_size=65, max_seq_len=32)
    t = trainer(data_dir, tmp_path / "run", spec, mtp_loss_weight=0.5)
    x, y = copy.deepcopy(t.sampler).next()
    ref = copy.deepcopy(t.model).train()
    out = ref(x, mtp=True)
    v = t.spec.vocab_size  # the prepared text's
    ce = F.cross_entropy(out.logits.reshape(-1, v), y.reshape(-1))
    depths = [F.cross_entropy(z.reshape(-1, v), y[:, k:].reshape(-1)) for k, z in enumerate(out.mtp_logits, 1)]
    t.model.train()
    t.mtp_ce = torch.zeros(())
    total, got_ce = t._loss(x, y)
    torch.testing.assert_close(got_ce, ce.detach(), rtol=1e-6, atol=0)
    torch.testing.assert_close(total, ce + 0.5 * (depths[0] + depths[1]) / 2, rtol=1e-6, atol=0)
    torch.testing.assert_close(t.mtp_ce, ((depths[0] + depths[1]) / 2).detach(), rtol=1e-6, atol=0)
    record = t.train_step()  # the same first batch (the sampler was copied, not advanced), the weights before it
    torch.testing.assert_close(record["mtp_loss"], ((depths[0] + depths[1]) / 2).detach(), rtol=1e-5, atol=0)


def test_weight_zero_trains_bitwise_like_the_spec_without_mtp(data_dir, tmp_path):
    spec = tiny_spec(vocab_size=65, max_seq_len=32)
    a = trainer(data_dir, tmp_path / "a", spec)
    b = trainer(data_dir, tmp_path / "b", {**spec, "mtp": {"depth": 1}}, mtp_loss_weight=0.0)
    for _ in range(2):
        ra, rb = a.train_step(), b.train_step()
        assert torch.equal(ra["loss"], rb["loss"]) and torch.equal(ra["grad_norm"], rb["grad_norm"])
        assert "mtp_loss" not in rb


def test_layouts_the_modules_do_not_run_under_are_refused_before_the_run(data_dir, tmp_path):
    spec = with_mtp(1, vocab_size=65, max_seq_len=32)
    with pytest.raises(TrainError, match="document_mask"):
        trainer(data_dir, tmp_path / "d", spec, document_mask=True)
    with pytest.raises(TrainError, match="seq_len = 1 leaves no position"):
        trainer(data_dir, tmp_path / "s", spec, seq_len=1)


@pytest.mark.parametrize("extra", [{"mtp": {"depth": 1}}, {"stream": {"type": "mhc", "n_streams": 2}}])
def test_no_hugging_face_type_is_said_to_express_mtp_or_a_wide_stream(extra, tmp_path):
    """An export would drop the extra modules (or the stream's connections): the type-fitting refuses by name."""
    from modkit.core.errors import CheckpointError

    model = modkit.build({**tiny_spec(), **extra}, device="meta")
    key = next(iter(extra))
    with pytest.raises(CheckpointError, match=f"do not map: {key} "):
        modkit.to_hf(model, tmp_path / "auto")
    with pytest.raises(CheckpointError, match=f"{key}: spec has"):
        modkit.to_hf(model, tmp_path / "llama", model_type="llama")

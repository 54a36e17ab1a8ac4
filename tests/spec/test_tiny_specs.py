"""Every shipped tiny spec builds on CPU, runs forward with the right shapes and starts near ln(vocab)."""

import math

import pytest
import torch

import modkit
from tests.conftest import SPECS

TINY = sorted(SPECS.glob("tiny-*.json"))


def test_tiny_specs_are_shipped():
    assert {p.stem for p in TINY} >= {"tiny-llama", "tiny-gpt2", "tiny-moe", "tiny-gemma"}


@pytest.mark.parametrize("path", TINY, ids=lambda p: p.stem)
def test_tiny_spec_runs_with_initial_loss_near_ln_vocab(path):
    model = modkit.build(path, seed=0)
    assert modkit.count_params(model) < 10_000_000
    vocab = model.spec.vocab_size
    ids = torch.randint(0, vocab, (2, 48), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        out = model(ids)
    assert out.logits.shape == (2, 48, vocab)
    # next-token targets (with a tied head, scoring a token against itself would favour it)
    loss = torch.nn.functional.cross_entropy(out.logits[:, :-1].flatten(0, 1).float(), ids[:, 1:].flatten()).item()
    assert abs(loss - math.log(vocab)) < 0.15, (loss, math.log(vocab))

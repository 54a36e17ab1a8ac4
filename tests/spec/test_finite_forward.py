"""``modkit validate`` runs one forward pass of a tiny instance of a spec whose math can overflow, and refuses the
spec when its logits are not finite.

Before: a spec validated on its fields alone; the first sign of a model that computes NaN was at ``generate``.
"""

from __future__ import annotations

import json

import torch

import modkit
from modkit import cli
from modkit.spec import finite
from modkit.spec.finite import finite_forward_problem, overflow_prone, tiny_instance

from conftest import SPECS


def _spec(name: str):
    return modkit.load_spec(SPECS / f"{name}.json")


def test_only_specs_with_components_that_can_overflow_are_checked():
    assert overflow_prone(_spec("tiny-llama")) == []
    assert overflow_prone(_spec("tiny-mamba2")) == ["block.mixer"]
    assert overflow_prone(_spec("tiny-deepseek-moe")) == ["block.ffn", "block.ffn.router.routed_scaling_factor"]
    assert overflow_prone(_spec("tiny-gemma"))[0] == "embedding_scale"


def test_the_tiny_instance_keeps_one_layer_per_distinct_layer_and_every_number():
    spec = _spec("tiny-deepseek-moe")  # a dense first layer, then mixtures
    tiny = tiny_instance(spec)
    assert (tiny["n_layers"], tiny["d_model"], tiny["vocab_size"], tiny["max_seq_len"]) == (2, 128, 256, 64)
    assert tiny["block"]["ffn"] == {
        "type": "swiglu",
        "d_ff": 352,
        "bias": False,
        "activation": None,
        "gate_multiplier": 1.0,
        "output_multiplier": 1.0,
        "activation_sparsity": 0.0,
    }
    assert [o["layers"] for o in tiny["overrides"]] == [[1]]
    assert tiny["overrides"][0]["ffn"]["router"]["routed_scaling_factor"] == 2.5
    big = tiny_instance(_spec("llama-4-scout-17b-16e"))
    assert big["d_model"] < 5120 and modkit.count_params(big) <= finite.MAX_CHECK_PARAMS


def test_published_specs_pass_the_check():
    for name in ("tiny-mamba2", "tiny-hybrid", "tiny-mla", "tiny-deepseek-moe", "tiny-gemma", "gpt-oss-20b"):
        assert finite_forward_problem(_spec(name)) is None, name


def test_a_spec_whose_tiny_instance_is_not_finite_is_refused_naming_the_layer(monkeypatch, capsys, tmp_path):
    """A mixer made to overflow (its output times 1e30, twice) stands for math that overflows."""
    from modkit_plugins import mamba2

    forward = mamba2.Mamba2.forward

    def overflowing(self, x, *args, **kwargs):
        out = forward(self, x, *args, **kwargs)
        return out * torch.tensor(1e30) * torch.tensor(1e30)

    monkeypatch.setattr(mamba2.Mamba2, "forward", overflowing)
    data = json.loads((SPECS / "tiny-mamba2.json").read_text())
    path = tmp_path / "m.json"
    path.write_text(json.dumps(data))
    assert cli.main(["validate", str(path)]) == 1
    err = capsys.readouterr().err
    assert err == (
        f"{path}: a tiny instance of this spec (d_model 128, one layer per distinct layer, every scale and init of "
        "the spec kept) gives non-finite logits on its first forward pass: layer 0 of it (of 1) is the first whose "
        "output is not finite. The spec's numbers that can overflow together: block.mixer; bring them closer to "
        "published values\n"
    )
    assert cli.main(["validate", "--no-forward-check", str(path)]) == 0

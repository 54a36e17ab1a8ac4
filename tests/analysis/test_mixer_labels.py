"""Where a user reads about a layer's token mixer, it is called ``mixer`` and placed where the spec sets it, whatever
its kind: ``modkit trace`` labels (``block.mixer`` / ``overrides[j].mixer``) and the coordinate check's ``mixer``
quantity (every token mixer of the mixing slot hooked, attention or recurrent, nested components not twice)."""

from __future__ import annotations

import pytest
import torch

import modkit
from modkit.analysis.trace import mixer_spec_path, trace
from modkit.experiments.coordcheck import QUANTITIES, _measure, _slot_modules
from tests.conftest import SPECS


def _stages(spec_file):
    t = trace(modkit.build(SPECS / spec_file, device="meta"), [1, 2, 3])
    return {s.name: s for g in t.groups for s in g.stages}


def test_trace_labels_the_mixer_slot_as_the_spec_writes_it():
    """tiny-mamba2 used to print 'attention (mamba2) output' at layers.0.attention:output."""
    mamba = _stages("tiny-mamba2.json")["layers.0.attention:output"]
    assert (mamba.label, mamba.note) == ("mixer output (mamba2)", "spec: block.mixer")
    hybrid = _stages("tiny-hybrid.json")
    assert (hybrid["layers.0.attention:output"].label, hybrid["layers.0.attention:output"].note) == (
        "mixer output (gated_deltanet)",
        "spec: block.mixer",
    )
    assert (hybrid["layers.3.attention:output"].label, hybrid["layers.3.attention:output"].note) == (
        "mixer output (gqa)",
        "spec: overrides[0].mixer",
    )
    assert hybrid["layers.3.attention:weights"].label == "attention scores (softmax)"  # an attention's own stage
    llama = _stages("tiny-llama.json")["layers.0.attention:output"]  # a spec written with the 'attention' key
    assert (llama.label, llama.note) == ("mixer output (gqa)", "spec: block.attention")
    for stages in (hybrid, _stages("tiny-mamba2.json")):
        assert not any(s.label.startswith("attention (") for s in stages.values())


def test_mixer_spec_path_follows_the_last_override():
    spec = modkit.load_spec(
        {
            **modkit.load_spec(SPECS / "tiny-hybrid.json").to_dict(),
            "overrides": [
                {"layers": [1, 3], "mixer": {"type": "gqa", "n_heads": 4, "n_kv_heads": 2}},
                {"layers": [3], "ffn": {"type": "swiglu", "d_ff": 64}},  # sets no mixer
                {"layers": {"start": 2}, "attention": {"type": "gqa", "n_heads": 2, "n_kv_heads": 1}},
            ],
        }
    )
    assert [mixer_spec_path(spec, i) for i in range(4)] == [
        "block.mixer",
        "overrides[0].mixer",
        "overrides[2].attention",
        "overrides[2].attention",
    ]
    with pytest.raises(IndexError):
        mixer_spec_path(spec, 4)


def test_coordcheck_hooks_every_token_mixer_of_the_slot():
    """tiny-hybrid: the 3 Gated DeltaNet layers and the gqa layer are 'mixer' (the gqa once, not also as a nested
    attention); tiny-mamba2: 4 mixers and no FFN; the measured 'mixer' activations stack one per layer."""
    hybrid = modkit.build(SPECS / "tiny-hybrid.json", device="meta")
    slots = [(type(m).__name__, q) for m, q in _slot_modules(hybrid)]
    assert [q for _, q in slots] == ["mixer", "ffn"] * 4
    assert [m.modkit_type for m, q in _slot_modules(hybrid) if q == "mixer"] == ["gated_deltanet"] * 3 + ["gqa"]
    assert "attention" not in QUANTITIES and "mixer" in QUANTITIES
    mamba = modkit.build(SPECS / "tiny-mamba2.json", seed=0)
    ids = torch.randint(0, 1024, (2, 8), generator=torch.Generator().manual_seed(0))
    acts = _measure(mamba, ids)
    assert acts["mixer"].shape == (4, 2, 8, 128) and "ffn" not in acts
    assert torch.equal(acts["mixer"][0], _first_mixer_output(mamba, ids))


def _first_mixer_output(model, ids):
    out = []
    h = model.layers[0].attention.register_forward_hook(lambda m, i, o: out.append(o.detach().float()))
    with torch.no_grad():
        model.eval()(ids)
    h.remove()
    return out[0]

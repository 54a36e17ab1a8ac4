"""Document-masked packing: every document of a packed row gives the logits and per-token losses it gives alone.

For every built-in attention type and position scheme (enumerated from the registry: entries of the built-in
plugins), with and without a sliding window, rows that hold: a document that starts exactly at a sliding-window
boundary, empty records (an end-of-text token alone), a document cut by the row's end, a document longer than the
row (the row is one piece of it), and the tail of a document whose start lies before the row. Each piece is run
alone (positions from 0, no other tokens) and compared in float32 to 1e-5. Also: document ids and positions on a
hand-made row, the mask built once per forward, a third-party attention without the capability refused (by the
model and by the training config), and the fast ``is_causal`` path not taken when documents are present.

Every shipped spec declares document masking for all its token mixers (attention, recurrent, hybrid), and every
tiny one (the specs small enough to run here) computes each packed document as alone, recurrent mixers included:
1-token documents, empty records, a document ending on the row's end, BOS/EOS separators. A third-party recurrent
mixer without the capability is refused by name, alone and inside a parallel hybrid, by ``forward`` and by
``modkit train`` (``modkit eval``: ``tests/evaluation/test_eval.py``).
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

import modkit
import modkit.nn.attention as attention_helpers
from modkit.nn.documents import document_ids, document_mask_problems, document_positions

from conftest import SPECS, registry_with, tiny_spec

EOT = 1
WINDOW = 4
SEQ = 24
REG = modkit.get_registry()


@pytest.fixture(autouse=True)
def _one_thread():
    """Tiny forwards: one thread is faster than two fighting over shared cores (restored afterwards)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _builtin(kind: str):
    return [e for e in REG.components(kind) if e.provider.plugin.startswith("builtin-")]


ATTENTIONS = [e for e in _builtin("attention") if e.capabilities.get("document_mask")]
POSITIONS = _builtin("position")


def _rows() -> torch.Tensor:
    """Three packed rows of ``SEQ`` tokens (ids 2.. are text, 1 is end-of-text)."""
    g = torch.Generator().manual_seed(0)

    def text(n):
        return torch.randint(2, 60, (n,), generator=g).tolist()

    # row 0: doc (5 text + EOT) | two empty records (EOT alone each) | a doc starting at 2 * WINDOW = 8
    #        (9 text + EOT) | a doc cut by the row's end (6 text)
    row0 = text(5) + [EOT, EOT, EOT] + text(9) + [EOT] + text(6)
    assert len(row0) == SEQ and row0.index(EOT, 8) == 17
    # row 1: one document longer than the row (no end-of-text in it)
    row1 = text(SEQ)
    # row 2: the tail of a document begun before the row, then a whole one, then the start of another
    row2 = text(5) + [EOT] + text(9) + [EOT] + text(SEQ - 16)
    assert len(row2) == SEQ
    return torch.tensor([row0, row1, row2])


def _pieces(row: list[int]) -> list[tuple[int, int]]:
    """``(start, end)`` of each document piece of a row: a new one starts after each end-of-text token."""
    out, start = [], 0
    for i, t in enumerate(row):
        if t == EOT:
            out.append((start, i + 1))
            start = i + 1
    if start < len(row):
        out.append((start, len(row)))
    return out


def test_row_layout_covers_the_cases():
    rows = _rows()
    assert _pieces(rows[0].tolist()) == [(0, 6), (6, 7), (7, 8), (8, 18), (18, 24)]  # 8 = 2 * WINDOW
    assert _pieces(rows[1].tolist()) == [(0, SEQ)]  # one document longer than the row
    assert _pieces(rows[2].tolist()) == [(0, 6), (6, 16), (16, 24)]


def _spec(attention: dict, position: dict) -> dict:
    return tiny_spec(
        vocab_size=64,
        max_seq_len=64,
        position=position,
        block__attention=attention,
        block__ffn={"type": "mlp", "d_ff": 64, "activation": "gelu"},
        block__norm={"type": "layernorm", "eps": 1e-5},
    )


def _cases():
    for att in ATTENTIONS:
        for pos in POSITIONS:
            for window in (None, WINDOW):
                cfg = copy.deepcopy(att.example_config())
                if window is not None:
                    if "sliding_window" not in att.config.model_fields:
                        continue
                    cfg["sliding_window"] = window
                try:  # an attention may refuse a scheme (dsa refuses ALiBi's score bias): not a combination
                    modkit.load_spec(_spec(cfg, pos.example_config()))
                except modkit.SpecError:
                    continue
                yield pytest.param(cfg, copy.deepcopy(pos.example_config()), id=f"{att.type}-{pos.type}-w{window}")


def test_every_builtin_attention_and_position_is_enumerated():
    assert ATTENTIONS and POSITIONS
    assert {e.type for e in _builtin("attention")} == {e.type for e in ATTENTIONS}  # every built-in supports it


@pytest.mark.parametrize("attention, position", list(_cases()))
def test_each_document_of_a_packed_row_equals_the_document_alone(attention, position):
    model = modkit.build(_spec(attention, position), seed=3).eval()
    rows = _rows()
    x, y = rows, torch.roll(rows, -1, dims=1)  # targets: the next token (the last one wraps; compared alike alone)
    docs = document_ids(x, eot_id=EOT)
    with torch.no_grad():
        packed = model(x, documents=docs).logits
        ce = F.cross_entropy(packed.reshape(-1, 64), y.reshape(-1), reduction="none").view(x.shape)
        checked = 0
        for r in range(len(rows)):
            for start, end in _pieces(rows[r].tolist()):
                alone = model(x[r : r + 1, start:end]).logits[0]
                torch.testing.assert_close(packed[r, start:end], alone, atol=1e-5, rtol=0)
                ce_alone = F.cross_entropy(alone, y[r, start:end], reduction="none")
                torch.testing.assert_close(ce[r, start:end], ce_alone, atol=1e-5, rtol=0)
                checked += 1
        assert checked == 9
        # and the mask matters: without documents the later documents of row 0 see the earlier ones
        plain = model(x).logits
        assert (plain[0, 8:] - packed[0, 8:]).abs().max() > 1e-3


def test_document_ids_and_positions_by_hand():
    x = torch.tensor([[5, 6, EOT, 7, EOT, EOT, 8]])
    docs = document_ids(x, eot_id=EOT)
    assert docs.tolist() == [[0, 0, 0, 1, 1, 2, 3]]
    assert document_positions(docs).tolist() == [[0, 1, 2, 0, 1, 0, 0]]
    bos = 9
    y = torch.tensor([[bos, 5, EOT, bos, 6, 7, EOT, bos]])
    assert document_ids(y, eot_id=EOT, bos_id=bos).tolist() == [[0, 0, 0, 1, 1, 1, 1, 2]]
    assert document_ids(torch.tensor([[5, bos, 6, bos]]), bos_id=bos).tolist() == [[0, 1, 1, 2]]
    real = torch.tensor([[False, True, True, True, True, True, True]])  # left padding does not advance the count
    assert document_positions(docs, real).tolist() == [[0, 0, 1, 0, 1, 0, 0]]
    with pytest.raises(ValueError, match="needs the end-of-text id"):
        document_ids(x)


def test_the_mask_is_built_once_per_forward(monkeypatch):
    model = modkit.build(tiny_spec(n_layers=3), seed=0).eval()
    calls = []
    real = attention_helpers.attention_mask
    monkeypatch.setattr(attention_helpers, "attention_mask", lambda *a, **k: calls.append(1) or real(*a, **k))
    x = _rows()
    with torch.no_grad():
        model(x, documents=document_ids(x, eot_id=EOT))
    assert len(calls) == 1  # three layers, one mask


def test_the_fast_causal_path_is_not_taken_with_documents(monkeypatch):
    model = modkit.build(tiny_spec(), seed=0).eval()
    seen = []
    real = F.scaled_dot_product_attention

    def spy(*args, **kwargs):
        seen.append(kwargs.get("is_causal", False))
        return real(*args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    x = _rows()
    with torch.no_grad():
        model(x)
        assert seen and all(seen)
        seen.clear()
        model(x, documents=document_ids(x, eot_id=EOT))
    assert seen and not any(seen)


def _third_party_registry():
    plain = REG.get("attention", "gqa")
    entry = modkit.Component(
        kind="attention",
        type="leaky-attention",
        config=_leaky_config(),
        factory=lambda cfg, ctx: plain.factory(
            plain.config(type="gqa", n_heads=cfg.n_heads, n_kv_heads=cfg.n_kv_heads), ctx
        ),
        description="gqa that does not declare document masking",
        capabilities={"causal_safe": True},
    )
    return registry_with("test-leaky", entry)


def _leaky_config():
    from typing import Literal

    from pydantic import Field

    class LeakyConfig(modkit.ComponentConfig):
        type: Literal["leaky-attention"] = "leaky-attention"
        n_heads: int = Field(4, description="query heads")
        n_kv_heads: int = Field(2, description="key/value heads")

    return LeakyConfig


def test_an_attention_without_the_capability_is_refused():
    reg = _third_party_registry()
    spec = modkit.load_spec(tiny_spec(block__attention={"type": "leaky-attention"}), registry=reg)
    problems = document_mask_problems(spec, reg)
    assert len(problems) == 1 and problems[0][0] == "layer 0.mixer"
    assert "'leaky-attention' (test-leaky) does not declare the document_mask capability" in problems[0][1]
    assert "gqa" in problems[0][1]  # names the ones that do
    model = modkit.build(spec, registry=reg).eval()
    x = _rows()
    with pytest.raises(
        ValueError, match=r"layer 0: attention type 'leaky-attention' does not declare the document_mask capability"
    ):
        model(x, documents=document_ids(x, eot_id=EOT))
    model(x)  # without documents it is an ordinary attention
    assert document_mask_problems(modkit.load_spec(tiny_spec())) == []


def test_documents_with_a_cache_are_refused():
    model = modkit.build(tiny_spec(), seed=0).eval()
    x = _rows()
    with pytest.raises(ValueError, match="cannot be combined with a KV cache"):
        model(x, documents=document_ids(x, eot_id=EOT), cache=model.new_cache(3))


# ----------------------------------------------------------------------------------------------- every mixer, every spec

BOS = 2


def _separated_rows() -> torch.Tensor:
    """Three packed rows of ``SEQ`` tokens (ids 3.. are text, 1 end-of-text, 2 begin-of-text): row 0 a document, two
    empty records, a long one, a 1-token document cut by the row's end; row 1 BOS/EOS-delimited documents, a BOS
    alone (1 token) and a document ending on the row's last token; row 2 one document longer than the row."""
    g = torch.Generator().manual_seed(0)

    def text(n):
        return torch.randint(3, 60, (n,), generator=g).tolist()

    row0 = text(5) + [EOT, EOT, EOT] + text(14) + [EOT] + text(1)
    row1 = [BOS] + text(4) + [EOT, BOS, BOS] + text(6) + [EOT, BOS] + text(7) + [EOT]
    return torch.tensor([row0, row1, text(SEQ)])


def _runs(docs: torch.Tensor) -> list[tuple[int, int]]:
    """``(start, end)`` of each run of equal document ids of one row."""
    edges = [0] + [i for i in range(1, len(docs)) if docs[i] != docs[i - 1]] + [len(docs)]
    return list(zip(edges[:-1], edges[1:]))


@pytest.mark.parametrize("path", sorted(SPECS.glob("*.json")), ids=lambda p: p.stem)
def test_every_shipped_spec_declares_document_masking_for_all_its_mixers(path):
    assert document_mask_problems(modkit.load_spec(path)) == []


@pytest.mark.parametrize("path", sorted(SPECS.glob("tiny-*.json")), ids=lambda p: p.stem)
def test_each_packed_document_equals_itself_alone_in_every_tiny_spec(path):
    """Attention, Mamba-2, the Gated DeltaNet + attention hybrid, MoE, MLA: the shipped specs small enough to run."""
    model = modkit.build(path, seed=0).eval()
    x = _separated_rows()
    docs = document_ids(x, eot_id=EOT, bos_id=BOS)
    assert _runs(docs[0]) == [(0, 6), (6, 7), (7, 8), (8, 23), (23, 24)]
    assert _runs(docs[1]) == [(0, 6), (6, 7), (7, 15), (15, 24)]
    with torch.no_grad():
        packed = model(x, documents=docs).logits
        worst = 0.0
        for r in range(len(x)):
            for start, end in _runs(docs[r]):
                alone = model(x[r : r + 1, start:end]).logits[0]
                worst = max(worst, (packed[r, start:end] - alone).abs().max().item())
        assert worst <= 1e-5, worst
        assert (model(x).logits[:2, 8:] - packed[:2, 8:]).abs().max() > 1e-2  # without documents: a leak


def _plain_ssm_entry():
    """A third-party recurrent mixer (Mamba-2 underneath) whose entry does not declare document masking."""
    from typing import Literal

    from pydantic import Field

    class PlainSSMConfig(modkit.ComponentConfig):
        type: Literal["plain-ssm"] = "plain-ssm"
        d_state: int = Field(8, description="state size")

    ssm = REG.get("mixer", "mamba2")
    return modkit.Component(
        kind="mixer",
        type="plain-ssm",
        config=PlainSSMConfig,
        factory=lambda cfg, ctx: ssm.factory(ssm.config(d_state=cfg.d_state, head_dim=8, chunk_size=4), ctx),
        description="a state-space mixer that does not declare document masking",
        capabilities={"causal_safe": True, "kv_cache": True},
    )


HYBRID = {"type": "parallel", "mixers": [{"type": "gqa", "n_heads": 4, "n_kv_heads": 2}, {"type": "plain-ssm"}]}


def test_a_recurrent_mixer_without_the_capability_is_refused_alone_and_inside_a_hybrid():
    reg = registry_with("test-plain-ssm", _plain_ssm_entry())
    alone = modkit.load_spec(tiny_spec(block__attention={"type": "plain-ssm"}), registry=reg)
    ((path, message),) = document_mask_problems(alone, reg)
    assert path == "layer 0.mixer"
    assert "mixer type 'plain-ssm' (test-plain-ssm) does not declare the document_mask capability" in message
    assert "carry information across the documents" in message and "gated_deltanet, gqa" in message
    nested = modkit.load_spec(tiny_spec(block__attention=HYBRID), registry=reg)
    assert [p for p, _ in document_mask_problems(nested, reg)] == ["layer 0.mixer.mixers.1"]  # parallel passes
    x = _rows()
    for spec, where in ((alone, "layer 0"), (nested, "layer 0 (attention.mixers.1)")):
        model = modkit.build(spec, registry=reg).eval()
        with pytest.raises(ValueError) as caught:
            model(x, documents=document_ids(x, eot_id=EOT))
        said = str(caught.value)
        assert f"{where}: mixer type 'plain-ssm' does not declare the document_mask capability" in said
        assert "layer 1" in said and "mamba2" in said and "parallel" in said  # every layer; the types that can
        model(x)  # without documents it is an ordinary mixer


def test_training_refuses_a_recurrent_mixer_without_the_capability(tmp_path):
    from types import SimpleNamespace

    from modkit.train import TrainError
    from modkit.train.resolve import check_document_mask

    data = SimpleNamespace(separators=(EOT, None), path=tmp_path)
    check_document_mask(modkit.load_spec(SPECS / "tiny-hybrid.json"), data)  # every built-in mixer declares it
    check_document_mask(modkit.load_spec(SPECS / "tiny-mamba2.json"), data)
    entry = _plain_ssm_entry()
    plugin = SimpleNamespace(register_components=modkit.hookimpl(lambda register: register(entry)))
    REG.register_plugin(plugin, "test-plain-ssm")  # training reads the process-wide registry, as an installed plugin
    try:
        spec = modkit.load_spec(tiny_spec(block__attention=HYBRID))
        with pytest.raises(TrainError, match=r"layer 0\.mixer\.mixers\.1: mixer type 'plain-ssm' \(test-plain-ssm\)"):
            check_document_mask(spec, data)
    finally:
        REG.unregister_plugin("test-plain-ssm")

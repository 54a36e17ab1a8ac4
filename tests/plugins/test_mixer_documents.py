"""Document boundaries in the recurrent mixers: the state and the short convolution restart at every document start.

* float64, the functions themselves (Mamba-2's SSD, Gated DeltaNet's delta rule, Mamba's selective scan, and the
  causal convolution): with the start flags, the chunked form (chunk lengths not aligned with the documents), a
  prefill split in pieces that carry the state (a piece beginning exactly at a document start too) and the
  one-token step each equal every document run alone through the plain recurrence from a zero state, to 1e-12;
  without the flags they do not (the reset is what makes them equal);
* float32, every built-in mixer type (enumerated from the registry) in a model: each document of packed rows (with
  1-token documents, empty records, a document ending on the row's end, BOS/EOS separators) gives the logits it
  gives alone, to 1e-5 in units of the logits' scale ``max(1, max |logit|)`` (packed, a document's chunks of the
  chunked form fall elsewhere than alone, and Gated DeltaNet's per-head gated norm of a near-zero read-out
  magnifies that float32 rounding: 2.0e-5 absolute at logits of 3.9, as between two chunk lengths in
  ``test_mixers.py``; Mamba-2, Mamba and the hybrid stay under 4e-6 absolute); one document given as ``documents``
  gives the logits of no documents.

References: mamba_ssm's ``seq_idx`` and flash-linear-attention's ``cu_seqlens`` define the semantics checked here (a
packed document is computed as if alone); the references are the recurrences of each module's docstring.
"""

from __future__ import annotations

import pytest
import torch

import modkit
from modkit.nn.documents import document_ids
from modkit.nn.recurrent import causal_conv, document_starts
from modkit_plugins.gated_deltanet import delta_rule_chunked, delta_rule_step, l2_normalise
from modkit_plugins.mamba import scan_chunked, scan_step
from modkit_plugins.mamba2 import ssd_chunked, ssd_step

T = 19
#: document starts of the two rows: row 0 holds 1-token documents (3, 4) and a last document of one token that ends
#: on the row's end (18); row 1 a start two tokens after a chunk boundary of 4 and one right on a boundary of 8
STARTS_AT = ([3, 4, 5, 11, 18], [6, 8, 16])
#: prefill pieces: the second begins exactly at row 0's document start 5, the third inside documents
CUTS = (0, 5, 12, T)
EXACT = 1e-12


@pytest.fixture(autouse=True)
def _one_thread():
    """Tiny tensors: one thread is faster than two fighting over shared cores (restored afterwards)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _starts() -> torch.Tensor:
    starts = torch.zeros(2, T, dtype=torch.bool)
    for row, at in enumerate(STARTS_AT):
        starts[row, at] = True
    return starts


def _documents(row: int) -> list[tuple[int, int]]:
    edges = [0, *STARTS_AT[row], T]
    return list(zip(edges[:-1], edges[1:]))


# ----------------------------------------------------------------------------------------------- the three scans
#
# Each mixer's functions behind one interface: ``make(gen)`` draws float64 inputs ``{name: tensor}`` for 2 rows of
# T tokens, ``TIME[name]`` is the time axis of each (None: no time axis, no batch axis), ``chunked(inputs, chunk,
# state, starts)`` and ``step(inputs at one token, state, reset)`` return ``(y, state)``, ``y`` with time on axis
# ``Y_TIME``.


def _mamba2_inputs(g: torch.Generator) -> dict:
    H, P, G, N = 4, 3, 2, 5
    return {
        "x": torch.randn(2, T, H, P, generator=g, dtype=torch.float64),
        "dt": torch.rand(2, T, H, generator=g, dtype=torch.float64) * 0.5 + 0.05,
        "A": -torch.rand(H, generator=g, dtype=torch.float64) - 0.1,
        "B": torch.randn(2, T, G, N, generator=g, dtype=torch.float64),
        "C": torch.randn(2, T, G, N, generator=g, dtype=torch.float64),
    }


def _deltanet_inputs(g: torch.Generator) -> dict:
    H, dk, dv = 3, 4, 5
    return {
        "q": l2_normalise(torch.randn(2, H, T, dk, generator=g, dtype=torch.float64)) * dk**-0.5,
        "k": l2_normalise(torch.randn(2, H, T, dk, generator=g, dtype=torch.float64)),
        "v": torch.randn(2, H, T, dv, generator=g, dtype=torch.float64),
        "g": -torch.rand(2, H, T, generator=g, dtype=torch.float64) * 0.3,
        "beta": torch.rand(2, H, T, generator=g, dtype=torch.float64),
    }


def _mamba_inputs(g: torch.Generator) -> dict:
    D, N = 6, 4
    return {
        "x": torch.randn(2, T, D, generator=g, dtype=torch.float64),
        "dt": torch.rand(2, T, D, generator=g, dtype=torch.float64) * 0.5 + 0.05,
        "A": -torch.rand(D, N, generator=g, dtype=torch.float64) - 0.1,
        "B": torch.randn(2, T, N, generator=g, dtype=torch.float64),
        "C": torch.randn(2, T, N, generator=g, dtype=torch.float64),
    }


SCANS = {
    "mamba2": dict(
        make=_mamba2_inputs,
        time={"x": 1, "dt": 1, "A": None, "B": 1, "C": 1},
        y_time=1,
        chunked=lambda i, chunk, state, starts: ssd_chunked(
            i["x"], i["dt"], i["A"], i["B"], i["C"], chunk, state, starts
        ),
        step=lambda i, state, reset: ssd_step(i["x"], i["dt"], i["A"], i["B"], i["C"], state, reset),
        zero=lambda i: i["x"].new_zeros(i["x"].shape[0], *i["x"].shape[2:], i["B"].shape[-1]),
    ),
    "gated_deltanet": dict(
        make=_deltanet_inputs,
        time={"q": 2, "k": 2, "v": 2, "g": 2, "beta": 2},
        y_time=2,
        chunked=lambda i, chunk, state, starts: delta_rule_chunked(
            i["q"], i["k"], i["v"], i["g"], i["beta"], chunk, state, starts
        ),
        step=lambda i, state, reset: delta_rule_step(i["q"], i["k"], i["v"], i["g"], i["beta"], state, reset),
        zero=lambda i: i["q"].new_zeros(*i["q"].shape[:2], i["q"].shape[-1], i["v"].shape[-1]),
    ),
    "mamba": dict(
        make=_mamba_inputs,
        time={"x": 1, "dt": 1, "A": None, "B": 1, "C": 1},
        y_time=1,
        chunked=lambda i, chunk, state, starts: scan_chunked(
            i["x"], i["dt"], i["A"], i["B"], i["C"], chunk, state, starts
        ),
        step=lambda i, state, reset: scan_step(i["x"], i["dt"], i["A"], i["B"], i["C"], state, reset),
        zero=lambda i: i["x"].new_zeros(i["x"].shape[0], i["x"].shape[-1], i["A"].shape[-1]),
    ),
}


def _cut(inputs: dict, time: dict, rows: slice, start: int, end: int, squeeze: bool = False) -> dict:
    """The inputs of ``rows`` and tokens ``[start, end)`` (``squeeze``: the one token ``start``, no time axis)."""
    out = {}
    for name, t in inputs.items():
        axis = time[name]
        if axis is None:
            out[name] = t
            continue
        t = t[rows].narrow(axis, start, end - start)
        out[name] = t.squeeze(axis) if squeeze else t
    return out


def _reference(scan: dict, inputs: dict) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Every document of each row run alone, token by token through the plain recurrence from a zero state: ``(y of
    both rows [.., T, ..], [final state of row 0, of row 1])``."""
    rows, finals = [], []
    for row in range(2):
        pieces = []
        for start, end in _documents(row):
            one = _cut(inputs, scan["time"], slice(row, row + 1), start, end)
            state = scan["zero"](one)
            for t in range(end - start):
                y, state = scan["step"](_cut(one, scan["time"], slice(None), t, t + 1, squeeze=True), state, None)
                pieces.append(y.unsqueeze(scan["y_time"]))
        rows.append(torch.cat(pieces, scan["y_time"]))
        finals.append(state)
    return torch.cat(rows, 0), finals


def _err(got: torch.Tensor, want: torch.Tensor) -> float:
    return (got - want).abs().max().item()


def _scaled(got: torch.Tensor, want: torch.Tensor) -> float:
    """max |got - want| in units of the reference's scale, max(1, max |want|) (float32 rounding grows with it)."""
    return _err(got, want) / max(1.0, want.abs().max().item())


@pytest.mark.parametrize("name", sorted(SCANS))
def test_the_chunked_form_resets_at_document_starts_in_float64(name):
    scan = SCANS[name]
    inputs = scan["make"](torch.Generator().manual_seed(0))
    want, finals = _reference(scan, inputs)
    for chunk in (1, 4, 5, 32):  # chunk boundaries at, beside and far from the document starts; one chunk for all
        y, state = scan["chunked"](inputs, chunk, None, _starts())
        assert _err(y, want) <= EXACT, (chunk, _err(y, want))
        for row in range(2):
            assert _err(state[row], finals[row][0]) <= EXACT, (chunk, row)
    plain, _ = scan["chunked"](inputs, 4, None, None)
    assert _err(plain, want) > 1e-3  # without the flags the documents see each other's state


@pytest.mark.parametrize("name", sorted(SCANS))
def test_a_prefill_in_pieces_and_the_step_form_reset_at_document_starts_in_float64(name):
    scan, starts = SCANS[name], _starts()
    inputs = scan["make"](torch.Generator().manual_seed(1))
    want, finals = _reference(scan, inputs)
    state, pieces = None, []
    for a, b in zip(CUTS[:-1], CUTS[1:]):  # the state carried from piece to piece, as a cache carries it
        y, state = scan["chunked"](_cut(inputs, scan["time"], slice(None), a, b), 4, state, starts[:, a:b])
        pieces.append(y)
    assert starts[0, CUTS[1]]  # row 0's second piece begins with a document: the carried state is dropped
    assert _err(torch.cat(pieces, scan["y_time"]), want) <= EXACT
    state, steps = scan["zero"](inputs), []
    for t in range(T):
        y, state = scan["step"](_cut(inputs, scan["time"], slice(None), t, t + 1, squeeze=True), state, starts[:, t])
        steps.append(y.unsqueeze(scan["y_time"]))
    assert _err(torch.cat(steps, scan["y_time"]), want) <= EXACT
    for row in range(2):
        assert _err(state[row], finals[row][0]) <= EXACT


class _Window:
    """The one cache entry :func:`causal_conv` reads (``state[name]``) and writes (``state.write``)."""

    def __init__(self, window: torch.Tensor):
        self.window = window

    def __getitem__(self, name: str) -> torch.Tensor:
        return self.window

    def write(self, name: str, value: torch.Tensor) -> None:
        self.window = value.clone()


def test_the_convolution_takes_nothing_from_before_a_document_in_float64():
    g = torch.Generator().manual_seed(2)
    conv = torch.nn.Conv1d(6, 6, 4, groups=6).double()
    with torch.no_grad():
        conv.weight.copy_(torch.randn(conv.weight.shape, generator=g, dtype=torch.float64))
        conv.bias.copy_(torch.randn(6, generator=g, dtype=torch.float64))
    x = torch.randn(2, T, 6, generator=g, dtype=torch.float64)
    starts = _starts()
    want = torch.cat(
        [torch.cat([causal_conv(x[r : r + 1, a:b], conv) for a, b in _documents(r)], 1) for r in range(2)], 0
    )
    assert _err(causal_conv(x, conv, starts=starts), want) <= EXACT
    assert _err(causal_conv(x, conv), want) > 1e-2  # the plain convolution reads across the starts
    state, pieces = _Window(torch.zeros(2, 6, 3, dtype=torch.float64)), []
    for a, b in zip(CUTS[:-1], CUTS[1:]):  # a prefill in pieces: the window of the previous piece, then none at 5
        pieces.append(causal_conv(x[:, a:b], conv, state, starts=starts[:, a:b]))
    assert _err(torch.cat(pieces, 1), want) <= EXACT
    # the window keeps the last inputs of the last document: row 0's began at 18 (16 and 17 zeroed), row 1's at 16
    assert torch.equal(state.window[1], x[1, -3:].T) and torch.equal(state.window[0, :, 2], x[0, -1])
    assert not state.window[0, :, :2].any()


def test_document_starts_flags_each_change_of_document_but_not_the_first_token():
    docs = document_ids(torch.tensor([[5, 1, 1, 6, 7, 1, 8]]), eot_id=1)  # [0, 0, 1, 2, 2, 2, 3]
    assert document_starts(docs).tolist() == [[False, False, True, True, False, False, True]]
    assert document_starts(None) is None


# ----------------------------------------------------------------------------------------------- in a model

EOT, BOS, SEQ = 1, 2, 24
REG = modkit.get_registry()
MIXERS = [e for e in REG.components("mixer") if e.provider.plugin.startswith("builtin-")]


def _rows() -> torch.Tensor:
    """Three packed rows of ``SEQ`` tokens (ids 3.. are text, 1 end-of-text, 2 begin-of-text)."""
    g = torch.Generator().manual_seed(0)

    def text(n):
        return torch.randint(3, 64, (n,), generator=g).tolist()

    # row 0 (end-of-text only): a document | two empty records | a long one crossing chunk boundaries | a 1-token
    # document cut by the row's end
    row0 = text(5) + [EOT, EOT, EOT] + text(14) + [EOT] + text(1)
    # row 1 (BOS/EOS): a document | a BOS alone (1 token) | another | a document ending on the row's last token
    row1 = [BOS] + text(4) + [EOT, BOS, BOS] + text(6) + [EOT, BOS] + text(7) + [EOT]
    # row 2: one document longer than the row
    row2 = text(SEQ)
    assert len(row0) == len(row1) == SEQ
    return torch.tensor([row0, row1, row2])


def _pieces(docs: torch.Tensor) -> list[tuple[int, int]]:
    """``(start, end)`` of each run of equal document ids of one row."""
    edges = [0] + [i for i in range(1, len(docs)) if docs[i] != docs[i - 1]] + [len(docs)]
    return list(zip(edges[:-1], edges[1:]))


def _spec(mixer: dict) -> dict:
    return {
        "schema_version": 1,
        "vocab_size": 64,
        "d_model": 32,
        "n_layers": 2,
        "max_seq_len": 64,
        "position": {"type": "rope"} if mixer["type"] == "parallel" else {"type": "none"},
        "init_std": 0.2,
        "block": {
            "mixer": mixer,
            "ffn": {"type": "mlp", "d_ff": 64, "activation": "gelu"},
            "norm": {"type": "rmsnorm"},
            "placement": {"type": "pre"},
        },
        "final_norm": {"type": "rmsnorm"},
    }


def test_every_builtin_mixer_declares_document_masking():
    assert {e.type for e in MIXERS} >= {"mamba2", "gated_deltanet", "mamba", "parallel"}
    assert all(e.capabilities.get("document_mask") for e in MIXERS)


@pytest.mark.parametrize("entry", MIXERS, ids=lambda e: e.type)
def test_each_document_of_a_packed_row_equals_the_document_alone(entry):
    model = modkit.build(_spec(entry.example_config()), seed=3).eval()
    x = _rows()
    docs = document_ids(x, eot_id=EOT, bos_id=BOS)
    assert _pieces(docs[0]) == [(0, 6), (6, 7), (7, 8), (8, 23), (23, 24)]
    assert _pieces(docs[1]) == [(0, 6), (6, 7), (7, 15), (15, 24)]
    with torch.no_grad():
        packed = model(x, documents=docs).logits
        worst = 0.0
        for r in range(len(x)):
            for start, end in _pieces(docs[r]):
                alone = model(x[r : r + 1, start:end]).logits[0]
                worst = max(worst, _scaled(packed[r, start:end], alone))
        assert worst <= 1e-5, worst
        leak = _err(model(x).logits[:2, 8:], packed[:2, 8:])  # without documents the later ones see the earlier
        if entry.capabilities.get("absent"):  # a mixer that stands for none mixes no tokens: nothing to leak
            assert leak == 0.0, leak
        else:
            assert leak > 1e-2, leak
        one = model(x, documents=torch.zeros_like(x)).logits  # one document: the numbers of no documents
        assert _scaled(one, model(x).logits) <= 1e-5

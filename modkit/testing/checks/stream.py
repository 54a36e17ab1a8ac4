"""The ``stream`` check: a residual-stream component (spec ``stream``, :mod:`modkit.nn.stream`) meets its contract.

The model-level checks (causality, cached decode, meta init, compile) run a stream inside a tiny model like any
component; this one calls the stream's own four functions directly.
"""

from __future__ import annotations

import copy
from typing import Optional

import torch

from modkit.core.config import ComponentConfig
from modkit.core.interfaces import Init
from modkit.core.registry import Component
from .base import CheckFailed, SAME_MATH_ULPS, first_target, fmt, max_abs_diff, tolerance
from ..harness import Bench

SUMMARY = (
    "a residual stream keeps its shapes ([b, s, n, d] between blocks, [b, s, d] for the sublayers and the head) and "
    "dtype, and acts on each token alone: other rows and positions never change its output"
)


def applies_stream(entry: Component, config: ComponentConfig) -> Optional[str]:
    """Components of the ``stream`` kind."""
    return None if entry.kind == "stream" else "applies to residual streams (kind stream)"


def _connection(stream, model):
    """A fresh connection to check: ``stream.connection()``, or for a ``"block"``-scope stream a copy of the first
    block's (:meth:`~modkit.nn.stream.ResidualStream.block_connection`, built with that block's context)."""
    if getattr(stream, "scope", "sublayer") == "block":
        return copy.deepcopy(model.layers[0].stream_link)
    return stream.connection()


def check_stream(bench: Bench) -> str:
    """``enter``, ``exit``, ``layer_inputs`` and a fresh connection's ``read`` / ``write`` on ``[3, 8, ...]`` inputs,
    in float32 and bfloat16: every output has its contract shape and the input dtype, and equals the output computed
    for each token alone (``[24, 1, ...]``), within :data:`~.base.SAME_MATH_ULPS` ulps of its scale. A ``"block"``
    stream's connection is the first block's (copied), its ``write`` given layer 0's input.

    Catches: a stream whose declared ``scope`` capability (what validation reads) differs from its module's
    ``scope`` (what the blocks read); a stream whose mixing weights take statistics over the batch or the sequence (a norm over the wrong
    dimension: over the batch it passes causality and cached decode, since every row changes together), per-layer
    inputs normalised over the batch, a connection that returns the streams' sum instead of one ``[b, s, d]`` input,
    a head that drops the dtype. Source: the contract in :mod:`modkit.nn.stream` (hyper-connections compute every
    weight from the token's own streams, Zhu et al. 2024, arXiv:2409.19606; AltUp's from the token's own
    predictions, Baykal et al. 2023, arXiv:2301.13310).
    """
    model, records = bench.build()
    stream = first_target(bench, records).module
    declared, built = bench.entry.capabilities.get("scope", "sublayer"), getattr(stream, "scope", "sublayer")
    if declared != built:  # validation reads the capability, the blocks read the module: they must agree
        raise CheckFailed(
            f"the entry declares scope {declared!r} (capabilities), the module says {built!r} (ResidualStream.scope); "
            "give both the same value"
        )
    n, d = int(stream.n_streams), bench.d_model()
    connection = _connection(stream, model)
    block = getattr(stream, "scope", "sublayer") == "block"
    from modkit.nn.model import init_modules

    init_modules(connection, Init(11, 0.2))
    notes = []
    ids = bench.ids(3, 8, seed=94)
    for dtype in (torch.float32, torch.bfloat16):
        s = bench.randn(3, 8, n, d, seed=91).to(dtype)
        x = bench.randn(3, 8, d, seed=92).to(dtype)
        y = bench.randn(3, 8, d, seed=93).to(dtype)
        conn, head = connection.to(dtype), stream.to(dtype)

        def outputs(s, x, y, ids):
            u, state = conn.read(s)
            got = {"enter": head.enter(x), "exit": head.exit(s), "read": u}
            if not block:
                return {**got, "write": conn.write(s, state, y)}
            extra = head.layer_inputs(ids, x)
            got["write"] = conn.write(s, state, y, None if extra is None else extra[:, :, 0])
            return got if extra is None else {**got, "layer_inputs": extra}

        with torch.no_grad():
            full = outputs(s, x, y, ids)
            alone = outputs(s.reshape(24, 1, n, d), x.reshape(24, 1, d), y.reshape(24, 1, d), ids.reshape(24, 1))
        shapes = {"enter": (3, 8, n, d), "exit": (3, 8, d), "read": (3, 8, d), "write": (3, 8, n, d)}
        if "layer_inputs" in full:
            shapes["layer_inputs"] = (3, 8, *full["layer_inputs"].shape[2:])
        for name, got in full.items():
            if tuple(got.shape) != shapes[name] or got.dtype != dtype:
                raise CheckFailed(
                    f"{name} returned {tuple(got.shape)} {got.dtype} for {dtype} input; the contract is "
                    f"{shapes[name]} in the input dtype"
                )
            ref = alone[name].reshape(got.shape)
            tol = tolerance(got.float(), dtype, SAME_MATH_ULPS)
            worst = max_abs_diff(got, ref).max().item()
            if worst > tol:
                raise CheckFailed(
                    f"{name} of a token depends on the other tokens ({dtype}): against each token alone max |Δ| = "
                    f"{fmt(worst)} (tolerance {fmt(tol)}); a stream must compute each token from its own streams"
                )
        notes.append(str(dtype).replace("torch.", ""))
    stream.float()
    what = "enter, exit, layer_inputs, read and write" if block else "enter, exit, read and write"
    return (
        f"{n} streams ({'block' if block else 'sublayer'} scope): {what} keep their shapes and dtype "
        f"({', '.join(notes)}) and equal each token computed alone"
    )

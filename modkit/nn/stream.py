"""The residual stream as a declared part of the model (spec ``stream``, registry kind ``stream``).

Without a ``stream`` the residual stream is the ``[batch, seq, d_model]`` tensor the blocks pass on: each placement
adds its sublayers' outputs to it, and nothing here runs. A ``stream`` component carries ``n_streams`` copies
between blocks instead, ``[batch, seq, n_streams, d_model]`` (hyper-connections, Zhu et al. 2024,
arXiv:2409.19606; DeepSeek-V4's manifold-constrained variant). The contract:

* the model calls :meth:`ResidualStream.enter` on the embeddings (``[b, s, d] -> [b, s, n, d]``) before the first
  block and :meth:`ResidualStream.exit` after the last (``[b, s, n, d] -> [b, s, d]``, before the final norm: how
  the head reads the streams);
* every sublayer still sees and returns ``[batch, seq, d_model]``: a placement that declares the ``streams``
  capability finds the stream in ``BuildContext.extra["stream"]`` and builds one :meth:`ResidualStream.connection`
  per sublayer, whose ``read(s) -> (x [b, s, d], state)`` gives the sublayer's input and whose
  ``write(s, state, y [b, s, d]) -> s`` puts its output back (the plain residual is ``read = identity``, ``write =
  s + y``). Validation refuses a wide stream with a placement that does not declare it (:mod:`modkit.spec.checks`).

A stream declares its :attr:`ResidualStream.scope`. The default, ``"sublayer"``, is the contract above (one
connection around each sublayer; ``mhc``). A ``"block"`` stream (Gemma 3n's AltUp) is read once before a block and
written once after it, and works with every placement that declares the ``block_streams`` capability (every
built-in one), which runs unchanged on the plain ``[b, s, d]`` stream in between: the block builds one
:meth:`ResidualStream.block_connection` with its build context, ``read(s) -> (x [b, s, d], state)`` gives the block's
input and ``write(s, state, y [b, s, d], layer_input) -> s`` takes the block's output ``y`` (the whole residual after
the block, not a sublayer's increment). Validation refuses a placement without that capability, by layer.

Per-layer inputs: a stream may compute, once per forward, inputs of every layer from the token ids and the
embeddings (:meth:`ResidualStream.layer_inputs`, ``[b, s, n_layers, p]``: Gemma 3n's per-layer embeddings); the model
hands them to the blocks in ``AttentionInputs.stream_inputs`` and a block connection's ``write`` gets its layer's
slice ``[b, s, p]`` (``None`` when the stream has none).

Tools that read a block's output (trace, activations) see the wide stream; the logit lens reads it through
:meth:`ResidualStream.exit`.
"""

from __future__ import annotations

from typing import Any, Optional

from torch import Tensor, nn


class ResidualStream(nn.Module):
    """Base of a ``stream`` component (see the module docstring): ``n_streams`` copies of the residual stream.

    Subclasses set :attr:`n_streams` and implement :meth:`enter`, :meth:`exit` and :meth:`connection`.
    """

    #: the copies carried between blocks
    n_streams: int = 1
    #: ``"sublayer"``: one :meth:`connection` around each sublayer (placements that declare ``streams``);
    #: ``"block"``: one :meth:`block_connection` around each block (every placement)
    scope: str = "sublayer"

    def layer_inputs(self, input_ids: Tensor, x: Tensor) -> Optional[Tensor]:
        """Inputs of every layer ``[batch, seq, n_layers, p]`` from the token ids ``[batch, seq]`` and the embeddings
        ``x [batch, seq, d_model]`` (the blocks' input before :meth:`enter`), computed once per forward; ``None`` (the
        default): the stream has none."""
        return None

    def block_connection(self, ctx: Any) -> nn.Module:
        """A new connection around one block of a ``"block"``-scope stream, built with the block's
        :class:`~modkit.core.interfaces.BuildContext` (its ``layer_index`` and ``norm``): a module with ``read(s) ->
        (x [batch, seq, d_model], state)`` and ``write(s, state, y [batch, seq, d_model], layer_input [batch, seq, p]
        or None) -> s [batch, seq, n_streams, d_model]``; its parameters are the block's."""
        raise NotImplementedError

    def enter(self, x: Tensor) -> Tensor:
        """The stream of the embeddings ``x [batch, seq, d_model]``: ``[batch, seq, n_streams, d_model]``."""
        raise NotImplementedError

    def exit(self, s: Tensor) -> Tensor:
        """What the final norm and the head read from the stream ``s [batch, seq, n_streams, d_model]``:
        ``[batch, seq, d_model]``."""
        raise NotImplementedError

    def connection_flops(self, tokens: int) -> int:
        """Matrix-product FLOPs of one connection's ``read`` and ``write`` on ``tokens`` tokens (what the placement
        holding it declares for it, :func:`placement_stream_flops`)."""
        raise NotImplementedError

    def connection(self) -> nn.Module:
        """A new connection for one sublayer: a module with ``read(s) -> (x [batch, seq, d_model], state)`` and
        ``write(s, state, y [batch, seq, d_model]) -> s [batch, seq, n_streams, d_model]``; its parameters are the
        sublayer's block's."""
        raise NotImplementedError


def stream_of(ctx: Any):
    """The model's :class:`ResidualStream` a placement is built with (``ctx.extra["stream"]``), or ``None`` for the
    plain residual stream."""
    return (getattr(ctx, "extra", None) or {}).get("stream")


def layer_input(inputs: Any, index: Optional[int]) -> Optional[Tensor]:
    """Layer ``index``'s slice ``[batch, seq, p]`` of the stream's per-layer inputs in ``inputs.stream_inputs``
    (:meth:`ResidualStream.layer_inputs`), or ``None`` when the stream has none."""
    extra = getattr(inputs, "stream_inputs", None)
    return None if extra is None or index is None else extra[:, :, index]


def placement_stream_flops(cfg: Any, ctx: Any, work: Any) -> dict[str, int]:
    """The FLOPs a placement that declares ``streams`` adds for its connections: ``{"connections": sublayers ·
    stream.connection_flops(tokens)}`` (one connection for the mixer, one for the ffn when the block has one);
    ``{}`` on the plain stream. A placement's ``flops`` declaration calls it on its build context."""
    stream = stream_of(ctx)
    if stream is None or getattr(stream, "scope", "sublayer") != "sublayer":  # a block stream declares its links
        return {}
    sublayers = 1 + (getattr(ctx, "ffn", None) is not None)
    return {"connections": sublayers * stream.connection_flops(work.tokens)}

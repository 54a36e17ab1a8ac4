"""Documented bounds on every size a spec (or a Hugging Face config being converted) may give, and on input files.

Each bound lies far above any published model (the largest figure known when the bound was set is given in
brackets), so a real model never meets one; what they stop is a typo or a fuzzer turning a spec into a
multi-minute build or a tensor size torch cannot represent. Within the bounds, every tensor's element count fits
in int64 and a valid spec builds on ``meta`` in well under a second (``n_layers`` is the only bound that
affects build time: about 0.3-1 ms per layer, so at most about half a second).

Use the ``Annotated`` types below on config fields (``n_heads: HeadCount = Field(...)``); third-party
components may use them too. Pydantic reports a value over a bound as
``Input should be less than or equal to N``; :func:`modkit.spec.load_spec` adds which bound it is.

Memory: before allocating on a real device, :func:`modkit.build` and :func:`modkit.inference.generate` estimate the bytes
they need and refuse (:class:`~modkit.core.errors.MemoryLimitError`) when it exceeds the memory available, unless
called with ``check_memory=False`` (CLI: ``--no-memory-check``).
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

#: token ids [Gemma 3: 262,144]
MAX_VOCAB_SIZE = 2**24
#: residual width [PaLM 540B: 18,432]
MAX_D_MODEL = 2**17
#: Transformer blocks [Llama 3.1 405B: 126]
MAX_LAYERS = 512
#: context length in tokens [Llama 4 Scout: 10,485,760]
MAX_SEQ_LEN = 2**27
#: attention heads (query or key/value) [Llama 3.1 405B: 128]
MAX_HEADS = 2**12
#: width of one head [Gemma 2/3: 256]
MAX_HEAD_DIM = 2**12
#: hidden width of a position-wise FFN [PaLM 540B: 73,728]
MAX_D_FF = 2**20
#: experts of a mixture [DeepSeek-V3: 256; Kimi K2: 384]
MAX_EXPERTS = 2**14

#: largest spec, config, index or metadata JSON text modkit reads (bytes)
MAX_JSON_BYTES = 16 * 2**20
#: deepest nesting of JSON objects and arrays accepted (a spec nests about 6 levels)
MAX_JSON_DEPTH = 64


def bounded(maximum: int, minimum: int = 1) -> type:
    """``int`` constrained to ``[minimum, maximum]`` (strict: a bool, float or string is not accepted)."""
    return Annotated[int, Field(gt=minimum - 1, le=maximum)]


VocabSize = bounded(MAX_VOCAB_SIZE)
DModel = bounded(MAX_D_MODEL)
LayerCount = bounded(MAX_LAYERS)
SeqLen = bounded(MAX_SEQ_LEN)
HeadCount = bounded(MAX_HEADS)
HeadDim = bounded(MAX_HEAD_DIM)
FFNWidth = bounded(MAX_D_FF)
ExpertCount = bounded(MAX_EXPERTS)

#: the bound of each size field by name (used to say which bound a value exceeded)
BOUNDS: dict[str, int] = {
    "vocab_size": MAX_VOCAB_SIZE,
    "d_model": MAX_D_MODEL,
    "n_layers": MAX_LAYERS,
    "max_seq_len": MAX_SEQ_LEN,
    "n_heads": MAX_HEADS,
    "n_kv_heads": MAX_HEADS,
    "head_dim": MAX_HEAD_DIM,
    "d_ff": MAX_D_FF,
    "n_experts": MAX_EXPERTS,
    "top_k": MAX_EXPERTS,
    "sliding_window": MAX_SEQ_LEN,
    "original_max_seq_len": MAX_SEQ_LEN,
}

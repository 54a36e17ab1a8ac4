"""Documented bounds on every size a spec (or a Hugging Face config being converted) may give, and on input files.

Each bound lies far above any published model (the largest figure known when the bound was set is given in
brackets), so a real model never meets one; what they stop is a typo or a fuzzer turning a spec into a
multi-minute build or a tensor size torch cannot represent. Within the bounds, every tensor's element count fits
in int64 and a valid spec builds on ``meta`` in well under a second (``n_layers`` is the only bound that
affects build time: about 0.3-1 ms per layer, so at most about half a second).

Floats are bounded too (see *float bounds* below): a float without an upper bound let a spec validate and then
make a model whose first forward pass is not finite.

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

#: per-layer overrides of one spec [one per layer of the deepest published model, Llama 3.1 405B: 126]; twice
#: MAX_LAYERS, so even a spec giving every layer of the deepest model modkit builds its own override fits
MAX_OVERRIDES = 2 * MAX_LAYERS

#: largest spec, config, index or metadata JSON text modkit reads (bytes)
MAX_JSON_BYTES = 16 * 2**20
#: deepest nesting of JSON objects and arrays accepted (a spec nests about 6 levels)
MAX_JSON_DEPTH = 64


# ------------------------------------------------------------------------------------------------ float bounds
# A float field with no upper bound lets a spec validate and then make a model whose first forward pass is NaN or
# infinite (``init_std: 1e300``), or whose build fails inside torch (``expand: 1e300``). Every float of a spec and of
# the built-in components is bounded (tests/spec/test_bounds.py walks them all); the bounds below are generous (two
# or more orders of magnitude past the largest published value, in brackets) but keep float32 math finite.

#: std of the normal init of weight matrices [DeepSeek-V3: 0.006; GPT-2, Llama: 0.02]
MAX_INIT_STD = 1.0
#: a scalar multiplier of activations, scores, residuals or logits [Granite: embedding_multiplier 12; Gemma:
#: sqrt(d_model) = 73 at d_model 5,376; Cohere logit_scale 0.0625; 1/sqrt(head_dim) about 0.09]
MAX_MULTIPLIER = 1e3
#: tanh soft-cap of logits, lower and upper [Gemma 2: 30 on the logits, 50 on the attention scores]; below the
#: lower bound the division logits / cap overflows float16, above the upper cap · tanh(x / cap) is x in float32
MIN_SOFTCAP = 1e-2
MAX_SOFTCAP = 1e4
#: base of geometric position frequencies (RoPE theta, sinusoidal base) [Llama 2: 1e4; Qwen2.5-1M: 1e7; 1M-token
#: Llama 3 extensions: 3.6e9]; below 1 the frequencies grow with the feature index and theta^-1 overflows float32
MIN_THETA = 1.0
MAX_THETA = 1e12
#: a context-extension factor or frequency divisor of a RoPE scaling [DeepSeek-V3 YaRN: 40; Llama 3.2: 32]
MAX_ROPE_FACTOR = 1e4
#: YaRN's mscale coefficients [DeepSeek-V2/V3: 0.707 and 1.0]
MAX_MSCALE = 100.0
#: weight of an auxiliary loss [Mixtral: 0.02 balance; ST-MoE: 0.001 z-loss]
MAX_LOSS_COEF = 100.0
#: epsilon of a norm [BERT: 1e-12; GPT-2: 1e-5]; below the lower bound it is 0 in float32 and a constant row
#: divides 0 by 0
MIN_EPS = 1e-30
MAX_EPS = 1.0
#: lower bound on attention's softmax_scale [published: 1/sqrt(head_dim) >= 0.044 for head_dim <= 512, μP
#: 1/head_dim >= 0.002]; a scale that underflows the scores (1e-300, 0 in float32) made a validated spec's first
#: forward pass non-finite
MIN_SOFTMAX_SCALE = 1e-4
#: Mamba's d_inner / d_model [Mamba, Mamba-2, Jamba, Falcon-H1: 2]
MAX_EXPAND = 64.0
#: Mamba's initial step size Δ, lower and upper [Mamba: floor 1e-4, range 0.001-0.1]; Δ is stored as
#: softplus⁻¹(Δ) = Δ + log(-expm1(-Δ)), -inf when Δ rounds to 0 in float32
MIN_DT = 1e-8
MAX_DT = 10.0
#: bound on a clamp of Δ (transformers' time_step_limit; (0, inf) by default, which is null in a spec)
MAX_DT_CLAMP = 1e4

#: ``{field name: the published values behind its bound}``; a spec error for a float over its bound quotes it
FLOAT_BOUNDS: dict[str, str] = {
    "init_std": "published models use 0.006-0.02",
    "logit_scale": "published models use 0.03-1 (Cohere 0.0625, Granite 1/16, Falcon-H1 0.04)",
    "embedding_scale": "published models use up to sqrt(d_model), 73 for Gemma 3 27B",
    "output_multiplier": "published models use 0.5-1",
    "gate_multiplier": "published models use 0.5-1 (Falcon-H1)",
    "residual_multiplier": "published models use 0.2-1 (Granite 0.22)",
    "in_multipliers": "published models use 0.5-2 (Falcon-H1)",
    "out_multipliers": "published models use 0.5-2 (Falcon-H1)",
    "projection_multipliers": "published models use 0.2-2 (Falcon-H1's ssm_multipliers)",
    "softmax_scale": "published models use 1/sqrt(head_dim) or 1/head_dim (μP), between 1e-3 and 1",
    "logit_softcap": "Gemma 2 caps attention scores at 50",
    "final_logit_softcap": "Gemma 2 caps the logits at 30",
    "theta": "published models use 1e4-1e7 (1M-token Llama 3 extensions 3.6e9)",
    "base": "published models use 1e4",
    "factor": "published RoPE scalings use 4-40 (DeepSeek-V3 40)",
    "mscale": "DeepSeek uses 0.707-1",
    "mscale_all_dim": "DeepSeek uses 0.707-1",
    "attention_factor": "YaRN and LongRoPE factors are 1-2",
    "routed_scaling_factor": "published models use 1-2.83 (DeepSeek-V3 2.5, Kimi K2 2.827)",
    "aux_loss_coef": "published models use 1e-4-0.02",
    "z_loss_coef": "published models use 0-1e-3",
    "eps": "published models use 1e-12-1e-5",
    "norm_eps": "published models use 1e-6-1e-5",
    "expand": "Mamba, Mamba-2, Jamba and Falcon-H1 use 2",
    "dt_init_min": "Mamba uses 0.001",
    "dt_init_max": "Mamba uses 0.1",
    "dt_init_floor": "Mamba uses 1e-4",
}


def bounded_float(low: float, high: float, *, low_open: bool = False) -> type:
    """``float`` constrained to ``[low, high]`` (``(low, high]`` with ``low_open``): finite, strict like every
    spec float (an int is accepted, a string or bool is not)."""
    return Annotated[float, Field(gt=low, le=high) if low_open else Field(ge=low, le=high)]


#: a positive scalar multiplier, ``(0, MAX_MULTIPLIER]``
Multiplier = bounded_float(0.0, MAX_MULTIPLIER, low_open=True)
#: an attention softmax scale, ``[MIN_SOFTMAX_SCALE, MAX_MULTIPLIER]``
SoftmaxScale = bounded_float(MIN_SOFTMAX_SCALE, MAX_MULTIPLIER)
#: a RoPE scaling factor or frequency divisor, ``(0, MAX_ROPE_FACTOR]``
RopeFactor = bounded_float(0.0, MAX_ROPE_FACTOR, low_open=True)
#: a norm epsilon, ``[MIN_EPS, MAX_EPS]``
Epsilon = bounded_float(MIN_EPS, MAX_EPS)
#: an auxiliary loss weight, ``[0, MAX_LOSS_COEF]``
LossCoef = bounded_float(0.0, MAX_LOSS_COEF)
#: a Mamba initial step size, ``[MIN_DT, MAX_DT]``
StepSize = bounded_float(MIN_DT, MAX_DT)


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

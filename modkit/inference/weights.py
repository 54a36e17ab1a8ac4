"""Weight-only low-precision decoding: ``nn.Linear`` weights stored in bfloat16 or int8, activations unchanged.

Batch-1 decoding is a chain of matrix-vector products bound by the bytes of weight it reads per token (see
``benchmarks/results.md``); storing those weights in fewer bytes is the only way past the float32 roofline.
:func:`quantize_linears` swaps every ``nn.Linear`` of a model (the untied LM head included) for

* :class:`BFloat16Linear`: the weight rounded to bfloat16 (2 bytes per weight); the input is cast to bfloat16 for the
  product and the result back to the input's dtype, so the rest of the model (norms, attention, residual stream,
  KV cache) stays float32;
* :class:`Int8Linear`: per-output-channel symmetric int8 (``scale[o] = max_i |W[o, i]| / 127``,
  ``q = round(W / scale)`` in ``[-127, 127]``; 1 byte per weight plus one float32 scale per row), multiplied by
  ``torch._weight_int8pack_mm`` (PyTorch's weight-only int8 kernel, the one ``torchao``'s and gpt-fast's int8
  weight-only paths call) with a bfloat16 input and output, again cast back to the input's dtype. The scheme is
  LLM.int8()'s per-row absmax without outliers (Dettmers et al. 2022) and gpt-fast's ``WeightOnlyInt8Linear``.

The token embedding is not converted (a lookup reads one row per token, not the table); a head tied to the embedding
therefore stays in the embedding's dtype. ``torchao`` 0.18's ``Int8WeightOnlyConfig`` was measured and not used: on
an x86 CPU (one thread, batch 1) its int8 tensor multiplied about 2x (a 1408 x 512 block weight) to 14x (a 32000 x 512
head) slower than float32, while this kernel with a bfloat16 input was about 1.6x to 4.7x faster than float32
(``benchmarks/results_decode_weights.md``).
"""

from __future__ import annotations

import functools
import weakref
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from modkit.core.errors import ArgumentError
from modkit.core.roles import SWITCHED_OFF, declared_target

#: the weight formats ``generate(weights=...)`` and ``modkit generate --weights`` accept
WEIGHT_FORMATS = ("float32", "bfloat16", "int8")


def check_weights(value: object, name: str = "weights") -> Optional[str]:
    """``value`` if it is ``None`` or one of :data:`WEIGHT_FORMATS`.

    Raises:
        ArgumentError: anything else, naming ``name``, the value and the accepted formats.
    """
    if value is None or (isinstance(value, str) and value in WEIGHT_FORMATS):
        return value
    raise ArgumentError(
        name,
        f"{name} must be one of {', '.join(WEIGHT_FORMATS)} (how nn.Linear weights are stored for decoding), "
        f"got {value!r}",
    )


#: oneDNN-packed copies of :class:`BFloat16Linear` weights on a CPU, made at their first product (outside the module,
#: so ``copy.deepcopy``, ``state_dict`` and ``.to()`` see the plain weight only): module -> (weight version, packed)
_PACKED: "weakref.WeakKeyDictionary[nn.Module, tuple[tuple[int, int], Tensor]]" = weakref.WeakKeyDictionary()


@functools.lru_cache(maxsize=1)
def _onednn_bf16() -> bool:
    """Whether this CPU build of torch has oneDNN's bfloat16 linear (x86 with AVX-512 BF16 or AMX)."""
    mkldnn = getattr(torch.ops, "mkldnn", None)
    try:
        return bool(
            torch.backends.mkldnn.is_available()
            and hasattr(mkldnn, "_reorder_linear_weight")
            and hasattr(mkldnn, "_linear_pointwise")
            and torch.ops.mkldnn._is_mkldnn_bf16_supported()
        )
    except (AttributeError, RuntimeError):  # pragma: no cover - builds without the op
        return False


class BFloat16Linear(nn.Module):
    """``y = x W^T + b`` with ``W [out, in]`` stored in bfloat16; ``x [..., in]`` in any float dtype, ``y [..., out]``
    in the dtype of ``x``. The product runs in bfloat16 (float32 accumulation in the kernel); the bias is added in
    the input's dtype. Made by :meth:`from_linear`; inference only (the weight does not require grad).

    On a CPU whose oneDNN has bfloat16 (x86 with AVX-512 BF16 or AMX), eager products read a copy of the weight
    packed in oneDNN's blocked layout (``torch.ops.mkldnn._reorder_linear_weight``, the prepacking
    ``torch.compile``'s freezing pass does), made by :func:`quantize_linears` (or at the first product): batch-1 products from it are about 1.4x
    (a 1408 x 512 block weight) to 2.5x (a 32000 x 512 head) faster than plain ``F.linear`` on bfloat16 or
    float32 here (``benchmarks/results_decode_weights.md``). The copy costs a second 2 bytes per weight of memory;
    each product still reads 2. Under ``torch.compile`` the plain ``F.linear`` on the bfloat16 weight is traced
    instead (the packed copy is opaque to it): measured no faster than compiled float32.
    """

    def __init__(self, weight: Tensor, bias: Optional[Tensor]):
        super().__init__()
        self.in_features, self.out_features = weight.shape[1], weight.shape[0]
        self.weight = nn.Parameter(weight.detach().to(torch.bfloat16).contiguous(), requires_grad=False)
        self.bias = None if bias is None else nn.Parameter(bias.detach().clone(), requires_grad=False)

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> "BFloat16Linear":
        """The bfloat16 copy of ``linear`` (round to nearest even)."""
        return cls(linear.weight, linear.bias)

    def _packed(self) -> Optional[Tensor]:
        """The oneDNN-packed weight (made or remade when the weight changed), or ``None`` where there is none."""
        w = self.weight
        if w.device.type != "cpu" or torch.compiler.is_compiling() or not _onednn_bf16():
            return None
        key = (w._version, w.data_ptr())
        found = _PACKED.get(self)
        if found is None or found[0] != key:
            found = (key, torch.ops.mkldnn._reorder_linear_weight(w.detach(), 1))
            _PACKED[self] = found
        return found[1]

    def forward(self, x: Tensor) -> Tensor:
        """``x [..., in]`` -> ``[..., out]``, dtype of ``x``."""
        xb = x.to(torch.bfloat16)
        packed = self._packed()
        if packed is not None:
            y = torch.ops.mkldnn._linear_pointwise(xb, packed, None, "none", [None], "")
        else:
            y = F.linear(xb, self.weight)
        y = y.to(x.dtype)
        return y if self.bias is None else y + self.bias.to(x.dtype)

    def extra_repr(self) -> str:
        """``in_features, out_features, bias``."""
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


def quantize_int8(weight: Tensor) -> tuple[Tensor, Tensor]:
    """Per-output-channel symmetric int8 of ``weight [out, in]``: ``(q [out, in] int8, scale [out] float32)`` with
    ``scale = max_i |W[o, i]| / 127`` (1 for an all-zero row) and ``q = round(W / scale)``, so ``q * scale[:, None]``
    is within ``scale / 2`` of ``W`` everywhere (LLM.int8()'s absmax row quantization, Dettmers et al. 2022)."""
    w = weight.detach().float()
    amax = w.abs().amax(dim=1)
    scale = torch.where(amax > 0, amax / 127.0, torch.ones_like(amax))
    q = torch.round(w / scale[:, None]).clamp_(-127, 127).to(torch.int8)
    return q.contiguous(), scale


class Int8Linear(nn.Module):
    """``y = x (q · scale)^T + b``: a weight-only int8 linear layer (:func:`quantize_int8`); ``x [..., in]`` in any
    float dtype, ``y [..., out]`` in the dtype of ``x``.

    Buffers: ``weight_int8 [out, in]`` int8 and ``scale [out]`` float32 (both saved in ``state_dict``). The product is
    ``torch._weight_int8pack_mm`` on a bfloat16 input (its fast path on x86 with AVX-512; the output is rounded to
    bfloat16, then cast back), as gpt-fast's ``WeightOnlyInt8Linear``; on a device without that kernel the weight
    is dequantized per call, and so it is on a CPU for an input width that is not a multiple of 16 (torch 2.13's
    CPU kernel reads the width in blocks of 16 with no tail: other widths crash or give wrong numbers). Inference
    only.
    """

    def __init__(self, q: Tensor, scale: Tensor, bias: Optional[Tensor]):
        super().__init__()
        self.in_features, self.out_features = q.shape[1], q.shape[0]
        self.register_buffer("weight_int8", q)
        self.register_buffer("scale", scale.float())
        self.register_buffer("_scale_bf16", scale.to(torch.bfloat16), persistent=False)
        self.bias = None if bias is None else nn.Parameter(bias.detach().clone(), requires_grad=False)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        """torch's loading hook, then the scales' bfloat16 copy (not saved) remade from the loaded scales."""
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
        self._scale_bf16 = self.scale.to(torch.bfloat16)

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> "Int8Linear":
        """The int8 version of ``linear`` (:func:`quantize_int8` of its weight)."""
        q, scale = quantize_int8(linear.weight)
        return cls(q, scale, linear.bias)

    def forward(self, x: Tensor) -> Tensor:
        """``x [..., in]`` -> ``[..., out]``, dtype of ``x``."""
        flat = x.reshape(-1, self.in_features)
        if flat.device.type == "cuda" or (flat.device.type == "cpu" and self.in_features % 16 == 0):
            y = torch._weight_int8pack_mm(flat.to(torch.bfloat16).contiguous(), self.weight_int8, self._scale_bf16)
        else:  # other devices, and input widths the CPU kernel cannot take: dequantize per call
            y = F.linear(flat, self.weight_int8.to(flat.dtype) * self.scale[:, None].to(flat.dtype))
        y = y.to(x.dtype).reshape(*x.shape[:-1], self.out_features)
        return y if self.bias is None else y + self.bias.to(x.dtype)

    def extra_repr(self) -> str:
        """``in_features, out_features, bias``."""
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


_KINDS = {"bfloat16": BFloat16Linear, "int8": Int8Linear}


def weight_format(model: nn.Module) -> str:
    """``"int8"`` or ``"bfloat16"`` when :func:`quantize_linears` converted ``model``, else ``"float32"`` (stored as
    loaded, whatever the dtype).

    Raises:
        ValueError: the model mixes both converted kinds.
    """
    found = {name for name, kind in _KINDS.items() for m in model.modules() if type(m) is kind}
    if len(found) > 1:
        raise ValueError(f"the model mixes {' and '.join(sorted(found))} linear layers; load it again")
    return found.pop() if found else "float32"


def check_convertible(model: nn.Module, weights: Optional[str]) -> None:
    """Whether :func:`quantize_linears` can give ``model`` the format ``weights`` (``None``: anything goes).

    Raises:
        ArgumentError: ``weights`` is not one of :data:`WEIGHT_FORMATS`; or the model was already converted to
            another format (``"float32"`` included: rounding cannot be undone; load the model again).
    """
    check_weights(weights)
    current = weight_format(model) if weights is not None else "float32"
    if current != "float32" and current != weights:
        raise ArgumentError(
            "weights",
            f"weights={weights!r}: this model's linear weights are already stored as {current} (rounding cannot be "
            f"undone); load the model again to decode with {weights} weights",
        )


def declared_matrix_weights(model: nn.Module) -> tuple[set[int], list[str]]:
    """``(ids, unresolved)``: the ``id`` of every weight a module of ``model`` declares in ``matrix_weights``, and
    ``"Type.name"`` of every declared name that resolves to nothing (a typo; :func:`matrix_weights` skips it).

    ``matrix_weights`` is a class attribute, a tuple of parameter names relative to the module, naming the
    ``nn.Linear`` weights the module also reads as tensors of its own (per-head views, products outside the layer's
    forward, a float32 read). Those must stay the float32 ``nn.Linear`` they were built as, in their built row-major
    layout: ``mla``'s ``kv_b_proj`` (``W_UK`` and ``W_UV`` of its absorbed decode), a router's ``proj`` (read in
    float32). :func:`quantize_linears` and :func:`~modkit.inference.generate.column_major_linears` leave them as
    they are. Names resolve as ``param_roles`` names do (:func:`modkit.core.roles.declared_target`): one that runs
    through an attribute set to ``None`` (an optional child left out) is skipped."""
    ids, unresolved = set(), []
    for module in model.modules():
        for name in getattr(module, "matrix_weights", ()):
            target = declared_target(module, name)
            if isinstance(target, nn.Parameter):
                ids.add(id(target))
            elif target is not SWITCHED_OFF:
                unresolved.append(f"{type(module).__name__}.{name}")
    return ids, unresolved


def matrix_weights(model: nn.Module) -> set[int]:
    """The ``id`` of every weight a module of ``model`` declares it reads itself (:func:`declared_matrix_weights`)."""
    return declared_matrix_weights(model)[0]


@torch.no_grad()
def quantize_linears(model: nn.Module, weights: str) -> int:
    """Replace every ``nn.Linear`` inside ``model`` (in place) by its ``weights`` version: ``"bfloat16"``
    (:class:`BFloat16Linear`) or ``"int8"`` (:class:`Int8Linear`); ``"float32"`` changes nothing.

    Embeddings are left as they are (so is a head tied to the embedding), and so are the weights a module declares it
    reads as matrices of its own (:func:`matrix_weights`). Idempotent: a model already in ``weights`` converts
    nothing. Module attributes such as ``modkit_kind`` are kept on the replacement.

    Returns:
        the number of layers replaced.

    Raises:
        ArgumentError: ``weights`` is not one of :data:`WEIGHT_FORMATS`; the model was already converted to the other
            format, or ``"float32"`` is asked of a converted model (reload it: rounding cannot be undone).
    """
    check_convertible(model, weights)
    if weights == "float32":
        return 0
    kind = _KINDS[weights]
    targets = [(parent, name, child) for parent in model.modules() for name, child in parent.named_children()]
    changed, keep = 0, matrix_weights(model)
    for parent, name, child in targets:
        if type(child) is not nn.Linear or type(child.weight.data) is not torch.Tensor or id(child.weight) in keep:
            continue  # (subclasses and tensor subclasses such as DTensor shards are left alone)
        new = kind.from_linear(child).to(child.weight.device)
        for key, value in vars(child).items():
            if key.startswith("modkit_"):
                setattr(new, key, value)
        if isinstance(new, BFloat16Linear):
            new._packed()  # pack now (on a CPU with oneDNN bfloat16), not inside the first timed product
        setattr(parent, name, new)
        changed += 1
    return changed


def linear_weight_bytes(model: nn.Module) -> dict[str, int]:
    """Bytes the linear layers' weights take: ``{"weights": ..., "scales": ...}`` (``nn.Linear`` weights in their
    dtype, :class:`BFloat16Linear` 2 per weight, :class:`Int8Linear` 1 per weight plus 4 per row in ``scales``);
    biases and embeddings not counted."""
    weights = scales = 0
    for m in model.modules():
        if isinstance(m, (nn.Linear, BFloat16Linear)):
            weights += m.weight.nelement() * m.weight.element_size()
        elif isinstance(m, Int8Linear):
            weights += m.weight_int8.nelement() * m.weight_int8.element_size()
            scales += m.scale.nelement() * m.scale.element_size()
    return {"weights": weights, "scales": scales}

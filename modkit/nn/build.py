"""Assembly: spec → ``nn.Module`` on the requested device and dtype, plus analytic summaries.

``build`` always constructs on ``meta`` first (instant even for 70B specs), then materialises with
``to_empty`` on the target device (every tensor then poisoned with NaN, so nothing depends on uninitialised
memory: :func:`to_empty_poisoned`) and runs one deterministic ``init_weights(seed)`` that also recomputes
every buffer. With ``device="meta"`` it stops after construction.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Union

import torch
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode

from modkit.core.arguments import MAX_SEED, check_int
from modkit.core.interfaces import BuildContext
from modkit.nn.model import Model
from modkit.nn.sharing import share_blocks, share_kv, shared_root, tie_shared
from modkit.core.registry import Registry, get_registry
from modkit.spec import ModelSpec, iter_configs, load_spec, position_geometry, spec_model

BREAKDOWN_KEYS = ("embedding", "position", "attention", "ffn", "norm", "lm_head")
#: kinds whose parameters :func:`breakdown` counts apart; ``mixer`` (recurrent token mixers) is listed only when present
_KIND_TO_KEY = {**{k: k for k in BREAKDOWN_KEYS}, "mixer": "mixer"}


#: torch.nn.init's fills: skipped on meta tensors while constructing (``init_weights`` sets every tensor afterwards)
_INIT_FUNCS = frozenset(
    getattr(nn.init, n)
    for n in dir(nn.init)
    if n.endswith("_") and not n.startswith("_") and callable(getattr(nn.init, n))
)
#: in-place fills of a tensor, skipped on meta tensors while constructing (on meta some, e.g. ``normal_``, pull in
#: torch's decomposition machinery and cost seconds; they compute nothing there)
_FILLS = frozenset(
    getattr(torch.Tensor, n)
    for n in (
        "normal_",
        "uniform_",
        "fill_",
        "zero_",
        "random_",
        "exponential_",
        "bernoulli_",
        "log_normal_",
        "cauchy_",
        "geometric_",
        "copy_",
    )
)
_SKIPPED = _INIT_FUNCS | _FILLS
#: factories whose result without a ``dtype`` is always in the default dtype: the dtype is passed in directly
_FLOAT_FACTORIES = frozenset((torch.empty, torch.zeros, torch.ones, torch.rand, torch.randn, torch.empty_strided))
#: conversions that name their dtype explicitly: their result is never re-typed
_EXPLICIT = frozenset(getattr(torch.Tensor, n) for n in ("float", "double", "to", "type", "type_as"))


class _Construction(TorchFunctionMode):
    """Construct modules in ``dtype`` with torch's init fills skipped, for the calling thread only.

    torch's function-mode stack is thread-local, so unlike ``torch.set_default_dtype`` or patching
    ``torch.nn.init`` (process-wide), this changes nothing another thread sees. Inside the mode:

    * a ``torch.nn.init`` fill or an in-place fill of a meta tensor returns it untouched (construction happens on
      meta, where they compute nothing; ``init_weights`` sets every value afterwards);
    * a floating tensor that a call made in the process's default dtype without naming a dtype and without any
      floating input (factories such as ``torch.empty`` in ``nn.Linear``, int -> float promotion) is given
      ``dtype`` instead: what ``torch.set_default_dtype(dtype)`` would have produced. Tensors created with an
      explicit dtype (a float32 RoPE table) keep it.
    """

    def __init__(self, dtype: torch.dtype):
        super().__init__()
        self.dtype = dtype
        self.default = torch.get_default_dtype()
        self.retype = dtype != self.default

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in _SKIPPED:
            tensor = args[0] if args else (kwargs or {}).get("tensor")
            if isinstance(tensor, Tensor) and tensor.is_meta:
                return tensor
        if self.retype and func in _FLOAT_FACTORIES and (kwargs or {}).get("dtype") is None:
            return func(*args, **{**(kwargs or {}), "dtype": self.dtype})
        out = func(*args, **(kwargs or {}))
        if (
            self.retype
            and isinstance(out, Tensor)
            and out.dtype is self.default
            and func not in _EXPLICIT
            and not (kwargs and kwargs.get("dtype") is not None)
            and not any(isinstance(a, torch.dtype) or (isinstance(a, Tensor) and a.is_floating_point()) for a in args)
            and not (kwargs and any(isinstance(a, Tensor) and a.is_floating_point() for a in kwargs.values()))
        ):
            out = out.to(self.dtype)
        return out


def _parse_dtype(dtype: Union[str, torch.dtype, None]) -> torch.dtype:
    if dtype is None:
        return torch.float32
    if isinstance(dtype, torch.dtype):
        out = dtype
    else:
        out = getattr(torch, str(dtype).replace("torch.", ""), None)
        if not isinstance(out, torch.dtype):
            raise ValueError(f"unknown dtype {dtype!r}; use float32, bfloat16 or float16")
    if out not in (torch.float32, torch.bfloat16, torch.float16, torch.float64):  # not ints, not float8 storage types
        raise ValueError(
            f"dtype must be a floating type (float32, bfloat16, float16; float64 for reference checks), got {out}"
        )
    return out


def _position_key(cfg, heads: tuple, registry: Registry) -> tuple:
    """Layers share one position module per distinct config; q/k and bias schemes also depend on the heads."""
    acts_on = registry.entry_for_config(cfg, "position").capabilities.get("acts_on")
    return (cfg.model_dump_json(), heads if acts_on in ("qk", "bias") else None)


def _construct(spec: ModelSpec, registry: Registry) -> Model:
    base = BuildContext(
        spec.d_model,
        spec.n_layers,
        spec.vocab_size,
        spec.max_seq_len,
        registry,
        attention_dropout=spec.dropout.attention,
        residual_dropout=spec.dropout.residual,
        parametrization=spec.parametrization,
    )
    layer_specs = [spec.layer(i) for i in range(spec.n_layers)]
    # a wide residual stream (spec 'stream', modkit.nn.stream): built first, its connections built by each placement
    stream = base.build(spec.stream) if spec.stream is not None else None
    placed = {"extra": {"stream": stream}} if stream is not None else {}
    blocks, pos_keys, pos_modules, layer_position, windows = [], {}, [], [], []
    mixers, geometries = [], []
    for ls in layer_specs:
        ctx = base.__class__(**{**base.__dict__, "layer_index": ls.index})
        mixer = ctx.build(ls.attention)
        ffn = ctx.build(ls.ffn) if ls.ffn is not None else None
        # the per-head width the scheme acts on is what the token mixer declares (PositionGeometry), the same
        # geometry the spec was validated with: MLA's rope acts on its qk_rope_head_dim part only; a recurrent
        # mixer declares none (it has no queries or keys)
        geo = position_geometry(ls.attention, ctx, mixer)
        mixers.append((ctx, mixer, ffn))
        geometries.append((geo.n_heads, geo.head_dim) if geo is not None and (geo.n_heads or geo.head_dim) else None)
    # a layer whose mixer declares no geometry shares the scheme built for another layer with the same config (it
    # ignores it; validation refused a rotary or bias scheme no layer could take)
    by_config = {}
    for ls, heads in zip(layer_specs, geometries):
        if heads is not None:
            by_config.setdefault(ls.position.model_dump_json(), heads)
    kv_sources = share_kv(spec, [mixer for _, mixer, _ in mixers]) if spec.kv_sharing else {}
    first_heads = next((h for h in geometries if h is not None), (None, None))
    for ls, heads, (ctx, mixer, ffn) in zip(layer_specs, geometries, mixers):
        heads = heads if heads is not None else by_config.get(ls.position.model_dump_json(), (None, None))
        key = _position_key(ls.position, heads, registry)
        if key not in pos_keys:
            pos_keys[key] = len(pos_modules)
            pos_modules.append(ctx.build(ls.position, n_heads=heads[0], head_dim=heads[1]))
        layer_position.append(pos_keys[key])
        block = ctx.build(ls.placement, attention=mixer, ffn=ffn, norm=ls.norm, **placed)
        blocks.append(block)
        # how many of the latest positions a query sees (a ring of that many cache slots): the attention's
        # attention_span when it declares one (sliding window, chunked attention), else its sliding_window
        windows.append(
            mixer.attention_span if hasattr(mixer, "attention_span") else getattr(mixer, "sliding_window", None)
        )
    # the model-level scheme (it acts on embeddings) is the one layer 0 would use without overrides, with the
    # geometry of the first layer that declares one
    heads0 = by_config.get(spec.position.model_dump_json(), first_heads)
    top_key = _position_key(spec.position, heads0, registry)
    if top_key not in pos_keys:
        pos_keys[top_key] = len(pos_modules)
        pos_modules.append(base.build(spec.position, n_heads=heads0[0], head_dim=heads0[1]))
    order = [pos_keys[top_key]] + [i for i in range(len(pos_modules)) if i != pos_keys[top_key]]
    remap = {old: new for new, old in enumerate(order)}
    positions = nn.ModuleList([pos_modules[i] for i in order])
    layer_position = [remap[i] for i in layer_position]
    embed = nn.Embedding(spec.vocab_size, spec.d_model)
    embed.modkit_kind = "embedding"
    embedding_norm = base.build(spec.embedding_norm) if spec.embedding_norm is not None else None
    final_norm = base.build(spec.final_norm) if spec.final_norm is not None else None
    # per-use adapters; {owner: [other uses]}, {owner: shared part path}
    shared, parts = share_blocks(spec, blocks) if spec.share else ({}, {})
    model = Model(spec, embed, positions, layer_position, nn.ModuleList(blocks), embedding_norm, final_norm, windows)
    model.stream = stream
    model.kv_sources = kv_sources
    model.shared_blocks = shared
    model.shared_parts = parts
    tie_shared(model)  # the uses of a shared block hold its owner's tensors (modkit.nn.sharing)
    if spec.mtp is not None:
        model.mtp = _mtp_modules(spec, base, layer_specs[-1])
    return model


def _mtp_modules(spec: ModelSpec, base, last) -> nn.ModuleList:
    """The ``spec.mtp.depth`` modules of multi-token prediction (:mod:`modkit.nn.mtp`): each a block with the
    components of the last layer ``last`` (built as layer ``n_layers + k - 1``), the block norm three times."""
    from modkit.nn.mtp import MTPModule

    modules = []
    for k in range(spec.mtp.depth):
        ctx = base.__class__(**{**base.__dict__, "layer_index": spec.n_layers + k})
        mixer = ctx.build(last.attention)
        ffn = ctx.build(last.ffn) if last.ffn is not None else None
        block = ctx.build(last.placement, attention=mixer, ffn=ffn, norm=last.norm)
        norms = [ctx.build(last.norm) for _ in range(3)]
        modules.append(MTPModule(block, *norms, spec.d_model))
    return nn.ModuleList(modules)


def build(
    spec: Union[ModelSpec, dict, str, Path],
    *,
    device: Union[str, torch.device, None] = None,
    dtype: Union[str, torch.dtype, None] = None,
    seed: int = 0,
    registry: Optional[Registry] = None,
    check_memory: bool = True,
) -> Model:
    """Assemble a model from a spec.

    Args:
        spec: a :class:`ModelSpec`, a dict, a JSON string or a path to a spec file (validated with
            :func:`~modkit.spec.load_spec`).
        device: target device (``"cpu"``, ``"cuda:0"``, ``"meta"``...); default CPU. On ``meta`` no memory
            is allocated and weights are left uninitialised.
        dtype: parameter dtype (``float32`` default, ``bfloat16``, ``float16``); buffers that need float32
            (e.g. RoPE inverse frequencies) stay float32.
        seed: seed of the deterministic weight init, an integer in [0, 2**64 - 1].
        registry: defaults to the process-wide registry.
        check_memory: on a real device, first estimate the bytes of every parameter and buffer and refuse
            (:class:`~modkit.core.errors.MemoryLimitError`, giving the estimate and the memory available) when they
            exceed the memory free there; ``False`` skips the estimate.

    Construction happens on ``meta`` under a torch function mode private to the calling thread
    (:class:`_Construction`): no process-wide state (default dtype, ``torch.nn.init``) is touched, so threads
    may build concurrently.

    Returns:
        :class:`~modkit.nn.model.Model` in training mode.

    Raises:
        SpecError: the spec is invalid.
        ValueError: unknown dtype; ``seed`` not an integer in range (:class:`~modkit.core.errors.ArgumentError`).
        MemoryLimitError: the model would not fit (see ``check_memory``).
    """
    from modkit.nn.memory import check_fits, module_bytes

    reg = registry or get_registry()
    if not isinstance(spec, spec_model(reg)):
        spec = load_spec(spec, registry=reg)
    torch_dtype = _parse_dtype(dtype)
    check_int(seed, "seed", None, minimum=0, maximum=MAX_SEED)
    target = torch.device(device) if device is not None else torch.device("cpu")
    with torch.device("meta"), _Construction(torch_dtype):
        model = _construct(spec, reg)
    if target.type == "meta":
        return model
    if check_memory:
        dt = str(torch_dtype).replace("torch.", "")
        check_fits(
            module_bytes(model),
            target,
            f"the weights and buffers of this model ({dt})",
            hint="use a smaller spec or dtype, or build on meta to inspect it",
        )
    to_empty_poisoned(model, target)
    tie_shared(model)  # to_empty gave every module its own tensors: the uses of a shared block hold the owner's again
    model.init_weights(seed)
    return model


def to_empty_poisoned(model: nn.Module, device: Union[str, torch.device]) -> nn.Module:
    """``model.to_empty(device)``, then fill every parameter and buffer with a poison value; returns ``model``.

    ``to_empty`` allocates without initialising, so a tensor that ``init_weights`` forgets (a buffer computed only in
    ``__init__``: transformers #45902) would otherwise hold whatever the allocator returned: often garbage, sometimes
    by chance the freed memory of the right values, so the fault would show on one machine and not another. After
    this fill the result never depends on uninitialised memory: such a tensor is NaN (floating and complex dtypes),
    its dtype's minimum (integers) or ``True`` (bool) on every machine, and the ``meta_init`` contract check reports
    it by name. Sharded (DTensor) tensors are filled shard by shard.

    Args:
        model: a module whose tensors are on ``meta`` (any shapes and dtypes).
        device: where to allocate.
    """
    model.to_empty(device=device)
    with torch.no_grad():
        for t in (*model.parameters(), *model.buffers()):
            local = t.to_local() if hasattr(t, "to_local") else t
            if local.dtype.is_floating_point or local.dtype.is_complex:
                local.fill_(float("nan"))
            elif local.dtype == torch.bool:
                local.fill_(True)
            else:
                local.fill_(torch.iinfo(local.dtype).min)
    return model


def count_params(
    spec_or_model: Union[ModelSpec, dict, str, Path, nn.Module], *, registry: Optional[Registry] = None
) -> int:
    """Exact number of parameters (shared tensors counted once), built on ``meta`` if given a spec."""
    return breakdown(spec_or_model, registry=registry)["total"]


def _model(spec_or_model, registry) -> Model:
    if isinstance(spec_or_model, nn.Module):
        return spec_or_model
    return build(spec_or_model, device="meta", registry=registry)


def breakdown(spec_or_model: Any, *, registry: Optional[Registry] = None) -> dict[str, int]:
    """Parameter counts by category: ``embedding, position, attention, ffn, norm, lm_head, total``.

    Each parameter is assigned to the outermost enclosing module tagged with a kind (``attention`` includes
    QK-norm weights, ``ffn`` includes MoE routers, ``norm`` every norm outside attention), except that a token
    mixer inside another (the attention of a parallel hybrid layer) counts as its own kind. Recurrent token mixers
    (kind ``mixer``: Mamba-2, Gated DeltaNet, their convolutions and gated norms) count under ``mixer``, present
    only when non-zero. Tied weights count once, under ``embedding``. Parameters owned directly by a placement (no
    sublayer) count under ``other``, present only when non-zero.
    """
    model = _model(spec_or_model, registry)
    counts = {k: 0 for k in BREAKDOWN_KEYS}
    counts["other"] = counts["mixer"] = 0
    seen: set[int] = set()

    def walk(module: nn.Module, category: str) -> None:
        kind = getattr(module, "modkit_kind", None)
        if category == "other" or (category == "mixer" and kind == "attention"):
            # the outermost tagged module decides (a QK-norm stays attention), but an attention beside a recurrent
            # mixer (inside a parallel hybrid) is attention
            category = _KIND_TO_KEY.get(kind, category)
        for p in module.parameters(recurse=False):
            if id(p) not in seen:
                seen.add(id(p))
                counts[category] += p.numel()
        for child in module.children():
            walk(child, category)

    if isinstance(model, Model):  # its only direct parameter is a tied head's bias
        for p in model.parameters(recurse=False):
            seen.add(id(p))
            counts["lm_head"] += p.numel()
        for child in model.children():
            walk(child, "other")
    else:
        walk(model, "other")
    for optional in ("other", "mixer"):
        if counts[optional] == 0:
            del counts[optional]
    counts["total"] = sum(counts.values())
    return counts


def _cache_specs(model: nn.Module) -> list:
    """Every mixer's :class:`~modkit.CacheSpec` of a model (per layer, :meth:`Model.cache_layout`), or of a
    component module built alone (the mixers it holds)."""
    from modkit.nn.model import mixer_specs

    if isinstance(model, Model):
        return [spec for specs in model.cache_layout() for spec in specs.values()]
    return list(mixer_specs(model).values())


def kv_cache_bytes_per_token(
    spec_or_model: Any, dtype: Union[str, torch.dtype, None] = "bfloat16", *, registry: Optional[Registry] = None
) -> int:
    """Bytes of cache one token occupies across all layers: ``Σ_layers Σ_mixers CacheSpec.bytes_per_token(dtype)``,
    from what each token mixer declares (:meth:`Model.cache_layout`; the built-in attention:
    ``2 · n_kv_heads · head_dim · bytes(dtype)`` per layer; MLA: ``(kv_lora_rank + qk_rope_head_dim) · bytes``).

    Windows do not shorten it (a windowed layer still adds these bytes per token until its ring is full); a
    recurrent mixer's fixed state is not per token (:func:`cache_state_bytes_per_sequence`); a per-block entry
    (growth ``"block"``, block-compressed attention) adds its bytes once per ``block`` tokens, counted as
    ``ceil(bytes / block)`` per token (:func:`kv_cache_bytes` is exact).
    """
    model = _model(spec_or_model, registry)
    return sum(spec.bytes_per_token(_parse_dtype(dtype)) for spec in _cache_specs(model))


def cache_state_bytes_per_sequence(
    spec_or_model: Any, dtype: Union[str, torch.dtype, None] = "bfloat16", *, registry: Optional[Registry] = None
) -> int:
    """Bytes of fixed-size state one sequence holds across all layers, whatever its length (recurrent mixers'
    convolution windows and SSM states: ``Σ CacheSpec.bytes_per_sequence(dtype)``); 0 for attention-only models."""
    model = _model(spec_or_model, registry)
    return sum(spec.bytes_per_sequence(_parse_dtype(dtype)) for spec in _cache_specs(model))


def kv_cache_bytes(
    spec_or_model: Any,
    max_len: Optional[int] = None,
    batch: int = 1,
    dtype: Union[str, torch.dtype, None] = "bfloat16",
    *,
    registry: Optional[Registry] = None,
) -> int:
    """Bytes ``model.new_cache(batch, max_len, dtype)`` allocates (:meth:`~modkit.nn.model.Model.new_cache`), from the
    mixers' declarations: per layer and mixer ``batch · (bytes_per_token · slots + bytes_per_sequence)`` with
    ``slots = max_len``, or ``min(window, max_len)`` for a sliding-window layer (a ring buffer; :mod:`modkit.nn.cache`),
    and per-block entries ``bytes · (max_len // block)`` (:meth:`~modkit.nn.cache.CacheSpec.nbytes`).
    The one formula of the cache size: the model card (``modkit build``), ``modkit cost`` and the memory check of
    ``generate`` all use it, and the contract kit checks that it equals what ``new_cache`` allocates.

    Args:
        max_len: tokens per row; default ``spec.max_seq_len``.
        batch: rows.
        dtype: of the entries (an entry may declare its own); ``None`` for the model's dtype.

    Raises:
        ValueError: ``max_len`` or ``batch`` below 1; a layer without a token mixer (see ``Model.cache_layout``).
    """
    model = _model(spec_or_model, registry)
    tdtype = _parse_dtype(dtype) if dtype is not None else model.embed.weight.dtype
    max_len = max_len if max_len is not None else model.spec.max_seq_len
    if max_len < 1 or batch < 1:
        raise ValueError(f"max_len and batch must be >= 1, got max_len {max_len}, batch {batch}")
    return sum(spec.nbytes(max_len, batch, tdtype) for specs in model.cache_layout() for spec in specs.values())


def active_params_per_token(spec_or_model: Any, *, registry: Optional[Registry] = None) -> int:
    """Parameters used per token: total minus what sparse modules skip (``inactive_params_per_token()``; a block
    shared across layers counts what one use skips, once)."""
    model = _model(spec_or_model, registry)
    inactive = 0
    # a shared block's uses hold one set of parameters (spec 'share'): what one use skips counts once
    copies = {
        id(m)
        for owner, uses in getattr(model, "shared_blocks", {}).items()
        for i in uses
        for m in shared_root(model, i, owner).modules()
    }
    for module in model.modules():
        if id(module) in copies:
            continue
        fn = getattr(module, "inactive_params_per_token", None)
        if callable(fn):
            inactive += int(fn())
    return breakdown(model)["total"] - inactive


@dataclass
class ModelSummary:
    """What ``modkit build`` reports about a spec (see :func:`summarize`)."""

    name: Optional[str]
    params: dict[str, int]
    active_params_per_token: int
    weight_bytes: int
    kv_cache_bytes_per_token: int
    dtype: str
    components: list[dict] = field(default_factory=list)
    #: bytes of one sequence's cache at max_seq_len as allocated (sliding-window layers keep min(window, max_seq_len)),
    #: fixed-size state included
    kv_cache_bytes_per_sequence: int = 0
    #: of which fixed-size state (recurrent mixers), whatever the sequence length
    cache_state_bytes_per_sequence: int = 0
    #: sliding window of each layer (``None``: global attention)
    windows: list[Optional[int]] = field(default_factory=list)
    #: the smallest block of each layer's per-block entries (``growth="block"``: one compressed entry per block of
    #: tokens, growing with the context beside a window), ``None`` without any
    blocks: list[Optional[int]] = field(default_factory=list)

    def to_json(self) -> dict:
        """The ``--json`` object of ``modkit build``."""
        return {
            "name": self.name,
            "dtype": self.dtype,
            "params": self.params,
            "active_params_per_token": self.active_params_per_token,
            "weight_bytes": self.weight_bytes,
            "kv_cache_bytes_per_token": self.kv_cache_bytes_per_token,
            "kv_cache_bytes_per_sequence": self.kv_cache_bytes_per_sequence,
            "cache_state_bytes_per_sequence": self.cache_state_bytes_per_sequence,
            "components": self.components,
        }


def summarize(
    model: Model, dtype: Union[str, torch.dtype, None] = None, registry: Optional[Registry] = None
) -> ModelSummary:
    """Parameter breakdown, active parameters, weight and cache bytes (per token, per sequence of ``max_seq_len``
    as :func:`kv_cache_bytes` allocates it, and fixed-size state per sequence; all from the mixers' declarations)
    and components used of a built model."""
    reg = registry or get_registry()
    tdtype = _parse_dtype(dtype) if dtype is not None else model.embed.weight.dtype
    size = torch.empty((), dtype=tdtype).element_size()
    params = breakdown(model)
    comps: dict[tuple[str, str], dict] = {}
    for path, cfg in iter_configs(model.spec):
        entry = reg.entry_for_config(cfg)
        item = comps.setdefault(
            entry.key,
            {
                "kind": entry.kind,
                "type": entry.type,
                "plugin": entry.provider.plugin,
                "distribution": entry.provider.distribution,
                "version": entry.provider.version,
                "paths": [],
            },
        )
        item["paths"].append(path)
    return ModelSummary(
        name=model.spec.name,
        params=params,
        active_params_per_token=active_params_per_token(model),
        weight_bytes=params["total"] * size,
        kv_cache_bytes_per_token=kv_cache_bytes_per_token(model, tdtype),
        dtype=str(tdtype).replace("torch.", ""),
        components=list(comps.values()),
        kv_cache_bytes_per_sequence=kv_cache_bytes(model, model.spec.max_seq_len, 1, tdtype),
        cache_state_bytes_per_sequence=cache_state_bytes_per_sequence(model, tdtype),
        windows=[
            next((sp.window for sp in specs.values() if sp.token_entries and sp.window is not None), None)
            for specs in model.cache_layout()
        ],
        blocks=[
            min((e.block for sp in specs.values() for e in sp.entries if e.per_block), default=None)
            for specs in model.cache_layout()
        ],
    )

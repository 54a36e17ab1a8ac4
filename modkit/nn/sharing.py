"""Sharing across layers, as the spec declares it: one block's parameters at several depths (spec ``share``) and
layers that read an earlier layer's keys and values (spec ``kv_sharing``).

**Block sharing** (Zamba2's shared attention block; Universal Transformers, Dehghani et al. 2018,
arXiv:1807.03819; ALBERT, Lan et al. 2019, arXiv:1909.11942). Every layer still gets a block module of its own
(its own hooks, its own path ``layers.i``, its own cache entries), but the blocks of one group hold the *same*
parameter and buffer objects, those of the group's first layer (the owner): ``named_parameters`` and
``modkit.count_params`` see each once, an optimizer steps it once, and autograd sums its gradient over the uses.
:func:`tie_shared` makes the blocks hold the owner's tensors; the build calls it after construction and after
materialising (``to_empty`` gives each module fresh tensors), and a loaded ``state_dict`` re-ties through the
model's load hook. ``state_dict`` holds a shared tensor once, under the owner's name (:func:`drop_copies`); loading
fills the other names from it (:func:`fill_copies`) and refuses a checkpoint whose copies differ. A per-use
low-rank adapter (:class:`AdaptedLinear`, LoRA: Hu et al. 2021, arXiv:2106.09685; Zamba2's per-use adapters,
transformers ``Zamba2MLP.gate_up_proj_adapter_list``) replaces each adapted linear layer of every use with one that
computes ``W x + b + scale · B_u (A_u x)``, ``W`` and ``b`` shared, ``A_u`` and ``B_u`` the use's own.

**Cache sharing** (Gemma 3n's ``num_kv_shared_layers``; YOCO, Sun et al. 2024, arXiv:2405.05254). A source
layer's attention leaves the keys and values it attends over in the forward's ``inputs.shared_kv`` dict
(:func:`modkit.nn.attention.update_cache` does it for a mixer tagged ``modkit_kv_publish``); a reader (tagged
``modkit_kv_source``, built by the mixer's ``read_kv_from()``: no key/value projections, an empty cache
declaration) attends over them with its own queries and mask. With a cache the source hands over what its cache
holds (prefill, chunks and decode alike), so the reader's output equals the full forward's; the reader's cache
declares no entry, so the bytes are counted once.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from modkit.core.errors import CheckpointError
from modkit.nn.attention import shared_kv, update_cache

__all__ = [
    "AdaptedLinear",
    "KVReader",
    "add_adapters",
    "drop_copies",
    "fill_copies",
    "fuse_adapters",
    "shared_root",
    "shared_tensor_names",
    "tie_shared",
]

#: the per-use parameters of an :class:`AdaptedLinear`: never tied
ADAPTER_PARAMS = ("lora_a", "lora_b")


class AdaptedLinear(nn.Linear):
    """A linear layer with a low-rank adapter: ``forward(x [..., in]) = x Wᵀ + b + scale · (x Aᵀ) Bᵀ`` ``[..., out]``.

    ``W [out, in]`` and ``b [out]`` are the wrapped layer's own tensors (shared with the other uses of a shared
    block); ``A = lora_a [rank, in]`` and ``B = lora_b [out, rank]`` belong to this use. ``init_weights`` draws
    ``A`` from N(0, init_std) and zeroes ``B`` (LoRA's init, Hu et al. 2021, arXiv:2106.09685 §4.1: the adapted layer
    starts as the layer itself) and initialises ``W`` and ``b`` as ``nn.Linear`` would when it is their first
    holder. Still an ``nn.Linear`` (tensor-parallel plans and parameter roles of ``weight`` and ``bias`` apply).
    """

    param_roles = {"lora_a": "hidden", "lora_b": "hidden"}

    def __init__(self, base: nn.Linear, rank: int, scale: float):
        nn.Module.__init__(self)
        self.in_features, self.out_features = base.in_features, base.out_features
        self.weight = base.weight
        self.register_parameter("bias", base.bias)
        like = {"dtype": base.weight.dtype, "device": base.weight.device}
        self.lora_a = nn.Parameter(torch.empty(rank, base.in_features, **like))
        self.lora_b = nn.Parameter(torch.empty(base.out_features, rank, **like))
        self.scale = float(scale)

    def init_weights(self, init) -> None:
        """``W`` ~ N(0, init_std) and ``b = 0`` (skipped where an earlier use wrote them), ``A`` ~ N(0, init_std),
        ``B = 0``."""
        init.normal_(self.weight)
        if self.bias is not None:
            init.zeros_(self.bias)
        init.normal_(self.lora_a)
        init.zeros_(self.lora_b)

    def forward(self, x: Tensor) -> Tensor:
        """``x [..., in_features]`` -> ``[..., out_features]``."""
        delta = nn.functional.linear(nn.functional.linear(x, self.lora_a), self.lora_b)
        out = nn.functional.linear(x, self.weight, self.bias)
        return out + (delta if self.scale == 1.0 else delta * self.scale)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, rank={self.lora_a.shape[0]}, scale={self.scale:g}"


class KVReader:
    """Mixin of an attention module (with ``k_proj``, ``v_proj`` and ``k_norm`` children, keys and values through
    :func:`~modkit.nn.attention.update_cache`) that lets a layer read another layer's keys and values instead (spec
    ``kv_sharing``; Gemma 3n's shared-KV layers, transformers ``Gemma3nTextAttention``; YOCO, arXiv:2405.05254).

    The build calls :meth:`read_kv_from` on each reader; the module then has no key/value projections, its
    ``cache_spec()`` should declare no entry when :attr:`reads_kv`, and its forward takes keys and values from
    :meth:`keys_values` (``[batch, n_kv_heads, kv_len, head_dim]``, positions and validity ``[batch, kv_len]``).
    Its registry entry declares the ``kv_share`` capability, which the spec's validation asks of readers and
    sources.
    """

    #: the children a reader drops
    kv_modules = ("k_proj", "v_proj", "k_norm")

    def read_kv_from(self, source: int) -> None:
        """Read layer ``source``'s keys and values from now on: drop :attr:`kv_modules`."""
        for name in self.kv_modules:
            setattr(self, name, None)
        self.modkit_kv_source = int(source)

    @property
    def reads_kv(self) -> bool:
        """Whether this module reads another layer's keys and values (:meth:`read_kv_from`)."""
        return getattr(self, "modkit_kv_source", None) is not None

    def keys_values(self, inputs, k, v) -> tuple:
        """``(k_all, v_all, k_pos, k_valid)`` the new queries attend over: the new ``k``, ``v`` stored in this
        layer's cache (:func:`~modkit.nn.attention.update_cache`), or for a reader its source's
        (:func:`~modkit.nn.attention.shared_kv`; ``k`` and ``v`` are then ``None``)."""
        return shared_kv(inputs, self) if self.reads_kv else update_cache(inputs, k, v, mixer=self)


# size: the adapter's fields as the spec gives them, plus where it sits for the error messages
def add_adapters(block: nn.Module, rank: int, scale: float, targets, where: str, fuse=None) -> list[str]:
    """Replace the linear layers of ``block`` named in ``targets`` (their last path component; ``None``: all) by
    :class:`AdaptedLinear` s of ``rank``; returns their paths. Each group of ``fuse`` (leaf names) makes the adapted
    layers of one parent module that it names share the first one's ``lora_a`` (one ``A`` over their common input and
    a ``B`` per layer: a LoRA on their fused projection, Zamba2's ``gate_up_proj_adapter_list``).

    Raises:
        ValueError: a target that names no linear layer of the block (names ``where``, the value and the linear
            layers there are); a ``fuse`` group whose layers are not all adapted or read inputs of different widths.
    """
    linears = [n for n, m in block.named_modules() if isinstance(m, nn.Linear) and not isinstance(m, AdaptedLinear)]
    leaves = sorted({n.rsplit(".", 1)[-1] for n in linears})
    missing = [t for t in targets or () if t not in leaves]
    if missing:
        raise ValueError(
            f"{where}.adapter.targets: {missing} name no linear layer of the shared block; its linear layers are "
            f"{leaves}"
        )
    chosen = [n for n in linears if targets is None or n.rsplit(".", 1)[-1] in targets]
    for name in chosen:
        parent, _, leaf = name.rpartition(".")
        owner = block.get_submodule(parent)
        setattr(owner, leaf, AdaptedLinear(getattr(owner, leaf), rank, scale))
    for group in fuse or ():
        _fuse_group(block, chosen, list(group), where)
    fuse_adapters(block)
    return chosen


def _fuse_group(block: nn.Module, chosen: list[str], group: list[str], where: str) -> None:
    """Mark the adapted layers of each parent that holds every layer of ``group``: all but the first take its ``A``
    (``modkit_lora_a_from``, applied by :func:`fuse_adapters`)."""
    parents = sorted({n.rpartition(".")[0] for n in chosen if n.rpartition(".")[2] in group})
    for parent in parents:
        owner = block.get_submodule(parent)
        mods = [getattr(owner, leaf, None) for leaf in group]
        if not all(isinstance(m, AdaptedLinear) for m in mods):
            raise ValueError(
                f"{where}.adapter.fuse: {group} must all be adapted linear layers of '{parent or '<block>'}'; add "
                "them to the adapter's targets"
            )
        if len({m.in_features for m in mods}) != 1:
            raise ValueError(
                f"{where}.adapter.fuse: {group} read inputs of widths {[m.in_features for m in mods]}; a fused "
                "adapter's layers share one A, so they must read the same input"
            )
        for leaf, m in zip(group[1:], mods[1:]):
            m.modkit_lora_a_from = group[0]


def fuse_adapters(root: nn.Module) -> None:
    """Make every :class:`AdaptedLinear` of ``root`` marked ``modkit_lora_a_from`` hold its sibling's ``lora_a`` (one
    parameter object), in place: after :func:`add_adapters` and again wherever modules got fresh tensors."""
    for name, module in root.named_modules():
        source = getattr(module, "modkit_lora_a_from", None)
        if isinstance(module, AdaptedLinear) and source is not None:
            parent = root.get_submodule(name.rpartition(".")[0])
            module.lora_a = getattr(parent, source).lora_a


def shared_tensor_names(block: nn.Module) -> list[tuple[str, str]]:
    """``(path, kind)`` of the tensors of ``block`` that its group shares (``kind``: ``"param"`` or ``"buffer"``):
    every parameter and buffer but the adapters' own."""
    out = []
    for mod_name, module in block.named_modules(remove_duplicate=False):
        prefix = mod_name + "." if mod_name else ""
        for kind, tensors in (("param", module._parameters), ("buffer", module._buffers)):
            for leaf, t in tensors.items():
                if t is None or (isinstance(module, AdaptedLinear) and leaf in ADAPTER_PARAMS):
                    continue
                out.append((prefix + leaf, kind))
    return out


def shared_root(model: nn.Module, layer: int, owner: int) -> nn.Module:
    """The module of layer ``layer`` that the group owned by layer ``owner`` shares: its block, or the part named
    by the group's ``part`` (``model.shared_parts``)."""
    part = getattr(model, "shared_parts", {}).get(owner) or ""
    block = model.layers[layer]
    return block.get_submodule(part) if part else block


def _prefix(model: nn.Module, owner: int) -> str:
    part = getattr(model, "shared_parts", {}).get(owner) or ""
    return part + "." if part else ""


def tie_shared(model: nn.Module) -> None:
    """Make every use of a shared block (or of its shared part) hold its owner's parameters and buffers
    (``model.shared_blocks``: ``{owner layer: [other layers]}``; ``model.shared_parts``: ``{owner layer: path}``),
    in place, and the fused adapters of every layer hold one ``A`` again (:func:`fuse_adapters`); a no-op without
    sharing."""
    for owner, uses in getattr(model, "shared_blocks", {}).items():
        source = shared_root(model, owner, owner)
        for path, kind in shared_tensor_names(source):
            parent, _, leaf = path.rpartition(".")
            table = "_parameters" if kind == "param" else "_buffers"
            tensor = getattr(source.get_submodule(parent), table)[leaf]
            for use in uses:
                getattr(shared_root(model, use, owner).get_submodule(parent), table)[leaf] = tensor
        for layer in (owner, *uses):
            fuse_adapters(model.layers[layer])


def _copies(model: nn.Module, prefix: str) -> list[tuple[str, str]]:
    """``(copy name, owner name)`` in ``state_dict`` of every shared tensor of a non-owner use."""
    out = []
    for owner, uses in getattr(model, "shared_blocks", {}).items():
        block, part = shared_root(model, owner, owner), _prefix(model, owner)
        names = [part + p for p, kind in shared_tensor_names(block) if kind == "param" or _persistent(block, p)]
        for use in uses:
            out += [(f"{prefix}layers.{use}.{n}", f"{prefix}layers.{owner}.{n}") for n in names]
    return out


def _persistent(block: nn.Module, path: str) -> bool:
    parent, _, leaf = path.rpartition(".")
    return leaf not in block.get_submodule(parent)._non_persistent_buffers_set


def drop_copies(model: nn.Module, state_dict: dict, prefix: str) -> None:
    """Remove from ``state_dict`` the names under which the non-owner uses of a shared block hold its tensors (the
    owner's name keeps each once), in place."""
    for copy, _ in _copies(model, prefix):
        state_dict.pop(copy, None)


def fill_copies(model: nn.Module, state_dict: dict, prefix: str) -> None:
    """Give ``state_dict`` (being loaded) the names of the non-owner uses of a shared block, from the owner's tensor.

    Raises:
        CheckpointError: the checkpoint holds a copy that differs from the owner's tensor (the spec shares them;
            names both and the fix).
    """
    for copy, owner in _copies(model, prefix):
        if owner not in state_dict:
            continue
        if copy in state_dict:
            a, b = state_dict[copy], state_dict[owner]
            if a.shape != b.shape or not torch.equal(a.to(b.dtype), b):
                raise CheckpointError(
                    f"checkpoint holds '{copy}' that differs from '{owner}', but the spec shares that block (spec "
                    "'share'): one tensor serves both layers. Drop the layer from 'share' to keep separate weights, "
                    "or drop the copy from the checkpoint"
                )
        state_dict[copy] = state_dict[owner]


def share_blocks(spec, blocks: list) -> tuple[dict[int, list[int]], dict[int, str]]:
    """Apply the spec's ``share`` to the freshly built ``blocks`` (one per layer): the adapters of every use
    (:func:`add_adapters`, on the shared ``part`` when the group names one); returns ``({owner layer: [other
    layers]}, {owner layer: part path or ""})`` for :func:`tie_shared`.

    Raises:
        ValueError: a ``part`` naming no module of a listed layer's block (names the field, the value and the
            block's top-level modules); an adapter target naming no linear layer of the shared module.
    """
    groups, parts = {}, {}
    for i, group in enumerate(spec.share):
        layers = group.indices(spec.n_layers)
        roots = [_part_of(blocks[layer], group.part, f"share[{i}].part", layer) for layer in layers]
        if group.adapter is not None:
            a = group.adapter
            for root in roots:
                add_adapters(root, a.rank, a.scale, a.targets, f"share[{i}]", a.fuse)
        groups[layers[0]] = layers[1:]
        parts[layers[0]] = group.part or ""
    return groups, parts


def _part_of(block: nn.Module, part, where: str, layer: int) -> nn.Module:
    """``block``'s module at ``part`` (``None``: the block)."""
    if not part:
        return block
    try:
        return block.get_submodule(part)
    except AttributeError:
        names = sorted(n for n, _ in block.named_modules() if n and n.count(".") < 2)
        raise ValueError(
            f"{where}: {part!r} names no module of layer {layer}'s block; its modules are {names}: name the module "
            "the layers share (a side_input mixer's side block is 'attention.side')"
        ) from None


def share_kv(spec, mixers: list) -> dict[int, int]:
    """Apply the spec's ``kv_sharing`` to the freshly built token ``mixers`` (one per layer): tag each source
    (``modkit_kv_publish``) and make each reader read it (its ``read_kv_from(source)``); returns ``{reader: source}``.

    Raises:
        ValueError: a reader without ``read_kv_from``, or whose cache declaration (before it drops its own) differs
            from its source's (names the field, both layers and both declarations).
    """
    readers = {}
    for i, group in enumerate(spec.kv_sharing):
        source = mixers[group.source]
        source.modkit_kv_publish = group.source
        for layer in group.indices(spec.n_layers):
            reader = mixers[layer]
            if not callable(getattr(reader, "read_kv_from", None)):
                raise ValueError(
                    f"kv_sharing[{i}].layers: layer {layer}'s mixer {type(reader).__name__} cannot read another "
                    "layer's keys and values (it has no read_kv_from()); use an attention that declares the "
                    "'kv_share' capability"
                )
            mine, theirs = reader.cache_spec(), source.cache_spec()
            if mine != theirs:
                raise ValueError(
                    f"kv_sharing[{i}].layers: layer {layer} would read layer {group.source}'s cache, but their caches "
                    f"differ: {mine} vs {theirs}; give both attentions the same key/value heads, widths and window"
                )
            reader.read_kv_from(group.source)
            readers[layer] = group.source
    return readers


def sharing_flops(model: nn.Module, by_layer: dict, tokens: int) -> None:
    """Correct the declared FLOPs of one forward of ``tokens`` tokens, ``by_layer`` (``{layer: {"kind.part":
    FLOPs}}``, :meth:`modkit.analysis.cost.CostModel.flops_by_layer`), for sharing, in place: a reader layer
    (spec ``kv_sharing``) runs none of its attention's :attr:`KVReader.kv_modules` parts; each per-use adapter adds
    ``adapter.lora``, ``2 · tokens · rank · (in + out)`` per adapted linear layer (two matrix products, 1 multiply-add
    = 2 FLOPs). A shared block's own parts run at every use, as declared."""
    for layer in getattr(model, "kv_sources", {}):
        for path in model.mixer_paths[layer]:
            for name in getattr(model.layers[layer].get_submodule(path), "kv_modules", ()):
                by_layer.get(layer, {}).pop(f"attention.{name}", None)
    if not getattr(model, "shared_blocks", None):
        return
    for i, block in enumerate(model.layers):
        adapted = [m for m in block.modules() if isinstance(m, AdaptedLinear)]
        if adapted:
            lora = sum(2 * tokens * m.lora_a.shape[0] * (m.in_features + m.out_features) for m in adapted)
            by_layer.setdefault(i, {})["adapter.lora"] = lora

"""The assembled model: token embedding → position → blocks → final norm → LM head.

Only structure lives here; every block-level computation comes from registered components.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, replace
from typing import Optional, Union

import torch
from torch import Tensor, nn

from modkit.core.config import is_mixer
from modkit.core.errors import CheckpointError
from modkit.core.interfaces import AttentionInputs, Init, add_aux, dropout
from modkit.nn.cache import CacheSpec, KVCache
from modkit.nn.inputs import ForwardInputs
from modkit.spec import ModelSpec


def init_modules(root: nn.Module, init: Init, *, skip_root: bool = False) -> None:
    """Initialise every module of ``root`` (``root`` included unless ``skip_root``) in module order.

    A module with an ``init_weights(init)`` method initialises its direct tensors; ``nn.Linear`` and
    ``nn.Embedding`` without one get N(0, init_std) weights and zero biases (the rule of :meth:`Model.init_weights`,
    which calls this; the contract kit uses it to build one component alone). Shared modules are visited once.
    """
    for module in root.modules():
        if skip_root and module is root:
            continue
        if getattr(type(module), "init_weights", None) is not None:
            module.init_weights(init)
        elif isinstance(module, (nn.Linear, nn.Embedding)):
            init.normal_(module.weight)
            if getattr(module, "bias", None) is not None:
                init.zeros_(module.bias)


def _mixers(block: nn.Module) -> list[str]:
    """Paths inside ``block`` of its token mixers (see :meth:`Model.cache_layout`), in module order, each module
    tagged with its path as ``modkit_cache_key`` (how it finds its state in the layer's cache:
    ``inputs.cache_for(self)``). Declaring modules (``cache_spec()``) come first: the outermost of nested ones; then
    mixers without a declaration whose keys and values are inferred (:func:`_legacy_kv`: ``n_kv_heads`` /
    ``head_dim`` and the ``kv_cache`` capability, or an attention) that neither hold nor sit inside a declaring
    module."""

    def related(name: str, paths: list[str]) -> bool:  # name is one of paths, inside one, or holds one
        return any(
            name == p or p == "" or name == "" or name.startswith(p + ".") or p.startswith(name + ".") for p in paths
        )

    modules = list(block.named_modules())
    declared: list[str] = []
    for name, module in modules:
        if callable(getattr(module, "cache_spec", None)) and not any(
            name.startswith(p + ".") or p == "" for p in declared
        ):
            declared.append(name)
    chosen = list(declared)
    for name, module in modules:
        if _legacy_kv(module) and not related(name, chosen):
            chosen.append(name)
    order = {name: i for i, (name, _) in enumerate(modules)}
    chosen.sort(key=order.__getitem__)
    for name in chosen:
        block.get_submodule(name).modkit_cache_key = name
    return chosen


def _legacy_kv(module: nn.Module) -> bool:
    """Whether ``module`` is a token mixer written before the cache contract whose keys and values the cache infers
    from its ``n_kv_heads`` / ``head_dim``: a module tagged with a mixer kind (attention or recurrent,
    :func:`~modkit.core.config.is_mixer`) that exposes both and declares the ``kv_cache`` capability (its entry's
    ``modkit_capabilities``). For backwards compatibility an attention is one without declaring it, as before
    declarations decided (third-party attentions written then often declare nothing)."""
    if not (hasattr(module, "n_kv_heads") and hasattr(module, "head_dim")):
        return False
    kind = getattr(module, "modkit_kind", None)
    declared = bool((getattr(module, "modkit_capabilities", None) or {}).get("kv_cache"))
    return is_mixer(kind) and (declared or kind == "attention")


#: component types already told that their cache layout is inferred (one warning each per process)
_UNDECLARED_WARNED: set[str] = set()


def _declared(module: nn.Module, where: str) -> CacheSpec:
    """The :class:`CacheSpec` of one mixer module: its ``cache_spec()``, or keys and values from its
    ``n_kv_heads`` / ``head_dim`` (window ``sliding_window``) when it has none.

    The inference is for attentions written before the cache contract, kept for one release: it warns once per
    component type (:class:`DeprecationWarning`) naming the declaration to add, ``cache_spec()`` returning
    ``CacheSpec.kv(n_kv_heads, head_dim, window)``; modkit 0.3 asks every mixer to declare its state."""
    declare = getattr(module, "cache_spec", None)
    if not callable(declare):
        name = f"{getattr(module, 'modkit_kind', 'attention')}/{getattr(module, 'modkit_type', type(module).__name__)}"
        if name not in _UNDECLARED_WARNED:
            _UNDECLARED_WARNED.add(name)
            warnings.warn(
                f"{name} declares no cache_spec(): its KV cache is inferred from n_kv_heads and head_dim, which goes "
                "in modkit 0.3; give the module def cache_spec(self): return CacheSpec.kv(self.n_kv_heads, "
                "self.head_dim, self.sliding_window)",
                DeprecationWarning,
                stacklevel=2,
            )
        return CacheSpec.kv(int(module.n_kv_heads), int(module.head_dim), getattr(module, "sliding_window", None))
    spec = declare()
    if not isinstance(spec, CacheSpec):
        raise ValueError(f"{where}: cache_spec() returned {type(spec).__name__}, not a modkit.CacheSpec")
    return spec


def mixer_specs(module: nn.Module) -> dict[str, CacheSpec]:
    """``{path: CacheSpec}`` of the token mixers inside ``module`` (a block, or a component built alone), as
    :meth:`Model.cache_layout` finds them in each block.

    Raises:
        ValueError: a ``cache_spec()`` that does not return a :class:`CacheSpec`.
    """
    return {path: _declared(module.get_submodule(path), path or type(module).__name__) for path in _mixers(module)}


@dataclass
class ModelOutput:
    """Result of :meth:`Model.forward`.

    Attributes:
        logits: ``[batch, seq, vocab_size]`` in the model dtype (the last ``logits_to_keep`` positions when given).
        aux_loss: scalar sum of the auxiliary losses of every layer that returns one (MoE), else ``None``.
        hidden: ``[batch, seq, d_model]`` final hidden states (after the final norm).
        cache: the cache passed in, updated, or ``None``.
        mtp_logits: with ``forward(mtp=True)`` on a model with multi-token prediction, per depth ``k = 1 .. D``
            the logits ``[batch, seq - k, vocab_size]`` whose position ``i`` predicts token ``i + k + 1``
            (:mod:`modkit.nn.mtp`); their blocks' auxiliary losses are in ``aux_loss``. Else ``None``.
    """

    logits: Tensor
    aux_loss: Optional[Tensor]
    hidden: Tensor
    cache: Optional[KVCache] = None
    mtp_logits: Optional[list] = None


class Model(nn.Module):
    """A decoder-only language model assembled from a :class:`~modkit.spec.ModelSpec`.

    Build with :func:`modkit.build`. ``forward(input_ids [batch, seq]) -> ModelOutput``.

    Dropout (spec ``dropout``) is active in training mode only: ``embed_dropout`` on the block input here, the
    attention and residual rates inside the components that declare them.

    With ``tie_embeddings`` the head multiplies by ``embed.weight`` itself: one parameter, so tying survives
    ``to_empty``, ``.to()`` and ``load_state_dict`` by construction (torchtitan #2252).
    """

    def __init__(
        self,
        spec: ModelSpec,
        embed: nn.Embedding,
        positions: nn.ModuleList,
        layer_position: list[int],
        layers: nn.ModuleList,
        embedding_norm: Optional[nn.Module],
        final_norm: Optional[nn.Module],
        windows: list[Optional[int]],
    ):
        super().__init__()
        self.spec = spec
        self.embed = embed
        self.positions = positions
        self.layer_position = list(layer_position)
        self.embedding_norm = embedding_norm
        self.embed_dropout = dropout(spec.dropout.embedding)
        self.layers = layers
        self.final_norm = final_norm
        self.windows = list(windows)
        #: the residual stream of several copies (spec ``stream``, :mod:`modkit.nn.stream`), set by the build; ``None``:
        #: the plain ``[batch, seq, d_model]`` stream
        self.stream: Optional[nn.Module] = None
        #: the modules of multi-token prediction (:mod:`modkit.nn.mtp`; spec ``mtp``), set by the build; ``None``
        self.mtp: Optional[nn.ModuleList] = None
        #: blocks shared across layers (spec ``share``, :mod:`modkit.nn.sharing`): ``{owner layer: [other layers]}``,
        #: set by the build; the other layers' blocks hold the owner's parameters and buffers
        self.shared_blocks: dict[int, list[int]] = {}
        #: layers reading an earlier layer's keys and values (spec ``kv_sharing``): ``{reader: source}``
        self.kv_sources: dict[int, int] = {}
        #: per layer, the paths (inside the block) of its token mixers: modules that declare ``cache_spec()``, or
        #: attentions exposing ``n_kv_heads`` / ``head_dim`` (keys and values); each is tagged ``modkit_cache_key``
        self.mixer_paths = [_mixers(block) for block in layers]
        if not spec.tie_embeddings:
            self.lm_head = nn.Linear(spec.d_model, spec.vocab_size, bias=spec.lm_head_bias)
            self.lm_head.modkit_kind = "lm_head"
        elif spec.lm_head_bias:
            self.lm_head_bias = nn.Parameter(torch.empty(spec.vocab_size))
        self._register_load_state_dict_pre_hook(self._check_tied_head)
        self._register_state_dict_hook(self._drop_shared_copies)
        self._register_load_state_dict_pre_hook(self._fill_shared_copies)
        self.register_load_state_dict_post_hook(self._retie_shared)
        from modkit.core.parametrization import output_multiplier

        self._output_multiplier = output_multiplier(spec)  # None under standard parametrization

    # -------------------------------------------------------------------- weights
    def param_roles(self) -> dict[str, str]:
        """Roles of the model's own parameters (:mod:`modkit.core.roles`): the token embedding, the head and its bias.

        Tied, the head is the embedding (one parameter, role ``embedding``); the components declare the rest.
        """
        roles = {"embed.weight": "embedding"}
        if not self.spec.tie_embeddings:
            roles["lm_head.weight"] = "head"
        if self.spec.lm_head_bias:
            roles["lm_head.bias" if not self.spec.tie_embeddings else "lm_head_bias"] = "bias"
        return roles

    @property
    def lm_head_weight(self) -> Tensor:
        """The ``[vocab_size, d_model]`` matrix the head multiplies by (``embed.weight`` itself when tied)."""
        return self.embed.weight if self.spec.tie_embeddings else self.lm_head.weight

    def _check_tied_head(self, state_dict, prefix, *args, **kwargs) -> None:
        key = prefix + "lm_head.weight"
        if not self.spec.tie_embeddings or key not in state_dict:
            return
        head = state_dict[key]
        emb = state_dict.get(prefix + "embed.weight")
        if emb is None or head.shape != emb.shape or not torch.equal(head.to(emb.dtype), emb):
            raise CheckpointError(
                f"checkpoint holds '{key}' that differs from '{prefix}embed.weight', but the spec ties them "
                "(tie_embeddings = true); refusing to overwrite one with the other. Set tie_embeddings = false "
                "to keep a separate head, or drop the head tensor from the checkpoint."
            )
        del state_dict[key]

    def _drop_shared_copies(self, module, state_dict, prefix, local_metadata) -> None:
        """``state_dict`` holds a shared block's tensors once, under the owner layer's names (:mod:`modkit.nn.sharing`)."""
        from modkit.nn.sharing import drop_copies

        drop_copies(self, state_dict, prefix)

    def _fill_shared_copies(self, state_dict, prefix, *args, **kwargs) -> None:
        """Loading gives the other uses of a shared block the owner's tensors (refusing copies that differ)."""
        from modkit.nn.sharing import fill_copies

        fill_copies(self, state_dict, prefix)

    def _retie_shared(self, module, incompatible_keys) -> None:
        """After loading (``assign=True`` gives each name its own parameter), the uses hold the owner's tensors again."""
        from modkit.nn.sharing import tie_shared

        tie_shared(self)

    @torch.no_grad()
    def init_weights(self, seed: int = 0, *, init: Optional[Init] = None) -> None:
        """(Re)initialise every parameter and buffer deterministically from ``seed``.

        Each module with an ``init_weights(init)`` method initialises its direct tensors; ``nn.Linear`` and
        ``nn.Embedding`` without one get N(0, init_std) weights and zero biases. Buffers (RoPE tables too) are
        recomputed, which is what makes a ``meta`` build usable.

        Args:
            seed: seed of the draws.
            init: an :class:`Init` to draw with instead of ``Init(seed, spec.init_std)`` (``seed`` is then
                ignored); :mod:`modkit.parallel` passes one that writes each rank's shard of DTensor parameters.

        Raises:
            RuntimeError: a parameter or buffer was left uninitialised (names it and its module).
        """
        init = init if init is not None else Init(seed, self.spec.init_std)
        from modkit.core.parametrization import init_scales, is_mup

        if is_mup(
            self.spec
        ):  # muP: each parameter's init std scaled by its role's factor (modkit.core.parametrization)
            from modkit.core.roles import param_roles

            params = dict(self.named_parameters())
            init.scales.update({id(params[n]): f for n, f in init_scales(self.spec, param_roles(self)).items()})
        for owner in self.shared_blocks:  # a shared block's tensors keep the values its owner layer draws
            init.once.update(id(t) for t in (*self.layers[owner].parameters(), *self.layers[owner].buffers()))
        if self.spec.lm_head_bias and self.spec.tie_embeddings:
            init.zeros_(self.lm_head_bias)
        init_modules(self, init, skip_root=True)
        missed = [n for n, t in list(self.named_parameters()) + list(self.named_buffers()) if id(t) not in init.seen]
        if missed:
            raise RuntimeError(
                f"init_weights left {len(missed)} tensor(s) uninitialised: {missed[:5]}; the owning component must "
                "initialise every direct parameter and buffer in its init_weights(init)"
            )

    # -------------------------------------------------------------------- forward
    def cache_layout(self) -> list[dict[str, CacheSpec]]:
        """What each layer's token mixers declare they keep in the cache: ``[{mixer key: CacheSpec}]`` per layer.

        A mixer is a module of the block with a ``cache_spec() -> CacheSpec`` method (the outermost one, when a
        declaring module holds others), keyed by its path inside the block (``"attention"``); a token mixer
        without one but exposing ``n_kv_heads`` and ``head_dim`` that declares the ``kv_cache`` capability (or any
        attention, as before declarations decided) keeps keys and values (:meth:`CacheSpec.kv`, window
        ``sliding_window``). Read at call time, so a tensor-parallel model (local head
        counts) declares its local state. The one source of every cache byte figure (:mod:`modkit.nn.cache`).

        Raises:
            ValueError: a layer holds no mixer; a ``cache_spec()`` that does not return a :class:`CacheSpec`.
        """
        layout = []
        for i, (block, paths) in enumerate(zip(self.layers, self.mixer_paths)):
            if not paths:
                raise ValueError(
                    f"layer {i} holds no token mixer that declares its cache state (a cache_spec() method) nor a "
                    "kv_cache mixer exposing n_kv_heads and head_dim; cannot size its cache"
                )
            layout.append({path: _declared(block.get_submodule(path), f"layers.{i}.{path}") for path in paths})
        return layout

    def new_cache(
        self,
        batch_size: Optional[int] = None,
        max_len: Optional[int] = None,
        dtype: Union[str, torch.dtype, None] = None,
        *,
        device: Union[str, torch.device, None] = None,
    ) -> KVCache:
        """A fresh, preallocated (static) :class:`~modkit.nn.cache.KVCache` for this model.

        Each layer gets what its mixers declare (:meth:`cache_layout`); for the built-in attention
        ``[batch_size, n_kv_heads, slots, head_dim]`` keys and values with ``slots = max_len``, or
        ``min(window, max_len)`` for layers whose attention sees only the latest ``window`` positions (a ring
        buffer: its ``attention_span``, the sliding window or the attention chunk); see :mod:`modkit.nn.cache` for the
        byte formula.

        Args:
            batch_size: rows; ``None`` allocates at the first forward, with that forward's batch size.
            max_len: the most tokens a row will hold (prompt + generated, padding included); default
                ``spec.max_seq_len``.
            dtype: of the entries (an entry may declare its own); default the model's (its embedding's) dtype.
            device: default the model's device.

        Raises:
            ValueError: a layer has no token mixer (see :meth:`cache_layout`); bad sizes.
        """
        weight = self.embed.weight
        return KVCache(
            self.cache_layout(),
            max_len if max_len is not None else self.spec.max_seq_len,
            batch_size,
            dtype=dtype if dtype is not None else weight.dtype,
            device=device if device is not None else weight.device,
        )

    def forward(
        self,
        input_ids: Tensor,
        *,
        attention_mask: Optional[Tensor] = None,
        positions: Optional[Tensor] = None,
        cache: Optional[KVCache] = None,
        logits_to_keep: Optional[int] = None,
        documents: Optional[Tensor] = None,
        mtp: bool = False,
    ) -> ModelOutput:
        """Compute logits.

        Args:
            input_ids: ``[batch, seq]`` int64 token ids in ``[0, vocab_size)``.
            attention_mask: ``[batch, seq]`` or ``[batch, past + seq]`` (1/True = real token, 0 = padding);
                padding may be on the left. Positions are derived from it when ``positions`` is not given.
            positions: ``[batch, seq]`` explicit absolute positions.
            cache: a :class:`KVCache` from :meth:`new_cache`; the new tokens are appended in place (their
                positions continue each row's count of real tokens unless ``positions`` is given).
            logits_to_keep: compute logits for the last ``logits_to_keep`` positions only (a prefill for
                generation needs the last one: the head's GEMM and the ``[batch, seq, vocab]`` output shrink to
                ``[batch, logits_to_keep, vocab]``); ``None``: every position.
            documents: ``[batch, seq]`` int64 document index of every token of packed rows
                (:func:`modkit.nn.documents.document_ids`): a token attends only to earlier tokens of its own document
                (a recurrent mixer restarts its state and convolution at each document's first token) and its
                position counts from that document's start (unless ``positions`` is given), so each document gives
                the logits it gives alone. Not with ``cache``.
            mtp: also run the multi-token-prediction modules (spec ``mtp``; training uses them, generation does
                not): ``ModelOutput.mtp_logits``. Not with ``cache``, ``attention_mask``, ``positions``,
                ``documents`` or ``logits_to_keep``; ignored when the spec has no ``mtp``.

        Returns:
            :class:`ModelOutput` with ``logits [batch, seq, vocab_size]`` (``[batch, logits_to_keep, vocab_size]``
                when given) and ``hidden [batch, seq, d_model]``.

        Raises:
            ValueError: bad shapes, token ids out of range (with the offending values) or ``logits_to_keep < 1``;
                ``documents`` with a cache, or with a token mixer (attention or recurrent, or one inside a
                hybrid) that does not declare the ``document_mask`` capability (named with its layer and type, and
                the types that declare it).
        """
        inputs = ForwardInputs.prepare(
            self,
            input_ids,
            attention_mask=attention_mask,
            positions=positions,
            cache=cache,
            documents=documents,
            logits_to_keep=logits_to_keep,
        )
        x = self._embed_tokens(input_ids, inputs.positions)
        layer_inputs = inputs.attention_inputs()
        if self.stream is not None:  # [batch, seq, n_streams, d_model] between the blocks (modkit.nn.stream)
            extra = self.stream.layer_inputs(input_ids, x)  # per-layer inputs (Gemma 3n), or None
            layer_inputs = replace(layer_inputs, stream_inputs=extra) if extra is not None else layer_inputs
            x = self.stream.enter(x)
        x, aux = self._run_blocks(x, layer_inputs, cache)
        if self.stream is not None:
            x = self.stream.exit(x)
        extra = None
        if mtp and self.mtp is not None:
            extra, aux = self._mtp_logits(
                x, input_ids, aux, (attention_mask, positions, cache, documents, logits_to_keep)
            )
        if self.final_norm is not None:
            x = self.final_norm(x)
        h = x if logits_to_keep is None or logits_to_keep >= x.shape[1] else x[:, -logits_to_keep:]
        return ModelOutput(logits=self.head_logits(h), aux_loss=aux, hidden=x, cache=cache, mtp_logits=extra)

    def _mtp_logits(self, x: Tensor, input_ids: Tensor, aux, others: tuple) -> tuple[list, Optional[Tensor]]:
        """The logits of every multi-token-prediction depth from the last block's output ``x [batch, seq, d_model]``
        (:func:`modkit.nn.mtp.mtp_hidden`) and ``aux`` plus their blocks' auxiliary losses."""
        from modkit.nn.mtp import mtp_hidden

        if any(o is not None for o in others):
            raise ValueError(
                "forward(mtp=True) runs the multi-token-prediction modules on whole unpadded rows: not with "
                "attention_mask, positions, cache, documents or logits_to_keep"
            )
        hidden, mtp_aux = mtp_hidden(self, x, input_ids, self._embed_tokens)
        return [self.head_logits(h) for h in hidden], add_aux(aux, mtp_aux)

    def _embed_tokens(self, input_ids: Tensor, positions: Tensor) -> Tensor:
        """The blocks' input ``[batch, seq, d_model]`` of ``input_ids [batch, seq]`` at ``positions [batch, seq]``.

        The embedding row of each token, times the spec's ``embedding_scale`` (``sqrt(d_model)``: Gemma; a number:
        that factor), then the model-level position scheme's ``embed`` (learned or sinusoidal tables add a row per
        position; RoPE and ALiBi return ``x`` unchanged), then the ``embedding_norm`` when the spec has one, then
        the embedding dropout (training mode only).
        """
        x = self.embed(input_ids)
        scale = self.spec.embedding_scale
        if scale is not None:
            value = math.sqrt(self.spec.d_model) if scale == "sqrt_d_model" else float(scale)
            x = x * torch.tensor(value, dtype=x.dtype, device=x.device)
        x = self.positions[0].embed(x, positions)
        if self.embedding_norm is not None:
            x = self.embedding_norm(x)
        return self.embed_dropout(x)

    def _run_blocks(
        self, x: Tensor, inputs: AttentionInputs, cache: Optional[KVCache] = None
    ) -> tuple[Tensor, Optional[Tensor]]:
        """Run every block in order on ``x [batch, seq, d_model]``; ``(x [batch, seq, d_model], aux_loss)``.

        Block ``i`` gets ``inputs`` bound to its position scheme (``positions[layer_position[i]]``) and its layer of
        ``cache`` (:meth:`~modkit.core.interfaces.AttentionInputs.for_layer`); ``aux_loss`` is the sum of the scalar
        auxiliary losses the blocks return (MoE), ``None`` when none does.
        """
        aux = None
        if self.kv_sources:  # where source layers leave their keys and values for their readers (spec kv_sharing)
            inputs = replace(inputs, shared_kv={})
        for i, block in enumerate(self.layers):
            layer_cache = cache.layers[i] if cache is not None else None
            x, layer_aux = block(x, inputs.for_layer(self.positions[self.layer_position[i]], layer_cache))
            aux = add_aux(aux, layer_aux)
        return x, aux

    def head_logits(self, h: Tensor) -> Tensor:
        """Logits ``[..., vocab_size]`` of final hidden states ``h [..., d_model]`` (after the final norm).

        The head matrix (tied or not, with its bias), then μP's output multiplier ``base_d_model / d_model`` (only
        under ``parametrization: mup``; :mod:`modkit.core.parametrization`), then the spec's ``logit_scale`` (multiply: Cohere's
        ``logit_scale``, Granite's ``1 / logits_scaling``), then ``final_logit_softcap`` (``cap · tanh(z / cap)``,
        Gemma 2). :meth:`forward` and the logit lens of :mod:`modkit.analysis.trace` both read out through this.
        """
        # an untied head is called as a module so tensor-parallel styles hooked on it apply (modkit.parallel)
        logits = (
            nn.functional.linear(h, self.lm_head_weight, self._head_bias())
            if self.spec.tie_embeddings
            else self.lm_head(h)
        )
        if self._output_multiplier is not None:  # muP's output multiplier (modkit.core.parametrization)
            logits = logits * self._output_multiplier
        scale = self.spec.logit_scale
        if scale is not None:
            logits = logits * scale
        cap = self.spec.final_logit_softcap
        if cap is not None:
            logits = torch.tanh(logits / cap) * cap
        return logits

    @torch.no_grad()
    def resize_vocab(self, vocab_size: int, *, init: str = "mean", seed: int = 0) -> "Model":
        """Grow or shrink the vocabulary to ``vocab_size`` token ids, in place; returns the model.

        Rows of ids below ``min(old, new)`` are kept bitwise, in the token embedding ``[vocab, d_model]``, an untied
        head ``[vocab, d_model]`` and a head bias ``[vocab]``; a tied head stays the embedding itself (one
        parameter), and ``spec.vocab_size`` follows, so the model saves, loads and exports with the new size.
        Added rows are initialised as ``init`` says:

        * ``"mean"`` (default): every new row is the mean of the old rows (new bias entries: the old mean), so a
          new token starts with the average embedding and an average logit instead of a random one that may
          dominate the softmax (Hewitt 2021, "Initializing New Word Embeddings for Pretrained Language Models";
          transformers' ``resize_token_embeddings(mean_resizing=True)`` uses this mean, plus noise);
        * ``"normal"``: N(0, spec.init_std) drawn from ``seed`` (as :meth:`init_weights` would), new bias entries 0.

        Optimiser state and ``torch.compile`` caches refer to the old parameters: resize before creating them.

        Args:
            vocab_size: the new number of token ids (>= 1).
            init: ``"mean"`` or ``"normal"``.
            seed: seed of the ``"normal"`` draws.

        Raises:
            ValueError: ``vocab_size < 1``, an unknown ``init``, or sharded (tensor-parallel / FSDP) parameters
                (resize before parallelising).
        """
        from modkit.core.registry import get_registry
        from modkit.spec import load_spec

        if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 1:
            raise ValueError(f"vocab_size must be a positive integer, got {vocab_size!r}")
        if init not in ("mean", "normal"):
            raise ValueError(f"init must be 'mean' or 'normal', got {init!r}")
        weights = [self.embed.weight] + ([] if self.spec.tie_embeddings else [self.lm_head.weight])
        if any(type(w.data) is not torch.Tensor for w in weights):
            raise ValueError(
                "resize_vocab needs plain (unsharded) parameters; resize the vocabulary before parallelising"
            )
        old = self.spec.vocab_size
        keep = min(old, vocab_size)
        draws = Init(seed, self.spec.init_std)

        def grown(t: Tensor, bias: bool) -> nn.Parameter:
            out = torch.empty((vocab_size, *t.shape[1:]), dtype=t.dtype, device=t.device)
            out[:keep] = t[:keep]
            if vocab_size > old:
                if init == "mean":
                    out[old:] = t.float().mean(0).to(t.dtype)
                elif bias:
                    out[old:] = 0
                else:
                    draws.normal_(out[old:])
            return nn.Parameter(out, requires_grad=t.requires_grad)

        self.embed.weight = grown(self.embed.weight, False)
        self.embed.num_embeddings = vocab_size
        if not self.spec.tie_embeddings:
            self.lm_head.weight = grown(self.lm_head.weight, False)
            if self.lm_head.bias is not None:
                self.lm_head.bias = grown(self.lm_head.bias, True)
            self.lm_head.out_features = vocab_size
        elif self.spec.lm_head_bias:
            self.lm_head_bias = grown(self.lm_head_bias, True)
        self.spec = load_spec({**self.spec.to_dict(), "vocab_size": vocab_size}, registry=get_registry())
        return self

    def _head_bias(self) -> Optional[Tensor]:
        if not self.spec.lm_head_bias:
            return None
        return self.lm_head_bias if self.spec.tie_embeddings else self.lm_head.bias

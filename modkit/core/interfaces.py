"""The contracts between the core and components (no concrete component lives here).

Every block-level component maps ``[batch, seq, d_model] -> [batch, seq, d_model]``:

* ``norm``:      ``forward(x) -> Tensor``; statistics in float32, output in the input dtype.
* ``ffn``:       ``forward(x) -> Tensor``, or ``(Tensor, aux_loss)`` when the entry declares the ``aux_loss``
  capability (use :func:`split_aux` to accept both).
* ``attention``: ``forward(x, inputs: AttentionInputs) -> Tensor``; exposes ``n_heads`` (and, for keys and
  values, ``n_kv_heads`` and ``head_dim``). A token mixer declares what it caches with ``cache_spec() ->
  modkit.CacheSpec`` on its module and finds its state with ``inputs.cache_for(self)`` (:mod:`modkit.nn.cache`); its
  config declares the per-head width its position scheme acts on with ``position_geometry(ctx) ->
  PositionGeometry`` (default: ``n_heads`` and ``head_dim`` of the config).
* ``mixer``:     a token mixer that is not an attention (a recurrent mixer, several mixers side by side):
  ``forward(x, inputs: AttentionInputs) -> Tensor`` in the block's token-mixing slot, like an attention; keeps a
  fixed-size state per sequence between forwards, declared as ``growth="sequence"`` entries of its
  ``cache_spec()`` (helpers in :mod:`modkit.nn.recurrent`); padding tokens (``inputs.token_mask`` False) change no state.
* ``position``:  a :class:`PositionScheme`.
* ``placement``: a factory returning a block module with ``forward(x, inputs) -> (x, aux_loss | None)``;
  it gets the built attention and ffn and the norm config in its :class:`BuildContext`. ``x`` is the residual
  stream: ``[batch, seq, d_model]``, or ``[batch, seq, n_streams, d_model]`` with a ``stream`` for a placement that
  declares the ``streams`` capability (its sublayers still see ``[batch, seq, d_model]``).
* ``stream``: the residual stream between blocks when it holds several copies (spec ``stream``): a
  :class:`modkit.nn.stream.ResidualStream` with ``enter``, ``exit``, ``connection()`` and ``connection_flops``; a
  placement declaring ``streams`` finds it in ``BuildContext.extra["stream"]`` (:mod:`modkit.nn.stream`).
* ``router``: not block-level; held by a component whose config has a ``router`` slot (a mixture of experts),
  which builds it with ``ctx.build(config, extra={"n_experts": n, "top_k": k})``:
  ``forward(x [tokens, d_model]) -> (weights [tokens, top_k] in x's dtype, indices [tokens, top_k] int64,
  logits [tokens, n_experts] float32)``; the logits keep their gradient (the holder's aux losses use them).
  Optional, by name: ``takes_token_mask = True`` (``forward(x, token_mask=[tokens] bool)``), ``takes_token_ids = True``
  (``forward(x, token_ids=[tokens] int64)``: the token ids, for routing by token id), ``probabilities(logits)
  -> [tokens, n_experts]`` (what the balance loss reads; default softmax), an ``expert_load [n_experts]`` int64
  buffer of real-token assignments and ``update_balance(load)``, the training-time rule the loop applies after each
  optimizer step (:mod:`modkit.nn.balance`).
* ``activation``: not block-level; held by a component whose config has an ``activation`` slot (an ``mlp``'s
  ``activation_unit``), which builds it with ``ctx.build(config, dim=width)``: an element-wise ``forward(x [...,
  width]) -> [..., width]`` in x's dtype; the learned scalars and buffers it holds are its own (counted with the
  holder's parameters, initialised by its ``init_weights``).

* ``logits_processor``: not part of a model; ``factory(config, setup)`` returns a
  :class:`modkit.inference.sampling.LogitsProcessor`, ``processor(logits [batch, vocab] float32, state) -> [batch, vocab]``
  with removed tokens at ``-inf`` (see :mod:`modkit.inference.sampling`).
* ``stop_condition``: not part of a model; ``factory(config, setup)`` returns a
  :class:`modkit.inference.sampling.StopCondition`, ``condition(state) -> [batch]`` bool, True where a row ends.
* ``optimizer``: not part of a model; the training config's ``optimizer`` names it. ``factory(config, setup:
  modkit.train.optim.OptimizerSetup)`` returns a ``torch.optim.Optimizer`` (or an ``OptimizerChain`` of several)
  over ``setup.param_groups(...)``: the model's parameters grouped by role (:mod:`modkit.core.roles`), every parameter in
  exactly one group, each group keeping its ``lr_mult`` (μP's factor) and ``weight_decay``. Optional capabilities:
  ``mup`` (``"adam"`` or ``"sgd"``: which μP learning-rate rule it follows), ``sharded`` (correct on FSDP2 /
  tensor-parallel shards).
* ``tracker``: not part of a model; the training config's ``trackers`` list names them. ``factory(config, setup:
  modkit.train.trackers.TrackerSetup)`` returns a :class:`modkit.train.trackers.Tracker`, which gets the config and
  spec, every record of ``metrics.jsonl`` and the final checkpoints, on rank 0 only; a factory that raises is an
  error before training. Optional capabilities: ``flag_value`` (the field ``--tracker TYPE:VALUE`` sets), ``extra``
  (the package extra named when the factory raises ``ImportError``).

An attention builds its mask, dead-row guard and cache update from :mod:`modkit.nn.attention`.

Modules own their initialisation through ``init_weights(init: Init)`` covering their *direct* parameters
and buffers; ``nn.Linear`` and ``nn.Embedding`` children without one get a normal(0, init_std) weight and a
zero bias.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Optional

import torch
from torch import Tensor, nn

if TYPE_CHECKING:
    from modkit.nn.cache import LayerKVCache, MixerCache
    from modkit.core.registry import Registry


def split_aux(out: Any) -> tuple[Tensor, Optional[Tensor]]:
    """Normalise a sublayer's return value to ``(output, aux_loss or None)``."""
    if isinstance(out, tuple):
        return out[0], out[1]
    return out, None


def run_ffn(ffn: nn.Module, x: Tensor, inputs: "AttentionInputs") -> tuple[Tensor, Optional[Tensor]]:
    """Call an ffn sublayer the way placements should: ``(output [batch, seq, d_model], aux_loss or None)``.

    FFNs whose module sets ``takes_token_mask = True`` (MoE) also get ``token_mask [batch, seq]`` so padding
    tokens stay out of routing statistics and aux losses (Megatron-LM #2121); those that set ``takes_token_ids =
    True`` (an MoE with a hash router) get ``token_ids [batch, seq]`` int64 (``inputs.token_ids``, ``None`` when
    the forward was given none).
    """
    kwargs = {}
    if getattr(ffn, "takes_token_mask", False):
        kwargs["token_mask"] = inputs.token_mask
    if getattr(ffn, "takes_token_ids", False):
        kwargs["token_ids"] = inputs.token_ids
    return split_aux(ffn(x, **kwargs))


def add_aux(a: Optional[Tensor], b: Optional[Tensor]) -> Optional[Tensor]:
    """Sum two optional auxiliary losses (``None`` means no loss)."""
    if a is None:
        return b
    if b is None:
        return a
    return a + b


def dropout(p: float) -> nn.Module:
    """``nn.Dropout(p)``, or ``nn.Identity()`` when ``p == 0`` so that no dropout costs nothing.

    Args:
        p: probability of zeroing an element in training mode (the rest are scaled by ``1 / (1 - p)``;
            Srivastava et al. 2014, JMLR 15); identity in ``eval()``.
    Raises:
        ValueError: ``p`` outside ``[0, 1)``.
    """
    if not 0.0 <= p < 1.0:
        raise ValueError(f"dropout probability must lie in [0, 1), got {p}")
    return nn.Dropout(p) if p > 0 else nn.Identity()


@dataclass
class AttentionInputs:
    """Everything an attention module needs besides ``x``.

    Attributes:
        positions: ``[batch, seq]`` int64 absolute positions of the tokens in ``x``.
        token_mask: ``[batch, seq]`` bool, True for real tokens of ``x`` (False: padding); ``None`` when all are
            real. Cached keys carry their own validity (:class:`~modkit.nn.cache.LayerKVCache`).
        position: the layer's :class:`PositionScheme` (``rotate`` q/k and/or add ``attention_bias``).
        cache: the layer's KV cache, or ``None`` for a plain forward.
        documents: ``[batch, seq]`` int64 document index of each token of ``x`` within its row (document-masked
            packing: a query sees only keys of its own document, and ``positions`` restart at 0 at each document);
            ``None``: the whole row is one sequence. Never set together with ``cache``. Attentions that honour it
            declare the ``document_mask`` capability; :func:`modkit.nn.attention.prepare_mask` applies it.
        scratch: a dict shared by every layer of one forward without a cache (where :func:`~modkit.nn.attention.prepare_mask`
            keeps the mask it built, so a document mask is built once per batch, not once per layer); ``None``: none.
        sequence: under context parallelism, this rank's shard of the sequence (:class:`modkit.parallel.SequenceShard`:
            ``x`` holds a contiguous slice of every row, ``positions`` / ``documents`` are that slice's): it has
            ``gather(t, dim)`` (the whole sequence of ``t`` along ``dim``, autograd-aware) and the whole sequence's
            ``key_positions`` / ``key_mask`` / ``key_documents``. :func:`~modkit.nn.attention.update_cache` and
            :func:`~modkit.nn.attention.update_cache_entries` hand a mixer every key of the sequence through it;
            ``None``: the whole sequence is here. Never set together with ``cache``.
        token_ids: ``[batch, seq]`` int64 ids of the tokens of ``x`` (the model's ``input_ids``; under context
            parallelism this rank's slice), for components that route by token id (a hash router); ``None`` when
            the caller gave none.
        shared_kv: in a model where layers read an earlier layer's keys and values (spec ``kv_sharing``), the dict
            of one forward where a source layer leaves what it attends over (:func:`~modkit.nn.attention.update_cache`)
            and its readers find it (:func:`~modkit.nn.attention.shared_kv`); ``None``: no sharing.
        stream_inputs: ``[batch, seq, n_layers, p]`` inputs of every layer a residual stream computed from the
            tokens (spec ``stream``, :meth:`modkit.nn.stream.ResidualStream.layer_inputs`: Gemma 3n's per-layer
            embeddings); ``None``: none.
    """

    positions: Tensor
    token_mask: Optional[Tensor] = None
    position: Optional["PositionScheme"] = None
    cache: Optional["LayerKVCache"] = None
    documents: Optional[Tensor] = None
    scratch: Optional[dict] = None
    sequence: Optional[Any] = None
    token_ids: Optional[Tensor] = None
    shared_kv: Optional[dict] = None
    stream_inputs: Optional[Tensor] = None

    def for_layer(self, position: "PositionScheme", cache: Optional["LayerKVCache"]) -> "AttentionInputs":
        """A copy bound to one layer's position scheme and cache."""
        return replace(self, position=position, cache=cache)

    def cache_for(self, mixer: Any) -> Optional["MixerCache"]:
        """The state ``mixer`` (the calling module: ``inputs.cache_for(self)``) keeps in this layer's cache, or
        ``None`` without a cache: a :class:`~modkit.nn.cache.MixerCache` holding the entries its ``cache_spec()``
        declared. In a layer with several mixers each gets its own (by its ``modkit_cache_key``).

        Raises:
            KeyError: the layer holds several mixers and ``mixer`` is none of them.
        """
        return None if self.cache is None else self.cache.state(mixer)


@dataclass(frozen=True)
class PositionGeometry:
    """The per-head tensors a layer's position scheme acts on, declared by the attention's config
    (``position_geometry(ctx)``) and read at spec time (validation) and at build time (the scheme is built from it).

    ``rotate(q [batch, n_heads, seq, head_dim], k [batch, n_kv_heads, seq, head_dim], positions)``;
    ``attention_bias(..., n_heads)``. The built-in attention: its ``n_heads``, ``n_kv_heads`` and ``head_dim``.
    Multi-head latent attention rotates only its decoupled RoPE part: ``head_dim = qk_rope_head_dim``, ``n_kv_heads
    = 1`` (one rotated key shared by every head).

    Attributes:
        n_heads: query heads the scheme sees (also the head count of an attention bias).
        head_dim: width of each q/k head the scheme is given (a rope's ``partial_rotary`` is a fraction of it).
        n_kv_heads: key heads ``rotate`` is given; ``None`` means ``n_heads``.

    ``n_heads`` or ``head_dim`` is ``None`` only for an attention that neither declares nor exposes it (then a
    scheme that needs it cannot be checked at spec time).
    """

    n_heads: Optional[int]
    head_dim: Optional[int]
    n_kv_heads: Optional[int] = None

    @property
    def key_heads(self) -> int:
        """``n_kv_heads``, or ``n_heads`` when not given."""
        return self.n_kv_heads if self.n_kv_heads is not None else self.n_heads


class PositionScheme(nn.Module):
    """Base class of position schemes. Override the hooks where the scheme acts; the rest are identities.

    Registry entries say where they act with the ``acts_on`` capability: ``"embedding"`` (:meth:`embed`),
    ``"qk"`` (:meth:`rotate`), ``"bias"`` (:meth:`attention_bias`) or ``"none"``.
    """

    def embed(self, x: Tensor, positions: Tensor) -> Tensor:
        """Act on the token embeddings ``x [batch, seq, d_model]`` at ``positions [batch, seq]``."""
        return x

    def rotate(self, q: Tensor, k: Tensor, positions: Tensor) -> tuple[Tensor, Tensor]:
        """Act on ``q [batch, n_heads, seq, head_dim]`` and ``k [batch, n_kv_heads, seq, head_dim]``.

        ``positions [batch, seq]`` are the positions of these (new) tokens; cached keys were rotated when stored.
        """
        return q, k

    def attention_bias(self, q_positions: Tensor, k_positions: Tensor, n_heads: int) -> Optional[Tensor]:
        """Additive attention bias ``[batch, n_heads, q_len, kv_len]`` (float32), or ``None``."""
        return None


class Init:
    """Seeded, device-independent initialiser handed to every module's ``init_weights``.

    Random values are drawn on the CPU from one ``torch.Generator`` in module order, then copied to the
    tensor's device and dtype, so a meta-then-materialise build equals a direct build with the same seed.
    Every parameter and buffer must pass through one of the methods; :meth:`Model.init_weights` checks it.
    """

    def __init__(self, seed: int, std: float):
        self.generator = torch.Generator(device="cpu").manual_seed(int(seed))
        self.std = float(std)
        self.seen: set[int] = set()
        #: ``{id(parameter): factor}`` on the std (and the bounds of a uniform) of that parameter's random init;
        #: :meth:`Model.init_weights` fills it under μP from the parameters' roles (:mod:`modkit.core.parametrization`)
        self.scales: dict[int, float] = {}
        #: ``id`` s of tensors written at most once: a parameter that several modules hold (a block shared across
        #: layers, :mod:`modkit.nn.sharing`) keeps the values its first module in module order gave it
        self.once: set[int] = set()

    def _written(self, t: Tensor) -> bool:
        """Whether ``t`` is written at most once and was written already (every fill then leaves it as it is)."""
        return id(t) in self.once and id(t) in self.seen

    @torch.no_grad()
    def normal_(self, t: Tensor, std: Optional[float] = None, mean: float = 0.0) -> Tensor:
        """Fill ``t`` with N(mean, (std · s)²): ``std`` defaults to the spec's ``init_std``; ``s`` is the
        parametrization's factor for ``t`` (1 under standard parametrization)."""
        if self._written(t):
            return t
        scale = (self.std if std is None else std) * self.scales.get(id(t), 1.0)
        v = torch.randn(t.shape, generator=self.generator, dtype=torch.float32) * scale + mean
        return self.copy_(t, v)

    @torch.no_grad()
    def uniform_(self, t: Tensor, a: float, b: float) -> Tensor:
        """Fill ``t`` with U(a · s, b · s) (``s`` as in :meth:`normal_`)."""
        if self._written(t):
            return t
        s = self.scales.get(id(t), 1.0)
        a, b = a * s, b * s
        v = torch.rand(t.shape, generator=self.generator, dtype=torch.float32) * (b - a) + a
        return self.copy_(t, v)

    @torch.no_grad()
    def constant_(self, t: Tensor, value: float) -> Tensor:
        """Fill ``t`` with ``value``."""
        if self._written(t):
            return t
        self.seen.add(id(t))
        return t.fill_(value)

    def zeros_(self, t: Tensor) -> Tensor:
        """Fill ``t`` with zeros."""
        return self.constant_(t, 0.0)

    def ones_(self, t: Tensor) -> Tensor:
        """Fill ``t`` with ones."""
        return self.constant_(t, 1.0)

    @torch.no_grad()
    def copy_(self, t: Tensor, value: Tensor) -> Tensor:
        """Copy ``value`` (computed anywhere, e.g. a RoPE table) into ``t``."""
        if self._written(t):
            return t
        self.seen.add(id(t))
        return t.copy_(value.to(device=t.device, dtype=t.dtype))


@dataclass
class BuildContext:
    """What a component factory may know about the model it is built into.

    Attributes:
        d_model, n_layers, vocab_size, max_seq_len: model-wide sizes from the spec.
        layer_index: the layer being built (``None`` for model-level components).
        dim: feature size a norm acts on when it is not ``d_model`` (e.g. a per-head QK-norm: ``head_dim``).
        groups: for a norm: its input is ``[..., groups, dim]`` and each of the ``groups`` slices keeps parameters
            of its own (weight ``[groups, dim]``: Cohere's per-head QK LayerNorm); statistics are still over the
            last ``dim`` features. ``None``: one set of parameters ``[dim]`` shared by everything before the last
            dimension. Only norms whose entry declares the ``groups`` capability accept it.
        n_heads, head_dim: attention geometry of the layer(s) a position scheme serves.
        attention, ffn, norm: for placements: the built sublayers and the norm config to instantiate.
        registry: the registry to build nested components from (:meth:`build`).
        attention_dropout: probability of dropping an attention probability in training mode (spec
            ``dropout.attention``); attentions that apply it declare the ``attention_dropout`` capability.
        residual_dropout: probability of dropping an element of a sublayer's output before the residual add in
            training mode (spec ``dropout.residual``); placements that apply it declare ``residual_dropout``
            and build the module with :func:`dropout`.
        parametrization: the spec's ``parametrization`` (``None``: standard); attentions take their default score
            scale from :meth:`attention_scale`, which follows it.
    """

    d_model: int
    n_layers: int
    vocab_size: int
    max_seq_len: int
    registry: "Registry"
    layer_index: Optional[int] = None
    dim: Optional[int] = None
    groups: Optional[int] = None
    n_heads: Optional[int] = None
    head_dim: Optional[int] = None
    attention: Optional[nn.Module] = None
    ffn: Optional[nn.Module] = None
    norm: Any = None
    attention_dropout: float = 0.0
    residual_dropout: float = 0.0
    extra: dict = field(default_factory=dict)
    parametrization: Any = None

    def attention_scale(self, head_dim: int, standard: Optional[float] = None) -> float:
        """The default multiplier of ``q·k`` for heads of ``head_dim``: ``1 / sqrt(head_dim)`` under standard
        parametrization, ``sqrt(base_head_dim) / head_dim`` under μP (:func:`modkit.core.parametrization.attention_scale`).
        An attention uses it unless its config sets an explicit scale.

        ``standard``: the component's own standard-parametrization scale, returned as it is outside μP (an
        attention that must equal a reference to the last bit computes ``head_dim ** -0.5`` as the reference does,
        which differs from ``1 / sqrt(head_dim)`` in the last bit for many widths). μP replaces it either way.
        """
        from modkit.core.parametrization import attention_scale, is_mup

        if standard is not None and not is_mup(self):
            return float(standard)
        return attention_scale(self.parametrization, self.d_model, head_dim)

    def build(self, config: Any, **changes: Any) -> nn.Module:
        """Build a (nested) component from its validated config, tagging it with its kind, type and capabilities
        (``modkit_kind``, ``modkit_type``, ``modkit_capabilities``).

        Raises:
            RegistryError: the config's type is not registered.
            TypeError: the factory did not return an ``nn.Module``.
        """
        entry = self.registry.entry_for_config(config)
        ctx = replace(self, **changes) if changes else self
        module = entry.factory(config, ctx)
        if not isinstance(module, nn.Module):
            raise TypeError(
                f"factory of {entry.kind}/{entry.type} ({entry.provider}) returned {type(module).__name__}, not nn.Module"
            )
        module.modkit_kind = entry.kind
        module.modkit_type = entry.type
        module.modkit_capabilities = dict(
            entry.capabilities
        )  # read at run time (e.g. document_mask) without a registry
        return module

    def build_grouped(self, config: Any, n: int, **changes: Any) -> nn.Module:
        """Build ``n`` independent copies of a component with stacked weights (its entry's ``grouped_factory``).

        The module's ``forward(x [rows, d_model], offs [n] int32) -> [rows, d_model]`` runs copy ``g`` on rows
        ``[offs[g-1], offs[g])``. It is not tagged with a kind: it belongs to the component that builds it (an
        mixture of experts), whose kind and tensor-parallel plan cover it.

        Raises:
            RegistryError: the config's type is not registered.
            ValueError: the type has no ``grouped_factory`` (names the type and what to do).
            TypeError: the factory did not return an ``nn.Module``.
        """
        entry = self.registry.entry_for_config(config)
        if entry.grouped_factory is None:
            able = [e.type for e in self.registry.components(entry.kind) if e.grouped_factory is not None]
            raise ValueError(
                f"{entry.kind} type {entry.type!r} ({entry.provider}) cannot be stacked into copies: its Component "
                f"has no grouped_factory; use a type that has one ({', '.join(able) or 'none registered'}) or add "
                "grouped_factory to it"
            )
        ctx = replace(self, **changes) if changes else self
        module = entry.grouped_factory(config, ctx, n)
        if not isinstance(module, nn.Module):
            raise TypeError(
                f"grouped_factory of {entry.kind}/{entry.type} ({entry.provider}) returned {type(module).__name__}, "
                "not nn.Module"
            )
        return module

"""Model-level introspection: record named intermediate tensors of any registered component.

::

    import modkit
    with modkit.inspect(model) as rec:
        out = model(input_ids)                      # [batch, seq]
    rec["layers.0:update"]                          # [batch, seq, d_model]: block output - block input
    rec["layers.0.attention:weights"]               # [batch, n_heads, seq, seq] (attentions that can return them)
    rec.layer(1)["ffn:hidden"]                      # [batch, seq, d_ff]: the input of the FFN's down projection
    rec.unavailable                                 # {name: why} for what the components do not expose

Nothing in a component is written for this: the recorder finds modules by the ``modkit_kind`` tag the registry puts
on every module it builds (and the ``embedding`` / ``lm_head`` tags of the core) and attaches PyTorch forward hooks
to them for the duration of the ``with`` block. On exit every hook and wrapper is removed, so a model that is not
being recorded runs exactly the code it ran before (the tests check that ``_forward_hooks`` and friends are empty
again and that logits are bitwise equal with and without recording).

Names are ``MODULE_PATH:WHAT``, with ``MODULE_PATH`` the module's name in ``model.named_modules()``:

| name | what |
|---|---|
| ``embed:output`` | token embeddings ``[batch, seq, d_model]`` |
| ``positions.N:embed`` | the position scheme's ``embed`` output ``[batch, seq, d_model]`` (schemes acting on the embeddings; a scheme whose ``embed`` returns its input unchanged records nothing) |
| ``layers.I:input``, ``layers.I:output`` | block (``placement``) input and output ``[batch, seq, d_model]`` |
| ``layers.I:update`` | the block's residual update, ``output - input`` |
| ``NORM:output`` | every ``norm`` module (block norms, QK-norms, ``final_norm``, ...) |
| ``ATTN:output`` | the attention sublayer's output ``[batch, seq, d_model]`` |
| ``ATTN.CHILD:output`` | every ``nn.Linear`` inside the attention (the built-in's ``q_proj``, ``k_proj``, ``v_proj``, ``o_proj``), ``[batch, seq, out_features]`` |
| ``ATTN:q``, ``ATTN:k`` | queries and keys per head as they enter the scores, after QK-norm and the position scheme's ``rotate``: ``[batch, n_heads, seq, head_dim]`` and ``[batch, n_kv_heads, seq, head_dim]`` |
| ``ATTN:position_bias`` | the additive bias of a ``bias`` scheme (ALiBi) ``[batch, n_heads, q_len, kv_len]`` |
| ``ATTN:weights`` | attention probabilities ``[batch, n_heads, q_len, kv_len]`` (float32) |
| ``FFN:output`` | the FFN's output (the first element when it returns ``(output, aux_loss)``) |
| ``FFN.CHILD:output`` | every ``nn.Linear`` inside the FFN (``up``, ``gate``, ``down``, ...) |
| ``FFN:hidden`` | the FFN hidden activation ``[batch, seq, d_ff]``: the input of its down projection, found as the ``nn.Linear`` whose ``out_features`` equals ``d_model`` (the last one registered when several do) |
| ``lm_head:output`` | logits of an untied head |
| ``X:output.1``, ``X:output.2``, ... | further tensors of a module returning a tuple (a block's aux loss, a router's indices and logits) |

(``ATTN`` is e.g. ``layers.0.attention``, ``FFN`` ``layers.0.ffn``, ``NORM`` ``layers.0.attn_norm``.)

Attention weights come from attentions whose registry entry declares the ``returns_weights`` capability, meaning a
method ``forward_with_weights(x, inputs) -> (output, weights [batch, n_heads, q_len, kv_len])``. The recorder calls
it once more after the ordinary forward, without gradient, with recording paused and the RNG state forked: the
model's own output is the ordinary (e.g. SDPA) one, bit for bit, and the weights are those of the eager math of the
same layer (equal to the SDPA path to float32 rounding). Under a KV cache the second call would write the new keys
twice, so weights are not recorded then (``unavailable`` says so). Where a module lacks something (no weights, no
down projection, a custom attention that never calls ``rotate``), the name is listed in :attr:`Recording.unavailable`
with the reason; nothing is guessed.

Cost: while recording, a reference to each recorded tensor (detached, no copy) plus one subtraction per block and,
for weights, a second attention computation per layer. When not recording: nothing (no hook is left behind).

References: PyTorch ``nn.Module.register_forward_hook`` / ``register_forward_pre_hook``; the activation-cache idea
of TransformerLens (``run_with_cache``, Nanda & Bloom 2022) without its rewritten model classes.
"""

from __future__ import annotations

import contextlib
import fnmatch
import re
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional, Sequence

import torch
from torch import Tensor, nn

from modkit.core.registry import Registry, close_matches, get_registry
from modkit.core.config import is_mixer

#: the position-scheme methods the recorder wraps (the :class:`~modkit.core.interfaces.PositionScheme` interface)
POSITION_METHODS = ("embed", "rotate", "attention_bias")

_LAYER = re.compile(r"^layers\.(\d+)(?=[.:])")


@dataclass
class Entry:
    """One recorded tensor.

    Attributes:
        name: ``MODULE_PATH:WHAT`` (see the module docstring).
        tensor: the value, detached (no copy), on the model's device (``meta`` for a meta model).
        kind: the ``modkit_kind`` of the module it belongs to (``attention``, ``ffn``, ``norm``, ``placement``,
            ``position``, ``embedding``, ``lm_head``, ...), ``"linear"`` for an untagged ``nn.Linear`` inside one.
        type: the module's ``modkit_type`` (``None`` for untagged modules).
        layer: the block index for names under ``layers.I``, else ``None``.
        call: 0 for the first forward inside the ``with`` block, 1 for the second, ...
        order: position in the sequence of everything recorded (execution order).
    """

    name: str
    tensor: Tensor
    kind: Optional[str]
    type: Optional[str]
    layer: Optional[int]
    call: int
    order: int


class Recording:
    """What :func:`inspect` recorded: named tensors in execution order.

    ``rec[name]`` is the tensor of the last forward, ``rec.all(name)`` one per forward (several forwards inside one
    ``with`` block, e.g. decoding steps). Names follow the table of the module docstring.

    Attributes:
        entries: every :class:`Entry` in the order it was recorded.
        unavailable: ``{name: reason}`` for what was asked for (matched ``include``) but the component does not
            expose (e.g. weights of an attention without ``returns_weights``).
        calls: number of model forwards seen.
    """

    def __init__(self) -> None:
        self.entries: list[Entry] = []
        self.unavailable: dict[str, str] = {}
        self._by_name: dict[str, list[Entry]] = {}
        self.calls = 0

    def _add(self, name: str, tensor: Tensor, kind: Optional[str], type_: Optional[str], call: int) -> None:
        m = _LAYER.match(name)
        entry = Entry(name, tensor.detach(), kind, type_, int(m.group(1)) if m else None, call, len(self.entries))
        self.entries.append(entry)
        self._by_name.setdefault(name, []).append(entry)

    def __repr__(self) -> str:
        return f"Recording({len(self._by_name)} names, {self.calls} forward(s), {len(self.unavailable)} unavailable)"

    def names(self) -> list[str]:
        """Every recorded name, in the order first recorded."""
        return list(self._by_name)

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    def __len__(self) -> int:
        return len(self._by_name)

    def __iter__(self) -> Iterator[str]:
        return iter(self._by_name)

    def __getitem__(self, name: str) -> Tensor:
        """The tensor recorded under ``name`` in the last forward.

        Raises:
            KeyError: ``name`` was not recorded; the message gives close matches, or the reason when the
                component could not provide it.
        """
        if name in self._by_name:
            return self._by_name[name][-1].tensor
        if name in self.unavailable:
            raise KeyError(f"{name!r} was not recorded: {self.unavailable[name]}")
        hint = close_matches(name, self._by_name)
        raise KeyError(
            f"nothing recorded under {name!r}"
            + (
                f"; did you mean {', '.join(repr(h) for h in hint)}?"
                if hint
                else f" ({len(self._by_name)} names recorded; see .names())"
            )
        )

    def get(self, name: str, default: Any = None) -> Any:
        """``rec[name]``, or ``default`` when nothing was recorded under ``name``."""
        return self._by_name[name][-1].tensor if name in self._by_name else default

    def entry(self, name: str) -> Entry:
        """The last :class:`Entry` recorded under ``name`` (``KeyError`` as :meth:`__getitem__`)."""
        self[name]  # the explanatory KeyError
        return self._by_name[name][-1]

    def all(self, name: str) -> list[Tensor]:
        """The tensor recorded under ``name`` in each forward, in order (empty when never recorded)."""
        return [e.tensor for e in self._by_name.get(name, [])]

    def layer(self, index: int) -> dict[str, Tensor]:
        """``{relative name: tensor}`` of block ``index`` in the last forward, e.g. ``rec.layer(0)["ffn:hidden"]``;
        the block's own entries are ``":input"``, ``":output"`` and ``":update"``."""
        prefix = f"layers.{index}"
        out = {}
        for name, entries in self._by_name.items():
            if entries[-1].layer == index:
                rest = name[len(prefix) :]
                out[rest[1:] if rest.startswith(".") else rest] = entries[-1].tensor
        return out


def _first_tensor(out: Any) -> tuple[Optional[Tensor], list[Tensor]]:
    """``(first tensor, further tensors)`` of a module's return value (a tensor or a tuple of them)."""
    if isinstance(out, Tensor):
        return out, []
    if isinstance(out, (tuple, list)):
        tensors = [t for t in out if isinstance(t, Tensor)]
        if out and isinstance(out[0], Tensor):
            return out[0], tensors[1:]
    return None, []


def _tagged_descendants(module: nn.Module, prefix: str) -> Iterator[tuple[str, nn.Module]]:
    """``(name, child)`` under ``module``, not descending into nested tagged modules (they are recorded on their own)."""
    for name, child in module.named_children():
        full = f"{prefix}.{name}"
        if getattr(child, "modkit_kind", None) is not None:
            continue
        yield full, child
        yield from _tagged_descendants(child, full)


class _Recorder:
    """Installs the hooks of one :func:`inspect` context and removes them all on exit."""

    def __init__(self, model: nn.Module, include: Optional[Sequence[str]], registry: Optional[Registry]):
        self.model = model
        self.include = list(include) if include is not None else None
        self.registry = registry or get_registry()
        self.rec = Recording()
        self.handles: list[torch.utils.hooks.RemovableHandle] = []
        self.patched: list[tuple[nn.Module, str, Any]] = []
        self.stack: list[tuple[str, nn.Module]] = []  # tagged modules being run (outermost first)
        self.paused = 0
        spec = getattr(model, "spec", None)
        self.d_model = getattr(spec, "d_model", None)

    # ------------------------------------------------------------------ helpers
    def wanted(self, name: str) -> bool:
        return self.include is None or any(fnmatch.fnmatchcase(name, p) for p in self.include)

    def record(self, name: str, tensor: Optional[Tensor], kind: Optional[str], type_: Optional[str]) -> None:
        if tensor is None or self.paused or not self.wanted(name):
            return
        self.rec._add(name, tensor, kind, type_, max(self.rec.calls - 1, 0))

    def missing(self, name: str, why: str) -> None:
        if self.wanted(name):
            self.rec.unavailable.setdefault(name, why)

    def capability(self, module: nn.Module, key: str) -> Any:
        try:
            entry = self.registry.get(module.modkit_kind, module.modkit_type)
        except Exception:  # noqa: BLE001 - a module built with another registry: no declared capabilities
            return None
        return entry.capabilities.get(key)

    def current(self, kind: str) -> Optional[str]:
        """Name of the innermost running tagged module of ``kind``."""
        for name, module in reversed(self.stack):
            if module.modkit_kind == kind:
                return name
        return None

    # ------------------------------------------------------------------ install
    def install(self) -> None:
        def count_call(mod, args):
            if not self.paused:
                self.rec.calls += 1

        self.handles.append(self.model.register_forward_pre_hook(count_call))
        for name, module in self.model.named_modules():
            kind = getattr(module, "modkit_kind", None)
            if kind is None or not name:
                continue
            post = self.hook_tagged(name, module, kind)
            if is_mixer(kind):  # any token mixer: its projections, and its weights where it declares returns_weights
                self.hook_attention(name, module)
            elif kind == "ffn":
                self.hook_ffn(name, module)
            elif kind == "position":
                self.patch_position(name, module)
            # after the kind's own hooks: an attention's weights are recorded before its output (execution order)
            self.handles.append(module.register_forward_hook(post))

    def hook_tagged(self, name: str, module: nn.Module, kind: str) -> Callable:
        """Register the pre-hook of a tagged module; return its forward hook (registered by the caller)."""
        type_ = getattr(module, "modkit_type", None)
        is_block = kind == "placement"

        def pre(mod, args):
            if self.paused:
                return
            self.stack.append((name, mod))
            if is_block and args and isinstance(args[0], Tensor):
                self.record(f"{name}:input", args[0], kind, type_)

        def post(mod, args, out):
            if self.paused:
                return
            if self.stack and self.stack[-1][1] is mod:
                self.stack.pop()
            first, rest = _first_tensor(out)
            self.record(f"{name}:output", first, kind, type_)
            for i, t in enumerate(rest, start=1):
                self.record(f"{name}:output.{i}", t, kind, type_)
            if (
                is_block
                and first is not None
                and args
                and isinstance(args[0], Tensor)
                and self.wanted(f"{name}:update")
            ):
                self.record(f"{name}:update", first - args[0], kind, type_)

        self.handles.append(module.register_forward_pre_hook(pre))
        return post

    def hook_linears(self, name: str, module: nn.Module) -> list[tuple[str, nn.Linear]]:
        linears = [(n, m) for n, m in _tagged_descendants(module, name) if isinstance(m, nn.Linear)]
        for child_name, lin in linears:
            if not self.wanted(f"{child_name}:output"):  # no hook at all where nothing would be kept
                continue

            def post(mod, args, out, child_name=child_name):
                self.record(f"{child_name}:output", out if isinstance(out, Tensor) else None, "linear", None)

            self.handles.append(lin.register_forward_hook(post))
        return linears

    def hook_attention(self, name: str, module: nn.Module) -> None:
        self.hook_linears(name, module)
        type_, kind = getattr(module, "modkit_type", None), getattr(module, "modkit_kind", "attention")
        weights_name = f"{name}:weights"
        method = getattr(module, "forward_with_weights", None)
        if not self.capability(module, "returns_weights"):
            self.missing(weights_name, f"{kind} type {type_!r} does not declare the returns_weights capability")
        elif not callable(method):
            self.missing(
                weights_name,
                f"{kind} type {type_!r} declares returns_weights but has no forward_with_weights(x, inputs)",
            )
        elif self.wanted(weights_name):

            def weights_hook(mod, args, kwargs, out):
                if self.paused:
                    return
                inputs = args[1] if len(args) > 1 else kwargs.get("inputs")
                if getattr(inputs, "cache", None) is not None:
                    self.missing(
                        weights_name,
                        "not recorded under a KV cache (a second attention call would store the keys twice)",
                    )
                    return
                x = args[0] if args else kwargs.get("x")
                devices = [x.device] if isinstance(x, Tensor) and x.device.type == "cuda" else []
                self.paused += 1
                try:
                    with torch.no_grad(), torch.random.fork_rng(devices=devices):
                        _, weights = method(*args, **kwargs)
                finally:
                    self.paused -= 1
                self.record(weights_name, weights, "attention", type_)

            self.handles.append(module.register_forward_hook(weights_hook, with_kwargs=True))

    def hook_ffn(self, name: str, module: nn.Module) -> None:
        linears = self.hook_linears(name, module)
        type_ = getattr(module, "modkit_type", None)
        down = [lin for _, lin in linears if self.d_model is not None and lin.out_features == self.d_model]
        if not down and self.d_model is None and linears:
            down = [linears[-1][1]]
        if not down:
            self.missing(
                f"{name}:hidden",
                f"ffn type {type_!r} has no nn.Linear projecting back to d_model = {self.d_model} (e.g. stacked experts)",
            )
            return
        if not self.wanted(f"{name}:hidden"):
            return

        def pre(mod, args):
            if args and isinstance(args[0], Tensor):
                self.record(f"{name}:hidden", args[0], "ffn", type_)

        self.handles.append(down[-1].register_forward_pre_hook(pre))

    def patch_position(self, name: str, module: nn.Module) -> None:
        type_ = getattr(module, "modkit_type", None)
        for method_name in POSITION_METHODS:
            original = getattr(module, method_name, None)
            if not callable(original):
                continue
            wrapper = self.position_wrapper(name, type_, method_name, original)
            self.patched.append((module, method_name, vars(module).get(method_name, _MISSING)))
            setattr(module, method_name, wrapper)

    def position_wrapper(self, name: str, type_: Optional[str], method_name: str, original: Callable) -> Callable:
        def wrapper(*args, **kwargs):
            out = original(*args, **kwargs)
            if self.paused:
                return out
            owner = self.current("attention")
            if method_name == "embed":
                if out is not (args[0] if args else kwargs.get("x")):  # a scheme that does not act here returns x
                    self.record(f"{name}:embed", out, "position", type_)
            elif method_name == "rotate":
                q, k = out
                where = owner or name
                self.record(f"{where}:q", q, "position", type_)
                self.record(f"{where}:k", k, "position", type_)
            elif out is not None:
                self.record(f"{owner or name}:position_bias", out, "position", type_)
            return out

        wrapper.__wrapped__ = original  # type: ignore[attr-defined]
        return wrapper

    # ------------------------------------------------------------------ remove
    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles.clear()
        for module, method_name, saved in reversed(self.patched):
            if saved is _MISSING:
                vars(module).pop(method_name, None)
            else:
                setattr(module, method_name, saved)
        self.patched.clear()
        self.stack.clear()


_MISSING = object()


@contextlib.contextmanager
def inspect(
    model: nn.Module, *, include: Optional[Sequence[str]] = None, registry: Optional[Registry] = None
) -> Iterator[Recording]:
    """Record named intermediate tensors of every registered component while the ``with`` block runs.

    ::

        with modkit.inspect(model) as rec:
            model(input_ids)
        rec["layers.0.attention:weights"].shape     # [batch, n_heads, seq, seq]

    Args:
        model: a :class:`~modkit.nn.model.Model` (or any module holding registry-built, ``modkit_kind``-tagged
            modules), on any device including ``meta`` (then the records are meta tensors: shapes only).
        include: ``fnmatch`` patterns of the names to record (e.g. ``["layers.*:update", "*:weights"]``);
            default everything. Attention weights are only computed when their name matches.
        registry: where the ``returns_weights`` capability is looked up; default the process-wide registry.

    Yields:
        the :class:`Recording`, filled as the model runs (read it after the forward).

    Raises:
        TypeError: ``model`` is not an ``nn.Module``.

    Every hook and wrapper is removed on exit, also when the block raises. See the module docstring for the names,
    where each comes from, and what recording costs.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"modkit.inspect needs an nn.Module (a modkit Model), got {type(model).__name__}")
    recorder = _Recorder(model, include, registry)
    try:
        recorder.install()
        yield recorder.rec
    finally:
        recorder.remove()


__all__ = ["Entry", "Recording", "inspect"]

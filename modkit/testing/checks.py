"""The contract checks and the function API that runs them.

Each check tests one invariant of the contracts in :mod:`modkit.interfaces` and the design brief ("The contract
kit"). Which checks apply to a component is decided by its kind and its capabilities (``causal_safe``,
``kv_cache``, ``compile_safe``, ``aux_loss``...) and by the fields of its config, never by its type name.

========================  =====================================================================================
check                     applies to
========================  =====================================================================================
``spec_roundtrip``        every component
``shape_dtype``           every component (the module itself for norm, ffn, attention, placement; the scheme and
                          the model for position; the model for other kinds)
``gradients``             every component with parameters
``causality``             every component; attention only when it claims ``causal_safe``
``kv_cache_decode``       every component; attention only with ``kv_cache`` (then against every position scheme)
``gqa_equals_mha``        attention whose config has ``n_heads`` and ``n_kv_heads``
``meta_init``             every component
``param_count``           components that declare ``param_count``
``aux_loss_grad``         components with the ``aux_loss`` capability
``compile``               components with the ``compile_safe`` capability
``masked_row``            attention and position
``shards``                components whose capabilities declare a non-empty ``tp_plan`` (opt-in: ``distributed``)
========================  =====================================================================================

``shards`` starts two gloo processes on the CPU (seconds), so it runs only when asked:
``check_component(..., distributed=True)``, ``run_checks(..., distributed=True)``, ``modkit check --distributed``
or ``pytest --modkit-contracts --modkit-distributed``; otherwise it is reported skipped ("pass --distributed to
run"). Run over several components, their ``shards`` checks share one session (:mod:`modkit.testing.shards`).

Use :func:`check_component` for one component and :func:`run_checks` for a selection of the registry; both
return :class:`CheckResult` objects whose ``detail`` carries the measured values.
"""

from __future__ import annotations

import fnmatch
import os
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Literal, Optional, Sequence, Union

import torch
from torch import Tensor, nn

from ..config import ComponentConfig
from ..errors import RegistryError, SpecError
from ..interfaces import AttentionInputs, split_aux
from ..registry import Component, Registry, get_registry
from ..spec import load_component, load_spec
from .harness import CONTRACT_KINDS, Bench, Record, Unavailable, qualified_names, registered_positions
from .flops import SUMMARY as FLOPS_SUMMARY, applies_flops, check_flops

Status = Literal["passed", "failed", "skipped"]

#: ``(batch, seq)`` shapes of the shape/dtype check; ``seq = 1`` is the decode shape.
SHAPES: tuple[tuple[int, int], ...] = ((1, 1), (2, 1), (2, 5), (3, 8))
#: dtypes of the shape/dtype check.
DTYPES: tuple[torch.dtype, ...] = (torch.float32, torch.bfloat16)
#: backend used by the ``compile`` check (``MODKIT_CHECK_COMPILE_BACKEND``); any ``fullgraph`` compile proves
#: there is no graph break, and ``eager`` keeps it fast on a CPU.
COMPILE_BACKEND = os.environ.get("MODKIT_CHECK_COMPILE_BACKEND", "eager")


@dataclass(frozen=True)
class CheckResult:
    """The outcome of one check on one component.

    Attributes:
        component: ``"kind/type"``.
        check: the check name, e.g. ``"causality"``.
        status: ``"passed"``, ``"failed"`` or ``"skipped"``.
        detail: what was measured (e.g. ``"max |Δ| = 0.31 at position 2 after changing token 5"``) or why the
            check was skipped.
    """

    component: str
    check: str
    status: Status
    detail: str = ""

    @property
    def id(self) -> str:
        """``"kind/type::check"``, the id the pytest plugin and ``modkit check`` use."""
        return f"{self.component}::{self.check}"

    @property
    def failed(self) -> bool:
        """True when the check failed."""
        return self.status == "failed"

    def __str__(self) -> str:
        return f"{self.id} {self.status}" + (f": {self.detail}" if self.detail else "")


class CheckFailed(AssertionError):
    """Raised by a check when the component breaks the invariant; the message is the result's detail."""


class CheckSkipped(Exception):
    """Raised by a check that cannot run for this component (the message says why)."""


@dataclass(frozen=True)
class Check:
    """One contract check.

    Attributes:
        name: stable identifier used in ids and ``--modkit-check`` / ``modkit check --check``.
        summary: one line: the invariant and where it comes from.
        run: ``run(bench) -> detail``; raises :class:`CheckFailed` or :class:`CheckSkipped`.
        applies: ``applies(entry, config) -> None`` if the check applies, else the reason it does not.
        distributed: the check starts processes; it runs only when the caller opts in (``distributed=True``).
        run_many: ``run_many(benches) -> [detail | exception]`` runs the check on several benches at once (one
            process session for all); :class:`CheckFailed` / ``AssertionError`` fail, :class:`CheckSkipped` /
            ``modkit.testing.shards.Skip`` skip, anything else fails as raised.
    """

    name: str
    summary: str
    run: Callable[[Bench], str]
    applies: Callable[[Component, ComponentConfig], Optional[str]] = field(default=lambda e, c: None)
    distributed: bool = False
    run_many: Optional[Callable[[Sequence[Bench]], list]] = None


# ------------------------------------------------------------------------------------------------- helpers


def _fmt(x: float) -> str:
    return f"{x:.3g}"


def _max_abs_diff(a: Tensor, b: Tensor) -> Tensor:
    """``|a - b|`` in float32 with NaN counted as +inf (a NaN must never compare as 'close')."""
    d = (a.float() - b.float()).abs()
    return torch.nan_to_num(d, nan=float("inf"))


def _tol(ref: Tensor, rel: float) -> float:
    scale = torch.nan_to_num(ref.float().abs(), nan=0.0, posinf=0.0).max().item() if ref.numel() else 0.0
    return rel * max(1.0, scale)


def _nonfinite(t: Tensor) -> int:
    return int((~torch.isfinite(t.float())).sum().item()) if t.is_floating_point() else 0


def _modules(records: Iterable[Record]) -> list[nn.Module]:
    seen, out = set(), []
    for r in records:
        if id(r.module) not in seen:
            seen.add(id(r.module))
            out.append(r.module)
    return out


def _layer_of(bench: Bench, records: list[Record], kind: str, layer: int) -> Optional[nn.Module]:
    for r in records:
        if r.entry.kind == kind and getattr(r.ctx, "layer_index", None) == layer and r.ctx.dim is None:
            return r.module
    return None


def _first_target(bench: Bench, records: list[Record]) -> Record:
    targets = bench.targets(records)
    if not targets:
        raise CheckFailed(f"the tiny model holds no module built by {bench.name}'s factory")
    # prefer one built for the residual stream (a norm may also serve as a per-head QK-norm)
    for r in targets:
        if r.ctx.dim is None:
            return r
    return targets[0]


def _inputs(bench: Bench, model: nn.Module, rec: Record, batch: int, seq: int, token_mask: Optional[Tensor] = None) -> AttentionInputs:
    return AttentionInputs(
        positions=bench.positions(batch, seq),
        token_mask=token_mask,
        position=bench.position_for(model, getattr(rec.ctx, "layer_index", None)),
    )


def _position_geometry(bench: Bench, model: nn.Module, records: list[Record], rec: Record) -> tuple[int, int, int]:
    """``(n_heads, n_kv_heads, head_dim)`` a position scheme serves (from its build context and layer 0's attention)."""
    attn = _layer_of(bench, records, "attention", 0)
    n_heads = rec.ctx.n_heads or getattr(attn, "n_heads", 1) or 1
    head_dim = rec.ctx.head_dim or getattr(attn, "head_dim", 8) or 8
    n_kv = getattr(attn, "n_kv_heads", n_heads) or n_heads
    return int(n_heads), int(n_kv), int(head_dim)


# ------------------------------------------------------------------------------------------------- checks


def check_spec_roundtrip(bench: Bench) -> str:
    """A spec holding the component survives JSON: ``load_spec(spec.to_json()) == spec``; so does the config alone.

    Why: specs are the interchange format (design brief, "Spec files"); a config that serialises to something
    it cannot read back (a tuple, a non-JSON float, an alias) breaks saved specs and ``modkit convert``.
    Also requires the config's JSON Schema to generate (editors and docs use it).
    """
    reg = bench.registry
    spec = load_spec(bench.spec, registry=reg)
    text = spec.to_json()
    again = load_spec(text, registry=reg)
    if again != spec:
        a, b = spec.to_dict(), again.to_dict()
        diffs = [k for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
        raise CheckFailed(f"load_spec(spec.to_json()) != spec; differing keys: {diffs}")
    data = bench.config.model_dump(mode="json")
    cfg = load_component(bench.entry.kind, data, registry=reg)
    if cfg != bench.config:
        raise CheckFailed(f"config {data} does not round-trip: re-validated as {cfg.model_dump(mode='json')}")
    try:
        bench.entry.config.model_json_schema()
    except Exception as exc:  # noqa: BLE001
        raise CheckFailed(f"{bench.entry.config.__name__}.model_json_schema() failed: {type(exc).__name__}: {exc}") from None
    return f"spec ({len(text)} chars of JSON) and config {data} round-trip"


def _exercise(bench: Bench, model: nn.Module, records: list[Record], b: int, s: int, dtype: torch.dtype):
    """Yield ``(label, output, expected shape, expected dtype)`` for one call of the component's contract."""
    kind = bench.entry.kind
    d = bench.d_model()
    if kind in ("norm", "ffn", "attention", "placement"):
        rec = _first_target(bench, records)
        m = rec.module
        width = rec.ctx.dim or d
        x = bench.randn(b, s, width, dtype=dtype, seed=b * 31 + s)
        if kind == "norm":
            yield "norm(x)", m(x), x.shape, dtype
        elif kind == "ffn":
            out = m(x)
            y, aux = split_aux(out)
            declares = bool(bench.entry.capabilities.get("aux_loss"))
            if isinstance(out, tuple) and not declares:
                raise CheckFailed("ffn returned a tuple but the entry does not declare the aux_loss capability")
            if declares and not isinstance(out, tuple):
                raise CheckFailed("the entry declares aux_loss but forward returned a single tensor, not (output, aux_loss)")
            if aux is not None:
                if not isinstance(aux, Tensor) or aux.dim() != 0:
                    raise CheckFailed(f"aux_loss must be a scalar tensor, got {getattr(aux, 'shape', type(aux).__name__)}")
                if _nonfinite(aux):
                    raise CheckFailed(f"aux_loss is not finite: {aux.item()}")
            yield "ffn(x)", y, x.shape, dtype
        elif kind == "attention":
            yield "attention(x, inputs)", m(x, _inputs(bench, model, rec, b, s)), x.shape, dtype
        else:
            out = m(x, _inputs(bench, model, rec, b, s))
            if not (isinstance(out, tuple) and len(out) == 2):
                raise CheckFailed(f"a placement's block must return (x, aux_loss | None), got {type(out).__name__}")
            yield "block(x, inputs)[0]", out[0], x.shape, dtype
    elif kind == "position":
        rec = _first_target(bench, records)
        scheme = rec.module
        h, hkv, hd = _position_geometry(bench, model, records, rec)
        pos = bench.positions(b, s)
        x = bench.randn(b, s, d, dtype=dtype, seed=1)
        yield "embed(x, positions)", scheme.embed(x, pos), x.shape, dtype
        q = bench.randn(b, h, s, hd, dtype=dtype, seed=2)
        k = bench.randn(b, hkv, s, hd, dtype=dtype, seed=3)
        rq, rk = scheme.rotate(q, k, pos)
        yield "rotate(q, k)[0]", rq, q.shape, dtype
        yield "rotate(q, k)[1]", rk, k.shape, dtype
        bias = scheme.attention_bias(pos, pos, h)
        if bias is not None:
            try:
                ok = bias.dim() == 4 and torch.broadcast_shapes(bias.shape, (b, h, s, s)) == (b, h, s, s)
            except RuntimeError:
                ok = False
            if not ok:
                raise CheckFailed(f"attention_bias shape {tuple(bias.shape)} does not broadcast to [batch, n_heads, q, k] = {(b, h, s, s)}")
            if not bias.is_floating_point():
                raise CheckFailed(f"attention_bias dtype {bias.dtype} is not floating point")
        ids = bench.ids(b, s)
        yield "model(ids).logits", model(ids).logits, torch.Size((b, s, bench.spec["vocab_size"])), dtype
    else:
        ids = bench.ids(b, s)
        yield "model(ids).logits", model(ids).logits, torch.Size((b, s, bench.spec["vocab_size"])), dtype


def check_shape_dtype(bench: Bench) -> str:
    """Shape ``[batch, seq, d_model]``, dtype and device are preserved, outputs are finite.

    Runs for ``(batch, seq)`` in :data:`SHAPES` (``seq = 1`` included: the decode shape) in float32 and bfloat16.
    Source: the per-kind contracts of :mod:`modkit.interfaces` (every block-level component maps
    ``[batch, seq, d_model] -> [batch, seq, d_model]``; norms compute in float32 but return the input dtype,
    pytorch #133085); position schemes keep q/k shapes and return a bias broadcastable to
    ``[batch, n_heads, q_len, kv_len]``.
    """
    problems: list[str] = []
    calls = 0
    for dtype in DTYPES:
        model, records = bench.build(dtype=dtype)
        model.eval()
        for b, s in SHAPES:
            with torch.no_grad():
                for label, out, shape, want in _exercise(bench, model, records, b, s, dtype):
                    calls += 1
                    where = f"{str(dtype).replace('torch.', '')} (batch {b}, seq {s}): {label}"
                    if not isinstance(out, Tensor):
                        problems.append(f"{where} returned {type(out).__name__}, not a tensor")
                        continue
                    if tuple(out.shape) != tuple(shape):
                        problems.append(f"{where} has shape {tuple(out.shape)}, expected {tuple(shape)}")
                    if out.dtype != want:
                        problems.append(f"{where} has dtype {out.dtype}, expected {want}")
                    if out.device != bench.device and not (out.device.type == bench.device.type and bench.device.index is None):
                        problems.append(f"{where} is on {out.device}, expected {bench.device}")
                    bad = _nonfinite(out)
                    if bad:
                        problems.append(f"{where} has {bad} non-finite value(s)")
    if problems:
        more = f" (+{len(problems) - 3} more)" if len(problems) > 3 else ""
        raise CheckFailed("; ".join(problems[:3]) + more)
    shapes = ", ".join(f"({b},{s})" for b, s in SHAPES)
    return f"{calls} calls: (batch, seq) in {shapes} x float32, bfloat16 keep shape, dtype and device"


def check_gradients(bench: Bench) -> str:
    """Every parameter of the component receives a finite, non-zero gradient from a loss on the logits.

    A tiny model holding the component runs ``4 x 16`` random tokens (enough that a router spreads tokens
    over every expert); the loss is the logits projected on a random direction plus the aux loss, so every
    logit matters. Source: a parameter that never learns is dead weight or a wiring bug (e.g. an expert no
    token reaches, Megatron-LM #1617 for routers that get no gradient).
    """
    model, records = bench.build()
    model.train()
    modules = _modules(bench.targets(records))
    names = qualified_names(model)
    params: list[tuple[str, nn.Parameter]] = []
    seen: set[int] = set()
    for m in modules:
        for n, p in m.named_parameters():
            if id(p) not in seen:
                seen.add(id(p))
                params.append((f"{names.get(id(m), '?')}.{n}", p))
    if not params:
        raise CheckSkipped("the component has no parameters")
    ids = bench.ids(4, 16, seed=5)
    out = model(ids)
    direction = bench.randn(*out.logits.shape, seed=6)
    loss = (out.logits.float() * direction).sum()
    if out.aux_loss is not None:
        loss = loss + out.aux_loss.float()
    loss.backward()
    problems = []
    for n, p in params:
        if not p.requires_grad:
            continue
        if p.grad is None:
            problems.append(f"{n}: no gradient (grad is None)")
        elif _nonfinite(p.grad):
            problems.append(f"{n}: {_nonfinite(p.grad)} non-finite gradient value(s)")
        elif not bool(p.grad.abs().max() > 0):
            problems.append(f"{n}: gradient is exactly zero")
    if problems:
        more = f" (+{len(problems) - 4} more)" if len(problems) > 4 else ""
        raise CheckFailed(f"{len(problems)} of {len(params)} parameters: " + "; ".join(problems[:4]) + more)
    total = sum(p.numel() for _, p in params)
    return f"all {len(params)} parameters ({total:,} values) got finite non-zero gradients from 64 tokens"


def _applies_causality(entry: Component, config: ComponentConfig) -> Optional[str]:
    if entry.kind == "attention" and not entry.capabilities.get("causal_safe"):
        return "the entry does not claim causal_safe"
    if getattr(config, "causal", True) is False:
        return "the config is bidirectional (causal = false)"
    return None


def check_causality(bench: Bench) -> str:
    """Changing the token at position j never changes the logits at positions < j.

    Tested in a tiny model for j = 1..7 of an 8-token sequence (float32, tolerance 1e-5 relative to the logit
    scale). Source: a decoder must not see the future (transformers #45811: a custom attention registered
    without its mask silently loses causality). Applies to causal_safe attention and to every other kind
    (position schemes, placements, norms and ffns must not mix positions either).
    """
    model, _ = bench.build()
    model.eval()
    b, s = 2, 8
    vocab = bench.spec["vocab_size"]
    ids = bench.ids(b, s, seed=11)
    with torch.no_grad():
        base = model(ids).logits
        bad = _nonfinite(base)
        if bad:
            raise CheckFailed(f"the logits hold {bad} non-finite value(s) before any change")
        tol = _tol(base, 1e-5)
        g = bench.generator(12)
        for j in range(1, s):
            changed = ids.clone()
            shift = torch.randint(1, vocab, (b,), generator=g).to(ids.device)
            changed[:, j] = (ids[:, j] + shift) % vocab
            out = model(changed).logits
            d = _max_abs_diff(out[:, :j], base[:, :j])
            worst = d.max().item()
            if worst > tol:
                per_pos = d.amax(dim=(0, 2))
                pos = int(per_pos.argmax().item())
                raise CheckFailed(
                    f"max |Δ| = {_fmt(worst)} at position {pos} after changing token {j} "
                    f"(logits at positions < {j} must not change; tolerance {_fmt(tol)})"
                )
    return f"changing token j (j = 1..{s - 1} of {s}) left every earlier logit unchanged (tolerance {_fmt(tol)})"


def _applies_kv(entry: Component, config: ComponentConfig) -> Optional[str]:
    if entry.kind == "attention" and not entry.capabilities.get("kv_cache"):
        return "the entry does not claim kv_cache"
    if getattr(config, "causal", True) is False:
        return "the config is bidirectional (causal = false)"
    return None


#: prefill, one token, a chunk of two (bottom-right mask alignment), then single tokens
DECODE_CHUNKS = ((0, 3), (3, 4), (4, 6), (6, 7), (7, 8))


def _decode_mismatch(bench: Bench, spec: dict) -> tuple[Optional[str], float]:
    model, records = bench.build(spec)
    model.eval()
    ids = bench.ids(2, DECODE_CHUNKS[-1][1], seed=21)
    with torch.no_grad():
        full = model(ids).logits
        cache = model.new_cache()
        parts = [model(ids[:, a:e], cache=cache).logits for a, e in DECODE_CHUNKS]
    inc = torch.cat(parts, dim=1)
    tol = _tol(full, 1e-4)
    d = _max_abs_diff(inc, full)
    worst = d.max().item()
    if worst > tol:
        pos = int(d.amax(dim=(0, 2)).argmax().item())
        chunk = next((a, e) for a, e in DECODE_CHUNKS if a <= pos < e)
        return (
            f"max |Δ| = {_fmt(worst)} between cached decode and the full forward at position {pos} "
            f"(fed as tokens [{chunk[0]}, {chunk[1]}) after {chunk[0]} cached; tolerance {_fmt(tol)})",
            tol,
        )
    for i, layer in enumerate(cache.layers):
        attn = _layer_of(bench, records, "attention", i)
        heads = getattr(attn, "n_kv_heads", None)
        if layer.k is not None and heads is not None and layer.k.shape[1] != heads:
            return (f"layer {i}'s cache holds {layer.k.shape[1]} heads but n_kv_heads = {heads} (torchtune #38)", tol)
    return None, tol


def check_kv_cache_decode(bench: Bench) -> str:
    """Decoding with the KV cache (prefill 3, then 1, 2, 1, 1 tokens) gives the full forward's logits.

    For an attention with the ``kv_cache`` capability this runs once per registered position scheme (rope
    rotates cached keys once, ALiBi needs key positions, absolute schemes need the right offsets); for other
    kinds, with the tiny model's kv_cache attention. Also checks the cache stores ``n_kv_heads`` heads.
    Source: design brief, "Attention and the KV cache" (bottom-right causal alignment when query and key
    lengths differ; torchtune #38 for the head count).
    """
    if bench.entry.kind == "attention":
        schemes = registered_positions(bench)
        if not schemes:
            raise CheckSkipped("no registered position scheme has a valid example config")
    else:
        filler = bench.fillers.get("attention")
        if bench.entry.kind != "attention" and filler is not None and not filler[0].capabilities.get("kv_cache"):
            raise CheckSkipped("no registered attention with the kv_cache capability to decode with")
        schemes = [(None, None)]
    failures, passed, unusable = [], [], []
    tol = 0.0
    for pos_entry, pos_cfg in schemes:
        spec = bench.spec_with(position=pos_cfg) if pos_entry is not None else bench.spec
        label = pos_entry.type if pos_entry is not None else bench.spec["position"]["type"]
        try:
            load_spec(spec, registry=bench.registry)
        except SpecError as exc:
            unusable.append(f"{label} ({exc.errors[0][1] if exc.errors else exc})")
            continue
        problem, tol = _decode_mismatch(bench, spec)
        if problem:
            failures.append(f"with position {label}: {problem}" if pos_entry is not None else problem)
        else:
            passed.append(label)
    if failures:
        raise CheckFailed("; ".join(failures))
    if not passed:
        raise CheckSkipped("no position scheme could be combined with it: " + "; ".join(unusable))
    note = f"; not combinable: {', '.join(unusable)}" if unusable else ""
    return f"cached decode equals the full forward (tolerance {_fmt(tol)}) with position {', '.join(passed)}{note}"


def _applies_gqa(entry: Component, config: ComponentConfig) -> Optional[str]:
    if entry.kind != "attention":
        return "not an attention"
    fields = entry.config.model_fields
    if "n_kv_heads" not in fields or "n_heads" not in fields:
        return "the config has no n_heads / n_kv_heads fields"
    return None


def _divisors_below(n: int) -> list[int]:
    return [g for g in range(n - 1, 0, -1) if n % g == 0]


def check_gqa_equals_mha(bench: Bench) -> str:
    """Grouped-query attention equals multi-head attention whose key/value heads are the groups' copies.

    The component is built with ``n_kv_heads = g < n_heads`` and with ``n_kv_heads = n_heads``; every weight of
    the second is taken from the first, with each key/value head repeated ``n_heads / g`` times along the
    projection's output dimension (head-major layout; query head ``h`` reads key/value head ``h // (n_heads/g)``,
    the convention of GQA, Ainslie et al. 2023, torchtune and Hugging Face ``repeat_kv``). The two models must
    give the same logits. Skipped when the config cannot express both head counts (e.g. an entry fixed to MHA).
    """
    reg = bench.registry
    cfg = bench.config_json
    n_heads = cfg.get("n_heads")
    if not isinstance(n_heads, int) or n_heads < 2:
        raise CheckSkipped(f"n_heads = {n_heads!r}; grouping needs at least 2 query heads")
    candidates = ([cfg["n_kv_heads"]] if isinstance(cfg.get("n_kv_heads"), int) and cfg["n_kv_heads"] < n_heads else [])
    candidates += [g for g in _divisors_below(n_heads) if g not in candidates]
    grouped = None
    for g in candidates:
        try:
            grouped = (g, load_component("attention", {**cfg, "n_kv_heads": g}, registry=reg).model_dump(mode="json"))
            break
        except SpecError:
            continue
    if grouped is None:
        raise CheckSkipped(f"the config accepts no n_kv_heads below n_heads = {n_heads}")
    try:
        full = load_component("attention", {**cfg, "n_kv_heads": n_heads}, registry=reg).model_dump(mode="json")
    except SpecError as exc:
        raise CheckSkipped(f"the config rejects n_kv_heads = n_heads = {n_heads} ({exc.errors[0][1] if exc.errors else exc})") from None
    g, grouped_cfg = grouped
    rep = n_heads // g
    model_g, rec_g = bench.build(bench.spec_with(attention=grouped_cfg))
    model_f, rec_f = bench.build(bench.spec_with(attention=full))
    for model, recs, want in ((model_g, rec_g, g), (model_f, rec_f, n_heads)):
        att = _layer_of(bench, recs, "attention", 0)
        got = getattr(att, "n_kv_heads", want)
        if got != want:
            raise CheckFailed(f"built with n_kv_heads = {want}, the module reports n_kv_heads = {got}")
    sd_g, sd_f = model_g.state_dict(), model_f.state_dict()
    if set(sd_g) != set(sd_f):
        raise CheckSkipped(f"parameter names differ between n_kv_heads = {g} and {n_heads}: {sorted(set(sd_g) ^ set(sd_f))[:4]}")
    new, repeated = {}, []
    for k, b in sd_f.items():
        a = sd_g[k]
        if a.shape == b.shape:
            new[k] = a
        elif a.dim() == b.dim() and a.dim() >= 1 and a.shape[1:] == b.shape[1:] and b.shape[0] == a.shape[0] * rep and a.shape[0] % g == 0:
            new[k] = a.reshape(g, -1, *a.shape[1:]).repeat_interleave(rep, dim=0).reshape(b.shape)
            repeated.append(k)
        else:
            raise CheckSkipped(f"cannot map {k} of shape {tuple(a.shape)} onto {tuple(b.shape)} by repeating key/value heads")
    model_f.load_state_dict(new)
    model_g.eval(), model_f.eval()
    ids = bench.ids(2, 8, seed=31)
    mask = torch.ones(2, 8, dtype=torch.bool, device=ids.device)
    mask[0, :2] = False
    with torch.no_grad():
        pairs = [(model_g(ids).logits, model_f(ids).logits), (model_g(ids, attention_mask=mask).logits, model_f(ids, attention_mask=mask).logits)]
    for label, (a, b) in zip(("plain", "left-padded"), pairs):
        tol = _tol(a, 1e-5)
        d = _max_abs_diff(a, b)
        if d.max().item() > tol:
            pos = int(d.amax(dim=(0, 2)).argmax().item())
            raise CheckFailed(
                f"n_kv_heads = {g} and n_kv_heads = {n_heads} with repeated key/value weights differ ({label} input): "
                f"max |Δ| = {_fmt(d.max().item())} at position {pos} (tolerance {_fmt(tol)}); repeated: {repeated}"
            )
    return f"n_kv_heads = {g} equals n_kv_heads = {n_heads} with each key/value head repeated {rep}x ({len(repeated)} tensors)"


def check_meta_init(bench: Bench) -> str:
    """``modkit.build`` (meta, ``to_empty``, ``init_weights``) gives finite tensors EQUAL to a direct CPU build.

    Both use the same seed; every parameter and every buffer (non-persistent ones too, e.g. RoPE tables) is
    compared exactly. Source: design brief, "Assembly" (one ``init_weights`` that also recomputes every buffer;
    transformers #45902: RoPE tables left as garbage after a meta build).
    """
    seed = 7
    meta, records = bench.build_meta(seed=seed)
    direct, _ = bench.build(seed=seed)
    ta = {**{f"parameter {n}": t for n, t in meta.named_parameters()}, **{f"buffer {n}": t for n, t in meta.named_buffers()}}
    tb = {**{f"parameter {n}": t for n, t in direct.named_parameters()}, **{f"buffer {n}": t for n, t in direct.named_buffers()}}
    if set(ta) != set(tb):
        raise CheckFailed(f"meta and direct builds hold different tensors: {sorted(set(ta) ^ set(tb))[:5]}")
    names = qualified_names(meta)
    own = tuple(names[id(m)] + "." for m in _modules(bench.targets(records)) if id(m) in names)
    problems = []
    for k in sorted(ta):
        a, b = ta[k], tb[k]
        if a.shape != b.shape or a.dtype != b.dtype:
            problems.append(f"{k}: {tuple(a.shape)} {a.dtype} after meta build vs {tuple(b.shape)} {b.dtype} direct")
            continue
        bad = _nonfinite(a)
        if bad:
            problems.append(f"{k}: {bad} non-finite value(s) after meta build + init_weights()")
            continue
        if not torch.equal(a, b):
            d = _max_abs_diff(a, b).max().item()
            problems.append(f"{k}: max |Δ| = {_fmt(d)} between meta build + init_weights() and a direct build (seed {seed})")
    if problems:
        mine = [p for p in problems if p.split(": ")[0].split(" ", 1)[1].startswith(own)] or problems
        hint = " (compute buffers in init_weights(init) with init.copy_, not only in __init__; transformers #45902)"
        return_text = "; ".join(mine[:3]) + (f" (+{len(mine) - 3} more)" if len(mine) > 3 else "")
        raise CheckFailed(return_text + hint)
    n_buf = sum(1 for k in ta if k.startswith("buffer"))
    return f"{len(ta) - n_buf} parameters and {n_buf} buffers finite and equal to a direct build (seed {seed})"


def _applies_param_count(entry: Component, config: ComponentConfig) -> Optional[str]:
    return None if entry.param_count is not None else "the entry declares no param_count"


def check_param_count(bench: Bench) -> str:
    """The declared analytic ``param_count(config, ctx)`` equals the parameters the factory's module holds.

    Evaluated with the exact :class:`~modkit.BuildContext` the factory got inside the tiny model (built on
    ``meta``), for every distinct instance. Source: design brief, "Each registry entry carries ... " and
    OLMo-core's analytic parameter counts: sizing tools trust the declared number.
    """
    _, records = bench.build_meta(device="meta")
    targets = bench.targets(records)
    if not targets:
        raise CheckFailed(f"the tiny model holds no module built by {bench.name}'s factory")
    checked = []
    seen_ctx = set()
    for r in targets:
        key = (r.ctx.dim, r.ctx.n_heads, r.ctx.head_dim, repr(sorted(r.ctx.extra.items())))
        if key in seen_ctx:
            continue
        seen_ctx.add(key)
        declared = int(bench.entry.param_count(r.config, r.ctx))
        actual = sum(p.numel() for p in r.module.parameters())
        where = f"dim = {r.ctx.dim or r.ctx.d_model}" + (f", extra = {dict(r.ctx.extra)}" if r.ctx.extra else "")
        if declared != actual:
            raise CheckFailed(f"declared {declared:,} parameters, the module holds {actual:,} (difference {declared - actual:+,}; {where})")
        checked.append(f"{actual:,} ({where})")
    return "declared = actual: " + "; ".join(checked)


def _applies_aux(entry: Component, config: ComponentConfig) -> Optional[str]:
    return None if entry.capabilities.get("aux_loss") else "the entry does not declare aux_loss"


def check_aux_loss_grad(bench: Bench) -> str:
    """The aux loss alone back-propagates into the router (every parameter of nested ``router`` components).

    The model's ``aux_loss`` must be a finite scalar; ``aux_loss.backward()`` must give every router parameter a
    non-zero gradient (without nested routers: at least one parameter of the component). Source: design brief,
    "Lessons" (MoE aux loss whose gradient never reaches the router, Megatron-LM #1617).
    """
    model, records = bench.build()
    model.train()
    ids = bench.ids(4, 16, seed=41)
    out = model(ids)
    aux = out.aux_loss
    if aux is None:
        raise CheckFailed("the model returned aux_loss = None although the entry declares aux_loss")
    if not isinstance(aux, Tensor) or aux.dim() != 0:
        raise CheckFailed(f"aux_loss must be a scalar tensor, got shape {tuple(getattr(aux, 'shape', ()))}")
    if _nonfinite(aux):
        raise CheckFailed(f"aux_loss = {aux.item()} is not finite")
    if not aux.requires_grad:
        raise CheckFailed(f"aux_loss = {aux.item():.4g} carries no gradient (requires_grad = False)")
    aux.backward()
    names = qualified_names(model)
    targets = _modules(bench.targets(records))
    routers = [m for t in targets for m in t.modules() if m is not t and getattr(m, "modkit_kind", None) == "router"]
    pool = routers or targets
    got, missing = [], []
    for m in pool:
        for n, p in m.named_parameters():
            full = f"{names.get(id(m), '?')}.{n}"
            if p.grad is not None and bool(p.grad.abs().max() > 0) and not _nonfinite(p.grad):
                got.append((full, p.grad.abs().max().item()))
            elif routers:
                missing.append(full)
    if missing:
        raise CheckFailed(f"aux_loss = {aux.item():.4g} gives no gradient to router parameter(s) {missing[:4]}")
    if not got:
        raise CheckFailed(f"aux_loss = {aux.item():.4g} gives no gradient to any parameter of the component")
    what = "router" if routers else "component"
    return f"aux_loss = {aux.item():.4g}; {what} gradients: " + ", ".join(f"{n} max |g| = {_fmt(v)}" for n, v in got[:3])


def _applies_compile(entry: Component, config: ComponentConfig) -> Optional[str]:
    return None if entry.capabilities.get("compile_safe") else "the entry does not claim compile_safe"


def _compile_target(bench: Bench, model: nn.Module, records: list[Record]) -> tuple[Callable, tuple, str]:
    """``(fn, args, what)``: the call to compile for the component (or for its host, for kinds without a contract)."""
    kind, rec = bench.entry.kind, None
    if kind in CONTRACT_KINDS:
        rec = _first_target(bench, records)
    elif bench.host is not None:  # e.g. a router: compile the ffn that holds it, with the ffn calling convention
        host = bench.host[0]
        hosts = [r for r in records if r.entry.key == host.key]
        if hosts and host.kind in CONTRACT_KINDS:
            kind, rec = host.kind, hosts[0]
    b, s, d = 2, 6, bench.d_model()
    if rec is not None and kind in ("norm", "ffn"):
        return rec.module, (bench.randn(b, s, rec.ctx.dim or d, seed=51),), f"{kind} module"
    if rec is not None and kind in ("attention", "placement"):
        m = rec.module
        scheme = bench.position_for(model, getattr(rec.ctx, "layer_index", None))
        if kind == "placement":  # the block; padding paths are the attention's own compile check

            def block_fn(x: Tensor, pos: Tensor):
                return m(x, AttentionInputs(positions=pos, position=scheme))

            return block_fn, (bench.randn(b, s, d, seed=52), bench.positions(b, s)), "block(x, inputs)"

        def fn(x: Tensor, pos: Tensor, mask: Tensor):
            plain = m(x, AttentionInputs(positions=pos, position=scheme))
            padded = m(x, AttentionInputs(positions=pos, token_mask=mask, position=scheme))
            return plain, padded

        mask = torch.ones(b, s, dtype=torch.bool, device=bench.device)
        mask[0, :2] = False
        return fn, (bench.randn(b, s, d, seed=52), bench.positions(b, s), mask), "attention(x, inputs) with and without padding"
    if rec is not None and kind == "position":
        scheme = rec.module
        h, hkv, hd = _position_geometry(bench, model, records, rec)

        def pfn(x: Tensor, q: Tensor, k: Tensor, pos: Tensor):
            rq, rk = scheme.rotate(q, k, pos)
            return scheme.embed(x, pos), rq, rk, scheme.attention_bias(pos, pos, h)

        args = (bench.randn(b, s, d, seed=53), bench.randn(b, h, s, hd, seed=54), bench.randn(b, hkv, s, hd, seed=55), bench.positions(b, s))
        return pfn, args, "embed, rotate and attention_bias"

    def mfn(ids: Tensor):
        return model(ids).logits

    return mfn, (bench.ids(b, s, seed=56),), "the tiny model"


def _flat(out: Any) -> list[Tensor]:
    if isinstance(out, Tensor):
        return [out]
    if isinstance(out, (tuple, list)):
        return [t for o in out for t in _flat(o)]
    return []


def check_compile(bench: Bench) -> str:
    """``torch.compile(fullgraph=True)`` traces the component's forward without a graph break and matches eager.

    Compiles the module itself (norm, ffn), the attention with and without left padding, the placement's
    block, the position scheme's ``embed``/``rotate``/``attention_bias``; for other kinds the component that
    hosts it (a router: its MoE) or else the tiny model; with backend :data:`COMPILE_BACKEND`. Source: design brief, "Lessons" (``.item()`` / ``.tolist()`` in MoE routing
    break graphs, torchtune #2771); claimed by the ``compile_safe`` capability.
    """
    import torch._dynamo

    model, records = bench.build()
    model.eval()
    fn, args, what = _compile_target(bench, model, records)
    torch._dynamo.reset()
    try:
        with torch.no_grad():
            eager = fn(*args)
            try:
                compiled = torch.compile(fn, fullgraph=True, backend=COMPILE_BACKEND)(*args)
            except Exception as exc:  # noqa: BLE001 - any dynamo error means the claim is false
                msg = " ".join(str(exc).split())
                raise CheckFailed(
                    f"torch.compile(fullgraph=True, backend={COMPILE_BACKEND!r}) failed: {type(exc).__name__}: {msg[:400]}"
                ) from None
    finally:
        torch._dynamo.reset()
    ea, ca = _flat(eager), _flat(compiled)
    if len(ea) != len(ca):
        raise CheckFailed(f"compiled call returned {len(ca)} tensors, eager {len(ea)}")
    worst = 0.0
    for a, c in zip(ea, ca):
        if a.shape != c.shape:
            raise CheckFailed(f"compiled output shape {tuple(c.shape)} != eager {tuple(a.shape)}")
        d = _max_abs_diff(a, c).max().item() if a.numel() else 0.0
        tol = _tol(a, 1e-5)
        if d > tol:
            raise CheckFailed(f"compiled output differs from eager: max |Δ| = {_fmt(d)} (tolerance {_fmt(tol)})")
        worst = max(worst, d)
    return f"fullgraph compile of {what} (backend {COMPILE_BACKEND!r}): no graph break; max |Δ| vs eager = {_fmt(worst)}"


def _applies_grouped(entry: Component, config: ComponentConfig) -> Optional[str]:
    return None if entry.grouped_factory is not None else "the entry declares no grouped_factory"


def check_grouped_form(bench: Bench) -> str:
    """The grouped form (``grouped_factory``, the stacked copies a mixture of experts uses as experts) keeps its contract.

    Three copies, rows ``[0, 4)``, ``[4, 4)`` (empty) and ``[4, 10)`` of ``x [10, d_model]``: the output is
    ``[10, d_model]``, finite, in ``x``'s dtype; each group's rows, run alone as a single non-empty group, give the
    same output (rows go to the right copy and never mix); the same rows through copy 0 and copy 2 differ (the copies
    hold independent weights); ``init_weights(init)`` initialises every parameter; the parameter count is ``n``
    times the declared ``param_count``; every parameter gets a gradient; with ``compile_safe``, the call compiles
    with ``fullgraph=True`` (no host synchronisation, torchtune #2771).
    """
    import torch._dynamo

    from ..interfaces import BuildContext, Init

    d = int(bench.spec["d_model"])
    ctx = BuildContext(d, 1, int(bench.spec["vocab_size"]), int(bench.spec["max_seq_len"]), bench.registry)
    n, ends = 3, [4, 4, 10]
    bank = ctx.build_grouped(bench.config, n).to(bench.device)
    init_fn = getattr(bank, "init_weights", None)
    if init_fn is None:
        raise CheckFailed(f"the grouped form {type(bank).__name__} has no init_weights(init)")
    init = Init(0, 0.2)
    init_fn(init)
    missed = [name for name, p in bank.named_parameters() if id(p) not in init.seen]
    if missed:
        raise CheckFailed(f"init_weights(init) left {missed[:4]} uninitialised")
    if bench.entry.param_count is not None:
        declared, actual = n * int(bench.entry.param_count(bench.config, ctx)), sum(p.numel() for p in bank.parameters())
        if declared != actual:
            raise CheckFailed(f"{n} copies hold {actual:,} parameters, {n} x param_count = {declared:,}")
    x = torch.randn(10, d, generator=torch.Generator().manual_seed(5)).to(bench.device)
    offs = torch.tensor(ends, dtype=torch.int32, device=bench.device)
    y = bank(x, offs)
    if not isinstance(y, Tensor) or tuple(y.shape) != (10, d) or y.dtype != x.dtype or _nonfinite(y):
        raise CheckFailed(f"forward(x [10, {d}], offs) returned {getattr(y, 'shape', type(y))} {getattr(y, 'dtype', '')}, "
                          f"expected [10, {d}] {x.dtype}, finite")
    alone = {0: (0, 4), 2: (4, 10)}
    worst = 0.0
    for g, (a, b) in alone.items():
        only = torch.tensor([0] * g + [b - a] * (n - g), dtype=torch.int32, device=bench.device)
        worst = max(worst, _max_abs_diff(bank(x[a:b], only), y[a:b]).max().item())
    if worst > _tol(y, 1e-5):
        raise CheckFailed(f"a group's rows run alone differ from the same rows in the grouped call: max |Δ| = {_fmt(worst)}")
    through0 = bank(x, torch.tensor([10, 10, 10], dtype=torch.int32, device=bench.device))
    through2 = bank(x, torch.tensor([0, 0, 10], dtype=torch.int32, device=bench.device))
    if _max_abs_diff(through0, through2).max().item() == 0.0:
        raise CheckFailed("copy 0 and copy 2 give identical outputs: the copies do not hold independent weights")
    bank(x, offs).pow(2).sum().backward()
    dead = [name for name, p in bank.named_parameters() if p.grad is None or not bool(p.grad.abs().max() > 0)]
    if dead:
        raise CheckFailed(f"no gradient reached {dead[:4]}")
    compiled = ""
    if bench.entry.capabilities.get("compile_safe"):
        torch._dynamo.reset()
        try:
            with torch.no_grad():
                c = torch.compile(bank, fullgraph=True, backend=COMPILE_BACKEND)(x, offs)
        except Exception as exc:  # noqa: BLE001 - any dynamo error means the claim is false
            raise CheckFailed(f"torch.compile(fullgraph=True) of the grouped form failed: {type(exc).__name__}: "
                              f"{' '.join(str(exc).split())[:300]}") from None
        finally:
            torch._dynamo.reset()
        compiled = f"; fullgraph compile max |Δ| = {_fmt(_max_abs_diff(c, y.detach()).max().item())}"
    return f"{n} copies: rows stay in their group (max |Δ| alone vs grouped = {_fmt(worst)}), copies independent, " \
           f"init and gradients reach every parameter{compiled}"


def _applies_masked(entry: Component, config: ComponentConfig) -> Optional[str]:
    return None if entry.kind in ("attention", "position") else "applies to attention and position schemes"


def check_masked_row(bench: Bench) -> str:
    """Left padding: no NaN anywhere (padding queries see no key at all), and real tokens are unaffected.

    Sequence 0 of a batch is left-padded by 3 tokens (``attention_mask`` 0), so its first query rows are fully
    masked; every logit must be finite, and the real tokens' logits must equal those of the unpadded sequence
    (positions derive from the mask). Source: design brief, "Attention and the KV cache" (fully masked rows must
    not produce NaN; pytorch #103749).
    """
    model, _ = bench.build()
    model.eval()
    pad, s = 3, 7
    ids = bench.ids(2, s, seed=61)
    mask = torch.ones(2, s, dtype=torch.bool, device=ids.device)
    mask[0, :pad] = False
    with torch.no_grad():
        out = model(ids, attention_mask=mask).logits
        bad = ~torch.isfinite(out.float())
        if bad.any():
            rows = sorted({(int(b), int(p)) for b, p, _ in bad.nonzero().tolist()})
            raise CheckFailed(f"{int(bad.sum())} non-finite logits at (batch, position) {rows[:6]} with {pad} left-padding tokens")
        ref0 = model(ids[0:1, pad:]).logits[0]
        ref1 = model(ids[1:2]).logits[0]
    for label, got, ref, offset in (("padded sequence", out[0, pad:], ref0, pad), ("unpadded neighbour", out[1], ref1, 0)):
        tol = _tol(ref, 1e-4)
        d = _max_abs_diff(got, ref)
        if d.max().item() > tol:
            pos = int(d.amax(dim=-1).argmax().item()) + offset
            raise CheckFailed(
                f"left padding changes the {label}'s real-token logits: max |Δ| = {_fmt(d.max().item())} at position {pos} "
                f"(tolerance {_fmt(tol)})"
            )
    return f"{pad} left-padding tokens: all logits finite, real tokens equal the unpadded run"


def _applies_shards(entry: Component, config: ComponentConfig) -> Optional[str]:
    plan = entry.capabilities.get("tp_plan")
    return None if isinstance(plan, dict) and plan else "the entry declares no non-empty tp_plan capability"


def _outcome(value: Any) -> str:
    """A detail string, or raise what ``run_many`` returned as the bench's outcome."""
    from .shards import Skip

    if isinstance(value, Skip):
        raise CheckSkipped(str(value))
    if isinstance(value, AssertionError) and not isinstance(value, CheckFailed):
        raise CheckFailed(str(value))
    if isinstance(value, BaseException):
        raise value
    return value


def check_shards(bench: Bench) -> str:
    """The component's ``tp_plan`` is right: under tensor parallelism (tp = 2) one training step equals the single
    process's.

    The tiny model holding the component is built by :func:`modkit.build` (the reference) and, in 2 gloo
    processes on the CPU, by :func:`modkit.parallel.build_parallel` (``make_mesh(tp=2)``, ``parallelize``,
    ``materialize`` with the same seed); both run forward, cross entropy (+ aux loss), backward and one AdamW
    step. ``max |Δ|`` of the logits, of every parameter's gradient, of the gradient w.r.t. the input embeddings
    and of the parameters after the step must be at most ``1e-5``, and parameters that are not sharded must be
    identical on both ranks. A plan that shards a projection the wrong way fails with the value (or the shape
    error it raises); a replicated weight declared on a sharded activation fails on its gradient. Head counts not divisible by 2
    are raised to multiples of 2 when the config accepts it, else the check is skipped with the reason. Slow
    (process start): opt-in, see the module docstring. Source: Megatron-LM's column/row split (arXiv:1909.08053);
    the plan is the component's own ``tp_plan`` capability (:mod:`modkit.parallel`).
    """
    from .shards import run_benches

    return _outcome(run_benches([bench])[0])


def _shards_many(benches: Sequence[Bench]) -> list:
    from .shards import run_benches

    return run_benches(benches)


#: Every check, in the order results are reported.
CHECKS: tuple[Check, ...] = (
    Check("spec_roundtrip", "load_spec(spec.to_json()) == spec; the config round-trips and has a JSON Schema", check_spec_roundtrip),
    Check("shape_dtype", "[batch, seq, d_model], dtype and device preserved for several shapes (seq = 1 too), float32 and bfloat16", check_shape_dtype),
    Check("gradients", "every parameter gets a finite non-zero gradient", check_gradients),
    Check("causality", "changing later tokens never changes earlier outputs", check_causality, _applies_causality),
    Check("kv_cache_decode", "cached token-by-token decode equals the full forward", check_kv_cache_decode, _applies_kv),
    Check("gqa_equals_mha", "n_kv_heads < n_heads equals n_heads key/value heads with repeated weights", check_gqa_equals_mha, _applies_gqa),
    Check("meta_init", "meta build + init_weights() is finite and equals a direct build with the same seed", check_meta_init),
    Check("param_count", "declared param_count equals the module's parameter count", check_param_count, _applies_param_count),
    Check("aux_loss_grad", "the aux loss alone sends a gradient to the router", check_aux_loss_grad, _applies_aux),
    Check("compile", "torch.compile(fullgraph=True) without graph breaks, equal to eager", check_compile, _applies_compile),
    Check("masked_row", "no NaN with fully masked rows (left padding); real tokens unaffected", check_masked_row, _applies_masked),
    Check("grouped_form", "the stacked copies (mixture-of-experts experts) keep rows in their group, are independent, init, train, compile", check_grouped_form, _applies_grouped),
    Check("flops", FLOPS_SUMMARY, check_flops, applies_flops),
    Check("shards", "tp_plan: tensor-parallel (tp = 2, gloo) logits, gradients and one AdamW step equal the single-process ones (opt-in: distributed)",
          check_shards, _applies_shards, distributed=True, run_many=_shards_many),
)

CHECK_NAMES: tuple[str, ...] = tuple(c.name for c in CHECKS)


def get_check(name: str) -> Check:
    """The check called ``name``.

    Raises:
        ValueError: unknown name (lists the valid ones).
    """
    for c in CHECKS:
        if c.name == name:
            return c
    raise ValueError(f"unknown check {name!r}; checks: {', '.join(CHECK_NAMES)}")


# ------------------------------------------------------------------------------------------------- running


def _error_detail(exc: BaseException) -> str:
    """``raised Type: message (at file:line in function)`` pointing at the innermost frame outside the kit."""
    msg = " ".join(str(exc).split())
    if len(msg) > 500:
        msg = msg[:500] + "…"
    where = ""
    frames = traceback.extract_tb(exc.__traceback__)
    kit = os.path.dirname(os.path.abspath(__file__))
    for fr in reversed(frames):
        if not os.path.abspath(fr.filename).startswith(kit) and "/torch/" not in fr.filename:
            where = f" (at {os.path.basename(fr.filename)}:{fr.lineno} in {fr.name})"
            break
    return f"raised {type(exc).__name__}: {msg}{where}"


class ComponentChecks:
    """Runs the checks of one component, sharing the bench (tiny spec, fillers) between them.

    Args:
        entry: the registry entry under test.
        registry: the registry it comes from (fillers are chosen there too).
        config: a config (dict or validated) to test instead of the entry's example.
        device: where to build and run (``"cpu"`` default).
        distributed: also run the checks that start processes (``shards``); otherwise they are skipped.
    """

    def __init__(
        self, entry: Component, registry: Registry, config: Union[dict, ComponentConfig, None] = None, device: str = "cpu",
        distributed: bool = False,
    ):
        self.entry = entry
        self.registry = registry
        self.device = device
        self.distributed = distributed
        self.name = f"{entry.kind}/{entry.type}"
        self._given = config
        self._setup: Optional[tuple[str, Union[Bench, str]]] = None

    def _bench(self) -> tuple[str, Union[Bench, str]]:
        """``("ok", bench)``, ``("skip", reason)``, ``("example", reason)`` (invalid example) or ``("fail", reason)``."""
        if self._setup is not None:
            return self._setup
        entry = self.entry
        if self._given is not None:
            config = load_component(entry.kind, self._given, registry=self.registry)  # SpecError: the caller's mistake
            if config.type != entry.type:
                raise SpecError([("type", f"the config is a {entry.kind} {config.type!r}, not {entry.type!r}")])
        else:
            try:
                config = load_component(entry.kind, entry.example_config(), registry=self.registry)
            except SpecError as exc:
                why = "; ".join(f"{p}: {m}" if p else m for p, m in exc.errors[:3])
                if entry.example is None:
                    self._setup = ("skip", f"no example config: {{'type': {entry.type!r}}} does not validate ({why}); add example= to the Component")
                else:
                    self._setup = ("example", f"the entry's example config {dict(entry.example)} does not validate: {why}")
                return self._setup
        try:
            self._setup = ("ok", Bench(entry, config, self.registry, self.device))
        except Unavailable as exc:
            self._setup = ("skip", str(exc))
        except Exception as exc:  # noqa: BLE001
            self._setup = ("fail", "setting up the tiny model " + _error_detail(exc))
        return self._setup

    def run(self, check: Union[str, Check]) -> CheckResult:
        """Run one check; never raises for a component fault (those become ``failed`` results).

        Runs with one intra-op CPU thread (restored afterwards): the tensors are tiny, and several threads only
        spin against each other (about 3x the CPU time on two cores, and worse under pytest-xdist).
        """
        threads = torch.get_num_threads()
        if threads != 1:
            torch.set_num_threads(1)
        try:
            return self._run(check)
        finally:
            if threads != 1:
                torch.set_num_threads(threads)

    def _settled(self, chk: Check) -> Optional[CheckResult]:
        """The result of ``chk`` when it is decided without running it (skips, a broken bench), else ``None``."""
        state, bench = self._bench()
        if state == "skip":
            return CheckResult(self.name, chk.name, "skipped", str(bench))
        if state == "example":
            if chk.name == "spec_roundtrip":
                return CheckResult(self.name, chk.name, "failed", str(bench))
            return CheckResult(self.name, chk.name, "skipped", "the example config does not validate (see spec_roundtrip)")
        reason = chk.applies(self.entry, bench.config) if state == "ok" else None
        if reason:
            return CheckResult(self.name, chk.name, "skipped", reason)
        if state == "fail":
            return CheckResult(self.name, chk.name, "failed", str(bench))
        if chk.distributed and not self.distributed:
            return CheckResult(self.name, chk.name, "skipped", "pass --distributed to run (starts 2 gloo processes; "
                               "distributed=True in Python, --modkit-distributed under pytest)")
        return None

    def _run(self, check: Union[str, Check]) -> CheckResult:
        chk = get_check(check) if isinstance(check, str) else check
        settled = self._settled(chk)
        if settled is not None:
            return settled
        return self._conclude(chk, lambda: chk.run(self._bench()[1]))

    def _conclude(self, chk: Check, produce: Callable[[], str]) -> CheckResult:
        try:
            detail = produce()
            return CheckResult(self.name, chk.name, "passed", detail)
        except CheckSkipped as exc:
            return CheckResult(self.name, chk.name, "skipped", str(exc))
        except CheckFailed as exc:
            return CheckResult(self.name, chk.name, "failed", str(exc))
        except Exception as exc:  # noqa: BLE001 - a crash inside the component is a failure of this check
            return CheckResult(self.name, chk.name, "failed", _error_detail(exc))

    def results(self, checks: Optional[Sequence[str]] = None) -> list[CheckResult]:
        """Run the named checks (default: all of :data:`CHECKS`, in order)."""
        return _results_of([self], checks)[0]


def run_many(runners: Sequence[ComponentChecks], check: Union[str, Check]) -> list[CheckResult]:
    """Run one check on several components; a check with ``run_many`` (``shards``) runs all of them in one batch.

    Returns one :class:`CheckResult` per runner, in order.
    """
    chk = get_check(check) if isinstance(check, str) else check
    if chk.run_many is None:
        return [r.run(chk) for r in runners]
    out: list[Optional[CheckResult]] = [r._settled(chk) for r in runners]
    todo = [i for i, res in enumerate(out) if res is None]
    if todo:
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            values = chk.run_many([runners[i]._bench()[1] for i in todo])
        except Exception as exc:  # noqa: BLE001 - the batch itself broke: every member fails with it
            values = [exc] * len(todo)
        finally:
            torch.set_num_threads(threads)
        for i, value in zip(todo, values):
            out[i] = runners[i]._conclude(chk, lambda v=value: _outcome(v))
    return out  # type: ignore[return-value]


def _results_of(runners: Sequence[ComponentChecks], checks: Optional[Sequence[str]]) -> list[list[CheckResult]]:
    """``[[result per check] per runner]``; batched checks run once over all runners."""
    chosen = [get_check(n) for n in checks] if checks else list(CHECKS)
    table: dict[str, list[CheckResult]] = {}
    for c in chosen:
        if c.run_many is not None:
            table[c.name] = run_many(runners, c)
    return [[table[c.name][i] if c.name in table else r.run(c) for c in chosen] for i, r in enumerate(runners)]


def check_component(
    kind: str,
    type: str,
    config: Union[dict, ComponentConfig, None] = None,
    *,
    registry: Optional[Registry] = None,
    checks: Optional[Sequence[str]] = None,
    device: str = "cpu",
    distributed: bool = False,
) -> list[CheckResult]:
    """Run the contract checks on one registered component.

    Args:
        kind, type: the component, e.g. ``("attention", "gqa")``.
        config: the config to test (dict or validated); default: the entry's ``example_config()``. An entry
            without ``example`` whose ``{"type": type}`` does not validate has every check skipped with
            "no example config".
        registry: defaults to :func:`modkit.get_registry` (every installed plugin).
        checks: names of the checks to run (default: all, see :data:`CHECK_NAMES`).
        device: where to build and run the tiny models.
        distributed: also run ``shards`` (2 gloo processes on the CPU, several seconds); without it ``shards``
            is skipped with "pass --distributed to run".

    Returns:
        One :class:`CheckResult` per check, in :data:`CHECKS` order (``skipped`` where a check does not apply).

    Raises:
        RegistryError: unknown kind or type.
        SpecError: ``config`` does not validate.
        ValueError: an unknown check name.
    """
    reg = registry or get_registry()
    entry = reg.get(kind, type)
    if checks:
        for n in checks:
            get_check(n)
    return ComponentChecks(entry, reg, config, device, distributed).results(checks)


def _as_list(value: Union[str, Sequence[str], None]) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    return [v for v in value if v]


def select_components(
    registry: Optional[Registry] = None,
    *,
    plugin: Union[str, Sequence[str], None] = None,
    kind: Union[str, Sequence[str], None] = None,
    type: Union[str, Sequence[str], None] = None,
) -> list[Component]:
    """Registry entries matching every given filter (each filter: one value or a list; ``fnmatch`` wildcards).

    ``plugin`` matches the providing plugin's name (the entry-point name) or its distribution name.

    Raises:
        RegistryError: a filter matches nothing (the message lists what is installed).
    """
    reg = registry or get_registry()
    plugins, kinds, types = _as_list(plugin), _as_list(kind), _as_list(type)

    def match(value: Optional[str], patterns: list[str]) -> bool:
        return value is not None and any(fnmatch.fnmatchcase(value, p) for p in patterns)

    out = []
    for c in reg.components():
        prov = c.provider
        if plugins and not (prov and (match(prov.plugin, plugins) or match(prov.distribution, plugins))):
            continue
        if kinds and not match(c.kind, kinds):
            continue
        if types and not match(c.type, types):
            continue
        out.append(c)
    if not out:
        broken = {n: why for n, why in reg.skipped_plugins().items() if plugins and match(n, plugins)}
        if broken:
            raise RegistryError("; ".join(f"plugin {n!r} failed to load, so it has no components to check: {why}" for n, why in broken.items()))
        names = ", ".join(p.name for p in reg.plugins()) or "(none)"
        want = " and ".join(f"{k} {' or '.join(map(repr, v))}" for k, v in (("plugin", plugins), ("kind", kinds), ("type", types)) if v)
        raise RegistryError(f"no registered component matches {want or 'the selection'}; kinds: {reg.kinds()}; plugins: {names}")
    return out


def run_checks(
    registry: Optional[Registry] = None,
    *,
    plugin: Union[str, Sequence[str], None] = None,
    kind: Union[str, Sequence[str], None] = None,
    type: Union[str, Sequence[str], None] = None,
    checks: Optional[Sequence[str]] = None,
    device: str = "cpu",
    distributed: bool = False,
) -> list[CheckResult]:
    """Run the contract suite over the selected registry entries (see :func:`select_components`).

    ``distributed=True`` also runs ``shards``, all selected components in one session of 2 gloo processes.

    Returns every :class:`CheckResult`, components in registry order, checks in :data:`CHECKS` order.
    """
    reg = registry or get_registry()
    if checks:
        for n in checks:
            get_check(n)
    runners = [ComponentChecks(entry, reg, None, device, distributed) for entry in select_components(reg, plugin=plugin, kind=kind, type=type)]
    return [r for per_component in _results_of(runners, checks) for r in per_component]

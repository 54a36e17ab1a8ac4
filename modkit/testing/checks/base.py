"""What every check shares: the result and check types, tolerances, and how to call a component by its contract.

A check is a function ``check(bench) -> detail`` (see :class:`Check`). It raises :class:`CheckFailed` with the
measured values when the component breaks the invariant, :class:`CheckSkipped` when it cannot run for this
component, and returns a one-line ``detail`` of what it measured when it passes. The bench
(:class:`~modkit.testing.harness.Bench`) holds the tiny model spec and builds it.

**Tolerances** are scaled to the dtype and to the values compared: ``ulps * eps(dtype) * max |reference|``
(:func:`tolerance`). Two computations of the same math that differ only in shape or order of summation (cached
decode against the full forward, one token against a batch) agree to a few float32 ulps; a fault (a leak, an
offset, a wrong mask) changes the logits of the tiny models by O(0.1-1) (their ``init_std`` is 0.2), so it fails by
orders of magnitude. Every detail reports the measured value next to its tolerance.
"""

from __future__ import annotations

import contextlib
import os
import traceback
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator, Literal, Optional

import torch
from torch import Tensor, nn

from modkit.core.config import ComponentConfig, is_mixer
from modkit.core.interfaces import AttentionInputs, split_aux
from modkit.core.registry import Component
from ..harness import CONTRACT_KINDS, Bench, Record

Status = Literal["passed", "failed", "skipped"]

#: Float32 ulps allowed between two computations of the same math in different shapes or summation orders.
SAME_MATH_ULPS = 256


@dataclass(frozen=True)
class CheckResult:
    """The outcome of one check on one component.

    Attributes:
        component: ``"kind/type"``.
        check: the check name, e.g. ``"causality"``.
        status: ``"passed"``, ``"failed"`` or ``"skipped"``.
        detail: what was measured (e.g. ``"max |Δ| = 0.31 at position 2 after changing token 5"``) or why the
            check was skipped.
        neighbours: the components the tiny models were filled with (``"attention gqa, ffn geglu, ..."``).
    """

    component: str
    check: str
    status: Status
    detail: str = ""
    neighbours: str = ""

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
    run_many: Optional[Callable[..., list]] = None


# ------------------------------------------------------------------------------------------------- numbers


def fmt(x: float) -> str:
    """A measured value in 3 significant digits."""
    return f"{x:.3g}"


def max_abs_diff(a: Tensor, b: Tensor) -> Tensor:
    """``|a - b|`` in float64 with NaN counted as +inf (a NaN must never compare as 'close')."""
    d = (a.double() - b.double()).abs()
    return torch.nan_to_num(d, nan=float("inf"))


def scale_of(ref: Tensor) -> float:
    """``max |ref|`` over its finite values (0 for an empty or all-non-finite tensor)."""
    if not ref.numel():
        return 0.0
    return float(torch.nan_to_num(ref.double().abs(), nan=0.0, posinf=0.0).max().item())


def tolerance(ref: Tensor, dtype: torch.dtype, ulps: float) -> float:
    """``ulps * eps(dtype) * max |ref|`` (with a floor of 1e-3 for the scale): the allowed ``max |Δ|`` against ``ref``."""
    return ulps * torch.finfo(dtype).eps * max(scale_of(ref), 1e-3)


def nonfinite(t: Tensor) -> int:
    """Number of NaN / inf values of a float tensor (0 for other dtypes)."""
    return int((~torch.isfinite(t.float())).sum().item()) if t.is_floating_point() else 0


def margin(worst: float, tol: float) -> str:
    """``"max |Δ| = W (tolerance T)"``."""
    return f"max |Δ| = {fmt(worst)} (tolerance {fmt(tol)})"


# ------------------------------------------------------------------------------------------------- records


def unique_modules(records: Iterable[Record]) -> list[nn.Module]:
    """The modules of ``records``, each once, in order."""
    seen, out = set(), []
    for r in records:
        if id(r.module) not in seen:
            seen.add(id(r.module))
            out.append(r.module)
    return out


def layer_of(records: list[Record], kind: str, layer: int) -> Optional[nn.Module]:
    """The module of ``kind`` built for ``layer`` at the model width (not a nested per-head one), or ``None``."""
    for r in records:
        if r.entry.kind == kind and getattr(r.ctx, "layer_index", None) == layer and r.ctx.dim is None:
            return r.module
    return None


def first_target(bench: Bench, records: list[Record]) -> Record:
    """The first module built by the component's factory, preferring one built for the residual stream."""
    targets = bench.targets(records)
    if not targets:
        raise CheckFailed(f"the tiny model holds no module built by {bench.name}'s factory")
    for r in targets:
        if r.ctx.dim is None:
            return r
    return targets[0]


def contract_record(bench: Bench, records: list[Record]) -> tuple[Optional[str], Optional[Record]]:
    """``(kind, record)`` of the module to call with its kind's contract (:mod:`modkit.core.interfaces`).

    The component itself for the kinds with a contract; for a nested kind (a router) the host that holds it
    (its ffn); ``(None, None)`` when neither has a contract (the checks then use the whole model).
    """
    if bench.entry.kind in CONTRACT_KINDS:
        return bench.entry.kind, first_target(bench, records)
    if bench.host is not None and bench.host[0].kind in CONTRACT_KINDS:
        hosts = [r for r in records if r.entry.key == bench.host[0].key]
        if hosts:
            return bench.host[0].kind, hosts[0]
    return None, None


def attention_inputs(
    bench: Bench, model: nn.Module, rec: Record, batch: int, seq: int, token_mask: Optional[Tensor] = None
) -> AttentionInputs:
    """:class:`~modkit.AttentionInputs` for a layer-level call: positions ``0..seq-1``, the layer's scheme and a
    stand-in for the embeddings (:func:`stand_in_embeddings`)."""
    return AttentionInputs(
        positions=bench.positions(batch, seq),
        token_mask=token_mask,
        position=bench.position_for(model, getattr(rec.ctx, "layer_index", None)),
        embeddings=stand_in_embeddings(bench, batch, seq),
    )


def stand_in_embeddings(bench: Bench, batch: int, seq: int) -> Tensor:
    """``[batch, seq, d_model]`` seeded values standing for ``AttentionInputs.embeddings`` in a direct call of a
    layer's component (``Model.forward`` hands every layer the real embeddings; a mixer that reads them beside the
    stream, ``side_input``, needs some)."""
    return bench.randn(batch, seq, bench.d_model(), seed=97)


def token_ids_of(x: Tensor) -> Tensor:
    """Token ids ``[batch, seq]`` int64 in ``[0, 16)`` for a direct ffn call on ``x [batch, seq, width]`` (an ffn that
    routes by token id, ``takes_token_ids``): each token's id is the signs of its first 4 features as bits, so the id
    moves with the token when a check reshapes or shuffles the tokens, and rounding to a low precision keeps it."""
    bits = (x[..., :4] > 0).long()
    return (bits * (2 ** torch.arange(bits.shape[-1], device=x.device))).sum(-1)


def ffn_kwargs(module: nn.Module, x: Tensor) -> dict:
    """The keyword arguments a direct ffn call gives ``module``: ``token_ids`` (:func:`token_ids_of`) when it sets
    ``takes_token_ids``, else none (the tiny models' vocabulary, 64, holds every such id)."""
    return {"token_ids": token_ids_of(x)} if getattr(module, "takes_token_ids", False) else {}


def call_contract(kind: str, module: nn.Module, x: Tensor, inputs: Optional[AttentionInputs] = None) -> Tensor:
    """Call ``module`` by the contract of ``kind`` on ``x [batch, seq, width]``; returns the output tensor.

    norm / ffn: ``module(x)`` (an ffn's aux loss is dropped; an ffn that routes by token id also gets
    ``token_ids``, :func:`ffn_kwargs`); a token mixer (attention or mixer): ``module(x, inputs)``; placement:
    ``module(x, inputs)[0]``.
    """
    if is_mixer(kind):
        return module(x, inputs)
    if kind == "placement":
        return module(x, inputs)[0]
    return split_aux(module(x, **ffn_kwargs(module, x)))[0]


def position_geometry(bench: Bench, records: list[Record], rec: Record) -> tuple[int, int, int]:
    """``(n_heads, n_kv_heads, head_dim)`` a position scheme serves: its build context (the
    :class:`~modkit.PositionGeometry` the layer's token mixer declares, which ``build`` passed it), key heads from
    that declaration: the first mixer of any kind that declares one."""
    from ...spec import position_geometry as declared

    geo = next(
        (g for r in records if is_mixer(r.entry.kind) and (g := declared(r.config, r.ctx, r.module)) is not None),
        None,
    )
    n_heads = rec.ctx.n_heads or (geo.n_heads if geo else None) or 1
    head_dim = rec.ctx.head_dim or (geo.head_dim if geo else None) or 8
    n_kv = (geo.key_heads if geo and geo.n_heads else None) or n_heads
    return int(n_heads), int(n_kv), int(head_dim)


def transplant(src: nn.Module, dst: nn.Module) -> list[str]:
    """Copy every parameter and persistent buffer of ``src`` that ``dst`` holds under the same name and shape.

    Returns the names copied. Used to compare two tiny models that differ in one slot with all else equal.
    """
    theirs = dst.state_dict()
    common = {k: v for k, v in src.state_dict().items() if k in theirs and theirs[k].shape == v.shape}
    dst.load_state_dict(common, strict=False)
    return sorted(common)


@contextlib.contextmanager
def fork_rng(seed: int) -> Iterator[None]:
    """A context in which the CPU (and CUDA) random state is seeded with ``seed``, restored afterwards."""
    devices = list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        yield


def error_detail(exc: BaseException) -> str:
    """``raised Type: message (at file:line in function)`` pointing at the innermost frame outside the kit."""
    msg = " ".join(str(exc).split())
    if len(msg) > 500:
        msg = msg[:500] + "…"
    where = ""
    frames = traceback.extract_tb(exc.__traceback__)
    kit = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # modkit/testing
    for fr in reversed(frames):
        if not os.path.abspath(fr.filename).startswith(kit) and "/torch/" not in fr.filename:
            where = f" (at {os.path.basename(fr.filename)}:{fr.lineno} in {fr.name})"
            break
    return f"raised {type(exc).__name__}: {msg}{where}"

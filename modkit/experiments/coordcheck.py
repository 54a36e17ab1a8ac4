"""The coordinate check: how large a model's activations are, and how much a few training steps change them, as the
width grows, under standard parametrization and under μP.

Yang et al. 2022 (Tensor Programs V, arXiv:2203.03466, §D.1 and figure 5; the ``mup`` package's
``get_coord_data``): train the same design at several widths for a few steps with the same learning rate and record
the mean absolute coordinate of each activation. Under μP (:mod:`modkit.core.parametrization`) every curve is flat in the
width; under standard parametrization with Adam the change of the hidden activations and the logits grows about
linearly with it, which is why a learning rate tuned small does not transfer. u-μP (Blake et al. 2024,
arXiv:2407.17465) uses the same check.

Recorded per width, step ``t = 0..steps`` and quantity, on one fixed batch in eval mode, averaged over seeds:

* ``size``: ``mean |h_t|``; ``change``: ``mean |h_t - h_0|`` (the coordinate size of what training did);
* quantities: ``embedding`` (the token-embedding output), ``mixer`` and ``ffn`` (the output of what each layer's
  token-mixing slot and ffn slot built, mean over layers: an attention, a recurrent mixer or several side by side,
  whatever its kind; nested components are not counted twice), ``residual`` (the last block's output) and
  ``logits``.

Training: ``steps`` optimizer steps of the named optimizer (AdamW by default; its parameter groups, μP factors
included, from :func:`modkit.train.optim.build_optimizer`) at a constant learning rate, no weight decay, no
clipping. The batches are windows of real text by default: the shipped tiny shakespeare corpus
(:func:`modkit.data.default_dataset`, 65 characters) or a prepared data folder (``data``), with the model's
``vocab_size`` set to the data's as ``modkit train`` does; a different seeded batch of the training split each step,
and the measurement batch a seeded batch of the validation split, the same at every width. With ``random_tokens``
every batch is uniform random token ids over the spec's own vocabulary instead (the ``mup`` package's default).

The data matters. On uniform random ids the measurement batch shares almost no tokens or contexts with the training
batches, so what a step changes on it comes from chance overlaps between inputs, which shrink like 1/sqrt(width):
under μP the hidden changes then fall with width (tiny-llama, d_model 64 to 512: mixer 0.54x, ffn 0.30x, residual
0.52x) and the check reads μP as *not* flat although the parametrization follows TP V's table. On text, where
training and measurement share tokens and contexts, the same μP models are flat (4-layer tiny llama, latent-attention
and mixture-of-experts specs, d_model 32 to 512, 5 steps: every activation 0.62-1.38x) while standard
parametrization's hidden changes grow 100-4,000x. The ffn output reads lowest (down to about 0.5x at a batch of 8 x
32 tokens from width 64), a finite-width effect: from 64 to 1024 it moves 0.61, 0.45, 0.37, 0.30, 0.44, not
steadily down.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence, Union

import numpy as np
import torch
import torch.nn.functional as F

from modkit.core.errors import ModkitError

#: the :attr:`CoordCheck.data` of a check on uniform random token ids
RANDOM_TOKENS = "random tokens"
#: what is measured; ``mixer`` was called ``attention`` before recurrent mixers (it is the token-mixing slot's output)
QUANTITIES = ("embedding", "mixer", "ffn", "residual", "logits")


class CoordCheckError(ModkitError, ValueError):
    """A coordinate check that cannot run as asked (fewer than two widths, a bad step count)."""


@dataclass
class CoordCheck:
    """What :func:`coord_check` measured.

    Attributes:
        name: the spec's name. widths: ``d_model`` of each size. steps: optimizer steps. lr: the learning rate.
        base_d_model: μP's base width. optimizer: the optimizer config. seeds: runs averaged per width.
        size, change: ``{parametrization: {quantity: [len(widths), steps + 1] array}}`` (``"sp"`` and ``"mup"``).
        data: what the batches were: the data folder's path, or ``"random tokens"``.
        vocab_size: the vocabulary the models had.
    """

    name: str
    widths: list[int]
    steps: int
    lr: float
    base_d_model: int
    optimizer: dict
    seeds: int
    size: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)
    data: str = RANDOM_TOKENS
    vocab_size: int = 0
    change: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)

    def growth(self, parametrization: str, quantity: str, step: int = -1) -> float:
        """``change`` at the largest width over ``change`` at the smallest, after ``step`` steps (default: the last)."""
        c = self.change[parametrization][quantity][:, step]
        return float(c[-1] / c[0]) if c[0] > 0 else float("inf")

    def to_json(self) -> dict:
        """A JSON-able dict (arrays as nested lists)."""
        return {
            "name": self.name,
            "widths": self.widths,
            "steps": self.steps,
            "lr": self.lr,
            "base_d_model": self.base_d_model,
            "optimizer": self.optimizer,
            "seeds": self.seeds,
            "data": self.data,
            "vocab_size": self.vocab_size,
            "size": {p: {q: a.tolist() for q, a in d.items()} for p, d in self.size.items()},
            "change": {p: {q: a.tolist() for q, a in d.items()} for p, d in self.change.items()},
            "growth": {p: {q: self.growth(p, q) for q in d} for p, d in self.change.items()},
        }


def _slot_modules(model) -> list[tuple[torch.nn.Module, str]]:
    """``(module, "mixer" | "ffn")`` for what each layer's token-mixing slot and ffn slot built: the children of
    every block whose registry kind is a token mixer's (:func:`modkit.core.config.is_mixer`: attention, recurrent
    mixer) or an ffn. Components nested inside them (a hybrid's attention, a mixture's shared expert) are theirs."""
    from modkit.core.config import is_mixer

    out = []
    for block in model.layers:
        for child in block.children():
            kind = getattr(child, "modkit_kind", None)
            if is_mixer(kind) or kind == "ffn":
                out.append((child, "mixer" if is_mixer(kind) else "ffn"))
    return out


def _measure(model, ids: torch.Tensor) -> dict[str, torch.Tensor]:
    """The quantities' activations on ``ids`` (eval mode, no grad)."""
    acts: dict[str, list[torch.Tensor]] = {q: [] for q in QUANTITIES}
    hooks = []

    def keep(q):
        def hook(module, inputs, output):
            acts[q].append((output[0] if isinstance(output, tuple) else output).detach().float())

        return hook

    hooks.append(model.embed.register_forward_hook(keep("embedding")))
    for m, q in _slot_modules(model):
        hooks.append(m.register_forward_hook(keep(q)))
    hooks.append(model.layers[-1].register_forward_hook(keep("residual")))
    model.eval()
    try:
        with torch.no_grad():
            logits = model(ids).logits.float()
    finally:
        for h in hooks:
            h.remove()
        model.train()
    out = {q: torch.stack(v) for q, v in acts.items() if v}  # [layers, batch, seq, width]
    out["logits"] = logits[None]
    return out


@dataclass(frozen=True)
class CoordCheckRequest:
    """One coordinate check: the arguments of :func:`coord_check` (documented there) as one value.

    Attributes:
        spec: a spec file or dict. widths: two or more increasing ``d_model`` values. base_d_model: μP's base width
            (``None``: the smallest width). steps: optimizer steps. lr: constant learning rate. optimizer: an
            optimizer config (``None``: AdamW). seeds: runs averaged per width. batch, seq_len: rows and tokens of
            each batch. parametrizations: which of ``"sp"`` and ``"mup"`` to run. data: a prepared data folder
            (``modkit data prepare``; ``None``: the shipped tiny shakespeare). random_tokens: uniform random token ids
            instead of text (``data`` must then be ``None``).
    """

    spec: Union[str, Path, dict]
    widths: Sequence[int]
    base_d_model: Optional[int] = None
    steps: int = 5
    lr: float = 1e-2
    optimizer: Optional[dict] = None
    seeds: int = 2
    batch: int = 8
    seq_len: int = 32
    parametrizations: Sequence[str] = ("sp", "mup")
    data: Union[str, Path, None] = None
    random_tokens: bool = False


def coord_check(spec: Union[str, Path, dict], widths: Sequence[int], **options: Any) -> CoordCheck:
    """Run the coordinate check of ``spec`` at ``widths`` (see the module docstring).

    The keyword arguments are the fields of :class:`CoordCheckRequest` (:func:`run_coord_check` takes one whole).

    Args:
        spec: a spec file or dict (its own ``parametrization`` is replaced: ``sp``, then μP at ``base_d_model``).
        widths: two or more ``d_model`` values (:func:`modkit.experiments.scaling.resize_checked` makes each size).
        base_d_model: μP's base width; default the smallest width.
        steps: optimizer steps after the initial measurement. lr: constant learning rate.
        optimizer: an optimizer config (default ``{"type": "adamw"}``). seeds: runs averaged per width.
        batch, seq_len: the size of each training and measurement batch.
        parametrizations: which of ``"sp"`` and ``"mup"`` to run.
        data: a prepared data folder (default: the shipped tiny shakespeare, prepared once into the cache).
        random_tokens: train and measure on uniform random token ids instead of text.

    Returns:
        :class:`CoordCheck`.

    Raises:
        CoordCheckError: fewer than two widths, ``steps < 1``, ``seeds < 1``, an unknown parametrization, both
            ``data`` and ``random_tokens``.
        DataError: ``data`` is not a prepared data folder, or its splits are shorter than one window.
        ScalingError: a width the spec cannot take (a head count that does not divide it), naming the field and
            the nearest widths that fit.
        TypeError: a keyword that is not a field of :class:`CoordCheckRequest`.
    """
    return run_coord_check(CoordCheckRequest(spec, widths, **options))


def run_coord_check(request: CoordCheckRequest) -> CoordCheck:
    """Run one :class:`CoordCheckRequest`: every parametrization asked for, at every width.

    Returns:
        :class:`CoordCheck`.

    Raises:
        CoordCheckError, ScalingError: as :func:`coord_check`.
    """
    from modkit.core.jsonio import read_json_file
    from modkit.experiments.scaling import resize_checked, with_parametrization
    from modkit.spec import load_spec
    from modkit.train.config import TrainConfig

    r = request
    widths = _checked_widths(r)
    data = read_json_file(Path(r.spec)) if not isinstance(r.spec, dict) else dict(r.spec)
    data = load_spec(data).to_dict()
    base = r.base_d_model or widths[0]
    opt = dict(r.optimizer or {"type": "adamw"})
    cfg = TrainConfig(optimizer=opt, lr=r.lr, weight_decay=0.0, grad_clip=None)
    seq_len = min(r.seq_len, data["max_seq_len"])
    batches = _Batches.of(r, seq_len, data["vocab_size"])
    data["vocab_size"] = batches.vocab_size
    result = CoordCheck(data.get("name") or "model", widths, r.steps, r.lr, base, cfg.optimizer, r.seeds)
    result.data, result.vocab_size = batches.source, batches.vocab_size
    for par in r.parametrizations:
        p = {"type": "mup", "base_d_model": base} if par == "mup" else None
        size = {q: np.zeros((len(widths), r.steps + 1)) for q in QUANTITIES}
        change = {q: np.zeros((len(widths), r.steps + 1)) for q in QUANTITIES}
        for wi, width in enumerate(widths):
            spec_obj = load_spec(with_parametrization(resize_checked(data, d_model=width), p))
            row_size, row_change = _width_curves(spec_obj, cfg, r, batches)
            for q in QUANTITIES:
                size[q][wi], change[q][wi] = row_size[q], row_change[q]
        result.size[par] = {q: a for q, a in size.items() if a.any()}
        result.change[par] = {q: a for q, a in change.items() if q in result.size[par]}
    return result


def _checked_widths(r: CoordCheckRequest) -> list[int]:
    """The widths as integers, the request checked.

    Raises:
        CoordCheckError: fewer than two increasing widths, ``steps`` or ``seeds`` below 1, an unknown
            parametrization.
    """
    widths = [int(w) for w in r.widths]
    if len(widths) < 2 or sorted(set(widths)) != widths:
        raise CoordCheckError(f"widths = {widths}: give two or more increasing widths")
    if r.steps < 1 or r.seeds < 1:
        raise CoordCheckError(f"steps = {r.steps}, seeds = {r.seeds}: give 1 or more of each")
    bad = [p for p in r.parametrizations if p not in ("sp", "mup")]
    if bad:
        raise CoordCheckError(f"parametrizations {bad}: use 'sp' and/or 'mup'")
    if r.random_tokens and r.data is not None:
        raise CoordCheckError(
            f"data = {str(r.data)!r} and random_tokens: give one (text from a data folder, or uniform random ids)"
        )
    return widths


@dataclass
class _Batches:
    """Where a check's batches come from: windows of a prepared data folder (``train`` and ``val`` splits), or
    uniform random ids over ``vocab_size`` (``tokens`` ``None``). ``source`` names it for the report."""

    source: str
    vocab_size: int
    seq_len: int
    batch: int
    train: Optional[np.ndarray] = None
    val: Optional[np.ndarray] = None

    @classmethod
    def of(cls, r: CoordCheckRequest, seq_len: int, spec_vocab: int) -> "_Batches":
        """The batches a request asks for (``spec_vocab``: the spec's own vocabulary, kept for random ids).

        Raises:
            DataError: ``r.data`` is not a prepared data folder (:meth:`modkit.data.TokenData.open`).
        """
        if r.random_tokens:
            return cls(RANDOM_TOKENS, spec_vocab, seq_len, r.batch)
        from modkit.data import TokenData, default_dataset

        folder = Path(r.data) if r.data is not None else default_dataset()
        tokens = TokenData.open(folder, verify=False)
        return cls(str(folder), tokens.vocab_size, seq_len, r.batch, tokens.train, tokens.val)

    def probe(self) -> torch.Tensor:
        """The measurement batch ``[batch, seq_len + 1]``: seeded, the same at every width (validation text)."""
        return self._draw(self.val, 10_000, 0)

    def training(self, seed: int):
        """A function of the step ``t`` (from 1) giving that step's batch ``[batch, seq_len + 1]`` for ``seed``."""
        gen = torch.Generator().manual_seed(seed)
        if self.train is None:
            return lambda t: torch.randint(0, self.vocab_size, (self.batch, self.seq_len + 1), generator=gen)
        return lambda t: self._draw(self.train, seed, t)

    def _draw(self, tokens: Optional[np.ndarray], seed: int, step: int) -> torch.Tensor:
        if tokens is None:
            gen = torch.Generator().manual_seed(seed)
            return torch.randint(0, self.vocab_size, (self.batch, self.seq_len + 1), generator=gen)
        from modkit.data import RandomWindows

        sampler = RandomWindows(tokens, self.batch, self.seq_len, seed=seed)
        sampler.step = step
        x, y = sampler.next()
        return torch.cat([x, y[:, -1:]], dim=1)


def _width_curves(spec_obj, cfg, r: CoordCheckRequest, batches: _Batches) -> tuple[dict, dict]:
    """``size`` and ``change`` of each quantity at one width: ``{quantity: [steps + 1] array}``, averaged over the
    seeds (quantities the model does not have stay 0). The measurement batch is seeded alike at every width."""
    from modkit.nn.build import build
    from modkit.train.optim import build_optimizer

    v = spec_obj.vocab_size
    probe = batches.probe()
    size = {q: np.zeros(r.steps + 1) for q in QUANTITIES}
    change = {q: np.zeros(r.steps + 1) for q in QUANTITIES}
    for seed in range(r.seeds):
        torch.manual_seed(seed)
        model = build(spec_obj, seed=seed)
        optim = build_optimizer(model, spec_obj, cfg)
        for g in optim.param_groups:
            g["lr"] = r.lr * g["lr_mult"]
        next_batch = batches.training(seed)
        first = _measure(model, probe[:, :-1])
        for q in first:
            size[q][0] += float(first[q].abs().mean()) / r.seeds
        for t in range(1, r.steps + 1):
            _train_step(model, optim, next_batch(t), v)
            now = _measure(model, probe[:, :-1])
            for q in now:
                size[q][t] += float(now[q].abs().mean()) / r.seeds
                change[q][t] += float((now[q] - first[q]).abs().mean()) / r.seeds
    return size, change


def _train_step(model, optim, ids: torch.Tensor, vocab_size: int) -> None:
    """One optimizer step on the next-token loss of ``ids`` ``[batch, seq + 1]`` (plus the model's auxiliary loss)."""
    out = model(ids[:, :-1])
    loss = F.cross_entropy(out.logits.float().reshape(-1, vocab_size), ids[:, 1:].reshape(-1))
    if out.aux_loss is not None:
        loss = loss + out.aux_loss.float()
    loss.backward()
    optim.step()
    optim.zero_grad(set_to_none=True)


def plot(result: CoordCheck, out: Union[str, Path]) -> Path:
    """``change`` against width (log-log), one panel per (parametrization, quantity), one line per step; the panels
    of one quantity share their y scale, so standard parametrization's growth and μP's flat line read on one axis."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pars = list(result.change)
    quantities = [q for q in QUANTITIES if q in result.change[pars[0]]]
    fig, axes = plt.subplots(
        len(pars),
        len(quantities),
        figsize=(3.0 * len(quantities), 2.6 * len(pars)),
        dpi=110,
        squeeze=False,
        sharex=True,
        sharey="col",
    )
    cmap = plt.get_cmap("viridis")
    names = {"sp": "standard", "mup": f"muP (base d_model {result.base_d_model})"}
    for i, par in enumerate(pars):
        for j, q in enumerate(quantities):
            ax = axes[i][j]
            for t in range(1, result.steps + 1):
                ax.plot(
                    result.widths,
                    result.change[par][q][:, t],
                    "o-",
                    ms=3,
                    lw=1,
                    color=cmap((t - 1) / max(1, result.steps - 1)),
                    label=f"step {t}",
                )
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.grid(alpha=0.3)
            if i == 0:
                ax.set_title(q)
            if j == 0:
                ax.set_ylabel(f"{names[par]}\nmean |h_t - h_0|")
            if i == len(pars) - 1:
                ax.set_xlabel("d_model")
    axes[0][-1].legend(fontsize=7)
    fig.suptitle(
        f"coordinate check of {result.name} on {_data_words(result)}: lr {result.lr:g}, {result.optimizer['type']}, "
        f"{result.seeds} seed(s)"
    )
    fig.tight_layout()
    path = Path(out)
    fig.savefig(path)
    plt.close(fig)
    return path


def _data_words(result: CoordCheck) -> str:
    """What the batches were, in words: ``"random token ids"`` or ``"text (<folder name>)"``."""
    if result.data == RANDOM_TOKENS:
        return "uniform random token ids"
    return f"text ({Path(result.data).name}, vocabulary {result.vocab_size})"


def write_report(result: CoordCheck, out_dir: Union[str, Path], command: Optional[str] = None) -> Path:
    """``report.md`` (the growth table), ``coordcheck.json`` and ``coordcheck.png`` in ``out_dir``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    plot(result, out / "coordcheck.png")
    (out / "coordcheck.json").write_text(json.dumps(result.to_json(), indent=1) + "\n")
    quantities = [q for q in QUANTITIES if q in next(iter(result.change.values()))]
    lines = ["# Coordinate check", ""]
    if command:
        lines += ["Generated by:", "", "```bash", command, "```", ""]
    lines += [
        f"{result.name} at d_model {', '.join(map(str, result.widths))}; {result.steps} steps of {result.optimizer['type']} "
        f"at a constant lr {result.lr:g} (no weight decay, no clipping) on {_data_words(result)}, mean over "
        f"{result.seeds} seed(s). Each cell is "
        f"the growth of mean |h_t - h_0| after step {result.steps} from d_model {result.widths[0]} to "
        f"{result.widths[-1]} (1: flat in width; {result.widths[-1] / result.widths[0]:g}: linear in width).",
        "",
        "| parametrization | " + " | ".join(quantities) + " |",
        "|---|" + "---:|" * len(quantities),
    ]
    for par in result.change:
        lines.append(f"| {par} | " + " | ".join(f"{result.growth(par, q):.2f}" for q in quantities) + " |")
    if result.data == RANDOM_TOKENS:
        lines += [
            "",
            "On uniform random token ids the measurement batch's tokens and contexts are almost never the training "
            "batches', so what a step changes there comes from chance overlaps between inputs, which shrink like "
            "1/sqrt(width): μP's hidden changes then fall with width although the parametrization is right. The "
            "default check, on text, does not have this problem.",
        ]
    lines += ["", "![coordinate check](coordcheck.png)", ""]
    (out / "report.md").write_text("\n".join(lines))
    return out / "report.md"

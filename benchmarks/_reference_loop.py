"""The plain-PyTorch reference of ``bench_train_vs_loop.py``: nanoGPT's model and training loop, written out.

The model is nanoGPT's ``GPT`` (Karpathy, karpathy/nanoGPT ``model.py``) at the CPU recipe's sizes: token and learned
position embeddings, pre-norm blocks of LayerNorm (with bias), causal self-attention with one fused q/k/v
projection and ``F.scaled_dot_product_attention(is_causal=True)``, a 4x GELU MLP, a final LayerNorm and a head tied
to the token embedding; the loss is ``F.cross_entropy`` over every position, computed inside ``forward`` as
nanoGPT does. It is run eagerly.

The loop is nanoGPT's ``train.py`` on the CPU (``device=cpu``, ``compile=False``, float32, no grad scaler, one
micro-batch per step): each iteration sets the warmup + cosine learning rate, evaluates at ``eval_interval``
(``eval_iters`` batches of each split under ``torch.no_grad`` in eval mode, a ``torch.save`` checkpoint of model and
optimizer when the validation loss improved), runs forward and backward, clips the gradient norm at
``grad_clip``, steps ``torch.optim.AdamW`` (its CPU defaults: no ``fused``, no ``foreach`` argument; decay on
tensors of two or more dimensions, nanoGPT's ``configure_optimizers``), zeroes the gradients with
``set_to_none=True`` and reads ``loss.item()`` every ``log_interval`` steps. Batches are read as ``get_batch``
does: a fresh ``np.memmap`` of ``train.bin`` per batch, ``torch.stack`` of the windows. Only the window starts
come from elsewhere: modkit's :class:`modkit.data.RandomWindows` stream, so that both runs see the same data.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention with one fused q/k/v projection; ``[B, T, C] -> [B, T, C]``."""

    def __init__(self, d: int, heads: int):
        super().__init__()
        self.c_attn = nn.Linear(d, 3 * d)
        self.c_proj = nn.Linear(d, d)
        self.resid_dropout = nn.Dropout(0.0)
        self.heads = heads

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.size()
        q, k, v = self.c_attn(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=0.0, is_causal=True)
        return self.resid_dropout(self.c_proj(y.transpose(1, 2).contiguous().view(b, t, c)))


class MLP(nn.Module):
    """``Linear(d, 4d) -> GELU -> Linear(4d, d)``; ``[B, T, d] -> [B, T, d]``."""

    def __init__(self, d: int):
        super().__init__()
        self.c_fc, self.gelu, self.c_proj = nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d)
        self.dropout = nn.Dropout(0.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    """Pre-norm transformer block: ``x + attn(ln_1(x))`` then ``x + mlp(ln_2(x))``."""

    def __init__(self, d: int, heads: int):
        super().__init__()
        self.ln_1, self.attn = nn.LayerNorm(d), CausalSelfAttention(d, heads)
        self.ln_2, self.mlp = nn.LayerNorm(d), MLP(d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """nanoGPT's GPT; ``forward(idx [B, T], targets [B, T]) -> (logits [B, T, V], mean cross-entropy [] nats)``."""

    def __init__(self, vocab: int, context: int, layers: int, heads: int, d: int):
        super().__init__()
        self.wte, self.wpe, self.drop = nn.Embedding(vocab, d), nn.Embedding(context, d), nn.Dropout(0.0)
        self.h = nn.ModuleList([Block(d, heads) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)
        self.lm_head.weight = self.wte.weight  # tied, as nanoGPT

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        pos = torch.arange(0, idx.size(1), dtype=torch.long, device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)
        return logits, loss


@torch.no_grad()
def copy_from_modkit(ref: GPT, model: nn.Module) -> None:
    """Give ``ref`` the weights of a modkit GPT-2-style model (q, k, v rows stacked into ``c_attn``), so that both
    runs start from the same initial weights."""
    p = dict(model.named_parameters())
    ref.wte.weight.copy_(p["embed.weight"])
    ref.wpe.weight.copy_(p["positions.0.weight"])
    for i, blk in enumerate(ref.h):
        q = f"layers.{i}."
        for mine, theirs in (("attn_norm", blk.ln_1), ("ffn_norm", blk.ln_2)):
            theirs.weight.copy_(p[q + mine + ".weight"])
            theirs.bias.copy_(p[q + mine + ".bias"])
        for suffix in ("weight", "bias"):
            qkv = [p[f"{q}attention.{n}_proj.{suffix}"] for n in "qkv"]
            getattr(blk.attn.c_attn, suffix).copy_(torch.cat(qkv, dim=0))
            getattr(blk.attn.c_proj, suffix).copy_(p[f"{q}attention.o_proj.{suffix}"])
            getattr(blk.mlp.c_fc, suffix).copy_(p[f"{q}ffn.up.{suffix}"])
            getattr(blk.mlp.c_proj, suffix).copy_(p[f"{q}ffn.down.{suffix}"])
    ref.ln_f.weight.copy_(p["final_norm.weight"])
    ref.ln_f.bias.copy_(p["final_norm.bias"])


def configure_optimizers(model: nn.Module, weight_decay: float, lr: float, betas: tuple[float, float]):
    """nanoGPT's optimizer on the CPU: AdamW with decay on tensors of >= 2 dimensions, torch's default kernels."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=lr, betas=betas)  # fused only on CUDA in nanoGPT


def get_lr(it: int, lr: float, min_lr: float, warmup: int, decay_iters: int) -> float:
    """nanoGPT's learning rate: linear warmup ``lr (it + 1) / (warmup + 1)``, then cosine down to ``min_lr``."""
    if it < warmup:
        return lr * (it + 1) / (warmup + 1)
    if it > decay_iters:
        return min_lr
    coeff = 0.5 * (1.0 + math.cos(math.pi * (it - warmup) / (decay_iters - warmup)))
    return min_lr + coeff * (lr - min_lr)


def window_starts(n_tokens: int, batch: int, context: int, seed: int, step: int) -> np.ndarray:
    """The window starts of training batch ``step``: those of :class:`modkit.data.RandomWindows` (same stream)."""
    from modkit.data.dataset import _RANDOM, _rng

    return _rng(_RANDOM, seed, step).integers(0, n_tokens - context, size=batch)


def get_batch(path: Path, starts: np.ndarray, context: int) -> tuple[torch.Tensor, torch.Tensor]:
    """nanoGPT's ``get_batch``: a fresh memmap, then ``torch.stack`` of the ``x`` and ``y`` windows (int64)."""
    data = np.memmap(path, dtype=np.uint16, mode="r")
    x = torch.stack([torch.from_numpy(data[i : i + context].astype(np.int64)) for i in starts])
    y = torch.stack([torch.from_numpy(data[i + 1 : i + 1 + context].astype(np.int64)) for i in starts])
    return x, y


@torch.no_grad()
def estimate_loss(model: GPT, evals: dict[str, list]) -> dict[str, float]:
    """Mean loss over each split's fixed evaluation batches, in eval mode (nanoGPT's ``estimate_loss``)."""
    out = {}
    model.eval()
    for split, batches in evals.items():
        losses = torch.zeros(len(batches))
        for k, (x, y) in enumerate(batches):
            _, loss = model(x, y)
            losses[k] = loss.item()
        out[split] = losses.mean().item()
    model.train()
    return out


# size: one flat recipe, as nanoGPT's train.py is one script
def run(model: GPT, cfg, data_dir: Path, evals: dict[str, list], ckpt: Path) -> dict:
    """Train ``model`` for ``cfg.max_steps`` steps as nanoGPT's loop does (``cfg``: a modkit ``TrainConfig`` whose
    fields hold the recipe). Returns ``{"train_loss", "val_loss", "log": [(step, loss)]}``."""
    steps = cfg.max_steps
    optimizer = configure_optimizers(model, cfg.weight_decay, cfg.lr, (cfg.beta1, cfg.beta2))
    train_bin = data_dir / "train.bin"
    n_tokens = len(np.memmap(train_bin, dtype=np.uint16, mode="r"))
    ctx, batch = cfg.seq_len, cfg.batch_size

    def next_batch(step: int):
        return get_batch(train_bin, window_starts(n_tokens, batch, ctx, cfg.seed, step), ctx)

    best_val, losses, log = 1e9, {}, []
    x, y = next_batch(0)
    t0 = time.time()
    for it in range(steps + 1):
        lr = get_lr(it, cfg.lr, cfg.min_lr, cfg.warmup_steps, steps)
        for group in optimizer.param_groups:
            group["lr"] = lr
        if it % cfg.eval_interval == 0 or it == steps:
            losses = estimate_loss(model, evals)
            if losses["val"] < best_val:
                best_val = losses["val"]
                if it > 0:
                    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "iter_num": it}
                    torch.save(state, ckpt)
        if it == steps:
            break
        _, loss = model(x, y)
        x, y = next_batch(it + 1)  # nanoGPT fetches the next batch while the step is "in flight"
        loss.backward()
        if cfg.grad_clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if (it + 1) % cfg.log_interval == 0:
            t1 = time.time()
            log.append((it + 1, loss.item(), t1 - t0))
            t0 = t1
    return {"train_loss": losses["train"], "val_loss": losses["val"], "log": log}

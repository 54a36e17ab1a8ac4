#!/usr/bin/env python
"""The built-in attention's decode step through the declared-state cache against the k/v-only cache it replaced.

Same model, same run, interleaved: bench_cpu's reference llama-like model (d_model 512, 8 layers, 8 heads / 2 KV
heads, d_ff 1408, vocab 32000, float32, batch 1) decodes ``--steps`` tokens after a 32-token prompt with
:func:`modkit.inference.generate.decode_logits`, once through the current cache (``update_cache(..., mixer=self)`` ->
``LayerKVCache.state`` -> ``MixerCache.update``, the mask shared through the mixer's slot group) and once with those
three calls replaced by the code they replaced (``LayerKVCache.update`` writing ``k`` / ``v`` directly, the
slot-group scratch read off ``inputs.cache``). Both produce the same logits (checked). Prints the median seconds
per decode step of each and their ratio (new / old; 1.0 = no cost). A script, not a test: the machine's load moves
absolute figures, the ratio is measured in one process.

    .venv/bin/python benchmarks/bench_cache_update.py --threads 1 --steps 64 --repeats 7
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import modkit  # noqa: E402
import modkit.nn.attention as attention_helpers  # noqa: E402
import modkit_plugins.attention as builtin  # noqa: E402
from modkit.nn.cache import MixerCache  # noqa: E402
from modkit.inference.generate import decode_logits  # noqa: E402

SPEC = {
    "schema_version": 1,
    "vocab_size": 32000,
    "d_model": 512,
    "n_layers": 8,
    "max_seq_len": 512,
    "position": {"type": "rope"},
    "block": {
        "attention": {"type": "gqa", "n_heads": 8, "n_kv_heads": 2},
        "ffn": {"type": "swiglu", "d_ff": 1408},
        "norm": {"type": "rmsnorm"},
        "placement": {"type": "pre"},
    },
    "final_norm": {"type": "rmsnorm"},
}


def _old_update(self, k, v, positions, valid=None):
    """``LayerKVCache.update`` before the contract (keys and values written straight into ``k`` / ``v``)."""
    g = self.group
    kb, vb = self.tensors["k"], self.tensors["v"]
    if k.dtype != kb.dtype:
        k, v = k.to(kb.dtype), v.to(vb.dtype)
    if g.mode == "concat":
        k_all, v_all = torch.cat([kb, k], dim=2), torch.cat([vb, v], dim=2)
    k_w = k[:, :, g.write_from :] if g.write_from else k
    v_w = v[:, :, g.write_from :] if g.write_from else v
    kb.index_copy_(2, g.write_index, k_w)
    vb.index_copy_(2, g.write_index, v_w)
    if g.mode == "fresh":
        return k, v, positions, valid
    if g.mode == "buffer":
        return kb, vb, g.view_positions, g.view_valid
    return k_all, v_all, g.view_positions, g.view_valid


def _old_update_cache(inputs, k, v, *, mixer=None):
    """``modkit.nn.attention.update_cache`` before the contract (no per-mixer lookup)."""
    if inputs.cache is None:
        return k, v, inputs.positions, inputs.token_mask
    k_all, v_all, k_pos, k_valid = _old_update(inputs.cache.only, k, v, inputs.positions, inputs.token_mask)
    if k_all.dtype != k.dtype:
        k_all, v_all = k_all.to(k.dtype), v_all.to(v.dtype)
    return k_all, v_all, k_pos, k_valid


_new_prepare = attention_helpers.prepare_mask


def _old_prepare_mask(inputs, k_pos, k_valid, dtype, *, causal=True, window=None, mixer=None):
    """``prepare_mask`` before the contract: the scratch read off ``inputs.cache`` (the mixer argument ignored)."""
    return _new_prepare(inputs, k_pos, k_valid, dtype, causal=causal, window=window)


def run(model, ids, steps: int) -> tuple[float, torch.Tensor]:
    cache = model.new_cache(1, ids.shape[1] + steps)
    with torch.no_grad():
        tok = decode_logits(model, ids, cache).argmax(-1, keepdim=True)
        out = []
        start = time.perf_counter()
        for _ in range(steps):
            logits = decode_logits(model, tok, cache)
            out.append(logits)
            tok = logits.argmax(-1, keepdim=True)
        seconds = (time.perf_counter() - start) / steps
    return seconds, torch.cat(out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], allow_abbrev=False)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--steps", type=int, default=64)
    p.add_argument("--repeats", type=int, default=7)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    model = modkit.build(SPEC, seed=0).eval()
    ids = torch.randint(0, 32000, (1, 32), generator=torch.Generator().manual_seed(0))
    new_fns = (builtin.update_cache, builtin.prepare_mask, MixerCache.update)
    old_fns = (_old_update_cache, _old_prepare_mask, _old_update)

    def use(fns):
        builtin.update_cache, builtin.prepare_mask, MixerCache.update = fns

    times = {"new": [], "old": []}
    outs = {}
    run(model, ids, 4)  # warm-up
    for _ in range(args.repeats):
        for name, fns in (("new", new_fns), ("old", old_fns)):
            use(fns)
            t, out = run(model, ids, args.steps)
            times[name].append(t)
            outs[name] = out
    use(new_fns)
    assert torch.equal(outs["new"], outs["old"]), "the two paths differ"
    new, old = statistics.median(times["new"]), statistics.median(times["old"])
    print(
        f"threads {args.threads}, {args.steps} decode steps after a 32-token prompt, median of {args.repeats} interleaved runs"
    )
    print(f"declared-state cache: {1e3 * new:.3f} ms per step; k/v-only cache (old code): {1e3 * old:.3f} ms per step")
    print(
        f"ratio new / old: {new / old:.3f}  (all runs new: {[round(1e3 * t, 2) for t in times['new']]}, "
        f"old: {[round(1e3 * t, 2) for t in times['old']]})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

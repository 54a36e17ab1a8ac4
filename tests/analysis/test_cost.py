"""FLOPs and memory of specs (``modkit.analysis.cost``, ``modkit cost``) against independent computations.

* every spec in ``specs/``: the summed declarations equal, to the FLOP, a formula written here from the raw spec JSON
  (attention pairs counted by brute force over positions), for prefills and decoded tokens at several contexts;
* built models: the declarations equal ``FlopCounterMode`` (meta for every shipped spec; real CPU tensors with a
  KV cache for the tiny ones), and forward + backward measures exactly 3 x the forward;
* a component without a FLOPs declaration: a clear error naming it (API, CLI), a skipped kit check;
* a wrong declaration: the kit's ``flops`` check fails with both numbers;
* KV-cache bytes with sliding windows, crossover contexts, the roofline and the training-memory estimate.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from pydantic import Field
from typing import Literal

import modkit
from modkit.analysis.cost import CostError, CostModel, Workload, flop_counter, training_flops_per_token
from modkit.testing import check_component
from tests.conftest import HANG_TIMEOUT, REPO, SPECS, registry_with, tiny_spec

ALL_SPECS = sorted(SPECS.glob("*.json"))
TINY_SPECS = sorted(SPECS.glob("tiny-*.json"))


# ------------------------------------------------------------------------------------------------ independent formula


def _layers(spec: dict) -> list[dict]:
    """Resolved ``{attention, ffn}`` configs of each layer (overrides applied in order), from the JSON alone."""
    out = [dict(spec["block"]) for _ in range(spec["n_layers"])]
    for o in spec.get("overrides", []):
        sel = o["layers"]
        idx = (
            sel
            if isinstance(sel, list)
            else range(sel.get("start", 0), sel.get("stop") or spec["n_layers"], sel.get("step", 1))
        )
        for i in idx:
            out[i].update({k: v for k, v in o.items() if k != "layers"})
            if "mixer" in o or "attention" in o:  # the token-mixing slot, under either name
                out[i].pop("attention" if "mixer" in o else "mixer", None)
    return out


def _pairs(new: int, past: int, causal: bool, window) -> int:
    """(query, key) pairs the mask lets through, counted one by one."""
    total, n = past + new, 0
    for p in range(past, past + new):
        for k in range(total):
            d = p - k
            if (d >= 0 if causal else True) and (window is None or abs(d) < window):
                n += 1
    return n


def _ffn_per_token(ffn: dict, d: int) -> int:
    if ffn["type"] == "mlp":
        return 4 * d * ffn["d_ff"]
    if ffn["type"] in ("swiglu", "geglu", "swiglu_clamped"):
        return 6 * d * ffn["d_ff"]
    assert ffn["type"] == "moe" and ffn.get("capacity_factor") is None
    shared = _ffn_per_token(ffn["shared"], d) + (2 * d if ffn.get("shared_gate") else 0) if ffn.get("shared") else 0
    return 2 * d * ffn["n_experts"] + ffn.get("top_k", 2) * _ffn_per_token(ffn["expert"], d) + shared


def _chunks(new: int, chunk: int) -> tuple[int, int]:
    """``(L, c)``: the chunk length a chunked scan uses on ``new`` tokens and how many chunks (the last padded)."""
    L = min(chunk, new)
    return L, -(-new // L)


def _recurrent(a: dict, d: int, new: int) -> int:
    """Matmul FLOPs of a recurrent mixer on one row of ``new`` tokens (none depend on the cached context): its
    projections, its depthwise convolution (2 FLOPs per tap), and the scan: one token reads the state, more take
    the chunked form (Mamba-2: SSD's C·Bᵀ blocks, their product with x, the chunk states and their read-out; Gated
    DeltaNet: β K Kᵀ, two triangular solves, q·kᵀ, the in-chunk attention, the state's read-outs and update)."""
    K = a.get("d_conv", 4)
    if a["type"] == "short_conv":  # LFM2: in_proj to B, C, x; the depthwise convolution; out_proj (no state to read)
        return new * (2 * d * 3 * d + 2 * d * a.get("d_conv", 3) + 2 * d * d)
    if a["type"] == "mamba2":
        P, N, G = a.get("head_dim", 64), a.get("d_state", 128), a.get("n_groups", 1)
        inner = a.get("d_inner") or int(a.get("expand", 2.0) * d)
        H, conv = inner // P, inner + 2 * G * N
        total = new * 2 * d * (2 * inner + 2 * G * N + H) + new * 2 * conv * K + new * 2 * inner * d
        if new == 1:
            return total + 2 * H * P * N
        L, c = _chunks(new, a.get("chunk_size", 64))
        return total + c * (2 * G * L * L * N + 2 * H * L * L * P + 4 * H * L * P * N)
    if a["type"] == "kimi_delta":  # Kimi Delta Attention: the gated delta rule with one decay per key channel
        H, dh = a["n_heads"], a.get("head_dim", 128)
        D, r = H * dh, a.get("gate_rank") or dh
        # q, k, v; the low-rank forget and output gates; β; the convolution over [q; k; v]; o_proj
        total = new * (2 * d * 3 * D + 2 * 2 * (d * r + r * D) + 2 * d * H + 2 * 3 * D * K + 2 * D * d)
        if new == 1:
            return total + 4 * H * dh * dh
        # per chunk: two triangular solves (for U and W), then W·S, Q·S, the in-chunk attention times V, Kᵀ·V
        L, c = _chunks(new, a.get("chunk_size", 16))
        return total + H * c * (L * (L - 1) * 2 * dh + 6 * L * dh * dh + 2 * L * L * dh)
    assert a["type"] == "gated_deltanet", a["type"]
    dk, dv = a.get("key_head_dim", 128), a.get("value_head_dim", 128)
    H = a.get("n_value_heads") or a["n_heads"]
    kd, vd = a["n_heads"] * dk, H * dv
    total = new * 2 * d * (2 * kd + 2 * vd + 2 * H) + new * 2 * (2 * kd + vd) * K + new * 2 * vd * d
    if new == 1:
        return total + 4 * H * dk * dv
    L, c = _chunks(new, a.get("chunk_size", 32))
    return total + H * c * (4 * L * L * dk + L * (L - 1) * (dk + dv) + 2 * L * L * dv + 6 * L * dk * dv)


def formula(spec: dict, new: int, past: int) -> int:
    """Matmul FLOPs of one row of ``new`` tokens after ``past`` cached ones (2 FLOPs per multiply-add)."""
    d, total, memo = spec["d_model"], 0, {}
    for layer in _layers(spec):
        a = layer.get("mixer") or layer["attention"]
        ffn = new * _ffn_per_token(layer["ffn"], d) if layer.get("ffn") else 0
        if a["type"] in ("mamba2", "gated_deltanet", "short_conv", "kimi_delta"):
            total += ffn + _recurrent(a, d, new)
            continue
        if a["type"] == "none":  # no mixer: the block is its ffn alone (Nemotron-H's MLP layers)
            total += ffn
            continue
        h = a["n_heads"]
        if a["type"] == "mla":  # latent attention (DeepSeek-V2 §2.1): expanded with an empty cache, absorbed after
            total += new * _ffn_per_token(layer["ffn"], d) + _mla(a, d, new, past, memo)
            continue
        if a["type"] == "compressed_attention":  # DeepSeek-V4: a window of raw keys plus compressed entries
            total += ffn + _compressed(a, d, new, past)
            continue
        if a["type"] == "dsa":  # MLA over each query's index_topk selected keys, plus the indexer over all of them
            total += new * _ffn_per_token(layer["ffn"], d) + _dsa(a, d, new, past, memo)
            continue
        kv = {"mha": h, "mqa": 1}.get(a["type"], a.get("n_kv_heads"))
        kv = a.get("n_kv_heads") or kv
        hd = a.get("head_dim") or d // h
        key = (a.get("causal", True), a.get("sliding_window"))
        if key not in memo:
            memo[key] = _pairs(new, past, *key)
        total += new * 2 * d * (2 * h * hd + 2 * kv * hd)  # q, o and k, v
        gate = h if a.get("output_gate_scope") == "head" else h * hd  # one gate per head (LFM3) or per feature
        total += new * 2 * d * gate if a.get("output_gate") else 0  # the gate's projection (Qwen3-Next, Qwen3.5)
        total += 2 * 2 * h * hd * memo[key]  # q·kᵀ and p·v
        total += ffn  # none for an attention block alone (Nemotron-H)
    stream = spec.get("stream")
    if stream and stream["type"] == "mhc":  # per connection: its weights from n·d, and comb^T · S; the head's weights
        n = stream.get("n_streams", 4)
        total += 2 * len(_layers(spec)) * new * (2 * n * d * (2 + n) * n + 2 * n * n * d) + new * 2 * n * d * n
    return total + new * 2 * d * spec["vocab_size"]


def _compressed(a: dict, d: int, new: int, past: int) -> int:
    """Matmul FLOPs of ``compressed_attention`` on one row, query by query: the projections, the compressors' two
    projections per token, the indexer's queries, head weights and scores over every complete entry, and the scores
    and values over ``min(p + 1, window)`` raw keys plus the ``(p + 1) // m`` entries (at most ``index_topk``)."""
    h, hd, r, g, ro = a["n_heads"], a["head_dim"], a["q_lora_rank"], a["o_groups"], a["o_lora_rank"]
    m, window, index = a.get("compress_ratio"), a["window"], a.get("index_n_heads")
    total = new * 2 * (d * r + r * h * hd + d * hd + h * hd * ro + g * ro * d)
    entries = [(p + 1) // m if m else 0 for p in range(past, past + new)]
    kept = [min(e, a.get("index_topk", 512)) if index else e for e in entries]
    raw = [min(p + 1, window) if window else p + 1 for p in range(past, past + new)]
    if m:
        total += new * 2 * d * 2 * (2 if a.get("overlap") else 1) * hd
    if index:
        di = a.get("index_head_dim", 128)
        total += new * 2 * (d * 4 * di + r * index * di + d * index) + 2 * index * di * sum(entries)
    return total + 2 * 2 * h * hd * (sum(raw) + sum(kept))


def _dsa(a: dict, d: int, new: int, past: int, memo: dict) -> int:
    """Matmul FLOPs of DeepSeek Sparse Attention on one row: MLA over the pairs a causal window of ``index_topk``
    counts (``min(p + 1, k)`` keys per query), the indexer's projections and its scores over every causal pair."""
    key = (True, a["index_topk"])
    if key not in memo:
        memo[key] = _pairs(new, past, *key)
    h, dim = a["index_n_heads"], a["index_head_dim"]
    if (True, None) not in memo:
        memo[(True, None)] = _pairs(new, past, True, None)
    every = memo[(True, None)]
    indexer = new * 2 * (a["q_lora_rank"] * h * dim + d * dim + d * h) + 2 * h * dim * every + 2 * h * every
    return _mla(a, d, new, past, memo, pairs=memo[key]) + indexer


def _mla(a: dict, d: int, new: int, past: int, memo: dict, pairs=None) -> int:
    """Matmul FLOPs of multi-head latent attention on one row, counted from its shapes (over ``pairs`` when given)."""
    h, r, q, nope, rope, v = (
        a["n_heads"],
        a["kv_lora_rank"],
        a.get("q_lora_rank"),
        a["qk_nope_head_dim"],
        a["qk_rope_head_dim"],
        a["v_head_dim"],
    )
    key = (True, None)
    if key not in memo:
        memo[key] = _pairs(new, past, *key)
    pairs = memo[key] if pairs is None else pairs
    total = new * 2 * (d * h * (nope + rope) if q is None else d * q + q * h * (nope + rope))  # queries
    total += new * 2 * d * (r + rope) + new * 2 * h * v * d  # latent + shared key; output projection
    if past == 0:  # per-head keys and values rebuilt from the latent, attention over them
        return total + new * 2 * r * h * (nope + v) + 2 * h * (nope + rope) * pairs + 2 * h * v * pairs
    # queries into the latent, scores against it and the shared key, sum of latents, values up-projected
    return total + new * 2 * h * nope * r + 2 * h * (r + rope) * pairs + 2 * h * r * pairs + new * 2 * h * r * v


_costs: dict = {}


def _cost(path: Path) -> CostModel:
    if path not in _costs:
        _costs[path] = CostModel(path)
    return _costs[path]


@pytest.mark.parametrize("path", ALL_SPECS, ids=lambda p: p.stem)
def test_flops_equal_an_independent_formula_for_every_spec(path):
    spec = json.loads(path.read_text())
    costs = _cost(path)
    for new, past in ((1, 0), (37, 0), (1, 699), (3, 4000), (700, 0)):
        if new * (new + past) > 600_000:  # keep the brute-force pair count quick
            continue
        got = costs.total(Workload(1, new, past))
        assert got == formula(spec, new, past), (new, past)
    # batch scales every term
    assert costs.total(Workload(3, 5, 2)) == 3 * costs.total(Workload(1, 5, 2))


def test_phases_per_token():
    costs = _cost(SPECS / "llama-3.1-8b.json")
    d, h, hd, ff, layers, vocab = 4096, 32, 128, 14336, 32, 128256
    matmul = layers * (2 * d * (2 * h * hd + 2 * 8 * hd) + 6 * d * ff) + 2 * d * vocab
    for n in (1, 8192, 100_000):
        decode = costs.per_token("decode", n)
        assert sum(decode.values()) == matmul + layers * 4 * h * hd * n  # n keys each
        prefill = costs.per_token("prefill", n)
        assert sum(prefill.values()) == matmul + layers * 4 * h * hd * (n + 1) / 2  # (n + 1) / 2 keys on average
    assert costs.context_parts() == {"attention.scores", "attention.weighted_sum"}
    assert modkit.flops_per_token(SPECS / "llama-3.1-8b.json", 8192, "train") == 3 * float(
        sum(costs.per_token("prefill", 8192).values())
    )


def test_crossover_contexts():
    costs = _cost(SPECS / "llama-3.1-8b.json")
    d, ff, qkvo = 4096, 14336, 2 * 4096 * (2 * 4096 + 2 * 1024)
    # 4·H·hd·n >= 6·d·d_ff at decode; the prefill average (n + 1) / 2 needs about twice the context
    assert costs.crossover("decode") == 6 * d * ff // (4 * 4096) == 21504
    assert costs.crossover("prefill") == 2 * 21504 - 1
    assert costs.crossover("decode", projections=True) == (6 * d * ff - qkvo) // (4 * 4096) == 16384
    # Gemma 3: five of six layers keep a 512-token window; only the global layers keep growing
    gemma = _cost(SPECS / "gemma-3-1b.json")
    n = gemma.crossover("decode")
    spec = json.loads((SPECS / "gemma-3-1b.json").read_text())
    ffn = 26 * 6 * 1152 * 6912
    attn = lambda c: sum(
        4 * 4 * 256 * (min(c, 512) if l["attention"].get("sliding_window") else c) for l in _layers(spec)
    )  # noqa: E731
    assert attn(n) >= ffn > attn(n - 1)
    # every layer windowed: attention never catches up
    windowed = tiny_spec(block__attention={"type": "gqa", "n_heads": 4, "n_kv_heads": 2, "sliding_window": 4})
    assert CostModel(windowed).crossover("decode") is None


def test_kv_cache_bytes_keep_only_the_window():
    gemma = _cost(SPECS / "gemma-3-1b.json")
    spec = json.loads((SPECS / "gemma-3-1b.json").read_text())
    for context, batch in ((100, 1), (32768, 4)):
        want = sum(
            2 * 1 * 256 * 2 * batch * (min(context, 512) if l["attention"].get("sliding_window") else context)
            for l in _layers(spec)
        )
        assert gemma.kv_cache_bytes(context, batch, "bfloat16") == want
    llama70 = _cost(SPECS / "llama-3-70b.json")
    assert llama70.kv_cache_bytes(1, 1) == 80 * 2 * 8 * 128 * 2 == 327_680  # per token, bf16


def test_decode_roofline():
    costs = _cost(SPECS / "llama-3.1-8b.json")
    got = costs.decode_latency(8192, 1, "bfloat16", bandwidth=2e12, peak_flops=1e15)
    weights = 8_030_261_248 - 128256 * 4096  # every weight but the (untied) embedding table
    kv = 32 * 2 * 8 * 128 * 2 * 8192
    assert got["bytes"] == 2 * weights + kv
    assert got["memory_s"] == (2 * weights + kv) / 2e12 and got["bound"] == "memory"
    assert got["flops"] == costs.total(Workload(1, 1, 8191))
    # a mixture of experts reads only the active experts at batch 1
    mixtral = _cost(SPECS / "mixtral-8x7b-v0.1.json")
    assert mixtral.weights_read_per_step(1) == modkit.active_params_per_token(mixtral.model) - 32000 * 4096
    assert mixtral.weights_read_per_step(2) == modkit.count_params(mixtral.model) - 32000 * 4096


# ------------------------------------------------------------------------------------------------ measured


@pytest.mark.parametrize("path", ALL_SPECS, ids=lambda p: p.stem)
def test_declarations_equal_flop_counter_on_meta(path):
    costs = _cost(path)
    ids = torch.zeros(2, 9, dtype=torch.long, device="meta")
    with flop_counter() as counter:
        costs.model(ids)
    # dense: the kernel scores the whole [9, 9] rectangle, masked pairs too
    assert counter.get_total_flops() == costs.total(Workload(2, 9, dense=True))


@pytest.mark.parametrize("path", TINY_SPECS, ids=lambda p: p.stem)
def test_declarations_equal_flop_counter_on_cpu_with_a_cache(path):
    costs = _cost(path)
    model = modkit.build(path).eval()
    ids = torch.randint(0, model.spec.vocab_size, (2, 6), generator=torch.Generator().manual_seed(0))
    with torch.no_grad(), flop_counter() as counter:
        model(ids)
    assert counter.get_total_flops() == costs.total(Workload(2, 6, dense=True))
    cache = model.new_cache(2, 4)  # no window below 4 tokens: every layer holds exactly past + 1 keys
    with torch.no_grad():
        model(ids[:, :3], cache=cache)
        with flop_counter() as counter:
            model(ids[:, 3:4], cache=cache)
    assert counter.get_total_flops() == costs.total(Workload(2, 1, 3, dense=True))


def test_backward_is_twice_the_forward():
    model = modkit.build(SPECS / "tiny-moe.json", device="meta").train()
    ids = torch.zeros(2, 8, dtype=torch.long, device="meta")
    with flop_counter() as fwd:
        out = model(ids)
    with flop_counter() as bwd:
        (out.logits.float().mean() + out.aux_loss).backward()
    assert fwd.get_total_flops() > 0 and bwd.get_total_flops() == 2 * fwd.get_total_flops()


def test_training_flops_per_token_is_three_forwards():
    costs = _cost(SPECS / "gpt2.json")
    t = 1024
    assert training_flops_per_token(SPECS / "gpt2.json", t) == round(3 * costs.total(Workload(1, t)) / t)


# ------------------------------------------------------------------------------------------------ undeclared / wrong


class Relu2Config(modkit.ComponentConfig):
    type: Literal["relu2"] = "relu2"
    d_ff: int = Field(64, description="hidden width")


class Relu2(torch.nn.Module):
    def __init__(self, d: int, d_ff: int):
        super().__init__()
        self.up, self.down = torch.nn.Linear(d, d_ff), torch.nn.Linear(d_ff, d)

    def forward(self, x):
        return self.down(torch.relu(self.up(x)) ** 2)


def _relu2(**kw) -> modkit.Component:
    return modkit.Component(
        kind="ffn",
        type="relu2",
        config=Relu2Config,
        factory=lambda cfg, ctx: Relu2(ctx.d_model, cfg.d_ff),
        description="squared-ReLU MLP (test)",
        example={"type": "relu2", "d_ff": 48},
        **kw,
    )


def test_a_component_without_a_declaration_gets_a_clear_error(tmp_path):
    reg = registry_with("third-party", _relu2())
    spec = tiny_spec(block__ffn={"type": "relu2"})
    with pytest.raises(CostError, match=r"ffn/relu2 \(third-party\) declares no FLOPs.*flops=fn\(config, ctx, work\)"):
        CostModel(spec, registry=reg).per_token("decode", 16)
    (result,) = check_component("ffn", "relu2", registry=reg, checks=["flops"])
    assert result.status == "skipped" and "declares no FLOPs" in result.detail


def test_cli_reports_the_missing_declaration(tmp_path):
    """The example plugin's relu2 has no FLOPs declaration: one error line, no number."""
    example = REPO / "docs" / "examples" / "modkit-extra"
    spec = tmp_path / "relu2.json"
    spec.write_text(json.dumps(tiny_spec(block__ffn={"type": "relu2", "d_ff": 64})))
    code = (
        "import sys, modkit\n"
        "sys.path.insert(0, %r)\n"
        "import modkit_extra\n"
        "reg = modkit.get_registry(); reg.register_plugin(modkit_extra, 'extra')\n"
        "from modkit.cli import main\n"
        "sys.exit(main(['cost', %r]))\n"
    ) % (str(example), str(spec))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=HANG_TIMEOUT)
    assert proc.returncode == 1, proc.stderr
    assert proc.stdout == ""
    assert "modkit: error: ffn/relu2" in proc.stderr and "declares no FLOPs" in proc.stderr


def test_the_kit_catches_a_wrong_declaration():
    def wrong(cfg, ctx, work):  # forgets the down projection
        return {"up": 2 * work.tokens * ctx.d_model * cfg.d_ff}

    reg = registry_with("third-party", _relu2(flops=wrong))
    (result,) = check_component("ffn", "relu2", registry=reg, checks=["flops"])
    assert result.status == "failed"
    assert "FlopCounterMode measured" in result.detail and "difference -" in result.detail

    def right(cfg, ctx, work):
        return {"up": 2 * work.tokens * ctx.d_model * cfg.d_ff, "down": 2 * work.tokens * cfg.d_ff * ctx.d_model}

    reg = registry_with("third-party", _relu2(flops=right))
    (result,) = check_component("ffn", "relu2", registry=reg, checks=["flops"])
    assert result.status == "passed", result.detail


def test_a_malformed_declaration_is_refused():
    reg = registry_with("third-party", _relu2(flops=lambda cfg, ctx, work: {"up": 1.5}))
    with pytest.raises(CostError, match=r"ffn/relu2.*'up': 1\.5.*non-negative integers"):
        CostModel(tiny_spec(block__ffn={"type": "relu2"}), registry=reg).total(Workload())


def test_workload_pairs_match_brute_force():
    for new, past in ((1, 0), (5, 0), (1, 9), (4, 6), (12, 3)):
        for causal in (True, False):
            for window in (None, 1, 3, 7, 50):
                if not causal and past:
                    continue
                want = _pairs(new, past, causal, window)
                assert Workload(2, new, past).pairs(causal=causal, window=window) == 2 * want
        assert Workload(1, new, past, dense=True).pairs(window=3) == new * (new + past)
    with pytest.raises(CostError, match="new >= 1"):
        Workload(1, 0)


# ------------------------------------------------------------------------------------------------ memory


def test_training_memory_activations_match_a_real_run():
    """The meta fit a + b·T + c·T² reproduces the bytes autograd saves in a real CPU float32 run of the eager
    attention (which keeps its [T, T] probabilities), at a length the fit never saw."""
    spec = tiny_spec(block__attention={"type": "gqa", "n_heads": 4, "n_kv_heads": 2, "backend": "eager"})
    costs = CostModel(spec)
    batch, t = 3, 40
    mem = costs.training_memory(batch, t, "float32")
    model = modkit.build(spec).train()
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen, keep = {}, []

    def pack(x):
        s = x.untyped_storage()
        if s.data_ptr() not in params:
            seen.setdefault(s.data_ptr(), s.nbytes())
        keep.append(x)
        return x

    ids = torch.randint(0, 64, (batch, t), generator=torch.Generator().manual_seed(0))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
        logits = model(ids).logits
        torch.nn.functional.cross_entropy(logits.float().reshape(-1, 64), ids.reshape(-1))
    assert mem["activations"] + mem["attention_matrix"] == sum(seen.values())
    n = modkit.count_params(spec)
    assert (mem["weights"], mem["gradients"], mem["adamw_states"]) == (4 * n, 4 * n, 8 * n)
    assert mem["total"] == 16 * n + mem["activations"]


# ------------------------------------------------------------------------------------------------ CLI


def test_cli_json_and_table(capsys):
    from modkit.cli import main

    assert main(["cost", str(SPECS / "tiny-llama.json"), "--context", "32", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    costs = _cost(SPECS / "tiny-llama.json")
    assert data["flops_per_token_total"]["decode"] == costs.total(Workload(1, 1, 31))
    assert data["flops_per_token_total"]["prefill"] == costs.total(Workload(1, 32)) / 32
    assert data["kv_cache_bytes"] == costs.kv_cache_bytes(32, 1, "bfloat16")
    assert (
        data["decode_roofline"]["bandwidth_bytes_per_s"] == 3.35e12
        and data["decode_roofline"]["peak_flops_per_s"] == 989e12
    )
    assert data["training_memory"]["estimate"] is True
    assert main(["cost", str(SPECS / "tiny-llama.json"), "--context", "0"]) == 1
    assert "--context must be >= 1, got 0" in capsys.readouterr().err
    assert main(["cost", str(SPECS / "tiny-llama.json"), "--context", "32", "--batch", "2"]) == 0
    table = capsys.readouterr().out
    decode = f"{costs.total(Workload(1, 1, 31)) / 1e6:.3f} M"
    total = next(line for line in table.splitlines() if line.startswith("  total"))
    assert "attention.scores *" in table and decode in total
    assert f"{costs.crossover('decode'):,}" in table and "memory-bound" in table and "an estimate" in table


def test_cli_says_clearly_when_the_context_is_past_max_seq_len(capsys):
    """tiny-llama's max_seq_len is 512: at 4,096 a warning on stderr, and every line stated at that context says so."""
    from modkit.cli import main

    assert main(["cost", str(SPECS / "tiny-llama.json"), "--context", "4096"]) == 0
    out, err = capsys.readouterr()
    assert err.startswith("modkit: warning: --context 4,096 is beyond the spec's max_seq_len = 512")
    at = [line for line in out.splitlines() if "context 4,096" in line]
    assert len(at) == 3 and all("context 4,096 (beyond max_seq_len 512)" in line for line in at), at
    assert main(["cost", str(SPECS / "tiny-llama.json"), "--context", "4096", "--json"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["context_beyond_max_seq_len"] is True and "beyond" in err
    assert main(["cost", str(SPECS / "tiny-llama.json"), "--context", "512"]) == 0
    out, err = capsys.readouterr()
    assert "beyond" not in err and "(beyond max_seq_len 512)" not in out


def test_the_guide_shows_what_modkit_computes(capsys):
    """docs/guides/cost.md: the example's FLOPs table is the command's output, and every crossover in its table is
    what :meth:`CostModel.crossover` finds."""
    from modkit.cli import main

    guide = (REPO / "docs" / "guides" / "cost.md").read_text()
    assert main(["cost", str(SPECS / "llama-3.1-8b.json"), "--context", "8192"]) == 0
    flops_table = capsys.readouterr().out.split("\n\n")[0]
    assert flops_table in guide
    rows = {
        "GPT-2 (124M)": "gpt2",
        "GPT-3 175B": "gpt-3-175b",
        "Llama 3.1 8B": "llama-3.1-8b",
        "Llama 3 70B": "llama-3-70b",
        "Llama 3.1 405B": "llama-3.1-405b",
        "Mixtral 8x7B": "mixtral-8x7b-v0.1",
        "Qwen3 0.6B": "qwen3-0.6b",
        "Gemma 3 1B": "gemma-3-1b",
        "Mistral 7B v0.1": "mistral-7b-v0.1",
    }
    fmt = lambda n: "never" if n is None else f"{n:,}"  # noqa: E731
    for label, stem in rows.items():
        line = next(row for row in guide.splitlines() if row.startswith(f"| {label}"))
        cells = [c.strip() for c in line.strip("|").split("|")]
        costs = _cost(SPECS / f"{stem}.json")
        want = [
            fmt(4 * costs.spec.d_model),
            fmt(costs.crossover("decode")),
            fmt(costs.crossover("prefill")),
            fmt(costs.crossover("decode", projections=True)),
            fmt(costs.spec.max_seq_len),
        ]
        assert cells[1:] == want, label


def _guide_blocks(out: str, drop: str) -> str:
    """The output's blank-line-separated blocks, without the one starting with ``drop``."""
    return "\n\n".join(b for b in out.rstrip("\n").split("\n\n") if not b.startswith(drop))


def test_the_guide_shows_deepseek_v3_and_gpt_oss_as_computed(capsys, monkeypatch):
    """docs/guides/cost.md's DeepSeek-V3 (128K) and gpt-oss-120b section: the model cards are ``modkit build --device
    meta`` 's, the cost tables ``modkit cost --context 131072`` 's (its training-memory block, left out of the guide,
    is stubbed here: it takes seconds of meta forwards), and the per-layer-kind table is what
    :meth:`CostModel.flops_by_layer` and the cache formula give, summing to :meth:`CostModel.kv_cache_bytes`."""
    from fractions import Fraction

    from modkit.cli import main

    guide = (REPO / "docs" / "guides" / "cost.md").read_text()
    monkeypatch.setattr(
        CostModel,
        "training_memory",
        lambda self, batch, seq_len, dtype="bfloat16": dict.fromkeys(
            ("weights", "gradients", "adamw_states", "activations", "attention_matrix", "total"), 0
        ),
    )
    for stem in ("deepseek-v3", "gpt-oss-120b"):
        assert main(["build", str(SPECS / f"{stem}.json"), "--device", "meta", "--dtype", "bfloat16"]) == 0
        out = capsys.readouterr().out
        card = out[out.index("parameters\n") : out.index("\n\nbuilt on meta")]
        assert f"$ modkit build specs/{stem}.json --device meta --dtype bfloat16\n...\n{card}\n```" in guide, stem
        assert main(["cost", str(SPECS / f"{stem}.json"), "--context", "131072"]) == 0
        shown = _guide_blocks(capsys.readouterr().out, "training memory")
        assert f"$ modkit cost specs/{stem}.json --context 131072\n{shown}\n```" in guide, stem
    costs = _cost(SPECS / "gpt-oss-120b.json")
    spec = costs.spec
    windowed, full = spec.layer(0).attention, spec.layer(1).attention
    assert windowed.sliding_window == 128 and full.sliding_window is None and windowed.sinks and full.sinks
    n = 131072
    row = {}
    for phase in ("decode", "prefill"):
        work = CostModel.workload(phase, n)
        by = costs.flops_by_layer(work)
        row[phase] = [
            Fraction(by[i]["attention.scores"] + by[i]["attention.weighted_sum"], work.tokens) for i in (0, 1)
        ]
        assert all(r.denominator == 1 for r in row[phase])
    cache = [2 * a.n_kv_heads * a.head_dim * 2 * min(n, a.sliding_window or n) for a in (windowed, full)]
    assert 18 * sum(cache) == costs.kv_cache_bytes(n, 1, "bfloat16") == 4_836_556_800
    sinks = [p.numel() for name, p in costs.model.named_parameters() if name.endswith("attention.sinks")]
    assert len(sinks) == 36 and set(sinks) == {64}
    fmt = lambda xs: " | ".join(f"{int(x):,}" for x in xs)  # noqa: E731
    for label, values in (
        ("scores + weighted sum, FLOPs per decoded token", row["decode"]),
        ("scores + weighted sum, FLOPs per prefill token", row["prefill"]),
        ("KV cache held per sequence (bytes)", cache),
        ("sinks (parameters)", [64, 64]),
    ):
        assert f"| {label} | {fmt(values)} |" in guide, label


def test_the_guide_s_deepseek_v3_and_gpt_oss_prose_figures():
    """The figures the cost guide's DeepSeek-V3 / gpt-oss-120b prose derives by hand, recomputed: the active-parameter
    sum, the latent against the expanded cache, attention's share of the FLOPs, gpt-oss's active count without the
    embedding, its sinks."""
    from modkit.analysis.cost import active_params_per_token

    guide = (REPO / "docs" / "guides" / "cost.md").read_text()
    section = guide[guide.index("## Example: DeepSeek-V3") : guide.index("## The explainers")]
    ds = _cost(SPECS / "deepseek-v3.json")
    params = ds.params()
    active = active_params_per_token(ds.model)
    d, experts = 7168, 8 + 1
    by_hand = (
        params["attention"]
        + 3 * 3 * d * 18432
        + 58 * (d * 256 + experts * 3 * d * 2048)
        + params["norm"]
        + params["embedding"]
        + params["lm_head"]
    )
    assert by_hand == active == 37_552_282_624 and f"{params['attention']:,} (attention)" in section
    n = 131072
    latent = ds.kv_cache_bytes(n, 1, "bfloat16")
    expanded = 61 * 128 * (192 + 128) * 2
    assert ds.kv_cache_bytes_per_token("bfloat16") == 61 * (512 + 64) * 2
    assert f"{latent:,} bytes = {latent / 2**30:.2f} GiB" in section
    assert f"{expanded:,} bytes per token, {expanded * n / 2**30:.0f} GiB: {expanded * n / latent:.0f}x" in section
    shares = []
    for phase in ("decode", "prefill"):
        per = ds.per_token(phase, n)
        shares.append(
            f"{100 * float((per['attention.scores'] + per['attention.weighted_sum']) / sum(per.values())):.1f} %"
        )
    assert f"are {shares[0]} of a decoded token's" in section and f"and {shares[1]} of a prefill token's" in section
    per = ds.per_token("prefill", n)
    routed = sum(v for k, v in per.items() if k.startswith("ffn.experts."))
    dense = sum(per[k] for k in ("ffn.gate", "ffn.up", "ffn.down"))
    assert (
        f"routed experts are {float(routed) / 1e9:.1f} GFLOPs, the dense layers and the shared expert {float(dense) / 1e9:.1f}"
        in section
    )
    go = _cost(SPECS / "gpt-oss-120b.json")
    go_active = active_params_per_token(go.model)
    assert f"{go_active:,}, count the embedding" in section
    assert f'without it, {go_active - go.params()["embedding"]:,}: the model card\'s "5.13B active"' in section
    sinks = sum(p.numel() for name, p in go.model.named_parameters() if name.endswith("attention.sinks"))
    assert f"(64 per layer, {sinks:,}\nparameters in all)" in section


def test_a_part_that_grows_one_entry_per_block_counts_as_growing():
    """A block-compressed attention's indexer scores one entry per completed block of 4 tokens: constant over the
    first three decoded tokens (where growth used to be read), growing after. Growth is read at long contexts too,
    so the part is marked and its layers (the compressed-sparse ones, 1 and 3) overtake their FFN at a finite
    context; the heavily compressed layers (0 and 2) have no indexer."""
    from modkit.analysis.workload import varying_parts

    cost = CostModel(Path(__file__).parents[2] / "docs" / "experiments" / "specs" / "sparse-compressed-d64.json")
    early = varying_parts([cost.flops(cost.workload("decode", n)) for n in (1, 2, 3)])
    assert "attention.index_scores" not in early and "attention.index_scores" in cost.context_parts()
    csa = [g for g in cost.mixers() if "attention.index_scores" in g.growing]
    assert [g.layers for g in csa] == [(1, 3)]
    assert cost.crossover("decode", layers=(1, 3)) is not None

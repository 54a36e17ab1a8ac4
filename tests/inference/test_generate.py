"""Sampling, generation with a fresh static cache per call (no state leaks between calls), the compiled decode
step (one graph, no recompile per token) and greedy parity with transformers' ``generate``."""

import pytest
import torch

import modkit
from modkit.inference.generate import filter_logits, generate, sample, stream_generate
from modkit_plugins.sampling import top_p_mask


def _logits(p):
    return torch.tensor(p, dtype=torch.float32).log()[None]


def _kept(p, top_p):
    return torch.isfinite(filter_logits(_logits(p), top_p=top_p))[0].nonzero().flatten().tolist()


def test_c11_top_p_boundaries():
    assert _kept([0.5, 0.35, 0.10, 0.05], 0.9) == [0, 1, 2]
    probs = torch.softmax(filter_logits(_logits([0.5, 0.35, 0.10, 0.05]), top_p=0.9), -1)[0]
    assert torch.allclose(probs[:3], torch.tensor([0.526316, 0.368421, 0.105263]), atol=1e-6)
    assert _kept([0.5, 0.25, 0.125, 0.125], 0.75) == [0, 1]
    assert _kept([0.5, 0.35, 0.10, 0.05], 0.1) == [0]
    assert _kept([0.5, 0.35, 0.10, 0.05], 1.0) == [0, 1, 2, 3]
    assert top_p_mask(torch.tensor([[0.25, 0.25, 0.25, 0.25]]), 1e-6).sum() == 1  # never empty


def test_c11_temperature_zero_and_top_k():
    logits = torch.tensor([[0.1, 3.0, -2.0, 2.9], [5.0, 0.0, 0.0, 0.0]])
    out = sample(logits, temperature=0)
    assert out.tolist() == [1, 0]
    assert torch.equal(filter_logits(logits, top_k=10), logits)  # top_k >= vocab: no truncation
    kept = torch.isfinite(filter_logits(logits, top_k=2))
    assert kept.tolist() == [[False, True, False, True], [True, True, True, True]]  # ties at the k-th value stay
    with pytest.raises(ValueError, match="top_p: Input should be greater than 0"):
        filter_logits(logits, top_p=0)


def test_seeded_sampling_is_reproducible_and_follows_distribution():
    logits = torch.log(torch.tensor([[0.7, 0.2, 0.1]])).expand(20000, 3)
    g = torch.Generator().manual_seed(0)
    draws = sample(logits, temperature=1.0, generator=g)
    freq = torch.bincount(draws, minlength=3).float() / draws.numel()
    assert torch.allclose(freq, torch.tensor([0.7, 0.2, 0.1]), atol=0.02)
    again = sample(logits, temperature=1.0, generator=torch.Generator().manual_seed(0))
    assert torch.equal(draws, again)


C12_SPEC = {
    "schema_version": 1,
    "vocab_size": 32,
    "d_model": 16,
    "n_layers": 2,
    "max_seq_len": 64,
    "position": {"type": "rope"},
    "block": {
        "attention": {"type": "mha", "n_heads": 2},
        "ffn": {"type": "swiglu", "d_ff": 32},
        "norm": {"type": "rmsnorm"},
        "placement": {"type": "pre"},
    },
    "final_norm": {"type": "rmsnorm"},
}


def _no_cache_greedy(model, ids, n):
    ids = torch.as_tensor(ids)[None] if not torch.is_tensor(ids) else ids
    for _ in range(n):
        nxt = model(ids).logits[:, -1].argmax(-1, keepdim=True)
        ids = torch.cat([ids, nxt], 1)
    return ids


@pytest.mark.parametrize("first,second", [([1, 2, 3, 4, 5, 6], [7, 8]), ([7, 8], [1, 2, 3, 4, 5, 6, 9, 10, 11])])
def test_c12_cache_reset_between_calls(first, second):
    model = modkit.build(C12_SPEC, seed=0).eval()
    generate(model, first, max_new_tokens=8, temperature=0)
    reused = generate(model, second, max_new_tokens=8, temperature=0)
    fresh = generate(modkit.build(C12_SPEC, seed=0).eval(), second, max_new_tokens=8, temperature=0)
    assert torch.equal(reused, fresh)
    with torch.no_grad():
        assert torch.equal(reused, _no_cache_greedy(model, torch.tensor([second]), 8))


def test_c12_batch_of_two_with_left_padding():
    model = modkit.build(C12_SPEC, seed=0).eval()
    generate(model, [[1, 2, 3, 4, 5, 6]], max_new_tokens=8, temperature=0)
    ids = torch.tensor([[0, 0, 7, 8], [3, 4, 5, 6]])
    mask = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]])
    out = generate(model, ids, attention_mask=mask, max_new_tokens=8, temperature=0)
    with torch.no_grad():
        assert torch.equal(out[0, 2:], _no_cache_greedy(model, torch.tensor([[7, 8]]), 8)[0])
        assert torch.equal(out[1], _no_cache_greedy(model, torch.tensor([[3, 4, 5, 6]]), 8)[0])


def test_eos_stops_and_pads():
    model = modkit.build(C12_SPEC, seed=0).eval()
    greedy = generate(model, [1, 2, 3], max_new_tokens=6, temperature=0)[0, 3:].tolist()
    eos = greedy[1]
    out = generate(model, [1, 2, 3], max_new_tokens=6, temperature=0, eos_token_id=eos)[0, 3:].tolist()
    assert out == greedy[: greedy.index(eos) + 1]


def test_seeded_generation_reproducible():
    model = modkit.build(C12_SPEC, seed=0).eval()
    a = generate(model, [1, 2], max_new_tokens=10, temperature=1.0, top_p=0.9, seed=3)
    b = generate(model, [1, 2], max_new_tokens=10, temperature=1.0, top_p=0.9, seed=3)
    assert torch.equal(a, b)
    assert a.shape == (1, 12) and int(a.max()) < 32
    assert not torch.equal(a, generate(model, [1, 2], max_new_tokens=10, temperature=1.0, top_p=0.9, seed=4))


# ------------------------------------------------------------------------------------- static cache, compile


def test_stream_yields_one_token_per_step_and_prefill_chunks_agree():
    model = modkit.build(C12_SPEC, seed=0).eval()
    prompt = [3, 1, 4, 1, 5, 9, 2, 6, 5]
    steps = list(stream_generate(model, prompt, max_new_tokens=6, temperature=0))
    assert len(steps) == 6 and all(t.shape == (1,) for t in steps)
    whole = generate(model, prompt, max_new_tokens=6, temperature=0)
    assert whole[0, len(prompt) :].tolist() == [int(t) for t in steps]
    for chunk in (1, 2, 4):
        assert torch.equal(generate(model, prompt, max_new_tokens=6, temperature=0, prefill_chunk=chunk), whole)
    assert generate(model, prompt, max_new_tokens=0).shape == (1, len(prompt))
    with pytest.raises(ValueError, match="prefill_chunk must be >= 1"):
        generate(model, prompt, max_new_tokens=2, prefill_chunk=0)


def test_generate_allocates_prompt_plus_new_tokens(monkeypatch):
    import modkit.nn.memory

    model = modkit.build(C12_SPEC, seed=0).eval()
    made, checked = [], []
    original, fits = type(model).new_cache, modkit.nn.memory.check_fits

    def spy(self, *args, **kwargs):
        cache = original(self, *args, **kwargs)
        made.append(cache)
        return cache

    def spy_fits(nbytes, *args, **kwargs):
        checked.append((nbytes, args[1] if len(args) > 1 else ""))
        return fits(nbytes, *args, **kwargs)

    monkeypatch.setattr(type(model), "new_cache", spy)
    monkeypatch.setattr(modkit.nn.memory, "check_fits", spy_fits)
    generate(model, [[1, 2, 3], [4, 5, 6]], max_new_tokens=5, temperature=0)
    (cache,) = made
    # the memory check sized (from the declarations) the very cache allocated
    assert [n for n, what in checked if "KV cache" in what] == [cache.nbytes()]
    assert cache.batch_size == 2 and cache.max_len == 3 + 5
    assert cache.layers[0].only.k.shape == (2, 2, 8, 8) and cache.seen_tokens == 3 + 4  # the last token is never fed


def test_decode_step_compiles_fullgraph_once_without_graph_breaks():
    """The decode step traces as one graph (zero graph breaks) and is not recompiled per token: the write
    pointer and positions are tensors inside the cache, so every step has the same static shapes."""
    from modkit.inference.generate import compiled_decode, decode_logits

    torch._dynamo.reset()
    model = modkit.build(C12_SPEC, seed=0).eval()
    ids = torch.tensor([[1, 2, 3], [0, 4, 5]])
    mask = torch.tensor([[1, 1, 1], [0, 1, 1]])
    with torch.no_grad():
        cache = model.new_cache(2, 12)
        model(ids, attention_mask=mask, cache=cache)
        explained = torch._dynamo.explain(lambda t, c: decode_logits(model, t, c))(torch.tensor([[7], [8]]), cache)
    assert explained.graph_count == 1 and explained.graph_break_count == 0, explained.break_reasons

    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    step = compiled_decode(model, backend=backend)
    eager = generate(model, ids, attention_mask=mask, max_new_tokens=8, temperature=0)
    compiled = generate(model, ids, attention_mask=mask, max_new_tokens=8, temperature=0, compile=True)
    again = generate(model, [[9, 9, 9], [1, 1, 1]], max_new_tokens=8, temperature=0, compile=True)
    assert compiled_decode(model) is step
    assert torch.equal(compiled, eager)
    assert torch.equal(again, generate(model, [[9, 9, 9], [1, 1, 1]], max_new_tokens=8, temperature=0))
    assert len(graphs) == 1  # one trace for 14 decode steps over two calls with different prompts
    torch._dynamo.reset()


# ----------------------------------------------------------------------------- greedy parity with transformers


def _hf_causal(cls_name: str, seed: int = 0, **kwargs):
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()
    cfg = getattr(transformers, cls_name)(vocab_size=97, max_position_embeddings=64, **kwargs)
    torch.manual_seed(seed)
    hf = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").eval()
    with torch.no_grad():  # perturb every parameter (norms and biases too) so nothing is at its init value
        for p in hf.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    hf.generation_config.eos_token_id = None
    hf.generation_config.pad_token_id = 0
    return hf


#: (id, transformers config class, kwargs), each loaded into modkit through modkit.from_hf
PARITY_CASES = [
    (
        "llama",
        "LlamaConfig",
        dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2, intermediate_size=96),
    ),
    (
        "mistral-window4",
        "MistralConfig",
        dict(
            hidden_size=64,
            num_attention_heads=8,
            num_key_value_heads=2,
            num_hidden_layers=2,
            intermediate_size=96,
            sliding_window=4,
        ),
    ),
    (
        "qwen2-mixed-window",
        "Qwen2Config",
        dict(
            hidden_size=64,
            num_attention_heads=4,
            num_key_value_heads=2,
            num_hidden_layers=2,
            intermediate_size=96,
            tie_word_embeddings=True,
            use_sliding_window=True,
            sliding_window=4,
            max_window_layers=1,
        ),
    ),
    (
        "qwen3",
        "Qwen3Config",
        dict(
            hidden_size=64,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=32,
            num_hidden_layers=2,
            intermediate_size=96,
        ),
    ),
    (
        "gemma3-local-global",
        "Gemma3TextConfig",
        dict(
            hidden_size=64,
            num_attention_heads=4,
            num_key_value_heads=1,
            head_dim=16,
            num_hidden_layers=3,
            intermediate_size=96,
            sliding_window=4,
            query_pre_attn_scalar=24,
            final_logit_softcapping=3.0,
            layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        ),
    ),
    (
        "mixtral",
        "MixtralConfig",
        dict(
            hidden_size=64,
            num_attention_heads=4,
            num_key_value_heads=2,
            num_hidden_layers=2,
            intermediate_size=48,
            num_local_experts=4,
            num_experts_per_tok=2,
            sliding_window=5,
        ),
    ),
    ("gpt2", "GPT2Config", dict(n_embd=64, n_head=4, n_layer=2, n_positions=64)),
    (
        "phi3-window",
        "Phi3Config",
        dict(
            hidden_size=64,
            num_attention_heads=4,
            num_key_value_heads=2,
            num_hidden_layers=2,
            intermediate_size=96,
            sliding_window=5,
            partial_rotary_factor=0.75,
            pad_token_id=0,
            eos_token_id=1,
        ),
    ),
    (
        "olmo2",
        "Olmo2Config",
        dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2, intermediate_size=96),
    ),
]


@pytest.mark.parametrize("name,cls_name,kwargs", PARITY_CASES, ids=[c[0] for c in PARITY_CASES])
def test_greedy_generation_matches_transformers(name, cls_name, kwargs, tmp_path):
    """32 greedy tokens equal transformers' ``generate`` exactly, for one prompt and a left-padded batch."""
    hf = _hf_causal(cls_name, **kwargs)
    hf.save_pretrained(tmp_path / "hf")
    model = modkit.from_hf(tmp_path / "hf").eval()
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(1, 97, (2, 8), generator=g)
    mask = torch.ones(2, 8, dtype=torch.long)
    mask[1, :3] = 0
    ids = ids.masked_fill(mask == 0, 0)
    with torch.no_grad():
        for rows, m in ((ids[:1], None), (ids, mask)):
            theirs = hf.generate(
                rows,
                attention_mask=m if m is not None else torch.ones_like(rows),
                do_sample=False,
                max_new_tokens=32,
                min_new_tokens=32,
            )
            ours = generate(model, rows, attention_mask=m, max_new_tokens=32, temperature=0)
            assert theirs.shape == ours.shape == (rows.shape[0], 8 + 32)
            assert torch.equal(ours, theirs), (
                f"{name}: first difference at new token {int((ours != theirs).any(0).nonzero()[0]) - 8}"
            )


# ------------------------------------------------------------------------------------------------ CLI


def _cli(argv, capsys):
    from modkit.cli import main

    code = main([str(a) for a in argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_cli_generate_ids_from_a_spec_and_a_checkpoint(tmp_path, capsys):
    import json

    spec_file = tmp_path / "c12.json"
    spec_file.write_text(json.dumps(C12_SPEC))
    code, out, err = _cli(["generate", spec_file, "--prompt", "1, 2 3", "--max-new-tokens", 6, "--seed", 0], capsys)
    assert code == 0, err
    model = modkit.build(C12_SPEC, seed=0).eval()
    expected = generate(model, [1, 2, 3], max_new_tokens=6, temperature=0)[0, 3:].tolist()
    assert out == " ".join(map(str, expected)) + "\n"
    assert "prefill" in err and "tokens/s" in err and len(err.strip().splitlines()) == 1
    modkit.save(model, tmp_path / "ckpt")
    code, again, err = _cli(["generate", tmp_path / "ckpt", "--prompt", "1,2,3", "--max-new-tokens", 6], capsys)
    assert code == 0 and again == out, err
    code, _, err = _cli(["generate", spec_file, "--prompt", "one two"], capsys)
    assert code == 1 and "token ids separated by commas or spaces" in err
    code, _, err = _cli(["generate", spec_file, "--prompt", "1 99"], capsys)
    assert code == 1 and "--prompt holds the token id 99, outside the model's vocabulary [0, 32)" in err


def test_cli_generate_text_with_a_tokenizer(tmp_path, capsys):
    import json

    tokenizers = pytest.importorskip("tokenizers")
    vocab = {f"w{i}": i for i in range(32)}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="w0"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    tok.save(str(tmp_path / "tokenizer.json"))
    spec_file = tmp_path / "c12.json"
    spec_file.write_text(json.dumps(C12_SPEC))
    argv = [
        "generate",
        spec_file,
        "--prompt",
        "w5 w6 w7",
        "--tokenizer",
        tmp_path / "tokenizer.json",
        "--max-new-tokens",
        5,
        "--temperature",
        0.8,
        "--top-k",
        10,
        "--top-p",
        0.9,
        "--seed",
        7,
    ]
    code, out, err = _cli(argv, capsys)
    assert code == 0, err
    model = modkit.build(C12_SPEC, seed=7).eval()
    new = generate(model, [5, 6, 7], max_new_tokens=5, temperature=0.8, top_k=10, top_p=0.9, seed=7)[0, 3:].tolist()
    assert out == tok.decode(new) + "\n"


def test_column_major_linears_keeps_values_names_and_checkpoints(tmp_path):
    from modkit.inference.generate import column_major_linears

    model = modkit.build(C12_SPEC, seed=0).eval()
    ids = torch.tensor([[1, 2, 3, 4]])
    before = {k: v.clone() for k, v in model.state_dict().items()}
    logits = model(ids).logits
    n_linear = sum(isinstance(m, torch.nn.Linear) for m in model.modules())
    assert column_major_linears(model) == n_linear and column_major_linears(model) == 0
    w = model.layers[0].attention.q_proj.weight
    assert w.shape == (16, 16) and w.stride() == (1, 16) and w.t().is_contiguous()
    after = model.state_dict()
    assert after.keys() == before.keys() and all(torch.equal(after[k], before[k]) for k in before)
    torch.testing.assert_close(model(ids).logits, logits, atol=1e-6, rtol=0)
    assert torch.equal(
        generate(model, [1, 2, 3], max_new_tokens=5, temperature=0),
        generate(modkit.build(C12_SPEC, seed=0).eval(), [1, 2, 3], max_new_tokens=5, temperature=0),
    )
    modkit.save(model, tmp_path / "ckpt")
    again = modkit.load(tmp_path / "ckpt")
    assert all(torch.equal(again.state_dict()[k], before[k]) for k in before)
    assert column_major_linears(model, enable=False) == n_linear
    assert all(p.is_contiguous() for p in model.parameters())


def test_column_major_linears_keeps_the_weights_a_module_declares_it_reads_as_matrices():
    from modkit.inference.generate import column_major_linears, matrix_weights

    spec = {
        "schema_version": 1,
        "vocab_size": 32,
        "d_model": 32,
        "n_layers": 2,
        "max_seq_len": 16,
        "position": {"type": "rope", "theta": 10000.0},
        "block": {
            "attention": {
                "type": "mla",
                "n_heads": 2,
                "q_lora_rank": 16,
                "kv_lora_rank": 8,
                "qk_nope_head_dim": 8,
                "qk_rope_head_dim": 4,
                "v_head_dim": 8,
                "latent_norm": {"type": "rmsnorm"},
            },
            "ffn": {"type": "swiglu", "d_ff": 32},
            "norm": {"type": "rmsnorm"},
            "placement": {"type": "pre"},
        },
    }
    model = modkit.build(spec, seed=0).eval()
    kv_b = [layer.attention.kv_b_proj.weight for layer in model.layers]
    assert matrix_weights(model) == {id(w) for w in kv_b}  # mla declares kv_b_proj.weight, nothing else does
    n_linear = sum(isinstance(m, torch.nn.Linear) for m in model.modules())
    ref = generate(model, [1, 2, 3], max_new_tokens=6, temperature=0, column_major=False)
    assert column_major_linears(model) == n_linear - len(kv_b)
    assert all(w.is_contiguous() for w in kv_b)  # W_UK / W_UV keep the rows their products are written for
    assert model.layers[0].attention.q_b_proj.weight.t().is_contiguous()  # the others stream column-major
    assert torch.equal(generate(model, [1, 2, 3], max_new_tokens=6, temperature=0), ref)


class _Declares(torch.nn.Module):
    matrix_weights = ("proj.weight", "gate.weight")  # gate: an optional child this build leaves out

    def __init__(self):
        super().__init__()
        self.proj, self.other, self.gate = torch.nn.Linear(4, 6), torch.nn.Linear(4, 6), None


def test_matrix_weights_skips_declared_names_through_an_absent_part():
    from modkit.inference.generate import column_major_linears, matrix_weights

    m = _Declares()
    assert matrix_weights(m) == {id(m.proj.weight)}
    assert column_major_linears(m) == 1 and m.proj.weight.is_contiguous() and m.other.weight.t().is_contiguous()


def test_generate_uses_column_major_weights_by_default_on_cpu_and_not_when_asked():
    row = modkit.build(C12_SPEC, seed=0).eval()
    col = modkit.build(C12_SPEC, seed=0).eval()
    a = generate(row, [1, 2, 3], max_new_tokens=6, temperature=0, column_major=False)
    b = generate(col, [1, 2, 3], max_new_tokens=6, temperature=0)
    assert torch.equal(a, b)
    assert row.layers[0].attention.q_proj.weight.is_contiguous()
    w = col.layers[0].attention.q_proj.weight
    assert w.t().is_contiguous() == torch.backends.mkl.is_available()
    assert all(torch.equal(col.state_dict()[k], v) for k, v in row.state_dict().items())
    col.train()
    col(torch.tensor([[1, 2, 3]])).logits.sum().backward()  # still trainable after the layout change
    assert col.layers[0].attention.q_proj.weight.grad is not None


def test_logits_to_keep_returns_the_last_positions_only():
    model = modkit.build(C12_SPEC, seed=0).eval()
    ids = torch.tensor([[1, 2, 3, 4, 5], [5, 4, 3, 2, 1]])
    full = model(ids).logits
    for n in (1, 2, 5, 9):
        kept = model(ids, logits_to_keep=n).logits
        assert kept.shape == (2, min(n, 5), full.shape[-1])
        torch.testing.assert_close(kept, full[:, -n:], atol=1e-6, rtol=0)
    with pytest.raises(ValueError, match="logits_to_keep must be >= 1"):
        model(ids, logits_to_keep=0)


# ------------------------------------------------------------------------------------------------ past max_seq_len


def _position_types(unbounded: bool) -> list[str]:
    """The registered position types that declare ``unbounded_positions`` (or do not), read from the registry."""
    reg = modkit.get_registry()
    return sorted(
        e.type
        for e in reg.components()
        if e.kind == "position" and bool(e.capabilities.get("unbounded_positions")) == unbounded
    )


def _pair(position: dict, short: int, long: int):
    """The same weights under two ``max_seq_len`` values (short, long)."""
    from conftest import tiny_spec

    a = modkit.build(tiny_spec(max_seq_len=short, position=position), seed=0).eval()
    b = modkit.build(tiny_spec(max_seq_len=long, position=position), seed=1).eval()
    b.load_state_dict(a.state_dict())  # (every non-persistent buffer is recomputed from the config at init)
    return a, b


def test_the_built_in_schemes_without_a_table_declare_it():
    assert _position_types(True) == ["alibi", "none", "rope", "sinusoidal"]
    assert _position_types(False) == ["learned"]


@pytest.mark.parametrize("kind", _position_types(True))
def test_max_len_raises_the_length_for_schemes_without_a_table(kind):
    """Past max_seq_len with ``max_len``: the tokens and the logits are those of the same weights specified for
    the longer length (max abs difference 0), and a MaxSeqLenWarning says the model was specified for less."""
    from modkit.core.errors import ArgumentError, MaxSeqLenWarning

    short, long = _pair({"type": kind}, 16, 48)
    prompt = [[1, 2, 3]]
    with pytest.raises(ArgumentError, match=r"past the model's max_seq_len = 16; .* or pass max_len=33"):
        generate(short, prompt, max_new_tokens=30, temperature=0)  # the default stays the refusal
    with pytest.warns(MaxSeqLenWarning, match="past the max_seq_len = 16 the model was specified for"):
        out = generate(short, prompt, max_new_tokens=30, temperature=0, max_len=40)
    assert torch.equal(out, generate(long, prompt, max_new_tokens=30, temperature=0))
    ids = torch.randint(0, 64, (2, 40))
    assert (short(ids).logits - long(ids).logits).abs().max().item() == 0.0
    with pytest.raises(ArgumentError, match="past max_len = 40; generate at most 37 new tokens"):
        generate(short, prompt, max_new_tokens=38, temperature=0, max_len=40)


@pytest.mark.parametrize("kind", _position_types(False))
def test_schemes_with_a_table_keep_the_refusal(kind):
    from modkit.core.errors import ArgumentError

    model = modkit.build(__import__("conftest").tiny_spec(max_seq_len=16, position={"type": kind}), seed=0).eval()
    with pytest.raises(
        ArgumentError, match=rf"max_len = 40 is past the model's max_seq_len = 16, and position type '{kind}'"
    ):
        generate(model, [[1, 2, 3]], max_new_tokens=30, max_len=40)
    with pytest.raises(ArgumentError) as info:
        generate(model, [[1, 2, 3]], max_new_tokens=30, temperature=0)
    assert "max_len=" not in str(info.value)  # no hint that cannot be followed
    assert generate(model, [[1, 2, 3]], max_new_tokens=5, temperature=0, max_len=8).shape == (1, 8)  # below: a limit


@pytest.mark.parametrize(
    "value, fragment",
    [
        (0, r"max_len must be in \[1, 134217728\], got 0"),
        (2**64, r"max_len must be in \[1, 134217728\], got 18446744073709551616"),
        (1.5, "max_len must be an integer, got float 1.5"),
    ],
)
def test_max_len_is_checked(value, fragment):
    from modkit.core.errors import ArgumentError

    model = modkit.build(__import__("conftest").tiny_spec(), seed=0).eval()
    with pytest.raises(ArgumentError, match=fragment):
        generate(model, [[1]], max_new_tokens=1, max_len=value)


def test_sinusoidal_rows_past_the_table_match_the_table_also_compiled():
    """The rows a sinusoidal scheme computes past its table equal the table's own rows (float64 math), eager and
    traced (a traced graph takes every row past the table from the formula)."""
    from modkit_plugins.position import sinusoidal_table

    short, long = _pair({"type": "sinusoidal"}, 8, 40)
    pos = torch.arange(40)[None].repeat(2, 1)
    x = torch.zeros(2, 40, 32)
    want = long.positions[0].embed(x, pos)
    assert torch.equal(want[0], sinusoidal_table(40, 32))
    assert torch.equal(short.positions[0].embed(x, pos), want)
    traced = torch.compile(short.positions[0].embed, backend="eager", fullgraph=True)
    assert torch.equal(traced(x, pos), want)


def test_cli_max_len_generates_past_max_seq_len_with_a_warning(tmp_path, capsys):
    import json

    from conftest import tiny_spec

    spec = tmp_path / "rope16.json"
    spec.write_text(json.dumps(tiny_spec(max_seq_len=16)))
    code, out, err = _cli(["generate", spec, "--prompt", "1 2 3", "--max-new-tokens", 20, "--max-len", 23], capsys)
    assert code == 0, err
    assert len(out.split()) == 20
    assert "modkit: warning: generating up to position 22 (max_len = 23), past the max_seq_len = 16" in err
    from modkit.core.errors import MaxSeqLenWarning

    with pytest.warns(MaxSeqLenWarning):
        expected = generate(
            modkit.build(tiny_spec(max_seq_len=16), seed=0).eval(),
            [[1, 2, 3]],
            max_new_tokens=20,
            temperature=0,
            max_len=23,
        )
    assert out.split() == [str(t) for t in expected[0, 3:].tolist()]
    code, _, err = _cli(["generate", spec, "--prompt", "1 2 3", "--max-new-tokens", 20], capsys)
    assert code == 1 and "or pass max_len=23" in err
    code, _, err = _cli(["generate", spec, "--prompt", "1", "--max-len", 2**64], capsys)
    assert code == 1 and "--max-len must be in [1, 134217728], got 18446744073709551616" in err

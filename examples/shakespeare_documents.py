"""Write tiny shakespeare (shipped with modkit) as a JSON Lines corpus of documents: one speech per record.

A speech is a speaker's name line and what they say, as the text separates them by blank lines (7,222 of them).
The corpus is what the training guide's document-masked run prepares and trains on::

    .venv/bin/python examples/shakespeare_documents.py -o data/speeches.jsonl
    modkit data prepare data/speeches.jsonl -o data/speeches            # an end-of-text token after every speech
    modkit train -c specs/train/shakespeare-char.json --data data/speeches --document-mask -o runs/speeches
    modkit eval runs/speeches/best
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from modkit.data import default_corpus


def speeches(text: str) -> list[str]:
    """The blank-line-separated speeches of ``text``, each without its trailing line break."""
    return [s.strip("\n") for s in text.split("\n\n") if s.strip()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-o", "--output", default="data/speeches.jsonl", help="the .jsonl file to write")
    args = parser.parse_args()
    docs = speeches(default_corpus().read_text(encoding="utf-8"))
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs), encoding="utf-8")
    print(f"wrote {len(docs):,} speeches ({sum(map(len, docs)):,} characters) to {out}")


if __name__ == "__main__":
    main()

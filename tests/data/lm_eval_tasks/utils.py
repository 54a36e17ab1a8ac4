"""Datasets of the local lm-eval tasks: JSON Lines files beside this module, loaded offline (lm-eval calls these
through ``custom_dataset: !function utils.NAME`` in the task YAML files)."""

import json
from pathlib import Path

import datasets

HERE = Path(__file__).resolve().parent


def _load(name: str) -> "datasets.DatasetDict":
    rows = [
        json.loads(line) for line in (HERE / f"{name}.jsonl").read_text(encoding="utf-8").splitlines() if line.strip()
    ]
    return datasets.DatasetDict({"test": datasets.Dataset.from_list(rows)})


def load_choice(**kwargs):
    """Multiple choice: a context, three continuations, the index of the right one."""
    return _load("choice")


def load_rolling(**kwargs):
    """Whole passages for rolling log-likelihood (perplexity, bits per byte)."""
    return _load("rolling")


def load_generate(**kwargs):
    """Prompts to continue until a line break."""
    return _load("generate")

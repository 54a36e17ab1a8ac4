"""A training config naming a tokenizer for data that is already a prepared folder is refused, naming the field.

Before: ``tokenizer: "bpe:abc"`` (not even a tokenizer) or ``"bpe:512"`` beside ``data`` naming a char-prepared folder
was accepted and ignored: the run trained on the folder's char tokens.
"""

from __future__ import annotations

import pytest

from modkit.data import prepare
from modkit.train import TrainError, load_train_config
from modkit.train.resolve import prepared_data


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("prepared-tokenizer")
    (root / "text.txt").write_text("to be or not to be " * 200)
    prepare([root / "text.txt"], root / "prepared", tokenizer="char", show_progress=False)
    return root / "prepared"


@pytest.mark.parametrize("tokenizer", ["bpe:abc", "bpe:512", "other/tokenizer.json"])
def test_a_tokenizer_beside_a_prepared_folder_is_refused(folder, tmp_path, tokenizer):
    config, base = load_train_config({"data": str(folder), "tokenizer": tokenizer})
    with pytest.raises(TrainError) as info:
        prepared_data(config, base, tmp_path / "text")
    assert str(info.value) == (
        f"tokenizer = {tokenizer!r}, but data = {str(folder)!r} is a prepared folder, already tokenized (with 'char'); "
        "tokenizer applies to text data only: remove it, or give the text files as data"
    )


def test_the_default_or_the_folders_own_tokenizer_is_accepted(folder, tmp_path):
    for changes in ({}, {"tokenizer": "char"}):
        config, base = load_train_config({"data": str(folder), **changes})
        assert prepared_data(config, base, tmp_path / "text") == folder

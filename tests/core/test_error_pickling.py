"""Every modkit error survives pickling with its type, message and attributes.

Before: ``SpecError``, ``MemoryLimitError`` and ``ArgumentError`` take other arguments than their message, so
unpickling called ``__init__`` with the message alone and failed (``not enough values to unpack``, ``missing
keyword-only arguments``). A run of ``modkit compare --jobs N`` that failed in a worker process with one of them
reached the user as that unpickling error, or as a broken process pool, instead of the message that names the fix.
"""

from __future__ import annotations

import importlib
import pickle
import pkgutil

import pytest

import modkit
import modkit.experiments.compare
import modkit.analysis.cost
import modkit.data.tokenizer
import modkit.core.errors
import modkit.core.jsonio
import modkit.parallel
import modkit.analysis.trace
import modkit.train.loop
from modkit.core.errors import ArgumentError, MemoryLimitError, ModkitError, SamplingError, SpecError

ERRORS = [
    SpecError([("block.ffn.d_ff", "Input should be greater than 0 (got -1)"), ("", "root problem")], source="a.json"),
    SamplingError([("top_p", "must be in (0, 1]")]),
    MemoryLimitError("would need about 600 GiB", needed=600 * 2**30, available=2**34),
    ArgumentError("--max-new-tokens", "--max-new-tokens must be >= 1, got 0"),
    modkit.train.loop.TrainError("seq_len = 64 exceeds the model's max_seq_len = 32; lower seq_len"),
    modkit.experiments.compare.CompareError("seeds = 0: give 1 or more"),
    modkit.analysis.cost.CostError("no FLOPs declaration"),
    modkit.analysis.trace.TraceError("no tokenizer"),
    modkit.core.jsonio.JSONInputError([("", "Expecting value: line 1, column 1")], "a.json"),
    modkit.parallel.ParallelError("tp does not divide n_heads"),
    modkit.data.tokenizer.UnknownTokenError("'é' is not in the vocabulary", piece="é", position=3, index=None),
]


@pytest.mark.parametrize("error", ERRORS, ids=lambda e: type(e).__name__)
def test_an_error_survives_pickling(error):
    again = pickle.loads(pickle.dumps(error))
    assert type(again) is type(error)
    assert str(again) == str(error) and again.args == error.args
    assert vars(again) == vars(error)  # errors, source, needed, available, name...


def test_every_error_class_is_covered():
    """A new ModkitError subclass with its own __init__ gets a case above (the base class's pickling covers it)."""

    def subclasses(cls):
        for sub in cls.__subclasses__():
            yield sub
            yield from subclasses(sub)

    for info in pkgutil.walk_packages(modkit.__path__, "modkit."):  # every module, so every subclass is defined
        try:
            importlib.import_module(info.name)
        except ImportError:  # an optional extra that is not installed
            continue
    custom = {c for c in subclasses(ModkitError) if "__init__" in vars(c) and c.__module__.startswith("modkit")}
    assert custom <= {type(e) for e in ERRORS}, custom - {type(e) for e in ERRORS}

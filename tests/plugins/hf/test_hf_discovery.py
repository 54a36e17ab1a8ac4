"""The built-in Hugging Face model types are found, not listed: every module of ``modkit_plugins/hf/`` without a
leading underscore that defines ``TYPE`` is registered, and adding a type is adding such a file, nothing else."""

from __future__ import annotations

import ast
import importlib
import shutil
import sys
from pathlib import Path

import modkit
from modkit_plugins import hf

HF_DIR = Path(hf.__file__).resolve().parent


def _defines_type(path: Path) -> bool:
    """Whether the module at ``path`` assigns ``TYPE`` at its top level (read from the source, not imported)."""
    tree = ast.parse(path.read_text())
    targets = [
        t
        for n in tree.body
        if isinstance(n, (ast.Assign, ast.AnnAssign))
        for t in (n.targets if isinstance(n, ast.Assign) else [n.target])
    ]
    return any(isinstance(t, ast.Name) and t.id == "TYPE" for t in targets)


def test_every_type_module_file_is_registered():
    files = sorted(p.stem for p in HF_DIR.glob("*.py") if not p.stem.startswith("_") and _defines_type(p))
    assert len(files) >= 31
    assert list(hf.type_modules()) == files and hf.MODULES == hf.type_modules()
    registry = modkit.get_registry()
    for name in files:
        declared = importlib.import_module(f"modkit_plugins.hf.{name}").TYPE
        assert registry.hf_converter(declared.model_type).declaration is declared, name


def test_a_new_type_module_is_all_it_takes(tmp_path, monkeypatch):
    """In a copy of the package, a new ``my_llama.py`` defining ``TYPE`` is registered; a module without ``TYPE``
    and an underscore module are not."""
    copy = tmp_path / "mk_hf_copy"
    shutil.copytree(HF_DIR, copy, ignore=shutil.ignore_patterns("__pycache__"))
    (copy / "my_llama.py").write_text(
        "from .llama import LLAMA\n\n"
        "MODEL_TYPE = 'my_llama'\n"
        "TYPE = LLAMA.derive(MODEL_TYPE, architecture='MyLlamaForCausalLM', defaults={'hidden_size': 64})\n"
    )
    (copy / "helpers.py").write_text("WIDTH = 64\n")
    (copy / "_draft.py").write_text("from .llama import LLAMA\n\nTYPE = LLAMA.derive('my_draft', architecture='X')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        package = importlib.import_module("mk_hf_copy")
        assert "my_llama" in package.type_modules()
        assert "helpers" not in package.type_modules() and "_draft" not in package.type_modules()
        reg = modkit.Registry()
        for info in modkit.get_registry().plugins():  # the components, not the built-in model types
            if info.obj is not hf:
                reg.register_plugin(info.obj, info.name)
        reg.register_plugin(package, "hf-copy")
        assert "my_llama" in reg.hf_model_types() and "my_draft" not in reg.hf_model_types()
        assert len(reg.hf_model_types()) == len(hf.type_modules()) + 1
        spec = modkit.from_hf_config(
            {
                "model_type": "my_llama",
                "num_attention_heads": 4,
                "num_hidden_layers": 1,
                "intermediate_size": 32,
                "vocab_size": 50,
            },
            registry=reg,
        )
        assert spec.d_model == 64
    finally:
        for name in [m for m in sys.modules if m == "mk_hf_copy" or m.startswith("mk_hf_copy.")]:
            del sys.modules[name]

"""``modkit new plugin``: the skeleton it writes installs, registers, and passes the contract kit unchanged.

End to end for ``--kind norm`` and ``--kind ffn``: scaffold with the ``modkit`` command, pip-install the packages
(copied to a temporary folder, ``--target``, offline where possible) and run ``modkit check --plugin NAME`` and
the skeleton's own ``tests/`` in fresh processes. In process, for every kind: the generated component builds
into a model that runs and decodes with a KV cache exactly like its full forward; plus the refusals (existing
directory, bad names, a type that is already taken).
"""

from __future__ import annotations

import copy
import importlib
import subprocess
import sys
import time

import pytest

from tests.conftest import HANG_TIMEOUT, env_with, pip_install_copies
import torch

import modkit
from modkit import cli

#: pip-installs packages: end to end, left out of make test-fast
from modkit.cli import scaffold

#: pip-installs packages: end to end, left out of make test-fast
pytestmark = pytest.mark.slow

TINY = {
    "schema_version": 1,
    "name": "scaffold-probe",
    "vocab_size": 64,
    "d_model": 32,
    "n_layers": 2,
    "max_seq_len": 64,
    "position": {"type": "rope", "theta": 10000.0},
    "block": {
        "attention": {"type": "gqa", "n_heads": 4, "n_kv_heads": 2},
        "ffn": {"type": "swiglu", "d_ff": 64},
        "norm": {"type": "rmsnorm", "eps": 1e-5},
        "placement": {"type": "pre"},
    },
    "final_norm": {"type": "rmsnorm", "eps": 1e-5},
}


def new_plugin(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(["new", "plugin", *map(str, argv)])
    out, err = capsys.readouterr()
    return code, out, err


# ------------------------------------------------------------------------------------------------ end to end


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """Scaffold my-norms (norm) and my-ffns (ffn), install both once, run the checks and their tests concurrently."""
    work = tmp_path_factory.mktemp("scaffold")
    for name, kind in (("my-norms", "norm"), ("my-ffns", "ffn")):
        assert cli.main(["new", "plugin", name, "--kind", kind, "-o", str(work / "new")]) == 0
    # install copies, so the scaffolded folders stay exactly as written
    site, install_s, proc = pip_install_copies([work / "new" / "my-norms", work / "new" / "my-ffns"], work)
    assert proc.returncode == 0, f"pip install failed:\n{proc.stdout}\n{proc.stderr}"
    env = env_with(site)
    commands = {
        "check": ["-m", "modkit", "check", "--plugin", "my-norms", "--plugin", "my-ffns"],
        # the skeletons' own tests, run against the installed packages (importlib mode: two tests/ folders)
        "pytest": [
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "--import-mode=importlib",
            str(work / "new" / "my-norms" / "tests"),
            str(work / "new" / "my-ffns" / "tests"),
        ],
    }
    start = time.perf_counter()
    procs = {
        n: subprocess.Popen(
            [sys.executable, *a], env=env, cwd=work, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for n, a in commands.items()
    }
    results = {}
    try:
        for n, p in procs.items():
            out, err = p.communicate(timeout=HANG_TIMEOUT)
            results[n] = subprocess.CompletedProcess(p.args, p.returncode, out, err)
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
    results["_seconds"] = {"install": install_s, "commands": time.perf_counter() - start}
    return work, site, results


def test_skeleton_layout(installed):
    work, site, _ = installed
    root = work / "new" / "my-norms"
    assert sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()) == [
        "README.md",
        "my_norms/__init__.py",
        "my_norms/norm.py",
        "pyproject.toml",
        "tests/testing/test_contracts.py",
    ]
    pyproject = (root / "pyproject.toml").read_text()
    assert 'name = "my-norms"' in pyproject
    assert '[project.entry-points.modkit]\nmy-norms = "my_norms"' in pyproject
    assert (site / "my_norms" / "norm.py").is_file() and (site / "my_ffns" / "ffn.py").is_file()


def test_scaffolded_plugins_pass_the_contract_kit(installed):
    r = installed[2]["check"]  # --plugin selects by entry-point name: the scaffold's entry point is NAME
    assert r.returncode == 0, r.stdout + r.stderr
    rows = {line.split()[0] for line in r.stdout.splitlines()[1:] if line.strip()}
    assert {"norm/my_norms", "ffn/my_ffns"} <= rows, r.stdout
    assert "0 failed" in r.stdout


def test_scaffolded_tests_pass(installed):
    r = installed[2]["pytest"]
    assert r.returncode == 0, r.stdout + r.stderr
    assert "4 passed" in r.stdout, r.stdout


def test_timings_are_reported(installed, capsys):
    seconds = installed[2]["_seconds"]
    with capsys.disabled():
        print(
            f"\nscaffold: pip install (2 packages) {seconds['install']:.1f}s; checks + skeleton tests {seconds['commands']:.1f}s"
        )


# ------------------------------------------------------------------------------------------------ refusals


def test_refuses_to_overwrite(tmp_path, capsys):
    code, out, err = new_plugin(capsys, "my-norms", "--kind", "norm", "-o", tmp_path)
    assert code == 0 and "pip install -e ." in out
    marker = tmp_path / "my-norms" / "my_norms" / "norm.py"
    marker.write_text("# edited by the author\n")
    code, out, err = new_plugin(capsys, "my-norms", "--kind", "ffn", "-o", tmp_path)
    assert code == 1 and out == ""
    assert "already exists" in err and "refusing to overwrite" in err and "Traceback" not in err
    assert marker.read_text() == "# edited by the author\n"
    (tmp_path / "taken").mkdir()
    code, _, err = new_plugin(capsys, "taken", "--kind", "norm", "-o", tmp_path)
    assert code == 1 and "already exists" in err


@pytest.mark.parametrize(
    "name, why",
    [
        ("My-Norms", "lowercase"),
        ("2norms", "starting with a letter"),
        ("my--norms", "single '-'"),
        ("my norms", "lowercase"),
        ("my.norms", "lowercase"),
        ("my-", "lowercase"),
        ("json", "standard-library"),
        ("plugins", "reserved"),
        ("modkit", "reserved"),
        ("modkit-lm", "modkit's own distribution"),
        ("modkit_lm", "modkit's own distribution"),
        ("class", "keyword"),
    ],
)
def test_bad_names_are_refused(tmp_path, capsys, name, why):
    code, out, err = new_plugin(capsys, name, "--kind", "norm", "-o", tmp_path)
    assert code == 1, err
    assert err.startswith("modkit: error: ") and why in err and "Traceback" not in err
    assert not any(tmp_path.iterdir())  # nothing written


def test_bad_type_and_taken_names_are_refused(tmp_path, capsys):
    code, _, err = new_plugin(capsys, "my-norms", "--kind", "norm", "--type", "Bad Type", "-o", tmp_path)
    assert code == 1 and "invalid component type" in err
    code, _, err = new_plugin(capsys, "my-norms", "--kind", "norm", "--type", "rmsnorm", "-o", tmp_path)
    assert code == 1 and "already provided by builtin-norm" in err
    code, _, err = new_plugin(capsys, "builtin-norm", "--kind", "norm", "--type", "fresh", "-o", tmp_path)
    assert code == 1 and "a plugin named 'builtin-norm' is already installed" in err
    assert not any(tmp_path.iterdir())


def test_usage_errors_exit_2(tmp_path, capsys):
    assert cli.main(["new", "plugin", "x-y", "--kind", "router", "-o", str(tmp_path)]) == 2
    assert cli.main(["new", "plugin", "x-y", "-o", str(tmp_path)]) == 2  # --kind is required
    assert "--kind" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------------ every kind, in process


@pytest.mark.parametrize("kind", scaffold.KINDS)
def test_every_kind_builds_runs_and_decodes(tmp_path, monkeypatch, kind):
    name = f"scaffold-probe-{kind}"
    root = scaffold.scaffold_plugin(name, kind, output=tmp_path)
    monkeypatch.syspath_prepend(str(root))
    mod = scaffold.import_name(name)
    module = importlib.import_module(mod)
    source = (root / mod / f"{kind}.py").read_text()
    assert source.startswith(f'"""``{kind}/{mod}``') and "class " in source and "COMPONENT = Component(" in source

    reg = modkit.Registry()
    reg.load_entry_points(strict=True)
    reg.register_plugin(module, name)
    entry = reg.get(kind, mod)
    assert entry.provider.plugin == name and entry.description and entry.reference

    spec = copy.deepcopy(TINY)
    if kind == "position":
        spec["position"] = entry.example_config()
    elif kind == "mixer":  # the token-mixing slot, written 'mixer'; no queries or keys for rope to act on
        del spec["block"]["attention"]
        spec["block"]["mixer"], spec["position"] = entry.example_config(), {"type": "none"}
    else:
        spec["block"][kind] = entry.example_config()
    if kind == "norm":
        spec["final_norm"] = entry.example_config()
    spec = modkit.load_spec(spec, registry=reg)
    model = modkit.build(spec, seed=0, registry=reg)
    assert {(m.modkit_kind, m.modkit_type) for m in model.modules() if hasattr(m, "modkit_type")} >= {(kind, mod)}
    assert modkit.count_params(spec, registry=reg) == sum(p.numel() for p in model.parameters())

    ids = torch.randint(0, spec.vocab_size, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        full = model(ids).logits
        cache = model.new_cache()
        steps = [model(ids[:, :4], cache=cache).logits] + [
            model(ids[:, t : t + 1], cache=cache).logits for t in range(4, 9)
        ]
    assert torch.isfinite(full).all()
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-4)


def test_attention_skeleton_passes_the_contract_kit(tmp_path, monkeypatch):
    """The most involved skeleton (mask by position, cache, padding, GQA) against the whole kit, in process."""
    from modkit.testing import check_component

    root = scaffold.scaffold_plugin("scaffold-kit-attention", "attention", output=tmp_path)
    monkeypatch.syspath_prepend(str(root))
    reg = modkit.Registry()
    reg.load_entry_points(strict=True)
    reg.register_plugin(importlib.import_module("scaffold_kit_attention"), "scaffold-kit-attention")
    results = check_component("attention", "scaffold_kit_attention", registry=reg)
    failed = [r for r in results if r.status == "failed"]
    assert not failed, "\n".join(f"{r.check}: {r.detail}" for r in failed)
    passed = {r.check for r in results if r.status == "passed"}
    assert {
        "causality",
        "kv_cache_decode",
        "gqa_equals_mha",
        "masked_row",
        "param_count",
        "position_sensitivity",
        "precision",
    } <= passed
    # the mask, the dead-row guard and the cache come from modkit's helpers, not from copied code
    source = (root / "scaffold_kit_attention" / "attention.py").read_text()
    forward = source[source.index("    def forward(") : source.index("def _head_dim(")]
    for helper in ("update_cache(inputs, k, v, mixer=self)", "prepare_mask(", "position_bias(", "masked_attention("):
        assert helper in forward, helper
    assert "inputs.cache.update" not in forward and "any(-1" not in forward and "masked_fill" not in forward


def test_mixer_skeleton_passes_the_contract_kit_and_decodes_from_its_declared_state(tmp_path, monkeypatch):
    """``--kind mixer``: the recurrent skeleton, generated into tmp, against the whole kit as written; its state is
    the declared per-sequence entry and nothing else: decoding from the cache equals the full forward (again after
    ``cache.reset()``), zeroing that entry changes the next token's logits, a forward adds no tensor to the module,
    and the cache holds ``d_inner`` float32 numbers per layer and sequence, whatever the length."""
    from modkit.testing import check_component

    root = scaffold.scaffold_plugin("scaffold-kit-mixer", "mixer", output=tmp_path)
    monkeypatch.syspath_prepend(str(root))
    reg = modkit.Registry()
    reg.load_entry_points(strict=True)
    reg.register_plugin(importlib.import_module("scaffold_kit_mixer"), "scaffold-kit-mixer")
    results = check_component("mixer", "scaffold_kit_mixer", registry=reg)
    failed = [r for r in results if r.status == "failed"]
    assert not failed, "\n".join(f"{r.check}: {r.detail}" for r in failed)
    passed = {r.check for r in results if r.status == "passed"}
    assert {
        "causality",
        "kv_cache_decode",
        "masked_row",
        "meta_init",
        "param_count",
        "param_roles",
        "flops",
        "precision",
    } <= passed

    spec = copy.deepcopy(TINY)
    del spec["block"]["attention"]
    spec["block"]["mixer"], spec["position"] = {"type": "scaffold_kit_mixer", "expand": 2}, {"type": "none"}
    model = modkit.build(modkit.load_spec(spec, registry=reg), seed=0, registry=reg).eval()
    mixer = model.layers[0].attention
    tensors = lambda: {k: v for k, v in vars(mixer).items() if isinstance(v, torch.Tensor)}  # noqa: E731
    before = tensors()
    ids = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        full = model(ids).logits
        cache = model.new_cache(2, 12)
        for _ in range(2):
            steps = [model(ids[:, :5], cache=cache).logits]
            steps += [model(ids[:, t : t + 1], cache=cache).logits for t in range(5, 12)]
            torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=1e-4)
            cache.reset()
        model(ids[:, :11], cache=cache)
        state = cache.layers[0].state(mixer)
        assert tuple(state["h"].shape) == (2, 64) and state["h"].dtype == torch.float32 and state["h"].abs().sum() > 0
        state.write("h", torch.zeros_like(state["h"]))
        assert (model(ids[:, 11:], cache=cache).logits - full[:, 11:]).abs().max() > 1e-3  # it decodes from h
    assert tensors() == before
    assert cache.nbytes() == 2 * 2 * 64 * 4  # 2 layers x batch 2 x d_inner 64 float32
    source = (root / "scaffold_kit_mixer" / "mixer.py").read_text()
    forward = source[source.index("    def forward(") : source.index("def _d_inner(")]
    assert "inputs.cache_for(self)" in forward and 'state.write("h", h)' in forward and "self.h" not in forward
    assert 'CacheEntry("h", (self.d_inner,), growth="sequence", dtype=torch.float32)' in source

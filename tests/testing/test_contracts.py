"""The contract kit on the built-in components: every applicable check passes, and all three front ends work.

* :func:`modkit.testing.check_component` on every built-in registry entry (parametrised), no failures;
* the capabilities decide what runs (a ``kv_cache`` attention is decoded, a ``compile_safe`` entry compiled...);
* the pytest plugin (``pytest --modkit-contracts``) in a directory with no tests and no conftest, via ``pytester``;
* ``modkit check`` through an argparse parser built here and through :func:`modkit.cli.main`.
"""

from __future__ import annotations

import argparse
import io
import warnings

import pytest

import modkit
from modkit.testing import CHECK_NAMES, CheckResult, check_component, run_checks, select_components
from modkit.testing.cli import add_subcommands, render

pytest_plugins = ["pytester"]


def _builtin_entries() -> list[modkit.Component]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        reg = modkit.get_registry()
    return [c for c in reg.components() if c.provider is not None and c.provider.distribution == "modkit-lm"]


BUILTINS = _builtin_entries()


def test_builtins_are_registered():
    kinds = {c.kind for c in BUILTINS}
    assert {"attention", "ffn", "norm", "placement", "position"} <= kinds


@pytest.mark.parametrize("entry", BUILTINS, ids=[f"{c.kind}/{c.type}" for c in BUILTINS])
def test_builtin_component_passes_its_contracts(entry):
    results = check_component(entry.kind, entry.type)
    assert [r.check for r in results] == list(CHECK_NAMES)
    assert all(r.component == f"{entry.kind}/{entry.type}" for r in results)
    failed = [f"{r.id}: {r.detail}" for r in results if r.status == "failed"]
    assert not failed, "\n".join(failed)
    # every built-in has a usable example: nothing is skipped for want of a config
    no_example = [r.id for r in results if r.detail.startswith("no example config")]
    assert not no_example, f"built-in entries without a usable example: {no_example}"
    for r in results:
        assert r.detail, f"{r.id} has no detail"
    # the same results, once per entry (under pytest-xdist a module-wide cache is per worker: a second test over
    # every entry ran the whole kit again on the other worker)
    _assert_capabilities_decide_which_checks_run(entry, {r.check: r for r in results})


def _assert_capabilities_decide_which_checks_run(entry: modkit.Component, got: dict[str, CheckResult]) -> None:
    """The checks that ran on ``entry`` (``{check name: result}``) are the ones its kind and capabilities call for."""
    caps = entry.capabilities
    assert got["spec_roundtrip"].status == "passed"
    if entry.kind in ("logits_processor", "stop_condition"):  # not part of a model: their own contract only
        assert got["sampling"].status == "passed", got["sampling"]
        assert {n for n, r in got.items() if r.status == "passed"} == {"spec_roundtrip", "sampling"}
        return
    if entry.kind == "tracker":  # not part of a model: its config round-trips; tests/train/test_trackers.py logs runs
        assert {n for n, r in got.items() if r.status == "passed"} == {"spec_roundtrip"}
        return
    if entry.kind == "optimizer":  # not part of a model either: trained on the check's own tiny model
        assert {n for n, r in got.items() if r.status == "passed"} == {"spec_roundtrip", "optimizer"}, got["optimizer"]
        return
    assert got["sampling"].status == "skipped" and got["optimizer"].status == "skipped"
    # a residual stream is checked by its own contract; every other model component skips that check
    assert (got["stream"].status == "passed") == (entry.kind == "stream"), got["stream"]
    assert got["param_roles"].status == "passed" or got["param_roles"].detail == "the component has no parameters"
    assert got["shape_dtype"].status == "passed"
    assert got["meta_init"].status == "passed"
    assert got["causality"].status == "passed"
    assert (got["compile"].status == "passed") == bool(caps.get("compile_safe")), got["compile"]
    assert (got["aux_loss_grad"].status == "passed") == bool(caps.get("aux_loss") or entry.kind == "router"), got[
        "aux_loss_grad"
    ]
    assert (got["per_token"].status == "passed") == (entry.kind in ("ffn", "norm", "router", "activation")), got[
        "per_token"
    ]
    # a stream has no [batch, seq, d_model] call of its own: the stream check runs it in float32 and bfloat16
    assert got["precision"].status == ("skipped" if entry.kind == "stream" else "passed"), got["precision"]
    declares_dropout = (entry.kind, bool(caps.get("attention_dropout")), bool(caps.get("residual_dropout"))) in (
        ("attention", True, False),
        ("placement", False, True),
    )
    assert (got["dropout"].status == "passed") == declares_dropout, got["dropout"]
    # a token mixer that declares a position geometry (an attention, a hybrid holding one), schemes that act
    senses = (
        entry.kind in ("attention", "mixer") and "position geometry" not in got["position_sensitivity"].detail
    ) or (entry.kind == "position" and caps.get("acts_on") != "none")
    assert (got["position_sensitivity"].status == "passed") == senses, got["position_sensitivity"]
    # neighbours are built-ins only, and say so
    assert got["causality"].neighbours and all(r.neighbours == got["causality"].neighbours for r in got.values())
    assert (got["param_count"].status == "passed") == (entry.param_count is not None), got["param_count"]
    for check in ("cache_state", "long_decode"):  # any kind that declares a decoding state
        assert (got[check].status == "passed") == bool(caps.get("kv_cache")), got[check]
    if entry.kind == "attention":
        assert (got["kv_cache_decode"].status == "passed") == bool(caps.get("kv_cache"))
        assert got["masked_row"].status == "passed"
    else:
        assert got["gqa_equals_mha"].status == "skipped"


def test_capabilities_decide_which_checks_run():
    """What no single entry shows: the kinds that are not part of a model are there, at least one attention
    exercises grouping, and decoding ran against every registered position scheme. (Which checks run on each
    entry is asserted with its contracts, in ``test_builtin_component_passes_its_contracts``.)"""
    assert {e.kind for e in BUILTINS} >= {"logits_processor", "stop_condition", "optimizer"}
    # the first built-in attention (registry order) whose gqa_equals_mha passes, then its kv_cache_decode: only the
    # checks these assertions read
    gqa = None
    for e in BUILTINS:
        if e.kind == "attention" and check_component(e.kind, e.type, checks=["gqa_equals_mha"])[0].status == "passed":
            gqa = e
            break
    assert gqa is not None, "no built-in attention ran gqa_equals_mha"
    positions = [e.type for e in BUILTINS if e.kind == "position"]
    decode = check_component(gqa.kind, gqa.type, checks=["kv_cache_decode"])[0].detail
    assert all(p in decode for p in positions), decode


def test_check_component_options():
    res = check_component(
        "norm", "rmsnorm", {"type": "rmsnorm", "eps": 1e-5, "unit_offset": True}, checks=["shape_dtype", "meta_init"]
    )
    assert [(r.check, r.status) for r in res] == [("shape_dtype", "passed"), ("meta_init", "passed")]
    with pytest.raises(modkit.RegistryError, match="did you mean 'rmsnorm'"):
        check_component("norm", "rmsnrom")
    with pytest.raises(modkit.SpecError):
        check_component("norm", "rmsnorm", {"type": "rmsnorm", "epsilon": 1.0})
    with pytest.raises(modkit.SpecError, match="not 'rmsnorm'"):
        check_component("norm", "rmsnorm", {"type": "layernorm"})
    with pytest.raises(ValueError, match="unknown check 'causalty'"):
        check_component("norm", "rmsnorm", checks=["causalty"])


def test_select_components_filters():
    assert {c.kind for c in select_components(kind="norm")} == {"norm"}
    assert [c.type for c in select_components(kind="attention", type="g*")] == ["gqa"]
    plugin = select_components(kind="norm")[0].provider.plugin
    assert all(c.provider.plugin == plugin for c in select_components(plugin=plugin))
    with pytest.raises(modkit.RegistryError, match="no registered component matches kind 'nope'"):
        select_components(kind="nope")


# ----------------------------------------------------------------------------------------------- pytest plugin


def test_pytest_plugin_runs_the_suite_without_conftest(pytester):
    result = pytester.runpytest("--modkit-contracts", "--modkit-kind", "norm", "-v", "-p", "no:cacheprovider")
    result.stdout.fnmatch_lines(
        [
            "*modkit contracts: kind=norm on cpu*",
            "*norm/layernorm::spec_roundtrip PASSED*",
            "*norm/rmsnorm::causality PASSED*",
            "*norm/rmsnorm::gqa_equals_mha SKIPPED (gqa_equals_mha: not a token mixer)*",
            "*norm/rmsnorm::meta_init PASSED*",
        ]
    )
    n_norms = len([c for c in BUILTINS if c.kind == "norm"])
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed", 0) == 0
    assert outcomes["passed"] + outcomes["skipped"] == n_norms * len(CHECK_NAMES)
    assert result.ret == 0


def test_pytest_plugin_is_inert_without_the_flag(pytester):
    pytester.makepyfile("def test_one():\n    assert True\n")
    result = pytester.runpytest("-v", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    assert "::causality" not in result.stdout.str()


def test_pytest_plugin_selection_and_failures(pytester):
    from tests.testing.test_kit_catches_faults import FaultyPlugin

    reg = modkit.get_registry()
    reg.register_plugin(FaultyPlugin(), "faulty-pytest-demo")
    try:
        result = pytester.runpytest(
            "--modkit-contracts",
            "--modkit-plugin",
            "faulty-pytest-demo",
            "--modkit-type",
            "miscounted",
            "-k",
            "param_count or shape_dtype",
            "-p",
            "no:cacheprovider",
            "-rf",
        )
        result.assert_outcomes(passed=1, failed=1, deselected=len(CHECK_NAMES) - 2)
        result.stdout.fnmatch_lines(
            ["*norm/miscounted::param_count failed: declared 33 parameters, the module holds 32*"]
        )
        bad = pytester.runpytest("--modkit-contracts", "--modkit-kind", "nope", "-p", "no:cacheprovider")
        assert bad.ret == pytest.ExitCode.USAGE_ERROR
        bad.stderr.fnmatch_lines(["*--modkit-contracts: no registered component matches kind 'nope'*"])
    finally:
        reg.unregister_plugin("faulty-pytest-demo")


# ----------------------------------------------------------------------------------------------- modkit check


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="modkit")
    add_subcommands(parser.add_subparsers(dest="command"))
    return parser


def test_modkit_check_subcommand_prints_a_table():
    args = _parser().parse_args(["check", "--kind", "position", "--type", "rope", "--type", "none"])
    out = io.StringIO()
    assert args.func(args, out=out) == 0
    lines = out.getvalue().splitlines()
    assert lines[0].split() == ["component", *CHECK_NAMES, "neighbours"]
    assert lines[1].split()[0] == "position/none" and lines[2].split()[0] == "position/rope"
    assert set(lines[1].split()[1 : 1 + len(CHECK_NAMES)]) <= {"passed", "skip"}
    assert lines[1].endswith("attention gqa, ffn geglu, norm layernorm, placement pre")
    assert lines[-1].startswith("2 component(s): ") and "0 failed" in lines[-1]


def test_render_marks_failures():
    results = [
        CheckResult("norm/x", "spec_roundtrip", "passed", "ok"),
        CheckResult("norm/x", "causality", "failed", "max |Δ| = 0.31 at position 2 after changing token 5"),
        CheckResult("norm/x", "compile", "skipped", "the entry does not claim compile_safe"),
    ]
    text = "\n".join(render(results))
    assert text.splitlines()[1].split() == ["norm/x", "passed", "FAILED", "skip", "-"]
    assert "FAILED norm/x::causality: max |Δ| = 0.31 at position 2 after changing token 5" in text


def test_modkit_main_check(capsys):
    cli = pytest.importorskip("modkit.cli")
    rc = cli.main(["check", "--kind", "norm", "--type", "rmsnorm", "--check", "causality", "--check", "shape_dtype"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert out.splitlines()[0].split() == ["component", "shape_dtype", "causality", "neighbours"]
    assert "norm/rmsnorm" in out
    assert cli.main(["check", "--kind", "nope"]) == 1
    assert "no registered component matches kind 'nope'" in capsys.readouterr().err


def test_run_checks_over_a_selection():
    res = run_checks(kind="placement", type="pre", checks=["causality"])
    assert [(r.id, r.status) for r in res] == [("placement/pre::causality", "passed")]


def test_modkit_check_names_neighbours(capsys):
    args = _parser().parse_args(
        [
            "check",
            "--kind",
            "norm",
            "--type",
            "rmsnorm",
            "--check",
            "causality",
            "--neighbour",
            "attention=mha",
            "--neighbour",
            "ffn=swiglu",
        ]
    )
    out = io.StringIO()
    assert args.func(args, out=out) == 0
    row = out.getvalue().splitlines()[1]
    assert row.split()[:2] == ["norm/rmsnorm", "passed"]
    assert row.endswith("attention mha (named), ffn swiglu (named), placement pre, position rope")
    with pytest.raises(SystemExit):
        _parser().parse_args(["check", "--neighbour", "attention"])
    assert "expected KIND=TYPE" in capsys.readouterr().err


def test_pytest_plugin_takes_named_neighbours(pytester):
    result = pytester.runpytest(
        "--modkit-contracts",
        "--modkit-type",
        "rmsnorm",
        "--modkit-check",
        "masked_row",
        "--modkit-check",
        "causality",
        "--modkit-neighbour",
        "attention=mha",
        "-p",
        "no:cacheprovider",
    )
    result.assert_outcomes(passed=1, skipped=1)
    result.stdout.fnmatch_lines(
        ["*modkit contracts: type=rmsnorm check=masked_row,causality on cpu; neighbours: built-ins and attention=mha*"]
    )
    for arg, message in (("attention", "expected KIND=TYPE"), ("attention=nope", "unknown attention type 'nope'")):
        bad = pytester.runpytest("--modkit-contracts", "--modkit-neighbour", arg, "-p", "no:cacheprovider")
        assert bad.ret == pytest.ExitCode.USAGE_ERROR
        bad.stderr.fnmatch_lines([f"*--modkit-contracts: *{message}*"])

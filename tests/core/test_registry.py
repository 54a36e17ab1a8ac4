"""Registry and plugin loading: isolation (a failed registration leaves nothing behind), strict mode,
duplicates, clashes."""

import types
import warnings
from typing import Literal

import pytest
from torch import nn

import modkit
from modkit import Component, ComponentConfig, Registry, RegistryError, hookimpl
from modkit.core import registry as registry_mod


class DummyConfig(ComponentConfig):
    type: Literal["dummy"] = "dummy"


def _component(type_="dummy", config=DummyConfig):
    return Component(kind="norm", type=type_, config=config, factory=lambda c, x: nn.Identity(), description="identity")


def _plugin(**hooks):
    return types.SimpleNamespace(**{k: hookimpl(v) for k, v in hooks.items()})


def test_c14_failed_registration_leaves_nothing_behind():
    reg = Registry()

    def register_components(register):
        register(_component())

    def register_hf_converters(wrong_name):  # invalid: argument name not in the hook spec
        pass

    broken = _plugin(register_components=register_components, register_hf_converters=register_hf_converters)
    with pytest.raises(RegistryError, match="invalid hook implementation"):
        reg.register_plugin(broken, "broken")
    assert reg.components() == []
    assert reg.plugins() == []
    pm = reg.plugin_manager
    assert pm.get_plugins() == set()
    assert pm.hook.register_components.get_hookimpls() == []
    # fixed, it registers fine under the same name
    fixed = _plugin(register_components=register_components)
    reg.register_plugin(fixed, "broken")
    assert [c.key for c in reg.components()] == [("norm", "dummy")]
    assert len(pm.hook.register_components.get_hookimpls()) == 1


def test_hook_that_raises_mid_way_registers_nothing():
    reg = Registry()

    def register_components(register):
        register(_component("dummy"))
        raise RuntimeError("boom")

    with pytest.raises(RegistryError, match="boom"):
        reg.register_plugin(_plugin(register_components=register_components), "half")
    assert reg.components() == [] and reg.plugins() == []


def test_malformed_entry_is_rejected_with_reason():
    reg = Registry()

    def register_components(register):
        register(_component("other"))  # config's Literal does not include "other"

    with pytest.raises(RegistryError, match="Literal"):
        reg.register_plugin(_plugin(register_components=register_components), "bad")


def test_name_clash_names_both_providers():
    reg = Registry()

    def register_components(register):
        register(_component())

    reg.register_plugin(_plugin(register_components=register_components), "first", distribution="pkg-a", version="1.0")
    with pytest.raises(RegistryError) as info:
        reg.register_plugin(
            _plugin(register_components=register_components), "second", distribution="pkg-b", version="2.0"
        )
    text = str(info.value)
    assert "first (pkg-a 1.0)" in text and "second (pkg-b 2.0)" in text
    assert [p.name for p in reg.plugins()] == ["first"]


class _FakeDist:
    def __init__(self, name, version="0.1"):
        self.metadata = {"Name": name}
        self.version = version


class _FakeEP:
    def __init__(self, name, obj=None, error=None, dist="fake-dist"):
        self.name, self.value, self._obj, self._error = name, f"fake.{name}", obj, error
        self.dist = _FakeDist(dist)

    def load(self):
        if self._error:
            raise self._error
        return self._obj


def _good_plugin(type_="dummy"):
    class Cfg(ComponentConfig):
        type: Literal[type_] = type_  # type: ignore[valid-type]

    def register_components(register):
        register(_component(type_, Cfg))

    return _plugin(register_components=register_components)


def test_broken_plugin_warns_and_others_load(monkeypatch):
    eps = [
        _FakeEP("aaa-broken", error=ImportError("no module named nowhere")),
        _FakeEP("good", _good_plugin()),
        _FakeEP("good", _good_plugin()),  # same distribution + entry point found twice: loads once
    ]
    monkeypatch.setattr(registry_mod.md, "entry_points", lambda group: eps)
    monkeypatch.delenv("MODKIT_STRICT_PLUGINS", raising=False)
    reg = Registry()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        reg.load_entry_points()
    messages = [str(w.message) for w in caught if issubclass(w.category, registry_mod.PluginWarning)]
    assert len(messages) == 1 and "aaa-broken" in messages[0] and "no module named nowhere" in messages[0]
    assert [p.name for p in reg.plugins()] == ["good"]
    assert reg.plugins()[0].provider.distribution == "fake-dist"
    assert "aaa-broken" in reg.skipped_plugins()


def test_strict_mode_turns_failures_into_errors(monkeypatch):
    eps = [_FakeEP("broken", error=ImportError("nope"))]
    monkeypatch.setattr(registry_mod.md, "entry_points", lambda group: eps)
    monkeypatch.setenv("MODKIT_STRICT_PLUGINS", "1")
    with pytest.raises(RegistryError, match="broken.*nope"):
        Registry().load_entry_points()


def test_builtins_load_through_entry_points():
    reg = modkit.get_registry()
    names = {p.name for p in reg.plugins()}
    assert {"builtin-attention", "builtin-norm", "builtin-ffn", "builtin-position", "builtin-placement"} <= names
    entry = reg.get("norm", "rmsnorm")
    assert entry.provider.distribution == "modkit-lm" and entry.provider.version == modkit.__version__
    assert entry.capabilities["compile_safe"] is True
    assert reg.get("attention", "gqa").capabilities["kv_cache"] is True


def test_unknown_lookup_suggests():
    reg = modkit.get_registry()
    with pytest.raises(RegistryError, match="did you mean 'rmsnorm'"):
        reg.get("norm", "rmsnrom")
    with pytest.raises(RegistryError, match="did you mean 'attention'"):
        reg.get("atention", "gqa")


def test_third_party_component_validates_like_a_builtin():
    reg = Registry()
    for p in modkit.get_registry().plugins():
        reg.register_plugin(p.obj, p.name)
    reg.register_plugin(_good_plugin("scalenorm"), "third-party")
    from tests.conftest import tiny_spec

    spec = modkit.load_spec(tiny_spec(block__norm={"type": "scalenorm"}), registry=reg)
    model = modkit.build(spec, registry=reg, device="meta")
    assert isinstance(model.layers[0].attn_norm, nn.Identity)
    with pytest.raises(modkit.SpecError, match="unknown field 'eps' for 'scalenorm'"):
        modkit.load_spec(tiny_spec(block__norm={"type": "scalenorm", "eps": 1.0}), registry=reg)


def test_same_plugin_name_from_two_distributions_is_reported(monkeypatch):
    eps = [_FakeEP("extra", _good_plugin("one"), dist="pkg-a"), _FakeEP("extra", _good_plugin("two"), dist="pkg-b")]
    monkeypatch.setattr(registry_mod.md, "entry_points", lambda group: eps)
    monkeypatch.delenv("MODKIT_STRICT_PLUGINS", raising=False)
    reg = Registry()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        reg.load_entry_points()
    (message,) = [str(w.message) for w in caught if issubclass(w.category, registry_mod.PluginWarning)]
    assert "pkg-a" in message and "pkg-b" in message and "\n" not in message
    assert reg.types("norm") == ["one"]
    monkeypatch.setenv("MODKIT_STRICT_PLUGINS", "1")
    with pytest.raises(RegistryError, match="already taken"):
        Registry().load_entry_points()


# ------------------------------------------------------------------------------------------------ aliases


class OtherConfig(ComponentConfig):
    type: Literal["other"] = "other"


def test_alias_is_a_second_name_of_one_entry():
    reg = Registry()
    entry = Component(
        kind="norm",
        type="dummy",
        config=DummyConfig,
        factory=lambda c, x: nn.Identity(),
        description="identity",
        aliases=("dum",),
    )
    reg.register_plugin(_plugin(register_components=lambda register: register(entry)), "p")
    assert reg.types("norm") == ["dummy"] and reg.aliases("norm") == {"dum": "dummy"}
    assert reg.get("norm", "dum") is reg.get("norm", "dummy")
    assert len(reg.components("norm")) == 1
    assert reg.resolve("norm", "dum") == "dummy" and reg.resolve("norm", "dummy") == "dummy"
    with pytest.raises(RegistryError) as info:
        reg.get("norm", "dumm")
    assert str(info.value) == (
        "unknown norm type 'dumm'; did you mean 'dummy' or 'dum' (an alias of 'dummy')? "
        "(modkit list norm lists the 1 norm type)"
    )
    cfg = modkit.load_component("norm", {"type": "dum"}, registry=reg)
    assert type(cfg).__name__ == "DummyConfig" and cfg.type == "dummy"
    reg.unregister_plugin("p")
    assert reg.aliases("norm") == {}


@pytest.mark.parametrize(
    "aliases,match",
    [(("dummy",), "is the type itself"), (("Bad Name",), "must match"), (("a", "a"), "one alias twice")],
)
def test_malformed_aliases_are_rejected(aliases, match):
    entry = Component(
        kind="norm",
        type="dummy",
        config=DummyConfig,
        factory=lambda c, x: nn.Identity(),
        description="identity",
        aliases=aliases,
    )
    with pytest.raises(RegistryError, match=match):
        Registry().register_plugin(_plugin(register_components=lambda register: register(entry)), "p")


def test_alias_clashing_with_a_type_of_another_plugin_names_both():
    reg = Registry()
    reg.register_plugin(
        _plugin(register_components=lambda register: register(_component("other", OtherConfig))), "first"
    )
    entry = Component(
        kind="norm",
        type="dummy",
        config=DummyConfig,
        factory=lambda c, x: nn.Identity(),
        description="identity",
        aliases=("other",),
    )
    with pytest.raises(
        RegistryError,
        match="'other' is provided twice: as the alias of norm/dummy by second.*type of norm/other by first",
    ):
        reg.register_plugin(_plugin(register_components=lambda register: register(entry)), "second")
    assert reg.aliases("norm") == {} and reg.types("norm") == ["other"]

"""The documentation site: generated pages (components, gallery, reference) and a strict mkdocs build.

The fast tests call :mod:`modkit.docs` directly. The site test (marked ``slow``, part of the default run) builds the
whole site with ``python -m modkit docs build`` in a fresh process, with the worked third-party plugin of
``docs/examples/modkit-extra`` installed when it is there: the package is copied to a temporary folder and
``pip install --target``-ed into it, and the build runs with that folder on ``PYTHONPATH``. A private target
instead of the shared environment keeps concurrent processes from seeing the plugin and leaves nothing to
uninstall. Then every registered component must have a page, every spec in ``specs/`` a gallery page, the
example plugin's components their pages, and every internal link of the built HTML must resolve.
"""

from __future__ import annotations

import html.parser
import importlib.metadata as md
import importlib.util
import json
import os
import posixpath
import shutil
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

from tests.conftest import pip_install_copies

import modkit
from modkit import docs
from modkit.registry import Component, Registry

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "docs" / "examples" / "modkit-extra"
SPECS = sorted((REPO / "specs").glob("*.json"))
DOCS_MODULES = ("mkdocs", "material", "mkdocs_gen_files", "mkdocs_literate_nav", "mkdocstrings", "mkdocstrings_handlers.python")


def _have_docs_deps() -> bool:
    return all(importlib.util.find_spec(m.split(".")[0]) is not None for m in DOCS_MODULES)


# ------------------------------------------------------------------------------------------------ generated pages


@pytest.fixture(scope="module")
def registry() -> Registry:
    """A fresh registry with every installed plugin (what a site build sees), untouched by other tests."""
    reg = Registry()
    reg.load_entry_points()
    return reg


@pytest.fixture(scope="module")
def pages(registry) -> dict[str, str]:
    return docs.generate(registry, spec_dir=REPO / "specs", docs_dir=REPO / "docs", root=REPO)


def test_every_component_has_a_page_with_its_facts(pages, registry):
    reg = registry
    assert reg.components(), "no components registered"
    for entry in reg.components():
        page = pages[docs.component_path(entry.kind, entry.type)]
        assert page.startswith(f"# {entry.type}\n")
        assert entry.provider.plugin in page
        assert "## Fields" in page and "## Capabilities" in page and "## Shapes" in page and "## Parameters" in page
        assert f'"type": "{entry.type}"' in page, "the example fragment is shown"
        if entry.reference:
            assert "reference" in page
    for kind in reg.kinds():
        index = pages[docs.kind_path(kind)]
        for t in reg.types(kind):
            assert f"]({t}.md)" in index
    overview = pages["components/index.md"]
    for entry in reg.components():
        assert f"]({entry.kind}/{entry.type}.md)" in overview


def test_every_spec_has_a_gallery_card(pages):
    assert SPECS
    index = pages["gallery/index.md"]
    for path in SPECS:
        card = pages[docs.gallery_path(path.stem)]
        assert f"]({path.stem}.md)" in index
        for part in ("embedding", "attention", "ffn", "norm", "lm_head", "position", "**total**"):
            assert part in card
        assert "```mermaid" in card and "KV cache" in card and "bf16" in card and "8K context" in card


def test_gallery_figures_match_the_build_api(pages, registry):
    spec = modkit.load_spec(REPO / "specs" / "tiny-moe.json", registry=registry)
    total, active = modkit.count_params(spec, registry=registry), modkit.active_params_per_token(spec, registry=registry)
    assert active < total
    card = pages["gallery/tiny-moe.md"]
    assert f"**{total:,}**" in card
    assert f"Active per token: {active:,}" in card
    kv = modkit.kv_cache_bytes_per_token(spec, "bfloat16", registry=registry)
    assert f"| bf16 | " in card and f"| {kv:,} |" in card


def test_aliases_are_shown_as_aliases_not_as_pages(pages, registry):
    assert "components/placement/peri.md" not in pages and "components/placement/olmo2.md" not in pages
    sandwich = pages["components/placement/sandwich.md"]
    assert "| aliases | `peri`" in sandwich and '!!! note "Alias `peri`"' in sandwich and "2502.02732" in sandwich
    index = pages["components/placement/index.md"]
    assert "**Aliases**" in index and "`peri` → [`sandwich`]" in index and "`olmo2` → [`reordered`]" in index


def test_sampling_steps_document_where_they_go(pages):
    page = pages["components/logits_processor/top_p.md"]
    assert "the `sampling` list of `modkit.generate.generate`" in page and "keyword `top_p`" in page
    assert "outside the model" in page
    assert '"type": "top_p"' in page


def test_parameter_formulas_are_exact(registry):
    reg = registry
    for entry in reg.components():
        cfg = modkit.load_component(entry.kind, entry.example_config(), registry=reg)
        info = docs.param_info(entry, cfg, reg)
        assert info.count is not None, f"{entry.kind}/{entry.type}: {info.error}"
        if info.coefficients is not None:
            c0, c1, c2 = info.coefficients
            for d, n in info.counts.items():
                assert c0 + c1 * d + c2 * d * d == n
        if entry.param_count is not None and info.declared is not None:
            assert info.declared == info.count, f"{entry.kind}/{entry.type}: declared {info.declared}, built {info.count}"


def test_fit_and_formula():
    pts = {d: 3 * d * d + 2 * d + 7 for d in (64, 128, 256, 512)}
    assert docs.formula(docs.fit_quadratic(pts)) == "3·d² + 2·d + 7"
    assert docs.formula(docs.fit_quadratic({d: d * d // 2 for d in (64, 128, 256, 512)})) == "0.5·d²"
    assert docs.fit_quadratic({d: d**3 for d in (64, 128, 256, 512)}) is None


def test_placement_trace_shows_norms_and_residuals(registry):
    reg = registry
    for entry in reg.components("placement"):
        cfg = modkit.load_component("placement", entry.example_config(), registry=reg)
        module, _, _ = docs._build_alone(entry, cfg, reg, 64, docs._default_norm(reg))
        flow = docs.trace_block(module, types=False)
        assert flow is not None, f"placement {entry.type} could not be traced"
        labels = [label for _, label, _ in flow]
        assert labels[0] == "x" and flow[-1][0] == "__out__"
        assert "attention" in labels and "ffn" in labels
        assert "+" in labels, f"{entry.type}: no residual add in {labels}"
        norms = [lab for lab in labels if lab.endswith("norm")]
        info = docs.param_info(entry, cfg, reg)
        assert len(norms) == info.norms, f"{entry.type}: diagram norms {norms} vs built {info.norms}"


def test_broken_example_fails_the_build():
    from typing import Literal

    from pydantic import Field

    class BadNormConfig(modkit.ComponentConfig):
        type: Literal["badnorm"] = "badnorm"
        eps: float = Field(1e-5, gt=0, description="epsilon")

    class Plugin:
        @modkit.hookimpl
        def register_components(self, register):
            register(
                Component(
                    kind="norm",
                    type="badnorm",
                    config=BadNormConfig,
                    factory=lambda cfg, ctx: None,
                    description="A norm whose example is broken.",
                    example={"type": "badnorm", "eps": -1.0, "typo": 1},
                )
            )

    reg = Registry()
    reg.register_plugin(Plugin(), "bad-plugin")
    with pytest.raises(docs.DocsError) as exc:
        docs.validate_examples(reg)
    assert "norm/badnorm" in str(exc.value) and "bad-plugin" in str(exc.value) and "eps" in str(exc.value)


def test_links_outside_the_docs_are_rewritten(tmp_path):
    (tmp_path / "docs" / "guides").mkdir(parents=True)
    md_text = "see [the README](../../README.md), [plugins](../../plugins/norm.py#L3), [ok](other.md), [web](https://x.org/a)"
    out = docs.rewrite_outside_links(md_text, "guides/page.md", tmp_path / "docs", tmp_path, None)
    assert "the README (`README.md` in the repository)" in out
    assert "plugins (`plugins/norm.py` in the repository)" in out
    assert "[ok](other.md)" in out and "[web](https://x.org/a)" in out
    out = docs.rewrite_outside_links(md_text, "guides/page.md", tmp_path / "docs", tmp_path, "https://github.com/o/r")
    assert "[the README](https://github.com/o/r/blob/HEAD/README.md)" in out


def test_cli_reference_covers_every_subcommand(pages):
    from modkit.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    assert "docs" in sub.choices
    for name in sub.choices:
        assert f"`modkit {name}`" in pages["reference/cli.md"]
    assert "`modkit docs build`" in pages["reference/cli.md"]


def test_spec_reference_lists_every_top_level_field(pages, registry):
    ref = pages["reference/spec.md"]
    live = modkit.json_schema(registry)
    for name in live["properties"]:
        assert f"`{name}`" in ref
    schema = json.loads(pages["reference/modkit.schema.json"])
    assert schema == live


def test_api_pages_cover_the_package(pages):
    for name in ("modkit", "modkit.spec", "modkit.build", "modkit.registry", "modkit.interfaces"):
        assert f"::: {name}" in pages[f"reference/api/{name}.md"]


def test_docs_command_without_mkdocs_config(tmp_path, capsys, monkeypatch):
    from modkit.cli import main

    missing = tmp_path / "nope.yml"
    if not _have_docs_deps():
        assert main(["docs", "build", "-o", str(tmp_path / "s")]) == 1
        assert "modkit[docs]" in capsys.readouterr().err
        return
    assert main(["docs", "build", "-f", str(missing), "-o", str(tmp_path / "s")]) == 1
    assert "nope.yml: no such file" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------------ the built site


def _install_example(workdir: Path) -> Path | None:
    """pip-install a copy of the example plugin into ``workdir/site``; ``None`` if it is absent or fails to install."""
    if not (EXAMPLE / "pyproject.toml").is_file():
        return None
    site, _, proc = pip_install_copies([EXAMPLE], workdir / "plugin")  # workdir/site holds the built site
    if proc.returncode != 0:
        print(f"example plugin did not install; building without it:\n{proc.stdout}\n{proc.stderr}")
        return None
    return site


class _Links(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.links: list[str] = []

    def handle_starttag(self, tag, attrs):
        for name, value in attrs:
            if name in ("href", "src") and value:
                self.links.append(value)


@pytest.fixture(scope="module")
def built_site(tmp_path_factory):
    if not _have_docs_deps():
        pytest.skip("docs extra not installed (pip install 'modkit-lm[docs]')")
    work = tmp_path_factory.mktemp("docs")
    extra = _install_example(work)
    env = dict(os.environ)
    if extra is not None:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(extra), str(REPO), env.get("PYTHONPATH", "")) if p)
    env.pop("MODKIT_DEBUG", None)
    out = work / "site"
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "modkit", "docs", "build", "-o", str(out), "-f", str(REPO / "mkdocs.yml")],
        capture_output=True, text=True, cwd=str(REPO), env=env, timeout=900,
    )
    seconds = time.perf_counter() - start
    assert proc.returncode == 0, f"strict site build failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-8000:]}"
    print(f"site built in {seconds:.1f} s (example plugin {'installed' if extra else 'absent'})")
    return {"site": out, "plugins": _plugins_seen_with(extra), "extra": extra is not None, "seconds": seconds}


def _plugins_seen_with(extra: Path | None) -> list[dict]:
    """What the build process saw: a fresh registry loading the entry points with ``extra`` on ``sys.path``."""
    before = set(sys.modules)
    if extra is not None:
        sys.path.insert(0, str(extra))
    try:
        reg = Registry()
        reg.load_entry_points()
        return [
            {"name": p.name, "distribution": p.provider.distribution, "components": [f"{k}/{t}" for k, t in p.components]}
            for p in reg.plugins()
        ]
    finally:
        if extra is not None:
            sys.path.remove(str(extra))
            for name in set(sys.modules) - before:  # the example's modules came from the temporary folder
                if name.split(".")[0] == "modkit_extra":
                    del sys.modules[name]


def _page(site: Path, docs_path: str) -> Path:
    """The built HTML file of a docs page (directory URLs: ``a/b.md`` -> ``a/b/index.html``)."""
    stem = docs_path[: -len(".md")]
    return site / f"{stem}.html" if stem == "index" or stem.endswith("/index") else site / stem / "index.html"


@pytest.mark.slow
def test_site_has_a_page_per_component_and_spec(built_site):
    site = built_site["site"]
    comps = [c for p in built_site["plugins"] for c in p["components"]]
    assert comps
    for item in comps:
        kind, type_ = item.split("/")
        page = _page(site, docs.component_path(kind, type_))
        assert page.is_file(), f"no page for {item} ({page})"
    for path in SPECS:
        page = _page(site, docs.gallery_path(path.stem))
        assert page.is_file(), f"no gallery page for {path.name}"
        assert 'class="mermaid"' in page.read_text()
    for name in ("index.html", "concepts/index.html", "reference/cli/index.html", "reference/spec/index.html",
                 "reference/api/modkit.spec/index.html", "components/index.html", "gallery/index.html",
                 "reference/modkit.schema.json", "search/search_index.json"):
        assert (site / name).is_file(), name
    assert "load_spec" in (site / "reference/api/modkit.spec/index.html").read_text()


@pytest.mark.slow
def test_site_shows_the_example_plugin(built_site):
    if not built_site["extra"]:
        pytest.skip("docs/examples/modkit-extra is absent or does not install here")
    extra = [p for p in built_site["plugins"] if p["distribution"] == "modkit-extra"]
    assert extra, "the example plugin was installed but is not loaded"
    site = built_site["site"]
    overview = (site / "components" / "index.html").read_text()
    for item in extra[0]["components"]:
        kind, type_ = item.split("/")
        page = _page(site, docs.component_path(kind, type_))
        assert page.is_file(), f"no page for the example plugin's {item}"
        text = page.read_text()
        assert extra[0]["name"] in text and "modkit-extra" in text
        assert f"{kind}/{type_}/" in overview


@pytest.mark.slow
def test_site_internal_links_resolve(built_site):
    site = built_site["site"]
    broken = []
    n_links = 0
    for page in site.rglob("*.html"):
        parser = _Links()
        parser.feed(page.read_text(errors="replace"))
        base = "/" + page.relative_to(site).parent.as_posix()
        for link in parser.links:
            parts = urlsplit(link)
            if parts.scheme or parts.netloc or link.startswith(("#", "mailto:", "data:", "javascript:")):
                continue
            target = unquote(parts.path)
            if not target:
                continue
            n_links += 1
            resolved = posixpath.normpath(posixpath.join(base, target)) if not target.startswith("/") else target
            path = site / resolved.lstrip("/")
            if target.endswith("/") or path.is_dir():
                path = path / "index.html"
            if not path.exists():
                broken.append(f"{page.relative_to(site)}: {link}")
    assert n_links > 500
    assert not broken, f"{len(broken)} broken internal links:\n  " + "\n  ".join(broken[:40])


# ------------------------------------------------------------------------------------------------ guide snippets


def _blocks(page: str, lang: str) -> list[str]:
    import re

    return re.findall(rf"```{lang}\n(.*?)```", (REPO / "docs" / page).read_text(), re.S)


def test_compose_guide_specs_validate():
    import re

    spec_json, overrides = _blocks("guides/compose.md", "json")[:2]
    spec = json.loads(spec_json)
    spec.pop("$schema")
    base = modkit.load_spec(spec)
    with_overrides = modkit.load_spec({**spec, **json.loads("{" + overrides + "}")})
    assert modkit.active_params_per_token(with_overrides) < modkit.count_params(with_overrides)
    # every complete fragment of the "swap components" table validates in the guide's spec
    text = (REPO / "docs" / "guides" / "compose.md").read_text()
    swaps = re.findall(r"\| `(\"(\w+)\": .*?)` \|", text)
    assert swaps
    for fragment, key in swaps:
        if "..." in fragment:
            continue
        value = json.loads("{" + fragment + "}")[key]
        data = base.to_dict()
        if key in data["block"]:
            data["block"][key] = value
        else:
            data[key] = value
        modkit.load_spec(data)


def test_generate_guide_runs():
    namespace: dict = {}
    blocks = _blocks("guides/generate.md", "python")
    exec(blocks[0], namespace)  # noqa: S102 - the guide's own example
    assert len(namespace["tokens"]) == 17
    exec(blocks[1], namespace)  # noqa: S102 - the sampling examples
    assert namespace["out"].shape[0] == 1 and namespace["out"].shape[1] <= 8 + 16


def test_hugging_face_guide_runs():
    namespace: dict = {}
    exec(_blocks("guides/hugging-face.md", "python")[0], namespace)  # noqa: S102 - the guide's own example
    assert namespace["spec"].metadata["hf_model_type"] == "llama"

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
import importlib.util
import json
import os
import posixpath
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

from tests.conftest import HANG_TIMEOUT, pip_install_copies

import modkit
from modkit import docs
from modkit.core.registry import Component, Registry

REPO = Path(__file__).resolve().parents[2]
#: the 30 Hugging Face model types the reference page must list: the 14 of the first converters, the 13 of today's
#: open models (DeepSeek-V3 / Kimi K2, Qwen3-MoE, Qwen2-MoE, gpt-oss, Llama 4, Pythia, StarCoder2, Granite, Cohere,
#: Gemma, SmolLM3, GLM-4, OLMo 3), the first recurrent one (Mamba-2) and the hybrids (Qwen3-Next, Jamba)
HF_MODEL_TYPES = (
    "bert",
    "falcon",
    "gemma2",
    "gemma3_text",
    "gpt2",
    "llama",
    "mistral",
    "mixtral",
    "olmo2",
    "olmoe",
    "phi",
    "phi3",
    "qwen2",
    "qwen3",
    "deepseek_v3",
    "qwen3_moe",
    "qwen2_moe",
    "gpt_oss",
    "llama4_text",
    "gpt_neox",
    "starcoder2",
    "granite",
    "cohere",
    "gemma",
    "smollm3",
    "glm4",
    "olmo3",
    "mamba2",
    "qwen3_next",
    "jamba",
)
EXAMPLE = REPO / "docs" / "examples" / "modkit-extra"
SPECS = sorted((REPO / "specs").glob("*.json"))
DOCS_MODULES = ("mkdocs", "material", "mkdocs_literate_nav", "mkdocstrings", "mkdocstrings_handlers.python")


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
    total, active = (
        modkit.count_params(spec, registry=registry),
        modkit.active_params_per_token(spec, registry=registry),
    )
    assert active < total
    card = pages["gallery/tiny-moe.md"]
    assert f"**{total:,}**" in card
    assert f"Active per token: {active:,}" in card
    kv = modkit.kv_cache_bytes_per_token(spec, "bfloat16", registry=registry)
    assert "| bf16 | " in card and f"| {kv:,} |" in card


def test_gallery_prices_recurrent_state_in_its_own_dtype(pages, registry):
    """A hybrid's card gives the bytes ``modkit.kv_cache_bytes`` allocates, per dtype row: the Gated DeltaNet
    layers' float32 state stays float32 in the bf16 row and counts once per sequence, not once per token."""
    from modkit.docs.markdown import _bytes
    from modkit.nn.build import cache_state_bytes_per_sequence, kv_cache_bytes

    spec = modkit.load_spec(REPO / "specs" / "tiny-hybrid.json", registry=registry)
    card = pages["gallery/tiny-hybrid.md"]
    for label, dtype in (("fp32", "float32"), ("bf16", "bfloat16")):
        per_token = modkit.kv_cache_bytes_per_token(spec, dtype, registry=registry)
        long, at_max = (kv_cache_bytes(spec, n, 1, dtype, registry=registry) for n in (8192, spec.max_seq_len))
        assert cache_state_bytes_per_sequence(spec, dtype, registry=registry) > 0
        row = next(line for line in card.splitlines() if line.startswith(f"| {label} |"))
        assert f"| {per_token:,} | {_bytes(long)} | {_bytes(at_max)} |" in row, row


def test_aliases_are_shown_as_aliases_not_as_pages(pages, registry):
    assert "components/placement/peri.md" not in pages and "components/placement/olmo2.md" not in pages
    sandwich = pages["components/placement/sandwich.md"]
    assert "| aliases | `peri`" in sandwich and '!!! note "Alias `peri`"' in sandwich and "2502.02732" in sandwich
    index = pages["components/placement/index.md"]
    assert "**Aliases**" in index and "`peri` → [`sandwich`]" in index and "`olmo2` → [`reordered`]" in index


def test_sampling_steps_document_where_they_go(pages):
    page = pages["components/logits_processor/top_p.md"]
    assert "the `sampling` list of `modkit.inference.generate.generate`" in page and "keyword `top_p`" in page
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
            assert info.declared == info.count, (
                f"{entry.kind}/{entry.type}: declared {info.declared}, built {info.count}"
            )


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
        if entry.type == "pre-no-residual":  # the ablation: its diagram must not draw adds it does not do
            assert "+" not in labels, f"{entry.type}: a residual add drawn in {labels}"
        else:
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
    md_text = "see [the README](../../README.md), [plugins](../../modkit_plugins/norm.py#L3), [ok](other.md), [web](https://x.org/a)"
    out = docs.rewrite_outside_links(md_text, "guides/page.md", tmp_path / "docs", tmp_path, None)
    assert "the README (`README.md` in the repository)" in out
    assert "plugins (`modkit_plugins/norm.py` in the repository)" in out
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
    for name in ("modkit", "modkit.spec", "modkit.nn.build", "modkit.core.registry", "modkit.core.interfaces"):
        assert f"::: {name}" in pages[f"reference/api/{name}.md"]


def test_packaged_and_repository_configurations():
    """One configuration, shipped in the package; the repository's mkdocs.yml inherits it and changes the pages."""
    if not _have_docs_deps():
        pytest.skip("docs extra not installed (pip install 'modkit-lm[docs]')")
    from mkdocs.config import load_config

    from modkit.docs import plugin, site

    assert site.find_config() == REPO / "mkdocs.yml", "a checkout builds the full project site by default"
    packaged = load_config(config_file=str(site.PACKAGED_CONFIG))
    repo = load_config(config_file=str(REPO / "mkdocs.yml"))
    assert Path(packaged["docs_dir"]) == plugin.PAGES and Path(repo["docs_dir"]) == REPO / "docs"
    for cfg in (packaged, repo):
        assert "modkit" in cfg["plugins"] and "gen-files" not in cfg["plugins"]
        assert list(cfg["plugins"]).index("modkit") < list(cfg["plugins"]).index("literate-nav")
        assert cfg["theme"]["font"] is False, "no Google Fonts"
        assert not cfg["hooks"], "hooks are file paths; the plugin does their work"
        assert "pymdownx.arithmatex" in cfg["markdown_extensions"]
        for asset in [*map(str, cfg["extra_javascript"]), *cfg["extra_css"]]:
            assert not asset.startswith(("http:", "https:", "//")), asset
            assert (plugin.PAGES / asset).is_file(), f"{asset} is not in the packaged pages"
    assert [str(s) for s in repo["extra_javascript"]] == [str(s) for s in packaged["extra_javascript"]]
    assert plugin.spec_folder(REPO / "mkdocs.yml") == REPO / "specs"
    assert plugin.spec_folder(site.PACKAGED_CONFIG, cwd=EXAMPLE) == EXAMPLE / "specs"


def test_vendored_assets_match_their_pins():
    """The bundled Mermaid and KaTeX are the versions docs/scripts/vendor_assets.py pins, with their licences."""
    import importlib.util as iu

    spec = iu.spec_from_file_location("vendor_assets", REPO / "docs" / "scripts" / "vendor_assets.py")
    vendor = iu.module_from_spec(spec)
    spec.loader.exec_module(vendor)
    versions = (vendor.VENDOR / "VERSIONS.txt").read_text()
    for name, (version, integrity, _) in vendor.PINS.items():
        assert f"{name} {version} {integrity}" in versions
        assert (vendor.VENDOR / name / "LICENSE").is_file()
    assert vendor.PINS["mermaid"][0].startswith("11."), "material draws with the Mermaid 11 API"
    # each bundle carries its own version string
    assert f'version:"{vendor.PINS["mermaid"][0]}"' in (vendor.VENDOR / "mermaid" / "mermaid.min.js").read_text()
    assert f'version:"{vendor.PINS["katex"][0]}"' in (vendor.VENDOR / "katex" / "katex.min.js").read_text()
    assert len(list((vendor.VENDOR / "katex" / "fonts").glob("*.woff2"))) == 20


def test_docs_command_without_mkdocs_config(tmp_path, capsys, monkeypatch):
    from modkit.cli import main

    missing = tmp_path / "nope.yml"
    if not _have_docs_deps():
        assert main(["docs", "build", "-o", str(tmp_path / "s")]) == 1
        assert "modkit-lm[docs]" in capsys.readouterr().err
        return
    assert main(["docs", "build", "-f", str(missing), "-o", str(tmp_path / "s")]) == 1
    assert "nope.yml: no such file" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------------ rendering defects


def test_reference_linker_never_links_math():
    from modkit.docs.markdown import _link_references

    for text in (
        "PE[p, 2i] = sin(p·base^(-2i/d))",
        "(d/2)",
        "(a/b)",
        "ratio (n_heads/n_kv_heads)",
        "(1/sqrt(d_h))",
        "$x/y$",
        "$$ a_{arXiv:1234.56789} $$",
        "`(owner/repo)`",
        "`arXiv:1706.03762`",
        "(2i/d) and (x_1/x_2)",
    ):
        assert _link_references(text) == text, text
    assert (
        _link_references("Gemma (github.com/google-deepmind/gemma).")
        == "Gemma ([google-deepmind/gemma](https://github.com/google-deepmind/gemma))."
    )
    assert _link_references("see https://github.com/o/r-x.") == "see [o/r-x](https://github.com/o/r-x)."
    assert _link_references("arXiv:1706.03762, §3.5") == "[arXiv:1706.03762](https://arxiv.org/abs/1706.03762), §3.5"
    done = "[arXiv:1706.03762](https://arxiv.org/abs/1706.03762)"
    assert _link_references(done) == done, "an existing link is not linked twice"


def test_generated_pages_link_no_made_up_repositories(pages):
    import re

    links = [
        (path, m.group(1))
        for path, text in pages.items()
        for m in re.finditer(r"\(https://github\.com/([^)]*)\)", text)
    ]
    assert links, "the references with a github.com/owner/repo are linked"
    for path, repo in links:
        assert re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9-]*/[A-Za-z0-9_.-]+", repo), f"{path}: link to github.com/{repo}"
    assert "github.com/-2i" not in pages["components/position/sinusoidal.md"]


def test_docstrings_render_as_written(tmp_path):
    from modkit.docs.api_reference import docstring_problems

    pytest.importorskip("griffe")
    assert docstring_problems() == []
    # the check finds both kinds of defect: a continuation line at the first line's indent, a "name: ..." first line
    pkg = tmp_path / "badpkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(
        'def split():\n    """Do.\n\n    Returns:\n        ``[batch, seq]`` logits, or the hidden states when\n'
        '        ``hidden`` is set.\n    """\n\n\n'
        'def named():\n    """Do.\n\n    Returns:\n        total: the sum.\n    """\n\n\n'
        'def fine():\n    """Do.\n\n    Returns:\n        ``[batch, seq]`` logits, or the hidden states when\n'
        '            ``hidden`` is set.\n    """\n'
    )
    problems = docstring_problems("badpkg", search_paths=[str(tmp_path)])
    assert len(problems) == 2, problems
    assert any("badpkg.split" in p and "2 value(s)" in p for p in problems)
    assert any("badpkg.named" in p and "named 'total'" in p for p in problems)
    with pytest.raises(docs.DocsError, match="badpkg.split"):
        docs.check_docstrings("badpkg", search_paths=[str(tmp_path)])


def _mkdocs_config() -> dict:
    from mkdocs.utils.yaml import yaml_load

    with open(REPO / "mkdocs.yml", encoding="utf-8") as f:
        return yaml_load(f)


def test_site_config_keeps_docstring_warnings_on_and_has_a_site_url():
    pytest.importorskip("mkdocs")
    from modkit.docs.api_reference import DOCSTRING_OPTIONS

    cfg = _mkdocs_config()
    options = cfg["plugins"][
        [next(iter(p)) if isinstance(p, dict) else p for p in cfg["plugins"]].index("mkdocstrings")
    ]
    options = options["mkdocstrings"]["handlers"]["python"]["options"]
    assert cfg["strict"] is True, "griffe's warnings fail the build only in strict mode"
    assert options["docstring_options"] == DOCSTRING_OPTIONS, "the docstring check parses as the site does"
    assert options["separate_signature"] is True and options["line_length"] <= 100
    assert cfg["site_url"].startswith("http"), "mkdocs writes an empty sitemap.xml without site_url"
    assert {"pymdownx.arithmatex": {"generic": True}} in cfg["markdown_extensions"]


def test_generated_nav_files_are_not_pages():
    pytest.importorskip("mkdocs")
    from mkdocs.structure.files import File, InclusionLevel
    from pathspec.gitignore import GitIgnoreSpec

    spec = GitIgnoreSpec.from_lines(["scripts/", "SUMMARY.md"])
    files = [
        File(p, "/src", "/site", True)
        for p in (
            "components/SUMMARY.md",
            "gallery/SUMMARY.md",
            "components/index.md",
            "reference/api/SUMMARY.md",
            "reference/api/modkit.md",
        )
    ]
    assert docs.exclude_generated(files, spec) == [
        "components/SUMMARY.md",
        "gallery/SUMMARY.md",
        "reference/api/SUMMARY.md",
    ]
    assert [f.inclusion == InclusionLevel.EXCLUDED for f in files] == [True, True, False, True, False]
    assert docs.exclude_generated(files, spec) == [], "nothing is excluded twice"


def test_capability_mappings_are_wrapped(pages, registry):
    import re

    plans = 0
    for entry in registry.components():
        page = pages[docs.component_path(entry.kind, entry.type)]
        table = page[page.index("## Capabilities") : page.index("## Parameters")]
        for span in re.findall(r"`([^`]*)`", table):
            assert len(span) <= 40, f"{entry.kind}/{entry.type}: capability value `{span}` is one unbreakable line"
        plan = entry.capabilities.get("tp_plan")
        if plan:
            plans += 1
            row = next(line for line in table.splitlines() if line.startswith("| `tp_plan` |"))
            value = row.split(" | ")[1]
            assert value.split("<br>") == [f"`{k}: {v}`" for k, v in plan.items()]
    assert plans >= 4


def _tables(text: str) -> list[list[str]]:
    """Header cells of every Markdown table in ``text`` (the line above each ``| --- | --: |`` separator)."""
    import re

    lines = text.splitlines()
    sep = re.compile(r"^\|( *:?-+:? *\|)+$")
    return [
        [c.strip() for c in lines[i - 1].strip().strip("|").split("|")]
        for i in range(1, len(lines))
        if sep.match(lines[i].strip())
    ]


def test_every_generated_table_labels_its_columns(pages):
    n = 0
    for path, text in pages.items():
        if not path.endswith(".md"):
            continue
        for header in _tables(text):
            n += 1
            assert all(header), f"{path}: table with an unlabelled column: {header}"
    assert n > 100
    card = pages["gallery/tiny-llama.md"]
    assert "| part | parameters | share | rounded |" in card


def test_every_kind_page_states_its_contract(pages, registry):
    from typing import Literal

    contracts = docs.kind_contracts()
    for kind in registry.kinds():
        page = pages[docs.kind_path(kind)]
        section = page[page.index("## Contract\n") : page.index("## Components\n")]
        assert contracts[kind] in section, f"kind {kind}: its contract from modkit.core.interfaces is not on its page"
    assert "router" in contracts

    # a kind the core does not know (a third-party plugin's) still gets a contract section saying what holds
    class ScratchConfig(modkit.ComponentConfig):
        type: Literal["scratch"] = "scratch"

    class Plugin:
        @modkit.hookimpl
        def register_components(self, register):
            register(
                Component(
                    kind="memory",
                    type="scratch",
                    config=ScratchConfig,
                    factory=lambda cfg, ctx: None,
                    description="A memory nothing holds yet.",
                )
            )

    reg = Registry()
    reg.load_entry_points()
    reg.register_plugin(Plugin(), "memory-plugin")
    all_docs = docs.component_docs(reg)
    page = docs.kind_index_page("memory", all_docs, reg, contracts, docs.slot_places(reg))
    section = page[page.index("## Contract\n") : page.index("## Components\n")]
    assert "The core defines no calling convention for `memory`" in section and "nothing builds it yet" in section


# ------------------------------------------------------------------------------------------------ component page extras


def _components_of(spec_path: Path, registry) -> set[tuple[str, str]]:
    """(kind, type) of every component config in a spec file (nested ones included: an MoE's expert and router)."""
    from modkit.spec import iter_configs

    spec = modkit.load_spec(spec_path, registry=registry)
    return {registry.entry_for_config(cfg).key for _, cfg in iter_configs(spec)}


def test_component_pages_link_the_gallery_models_that_use_them(pages, registry):
    import re

    users: dict[tuple[str, str], set[str]] = {}
    for path in SPECS:
        for key in _components_of(path, registry):
            users.setdefault(key, set()).add(path.stem)
    checked = 0
    for entry in registry.components():
        if entry.kind in ("logits_processor", "stop_condition"):
            continue
        page = pages[docs.component_path(entry.kind, entry.type)]
        section = page[page.index("## Used in the gallery") :]
        linked = set(re.findall(r"\]\(\.\./\.\./gallery/([^)]+)\.md\)", section)) - {"index"}
        assert linked == users.get(entry.key, set()), f"{entry.kind}/{entry.type}"
        checked += bool(linked)
    assert checked >= 15


def test_component_pages_show_their_config_schema(pages, registry):
    import re

    for entry in registry.components():
        page = pages[docs.component_path(entry.kind, entry.type)]
        assert (
            f"`{entry.config.__module__}.{entry.config.__qualname__}` (fields and [JSON Schema](#fields) below)" in page
        )
        block = page[page.index(f'??? info "JSON Schema of `{entry.config.__name__}`"') :]
        body = re.search(r"```json\n(.*?)\n    ```", block, re.S).group(1)
        assert json.loads(body) == entry.config.model_json_schema()


def _python_tab(page: str) -> str:
    import re
    import textwrap

    m = re.search(r'=== "Python"\n\n    ```python\n(.*?)\n    ```', page, re.S)
    assert m, "no Python tab"
    return textwrap.dedent(m.group(1))


def test_component_python_snippets_run(pages, registry, monkeypatch, capsys):
    import torch

    monkeypatch.chdir(REPO)
    torch.set_num_threads(1)
    for entry in registry.components():
        page = pages[docs.component_path(entry.kind, entry.type)]
        code = _python_tab(page)
        namespace: dict = {}
        exec(compile(code, f"<{entry.kind}/{entry.type} snippet>", "exec"), namespace)  # noqa: S102 - the page's own code
        if entry.kind in ("logits_processor", "stop_condition"):
            out = namespace["out"]
            assert out.shape[0] == 1 and 3 < out.shape[1] <= 3 + 8, f"{entry.type}: {tuple(out.shape)}"
            continue
        if entry.kind == "tracker":  # not part of a model: the snippet validates a training config listing it
            assert [t["type"] for t in namespace["config"].trackers] == [entry.type]
            capsys.readouterr()
            continue
        model = namespace["model"]
        if entry.kind == "optimizer":  # not part of a model: the snippet builds it over the model's parameters
            held = [p for g in namespace["optimizer"].param_groups for p in g["params"]]
            assert sorted(map(id, held)) == sorted(id(p) for p in model.parameters()), entry.type
            assert namespace["config"].optimizer["type"] == entry.type
            capsys.readouterr()
            continue
        tags = {(m.modkit_kind, m.modkit_type) for m in model.modules() if getattr(m, "modkit_type", None)}
        assert entry.key in tags, f"{entry.kind}/{entry.type}: the snippet's model does not contain it ({sorted(tags)})"
        assert int(capsys.readouterr().out.split()[-1]) == modkit.count_params(model)


def test_attention_comparison_follows_the_cost_formulas(pages, registry):
    from modkit.docs.comparison import COMPARE_CONTEXT

    page = pages[docs.kind_path("attention")]
    table = page[page.index("## Comparison") :]
    d = docs.EXAMPLE_CONTEXT["d_model"]
    assert f"d_model = {d}, n_heads = {docs.EXAMPLE_CONTEXT['n_heads']}" in table
    for entry in registry.components("attention"):
        cfg = modkit.load_component("attention", entry.example_config(), registry=registry)
        if entry.type in ("mla", "dsa", "compressed_attention"):  # their own formulas (below)
            continue
        h = cfg.n_heads
        kv = cfg.n_kv_heads or (1 if entry.type == "mqa" else h)
        hd = d // h
        params = d * (h * hd) * 2 + d * (kv * hd) * 2
        kv_bytes = 2 * kv * hd * 2  # keys and values, bf16
        flops = 2 * d * (2 * h * hd + 2 * kv * hd) + 2 * 2 * h * hd * COMPARE_CONTEXT  # projections, q·k and p·v
        row = next(line for line in table.splitlines() if line.startswith(f"| [`{entry.type}`]"))
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert cells[2] == f"{params:,}" and cells[4] == f"{kv_bytes:,}" and cells[5] == f"{flops:,}", (
            entry.type,
            cells,
        )
    mla = modkit.load_component("attention", registry.get("attention", "mla").example_config(), registry=registry)
    r, rope, h, nope, v, q = (
        mla.kv_lora_rank,
        mla.qk_rope_head_dim,
        mla.n_heads,
        mla.qk_nope_head_dim,
        mla.v_head_dim,
        mla.q_lora_rank,
    )
    params = (
        d * q + q + q * h * (nope + rope) + d * (r + rope) + r + r * h * (nope + v) + h * v * d
    )  # RMSNorm gains q, r
    flops = (
        2 * d * q
        + 2 * q * h * (nope + rope)
        + 2 * d * (r + rope)
        + 2 * h * nope * r
        + 2 * h * r * v
        + 2 * h * v * d
        + 2 * h * (r + rope) * COMPARE_CONTEXT
        + 2 * h * r * COMPARE_CONTEXT
    )  # absorbed: scores and sum over the latent
    row = next(line for line in table.splitlines() if line.startswith("| [`mla`]"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[2] == f"{params:,}" and cells[4] == f"{(r + rope) * 2:,}" and cells[5] == f"{flops:,}", cells
    # dsa's example has mla's sizes: MLA scores its index_topk selected keys, the indexer (H heads of D, a LayerNorm
    # on its key) scores every key; its key is cached in float32
    dsa = modkit.load_component("attention", registry.get("attention", "dsa").example_config(), registry=registry)
    assert (dsa.n_heads, dsa.q_lora_rank, dsa.kv_lora_rank, dsa.v_head_dim) == (h, q, r, v)
    hi, di, k = dsa.index_n_heads, dsa.index_head_dim, dsa.index_topk
    params += q * hi * di + d * di + 2 * di + d * hi
    flops += (2 * h * (r + rope) + 2 * h * r) * (k - COMPARE_CONTEXT)
    flops += 2 * q * hi * di + 2 * d * di + 2 * d * hi + 2 * hi * di * COMPARE_CONTEXT + 2 * hi * COMPARE_CONTEXT
    row = next(line for line in table.splitlines() if line.startswith("| [`dsa`]"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[2] == f"{params:,}" and cells[4] == f"{(r + rope) * 2 + di * 4:,}" and cells[5] == f"{flops:,}", cells
    # compressed_attention's example (heads 4 x 16, q rank 12, window 4, m 2 with overlap, indexer 2 x 8 keeping 2,
    # output 2 groups of 8), by hand: projections and norms, the 2-series compressor, the indexer's
    params = (256 * 12 + 12 + 12 * 64 + 256 * 16 + 16 + 64 * 8 + 16 * 256 + 4) + (2 * 256 * 32 + 2 * 32 + 16)
    params += (2 * 256 * 16 + 2 * 16 + 8) + 12 * 2 * 8 + 256 * 2
    # a decoded token: projections, compressors, the indexer over its 1,024 entries, attention over 4 keys + 2 entries
    flops = 2 * (256 * 12 + 12 * 64) + 2 * 256 * 16 + 2 * (64 * 8 + 16 * 256) + 2 * 256 * 64 + 2 * 256 * 32
    flops += 2 * 12 * 16 + 2 * 256 * 2 + 2 * 16 * (COMPARE_CONTEXT // 2) + 2 * (2 * 64 * (4 + 2))
    row = next(line for line in table.splitlines() if line.startswith("| [`compressed_attention`]"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    # per token: the window's key (16 numbers) and, per block of 2, an entry of 16 and an indexer key of 8, bf16
    assert (
        (cells[2], cells[4], cells[5])
        == (f"{params:,}", f"{32 + 16 + 8:,}", f"{flops:,}")
        == ("37,976", "56", "109,952")
    )
    norms = pages[docs.kind_path("norm")]
    assert "| [`rmsnorm`](rmsnorm.md) | (defaults) | 256 | `d` |" in norms
    ffn = pages[docs.kind_path("ffn")]
    assert "active per token" in ffn and "KV cache" not in ffn[ffn.index("## Comparison") :]


#: Components whose pages must carry their key formulas as math (the rendering is checked on the built site).
MATH_PAGES = (
    "position/sinusoidal",
    "position/rope",
    "position/alibi",
    "norm/rmsnorm",
    "norm/layernorm",
    "attention/mha",
    "attention/gqa",
    "attention/mqa",
    "ffn/swiglu",
    "ffn/moe",
    "router/topk",
)


def test_component_pages_carry_their_formulas_as_math(pages):
    import re

    for key in MATH_PAGES:
        page = pages[f"components/{key}.md"]
        math = page[page.index("## Math\n") : page.index("## Fields\n")]
        blocks = re.findall(r"\$\$(.+?)\$\$", math, re.S)
        assert blocks, f"{key}: no display math"
        inline = re.sub(r"\$\$.+?\$\$", "", math, flags=re.S)
        assert inline.count("$") % 2 == 0, f"{key}: unbalanced inline math"
        for b in blocks:
            assert b.count("{") == b.count("}") and len(re.findall(r"\\left\b", b)) == len(
                re.findall(r"\\right\b", b)
            ), f"{key}: {b}"
    assert r"\sin\!\left(\frac{p}{b^{2i/d}}\right)" in pages["components/position/sinusoidal.md"]
    assert r"\operatorname{top-}k(p)" in pages["components/ffn/moe.md"]


def test_component_pages_name_their_source(pages, registry, tmp_path):
    import inspect
    import re

    from modkit.docs.usage import source_location

    for entry in registry.components():
        page = pages[docs.component_path(entry.kind, entry.type)]
        m = re.search(r"\| source \| `([^`]+)` line (\d+) in the repository \|", page)
        assert m, f"{entry.kind}/{entry.type}: no source row"
        lines = (REPO / m.group(1)).read_text().splitlines()
        assert lines[int(m.group(2)) - 1].startswith(f"class {entry.config.__name__}(")
    rms = registry.get("norm", "rmsnorm").config
    line = inspect.getsourcelines(rms)[1]
    assert (
        source_location(rms, REPO, "https://example.org/modkit")
        == f"[`modkit_plugins/norm.py` line {line}](https://example.org/modkit/blob/HEAD/modkit_plugins/norm.py#L{line})"
    )
    # outside the site's repository (an installed plugin): the module and its file, no invented link
    assert (
        source_location(rms, tmp_path, "https://example.org/modkit")
        == f"module `modkit_plugins.norm`, file `modkit_plugins/norm.py` line {line}"
    )


#: model types whose transformers class defaults describe no model modkit (or transformers) can run: GLM-4.5's head_dim
#: 4096 // 96 = 42 rotates an odd 21 features; dots.llm1 leaves its experts null
NEEDS_MORE_THAN_DEFAULTS = {"glm4_moe", "dots1"}


def test_hugging_face_page_lists_every_model_type(pages, registry):
    import re
    import warnings

    from modkit.io.hf import convert_hf_config

    page = pages["reference/hugging-face.md"]
    types = registry.hf_model_types()
    assert set(HF_MODEL_TYPES) <= set(types) and f"of {len(types)} Hugging Face model types" in page
    from_gallery: dict[str, set[str]] = {}
    for path in SPECS:
        t = json.loads(path.read_text()).get("metadata", {}).get("hf_model_type")
        if t:
            from_gallery.setdefault(t, set()).add(path.stem)
    for t in types:
        assert f"\n## {t}\n" in page
        row = next(line for line in page.splitlines() if line.startswith(f"| [`{t}`](#{t}) |"))
        if t in NEEDS_MORE_THAN_DEFAULTS:  # the page says why instead of listing components
            with pytest.raises(modkit.SpecError):
                convert_hf_config({"model_type": t}, registry=registry)
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            spec = convert_hf_config({"model_type": t}, registry=registry)[1]
        layer = spec.layer(0)
        mixer_kind = registry.entry_for_config(layer.attention).kind  # an attention, or a recurrent mixer (mamba2)
        for kind, type_ in (
            (mixer_kind, layer.attention.type),
            ("ffn", getattr(layer.ffn, "type", None)),
            ("norm", layer.norm.type),
            ("placement", layer.placement.type),
            ("position", spec.position.type),
        ):
            if type_ is None:  # no ffn
                continue
            assert f"[`{type_}`](../components/{kind}/{type_}.md)" in row, (t, kind, row)
        assert set(re.findall(r"\(\.\./gallery/([^)]+)\.md\)", row)) == from_gallery.get(t, set()), t
        declared = getattr(registry.hf_converter(t).declaration, "supports", None)
        if declared is not None:  # the summary table says what the type's tables convert
            assert f"| [`{t}`](#{t}) | {', '.join(declared())} |" in page, t
    assert from_gallery, "specs/ holds converted models"


def test_readme_names_every_hugging_face_model_type(registry):
    """The README's checkpoint paragraph names each registered model type (the list a user reads first)."""
    import re

    readme = (REPO / "README.md").read_text()
    paragraph = readme[readme.index("- **Checkpoints**") : readme.index("with RoPE scalings")]
    missing = [t for t in registry.hf_model_types() if not re.search(rf"(?<![\w]){re.escape(t)}(?![\w])", paragraph)]
    assert not missing, f"README.md's checkpoint paragraph does not name {missing}"


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
        capture_output=True,
        text=True,
        cwd=str(REPO),
        env=env,
        timeout=HANG_TIMEOUT,
    )
    seconds = time.perf_counter() - start
    assert proc.returncode == 0, f"strict site build failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-8000:]}"
    print(f"site built in {seconds:.1f} s (example plugin {'installed' if extra else 'absent'})")
    return {
        "site": out,
        "plugins": _plugins_seen_with(extra),
        "extra": extra is not None,
        "seconds": seconds,
        "log": proc.stdout + proc.stderr,
    }


def _plugins_seen_with(extra: Path | None) -> list[dict]:
    """What the build process saw: a fresh registry loading the entry points with ``extra`` on ``sys.path``."""
    before = set(sys.modules)
    if extra is not None:
        sys.path.insert(0, str(extra))
    try:
        reg = Registry()
        reg.load_entry_points()
        return [
            {
                "name": p.name,
                "distribution": p.provider.distribution,
                "components": [f"{k}/{t}" for k, t in p.components],
            }
            for p in reg.plugins()
        ]
    finally:
        if extra is not None:
            sys.path.remove(str(extra))
            for name in set(sys.modules) - before:  # the example's modules came from the temporary folder
                if name.split(".")[0] == "modkit_extra":
                    del sys.modules[name]


def _page(site: Path, docs_path: str) -> Path:
    """The built HTML file of a docs page (no directory URLs, so the site works from disk: ``a/b.md`` -> ``a/b.html``)."""
    return site / f"{docs_path[: -len('.md')]}.html"


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
    for name in (
        "index.html",
        "concepts.html",
        "reference/cli.html",
        "reference/spec.html",
        "reference/api/modkit.spec.html",
        "components/index.html",
        "gallery/index.html",
        "reference/modkit.schema.json",
        "search/search_index.json",
        "search/search_index.js",
    ):
        assert (site / name).is_file(), name
    assert "load_spec" in (site / "reference/api/modkit.spec.html").read_text()


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
        assert f"{kind}/{type_}.html" in overview


@pytest.fixture(scope="module")
def site_links(built_site) -> dict[Path, list[str]]:
    """``{page: its href and src values}`` for every built HTML page, parsed once for the link tests below."""
    links = {}
    for page in built_site["site"].rglob("*.html"):
        parser = _Links()
        parser.feed(page.read_text(errors="replace"))
        links[page] = parser.links
    return links


@pytest.mark.slow
def test_site_internal_links_resolve(built_site, site_links):
    site = built_site["site"]
    broken = []
    n_links = 0
    for page, links in site_links.items():
        base = "/" + page.relative_to(site).parent.as_posix()
        for link in links:
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


@pytest.mark.slow
def test_site_builds_no_nav_files_as_pages(built_site):
    site = built_site["site"]
    assert not [p for p in site.rglob("*") if p.name.upper().startswith("SUMMARY")]
    index = json.loads((site / "search" / "search_index.json").read_text())
    assert index["docs"] and not [
        d["location"] for d in index["docs"] if "SUMMARY" in d["location"] or d["title"] == "SUMMARY"
    ]


@pytest.mark.slow
def test_site_api_signatures_are_wrapped(built_site):
    import re

    site = built_site["site"]
    lines, long = 0, []
    for page in (site / "reference" / "api").rglob("*.html"):
        for block in re.findall(r'<div class="doc-signature[^"]*">\s*<pre>(.*?)</pre>', page.read_text(), re.S):
            for line in html.unescape(re.sub(r"<[^>]+>", "", block)).splitlines():
                lines += 1
                if len(line) > 100:
                    long.append(f"{page.stem}: {line}")
    assert lines > 500, "signatures are rendered as separate, formatted blocks"
    assert not long, f"{len(long)} signature lines over 100 characters:\n  " + "\n  ".join(long[:20])


@pytest.mark.slow
def test_site_sitemap_lists_every_page(built_site):
    import xml.etree.ElementTree as ET

    site = built_site["site"]
    urls = [
        u.text
        for u in ET.parse(site / "sitemap.xml").getroot().iter("{http://www.sitemaps.org/schemas/sitemap/0.9}loc")
    ]
    base = _mkdocs_config()["site_url"]
    pages = {
        p.relative_to(site).as_posix()
        for p in site.rglob("*.html")  # the theme's pages, not a trace report the site links to
        if "assets" not in p.parts
        and p.name != "404.html"
        and 'name="generator" content="mkdocs' in p.read_text(errors="replace")
    }
    listed = {u[len(base) :] or "index.html" for u in urls}
    listed = {u + "index.html" if u.endswith("/") else u for u in listed}
    assert len(urls) == len(pages) > 100 and listed == pages


@pytest.mark.slow
def test_site_every_page_is_in_the_nav(built_site):
    import re

    site = built_site["site"]
    assert 'not included in the "nav"' not in built_site["log"], built_site["log"][-3000:]
    home = (site / "index.html").read_text()
    nav = home[home.index('<nav class="md-nav md-nav--primary') :]
    hrefs = {posixpath.normpath(h) for h in re.findall(r'class="md-nav__link[^"]*"[^>]*href="([^"#]+)"', nav)}
    hrefs |= {posixpath.normpath(h) for h in re.findall(r'href="([^"#]+)"[^>]*class="md-nav__link', nav)}
    comps = [c for p in built_site["plugins"] for c in p["components"]]
    for item in comps:
        assert f"components/{item}.html" in hrefs, f"{item}: its page is not reachable from the nav"
    assert "examples/modkit-extra/index.html" in hrefs and "reference/hugging-face.html" in hrefs


@pytest.mark.slow
def test_site_renders_math_and_links_no_math(built_site):
    site = built_site["site"]
    page = (site / "components" / "position" / "sinusoidal.html").read_text()
    assert page.count('class="arithmatex"') >= 3
    assert "github.com/-2i" not in page
    assert 'class="arithmatex"' in (site / "components" / "ffn" / "moe.html").read_text()


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
        if key == "router":  # a router goes in a mixture of experts: 16 SwiGLU experts, 2 per token
            moe = {"type": "moe", "n_experts": 16, "top_k": 2, "expert": {"type": "swiglu", "d_ff": 64}}
            data["block"]["ffn"] = {**moe, "router": value}
        elif key in data["block"]:
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


def test_hugging_face_guide_model_type_is_the_shipped_one():
    """The guide's declarative StarCoder2 is the shipped one: same spec for a config, same config written back."""
    namespace: dict = {}
    exec(_blocks("guides/hugging-face.md", "python")[1], namespace)  # noqa: S102 - the guide's own example
    guide, shipped = namespace["STARCODER2"], modkit.get_registry().hf_converter("starcoder2").declaration
    cfg = {
        "model_type": "starcoder2",
        "hidden_size": 64,
        "num_attention_heads": 4,
        "num_hidden_layers": 2,
        "sliding_window": 8,
        "use_bias": False,
        "residual_dropout": 0.1,
    }
    assert guide.convert(dict(cfg)) == shipped.convert(dict(cfg))
    spec = modkit.load_spec(shipped.convert(dict(cfg)))
    assert guide.weights.hf_config(spec, cfg) == shipped.weights.hf_config(spec, cfg)
    assert guide.tensors == shipped.tensors


# ------------------------------------------------------------------------------------------------ one source for the quickstart


def _readme_section(name: str) -> str:
    text = (REPO / "README.md").read_text()
    start, end = f"<!-- --8<-- [start:{name}] -->", f"<!-- --8<-- [end:{name}] -->"
    assert text.count(start) == 1 and text.count(end) == 1, f"README.md: section {name} is not marked once"
    return text[text.index(start) + len(start) : text.index(end)]


def _make_targets() -> dict[str, list[str]]:
    """``{target: recipe lines}`` of the Makefile."""
    import re

    targets: dict[str, list[str]] = {}
    current = None
    for line in (REPO / "Makefile").read_text().splitlines():
        m = re.match(r"^([A-Za-z][\w.-]*):", line)
        if m:
            current = targets.setdefault(m.group(1), [])
        elif line.startswith("\t") and current is not None:
            current.append(line.strip())
    return targets


def test_home_page_and_readme_describe_the_same_demo():
    """The docs home page includes the README's quickstart (one text, so they cannot drift), and that text
    describes what the Makefile's targets do."""
    import re

    home = (REPO / "docs" / "index.md").read_text()
    for section in ("fresh-machine", "demo"):
        assert f'--8<-- "README.md:{section}"' in home, f"docs/index.md does not include the README's {section}"
    assert "make demo" not in re.sub(
        r'--8<-- "[^"]+"', "", home.split("## Where to go next")[0].split("```python")[0]
    ), "the home page describes make demo in its own words besides the README's"
    setup, demo = _readme_section("fresh-machine"), _readme_section("demo")
    targets = _make_targets()
    commands = re.findall(r"^make (\w+)", setup, re.M)
    assert commands[:2] == ["demo", "test"] and all(c in targets for c in commands)
    # what `make demo` runs: every file its recipe names, and the torch index it defaults to
    recipe = " ".join(targets["demo"])
    files = re.findall(r"specs/[\w./-]+\.json", recipe)
    assert len(files) == 2 and all(f in demo for f in files), (files, demo)
    assert "modkit train" in recipe and "trains it" in demo
    assert re.search(r"^TORCH_INDEX \?=\s*$", (REPO / "Makefile").read_text(), re.M), (
        "the Makefile's default index changed"
    )
    assert "default index serves the multi-GB CUDA build" in setup and "make demo TORCH_INDEX=" in setup
    # the spec the demo trains has the size the README states
    spec = modkit.load_spec(REPO / files[0])
    assert f"{modkit.count_params(spec):,} parameters" in demo


def test_plugin_guide_sample_output_is_what_modkit_prints(capsys):
    """§8 of the plugin guide shows `modkit plugins`: the built-in rows name the distribution as the command does."""
    from modkit.cli import main

    guide = (REPO / "docs" / "guides" / "writing-a-plugin.md").read_text()
    assert main(["plugins"]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("builtin-attention "))
    shown = next(line for line in guide.splitlines() if line.startswith("builtin-attention "))
    assert row.split()[:4] == shown.split()[:4], (row, shown)


def test_gallery_labels_are_the_spec_file_names(pages):
    import re

    index = pages["gallery/index.md"]
    for path in SPECS:
        assert f"[{path.stem}]({path.stem}.md)" in index
        assert pages[docs.gallery_path(path.stem)].startswith(f"# {path.stem}\n")
    assert f"* [{SPECS[0].stem}]({SPECS[0].stem}.md)" in pages["gallery/SUMMARY.md"]
    gemma = pages["gallery/gemma-3-1b.md"]
    assert "Spec name: `gemma-3-1b-pt`." in gemma
    assert not re.search(r"\[gemma-3-1b-pt\]", index)


def test_api_index_sets_the_public_api_apart(pages):
    from modkit.docs.api_reference import api_modules, public_modules

    index = pages["reference/api/index.md"]
    public_part, internal_part = index.split("## Internals")
    modules = api_modules()
    public = public_modules(modules)
    assert "modkit.spec" in public and "modkit.inference.generate" in public and "modkit.cli.build" not in public
    for name in modules:
        link = f"[`{name}`]({name}.md)"
        assert (link in public_part) == (name in public) and (link in internal_part) == (name not in public), name
    # a summary is never cut inside inline code
    for line in index.splitlines():
        if line.startswith("| [`"):
            summary = line.split(" | ", 1)[1]
            assert summary.count("`") % 2 == 0, line


# ------------------------------------------------------------------------------------------------ the built site in a browser


@pytest.fixture(scope="module")
def browser():
    from tests.browser import Browser, find_browser

    binary = find_browser()
    if binary is None:
        pytest.skip("no Chromium binary (Debian: apt-get install chromium); the site is not viewed here")
    with Browser(binary, width=1400, height=900) as b:
        yield b


@pytest.mark.slow
def test_site_links_are_page_files(built_site, site_links):
    """No link names a folder: opened from disk, a folder URL shows the browser's directory listing."""
    site = built_site["site"]
    folders = []
    for page, links in site_links.items():
        for link in links:
            parts = urlsplit(link)
            if parts.scheme or parts.netloc or not parts.path:
                continue
            if parts.path.endswith("/") or (page.parent / unquote(parts.path)).is_dir():
                folders.append(f"{page.relative_to(site)}: {link}")
    assert not folders, f"{len(folders)} links to folders:\n  " + "\n  ".join(folders[:20])


@pytest.mark.slow
def test_site_from_disk_follows_links_and_searches(built_site, browser):
    """Opened as file://, no server: a click on a link opens that page, and the search finds pages and opens one."""
    site = built_site["site"]
    browser.goto((site / "index.html").as_uri())
    assert browser.eval("!!document.querySelector('h1')")
    for selector, page in (
        ('a.md-tabs__link[href$="concepts.html"]', "concepts.html"),
        ('.md-content a[href$="components/index.html"]', "components/index.html"),
    ):
        browser.goto((site / "index.html").as_uri())
        browser.click(selector)
        url = browser.wait(
            f"location.href.endsWith({json.dumps(page)}) && document.readyState === 'complete' && location.href"
        )
        assert url == (site / page).as_uri()
        assert browser.eval("!!document.querySelector('.md-content h1') && !document.title.startsWith('Index of')")
    browser.goto((site / "guides" / "compose.html").as_uri())
    browser.click('label[for="__search"]')  # the header's search toggle: opens the search overlay
    browser.eval("document.querySelector('input.md-search__input').focus()")
    # typing before the search worker has loaded the index starts no search: wait for the theme to say it is ready
    browser.wait("!/Initializing/i.test(document.querySelector('.md-search-result__meta').textContent)", timeout=90)
    browser.type("rmsnorm")
    # the list is redrawn after each key: wait for the results of the whole word (the first result highlights
    # "rmsnorm" itself, not a prefix such as "rms"), or a click could open a result of a shorter query
    browser.wait(
        "[...document.querySelectorAll('.md-search-result__item:first-child mark')]"
        ".some(m => m.textContent.toLowerCase() === 'rmsnorm')",
        timeout=60,
    )
    n = browser.eval("document.querySelectorAll('.md-search-result__item').length")
    assert n >= 5 and "matching document" in browser.eval(
        "document.querySelector('.md-search-result__meta').textContent"
    )
    first = browser.eval("document.querySelector('.md-search-result__item a').href")
    assert first.startswith(site.as_uri()) and ".html" in first
    browser.click(".md-search-result__item a")
    browser.wait(f"location.href === {json.dumps(first)} && document.readyState === 'complete'")
    assert "rmsnorm" in browser.eval("document.querySelector('.md-content').textContent").lower()
    assert not browser.console_errors, browser.console_errors


#: The column of a page and every table in it wider than the column (page scripts off: tables are laid out by
#: the stylesheets; KaTeX and Mermaid draw nothing that sits in a table).
_OVERFLOW = """(() => {
  const col = document.querySelector('.md-content__inner');
  if (!col) return null;
  const cs = getComputedStyle(col);
  const width = col.clientWidth - parseFloat(cs.paddingLeft) - parseFloat(cs.paddingRight);
  const tables = [...col.querySelectorAll('table')].filter(t => t.scrollWidth > width + 1)
    .map(t => [Math.round(t.scrollWidth), (t.rows[0] ? t.rows[0].textContent : '').replace(/\\s+/g, ' ').trim().slice(0, 60)]);
  // a short name (no spaces or hyphens, at most 24 characters) in a cell drawn on more than one line was broken
  // inside the word; a hyphenated name may wrap at its hyphen, a long dotted tensor name at its punctuation
  const broken = [...col.querySelectorAll('td code')]
    .filter(c => !/[\\s-]/.test(c.textContent) && c.textContent.length <= 24 && c.getClientRects().length > 1)
    .map(c => c.textContent.slice(0, 60));
  return {width: Math.round(width), tables: tables, broken: broken};
})()"""


@pytest.mark.slow
def test_site_tables_fit_the_content_column(built_site, browser):
    """At a 1,400 px window no table of any built page is wider than the page's content column, and no name in a
    cell (inline code of at most 24 characters without spaces or hyphens) is broken across lines to get there."""
    site = built_site["site"]
    pages = [p for p in sorted(site.rglob("*.html")) if "<table" in p.read_text(errors="replace")]
    assert len(pages) > 100
    browser.send("Emulation.setScriptExecutionDisabled", {"value": True})
    try:
        wide, broken, widths = [], [], set()
        for page in pages:
            browser.goto(page.as_uri())
            found = browser.eval(_OVERFLOW)
            if found is None:  # a standalone file the site links to (a trace report), not a page of the theme
                assert "md-content" not in page.read_text(errors="replace"), (
                    f"{page.relative_to(site)}: no content column"
                )
                continue
            widths.add(found["width"])
            wide += [f"{page.relative_to(site)}: {w} px > {found['width']} px: {head}" for w, head in found["tables"]]
            broken += [f"{page.relative_to(site)}: {name}" for name in found["broken"]]
    finally:
        browser.send("Emulation.setScriptExecutionDisabled", {"value": False})
    assert min(widths) > 600, widths  # the column at 1,400 px, with the navigation and the table of contents beside it
    assert not wide, f"{len(wide)} tables wider than their column:\n  " + "\n  ".join(wide[:30])
    assert not broken, f"{len(broken)} names in table cells broken across lines:\n  " + "\n  ".join(broken[:30])


@pytest.mark.slow
def test_site_plugin_guide_lists_render_as_lists(built_site, browser):
    browser.goto((built_site["site"] / "guides" / "writing-a-plugin.html").as_uri())
    items = browser.eval(
        "[...document.querySelectorAll('.md-content li')].map(li => li.textContent.replace(/\\s+/g, ' ').trim())"
    )
    for start in (
        "param_count(config, ctx) -> int is the exact number",
        "flops(config, ctx, work) -> {part: FLOPs}",
        "example: a valid config",
        "keep the input dtype",
        "expose n_heads; declare what the cache keeps",
        "modkit.update_cache(inputs, k, v, mixer=self): stores",
    ):
        assert any(i.startswith(start) for i in items), f"no list item starting {start!r}"
    paragraphs = browser.eval("[...document.querySelectorAll('.md-content p')].map(p => p.textContent)")
    assert not [p for p in paragraphs if "* `" in p or p.lstrip().startswith("* ")], (
        "a list rendered as literal asterisks"
    )
    assert "modkit-lm" in browser.eval("document.querySelector('.md-content').textContent")


@pytest.mark.slow
def test_site_cost_guide_code_is_not_clipped(built_site, browser):
    browser.goto((built_site["site"] / "guides" / "cost.html").as_uri())
    clipped = browser.eval(
        "[...document.querySelectorAll('.md-content pre > code')].filter(c => c.scrollWidth > c.clientWidth + 1).map(c => c.textContent.slice(0, 60))"
    )
    assert clipped == []
    assert browser.eval(
        "[...document.querySelectorAll('.md-content pre > code')].some(c => c.textContent.includes('FLOPs per token at context 8,192'))"
    )


# ------------------------------------------------------------------------------------------------ search and layout


def test_search_splits_words_on_underscores_and_hyphens():
    """The site's search separator (lunr's tokenizer, the same regex in the browser) splits ``sliding_window`` and
    ``pre-norm`` into words, so "sliding window" finds the pages that write the field name."""
    import re

    import yaml

    from modkit.docs.plugin import WEB

    text = (WEB / "mkdocs.yml").read_text()
    config = yaml.safe_load(re.sub(r"!!python/name:\S+", "null", text))
    search = next(p["search"] for p in config["plugins"] if isinstance(p, dict) and "search" in p)
    split = [w for w in re.split(search["separator"], "sliding_window pre-norm q_proj.weight, gqa") if w]
    assert split == ["sliding", "window", "pre", "norm", "q", "proj", "weight", "gqa"]


def test_search_ranks_guides_above_the_api_reference():
    from modkit.docs.plugin import search_boost

    boosts = {
        uri: search_boost(uri)
        for uri in ("guides/training.md", "index.md", "experiments/dense-vs-moe.md", "components/attention/gqa.md")
    }
    assert boosts == {
        "guides/training.md": 4.0,
        "index.md": 3.0,
        "experiments/dense-vs-moe.md": 1.0,
        "components/attention/gqa.md": 2.0,
    }
    assert search_boost("reference/api/modkit.train.md") == 0.3
    from modkit.docs.plugin import component_tags

    assert "sliding_window" in component_tags("components/attention/gqa.md")
    assert component_tags("components/index.md") == component_tags("guides/training.md") == []
    assert search_boost("experiments/results/x/report.md") == 0.5


def test_no_two_navigation_entries_share_a_title(pages):
    """Each generated sub-navigation names its index page after its section: no two tabs read "Overview - modkit"."""
    titles = [
        line.split("](")[0].lstrip("* [")
        for name, text in pages.items()
        if name.endswith("SUMMARY.md")
        for line in text.splitlines()
        if line.lstrip().startswith("* [") and line.rstrip().endswith("(index.md)")
    ]
    assert "Overview" not in titles and len(titles) == len(set(titles)), titles


def test_readme_ten_minute_commands_parse():
    """Every ``$ modkit ...`` command the README's ten-minute path shows is one the parser accepts as written."""
    import shlex

    from modkit.cli import build_parser

    section = _readme_section("ten-minutes")
    commands = [line[2:] for line in section.splitlines() if line.startswith("$ modkit ")]
    assert [shlex.split(c)[1] for c in commands] == ["build", "trace", "compare", "cost"]
    parser = build_parser()
    for command in commands:
        parser.parse_args(shlex.split(command)[1:])  # a usage error exits: the test fails naming it


#: elements of the page wider than the window (the page scrolls sideways), and code blocks cut off at their edge
_WIDE = """(() => {
  const vw = document.documentElement.clientWidth;
  const wide = [...document.querySelectorAll('.md-content *')]
    .filter(e => e.getBoundingClientRect().right > vw + 1 && getComputedStyle(e).position !== 'fixed')
    .filter(e => !e.closest('pre, .md-typeset__scrollwrap, .mermaid, .katex-display'))
    .map(e => e.tagName + ': ' + (e.textContent || '').replace(/\\s+/g, ' ').trim().slice(0, 50));
  const clipped = [...document.querySelectorAll('.md-content pre > code')]
    .filter(c => c.scrollWidth > c.clientWidth + 1).map(c => c.textContent.trim().slice(0, 50));
  return {page: document.documentElement.scrollWidth - vw, wide: wide.slice(0, 10), clipped: clipped};
})()"""


@pytest.mark.slow
def test_home_and_plugin_guide_fit_a_1366_window(built_site, browser, tmp_path):
    """At 1366 x 900 neither the home page, the plugin guide nor the 11-column experiment page has an element wider
    than the window (a wide code block scrolls inside its own box), and no code block of the home page is cut off
    at its edge; a screenshot of each is taken (kept in the test's folder for a look)."""
    site = built_site["site"]
    browser.send(
        "Emulation.setDeviceMetricsOverride", {"width": 1366, "height": 900, "deviceScaleFactor": 1, "mobile": False}
    )
    try:
        for page in ("index.html", "guides/writing-a-plugin.html", "experiments/prefill-vs-decode.html"):
            browser.goto((site / page).as_uri())
            found = browser.eval(_WIDE)
            if page != "index.html":
                found["clipped"] = []
            assert found == {"page": 0, "wide": [], "clipped": []}, (page, found)
            shot = browser.screenshot(tmp_path / (page.replace("/", "-") + ".png"), full_page=False)
            assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        # the plugin guide's API table gives the prose most of the width
        browser.goto((site / "guides" / "writing-a-plugin.html").as_uri())
        share = browser.eval(
            "(() => { const t = document.querySelector('.mk-api-table table'); const c = t.rows[1].cells[0];"
            " return c.getBoundingClientRect().width / t.getBoundingClientRect().width; })()"
        )
        assert share < 0.4, share
    finally:
        browser.send("Emulation.clearDeviceMetricsOverride", {})


@pytest.mark.slow
def test_search_finds_components_and_ranks_the_training_guide_first(built_site, browser):
    browser.goto((built_site["site"] / "index.html").as_uri())
    browser.click('label[for="__search"]')
    browser.eval("document.querySelector('input.md-search__input').focus()")
    browser.wait("!/Initializing/i.test(document.querySelector('.md-search-result__meta').textContent)", timeout=90)

    def results(query: str) -> list[str]:
        browser.eval("document.querySelector('input.md-search__input').value = ''")
        browser.type(query)  # key by key, as a reader types: the theme searches on its key events
        words = json.dumps(query.split())
        browser.wait(  # the results of this query: one of its words highlighted in the first result
            "[...document.querySelectorAll('.md-search-result__item:first-child mark')]"
            f".some(m => {words}.some(w => m.textContent.toLowerCase().startsWith(w)))",
            timeout=60,
        )
        return browser.eval("[...document.querySelectorAll('.md-search-result__item > a')].map(a => a.href)")

    def page(href: str) -> str:
        return href.split("/site/")[-1].split("?")[0].split("#")[0]

    top = [page(href) for href in results("sliding window")[:5]]
    # the three attentions with a sliding_window field come first (their order among themselves is a tie of scores)
    assert set(top[:3]) == {f"components/attention/{t}.html" for t in ("gqa", "mha", "mqa")}, top
    train = [page(href) for href in results("train")[:3]]
    # the training guide among the first three and first of the guides (the tracker pages, all about training, may
    # come before it)
    assert "guides/training.html" in train, train
    assert [p for p in train if p.startswith("guides/")][0] == "guides/training.html", train

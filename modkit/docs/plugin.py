"""The ``modkit`` mkdocs plugin: everything the site build adds to plain mkdocs-material.

Registered under the ``mkdocs.plugins`` entry-point group (``plugins: [modkit]`` in
``modkit/docs/web/mkdocs.yml``), so the configuration names no file path and works wherever modkit is installed.
On each build it

* adds the pages and assets of the packaged ``web/pages/`` folder that the configured ``docs_dir`` lacks (the
  repository's ``docs/`` brings the guides and its own home page and navigation; a build from the packaged
  configuration uses ``web/pages/`` itself, so nothing is added);
* adds every page :func:`modkit.docs.generate` returns, run against the live registry (every installed plugin)
  and the specs of :func:`spec_folder`; they exist only in the build;
* resolves ``pymdownx.snippets`` includes against the configuration's folder (the home page includes the
  README's quickstart);
* rewrites Markdown links that leave the docs folder (:func:`modkit.docs.site.rewrite_outside_links`);
* fills the generated table of contract checks into a page that marks its place (the plugin guide:
  :func:`modkit.docs.checks.fill_check_table`, from the checks the installed kit registers);
* ranks the search's results: guides and the home page above component pages, those above experiments, the API
  reference last
  (:data:`SEARCH_BOOST`, the page's ``search.boost`` that material's search multiplies a match's score by);
* writes ``search/search_index.js`` beside the theme's ``search_index.json`` (the same index as a script
  defining ``__index``), which material's search loads instead when the page comes from ``file://``, where a
  page may not fetch a file (what material's own ``offline`` plugin does, without its polyfill from a CDN: the
  configuration bundles that one).
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from mkdocs.config import config_options
from mkdocs.config.base import Config
from mkdocs.plugins import BasePlugin, event_priority
from mkdocs.structure.files import File, Files

#: The packaged site: ``mkdocs.yml`` and its ``pages/``.
WEB = Path(__file__).resolve().parent / "web"
PAGES = WEB / "pages"


#: ``(page path prefix, search boost)``, first match wins: a guide's match outranks the same match on a component
#: page, and that one the same match in the API reference or an experiment's raw report
SEARCH_BOOST: tuple[tuple[str, float], ...] = (
    ("guides/", 4.0),
    ("index.md", 3.0),
    ("concepts.md", 3.0),
    ("components/", 2.0),
    ("experiments/results/", 0.5),
    ("reference/api/", 0.3),
)


def search_boost(src_uri: str) -> float:
    """The search boost of the page at ``src_uri`` (:data:`SEARCH_BOOST`; 1 for every other page)."""
    return next((boost for prefix, boost in SEARCH_BOOST if src_uri.startswith(prefix)), 1.0)


def component_tags(src_uri: str) -> list[str]:
    """The field names of the component a page ``components/KIND/TYPE.md`` describes (``sliding_window``, ...), as
    the page's search tags: material's search ranks a tag match above any title or text match, so a search for a
    field ("sliding window") finds the components that have it first. Empty for any other page."""
    parts = src_uri.split("/")
    if len(parts) != 3 or parts[0] != "components" or parts[2] == "index.md":
        return []
    import modkit

    try:
        entry = modkit.get_registry().get(parts[1], parts[2][: -len(".md")])
    except Exception:  # noqa: BLE001 - a kind index or a page of no registered component: no tags
        return []
    return [name for name in entry.config.model_fields if name != "type"]


def spec_folder(config_file: Path, cwd: Optional[Path] = None) -> Optional[Path]:
    """The folder of the gallery's specs: ``specs/`` next to the configuration file when there is one (the
    repository), else ``specs/`` of ``cwd`` (the current folder: a plugin author's project); ``None`` if neither
    is a folder."""
    for cand in (Path(config_file).resolve().parent / "specs", Path(cwd or Path.cwd()) / "specs"):
        if cand.is_dir():
            return cand
    return None


class ModkitPluginConfig(Config):
    """Options of the ``modkit`` plugin."""

    #: Folder of the gallery's specs (relative to the configuration file); default :func:`spec_folder`.
    specs = config_options.Optional(config_options.Dir(exists=True))


class ModkitPlugin(BasePlugin[ModkitPluginConfig]):
    """Add the packaged pages, the generated pages and the link rewriting to a build (see the module docstring)."""

    def on_config(self, config):
        """Resolve ``pymdownx.snippets`` includes (``--8<-- "README.md:section"``) against the configuration's own
        folder, whatever the current folder of the build."""
        snippets = config["mdx_configs"].get("pymdownx.snippets")
        if snippets is not None:
            snippets["base_path"] = [str(Path(config["config_file_path"]).resolve().parent)]
        return config

    def on_files(self, files: Files, *, config) -> Files:
        """Add the packaged pages ``docs_dir`` lacks, then every generated page.

        Raises:
            modkit.docs.DocsError: a component's example config or a spec does not validate.
        """
        from .pages import exclude_generated, generate

        docs_dir = Path(config["docs_dir"]).resolve()

        if docs_dir != PAGES.resolve():
            for path in sorted(p for p in PAGES.rglob("*") if p.is_file()):
                src_uri = path.relative_to(PAGES).as_posix()
                if files.get_file_from_path(src_uri) is None:
                    files.append(File.generated(config, src_uri, abs_src_path=str(path)))
        config_file = Path(config["config_file_path"])
        specs = Path(self.config.specs) if self.config.specs else spec_folder(config_file)
        root = specs.parent if specs is not None else config_file.parent
        for src_uri, text in generate(spec_dir=specs, root=root, repo_url=config.get("repo_url")).items():
            existing = files.get_file_from_path(src_uri)
            if existing is not None:
                files.remove(existing)
            files.append(File.generated(config, src_uri, content=text))
        exclude_generated(files, config.get("exclude_docs"))
        return files

    def on_page_markdown(self, markdown: str, *, page, config, files) -> str:
        """Fill the generated contract-check table where a page marks it; set the page's search boost (unless its
        front matter sets one); rewrite links that leave the docs folder (to ``repo_url`` when configured, else to
        the path in code)."""
        from .checks import fill_check_table
        from .site import rewrite_outside_links

        markdown = fill_check_table(markdown)
        search = page.meta.setdefault("search", {}) if isinstance(page.meta.get("search", {}), dict) else {}
        search.setdefault("boost", search_boost(page.file.src_uri))
        if "tags" not in page.meta and component_tags(page.file.src_uri):  # for the search index only (no tags plugin)
            page.meta["tags"] = component_tags(page.file.src_uri)
        docs_dir = Path(config["docs_dir"])
        root = Path(config["config_file_path"]).resolve().parent
        return rewrite_outside_links(markdown, page.file.src_uri, docs_dir, root, config.get("repo_url"))

    @event_priority(-100)  # after the search plugin wrote the index
    def on_post_build(self, *, config) -> None:
        """Write ``search/search_index.js`` (``var __index = <search_index.json>``) for the site opened from disk."""
        index = Path(config["site_dir"]) / "search" / "search_index.json"
        if index.is_file():
            index.with_suffix(".js").write_text("var __index = " + index.read_text(encoding="utf-8"), encoding="utf-8")

    def on_serve(self, server, *, config, builder):
        """Rebuild on edits to the packaged pages too (they are not under ``docs_dir`` in the repository)."""
        server.watch(str(PAGES))
        return server

"""Every generated page at once: :func:`generate` returns ``{docs-relative path: text}`` for the site build."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

from .api_reference import api_pages
from .cli_reference import cli_reference_page
from .components import component_docs, component_page, components_nav, kind_index_page, overview_page
from .contracts import kind_contracts, slot_places
from .gallery import gallery_index, gallery_page, spec_card
from .hf_models import HF_PAGE, hf_models_page
from .markdown import component_path, DocsError, gallery_path, kind_path
from .schema import spec_reference_page
from .usage import gallery_usage


PLUGIN_GUIDE = "guides/writing-a-plugin.md"


def generate(
    registry=None,
    *,
    spec_dir: Optional[Path] = None,
    docs_dir: Optional[Path] = None,
    root: Optional[Path] = None,
    repo_url: Optional[str] = None,
) -> dict[str, str]:
    """Every generated page: ``{docs-relative path: text}``.

    Args:
        registry: defaults to the process-wide registry (every installed plugin).
        spec_dir: folder of the gallery's specs (``*.json``); none when ``None``.
        docs_dir: the hand-written sources; used to add a placeholder for a linked page that does not exist yet.
        root: repository root, to show spec and source paths relative to it.
        repo_url: the repository's web address (mkdocs ``repo_url``); source paths link into it when given.

    Raises:
        DocsError: a component's example config or a spec does not validate.
    """
    from modkit.core.errors import SpecError
    from modkit.core.registry import get_registry

    reg = registry or get_registry()
    pages: dict[str, str] = {}
    contracts = kind_contracts()
    places = slot_places(reg)

    cards, problems = [], []
    for path in sorted(Path(spec_dir).glob("*.json")) if spec_dir else []:
        try:
            cards.append(spec_card(path, reg, root))
        except SpecError as exc:
            problems.append(f"{path.name}: " + "; ".join(f"{p}: {m}" if p else m for p, m in exc.errors))
    if problems:
        raise DocsError("specs in the gallery that do not validate:\n  " + "\n  ".join(problems))
    for c in cards:
        pages[gallery_path(c.stem)] = gallery_page(c, reg)
    pages["gallery/index.md"] = gallery_index(cards, reg)
    pages["gallery/SUMMARY.md"] = "* [Gallery overview](index.md)\n" + "".join(
        f"* [{c.stem}]({c.stem}.md)\n" for c in cards
    )

    docs = component_docs(reg)
    uses = gallery_usage(cards)
    # the Python snippets start from the smallest gallery spec without per-layer overrides, with an attention and
    # an ffn on its layers (every other component fits in such a block)
    plain = [c for c in cards if not c.spec.overrides and c.attention and c.spec.layer(0).ffn is not None] or cards
    base = min(plain, key=lambda c: c.params["total"]) if plain else None
    for d in docs:
        pages[component_path(d.entry.kind, d.entry.type)] = component_page(
            d, reg, contracts, places, uses=uses.get(d.entry.key, []), base=base, root=root, repo_url=repo_url
        )
    for kind in reg.kinds():
        pages[kind_path(kind)] = kind_index_page(kind, docs, reg, contracts, places)
    pages["components/index.md"] = overview_page(docs, reg, contracts)
    pages["components/SUMMARY.md"] = components_nav(docs, reg)
    pages[HF_PAGE] = hf_models_page(reg, cards)

    pages["reference/spec.md"] = spec_reference_page(reg)
    from ..spec import json_schema

    pages["reference/modkit.schema.json"] = json.dumps(json_schema(reg), indent=2) + "\n"
    pages["reference/cli.md"] = cli_reference_page()
    pages.update(api_pages())
    if docs_dir is not None and not (Path(docs_dir) / PLUGIN_GUIDE).exists():
        pages[PLUGIN_GUIDE] = (
            "# Write a component plugin\n\nThis guide is being written. Until it lands: the README's section "
            "*Writing a plugin* shows a complete plugin, `modkit new plugin` scaffolds one, and "
            "[compose a model](compose.md) shows how its components are used in a spec.\n"
        )
    return pages


def exclude_generated(files, exclude_docs) -> list[str]:
    """Apply the site's ``exclude_docs`` to generated files too; returns the paths newly excluded.

    mkdocs applies ``exclude_docs`` when it reads ``docs_dir``, before the ``modkit`` plugin adds the packaged and
    generated pages, so a generated literate-nav ``SUMMARY.md`` would otherwise be built as a page (and indexed by the search). An
    excluded file is still read by literate-nav, which is all a nav file is for.

    Args:
        files: mkdocs' ``Files`` (anything iterable over ``File`` objects with ``src_uri`` and ``inclusion``).
        exclude_docs: the config's ``exclude_docs`` (a ``pathspec`` spec with ``match_file``), or ``None``.
    """
    from mkdocs.structure.files import InclusionLevel

    if exclude_docs is None:
        return []
    out = []
    for f in files:
        if not f.inclusion.is_excluded() and exclude_docs.match_file(f.src_uri):
            f.inclusion = InclusionLevel.EXCLUDED
            out.append(f.src_uri)
    return out

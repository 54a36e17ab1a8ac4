"""The mkdocs driver: find the site configuration, check the docs extra, build the site in this process, and the
link rewriting the ``modkit`` mkdocs plugin (:mod:`modkit.docs.plugin`) applies to every page."""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any, Optional

from .markdown import DocsError


log = logging.getLogger("mkdocs.plugins.modkit")


def rewrite_outside_links(
    markdown: str, page_src: str, docs_dir: Path, repo_root: Path, repo_url: Optional[str]
) -> str:
    """Rewrite Markdown links that leave ``docs_dir`` (``../../README.md``) so strict builds do not break on them.

    A link to a repository file outside the docs becomes a link into ``repo_url`` (``.../blob/HEAD/PATH``) when
    one is configured, else the link text followed by the repository path in code.
    """
    import posixpath

    base = (docs_dir / page_src).parent

    def fix(m: re.Match) -> str:
        text, target = m.group(1), m.group(2)
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith(("#", "/")):
            return m.group(0)
        path, _, frag = target.partition("#")
        try:
            resolved = (base / path).resolve()
            resolved.relative_to(docs_dir.resolve())
            return m.group(0)  # inside the docs: mkdocs checks it
        except ValueError:
            pass
        try:
            rel = resolved.relative_to(repo_root.resolve()).as_posix()
        except ValueError:
            return m.group(0)
        if repo_url:
            return f"[{text}]({posixpath.join(repo_url.rstrip('/'), 'blob/HEAD', rel)}{'#' + frag if frag else ''})"
        return text if text.strip("`") == rel else f"{text} (`{rel}` in the repository)"

    return re.sub(r"(?<!!)\[([^\]]+)\]\(([^)\s]+)\)", fix, markdown)


#: The packaged site configuration (``modkit/docs/web/mkdocs.yml``; its pages are ``web/pages/``).
PACKAGED_CONFIG = Path(__file__).resolve().parent / "web" / "mkdocs.yml"


def find_config() -> Path:
    """The configuration ``modkit docs`` uses without ``--config-file``.

    The repository's ``mkdocs.yml`` when modkit runs from a checkout (an editable install: the full project site,
    guides and experiments included; that file inherits :data:`PACKAGED_CONFIG` and sets ``docs_dir: docs``),
    else :data:`PACKAGED_CONFIG` (an installed wheel: home, concepts, components, gallery and reference). The
    current folder is not searched: a plugin author's own ``mkdocs.yml`` there is their site, not this one.
    """
    repo = Path(__file__).resolve().parents[2]
    if (repo / "mkdocs.yml").is_file() and (repo / "docs").is_dir() and (repo / "pyproject.toml").is_file():
        return repo / "mkdocs.yml"
    return PACKAGED_CONFIG


def _require_mkdocs() -> None:
    """Check that the docs extra and modkit's mkdocs plugin are installed.

    Raises:
        modkit.cli.UserError: naming the missing modules and the install command.
    """
    import importlib.metadata

    from ..cli import UserError

    missing = []
    for mod in ("mkdocs", "material", "mkdocs_literate_nav", "mkdocstrings", "mkdocstrings_handlers.python"):
        try:
            importlib.import_module(mod)
        except ImportError:
            missing.append(mod.split(".")[0])
    if missing:
        raise UserError(
            f"the docs need {', '.join(missing)}; install them with: pip install 'modkit-lm[docs]' (in a checkout: "
            "pip install -e '.[docs]')"
        )
    if not importlib.metadata.entry_points(group="mkdocs.plugins", name="modkit"):
        raise UserError(
            "modkit's mkdocs plugin is not registered (modkit runs without its package metadata); "
            "install modkit with pip (in a checkout: pip install -e '.[docs]')"
        )


def _quiet_banners() -> None:
    """Silence the advertising banners some mkdocs plugins print at start-up (they are not build messages)."""
    import os

    os.environ.setdefault("NO_MKDOCS_2_WARNING", "1")
    os.environ.setdefault("DISABLE_MKDOCS_2_WARNING", "true")


def _log_to_stderr() -> None:
    import sys

    logger = logging.getLogger("mkdocs")
    if not any(getattr(h, "_modkit", False) for h in logger.handlers):
        h = logging.StreamHandler(sys.stderr)
        h.setFormatter(logging.Formatter("%(levelname)-7s -  %(message)s"))
        h._modkit = True  # type: ignore[attr-defined]
        logger.addHandler(h)
        logger.setLevel(logging.INFO)


def build_site(config_file: Path, site_dir: Optional[Path] = None, *, strict: bool = True) -> Path:
    """Build the site with mkdocs (in this process); returns the output folder.

    ``site_dir`` defaults to the configuration's own ``site_dir``, except for :data:`PACKAGED_CONFIG`, whose
    output goes to ``./site`` of the current folder (never into the installed package).

    Raises:
        DocsError: mkdocs aborted (in strict mode: any warning).
    """
    from mkdocs.commands.build import build
    from mkdocs.config import load_config
    from mkdocs.exceptions import MkDocsException

    kwargs: dict[str, Any] = {"strict": strict}
    if site_dir is None and Path(config_file).resolve() == PACKAGED_CONFIG:
        site_dir = Path("site")
    if site_dir is not None:
        kwargs["site_dir"] = str(Path(site_dir).resolve())
    try:
        cfg = load_config(config_file=str(config_file), **kwargs)
        cfg.plugins.on_startup(command="build", dirty=False)
        try:
            build(cfg)
        finally:
            cfg.plugins.on_shutdown()
    except MkDocsException as exc:
        raise DocsError(f"mkdocs: {exc}") from exc
    return Path(cfg["site_dir"])

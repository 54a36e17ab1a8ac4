"""The mkdocs driver: find the site configuration, check the docs extra, build the site in this process, and the
hook that rewrites links leaving the docs folder."""

from __future__ import annotations

import importlib
import logging
import re
from pathlib import Path
from typing import Any, Optional

from .markdown import DocsError


log = logging.getLogger("mkdocs.plugins.modkit")


def rewrite_outside_links(markdown: str, page_src: str, docs_dir: Path, repo_root: Path, repo_url: Optional[str]) -> str:
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


def find_config(start: Optional[Path] = None) -> Optional[Path]:
    """``mkdocs.yml`` of the modkit repository: searched from ``start`` (cwd) upwards, then next to the package."""
    here = Path(start or Path.cwd()).resolve()
    for d in [here, *here.parents]:
        cand = d / "mkdocs.yml"
        if cand.is_file() and (d / "docs").is_dir():
            return cand
    cand = Path(__file__).resolve().parents[2] / "mkdocs.yml"
    return cand if cand.is_file() else None


def _require_mkdocs():
    from ..cli import UserError

    missing = []
    for mod in ("mkdocs", "material", "mkdocs_gen_files", "mkdocs_literate_nav", "mkdocstrings"):
        try:
            importlib.import_module(mod)
        except ImportError:
            missing.append(mod)
    if missing:
        raise UserError(f"the docs need {', '.join(missing)}; install them with: pip install 'modkit-lm[docs]'")


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

    Raises:
        DocsError: mkdocs aborted (in strict mode: any warning).
    """
    from mkdocs.commands.build import build
    from mkdocs.config import load_config
    from mkdocs.exceptions import MkDocsException

    kwargs: dict[str, Any] = {"strict": strict}
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

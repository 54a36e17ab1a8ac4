"""``reference/api/``: one mkdocstrings page per public module, and the griffe extension :class:`SphinxRoles`
that turns the Sphinx roles of modkit's docstrings into cross-references."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
from typing import Any, Optional

try:  # the griffe extension below is only loaded by mkdocstrings, which brings griffe
    from griffe import Extension as _GriffeExtension
except ImportError:  # pragma: no cover - docs extra not installed
    _GriffeExtension = object  # type: ignore[misc,assignment]

from .markdown import _cell, DocsError, _first_sentence, _rst_to_md, _table


#: Modules of the package that get no API page.
API_SKIP = ("modkit.__main__",)

#: The Google-style docstring options of the mkdocstrings handler (``mkdocs.yml``: ``docstring_options``; a test
#: keeps the two equal). ``warnings`` stays on: griffe's complaints reach mkdocs' log, which a strict build fails on.
DOCSTRING_OPTIONS = {
    "ignore_init_summary": True,
    "warn_unknown_params": False,
    "warn_missing_types": False,
    "warnings": True,
}


#: Modules whose own functions the guides call by module path (``modkit.inference.generate.generate``, ``modkit.analysis.trace.trace``)
#: and the subpackages a user imports from (``from modkit.data import prepare``): public API beside what the
#: ``modkit`` package exports.
PUBLIC_MODULES = (
    "modkit.plugin",
    "modkit.experiments.compare",
    "modkit.data",
    "modkit.inference.generate",
    "modkit.inference.sampling",
    "modkit.testing",
    "modkit.analysis.trace",
    "modkit.analysis.trace_report",
    "modkit.train",
)


def public_modules(modules: list[str]) -> list[str]:
    """The public API among ``modules``: ``modkit``, the modules defining what ``modkit`` and the subpackages of
    :data:`PUBLIC_MODULES` export (``__all__``), the modules they export it from (``modkit.spec`` for
    ``modkit.ModelSpec``, defined in ``modkit.spec.models``), and :data:`PUBLIC_MODULES` themselves; the rest (the
    command line, the site generator, the kit's check modules, helpers) are internals, documented all the same."""

    public = {"modkit", *PUBLIC_MODULES}
    for pkg_name in ("modkit", *PUBLIC_MODULES):
        try:
            pkg = importlib.import_module(pkg_name)
        except Exception:  # noqa: BLE001 - an optional dependency missing here: the module keeps its own page
            continue
        via = getattr(pkg, "_lazy_exports", {})  # name -> the module a lazy package imports it from
        public.update(m for n, m in via.items() if n in getattr(pkg, "__all__", []) and m.startswith("modkit"))
        for name in getattr(pkg, "__all__", []):
            try:
                obj = getattr(pkg, name)
            except Exception:  # noqa: BLE001
                continue
            defined = getattr(obj, "__module__", None)
            if isinstance(defined, str) and (defined.startswith(pkg_name + ".") or defined == pkg_name):
                public.add(defined)
    return [m for m in modules if m in public]


def api_modules() -> list[str]:
    """Public modules of the ``modkit`` package (those with an API page), in import-path order."""
    import modkit

    names = ["modkit"]
    for info in pkgutil.walk_packages(modkit.__path__, "modkit."):
        last = info.name.rsplit(".", 1)[-1]
        if last.startswith("_") or info.name in API_SKIP:
            continue
        names.append(info.name)
    return sorted(names)


def api_pages() -> dict[str, str]:
    """``reference/api/<module>.md`` (an mkdocstrings directive each), an index and a literate-nav file.

    Raises:
        DocsError: a docstring would render wrongly (:func:`check_docstrings`).
    """
    import modkit

    check_docstrings("modkit")

    pages: dict[str, str] = {}
    modules = api_modules()
    public = set(public_modules(modules))
    rows: dict[bool, list[tuple[str, str]]] = {True: [], False: []}
    for name in modules:
        try:
            mod = importlib.import_module(name)
            summary = _first_sentence(_rst_to_md((inspect.getdoc(mod) or "").split("\n\n")[0]))
        except Exception as exc:  # noqa: BLE001 - still gets a page; mkdocstrings reads the source
            summary = f"(could not be imported here: {type(exc).__name__})"
        rows[name in public].append((f"[`{name}`]({name}.md)", _cell(summary)))
        if name == "modkit":
            body = (
                "# modkit\n\n::: modkit\n    options:\n      members: false\n      show_root_heading: false\n\n"
                "## Exported names\n\n"
                + _table(
                    ("name", "defined in"),
                    (
                        (
                            f"`modkit.{n}`",
                            f"[`{getattr(getattr(modkit, n), '__module__', 'modkit')}`]({getattr(getattr(modkit, n), '__module__', 'modkit')}.md)",
                        )
                        for n in modkit.__all__
                        if getattr(getattr(modkit, n), "__module__", "").startswith("modkit")
                    ),
                )
                + "\n"
            )
        else:
            body = f"# {name}\n\n::: {name}\n"
        pages[f"reference/api/{name}.md"] = body
    pages["reference/api/index.md"] = (
        "# Python API\n\nGenerated by mkdocstrings from the docstrings of each module. The names most code needs are "
        "exported by the [`modkit`](modkit.md) package itself.\n\n"
        "## Public API\n\n`modkit`, the modules that define what it and the subpackages `modkit.data`, "
        "`modkit.train` and `modkit.testing` export, and the modules the guides call by name (`modkit.inference.generate`, "
        "`modkit.analysis.trace`, ...).\n\n" + _table(("module", "what it holds"), rows[True]) + "\n\n"
        "## Internals\n\nThe command line, the site generator, the contract kit's check modules and helpers: "
        "documented here, but not an interface to build on.\n\n"
        + _table(("module", "what it holds"), rows[False])
        + "\n"
    )
    nav = (
        ["* [Python API overview](index.md)", "* Public API"]
        + [f"    * [{n}]({n}.md)" for n in modules if n in public]
        + ["* Internals"]
        + [f"    * [{n}]({n}.md)" for n in modules if n not in public]
    )
    pages["reference/api/SUMMARY.md"] = "\n".join(nav) + "\n"
    return pages


def docstring_problems(
    package: str = "modkit", search_paths: Optional[list[str]] = None, options: Optional[dict] = None
) -> list[str]:
    """Docstrings of ``package`` that mkdocstrings would render wrongly: ``["path:line: problem", ...]``.

    The package is loaded with griffe as the site build loads it (Google style, :data:`DOCSTRING_OPTIONS`, the
    :class:`SphinxRoles` extension) and every docstring is parsed. A problem is a warning griffe logs, or a
    ``Returns:`` / ``Yields:`` section that parses as several values or as a named value: modkit documents one
    unnamed value per function, so either means a continuation line at the indent of the first line (each becomes
    a table row) or a first line that reads as ``name: description``. The fix: indent continuation lines deeper.

    Raises:
        ImportError: griffe (the ``docs`` extra) is not installed.
    """
    import logging

    import griffe

    opts = dict(DOCSTRING_OPTIONS if options is None else options)
    problems: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.levelno >= logging.WARNING:
                problems.append(record.getMessage())

    handler = Collect()
    loggers = [logging.getLogger(n) for n in ("griffe", "mkdocs.plugins.griffe")]
    for lg in loggers:
        lg.addHandler(handler)
    try:
        root = griffe.load(
            package,
            search_paths=search_paths,
            docstring_parser="google",
            docstring_options=opts,
            extensions=griffe.load_extensions(SphinxRoles),
        )
        seen: set[int] = set()
        stack = [root]
        while stack:
            obj = stack.pop()
            if id(obj) in seen or obj.is_alias:
                continue
            seen.add(id(obj))
            stack.extend(obj.members.values())
            doc = obj.docstring
            if doc is None:
                continue
            for section in doc.parse("google", **opts):
                if section.kind.value not in ("returns", "yields"):
                    continue
                items = section.value
                if len(items) > 1 or any(i.name for i in items):
                    where = f"{obj.relative_filepath}:{doc.lineno}" if obj.is_module or obj.parent else str(obj.path)
                    problems.append(
                        f"{where}: {obj.path}: its {section.kind.value.capitalize()} section parses as "
                        f"{len(items)} value(s){' named ' + repr(items[0].name) if items[0].name else ''}; indent "
                        "continuation lines deeper than the first line"
                    )
    finally:
        for lg in loggers:
            lg.removeHandler(handler)
    return problems


def check_docstrings(package: str = "modkit", search_paths: Optional[list[str]] = None) -> None:
    """Raise :class:`DocsError` listing :func:`docstring_problems` of ``package``; nothing when griffe is absent.

    :func:`api_pages` runs it, so a site build fails on such a docstring as it fails (strict) on griffe's warnings.

    Raises:
        DocsError: one or more docstrings would render wrongly on the API pages.
    """
    try:
        problems = docstring_problems(package, search_paths)
    except ImportError:
        return
    if problems:
        raise DocsError("docstrings the API reference would render wrongly:\n  " + "\n  ".join(problems))


def _roles_to_autorefs(text: str) -> str:
    """``:class:`~a.b.C``` -> an optional cross-reference (plain code when the target has no page)."""

    def repl(m: re.Match) -> str:
        target = m.group(2)
        tilde = target.startswith("~")
        ident = target.lstrip("~")
        shown = ident.split(".")[-1] if tilde else ident
        if m.group(1) in ("func", "meth"):
            shown += "()"
        return f'<autoref identifier="{ident}" optional><code>{shown}</code></autoref>'

    return re.sub(r":(class|func|meth|data|attr|mod|exc|obj):`([^`]+)`", repl, text)


class SphinxRoles(_GriffeExtension):  # type: ignore[misc,valid-type]
    """Griffe extension: render Sphinx roles in modkit's docstrings as mkdocstrings cross-references."""

    def on_instance(self, *, obj: Any, **kwargs: Any) -> None:
        """Rewrite ``obj``'s docstring roles (``:class:`x```) as autorefs before mkdocstrings renders it."""
        doc = getattr(obj, "docstring", None)
        if doc is not None and ":" in doc.value:
            doc.value = _roles_to_autorefs(doc.value)

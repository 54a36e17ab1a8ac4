"""The documentation site: pages generated from the live registry and ``specs/``, and ``modkit docs``.

The site is an mkdocs-material project with one configuration, shipped in the package:
``modkit/docs/web/mkdocs.yml``, whose hand-written pages and assets (home, concepts, CSS, and the Mermaid and
KaTeX that draw diagrams and formulas offline) are ``web/pages/``. That is the whole code path: ``modkit docs
build`` loads a configuration and runs mkdocs in-process, and the ``modkit`` mkdocs plugin (:mod:`.plugin`,
registered as an entry point, so the configuration names no file path) adds the generated pages, the packaged
pages a ``docs_dir`` lacks, and the link rewriting. Which configuration (:func:`~modkit.docs.site.find_config`):

* from an installed wheel, the packaged one: home, concepts, components, the gallery of ``./specs`` and the
  reference, written to ``./site``; a plugin author who installs modkit-lm and their package gets their
  components beside the built-ins;
* from a checkout (editable install), the repository's ``mkdocs.yml``, which inherits the packaged file (``INHERIT``)
  and only sets ``docs_dir: docs``: the same site plus the guides, the experiments and the project's home page;
* ``--config-file`` chooses any other.

Nothing generated is checked in: at build time the plugin calls :func:`generate`, which returns ``{path: text}``
for

* ``components/``: an overview table of every registered component, one index page per kind (its contract, its
  components and a comparison table of their parameters, KV-cache bytes and FLOPs) and one page per component
  (kind, type, description, provider, source file, capabilities, its formulas as math, a field table and the
  JSON Schema of its config, the tensor contract of its kind, its parameter count, its reference, the gallery
  models that use it, and an example spec fragment that is *validated* with :func:`modkit.load_component` (a
  broken example fails the build) beside a Python snippet the tests run);
* ``gallery/``: one model card per spec in ``specs/`` (parameter breakdown, active parameters, weight and
  KV-cache bytes, a Mermaid diagram of the model and of its blocks traced from the built modules), built on
  ``meta``;
* ``reference/``: the spec format (from the JSON Schema), the command line (from the argparse parser), the Hugging
  Face model types the converters support, and one mkdocstrings page per module of the Python API.

Whatever is installed shows up, third-party plugins included: nothing here names a concrete component.

Which module renders which page:

==================  ===============================================================================================
module              renders
==================  ===============================================================================================
``pages``           :func:`generate`: every generated page at once, ``{docs-relative path: text}``
``components``      ``components/index.md`` (overview), ``components/<kind>/index.md``, ``components/<kind>/<type>.md``
                    and ``components/SUMMARY.md``
``gallery``         ``gallery/index.md`` and ``gallery/<spec>.md`` (model cards)
``schema``          the field tables of component pages and ``reference/spec.md``
``cli_reference``   ``reference/cli.md``
``api_reference``   ``reference/api/*.md``, the griffe extension :class:`SphinxRoles` mkdocstrings loads and the
                    docstring check (:func:`check_docstrings`)
``contracts``       the kind contracts, ``acts_on`` sentences and "goes in a spec at" facts the component pages show
``params``          the parameter counts and ``P(d)`` formulas of component pages
``comparison``      the *Comparison* table of each kind page (parameters, KV-cache bytes, FLOPs of each component)
``usage``           the gallery models using a component, its source, its config's JSON Schema, its Python snippet
``hf_models``       ``reference/hugging-face.md``: the Hugging Face model types the converters support
``diagrams``        the Mermaid block diagrams (placement pages, gallery cards) and the model flow (gallery cards)
``markdown``        shared helpers: tables, escaping, number formats, page paths, :class:`DocsError`
``site``            the mkdocs driver (:func:`find_config`, :func:`build_site`) and the link rewriting
``plugin``          the ``modkit`` mkdocs plugin (imports mkdocs; loaded by mkdocs, not by this package)
``cli``             ``modkit docs build`` / ``modkit docs serve`` (:func:`add_subcommands`)
``web/``            package data: ``mkdocs.yml`` and ``pages/`` (hand-written pages, CSS/JS, ``assets/vendor``)
==================  ===============================================================================================

``modkit docs build [-o DIR]`` builds the site (strict by default) and ``modkit docs serve`` serves it with live
reload; both need the ``docs`` extra (``pip install 'modkit-lm[docs]'``).
"""

from __future__ import annotations

from .api_reference import (
    API_SKIP,
    DOCSTRING_OPTIONS,
    SphinxRoles,
    api_modules,
    api_pages,
    check_docstrings,
    docstring_problems,
)
from .cli import add_subcommands, cmd_docs_build, cmd_docs_serve
from .cli_reference import cli_reference_page
from .components import (
    ComponentDoc,
    component_docs,
    component_page,
    components_nav,
    kind_index_page,
    overview_page,
    validate_examples,
)
from .comparison import COMPARE_CONTEXT, Figures, comparison_section, component_figures
from .contracts import acts_on_text, contracts_preamble, kind_contract, kind_contracts, slot_places
from .diagrams import mermaid_block, trace_block
from .gallery import DTYPES, LONG_CONTEXT, SpecCard, gallery_index, gallery_page, spec_card
from .hf_models import HF_PAGE, hf_models_page
from .markdown import DocsError, component_path, gallery_path, kind_path
from .pages import exclude_generated, PLUGIN_GUIDE, generate
from .params import EXAMPLE_CONTEXT, FIT_D_MODELS, ParamInfo, fit_quadratic, formula, param_info
from .params import _build_alone, _default_norm  # noqa: F401 - used by tests/docs/test_docs.py
from .schema import FieldRow, field_rows, spec_reference_page
from .site import build_site, find_config, log, rewrite_outside_links
from .usage import gallery_usage, python_usage, source_location

__all__ = [
    "API_SKIP",
    "COMPARE_CONTEXT",
    "DOCSTRING_OPTIONS",
    "DTYPES",
    "EXAMPLE_CONTEXT",
    "FIT_D_MODELS",
    "HF_PAGE",
    "LONG_CONTEXT",
    "PLUGIN_GUIDE",
    "ComponentDoc",
    "DocsError",
    "FieldRow",
    "Figures",
    "ParamInfo",
    "SpecCard",
    "SphinxRoles",
    "acts_on_text",
    "add_subcommands",
    "api_modules",
    "api_pages",
    "build_site",
    "check_docstrings",
    "cli_reference_page",
    "cmd_docs_build",
    "cmd_docs_serve",
    "comparison_section",
    "component_docs",
    "component_figures",
    "component_page",
    "component_path",
    "components_nav",
    "contracts_preamble",
    "docstring_problems",
    "exclude_generated",
    "field_rows",
    "find_config",
    "fit_quadratic",
    "formula",
    "gallery_index",
    "gallery_page",
    "gallery_path",
    "gallery_usage",
    "generate",
    "hf_models_page",
    "kind_contract",
    "kind_contracts",
    "kind_index_page",
    "kind_path",
    "log",
    "mermaid_block",
    "overview_page",
    "param_info",
    "python_usage",
    "rewrite_outside_links",
    "slot_places",
    "source_location",
    "spec_card",
    "spec_reference_page",
    "trace_block",
    "validate_examples",
]

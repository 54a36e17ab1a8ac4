"""mkdocs hooks: generated files obey ``exclude_docs`` (the literate-nav ``SUMMARY.md`` files are not pages), and
links from pages to repository files outside docs/ (e.g. ``../../README.md``) are rewritten (to ``repo_url`` when
configured, else to the path in code) so that strict builds accept them."""

from pathlib import Path

from modkit import docs as _docs


def on_files(files, config):
    _docs.exclude_generated(files, config["exclude_docs"])
    return files


def on_page_markdown(markdown, page, config, files):
    docs_dir = Path(config["docs_dir"])
    root = Path(config["config_file_path"]).resolve().parent
    return _docs.rewrite_outside_links(markdown, page.file.src_uri, docs_dir, root, config.get("repo_url"))

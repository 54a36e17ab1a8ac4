"""mkdocs-gen-files script: write the generated pages (components, gallery, reference) into the build.

Everything comes from :func:`modkit.docs.generate`, run against the live registry (every installed plugin) and
the specs in ``specs/`` next to ``mkdocs.yml``. A component example or a spec that does not validate fails the
build.
"""

from pathlib import Path

import mkdocs_gen_files

from modkit.docs import generate

config = mkdocs_gen_files.config
root = Path(config["config_file_path"]).resolve().parent
docs_dir = Path(config["docs_dir"])

for path, text in generate(spec_dir=root / "specs", docs_dir=docs_dir, root=root, repo_url=config.get("repo_url")).items():
    with mkdocs_gen_files.open(path, "w") as f:
        f.write(text)

"""Fetch the JavaScript the documentation site bundles (Mermaid, KaTeX, iframe-worker) from the npm registry into
the package.

The site must work offline: no CDN at view time. The files live under ``modkit/docs/web/pages/assets/vendor/``
(package data, so they ship in the wheel) with each project's LICENSE and a ``VERSIONS.txt`` naming the npm
package, version and the registry's sha512 integrity of the tarball they came from. Run from the repository
root after changing a pin below (needs ``npm``; only ``npm pack`` talks to the registry)::

    .venv/bin/python docs/scripts/vendor_assets.py

Pins: Mermaid stays on major 11, the version mkdocs-material's integration targets (its bundle would otherwise
fetch ``unpkg.com/mermaid@11``); KaTeX 0.16. Only what the site loads is kept: ``mermaid.min.js``; KaTeX's
``katex.min.js``, ``katex.min.css``, ``contrib/auto-render.min.js`` and the woff2 fonts (every browser the theme
supports reads woff2, so the woff/ttf fallbacks named in the CSS are never requested); iframe-worker's
``shim/index.js``, which runs the search's Web Worker in an iframe when the site is opened from disk (``file://``).
"""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
VENDOR = REPO / "modkit" / "docs" / "web" / "pages" / "assets" / "vendor"

#: npm package -> (version, sha512 integrity of its tarball as the registry reported it when pinned, files to keep;
#: ``dist/`` is dropped from the kept paths).
PINS = {
    "mermaid": (
        "11.17.2",
        "sha512-V6K3C8EBdEsPFZXSKMJe6ppQOENxuHARr9GvHX4hh47lAbhMRD9qf4oEK7LoaRQxULMa80/qt5gHO73aCleBBg==",
        ["dist/mermaid.min.js", "LICENSE"],
    ),
    "katex": (
        "0.16.47",
        "sha512-Eeo8Ys1doU1z+x8AZsPpQu+p/QcZBI5PeOo7QGQdy2x2m0MU/hYagBbGOmXwr5KVbEfVuWv9LpnQWeehogurjg==",
        ["dist/katex.min.js", "dist/katex.min.css", "dist/contrib/auto-render.min.js", "dist/fonts/*.woff2", "LICENSE"],
    ),
    # the Web Worker shim material's search needs on file:// (a page opened from disk may not start a worker from
    # a file URL); the author's own offline plugin would load it from unpkg.com
    "iframe-worker": (
        "1.0.4",
        "sha512-roeaaI+Lg1LJNfgpCjoRe/+WzEjy9+Z08LoEvu85MCPbBjwm+qXz8Ag5U05lHa6V1CysZyGzE0SOkAtSUA5q7Q==",
        ["shim/index.js", "LICENSE"],
    ),
}


def _integrity(path: Path) -> str:
    return "sha512-" + base64.b64encode(hashlib.sha512(path.read_bytes()).digest()).decode()


def fetch(name: str, version: str, expected: str | None, keep: list[str], work: Path) -> str:
    """``npm pack name@version`` into ``work``, check its integrity, copy ``keep`` to ``VENDOR/name``.

    Returns the tarball's sha512 integrity. Raises ``RuntimeError`` when npm fails or the integrity differs from
    the pinned one.
    """
    proc = subprocess.run(["npm", "pack", f"{name}@{version}", "--json"], cwd=work, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"npm pack {name}@{version} failed:\n{proc.stderr}")
    info = json.loads(proc.stdout)[0]
    tgz = work / info["filename"]
    integrity = _integrity(tgz)
    if info.get("integrity") and info["integrity"] != integrity:
        raise RuntimeError(f"{tgz.name}: npm reports {info['integrity']}, the file hashes to {integrity}")
    if expected and expected != integrity:
        raise RuntimeError(f"{name}@{version}: pinned integrity {expected}, fetched {integrity}")
    unpacked = work / name
    with tarfile.open(tgz) as tar:
        tar.extractall(unpacked, filter="data")
    root = unpacked / "package"
    dest = VENDOR / name
    shutil.rmtree(dest, ignore_errors=True)
    for pattern in keep:
        matches = sorted(root.glob(pattern))
        if not matches:
            raise RuntimeError(f"{name}@{version}: no file matches {pattern}")
        for src in matches:
            rel = src.relative_to(root)
            rel = rel.relative_to("dist") if rel.parts[0] == "dist" else rel
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    return integrity


def main() -> int:
    lines = ["# Third-party files of the documentation site, fetched by docs/scripts/vendor_assets.py (npm pack).", ""]
    with tempfile.TemporaryDirectory() as tmp:
        for name, (version, expected, keep) in PINS.items():
            integrity = fetch(name, version, expected, keep, Path(tmp))
            lines.append(f"{name} {version} {integrity}")
            print(f"{name}@{version}: {integrity}")
    (VENDOR / "VERSIONS.txt").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

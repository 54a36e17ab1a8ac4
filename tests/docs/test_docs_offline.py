"""The documentation site from an installed wheel, built and viewed with the network off.

One module-scoped build serves every test here (marked ``slow``, part of the default run):

1. a wheel of this project is built from a copy of the working tree (the files git tracks plus untracked ones it
   does not ignore), and so is a wheel of the worked plugin ``docs/examples/modkit-extra`` whose dependency is
   set to this project's distribution name;
2. both go into a fresh virtual environment (no system site-packages, no pip of its own) with this environment's
   ``pip --python <its python> install --no-deps --no-index``.
   The heavy dependencies (torch, mkdocs, ...) are not reinstalled: a ``.pth`` file adds a folder of links to
   the current environment's installed packages, *minus every modkit distribution*, so ``modkit`` can only be
   imported from the wheel (asserted);
3. ``modkit docs build -o site`` runs in the plugin's folder (whose ``specs/`` becomes the gallery) with
   ``PIP_NO_INDEX=1`` and a ``sitecustomize`` that refuses and records every non-loopback connection.

Then the site must hold the plugin's component pages beside the built-ins, with its package named, and no page may
load anything from a CDN or font service. The browser test opens pages in headless Chromium with every host but
127.0.0.1 unresolvable and a dead proxy, served by a local ``http.server`` that records each request: the Mermaid
diagrams must have become SVG (no raw ``flowchart`` source left), the formulas KaTeX markup, and every request
must have been answered from the site. It is skipped only when no Chromium binary exists.
"""

from __future__ import annotations

import functools
import html.parser
import http.server
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import threading
import time
import venv
from pathlib import Path

import pytest

from tests.browser import Browser
from tests.conftest import HANG_TIMEOUT, offline_build_possible

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "docs" / "examples" / "modkit-extra"
DOCS_MODULES = ("mkdocs", "material", "mkdocs_literate_nav", "mkdocstrings", "mkdocstrings_handlers")
#: Hosts a page must never load from: CDNs and web-font services.
CDN = re.compile(r"unpkg|jsdelivr|googleapis|gstatic|cdnjs|cloudflare", re.I)
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")

#: Refuses (and records in $MODKIT_TEST_NET_LOG) every connection that is not to the loopback interface.
SITECUSTOMIZE = """
import os, socket

_log = os.environ.get("MODKIT_TEST_NET_LOG")
_connect = socket.socket.connect


def _guarded(self, address):
    host = address[0] if isinstance(address, tuple) else address
    if self.family in (socket.AF_INET, socket.AF_INET6) and host not in ("127.0.0.1", "::1", "localhost"):
        if _log:
            with open(_log, "a") as f:
                f.write(f"{address}\\n")
        raise OSError(f"network disabled in this test: connect to {address}")
    return _connect(self, address)


socket.socket.connect = _guarded
"""

pytestmark = pytest.mark.slow


def _have_docs_deps() -> bool:
    import importlib.util

    return all(importlib.util.find_spec(m) is not None for m in DOCS_MODULES)


def _distribution_name() -> str:
    """``[project] name`` of this repository's ``pyproject.toml``."""
    text = (REPO / "pyproject.toml").read_text()
    m = re.search(r'^\[project\]\s*$.*?^name\s*=\s*"([^"]+)"', text, re.S | re.M)
    assert m, "pyproject.toml has no [project] name"
    return m.group(1)


def _copy_tree(dst: Path) -> None:
    """Copy the working tree (tracked files and untracked ones git does not ignore) to ``dst``."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
            cwd=REPO,
            capture_output=True,
            check=True,
        ).stdout.decode()
        files = [f for f in out.split("\0") if f and (REPO / f).is_file()]
    except (OSError, subprocess.CalledProcessError):  # not a git checkout (an sdist): copy without build outputs
        ignore = shutil.ignore_patterns(".git", ".venv", "site", "runs", "build", "dist", "*.egg-info", "__pycache__")
        shutil.copytree(REPO, dst, ignore=ignore)
        return
    for f in files:
        (dst / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / f, dst / f)


def _run(cmd, **kwargs) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=HANG_TIMEOUT, **kwargs)
    assert proc.returncode == 0, f"{' '.join(map(str, cmd))} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    return proc


def _dependency_view(dst: Path) -> Path:
    """A folder of links to everything installed in this environment except modkit's own distributions."""
    dst.mkdir()
    purelib = Path(sysconfig.get_paths()["purelib"])
    for entry in purelib.iterdir():
        name = entry.name.lower()
        if not name.startswith(("modkit", "__editable__", "_modkit")) and not name.endswith(".pth"):
            (dst / entry.name).symlink_to(entry)
    return dst


@pytest.fixture(scope="module")
def offline_site(tmp_path_factory):
    if not _have_docs_deps():
        pytest.skip("docs extra not installed (pip install 'modkit-lm[docs]')")
    if not offline_build_possible():
        pytest.skip("setuptools here cannot build a wheel without fetching build dependencies")
    if not (EXAMPLE / "pyproject.toml").is_file():
        pytest.skip("docs/examples/modkit-extra is absent")
    work = tmp_path_factory.mktemp("wheel-site")
    env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "MODKIT_DEBUG", "MODKIT_STRICT_PLUGINS"}}
    env.update(PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
    start = time.perf_counter()

    # 1. the two wheels, built from copies (a build writes *.egg-info into its source folder)
    src = work / "src"
    _copy_tree(src)
    plugin = work / "plugin"
    shutil.copytree(
        EXAMPLE, plugin, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__", ".pytest_cache")
    )
    dist = _distribution_name()
    pyproject = plugin / "pyproject.toml"
    text, n = re.subn(r"^dependencies = \[.*\]$", f'dependencies = ["{dist}"]', pyproject.read_text(), flags=re.M)
    assert n == 1, "the example plugin's pyproject.toml has no one-line dependencies list"
    pyproject.write_text(text)
    wheels = work / "wheels"
    pip_wheel = [
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "-q",
        "--no-deps",
        "--no-build-isolation",
        "--no-index",
        "-w",
        str(wheels),
    ]
    _run(pip_wheel + [str(src), str(plugin)], env=env, cwd=work)
    modkit_wheel = next(wheels.glob(dist.replace("-", "_") + "-*.whl"))

    # 2. a fresh environment: the wheels, plus the other dependencies seen through a .pth file
    env_dir = work / "venv"
    # no pip of its own (ensurepip takes seconds): this environment's pip installs into it (``pip --python``)
    venv.EnvBuilder(with_pip=False, system_site_packages=False).create(env_dir)
    python = env_dir / "bin" / "python"
    # every command runs in `work`: `python -c` puts the current folder first on sys.path, and the repository's
    # modkit/ must not be found that way
    site_packages = Path(
        _run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], cwd=work).stdout.strip()
    )
    (site_packages / "zz_dependencies.pth").write_text(str(_dependency_view(work / "deps")) + "\n")
    # the programs a build runs (ruff formats the API signatures) are scripts in bin/, which a .pth does not carry;
    # pip would have installed them there
    for tool in ("ruff",):
        if (Path(sys.executable).parent / tool).exists():
            (env_dir / "bin" / tool).symlink_to(Path(sys.executable).parent / tool)
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(python),
            "install",
            "-q",
            "--no-deps",
            "--no-index",
            *map(str, sorted(wheels.glob("*.whl"))),
        ],
        env=env,
        cwd=work,
    )
    where = _run(
        [str(python), "-c", "import modkit, modkit_extra; print(modkit.__file__)"], env=env, cwd=work
    ).stdout.strip()
    assert Path(where).resolve().is_relative_to(site_packages.resolve()), f"modkit imported from {where}, not the wheel"

    # 3. the site, built with the network refused
    guard = work / "guard"
    guard.mkdir()
    (guard / "sitecustomize.py").write_text(SITECUSTOMIZE)
    net_log = work / "connections.log"
    build_env = dict(
        env,
        PYTHONPATH=str(guard),
        MODKIT_TEST_NET_LOG=str(net_log),
        http_proxy="http://127.0.0.1:9",
        https_proxy="http://127.0.0.1:9",
        HTTP_PROXY="http://127.0.0.1:9",
        HTTPS_PROXY="http://127.0.0.1:9",
    )
    site = plugin / "site"
    build_start = time.perf_counter()
    _run([str(env_dir / "bin" / "modkit"), "docs", "build", "-o", "site"], cwd=plugin, env=build_env)
    seconds = time.perf_counter() - build_start
    pages = sum(1 for _ in site.rglob("*.html"))
    print(
        f"wheel {modkit_wheel.name}: {modkit_wheel.stat().st_size / 2**20:.1f} MiB; site built in {seconds:.1f} s, "
        f"{pages} HTML pages; whole fixture {time.perf_counter() - start:.1f} s"
    )
    return {"site": site, "net_log": net_log, "wheel": modkit_wheel, "pages": pages}


def _page(site: Path, path: str) -> Path:
    """The built file of a page (no directory URLs: ``a/b`` -> ``a/b.html``, so the site works from disk)."""
    return site / f"{path}.html"


def test_wheel_carries_the_site(offline_site):
    import zipfile

    names = set(zipfile.ZipFile(offline_site["wheel"]).namelist())
    for name in (
        "modkit/docs/web/mkdocs.yml",
        "modkit/docs/web/pages/index.md",
        "modkit/docs/web/pages/concepts.md",
        "modkit/docs/web/pages/SUMMARY.md",
        "modkit/docs/web/pages/assets/modkit.css",
        "modkit/docs/web/pages/assets/vendor/mermaid/mermaid.min.js",
        "modkit/docs/web/pages/assets/vendor/mermaid/LICENSE",
        "modkit/docs/web/pages/assets/vendor/katex/katex.min.js",
        "modkit/docs/web/pages/assets/vendor/katex/fonts/KaTeX_Main-Regular.woff2",
        "modkit/docs/web/pages/assets/vendor/iframe-worker/shim/index.js",
        "modkit/docs/plugin.py",
    ):
        assert name in names, f"the wheel lacks {name}"
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    assert (
        "modkit = modkit.docs.plugin:ModkitPlugin" in zipfile.ZipFile(offline_site["wheel"]).read(entry_points).decode()
    )


def test_installed_site_shows_the_plugin_beside_the_builtins(offline_site):
    site = offline_site["site"]
    assert not offline_site["net_log"].exists(), "the build opened connections:\n" + offline_site["net_log"].read_text()
    for path in ("norm/dyt", "ffn/relu2"):  # the example plugin's components
        text = _page(site, f"components/{path}").read_text()
        assert "modkit-extra" in text and "<code>extra</code>" in text, f"{path}: plugin or package not named"
    for path in ("norm/rmsnorm", "attention/gqa", "placement/pre", "position/sinusoidal"):  # built-ins beside them
        assert _page(site, f"components/{path}").is_file()
    overview = (site / "components" / "index.html").read_text()
    assert "norm/dyt.html" in overview and "norm/rmsnorm.html" in overview
    assert _page(site, "gallery/tiny-dyt-relu2").is_file(), "the gallery shows the specs of the current folder"
    for path in ("concepts", "reference/cli", "reference/spec", "reference/api/modkit.spec"):
        assert _page(site, path).is_file(), path
    assert (site / "index.html").is_file() and (site / "assets/vendor/katex/fonts/KaTeX_Main-Regular.woff2").is_file()


class _Refs(html.parser.HTMLParser):
    """``src`` of scripts and ``href`` of link elements a browser fetches (stylesheets, fonts, preconnects; not the
    page's ``rel="canonical"`` address, which names the page and loads nothing)."""

    def __init__(self) -> None:
        super().__init__()
        self.refs: list[str] = []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "script" and attrs.get("src"):
            self.refs.append(attrs["src"])
        if tag == "link" and attrs.get("href") and attrs.get("rel") != "canonical":
            self.refs.append(attrs["href"])


def test_no_page_loads_from_a_cdn(offline_site):
    site = offline_site["site"]
    offenders = []
    for page in site.rglob("*.html"):
        text = page.read_text(errors="replace")
        parser = _Refs()
        parser.feed(text)
        remote = [r for r in parser.refs if re.match(r"^(https?:)?//", r)]
        offenders += [f"{page.relative_to(site)}: {r}" for r in remote]
        offenders += [f"{page.relative_to(site)}: mentions {m}" for m in set(CDN.findall(text))]
    for css in site.rglob("*.css"):
        offenders += [
            f"{css.relative_to(site)}: {u}" for u in re.findall(r"url\((['\"]?)(https?:[^)]+)\1\)", css.read_text())
        ]
    assert offenders == [], "remote resources:\n  " + "\n  ".join(offenders[:30])
    assert offline_site["pages"] > 100


# ------------------------------------------------------------------------------------------------ in a browser


def _browser() -> str | None:
    for name in BROWSERS:
        found = shutil.which(name)
        if found:
            return found
    return "/usr/bin/chromium" if Path("/usr/bin/chromium").is_file() else None


#: Injected at the top of every served page: mermaid's SVG goes into the light DOM, where --dump-dom shows it
#: (material draws each diagram into a closed shadow root, which a DOM dump leaves out).
PROBE = b"<script>Element.prototype.attachShadow = function () { return this; };</script>"


class _Server:
    """The built site on 127.0.0.1 (a free port), recording every request path and its status."""

    def __init__(self, root: Path) -> None:
        self.requests: list[tuple[str, int]] = []
        server = self

        class Handler(http.server.SimpleHTTPRequestHandler):
            def send_head(self):  # noqa: D102 - inject the probe into HTML pages
                path = self.translate_path(self.path)
                if os.path.isdir(path):
                    path = os.path.join(path, "index.html")
                if path.endswith(".html") and os.path.isfile(path):
                    body = Path(path).read_bytes().replace(b"<head>", b"<head>" + PROBE, 1)
                    self.send_response(200)
                    self.send_header("Content-Type", "text/html; charset=utf-8")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    import io

                    return io.BytesIO(body)
                return super().send_head()

            def log_request(self, code="-", size="-"):  # noqa: D102
                server.requests.append((self.path, int(code) if str(code).isdigit() else 0))

            def log_message(self, *args):  # noqa: D102 - quiet
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Handler, directory=str(root)))
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


class _VisibleText(html.parser.HTMLParser):
    """Text a reader sees: everything outside script, style and template elements."""

    def __init__(self) -> None:
        super().__init__()
        self.skip = 0
        self.parts: list[str] = []

    def handle_starttag(self, tag, attrs):
        if tag in ("script", "style", "template"):
            self.skip += 1

    def handle_endtag(self, tag):
        if tag in ("script", "style", "template") and self.skip:
            self.skip -= 1

    def handle_data(self, data):
        if not self.skip:
            self.parts.append(data)


def _visible_text(dom: str) -> str:
    parser = _VisibleText()
    parser.feed(dom)
    return " ".join(parser.parts)


def test_diagrams_and_formulas_render_offline_in_chromium(offline_site):
    browser = _browser()
    if browser is None:
        pytest.skip("no Chromium binary (Debian: apt-get install chromium); the pages are not rendered here")
    site = offline_site["site"]
    diagram_pages = [
        "concepts",
        "components/placement/index",
        "components/placement/sandwich",
        "gallery/tiny-dyt-relu2",
    ]
    # one Chromium for every page (a start costs about a second); with its cache off, each page fetches all it
    # needs from the server, as a browser of its own would
    with _Server(site) as server, Browser(browser, width=800, height=600) as chromium:
        chromium.send("Network.enable")
        chromium.send("Network.setCacheDisabled", {"cacheDisabled": True})
        for path in diagram_pages:
            blocks = _page(site, path).read_text().count('class="mermaid"')
            assert blocks > 0, f"{path}: the built page has no mermaid block"
            dom = chromium.dump_dom(f"http://127.0.0.1:{server.port}/{path}.html")
            svgs = re.findall(r'<div class="mermaid"[^>]*>\s*<svg', dom)
            assert len(svgs) == blocks, f"{path}: {len(svgs)} of {blocks} diagrams drawn as SVG"
            assert '<pre class="mermaid"' not in dom
            text = _visible_text(dom)
            assert "flowchart" not in text and "-->" not in text, f"{path}: raw mermaid source is visible"
        for path, formulas in (
            ("components/position/sinusoidal", 2),
            ("components/norm/rmsnorm", 3),
            ("components/attention/gqa", 4),
        ):
            dom = chromium.dump_dom(f"http://127.0.0.1:{server.port}/{path}.html")
            rendered = len(re.findall(r'<span class="katex">', dom))
            assert rendered >= formulas, f"{path}: {rendered} KaTeX formulas, expected at least {formulas}"
            assert "katex-error" not in dom, f"{path}: KaTeX could not parse a formula"
            assert "\\(" not in _visible_text(dom), f"{path}: raw math delimiters are visible"
    missing = [(p, c) for p, c in server.requests if c != 200]
    assert not missing, f"requests the site could not answer: {missing[:20]}"
    assert any(p.endswith("/mermaid.min.js") for p, _ in server.requests)
    assert any(p.endswith(".woff2") for p, _ in server.requests), "KaTeX fonts were not loaded from the site"

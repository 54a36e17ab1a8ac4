"""Screenshot a ``modkit trace`` HTML report in headless Chromium (the check that the report renders in a browser).

    .venv/bin/python docs/scripts/screenshot_trace.py                                   # tiny-llama, random init, -> trace.png
    .venv/bin/python docs/scripts/screenshot_trace.py runs/demo --text "ROMEO:" -o out  # a trained run folder
    .venv/bin/python docs/scripts/screenshot_trace.py specs/tiny-gpt2.json --ids 1,2,3 --height 6000

Writes ``OUT/trace.html`` (``modkit trace ... --html``) and ``OUT/trace.png`` (Chromium ``--screenshot``), then
prints the PNG's size and the share of its pixels that are coloured (plots) rather than grey (text, tables): a
report whose images failed to decode is grey only. Needs a Chromium binary (Debian: ``apt-get install chromium``);
the browser runs headless with a fresh profile, no sandbox, no GPU and no network services.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "chrome")


def find_browser() -> str | None:
    """Path of the first Chromium-like browser on ``PATH``, or ``None``."""
    for name in BROWSERS:
        found = shutil.which(name)
        if found:
            return found
    return None


def screenshot(
    html: Path, png: Path, *, width: int = 1280, height: int = 2000, browser: str | None = None, timeout: float = 120
) -> Path:
    """Render ``html`` in headless Chromium at ``width x height`` CSS pixels and write the screenshot to ``png``.

    Raises:
        FileNotFoundError: no browser found (install Debian's ``chromium``).
        RuntimeError: the browser failed or wrote no file (its stderr tail is included).
    """
    browser = browser or find_browser()
    if browser is None:
        raise FileNotFoundError(
            "no Chromium found on PATH (tried " + ", ".join(BROWSERS) + "); apt-get install chromium"
        )
    png = Path(png).resolve()
    png.unlink(missing_ok=True)
    with tempfile.TemporaryDirectory(prefix="modkit-chromium-") as profile:
        cmd = [
            browser,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--no-first-run",
            "--hide-scrollbars",
            f"--user-data-dir={profile}",
            f"--screenshot={png}",
            f"--window-size={width},{height}",
            Path(html).resolve().as_uri(),
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0 or not png.is_file():
        raise RuntimeError(f"{browser} exited with {proc.returncode} and wrote no {png}: {proc.stderr[-2000:]}")
    return png


def coloured_share(png: Path) -> float:
    """Share of the pixels of ``png`` whose channels differ by more than 60 (plots; text and tables are grey)."""
    import numpy as np
    from PIL import Image

    px = np.asarray(Image.open(png).convert("RGB"), dtype=np.int16)
    return float(((px.max(-1) - px.min(-1)) > 60).mean())


def main(argv: list[str] | None = None) -> int:
    """Trace a model to HTML and screenshot the report; returns the exit status."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "model",
        nargs="?",
        default="specs/tiny-llama.json",
        help="what modkit trace takes (default specs/tiny-llama.json)",
    )
    p.add_argument("--text", help="text to trace (the model needs a tokenizer)")
    p.add_argument("--ids", default=None, help="token ids to trace (default 1..12 when --text is not given)")
    p.add_argument("-o", "--out", default=".", help="folder for trace.html and trace.png (default: here)")
    p.add_argument("--width", type=int, default=1280)
    p.add_argument("--height", type=int, default=2000)
    args = p.parse_args(argv)

    from modkit.cli import main as modkit_main

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    html = out / "trace.html"
    cmd = ["trace", args.model, "--html", str(html)]
    cmd += ["--text", args.text] if args.text else ["--ids", args.ids or ",".join(str(i) for i in range(1, 13))]
    if Path(args.model).is_file():  # a spec: statistics of an untrained model rather than shapes alone
        cmd.append("--random-init")
    status = modkit_main(cmd)
    if status:
        return status
    png = screenshot(html, out / "trace.png", width=args.width, height=args.height)
    from PIL import Image

    size = Image.open(png).size
    print(f"{png}: {size[0]}x{size[1]} px, {100 * coloured_share(png):.1f}% coloured pixels (plots)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

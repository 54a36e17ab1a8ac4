"""Headless Chromium driven over the DevTools protocol on a pipe, for the tests of the built documentation site.

``--remote-debugging-pipe`` makes Chromium read protocol commands from file descriptor 3 and write replies and
events to descriptor 4, as JSON messages ended by a NUL byte: no port, no websocket library, nothing but the
standard library. One :class:`Browser` is one Chromium process with one page (tab) attached in flattened-session
mode; :meth:`Browser.goto`, :meth:`Browser.eval`, :meth:`Browser.click`, :meth:`Browser.type`,
:meth:`Browser.dump_dom` and :meth:`Browser.screenshot` are what the tests need. Every host but 127.0.0.1 is unresolvable and the proxy is a dead
port, so a page can only load what it is served or what lies on disk.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def find_browser() -> Optional[str]:
    """Path of a Chromium binary on ``PATH`` (or Debian's ``/usr/bin/chromium``), else ``None``."""
    for name in BROWSERS:
        found = shutil.which(name)
        if found:
            return found
    return "/usr/bin/chromium" if Path("/usr/bin/chromium").is_file() else None


#: protocol errors of a poll that ran while the page navigated (its execution context went away)
_NAVIGATING = re.compile(r"navigated or closed|context was destroyed|Cannot find context|Execution context", re.I)


class BrowserError(RuntimeError):
    """A protocol command failed, a page threw, or something awaited did not happen in time."""


class Browser:
    """One headless Chromium with one page, ``width x height`` CSS pixels (see the module docstring).

    Use as a context manager; :meth:`close` ends the process.
    """

    def __init__(self, binary: str, *, width: int = 1400, height: int = 900, timeout: float = 60.0):
        self.timeout = timeout
        self._profile = tempfile.TemporaryDirectory(prefix="modkit-chromium-")
        cmd_r, self._cmd_w = os.pipe()  # we write commands, Chromium reads them as fd 3
        self._out_r, out_w = os.pipe()  # Chromium writes replies as fd 4

        def fds() -> None:  # in the child, before exec: the pipe ends at 3 and 4
            os.dup2(cmd_r, 3)
            os.dup2(out_w, 4)
            os.set_inheritable(3, True)  # dup2 onto itself keeps close-on-exec
            os.set_inheritable(4, True)

        args = [
            binary,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--hide-scrollbars",
            "--remote-debugging-pipe",
            f"--user-data-dir={self._profile.name}",
            f"--window-size={width},{height}",
            "--proxy-server=127.0.0.1:9",
            "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
            "about:blank",
        ]
        # close_fds=False: fds 3 and 4 made in `fds` must survive; every other descriptor of this process is
        # non-inheritable (Python's default) and closes at exec
        self._log = open(Path(self._profile.name) / "stderr.log", "wb")
        self.proc = subprocess.Popen(
            args, preexec_fn=fds, close_fds=False, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=self._log
        )
        os.close(cmd_r)
        os.close(out_w)
        self._buf = b""
        self._id = 0
        self.events: list[dict] = []
        self.console_errors: list[str] = []
        target = self._call("Target.createTarget", {"url": "about:blank"})["targetId"]
        self.session = self._call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Page", "Runtime", "Log"):
            self.send(f"{domain}.enable")
        self.send(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
        )

    # -------------------------------------------------------------------------------------------- protocol

    def _read(self, deadline: float) -> dict:
        import select

        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise BrowserError("no reply from Chromium in time")
            ready, _, _ = select.select([self._out_r], [], [], left)
            if ready:
                chunk = os.read(self._out_r, 1 << 20)
                if not chunk:
                    raise BrowserError(f"Chromium exited: {self.stderr()[-2000:]}")
                self._buf += chunk
        msg, _, self._buf = self._buf.partition(b"\0")
        return json.loads(msg)

    def _call(self, method: str, params: Optional[dict] = None, session: Optional[str] = None) -> dict:
        self._id += 1
        msg: dict[str, Any] = {"id": self._id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self._cmd_w, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + self.timeout
        while True:
            reply = self._read(deadline)
            if reply.get("id") == self._id:
                if "error" in reply:
                    raise BrowserError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self._event(reply)

    def _event(self, msg: dict) -> None:
        if "method" not in msg:
            return
        self.events.append(msg)
        params = msg.get("params", {})
        if msg["method"] == "Runtime.exceptionThrown":
            self.console_errors.append(str(params.get("exceptionDetails", {}).get("exception", {}).get("description")))
        elif msg["method"] == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
            self.console_errors.append(params["entry"].get("text", ""))

    def stderr(self) -> str:
        """What Chromium printed on stderr so far."""
        self._log.flush()
        return (Path(self._profile.name) / "stderr.log").read_text(errors="replace")

    def send(self, method: str, params: Optional[dict] = None) -> dict:
        """One protocol command on the page's session; returns its result."""
        return self._call(method, params, self.session)

    # -------------------------------------------------------------------------------------------- page

    def eval(self, expression: str) -> Any:
        """The JSON value of a JavaScript expression in the page (promises awaited).

        Raises:
            BrowserError: the expression threw.
        """
        out = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True, "awaitPromise": True})
        if "exceptionDetails" in out:
            raise BrowserError(f"{expression[:80]}: {out['exceptionDetails'].get('exception', {}).get('description')}")
        return out.get("result", {}).get("value")

    def wait(self, expression: str, timeout: Optional[float] = None) -> Any:
        """Poll ``expression`` until it is truthy; returns its value.

        Raises:
            BrowserError: still falsy after ``timeout`` seconds (default: the browser's).
        """
        deadline = time.monotonic() + (timeout or self.timeout)
        while True:
            try:
                value = self.eval(expression)
            except BrowserError as exc:
                # a navigation under way (after a click) destroys the page's context between two polls: whether a
                # poll lands before, during or after it depends on the machine's load, so such a poll counts as
                # "not yet" and the next one reads the new page
                if not _NAVIGATING.search(str(exc)):
                    raise
                value = None
            if value:
                return value
            if time.monotonic() > deadline:
                raise BrowserError(f"timed out waiting for {expression[:120]}")
            time.sleep(0.1)

    def goto(self, url: str) -> None:
        """Open ``url`` and wait until its document has loaded (scripts included).

        A navigation that loads a document is awaited on its ``Page.loadEventFired`` event (not by polling, which
        cost up to a poll interval per page); then the same check as :meth:`wait_loaded` confirms the page.
        """
        seen = len(self.events)
        nav = self.send("Page.navigate", {"url": url})
        if nav.get("loaderId"):  # a new document (a same-document navigation has no loader and no load event)
            self._await_event("Page.loadEventFired", seen)
        self.wait_loaded(url)

    def dump_dom(self, url: str, budget_ms: int = 30000) -> str:
        """Open ``url``, let it run for ``budget_ms`` of virtual time after its load event (the clock stands still
        while a network fetch is pending), and return ``document.documentElement.outerHTML``: what
        ``chromium --headless --virtual-time-budget=... --dump-dom`` prints, without a browser start per page.

        Raises:
            BrowserError: the page did not load, or the budget did not run out, within the browser's timeout.
        """
        self.goto(url)
        seen = len(self.events)
        self.send("Emulation.setVirtualTimePolicy", {"policy": "pauseIfNetworkFetchesPending", "budget": budget_ms})
        self._await_event("Emulation.virtualTimeBudgetExpired", seen)
        try:
            return self.eval("document.documentElement.outerHTML")
        finally:  # a spent budget leaves the clock paused: the next page would never load
            self.send("Emulation.setVirtualTimePolicy", {"policy": "advance"})

    def _await_event(self, method: str, seen: int) -> dict:
        """The first event ``method`` of the page's session among the events from index ``seen`` on, read from
        Chromium until it arrives.

        Raises:
            BrowserError: none within the browser's timeout.
        """
        deadline = time.monotonic() + self.timeout
        while True:
            for msg in self.events[seen:]:
                if msg["method"] == method and msg.get("sessionId") == self.session:
                    return msg
            seen = len(self.events)
            self._event(self._read(deadline))

    def wait_loaded(self, url_prefix: str = "") -> str:
        """Wait until the page's document is complete (after a navigation); returns its address."""
        return self.wait(
            f"document.readyState === 'complete' && location.href.startsWith({json.dumps(url_prefix)}) && location.href"
        )

    def click(self, selector: str) -> None:
        """Click the element matched by ``selector`` with a real (trusted) mouse event at its centre."""
        box = self.eval(
            f"(() => {{ const e = document.querySelector({json.dumps(selector)}); if (!e) return null; "
            "e.scrollIntoView({block: 'center'}); const r = e.getBoundingClientRect(); "
            "return [r.left + r.width / 2, r.top + r.height / 2]; })()"
        )
        if not box:
            raise BrowserError(f"no element matches {selector}")
        for kind in ("mousePressed", "mouseReleased"):
            self.send(
                "Input.dispatchMouseEvent", {"type": kind, "x": box[0], "y": box[1], "button": "left", "clickCount": 1}
            )

    def type(self, text: str) -> None:
        """Type ``text`` into the focused element, one key press (keydown, input, keyup) per character: pages that
        listen to ``keyup`` (the theme's search box) see it as a person typing."""
        for ch in text:
            self.send("Input.dispatchKeyEvent", {"type": "keyDown", "text": ch, "key": ch, "unmodifiedText": ch})
            self.send("Input.dispatchKeyEvent", {"type": "keyUp", "key": ch})

    def screenshot(self, path: Path, *, full_page: bool = True) -> Path:
        """Write a PNG of the page (the whole document with ``full_page``, capped at 8,000 px) to ``path``."""
        params: dict[str, Any] = {"format": "png"}
        if full_page:
            w, h = self.eval("[document.documentElement.scrollWidth, document.documentElement.scrollHeight]")
            params.update(
                captureBeyondViewport=True, clip={"x": 0, "y": 0, "width": w, "height": min(h, 8000), "scale": 1}
            )
        data = self.send("Page.captureScreenshot", params)["data"]
        Path(path).write_bytes(base64.b64decode(data))
        return Path(path)

    # -------------------------------------------------------------------------------------------- lifetime

    def close(self) -> None:
        """End Chromium and remove its profile."""
        try:
            self._call("Browser.close")
        except (BrowserError, OSError):
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for fd in (self._cmd_w, self._out_r):
            try:
                os.close(fd)
            except OSError:
                pass
        self._log.close()
        self._profile.cleanup()

    def __enter__(self) -> "Browser":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

"""What the doors of :mod:`fuzz_doors` share: running one input in a forked child (memory-capped, killable, its
output captured), the outcome classes and how a result is classified, the record every input leaves.

Outcome classes (the same vocabulary as ``fuzz_inputs.py``, which this module imports ``_ours`` and the alarm from):

* ``named``: refused (or accepted with a note on stderr) by an error of modkit's own that names the file, field,
  flag or line (one of the input's *hints*);
* ``harmless``: accepted, and nothing went wrong (finite logits, no data lost, no bad checkpoint written);
* ``accepted-bad``: an input wrong by construction, accepted without a word;
* ``raw``: a Python or torch error escaping (the CLI's "internal error"), or a tidy ``modkit: error:`` line that
  passes some library's text through without naming any hint;
* ``crash-or-loss``: the process died (a signal, ``MemoryError``), or data / results were lost: a readable input
  recorded with 0 tokens, a non-finite checkpoint written as ``last`` / ``best``, a run folder left neither
  resumable nor restartable;
* ``hang``: no answer within the input's timeout (the child is killed);
* ``slow``: an answer, but later than the input's ``slow_s``.
"""

from __future__ import annotations

import io
import json
import os
import resource
import signal
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Optional, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fuzz_inputs as fi  # noqa: E402

REPO = fi.REPO
CLASSES = ("named", "harmless", "accepted-bad", "raw", "crash-or-loss", "hang", "slow")
#: the order in which a result's findings win: a crash is reported as a crash even when it was slow too
WORST_FIRST = ("hang", "crash-or-loss", "raw", "accepted-bad", "slow", "named", "harmless")


@dataclass
class Record:
    """One input tried: its door, label, whether it is bad by construction, the outcome and the error's first line."""

    door: str
    input: str
    bad: bool
    outcome: str
    error: str = ""
    seconds: float = 0.0
    detail: str = ""

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass
class Child:
    """What a forked child left: exit status (``None`` when killed), output, the reported exception."""

    rc: Optional[int]
    stdout: str = ""
    stderr: str = ""
    signal: Optional[int] = None
    hang: bool = False
    seconds: float = 0.0
    exc: dict = field(default_factory=dict)
    value: object = None


def warm() -> None:
    """Import here, once, what the children would each import again (they are forked from this process): the CLI,
    the registry and its plugins, training, preparation, evaluation, comparison, matplotlib."""
    import importlib

    import matplotlib

    matplotlib.use("Agg")
    import modkit
    from modkit import cli

    modkit.get_registry()
    cli.build_parser(lazy=True)
    for name in (
        "matplotlib.pyplot",
        "modkit.train.loop",
        "modkit.train.cli",
        "modkit.data.prepare",
        "modkit.evaluation.run",
        "modkit.experiments.compare",
        "safetensors.torch",
        "tokenizers",
        "zstandard",
        "pyarrow.parquet",
    ):
        try:
            importlib.import_module(name)
        except ImportError:
            pass


def _vm_bytes() -> int:
    """This process's virtual size (the base an address-space cap of a child is added to)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmSize:"):
            return int(line.split()[1]) * 1024
    return 0


def fork_call(fn: Callable[[], object], *, timeout: float, mem_gb: float = 2.0, workdir: Path) -> Child:
    """Run ``fn()`` in a forked child, its address space capped at this process's size plus ``mem_gb`` GiB, its
    stdout / stderr (Python's and the file descriptors) captured; killed after ``timeout`` seconds (``hang``).

    ``fn`` returns a JSON-able value (``Child.value``); a ``dict`` with key ``"__exc__"`` fills ``Child.exc``.
    """
    out, err, res = workdir / ".child-out", workdir / ".child-err", workdir / ".child-res"
    for p in (out, err, res):
        p.unlink(missing_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    start = time.perf_counter()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        code = 0
        try:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, signal.SIG_DFL)
            fo, fe = os.open(out, os.O_WRONLY | os.O_CREAT, 0o600), os.open(err, os.O_WRONLY | os.O_CREAT, 0o600)
            os.dup2(fo, 1)
            os.dup2(fe, 2)
            sys.stdout = io.TextIOWrapper(open(1, "wb", closefd=False), write_through=True)
            sys.stderr = io.TextIOWrapper(open(2, "wb", closefd=False), write_through=True)
            cap = _vm_bytes() + int(mem_gb * 2**30)
            resource.setrlimit(resource.RLIMIT_AS, (cap, resource.getrlimit(resource.RLIMIT_AS)[1]))
            value = fn()
            try:
                text = json.dumps(value)
            except (TypeError, ValueError):
                text = json.dumps(repr(value))
            res.write_text(text)
        except BaseException as exc:  # noqa: BLE001 - anything the code under test lets out
            try:
                res.write_text(json.dumps({"__exc__": _exc_info(exc)}))
            except BaseException:  # noqa: BLE001
                code = 3
        finally:
            try:
                sys.stdout.flush()
                sys.stderr.flush()
            except BaseException:  # noqa: BLE001
                pass
            os._exit(code)
    hang, status = False, 0
    deadline = start + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.perf_counter() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            hang = True
            break
        time.sleep(0.005)
    seconds = time.perf_counter() - start
    child = Child(rc=None, seconds=seconds, hang=hang)
    child.stdout = out.read_text(errors="replace") if out.exists() else ""
    child.stderr = err.read_text(errors="replace") if err.exists() else ""
    if not hang:
        if os.WIFSIGNALED(status):
            child.signal = os.WTERMSIG(status)
        else:
            child.rc = os.WEXITSTATUS(status)
    if res.exists() and res.stat().st_size:
        try:
            value = json.loads(res.read_text())
        except ValueError:
            value = None
        if isinstance(value, dict) and "__exc__" in value:
            child.exc = value["__exc__"]
            child.rc = 1 if child.rc == 0 else child.rc
        elif isinstance(value, dict) and "__cli__" in value:
            child.rc = value["__cli__"]["rc"]
            child.exc = value["__cli__"]["exc"] or {}
            child.value = value.get("value")
        else:
            child.value = value
    return child


def _exc_info(exc: BaseException) -> dict:
    """The reported exception: type, whether modkit raised it on purpose (``fuzz_inputs._ours``, or the CLI's
    ``UserError``), and its text."""
    ours = False
    try:
        from modkit.cli.errors import UserError

        ours = isinstance(exc, UserError) or fi._ours(exc)
    except Exception:  # noqa: BLE001
        pass
    if isinstance(exc, OSError) and getattr(exc, "filename", None):
        ours = True  # the CLI prints "FILE: reason"
    return {"type": type(exc).__name__, "ours": ours, "text": str(exc)[:2000]}


def cli_child(argv: Sequence[str], before: Optional[Callable[[], None]] = None) -> Callable[[], dict]:
    """A child function that runs ``modkit ARGV`` through :func:`modkit.cli.main` and records the exception the CLI
    reported (``_report`` is wrapped), for :func:`fork_call`. ``before`` runs first, in the child (e.g. a kill)."""

    def run() -> dict:
        os.environ.pop("MODKIT_DEBUG", None)
        from modkit import cli

        seen: dict = {}
        original = cli._report

        def report(exc, *args, **kwargs):  # the reporter's own arguments (the command line) passed on as given
            seen.update(_exc_info(exc))
            return original(exc, *args, **kwargs)

        cli._report = report
        if before is not None:
            before()
        rc = cli.main([str(a) for a in argv])
        return {"__cli__": {"rc": rc, "exc": seen}}

    return run


def first_error_line(child: Child) -> str:
    """The first ``modkit: ...`` line of stderr, else its first line, else the exception's text."""
    lines = [line for line in child.stderr.splitlines() if line.strip()]
    mine = [line for line in lines if line.startswith("modkit:")]
    text = (mine or lines or [child.exc.get("text", "")])[0]
    return text.strip()[:300]


def _names(text: str, hints: Sequence[str]) -> bool:
    low = text.lower()
    return any(h and h.lower() in low for h in hints)


def classify(
    child: Child,
    *,
    bad: bool,
    hints: Sequence[str] = (),
    harm: Optional[str] = None,
    slow_s: float = 30.0,
    warned: Optional[bool] = None,
) -> tuple[str, str]:
    """``(outcome, error or finding)`` of a CLI run in a child. ``harm``: what the caller found lost or corrupted
    (a crash-or-loss whatever the exit status); ``hints``: texts of which an error must name one (file names,
    fields, flags); ``warned``: for an accepted input, whether it was reported (default: stderr names a hint)."""
    error = first_error_line(child)
    if child.hang:
        return "hang", error or "no answer"
    if child.signal is not None:
        return "crash-or-loss", f"killed by signal {child.signal}" + (f": {error}" if error else "")
    kind = child.exc.get("type", "")
    if kind == "MemoryError" or "MemoryError" in error or "out of memory" in error.lower():
        return "crash-or-loss", error or "MemoryError"
    if harm:
        return "crash-or-loss", harm
    slow = child.seconds > slow_s
    if child.rc == 0:
        if warned is None:
            warned = bool(hints) and _names(child.stderr, hints)
        if bad and not warned:
            return "accepted-bad", ""
        if slow:
            return "slow", f"{child.seconds:.1f} s"
        return ("named" if bad else "harmless"), error if bad else ""
    lines = child.stderr.splitlines()
    start = next((k for k, line in enumerate(lines) if line.startswith("modkit:")), len(lines))
    text = "\n".join(lines[start:]) + "\n" + child.exc.get("text", "")  # the error, not the logs before it
    if "internal error" in child.stderr or "Traceback" in child.stderr or (child.exc and not child.exc.get("ours")):
        return "raw", error
    if child.rc == 2 and "usage:" in child.stderr:  # argparse: names the flag
        return ("slow" if slow else "named"), error
    if hints and not _names(text, hints):
        return "raw", error
    return ("slow" if slow else "named"), error


def tally(records: Sequence[Record]) -> dict[str, dict[str, int]]:
    """``{door: {class: count}}`` (every class present, in :data:`CLASSES` order, plus ``total``)."""
    out: dict[str, dict[str, int]] = {}
    for r in records:
        row = out.setdefault(r.door, {c: 0 for c in CLASSES})
        row[r.outcome] = row.get(r.outcome, 0) + 1
    for row in out.values():
        row["total"] = sum(v for k, v in row.items() if k != "total")
    return out


def table(records: Sequence[Record]) -> str:
    """The summary: one row per door (and a total row), one column per class, as Markdown."""
    counts = tally(records)
    head = "| door | inputs | bad | " + " | ".join(CLASSES) + " |"
    rule = "|---|---:|---:|" + "---:|" * len(CLASSES)
    rows = [head, rule]
    totals = {c: 0 for c in CLASSES}
    n_all = bad_all = 0
    for door, row in counts.items():
        n_bad = sum(1 for r in records if r.door == door and r.bad)
        rows.append(f"| {door} | {row['total']} | {n_bad} | " + " | ".join(str(row[c]) for c in CLASSES) + " |")
        for c in CLASSES:
            totals[c] += row[c]
        n_all += row["total"]
        bad_all += n_bad
    if len(counts) > 1:
        rows.append(f"| all | {n_all} | {bad_all} | " + " | ".join(str(totals[c]) for c in CLASSES) + " |")
    return "\n".join(rows)

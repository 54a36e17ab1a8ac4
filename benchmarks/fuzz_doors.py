#!/usr/bin/env python
"""Bad-input fuzzing of the doors ``fuzz_inputs.py`` does not open: forward passes, ``data prepare``, ``--resume``,
``compare --merge``, and the flags of ``eval`` / ``compare`` / ``train``.

Doors (each input labelled bad by construction or not; see the door modules for what is generated):

* ``forward`` (:mod:`fuzz_doors_data`): numeric fields of the tiny specs changed, accepted specs run forward on
  real token ids; non-finite logits from an accepted spec are ``accepted-bad``;
* ``prepare`` (:mod:`fuzz_doors_data`): ``modkit data prepare`` on truncated / garbage / odd inputs, symlinks out
  of a folder, one long record under an address-space cap, tokenizer mismatches, bad flags; 0 tokens recorded for
  a non-empty input is a loss;
* ``resume`` (:mod:`fuzz_doors_runs`): a tiny run trained once, copied, its files damaged, then ``modkit train
  --resume RUN --max-steps N``; a non-finite checkpoint written as ``last`` / ``best`` is a loss; and SIGKILL at
  every file-system step of a fresh run's saves, then resume (or restart): a folder that is neither is a loss;
* ``merge`` (:mod:`fuzz_doors_flags`): ``modkit compare --merge`` on damaged ``results.json`` files;
* ``flags`` (:mod:`fuzz_doors_flags`): bad values of ``eval``, ``compare`` and ``train`` flags.

Every CLI input runs in a forked child of this process (torch imported once), its address space capped, killed
after its timeout; forward passes run here under an alarm. Outcome classes: :mod:`fuzz_doors_core`. Inputs are
generated from ``--seed`` alone, so two runs (before and after a fix) try the very same inputs.

Usage::

    .venv/bin/python benchmarks/fuzz_doors.py --json doors.json          # every door, default counts
    .venv/bin/python benchmarks/fuzz_doors.py --door prepare --n 40      # one door, 40 inputs
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fuzz_doors_core as core  # noqa: E402

DOORS = ("forward", "prepare", "resume", "merge", "flags")
#: default inputs per door (resume: its 77 kinds of damage, then kills at 63 file-system steps; flags: every case
#: once): about 10-20 minutes on one core of a shared 2-core machine, depending on its load
DEFAULT_N = {"forward": 1000, "prepare": 400, "resume": 140, "merge": 300, "flags": 132}
#: per-door seeds derived from --seed, so a door's inputs do not depend on which other doors ran
_DOOR_SALT = {door: k for k, door in enumerate(DOORS)}


def run_door(door: str, n: int, seed: int, tmp: Path, timeout: float, emit) -> None:
    """Try ``n`` inputs of ``door``, calling ``emit(Record)`` for each."""
    rng = random.Random(seed * 1000 + _DOOR_SALT[door])
    work = tmp / door
    work.mkdir(parents=True, exist_ok=True)
    if door in ("forward", "prepare"):
        import fuzz_doors_data as m

        (m.run_forward if door == "forward" else m.run_prepare)(n, rng, work, timeout, emit)
    elif door == "resume":
        import fuzz_doors_runs as m

        m.run_resume(n, rng, work, timeout, emit)
    else:
        import fuzz_doors_flags as m

        (m.run_merge if door == "merge" else m.run_flags)(n, rng, work, timeout, emit)


def fuzz(doors, n=None, *, seed: int = 0, timeout: float = 60.0, verbose: bool = False, tmp=None) -> list:
    """Run ``doors`` (``n``: inputs per door, or ``{door: n}``, default :data:`DEFAULT_N`); the records."""
    import torch

    torch.set_num_threads(1)
    core.warm()
    records: list[core.Record] = []

    def emit(r: core.Record) -> None:
        records.append(r)
        if verbose and r.outcome not in ("named", "harmless"):
            print(f"  {r.door} {r.outcome}: {r.input} | {r.error or r.detail}"[:400], flush=True)

    with tempfile.TemporaryDirectory(prefix="fuzz-doors-", dir=tmp) as d:
        for door in doors:
            count = n.get(door, DEFAULT_N[door]) if isinstance(n, dict) else (n or DEFAULT_N[door])
            start = time.perf_counter()
            before = len(records)
            run_door(door, count, seed, Path(d), timeout, emit)
            mine = records[before:]
            counts = {c: sum(1 for r in mine if r.outcome == c) for c in core.CLASSES}
            print(
                f"{door:<8} {len(mine)} inputs in {time.perf_counter() - start:.0f} s: "
                + ", ".join(f"{c} {v}" for c, v in counts.items() if v),
                flush=True,
            )
    return records


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], allow_abbrev=False)
    p.add_argument("--door", action="append", choices=DOORS, help="a door to open (repeatable; default: all)")
    p.add_argument("--n", type=int, default=None, help="inputs per door (default: each door's own, see DEFAULT_N)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=60.0, help="seconds per input before it counts as a hang")
    p.add_argument("--memory-gb", type=float, default=8.0, help="address-space cap of this process (GiB)")
    p.add_argument("--json", metavar="FILE", help="write every record (door, input, bad, outcome, error) as JSON")
    p.add_argument("-v", "--verbose", action="store_true", help="print every input that is not named / harmless")
    args = p.parse_args(argv)
    cap = int(args.memory_gb * 2**30)
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    doors = args.door or list(DOORS)
    started = time.perf_counter()
    records = fuzz(doors, args.n, seed=args.seed, timeout=args.timeout, verbose=args.verbose)
    print()
    print(core.table(records))
    print(f"\n{len(records)} inputs in {time.perf_counter() - started:.0f} s")
    if args.json:
        doc = {
            "command": "benchmarks/fuzz_doors.py " + " ".join(argv if argv is not None else sys.argv[1:]),
            "seed": args.seed,
            "counts": core.tally(records),
            "records": [r.as_dict() for r in records],
        }
        Path(args.json).write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What recording with ``modkit.inspect`` costs: forward time off, on (everything / updates only), and after.

    .venv/bin/python benchmarks/bench_inspect.py                          # specs/tiny-llama.json, [1, 256], 1 thread
    .venv/bin/python benchmarks/bench_inspect.py --spec specs/tiny-gpt2.json --seq 128 --repeats 31

The four cases are measured interleaved (one forward of each per round, in rotating order) in eval mode under
``torch.inference_mode``; the report gives the median and the ratio to the plain forward. "after" is the same
model once a recording is over: the hooks are gone, so it must match "off" to timing noise. Not a timed test.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import modkit


def main() -> None:
    """Print a table of median forward times (ms) and ratios for each recording state."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    p.add_argument("--spec", default="specs/tiny-llama.json")
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--repeats", type=int, default=21)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    model = modkit.build(args.spec, seed=0).eval()
    seq = min(args.seq, model.spec.max_seq_len)
    ids = torch.randint(0, model.spec.vocab_size, (args.batch, seq), generator=torch.Generator().manual_seed(0))

    def plain():
        model(ids)

    def everything():
        with modkit.inspect(model):
            model(ids)

    def updates():
        with modkit.inspect(model, include=["layers.*:update"]):
            model(ids)

    cases = {"off (never recorded)": plain, "on: everything": everything, "on: layers.*:update only": updates}
    with torch.inference_mode():
        for fn in cases.values():  # warm-up
            fn()
        times: dict[str, list[float]] = {name: [] for name in [*cases, "after (recording over)"]}
        names = list(cases) + ["after (recording over)"]
        fns = [*cases.values(), plain]
        for r in range(args.repeats):
            for k in range(len(names)):
                j = (k + r) % len(names)
                start = time.perf_counter()
                fns[j]()
                times[names[j]].append(time.perf_counter() - start)
    base = statistics.median(times["off (never recorded)"])
    print(f"{args.spec}: [{args.batch}, {seq}], {args.threads} thread(s), {args.repeats} rounds, median forward")
    print(f"{'state':<28} {'ms':>9} {'ratio':>7}")
    for name in names:
        med = statistics.median(times[name])
        print(f"{name:<28} {1000 * med:>9.2f} {med / base:>7.3f}")
    left = sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())
    print(f"hooks left on the model after recording: {left}")


if __name__ == "__main__":
    main()

"""``build`` changes no process-wide state: threads building at once get their own dtype and values, a user's
``torch.nn.init`` calls in another thread keep working, and torch's default dtype and functions are untouched.

Construction used to swap ``torch.nn.init``'s functions and ``torch.set_default_dtype`` for the whole process:
two threads building float32 and bfloat16 models got each other's dtype, another thread's ``nn.init.normal_``
silently did nothing, and the default dtype could stay changed. It now runs under a torch function mode, which
torch keeps per thread.
"""

from __future__ import annotations

import threading

import pytest
import torch
from torch import nn

import modkit

from conftest import tiny_spec

DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)


def _spec(i: int) -> dict:
    # a different spec per thread: RoPE (a float32 buffer) and learned positions (a parameter in the model dtype)
    position = {"type": "rope", "theta": 10000.0} if i % 2 else {"type": "learned"}
    return tiny_spec(position=position, n_layers=2 + i % 3)


def test_concurrent_builds_get_their_own_dtype_and_values():
    n_threads, rounds = 8, 3
    references = {}
    for i in range(n_threads):
        dtype = DTYPES[i % len(DTYPES)]
        model = modkit.build(_spec(i), dtype=dtype, seed=i)
        references[i] = {k: v.clone() for k, v in model.state_dict().items()}
        references[i, "buffers"] = {k: (v.dtype, v.clone()) for k, v in model.named_buffers()}
    originals = {n: getattr(nn.init, n) for n in dir(nn.init) if not n.startswith("_")}
    default = torch.get_default_dtype()
    barrier = threading.Barrier(n_threads + 2)
    stop = threading.Event()
    failures: list[str] = []
    lock = threading.Lock()

    def fail(msg: str) -> None:
        with lock:
            failures.append(msg)

    def builder(i: int) -> None:
        dtype = DTYPES[i % len(DTYPES)]
        barrier.wait()
        for _ in range(rounds):
            meta = modkit.build(_spec(i), device="meta", dtype=dtype)
            model = modkit.build(_spec(i), dtype=dtype, seed=i)
            for m in (meta, model):
                wrong = [n for n, p in m.named_parameters() if p.dtype != dtype]
                if wrong:
                    fail(f"thread {i} ({dtype}): parameters of another dtype: {wrong[:3]}")
            for name, (bdtype, value) in references[i, "buffers"].items():
                got = dict(model.named_buffers())[name]
                if got.dtype != bdtype or not torch.equal(got, value):
                    fail(f"thread {i}: buffer {name} is {got.dtype}, expected {bdtype} and the reference values")
            for name, value in references[i].items():
                if not torch.equal(model.state_dict()[name], value):
                    fail(f"thread {i}: {name} differs from the single-threaded build")

    def user_init() -> None:  # a user's own init in another thread must keep working throughout
        t = torch.zeros(256)
        barrier.wait()
        calls = 0
        while not stop.is_set() or calls < 50:
            t.zero_()
            nn.init.normal_(t)
            calls += 1
            if float(t.abs().sum()) == 0.0:
                fail("nn.init.normal_ in another thread did nothing while a model was being built")
                return

    def watch_default() -> None:  # and the default dtype never changes
        barrier.wait()
        while not stop.is_set():
            if torch.get_default_dtype() != default:
                fail(f"the default dtype became {torch.get_default_dtype()} during a build")
                return
            if torch.empty(1).dtype != default:
                fail("a plain torch.empty in another thread got another dtype during a build")
                return

    threads = [threading.Thread(target=builder, args=(i,)) for i in range(n_threads)]
    helpers = [threading.Thread(target=user_init), threading.Thread(target=watch_default)]
    for t in threads + helpers:
        t.start()
    for t in threads:  # (no timeout: a join that gives up under load would let the checks below race the builds)
        t.join()
    stop.set()
    for t in helpers:
        t.join()
    assert not failures, failures[:10]
    assert torch.get_default_dtype() == default
    assert {n: getattr(nn.init, n) for n in originals} == originals  # the very same function objects


def test_construction_mode_is_private_to_the_building_thread():
    """While one thread is inside construction, another thread's tensors and init calls are unaffected."""
    from modkit.nn.build import _Construction

    inside, release = threading.Event(), threading.Event()
    seen = {}

    def hold() -> None:
        try:
            with torch.device("meta"), _Construction(torch.bfloat16):
                seen["inside_dtype"] = torch.empty(2).dtype
                seen["inside_device"] = torch.empty(2).device.type
                inside.set()
                release.wait()  # (no timeout: the checks below must run while this thread is inside, however slow)
        finally:
            inside.set()  # (an error above must not leave the main thread waiting)

    t = threading.Thread(target=hold)
    t.start()
    inside.wait()
    try:
        x = torch.empty(3)
        nn.init.constant_(x, 2.5)
        assert x.dtype == torch.get_default_dtype() and x.device.type == "cpu"
        assert torch.equal(x, torch.full((3,), 2.5))
    finally:
        release.set()
        t.join()
    assert seen == {"inside_dtype": torch.bfloat16, "inside_device": "meta"}


@pytest.mark.parametrize("dtype", DTYPES)
def test_explicit_dtypes_survive_construction(dtype):
    """Tensors created with an explicit dtype keep it; unnamed float factories take the build dtype."""
    from modkit.nn.build import _Construction

    with torch.device("meta"), _Construction(dtype):
        plain = torch.empty(2)
        promoted = torch.arange(4) / 2  # int -> float promotion uses the default dtype
        explicit = torch.zeros(2, dtype=torch.float32)
        converted = torch.arange(4).float()
        ints = torch.arange(4)
        linear = nn.Linear(3, 2)
    assert plain.dtype == dtype and promoted.dtype == dtype and linear.weight.dtype == dtype
    assert explicit.dtype == torch.float32 and converted.dtype == torch.float32 and ints.dtype == torch.int64

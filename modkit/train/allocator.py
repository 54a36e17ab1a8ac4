"""Keep freed host memory in the training process for the next step instead of handing it back to the system.

A CPU training step allocates and frees the same activations and gradients every step. glibc's ``malloc`` serves
blocks above its mmap threshold (128 KiB, moved adaptively up to 32 MiB) with fresh ``mmap`` pages and returns
free memory at the top of its heap to the system past its trim threshold, so each step page-faults much of its
working set back in: on nanoGPT's CPU recipe about 1,000-2,000 minor faults and 1.5-4 ms of system time in a
~35 ms step, plus the cache misses of the kernel zeroing those pages (``benchmarks/results_train_vs_loop.md``).
:func:`keep_freed_memory` raises both thresholds with ``mallopt`` (glibc's ``mallopt(3)``; the environment
variables ``MALLOC_MMAP_THRESHOLD_`` / ``MALLOC_TRIM_THRESHOLD_`` set the same before a process starts, and
preloading jemalloc or tcmalloc, which PyTorch's CPU performance guides suggest, has the same aim): blocks up
to 32 MiB come from the heap and up to 1 GiB of free heap stays in the process, so a step reuses the pages of
the one before. The process then holds its peak working set, which a training step reaches every step anyway.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import platform

#: glibc's ``mallopt`` parameters (malloc.h)
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
#: blocks up to this many bytes come from the heap (glibc's largest adaptive threshold on 64-bit systems)
MMAP_THRESHOLD = 32 << 20
#: free memory at the top of the heap kept in the process, in bytes
TRIM_THRESHOLD = 1 << 30

_done = False


def keep_freed_memory() -> bool:
    """Raise glibc's mmap and trim thresholds for this process (once); returns whether they are set (``False``
    without glibc, e.g. on macOS, Windows or musl, where nothing is changed). Never raises."""
    global _done
    if _done:
        return True
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    _done = bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
    return _done

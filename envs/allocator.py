"""Keep freed CPU memory in the process, so big tensors reuse pages instead of faulting in new ones.

PyTorch's CPU tensors come from the C library's `malloc`. glibc serves large requests (above a few
hundred KiB to 32 MiB, adapting as it goes; always from 32 MiB) with fresh `mmap`s and returns them to
the kernel on `free`, so a tensor allocated and freed every step (an env's `[B, n, n, K]` pairwise
terms, an update's activations) is faulted in and zeroed page by page every step. At 4096 envs x 24
agents that is about 110,000 page faults per `navigation` step, a third of its time on the 2-core CPU.

`retain_freed_memory()` tells glibc to serve every request from its heap (no `mmap`) and never trim
the heap, so memory, once touched, is reused. The process then keeps its peak memory until it exits.
It changes the whole process (including any other simulator running in it) and is a no-op off
glibc. `marl train` calls it when it trains on the CPU; the benchmarks call it for their own process
and pass `GLIBC_ENVIRONMENT` (the same settings as environment variables) to the peers' processes.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import platform

# mallopt parameters (glibc's malloc.h).
_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4
_NEVER_TRIM = 2**31 - 1  # bytes of free heap top before trimming: never, in practice

# The same settings for a child process (glibc reads them at start-up).
GLIBC_ENVIRONMENT = {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": str(_NEVER_TRIM)}

_applied = False


def retain_freed_memory() -> bool:
    """Make glibc's malloc keep freed memory for reuse (see the module docstring). Returns whether the
    settings are in effect (False off Linux/glibc). Calling it again does nothing more."""
    global _applied
    if _applied:
        return True
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    _applied = bool(libc.mallopt(_M_MMAP_MAX, 0)) and bool(libc.mallopt(_M_TRIM_THRESHOLD, _NEVER_TRIM))
    return _applied

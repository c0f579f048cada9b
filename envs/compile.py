"""`torch.compile` with a fallback: the first call compiles; if compiling fails, one clear warning and
the function runs eagerly from then on. On CUDA the graphs are captured as CUDA graphs
(`mode="reduce-overhead"`), which removes the per-kernel launch cost of small ops; on the CPU, Inductor."""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable

import torch

_warned = False


def maybe_compile(fn: Callable, enabled: bool, device: torch.device) -> Callable:
    """`fn` compiled when `enabled` (falling back to `fn` itself if compilation fails), else `fn`. When
    the compiled call raises, `fn` runs eagerly: if that raises too, the error is `fn`'s own and is
    raised without the fallback warning."""
    if not enabled:
        return fn
    mode = "reduce-overhead" if device.type == "cuda" else None
    compiled = torch.compile(fn, dynamic=False, mode=mode)
    state = {"call": compiled}

    @functools.wraps(fn)
    def call(*args, **kwargs):
        try:
            return state["call"](*args, **kwargs)
        except Exception as error:  # noqa: BLE001  (any compiler failure falls back, once, loudly)
            if state["call"] is fn:
                raise
            compile_error = error
        # Outside the `except`: an error `fn` raises eagerly too (the env's own, a bad input) is its own,
        # raised as is, neither blamed on torch.compile nor chained to the compiler's traceback.
        result = fn(*args, **kwargs)
        _warn(fn, compile_error)
        state["call"] = fn
        return result

    return call


def _warn(fn: Callable, error: Exception) -> None:
    global _warned
    if not _warned:
        warnings.warn(
            f"torch.compile could not compile {getattr(fn, '__qualname__', fn)} ({type(error).__name__}: "
            f"{str(error).splitlines()[0] if str(error) else ''}); running eagerly instead",
            RuntimeWarning,
            stacklevel=3,
        )
        _warned = True

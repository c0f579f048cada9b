"""`torch.compile` with a fallback: the first call compiles; if compiling fails, one clear warning and
the function runs eagerly from then on. On CUDA the graphs are captured as CUDA graphs
(`mode="reduce-overhead"`), which removes the per-kernel launch cost of small ops; whether they were,
and why not, is collected per function name by `envs.cudagraphs`. On the CPU the
backend is Inductor with AOTAutograd's cache open to custom autograd Functions (`_inductor_cpu`), and
its C++ wrapper on request (`cpp_wrapper`)."""

from __future__ import annotations

import contextlib
import functools
import warnings
from collections.abc import Callable

import torch
from torch.utils._pytree import tree_map_only

from envs import cudagraphs

_warned = False


def maybe_compile(
    fn: Callable, enabled: bool, device: torch.device, cpp_wrapper: bool = False, name: str | None = None
) -> Callable:
    """`fn` compiled when `enabled` (falling back to `fn` itself if compilation fails), else `fn`. When
    the compiled call raises, `fn` runs eagerly: if that raises too, the error is `fn`'s own and is
    raised without the fallback warning.

    On CUDA every call is watched: `envs.cudagraphs.reports()[name]` (`name` defaults to `fn`'s qualified
    name) says whether its CUDA graphs were captured, and if not, why.

    `cpp_wrapper` (CPU): Inductor's C++ wrapper calls the graph's kernels, for a function run on a second
    thread. Inductor's Python wrapper calls its fused C++ kernels with Python's GIL held, so a thread
    running it stalls every other thread's Python (a rollout of VMAS beside it, say); the C++ wrapper
    lets the GIL go for the whole graph. Not the default: no faster alone, and a cold compile takes longer."""
    if not enabled:
        return fn
    name = name or getattr(fn, "__qualname__", repr(fn))
    retry = None
    if device.type == "cuda":
        compiled = _watched(torch.compile(fn, dynamic=False, mode="reduce-overhead"), name)
        # Inductor's loop reordering after fusion (GPU only) asserts on a graph that mixes foreach ops with
        # reductions over tensors of different shapes, as the fused update step does (torch issue 176591,
        # seen on torch 2.11): one retry without it before running eagerly.
        options = {"triton.cudagraphs": True, "loop_ordering_after_fusion": False}  # reduce-overhead, less that
        retry = functools.partial(_watched, torch.compile(fn, dynamic=False, options=options), name)
    else:
        compiled = torch.compile(fn, dynamic=False, backend=functools.partial(_inductor_cpu, cpp_wrapper=cpp_wrapper))
    state = {"call": compiled, "retry": retry}

    @functools.wraps(fn)
    def call(*args, **kwargs):
        while True:
            try:
                return state["call"](*args, **kwargs)
            except Exception as error:  # noqa: BLE001  (any compiler failure falls back, once, loudly)
                if state["call"] is fn:
                    raise
                compile_error = error
            if state["retry"] is None or type(compile_error).__name__ != "InductorError":
                break
            cudagraphs.record_retry(name, compile_error)
            state["call"], state["retry"] = state["retry"](), None
        # Outside the `except`: an error `fn` raises eagerly too (the env's own, a bad input) is its own,
        # raised as is, neither blamed on torch.compile nor chained to the compiler's traceback.
        result = fn(*args, **kwargs)
        _warn(fn, compile_error)
        if device.type == "cuda":
            cudagraphs.record_fallback(name, compile_error)
        state["call"] = fn
        return result

    return call


def _watched(compiled: Callable, name: str) -> Callable:
    def call(*args, **kwargs):
        with cudagraphs.watching(name):
            result = compiled(*args, **kwargs)
        # A CUDA graph's outputs live in its memory pool, which the next compiled call (of any function)
        # overwrites: what it returns is copied out. State kept between calls is written in place instead
        # (`MultiAgentEnv.hold_state_in_place`, the rollout's held observation), which copies nothing.
        return tree_map_only(torch.Tensor, torch.clone, result)

    return call


def _inductor_cpu(graph: torch.fx.GraphModule, example_inputs: list, cpp_wrapper: bool = False) -> Callable:
    """torch's Inductor backend, with AOTAutograd's on-disk cache allowed to keep graphs that hold a
    custom autograd Function (`marl.optim.tanh`'s on the CPU). torch bypasses that cache for them by
    default, so every `marl train --compile` would trace its update's graph through AOTAutograd again
    before loading Inductor's cached code. The cache key holds the graph the Function's forward and
    backward were traced into, so an edited Function is a new key."""
    from torch._inductor.compile_fx import compile_fx

    config = torch._functorch.config
    if hasattr(config, "autograd_cache_allow_custom_autograd_functions"):  # older torch has no such switch
        allow = config.patch(autograd_cache_allow_custom_autograd_functions=True)
    else:
        allow = contextlib.nullcontext()
    with allow:
        return compile_fx(graph, example_inputs, config_patches={"cpp_wrapper": cpp_wrapper})


def _warn(fn: Callable, error: Exception) -> None:
    global _warned
    if not _warned:
        warnings.warn(
            f"torch.compile could not compile {getattr(fn, '__qualname__', fn)} ({cudagraphs.describe_error(error)}); "
            "running eagerly instead",
            RuntimeWarning,
            stacklevel=3,
        )
        _warned = True

"""Catch host synchronisation in code that must stay on the device.

`forbid_host_sync()` is a context manager under which any operation that would make the host wait for
the device raises `HostSyncError`: reading values (`.item()`, `.tolist()`, `.numpy()`, `.cpu()`,
`bool(t)`, `int(t)`, `float(t)`, `if t:`), and ops whose output shape depends on data (`nonzero`,
boolean-mask indexing and assignment, `masked_select`, `unique`, `repeat_interleave` by a tensor).
It works on CPU tensors too, so CI (without a GPU) proves that reset, step, rollout, advantages and
loss never wait on the device.

`allow_host_sync()` lifts the guard for a block of code the caller cannot change: a wrapped third-party
simulator (VMAS asserts on action values and branches on `tensor.any()` inside its own step). The
adapter's own code around such calls stays under the guard.
"""

from __future__ import annotations

import contextlib
import os
import threading
import traceback
from collections.abc import Iterator

import tensordict
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode


class HostSyncError(RuntimeError):
    """An operation synchronised with the host where that is forbidden."""


_allowed = threading.local()  # .depth: how many `allow_host_sync` blocks enclose the running code


def _is_allowed() -> bool:
    return getattr(_allowed, "depth", 0) > 0


_SYNCING_METHODS = {
    torch.Tensor.item: ".item()",
    torch.Tensor.tolist: ".tolist()",
    torch.Tensor.numpy: ".numpy()",
    torch.Tensor.cpu: ".cpu()",
    torch.Tensor.__bool__: "bool(tensor) (e.g. `if tensor:` or `and`/`or` on a tensor)",
    torch.Tensor.__int__: "int(tensor)",
    torch.Tensor.__float__: "float(tensor)",
    torch.Tensor.__index__: "using a tensor as a Python index",
    torch.Tensor.__array__: "numpy.asarray(tensor)",
}

_DATA_DEPENDENT_OPS = {
    "aten::_local_scalar_dense": "reading a tensor value on the host",
    "aten::nonzero": "nonzero (output shape depends on data)",
    "aten::nonzero_static": None,  # fixed output size: allowed
    "aten::masked_select": "masked_select (output shape depends on data)",
    "aten::_unique2": "unique (output shape depends on data)",
    "aten::unique_dim": "unique (output shape depends on data)",
    "aten::unique_consecutive": "unique_consecutive (output shape depends on data)",
}


_LIBRARIES = (os.path.dirname(torch.__file__), os.path.dirname(tensordict.__file__), os.path.abspath(__file__))


def _error(what: str) -> HostSyncError:
    """The error for `what`, naming the line that asked for it: the innermost caller outside torch,
    tensordict and this module (an env's `_reset`, say), which a traceback buries under torch's frames."""
    callers = [f for f in traceback.extract_stack() if not os.path.abspath(f.filename).startswith(_LIBRARIES)]
    if not callers:
        return HostSyncError(f"host sync: {what} is not allowed here")
    line = callers[-1]
    return HostSyncError(
        f"host sync: {what} is not allowed here (at {line.filename}:{line.lineno} in {line.name}: `{line.line}`)"
    )


def _is_bool_index(indices) -> bool:
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in indices if i is not None)


class _ForbidMethods(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if _is_allowed():
            return func(*args, **kwargs)
        what = _SYNCING_METHODS.get(func)
        if what is not None:
            raise _error(what)
        if func is torch.Tensor.to and args and isinstance(args[0], torch.Tensor):
            target = kwargs.get("device", next((a for a in args[1:] if isinstance(a, (str, torch.device))), None))
            if target is not None and torch.device(target).type == "cpu" and args[0].device.type != "cpu":
                raise _error("copying a device tensor to the CPU")
        return func(*args, **kwargs)


class _ForbidDataDependentOps(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if _is_allowed():
            return func(*args, **kwargs)
        name = func._schema.name
        what = _DATA_DEPENDENT_OPS.get(name)
        if name in ("aten::index", "aten::index_put", "aten::index_put_", "aten::_index_put_impl_"):
            if len(args) > 1 and _is_bool_index(args[1]):
                what = "boolean-mask indexing (use torch.where instead)"
        if name == "aten::repeat_interleave" and func._overloadname != "self_int" and kwargs.get("output_size") is None:
            what = "repeat_interleave by a tensor (output shape depends on data)"
        if what is not None:
            raise _error(what)
        return func(*args, **kwargs)


@contextlib.contextmanager
def forbid_host_sync() -> Iterator[None]:
    """Raise `HostSyncError` on any host sync or data-dependent shape inside the block."""
    with _ForbidMethods(), _ForbidDataDependentOps():
        yield


@contextlib.contextmanager
def allow_host_sync() -> Iterator[None]:
    """Suspend `forbid_host_sync` inside the block, for code the caller does not own (a wrapped
    simulator); outside any `forbid_host_sync` block it does nothing."""
    _allowed.depth = getattr(_allowed, "depth", 0) + 1
    try:
        yield
    finally:
        _allowed.depth -= 1

"""Catch host synchronisation in code that must stay on the device.

`forbid_host_sync()` is a context manager under which any operation that would make the host wait for
the device raises `HostSyncError`: reading values (`.item()`, `.tolist()`, `.numpy()`, `.cpu()`,
`bool(t)`, `int(t)`, `float(t)`, `if t:`, `F.one_hot` without `num_classes`), and ops whose output shape
depends on data (`nonzero`, boolean-mask indexing and assignment, `masked_select`, `unique`,
`repeat_interleave` by a tensor). What syncs on the CPU only passes: `F.one_hot(index, num_classes)` checks
the range of a CPU tensor's indices on the host, of a CUDA tensor's by a device assert.
It works on CPU tensors too, so CI (without a GPU) proves that reset, step, rollout, advantages and
loss never wait on the device.

`forbid_host_sync(device)` also forbids host->device copies into `device`, the device the guarded code
targets: a tensor built from host data on it (`torch.tensor(3.0, device=d)`, `torch.as_tensor(list,
device=d)`, `t.new_tensor(...)`), or a host tensor moved to it (`.to(d)`, `.cuda()`, `dst.copy_(src)`,
`dst[i] = src`). On CUDA such a copy from pageable memory makes the host wait. Allocating on the device
(`torch.zeros/full/empty/arange/randn(..., device=d)`) copies nothing and passes. On the CPU no copy
happens, so `device="cpu"` simulates a remote device for CI: a CPU tensor the block creates without
naming a device (`torch.zeros(3)`, `torch.tensor(x)`, and what is computed from such tensors only) is
a host tensor, every other CPU tensor (those made before the block, or with `device=d`) lives on the
device, and a copy from the one to the other raises as it would cost a sync on a GPU. (`torch.from_numpy`
and `torch.Tensor(...)` bypass torch's function modes: their tensors count as host tensors on a real
device only.)

`allow_host_sync()` lifts the guard for a block of code the caller cannot change: a wrapped third-party
simulator (VMAS asserts on action values and branches on `tensor.any()` inside its own step). The
adapter's own code around such calls stays under the guard.
"""

from __future__ import annotations

import contextlib
import functools
import linecache
import os
import sys
import threading
from collections.abc import Iterator

import tensordict
import torch
from tensordict import TensorDictBase
from torch.overrides import TorchFunctionMode
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.weak import WeakTensorKeyDictionary


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


def caller(skip: tuple[str, ...] = ()) -> tuple[str, int, str] | None:
    """Where the running op was asked for, `(file, line, function)`: the innermost caller outside torch,
    tensordict, this module and the files `skip` (an env's `_reset`, say), which a traceback buries under
    torch's frames; None when there is none. Walks the frames without reading source (cheap per op)."""
    frame = sys._getframe(1)
    while frame is not None:
        filename = frame.f_code.co_filename
        if not _is_library(filename, skip):
            return filename, frame.f_lineno, frame.f_code.co_name
        frame = frame.f_back
    return None


@functools.lru_cache(maxsize=4096)
def _is_library(filename: str, skip: tuple[str, ...]) -> bool:
    """Whether `caller` passes over `filename`'s frames: cached, as `check_env` asks for every op it counts."""
    return os.path.abspath(filename).startswith(_LIBRARIES + tuple(os.path.abspath(path) for path in skip))


def describe_caller(where: tuple[str, int, str]) -> str:
    """`caller()`'s answer as `file:line in function: `code``."""
    filename, lineno, name = where
    return f"{filename}:{lineno} in {name}: `{linecache.getline(filename, lineno).strip()}`"


def _error(what: str, kind: str = "host sync") -> HostSyncError:
    """The error for `what`, naming the line that asked for it (`caller`)."""
    where = caller()
    if where is None:
        return HostSyncError(f"{kind}: {what} is not allowed here")
    return HostSyncError(f"{kind}: {what} is not allowed here (at {describe_caller(where)})")


def _is_bool_index(indices) -> bool:
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in indices if i is not None)


_FROM_DATA = {torch.tensor: "torch.tensor", torch.as_tensor: "torch.as_tensor", torch.asarray: "torch.asarray"}
_MOVES = {torch.Tensor.to: ".to", torch.Tensor.cuda: ".cuda()"}


def _to_target(args, kwargs) -> torch.device | torch.Tensor | None:
    """Where `tensor.to(*args[1:], **kwargs)` puts the tensor: a device, a tensor (`.to(other)`), or None."""
    for a in (kwargs.get("device"), *args[1:]):
        if isinstance(a, (torch.Tensor, torch.device)):
            return a
        if isinstance(a, (str, int)) and not isinstance(a, bool):
            return torch.device(a)
    return None


class _ForbidMethods(TorchFunctionMode):
    def __init__(self, device: torch.device | str | None = None) -> None:
        super().__init__()
        self.device = None if device is None else torch.device(device)  # None: host->device copies pass
        self.simulate = self.device is not None and self.device.type == "cpu"
        self.host = WeakTensorKeyDictionary()  # when simulating: the block's host tensors (see the module doc)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if _is_allowed():
            return func(*args, **kwargs)
        what = _SYNCING_METHODS.get(func)
        if what is not None:
            raise _error(what)
        # F.one_hot(index, n) checks the range of a CPU tensor's indices on the host, of a CUDA tensor's by a
        # device assert: the CPU's check is no sync on a GPU, so it is let through.
        cpu_only_sync = contextlib.nullcontext()
        if func is torch.nn.functional.one_hot:
            num_classes = args[1] if len(args) > 1 else kwargs.get("num_classes", -1)
            if num_classes < 0:
                raise _error("one_hot without num_classes (it reads the largest index on the host; pass num_classes)")
            if args[0].device.type == "cpu":
                cpu_only_sync = allow_host_sync()
        if func is torch.Tensor.to and args and isinstance(args[0], torch.Tensor):
            target = _to_target(args, kwargs)
            if isinstance(target, torch.device) and target.type == "cpu" and args[0].device.type != "cpu":
                raise _error("copying a device tensor to the CPU")
        if self.device is None:
            with cpu_only_sync:
                return func(*args, **kwargs)
        what = self._host_to_device(func, args, kwargs)
        if what is not None:
            raise _error(what, "host-to-device copy")
        with cpu_only_sync:
            out = func(*args, **kwargs)
        if self.simulate and self._makes_host_tensors(func, args, kwargs):
            for t in pytree.tree_leaves(out):
                if isinstance(t, torch.Tensor) and t.device.type == "cpu":
                    self.host[t] = True
        return out

    def _is_host(self, t) -> bool:
        return isinstance(t, torch.Tensor) and t.device.type == "cpu" and (not self.simulate or t in self.host)

    def _is_remote(self, target: torch.device | torch.Tensor) -> bool:
        if isinstance(target, torch.Tensor):
            return not self._is_host(target)
        return target.type != "cpu" or self.simulate

    def _host_to_device(self, func, args, kwargs) -> str | None:
        """What `func(*args, **kwargs)` copies from the host to the device, if it does."""
        if func in _FROM_DATA or func is torch.Tensor.new_tensor:
            new = func is torch.Tensor.new_tensor
            data = args[1] if new else (args[0] if args else kwargs.get("data", kwargs.get("obj")))
            device = kwargs.get("device")
            if device is not None:
                remote = self._is_remote(torch.device(device))
            elif new:
                remote = not self._is_host(args[0])
            elif isinstance(data, torch.Tensor):
                return None  # stays where it is
            else:  # the default device: on the CPU a host tensor
                remote = torch.get_default_device().type != "cpu"
            name = ".new_tensor" if new else _FROM_DATA[func]
            if remote and not isinstance(data, torch.Tensor):
                return f"building a tensor from host data (Python numbers, lists, arrays) on the device ({name})"
            if remote and self._is_host(data):
                return f"moving a host tensor to the device ({name})"
        elif func in _MOVES and args and self._is_host(args[0]):
            target = torch.device("cuda") if func is torch.Tensor.cuda else _to_target(args, kwargs)
            if target is not None and self._is_remote(target):
                return f"moving a host tensor to the device ({_MOVES[func]})"
        elif func is torch.Tensor.copy_ and len(args) > 1 and self._is_host(args[1]) and not self._is_host(args[0]):
            return "copy_ from a host tensor into a device tensor"
        elif func is torch.Tensor.__setitem__ and len(args) > 2 and not self._is_host(args[0]):
            value = args[2]  # a 0-d host value is read on the host and filled in, without a copy
            if self._is_host(value) and value.dim() > 0:
                return "assigning a host tensor into a device tensor (`device_tensor[i] = host_tensor`)"
        return None

    def _makes_host_tensors(self, func, args, kwargs) -> bool:
        """When simulating: whether `func`'s CPU outputs are host tensors: made without naming a device,
        from host tensors only, or from no tensor at all (`torch.zeros(3)`, `torch.tensor(x)`)."""
        if kwargs.get("device") is not None or (func in _MOVES and _to_target(args, kwargs) is not None):
            return False
        inputs = [x for x in pytree.tree_leaves((args, kwargs)) if isinstance(x, (torch.Tensor, TensorDictBase))]
        return all(self._is_host(x) for x in inputs)


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
def forbid_host_sync(device: torch.device | str | None = None) -> Iterator[None]:
    """Raise `HostSyncError` on any host sync or data-dependent shape inside the block; with `device`
    (the device the block's code targets), on host->device copies into it too (`device="cpu"`
    simulates a remote device, see the module doc)."""
    with _ForbidMethods(device), _ForbidDataDependentOps():
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

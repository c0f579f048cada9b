"""A faster `associative_scan` for Triton's interpreter, installed by `conftest.py` when the tests run the
kernels interpreted (no GPU).

The interpreter runs an `associative_scan` with a Python `combine_fn` one element at a time (about 50 us
each: seconds per call of the kernel tests' GAE and returns; the training tests take the torch paths,
tests/marl/conftest.py). `scan_slice_by_slice` runs it
one slice along the scan axis at a time, the combine applied to whole slices: the same values for an
elementwise combine such as the kernels' (`kernels._common.then_earlier`). `reverse` is handled by the
caller (`ScanOps.apply_impl`). Test support only: a patch of Triton's internals has no place in the
library, and without it the kernels still run interpreted, only slower.
"""

from __future__ import annotations

import numpy as np
import triton.language as tl


def scan_slice_by_slice(self, inputs):
    data = [np.moveaxis(x.handle.data, self.axis, 0) for x in inputs]  # scan axis first
    outputs = [np.empty_like(d) for d in data]
    carried = None
    for i in range(data[0].shape[0]):
        step = tuple(self.to_tensor(d[i], x.dtype) for d, x in zip(data, inputs, strict=True))
        carried = step if carried is None else self.combine_fn.fn(*carried, *step)
        carried = carried if isinstance(carried, tuple) else (carried,)
        for out, value in zip(outputs, carried, strict=True):
            out[i] = np.reshape(value.handle.data, out[i].shape) if isinstance(value, tl.tensor) else value
    return [self.to_tensor(np.moveaxis(out, 0, self.axis), x.dtype) for out, x in zip(outputs, inputs, strict=True)]


def install() -> None:
    from triton.runtime.interpreter import ScanOps

    ScanOps.generic_scan = scan_slice_by_slice

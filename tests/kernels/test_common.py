"""The helpers every op shares: the blocked backwards recurrence of the torch paths and the column layout
of the Triton kernels."""

from __future__ import annotations

import pytest
import torch

from kernels._common import column_layout, reverse_recurrence_, then_earlier, tl, triton_jit


def one_step_at_a_time(out, coefficient):
    out = out.clone()
    for t in range(out.shape[0] - 2, -1, -1):
        out[t] += coefficient[t] * out[t + 1]
    return out


@pytest.mark.parametrize("coefficient_batch", [(6, 3), (6, 1)], ids=["per-agent", "broadcast-over-agents"])
def test_blocked_recurrence_matches_one_step_at_a_time(coefficient_batch):
    # Short rows: from T = 48 on, blocks of ~sqrt(T) rows, with every tail length up to T = 81.
    generator = torch.Generator().manual_seed(0)
    for num_steps in [1, 2, 3, 47, *range(48, 82), 99, 100, 101, 257, 1024]:
        out = torch.randn(num_steps, 6, 3, generator=generator)
        coefficient = torch.rand(num_steps, *coefficient_batch, generator=generator)
        coefficient[torch.rand(coefficient.shape, generator=generator) < 0.1] = 0.0  # episode ends
        expected = one_step_at_a_time(out, coefficient)
        torch.testing.assert_close(reverse_recurrence_(out, coefficient), expected, msg=f"T={num_steps}")


ROWS = {
    "long-rows": ((100, 4096), (100, 4096)),
    "rows-over-the-parallel-grain": ((60, 700, 50), (60, 700, 50)),
    "over-the-grain-with-flags-broadcast": ((60, 700, 50), (60, 1, 50)),
}


@pytest.mark.parametrize("shape, coefficient_shape", ROWS.values(), ids=ROWS.keys())
def test_long_rows_take_one_op_per_step(shape, coefficient_shape):
    generator = torch.Generator().manual_seed(1)
    out, coefficient = (
        torch.randn(shape, generator=generator),
        torch.rand(coefficient_shape, generator=generator),
    )
    kept = coefficient.clone()
    expected = one_step_at_a_time(out, coefficient)
    torch.testing.assert_close(reverse_recurrence_(out, coefficient), expected)
    assert torch.equal(coefficient, kept)  # the blocked path would have overwritten it


LAYOUTS = {
    "contiguous": ([torch.zeros(5, 4, 3, 1)], (1, 12), [[12, 0, 1]]),
    "env-flag-over-agents": (
        [torch.zeros(5, 4, 3, 1), torch.zeros(5, 4, 1, 1)],
        (4, 3),
        [[12, 3, 1], [4, 1, 0]],
    ),
    "team-reward-over-envs": ([torch.zeros(5, 4, 3), torch.zeros(5, 1, 3)], (4, 3), [[12, 3, 1], [3, 0, 1]]),
    "transposed": ([torch.zeros(5, 3, 4).transpose(1, 2)], (4, 3), [[12, 1, 4]]),
    "no-batch-dims": ([torch.zeros(5)], (1, 1), [[1, 0, 0]]),
}


@pytest.mark.parametrize("tensors, grid, strides", LAYOUTS.values(), ids=LAYOUTS.keys())
def test_column_layout_reads_through_strides(tensors, grid, strides):
    shape = tensors[0].shape
    n1, n2, laid_out, flat_strides = column_layout(shape, tensors)
    assert (n1, n2) == grid
    assert all(a is b for a, b in zip(laid_out, tensors, strict=True))  # no copies
    assert [flat_strides[3 * i : 3 * i + 3] for i in range(len(tensors))] == strides


def test_blocks_are_capped_so_that_every_op_stays_under_the_parallel_grain():
    # [128, 1000, 3]: sqrt(128) ~ 11 blocks of 3000 columns would be 33000 elements per op; 10 are used.
    generator = torch.Generator().manual_seed(2)
    out, coefficient = (
        torch.randn(128, 1000, 3, generator=generator),
        torch.rand(128, 1000, 1, generator=generator),
    )
    expected = one_step_at_a_time(out, coefficient)
    torch.testing.assert_close(reverse_recurrence_(out, coefficient), expected)


def _scan_test(a_ptr, c_ptr, out_a_ptr, out_c_ptr, AXIS: tl.constexpr, REVERSE: tl.constexpr):
    offsets = tl.arange(0, 8)[:, None] * 4 + tl.arange(0, 4)[None, :]  # [8, 4], row-major
    a, c = tl.load(a_ptr + offsets), tl.load(c_ptr + offsets)
    a, c = tl.associative_scan((a, c), axis=AXIS, combine_fn=then_earlier, reverse=REVERSE)
    tl.store(out_a_ptr + offsets, a)
    tl.store(out_c_ptr + offsets, c)


_scan_test_kernel = triton_jit(_scan_test)


@pytest.mark.needs_interpreter
@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
@pytest.mark.parametrize("axis", [0, 1])
def test_interpreter_scan_slice_by_slice_matches_element_by_element(axis, reverse):
    # The interpreter's associative_scan runs slice by slice in the tests (conftest installs
    # tests.interpreter_scan over Triton's element-by-element loop): both axes and directions, against a loop.
    from triton.runtime.interpreter import ScanOps

    from tests.interpreter_scan import scan_slice_by_slice

    assert ScanOps.generic_scan is scan_slice_by_slice
    generator = torch.Generator().manual_seed(0)
    a, c = torch.rand(8, 4, generator=generator), torch.randn(8, 4, generator=generator)
    out_a, out_c = torch.empty_like(a), torch.empty_like(c)
    _scan_test_kernel[(1,)](a, c, out_a, out_c, AXIS=axis, REVERSE=reverse)
    a, c = a.movedim(axis, 0), c.movedim(axis, 0)  # scan axis first
    order = range(a.shape[0] - 1, -1, -1) if reverse else range(a.shape[0])
    expected_a, expected_c, carried = torch.empty_like(a), torch.empty_like(c), None
    for i in order:
        carried = (a[i], c[i]) if carried is None else (carried[0] * a[i], c[i] + a[i] * carried[1])
        expected_a[i], expected_c[i] = carried
    torch.testing.assert_close(out_a, expected_a.movedim(0, axis))
    torch.testing.assert_close(out_c, expected_c.movedim(0, axis))

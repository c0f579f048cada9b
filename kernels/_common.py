"""What every op in `kernels` shares: input checks, backend dispatch, the column layout the Triton kernels
read through, their launcher, and the backwards recurrence of the fast torch paths.

Every op here is a backwards linear recurrence over time, `y[t] = c[t] + a[t] * y[t + 1]`, run independently
for each column of a time-major `[T, *batch]` tensor. The Triton kernels give each program a block of
columns and walk time backwards a tile of steps at a time: a tile's `a` and `c` are computed for all its
steps at once, and the recurrence inside the tile is a parallel scan (`backwards_recurrence`). The torch
paths compute `c` and `a` in a few vectorised passes and then run the recurrence with fused ops over
contiguous rows (`reverse_recurrence_`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Literal

import torch

try:
    import triton
    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction
except ImportError:  # Triton is Linux-only; without it every call takes a torch path
    triton = tl = InterpretedFunction = None

Backend = Literal["auto", "triton", "torch", "reference"]
BACKENDS = ("auto", "triton", "torch", "reference")

# Without a GPU, triton.autotune cannot time configurations: the interpreter runs this fixed one. A wide
# block means few programs, and each program costs the interpreter a Python loop over its tiles (and,
# inside each, one scan step per row).
CPU_MAX_BLOCK = 32768
CPU_TILE = 16


def triton_jit(fn: Callable) -> Callable | None:
    """`triton.jit`, or None where Triton is not installed (the op then only has its torch paths)."""
    return triton.jit(fn) if triton is not None else None


def autotuned(kernel: Callable | None) -> Callable | None:
    """The kernel autotuned over block width, time tile and warps, keyed on the problem size (GPU only)."""
    if kernel is None or isinstance(kernel, InterpretedFunction):
        return None
    # A program holds a [TILE, BLOCK] tile: all its loads are in flight together, and with 8 or 16
    # elements per thread (warps = TILE * BLOCK / 32 / 8 or / 16) the tile's rows are spread over threads
    # that scan them together: N * TILE / 8 or / 16 threads in all, where one thread per column walked
    # all of T. sm_90 builds take 80 registers (8 per thread) or 128-143 (16) and spill none; 32 per
    # thread took ~200, under 10 warps per SM. BLOCK >= 32: each row's loads are whole 128-byte lines.
    configs = [
        triton.Config({"BLOCK": block, "TILE": tile}, num_warps=tile * block // (32 * per_thread))
        for block in (32, 64, 128)
        for tile in (16, 32, 64)
        for per_thread in (8, 16)
        if 1 <= tile * block // (32 * per_thread) <= 8
    ]
    return triton.autotune(configs=configs, key=["T", "N"])(kernel)


def check_unit_interval(op: str, name: str, x: float, accepted: str = "a Python float in [0, 1]") -> float:
    """`x` as a float, or an error unless it is a real number in [0, 1]; `accepted` names what `op` takes."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        kind = type(x).__name__ if type(x).__module__ == "builtins" else f"{type(x).__module__}.{type(x).__name__}"
        raise TypeError(
            f"{op}: {name} must be {accepted}, got {kind}"  # numpy.float32, not float32 (a tensor's dtype)
            + (" (pass float(tensor) once, outside the training loop)" if isinstance(x, torch.Tensor) else "")
        )
    if not 0.0 <= x <= 1.0:  # also rejects NaN
        raise ValueError(f"{op}: {name} = {x} is outside [0, 1]")
    return float(x)


def check_per_column(op: str, name: str, x: float | torch.Tensor, shape: torch.Size, device: torch.device):
    """A hyper-parameter of `op` over inputs `[T, *batch]` of `shape` on `device`: a Python float in [0, 1]
    (checked), or a float32 tensor on `device` of one value per column, returned as is.

    The tensor broadcasts against `[*batch]` as torch broadcasts (aligned on the right) without enlarging
    it: at most `len(batch)` dims, each 1 or the batch dim's size (e.g. `[B, 1, 1]` per env against
    `[T, B, n, 1]` inputs, `[B]` against `[T, B]`, a 0-d tensor for every column). It holds no time dim: a
    column keeps its value over the rollout. Its values are not checked: reading them would make the host
    wait for the device at every call; whoever builds it checks the numbers once, as `SeededPPO` does.
    """
    if not isinstance(x, torch.Tensor):
        accepted = "a Python float in [0, 1] or a float32 tensor of one value per column"
        return check_unit_interval(op, name, x, accepted)
    batch = tuple(shape[1:])
    if x.layout != torch.strided:
        raise TypeError(f"{op}: {name} is a {x.layout} tensor; expected a dense (torch.strided) tensor")
    if x.dtype != torch.float32:
        raise TypeError(f"{op}: {name} has dtype {x.dtype}; expected float32 (one value per column)")
    if x.device != device:
        raise ValueError(f"{op}: {name} is on {x.device}, expected {device} like the inputs")
    aligned = batch[len(batch) - x.dim() :] if x.dim() <= len(batch) else None
    if aligned is None or any(size not in (1, full) for size, full in zip(x.shape, aligned, strict=True)):
        raise ValueError(
            f"{op}: {name} has shape {tuple(x.shape)}; expected one that broadcasts against the batch dims"
            f" {batch} of the inputs {tuple(shape)} (aligned on the right, each dim 1 or the batch's, no"
            f" time dim: e.g. [B, 1, 1] per env against [T, B, n, 1])"
        )
    return x


def check_inputs(
    op: str,
    owner: str,
    values: dict[str, torch.Tensor | None],
    flags: dict[str, torch.Tensor | None],
    optional: tuple[str, ...] = (),
) -> tuple[torch.Size, torch.device]:
    """Check the time-major inputs of `op` and return the output shape (the owner's) and the device.

    `values` (rewards, values) must be floating point; `flags` bool or floating point (0.0 or 1.0). Every
    input has the owner's number of dims and its `T`; each batch dim equals the owner's or is 1 (read
    through a zero stride, e.g. an env-level flag `[T, B, 1, 1]` against per-agent values `[T, B, n, 1]`).
    Only the inputs named in `optional` may be None (not given); any other input must be a tensor.
    """
    given = {name: x for name, x in {**values, **flags}.items() if x is not None or name not in optional}
    for name, x in given.items():
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{op}: {name} must be a torch.Tensor, got {type(x).__name__}")
        if x.layout != torch.strided:
            raise TypeError(f"{op}: {name} is a {x.layout} tensor; expected a dense (torch.strided) tensor")
    reference = values[owner]
    shape, device = reference.shape, reference.device
    shown = tuple(shape)
    if reference.dim() == 0:
        raise ValueError(f"{op}: {owner} is a 0-d tensor; expected a time-major tensor [T, *batch]")
    if shape[0] == 0:
        raise ValueError(f"{op}: {owner} has T = 0 time steps (shape {shown}); expected at least one step")
    for name, x in given.items():
        if x.device != device:
            raise ValueError(f"{op}: {name} is on {x.device}, expected {device} like {owner}")
        if name in values and not x.is_floating_point():
            raise TypeError(f"{op}: {name} has dtype {x.dtype}; expected floating point (float32, bfloat16)")
        if name in flags and not (x.dtype == torch.bool or x.is_floating_point()):
            raise TypeError(f"{op}: {name} has dtype {x.dtype}; expected bool (or float 0.0/1.0)")
        fits = x.dim() == len(shape) and x.shape[0] == shape[0]
        fits = fits and all(size in (1, full) for size, full in zip(x.shape[1:], shape[1:], strict=True))
        if not fits:
            raise ValueError(
                f"{op}: {name} has shape {tuple(x.shape)}; expected {owner}'s shape {shown}, or that shape"
                f" with 1 in some batch dims (e.g. an env-level flag [T, B, 1, 1] against [T, B, n, 1])"
            )
    return shape, device


def resolve_backend(backend: str, device: torch.device, kernel: Callable | None) -> str:
    """Which implementation runs: `"triton"`, `"torch"` or `"reference"`.

    `"auto"` picks Triton for CUDA tensors, and for CPU tensors when the kernels were built by Triton's
    interpreter (`TRITON_INTERPRET=1` set before triton was first imported); otherwise the fast torch path.
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend={backend!r} is not one of {', '.join(map(repr, BACKENDS))}")
    interpreted = InterpretedFunction is not None and isinstance(kernel, InterpretedFunction)
    can_run_triton = kernel is not None and (device.type == "cuda" or interpreted)
    if backend == "auto":
        return "triton" if can_run_triton else "torch"
    if backend == "triton" and not can_run_triton:
        why = (
            "Triton is not installed"
            if kernel is None
            else f"Triton needs a CUDA device, or TRITON_INTERPRET=1 set before triton is first imported"
            f" to run its interpreter on the CPU; got {device} tensors"
        )
        raise RuntimeError(f"backend='triton' cannot run here: {why}. Use backend='auto' or 'torch'.")
    return backend


def column_layout(
    shape: Sequence[int], tensors: Sequence[torch.Tensor]
) -> tuple[int, int, list[torch.Tensor], list[int]]:
    """Describe the batch dims of every input as one grid of `N1 x N2` columns, without copying.

    Each input is viewed as expanded to `shape` (broadcast dims get stride 0); batch dims of size 1 are
    dropped and neighbours merged wherever every input allows. Column `j` is then at `(j // N2, j % N2)`,
    so input `x` holds step `t` of column `j` at `t * st + (j // N2) * s1 + (j % N2) * s2`. Two grid dims
    cover contiguous, permuted and sliced inputs and flags broadcast over agents; anything that needs
    more is copied to contiguous memory first. Returns `(N1, N2, tensors, strides)` with strides flattened
    as `(st, s1, s2)` per tensor.
    """
    expanded = [x.expand(shape) for x in tensors]
    dims = [(size, [x.stride(d) for x in expanded]) for d, size in enumerate(shape) if d > 0 and size != 1]
    merged: list[tuple[int, list[int]]] = []
    for size, strides in dims:
        if merged and all(outer == inner * size for outer, inner in zip(merged[-1][1], strides, strict=True)):
            merged[-1] = (merged[-1][0] * size, strides)
        else:
            merged.append((size, strides))
    if len(merged) > 2:  # rare: e.g. a flag broadcast over a middle dim of three
        contiguous = [x.contiguous() for x in expanded]
        return column_layout(shape, contiguous)
    while len(merged) < 2:
        merged.insert(0, (1, [0] * len(tensors)))
    (n1, outer), (n2, inner) = merged
    strides = [s for i, x in enumerate(expanded) for s in (x.stride(0), outer[i], inner[i])]
    return n1, n2, list(tensors), strides


def launch_columns(
    kernel: Callable,
    tuned: Callable | None,
    inputs: Sequence[torch.Tensor],
    outputs: Sequence[torch.Tensor],
    scalars: Sequence[float],
    per_column: Sequence[float | torch.Tensor] = (),
    **constexprs: bool,
) -> None:
    """Run a column kernel: one program per block of columns, walking time backwards a tile at a time.

    Kernels take `(*inputs, *outputs, T, N, N2, *input strides (st, s1, s2), *scalars, *per-column
    (x, s1, s2), **constexprs, FLAT, BLOCK, TILE)`; the outputs are fresh contiguous `[T, *batch]`
    tensors, i.e. `[T, N]` row-major. A `per_column` value is a float, passed with strides `(0, 0)`, or a
    tensor broadcastable to `[*batch]` (`check_per_column`), laid out with the inputs and passed as its
    pointer and column strides: the kernel reads it once per column, where a constexpr says it is one.
    """
    shape = outputs[0].shape
    # Per-column tensors are laid out as inputs expanded over time (time stride 0, which kernels ignore).
    tensors = [x for x in per_column if isinstance(x, torch.Tensor)]
    n1, n2, laid_out, strides = column_layout(shape, [*inputs, *tensors])
    k = len(inputs)
    tensor_args = iter([(x, *strides[3 * i + 1 : 3 * i + 3]) for i, x in enumerate(laid_out) if i >= k])
    per_column_args = [
        arg for x in per_column for arg in (next(tensor_args) if isinstance(x, torch.Tensor) else (x, 0, 0))
    ]  # (x, s1, s2) each
    inputs, strides = laid_out[:k], strides[: 3 * k]
    num_steps, num_columns = shape[0], n1 * n2
    args = (*inputs, *outputs, num_steps, num_columns, n2, *strides, *scalars, *per_column_args)
    constexprs["FLAT"] = n1 == 1
    device = outputs[0].device
    if num_columns == 0:
        return
    if tuned is not None and device.type == "cuda":
        grid = lambda meta: (triton.cdiv(num_columns, meta["BLOCK"]),)
        with torch.cuda.device(device):
            tuned[grid](*args, **constexprs)
        return
    block = min(max(triton.next_power_of_2(num_columns), 16), CPU_MAX_BLOCK)
    kernel[(triton.cdiv(num_columns, block),)](*args, **constexprs, BLOCK=block, TILE=CPU_TILE)


# torch runs an elementwise op on several threads from this many elements on (at::internal::GRAIN_SIZE).
# The recurrence's many small ops stay under it: each is too short to gain from a second thread. (The
# few vectorised passes over the whole rollout do go parallel: on a quiet 2-core machine that is 1.7-4x
# faster than splitting them under the grain; where other jobs hold the cores, OMP_NUM_THREADS=1.)
PARALLEL_GRAIN = 32768


def flag_as_number(flag: torch.Tensor) -> torch.Tensor:
    """A bool flag viewed as uint8 (0/1) without a copy: bool -> float casts are not vectorised on CPU."""
    return flag.view(torch.uint8) if flag.dtype == torch.bool else flag


def decay(flag: torch.Tensor, scale: float | torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """`out = scale * (1 - flag)`, in one vectorised op; `out` is float32, of `decay_shape` or broadcast.

    A float scale is a CPU scalar tensor, which CUDA ops also accept without a copy; a tensor scale (one
    value per column, float32 on the flag's device) broadcasts against the flag.
    """
    number = flag_as_number(flag)
    if number.dtype in (torch.float16, torch.bfloat16):  # computed in their dtype, the scale would be rounded
        number = number.float()
    if isinstance(scale, torch.Tensor):
        # One contiguous row [*batch] of scales, broadcast over time only: broadcast over the inner batch
        # dims as well (e.g. [B, 1, 1] against [T, B, n, 1]), the op is not vectorised and runs far slower.
        row = scale.expand(out.shape[1:]).contiguous()
        return torch.addcmul(row, number, row, value=-1, out=out)  # scale - flag * scale
    return torch.sub(torch.tensor(scale), number.expand(out.shape), alpha=scale, out=out)


def decay_shape(flag: torch.Tensor, scale: float | torch.Tensor) -> torch.Size:
    """The shape of `decay(flag, scale)`: the flag's, widened by a tensor scale's batch dims."""
    return torch.broadcast_shapes(flag.shape, scale.shape) if isinstance(scale, torch.Tensor) else flag.shape


def scratch(buffer: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """A contiguous view of `shape` on the memory of a contiguous float32 `buffer` at least as large.

    The torch paths keep temporaries in an output buffer that is written last: a fresh large allocation
    costs page faults on many calls.
    """
    return buffer.view(-1)[: shape.numel()].view(shape)


def reverse_recurrence_(out: torch.Tensor, coefficient: torch.Tensor) -> torch.Tensor:
    """In place over time: `out[t] += coefficient[t] * out[t + 1]` for `t = T - 2, ..., 0`.

    `out` is `[T, *batch]` and contiguous; `coefficient` is `[T, *batch]` or broadcastable to it, and
    contiguous; it is scratch, and may be overwritten. Every op is a fused `addcmul_` or `mul_` over
    rows, under `PARALLEL_GRAIN` elements.

    With long rows, one op per step (per block of columns if a row is over the grain). With short rows
    that loop is bound by per-op overhead (a few microseconds), so time is cut into `M` blocks of
    `k ~ sqrt(T)` rows: the recurrence runs inside all blocks at once as if the row after each block
    were zero (`k` ops over `M` rows), the first row of each block takes its carry block by block (`M`
    ops over one row), then the other rows get theirs (`k` ops over `M` rows), using
    `y[t] = inside[t] + (coefficient[t] * ... * coefficient[last row of the block]) * y[row after the block]`.
    That reads the data about three times instead of once, so it pays only below ~4096 columns (the
    README's GAE table has the figures).
    """
    num_steps, row = out.shape[0], out[0].numel()
    num_blocks = min(round(num_steps**0.5), (PARALLEL_GRAIN - 1) // max(1, row))
    if num_steps >= 48 and row < 4096 and num_blocks >= 2:
        return _blocked_recurrence_(out, coefficient, num_blocks)
    if row < PARALLEL_GRAIN or out.dim() < 2:
        pieces = [(out, coefficient)]
    else:  # blocks of the first batch dim, each under the grain
        width = max(1, (PARALLEL_GRAIN - 1) // (row // out.shape[1]))
        outs = out.split(width, dim=1)
        broadcast = coefficient.shape[1] == 1
        coefficients = [coefficient] * len(outs) if broadcast else coefficient.split(width, dim=1)
        pieces = zip(outs, coefficients, strict=True)
    for out_piece, coefficient_piece in pieces:
        for t in range(num_steps - 2, -1, -1):
            out_piece[t].addcmul_(coefficient_piece[t], out_piece[t + 1])
    return out


def _blocked_recurrence_(out: torch.Tensor, coefficient: torch.Tensor, num_blocks: int) -> torch.Tensor:
    num_steps = out.shape[0]
    block = num_steps // num_blocks
    end = num_blocks * block  # rows [end, T) are a tail shorter than a block, done one by one first
    for t in range(num_steps - 2, end - 1, -1):
        out[t].addcmul_(coefficient[t], out[t + 1])
    y = out[:end].view(num_blocks, block, *out.shape[1:]).unbind(1)  # k views [M, *batch]
    # a[j] becomes reach[j] = a[j] * ... * a[k - 1], how far the row after a block reaches into row j
    a = coefficient[:end].view(num_blocks, block, *coefficient.shape[1:]).unbind(1)
    for j in range(block - 2, -1, -1):
        y[j].addcmul_(a[j], y[j + 1])
        a[j].mul_(a[j + 1])
    if end < num_steps:
        for j in range(block):
            y[j][-1].addcmul_(a[j][-1], out[end])
    first, first_reach = y[0].unbind(0), a[0].unbind(0)
    for m in range(num_blocks - 2, -1, -1):
        first[m].addcmul_(first_reach[m], first[m + 1])
    for j in range(1, block):
        y[j][:-1].addcmul_(a[j][:-1], y[0][1:])
    return out


def _column_offsets(columns, N2, s1, s2, FLAT: tl.constexpr):
    """Offsets (int64) of `columns` in an input whose batch dims form an `[N1, N2]` grid (`column_layout`).

    With `FLAT` (`N1 == 1`) the offsets are `columns * s2`: with `s2 == 1` (Triton specialises it) the
    compiler sees contiguous columns and issues vector loads.
    """
    if FLAT:
        return columns * s2
    return (columns // N2) * s1 + (columns % N2) * s2


column_offsets = triton_jit(_column_offsets)


def _then_earlier(a_later, c_later, a, c):
    """Two consecutive steps of `y = c + a * y_next` as one: the later pair `(a_later, c_later)` maps
    `y_next` to `y_later`, then the earlier one maps `y_later` to `y`. Elementwise, any shape."""
    return a * a_later, c + a * c_later


then_earlier = triton_jit(_then_earlier)


def _backwards_recurrence(a, c, y_after):
    """`y[i] = c[i] + a[i] * y[i - 1]` down the rows of a tile, `y[-1] = y_after`; returns `y`.

    `a` and `c` are `[TILE, BLOCK]` with row `i` holding step `last - i` (latest step first), so this is
    `y[t] = c[t] + a[t] * y[t + 1]` backwards over the tile's steps, and `y_after` (`[BLOCK]`) is `y` of
    the step after the tile. The scan runs over all rows at once: row `i` of `(reach, inside)` composes
    rows `0..i`, i.e. `inside[i]` is `y` from `y_after = 0` and `reach[i] = a[0] * ... * a[i]` carries
    `y_after` in.
    """
    reach, inside = tl.associative_scan((a, c), axis=0, combine_fn=then_earlier)
    return inside + reach * y_after[None, :]


backwards_recurrence = triton_jit(_backwards_recurrence)


def _last_row(y, TILE: tl.constexpr):
    """Row `TILE - 1` of a `[TILE, BLOCK]` tile, `[BLOCK]`: `y` of the tile's earliest step."""
    rows = tl.arange(0, TILE)[:, None]
    return tl.sum(tl.where(rows == TILE - 1, y, 0.0), axis=0)


last_row = triton_jit(_last_row)

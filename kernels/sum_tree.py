"""A sum tree for prioritized replay: set leaf priorities and draw leaves in proportion to them.

Layout: a wide tree in one float64 tensor, every inner node with `FANOUT` (F = 32) children but the root,
which has up to `ROOT_FANOUT` (1024):
- the `L` leaves (the capacity rounded up to a multiple of F), then
- for each level of inner nodes, bottom up, one row `[width + 1]` per node: `0` and the running sums of
  its children, added in order: `row[j]` is the sum of children `0 .. j - 1`, and `row[width]`, the sum of
  all of them, is the node's value. Node `i` of a level is the parent of nodes `i F .. i F + F - 1` of the
  level below; each level has one node per F nodes below, rounded up to a multiple of F (the padding
  nodes stay 0), until a level has at most 1024 nodes: the root's children, whose row ends the tensor
  (`tree[-1]` is the total). A million leaves take 2 levels of rows of 33 under the root's row of 993.
Sums are added in order everywhere, so every implementation builds the very same tree bit for bit, and a
node is recomputed from its children, never by adding a difference to an old sum: an inner node is zero
exactly when all its leaves are.

Semantics:
- `sum_tree_update_(tree, index, value)`: leaf `index[i]` becomes `value[i]`; where an index repeats in one
  call the leaf takes the largest of its values (max, not last-write-wins: the result then does not depend
  on the order of the writes, which parallel hardware does not keep). Only the rows of the updated
  leaves' ancestors are rewritten, O(k F log_F L); leaves not in `index` keep their values.
- `sum_tree_write_(tree, start, value)`: leaves `start .. start + m - 1` become `value` (a contiguous run,
  as a replay buffer's `extend` writes); only the rows above that run are rewritten, by slices.
- `sum_tree_find(tree, fraction)`: for each `fraction[i]` in `[0, 1]`, the leaf where the running sum of
  the leaves passes `fraction[i] * total`: the walk starts at the root with `mass = fraction * total`; at
  each node it first keeps the mass below the node's value (at most the float just below it), then takes
  the last child `j < width` with `row[j] <= mass` and goes on with `mass - row[j]`. So leaf `j` is found with
  probability `leaves[j] / total` for a uniform fraction (up to float64 rounding), and a zero leaf never:
  a zero child shares its running sum with the next child, and zero children at the end of a row start
  at the node's value, above the mass. (Float32 trees that subtract their way down are known to land on
  zero leaves, when rounding leaves the mass past a node's value.)

Implementations, held to each other bit for bit by the tests:
- Triton: `_zero_leaves_kernel` then `_max_leaves_kernel` write the leaves (an atomic max on the float64
  bits, which order like the values for non-negative floats), then `_rebuild_rows_kernel` once per level,
  bottom up, rewrites the updated rows (one row per lane); `_find_kernel` walks down with
  `[BLOCK, FANOUT]` loads. An update is `2 + depth` launches, a find one.
- torch (CPU): an update is, per level, a gather of the updated rows' children `[k, F]`, a `cumsum` (it
  adds in order on the CPU) and an `index_copy_` (levels with no more rows than updates, the root's
  always, are rebuilt whole, by slices); a find is a 1-d `searchsorted` in the root's row, then per level
  a gather of the rows `[k, F + 1]`, a `searchsorted` and a few ops on `[k]`: all draws at once. Traced
  into a compiled graph (an off-policy step's), an update writes the flat tree by `index_copy_`, the
  leaves' repeats reduced first (`_update_flat`), so that the graph writes in place.
- `sum_tree_update_reference`, `sum_tree_write_reference`, `sum_tree_find_reference`: plain loops.
"""

from __future__ import annotations

import contextlib
import functools
import math
import weakref
from typing import NamedTuple

import torch

from ._common import Backend, resolve_backend, tl, triton, triton_jit

FANOUT = 32  # children per inner node but the root: a power of two (a node's parent is `index >> SHIFT`)
SHIFT = FANOUT.bit_length() - 1
ROOT_FANOUT = 1024  # at most this many children of the root, in one row: a find searches it without a gather
BLOCK = 128  # leaves or draws per program
ROW_BLOCK = 64  # rows per program of `_rebuild_rows_kernel`


class Layout(NamedTuple):
    """Where each level lies in a tree tensor (see the module docstring)."""

    sizes: tuple[int, ...]  # nodes per level: the leaves first, the root (1) last
    rows: tuple[int, ...]  # offset of the rows of each level but the leaves' (rows[l]: level l + 1's nodes)
    widths: tuple[int, ...]  # children per node of each of those levels: FANOUT, ..., the root's

    @property
    def depth(self) -> int:
        """Levels of rows: a find reads `depth` rows, an update rewrites up to `depth` rows per leaf."""
        return len(self.rows)

    @property
    def numel(self) -> int:
        return self.rows[-1] + self.widths[-1] + 1


def _layout_for_leaves(num_leaves: int) -> Layout:
    sizes = [num_leaves]
    while sizes[-1] > ROOT_FANOUT:
        parents = sizes[-1] // FANOUT
        sizes.append(-(-parents // FANOUT) * FANOUT)  # padded to whole rows of the level above
    widths = [FANOUT] * (len(sizes) - 1) + [sizes[-1]]
    sizes.append(1)
    rows = [num_leaves]
    for size, width in zip(sizes[1:-1], widths[:-1], strict=True):  # the root's row is last
        rows.append(rows[-1] + size * (width + 1))
    return Layout(tuple(sizes), tuple(rows), tuple(widths))


def sum_tree_layout(capacity: int) -> Layout:
    """The layout of the tree `sum_tree_zeros(capacity)` allocates."""
    if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
        raise ValueError(f"sum_tree_zeros: capacity must be a positive int, got {capacity!r}")
    return _layout_for_leaves(-(-capacity // FANOUT) * FANOUT)


def _uncached_when_compiling(cached):
    """`cached` (a `functools.cache`d function), called without its cache when traced into a compiled graph
    (dynamo would trace through the cache anyway, with a warning)."""

    @functools.wraps(cached.__wrapped__)
    def call(*args):
        return (cached.__wrapped__ if torch.compiler.is_compiling() else cached)(*args)

    return call


@_uncached_when_compiling
@functools.cache
def _layout_of_size(numel: int) -> Layout | None:
    """The layout of a tree tensor of `numel` entries, or None where no tree has that size. The size grows
    with the leaves (`L + (L / (F - 1) + padding) (F + 1)` at most), so a few steps up from that bound."""
    bound = (numel - 8 * FANOUT * (FANOUT + 1) - 2 * ROOT_FANOUT) * (FANOUT - 1) // (2 * FANOUT)
    num_leaves = max(FANOUT, bound // FANOUT * FANOUT)
    while (layout := _layout_for_leaves(num_leaves)).numel < numel:
        num_leaves += FANOUT
    return layout if layout.numel == numel else None


def sum_tree_zeros(capacity: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """An empty tree (all priorities zero) with room for `capacity` leaves: float64, `sum_tree_nbytes` bytes."""
    return torch.zeros(sum_tree_layout(capacity).numel, dtype=torch.float64, device=device)


def sum_tree_nbytes(capacity: int) -> int:
    """Bytes of the tree `sum_tree_zeros(capacity)` allocates."""
    return sum_tree_layout(capacity).numel * 8


def sum_tree_leaves(tree: torch.Tensor) -> torch.Tensor:
    """The leaves of `tree`, a view `[L]` (L >= the capacity it was made for; the rest stay 0)."""
    _check_tree("sum_tree_leaves", tree)
    return tree[: _layout_of_size(tree.numel()).sizes[0]]


# ---- Triton ---------------------------------------------------------------------------------------


@triton_jit
def _zero_leaves_kernel(tree_bits_ptr, index_ptr, k, num_leaves, BLOCK: tl.constexpr):
    """`leaf[index] = 0` (the tree viewed as int64: 0 is +0.0). Out-of-range indices are skipped."""
    offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    in_range = offsets < k
    index = tl.load(index_ptr + offsets, mask=in_range, other=0).to(tl.int64)
    valid = in_range & (index >= 0) & (index < num_leaves)
    tl.store(tree_bits_ptr + index, tl.zeros([BLOCK], dtype=tl.int64), mask=valid)


@triton_jit
def _max_leaves_kernel(tree_bits_ptr, index_ptr, value_ptr, k, num_leaves, BLOCK: tl.constexpr):
    """`leaf[index] = max(leaf[index], value)` on zeroed leaves: the largest value given for each index.
    Non-negative float64 values order like their bits as int64, so the max is an integer atomic."""
    offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    in_range = offsets < k
    index = tl.load(index_ptr + offsets, mask=in_range, other=0).to(tl.int64)
    value = tl.load(value_ptr + offsets, mask=in_range, other=0.0).to(tl.float64)
    valid = in_range & (index >= 0) & (index < num_leaves)
    tl.atomic_max(tree_bits_ptr + index, value.to(tl.int64, bitcast=True), mask=valid)


@triton_jit
def _rebuild_rows_kernel(
    tree_ptr,
    rows_ptr,
    num_rows,
    first_row,
    last_row,
    children_start,
    child_stride,
    rows_start,
    width,
    RUN: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """Each lane rewrites one row from its children: their running sums, added in order. The rows are
    `rows_ptr[:num_rows]` (they may repeat: repeats write the same values, so their order does not
    matter), or with `RUN` the rows `first_row ..= last_row`; rows past `last_row` (of indices out of
    range, whose leaves were skipped) are skipped. A row has `width` children (`FANOUT`, or the root's);
    child `c` lies at `children_start + c * child_stride`."""
    offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    if RUN:
        row = first_row + offsets
        active = row <= last_row
    else:
        active = offsets < num_rows
        row = tl.load(rows_ptr + offsets, mask=active, other=0).to(tl.int64)
    active = active & (row >= 0) & (row <= last_row)
    running = tl.zeros([BLOCK], dtype=tl.float64)
    for j in range(width):
        running += tl.load(tree_ptr + children_start + (row * width + j) * child_stride, mask=active, other=0.0)
        tl.store(tree_ptr + rows_start + row * (width + 1) + j + 1, running, mask=active)


@triton_jit
def _find_kernel(
    tree_ptr,
    fraction_ptr,
    index_ptr,
    leaf_ptr,
    rows_starts_ptr,
    k,
    depth,
    root_width,
    FANOUT: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """Each lane walks one draw down from the root (see `sum_tree_find`): a row's running sums are
    sorted, so the last child `j` with `row[j] <= mass` is their count <= mass, minus 1 (counted
    `FANOUT` at a time: the root's row is `root_width` long)."""
    offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    in_range = offsets < k
    root = tl.load(rows_starts_ptr + depth - 1)
    mass = tl.load(fraction_ptr + offsets, mask=in_range, other=0.0).to(tl.float64) * tl.load(
        tree_ptr + root + root_width
    )
    node = tl.zeros([BLOCK], dtype=tl.int64)
    for step in range(depth):
        width = FANOUT + (step == 0) * (root_width - FANOUT)
        row = tree_ptr + tl.load(rows_starts_ptr + depth - 1 - step) + node * (width + 1)
        value = tl.load(row + width, mask=in_range, other=0.0)
        # The float just below a positive value: its bits minus 1.
        below = tl.where(value > 0.0, (value.to(tl.int64, bitcast=True) - 1).to(tl.float64, bitcast=True), 0.0)
        mass = tl.minimum(mass, below)
        count = tl.zeros([BLOCK], dtype=tl.int64)
        for first in range(0, width, FANOUT):
            before = tl.load(row[:, None] + first + tl.arange(0, FANOUT)[None, :], mask=in_range[:, None], other=0.0)
            count += tl.sum((before <= mass[:, None]).to(tl.int64), axis=1)
        choice = count - 1
        mass = mass - tl.load(row + choice, mask=in_range, other=0.0)
        node = node * width + choice
    tl.store(index_ptr + offsets, node, mask=in_range)
    tl.store(leaf_ptr + offsets, tl.load(tree_ptr + node, mask=in_range, other=0.0), mask=in_range)


@_uncached_when_compiling
@functools.cache
def _rows_starts(numel: int, device: torch.device) -> torch.Tensor:
    """`Layout.rows` as a device tensor for `_find_kernel`, made once per tree size and device."""
    return torch.tensor(_layout_of_size(numel).rows, dtype=torch.int64, device=device)


def _on_device(tree: torch.Tensor):
    # Traced into a compiled graph, the kernels launch on the graph's device: no context to trace.
    if tree.is_cuda and not torch.compiler.is_compiling():
        return torch.cuda.device(tree.device)
    return contextlib.nullcontext()


def _rebuild_rows_triton(tree, layout, level, rows=None, run=(0, 0)):
    """Rewrite the rows `rows` (a `[r]` tensor) or `run = (first, last)` of level `level + 1`."""
    count = rows.numel() if rows is not None else run[1] - run[0] + 1
    below_width = layout.widths[level - 1]
    children_start, child_stride = (0, 1) if level == 0 else (layout.rows[level - 1] + below_width, below_width + 1)
    _rebuild_rows_kernel[(triton.cdiv(count, ROW_BLOCK),)](
        tree,
        rows if rows is not None else tree,
        count,
        run[0],
        layout.sizes[level] // layout.widths[level] - 1 if rows is not None else run[1],
        children_start,
        child_stride,
        layout.rows[level],
        layout.widths[level],
        RUN=rows is None,
        BLOCK=ROW_BLOCK,
    )


def _update_triton(tree, index, value):
    k, layout = index.numel(), _layout_of_size(tree.numel())
    if k == 0:
        return tree
    bits, grid = tree.view(torch.int64), (triton.cdiv(k, BLOCK),)
    with _on_device(tree):
        _zero_leaves_kernel[grid](bits, index, k, layout.sizes[0], BLOCK=BLOCK)
        _max_leaves_kernel[grid](bits, index, value, k, layout.sizes[0], BLOCK=BLOCK)
        rows = index.long()
        for level in range(layout.depth - 1):
            rows = rows >> SHIFT  # [k] the updated nodes' parents: the rows to rewrite
            _rebuild_rows_triton(tree, layout, level, rows=rows)
        _rebuild_rows_triton(tree, layout, layout.depth - 1, run=(0, 0))  # the root's row
    return tree


def _write_triton(tree, start, value):
    layout = _layout_of_size(tree.numel())
    tree[start : start + value.numel()].copy_(value)
    with _on_device(tree):
        for level, run in enumerate(_runs_above(start, value.numel(), layout.depth)):
            _rebuild_rows_triton(tree, layout, level, run=run)
    return tree


def _find_triton(tree, fraction):
    k, layout = fraction.numel(), _layout_of_size(tree.numel())
    index = torch.empty(k, dtype=torch.int64, device=tree.device)
    leaf = torch.empty(k, dtype=torch.float64, device=tree.device)
    if k:
        with _on_device(tree):
            starts = _rows_starts(tree.numel(), tree.device)
            _find_kernel[(triton.cdiv(k, BLOCK),)](
                tree, fraction, index, leaf, starts, k, layout.depth, layout.widths[-1], FANOUT=FANOUT, BLOCK=BLOCK
            )
    return index, leaf


def _runs_above(start: int, count: int, depth: int) -> list[tuple[int, int]]:
    """`(first, last)` row of each level above the leaves `start .. start + count - 1`."""
    first, last, runs = start, start + count - 1, []
    for _ in range(depth - 1):
        first, last = first >> SHIFT, last >> SHIFT
        runs.append((first, last))
    return [*runs, (0, 0)]  # the root's row


# ---- torch (CPU) ----------------------------------------------------------------------------------


class _Views(NamedTuple):
    """Views of one tree's levels, made once per tree: each view costs as much as a small op."""

    leaves: torch.Tensor  # [L]
    children: list[torch.Tensor]  # per level of rows: the level below's values as rows [rows, width]
    rows: list[torch.Tensor]  # per level of rows: its rows [nodes, width + 1]
    sums: list[torch.Tensor]  # the same without column 0 (always 0): [nodes, width]
    zero: torch.Tensor  # [] 0.0, for `nextafter`


_VIEWS: dict[int, tuple[weakref.ref, _Views]] = {}


def _views(tree: torch.Tensor) -> _Views:
    if torch.compiler.is_compiling():  # views are free in a graph, and the cache (ids, weakrefs) does not trace
        return _make_views(tree)
    entry = _VIEWS.get(id(tree))
    if entry is not None and entry[0]() is tree:
        return entry[1]
    views = _make_views(tree)
    # The entry goes when the tree does (its views would keep its memory alive).
    key = id(tree)
    _VIEWS[key] = (weakref.ref(tree, lambda _: _VIEWS.pop(key, None)), views)
    return views


def _make_views(tree: torch.Tensor) -> _Views:
    layout = _layout_of_size(tree.numel())
    rows = [
        tree[start : start + size * (width + 1)].view(size, width + 1)
        for start, size, width in zip(layout.rows, layout.sizes[1:], layout.widths, strict=True)
    ]
    leaves = tree[: layout.sizes[0]]
    values = [leaves] + [below[:, -1] for below in rows[:-1]]  # each level's, leaves to the root's children
    children = [level.view(-1, width) for level, width in zip(values, layout.widths, strict=True)]
    return _Views(leaves, children, rows, [level[:, 1:] for level in rows], tree.new_zeros(()))


def _running_sum(children: torch.Tensor) -> torch.Tensor:
    """`[r, width]` -> `[r, width]` running sums along each row, added in order (the CPU's `cumsum` does; a
    GPU's is a parallel scan that rounds differently, so there one column at a time)."""
    if children.device.type == "cpu":
        return children.cumsum(1)
    running = children.clone()
    for j in range(1, children.shape[1]):
        running[:, j] += running[:, j - 1]
    return running


def _rebuild_rows_torch(views: _Views, level: int, rows: torch.Tensor | slice) -> None:
    """Rewrite rows `rows` (a `[r]` index tensor, repeats allowed, or a slice) of level `level + 1`."""
    children = views.children[level]
    if isinstance(rows, slice):
        views.sums[level][rows].copy_(_running_sum(children[rows]))
    else:  # repeated rows get the same sums, so the order of their writes does not matter
        views.sums[level].index_copy_(0, rows, _running_sum(children.index_select(0, rows)))


def _largest_per_index(index: torch.Tensor, value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`index` sorted `[k]` and for each the largest of the values given with that index `[k]`: each run of
    equal sorted indices is one segment, reduced by a scatter into `[k]`: then every write to a leaf writes
    the same value, and the writes are in place when compiled."""
    index, order = index.sort()
    starts = torch.ones_like(index, dtype=torch.bool)
    starts[1:] = index[1:] != index[:-1]
    segment = starts.cumsum(0) - 1  # [k] each sorted index's run
    largest = torch.zeros_like(value).scatter_reduce_(0, segment, value[order], "amax", include_self=False)
    return index, largest.index_select(0, segment)


def _update_torch(tree, index, value):
    if torch.compiler.is_compiling():
        return _update_flat(tree, index, value)
    views = _views(tree)
    views.leaves.scatter_reduce_(0, index, value.to(torch.float64), "amax", include_self=False)
    rows = index
    for level, children in enumerate(views.children):
        rows = rows >> SHIFT  # [k] the updated nodes' parents: the rows to rewrite (the root's: whole)
        # A level with no more rows than updates is cheaper rebuilt whole, by slices.
        whole = children.shape[0] <= rows.numel()
        _rebuild_rows_torch(views, level, slice(0, children.shape[0]) if whole else rows)
    return tree


def _update_flat(tree, index, value):
    """`_update_torch` traced into a compiled graph: every write goes into the flat tree itself, by
    `index_copy_`. Compiled, a write through a view of the tree, or a scatter of maxima into it, became
    copies of the whole tree (milliseconds a step at a million leaves); these stay in place."""
    views, layout = _views(tree), _layout_of_size(tree.numel())
    tree.index_copy_(0, *_largest_per_index(index, value.to(torch.float64)))  # the leaves: tree[:L]
    rows = index
    for children, start in zip(views.children, layout.rows, strict=True):
        rows = rows >> SHIFT  # [k] the updated nodes' parents: the rows to rewrite (the root's: whole)
        # A level with no more rows than updates is cheaper rebuilt whole. Repeated rows get the same
        # sums, so the order of their writes does not matter.
        count, width = children.shape
        written = torch.arange(count, device=tree.device) if count <= rows.numel() else rows  # [r]
        columns = torch.arange(start + 1, start + width + 1, device=tree.device)  # row 0's sums in the tree
        slots = columns + (written * (width + 1)).unsqueeze(1)  # [r, width] the written rows' sums
        tree.index_copy_(0, slots.flatten(), _running_sum(children.index_select(0, written)).flatten())
    return tree


def _write_torch(tree, start, value):
    views = _views(tree)
    views.leaves[start : start + value.numel()].copy_(value)
    for level, (first, last) in enumerate(_runs_above(start, value.numel(), len(views.rows))):
        _rebuild_rows_torch(views, level, slice(first, last + 1))
    return tree


def _find_torch(tree, fraction):
    views = _views(tree)
    top = views.rows[-1][0]  # [width + 1] the root's row, the same for every draw: a 1-d search
    mass = (fraction.to(torch.float64) * top[-1]).clamp_(max=top[-1].nextafter(views.zero))[:, None]  # [k, 1]
    choice = torch.searchsorted(top, mass, right=True).sub_(1).clamp_(max=top.numel() - 2)  # [k, 1]
    mass = mass - top.take(choice)  # (`take`: a third of indexing's time here)
    node = choice[:, 0]  # [k]
    for rows in reversed(views.rows[:-1]):
        row = rows.index_select(0, node)  # [k, F + 1] each draw's node's row
        mass = torch.minimum(mass, row[:, -1:].nextafter(views.zero))  # below the node's value
        # The last child j < F with row[j] <= mass (row[F] > mass but in an all-zero tree).
        choice = torch.searchsorted(row, mass, right=True).sub_(1).clamp_(max=FANOUT - 1)  # [k, 1]
        mass = mass - row.gather(1, choice)
        node = torch.add(choice[:, 0], node, alpha=FANOUT)  # node * F + choice
    return node, views.leaves.index_select(0, node)


# ---- reference ------------------------------------------------------------------------------------


def _rebuild_reference(tree: torch.Tensor) -> torch.Tensor:
    """Recompute every row from its children, bottom level first, as plain loops."""
    layout = _layout_of_size(tree.numel())
    values = tree.tolist()
    below = values[: layout.sizes[0]]  # the values of the level below
    for level, (start, width) in enumerate(zip(layout.rows, layout.widths, strict=True)):
        for node in range(layout.sizes[level] // width):
            running = 0.0
            for j, child in enumerate(below[node * width : (node + 1) * width], start=1):
                running += child
                values[start + node * (width + 1) + j] = running
        below = values[start + width : start + layout.sizes[level + 1] * (width + 1) : width + 1]  # rows' last
    tree.copy_(torch.tensor(values, dtype=torch.float64))
    return tree


def sum_tree_update_reference(tree: torch.Tensor, index: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """`sum_tree_update_` as plain loops: set each leaf (the largest value where an index repeats), then
    recompute every row."""
    largest: dict[int, float] = {}
    for i, v in zip(index.tolist(), value.double().tolist(), strict=True):
        largest[i] = max(largest.get(i, v), v)
    for i, v in largest.items():
        tree[i] = v
    return _rebuild_reference(tree)


def sum_tree_write_reference(tree: torch.Tensor, start: int, value: torch.Tensor) -> torch.Tensor:
    """`sum_tree_write_` as plain loops."""
    for i, v in enumerate(value.double().tolist()):
        tree[start + i] = v
    return _rebuild_reference(tree)


def sum_tree_find_reference(tree: torch.Tensor, fraction: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`sum_tree_find` as a plain loop per draw, walking down from the root."""
    layout = _layout_of_size(tree.numel())
    values = tree.tolist()
    found = []
    for f in fraction.double().tolist():
        mass, node = f * values[-1], 0
        for start, width in zip(reversed(layout.rows), reversed(layout.widths), strict=True):
            row = values[start + node * (width + 1) : start + (node + 1) * (width + 1)]
            mass = min(mass, math.nextafter(row[width], 0.0))  # below the node's value
            choice = max(j for j in range(width) if row[j] <= mass)
            mass -= row[choice]
            node = node * width + choice
        found.append(node)
    nodes = torch.tensor(found, dtype=torch.int64, device=tree.device)
    return nodes, tree[nodes]


# ---- public ---------------------------------------------------------------------------------------


def _check_tree(op: str, tree: torch.Tensor) -> None:
    if not isinstance(tree, torch.Tensor):
        raise TypeError(f"{op}: tree must be a torch.Tensor, got {type(tree).__name__}")
    if tree.dtype != torch.float64 or tree.dim() != 1 or not tree.is_contiguous() or not _layout_of_size(tree.numel()):
        raise ValueError(
            f"{op}: tree has shape {tuple(tree.shape)}, dtype {tree.dtype}; expected a contiguous float64 tensor "
            "laid out as a sum tree (make it with sum_tree_zeros(capacity, device))"
        )


def _check_vector(op: str, name: str, x: torch.Tensor, tree: torch.Tensor, kind: str, length: int | None = None):
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{op}: {name} must be a torch.Tensor, got {type(x).__name__}")
    ok = x.dtype in (torch.int32, torch.int64) if kind == "index" else x.is_floating_point()
    if not ok:
        expected = "int64 (or int32)" if kind == "index" else "floating point"
        raise TypeError(f"{op}: {name} has dtype {x.dtype}; expected {expected}")
    if x.dim() != 1 or (length is not None and x.numel() != length):
        expected = "[k]" if length is None else f"({length},) like index"
        raise ValueError(f"{op}: {name} has shape {tuple(x.shape)}; expected a 1-d tensor {expected}")
    if x.device != tree.device:
        raise ValueError(f"{op}: {name} is on {x.device}, expected {tree.device} like tree")


@torch.no_grad()
def sum_tree_update_(
    tree: torch.Tensor, index: torch.Tensor, value: torch.Tensor, *, backend: Backend = "auto"
) -> torch.Tensor:
    """Set leaves `index` of `tree` to `value`, in place, and recompute their ancestors; returns `tree`.

    Args:
        tree: float64 tree from `sum_tree_zeros`.
        index: `[k]` int64 (or int32) leaf indices in `[0, L)`; an index may repeat: its leaf takes the
            largest of its values. Not checked here, since that would read the device from the host
            (`ReplayBuffer(check_values=True)` checks them): the Triton kernels skip indices out of
            range; on the torch path one >= L raises and a negative one corrupts the tree.
        value: `[k]` floating point, non-negative and finite (not checked, for the same reason).
        backend: `"auto"` (Triton for CUDA tensors, and for CPU tensors under `TRITON_INTERPRET=1`; the
            torch path otherwise), `"triton"`, `"torch"` or `"reference"`.
    """
    _check_tree("sum_tree_update_", tree)
    _check_vector("sum_tree_update_", "index", index, tree, "index")
    _check_vector("sum_tree_update_", "value", value, tree, "value", index.numel())
    implementation = {"triton": _update_triton, "torch": _update_torch, "reference": sum_tree_update_reference}
    run = implementation[resolve_backend(backend, tree.device, _find_kernel)]
    index = index.contiguous() if run is not sum_tree_update_reference else index
    return run(tree, index if run is _update_triton else index.long(), value.contiguous())


@torch.no_grad()
def sum_tree_write_(tree: torch.Tensor, start: int, value: torch.Tensor, *, backend: Backend = "auto") -> torch.Tensor:
    """Set the leaves `start .. start + m - 1` of `tree` to `value` `[m]` (non-negative, finite), in place,
    and recompute the rows above them, by slices; returns `tree`. `backend` as in `sum_tree_update_`."""
    _check_tree("sum_tree_write_", tree)
    _check_vector("sum_tree_write_", "value", value, tree, "value")
    num_leaves = _layout_of_size(tree.numel()).sizes[0]
    if isinstance(start, bool) or not isinstance(start, int) or not 0 <= start <= num_leaves - value.numel():
        raise ValueError(
            f"sum_tree_write_: leaves {start!r} .. {start!r} + {value.numel()} do not fit in the tree's "
            f"{num_leaves} leaves; expected an int start with 0 <= start <= {num_leaves - value.numel()}"
        )
    if value.numel() == 0:
        return tree
    implementation = {"triton": _write_triton, "torch": _write_torch, "reference": sum_tree_write_reference}
    return implementation[resolve_backend(backend, tree.device, _find_kernel)](tree, start, value)


@torch.no_grad()
def sum_tree_find(
    tree: torch.Tensor, fraction: torch.Tensor, *, backend: Backend = "auto"
) -> tuple[torch.Tensor, torch.Tensor]:
    """The leaves where the running sum of the leaves passes `fraction * total` (see the module docstring).

    Args:
        tree: float64 tree from `sum_tree_zeros`, with a positive total.
        fraction: `[k]` floating point in `[0, 1]`, e.g. `(arange(k) + rand(k)) / k` for a stratified draw.
        backend: as in `sum_tree_update_`.

    Returns:
        `(index, leaf)`: `[k]` int64 leaf indices and `[k]` float64 their values; the probability of a
        uniform fraction finding leaf `j` is `leaf / total`. With an all-zero tree the indices are
        meaningless (the caller knows whether anything was stored).
    """
    _check_tree("sum_tree_find", tree)
    _check_vector("sum_tree_find", "fraction", fraction, tree, "value")
    implementation = {"triton": _find_triton, "torch": _find_torch, "reference": sum_tree_find_reference}
    run = implementation[resolve_backend(backend, tree.device, _find_kernel)]
    return run(tree, fraction.contiguous())

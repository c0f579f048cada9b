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

Several trees (a population's, one per member) are one tensor `[S, numel]`, row `s` exactly the tree
`[numel]` that the same calls on tree `s` alone build, bit for bit: every function takes a tree `[numel]`
with indices, values and fractions `[k]`, or trees `[S, numel]` with `[S, k]`, row `s` for tree `s`. Each
tree keeps its own leaves, repeats (the max per tree) and zero leaves; one launch or op serves all of them
(a tree is a leading member dim, S = 1 for one tree: the same code).

Implementations, held to each other bit for bit by the tests:
- Triton: `_zero_leaves_kernel` then `_max_leaves_kernel` write the leaves (an atomic max on the float64
  bits, which order like the values for non-negative floats), then `_rebuild_rows_kernel` once per level,
  bottom up, rewrites the updated rows (one row per lane); `_find_kernel` walks down with
  `[BLOCK, FANOUT]` loads. An update is `2 + depth` launches, a find one, for any number of trees: a lane
  of `[S, k]` belongs to tree `s = lane // k` (its row), whose entries start at `s * numel`.
- torch (CPU): an update is, per level, a gather of the updated rows' children `[k, F]`, a `cumsum` (it
  adds in order on the CPU) and an `index_copy_` (levels with no more rows than updates, the root's
  always, are rebuilt whole, by slices); a find is a 1-d `searchsorted` in the root's row, then per level
  a gather of the rows `[k, F + 1]`, a `searchsorted` and a few ops on `[k]`: all draws at once. Traced
  into a compiled graph (an off-policy step's), an update writes the flat tree by `index_copy_`, the
  leaves' repeats reduced first (`_update_flat`), so that the graph writes in place. Several trees are
  gathered and written through 2-d views of the flat trees whose rows start at every entry (overlapping,
  addressed `s * numel + row * step`: one more add per gather or write), searched from each tree's own
  root row (a batched `searchsorted`): the same ops, one for all the trees.
- `sum_tree_update_reference`, `sum_tree_write_reference`, `sum_tree_find_reference`: plain loops, tree
  after tree.
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


def sum_tree_zeros(capacity: int, device: torch.device | str = "cpu", members: int | None = None) -> torch.Tensor:
    """An empty tree (all priorities zero) with room for `capacity` leaves: float64 `[numel]`,
    `sum_tree_nbytes` bytes; with `members`, that many trees `[members, numel]` (one per row)."""
    numel = sum_tree_layout(capacity).numel
    if members is None:
        return torch.zeros(numel, dtype=torch.float64, device=device)
    if isinstance(members, bool) or not isinstance(members, int) or members < 1:
        raise ValueError(f"sum_tree_zeros: members must be a positive int or None, got {members!r}")
    return torch.zeros(members, numel, dtype=torch.float64, device=device)


def sum_tree_nbytes(capacity: int) -> int:
    """Bytes of the tree `sum_tree_zeros(capacity)` allocates (of each tree, with `members`)."""
    return sum_tree_layout(capacity).numel * 8


def sum_tree_leaves(tree: torch.Tensor) -> torch.Tensor:
    """The leaves of `tree`, a view `[L]` (L >= the capacity it was made for; the rest stay 0); of trees
    `[S, numel]`, `[S, L]`."""
    _check_tree("sum_tree_leaves", tree)
    return tree[..., : _layout_of_size(tree.shape[-1]).sizes[0]]


# ---- Triton ---------------------------------------------------------------------------------------
# A lane of `[S, k]` indices, draws or rows serves tree `lane // k` (its row): its entries start at
# `(lane // k) * numel`. One tree is S = 1.


@triton_jit
def _zero_leaves_kernel(tree_bits_ptr, index_ptr, k, lanes, num_leaves, numel, BLOCK: tl.constexpr):
    """`leaf[index] = 0` (the trees viewed as int64: 0 is +0.0). Out-of-range indices are skipped."""
    offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    in_range = offsets < lanes
    index = tl.load(index_ptr + offsets, mask=in_range, other=0).to(tl.int64)
    valid = in_range & (index >= 0) & (index < num_leaves)
    tl.store(tree_bits_ptr + (offsets // k) * numel + index, tl.zeros([BLOCK], dtype=tl.int64), mask=valid)


@triton_jit
def _max_leaves_kernel(tree_bits_ptr, index_ptr, value_ptr, k, lanes, num_leaves, numel, BLOCK: tl.constexpr):
    """`leaf[index] = max(leaf[index], value)` on zeroed leaves: the largest value given for each index of
    each tree. Non-negative float64 values order like their bits as int64, so the max is an integer atomic."""
    offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    in_range = offsets < lanes
    index = tl.load(index_ptr + offsets, mask=in_range, other=0).to(tl.int64)
    value = tl.load(value_ptr + offsets, mask=in_range, other=0.0).to(tl.float64)
    valid = in_range & (index >= 0) & (index < num_leaves)
    leaf = tree_bits_ptr + (offsets // k) * numel + index
    tl.atomic_max(leaf, value.to(tl.int64, bitcast=True), mask=valid)


@triton_jit
def _rebuild_rows_kernel(
    tree_ptr,
    rows_ptr,
    num_rows,
    lanes,
    numel,
    first_row,
    last_row,
    children_start,
    child_stride,
    rows_start,
    width,
    RUN: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """Each lane rewrites one row of one tree from its children: their running sums, added in order. The
    rows are `rows_ptr[:lanes]` (`[S, num_rows]`: tree s's at row s; they may repeat: repeats write the
    same values, so their order does not matter), or with `RUN` the rows `first_row ..= last_row`
    (`num_rows` of them) of every tree; rows past `last_row` (of indices out of range, whose leaves were
    skipped) are skipped. A row has `width` children (`FANOUT`, or the root's); child `c` lies at
    `children_start + c * child_stride` of its tree."""
    offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    active = offsets < lanes
    if RUN:
        row = first_row + offsets % num_rows
    else:
        row = tl.load(rows_ptr + offsets, mask=active, other=0).to(tl.int64)
    active = active & (row >= 0) & (row <= last_row)
    tree = tree_ptr + (offsets // num_rows) * numel
    running = tl.zeros([BLOCK], dtype=tl.float64)
    for j in range(width):
        running += tl.load(tree + children_start + (row * width + j) * child_stride, mask=active, other=0.0)
        tl.store(tree + rows_start + row * (width + 1) + j + 1, running, mask=active)


@triton_jit
def _find_kernel(
    tree_ptr,
    fraction_ptr,
    index_ptr,
    leaf_ptr,
    rows_starts_ptr,
    k,
    lanes,
    numel,
    depth,
    root_width,
    FANOUT: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """Each lane walks one draw down from the root of its tree (see `sum_tree_find`): a row's running
    sums are sorted, so the last child `j` with `row[j] <= mass` is their count <= mass, minus 1 (counted
    `FANOUT` at a time: the root's row is `root_width` long)."""
    offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    in_range = offsets < lanes
    tree = tree_ptr + (offsets // k) * numel
    root = tl.load(rows_starts_ptr + depth - 1)
    total = tl.load(tree + root + root_width, mask=in_range, other=0.0)
    mass = tl.load(fraction_ptr + offsets, mask=in_range, other=0.0).to(tl.float64) * total
    mass = tl.where(mass > 0.0, mass, 0.0)  # a fraction below 0 or NaN finds what 0 finds
    node = tl.zeros([BLOCK], dtype=tl.int64)
    for step in range(depth):
        width = FANOUT + (step == 0) * (root_width - FANOUT)
        row = tree + tl.load(rows_starts_ptr + depth - 1 - step) + node * (width + 1)
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
    tl.store(leaf_ptr + offsets, tl.load(tree + node, mask=in_range, other=0.0), mask=in_range)


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


def _rebuild_rows_triton(tree, layout, level, trees, rows=None, run=(0, 0)):
    """Rewrite the rows `rows` (a `[r]` tensor, or `[S, r]`: row s tree s's) or `run = (first, last)` (of
    each of the `trees` trees) of level `level + 1`."""
    count = rows.shape[-1] if rows is not None else run[1] - run[0] + 1  # per tree
    below_width = layout.widths[level - 1]
    children_start, child_stride = (0, 1) if level == 0 else (layout.rows[level - 1] + below_width, below_width + 1)
    _rebuild_rows_kernel[(triton.cdiv(trees * count, ROW_BLOCK),)](
        tree,
        rows if rows is not None else tree,
        count,
        trees * count,
        layout.numel,
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
    k, lanes, layout = index.shape[-1], index.numel(), _layout_of_size(tree.shape[-1])
    if lanes == 0:
        return tree
    bits, grid, trees = tree.view(torch.int64), (triton.cdiv(lanes, BLOCK),), lanes // k
    with _on_device(tree):
        _zero_leaves_kernel[grid](bits, index, k, lanes, layout.sizes[0], layout.numel, BLOCK=BLOCK)
        _max_leaves_kernel[grid](bits, index, value, k, lanes, layout.sizes[0], layout.numel, BLOCK=BLOCK)
        rows = index.long()
        for level in range(layout.depth - 1):
            rows = rows >> SHIFT  # [k] or [S, k] the updated nodes' parents: the rows to rewrite
            _rebuild_rows_triton(tree, layout, level, trees, rows=rows)
        _rebuild_rows_triton(tree, layout, layout.depth - 1, trees, run=(0, 0))  # the root's row
    return tree


def _write_triton(tree, start, value):
    count, layout = value.shape[-1], _layout_of_size(tree.shape[-1])
    tree[..., start : start + count].copy_(value)
    with _on_device(tree):
        for level, run in enumerate(_runs_above(start, count, layout.depth)):
            _rebuild_rows_triton(tree, layout, level, value.numel() // count, run=run)
    return tree


def _find_triton(tree, fraction):
    k, lanes, layout = fraction.shape[-1], fraction.numel(), _layout_of_size(tree.shape[-1])
    index = torch.empty(fraction.shape, dtype=torch.int64, device=tree.device)
    leaf = torch.empty(fraction.shape, dtype=torch.float64, device=tree.device)
    if lanes:
        with _on_device(tree):
            starts = _rows_starts(layout.numel, tree.device)
            _find_kernel[(triton.cdiv(lanes, BLOCK),)](
                tree,
                fraction,
                index,
                leaf,
                starts,
                k,
                lanes,
                layout.numel,
                layout.depth,
                layout.widths[-1],
                FANOUT=FANOUT,
                BLOCK=BLOCK,
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
    """Views of one tensor of trees `[S, numel]` (one tree `[numel]`: S = 1), made once per tensor: each
    view costs as much as a small op."""

    leaves: torch.Tensor  # [S, L]
    children: list[torch.Tensor]  # per level of rows: the level below's values as rows [S, rows, width]
    rows: list[torch.Tensor]  # per level of rows: its rows [S, nodes, width + 1]
    sums: list[torch.Tensor]  # the same without column 0 (always 0): [S, nodes, width]
    top: torch.Tensor  # the root's row: [width + 1] of one tree, [S, width + 1] of several
    zero: torch.Tensor  # [] 0.0, for `nextafter`
    # What gathers and writes index, per level of rows: `(2-d tensor, step)` for its children, its sums and
    # its rows (`_at`), and the leaves. One tree: the level's own `[nodes, ...]`, indexed by row. Several: a
    # view of the flat trees with a row starting at every entry, indexed by address `s * numel + row * step`.
    children_at: list[tuple[torch.Tensor, int]]
    sums_at: list[tuple[torch.Tensor, int]]
    rows_at: list[tuple[torch.Tensor, int]]
    leaves_at: torch.Tensor  # the flat tree(s), addressed `s * numel + leaf` (one tree: by leaf)
    base: torch.Tensor | None  # [S, 1] each tree's first entry in the flat trees; None for one tree


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
    layout = _layout_of_size(tree.shape[-1])
    trees = tree.view(-1, layout.numel)  # [S, numel]
    count = trees.shape[0]
    rows = [
        trees[:, start : start + size * (width + 1)].view(count, size, width + 1)
        for start, size, width in zip(layout.rows, layout.sizes[1:], layout.widths, strict=True)
    ]
    leaves = trees[:, : layout.sizes[0]]
    values = [leaves] + [below[..., -1] for below in rows[:-1]]  # each level's, leaves to the root's children
    children = [level.view(count, -1, width) for level, width in zip(values, layout.widths, strict=True)]
    sums = [level[..., 1:] for level in rows]
    zero = tree.new_zeros(())
    if count == 1:
        at = [[(level[0], 1) for level in levels] for levels in (children, sums, rows)]
        return _Views(leaves, children, rows, sums, rows[-1][0, 0], zero, *at, trees[0], None)
    flat, entries = trees.view(-1), count * layout.numel

    def window(offset: int, columns: int, inner: int) -> torch.Tensor:
        """Rows of `columns` entries `inner` apart, one starting at every entry from `offset` on."""
        return flat[offset:].as_strided((entries - offset - (columns - 1) * inner, columns), (1, inner))

    children_at, sums_at, rows_at = [], [], []
    for level, (start, width) in enumerate(zip(layout.rows, layout.widths, strict=True)):
        # The level below's values: the leaves (1 apart), or the last column of each row below.
        below = layout.widths[level - 1]
        offset, inner = (0, 1) if level == 0 else (layout.rows[level - 1] + below, below + 1)
        children_at.append((window(offset, width, inner), width * inner))
        sums_at.append((window(start + 1, width, 1), width + 1))
        rows_at.append((window(start, width + 1, 1), width + 1))
    base = torch.arange(count, device=tree.device).mul_(layout.numel).unsqueeze(1)
    return _Views(leaves, children, rows, sums, rows[-1][:, 0], zero, children_at, sums_at, rows_at, flat, base)


def _lanes(views: _Views, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`x` (`[k]`, or `[S, k]` for several trees) flat, one entry per lane, and each lane's tree's first
    entry in the flat trees (None for one tree): `([S k], [S k] or None)`."""
    if views.base is None:
        return x.view(-1) if x.dim() > 1 else x, None
    return x.view(-1), views.base.expand(-1, x.shape[-1]).reshape(-1)


def _at(base: torch.Tensor | None, rows: torch.Tensor, step: int) -> torch.Tensor:
    """Rows `rows` (one per lane, `[S k]`) as indices of an `_at` view: the rows themselves for one tree
    (`base` None); for several, each lane's tree's first entry `base` plus `rows * step`."""
    return rows if base is None else torch.add(base, rows, alpha=step)


def _running_sum(children: torch.Tensor) -> torch.Tensor:
    """`[..., width]` running sums along the last dim, added in order (the CPU's `cumsum` does; a GPU's
    is a parallel scan that rounds differently, so there one column at a time)."""
    if children.device.type == "cpu":
        return children.cumsum(-1)
    running = children.clone()
    for j in range(1, children.shape[-1]):
        running[..., j] += running[..., j - 1]
    return running


def _rebuild_rows_torch(views: _Views, level: int, rows: torch.Tensor | slice, base=None) -> None:
    """Rewrite rows `rows` of level `level + 1`: a slice of every tree's, or one per lane `[S k]` (repeats
    allowed), lane i of tree `base[i]` (`_lanes`)."""
    if isinstance(rows, slice):
        views.sums[level][:, rows].copy_(_running_sum(views.children[level][:, rows]))
        return
    (children, read), (sums, write) = views.children_at[level], views.sums_at[level]
    # Repeated rows get the same sums, so the order of their writes does not matter.
    sums.index_copy_(0, _at(base, rows, write), _running_sum(children.index_select(0, _at(base, rows, read))))


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


def _skip_out_of_range(index, value, layout):
    """`(address, value, index)` of each lane `[S k]`, the lanes whose index is outside `[0, L)` made
    harmless without reading a value on the host: they write 0 (`value`) into an entry that is always 0
    (column 0 of the first row: `address`, to add to the tree's base), and rewrite the rows above leaf 0
    or leaf L - 1 (`index`), which are recomputed from their children, so unchanged. So they are skipped,
    as the Triton kernels skip them, instead of writing into another tree or an inner row, or raising from
    a scatter that has already written some leaves. Four ops on `[S k]`."""
    index_in_range = index.clamp(0, layout.sizes[0] - 1)
    valid = index_in_range == index
    return index.where(valid, layout.rows[0]), value.where(valid, 0.0), index_in_range


def _update_torch(tree, index, value):
    if torch.compiler.is_compiling():
        return _update_flat(tree, index, value)
    views, k = _views(tree), index.shape[-1]
    (index, base), value = _lanes(views, index), _lanes(views, value)[0]
    address, value, index = _skip_out_of_range(index, value, _layout_of_size(tree.shape[-1]))
    views.leaves_at.scatter_reduce_(0, _at(base, address, 1), value.to(torch.float64), "amax", include_self=False)
    rows = index
    for level, children in enumerate(views.children):
        rows = rows >> SHIFT  # [S k] the updated nodes' parents: the rows to rewrite (the root's: whole)
        # A level with no more rows than updates is cheaper rebuilt whole, by slices.
        whole = children.shape[1] <= k
        _rebuild_rows_torch(views, level, slice(0, children.shape[1]) if whole else rows, base)
    return tree


def _update_flat(tree, index, value):
    """`_update_torch` traced into a compiled graph: every write goes into the flat trees themselves, by
    `index_copy_`. Compiled, a write through a view of the tree, or a scatter of maxima into it, became
    copies of the whole tree (milliseconds a step at a million leaves); these stay in place."""
    views, layout, k = _views(tree), _layout_of_size(tree.shape[-1]), index.shape[-1]
    flat = tree if tree.dim() == 1 else tree.view(-1)
    (index, base), value = _lanes(views, index), _lanes(views, value)[0]
    address, value, index = _skip_out_of_range(index, value, layout)
    flat.index_copy_(0, *_largest_per_index(_at(base, address, 1), value.to(torch.float64)))  # the leaves
    rows = index
    for children, start in zip(views.children, layout.rows, strict=True):
        rows = rows >> SHIFT  # [S k] the updated nodes' parents: the rows to rewrite (the root's: whole)
        # A level with no more rows than updates is cheaper rebuilt whole. Repeated rows get the same
        # sums, so the order of their writes does not matter.
        trees, count, width = children.shape
        written = rows if base is None else rows.view(trees, k)  # [r] or [S, r]
        written = torch.arange(count, device=tree.device) if count <= k else written
        first = written * (width + 1) if base is None else torch.add(views.base, written, alpha=width + 1)
        columns = torch.arange(start + 1, start + width + 1, device=tree.device)  # row 0's sums in a tree
        slots = columns + first.unsqueeze(-1)  # [(S,) r, width] the written rows' sums in the flat trees
        read = (
            children.flatten(0, 1).index_select(0, written)
            if base is None
            else children.gather(1, written.expand(trees, -1).unsqueeze(-1).expand(-1, -1, width))
        )
        flat.index_copy_(0, slots.flatten(), _running_sum(read).flatten())
    return tree


def _write_torch(tree, start, value):
    views = _views(tree)
    views.leaves[:, start : start + value.shape[-1]].copy_(value)
    for level, (first, last) in enumerate(_runs_above(start, value.shape[-1], len(views.rows))):
        _rebuild_rows_torch(views, level, slice(first, last + 1))
    return tree


def _find_torch(tree, fraction):
    views, shape = _views(tree), fraction.shape
    # The root's row, the same for every draw of a tree: one tree's searched as it is, with its draws [k];
    # several trees' copied (a search wants contiguous rows), each with its draws [S, k].
    top = views.top if views.base is None else views.top.contiguous()
    fraction = _lanes(views, fraction)[0] if views.base is None else fraction
    total = top[..., -1:]  # [1] or [S, 1]
    mass = fraction.to(torch.float64) * total  # [k] or [S, k]
    # Kept in [0, total): a fraction below 0 or NaN finds what 0 finds, above 1 what 1 finds.
    mass = mass.nan_to_num_(0.0).clamp_(min=0.0).clamp_(max=total.nextafter(views.zero))
    choice = torch.searchsorted(top, mass, right=True).sub_(1).clamp_(max=top.shape[-1] - 2)
    mass = (mass - top.gather(-1, choice)).view(-1, 1)  # [S k, 1]
    node, base = _lanes(views, choice)  # [S k]
    for rows, step in reversed(views.rows_at[:-1]):
        row = rows.index_select(0, _at(base, node, step))  # [S k, F + 1] each draw's node's row
        mass = torch.minimum(mass, row[:, -1:].nextafter(views.zero))  # below the node's value
        # The last child j < F with row[j] <= mass (row[F] > mass but in an all-zero tree).
        choice = torch.searchsorted(row, mass, right=True).sub_(1).clamp_(max=FANOUT - 1)  # [S k, 1]
        mass = mass - row.gather(1, choice)
        node = torch.add(choice[:, 0], node, alpha=FANOUT)  # node * F + choice
    leaf = views.leaves_at.index_select(0, _at(base, node, 1))
    return (node, leaf) if len(shape) == 1 else (node.view(shape), leaf.view(shape))


# ---- reference ------------------------------------------------------------------------------------


def _each_tree(tree: torch.Tensor, *rows: torch.Tensor):
    """Each tree of `tree` (`[numel]` or `[S, numel]`) with its rows of `rows` (`[k]` or `[S, k]`)."""
    count = tree.numel() // tree.shape[-1]
    return zip(tree.view(count, -1), *(x.reshape(count, -1) for x in rows), strict=True)


def _rebuild_reference(tree: torch.Tensor) -> torch.Tensor:
    """Recompute every row of one tree `[numel]` from its children, bottom level first, as plain loops."""
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
    """`sum_tree_update_` as plain loops, tree after tree: set each leaf (the largest value where an index
    repeats; an index outside `[0, L)` skipped), then recompute every row."""
    num_leaves = _layout_of_size(tree.shape[-1]).sizes[0]
    for one, rows, values in _each_tree(tree, index, value):
        largest: dict[int, float] = {}
        for i, v in zip(rows.tolist(), values.double().tolist(), strict=True):
            if 0 <= i < num_leaves:
                largest[i] = max(largest.get(i, v), v)
        for i, v in largest.items():
            one[i] = v
        _rebuild_reference(one)
    return tree


def sum_tree_write_reference(tree: torch.Tensor, start: int, value: torch.Tensor) -> torch.Tensor:
    """`sum_tree_write_` as plain loops, tree after tree."""
    for one, values in _each_tree(tree, value):
        for i, v in enumerate(values.double().tolist()):
            one[start + i] = v
        _rebuild_reference(one)
    return tree


def sum_tree_find_reference(tree: torch.Tensor, fraction: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`sum_tree_find` as a plain loop per draw, walking down from its tree's root."""
    layout = _layout_of_size(tree.shape[-1])
    found = []
    for one, fractions in _each_tree(tree, fraction):
        values = one.tolist()
        for f in fractions.double().tolist():
            mass, node = f * values[-1], 0
            mass = mass if mass > 0.0 else 0.0  # below 0 or NaN: as 0 (above the total: clamped below)
            for start, width in zip(reversed(layout.rows), reversed(layout.widths), strict=True):
                row = values[start + node * (width + 1) : start + (node + 1) * (width + 1)]
                mass = min(mass, math.nextafter(row[width], 0.0))  # below the node's value
                choice = max(j for j in range(width) if row[j] <= mass)
                mass -= row[choice]
                node = node * width + choice
            found.append(node)
    nodes = torch.tensor(found, dtype=torch.int64, device=tree.device).view(fraction.shape)
    return nodes, sum_tree_leaves(tree).view(*nodes.shape[:-1], -1).gather(-1, nodes)


# ---- public ---------------------------------------------------------------------------------------


def _check_tree(op: str, tree: torch.Tensor) -> None:
    if not isinstance(tree, torch.Tensor):
        raise TypeError(f"{op}: tree must be a torch.Tensor, got {type(tree).__name__}")
    laid_out = tree.dim() in (1, 2) and tree.shape[0] > 0 and _layout_of_size(tree.shape[-1])
    if tree.dtype != torch.float64 or not laid_out or not tree.is_contiguous():
        raise ValueError(
            f"{op}: tree has shape {tuple(tree.shape)}, dtype {tree.dtype}; expected a contiguous float64 tensor "
            "laid out as a sum tree, or as S of them [S, numel] (make it with sum_tree_zeros(capacity, device))"
        )


def _check_vector(op: str, name: str, x: torch.Tensor, tree: torch.Tensor, kind: str, length: int | None = None):
    """`x` `[k]` for a tree `[numel]`, `[S, k]` for trees `[S, numel]`; `length`: the k it must have."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{op}: {name} must be a torch.Tensor, got {type(x).__name__}")
    ok = x.dtype in (torch.int32, torch.int64) if kind == "index" else x.is_floating_point()
    if not ok:
        expected = "int64 (or int32)" if kind == "index" else "floating point"
        raise TypeError(f"{op}: {name} has dtype {x.dtype}; expected {expected}")
    lead = tuple(tree.shape[:-1])  # () for one tree, (S,) for S of them
    if x.dim() != len(lead) + 1 or tuple(x.shape[:-1]) != lead or (length is not None and x.shape[-1] != length):
        if not lead:
            expected = "a 1-d tensor " + ("[k]" if length is None else f"({length},) like index")
        else:
            expected = f"a 2-d tensor ({lead[0]}, {'k' if length is None else length}): a row per tree"
            expected += "" if length is None else " like index"
        raise ValueError(f"{op}: {name} has shape {tuple(x.shape)}; expected {expected}")
    if x.device != tree.device:
        raise ValueError(f"{op}: {name} is on {x.device}, expected {tree.device} like tree")


@torch.no_grad()
def sum_tree_update_(
    tree: torch.Tensor, index: torch.Tensor, value: torch.Tensor, *, backend: Backend = "auto"
) -> torch.Tensor:
    """Set leaves `index` of `tree` to `value`, in place, and recompute their ancestors; returns `tree`.

    Args:
        tree: float64 tree `[numel]` from `sum_tree_zeros`, or trees `[S, numel]` (`members=S`).
        index: `[k]` (`[S, k]` for trees: row s for tree s) int64 (or int32) leaf indices in `[0, L)`; an
            index may repeat: its leaf takes the largest of its values. Not checked here, since that
            would read the device from the host (`ReplayBuffer(check_values=True)` checks them): every
            backend skips an index outside `[0, L)` (its value is written nowhere).
        value: `[k]` (`[S, k]`) floating point, non-negative and finite (not checked, for the same reason).
        backend: `"auto"` (Triton for CUDA tensors, and for CPU tensors under `TRITON_INTERPRET=1`; the
            torch path otherwise), `"triton"`, `"torch"` or `"reference"`.
    """
    _check_tree("sum_tree_update_", tree)
    _check_vector("sum_tree_update_", "index", index, tree, "index")
    _check_vector("sum_tree_update_", "value", value, tree, "value", index.shape[-1])
    implementation = {"triton": _update_triton, "torch": _update_torch, "reference": sum_tree_update_reference}
    run = implementation[resolve_backend(backend, tree.device, _find_kernel)]
    index = index.contiguous()
    return run(tree, index if run is _update_triton else index.long(), value.contiguous())


@torch.no_grad()
def sum_tree_write_(tree: torch.Tensor, start: int, value: torch.Tensor, *, backend: Backend = "auto") -> torch.Tensor:
    """Set the leaves `start .. start + m - 1` of `tree` to `value` `[m]` (trees `[S, numel]`: of each tree,
    to its row of `value` `[S, m]`; non-negative, finite), in place, and recompute the rows above them, by
    slices; returns `tree`. `backend` as in `sum_tree_update_`."""
    _check_tree("sum_tree_write_", tree)
    _check_vector("sum_tree_write_", "value", value, tree, "value")
    num_leaves, count = _layout_of_size(tree.shape[-1]).sizes[0], value.shape[-1]
    if isinstance(start, bool) or not isinstance(start, int):  # a tensor's "leaves tensor(6) .. do not fit" misled
        raise ValueError(
            f"sum_tree_write_: start must be a Python int (the first leaf written), got {type(start).__name__} {start!r}"
        )
    if not 0 <= start <= num_leaves - count:
        raise ValueError(
            f"sum_tree_write_: leaves {start!r} .. {start!r} + {count} do not fit in the tree's "
            f"{num_leaves} leaves; expected an int start with 0 <= start <= {num_leaves - count}"
        )
    if count == 0:
        return tree
    implementation = {"triton": _write_triton, "torch": _write_torch, "reference": sum_tree_write_reference}
    return implementation[resolve_backend(backend, tree.device, _find_kernel)](tree, start, value.contiguous())


@torch.no_grad()
def sum_tree_find(
    tree: torch.Tensor, fraction: torch.Tensor, *, backend: Backend = "auto"
) -> tuple[torch.Tensor, torch.Tensor]:
    """The leaves where the running sum of the leaves passes `fraction * total` (see the module docstring).

    Args:
        tree: float64 tree `[numel]` from `sum_tree_zeros`, with a positive total, or trees `[S, numel]`.
        fraction: `[k]` (`[S, k]` for trees: row s in tree s) floating point in `[0, 1]`, e.g.
            `(arange(k) + rand(k)) / k` for a stratified draw. Not checked (that would read the device
            from the host): one below 0 or NaN finds what 0 finds, one above 1 what 1 finds.
        backend: as in `sum_tree_update_`.

    Returns:
        `(index, leaf)`: int64 leaf indices and float64 their values, shaped as `fraction`; the probability
        of a uniform fraction finding leaf `j` is `leaf / total` (of its tree). With an all-zero tree the
        indices are meaningless (the caller knows whether anything was stored).
    """
    _check_tree("sum_tree_find", tree)
    _check_vector("sum_tree_find", "fraction", fraction, tree, "value")
    implementation = {"triton": _find_triton, "torch": _find_torch, "reference": sum_tree_find_reference}
    run = implementation[resolve_backend(backend, tree.device, _find_kernel)]
    return run(tree, fraction.contiguous())

"""A sum tree for prioritized replay: set leaf priorities and draw leaves in proportion to them.

Layout: the tree is one float64 tensor `[2 * L]` in heap order, `L = num_leaves` a power of two: node 1 is
the root, node `i` has children `2 i` and `2 i + 1`, leaf `j` is node `L + j`, and entry 0 is unused. Every
inner node holds exactly `tree[2 i] + tree[2 i + 1]`, recomputed from its children (never by adding a
difference to the old sum), so `tree[1]` is the total and an inner node is zero only when all its leaves are.

Semantics:
- `sum_tree_update_(tree, index, value)`: leaf `index[i]` becomes `value[i]`; where an index repeats in one
  call the leaf takes the largest of its values (max, not last-write-wins: the result then does not depend
  on the order of the writes, which parallel hardware does not keep). Only the updated leaves and their
  ancestors change, O(k log L); leaves not in `index` keep their values.
- `sum_tree_find(tree, fraction)`: for each `fraction[i]` in `[0, 1]`, the leaf where the running sum of
  the leaves, in order, passes `fraction[i] * total`: leaf `j` is found for fractions in
  `[sum(leaves[:j]) / total, sum(leaves[:j + 1]) / total)`, i.e. with probability `leaves[j] / total` for
  a uniform fraction. The walk from the root never enters a subtree whose sum is zero: where rounding sends
  the remaining mass past the last non-empty child, it takes that child instead. So a zero leaf is never
  found while the total is positive, whatever the rounding (float32 trees that subtract their way down are
  known to land on zero leaves); float64 keeps the drawn frequencies within 1e-16 of the priorities even
  with a million leaves spanning many orders of magnitude.

Implementations, held to each other by the tests:
- Triton: `_zero_leaves_kernel` then `_max_leaves_kernel` write the leaves (an atomic max on the float64
  bits, which order like the values for non-negative floats), `_rebuild_subtrees_kernel` recomputes the
  subtree of `2**c` leaves around each updated leaf from the (now final) leaves, one program per updated
  subtree, and `_rebuild_top_kernel` recomputes the `2**t - 1` nodes above them in one program
  (`c + t = log2 L`, `c = 8` and `t <= 12` up to 2**20 leaves); `_find_kernel` walks down the tree. Four
  launches per update and one per find, none per level. An update reads `k * 2**c + 2**t` nodes (at most
  1M + 4096 for 4096 updates of a million-leaf tree, 2**21 nodes) and writes only the updated subtrees
  and the top: a full rebuild would touch all `2 L` nodes whatever `k`.
- torch (CPU): an update writes the leaves with one `scatter_reduce_("amax")` and recomputes the
  ancestors 3 levels at a time from one gather of their descendants (whole levels once they are no
  larger than the update); a find
  walks down 4 levels per step, choosing among 16 descendants with a running sum and `searchsorted`
  (about 12 ops a step), so both cost O(k log L) work in O(log L) ops.
- `sum_tree_update_reference`, `sum_tree_find_reference`: plain loops to check by eye.
"""

from __future__ import annotations

import contextlib
import math

import torch

from ._common import Backend, resolve_backend, tl, triton, triton_jit

# The update's lowest levels go to one program per updated subtree of 2**SUBTREE_LEVELS leaves, the rest
# to one program holding at most 2**MAX_TOP_LEVELS nodes.
MIN_SUBTREE_LEVELS = 8
MAX_TOP_LEVELS = 12
# The torch path's find descends this many levels per step (16 candidates); its update recomputes this
# many levels of ancestors from one gather.
TORCH_FIND_LEVELS = 4
TORCH_UPDATE_LEVELS = 3
BLOCK = 256


def sum_tree_zeros(capacity: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """An empty tree (all priorities zero) with room for `capacity` leaves: float64 `[2 * L]`, `L` the
    smallest power of two >= max(capacity, 2)."""
    if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
        raise ValueError(f"sum_tree_zeros: capacity must be a positive int, got {capacity!r}")
    num_leaves = 1 << max(1, (capacity - 1).bit_length())
    return torch.zeros(2 * num_leaves, dtype=torch.float64, device=device)


def sum_tree_nbytes(capacity: int) -> int:
    """Bytes of the tree `sum_tree_zeros(capacity)` allocates."""
    return 2 * (1 << max(1, (capacity - 1).bit_length())) * 8


def _depth(tree: torch.Tensor) -> int:
    return tree.numel().bit_length() - 2  # log2(L)


# ---- Triton ---------------------------------------------------------------------------------------


@triton_jit
def _zero_leaves_kernel(tree_bits_ptr, index_ptr, k, num_leaves, BLOCK: tl.constexpr):
    """`leaf[index] = 0` (the tree viewed as int64: 0 is +0.0). Out-of-range indices are skipped."""
    offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    in_range = offsets < k
    index = tl.load(index_ptr + offsets, mask=in_range, other=0).to(tl.int64)
    valid = in_range & (index >= 0) & (index < num_leaves)
    tl.store(tree_bits_ptr + num_leaves + index, tl.zeros([BLOCK], dtype=tl.int64), mask=valid)


@triton_jit
def _max_leaves_kernel(tree_bits_ptr, index_ptr, value_ptr, k, num_leaves, BLOCK: tl.constexpr):
    """`leaf[index] = max(leaf[index], value)` on zeroed leaves: the largest value given for each index.
    Non-negative float64 values order like their bits as int64, so the max is an integer atomic."""
    offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    in_range = offsets < k
    index = tl.load(index_ptr + offsets, mask=in_range, other=0).to(tl.int64)
    value = tl.load(value_ptr + offsets, mask=in_range, other=0.0).to(tl.float64)
    valid = in_range & (index >= 0) & (index < num_leaves)
    tl.atomic_max(tree_bits_ptr + num_leaves + index, value.to(tl.int64, bitcast=True), mask=valid)


@triton_jit
def _rebuild_subtrees_kernel(tree_ptr, index_ptr, num_leaves, SUBTREE_LEVELS: tl.constexpr):
    """Program `i`: every inner node of the subtree of `2**SUBTREE_LEVELS` leaves holding leaf `index[i]`,
    from its leaves up. A program whose subtree is also the previous index's skips it (updates from
    `extend` are runs of neighbours); other repeats write the same sums, so their order does not matter."""
    i = tl.program_id(0)
    index = tl.load(index_ptr + i).to(tl.int64)
    previous = tl.load(index_ptr + tl.maximum(i - 1, 0)).to(tl.int64)
    root = (num_leaves + index) >> SUBTREE_LEVELS  # heap index of the subtree's root
    repeat = (i > 0) & (((num_leaves + previous) >> SUBTREE_LEVELS) == root)
    active = (index >= 0) & (index < num_leaves) & (repeat == 0)
    width: tl.constexpr = 1 << SUBTREE_LEVELS
    # The subtree's nodes at each depth are contiguous: `width` leaves from `root * width` on.
    nodes = tl.load(tree_ptr + root * width + tl.arange(0, width), mask=active & (tl.arange(0, width) < width))
    for level in tl.static_range(1, SUBTREE_LEVELS + 1):
        # [width >> level]: each parent = left + right
        nodes = tl.sum(tl.reshape(nodes, [width >> level, 2]), axis=1)
        offsets = tl.arange(0, width >> level)
        tl.store(tree_ptr + root * (width >> level) + offsets, nodes, mask=active & (offsets < (width >> level)))


@triton_jit
def _rebuild_top_kernel(tree_ptr, TOP_LEVELS: tl.constexpr):
    """One program: the `2**TOP_LEVELS - 1` nodes above depth `TOP_LEVELS`, from that depth up."""
    width: tl.constexpr = 1 << TOP_LEVELS
    nodes = tl.load(tree_ptr + width + tl.arange(0, width))
    for level in tl.static_range(1, TOP_LEVELS + 1):
        nodes = tl.sum(tl.reshape(nodes, [width >> level, 2]), axis=1)
        tl.store(tree_ptr + (width >> level) + tl.arange(0, width >> level), nodes)


@triton_jit
def _find_kernel(tree_ptr, fraction_ptr, index_ptr, leaf_ptr, k, num_leaves, depth, BLOCK: tl.constexpr):
    """Each draw walks from the root to a leaf: right where the remaining mass reaches the left child's sum
    and the right child is non-empty, or where the left child is empty; left otherwise."""
    offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    in_range = offsets < k
    total = tl.load(tree_ptr + 1)
    mass = tl.load(fraction_ptr + offsets, mask=in_range, other=0.0).to(tl.float64) * total
    node = tl.full([BLOCK], 1, dtype=tl.int64)
    for _ in range(depth):
        left = tl.load(tree_ptr + 2 * node, mask=in_range, other=0.0)
        right = tl.load(tree_ptr + 2 * node + 1, mask=in_range, other=0.0)
        go_right = ((mass >= left) & (right > 0.0)) | (left <= 0.0)
        mass = tl.where(go_right, mass - left, mass)
        node = 2 * node + go_right.to(tl.int64)
    tl.store(index_ptr + offsets, node - num_leaves, mask=in_range)
    tl.store(leaf_ptr + offsets, tl.load(tree_ptr + node, mask=in_range, other=0.0), mask=in_range)


def _split_levels(depth: int) -> tuple[int, int]:
    """`(subtree levels, top levels)` of an update, adding up to `depth`."""
    subtree = min(depth, max(MIN_SUBTREE_LEVELS, depth - MAX_TOP_LEVELS))
    return subtree, depth - subtree


def _update_triton(tree, index, value):
    k, num_leaves = index.numel(), tree.numel() // 2
    if k == 0:
        return tree
    bits = tree.view(torch.int64)
    grid = (triton.cdiv(k, BLOCK),)
    subtree_levels, top_levels = _split_levels(_depth(tree))
    with torch.cuda.device(tree.device) if tree.is_cuda else contextlib.nullcontext():
        _zero_leaves_kernel[grid](bits, index, k, num_leaves, BLOCK=BLOCK)
        _max_leaves_kernel[grid](bits, index, value, k, num_leaves, BLOCK=BLOCK)
        _rebuild_subtrees_kernel[(k,)](tree, index, num_leaves, SUBTREE_LEVELS=subtree_levels, num_warps=4)
        if top_levels:
            _rebuild_top_kernel[(1,)](tree, TOP_LEVELS=top_levels, num_warps=8)
    return tree


def _find_triton(tree, fraction):
    k, num_leaves = fraction.numel(), tree.numel() // 2
    index = torch.empty(k, dtype=torch.int64, device=tree.device)
    leaf = torch.empty(k, dtype=torch.float64, device=tree.device)
    if k:
        with torch.cuda.device(tree.device) if tree.is_cuda else contextlib.nullcontext():
            grid = (triton.cdiv(k, BLOCK),)
            _find_kernel[grid](tree, fraction, index, leaf, k, num_leaves, _depth(tree), BLOCK=BLOCK)
    return index, leaf


# ---- torch (CPU) ----------------------------------------------------------------------------------


def _update_torch(tree, index, value):
    num_leaves, depth = tree.numel() // 2, _depth(tree)
    node = index + num_leaves  # [k] heap indices of the leaves
    tree.scatter_reduce_(0, node, value.to(torch.float64), "amax", include_self=False)
    # Levels with no more nodes than updates are recomputed whole; below them, only the updated nodes'
    # ancestors, TORCH_UPDATE_LEVELS levels at a time from one gather of their descendants.
    whole = min(depth, node.numel().bit_length())  # levels [0, whole) have <= k nodes
    level = depth  # of `node`
    while level > whole:
        levels = min(TORCH_UPDATE_LEVELS, level - whole)
        node = node >> levels  # [k] ancestors `levels` levels up
        below = tree.view(-1, 1 << levels).index_select(0, node)  # [k, 2**levels] their descendants
        for up in range(levels - 1, -1, -1):
            below = below[:, 0::2] + below[:, 1::2]  # [k, 2**up] each parent = left + right
            # Row p of this view: p's descendants `up` levels down. Repeated ancestors get the same sums,
            # so the order of their writes does not matter.
            tree.view(-1, 1 << up).index_copy_(0, node, below)
        level -= levels
    for level in range(whole - 1, -1, -1):
        start = 1 << level
        children = tree[2 * start : 4 * start]
        torch.add(children[0::2], children[1::2], out=tree[start : 2 * start])
    return tree


def _find_torch(tree, fraction):
    depth, in_order = _depth(tree), tree.device.type == "cpu"
    mass = fraction.to(torch.float64) * tree[1]  # [k]
    node = torch.ones(fraction.shape, dtype=torch.int64, device=tree.device)  # [k]
    done = 0
    while done < depth:
        levels = min(TORCH_FIND_LEVELS, depth - done)
        width = 1 << levels
        # Row p of this view holds p's descendants `levels` levels down, in order.
        children = tree.view(-1, width).index_select(0, node)  # [k, width]
        running = children.cumsum(1)  # [k, width]
        # The CPU's cumsum adds in order, so the running sum rises only at non-empty children. A parallel
        # scan (CUDA) may round two prefixes differently around an empty child: there, the running sum as
        # it stands after each non-empty child (-inf before the first one).
        rising = running if in_order else torch.where(children > 0, running, -math.inf).cummax(1).values
        # With a mass >= 0, the first child where the running sum passes it is non-empty (the sum rose
        # there); where rounding leaves the mass past all of them, the last non-empty child.
        passed = torch.searchsorted(rising, mass[:, None], right=True)  # [k, 1]
        last_positive = torch.searchsorted(rising, rising[:, -1:].contiguous())  # [k, 1]
        choice = torch.minimum(passed, last_positive)
        before = running.gather(1, choice) - children.gather(1, choice)  # [k, 1] sum of earlier children
        mass = (mass - before[:, 0]).clamp_min_(0.0)  # rounding may take it just below 0
        node = node * width + choice[:, 0]
        done += levels
    return node - tree.numel() // 2, tree.index_select(0, node)


# ---- reference ------------------------------------------------------------------------------------


def sum_tree_update_reference(tree: torch.Tensor, index: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """`sum_tree_update_` as plain loops: set each leaf (the largest value where an index repeats), then
    recompute every inner node from its children, bottom level first."""
    num_leaves = tree.numel() // 2
    largest: dict[int, float] = {}
    for i, v in zip(index.tolist(), value.double().tolist(), strict=True):
        largest[i] = max(largest.get(i, v), v)
    for i, v in largest.items():
        tree[num_leaves + i] = v
    for node in range(num_leaves - 1, 0, -1):
        tree[node] = tree[2 * node] + tree[2 * node + 1]
    return tree


def sum_tree_find_reference(tree: torch.Tensor, fraction: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`sum_tree_find` as a plain loop per draw, walking down from the root."""
    num_leaves = tree.numel() // 2
    values = tree.tolist()
    found = []
    for f in fraction.double().tolist():
        mass, node = f * values[1], 1
        while node < num_leaves:
            left, right = values[2 * node], values[2 * node + 1]
            if (mass >= left and right > 0) or left <= 0:  # never into an empty subtree
                mass -= left
                node = 2 * node + 1
            else:
                node = 2 * node
        found.append(node)
    nodes = torch.tensor(found, dtype=torch.int64, device=tree.device)
    return nodes - num_leaves, tree[nodes]


# ---- public ---------------------------------------------------------------------------------------


def _check_tree(op: str, tree: torch.Tensor) -> None:
    if not isinstance(tree, torch.Tensor):
        raise TypeError(f"{op}: tree must be a torch.Tensor, got {type(tree).__name__}")
    size = tree.numel()
    if tree.dtype != torch.float64 or tree.dim() != 1 or size < 4 or size & (size - 1) or not tree.is_contiguous():
        raise ValueError(
            f"{op}: tree has shape {tuple(tree.shape)}, dtype {tree.dtype}; expected a contiguous float64 tensor "
            "[2 * L] with L a power of two >= 2 (make it with sum_tree_zeros(capacity, device))"
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
        tree: float64 `[2 * L]` from `sum_tree_zeros`.
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
def sum_tree_find(
    tree: torch.Tensor, fraction: torch.Tensor, *, backend: Backend = "auto"
) -> tuple[torch.Tensor, torch.Tensor]:
    """The leaves where the running sum of the leaves passes `fraction * total` (see the module docstring).

    Args:
        tree: float64 `[2 * L]` from `sum_tree_zeros`, with a positive total.
        fraction: `[k]` floating point in `[0, 1]`, e.g. `(arange(k) + rand(k)) / k` for a stratified draw.
        backend: as in `sum_tree_update_`.

    Returns:
        `(index, leaf)`: `[k]` int64 leaf indices and `[k]` float64 their values; the probability of a
        uniform fraction finding leaf `j` is `leaf / tree[1]`. With an all-zero tree the indices are
        meaningless (the caller knows whether anything was stored).
    """
    _check_tree("sum_tree_find", tree)
    _check_vector("sum_tree_find", "fraction", fraction, tree, "value")
    implementation = {"triton": _find_triton, "torch": _find_torch, "reference": sum_tree_find_reference}
    run = implementation[resolve_backend(backend, tree.device, _find_kernel)]
    return run(tree, fraction.contiguous())

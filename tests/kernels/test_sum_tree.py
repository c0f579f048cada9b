"""The sum tree: the Triton kernels (under TRITON_INTERPRET=1 here) and the torch path against the plain
loops, the loops against hand-computed trees, zero priorities never drawn, drawn frequencies by chi-square,
and the kernels compiled for an H100/H200 (sm_90) without a GPU."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import triton

from kernels import sum_tree_find, sum_tree_update_, sum_tree_zeros
from kernels.sum_tree import _layout_of_size, sum_tree_layout, sum_tree_leaves, sum_tree_nbytes, sum_tree_write_

REPO = Path(__file__).resolve().parents[2]
BACKENDS = ("triton", "torch", "reference")


def chi_square_limit(df: int) -> float:
    """The 0.999 quantile of a chi-square with `df` degrees of freedom (Wilson-Hilferty)."""
    z = 3.090232
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


def random_updates(capacity, k, generator, integer=False):
    index = torch.randint(capacity, (k,), generator=generator)
    if integer:  # small integers: every sum is exact, so all paths agree bit for bit for any order
        return index, torch.randint(0, 5, (k,), generator=generator).double()
    value = torch.rand(k, generator=generator, dtype=torch.float64) * 10.0 ** torch.randint(
        -6, 6, (k,), generator=generator
    )
    return index, value


def trees_after(capacity, updates):
    trees = {backend: sum_tree_zeros(capacity) for backend in BACKENDS}
    for index, value in updates:
        for backend, tree in trees.items():
            assert sum_tree_update_(tree, index, value, backend=backend) is tree
    return trees


def test_layout_and_size():
    # Leaves: the capacity rounded up to a multiple of 32; while a level has more than 1024 nodes, a level
    # above with one node per 32, rounded up to a multiple of 32; then the root. The tensor holds the
    # leaves, then a row of 33 per inner node, then the root's row (its children + 1).
    assert sum_tree_layout(1).sizes == (32, 1) and sum_tree_layout(1024).sizes == (1024, 1)
    assert sum_tree_layout(1025).sizes == (1056, 64, 1)
    assert sum_tree_layout(1_000_000).sizes == (1_000_000, 31264, 992, 1)
    for capacity in (1, 3, 32, 33, 1000, 1024, 1025, 32768, 32769, 1_000_000):
        sizes = sum_tree_layout(capacity).sizes
        numel = sizes[0] + 33 * sum(sizes[1:-1]) + sizes[-2] + 1
        assert sum_tree_zeros(capacity).shape == (numel,) and sum_tree_nbytes(capacity) == numel * 8
        assert sum_tree_leaves(sum_tree_zeros(capacity)).shape == (sizes[0],)
    # A tree's layout is found back from its size alone, for every capacity.
    for capacity in [*range(1, 3000, 7), *range(31_000, 2_000_000, 65_537)]:
        assert _layout_of_size(sum_tree_layout(capacity).numel) == sum_tree_layout(capacity), capacity
    assert sum_tree_zeros(1000).dtype == torch.float64
    with pytest.raises(ValueError, match=r"laid out as a sum tree"):
        sum_tree_leaves(torch.zeros(32 + 33 + 1, dtype=torch.float64))  # one entry too many


@pytest.mark.needs_interpreter
def test_update_by_hand_repeated_index_keeps_the_largest():
    # Capacity 4: 32 leaves under the root, whose row is the last 33 entries.
    index, value = torch.tensor([2, 2, 0, 2]), torch.tensor([1.0, 5.0, 3.0, 2.0], dtype=torch.float64)
    for backend in BACKENDS:
        tree = sum_tree_update_(sum_tree_zeros(4), index, value, backend=backend)
        assert torch.equal(sum_tree_leaves(tree)[:4], torch.tensor([3.0, 0.0, 5.0, 0.0], dtype=torch.float64))
        # 0, then the running sums of the leaves 3, 0, 5, 0, ...: 3, 3, 8, 8, ...; the root's value 8 last.
        assert tree[-33:].tolist() == [0.0, 3.0, 3.0] + [8.0] * 30, backend
    # A later update replaces the leaf (no max with the old value); untouched leaves keep theirs.
    sum_tree_update_(tree, torch.tensor([2]), torch.tensor([0.5], dtype=torch.float64))
    assert tree[-1] == 3.5 and tree[-33:].tolist()[:4] == [0.0, 3.0, 3.0, 3.5]


@pytest.mark.needs_interpreter
@pytest.mark.parametrize("k", [1, 7, 40], ids=lambda k: f"k{k}")
@pytest.mark.parametrize("capacity", [1, 3, 63, 500, 1025, 3000], ids=lambda c: f"cap{c}")
def test_update_matches_reference(capacity, k):
    generator = torch.Generator().manual_seed(capacity * 1000 + k)
    for integer in (True, False):
        trees = trees_after(capacity, [random_updates(capacity, k, generator, integer) for _ in range(2)])
        for backend in ("triton", "torch"):
            # Every node is its children added in order, everywhere, so the trees agree bit for bit.
            assert torch.equal(trees[backend], trees["reference"]), (backend, integer)


@pytest.mark.needs_interpreter
def test_update_of_every_leaf_and_int32_indices():
    capacity = 40
    value = torch.rand(capacity, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    trees = {b: sum_tree_update_(sum_tree_zeros(capacity), torch.arange(capacity), value, backend=b) for b in BACKENDS}
    int32 = sum_tree_update_(sum_tree_zeros(capacity), torch.arange(capacity, dtype=torch.int32), value)
    for tree in (trees["triton"], trees["torch"], int32):
        assert torch.equal(tree, trees["reference"])
    assert math.isclose(trees["reference"][-1], value.sum(), rel_tol=1e-12)


@pytest.mark.needs_interpreter
@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_update_writes_only_the_updated_part(backend):
    # 40000 leaves: 1250 rows of leaves (1280 with padding), 40 rows of their parents, and the root's row
    # over those 40 (64). Updating leaves 5, 700 and 9 rewrites leaf rows 0 and 21, parent row 0 and the
    # root's row, nothing else.
    capacity = 40_000
    tree = sum_tree_zeros(capacity)
    sum_tree_update_(tree, torch.arange(capacity), torch.ones(capacity, dtype=torch.float64), backend="torch")
    layout = sum_tree_layout(capacity)
    untouched_value = layout.rows[0] + 1200 * 33 + 32  # the node over leaves 38400..38431 (parent row 37)
    untouched_sum = layout.rows[0] + 1200 * 33 + 5  # a running sum in that node's row
    tree[untouched_value] = tree[untouched_sum] = -1.0  # sentinels that no rebuild of their rows would keep
    sum_tree_update_(
        tree, torch.tensor([5, 700, 9]), torch.tensor([2.0, 3.0, 4.0], dtype=torch.float64), backend=backend
    )
    assert tree[untouched_value] == -1.0 and tree[untouched_sum] == -1.0
    assert tree[-1] == capacity - 3 + 2 + 3 + 4  # three of the ones replaced


# Each tree size compiles a graph of its own (a deeper tree, 40,000 leaves, compiles the loop over its inner
# rows once more, for over twice the time): one tree of 3 leaves, the root alone over them, and two members'
# trees of 1025 leaves, with a row of inner nodes between. A single tree and trees of members take the same
# code, the first with no member offsets.
@pytest.mark.parametrize(("capacity", "members"), [(3, None), (1025, 2)], ids=["cap3", "cap1025-members2"])
def test_the_torch_path_compiled_matches_reference(capacity, members):
    # Traced into a compiled graph (an off-policy step's), the torch path writes the flat tree(s) in place:
    # the same trees and finds as the plain loops, repeated indices included, each step seeing the last one's.
    torch._dynamo.reset()
    generator = torch.Generator().manual_seed(capacity)
    tree, reference = sum_tree_zeros(capacity, members=members), sum_tree_zeros(capacity, members=members)

    def step(tree, index, value, fraction):
        sum_tree_update_(tree, index, value, backend="torch")
        return sum_tree_find(tree, fraction, backend="torch")

    compiled = torch.compile(step, dynamic=False)
    for _ in range(3):
        if members is None:
            index, value = random_updates(capacity, 64, generator)  # repeats: 64 draws of 3 leaves at least
        else:
            index, value = member_updates(capacity, members, 64, generator)
        fraction = torch.rand(*index.shape, dtype=torch.float64, generator=generator)
        found, leaf = compiled(tree, index, value, fraction)
        sum_tree_update_(reference, index, value, backend="reference")
        expected = sum_tree_find(reference, fraction, backend="reference")
        assert torch.equal(tree, reference)
        assert torch.equal(found, expected[0]) and torch.equal(leaf, expected[1])


@pytest.mark.needs_interpreter
@pytest.mark.parametrize("capacity", [1, 40, 1025, 3000], ids=lambda c: f"cap{c}")
def test_write_of_a_run_matches_reference(capacity):
    # Runs at the start, the end, across row boundaries, of one leaf and of every leaf; after updates.
    generator = torch.Generator().manual_seed(capacity)
    trees = trees_after(capacity, [random_updates(capacity, 20, generator)])
    runs = [(0, capacity), (capacity - 1, 1), (capacity // 3, capacity // 2), (0, 1), (capacity // 2, 0)]
    for start, count in runs:
        value = torch.rand(count, dtype=torch.float64, generator=generator)
        value[torch.rand(count, generator=generator) < 0.3] = 0.0
        for backend, tree in trees.items():
            assert sum_tree_write_(tree, start, value, backend=backend) is tree
        for backend in ("triton", "torch"):
            assert torch.equal(trees[backend], trees["reference"]), (backend, start, count)
    assert torch.equal(sum_tree_leaves(trees["torch"])[start : start + count], value)


@pytest.mark.needs_interpreter
def test_find_by_hand():
    tree = sum_tree_update_(sum_tree_zeros(4), torch.arange(4), torch.tensor([1.0, 0.0, 2.0, 1.0], dtype=torch.float64))
    fraction = torch.tensor([0.0, 0.2, 0.25, 0.74, 0.75, 0.99, 1.0], dtype=torch.float64)
    # Running sums 1, 1, 3, 4 of the total 4: [0, 1) -> 0, [1, 3) -> 2 (leaf 1 is empty), [3, 4] -> 3
    # (a fraction of exactly 1 reaches past the end: the last non-empty leaf).
    expected = torch.tensor([0, 0, 2, 2, 3, 3, 3])
    for backend in BACKENDS:
        index, leaf = sum_tree_find(tree, fraction, backend=backend)
        assert torch.equal(index, expected), backend
        assert torch.equal(leaf, torch.tensor([1.0, 1.0, 2.0, 2.0, 1.0, 1.0, 1.0], dtype=torch.float64))


@pytest.mark.needs_interpreter
@pytest.mark.parametrize("capacity", [1, 3, 63, 500, 3000], ids=lambda c: f"cap{c}")
def test_find_matches_reference(capacity):
    generator = torch.Generator().manual_seed(capacity)
    tree = sum_tree_zeros(capacity)
    for integer in (True, False):
        index, value = random_updates(capacity, max(1, capacity // 2), generator, integer)
        sum_tree_update_(tree, index, value, backend="reference")
        fraction = torch.cat([torch.tensor([0.0, 1.0, 1 - 2**-53]), torch.rand(300, generator=generator)])
        want = sum_tree_find(tree, fraction, backend="reference")
        for backend in ("triton", "torch"):
            got = sum_tree_find(tree, fraction, backend=backend)
            assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), (backend, integer)
        assert (want[1] > 0).all()


def member_updates(capacity, members, k, generator):
    """Per call `[S, k]` indices and values, each tree its own: repeats within a row, a zero now and then,
    the same index given different values in different rows."""
    index, value = zip(*(random_updates(capacity, k, generator) for _ in range(members)), strict=True)
    index, value = torch.stack(index), torch.stack(value)
    index[:, -2:] = index[:, :1]  # repeats: the first index twice more, with other values
    value[torch.rand(value.shape, generator=generator) < 0.2] = 0.0
    return index, value


@pytest.mark.needs_interpreter
@pytest.mark.parametrize(("capacity", "members"), [(3, 3), (63, 1), (1025, 3), (3000, 2)], ids=str)
def test_trees_of_members_are_each_members_tree_bit_for_bit(capacity, members):
    # S trees [S, numel]: every call gives each row what the same call gives that tree alone, on every backend,
    # and every backend builds the reference's trees: updates with repeats and zeros, runs written, finds.
    generator = torch.Generator().manual_seed(capacity)
    trees = {backend: sum_tree_zeros(capacity, members=members) for backend in BACKENDS}
    alone = {backend: [sum_tree_zeros(capacity) for _ in range(members)] for backend in BACKENDS}
    assert trees["torch"].shape == (members, sum_tree_layout(capacity).numel)
    for step in range(3):
        index, value = member_updates(capacity, members, 7 + 30 * step, generator)
        start, count = (capacity // 3 * step) % capacity, min(capacity, 40)
        run = torch.rand(members, min(count, capacity - start), dtype=torch.float64, generator=generator)
        fraction = torch.cat([torch.rand(members, 64, generator=generator), torch.ones(members, 1)], 1).double()
        for backend in BACKENDS:
            assert sum_tree_update_(trees[backend], index, value, backend=backend) is trees[backend]
            assert sum_tree_write_(trees[backend], start, run, backend=backend) is trees[backend]
            found = sum_tree_find(trees[backend], fraction, backend=backend)
            for m, tree in enumerate(alone[backend]):
                sum_tree_update_(tree, index[m], value[m], backend=backend)
                sum_tree_write_(tree, start, run[m], backend=backend)
                assert torch.equal(trees[backend][m], tree), (backend, step, m)
                one = sum_tree_find(tree, fraction[m], backend=backend)
                assert torch.equal(found[0][m], one[0]) and torch.equal(found[1][m], one[1]), (backend, step, m)
            assert found[0].shape == found[1].shape == fraction.shape and (found[1] > 0).all()
        for backend in ("triton", "torch"):
            assert torch.equal(trees[backend], trees["reference"]), (backend, step)
    assert torch.equal(sum_tree_leaves(trees["torch"])[-1], sum_tree_leaves(alone["torch"][-1]))


@pytest.mark.needs_interpreter
def test_trees_of_members_keep_their_own_maxima_and_never_find_their_zero_leaves():
    # Tree 0 takes leaf 2's largest of 1 and 5, tree 1 its largest of 7 and 3: no max across the trees. Each
    # tree's zero leaves (at other places) are never found, at any running-sum boundary of its own.
    index = torch.tensor([[2, 2, 0], [2, 2, 3]])
    value = torch.tensor([[1.0, 5.0, 3.0], [7.0, 3.0, 1.0]], dtype=torch.float64)
    for backend in BACKENDS:
        trees = sum_tree_update_(sum_tree_zeros(4, members=2), index, value, backend=backend)
        assert sum_tree_leaves(trees)[:, :4].tolist() == [[3.0, 0.0, 5.0, 0.0], [0.0, 0.0, 7.0, 1.0]], backend
        assert trees[:, -1].tolist() == [8.0, 8.0]
    capacity, members = 200, 3
    generator = torch.Generator().manual_seed(1)
    value = 10.0 ** torch.randint(-30, 30, (members, capacity), generator=generator).double()
    value[torch.rand(members, capacity, generator=generator) < 0.6] = 0.0
    value[0, -20:] = value[1, :20] = 0.0
    trees = sum_tree_update_(
        sum_tree_zeros(capacity, members=members), torch.arange(capacity).repeat(members, 1), value
    )
    boundary = value.cumsum(1) / trees[:, -1:]
    fraction = torch.cat([boundary, boundary.nextafter(torch.zeros(())), boundary.nextafter(torch.ones(()))], 1)
    fraction = torch.cat([fraction.clamp(0, 1), torch.tensor([[0.0, 1.0]] * members, dtype=torch.float64)], 1)
    for backend in BACKENDS:
        index, leaf = sum_tree_find(trees, fraction, backend=backend)
        assert (value.gather(1, index) > 0).all() and (leaf > 0).all(), backend


def naive_float32_find(leaves: list[float], fraction: float) -> int:
    """How a float32 tree that subtracts its way down finds a leaf, with no guard against empty subtrees."""
    level = torch.tensor(leaves, dtype=torch.float32)
    levels = [level]
    while level.numel() > 1:
        level = level.view(-1, 2).sum(1)
        levels.append(level)
    mass, node = torch.tensor(fraction, dtype=torch.float32) * levels[-1][0], 0
    for level in reversed(levels[:-1]):
        left = level[2 * node]
        node = 2 * node + int(mass >= left)
        mass = mass - left if mass >= left else mass
    return node


@pytest.mark.needs_interpreter
def test_zero_priority_is_never_found():
    # In float32, 1 + 0.75 ulp rounds the total up to 1 + 1 ulp: the mass at fraction 1 overshoots the
    # last non-empty leaf, and a plain float32 descent lands on the empty leaf 3.
    z = 0.75 * 2.0**-23
    leaves = [0.5, 0.5, z, 0.0]
    assert naive_float32_find(leaves, 1.0) == 3
    tree = sum_tree_update_(sum_tree_zeros(4), torch.arange(4), torch.tensor(leaves, dtype=torch.float64))
    near_one = torch.tensor([1.0, 1 - 2**-53, 1 - 2**-40, 1 - 2**-30], dtype=torch.float64)
    for backend in BACKENDS:
        assert torch.equal(sum_tree_find(tree, near_one, backend=backend)[0], torch.full((4,), 2)), backend
    # Priorities over 60 orders of magnitude between empty leaves; fractions at every running-sum boundary
    # and one ulp either side of it, plus 0 and 1.
    capacity = 200
    generator = torch.Generator().manual_seed(0)
    value = 10.0 ** torch.randint(-30, 30, (capacity,), generator=generator).double()
    value[torch.rand(capacity, generator=generator) < 0.6] = 0.0
    value[-20:] = 0.0
    tree = sum_tree_update_(sum_tree_zeros(capacity), torch.arange(capacity), value)
    boundary = value.cumsum(0) / tree[-1]
    fraction = torch.cat([boundary, boundary.nextafter(torch.zeros(())), boundary.nextafter(torch.ones(()))])
    fraction = torch.cat([fraction.clamp(0, 1), torch.tensor([0.0, 1.0], dtype=torch.float64)])
    for backend in BACKENDS:
        index, leaf = sum_tree_find(tree, fraction, backend=backend)
        assert (value[index] > 0).all() and (leaf > 0).all(), backend


@pytest.mark.needs_interpreter
def test_fractions_outside_the_unit_interval_are_clamped_to_it():
    # Fractions are not checked (that would read the device from the host): below 0, NaN and -inf find
    # what 0 finds, above 1 what 1 finds, never an empty or padding leaf nor an index outside the tree.
    leaves = torch.tensor([0.0, 2.0, 0.0, 1.0, 0.0], dtype=torch.float64)
    tree = sum_tree_update_(sum_tree_zeros(5), torch.arange(5), leaves)
    fraction = torch.tensor([-0.5, -math.inf, math.nan, 1.5, math.inf], dtype=torch.float64)
    for backend in BACKENDS:
        index, leaf = sum_tree_find(tree, fraction, backend=backend)
        assert index.tolist() == [1, 1, 1, 3, 3], backend
        assert leaf.tolist() == [2.0, 2.0, 2.0, 1.0, 1.0], backend


def test_found_frequencies_match_priorities_chi_square():
    capacity, draws = 50, 200_000
    generator = torch.Generator().manual_seed(0)
    value = torch.rand(capacity, dtype=torch.float64, generator=generator) * 4 + 0.1
    value[[3, 17, 40]] = 0.0
    tree = sum_tree_update_(sum_tree_zeros(capacity), torch.arange(capacity), value, backend="torch")
    index, _ = sum_tree_find(tree, torch.rand(draws, dtype=torch.float64, generator=generator), backend="torch")
    counts = torch.bincount(index, minlength=capacity).double()
    assert counts[[3, 17, 40]].sum() == 0
    positive = value > 0
    expected = draws * value[positive] / value.sum()
    chi_square = ((counts[positive] - expected) ** 2 / expected).sum().item()
    assert chi_square < chi_square_limit(int(positive.sum()) - 1), chi_square


@pytest.mark.needs_interpreter
@pytest.mark.parametrize(
    ("capacity", "members", "compiled"),
    [(3, None, False), (1025, None, False), (3, 2, False), (1025, 2, False), (3, None, True), (1025, 2, True)],
    ids=str,
)
def test_indices_out_of_range_are_skipped_by_every_backend(capacity, members, compiled):
    # Indices are not checked (that reads the device); the Triton kernels skipped those outside [0, L), but
    # the torch path raised on one tree after writing -inf into some leaves, and on trees of members wrote
    # into the next tree or into an inner row (a row's column 0, which must stay 0 for a find).
    num_leaves = sum_tree_layout(capacity).sizes[0]
    generator = torch.Generator().manual_seed(capacity)
    bad = torch.tensor([-1, num_leaves, num_leaves + 1, -(2**40), 2**40])
    index, value = random_updates(capacity, 7, generator)
    index, value = torch.cat([index[:3], bad, index[3:]]), torch.cat([value[:3], value[:5] + 1, value[3:]])
    if members is not None:  # tree 0 gets the indices out of range, tree 1 only the valid ones
        index = torch.stack([index, index[(index >= 0) & (index < num_leaves)].repeat(2)[: index.shape[0]]])
        value = value.expand(members, -1).contiguous()
    expected = sum_tree_zeros(capacity, members=members)
    valid = (index >= 0) & (index < num_leaves)
    for row in range(1 if members is None else members):  # the valid lanes alone, tree by tree
        one = expected if members is None else expected[row]
        lanes = valid if members is None else valid[row]
        sum_tree_update_(
            one,
            (index if members is None else index[row])[lanes],
            (value if members is None else value[row])[lanes],
            backend="reference",
        )
    torch._dynamo.reset()
    update = torch.compile(sum_tree_update_, dynamic=False) if compiled else sum_tree_update_
    for backend in ["torch"] if compiled else BACKENDS:
        tree = sum_tree_zeros(capacity, members=members)
        update(tree, index, value, backend=backend)
        assert torch.equal(tree, expected), backend


@pytest.mark.needs_interpreter
def test_empty_inputs():
    tree = sum_tree_zeros(8)
    empty = torch.zeros(0, dtype=torch.int64)
    for backend in BACKENDS:
        assert torch.equal(sum_tree_update_(tree, empty, empty.double(), backend=backend), sum_tree_zeros(8))
        index, leaf = sum_tree_find(tree, torch.zeros(0), backend=backend)
        assert index.shape == (0,) and leaf.shape == (0,)


def test_bad_inputs_are_clear_errors():
    tree = sum_tree_zeros(8)
    index, value = torch.tensor([1, 2]), torch.tensor([1.0, 2.0])
    with pytest.raises(ValueError, match=r"tree has shape \(65,\), dtype torch.float32; expected a contiguous float64"):
        sum_tree_update_(tree.float(), index, value)
    with pytest.raises(ValueError, match=r"expected a contiguous float64 tensor laid out as a sum tree"):
        sum_tree_find(torch.zeros(12, dtype=torch.float64), value)
    with pytest.raises(TypeError, match=r"index has dtype torch.float32; expected int64"):
        sum_tree_update_(tree, value, value)
    with pytest.raises(ValueError, match=r"value has shape \(3,\); expected a 1-d tensor \(2,\) like index"):
        sum_tree_update_(tree, index, torch.ones(3))
    with pytest.raises(TypeError, match=r"fraction has dtype torch.int64; expected floating point"):
        sum_tree_find(tree, index)
    with pytest.raises(ValueError, match=r"index is on meta, expected cpu like tree"):
        sum_tree_update_(tree, index.to("meta"), value)
    with pytest.raises(ValueError, match=r"leaves 31 \.\. 31 \+ 2 do not fit in the tree's 32 leaves"):
        sum_tree_write_(tree, 31, value)
    with pytest.raises(
        ValueError, match=r"start must be a Python int \(the first leaf written\), got Tensor tensor\(6\)"
    ):
        sum_tree_write_(tree, torch.tensor(6), value)
    with pytest.raises(ValueError, match=r"capacity must be a positive int, got 0"):
        sum_tree_zeros(0)
    trees = sum_tree_zeros(8, members=3)
    with pytest.raises(ValueError, match=r"index has shape \(2,\); expected a 2-d tensor \(3, k\): a row per tree"):
        sum_tree_update_(trees, index, value)
    with pytest.raises(ValueError, match=r"value has shape \(3, 3\); expected a 2-d tensor \(3, 2\): a row per tree"):
        sum_tree_update_(trees, index.repeat(3, 1), torch.ones(3, 3))
    with pytest.raises(ValueError, match=r"fraction has shape \(2, 2\); expected a 2-d tensor \(3, k\)"):
        sum_tree_find(trees, value.repeat(2, 1))
    with pytest.raises(ValueError, match=r"members must be a positive int or None, got 0"):
        sum_tree_zeros(8, members=0)
    with pytest.raises(ValueError, match=r"backend='cuda' is not one of"):
        sum_tree_find(tree, value, backend="cuda")


# Compile every kernel for an H100/H200 (sm_90) with Triton's bundled ptxas, which needs no GPU.
COMPILE_SM90 = r"""
import json
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from kernels import sum_tree as st

def compile_sm90(kernel, signature, constexprs, num_warps=4):
    source = ASTSource(kernel, {name: signature.get(name, "constexpr") for name in kernel.arg_names}, constexprs=constexprs)
    compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": num_warps})
    ptx = compiled.asm["ptx"]
    return {"local": ptx.count(".local"), "atomics": ptx.count("atom.global")}

i64, f64 = "*i64", "*fp64"
report = {
    "zero_leaves": compile_sm90(st._zero_leaves_kernel, {"tree_bits_ptr": i64, "index_ptr": i64, "k": "i32",
                                "lanes": "i32", "num_leaves": "i32", "numel": "i64"}, {"BLOCK": st.BLOCK}),
    "max_leaves": compile_sm90(st._max_leaves_kernel, {"tree_bits_ptr": i64, "index_ptr": i64, "value_ptr": f64,
                               "k": "i32", "lanes": "i32", "num_leaves": "i32", "numel": "i64"}, {"BLOCK": st.BLOCK}),
    "rebuild_rows": compile_sm90(st._rebuild_rows_kernel, {"tree_ptr": f64, "rows_ptr": i64, "num_rows": "i32",
                                 "lanes": "i32", "numel": "i64", "first_row": "i64", "last_row": "i64",
                                 "children_start": "i64", "child_stride": "i64", "rows_start": "i64", "width": "i64"},
                                 {"RUN": False, "BLOCK": st.ROW_BLOCK}),
    "rebuild_run": compile_sm90(st._rebuild_rows_kernel, {"tree_ptr": f64, "rows_ptr": f64, "num_rows": "i32",
                                "lanes": "i32", "numel": "i64", "first_row": "i64", "last_row": "i64",
                                "children_start": "i64", "child_stride": "i64", "rows_start": "i64", "width": "i64"},
                                {"RUN": True, "BLOCK": st.ROW_BLOCK}),
    "find": compile_sm90(st._find_kernel, {"tree_ptr": f64, "fraction_ptr": f64, "index_ptr": i64, "leaf_ptr": f64,
                         "rows_starts_ptr": i64, "k": "i32", "lanes": "i32", "numel": "i64", "depth": "i32",
                         "root_width": "i64"}, {"FANOUT": st.FANOUT, "BLOCK": st.BLOCK}),
}
print(json.dumps(report))
"""

PTXAS = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"


@pytest.mark.skipif(not PTXAS.exists(), reason="Triton's bundled ptxas is missing")
def test_kernels_compile_for_sm90_without_spills():
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    result = subprocess.run([sys.executable, "-c", COMPILE_SM90], env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert all(stats["local"] == 0 for stats in report.values()), report  # no register spills
    assert report["max_leaves"]["atomics"] > 0  # the leaves' max is a hardware atomic


@pytest.mark.gpu
@pytest.mark.parametrize("capacity", [3, 1000, 1_000_000], ids=lambda c: f"cap{c}")
def test_compiled_kernels_match_reference_on_cuda(capacity):
    generator = torch.Generator().manual_seed(0)
    trees = {"cpu": sum_tree_zeros(capacity), "cuda": sum_tree_zeros(capacity, "cuda")}
    torch_on_cuda = sum_tree_zeros(capacity, "cuda")  # the torch path, adding in order column by column
    for k in (capacity, 4096, 128):
        index, value = random_updates(capacity, k, generator)
        sum_tree_update_(trees["cpu"], index, value, backend="torch")
        sum_tree_update_(trees["cuda"], index.cuda(), value.cuda())
        sum_tree_update_(torch_on_cuda, index.cuda(), value.cuda(), backend="torch")
        start = int(index[0]) // 2
        run = torch.rand(min(k, capacity - start), dtype=torch.float64, generator=generator)
        sum_tree_write_(trees["cpu"], start, run, backend="torch")
        sum_tree_write_(trees["cuda"], start, run.cuda())
        sum_tree_write_(torch_on_cuda, start, run.cuda(), backend="torch")
        assert torch.equal(trees["cuda"].cpu(), trees["cpu"]) and torch.equal(torch_on_cuda.cpu(), trees["cpu"])
    fraction = torch.rand(4096, dtype=torch.float64, generator=generator)
    got = sum_tree_find(trees["cuda"], fraction.cuda())
    want = sum_tree_find(trees["cpu"], fraction, backend="reference" if capacity < 10_000 else "torch")
    assert torch.equal(got[0].cpu(), want[0]) and torch.equal(got[1].cpu(), want[1])


@pytest.mark.gpu
def test_compiled_kernels_on_trees_of_members_match_each_tree_on_cuda():
    # S trees on the GPU, one launch per kernel for all of them: each row the CPU torch path's tree alone.
    capacity, members, generator = 100_000, 3, torch.Generator().manual_seed(1)
    trees, alone = sum_tree_zeros(capacity, "cuda", members=members), [sum_tree_zeros(capacity) for _ in range(members)]
    for k in (4096, 128):
        index, value = member_updates(capacity, members, k, generator)
        run = torch.rand(members, 1000, dtype=torch.float64, generator=generator)
        sum_tree_update_(trees, index.cuda(), value.cuda())
        sum_tree_write_(trees, 500, run.cuda())
        for m, tree in enumerate(alone):
            sum_tree_update_(tree, index[m], value[m], backend="torch")
            sum_tree_write_(tree, 500, run[m], backend="torch")
        assert torch.equal(trees.cpu(), torch.stack(alone))
    fraction = torch.rand(members, 4096, dtype=torch.float64, generator=generator)
    got = sum_tree_find(trees, fraction.cuda())
    for m, tree in enumerate(alone):
        want = sum_tree_find(tree, fraction[m], backend="torch")
        assert torch.equal(got[0][m].cpu(), want[0]) and torch.equal(got[1][m].cpu(), want[1])

"""A replay buffer on the env's device: every group's transitions under one index, uniform or prioritized.

Storage is preallocated ring storage of `capacity` env steps. Per group (`[capacity, n, ...]`):
`observation`, `next_observation` (the true one, before any auto-reset), `action` (the policy's raw action),
`reward`, `terminated`, `done` (`[capacity, n]`, as `marl.core.rollout` stores them), `action_mask` where
the group has one, and `active` where its agents may leave mid-episode (`GroupSpec.agents_leave`); at the
root `state` and `next_state` where the env has a global state; with recurrent groups (`hidden`) their
`hidden` (the state each step was acted from) and the root's `is_init`, for chunks of consecutive steps of
one env (`draw_chunks`). Slot `i`
of every tensor is the same env step, so one sampled index gives every group's view of that step (MADDPG
and QMIX critics read the other agents' observations and actions).

    buffer = ReplayBuffer.for_env(env, capacity=1_000_000, prioritized=Prioritized(alpha=0.6, beta=0.4))
    buffer.extend(collector.collect())          # a [T, B] rollout: T * B env steps, time-major order
    batch = buffer.sample(256, generator)       # TensorDict [256]: groups, "index", "weight"
    buffer.update_priority(batch["index"], {g: td_error[g].abs() for g in groups})

An off-policy update draws an iteration's random numbers at once (`draw_ahead`), then each optimiser step
turns its row into slots and importance weights (`select`: a find in the sum tree as the previous step
left it) and sets their priorities (`reduce_priority`, `set_priority_`) inside its compiled graph: these
three do no checks, so they trace; `draw`, `sample` and `update_priority` check their arguments first.

Nothing in `extend`, `sample` or `update_priority` reads a device value on the host, and none of them loops
over envs, agents or steps: the write position and fill count are device tensors (`position`, `size`), and
a host mirror of the fill count (`len(buffer)`), known from the shapes alone, serves the argument checks.
Value checks (priorities negative, NaN or infinite; indices out of range) do read the device, so they run
only with `check_values=True`, as for envs.

Prioritized sampling (Schaul et al. 2016): priorities `p = (priority + eps) ** alpha` live in a float64
sum tree (`kernels.sum_tree`); a batch of `k` is drawn stratified, one draw in each `k`-th of the total;
the importance weight of draw `i` is `w_i = (N * P(i)) ** -beta / max_j (N * P(j)) ** -beta` over the
batch's draws `j` (so at most 1); new items enter at the largest priority given so far (1 before any).
An index repeated in one `update_priority` call keeps the largest of its priorities (not the last one
written: that order is not kept on a GPU).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

import torch
from tensordict import TensorDict, TensorDictBase

from envs import cudagraphs
from envs.base import canonical_device, check_is_env
from envs.specs import Box, GroupSpec
from kernels._common import BACKENDS
from kernels.sum_tree import (
    sum_tree_find,
    sum_tree_leaves,
    sum_tree_nbytes,
    sum_tree_update_,
    sum_tree_write_,
    sum_tree_zeros,
)
from marl.core.masking import masked_mean
from marl.core.rollout import transition_layout

Key = tuple[str, ...]


@dataclass(frozen=True)
class Prioritized:
    """Proportional prioritized replay."""

    alpha: float = 0.6
    """How strongly priorities shape the draws: `P(i) ~ (priority_i + eps) ** alpha`; 0 is uniform."""
    beta: float = 0.4
    """Importance-weight exponent: 1 fully corrects the bias of prioritized draws, 0 not at all."""
    eps: float = 1e-8
    """Added to every priority, so an item whose TD error is 0 can still be drawn (must be > 0)."""
    reduce: Literal["max", "mean"] = "max"
    """How a priority per agent (a group's `[k, n]`, or several groups') becomes one per env step."""

    def __post_init__(self) -> None:
        # alpha = inf would make every leaf 0 or inf, and the tree's total inf or NaN.
        for name, value, high in (("alpha", self.alpha, math.inf), ("beta", self.beta, 1.0)):
            if (
                isinstance(value, bool)
                or not isinstance(value, (int, float))
                or not 0.0 <= value <= high
                or math.isinf(value)
            ):
                expected = "a finite float >= 0.0" if high == math.inf else f"a float in [0.0, {high}]"
                raise ValueError(f"Prioritized: {name} = {value!r}, expected {expected}")
        if isinstance(self.eps, bool) or not isinstance(self.eps, (int, float)) or not 0.0 < self.eps < math.inf:
            raise ValueError(f"Prioritized: eps = {self.eps!r}, expected a float > 0")
        if self.reduce not in ("max", "mean"):
            raise ValueError(f"Prioritized: reduce = {self.reduce!r}, expected 'max' or 'mean'")


def replay_nbytes(
    groups: Mapping[str, GroupSpec],
    capacity: int,
    state_spec: Box | None = None,
    prioritized: bool = False,
    hidden: Mapping[str, tuple[int, int]] | None = None,
) -> int:
    """Bytes a `ReplayBuffer` of these specs and `capacity` allocates (storage, and the sum tree when
    prioritized), computed before allocating anything."""
    layout = transition_layout(groups, state_spec, hidden=hidden)
    per_step = sum(math.prod(shape) * _itemsize(dtype) for shape, dtype in layout.values())
    return capacity * per_step + (sum_tree_nbytes(capacity) if prioritized else 0)


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def free_bytes(device: torch.device) -> int | None:
    """Memory free for a new allocation on `device` (the CPU: the kernel's MemAvailable), or None if unknown."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    if device.type == "cpu":
        try:
            with open("/proc/meminfo") as meminfo:
                line = next(line for line in meminfo if line.startswith("MemAvailable:"))
            return int(line.split()[1]) * 1024
        except (OSError, StopIteration, ValueError):
            try:
                return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
            except (ValueError, OSError, AttributeError):
                return None
    return None


def format_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    raise AssertionError


def gather(storage: Mapping[Key, torch.Tensor], index: torch.Tensor) -> dict:
    """A buffer's `storage` (`{key: [capacity, ...]}`) at the slots `index` `[k]`: `{group: {name: [k, ...]}}`
    and the root keys. Traceable: an algorithm's compiled step gathers its batch with it."""
    out: dict = {}
    for key, tensor in storage.items():
        where = out.setdefault(key[0], {}) if len(key) == 2 else out
        where[key[-1]] = tensor.index_select(0, index)
    return out


def _shape(shape) -> str:
    return str(tuple(shape))


class ReplayBuffer:
    """Ring storage of every group's transitions on one device; see the module docstring.

    Args:
        groups: group name -> spec (`env.groups`; a `GroupedEnv`'s for another group map).
        capacity: how many env steps it keeps; the oldest are overwritten first.
        device: where the storage lives (the env's device).
        state_spec: the env's global state spec, if it has one (`env.state_spec`).
        prioritized: `Prioritized(...)` for prioritized sampling; None for uniform.
        check_values: also check the values of `update_priority`'s arguments (non-negative, finite
            priorities; indices of stored items). That reads the device from the host: a sync per call.
        backend: the sum tree's implementation (`kernels.sum_tree`): `"auto"`, `"triton"`, `"torch"`.
        hidden: recurrent groups -> the shape `(n, h)` of one env step's hidden state (`Acting.hidden`):
            their `hidden` (the state each step was acted from) and the root's `is_init` are stored too,
            for training on chunks of consecutive steps (`draw_chunks`).

    Raises `MemoryError` before allocating when `nbytes` exceeds the memory free on `device`.
    """

    def __init__(
        self,
        groups: Mapping[str, GroupSpec],
        capacity: int,
        device: torch.device | str = "cpu",
        *,
        state_spec: Box | None = None,
        prioritized: Prioritized | None = None,
        check_values: bool = False,
        backend: str = "auto",
        hidden: Mapping[str, tuple[int, int]] | None = None,
    ) -> None:
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
            raise ValueError(f"ReplayBuffer: capacity must be a positive int, got {capacity!r}")
        if prioritized is not None and not isinstance(prioritized, Prioritized):
            raise TypeError(f"ReplayBuffer: prioritized must be a Prioritized(...) or None, got {prioritized!r}")
        if not isinstance(groups, Mapping):
            raise TypeError(f"ReplayBuffer: groups must be a mapping group -> GroupSpec (env.groups), got {groups!r}")
        if not isinstance(check_values, bool):  # "no" would be truthy
            raise TypeError(f"ReplayBuffer: check_values must be True or False, got {check_values!r}")
        if backend not in BACKENDS:
            raise ValueError(f"ReplayBuffer: backend={backend!r} is not one of {', '.join(map(repr, BACKENDS))}")
        self.groups = dict(groups)
        self.capacity = capacity
        self.device = canonical_device(device)  # a bare "cuda" is cuda:<current>, as its tensors report it
        self.state_spec = state_spec
        self.prioritized = prioritized
        self.check_values = check_values
        self.backend = backend
        self.hidden = dict(hidden or {})
        for group, shape in self.hidden.items():
            n = self.groups[group].n_agents if group in self.groups else None
            if n is None or not isinstance(shape, (tuple, list)) or len(shape) != 2 or shape[0] != n:
                raise ValueError(
                    f"ReplayBuffer: hidden[{group!r}] = {shape!r}; expected a group of {list(self.groups)} with the "
                    f"shape (n_agents, h) of one env step's hidden state" + (f", here ({n}, h)" if n else "")
                )
        self.layout = transition_layout(self.groups, state_spec, hidden=self.hidden)
        # Prioritized: one sum tree over the slots, or one per member of `members` (each over its own ring).
        trees = self.members or 1
        self._tree_nbytes = trees * sum_tree_nbytes(capacity // trees) if prioritized else 0
        self.nbytes = replay_nbytes(self.groups, capacity, state_spec, False, self.hidden) + self._tree_nbytes
        self._check_fits()
        try:
            self.storage = {
                key: torch.zeros((capacity, *shape), dtype=dtype, device=self.device)
                for key, (shape, dtype) in self.layout.items()
            }
            self.tree = sum_tree_zeros(capacity // trees, self.device, self.members) if prioritized else None
        except torch.OutOfMemoryError as error:
            raise MemoryError(self._too_large(free_bytes(self.device))) from error
        self.position = torch.zeros((), dtype=torch.int64, device=self.device)  # next slot written
        self.size = torch.zeros((), dtype=torch.int64, device=self.device)  # slots filled: [0, size)
        # The largest priority given so far (before alpha): `[]`, or `[S]` one per member.
        lead = () if self.members is None else (trees,)
        self.max_priority = torch.ones(lead, dtype=torch.float64, device=self.device)
        # An off-policy step finds slots in the tree and updates it inside its CUDA graph: the replays must
        # read and write these very tensors (the storage too, read there, rather than copied in per replay).
        cudagraphs.mark_static((*self.storage.values(), self.max_priority), self.device)
        if self.tree is not None:
            cudagraphs.mark_static((self.tree,), self.device)
        self._count = 0  # host mirror of `size`, from the shapes extended
        self._position = 0  # host mirror of `position`: extend writes slices
        self._aranges: dict[int, torch.Tensor] = {}

    @classmethod
    def for_env(cls, env, capacity: int, **options) -> ReplayBuffer:
        """A buffer for `env`'s groups, global state and device."""
        check_is_env(env, "ReplayBuffer.for_env")
        return cls(env.groups, capacity, env.device, state_spec=env.state_spec, **options)

    def __len__(self) -> int:
        return self._count

    def __repr__(self) -> str:
        kind = f"prioritized {self.prioritized}" if self.prioritized else "uniform"
        return (
            f"ReplayBuffer({len(self)}/{self.capacity} env steps, groups {list(self.groups)}, {kind}, "
            f"{format_bytes(self.nbytes)} on {self.device})"
        )

    # ---- memory ----------------------------------------------------------------------------------

    def _too_large(self, free: int | None) -> str:
        per_step = (self.nbytes - self._tree_nbytes) / self.capacity
        fits = "" if free is None else f"; at most about {int(free // max(per_step, 1)):,} env steps would fit"
        where = "unknown" if free is None else format_bytes(free)
        return (
            f"replay buffer of capacity {self.capacity:,} needs {format_bytes(self.nbytes)} "
            f"({per_step:.0f} bytes per env step over groups {list(self.groups)}) but {where} is free on "
            f"{self.device}: lower the capacity{fits}"
        )

    def _check_fits(self) -> None:
        free = free_bytes(self.device)
        if free is not None and self.nbytes > free:
            raise MemoryError(self._too_large(free))

    # ---- extend ----------------------------------------------------------------------------------

    @torch.no_grad()
    def extend(self, data: TensorDictBase) -> None:
        """Append every env step of `data`: a rollout `[T, B]` (or any batch dims, flattened in row-major,
        i.e. time-major, order). Where it holds more than `capacity` steps only the last `capacity` are
        kept. Keys not in the layout (e.g. `log_prob`) are not stored."""
        tensors, batch = self._check_extend(data)
        num_steps = math.prod(batch)
        self._write({key: value.reshape(num_steps, *value.shape[len(batch) :]) for key, value in tensors.items()})

    slot_dim = 0  # the slots' dim in `_slotted` storage (a member dim before it: `MemberReplayBuffer`)
    members: int | None = None  # `MemberReplayBuffer`'s count: its trees `[S, numel]`, `max_priority` `[S]`

    def _slotted(self, tensor: torch.Tensor) -> torch.Tensor:
        """A storage tensor as `_write` and the checkpoints index it: `[capacity, ...]` here."""
        return tensor

    def _write(self, steps: dict[Key, torch.Tensor]) -> None:
        """Write `steps` (per key `[*lead, num_steps, ...]`, the slots' dim at `slot_dim`) at the write
        position, in a ring."""
        num_steps = next(iter(steps.values())).shape[self.slot_dim]
        if num_steps == 0:
            return
        skipped = max(0, num_steps - self.capacity)  # steps overwritten within this same call
        kept = num_steps - skipped
        # The kept steps fill slots start.. in a ring: at most two contiguous runs, written by slices.
        start = (self._position + skipped) % self.capacity
        first = min(kept, self.capacity - start)
        runs = [(start, 0, first)] + ([(0, first, kept)] if kept > first else [])
        d = self.slot_dim
        for key, value in steps.items():
            held = self._slotted(self.storage[key])
            for slot, begin, end in runs:
                held.narrow(d, slot, end - begin).copy_(value.narrow(d, skipped + begin, end - begin))
        if self.tree is not None:
            leaf = self.max_priority.pow(self.prioritized.alpha).unsqueeze(-1).expand(*self.max_priority.shape, kept)
            for slot, begin, end in runs:
                sum_tree_write_(self.tree, slot, leaf[..., : end - begin], backend=self.backend)
        self.position.add_(num_steps).remainder_(self.capacity)
        self.size.add_(num_steps).clamp_(max=self.capacity)
        self._position = (self._position + num_steps) % self.capacity
        self._count = min(self._count + num_steps, self.capacity)

    def _arange(self, n: int) -> torch.Tensor:
        arange = self._aranges.get(n)
        if arange is None:
            arange = self._aranges[n] = torch.arange(n, device=self.device)
        return arange

    def _check_extend(self, data: TensorDictBase) -> tuple[dict[Key, torch.Tensor], tuple[int, ...]]:
        if not isinstance(data, TensorDictBase):
            raise TypeError(
                f"extend takes the TensorDict [T, B] that marl.core.rollout collects, got {type(data).__name__}"
            )
        batch = tuple(data.batch_size)
        if not batch:
            raise ValueError("extend: data has batch_size []; expected [T, B] (or [N]) env steps")
        present = set(data.keys(include_nested=True, leaves_only=True))
        tensors = {}
        for key, (shape, dtype) in self.layout.items():
            where = f"group {key[0]!r}, key {key[1]!r}" if len(key) == 2 else f"key {key[0]!r} (env state)"
            expected = (*batch, *shape)
            if (key if len(key) > 1 else key[0]) not in present:
                got = sorted("/".join(k) if isinstance(k, tuple) else k for k in present)
                raise KeyError(
                    f"extend: {where} is missing from the data; expected a tensor of shape {_shape(expected)} "
                    f"and dtype {dtype} (got keys {got})"
                )
            value = data.get(key if len(key) > 1 else key[0])
            if tuple(value.shape) != expected:
                raise ValueError(
                    f"extend: {where} has shape {_shape(value.shape)}, expected {_shape(expected)} "
                    f"(batch {list(batch)} + {_shape(shape)} per env step)"
                )
            if value.dtype != dtype:
                raise TypeError(f"extend: {where} has dtype {value.dtype}, expected {dtype} (shape {_shape(expected)})")
            if value.device != self.device:
                raise ValueError(
                    f"extend: {where} is on {value.device}, expected {self.device} like the buffer "
                    f"(shape {_shape(expected)})"
                )
            tensors[key] = value
        return tensors, batch

    # ---- sample ----------------------------------------------------------------------------------

    @torch.no_grad()
    def sample(
        self, batch_size: int, generator: torch.Generator | None = None, beta: float | None = None
    ) -> TensorDict:
        """Draw `batch_size` stored env steps, with replacement: uniformly, or by priority.

        Returns a TensorDict `[batch_size]` on the buffer's device with every group's keys (as stored),
        `state`/`next_state` where the env has them, `"index"` (int64, the slots drawn, for
        `update_priority`) and, when prioritized, `"weight"` (float32 importance weights, at most 1, with
        the exponent `beta`, by default `prioritized.beta`: an algorithm anneals it).
        """
        index, weight = self.draw(batch_size, generator, beta)
        out = self.gather(index)
        if weight is not None:
            out["weight"] = weight
        out["index"] = index
        return TensorDict(out, batch_size=[batch_size], device=self.device)

    @torch.no_grad()
    def draw(
        self, batch_size: int, generator: torch.Generator | None = None, beta: float | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """`sample`'s draw alone: the slots `[batch_size]` and the importance weights (None when uniform):
        `select` of one row of `draw_ahead`."""
        # Checked on a uniform buffer too (where it is unused), so a wrong beta fails before prioritizing.
        if beta is not None and (
            isinstance(beta, bool) or not isinstance(beta, (int, float)) or not 0.0 <= beta <= 1.0
        ):
            raise ValueError(f"sample: beta = {beta!r}, expected a float in [0, 1]")
        if self.tree is not None and beta is None:
            beta = self.prioritized.beta
        return self.select(self.draw_ahead(1, batch_size, generator)[0], beta)

    @torch.no_grad()
    def draw_ahead(self, steps: int, batch_size: int, generator: torch.Generator | None = None) -> torch.Tensor:
        """The random numbers of `steps` draws of `batch_size` env steps each, at once (an off-policy
        update's, one per optimiser step; `select` turns row `t` into step `t`'s slots inside its
        compiled step): uniform, the slots themselves `[steps, batch_size]` int64; prioritized, the
        stratified fractions `[steps, batch_size]` float64 (draw `i` in the `i`-th of `batch_size` equal
        slices of the total priority), which find slots in the tree as it is when `select` runs."""
        return self._stratified(self._draw_random(steps, batch_size, generator))

    def _draw_random(self, steps: int, batch_size: int, generator: torch.Generator | None) -> torch.Tensor:
        """`draw_ahead`'s random numbers alone, after its checks: uniform, the slots; prioritized, uniform
        numbers in `[0, 1)` for `_stratified` (a population draws them from each member's generator)."""
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise ValueError(f"sample: steps must be a positive int, got {steps!r}")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"sample: batch_size must be a positive int, got {batch_size!r}")
        if batch_size > self._count:
            raise ValueError(
                f"sample: batch_size {batch_size} is larger than the {self._count} env steps stored "
                f"(capacity {self.capacity}); extend the buffer first, or draw fewer"
            )
        self._check_generator("sample", generator)
        if self.tree is None:
            return torch.randint(self._count, (steps, batch_size), generator=generator, device=self.device)
        return torch.rand(steps, batch_size, dtype=torch.float64, generator=generator, device=self.device)

    def _check_generator(self, where: str, generator) -> None:
        if generator is None:
            return
        if not isinstance(generator, torch.Generator):
            raise TypeError(
                f"{where}: generator must be a torch.Generator on {self.device} (or None), "
                f"got {type(generator).__name__} {generator!r}"
            )
        if torch.device(generator.device).type != self.device.type:
            raise ValueError(f"{where}: the generator is on {generator.device}, expected {self.device} like the buffer")

    def _stratified(self, drawn: torch.Tensor) -> torch.Tensor:
        """`_draw_random`'s numbers `[..., batch_size]` as `draw_ahead`'s: prioritized, draw `i` moved into the
        `i`-th of `batch_size` equal slices of `[0, 1]`, in place; uniform, the slots as they are."""
        if self.tree is None:
            return drawn
        batch_size = drawn.shape[-1]
        return drawn.add_(self._arange(batch_size)).div_(batch_size)

    def select(
        self, drawn: torch.Tensor, beta: float | torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One draw's slots `[k]` and importance weights `[k]` float32 (None when uniform) from its row
        `drawn` `[k]` of `draw_ahead` (or `[length, count]` chunk slots, uniform: returned as they are),
        with the exponent `beta` (a float, or a 0-d tensor that changes without recompiling; None:
        `prioritized.beta`). No checks (`draw` checks): traceable, an off-policy step runs it in its graph.
        A population's (`members`): each member's `[S, k]` from its own row of `drawn` `[S, k]`, in its own
        tree, its weights normalised over its own draws."""
        if self.tree is None:
            return drawn, None
        index, leaf = sum_tree_find(self.tree, drawn, backend=self.backend)
        # (N P_i)^-beta / max_j (N P_j)^-beta = (min_j p_j / p_i)^beta: N and the total cancel.
        beta = self.prioritized.beta if beta is None else beta
        return index, leaf.amin(-1, keepdim=True).div(leaf).pow(beta).float()

    @torch.no_grad()
    def draw_chunks(
        self, count: int, length: int, stride: int, generator: torch.Generator | None = None
    ) -> torch.Tensor:
        """`count` chunks of `length` consecutive steps of one env each, drawn uniformly with replacement
        over the chunks the buffer holds whole: their slots `[length, count]` (row j: every chunk's step j).

        The buffer is extended with time-major `[T, stride]` batches of the same `stride` envs, so an env's
        next step sits `stride` slots after its step (modulo the capacity), and a chunk that starts at slot
        `s` is `s, s + stride, ..., s + (length - 1) * stride`. A chunk is whole when its last step is
        stored: its start is one of the `len(self) - (length - 1) * stride` oldest stored steps, so no chunk
        runs past the write position into older, overwritten, steps. Uniform only: a prioritized buffer
        keeps priorities per step, not per chunk."""
        return self.chunk_slots(self._chunk_starts(count, length, stride, generator), length, stride)

    def _chunk_starts(self, count: int, length: int, stride: int, generator: torch.Generator | None) -> torch.Tensor:
        """`draw_chunks`' random draw: `count` chunks' first steps `[count]`, counted from the oldest stored step."""
        for name, value in (("count", count), ("length", length), ("stride", stride)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"draw_chunks: {name} must be a positive int, got {value!r}")
        if self.tree is not None:
            raise ValueError(
                "draw_chunks: chunks are drawn uniformly; this buffer is prioritized (priorities per step)"
            )
        span = (length - 1) * stride + 1  # slots from a chunk's first step to its last
        starts = self._count - span + 1  # chunks held whole
        if starts < 1:
            raise ValueError(
                f"draw_chunks: a chunk of {length} steps of one env spans {span} slots ({stride} envs per step), "
                f"more than the {self._count} env steps stored (capacity {self.capacity}); extend the buffer "
                "first, or draw shorter chunks"
            )
        self._check_generator("draw_chunks", generator)
        return torch.randint(starts, (count,), generator=generator, device=self.device)

    def chunk_slots(self, start: torch.Tensor, length: int, stride: int) -> torch.Tensor:
        """The slots of chunks of `length` steps, `stride` slots apart, whose first steps are `start` `[..., count]`
        (counted from the oldest stored step): `[..., length, count]`."""
        oldest = self.position - self.size  # the oldest stored step's slot, before the modulo
        offsets = self._arange(length).mul(stride).unsqueeze(-1)  # [length, 1]
        return (offsets + (start + oldest).unsqueeze(-2)).remainder_(self.capacity)

    def gather(self, index: torch.Tensor) -> dict:
        """The stored env steps `index` (`[k]`, from `draw`): `{group: {key: [k, ...]}}` and the root keys."""
        return gather(self.storage, index)

    # ---- priorities ------------------------------------------------------------------------------

    @torch.no_grad()
    def update_priority(
        self, index: torch.Tensor, priority: torch.Tensor | Mapping[str, torch.Tensor] | TensorDictBase
    ) -> None:
        """Set the priorities of the stored env steps `index` (from `sample`'s `"index"`).

        `priority` is non-negative (e.g. `|TD error|`): a tensor `[k]` (one per env step), `[k, n]` or
        `[k, n, 1]` (per agent), or a mapping group -> `[k, n]` / `[k, n, 1]` for any of the groups; agents
        (of all groups given) are reduced to one priority per env step by `prioritized.reduce`. An index
        repeated within a call keeps the largest of its priorities.
        """
        if self.tree is None:
            raise RuntimeError(
                "update_priority: this buffer samples uniformly; build it with prioritized=Prioritized()"
            )
        self._check_priority(index, priority)
        if index.shape[0] == 0:  # nothing to set (and no agents' columns to reduce)
            return
        reduced = self.reduce_priority(priority)
        if self.check_values:
            self._check_priority_values(index, reduced)
        self.set_priority_(index, reduced)

    def reduce_priority(
        self,
        priority: torch.Tensor | Mapping[str, torch.Tensor] | TensorDictBase,
        active: Mapping[str, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """`update_priority`'s `priority` as one priority per env step `[k]`: the agents (of every group
        given) reduced by `prioritized.reduce`. `active`: for groups of `priority` whose agents may leave, which
        acted at each step (`[k, n]` bool, as stored); the others' priorities are left out, so a mean is
        over the agents that acted (0 where none did). No checks: traceable."""
        groups = [None] if isinstance(priority, torch.Tensor) else list(priority.keys())
        values = [priority if g is None else priority[g] for g in groups]
        columns = [value.reshape(value.shape[0], -1) for value in values]  # [k, agents] each
        if active:  # [k, agents] each: every agent of a group whose agents end together acts
            acted = [
                active[g].reshape(c.shape) if g in active else torch.ones_like(c, dtype=torch.bool)
                for g, c in zip(groups, columns)
            ]
            columns = [torch.where(a, c, 0.0) for a, c in zip(acted, columns)]
        if len(columns) == 1 and columns[0].shape[1] == 1:
            return columns[0][:, 0]
        stacked = columns[0] if len(columns) == 1 else torch.cat(columns, dim=1)  # [k, agents of all groups]
        if self.prioritized.reduce == "max":  # priorities are >= 0: the zeros of agents out change no max
            return stacked.amax(1)
        return masked_mean(stacked, torch.cat(acted, dim=1) if active else None, dim=1)

    def set_priority_(self, index: torch.Tensor, reduced: torch.Tensor) -> None:
        """Set the priorities of slots `index` `[k]` to `reduced` `[k]` (`reduce_priority`'s), in place: the
        sum tree and the largest priority given. No checks: traceable, an off-policy step runs it in its
        graph (the tree and `max_priority` are static there: `mark_static`). A population's (`members`):
        `[S, k]`, each member's in its own tree and its own largest priority."""
        p = reduced.double() + self.prioritized.eps  # [k] ([S, k])
        # Written through a [1] view: Inductor (torch 2.13, CPU) drops in-place writes to a 0-d float64 tensor.
        self.max_priority.view(-1).copy_(torch.maximum(self.max_priority, p.amax(-1)).view(-1))
        sum_tree_update_(self.tree, index, p.pow(self.prioritized.alpha), backend=self.backend)

    def _check_priority(self, index, priority) -> None:
        if not isinstance(index, torch.Tensor):
            raise TypeError(
                f"update_priority: index must be a torch.Tensor (sample's 'index'), got {type(index).__name__}"
            )
        if index.dim() != 1 or index.dtype not in (torch.int64, torch.int32):
            raise ValueError(
                f"update_priority: index has shape {_shape(index.shape)} and dtype {index.dtype}; expected int64 (k,)"
            )
        if index.device != self.device:
            raise ValueError(f"update_priority: index is on {index.device}, expected {self.device} like the buffer")
        k = index.shape[0]
        if isinstance(priority, torch.Tensor):
            per_group = {None: priority}
        elif isinstance(priority, (Mapping, TensorDictBase)):
            per_group = {g: priority[g] for g in priority.keys()}
            if not per_group:
                raise ValueError("update_priority: priority is an empty mapping; give at least one group")
        else:
            raise TypeError(
                f"update_priority: priority must be a tensor or a mapping group -> tensor, got {type(priority).__name__}"
            )
        agents = [spec.n_agents for spec in self.groups.values()]
        for g, value in per_group.items():
            where = "priority" if g is None else f"priority of group {g!r}"
            if g is not None and g not in self.groups:
                raise KeyError(f"update_priority: group {g!r} is not in the buffer; its groups: {list(self.groups)}")
            if not isinstance(value, torch.Tensor):
                raise TypeError(f"update_priority: {where} must be a tensor, got {type(value).__name__}")
            if g is None:  # a bare tensor's agents: one (a team's), a group's, or every group's together
                counts = {1, *agents, sum(agents)}
                expected = f"({k},), ({k}, n) or ({k}, n, 1) with n in {sorted(counts)} (a group's agents, or all)"
            else:
                counts = {self.groups[g].n_agents}
                expected = f"({k}, {self.groups[g].n_agents}) or ({k}, {self.groups[g].n_agents}, 1)"
            shape = tuple(value.shape)
            fits = shape[:1] == (k,) and (
                (len(shape) == 1 and g is None)
                or (len(shape) == 2 and shape[1] in counts)
                or (len(shape) == 3 and shape[1] in counts and shape[2] == 1)
            )
            if not fits:
                raise ValueError(
                    f"update_priority: {where} has shape {_shape(shape)}, expected {expected} for {k} indices"
                )
            if not value.is_floating_point():
                raise TypeError(f"update_priority: {where} has dtype {value.dtype}, expected floating point")
            if value.device != self.device:
                raise ValueError(
                    f"update_priority: {where} is on {value.device}, expected {self.device} like the buffer"
                )

    def _check_priority_values(self, index: torch.Tensor, reduced: torch.Tensor) -> None:
        # One host read for all checks (check_values=True only).
        low, high, bad = (
            torch.stack([index.min(), index.max(), (~torch.isfinite(reduced) | (reduced < 0)).sum()]).tolist()
            if index.numel()
            else (0, 0, 0)
        )
        if index.numel() and (low < 0 or high >= self._count):
            raise IndexError(
                f"update_priority: index holds {low if low < 0 else high}, expected slots in [0, {self._count}) "
                f"(the {self._count} env steps stored)"
            )
        if bad:
            raise ValueError(
                f"update_priority: {bad} of {reduced.numel()} priorities are negative, NaN or infinite; expected "
                "finite values >= 0 (e.g. |TD error|)"
            )

    # ---- checkpoints -----------------------------------------------------------------------------

    def state_dict(self) -> dict:
        """The buffer's content (the filled slots only) and its counters, for a checkpoint; the tree is
        saved as its leaves, from which `load_state_dict` rebuilds the very same tree."""
        count = self._count
        state = {
            "capacity": self.capacity,
            "count": count,
            "position": self.position.clone(),
            "size": self.size.clone(),
            "layout": {"/".join(key): (list(shape), str(dtype)) for key, (shape, dtype) in self.layout.items()},
            "storage": {
                "/".join(key): self._slotted(value).narrow(self.slot_dim, 0, count).clone()
                for key, value in self.storage.items()
            },
        }
        if self.tree is not None:
            state["leaves"] = sum_tree_leaves(self.tree)[..., :count].clone()
            state["max_priority"] = self.max_priority.clone()
            state["alpha"], state["eps"] = self.prioritized.alpha, self.prioritized.eps  # the leaves' formula
        return state

    def load_state_dict(self, state: Mapping) -> None:
        """Restore `state_dict()` of a buffer of the same layout and capacity (a checkpoint's tensors may
        be on the CPU: they are moved to this device)."""
        layout = {"/".join(key): (list(shape), str(dtype)) for key, (shape, dtype) in self.layout.items()}
        if state.get("capacity") != self.capacity or state.get("layout") != layout:
            raise ValueError(
                f"load_state_dict: the saved buffer (capacity {state.get('capacity')}, layout {state.get('layout')}) "
                f"does not match this one (capacity {self.capacity}, layout {layout})"
            )
        if ("leaves" in state) != (self.tree is not None):
            saved, this = (
                ("prioritized" if "leaves" in state else "uniform"),
                ("prioritized" if self.tree is not None else "uniform"),
            )
            raise ValueError(f"load_state_dict: the saved buffer is {saved}, this one is {this}")
        # The leaves are (priority + eps) ** alpha; a state saved without alpha (before it was) is taken as is.
        if self.tree is not None and "alpha" in state:
            saved, this = (state["alpha"], state["eps"]), (self.prioritized.alpha, self.prioritized.eps)
            if saved != this:
                raise ValueError(
                    "load_state_dict: the saved buffer's priorities are (priority + {1}) ** {0}, this one's "
                    "(priority + {3}) ** {2}: build it with Prioritized(alpha={0}, eps={1})".format(*saved, *this)
                )
        count = int(state["count"])
        for name, value in state["storage"].items():
            storage = self._slotted(self.storage[tuple(name.split("/"))])
            storage.narrow(self.slot_dim, 0, count).copy_(value)
            storage.narrow(self.slot_dim, count, self.capacity - count).zero_()
        self.position.copy_(state["position"])
        self.size.copy_(state["size"])
        self._count = count
        self._position = int(state["position"])  # one host read, on loading only
        if self.tree is not None:
            self.tree.zero_()
            sum_tree_write_(self.tree, 0, state["leaves"].to(self.device, torch.float64), backend=self.backend)
            self.max_priority.copy_(state["max_priority"])

    @torch.no_grad()
    def truncate_last_steps(self, num_envs: int) -> None:
        """Mark the last stored step of each of the `num_envs` envs (of each member) `done`, not terminated: their
        episodes end there, truncated. A run resumed with an env that cannot save its state starts new episodes,
        whose steps follow these in the ring; n-step returns would otherwise sum rewards across the two."""
        if self._count == 0:
            return
        last = (self._position - 1 - self._arange(min(num_envs, self._count))).remainder(self.capacity)  # [B]
        for key, value in self.storage.items():
            if len(key) == 2 and key[1] == "done":  # each group's
                self._slotted(value).index_fill_(self.slot_dim, last, True)

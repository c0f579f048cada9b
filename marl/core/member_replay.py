"""The replay buffers of several runs trained in one process (`marl train --seeds`, `marl.core.members`).

Member `k`'s buffer is a ring of `capacity` env steps that holds only its own envs' steps (columns
`k * B .. (k + 1) * B` of every `[T, S * B]` batch), in the order a single run's buffer holds them (time-major,
slot `t * B + j` for its env `j` at step `t`), so that a draw of the same slots gives the same steps. All
members' rings live in one storage `[S * capacity, ...]`, viewed `[S, capacity, ...]` (`member_storage`), which
a vmapped loss reads as each member's `[capacity, ...]`. Every member writes as many steps per batch, so one
write position and one fill count serve them all. Each member draws from its own generator: uniformly, or
with `prioritized` by priority from its own sum tree (the trees `[S, numel]`, row k member k's, exactly a
single run's: `kernels.sum_tree`), its new steps at its own largest priority so far (`max_priority` `[S]`),
its importance weights normalised over its own draws: `select` and `set_priority_` take `[S, k]`. Recurrent Q-networks store each step's
acted-from `hidden` state and `is_init`, and draw uniformly chunks of consecutive steps of one env.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from tensordict import TensorDictBase

from envs.specs import Box, GroupSpec
from marl.core.replay import Key, Prioritized, ReplayBuffer, format_bytes


class MemberReplayBuffer(ReplayBuffer):
    """`members` replay buffers of `capacity` env steps each, uniform or prioritized: `extend` takes the
    population's `[T, S * B]` batch, `draw_members` each member's slots (or fractions, for `select`;
    `draw_member_chunks` its chunks of steps, with recurrent groups' `hidden`), `member_storage` the storage."""

    slot_dim = 1

    def __init__(
        self,
        groups: Mapping[str, GroupSpec],
        capacity: int,
        device: torch.device | str = "cpu",
        *,
        members: int,
        state_spec: Box | None = None,
        prioritized: Prioritized | None = None,
        hidden: Mapping[str, tuple[int, int]] | None = None,
    ) -> None:
        if isinstance(members, bool) or not isinstance(members, int) or members < 1:
            raise ValueError(f"MemberReplayBuffer: members must be a positive int, got {members!r}")
        self.members = members  # before the base allocates: one sum tree per member
        super().__init__(
            groups, members * capacity, device, state_spec=state_spec, prioritized=prioritized, hidden=hidden
        )
        self.capacity = capacity  # from here on, each member's capacity

    def __repr__(self) -> str:
        return (
            f"MemberReplayBuffer({self.members} members x {len(self)}/{self.capacity} env steps, groups "
            f"{list(self.groups)}, {f'prioritized {self.prioritized}' if self.prioritized else 'uniform'}, "
            f"{format_bytes(self.nbytes)} in all on {self.device})"
        )

    def _slotted(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.view(self.members, self.capacity, *tensor.shape[1:])  # [S, capacity, ...]

    def member_storage(self) -> dict[Key, torch.Tensor]:
        """Every stored tensor as `[S, capacity, ...]` (views): member `k`'s buffer at `[k]`."""
        return {key: self._slotted(value) for key, value in self.storage.items()}

    @torch.no_grad()
    def extend(self, data: TensorDictBase) -> None:
        """Append a `[T, S * B]` batch: each member's `[T, B]` columns to its own ring, time-major."""
        tensors, batch = self._check_extend(data)
        if len(batch) != 2 or batch[1] % self.members:
            raise ValueError(
                f"extend: a population's batch is [T, S * B] with S = {self.members} members, got {list(batch)}"
            )
        # [T, S * B, ...] -> [S, T * B, ...]: member k's steps in its single run's order
        self._write({k: v.unflatten(1, (self.members, -1)).movedim(1, 0).flatten(1, 2) for k, v in tensors.items()})

    def draw(self, batch_size: int, generator=None, beta=None):
        raise TypeError("a MemberReplayBuffer draws each member's slots from its own generator: call draw_members")

    @torch.no_grad()
    def draw_members(self, steps: int, batch_size: int, generators: Sequence[torch.Generator]) -> torch.Tensor:
        """Each member's draws of its own ring for `steps` draws of `batch_size`, from its own generator as a
        single run's buffer draws them (`draw_ahead`): `[S, steps, batch_size]`, the slots (uniform) or the
        stratified fractions that `select` finds in each member's tree. The random numbers alone loop over
        the members (torch draws from one generator per call)."""
        if len(generators) != self.members:
            raise ValueError(f"draw_members: {len(generators)} generators for {self.members} members")
        return self._stratified(torch.stack([self._draw_random(steps, batch_size, g) for g in generators]))

    @torch.no_grad()
    def draw_member_chunks(
        self, count: int, length: int, stride: int, generators: Sequence[torch.Generator]
    ) -> torch.Tensor:
        """Each member's `count` chunks of `length` consecutive steps of one of its envs (`stride` of them per
        step), drawn from its own generator as a single run's buffer draws them (`draw_chunks`): their slots
        of its ring `[S, length, count]`. The draws alone loop over the members (one generator per call); the
        slots of all are one computation."""
        if len(generators) != self.members:
            raise ValueError(f"draw_member_chunks: {len(generators)} generators for {self.members} members")
        start = torch.stack([self._chunk_starts(count, length, stride, g) for g in generators])  # [S, count]
        return self.chunk_slots(start, length, stride)

    def state_dict(self) -> dict:
        return {**super().state_dict(), "members": self.members}

    def load_state_dict(self, state: Mapping) -> None:
        if state.get("members") != self.members:
            raise ValueError(
                f"load_state_dict: the saved buffer holds {state.get('members')} members' steps, this one {self.members}"
            )
        super().load_state_dict(state)

    @staticmethod
    def member_state_dict(state: Mapping, k: int) -> dict:
        """Member `k`'s buffer in a population buffer's `state` (`state_dict()`), as a single run's
        `ReplayBuffer.state_dict()` (prioritized: its tree's leaves and its largest priority)."""
        single = {name: value for name, value in state.items() if name != "members"}
        single.update({name: state[name][k].clone() for name in ("leaves", "max_priority") if name in state})
        return {**single, "storage": {name: value[k].clone() for name, value in state["storage"].items()}}

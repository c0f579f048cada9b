"""Groups of one run on off-policy algorithms of different modules: e.g. `speaker_listener` with the
speaker (discrete) on IQL and the listener (continuous) on MASAC,

    marl train --env speaker_listener --algo masac --group speaker.algo=iql

Each group's algorithm is its `--group NAME.algo=...`, else the run's `--algo`. `Mixed` builds one
algorithm per module for its groups (`OffPolicy(groups=...)`) and runs them as one: one replay buffer,
the same draws, one optimiser step of every group (one compiled graph with `--compile`), one checkpoint.
A centralised critic sees every group's actions, whichever algorithm trains the group: at the next
observations each group's as its algorithm acts there (DDPG: its target policy's; SAC: a sample of
its policy, or the probabilities of its discrete one; Q-learning: the greedy allowed action of its online
Q-network, as a one-hot), and at the stored steps each group's stored action.

Options shared by the algorithms (lr, gamma, tau, ...) are the run's; run-wide options (the buffer,
batch size, updates per iteration, warm-up, prioritized replay) are the same for every group.

Several seeds of a mixed run train in one process (`--seeds 0 1 2`): `marl.algorithms.offpolicy_seeds.SeededMixed`.
"""

from __future__ import annotations

import torch

from marl.algorithms.offpolicy import OffPolicy, polyak_
from marl.config import TrainConfig
from marl.core.replay import ReplayBuffer, gather


class Mixed(OffPolicy):
    """Off-policy algorithms of several modules, each training its groups, updated as one."""

    Config = None  # built by `marl.algorithms.build`, never registered: each group's config is its algorithm's

    def __init__(
        self, config: TrainConfig, env, device: torch.device, world, generator: torch.Generator, classes: dict
    ) -> None:
        """`classes`: each group's algorithm class (every one a subclass of `OffPolicy`)."""
        super().__init__(config, env, device, world, generator)
        members: dict[type, list[str]] = {}
        for g, cls in classes.items():
            members.setdefault(cls, []).append(g)
        self.members = [cls(config, env, device, world, generator, groups=groups) for cls, groups in members.items()]
        self.owner = {g: m for m in self.members for g in m.groups}
        for m in self.members:  # a critic reads another module's group's stored actions as that module stores them
            m.stored_squashed = {g: self.owner[g].squashed for g in env.groups}
        self.learners = {g: self.owner[g].learners[g] for g in env.groups}
        self.trainables = {g: self.owner[g].trainables[g] for g in env.groups}
        self._build_step()

    def term_names_of(self, group: str) -> tuple[str, ...]:
        return self.owner[group].term_names_of(group)

    def acting_policies(self) -> dict:
        policies = {g: p for m in self.members for g, p in m.acting_policies().items()}
        return {g: policies[g] for g in self.env.groups}

    def begin_iteration(self, frames: int, total_frames: int) -> None:
        super().begin_iteration(frames, total_frames)
        for m in self.members:
            m.begin_iteration(frames, total_frames)

    def schedules(self, frames: int, total_frames: int) -> dict[str, float]:
        return {name: v for m in self.members for name, v in m.schedules(frames, total_frames).items()}

    def draw_noise(
        self, steps: int, batch_size: int, generator: torch.Generator | None = None
    ) -> dict[str, torch.Tensor]:
        return {g: v for m in self.members for g, v in m.draw_noise(steps, batch_size, generator).items()}

    def see_buffer(self, buffer: ReplayBuffer) -> None:
        for m in self.members:
            m.see_buffer(buffer)

    def update_targets(self, polyak=polyak_) -> None:
        for m in self.members:
            m.update_targets(polyak)

    def loss(self, storage, index, weight, noise, t):
        batch = gather(storage, index)
        after = {g: v for m in self.members for g, v in m.next_actions(batch, noise, t).items()}
        total, terms, priority = 0.0, {}, {}
        for m in self.members:
            member_total, member_terms, member_priority = m.losses(batch, weight, noise, t, after, storage, index)
            total = total + member_total
            terms.update(member_terms)
            priority.update(member_priority)
        return total, terms, priority

    def parameters(self) -> list[torch.Tensor]:
        return [p for m in self.members for p in m.parameters()]

    def state_dict(self, group_state=None) -> dict:
        return {type(m).__name__: m.state_dict(group_state) for m in self.members}

    def load_state_dict(self, state: dict, load_group=None) -> None:
        for m in self.members:
            m.load_state_dict(state[type(m).__name__], load_group)

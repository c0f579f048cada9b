"""IQL, VDN and QMIX for several seeds in one process (`marl train --algo qmix --seeds 0 1 2`): the off-policy
population (`marl.algorithms.offpolicy_seeds`) with each member's epsilon annealed as its single run's, its
n-step returns read from its own ring, and the clock of the hard target copies, every member's (each takes
the same number of steps), saved with the population and with each member's own checkpoint. A swept `tau`
needs Polyak targets (`--target-update polyak`): hard copies are refused.

Recurrent Q-networks (`--model gru`) as `QLearning`'s: the members' Q-networks act from their envs' states
(`MemberPolicy` with `hidden`, the `[S * B, n, h]` states carried by the collector and saved with the
checkpoints), each member's buffer stores with every step the state it was acted from and `is_init`, each
member draws its chunks of steps of one of its envs from its own generator (`draw_member_chunks`), and the
vmapped loss unrolls each member's nets (Q-network, target, mixers) over its chunks from their stored states.
"""

from __future__ import annotations

import torch

from marl.algorithms.base import register_seeded
from marl.algorithms.offpolicy_seeds import SeededOffPolicy
from marl.algorithms.qlearning import QLearning, by_step
from marl.core.member_replay import MemberReplayBuffer


@register_seeded("qmix", "vdn", "iql")
class SeededQLearning(SeededOffPolicy):
    """`QLearning` for `len(seeds)` members; `generators[k]` is member `k`'s random stream (its exploration
    noise and its buffer's draws), as a single run's."""

    single = QLearning
    family = "IQL, VDN or QMIX"
    sweep_owner = "Q-learning's"
    scheduled = ("epsilon",)
    recurrent = True  # --model gru: recurrent Q-networks, trained on each member's chunks of steps

    def check(self) -> None:
        super().check()
        if "tau" in self.sweep:
            hard = sorted(g for g in self.env.groups if self.config.for_group(g)[0].target_update == "hard")
            if hard:
                raise ValueError(
                    f"--sweep tau: group(s) {hard} copy their targets (--target-update hard), with no tau to "
                    "sweep: sweep tau with --target-update polyak"
                )

    def follow_targets(self) -> None:
        if self.member_tau is not None:
            self.updates += 1  # the clock `update_targets` moves: every member's checkpoint holds it
        super().follow_targets()

    def build(self, singles: list[QLearning]) -> None:
        super().build(singles)
        self.template.stride = self.config.env.num_envs  # a member's buffer holds its own B envs per step
        self.updates = self.template.updates  # optimiser steps, every member's (the template's update moves it)

    def draw(self, buffer: MemberReplayBuffer, steps: int) -> torch.Tensor:
        """With recurrent Q-networks each member's chunks' slots `[S, steps, W, C]`, drawn from its own generator
        as its single run's `QLearning.draw` draws them; else its env steps'."""
        if not self.template.chunked:
            return super().draw(buffer, steps)
        count, length = self.template.chunks()
        return by_step(buffer.draw_member_chunks(steps * count, length, self.template.stride, self.generators), steps)

    def state_dict(self) -> dict:
        return {**super().state_dict(), "updates": self.updates.clone()}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.updates.copy_(state["updates"])

    def member_state_dict(self, k: int) -> dict:
        return {**super().member_state_dict(k), "updates": self.updates.clone()}

"""IQL, VDN and QMIX for several seeds in one process (`marl train --algo qmix --seeds 0 1 2`): member `k`
learns exactly as a single run with seed `k` does (to float rounding: batched matmuls sum in another order).

Each member's nets (Q-network, mixer, their targets) are built as a single run builds them (the global RNG
seeded with the member's seed), then stacked (`marl.core.members.Members`): acting and every optimiser step
run every member at once under `vmap`, one batched matmul per layer for all members and agents. What a
single run keeps to itself stays per member: its replay buffer (`MemberReplayBuffer`: only its own envs'
steps, in its single run's slots), its draws of slots and its exploration noise (its own generator; the
draws are a loop over the members per optimiser step, as torch draws from one generator per call), its
loss means (inside the vmapped loss), its gradient-norm clipping (`clip_members_`), its Adam moments (Adam
over stacked parameters is elementwise) and its target nets. Every member takes the same number of steps,
so one clock of optimiser steps serves the hard target copies of all of them.

With `--sweep lr=...` each member's Adam step is scaled by its own learning rate (`member_lr_step`).
Uniform replay only: prioritized replay (one sum tree per member) is refused.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from marl.algorithms.base import group_classes, register_seeded
from marl.algorithms.qlearning import QLearning, follow_targets_
from marl.algorithms.seeded import Seeded
from marl.config import TrainConfig
from marl.core.member_replay import MemberReplayBuffer
from marl.core.members import MemberPolicy, Members, clip_members_, member_lr_step, member_optimizer_state
from marl.core.rollout import Acting
from marl.optim.update_step import adam


@register_seeded("qmix", "vdn", "iql")
class SeededQLearning(Seeded):
    """`QLearning` for `len(seeds)` members; `generators[k]` is member `k`'s random stream (its exploration
    noise and its buffer's draws), as a single run's."""

    collects = "transitions"
    SWEEPABLE = ("lr",)
    sweep_owner = "Q-learning's"
    single = QLearning

    def check(self) -> None:
        """Refuse what a population of Q-learners does not train (yet)."""
        algo = self.config.algo.algo
        classes = group_classes(self.config, self.env.groups)
        others = sorted(g for g, c in classes.items() if c is not QLearning)
        if others:
            raise ValueError(
                f"several seeds (--seeds, --num-seeds) of {algo} train every group with IQL, VDN or QMIX; group(s) "
                f"{others} take another algorithm (--group NAME.algo=...): run their seeds one after another"
            )
        if self.config.algo.prioritized:
            raise ValueError(
                "several seeds (--seeds, --num-seeds) of off-policy algorithms draw from their replay buffers "
                "uniformly so far: leave out --prioritized"
            )

    def build(self, singles: list[QLearning]) -> None:
        self.template = singles[0]  # its nets and loss run every member's tensors (`Members`)
        self.template.stride = self.config.env.num_envs  # a member's buffer holds its own B envs per step
        self.members = Members(
            [nn.ModuleDict({g: nn.ModuleDict(lr.modules()) for g, lr in s.learners.items()}) for s in singles]
        )
        # Per group its trained nets' stacked parameters, in a single run's optimiser order (`QLearning.nets`).
        self.nets = {
            g: {
                "q": self.stacked(f"{g}.policy", lr.policy),
                **({"mixer": self.stacked(f"{g}.mixer", lr.mixer)} if lr.mixer else {}),
            }
            for g, lr in self.template.learners.items()
        }
        self.targets = {
            g: (
                [*self.stacked(f"{g}.target_q", lr.target_q), *self.stacked(f"{g}.target_mixer", lr.target_mixer)],
                [p for net in self.nets[g].values() for p in net],
            )
            for g, lr in self.template.learners.items()
        }
        for targets, _ in self.targets.values():
            for p in targets:
                p.requires_grad_(False)  # moved by `follow_targets_`, never by an optimiser
        self.optimizers = {
            g: adam(
                [p for net in self.nets[g].values() for p in net],
                lr=1.0 if self.member_lr is not None else lr.algo.lr,
                eps=lr.algo.adam_eps,
            )
            for g, lr in self.template.learners.items()
        }
        self.updates = torch.zeros((), dtype=torch.int64, device=self.device)  # optimiser steps, every member's

    @property
    def acting(self) -> Acting:
        policies = {
            g: MemberPolicy(self.members, lr.policy, log_prob=False) for g, lr in self.template.learners.items()
        }
        return self.template.acting_with(policies)

    def replay(self) -> tuple[int, None]:
        """Each member's buffer capacity; uniform draws (the run loop builds a `MemberReplayBuffer`)."""
        return self.config.algo.buffer_size, None

    def begin_iteration(self, frames: int, total_frames: int) -> None:
        """`QLearning.begin_iteration` (warm-up, epsilon): every member's epsilon is the same."""
        self.template.begin_iteration(frames, total_frames)
        for g, lr in self.template.learners.items():
            self.members.buffers[f"{g}.policy.epsilon"].copy_(lr.policy.epsilon)

    def update(self, buffer: MemberReplayBuffer, timer) -> dict[str, dict[str, torch.Tensor]]:
        """`OffPolicy.update` for every member: each optimiser step draws each member's slots of its own
        buffer and steps all members at once; each term is `[S]`, one per member."""
        algo, template = self.config.algo, self.template
        template.see_buffer(buffer)  # the write position, shared by the members' rings (n-step returns)
        storage = buffer.member_storage()  # [S, capacity, ...]
        sums = None
        for t in template.step_indices:
            out = self.step(storage, buffer.draw_members(algo.batch_size, self.generators), t)
            sums = out if sums is None else {g: sums[g] + v for g, v in out.items()}
        timer.mark("update_s")
        fill = (buffer.size.float() / buffer.capacity).expand(self.count)
        out = {}
        for g, v in sums.items():
            names = (*template.term_names_of(g), *(f"{net}_grad_norm" for net in self.nets[g]))
            terms = (v / algo.updates_per_iteration).unbind(-1)
            out[g] = {**dict(zip(names, terms, strict=True)), "buffer_fill": fill}
        return out

    def step(self, storage: dict, index: torch.Tensor, t: torch.Tensor) -> dict[str, torch.Tensor]:
        """One optimiser step of every member on its slots `index` `[S, batch_size]` of its buffer: the
        members' losses summed (each member's gradient is its own loss's), each member's gradients clipped
        per net, Adam, the targets moved; per group `[S, terms + nets]` (the terms, then each net's norm)."""
        template = self.template

        def loss(storage, index):
            total, terms, _ = template.loss(storage, index, None, {}, t)
            return total, terms

        for optimizer in self.optimizers.values():
            optimizer.zero_grad(set_to_none=True)
        total, terms = self.members(loss, storage, index)
        total.sum().backward()
        out = {}
        for g, learner in template.learners.items():
            clip = learner.algo.max_grad_norm
            norms = [
                clip_members_(net, clip) if clip > 0 else torch.full((self.count,), math.nan, device=self.device)
                for net in self.nets[g].values()
            ]
            member_lr_step(self.optimizers[g], [p for net in self.nets[g].values() for p in net], self.member_lr)
            out[g] = torch.cat([terms[g], torch.stack(norms, -1)], -1)
        self.updates += 1
        with torch.no_grad():
            for g, (targets, online) in self.targets.items():
                follow_targets_(targets, online, template.learners[g].algo, self.updates)
        return out

    def state_dict(self) -> dict:
        return {**super().state_dict(), "updates": self.updates.clone()}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.updates.copy_(state["updates"])

    def member_state_dict(self, k: int) -> dict:
        """Member `k`'s state as a single run's `QLearning.state_dict()`: its checkpoint is an ordinary one."""
        state: dict = {
            g: {
                **{name: self.members.member(k, f"{g}.{name}") for name in lr.modules()},
                "optimizer": member_optimizer_state(self.optimizers[g], k),
            }
            for g, lr in self.template.learners.items()
        }
        return {**state, "updates": self.updates.clone()}

    @classmethod
    def label(cls, config: TrainConfig, groups) -> str:
        return QLearning.label(config, groups)

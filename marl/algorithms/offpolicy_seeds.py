"""Off-policy algorithms for several seeds in one process (`marl train --algo masac --seeds 0 1 2`): member `k`
learns exactly as a single run with seed `k` does (to float rounding: batched matmuls sum in another order).

Each member's nets (policies, critics or Q-networks, mixers, SAC's temperatures, their targets) are built as a
single run builds them (the global RNG seeded with the member's seed), then stacked (`marl.core.members.Members`):
acting and every optimiser step run every member at once under `vmap`, one batched matmul per layer for all
members and agents. What a single run keeps to itself stays per member: its replay buffer
(`MemberReplayBuffer`: only its own envs' steps, in its single run's slots; with `--prioritized` its own sum
tree and largest priority), its draws of slots (prioritized: its stratified fractions), its
exploration noise and its update's sampling noise (SAC's actions at s and s'; all from its own generator, in
its single run's order: the draws are a loop over the members, as torch draws from one generator per call),
its loss means (inside the vmapped loss), its gradient-norm clipping per net (`clip_members_`), its Adam moments
(Adam over stacked parameters is elementwise) and its target nets. The single run's own target update
(Polyak averaging, Q-learning's hard copies) moves the stacked targets, elementwise, for every member at once;
every member takes the same number of steps, so one clock serves the hard copies of all of them.

With `--sweep lr=...` each member's Adam step is scaled by its own learning rate (`member_lr_step`);
`--sweep tau=...` moves each member's targets by its own Polyak factor (`member_polyak_`; Q-learning's hard
copies have none, and are refused); `--sweep gamma=...` gives the vmapped loss each member's discount as a
0-d tensor its learners' configs read (`swept_options`), in its TD targets and Q-learning's n-step returns.

With `--prioritized` each optimiser step first finds every member's slots in its own tree, as its previous
step left it, with importance weights over its own draws (`MemberReplayBuffer.select`, outside the vmapped
loss: a find is no vmappable op), with β annealed as the single run anneals it; the vmapped loss reduces each
member's TD errors to its priorities (`reduce_priority`), which the step then sets in every member's tree at
once (`set_priority_`), after the target update, as a single run's `after_step` does. Recurrent
Q-networks (`--model gru`): `marl.algorithms.qlearning_seeds`.

With `--compile` (one process) each optimiser step is one compiled graph (`compiled_step`, the update step
of `marl.optim.update_step` over the stacked nets, as a single run's): every member's find in its tree
(`select`), the vmapped loss, the gradients of the members' summed losses by `torch.func.grad`, each member's
norms and clipping per net, Adam (scaled by each member's swept lr), the targets and the priorities
(`after_step`). The swept values, β and the step's index are tensors: every step is the same graph.
Without it each step runs eagerly (`step`): autograd, `clip_members_`, torch's fused Adam (`member_lr_step`).

Groups on different off-policy algorithms (`marl train --env speaker_listener --algo masac --group
speaker.algo=iql --seeds 0 1 2`, `SeededMixed`): each member is the mixed run (`marl.algorithms.mixed.Mixed`)
with its seed, and the population is the same one: whatever differs by group is read from the algorithm that
trains the group in that run (`OffPolicy.owner`): the exploration schedule its policies' buffers follow (DDPG's
sigma, Q-learning's epsilon: `OffPolicy.scheduled`), its targets and their update (with Q-learning's clock of
the hard copies), the stride of its n-step returns (a member's own envs per step), its sampling noise. A
member's checkpoint is the mixed run's (`member_state_dict`: per algorithm its groups' state and clock).
"""

from __future__ import annotations

import math
from typing import ClassVar

import torch
from torch import nn

from marl.algorithms.base import build, register_seeded
from marl.algorithms.ddpg import DDPG
from marl.algorithms.offpolicy import OffPolicy, acted
from marl.algorithms.qlearning import by_step
from marl.algorithms.sac import SAC
from marl.algorithms.seeded import Seeded, swept_options
from marl.config import TrainConfig
from marl.core.member_replay import MemberReplayBuffer
from marl.core.members import (
    MemberPolicy,
    Members,
    clip_members_,
    member_lr_step,
    member_optimizer_state,
    member_polyak_,
)
from marl.core.replay import Prioritized
from marl.core.rollout import Acting
from marl.optim.update_step import Trainable, UpdateStep, adam


class SeededOffPolicy(Seeded):
    """An off-policy algorithm (`single`, an `OffPolicy`) for `len(seeds)` members; `generators[k]` is member
    `k`'s random stream (its exploration and sampling noise, its buffer's draws), as a single run's. What differs
    by group (exploration schedules, the target update and its clock, noise, chunks) is the algorithm's that
    trains the group in the single run (`OffPolicy.owner`), so a population of mixed runs is this one too."""

    collects = "transitions"
    SWEEPABLE = ("lr", "gamma", "tau")
    single: ClassVar[type[OffPolicy]]

    def check(self) -> None:
        """Refuse what a population of off-policy learners does not train: a swept tau for hard target copies."""
        if "tau" in self.sweep:
            hard = sorted(
                g for g in self.env.groups if getattr(self.config.for_group(g)[0], "target_update", "") == "hard"
            )
            if hard:
                raise ValueError(
                    f"--sweep tau: group(s) {hard} copy their targets (--target-update hard), with no tau to "
                    "sweep: sweep tau with --target-update polyak"
                )

    def build(self, singles: list[OffPolicy]) -> None:
        self.template = template = singles[0]  # its nets, loss and target update run every member's tensors
        self.members = Members(
            [nn.ModuleDict({g: nn.ModuleDict(lr.modules()) for g, lr in s.learners.items()}) for s in singles]
        )
        # Per group its trained nets' stacked parameters by name (the gradient norms logged, clipped apart), and
        # all of them in its single run's optimiser order (Adam's state, slot by slot: `member_state_dict`).
        self.nets = {
            g: {name: self.stacked(net.parameters()) for name, net in trainable.nets.items()}
            for g, trainable in template.trainables.items()
        }
        self.optimized = {
            g: self.stacked(p for group in lr.optimizer.param_groups for p in group["params"])
            for g, lr in template.learners.items()
        }
        # The targets of the algorithms that train the groups become the stacked ones: the template's
        # `update_targets` then moves every member's.
        for owner in dict.fromkeys(template.owner.values()):
            owner.targets = {g: (self.stacked(t), self.stacked(o)) for g, (t, o) in owner.targets.items()}
            for targets, _ in owner.targets.values():
                for p in targets:
                    p.requires_grad_(False)  # moved by the target update, never by an optimiser
        # Each member's Polyak factor `[S]` when swept; each member's discount `[S]`, which the vmapped loss
        # reads as member k's 0-d gamma.
        self.member_tau = torch.tensor(self.sweep["tau"], device=self.device) if "tau" in self.sweep else None
        self.swept = {"gamma": torch.tensor(self.sweep["gamma"], device=self.device)} if "gamma" in self.sweep else None
        self.optimizers = {
            g: adam(self.optimized[g], lr=1.0 if self.member_lr is not None else lr.algo.lr, eps=lr.algo.adam_eps)
            for g, lr in template.learners.items()
        }
        self.replay_buffer: MemberReplayBuffer | None = None  # the buffer `update` draws from
        # --compile (one process): each optimiser step is one compiled graph (`UpdateStep` over the stacked
        # nets); otherwise `step` takes it eagerly.
        self.compiled_step, self.prioritized = None, self.replay()[1] is not None
        if self.config.run.compile and self.world.size == 1:
            self.compiled_step = UpdateStep(
                {g: Trainable(t.nets, self.optimizers[g], t.max_grad_norm) for g, t in template.trainables.items()},
                self.member_loss,
                self.device,
                self.world,
                compile=True,
                aux=self.prioritized,
                after_step=self.after_step,
                prepare=self.select,
                members=self.members,
                member_lr=self.member_lr,
            )

    @property
    def acting(self) -> Acting:
        policies = {
            g: MemberPolicy(self.members, lr.policy, log_prob=False) for g, lr in self.template.learners.items()
        }
        return self.template.acting_with(policies)

    def replay(self) -> tuple[int, Prioritized | None]:
        """Each member's buffer capacity and prioritized replay, as its single run's (the run loop builds a
        `MemberReplayBuffer`: with `Prioritized`, one sum tree per member)."""
        return self.template.replay()

    def begin_iteration(self, frames: int, total_frames: int) -> None:
        """The single run's `begin_iteration` (warm-up, exploration schedules): the same for every member, each
        group's schedules (`OffPolicy.scheduled`) its algorithm's."""
        template = self.template
        template.begin_iteration(frames, total_frames)
        for g, lr in template.learners.items():
            for name in template.owner[g].scheduled:
                self.members.buffers[f"{g}.policy.{name}"].copy_(getattr(lr.policy, name))

    def update(self, buffer: MemberReplayBuffer, timer) -> dict[str, dict[str, torch.Tensor]]:
        """`OffPolicy.update` for every member: each member's sampling noise and draws of the iteration (slots,
        or prioritized fractions) from its own generator, then each optimiser step takes every member's step at
        once; each term is `[S]`, one per member."""
        algo, template = self.config.algo, self.template
        template.see_buffer(buffer)  # the write position, shared by the members' rings (n-step returns)
        drawn = [template.draw_noise(algo.updates_per_iteration, algo.batch_size, g) for g in self.generators]
        noise = {g: torch.stack([d[g] for d in drawn]) for g in drawn[0]}  # [S, steps, ...]
        # Then each member's draws of the iteration, as its single run draws them after its noise.
        draws = self.draw(buffer, algo.updates_per_iteration)  # [S, steps, ...]
        storage = buffer.member_storage()  # [S, capacity, ...]
        self.replay_buffer = buffer
        sums = None
        for t in template.step_indices:
            if self.compiled_step is not None:
                out = self.compiled_step(storage, draws, template.beta_now, noise, t, self.swept)
                out = out[0] if self.prioritized else out
            else:
                out = self.step(buffer, storage, draws.index_select(1, t).squeeze(1), noise, t)
            sums = out if sums is None else {g: sums[g] + v for g, v in out.items()}
        timer.mark("update_s")
        fill = (buffer.size.float() / buffer.capacity).expand(self.count)
        out = {}
        for g, v in sums.items():
            names = (*template.term_names_of(g), *(f"{net}_grad_norm" for net in self.nets[g]))
            terms = (v / algo.updates_per_iteration).unbind(-1)
            out[g] = {**dict(zip(names, terms, strict=True)), "buffer_fill": fill}
        return out

    def draw(self, buffer: MemberReplayBuffer, steps: int) -> torch.Tensor:
        """Each member's draws for `steps` optimiser steps from its own generator, as its single run's `draw`:
        its env steps' slots (prioritized: its fractions) `[S, steps, batch_size]`, or with recurrent
        Q-networks its chunks' slots `[S, steps, W, C]` (`QLearning.draw`)."""
        template = self.template
        if not template.chunked:
            return buffer.draw_members(steps, self.config.algo.batch_size, self.generators)
        count, length = template.chunks()
        return by_step(buffer.draw_member_chunks(steps * count, length, template.stride, self.generators), steps)

    def step(
        self, buffer: MemberReplayBuffer, storage: dict, drawn: torch.Tensor, noise: dict, t: torch.Tensor
    ) -> dict[str, torch.Tensor]:
        """One optimiser step of every member on its draws `drawn` `[S, batch_size]` of its buffer (`select`:
        the slots, prioritized found in its tree with their importance weights), with its `noise` (per group
        `[S, steps, ...]`): the members' losses summed (each member's gradient is its own loss's), each
        member's gradients clipped per net, Adam, the targets moved, prioritized the drawn steps' priorities
        set; per group `[S, terms + nets]` (the terms, then each net's norm)."""
        template, prioritized = self.template, buffer.prioritized is not None
        index, weight = buffer.select(drawn, template.beta_now)  # [S, batch_size] each (weight: None uniform)

        def loss(storage, index, weight, noise, swept):
            with swept_options(template, swept or {}):
                total, terms, priority = template.loss(storage, index, weight, noise, t)
            return (
                (total, terms, buffer.reduce_priority(priority, acted(storage, index, priority)))
                if prioritized
                else (total, terms)
            )

        for optimizer in self.optimizers.values():
            optimizer.zero_grad(set_to_none=True)
        total, terms, *priority = self.members(loss, storage, index, weight, noise, self.swept)
        total.sum().backward()
        out = {}
        for g, learner in template.learners.items():
            clip = learner.algo.max_grad_norm
            norms = [
                clip_members_(net, clip) if clip > 0 else torch.full((self.count,), math.nan, device=self.device)
                for net in self.nets[g].values()
            ]
            member_lr_step(self.optimizers[g], self.optimized[g], self.member_lr)
            out[g] = torch.cat([terms[g], torch.stack(norms, -1)], -1)
        self.follow_targets()
        if prioritized:  # after the targets, as the single run's `after_step`
            buffer.set_priority_(index, priority[0])
        return out

    # ---- the compiled step (`compiled_step`): `step`'s parts, as `UpdateStep` takes them --------------------

    def select(self, storage, draws, beta, noise, t, swept) -> tuple:
        """The loss's inputs of step `t` (`[1]`): each member's slots and importance weights from its row of
        `draws` `[S, steps, ...]` (with the exponent `beta`), and `t` per member `[S, 1]` (the vmapped loss
        reads its noise's row)."""
        index, weight = self.replay_buffer.select(draws.index_select(1, t).squeeze(1), beta)
        return storage, index, weight, noise, t.expand(self.count, 1), swept

    def member_loss(self, storage, index, weight, noise, t, swept):
        """One member's loss (run under vmap), with its swept values; prioritized, with the slots and their
        priorities as aux (for `after_step`)."""
        if swept is None:
            total, terms, priority = self.template.loss(storage, index, weight, noise, t)
        else:
            with swept_options(self.template, swept):
                total, terms, priority = self.template.loss(storage, index, weight, noise, t)
        if not self.prioritized:
            return total, terms
        return total, terms, (index, self.replay_buffer.reduce_priority(priority, acted(storage, index, priority)))

    def after_step(self, aux) -> None:
        """After every optimiser step: the targets, then prioritized the drawn steps' priorities (`aux`)."""
        self.follow_targets()
        if aux is not None:
            self.replay_buffer.set_priority_(*aux)

    def follow_targets(self) -> None:
        """The single run's target update for every member (Q-learning's clock of the hard copies is every
        member's: each takes the same steps); with a swept tau, each member's Polyak step by its own."""
        with torch.no_grad():
            if self.member_tau is None:
                self.template.update_targets()
            else:
                self.template.update_targets(
                    lambda targets, online, _: member_polyak_(targets, online, self.member_tau)
                )

    def state_dict(self) -> dict:
        """The stacked nets and optimisers, and under `single` what the single run holds beside its groups'
        (Q-learning's clock, every member's)."""
        return {**super().state_dict(), "single": self.template.state_dict(lambda g, lr: {})}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.template.load_state_dict(state["single"], lambda g, lr, held: None)

    def member_state_dict(self, k: int) -> dict:
        """Member `k`'s state as its single run's `state_dict()`: its checkpoint is an ordinary one."""
        return self.template.state_dict(
            lambda g, lr: {
                **{name: self.members.member(k, f"{g}.{name}") for name in lr.modules()},
                "optimizer": member_optimizer_state(self.optimizers[g], k, self.sweep.get("lr")),
            }
        )


@register_seeded("maddpg", "iddpg")
class SeededDDPG(SeededOffPolicy):
    """MADDPG and IDDPG populations: each member's exploration sigma follows the single run's schedule."""

    single = DDPG
    sweep_owner = "DDPG's"


@register_seeded("masac", "isac")
class SeededSAC(SeededOffPolicy):
    """MASAC and ISAC populations: each member's temperature is its own stacked 0-d parameter `[S]`, tuned by
    its own loss and Adam; its actions at s and s' sampled with its own noise."""

    single = SAC
    sweep_owner = "SAC's"


class SeededMixed(SeededOffPolicy):
    """Populations of runs whose groups take off-policy algorithms of different modules (`marl.algorithms.mixed`,
    `--group NAME.algo=...`): each member is the `Mixed` run `marl.algorithms.build` makes of its config, built
    by `build_seeded` as `build` builds `Mixed`, never registered."""

    @staticmethod
    def single(config: TrainConfig, env, device: torch.device, world, generator: torch.Generator) -> OffPolicy:
        return build(config, env, device, world, generator)

    @property
    def sweep_owner(self) -> str:
        return " and ".join(dict.fromkeys(f"{self.config.for_group(g)[0].algo.upper()}'s" for g in self.env.groups))

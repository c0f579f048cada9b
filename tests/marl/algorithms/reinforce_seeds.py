"""REINFORCE for several seeds in one process: `reinforce.py`'s algorithm trained as a population.

    marl train --imports tests.marl.algorithms.reinforce_seeds --algo reinforce --seeds 0 1 2

Member `k` trains as `marl train --imports tests.marl.algorithms.reinforce --algo reinforce --seed K` does,
to float rounding. Each member is first built as that single run (`Seeded.singles`: the global RNG seeded
with its seed), then its policies' parameters are stacked on a leading member dim `[S, ...]`
(`marl.core.members.Members`). The first member's single run is the template: its `_loss`, run under
`vmap`, computes every member's loss from that member's slot of the stacked tensors and its rows of the
batch. What a single run keeps of its own stays per member: the running baseline (`[S]`), the gradient
norm and its clipping (`clip_members_`), and Adam's moments (elementwise over the stacked parameters, so one
Adam per group is `S` single runs' Adams).
"""

from __future__ import annotations

import math

import torch
from tensordict import TensorDict
from torch import nn

import kernels
from marl.algorithms import register_seeded
from marl.algorithms.seeded import Seeded
from marl.core.members import MemberPolicy, Members, clip_members_, member_optimizer_state, split
from marl.core.rollout import Acting
from marl.optim.update_step import adam
from tests.marl.algorithms.reinforce import Reinforce

INPUTS = ("observation", "action", "action_mask")  # what `Reinforce._loss` reads of a group's batch


@register_seeded("reinforce")
class SeededReinforce(Seeded):
    """`Reinforce` for `len(seeds)` members. The batch holds every member's envs as one `[T, S * B]` batch:
    member `k`'s are the columns `k * B .. (k + 1) * B` (`split` makes them `[S, T, B, ...]`)."""

    single = Reinforce  # what each member trains as

    def build(self, singles: list[Reinforce]) -> None:
        self.template = singles[0]  # its nets run every member's tensors
        self.members = Members([nn.ModuleDict(single.policies) for single in singles])  # "GROUP.NAME": [S, ...]
        self.baselines = {g: torch.stack([single.baselines[g] for single in singles]) for g in self.env.groups}
        self.optimizers = {}
        for g, policy in self.template.policies.items():
            algo, _ = self.config.for_group(g)
            self.optimizers[g] = adam(self.stacked(policy.parameters()), lr=algo.lr, eps=1e-8)

    @property
    def acting(self) -> Acting:
        return Acting({g: MemberPolicy(self.members, p, log_prob=False) for g, p in self.template.policies.items()})

    def update(self, batch: TensorDict, timer) -> dict[str, dict[str, torch.Tensor]]:
        """`Reinforce.update` for every member: each term is `[S]`, one per member."""
        S, data, advantages = self.count, {}, {}
        for g in self.template.policies:
            algo, _ = self.config.for_group(g)
            # Returns per env column, so over all members' envs at once; then [T, S * B, n] -> [S, T, B, n].
            returns = kernels.discounted_returns(batch[g]["reward"], batch[g]["done"], gamma=algo.gamma)
            returns = split(returns, S, 1)
            self.baselines[g].lerp_(returns.mean((1, 2, 3)), 1 - algo.baseline_decay)  # each member's mean
            advantages[g] = returns - self.baselines[g].view(S, 1, 1, 1)
            data[g] = {k: split(v, S, 1) for k, v in batch[g].items() if k in INPUTS}
        for optimizer in self.optimizers.values():
            optimizer.zero_grad(set_to_none=True)
        total, terms = self.members(self.template._loss, data, advantages)  # [S], {group: [S, 2]}
        total.sum().backward()  # each member's parameters get the gradient of its own loss only
        out = {}
        for g, optimizer in self.optimizers.items():
            algo, _ = self.config.for_group(g)
            params = self.stacked(self.template.policies[g].parameters())
            if algo.max_grad_norm > 0:
                grad_norm = clip_members_(params, algo.max_grad_norm)  # [S]: each member's own norm
            else:
                grad_norm = torch.full((S,), math.nan, device=self.device)  # as the single run: not measured
            optimizer.step()
            loss, entropy = terms[g].unbind(-1)
            out[g] = {"loss": loss, "entropy": entropy, "grad_norm": grad_norm}
        return out

    def state_dict(self) -> dict:
        return {**super().state_dict(), "baselines": dict(self.baselines)}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        for g, baseline in self.baselines.items():
            baseline.copy_(state["baselines"][g])

    def member_state_dict(self, k: int) -> dict:
        """Member `k`'s state as `Reinforce.state_dict()`: its own checkpoint (`seed_K/checkpoint.pt`) is a
        single run's, which `marl eval` and `marl train --resume` take."""
        return {
            g: {
                "policy": self.members.member(k, g),
                "optimizer": member_optimizer_state(self.optimizers[g], k),
                "baseline": self.baselines[g][k].clone(),
            }
            for g in self.template.policies
        }

"""MADDPG and IDDPG: deterministic policies for bounded continuous actions, learned through an action-value
critic per group (Lowe et al. 2017; Lillicrap et al. 2016), from a replay buffer (`marl.algorithms.offpolicy`).

A group's policy gives an action in its bounds, `low + (tanh(x) + 1) / 2 * (high - low)`; it explores
with Gaussian noise of scale sigma (a fraction of the half range) added and clipped to the bounds, sigma
annealed linearly from `exploration_sigma_init` to `exploration_sigma_end` over the first
`exploration_anneal` of the run (BenchMARL's schedule; `DDPGConfig`'s defaults start lower). Per optimiser
step and group (`ddpg_terms`):

- `critic_loss`: `mean(w * (Q(s, a) - y)^2)` with `y = r + gamma * (1 - terminated) * Q'(s', mu'(s'))`,
  the target critic `Q'` at the target policies' next actions;
- `policy_loss`: `-mean(Q(s, mu(s)))`, the group's own actions from its policy, the critic held fixed;
- `loss = critic_loss + policy_loss`; diagnostics `q_value` (mean Q), `td_error` (mean |y - Q|), `sigma`.

MADDPG's critic sees every group's observations (or the env's state) and actions; IDDPG's its agent's.
Actions enter the critic scaled to [-1, 1].
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

import torch
from torch import nn

from envs.specs import Box
from marl.algorithms.base import register
from marl.algorithms.offpolicy import (
    OffPolicy,
    OffPolicyConfig,
    annealed,
    anneals,
    critic_input,
    critic_loss,
    exploration_start,
    fixed,
    frozen_copy,
    split,
    td_targets,
)
from marl.config import TrainConfig
from marl.core.masking import agents_in, inactive_zeroed, masked_mean
from marl.core.models import CriticInput, DeterministicPolicy, QCritic, action_features, action_size
from marl.optim.update_step import Trainable, adam

TERMS = ("loss", "critic_loss", "policy_loss", "q_value", "td_error", "sigma")


@dataclass(frozen=True)
class DDPGConfig(OffPolicyConfig):
    """MADDPG and IDDPG: deterministic policies explored with Gaussian noise, learned through action values."""

    policy_std: ClassVar[bool] = False  # deterministic policies, explored with Gaussian noise of sigma
    conditional = (exploration_start("exploration_sigma_init", "sigma"),)
    anneal_options = (
        "--exploration-anneal above 0 with --exploration-sigma-init other than the end (sigma), or --prioritized (beta)"
    )

    algo: Literal["maddpg", "iddpg"] = "maddpg"
    """maddpg: a centralised critic (every group's observations and actions); iddpg: each agent's own."""
    # DDPG's own defaults, chosen by the time to a return of 0.9 on vmas/navigation (marl/bench/README.md,
    # "Time to a return of 0.9"): with the shared ones (lr 3e-4, tau 0.005, gamma 0.99, 32 steps of 2048)
    # and BenchMARL's noise (0.8) MADDPG ran into collisions and ended at a return of -4.
    lr: float = 3e-3
    """Adam learning rate of the policies and critics (DDPG's: as SAC's, 10x the shared one; with 1e-3 and one
    step per 64 frames MADDPG stayed below a return of 0 on vmas/navigation in 300k frames)."""
    tau: float = 0.02
    """Polyak factor of the target networks (DDPG's: targets that keep up with the faster lr)."""
    gamma: float = 0.95
    """Discount factor (DDPG's: with 0.99 MADDPG's action values kept rising past the returns, and it levelled
    off lower on vmas/navigation)."""
    batch_size: int = 256
    """Env steps drawn from the buffer per optimiser step (DDPG's: a step about 8x cheaper than 2048's, so
    that many steps fit in each iteration; 128 levelled off lower)."""
    updates_per_iteration: int = 512
    """Optimiser steps per iteration (DDPG's: one per 32 frames of the default 256 x 64 iteration; with one
    per 64 frames MADDPG stayed below a return of 0.8 on vmas/navigation in 300k frames)."""
    exploration_sigma_init: float = 0.3
    """Exploration noise at the start, as a fraction of the action's half range (DDPG's: BenchMARL's 0.8 is
    mostly collisions on vmas/navigation; 0.5 and 0.1 were slower to a return of 0.9)."""
    exploration_sigma_end: float = 0.01
    """Exploration noise after the annealing."""
    exploration_anneal: float = 1 / 3
    """The fraction of the schedules' frames (--schedule-frames, else total_frames) over which the exploration
    (DDPG's sigma, Q-learning's epsilon) is annealed linearly (0: its end value from the start)."""

    def check(self) -> None:
        super().check()
        for name in ("exploration_sigma_init", "exploration_sigma_end"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if not 0 <= self.exploration_anneal <= 1:
            raise ValueError(f"exploration_anneal must be in [0, 1], got {self.exploration_anneal}")

    def annealed(self) -> tuple[str, ...]:
        sigma = anneals(self.exploration_sigma_init, self.exploration_sigma_end, self.exploration_anneal)
        return ("sigma",) * sigma + super().annealed()


@dataclass
class DDPGLearner:
    """Everything one group learns with."""

    algo: DDPGConfig
    policy: DeterministicPolicy
    critic: QCritic
    critic_input: CriticInput
    target_policy: DeterministicPolicy
    target_critic: QCritic
    optimizer: torch.optim.Adam

    def modules(self) -> dict[str, nn.Module]:
        return {n: getattr(self, n) for n in ("policy", "critic", "target_policy", "target_critic")}


def ddpg_terms(
    q: torch.Tensor,
    target: torch.Tensor,
    q_policy: torch.Tensor,
    weight: torch.Tensor | None,
    active: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    """DDPG's terms for one group: `q` `[k, 1, n]` the critic at the stored actions, `target` `[k, n]` the
    TD targets, `q_policy` `[k, n]` the (fixed) critic at the policy's actions, `weight` `[k]` or None;
    `active` `[k, n]` bool (or None: all) the agent-steps the means are over."""
    value_loss = critic_loss(q, target, weight, active)
    policy_loss = -masked_mean(q_policy, active)
    return {
        "loss": value_loss + policy_loss,
        "critic_loss": value_loss,
        "policy_loss": policy_loss,
        "q_value": masked_mean(q.detach()[:, 0], active),
        "td_error": masked_mean((q.detach()[:, 0] - target).abs(), active),
    }


@register("maddpg", "iddpg")
class DDPG(OffPolicy):
    """MADDPG or IDDPG for every group at once, by each group's critic scope."""

    Config = DDPGConfig
    term_names = TERMS
    scheduled = ("sigma",)

    def check_group(self, group: str, spec) -> None:
        if not isinstance(spec.action, Box):
            raise ValueError(
                f"{self.config.for_group(group)[0].algo} needs continuous (Box) actions, but group {group!r} has "
                f"{spec.action}: train it with masac or isac (discrete SAC), or with a value-based algorithm "
                f"(--group {group}.algo=iql, vdn or qmix)"
            )

    def __init__(
        self, config: TrainConfig, env, device: torch.device, world, generator: torch.Generator, groups=None
    ) -> None:
        super().__init__(config, env, device, world, generator, groups)
        # The critics see the actions of every group of the env (other algorithms' groups too).
        action_sizes = {g: action_size(spec) for g, spec in env.groups.items()}
        self.learners: dict[str, DDPGLearner] = {}
        for g, spec in self.groups.items():
            algo, model = config.for_group(g)
            policy = DeterministicPolicy(spec, model.hidden, model.activation, model.share_params).to(device)
            seen = critic_input(config, env, g, action_sizes)
            critic = QCritic(
                seen.size,
                1,
                spec.n_agents,
                model.hidden,
                model.activation,
                model.share_params,
                shared_value=seen.shared_value,
                agent_ids=seen.agent_ids,
            ).to(device)
            optimizer = adam([*policy.parameters(), *critic.parameters()], lr=algo.lr, eps=algo.adam_eps)
            self.learners[g] = DDPGLearner(
                algo, policy, critic, seen, frozen_copy(policy), frozen_copy(critic), optimizer
            )
        self.targets = {
            g: (
                [*lr.target_policy.parameters(), *lr.target_critic.parameters()],
                [*lr.policy.parameters(), *lr.critic.parameters()],
            )
            for g, lr in self.learners.items()
        }
        self.trainables = {
            g: Trainable({"policy": lr.policy, "critic": lr.critic}, lr.optimizer, lr.algo.max_grad_norm)
            for g, lr in self.learners.items()
        }
        self._build_step()

    def schedules(self, frames: int, total_frames: int) -> dict[str, float]:
        values = super().schedules(frames, total_frames)
        for g, lr in self.learners.items():
            a = lr.algo
            values[f"{g} sigma"] = annealed(
                a.exploration_sigma_init, a.exploration_sigma_end, a.exploration_anneal, frames, total_frames
            )
        return values

    def next_actions(self, batch, noise, t):
        """The target policies' actions at the next observations."""
        with torch.no_grad():
            return {
                g: (action_features(lr.target_policy(batch[g]["next_observation"]).mode(), self.groups[g], False), None)
                for g, lr in self.learners.items()
            }

    def losses(self, batch, weight, noise, t, next_actions, storage, index):
        groups = self.env.groups
        obs, next_obs, state, next_state = split(batch, groups)
        active, next_active = agents_in(batch, groups), agents_in(batch, groups, next=True)
        stored = self.stored_actions(batch)
        next_actions = {g: features for g, (features, _) in next_actions.items()}
        total, terms, priority = 0.0, {}, {}
        for g, lr in self.learners.items():
            with torch.no_grad():
                next_x = lr.critic_input(next_obs, next_state, next_actions, next_active)
                next_q = lr.target_critic(next_x)[:, 0, :, 0]
                target = td_targets(batch[g]["reward"], batch[g]["terminated"], next_q, lr.algo.gamma)
            q = lr.critic(lr.critic_input(obs, state, stored, active))[..., 0]  # [k, 1, n]
            own = action_features(lr.policy(obs[g]).mode(), groups[g], squashed=False)
            q_policy = fixed(lr.critic, lr.critic_input(obs, state, {**stored, g: own}, active))[:, 0, :, 0]
            counted = batch[g].get("active")
            group_terms = ddpg_terms(q, target, q_policy, weight, counted)
            total = total + group_terms["loss"]
            terms[g] = torch.stack([*(group_terms[name].detach() for name in TERMS[:-1]), lr.policy.sigma])
            priority[g] = inactive_zeroed((q.detach()[:, 0] - target).abs(), counted)
        return total, terms, priority

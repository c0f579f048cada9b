"""MASAC and ISAC: soft actor-critic (Haarnoja et al. 2018) for every group, with twin critics, target
critics and automatic entropy tuning, from a replay buffer (`marl.algorithms.offpolicy`).

Continuous (Box) actions: a tanh-squashed Gaussian policy (`TanhNormal`, whose log-probability carries
the change of variables of the squashing), actions drawn by reparameterisation; the critics see the
squashed action in [-1, 1]. Per optimiser step and group (`continuous_terms`):

- `critic_loss`: for each twin `mean(w * (Q_i(s, a) - y)^2)`, summed, with
  `y = r + gamma * (1 - terminated) * (min_i Q'_i(s', a') - alpha * log pi(a'|s'))`, `a' ~ pi(s')`;
- `policy_loss`: `mean(alpha * log pi(a|s) - min_i Q_i(s, a))`, `a ~ pi(s)` (the critics held fixed);
- `alpha_loss`: `-mean(log alpha * (log pi(a|s) + target_entropy))`, target entropy `-scale * |A|`.

Discrete actions (`discrete_terms`, as BenchMARL's discrete SAC): the critics see the group's observations
only and give a value per action, `Q(s, .)`; expectations over the policy replace the sampled actions:
`V'(s') = sum_a pi(a|s') (min_i Q'_i(s', a) - alpha * log pi(a|s'))`, the policy loss
`mean(sum_a pi(a|s) (alpha * log pi(a|s) - min_i Q_i(s, a)))`, the temperature's target entropy a fraction
`discrete_target_entropy` of `log(actions)`; masked actions have probability 0 and count nowhere.
Another group's critic sees a discrete group's stored action as a one-hot, and its next action as the
policy's probabilities.

`loss = critic_loss + policy_loss + alpha_loss`; `alpha` is `exp(log alpha)`, a parameter of its own
stepped by the group's Adam (`learn_alpha`; else it stays at `alpha_init`). Diagnostics: `alpha`,
`q_value`, `td_error`, `entropy` (`-mean log pi`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

from envs.specs import Box, Discrete
from marl.algorithms.base import register
from marl.algorithms.offpolicy import (
    OffPolicy,
    OffPolicyConfig,
    critic_input,
    critic_loss,
    fixed,
    frozen_copy,
    split,
    td_targets,
)
from marl.config import TrainConfig, changed_flags, options_without_effect
from marl.core.distributions import draw_noise
from marl.core.masking import agents_in, inactive_zeroed, masked_mean
from marl.core.models import CriticInput, Policy, QCritic, action_size
from marl.optim.update_step import Trainable, adam

TERMS = ("loss", "critic_loss", "policy_loss", "alpha_loss", "alpha", "q_value", "td_error", "entropy")
TARGET_ENTROPY_OPTIONS = ("target_entropy_scale", "discrete_target_entropy")  # which only learn_alpha uses


@dataclass(frozen=True)
class SACConfig(OffPolicyConfig):
    """MASAC and ISAC: soft actor-critic with twin critics and a learned temperature."""

    algo: Literal["masac", "isac"] = "masac"
    """masac: a centralised critic (every group's observations and actions); isac: each agent's own."""
    # SAC's own defaults, chosen by the time to a return of 0.9 on vmas/navigation (marl/bench/README.md,
    # "Time to a return of 0.9"): with the shared ones (lr 3e-4, tau 0.005, 32 steps of 2048) and alpha 1
    # MASAC stayed at the random policy's return.
    lr: float = 3e-3
    """Adam learning rate of the policies, critics and temperature (SAC's: 10x the shared one; with it and
    256 steps of 256 per iteration MASAC reached a return of 0.9 on vmas/navigation, with 3e-4 not in 600k
    frames)."""
    tau: float = 0.02
    """Polyak factor of the target critics (SAC's: targets that keep up with the faster lr)."""
    batch_size: int = 256
    """Env steps drawn from the buffer per optimiser step (SAC's: a step about 8x cheaper than 2048's, so
    that many steps fit in each iteration)."""
    updates_per_iteration: int = 256
    """Optimiser steps per iteration (SAC's: one per 64 frames of the default 256 x 64 iteration; 128 learned
    slower per frame and in seconds)."""
    alpha_init: float = 0.002
    """The entropy temperature alpha at the start, tuned from there (small: alpha 1 outweighs rewards of
    about 0.01 a step, as navigation's, for thousands of steps)."""
    learn_alpha: bool = True
    """Tune alpha so that the policy's entropy tracks the target entropy; else alpha stays alpha_init."""
    target_entropy_scale: float = 1.0
    """With --learn-alpha, continuous actions: the target entropy is -scale * (action dims)."""
    discrete_target_entropy: float = 0.2
    """With --learn-alpha, discrete actions: the target entropy is this fraction of log(number of actions)."""

    def check(self) -> None:
        super().check()
        if self.alpha_init <= 0:
            raise ValueError(f"alpha_init must be > 0, got {self.alpha_init}")
        if not 0 <= self.discrete_target_entropy <= 1:
            raise ValueError(f"discrete_target_entropy must be in [0, 1], got {self.discrete_target_entropy}")
        given = changed_flags(self, TARGET_ENTROPY_OPTIONS)
        if given and not self.learn_alpha:
            raise options_without_effect(
                given, "the tuning of alpha only; here alpha stays alpha_init", "--learn-alpha"
            )

    def check_groups(self, config: TrainConfig, groups) -> None:
        """The target entropy's options only where a SAC group has the actions each sets it for."""
        sac = {g: spec for g, spec in groups.items() if isinstance(config.for_group(g)[0], SACConfig)}
        for name, continuous in (("target_entropy_scale", True), ("discrete_target_entropy", False)):
            applies = f"the target entropy of {'continuous (Box)' if continuous else 'discrete'} actions only"
            given = changed_flags(self, (name,))
            if given and not any(isinstance(spec.action, Box) == continuous for spec in sac.values()):
                kind = "discrete" if continuous else "continuous (Box)"
                those = f"{config.env.env}'s SAC groups ({', '.join(sac)}) have {kind} actions, and "
                raise options_without_effect(given, applies, None, those)
            for g, overrides in config.group_overrides.items():
                if name in overrides and g in sac and isinstance(sac[g].action, Box) != continuous:
                    given = [f"--group {g}.{name}={overrides[name]}"]
                    its = f"group {g!r} has {type(sac[g].action).__name__} actions, and "
                    raise options_without_effect(given, applies, None, its)

    @classmethod
    def saved(cls, values: dict, algo: str, gru: bool) -> dict:
        # An earlier version also accepted the target entropy without learn_alpha (which it ignored, tuning alpha).
        values = super().saved(values, algo, gru)
        learn = values.get("learn_alpha", True)
        return values if learn else {k: v for k, v in values.items() if k not in TARGET_ENTROPY_OPTIONS}


class Temperature(nn.Module):
    """SAC's entropy temperature, learned as `log alpha` (a 0-d parameter)."""

    def __init__(self, alpha: float) -> None:
        super().__init__()
        self.log_alpha = nn.Parameter(torch.tensor(math.log(alpha)))


@dataclass
class SACLearner:
    """Everything one group learns with."""

    algo: SACConfig
    policy: Policy
    critic: QCritic
    critic_input: CriticInput
    target_critic: QCritic
    temperature: Temperature
    target_entropy: float
    optimizer: torch.optim.Adam

    def modules(self) -> dict[str, nn.Module]:
        return {n: getattr(self, n) for n in ("policy", "critic", "target_critic", "temperature")}


def continuous_terms(
    q: torch.Tensor,
    target: torch.Tensor,
    q_policy: torch.Tensor,
    log_prob: torch.Tensor,
    log_alpha: torch.Tensor,
    target_entropy: float,
    weight: torch.Tensor | None,
    active: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    """SAC's terms for a group with continuous actions: `q` `[k, 2, n]` the twins at the stored actions,
    `target` `[k, n]`, `q_policy` `[k, 2, n]` the (fixed) twins at the policy's actions `a ~ pi(s)`,
    `log_prob` `[k, n]` their log-probability, `log_alpha` 0-d, `weight` `[k]` or None; `active` `[k, n]`
    bool (or None: all) the agent-steps the means are over."""
    alpha = log_alpha.exp().detach()
    policy_loss = masked_mean(alpha * log_prob - q_policy.amin(1), active)
    alpha_loss = -masked_mean(log_alpha * (log_prob.detach() + target_entropy), active)
    entropy = -masked_mean(log_prob.detach(), active)
    return _terms(q, target, policy_loss, alpha_loss, log_alpha, entropy, weight, active)


def discrete_terms(
    q: torch.Tensor,
    target: torch.Tensor,
    q_policy: torch.Tensor,
    log_probs: torch.Tensor,
    mask: torch.Tensor | None,
    log_alpha: torch.Tensor,
    target_entropy: float,
    weight: torch.Tensor | None,
    active: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    """SAC's terms for a group with discrete actions: `q` `[k, 2, n]` the twins at the stored actions,
    `target` `[k, n]`, `q_policy` `[k, 2, n, K]` the (fixed) twins at every action, `log_probs` `[k, n, K]`
    the policy's (masked actions: `mask` False), `log_alpha` 0-d, `weight` `[k]` or None; `active` `[k, n]`
    bool (or None: all) the agent-steps the means are over."""
    alpha = log_alpha.exp().detach()
    probs = log_probs.exp()
    policy_loss = masked_mean(expectation(probs, alpha * log_probs - q_policy.amin(1), mask), active)
    entropy = -expectation(probs, log_probs, mask)  # [k, n]
    alpha_loss = -masked_mean(log_alpha * (target_entropy - entropy.detach()), active)
    return _terms(q, target, policy_loss, alpha_loss, log_alpha, masked_mean(entropy.detach(), active), weight, active)


def _terms(q, target, policy_loss, alpha_loss, log_alpha, entropy, weight, active) -> dict[str, torch.Tensor]:
    value_loss = critic_loss(q, target, weight, active)
    q_value = q.detach().mean() if active is None else masked_mean(q.detach(), active.unsqueeze(1))
    return {
        "loss": value_loss + policy_loss + alpha_loss,
        "critic_loss": value_loss,
        "policy_loss": policy_loss,
        "alpha_loss": alpha_loss,
        "alpha": log_alpha.detach().exp(),
        "q_value": q_value,
        "td_error": masked_mean((q.detach().mean(1) - target).abs(), active),
        "entropy": entropy,
    }


def expectation(probs: torch.Tensor, values: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """`sum_a pi(a) * values(a)` over the last dim, masked actions counting 0. Their values are zeroed
    first: with a log-probability of the float minimum a value can be infinite, and 0 * inf, even
    where it is not selected, makes the gradients NaN."""
    if mask is not None:
        values = torch.where(mask, values, 0.0)
    return (probs * values).sum(-1)


@register("masac", "isac")
class SAC(OffPolicy):
    """MASAC or ISAC for every group at once, by each group's critic scope."""

    Config = SACConfig
    term_names = TERMS
    squashed = True

    def check_group(self, group: str, spec) -> None:
        if not isinstance(spec.action, (Box, Discrete)):
            raise ValueError(
                f"{self.config.for_group(group)[0].algo} trains groups with Box or Discrete actions, but group "
                f"{group!r} has {spec.action}: use mappo or ippo for it, or a value-based algorithm "
                f"(--group {group}.algo=iql, vdn or qmix)"
            )

    def __init__(
        self, config: TrainConfig, env, device: torch.device, world, generator: torch.Generator, groups=None
    ) -> None:
        super().__init__(config, env, device, world, generator, groups)
        # A continuous group's critics see every group's actions in their scope (other algorithms' groups
        # too); a discrete group's see observations only and value every action.
        action_sizes = {g: action_size(spec) for g, spec in env.groups.items()}
        self.learners: dict[str, SACLearner] = {}
        for g, spec in self.groups.items():
            algo, model = config.for_group(g)
            policy = Policy(spec, model.hidden, model.activation, model.share_params, model.log_std_init, model.std)
            continuous = isinstance(spec.action, Box)
            seen = critic_input(config, env, g, action_sizes if continuous else {})
            critic = QCritic(
                seen.size,
                1 if continuous else spec.action.n,
                spec.n_agents,
                model.hidden,
                model.activation,
                model.share_params,
                twins=2,
                shared_value=seen.shared_value,
                agent_ids=seen.agent_ids,
            )
            policy, critic = policy.to(device), critic.to(device)
            # Without learn_alpha the temperature is no parameter of the optimiser: alpha stays alpha_init.
            temperature = Temperature(algo.alpha_init).to(device).requires_grad_(algo.learn_alpha)
            if continuous:
                target_entropy = -algo.target_entropy_scale * action_size(spec)
            else:
                target_entropy = algo.discrete_target_entropy * math.log(spec.action.n)
            parameters = [
                *policy.parameters(),
                *critic.parameters(),
                *(temperature.parameters() if algo.learn_alpha else ()),
            ]
            optimizer = adam(parameters, lr=algo.lr, eps=algo.adam_eps)
            self.learners[g] = SACLearner(
                algo, policy, critic, seen, frozen_copy(critic), temperature, target_entropy, optimizer
            )
        self.targets = {
            g: (list(lr.target_critic.parameters()), list(lr.critic.parameters())) for g, lr in self.learners.items()
        }
        self.trainables = {
            g: Trainable(
                {
                    "policy": lr.policy,
                    "critic": lr.critic,
                    **({"alpha": lr.temperature} if lr.algo.learn_alpha else {}),
                },
                lr.optimizer,
                lr.algo.max_grad_norm,
            )
            for g, lr in self.learners.items()
        }
        self._build_step()

    def draw_noise(
        self, steps: int, batch_size: int, generator: torch.Generator | None = None
    ) -> dict[str, torch.Tensor]:
        """Per continuous group `[steps, 2, batch_size, n, A]`: each step's actions at `s` and at `s'`."""
        generator = self.generator if generator is None else generator
        return {
            g: draw_noise(spec.action, (steps, 2, batch_size, spec.n_agents), generator, self.device)
            for g, spec in self.groups.items()
            if isinstance(spec.action, Box)
        }

    def next_actions(self, batch, noise, t):
        """Each group's policy at s' (without gradients): the sampled actions' features and
        log-probabilities (continuous), or the probabilities and log-probabilities (discrete)."""
        after = {}
        with torch.no_grad():
            for g, lr in self.learners.items():
                data = batch[g]
                next_dist = lr.policy(data["next_observation"], data.get("next_action_mask"))
                if g in noise:
                    next_raw = next_dist.sample(_step_noise(noise[g], t)[1])
                    after[g] = (torch.tanh(next_raw), next_dist.log_prob(next_raw))
                else:
                    after[g] = (next_dist.log_probs.exp(), next_dist.log_probs)
        return after

    def losses(self, batch, weight, noise, t, after, storage, index):
        groups = self.env.groups
        obs, next_obs, state, next_state = split(batch, groups)
        active, next_active = agents_in(batch, groups), agents_in(batch, groups, next=True)
        stored = self.stored_actions(batch)
        # Each group's policy at s (with gradients): the actions' features and log-probabilities
        # (continuous), or the log-probabilities (discrete).
        now = {}
        for g, lr in self.learners.items():
            dist = lr.policy(obs[g], batch[g].get("action_mask"))
            if g in noise:
                raw = dist.sample(_step_noise(noise[g], t)[0])
                now[g] = (torch.tanh(raw), dist.log_prob(raw))
            else:
                now[g] = (None, dist.log_probs)
        next_actions = {g: features for g, (features, _) in after.items()}
        total, terms, priority = 0.0, {}, {}
        for g, lr in self.learners.items():
            data, log_alpha = batch[g], lr.temperature.log_alpha
            alpha = log_alpha.detach().exp()
            next_features, next_log_prob = after[g]
            continuous = g in noise
            with torch.no_grad():
                next_x = lr.critic_input(next_obs, next_state, next_actions, next_active)
                next_q = lr.target_critic(next_x).amin(1)  # [k, n, out]
                if continuous:
                    next_value = next_q[..., 0] - alpha * next_log_prob
                else:
                    next_value = expectation(
                        next_features, next_q - alpha * next_log_prob, data.get("next_action_mask")
                    )
                target = td_targets(data["reward"], data["terminated"], next_value, lr.algo.gamma)
            q_all = lr.critic(lr.critic_input(obs, state, stored, active))  # [k, 2, n, out]
            if continuous:
                q = q_all[..., 0]
                own, log_prob = now[g]
                q_policy = fixed(lr.critic, lr.critic_input(obs, state, {**stored, g: own}, active))[..., 0]
                group_terms = continuous_terms(
                    q, target, q_policy, log_prob, log_alpha, lr.target_entropy, weight, data.get("active")
                )
            else:
                action = data["action"].unsqueeze(1).expand(-1, 2, -1).unsqueeze(-1)  # [k, 2, n, 1]
                q = q_all.gather(-1, action)[..., 0]
                # The critics see no actions here: their values at every action, held fixed, are q_all's.
                group_terms = discrete_terms(
                    q,
                    target,
                    q_all.detach(),
                    now[g][1],
                    data.get("action_mask"),
                    log_alpha,
                    lr.target_entropy,
                    weight,
                    data.get("active"),
                )
            total = total + group_terms["loss"]
            terms[g] = torch.stack([group_terms[name].detach() for name in TERMS])
            priority[g] = inactive_zeroed((q.detach().mean(1) - target).abs(), data.get("active"))
        return total, terms, priority


def _step_noise(noise: torch.Tensor, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Step `t`'s noise of a group `[steps, 2, k, n, A]`: for the actions at s and at s', `[k, n, A]` each."""
    current, after = noise.index_select(0, t).squeeze(0).unbind(0)
    return current, after

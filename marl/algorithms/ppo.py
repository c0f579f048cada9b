"""PPO, one algorithm for MAPPO and IPPO: they differ only in what each group's critic sees (its scope,
`marl.core.models.CriticInput`).

Per iteration: the critics' values of the rollout's observations and of its true next observations, GAE
(`kernels.gae`) per group, then `epochs` passes over the `T * B` frames in shuffled minibatches, every
group stepped in the same minibatch step (`marl.optim.update_step`). Each group has its own policy,
critic, Adam and (with `--group` overrides) hyper-parameters.

`ppo_loss` is a pure function of tensors shaped `[M, n]` (M samples of a group's n agents), so it can
be checked by hand. Its means are over the active agent-steps only where the group's agents may leave
mid-episode (`active` `[M, n]`, `marl.core.masking`; the advantages normalised over those too), over every
entry else; there a centralised critic reads a departed agent's observation as zeros (`CriticInput`), in
the values of the steps and of their next observations alike. It returns the named terms and diagnostics:

- `policy_loss`: clipped surrogate, `-mean(min(r * A, clip(r, 1 - eps, 1 + eps) * A))`;
- `value_loss`: `0.5 * mean((V - target)^2)`, or with `clip_value` the max of that and the clipped
  version `V_old + clip(V - V_old, -eps, eps)` (as in the PPO reference implementations);
- `entropy_loss`: `-entropy_coef * mean(entropy)`;
- `loss = policy_loss + entropy_loss + value_coef * value_loss`;
- diagnostics (no gradient): `approx_kl` (`mean((r - 1) - log r)`), `clip_fraction`, `entropy`.

Its two parts, `policy_terms` and `value_terms` (`combined_terms` joins them), let the policies and the
critics be stepped apart: with `overlap_critic` the critics' steps run on a second thread while the next
batch is collected (`PPO._update_apart`).

Recurrent nets (`--model gru`): minibatches are whole chunks of `chunk_length` steps of one env (the
rollout cut in `T / chunk_length` per env, shuffled), each run from the hidden state stored when it was
collected (the policy's by the collector, the critic's by `advantages`, which runs the critic over the
rollout), zeroed where an episode starts (`is_init`); optionally after `burn_in` steps before the chunk,
run without a loss from the state stored there. So on the first epoch the policy recomputes exactly the
log-probabilities it acted with.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar, Literal

import torch
from tensordict import TensorDict

import kernels
from marl.algorithms.base import Algorithm, register
from marl.config import AlgorithmConfig, TrainConfig
from marl.core.distributions import Distribution
from marl.core.masking import agents_in, masked_mean, masked_moments, masked_var, standardized
from marl.core.models import Critic, CriticInput, Policy, flat_observation
from marl.core.networks import MultiAgentGRU
from marl.core.rollout import Acting, observations
from marl.optim.background import Background
from marl.optim.update_step import Trainable, UpdateStep, adam

LOSS_TERMS = ("loss", "policy_loss", "value_loss", "entropy_loss", "approx_kl", "clip_fraction", "entropy")
# What the update reads of a group's rollout.
UPDATE_KEYS = ("observation", "action_mask", "active", "action", "log_prob", "advantage", "old_value", "value_target")
CRITIC_KEYS = ("observation", "active", "old_value", "value_target")  # what a critic's step reads of a group's batch
NETS = ("policy", "critic")  # a group's nets, in its optimiser's order
# With recurrent nets, what a chunk holds once (not per step): its starting states, and whether its burn-in
# steps lie in the rollout.
PER_CHUNK = ("hidden0", "burn_hidden0", "critic_hidden0", "burn_critic_hidden0", "burn_valid")


@dataclass(frozen=True)
class PPOConfig(AlgorithmConfig):
    """PPO's options: one clipped loss for MAPPO and IPPO, which differ in what the critic sees."""

    algo: Literal["mappo", "ippo"] = "mappo"
    """mappo: a centralised critic (critic_scope auto = global: every group's observations, or the env's
    state); ippo: each agent's critic sees its own observation."""
    critic_scope: Literal["auto", "agent", "group", "global"] = "auto"
    """What the critic sees: agent (IPPO), group (MAPPO), global (every group, or the env's state)."""
    shared_value: bool = False
    """With a centralised critic, one value per env for the whole group (TorchRL's and BenchMARL's
    MAPPO critic) instead of one per agent: n times less critic work, sound when the agents share a reward."""
    lr: float = 1e-3
    """Adam learning rate of the policy and the critic."""
    lr_schedule: Literal["constant", "linear"] = "constant"
    """constant, or linear: annealed from lr to 0 over the schedules' frames (--schedule-frames, else total_frames;
    set at each iteration)."""
    adam_eps: float = 1e-5
    """Adam's epsilon (added to the root of the second moment): with small, unnormalised advantages it damps updates."""
    gamma: float = 0.99
    """Discount factor."""
    lmbda: float = 0.95
    """GAE lambda."""
    epochs: int = 4
    """PPO epochs over each rollout."""
    minibatch_size: int = 4096
    """Frames (env steps, all agents of the group) per minibatch; at most num_envs * rollout_length. Each
    epoch shuffles the iteration's frames into frames // minibatch_size minibatches; a remainder sits
    that epoch out (other frames each epoch)."""
    clip_eps: float = 0.2
    """PPO ratio clip."""
    clip_value: bool = True
    """Clip the value update around the rollout's values with the same clip_eps."""
    entropy_coef: float = 0.0
    """Weight of the entropy bonus."""
    value_coef: float = 0.5
    """Weight of the value loss."""
    max_grad_norm: float = 1.0
    """Clip the gradient norm of each group's policy, and of its critic, to this (0 disables clipping;
    the group's logged gradient norms then read nan: they are measured by the clipping)."""
    normalize_advantage: bool = True
    """Normalise each group's advantages per minibatch (one of a single value is left as it is)."""
    normalize_value: bool = True
    """Train the critic on value targets normalised by their running mean and std (MAPPO's value
    normalisation), so that rewards of any scale learn alike."""
    overlap_critic: bool = False
    """With --compile, on the CPU, in one process: update the policies, then start the critics' update on
    a second thread while the next batch is collected (it needs only the updated policies), one of
    torch's intra-op threads each; the critics' remaining steps then run on all threads. The same update
    in the same order, but not bit-reproducible: where the critics' steps change threads depends on
    timing, and one and two threads round differently. Pays where collecting leaves a core idle (VMAS,
    PettingZoo: the simulator steps in Python) and the critics are much of the update (IPPO at BenchMARL's
    settings; MAPPO there, with its one small critic, runs slower). collect_s then holds the collection
    beside the critics' steps."""

    chunk_length: int = 16
    """With --model gru: the rollout is cut into chunks of this many steps of one env, each trained from
    the hidden state it was collected with, minibatch_size // chunk_length chunks per minibatch (gradients
    flow back through a chunk's steps). Must divide rollout_length. (iql, vdn, qmix: each optimiser step
    draws batch_size // chunk_length chunks of this many consecutive steps of one env from the replay buffer.)"""
    burn_in: int = 0
    """With --model gru: steps before each chunk run through the GRU, without a loss, from the state stored
    there, to refresh the chunk's starting state for the current weights (a chunk fewer steps into the
    rollout starts from its stored state; iql, vdn, qmix: their chunks are drawn with their burn-in steps)."""

    # Every group is updated in the same minibatch steps (overlapped or not).
    anneal_options = "--lr-schedule linear"
    run_wide = ("epochs", "minibatch_size", "overlap_critic", "chunk_length", "burn_in")
    recurrent: ClassVar[bool] = True
    recurrent_options = ("chunk_length", "burn_in")

    def check(self) -> None:
        for name in ("gamma", "lmbda"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"{name} must be in [0, 1], got {getattr(self, name)}")
        for name in ("lr", "adam_eps", "clip_eps"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        for name in ("entropy_coef", "value_coef", "max_grad_norm"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.shared_value and self.scope() == "agent":
            raise ValueError("shared_value needs a centralised critic: algo mappo, or critic_scope group or global")
        if self.epochs < 1 or self.minibatch_size < 1:
            raise ValueError(f"epochs and minibatch_size must be >= 1, got {self.epochs}, {self.minibatch_size}")
        if self.chunk_length < 1 or self.burn_in < 0:
            raise ValueError(f"chunk_length must be >= 1 and burn_in >= 0, got {self.chunk_length}, {self.burn_in}")

    def annealed(self) -> tuple[str, ...]:
        return ("lr",) if self.lr_schedule == "linear" else ()

    def check_train(self, config: TrainConfig) -> None:
        if self.overlap_critic and not config.run.compile:
            raise ValueError(
                "overlap_critic needs compile: the critics' update runs apart from the policies' as the compiled "
                "update's steps (pass --compile too)"
            )
        frames_per_iteration = config.env.num_envs * config.run.rollout_length
        if self.minibatch_size > frames_per_iteration:
            raise ValueError(
                f"minibatch_size={self.minibatch_size} is larger than an iteration's "
                f"num_envs * rollout_length = {frames_per_iteration} frames: pass --minibatch-size "
                f"{frames_per_iteration // 4} (4 minibatches per epoch), or more envs or a longer rollout"
            )
        if config.uses_gru():
            self._check_sequences(config)
        linear = [self.lr_schedule, *(o.get("lr_schedule") for o in config.group_overrides.values())]
        span, total = config.run.schedule_span(), config.run.total_frames
        if "linear" in linear and total > span:
            raise ValueError(
                f"--lr-schedule linear anneals lr to 0 over --schedule-frames {span:,} (a resumed run keeps its "
                f"schedules' length): from there to --total-frames {total:,} PPO would not learn; pass "
                f"--schedule-frames {total:,} to anneal lr over the whole run, or a --total-frames of {span:,} or less"
            )

    def _check_sequences(self, config: TrainConfig) -> None:
        T = config.run.rollout_length
        if T % self.chunk_length:
            raise ValueError(
                f"--model gru: chunk_length ({self.chunk_length}) must divide rollout_length ({T}): pass a "
                f"--chunk-length that does, e.g. {math.gcd(T, self.chunk_length)}"
            )
        if self.minibatch_size < self.chunk_length:
            raise ValueError(
                f"--model gru: a minibatch holds whole chunks; minibatch_size ({self.minibatch_size}) is less than "
                f"one chunk (chunk_length {self.chunk_length})"
            )
        if self.burn_in > T - self.chunk_length:
            # A chunk burns in only where its burn-in steps lie in the rollout: none would past this.
            raise ValueError(
                f"--model gru: burn_in ({self.burn_in}) must be at most rollout_length - chunk_length ({T} - "
                f"{self.chunk_length} = {T - self.chunk_length}): only chunks at least burn_in steps into the rollout "
                "burn in; pass a smaller --burn-in, or a longer --rollout-length"
            )
        if self.overlap_critic:
            raise ValueError("--model gru: overlap_critic is not supported with recurrent nets; drop --overlap-critic")

    def scope(self) -> str:
        if self.critic_scope != "auto":
            return self.critic_scope
        return "agent" if self.algo == "ippo" else "global"


def ppo_loss(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantage: torch.Tensor,
    value: torch.Tensor,
    old_value: torch.Tensor,
    value_target: torch.Tensor,
    entropy: torch.Tensor,
    *,
    clip_eps: float,
    clip_value: bool,
    entropy_coef: float,
    value_coef: float,
    normalize_advantage: bool,
    active: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    """PPO's loss terms for one group's minibatch; every tensor is `[M, n]`, `active` (bool, or None: every
    entry counts) the agent-steps its means are over."""
    policy = policy_terms(
        log_prob,
        old_log_prob,
        advantage,
        entropy,
        clip_eps=clip_eps,
        entropy_coef=entropy_coef,
        normalize_advantage=normalize_advantage,
        active=active,
    )
    value = value_terms(
        value, old_value, value_target, clip_eps=clip_eps, clip_value=clip_value, value_coef=value_coef, active=active
    )
    return combined_terms(policy, value)


def combined_terms(policy: dict[str, torch.Tensor], value: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`ppo_loss`'s terms from its two parts: the policy's terms, the critic's `value_loss`, and `loss`
    the sum of their shares."""
    return {**policy, "loss": policy["loss"] + value["loss"], "value_loss": value["value_loss"]}


def policy_terms(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantage: torch.Tensor,
    entropy: torch.Tensor,
    *,
    clip_eps: float,
    entropy_coef: float,
    normalize_advantage: bool,
    active: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    """The policy's part of `ppo_loss`: its terms with `value_loss` 0 and `loss` the policy's share
    (`policy_loss + entropy_loss`), for an update that steps the policy apart from the critic."""
    # One value (a minibatch of one frame of a one-agent group) has no spread to divide by: its std is NaN.
    if normalize_advantage and advantage.numel() > 1:
        advantage = standardized(advantage, active)
    log_ratio = log_prob - old_log_prob
    ratio = log_ratio.exp()
    surrogate = torch.minimum(ratio * advantage, ratio.clamp(1 - clip_eps, 1 + clip_eps) * advantage)
    policy_loss = -masked_mean(surrogate, active)
    mean_entropy = masked_mean(entropy, active)
    entropy_loss = -entropy_coef * mean_entropy
    with torch.no_grad():
        approx_kl = masked_mean((ratio - 1) - log_ratio, active)
        clip_fraction = masked_mean(((ratio - 1).abs() > clip_eps).float(), active)
    return {
        "loss": policy_loss + entropy_loss,
        "policy_loss": policy_loss,
        "value_loss": torch.zeros_like(policy_loss),
        "entropy_loss": entropy_loss,
        "approx_kl": approx_kl,
        "clip_fraction": clip_fraction,
        "entropy": mean_entropy.detach(),
    }


def value_terms(
    value: torch.Tensor,
    old_value: torch.Tensor,
    value_target: torch.Tensor,
    *,
    clip_eps: float,
    clip_value: bool,
    value_coef: float,
    active: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    """The critic's part of `ppo_loss`: `value_loss`, `loss` its share (`value_coef * value_loss`), and
    every policy term 0, for an update that steps the critic apart from the policy."""
    value_error = (value - value_target).square()
    if clip_value:
        clipped = old_value + (value - old_value).clamp(-clip_eps, clip_eps)
        value_error = torch.maximum(value_error, (clipped - value_target).square())
    value_loss = 0.5 * masked_mean(value_error, active)
    zero = torch.zeros_like(value_loss)
    return {
        "loss": value_coef * value_loss,
        "policy_loss": zero,
        "value_loss": value_loss,
        "entropy_loss": zero,
        "approx_kl": zero,
        "clip_fraction": zero,
        "entropy": zero,
    }


def explained_variance(value: torch.Tensor, target: torch.Tensor, active: torch.Tensor | None = None) -> torch.Tensor:
    """`1 - Var(target - value) / Var(target)`: 1 is a perfect critic, 0 no better than a constant (over the
    `active` entries where given)."""
    if active is None:
        return 1 - (target - value).var() / target.var().clamp_min(1e-8)
    return 1 - masked_var(target - value, active) / masked_var(target, active).clamp_min(1e-8)


@dataclass
class Learner:
    """Everything one group learns with."""

    algo: PPOConfig
    policy: Policy
    critic: Critic
    critic_input: CriticInput
    optimizer: torch.optim.Adam

    def parameters(self) -> list[torch.nn.Parameter]:
        return [*self.policy.parameters(), *self.critic.parameters()]


def linear_lr_factors(learners: Mapping[str, Learner], frames: int, total_frames: int) -> dict[str, float]:
    """`1 - progress` (frames over the schedules' frames, at most 1) for each group with `lr_schedule` linear:
    the factor of its lr now."""
    progress = min(frames / total_frames, 1.0)
    return {g: 1.0 - progress for g, learner in learners.items() if learner.algo.lr_schedule == "linear"}


def build_policies(config: TrainConfig, env, device: torch.device) -> dict[str, Policy]:
    """Every group's policy, built before any critic (the order the networks draw their initial weights)."""
    policies = {}
    for group, spec in env.groups.items():
        _, model = config.for_group(group)
        gru = model.gru_hidden if model.recurrent("policy") else None
        policies[group] = Policy(
            spec, model.hidden, model.activation, model.share_params, model.log_std_init, model.std, gru
        )
    return {g: p.to(device) for g, p in policies.items()}


@register("mappo", "ippo")
class PPO(Algorithm):
    """PPO for every group at once; MAPPO or IPPO by each group's critic scope."""

    Config = PPOConfig

    def __init__(self, config: TrainConfig, env, device: torch.device, world, generator: torch.Generator) -> None:
        super().__init__(config, env, device, world, generator)
        state_size = math.prod(env.state_spec.shape) if env.state_spec is not None else None
        policies = build_policies(config, env, device)
        self.learners: dict[str, Learner] = {}
        for group, spec in env.groups.items():
            algo, model = config.for_group(group)
            critic_input = CriticInput(
                algo.scope(), group, env.groups, state_size, agent_id=model.share_params, shared_value=algo.shared_value
            )
            critic = Critic(
                critic_input.size,
                spec.n_agents,
                model.hidden,
                model.activation,
                model.share_params,
                algo.normalize_value,
                shared_value=critic_input.shared_value,
                gru_hidden=model.gru_hidden if model.recurrent("critic") else None,
                agent_ids=critic_input.agent_ids,
            ).to(device)
            policy = policies[group]
            optimizer = adam([*policy.parameters(), *critic.parameters()], lr=algo.lr, eps=algo.adam_eps)
            self.learners[group] = Learner(algo, policy, critic, critic_input, optimizer)
        # Recurrent nets train on chunks of time; a recurrent critic's state is carried from one rollout to
        # the next per env (`advantages`), as the collector carries the policies'.
        self.sequences = any(lr.policy.gru or lr.critic.gru for lr in self.learners.values())
        self.critic_hidden = {
            g: torch.zeros(env.num_envs, lr.critic.gru.n_agents, lr.critic.gru.hidden_size, device=device)
            for g, lr in self.learners.items()
            if lr.critic.gru is not None
        }
        trainables = {
            g: Trainable({"policy": lr.policy, "critic": lr.critic}, lr.optimizer, lr.algo.max_grad_norm)
            for g, lr in self.learners.items()
        }
        if not self.overlaps:
            self.step = UpdateStep(trainables, self._minibatch_loss, device, world, compile=config.run.compile)
            return
        # overlap_critic: the policies' and the critics' steps apart, the critics' on a second thread while
        # the next batch is collected (`_update_apart`).
        if device.type != "cpu" or world.size != 1:
            raise ValueError(
                "overlap_critic runs on the CPU in one process, where collecting leaves a core idle; this run "
                f"is on {device} with {world.size} rank(s)"
            )
        loss = self._minibatch_loss
        self.policy_step = UpdateStep(trainables, loss, device, world, compile=True, nets=("policy",))
        self.critic_step = UpdateStep(trainables, loss, device, world, compile=True, nets=("critic",), cpp_wrapper=True)

    @property
    def acting(self) -> Acting:
        hidden = {
            g: (lr.policy.gru.n_agents, lr.policy.gru.hidden_size)
            for g, lr in self.learners.items()
            if lr.policy.gru is not None
        }
        policies = {g: lr.policy for g, lr in self.learners.items()}
        return Acting(policies, log_prob=True, hidden=hidden, episode_starts=self.sequences)

    @property
    def overlaps(self) -> bool:
        """With `overlap_critic`: the update collects the next batch beside the critics' steps."""
        return self.config.algo.overlap_critic

    def schedules(self, frames: int, total_frames: int) -> dict[str, float]:
        """With `lr_schedule` linear: lr * (1 - progress), progress by frames so far."""
        factors = linear_lr_factors(self.learners, frames, total_frames)
        return {f"{g} lr": self.learners[g].algo.lr * factor for g, factor in factors.items()}

    def begin_iteration(self, frames: int, total_frames: int) -> None:
        for g, factor in linear_lr_factors(self.learners, frames, total_frames).items():
            learner = self.learners[g]
            for group in learner.optimizer.param_groups:
                group["lr"] = learner.algo.lr * factor

    def update(self, batch: TensorDict, timer) -> dict[str, dict[str, torch.Tensor]]:
        explained = self.advantages(batch)
        timer.mark("advantages_s")
        terms = self.epochs(batch, timer)
        return {g: {"explained_variance": explained[g], **terms[g]} for g in self.learners}

    @torch.no_grad()
    def advantages(self, batch: TensorDict) -> dict[str, torch.Tensor]:
        """Values of the observations and of the true next observations, then GAE, written into `batch`
        (`value`, `advantage`, `value_target`, `[T, B, n]` in reward units); the critics' running moments
        take the targets in. `old_value` `[T, B, n]` is `value` in the critic's normalised units of before
        that: the prediction the critic made, the centre of the value clip. Returns each group's explained
        variance."""
        groups = list(self.env.groups)
        obs, state = observations(batch, groups)
        next_obs, next_state = observations(batch, groups, next=True)
        active, next_active = agents_in(batch, groups), agents_in(batch, groups, next=True)
        explained = {}
        for g, learner in self.learners.items():
            critic, data = learner.critic, batch[g]
            x = learner.critic_input(obs, state, active=active)
            next_x = learner.critic_input(next_obs, next_state, active=next_active)
            if critic.gru is None:
                value, next_value = critic.value(x), critic.value(next_x)  # [T, B, n]
            else:
                value, next_value, started, last = critic.rollout_values(
                    x, next_x, self.critic_hidden[g], batch["is_init"]
                )
                value, next_value = critic.denormalize(value), critic.denormalize(next_value)
                data["critic_hidden"] = started  # [T, B, m, h]
                self.critic_hidden[g].copy_(last)  # the next rollout's first step zeroes it where is_init
            advantage, target = kernels.gae(
                data["reward"],
                value,
                next_value,
                data["done"],
                data["terminated"],
                gamma=learner.algo.gamma,
                lmbda=learner.algo.lmbda,
            )
            # Normalised before the moments take the targets in: in the new moments the clip's centre lay
            # away from the critic's output (on the first iteration by the targets' mean over their std).
            old_value = critic.normalize_values(value)
            data.update({"value": value, "old_value": old_value, "advantage": advantage, "value_target": target})
            # A departed agent's targets (0 at each of its steps) stay out of the moments and the diagnostic.
            in_group = data.get("active", None)
            learner.critic.update_moments(*self.world.sum(masked_moments(target, in_group)))
            explained[g] = explained_variance(value, target, in_group)
        return explained

    def update_inputs(
        self, batch: TensorDict, flatten: bool = True
    ) -> tuple[dict[str, dict[str, torch.Tensor]], torch.Tensor | None]:
        """What the update reads of `batch`: per group its `UPDATE_KEYS` as plain tensors `[T * B, ...]`
        (a minibatch gather and the loss then compile into one graph), values and targets in the critic's
        normalised units (the targets in its moments as they are for the update, `old_value` as `advantages`
        wrote it); and the state `[T * B, ...]` or None.
        Without `flatten`: `[T, B, ...]`, with the stored hidden states of recurrent nets too."""
        keys = UPDATE_KEYS if flatten else (*UPDATE_KEYS, "hidden", "critic_hidden")
        flat = {g: {k: v for k, v in batch[g].items() if k in keys} for g in self.learners}
        for g, data in flat.items():
            critic = self.learners[g].critic
            data["value_target"] = critic.normalize_values(data["value_target"])
            if flatten:
                flat[g] = {k: v.flatten(0, 1) for k, v in data.items()}
        state = batch["state"] if "state" in batch.keys() else None
        return flat, state.flatten(0, 1) if flatten and state is not None else state

    def sequence_inputs(self, batch: TensorDict) -> tuple[dict[str, dict[str, torch.Tensor]], torch.Tensor | None]:
        """`update_inputs` for recurrent nets: per group its time-indexed keys as windows `[C, W, ...]`
        (chunk c = k * B + e is env e's steps from k * chunk_length - burn_in, W = burn_in + chunk_length;
        steps before the rollout's first are its first, and not used) with `reset` (`is_init`), and
        `PER_CHUNK`'s `[C, ...]`: the stored states at the chunk's and at its burn-in's start, and whether
        its burn-in lies in the rollout. The state `[C, W, ...]` or None."""
        algo = self.config.algo
        flat, state = self.update_inputs(batch, flatten=False)
        return chunk_windows(flat, state, batch["is_init"], algo.chunk_length, algo.burn_in)

    def epochs(self, batch: TensorDict, timer=None) -> dict[str, dict[str, torch.Tensor]]:
        """`epochs` passes of minibatch steps; each group's loss terms and gradient norms, averaged."""
        algo = self.config.algo
        if self.sequences:  # the samples shuffled are whole chunks
            flat, state = self.sequence_inputs(batch)
            samples, size = batch.batch_size.numel() // algo.chunk_length, algo.minibatch_size // algo.chunk_length
        else:  # frames
            flat, state = self.update_inputs(batch)
            samples, size = batch.batch_size.numel(), algo.minibatch_size
        count = samples // size
        sums = {g: torch.zeros(len(LOSS_TERMS) + 2, device=self.device) for g in flat}
        orders = [torch.randperm(samples, generator=self.generator, device=self.device) for _ in range(algo.epochs)]
        if self.overlaps:
            minibatches = [order[k * size : (k + 1) * size] for order in orders for k in range(count)]
            self._update_apart(flat, state, minibatches, sums, timer)
        else:
            for order in orders:
                if self.config.run.compile:  # the gather by index stays in the compiled graph
                    data, data_state = flat, state
                    minibatches = [order[k * size : (k + 1) * size] for k in range(count)]
                else:
                    # Eagerly, one gather per tensor shuffles the epoch's frames and each minibatch is a
                    # slice (a view): a few ops, not a gather per tensor per minibatch.
                    data = {g: {k: v[order] for k, v in tensors.items()} for g, tensors in flat.items()}
                    data_state = state[order] if state is not None else None
                    minibatches = [slice(k * size, (k + 1) * size) for k in range(count)]
                for index in minibatches:
                    _add(sums, self.step(data, data_state, index))
        names = (*LOSS_TERMS, "policy_grad_norm", "critic_grad_norm")
        return {g: dict(zip(names, (vector / (algo.epochs * count)).unbind())) for g, vector in sums.items()}

    def _update_apart(self, flat, state, minibatches: list[torch.Tensor], sums, timer) -> None:
        """`overlap_critic`: the policies' minibatch steps, then the critics' (the same minibatches). When
        the run loop has a next batch to collect (`collect_ahead`), the critics' steps start on a second
        thread while this one collects it (one intra-op thread each); once it is in, this thread takes the
        rest of them on all its threads. The timer marks the policies' and the rest of the critics' steps
        as `update_s`, the collection with the critics' steps beside it as `collect_s`."""
        for index in minibatches:
            _add(sums, self.policy_step(flat, state, index))
        if timer is not None:
            timer.mark("update_s")
        # The next collection overwrites the batch that `flat` views: the critics read copies.
        critic_flat = {g: {k: data[k].clone() for k in CRITIC_KEYS if k in data} for g, data in flat.items()}
        critic_state = state.clone() if state is not None else None
        done = 0  # critic steps taken

        def critic_steps(stop: threading.Event) -> None:
            nonlocal done
            while done < len(minibatches) and not stop.is_set():
                _add(sums, self.critic_step(critic_flat, critic_state, minibatches[done]))
                done += 1

        if self.collect_ahead is not None:
            with Background(critic_steps) as background:
                self.collect_ahead()
                background.stop.set()  # after its current step, the rest are taken here, on every thread
            if timer is not None:
                timer.mark("collect_s")
        for index in minibatches[done:]:
            _add(sums, self.critic_step(critic_flat, critic_state, index))

    def _minibatch_loss(
        self,
        flat: dict[str, dict[str, torch.Tensor]],
        state: torch.Tensor | None,
        index: torch.Tensor | slice,
        nets: tuple[str, ...] = NETS,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The sum of every group's PPO loss on the frames `index` of the flattened rollout (with recurrent
        nets: the chunks `index` of `sequence_inputs`), and per group its `LOSS_TERMS`, detached, as one
        vector. With `nets` one of `NETS`, only that net's part (`policy_terms` / `value_terms`; the
        other's terms 0), which only it runs."""
        batch = {g: {k: v[index] for k, v in data.items()} for g, data in flat.items()}
        state = state[index] if state is not None else None
        burn_in = 0
        if self.sequences:  # windows [M, W, ...] made time-major [W, M, ...]; the loss on the last L steps
            burn_in = self.config.algo.burn_in
            batch = {g: {k: v if k in PER_CHUNK else v.transpose(0, 1) for k, v in d.items()} for g, d in batch.items()}
            state = state.transpose(0, 1) if state is not None else None
        obs, active = {g: data["observation"] for g, data in batch.items()}, agents_in(batch, batch)
        total, terms = 0.0, {}
        for g, learner in self.learners.items():
            data, a = batch[g], learner.algo
            main = {k: v[burn_in:] for k, v in data.items() if k not in PER_CHUNK} if burn_in else data
            parts = []
            if "policy" in nets:
                dist = self._policy(learner, data, burn_in)
                parts.append(
                    policy_terms(
                        dist.log_prob(main["action"]),
                        main["log_prob"],
                        main["advantage"],
                        dist.entropy(),
                        clip_eps=a.clip_eps,
                        entropy_coef=a.entropy_coef,
                        normalize_advantage=a.normalize_advantage,
                        active=main.get("active"),
                    )
                )
            if "critic" in nets:
                parts.append(
                    value_terms(
                        self._value(learner, data, obs, state, active, burn_in),  # normalised units, as the next two
                        main["old_value"],
                        main["value_target"],
                        clip_eps=a.clip_eps,
                        clip_value=a.clip_value,
                        value_coef=a.value_coef,
                        active=main.get("active"),
                    )
                )
            group_terms = parts[0] if len(parts) == 1 else combined_terms(*parts)
            total = total + group_terms["loss"]
            terms[g] = torch.stack([group_terms[name].detach() for name in LOSS_TERMS])
        return total, terms

    def _policy(self, learner: Learner, data: dict[str, torch.Tensor], burn_in: int) -> Distribution:
        """The policy's distributions of a minibatch's frames, or of its chunks' steps after `burn_in`
        (a recurrent policy runs from each chunk's stored state, refreshed by the burn-in steps)."""
        policy, observation, mask = learner.policy, data["observation"], data.get("action_mask")
        if policy.gru is None:
            return policy(observation[burn_in:], mask[burn_in:] if mask is not None else None)
        x = flat_observation(observation[:burn_in], policy.spec)
        h0 = _burn_in(policy.gru, x, data["burn_hidden0"], data["reset"][:burn_in], data["hidden0"], data["burn_valid"])
        mask = mask[burn_in:] if mask is not None else None
        return policy.sequence(observation[burn_in:], mask, h0, data["reset"][burn_in:])

    def _value(
        self,
        learner: Learner,
        data: dict[str, torch.Tensor],
        obs: dict[str, torch.Tensor],
        state: torch.Tensor | None,
        active: dict[str, torch.Tensor],
        burn_in: int,
    ) -> torch.Tensor:
        """The critic's values (normalised units) as `_policy`'s distributions (`active`: `agents_in`'s)."""
        critic, x = learner.critic, learner.critic_input(obs, state, active=active)
        if critic.gru is None:
            return critic(x[burn_in:])
        reset, valid = data["reset"], data["burn_valid"]
        h0 = _burn_in(
            critic.gru, x[:burn_in], data["burn_critic_hidden0"], reset[:burn_in], data["critic_hidden0"], valid
        )
        return critic.sequence(x[burn_in:], h0, reset[burn_in:])

    def parameters(self) -> list[torch.Tensor]:
        return [p for lr in self.learners.values() for p in lr.parameters()]

    def state_dict(self) -> dict:
        return {
            g: {
                "policy": lr.policy.state_dict(),
                "critic": lr.critic.state_dict(),
                "optimizer": lr.optimizer.state_dict(),
            }
            for g, lr in self.learners.items()
        }

    def load_state_dict(self, state: dict) -> None:
        for g, lr in self.learners.items():
            lr.policy.load_state_dict(state[g]["policy"])
            lr.critic.load_state_dict(state[g]["critic"])
            lr.optimizer.load_state_dict(state[g]["optimizer"])

    def env_state_dict(self) -> dict:
        return {"critic_hidden": self.critic_hidden}  # a recurrent critic's state per env [B, m, h]

    def load_env_state_dict(self, state: dict) -> None:
        for g, hidden in state.get("critic_hidden", {}).items():
            self.critic_hidden[g].copy_(hidden)

    @classmethod
    def label(cls, config: TrainConfig, groups) -> str:
        """MAPPO or IPPO, per group where their critic scopes differ."""
        names = {g: "IPPO" if config.for_group(g)[0].scope() == "agent" else "MAPPO" for g in groups}
        if len(set(names.values())) == 1:
            return next(iter(names.values()))
        return ", ".join(f"{name} ({g})" for g, name in names.items())


def chunk_windows(
    flat: dict[str, dict[str, torch.Tensor]],
    state: torch.Tensor | None,
    is_init: torch.Tensor,
    chunk_length: int,
    burn_in: int,
) -> tuple[dict[str, dict[str, torch.Tensor]], torch.Tensor | None]:
    """`PPO.sequence_inputs` of a rollout's update inputs `[T, B, ...]` (`update_inputs(flatten=False)`,
    with `is_init` `[T, B]`): a pure function of tensors, so a population runs it per member under vmap."""
    L, b = chunk_length, burn_in
    T, B = is_init.shape
    starts = torch.arange(0, T, L, device=is_init.device)  # [K]
    times = (starts[:, None] + torch.arange(-b, L, device=is_init.device)).clamp_min(0)  # [K, W]
    burn_starts = (starts - b).clamp_min(0)

    def windows(v: torch.Tensor) -> torch.Tensor:  # [T, B, ...] -> [K * B, W, ...]
        return v[times].transpose(1, 2).flatten(0, 1)

    def at(v: torch.Tensor, t: torch.Tensor) -> torch.Tensor:  # [T, B, ...] at t [K] -> [K * B, ...]
        return v[t].flatten(0, 1)

    reset = windows(is_init)
    valid = (starts >= b)[:, None].expand(len(starts), B).flatten()  # [K * B]
    out = {}
    for g, data in flat.items():
        hidden = {"hidden": data.get("hidden"), "critic_hidden": data.get("critic_hidden")}
        out[g] = {k: windows(v) for k, v in data.items() if k not in hidden}
        out[g].update(reset=reset, burn_valid=valid)
        for key, stored in hidden.items():
            if stored is not None:
                out[g][f"{key}0"] = at(stored, starts)
                out[g][f"burn_{key}0"] = at(stored, burn_starts)
    return out, windows(state) if state is not None else None


def _burn_in(
    gru: MultiAgentGRU,
    x: torch.Tensor,
    h_burn: torch.Tensor,
    reset: torch.Tensor,
    h0: torch.Tensor,
    valid: torch.Tensor,
) -> torch.Tensor:
    """A chunk's starting state `[M, m, h]`: with burn-in steps `x` `[b, M, m, d]`, the state after running
    them from `h_burn` (no gradient through them) where `valid`, else the stored `h0`."""
    if x.shape[0] == 0:
        return h0
    with torch.no_grad():
        h = gru.scan(x, h_burn, reset)[-1]
    return torch.where(valid[:, None, None], h, h0)


def _add(sums: dict[str, torch.Tensor], out: dict[str, torch.Tensor]) -> None:
    for g, vector in out.items():
        sums[g] += vector

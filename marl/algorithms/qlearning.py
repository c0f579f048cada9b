"""IQL, VDN and QMIX: value-based learning for groups with discrete actions, from a replay buffer
(`marl.algorithms.offpolicy`).

Each group has a Q-network `[*B, n, obs] -> [*B, n, sum(nvec)]` (shared parameters, or per agent,
stacked: `marl.core.networks.MultiAgentMLP`): one Q value per action (`Discrete`), or per action of each
head (`MultiDiscrete`, independent heads whose values add up: `Q(s, a) = sum_h Q_h(s, a_h)`, so the
greedy action is each head's argmax). Agents act ε-greedily over their allowed actions
(`marl.core.distributions.EpsilonGreedy`), ε annealed linearly from `exploration_eps_init` to
`exploration_eps_end` over the first `exploration_anneal` of the run (BenchMARL's defaults); evaluation
is greedy.

Per optimiser step and group, from agents' chosen values `Q_i = Q_i(o_i, a_i)` `[k, n]` and their next
values `Q'_i = Q'_i(o'_i, a*_i)`, `a*_i` the best allowed next action (`next_action_mask`) of the online
network (double Q, `double_q`) or of the target network, valued by the target network:

- `iql`: every agent its own TD target, `y_i = r_i + gamma * (1 - terminated_i) * Q'_i`;
- `vdn`: the team's value `Q_tot = sum_i Q_i`, `y = r + gamma * (1 - terminated) * sum_i Q'_i`;
- `qmix`: `Q_tot = mixer(Q_1..Q_n, s)`, a monotonic mixing network (`QMixer`) whose weights come from
  hypernetworks of the env's state `s` (or, without one, the group's stacked observations), its target
  copy mixing the next values at `s'`.

For VDN and QMIX the team's reward is the mean of its agents' rewards (BenchMARL's convention); an agent
that left earlier adds its reward 0 to it. So the team's reward is the sum of its agents' rewards over n at
every step, one scale for the whole episode (a mean over the agents still in would weigh a lone remaining
agent's reward n times as much as while all played). The team's episode has terminated when every one of
its agents' has: when the env's episode has, whose flag PyMARL's and BenchMARL's targets read (or, for a
group of some of the env's agents, when they have all left it). Where all agents end together, as in the
native envs, that is any agent's. An agent that left earlier (`envs.adapters.pettingzoo`: terminated,
reward 0, until its env resets) adds no next value to the team's: its `Q'_i` is 0 in VDN's sum and QMIX's
mixer (`team_step`), and from the step after it left (`active` False, `marl.core.masking`) its `Q_i` is 0
there too; QMIX's mixer reads zeros in place of its observation among the group's stacked ones (at s while
it is out, at s' from the step it leaves by; the env's state is the env's); IQL's loss leaves its steps
out. TD(0): a truncated step bootstraps from its true next observation, a terminated one does not
(`td_targets`). With `n_step` > 1 the reward is the discounted sum of the next n (`n_step_returns`, cut
after a step where all of the group's agents are done, or before a step not yet collected) and the
bootstrap is `gamma^m` times the value at the last step's next observation.
`loss = mean(w * (Q - y)^2)` (`critic_loss`), `w` the importance weights of prioritized replay, whose
priorities are `|Q - y|` (per agent for IQL, per env step for the mixers). Target networks (Q-network
and mixer) move by Polyak averaging every step (`tau`), or are copied every `target_update_every`
steps (`target_update hard`). Logged: `loss`, `q_value` (mean chosen Q of the agents), `q_total` (the
mixed value; IQL: the same as `q_value`), `td_error` (mean |Q - y|), `epsilon`, the gradient norms.

Recurrent Q-networks (`--model gru`, `RecurrentQ`): a GRU reads the observations and the MLP maps its
state to the Q values; acting carries each env's state `[B, n, h]`, zeroed where its episode ended, and
the buffer stores with every step the state the net acted from (and `is_init`). An optimiser step then
draws `batch_size // chunk_length` chunks of `burn_in + chunk_length` consecutive steps of one env
(`ReplayBuffer.draw_chunks`, uniformly), unrolls the online and target nets over each from its first
step's stored state, zeroed inside the chunk where an episode starts (`is_init`), and takes the loss on the
steps after the burn-in. A step's next values come from one more GRU step on its true next observation from
the state after the step (so a truncated step bootstraps from its own episode). Before any update the
unrolled Q values are those acted on (bit for bit with shared weights; per-agent weights' batched matmul
may round a row by its position in the batch).

Each group may take its own of the three (`--group NAME.algo=iql`), and its own options.
Actor-critic options of the shared config (`critic_scope`, `shared_value`) do not apply and are refused.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar, Literal

import torch
from torch import nn

from envs import cudagraphs
from envs.specs import Discrete, GroupSpec, MultiDiscrete
from marl.algorithms.base import register
from marl.algorithms.offpolicy import (
    TARGET_UPDATE_EVERY,
    TAU,
    OffPolicy,
    OffPolicyConfig,
    annealed,
    anneals,
    critic_loss,
    exploration_start,
    frozen_copy,
    polyak_,
    td_targets,
)
from marl.config import TrainConfig
from marl.core.distributions import EpsilonGreedy, head_size
from marl.core.masking import inactive_zeroed, masked_mean
from marl.core.models import action_features, flat_observation, observation_size
from marl.core.networks import MultiAgentGRU, MultiAgentMLP
from marl.core.replay import ReplayBuffer, gather
from marl.optim.update_step import Trainable, adam

TERMS = ("loss", "q_value", "q_total", "td_error", "epsilon")
HYPERNET_INIT_SCALE = 0.01  # QMixer's output layers at init, relative to torch's default


@dataclass(frozen=True)
class QConfig(OffPolicyConfig):
    """IQL, VDN and QMIX: ε-greedy Q-learning per agent, alone or mixed into the group's value."""

    policy_std: ClassVar[bool] = False  # greedy in the Q values, explored with epsilon
    anneal_options = (
        "--exploration-anneal above 0 with --exploration-eps-init other than the end (epsilon), or --prioritized (beta)"
    )

    algo: Literal["qmix", "vdn", "iql"] = "vdn"
    """iql: each agent learns its own Q; vdn: the group's Q is the sum of its agents'; qmix: a monotonic
    mixing network of the env's state (or the group's observations) combines them."""
    # Q-learning's own defaults, chosen by the return on spread (marl/bench/README.md, "Returns at the
    # defaults"): with the shared ones (lr 3e-4, tau 0.005, gamma 0.99, 32 steps of 2048) VDN was at -25.8
    # per agent after 1M frames, hardly above random moves (-26.4); with these at -12.7 (scripted: -10.4).
    lr: float = 1e-3
    """Adam learning rate of the Q-networks and mixers (Q-learning's: 3x the shared one; with 3e-3 VDN was
    at -11.4 after 1M frames, but QMIX swung between -32 and -22)."""
    tau: float = 0.02
    """Polyak factor of the target networks (Q-learning's: targets that keep up with the faster lr)."""
    gamma: float = 0.9
    """Discount factor (Q-learning's: with 0.99 VDN levelled off at -16 on spread, whose episodes last 25
    steps)."""
    batch_size: int = 256
    """Env steps drawn from the buffer per optimiser step (IQL's and VDN's: many small steps; with 32
    steps of 2048 per iteration VDN was at -19 to -21 after 1M frames, lr 1e-3 to 3e-3)."""
    updates_per_iteration: int = 256
    """Optimiser steps per iteration (IQL's and VDN's: one per 64 frames of the default 256 x 64 iteration)."""
    exploration_eps_init: float = 0.8
    """Probability of a uniformly random allowed action at the start."""
    exploration_eps_end: float = 0.01
    """Probability of a random action after the annealing."""
    exploration_anneal: float = 1 / 3
    """The fraction of the schedules' frames (--schedule-frames, else total_frames) over which epsilon is annealed
    linearly (0: eps_end from the start)."""
    double_q: bool = True
    """Double Q-learning: the online network picks the best next action, the target network values it."""
    target_update: Literal["polyak", "hard"] = "polyak"
    """How the target networks follow: polyak (move by tau every step) or hard (copy every
    target_update_every steps)."""
    target_update_every: int = 200
    """With target_update hard: optimiser steps between copies."""
    mixing_embed_dim: int = 32
    """qmix: width of the mixing network's hidden layer (and of its hypernetworks)."""
    n_step: int = 1
    """TD(n) targets: n rewards, discounted, then the bootstrap (cut short where the episode ends or the
    buffer holds no later step)."""
    chunk_length: int = 16
    """With --model gru: each optimiser step trains on batch_size // chunk_length chunks of this many
    consecutive steps of one env, drawn from the buffer, each unrolled from the hidden state it was acted from."""
    burn_in: int = 0
    """With --model gru: steps before each chunk run through the GRU, without a loss, from the state stored
    there, to refresh the chunk's starting state for the current weights."""

    conditional = (TAU, TARGET_UPDATE_EVERY, exploration_start("exploration_eps_init", "epsilon"))
    run_wide = (*OffPolicyConfig.run_wide, "chunk_length", "burn_in")  # one draw of chunks for every group
    recurrent: ClassVar[bool] = True
    recurrent_options = ("chunk_length", "burn_in")
    # A run of an actor-critic algorithm sets these for its critics, and a QMIX run its mixer's size; an IQL or
    # VDN group of it keeps the defaults.
    not_shared = ("critic_scope", "shared_value", "mixing_embed_dim")

    def check(self) -> None:
        # Before the base's checks, whose shared_value error would send an IQL user to critic_scope.
        if self.critic_scope != "auto" or self.shared_value:
            raise ValueError(
                f"critic_scope and shared_value are options of the actor-critic algorithms; {self.algo} has no "
                "critic: leave them at their defaults (auto, False)"
            )
        super().check()
        if self.algo != "qmix" and self.mixing_embed_dim != QConfig.mixing_embed_dim:
            raise ValueError(
                f"mixing_embed_dim is an option of qmix (its mixing network's width); {self.algo} has no mixing "
                f"network: leave it at its default ({QConfig.mixing_embed_dim}), or train on qmix (--algo qmix, or for one "
                f"group --group NAME.algo=qmix --group NAME.mixing_embed_dim={self.mixing_embed_dim})"
            )
        for name in ("exploration_eps_init", "exploration_eps_end", "exploration_anneal"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"{name} must be in [0, 1], got {getattr(self, name)}")
        for name in ("target_update_every", "mixing_embed_dim", "n_step", "chunk_length"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.burn_in < 0:
            raise ValueError(f"burn_in must be >= 0, got {self.burn_in}")

    def annealed(self) -> tuple[str, ...]:
        epsilon = anneals(self.exploration_eps_init, self.exploration_eps_end, self.exploration_anneal)
        return ("epsilon",) * epsilon + super().annealed()

    def check_train(self, config: TrainConfig) -> None:
        super().check_train(config)
        if config.uses_gru():
            self._check_chunks(config)

    @classmethod
    def saved(cls, values: dict, algo: str, gru: bool) -> dict:
        # An earlier version also accepted mixing_embed_dim for IQL and VDN, which have no mixer (and the
        # `conditional` options where they had no effect: `saved_with_groups`).
        values = super().saved(values, algo, gru)
        return values if algo == "qmix" else {k: v for k, v in values.items() if k != "mixing_embed_dim"}

    def _check_chunks(self, config: TrainConfig) -> None:
        window, B = self.burn_in + self.chunk_length, config.env.num_envs
        if self.prioritized:
            raise ValueError(
                "--model gru: Q-learning draws chunks of steps uniformly (a prioritized buffer keeps one priority "
                "per step, not per chunk): drop --prioritized, or pass --model mlp"
            )
        if self.batch_size < self.chunk_length:
            raise ValueError(
                f"--model gru: batch_size ({self.batch_size}) holds batch_size // chunk_length whole chunks; it is "
                f"less than one chunk (chunk_length {self.chunk_length}): pass --chunk-length {self.batch_size} or less"
            )
        if window > config.run.rollout_length:
            raise ValueError(
                f"--model gru: a chunk with its burn-in is {window} steps of one env (burn_in {self.burn_in} + "
                f"chunk_length {self.chunk_length}), more than an iteration collects (rollout_length "
                f"{config.run.rollout_length}): pass a shorter --chunk-length or --burn-in, or a longer rollout"
            )
        if (window - 1) * B >= self.buffer_size:
            raise ValueError(
                f"--model gru: a chunk of {window} steps of one env spans {(window - 1) * B + 1} slots of the buffer "
                f"({B} envs write each step), more than buffer_size ({self.buffer_size}) holds: pass a larger "
                "--buffer-size or shorter chunks"
            )


def heads(spec: GroupSpec) -> tuple[int, ...]:
    """The actions per head: `(n,)` for `Discrete(n)`, `nvec` for `MultiDiscrete`."""
    return spec.action.nvec if isinstance(spec.action, MultiDiscrete) else (spec.action.n,)


class RecurrentQ(nn.Module):
    """A recurrent Q-network: a GRU (`MultiAgentGRU`, state `[*B, n, gru_hidden]`) reads the observations
    `[*B, n, d]` and an MLP maps its state to the Q values `[*B, n, out_features]`."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        n_agents: int,
        hidden,
        activation: str,
        share_params: bool,
        gru_hidden: int,
    ) -> None:
        super().__init__()
        self.gru = MultiAgentGRU(in_features, gru_hidden, n_agents, share_params)
        self.mlp = MultiAgentMLP(gru_hidden, out_features, n_agents, hidden, activation, share_params)

    def forward(self, x: torch.Tensor, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One step (acting): the Q values of `x` from state `h`, and the next state."""
        h = self.gru(x, h)
        return self.mlp(h), h

    def unroll(self, x: torch.Tensor, h0: torch.Tensor, reset: torch.Tensor, burn_in: int) -> torch.Tensor:
        """The states after each step of chunks `x` `[W, k, n, d]` from their first step's state `h0` `[k, n, h]`,
        zeroed before step t where `reset[t]` (`[W, k]`): `[W - burn_in, k, n, h]`, the first `burn_in` steps
        run without a gradient and left out."""
        if burn_in:
            with torch.no_grad():
                h0 = self.gru.scan(x[:burn_in], h0, reset[:burn_in])[-1]
        return self.gru.scan(x[burn_in:], h0, reset[burn_in:])

    def next_values(self, next_x: torch.Tensor, states: torch.Tensor) -> torch.Tensor:
        """The Q values at each step's true next observation `next_x` `[L, k, n, d]`: one GRU step from the
        state after the step, `states` `[L, k, n, h]` (where the episode goes on, that is the next step's
        state; where it ended, the state of the episode the observation ends)."""
        return self.mlp(self.gru(next_x, states))


class QPolicy(nn.Module):
    """A group's Q-network, `[*B, n, *obs_shape] -> [*B, n, sum(nvec)]` (`values`), acting ε-greedily:
    `forward(observation, mask)` is an `EpsilonGreedy` with `epsilon`, a 0-d buffer the algorithm anneals.
    With `gru_hidden` the network is a `RecurrentQ`: a call takes the hidden state `[*B, n, gru_hidden]` and
    returns `(EpsilonGreedy, next hidden state)`."""

    def __init__(
        self, spec: GroupSpec, hidden, activation: str, share_params: bool, gru_hidden: int | None = None
    ) -> None:
        super().__init__()
        self.spec, self.nvec, self.heads = spec, heads(spec), isinstance(spec.action, MultiDiscrete)
        sizes = (observation_size(spec), head_size(spec.action), spec.n_agents, hidden, activation, share_params)
        self.recurrent = gru_hidden is not None
        self.net = RecurrentQ(*sizes, gru_hidden) if self.recurrent else MultiAgentMLP(*sizes)
        self.register_buffer("epsilon", torch.zeros(()))

    def values(self, observation: torch.Tensor) -> torch.Tensor:
        """An MLP Q-network's values (a recurrent one's need its state: `forward`, `RecurrentQ.unroll`)."""
        return self.net(flat_observation(observation, self.spec))

    def forward(
        self, observation: torch.Tensor, action_mask: torch.Tensor | None = None, hidden: torch.Tensor | None = None
    ) -> EpsilonGreedy | tuple[EpsilonGreedy, torch.Tensor]:
        if not self.recurrent:
            return self.greedy(self.values(observation), action_mask)
        if hidden is None:
            raise ValueError("a recurrent Q-network (model gru) acts from its hidden state: pass hidden=[*B, n, h]")
        hidden = self.recur(observation, hidden)
        return self.from_hidden(hidden, action_mask), hidden

    def recur(self, observation: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        """A recurrent Q-network's next state `[*B, n, h]` after `observation`, from `hidden` (as `Policy.recur`:
        a population steps every member's GRU at once, `marl.core.members.MemberPolicy`)."""
        return self.net.gru(flat_observation(observation, self.spec), hidden)

    def from_hidden(self, hidden: torch.Tensor, action_mask: torch.Tensor | None = None) -> EpsilonGreedy:
        """The ε-greedy choice of the Q values at the state `hidden` `recur` returned."""
        return self.greedy(self.net.mlp(hidden), action_mask)

    def greedy(self, q: torch.Tensor, action_mask: torch.Tensor | None) -> EpsilonGreedy:
        """ε-greedy over the Q values `q` `[*B, n, sum(nvec)]`, within the action mask where the group has one."""
        mask = action_mask if self.spec.has_action_mask else None
        return EpsilonGreedy(q, self.epsilon, mask, self.nvec, self.heads)


def chosen_values(q: torch.Tensor, action: torch.Tensor, nvec: tuple[int, ...]) -> torch.Tensor:
    """The values of `action` (`[*B, n]` for one head, `[*B, n, H]` for several) in `q`
    `[*B, n, sum(nvec)]`, summed over the heads: `[*B, n]`."""
    action = action.unsqueeze(-1) if action.dim() == q.dim() - 1 else action  # [*B, n, H]
    parts = [part.gather(-1, a.unsqueeze(-1)) for part, a in zip(q.split(list(nvec), -1), action.unbind(-1))]
    return torch.cat(parts, -1).sum(-1)


def best_actions(q: torch.Tensor, mask: torch.Tensor | None, nvec: tuple[int, ...]) -> torch.Tensor:
    """Each head's best allowed action in `q` `[*B, n, sum(nvec)]` (`mask` `[*B, n, K]`, one head only):
    `[*B, n, H]`."""
    if mask is not None:
        q = q.masked_fill(~mask, -math.inf)
    return torch.stack([part.argmax(-1) for part in q.split(list(nvec), -1)], -1)


def next_values(
    target_q: torch.Tensor, online_q: torch.Tensor | None, mask: torch.Tensor | None, nvec: tuple[int, ...]
) -> torch.Tensor:
    """`[*B, n]`: the target network's values `target_q` `[*B, n, sum(nvec)]` of the best allowed next
    actions, picked by the online network's `online_q` (double Q) or, when None, by the target's own."""
    picked = best_actions(target_q if online_q is None else online_q, mask, nvec)
    return chosen_values(target_q, picked, nvec)


class QMixer(nn.Module):
    """QMIX's mixing network (Rashid et al. 2018): agents' values `[*B, n]` and a conditioning input
    `[*B, d]` -> the group's value `[*B]`, monotonic in every agent's value.

    `Q_tot = w2 . elu(Q W1 + b1) + b2`, with `W1` `[n, E]`, `b1` `[E]`, `w2` `[E]` given by linear
    hypernetworks of the input, `W1` and `w2` through `abs` (non-negative: dQ_tot/dQ_i >= 0), and `b2` by a
    two-layer one (E = `embed_dim`)."""

    def __init__(self, n_agents: int, in_features: int, embed_dim: int) -> None:
        super().__init__()
        self.n_agents, self.embed_dim = n_agents, embed_dim
        self.hyper_w1 = nn.Linear(in_features, n_agents * embed_dim)
        self.hyper_b1 = nn.Linear(in_features, embed_dim)
        self.hyper_w2 = nn.Linear(in_features, embed_dim)
        self.hyper_b2 = nn.Sequential(nn.Linear(in_features, embed_dim), nn.ReLU(), nn.Linear(embed_dim, 1))
        # Layers that give the mixing weights and biases start small (as JaxMARL's QMIX): the mixed value then
        # starts near 0 and grows with the agents' values. At torch's default init the hypernetworks' large
        # weights amplify the agents' noisy maxima, and on spread the mixed value drifted upward while every
        # reward was negative (return -49 at 2M frames against -20.5 with this scale).
        with torch.no_grad():
            for layer in (self.hyper_w1, self.hyper_b1, self.hyper_w2, self.hyper_b2[-1]):
                layer.weight.mul_(HYPERNET_INIT_SCALE)
                layer.bias.mul_(HYPERNET_INIT_SCALE)

    def forward(self, q: torch.Tensor, condition: torch.Tensor) -> torch.Tensor:
        w1 = self.hyper_w1(condition).abs().unflatten(-1, (self.n_agents, self.embed_dim))  # [*B, n, E]
        hidden = nn.functional.elu((q.unsqueeze(-2) @ w1).squeeze(-2) + self.hyper_b1(condition))  # [*B, E]
        w2 = self.hyper_w2(condition).abs()  # [*B, E]
        return (hidden * w2).sum(-1) + self.hyper_b2(condition).squeeze(-1)


def vdn_mix(q: torch.Tensor) -> torch.Tensor:
    """VDN: the group's value is the sum of its agents' `[*B, n] -> [*B]`."""
    return q.sum(-1)


def team_step(
    reward: torch.Tensor, terminated: torch.Tensor, next_q: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The team's reward (the mean over the agents, a departed one's 0 included) and termination (every
    agent's: the env's episode ended, or the group's agents have all left it) `[k, n] -> [k, 1]` each, and the
    agents' next values `[k, n]` with those of terminated agents zeroed: an agent that left earns nothing more,
    so its Q' must not enter the team's bootstrap while the others play on. Where all agents end together this
    is any agent's termination."""
    return reward.mean(-1, keepdim=True), terminated.all(-1, keepdim=True), next_q.masked_fill(terminated, 0.0)


def n_step_returns(
    reward: torch.Tensor, done: torch.Tensor, available: torch.Tensor, gamma: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Discounted sums of up to n rewards of the same env, `[k, n_agents]`, from its steps `j = 0..n-1`:
    `reward` `[n, k, n_agents]`, `done` `[n, k]` (all of the group's agents), `available` `[n, k]` (step j
    is in the buffer; step 0 always). Step j counts while every earlier step was neither done nor missing.
    Returns the sums, the steps counted `m` `[k]` (>= 1) and `gamma^m` `[k, 1]`."""
    counted = torch.cumprod(torch.cat([available[:1], available[1:] & ~done[:-1]]).float(), 0)  # [n, k]
    powers = gamma ** torch.arange(reward.shape[0], device=reward.device, dtype=reward.dtype)  # [n]
    total = (reward * (counted * powers[:, None]).unsqueeze(-1)).sum(0)
    steps = counted.sum(0)
    return total, steps.long(), (gamma**steps).unsqueeze(-1)


def by_step(slots: torch.Tensor, steps: int) -> torch.Tensor:
    """The slots `[..., W, steps * C]` of an iteration's chunks (`draw_chunks`) as each optimiser step's
    `[..., steps, W, C]`."""
    return slots.unflatten(-1, (steps, -1)).movedim(-2, -3)


def gather_chunks(storage, index: torch.Tensor, burn_in: int) -> tuple[dict, dict]:
    """The buffer's `storage` at chunks' slots `index` `[W, C]` (`ReplayBuffer.draw_chunks`): the steps after
    each chunk's first `burn_in`, which the loss reads, and the whole window, which the recurrent nets unroll;
    both gathered as `marl.core.replay.gather` does, time-major (rows `[j * C, (j + 1) * C)` are step j)."""
    window = gather(storage, index.flatten())
    steps = index[burn_in:].numel()
    main = {k: {n: v[-steps:] for n, v in d.items()} if isinstance(d, dict) else d[-steps:] for k, d in window.items()}
    return main, window


@dataclass(frozen=True)
class QMIXConfig(QConfig):
    """QMIX: Q-learning's options, with QMIX's own replay schedule."""

    algo: Literal["qmix"] = "qmix"
    """qmix: a monotonic mixing network of the env's state (or the group's observations) combines the agents' Qs."""
    batch_size: int = 2048
    """Env steps drawn from the buffer per optimiser step (QMIX's: the shared one; with IQL's and VDN's 256 x
    256 QMIX's return fell to -42 and -48 (seeds 0 and 1) while epsilon annealed, ended no higher, and each
    iteration took 1.65x as long)."""
    updates_per_iteration: int = 32
    """Optimiser steps per iteration (QMIX's: the shared one)."""

    not_shared = ("critic_scope", "shared_value")  # a QMIX group of an IQL or VDN run takes its mixer's size


@dataclass
class QLearner:
    """Everything one group learns with (a mixer and its target for QMIX only)."""

    algo: QConfig
    policy: QPolicy
    target_q: MultiAgentMLP | RecurrentQ
    mixer: QMixer | None
    target_mixer: QMixer | None
    optimizer: torch.optim.Adam

    def modules(self) -> dict[str, nn.Module]:
        names = ("policy", "target_q", "mixer", "target_mixer") if self.mixer is not None else ("policy", "target_q")
        return {n: getattr(self, n) for n in names}


@register("qmix", "vdn", "iql")
class QLearning(OffPolicy):
    """IQL, VDN or QMIX for every group at once (each group mixes its own agents)."""

    Config = QConfig
    configs = {"qmix": QMIXConfig}
    term_names = TERMS
    scheduled = ("epsilon",)

    def check_group(self, group: str, spec) -> None:
        if not isinstance(spec.action, (Discrete, MultiDiscrete)):
            raise ValueError(
                f"{self.config.for_group(group)[0].algo} is value-based and needs discrete actions (Discrete or "
                f"MultiDiscrete), but group {group!r} has {spec.action}: train it with maddpg, iddpg, masac or isac "
                f"(e.g. --group {group}.algo=masac)"
            )

    def __init__(
        self, config: TrainConfig, env, device: torch.device, world, generator: torch.Generator, groups=None
    ) -> None:
        super().__init__(config, env, device, world, generator, groups)
        self.learners: dict[str, QLearner] = {}
        for g, spec in self.groups.items():
            algo, model = config.for_group(g)  # each group's algo may differ (--group NAME.algo=iql)
            gru = model.gru_hidden if model.model == "gru" else None
            policy = QPolicy(spec, model.hidden, model.activation, model.share_params, gru).to(device)
            mixer = None
            mixing = algo.algo == "qmix"
            if mixing:
                # Conditioned on the env's state, else on the group's observations: [*B, n * obs].
                state = env.state_spec
                seen = math.prod(state.shape) if state is not None else spec.n_agents * observation_size(spec)
                mixer = QMixer(spec.n_agents, seen, algo.mixing_embed_dim).to(device)
            parameters = [*policy.parameters(), *(mixer.parameters() if mixing else ())]
            optimizer = adam(parameters, lr=algo.lr, eps=algo.adam_eps)
            self.learners[g] = QLearner(
                algo, policy, frozen_copy(policy.net), mixer, frozen_copy(mixer) if mixing else None, optimizer
            )
        self.targets = {
            g: (
                [*lr.target_q.parameters(), *(lr.target_mixer.parameters() if lr.mixer is not None else ())],
                [p for net in self.nets(lr).values() for p in net.parameters()],
            )
            for g, lr in self.learners.items()
        }
        self.chunked = self._trains_on_chunks()  # with a recurrent group every group trains on the chunks drawn
        # Optimiser steps taken: the clock of the hard target copies (saved with the learners' state),
        # advanced in place by the compiled step.
        self.updates = torch.zeros((), dtype=torch.int64, device=device)
        cudagraphs.mark_static((self.updates,), device)
        self.position = torch.zeros((), dtype=torch.int64, device=device)  # the buffer's, from `update` on
        # Envs per step in the buffer: the run's (a population's member's own B of its S * B, `qlearning_seeds`).
        self.stride = config.env.num_envs
        self.trainables = {
            g: Trainable(self.nets(lr), lr.optimizer, lr.algo.max_grad_norm) for g, lr in self.learners.items()
        }
        self._build_step()

    def _trains_on_chunks(self) -> bool:
        """Whether any group's Q-network is recurrent (then every group trains on chunks of steps), after
        refusing what chunks cannot serve."""
        recurrent = [g for g, lr in self.learners.items() if lr.policy.recurrent]
        if not recurrent:
            return False
        if self.member:
            raise ValueError(
                f"--model gru: group(s) {recurrent} train Q-learning on chunks of steps, which a run mixing "
                "algorithms (--group NAME.algo=...) does not draw: pass --model mlp for them"
            )
        for g, lr in self.learners.items():
            _, model = self.config.for_group(g)
            if lr.algo.n_step > 1:
                raise ValueError(
                    f"--model gru: group {g!r} has n_step {lr.algo.n_step}; Q-learning on chunks takes TD(0) targets "
                    "(n_step 1)"
                )
            if model.model == "gru" and model.gru_nets == "critic":
                raise ValueError(
                    f"--model gru: group {g!r} has gru_nets critic; Q-learning has no critic, its Q-network is the "
                    "recurrent net: pass --gru-nets policy (the default) or both"
                )
        return True

    def acting_hidden(self) -> dict[str, tuple[int, int]]:
        return {
            g: (lr.policy.spec.n_agents, lr.policy.net.gru.hidden_size)
            for g, lr in self.learners.items()
            if lr.policy.recurrent
        }

    def draw(self, buffer: ReplayBuffer, steps: int) -> torch.Tensor:
        """Uniform or prioritized env steps `[steps, batch_size]`; with recurrent groups chunks' slots
        `[steps, W, C]`, `W = burn_in + chunk_length` steps of one env each, `C = batch_size // chunk_length`
        chunks (drawn as `steps * C` chunks at once: uniform, their slots are known before the steps)."""
        if not self.chunked:
            return super().draw(buffer, steps)
        count, length = self.chunks()
        return by_step(buffer.draw_chunks(steps * count, length, self.stride, self.generator), steps)

    def chunks(self) -> tuple[int, int]:
        """An optimiser step's chunks: how many, `C = batch_size // chunk_length`, and the steps of each, `W =
        burn_in + chunk_length`."""
        algo = self.config.algo
        return algo.batch_size // algo.chunk_length, algo.burn_in + algo.chunk_length

    @staticmethod
    def nets(learner: QLearner) -> dict[str, nn.Module]:
        """A group's trained nets, in its optimiser's order."""
        return {"q": learner.policy.net, **({"mixer": learner.mixer} if learner.mixer is not None else {})}

    def update_targets(self, polyak=polyak_) -> None:
        self.updates += 1
        for g, (targets, online) in self.targets.items():
            algo = self.learners[g].algo
            if algo.target_update == "polyak":
                polyak(targets, online, algo.tau)
            else:  # a copy on the steps the clock says, read on the device: lerp by 1 copies, by 0 keeps
                copy = (self.updates % algo.target_update_every == 0).float()
                for target, source in zip(targets, online):
                    target.lerp_(source, copy)

    def schedules(self, frames: int, total_frames: int) -> dict[str, float]:
        values = super().schedules(frames, total_frames)
        for g, lr in self.learners.items():
            a = lr.algo
            values[f"{g} epsilon"] = annealed(
                a.exploration_eps_init, a.exploration_eps_end, a.exploration_anneal, frames, total_frames
            )
        return values

    def loss(self, storage, index, weight, noise, t):
        if index.dim() == 1:
            return self.losses(gather(storage, index), weight, noise, t, {}, storage, index)  # no next actions read
        main, window = gather_chunks(storage, index, self.config.algo.burn_in)
        return self.losses(main, weight, noise, t, {}, storage, index, window)

    def next_actions(self, batch, noise, t):
        """The greedy allowed actions of the online Q-networks at the next observations (what the
        agents' policy, ε aside, does there), for the critics of other algorithms' groups."""
        with torch.no_grad():
            return {
                g: (
                    action_features(
                        best_actions(
                            lr.policy.values(batch[g]["next_observation"]),
                            batch[g].get("next_action_mask"),
                            lr.policy.nvec,
                        ).view_as(batch[g]["action"]),
                        self.groups[g],
                        False,
                    ),
                    None,
                )
                for g, lr in self.learners.items()
            }

    def losses(self, batch, weight, noise, t, next_actions, storage, index, window=None):
        """The next actions of other groups do not enter Q-learning's targets. With chunks (`index`
        `[W, C]`), `batch` holds the steps after the burn-in, `[L * C, ...]`, and `window` all `W * C`."""
        total, terms, priority = 0.0, {}, {}
        for g, lr in self.learners.items():
            data, nvec, gamma = batch[g], lr.policy.nvec, lr.algo.gamma
            reward, terminated, after = data["reward"], data["terminated"], batch
            if lr.algo.n_step > 1:
                reward, terminated, after, gamma = self._n_step(storage, index, g, lr.algo)
            if lr.policy.recurrent:
                values, next_q = self._unrolled_values(lr, g, batch, window, index.shape)
            else:
                values, next_q = self._values(lr, g, data, after)
            q = chosen_values(values, data["action"], nvec)  # [k, n]
            active = data.get("active")  # [k, n] bool, or None: every agent acts at every step
            if lr.algo.algo == "iql":
                value, counted = q, active
            else:
                # A departed agent's Q enters the team's value no more than its Q' the target (`team_step`);
                # a step where the whole group had left counts for nothing.
                q = inactive_zeroed(q, active)
                counted = active.any(-1, keepdim=True) if active is not None else None  # [k, 1]
                # The agents in at the (last counted step's) next observation, as `agents_in` reads them.
                next_in = ~terminated if active is not None else None  # [k, n]
                reward, terminated, next_q = team_step(reward, terminated, next_q)
                if lr.mixer is None:
                    value, next_q = vdn_mix(q).unsqueeze(-1), vdn_mix(next_q).unsqueeze(-1)  # [k, 1]
                else:
                    value = lr.mixer(q, self._condition(batch, g, "", active)).unsqueeze(-1)
                    with torch.no_grad():
                        next_q = lr.target_mixer(next_q, self._condition(after, g, "next_", next_in)).unsqueeze(-1)
            with torch.no_grad():
                target = td_targets(reward, terminated, next_q, gamma)  # [k, n] (iql) or [k, 1]
            loss = critic_loss(value.unsqueeze(1), target, weight, counted)
            error = inactive_zeroed((value.detach() - target).abs(), counted)  # [k, n] or [k, 1]
            total = total + loss
            q_total = masked_mean(value.detach(), counted)  # IQL: the agents' mean Q again
            q_mean, error_mean = masked_mean(q.detach(), active), masked_mean(error, counted)
            terms[g] = torch.stack([loss.detach(), q_mean, q_total, error_mean, lr.policy.epsilon])
            priority[g] = error.expand_as(q)  # a mixer's one error per env step, for each agent
        return total, terms, priority

    @staticmethod
    def _values(lr: QLearner, g: str, data: dict, after: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """An MLP Q-network's values at the steps' observations `[k, n, sum(nvec)]`, and the target values of
        the best next actions `[k, n]` at the observations `after` them (the next ones, or n steps on)."""
        values = lr.policy.values(data["observation"])
        with torch.no_grad():
            next_obs = flat_observation(after[g]["next_observation"], lr.policy.spec)
            online = lr.policy.net(next_obs) if lr.algo.double_q else None
            next_q = next_values(lr.target_q(next_obs), online, after[g].get("next_action_mask"), lr.policy.nvec)
        return values, next_q

    def _unrolled_values(
        self, lr: QLearner, g: str, batch: dict, window: dict, shape
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`_values` of a recurrent Q-network on chunks `shape` `[W, C]`: the online and target nets unrolled over
        the `window`'s steps from the first step's stored state; `[L * C, n, sum(nvec)]` and `[L * C, n]`."""
        W, C = shape
        spec, burn_in = lr.policy.spec, self.config.algo.burn_in
        x = flat_observation(window[g]["observation"], spec).unflatten(0, (W, C))  # [W, C, n, d]
        h0, reset = window[g]["hidden"][:C], window["is_init"].view(W, C)  # [C, n, h], [W, C]
        states = lr.policy.net.unroll(x, h0, reset, burn_in)  # [L, C, n, h]
        values = lr.policy.net.mlp(states).flatten(0, 1)
        with torch.no_grad():
            next_x = flat_observation(batch[g]["next_observation"], spec).unflatten(0, (W - burn_in, C))
            online = lr.policy.net.next_values(next_x, states.detach()).flatten(0, 1) if lr.algo.double_q else None
            target = lr.target_q.next_values(next_x, lr.target_q.unroll(x, h0, reset, burn_in)).flatten(0, 1)
            next_q = next_values(target, online, batch[g].get("next_action_mask"), lr.policy.nvec)
        return values, next_q

    def see_buffer(self, buffer: ReplayBuffer) -> None:
        self.position = buffer.position  # where the buffer writes next: n-step returns stop before it

    def _n_step(self, storage, index: torch.Tensor, group: str, algo: QConfig):
        """Group `group`'s n-step rewards `[k, n]`, the last counted step's terminated flags `[k, n]`, that
        step's data (`{group: {next_observation, next_action_mask}, next_state}`) and `gamma^m` `[k, 1]`.

        The buffer is extended with time-major `[T, B]` batches of the same B envs, one after another, so
        the same env's step j later sits `j * B` slots on (modulo the capacity): a gather, no search. A
        step at or past the write position is not there yet (or is an older step overwritten)."""
        capacity, stride = storage[(group, "reward")].shape[0], self.stride
        offsets = torch.arange(algo.n_step, device=index.device).unsqueeze(-1) * stride  # [n_step, 1]
        slots = (index + offsets).remainder(capacity)  # [n_step, k]
        # Slots from index's up to the write position, in [1, capacity] (all of them when the ring is full
        # and index's step is the oldest).
        ahead = (self.position - index - 1).remainder(capacity) + 1  # [k]
        available = offsets < ahead  # [n_step, k]
        reward = storage[(group, "reward")][slots]  # [n_step, k, n]
        # The env's episode goes on until all its agents are done: one that left earlier reads terminated,
        # with reward 0, until then, so the sums and bootstraps of every agent stay right past it.
        done = storage[(group, "done")][slots].all(-1)  # [n_step, k]
        total, steps, discount = n_step_returns(reward, done, available, algo.gamma)
        last = slots.gather(0, (steps - 1).unsqueeze(0)).squeeze(0)  # [k]
        after = {group: {"next_observation": storage[(group, "next_observation")][last]}}
        if (group, "next_action_mask") in storage:
            after[group]["next_action_mask"] = storage[(group, "next_action_mask")][last]
        if ("next_state",) in storage:
            after["next_state"] = storage[("next_state",)][last]
        return total, storage[(group, "terminated")][last], after, discount

    def _condition(self, batch: dict, group: str, when: str, active: torch.Tensor | None) -> torch.Tensor:
        """What group `group`'s mixer sees at s (`when` "") or s' ("next_"): the env's state, else the
        group's observations stacked, `[k, d]`, zeros for an agent that is out there (`active` `[k, n]`, or
        None: all are in), as in a centralised critic's input (`CriticInput`)."""
        if f"{when}state" in batch:
            return batch[f"{when}state"].flatten(1)
        observation = flat_observation(batch[group][f"{when}observation"], self.groups[group])  # [k, n, d]
        return inactive_zeroed(observation, active).flatten(1)

    def state_dict(self, group_state=None) -> dict:
        return {**super().state_dict(group_state), "updates": self.updates.clone()}

    def load_state_dict(self, state: dict, load_group=None) -> None:
        super().load_state_dict(state, load_group)
        self.updates.copy_(state["updates"])

"""A group's policy and critic, and what the critic sees.

Critic scopes (one per group):
- `"agent"` (IPPO): each agent's own observation;
- `"group"` (MAPPO): the observations of every agent in the group;
- `"global"`: the env's global `state` when it has one, else the observations of every group.
Centralised inputs are the same for every agent of the group; with shared parameters a one-hot of
the agent's index follows them so the one network can still give each agent its own value (the input
comes once, and the first layer adds each id's weights: `MultiAgentMLP`'s `agent_ids`). An action-value
critic (`QCritic`: DDPG, SAC) also sees actions: each agent in its scope adds its action's features
(`action_features`) beside its observation, and with the env's state every agent's action follows the state.
In a centralised input an agent that has left its episode (`active` False, `marl.core.masking.agents_in`)
reads zeros in place of its observation and action, as SMAC's and TorchRL's do; the env's state is the env's.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from envs.specs import Box, Discrete, GroupSpec, MultiDiscrete
from envs.sync import allow_host_sync
from marl.core.distributions import (
    Distribution,
    MaskedCategorical,
    MultiCategorical,
    NoisyDeterministic,
    TanhNormal,
    head_size,
)
from marl.core.masking import inactive_zeroed
from marl.core.networks import MultiAgentGRU, MultiAgentMLP

CRITIC_SCOPES = ("agent", "group", "global")


def observation_size(spec: GroupSpec) -> int:
    """The size of one agent's observation flattened: the networks are MLPs and read
    `[*B, n, observation_size]` (a board `[3, 3, 2]` is 18 inputs)."""
    return math.prod(spec.observation.shape)


def flat_observation(observation: torch.Tensor, spec: GroupSpec) -> torch.Tensor:
    """`[*B, n, *obs_shape]` -> `[*B, n, observation_size(spec)]` (a view where the layout allows)."""
    dims = len(spec.observation.shape)
    if dims == 1:
        return observation
    return observation.unsqueeze(-1) if dims == 0 else observation.flatten(-dims)


STD_SOURCES = ("param", "state")
MIN_STD = 0.01  # the floor of a state-dependent std


class Policy(nn.Module):
    """`[*B, n, *obs_shape]` (+ action mask) -> an action distribution over the group's action spec;
    observations of any shape are flattened (`flat_observation`).

    For continuous actions the Gaussian's std (before the tanh) is, by `std`:
    - `"param"`: a learned log-std per action dim, the same in every state (per agent without shared
      parameters), starting at `log_std_init`;
    - `"state"`: an output of the network, `softplus(x + bias) + MIN_STD`, the bias set so that it
      starts at `exp(log_std_init)` (as BenchMARL's and TorchRL's `biased_softplus` scale mapping).

    With `gru_hidden`, a GRU (`MultiAgentGRU`) reads the observation before the MLP: a call then takes the
    hidden state `[*B, n, gru_hidden]` and returns `(distribution, next hidden state)`, and `sequence`
    runs a time-major sequence from a state.
    """

    def __init__(
        self,
        spec: GroupSpec,
        hidden: Sequence[int],
        activation: str,
        share_params: bool,
        log_std_init: float = 0.0,
        std: str = "param",
        gru_hidden: int | None = None,
    ) -> None:
        super().__init__()
        if std not in STD_SOURCES:
            raise ValueError(f"unknown std source {std!r}; expected one of {STD_SOURCES}")
        self.spec = spec
        obs_size = observation_size(spec)
        out = head_size(spec.action)
        self.state_std = isinstance(spec.action, Box) and std == "state"
        outputs = 2 * out if self.state_std else out  # [mean, std input] per action dim
        self.gru = MultiAgentGRU(obs_size, gru_hidden, spec.n_agents, share_params) if gru_hidden else None
        features = gru_hidden or obs_size
        self.net = MultiAgentMLP(features, outputs, spec.n_agents, hidden, activation, share_params, output_gain=0.01)
        if isinstance(spec.action, Box):
            low, high = spec.action.bounds("cpu")
            self.register_buffer("low", low.flatten())
            self.register_buffer("high", high.flatten())
            if self.state_std:
                initial = math.exp(log_std_init)
                if initial <= MIN_STD:
                    raise ValueError(f"log_std_init must give a std above {MIN_STD} with std='state', got {initial:g}")
                self.std_bias = math.log(math.expm1(initial - MIN_STD))  # softplus(0 + bias) + MIN_STD = initial
            else:
                rows = 1 if share_params else spec.n_agents
                self.log_std = nn.Parameter(torch.full((rows, out), float(log_std_init)))  # [1 or n, A]

    def forward(
        self, observation: torch.Tensor, action_mask: torch.Tensor | None = None, hidden: torch.Tensor | None = None
    ) -> Distribution | tuple[Distribution, torch.Tensor]:
        if self.gru is None:
            return self.distribution(self.net(flat_observation(observation, self.spec)), action_mask)
        if hidden is None:
            raise ValueError("a recurrent policy (model gru) acts from its hidden state: pass hidden=[*B, n, h]")
        hidden = self.recur(observation, hidden)  # [*B, n, h]
        return self.from_hidden(hidden, action_mask), hidden

    def recur(self, observation: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        """A recurrent policy's next state `[*B, n, h]` after `observation`, from `hidden` (`forward`'s first half:
        a population steps every member's GRU at once, `marl.core.members.MemberPolicy`)."""
        return self.gru(flat_observation(observation, self.spec), hidden)

    def from_hidden(self, hidden: torch.Tensor, action_mask: torch.Tensor | None = None) -> Distribution:
        """A recurrent policy's distribution at the state `hidden` `recur` returned (`forward`'s second half)."""
        return self.distribution(self.net(hidden), action_mask)

    def sequence(
        self, observation: torch.Tensor, action_mask: torch.Tensor | None, h0: torch.Tensor, reset: torch.Tensor
    ) -> Distribution:
        """The distributions of a sequence `[L, *M, n, ...]` acted on from hidden state `h0` `[*M, n, h]`,
        the state zeroed before step t where `reset[t]` (`[L, *M]`)."""
        return self.distribution(
            self.net(self.gru.scan(flat_observation(observation, self.spec), h0, reset)), action_mask
        )

    def distribution(self, out: torch.Tensor, action_mask: torch.Tensor | None) -> Distribution:
        """The distribution of the network's output `out` `[*B, n, head]` (x2 for a state-dependent std)."""
        action = self.spec.action
        if isinstance(action, Box):
            if self.state_std:
                mean, std_input = out.chunk(2, -1)
                log_std = (F.softplus(std_input + self.std_bias) + MIN_STD).log()  # [*B, n, A]
                return TanhNormal(mean, log_std, self.low, self.high)
            return TanhNormal(out, self.log_std, self.low, self.high)
        if isinstance(action, Discrete):
            return MaskedCategorical(out, action_mask if action.masked else None)
        if isinstance(action, MultiDiscrete):
            return MultiCategorical(out, action.nvec)
        raise TypeError(f"unsupported action spec {action!r}")


class DeterministicPolicy(nn.Module):
    """DDPG's policy: `[*B, n, *obs_shape]` -> `NoisyDeterministic`, the action `low + (tanh(x) + 1) / 2 *
    (high - low)` of the network's output `x`, explored with Gaussian noise of scale `sigma` (a 0-d
    buffer the algorithm anneals; a fraction of the half range). Bounded continuous actions only."""

    def __init__(self, spec: GroupSpec, hidden: Sequence[int], activation: str, share_params: bool) -> None:
        super().__init__()
        if not isinstance(spec.action, Box):
            raise TypeError(f"a deterministic policy needs continuous (Box) actions, got {spec.action}")
        self.spec = spec
        out = head_size(spec.action)
        self.net = MultiAgentMLP(
            observation_size(spec), out, spec.n_agents, hidden, activation, share_params, output_gain=0.01
        )
        low, high = spec.action.bounds("cpu")
        self.register_buffer("low", low.flatten())
        self.register_buffer("high", high.flatten())
        self.register_buffer("sigma", torch.zeros(()))

    def forward(self, observation: torch.Tensor, action_mask: torch.Tensor | None = None) -> NoisyDeterministic:
        x = self.net(flat_observation(observation, self.spec))  # [*B, n, A]
        action = self.low + (torch.tanh(x) + 1) * ((self.high - self.low) / 2)
        return NoisyDeterministic(action, self.sigma, self.low, self.high)


def action_features(raw: torch.Tensor, spec: GroupSpec, squashed: bool) -> torch.Tensor:
    """A group's raw actions `[*B, n, ...]` as a critic's inputs `[*B, n, action_size(spec)]`: a continuous
    action scaled to [-1, 1] (`squashed`: the raw action is the Gaussian's, before the tanh, as
    `TanhNormal`'s; else it is the env's action, as `NoisyDeterministic`'s), a discrete one as one-hot."""
    action = spec.action
    if isinstance(action, Box):
        if squashed:
            return torch.tanh(raw)
        low, scale = _unit_scaling(action, raw.device)
        return (raw - low) * scale - 1
    if isinstance(action, Discrete):
        return _one_hot(raw, action.n)
    if isinstance(action, MultiDiscrete):
        return torch.cat([_one_hot(a, n) for a, n in zip(raw.unbind(-1), action.nvec)], -1)
    raise TypeError(f"unsupported action spec {action!r}")


def _unit_scaling(action: Box, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """`action`'s low bound and `2 / (high - low)`, flat `[size]` on `device`. Eagerly they are made once
    per spec and device, since tensors made from the spec's numbers at every step would be a copy from the
    host each time; a compiled graph holds them as constants."""
    if torch.compiler.is_compiling():
        return _scaling(action, device)
    return _cached_scaling(action, device)


@functools.cache
def _cached_scaling(action: Box, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    # The one copy from the host allowed; outside inference mode, so that autograd may save them.
    with torch.inference_mode(False), allow_host_sync():
        return _scaling(action, device)


def _scaling(action: Box, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    low, high = (bound.flatten().to(device) for bound in action.bounds("cpu"))
    return low, 2 / (high - low)


def _one_hot(index: torch.Tensor, n: int) -> torch.Tensor:
    """`[*B]` int64 -> `[*B, n]` float32; `F.one_hot` would read the indices' range on the host."""
    return (index.unsqueeze(-1) == torch.arange(n, device=index.device)).to(torch.float32)


def action_size(spec: GroupSpec) -> int:
    """Features per agent of `action_features`."""
    return head_size(spec.action)


class CriticInput:
    """Builds group `group`'s critic input `[*batch, n, size]` from every group's observations (and, for an
    action-value critic, actions). A centralised input is the same for every agent: it comes once,
    `[*batch, 1, size - agent_ids]`, for one value for the group (`shared_value`) or for a critic that gives
    each of the group's `agent_ids` agents its own value from the input and the agent's one-hot id
    (`MultiAgentMLP`'s and `MultiAgentGRU`'s `agent_ids`).

    `action_sizes` maps the groups whose actions the critic sees to their features per agent
    (`action_features`); only those in the scope are read."""

    def __init__(
        self,
        scope: str,
        group: str,
        groups: Mapping[str, GroupSpec],
        state_size: int | None,
        agent_id: bool,
        shared_value: bool = False,
        action_sizes: Mapping[str, int] | None = None,
    ) -> None:
        if scope not in CRITIC_SCOPES:
            raise ValueError(f"unknown critic scope {scope!r}; expected one of {CRITIC_SCOPES}")
        self.scope, self.group, self.groups = scope, group, dict(groups)
        self.n = groups[group].n_agents
        self.use_state = scope == "global" and state_size is not None
        # One value for the whole group: the input is the shared part, once per env, with no agent id.
        self.shared_value = shared_value and scope != "agent"
        self.agent_ids = self.n if agent_id and scope != "agent" and not self.shared_value else 0
        in_scope = [group] if scope in ("agent", "group") else list(groups)
        self.action_sizes = {g: size for g, size in (action_sizes or {}).items() if g in in_scope and size}

        def per_agent(g: str) -> int:
            return observation_size(groups[g]) + self.action_sizes.get(g, 0)

        if scope == "agent":
            size = per_agent(group)
        elif scope == "group":
            size = self.n * per_agent(group)
        elif self.use_state:
            size = state_size + sum(groups[g].n_agents * a for g, a in self.action_sizes.items())
        else:
            size = sum(s.n_agents * per_agent(g) for g, s in groups.items())
        self.size = size + self.agent_ids

    def _agent_features(
        self, g: str, observations, actions, active: Mapping[str, torch.Tensor], with_observation: bool = True
    ) -> torch.Tensor:
        """Group `g`'s agents' observations and (where seen) actions: `[*batch, n_g, d]`, zeros for an agent
        `active` (where it holds `g`) says is out."""
        parts = [flat_observation(observations[g], self.groups[g])] if with_observation else []
        if g in self.action_sizes:
            parts.append(actions[g])
        features = parts[0] if len(parts) == 1 else torch.cat(parts, -1)
        return inactive_zeroed(features, active.get(g))

    def __call__(
        self,
        observations: Mapping[str, torch.Tensor],
        state: torch.Tensor | None,
        actions: Mapping[str, torch.Tensor] | None = None,
        active: Mapping[str, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """The input `[*batch, n or 1, size]` from every group's observations `[*batch, n_g, ...]`, the state
        and (an action-value critic's) action features `[*batch, n_g, a_g]`. `active`: per group whose agents
        may leave, `[*batch, n_g]` bool (`marl.core.masking.agents_in`); a centralised input reads zeros for
        an agent that is out. An agent's own input (scope agent) is left as it is: only its own terms read it,
        and they leave its departed steps out."""
        if self.scope == "agent":
            return self._agent_features(self.group, observations, actions, {})  # [*batch, n, d]
        active = active or {}
        own = self._agent_features(self.group, observations, actions, active)  # [*batch, n, d]
        if self.scope == "group":
            shared = own.flatten(-2)  # [*batch, n * d]
        elif self.use_state:
            seen = [
                self._agent_features(g, observations, actions, active, False).flatten(-2) for g in self.action_sizes
            ]
            shared = torch.cat([state.flatten(len(own.shape) - 2), *seen], -1)  # [*batch, state + actions]
        else:
            shared = torch.cat(
                [self._agent_features(g, observations, actions, active).flatten(-2) for g in self.groups], -1
            )
        if self.shared_value or self.agent_ids:
            return shared.unsqueeze(-2)  # [*batch, 1, size - agent_ids]
        return shared.unsqueeze(-2).expand(*own.shape[:-2], self.n, shared.shape[-1])  # [*batch, n, size]


class Critic(nn.Module):
    """`[*B, m, critic input]` -> values `[*B, n]`, in *normalised* units (`m` is `n`, or 1 for an input
    shared by the agents: `CriticInput`'s).

    With value normalisation the network learns `(V - mean) / std` of the value targets seen so far
    (running moments over every target, as in MAPPO's value normalisation): the output layer then
    never has to crawl, one Adam step at a time, to a return of -50 or +500. `value()` gives values in
    reward units. Without it, mean 0 and std 1 are kept, so both are the identity.
    """

    def __init__(
        self,
        in_features: int,
        n_agents: int,
        hidden: Sequence[int],
        activation: str,
        share_params: bool,
        normalize: bool = True,
        shared_value: bool = False,
        gru_hidden: int | None = None,
        agent_ids: int = 0,
    ) -> None:
        super().__init__()
        # A shared value is one network output per env, broadcast to the group's n agents. With agent ids
        # (`CriticInput.agent_ids`) the input comes once and the first layer (the GRU's, if any) adds each
        # agent's id.
        self.n_agents = n_agents
        outputs = 1 if shared_value else n_agents
        self.gru = (
            MultiAgentGRU(in_features, gru_hidden, outputs, share_params, agent_ids=agent_ids > 0)
            if gru_hidden
            else None
        )
        features = gru_hidden or in_features
        ids = 0 if gru_hidden else agent_ids
        self.net = MultiAgentMLP(
            features, 1, 1 if ids else outputs, hidden, activation, share_params, output_gain=1.0, agent_ids=ids
        )
        self.normalize = normalize
        self.register_buffer("target_mean", torch.zeros(()))
        self.register_buffer("target_var", torch.ones(()))
        self.register_buffer("target_count", torch.zeros((), dtype=torch.float64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Values of inputs `x` (an MLP critic), or of GRU outputs (`sequence`, `rollout_values`)."""
        value = self.net(x).reshape(*x.shape[:-2], -1)  # [*B, n], or [*B, 1] for a shared value
        return value.expand(*value.shape[:-1], self.n_agents)

    def sequence(self, x: torch.Tensor, h0: torch.Tensor, reset: torch.Tensor) -> torch.Tensor:
        """A recurrent critic's values `[L, *M, n]` of inputs `[L, *M, m, d]` from state `h0` `[*M, m, h]`,
        the state zeroed before step t where `reset[t]` (`[L, *M]`)."""
        return self(self.gru.scan(x, h0, reset))

    def rollout_values(
        self, x: torch.Tensor, next_x: torch.Tensor, h0: torch.Tensor, reset: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """A recurrent critic over a rollout `[T, B, m, d]` from `h0` `[B, m, h]`: the values of `x` and of
        `next_x` (each step's true next input, seen after that step's state: it bootstraps truncated
        episodes), `[T, B, n]` each in normalised units; the state each step started from `[T, B, m, h]`
        (zero where `reset`) and the state after the last step `[B, m, h]`."""
        y = self.gru.scan(x, h0, reset)  # [T, B, m, h]: the state after each step
        next_state = self.gru(next_x, y)  # one more step from every state at once
        started = torch.cat([h0.unsqueeze(0), y[:-1]]).masked_fill(reset[..., None, None], 0.0)
        return self(y), self(next_state), started, y[-1]

    def value(self, x: torch.Tensor) -> torch.Tensor:
        """Values in reward units."""
        return self.denormalize(self(x))

    def normalize_values(self, value: torch.Tensor) -> torch.Tensor:
        return (value - self.target_mean) / self.target_var.sqrt()

    def denormalize(self, value: torch.Tensor) -> torch.Tensor:
        return value * self.target_var.sqrt() + self.target_mean

    @torch.no_grad()
    def update_moments(self, count: torch.Tensor, total: torch.Tensor, total_sq: torch.Tensor) -> None:
        """Fold a batch's `count`, sum and sum of squares of value targets into the running moments
        (no host sync: every quantity stays a tensor)."""
        if not self.normalize:
            return
        new_count = self.target_count + count
        # A batch may count no target (a group whose agents had all left its envs for the whole rollout):
        # its weight is then 0, and the clamps keep 0 / 0 out.
        batch_mean = total / count.clamp_min(1)
        batch_var = (total_sq / count.clamp_min(1) - batch_mean.square()).clamp_min(0)
        weight = (count / new_count.clamp_min(1)).float()
        delta = batch_mean - self.target_mean
        mean = self.target_mean + weight * delta
        # Chan et al.'s parallel variance: both parts' spreads plus the spread of their means.
        var = (1 - weight) * self.target_var + weight * batch_var
        var = var + weight * (1 - weight) * delta.square()
        self.target_mean.copy_(mean)
        self.target_var.copy_(var.clamp_min(1e-4))
        self.target_count.copy_(new_count)


class QCritic(nn.Module):
    """Action values of a group: `[*B, m, in_features]` -> `[*B, twins, n, outputs]` (`m` is `n`, or 1
    for a shared value, broadcast to the n agents, or 1 for an input shared by the agents, each of which
    the network gives its own value with its id: `agent_ids`, `CriticInput`'s). `outputs` is 1 for Q(s, a),
    or the number of actions for a discrete policy's Q(s, .). `twins` independent networks (SAC's two
    critics) run as one stacked network: every layer is one batched matmul over the twins (and agents,
    without shared parameters), never a loop."""

    def __init__(
        self,
        in_features: int,
        outputs: int,
        n_agents: int,
        hidden: Sequence[int],
        activation: str,
        share_params: bool,
        twins: int = 1,
        shared_value: bool = False,
        agent_ids: int = 0,
    ) -> None:
        super().__init__()
        self.n_agents, self.twins, self.outputs = n_agents, twins, outputs
        self.m = 1 if shared_value or agent_ids else n_agents
        # Shared parameters: one network per twin; else one per twin and agent.
        self.per_agent = not shared_value and not share_params
        stacked = twins * (n_agents if self.per_agent else 1)
        self.net = MultiAgentMLP(
            in_features, outputs, stacked, hidden, activation, share_params=False, agent_ids=agent_ids
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, (m, d) = x.shape[:-2], x.shape[-2:]
        if m != self.m:
            raise ValueError(f"QCritic expects inputs [*B, {self.m}, d], got {tuple(x.shape)}")
        if self.per_agent:  # [*B, twins * m, d]: twin t, agent i at t * m + i
            out = self.net(x.unsqueeze(-3).expand(*batch, self.twins, m, d).reshape(*batch, self.twins * m, d))
        else:  # [*B * m, twins, d] -> [*B * m, twins, outputs], or with agent ids [*B, n, twins, outputs]
            out = self.net(x.reshape(-1, 1, d).expand(-1, self.twins, d)).view(*batch, -1, self.twins, self.outputs)
            out = out.transpose(-3, -2)
        out = out.reshape(*batch, self.twins, -1, self.outputs)
        return out.expand(*batch, self.twins, self.n_agents, self.outputs)

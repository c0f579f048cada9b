"""Collect `T` steps from a batched env into a preallocated time-major buffer on the env's device.

The buffer is a `TensorDict` with `batch_size=[T, B]`. Per group (`[T, B, n, ...]`):
`observation`, `action_mask` (masked discrete actions), `action` (the policy's raw action),
`log_prob`, `reward`, `terminated`, `done` and `next_observation` (the true next observation, which
bootstraps truncated episodes). At the root: `state` and `next_state` when the env has a global state.
Rewards and flags are stored per agent without the trailing 1: `[T, B, n]`.

Nothing in `collect` reads a device value on the host; episode statistics accumulate on the device
and are read once per iteration by the trainer.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from tensordict import TensorDict, TensorDictBase

from marl.compile import maybe_compile
from marl.distributions import draw_noise, raw_action_dtype
from marl.models import Policy


class EpisodeStats:
    """Running returns of unfinished episodes and sums over finished ones, all on the device."""

    def __init__(self, groups: Mapping, num_envs: int, device: torch.device) -> None:
        self.running = {g: torch.zeros(num_envs, s.n_agents, device=device) for g, s in groups.items()}  # [B, n]
        self.length = torch.zeros(num_envs, device=device)  # [B]
        self.clear()

    def clear(self) -> None:
        device = self.length.device
        self.return_sum = {g: torch.zeros((), device=device) for g in self.running}
        self.length_sum = torch.zeros((), device=device)
        self.episodes = torch.zeros((), device=device)

    def update(self, rewards: Mapping[str, torch.Tensor], done: torch.Tensor) -> None:
        """`rewards[g]` `[B, n]`; `done` `[B]` bool: the env's episode ended at this step."""
        self.length += 1
        finished = done.float()
        for g, reward in rewards.items():
            self.running[g] += reward
            # An episode's return for a group: its agents' summed rewards, averaged over the agents.
            self.return_sum[g] += (self.running[g].mean(-1) * finished).sum()
            self.running[g] = torch.where(done[:, None], 0.0, self.running[g])
        self.length_sum += (self.length * finished).sum()
        self.episodes += finished.sum()
        self.length = torch.where(done, 0.0, self.length)

    def state_dict(self) -> dict:
        return {"running": self.running, "length": self.length}

    def load_state_dict(self, state: dict) -> None:
        self.running, self.length = dict(state["running"]), state["length"]


class Collector:
    """Steps `env` with `policies` and fills the buffer; keeps the current observation between calls."""

    def __init__(
        self,
        env,
        policies: Mapping[str, Policy],
        rollout_length: int,
        generator: torch.Generator,
        seed: int,
        compile: bool = False,
    ) -> None:
        self.env, self.policies, self.T, self.generator = env, dict(policies), rollout_length, generator
        self.device = env.device
        self.buffer = self._allocate()
        self.obs = env.reset_data(seed=seed)  # nested dicts of tensors: the step's hot path skips TensorDict
        self.stats = EpisodeStats(env.groups, env.num_envs, env.device)
        self._act = maybe_compile(self._act_eager, compile, self.device)

    def _act_eager(
        self,
        observations: dict[str, torch.Tensor],
        masks: dict[str, torch.Tensor],
        noise: dict[str, torch.Tensor],
    ) -> dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        """Every group's `(raw action, log-prob, env action)` for one step: pure tensor code, so it
        compiles into one graph."""
        out = {}
        for g, policy in self.policies.items():
            dist = policy(observations[g], masks.get(g))
            raw = dist.sample(noise[g])
            out[g] = (raw, dist.log_prob(raw), dist.env_action(raw))
        return out

    def _allocate(self) -> TensorDict:
        env, T, B = self.env, self.T, self.env.num_envs
        data: dict = {}
        for g, spec in env.groups.items():
            n, obs_shape = spec.n_agents, spec.observation.shape
            group = {
                "observation": torch.zeros(T, B, n, *obs_shape),
                "next_observation": torch.zeros(T, B, n, *obs_shape),
                "action": torch.zeros(T, B, n, *spec.action.shape, dtype=raw_action_dtype(spec.action)),
                "log_prob": torch.zeros(T, B, n),
                "reward": torch.zeros(T, B, n),
                "terminated": torch.zeros(T, B, n, dtype=torch.bool),
                "done": torch.zeros(T, B, n, dtype=torch.bool),
            }
            if spec.has_action_mask:
                group["action_mask"] = torch.zeros(T, B, n, spec.action.n, dtype=torch.bool)
            data[g] = group
        if env.state_spec is not None:
            data["state"] = torch.zeros(T, B, *env.state_spec.shape)
            data["next_state"] = torch.zeros(T, B, *env.state_spec.shape)
        return TensorDict(data, batch_size=[T, B]).to(self.device)

    @torch.no_grad()
    def collect(self) -> TensorDict:
        """Run `T` steps; returns the filled buffer (overwritten by the next call)."""
        buffer, env = self.buffer, self.env
        # Leaf tensors looked up once: writing `leaf[t].copy_(x)` avoids TensorDict overhead per step.
        leaves = {g: {k: buffer[g, k] for k in buffer[g].keys()} for g in env.groups}
        has_state = env.state_spec is not None
        B = env.num_envs
        # The whole iteration's sampling noise in one draw per group: [T, B, n, head].
        noise = {
            g: draw_noise(env.groups[g].action, (self.T, B, env.groups[g].n_agents), self.generator, self.device)
            for g in self.policies
        }
        for t in range(self.T):
            obs = self.obs
            observations = {g: obs[g]["observation"] for g in self.policies}
            masks = {g: obs[g]["action_mask"] for g in self.policies if "action_mask" in leaves[g]}
            acted = self._act(observations, masks, {g: noise[g][t] for g in self.policies})
            actions = {}
            for g, (raw, log_prob, env_action) in acted.items():
                leaf = leaves[g]
                leaf["observation"][t].copy_(observations[g])
                leaf["action"][t].copy_(raw)
                leaf["log_prob"][t].copy_(log_prob)
                if g in masks:
                    leaf["action_mask"][t].copy_(masks[g])
                actions[g] = env_action
            if has_state:
                buffer["state"][t].copy_(obs["state"])
            next_data, self.obs = env.step_data(actions)
            rewards = {}
            for g in env.groups:
                leaf, transition = leaves[g], next_data[g]
                rewards[g] = transition["reward"][..., 0]
                leaf["reward"][t].copy_(rewards[g])
                leaf["terminated"][t].copy_(transition["terminated"][..., 0])
                leaf["done"][t].copy_(transition["done"][..., 0])
                leaf["next_observation"][t].copy_(transition["observation"])
            if has_state:
                buffer["next_state"][t].copy_(next_data["state"])
            self.stats.update(rewards, next_data["done"][:, 0])
        return buffer


def observations(
    data: TensorDictBase, groups, next: bool = False
) -> tuple[dict[str, torch.Tensor], torch.Tensor | None]:
    """Every group's (next) observations and the (next) state from a buffer slice."""
    key = "next_observation" if next else "observation"
    obs = {g: data[g, key] for g in groups}
    state = data.get("next_state" if next else "state", None)
    return obs, state

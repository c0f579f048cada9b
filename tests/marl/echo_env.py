"""A toy env for the grouping layer: every agent observes its own id, the env index and the action it
was last given, so a test can see exactly which agent received which action."""

from __future__ import annotations

import dataclasses

import torch

from envs.base import EnvConfig, MultiAgentEnv
from envs.specs import Box, Discrete, GroupSpec


@dataclasses.dataclass(frozen=True)
class EchoConfig(EnvConfig):
    max_steps: int = 5
    green: str = "none"
    """A third group 'green': 'none', 'small_obs' (observation size 2) or 'discrete' (Discrete action)."""


class Echo(MultiAgentEnv):
    name = "echo"
    Config = EchoConfig
    sizes = {"red": 2, "blue": 3}

    def _make_groups(self):
        groups = {
            g: GroupSpec([f"{g}_{i}" for i in range(n)], Box((4,)), Box((2,), -1.0, 1.0)) for g, n in self.sizes.items()
        }
        if self.config.green == "small_obs":
            groups["green"] = GroupSpec(["green_0"], Box((2,)), Box((2,), -1.0, 1.0))
        elif self.config.green == "discrete":
            groups["green"] = GroupSpec(["green_0"], Box((4,)), Discrete(3))
        return groups

    def _init_state(self):
        self.last = {g: torch.zeros(self.num_envs, s.n_agents, 2, device=self.device) for g, s in self.groups.items()}
        self.noise = torch.zeros(self.num_envs, device=self.device)  # [B] a random per-episode value

    def _reset(self, mask):
        for g in self.last:
            self.last[g] = torch.where(mask[:, None, None], 0.0, self.last[g])
        noise = self.rng.rand(self.num_envs)
        self.noise = torch.where(mask, noise, self.noise)

    def uid(self, group):
        offset = sum(s.n_agents for g, s in list(self.groups.items())[: list(self.groups).index(group)])
        n = self.groups[group].n_agents
        return torch.arange(offset, offset + n, device=self.device, dtype=torch.float32)

    def _step(self, action):
        reward = {}
        for g, a in action.items():
            a = a.float().unsqueeze(-1).expand(-1, -1, 2) if a.dim() == 2 else a
            self.last[g] = a
            reward[g] = self.uid(g) + a[..., 0]
        return reward, torch.zeros(self.num_envs, dtype=torch.bool, device=self.device)

    def _observe(self):
        B = self.num_envs
        obs = {}
        for g, spec in self.groups.items():
            n = spec.n_agents
            uid = self.uid(g)[None, :, None].expand(B, n, 1)
            env_index = torch.arange(B, device=self.device, dtype=torch.float32)[:, None, None].expand(B, n, 1)
            full = torch.cat([uid, env_index + self.noise[:, None, None], self.last[g]], -1)
            obs[g] = full[..., : spec.observation.shape[0]]
        return obs

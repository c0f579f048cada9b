"""A tiny on-device env whose agents leave mid-episode, for the learners' tests of departed agents.

`agent_i` plays `lifetimes[i]` steps of each episode and then leaves (`_agent_terminated`); the env
terminates when the last one leaves (max_steps truncates earlier ones). Observation `[position, age]`;
action: a 1-D force in [-1, 1] (or with `discrete` 0/1/2: -1/0/+1) moves the agent while it is in;
reward `-|position|` while in, 0 after. Start positions are uniform in [-1, 1) from the env's stream. Traceable, no
host sync: it serves the compiled rollout and the host-sync checks too.
"""

from __future__ import annotations

import dataclasses

import torch

from envs.base import EnvConfig, MultiAgentEnv
from envs.specs import Box, Discrete, GroupSpec


@dataclasses.dataclass(frozen=True)
class LeaversConfig(EnvConfig):
    max_steps: int = 20
    lifetimes: tuple = (4, 2)
    """Steps each agent plays per episode."""
    discrete: bool = False
    """Discrete(3) actions instead of a Box force."""


class Leavers(MultiAgentEnv):
    name = "leavers"
    Config = LeaversConfig

    def _make_groups(self):
        n = len(self.config.lifetimes)
        action = Discrete(3) if self.config.discrete else Box((1,), -1.0, 1.0)
        return {"agent": GroupSpec([f"agent_{i}" for i in range(n)], Box((2,)), action)}

    def _init_state(self):
        n = len(self.config.lifetimes)
        self.position = torch.zeros(self.num_envs, n, device=self.device)  # [B, n]
        self.age = torch.zeros(self.num_envs, dtype=torch.long, device=self.device)  # [B] steps into the episode
        self.lifetimes = torch.tensor(self.config.lifetimes, device=self.device)  # [n], never changed

    def _reset(self, mask):
        start = self.rng.rand(self.num_envs, len(self.config.lifetimes)) * 2 - 1  # [B, n] in [-1, 1)
        self.position = torch.where(mask[:, None], start, self.position)
        self.age = torch.where(mask, 0, self.age)

    def _step(self, action):
        a = action["agent"]
        force = a.float() - 1 if self.config.discrete else a[..., 0]  # [B, n]
        playing = self.age[:, None] < self.lifetimes  # [B, n]: not yet left before this step
        self.position = torch.where(playing, self.position + force, self.position)
        self.age = self.age + 1
        reward = torch.where(playing, -self.position.abs(), 0.0)
        return {"agent": reward}, self.age >= self.lifetimes.max()

    def _observe(self):
        age = self.age[:, None].float().expand_as(self.position)
        return {"agent": torch.stack([self.position, age], -1)}

    def _agent_terminated(self):
        return {"agent": self.age[:, None] >= self.lifetimes}

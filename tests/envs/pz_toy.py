"""A tiny PettingZoo Parallel env whose agents leave at different times, for the adapter's tests.

`runner_i` lives `lifetimes[i]` steps and is then terminated; with `limit`, every agent still there
is truncated after `limit` steps. Observation: `[position, steps]`; action 0/1/2 moves by -1/0/+1;
reward: the new position. Start positions are random (from the seed; with `seeded=False` from numpy's global
generator, which the seed does not set, as an env that breaks seeding).
"""

from __future__ import annotations

import numpy as np
from gymnasium import spaces
from pettingzoo import ParallelEnv


class RunnersEnv(ParallelEnv):
    metadata = {"name": "runners_v0", "is_parallelizable": True}

    def __init__(self, lifetimes: tuple[int, ...] = (4, 2), limit: int | None = None, seeded: bool = True) -> None:
        self.possible_agents = [f"runner_{i}" for i in range(len(lifetimes))]
        self.lifetimes = dict(zip(self.possible_agents, lifetimes))
        self.limit = limit
        self._observation_space = spaces.Box(-np.inf, np.inf, (2,), np.float32)
        self._action_space = spaces.Discrete(3)
        self.rng = np.random.default_rng()
        self.seeded = seeded

    def observation_space(self, agent):
        return self._observation_space

    def action_space(self, agent):
        return self._action_space

    def reset(self, seed=None, options=None):
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        self.t = 0
        self.agents = list(self.possible_agents)
        normal = self.rng.normal if self.seeded else np.random.normal
        self.position = {agent: float(normal()) for agent in self.agents}
        return {agent: self._observe(agent) for agent in self.agents}, {agent: {} for agent in self.agents}

    def step(self, actions):
        self.t += 1
        for agent in self.agents:
            self.position[agent] += int(actions[agent]) - 1
        observations = {agent: self._observe(agent) for agent in self.agents}
        rewards = {agent: self.position[agent] for agent in self.agents}
        terminations = {agent: self.t >= self.lifetimes[agent] for agent in self.agents}
        truncations = {agent: self.limit is not None and self.t >= self.limit for agent in self.agents}
        infos = {agent: {} for agent in self.agents}
        self.agents = [agent for agent in self.agents if not (terminations[agent] or truncations[agent])]
        return observations, rewards, terminations, truncations, infos

    def _observe(self, agent):
        return np.array([self.position[agent], self.t], dtype=np.float32)


def parallel_env(**kwargs) -> RunnersEnv:
    return RunnersEnv(**kwargs)

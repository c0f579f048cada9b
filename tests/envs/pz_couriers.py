"""A deterministic PettingZoo Parallel env of two agent types whose couriers leave mid-episode, end to end.

Agents: `courier_0 .. courier_{n-1}` and `dispatcher_0`. Action 0/1/2 moves a courier by -1/0/+1 (the
dispatcher's is ignored). Couriers start at 0 and leave `env.agents`, terminated:
- `courier_1` after `leave_at` steps (a set step);
- `courier_2` .. when it reaches `|position| >= goal` (a condition on its own actions), with a bonus of 5.
`courier_0` and the dispatcher stay until `max_cycles`, which truncates every agent still in.
Observations: a courier's `[position, steps, index]`, the dispatcher's `[couriers in, steps]`. Rewards: a
courier's `-|position|` (plus the bonus), the dispatcher's the number of couriers in after the step.
No randomness: the same actions give the same episode whatever the seed.
"""

from __future__ import annotations

import numpy as np
from gymnasium import spaces
from pettingzoo import ParallelEnv


class CouriersEnv(ParallelEnv):
    metadata = {"name": "couriers_v0", "is_parallelizable": True}

    def __init__(self, n_couriers: int = 3, leave_at: int = 2, goal: int = 2, max_cycles: int = 8) -> None:
        self.couriers = [f"courier_{i}" for i in range(n_couriers)]
        self.possible_agents = [*self.couriers, "dispatcher_0"]
        self.leave_at, self.goal, self.max_cycles = leave_at, goal, max_cycles
        # one space object per agent, as PettingZoo's API test asks
        self._observation_spaces = {
            agent: spaces.Box(-np.inf, np.inf, (2,) if agent == "dispatcher_0" else (3,), np.float32)
            for agent in self.possible_agents
        }
        self._action_spaces = {agent: spaces.Discrete(3) for agent in self.possible_agents}

    def observation_space(self, agent):
        return self._observation_spaces[agent]

    def action_space(self, agent):
        return self._action_spaces[agent]

    def reset(self, seed=None, options=None):
        self.t = 0
        self.agents = list(self.possible_agents)
        self.position = dict.fromkeys(self.couriers, 0)
        self.couriers_in = len(self.couriers)
        return {agent: self._observe(agent) for agent in self.agents}, {agent: {} for agent in self.agents}

    def step(self, actions):
        self.t += 1
        leaving = set()
        for agent in self.agents:
            if agent == "dispatcher_0":
                continue
            self.position[agent] += int(actions[agent]) - 1
            if (agent == "courier_1" and self.t >= self.leave_at) or (
                agent not in ("courier_0", "courier_1") and abs(self.position[agent]) >= self.goal
            ):
                leaving.add(agent)
        self.couriers_in = sum(agent in self.couriers and agent not in leaving for agent in self.agents)
        rewards = {
            agent: float(self.couriers_in)
            if agent == "dispatcher_0"
            else -abs(self.position[agent]) + (5.0 if agent in leaving and agent != "courier_1" else 0.0)
            for agent in self.agents
        }
        observations = {agent: self._observe(agent) for agent in self.agents}
        terminations = {agent: agent in leaving for agent in self.agents}
        truncations = {agent: self.t >= self.max_cycles and agent not in leaving for agent in self.agents}
        infos = {agent: {} for agent in self.agents}
        self.agents = [a for a in self.agents if not (terminations[a] or truncations[a])]
        return observations, rewards, terminations, truncations, infos

    def _observe(self, agent):
        if agent == "dispatcher_0":
            return np.array([self.couriers_in, self.t], dtype=np.float32)
        return np.array([self.position[agent], self.t, self.couriers.index(agent)], dtype=np.float32)


def parallel_env(n_couriers: int = 3, leave_at: int = 2, goal: int = 2, max_cycles: int = 8) -> CouriersEnv:
    return CouriersEnv(n_couriers, leave_at, goal, max_cycles)

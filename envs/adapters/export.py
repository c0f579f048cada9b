"""`to_pettingzoo(env)`: any vecmarl env as a PettingZoo `ParallelEnv`, numpy in and out.

    par_env = envs.to_pettingzoo(envs.make("navigation", num_envs=1, seed=0))
    observations, infos = par_env.reset(seed=0)
    observations, rewards, terminations, truncations, infos = par_env.step(actions)

The exported env is one env of the batch (`index`); every env of the batch steps with the same
actions, so make the vecmarl env with `num_envs=1` unless you want the others to run too. Spaces come
from the group specs: an agent of a group with action masks observes a Dict
`{"observation": Box, "action_mask": Box(0, 1, (n,), int8)}`, as PettingZoo's classic games do.
Agents whose per-agent `done` is set leave `agents`, as PettingZoo expects; when the env is done all
of them have left, and the next `reset()` starts a new episode. Until then the env stays as the last
action left it, for `render()` and `state()` (the batch's other envs start their next episode as they end,
from the draws vecmarl's auto-reset takes); `reset()` draws a fresh start, so that `reset(seed=s)`
reproduces an episode.
It passes PettingZoo's `parallel_api_test` and `parallel_seed_test` (see tests/envs/adapters/test_export.py).

`step(actions)` needs an action for every agent in `agents`, of its action space's shape (an integer for
a discrete one); a missing or unknown agent, a wrong shape, a discrete action that is not an integer
of its space, or a NaN or infinite continuous one is a ValueError (continuous actions outside their
bounds are clipped, as in every vecmarl env). Actions of agents that have left are ignored, as
PettingZoo's envs do. `render_modes` is `["rgb_array"]` when the wrapped env renders
(`MultiAgentEnv.renders`), else empty.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch
from tensordict import TensorDictBase

try:
    from pettingzoo import ParallelEnv
except ImportError as error:
    raise ImportError(
        f'to_pettingzoo needs pettingzoo ({error}); install it with: pip install "vecmarl[pettingzoo]"'
    ) from error

from envs.base import MultiAgentEnv, check_is_env
from envs.specs import Box


class VecmarlParallelEnv(ParallelEnv):
    """One env of a vecmarl batch behind PettingZoo's Parallel API."""

    def __init__(self, env: MultiAgentEnv, index: int = 0) -> None:
        check_is_env(env, "to_pettingzoo")
        if isinstance(index, bool) or not isinstance(index, (int, np.integer)):
            raise TypeError(f"{env.name}: index must be an int, got {type(index).__name__} {index!r}")
        if not 0 <= index < env.num_envs:
            raise IndexError(f"{env.name}: index must be in [0, {env.num_envs}), got {index}")
        self.env, self.index = env, index
        render_modes = ["rgb_array"] if env.renders else []
        self.metadata = {"name": env.name, "render_modes": render_modes, "is_parallelizable": True}
        self.render_mode = "rgb_array" if render_modes else None
        self.possible_agents = list(env.agents)
        self.agents: list[str] = []
        self._slot = {agent: (group, j) for group, spec in env.groups.items() for j, agent in enumerate(spec.agents)}
        self._others = torch.arange(env.num_envs, device=env.device) != index  # [B]: the envs reset as they end
        self._obs: TensorDictBase | None = None
        # One space object per agent, kept: PettingZoo seeds and samples them in place.
        self._observation_spaces = {agent: self._observation_space(agent) for agent in self.possible_agents}
        self._action_spaces = {
            agent: env.groups[self._slot[agent][0]].action.to_gymnasium() for agent in self.possible_agents
        }

    def observation_space(self, agent: str):
        return self._observation_spaces[agent]

    def action_space(self, agent: str):
        return self._action_spaces[agent]

    def reset(self, seed: int | None = None, options: dict | None = None):
        self._obs = self.env.reset(seed=seed)
        self.agents = list(self.possible_agents)
        return self._observations(self._obs, self.agents), {agent: {} for agent in self.agents}

    def step(self, actions: dict):
        if not self.agents:
            raise RuntimeError(f"{self.env.name}: step() after the episode ended; call reset() first")
        # Not the auto-reset, which would leave `render()` the next episode's start: this env waits for `reset()`.
        next_td, _ = self.env.step(self._batched_actions(self._checked_actions(actions)), auto_reset=False)
        self._obs = self.env.reset(mask=next_td["done"][:, 0] & self._others)
        acting = self.agents
        row = next_td[self.index]
        rewards, terminations, truncations = {}, {}, {}
        for agent in acting:
            group, j = self._slot[agent]
            rewards[agent] = float(row[group, "reward"][j, 0])
            terminations[agent] = bool(row[group, "terminated"][j, 0])
            truncations[agent] = bool(row[group, "truncated"][j, 0])
        self.agents = [a for a in acting if not (terminations[a] or truncations[a])]
        infos = {agent: {} for agent in acting}
        return self._observations(next_td, acting), rewards, terminations, truncations, infos

    def render(self) -> np.ndarray:
        return self.env.render(self.index)

    def state(self) -> np.ndarray:
        if self._obs is None or "state" not in self._obs.keys():
            raise NotImplementedError(f"{self.env.name} has no global state")
        return self._obs["state"][self.index].cpu().numpy()

    def close(self) -> None:
        pass

    def _observation_space(self, agent: str):
        import gymnasium

        spec = self.env.groups[self._slot[agent][0]]
        observation = spec.observation.to_gymnasium()
        if not spec.has_action_mask:
            return observation
        mask = gymnasium.spaces.Box(0, 1, (spec.action.n,), dtype=np.int8)
        return gymnasium.spaces.Dict({"observation": observation, "action_mask": mask})

    def _observations(self, td: TensorDictBase, agents: list[str]) -> dict:
        row = td[self.index].cpu()
        out = {}
        for agent in agents:
            group, j = self._slot[agent]
            observation = row[group, "observation"][j].numpy()
            if self.env.groups[group].has_action_mask:
                observation = {
                    "observation": observation,
                    "action_mask": row[group, "action_mask"][j].numpy().astype(np.int8),
                }
            out[agent] = observation
        return out

    def _checked_actions(self, actions: dict) -> dict[str, np.ndarray]:
        """The live agents' actions as numpy arrays of their action space's shape; raises a ValueError
        naming the agent where PettingZoo's envs would raise. Actions of agents that left are dropped."""
        name = self.env.name
        if not isinstance(actions, Mapping):
            raise TypeError(f"{name}: actions must be a dict agent -> action, got {type(actions).__name__}")
        unknown = [agent for agent in actions if agent not in self._slot]
        if unknown:
            raise ValueError(f"{name}: actions for unknown agents {unknown}; the agents are {self.possible_agents}")
        missing = [agent for agent in self.agents if agent not in actions]
        if missing:
            raise ValueError(f"{name}: no action for live agents {missing}; every agent in `agents` needs one")
        checked = {}
        for agent in self.agents:
            space, value = self._action_spaces[agent], np.asarray(actions[agent])
            discrete = not isinstance(self.env.groups[self._slot[agent][0]].action, Box)
            if value.shape != space.shape:
                raise ValueError(
                    f"{name}: the action of {agent!r} has shape {value.shape}, expected {space.shape} ({space})"
                )
            if value.dtype.kind not in ("iu" if discrete else "iuf"):
                expected = "an integer" if discrete else "a number"
                raise ValueError(
                    f"{name}: the action of {agent!r} is {value.tolist()!r} ({value.dtype}), expected {expected} "
                    f"in each entry ({space})"
                )
            # Values the wrapped env does not check (it would with check_values, at a host sync per step; here
            # the actions are on the host already): out of range, NaN or inf. A move its mask forbids is left
            # to the env, as PettingZoo does: its own seed test samples actions without the mask.
            action = self.env.groups[self._slot[agent][0]].action
            if discrete:
                high = np.asarray(action.nvec if action.shape else action.n)
                if np.any((value < 0) | (value >= high)):
                    raise ValueError(f"{name}: the action of {agent!r} is {value.tolist()!r}, outside {space}")
            elif not np.all(np.isfinite(value)):
                raise ValueError(f"{name}: the action of {agent!r} is {value.tolist()!r}, expected finite numbers")
            checked[agent] = value
        return checked

    def _batched_actions(self, actions: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
        """Checked `{agent: action}` -> `{group: [B, n, *shape]}`, the same for every env of the batch;
        agents without an action (those that left) get zeros, which the env ignores."""
        batched = {}
        for group, spec in self.env.groups.items():
            dtype = spec.action.dtype
            per_agent = [
                torch.as_tensor(actions[a], dtype=dtype)
                if a in actions
                else torch.zeros(spec.action.shape, dtype=dtype)
                for a in spec.agents
            ]
            value = torch.stack(per_agent).to(self.env.device)  # [n, *shape]
            batched[group] = value.expand(self.env.num_envs, *value.shape).clone()
            if isinstance(spec.action, Box):
                batched[group] = batched[group].float()
        return batched


def to_pettingzoo(env: MultiAgentEnv, index: int = 0) -> VecmarlParallelEnv:
    """Env `index` of `env`'s batch as a PettingZoo `ParallelEnv` (numpy observations and actions)."""
    return VecmarlParallelEnv(env, index)

"""Small envs that each break one property of the env contract, for testing `check_env`.

`Counter` is a correct toy env: each agent's position drifts by its action; rewards are minus the
distance to a random target. Each subclass breaks one thing.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from envs.base import EnvConfig, MultiAgentEnv
from envs.specs import Box, Discrete, GroupSpec


@dataclasses.dataclass(frozen=True)
class CounterConfig(EnvConfig):
    max_steps: int = 6
    n_agents: int = 2


class Counter(MultiAgentEnv):
    name = "counter"
    Config = CounterConfig

    def _make_groups(self):
        n = self.config.n_agents
        return {
            "mover": GroupSpec([f"mover_{i}" for i in range(n)], Box((2,)), Box((1,), -1.0, 1.0)),
            "picker": GroupSpec(["picker_0"], Box((1,)), Discrete(3, masked=True)),
        }

    def _init_state(self):
        B, n = self.num_envs, self.config.n_agents
        self.pos = torch.zeros(B, n, device=self.device)  # [B, n]
        self.target = torch.zeros(B, n, device=self.device)  # [B, n]
        self.picks = torch.zeros(B, device=self.device)  # [B]

    def _reset(self, mask):
        target = self.rng.rand(self.num_envs, self.config.n_agents)
        self.target = torch.where(mask[:, None], target, self.target)
        self.pos = torch.where(mask[:, None], 0.0, self.pos)
        self.picks = torch.where(mask, 0.0, self.picks)

    def _step(self, action):
        self.pos = self.pos + action["mover"][..., 0]
        self.picks = self.picks + action["picker"][:, 0].float()
        distance = (self.pos - self.target).abs()
        reward = {"mover": -distance, "picker": -distance.mean(-1, keepdim=True)}
        terminated = (distance < 0.05).all(-1)
        return reward, terminated

    def _observe(self):
        return {
            "mover": torch.stack([self.pos, self.target], -1),
            "picker": self.picks[:, None, None],
        }

    def _action_mask(self):
        mask = torch.ones(self.num_envs, 1, 3, dtype=torch.bool, device=self.device)
        mask[..., 2] = False  # action 2 is never allowed
        return {"picker": mask}

    def _render(self, index):
        return np.zeros((8, 8, 3), dtype=np.uint8)


class WrongShape(Counter):
    def _observe(self):
        obs = super()._observe()
        obs["mover"] = obs["mover"][..., :1]
        return obs


class WrongDtype(Counter):
    def _observe(self):
        obs = super()._observe()
        obs["mover"] = obs["mover"].double()
        return obs


class NanReward(Counter):
    def _step(self, action):
        reward, terminated = super()._step(action)
        reward["mover"] = reward["mover"] / 0.0 * 0.0
        return reward, terminated


class NanRewardAtStep3(Counter):
    """Env 2's movers get a NaN reward on the third step of an episode (the base class counts steps after
    `_step`, so `step_count` is 2 there); every other reward is finite."""

    def _step(self, action):
        reward, terminated = super()._step(action)
        env2_at_step3 = (torch.arange(self.num_envs, device=self.device) == 2) & (self.step_count == 2)  # [B]
        reward["mover"] = torch.where(env2_at_step3[:, None], float("nan"), reward["mover"])
        return reward, terminated


class InfObservation(Counter):
    """Env 1's mover observation is inf once it has stepped (a division by a distance that reached 0, say)."""

    def _observe(self):
        obs = super()._observe()
        env1_stepped = (torch.arange(self.num_envs, device=self.device) == 1) & (self.step_count > 0)  # [B]
        obs["mover"] = torch.where(env1_stepped[:, None, None], float("inf"), obs["mover"])
        return obs


class HostSync(Counter):
    def _step(self, action):
        reward, terminated = super()._step(action)
        if terminated.any():  # reads a device value on the host
            pass
        return reward, terminated


class HostToDevice(Counter):
    def _step(self, action):
        reward, terminated = super()._step(action)
        step_cost = torch.tensor(0.01, device=self.device)  # a host->device copy on every step: a sync on CUDA
        reward["mover"] = reward["mover"] - step_cost
        return reward, terminated


class GlobalRandom(Counter):
    """Draws from torch's global generator instead of the env's own stream: seeds do not reproduce runs."""

    def _reset(self, mask):
        target = torch.rand(self.num_envs, self.config.n_agents, device=self.device)
        self.target = torch.where(mask[:, None], target, self.target)
        self.pos = torch.where(mask[:, None], 0.0, self.pos)
        self.picks = torch.where(mask, 0.0, self.picks)


class KeepsPositionOnReset(Counter):
    """Its _reset redraws the targets but leaves the positions: an episode starts where the last one ended."""

    def _reset(self, mask):
        target = self.rng.rand(self.num_envs, self.config.n_agents)
        self.target = torch.where(mask[:, None], target, self.target)
        self.picks = torch.where(mask, 0.0, self.picks)


class LeakyEnvs(Counter):
    """Rewards depend on the mean position over the whole batch: envs are not independent."""

    def _step(self, action):
        reward, terminated = super()._step(action)
        reward["mover"] = reward["mover"] - self.pos.mean()
        return reward, terminated


class ResetsEveryEnv(Counter):
    """Resets every env whatever the mask (so auto-reset restarts envs that are not done)."""

    def _reset(self, mask):
        super()._reset(torch.ones_like(mask))


class IgnoresResetMask(Counter):
    """Its public `reset(mask=...)` resets every env."""

    def reset(self, seed=None, *, mask=None):
        return super().reset(seed)


class SkipsAutoReset(Counter):
    """Hands the finished episode's final observation back as `obs`: no fresh start."""

    def step(self, action):
        next_td, obs = super().step(action)
        for group in self.groups:
            obs[group, "observation"] = next_td[group, "observation"]
        return next_td, obs


class OverwritesNext(Counter):
    """Returns the reset observation as `next`: the true final observation is lost."""

    def step(self, action):
        next_td, obs = super().step(action)
        for group in self.groups:
            next_td[group, "observation"] = obs[group, "observation"]
        return next_td, obs


class StepWithoutAutoReset(Counter):
    """Overrides `step` as a wrapper might, without the `auto_reset` keyword: `step(action)` works, a
    recording's step (`step(action, auto_reset=False)`, `marl eval --render`) fails."""

    def step(self, action):
        return super().step(action)


class IgnoresAutoResetFalse(Counter):
    """Takes `auto_reset` but does not pass it on: the step resets the done envs, and the caller's reset
    after it draws them a second start."""

    def step_data(self, action, *, auto_reset=True):
        return super().step_data(action)


class TimeLimitAsTermination(Counter):
    """Reports hitting the time limit as a termination."""

    def step(self, action):
        next_td, obs = super().step(action)
        for td in [next_td, *(next_td[g] for g in self.groups)]:
            td["terminated"] = td["terminated"] | td["truncated"]
            td["truncated"] = torch.zeros_like(td["truncated"])
        return next_td, obs


class BadRender(Counter):
    def _render(self, index):
        return np.zeros((8, 8), dtype=np.float32)


class SharedAgentNames(Counter):
    def _make_groups(self):
        groups = super()._make_groups()
        groups["picker"] = GroupSpec(["mover_0"], Box((1,)), Discrete(3, masked=True))
        return groups


# Mistakes in what the author's methods return: the base class names them on the first reset or step,
# in `check_env` and in training alike (before, some crashed deep in torch or trained on wrong data).


class PerEnvReward(Counter):
    """A team reward `[B]` where the contract asks for one per agent, `[B, n]`."""

    def _step(self, action):
        reward, terminated = super()._step(action)
        reward["mover"] = reward["mover"].mean(-1)
        return reward, terminated


class MissingRewardGroup(Counter):
    def _step(self, action):
        reward, terminated = super()._step(action)
        del reward["picker"]
        return reward, terminated


class PerAgentTerminated(Counter):
    """Terminated `[B, n]` per agent instead of one flag per env `[B]`."""

    def _step(self, action):
        reward, terminated = super()._step(action)
        return reward, (self.pos - self.target).abs() < 0.05


class FloatTerminated(Counter):
    def _step(self, action):
        reward, terminated = super()._step(action)
        return reward, terminated.float()


class IntActionMask(Counter):
    def _action_mask(self):
        return {"picker": super()._action_mask()["picker"].long()}


class UndeclaredActionMask(Counter):
    """Publishes an action mask for a group whose spec is not `Discrete(masked=True)`: samplers and
    policies would ignore it."""

    def _make_groups(self):
        groups = super()._make_groups()
        groups["picker"] = GroupSpec(["picker_0"], Box((1,)), Discrete(3))
        return groups


class AliasedObservation(Counter):
    """`_observe` hands out the state tensor itself, and `_reset` updates it in place: the auto-reset
    overwrites `next`'s final observation."""

    def _make_groups(self):
        groups = super()._make_groups()
        groups["mover"] = GroupSpec(groups["mover"].agents, Box((1,)), groups["mover"].action)
        return groups

    def _init_state(self):
        super()._init_state()
        self.pos = torch.zeros(self.num_envs, self.config.n_agents, 1, device=self.device)  # [B, n, 1]

    def _reset(self, mask):
        target = self.rng.rand(self.num_envs, self.config.n_agents)
        self.target = torch.where(mask[:, None], target, self.target)
        self.pos.copy_(torch.where(mask[:, None, None], target[..., None], self.pos))
        self.picks = torch.where(mask, 0.0, self.picks)

    def _step(self, action):
        self.pos.add_(action["mover"])
        distance = (self.pos[..., 0] - self.target).abs()
        return {"mover": -distance, "picker": -distance.mean(-1, keepdim=True)}, (distance < 0.05).all(-1)

    def _observe(self):
        return {"mover": self.pos, "picker": self.picks[:, None, None]}


class RewardOnly(Counter):
    """`_step` returns the rewards alone, without the termination flags."""

    def _step(self, action):
        reward, _ = super()._step(action)
        return reward


class NoActionAllowed(Counter):
    """The picker's mask allows no action once it has picked more than twice (a mask for an agent that
    "is out"): every sampler and policy then picks a forbidden action."""

    def _action_mask(self):
        mask = super()._action_mask()["picker"]
        return {"picker": mask & (self.picks < 3)[:, None, None]}


class StateCreatedInStep(Counter):
    """`_step` first creates a state tensor: eager it steps, compiled the tensor would be a graph output
    that the next call overwrites."""

    def _step(self, action):
        self.steps_taken = getattr(self, "steps_taken", torch.zeros(self.num_envs, device=self.device)) + 1
        return super()._step(action)


class PythonNumberState(Counter):
    """Keeps a step count in a Python int: one value for every env, never reset per env."""

    def _init_state(self):
        super()._init_state()
        self.elapsed = 0

    def _step(self, action):
        self.elapsed += 1
        return super()._step(action)


class Exits(Counter):
    """A correct env whose movers leave: a mover that has moved right past 0.5 is out (`_agent_terminated`)
    with reward 0 until its env resets; the env terminates when every mover is out."""

    def _init_state(self):
        super()._init_state()
        self.out = torch.zeros(self.num_envs, self.config.n_agents, dtype=torch.bool, device=self.device)  # [B, n]

    def _reset(self, mask):
        super()._reset(mask)
        self.out = torch.where(mask[:, None], False, self.out)

    def _step(self, action):
        reward, _ = super()._step(action)
        was_out = self.out
        self.out = self.out | (self.pos > 0.5)
        reward["mover"] = torch.where(was_out, 0.0, reward["mover"])
        return reward, self.out.all(-1)

    def _agent_terminated(self):
        return {"mover": self.out.clone()}


class KeepsDepartedOnReset(Exits):
    """Its _reset forgets to bring the departed movers back: every later episode starts with them out."""

    def _reset(self, mask):
        Counter._reset(self, mask)


class DepartedComeBack(Exits):
    """Reports a mover out only while it stands past 0.5: one that moves back is in again mid-episode."""

    def _agent_terminated(self):
        return {"mover": self.pos > 0.5}


class DepartedEarnReward(Exits):
    """Keeps rewarding a mover after it has left (its reward should be 0 until its env resets)."""

    def _step(self, action):
        reward, terminated = super()._step(action)
        return {"mover": -(self.pos - self.target).abs(), "picker": reward["picker"]}, terminated


class LoopsOverEnvs(Counter):
    """Computes each env's distance in a Python loop over the envs: one small op per env on every step."""

    def _step(self, action):
        reward, terminated = super()._step(action)
        distance = torch.stack([(self.pos[b] - self.target[b]).abs() for b in range(self.num_envs)])  # [B, n]
        return {"mover": -distance, "picker": reward["picker"]}, terminated


class LoopsOverAgents(Counter):
    """Computes each mover's distance in a Python loop over the agents: one small op per agent on every step."""

    def _step(self, action):
        reward, terminated = super()._step(action)
        distance = torch.stack([(self.pos[:, i] - self.target[:, i]).abs() for i in range(self.config.n_agents)], 1)
        return {"mover": -distance, "picker": reward["picker"]}, terminated  # distance: [B, n]


@dataclasses.dataclass(frozen=True)
class AtMost3MoversConfig(CounterConfig):
    n_agents: int = 3

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 1 <= self.n_agents <= 3:
            raise ValueError(f"n_agents must be in [1, 3], got {self.n_agents}")


class LoopsOverAtMost3Agents(LoopsOverAgents):
    """`LoopsOverAgents` at the most agents its config takes."""

    Config = AtMost3MoversConfig


class ObservationOutOfBounds(Counter):
    """Declares the movers' target (observation element 1) in [0, 0.5], but draws it in [0, 1)."""

    def _make_groups(self):
        groups = super()._make_groups()
        mover = dataclasses.replace(groups["mover"], observation=Box((2,), (-1e9, 0.0), (1e9, 0.5)))
        return {**groups, "mover": mover}


class KeepsLastPickOnReset(Counter):
    """The picker observes its last pick, which _reset forgets to clear: an episode starts showing the last
    one's final pick (the same after any run whose last actions were the same)."""

    def _reset(self, mask):
        picks = self.picks
        super()._reset(mask)
        self.picks = picks

    def _step(self, action):
        reward, terminated = super()._step(action)
        self.picks = action["picker"][:, 0].float()
        return reward, terminated

"""An off-policy algorithm for the tests, registered as `--algo reward_model`: what the run loop does for
an algorithm that learns from a replay buffer (`collects = "transitions"`).

Each group's model learns the reward of (observation, action) from transitions drawn from the buffer,
uniformly or prioritized by the model's last errors; the acting policies stay as initialised. A test
fixture for the buffer's wiring (size printed, extended every iteration, sampled, priorities updated,
saved with `--save-buffer`, exact resume), not a method anyone would train with.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from tensordict import TensorDict

from envs.specs import Box
from marl.algorithms import Algorithm, register
from marl.config import AlgorithmConfig, TrainConfig
from marl.core.models import Policy, flat_observation, observation_size
from marl.core.networks import MultiAgentMLP
from marl.core.replay import Prioritized, ReplayBuffer
from marl.core.rollout import Acting
from marl.optim.update_step import Trainable, UpdateStep, adam


@dataclass(frozen=True)
class RewardModelConfig(AlgorithmConfig):
    """A reward model learned from replayed transitions."""

    algo: str = "reward_model"
    """The algorithm."""
    buffer_size: int = 4096
    """Replay buffer capacity, in env steps."""
    batch_size: int = 64
    """Transitions per optimiser step."""
    steps: int = 2
    """Optimiser steps per iteration."""
    prioritized: bool = False
    """Draw transitions in proportion to the model's last error on them."""
    lr: float = 1e-2
    """Adam learning rate."""

    run_wide = ("buffer_size", "batch_size", "steps", "prioritized")

    def check(self) -> None:
        for name in ("buffer_size", "batch_size", "steps"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")


def action_features(action: torch.Tensor, spec) -> torch.Tensor:
    """A group's raw actions `[k, n, ...]` as model inputs `[k, n, features]`."""
    if isinstance(spec.action, Box):
        return action.flatten(2)
    return F.one_hot(action, spec.action.n).float()


@register("reward_model")
class RewardModel(Algorithm):
    Config = RewardModelConfig
    collects = "transitions"

    def __init__(self, config: TrainConfig, env, device: torch.device, world, generator: torch.Generator) -> None:
        super().__init__(config, env, device, world, generator)
        self.policies, self.models, trainables = {}, {}, {}
        for g, spec in env.groups.items():
            algo, model = config.for_group(g)
            policy = Policy(spec, model.hidden, model.activation, model.share_params, model.log_std_init, model.std)
            self.policies[g] = policy.to(device)
            actions = spec.action.shape[0] if isinstance(spec.action, Box) else spec.action.n
            net = MultiAgentMLP(observation_size(spec) + actions, 1, spec.n_agents, model.hidden, model.activation)
            self.models[g] = net.to(device)
            trainables[g] = Trainable({"model": self.models[g]}, adam(net.parameters(), lr=algo.lr, eps=1e-8), 0.0)
        self.step = UpdateStep(trainables, self._loss, device, world, compile=config.run.compile)

    @property
    def acting(self) -> Acting:
        return Acting(self.policies)

    def replay(self) -> tuple[int, Prioritized | None]:
        algo = self.config.algo
        return algo.buffer_size, Prioritized() if algo.prioritized else None

    def update(self, buffer: ReplayBuffer, timer) -> dict[str, dict[str, torch.Tensor]]:
        algo = self.config.algo
        losses = []
        for _ in range(algo.steps):
            sample = buffer.sample(algo.batch_size, self.generator)
            losses.append(self.step(sample))
            if algo.prioritized:
                with torch.no_grad():
                    errors = {g: self._error(sample, g).abs() for g in self.models}
                buffer.update_priority(sample["index"], errors)
        fill = buffer.size.float() / buffer.capacity
        return {
            g: {"loss": torch.stack([out[g][0] for out in losses]).mean(), "buffer_fill": fill} for g in self.models
        }

    def _error(self, sample: TensorDict, g: str) -> torch.Tensor:
        """The model's error on group `g`'s rewards, `[k, n]`."""
        spec, data = self.env.groups[g], sample[g]
        inputs = torch.cat([flat_observation(data["observation"], spec), action_features(data["action"], spec)], -1)
        return self.models[g](inputs).squeeze(-1) - data["reward"]

    def _loss(self, sample: TensorDict):
        weight = sample.get("weight", None)  # [k], prioritized only
        total, terms = 0.0, {}
        for g in self.models:
            squared = self._error(sample, g).square().mean(-1)  # [k]
            loss = (squared * weight).mean() if weight is not None else squared.mean()
            total = total + loss
            terms[g] = loss.detach().reshape(1)
        return total, terms

    def parameters(self) -> list[torch.Tensor]:
        return [p for g in self.models for net in (self.policies[g], self.models[g]) for p in net.parameters()]

    def state_dict(self) -> dict:
        optimizers = {g: t.optimizer for g, t in self.step.trainables.items()}
        return {
            g: {
                "policy": self.policies[g].state_dict(),
                "model": m.state_dict(),
                "optimizer": optimizers[g].state_dict(),
            }
            for g, m in self.models.items()
        }

    def load_state_dict(self, state: dict) -> None:
        for g, model in self.models.items():
            self.policies[g].load_state_dict(state[g]["policy"])
            model.load_state_dict(state[g]["model"])
            self.step.trainables[g].optimizer.load_state_dict(state[g]["optimizer"])

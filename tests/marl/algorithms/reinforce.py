"""REINFORCE, registered as `--algo reinforce`: all it takes to add an algorithm to vecmarl.

    marl train --imports tests.marl.algorithms.reinforce --algo reinforce --baseline-decay 0.9

Each group's policy is trained on its Monte-Carlo returns-to-go within the iteration's batch (an episode
cut by the batch's end counts what it has so far), minus a running mean baseline, with one gradient step
per iteration. Used by the tests: it trains, checkpoints, resumes and evaluates through `marl train` and
`marl eval` without any of them knowing it. `reinforce_seeds.py` trains it as a population (`--seeds`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from tensordict import TensorDict

import kernels
from marl.algorithms import Algorithm, register
from marl.config import AlgorithmConfig, TrainConfig
from marl.core.models import Policy
from marl.core.rollout import Acting
from marl.optim.update_step import Trainable, UpdateStep, adam


@dataclass(frozen=True)
class ReinforceConfig(AlgorithmConfig):
    """REINFORCE's options."""

    algo: str = "reinforce"
    """The algorithm."""
    lr: float = 3e-3
    """Adam learning rate."""
    gamma: float = 0.99
    """Discount factor."""
    baseline_decay: float = 0.9
    """Decay of the running mean return subtracted from the returns."""
    max_grad_norm: float = 1.0
    """Clip the policy's gradient norm to this (0: no clipping)."""

    def check(self) -> None:
        if self.lr <= 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        for name in ("gamma", "baseline_decay"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"{name} must be in [0, 1], got {getattr(self, name)}")


@register("reinforce")
class Reinforce(Algorithm):
    Config = ReinforceConfig

    def __init__(self, config: TrainConfig, env, device: torch.device, world, generator: torch.Generator) -> None:
        super().__init__(config, env, device, world, generator)
        self.policies, self.baselines, trainables = {}, {}, {}
        for g, spec in env.groups.items():
            algo, model = config.for_group(g)
            policy = Policy(spec, model.hidden, model.activation, model.share_params, model.log_std_init, model.std)
            self.policies[g] = policy.to(device)
            self.baselines[g] = torch.zeros((), device=device)
            optimizer = adam(self.policies[g].parameters(), lr=algo.lr, eps=1e-8)
            trainables[g] = Trainable({"policy": self.policies[g]}, optimizer, algo.max_grad_norm)
        self.step = UpdateStep(trainables, self._loss, device, world, compile=config.run.compile)

    @property
    def acting(self) -> Acting:
        return Acting(self.policies)

    def update(self, batch: TensorDict, timer) -> dict[str, dict[str, torch.Tensor]]:
        advantages = {}
        for g in self.policies:
            algo, _ = self.config.for_group(g)
            data = batch[g]
            returns = kernels.discounted_returns(data["reward"], data["done"], gamma=algo.gamma)  # [T, B, n]
            baseline = self.baselines[g]
            baseline.lerp_(returns.mean(), 1 - algo.baseline_decay)
            advantages[g] = returns - baseline
        out = self.step(batch, advantages)
        return {g: {"loss": v[0], "entropy": v[1], "grad_norm": v[2]} for g, v in out.items()}

    def _loss(self, batch: TensorDict, advantages: dict[str, torch.Tensor]):
        total, terms = 0.0, {}
        for g, policy in self.policies.items():
            data = batch[g]
            dist = policy(data["observation"], data.get("action_mask", None))
            loss = -(dist.log_prob(data["action"]) * advantages[g]).mean()
            total = total + loss
            terms[g] = torch.stack([loss.detach(), dist.entropy().mean().detach()])
        return total, terms

    def parameters(self) -> list[torch.Tensor]:
        return [p for policy in self.policies.values() for p in policy.parameters()]

    def state_dict(self) -> dict:
        trainables = self.step.trainables
        return {
            g: {
                "policy": p.state_dict(),
                "optimizer": trainables[g].optimizer.state_dict(),
                "baseline": self.baselines[g],
            }
            for g, p in self.policies.items()
        }

    def load_state_dict(self, state: dict) -> None:
        for g, policy in self.policies.items():
            policy.load_state_dict(state[g]["policy"])
            self.step.trainables[g].optimizer.load_state_dict(state[g]["optimizer"])
            self.baselines[g].copy_(state[g]["baseline"])

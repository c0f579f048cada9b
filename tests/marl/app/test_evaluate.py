"""`marl eval --render`: the GIF holds env 0's whole first episode, its last state included."""

from __future__ import annotations

import dataclasses

import numpy as np
import torch
from PIL import Image, ImageSequence

import envs
from envs.base import EnvConfig, MultiAgentEnv
from envs.specs import Box, GroupSpec
from marl.algorithms.ppo import PPOConfig
from marl.app.evaluate import evaluate
from marl.app.trainer import Trainer
from marl.config import EnvSettings, ModelConfig, RunConfig, TrainConfig

TICK_GREY = 40  # a frame is grey 40 * ticks


@dataclasses.dataclass(frozen=True)
class TickerConfig(EnvConfig):
    max_steps: int = 10


@envs.register("ticker")
class Ticker(MultiAgentEnv):
    """Env i ticks once a step and terminates at `4 + i` ticks (before `max_steps`), whatever the actions;
    its frame is grey `TICK_GREY * ticks`: a hand-checked episode, env 0's last frame grey 160."""

    Config = TickerConfig

    def _make_groups(self):
        return {"agent": GroupSpec(["agent_0"], Box((1,)), Box((1,), -1.0, 1.0))}

    def _init_state(self):
        self.ticks = torch.zeros(self.num_envs, device=self.device)  # [B]
        self.length = 4.0 + torch.arange(self.num_envs, device=self.device)  # [B] each env's episode length

    def _reset(self, mask):
        self.ticks = torch.where(mask, 0.0, self.ticks)

    def _step(self, action):
        self.ticks = self.ticks + 1
        return {"agent": torch.zeros(self.num_envs, 1, device=self.device)}, self.ticks >= self.length

    def _observe(self):
        return {"agent": self.ticks[:, None, None] / 10}

    def _render(self, index):
        return np.full((4, 4, 3), TICK_GREY * int(self.ticks[index]), dtype=np.uint8)


def gif_greys(path) -> list[int]:
    """Each frame's grey level (the frames are uniform)."""
    with Image.open(path) as image:
        frames = [np.asarray(frame.convert("RGB")) for frame in ImageSequence.Iterator(image)]
    assert all((frame == frame[0, 0, 0]).all() for frame in frames)
    return [int(frame[0, 0, 0]) for frame in frames]


def test_the_gif_ends_with_the_state_the_last_action_reached(tmp_path):
    # The env auto-resets inside `step`, so the GIF ended one step early: env 0's terminal state (in a
    # real task, the agents on their goals) was never drawn, and the GIF held `length` frames, not `length + 1`.
    config = TrainConfig(
        env=EnvSettings(env="ticker", num_envs=4),
        algo=PPOConfig(minibatch_size=16),
        model=ModelConfig(hidden=(8,)),
        run=RunConfig(
            total_frames=16, rollout_length=4, log_dir=str(tmp_path), progress=False, tensorboard=False, device="cpu"
        ),
    )
    checkpoint = Trainer(config).save()
    gif = tmp_path / "episode.gif"
    # 3 envs whose episodes last 4, 5 and 6 steps: env 0's ends first, and the GIF with it.
    result = evaluate(str(checkpoint), episodes=3, render=str(gif), device="cpu")
    assert result["episodes"] == 3 and result["episode_length"] == 5.0
    assert gif_greys(gif) == [TICK_GREY * ticks for ticks in range(5)]  # after the reset, then after each action
    assert evaluate(str(checkpoint), episodes=3, device="cpu") == result  # rendering changes no number

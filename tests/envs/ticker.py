"""`Ticker`, an env whose frames are hand-checked, for the tests of what records an episode (`marl eval
--render`, `envs.render.play`): env i ticks once a step and terminates at `4 + i` ticks (before `max_steps`),
whatever the actions; its frame is grey `TICK_GREY * ticks`, so env 0's last frame is grey 160."""

from __future__ import annotations

import dataclasses

import numpy as np
import torch
from PIL import Image, ImageSequence

from envs.base import EnvConfig, MultiAgentEnv
from envs.specs import Box, GroupSpec

TICK_GREY = 40  # a frame is grey 40 * ticks


@dataclasses.dataclass(frozen=True)
class TickerConfig(EnvConfig):
    max_steps: int = 10


class Ticker(MultiAgentEnv):
    name = "ticker"
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

"""Helpers to run mpe2's own scenarios (plain per-agent numpy loops) as references for the MPE envs."""

import numpy as np
import torch


def positions(entities) -> torch.Tensor:
    """The positions of mpe2 agents or landmarks as one env of ours: `[1, m, 2]` float32."""
    return torch.tensor(np.stack([e.state.p_pos for e in entities]), dtype=torch.float32)[None]


def five_way(force: np.ndarray) -> np.ndarray:
    """MPE's continuous action `[_, left, right, down, up]` that acts as our 2-D force `[..., 2]`."""
    five = np.zeros((*force.shape[:-1], 5), dtype=np.float32)
    five[..., 1], five[..., 2] = np.maximum(-force[..., 0], 0), np.maximum(force[..., 0], 0)
    five[..., 3], five[..., 4] = np.maximum(-force[..., 1], 0), np.maximum(force[..., 1], 0)
    return five

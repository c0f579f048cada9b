"""Stacked members' bookkeeping (`marl.core.members`) against each member done alone."""

import pytest
import torch

from marl.core.members import clip_members_


@pytest.mark.parametrize("max_norm", [0.5, 100.0], ids=["clips", "leaves"])
def test_members_gradients_clip_as_each_members_alone(max_norm):
    generator = torch.Generator().manual_seed(0)
    shapes = [(3, 4, 5), (3, 5), (3, 2, 5)]  # [S, ...]: weights and a bias of 3 members
    stacked = [torch.nn.Parameter(torch.zeros(shape)) for shape in shapes]
    for p in stacked:
        p.grad = torch.randn(p.shape, generator=generator)
    alone = [[torch.nn.Parameter(p[k].detach().clone()) for p in stacked] for k in range(3)]
    for k, params in enumerate(alone):
        for p, s in zip(params, stacked):
            p.grad = s.grad[k].clone()
    norms = clip_members_(stacked, max_norm)
    for k, params in enumerate(alone):
        expected = torch.nn.utils.clip_grad_norm_(params, max_norm)
        assert norms[k] == pytest.approx(expected.item(), rel=1e-6)
        for p, s in zip(params, stacked):
            torch.testing.assert_close(s.grad[k], p.grad)

"""The batched particle helpers against plain per-env, per-entity loops."""

import math

import pytest
import torch

from envs.native import physics
from envs.random import CounterRandom


@pytest.mark.parametrize("m", [1, 2, 5])
def test_drop_self_lists_the_others_in_order(m):
    pairwise = torch.randn(3, m, m, 2)
    others = torch.tensor([[j for j in range(m) if j != i] for i in range(m)], dtype=torch.long)  # [m, m-1]
    expected = pairwise[:, torch.arange(m)[:, None], others]
    torch.testing.assert_close(physics.drop_self(pairwise), expected, rtol=0, atol=0)


@pytest.mark.parametrize("m", [1, 3, 24, 40])  # 40: above the matmul path's limit, plain subtraction
@pytest.mark.parametrize("others_only", [False, True])
def test_pairwise_offsets_are_exact_differences(m, others_only):
    pos = torch.randn(4, m, 2) * 10
    expected = torch.stack([torch.stack([pos[:, j] - pos[:, i] for j in range(m)], 1) for i in range(m)], 1)
    if others_only:
        expected = physics.drop_self(expected)
    torch.testing.assert_close(physics.pairwise_offsets(pos, others_only=others_only), expected, rtol=0, atol=0)


def reference_contact(pos, radius, stiffness, margin, cutoff):
    B, m, _ = pos.shape
    force = torch.zeros(B, m, 2, dtype=torch.float64)
    for b in range(B):
        for i in range(m):
            for j in range(m):
                delta = (pos[b, i] - pos[b, j]).double()
                d = float(delta.norm())
                reach = float(radius[i] + radius[j])
                if i == j or d <= 1e-6 or (cutoff and d >= reach):
                    continue
                penetration = math.log1p(math.exp((reach - d) / margin)) * margin
                force[b, i] += stiffness * penetration * delta / d
    return force.float()


@pytest.mark.parametrize("cutoff", [True, False])
def test_contact_forces_with_per_disc_radii_match_reference(cutoff):
    g = torch.Generator().manual_seed(0)
    pos = torch.rand(4, 6, 2, generator=g) * 0.5
    radius = torch.tensor([0.05, 0.1, 0.075, 0.2, 0.05, 0.15])
    expected = reference_contact(pos, radius, 100.0, 1e-2, cutoff)
    torch.testing.assert_close(physics.contact_forces(pos, radius, 100.0, 1e-2, cutoff=cutoff), expected)
    # One float radius is the same as a tensor of equal radii.
    same = torch.full((6,), 0.1)
    torch.testing.assert_close(
        physics.contact_forces(pos, 0.1, cutoff=cutoff), physics.contact_forces(pos, same, cutoff=cutoff)
    )


def test_integrate_explicit_moves_with_the_old_velocity_and_caps_speed():
    pos, vel = torch.zeros(1, 2, 2), torch.tensor([[[1.0, 0.0], [0.0, 0.1]]])
    force = torch.tensor([[[0.0, 30.0], [1.0, 0.0]]])
    new_pos, new_vel = physics.integrate_explicit(
        pos, vel, force, dt=0.1, drag=0.25, max_speed=torch.tensor([1.0, 5.0])
    )
    torch.testing.assert_close(new_pos, torch.tensor([[[0.1, 0.0], [0.0, 0.01]]]))
    # Agent 0: (0.75, 3.0) is faster than 1 and is scaled down to unit speed; agent 1 is under its cap.
    torch.testing.assert_close(new_vel[0, 0], torch.tensor([0.75, 3.0]) / math.hypot(0.75, 3.0))
    torch.testing.assert_close(new_vel[0, 1], torch.tensor([0.1, 0.075]))


def test_spawn_uniform_covers_the_square():
    points = physics.spawn_uniform(256, 4, 0.9, CounterRandom(0, "cpu"))
    assert points.shape == (256, 4, 2)
    assert points.abs().max() <= 0.9 and points.abs().max() > 0.85

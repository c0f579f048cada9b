"""navigation's physics, observations and rewards against a plain per-env, per-agent loop."""

import math

import numpy as np
import pytest
import torch

import envs
from envs.native.navigation import DRAG, DT, SUBSTEPS, scripted_action


def reference_step(pos, vel, action, radius, stiffness=100.0, margin=1e-3):
    """One env step of every env, written as loops over envs, substeps and agent pairs."""
    pos, vel = pos.clone().double(), vel.clone().double()
    B, n, _ = pos.shape
    sub_dt = DT / SUBSTEPS
    for b in range(B):
        for substep in range(SUBSTEPS):
            force = action[b].double().clone()
            for i in range(n):
                for j in range(n):
                    d = (pos[b, i] - pos[b, j]).norm()
                    if i != j and 1e-6 < d < 2 * radius:
                        penetration = math.log1p(math.exp((2 * radius - d) / margin)) * margin
                        force[i] += stiffness * penetration * (pos[b, i] - pos[b, j]) / d
            if substep == 0:
                vel[b] *= 1 - DRAG
            vel[b] += force * sub_dt
            pos[b] += vel[b] * sub_dt
    return pos.float(), vel.float()


def reference_lidar(pos, radius, n_rays, max_range):
    B, n, _ = pos.shape
    reading = torch.full((B, n, n_rays), max_range, dtype=torch.float64)
    for b in range(B):
        for i in range(n):
            for k in range(n_rays):
                u = torch.tensor([math.cos(2 * math.pi * k / n_rays), math.sin(2 * math.pi * k / n_rays)]).double()
                for j in range(n):
                    if j == i:
                        continue
                    rel = (pos[b, j] - pos[b, i]).double()
                    # |t u - rel|^2 = r^2  ->  t^2 - 2 t (u.rel) + |rel|^2 - r^2 = 0
                    half_b, c = float(u @ rel), float(rel @ rel) - radius**2
                    if half_b > 0 and half_b**2 - c > 0:
                        t = max(half_b - math.sqrt(half_b**2 - c), 0.0)
                        reading[b, i, k] = min(reading[b, i, k], t)
    return reading.float()


def crowded_env(n_agents=5, num_envs=3, seed=0):
    env = envs.make("navigation", num_envs=num_envs, seed=seed, n_agents=n_agents)
    # Pack agents close together so that contacts and LIDAR hits happen.
    g = torch.Generator().manual_seed(seed)
    env.pos = torch.rand(num_envs, n_agents, 2, generator=g) * 0.6
    env.vel = torch.randn(num_envs, n_agents, 2, generator=g) * 0.3
    env.distance = (env.goal - env.pos).norm(dim=-1)
    return env


def test_dynamics_match_reference_loop():
    env = crowded_env()
    action = torch.rand(3, 5, 2, generator=torch.Generator().manual_seed(1)) * 2 - 1
    expected_pos, expected_vel = reference_step(env.pos, env.vel, action, env.config.agent_radius)
    env._step({"agent": action})
    torch.testing.assert_close(env.pos, expected_pos, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(env.vel, expected_vel, atol=1e-4, rtol=1e-5)


def test_lidar_matches_reference_loop():
    env = crowded_env(n_agents=6)
    obs = env._observe()["agent"]
    c = env.config
    expected = c.lidar_range - reference_lidar(env.pos, c.agent_radius, c.n_lidar_rays, c.lidar_range)
    torch.testing.assert_close(obs[..., 6:], expected, atol=1e-5, rtol=1e-5)
    assert (obs[..., 6:] > 0).any(), "the crowded layout should produce LIDAR hits"
    torch.testing.assert_close(obs[..., :2], env.pos)
    torch.testing.assert_close(obs[..., 2:4], env.vel)
    torch.testing.assert_close(obs[..., 4:6], env.goal - env.pos)


@pytest.mark.parametrize("shared", [True, False])
def test_reward_is_progress_plus_collisions(shared):
    env = envs.make("navigation", num_envs=2, seed=3, n_agents=3, shared_reward=shared)
    env.pos = torch.tensor([[[0.0, 0.0], [0.15, 0.0], [1.0, 1.0]], [[0.5, 0.5], [-0.5, -0.5], [0.5, -0.5]]])
    env.vel = torch.zeros(2, 3, 2)
    env.goal = torch.full((2, 3, 2), 2.0)
    env.distance = (env.goal - env.pos).norm(dim=-1)
    before = env.distance.clone()
    reward, terminated = env._step({"agent": torch.zeros(2, 3, 2)})
    progress = before - (env.goal - env.pos).norm(dim=-1)
    if shared:
        progress = progress.sum(-1, keepdim=True).expand(2, 3)
    gap = (env.pos[0, 0] - env.pos[0, 1]).norm()
    collided = float(gap <= 2 * 0.1 + 0.005)
    expected = progress + torch.tensor([[-collided, -collided, 0.0], [0.0, 0.0, 0.0]])
    torch.testing.assert_close(reward["agent"], expected)
    assert not terminated.any()


def test_all_on_goal_terminates_with_final_reward():
    env = envs.make("navigation", num_envs=2, seed=0, n_agents=2, shared_reward=False)
    env.pos = torch.tensor([[[0.0, 0.0], [1.0, 0.0]], [[0.0, 0.0], [1.0, 0.0]]])
    env.vel = torch.zeros(2, 2, 2)
    env.goal = env.pos.clone()
    env.goal[1, 1] += 0.5  # env 1 has one agent away from its goal
    env.distance = (env.goal - env.pos).norm(dim=-1)
    next_td, _ = env.step({"agent": torch.zeros(2, 2, 2)})
    assert next_td["terminated"][:, 0].tolist() == [True, False]
    torch.testing.assert_close(next_td["agent", "reward"][0, :, 0], torch.full((2,), 0.01))
    assert next_td["agent", "terminated"][0].all() and not next_td["agent", "done"][1].any()


@pytest.mark.parametrize("n_agents", [1, 3, 24, 256])
def test_spawn_keeps_entities_apart(n_agents):
    env = envs.make("navigation", num_envs=8, seed=0, n_agents=n_agents)
    points = torch.cat([env.pos, env.goal], 1)
    gap = (points.unsqueeze(1) - points.unsqueeze(2)).norm(dim=-1) + torch.eye(2 * n_agents) * 10
    assert gap.min() >= 2 * env.config.agent_radius + 0.05 - 1e-5
    assert points.abs().max() <= env.config.arena


def test_scripted_controller_reaches_goals():
    env = envs.make("navigation", num_envs=64, seed=0, n_agents=3)
    obs = env.reset()
    terminated = torch.zeros(64, dtype=torch.bool)
    for _ in range(100):
        next_td, obs = env.step({"agent": scripted_action(obs["agent", "observation"])})
        terminated |= next_td["terminated"][:, 0]
    assert terminated.float().mean() > 0.8


def test_render_draws_agents():
    env = envs.make("navigation", num_envs=2, seed=0, n_agents=3)
    image = env.render(1)
    assert image.shape == (320, 320, 3) and image.dtype == np.uint8
    colours = {tuple(c) for c in image.reshape(-1, 3)}
    assert (55, 126, 184) in colours and (255, 127, 0) in colours
    with pytest.raises(IndexError, match=r"render index must be in \[0, 2\)"):
        env.render(2)


def test_goal_visible_steps_hides_the_goal_after_an_episodes_first_steps():
    """With `goal_visible_steps=2` each env shows the goal in its episode's first 2 observations only,
    counted per env (here episodes of different ages), and nothing else of the observation changes."""
    options = {"n_agents": 2, "max_steps": 6}
    hidden = envs.make("navigation", num_envs=6, seed=0, **options, goal_visible_steps=2)
    shown = envs.make("navigation", num_envs=6, seed=0, **options)
    for env in (hidden, shown):  # episodes of ages 0..5
        env.reset()
        env.step_count.copy_(torch.arange(6))
    action = {"agent": torch.full((6, 2, 2), 0.3)}
    for _ in range(8):
        (_, obs_hidden), (_, obs_shown) = hidden.step(action), shown.step(action)
        visible = hidden.step_count < 2  # steps taken in the episode the observation is of
        a, b = obs_hidden["agent", "observation"], obs_shown["agent", "observation"]
        assert torch.equal(a[visible], b[visible])
        assert (a[~visible][..., 4:6] == 0).all() and (b[~visible][..., 4:6] != 0).all()
        assert torch.equal(a[..., [0, 1, 2, 3, *range(6, 18)]], b[..., [0, 1, 2, 3, *range(6, 18)]])
    with pytest.raises(ValueError, match="goal_visible_steps must be >= 0"):
        envs.make("navigation", num_envs=1, goal_visible_steps=-1)


def test_discrete_moves_step_as_their_unit_forces():
    moves = torch.tensor([[0.0, 0.0], [-1.0, 0.0], [1.0, 0.0], [0.0, -1.0], [0.0, 1.0]])  # no-op, left, right, down, up
    discrete = envs.make("navigation", num_envs=6, seed=3, discrete_actions=True)
    forces = envs.make("navigation", num_envs=6, seed=3)
    assert discrete.groups["agent"].action.n == 5
    discrete.reset(), forces.reset()
    choice = torch.Generator().manual_seed(0)
    for _ in range(4):
        action = torch.randint(5, (6, 3), generator=choice)
        _, obs = discrete.step({"agent": action})
        _, expected = forces.step({"agent": moves[action]})
        assert torch.equal(obs["agent", "observation"], expected["agent", "observation"])
    envs.check_env(envs.make("navigation", num_envs=5, seed=0, discrete_actions=True))  # the env contract


@pytest.mark.parametrize("spawn_half_width", [40.0, 1e12])
def test_a_large_arena_spawns_apart_on_a_bounded_grid(spawn_half_width):
    """The spawn grid's cells grow with the arena past 64 a side: a large arena still spawns every entity
    in bounds and apart (it used to allocate one random key per cell, 25,600 per env at 40 and an
    OverflowError at 1e12)."""
    env = envs.make("navigation", num_envs=4, seed=0, n_agents=3, spawn_half_width=spawn_half_width)
    points = torch.cat([env.pos, env.goal], 1).double()
    gap = (points.unsqueeze(1) - points.unsqueeze(2)).norm(dim=-1) + torch.eye(6) * 1e30
    assert gap.min() >= 2 * env.config.agent_radius + 0.05 - 1e-5
    assert points.abs().max() <= spawn_half_width

"""spread: the conformance check, step-by-step parity with mpe2's own simple_spread (a plain per-agent
loop), hand-computed rewards, and the scripted yardstick."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import envs
from envs.native.spread import scripted_action
from envs.render import play
from tests.envs.mpe_reference import five_way, positions


@pytest.mark.parametrize("num_envs", [1, 4, 64])
@pytest.mark.parametrize("n_agents", [1, 3, 6])
def test_check_env(num_envs, n_agents):
    envs.check_env(envs.make("spread", num_envs=num_envs, seed=0, n_agents=n_agents))


def test_check_env_continuous():
    envs.check_env(envs.make("spread", num_envs=4, seed=0, continuous_actions=True))


@pytest.mark.parametrize("n_agents, continuous", [(3, False), (3, True), (6, False)])  # 6: the gather path
def test_matches_mpe2(n_agents, continuous):
    simple_spread = pytest.importorskip("mpe2.simple_spread_v3")
    reference = simple_spread.parallel_env(N=n_agents, continuous_actions=continuous)
    reference.reset(seed=0)
    world = reference.unwrapped.world
    rng = np.random.default_rng(0)
    for agent in world.agents:  # crowd the agents so that contacts and collision penalties happen
        agent.state.p_pos = rng.uniform(-0.3, 0.3, 2)
    env = envs.make("spread", num_envs=1, seed=0, n_agents=n_agents, continuous_actions=continuous)
    at_rest = torch.zeros(1, n_agents + 1, 2)  # velocities and the origin
    env.world = torch.cat([positions(world.agents), positions(world.landmarks), at_rest], 1)
    collided = False
    for _ in range(20):
        if continuous:
            action = torch.tensor(rng.uniform(-1, 1, (n_agents, 2)), dtype=torch.float32)
            theirs = five_way(action.numpy())
        else:
            action = torch.tensor(rng.integers(0, 5, n_agents))
            theirs = action.numpy()
        obs, reward, *_ = reference.step({name: theirs[i] for i, name in enumerate(reference.agents)})
        next_td, _ = env.step({"agent": action[None]})
        expected_obs = torch.tensor(np.stack([obs[name] for name in reference.agents]), dtype=torch.float32)
        expected_reward = torch.tensor([reward[name] for name in reference.agents], dtype=torch.float32)
        torch.testing.assert_close(next_td["agent", "observation"][0], expected_obs, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(next_td["agent", "reward"][0, :, 0], expected_reward, atol=1e-5, rtol=1e-5)
        collided |= bool(expected_reward.max() != expected_reward.min())  # only collisions differ per agent
    assert collided, "the crowded start should produce collisions"


@pytest.mark.parametrize("local_ratio", [0.0, 0.5, 1.0])
def test_observation_layout_and_reward_by_hand(local_ratio):
    env = envs.make("spread", num_envs=1, seed=0, n_agents=2, local_ratio=local_ratio)
    # Agents 0.2 apart (closer than two radii, 0.3), the landmarks, the velocities (at rest), the origin.
    env.world = torch.tensor([[[0.0, 0.0], [0.2, 0.0], [0.0, 0.5], [1.0, 0.0], [0.0, 0.0], [0.0, 0.0], [0.0, 0.0]]])
    next_td, _ = env.step({"agent": torch.zeros(1, 2, dtype=torch.long)})
    # MPE's integrator moves positions with the old velocity (zero), so they stay put this step.
    coverage = -(0.5 + 0.8)  # landmark 0: agent 0 at 0.5; landmark 1: agent 1 at 0.8
    expected = (1 - local_ratio) * coverage - local_ratio * 1.0  # one collision each
    torch.testing.assert_close(next_td["agent", "reward"][0, :, 0], torch.full((2,), expected))
    obs = next_td["agent", "observation"][0]  # [2, 12]
    vel = env.vel[0]
    assert vel[0, 0] < 0 < vel[1, 0], "the contact pushes the agents apart"
    torch.testing.assert_close(obs[0], torch.tensor([*vel[0], 0.0, 0.0, 0.0, 0.5, 1.0, 0.0, 0.2, 0.0, 0.0, 0.0]))
    torch.testing.assert_close(obs[1], torch.tensor([*vel[1], 0.2, 0.0, -0.2, 0.5, 0.8, 0.0, -0.2, 0.0, 0.0, 0.0]))


def test_default_observation_has_18_numbers():
    assert envs.make("spread", num_envs=2, seed=0).groups["agent"].observation.shape == (18,)


@pytest.mark.parametrize("continuous", [False, True])
def test_scripted_team_beats_random_actions(continuous):
    env = envs.make("spread", num_envs=256, seed=0, continuous_actions=continuous)
    scripted = play(env, lambda obs: {"agent": scripted_action(obs["agent", "observation"], continuous)}, 50)
    generator = torch.Generator().manual_seed(0)
    random = play(env, lambda obs: env.sample_actions(generator), 50)
    assert scripted["agent"] > random["agent"] + 8, (scripted, random)


@pytest.mark.parametrize("n_agents", [1, 2, 3, 6])
def test_broadcast_form_matches_the_tables(n_agents, monkeypatch):
    """The form compiled code uses (broadcasting), run eagerly, against the eager form (index tables)."""
    tables = envs.make("spread", num_envs=8, seed=0, n_agents=n_agents)
    broadcast = envs.make("spread", num_envs=8, seed=0, n_agents=n_agents)
    generator = torch.Generator().manual_seed(0)
    for _ in range(30):
        action = tables.sample_actions(generator)
        next_a, obs_a = tables.step(action)
        with monkeypatch.context() as patch:
            patch.setattr(torch.compiler, "is_compiling", lambda: True)
            next_b, obs_b = broadcast.step(action)
        torch.testing.assert_close(next_a.to_dict(), next_b.to_dict(), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(obs_a.to_dict(), obs_b.to_dict(), atol=1e-5, rtol=1e-5)


def test_compiled_physics_matches_eager():
    eager = envs.make("spread", num_envs=8, seed=0)
    compiled = envs.make("spread", num_envs=8, seed=0, compile=True)
    generator = torch.Generator().manual_seed(0)
    for _ in range(30):
        action = eager.sample_actions(generator)
        (next_a, obs_a), (next_b, obs_b) = eager.step(action), compiled.step(action)
        torch.testing.assert_close(next_a.to_dict(), next_b.to_dict(), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(obs_a.to_dict(), obs_b.to_dict(), atol=1e-5, rtol=1e-5)


def test_render_draws_agents_and_landmarks():
    image = envs.make("spread", num_envs=2, seed=0).render(1)
    assert image.shape == (320, 320, 3) and image.dtype == np.uint8
    colours = {tuple(c) for c in image.reshape(-1, 3)}
    assert (64, 64, 64) in colours and (55, 126, 184) in colours


def test_demo_writes_a_gif(tmp_path):
    gif = tmp_path / "spread.gif"
    run = subprocess.run(
        [sys.executable, "-m", "envs.native.spread", "--num-envs", "4", "--steps", "30", "--gif", str(gif)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).parents[3],
    )
    assert run.returncode == 0, run.stderr
    assert "mean episode return" in run.stdout and gif.stat().st_size > 0

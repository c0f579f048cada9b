"""tag: the conformance check, per-type observation sizes, step-by-step parity with mpe2's own
simple_tag (a plain per-agent loop), the bound penalty by hand, and the scripted yardsticks."""

import math
import sys

import numpy as np
import pytest
import torch

import envs
from envs.native.tag import TagConfig, bound_penalty, scripted_predator_action, scripted_prey_action
from envs.render import play
from tests.envs.mpe_reference import five_way, positions


@pytest.mark.parametrize("num_envs", [1, 4, 64])
@pytest.mark.parametrize(
    "n_predators, n_prey, n_obstacles, scripted_prey",
    [(3, 1, 2, False), (3, 1, 2, True), (1, 1, 0, False), (4, 3, 3, False), (2, 2, 1, True)],
)
def test_check_env(num_envs, n_predators, n_prey, n_obstacles, scripted_prey):
    env = envs.make(
        "tag",
        num_envs=num_envs,
        seed=0,
        n_predators=n_predators,
        n_prey=n_prey,
        n_obstacles=n_obstacles,
        scripted_prey=scripted_prey,
    )
    envs.check_env(env)


def test_groups_have_their_own_observation_sizes():
    env = envs.make("tag", num_envs=2, seed=0)
    assert env.groups["predator"].agents == ("predator_0", "predator_1", "predator_2")
    assert env.groups["prey"].agents == ("prey_0",)
    assert env.groups["predator"].observation.shape == (16,) and env.groups["prey"].observation.shape == (14,)
    obs = env.reset()
    assert obs["predator", "observation"].shape == (2, 3, 16) and obs["prey", "observation"].shape == (2, 1, 14)
    scripted = envs.make("tag", num_envs=2, seed=0, scripted_prey=True, n_prey=2)
    assert list(scripted.groups) == ["predator"] and scripted.groups["predator"].observation.shape == (20,)


def test_matches_mpe2():
    simple_tag = pytest.importorskip("mpe2.simple_tag_v3")
    reference = simple_tag.parallel_env(num_good=2, num_adversaries=3, num_obstacles=2, continuous_actions=True)
    reference.reset(seed=0)
    world = reference.unwrapped.world
    rng = np.random.default_rng(0)
    for agent in world.agents:  # crowd the agents so that they touch
        agent.state.p_pos = rng.uniform(-0.3, 0.3, 2)
    env = envs.make("tag", num_envs=1, seed=0, n_prey=2)
    env.pos, env.obstacle = positions(world.agents), positions(world.landmarks)
    caught = left_arena = False
    for t in range(24):
        action = rng.uniform(-1, 1, (5, 2)).astype(np.float32)
        if t >= 12:  # the prey run for the edge, to earn the bound penalty
            action[3:] = np.sign(env.pos[0, 3:].numpy())
        obs, reward, *_ = reference.step({name: five_way(action[i]) for i, name in enumerate(reference.agents)})
        action = torch.tensor(action)[None]
        next_td, _ = env.step({"predator": action[:, :3], "prey": action[:, 3:]})
        for group, names in (("predator", reference.agents[:3]), ("prey", reference.agents[3:])):
            expected_obs = torch.tensor(np.stack([obs[name] for name in names]), dtype=torch.float32)
            expected_reward = torch.tensor([reward[name] for name in names], dtype=torch.float32)
            torch.testing.assert_close(next_td[group, "observation"][0], expected_obs, atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(next_td[group, "reward"][0, :, 0], expected_reward, atol=1e-5, rtol=1e-5)
        caught |= bool(next_td["predator", "reward"].max() > 0)
        left_arena |= bool((env.pos[0, 3:].abs() > 1).any())
    assert caught and left_arena, "the run should include catches and prey beyond the edge"


def test_bound_penalty_by_hand():
    coordinates = torch.tensor([[0.5, -0.5], [0.95, 0.0], [0.0, -1.0], [2.0, 0.0], [-3.0, 0.95]])
    expected = torch.tensor([0.0, 0.5, 1.0, math.exp(2.0), 10.0 + 0.5])
    torch.testing.assert_close(bound_penalty(coordinates), expected)


def test_catch_rewards_by_hand():
    env = envs.make("tag", num_envs=1, seed=0, n_predators=2, n_prey=2, n_obstacles=0)
    # Predator 0 touches both prey, predator 1 touches prey 0 (touching: closer than 0.075 + 0.05); everyone
    # is at rest, so nobody moves this step (MPE's integrator moves positions with the old velocity).
    env.pos = torch.tensor([[[0.0, 0.0], [0.2, 0.05], [0.1, 0.0], [-0.1, 0.0]]])
    env.vel = torch.zeros(1, 4, 2)
    next_td, _ = env.step({"predator": torch.zeros(1, 2, 2), "prey": torch.zeros(1, 2, 2)})
    torch.testing.assert_close(next_td["predator", "reward"][0, :, 0], torch.tensor([30.0, 30.0]))
    torch.testing.assert_close(next_td["prey", "reward"][0, :, 0], torch.tensor([-20.0, -10.0]))


def test_speed_is_capped_per_type():
    env = envs.make("tag", num_envs=4, seed=0, n_obstacles=0)
    env.reset()
    for _ in range(20):
        env.step({"predator": torch.ones(4, 3, 2), "prey": -torch.ones(4, 1, 2)})
    speed = env.vel.norm(dim=-1)
    assert speed[:, :3].max() <= 1.0 + 1e-5 and speed[:, 3:].max() <= 1.3 + 1e-5
    assert speed[:, 3:].max() > 1.25, "the prey should reach their top speed"


def test_scripted_prey_option_equals_a_prey_group_driven_by_the_heuristic():
    config = TagConfig()
    alone = envs.make("tag", num_envs=16, seed=3, scripted_prey=True)
    paired = envs.make("tag", num_envs=16, seed=3)
    obs_alone, obs_paired = alone.reset(), paired.reset()
    for _ in range(30):
        chase = scripted_predator_action(obs_alone["predator", "observation"], config)
        flee = scripted_prey_action(obs_paired["prey", "observation"], config)
        (next_alone, obs_alone), (next_paired, obs_paired) = (
            alone.step({"predator": chase}),
            paired.step({"predator": chase, "prey": flee}),
        )
        torch.testing.assert_close(next_alone["predator"].to_dict(), next_paired["predator"].to_dict())


def test_scripted_predators_catch_more_than_random_ones():
    env = envs.make("tag", num_envs=256, seed=0, scripted_prey=True)
    config = env.config
    scripted = play(env, lambda obs: {"predator": scripted_predator_action(obs["predator", "observation"], config)}, 50)
    generator = torch.Generator().manual_seed(0)
    random = play(env, lambda obs: env.sample_actions(generator), 50)
    assert scripted["predator"] > 5 * random["predator"] and scripted["predator"] > 10, (scripted, random)


def test_scripted_prey_do_better_than_random_prey():
    env = envs.make("tag", num_envs=256, seed=0)
    config, generator = env.config, torch.Generator().manual_seed(0)

    def policy(flee: bool):
        def act(obs):
            prey = scripted_prey_action(obs["prey", "observation"], config) if flee else None
            chase = scripted_predator_action(obs["predator", "observation"], config)
            return {"predator": chase, "prey": env.sample_actions(generator)["prey"] if prey is None else prey}

        return act

    fleeing, random = play(env, policy(True), 50), play(env, policy(False), 50)
    assert fleeing["prey"] > random["prey"] / 2, (fleeing, random)


def test_render_draws_every_type():
    image = envs.make("tag", num_envs=2, seed=0).render(1)
    assert image.shape == (320, 320, 3) and image.dtype == np.uint8
    colours = {tuple(c) for c in image.reshape(-1, 3)}
    assert {(64, 64, 64), (217, 89, 89), (89, 217, 89)} <= colours


def test_demo_writes_a_gif(tmp_path, monkeypatch, capsys):
    from envs.native import tag

    gif = tmp_path / "tag.gif"
    monkeypatch.setattr(sys, "argv", ["tag", "--num-envs", "4", "--steps", "30", "--gif", str(gif)])
    tag._main()
    assert "catches per episode" in capsys.readouterr().out and gif.stat().st_size > 0

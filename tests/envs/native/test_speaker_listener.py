"""speaker_listener: the conformance check, step-by-step parity with mpe2's own
simple_speaker_listener (a plain per-agent loop), the message's timing, and the scripted pair."""

import sys

import numpy as np
import pytest
import torch

import envs
from envs.native.speaker_listener import scripted_actions
from envs.native.spread import MOVES
from envs.render import play
from tests.envs.mpe_reference import positions


@pytest.mark.parametrize("num_envs", [1, 4, 64])
@pytest.mark.parametrize("n_landmarks", [2, 3, 6])
def test_check_env(num_envs, n_landmarks):
    envs.check_env(envs.make("speaker_listener", num_envs=num_envs, seed=0, n_landmarks=n_landmarks))


def test_groups_and_observation_sizes():
    env = envs.make("speaker_listener", num_envs=2, seed=0)
    speaker, listener = env.groups["speaker"], env.groups["listener"]
    assert speaker.agents == ("speaker_0",) and listener.agents == ("listener_0",)
    assert speaker.observation.shape == (3,) and listener.observation.shape == (11,)
    assert speaker.is_discrete and speaker.action.n == 3 and listener.action.shape == (2,)


def test_matches_mpe2():
    simple_speaker_listener = pytest.importorskip("mpe2.simple_speaker_listener_v4")
    reference = simple_speaker_listener.parallel_env(continuous_actions=False)
    reference.reset(seed=0)
    world = reference.unwrapped.world
    env = envs.make("speaker_listener", num_envs=1, seed=0)
    env.pos, env.landmark = positions(world.agents[1:])[:, 0], positions(world.landmarks)
    env.target = torch.tensor([world.landmarks.index(world.agents[0].goal_b)])
    rng = np.random.default_rng(0)
    for _ in range(20):
        symbol, move = int(rng.integers(3)), int(rng.integers(5))
        obs, reward, *_ = reference.step({"speaker_0": symbol, "listener_0": move})
        # MPE's discrete moves are unit forces, which our continuous listener can send.
        next_td, _ = env.step({"speaker": torch.tensor([[symbol]]), "listener": torch.tensor([[MOVES[move]]])})
        expected = torch.tensor(obs["listener_0"], dtype=torch.float32)
        torch.testing.assert_close(next_td["listener", "observation"][0, 0], expected, atol=1e-5, rtol=1e-5)
        for group in ("speaker", "listener"):
            torch.testing.assert_close(
                next_td[group, "reward"][0, 0, 0].item(), reward[f"{group}_0"], atol=1e-5, rtol=1e-5
            )


def test_message_is_heard_after_the_step_and_forgotten_at_reset():
    env = envs.make("speaker_listener", num_envs=3, seed=0, max_steps=2)
    obs = env.reset()
    assert (obs["listener", "observation"][..., -3:] == 0).all()
    assert (obs["speaker", "observation"].sum(-1) == 1).all()
    symbols = torch.tensor([[0], [2], [1]])
    next_td, obs = env.step({"speaker": symbols, "listener": torch.zeros(3, 1, 2)})
    torch.testing.assert_close(next_td["listener", "observation"][:, 0, -3:], torch.eye(3)[symbols[:, 0]])
    next_td, obs = env.step({"speaker": symbols, "listener": torch.zeros(3, 1, 2)})
    assert next_td["truncated"].all() and (obs["listener", "observation"][..., -3:] == 0).all()


def test_reward_is_minus_the_squared_distance_to_the_target():
    env = envs.make("speaker_listener", num_envs=2, seed=0)
    env.pos, env.vel = torch.tensor([[0.0, 0.0], [0.5, 0.5]]), torch.zeros(2, 2)
    env.landmark = torch.tensor([[[1.0, 0.0], [0.3, 0.4], [-1.0, -1.0]]]).expand(2, 3, 2)
    env.target = torch.tensor([1, 2])
    next_td, _ = env.step({"speaker": torch.zeros(2, 1, dtype=torch.long), "listener": torch.zeros(2, 1, 2)})
    expected = -torch.tensor([0.3**2 + 0.4**2, 1.5**2 + 1.5**2])
    for group in ("speaker", "listener"):
        torch.testing.assert_close(next_td[group, "reward"][:, 0, 0], expected)


def test_scripted_pair_beats_random_and_idle_actions():
    env = envs.make("speaker_listener", num_envs=256, seed=0)
    scripted = play(env, scripted_actions, 50)["listener"]
    generator = torch.Generator().manual_seed(0)
    random = play(env, lambda obs: env.sample_actions(generator), 50)["listener"]
    idle = play(
        env, lambda obs: {"speaker": torch.zeros(256, 1, dtype=torch.long), "listener": torch.zeros(256, 1, 2)}, 50
    )
    assert scripted > 0.4 * max(random, idle["listener"]), (scripted, random, idle)


def test_render_and_demo(tmp_path, monkeypatch, capsys):
    from envs.native import speaker_listener

    image = envs.make("speaker_listener", num_envs=2, seed=0).render(1)
    assert image.shape == (320, 320, 3) and image.dtype == np.uint8
    gif = tmp_path / "sl.gif"
    monkeypatch.setattr(sys, "argv", ["speaker_listener", "--num-envs", "4", "--steps", "30", "--gif", str(gif)])
    speaker_listener._main()
    assert "mean episode return" in capsys.readouterr().out and gif.stat().st_size > 0

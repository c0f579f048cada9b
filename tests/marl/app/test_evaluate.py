"""`marl eval --render`: the GIF holds env 0's whole first episode, its last state included."""

from __future__ import annotations

import pytest
from PIL import Image, ImageSequence

import envs
from marl.algorithms.ppo import PPOConfig
from marl.app.evaluate import evaluate
from marl.app.trainer import Trainer
from marl.config import EnvSettings, ModelConfig, RunConfig, TrainConfig
from tests.envs.ticker import TICK_GREY, Ticker, gif_greys

envs.register("ticker")(Ticker)  # the trainer makes its env by name


def tiny_config(tmp_path, env: str, **options) -> TrainConfig:
    """PPO on 4 envs of `env` (with env `options`), one iteration of 4 steps: its checkpoint, untrained, is enough
    to evaluate."""
    return TrainConfig(
        env=EnvSettings(env=env, num_envs=4, env_options=options),
        algo=PPOConfig(minibatch_size=16),
        model=ModelConfig(hidden=(8,)),
        run=RunConfig(
            total_frames=16, rollout_length=4, log_dir=str(tmp_path), progress=False, tensorboard=False, device="cpu"
        ),
    )


def test_the_gif_ends_with_the_state_the_last_action_reached(tmp_path):
    # The env auto-resets inside `step`, so the GIF ended one step early: env 0's terminal state (in a
    # real task, the agents on their goals) was never drawn, and the GIF held `length` frames, not `length + 1`.
    config = tiny_config(tmp_path, "ticker")
    checkpoint = Trainer(config).save()
    gif = tmp_path / "episode.gif"
    # 3 envs whose episodes last 4, 5 and 6 steps: env 0's ends first, and the GIF with it.
    result = evaluate(str(checkpoint), episodes=3, render=str(gif), device="cpu")
    assert result["episodes"] == 3 and result["episode_length"] == 5.0
    assert gif_greys(gif) == [TICK_GREY * ticks for ticks in range(5)]  # after the reset, then after each action
    assert evaluate(str(checkpoint), episodes=3, device="cpu") == result  # rendering changes no number


def test_rounds_of_a_pettingzoo_env_evaluate_episodes_of_distinct_seeds(tmp_path):
    # The adapter seeds copy i with seed + i, and round r was seeded seed + r: with 2 envs a round, round 1's
    # first copy ran round 0's second episode again (with --episodes 1000, 256 envs: 741 repeats). Round r
    # now starts at seed + r * 2, so the 4 episodes are those of 4 envs at once.
    pytest.importorskip("pettingzoo")
    config = tiny_config(tmp_path, "pettingzoo/tests.envs.pz_toy")
    checkpoint = str(Trainer(config).save())
    in_rounds = evaluate(checkpoint, episodes=4, num_envs=2, device="cpu")
    assert in_rounds == evaluate(checkpoint, episodes=4, num_envs=4, device="cpu")


def test_a_pettingzoo_run_trained_without_rgb_array_renders_the_episodes_it_evaluates(tmp_path, monkeypatch):
    # Its env was made without render_mode='rgb_array', and marl eval --render told the user to train again. The
    # eval env now asks for it; with render_mode='human' (a window per step) it asks for it instead.
    pytest.importorskip("mpe2")
    import pygame

    monkeypatch.setattr(pygame.display, "set_mode", lambda *args, **kwargs: pytest.fail("a window was opened"))
    options = {"max_steps": 5, "N": 2}
    trained = str(Trainer(tiny_config(tmp_path / "a", "pettingzoo/mpe2.simple_spread_v3", **options)).save())
    gif = tmp_path / "episode.gif"
    result = evaluate(trained, episodes=3, render=str(gif), device="cpu")
    with Image.open(gif) as image:  # the first state, then one frame per step: 6 at 100 ms (Pillow merges repeats)
        assert sum(frame.info["duration"] for frame in ImageSequence.Iterator(image)) == 600
    assert result["episode_length"] == 5.0
    assert evaluate(trained, episodes=3, device="cpu") == result  # rendering changes no episode
    options["render_mode"] = "human"
    human = str(Trainer(tiny_config(tmp_path / "b", "pettingzoo/mpe2.simple_spread_v3", **options)).save())
    assert evaluate(human, episodes=3, render=str(gif), device="cpu") == result

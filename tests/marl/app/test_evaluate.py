"""`marl eval --render`: the GIF holds env 0's whole first episode, its last state included."""

from __future__ import annotations

import pytest

import envs
from marl.algorithms.ppo import PPOConfig
from marl.app.evaluate import evaluate
from marl.app.trainer import Trainer
from marl.config import EnvSettings, ModelConfig, RunConfig, TrainConfig
from tests.envs.ticker import TICK_GREY, Ticker, gif_greys

envs.register("ticker")(Ticker)  # the trainer makes its env by name


def tiny_config(tmp_path, env: str) -> TrainConfig:
    """PPO on 4 envs of `env`, one iteration of 4 steps: its checkpoint, untrained, is enough to evaluate."""
    return TrainConfig(
        env=EnvSettings(env=env, num_envs=4),
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

"""Heterogeneous runs as a user sets them up: explicit group maps through checkpoints, per-group
overrides that would have no effect, and per-group metrics of a group without gradient clipping."""

import math

import pytest

from marl.algorithms.ppo import PPOConfig
from marl.app.evaluate import evaluate
from marl.app.trainer import Trainer
from marl.config import EnvSettings, ModelConfig, RunConfig, TrainConfig

# tag's predators split in two groups, the prey in a third.
SPLIT = {"hunters": ["predator_0", "predator_1"], "solo": ["predator_2"], "prey": ["prey_0"]}


def config(tmp_path, env_settings, frames=8 * 16, **kwargs) -> TrainConfig:
    return TrainConfig(
        env=env_settings,
        algo=PPOConfig(minibatch_size=64, epochs=1),
        model=ModelConfig(hidden=(8,)),
        run=RunConfig(
            total_frames=frames,
            rollout_length=16,
            log_dir=str(tmp_path),
            run_name="run",
            progress=False,
            tensorboard=False,
        ),
        **kwargs,
    )


def test_an_explicit_group_map_round_trips_through_the_config_dict():
    settings = EnvSettings(env="tag", num_envs=8, group_map=SPLIT)
    config = TrainConfig(env=settings, algo=PPOConfig(minibatch_size=64), group_overrides={"solo": {"lr": 1e-2}})
    assert TrainConfig.from_dict(config.to_dict()) == config


def test_a_run_with_an_explicit_group_map_resumes_and_evaluates(tmp_path):
    settings = EnvSettings(env="tag", num_envs=8, group_map=SPLIT)
    trainer = Trainer(config(tmp_path, settings, group_overrides={"solo": {"lr": 1e-2}}))
    trainer.train()
    checkpoint = trainer.checkpoint_path
    resumed = Trainer.resume(checkpoint, total_frames=2 * 8 * 16)  # failed: group_map has type dict
    assert list(resumed.algorithm.learners) == ["hunters", "solo", "prey"] and resumed.iteration == 1
    assert resumed.algorithm.learners["solo"].optimizer.param_groups[0]["lr"] == 1e-2
    resumed.train()
    result = evaluate(str(checkpoint), episodes=2, device="cpu")
    assert set(result["returns"]) == {"hunters", "solo", "prey"}


@pytest.mark.parametrize("field, value", [("std", "state"), ("log_std_init", -1.0)])
def test_a_continuous_std_override_on_a_discrete_group_is_an_error(tmp_path, field, value):
    settings = EnvSettings(env="speaker_listener", num_envs=8)
    # The speaker's action is Discrete: it has no std, and the override was silently ignored.
    with pytest.raises(ValueError, match=rf"group 'speaker' has Discrete actions.*\['{field}'\]"):
        Trainer(config(tmp_path, settings, group_overrides={"speaker": {field: value}}))
    # The listener's is continuous: the override reaches its policy.
    trainer = Trainer(config(tmp_path, settings, group_overrides={"listener": {field: value}}))
    policy = trainer.algorithm.learners["listener"].policy
    if field == "std":
        assert policy.state_std
    else:
        assert policy.log_std.detach().eq(value).all()


def test_a_group_without_gradient_clipping_logs_no_gradient_norm(tmp_path):
    settings = EnvSettings(env="speaker_listener", num_envs=8)
    trainer = Trainer(config(tmp_path, settings, group_overrides={"speaker": {"max_grad_norm": 0.0}}))
    row = trainer.train()[-1]
    # Clipping off, the norm is not measured: it read 0.0, as if the speaker had no gradient.
    assert math.isnan(row["speaker/policy_grad_norm"]) and math.isnan(row["speaker/critic_grad_norm"])
    assert row["listener/policy_grad_norm"] > 0 and row["listener/critic_grad_norm"] > 0
    metrics = (trainer.run_dir / "metrics.csv").read_text().splitlines()
    header, last = metrics[0].split(","), metrics[-1].split(",")
    assert last[header.index("speaker/policy_grad_norm")] == "nan"

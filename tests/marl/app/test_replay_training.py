"""The run loop with an algorithm that learns from a replay buffer (tests/marl/algorithms/reward_model.py):
the buffer's size is said before it is allocated, it takes every batch, `--save-buffer` checkpoints it and a
resumed run continues exactly; without it the resumed run refills from empty."""

from __future__ import annotations

import dataclasses
import shutil

import pytest
import torch

import tests.marl.algorithms.reward_model  # noqa: F401  (registers reward_model)
from marl.algorithms.ppo import PPOConfig
from marl.app.cli import main
from marl.app.trainer import Trainer
from marl.config import EnvSettings, ModelConfig, RunConfig, TrainConfig
from marl.core.replay import format_bytes, replay_nbytes
from tests.marl.algorithms.reward_model import RewardModelConfig

MODULE = "tests.marl.algorithms.reward_model"


def config(tmp_path, prioritized: bool, save_buffer: bool = True) -> TrainConfig:
    return TrainConfig(
        env=EnvSettings(env="speaker_listener", num_envs=8),  # a discrete and a continuous group
        algo=RewardModelConfig(buffer_size=300, batch_size=32, prioritized=prioritized),
        model=ModelConfig(hidden=(16,)),
        run=RunConfig(
            total_frames=10**6,
            rollout_length=16,
            device="cpu",
            progress=False,
            tensorboard=False,
            save_buffer=save_buffer,
        ),
    )


@pytest.mark.parametrize("prioritized", [False, True], ids=["uniform", "prioritized"])
def test_a_resumed_run_with_its_buffer_continues_exactly(tmp_path, capsys, prioritized):
    straight = Trainer(config(tmp_path, prioritized), run_dir=tmp_path / "run")
    size = replay_nbytes(straight.env.groups, 300, straight.env.state_spec, prioritized)
    kind = "prioritized" if prioritized else "uniform"
    assert f"replay buffer: 300 env steps, {kind}, {format_bytes(size)} on cpu" in capsys.readouterr().out
    for _ in range(3):  # 3 x 128 env steps: the ring of 300 has wrapped
        straight.train_iteration()
    assert len(straight.buffer) == 300 and int(straight.buffer.position) == 384 % 300
    straight.save()
    saved = tmp_path / "saved.pt"
    shutil.copy(straight.checkpoint_path, saved)
    expected = [straight.train_iteration() for _ in range(2)]

    resumed = Trainer.resume(saved)
    for want in expected:
        got = resumed.train_iteration()
        for key in ("speaker/loss", "listener/loss", "speaker/buffer_fill", "speaker/episode_return"):
            assert got[key] == want[key] or (got[key] != got[key] and want[key] != want[key]), key
    for a, b in zip(straight.algorithm.parameters(), resumed.algorithm.parameters(), strict=True):
        assert torch.equal(a, b)
    for key, value in straight.buffer.storage.items():
        assert torch.equal(value, resumed.buffer.storage[key]), key
    if prioritized:
        assert torch.equal(straight.buffer.tree, resumed.buffer.tree)


def test_without_save_buffer_a_resumed_run_refills_from_empty(tmp_path, capsys):
    trainer = Trainer(config(tmp_path, prioritized=False, save_buffer=False), run_dir=tmp_path / "run")
    trainer.train_iteration()
    trainer.train_iteration()
    trainer.save()
    assert torch.load(trainer.checkpoint_path, weights_only=False)["buffer"] is None
    capsys.readouterr()
    resumed = Trainer.resume(trainer.checkpoint_path)
    assert "the checkpoint holds no replay buffer (trained without --save-buffer): it refills from empty" in (
        capsys.readouterr().out
    )
    resumed.train_iteration()
    assert len(resumed.buffer) == 128 and resumed.iteration == 3


def test_the_command_line_trains_it_and_refuses_a_buffer_too_large(tmp_path, capsys):
    common = ["train", "--imports", MODULE, "--algo", "reward_model", "--env", "speaker_listener", "--num-envs", "8"]
    common += [
        "--rollout-length",
        "16",
        "--hidden",
        "16",
        "--no-progress",
        "--no-tensorboard",
        "--log-dir",
        str(tmp_path),
    ]
    assert main([*common, "--run-name", "ok", "--total-frames", "384", "--save-buffer"]) == 0
    out = capsys.readouterr().out
    assert "replay buffer: 4,096 env steps, uniform" in out and "with REWARD_MODEL on cpu" in out
    assert main([*common, "--run-name", "huge", "--buffer-size", str(10**13)]) == 2
    err = capsys.readouterr().err
    assert "replay buffer of capacity 10,000,000,000,000 needs" in err and "lower the capacity" in err
    assert len(err.strip().splitlines()) == 1


def test_an_on_policy_run_has_no_buffer(tmp_path):
    with pytest.raises(ValueError, match="^--save-buffer: it applies to algorithms that learn from a replay buffer"):
        dataclasses.replace(config(tmp_path, False), algo=PPOConfig(minibatch_size=64))
    on_policy = dataclasses.replace(config(tmp_path, False, save_buffer=False), algo=PPOConfig(minibatch_size=64))
    trainer = Trainer(on_policy, run_dir=tmp_path / "run")
    trainer.train_iteration()
    assert trainer.buffer is None and trainer.state_dict()["buffer"] is None


def test_a_resumed_run_whose_env_cannot_save_its_state_ends_the_stored_episodes(
    tmp_path, capsys, speaker_listener_unsaved
):
    """As with VMAS and PettingZoo, the resumed run starts new episodes, whose steps follow the saved buffer's:
    each env's last stored step ends its episode, truncated, else n-step returns would sum across the two."""
    straight = Trainer(config(tmp_path, prioritized=False), run_dir=tmp_path / "run")
    straight.train_iteration()
    straight.save()
    stored = {key: value.clone() for key, value in straight.buffer.storage.items()}
    last = slice(128 - 8, 128)  # 16 steps x 8 envs: the slots of each env's last step
    assert not stored[("listener", "done")][last].all()

    resumed = Trainer.resume(straight.checkpoint_path)
    assert "this env cannot save its state: resumed training starts new episodes" in capsys.readouterr().out
    for key, value in resumed.buffer.storage.items():
        expected = stored[key].clone()
        if key[1] == "done":
            expected[last] = True
        assert torch.equal(value, expected), key

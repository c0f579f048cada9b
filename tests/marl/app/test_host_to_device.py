"""A training iteration's collect and update copy nothing from the host to the device: checked on the CPU
with `forbid_host_sync("cpu")`, which treats the CPU as a remote device (see `envs.sync`), so CI catches a
tensor built from Python numbers each step before a GPU run pays a sync for it."""

from __future__ import annotations

import pytest
import torch

from envs.sync import HostSyncError, forbid_host_sync
from marl.algorithms.ppo import PPOConfig
from marl.app.trainer import Trainer
from marl.config import EnvSettings, ModelConfig, RunConfig, TrainConfig


def small_trainer(tmp_path) -> Trainer:
    config = TrainConfig(
        env=EnvSettings(num_envs=16),
        algo=PPOConfig(minibatch_size=128, epochs=1),
        model=ModelConfig(hidden=(16,)),
        run=RunConfig(rollout_length=8, device="cpu", progress=False, tensorboard=False, log_dir=str(tmp_path)),
    )
    trainer = Trainer(config)
    trainer.algorithm.begin_iteration(0, config.run.total_frames)
    return trainer


def test_collect_and_update_copy_nothing_from_the_host(tmp_path):
    trainer = small_trainer(tmp_path)
    with forbid_host_sync(trainer.device):
        batch = trainer.collector.collect()
        terms = trainer.algorithm.update(batch, trainer.timer)
    assert all(v.device == trainer.device for v in terms["agent"].values())


def test_a_tensor_built_from_python_numbers_in_the_update_is_caught(tmp_path, monkeypatch):
    trainer = small_trainer(tmp_path)
    critic = trainer.algorithm.learners["agent"].critic
    update_moments = critic.update_moments

    def with_a_count_from_the_host(count, total, squares):  # the defect issue 33 removed
        count = torch.tensor(float(trainer.config.env.num_envs * 8), dtype=torch.float64, device=trainer.device)
        update_moments(count, total, squares)

    monkeypatch.setattr(critic, "update_moments", with_a_count_from_the_host)
    batch = trainer.collector.collect()
    with pytest.raises(HostSyncError, match=r"^host-to-device copy: .*\(torch\.tensor\).* in with_a_count_from_the"):
        with forbid_host_sync(trainer.device):
            trainer.algorithm.update(batch, trainer.timer)

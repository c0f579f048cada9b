"""Checks every off-policy algorithm's tests run alike (test_offpolicy, test_value_based)."""

from __future__ import annotations

import math
import shutil

from envs.sync import forbid_host_sync
from marl.app.trainer import Trainer
from marl.config import TrainConfig


def update_without_host_sync(config: TrainConfig, run_dir) -> None:
    """Collect past the warm-up and update with the host-sync checker on: nothing may read the device."""
    trainer = Trainer(config, run_dir=run_dir)
    trainer.algorithm.begin_iteration(0, 10**5)
    trainer.buffer.extend(trainer.collector.collect())
    with forbid_host_sync("cpu"):
        trainer.algorithm.begin_iteration(64, 10**5)
        trainer.collector.collect()
        trainer.algorithm.update(trainer.buffer, trainer.timer)


def resume_midway(config: TrainConfig, tmp_path) -> tuple[Trainer, list[dict]]:
    """Train 2 iterations, checkpoint, train 2 more; returns the trainer resumed from that checkpoint
    and the 2 rows it must repeat."""
    straight = Trainer(config, run_dir=tmp_path / "run")
    for _ in range(2):
        straight.train_iteration()
    straight.save()
    saved = tmp_path / "saved.pt"
    shutil.copy(straight.checkpoint_path, saved)
    expected = [straight.train_iteration() for _ in range(2)]
    resumed = Trainer.resume(saved)
    return resumed, expected


def assert_repeats(resumed: Trainer, expected: list[dict], suffixes: tuple[str, ...]) -> dict:
    """The resumed trainer's next rows equal `expected` exactly in every metric ending in `suffixes`
    (NaN where it was NaN); returns the last row."""
    for want in expected:
        got = resumed.train_iteration()
        for key, value in want.items():
            if key.endswith(suffixes):
                assert got[key] == value or (math.isnan(got[key]) and math.isnan(value)), key
    return got

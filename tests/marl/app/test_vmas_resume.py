"""`--resume` on `vmas/<scenario>`: the checkpoint holds VMAS's world, so a run interrupted and resumed logs
what the uninterrupted run logs; a scenario whose state the adapter cannot restore starts new episodes."""

from __future__ import annotations

import dataclasses

import pytest

from marl.algorithms.ppo import PPOConfig
from marl.app.logger import read_rows
from marl.app.trainer import Trainer
from marl.config import EnvSettings, TrainConfig
from tests.marl.algorithms.test_offpolicy import small_config as off_policy_config
from tests.marl.app.test_eval_during_training import same, training_columns
from tests.marl.app.test_seeds import tiny_config, with_run

pytest.importorskip("vmas")

NAVIGATION = EnvSettings(env="vmas/navigation", num_envs=4, env_options={"n_agents": 2, "max_steps": 5})
ITERATION = 4 * 8  # frames: 4 envs x 8 steps


def on_policy(tmp_path) -> TrainConfig:
    return dataclasses.replace(tiny_config(tmp_path), env=NAVIGATION, algo=PPOConfig(minibatch_size=16, epochs=2))


def interrupted_and_resumed(
    config: TrainConfig, tmp_path, iterations: int = 3, stop: int = 1, log: str = "metrics.csv"
) -> tuple[list, list]:
    """The `log` of `config` trained `iterations` iterations straight, and of the run stopped after `stop`
    and resumed from its checkpoint to the same total."""
    config = with_run(config, total_frames=iterations * ITERATION, checkpoint_every=1)
    Trainer(config, run_dir=tmp_path / "straight").train()
    Trainer(with_run(config, total_frames=stop * ITERATION), run_dir=tmp_path / "resumed").train()
    Trainer.resume(tmp_path / "resumed" / "checkpoint.pt", total_frames=iterations * ITERATION).train()
    return read_rows(tmp_path / "straight" / log), read_rows(tmp_path / "resumed" / log)


def assert_same_logs(straight: list[dict], resumed: list[dict]) -> None:
    assert len(straight) == len(resumed) > 0
    for a, b in zip(straight, resumed):
        assert same(training_columns(a), training_columns(b)), (a, b)
    assert any(row["episodes"] > 0 for row in resumed)  # episodes ended on both sides of the resume


def test_an_on_policy_run_resumes_exactly(tmp_path, capsys):
    config = on_policy(tmp_path)
    straight, resumed = interrupted_and_resumed(config, tmp_path)
    assert_same_logs(straight, resumed)
    assert "cannot save its state" not in capsys.readouterr().out


def test_an_off_policy_run_with_its_buffer_resumes_exactly(tmp_path):
    config = dataclasses.replace(off_policy_config(tmp_path, "masac", warmup_frames=ITERATION), env=NAVIGATION)
    straight, resumed = interrupted_and_resumed(config, tmp_path)
    assert_same_logs(straight, resumed)
    assert all(row["agent/loss"] == row["agent/loss"] for row in resumed[1:])  # it learned (no NaN) after warm-up


def test_a_population_resumes_exactly_and_a_member_alone_starts_new_episodes(tmp_path, capsys):
    """`--seeds 0 1`: one VMAS world serves both members' envs; the population's checkpoint holds it, and the
    member's own checkpoint cannot (its envs drew from the population's one stream)."""
    config = with_run(on_policy(tmp_path), seeds=(0, 1))
    assert_same_logs(*interrupted_and_resumed(config, tmp_path, iterations=2, log="seed_0/metrics.csv"))
    for member in ("seed_1/metrics.csv", "aggregate.csv"):
        assert_same_logs(read_rows(tmp_path / "straight" / member), read_rows(tmp_path / "resumed" / member))
    capsys.readouterr()
    Trainer.resume(tmp_path / "resumed" / "seed_1" / "checkpoint.pt")
    said = "resumed training starts new episodes (vmas/navigation: the population's envs drew from one random stream"
    assert said in capsys.readouterr().out


def test_a_scenario_whose_state_cannot_be_restored_resumes_with_new_episodes_and_says_why(
    tmp_path, capsys, monkeypatch
):
    """Here the adapter misses simple_speaker_listener's goal, a landmark object (as it misses what road_traffic
    keeps): its check finds that the saved state does not restore, and the resumed run says so in one line."""
    from envs.adapters import vmas as vmas_adapter

    paths = vmas_adapter.world_paths
    monkeypatch.setattr(vmas_adapter, "_RESTORE_PROBLEMS", {})
    monkeypatch.setattr(vmas_adapter, "world_paths", lambda scenario: (paths(scenario)[0], []))
    env = EnvSettings(env="vmas/simple_speaker_listener", num_envs=4, env_options={"max_steps": 5})
    trainer = Trainer(with_run(dataclasses.replace(on_policy(tmp_path), env=env)), run_dir=tmp_path / "run")
    trainer.train_iteration()
    trainer.save()
    Trainer.resume(trainer.checkpoint_path)
    out = capsys.readouterr().out
    said = (
        "this env cannot save its state: resumed training starts new episodes (vmas/simple_speaker_listener keeps "
        "state that the adapter cannot save"
    )
    assert said in out and len([line for line in out.splitlines() if "cannot save" in line]) == 1

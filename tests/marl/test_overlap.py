"""`RunConfig.overlap_critic`: the critics' update on a second thread beside the next collection trains
as the update of both nets together does, checkpoints hold the batch collected ahead, and an error on
the thread reaches the caller."""

import dataclasses

import pytest
import torch

import marl.fused_step
import marl.rollout
from marl.config import AlgoConfig, EnvSettings, ModelConfig, RunConfig, TrainConfig
from marl.trainer import Trainer


def config(tmp_path, overlap: bool, iterations: int = 3) -> TrainConfig:
    return TrainConfig(
        env=EnvSettings(env="speaker_listener", num_envs=16),
        algo=AlgoConfig(minibatch_size=128, epochs=2, lr_schedule="linear", max_grad_norm=0.05),
        model=ModelConfig(hidden=(16, 16)),
        run=RunConfig(
            total_frames=16 * 16 * iterations,
            rollout_length=16,
            log_dir=str(tmp_path),
            progress=False,
            tensorboard=False,
            compile=overlap,
            overlap_critic=overlap,
        ),
        # A discrete and a continuous group; one without clipping, one with its own lr and Adam eps.
        group_overrides={"speaker": {"max_grad_norm": 0.0, "lr": 1e-3}, "listener": {"adam_eps": 1e-6}},
    )


@pytest.fixture
def eager_steps(monkeypatch):
    """The compiled steps run eagerly (exact, and no compiling in most tests)."""
    for module in (marl.fused_step, marl.rollout):
        monkeypatch.setattr(module, "maybe_compile", lambda fn, *args, **kwargs: fn)


def assert_same_parameters(a: Trainer, b: Trainer, **tolerance) -> None:
    for g in a.learners:
        for net in ("policy", "critic"):
            ours, theirs = (getattr(t.learners[g], net).parameters() for t in (a, b))
            for x, y in zip(ours, theirs, strict=True):
                torch.testing.assert_close(x, y, **tolerance)


def test_overlapped_critic_update_trains_as_the_update_of_both_nets(tmp_path, eager_steps):
    together = Trainer(config(tmp_path, overlap=False), run_dir=tmp_path / "together")
    apart = Trainer(config(tmp_path, overlap=True), run_dir=tmp_path / "apart")
    threads = torch.get_num_threads()
    for iteration in range(3):
        rows = [together.train_iteration(), apart.train_iteration()]
        assert apart._pending is not None or iteration == 2  # collected beside the critics, but after the last
        for key in ("frames", "episodes"):
            assert rows[0][key] == rows[1][key]
        for key in ("speaker/value_loss", "listener/policy_loss", "listener/critic_grad_norm"):
            assert rows[0][key] == pytest.approx(rows[1][key], rel=1e-5, abs=1e-6)
        assert_same_parameters(together, apart, rtol=1e-5, atol=1e-6)
    assert torch.get_num_threads() == threads


def test_a_checkpoint_holds_the_batch_collected_ahead(tmp_path, eager_steps):
    straight = Trainer(config(tmp_path, overlap=True), run_dir=tmp_path / "straight")
    straight.train_iteration()
    assert straight._pending is not None
    straight.save()
    row = straight.train_iteration()

    resumed = Trainer.resume(straight.checkpoint_path)
    assert resumed._pending is not None and resumed.iteration == 1
    resumed_row = resumed.train_iteration()
    assert_same_parameters(straight, resumed, rtol=0, atol=0)
    assert resumed_row["episodes"] == row["episodes"]
    assert resumed_row["listener/episode_return"] == row["listener/episode_return"]


def test_an_error_on_the_critics_thread_reaches_the_caller(tmp_path, eager_steps):
    trainer = Trainer(config(tmp_path, overlap=True), run_dir=tmp_path / "run")
    threads = torch.get_num_threads()

    def broken_step(*args):
        raise RuntimeError("the critic step broke")

    trainer._critic_step = broken_step
    with pytest.raises(RuntimeError, match="the critic step broke"):
        trainer.train_iteration()
    assert torch.get_num_threads() == threads


def test_overlap_needs_the_compiled_update():
    with pytest.raises(ValueError, match="overlap_critic needs compile"):
        RunConfig(overlap_critic=True)


def test_compiled_overlap_follows_the_eager_update(tmp_path):
    """Compiled for real (the critics' step with Inductor's C++ wrapper, on the thread, then on both
    threads): the first iterations follow the eager update of both nets, to compiled code's rounding."""
    # On VMAS, whose collection stays eager, so that only the update's two steps compile.
    vmas = EnvSettings(env="vmas/navigation", num_envs=16, env_options={"n_agents": 2, "max_steps": 8})
    configs = [
        dataclasses.replace(config(tmp_path, overlap, iterations=2), env=vmas, group_overrides={})
        for overlap in (False, True)
    ]
    eager = Trainer(configs[0], run_dir=tmp_path / "eager")
    compiled = Trainer(configs[1], run_dir=tmp_path / "compiled")
    for _ in range(2):
        rows = [eager.train_iteration(), compiled.train_iteration()]
        assert rows[0]["episodes"] == rows[1]["episodes"]
    assert_same_parameters(eager, compiled, rtol=1e-4, atol=1e-5)

"""`PPOConfig.overlap_critic`: the critics' update on a second thread beside the next collection trains
as the update of both nets together does, checkpoints hold the batch collected ahead, an error on the
thread reaches the caller, and the option is refused where it cannot run."""

import dataclasses
from types import SimpleNamespace

import pytest
import torch

import envs.compile
import marl.core.rollout
import marl.optim.update_step
from marl.algorithms.ppo import PPO, PPOConfig
from marl.app.build import make_env
from marl.app.trainer import Trainer
from marl.config import EnvSettings, ModelConfig, RunConfig, TrainConfig


def config(tmp_path, overlap: bool, iterations: int = 3) -> TrainConfig:
    return TrainConfig(
        env=EnvSettings(env="speaker_listener", num_envs=16),
        algo=PPOConfig(
            algo="ippo", minibatch_size=128, epochs=2, lr_schedule="linear", max_grad_norm=0.05, overlap_critic=overlap
        ),
        model=ModelConfig(hidden=(16, 16)),
        run=RunConfig(
            total_frames=16 * 16 * iterations,
            rollout_length=16,
            log_dir=str(tmp_path),
            progress=False,
            tensorboard=False,
            compile=overlap,
        ),
        # A discrete and a continuous group; one without clipping, one with its own lr and Adam eps.
        group_overrides={"speaker": {"max_grad_norm": 0.0, "lr": 1e-3}, "listener": {"adam_eps": 1e-6}},
    )


@pytest.fixture
def eager_steps(monkeypatch):
    """The compiled steps and rollout run eagerly (exact, and no compiling in most tests)."""
    for module in (marl.optim.update_step, marl.core.rollout):
        monkeypatch.setattr(module, "maybe_compile", lambda fn, *args, **kwargs: fn)


def assert_same_parameters(a: Trainer, b: Trainer, **tolerance) -> None:
    for g, learner in a.algorithm.learners.items():
        for x, y in zip(learner.parameters(), b.algorithm.learners[g].parameters(), strict=True):
            torch.testing.assert_close(x, y, **tolerance)


def test_overlapped_critic_update_trains_as_the_update_of_both_nets(tmp_path, eager_steps):
    together = Trainer(config(tmp_path, overlap=False), run_dir=tmp_path / "together")
    apart = Trainer(config(tmp_path, overlap=True), run_dir=tmp_path / "apart")
    assert apart.algorithm.overlaps and not together.algorithm.overlaps
    threads = torch.get_num_threads()
    for iteration in range(3):
        rows = [together.train_iteration(), apart.train_iteration()]
        # Collected beside the critics, except after the last iteration.
        assert (apart._pending is not None) == (iteration < 2)
        for key in ("frames", "episodes", "listener/episode_return"):
            assert rows[0][key] == pytest.approx(rows[1][key], rel=0, abs=0, nan_ok=True)  # NaN: none ended
        for key in ("speaker/value_loss", "listener/policy_loss", "listener/critic_grad_norm"):
            assert rows[0][key] == pytest.approx(rows[1][key], rel=1e-5, abs=1e-6)
        assert_same_parameters(together, apart, rtol=1e-5, atol=1e-6)
    assert torch.get_num_threads() == threads


@pytest.mark.parametrize("env_saves_state", [True, False], ids=["native", "unsaved_env"])
def test_a_checkpoint_holds_the_batch_collected_ahead(tmp_path, eager_steps, request, env_saves_state):
    # An env that cannot save its state (VMAS, PettingZoo) starts new episodes on resume: the batch collected
    # ahead is still the straight run's, with its finished episodes (they were logged as none, a NaN return).
    if not env_saves_state:
        request.getfixturevalue("speaker_listener_unsaved")
    straight = Trainer(config(tmp_path, overlap=True), run_dir=tmp_path / "straight")
    straight.train_iteration()
    assert straight._pending is not None
    straight.save()
    row = straight.train_iteration()

    resumed = Trainer.resume(straight.checkpoint_path)
    assert resumed._pending is not None and resumed.iteration == 1
    resumed_row = resumed.train_iteration()
    assert_same_parameters(straight, resumed, rtol=0, atol=0)
    assert resumed_row["episodes"] == row["episodes"] > 0
    assert resumed_row["listener/episode_return"] == row["listener/episode_return"]


def test_an_error_on_the_critics_thread_reaches_the_caller(tmp_path, eager_steps):
    trainer = Trainer(config(tmp_path, overlap=True), run_dir=tmp_path / "run")
    threads = torch.get_num_threads()

    def broken_step(*args):
        raise RuntimeError("the critic step broke")

    trainer.algorithm.critic_step = broken_step
    with pytest.raises(RuntimeError, match="the critic step broke"):
        trainer.train_iteration()
    assert torch.get_num_threads() == threads


def test_overlap_needs_the_compiled_update_on_the_cpu_in_one_process(tmp_path):
    with pytest.raises(ValueError, match="overlap_critic needs compile"):
        dataclasses.replace(config(tmp_path, overlap=True), run=RunConfig(compile=False))
    train = config(tmp_path, overlap=True)
    device = torch.device("cpu")
    env = make_env(train, device)
    with pytest.raises(ValueError, match=r"overlap_critic runs on the CPU in one process.* with 2 rank\(s\)"):
        PPO(train, env, device, SimpleNamespace(size=2), torch.Generator())


@pytest.mark.slow
def test_compiled_overlap_follows_the_eager_update(tmp_path, monkeypatch):
    """Compiled for real (the critics' step with Inductor's C++ wrapper, on the thread, then on both
    threads): the first iterations follow the eager update of both nets, to compiled code's rounding."""
    # On VMAS, whose collection stays eager, so that only the update's two steps compile. The policies'
    # step, PPO's update step for fewer nets, is traced without Inductor's code (which test_training's
    # compiled run checks); building the C++ wrapper's code is most of this test's time.
    pytest.importorskip("vmas")
    inductor, aot_eager = envs.compile._inductor_cpu, torch._dynamo.lookup_backend("aot_eager")

    def critics_only(graph, inputs, cpp_wrapper=False):
        return inductor(graph, inputs, cpp_wrapper=True) if cpp_wrapper else aot_eager(graph, inputs)

    monkeypatch.setattr(envs.compile, "_inductor_cpu", critics_only)
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

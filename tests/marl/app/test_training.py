"""Training end to end on small budgets: learning, exact resume, NaN guard, no host sync."""

import dataclasses
import math

import pytest
import torch

import envs
from envs.base import EnvOutputError
from envs.native.navigation import scripted_action
from marl.algorithms.ppo import PPOConfig
from marl.app.trainer import NonFiniteLossError, Trainer, resolve_device
from marl.config import EnvSettings, ModelConfig, RunConfig, TrainConfig
from marl.core.rollout import Collector
from tests.envs.broken_envs import Counter, NanRewardAtStep3


def small_config(tmp_path, **run) -> TrainConfig:
    return TrainConfig(
        env=EnvSettings(env="navigation", num_envs=32, env_options={"max_steps": 25}),
        algo=PPOConfig(minibatch_size=256, epochs=2),
        model=ModelConfig(hidden=(32, 32)),
        run=RunConfig(
            total_frames=32 * 16 * 3,
            rollout_length=16,
            log_dir=str(tmp_path),
            run_name="run",
            progress=False,
            tensorboard=False,
            checkpoint_every=1,
            **run,
        ),
    )


def test_resume_reproduces_the_next_iteration_exactly(tmp_path):
    config = small_config(tmp_path)
    straight = Trainer(config, run_dir=tmp_path / "straight")
    straight.train_iteration()
    straight.save()
    straight.train_iteration()

    resumed = Trainer.resume(tmp_path / "straight" / "checkpoint.pt")
    assert resumed.iteration == 1
    resumed.train_iteration()
    for group in straight.algorithm.learners:
        for a, b in zip(
            straight.algorithm.learners[group].policy.parameters(),
            resumed.algorithm.learners[group].policy.parameters(),
        ):
            assert torch.equal(a, b)
        for a, b in zip(
            straight.algorithm.learners[group].critic.parameters(),
            resumed.algorithm.learners[group].critic.parameters(),
        ):
            assert torch.equal(a, b)
    assert torch.equal(straight.collector.obs["agent"]["observation"], resumed.collector.obs["agent"]["observation"])


def test_a_resumed_run_whose_env_cannot_save_its_state_starts_from_another_seed(
    tmp_path, capsys, speaker_listener_unsaved
):
    """As with VMAS and PettingZoo, the resumed run starts new episodes: from the run's own seed, each resume
    replayed the episodes of the run's first iterations. The seed comes from the checkpoint: it resumes alike."""
    config = dataclasses.replace(small_config(tmp_path), env=EnvSettings(env="speaker_listener", num_envs=32))
    straight = Trainer(config, run_dir=tmp_path / "straight")
    first = straight.collector.obs["listener"]["observation"].clone()
    straight.train_iteration()
    straight.save()

    resumed = Trainer.resume(straight.checkpoint_path)
    assert "this env cannot save its state: resumed training starts new episodes" in capsys.readouterr().out
    obs = resumed.collector.obs["listener"]["observation"]
    assert not torch.equal(obs, first)
    assert torch.equal(Trainer.resume(straight.checkpoint_path).collector.obs["listener"]["observation"], obs)


def test_train_writes_log_and_atomic_checkpoints(tmp_path):
    trainer = Trainer(small_config(tmp_path))
    rows = trainer.train()
    assert len(rows) == 3 and rows[-1]["frames"] == 32 * 16 * 3
    lines = (tmp_path / "run" / "metrics.csv").read_text().splitlines()
    assert len(lines) == 4 and "agent/episode_return" in lines[0] and "collect_s" in lines[0]
    assert (tmp_path / "run" / "checkpoint.pt").exists()
    assert not list((tmp_path / "run").glob("*.tmp"))


class NanAfterAWhile(Counter):
    """Rewards turn to NaN after a few steps."""

    def _step(self, action):
        reward, terminated = super()._step(action)
        reward["mover"] = torch.where(self.picks[:, None] > -1e9, reward["mover"] / 0.0, reward["mover"])
        return reward, terminated


def test_nan_loss_stops_the_run_naming_group_and_term(tmp_path, monkeypatch):
    monkeypatch.setitem(envs.registry._ENVS, "nan_counter", NanAfterAWhile)
    config = dataclasses.replace(small_config(tmp_path), env=EnvSettings(env="nan_counter", num_envs=32))
    trainer = Trainer(config)
    with pytest.raises(NonFiniteLossError, match="of group 'mover' became nan at iteration 1"):
        trainer.train()
    assert not (tmp_path / "run" / "checkpoint.pt").exists()


class HugeReward(Counter):
    """Rewards of 1e30: finite, but their squares overflow PPO's float32 value normaliser."""

    def _step(self, action):
        reward, terminated = super()._step(action)
        reward["mover"] = reward["mover"] + 1e30
        return reward, terminated


def test_a_checkpoint_of_a_non_finite_state_is_refused(tmp_path, monkeypatch):
    """The losses stay finite while the critic's running variance overflows to inf: the run stops at the
    checkpoint instead of writing one that resumes into NaN."""
    monkeypatch.setitem(envs.registry._ENVS, "huge_counter", HugeReward)
    config = dataclasses.replace(small_config(tmp_path), env=EnvSettings(env="huge_counter", num_envs=32))
    trainer = Trainer(config)
    row = trainer.train_iteration()
    assert all(math.isfinite(value) for key, value in row.items() if key.endswith("loss"))
    with pytest.raises(NonFiniteLossError, match=r"after iteration 1 \(mover/critic/target_var\)"):
        trainer.save()
    assert not (tmp_path / "run" / "checkpoint.pt").exists()


@pytest.mark.parametrize("seeds", [(), (0, 1)], ids=["single", "seeds"])
def test_a_minibatch_of_one_frame_of_one_agent_trains(tmp_path, seeds):
    """Its advantage, one value, has no std to normalise by: it is left as it is, not made NaN."""
    config = small_config(tmp_path, seeds=seeds)
    config = dataclasses.replace(
        config,
        run=dataclasses.replace(config.run, rollout_length=2, total_frames=4),
        env=EnvSettings(env="navigation", num_envs=2, env_options={"n_agents": 1}),
        algo=PPOConfig(algo="ippo", minibatch_size=1, epochs=1),
    )
    row = Trainer(config).train_iteration()
    members = row.get("members", [row])
    assert len(members) == max(len(seeds), 1)
    for member in members:
        assert all(math.isfinite(member[f"agent/{name}"]) for name in ("loss", "policy_loss", "value_loss"))


def test_collect_advantages_and_loss_never_sync_with_the_host(tmp_path):
    trainer = Trainer(small_config(tmp_path))
    with envs.forbid_host_sync():
        buffer = trainer.collector.collect()
        trainer.algorithm.advantages(buffer)
        learner = trainer.algorithm.learners["agent"]
        data = buffer["agent"].reshape(-1)
        dist = learner.policy(data["observation"])
        dist.log_prob(data["action"]).sum().backward()


def mean_return(policy_fn, episodes_env, steps=25):
    obs = episodes_env.reset(seed=123)
    total = torch.zeros(episodes_env.num_envs)
    for _ in range(steps):
        next_td, obs = episodes_env.step({"agent": policy_fn(obs["agent", "observation"])})
        total += next_td["agent", "reward"][:, 0, 0]
    return total.mean().item()


@pytest.mark.parametrize("algo", ["mappo", "ippo"])
def test_short_training_clearly_beats_a_random_policy(tmp_path, algo):
    config = TrainConfig(
        env=EnvSettings(env="navigation", num_envs=64, env_options={"max_steps": 25}),
        algo=PPOConfig(algo=algo, minibatch_size=1024, epochs=4, lr=1e-3),
        model=ModelConfig(hidden=(64, 64)),
        run=RunConfig(
            total_frames=64 * 32 * 40,
            rollout_length=32,
            log_dir=str(tmp_path),
            run_name=algo,
            progress=False,
            tensorboard=False,
            checkpoint_every=100,
        ),
    )
    trainer = Trainer(config)
    rows = trainer.train()
    env = envs.make("navigation", num_envs=256, seed=7, max_steps=25)
    policy = trainer.algorithm.learners["agent"].policy
    with torch.no_grad():
        trained = mean_return(lambda o: (d := policy(o)).env_action(d.mode()), env)
    generator = torch.Generator().manual_seed(0)
    random = mean_return(lambda o: torch.rand(o.shape[:-1] + (2,), generator=generator) * 2 - 1, env)
    scripted = mean_return(scripted_action, env)
    assert trained > random + 0.5 * (scripted - random), (trained, random, scripted, rows[-1])


def test_shared_value_gives_one_value_per_env(tmp_path):
    config = small_config(tmp_path)
    config = dataclasses.replace(config, algo=dataclasses.replace(config.algo, shared_value=True))
    trainer = Trainer(config)
    learner = trainer.algorithm.learners["agent"]
    assert learner.critic.net.n_agents == 1 and not learner.critic_input.agent_ids
    obs = {"agent": torch.randn(5, 3, 18)}
    values = learner.critic(learner.critic_input(obs, None))
    assert values.shape == (5, 3) and torch.equal(values[:, 0], values[:, 2])
    trainer.train_iteration()
    with pytest.raises(ValueError, match="shared_value needs a centralised critic"):
        PPOConfig(algo="ippo", shared_value=True)


def test_eager_minibatches_are_slices_of_the_shuffled_epoch(tmp_path):
    """The eager update gathers an epoch's frames once and slices minibatches from them; the compiled
    one gathers each minibatch by index. Both must give the same rows, so the same loss, exactly."""
    trainer = Trainer(small_config(tmp_path), run_dir=tmp_path / "slices")
    buffer = trainer.collector.collect()
    trainer.algorithm.advantages(buffer)
    flat, state = trainer.algorithm.update_inputs(buffer)
    order = torch.randperm(buffer.batch_size.numel(), generator=torch.Generator().manual_seed(0))
    shuffled = {g: {k: v[order] for k, v in data.items()} for g, data in flat.items()}
    shuffled_state = state[order] if state is not None else None
    for start in (0, 256):
        by_index = trainer.algorithm._minibatch_loss(flat, state, order[start : start + 256])
        by_slice = trainer.algorithm._minibatch_loss(shuffled, shuffled_state, slice(start, start + 256))
        assert torch.equal(by_index[0], by_slice[0])
        assert torch.equal(by_index[1]["agent"], by_slice[1]["agent"])


@pytest.mark.slow
@pytest.mark.filterwarnings("error::RuntimeWarning")  # the compile fallback's warning fails the test
def test_compiled_training_matches_eager(tmp_path):
    """`--compile`: the same seed gives the same iterations as eager, within float tolerance; the
    compiled functions compile once (the annealed learning rate must not recompile the update), and
    AOTAutograd's on-disk cache can keep every graph (the next run loads them instead of retracing)."""
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    runs = {}
    for compile in (False, True):
        # Compiled with 2 steps per compiled rollout call: the unrolled graph must equal eager too.
        config = small_config(tmp_path, compile=compile, compile_unroll=2 if compile else 1)
        config = dataclasses.replace(config, algo=dataclasses.replace(config.algo, lr_schedule="linear"))
        trainer = Trainer(config, run_dir=tmp_path / f"compile-{compile}")
        held = [trainer.collector.obs["agent"]["observation"], *trainer.env.static_tensors()]
        with torch._dynamo.config.patch(error_on_recompile=True):
            rows = [trainer.train_iteration() for _ in range(3)]
        runs[compile] = (trainer, rows)
        # What is kept between compiled calls stays where it was (CUDA graphs overwrite their outputs).
        assert trainer.collector.obs["agent"]["observation"] is held[0]
        if compile:  # eager, the env assigns its state anew
            assert [id(t) for t in trainer.env.static_tensors()] == [id(t) for t in held[1:]]
    (eager, eager_rows), (compiled, compiled_rows) = runs[False], runs[True]
    # One graph each for the rollout step and the update step: a graph break splits a CUDA graph in pieces,
    # each replayed with its own host overhead (torch 2.11 broke the rollout step into 11 on an id() call).
    assert dict(torch._dynamo.utils.counters["graph_break"]) == {}
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 2
    aot = torch._dynamo.utils.counters["aot_autograd"]
    assert aot["total"] > 0 and aot["autograd_cache_bypass"] == 0, dict(aot)
    for key in ("agent/episode_return", "agent/policy_loss", "agent/value_loss", "agent/entropy"):
        for a, b in zip(eager_rows, compiled_rows):
            assert a[key] == pytest.approx(b[key], rel=1e-3, abs=1e-4, nan_ok=True), key
    learners = zip(
        eager.algorithm.learners["agent"].policy.parameters(), compiled.algorithm.learners["agent"].policy.parameters()
    )
    for a, b in learners:
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-4)


@pytest.mark.filterwarnings("error::RuntimeWarning")  # the compile fallback's warning fails the test
def test_compiled_training_collects_an_untraceable_env_eagerly(tmp_path):
    """`--compile` on `vmas/navigation`: VMAS's step cannot be traced, and compiling the acting and the
    bookkeeping around it saved nothing, so the collector compiles no graph (the update still does) and
    fills the buffer the eager collector fills, exactly."""
    pytest.importorskip("vmas")
    torch._dynamo.reset()
    buffers = []
    for compile in (False, True):
        config = small_config(tmp_path, compile=compile)
        config = dataclasses.replace(
            config,
            env=EnvSettings(env="vmas/navigation", num_envs=4, env_options={"n_agents": 2, "max_steps": 10}),
            algo=dataclasses.replace(config.algo, minibatch_size=32),
        )
        trainer = Trainer(config, run_dir=tmp_path / f"vmas-{compile}")
        graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
        buffers.append([trainer.collector.collect().clone() for _ in range(2)])
        assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == graphs
    for eager, compiled in zip(*buffers):
        assert (eager == compiled).all()


@pytest.mark.filterwarnings("error::RuntimeWarning")  # the compile fallback's warning fails the test
def test_compiled_training_collects_an_env_that_checks_values_eagerly(tmp_path, monkeypatch):
    """Traced into the compiled rollout, the env's value checks read values on the host, and the error they
    raised was taken for a compiler failure: the steps ran again eagerly, past a NaN that came once, which
    went on into training. With check_values the collector compiles no graph and the env's error stops the run."""
    monkeypatch.setitem(envs.registry._ENVS, "nan_at_step3", NanRewardAtStep3)
    config = small_config(tmp_path, compile=True)
    env = EnvSettings(env="nan_at_step3", num_envs=16, env_options={"check_values": True})
    trainer = Trainer(dataclasses.replace(config, env=env))
    assert not trainer.collector.compiled
    with pytest.raises(EnvOutputError, match=r"_step\(\)'s reward for group 'mover' contains NaN or inf in 1 of 16"):
        trainer.train_iteration()
    # Collected eagerly, step by step, --compile-unroll would have no effect.
    unrolled = dataclasses.replace(config, env=env, run=dataclasses.replace(config.run, compile_unroll=2))
    with pytest.raises(
        ValueError, match=r"^--compile-unroll 2: the rollout of nan_at_step3 is not compiled \(the env ch"
    ):
        Trainer(unrolled, run_dir=tmp_path / "unrolled")


def test_unrolled_collection_fills_the_same_buffer(tmp_path):
    """`compile_unroll` only groups steps into calls: eagerly, 4 steps per call give the same buffer."""
    buffers = []
    for unroll in (1, 4):
        trainer = Trainer(small_config(tmp_path), run_dir=tmp_path / f"unroll-{unroll}")
        acting, generator = trainer.algorithm.acting, trainer.generator
        collector = Collector(trainer.env, acting, 16, generator, seed=0, unroll=unroll)
        buffers.append(collector.collect().clone())
    assert (buffers[0] == buffers[1]).all()
    # So --compile-unroll without --compile would have no effect: it is refused.
    with pytest.raises(ValueError, match="^--compile-unroll 4: it applies to the compiled rollout only, as st"):
        small_config(tmp_path, compile_unroll=4)
    saved = small_config(tmp_path).to_dict()  # an earlier version took it: its checkpoints still load
    saved["run"]["compile_unroll"] = 4
    assert TrainConfig.from_dict(saved).run.compile_unroll == 1


def test_compile_unroll_must_divide_the_rollout(tmp_path):
    with pytest.raises(ValueError, match="compile_unroll \\(3\\) must divide rollout_length \\(16\\)"):
        small_config(tmp_path, compile_unroll=3)


def test_clip_factors_clip_each_list_as_torch_does():
    """The compiled step's clipping (`clip_factors`, traceable) against `clip_grad_norm_` per list."""
    import copy

    from marl.optim.update_step import clip_factors

    generator = torch.Generator().manual_seed(0)
    nets = [torch.nn.Linear(5, 4), torch.nn.Linear(3, 2), torch.nn.Linear(4, 4)]
    for scale, net in zip((10.0, 0.01, 3.0), nets):  # clipped, untouched, clipped
        for p in net.parameters():
            p.grad = torch.randn(p.shape, generator=generator) * scale
    twins = copy.deepcopy(nets)
    for net, twin in zip(nets, twins):
        for p, q in zip(net.parameters(), twin.parameters()):
            q.grad = p.grad.clone()
    reference = [torch.nn.utils.clip_grad_norm_(twin.parameters(), 1.0) for twin in twins]
    norms, factors = clip_factors([[p.grad for p in net.parameters()] for net in nets], 1.0)
    for norm, ref in zip(norms, reference):
        torch.testing.assert_close(norm, ref)
    for net, twin, factor in zip(nets, twins, factors):
        for p, q in zip(net.parameters(), twin.parameters()):
            torch.testing.assert_close(p.grad * factor, q.grad)


def test_an_indexed_cpu_device_trains(tmp_path):
    # torch.device("cpu:0") != torch.device("cpu"), the device its tensors report: the trainer keeps the
    # latter, or the env would refuse the trainer's actions as being on another device.
    trainer = Trainer(small_config(tmp_path, device="cpu:0"), run_dir=tmp_path / "run")
    assert trainer.device == torch.device("cpu")
    trainer.train_iteration()


def test_resolve_device_keeps_the_index_as_given():
    # Under torchrun a bare `cuda` lets each rank take cuda:LOCAL_RANK; an index chosen here would not.
    assert resolve_device("cpu:0") == torch.device("cpu:0")
    assert resolve_device("auto") == torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available"):
            resolve_device("cuda")


def test_an_unknown_device_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown device 'tpu'; expected cpu, cuda, cuda:N or auto"):
        resolve_device("tpu")


def summary_rows(returns: list[float]) -> list[dict[str, float]]:
    return [
        {"iteration": i, "frames": 100 * i, "time_s": float(i), "agent/episode_return": r}
        for i, r in enumerate(returns, start=1)
    ]


def test_summary_return_skips_iterations_without_ended_episodes():
    from marl.app.summary import return_text

    nan = float("nan")
    # The tail (last 2 of 20) holds one NaN: the finite value alone is the mean.
    assert return_text(summary_rows([1.0] * 18 + [nan, 3.0]), "agent/episode_return", 2).startswith(
        "mean episode return 3.0000 over the last 2 iteration(s)"
    )
    # No episode ended in the tail: the last 2 iterations with a return (3 and 5; 4 had none).
    text = return_text(summary_rows([1.0, 1.0, 2.0, nan, 4.0, nan, nan]), "agent/episode_return", 2)
    assert text == (
        "mean episode return 3.0000 over iterations 3-5 (no episode ended in the last 2 iteration(s)) "
        "(first: 1.0000 at 100 frames)"
    )
    assert "over iteration 1 (" in return_text(summary_rows([2.0, nan]), "agent/episode_return", 1)
    assert return_text(summary_rows([nan, nan]), "agent/episode_return", 1) == (
        "mean episode return: no episode ended in the 2 iteration(s)"
    )


@pytest.mark.parametrize(
    "env, options, hint",
    [
        ("navigation", {}, False),  # as env=SimpleNamespace(renders=False) says: a native env that does not draw
        ("pettingzoo/mpe2.simple_spread_v3", {}, True),  # trained without render_mode='rgb_array': eval asks for it
        ("pettingzoo/mpe2.simple_spread_v3", {"render_mode": "human"}, True),
        ("pettingzoo/tests.envs.pz_toy", {}, False),  # its metadata lists no render_modes
    ],
    ids=["native", "pettingzoo", "pettingzoo-human", "pettingzoo-no-render-modes"],
)
def test_the_summary_suggests_render_where_marl_eval_can_draw(env, options, hint, capsys):
    # A PettingZoo run trained without render_mode='rgb_array' was not offered --render, which now draws it.
    from types import SimpleNamespace

    from marl.app.summary import print_summary

    if env.startswith("pettingzoo"):
        pytest.importorskip("mpe2")
    config = dataclasses.replace(small_config("runs"), env=EnvSettings(env=env, env_options=options))
    trainer = SimpleNamespace(
        run_dir="runs/x",
        config=config,
        device=torch.device("cpu"),
        world=SimpleNamespace(size=1),
        env=SimpleNamespace(renders=False, groups={"agent": None}),
        checkpoint_path="runs/x/checkpoint.pt",
    )
    print_summary(trainer, summary_rows([1.0, 2.0]))
    assert ("marl eval --checkpoint runs/x/checkpoint.pt --render episode.gif\n" in capsys.readouterr().out) == hint


def test_the_printed_summary_has_no_nan_return(capsys):
    from types import SimpleNamespace

    from marl.app.summary import print_summary

    trainer = SimpleNamespace(
        run_dir="runs/x",
        config=small_config("runs"),
        device=torch.device("cpu"),
        world=SimpleNamespace(size=1),
        env=SimpleNamespace(renders=False, groups={"agent": None}),
        checkpoint_path="runs/x/checkpoint.pt",
    )
    print_summary(trainer, summary_rows([1.0, 2.0, float("nan")]))
    out = capsys.readouterr().out
    assert "mean episode return 2.0000 over iteration 2 (no episode ended in the last 1 iteration(s))" in out
    assert "nan" not in out

"""Several seeds of the off-policy algorithms in one process (`marl train --algo qmix --seeds`, `--algo masac`):
each member is the single run with its seed, its own replay buffer, draws, exploration and sampling noise, SAC
temperature and targets; with recurrent Q-networks (`--model gru`) its envs' states and its chunks of steps."""

import collections
import dataclasses
import math

import pytest
import torch
from tensordict import TensorDict

import envs
from marl.app import seeds as population
from marl.app.cli import main
from marl.app.trainer import Trainer
from marl.core.member_replay import MemberReplayBuffer
from marl.core.replay import ReplayBuffer
from tests.marl.algorithms.test_offpolicy import small_config
from tests.marl.app.test_seeds import SEEDS, assert_resumes_exactly, assert_rows_match, iteration_ops

# Per algorithm an env and options that reach the parts a member keeps apart: a buffer that wraps (100 slots, 64
# steps an iteration), warm-up (random actions from each member's noise), hard and Polyak target updates, n-step
# returns, clipped and unclipped gradients, DDPG's sigma annealed over the 3 iterations, SAC's temperature tuned
# from alpha_init, discrete and continuous groups of one run (speaker_listener).
CASES = {
    "iql": ("spread", {"buffer_size": 100, "warmup_frames": 64, "target_update": "hard", "target_update_every": 2}),
    "vdn": ("spread", {"n_step": 2, "buffer_size": 150}),
    "qmix": ("spread", {"buffer_size": 100, "max_grad_norm": 0.5}),
    "maddpg": ("navigation", {"buffer_size": 100, "warmup_frames": 64, "exploration_anneal": 0.5}),
    "iddpg": ("navigation", {"max_grad_norm": 0.0, "tau": 0.1, "exploration_anneal": 0.5}),
    "masac": ("speaker_listener", {"buffer_size": 100, "max_grad_norm": 0.5}),
    "isac": ("navigation", {"warmup_frames": 64, "alpha_init": 0.5}),
}
VALUE_BASED = ("iql", "vdn", "qmix")


def off_config(tmp_path, algo: str, **run):
    env, options = CASES[algo]
    if algo in VALUE_BASED:
        options = {"exploration_anneal": 0.01, **options}
    config = small_config(tmp_path, algo, env, **options)
    run = {"total_frames": 8 * 8 * 3, "checkpoint_every": 1, **run}
    settings = dataclasses.replace(config.env, env_options={"max_steps": 6})  # episodes end in every iteration
    return dataclasses.replace(config, env=settings, run=dataclasses.replace(config.run, **run))


def gru_off_config(tmp_path, algo: str, **run):
    """`off_config` with recurrent Q-networks: chunks of 4 steps after a burn-in of 2, from a buffer of 48 steps
    a member (written 64 an iteration: it wraps), which holds a chunk of one of a member's 8 envs (41 slots) but
    not one of the population's 16 (81 slots): the chunks' checks take a member's envs. TD(0) (n_step 1)."""
    config = off_config(tmp_path, algo, **run)
    algo_config = dataclasses.replace(config.algo, chunk_length=4, burn_in=2, n_step=1, buffer_size=48)
    model = dataclasses.replace(config.model, model="gru", gru_hidden=8)
    return dataclasses.replace(config, algo=algo_config, model=model)


@pytest.mark.parametrize("case", [*CASES, "iql-gru", "qmix-gru"])
def test_each_member_trains_as_the_single_run_with_its_seed(tmp_path, case):
    """Its rows, its buffer and its nets are its single run's; with recurrent Q-networks (`-gru`) each member acts
    from its own envs' states, stores them with its steps, draws its own chunks and unrolls its own nets."""
    algo, gru = case.removesuffix("-gru"), case.endswith("-gru")
    make = gru_off_config if gru else off_config
    batched = Trainer(make(tmp_path, algo, seeds=SEEDS), run_dir=tmp_path / "seeds")
    singles = [Trainer(make(tmp_path, algo, seed=s), run_dir=tmp_path / f"seed{s}") for s in SEEDS]
    for _ in range(2 if gru else 3):
        row = batched.train_iteration()
        for member, single in zip(row["members"], singles):
            assert_rows_match(member, single.train_iteration())
    # each member's buffer holds its own single run's steps, slot for slot: exactly where actions are discrete,
    # to the rounding of the batched policies where they (and the states they lead to) are continuous, and of the
    # batched GRUs in the acting states stored
    tolerance = 0 if algo in VALUE_BASED and not gru else 1e-5
    held = batched.buffer.member_storage()
    assert gru == ({("agent", "hidden"), ("is_init",)} <= held.keys())
    for k, single in enumerate(singles):
        for key, tensor in single.buffer.storage.items():
            torch.testing.assert_close(held[key][k], tensor, rtol=10 * tolerance, atol=tolerance, msg=str(key))
        state, member = single.algorithm.state_dict(), batched.algorithm.member_state_dict(k)
        for g, learner in single.algorithm.learners.items():
            for name in learner.modules():
                torch.testing.assert_close(member[g][name], state[g][name], rtol=1e-4, atol=1e-5, msg=f"{g} {name}")
    group = next(iter(batched.env.groups))
    assert all(math.isfinite(member[f"{group}/episode_return"]) for member in row["members"])
    assert row["members"][0][f"{group}/loss"] != row["members"][1][f"{group}/loss"]


def random_steps(layout: dict, batch: tuple[int, ...], generator: torch.Generator) -> TensorDict:
    """Random env steps `[*batch]` of a buffer's `layout`, every value distinct enough to tell slots apart."""
    data = TensorDict({}, batch_size=batch)
    for key, (shape, dtype) in layout.items():
        value = torch.randint(0, 1000, (*batch, *shape), generator=generator)
        data.set(key if len(key) > 1 else key[0], value.to(dtype))
    return data


def test_member_buffers_hold_their_own_envs_steps_in_single_run_order():
    env = envs.make("spread", num_envs=2 * 3, seed=SEEDS)
    buffer = MemberReplayBuffer.for_env(env, 10, members=2)
    singles = [ReplayBuffer.for_env(env, 10) for _ in SEEDS]
    generator = torch.Generator().manual_seed(0)
    for _ in range(3):  # 6 steps per member each time into 10 slots: the rings wrap
        batch = random_steps(buffer.layout, (2, 6), generator)
        buffer.extend(batch)
        for k, single in enumerate(singles):
            single.extend(batch[:, k * 3 : (k + 1) * 3])
    held = buffer.member_storage()
    for k, single in enumerate(singles):
        for key, tensor in single.storage.items():
            assert torch.equal(held[key][k], tensor), key
    assert repr(buffer).startswith(f"MemberReplayBuffer(2 members x {len(singles[0])}/10 env steps")
    draws = buffer.draw_members(3, 5, [torch.Generator().manual_seed(s) for s in SEEDS])
    for k, s in enumerate(SEEDS):
        assert torch.equal(draws[k], singles[k].draw_ahead(3, 5, torch.Generator().manual_seed(s)))
    restored = MemberReplayBuffer.for_env(env, 10, members=2)
    restored.load_state_dict(buffer.state_dict())
    assert all(torch.equal(restored.storage[key], value) for key, value in buffer.storage.items())
    with pytest.raises(TypeError, match="draw_members"):
        buffer.draw(5)


def test_a_recurrent_population_launches_as_many_ops_for_any_number_of_members(tmp_path):
    """As `test_seeds`' op count: two and four members of a GRU Q-learning population launch the same ops but for
    the draws from each member's generator, per iteration one of its rollout's noise and one of its chunks."""
    config = gru_off_config(tmp_path, "qmix")
    two = iteration_ops(config, (3, 8), tmp_path / "two")
    four = iteration_ops(config, (3, 8, 5, 1), tmp_path / "four")
    assert four - two == collections.Counter({"aten.rand": 2, "aten.randint": 2})
    assert not two - four


@pytest.mark.parametrize(
    ("algo", "gru"), [("qmix", False), ("masac", False), ("maddpg", False), ("qmix", True)], ids=str
)
def test_population_update_reads_nothing_back_from_the_device(tmp_path, algo, gru):
    config = (gru_off_config if gru else off_config)(tmp_path, algo, seeds=SEEDS, total_frames=10**5)
    trainer = Trainer(config, run_dir=tmp_path / "run")
    trainer.algorithm.begin_iteration(0, 10**5)
    trainer.buffer.extend(trainer.collector.collect())
    with envs.forbid_host_sync("cpu"):
        trainer.algorithm.begin_iteration(64, 10**5)
        trainer.buffer.extend(trainer.collector.collect())
        trainer.algorithm.update(trainer.buffer, trainer.timer)


@pytest.mark.parametrize(("algo", "gru"), [("iql", False), ("masac", False), ("maddpg", False), ("iql", True)], ids=str)
def test_population_resumes_exactly_and_each_member_resumes_alone_with_its_buffer(tmp_path, algo, gru):
    # With recurrent Q-networks the checkpoints carry the envs' acting states and the stored states.
    config = (gru_off_config if gru else off_config)(tmp_path, algo, seeds=SEEDS)
    member = assert_resumes_exactly(config, tmp_path)
    assert type(member.buffer) is ReplayBuffer and len(member.buffer) == config.algo.buffer_size  # its own steps
    assert ("agent", "hidden") in member.buffer.storage if gru else not member.buffer.hidden


SWEPT = {"lr": (0.001, 0.03), "tau": (0.01, 0.3), "gamma": (0.8, 0.99)}


# gamma: in TD targets (QMIX's mixer, SAC's entropy-regularised ones, DDPG's) and VDN's n-step returns (n_step 2);
# tau: Q-learning's Polyak targets too.
@pytest.mark.parametrize(
    ("algo", "option"),
    [
        ("vdn", "lr"),
        ("isac", "lr"),
        ("maddpg", "tau"),
        ("qmix", "tau"),
        ("vdn", "gamma"),
        ("qmix", "gamma"),
        ("masac", "gamma"),
        ("iddpg", "gamma"),
    ],
)
def test_each_member_of_a_sweep_trains_as_the_single_run_with_its_value(tmp_path, algo, option):
    values = SWEPT[option]
    sweep = (f"{option}={values[0]},{values[1]}",)
    batched = Trainer(off_config(tmp_path, algo, seeds=(3,), sweep=sweep), run_dir=tmp_path / "sweep")
    assert [m.name for m in batched.members] == [f"seed_3-{option}_{v}" for v in values]
    config = off_config(tmp_path, algo, seed=3)
    singles = [
        Trainer(
            dataclasses.replace(config, algo=dataclasses.replace(config.algo, **{option: v})), run_dir=tmp_path / f"{v}"
        )
        for v in values
    ]
    for _ in range(2):
        for member, single in zip(batched.train_iteration()["members"], singles):
            assert_rows_match(member, single.train_iteration())
    if algo in VALUE_BASED:  # the optimiser steps' clock, in every member's checkpoint, moved as the single runs'
        assert torch.equal(batched.algorithm.updates, singles[0].algorithm.updates)


def off_argv(tmp_path, algo="iql") -> list[str]:
    env = "spread" if algo in VALUE_BASED else "navigation"
    return [
        *("--algo", algo, "--env", env, "--num-envs", "8", "--rollout-length", "8", "--total-frames", "128"),
        *("--batch-size", "32", "--updates-per-iteration", "2", "--buffer-size", "200", "--hidden", "8"),
        *("--env-option", "max_steps=4", "--log-dir", str(tmp_path), "--run-name", "run"),
        *("--no-progress", "--no-tensorboard"),
    ]


@pytest.mark.parametrize("algo", ["qmix", "maddpg"])
def test_train_writes_member_logs_aggregate_and_checkpoints_that_eval_takes(tmp_path, capsys, algo):
    assert main(["train", *off_argv(tmp_path, algo), "--num-seeds", "2", "--save-buffer"]) == 0
    out = capsys.readouterr().out
    assert "seeds 0, 1: 2 runs in one process" in out and "replay buffer" in out and "final return" in out
    assert f"with {algo.upper()} on cpu" in out
    run = tmp_path / "run"
    assert len((run / "aggregate.csv").read_text().splitlines()) == 3
    for seed in (0, 1):
        assert len((run / f"seed_{seed}" / "metrics.csv").read_text().splitlines()) == 3
    assert main(["eval", "--checkpoint", str(run / "checkpoint.pt"), "--member", "1", "--episodes", "2"]) == 0
    assert "agent: mean episode return" in capsys.readouterr().out
    member = Trainer.resume(run / "seed_1" / "checkpoint.pt")  # a single run's, with its own buffer
    assert len(member.buffer) == 128 and member.config.run.seed == 1


def test_a_recurrent_q_learning_population_trains_from_the_command_line(tmp_path, capsys):
    argv = ["--num-seeds", "2", "--model", "gru", "--chunk-length", "4", "--burn-in", "2", "--buffer-size", "48"]
    assert main(["train", *off_argv(tmp_path, "qmix"), *argv, "--save-buffer"]) == 0
    run = tmp_path / "run"
    assert len((run / "aggregate.csv").read_text().splitlines()) == 3
    assert main(["eval", "--checkpoint", str(run / "checkpoint.pt"), "--member", "1", "--episodes", "2"]) == 0
    assert "agent: mean episode return" in capsys.readouterr().out
    member = Trainer.resume(run / "seed_1" / "checkpoint.pt")
    assert member.config.model.model == "gru" and len(member.buffer) == 48


@pytest.mark.parametrize(
    ("algo", "argv", "message"),
    [
        ("iql", ["--prioritized"], "draw from their replay buffers uniformly so far: leave out --prioritized"),
        ("masac", ["--prioritized"], "draw from their replay buffers uniformly so far: leave out --prioritized"),
        ("iql", ["--sweep", "epsilon=0.9,0.99"], "--sweep takes Q-learning's options lr, gamma, tau, not epsilon"),
        (
            "iql",
            ["--target-update", "hard", "--sweep", "tau=0.01,0.1"],
            "--sweep tau: group(s) ['agent'] copy their targets (--target-update hard), with no tau to sweep",
        ),
        ("masac", ["--sweep", "alpha_init=0.1,1"], "--sweep takes SAC's options lr, gamma, tau, not alpha_init"),
        ("maddpg", ["--sweep", "gamma=0.9,2"], "gamma must be in [0, 1], got 2.0"),
        (
            "vdn",
            ["--model", "gru", "--chunk-length", "4", "--n-step", "2"],
            "Q-learning on chunks takes TD(0) targets (n_step 1)",
        ),
        ("masac", ["--model", "gru"], "--model gru: --algo masac trains MLPs only"),  # as a single run's
        (
            "iql",
            ["--env", "speaker_listener", "--group", "listener.algo=masac"],
            "of iql train every group with IQL, VDN or QMIX; group(s) ['listener'] take another algorithm",
        ),
        (
            "maddpg",
            ["--env", "speaker_listener", "--group", "speaker.algo=iql"],
            "of maddpg train every group with MADDPG or IDDPG; group(s) ['speaker'] take another algorithm",
        ),
    ],
)
def test_what_off_policy_populations_do_not_train_is_one_clear_line(tmp_path, algo, argv, message, capsys):
    assert main(["train", *off_argv(tmp_path, algo), "--num-seeds", "2", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


@pytest.mark.parametrize(("algo", "gru"), [("qmix", False), ("masac", False), ("qmix", True)], ids=str)
def test_memory_line_counts_a_members_buffer_and_its_target_nets_once(tmp_path, algo, gru):
    make = gru_off_config if gru else off_config
    batched = Trainer(make(tmp_path, algo, seeds=SEEDS), run_dir=tmp_path / "seeds")
    parts = population.member_nbytes(batched.config, batched.env, batched.algorithm)
    single = Trainer(make(tmp_path, algo, seed=SEEDS[0]), run_dir=tmp_path / "single")
    # A single run's allocated buffer (with recurrent Q-networks its stored states and is_init); its trained
    # nets 4 times (gradients, Adam's moments), its targets once.
    assert parts["replay buffer"] == sum(t.numel() * t.element_size() for t in single.buffer.storage.values())
    expected = 0
    for g, learner in single.algorithm.learners.items():
        trained = {id(p) for net in single.algorithm.trainables[g].nets.values() for p in net.parameters()}
        for module in learner.modules().values():
            for p in module.parameters():
                expected += (4 if id(p) in trained else 1) * p.numel() * p.element_size()
    assert parts["nets and Adam"] == expected

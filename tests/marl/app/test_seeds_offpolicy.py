"""Several seeds of the off-policy algorithms in one process (`marl train --algo qmix --seeds`, `--algo masac`):
each member is the single run with its seed, its own replay buffer, draws, exploration and sampling noise, SAC
temperature and targets; with recurrent Q-networks (`--model gru`) its envs' states and its chunks of steps; with
groups on different algorithms (`--group speaker.algo=iql`) the single mixed run with its seed."""

import collections
import dataclasses
import math

import pytest
import torch
from tensordict import TensorDict

import envs
from marl.algorithms.mixed import Mixed
from marl.algorithms.offpolicy_seeds import SeededMixed
from marl.app import seeds as population
from marl.app.cli import main
from marl.app.trainer import Trainer
from marl.core.member_replay import MemberReplayBuffer
from marl.core.replay import Prioritized, ReplayBuffer
from tests.marl.algorithms.test_offpolicy import small_config
from tests.marl.app.test_seeds import (
    SEEDS,
    assert_members_save_their_lr,
    assert_populations_match,
    assert_resumes_exactly,
    assert_rows_match,
    iteration_ops,
    tensors,
    uncompiled,
)

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
# Mixed runs of speaker_listener: the speaker on IQL (`--group speaker.algo=iql`, with its own options here), the
# listener on the run's algorithm (its options after): IQL's hard target copies and 2-step returns beside SAC's
# Polyak targets and temperature; IQL's epsilon beside DDPG's sigma, annealed over the run, and warm-up.
MIXED = {
    "masac+iql": (
        "masac",
        {"target_update": "hard", "target_update_every": 2, "n_step": 2, "exploration_anneal": 0.01},
        {"buffer_size": 100, "max_grad_norm": 0.5},
    ),
    "maddpg+iql": ("maddpg", {}, {"buffer_size": 100, "warmup_frames": 64, "exploration_anneal": 0.5}),
}


def off_config(tmp_path, algo: str, **run):
    """A small run of `algo` (a key of `CASES` or of `MIXED`) whose episodes end in every iteration."""
    if algo in MIXED:
        algo, speaker, options = MIXED[algo]
        config = small_config(tmp_path, algo, "speaker_listener", **options)
        config = dataclasses.replace(config, group_overrides={"speaker": {"algo": "iql", **speaker}})
    else:
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


@pytest.mark.parametrize("case", list(MIXED))
def test_each_member_of_a_mixed_population_trains_as_the_single_mixed_run_with_its_seed(tmp_path, case):
    """Groups on different algorithms: member k's rows, buffer, nets, Adam moments and IQL clock are the single
    mixed run's with seed k."""
    batched = Trainer(off_config(tmp_path, case, seeds=SEEDS), run_dir=tmp_path / "seeds")
    singles = [Trainer(off_config(tmp_path, case, seed=s), run_dir=tmp_path / f"seed{s}") for s in SEEDS]
    assert type(batched.algorithm) is SeededMixed and all(type(s.algorithm) is Mixed for s in singles)
    for _ in range(2):
        row = batched.train_iteration()
        for member, single in zip(row["members"], singles):
            assert_rows_match(member, single.train_iteration())
    held = batched.buffer.member_storage()
    for k, single in enumerate(singles):
        for key, tensor in single.buffer.storage.items():
            torch.testing.assert_close(held[key][k], tensor, rtol=1e-4, atol=1e-5, msg=str(key))
        state, member = tensors(single.algorithm.state_dict()), tensors(batched.algorithm.member_state_dict(k))
        assert member.keys() == state.keys() and ".QLearning.updates" in state
        for key, value in state.items():
            torch.testing.assert_close(member[key], value, rtol=1e-4, atol=1e-5, msg=key)
    assert row["members"][0]["speaker/loss"] != row["members"][1]["speaker/loss"]


def prioritized(config, **options):
    """`config` with prioritized replay (`options`: the algorithm's others)."""
    return dataclasses.replace(config, algo=dataclasses.replace(config.algo, prioritized=True, **options))


# MASAC: discrete and continuous groups, their priorities reduced by the mean; QMIX: n-step returns, one mixed
# TD error per env step as every agent's priority. Both rings wrap in the second iteration (100 slots).
# IQL+MASAC: each group's TD errors (IQL's 2-step ones) reduced into one priority per env step.
PRIORITIZED = {
    "masac": {"priority_reduce": "mean"},
    "qmix": {"n_step": 2, "priority_alpha": 0.8},
    "masac+iql": {},
}


@pytest.mark.parametrize("algo", list(PRIORITIZED))
def test_each_member_of_a_prioritized_population_trains_as_the_single_prioritized_run(tmp_path, algo):
    options = PRIORITIZED[algo]
    batched = Trainer(prioritized(off_config(tmp_path, algo, seeds=SEEDS), **options), run_dir=tmp_path / "seeds")
    singles = [
        Trainer(prioritized(off_config(tmp_path, algo, seed=s), **options), run_dir=tmp_path / f"seed{s}")
        for s in SEEDS
    ]
    assert type(batched.buffer) is MemberReplayBuffer and batched.buffer.tree.shape[0] == len(SEEDS)
    for _ in range(2):
        row = batched.train_iteration()
        for member, single in zip(row["members"], singles):
            assert_rows_match(member, single.train_iteration())
    # Each member's tree is its single run's (its priorities to the rounding of the batched losses), its own
    # largest priority, its nets' parameters and Adam moments the single run's.
    tree, largest = batched.buffer.tree, batched.buffer.max_priority
    for k, single in enumerate(singles):
        torch.testing.assert_close(tree[k], single.buffer.tree, rtol=1e-4, atol=1e-6)
        torch.testing.assert_close(largest[k], single.buffer.max_priority, rtol=1e-4, atol=1e-6)
        state, member = tensors(single.algorithm.state_dict()), tensors(batched.algorithm.member_state_dict(k))
        assert member.keys() == state.keys()
        for key, value in state.items():
            torch.testing.assert_close(member[key], value, rtol=1e-4, atol=1e-5, msg=key)
    assert not torch.equal(tree[0], tree[1])  # the members' trees are their own
    group = next(iter(batched.env.groups))
    assert row["members"][0][f"{group}/loss"] != row["members"][1][f"{group}/loss"]


def test_member_buffers_keep_their_own_priorities_as_single_prioritized_buffers():
    # Each member's tree, largest priority, draws and importance weights are its single buffer's, bit for bit,
    # when both are given the same priorities; its checkpoint is a single buffer's.
    env = envs.make("spread", num_envs=2 * 3, seed=SEEDS)
    option = Prioritized(alpha=0.7, beta=0.5)
    buffer = MemberReplayBuffer.for_env(env, 10, members=2, prioritized=option)
    singles = [ReplayBuffer.for_env(env, 10, prioritized=option) for _ in SEEDS]
    assert buffer.tree.shape == (2, singles[0].tree.numel()) and buffer.max_priority.shape == (2,)
    assert buffer.nbytes == 2 * singles[0].nbytes
    generators = [torch.Generator().manual_seed(s) for s in SEEDS]
    alone = [torch.Generator().manual_seed(s) for s in SEEDS]
    generator = torch.Generator().manual_seed(0)
    for _ in range(3):  # the rings wrap; new steps enter at each member's own largest priority
        batch = random_steps(buffer.layout, (2, 6), generator)
        buffer.extend(batch)
        for k, single in enumerate(singles):
            single.extend(batch[:, k * 3 : (k + 1) * 3])
        drawn = buffer.draw_members(2, 5, generators)  # [S, steps, k] each member's stratified fractions
        single_drawn = [single.draw_ahead(2, 5, g) for single, g in zip(singles, alone)]
        assert all(torch.equal(drawn[k], d) for k, d in enumerate(single_drawn))
        for t in range(2):  # each draw in the trees as the last priorities left them
            index, weight = buffer.select(drawn[:, t], 0.5)  # [S, k] each
            priority = torch.rand(2, 5, generator=generator) * torch.tensor([[1.0], [5.0]])  # member 1's larger
            buffer.set_priority_(index, priority)
            for k, single in enumerate(singles):
                want = single.select(single_drawn[k][t], 0.5)
                assert torch.equal(index[k], want[0]) and torch.equal(weight[k], want[1])
                single.set_priority_(want[0], priority[k])
                assert torch.equal(buffer.tree[k], single.tree), k
                assert torch.equal(buffer.max_priority[k], single.max_priority), k
    assert not torch.equal(buffer.tree[0], buffer.tree[1])
    assert repr(buffer).startswith("MemberReplayBuffer(2 members x 10/10 env steps") and "prioritized" in repr(buffer)
    state = buffer.state_dict()
    for k, single in enumerate(singles):  # member k's checkpoint: a single prioritized buffer's, tree and all
        alone_buffer = ReplayBuffer.for_env(env, 10, prioritized=option)
        alone_buffer.load_state_dict(MemberReplayBuffer.member_state_dict(state, k))
        assert torch.equal(alone_buffer.tree, single.tree) and torch.equal(
            alone_buffer.max_priority, single.max_priority
        )
    restored = MemberReplayBuffer.for_env(env, 10, members=2, prioritized=option)
    restored.load_state_dict(state)
    assert torch.equal(restored.tree, buffer.tree) and torch.equal(restored.max_priority, buffer.max_priority)


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


def test_a_mixed_population_launches_as_many_ops_for_any_number_of_members(tmp_path):
    """Speaker on IQL, listener on MASAC: beyond the ops of two members, four launch only the draws from each
    member's generator: per rollout its exploration noise (one draw per group), per update the listener's
    sampling noise and its slots."""
    config = off_config(tmp_path, "masac+iql")
    two = iteration_ops(config, (3, 8), tmp_path / "two")
    four = iteration_ops(config, (3, 8, 5, 1), tmp_path / "four")
    assert four - two == collections.Counter({"aten.rand": 2, "aten.randn": 2 * 2, "aten.randint": 2})
    assert not two - four


def variant_config(tmp_path, algo: str, variant: str, **run):
    """`off_config` as it is ("mlp"), with recurrent Q-networks ("gru") or with prioritized replay ("prioritized")."""
    config = (gru_off_config if variant == "gru" else off_config)(tmp_path, algo, **run)
    return prioritized(config) if variant == "prioritized" else config


@pytest.mark.parametrize(
    ("algo", "variant"),
    [
        ("qmix", "mlp"),
        ("masac", "mlp"),
        ("maddpg", "mlp"),
        ("qmix", "gru"),
        ("qmix", "prioritized"),
        ("masac", "prioritized"),
        ("masac+iql", "mlp"),
        ("maddpg+iql", "prioritized"),
    ],
    ids=str,
)
def test_population_update_reads_nothing_back_from_the_device(tmp_path, algo, variant):
    # Prioritized: every member's finds, importance weights and priority updates in its own tree, no sync. The
    # first update builds what is made once (the sum tree's layout on the device), as a run's first iteration.
    config = variant_config(tmp_path, algo, variant, seeds=SEEDS, total_frames=10**5)
    trainer = Trainer(config, run_dir=tmp_path / "run")
    trainer.algorithm.begin_iteration(0, 10**5)
    trainer.buffer.extend(trainer.collector.collect())
    trainer.algorithm.update(trainer.buffer, trainer.timer)
    with envs.forbid_host_sync("cpu"):
        trainer.algorithm.begin_iteration(64, 10**5)
        trainer.buffer.extend(trainer.collector.collect())
        trainer.algorithm.update(trainer.buffer, trainer.timer)


@pytest.mark.parametrize(
    ("algo", "variant"),
    [
        ("iql", "mlp"),
        ("masac", "mlp"),
        ("maddpg", "mlp"),
        ("iql", "gru"),
        ("maddpg", "prioritized"),
        ("vdn", "prioritized"),
        ("masac+iql", "mlp"),
        ("maddpg+iql", "prioritized"),
    ],
    ids=str,
)
def test_population_resumes_exactly_and_each_member_resumes_alone_with_its_buffer(tmp_path, algo, variant):
    # With recurrent Q-networks the checkpoints carry the envs' acting states and the stored states; prioritized,
    # every member's tree and largest priority are in the population's checkpoint, and its own in its single-run
    # checkpoint (the resumed runs' next draws come from those trees).
    config = variant_config(tmp_path, algo, variant, seeds=SEEDS)
    member = assert_resumes_exactly(config, tmp_path)
    held = min(config.algo.buffer_size, 2 * 64)  # its own steps of 2 iterations, from the checkpoint
    assert type(member.buffer) is ReplayBuffer and len(member.buffer) == held
    assert ("agent", "hidden") in member.buffer.storage if variant == "gru" else not member.buffer.hidden
    assert (member.buffer.tree is not None) == (variant == "prioritized")


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
        ("masac+iql", "lr"),
        ("masac+iql", "gamma"),
        ("maddpg+iql", "tau"),
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
        assert torch.equal(batched.algorithm.template.updates, singles[0].algorithm.updates)
    if algo in MIXED:  # so does the IQL group's clock
        assert torch.equal(
            batched.algorithm.template.owner["speaker"].updates, singles[0].algorithm.owner["speaker"].updates
        )
    if option == "lr":  # each member's checkpoint holds its own lr, not the population's Adam's 1
        assert_members_save_their_lr(batched, singles, list(values))


def off_argv(tmp_path, algo="iql") -> list[str]:
    env = "spread" if algo in VALUE_BASED else "navigation"
    return [
        *("--algo", algo, "--env", env, "--num-envs", "8", "--rollout-length", "8", "--total-frames", "128"),
        *("--batch-size", "32", "--updates-per-iteration", "2", "--buffer-size", "200", "--hidden", "8"),
        *("--env-option", "max_steps=4", "--log-dir", str(tmp_path), "--run-name", "run"),
        *("--no-progress", "--no-tensorboard"),
    ]


@pytest.mark.parametrize(("algo", "extra"), [("qmix", []), ("maddpg", []), ("iql", ["--prioritized"])])
def test_train_writes_member_logs_aggregate_and_checkpoints_that_eval_takes(tmp_path, capsys, algo, extra):
    assert main(["train", *off_argv(tmp_path, algo), "--num-seeds", "2", "--save-buffer", *extra]) == 0
    out = capsys.readouterr().out
    assert "seeds 0, 1: 2 runs in one process" in out and "replay buffer" in out and "final return" in out
    kind = "prioritized" if extra else "uniform"
    assert f"replay buffer: 200 env steps for each of 2 runs, {kind}" in out
    assert f"with {algo.upper()} on cpu" in out
    run = tmp_path / "run"
    assert len((run / "aggregate.csv").read_text().splitlines()) == 3
    for seed in (0, 1):
        assert len((run / f"seed_{seed}" / "metrics.csv").read_text().splitlines()) == 3
    assert main(["eval", "--checkpoint", str(run / "checkpoint.pt"), "--member", "1", "--episodes", "2"]) == 0
    assert "agent: mean episode return" in capsys.readouterr().out
    member = Trainer.resume(run / "seed_1" / "checkpoint.pt")  # a single run's, with its own buffer
    assert len(member.buffer) == 128 and member.config.run.seed == 1
    assert (member.buffer.tree is not None) == bool(extra) and member.config.algo.prioritized == bool(extra)


def test_a_recurrent_q_learning_population_trains_from_the_command_line(tmp_path, capsys):
    argv = ["--num-seeds", "2", "--model", "gru", "--chunk-length", "4", "--burn-in", "2", "--buffer-size", "48"]
    assert main(["train", *off_argv(tmp_path, "qmix"), *argv, "--save-buffer"]) == 0
    run = tmp_path / "run"
    assert len((run / "aggregate.csv").read_text().splitlines()) == 3
    assert main(["eval", "--checkpoint", str(run / "checkpoint.pt"), "--member", "1", "--episodes", "2"]) == 0
    assert "agent: mean episode return" in capsys.readouterr().out
    member = Trainer.resume(run / "seed_1" / "checkpoint.pt")
    assert member.config.model.model == "gru" and len(member.buffer) == 48


MIXED_ARGV = ("--env", "speaker_listener", "--group", "speaker.algo=iql")


def test_a_mixed_population_trains_from_the_command_line_and_eval_takes_a_member(tmp_path, capsys):
    argv = [*off_argv(tmp_path, "masac"), *MIXED_ARGV, "--seeds", "0", "1", "2", "--save-buffer"]
    assert main(["train", *argv]) == 0
    out = capsys.readouterr().out
    assert "seeds 0-2: 3 runs in one process" in out and "replay buffer: 200 env steps for each of 3 runs" in out
    assert "with IQL (speaker), MASAC (listener) on cpu, 3 runs x 8 envs" in out and "final return" in out
    run = tmp_path / "run"
    assert len((run / "aggregate.csv").read_text().splitlines()) == 3
    assert main(["eval", "--checkpoint", str(run / "checkpoint.pt"), "--member", "1", "--episodes", "2"]) == 0
    out = capsys.readouterr().out
    assert "speaker: mean episode return" in out and "listener: mean episode return" in out
    member = Trainer.resume(run / "seed_1" / "checkpoint.pt")  # a single mixed run's, with its own buffer
    assert type(member.algorithm) is Mixed and member.config.run.seed == 1 and len(member.buffer) == 128


@pytest.mark.parametrize(
    ("algo", "argv", "message"),
    [
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
        (  # a mixed run's: each group's algorithm's options, and hard copies have no tau
            "masac",
            [*MIXED_ARGV, "--sweep", "alpha_init=0.1,1"],
            "--sweep takes IQL's and MASAC's options lr, gamma, tau, not alpha_init",
        ),
        (
            "masac",
            [*MIXED_ARGV, "--group", "speaker.target_update=hard", "--sweep", "tau=0.01,0.1"],
            "--sweep tau: group(s) ['speaker'] copy their targets (--target-update hard)",
        ),
        (  # as the single mixed run's
            "masac",
            [*MIXED_ARGV, "--group", "speaker.model=gru"],
            "train Q-learning on chunks of steps, which a run mixing algorithms (--group NAME.algo=...) does not draw",
        ),
    ],
)
def test_what_off_policy_populations_do_not_train_is_one_clear_line(tmp_path, algo, argv, message, capsys):
    assert main(["train", *off_argv(tmp_path, algo), "--num-seeds", "2", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


@pytest.mark.parametrize(
    ("algo", "variant"),
    [("qmix", "mlp"), ("masac", "mlp"), ("qmix", "gru"), ("masac", "prioritized"), ("maddpg+iql", "mlp")],
    ids=str,
)
def test_memory_line_counts_a_members_buffer_and_its_target_nets_once(tmp_path, algo, variant):
    batched = Trainer(variant_config(tmp_path, algo, variant, seeds=SEEDS), run_dir=tmp_path / "seeds")
    parts = population.member_nbytes(batched.config, batched.env, batched.algorithm)
    single = Trainer(variant_config(tmp_path, algo, variant, seed=SEEDS[0]), run_dir=tmp_path / "single")
    # A single run's allocated buffer (with recurrent Q-networks its stored states and is_init; prioritized, its
    # sum tree); its trained nets 4 times (gradients, Adam's moments), its targets once.
    tree = single.buffer.tree.numel() * 8 if variant == "prioritized" else 0
    assert parts["replay buffer"] == sum(t.numel() * t.element_size() for t in single.buffer.storage.values()) + tree
    assert batched.buffer.nbytes == len(SEEDS) * parts["replay buffer"]  # what the population allocated
    expected = 0
    for g, learner in single.algorithm.learners.items():
        trained = {id(p) for net in single.algorithm.trainables[g].nets.values() for p in net.parameters()}
        for module in learner.modules().values():
            for p in module.parameters():
                expected += (4 if id(p) in trained else 1) * p.numel() * p.element_size()
    assert parts["nets and Adam"] == expected


def test_a_checkpoint_of_another_layout_is_refused_in_one_line(tmp_path, capsys):
    # A population checkpoint missing an entry its algorithm reads (as one written before Q-learning's clock moved
    # under "single"): a ValueError naming the entry, and the command line says it without a traceback.
    trainer = Trainer(off_config(tmp_path, "iql", seeds=SEEDS), run_dir=tmp_path / "run")
    trainer.train_iteration()
    path = trainer.save()
    state = torch.load(path, weights_only=True)
    del state["algorithm"]["single"]
    torch.save(state, path)
    with pytest.raises(ValueError, match="has no entry 'single': it was written by another version of vecmarl"):
        Trainer.resume(path)
    assert main(["train", "--resume", str(path), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "has no entry 'single'" in err and "Traceback" not in err


# The compiled population step (`--compile`): per case a population and what its step must do as the eager one.
# MASAC prioritized: the slots found in each member's tree, SAC's temperatures (0-d parameters), the priorities
# set after the targets; QMIX prioritized: n-step returns, the mixers; MADDPG: a swept lr (each member's Adam
# step scaled by its own) and tau (its own Polyak factor); MASAC+IQL: a mixed run, IQL's hard copies and clock,
# with a swept gamma read by the vmapped loss; QMIX with GRUs: each member's chunks, unrolled.
COMPILED = {
    "masac-prioritized": ("masac", "prioritized", None),
    "qmix-prioritized": ("qmix", "prioritized", None),
    "maddpg-sweep": ("maddpg", "mlp", ("lr=0.001,0.03", "tau=0.01,0.3")),
    "masac+iql-gamma": ("masac+iql", "mlp", ("gamma=0.8,0.99",)),
    "qmix-gru": ("qmix", "gru", None),
}


def compiled_case(tmp_path, case: str, compile: bool, **run):
    algo, variant, sweep = COMPILED[case]
    members = {"seeds": (3,), "sweep": sweep} if sweep else {"seeds": SEEDS}
    config = (gru_off_config if variant == "gru" else off_config)(tmp_path, algo, compile=compile, **members, **run)
    return prioritized(config, **PRIORITIZED[algo]) if variant == "prioritized" else config


@pytest.mark.parametrize("case", list(COMPILED))
def test_the_compiled_population_step_takes_the_eager_steps(tmp_path, monkeypatch, case):
    """`--compile`: each optimiser step of every member is `UpdateStep`'s one graph over the stacked nets (the
    draw, gradients of the summed losses by `torch.func.grad`, each member's norms and clipping, Adam, targets,
    priorities), run here as it is compiled but without compiling; its members take the eager population's
    steps: rows, nets, Adam moments, clocks, trees."""
    uncompiled(monkeypatch)
    trainers = [
        Trainer(compiled_case(tmp_path, case, compile), run_dir=tmp_path / f"{compile}") for compile in (False, True)
    ]
    assert trainers[0].algorithm.compiled_step is None and trainers[1].algorithm.compiled_step.fused
    rows = [[trainer.train_iteration() for _ in range(3)] for trainer in trainers]
    assert_populations_match(rows[1], rows[0])
    eager, fused = (trainer.algorithm for trainer in trainers)
    for k in range(eager.count):
        want, got = tensors(eager.member_state_dict(k)), tensors(fused.member_state_dict(k))
        assert got.keys() == want.keys()
        for key, value in want.items():
            torch.testing.assert_close(got[key], value, rtol=1e-4, atol=1e-5, msg=key)
    if trainers[0].buffer.tree is not None:
        torch.testing.assert_close(trainers[1].buffer.tree, trainers[0].buffer.tree, rtol=1e-4, atol=1e-6)
        torch.testing.assert_close(trainers[1].buffer.max_priority, trainers[0].buffer.max_priority)


def test_a_compiled_population_resumes_exactly_and_each_member_resumes_alone(tmp_path, monkeypatch):
    uncompiled(monkeypatch)
    assert_resumes_exactly(compiled_case(tmp_path, "masac-prioritized", True), tmp_path)


@pytest.mark.usefixtures("without_inductor", "eager_rollout")
@pytest.mark.slow
@pytest.mark.filterwarnings("error::RuntimeWarning")  # the compile fallback's warning fails the test
def test_a_compiled_population_step_is_one_graph_takes_the_eager_steps_and_reads_nothing_back(tmp_path):
    # MADDPG, prioritized, with a swept lr and tau: one graph for every member's step, compiled once (the swept
    # values and beta are tensors), with no graph break; the steps of the eager population. The rollout step is
    # left uncompiled (tested apart): compiling it too would double this test's time.
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    rows = {}
    sweep = ("lr=0.001,0.03", "tau=0.01,0.3")
    for compile in (False, True):
        config = prioritized(off_config(tmp_path, "maddpg", compile=compile, seeds=(3,), sweep=sweep))
        trainer = Trainer(config, run_dir=tmp_path / f"{compile}")
        rows[compile] = [trainer.train_iteration() for _ in range(2)]
    assert_populations_match(rows[True], rows[False])
    assert dict(counters["graph_break"]) == {}
    assert counters["stats"]["unique_graphs"] == 1
    with envs.forbid_host_sync("cpu"):
        trainer.algorithm.begin_iteration(2 * 64, config.run.total_frames)
        trainer.buffer.extend(trainer.collector.collect())
        trainer.algorithm.update(trainer.buffer, trainer.timer)
    assert counters["stats"]["unique_graphs"] == 1

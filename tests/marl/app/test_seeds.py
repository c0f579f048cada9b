"""Several seeds in one process (`marl train --seeds`): each member is the single run with its seed."""

import collections
import dataclasses
import math
import re

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import envs
from marl import algorithms
from marl.algorithms import ppo_seeds
from marl.algorithms.ppo import PPOConfig
from marl.app import seeds as population
from marl.app.checkpoint import load_checkpoint
from marl.app.cli import build_parser, config_from_args, main
from marl.app.logger import RunLogger, read_rows
from marl.app.trainer import Trainer
from marl.config import EnvSettings, ModelConfig, TrainConfig
from marl.core import rollout
from marl.optim import update_step
from tests.marl.algorithms.test_offpolicy import small_config as off_policy_config
from tests.marl.app.test_training import small_config

SEEDS = (3, 8)


def tiny_config(tmp_path, algo="mappo", share_params=True) -> TrainConfig:
    return dataclasses.replace(
        small_config(tmp_path),
        env=EnvSettings(env="navigation", num_envs=16, env_options={"max_steps": 6}),
        algo=PPOConfig(algo=algo, minibatch_size=64, epochs=2),
        model=ModelConfig(hidden=(16, 16), share_params=share_params),
    )


def with_run(config: TrainConfig, **run) -> TrainConfig:
    run.setdefault("rollout_length", 8)
    run.setdefault("total_frames", 16 * 8 * 2)
    return dataclasses.replace(config, run=dataclasses.replace(config.run, **run))


def assert_rows_match(member: dict, single: dict) -> None:
    assert member.keys() == {k for k in single if "/" in k or k in ("episodes", "episode_length")}
    for key, value in member.items():
        if math.isnan(single[key]):
            assert math.isnan(value), key
        else:
            assert value == pytest.approx(single[key], rel=1e-4, abs=1e-5), key


@pytest.mark.parametrize(("algo", "share_params", "chunks"), [("mappo", True, False), ("ippo", False, True)])
def test_each_member_trains_as_the_single_run_with_its_seed(tmp_path, monkeypatch, algo, share_params, chunks):
    if chunks:  # the critic passes and each minibatch step in uneven chunks of rows (sizes 22, 22, 20)
        monkeypatch.setattr(ppo_seeds, "CHUNK_ROWS", 40)
        monkeypatch.setattr(ppo_seeds, "UPDATE_CHUNK_ROWS", 48)
    config = tiny_config(tmp_path, algo, share_params)
    if chunks:  # and a learning rate annealed over the run
        config = dataclasses.replace(config, algo=dataclasses.replace(config.algo, lr_schedule="linear"))
    batched = Trainer(with_run(config, seeds=SEEDS), run_dir=tmp_path / "seeds")
    batched.algorithm.chunked = chunks  # without: the rows whole, as on a GPU
    singles = [Trainer(with_run(config, seed=s), run_dir=tmp_path / f"seed{s}") for s in SEEDS]
    for _ in range(2):
        row = batched.train_iteration()
        for member, single in zip(row["members"], singles):
            assert_rows_match(member, single.train_iteration())
    assert all(math.isfinite(member["agent/episode_return"]) for member in row["members"])
    # the runs differ from each other (members are not copies of one run)
    assert row["members"][0]["agent/loss"] != row["members"][1]["agent/loss"]


def gru_config(tmp_path, nets: str, burn_in: int) -> TrainConfig:
    """`tiny_config` with recurrent nets: chunks of 4 of an 8-step rollout, with `burn_in` steps before."""
    config = tiny_config(tmp_path, "mappo")
    algo = dataclasses.replace(config.algo, chunk_length=4, burn_in=burn_in, minibatch_size=32)
    model = dataclasses.replace(config.model, model="gru", gru_hidden=8, gru_nets=nets)
    return dataclasses.replace(config, algo=algo, model=model)


@pytest.mark.parametrize(("nets", "burn_in", "chunks"), [("policy", 0, False), ("both", 2, True)])
def test_each_recurrent_member_trains_as_the_single_run_with_its_seed(tmp_path, monkeypatch, nets, burn_in, chunks):
    if chunks:  # each minibatch step in uneven chunks of a member's chunks of steps
        monkeypatch.setattr(ppo_seeds, "UPDATE_CHUNK_ROWS", 6)
    config = gru_config(tmp_path, nets, burn_in)
    batched = Trainer(with_run(config, seeds=SEEDS), run_dir=tmp_path / "seeds")
    batched.algorithm.chunked = chunks
    singles = [Trainer(with_run(config, seed=s), run_dir=tmp_path / f"seed{s}") for s in SEEDS]
    for _ in range(2):
        row = batched.train_iteration()
        for member, single in zip(row["members"], singles):
            assert_rows_match(member, single.train_iteration())
    assert row["members"][0]["agent/loss"] != row["members"][1]["agent/loss"]


class OpCounter(TorchDispatchMode):
    """Counts the aten ops dispatched, by name (views included: on a GPU each costs host time too)."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: collections.Counter = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.counts[str(func.overloadpacket)] += 1
        return func(*args, **(kwargs or {}))


def iteration_ops(config: TrainConfig, seeds: tuple[int, ...], run_dir) -> collections.Counter:
    """The ops of one training iteration (the second: the first builds lazy state) of a population, its
    rows whole as on a GPU."""
    trainer = Trainer(with_run(config, seeds=seeds, total_frames=16 * 8 * 3), run_dir=run_dir)
    trainer.algorithm.chunked = False
    trainer.train_iteration()
    with OpCounter() as counter:
        trainer.train_iteration()
    return counter.counts


@pytest.mark.parametrize("gru", [False, True], ids=["mlp", "gru"])
def test_an_iteration_launches_as_many_ops_for_any_number_of_members(tmp_path, gru):
    """On a GPU at `marl train`'s sizes wall time is host time, per op launched: S seeds take about one
    seed's time only if an iteration's ops do not grow with S. Two and four members launch the same ops,
    but for the draws from each member's own `torch.Generator` (a single run's stream, which one call cannot
    draw for several): per rollout one noise draw per group, per epoch one minibatch order (of chunks, with
    recurrent nets)."""
    config = gru_config(tmp_path, "both", 2) if gru else tiny_config(tmp_path)
    two = iteration_ops(config, (3, 8), tmp_path / "two")
    four = iteration_ops(config, (3, 8, 5, 1), tmp_path / "four")
    groups, epochs = 1, config.algo.epochs  # navigation: one group
    assert four - two == collections.Counter({"aten.randn": 2 * groups, "aten.randperm": 2 * epochs})
    assert not two - four


@pytest.mark.slow
def test_a_prioritized_off_policy_iteration_launches_as_many_ops_for_any_number_of_members(tmp_path):
    """The same for an off-policy population with prioritized replay (MASAC on navigation): every member's
    finds, importance weights and priority updates, in its own sum tree, are the same ops for two members
    and four. Beyond them only the draws from each member's generator: per rollout its exploration noise
    (one `randn` per group), per update its sampling noise (one `randn` per continuous group) and its
    stratified fractions (one `rand`)."""
    config = off_policy_config(tmp_path, "masac", prioritized=True, buffer_size=64)
    two = iteration_ops(config, (3, 8), tmp_path / "two")
    four = iteration_ops(config, (3, 8, 5, 1), tmp_path / "four")
    groups = 1
    assert four - two == collections.Counter({"aten.randn": 2 * (groups + groups), "aten.rand": 2})
    assert not two - four


def uncompiled(monkeypatch) -> None:
    """`--compile`'s rollout and update steps taken as the compiled ones are, but run eagerly: a compile per
    case would take a minute on a CPU (one test compiles them)."""

    def identity(fn, *args, **kwargs):
        return fn

    monkeypatch.setattr(update_step, "maybe_compile", identity)
    monkeypatch.setattr(rollout, "maybe_compile", identity)


def assert_populations_match(rows: list[dict], other: list[dict]) -> None:
    """Two populations' rows of the same iterations agree in every member's terms, to float rounding."""
    for row, other_row in zip(rows, other, strict=True):
        for member, want in zip(row["members"], other_row["members"], strict=True):
            assert member.keys() == want.keys()
            for key, value in want.items():
                if isinstance(value, float) and not key.endswith("_s"):
                    assert member[key] == pytest.approx(value, rel=1e-4, abs=1e-5, nan_ok=True), key


@pytest.mark.parametrize(
    ("sweep", "gru"),
    [(("lr=0.001,0.03", "clip_eps=0.1,0.3", "gamma=0.9,0.99"), False), (None, True)],
    ids=["sweep", "gru"],
)
def test_the_compiled_population_step_takes_the_eager_steps(tmp_path, monkeypatch, sweep, gru):
    """`--compile`: each minibatch step of every member is `UpdateStep`'s one graph over the stacked nets
    (gradients of the summed losses by `torch.func.grad`, each member's norms and clipping, Adam scaled by
    each member's swept lr, with the linear lr schedule, the rows in uneven chunks in the graph as the eager
    step's); its members take the eager population's steps."""
    uncompiled(monkeypatch)
    monkeypatch.setattr(ppo_seeds, "UPDATE_CHUNK_ROWS", 6 if gru else 100)
    config = gru_config(tmp_path, "both", 2) if gru else tiny_config(tmp_path)
    config = dataclasses.replace(config, algo=dataclasses.replace(config.algo, lr_schedule="linear"))
    run = {"seeds": (3,), "sweep": sweep} if sweep else {"seeds": SEEDS}
    trainers = [
        Trainer(with_run(config, compile=compile, total_frames=16 * 8 * 3, **run), run_dir=tmp_path / f"{compile}")
        for compile in (False, True)
    ]
    assert trainers[0].algorithm.compiled_step is None and trainers[1].algorithm.compiled_step.fused
    assert trainers[1].algorithm.compiled_step.split is not None
    rows = [[trainer.train_iteration() for _ in range(3)] for trainer in trainers]
    assert_populations_match(rows[1], rows[0])
    for k in range(trainers[0].algorithm.count):
        want, got = (tensors(trainer.algorithm.member_state_dict(k)) for trainer in trainers)
        assert got.keys() == want.keys()
        for key, value in want.items():
            torch.testing.assert_close(got[key], value, rtol=1e-4, atol=1e-5, msg=key)


def tensors(state, prefix: str = "") -> dict[str, torch.Tensor]:
    """Every tensor of a (nested) state dict by its path."""
    if isinstance(state, torch.Tensor):
        return {prefix: state}
    items = state.items() if isinstance(state, dict) else enumerate(state) if isinstance(state, list) else ()
    return {k: v for key, value in items for k, v in tensors(value, f"{prefix}.{key}").items()}


def test_a_compiled_population_resumes_exactly(tmp_path, monkeypatch):
    # The compiled step's Adam state is the optimisers' own: checkpoints are as the eager population's.
    uncompiled(monkeypatch)
    assert_resumes_exactly(
        with_run(tiny_config(tmp_path), seeds=SEEDS, total_frames=16 * 8 * 3, compile=True), tmp_path
    )


@pytest.mark.usefixtures("without_inductor")
@pytest.mark.slow
def test_a_compiled_population_collects_and_updates_as_the_eager_one_in_one_graph_each(tmp_path):
    """`--seeds` with `--compile`: every member's acting and envs are one compiled rollout graph, and each
    minibatch step of every member one update graph (no graph break, no recompile), which fill the buffer
    and take the steps of the eager population, the update reading nothing back from the device."""
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    buffers, terms = [], []
    for compile in (False, True):
        config = with_run(tiny_config(tmp_path), seeds=SEEDS, compile=compile)
        trainer = Trainer(config, run_dir=tmp_path / f"compile-{compile}")
        buffers.append([trainer.collector.collect().clone() for _ in range(2)])  # an auto-reset at step 6
        batch = trainer.collector.buffer
        terms.append(trainer.algorithm.update(batch, trainer.timer))
        with envs.forbid_host_sync("cpu"):
            trainer.algorithm.update(batch, trainer.timer)
    assert dict(torch._dynamo.utils.counters["graph_break"]) == {}
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 2
    for eager, compiled in zip(*buffers, strict=True):
        for key, value in eager.items(include_nested=True, leaves_only=True):
            torch.testing.assert_close(compiled[key], value, rtol=1e-5, atol=1e-5, msg=str(key))
    for g, eager in terms[0].items():
        for name, value in eager.items():
            torch.testing.assert_close(terms[1][g][name], value, rtol=1e-4, atol=1e-5, msg=name)


def test_member_envs_draw_as_single_envs_with_their_seeds():
    num_envs = 4
    batched = envs.make("tag", num_envs=len(SEEDS) * num_envs, seed=SEEDS, max_steps=3)
    singles = [envs.make("tag", num_envs=num_envs, seed=s, max_steps=3) for s in SEEDS]
    generator = torch.Generator().manual_seed(0)
    for _ in range(7):  # two auto-resets
        action = batched.sample_actions(generator)
        _, obs = batched.step(action)
        parts = [
            e.step({g: a[k * num_envs : (k + 1) * num_envs] for g, a in action.items()})[1]
            for k, e in enumerate(singles)
        ]
        for g in batched.groups:
            assert torch.equal(obs[g, "observation"], torch.cat([p[g, "observation"] for p in parts]))


@pytest.mark.parametrize(
    ("sweep", "gru"),
    [(None, False), (("gamma=0.9,0.99", "lmbda=0.8,0.95"), False), (None, True)],
    ids=["seeds", "gamma-lmbda-sweep", "gru"],
)
def test_population_collects_and_learns_without_host_sync(tmp_path, sweep, gru):
    # A swept gamma or lmbda reaches GAE as a per-column tensor, read without a sync.
    config = gru_config(tmp_path, "both", 2) if gru else tiny_config(tmp_path)
    trainer = Trainer(with_run(config, seeds=SEEDS, **({"sweep": sweep} if sweep else {})))
    with envs.forbid_host_sync():
        batch = trainer.collector.collect()
        trainer.algorithm.update(batch, trainer.timer)


@pytest.mark.parametrize("gru", [False, True], ids=["mlp", "gru"])
def test_population_resumes_exactly_and_each_member_resumes_alone(tmp_path, gru):
    # With recurrent nets the checkpoints carry the policies' and the critics' states per env.
    config = gru_config(tmp_path, "both", 2) if gru else tiny_config(tmp_path)
    member = assert_resumes_exactly(with_run(config, seeds=SEEDS, total_frames=16 * 8 * 3), tmp_path)
    assert member.config.run.seed == SEEDS[1]


def assert_resumes_exactly(config: TrainConfig, tmp_path) -> Trainer:
    """Train a population 2 iterations, checkpointing after the first: resumed, it repeats the second
    exactly, and a member's own checkpoint, an ordinary single-seed run's, continues that member; returns
    that member's trainer."""
    straight = Trainer(config, run_dir=tmp_path / "pop")
    straight.train_iteration()
    straight.save()
    expected = straight.train_iteration()["members"]
    resumed = Trainer.resume(tmp_path / "pop" / "checkpoint.pt")
    for a, b in zip(resumed.train_iteration()["members"], expected):
        assert a.keys() == b.keys() and all(a[k] == b[k] or math.isnan(a[k]) and math.isnan(b[k]) for k in a), a
    member = Trainer.resume(tmp_path / "pop" / f"seed_{SEEDS[1]}" / "checkpoint.pt")
    assert member.seeds == (SEEDS[1],)
    assert_rows_match(expected[1], member.train_iteration())
    return member


REINFORCE_SEEDS = "tests.marl.algorithms.reinforce_seeds"  # the README's population of a user's algorithm


def reinforce_config(tmp_path, env: str) -> TrainConfig:
    """`tiny_config` with the user's REINFORCE (`tests/marl/algorithms/reinforce.py`) and its population."""
    from tests.marl.algorithms import reinforce_seeds  # noqa: F401  (registers the population)
    from tests.marl.algorithms.reinforce import ReinforceConfig

    config = tiny_config(tmp_path)
    settings = EnvSettings(env=env, num_envs=16, env_options={"max_steps": 6}, imports=(REINFORCE_SEEDS,))
    return dataclasses.replace(config, env=settings, algo=ReinforceConfig(lr=1e-2))


@pytest.mark.parametrize("env", ["navigation", "speaker_listener"])  # one group; two, one of them discrete
def test_each_member_of_a_users_algorithm_trains_as_its_single_run(tmp_path, env):
    """A user's population (`register_seeded`) is the independent runs: member k's metrics, parameters,
    Adam moments and baseline are those of the single run with its seed, and the members differ."""
    config = reinforce_config(tmp_path, env)
    batched = Trainer(with_run(config, seeds=SEEDS), run_dir=tmp_path / "seeds")
    singles = [Trainer(with_run(config, seed=s), run_dir=tmp_path / f"seed{s}") for s in SEEDS]
    for _ in range(2):
        row = batched.train_iteration()
        for member, single in zip(row["members"], singles):
            assert_rows_match(member, single.train_iteration())
    for k, single in enumerate(singles):
        member, alone = tensors(batched.algorithm.member_state_dict(k)), tensors(single.algorithm.state_dict())
        assert member.keys() == alone.keys()
        for name, tensor in alone.items():
            torch.testing.assert_close(member[name], tensor, rtol=1e-4, atol=1e-6, msg=name)
    first, second = (tensors(batched.algorithm.member_state_dict(k)) for k in range(2))
    assert any(not torch.equal(first[name], second[name]) for name in first if ".policy." in name)


def test_a_users_population_trains_resumes_and_evaluates_from_the_command_line(tmp_path, capsys):
    argv = ["train", "--imports", REINFORCE_SEEDS, "--algo", "reinforce", "--seeds", "3", "5"]
    argv += ["--num-envs", "8", "--rollout-length", "8", "--hidden", "8", "--total-frames", "128"]
    argv += ["--env-option", "max_steps=4", "--log-dir", str(tmp_path), "--run-name", "run", "--no-progress"]
    assert main([*argv, "--no-tensorboard"]) == 0
    assert "with REINFORCE on cpu, 2 runs x 8 envs (seeds 3, 5)" in capsys.readouterr().out
    run = tmp_path / "run"
    assert len((run / population.AGGREGATE).read_text().splitlines()) == 3
    assert main(["eval", "--checkpoint", str(run / "seed_5" / "checkpoint.pt"), "--episodes", "2"]) == 0
    assert main(["train", "--resume", str(run / "checkpoint.pt"), "--total-frames", "192"]) == 0
    assert len((run / "seed_3" / "metrics.csv").read_text().splitlines()) == 4


def test_a_sweep_of_a_population_without_sweepable_options_is_refused_saying_so(tmp_path):
    config = with_run(reinforce_config(tmp_path, "navigation"), seeds=SEEDS, sweep=("lr=0.1,0.01",))
    says = "--algo reinforce takes no --sweep (its population, SeededReinforce, lists no SWEEPABLE options)"
    with pytest.raises(ValueError, match=re.escape(says)):
        Trainer(config, run_dir=tmp_path / "sweep")


def test_a_users_population_resumes_exactly_and_each_member_resumes_alone(tmp_path):
    config = with_run(reinforce_config(tmp_path, "navigation"), seeds=SEEDS, total_frames=16 * 8 * 3)
    assert assert_resumes_exactly(config, tmp_path).config.run.seed == SEEDS[1]


def test_train_writes_member_logs_aggregate_and_summary(tmp_path, capsys):
    assert main(["train", *tiny_argv(tmp_path), "--num-seeds", "3"]) == 0
    out = capsys.readouterr().out
    run = tmp_path / "run"
    assert "seeds 0-2: 3 runs in one process" in out and "final return" in out and "95% CI" in out
    aggregate = (run / population.AGGREGATE).read_text().splitlines()
    assert len(aggregate) == 3 and "agent/episode_return_ci_low" in aggregate[0]
    for seed in range(3):
        assert len((run / f"seed_{seed}" / "metrics.csv").read_text().splitlines()) == 3
    assert main(["eval", "--checkpoint", str(run / "checkpoint.pt"), "--member", "1", "--episodes", "2"]) == 0
    assert "agent: mean episode return" in capsys.readouterr().out
    assert main(["eval", "--checkpoint", str(run / "checkpoint.pt"), "--episodes", "2"]) == 2
    assert "pass --member" in (err := capsys.readouterr().err) and "--member all" in err
    assert main(["eval", "--checkpoint", str(run / "checkpoint.pt"), "--member", "all", "--episodes", "2"]) == 0
    out = capsys.readouterr().out
    assert "seed_2: mean episode return agent" in out and "agent: mean over 3 runs" in out
    assert main(["eval", "--checkpoint", str(run / "checkpoint.pt"), "--member", "7"]) == 2  # no seed 7: said so
    assert "holds seeds 0-2 (seed_0, seed_1, seed_2): --member '7' is none of them: pass" in capsys.readouterr().err
    assert main(["eval", "--checkpoint", str(run / "checkpoint.pt"), "--member", ""]) == 2
    assert "--member '' is none of them" in capsys.readouterr().err
    assert main(["plot", str(run)]) == 0
    assert (run / "learning_curve.png").stat().st_size > 1000


def test_a_population_keeps_a_member_trained_on_alone_as_its_own_run(tmp_path, capsys):
    # Resuming the population drops the rows its members logged past its checkpoint and overwrites their
    # checkpoints: a member resumed alone past it is first copied out, and both runs train on.
    run = tmp_path / "run"
    assert main(["train", *tiny_argv(tmp_path), "--num-seeds", "2"]) == 0
    assert main(["train", "--resume", str(run / "seed_1" / "checkpoint.pt"), "--total-frames", "256"]) == 0
    trained_alone = (run / "seed_1" / "metrics.csv").read_bytes()
    assert len(trained_alone.decode().splitlines()) == 5  # a header, the population's 2 rows, its own 2
    capsys.readouterr()
    assert main(["train", "--resume", str(run / "checkpoint.pt"), "--total-frames", "192"]) == 0
    copy = tmp_path / "run-seed_1-alone"
    says = f"seed_1 trained on alone to iteration 4, past the population's iteration 2: that run is kept in {copy}"
    assert says in capsys.readouterr().out
    assert (copy / "metrics.csv").read_bytes() == trained_alone
    rows = (run / "seed_1" / "metrics.csv").read_text().splitlines()
    assert rows[:3] == trained_alone.decode().splitlines()[:3] and len(rows) == 4  # the population's 3 rows
    assert len((run / population.AGGREGATE).read_text().splitlines()) == 4
    assert main(["train", "--resume", str(copy / "checkpoint.pt"), "--total-frames", "320"]) == 0
    assert len((copy / "metrics.csv").read_text().splitlines()) == 6
    assert main(["train", "--resume", str(run / "seed_1" / "checkpoint.pt"), "--total-frames", "256"]) == 0
    assert main(["train", "--resume", str(run / "checkpoint.pt"), "--total-frames", "256"]) == 0
    assert f"that run is kept in {tmp_path / 'run-seed_1-alone-2'}" in capsys.readouterr().out


def test_the_summary_says_when_no_episode_ended_rather_than_nan(tmp_path, capsys):
    # max_steps 100 (navigation's own) and 2 iterations of 8 steps: no episode ends in any member.
    argv = [arg for arg in tiny_argv(tmp_path) if arg not in ("--env-option", "max_steps=4")]
    assert main(["train", *argv, "--num-seeds", "2"]) == 0
    out = capsys.readouterr().out
    assert "agent          final return: no episode ended in the 2 iteration(s)" in out and "return nan" not in out


def tiny_argv(tmp_path) -> list[str]:
    return [
        *("--num-envs", "8", "--rollout-length", "8", "--minibatch-size", "32", "--total-frames", "128"),
        *("--env-option", "max_steps=4", "--hidden", "8", "--log-dir", str(tmp_path), "--run-name", "run"),
        *("--no-progress", "--no-tensorboard"),
    ]


@pytest.mark.parametrize(("argv", "said"), [([], "128 frames ("), (["--num-seeds", "2"], "128 frames per run (")])
def test_total_frames_round_up_to_whole_iterations_and_say_so(tmp_path, capsys, argv, said):
    # 8 envs x 8 steps: an iteration is 64 frames, so 100 frames take 2 iterations, 128 frames
    tiny = tiny_argv(tmp_path)
    tiny[tiny.index("--total-frames") + 1] = "100"
    assert main(["train", *tiny, *argv]) == 0
    out = capsys.readouterr().out
    assert f"{said}--total-frames 100 rounded up to whole iterations of 64)" in out
    csv = tmp_path / "run" / (population.AGGREGATE if argv else "metrics.csv")
    assert len(csv.read_text().splitlines()) == 3  # a header and 2 iterations


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--seeds", "1", "2", "1"], "seeds [1, 2, 1] repeat [1]: each seed trains one run, list it once"),
        (["--seeds", "1", "2", "--num-seeds", "3"], "num_seeds=3 but 2 seeds were listed"),
        (["--num-seeds", "0"], "num_seeds must be >= 1"),
        (  # the population's update took the option and ran its members' critics with their policies
            ["--seeds", "1", "2", "--compile", "--overlap-critic"],
            "--overlap-critic: it applies to a single run's update only (its critics' steps on a second thread); a "
            "population steps every member's policies and critics together, in one vmapped step: leave it out",
        ),
        (  # an algorithm registered without a population (register_seeded)
            ["--imports", "tests.marl.algorithms.reward_model", "--algo", "reward_model", "--num-seeds", "2"],
            "so far, not --algo reward_model: run its seeds one after another (marl train --algo reward_model",
        ),
    ],
)
def test_bad_seed_lists_and_algorithms_are_one_clear_line(tmp_path, argv, message, capsys):
    common = tiny_argv(tmp_path) if "--algo" not in argv else ["--log-dir", str(tmp_path), "--no-progress"]
    assert main(["train", *common, *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_a_population_of_mlps_only_refuses_recurrent_nets(monkeypatch):
    monkeypatch.setattr(ppo_seeds.SeededPPO, "recurrent", False)  # as a registered population that trains MLPs
    with pytest.raises(ValueError, match="of --algo mappo train MLP networks so far: leave out --model gru"):
        algorithms.check_seeded("mappo", recurrent=True)
    algorithms.check_seeded("iql", recurrent=True)  # IQL, VDN and QMIX train recurrent Q-networks


def test_seeds_reach_the_config():
    args = build_parser().parse_args(["train", "--seeds", "4", "2", "9"])
    assert config_from_args(args).run.member_seeds() == (4, 2, 9)
    args = build_parser().parse_args(["train", "--seed", "5", "--num-seeds", "3"])
    assert config_from_args(args).run.member_seeds() == (5, 6, 7)


def test_a_list_of_one_seed_trains_the_single_run_with_that_seed(tmp_path):
    config = tiny_config(tmp_path)
    listed = Trainer(with_run(config, seeds=(5,)), run_dir=tmp_path / "listed")
    single = Trainer(with_run(config, seed=5), run_dir=tmp_path / "single")
    for mine, its in zip(listed.algorithm.parameters(), single.algorithm.parameters(), strict=True):
        assert torch.equal(mine, its)  # the nets' init: seed 5's, not seed 0's
    for _ in range(2):
        assert_rows_match(
            {k: v for k, v in listed.train_iteration().items() if "/" in k or k in ("episodes", "episode_length")},
            single.train_iteration(),
        )


def test_a_recurrent_population_trains_from_the_command_line(tmp_path):
    argv = ["--num-seeds", "2", "--model", "gru", "--gru-nets", "both", "--chunk-length", "4", "--burn-in", "2"]
    assert main(["train", *tiny_argv(tmp_path), *argv]) == 0
    assert len((tmp_path / "run" / population.AGGREGATE).read_text().splitlines()) == 3
    checkpoint = str(tmp_path / "run" / "checkpoint.pt")
    assert main(["eval", "--checkpoint", checkpoint, "--member", "1", "--episodes", "2"]) == 0


def test_the_memory_estimate_counts_what_recurrent_nets_add(tmp_path):
    """Per frame the policies' and critics' stored states and is_init; the update's chunks hold their
    burn-in steps too: (burn_in + chunk_length) / chunk_length times the rows."""
    mlp, gru = (
        Trainer(with_run(c, seeds=SEEDS), run_dir=tmp_path / name)
        for name, c in (("mlp", tiny_config(tmp_path)), ("gru", gru_config(tmp_path, "both", 2)))
    )
    parts = [population.member_nbytes(t.config, t.env, t.algorithm) for t in (mlp, gru)]
    frames, n, h = 16 * 8, mlp.env.groups["agent"].n_agents, 8
    critic_state = math.prod(gru.algorithm.template.critic_hidden["agent"].shape[1:])
    added = frames * (4 * n * h + 4 * critic_state + 1)  # policy state, critic state, is_init
    assert parts[1]["rollout"] - parts[0]["rollout"] == added
    assert parts[1]["update"] == int(2 * parts[1]["rollout"] * (2 + 4) / 4)


def test_too_many_seeds_are_refused_saying_how_many_fit(tmp_path):
    trainer = Trainer(with_run(tiny_config(tmp_path), seeds=SEEDS))
    each = sum(population.member_nbytes(trainer.config, trainer.env, trainer.algorithm).values())
    with pytest.raises(MemoryError, match=r"2 runs need .* is free on cpu: at most 1 seed\(s\) fit: pass --seeds 3 "):
        population.check_memory(trainer.config, trainer.env, trainer.device, trainer.algorithm, free=int(1.5 * each))


@pytest.mark.parametrize(
    ("argv", "fit", "said"),
    [
        # 3 seeds x 2 lrs, room for 5 runs: 2 whole seeds, not "--num-seeds 5" (5 seeds x 2 lrs = 10 runs)
        (
            ["--seeds", "4", "7", "9", "--sweep", "lr=1e-4,1e-3"],
            5.5,
            "at most 2 seed(s) (2 swept settings each) fit: "
            "pass --seeds 4 7 and train the others (9) in another process; or pass fewer --num-envs",
        ),
        (
            ["--num-seeds", "2", "--sweep", "lr=1e-4,1e-3", "gamma=0.9,0.99"],
            3.5,
            "at most 3 run(s) fit, fewer than one seed's 4 swept settings: sweep fewer values",
        ),
        (
            ["--num-seeds", "2"],
            0.5,
            "not one run fits: pass fewer --num-envs",
        ),  # not "at most 0 fit; pass --num-seeds 1"
        (
            ["--algo", "vdn", "--env", "spread", "--batch-size", "32", "--num-seeds", "2"],
            1.5,
            "pass --seeds 0 and train the others (1) in another process; or pass a smaller --buffer-size, fewer --num-envs",
        ),  # the replay buffer is most of a member
    ],
)
def test_the_memory_refusal_says_what_fits(tmp_path, capsys, monkeypatch, argv, fit, said):
    """What the refusal advises, when `fit` members' worth of memory is free, trains the runs asked for."""
    member, parts = {}, population.member_nbytes

    def measured(config, env, algorithm):
        member["each"] = sum(parts(config, env, algorithm).values())
        return parts(config, env, algorithm)

    monkeypatch.setattr(population, "member_nbytes", measured)
    monkeypatch.setattr(population, "free_bytes", lambda device: int(fit * member["each"]))
    tiny = tiny_argv(tmp_path)
    if "vdn" in argv:  # no minibatches off-policy
        del tiny[tiny.index("--minibatch-size") : tiny.index("--minibatch-size") + 2]
    assert main(["train", *tiny, *argv]) == 2
    assert said in capsys.readouterr().err


def test_bootstrap_interval_brackets_the_mean_and_skips_nan():
    mean, std, low, high = population.bootstrap_ci([1.0, 2.0, 3.0, 4.0, math.nan])
    assert mean == 2.5 and std == pytest.approx(1.2909944) and 1.0 <= low < 2.5 < high <= 4.0
    assert population.bootstrap_ci([2.0, 2.0]) == (2.0, 0.0, 2.0, 2.0)
    assert all(math.isnan(v) for v in population.bootstrap_ci([math.nan]))


def test_each_member_of_a_sweep_trains_as_the_single_run_with_its_seed_and_values(tmp_path):
    config = tiny_config(tmp_path)
    population = with_run(config, seeds=(3,), sweep=("lr=0.001,0.01", "entropy_coef=0,0.05", "clip_eps=0.1,0.3"))
    batched = Trainer(population, run_dir=tmp_path / "sweep")
    assert len(batched.members) == 8 and batched.members[5].name == "seed_3-lr_0.01-entropy_coef_0-clip_eps_0.3"
    for k in (0, 5, 6):  # a few members: lr, entropy and clip each differ between them
        values = dict(batched.members[k].values)
        single = dataclasses.replace(with_run(config, seed=3), algo=dataclasses.replace(config.algo, **values))
        batched_k = Trainer(population, run_dir=tmp_path / f"sweep{k}") if k else batched
        single_trainer = Trainer(single, run_dir=tmp_path / f"single{k}")
        for _ in range(2):
            assert_rows_match(batched_k.train_iteration()["members"][k], single_trainer.train_iteration())


def optimizer_param_groups(state, prefix: str = "") -> dict[str, list[dict]]:
    """Every optimiser's `param_groups` in a (nested) algorithm state dict, by its path."""
    if not isinstance(state, dict):
        return {}
    if "param_groups" in state:
        return {prefix: state["param_groups"]}
    return {k: v for key, value in state.items() for k, v in optimizer_param_groups(value, f"{prefix}.{key}").items()}


def assert_members_save_their_lr(batched: Trainer, singles: list[Trainer], lrs: list[float]) -> None:
    """`batched`, a population with a swept lr, and its members' `singles` have trained as many iterations:
    each member's checkpoint holds in its optimisers' param groups its single run's, lr included (`lrs`)."""
    batched.save()
    for member, single, lr in zip(batched.members, singles, lrs, strict=True):
        checkpoint = population.member_dir(batched.run_dir, member) / "checkpoint.pt"
        saved = optimizer_param_groups(load_checkpoint(checkpoint)["algorithm"])
        assert saved and saved == optimizer_param_groups(single.algorithm.state_dict()), member.name
        assert {group["lr"] for groups in saved.values() for group in groups} == {lr}, member.name


@pytest.mark.parametrize("lr_schedule", ["constant", "linear"])
def test_a_swept_members_checkpoint_holds_its_own_lr_as_its_single_run(tmp_path, lr_schedule):
    # Held the population's Adam's lr, 1 (each member's step is scaled by its own lr): a member's checkpoint
    # resumed alone (`marl train --resume RUN/seed_3-lr_0.001/checkpoint.pt`) trained with lr 1.
    config = tiny_config(tmp_path)
    config = dataclasses.replace(config, algo=dataclasses.replace(config.algo, lr_schedule=lr_schedule))
    batched = Trainer(with_run(config, seeds=(3,), sweep=("lr=0.001,0.01",)), run_dir=tmp_path / "sweep")
    singles = []
    for k, member in enumerate(batched.members):
        algo = dataclasses.replace(config.algo, **dict(member.values))
        singles.append(Trainer(dataclasses.replace(with_run(config, seed=3), algo=algo), run_dir=tmp_path / f"s{k}"))
    for trainer in (batched, *singles):
        for _ in range(2):
            trainer.train_iteration()
    factor = 0.5 if lr_schedule == "linear" else 1.0  # the second iteration starts half-way through the run
    assert_members_save_their_lr(batched, singles, [0.001 * factor, 0.01 * factor])


def test_members_of_a_gamma_and_lambda_sweep_train_as_single_runs_with_their_discounts(tmp_path):
    """GAE reads each member's own gamma and lmbda: member `seed_3-gamma_0.9-lmbda_0.95` trains as `marl train
    --seed 3 --gamma 0.9 --lmbda 0.95`."""
    config = tiny_config(tmp_path)
    population = with_run(config, seeds=(3,), sweep=("gamma=0.9,0.99", "lmbda=0.8,0.95"))
    batched = Trainer(population, run_dir=tmp_path / "sweep")
    checked = (1, 2)  # gamma 0.9 with lmbda 0.95; gamma 0.99 with lmbda 0.8
    assert [batched.members[k].name for k in checked] == ["seed_3-gamma_0.9-lmbda_0.95", "seed_3-gamma_0.99-lmbda_0.8"]
    singles = []
    for k in checked:
        algo = dataclasses.replace(config.algo, **dict(batched.members[k].values))
        singles.append(Trainer(dataclasses.replace(with_run(config, seed=3), algo=algo), run_dir=tmp_path / f"s{k}"))
    for _ in range(2):
        members = batched.train_iteration()["members"]
        for k, single in zip(checked, singles):
            assert_rows_match(members[k], single.train_iteration())


def test_a_sweep_summary_ranks_the_values_and_bad_sweeps_are_refused(tmp_path, capsys):
    argv = [*tiny_argv(tmp_path), "--num-seeds", "2", "--sweep", "lr=0.0001,0.03"]
    assert main(["train", *argv]) == 0
    out = capsys.readouterr().out
    assert "4 runs x 8 envs (seeds 0, 1 x lr 0.0001, 0.03)" in out and "#2 lr=" in out
    assert (tmp_path / "run" / "seed_1-lr_0.03" / "checkpoint.pt").exists()
    checkpoint = str(tmp_path / "run" / "checkpoint.pt")
    assert main(["eval", "--checkpoint", checkpoint, "--member", "seed_1-lr_0.03", "--episodes", "2"]) == 0
    capsys.readouterr()
    assert main(["eval", "--checkpoint", checkpoint, "--member", "1", "--episodes", "2"]) == 2  # two members
    said = "seed 1 of {} trained 2 swept settings: pass --member with one's name (seed_1-lr_0.0001, seed_1-lr_0.03)"
    assert said.format(checkpoint) in capsys.readouterr().err
    assert main(["train", *tiny_argv(tmp_path / "b"), "--sweep", "max_grad_norm=0.5,1"]) == 2
    message = "--sweep takes PPO's options lr, entropy_coef, clip_eps, value_coef, gamma, lmbda, not max_grad_norm"
    assert message in capsys.readouterr().err
    assert main(["train", *tiny_argv(tmp_path / "b"), "--sweep", "lr=1e-3,x"]) == 2
    assert "--sweep takes OPTION=V1,V2,..." in capsys.readouterr().err
    # distinct values whose folder names (6 significant digits) agree would write one member's logs over the other's
    assert main(["train", *tiny_argv(tmp_path / "c"), "--sweep", "lr=1e-3,1.0000001e-3"]) == 2
    assert "(0.001, 0.001) would share a member folder" in capsys.readouterr().err
    assert not (tmp_path / "c").exists()


def test_an_option_given_beside_its_sweep_is_refused_and_dropped_from_a_saved_run(tmp_path, capsys):
    # the swept values replace the run's own: `--lr 0.01` beside `--sweep lr=...` trained no member with 0.01
    argv = [*tiny_argv(tmp_path), "--num-seeds", "2", "--sweep", "lr=1e-3,3e-3", "gamma=0.9,0.95", "--lr", "0.01"]
    assert main(["train", *argv, "--clip-eps", "0.1"]) == 2  # clip_eps, not swept, is the run's for every member
    said = "--lr 0.01: --sweep lr=1e-3,3e-3 gamma=0.9,0.95 gives each run its own value, so it would have no effect"
    assert said in capsys.readouterr().err and not (tmp_path / "run").exists()
    # a run an earlier version saved with both: its checkpoint loads, at the value it trained with (none)
    swept = with_run(tiny_config(tmp_path), num_seeds=2, sweep=("lr=1e-3,3e-3",)).to_dict()
    saved = {**swept, "algo": {**swept["algo"], "lr": 0.01}}
    assert TrainConfig.from_dict(saved).algo.lr == PPOConfig().lr


def test_an_adapter_env_trains_its_members_on_the_first_seeds_stream(tmp_path, capsys):
    pytest.importorskip("vmas")
    config = dataclasses.replace(
        tiny_config(tmp_path), env=EnvSettings(env="vmas/navigation", num_envs=4, env_options={"max_steps": 6})
    )
    trainer = Trainer(with_run(config, seeds=SEEDS, rollout_length=16))
    assert (
        trainer.env.num_envs == 8 and "one random stream (seeded 3) serves every seed's envs" in capsys.readouterr().out
    )
    members = trainer.train_iteration()["members"]
    assert members[0]["agent/loss"] != members[1]["agent/loss"]


def test_eval_of_every_member_of_a_sweep_gives_each_settings_mean_over_its_seeds(tmp_path, capsys):
    """`marl eval --member all` on a sweep: a mean and CI per setting over its seeds (as the training summary
    ranks them), not one mean that pools the settings."""
    assert main(["train", *tiny_argv(tmp_path), "--num-seeds", "2", "--sweep", "lr=0.0001,0.03"]) == 0
    capsys.readouterr()
    checkpoint = str(tmp_path / "run" / "checkpoint.pt")
    assert main(["eval", "--checkpoint", checkpoint, "--member", "all", "--episodes", "3"]) == 0
    lines = capsys.readouterr().out.splitlines()
    each = {}  # member name -> its mean return, as printed
    for line in lines[:4]:
        name, value = line.split(": mean episode return agent ")
        each[name] = float(value.split()[0])
    assert sorted(each) == ["seed_0-lr_0.0001", "seed_0-lr_0.03", "seed_1-lr_0.0001", "seed_1-lr_0.03"]
    for lr, line in zip(("0.0001", "0.03"), lines[4:], strict=True):
        head, mean = line.split(" (95% CI ")[0].rsplit(" ", 1)
        assert head == f"agent lr={lr}: mean over 2 runs", line
        assert float(mean) == pytest.approx((each[f"seed_0-lr_{lr}"] + each[f"seed_1-lr_{lr}"]) / 2, abs=1e-4)


def test_eval_of_every_member_gives_no_interval_for_a_setting_of_one_seed(tmp_path, capsys):
    # One seed per setting: a "mean over 1 runs" with a 95% CI of zero width would mean nothing.
    assert main(["train", *tiny_argv(tmp_path), "--num-seeds", "1", "--sweep", "lr=0.0001,0.03"]) == 0
    capsys.readouterr()
    checkpoint = str(tmp_path / "run" / "checkpoint.pt")
    assert main(["eval", "--checkpoint", checkpoint, "--member", "all", "--episodes", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in lines] == ["seed_0-lr_0.0001", "seed_0-lr_0.03"], lines


def test_the_summary_gives_no_interval_for_a_setting_of_one_seed(tmp_path, capsys):
    # As marl eval --member all: one seed's "95% CI" would be of zero width, saying nothing
    assert main(["train", *tiny_argv(tmp_path), "--sweep", "lr=0.0001,0.03"]) == 0
    out = capsys.readouterr().out
    finals = {lr: read_rows(tmp_path / "run" / f"seed_0-lr_{lr}" / "metrics.csv")[-1] for lr in ("0.0001", "0.03")}
    ranked = sorted(finals, key=lambda lr: -finals[lr]["agent/episode_return"])
    for rank, lr in enumerate(ranked, 1):
        assert f"#{rank} lr={lr}: final return {finals[lr]['agent/episode_return']:.4f} (seed 0)\n" in out, out
    assert "95% CI" not in out
    assert "(2 runs x 8 envs on cpu: seed 0 x lr 0.0001, 0.03)" in out, out  # not "seeds 0"


def test_a_population_without_its_aggregate_log_resumes_without_copying_members(tmp_path, capsys):
    # A deleted aggregate.csv counted as 0 rows: every member looked trained on alone past it.
    run = tmp_path / "run"
    assert main(["train", *tiny_argv(tmp_path), "--num-seeds", "2"]) == 0
    (run / population.AGGREGATE).unlink()
    capsys.readouterr()
    assert main(["train", "--resume", str(run / "checkpoint.pt"), "--total-frames", "192"]) == 0
    assert "trained on alone" not in capsys.readouterr().out
    assert not list(tmp_path.glob("run-seed_*"))
    assert len((run / "seed_1" / "metrics.csv").read_text().splitlines()) == 4


def test_a_population_stopped_between_its_log_writes_resumes_without_copying_members(tmp_path, capsys, monkeypatch):
    # Ctrl-C after the first member's row of iteration 2, before the rest: no member may then look trained on
    # alone past the population (the aggregate's row used to come last).
    run = tmp_path / "run"
    assert main(["train", *tiny_argv(tmp_path), "--num-seeds", "2", "--total-frames", "64"]) == 0
    capsys.readouterr()
    log = RunLogger.log

    def stop_at_the_second_members_row(self, row):
        if self.run_dir == run / "seed_1" and row["iteration"] == 2:
            raise KeyboardInterrupt
        log(self, row)

    monkeypatch.setattr(RunLogger, "log", stop_at_the_second_members_row)
    assert main(["train", "--resume", str(run / "checkpoint.pt"), "--total-frames", "192"]) == 130
    monkeypatch.undo()
    capsys.readouterr()
    assert main(["train", "--resume", str(run / "checkpoint.pt"), "--total-frames", "192"]) == 0
    assert "trained on alone" not in capsys.readouterr().out
    assert not list(tmp_path.glob("run-seed_*"))
    for log_path in (run / "seed_0" / "metrics.csv", run / "seed_1" / "metrics.csv", run / population.AGGREGATE):
        assert [int(row["iteration"]) for row in read_rows(log_path)] == [1, 2, 3], log_path


def write_log(path, iterations) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(["iteration,frames", *(f"{i},{i * 100}" for i in iterations)]) + "\n")


@pytest.mark.parametrize("aggregate", [[1, 2, 3], [1, 3], None], ids=["aggregate", "aggregate-lost-a-row", "deleted"])
def test_a_member_trained_on_alone_is_told_by_its_last_iteration_not_its_rows(tmp_path, aggregate):
    # Logs that lost rows: only seed_2, trained alone to iteration 4 (its iteration 3 lost), is copied out.
    from marl.config import Member

    members = [Member(0), Member(1), Member(2)]
    for member, iterations in zip(members, ([1, 2, 3], [1, 3], [1, 2, 4])):
        write_log(tmp_path / "run" / member.name / "metrics.csv", iterations)
    if aggregate is not None:
        write_log(tmp_path / "run" / population.AGGREGATE, aggregate)
    copy = tmp_path / "run-seed_2-alone"
    assert population.keep_trained_alone(tmp_path / "run", members) == [
        f"seed_2 trained on alone to iteration 4, past the population's iteration 3: that run is kept in {copy}; "
        "the population trains seed_2 on from its own checkpoint"
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run", "run-seed_2-alone"]
    assert (copy / "metrics.csv").read_text() == (tmp_path / "run" / "seed_2" / "metrics.csv").read_text()
    (tmp_path / "run" / "seed_1" / "metrics.csv").write_text("frames\n100\n")
    with pytest.raises(ValueError, match="seed_1/metrics.csv: its header has no iteration column"):
        population.keep_trained_alone(tmp_path / "run", members)


def test_a_resumed_populations_logged_rows_pair_members_by_iteration(tmp_path):
    """The rows a resumed population's summary is of: a member whose log lost iteration 2 is paired with the
    others by iteration, at the iterations every member logged."""
    from marl.config import Member

    members = [Member(0), Member(1)]
    for member, iterations in zip(members, ([1, 2, 3], [1, 3])):
        folder = tmp_path / member.name
        folder.mkdir()
        rows = [f"{i},{i * 100},{member.seed * 10 + i}" for i in iterations]
        (folder / "metrics.csv").write_text("\n".join(["iteration,frames,agent/episode_return", *rows]) + "\n")
    logged = population.logged_rows(tmp_path, members)
    assert [row["iteration"] for row in logged] == [1.0, 3.0]
    assert [[m["agent/episode_return"] for m in row["members"]] for row in logged] == [[1.0, 11.0], [3.0, 13.0]]

"""`marl train --eval-every N --eval-episodes K`: the policies' mode on envs of the evaluation's own, each
env's first episode, against a hand-written loop; training unchanged by it; resumed, populations, bad values."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch

import envs
from envs import registry
from marl.app.build import build_algorithm, make_env
from marl.app.checkpoint import load_algorithm_state, load_checkpoint
from marl.app.cli import main
from marl.app.distributed import World
from marl.app.evaluate import TrainingEvaluation, eval_seed
from marl.app.logger import read_rows
from marl.app.trainer import Trainer
from marl.config import EnvSettings, RunConfig, TrainConfig
from marl.core import episodes as episodes_module
from marl.core.episodes import Actor, first_episodes
from marl.optim import update_step
from tests.marl.algorithms.test_mixed import mixed_config
from tests.marl.algorithms.test_value_based import MaskedCounter, discrete_config
from tests.marl.app.test_seeds import tiny_config, with_run
from tests.marl.app.test_seeds_offpolicy import gru_off_config, off_config

EPISODES = 6


def tiny(tmp_path, **run) -> TrainConfig:
    """MAPPO on navigation, 16 envs of episodes of 6 steps, 2 iterations of 8 steps unless `run` says otherwise."""
    return with_run(tiny_config(tmp_path), **run)


def with_eval(config: TrainConfig, every: int = 1, episodes: int = EPISODES, **run) -> TrainConfig:
    """`config` evaluating every `every` iterations on `episodes` episodes, checkpointing every iteration."""
    run = {"eval_every": every, "eval_episodes": episodes, "checkpoint_every": 1, **run}
    return dataclasses.replace(config, run=dataclasses.replace(config.run, **run))


def reference_evaluation(config: TrainConfig, algorithm_state: dict, seed: int, episodes: int) -> dict[str, float]:
    """Each env's first episode with the policies' mode, step by step, env by env in Python: what the
    evaluation must log, from the algorithm's state (a checkpoint's) and the envs' seed."""
    device = torch.device("cpu")
    env = make_env(config, device, num_envs=episodes, seed=seed)
    algorithm = build_algorithm(config, env, device, World(), torch.Generator().manual_seed(0))
    load_algorithm_state(algorithm, algorithm_state, algorithm.label(config, env.groups))
    acting = algorithm.acting
    obs = env.reset(seed=seed)
    hidden = {g: torch.zeros(episodes, *shape) for g, shape in acting.hidden.items()}
    running = {g: np.zeros((episodes, s.n_agents)) for g, s in env.groups.items()}
    returns: dict[str, list[float | None]] = {g: [None] * episodes for g in env.groups}
    lengths: list[int | None] = [None] * episodes
    step = 0
    while any(length is None for length in lengths):
        actions = {}
        for g, policy in acting.policies.items():
            mask = obs[g].get("action_mask", None)
            if g in hidden:
                dist, hidden[g] = policy(obs[g]["observation"], mask, hidden[g])
            else:
                dist = policy(obs[g]["observation"], mask)
            actions[g] = dist.env_action(dist.mode())
        next_td, obs = env.step(actions)
        step += 1
        done = next_td["done"][:, 0]
        for i in range(episodes):
            if lengths[i] is not None:
                continue
            for g in env.groups:
                running[g][i] += next_td[g, "reward"][i, :, 0].double().numpy()
                if done[i]:
                    returns[g][i] = float(running[g][i].mean())
            if done[i]:
                lengths[i] = step
        for g in hidden:
            hidden[g][done] = 0.0
    values = {f"eval/{g}/episode_return": float(np.mean(r)) for g, r in returns.items()}
    values["eval/episode_return"] = float(np.mean(list(values.values())))
    values["eval/episode_length"] = float(np.mean(lengths))
    values["eval/episodes"] = float(episodes)
    return values


def assert_evaluation(row: dict, expected: dict) -> None:
    for key, value in expected.items():
        assert row[key] == pytest.approx(value, rel=1e-5, abs=1e-5), key


def training_columns(row: dict) -> dict:
    """A row without its timings (`time_s`, `frames_per_s`, the phases' `*_s`) and the evaluation's columns."""
    return {k: v for k, v in row.items() if not (k.endswith("_s") or k.startswith("eval/") or k == "members")}


def same(a: dict, b: dict) -> bool:
    """Bit for bit, NaN equal to NaN."""
    return a.keys() == b.keys() and all((math.isnan(a[k]) and math.isnan(b[k])) or a[k] == b[k] for k in a)


@pytest.fixture
def masked_counter(monkeypatch):
    monkeypatch.setitem(registry._ENVS, "masked_counter", MaskedCounter)  # registered for this test only


def test_the_evaluation_equals_a_hand_written_loop_of_the_policies_mode(tmp_path):
    config = with_eval(tiny(tmp_path, total_frames=16 * 8 * 3), every=2)
    trainer = Trainer(config, run_dir=tmp_path / "run")
    rows = trainer.train()
    # Every 2nd iteration and the last: 2 and 3; the others' cells are empty.
    assert [math.isnan(row["eval/episode_return"]) for row in rows] == [True, False, False]
    assert math.isnan(rows[0]["eval_s"]) and rows[1]["eval_s"] > 0
    state = load_checkpoint(tmp_path / "run" / "checkpoint.pt")
    expected = reference_evaluation(config, state["algorithm"], eval_seed(config.run.seed, 3), EPISODES)
    assert_evaluation(rows[-1], expected)
    logged = read_rows(tmp_path / "run" / "metrics.csv")
    assert math.isnan(logged[0]["eval/agent/episode_return"]) and logged[-1]["eval/episodes"] == EPISODES
    assert logged[-1]["eval/agent/episode_return"] == pytest.approx(rows[-1]["eval/agent/episode_return"])


def test_a_recurrent_masked_q_network_evaluates_from_a_zero_state_within_its_masks(tmp_path, masked_counter):
    # QMIX's greedy action: an argmax over the allowed actions only; its GRU starts each episode at zero.
    config = discrete_config(tmp_path, "qmix", "masked_counter", buffer_size=200)
    gru = dataclasses.replace(config.model, model="gru", gru_hidden=8)
    config = dataclasses.replace(config, model=gru, algo=dataclasses.replace(config.algo, chunk_length=4))
    config = with_eval(with_run(config, rollout_length=8, total_frames=8 * 8 * 2))
    trainer = Trainer(config, run_dir=tmp_path / "run")
    rows = trainer.train()
    state = load_checkpoint(tmp_path / "run" / "checkpoint.pt")
    assert_evaluation(rows[-1], reference_evaluation(config, state["algorithm"], eval_seed(0, 2), EPISODES))


@pytest.mark.parametrize(
    "make",
    [
        lambda tmp_path: tiny_config(tmp_path),
        lambda tmp_path: discrete_config(tmp_path, "iql", buffer_size=200),  # epsilon-greedy exploration
        lambda tmp_path: mixed_config(tmp_path, "masac", "iql", buffer_size=200),  # a group per algorithm
    ],
    ids=["mappo", "iql", "masac+iql"],
)
def test_training_is_bit_for_bit_the_same_with_the_evaluation(tmp_path, make):
    config = with_run(make(tmp_path), rollout_length=8, total_frames=8 * 16 * 2)
    plain = Trainer(config, run_dir=tmp_path / "plain").train()
    evaluated = Trainer(with_eval(config), run_dir=tmp_path / "evaluated").train()
    assert all(math.isfinite(row["eval/episode_return"]) for row in evaluated)
    assert all(same(training_columns(a), training_columns(b)) for a, b in zip(plain, evaluated, strict=True))


ADAPTERS = {
    "vmas": EnvSettings(env="vmas/navigation", num_envs=8, env_options={"n_agents": 2, "max_steps": 5}),
    "pettingzoo": EnvSettings(env="pettingzoo/mpe2.simple_spread_v3", num_envs=8, env_options={"N": 2, "max_steps": 5}),
}


@pytest.mark.parametrize("adapter", ADAPTERS)
def test_an_adapter_env_evaluates_as_a_hand_written_loop_and_trains_as_without(tmp_path, adapter):
    pytest.importorskip(adapter)
    config = dataclasses.replace(tiny_config(tmp_path), env=ADAPTERS[adapter])
    config = with_run(config, rollout_length=8, total_frames=8 * 8)
    plain = Trainer(config, run_dir=tmp_path / "plain").train()
    evaluated = Trainer(with_eval(config, episodes=3), run_dir=tmp_path / "evaluated").train()
    assert same(training_columns(plain[0]), training_columns(evaluated[0]))
    state = load_checkpoint(tmp_path / "evaluated" / "checkpoint.pt")
    assert_evaluation(evaluated[0], reference_evaluation(config, state["algorithm"], eval_seed(0, 1), 3))


@pytest.mark.parametrize("turned_on", [False, True], ids=["evaluated-throughout", "evaluation-turned-on-at-resume"])
def test_a_resumed_run_evaluates_as_the_uninterrupted_one(tmp_path, turned_on):
    config = with_eval(tiny(tmp_path, total_frames=16 * 8 * 3))
    straight = Trainer(config, run_dir=tmp_path / "straight").train()
    first = with_run(tiny_config(tmp_path), checkpoint_every=1) if turned_on else config
    Trainer(
        dataclasses.replace(first, run=dataclasses.replace(first.run, total_frames=16 * 8 * 2)),
        run_dir=tmp_path / "resumed",
    ).train()
    options = {"eval_every": 1, "eval_episodes": EPISODES} if turned_on else {}
    Trainer.resume(tmp_path / "resumed" / "checkpoint.pt", total_frames=16 * 8 * 3, **options).train()
    resumed = read_rows(tmp_path / "resumed" / "metrics.csv")
    columns = [k for k in straight[0] if k.startswith("eval/")]
    assert len(resumed) == 3 and set(columns) < resumed[0].keys()
    for iteration, (a, b) in enumerate(zip(straight, resumed, strict=True), 1):
        if turned_on and iteration < 3:  # trained before the evaluation was on
            assert all(math.isnan(b[k]) for k in columns)
        else:
            assert same({k: a[k] for k in columns}, {k: b[k] for k in columns})


def test_a_run_resumed_without_the_evaluation_leaves_its_columns_empty(tmp_path, capsys):
    config = with_eval(tiny(tmp_path, total_frames=16 * 8))
    Trainer(config, run_dir=tmp_path / "run").train()
    checkpoint = str(tmp_path / "run" / "checkpoint.pt")
    assert main(["train", "--resume", checkpoint, "--total-frames", str(16 * 8 * 2), "--eval-every", "0"]) == 0
    rows = read_rows(tmp_path / "run" / "metrics.csv")
    assert rows[0]["eval/episodes"] == EPISODES and math.isnan(rows[1]["eval/episodes"])
    assert "evaluating" not in capsys.readouterr().out


POPULATIONS = {
    "mappo": lambda tmp_path, **run: tiny(tmp_path, **run),
    "mappo-gru": lambda tmp_path, **run: gru(tiny(tmp_path, **run)),
    "qmix-gru": lambda tmp_path, **run: gru_off_config(tmp_path, "qmix", total_frames=8 * 8 * 2, **run),
    "masac+iql": lambda tmp_path, **run: off_config(tmp_path, "masac+iql", total_frames=8 * 8 * 2, **run),
}


def gru(config: TrainConfig) -> TrainConfig:
    """`config` (PPO's) with a recurrent policy, trained on chunks of a whole rollout."""
    model = dataclasses.replace(config.model, model="gru", gru_hidden=8)
    algo = dataclasses.replace(config.algo, chunk_length=config.run.rollout_length)
    return dataclasses.replace(config, model=model, algo=algo)


@pytest.mark.parametrize("case", POPULATIONS)
def test_each_member_evaluates_as_the_single_run_with_its_seed(tmp_path, case):
    # Every member's policy acts on its own block of the evaluation's envs, seeded as its single run's.
    make = POPULATIONS[case]
    Trainer(with_eval(make(tmp_path, seeds=(3, 8))), run_dir=tmp_path / "population").train()
    for seed in (3, 8):
        alone = Trainer(with_eval(make(tmp_path, seed=seed)), run_dir=tmp_path / f"single{seed}").train()
        member = read_rows(tmp_path / "population" / f"seed_{seed}" / "metrics.csv")
        for a, b in zip(alone, member, strict=True):
            for key in [k for k in a if k.startswith("eval/")]:
                assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-5), key
    aggregate = read_rows(tmp_path / "population" / "aggregate.csv")
    group = next(k for k in aggregate[-1] if k.startswith("eval/") and k.endswith("/episode_return"))
    assert {f"{group}_ci_low", f"{group}_std"} <= aggregate[-1].keys()


@pytest.fixture
def drawn(monkeypatch) -> dict:
    """The curves `marl plot` draws: label -> (y values, line style, colour)."""
    import matplotlib.axes

    curves = {}
    plot = matplotlib.axes.Axes.plot

    def recording(self, x, y, **kwargs):
        lines = plot(self, x, y, **kwargs)
        curves[kwargs["label"]] = (list(y), lines[0].get_linestyle(), lines[0].get_color())
        return lines

    monkeypatch.setattr(matplotlib.axes.Axes, "plot", recording)
    return curves


def test_plot_draws_the_evaluation_dashed_in_its_groups_colour(tmp_path, drawn, capsys):
    config = with_eval(tiny(tmp_path, total_frames=16 * 8 * 3), every=2)
    rows = Trainer(config, run_dir=tmp_path / "run").train()
    assert main(["plot", str(tmp_path / "run")]) == 0
    assert drawn.keys() == {"agent", "agent (eval)"}
    (_, style, colour), (evaluated, eval_style, eval_colour) = drawn["agent"], drawn["agent (eval)"]
    assert style == "-" and eval_style == "--" and eval_colour == colour
    assert evaluated == [rows[1]["eval/agent/episode_return"], rows[2]["eval/agent/episode_return"]]


def test_a_swept_population_evaluates_every_member_and_summarises_the_last_evaluation(tmp_path, capsys, drawn):
    args = ["train", "--num-envs", "8", "--rollout-length", "8", "--minibatch-size", "32", "--epochs", "1"]
    args += ["--hidden", "8", "--env-option", "max_steps=5", "--total-frames", "128", "--no-progress"]
    args += ["--no-tensorboard", "--log-dir", str(tmp_path), "--run-name", "run", "--seeds", "0", "1"]
    args += ["--sweep", "lr=1e-3,1e-2", "--eval-every", "1", "--eval-episodes", "4", "--device", "cpu"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "eval agent     #1 lr=" in out and "eval return at iteration 2" in out
    for member in ("seed_0-lr_0.001", "seed_1-lr_0.01"):
        rows = read_rows(tmp_path / "run" / member / "metrics.csv")
        assert [row["eval/episodes"] for row in rows] == [4, 4]
    assert main(["plot", str(tmp_path / "run")]) == 0  # each setting's evaluation over its seeds, with its band
    assert {"agent lr_0.001 (eval) (mean, 95% CI over seeds)", "agent lr_0.01 (eval) (mean, 95% CI over seeds)"} < set(
        drawn
    )


def test_the_evaluation_reads_nothing_back_until_its_one_read(tmp_path):
    trainer = Trainer(with_eval(gru(tiny(tmp_path))), run_dir=tmp_path / "run")
    with envs.forbid_host_sync():
        values = trainer.evaluation.run(iteration=1)
    assert set(values) == set(trainer.evaluation.columns)
    assert float(values["eval/episodes"]) == EPISODES


class WithoutTimeLimit:
    """An env that does not say how long its episodes last (no `max_steps`); counts its steps."""

    def __init__(self, env) -> None:
        self.env, self.steps = env, 0

    def __getattr__(self, name: str):
        if name == "max_steps":
            raise AttributeError(name)
        return getattr(self.env, name)

    def step_data(self, action, **kwargs):
        self.steps += 1
        return self.env.step_data(action, **kwargs)


@pytest.mark.parametrize(("max_steps", "steps", "ended"), [(6, 8, True), (100, 12, False)])
def test_an_env_without_a_known_time_limit_is_played_in_chunks_up_to_a_cap(
    tmp_path, monkeypatch, max_steps, steps, ended
):
    # A wrapped simulator may not say how long its episodes last: the loop reads once per chunk (of 4 here),
    # and stops at the cap (12) with the episodes that ended, instead of stepping on forever.
    monkeypatch.setattr(episodes_module, "CHUNK_STEPS", 4)
    monkeypatch.setattr(episodes_module, "MAX_STEPS_WITHOUT_LIMIT", 12)
    trainer = Trainer(tiny_config(tmp_path), run_dir=tmp_path / "run")
    config = dataclasses.replace(
        trainer.config, env=dataclasses.replace(trainer.config.env, env_options={"max_steps": max_steps})
    )
    env = WithoutTimeLimit(make_env(config, trainer.device, num_envs=4, seed=0))
    played = first_episodes(env, Actor(trainer.algorithm.acting, env.groups, 4, trainer.device), env.reset_data(seed=0))
    assert env.steps == steps  # 6: two chunks, the read after the second finds every episode ended
    assert bool(played.finished.all()) is ended and bool(played.finished.any()) is ended


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--eval-every", "-1"], "eval_every must be >= 0"),
        (["--eval-every", "1.5"], "invalid int value: '1.5'"),
        (["--eval-every", "2", "--eval-episodes", "0"], "eval_episodes must be >= 1"),
        (["--eval-episodes", "8"], "--eval-episodes 8: it applies to the evaluation during training only"),
    ],
)
def test_bad_evaluation_options_are_one_clear_line(tmp_path, capsys, argv, message):
    try:
        code = main(["train", "--log-dir", str(tmp_path), "--device", "cpu", *argv])
    except SystemExit as exit:  # argparse's own (a value that is not an int)
        code = exit.code
    err = capsys.readouterr().err
    assert code == 2
    assert message in err and "Traceback" not in err


def test_bad_evaluation_values_from_python_are_refused():
    with pytest.raises(TypeError, match="eval_every=True has type bool"):
        RunConfig(eval_every=True)
    with pytest.raises(ValueError, match="eval_episodes must be >= 1"):
        RunConfig(eval_every=1, eval_episodes=-3)


def test_an_evaluation_leaves_torchs_global_generators_as_they_were(tmp_path):
    trainer = Trainer(with_eval(tiny(tmp_path)), run_dir=tmp_path / "run")
    before = torch.get_rng_state()
    trainer.evaluate()
    assert torch.equal(torch.get_rng_state(), before)
    assert isinstance(trainer.evaluation, TrainingEvaluation)


@pytest.mark.slow
@pytest.mark.filterwarnings("error::RuntimeWarning")  # the compile fallback's warning fails the test
def test_a_compiled_run_trains_as_without_the_evaluation_and_evaluates_its_policies(tmp_path, monkeypatch):
    # The evaluation calls the policies eagerly between the compiled rollout's calls: no recompile, and what
    # the compiled steps keep between calls (the observation, the env's state) is left as it was. The update
    # step runs eagerly: its compile is most of the time, and the evaluation reads nothing of it.
    monkeypatch.setattr(update_step, "maybe_compile", lambda fn, *args, **kwargs: fn)
    config = with_run(tiny_config(tmp_path), compile=True, total_frames=16 * 8 * 2)
    runs = {}
    for name, run_config in (("plain", config), ("evaluated", with_eval(config))):
        torch._dynamo.reset()  # each run's collector compiles its own steps (a new `self`)
        with torch._dynamo.config.patch(error_on_recompile=True):
            runs[name] = Trainer(run_config, run_dir=tmp_path / name).train()
    assert all(same(training_columns(a), training_columns(b)) for a, b in zip(runs["plain"], runs["evaluated"]))
    state = load_checkpoint(tmp_path / "evaluated" / "checkpoint.pt")
    assert_evaluation(
        runs["evaluated"][-1], reference_evaluation(config, state["algorithm"], eval_seed(0, 2), EPISODES)
    )


def test_a_group_named_eval_is_refused_with_evaluation_on(tmp_path):
    """Its training columns (`eval/episode_return`) would be the evaluation's overall return."""
    config = with_eval(tiny(tmp_path))
    agents = [f"agent_{i}" for i in range(3)]
    config = dataclasses.replace(config, env=dataclasses.replace(config.env, group_map={"eval": agents}))
    with pytest.raises(ValueError, match="has a group named 'eval'.*rename it with an explicit group_map"):
        Trainer(config, run_dir=tmp_path / "run")
    renamed = dataclasses.replace(config, env=dataclasses.replace(config.env, group_map={"team": agents}))
    Trainer(renamed, run_dir=tmp_path / "renamed")

"""`python -m marl.bench.train`: the vecmarl side on a tiny budget, without BenchMARL (no timings checked)."""

import argparse
import dataclasses
import json

import pytest
import torch

from marl.app.build import build_algorithm, make_env
from marl.app.distributed import World
from marl.bench import train as bench_train
from marl.bench.train import EXPECTED_DEFAULTS, benchmarl_config, check_defaults, main

ROW_FIELDS = {
    "name", "side", "env", "algo", "settings", "frames_per_iteration", "collect_s", "advantages_s", "update_s",
    "iteration_s", "iteration_frames_per_s", "frames", "frames_per_s", "episode_return", "episode_returns", "repeats",
}  # fmt: skip


@pytest.fixture
def restore_threads():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def test_quick_run_prints_both_tables_and_writes_the_json(tmp_path, capsys, restore_threads):
    path = tmp_path / "bench.json"
    # One thread: tiny ops on a loaded machine are many times slower with several.
    main(["--quick", "--threads", "1", "--default-iterations", "1", "--json", str(path)])
    out = capsys.readouterr().out
    assert "command: python -m marl.bench.train --quick --threads 1" in out and "load average" in out
    assert "1. one iteration" in out and "2. equal work" in out and "GFLOP/s before" in out
    for name in ("vecmarl MAPPO vmas/navigation", "vecmarl IPPO navigation", "vecmarl default MAPPO navigation"):
        assert name in out

    result = json.loads(path.read_text())
    assert {"command", "device", "threads", "load_average_start", "load_average_end", "sizes", "frames", "rows"} <= set(
        result
    )
    assert result["peer"] is None and len(result["rows"]) == 6
    for row in result["rows"]:
        assert ROW_FIELDS <= set(row), ROW_FIELDS - set(row)
        assert row["side"] == "vecmarl" and row["frames"] > 0 and row["frames_per_s"] > 0
    assert result["threads"] == 1
    matched = [r for r in result["rows"] if r["settings"] == "BenchMARL"]
    assert all(r["frames"] == result["frames"] for r in matched)
    assert all(r["episode_return"] == r["episode_return"] for r in matched)  # episodes ended: not NaN
    assert all(run["matmul_gflops"] > 0 for case in result["runs"] for run in case["runs"])


def test_help_explains_what_is_measured(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    for flag in ("--json", "--repeats", "--peer-python", "--frames", "--threads", "--quick", "--modes"):
        assert flag in out
    assert "not timed" in out


@pytest.mark.parametrize("env", ["vmas/navigation", "navigation"])
def test_benchmarl_settings_in_vecmarl_fields(env):
    config = benchmarl_config(env, "ippo", frames=30_000, seed=0)
    assert config.env.num_envs * config.run.rollout_length == 6000
    assert (config.algo.epochs, config.algo.minibatch_size, config.model.hidden) == (45, 400, (256, 256))
    assert (config.algo.lr, config.algo.gamma, config.algo.lmbda) == (5e-5, 0.99, 0.9)
    assert not config.algo.clip_value and not config.algo.normalize_advantage and config.algo.value_coef == 2.0
    assert config.env.env_options["n_agents"] == 3 and config.env.env_options["max_steps"] == 100


def test_benchmarl_adam_eps_reaches_the_optimizer():
    config = benchmarl_config("navigation", "mappo", frames=6000, seed=0)
    cpu = torch.device("cpu")
    algorithm = build_algorithm(config, make_env(config, cpu), cpu, World(), torch.Generator())
    assert [lr.optimizer.param_groups[0]["eps"] for lr in algorithm.learners.values()] == [1e-6]


def test_a_changed_benchmarl_default_is_reported():
    reported = json.loads(json.dumps(EXPECTED_DEFAULTS))
    assert check_defaults(reported) == []
    reported["algorithm"]["lmbda"] = 0.95
    assert check_defaults(reported) == ["BenchMARL algorithm.lmbda = 0.95, vecmarl's matched config assumes 0.9"]


def test_compile_mode_adds_compiled_vecmarl_rows_next_to_the_eager_ones(monkeypatch, capsys, restore_threads):
    compiled = []

    def run_eagerly(config):  # records what the trainer was asked for; compiling itself is tested elsewhere
        compiled.append(config.run.compile)
        return bench_train.run_vecmarl(dataclasses.replace(config, run=dataclasses.replace(config.run, compile=False)))

    monkeypatch.setattr(bench_train, "run_in_fresh_process", run_eagerly)
    result = main(["--quick", "--threads", "1", "--algos", "ippo", "--envs", "navigation", "--default-iterations", "0",
                   "--modes", "eager", "compile"])  # fmt: skip
    assert compiled == [True]  # the eager row ran in this process
    rows = {r["name"]: r for r in result["rows"]}
    assert set(rows) == {"vecmarl IPPO navigation", "vecmarl IPPO navigation --compile"}
    assert [r["compile"] for r in rows.values()] == [False, True]
    # A run's one-off costs (compiling, with --compile) fall in its first iteration, shown apart.
    assert all(r["first_iteration_s"] > 0 for r in rows.values())
    out = capsys.readouterr().out
    assert "1st iter" in out and "per iter" in out and "vecmarl IPPO navigation --compile" in out

    compiled.clear()
    result = main(["--quick", "--threads", "1", "--algos", "ippo", "--envs", "navigation", "--default-iterations", "0",
                   "--modes", "compile"])  # fmt: skip
    assert compiled == [True] and [r["name"] for r in result["rows"]] == ["vecmarl IPPO navigation --compile"]


def test_a_run_in_a_fresh_process_returns_its_figures():
    config = benchmarl_config("navigation", "ippo", frames=200, seed=0, sizes=bench_train.QUICK_SIZES)
    run = bench_train.run_in_fresh_process(config)
    assert run["frames"] == 200 and len(run["iterations"]) == 1 and run["seconds"] > 0


def test_compile_reaches_the_trainer_config():
    assert benchmarl_config("vmas/navigation", "mappo", frames=6000, seed=0, compile=True).run.compile
    assert not benchmarl_config("vmas/navigation", "mappo", frames=6000, seed=0).run.compile


def test_overlap_mode_adds_rows_trained_with_overlap_critic():
    config = benchmarl_config("vmas/navigation", "ippo", frames=6000, seed=0, compile=True, overlap=True)
    assert config.run.compile and config.algo.overlap_critic
    assert not benchmarl_config("vmas/navigation", "ippo", frames=6000, seed=0, compile=True).algo.overlap_critic
    args = argparse.Namespace(
        algos=["ippo"], envs=["vmas/navigation"], modes=["compile", "overlap"], peer_python=None, default_iterations=0
    )
    cases = bench_train.build_cases(args)
    assert [case.name for case in cases] == [
        "vecmarl IPPO vmas/navigation --compile",
        "vecmarl IPPO vmas/navigation --compile --overlap-critic",
    ]
    assert [case.overlap for case in cases] == [False, True]

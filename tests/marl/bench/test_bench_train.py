"""`python -m marl.bench.train`: the vecmarl side on a tiny budget, without BenchMARL (no timings checked)."""

import argparse
import dataclasses
import json

import pytest
import torch

from marl.algorithms import base as algorithm_registry
from marl.algorithms.ppo import PPO
from marl.app.build import build_algorithm, make_env
from marl.app.distributed import World
from marl.bench import train as bench_train
from marl.bench.train import benchmarl_config, check_defaults, expected_defaults, main
from marl.config import AlgorithmConfig

ROW_FIELDS = {
    "name", "side", "env", "algo", "settings", "frames_per_iteration", "collect_s", "advantages_s", "update_s",
    "iteration_s", "iteration_frames_per_s", "frames", "frames_per_s", "episode_return", "episode_returns", "repeats",
}  # fmt: skip


@pytest.fixture
def restore_threads():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def not_json(constant: str):
    raise AssertionError(f"{constant} in the JSON: not JSON, strict readers refuse it")


def test_quick_run_prints_both_tables_and_writes_the_json(tmp_path, capsys, restore_threads):
    path = tmp_path / "bench.json"
    # One thread: tiny ops on a loaded machine are many times slower with several.
    main(["--quick", "--threads", "1", "--default-iterations", "1", "--json", str(path)])
    out = capsys.readouterr().out
    assert "command: python -m marl.bench.train --quick --threads 1" in out and "load average" in out
    assert "1. one iteration" in out and "2. equal work" in out and "GFLOP/s before" in out
    for name in ("vecmarl MAPPO vmas/navigation", "vecmarl IPPO navigation", "vecmarl default MAPPO navigation"):
        assert name in out

    result = json.loads(path.read_text(), parse_constant=not_json)  # no NaN: a return not measured is null
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
    for flag in ("--json", "--repeats", "--peer-python", "--frames", "--threads", "--quick", "--modes", "--algos"):
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
    run = {"defaults": json.loads(json.dumps(expected_defaults("ippo"))), "continuous_actions": True}
    assert check_defaults(run, "ippo") == []
    run["defaults"]["algorithm"]["lmbda"] = 0.95
    assert check_defaults(run, "ippo") == [
        "BenchMARL ippo algorithm.lmbda = 0.95, vecmarl's matched config assumes 0.9"
    ]


def test_off_policy_defaults_and_action_space_are_checked():
    run = {"defaults": json.loads(json.dumps(expected_defaults("qmix"))), "continuous_actions": False}
    assert check_defaults(run, "qmix") == []
    assert expected_defaults("qmix")["experiment"]["off_policy_n_optimizer_steps"] == 1000
    assert "on_policy_minibatch_size" not in expected_defaults("qmix")["experiment"]
    run["defaults"]["experiment"]["off_policy_n_optimizer_steps"] = 500
    run["continuous_actions"] = True
    assert check_defaults(run, "qmix") == [
        "BenchMARL qmix experiment.off_policy_n_optimizer_steps = 500, vecmarl's matched config assumes 1000",
        "BenchMARL ran qmix with continuous actions, vecmarl's matched config has discrete ones",
    ]


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


@dataclasses.dataclass(frozen=True)
class FakeOffPolicyConfig(AlgorithmConfig):
    """The fields issue 29's off-policy config is to have (MADDPG's), for the config builder's tests."""

    algo: str = "maddpg"
    lr: float = 3e-4
    gamma: float = 0.99
    tau: float = 0.01
    buffer_size: int = 100_000
    batch_size: int = 256
    updates_per_iteration: int = 1
    warmup_frames: int = 1000
    prioritized: bool = True
    max_grad_norm: float = 1.0
    critic_scope: str = "auto"
    shared_value: bool = False
    exploration_sigma_init: float = 0.1
    exploration_sigma_end: float = 0.1
    exploration_anneal: float = 1.0


@dataclasses.dataclass(frozen=True)
class FakeQConfig(AlgorithmConfig):
    """A value-based config without tau (a field BenchMARL's settings need) nor epsilon fields."""

    algo: str = "qmix"
    lr: float = 3e-4


class FakeOffPolicy:
    Config = FakeOffPolicyConfig
    configs = {}


@pytest.fixture
def fake_off_policy(monkeypatch):
    """maddpg and iddpg registered with FakeOffPolicyConfig, qmix with FakeQConfig, for this test only."""
    for name in ("maddpg", "iddpg"):
        monkeypatch.setitem(algorithm_registry._ALGORITHMS, name, FakeOffPolicy)
    monkeypatch.setitem(
        algorithm_registry._ALGORITHMS, "qmix", type("FakeQ", (), {"Config": FakeQConfig, "configs": {}})
    )


def test_off_policy_benchmarl_settings_in_vecmarl_fields(fake_off_policy):
    config = benchmarl_config("vmas/navigation", "maddpg", frames=12_000, seed=3)
    algo = config.algo
    assert isinstance(algo, FakeOffPolicyConfig) and algo.algo == "maddpg"
    assert config.env.num_envs * config.run.rollout_length == 6000 and config.run.total_frames == 12_000
    assert (algo.updates_per_iteration, algo.batch_size, algo.buffer_size) == (1000, 128, 1_000_000)
    assert (algo.lr, algo.gamma, algo.tau, algo.max_grad_norm) == (5e-5, 0.99, 0.005, 5.0)
    assert (algo.warmup_frames, algo.prioritized) == (0, False)
    assert (algo.exploration_sigma_init, algo.exploration_sigma_end, algo.exploration_anneal) == (0.8, 0.01, 1 / 3)
    assert (algo.critic_scope, algo.shared_value) == ("global", True)
    assert config.model.hidden == (256, 256) and config.model.activation == "tanh" and config.model.share_params
    assert config.env.env_options == {"n_agents": 3, "max_steps": 100, "shared_rew": False}
    iddpg = benchmarl_config("navigation", "iddpg", frames=6000, seed=0).algo
    assert (iddpg.critic_scope, iddpg.shared_value) == ("agent", False)
    quick = benchmarl_config("navigation", "iddpg", frames=400, seed=0, sizes=bench_train.QUICK_SIZES)
    assert (quick.algo.updates_per_iteration, quick.algo.batch_size, quick.model.hidden) == (4, 32, (32, 32))
    default = bench_train.default_config("maddpg", iterations=2, seed=0, quick=True)  # the default rows
    assert (default.algo.updates_per_iteration, default.algo.batch_size, default.algo.buffer_size) == (4, 32, 4096)
    assert default.algo.lr == FakeOffPolicyConfig.lr and default.run.total_frames == 2 * 16 * 16


def test_off_policy_settings_vecmarl_cannot_take_are_named(fake_off_policy):
    assert bench_train.unmatched_settings("maddpg") == [
        "maddpg: vecmarl's config has no field 'adam_eps': BenchMARL's 1e-06 is not matched (vecmarl's default runs)"
    ]
    assert bench_train.unmatched_settings("ippo") == []
    with pytest.raises(ValueError, match=r"FakeQConfig \(--algo qmix\) has no field\(s\) gamma, tau, buffer_size"):
        benchmarl_config("vmas/navigation", "qmix", frames=6000, seed=0)
    with pytest.raises(ValueError, match="qmix needs discrete actions; .* only vmas/navigation"):
        benchmarl_config("navigation", "qmix", frames=6000, seed=0)
    vdn = benchmarl_config("vmas/navigation", "vdn", frames=6000, seed=0).algo  # the registered one
    assert (vdn.algo, vdn.tau, vdn.exploration_eps_init, vdn.exploration_anneal, vdn.double_q) == (
        "vdn",
        0.005,
        0.8,
        1 / 3,
        False,
    )


def test_value_based_rows_run_on_vmas_discrete_only(fake_off_policy):
    args = argparse.Namespace(
        algos=["qmix", "maddpg"], envs=["vmas/navigation", "navigation"], modes=["eager", "overlap"],
        peer_python="python", default_iterations=1,
    )  # fmt: skip
    assert [case.name for case in bench_train.build_cases(args)] == [
        "BenchMARL QMIX vmas navigation",
        "vecmarl QMIX vmas/navigation",
        "BenchMARL MADDPG vmas navigation",
        "vecmarl MADDPG vmas/navigation",
        "vecmarl MADDPG navigation",
        "vecmarl default MADDPG navigation",
    ]  # no overlap rows (PPO's option), no QMIX on the continuous native navigation
    assert bench_train.cannot_run("qmix", "navigation") and bench_train.cannot_run("masac", "navigation") is None


@pytest.mark.parametrize(
    "algo, message",
    [
        ("masac", "masac is not registered in this vecmarl (its algorithms: ippo, mappo); of BenchMARL's, it can run "
         "mappo, ippo"),
        ("coma", "BenchMARL has no 'coma' to compare with; choose from mappo, ippo, masac"),
    ],
)  # fmt: skip
def test_algos_offers_only_what_is_registered(algo, message, monkeypatch, capsys, usage_error):
    monkeypatch.setattr(algorithm_registry, "_ALGORITHMS", {"mappo": PPO, "ippo": PPO})
    with usage_error() as refused:
        main(["--quick", "--algos", "mappo", algo])
    assert f"error: argument --algos: {message}" in refused.err
    with pytest.raises(SystemExit):
        main(["--help"])
    help_text = " ".join(capsys.readouterr().out.split())  # unwrapped
    assert (
        "--algos ALGO [ALGO ...] algorithms to run, on both sides: mappo, ippo (default: the PPO ones); " in help_text
    )
    assert "BenchMARL's masac, isac, maddpg, iddpg, qmix, vdn, iql once registered in vecmarl" in help_text


def test_a_peer_python_that_is_not_python_is_refused_before_any_run(tmp_path, usage_error, not_python):
    # Before, --peer-python of a missing file, a non-executable one or a program that is not Python ran
    # vecmarl's heading and then failed with a traceback from the BenchMARL run.
    for python, reason in not_python + [(tmp_path / "missing", "no such interpreter")]:
        with usage_error() as refused:
            main(["--quick", "--algos", "mappo", "--envs", "navigation", "--peer-python", str(python)])
        assert refused.err.strip().endswith(f"python -m marl.bench.train: error: --peer-python {python}: {reason}")
        assert refused.out == ""

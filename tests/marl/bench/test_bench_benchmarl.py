"""BenchMARL's side of `marl.bench.train` without BenchMARL: the worker's settings, reported defaults and
phase split (`marl.bench.benchmarl_worker`), and how the launcher fails."""

import ast
import dataclasses
import json
import math
import sys
import types
from itertools import count
from types import SimpleNamespace

import pytest
import torch
from tensordict import TensorDict

from marl.bench import benchmarl_worker as worker
from marl.bench.benchmarl import WORKER, run_benchmarl
from marl.bench.train import ALGOS, QUICK_SIZES, check_defaults, expected_defaults

QUICK = dataclasses.asdict(QUICK_SIZES)


def test_the_worker_imports_only_the_standard_library_at_its_top():
    """It runs in the peer's Python, which has no vecmarl; BenchMARL and torch are imported in `main`."""
    tree = ast.parse(WORKER.read_text())
    modules = {alias.name for node in tree.body if isinstance(node, ast.Import) for alias in node.names}
    modules |= {node.module for node in tree.body if isinstance(node, ast.ImportFrom)}
    assert modules and {m.split(".")[0] for m in modules} <= set(sys.stdlib_module_names)


def test_a_full_run_changes_only_what_a_benchmark_must():
    settings = {"algo": "masac", "frames": 12_000, "seed": 0, "threads": 1, "sizes": None}
    assert worker.experiment_settings(settings, "/tmp/run") == {
        "max_n_frames": 12_000,
        "sampling_device": "cpu",
        "train_device": "cpu",
        "buffer_device": "cpu",
        "loggers": [],
        "create_json": False,
        "evaluation": False,
        "render": False,
        "checkpoint_interval": 0,
        "checkpoint_at_end": False,
        "save_folder": "/tmp/run",
    }


def test_quick_sizes_go_to_the_fields_of_the_algorithms_family():
    off = worker.experiment_settings({"algo": "qmix", "frames": 400, "sizes": QUICK}, "/tmp/run")
    assert {k: v for k, v in off.items() if k.startswith("off_policy")} == {
        "off_policy_n_envs_per_worker": 2,
        "off_policy_collected_frames_per_batch": 200,
        "off_policy_n_optimizer_steps": 4,
        "off_policy_train_batch_size": 32,
        "off_policy_memory_size": 10_000,
    }
    assert not any(k.startswith("on_policy") for k in off)
    on = worker.experiment_settings({"algo": "mappo", "frames": 400, "sizes": QUICK}, "/tmp/run")
    assert {k: v for k, v in on.items() if k.startswith("on_policy")} == {
        "on_policy_n_envs_per_worker": 2,
        "on_policy_collected_frames_per_batch": 200,
        "on_policy_n_minibatch_iters": 1,
        "on_policy_minibatch_size": 100,
    }
    assert not any(k.startswith("off_policy") for k in on)


@pytest.mark.parametrize("algo", ALGOS)
def test_the_worker_reports_every_default_vecmarl_checks(algo):
    """What `check_defaults` compares must be in the worker's report, or it would read as a mismatch."""
    assert worker.ALGORITHM_CONFIGS.keys() == set(ALGOS)
    experiment = SimpleNamespace(**{k: f"yaml {k}" for k in worker.EXPERIMENT_FIELDS + worker.OFF_POLICY_FIELDS})
    vars(experiment).update({k: f"yaml {k}" for k in worker.ON_POLICY_FIELDS})
    algorithm = SimpleNamespace(**expected_defaults(algo)["algorithm"], _private=object())
    model = SimpleNamespace(num_cells=(256, 256), activation_class=torch.nn.Tanh)
    reported = worker.reported_defaults(algo, experiment, algorithm, model, {"n_agents": 3})
    assert set(expected_defaults(algo)["experiment"]) <= set(reported["experiment"])
    other = "off_policy" if algo in worker.ON_POLICY else "on_policy"
    assert not any(k.startswith(other) for k in reported["experiment"])
    assert reported["algorithm"] == expected_defaults(algo)["algorithm"]
    assert reported["model"] == {"num_cells": [256, 256], "activation_class": "Tanh"}
    assert reported["task"] == {"n_agents": 3}


def fake_experiment(groups: tuple[str, ...]) -> SimpleNamespace:
    algorithm = SimpleNamespace(process_batch=lambda group, batch: batch)
    return SimpleNamespace(algorithm=algorithm, group_map={g: [] for g in groups}, mean_return=0.0)


def batch(scales: dict[str, float]) -> TensorDict:
    """A collected batch `[10 envs, 3 steps]`, with each given group's policy scale."""
    data = TensorDict({}, batch_size=[10, 3])
    for group, scale in scales.items():
        data[group] = TensorDict({"scale": torch.full((10, 3, 2, 1), scale)}, batch_size=[10, 3])
    return data


def test_the_callbacks_split_each_iteration_into_phases():
    """Two groups; the clock reads 0, 1, 2, ... at each call. The last group's `on_train_end` ends an
    iteration's update; `process_batch` is the on-policy advantages, else part of the update."""
    clock = count()
    times = worker.PhaseTimes(clock=lambda: float(next(clock)))
    times.experiment = fake_experiment(("agents", "others"))
    times.on_setup()
    start = times.clock()  # 0
    for iteration, mean_return in enumerate((-1.5, -0.5)):
        times.experiment.mean_return = torch.tensor(mean_return)
        # Iteration 0 reads: collected 1; agents: process_batch 2-3, trained 4; others: 5-6, trained 7.
        times.on_batch_collected(batch({"agents": 1.0, "others": 3.0} if iteration == 0 else {}))
        for group in ("agents", "others"):
            times.experiment.algorithm.process_batch(group, None)
            for _ in range(iteration + 2):
                times.on_train_step(None, group)
            times.on_train_end(None, group)
    first, second = worker.iteration_rows(start, times.marks, on_policy=True)
    assert first == {
        "frames": 30,
        "collect_s": 1.0,
        "advantages_s": 2.0,
        "update_s": 4.0,
        "optimizer_steps": 4,
        "episode_return": -1.5,
        "policy_std": 2.0,
    }
    assert (second["collect_s"], second["advantages_s"], second["update_s"]) == (1.0, 2.0, 4.0)
    assert second["optimizer_steps"] == 6 and second["episode_return"] == -0.5 and math.isnan(second["policy_std"])
    off_policy = worker.iteration_rows(start, times.marks, on_policy=False)
    assert [(r["advantages_s"], r["update_s"]) for r in off_policy] == [(0.0, 6.0), (0.0, 6.0)]


def test_benchmarl_is_not_looked_for_beside_the_worker():
    """The launcher runs the worker isolated (`-I`): `marl/bench/benchmarl.py`, beside it, would otherwise
    shadow the package. vecmarl's own Python has no BenchMARL (peers are never dependencies), so the run
    fails there, naming the interpreter and the missing package, not `benchmarl.algorithms`."""
    with pytest.raises(RuntimeError) as error:
        run_benchmarl(sys.executable, "qmix", frames=400, seed=0, threads=1, sizes=QUICK, timeout_s=120)
    message = str(error.value)
    assert f"the BenchMARL run (qmix, seed 0) with {sys.executable} failed (exit 1)" in message
    assert "No module named 'benchmarl'" in message


def test_a_missing_interpreter_is_named(tmp_path):
    missing = str(tmp_path / "no-python")
    with pytest.raises(FileNotFoundError, match=f"the BenchMARL interpreter '{missing}' was not found"):
        run_benchmarl(missing, "masac", frames=400, seed=0, threads=1)


def fake_benchmarl(monkeypatch) -> type:
    """A stand-in for BenchMARL's modules in `sys.modules`, as much of its API as the worker's `main`
    uses: yaml defaults as `expected_defaults` has them, and an `Experiment` whose `run` collects
    `n_envs x steps` batches and calls the callbacks as BenchMARL's loop does, with the sizes it was given."""
    experiment_module, algorithms_module = types.ModuleType("benchmarl.experiment"), types.ModuleType("a")

    class ExperimentConfig(SimpleNamespace):
        @classmethod
        def get_from_yaml(cls):
            every = {k: v for algo in ("ippo", "qmix") for k, v in expected_defaults(algo)["experiment"].items()}
            return cls(**every)

    class Experiment:
        def __init__(self, task, algorithm_config, model_config, critic_model_config, seed, config, callbacks):
            self.config, self.callbacks, self.algo = config, callbacks, algorithm_config.algo
            self.on_policy = self.algo in worker.ON_POLICY
            self.continuous_actions = self.algo not in ("qmix", "vdn", "iql")
            self.group_map, self.total_frames, self.mean_return = {"agents": []}, 0, float("nan")
            self.algorithm = SimpleNamespace(process_batch=lambda group, batch: batch)
            Experiment.hidden = model_config.num_cells
            for callback in callbacks:
                callback.experiment = self
                callback.on_setup()

        def run(self):
            prefix = "on_policy" if self.on_policy else "off_policy"
            envs = getattr(self.config, f"{prefix}_n_envs_per_worker")
            frames = getattr(self.config, f"{prefix}_collected_frames_per_batch")
            steps = self.config.off_policy_n_optimizer_steps if not self.on_policy else 2
            for iteration in range(-(-self.config.max_n_frames // frames)):
                batch = TensorDict({}, batch_size=[envs, frames // envs])
                self.total_frames += batch.numel()
                self.mean_return = -1.0 + iteration
                for callback in self.callbacks:
                    callback.on_batch_collected(batch)
                self.algorithm.process_batch("agents", batch)
                for _ in range(steps):
                    for callback in self.callbacks:
                        callback.on_train_step(batch, "agents")
                for callback in self.callbacks:
                    callback.on_train_end(None, "agents")

    def yaml_config(algo):
        return type(
            algo, (), {"get_from_yaml": lambda: SimpleNamespace(algo=algo, **expected_defaults(algo)["algorithm"])}
        )

    for algo, name in worker.ALGORITHM_CONFIGS.items():
        setattr(algorithms_module, name, yaml_config(algo))
    experiment_module.Experiment, experiment_module.ExperimentConfig = Experiment, ExperimentConfig
    mlp = SimpleNamespace(get_from_yaml=lambda: SimpleNamespace(num_cells=[256, 256], activation_class=torch.nn.Tanh))
    task = SimpleNamespace(get_from_yaml=lambda: SimpleNamespace(config=expected_defaults("mappo")["task"]))
    modules = {
        "benchmarl": types.SimpleNamespace(__version__="fake", algorithms=algorithms_module),
        "benchmarl.algorithms": algorithms_module,
        "benchmarl.environments": SimpleNamespace(VmasTask=SimpleNamespace(NAVIGATION=task)),
        "benchmarl.experiment": experiment_module,
        "benchmarl.models": SimpleNamespace(),
        "benchmarl.models.mlp": SimpleNamespace(MlpConfig=mlp),
    }
    for name, module in modules.items():
        monkeypatch.setitem(sys.modules, name, module)
    return Experiment


@pytest.mark.parametrize("algo", ["masac", "qmix", "ippo"])
def test_the_worker_runs_benchmarls_experiment_with_the_settings(algo, monkeypatch):
    experiment = fake_benchmarl(monkeypatch)
    threads = torch.get_num_threads()
    try:
        run = worker.main({"algo": algo, "frames": 400, "seed": 0, "threads": 1, "sizes": QUICK})
    finally:
        torch.set_num_threads(threads)
    assert run["frames"] == 400 and run["seconds"] > 0 and run["benchmarl"] == "fake"
    assert run["continuous_actions"] == (algo != "qmix")
    assert experiment.hidden == [32, 32]  # the quick sizes' MLP
    assert check_defaults(run, algo) == []
    steps = 2 if algo == "ippo" else QUICK["updates_per_iteration"]
    assert [(it["frames"], it["optimizer_steps"], it["episode_return"]) for it in run["iterations"]] == [
        (200, steps, -1.0),
        (200, steps, 0.0),
    ]
    assert all(it["collect_s"] >= 0 and it["update_s"] >= 0 for it in run["iterations"])
    json.dumps(run)  # what the worker prints

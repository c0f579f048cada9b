"""BenchMARL's side of `marl.bench.train`, run in the peer's Python: one run on VMAS navigation.

    PEER_PYTHON -I marl/bench/benchmarl_worker.py '{"algo": "masac", "frames": 12000, "seed": 0, "threads": 1}'

`-I` keeps this file's folder off `sys.path` (its `benchmarl.py`, vecmarl's launcher, would shadow the
real package). The peer needs benchmarl, torchrl and vmas, never vecmarl: this module imports only the
standard library at its top, so vecmarl's tests import it to check its pure parts (the settings given
to BenchMARL, the defaults it reports, the phase split) without BenchMARL; everything BenchMARL's is
imported inside `main`. It prints one JSON line, the last of its stdout.

Settings (JSON): `algo` (mappo, ippo; masac, isac, maddpg, iddpg; qmix, vdn, iql), `frames`, `seed`,
`threads`, and `sizes` (`marl.bench.train.Sizes` as a dict, for a smoke run; null keeps BenchMARL's).

The worker builds BenchMARL's `Experiment` from BenchMARL's own yaml defaults (`ExperimentConfig`, the
algorithm's config, `VmasTask.NAVIGATION` = 3 agents and max_steps 100, `MlpConfig` = 256x256 tanh for
actor and critic), reports them (`defaults`, which `marl.bench.train.check_defaults` compares with what
vecmarl's matched config assumes), and changes only what a benchmark must (`experiment_settings`). BenchMARL
picks the action space itself: continuous where the algorithm has it (`prefer_continuous_actions`),
discrete for QMIX, VDN and IQL; the output says which (`continuous_actions`).

It times `experiment.run()` (building the experiment, its envs, networks, buffers and collector is not
timed) and splits each iteration with callbacks:
- `collect_s`: from the end of the previous iteration's training (the run's start for the first) to
  `on_batch_collected`: the collector's rollout and BenchMARL's collection logging;
- `advantages_s` (on-policy only): the time in `algorithm.process_batch` (the critic over the batch,
  then GAE); off-policy, `process_batch` only reshapes rewards and dones and stays in `update_s`;
- `update_s`: from `on_batch_collected` to the last group's `on_train_end`, less `advantages_s`: the
  buffer fill and the optimiser steps (on-policy: `on_policy_n_minibatch_iters` minibatch passes;
  off-policy: `off_policy_n_optimizer_steps` steps, each sampling `off_policy_train_batch_size` frames),
  counted in `optimizer_steps` (every group's).
After the last `on_train_end` BenchMARL anneals exploration, updates the collector's policy weights and
commits its (empty) logs: that falls into the next iteration's `collect_s` and, for the last iteration,
into no phase but the total. `episode_return` is `experiment.mean_return` after each collection: the
mean, over the episodes that ended in the batch just collected, of the agents' mean episode return
(BenchMARL's progress bar; `collection/reward/episode_reward_mean`). `policy_std` is the mean scale of
a Gaussian policy (before the tanh) over that batch, a diagnostic (NaN for other policies).
"""

from __future__ import annotations

import json
import sys
import tempfile
import time

ON_POLICY = ("mappo", "ippo")
OFF_POLICY = ("masac", "isac", "maddpg", "iddpg", "qmix", "vdn", "iql")
ALGORITHM_CONFIGS = {
    "mappo": "MappoConfig",
    "ippo": "IppoConfig",
    "masac": "MasacConfig",
    "isac": "IsacConfig",
    "maddpg": "MaddpgConfig",
    "iddpg": "IddpgConfig",
    "qmix": "QmixConfig",
    "vdn": "VdnConfig",
    "iql": "IqlConfig",
}
# The ExperimentConfig fields reported as BenchMARL's defaults, for every algorithm and by family.
EXPERIMENT_FIELDS = (
    "lr", "gamma", "adam_eps", "clip_grad_norm", "clip_grad_val", "share_policy_params", "prefer_continuous_actions",
)  # fmt: skip
ON_POLICY_FIELDS = (
    "on_policy_collected_frames_per_batch", "on_policy_n_envs_per_worker", "on_policy_n_minibatch_iters",
    "on_policy_minibatch_size",
)  # fmt: skip
OFF_POLICY_FIELDS = (
    "off_policy_collected_frames_per_batch", "off_policy_n_envs_per_worker", "off_policy_n_optimizer_steps",
    "off_policy_train_batch_size", "off_policy_memory_size", "off_policy_init_random_frames",
    "off_policy_use_prioritized_replay_buffer", "soft_target_update", "polyak_tau", "exploration_eps_init",
    "exploration_eps_end", "exploration_anneal_frames",
)  # fmt: skip


def experiment_settings(settings: dict, save_folder: str) -> dict:
    """The `ExperimentConfig` fields the benchmark sets over BenchMARL's yaml: the run's length, CPU, no
    loggers, json, evaluation, rendering or checkpoints, a temporary save folder; with `sizes`, the
    batch, buffer and optimiser sizes of the algorithm's family."""
    fields = {
        "max_n_frames": settings["frames"],
        "sampling_device": "cpu",
        "train_device": "cpu",
        "buffer_device": "cpu",
        "loggers": [],
        "create_json": False,
        "evaluation": False,
        "render": False,
        "checkpoint_interval": 0,
        "checkpoint_at_end": False,
        "save_folder": save_folder,
    }
    sizes = settings.get("sizes")
    if sizes and settings["algo"] in ON_POLICY:
        fields |= {
            "on_policy_n_envs_per_worker": sizes["num_envs"],
            "on_policy_collected_frames_per_batch": sizes["num_envs"] * sizes["rollout_length"],
            "on_policy_n_minibatch_iters": sizes["epochs"],
            "on_policy_minibatch_size": sizes["minibatch_size"],
        }
    elif sizes:
        fields |= {
            "off_policy_n_envs_per_worker": sizes["num_envs"],
            "off_policy_collected_frames_per_batch": sizes["num_envs"] * sizes["rollout_length"],
            "off_policy_n_optimizer_steps": sizes["updates_per_iteration"],
            "off_policy_train_batch_size": sizes["batch_size"],
            "off_policy_memory_size": sizes["buffer_size"],
        }
    return fields


def reported_defaults(algo: str, experiment, algorithm, model, task_config: dict) -> dict:
    """BenchMARL's loaded defaults, as JSON: the experiment's fields of `algo`'s family, every field of
    the algorithm's config, the MLP's sizes and activation, the task's options."""
    family = ON_POLICY_FIELDS if algo in ON_POLICY else OFF_POLICY_FIELDS
    return {
        "experiment": {k: getattr(experiment, k) for k in EXPERIMENT_FIELDS + family},
        "algorithm": {k: v for k, v in vars(algorithm).items() if not k.startswith("_")},
        "model": {"num_cells": list(model.num_cells), "activation_class": model.activation_class.__name__},
        "task": dict(task_config),
    }


def iteration_rows(start: float, marks: list[dict], on_policy: bool) -> list[dict]:
    """Each iteration's phases from the callbacks' marks (`collected`, `trained`: clock readings;
    `process_s`: seconds in `process_batch`; `frames`, `optimizer_steps`, `episode_return`, `policy_std`)."""
    rows, previous = [], start
    for mark in marks:
        advantages = mark["process_s"] if on_policy else 0.0
        rows.append(
            {
                "frames": mark["frames"],
                "collect_s": mark["collected"] - previous,
                "advantages_s": advantages,
                "update_s": mark["trained"] - mark["collected"] - advantages,
                "optimizer_steps": mark["optimizer_steps"],
                "episode_return": mark["episode_return"],
                "policy_std": mark["policy_std"],
            }
        )
        previous = mark["trained"]
    return rows


class PhaseTimes:
    """BenchMARL's callback interface (`benchmarl.experiment.callback.Callback`, which it calls by name;
    not subclassed, so that this module imports without BenchMARL): one mark per iteration, filled in as
    `iteration_rows` reads them. Defined at the module's top level: BenchMARL pickles its callbacks."""

    def __init__(self, clock) -> None:
        self.clock, self.marks = clock, []

    def on_setup(self) -> None:
        process_batch = self.experiment.algorithm.process_batch

        def timed(group, batch):
            start = self.clock()
            out = process_batch(group, batch)
            self.marks[-1]["process_s"] += self.clock() - start
            return out

        self.experiment.algorithm.process_batch = timed

    def on_batch_collected(self, batch) -> None:
        import torch

        keys = batch.keys(True)
        scales = [batch[g, "scale"].mean() for g in self.experiment.group_map if (g, "scale") in keys]
        self.marks.append(
            {
                "collected": self.clock(),
                "frames": batch.numel(),
                "process_s": 0.0,
                "optimizer_steps": 0,
                "episode_return": float(self.experiment.mean_return),
                "policy_std": float(torch.stack(scales).mean()) if scales else float("nan"),
            }
        )

    def on_train_step(self, batch, group: str) -> None:
        self.marks[-1]["optimizer_steps"] += 1

    def on_train_end(self, training_td, group: str) -> None:
        self.marks[-1]["trained"] = self.clock()  # the last group's end

    def on_load_state_dict(self, state_dict: dict) -> None:
        pass

    def on_evaluation_end(self, rollouts: list) -> None:
        pass

    def on_state_dict(self, state_dict: dict) -> None:
        pass


def main(settings: dict) -> dict:
    import torch

    torch.set_num_threads(settings["threads"])
    import benchmarl
    import benchmarl.algorithms
    from benchmarl.environments import VmasTask
    from benchmarl.experiment import Experiment, ExperimentConfig
    from benchmarl.models.mlp import MlpConfig

    algo = settings["algo"]
    if algo not in ALGORITHM_CONFIGS:
        raise SystemExit(f"unknown algorithm {algo!r}; expected one of {', '.join(ALGORITHM_CONFIGS)}")

    config = ExperimentConfig.get_from_yaml()
    algorithm = getattr(benchmarl.algorithms, ALGORITHM_CONFIGS[algo]).get_from_yaml()
    task = VmasTask.NAVIGATION.get_from_yaml()
    model, critic_model = MlpConfig.get_from_yaml(), MlpConfig.get_from_yaml()
    defaults = reported_defaults(algo, config, algorithm, model, task.config)
    # BenchMARL writes its run folder here; removed when this process exits (mkdtemp left one per run).
    save_folder = tempfile.TemporaryDirectory(prefix="bench_benchmarl_")
    for field, value in experiment_settings(settings, save_folder.name).items():
        setattr(config, field, value)
    if settings.get("sizes"):
        model.num_cells = critic_model.num_cells = list(settings["sizes"]["hidden"])
    callback = PhaseTimes(clock=time.perf_counter)
    experiment = Experiment(
        task=task,
        algorithm_config=algorithm,
        model_config=model,
        critic_model_config=critic_model,
        seed=settings["seed"],
        config=config,
        callbacks=[callback],
    )
    start = time.perf_counter()
    experiment.run()
    seconds = time.perf_counter() - start
    return {
        "benchmarl": benchmarl.__version__,
        "torch": torch.__version__,
        "defaults": defaults,
        "continuous_actions": experiment.continuous_actions,
        "frames": experiment.total_frames,
        "seconds": seconds,
        "iterations": iteration_rows(start, callback.marks, algo in ON_POLICY),
    }


if __name__ == "__main__":
    print(json.dumps(main(json.loads(sys.argv[1]))))

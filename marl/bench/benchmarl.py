"""BenchMARL's side of `marl.bench.train`: one MAPPO or IPPO run on VMAS navigation, in another Python.

torchrl and BenchMARL are not vecmarl dependencies and are never imported in vecmarl's process:
`run_benchmarl` starts `python -c PEER_SCRIPT SETTINGS_JSON` with a Python that has them (torchrl 0.11,
benchmarl 1.5, vmas) and reads one JSON line back from its stdout.

The worker builds BenchMARL's `Experiment` from BenchMARL's own yaml defaults
(`MappoConfig`/`IppoConfig.get_from_yaml()`, `VmasTask.NAVIGATION.get_from_yaml()` = 3 agents,
max_steps 100, `MlpConfig.get_from_yaml()` = 256x256 tanh for actor and critic,
`ExperimentConfig.get_from_yaml()`), changes only what a benchmark must change (`max_n_frames`, CPU
devices, no loggers, no json, no evaluation, no rendering, no checkpoints, a temporary save folder,
the seed), and with `sizes` (the smoke test's `--quick`) also the batch, epoch, minibatch and network
sizes. It times `experiment.run()` (building the experiment, its envs, networks and collector is not
timed) and splits each iteration with a callback:
- `collect_s`: from the end of the previous iteration's training (the run's start for the first) to
  `on_batch_collected`, so it holds the collector's rollout and BenchMARL's collection logging;
- `advantages_s`: the time in `algorithm.process_batch` (the critic over the batch, then GAE);
- `update_s`: from `on_batch_collected` to `on_train_end`, less `advantages_s` (the replay buffer
  fill and `on_policy_n_minibatch_iters` passes of minibatch optimiser steps).
After `on_train_end` BenchMARL updates the collector's policy weights and commits its (empty) logs:
that falls into the next iteration's `collect_s` and, for the last iteration, into no phase but the
total. `episode_return` is `experiment.mean_return` after each collection: the mean, over the episodes
that ended in the batch just collected, of the agents' mean episode return (what BenchMARL's progress
bar shows and logs as `collection/reward/episode_reward_mean`). `policy_std` is the mean scale of
the policy's Gaussian (before the tanh) over that batch, a diagnostic.
"""

from __future__ import annotations

import json
import subprocess

PEER_SCRIPT = r"""
import json, sys, tempfile, time
import torch

a = json.loads(sys.argv[1])
torch.set_num_threads(a["threads"])
import benchmarl
from benchmarl.algorithms import IppoConfig, MappoConfig
from benchmarl.environments import VmasTask
from benchmarl.experiment import Experiment, ExperimentConfig
from benchmarl.experiment.callback import Callback
from benchmarl.models.mlp import MlpConfig


class PhaseTimes(Callback):
    def __init__(self):
        super().__init__()
        self.marks, self.advantages = [], 0.0

    def on_setup(self):
        process_batch = self.experiment.algorithm.process_batch

        def timed(group, batch):
            start = time.perf_counter()
            out = process_batch(group, batch)
            self.advantages += time.perf_counter() - start
            return out

        self.experiment.algorithm.process_batch = timed

    def on_batch_collected(self, batch):
        self.collected, self.frames, self.advantages = time.perf_counter(), batch.numel(), 0.0
        self.episode_return = float(self.experiment.mean_return)
        scales = [batch[g, "scale"].mean() for g in self.experiment.group_map if (g, "scale") in batch.keys(True)]
        self.policy_std = float(torch.stack(scales).mean()) if scales else float("nan")

    def on_train_end(self, training_td, group):
        self.marks.append(
            (self.collected, time.perf_counter(), self.advantages, self.frames, self.episode_return, self.policy_std)
        )


config = ExperimentConfig.get_from_yaml()
algorithm = {"mappo": MappoConfig, "ippo": IppoConfig}[a["algo"]].get_from_yaml()
task = VmasTask.NAVIGATION.get_from_yaml()
model, critic_model = MlpConfig.get_from_yaml(), MlpConfig.get_from_yaml()
defaults = {
    "experiment": {k: getattr(config, k) for k in (
        "on_policy_collected_frames_per_batch", "on_policy_n_envs_per_worker", "on_policy_n_minibatch_iters",
        "on_policy_minibatch_size", "lr", "gamma", "adam_eps", "clip_grad_norm", "clip_grad_val",
        "share_policy_params", "prefer_continuous_actions")},
    "algorithm": {k: getattr(algorithm, k) for k in (
        "share_param_critic", "clip_epsilon", "entropy_coef", "critic_coef", "loss_critic_type", "lmbda",
        "scale_mapping", "use_tanh_normal", "minibatch_advantage")},
    "model": {"num_cells": list(model.num_cells), "activation_class": model.activation_class.__name__},
    "task": dict(task.config),
}
config.max_n_frames = a["frames"]
config.sampling_device = config.train_device = config.buffer_device = "cpu"
config.loggers, config.create_json = [], False
config.evaluation, config.render = False, False
config.checkpoint_interval, config.checkpoint_at_end = 0, False
# BenchMARL writes its run folder here; removed when this process exits (mkdtemp left one per run).
save_folder = tempfile.TemporaryDirectory(prefix="bench_benchmarl_")
config.save_folder = save_folder.name
sizes = a.get("sizes")
if sizes:
    config.on_policy_n_envs_per_worker = sizes["num_envs"]
    config.on_policy_collected_frames_per_batch = sizes["num_envs"] * sizes["rollout_length"]
    config.on_policy_n_minibatch_iters = sizes["epochs"]
    config.on_policy_minibatch_size = sizes["minibatch_size"]
    model.num_cells = critic_model.num_cells = list(sizes["hidden"])
callback = PhaseTimes()
experiment = Experiment(task=task, algorithm_config=algorithm, model_config=model, critic_model_config=critic_model,
                        seed=a["seed"], config=config, callbacks=[callback])
start = time.perf_counter()
experiment.run()
seconds = time.perf_counter() - start
iterations, previous = [], start
for collected, end, advantages, frames, episode_return, policy_std in callback.marks:
    iterations.append({"frames": frames, "collect_s": collected - previous, "advantages_s": advantages,
                       "update_s": end - collected - advantages, "episode_return": episode_return,
                       "policy_std": policy_std})
    previous = end
print(json.dumps({"benchmarl": benchmarl.__version__, "torch": torch.__version__, "defaults": defaults,
                  "frames": experiment.total_frames, "seconds": seconds, "iterations": iterations}))
"""


def run_benchmarl(
    python: str,
    algo: str,
    frames: int,
    seed: int,
    threads: int,
    sizes: dict | None = None,
    timeout_s: float = 3600.0,
) -> dict:
    """One BenchMARL run with `python`; returns the worker's JSON (see the module docstring).

    `sizes` (`num_envs`, `rollout_length`, `epochs`, `minibatch_size`, `hidden`) replaces BenchMARL's
    defaults for a smoke run; None keeps them.
    """
    settings = {"algo": algo, "frames": frames, "seed": seed, "threads": threads, "sizes": sizes}
    try:
        done = subprocess.run(
            [python, "-c", PEER_SCRIPT, json.dumps(settings)],
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
    except FileNotFoundError as error:
        raise FileNotFoundError(
            f"the BenchMARL interpreter {python!r} was not found; give a Python with benchmarl"
        ) from error
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        raise RuntimeError(
            f"the BenchMARL run ({algo}, seed {seed}) with {python} failed (exit {done.returncode}):\n"
            f"{done.stderr[-3000:]}"
        )
    return json.loads(lines[-1])

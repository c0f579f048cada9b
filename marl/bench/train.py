"""Training throughput and return: `marl train` against BenchMARL, equal work, measured in the same run.

    python -m marl.bench.train --threads 1                                   # vecmarl only
    python -m marl.bench.train --threads 1 --peer-python /work/peers/benchmarl/bin/python --json bench.json
    python -m marl.bench.train --threads 1 --peer-python PATH --algos masac maddpg --envs vmas/navigation \
        --frames 60000 --repeats 5 --default-iterations 0                 # off-policy, once registered

Two tables.

1. One iteration, split into phases (issue 4): collect / advantages / update seconds and frames/s,
   the median over every iteration of every repeat, for
   - vecmarl's default `marl train` config (`TrainConfig()`) on `navigation`, MAPPO and IPPO;
   - vecmarl with BenchMARL's default MAPPO/IPPO settings on `vmas/navigation` (the VMAS adapter) and on
     the native `navigation`, and BenchMARL itself on VMAS navigation.
2. Equal work (issue 6): frames/s over a whole run of `--frames` frames and the mean episode return at
   its end, vecmarl's runs against BenchMARL's, with the ratio to BenchMARL's frames/s from this run;
   also each run's first iteration (its one-off costs) and the ratio of the median iterations.

`--modes eager compile` also runs vecmarl as `marl train --compile` (rows marked so). Compiling
happens in the first iteration of each run: the whole-run frames/s include it, so it pays off only
over runs long enough (BenchMARL's own default run is 3M frames; try `--frames 120000`). Each compiled
run starts in a fresh process, as `marl train --compile` does, with torch's compile cache on disk as
earlier runs left it: in one process, a run after the first would reuse its compiled code and pay
almost nothing.

Settings. BenchMARL runs from its own yaml defaults (checked at run time, a mismatch is printed):
6000 frames per batch from 10 envs (rollout length 600), 45 passes (`on_policy_n_minibatch_iters`) over
minibatches of 400 frames, MLP 256x256 tanh with parameters shared by the agents for actor and critic,
lr 5e-5, gamma 0.99, GAE lambda 0.9, clip epsilon 0.2, no entropy bonus, no advantage normalisation,
no value clipping, an l2 critic loss with weight 1, gradient norms clipped to 5, Adam eps 1e-6; VMAS
navigation with 3 agents, max_steps 100, `shared_rew=False`. vecmarl's config says the same with its
own fields (`benchmarl_config`): `value_coef=2` because vecmarl's value loss is `0.5 * mean(err^2)`;
`max_grad_norm=5` (both clip the actor's and the critic's gradients apart), `adam_eps=1e-6`
(vecmarl's default 1e-5 damps the small gradients of unnormalised advantages: 30k frames then end at a
clearly lower return), `normalize_value=False`, and for MAPPO `shared_value=True`: like BenchMARL's, the
critic gives one value per env from the concatenated observations, and `std="state"`: the policy
outputs its std through a biased softplus starting at 1, like BenchMARL's (`biased_softplus_1.0`).
What vecmarl cannot say with its config, and so differs: weights are initialised differently
(vecmarl: orthogonal, policy output gain 0.01; BenchMARL: torch's default). The native `navigation`
gets the same task options (`shared_reward=False`, spawning in [-1, 1]^2 as VMAS's default).

Off-policy algorithms (MASAC, ISAC, MADDPG, IDDPG; QMIX, VDN, IQL), each offered by `--algos` once it is
registered in vecmarl: BenchMARL's yaml defaults (checked at run time like PPO's) are 6000 frames per
iteration from 10 envs, then 1000 optimiser steps (`off_policy_n_optimizer_steps`), each on 128 frames
sampled uniformly from a buffer of 1M frames, no random warm-up frames, Polyak tau 0.005, gamma 0.99, lr
5e-5, Adam eps 1e-6, gradient norms clipped to 5, MLP 256x256 tanh with parameters shared by the agents;
MADDPG/IDDPG explore with Gaussian noise, QMIX/VDN/IQL epsilon-greedy, both annealed 0.8 -> 0.01 over
the first third of the run; MASAC/ISAC start at alpha 1 with the entropy target "auto". BenchMARL runs
MASAC and MADDPG with continuous actions and QMIX, VDN and IQL with discrete ones (it picks them itself);
vecmarl's value-based rows run on `vmas/navigation` with `continuous_actions=False` (the native
`navigation` has continuous actions only). vecmarl's config takes them by field name
(`off_policy_settings`, `marl.algorithms.config_class`): a field it must have and lacks is an error,
one it may lack (Adam's eps, alpha's start, the epsilon schedule, QMIX's mixer width) is a warning
printed before the runs. Table 1 adds the seconds per optimiser step (`update_s / optimiser steps`).

What is measured, on both sides alike:
- a run starts from the first frame of a fresh trainer / `Experiment` and does `--frames` frames
  (whole iterations), with the seed of its repeat (repeat `i` uses seed `i` on every side);
- timed: every iteration, collect + advantages + update (+ vecmarl's one host sync of the metrics,
  BenchMARL's collection logging and policy-weights update); not timed: process start and imports,
  building the env(s), networks, optimisers and collector, the first reset. No evaluation, no CSV,
  TensorBoard, wandb or json logging, no checkpoints, no progress bar on the vecmarl side (BenchMARL's
  tqdm bar writes to a pipe);
- frames/s = frames / timed seconds; a frame is one env step of all agents (BenchMARL counts the same:
  `batch.numel()` of its `[envs, steps]` batch);
- return = the mean, over the episodes that ended in the last collected batch, of the agents' mean
  episode return (vecmarl: the last row's `agent/episode_return`; BenchMARL: `experiment.mean_return`,
  which its progress bar shows). That batch was collected by the policy trained on `frames - 6000`
  frames on both sides;
- each figure is the median over `--repeats`; the sides take turns run by run so that load from
  other processes hits them alike. vecmarl runs in this process; BenchMARL in a subprocess of
  `--peer-python` (see `marl.bench.benchmarl_worker` for how its phases are split);
- before each run, the process's float32 matmul rate (`matmul_gflops`, printed with the run): on a
  shared virtual machine it swings by up to 1.6x within minutes, invisible in the load average, and
  a slow matmul lengthens vecmarl's runs by a larger fraction than BenchMARL's.
"""

from __future__ import annotations

import argparse
import dataclasses
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from kernels.bench.gae import median_seconds
from kernels.bench.options import check_peer_python, checked, json_text, positive_int
from marl import algorithms
from marl.algorithms.ppo import PPOConfig
from marl.app.paths import check_output_file
from marl.bench.benchmarl import run_benchmarl
from marl.bench.benchmarl_worker import OFF_POLICY, ON_POLICY
from marl.config import AlgorithmConfig, EnvSettings, ModelConfig, RunConfig, TrainConfig, field_names

ENVS = ("vmas/navigation", "navigation")
ALGOS = ON_POLICY + OFF_POLICY  # those BenchMARL runs; `--algos` offers the ones registered in vecmarl
DISCRETE = ("qmix", "vdn", "iql")  # value-based: discrete actions only
PHASES = ("collect_s", "advantages_s", "update_s")


@dataclass(frozen=True)
class Sizes:
    """The sizes of a matched run, shared by both sides (each algorithm uses its family's)."""

    num_envs: int
    rollout_length: int
    epochs: int  # on-policy: passes over each iteration's frames
    minibatch_size: int
    updates_per_iteration: int  # off-policy: optimiser steps per iteration
    batch_size: int  # frames sampled per optimiser step
    buffer_size: int  # frames the replay buffer holds
    hidden: tuple[int, ...]


BENCHMARL_SIZES = Sizes(
    num_envs=10,
    rollout_length=600,
    epochs=45,
    minibatch_size=400,
    updates_per_iteration=1000,
    batch_size=128,
    buffer_size=1_000_000,
    hidden=(256, 256),
)
QUICK_SIZES = Sizes(
    num_envs=2,
    rollout_length=100,
    epochs=1,
    minibatch_size=100,
    updates_per_iteration=4,
    batch_size=32,
    buffer_size=10_000,
    hidden=(32, 32),
)

# BenchMARL's VMAS navigation task (its yaml), in the options of vecmarl's two envs.
TASK_OPTIONS = {
    "vmas/navigation": {"n_agents": 3, "max_steps": 100, "shared_rew": False},
    "navigation": {"n_agents": 3, "max_steps": 100, "shared_reward": False, "spawn_half_width": 1.0},
}
# BenchMARL's yaml defaults that `benchmarl_config` reproduces; the worker reports the real ones.
EXPECTED_EXPERIMENT = {
    "lr": 5e-5,
    "adam_eps": 1e-6,
    "gamma": 0.99,
    "clip_grad_norm": True,
    "clip_grad_val": 5,
    "share_policy_params": True,
    "prefer_continuous_actions": True,
}
EXPECTED_ON_POLICY = {
    "on_policy_collected_frames_per_batch": 6000,
    "on_policy_n_envs_per_worker": 10,
    "on_policy_n_minibatch_iters": 45,
    "on_policy_minibatch_size": 400,
}
EXPECTED_OFF_POLICY = {
    "off_policy_collected_frames_per_batch": 6000,
    "off_policy_n_envs_per_worker": 10,
    "off_policy_n_optimizer_steps": 1000,
    "off_policy_train_batch_size": 128,
    "off_policy_memory_size": 1_000_000,
    "off_policy_init_random_frames": 0,
    "off_policy_use_prioritized_replay_buffer": False,
    "soft_target_update": True,
    "polyak_tau": 0.005,
    "exploration_eps_init": 0.8,
    "exploration_eps_end": 0.01,
    "exploration_anneal_frames": None,  # a third of the run
}
EXPECTED_PPO = {
    "share_param_critic": True,
    "clip_epsilon": 0.2,
    "entropy_coef": 0.0,
    "critic_coef": 1.0,
    "loss_critic_type": "l2",
    "lmbda": 0.9,
    "use_tanh_normal": True,
    "scale_mapping": "biased_softplus_1.0",
    "minibatch_advantage": False,
}
EXPECTED_SAC = {
    "share_param_critic": True,
    "num_qvalue_nets": 2,
    "loss_function": "l2",
    "delay_qvalue": True,
    "target_entropy": "auto",
    "alpha_init": 1.0,
    "fixed_alpha": False,
    "scale_mapping": "biased_softplus_1.0",
    "use_tanh_normal": True,
}
EXPECTED_DDPG = {"share_param_critic": True, "loss_function": "l2", "delay_value": True, "use_tanh_mapping": True}
EXPECTED_Q = {"delay_value": True, "loss_function": "l2"}
EXPECTED_ALGORITHM = {
    "mappo": EXPECTED_PPO,
    "ippo": EXPECTED_PPO,
    "masac": EXPECTED_SAC,
    "isac": EXPECTED_SAC,
    "maddpg": EXPECTED_DDPG,
    "iddpg": EXPECTED_DDPG,
    "qmix": EXPECTED_Q | {"mixing_embed_dim": 32},
    "vdn": EXPECTED_Q,
    "iql": EXPECTED_Q,
}


def expected_defaults(algo: str) -> dict:
    """BenchMARL's yaml defaults that vecmarl's config for `algo` (`benchmarl_config`) assumes."""
    family = EXPECTED_ON_POLICY if algo in ON_POLICY else EXPECTED_OFF_POLICY
    return {
        "experiment": EXPECTED_EXPERIMENT | family,
        "algorithm": EXPECTED_ALGORITHM[algo],
        "model": {"num_cells": [256, 256], "activation_class": "Tanh"},
        "task": {"n_agents": 3, "max_steps": 100, "shared_rew": False},
    }


def benchmarl_config(
    env: str,
    algo: str,
    frames: int,
    seed: int,
    sizes: Sizes = BENCHMARL_SIZES,
    compile: bool = False,
    overlap: bool = False,
) -> TrainConfig:
    """vecmarl's `TrainConfig` for BenchMARL's default settings of `algo` on `env` (`compile`: as
    `marl train --compile`; `overlap`: and `--overlap-critic`, PPO only)."""
    env_options = dict(TASK_OPTIONS[env])
    if algo in DISCRETE:
        if env != "vmas/navigation":
            raise ValueError(f"{algo} needs discrete actions; of the benchmark's envs only vmas/navigation has them")
        env_options["continuous_actions"] = False
    if algo in ON_POLICY:
        algo_config = PPOConfig(
            algo=algo,
            lr=5e-5,
            adam_eps=1e-6,
            gamma=0.99,
            lmbda=0.9,
            epochs=sizes.epochs,
            minibatch_size=sizes.minibatch_size,
            clip_eps=0.2,
            clip_value=False,
            entropy_coef=0.0,
            value_coef=2.0,  # torchrl's l2 critic loss is mean(err^2); vecmarl's is 0.5 * value_coef * mean(err^2)
            max_grad_norm=5.0,
            normalize_advantage=False,
            normalize_value=False,  # BenchMARL's critic learns raw returns
            shared_value=algo == "mappo",  # BenchMARL's MAPPO critic: one value per env from all observations
            overlap_critic=overlap,
        )
    elif overlap:
        raise ValueError(f"overlap (--overlap-critic) is PPO's; {algo} has no such option")
    else:
        algo_config = off_policy_config(algo, sizes)
    # BenchMARL's PPO and SAC policies output their std through a biased softplus starting at 1 (`scale_mapping`).
    std = "state" if algo in ON_POLICY + ("masac", "isac") else ModelConfig.std
    return TrainConfig(
        env=EnvSettings(env=env, num_envs=sizes.num_envs, env_options=env_options),
        algo=algo_config,
        model=ModelConfig(hidden=sizes.hidden, activation="tanh", share_params=True, std=std),
        run=_run_config(frames, sizes.rollout_length, seed, compile),
    )


def off_policy_settings(algo: str, sizes: Sizes = BENCHMARL_SIZES) -> tuple[dict, dict]:
    """BenchMARL's default settings of the off-policy `algo` in the field names of vecmarl's config:
    (fields it must have, fields it may lack). Frames per iteration are the run's
    (`num_envs * rollout_length`); exploration is annealed over a third of `total_frames` as BenchMARL's."""
    required = {
        "lr": 5e-5,
        "gamma": 0.99,
        "tau": 0.005,
        "buffer_size": sizes.buffer_size,
        "batch_size": sizes.batch_size,
        "updates_per_iteration": sizes.updates_per_iteration,
        "warmup_frames": 0,
        "prioritized": False,
        "max_grad_norm": 5.0,
    }
    optional = {"adam_eps": 1e-6}
    if algo in ("masac", "isac", "maddpg", "iddpg"):
        # BenchMARL's MA* critics see every agent's observation and action and give one value per env.
        centralised = algo.startswith("ma")
        required |= {"critic_scope": "global" if centralised else "agent", "shared_value": centralised}
    if algo in ("masac", "isac"):
        optional |= {"alpha_init": 1.0}
    if algo in ("maddpg", "iddpg"):
        required |= {"exploration_sigma_init": 0.8, "exploration_sigma_end": 0.01, "exploration_anneal": 1 / 3}
    if algo in DISCRETE:
        # TorchRL's DQN and QMixer losses, which BenchMARL's use, default to double_dqn=False.
        optional |= {
            "exploration_eps_init": 0.8,
            "exploration_eps_end": 0.01,
            "exploration_anneal": 1 / 3,
            "double_q": False,
        }
    if algo == "qmix":
        optional |= {"mixing_embed_dim": 32}
    return required, optional


def off_policy_config(algo: str, sizes: Sizes = BENCHMARL_SIZES) -> AlgorithmConfig:
    """vecmarl's config of the registered off-policy `algo` with BenchMARL's settings, set by field name
    (`off_policy_settings`); those it may lack and lacks are left at vecmarl's defaults
    (`unmatched_settings` names them)."""
    config_class = algorithms.config_class(algo)
    required, optional = off_policy_settings(algo, sizes)
    fields = field_names(config_class)
    missing = [name for name in required if name not in fields]
    if missing:
        raise ValueError(
            f"{config_class.__qualname__} (--algo {algo}) has no field(s) {', '.join(missing)}, which BenchMARL's "
            f"settings need ({', '.join(f'{k}={required[k]!r}' for k in missing)}); rename them in "
            "marl.bench.train.off_policy_settings to the config's names"
        )
    return config_class(algo=algo, **required, **{k: v for k, v in optional.items() if k in fields})


def unmatched_settings(algo: str) -> list[str]:
    """BenchMARL's settings of the off-policy `algo` that vecmarl's config has no field for."""
    if algo in ON_POLICY:
        return []
    _, optional = off_policy_settings(algo)
    fields = field_names(algorithms.config_class(algo))
    return [
        f"{algo}: vecmarl's config has no field {name!r}: BenchMARL's {value!r} is not matched (vecmarl's default runs)"
        for name, value in optional.items()
        if name not in fields
    ]


# `--quick` default rows: the sizes the algorithm's config has of these.
QUICK_DEFAULTS = {"epochs": 1, "minibatch_size": 128, "updates_per_iteration": 4, "batch_size": 32, "buffer_size": 4096}


def default_config(algo: str, iterations: int, seed: int, quick: bool = False) -> TrainConfig:
    """A bare `marl train --algo ALGO` (the algorithm's defaults) on `navigation`, for `iterations` iterations."""
    config = TrainConfig(algo=algorithms.default_config(algo))
    if quick:
        sizes = {k: v for k, v in QUICK_DEFAULTS.items() if k in field_names(type(config.algo))}
        config = TrainConfig(
            env=EnvSettings(num_envs=16),
            algo=dataclasses.replace(config.algo, **sizes),
            model=ModelConfig(hidden=(32, 32)),
            run=RunConfig(rollout_length=16),
        )
    frames = iterations * config.env.num_envs * config.run.rollout_length
    return dataclasses.replace(config, run=_run_config(frames, config.run.rollout_length, seed))


def _run_config(frames: int, rollout_length: int, seed: int, compile: bool = False) -> RunConfig:
    return RunConfig(
        total_frames=frames,
        rollout_length=rollout_length,
        seed=seed,
        device="cpu",
        progress=False,
        tensorboard=False,
        compile=compile,
    )


def run_vecmarl(config: TrainConfig) -> dict:
    """Train `config` from its first frame to `total_frames` (whole iterations), timing the iterations
    only; returns the run's frames, seconds and per-iteration phases and returns."""
    from marl.app.trainer import Trainer

    with tempfile.TemporaryDirectory(prefix="bench_train_") as run_dir:
        trainer = Trainer(config, run_dir=run_dir)  # nothing is written: no logger, no checkpoint
        groups = list(trainer.env.groups)
        steps = getattr(config.algo, "updates_per_iteration", None)  # off-policy: per iteration, every group's at once
        iterations = []
        start = time.perf_counter()
        while trainer.frames < config.run.total_frames:
            std = policy_std(trainer)  # of the policy that collects this iteration's batch
            row = trainer.train_iteration()
            iterations.append(
                {
                    "frames": trainer.frames_per_iteration,
                    **{phase: row.get(phase, 0.0) for phase in PHASES},  # off-policy: no advantages_s
                    "optimizer_steps": steps,
                    "episode_return": statistics.fmean(row[f"{g}/episode_return"] for g in groups),
                    "policy_std": std,
                }
            )
        seconds = time.perf_counter() - start
    return {"frames": trainer.frames, "seconds": seconds, "iterations": iterations}


def policy_std(trainer) -> float:
    """The mean standard deviation (before the tanh) of the continuous policies with a learned
    state-independent std, a diagnostic; NaN if none (a state-dependent std has no single value)."""
    stds = [
        policy.log_std.detach().exp().mean()
        for policy in trainer.algorithm.acting.policies.values()
        if hasattr(policy, "log_std")
    ]
    return float(torch.stack(stds).mean()) if stds else float("nan")


@dataclass
class Case:
    """One row of the tables: a side, an env and an algorithm, run once per repeat."""

    name: str
    side: str  # "vecmarl" or "BenchMARL"
    env: str
    algo: str
    settings: str  # "default" or "BenchMARL"
    compile: bool = False  # vecmarl with `marl train --compile`
    overlap: bool = False  # and `--overlap-critic`
    runs: list[dict] = dataclasses.field(default_factory=list)

    def summary(self) -> dict:
        iterations = [it for run in self.runs for it in run["iterations"]]
        phases = {p: statistics.median(it[p] for it in iterations) for p in PHASES}
        iteration_s = sum(phases.values())
        frames_per_iteration = iterations[0]["frames"]
        # The first iteration of a run holds its one-off costs: with --compile, compiling.
        first_s = statistics.median(sum(run["iterations"][0][p] for p in PHASES) for run in self.runs)
        step_s = None  # off-policy: the update's seconds per optimiser step
        if self.algo in OFF_POLICY and all(it.get("optimizer_steps") for it in iterations):
            step_s = statistics.median(it["update_s"] / it["optimizer_steps"] for it in iterations)
        return {
            "name": self.name,
            "side": self.side,
            "env": self.env,
            "algo": self.algo,
            "settings": self.settings,
            "compile": self.compile,
            "overlap": self.overlap,
            "frames_per_iteration": frames_per_iteration,
            **phases,
            "iteration_s": iteration_s,
            "iteration_frames_per_s": frames_per_iteration / iteration_s,
            "optimizer_step_s": step_s,
            "first_iteration_s": first_s,
            "frames": self.runs[0]["frames"],
            "frames_per_s": statistics.median(r["frames"] / r["seconds"] for r in self.runs),
            "episode_return": statistics.median(r["iterations"][-1]["episode_return"] for r in self.runs),
            "episode_returns": [r["iterations"][-1]["episode_return"] for r in self.runs],
            "repeats": len(self.runs),
        }


def matmul_gflops(repeats: int = 30) -> float:
    """This process's float32 matmul rate now, GFLOP/s: the median of `repeats` timed products of
    `[1200, 256] x [256, 256]`, the shape of most of the update's arithmetic (400 frames x 3 agents
    through a 256-wide layer). On a shared virtual machine the host's other work changes it by up to
    1.6x within minutes without showing in the VM's load average; printed before each run, it tells
    which runs met a slow machine. Both sides do the same matmuls, so a slow matmul lengthens
    vecmarl's runs by a larger fraction than BenchMARL's, whose other work is twice as long."""
    generator = torch.Generator().manual_seed(0)
    a, b = torch.randn(1200, 256, generator=generator), torch.randn(256, 256, generator=generator)
    (seconds,) = median_seconds({"matmul": lambda: a @ b}, repeats, torch.device("cpu")).values()
    return 2 * 1200 * 256 * 256 / seconds / 1e9


def check_defaults(run: dict, algo: str) -> list[str]:
    """Where a BenchMARL run of `algo` differs from what `benchmarl_config` assumes: its loaded yaml
    defaults (`run["defaults"]`) and its action space (`run["continuous_actions"]`)."""
    reported = run["defaults"]
    mismatches = [
        f"BenchMARL {algo} {section}.{key} = {reported[section].get(key)!r}, vecmarl's matched config assumes {value!r}"
        for section, expected in expected_defaults(algo).items()
        for key, value in expected.items()
        if reported[section].get(key) != value
    ]
    continuous = algo not in DISCRETE
    if run["continuous_actions"] != continuous:
        mismatches.append(
            f"BenchMARL ran {algo} with {'continuous' if run['continuous_actions'] else 'discrete'} actions, "
            f"vecmarl's matched config has {'continuous' if continuous else 'discrete'} ones"
        )
    return mismatches


def print_tables(rows: list[dict]) -> None:
    print("\n1. one iteration (median over iterations): seconds per phase and frames/s")
    header = (
        f"{'run':<46}{'frames/iter':>12}{'collect':>9}{'advant.':>9}{'update':>9}{'iter':>9}{'frames/s':>10}"
        f"{'ms/opt step':>13}"
    )
    print(header)
    print("-" * len(header))
    for r in rows:
        step = f"{1e3 * r['optimizer_step_s']:>13.2f}" if r.get("optimizer_step_s") else f"{'-':>13}"
        print(
            f"{r['name']:<46}{r['frames_per_iteration']:>12,}{r['collect_s']:>9.3f}{r['advantages_s']:>9.3f}"
            f"{r['update_s']:>9.3f}{r['iteration_s']:>9.3f}{r['iteration_frames_per_s']:>10,.0f}{step}"
        )
    matched = [r for r in rows if r["settings"] == "BenchMARL"]
    if not matched:
        return
    print("\n2. equal work, BenchMARL's settings: whole runs from the first frame (median over repeats)")
    header = (
        f"{'run':<46}{'frames':>9}{'1st iter':>10}{'frames/s':>10}{'vs BenchMARL':>14}{'per iter':>10}"
        f"{'return':>9}{'BenchMARL return':>18}"
    )
    print(header)
    print("-" * len(header))
    peer = {r["algo"]: r for r in matched if r["side"] == "BenchMARL"}
    for r in matched:
        theirs = peer.get(r["algo"])
        if theirs:
            ratio = f"{r['frames_per_s'] / theirs['frames_per_s']:>13.2f}x"
            per_iteration = f"{r['iteration_frames_per_s'] / theirs['iteration_frames_per_s']:>9.2f}x"
            their_return = f"{theirs['episode_return']:>18.3f}"
        else:
            ratio, per_iteration, their_return = f"{'-':>14}", f"{'-':>10}", f"{'-':>18}"
        print(
            f"{r['name']:<46}{r['frames']:>9,}{r['first_iteration_s']:>9.1f}s{r['frames_per_s']:>10,.0f}{ratio}"
            f"{per_iteration}{r['episode_return']:>9.3f}{their_return}"
        )


def cannot_run(algo: str, env: str) -> str | None:
    """Why vecmarl's `algo` does not run on `env` in this benchmark, or None."""
    if algo in DISCRETE and env != "vmas/navigation":
        return f"{algo} acts discretely; {env} has continuous actions only (vmas/navigation has both)"
    return None


def build_cases(args: argparse.Namespace) -> list[Case]:
    cases = []
    for algo in args.algos:
        if args.peer_python:
            cases.append(
                Case(f"BenchMARL {algo.upper()} vmas navigation", "BenchMARL", "vmas/navigation", algo, "BenchMARL")
            )
        for env in args.envs:
            if cannot_run(algo, env):
                continue
            if "eager" in args.modes:
                cases.append(Case(f"vecmarl {algo.upper()} {env}", "vecmarl", env, algo, "BenchMARL"))
            if "compile" in args.modes:
                name = f"vecmarl {algo.upper()} {env} --compile"
                cases.append(Case(name, "vecmarl", env, algo, "BenchMARL", compile=True))
            if "overlap" in args.modes and algo in ON_POLICY:
                name = f"vecmarl {algo.upper()} {env} --compile --overlap-critic"
                cases.append(Case(name, "vecmarl", env, algo, "BenchMARL", compile=True, overlap=True))
    if args.default_iterations:
        for algo in args.algos:
            if cannot_run(algo, "navigation"):
                continue
            cases.append(Case(f"vecmarl default {algo.upper()} navigation", "vecmarl", "navigation", algo, "default"))
    return cases


def run_case(case: Case, args: argparse.Namespace, seed: int, threads: int) -> dict:
    sizes = QUICK_SIZES if args.quick else BENCHMARL_SIZES
    if case.side == "BenchMARL":
        return run_benchmarl(
            args.peer_python, case.algo, args.frames, seed, threads, dataclasses.asdict(sizes) if args.quick else None
        )
    if case.settings == "default":
        return run_vecmarl(default_config(case.algo, args.default_iterations, seed, args.quick))
    config = benchmarl_config(case.env, case.algo, args.frames, seed, sizes, case.compile, case.overlap)
    return run_in_fresh_process(config) if case.compile else run_vecmarl(config)


def run_in_fresh_process(config: TrainConfig) -> dict:
    """`run_vecmarl(config)` in a new interpreter, as a `marl train` command runs: a compiled run then
    compiles as a user's would (from torch's compile cache on disk), not reusing this process's."""
    pool = multiprocessing.get_context("spawn").Pool(1)
    try:
        return pool.apply(run_vecmarl, (config,))
    finally:  # closed and joined, not terminated (as `with` does): that left a semaphore to warn about
        pool.close()
        pool.join()


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(
        prog="python -m marl.bench.train", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--frames", type=positive_int, default=30_000, help="frames per run with BenchMARL's settings")
    parser.add_argument(
        "--repeats", type=positive_int, default=1, help="runs per row (seeds 0..N-1); medians are reported"
    )
    parser.add_argument(
        "--threads", type=positive_int, default=None, help="torch threads for every side (default: torch's)"
    )
    parser.add_argument(
        "--peer-python", default=None, help="a Python with benchmarl 1.5, torchrl 0.10 or 0.11 and vmas"
    )
    registered = [algo for algo in ALGOS if algo in algorithms.names()]
    later = [algo for algo in ALGOS if algo not in registered]
    parser.add_argument(
        "--algos",
        nargs="+",
        metavar="ALGO",
        default=[algo for algo in ON_POLICY if algo in registered],
        help=f"algorithms to run, on both sides: {', '.join(registered)} (default: the PPO ones)"
        + (f"; BenchMARL's {', '.join(later)} once registered in vecmarl" if later else ""),
    )
    parser.add_argument(
        "--envs",
        nargs="+",
        choices=ENVS,
        default=list(ENVS),
        help="vecmarl envs to run (QMIX, VDN, IQL: vmas/navigation only)",
    )
    parser.add_argument(
        "--default-iterations",
        type=int,
        default=3,
        help="iterations of the rows with vecmarl's own defaults for each algorithm on navigation (0 skips them)",
    )
    parser.add_argument(
        "--modes",
        nargs="+",
        choices=("eager", "compile", "overlap"),
        default=["eager"],
        help="how vecmarl runs: eager, and/or as `marl train --compile` (rows marked --compile; each such run in a "
        "fresh process, its compiling in its first iteration, which the whole-run frames/s include), and/or as "
        "`marl train --compile --overlap-critic` (the critics' update beside the next collection; PPO only)",
    )
    parser.add_argument("--quick", action="store_true", help="a smoke run at tiny sizes (numbers mean nothing)")
    parser.add_argument("--json", default=None, help="also write the results to this JSON file")
    args = parser.parse_args(argv)
    if args.peer_python:
        from marl.bench.suite import PEER_PYTHONS

        checked(parser, check_peer_python, "--peer-python", args.peer_python, PEER_PYTHONS["benchmarl_python"][1])
    if args.json:
        checked(parser, check_output_file, args.json, f"--json {args.json}", "bench.json")
    if args.default_iterations < 0:
        parser.error(f"argument --default-iterations: {args.default_iterations}: expected 0 (skip those rows) or more")
    for algo in args.algos:
        if algo not in ALGOS:
            parser.error(f"argument --algos: BenchMARL has no {algo!r} to compare with; choose from {', '.join(ALGOS)}")
        if algo not in registered:
            parser.error(
                f"argument --algos: {algo} is not registered in this vecmarl (its algorithms: "
                f"{', '.join(algorithms.names())}); of BenchMARL's, it can run {', '.join(registered)}"
            )
    if args.quick and args.frames == parser.get_default("frames"):
        args.frames = 2 * QUICK_SIZES.num_envs * QUICK_SIZES.rollout_length
    if args.threads:
        torch.set_num_threads(args.threads)
    threads = torch.get_num_threads()

    command = f"python -m marl.bench.train {' '.join(argv if argv is not None else sys.argv[1:])}"
    sizes = QUICK_SIZES if args.quick else BENCHMARL_SIZES
    load_start = os.getloadavg()
    print(f"command: {command}")
    print(
        f"device: cpu, torch {torch.__version__}, {threads} threads on every side, {os.cpu_count()} cpus, "
        f"load average {load_start[0]:.2f} {load_start[1]:.2f} {load_start[2]:.2f}"
    )
    print(
        f"BenchMARL's settings: {sizes.num_envs} envs x {sizes.rollout_length} steps = "
        f"{sizes.num_envs * sizes.rollout_length} frames per iteration, {sizes.epochs} epochs of minibatches of "
        f"{sizes.minibatch_size}, MLP {'x'.join(map(str, sizes.hidden))}; {args.frames:,} frames per run; "
        f"median of {args.repeats} repeat(s), sides taking turns"
        + ("" if args.peer_python else "; BenchMARL not measured (no --peer-python)")
    )
    if any(algo in OFF_POLICY for algo in args.algos):
        print(
            f"off-policy: {sizes.updates_per_iteration} optimiser steps of {sizes.batch_size} frames per iteration, "
            f"a buffer of {sizes.buffer_size:,} frames"
        )
    for algo in args.algos:
        for env in args.envs:
            if cannot_run(algo, env):
                print(f"not run: vecmarl {algo.upper()} on {env}: {cannot_run(algo, env)}")
    warnings = [warning for algo in args.algos for warning in unmatched_settings(algo)]
    for warning in warnings:
        print(f"warning: {warning}")
    cases = build_cases(args)
    peer_info = {}
    for repeat in range(args.repeats):
        for case in cases:
            probe = matmul_gflops()
            run = run_case(case, args, seed=repeat, threads=threads)
            run["seed"], run["load_average"], run["matmul_gflops"] = repeat, os.getloadavg()[0], probe
            case.runs.append(run)
            if case.side == "BenchMARL" and case.algo not in peer_info.get("defaults", {}):
                peer_info = {"benchmarl": run["benchmarl"], "torch": run["torch"], "defaults": {}} | peer_info
                peer_info["defaults"][case.algo] = run["defaults"]
                warnings += check_defaults(run, case.algo)
            print(
                f"  {case.name} (seed {repeat}): {run['frames']:,} frames in {run['seconds']:.1f} s, "
                f"return {run['iterations'][-1]['episode_return']:.3f}, load {run['load_average']:.2f}, "
                f"matmul {probe:.0f} GFLOP/s before",
                flush=True,
            )
    if peer_info:
        print(f"BenchMARL {peer_info['benchmarl']} (torch {peer_info['torch']}) from {args.peer_python}")
    for warning in warnings:
        print(f"warning: {warning}")
    rows = [case.summary() for case in cases]
    print_tables(rows)
    load_end = os.getloadavg()
    print(f"\nload average at the end: {load_end[0]:.2f} {load_end[1]:.2f} {load_end[2]:.2f}")
    result = {
        "command": command,
        "device": "cpu",
        "torch": torch.__version__,
        "threads": threads,
        "load_average_start": list(load_start),
        "load_average_end": list(load_end),
        "sizes": dataclasses.asdict(sizes),
        "frames": args.frames,
        "repeats": args.repeats,
        "peer": peer_info or None,
        "warnings": warnings,
        "rows": rows,
        "runs": [{"name": c.name, "runs": c.runs} for c in cases],
    }
    if args.json:
        Path(args.json).write_text(json_text(result))
    return result


if __name__ == "__main__":
    main()

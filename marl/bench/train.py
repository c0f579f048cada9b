"""Training throughput and return: `marl train` against BenchMARL, equal work, measured in the same run.

    python -m marl.bench.train --threads 1                                   # vecmarl only
    python -m marl.bench.train --threads 1 --peer-python /work/peers/torchrl/bin/python --json bench.json

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
  `--peer-python` (see `marl.bench.benchmarl` for how its phases are split);
- before each run, the process's float32 matmul rate (`matmul_gflops`, printed with the run): on a
  shared virtual machine it swings by up to 1.6x within minutes, invisible in the load average, and
  a slow matmul lengthens vecmarl's runs by a larger fraction than BenchMARL's.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass

import torch

from kernels.bench.gae import median_seconds
from marl.algorithms.ppo import PPOConfig
from marl.bench.benchmarl import run_benchmarl
from marl.config import EnvSettings, ModelConfig, RunConfig, TrainConfig

ENVS = ("vmas/navigation", "navigation")
ALGOS = ("mappo", "ippo")
PHASES = ("collect_s", "advantages_s", "update_s")


@dataclass(frozen=True)
class Sizes:
    """The sizes of a matched run, shared by both sides."""

    num_envs: int
    rollout_length: int
    epochs: int
    minibatch_size: int
    hidden: tuple[int, ...]


BENCHMARL_SIZES = Sizes(num_envs=10, rollout_length=600, epochs=45, minibatch_size=400, hidden=(256, 256))
QUICK_SIZES = Sizes(num_envs=2, rollout_length=100, epochs=1, minibatch_size=100, hidden=(32, 32))

# BenchMARL's VMAS navigation task (its yaml), in the options of vecmarl's two envs.
TASK_OPTIONS = {
    "vmas/navigation": {"n_agents": 3, "max_steps": 100, "shared_rew": False},
    "navigation": {"n_agents": 3, "max_steps": 100, "shared_reward": False, "spawn_half_width": 1.0},
}
# BenchMARL's yaml defaults that `benchmarl_config` reproduces; the worker reports the real ones.
EXPECTED_DEFAULTS = {
    "experiment": {
        "on_policy_collected_frames_per_batch": 6000,
        "on_policy_n_envs_per_worker": 10,
        "on_policy_n_minibatch_iters": 45,
        "on_policy_minibatch_size": 400,
        "lr": 5e-5,
        "adam_eps": 1e-6,
        "gamma": 0.99,
        "clip_grad_norm": True,
        "clip_grad_val": 5,
        "share_policy_params": True,
    },
    "algorithm": {
        "share_param_critic": True,
        "clip_epsilon": 0.2,
        "entropy_coef": 0.0,
        "critic_coef": 1.0,
        "loss_critic_type": "l2",
        "lmbda": 0.9,
        "use_tanh_normal": True,
        "scale_mapping": "biased_softplus_1.0",
        "minibatch_advantage": False,
    },
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
    """vecmarl's `TrainConfig` for BenchMARL's default MAPPO/IPPO settings on `env` (`compile`: as
    `marl train --compile`; `overlap`: and `--overlap-critic`)."""
    return TrainConfig(
        env=EnvSettings(env=env, num_envs=sizes.num_envs, env_options=dict(TASK_OPTIONS[env])),
        algo=PPOConfig(
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
        ),
        # BenchMARL's policies output their std through a biased softplus starting at 1 (`scale_mapping`).
        model=ModelConfig(hidden=sizes.hidden, activation="tanh", share_params=True, std="state"),
        run=_run_config(frames, sizes.rollout_length, seed, compile),
    )


def default_config(algo: str, iterations: int, seed: int, quick: bool = False) -> TrainConfig:
    """A bare `marl train --algo ALGO` (`TrainConfig()`) on `navigation`, for `iterations` iterations."""
    config = TrainConfig(algo=PPOConfig(algo=algo))
    if quick:
        config = TrainConfig(
            env=EnvSettings(num_envs=16),
            algo=PPOConfig(algo=algo, epochs=1, minibatch_size=128),
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
        iterations = []
        start = time.perf_counter()
        while trainer.frames < config.run.total_frames:
            std = policy_std(trainer)  # of the policy that collects this iteration's batch
            row = trainer.train_iteration()
            iterations.append(
                {
                    "frames": trainer.frames_per_iteration,
                    **{phase: row[phase] for phase in PHASES},
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


def check_defaults(reported: dict) -> list[str]:
    """Where BenchMARL's loaded yaml defaults differ from those `benchmarl_config` reproduces."""
    return [
        f"BenchMARL {section}.{key} = {reported[section].get(key)!r}, vecmarl's matched config assumes {value!r}"
        for section, expected in EXPECTED_DEFAULTS.items()
        for key, value in expected.items()
        if reported[section].get(key) != value
    ]


def print_tables(rows: list[dict]) -> None:
    print("\n1. one iteration (median over iterations): seconds per phase and frames/s")
    header = f"{'run':<46}{'frames/iter':>12}{'collect':>9}{'advant.':>9}{'update':>9}{'iter':>9}{'frames/s':>10}"
    print(header)
    print("-" * len(header))
    for r in rows:
        print(
            f"{r['name']:<46}{r['frames_per_iteration']:>12,}{r['collect_s']:>9.3f}{r['advantages_s']:>9.3f}"
            f"{r['update_s']:>9.3f}{r['iteration_s']:>9.3f}{r['iteration_frames_per_s']:>10,.0f}"
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


def build_cases(args: argparse.Namespace) -> list[Case]:
    cases = []
    for algo in args.algos:
        if args.peer_python:
            cases.append(
                Case(f"BenchMARL {algo.upper()} vmas navigation", "BenchMARL", "vmas/navigation", algo, "BenchMARL")
            )
        for env in args.envs:
            if "eager" in args.modes:
                cases.append(Case(f"vecmarl {algo.upper()} {env}", "vecmarl", env, algo, "BenchMARL"))
            if "compile" in args.modes:
                name = f"vecmarl {algo.upper()} {env} --compile"
                cases.append(Case(name, "vecmarl", env, algo, "BenchMARL", compile=True))
            if "overlap" in args.modes:
                name = f"vecmarl {algo.upper()} {env} --compile --overlap-critic"
                cases.append(Case(name, "vecmarl", env, algo, "BenchMARL", compile=True, overlap=True))
    if args.default_iterations:
        for algo in args.algos:
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
    parser.add_argument("--frames", type=int, default=30_000, help="frames per run with BenchMARL's settings")
    parser.add_argument("--repeats", type=int, default=1, help="runs per row (seeds 0..N-1); medians are reported")
    parser.add_argument("--threads", type=int, default=None, help="torch threads for every side (default: torch's)")
    parser.add_argument("--peer-python", default=None, help="a Python with benchmarl, torchrl and vmas")
    parser.add_argument("--algos", nargs="+", choices=ALGOS, default=list(ALGOS), help="algorithms to run")
    parser.add_argument("--envs", nargs="+", choices=ENVS, default=list(ENVS), help="vecmarl envs to run")
    parser.add_argument(
        "--default-iterations", type=int, default=3, help="iterations of the default-config rows (0 skips them)"
    )
    parser.add_argument(
        "--modes",
        nargs="+",
        choices=("eager", "compile", "overlap"),
        default=["eager"],
        help="how vecmarl runs: eager, and/or as `marl train --compile` (rows marked --compile; each such run in a "
        "fresh process, its compiling in its first iteration, which the whole-run frames/s include), and/or as "
        "`marl train --compile --overlap-critic` (the critics' update beside the next collection)",
    )
    parser.add_argument("--quick", action="store_true", help="a smoke run at tiny sizes (numbers mean nothing)")
    parser.add_argument("--json", default=None, help="also write the results to this JSON file")
    args = parser.parse_args(argv)
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
    cases = build_cases(args)
    peer_info, warnings = {}, []
    for repeat in range(args.repeats):
        for case in cases:
            probe = matmul_gflops()
            run = run_case(case, args, seed=repeat, threads=threads)
            run["seed"], run["load_average"], run["matmul_gflops"] = repeat, os.getloadavg()[0], probe
            case.runs.append(run)
            if case.side == "BenchMARL" and not peer_info:
                peer_info = {k: run[k] for k in ("benchmarl", "torch", "defaults")}
                warnings = [] if args.quick else check_defaults(run["defaults"])
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
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return result


if __name__ == "__main__":
    main()

"""Several seeds in one process against one seed: `marl train`'s wall time, equal frames per seed.

    python -m marl.bench.seeds --threads 1                                   # navigation, 5 seeds vs 1
    python -m marl.bench.seeds --threads 1 --envs navigation vmas/navigation --frames 163840 --repeats 3 --wide
    python -m marl.bench.seeds --threads 1 --compile                         # every run with --compile

For each env, the runs take turns in this process (1 seed, S seeds[, 1 seed with S times the envs], then
again), so that load from other processes hits them alike:
- `1 seed`: `marl train` defaults (`TrainConfig()`, the env's own options), seed `r` in repeat `r`;
- `S seeds`: the same with `--seeds r .. r+S-1`, every member training `--frames` frames;
- with `--wide`, `1 seed, S x envs`: one run with `S * num_envs` envs and an `S` times larger minibatch,
  the same arithmetic as the S seeds in one run: what the seeds cost beyond their arithmetic.

Timed: every iteration (collect, advantages, update, the one host sync of the metrics); not timed: process
start, imports, building the envs, nets and collector. The table gives each kind's median seconds over
the repeats, its ratio to `1 seed`, and the final return (the mean over a run's last tenth of iterations,
as `marl train`'s summary) as mean and 95% bootstrap CI: over the members of the last S-seed run, over
the repeats' runs for one seed.

With `--compile` every run is `marl train --compile` (one seed's rollout and optimiser steps compiled; S
seeds' too, every member in one graph) and the seconds timed are those after the first iteration, which
compiles: the steady state the compiling pays for (on a GPU, CUDA graph replays).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shlex
import statistics
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

import torch

import envs
from kernels.bench.options import checked, json_text, positive_int
from marl.algorithms import DEFAULT, default_config
from marl.app.build import resolve_device
from marl.app.paths import check_output_file
from marl.app.seeds import bootstrap_ci, final_return
from marl.app.trainer import Trainer
from marl.config import EnvSettings, ModelConfig, RunConfig, TrainConfig

KINDS = ("1 seed", "S seeds", "1 seed, S x envs")


@dataclasses.dataclass(frozen=True)
class Sizes:
    """`marl train`'s defaults unless given (tests run tiny ones)."""

    num_envs: int = EnvSettings.num_envs
    rollout_length: int = RunConfig.rollout_length
    minibatch_size: int | None = None  # None: the algorithm's default
    hidden: tuple[int, ...] = ModelConfig.hidden
    compile: bool = False  # `marl train --compile`; timed after the first iteration


def config_for(
    env: str, kind: str, seeds: int, frames: int, repeat: int, device: str, log_dir: str, sizes: Sizes = Sizes()
) -> TrainConfig:
    """`marl train` defaults on `env` for one kind of run (see the module docstring)."""
    algo = default_config(DEFAULT)
    if sizes.minibatch_size is not None:
        algo = dataclasses.replace(algo, minibatch_size=sizes.minibatch_size)
    env_settings = EnvSettings(env=env, num_envs=sizes.num_envs)
    run = RunConfig(
        rollout_length=sizes.rollout_length,
        total_frames=frames,
        seed=repeat,
        device=device,
        log_dir=log_dir,
        run_name=f"{env.replace('/', '_')}-{KINDS.index(kind)}-{repeat}",
        progress=False,
        tensorboard=False,
        checkpoint_every=10**9,
        compile=sizes.compile,
    )
    if kind == "S seeds":
        run = dataclasses.replace(run, num_seeds=seeds)
    if kind == "1 seed, S x envs":
        env_settings = dataclasses.replace(env_settings, num_envs=seeds * sizes.num_envs)
        algo = dataclasses.replace(algo, minibatch_size=seeds * algo.minibatch_size)
        run = dataclasses.replace(run, total_frames=seeds * frames)
    return TrainConfig(env=env_settings, algo=algo, model=ModelConfig(hidden=sizes.hidden), run=run)


def time_run(config: TrainConfig) -> dict:
    """Train `config` to its frames; the seconds of its iterations (compiled: after the first, which
    compiles) and each run's (member's) final return."""
    trainer = Trainer(config)
    rows = trainer.train()  # logs the CSVs (and checkpoints at the end), outside the timed iterations
    seconds = rows[-1]["time_s"] - (rows[0]["time_s"] if config.run.compile else 0.0)
    groups = list(trainer.env.groups)
    members = (
        [[{**r, **r["members"][k]} for r in rows] for k in range(len(trainer.members))]
        if len(trainer.members) > 1
        else [rows]
    )
    returns = [statistics.fmean(final_return(m, f"{g}/episode_return") for g in groups) for m in members]
    return {"seconds": seconds, "returns": returns, "iterations": len(rows)}


def bench_seeds(
    envs: list[str],
    seeds: int,
    frames: int,
    repeats: int,
    device: str,
    wide: bool,
    sizes: Sizes = Sizes(),
    log_dir: str | None = None,
) -> list[dict]:
    kinds = KINDS if wide else KINDS[:2]
    rows = []
    with tempfile.TemporaryDirectory() as temporary:
        log_dir = log_dir or temporary
        for env in envs:
            runs = {kind: [] for kind in kinds}
            for repeat in range(repeats):
                for kind in kinds:
                    config = config_for(env, kind, seeds, frames, repeat, device, log_dir, sizes)
                    runs[kind].append(time_run(config))
                    print(f"  {env}, {kind}, repeat {repeat}: {runs[kind][-1]['seconds']:.1f} s", flush=True)
            single = statistics.median(r["seconds"] for r in runs["1 seed"])
            for kind in kinds:
                median = statistics.median(r["seconds"] for r in runs[kind])
                # The spread of returns: the last S-seed run's members, or one seed's runs over the repeats.
                returns = runs[kind][-1]["returns"] if kind == "S seeds" else [r["returns"][0] for r in runs[kind]]
                mean, _, low, high = bootstrap_ci(returns)
                config = config_for(env, kind, seeds, frames, 0, device, "runs", sizes)
                rows.append(
                    {
                        "env": env,
                        "kind": kind.replace("S", str(seeds)),
                        "seeds": seeds if kind == "S seeds" else 1,
                        "num_envs": config.env.num_envs,
                        "frames_per_seed": frames * (seeds if kind == "1 seed, S x envs" else 1),
                        "iterations": runs[kind][0]["iterations"],
                        "median_s": median,
                        "ratio": median / single,
                        "return_mean": mean,
                        "return_ci": [low, high],
                        "returns_over": len(returns),
                    }
                )
    return rows


def print_table(rows: list[dict]) -> None:
    print(
        "| env | run | envs per run | frames per run | iterations | median s | ratio to 1 seed | final return (95% CI) |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---|")
    for r in rows:
        low, high = r["return_ci"]
        print(
            f"| {r['env']} | {r['kind']} | {r['num_envs']} | {r['frames_per_seed']:,} | {r['iterations']} | "
            f"{r['median_s']:.1f} | {r['ratio']:.2f}x | {r['return_mean']:.3f} ({low:.3f} to {high:.3f}, "
            f"n={r['returns_over']}) |"
        )


def main(argv: list[str] | None = None) -> dict:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="python -m marl.bench.seeds", description=__doc__.split("\n\n")[0])
    parser.add_argument("--envs", nargs="+", default=["navigation"], help="envs, each with its defaults")
    parser.add_argument("--seeds", type=positive_int, default=5, help="seeds trained in one process (S)")
    parser.add_argument("--frames", type=positive_int, default=163_840, help="frames per seed (10 default iterations)")
    parser.add_argument("--repeats", type=positive_int, default=3, help="runs of each kind (the median is reported)")
    parser.add_argument("--wide", action="store_true", help="also one seed with S times the envs")
    parser.add_argument("--threads", type=positive_int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or auto (CUDA where available)")
    parser.add_argument("--json", default=None, help="also write the report here")
    parser.add_argument("--log-dir", default=None, help="keep the runs' folders here (default: a temporary one)")
    parser.add_argument("--num-envs", type=positive_int, default=Sizes.num_envs, help="envs per seed")
    parser.add_argument("--rollout-length", type=positive_int, default=Sizes.rollout_length, help="steps per iteration")
    parser.add_argument(
        "--minibatch-size", type=positive_int, default=None, help="frames per minibatch (PPO's default)"
    )
    parser.add_argument("--hidden", type=positive_int, nargs="+", default=list(Sizes.hidden), help="hidden layer sizes")
    parser.add_argument(
        "--compile",
        action="store_true",
        help="every run with marl train --compile; the seconds timed are those after the first iteration (compiling)",
    )
    args = parser.parse_args(argv)
    if args.json:
        checked(parser, check_output_file, args.json, f"--json {args.json}", "bench.json")
    if args.seeds < 2:
        parser.error(f"argument --seeds: {args.seeds}: expected at least 2 (they are timed against one seed)")
    for name in args.envs:
        # Built once, small, here: an unknown name or a missing adapter's library is one usage line, not a
        # traceback after the first env's runs.
        try:
            envs.make(name, num_envs=1)
        except (KeyError, ValueError, ImportError) as error:
            parser.error(f"argument --envs: {str(error).strip(chr(34))}")
    if args.compile and args.frames <= args.num_envs * args.rollout_length:
        parser.error(
            f"--compile times the iterations after the first: --frames must exceed one iteration "
            f"({args.num_envs * args.rollout_length:,} frames: --num-envs x --rollout-length)"
        )
    # `auto` as what it resolves to
    args.device = str(checked(parser, resolve_device, args.device, prefix="argument --device: "))
    sizes = Sizes(args.num_envs, args.rollout_length, args.minibatch_size, tuple(args.hidden), args.compile)
    try:  # the runs' configs, checked before the first run (e.g. a minibatch larger than an iteration)
        for kind in KINDS:
            config_for(args.envs[0], kind, args.seeds, args.frames, 0, args.device, "runs", sizes)
    except ValueError as error:
        parser.error(str(error))
    if args.threads:
        torch.set_num_threads(args.threads)
    from kernels.bench.gae import device_name

    report = {
        "command": "python -m marl.bench.seeds " + shlex.join(argv),
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d"),
        "machine": device_name(torch.device(args.device)),
        "threads": torch.get_num_threads(),
        "cpus": os.cpu_count(),
    }
    report["sizes"] = dataclasses.asdict(sizes)
    report["rows"] = bench_seeds(
        args.envs, args.seeds, args.frames, args.repeats, args.device, args.wide, sizes, args.log_dir
    )
    print(f"command: {report['command']}")
    print(
        f"date: {report['date']}; device: {report['machine']}; {report['threads']} torch threads, "
        f"{report['cpus']} cpus; median of {args.repeats} runs each"
        + ("; compiled, seconds after the first iteration" if args.compile else "")
        + f"; torch {torch.__version__}; sizes {report['sizes']}"
    )
    print_table(report["rows"])
    if args.json:
        Path(args.json).write_text(json_text(report))
    return report


if __name__ == "__main__":
    main()

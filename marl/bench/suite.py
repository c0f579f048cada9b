"""`marl bench`: vecmarl's benchmarks in one table, with the peers side by side when they are available.

    marl bench --quick                                   # about a minute on a quiet 2-core CPU
    marl bench --json bench.json --vmas --jaxmarl-python ~/venvs/jaxmarl/bin/python \\
               --torchrl-python ~/venvs/torchrl/bin/python --benchmarl-python ~/venvs/torchrl/bin/python

Rows, each the median of repeats, with the peer measured in the same run (but see train) and the ratio to it:

- env: env-steps/s of `navigation` (vs VMAS `navigation`) and `spread` (vs VMAS `simple_spread` and
  JaxMARL's `MPE_simple_spread_v3`, stepped under `jax.jit` + `lax.scan` as JaxMARL measures it), eager
  and with `compile=True`; random actions, finished envs reset the way each library's users do;
- gae: elements/s and effective GB/s of `kernels.gae` (vs TorchRL's `generalized_advantage_estimate`,
  run in the given TorchRL interpreter);
- replay: calls/s of the replay buffer's extend, sample and priority update, uniform and prioritized,
  at 1M navigation transitions (vs TorchRL's buffer with the same storage and sampler, in the TorchRL
  interpreter; `python -m marl.bench.replay` has the full table);
- train: frames/s of whole training iterations (collect + advantages + update), eager and
  `--compile`, for the default `marl train` config on `navigation` and for JaxMARL's `ippo_ff_mpe`
  config (16 envs x 128 steps, 4 epochs x 4 minibatches, MLP 64-64 tanh, lr 2.5e-4 annealed, ...) on
  `spread` at 16 and 1024 envs; compile time is excluded (warm-up iterations), see time-to-target.
  Their peer, "JaxMARL (quoted)", is not measured in the run: it is the 44,500 env-steps/s of
  JaxMARL's own `ippo_ff_mpe` training at 16 envs on a 2-core AMD EPYC, so its ratio holds only there;
- target: wall time (compilation included) and frames until the training curve's mean episode return
  reaches `--target` of the way from a random policy's return to the scripted yardstick's;
- benchmarl (with `--benchmarl-python`): `marl train` on `vmas/navigation` against BenchMARL's MAPPO
  and IPPO on VMAS navigation, both with BenchMARL's default settings, on the CPU: frames/s of whole
  30k-frame runs (12k with `--quick`) and the mean episode return at their end (`python -m
  marl.bench.train` splits the iterations into phases and adds the native env).

On a GPU the env and default-config training rows also run at 65,536 envs.

`--quick` is a first look: one small size per section (env runs of 25 steps), eager only, no time-to-target.
It leaves out the compiled rows (compiling an env step or a training step alone takes minutes on a 2-core
CPU) and the target section (training runs to a return); its rows say their sizes and runs as always.

Peers never become dependencies: VMAS runs in this process when installed; JaxMARL and TorchRL run in
subprocesses of the interpreters given (BenchMARL in its own: it pins another tensordict). Without a peer
its column says `-`.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch

import envs
from envs.bench import steps as env_bench
from kernels.bench.options import check_peer_python, json_text
from marl.algorithms.ppo import PPOConfig
from marl.app.paths import check_output_file
from marl.app.trainer import Trainer
from marl.config import EnvSettings, ModelConfig, RunConfig, TrainConfig

JAXMARL_STEP = r"""
import json, sys, time
import jax
from jaxmarl import make
num_envs, steps, repeats = (int(a) for a in sys.argv[1:4])
env = make("MPE_simple_spread_v3")

def run(key):
    key, reset_key = jax.random.split(key)
    _, state = jax.vmap(env.reset)(jax.random.split(reset_key, num_envs))
    def body(carry, _):
        state, key = carry
        key, act_key, step_key = jax.random.split(key, 3)
        actions = {a: jax.random.randint(k, (num_envs,), 0, 5)
                   for a, k in zip(env.agents, jax.random.split(act_key, env.num_agents))}
        _, state, reward, _, _ = jax.vmap(env.step)(jax.random.split(step_key, num_envs), state, actions)
        return (state, key), reward[env.agents[0]].sum()
    return jax.lax.scan(body, (state, key), None, length=steps)[1].sum()

run = jax.jit(run)
run(jax.random.PRNGKey(0)).block_until_ready()  # compile
rates = []
for r in range(repeats):
    start = time.perf_counter()
    run(jax.random.PRNGKey(r + 1)).block_until_ready()
    rates.append(num_envs * steps / (time.perf_counter() - start))
print(json.dumps({"env_steps_per_s": sorted(rates)[len(rates) // 2], "jax": jax.__version__}))
"""


# env-steps/s of JaxMARL's own `ippo_ff_mpe` training (16 envs), measured once on a 2-core AMD EPYC:
# `marl bench` does not run JaxMARL's training, and prints this for scale as the train rows' peer.
JAXMARL_IPPO_QUOTED = 44_500.0


def jaxmarl_spread(python: str, num_envs: int, steps: int, repeats: int) -> float:
    """JaxMARL's simple_spread env-steps/s, measured in its own interpreter."""
    out = subprocess.run(
        [python, "-c", JAXMARL_STEP, str(num_envs), str(steps), str(repeats)],
        capture_output=True,
        text=True,
        check=True,
        timeout=1800,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])["env_steps_per_s"]


def jaxmarl_ippo_config(num_envs: int, frames: int, compile: bool, device: str, log_dir: str) -> TrainConfig:
    """JaxMARL's `ippo_ff_mpe` hyper-parameters on vecmarl's `spread` (discrete, 25-step episodes)."""
    return TrainConfig(
        env=EnvSettings(env="spread", num_envs=num_envs),
        algo=PPOConfig(
            algo="ippo",
            lr=2.5e-4,
            lr_schedule="linear",
            gamma=0.99,
            lmbda=0.95,
            clip_eps=0.2,
            entropy_coef=0.01,
            value_coef=0.5,
            max_grad_norm=0.5,
            epochs=4,
            minibatch_size=num_envs * 128 // 4,
            clip_value=True,
            normalize_value=False,
        ),
        model=ModelConfig(hidden=(64, 64), activation="tanh"),
        run=RunConfig(
            total_frames=frames,
            rollout_length=128,
            device=device,
            log_dir=log_dir,
            run_name="spread",
            progress=False,
            tensorboard=False,
            checkpoint_every=10**9,
            compile=compile,
            compile_unroll=4 if compile else 1,  # 16 envs: the compiled call's overhead would be a third of collection
        ),
    )


def navigation_config(frames: int, compile: bool, device: str, log_dir: str) -> TrainConfig:
    """`marl train`'s defaults on navigation."""
    run = RunConfig(
        total_frames=frames,
        device=device,
        log_dir=log_dir,
        run_name="navigation",
        progress=False,
        tensorboard=False,
        checkpoint_every=10**9,
        compile=compile,
    )
    return TrainConfig(run=run)


def train_rate(config: TrainConfig, warmup: int, iterations: int, repeats: int) -> float:
    """Frames/s over `iterations` whole training iterations after `warmup` (which absorb compilation)."""
    if config.run.compile:
        torch._dynamo.reset()  # compile afresh, as `marl train --compile` does (see envs.bench.time_vecmarl)
    trainer = Trainer(config)
    for _ in range(warmup):
        trainer.train_iteration()
    rates = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(iterations):
            trainer.train_iteration()
        rates.append(iterations * trainer.frames_per_iteration / (time.perf_counter() - start))
    return sorted(rates)[len(rates) // 2]


def yardsticks(env_name: str, device: str) -> tuple[float, float]:
    """Mean episode return per agent of random actions and of the env's scripted policy."""
    from envs.native.navigation import scripted_action as navigation_script
    from envs.native.spread import scripted_action as spread_script

    script = {"navigation": navigation_script, "spread": spread_script}[env_name]
    env = envs.make(env_name, num_envs=1000, device=device, seed=123)
    generator = torch.Generator(device).manual_seed(0)
    results = []
    for policy in (lambda obs: env.sample_actions(generator)["agent"], lambda obs: script(obs["agent", "observation"])):
        obs = env.reset(seed=123)
        total = torch.zeros(1000, device=device)
        finished = torch.zeros(1000, dtype=torch.bool, device=device)
        for _ in range(env.max_steps):
            next_td, obs = env.step({"agent": policy(obs)})
            total += torch.where(finished, 0.0, next_td["agent", "reward"][..., 0].mean(-1))
            finished |= next_td["done"][:, 0]
        results.append(total.mean().item())
    return results[0], results[1]


def time_to_target(config: TrainConfig, target: float) -> tuple[float, int, float]:
    """Wall seconds (from building the trainer, compilation included) and frames until the mean episode
    return, averaged over the last 3 iterations with finished episodes, reaches `target` (NaN seconds
    when `config.run.total_frames` pass first); and that average."""
    start = time.perf_counter()
    trainer = Trainer(config)
    recent: list[float] = []
    while trainer.frames < config.run.total_frames:
        row = trainer.train_iteration()
        if math.isfinite(row["agent/episode_return"]):
            recent = (recent + [row["agent/episode_return"]])[-3:]
        if len(recent) == 3 and sum(recent) / 3 >= target:
            return time.perf_counter() - start, trainer.frames, sum(recent) / 3
    return math.nan, trainer.frames, sum(recent) / max(len(recent), 1)


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(
        prog="marl bench", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        check_args(args)
    except ValueError as error:
        parser.error(str(error))
    return run(args, argv)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--quick",
        action="store_true",
        help="small sizes and budgets, no compiled rows and no target section: about a minute on a quiet 2-core CPU",
    )
    parser.add_argument("--device", default="auto", help="cpu, cuda or auto (default: auto, CUDA where available)")
    parser.add_argument(
        "--repeats",
        type=_positive_int,
        default=3,
        help="timed runs per figure (median reported), at least 1 (default: 3)",
    )
    parser.add_argument(
        "--vmas",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="time VMAS alongside when it is installed (default: on)",
    )
    parser.add_argument("--jaxmarl-python", default=None, help="interpreter with jaxmarl installed (env stepping)")
    parser.add_argument("--torchrl-python", default=None, help="interpreter with torchrl installed (GAE)")
    parser.add_argument(
        "--benchmarl-python",
        default=None,
        help="interpreter with benchmarl, torchrl and vmas installed: adds the benchmarl section (training on "
        "VMAS navigation with BenchMARL's default MAPPO/IPPO settings, both sides on the CPU)",
    )
    parser.add_argument(
        "--target",
        type=_fraction,
        default=0.8,
        help="time-to-target: fraction of the way from random to the scripted yardstick, in (0, 1] (default: 0.8)",
    )
    parser.add_argument(
        "--skip",
        nargs="+",
        default=[],
        choices=SECTIONS,
        help="sections to leave out",
    )
    parser.add_argument("--json", default=None, help="also write the rows to this JSON file")


SECTIONS = ["env", "gae", "replay", "train", "target", "benchmarl"]  # in the order they run
# The benchmark column fits the longest name and a space: the replay's "select + gather + set_priority_ of
# 4096, compiled prioritized" (at 36 the replay's names ran into their size: "prioritized65,536 cap").
NAME_WIDTH = 63


# Checked as the arguments are parsed (argparse `type`s), so that both `marl bench` and `bench.main`
# report a bad value in one `error:` line instead of failing deep inside a section.
def _positive_int(text: str) -> int:
    """--repeats: every figure is a median of that many timed runs, and a median needs one."""
    value = _parse(int, text, "a whole number")
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1 (timed runs per figure), got {value}")
    return value


def _fraction(text: str) -> float:
    """--target: a fraction of the way from a random policy's return (0) to the scripted one's (1). 0
    or less is reached before any training, and beyond 1 the scripted yardstick may never be matched."""
    value = _parse(float, text, "a number")
    if not 0 < value <= 1:  # also refuses nan
        raise argparse.ArgumentTypeError(f"must be in (0, 1] (0: a random policy, 1: the scripted one), got {text}")
    return value


def _parse(kind: type, text: str, expected: str):
    try:
        return kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None


# --flag -> the modules its interpreter must have
PEER_PYTHONS = {
    "jaxmarl_python": ("--jaxmarl-python", ("jaxmarl",)),
    "torchrl_python": ("--torchrl-python", ("torchrl",)),
    "benchmarl_python": ("--benchmarl-python", ("benchmarl", "torchrl", "vmas")),
}


def check_args(args: argparse.Namespace) -> None:
    """Refuse, before any section runs, what would otherwise fail minutes into the benchmark with a
    traceback: an unknown or absent device, a `--json` path in a missing folder, a peer interpreter
    that does not exist or lacks its library; and a `--skip` that leaves no section, which would print an
    empty table. Raises ValueError naming the option."""
    from marl.app.trainer import resolve_device

    resolve_device(args.device)
    if args.json:
        check_output_file(args.json, f"--json {args.json}", example="bench.json")
    for dest, (flag, modules) in PEER_PYTHONS.items():
        if getattr(args, dest) is not None:
            check_peer_python(flag, getattr(args, dest), modules)
    # benchmarl runs only with its interpreter: without one, skipping the other five leaves nothing either;
    # target does not run under --quick.
    left = [s for s in SECTIONS if s not in args.skip and (s != "benchmarl" or args.benchmarl_python)]
    left = [s for s in left if not (s == "target" and args.quick)]
    if not left:
        unless = "" if "benchmarl" in args.skip else " (benchmarl runs only with --benchmarl-python)"
        unless += "" if "target" in args.skip or not args.quick else " (--quick leaves out target)"
        raise ValueError(
            f"--skip {' '.join(args.skip)} leaves no section to run{unless}: the sections are {', '.join(SECTIONS)}"
        )


def run(args: argparse.Namespace, argv: list[str] | None) -> list[dict]:
    device = "cuda" if args.device == "auto" and torch.cuda.is_available() else args.device
    device = "cpu" if device == "auto" else device
    rows: list[dict] = []
    command = "marl bench " + " ".join(argv if argv is not None else sys.argv[2:])
    # --quick says on the device line what it leaves out (the header and rows follow on the next lines)
    quick_note = "; --quick: small sizes, no compiled rows, no target section" if args.quick else ""
    print(
        f"command: {command}\ndevice: {device}, torch {torch.__version__}, {torch.get_num_threads()} threads{quick_note}"
    )
    print(
        f"{'section':<10}{'benchmark':<{NAME_WIDTH}}{'size':<14}{'vecmarl':>14}  {'unit':<13}{'peer':<16}{'peer value':>12}"
        f"{'ratio':>8}  median of"
    )

    def emit(section, benchmark, size, value, unit, peer=None, peer_value=None, ratio=True, *, median_of):
        """One row; `ratio=False` for quantities whose ratio means nothing (returns can be negative);
        `median_of` says what each side's figure is the median of (`--quick` cuts some to one run)."""
        ratio = value / peer_value if peer_value and ratio else None
        rows.append(
            {
                "section": section,
                "benchmark": benchmark,
                "size": size,
                "device": device,
                "vecmarl": value,
                "unit": unit,
                "peer": peer,
                "peer_value": peer_value,
                "ratio": ratio,
                "median_of": median_of,
            }
        )
        print(
            f"{section:<10}{benchmark:<{NAME_WIDTH}}{size:<14}{_number(value):>14}  {unit:<13}{peer or '-':<16}"
            f"{(_number(peer_value) if peer_value is not None else '-'):>12}{(f'{ratio:.2f}x' if ratio else '-'):>8}  {median_of}",
            flush=True,
        )

    quick, repeats = args.quick, args.repeats
    # --quick: eager only, since compiling (an env step, a training step, the replay's draw) takes minutes on
    # a 2-core CPU; and no target section, whose training runs take minutes too.
    compile_modes = (False,) if quick else (False, True)
    with_vmas = args.vmas and _installed("vmas")
    # On a GPU the scale too: navigation and MAPPO at 65,536 envs.
    gpu_sizes = [65536] if device.startswith("cuda") and not quick else []
    if "env" not in args.skip:
        sizes = [1024] if quick else [1024, 4096, *gpu_sizes]
        # --quick: one spread episode per run (VMAS, stepped alongside, takes most of this section's time)
        steps_of = {"navigation": 100, "spread": env_bench.SPREAD_STEPS * 4}
        for env_name, steps in ((name, env_bench.SPREAD_STEPS if quick else n) for name, n in steps_of.items()):
            for num_envs in sizes:
                vmas_rate = env_bench.time_vmas(env_name, num_envs, 3, steps, repeats, device) if with_vmas else None
                jax_rate = None
                if env_name == "spread" and args.jaxmarl_python:
                    jax_rate = jaxmarl_spread(args.jaxmarl_python, num_envs, steps, repeats)
                for compiled in compile_modes:
                    rate = env_bench.time_vecmarl(env_name, num_envs, 3, steps, repeats, device, compiled)
                    name = f"{env_name} env-steps{' (compile)' if compiled else ''}"
                    row = ("env", name, f"{num_envs} envs", rate, "env-steps/s")
                    runs = f"{repeats} runs of {steps} steps"
                    emit(*row, "VMAS" if vmas_rate else None, vmas_rate, median_of=runs)
                    if jax_rate:
                        emit(*row, "JaxMARL", jax_rate, median_of=runs)
    if "gae" not in args.skip:
        from kernels.bench.gae import LABELS, bench_size

        sizes = [(100, 1024, 3, 1)] if quick else [(100, 1024, 3, 1), (128, 4096, 8, 1)]
        rounds = 1 if quick else 3
        calls = f"{repeats} calls" if rounds == 1 else f"{rounds} rounds of {repeats} calls"
        with tempfile.TemporaryDirectory() as workdir:
            for size in sizes:
                results, _ = bench_size(
                    size, torch.device(device), ["auto"], repeats, rounds, args.torchrl_python, Path(workdir)
                )
                ours = next(r for r in results if r["call"].startswith("gae"))
                label = "x".join(map(str, size))
                peer = next((r for r in results if r["call"] == LABELS["torchrl_loop"]), None)
                peer_rate = peer["elements_per_s"] / 1e6 if peer else None
                emit(
                    "gae",
                    "gae elements",
                    label,
                    ours["elements_per_s"] / 1e6,
                    "Melem/s",
                    "TorchRL loop" if peer else None,
                    peer_rate,
                    median_of=calls,
                )
                emit("gae", "gae effective bandwidth", label, ours["gb_per_s"], "GB/s", median_of=calls)
    with tempfile.TemporaryDirectory() as log_dir:
        if "replay" not in args.skip:
            replay_rows(device, quick, repeats, args.torchrl_python, emit)
        if "train" not in args.skip:
            iterations = 2 if quick else 5
            train_runs = 1 if quick else repeats
            for compiled in compile_modes:
                warmup = 2 if compiled else 1
                suffix = " (compile)" if compiled else ""
                for num_envs in [128] if quick else [256, *gpu_sizes]:
                    config = navigation_config(10**12, compiled, device, log_dir)
                    config = replace(config, env=replace(config.env, num_envs=num_envs))
                    emit(
                        "train",
                        f"navigation MAPPO defaults{suffix}",
                        f"{num_envs} envs",
                        train_rate(config, warmup, iterations, train_runs),
                        "frames/s",
                        median_of=f"{train_runs} runs of {iterations} iterations",
                    )
                for num_envs in (16,) if quick else (16, 1024):
                    config = jaxmarl_ippo_config(num_envs, 10**12, compiled, device, log_dir)
                    run_iterations = iterations if num_envs == 1024 or quick else 3 * iterations
                    rate = train_rate(config, warmup, run_iterations, train_runs)
                    emit(
                        "train",
                        f"spread IPPO ippo_ff_mpe{suffix}",
                        f"{num_envs} envs",
                        rate,
                        "env-steps/s",
                        "JaxMARL (quoted)",  # not measured: see the module docstring
                        JAXMARL_IPPO_QUOTED,
                        median_of=f"{train_runs} runs of {run_iterations} iterations",
                    )
        if "target" not in args.skip and not quick:
            cap = 2_000_000  # frames; the run stops there if the target is not reached
            for env_name, config in (
                ("navigation", navigation_config(cap, False, device, log_dir)),
                ("spread", jaxmarl_ippo_config(16, cap, False, device, log_dir)),
            ):
                random_return, scripted_return = yardsticks(env_name, device)
                target = random_return + args.target * (scripted_return - random_return)
                seconds, frames, reached = time_to_target(config, target)
                name = f"{env_name} to {target:.2f} (got {reached:.2f})"
                emit("target", name, f"{frames:,} frames", seconds, "s (nan: cap)", median_of="1 run")
                if math.isnan(seconds):
                    print(f"  nan: the return did not reach {target:.2f} within the cap of {cap:,} frames", flush=True)
    if "benchmarl" not in args.skip and args.benchmarl_python:
        against_benchmarl(args.benchmarl_python, 12_000 if quick else 30_000, 1 if quick else repeats, emit)
    if args.json:
        Path(args.json).write_text(json_text(rows))  # a target not reached (NaN) as null
    return rows


def replay_rows(device: str, quick: bool, repeats: int, torchrl_python: str | None, emit) -> None:
    """The replay buffer's extend, sample and priority update at 1M navigation transitions (65,536 with
    `--quick`, without the compiled row), against TorchRL's buffer with the same storage and sampler
    (`marl.bench.replay`)."""
    from marl.bench.replay import bench_replay

    capacity = 65_536 if quick else 1_000_000
    batch_sizes = (128,) if quick else (128, 4096)
    calls = repeats * 4  # each call takes microseconds: more of them than of the other sections' runs
    report = bench_replay(
        capacity, batch_sizes=batch_sizes, repeats=calls, device=device, peer_python=torchrl_python, compiled=not quick
    )
    for row in report["rows"]:
        theirs = 1e3 / row["torchrl_ms"] if row["torchrl_ms"] else None
        peer = "TorchRL" if theirs else None
        emit(
            "replay",
            f"{row['call']} {row['sampler']}",
            f"{capacity:,} cap",
            1e3 / row["vecmarl_ms"],
            "calls/s",
            peer,
            theirs,
            median_of=f"{calls} calls",
        )


def against_benchmarl(python: str, frames: int, repeats: int, emit) -> None:
    """`marl train` on `vmas/navigation` against BenchMARL's MAPPO and IPPO on VMAS navigation, both
    with BenchMARL's default settings (`marl.bench.train` has the details and more rows): frames/s of
    whole runs of `frames` frames and the mean episode return at their end, medians over `repeats`
    seeds, the sides taking turns."""
    from marl.bench.benchmarl import run_benchmarl
    from marl.bench.train import benchmarl_config, run_vecmarl

    for algo in ("mappo", "ippo"):
        runs: dict[str, list[dict]] = {"vecmarl": [], "BenchMARL": []}
        for seed in range(repeats):
            runs["BenchMARL"].append(run_benchmarl(python, algo, frames, seed, torch.get_num_threads()))
            runs["vecmarl"].append(run_vecmarl(benchmarl_config("vmas/navigation", algo, frames, seed)))
        rate = {side: statistics.median([r["frames"] / r["seconds"] for r in rs]) for side, rs in runs.items()}
        ret = {
            side: statistics.median([r["iterations"][-1]["episode_return"] for r in rs]) for side, rs in runs.items()
        }
        name, size = f"vmas/navigation {algo.upper()}", f"{frames:,} frames"
        seeds = f"{repeats} runs (seeds)"
        emit(
            "benchmarl",
            f"{name} frames/s",
            size,
            rate["vecmarl"],
            "frames/s",
            "BenchMARL",
            rate["BenchMARL"],
            median_of=seeds,
        )
        emit(
            "benchmarl",
            f"{name} return",
            size,
            ret["vecmarl"],
            "return",
            "BenchMARL",
            ret["BenchMARL"],
            ratio=False,
            median_of=seeds,
        )


def _number(value: float) -> str:
    """A table figure: one decimal, or three for small ones (returns, GB/s)."""
    return f"{value:,.1f}" if abs(value) >= 100 else f"{value:.3f}"


def _installed(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None

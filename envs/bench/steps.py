"""Env throughput: env-steps/s of vecmarl's `navigation` and `spread` and, when vmas is installed, of
VMAS's `navigation` and `simple_spread` with the same settings, measured in the same run.

    python -m envs.bench.steps                                  # the default table (navigation)
    python -m envs.bench.steps --num-envs 4096 --n-agents 3 24  # a subset
    python -m envs.bench.steps --env spread --n-agents 3        # MPE's simple_spread, 25-step episodes

Both sides step the same pre-sampled random actions (discrete moves on both sides for `spread`, as
JaxMARL's figures are measured) and reset finished envs the way their users do:
vecmarl auto-resets inside `step`; VMAS is reset with `reset()` when every env is done and with
`reset_at(i)` per finished env otherwise (what TorchRL's VMAS wrapper does). An env-step is one
step of one env (all of its agents). Each figure is the median of `--repeats` timed runs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

import envs
from envs.native.navigation import NavigationConfig
from kernels.bench.options import positive_int

SPREAD_STEPS = 25  # MPE's episode length


def vmas_peer(env: str, n_agents: int) -> tuple[str, dict]:
    """VMAS's scenario doing the same work as vecmarl's `env`, and its options."""
    if env == "navigation":
        arena = NavigationConfig(n_agents=n_agents).arena
        options = dict(continuous_actions=True, max_steps=100, world_spawning_x=arena, world_spawning_y=arena)
        return "navigation", options
    return "simple_spread", dict(continuous_actions=False, max_steps=SPREAD_STEPS)


def time_vecmarl(
    env_name: str, num_envs: int, n_agents: int, steps: int, repeats: int, device: str, compile: bool
) -> float:
    if compile:
        # A fresh compile per size, as in a user's process (one num_envs per run): after a second shape
        # torch.compile would switch to a dynamic-shape graph, slower than either static one.
        torch._dynamo.reset()
    env = envs.make(env_name, num_envs=num_envs, device=device, seed=0, n_agents=n_agents, compile=compile)
    generator = torch.Generator(device).manual_seed(1)
    actions = [env.sample_actions(generator) for _ in range(8)]
    env.reset()
    for i in range(5):  # warm-up
        env.step(actions[i % 8])

    def run() -> None:
        for i in range(steps):
            env.step(actions[i % 8])

    return _median_rate(run, num_envs * steps, repeats, device)


def time_vmas(env_name: str, num_envs: int, n_agents: int, steps: int, repeats: int, device: str) -> float:
    import vmas

    scenario, options = vmas_peer(env_name, n_agents)
    env = vmas.make_env(scenario, num_envs=num_envs, device=device, seed=0, n_agents=n_agents, **options)
    generator = torch.Generator(device).manual_seed(1)
    if options["continuous_actions"]:
        draws = torch.rand(8, n_agents, num_envs, 2, generator=generator, device=device) * 2 - 1
    else:
        draws = torch.randint(5, (8, n_agents, num_envs), generator=generator, device=device)
    actions = [list(draw.unbind(0)) for draw in draws]
    env.reset()

    def step(i: int) -> None:
        _, _, done, _ = env.step(actions[i % 8])
        if done.all():
            env.reset()
        elif done.any():
            for index in done.nonzero()[:, 0].tolist():
                env.reset_at(index)

    for i in range(5):
        step(i)

    def run() -> None:
        for i in range(steps):
            step(i)

    return _median_rate(run, num_envs * steps, repeats, device)


def _median_rate(run, work: int, repeats: int, device: str) -> float:
    rates = []
    for _ in range(repeats):
        _sync(device)
        start = time.perf_counter()
        run()
        _sync(device)
        rates.append(work / (time.perf_counter() - start))
    return statistics.median(rates)


def check_device_and_json(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse, before anything is timed, a device that cannot run here and a `--json` that could not be
    written at the end (the table would be lost with a traceback)."""
    try:
        device = torch.device(args.device)
    except RuntimeError:
        parser.error(f"--device {args.device!r}: expected cpu, cuda or cuda:N")
    if device.type not in ("cpu", "cuda"):
        parser.error(f"--device {args.device!r}: expected cpu, cuda or cuda:N")
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error(f"--device {args.device}: CUDA is not available here; use --device cpu")
    if args.json and not Path(args.json).resolve().parent.is_dir():
        parser.error(f"--json {args.json}: its folder does not exist")


def _sync(device: str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(
        prog="python -m envs.bench.steps", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--env", choices=["navigation", "spread"], default="navigation", help="which env to time")
    parser.add_argument("--num-envs", type=positive_int, nargs="+", default=[32, 256, 1024, 4096], help="batch sizes")
    parser.add_argument("--n-agents", type=positive_int, nargs="+", default=[3, 24], help="agents per env")
    parser.add_argument(
        "--steps", type=positive_int, default=100, help="steps per timed run (one full episode by default)"
    )
    parser.add_argument("--repeats", type=positive_int, default=5, help="timed runs per figure; the median is reported")
    parser.add_argument("--device", default="cpu", help="torch device for both sides")
    parser.add_argument("--no-vmas", action="store_true", help="skip VMAS even when it is installed")
    parser.add_argument(
        "--compile",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also time vecmarl with compile=True (torch.compile'd physics; compile time is not timed)",
    )
    parser.add_argument("--json", default=None, help="also write the rows to this JSON file")
    args = parser.parse_args(argv)
    check_device_and_json(parser, args)

    try:
        import vmas  # noqa: F401

        with_vmas = not args.no_vmas
    except ImportError:
        with_vmas = False
        print("vmas is not installed (pip install 'vecmarl[vmas]'): showing vecmarl only")

    print(f"command: python -m envs.bench.steps {' '.join(argv if argv is not None else sys.argv[1:])}")
    print(f"device: {args.device}, torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(f"steps per run: {args.steps}, median of {args.repeats} runs, env-steps/s (one env, all agents)")
    columns = ["eager", "compiled"] if args.compile else ["eager"]
    header = f"{'env':<11}{'num_envs':>9}{'n_agents':>9}" + "".join(f"{'vecmarl ' + c:>18}" for c in columns)
    header += f"{'VMAS':>12}" + "".join(f"{'ratio ' + c:>16}" for c in columns)
    print(header)
    print("-" * len(header))
    rows = []
    for n_agents in args.n_agents:
        for num_envs in args.num_envs:
            ours = {
                c: time_vecmarl(args.env, num_envs, n_agents, args.steps, args.repeats, args.device, c == "compiled")
                for c in columns
            }
            theirs = (
                time_vmas(args.env, num_envs, n_agents, args.steps, args.repeats, args.device) if with_vmas else None
            )
            line = f"{args.env:<11}{num_envs:>9}{n_agents:>9}" + "".join(f"{ours[c]:>18,.0f}" for c in columns)
            line += f"{theirs:>12,.0f}" if theirs else f"{'-':>12}"
            line += "".join(f"{ours[c] / theirs:>15.2f}x" if theirs else f"{'-':>16}" for c in columns)
            print(line, flush=True)
            rows.append(
                {
                    "env": args.env,
                    "num_envs": num_envs,
                    "n_agents": n_agents,
                    "device": args.device,
                    "steps": args.steps,
                    "repeats": args.repeats,
                    **{f"vecmarl_{c}_env_steps_per_s": ours[c] for c in columns},
                    "vmas_env_steps_per_s": theirs,
                    **{f"vecmarl_{c}_vs_vmas": ours[c] / theirs if theirs else None for c in columns},
                }
            )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)
    return rows


if __name__ == "__main__":
    main()

"""Equal-work throughput of the VMAS adapter against raw VMAS and TorchRL's `VmasEnv`.

    python -m envs.bench_adapters                                        # adapter vs raw VMAS
    python -m envs.bench_adapters --peer-python /work/peers/torchrl/bin/python --json bench.json

Every side runs VMAS's `navigation` (n_agents=3, a 100-step time limit) at the same `num_envs`, seed
and actions (8 pre-sampled sets of uniform random forces, cycled), and resets finished envs the way
its users do:
- the vecmarl adapter (`envs.make("vmas/navigation")`): auto-reset inside `step`;
- raw VMAS: `reset()` when every env is done, `reset_at(i)` for each finished env otherwise;
- TorchRL: `env.step_and_maybe_reset(td)`, what its collectors call. torchrl is not a vecmarl
  dependency: this side runs in a subprocess with `--peer-python` (a Python with torchrl and vmas),
  which prints its figures as JSON.
An env-step is one step of one env (all its agents). Each figure is the median of `--repeats` timed
runs of `--steps` steps after a warm-up; the adapter and raw VMAS alternate run by run, so that load
from other processes hits both alike. The ratios are time per step against raw VMAS, from this run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

import torch

import envs

N_AGENTS, MAX_STEPS, SEED, ACTION_SEED, ACTION_SETS, WARMUP = 3, 100, 0, 1, 8, 5

# Run by --peer-python: TorchRL's VmasEnv on the same settings; argv[1] is a JSON dict of them.
PEER_SCRIPT = r"""
import json, statistics, sys, time
import torch
from torchrl.envs.libs.vmas import VmasEnv

a = json.loads(sys.argv[1])
rates = {}
for num_envs in a["num_envs"]:
    env = VmasEnv("navigation", num_envs=num_envs, continuous_actions=True, max_steps=a["max_steps"],
                  seed=a["seed"], device=a["device"], n_agents=a["n_agents"])
    generator = torch.Generator(a["device"]).manual_seed(a["action_seed"])
    actions = [torch.rand(num_envs, a["n_agents"], 2, generator=generator, device=a["device"]) * 2 - 1
               for _ in range(a["action_sets"])]
    td = env.reset()
    def run(steps):
        global td
        for i in range(steps):
            td["agents", "action"] = actions[i % len(actions)]
            _, td = env.step_and_maybe_reset(td)
        if a["device"].startswith("cuda"):
            torch.cuda.synchronize()
    run(a["warmup"])
    times = []
    for _ in range(a["repeats"]):
        start = time.perf_counter()
        run(a["steps"])
        times.append(time.perf_counter() - start)
    rates[str(num_envs)] = num_envs * a["steps"] / statistics.median(times)
print(json.dumps({"torchrl": __import__("torchrl").__version__, "rates": rates}))
"""


def actions(num_envs: int, device: str) -> list[torch.Tensor]:
    """The action sets every side steps: `[num_envs, n_agents, 2]` forces in [-1, 1]."""
    generator = torch.Generator(device).manual_seed(ACTION_SEED)
    return [torch.rand(num_envs, N_AGENTS, 2, generator=generator, device=device) * 2 - 1 for _ in range(ACTION_SETS)]


def adapter_runner(num_envs: int, device: str) -> Callable[[int], None]:
    env = envs.make(
        "vmas/navigation", num_envs=num_envs, device=device, seed=SEED, max_steps=MAX_STEPS, n_agents=N_AGENTS
    )
    sets = [{"agent": a} for a in actions(num_envs, device)]

    def run(steps: int) -> None:
        for i in range(steps):
            env.step(sets[i % len(sets)])

    return run


def raw_vmas_runner(num_envs: int, device: str) -> Callable[[int], None]:
    import vmas

    env = vmas.make_env(
        "navigation", num_envs=num_envs, device=device, seed=SEED, max_steps=MAX_STEPS, n_agents=N_AGENTS
    )
    sets = [list(a.unbind(1)) for a in actions(num_envs, device)]  # VMAS takes one [B, 2] per agent

    def run(steps: int) -> None:
        for i in range(steps):
            done = env.step(sets[i % len(sets)])[2]
            if done.all():
                env.reset()
            elif done.any():
                for index in done.nonzero()[:, 0].tolist():
                    env.reset_at(index)

    return run


def median_rates(runners: dict[str, Callable[[int], None]], num_envs: int, args) -> dict[str, float]:
    """env-steps/s per runner: the median of `args.repeats` timed runs, runners alternating."""
    for run in runners.values():
        run(WARMUP)
    times: dict[str, list[float]] = {name: [] for name in runners}
    for _ in range(args.repeats):
        for name, run in runners.items():
            _sync(args.device)
            start = time.perf_counter()
            run(args.steps)
            _sync(args.device)
            times[name].append(time.perf_counter() - start)
    return {name: num_envs * args.steps / statistics.median(t) for name, t in times.items()}


def peer_rates(args) -> tuple[dict[int, float], str]:
    """TorchRL's figures from `args.peer_python`, and its version."""
    settings = {
        "num_envs": args.num_envs,
        "steps": args.steps,
        "repeats": args.repeats,
        "device": args.device,
        "n_agents": N_AGENTS,
        "max_steps": MAX_STEPS,
        "seed": SEED,
        "action_seed": ACTION_SEED,
        "action_sets": ACTION_SETS,
        "warmup": WARMUP,
    }
    result = subprocess.run(
        [args.peer_python, "-c", PEER_SCRIPT, json.dumps(settings)], capture_output=True, text=True, check=False
    )
    if result.returncode != 0:
        raise RuntimeError(f"the TorchRL side failed ({args.peer_python}):\n{result.stderr[-2000:]}")
    report = json.loads(result.stdout.strip().splitlines()[-1])
    return {int(k): v for k, v in report["rates"].items()}, report["torchrl"]


def _sync(device: str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(
        prog="python -m envs.bench_adapters", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--num-envs", type=int, nargs="+", default=[256, 1024], help="batch sizes")
    parser.add_argument("--steps", type=int, default=100, help="steps per timed run (one 100-step episode)")
    parser.add_argument("--repeats", type=int, default=7, help="timed runs per figure; the median is reported")
    parser.add_argument("--device", default="cpu", help="torch device for every side")
    parser.add_argument("--peer-python", default=None, help="a Python with torchrl and vmas, for the TorchRL column")
    parser.add_argument("--json", default=None, help="also write the rows to this JSON file")
    args = parser.parse_args(argv)

    peer, peer_version = peer_rates(args) if args.peer_python else ({}, None)
    print(f"command: python -m envs.bench_adapters {' '.join(argv if argv is not None else sys.argv[1:])}")
    print(
        f"VMAS navigation, n_agents={N_AGENTS}, max_steps={MAX_STEPS}; device {args.device}, torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads, load average {os.getloadavg()[0]:.2f}"
        + (f"; TorchRL {peer_version}" if peer_version else "; TorchRL not measured (no --peer-python)")
    )
    print(f"median of {args.repeats} runs of {args.steps} steps; env-steps/s; time per step relative to raw VMAS")
    header = (
        f"{'num_envs':>9}{'vecmarl adapter':>17}{'raw VMAS':>12}{'TorchRL':>12}{'adapter time':>15}{'TorchRL time':>15}"
    )
    print(header)
    print("-" * len(header))
    rows = []
    for num_envs in args.num_envs:
        runners = {"adapter": adapter_runner(num_envs, args.device), "raw": raw_vmas_runner(num_envs, args.device)}
        rates = median_rates(runners, num_envs, args)
        torchrl = peer.get(num_envs)
        line = f"{num_envs:>9}{rates['adapter']:>17,.0f}{rates['raw']:>12,.0f}"
        line += f"{torchrl:>12,.0f}" if torchrl else f"{'-':>12}"
        line += f"{rates['raw'] / rates['adapter']:>14.2f}x"
        line += f"{rates['raw'] / torchrl:>14.2f}x" if torchrl else f"{'-':>15}"
        print(line, flush=True)
        rows.append(
            {
                "env": "vmas/navigation",
                "num_envs": num_envs,
                "n_agents": N_AGENTS,
                "device": args.device,
                "adapter_env_steps_per_s": rates["adapter"],
                "raw_vmas_env_steps_per_s": rates["raw"],
                "torchrl_env_steps_per_s": torchrl,
                "adapter_time_vs_raw": rates["raw"] / rates["adapter"],
                "torchrl_time_vs_raw": rates["raw"] / torchrl if torchrl else None,
            }
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)
    return rows


if __name__ == "__main__":
    main()

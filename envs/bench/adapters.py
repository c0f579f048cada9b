"""Equal-work throughput of the VMAS adapter against raw VMAS and TorchRL's `VmasEnv`.

    python -m envs.bench.adapters                                        # adapter vs raw VMAS
    python -m envs.bench.adapters --peer-python /work/peers/torchrl/bin/python --json bench.json

Every side runs VMAS's `navigation` (n_agents=3, a 100-step time limit) at the same `num_envs`, seed
and actions (8 pre-sampled sets of uniform random forces, cycled), and resets finished envs the way
its users do:
- the vecmarl adapter (`envs.make("vmas/navigation")`): auto-reset inside `step`;
- raw VMAS: `reset()` when every env is done, `reset_at(i)` for each finished env otherwise;
- raw VMAS the same way under `torch.inference_mode()`, as the adapter runs it (VMAS's default is
  `no_grad`): the adapter's own cost per step is its time against this column;
- TorchRL: `env.step_and_maybe_reset(td)`, what its collectors call. torchrl is not a vecmarl
  dependency: this side runs in a subprocess with `--peer-python` (a Python with torchrl and vmas),
  stepped on request, so that all sides take turns.
An env-step is one step of one env (all its agents). Each figure is the median of the timed runs of
`--steps` steps, `--repeats` on each of `--instances` envs per side (see `median_rates` for why), each
after a few untimed steps of the same env; the sides take turns run by run, in a rotating order, so
that load from other processes hits them alike. The ratios are time per step against raw VMAS
(`vs inference`: against raw VMAS under inference mode), from this run.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

import torch

import envs
from envs.bench.steps import _sync, check_device_and_json
from kernels.bench.options import check_peer_python, checked, positive_int

N_AGENTS, MAX_STEPS, SEED, ACTION_SEED, ACTION_SETS, WARMUP = 3, 100, 0, 1, 8, 5

# Run by --peer-python: TorchRL's VmasEnv on the same settings (argv[1], JSON), driven over stdin:
# "make <num_envs>" builds one more env and answers its index; "run <index> <steps>" steps that env and
# answers the seconds taken.
PEER_SCRIPT = r"""
import json, sys, time
import torch
import torchrl
from torchrl.envs.libs.vmas import VmasEnv

a = json.loads(sys.argv[1])
torch.set_num_threads(a["threads"])
print(json.dumps({"torchrl": torchrl.__version__}), flush=True)
sides = []  # [env, actions, td]
for line in sys.stdin:
    command, *values = line.split()
    if command == "make":
        num_envs = int(values[0])
        env = VmasEnv("navigation", num_envs=num_envs, continuous_actions=True, max_steps=a["max_steps"],
                      seed=a["seed"], device=a["device"], n_agents=a["n_agents"])
        generator = torch.Generator(a["device"]).manual_seed(a["action_seed"])
        actions = [torch.rand(num_envs, a["n_agents"], 2, generator=generator, device=a["device"]) * 2 - 1
                   for _ in range(a["action_sets"])]
        sides.append([env, actions, env.reset()])
        print(len(sides) - 1, flush=True)
    else:
        side = sides[int(values[0])]
        env, actions, td = side
        if a["device"].startswith("cuda"):
            torch.cuda.synchronize()
        start = time.perf_counter()
        for i in range(int(values[1])):
            td["agents", "action"] = actions[i % len(actions)]
            _, td = env.step_and_maybe_reset(td)
        if a["device"].startswith("cuda"):
            torch.cuda.synchronize()
        side[2] = td
        print(time.perf_counter() - start, flush=True)
"""


def actions(num_envs: int, device: str) -> list[torch.Tensor]:
    """The action sets every side steps: `[num_envs, n_agents, 2]` forces in [-1, 1]."""
    generator = torch.Generator(device).manual_seed(ACTION_SEED)
    return [torch.rand(num_envs, N_AGENTS, 2, generator=generator, device=device) * 2 - 1 for _ in range(ACTION_SETS)]


def adapter_runner(num_envs: int, device: str) -> Callable[[int], float]:
    env = envs.make(
        "vmas/navigation", num_envs=num_envs, device=device, seed=SEED, max_steps=MAX_STEPS, n_agents=N_AGENTS
    )
    sets = [{"agent": a} for a in actions(num_envs, device)]

    def run(steps: int) -> None:
        for i in range(steps):
            env.step(sets[i % len(sets)])

    return timed(run, device)


def raw_vmas_runner(num_envs: int, device: str, inference_mode: bool = False) -> Callable[[int], float]:
    import vmas

    with torch.inference_mode(inference_mode):
        env = vmas.make_env(
            "navigation", num_envs=num_envs, device=device, seed=SEED, max_steps=MAX_STEPS, n_agents=N_AGENTS
        )
    sets = [list(a.unbind(1)) for a in actions(num_envs, device)]  # VMAS takes one [B, 2] per agent

    def run(steps: int) -> None:
        with torch.inference_mode(inference_mode):
            for i in range(steps):
                done = env.step(sets[i % len(sets)])[2]
                if done.all():
                    env.reset()
                elif done.any():
                    for index in done.nonzero()[:, 0].tolist():
                        env.reset_at(index)

    return timed(run, device)


class TorchRLPeer:
    """TorchRL's side in a subprocess of `python` (with torchrl and vmas), stepped on request."""

    def __init__(self, python: str, device: str, threads: int) -> None:
        self.errors = tempfile.TemporaryFile(mode="w+")  # a file, not a pipe: warnings never fill it up
        settings = {
            "device": device,
            "threads": threads,
            "n_agents": N_AGENTS,
            "max_steps": MAX_STEPS,
            "seed": SEED,
            "action_seed": ACTION_SEED,
            "action_sets": ACTION_SETS,
        }
        self.process = subprocess.Popen(
            [python, "-c", PEER_SCRIPT, json.dumps(settings)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.errors,
            text=True,
        )
        self.version = json.loads(self._ask(None))["torchrl"]

    def runner(self, num_envs: int) -> Callable[[int], float]:
        """A new env of `num_envs` in the subprocess, and the call that times `steps` of it."""
        index = self._ask(f"make {num_envs}")
        return lambda steps: float(self._ask(f"run {index} {steps}"))

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait(timeout=60)

    def _ask(self, command: str | None) -> str:
        if command is not None:
            self.process.stdin.write(command + "\n")
            self.process.stdin.flush()
        answer = self.process.stdout.readline()
        if not answer:
            self.errors.seek(0)
            raise RuntimeError(f"the TorchRL side stopped:\n{self.errors.read()[-2000:]}")
        return answer.strip()


def timed(run: Callable[[int], None], device: str) -> Callable[[int], float]:
    def seconds(steps: int) -> float:
        _sync(device)
        start = time.perf_counter()
        run(steps)
        _sync(device)
        return time.perf_counter() - start

    return seconds


def median_rates(instances: list[dict[str, Callable[[int], float]]], num_envs: int, steps: int, repeats: int) -> dict:
    """env-steps/s per side: the median of its timed runs, `repeats` on each of its instances.

    Several instances per side, because identical work on two instances of one env in one process
    differs by up to 10-20% for as long as they live (most likely where their memory lands; measured:
    raw VMAS at 256 envs, four instances, medians of 15 interleaved runs, 4.96-6.16 ms a step), so one
    instance per side is a draw. The sides take turns in an order that rotates run by run, and each
    timed run follows `WARMUP` untimed steps of its own, because whoever runs right after another
    process (TorchRL's) starts with cold caches: in a run with one instance per side and a fixed
    order, the adapter, first after TorchRL, read 1.19x raw VMAS at 256 envs."""
    names = list(instances[0])
    times: dict[str, list[float]] = {name: [] for name in names}
    for repeat in range(repeats):
        for i, runners in enumerate(instances):
            shift = (repeat + i) % len(names)
            for name in names[shift:] + names[:shift]:
                runners[name](WARMUP)
                times[name].append(runners[name](steps))
    return {name: num_envs * steps / statistics.median(t) for name, t in times.items()}


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(
        prog="python -m envs.bench.adapters", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--num-envs", type=positive_int, nargs="+", default=[256, 1024], help="batch sizes")
    parser.add_argument("--steps", type=positive_int, default=100, help="steps per timed run (one 100-step episode)")
    parser.add_argument(
        "--repeats", type=positive_int, default=5, help="timed runs per instance; the median is reported"
    )
    parser.add_argument(
        "--instances", type=positive_int, default=5, help="envs built per side and size (see median_rates)"
    )
    parser.add_argument("--device", default="cpu", help="torch device for every side")
    parser.add_argument(
        "--threads", type=positive_int, default=None, help="torch threads for every side (default: torch's)"
    )
    parser.add_argument("--peer-python", default=None, help="a Python with torchrl and vmas, for the TorchRL column")
    parser.add_argument("--json", default=None, help="also write the rows to this JSON file")
    args = parser.parse_args(argv)
    check_device_and_json(parser, args)
    if importlib.util.find_spec("vmas") is None:
        parser.error("vmas is not installed here (pip install 'vecmarl[vmas]'): every side runs VMAS")
    if args.peer_python:
        checked(parser, check_peer_python, "--peer-python", args.peer_python, ("torchrl", "vmas"))

    if args.threads:
        torch.set_num_threads(args.threads)
    peer = TorchRLPeer(args.peer_python, args.device, torch.get_num_threads()) if args.peer_python else None
    print(f"command: python -m envs.bench.adapters {' '.join(argv if argv is not None else sys.argv[1:])}")
    print(
        f"VMAS navigation, n_agents={N_AGENTS}, max_steps={MAX_STEPS}; device {args.device}, torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads, load average {os.getloadavg()[0]:.2f}"
        + (f"; TorchRL {peer.version}" if peer else "; TorchRL not measured (no --peer-python)")
    )
    print(
        f"median of {args.repeats} runs of {args.steps} steps on each of {args.instances} instances per side, sides "
        "taking turns; env-steps/s; time per step vs raw VMAS"
    )
    header = (
        f"{'num_envs':>9}{'vecmarl adapter':>17}{'raw VMAS':>12}{'raw, inference':>16}{'TorchRL':>12}"
        f"{'adapter time':>15}{'vs inference':>14}{'TorchRL time':>15}"
    )
    print(header)
    print("-" * len(header))
    rows = []
    for num_envs in args.num_envs:
        instances = []
        for _ in range(args.instances):
            runners = {
                "adapter": adapter_runner(num_envs, args.device),
                "raw": raw_vmas_runner(num_envs, args.device),
                "raw_inference": raw_vmas_runner(num_envs, args.device, inference_mode=True),
            }
            if peer:
                runners["torchrl"] = peer.runner(num_envs)
            instances.append(runners)
        rates = median_rates(instances, num_envs, args.steps, args.repeats)
        torchrl = rates.get("torchrl")
        line = f"{num_envs:>9}{rates['adapter']:>17,.0f}{rates['raw']:>12,.0f}{rates['raw_inference']:>16,.0f}"
        line += f"{torchrl:>12,.0f}" if torchrl else f"{'-':>12}"
        line += f"{rates['raw'] / rates['adapter']:>14.2f}x{rates['raw_inference'] / rates['adapter']:>13.2f}x"
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
                "raw_vmas_inference_mode_env_steps_per_s": rates["raw_inference"],
                "torchrl_env_steps_per_s": torchrl,
                "adapter_time_vs_raw": rates["raw"] / rates["adapter"],
                "adapter_time_vs_raw_inference_mode": rates["raw_inference"] / rates["adapter"],
                "torchrl_time_vs_raw": rates["raw"] / torchrl if torchrl else None,
            }
        )
    if peer:
        peer.close()
    print(f"load average at the end: {os.getloadavg()[0]:.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)
    return rows


if __name__ == "__main__":
    main()

"""BenchMARL's side of `marl.bench.train`, from vecmarl's process: one run in the peer's Python.

torchrl and BenchMARL are not vecmarl dependencies and are never imported in vecmarl's process:
`run_benchmarl` starts `PEER_PYTHON -I marl/bench/benchmarl_worker.py SETTINGS_JSON` with a Python that
has them (benchmarl 1.5 needs torchrl 0.10 or 0.11; vmas) and reads the JSON line the worker prints last.
What the worker runs and how it splits an iteration into phases: `marl.bench.benchmarl_worker`.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

WORKER = Path(__file__).with_name("benchmarl_worker.py")


def run_benchmarl(
    python: str,
    algo: str,
    frames: int,
    seed: int,
    threads: int,
    sizes: dict | None = None,
    timeout_s: float = 3600.0,
) -> dict:
    """One BenchMARL run of `algo` with `python`; returns the worker's JSON (`marl.bench.benchmarl_worker`).

    `sizes` (`marl.bench.train.Sizes` as a dict) replaces BenchMARL's batch, buffer, optimiser and network
    sizes for a smoke run; None keeps its defaults.
    """
    settings = {"algo": algo, "frames": frames, "seed": seed, "threads": threads, "sizes": sizes}
    try:
        done = subprocess.run(
            [python, "-I", str(WORKER), json.dumps(settings)],
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

"""One command for GPU evidence (issue 33): run every GPU check and benchmark, each in its own subprocess with
a timeout, within a time budget, and write what they found into one folder.

    python -m marl.bench.gpu_report DIR [--minutes 8] [--dry]

DIR gets `report.json` (date, GPU, torch / triton / tensordict versions, and per step its command, wall
time, exit status and parsed figures), `report.txt` (the same as a table) and `step_NAME.log` (each step's
raw output). Both reports are rewritten after every step, so a run cut short keeps what it measured.

The steps (`steps()`: name, share of the budget, command; sizes chosen to fit 8 minutes on an H200, as
timed on one) are the tests marked `gpu`; `check_env` (host-sync checker included) on every native env
on CUDA; GAE kernels against the reference and their bandwidth; `navigation` and `spread` env-steps/s at
4,096, 65,536 and 262,144 envs, eager and compiled; `marl train` defaults eager and `--compile` (with the
CUDA graph skips torch logs), MAPPO at 65,536 envs, and MASAC compiled with prioritized replay; 5 seeds
in one process against one; the replay buffer on CUDA; 5 seeds against one again, compiled (CUDA
graphs). A step's timeout is its share of `--minutes` plus whatever the steps before it left unused, never
past the deadline; a step that fails or hangs is recorded as such and the next one runs.

Without a CUDA GPU, or with `--dry`, nothing runs: the reports say so and list the steps that would run
with their commands, and the exit status is 0 (CI runs it that way).

`python -m marl.bench.gpu_report --check-envs [NAME ...] --device cuda --num-envs N` is step 2's worker: it
runs `envs.check_env` on each env and prints one JSON line per env.
"""

from __future__ import annotations

import argparse
import csv
import importlib.metadata
import importlib.util
import json
import os
import platform
import re
import shlex
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the repository: the steps run here (`tests` is relative to it)
CHECK_NUM_ENVS = 4096
ENV_SIZES = ("4096", "65536", "262144")
SEEDS_FRAMES = 163_840  # per seed: 10 iterations of `marl train` defaults
TRAIN_FRAMES = 262_144  # 16 iterations of the defaults (256 envs x 64 steps)
SCALE_ENVS, SCALE_MINIBATCH = 65_536, 262_144  # 16 minibatches per epoch of 65,536 x 64 frames
SCALE_FRAMES = 4 * SCALE_ENVS * 64  # 4 iterations
OFF_POLICY_FRAMES = 8 * 256 * 64  # MASAC's defaults: 8 iterations of 256 optimiser steps each


@dataclass(frozen=True)
class Step:
    """One subprocess of the report: `command` (argv; "python" stands for this interpreter), its timeout,
    and `parse(output, out_dir)`, which reads the figures from its output or the files it wrote."""

    name: str
    command: list[str]
    timeout_s: float
    parse: Callable[[str, Path], dict]


# ---- parsers: each returns the step's figures; a parser that raises leaves `parse_error` in the report ----


def parse_pytest(output: str, out: Path) -> dict:
    # `-v` prints each test's outcome as it ends: a run cut by its timeout still says how far it came.
    # One line per test: `tests/x.py::test PASSED [ 5%]`, or under xdist `[gw0] [ 5%] PASSED tests/x.py::test`.
    plain = re.findall(r"^(tests/\S+::\S+) (PASSED|FAILED|SKIPPED|ERROR)", output, re.MULTILINE)
    xdist = re.findall(r"^\[gw\d+\] \[ *\d+%\] (PASSED|FAILED|SKIPPED|ERROR) (tests/\S+::\S+)", output, re.MULTILINE)
    outcomes = plain + [(test, outcome) for outcome, test in xdist]
    counts: dict[str, int] = {}
    for _, outcome in outcomes:
        counts[outcome.lower()] = counts.get(outcome.lower(), 0) + 1
    return {"tests": counts, "not_passed": [f"{test} {outcome}" for test, outcome in outcomes if outcome != "PASSED"]}


def parse_check_envs(output: str, out: Path) -> dict:
    results = [json.loads(line) for line in output.splitlines() if line.startswith('{"env"')]
    return {"check_env": {r["env"]: r["result"] for r in results}, "num_envs": CHECK_NUM_ENVS}


def parse_kernels(output: str, out: Path) -> dict:
    report = json.loads((out / "step_kernels.json").read_text())
    peak = next((float(m) for h in report["header"] for m in re.findall(r"peak memory bandwidth: (\d+) GB/s", h)), None)
    rows = []
    for row in report["rows"]:
        rows.append(
            {
                "call": row["call"],
                "size": row["size"],
                "median_ms": round(row["median_ms"], 4),
                "gb_per_s": round(row["gb_per_s"], 1),
                "pct_peak": round(100 * row["gb_per_s"] / peak, 1) if peak else None,
                "max_abs_diff_vs_reference": row["max_abs_diff_vs_reference"],
            }
        )
    return {"peak_gb_per_s": peak, "rows": rows}


def parse_env_steps(output: str, out: Path) -> dict:
    """envs.bench's table rows as it printed them (a run cut by its timeout keeps the sizes it finished):
    `{"<env> <num_envs> envs": {"eager": env-steps/s, "compiled": env-steps/s}}`."""
    header = next(line for line in output.splitlines() if line.startswith("env ") and "vecmarl eager" in line)
    columns = ["eager", "compiled"] if "vecmarl compiled" in header else ["eager"]
    figures = {}
    for line in output.splitlines():
        words = line.split()
        if len(words) > 2 + len(columns) and words[0] in ("navigation", "spread") and words[1].isdigit():
            values = [int(word.replace(",", "")) for word in words[3 : 3 + len(columns)]]
            figures[f"{words[0]} {words[1]} envs"] = dict(zip(columns, values))
    return figures


def parse_train(run_name: str) -> Callable[[str, Path], dict]:
    def parse(output: str, out: Path) -> dict:
        with open(out / "runs" / run_name / "metrics.csv") as f:
            rows = list(csv.DictReader(f))
        rates = [float(row["frames_per_s"]) for row in rows]
        figures = {
            "iterations": len(rows),
            "frames": int(float(rows[-1]["frames"])),
            "first_iteration_s": round(float(rows[0]["time_s"]), 2),
            "median_frames_per_s_after_first": round(statistics.median(rates[1:] or rates)),
            "whole_run_frames_per_s": round(float(rows[-1]["frames"]) / float(rows[-1]["time_s"])),
        }
        if run_name.endswith("compile"):
            skips = [line for line in output.splitlines() if "skipping cudagraphs" in line]
            figures["cudagraph_skips"] = len(skips)
            figures["cudagraph_skip_reasons"] = sorted(
                {line.split("skipping cudagraphs", 1)[1][:200] for line in skips}
            )
            # The trainer's own verdicts (`envs.cudagraphs.announce`): "CUDA graphs: <step>: captured (...)".
            verdicts = [line.split("CUDA graphs: ", 1)[1] for line in output.splitlines() if "CUDA graphs: " in line]
            figures["cuda_graphs"] = dict(verdict.split(": ", 1) for verdict in verdicts if ": " in verdict)
        return figures

    return parse


def parse_seeds(step_name: str) -> Callable[[str, Path], dict]:
    """The parser of a `marl.bench.seeds` step that wrote `step_<step_name>.json`."""

    def parse(output: str, out: Path) -> dict:
        rows = json.loads((out / f"step_{step_name}.json").read_text())["rows"]
        return {
            f"{row['env']} {row['kind']}": {"s": round(row["median_s"], 1), "ratio": round(row["ratio"], 2)}
            for row in rows
        }

    return parse


def parse_replay(output: str, out: Path) -> dict:
    report = json.loads((out / "step_replay.json").read_text())
    figures = {f"{row['call']} {row['sampler']}": round(row["vecmarl_ms"], 4) for row in report["rows"]}
    if "profile" in report:  # its first line: host time and kernel launches per call (the table is in the log)
        figures["profile"] = report["profile"].splitlines()[0]
    return figures


# ---- the steps --------------------------------------------------------------------------------------------


def pytest_extras() -> list[str]:
    """Most of the GPU tests' time is Triton and Inductor compiling on the CPU, so where pytest-xdist is
    installed they run on several processes; where pytest-timeout is, one stuck test cannot take the
    others' time."""
    extras = []
    if importlib.util.find_spec("xdist") is not None:
        extras += ["-n", str(min(8, os.cpu_count() or 1))]
    if importlib.util.find_spec("pytest_timeout") is not None:
        extras += ["--timeout", "150"]  # a test compiling beside 7 others took over 90 s
    return extras


def native_envs() -> list[str]:
    """vecmarl's own envs (`envs.native`), not those a user's module or a test registered."""
    import envs
    from envs.registry import env_class

    return [name for name in envs.names() if "/" not in name and env_class(name).__module__.startswith("envs.native.")]


def steps(out: Path, minutes: float = 8.0) -> list[Step]:
    """The report's steps, with timeouts that share `minutes` (the shares add up to 1)."""
    budget = minutes * 60
    train = ["python", "-m", "marl", "train", "--device", "cuda", "--no-progress", "--no-tensorboard"]
    train += ["--log-dir", str(out / "runs"), "--checkpoint-every", "1000"]
    env_bench = ["python", "-m", "envs.bench", "--n-agents", "3", "--num-envs", *ENV_SIZES, "--steps", "50"]
    env_bench += ["--repeats", "3", "--device", "cuda", "--compile", "--no-vmas"]
    seeds = ["python", "-m", "marl.bench.seeds", "--device", "cuda", "--envs", "navigation", "--seeds", "5"]
    seeds += ["--frames", str(SEEDS_FRAMES), "--repeats", "1"]
    table = [
        (
            "gpu_tests",
            0.29,
            ["python", "-m", "pytest", "-v", "--durations=0", "-o", "faulthandler_timeout=60", "-p", "no:cacheprovider"]
            + pytest_extras()
            + ["-m", "gpu", "tests"],
            parse_pytest,
        ),
        (
            "check_envs",
            0.04,
            ["python", "-m", "marl.bench.gpu_report", "--check-envs", *native_envs()]
            + ["--device", "cuda", "--num-envs", str(CHECK_NUM_ENVS)],
            parse_check_envs,
        ),
        (
            "kernels",
            0.08,
            ["python", "-m", "kernels.bench", "--sizes", "100x1024x3x1,128x4096x8x1,1024x4096x8x1"]
            + ["--repeats", "10", "--device", "cuda", "--json", str(out / "step_kernels.json")],
            parse_kernels,
        ),
        (
            "envs_navigation",
            0.075,
            [*env_bench, "--env", "navigation", "--json", str(out / "step_envs_navigation.json")],
            parse_env_steps,
        ),
        (
            "envs_spread",
            0.075,
            [*env_bench, "--env", "spread", "--json", str(out / "step_envs_spread.json")],
            parse_env_steps,
        ),
        (
            "train_eager",
            0.04,
            [*train, "--total-frames", str(TRAIN_FRAMES), "--run-name", "train-eager"],
            parse_train("train-eager"),
        ),
        (
            "train_compile",
            0.11,
            [*train, "--total-frames", str(TRAIN_FRAMES), "--compile", "--run-name", "train-compile"],
            parse_train("train-compile"),
        ),
        (
            "train_mappo_65536",
            0.04,
            [*train, "--algo", "mappo", "--num-envs", str(SCALE_ENVS), "--minibatch-size", str(SCALE_MINIBATCH)]
            + ["--total-frames", str(SCALE_FRAMES), "--run-name", "train-mappo-65536"],
            parse_train("train-mappo-65536"),
        ),
        (
            "train_masac_compile",
            0.09,
            [*train, "--algo", "masac", "--compile", "--prioritized", "--total-frames", str(OFF_POLICY_FRAMES)]
            + ["--run-name", "train-masac-compile"],
            parse_train("train-masac-compile"),
        ),
        (
            "seeds",
            0.06,
            [*seeds, "--json", str(out / "step_seeds.json")],
            parse_seeds("seeds"),
        ),
        (
            "replay",
            0.04,
            ["python", "-m", "marl.bench.replay", "--device", "cuda", "--capacity", "1000000"]
            + ["--batch-sizes", "128,4096", "--repeats", "20", "--profile", "--json", str(out / "step_replay.json")],
            parse_replay,
        ),
        (  # last: compiling takes a while, and it gets whatever the steps before it left unused
            "seeds_compile",
            0.06,
            [*seeds, "--compile", "--json", str(out / "step_seeds_compile.json")],
            parse_seeds("seeds_compile"),
        ),
    ]
    return [Step(name, command, round(share * budget, 1), parse) for name, share, command, parse in table]


# ---- the runner -------------------------------------------------------------------------------------------


def versions() -> dict:
    found = {"python": platform.python_version()}
    for package in ("torch", "triton", "tensordict"):
        try:
            found[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            found[package] = None
    import torch

    found["cuda"] = torch.version.cuda
    return found


def find_gpu() -> tuple[str | None, str]:
    """`(GPU name, why not)`: the name of CUDA device 0, or None and the reason."""
    import torch

    if not torch.cuda.is_available():
        return None, f"no CUDA GPU found (torch {torch.__version__}, CUDA build {torch.version.cuda})"
    return torch.cuda.get_device_name(0), ""


def step_env(step: Step) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # real Triton kernels on the GPU
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env["PYTHONUNBUFFERED"] = "1"
    if "--compile" in step.command and step.name.startswith("train"):
        env["TORCH_LOGS"] = "cudagraphs"  # logs "skipping cudagraphs due to ..." for every graph not captured
    return env


def run_step(step: Step, out: Path, timeout: float) -> dict:
    log = out / f"step_{step.name}.log"
    argv = [sys.executable if word == "python" else word for word in step.command]
    start = time.perf_counter()
    with open(log, "w") as f:
        f.write(f"$ {shlex.join(step.command)}\n")
        f.flush()
        # Its own session: on a timeout the whole group goes (compile workers, pytest's children).
        process = subprocess.Popen(
            argv, cwd=ROOT, env=step_env(step), stdout=f, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            status = process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            status = "timeout"
    result = {"status": status, "wall_s": round(time.perf_counter() - start, 1), "log": log.name}
    output = log.read_text(errors="replace")
    try:
        result["figures"] = step.parse(output, out)
    except Exception as error:  # a failed or cut step leaves no figures; the report says why
        result["figures"] = {"parse_error": f"{type(error).__name__}: {error}"}
    return result


def format_report(report: dict) -> str:
    lines = [
        f"vecmarl GPU report, {report['date']}",
        f"GPU: {report['gpu'] or report['reason']}",
        "versions: " + ", ".join(f"{k} {v}" for k, v in report["versions"].items()),
        f"budget: {report['minutes']} min; mode: {report['mode']}",
        "",
    ]
    columns = ["step", "status", "wall s", "timeout s", "command"]
    rows = [
        [s["name"], str(s["status"]), str(s.get("wall_s", "-")), str(s["timeout_s"]), s["command"]]
        for s in report["steps"]
    ]
    widths = [max(len(x) for x in column) for column in zip(columns, *rows)]
    render = lambda cells: "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths)) + " |"
    lines += [render(columns), render(["-" * w for w in widths]), *map(render, rows), ""]
    for s in report["steps"]:
        if s.get("figures"):
            lines.append(f"{s['name']}:")
            lines += [f"  {key}: {json.dumps(value)}" for key, value in s["figures"].items()]
    return "\n".join(lines) + "\n"


def write_report(report: dict, out: Path) -> None:
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / "report.txt").write_text(format_report(report))


def report_gpu(out: Path, minutes: float, dry: bool) -> int:
    out.mkdir(parents=True, exist_ok=True)
    gpu, reason = find_gpu()
    if dry and gpu:
        reason = f"--dry: nothing run (GPU {gpu} found)"
    live = gpu is not None and not dry
    planned = steps(out, minutes)
    report = {
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "mode": "gpu" if live else "dry",
        "gpu": gpu,
        "reason": reason,
        "versions": versions(),
        "minutes": minutes,
        "command": "python -m marl.bench.gpu_report " + shlex.join(sys.argv[1:]),
        "steps": [
            {"name": s.name, "command": shlex.join(s.command), "timeout_s": s.timeout_s, "status": "not run"}
            for s in planned
        ],
    }
    write_report(report, out)
    if not live:
        print(
            f"gpu_report: {reason}; nothing run; wrote {out / 'report.json'} and report.txt listing the {len(planned)} steps that would run"
        )
        return 0
    print(f"gpu_report: {gpu}; {len(planned)} steps within {minutes} min, writing to {out}", flush=True)
    deadline = time.monotonic() + minutes * 60
    banked = 0.0  # time earlier steps left unused
    for step, entry in zip(planned, report["steps"]):
        timeout = min(step.timeout_s + banked, deadline - time.monotonic())
        if timeout < 1:
            entry["status"] = "skipped: out of time"
            continue
        entry.update(run_step(step, out, timeout))
        banked = max(0.0, timeout - entry["wall_s"])
        print(f"  {step.name}: {entry['status']} in {entry['wall_s']} s (limit {timeout:.0f} s)", flush=True)
        write_report(report, out)
    write_report(report, out)
    failed = [s["name"] for s in report["steps"] if s["status"] != 0]
    print(f"gpu_report: done; {len(failed)} step(s) failed or cut: {failed or 'none'}; see {out / 'report.txt'}")
    return 0


def check_envs(names: list[str], device: str, num_envs: int) -> int:
    """Step 2's worker: `check_env` on each env; one JSON line per env; exit status 1 if any failed."""
    import envs

    failed = 0
    for name in names or native_envs():
        start = time.perf_counter()
        try:
            envs.check_env(envs.make(name, num_envs=num_envs, device=device, seed=0))
            result = "ok"
        except Exception as error:
            failed += 1
            result = f"FAILED: {type(error).__name__}: {error}"
        line = {"env": name, "device": device, "num_envs": num_envs, "result": result}
        print(json.dumps({**line, "seconds": round(time.perf_counter() - start, 2)}), flush=True)
    return 1 if failed else 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m marl.bench.gpu_report",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("dir", nargs="?", type=Path, help="folder to write report.json, report.txt and logs to")
    parser.add_argument("--minutes", type=float, default=8.0, help="time budget of all the steps (default 8)")
    parser.add_argument("--dry", action="store_true", help="run nothing: write the reports listing the steps")
    parser.add_argument("--check-envs", nargs="*", metavar="NAME", help="step 2's worker (default: every native env)")
    parser.add_argument("--device", default="cuda", help="with --check-envs: the device")
    parser.add_argument("--num-envs", type=int, default=CHECK_NUM_ENVS, help="with --check-envs: envs per batch")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.check_envs is not None:
        return check_envs(args.check_envs, args.device, args.num_envs)
    if args.dir is None:
        parser.error("give DIR, the folder to write the report to")
    if not args.minutes > 0:
        parser.error(f"--minutes {args.minutes}: expected a positive number")
    return report_gpu(args.dir, args.minutes, args.dry)


if __name__ == "__main__":
    sys.exit(main())

"""Benchmark vecmarl's GAE against its reference loop and TorchRL's GAE on the same data.

    python -m kernels.bench.gae [--sizes 100x1024x3x1,...] [--repeats 7] [--rounds 1] [--threads N]
                            [--peer-python PATH] [--json PATH]

Each size is `TxBxnx1`: a time-major rollout `[T, B, n, 1]` of float32 rewards and values and bool
per-agent flags (2% of steps end an episode, half of those by termination). Every call is timed as a
user makes it, the median of `--repeats` back-to-back calls after one warm-up call; with `--rounds`,
all of that is repeated and the medians over rounds reported. TorchRL's functions take batch-major
tensors with time at `time_dim`; they get the same time-major tensors with `time_dim=0` and transpose
inside the call, which is timed. TorchRL is never a dependency: it is imported when importable, or run in
a subprocess of `--peer-python` (this file run as a script, which imports only torch and torchrl).

Effective bandwidth counts the bytes a single pass must move: every input once, both float32 outputs. On
CUDA one more row times `GRAPH_CALLS` calls captured in one CUDA graph, per call: the kernel without the
host's launch cost, which at these sizes is most of a single call's time.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import datetime, timezone
from functools import partial
from pathlib import Path

import torch

DEFAULT_SIZES = "100x1024x3x1,128x4096x4x1,128x4096x8x1,1024x256x1x1"
GAMMA, LMBDA = 0.99, 0.95
INPUTS = ("reward", "value", "next_value", "done", "terminated")

# Peak memory bandwidth in bytes/s, by a substring of torch.cuda.get_device_name(), most specific first.
PEAK_BANDWIDTH = {
    "H200": 4.8e12,
    "H100 NVL": 3.9e12,
    "H100 PCIe": 2.0e12,
    "H100": 3.35e12,
    "A100-SXM4-80GB": 2.039e12,
    "A100 80GB PCIe": 1.935e12,
    "A100": 1.555e12,
    "L40S": 0.864e12,
    "A10": 0.6e12,
    "L4": 0.3e12,
    "T4": 0.32e12,
    "V100": 0.9e12,
    "RTX 4090": 1.008e12,
    "RTX 3090": 0.936e12,
}


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median_seconds(calls: dict[str, Callable[[], object]], repeats: int, device: torch.device) -> dict[str, float]:
    """Median wall time of each call over `repeats` back-to-back runs, after one warm-up (compilation,
    autotuning, the allocator's first fresh pages): the usual microbenchmark, warm caches included."""
    seconds = {}
    for name, call in calls.items():
        call()
        times = []
        for _ in range(repeats):
            synchronize(device)
            start = time.perf_counter()
            call()
            synchronize(device)
            times.append(time.perf_counter() - start)
        seconds[name] = statistics.median(times)
    return seconds


def make_rollout(size: tuple[int, ...], device: torch.device) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    data = {name: torch.randn(size, generator=generator) for name in ("reward", "value", "next_value")}
    data["done"] = torch.rand(size, generator=generator) < 0.02
    data["terminated"] = data["done"] & (torch.rand(size, generator=generator) < 0.5)
    return {name: x.to(device) for name, x in data.items()}


def time_torchrl(data: dict[str, torch.Tensor], repeats: int) -> dict[str, dict]:
    """Time TorchRL's loop and vectorised GAE on time-major data: {id: {seconds, outputs}}."""
    from torchrl.objectives.value.functional import (
        generalized_advantage_estimate,
        vec_generalized_advantage_estimate,
    )

    # TorchRL's argument order; every tensor has the values' shape, as TorchRL requires.
    args = (data["value"], data["next_value"], data["reward"], data["done"], data["terminated"])
    functions = {
        "torchrl_loop": generalized_advantage_estimate,
        "torchrl_vec": vec_generalized_advantage_estimate,
    }
    calls = {name: lambda f=f: f(GAMMA, LMBDA, *args, time_dim=0) for name, f in functions.items()}
    seconds = median_seconds(calls, repeats, data["value"].device)
    return {name: {"seconds": seconds[name], "outputs": call()} for name, call in calls.items()}


def torchrl_in_subprocess(
    peer_python: str, data: dict[str, torch.Tensor], repeats: int, workdir: Path
) -> tuple[dict[str, dict], str]:
    """Run `time_torchrl` with another interpreter (this file as a script) on the same data."""
    data_path, result_path = workdir / "data.pt", workdir / "result.pt"
    torch.save({name: x.cpu() for name, x in data.items()}, data_path)
    device, threads = str(data["value"].device), str(torch.get_num_threads())
    command = [peer_python, str(Path(__file__).resolve()), "--worker", str(data_path), str(result_path)]
    env = {**os.environ, "VECMARL_BENCH_DEVICE": device, "VECMARL_BENCH_THREADS": threads}
    subprocess.run([*command, "--repeats", str(repeats)], check=True, env=env)
    result = torch.load(result_path)
    for timing in result["timings"].values():
        timing["outputs"] = tuple(x.to(data["value"].device) for x in timing["outputs"])
    return result["timings"], result["versions"]


def worker(data_path: str, result_path: str, repeats: int) -> None:
    """Subprocess side of `torchrl_in_subprocess` (imports torch and torchrl only)."""
    import torchrl

    torch.set_num_threads(int(os.environ["VECMARL_BENCH_THREADS"]))
    device = torch.device(os.environ["VECMARL_BENCH_DEVICE"])
    data = {name: x.to(device) for name, x in torch.load(data_path).items()}
    timings = time_torchrl(data, repeats)
    for timing in timings.values():
        timing["outputs"] = tuple(x.cpu() for x in timing["outputs"])
    versions = f"torchrl {torchrl.__version__}, torch {torch.__version__}, {sys.executable}"
    torch.save({"timings": timings, "versions": versions}, result_path)


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        model = next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if "model name" in line)
        model = model.split(":", 1)[1].strip()
    except (OSError, StopIteration):
        model = platform.processor() or "CPU"
    return f"{model}, {os.cpu_count()} cores, {torch.get_num_threads()} torch threads"


def peak_bandwidth(device: torch.device, override_gbps: float | None) -> float | None:
    if override_gbps:
        return override_gbps * 1e9
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((peak for key, peak in PEAK_BANDWIDTH.items() if key in name), None)


GRAPH_CALLS = 10  # calls per CUDA graph replay (`captured`)
LABELS = {
    "reference": "gae_reference (plain loop)",
    "torchrl_loop": "torchrl generalized_advantage_estimate(time_dim=0)",
    "torchrl_vec": "torchrl vec_generalized_advantage_estimate(time_dim=0)",
    "graph": f'gae(backend="auto"), {GRAPH_CALLS} calls in one CUDA graph, per call',
}
BASELINES = ("reference", "torchrl_loop", "torchrl_vec")


def captured(call: Callable[[], object]) -> Callable[[], object] | None:
    """`GRAPH_CALLS` back-to-back `call()`s captured as one CUDA graph: a replay launches them all at once,
    so its time over `GRAPH_CALLS` is the kernel's own, without the host's launch cost (as in a compiled
    training step). Returns a call that replays it and gives the last call's outputs, or None (with a
    note) where capture fails."""
    try:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            call()  # compiles and autotunes outside the capture
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(GRAPH_CALLS):
                out = call()
    except Exception as error:  # noqa: BLE001  (the row is left out, the rest of the table stands)
        print(f"note: no CUDA graph row: capturing gae failed ({type(error).__name__}: {error})", file=sys.stderr)
        return None

    def replay():
        graph.replay()
        return out

    return replay


def bench_size(size, device, backends, repeats, rounds, peer_python, workdir) -> tuple[list[dict], str | None]:
    """Time every call on one rollout size; one row per call, with its speedups over the baselines.

    Each of `rounds` rounds times every call (TorchRL in a fresh subprocess); a row reports the median
    over rounds of the call's time and of its per-round speedups, so a burst of load from other
    processes during one round does not decide the result.
    """
    from kernels.gae import gae, gae_reference

    data = make_rollout(size, device)
    inputs = tuple(data[name] for name in INPUTS)
    calls = {f"gae_{backend}": partial(gae, *inputs, gamma=GAMMA, lmbda=LMBDA, backend=backend) for backend in backends}
    calls["reference"] = partial(gae_reference, *inputs, gamma=GAMMA, lmbda=LMBDA)
    if device.type == "cuda" and "gae_auto" in calls:
        graphed = captured(calls["gae_auto"])
        if graphed is not None:
            calls["graph"] = graphed
    outputs = {name: call() for name, call in calls.items()}
    per_round, peer_versions = [], None
    for _ in range(rounds):
        seconds = median_seconds(calls, repeats, device)
        if "graph" in seconds:
            seconds["graph"] /= GRAPH_CALLS
        peer = {}
        if importlib.util.find_spec("torchrl") is not None:
            peer = time_torchrl(data, repeats)
        elif peer_python:
            peer, peer_versions = torchrl_in_subprocess(peer_python, data, repeats, workdir)
        seconds.update({name: timing["seconds"] for name, timing in peer.items()})
        outputs.update({name: timing["outputs"] for name, timing in peer.items()})
        per_round.append(seconds)
    elements = data["value"].numel()
    bytes_moved = sum(x.numel() * x.element_size() for x in inputs) + 2 * 4 * elements  # + 2 fp32 outputs
    rows = []
    for name in per_round[0]:
        median = statistics.median(timing[name] for timing in per_round)
        pairs = zip(outputs[name], outputs["reference"], strict=True)
        diffs = [(got.float() - want).abs().max().item() for got, want in pairs]
        speedups = {
            f"speedup_vs_{base}": statistics.median(timing[base] / timing[name] for timing in per_round)
            for base in BASELINES
            if base in per_round[0]
        }
        rows.append(
            {
                "call": LABELS.get(name, f'gae(backend="{name.removeprefix("gae_")}")'),
                "size": "x".join(map(str, size)),
                "device": device.type,
                "median_ms": median * 1e3,
                "elements_per_s": elements / median,
                "gb_per_s": bytes_moved / median / 1e9,
                **speedups,
                "max_abs_diff_vs_reference": max(diffs),
                "round_ms": [timing[name] * 1e3 for timing in per_round],
            }
        )
    return rows, peer_versions


def format_table(rows: list[dict], peak: float | None) -> str:
    columns = ["call", "size [T,B,n,1]", "device", "median ms", "Melem/s", "GB/s"]
    columns += ["% peak BW"] if peak else []
    columns += ["x reference", "x torchrl loop", "x torchrl vec", "max |diff|"]
    lines = []
    for row in rows:
        cells = [row["call"], row["size"], row["device"], f"{row['median_ms']:.3f}"]
        cells += [f"{row['elements_per_s'] / 1e6:.0f}", f"{row['gb_per_s']:.2f}"]
        cells += [f"{100 * row['gb_per_s'] * 1e9 / peak:.0f}%"] if peak else []
        cells += [f"{row[f'speedup_vs_{base}']:.2f}" if f"speedup_vs_{base}" in row else "n/a" for base in BASELINES]
        cells.append(f"{row['max_abs_diff_vs_reference']:.1e}")
        lines.append(cells)
    widths = [max(len(str(x)) for x in column) for column in zip(columns, *lines, strict=True)]
    render = lambda cells: "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"
    return "\n".join([render(columns), render(["-" * w for w in widths]), *map(render, lines)])


def parse_sizes(text: str) -> list[tuple[int, ...]]:
    try:
        sizes = [tuple(int(x) for x in item.strip().lower().split("x")) for item in text.split(",") if item.strip()]
    except ValueError:
        sizes = []
    if not sizes or any(len(size) < 1 or min(size) < 1 for size in sizes):
        raise argparse.ArgumentTypeError(f"sizes {text!r}: expected e.g. 100x1024x3x1,128x4096x4x1")
    return sizes


def check_args(args: argparse.Namespace) -> tuple[torch.device, list[str]]:
    """The device and the backends to time, or a ValueError saying what is wrong, before anything runs."""
    from kernels._common import resolve_backend
    from kernels.gae import _gae_kernel

    try:
        device = torch.device(args.device)
    except RuntimeError:
        raise ValueError(f"--device {args.device!r}: expected cpu, cuda or cuda:N") from None
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"--device {args.device!r}: expected cpu, cuda or cuda:N")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {args.device}: CUDA is not available here; use --device cpu")
    default_backends = ["auto", "torch"] if device.type == "cuda" else ["auto"]
    backends = [b.strip() for b in args.backends.split(",") if b.strip()] if args.backends else default_backends
    for backend in backends:
        try:
            resolve_backend(backend, device, _gae_kernel)
        except (ValueError, RuntimeError) as error:
            raise ValueError(f"--backends {args.backends}: {error}") from None
    if args.peak_gbps is not None and not args.peak_gbps > 0:
        raise ValueError(f"--peak-gbps {args.peak_gbps}: expected a positive number of GB/s")
    if args.peer_python:
        # Imported here, not at the top: this file also runs as the peer's script, where only torch is importable.
        from kernels.bench.options import check_peer_python

        check_peer_python("--peer-python", args.peer_python, ("torchrl",))
    if args.json and not Path(args.json).resolve().parent.is_dir():
        raise ValueError(f"--json {args.json}: its folder does not exist")
    return device, backends


def main(argv: list[str] | None = None) -> None:
    from kernels.bench.options import positive_int  # here, not at the top: see check_args

    parser = argparse.ArgumentParser(prog="python -m kernels.bench.gae", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--sizes",
        type=parse_sizes,
        default=parse_sizes(DEFAULT_SIZES),
        help=f"comma-separated TxBxnx1 rollout shapes (default {DEFAULT_SIZES})",
    )
    parser.add_argument(
        "--repeats", type=positive_int, default=7, help="timed calls per measurement; the median is kept"
    )
    parser.add_argument(
        "--rounds", type=positive_int, default=1, help="repeat every measurement this many rounds; report medians"
    )
    parser.add_argument(
        "--device",
        default="cuda" if torch.cuda.is_available() else "cpu",
        help="cpu, cuda or cuda:N, for the data and every call (default: cuda where available)",
    )
    parser.add_argument(
        "--backends",
        default=None,
        help="comma-separated gae backends to time besides the reference loop (default: auto, "
        "plus torch on CUDA; triton on CPU needs TRITON_INTERPRET=1)",
    )
    parser.add_argument(
        "--peer-python",
        default=None,
        help="a Python with torchrl, to time TorchRL in a subprocess when it is not importable here",
    )
    parser.add_argument("--threads", type=positive_int, default=None, help="torch CPU threads (default: torch's)")
    parser.add_argument("--peak-gbps", type=float, default=None, help="peak memory bandwidth, if not in the table")
    parser.add_argument("--json", default=None, metavar="PATH", help="also write the results as JSON to PATH")
    args = parser.parse_args(argv)
    try:
        device, backends = check_args(args)
    except ValueError as error:
        parser.error(str(error))
    if args.threads:
        torch.set_num_threads(args.threads)
    peak = peak_bandwidth(device, args.peak_gbps)
    command = "python -m kernels.bench.gae " + shlex.join(sys.argv[1:] if argv is None else argv)
    header = [
        f"command: {command}",
        f"date: {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC; device: {device_name(device)}; "
        f"torch {torch.__version__}; gamma={GAMMA}, lmbda={LMBDA}; median of {args.repeats} calls,"
        f" of {args.rounds} round(s)",
    ]
    rows, peer_versions = [], None
    with tempfile.TemporaryDirectory() as workdir:
        for size in args.sizes:
            size_rows, peer_versions = bench_size(
                size, device, backends, args.repeats, args.rounds, args.peer_python, Path(workdir)
            )
            rows += size_rows
    if peer_versions:
        header.append(f"TorchRL run in a subprocess: {peer_versions}")
    if peak:
        header.append(f"peak memory bandwidth: {peak / 1e9:.0f} GB/s")
    print("\n".join(header))
    print(format_table(rows, peak))
    print("x: speedup of the row's call over that one (that one's time / the row's), same data, same round;")
    print("max |diff|: largest difference from gae_reference over both outputs.")
    if args.json:
        Path(args.json).write_text(json.dumps({"header": header, "rows": rows}, indent=2))


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker(sys.argv[2], sys.argv[3], int(sys.argv[sys.argv.index("--repeats") + 1]))
    else:
        main()

"""Benchmark vecmarl's replay buffer against TorchRL's, on the same transitions, in the same run.

    python -m marl.bench.replay --peer-python ~/venvs/torchrl/bin/python
                                [--capacity 1000000] [--extend 32x128] [--batch-sizes 128,4096]
                                [--repeats 20] [--rounds 1] [--threads N] [--device cpu] [--json PATH]

Both buffers hold `--capacity` transitions of `navigation` (3 agents: observation and next observation
[3, 18] float32, action [3, 2] float32, reward [3] float32, terminated and done [3] bool), filled to capacity
before anything is timed. Rows, each the median of `--repeats` back-to-back calls after warm-up calls:

- `extend`: one `[T, B]` batch (`--extend`); TorchRL gets the same steps flattened to `[T * B]`;
- `sample`: a batch, uniformly and by priority;
- `update_priority`: new priorities `[k]` for the indices of a batch just drawn;
- `sample + update_priority`: the two in a row, as a prioritized learner calls them;
- `select + gather + set_priority_ ..., compiled`: the same draw, gather and update as one compiled call (on CUDA one CUDA
  graph), as `marl train --compile` runs them inside its optimiser step; vecmarl only, its ratio taken
  against TorchRL's `sample + update_priority`.

The peer is TorchRL's `TensorDictReplayBuffer` with `LazyTensorStorage(capacity)` and `RandomSampler()` or
`PrioritizedSampler(capacity, alpha, beta)`. It runs in its own interpreter (`--peer-python`: this file run as
a script, which imports only torch, tensordict and torchrl), so TorchRL is never a dependency and its own
torch build is the one its C++ extension was made for. Both sides run with the same number of torch threads
(`--threads`); where other jobs hold some of the cores, give `--threads 1`: torch's parallel ops then wait on
busy cores and both sides' times jump by whole scheduler slices.
`ratio` is TorchRL's time over vecmarl's: above 1, vecmarl is faster. With `--rounds R` everything (the peer
in a fresh process) is measured R times and the medians over rounds are reported.

`bench_replay(...)` returns the rows for `marl bench`.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

N_AGENTS, OBSERVATION, ACTION = 3, 18, 2  # navigation's group "agent"
ALPHA, BETA = 0.6, 0.4
COMPILED = "compiled sample + update_priority"  # the operation of `compiled_draw_and_update`
FILL_CHUNK = 65536


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median_ms(call, repeats: int, device: torch.device, warmup: int = 3) -> float:
    """Median wall time of `call()` in ms over `repeats` back-to-back calls, after `warmup` calls (its own
    loop, not `kernels.bench`'s: the peer's interpreter runs this file alone)."""
    for _ in range(warmup):
        call()
    times = []
    for _ in range(repeats):
        synchronize(device)
        start = time.perf_counter()
        call()
        synchronize(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def navigation_steps(shape: tuple[int, ...], device: torch.device, seed: int) -> dict:
    """Random navigation transitions `[*shape]` as nested dicts of tensors (the rollout's keys)."""
    generator = torch.Generator().manual_seed(seed)

    def rand(*size):
        return torch.randn(*shape, *size, generator=generator)

    group = {
        "observation": rand(N_AGENTS, OBSERVATION),
        "next_observation": rand(N_AGENTS, OBSERVATION),
        "action": rand(N_AGENTS, ACTION).clamp(-1, 1),
        "reward": rand(N_AGENTS),
        "terminated": rand(N_AGENTS) > 2.5,
        "done": rand(N_AGENTS) > 2.0,
    }
    return {"agent": {key: value.to(device) for key, value in group.items()}}


def cases(batch_sizes: list[int], compiled: bool = True) -> list[tuple[str, str, int | None]]:
    """`(operation, sampler, batch size)` of every row, in table order; `compiled=False` leaves out the
    compiled rows."""
    rows = [("extend", sampler, None) for sampler in ("uniform", "prioritized")]
    rows += [("sample", sampler, k) for sampler in ("uniform", "prioritized") for k in batch_sizes]
    rows += [(op, "prioritized", k) for op in ("update_priority", "sample + update_priority") for k in batch_sizes]
    if compiled:
        rows += [(COMPILED, "prioritized", k) for k in batch_sizes]  # vecmarl only: TorchRL has no such call
    return rows


def time_buffer(buffer, batch, sampler: str, config: dict, sample) -> dict[str, float]:
    """`{case key: ms}` of one filled buffer (either library's: both have `extend`, `update_priority`, and a
    sample whose `"index"` is the slots drawn); `sample(k)` draws a batch."""
    device, repeats = torch.device(config["device"]), config["repeats"]
    results = {case_key("extend", sampler, None): median_ms(lambda: buffer.extend(batch), repeats, device)}
    for operation, case_sampler, k in cases(config["batch_sizes"]):
        if case_sampler != sampler or operation in ("extend", COMPILED):
            continue
        priority = torch.rand(k, generator=torch.Generator().manual_seed(k)).to(device) * 10
        index = sample(k)["index"]
        calls = {
            "sample": lambda k=k: sample(k),
            "update_priority": lambda index=index, priority=priority: buffer.update_priority(index, priority),
            "sample + update_priority": lambda k=k, priority=priority: buffer.update_priority(
                sample(k)["index"], priority
            ),
        }
        results[case_key(operation, sampler, k)] = median_ms(calls[operation], repeats, device)
    return results


def time_vecmarl(config: dict) -> dict[str, float]:
    """`{case key: ms}` for vecmarl's `ReplayBuffer` (this interpreter)."""
    from tensordict import TensorDict

    device = torch.device(config["device"])
    extend_shape = tuple(config["extend"])
    batch = TensorDict(navigation_steps(extend_shape, device, seed=1), batch_size=extend_shape, device=device)
    results = {}
    for sampler in ("uniform", "prioritized"):
        buffer = filled_buffer(config, sampler)
        generator = torch.Generator(device).manual_seed(0)
        results.update(time_buffer(buffer, batch, sampler, config, lambda k, b=buffer, g=generator: b.sample(k, g)))
        if sampler == "prioritized" and config["compiled"]:
            for k in config["batch_sizes"]:
                call = compiled_draw_and_update(buffer, k, generator)
                results[case_key(COMPILED, sampler, k)] = median_ms(call, config["repeats"], device)
        buffer = None  # freed before the next one is allocated
    return results


def compiled_draw_and_update(buffer, k: int, generator: torch.Generator):
    """What an off-policy step compiled with `--compile` does with a prioritized buffer, as one compiled call
    (on CUDA one CUDA graph): step `t`'s `k` slots found in the tree from the random numbers drawn ahead for
    the iteration (`draw_ahead`), their transitions gathered, their importance weights, and their new
    priorities set. Returns the call
    (its first one compiles)."""
    from envs import cudagraphs
    from envs.compile import maybe_compile

    device = buffer.device
    drawn = buffer.draw_ahead(1, k, generator)  # [1, k]: one step's draw, reused by every call
    priority = torch.rand(k, generator=torch.Generator().manual_seed(k)).to(device) * 10
    beta = torch.tensor(BETA, dtype=torch.float64, device=device)
    cudagraphs.mark_static([buffer.tree, buffer.max_priority, drawn, priority, beta], device)

    def step(t: torch.Tensor) -> dict:
        index, weight = buffer.select(drawn.index_select(0, t).squeeze(0), beta)
        buffer.set_priority_(index, priority)
        return {**buffer.gather(index), "weight": weight}  # the batch, as `sample` gives it

    compiled = maybe_compile(torch.no_grad()(step), True, device, name="replay draw + update")
    t = torch.zeros(1, dtype=torch.long, device=device)
    return lambda: compiled(t)


def filled_buffer(config: dict, sampler: str):
    """vecmarl's `ReplayBuffer` of `config["capacity"]` navigation steps, full."""
    from tensordict import TensorDict

    import envs
    from marl.core.replay import Prioritized, ReplayBuffer

    device, capacity = torch.device(config["device"]), config["capacity"]
    groups = envs.make("navigation", num_envs=1, device="cpu", seed=0, n_agents=N_AGENTS).groups
    prioritized = Prioritized(alpha=ALPHA, beta=BETA) if sampler == "prioritized" else None
    buffer = ReplayBuffer(groups, capacity, device, prioritized=prioritized)
    for start in range(0, capacity, FILL_CHUNK):
        size = min(FILL_CHUNK, capacity - start)
        buffer.extend(TensorDict(navigation_steps((size,), device, seed=start), batch_size=[size], device=device))
    return buffer


def profile_prioritized(config: dict, k: int, calls: int = 10) -> str:
    """Where one prioritized `update_priority(sample(k).index, ...)` spends its time: host time and kernel
    launches per call, and torch's profiler table of the ops (top 15 by time on the host)."""
    from torch.profiler import ProfilerActivity, profile

    device = torch.device(config["device"])
    buffer = filled_buffer(config, "prioritized")
    generator = torch.Generator(device).manual_seed(0)
    priority = torch.rand(k, generator=torch.Generator().manual_seed(k)).to(device) * 10

    def call():
        buffer.update_priority(buffer.sample(k, generator)["index"], priority)

    for _ in range(3):
        call()
    synchronize(device)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        for _ in range(calls):
            call()
        synchronize(device)
    events = prof.key_averages()
    host_us = sum(e.self_cpu_time_total for e in events) / calls
    kernels = sum(e.count for e in events if e.device_type == torch.autograd.DeviceType.CUDA) / calls
    sort = "self_cpu_time_total"
    head = f"profile: update_priority(sample({k}).index, [{k}]), {calls} calls on {device}: {host_us:.0f} us of host "
    head += "time per call" + (f", {kernels:.0f} CUDA kernels per call" if device.type == "cuda" else "")
    return head + "\n" + events.table(sort_by=sort, row_limit=15)


def time_torchrl(config: dict) -> tuple[dict[str, float], str]:
    """`({case key: ms}, versions)` for TorchRL's `TensorDictReplayBuffer` (the peer's interpreter)."""
    import tensordict
    import torchrl
    from tensordict import TensorDict
    from torchrl.data import LazyTensorStorage, PrioritizedSampler, RandomSampler, TensorDictReplayBuffer

    device, capacity = torch.device(config["device"]), config["capacity"]
    extend_shape = tuple(config["extend"])
    num_steps = extend_shape[0] * extend_shape[1]
    # TorchRL's storage is one-dimensional: its users extend with the [T, B] batch flattened.
    batch = TensorDict(navigation_steps(extend_shape, device, seed=1), batch_size=extend_shape, device=device)
    batch = batch.reshape(num_steps)
    results = {}
    for sampler in ("uniform", "prioritized"):
        chosen = PrioritizedSampler(capacity, alpha=ALPHA, beta=BETA) if sampler == "prioritized" else RandomSampler()
        buffer = TensorDictReplayBuffer(storage=LazyTensorStorage(capacity, device=device), sampler=chosen)
        for start in range(0, capacity, FILL_CHUNK):
            size = min(FILL_CHUNK, capacity - start)
            buffer.extend(TensorDict(navigation_steps((size,), device, seed=start), batch_size=[size], device=device))
        results.update(time_buffer(buffer, batch, sampler, config, lambda k, b=buffer: b.sample(k)))
        buffer = None
    versions = f"torchrl {torchrl.__version__}, torch {torch.__version__}, tensordict {tensordict.__version__}"
    return results, versions


def case_key(operation: str, sampler: str, k: int | None) -> str:
    return f"{operation}|{sampler}|{k}"


def worker(config_json: str) -> None:
    """Subprocess side of `torchrl_in_subprocess`: prints one JSON line."""
    import warnings

    warnings.filterwarnings("ignore")
    config = json.loads(config_json)
    torch.set_num_threads(config["threads"])
    results, versions = time_torchrl(config)
    print(json.dumps({"results": results, "versions": versions}))


def torchrl_in_subprocess(peer_python: str, config: dict) -> tuple[dict[str, float] | None, str]:
    """`(results, versions)` from the peer's interpreter, or `(None, why it failed)`."""
    command = [peer_python, str(Path(__file__).resolve()), "--worker", json.dumps(config)]
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=1800)
    except (OSError, subprocess.TimeoutExpired) as error:
        return None, f"peer failed: {error}"
    if result.returncode != 0:
        last = (result.stderr.strip().splitlines() or ["(no output)"])[-1]
        return None, f"peer failed (exit {result.returncode}): {last}"
    report = json.loads(result.stdout.strip().splitlines()[-1])
    return report["results"], report["versions"]


def bench_replay(
    capacity: int = 1_000_000,
    extend: tuple[int, int] = (32, 128),
    batch_sizes: tuple[int, ...] = (128, 4096),
    repeats: int = 20,
    rounds: int = 1,
    device: str = "cpu",
    threads: int | None = None,
    peer_python: str | None = None,
    compiled: bool = True,
) -> dict:
    """Time every case for vecmarl and (with `peer_python`) TorchRL, `rounds` times; `compiled=False`
    leaves out the compiled rows (`marl bench --quick`: their compilation takes a minute on a 2-core CPU).

    Returns `{"rows": [...], "peer": versions or why it failed, "threads": ..., "device": ...}`; each row
    has `call`, `operation`, `sampler`, `batch_size`, `size`, `vecmarl_ms`, `torchrl_ms` (None without a
    peer) and `ratio` (TorchRL's time over vecmarl's, the median of the per-round ratios).
    """
    threads = threads or torch.get_num_threads()
    torch.set_num_threads(threads)
    config = {
        "capacity": capacity,
        "extend": list(extend),
        "batch_sizes": list(batch_sizes),
        "repeats": repeats,
        "device": device,
        "threads": threads,
        "compiled": compiled,
    }
    per_round, peer = [], "no --peer-python given"
    for _ in range(rounds):
        ours = time_vecmarl(config)
        theirs = None
        if peer_python:
            theirs, peer = torchrl_in_subprocess(peer_python, config)
        per_round.append((ours, theirs))
    rows = []
    for operation, sampler, k in cases(list(batch_sizes), compiled):
        key = case_key(operation, sampler, k)
        ours = statistics.median(r[0][key] for r in per_round)
        # The compiled row against TorchRL's sample + update, the calls a learner makes there.
        peer_key = case_key("sample + update_priority", sampler, k) if operation == COMPILED else key
        theirs = [r[1][peer_key] for r in per_round if r[1] is not None]
        ratio = statistics.median(r[1][peer_key] / r[0][key] for r in per_round if r[1] is not None) if theirs else None
        if operation == "extend":
            call = f"extend([{extend[0]}, {extend[1]}])"
        elif operation == "sample + update_priority":
            call = f"update_priority(sample({k}).index, [{k}])"
        elif operation == COMPILED:
            call = f"select + gather + set_priority_ of {k}, compiled"
        elif operation == "update_priority":
            call = f"update_priority([{k}], [{k}])"
        else:
            call = f"sample({k})"
        rows.append(
            {
                "call": call,
                "operation": operation,
                "sampler": sampler,
                "batch_size": k,
                "size": f"{capacity:,} x nav(3)",
                "vecmarl_ms": ours,
                "torchrl_ms": statistics.median(theirs) if theirs else None,
                "ratio": ratio,
            }
        )
    return {"rows": rows, "peer": peer, "threads": threads, "device": device, "rounds": rounds, "repeats": repeats}


def format_table(report: dict) -> str:
    columns = ["call", "sampler", "capacity x transition", "device", "vecmarl ms", "TorchRL ms", "ratio"]
    lines = []
    for row in report["rows"]:
        theirs = f"{row['torchrl_ms']:.3f}" if row["torchrl_ms"] is not None else "-"
        ratio = f"{row['ratio']:.2f}x" if row["ratio"] is not None else "-"
        lines.append(
            [row["call"], row["sampler"], row["size"], report["device"], f"{row['vecmarl_ms']:.3f}", theirs, ratio]
        )
    widths = [max(len(str(x)) for x in column) for column in zip(columns, *lines, strict=True)]
    render = lambda cells: "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"
    return "\n".join([render(columns), render(["-" * w for w in widths]), *map(render, lines)])


def parse_shape(text: str) -> tuple[int, int]:
    try:
        shape = tuple(int(x) for x in text.lower().split("x"))
    except ValueError:
        shape = ()
    if len(shape) != 2 or min(shape) < 1:
        raise argparse.ArgumentTypeError(f"--extend {text!r}: expected TxB, e.g. 32x128")
    return shape


def parse_sizes(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        sizes = ()
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"--batch-sizes {text!r}: expected e.g. 128,4096")
    return sizes


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--worker"]:
        worker(argv[1])
        return
    # Here, not at the top: the peer runs this file alone.
    from kernels.bench.options import check_peer_python, checked, positive_int

    parser = argparse.ArgumentParser(prog="python -m marl.bench.replay", description=__doc__.split("\n\n")[0])
    parser.add_argument("--peer-python", default=None, help="interpreter with torchrl installed (the peer)")
    parser.add_argument("--capacity", type=positive_int, default=1_000_000, help="env steps each buffer holds")
    parser.add_argument("--extend", type=parse_shape, default=(32, 128), help="the [T, B] batch extended, TxB")
    parser.add_argument("--batch-sizes", type=parse_sizes, default=(128, 4096), help="batch sizes drawn")
    parser.add_argument("--repeats", type=positive_int, default=20, help="timed calls per row (the median is reported)")
    parser.add_argument("--rounds", type=positive_int, default=1, help="repeat everything; medians over rounds")
    parser.add_argument(
        "--threads", type=positive_int, default=None, help="torch threads on both sides (default: torch's)"
    )
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or auto (CUDA where available)")
    parser.add_argument("--json", default=None, help="also write the report here")
    parser.add_argument(
        "--profile",
        action="store_true",
        help="also profile vecmarl's prioritized sample + update of the largest batch (host time, kernel launches)",
    )
    args = parser.parse_args(argv)
    from marl.app.build import resolve_device
    from marl.app.paths import check_output_file

    # `auto` as what it resolves to
    args.device = str(checked(parser, resolve_device, args.device, prefix="argument --device: "))
    if args.json:
        checked(parser, check_output_file, args.json, f"--json {args.json}", "bench.json")
    if args.capacity < max(args.batch_sizes) or args.capacity < args.extend[0] * args.extend[1]:
        parser.error("--capacity must hold the largest batch size and the extended batch")
    if args.peer_python:
        from marl.bench.suite import PEER_PYTHONS

        checked(parser, check_peer_python, "--peer-python", args.peer_python, PEER_PYTHONS["torchrl_python"][1])
    report = bench_replay(
        args.capacity,
        args.extend,
        args.batch_sizes,
        args.repeats,
        args.rounds,
        args.device,
        args.threads,
        args.peer_python,
    )
    device = torch.device(args.device)
    report["command"] = "python -m marl.bench.replay " + shlex.join(argv)
    report["date"] = datetime.now(timezone.utc).strftime("%Y-%m-%d")
    from kernels.bench.gae import device_name  # here: the peer runs this file without vecmarl on its path

    report["machine"] = device_name(device)
    print(f"command: {report['command']}")
    print(
        f"date: {report['date']}; device: {report['machine']}; {report['threads']} torch threads on both sides; "
        f"median of {args.repeats} calls, {args.rounds} round(s)"
    )
    print(f"vecmarl: torch {torch.__version__}; peer: {report['peer']}")
    print(format_table(report))
    if args.profile:
        report["profile"] = profile_prioritized(
            {"capacity": args.capacity, "device": args.device}, max(args.batch_sizes)
        )
        print(report["profile"])
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()

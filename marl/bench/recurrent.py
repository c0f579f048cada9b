"""Recurrent MAPPO's cost: the GRU's time pass, and `marl train` defaults with `--model gru` against MLP.

    python -m marl.bench.recurrent --threads 1
    python -m marl.bench.recurrent --threads 1 --iterations 6 --repeats 5 --parts train

Two tables.

1. **time pass**: forward and backward of one minibatch's chunks through the policy's GRU at `marl train`
   defaults (`minibatch_size // chunk_length` chunks of `chunk_length` steps, 3 agents, navigation's 18
   inputs, `gru_hidden` 64), median seconds of `--repeats`, for the ways to run it:
   - `scan` (what vecmarl uses): `MultiAgentGRU.scan`, the masked reset inside, the input products of
     all steps as one matmul, a step's recurrent product and gates per step, autograd's backward;
   - `torch.nn.GRU`: torch's fused GRU (cuDNN on a GPU, its C++ loop on the CPU) over the same chunks.
     It cannot reset the state mid-chunk, nor hold per-agent weights, so it is only a yardstick: what a
     fused op would gain on chunks without resets.
   The ratio is each row's time over `scan`'s.
2. **train**: frames/s of `marl train` defaults (`TrainConfig()`: navigation, 256 envs, rollout 64, MAPPO)
   with `--model mlp` and `--model gru`, the median over the iterations after the first of every repeat;
   the runs alternate so that load from other processes hits both alike. The ratio is gru / mlp.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile

import torch
from torch import nn

from kernels.bench.gae import median_seconds
from kernels.bench.options import positive_int
from marl.app.trainer import Trainer
from marl.config import ModelConfig, RunConfig, TrainConfig
from marl.core.networks import MultiAgentGRU


def time_pass(repeats: int, chunks: int, chunk_length: int, n_agents: int, inputs: int, hidden: int) -> list[dict]:
    """Seconds per forward + backward of `chunks` chunks through one GRU, each way (module docstring)."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(chunk_length, chunks, n_agents, inputs, generator=generator)
    h0 = torch.randn(chunks, n_agents, hidden, generator=generator)
    reset = torch.rand(chunk_length, chunks, generator=generator) < 0.02
    gru = MultiAgentGRU(inputs, hidden, n_agents, share_params=True)
    reference = nn.GRU(inputs, hidden)

    def scan() -> None:
        gru.scan(x, h0, reset).sum().backward()

    def fused() -> None:
        out, _ = reference(x.reshape(chunk_length, -1, inputs), h0.reshape(1, -1, hidden))
        out.sum().backward()

    calls = {"scan": scan, "torch.nn.GRU (no resets)": fused}
    seconds = median_seconds(calls, repeats, torch.device("cpu"))
    return [{"way": name, "seconds": s, "ratio": s / seconds["scan"]} for name, s in seconds.items()]


def time_train(iterations: int, repeats: int, gru: ModelConfig, models: tuple[str, ...] = ("mlp", "gru")) -> list[dict]:
    """Median frames/s of `marl train` defaults per `--model` (`gru`: the model config of `--model gru`), over
    the iterations after each run's first."""
    rates: dict[str, list[float]] = {model: [] for model in models}
    with tempfile.TemporaryDirectory() as log_dir:
        for repeat in range(repeats):
            for model in models:
                run = RunConfig(progress=False, tensorboard=False, log_dir=log_dir, run_name=f"{model}-{repeat}")
                config = TrainConfig(model=gru if model == "gru" else ModelConfig(model=model), run=run)
                trainer = Trainer(config)
                rows = [trainer.train_iteration() for _ in range(iterations)]
                rates[model] += [row["frames_per_s"] for row in rows[1:]]
    medians = {model: statistics.median(values) for model, values in rates.items()}
    return [{"model": m, "frames_per_s": medians[m], "ratio": medians[m] / medians[models[0]]} for m in models]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m marl.bench.recurrent", description=__doc__.split("\n")[0])
    parser.add_argument(
        "--parts",
        nargs="+",
        choices=("time_pass", "train"),
        default=["time_pass", "train"],
        help="what to time: the GRU's time pass against torch.nn.GRU, and/or marl train with --model gru "
        "against mlp (default: both)",
    )
    parser.add_argument(
        "--repeats", type=positive_int, default=3, help="runs of each (time pass: calls) to take the median of"
    )
    parser.add_argument("--iterations", type=int, default=4, help="train: iterations per run (the first not counted)")
    parser.add_argument("--threads", type=positive_int, default=None, help="torch threads (default: torch's)")
    parser.add_argument(
        "--gru-hidden", type=positive_int, default=ModelConfig.gru_hidden, help="--model gru's state size"
    )
    parser.add_argument("--gru-nets", default=ModelConfig.gru_nets, help="--model gru's recurrent nets")
    args = parser.parse_args(argv)
    if args.iterations < 2:
        parser.error(f"argument --iterations: {args.iterations}: expected at least 2 (the first is not counted)")
    if args.threads:
        torch.set_num_threads(args.threads)
    algo = TrainConfig().algo
    try:
        defaults = ModelConfig(model="gru", gru_hidden=args.gru_hidden, gru_nets=args.gru_nets)
    except ValueError as error:
        parser.error(f"argument --gru-nets: {error}")
    print(f"command: python -m marl.bench.recurrent {' '.join(argv if argv is not None else sys.argv[1:])}")
    print(f"device: cpu, {torch.get_num_threads()} thread(s), torch {torch.__version__}")
    if "time_pass" in args.parts:
        chunks = algo.minibatch_size // algo.chunk_length
        sizes = dict(chunks=chunks, chunk_length=algo.chunk_length, n_agents=3, inputs=18, hidden=defaults.gru_hidden)
        print(
            f"\ntime pass, forward + backward, {', '.join(f'{k} {v}' for k, v in sizes.items())}; "
            f"median of {args.repeats * 10}"
        )
        print("| way | ms | ratio to scan |\n|---|---:|---:|")
        for row in time_pass(args.repeats * 10, **sizes):
            print(f"| {row['way']} | {row['seconds'] * 1e3:.2f} | {row['ratio']:.2f} |")
    if "train" in args.parts:
        run = RunConfig()
        print(
            f"\nmarl train defaults: navigation, {TrainConfig().env.num_envs} envs, rollout {run.rollout_length}, "
            f"MAPPO, epochs {algo.epochs}, minibatch {algo.minibatch_size}, hidden {defaults.hidden}; gru: "
            f"gru_hidden {defaults.gru_hidden}, gru_nets {defaults.gru_nets}, chunk_length {algo.chunk_length}; "
            f"median frames/s over {args.repeats} x {args.iterations - 1} iterations"
        )
        print("| command | frames/s | ratio to mlp |\n|---|---:|---:|")
        for row in time_train(args.iterations, args.repeats, defaults):
            flags = f" --gru-hidden {args.gru_hidden} --gru-nets {args.gru_nets}" if row["model"] == "gru" else ""
            print(f"| marl train --model {row['model']}{flags} | {row['frames_per_s']:,.0f} | {row['ratio']:.2f} |")


if __name__ == "__main__":
    main()

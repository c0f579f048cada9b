"""Data-parallel training under torchrun, on the CPU with 2 gloo ranks.

Each test launches `python -m torch.distributed.run --standalone --nproc-per-node 2` (a free port
each time) on `tests/marl/app/distributed_worker.py` or `-m marl`.
"""

from __future__ import annotations

import csv
import dataclasses
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from tensordict import TensorDict

from marl.app.checkpoint import load_checkpoint
from marl.app.evaluate import eval_seed
from marl.app.logger import read_rows
from marl.app.trainer import Trainer
from marl.config import TrainConfig
from tests.marl.app.distributed_worker import ITERATIONS, match_config
from tests.marl.app.test_eval_during_training import reference_evaluation, same, training_columns

ROOT = Path(__file__).resolve().parents[3]
WORKER = str(Path(__file__).with_name("distributed_worker.py"))
RANKS = 2
# A tiny CLI run: 8 envs x 8 steps per rank; episodes of 4 steps end twice per env and iteration.
CLI_ARGS = [
    "--num-envs",
    "8",
    "--rollout-length",
    "8",
    "--minibatch-size",
    "32",
    "--epochs",
    "1",
    "--hidden",
    "16",
    "16",
    "--env-option",
    "max_steps=4",
    "--checkpoint-every",
    "1",
    "--no-progress",
    "--no-tensorboard",
    "--run-name",
    "run",
]
FRAMES_PER_ITERATION = RANKS * 8 * 8


def torchrun(*args: str, timeout_variable: str | None = None, limit_s: float = 120) -> tuple[int, str, float]:
    """Launch 2 ranks; returns (exit status, stdout + stderr, seconds). Kills the whole process group
    after `limit_s`, so a hanging job fails the test instead of blocking CI."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("MARL_DIST_TIMEOUT", None)
    if timeout_variable is not None:
        env["MARL_DIST_TIMEOUT"] = timeout_variable
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(RANKS), *args]
    start = time.monotonic()
    process = subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        output, _ = process.communicate(timeout=limit_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        pytest.fail(f"the job was still running after {limit_s} s:\n{output[-3000:]}")
    return process.returncode, output, time.monotonic() - start


def single_process_order(rank_orders: list[torch.Tensor], num_envs: int, minibatch_size: int) -> torch.Tensor:
    """The order of the single process's frames whose minibatch k is the union of every rank's minibatch k.

    A rank's buffer `[T, B]` flattens frame (t, b) to `t * B + b`; the single process holds the ranks'
    buffers side by side, `[T, R * B]`, so rank r's frame (t, b) is its frame `t * R * B + r * B + b`."""
    ranks = len(rank_orders)
    in_single = [
        order // num_envs * ranks * num_envs + r * num_envs + order % num_envs for r, order in enumerate(rank_orders)
    ]
    count = len(rank_orders[0]) // minibatch_size
    parts = [part[k * minibatch_size : (k + 1) * minibatch_size] for k in range(count) for part in in_single]
    return torch.cat(parts)


def replaying(orders: list[torch.Tensor]):
    """A stand-in for `torch.randperm` that returns `orders` one per call."""
    remaining = iter(orders)
    return lambda frames, **_: next(remaining)


def test_two_ranks_stay_identical_and_match_one_process_on_the_same_total_batch(tmp_path, monkeypatch):
    """The exact comparison: every rank's update must equal one process's update on the ranks' data.

    The ranks collect different data (envs and sampling seeded per rank), so the single process does not
    collect: per iteration it takes the ranks' buffers side by side (`[T, 2 * B]`), computes advantages
    (GAE runs per env column, so they equal each rank's), and updates with minibatch k = the union of the
    ranks' minibatch k (the ranks' recorded `randperm` orders, mapped into its frames) at twice the
    per-rank minibatch size. A minibatch loss is a mean over frames, so the single process's gradient is
    the mean of the ranks' gradients: what the all-reduce computes. Clipping and Adam then see the same
    gradient. Advantage normalisation is per rank's minibatch, so it is off here."""
    code, output, _ = torchrun(WORKER, "match", str(tmp_path))
    assert code == 0, output[-3000:]
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(RANKS)]
    for rank in ranks[1:]:
        for it in range(ITERATIONS):
            for a, b in zip(ranks[0]["iterations"][it]["parameters"], rank["iterations"][it]["parameters"]):
                assert torch.equal(a, b), f"the ranks' parameters differ after update {it + 1}"
    for rank in ranks:  # resuming from the checkpoint after iteration 1 reproduces iteration 2 exactly
        for a, b in zip(rank["iterations"][-1]["parameters"], rank["resumed"]):
            assert torch.equal(a, b)
        for key, value in rank["straight_obs"]["agent"].items():
            assert torch.equal(value, rank["resumed_obs"]["agent"][key])
    first = ranks[0]["iterations"][0]["buffer"]["agent"]["observation"]
    assert not torch.equal(first, ranks[1]["iterations"][0]["buffer"]["agent"]["observation"])  # seeded per rank

    config = match_config(tmp_path)
    num_envs, size = config.env.num_envs, config.algo.minibatch_size
    single = Trainer(
        dataclasses.replace(
            config,
            env=dataclasses.replace(config.env, num_envs=RANKS * num_envs),
            algo=dataclasses.replace(config.algo, minibatch_size=RANKS * size),
        ),
        run_dir=tmp_path / "single",
    )
    before = [p.detach().clone() for lr in single.algorithm.learners.values() for p in lr.parameters()]
    for a, b in zip(before, ranks[0]["initial"]):
        assert torch.equal(a, b)
    for it in range(ITERATIONS):
        buffers = [
            TensorDict(r["iterations"][it]["buffer"], batch_size=[config.run.rollout_length, num_envs]) for r in ranks
        ]
        buffer = torch.cat(buffers, dim=1)  # [T, 2 * B]
        single.algorithm.advantages(buffer)
        epochs = zip(*(r["iterations"][it]["orders"] for r in ranks))
        orders = [single_process_order(list(per_rank), num_envs, size) for per_rank in epochs]
        monkeypatch.setattr(torch, "randperm", replaying(orders))
        single.algorithm.epochs(buffer)
        monkeypatch.undo()
        after = [p.detach() for lr in single.algorithm.learners.values() for p in lr.parameters()]
        for a, b in zip(after, ranks[0]["iterations"][it]["parameters"]):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)  # measured: ~6e-8 apart
    # The comparison can tell: the updates moved the parameters far more than the tolerance.
    moved = max((a - b).abs().max().item() for a, b in zip(after, before))
    assert moved > 1e-3


@pytest.mark.slow
def test_a_dead_rank_stops_the_job_and_the_run_resumes_from_its_checkpoint(tmp_path):
    """Rank 1 is killed at iteration 3: the job exits with an error at once (not after the collective
    timeout, 600 s by default); the CSV and the checkpoint of iterations 1-2 are rank 0's, with frames
    and episodes totalled over the ranks; `marl train --resume` on 2 ranks finishes the run."""
    total = ["--total-frames", str(4 * FRAMES_PER_ITERATION)]
    code, output, seconds = torchrun(WORKER, "die", *CLI_ARGS, *total, "--log-dir", str(tmp_path))
    assert code != 0 and seconds < 60, (seconds, output[-3000:])
    run = tmp_path / "run"
    rows = list(csv.DictReader((run / "metrics.csv").open()))
    assert [int(r["frames"]) for r in rows] == [FRAMES_PER_ITERATION, 2 * FRAMES_PER_ITERATION]
    assert all(float(r["episodes"]) == RANKS * 8 * 2 for r in rows)  # both ranks' episodes
    checkpoint = torch.load(run / "checkpoint.pt", weights_only=True)
    assert checkpoint["iteration"] == 2 and checkpoint["world_size"] == RANKS
    assert [r["env"]["seed"] for r in checkpoint["ranks"]] == [0, 1000]
    with pytest.raises(ValueError, match="written by 2 ranks; resume it with torchrun on 2 ranks"):
        Trainer.resume(run / "checkpoint.pt")  # in one process

    code, output, _ = torchrun("-m", "marl", "train", "--resume", str(run / "checkpoint.pt"), *total)
    assert code == 0, output[-3000:]
    assert output.count("resuming") == 1 and output.count("mean episode return") == 1
    frames = [int(r["frames"]) for r in csv.DictReader((run / "metrics.csv").open())]
    assert frames == [k * FRAMES_PER_ITERATION for k in (1, 2, 3, 4)]


@pytest.mark.slow
def test_a_hung_rank_stops_the_job_after_the_collective_timeout(tmp_path):
    code, output, seconds = torchrun(WORKER, "hang", *CLI_ARGS, "--log-dir", str(tmp_path), timeout_variable="3")
    assert code != 0 and seconds < 60, (seconds, output[-3000:])
    assert "rank 0 of 2: the gradient all-reduce failed" in output, output[-3000:]


@pytest.mark.slow
def test_an_env_error_on_one_rank_is_said_by_that_rank(tmp_path):
    """Rank 1's envs return a NaN reward in iteration 3 (`--env-option check_values=True` stops there). The
    error is rank 1's alone: it used to be printed by rank 0 only, so the job ended with rank 0's "another rank
    died" and no word of the NaN. Rank 0 keeps iteration 2's checkpoint."""
    args = [*CLI_ARGS, "--env-option", "check_values=True", "--log-dir", str(tmp_path)]
    code, output, seconds = torchrun(WORKER, "nan", *args)
    assert code != 0 and seconds < 60, (seconds, output[-3000:])
    assert output.count("marl train: error: rank 1 of 2: navigation: ") == 1, output[-3000:]
    assert "contains NaN or inf" in output, output[-3000:]
    assert torch.load(tmp_path / "run" / "checkpoint.pt", weights_only=True)["iteration"] == 2


def test_start_up_errors_stop_every_rank_with_one_error_line_each(tmp_path, monkeypatch):
    """Three runs that stop before training, in one job (`start-up-errors` in the worker):

    - `mismatch`: ranks with different configs stop naming the rank and the field.
    - `used-folder`: rank 0 checks the run folder; the other ranks used to wait in the parameter broadcast
      and die with a long traceback. Now each rank prints the same line. The folder holds the job's
      checkpoint: the hint said `marl train --resume`, which in one process is refused for a checkpoint of
      2 ranks.
    - `wandb`: rank 0 opens the W&B run; without a login it said so in one line, and rank 1, left waiting
      in the first collective, died with a "connection closed" traceback.

    No traceback comes from the ranks: torchrun's own ChildFailedError has nothing to report, and no
    frame of any is vecmarl's."""
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc, no W&B settings: no key anywhere
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb_config"))
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    used = tmp_path / "used-folder" / "run"
    used.mkdir(parents=True)
    (used / "metrics.csv").write_text("iteration\n1\n")
    (used / "checkpoint.pt").write_bytes(b"")  # only its existence is checked
    code, output, _ = torchrun(WORKER, "start-up-errors", str(tmp_path), *CLI_ARGS)
    assert code == 0, output[-3000:]
    for name in ("mismatch", "used-folder", "wandb"):
        assert output.count(f"{name}: exit 2") == RANKS, output[-3000:]
    assert "the ranks disagree on the training config: rank 1 has run.seed=1 (rank 0: 0)" in output, output[-3000:]
    assert not (tmp_path / "mismatch" / "run" / "checkpoint.pt").exists()
    assert output.count("marl train: error: run folder") == RANKS, output[-3000:]
    hint = f"continue it with torchrun --nproc-per-node 2 -m marl train --resume {used / 'checkpoint.pt'}"
    assert output.count(hint) == RANKS, output[-3000:]
    assert (used / "metrics.csv").read_text() == "iteration\n1\n"
    assert output.count("marl train: error: --wandb: W&B could not start the run") == RANKS, output[-3000:]
    assert "Traceback" not in output, output[-3000:]


@pytest.mark.slow
def test_an_off_policy_algorithm_trains_on_two_ranks_with_a_buffer_each(tmp_path):
    """MASAC under torchrun: every rank fills its own replay buffer, gradients are averaged, and the
    targets move alike on every rank (the run completes, its rows are finite, resume works)."""
    args = [
        *("-m", "marl", "train", "--algo", "masac", "--env", "speaker_listener"),
        *("--num-envs", "8", "--rollout-length", "8", "--batch-size", "32", "--updates-per-iteration", "2"),
        *("--buffer-size", "1000", "--hidden", "16", "--no-progress", "--no-tensorboard", "--log-dir", str(tmp_path)),
        *("--run-name", "run", "--save-buffer", "--eval-every", "2", "--eval-episodes", "3"),
    ]
    code, output, _ = torchrun(*args, "--total-frames", str(2 * FRAMES_PER_ITERATION))
    assert code == 0, output[-3000:]
    assert "replay buffer: 1,000 env steps, uniform" in output and "on each of 2 ranks" in output
    with open(tmp_path / "run" / "metrics.csv") as file:
        rows = list(csv.DictReader(file))
    assert [int(row["frames"]) for row in rows] == [FRAMES_PER_ITERATION, 2 * FRAMES_PER_ITERATION]
    for row in rows:
        for key in ("speaker/critic_loss", "listener/policy_loss", "listener/alpha"):
            assert math.isfinite(float(row[key])), (key, row[key])
    # The evaluation after iteration 2 pools both ranks' 3 episodes, each rank's envs seeded as its own.
    assert [row["eval/episodes"] for row in rows] == ["nan", "6.0"]
    state = load_checkpoint(tmp_path / "run" / "checkpoint.pt")
    config = TrainConfig.from_dict(state["config"])
    ranks = [reference_evaluation(config, state["algorithm"], eval_seed(0, 2) + 1000 * r, 3) for r in range(RANKS)]
    for key in ("eval/speaker/episode_return", "eval/listener/episode_return", "eval/episode_length"):
        assert float(rows[1][key]) == pytest.approx(sum(rank[key] for rank in ranks) / RANKS, rel=1e-5), key
    checkpoint = str(tmp_path / "run" / "checkpoint.pt")
    code, output, _ = torchrun(
        "-m", "marl", "train", "--resume", checkpoint, "--total-frames", str(3 * FRAMES_PER_ITERATION)
    )
    assert code == 0, output[-3000:]


@pytest.mark.slow
def test_a_vmas_run_on_two_ranks_resumes_exactly(tmp_path):
    """Each rank's VMAS world is in the checkpoint (gathered as any env state) and goes back to its rank:
    stopped after iteration 1 and resumed, the log equals the uninterrupted run's."""
    pytest.importorskip("vmas")
    args = ["-m", "marl", "train", "--env", "vmas/navigation", *CLI_ARGS, "--env-option", "n_agents=2"]
    for name, iterations in (("straight", 3), ("resumed", 1)):
        frames = str(iterations * FRAMES_PER_ITERATION)
        code, output, _ = torchrun(*args, "--log-dir", str(tmp_path / name), "--total-frames", frames)
        assert code == 0, output[-3000:]
    checkpoint = str(tmp_path / "resumed" / "run" / "checkpoint.pt")
    code, output, _ = torchrun(
        "-m", "marl", "train", "--resume", checkpoint, "--total-frames", str(3 * FRAMES_PER_ITERATION)
    )
    assert code == 0 and "cannot save its state" not in output, output[-3000:]
    straight, resumed = (read_rows(tmp_path / name / "run" / "metrics.csv") for name in ("straight", "resumed"))
    assert len(straight) == len(resumed) == 3
    assert all(same(training_columns(a), training_columns(b)) for a, b in zip(straight, resumed))

"""Run by `tests/marl/test_distributed.py` under torchrun, once per rank:

    python -m torch.distributed.run --standalone --nproc-per-node 2 tests/marl/app/distributed_worker.py SCENARIO ...

- `match OUT`: trains `ITERATIONS` iterations through the Trainer API and saves, per rank, to
  `OUT/rank{r}.pt`: the initial parameters, and per iteration the rollout buffer, the minibatch orders
  (every `torch.randperm` of the update) and the parameters after the update; then resumes from the
  checkpoint written after iteration 1 and saves the parameters after the resumed iteration 2.
- `start-up-errors LOG_DIR ARGS...`: three runs of `marl train ARGS --log-dir LOG_DIR/NAME` that each
  stop before training, one after another in this one job (starting a job costs more than the three
  runs): `mismatch` adds `--seed 1` on rank 1; `used-folder` finds a run in its folder (the test puts
  it there); `wandb` adds `--wandb --wandb-mode online` with no W&B key (the test's environment). Each
  prints `NAME: exit STATUS`; the job exits 0 once all three have run.
- `die ARGS...` / `hang ARGS...`: `marl train ARGS`, where rank 1 kills itself (SIGKILL) / sleeps for
  ever after the first gradient all-reduce of iteration 3.
- `nan ARGS...`: `marl train ARGS`, where rank 1's `navigation` envs return a NaN reward at their 20th step
  (iteration 3 with 8-step rollouts); rank 0's stay finite.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import time
from pathlib import Path

import torch

from envs.native.navigation import Navigation
from marl.algorithms.ppo import PPOConfig
from marl.app.cli import main
from marl.app.trainer import Trainer
from marl.config import EnvSettings, ModelConfig, RunConfig, TrainConfig

ITERATIONS = 2


def match_config(out: Path) -> TrainConfig:
    # normalize_advantage=False: advantages are normalised per rank's minibatch, which a single process
    # with the union of the ranks' minibatches cannot reproduce (see the README, "Multi-GPU and multi-node training").
    return TrainConfig(
        env=EnvSettings(env="navigation", num_envs=16, env_options={"max_steps": 5}),
        algo=PPOConfig(minibatch_size=32, epochs=2, normalize_advantage=False, lr=1e-3),
        model=ModelConfig(hidden=(16, 16)),
        run=RunConfig(
            total_frames=10**6, rollout_length=8, log_dir=str(out), run_name="run", progress=False, tensorboard=False
        ),
    )


def parameters(trainer: Trainer) -> list[torch.Tensor]:
    return [p.detach().clone() for lr in trainer.algorithm.learners.values() for p in lr.parameters()]


def match(out: Path) -> None:
    orders: list[torch.Tensor] = []
    randperm = torch.randperm

    def recording_randperm(*args, **kwargs):
        order = randperm(*args, **kwargs)
        orders.append(order.clone())
        return order

    torch.randperm = recording_randperm
    trainer = Trainer(match_config(out))
    rank = trainer.world.rank
    record: dict = {"initial": parameters(trainer), "iterations": []}
    for iteration in range(ITERATIONS):
        orders.clear()
        trainer.train_iteration()
        buffer = trainer.collector.buffer.clone().to_dict()
        record["iterations"].append({"buffer": buffer, "orders": list(orders), "parameters": parameters(trainer)})
        if iteration == 0:
            trainer.save()
            if rank == 0:
                shutil.copy(trainer.checkpoint_path, out / "after_1.pt")
            torch.distributed.barrier()  # rank 0 has written the copy
    resumed = Trainer.resume(out / "after_1.pt")
    resumed.train_iteration()
    record["resumed"] = parameters(resumed)
    record["straight_obs"] = trainer.collector.obs
    record["resumed_obs"] = resumed.collector.obs
    torch.save(record, out / f"rank{rank}.pt")
    trainer.world.close()


START_UP_ERRORS = {"mismatch": [], "used-folder": [], "wandb": ["--wandb", "--wandb-mode", "online"]}


def start_up_errors(log_dir: Path, args: list[str]) -> None:
    # `marl train` joins the process group once per process, so the runs after the first reuse it.
    for name, extra in START_UP_ERRORS.items():
        if name == "mismatch" and int(os.environ["RANK"]) == 1:
            extra = [*extra, "--seed", "1"]
        code = main(["train", *args, *extra, "--log-dir", str(log_dir / name)])
        print(f"{name}: exit {code}", flush=True)


def nan_reward_at_step_20() -> None:
    """Make every `navigation` env of this process return a NaN reward at its 20th step."""
    step = Navigation._step
    calls = [0]

    def stepping(self, action):
        reward, terminated = step(self, action)
        calls[0] += 1
        if calls[0] == 20:
            reward = {group: torch.full_like(value, float("nan")) for group, value in reward.items()}
        return reward, terminated

    Navigation._step = stepping


def cli(scenario: str, args: list[str]) -> int:
    rank = int(os.environ["RANK"])
    if scenario == "nan" and rank == 1:
        nan_reward_at_step_20()
    if scenario in ("die", "hang") and rank == 1:
        train_iteration = Trainer.train_iteration

        def failing_iteration(self):
            if self.iteration == 2:
                average_gradients = self.world.average_gradients

                def average_then_fail(parameters):
                    # After this first all-reduce of iteration 3, rank 0 has written iteration 2's checkpoint.
                    average_gradients(parameters)
                    if scenario == "die":
                        os.kill(os.getpid(), signal.SIGKILL)
                    time.sleep(3600)

                self.world.average_gradients = average_then_fail
            return train_iteration(self)

        Trainer.train_iteration = failing_iteration
    return main(["train", *args])


if __name__ == "__main__":
    scenario, rest = sys.argv[1], sys.argv[2:]
    if scenario == "match":
        match(Path(rest[0]))
    elif scenario == "start-up-errors":
        start_up_errors(Path(rest[0]), rest[1:])
    else:
        sys.exit(cli(scenario, rest))

"""The run loop, which knows no algorithm: collect -> learn -> log -> checkpoint.

The trainer builds the env and the algorithm (`marl.algorithms`, by `config.algo`), then each iteration:

1. **collect** `T` steps of `B` envs with the algorithm's acting policies into the time-major buffer
   (`marl.core.rollout`);
2. **learn**: `algorithm.update(batch)` returns each group's loss terms, as device tensors;
3. **log**: the iteration's metrics are read back in one host sync; a NaN or inf loss stops the run; with
   `--eval-every` every that many iterations and after the last, the policies' mode is evaluated on envs of
   its own (`marl.app.evaluate.TrainingEvaluation`: one more host read), which training never sees;
4. **checkpoint** every `checkpoint_every` iterations and at the end; `Trainer.resume` continues exactly.

An algorithm may collect the next iteration's batch during its update (`Algorithm.collect_ahead`); the
next iteration then learns from that batch, `_pending`, which checkpoints hold.

Under torchrun every rank runs this loop on its own envs (`marl.app.distributed`).

With several seeds (`--seeds`, `--num-seeds`) one process trains one run per seed, its *members*
(`marl.core.members`): one env batch of `S * num_envs` envs, one algorithm holding every member's state
(`marl.algorithms.base.register_seeded`), per-member metrics (`marl.app.seeds` logs and summarises them)
and, beside the population's checkpoint, each member's as an ordinary single-seed checkpoint.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import math
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

import torch
from tensordict import TensorDict

from envs import cudagraphs
from envs.base import canonical_device
from marl import algorithms
from marl.app import distributed, seeds
from marl.app.build import (
    build_algorithm,
    check_group_overrides,
    check_share_params_used,
    check_std_used,
    make_env,
    resolve_device,
)
from marl.app.checkpoint import load_algorithm_state, load_checkpoint, save_checkpoint
from marl.app.evaluate import TrainingEvaluation, eval_columns
from marl.app.logger import LogWriteError, NoLogger, RunLogger, drop_rows_after, read_rows, writes_tensorboard
from marl.app.paths import check_output_file, check_output_folder
from marl.app.wandb_logging import WandbStartError, check_installed, wandb_run
from marl.config import RESUMABLE, WANDB_OPTIONS, Member, RunConfig, TrainConfig
from marl.core.member_replay import MemberReplayBuffer
from marl.core.replay import ReplayBuffer, format_bytes, replay_nbytes
from marl.core.rollout import Collector
from marl.core.timing import PhaseTimer
from marl.optim.background import one_thread

__all__ = [
    "NonFiniteLossError",
    "NothingToTrain",
    "Trainer",
    "check_fresh_run_dir",
    "default_run_dir",
    "make_env",
    "resolve_device",
]


class NonFiniteLossError(FloatingPointError):
    """A loss term, or a tensor of the algorithm's state about to be checkpointed, became NaN or inf; the run
    stops instead of training on garbage (and keeps its last checkpoint)."""


class NothingToTrain(Exception):
    """`Trainer.resume(..., frames_left=True)` of a run that has trained its --total-frames already: said
    before anything is built (`marl train` prints it and exits 0, so that a job resubmitted after the run
    ended does not fail)."""


class Trainer:
    """Trains every group of `config.env` with the algorithm `config.algo` names."""

    def __init__(self, config: TrainConfig, run_dir: str | Path | None = None, *, resuming: bool = False) -> None:
        """`resuming` (set by `Trainer.resume`) lets the trainer reuse a run folder that holds a run;
        a fresh run refuses one, before anything is written."""
        if not isinstance(config, TrainConfig):
            raise TypeError(
                f"Trainer takes a marl.config.TrainConfig (TrainConfig(env=EnvSettings(...), algo=...)), got "
                f"{type(config).__name__}"
                + (": build it with TrainConfig.from_dict" if isinstance(config, dict) else "")
            )
        self.config = config
        # Under torchrun: this rank's device and process group (marl.app.distributed); else a no-op World.
        self.world, device = distributed.setup(resolve_device(config.run.device), config.to_dict())
        self.run_dir = Path(run_dir) if run_dir is not None else default_run_dir(config)
        if not resuming:  # rank 0 writes the run folder; every rank stops if it holds a run
            launcher = distributed.launcher(self.world.size, self.world.local_size)
            self.world.check_on_main(lambda: check_fresh_run_dir(self.run_dir, launcher))
        if config.run.wandb and self.world.is_main:
            check_installed()
        self.device = canonical_device(device)  # as its tensors report it: `cpu:0` is `cpu`
        self.members = config.run.members()
        self.seeds = tuple(member.seed for member in self.members)
        # The init of the nets: the first member's seed, which is `--seed` unless `--seeds` lists the seeds (a
        # population seeds each member's again as it builds it; `--seeds 5` alone is the run with seed 5).
        torch.manual_seed(self.seeds[0])
        if len(self.members) == 1:
            seed = self.world.seed(self.seeds[0])
            self.env = make_env(config, self.device, seed=seed)
            self.generator = torch.Generator(self.device).manual_seed(seed + 1)
            self.algorithm = build_algorithm(config, self.env, self.device, self.world, self.generator)
        else:  # one run per seed: each member's envs, generator and learners as a single run's with its seed
            seeds.check_population(config, self.world)
            seed = seeds.env_seed(config, self.seeds)  # the envs' (and the collector's first reset's)
            self.env = make_env(config, self.device, num_envs=len(self.seeds) * config.env.num_envs, seed=seed)
            self.generator = [torch.Generator(self.device).manual_seed(s + 1) for s in self.seeds]
            check_group_overrides(config, self.env.groups)
            self.algorithm = algorithms.build_seeded(
                config, self.env, self.device, self.world, self.generator, self.seeds, seeds.sweep_values(self.members)
            )
            seeds.check_memory(config, self.env, self.device, self.algorithm)  # before the rollout is allocated
        if not resuming:
            check_std_used(config, self.env.groups)
            check_share_params_used(config, self.env.groups)
            config.algo.check_groups(config, self.env.groups)
        self.world.broadcast_parameters(check_parameters(self.algorithm))
        self.env_seed = seed  # the envs' first reset's; a resume whose env state is not saved reseeds them
        self.collector = Collector(
            self.env,
            self.algorithm.acting,
            config.run.rollout_length,
            self.generator,
            seed=seed,
            compile=config.run.compile,
            unroll=config.run.compile_unroll,
        )
        self.buffer = self._replay_buffer()
        # --eval-every: the evaluation's own envs, built once (`evaluate` builds them when first asked else).
        self.evaluation: TrainingEvaluation | None = None
        if config.run.eval_every:
            self.evaluation = TrainingEvaluation(config, self.algorithm.acting, self.seeds, self.device, self.world)
        self._pending: TensorDict | None = None  # the next batch, when the update collected it ahead
        self.logged_rows: list[dict] = []  # resumed: the rows logged up to the checkpoint, for the summary
        self.saved_run: RunConfig | None = None  # resumed: the run options of the checkpoint, before the new ones
        self.frames_per_iteration = self.world.size * config.env.num_envs * config.run.rollout_length
        # Whole iterations only: total_frames rounded up to a multiple of an iteration's frames.
        self.frames_to_run = -(-config.run.total_frames // self.frames_per_iteration) * self.frames_per_iteration
        self.iteration, self.frames, self.elapsed = 0, 0, 0.0
        self.saved_iteration: int | None = None  # the iteration the last checkpoint written holds
        self.timer = PhaseTimer(self.device)
        # --compile on CUDA: whether the rollout and update steps were captured as CUDA graphs is said once
        # known (after the first iteration, or the first update of an algorithm that fills a buffer first).
        cudagraphs.clear()
        self.graphs_to_announce: set[str] = set()
        if config.run.compile and self.device.type == "cuda" and self.world.is_main:
            self.graphs_to_announce = {"update step"}
            if self.collector.compiled:
                self.graphs_to_announce.add("rollout step")
            else:
                print(f"CUDA graphs: rollout step: not compiled ({self._eager_reason()}: collected eagerly)")
        if not resuming and config.run.compile_unroll > 1 and not self.collector.compiled:
            raise ValueError(
                f"--compile-unroll {config.run.compile_unroll}: the rollout of {config.env.env} is not compiled "
                f"({self._eager_reason()}: collected eagerly, step by step), so it has no effect: leave it out"
            )

    def _eager_reason(self) -> str:
        """Why the rollout of a run with --compile is collected eagerly (`Collector.compiled` is False)."""
        return "the env checks values on the host" if self.env.traceable else "torch.compile cannot trace this env"

    def _replay_buffer(self) -> ReplayBuffer | None:
        """The algorithm's replay buffer (one per rank under torchrun), its size said before it is allocated;
        None for an on-policy algorithm."""
        if self.algorithm.collects != "transitions":
            return None
        replay = self.algorithm.replay()
        if not (isinstance(replay, tuple) and len(replay) == 2 and isinstance(replay[0], int)):
            raise TypeError(
                f"{type(self.algorithm).__qualname__}.replay() must return (capacity in env steps, Prioritized(...) "
                f"or None), got {replay!r}"
            )
        capacity, prioritized = replay
        hidden = self.algorithm.acting.hidden  # recurrent groups' states are stored with their steps
        nbytes = replay_nbytes(self.env.groups, capacity, self.env.state_spec, prioritized is not None, hidden)
        count = len(self.members)
        if self.world.is_main:
            kind = "prioritized" if prioritized else "uniform"
            ranks = f" on each of {self.world.size} ranks" if self.world.size > 1 else ""
            runs = f" for each of {count} runs" if count > 1 else ""
            print(
                f"replay buffer: {capacity:,} env steps{runs}, {kind}, {format_bytes(count * nbytes)} on "
                f"{self.device}{ranks}"
            )
        if count > 1:  # each member's buffer holds its own envs' steps
            return MemberReplayBuffer.for_env(self.env, capacity, members=count, prioritized=prioritized, hidden=hidden)
        return ReplayBuffer.for_env(self.env, capacity, prioritized=prioritized, hidden=hidden)

    def _collect(self) -> TensorDict:
        # With an algorithm that overlaps, every batch is collected on one intra-op thread, as it collects ahead.
        with one_thread() if self.algorithm.overlaps else contextlib.nullcontext():
            return self.collector.collect()

    def _collect_ahead(self) -> None:
        """`Algorithm.collect_ahead`: the next iteration's batch, collected now."""
        self._pending = self._collect()

    def train_iteration(self) -> dict[str, float]:
        """Collect (unless the previous update collected this batch ahead), learn; returns the iteration's
        metrics (one host sync); with several seeds, each member's under `members` (a list, in their order)."""
        start = time.perf_counter()
        self.algorithm.begin_iteration(self.frames, self.config.run.schedule_span())
        self.timer.mark("start")
        batch, self._pending = self._pending, None
        if batch is None:
            batch = self._collect()
        self.timer.mark("collect_s")
        episodes = self.collector.stats.take_finished()  # this batch's, before the update may collect the next
        if self.buffer is not None:
            self.buffer.extend(batch)
        more = self.frames + self.frames_per_iteration < self.config.run.total_frames
        self.algorithm.collect_ahead = self._collect_ahead if more else None
        terms = self.algorithm.update(batch if self.buffer is None else self.buffer, self.timer)
        self.timer.mark("update_s")
        members = len(self.members)
        shape = (members,) if members > 1 else ()  # several seeds: every value is per member
        check_terms(self.algorithm, terms, self.env.groups, shape, self.device)
        device_values = {"episodes": episodes.episodes, "episode_length": episodes.length_sum / episodes.episodes}
        for g in self.env.groups:
            device_values[f"{g}/episode_return"] = episodes.return_sum[g] / episodes.episodes
            for name, value in terms[g].items():
                device_values[f"{g}/{name}"] = value
        device_values = self.world.reduce_metrics(device_values, episodes)
        values = torch.stack([v.float().reshape(shape) for v in device_values.values()]).tolist()  # the one sync
        per_member = [dict(zip(device_values, column)) for column in zip(*values)] if members > 1 else None
        metrics = dict(zip(device_values, values)) if members == 1 else {"members": per_member}
        for run, member in zip(self.members, per_member or [metrics]):
            for g in self.env.groups:
                for name in terms[g]:
                    value = member[f"{g}/{name}"]
                    if name.endswith("loss") and not math.isfinite(value):
                        of_seed = f" (member {run.name})" if members > 1 else ""
                        raise NonFiniteLossError(
                            f"the {name} of group '{g}'{of_seed} became {value} at iteration "
                            f"{self.iteration + 1}; stopping instead of training on it (lower the learning rate, "
                            "check the env's rewards and observations for NaN/inf: --env-option check_values=True "
                            "names the env's output that holds one)"
                        )
        self.iteration += 1
        self.frames += self.frames_per_iteration
        seconds = time.perf_counter() - start
        self.elapsed += seconds
        return {
            "iteration": self.iteration,
            "frames": self.frames,
            "time_s": self.elapsed,
            "frames_per_s": self.frames_per_iteration / seconds,
            **self.timer.seconds(),
            **metrics,
        }

    def evaluate(self) -> dict[str, float] | list[dict[str, float]]:
        """Evaluate the policies as they are now, as `--eval-every` does after an iteration (`TrainingEvaluation`):
        the `eval/...` columns' values, read back in one host sync; with several seeds, one dict per member."""
        if self.evaluation is None:
            self.evaluation = TrainingEvaluation(
                self.config, self.algorithm.acting, self.seeds, self.device, self.world
            )
        device_values = self.evaluation.run(self.iteration)
        shape = (len(self.members),) if len(self.members) > 1 else ()
        values = torch.stack([v.float().reshape(shape) for v in device_values.values()]).tolist()  # the one sync
        if not shape:
            return dict(zip(device_values, values))
        return [dict(zip(device_values, column)) for column in zip(*values)]

    def _log_evaluation(self, row: dict) -> None:
        """With --eval-every, the evaluation's columns of an iteration's `row`: its values after every
        `eval_every`-th iteration and the last, else NaN (the columns are in every row, as the
        CSV's header is the first row's). `eval_s` is the seconds it took, apart from `time_s` (training's)."""
        run = self.config.run
        if not run.eval_every:
            return
        if self.iteration % run.eval_every == 0 or self.frames >= run.total_frames:
            start = time.perf_counter()
            values = self.evaluate()
            row["eval_s"] = time.perf_counter() - start
        else:
            row["eval_s"] = math.nan
            values = dict.fromkeys(eval_columns(list(self.env.groups)), math.nan)
            values = [values] * len(self.members) if len(self.members) > 1 else values
        if isinstance(values, list):
            for member, own in zip(row["members"], values):
                member.update(own)
        else:
            row.update(values)

    def train(self) -> list[dict[str, float]]:
        """Train until `total_frames`, logging every iteration and checkpointing every
        `checkpoint_every` iterations and at the end; returns the logged rows."""
        run = self.config.run
        loggers = [NoLogger()]

        def open_logger() -> None:  # on rank 0: a W&B run that cannot start stops every rank with its message
            if len(self.members) > 1:
                loggers[0] = seeds.PopulationLogger(
                    self.run_dir, self.members, self.frames_to_run, self.config, self.frames
                )
                return
            wandb = wandb_run(run, run.wandb_name or self.run_dir.name, None, self.config.to_dict())
            loggers[0] = RunLogger(
                self.run_dir, self.frames_to_run, self.frames, run.progress, run.tensorboard, wandb=wandb
            )

        self.world.check_on_main(open_logger, errors=(WandbStartError, LogWriteError))
        logger = loggers[0]
        rows = []
        saving = False  # a failure in save() comes after the iteration was counted
        try:
            while self.frames < run.total_frames:
                row = self.train_iteration()
                self._log_evaluation(row)
                logger.log(row)
                if self.graphs_to_announce:
                    self.graphs_to_announce = cudagraphs.announce(self.graphs_to_announce)
                rows.append(row)
                saving = True
                save_now = self.iteration % run.checkpoint_every == 0 or self.frames >= run.total_frames
                if len(rows) == 1 and not save_now:  # what the first checkpoint will hold, checked now (save checks it)
                    self._check_loadable(self.algorithm.state_dict(), self.algorithm.env_state_dict())
                if save_now:
                    self.save()
                saving = False
        except KeyboardInterrupt:
            logger.close(exit_code=1)
            if self.world.is_main:
                where = (
                    f"while saving iteration {self.iteration}'s checkpoint"
                    if saving
                    else f"at iteration {self.iteration}"
                )
                print(f"\ninterrupted {where}; {self._last_checkpoint_text()}")
            raise
        except Exception:
            logger.close(exit_code=1)
            if self.world.is_main:
                where = (
                    f"saving iteration {self.iteration}'s checkpoint" if saving else f"iteration {self.iteration + 1}"
                )
                print(f"\nthe run failed at {where}; {self._last_checkpoint_text()}")
            raise
        logger.close()
        return rows

    @property
    def checkpoint_path(self) -> Path:
        return self.run_dir / "checkpoint.pt"

    def _last_checkpoint_text(self) -> str:
        if not self.checkpoint_path.exists():
            return "no checkpoint was written yet"
        command = distributed.launcher(self.world.size, self.world.local_size)
        # Interrupted or failed while saving, the checkpoint holds an earlier iteration than the one logged last.
        held = f", of iteration {self.saved_iteration}," if self.saved_iteration is not None else ""
        return f"the last checkpoint{held} is {self.checkpoint_path} (resume with {command} train --resume {self.checkpoint_path})"

    # ---- checkpoints -----------------------------------------------------------------------------

    def state_dict(self) -> dict:
        unsaved = None  # why the env's state is not saved: said when the run resumes
        try:
            env_state = self.env.state_dict()
        except (AttributeError, NotImplementedError) as error:
            env_state, unsaved = None, str(error).split("\n")[0]
        return {
            "config": self.config.to_dict(),
            "iteration": self.iteration,
            "frames": self.frames,
            "elapsed": self.elapsed,
            "algorithm": self.algorithm.state_dict(),
            "generator": [g.get_state() for g in self.generator]
            if isinstance(self.generator, list)
            else self.generator.get_state(),
            "env": env_state,
            "env_unsaved": unsaved,
            "obs": self.collector.obs,
            "stats": self.collector.stats.state_dict(),
            "hidden": self.collector.hidden_state(),  # recurrent policies' states, per env
            "algorithm_envs": self.algorithm.env_state_dict(),  # e.g. a recurrent critic's states, per env
            # The replay buffer, with --save-buffer (it can be large).
            "buffer": self.buffer.state_dict() if self.buffer is not None and self.config.run.save_buffer else None,
            # The next batch, when the update collected it ahead (its episodes are in `stats`).
            "pending": self._pending.to_dict() if self._pending is not None else None,
        }

    def save(self) -> Path | None:
        """Write the checkpoint (under torchrun: a collective call, rank 0 writes and returns the path).
        An algorithm state holding NaN or inf is refused, so that the last checkpoint stays a good one."""
        state = self.state_dict()
        self._check_loadable(state["algorithm"], state["algorithm_envs"])
        check_finite_state(state["algorithm"], self.iteration)
        state = self.world.gather_checkpoint(state)
        if state is None:
            return None
        if len(self.members) > 1:  # each member also as an ordinary checkpoint, in its own run folder
            for k, member in enumerate(self.members):
                save_checkpoint(
                    seeds.member_dir(self.run_dir, member) / "checkpoint.pt", seeds.member_state(self, state, k)
                )
        path = save_checkpoint(self.checkpoint_path, state)
        self.saved_iteration = self.iteration
        return path

    def _check_loadable(self, algorithm_state: dict, env_state: dict) -> None:
        name = type(self.algorithm).__qualname__
        check_loadable(algorithm_state, f"{name}.state_dict()")
        check_loadable(env_state, f"{name}.env_state_dict()")

    def load_state_dict(self, state: dict) -> None:
        state = self.world.own_checkpoint(state)
        self.iteration, self.frames, self.elapsed = state["iteration"], state["frames"], state["elapsed"]
        self.saved_iteration = self.iteration
        load_algorithm_state(self.algorithm, state["algorithm"], self.algorithm.label(self.config, self.env.groups))
        if isinstance(self.generator, list):
            for generator, held in zip(self.generator, state["generator"]):
                generator.set_state(held)
        else:
            self.generator.set_state(state["generator"])
        if state["env"] is not None:
            self.env.load_state_dict(state["env"])
            self.collector.load_obs(state["obs"])
            self.collector.stats.load_state_dict(state["stats"])
            if "hidden" in state:
                self.collector.load_hidden_state(state["hidden"])
            if "algorithm_envs" in state:
                self.algorithm.load_env_state_dict(state["algorithm_envs"])
        else:
            # New episodes, from another seed for each checkpoint: from the run's own, every stretch of a run
            # resumed again and again would start with the episodes its first iterations had.
            self.collector.load_obs(self.env.reset_data(seed=resumed_env_seed(self.env_seed, state["iteration"])))
            self.collector.stats.load_state_dict(state["stats"], running=False)  # a batch collected ahead's
            if self.world.is_main:
                why = f" ({state['env_unsaved']})" if state.get("env_unsaved") else ""
                print(f"this env cannot save its state: resumed training starts new episodes{why}")
        if state.get("pending") is not None:
            self._pending = self.collector.buffer
            self._pending.update_(_to_device(state["pending"], self.device))
        if self.buffer is not None:
            if state.get("buffer") is not None:
                self.buffer.load_state_dict(state["buffer"])
                if state["env"] is None:  # the stored episodes do not go on: n-step returns stop at their ends
                    self.buffer.truncate_last_steps(self.config.env.num_envs)
            elif self.world.is_main:
                print("the checkpoint holds no replay buffer (trained without --save-buffer): it refills from empty")

    @classmethod
    def resume(cls, path: str | Path, *, frames_left: bool = False, **run_overrides) -> Trainer:
        """Continue the run saved at `path` (in its run folder); `run_overrides` may change RunConfig
        fields such as `total_frames`. The schedules keep the length they had (`RunConfig.schedule_frames`,
        pinned here), unless `run_overrides` sets `schedule_frames`: a longer run trains on with exploration
        as annealed as it was, not raised again as a fraction of the new total. A run that has trained its
        `total_frames` resumes to a trainer whose `train()` trains nothing (to inspect it), or with
        `frames_left` raises NothingToTrain before anything is built. Other RunConfig fields (the rollout
        length, the seeds, where it logs, compile) are refused, as `marl train --resume` refuses them: changed,
        the run would not continue exactly."""
        refused = sorted(set(run_overrides) - RESUMABLE)
        if refused:
            raise ValueError(
                f"Trainer.resume keeps the run's configuration: {refused} cannot change; only {sorted(RESUMABLE)} can"
            )
        state = load_checkpoint(path)
        config = TrainConfig.from_dict(state["config"])
        saved = config.run
        run = saved
        if not run_overrides.get("wandb", saved.wandb):  # resumed without W&B: the run's W&B options go too
            run = dataclasses.replace(
                run, **{k: getattr(RunConfig, k) for k in WANDB_OPTIONS if k not in run_overrides}
            )
        pinned = {"schedule_frames": saved.schedule_span()} if config.annealed() else {}  # none to keep else
        if not run_overrides.get("eval_every", saved.eval_every):  # resumed without evaluation: its episodes go too
            pinned["eval_episodes"] = RunConfig.eval_episodes
        run = dataclasses.replace(run, **{**pinned, **run_overrides})
        config = dataclasses.replace(config, run=run)
        if frames_left and state["frames"] >= run.total_frames:
            raise NothingToTrain(
                f"nothing to train: {Path(path).parent} has trained {state['frames']:,} frames (iteration "
                f"{state['iteration']}), --total-frames is {run.total_frames:,}; pass a larger --total-frames to "
                "train on"
            )
        trainer = cls(config, run_dir=Path(path).parent, resuming=True)
        if state["frames"] < run.total_frames:  # it will write there (a run resumed to be inspected will not)
            tensorboard = writes_tensorboard(run.tensorboard)
            trainer.world.check_on_main(lambda: check_resumed_run_dir(trainer.run_dir, trainer.members, tensorboard))
            trainer.world.check_on_main(lambda: check_logs_of(path, trainer.run_dir, trainer.members, state))
            trainer.world.check_on_main(lambda: check_kept_checkpoint(path, trainer.checkpoint_path))
        initial = [p.detach().clone() for p in trainer.algorithm.parameters()]  # checked at build
        trainer.load_state_dict(state)
        trainer.saved_run = saved
        if trainer.world.is_main and state["iteration"] > 0 and _unchanged(initial, trainer.algorithm.parameters()):
            print(
                f"warning: after {type(trainer.algorithm).__qualname__}.load_state_dict every parameter is as "
                "freshly initialised, though the checkpoint trained: does load_state_dict load them? Else this "
                "run trains from scratch"
            )
        if trainer.world.is_main:
            for line in seeds.keep_trained_alone(trainer.run_dir, trainer.members):
                print(line)
            # Iterations logged after the checkpoint (before a Ctrl-C or a crash) are trained again.
            for log in seeds.logs(trainer.run_dir, trainer.members):
                drop_rows_after(log, trainer.iteration)
            trainer.logged_rows = seeds.logged_rows(trainer.run_dir, trainer.members)
        return trainer


def resumed_env_seed(seed: int | tuple[int, ...], iteration: int) -> int | tuple[int, ...]:
    """The seed (each member's) that an env which cannot save its state restarts from when its run resumes
    from the checkpoint of `iteration`: one of 32 bits drawn from both, so the same checkpoint resumes alike."""
    if isinstance(seed, tuple):
        return tuple(resumed_env_seed(s, iteration) for s in seed)
    return seeds.derived_seed(seed, "resumed", iteration, bits=32)


def check_parameters(algorithm) -> list[torch.Tensor]:
    """`algorithm.parameters()` as a list, refused unless each is a tensor: else the run trains in one process
    and fails only under torchrun, inside the parameter broadcast."""
    parameters = algorithm.parameters()
    where = (
        f"{type(algorithm).__qualname__}.parameters() must return its learned tensors, e.g. "
        "[p for net in nets for p in net.parameters()]"
    )
    if not isinstance(parameters, Iterable):
        raise TypeError(f"{where}; it returned a {type(parameters).__name__}")
    parameters = list(parameters)
    for p in parameters:
        if not isinstance(p, torch.Tensor):
            raise TypeError(f"{where}; it holds a {type(p).__name__}")
    return parameters


def _unchanged(initial: list[torch.Tensor], parameters) -> bool:
    """Whether `parameters` (non-empty) equal `initial` bitwise (a host read per tensor, on resume only)."""
    parameters = list(parameters)
    if not initial or len(parameters) != len(initial):
        return False
    return all(torch.equal(a, b) for a, b in zip(initial, parameters))


RUN_TERMS = ("episode_return",)
"""Per group columns the run loop logs itself: a term of that name would overwrite them."""


def check_terms(algorithm, terms, groups, shape: tuple[int, ...], device: torch.device) -> None:
    """Refuse what `update` returned unless it is `{group: {name: tensor of shape}}` for exactly the env's
    groups, on `device`: else the logging below fails with a bare KeyError or a reshape error. Host-side
    metadata only, no sync."""
    expected = "{group: {name: 0-d tensor}}" if not shape else f"{{group: {{name: tensor {list(shape)}}}}}"
    where = f"{type(algorithm).__qualname__}.update must return {expected} on {device}"
    if not isinstance(terms, dict):
        raise TypeError(f"{where}, one entry per group; it returned {type(terms).__name__}")
    if set(terms) != set(groups):
        raise TypeError(f"{where} for the groups {sorted(groups)}, got the keys {sorted(terms, key=str)}")
    for g, named in terms.items():
        if not isinstance(named, dict):
            raise TypeError(f"{where}; group {g!r}: returned {type(named).__name__}, expected a dict of named terms")
        for name, value in named.items():
            if not isinstance(name, str):
                raise TypeError(
                    f"{where}; group {g!r}: a term is named {name!r} ({type(name).__name__}), expected a str"
                )
            if name in RUN_TERMS:  # logged as f"{g}/{name}" too: the term would silently replace the run's column
                raise TypeError(f"{where}; group {g!r}: a term is named {name!r}, which the run loop logs: rename it")
            term = f"{g}/{name}"
            if not isinstance(value, torch.Tensor):
                raise TypeError(
                    f"{where}; {term!r} is {type(value).__name__}, expected a {_tensor_text(shape)} on {device}"
                )
            if value.shape != shape or value.device != device:
                raise TypeError(
                    f"{where}; {term!r} has shape {tuple(value.shape)} on {value.device}, expected a "
                    f"{_tensor_text(shape)} on {device}"
                )


def check_finite_state(state: dict, iteration: int) -> None:
    """Raise NonFiniteLossError naming the tensors of the algorithm's `state` (its `state_dict()`, keyed by
    group) that hold NaN or inf: a loss can stay finite while a tensor it does not reach turns non-finite (PPO's
    value normaliser after a reward of 1e30), and a checkpoint of it would resume into NaN. Run per checkpoint
    only, which copies every tensor of the state to the host anyway (the state's tensors may lie on the device
    and on the CPU: one flag read per tensor)."""
    bad = [name for name, tensor in _floating_tensors(state) if not bool(torch.isfinite(tensor).all())]
    if bad:
        shown = ", ".join(bad[:4]) + (f" and {len(bad) - 4} more" if len(bad) > 4 else "")
        raise NonFiniteLossError(
            f"the algorithm's state holds NaN or inf after iteration {iteration} ({shown}); not writing its "
            "checkpoint (check the env's rewards and observations for NaN, inf or huge values, lower the learning "
            "rate)"
        )


_PLAIN = (torch.Tensor, str, bytes, int, float, complex, bool, type(None), torch.dtype, torch.device)


def check_loadable(state, what: str) -> None:
    """Refuse a `state` that `load_checkpoint` (torch.load with weights_only) would not read back: without
    this the run trained to its end and wrote the checkpoint, which `--resume` and `marl eval` then refused
    as "not a vecmarl checkpoint". Leaves of other types than the plain ones are tried alone."""
    for path, leaf in _leaves(state):
        if isinstance(leaf, _PLAIN):
            continue
        file = io.BytesIO()
        try:
            torch.save(leaf, file)
            file.seek(0)
            torch.load(file, weights_only=True)
        except Exception:
            raise TypeError(
                f"{what} holds a value of type {type(leaf).__name__} at {path!r}, which a checkpoint cannot load back "
                "(it loads "
                "tensors, numbers, strings and dicts, lists or tuples of them): store it as one of those"
            ) from None


def _leaves(data, path: str = ""):
    """`(path, leaf)` for every leaf of nested dicts, lists and tuples, paths joined by '/'."""
    if isinstance(data, dict):
        for key, value in data.items():
            yield from _leaves(value, f"{path}/{key}" if path else str(key))
    elif isinstance(data, (list, tuple)):
        for i, value in enumerate(data):
            yield from _leaves(value, f"{path}[{i}]")
    else:
        yield path, data


def _floating_tensors(data):
    """`(path, tensor)` for every non-empty floating-point tensor in nested dicts and lists (`_leaves`)."""
    for path, leaf in _leaves(data):
        if isinstance(leaf, torch.Tensor) and leaf.is_floating_point() and leaf.numel():
            yield path, leaf


def _tensor_text(shape: tuple[int, ...]) -> str:
    return "0-d tensor" if not shape else f"tensor of shape {shape} (one value per member)"


def _to_device(data, device: torch.device):
    """A nested dict of tensors moved to `device`."""
    if isinstance(data, dict):
        return {k: _to_device(v, device) for k, v in data.items()}
    return data.to(device)


def check_fresh_run_dir(run_dir: Path, launcher: str = "marl") -> None:
    """A fresh run must not append to another run's metrics.csv (whose header may lack this run's
    columns) nor overwrite its checkpoint. `launcher` starts this job (`distributed.launcher`): the
    resume hint's, as a job restarted with the same command most likely wrote the checkpoint."""
    # Checked before the env and the algorithm are built: the logger makes the folder only when training starts.
    check_output_folder(run_dir, f"cannot write the run folder {run_dir}")
    held = [name for name in ("metrics.csv", seeds.AGGREGATE, "checkpoint.pt") if (run_dir / name).exists()]
    if not held:
        return
    checkpoint = run_dir / "checkpoint.pt"
    advice = (
        f"continue it with {launcher} train --resume {checkpoint}"
        if checkpoint.exists()
        else "delete the folder to start it again (it has no checkpoint to resume from)"
    )
    raise ValueError(
        f"run folder {run_dir} already holds a run ({', '.join(held)}); pick another --run-name, or {advice}"
    )


def check_resumed_run_dir(run_dir: Path, members: Sequence[Member], tensorboard: bool = False) -> None:
    """A resumed run rewrites its checkpoints and appends to its logs (and with `tensorboard` to
    `run_dir/tensorboard/`): a folder or log this user cannot write (e.g. made read-only to keep it) is refused
    before training, not with a PermissionError at the first iteration's log or checkpoint."""
    what = f"cannot resume the run in {run_dir}"
    folders = [run_dir] if len(members) == 1 else [run_dir, *(seeds.member_dir(run_dir, m) for m in members)]
    if tensorboard:  # the TensorBoard writer opens its event file there only once training starts
        folders.append(run_dir / "tensorboard")
    for folder in folders:
        check_output_folder(folder, what)
    for log in seeds.logs(run_dir, members):
        if log.exists():  # else it is made in a folder checked above
            check_output_file(log, what)


def check_logs_of(checkpoint: str | Path, run_dir: Path, members: Sequence[Member], state: dict) -> None:
    """A resume writes next to its checkpoint: it drops the logs' rows after the checkpoint's iteration, appends
    its own and rewrites checkpoint.pt. Refuse logs of another run (the checkpoint copied into its folder), which
    it would cut and mix with its own: a log is the checkpoint's run's when its row of the checkpoint's iteration
    holds the checkpoint's frames and time_s (its seconds of training, a float the CSV holds exactly). A log
    without rows is the new one of a checkpoint copied alone into a folder."""
    it, frames, elapsed = state["iteration"], state["frames"], state["elapsed"]
    for log in seeds.logs(run_dir, members):
        rows = read_rows(log)
        if not rows or "iteration" not in rows[0]:  # none yet; or not a marl train log, which the resume names
            continue
        row = next((r for r in reversed(rows) if r["iteration"] == it), None)
        if row is not None and (row["frames"], row.get("time_s", elapsed)) == (frames, elapsed):
            continue
        logged = f"{row['frames']:,.0f} frames, {row.get('time_s', math.nan):.6g} s" if row else "no row"
        raise ValueError(
            f"{checkpoint} is not the checkpoint of the run logged in {log}: its iteration {it} was at {frames:,} "
            f"frames, {elapsed:.6g} s of training; the log holds {logged} for it. A resume would cut that log after "
            f"iteration {it} and append to it: resume a run from its own folder, or copy the checkpoint alone into an "
            "empty folder to train on from it there"
        )


def check_kept_checkpoint(checkpoint: str | Path, own: Path) -> None:
    """A resume from a checkpoint other than its folder's checkpoint.pt (a copy kept from an earlier iteration)
    would overwrite that one, which may hold later training, with its first save: refused."""
    if own.exists() and not own.samefile(checkpoint):
        raise ValueError(
            f"a resume from {checkpoint} writes its checkpoints to {own}, which holds another checkpoint it would "
            f"overwrite: resume {own}, or copy {Path(checkpoint).name} alone into an empty folder to train on from it "
            "there"
        )


def default_run_dir(config: TrainConfig) -> Path:
    member_seeds = sorted(set(config.run.member_seeds()))
    seed = f"seed{member_seeds[0]}" if len(member_seeds) == 1 else f"seeds{seeds.seeds_text(member_seeds, '_')}"
    seed += "-sweep" if config.run.sweep else ""
    name = config.run.run_name or (
        f"{config.env.env.replace('/', '_')}-{config.algo.algo}-{seed}-{time.strftime('%Y%m%d-%H%M%S')}"
    )
    return Path(config.run.log_dir) / name

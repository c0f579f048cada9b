"""The training loop: collect -> advantages -> update, for every group at once.

Each group has its own policy, critic, optimiser and (with per-group overrides) hyper-parameters;
all groups are collected in the same rollout and updated in the same minibatch steps, batched over
the envs. One iteration:

1. **collect** `T` steps of `B` envs into the time-major buffer (`marl.rollout`);
2. **advantages**: the critic's values of `obs` and of the true `next` observations in two batched
   passes, then `kernels.gae` per group;
3. **update**: PPO epochs over shuffled minibatches of the `T * B` frames;
4. **log**: the iteration's metrics are read back in one host sync.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import math
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from tensordict import TensorDict

import envs
import kernels
from envs.allocator import retain_freed_memory
from envs.base import canonical_device
from envs.compile import maybe_compile
from envs.specs import Box
from marl import distributed
from marl.background import Background, one_thread
from marl.checkpoint import load_checkpoint, save_checkpoint
from marl.config import AlgoConfig, EnvSettings, ModelConfig, TrainConfig
from marl.fused_step import NETS, FusedUpdateStep
from marl.groups import GroupedEnv
from marl.logger import NoLogger, RunLogger, drop_rows_after
from marl.models import Critic, CriticInput, Policy
from marl.optim import FusedAdam, clip_factors
from marl.ppo import combined_terms, explained_variance, policy_terms, value_terms
from marl.rollout import Collector, observations

CRITIC_KEYS = ("observation", "value", "value_target")  # what a critic's step reads of a group's batch
LOSS_TERMS = ("loss", "policy_loss", "value_loss", "entropy_loss", "approx_kl", "clip_fraction", "entropy")


class NonFiniteLossError(FloatingPointError):
    """A loss term became NaN or inf; the run stops instead of training on garbage."""


def resolve_device(device: str) -> torch.device:
    """`--device` as a torch device (`auto`: CUDA where available). The index stays as given: under
    torchrun a bare `cuda` lets each rank take its own (`distributed.setup`); `canonical_device` then
    gives the form the device's tensors report."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(device)
    except RuntimeError as error:  # torch's own message lists every backend it knows, not what marl runs on
        raise ValueError(f"unknown device {device!r}; expected cpu, cuda, cuda:N or auto") from error
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device} was asked for, but CUDA is not available; use --device cpu or auto")
    return device


def import_env_modules(settings: EnvSettings) -> None:
    """Import the `--imports` modules that register the env. A bare "No module named 'my_envs'" would
    not say why it is wanted, nor what to do when `marl train --resume` or `marl eval` runs from
    another folder than the run was started in."""
    for module in settings.imports:
        try:
            importlib.import_module(module)
        except ImportError as error:
            origin = f"the env {settings.env!r} comes from the module {module!r} (--imports {module})"
            if error.name is not None and f"{module}.".startswith(f"{error.name}."):  # the module (or its package)
                raise ImportError(
                    f"{origin}, which is not found here: run marl from the folder that holds it, "
                    "or add that folder to PYTHONPATH"
                ) from error
            raise ImportError(f"{origin}; importing it failed: {error}") from error


def make_env(config: TrainConfig, device: torch.device, num_envs: int | None = None, seed: int | None = None):
    """The configured env, regrouped by the configured group map."""
    settings = config.env
    import_env_modules(settings)
    env = envs.make(
        settings.env,
        num_envs=num_envs or settings.num_envs,
        device=device,
        seed=config.run.seed if seed is None else seed,
        **settings.env_options,
    )
    return GroupedEnv(env, settings.group_map, pad=settings.pad)


@dataclass
class Learner:
    """Everything one group learns with."""

    algo: AlgoConfig
    model: ModelConfig
    policy: Policy
    critic: Critic
    critic_input: CriticInput
    optimizer: torch.optim.Optimizer

    def parameters(self) -> list[torch.nn.Parameter]:
        return [*self.policy.parameters(), *self.critic.parameters()]


@torch.no_grad()
def clip_grad_norms_(parameter_lists: list[list[torch.nn.Parameter]], max_norm: float) -> list[torch.Tensor]:
    """`torch.nn.utils.clip_grad_norm_` on each list of parameters apart, in a handful of ops for all of
    them (one per-tensor norm pass, one scaling pass): the per-call overhead of clipping two nets every
    minibatch step was about 0.5 ms. Returns each list's total gradient norm before clipping."""
    grads = [[p.grad for p in params if p.grad is not None] for params in parameter_lists]
    norms, factors = clip_factors(grads, max_norm)
    for group, factor in zip(grads, factors):
        if group:
            torch._foreach_mul_(group, factor)
    return norms


def build_policies(config: TrainConfig, env, device: torch.device) -> dict[str, Policy]:
    policies = {}
    for group, spec in env.groups.items():
        _, model = config.for_group(group)
        policies[group] = Policy(
            spec, model.hidden, model.activation, model.share_params, model.log_std_init, model.std
        )
    return {g: p.to(device) for g, p in policies.items()}


def check_group_overrides(config: TrainConfig, groups) -> None:
    """The config checks the overridden fields; only the env knows its groups (after the group map), so a
    misspelt group is caught here instead of being silently ignored by `config.for_group`."""
    unknown = sorted(set(config.group_overrides) - set(groups))
    if unknown:
        raise ValueError(
            f"unknown group(s) {unknown} in the per-group overrides; "
            f"the groups of {config.env.env!r} (group map {config.env.group_map!r}) are {sorted(groups)}"
        )
    for group, overrides in config.group_overrides.items():
        # The std of continuous actions: a group with discrete actions has none, and would ignore it.
        ignored = sorted(set(overrides) & {"std", "log_std_init"})
        action = groups[group].action
        if ignored and not isinstance(action, Box):
            raise ValueError(
                f"group {group!r} has {type(action).__name__} actions, which have no std: the override(s) "
                f"{ignored} apply to continuous (Box) actions only; leave them out for {group!r}"
            )


def build_learners(config: TrainConfig, env, device: torch.device) -> dict[str, Learner]:
    check_group_overrides(config, env.groups)
    state_size = math.prod(env.state_spec.shape) if env.state_spec is not None else None
    policies = build_policies(config, env, device)
    learners = {}
    for group, spec in env.groups.items():
        algo, model = config.for_group(group)
        policy = policies[group]
        critic_input = CriticInput(
            algo.scope(), group, env.groups, state_size, agent_id=model.share_params, shared_value=algo.shared_value
        )
        critic = Critic(
            critic_input.size,
            spec.n_agents,
            model.hidden,
            model.activation,
            model.share_params,
            algo.normalize_value,
            shared_value=critic_input.shared_value,
        )
        critic = critic.to(device)
        optimizer = FusedAdam([*policy.parameters(), *critic.parameters()], lr=algo.lr, eps=algo.adam_eps)
        learners[group] = Learner(algo, model, policy, critic, critic_input, optimizer)
    return learners


class PhaseTimer:
    """Wall time per phase without host syncs: CUDA events on a GPU (read at the logging sync)."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.marks: list[tuple[str, object]] = []

    def mark(self, name: str) -> None:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.marks.append((name, event))
        else:
            self.marks.append((name, time.perf_counter()))

    def seconds(self) -> dict[str, float]:
        """Seconds between consecutive marks, keyed by the later mark's name and summed over the marks
        of one name (call after a sync)."""
        out: dict[str, float] = {}
        for (_, a), (name, b) in zip(self.marks, self.marks[1:]):
            out[name] = out.get(name, 0.0) + (a.elapsed_time(b) / 1000 if self.cuda else b - a)
        self.marks = []
        return out


class Trainer:
    """Trains every group of `config.env` with PPO (MAPPO or IPPO per group).

    On the CPU it makes the process keep freed memory for reuse (`envs.allocator`): the rollout's and
    the update's big tensors then stop faulting in fresh pages every step."""

    def __init__(self, config: TrainConfig, run_dir: str | Path | None = None, *, resuming: bool = False) -> None:
        """`resuming` (set by `Trainer.resume`) lets the trainer reuse a run folder that holds a run;
        a fresh run refuses one, before anything is written."""
        self.config = config
        # Under torchrun: this rank's device and process group (marl.distributed); else a no-op World.
        self.world, device = distributed.setup(resolve_device(config.run.device), config.to_dict())
        self.run_dir = Path(run_dir) if run_dir is not None else default_run_dir(config)
        if not resuming:  # rank 0 writes the run folder; every rank stops if it holds a run
            self.world.check_on_main(lambda: check_fresh_run_dir(self.run_dir))
        self.device = canonical_device(device)  # as its tensors report it: `cpu:0` is `cpu`
        if self.device.type == "cpu":
            retain_freed_memory()  # tensors freed every step reuse their pages (envs.allocator)
        torch.manual_seed(config.run.seed)
        seed = self.world.seed(config.run.seed)
        self.env = make_env(config, self.device, seed=seed)
        self.learners = build_learners(config, self.env, self.device)
        self.world.broadcast_parameters(p for lr in self.learners.values() for p in lr.parameters())
        self.generator = torch.Generator(self.device).manual_seed(seed + 1)
        self.collector = Collector(
            self.env,
            {g: lr.policy for g, lr in self.learners.items()},
            config.run.rollout_length,
            self.generator,
            seed=seed,
            compile=config.run.compile,
            unroll=config.run.compile_unroll,
        )
        # Compiled, a minibatch step is one graph (`marl.fused_step`); under torchrun the gradient
        # all-reduce sits between backward and Adam, so there only the loss is compiled.
        fuse = config.run.compile and self.world.size == 1
        self._minibatch_loss = maybe_compile(self._minibatch_loss_eager, config.run.compile and not fuse, self.device)
        self._fused_step = None
        if fuse and not config.run.overlap_critic:
            self._fused_step = FusedUpdateStep(self.learners, self._minibatch_loss_eager, self.device)
        # With overlap_critic: the policies' and the critics' steps apart, the critics' on a second thread
        # while the next batch, `_pending`, is collected (`_update_apart`).
        self._policy_step = self._critic_step = None
        self._pending: TensorDict | None = None
        if config.run.overlap_critic:
            if self.device.type != "cpu" or not fuse:
                raise ValueError(
                    "overlap_critic runs on the CPU in one process, where collecting leaves a core idle; this run "
                    f"is on {self.device} with {self.world.size} rank(s)"
                )
            loss = self._minibatch_loss_eager
            self._policy_step = FusedUpdateStep(self.learners, loss, self.device, nets=("policy",))
            self._critic_step = FusedUpdateStep(self.learners, loss, self.device, nets=("critic",), cpp_wrapper=True)
        self.frames_per_iteration = self.world.size * config.env.num_envs * config.run.rollout_length
        self.iteration, self.frames, self.elapsed = 0, 0, 0.0
        self.timer = PhaseTimer(self.device)

    # ---- one iteration ---------------------------------------------------------------------------

    @torch.no_grad()
    def compute_advantages(self, buffer: TensorDict) -> dict[str, torch.Tensor]:
        """Values of `obs` and of the true next observations, then GAE; written into `buffer`."""
        groups = list(self.env.groups)
        obs, state = observations(buffer, groups)
        next_obs, next_state = observations(buffer, groups, next=True)
        explained = {}
        for g, learner in self.learners.items():
            value = learner.critic.value(learner.critic_input(obs, state))  # [T, B, n], reward units
            next_value = learner.critic.value(learner.critic_input(next_obs, next_state))
            data = buffer[g]
            advantage, target = kernels.gae(
                data["reward"],
                value,
                next_value,
                data["done"],
                data["terminated"],
                gamma=learner.algo.gamma,
                lmbda=learner.algo.lmbda,
            )
            data.update({"value": value, "advantage": advantage, "value_target": target})
            wide = target.double()
            moments = torch.stack(
                [
                    torch.tensor(float(wide.numel()), dtype=torch.float64, device=self.device),
                    wide.sum(),
                    wide.square().sum(),
                ]
            )
            learner.critic.update_moments(*self.world.sum(moments))
            explained[g] = explained_variance(value, target)
        return explained

    # What the update reads from the rollout, per group and at the root.
    UPDATE_KEYS = ("observation", "action_mask", "action", "log_prob", "advantage", "value", "value_target")

    def update_inputs(self, buffer: TensorDict) -> tuple[dict[str, dict[str, torch.Tensor]], torch.Tensor | None]:
        """What the update reads from `buffer`: per group its `UPDATE_KEYS` as plain tensors `[T * B, ...]`
        (the minibatch gather and the loss then compile into one graph), values and targets in the
        critic's normalised units; and the state `[T * B, ...]` or None."""
        flat = {g: {k: v.flatten(0, 1) for k, v in buffer[g].items() if k in self.UPDATE_KEYS} for g in self.learners}
        for g, data in flat.items():
            # The critic learns in normalised units; its moments are fixed for the update, so once here.
            critic = self.learners[g].critic
            data["value"], data["value_target"] = map(critic.normalize_values, (data["value"], data["value_target"]))
        state = buffer["state"].flatten(0, 1) if "state" in buffer.keys() else None
        return flat, state

    def update(self, buffer: TensorDict, prefetch: bool = False) -> dict[str, dict[str, torch.Tensor]]:
        """PPO epochs over minibatches; returns each group's loss terms averaged over the updates. With
        `overlap_critic` and `prefetch`, the next batch is collected beside the critics' steps."""
        algo = self.config.algo
        frames = buffer.batch_size.numel()
        flat, state = self.update_inputs(buffer)
        size = algo.minibatch_size
        count = frames // size
        names = (*LOSS_TERMS, "policy_grad_norm", "critic_grad_norm")
        sums = {g: torch.zeros(len(names), device=self.device) for g in flat}  # [terms]: one add per step
        # Per group: [policy parameters, critic parameters], clipped apart; all of them, averaged over ranks.
        net_parameters = {
            g: [list(lr.policy.parameters()), list(lr.critic.parameters())] for g, lr in self.learners.items()
        }
        parameters = [p for nets in net_parameters.values() for net in nets for p in net]
        orders = [torch.randperm(frames, generator=self.generator, device=self.device) for _ in range(algo.epochs)]
        if self._critic_step is not None:
            batches = [order[k * size : (k + 1) * size] for order in orders for k in range(count)]
            self._update_apart(flat, state, batches, sums, prefetch)
        else:
            for order in orders:
                if self.config.run.compile:  # the gather by index stays in the compiled graph
                    data, data_state = flat, state
                    batches = [order[k * size : (k + 1) * size] for k in range(count)]
                else:
                    # Eagerly, one gather per tensor shuffles the epoch's frames and each minibatch is a
                    # slice of them (a view): the same rows as `order`'s slices in a few ops, not a gather
                    # per tensor per minibatch, for one more copy of the update's inputs while it runs.
                    data = {g: {k: v[order] for k, v in tensors.items()} for g, tensors in flat.items()}
                    data_state = state[order] if state is not None else None
                    batches = [slice(k * size, (k + 1) * size) for k in range(count)]
                for index in batches:
                    if self._fused_step is not None:
                        self._fused_step(data, data_state, index, sums)
                        continue
                    total, terms = self._minibatch_loss(data, data_state, index)
                    for learner in self.learners.values():
                        learner.optimizer.zero_grad(set_to_none=True)
                    total.backward()
                    self.world.average_gradients(parameters)
                    for g, learner in self.learners.items():
                        sums[g][: len(LOSS_TERMS)] += terms[g]
                        if learner.algo.max_grad_norm > 0:
                            # Clipped apart: the critic's gradients (large while values are far off) must
                            # not shrink the policy's through one shared norm.
                            clipped = clip_grad_norms_(net_parameters[g], learner.algo.max_grad_norm)
                            sums[g][len(LOSS_TERMS) :] += torch.stack(clipped)
                        learner.optimizer.step()
        for g, learner in self.learners.items():
            if learner.algo.max_grad_norm <= 0:  # not clipped, so not measured: NaN, not a norm of 0
                sums[g][len(LOSS_TERMS) :] = math.nan
        means = {g: (vector / (algo.epochs * count)).unbind() for g, vector in sums.items()}
        return {g: dict(zip(names, values)) for g, values in means.items()}

    def _update_apart(self, flat, state, batches: list[torch.Tensor], sums, prefetch: bool) -> None:
        """The policies' minibatch steps, then the critics' (the same minibatches). With `prefetch` the
        critics' steps start on a second thread while this one collects the next batch into `_pending`
        (one intra-op thread each); once it is collected, this thread takes the rest of them on all its
        threads. The phase timer marks the policies' and the rest of the critics' steps as `update_s`,
        the collection with the critics' steps beside it as `collect_s`."""
        for index in batches:
            self._policy_step(flat, state, index, sums)
        self.timer.mark("update_s")
        # The next collection overwrites the buffer that `flat` views: the critics read copies.
        critic_flat = {g: {k: data[k].clone() for k in CRITIC_KEYS} for g, data in flat.items()}
        critic_state = state.clone() if state is not None else None
        done = 0  # critic steps taken

        def critic_steps(stop: threading.Event) -> None:
            nonlocal done
            while done < len(batches) and not stop.is_set():
                self._critic_step(critic_flat, critic_state, batches[done], sums)
                done += 1

        if prefetch:
            background = Background(critic_steps)
            with background:
                self._pending = self.collector.collect()
                background.stop.set()  # after its current step, the rest are taken here, on every thread
            self.timer.mark("collect_s")
        for index in batches[done:]:
            self._critic_step(critic_flat, critic_state, index, sums)

    def _minibatch_loss_eager(
        self,
        flat: dict[str, dict[str, torch.Tensor]],
        state: torch.Tensor | None,
        index: torch.Tensor | slice,
        nets: tuple[str, ...] = NETS,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The sum of every group's PPO loss on the frames `index` (indices or a slice) of the flattened
        rollout, and per group its `LOSS_TERMS`, detached, in one vector. With `nets` one of `NETS`, only
        that net's part (`marl.ppo.policy_terms` / `value_terms`; the other's terms 0), which only it runs."""
        batch = {g: {k: v[index] for k, v in data.items()} for g, data in flat.items()}
        obs = {g: data["observation"] for g, data in batch.items()}
        state = state[index] if state is not None else None
        total, terms = 0.0, {}
        for g, learner in self.learners.items():
            data, a = batch[g], learner.algo
            parts = []
            if "policy" in nets:
                dist = learner.policy(data["observation"], data.get("action_mask"))
                parts.append(
                    policy_terms(
                        dist.log_prob(data["action"]),
                        data["log_prob"],
                        data["advantage"],
                        dist.entropy(),
                        clip_eps=a.clip_eps,
                        entropy_coef=a.entropy_coef,
                        normalize_advantage=a.normalize_advantage,
                    )
                )
            if "critic" in nets:
                parts.append(
                    value_terms(
                        learner.critic(learner.critic_input(obs, state)),  # normalised units, like the next two
                        data["value"],
                        data["value_target"],
                        clip_eps=a.clip_eps,
                        clip_value=a.clip_value,
                        value_coef=a.value_coef,
                    )
                )
            terms[g] = parts[0] if len(parts) == 1 else combined_terms(*parts)
            total = total + terms[g]["loss"]
        return total, {g: torch.stack([t[name].detach() for name in LOSS_TERMS]) for g, t in terms.items()}

    def _set_learning_rates(self) -> None:
        """Anneal each group with a linear schedule: lr * (1 - progress), progress by frames so far."""
        progress = min(self.frames / self.config.run.total_frames, 1.0)
        for learner in self.learners.values():
            if learner.algo.lr_schedule == "linear":
                for group in learner.optimizer.param_groups:
                    group["lr"] = learner.algo.lr * (1.0 - progress)

    def train_iteration(self) -> dict[str, float]:
        """Collect, advantages, update; returns the iteration's metrics (one host sync). With
        `overlap_critic` the batch was collected in the previous iteration's update, if there was one."""
        start = time.perf_counter()
        self._set_learning_rates()
        self.timer.mark("start")
        buffer, self._pending = self._pending, None
        if buffer is None:
            with one_thread() if self._critic_step is not None else contextlib.nullcontext():
                buffer = self.collector.collect()  # overlapping: on one thread, as every collection
        self.timer.mark("collect_s")
        episodes = self.collector.stats.take_finished()  # this batch's, before the update collects the next
        explained = self.compute_advantages(buffer)
        self.timer.mark("advantages_s")
        terms = self.update(buffer, prefetch=self.frames + self.frames_per_iteration < self.config.run.total_frames)
        self.timer.mark("update_s")
        device_values = {"episodes": episodes.episodes, "episode_length": episodes.length_sum / episodes.episodes}
        for g in self.learners:
            device_values[f"{g}/episode_return"] = episodes.return_sum[g] / episodes.episodes
            device_values[f"{g}/explained_variance"] = explained[g]
            for name, value in terms[g].items():
                device_values[f"{g}/{name}"] = value
        device_values = self.world.reduce_metrics(device_values, episodes)
        keys = list(device_values)
        values = torch.stack([v.float().reshape(()) for v in device_values.values()]).tolist()  # the one sync
        metrics = dict(zip(keys, values))
        for g in self.learners:
            for name in ("loss", "policy_loss", "value_loss", "entropy_loss"):
                if not math.isfinite(metrics[f"{g}/{name}"]):
                    raise NonFiniteLossError(
                        f"the {name} of group '{g}' became {metrics[f'{g}/{name}']} at iteration "
                        f"{self.iteration + 1}; stopping instead of training on it (lower the learning rate, "
                        "check the env's rewards and observations for NaN/inf)"
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

    # ---- the whole run -----------------------------------------------------------------------------

    def train(self) -> list[dict[str, float]]:
        """Train until `total_frames`, logging every iteration and checkpointing every
        `checkpoint_every` iterations and at the end; returns the logged rows."""
        run = self.config.run
        if self.world.is_main:
            logger = RunLogger(self.run_dir, run.total_frames, self.frames, run.progress, run.tensorboard)
        else:
            logger = NoLogger()
        rows = []
        try:
            while self.frames < run.total_frames:
                row = self.train_iteration()
                logger.log(row)
                rows.append(row)
                if self.iteration % run.checkpoint_every == 0 or self.frames >= run.total_frames:
                    self.save()
        except KeyboardInterrupt:
            logger.close()
            if self.world.is_main:
                print(f"\ninterrupted at iteration {self.iteration}; {self._last_checkpoint_text()}")
            raise
        except Exception:
            logger.close()
            if self.world.is_main:
                print(f"\nthe run failed at iteration {self.iteration + 1}; {self._last_checkpoint_text()}")
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
        return f"the last checkpoint is {self.checkpoint_path} (resume with {command} train --resume {self.checkpoint_path})"

    # ---- checkpoints -----------------------------------------------------------------------------

    def state_dict(self) -> dict:
        try:
            env_state = self.env.state_dict()
        except (AttributeError, NotImplementedError):
            env_state = None
        return {
            "config": self.config.to_dict(),
            "iteration": self.iteration,
            "frames": self.frames,
            "elapsed": self.elapsed,
            "learners": {
                g: {
                    "policy": lr.policy.state_dict(),
                    "critic": lr.critic.state_dict(),
                    "optimizer": lr.optimizer.state_dict(),
                }
                for g, lr in self.learners.items()
            },
            "generator": self.generator.get_state(),
            "env": env_state,
            "obs": self.collector.obs,
            "stats": self.collector.stats.state_dict(),
            # With overlap_critic, the next batch, already collected (its episodes are in `stats`).
            "pending": self._pending.to_dict() if self._pending is not None else None,
        }

    def save(self) -> Path | None:
        """Write the checkpoint (under torchrun: a collective call, rank 0 writes and returns the path)."""
        state = self.world.gather_checkpoint(self.state_dict())
        return save_checkpoint(self.checkpoint_path, state) if state is not None else None

    def load_state_dict(self, state: dict) -> None:
        state = self.world.own_checkpoint(state)
        self.iteration, self.frames, self.elapsed = state["iteration"], state["frames"], state["elapsed"]
        for g, lr in self.learners.items():
            saved = state["learners"][g]
            lr.policy.load_state_dict(saved["policy"])
            lr.critic.load_state_dict(saved["critic"])
            lr.optimizer.load_state_dict(saved["optimizer"])
        self.generator.set_state(state["generator"])
        if state["env"] is not None:
            self.env.load_state_dict(state["env"])
            self.collector.obs = _to_device(state["obs"], self.device)
            self.collector.stats.load_state_dict(state["stats"])
        else:
            print("this env cannot save its state: resumed training starts new episodes")
        if state.get("pending") is not None:
            self._pending = self.collector.buffer
            self._pending.update_(_to_device(state["pending"], self.device))

    @classmethod
    def resume(cls, path: str | Path, **run_overrides) -> Trainer:
        """Continue the run saved at `path` (in its run folder); `run_overrides` may change RunConfig
        fields such as `total_frames`."""
        state = load_checkpoint(path)
        config = TrainConfig.from_dict(state["config"])
        if run_overrides:
            config = dataclasses.replace(config, run=dataclasses.replace(config.run, **run_overrides))
        trainer = cls(config, run_dir=Path(path).parent, resuming=True)
        trainer.load_state_dict(state)
        if trainer.world.is_main:
            # Iterations logged after the checkpoint (before a Ctrl-C or a crash) are trained again.
            drop_rows_after(trainer.run_dir / "metrics.csv", trainer.iteration)
        return trainer


def _to_device(data, device: torch.device):
    """A nested dict of tensors moved to `device`."""
    if isinstance(data, dict):
        return {k: _to_device(v, device) for k, v in data.items()}
    return data.to(device)


def check_fresh_run_dir(run_dir: Path) -> None:
    """A fresh run must not append to another run's metrics.csv (whose header may lack this run's
    columns) nor overwrite its checkpoint."""
    held = [name for name in ("metrics.csv", "checkpoint.pt") if (run_dir / name).exists()]
    if not held:
        return
    checkpoint = run_dir / "checkpoint.pt"
    advice = (
        f"continue it with marl train --resume {checkpoint}"
        if checkpoint.exists()
        else "delete the folder to start it again (it has no checkpoint to resume from)"
    )
    raise ValueError(
        f"run folder {run_dir} already holds a run ({', '.join(held)}); pick another --run-name, or {advice}"
    )


def default_run_dir(config: TrainConfig) -> Path:
    name = config.run.run_name or (
        f"{config.env.env.replace('/', '_')}-{config.algo.algo}-seed{config.run.seed}-{time.strftime('%Y%m%d-%H%M%S')}"
    )
    return Path(config.run.log_dir) / name

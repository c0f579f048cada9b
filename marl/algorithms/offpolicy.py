"""What off-policy actor-critic algorithms share (MADDPG/IDDPG in `ddpg`, MASAC/ISAC in `sac`): the replay
schedule, target networks, warm-up, and the update loop around one optimiser step.

Per iteration the run loop extends the replay buffer (`marl.core.replay`) with the batch just collected;
`update` then draws the random numbers of the iteration at once from the run's generator (the sampling
noise, `draw_noise`, then the draws of env steps, `draw`: slots, or prioritized replay's stratified
fractions, `[updates_per_iteration, batch_size]`) and takes `updates_per_iteration` optimiser steps. Each
step is one `UpdateStep` call, with `--compile` one graph: it selects its row `t` of the draws (uniform:
the slots; prioritized: a find in the sum tree, `kernels.sum_tree`, as the previous step left it, and
importance weights whose exponent β is annealed to 1 over the run), gathers the `batch_size` env steps
from the buffer's storage, computes every group's critic, actor (and SAC's temperature) losses, steps
every group's nets with their Adam, moves the target networks by Polyak averaging, `target <- (1 - tau) *
target + tau * online`, and with prioritized replay sets the drawn steps' priorities to their TD errors
(`|y - Q|`, reduced over the agents by `priority_reduce`) in the tree. Nothing reads the device on the
host; between two steps only `UpdateStep`'s Adam step sizes run eagerly.

Targets are TD(0) and per agent: `y = r + gamma * (1 - terminated) * V'(s')`, from the true next
observation, so a truncated episode bootstraps and a terminated one does not. The critic and actor
losses are means over the agent-steps where the agent acted (`active`, where its group's agents may leave
mid-episode: `marl.core.masking`); a departed agent's TD error sets no priority, and `priority_reduce` mean
is over the agents that acted. A centralised critic reads a departed agent's observation and action as
zeros, at s and in the targets at s' (`marl.core.masking.agents_in` says which agents are in at each).

What each group's critic sees (its scope, as PPO's: `marl.core.models.CriticInput`): agent (IDDPG,
ISAC), group, or global (MADDPG, MASAC: every group's observations, or the env's state, and every
group's actions). In the actor's loss a group's own actions come from its current policy and other
groups' from the buffer; the critic's parameters are held fixed there (no gradient reaches them).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import ClassVar, Literal

import torch
from torch import nn
from torch.func import functional_call

from marl.algorithms.base import Algorithm
from marl.config import AlgorithmConfig, TrainConfig, as_dict, changed_flags, field_names, options_without_effect
from marl.core.distributions import RandomWhile
from marl.core.masking import masked_mean
from marl.core.models import CriticInput, action_features
from marl.core.replay import Prioritized, ReplayBuffer, gather
from marl.core.rollout import Acting
from marl.optim.update_step import UpdateStep

CRITIC_SCOPES = ("auto", "agent", "group", "global")
PRIORITY_OPTIONS = ("priority_alpha", "priority_beta", "priority_reduce")  # only prioritized replay uses them


@dataclass(frozen=True)
class OffPolicyConfig(AlgorithmConfig):
    """Options every off-policy actor-critic algorithm shares."""

    critic_scope: Literal["auto", "agent", "group", "global"] = "auto"
    """What the critic sees: agent (IDDPG/ISAC), group, global (MADDPG/MASAC: every group, or the env's state)."""
    shared_value: bool = False
    """With a centralised critic, one action value per env for the whole group (BenchMARL's MADDPG/MASAC
    critics) instead of one per agent."""
    lr: float = 3e-4
    """Adam learning rate of the policies and critics (and SAC's temperature)."""
    adam_eps: float = 1e-8
    """Adam's epsilon."""
    gamma: float = 0.99
    """Discount factor."""
    tau: float = 0.005
    """Polyak factor of the target networks: each optimiser step moves them this fraction towards the online ones
    (not Q-learning's copied ones, --target-update hard)."""
    max_grad_norm: float = 10.0
    """Clip the gradient norm of each group's policy and critic apart to this (0 disables clipping)."""
    buffer_size: int = 1_000_000
    """Replay buffer capacity in env steps (its memory is printed at the start)."""
    batch_size: int = 2048
    """Env steps drawn from the buffer per optimiser step."""
    updates_per_iteration: int = 32
    """Optimiser steps per iteration (an iteration collects num_envs * rollout_length frames)."""
    warmup_frames: int = 0
    """Act uniformly at random in the iterations that start before this many frames."""
    prioritized: bool = False
    """Prioritized replay: draw env steps in proportion to their last TD error, weighted by importance weights."""
    priority_alpha: float = 0.6
    """With --prioritized: how strongly priorities shape the draws (0: uniform)."""
    priority_beta: float = 0.4
    """With --prioritized: the importance weights' exponent at the start, annealed to 1 over the schedules'
    frames (--schedule-frames, else total_frames)."""
    priority_reduce: Literal["max", "mean"] = "max"
    """With --prioritized: how the agents' TD errors become one priority per env step (over the agents that acted
    there: an agent that left its episode counts in neither)."""

    anneal_options = "--prioritized (its importance weights' exponent, beta)"
    conditional: ClassVar[tuple[Conditional, ...]] = ()
    """Options that have no effect in some settings of the others (`Conditional`), refused there."""
    run_wide = (
        "buffer_size",
        "batch_size",
        "updates_per_iteration",
        "warmup_frames",
        "prioritized",
        "priority_alpha",
        "priority_beta",
        "priority_reduce",
    )

    def check(self) -> None:
        for name in ("gamma", "priority_beta"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"{name} must be in [0, 1], got {getattr(self, name)}")
        if not 0 < self.tau <= 1:  # 0 would keep the target networks at their initial weights for good
            raise ValueError(f"tau must be in (0, 1], got {self.tau}: a target network moves this fraction a step")
        for name in ("lr", "adam_eps"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        for name in ("max_grad_norm", "priority_alpha", "warmup_frames"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        for name in ("buffer_size", "batch_size", "updates_per_iteration"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.batch_size > self.buffer_size:
            raise ValueError(f"batch_size ({self.batch_size}) must be at most buffer_size ({self.buffer_size})")
        given = changed_flags(self, PRIORITY_OPTIONS)
        if given and not self.prioritized:
            raise options_without_effect(given, "prioritized replay only; this buffer draws uniformly", "--prioritized")
        if self.shared_value and self.scope() == "agent":
            raise ValueError(
                f"shared_value needs a centralised critic: critic_scope group or global, not {self.algo}'s agent"
            )

    def annealed(self) -> tuple[str, ...]:
        return ("beta",) if self.prioritized and self.priority_beta < 1 else ()

    def check_train(self, config: TrainConfig) -> None:
        frames = config.env.num_envs * config.run.rollout_length
        if self.batch_size > frames:
            raise ValueError(
                f"batch_size={self.batch_size} is larger than the {frames} frames (num_envs * rollout_length) "
                f"the buffer holds after the first iteration: pass --batch-size {frames} or less, or more envs "
                "or a longer rollout"
            )
        for option in Conditional.of(config):
            option.check(self, config)

    @classmethod
    def saved(cls, values: dict, algo: str, gru: bool) -> dict:
        # An earlier version also accepted the priority options without prioritized replay, where they had no effect.
        values = super().saved(values, algo, gru)
        return values if values.get("prioritized") else {k: v for k, v in values.items() if k not in PRIORITY_OPTIONS}

    @classmethod
    def saved_with_groups(cls, values: dict, overrides: dict, classes: Mapping) -> tuple[dict, dict]:
        # An earlier version also accepted the `conditional` options where they had no effect.
        options = dict.fromkeys(c for k in (cls, *classes.values()) for c in getattr(k, "conditional", ()))
        for option in options:
            run_unused, groups_unused = option.unused(values, cls, overrides, classes)
            if run_unused:
                values = {k: v for k, v in values.items() if k != option.name}
            overrides = {
                g: {k: v for k, v in o.items() if k != option.name or g not in groups_unused}
                for g, o in overrides.items()
            }
        return values, overrides

    def scope(self) -> str:
        if self.critic_scope != "auto":
            return self.critic_scope
        return "agent" if self.algo.startswith("i") else "global"


@dataclass(frozen=True)
class Conditional:
    """An option that has no effect in some settings of the others (`used`: whether a config of class `cls`,
    with the option values `values`, uses it; a value `values` lacks is its class's default): refused there,
    the run's and each group's own (`check`), and dropped from the checkpoints of earlier versions, which took
    it (`OffPolicyConfig.saved_with_groups`). `applies`: what it applies to; `switch`: the option value that
    makes it apply, for the run (group None) or a group (`--target-update polyak`, `--group a.target_update=
    polyak`); `why`: why a config does not use it, as the error says it."""

    name: str
    used: Callable[[Mapping, type], bool]
    applies: str
    switch: Callable[[str | None], str]
    why: Callable[[AlgorithmConfig], str]

    def unused(
        self, run: Mapping, run_class: type, overrides: Mapping[str, Mapping], classes: Mapping[str, type]
    ) -> tuple[bool, list[str]]:
        """Whether the run's value (in its options `run`) has no effect (its own config does not use it, nor any
        group that takes it), and the groups whose own value (in their `overrides`) has none. A group's config
        class is in `classes` (one missing, of an unknown algorithm, is taken to use it)."""

        def group_uses(group: str) -> bool:
            cls = classes.get(group)
            if cls is None:
                return True
            shared = {k: v for k, v in run.items() if k in field_names(cls)}
            return self.name in field_names(cls) and self.used({**shared, **overrides[group]}, cls)

        takes_run = [g for g, o in overrides.items() if self.name not in o and group_uses(g)]
        run_unused = self.name in field_names(run_class) and not self.used(run, run_class) and not takes_run
        return run_unused, [g for g, o in overrides.items() if self.name in o and not group_uses(g)]

    def check(self, config: AlgorithmConfig, train: TrainConfig) -> None:
        """Refuse the option where it has no effect: `config` is the run's (`train`'s) algorithm config."""
        classes = {g: train.group_algorithm(g) for g in train.group_overrides}
        run_unused, groups_unused = self.unused(as_dict(config), type(config), train.group_overrides, classes)
        given = changed_flags(config, (self.name,)) if run_unused else []
        if given:
            raise options_without_effect(given, f"{self.applies}; {self.why(config)}", self.switch(None))
        for g in groups_unused:
            given = [f"--group {g}.{self.name}={train.group_overrides[g][self.name]}"]
            because = f"in group {g!r} {self.why(train.for_group(g)[0])}, and "
            raise options_without_effect(given, self.applies, self.switch(g), because)

    @staticmethod
    def of(train: TrainConfig) -> tuple[Conditional, ...]:
        """The conditional options of every algorithm config class of the run `train` (its own, its groups')."""
        classes = (type(train.algo), *(train.group_algorithm(g) for g in train.group_overrides))
        return tuple(dict.fromkeys(c for cls in classes for c in getattr(cls, "conditional", ())))


def _moves_targets(values: Mapping, cls: type) -> bool:
    return values.get("target_update", getattr(cls, "target_update", "polyak")) != "hard"


def _anneals_exploration(values: Mapping, cls: type) -> bool:
    return values.get("exploration_anneal", cls.exploration_anneal) > 0


TAU = Conditional(
    "tau",
    _moves_targets,
    "target networks that move by it every step (--target-update polyak)",
    lambda g: "--target-update polyak" if g is None else f"--group {g}.target_update=polyak",
    lambda c: f"the targets are copied every {c.target_update_every} steps (--target-update hard)",
)
TARGET_UPDATE_EVERY = Conditional(
    "target_update_every",
    lambda values, cls: not _moves_targets(values, cls),
    "--target-update hard only",
    lambda g: "--target-update hard" if g is None else f"--group {g}.target_update=hard",
    lambda c: f"these targets move by tau every step ({c.target_update})",
)


def exploration_start(name: str, value: str) -> Conditional:
    """`name`, the start of an exploration schedule of `value` (`annealed`), which exploration_anneal 0 skips."""
    return Conditional(
        name,
        _anneals_exploration,
        f"the start of {value}'s annealing only",
        lambda g: "an --exploration-anneal above 0" if g is None else f"--group {g}.exploration_anneal above 0",
        lambda c: f"{value} is its end value from the start (--exploration-anneal 0)",
    )


def linear(start: float, end: float, progress: float) -> float:
    """`start` moved linearly to `end` as `progress` goes from 0 to 1 (held at `end` after)."""
    return start + (end - start) * min(max(progress, 0.0), 1.0)


def annealed(start: float, end: float, anneal: float, frames: int, total_frames: int) -> float:
    """An exploration schedule at `frames`: `start` moved linearly to `end` over the first `anneal`
    fraction of `total_frames` (`end` from the start when `anneal` is 0)."""
    span = anneal * total_frames
    return linear(start, end, frames / span if span > 0 else 1.0)


def anneals(start: float, end: float, anneal: float) -> bool:
    """Whether an exploration schedule (`annealed`) changes its value over the schedules' frames."""
    return anneal > 0 and start != end


def critic_input(config: TrainConfig, env, group: str, action_sizes: dict[str, int]) -> CriticInput:
    """What group `group`'s critic sees, by its scope, with `action_sizes` of the groups whose actions it sees."""
    algo, model = config.for_group(group)
    state_size = math.prod(env.state_spec.shape) if env.state_spec is not None else None
    return CriticInput(
        algo.scope(),
        group,
        env.groups,
        state_size,
        agent_id=model.share_params,
        shared_value=algo.shared_value,
        action_sizes=action_sizes,
    )


def frozen_copy(net: nn.Module) -> nn.Module:
    """A target network: a copy of `net` that no optimiser steps (it moves by `polyak_`)."""
    target = copy.deepcopy(net)
    target.requires_grad_(False)
    return target


def polyak_(targets: list[torch.Tensor], online: list[torch.Tensor], tau: float) -> None:
    """`target <- (1 - tau) * target + tau * online`, for every pair, in one foreach op."""
    torch._foreach_lerp_(targets, online, tau)


class OffPolicy(Algorithm):
    """The update loop of an off-policy algorithm (actor-critic, or value-based: `qlearning`); a subclass
    builds the nets of its groups, `self.groups`, in `__init__` and writes `next_actions` and `losses`.

    Subclass attributes: `learners` (per group an object with `algo`, the group's config, `modules()`,
    every module it saves by name, targets included, and `optimizer`), `trainables` (per group the
    `Trainable` its optimiser steps), `targets` (per group `(target tensors, online tensors)` for the
    Polyak update) and `term_names` (the loss terms `losses` returns per group, in order). Each group logs
    its terms and a gradient norm per net of its `Trainable`.

    `groups` (a subset of the env's, all by default) is what this algorithm trains: groups of one run may
    take algorithms of different modules (`marl.algorithms.mixed`), which then see each other's actions;
    `owner` maps each group to the algorithm that trains it (this one; a mixed run's: its module's).
    """

    collects = "transitions"
    term_names: tuple[str, ...] = ()
    scheduled: ClassVar[tuple[str, ...]] = ()
    """The acting policies' 0-d buffers `begin_iteration` anneals (DDPG's sigma, Q-learning's epsilon): a
    population (`marl.algorithms.offpolicy_seeds`) sets every member's as its single run's."""
    chunked = False
    """Whether the optimiser steps train on chunks of consecutive steps (Q-learning's recurrent nets: `draw`
    draws them, `chunks()` says how many of how many steps), else on env steps."""
    squashed: ClassVar[bool] = False
    """Whether this algorithm stores a Box group's action as the Gaussian's sample before the tanh (SAC's
    `TanhNormal`) rather than as the env's action (DDPG's): how critics read it (`stored_actions`)."""

    def __init__(
        self, config: TrainConfig, env, device: torch.device, world, generator: torch.Generator, groups=None
    ) -> None:
        super().__init__(config, env, device, world, generator)
        self.groups = {g: env.groups[g] for g in (env.groups if groups is None else groups)}
        self.member = groups is not None
        self.owner = {g: self for g in self.groups}
        # How each of the env's groups' stored actions read (a mixed run's `Mixed` sets its members' own).
        self.stored_squashed = {g: self.squashed for g in env.groups}
        for group, spec in self.groups.items():
            self.check_group(group, spec)
        self.warm = torch.zeros((), dtype=torch.bool, device=device)  # acting at random (warm-up)
        self.beta = config.algo.priority_beta
        # β as the step reads it: a tensor, so that annealing it changes no constant of the compiled step.
        self.beta_now = torch.full((), self.beta, dtype=torch.float64, device=device)
        self.replay_buffer: ReplayBuffer | None = None  # the buffer `update` draws from
        self.step_indices = torch.arange(config.algo.updates_per_iteration, device=device).view(-1, 1)

    def check_group(self, group: str, spec) -> None:
        """Raise a ValueError naming the group and the algorithms that fit when this one cannot train it."""

    def term_names_of(self, group: str) -> tuple[str, ...]:
        """The names of the loss terms `losses` returns for `group`."""
        return self.term_names

    def _build_step(self) -> None:
        """The subclass's `__init__` ends with this: `self.step`, one optimiser step of every group of
        `trainables` (compiled with --compile), unless this algorithm trains some groups of a `Mixed` run,
        which steps them with its own."""
        if self.member:
            return
        self.step = UpdateStep(
            self.trainables,
            self.step_loss,
            self.device,
            self.world,
            compile=self.config.run.compile,
            aux=True,
            after_step=self.after_step,
            prepare=self.select,
        )

    def after_step(self, aux: tuple[torch.Tensor, dict]) -> None:
        """After every optimiser step (inside the compiled graph when compiled): the target update, then
        the drawn steps' priorities (`aux`: their slots `[k]` and `loss`'s priorities)."""
        self.update_targets()
        buffer = self.replay_buffer
        if buffer.prioritized is not None:
            index, priority, active = aux
            buffer.set_priority_(index, buffer.reduce_priority(priority, active))

    def update_targets(self, polyak: Callable = polyak_) -> None:
        """After every optimiser step (inside the compiled graph when compiled): move the target networks;
        Polyak averaging by default, each group's step `polyak(targets, online, tau)` (a population with a
        swept tau moves each member's by its own: `marl.core.members.member_polyak_`)."""
        for g, (targets, online) in self.targets.items():
            polyak(targets, online, self.learners[g].algo.tau)

    def acting_policies(self) -> dict:
        """Each group's acting policy (a module: observation, mask -> distribution): its learner's `policy`."""
        return {g: lr.policy for g, lr in self.learners.items()}

    def acting_hidden(self) -> dict[str, tuple[int, int]]:
        """The recurrent acting policies' groups -> the shape `(n, h)` of one env's hidden state (none here)."""
        return {}

    @property
    def acting(self) -> Acting:
        return self.acting_with(self.acting_policies())

    def acting_with(self, policies: dict) -> Acting:
        """`Acting` with `policies` (per group; a population's act for every member), at random while warming up."""
        if self.config.algo.warmup_frames > 0:
            policies = {g: _RandomWhileWarm(policy, self.warm) for g, policy in policies.items()}
        return Acting(policies, hidden=self.acting_hidden())

    def replay(self) -> tuple[int, Prioritized | None]:
        algo = self.config.algo
        if not algo.prioritized:
            return algo.buffer_size, None
        return algo.buffer_size, Prioritized(algo.priority_alpha, algo.priority_beta, reduce=algo.priority_reduce)

    def begin_iteration(self, frames: int, total_frames: int) -> None:
        """Warm-up, beta and each group's `scheduled` policy buffers, from `schedules`."""
        algo = self.config.algo
        self.warm.fill_(frames < algo.warmup_frames)
        self.beta = self._beta(frames, total_frames)
        self.beta_now.fill_(self.beta)
        if self.scheduled:
            values = self.schedules(frames, total_frames)
            for g, lr in self.learners.items():
                for name in self.scheduled:
                    getattr(lr.policy, name).fill_(values[f"{g} {name}"])

    def schedules(self, frames: int, total_frames: int) -> dict[str, float]:
        """Prioritized replay's beta (as `begin_iteration`; unused with uniform draws); subclasses add each
        group's `scheduled` values as `GROUP NAME`."""
        return {"beta": self._beta(frames, total_frames)} if self.config.algo.prioritized else {}

    def _beta(self, frames: int, total_frames: int) -> float:
        return linear(self.config.algo.priority_beta, 1.0, frames / total_frames)

    def draw_noise(
        self, steps: int, batch_size: int, generator: torch.Generator | None = None
    ) -> dict[str, torch.Tensor]:
        """The noise the iteration's optimiser steps sample actions with, drawn at once from `generator`
        (this run's by default; a population's member's own): per group `[steps, batch_size, ...]` (none by
        default)."""
        return {}

    def see_buffer(self, buffer: ReplayBuffer) -> None:
        """Called at the start of each `update` with the buffer it draws from."""

    def update(self, buffer: ReplayBuffer, timer) -> dict[str, dict[str, torch.Tensor]]:
        algo = self.config.algo
        self.see_buffer(buffer)
        self.replay_buffer = buffer
        noise = self.draw_noise(algo.updates_per_iteration, algo.batch_size)
        drawn = self.draw(buffer, algo.updates_per_iteration)
        sums = None
        for t in self.step_indices:  # [1]: step t's draws and noise are selected on the device
            out, _ = self.step(buffer.storage, drawn, self.beta_now, noise, t)
            sums = out if sums is None else {g: sums[g] + v for g, v in out.items()}
        timer.mark("update_s")
        fill = buffer.size.float() / buffer.capacity
        out = {}
        for g, v in sums.items():
            names = (*self.term_names_of(g), *(f"{net}_grad_norm" for net in self.step.trainables[g].nets))
            out[g] = {**dict(zip(names, (v / algo.updates_per_iteration).unbind(), strict=True)), "buffer_fill": fill}
        return out

    def draw(self, buffer: ReplayBuffer, steps: int) -> torch.Tensor:
        """The random numbers of `steps` optimiser steps' draws of `batch_size` env steps from `buffer`, at
        once from this run's generator: `[steps, ...]`, row `t` step `t`'s (`ReplayBuffer.draw_ahead`)."""
        return buffer.draw_ahead(steps, self.config.algo.batch_size, self.generator)

    def select(self, storage, drawn, beta, noise, t) -> tuple:
        """The step's inputs to its loss's: step `t`'s slots and importance weights from its row of the
        `drawn` numbers (with the exponent `beta`, a 0-d tensor), in the tree as the previous step left it."""
        index, weight = self.replay_buffer.select(drawn.index_select(0, t).squeeze(0), beta)
        return storage, index, weight, noise, t

    def step_loss(self, storage, index, weight, noise, t):
        """`loss`'s total and terms, and as aux the slots, `loss`'s priorities and which agents acted at the
        slots (`acted`; for `after_step`)."""
        total, terms, priority = self.loss(storage, index, weight, noise, t)
        return total, terms, (index, priority, acted(storage, index, priority))

    def loss(self, storage, index, weight, noise, t):
        """`(total, {group: terms [len(term_names)]}, {group: |TD error| [k, n]})` of the env steps `index`
        of the buffer's `storage` (`weight`: their importance weights or None), with step `t`'s noise."""
        batch = gather(storage, index)
        return self.losses(batch, weight, noise, t, self.next_actions(batch, noise, t), storage, index)

    def stored_actions(self, batch: dict) -> dict[str, torch.Tensor]:
        """Every group's stored actions of the gathered `batch` as critics' inputs (`action_features`), each
        read as the algorithm that trains the group stores it."""
        groups = self.env.groups
        return {g: action_features(batch[g]["action"], spec, self.stored_squashed[g]) for g, spec in groups.items()}

    def next_actions(self, batch: dict, noise: dict, t: torch.Tensor) -> dict[str, tuple]:
        """Per group of this algorithm `(features, extra)`: the features (`action_features`) of the
        actions its agents would take at the next observations of the gathered `batch`, as the critics of
        every group see them in their TD targets, and what else `losses` reuses of that pass (or None)."""
        raise NotImplementedError

    def losses(self, batch: dict, weight, noise: dict, t: torch.Tensor, next_actions: dict[str, tuple], storage, index):
        """`loss`'s result for this algorithm's groups from the gathered `batch` and the `next_actions` of
        every group of the env; `storage` and `index` (the buffer, the drawn slots) serve losses that read
        beyond the gathered steps (n-step returns)."""
        raise NotImplementedError

    def parameters(self) -> list[torch.Tensor]:
        """The learned tensors and the targets (ranks must start from the same targets too)."""
        return [p for lr in self.learners.values() for m in lr.modules().values() for p in m.parameters()]

    def state_dict(self, group_state: Callable | None = None) -> dict:
        """Per group its modules' and optimiser's state; `group_state(group, learner)` gives another one in
        its place (a population's member's, or none: `marl.algorithms.offpolicy_seeds`). A subclass adds what
        else it holds (Q-learning's clock)."""
        group_state = group_state or own_state
        return {g: group_state(g, lr) for g, lr in self.learners.items()}

    def load_state_dict(self, state: dict, load_group: Callable | None = None) -> None:
        """`state_dict`'s inverse; `load_group(group, learner, its state)` loads each group's in its place."""
        load_group = load_group or load_own_state
        for g, lr in self.learners.items():
            load_group(g, lr, state[g])


def own_state(group: str, learner) -> dict:
    """A group's state in a checkpoint: every module's (targets included) and its optimiser's."""
    return {
        **{name: m.state_dict() for name, m in learner.modules().items()},
        "optimizer": learner.optimizer.state_dict(),
    }


def load_own_state(group: str, learner, state: dict) -> None:
    """Restore `own_state`."""
    for name, module in learner.modules().items():
        module.load_state_dict(state[name])
    learner.optimizer.load_state_dict(state["optimizer"])


class _RandomWhileWarm(nn.Module):
    """An acting policy that acts uniformly at random while `flag` (a 0-d bool tensor) is set."""

    def __init__(self, policy: nn.Module, flag: torch.Tensor) -> None:
        super().__init__()
        self.policy, self.flag = policy, flag

    def forward(
        self, observation: torch.Tensor, action_mask: torch.Tensor | None = None, hidden: torch.Tensor | None = None
    ) -> RandomWhile | tuple[RandomWhile, torch.Tensor]:
        if hidden is None:
            return RandomWhile(self.policy(observation, action_mask), self.flag)
        dist, hidden = self.policy(observation, action_mask, hidden)  # a recurrent policy's state moves on
        return RandomWhile(dist, self.flag), hidden


def split(batch: dict, groups) -> tuple[dict, dict, torch.Tensor | None, torch.Tensor | None]:
    """A gathered batch's observations and next observations per group, its state and next state (or None)."""
    obs = {g: batch[g]["observation"] for g in groups}
    next_obs = {g: batch[g]["next_observation"] for g in groups}
    return obs, next_obs, batch.get("state"), batch.get("next_state")


def acted(storage, index: torch.Tensor, groups) -> dict[str, torch.Tensor]:
    """Per group of `groups` whose agents may leave, which of them acted at the buffer's env steps `index`
    `[k]`: `active` `[k, n]`, the agents a priority is reduced over (`ReplayBuffer.reduce_priority`)."""
    return {g: storage[(g, "active")][index] for g in groups if (g, "active") in storage}


def fixed(module: nn.Module, *args):
    """`module(*args)` with its parameters held fixed: gradients reach the inputs only (an actor's loss
    through its critic). Under the compiled step's `functional_call` the parameters are the step's own."""
    return functional_call(module, {name: p.detach() for name, p in module.named_parameters()}, args)


def td_targets(reward: torch.Tensor, terminated: torch.Tensor, next_value: torch.Tensor, gamma: float) -> torch.Tensor:
    """TD(0) targets `r + gamma * (1 - terminated) * V'` per agent, `[k, n]` each: a truncated step
    (done, not terminated) bootstraps from its true next observation."""
    return reward + gamma * torch.where(terminated, 0.0, next_value)


def critic_loss(
    q: torch.Tensor, target: torch.Tensor, weight: torch.Tensor | None, active: torch.Tensor | None = None
) -> torch.Tensor:
    """The critics' loss: for each twin, the mean over the batch and agents of `weight * (Q - y)^2`
    (`weight` the importance weights `[k]`, or 1), summed over the twins. `q` `[k, twins, n]`, `target` `[k, n]`;
    `active` `[k, n]` bool: the mean is over those agent-steps only (None: all)."""
    error = (q - target.unsqueeze(1)).square()
    if weight is not None:
        error = error * weight.view(-1, 1, 1)
    return masked_mean(error, None if active is None else active.unsqueeze(1), dim=(0, 2)).sum()

"""Training configuration: one dataclass per concern, one docstring line per field.

`marl train --help` is generated from these docstrings, so they are the reference for every option.
Per-group overrides (`TrainConfig.group_overrides`, `--group NAME.FIELD=VALUE` on the command line)
change any `AlgoConfig` or `ModelConfig` field for one group (except `epochs` and `minibatch_size`,
which are run-wide because every group is updated in the same minibatch steps), e.g. a larger
learning rate for the speaker in `speaker_listener`.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from dataclasses import dataclass, field
from typing import Any, Literal

from envs import options as _options


@dataclass(frozen=True)
class EnvSettings:
    env: str = "navigation"
    """Env name (see `marl envs`): a native env, `vmas/<scenario>` or `pettingzoo/<module>.<env>`."""
    num_envs: int = 256
    """Envs stepped as one batch on the device."""
    env_options: dict = field(default_factory=dict)
    """The env's own options (`--env-option n_agents=5`); see `marl envs` for each env's."""
    group_map: str = "by_type"
    """Which agents train together: by_type, all_in_one or per_agent (from Python also an explicit
    dict {group: [agent names]}, as `marl.groups.GroupedEnv` takes)."""
    pad: bool = False
    """With group_map=all_in_one, zero-pad observations of different sizes and tag each agent's type."""
    imports: tuple[str, ...] = ()
    """Python modules to import first, e.g. your own module that registers an env (`--imports my_envs`)."""

    def __post_init__(self) -> None:
        _check_finite(self)
        if self.num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {self.num_envs}")


@dataclass(frozen=True)
class AlgoConfig:
    algo: Literal["mappo", "ippo"] = "mappo"
    """mappo: a centralised critic (critic_scope auto = global: every group's observations, or the env's
    state); ippo: each agent's critic sees its own observation."""
    critic_scope: Literal["auto", "agent", "group", "global"] = "auto"
    """What the critic sees: agent (IPPO), group (MAPPO), global (every group, or the env's state)."""
    shared_value: bool = False
    """With a centralised critic, one value per env for the whole group (TorchRL's and BenchMARL's
    MAPPO critic) instead of one per agent: n times less critic work, sound when the agents share a reward."""
    lr: float = 1e-3
    """Adam learning rate of the policy and the critic."""
    lr_schedule: Literal["constant", "linear"] = "constant"
    """constant, or linear: annealed from lr to 0 over total_frames (set at each iteration)."""
    adam_eps: float = 1e-5
    """Adam's epsilon (added to the root of the second moment): with small, unnormalised advantages it damps updates."""
    gamma: float = 0.99
    """Discount factor."""
    lmbda: float = 0.95
    """GAE lambda."""
    epochs: int = 4
    """PPO epochs over each rollout."""
    minibatch_size: int = 4096
    """Frames (env steps, all agents of the group) per minibatch; at most num_envs * rollout_length. Each
    epoch shuffles the iteration's frames into frames // minibatch_size minibatches; a remainder sits
    that epoch out (other frames each epoch)."""
    clip_eps: float = 0.2
    """PPO ratio clip."""
    clip_value: bool = True
    """Clip the value update around the rollout's values with the same clip_eps."""
    entropy_coef: float = 0.0
    """Weight of the entropy bonus."""
    value_coef: float = 0.5
    """Weight of the value loss."""
    max_grad_norm: float = 1.0
    """Clip the gradient norm of each group's policy, and of its critic, to this (0 disables clipping;
    the group's logged gradient norms then read nan: they are measured by the clipping)."""
    normalize_advantage: bool = True
    """Normalise each group's advantages per minibatch."""
    normalize_value: bool = True
    """Train the critic on value targets normalised by their running mean and std (MAPPO's value
    normalisation), so that rewards of any scale learn alike."""

    def __post_init__(self) -> None:
        _check_choices(self)
        _check_finite(self)
        for name in ("gamma", "lmbda"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"{name} must be in [0, 1], got {getattr(self, name)}")
        for name in ("lr", "adam_eps", "clip_eps"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        for name in ("entropy_coef", "value_coef", "max_grad_norm"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.shared_value and self.scope() == "agent":
            raise ValueError("shared_value needs a centralised critic: algo mappo, or critic_scope group or global")
        if self.epochs < 1 or self.minibatch_size < 1:
            raise ValueError(f"epochs and minibatch_size must be >= 1, got {self.epochs}, {self.minibatch_size}")

    def scope(self) -> str:
        if self.critic_scope != "auto":
            return self.critic_scope
        return "agent" if self.algo == "ippo" else "global"


@dataclass(frozen=True)
class ModelConfig:
    hidden: tuple[int, ...] = (64, 64)
    """Hidden layer sizes of the policy and the critic (`--hidden 256 256`)."""
    activation: Literal["tanh", "relu", "elu"] = "tanh"
    """Hidden activation."""
    share_params: bool = True
    """Agents of a group share one network; else each has its own (stacked, one batched matmul)."""
    log_std_init: float = 0.0
    """Initial log standard deviation of continuous actions (before tanh squashing)."""
    std: Literal["param", "state"] = "param"
    """Continuous actions' std: a learned parameter, the same in every state ("param"), or an output of
    the policy network through a biased softplus ("state", as BenchMARL's policies)."""

    def __post_init__(self) -> None:
        _check_choices(self)
        _check_finite(self)
        object.__setattr__(self, "hidden", tuple(int(h) for h in self.hidden))
        if any(h < 1 for h in self.hidden):
            raise ValueError(f"hidden sizes must be >= 1, got {self.hidden}")


MAX_SEED = 2**63 - 1  # torch's generators take a signed 64-bit seed; PettingZoo's envs refuse negative ones


def check_seed(seed: int) -> None:
    """A seed every env family and torch accept: an int in [0, 2**63 - 1]."""
    if not 0 <= seed <= MAX_SEED:
        raise ValueError(f"seed must be in [0, 2**63 - 1], got {seed}")


@dataclass(frozen=True)
class RunConfig:
    total_frames: int = 2_000_000
    """Frames (env steps) to train for."""
    rollout_length: int = 64
    """Steps collected per env per iteration (T); an iteration is num_envs * rollout_length frames."""
    seed: int = 0
    """Seeds the envs, the networks and the sampling."""
    device: str = "auto"
    """cpu, cuda, cuda:N, or auto (CUDA when present)."""
    log_dir: str = "runs"
    """Each run writes metrics.csv, checkpoint.pt and TensorBoard events to LOG_DIR/RUN_NAME."""
    run_name: str = ""
    """Name of the run's folder; default <env>-<algo>-seed<seed>-<time>."""
    checkpoint_every: int = 10
    """Write a checkpoint every this many iterations (and at the end)."""
    compile: bool = False
    """torch.compile the rollout step of native envs (policy and physics; VMAS and PettingZoo envs are
    collected eagerly) and each PPO minibatch step as one graph (loss, gradients, clipping, Adam); CUDA
    graphs on a GPU. The first iteration then spends a while compiling."""
    compile_unroll: int = 1
    """With --compile, on native envs: env steps per compiled rollout call. The call itself costs ~60 us
    on the CPU (guards, wrapper), which matters at small batches (16 envs: 4 cuts collection by a
    third); each doubling roughly doubles the rollout's compile time. Must divide rollout_length."""
    overlap_critic: bool = False
    """With --compile, on the CPU, in one process: update the policies, then start the critics' update on
    a second thread while the next batch is collected (it needs only the updated policies), one of
    torch's intra-op threads each; the critics' remaining steps then run on all threads. The same update
    in the same order, but not bit-reproducible: where the critics' steps change threads depends on
    timing, and one and two threads round differently. Pays where collecting leaves a core idle and the
    critics are much of the update (IPPO on VMAS at BenchMARL's settings: a 2-core iteration in 12.6-13.5 s
    instead of 14.3-16.1 s; MAPPO there, with its one small critic, is slower). collect_s then holds the
    collection beside the critics' steps."""
    progress: bool = True
    """Show a progress bar."""
    tensorboard: bool = True
    """Also log to TensorBoard when it is installed."""

    def __post_init__(self) -> None:
        _check_finite(self)
        for name in ("total_frames", "rollout_length", "checkpoint_every", "compile_unroll"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.rollout_length % self.compile_unroll:
            raise ValueError(
                f"compile_unroll ({self.compile_unroll}) must divide rollout_length ({self.rollout_length})"
            )
        if self.overlap_critic and not self.compile:
            raise ValueError(
                "overlap_critic needs compile: the critics' update runs apart from the policies' as the compiled "
                "update's steps (pass --compile too)"
            )
        check_seed(self.seed)


@dataclass(frozen=True)
class TrainConfig:
    env: EnvSettings = field(default_factory=EnvSettings)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    run: RunConfig = field(default_factory=RunConfig)
    group_overrides: dict = field(default_factory=dict)
    """{group: {field: value}} overriding AlgoConfig / ModelConfig fields for one group."""

    def __post_init__(self) -> None:
        for group, overrides in self.group_overrides.items():
            unknown = set(overrides) - set(GROUP_FIELDS)
            if unknown:
                raise ValueError(
                    f"unknown field(s) {sorted(unknown)} in the overrides for group {group!r}; "
                    f"overridable fields: {sorted(GROUP_FIELDS)}"
                )
        frames_per_iteration = self.env.num_envs * self.run.rollout_length
        if self.algo.minibatch_size > frames_per_iteration:
            raise ValueError(
                f"minibatch_size={self.algo.minibatch_size} is larger than an iteration's "
                f"num_envs * rollout_length = {frames_per_iteration} frames: pass --minibatch-size "
                f"{frames_per_iteration // 4} (4 minibatches per epoch), or more envs or a longer rollout"
            )

    def for_group(self, group: str) -> tuple[AlgoConfig, ModelConfig]:
        """The algorithm and model configs of `group`, with its overrides applied."""
        overrides = self.group_overrides.get(group, {})
        algo = {k: v for k, v in overrides.items() if k in _fields(AlgoConfig)}
        model = {k: v for k, v in overrides.items() if k in _fields(ModelConfig)}
        return (
            _options.build(AlgoConfig, {**_as_dict(self.algo), **algo}, f"group {group!r}"),
            _options.build(ModelConfig, {**_as_dict(self.model), **model}, f"group {group!r}"),
        )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainConfig:
        env = {**data["env"], "imports": tuple(data["env"].get("imports", ()))}
        # An explicit group map (a dict, given in Python) is not the `str` the command line takes: the
        # settings are built without it and it is put back as saved (GroupedEnv checks it).
        group_map = env.pop("group_map", "by_type")
        return cls(
            env=dataclasses.replace(_options.build(EnvSettings, env, "env"), group_map=group_map),
            algo=_options.build(AlgoConfig, data["algo"], "algo config"),
            model=_options.build(ModelConfig, {**data["model"], "hidden": tuple(data["model"]["hidden"])}, "model"),
            run=_options.build(RunConfig, data["run"], "run config"),
            group_overrides=data.get("group_overrides", {}),
        )


def _check_choices(config) -> None:
    """Every `Literal` field of `config` holds one of its choices (configs built in Python; options
    given by name are checked by `envs.options.build` before this)."""
    for name, tp in _options.field_types(type(config)).items():
        if typing.get_origin(tp) is Literal and not _options.matches_type(getattr(config, name), tp):
            raise ValueError(f"{name} must be one of {list(typing.get_args(tp))}, got {getattr(config, name)!r}")


def _check_finite(config) -> None:
    """Every float field of `config` is finite. The range checks after this compare with `<` and `<=`,
    which are False for NaN, so a NaN (or inf) would pass them and silently break training, e.g.
    max_grad_norm=nan turns gradient clipping off."""
    for name, tp in _options.field_types(type(config)).items():
        value = getattr(config, name)
        if tp is float and isinstance(value, (int, float)) and not math.isfinite(value):
            raise ValueError(f"{name} must be a finite number, got {value}")


def _fields(cls) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


def _as_dict(config) -> dict[str, Any]:
    return {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}


# Epochs and minibatches are run-wide: every group is updated in the same minibatch steps.
GROUP_FIELDS = (_fields(AlgoConfig) - {"epochs", "minibatch_size"}) | _fields(ModelConfig)
SECTIONS = {"env": EnvSettings, "algo": AlgoConfig, "model": ModelConfig, "run": RunConfig}

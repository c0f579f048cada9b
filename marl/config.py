"""Training configuration: one dataclass per concern, one docstring line per field.

    TrainConfig(env=EnvSettings(...), algo=PPOConfig(...), model=ModelConfig(...), run=RunConfig(...))

`algo` is the config of the algorithm that trains (each algorithm module has its own, a subclass of
`AlgorithmConfig`, registered with the algorithm: `marl.algorithms`). `marl train --help` is generated
from these docstrings, so they are the reference for every option. Per-group overrides
(`TrainConfig.group_overrides`, `--group NAME.FIELD=VALUE` on the command line) change any field of the
algorithm's config or of `ModelConfig` for one group, except the algorithm's run-wide fields (PPO's
`epochs` and `minibatch_size`: every group is updated in the same minibatch steps).
"""

from __future__ import annotations

import dataclasses
import itertools
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from envs import options as _options
from envs.registry import RegistrationError


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
    dict {group: [agent names]}, as `marl.core.groups.GroupedEnv` takes)."""
    pad: bool = False
    """With group_map=all_in_one, zero-pad observations of different sizes and tag each agent's type."""
    imports: tuple[str, ...] = ()
    """Python modules to import first: your own module that registers an env or an algorithm
    (`--imports my_envs`)."""

    def __post_init__(self) -> None:
        if not isinstance(self.group_map, (str, Mapping)):
            raise TypeError(
                f"EnvSettings: group_map={self.group_map!r}, expected a str or a dict {{group: [agent names]}}"
            )
        _options.check_fields(self, skip=("group_map",))
        if self.num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {self.num_envs}")


@dataclass(frozen=True)
class AlgorithmConfig:
    """The base of every algorithm's config. A subclass adds the algorithm's fields, each with a docstring
    line (its `--help` text), and checks their ranges in `check`."""

    algo: str = ""
    """The algorithm, by its registered name (`marl train --algo`)."""

    run_wide: ClassVar[tuple[str, ...]] = ()
    """Fields every group shares, which `--group NAME.FIELD=VALUE` cannot override."""
    recurrent: ClassVar[bool] = False
    """Whether the algorithm trains recurrent networks (`--model gru`)."""
    not_shared: ClassVar[tuple[str, ...]] = ()
    """Fields a group on this config does not take from a run on another algorithm's (`TrainConfig.for_group`):
    the run sets them for its own kind of algorithm (e.g. the critic's scope, which Q-learning has no use for)."""
    policy_std: ClassVar[bool] = True
    """Whether its policies sample continuous actions with a std (`--std`, `--log-std-init`): without one, those
    are refused (`TrainConfig._check_std`), as they would have no effect."""
    recurrent_options: ClassVar[tuple[str, ...]] = ()
    """Fields only recurrent networks use (`--model gru`): without them a value other than the default is
    refused (`TrainConfig._check_recurrent`), as it would have no effect."""
    anneal_options: ClassVar[str] = ""
    """The options that make this algorithm anneal a value over the schedules' frames (`annealed`), as the
    error that refuses `--schedule-frames` where nothing anneals names them."""

    def __post_init__(self) -> None:
        _check_choices(self)
        _options.check_fields(self)
        self.check()

    def check(self) -> None:
        """Raise a ValueError naming the field when a value is out of its range."""

    def check_train(self, config: TrainConfig) -> None:
        """Raise a ValueError when this config does not fit the rest of `config` (e.g. a minibatch larger
        than an iteration's frames)."""

    def check_groups(self, config: TrainConfig, groups: Mapping[str, Any]) -> None:
        """Raise a ValueError when an option of a new run (`config`, this config's run) has no effect on the env's
        `groups` (name -> spec), as one for continuous actions where every group's are discrete. Not on loading:
        a checkpoint of an earlier version that holds one resumes and evaluates as trained."""

    def annealed(self) -> tuple[str, ...]:
        """The values this config anneals over the schedules' frames (`RunConfig.schedule_frames`), by name
        (none by default)."""
        return ()

    @classmethod
    def saved(cls, values: dict[str, Any], algo: str, gru: bool) -> dict[str, Any]:
        """`values` of this config for the algorithm `algo` as a checkpoint holds them (its `algo` section, or
        a group's overrides), as this version takes them: options an earlier version accepted where they had no
        effect, and which `check` now refuses, back at their defaults (the run trained without them). Here the
        `recurrent_options` of a run in which no group is recurrent (`gru`: whether one is)."""
        return values if gru else {k: v for k, v in values.items() if k not in cls.recurrent_options}

    @classmethod
    def saved_with_groups(
        cls, values: dict[str, Any], overrides: dict[str, dict], classes: Mapping[str, type[AlgorithmConfig]]
    ) -> tuple[dict[str, Any], dict[str, dict]]:
        """`saved` for the options whose effect depends on the groups too: the run's `values` (its `algo`
        section) and the groups' `overrides` (each group's config class in `classes`, where its algorithm is
        known) with those an earlier version accepted where they had no effect dropped (none by default)."""
        return values, overrides


@dataclass(frozen=True)
class ModelConfig:
    hidden: tuple[int, ...] = (64, 64)
    """Hidden layer sizes of the policy and the critic (`--hidden 256 256`); none (`--group NAME.hidden=()`,
    or `hidden=()` in Python) makes them linear maps of their inputs, a legitimate baseline."""
    activation: Literal["tanh", "relu", "elu"] = "tanh"
    """Hidden activation."""
    share_params: bool = True
    """Agents of a group share one network; else each has its own (stacked, one batched matmul). A group of one
    agent has nothing to share: --no-share-params is refused where every group has one (--group NAME.share_params
    on such a group too)."""
    log_std_init: float = 0.0
    """Initial log standard deviation of continuous actions (before tanh squashing; PPO's and SAC's policies)."""
    std: Literal["param", "state"] = "param"
    """Continuous actions' std: a learned parameter, the same in every state ("param"), or an output of
    the policy network through a biased softplus ("state", as BenchMARL's policies)."""
    model: Literal["mlp", "gru"] = "mlp"
    """mlp, or gru: a recurrent layer (gru_hidden units) on the inputs, its state carried from step to step
    of each env and zeroed when the env's episode ends, then the MLP of --hidden (PPO: mappo, ippo; Q-learning:
    iql, vdn, qmix, whose Q-network is the recurrent net)."""
    gru_hidden: int = 64
    """With --model gru: units of the GRU's state."""
    gru_nets: Literal["policy", "critic", "both"] = "policy"
    """With --model gru: which nets are recurrent: the policy (the critic, which only sets the baseline,
    stays an MLP; half the GRU work of both), the critic, or both."""

    def __post_init__(self) -> None:
        _check_choices(self)
        _options.check_fields(self)
        object.__setattr__(self, "hidden", tuple(int(h) for h in self.hidden))
        if any(h < 1 for h in self.hidden):
            raise ValueError(f"hidden sizes must be >= 1, got {self.hidden}")
        if self.gru_hidden < 1:
            raise ValueError(f"gru_hidden must be >= 1, got {self.gru_hidden}")

    def recurrent(self, net: str) -> bool:
        """Whether `net` ("policy" or "critic") has a GRU."""
        return self.model == "gru" and self.gru_nets in ("both", net)

    @classmethod
    def saved(cls, values: dict[str, Any], gru: bool, std: bool) -> dict[str, Any]:
        """`values` of this config as a checkpoint holds them (its `model` section, or a group's overrides), as
        this version takes them: options an earlier version accepted where they had no effect, and which the
        checks now refuse, back at their defaults: the GRU's where no net is recurrent (`gru`), `--std` and
        `--log-std-init` where no policy has a std (`std`: DDPG's, Q-learning's)."""
        dropped = (() if gru else MODEL_RECURRENT_OPTIONS) + (() if std else MODEL_STD_OPTIONS)
        return {k: v for k, v in values.items() if k not in dropped}


# ModelConfig's fields that only `model="gru"` uses: refused, as they would have no effect, without it.
MODEL_RECURRENT_OPTIONS = ("gru_hidden", "gru_nets")
# ModelConfig's fields that only policies with a std use (`AlgorithmConfig.policy_std`).
MODEL_STD_OPTIONS = ("log_std_init", "std")


WANDB_MODES = ("online", "offline", "disabled")
WANDB_OPTIONS = ("wandb_project", "wandb_entity", "wandb_mode", "wandb_name")  # RunConfig's, which only --wandb uses
MAX_SEED = 2**63 - 1  # torch's generators take a signed 64-bit seed; PettingZoo's envs refuse negative ones


def check_seed(seed: int) -> None:
    """A seed every env family and torch accept: an int in [0, 2**63 - 1]."""
    if not 0 <= seed <= MAX_SEED:
        raise ValueError(f"seed must be in [0, 2**63 - 1], got {seed}")


# The RunConfig fields a resumed run may change (`marl train --resume`, `Trainer.resume`): its length, where
# and how it logs, checkpoints and evaluates, its device. Any other change would make the resume inexact.
RESUMABLE = frozenset({"total_frames", "schedule_frames", "checkpoint_every", "progress", "tensorboard", "device"})
RESUMABLE |= {"save_buffer", "wandb", "wandb_project", "wandb_entity", "wandb_mode", "wandb_name"}
RESUMABLE |= {"eval_every", "eval_episodes"}  # the evaluation during training, which training never sees


@dataclass(frozen=True)
class RunConfig:
    total_frames: int = 2_000_000
    """Frames (env steps) to train for, rounded up to whole iterations. With --resume: train on to this many;
    the schedules keep the run's length (--schedule-frames)."""
    schedule_frames: int = 0
    """Frames the schedules anneal over (Q-learning's epsilon, DDPG's sigma, prioritized replay's beta, PPO's
    --lr-schedule linear), held at their end values after; 0: total_frames. A resumed run keeps the length its
    schedules had, whatever its new --total-frames, so that annealed values stay annealed; pass this with
    --resume to stretch them over another length (PPO's linear lr, which would stay at 0, needs it to train on
    past its schedule). Refused where nothing anneals (e.g. PPO's constant lr, SAC without --prioritized)."""
    rollout_length: int = 64
    """Steps collected per env per iteration (T); an iteration is num_envs * rollout_length frames."""
    seed: int = 0
    """Seeds the envs, the networks and the sampling."""
    seeds: tuple[int, ...] = ()
    """Train one run per seed in one process (`--seeds 0 1 2 3 4`; every built-in algorithm, groups on different
    off-policy ones too, with --model gru too where a single run takes it), each as a run with --seed that seed:
    parameters stacked on a seed dim, all runs' envs in one batch; replaces --seed (refused beside it)."""
    num_seeds: int = 1
    """Train this many seeds in one process: seed, seed + 1, ... (as --seeds)."""
    sweep: tuple[str, ...] = ()
    """Cross the seeds with values of continuous algorithm options (`--sweep lr=1e-4,1e-3 clip_eps=0.1,0.2`):
    one run per seed and combination, all in one process (PPO: lr, entropy_coef, clip_eps, value_coef, gamma,
    lmbda; the off-policy algorithms: lr, gamma, tau)."""
    device: str = "auto"
    """cpu, cuda, cuda:N, or auto (CUDA when present)."""
    log_dir: str = "runs"
    """Each run writes metrics.csv, checkpoint.pt and TensorBoard events to LOG_DIR/RUN_NAME."""
    run_name: str = ""
    """Name of the run's folder, one folder in LOG_DIR (no '/', '..'); default <env>-<algo>-seed<seed>-<time>."""
    checkpoint_every: int = 10
    """Write a checkpoint every this many iterations (and at the end)."""
    eval_every: int = 0
    """Evaluate the policies every this many iterations and after the last (0: never): their mode (greedy,
    no exploration) on --eval-episodes separate envs, one episode each, seeded from --seed and the iteration;
    logged as eval/<group>/episode_return. Training is unchanged by it. Under torchrun each rank runs
    --eval-episodes and the logged value pools them all."""
    eval_episodes: int = 32
    """With --eval-every: episodes per evaluation (per run with several seeds, per rank under torchrun)."""
    compile: bool = False
    """torch.compile the rollout step of native envs (policy and physics; VMAS and PettingZoo envs are
    collected eagerly) and each optimiser step as one graph (loss, gradients, clipping, Adam; under
    torchrun the loss only); CUDA graphs on a GPU. The first iteration then spends a while compiling.
    Several seeds (--seeds) compile every member's acting and envs into one rollout graph and every
    member's optimiser step into one graph."""
    compile_unroll: int = 1
    """With --compile, on native envs: env steps per compiled rollout call. Each call has a fixed cost
    (guards, wrapper), which matters at small batches; each doubling roughly doubles the rollout's
    compile time. Must divide rollout_length."""
    save_buffer: bool = False
    """With an algorithm that learns from a replay buffer: save the buffer in checkpoints too (it can be
    large: its size is printed at the start), so that a resumed run continues exactly; without it a
    resumed run starts with an empty buffer."""
    progress: bool = True
    """Show a progress bar."""
    tensorboard: bool = True
    """Also log to TensorBoard when it is installed."""
    wandb: bool = False
    """Also log to Weights & Biases (pip install "vecmarl[wandb]"): one W&B run, or with several seeds one per
    member, grouped under the run's name; each logs metrics.csv's columns, step = frames."""
    wandb_project: str = "vecmarl"
    """With --wandb: the W&B project."""
    wandb_entity: str = ""
    """With --wandb: the W&B user or team owning the project; default your W&B default entity."""
    wandb_mode: str = ""
    """With --wandb: online; offline (no network: W&B's files go to the run folder, upload them later with
    `wandb sync`); or disabled. Default: WANDB_MODE, else online."""
    wandb_name: str = ""
    """With --wandb: the W&B run's name; with several seeds, their group's (each member's run is
    NAME/seed_<s>...). Default: the run folder's name."""

    def __post_init__(self) -> None:
        _options.check_fields(self)
        for name in ("total_frames", "rollout_length", "checkpoint_every", "compile_unroll", "eval_episodes"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.eval_every < 0:
            raise ValueError(f"eval_every must be >= 0 (0: no evaluation during training), got {self.eval_every}")
        given = changed_flags(self, ("eval_episodes",))
        if given and not self.eval_every:
            raise options_without_effect(given, "the evaluation during training only", "--eval-every N")
        if self.schedule_frames < 0:
            raise ValueError(f"schedule_frames must be >= 0 (0: total_frames), got {self.schedule_frames}")
        if self.rollout_length % self.compile_unroll:
            raise ValueError(
                f"compile_unroll ({self.compile_unroll}) must divide rollout_length ({self.rollout_length})"
            )
        given = changed_flags(self, ("compile_unroll",))
        if given and not self.compile:  # eager steps one by one: grouping them into calls changes nothing
            raise options_without_effect(given, "the compiled rollout only, as steps per compiled call", "--compile")
        if self.wandb_mode not in ("", *WANDB_MODES):
            raise ValueError(
                f"wandb_mode must be one of {list(WANDB_MODES)} (or empty: WANDB_MODE, else online), got {self.wandb_mode!r}"
            )
        if not _one_folder(self.run_name):  # LOG_DIR/RUN_NAME: "../x" or "/x" would write outside LOG_DIR
            raise ValueError(
                f"run_name {self.run_name!r} must name one folder under the log dir ({self.log_dir}): no '/', '\\', "
                "'.' or '..'; to write elsewhere, pass --log-dir PARENT --run-name NAME"
            )
        given = changed_flags(self, WANDB_OPTIONS)
        if given and not self.wandb:
            raise options_without_effect(given, "Weights & Biases logging only", "--wandb")
        check_seed(self.seed)
        object.__setattr__(self, "seeds", tuple(int(s) for s in self.seeds))
        for seed in self.seeds:
            check_seed(seed)
        if len(set(self.seeds)) < len(self.seeds):
            repeated = sorted({s for s in self.seeds if self.seeds.count(s) > 1})
            raise ValueError(f"seeds {list(self.seeds)} repeat {repeated}: each seed trains one run, list it once")
        if self.num_seeds < 1:
            raise ValueError(f"num_seeds must be >= 1, got {self.num_seeds}")
        if self.seeds and self.seed != _field_default(RunConfig, "seed"):  # members() takes the list's seeds only
            raise ValueError(
                f"{changed_flags(self, ('seed',))[0]}: --seeds {' '.join(map(str, self.seeds))} names each run's "
                "seed, and --seed would have no effect: leave it out (or pass --seed with --num-seeds: seed, seed + 1, ...)"
            )
        if self.seeds and self.num_seeds not in (1, len(self.seeds)):
            raise ValueError(
                f"num_seeds={self.num_seeds} but {len(self.seeds)} seeds were listed: pass --seeds or --num-seeds"
            )
        check_seed(self.seed + self.num_seeds - 1)
        object.__setattr__(self, "sweep", tuple(self.sweep))
        grid = self.sweep_grid()
        if grid and len(self.members()) < 2:
            raise ValueError(f"--sweep {' '.join(self.sweep)} with one seed is one run: set the option itself instead")

    @classmethod
    def saved(cls, values: dict[str, Any], replay: bool) -> dict[str, Any]:
        """The run options `values` as a checkpoint holds them, as this version takes them: options an earlier
        version accepted where they had no effect, and which `__post_init__` now refuses, dropped (the run trained
        at their defaults): `seed` beside `seeds`, the W&B options without `wandb`, a `run_name` that is not
        one folder's (a resume writes next to its checkpoint, whatever the name); `compile_unroll` without `compile`;
        `save_buffer` without a replay buffer (`replay`: whether the run's algorithm learns from one)."""
        dropped = {"seed"} if values.get("seeds") else set()
        dropped |= set() if replay else {"save_buffer"}
        dropped |= set() if values.get("compile") else {"compile_unroll"}
        dropped |= set() if _one_folder(values.get("run_name", "")) else {"run_name"}
        dropped |= set() if values.get("wandb") else set(WANDB_OPTIONS)
        return {k: v for k, v in values.items() if k not in dropped}

    def schedule_span(self) -> int:
        """The frames the schedules anneal over: `schedule_frames`, else `total_frames`."""
        return self.schedule_frames or self.total_frames

    def member_seeds(self) -> tuple[int, ...]:
        """The seeds of the runs trained in this process: `seeds`, else `seed`, `seed + 1`, ... `num_seeds` of them
        (with a sweep, each seed once per combination of values: `members()`)."""
        return tuple(member.seed for member in self.members())

    def sweep_grid(self) -> dict[str, tuple[float, ...]]:
        """`sweep` as `{option: values}`."""
        grid: dict[str, tuple[float, ...]] = {}
        for item in self.sweep:
            name, _, values = item.partition("=")
            try:
                parsed = tuple(float(v) for v in values.split(","))
            except ValueError:
                parsed = ()
            if not name or not parsed or name in grid or len(set(parsed)) < len(parsed):
                raise ValueError(
                    f"--sweep takes OPTION=V1,V2,... once per option, distinct numbers (lr=1e-4,3e-4), got {item!r}"
                )
            shown = [f"{v:g}" for v in parsed]  # as in the members' folder names (`Member.name`)
            if len(set(shown)) < len(shown):
                raise ValueError(
                    f"--sweep {item}: values that agree to 6 significant digits ({', '.join(shown)}) would share a "
                    "member folder: sweep values that differ within 6 digits"
                )
            grid[name] = parsed
        return grid

    def members(self) -> tuple[Member, ...]:
        """The runs trained in this process: every seed, crossed with every combination of the sweep's values."""
        seeds = self.seeds or tuple(range(self.seed, self.seed + self.num_seeds))
        grid = self.sweep_grid()
        combos = list(itertools.product(*grid.values()))
        return tuple(Member(seed, tuple(zip(grid, combo))) for seed in seeds for combo in combos)


def _one_folder(name: str) -> bool:
    """Whether `name` is empty (the default run name) or names one folder inside another, not a path."""
    return name not in (".", "..") and "/" not in name and "\\" not in name


@dataclass(frozen=True)
class Member:
    """One run of a population (`RunConfig.members`): its seed and its swept option values."""

    seed: int
    values: tuple[tuple[str, float], ...] = ()

    @property
    def name(self) -> str:
        """`seed_3`, or with swept values `seed_3-lr_0.001-clip_eps_0.1`: its folder in the run's."""
        return "-".join([f"seed_{self.seed}", *(f"{k}_{v:g}" for k, v in self.values)])


def _default_algorithm() -> AlgorithmConfig:
    from marl import algorithms

    return algorithms.default_config(algorithms.DEFAULT)


@dataclass(frozen=True)
class TrainConfig:
    env: EnvSettings = field(default_factory=EnvSettings)
    algo: AlgorithmConfig = field(default_factory=_default_algorithm)
    model: ModelConfig = field(default_factory=ModelConfig)
    run: RunConfig = field(default_factory=RunConfig)
    group_overrides: dict = field(default_factory=dict)
    """{group: {field: value}} overriding fields of the algorithm's config or of ModelConfig for one group."""

    def __post_init__(self) -> None:
        if type(self.algo) is AlgorithmConfig or not isinstance(self.algo, AlgorithmConfig):
            raise TypeError(
                f"algo must be an algorithm's config (e.g. marl.algorithms.ppo.PPOConfig), got {self.algo!r}"
            )
        from marl import algorithms

        expected = algorithms.config_class(self.algo.algo)
        if not isinstance(self.algo, expected):  # QConfig(algo="qmix") trained QMIX on IQL's defaults, not its own
            raise TypeError(
                f"algo={self.algo.algo!r} takes a {expected.__module__}.{expected.__qualname__}, got a "
                f"{type(self.algo).__qualname__}: build it with {expected.__qualname__}(algo={self.algo.algo!r}, ...) "
                f"or marl.algorithms.default_config({self.algo.algo!r})"
            )
        for name, cls in SECTIONS.items():
            if not isinstance(getattr(self, name), cls):
                raise TypeError(f"{name} must be a marl.config.{cls.__name__}, got {getattr(self, name)!r}")
        overrides = self.group_overrides
        if not isinstance(overrides, Mapping) or not all(isinstance(o, Mapping) for o in overrides.values()):
            raise TypeError(f"group_overrides must be a dict {{group: {{field: value}}}}, got {overrides!r}")
        for group, overrides in self.group_overrides.items():
            cls = self.group_algorithm(group)
            fields = group_fields(cls)
            run_wide = sorted(set(overrides) & set(cls.run_wide))
            if run_wide:  # known fields, which "unknown field(s)" would have called misspelt
                raise ValueError(
                    f"{run_wide} in the overrides for group {group!r}: {cls.__qualname__}'s run-wide field(s) "
                    f"{list(cls.run_wide)} are one value for every group; set them for the whole run "
                    f"(--{run_wide[0].replace('_', '-')}), not per group"
                )
            unknown = set(overrides) - fields
            if unknown:
                raise ValueError(
                    f"unknown field(s) {sorted(unknown)} in the overrides for group {group!r}; "
                    f"overridable fields: {sorted(fields)}"
                )
        if self.run.save_buffer and algorithms.get(self.algo.algo).collects != "transitions":
            applies = (
                f"algorithms that learn from a replay buffer; --algo {self.algo.algo} learns from each iteration's "
                "rollout and has none"
            )
            raise options_without_effect(["--save-buffer"], applies, None)
        self._check_recurrent()
        self._check_std()
        self._check_schedule_frames()
        self.algo.check_train(self)

    def annealed(self) -> tuple[str, ...]:
        """The values annealed over the schedules' frames, the run's algorithm's and every group's, by name."""
        configs = [self.algo, *(self.for_group(g)[0] for g in self.group_overrides)]
        return tuple(dict.fromkeys(name for config in configs for name in config.annealed()))

    def _check_schedule_frames(self) -> None:
        """`--schedule-frames` only where something anneals over it (a resumed run's pin: `Trainer.resume`)."""
        given = changed_flags(self.run, ("schedule_frames",))
        if given and not self.annealed():
            applies = f"annealed values only, and --algo {self.algo.algo} anneals none with these options"
            raise options_without_effect(given, applies, type(self.algo).anneal_options or None)

    def uses_gru(self) -> bool:
        """Whether any group's networks are recurrent (`--model gru`, or a group's override)."""
        models = [self.model.model, *(o["model"] for o in self.group_overrides.values() if "model" in o)]
        return "gru" in models

    def _check_recurrent(self) -> None:
        """`--model gru` only for groups on an algorithm that trains recurrent networks, and the options of
        recurrent training (`AlgorithmConfig.recurrent_options`) only with it."""
        if not self.uses_gru():
            given = changed_flags(self.algo, type(self.algo).recurrent_options)
            if given:
                applies = "recurrent networks only, which train in chunks of steps; these networks are MLPs"
                raise options_without_effect(given, applies, "--model gru")
            # ModelConfig's GRU fields: the run's, used where any group is recurrent.
            given = changed_flags(self.model, MODEL_RECURRENT_OPTIONS)
            if given:
                raise options_without_effect(given, "recurrent networks only; these networks are MLPs", "--model gru")
        for group, overrides in self.group_overrides.items():  # a group's own, where it is recurrent
            given = _group_flags(group, overrides, MODEL_RECURRENT_OPTIONS)
            if given and overrides.get("model", self.model.model) != "gru":
                has_mlps = f"group {group!r} has MLPs, and "
                raise options_without_effect(given, "recurrent networks only", f"--group {group}.model=gru", has_mlps)
        refused = {}  # group (None: the run's) -> its algorithm's name
        if self.model.model == "gru" and not type(self.algo).recurrent:
            refused[None] = self.algo.algo
        for group, overrides in self.group_overrides.items():
            cls = self.group_algorithm(group)
            if overrides.get("model", self.model.model) == "gru" and not cls.recurrent:
                refused[group] = overrides.get("algo", self.algo.algo)
        if refused:
            from marl import algorithms

            able = [n for n in algorithms.names() if algorithms.config_class(n).recurrent]
            group, name = next(iter(refused.items()))
            where = "" if group is None else f" (group {group!r})"
            raise ValueError(
                f"--model gru{where}: --algo {name} trains MLPs only; recurrent networks train with "
                f"--algo {' or '.join(able)} (or pass --model mlp)"
            )

    def _check_std(self) -> None:
        """`--std` and `--log-std-init` (the run's, or a group's) only where a group's policy has a std."""
        from marl import algorithms

        has_std = [n for n in algorithms.names() if algorithms.config_class(n).policy_std]
        groups = {g: self.group_algorithm(g) for g in self.group_overrides}
        given = changed_flags(self.model, MODEL_STD_OPTIONS)
        if given and not any(cls.policy_std for cls in (type(self.algo), *groups.values())):
            raise ValueError(
                f"{', '.join(given)}: --algo {self.algo.algo}'s policies have no std to set (those of --algo "
                f"{', '.join(has_std)} have one): leave {'it' if len(given) == 1 else 'them'} out"
            )
        for group, overrides in self.group_overrides.items():
            given = _group_flags(group, overrides, MODEL_STD_OPTIONS)
            if given and not groups[group].policy_std:
                name = overrides.get("algo", self.algo.algo)
                raise ValueError(
                    f"{', '.join(given)}: the {name} policy of group {group!r} has no std to set: leave it out"
                )

    def group_algorithm(self, group: str) -> type[AlgorithmConfig]:
        """The config class of `group`'s algorithm: the run's, unless `--group NAME.algo=OTHER` names an
        algorithm of another module (e.g. `iql` for one group of a `masac` run); the algorithms of one run
        must collect alike (all on-policy, or all from the one replay buffer)."""
        name = self.group_overrides.get(group, {}).get("algo", self.algo.algo)
        if name == self.algo.algo or name in _algo_choices(type(self.algo)):
            return type(self.algo)
        from marl import algorithms

        try:
            other = algorithms.get(name)
        except KeyError as error:
            raise ValueError(f"--group {group}.algo={name}: {error.args[0]}") from None
        run = algorithms.get(self.algo.algo)
        if other.collects != run.collects:
            raise ValueError(
                f"--group {group}.algo={name}: {name} learns from {other.collects} and the run's {self.algo.algo} "
                f"from {run.collects}; the groups of one run all learn on-policy or all off-policy (one replay "
                "buffer): pick algorithms of one kind"
            )
        return algorithms.config_class(name)

    def for_group(self, group: str) -> tuple[AlgorithmConfig, ModelConfig]:
        """The algorithm and model configs of `group`, with its overrides applied. A group on another
        algorithm's config class takes the run's values of the fields both classes have (lr, gamma, ...), but
        not those its class leaves out (`AlgorithmConfig.not_shared`)."""
        overrides = self.group_overrides.get(group, {})
        cls = self.group_algorithm(group)
        shared = {k: v for k, v in as_dict(self.algo).items() if k in field_names(cls)}
        if cls is not type(self.algo):
            shared = {k: v for k, v in shared.items() if k not in cls.not_shared}
        algo = {k: v for k, v in overrides.items() if k in field_names(cls)}
        model = {k: v for k, v in overrides.items() if k in field_names(ModelConfig)}
        return (
            _options.build(cls, {**shared, **algo}, f"group {group!r}"),
            _options.build(ModelConfig, {**as_dict(self.model), **model}, f"group {group!r}"),
        )

    def to_dict(self) -> dict[str, Any]:
        """The config in plain Python values, as a checkpoint holds it (`from_dict` reads it back)."""
        return _plain(dataclasses.asdict(self))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainConfig:
        """The config `to_dict` gave, as a checkpoint holds it. One of another layout (of another vecmarl
        version) raises a ValueError naming what does not fit, not a bare KeyError or every valid option."""
        from marl import algorithms

        _check_saved(data)
        env = {**data["env"], "imports": tuple(data["env"].get("imports", ()))}
        # An explicit group map (a dict, given in Python) is not the `str` the command line takes: the
        # settings are built without it and it is put back as saved (GroupedEnv checks it).
        group_map = env.pop("group_map", "by_type")
        _check_saved_fields("env", env, EnvSettings)
        env_settings = dataclasses.replace(_options.build(EnvSettings, env, "env"), group_map=group_map)
        import_modules(env_settings.imports)  # the algorithm may be registered by one of them
        name = data["algo"]["algo"]
        if name not in algorithms.names():  # else "pass --imports", which marl eval and --resume do not take
            saved = ", ".join(env_settings.imports) or "none"
            raise ValueError(
                f"the checkpoint's run trained --algo {name}, which no module imported here registers (the run's "
                f"--imports: {saved}): in Python, import the module that registers it before loading the "
                f"checkpoint; a run trained from Python saves it with EnvSettings(imports=('my_module',)), which "
                "marl eval and marl train --resume then import"
            )
        algo_class, overrides = algorithms.config_class(name), data.get("group_overrides", {})
        model = {**data["model"], **({"hidden": tuple(data["model"]["hidden"])} if "hidden" in data["model"] else {})}
        gru = "gru" in (model.get("model"), *(o.get("model") for o in overrides.values()))
        algo = algo_class.saved(dict(data["algo"]), name, gru)
        std = {  # whether each group's policy has a std (an unknown algorithm is refused below)
            g: algorithms.config_class(o.get("algo", name)).policy_std
            for g, o in overrides.items()
            if o.get("algo", name) in algorithms.names()
        }
        model = ModelConfig.saved(model, gru, algo_class.policy_std or any(std.values()))
        overrides = {
            g: ModelConfig.saved(o, o.get("model", model.get("model")) == "gru", std.get(g, True))
            for g, o in overrides.items()
        }
        run = RunConfig.saved(dict(data["run"]), algorithms.get(name).collects == "transitions")
        # A swept option's run-wide value, which an earlier version took beside --sweep and trained without.
        swept = {item.partition("=")[0] for item in run.get("sweep", ())}
        algo = {k: v for k, v in algo.items() if k not in swept or k == "algo"}
        for section, values, known in (
            ("algo", algo, algo_class),
            ("model", model, ModelConfig),
            ("run", run, RunConfig),
        ):
            _check_saved_fields(section, values, known)
        overrides = {
            group: algorithms.config_class(o.get("algo", name)).saved(dict(o), o.get("algo", name), gru)
            if o.get("algo", name) in algorithms.names()
            else o  # an unknown algorithm: the config's check names it
            for group, o in overrides.items()
        }
        known = {g: o.get("algo", name) for g, o in overrides.items() if o.get("algo", name) in algorithms.names()}
        algo, overrides = algo_class.saved_with_groups(
            algo, overrides, {g: algorithms.config_class(n) for g, n in known.items()}
        )
        # An earlier version also accepted --schedule-frames where nothing anneals (and pinned it on every
        # resume): the run is built without it, and it is put back where something anneals over it.
        schedule = {k: v for k, v in run.items() if k == "schedule_frames"}
        config = cls(
            env=env_settings,
            algo=_options.build(algo_class, algo, "algo config"),
            model=_options.build(ModelConfig, model, "model"),
            run=_options.build(RunConfig, {k: v for k, v in run.items() if k not in schedule}, "run config"),
            group_overrides=overrides,
        )
        if not schedule or not config.annealed():
            return config
        return dataclasses.replace(config, run=_options.build(RunConfig, run, "run config"))


def _check_saved(data: Any) -> None:
    """Refuse a saved config without the sections `TrainConfig.from_dict` reads, or the env's or the
    algorithm's name (a field missing elsewhere takes its default, as one added since the run was saved)."""
    for section, name in (("env", "env"), ("algo", "algo"), ("model", None), ("run", None)):
        values = data.get(section) if isinstance(data, dict) else None
        if not isinstance(values, dict):
            raise ValueError(f"the checkpoint's config has no {section!r} section: {_OTHER_VERSION}")
        if name is not None and name not in values:
            raise ValueError(f"the checkpoint's config has no {name!r} in its {section!r} section: {_OTHER_VERSION}")


def _check_saved_fields(section: str, values: dict[str, Any], cls: type) -> None:
    unknown = sorted(set(values) - field_names(cls))
    if unknown:
        raise ValueError(
            f"the checkpoint's {section} options {unknown} are not options of this vecmarl's {cls.__name__}: "
            + _OTHER_VERSION
        )


_OTHER_VERSION = "it was written by another version of vecmarl; use that version with it"


def import_modules(modules: tuple[str, ...]) -> None:
    """Import the `--imports` modules (which register envs or algorithms). A bare "No module named
    'my_envs'" would not say why it is wanted, nor what to do when `marl train --resume` or `marl eval`
    runs from another folder than the run was started in. Both errors, and a `RegistrationError`, name
    the module; any other error in it is the module's own, and keeps its traceback (`ModuleFailed`)."""
    import importlib

    for module in modules:
        if module.endswith(".py") or "/" in module or "\\" in module or module.startswith("."):
            # A file's path: "no module 'my_algos.py' is found here" (while it is), or a relative import's TypeError.
            name = module.removeprefix("./").removesuffix(".py").replace("/", ".").replace("\\", ".")
            raise ImportError(
                f"--imports {module}: --imports takes module names, as Python's import does, not files: pass "
                f"--imports {name} (from the folder that holds {name.split('.')[0]}, or with it on PYTHONPATH)"
            )
        try:
            importlib.import_module(module)
        except ImportError as error:
            if error.name is not None and f"{module}.".startswith(f"{error.name}."):  # the module (or its package)
                raise ImportError(
                    f"--imports {module}: no module {module!r} is found here: run marl from the folder that holds "
                    "it, or add that folder to PYTHONPATH"
                ) from error
            raise ImportError(f"--imports {module}: importing {module!r} failed: {error}") from error
        except RegistrationError as error:  # its message says what to change; name the module that has it
            raise RegistrationError(f"--imports {module}: {error}") from error
        except Exception as error:  # a bug in the module: not a usage error, which would print one line only
            raise ModuleFailed(f"--imports {module}: importing {module!r} raised the error above") from error


class ModuleFailed(RuntimeError):
    """An `--imports` module (given, or saved in a run's config) raised while being imported. Its own
    error is the cause, with its traceback: a RuntimeError, so that the command line's usage-error handler,
    which turns a ValueError into one line, leaves it whole."""


def group_fields(cls: type[AlgorithmConfig]) -> set[str]:
    """The fields `--group NAME.FIELD=VALUE` may override for a group on the algorithm config `cls`."""
    return (field_names(cls) - set(cls.run_wide)) | field_names(ModelConfig)


def _algo_choices(cls: type[AlgorithmConfig]) -> tuple:
    """The algorithm names a config class serves (its `algo` field's Literal choices)."""
    return typing.get_args(_options.field_types(cls)["algo"])


def _check_choices(config) -> None:
    """Every `Literal` field of `config` holds one of its choices (configs built in Python; options
    given by name are checked by `envs.options.build` before this)."""
    for name, tp in _options.field_types(type(config)).items():
        if typing.get_origin(tp) is Literal and not _options.matches_type(getattr(config, name), tp):
            raise ValueError(f"{name} must be one of {list(typing.get_args(tp))}, got {getattr(config, name)!r}")


def field_names(cls) -> set[str]:
    """The names of a dataclass's fields."""
    return {f.name for f in dataclasses.fields(cls)}


def changed_flags(config, names: tuple[str, ...]) -> list[str]:
    """`--name value` for each field of `names` that `config` holds at another value than its default."""
    cls = type(config)
    return [
        f"--{n.replace('_', '-')} {getattr(config, n)}" for n in names if getattr(config, n) != _field_default(cls, n)
    ]


def _group_flags(group: str, overrides: Mapping[str, Any], names: tuple[str, ...]) -> list[str]:
    """`--group GROUP.NAME=VALUE` for each field of `names` that a group's `overrides` set."""
    return [f"--group {group}.{name}={overrides[name]}" for name in names if name in overrides]


def options_without_effect(flags: list[str], applies: str, switch: str | None, context: str = "") -> ValueError:
    """The error for options given without the `switch` that makes them do anything (None: where none would),
    in one form: "FLAGS: [CONTEXT]it applies (they apply) to APPLIES: [pass SWITCH too, or ]leave it (them) out"."""
    one = len(flags) == 1
    remedy = f"pass {switch} too, or leave" if switch else "leave"
    return ValueError(
        f"{', '.join(flags)}: {context}{'it applies' if one else 'they apply'} to {applies}: {remedy} "
        f"{'it' if one else 'them'} out"
    )


def _field_default(cls, name: str) -> Any:
    """The default of the dataclass `cls`'s field `name`."""
    return _options.field_default(next(f for f in dataclasses.fields(cls) if f.name == name))


def _plain(value: Any) -> Any:
    """`value` with every number or string of a subclass (numpy's float64 and str_, which pass as float and
    str given in Python) as its plain type: saved as such, a checkpoint's config did not load back ("it holds
    Python objects other than tensors and plain containers"), after the whole run had trained."""
    if isinstance(value, dict):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_plain(v) for v in value)
    if type(value) in (bool, int, float, str):
        return value
    for plain in (int, float, str):
        if isinstance(value, plain):
            return plain(value)
    return value


def as_dict(config) -> dict[str, Any]:
    """A dataclass's fields by name (not copied, unlike `dataclasses.asdict`)."""
    return {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}


# The sections of a TrainConfig other than the algorithm's, whose class depends on `--algo`.
SECTIONS = {"env": EnvSettings, "model": ModelConfig, "run": RunConfig}

"""The algorithm interface, and the registry that maps `--algo` names to algorithms.

An algorithm is one module: a config dataclass and a class registered under one or more names.

    @marl.algorithms.register("reinforce")
    class Reinforce(marl.algorithms.Algorithm):
        Config = ReinforceConfig  # a frozen dataclass subclassing marl.config.AlgorithmConfig
        ...

The run loop (`marl.app.trainer`) knows no algorithm. It builds one with `(config, env, device, world,
generator)`, and each iteration calls `begin_iteration`, collects a time-major `[T, B]` batch with the
algorithm's `acting` policies (`marl.core.rollout`), hands it to `update`, reads the returned loss terms
back in its one host sync, and checkpoints `state_dict()`. A user registers an algorithm of their own in
a module passed with `--imports`, as they register an env.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, ClassVar, Literal

import torch
from tensordict import TensorDict

from envs.options import field_types, type_name
from envs.registry import RegistrationError
from marl.config import AlgorithmConfig, EnvSettings, ModelConfig, RunConfig

if TYPE_CHECKING:
    from marl.config import TrainConfig
    from marl.core.replay import Prioritized, ReplayBuffer
    from marl.core.rollout import Acting
    from marl.core.timing import PhaseTimer


class Algorithm:
    """How every group of an env learns. Subclass it, set `Config`, register it, and write the methods
    that raise NotImplementedError below.

    Attributes set here for the subclass: `config` (the `TrainConfig`; `config.for_group(g)` gives a
    group's algorithm and model configs with its overrides), `env` (the grouped env: `env.groups` maps
    each group to its spec), `device`, `world` (`marl.app.distributed`: under torchrun, `world.sum` and
    the update step's gradient averaging; a no-op in one process) and `generator` (the run's random
    stream on `device`, which collection draws its noise from too).
    """

    Config: ClassVar[type[AlgorithmConfig]]
    configs: ClassVar[dict[str, type[AlgorithmConfig]]] = {}
    """Optional: names this class serves whose config is a subclass of `Config` with other defaults (the
    Q-learning module's QMIX, whose replay schedule differs from IQL's and VDN's); the others take `Config`."""
    collects: ClassVar[Literal["rollout", "transitions"]] = "rollout"
    """What `update` learns from: "rollout", the iteration's `[T, B]` batch (on-policy); or "transitions",
    a replay buffer (`marl.core.replay.ReplayBuffer`, sized by `replay()`) that the run loop extends with
    every batch before it calls `update(buffer, timer)`, and saves in checkpoints with `--save-buffer`."""
    collect_ahead: Callable[[], None] | None = None
    """Optional, set by the run loop before each `update`: calling it collects the next iteration's batch
    now, with the acting policies as they are then, and the next iteration learns from that batch instead
    of collecting one; None when no iteration follows. An update that has finished with its policies may
    collect beside the rest of its work (PPO's `overlap_critic`: the critics' steps on a second thread)."""

    def __init__(self, config: TrainConfig, env, device: torch.device, world, generator: torch.Generator) -> None:
        self.config, self.env, self.device, self.world, self.generator = config, env, device, world, generator

    @property
    def acting(self) -> Acting:
        """The policies collection acts with (`marl.core.rollout.Acting`); `marl eval` takes their modes."""
        raise NotImplementedError

    @property
    def overlaps(self) -> bool:
        """Whether `update` calls `collect_ahead` beside work on a second thread: the run loop then collects
        every batch on one of torch's intra-op threads (`marl.optim.background.one_thread`), as the
        batches collected ahead are, so that all of them are collected alike."""
        return False

    def replay(self) -> tuple[int, Prioritized | None]:
        """With `collects = "transitions"`: the replay buffer's capacity in env steps, and its prioritized
        sampling settings (`marl.core.replay.Prioritized`) or None for uniform draws."""
        raise NotImplementedError(f"{type(self).__qualname__} collects transitions: define replay()")

    def begin_iteration(self, frames: int, total_frames: int) -> None:
        """Called before each iteration's collection with the frames trained so far and the frames the
        schedules span (`RunConfig.schedule_span`): schedules (a learning rate annealed over the run,
        exploration noise) are set here."""

    def schedules(self, frames: int, total_frames: int) -> dict[str, float]:
        """The values of the schedules `begin_iteration(frames, total_frames)` sets, by name (`GROUP epsilon`,
        `beta`): `marl train --resume` says what a new length does to them. None by default."""
        return {}

    def update(self, batch: TensorDict | ReplayBuffer, timer: PhaseTimer) -> dict[str, dict[str, torch.Tensor]]:
        """Learn from the iteration's `batch` (`marl.core.rollout`'s layout), or from the replay buffer
        that holds it too (`collects = "transitions"`); returns per group its named
        loss terms and diagnostics as 0-d tensors on the device. The run loop reads them in its one host
        sync, logs them as `GROUP/NAME`, and stops the run when a term whose name ends in `loss` is NaN or
        inf. `timer.mark(name)` ends a phase of the iteration's time split (e.g. `"update_s"`)."""
        raise NotImplementedError

    def parameters(self) -> list[torch.Tensor]:
        """Every learned tensor, in a fixed order: under torchrun rank 0's are broadcast at the start."""
        raise NotImplementedError

    def state_dict(self) -> dict:
        """Everything `load_state_dict` needs to continue exactly: networks, optimisers, normalisers."""
        raise NotImplementedError

    def load_state_dict(self, state: dict) -> None:
        raise NotImplementedError

    def env_state_dict(self) -> dict:
        """What the algorithm carries per env of this process from one iteration to the next (a recurrent
        critic's state): saved per rank under torchrun, as the envs are, and not loaded by `marl eval`."""
        return {}

    def load_env_state_dict(self, state: dict) -> None:
        """Restore `env_state_dict()` (the same envs: same count, same rank)."""

    @classmethod
    def label(cls, config: TrainConfig, groups: Mapping) -> str:
        """The name `marl train` prints for what trains `groups` under `config`: each group's algorithm
        (`--group NAME.algo=...` may name another, e.g. isac in a masac run), per group where they differ."""
        names = {g: config.for_group(g)[0].algo.upper() for g in groups}
        if len(set(names.values())) == 1:
            return next(iter(names.values()))
        return ", ".join(f"{name} ({g})" for g, name in names.items())


_ALGORITHMS: dict[str, type[Algorithm]] = {}
DEFAULT = "mappo"
RESERVED = {f.name for section in (EnvSettings, ModelConfig, RunConfig) for f in dataclasses.fields(section)}


def register(*names: str):
    """Class decorator: make an `Algorithm` subclass available as `--algo NAME` for each of `names` (one
    module may serve several, as PPO serves mappo and ippo: its config's `algo` field tells them apart)."""
    if not names or not all(isinstance(name, str) and name for name in names):
        raise RegistrationError(f"register takes the algorithm's name(s): write @register('my_algo'), got {names!r}")

    def decorate(cls: type[Algorithm]) -> type[Algorithm]:
        _check_algorithm_class(names, cls)
        for name in names:
            known = _ALGORITHMS.get(name)
            if known is not None and known is not cls and not _redefined(known, cls):
                raise RegistrationError(f"an algorithm named {name!r} is already registered ({known.__qualname__})")
        for name in names:
            _ALGORITHMS[name] = cls
        return cls

    return decorate


def _check_algorithm_class(names: tuple[str, ...], cls) -> None:
    """Refuse at registration what would otherwise fail later and far away."""
    if not (isinstance(cls, type) and issubclass(cls, Algorithm)):
        raise RegistrationError(
            f"register{names}: {getattr(cls, '__qualname__', cls)} must subclass marl.algorithms.Algorithm"
        )
    config = getattr(cls, "Config", None)
    if not (isinstance(config, type) and issubclass(config, AlgorithmConfig) and config is not AlgorithmConfig):
        raise RegistrationError(
            f"register{names}: {cls.__qualname__}.Config must be a frozen dataclass subclassing "
            f"marl.config.AlgorithmConfig, got {getattr(config, '__qualname__', config)}"
        )
    for name, own in cls.configs.items():
        if name not in names or not (isinstance(own, type) and issubclass(own, config)):
            raise RegistrationError(
                f"register{names}: {cls.__qualname__}.configs[{name!r}] must be a subclass of {config.__qualname__} "
                "for one of the names registered"
            )
    for name in names:
        _check_config(names, cls.configs.get(name, config), name)
    if cls.collects not in ("rollout", "transitions"):
        raise RegistrationError(
            f"register{names}: {cls.__qualname__}.collects must be 'rollout' or 'transitions', got {cls.collects!r}"
        )
    _check_methods(f"register{names}", cls, (), "marl.algorithms.Algorithm")


def _check_methods(where: str, cls: type[Algorithm], extra: tuple[str, ...], see: str) -> None:
    """Refuse a class that leaves to `Algorithm` (or lacks) a method the run loop calls, or one of `extra`.
    The base's versions raise NotImplementedError: without state_dict a run would fail at its first
    checkpoint, after training up to it."""
    required = ("acting", "update", "parameters", "state_dict", "load_state_dict", *extra)
    required += ("replay",) if cls.collects == "transitions" else ()
    missing = sorted(name for name in required if getattr(cls, name, None) is getattr(Algorithm, name, None))
    if missing:
        raise RegistrationError(
            f"{where}: {cls.__qualname__} does not define {', '.join(missing)}: the run loop calls "
            f"{', '.join(required)} (see {see})"
        )


def _check_config(names: tuple[str, ...], config: type[AlgorithmConfig], name: str) -> None:
    """Refuse a config class that cannot serve `--algo name`."""
    if "__dataclass_fields__" not in vars(config):
        raise RegistrationError(
            f"register{names}: decorate {config.__qualname__} with @dataclasses.dataclass(frozen=True)"
        )
    clash = sorted({f.name for f in dataclasses.fields(config)} & RESERVED)
    if clash:
        raise RegistrationError(
            f"register{names}: {config.__qualname__} has field(s) {clash}, which are already options of the "
            "env, model or run sections: rename them"
        )
    for field, tp in field_types(config).items():
        if field != "algo":
            _check_option_type(names, config, field, tp)
    try:
        config(algo=name)
    except (TypeError, ValueError) as error:
        raise RegistrationError(f"register{names}: {config.__qualname__}(algo={name!r}) fails: {error}") from error


def _check_option_type(names: tuple[str, ...], config: type[AlgorithmConfig], field: str, tp) -> None:
    """Refuse a field `marl train` cannot take as `--FIELD`: a type it does not parse, or another type than
    another algorithm's field of that name (the command line has one `--FIELD`, parsed as the first one's)."""
    item = typing.get_args(tp)[0] if typing.get_origin(tp) is tuple and typing.get_args(tp) else None
    plain = tp in (bool, int, float, str) or typing.get_origin(tp) is typing.Literal
    if not (plain or (item in (int, float, str) and typing.get_args(tp)[1:] == (Ellipsis,))):
        raise RegistrationError(
            f"register{names}: {config.__qualname__} has field {field}: {type_name(tp)}, which marl train cannot "
            "take as an option: the command line takes bool, int, float, str, a Literal or tuple[int/float/str, ...]"
        )
    for other_name in _names_of_other_configs(names):
        other = config_class(other_name)
        theirs = field_types(other).get(field)
        if theirs is not None and theirs != tp:
            served = " / ".join(n for n in sorted(_ALGORITHMS) if config_class(n) is other)
            raise RegistrationError(
                f"register{names}: {config.__qualname__} has field {field}: {type_name(tp)}, but "
                f"--{field.replace('_', '-')} is also an option of {served} ({other.__qualname__}), of type "
                f"{type_name(theirs)}: rename the field or give it that type"
            )


def _names_of_other_configs(names: tuple[str, ...]) -> list[str]:
    """One registered name per config class, leaving out `names` (being registered, perhaps again)."""
    firsts: dict[type, str] = {}
    for name in sorted(set(_ALGORITHMS) - set(names)):
        firsts.setdefault(config_class(name), name)
    return list(firsts.values())


def _redefined(registered: type, cls: type) -> bool:
    """Whether `cls` is a new definition of `registered` in the same module (a notebook cell run again,
    `importlib.reload`): the new code replaces the old."""
    return cls.__module__ == registered.__module__ and cls.__qualname__ == registered.__qualname__


_SEEDED: dict[str, type[Algorithm]] = {}


def register_seeded(*names: str):
    """Class decorator: the algorithm that trains several seeds of `--algo NAME` in one process
    (`marl train --seeds`). It is built with `(config, env, device, world, generators, seeds)`: the env
    holds every member's envs in one `[S * B]` batch (`marl.core.members`), `generators[k]` is member `k`'s
    random stream, `sweep` (`--sweep`) maps options to each member's value; `update` returns each term per
    member (`[S]`), and `member_state_dict(k)` is member
    `k`'s state as the single-seed algorithm's `state_dict()`. A worked example, a user's REINFORCE:
    `tests/marl/algorithms/reinforce_seeds.py` (the README's "Your algorithm as a population"). Each name
    must already be registered (`register`) as the single run its members train as: its module is imported
    before the population's."""
    if not names or not all(isinstance(name, str) and name for name in names):
        raise RegistrationError(
            f"register_seeded takes the algorithm's name(s): write @register_seeded('my_algo'), got {names!r}"
        )

    def decorate(cls: type[Algorithm]) -> type[Algorithm]:
        where = f"register_seeded{names}"
        if not (isinstance(cls, type) and issubclass(cls, Algorithm)):
            raise RegistrationError(
                f"{where}: {getattr(cls, '__qualname__', cls)} must subclass marl.algorithms.Algorithm "
                "(a population subclasses marl.algorithms.seeded.Seeded)"
            )
        unknown = [name for name in names if name not in _ALGORITHMS]
        if unknown:
            raise RegistrationError(
                f"{where}: {cls.__qualname__} is the population of {', '.join(map(repr, unknown))}, which no "
                "@register(...) has registered: register the single-run algorithm under that name first (import "
                "its module before this one)"
            )
        for name in names:
            known = _SEEDED.get(name)
            if known is not None and known is not cls and not _redefined(known, cls):
                raise RegistrationError(
                    f"{where}: {cls.__qualname__}: a population of {name!r} is already registered ({known.__qualname__})"
                )
        # member_state_dict(k) writes each member's checkpoint, after its first iteration has trained.
        _check_methods(where, cls, ("member_state_dict",), "marl.algorithms.register_seeded")
        for name in names:
            _SEEDED[name] = cls
        return cls

    return decorate


def check_seeded(name: str, recurrent: bool = False) -> None:
    """Refuse several seeds for an algorithm that cannot train them in one process (`recurrent`: with
    `--model gru`, which only a population whose class sets `recurrent` trains)."""
    get(name)
    if name not in _SEEDED:
        supported = ", ".join(sorted(_SEEDED))
        raise ValueError(
            f"several seeds in one process (--seeds, --num-seeds) train {supported} so far, not "
            f"--algo {name}: run its seeds one after another (marl train --algo {name} --seed N for each)"
        )
    if recurrent and not _SEEDED[name].recurrent:
        raise ValueError(
            f"several seeds (--seeds, --num-seeds) of --algo {name} train MLP networks so far: leave out --model gru"
        )


def build_seeded(config: TrainConfig, env, device: torch.device, world, generators, seeds, sweep=None) -> Algorithm:
    """The algorithm that trains `seeds` of `config.algo` in one process (`register_seeded`); `sweep` maps
    swept options to each member's value (`--sweep`). When groups take algorithms of other modules (`--group
    NAME.algo=...`), a population of the mixed runs `build` makes (`marl.algorithms.offpolicy_seeds.SeededMixed`)."""
    # Every group's algorithm (a mixed run's groups take several), recurrent where the group's nets are.
    taken = (config.for_group(g) for g in env.groups)
    for name, recurrent in dict.fromkeys((algo.algo, model.model == "gru") for algo, model in taken):
        check_seeded(name, recurrent)
    if len(set(group_classes(config, env.groups).values())) == 1:
        return _SEEDED[config.algo.algo](config, env, device, world, generators, seeds, sweep)
    from marl.algorithms.offpolicy_seeds import SeededMixed

    return SeededMixed(config, env, device, world, generators, seeds, sweep)


def names() -> list[str]:
    """The registered algorithm names."""
    return sorted(_ALGORITHMS)


def get(name: str) -> type[Algorithm]:
    if name not in _ALGORITHMS:
        raise KeyError(
            f"unknown algorithm {name!r}; known algorithms: {', '.join(names())} (register your own with "
            "@marl.algorithms.register in a module passed with --imports)"
        )
    return _ALGORITHMS[name]


def config_class(name: str) -> type[AlgorithmConfig]:
    """Algorithm `name`'s config class: its class's `Config`, or the subclass `configs` gives for the name."""
    cls = get(name)
    return cls.configs.get(name, cls.Config)


def default_config(name: str) -> AlgorithmConfig:
    """Algorithm `name`'s config with its defaults."""
    return config_class(name)(algo=name)


def build(config: TrainConfig, env, device: torch.device, world, generator: torch.Generator) -> Algorithm:
    """The algorithm `config.algo` names, built for `env`; when groups take algorithms of other modules
    (`--group NAME.algo=...`), the off-policy ones together (`marl.algorithms.mixed`)."""
    classes = group_classes(config, env.groups)
    if len(set(classes.values())) == 1:
        return get(config.algo.algo)(config, env, device, world, generator)
    from marl.algorithms.mixed import Mixed

    return Mixed(config, env, device, world, generator, classes)


def group_classes(config: TrainConfig, groups) -> dict[str, type[Algorithm]]:
    """Each group's algorithm class; several only among the off-policy algorithms, which share one buffer
    and one optimiser step."""
    from marl.algorithms.offpolicy import OffPolicy

    classes = {g: get(config.for_group(g)[0].algo) for g in groups}
    if len(set(classes.values())) > 1:
        for g, cls in classes.items():
            if not issubclass(cls, OffPolicy):
                raise ValueError(
                    f"group {g!r} takes {config.for_group(g)[0].algo} ({cls.__qualname__}), but the groups of one run "
                    "may take algorithms of different modules only among the off-policy ones (maddpg, iddpg, masac, "
                    "isac, iql, vdn, qmix)"
                )
    return classes


def label(config: TrainConfig, groups: Mapping) -> str:
    """What trains `groups` under `config`, as `marl train` prints it."""
    classes = group_classes(config, groups)
    if len(set(classes.values())) == 1:
        return get(config.algo.algo).label(config, groups)
    from marl.algorithms.mixed import Mixed

    return Mixed.label(config, groups)

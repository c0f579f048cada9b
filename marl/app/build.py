"""What training, evaluation and the benchmarks build alike: the device, the grouped env, the algorithm."""

from __future__ import annotations

import math

import torch

import envs
from envs.specs import Box
from marl import algorithms
from marl.config import MODEL_STD_OPTIONS, TrainConfig, changed_flags, import_modules, options_without_effect
from marl.core.groups import GroupedEnv
from marl.core.rollout import check_acting


def resolve_device(device: str) -> torch.device:
    """`--device` as a torch device (`auto`: CUDA where available). The index stays as given: under
    torchrun a bare `cuda` lets each rank take its own (`marl.app.distributed.setup`)."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(device)
    except RuntimeError as error:  # torch's own message lists every backend it knows, not what marl runs on
        raise ValueError(f"unknown device {device!r}; expected cpu, cuda, cuda:N or auto") from error
    if device.type not in ("cpu", "cuda"):  # e.g. meta: it holds no data, so training fails deep inside torch
        raise ValueError(f"unknown device {str(device)!r}; expected cpu, cuda, cuda:N or auto")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device} was asked for, but CUDA is not available; use --device cpu or auto")
    return device


def make_env(
    config: TrainConfig,
    device: torch.device,
    num_envs: int | None = None,
    seed: int | None = None,
    *,
    render: bool = False,
):
    """The configured env, regrouped by the configured group map; `render`: made to draw frames (`envs.make`'s)."""
    settings = config.env
    import_modules(settings.imports)
    env = envs.make(
        settings.env,
        num_envs=num_envs or settings.num_envs,
        device=device,
        seed=config.run.seed if seed is None else seed,
        render=render,
        **settings.env_options,
    )
    check_float32(env)
    check_flat_actions(env)
    return GroupedEnv(env, settings.group_map, pad=settings.pad)


def check_float32(env) -> None:
    """The networks, buffers and action distributions are float32: a Box of another dtype (which an env
    may declare, and `check_env` accepts) would fail inside torch on the first update."""
    boxes = [("the state", env.state_spec, "return .float() from _state")] if env.state_spec is not None else []
    for group, spec in env.groups.items():
        boxes += [
            (f"group {group!r}'s observation", spec.observation, "return .float() from _observe"),
            (f"group {group!r}'s action", spec.action, "convert the action in _step"),
        ]
    for what, spec, fix in boxes:
        if isinstance(spec, Box) and spec.dtype != torch.float32:
            raise ValueError(
                f"{env.name}: {what} is a {spec.dtype} Box, but marl trains in float32: declare it "
                f"float32 (Box's default) and, where the env computes in another dtype, {fix}"
            )


def check_flat_actions(env) -> None:
    """The policies output one number per action dim and the buffers store `[*batch, n, A]`: a Box action of
    another rank (which `check_env` accepts) failed at the first step as a policy returning the wrong shape."""
    for group, spec in env.groups.items():
        shape = spec.action.shape
        if isinstance(spec.action, Box) and len(shape) != 1:
            raise ValueError(
                f"{env.name}: group {group!r}'s action is a Box of shape {shape}, but marl's policies act in 1-d "
                f"Box actions: declare it with shape ({math.prod(shape)},) and reshape the action in _step (for a "
                "wrapped env, flatten its action space in a wrapper)"
            )


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


def check_std_used(config: TrainConfig, groups) -> None:
    """A new run's `--std` and `--log-std-init` only where a group has continuous (Box) actions: discrete ones
    have no std (a group's own are checked by `check_group_overrides`). Not on loading: a checkpoint of an earlier
    version that holds them resumes and evaluates as trained."""
    given = changed_flags(config.model, MODEL_STD_OPTIONS)
    if given and not any(isinstance(spec.action, Box) for spec in groups.values()):
        discrete = f"{config.env.env}'s groups ({', '.join(groups)}) have discrete actions, which have no std; "
        raise options_without_effect(given, "continuous (Box) actions only", None, discrete)


def check_share_params_used(config: TrainConfig, groups) -> None:
    """A new run's `share_params` only where a group has several agents to share a network: a group's own on a
    group of one is refused, and the run's `--no-share-params` where every group has one agent (as `--std` where
    every group is discrete). Not on loading: a checkpoint of an earlier version that holds one resumes and
    evaluates as trained."""
    applies = "groups of several agents"
    for group, overrides in config.group_overrides.items():
        if "share_params" in overrides and groups[group].n_agents == 1:
            flag = f"--group {group}.share_params={overrides['share_params']}"
            raise options_without_effect(
                [flag], applies, None, f"group {group!r} has one agent, with nothing to share: "
            )
    if not config.model.share_params and all(spec.n_agents == 1 for spec in groups.values()):
        alone = f"{config.env.env}'s groups ({', '.join(groups)}) have one agent each, with nothing to share: "
        raise options_without_effect(["--no-share-params"], applies, None, alone)


def build_algorithm(config: TrainConfig, env, device: torch.device, world, generator: torch.Generator):
    """`config.algo`'s algorithm for `env`, its overrides checked against the env's groups."""
    check_group_overrides(config, env.groups)
    algorithm = algorithms.build(config, env, device, world, generator)
    check_acting(algorithm.acting, env.groups, f"{type(algorithm).__qualname__}.acting")
    return algorithm

"""The env registry: `make(name, num_envs=..., device=..., seed=..., **options)` and `names()`.

Native envs register their class by name. Adapters register a prefix (`"vmas/"`, `"pettingzoo/"`)
with a factory that receives the rest of the name.

`make(..., render=True)` builds an env that draws frames (`render()`), for a recording such as `marl eval
--render`. Native and VMAS envs draw as they are made, so it changes nothing for them; an adapter whose envs
must be asked when made registers `render_options` (PettingZoo's: `render_mode="rgb_array"`). Rendering
changes nothing of an env's dynamics: the episodes are those of the env made without it.
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable
from typing import Any

import torch

from envs import options as _options
from envs.base import EnvConfig, MultiAgentEnv


class RegistrationError(TypeError, ValueError):
    """`register` (here or `marl.algorithms.register`) refused a name or a class; the message says what to
    change. A type of its own so that `marl --imports MODULE` can report it in one line, where any other
    error in a user's module keeps its traceback; a TypeError and a ValueError, as the refusals were before."""


_ENVS: dict[str, type[MultiAgentEnv]] = {}
_PREFIXES: dict[str, tuple[Callable[..., MultiAgentEnv], str, Callable[[str, dict], dict] | None]] = {}


def register(name: str) -> Callable[[type[MultiAgentEnv]], type[MultiAgentEnv]]:
    """Class decorator: make a `MultiAgentEnv` subclass available as `make(name, ...)`."""
    if not isinstance(name, str):  # `@register` without the name: it would bind the class's name to `decorate`
        raise RegistrationError(f"register takes the env's name: write @envs.register('my_env'), got {name!r}")

    def decorate(cls: type[MultiAgentEnv]) -> type[MultiAgentEnv]:
        _check_env_class(name, cls)
        if name in _ENVS and _rerun_as_main(_ENVS[name], cls):
            cls.name = name  # `python -m envs.<module>`: the package import registered the class already
            return cls
        if name in _ENVS and _ENVS[name] is not cls and not _redefined(_ENVS[name], cls):
            raise RegistrationError(f"an env named {name!r} is already registered ({_ENVS[name].__qualname__})")
        if "/" in name:
            raise RegistrationError(f"env names may not contain '/': {name!r} (it separates adapter prefixes)")
        if not name or any(c.isspace() for c in name):  # typed as `--env NAME`, and the start of run folder names
            raise RegistrationError(f"env names are a word without spaces, e.g. 'my_env', got {name!r}")
        cls.name = name
        _ENVS[name] = cls
        return cls

    return decorate


def _check_env_class(name: str, cls: type) -> None:
    """Refuse at registration what would otherwise fail later and far away: a class that is not an env,
    a `Config` that is not an `EnvConfig` dataclass (its fields would not be options)."""
    if not (isinstance(cls, type) and issubclass(cls, MultiAgentEnv)):
        raise RegistrationError(
            f"register({name!r}): {getattr(cls, '__qualname__', cls)} must subclass envs.MultiAgentEnv"
        )
    config = cls.Config
    if not (isinstance(config, type) and issubclass(config, EnvConfig)):
        raise RegistrationError(
            f"register({name!r}): {cls.__qualname__}.Config must be a frozen dataclass subclassing envs.EnvConfig "
            f"(which holds max_steps), got {getattr(config, '__qualname__', config)}"
        )
    own = inspect.get_annotations(config)
    if own and "__dataclass_fields__" not in vars(config):
        raise RegistrationError(
            f"register({name!r}): {config.__qualname__} declares {sorted(own)} but is not a dataclass, so they are "
            "not options: decorate it with @dataclasses.dataclass(frozen=True)"
        )


def _rerun_as_main(registered: type, cls: type) -> bool:
    """Whether `cls` is `registered` defined a second time by running its module as `__main__`."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    return (
        cls.__module__ == "__main__"
        and spec is not None
        and spec.name == registered.__module__
        and cls.__qualname__ == registered.__qualname__
    )


def _redefined(registered: type, cls: type) -> bool:
    """Whether `cls` is a new definition of `registered` in the same module: a notebook cell run again
    after an edit, or `importlib.reload`. The new code replaces the old."""
    return cls.__module__ == registered.__module__ and cls.__qualname__ == registered.__qualname__


def register_prefix(
    prefix: str,
    factory: Callable[..., MultiAgentEnv],
    help: str,
    *,
    render_options: Callable[[str, dict], dict] | None = None,
) -> None:
    """Route `make("<prefix>/<rest>", ...)` to
    `factory(rest, num_envs=, device=, seed=, check_values=, compile=, **options)`. `render_options(rest,
    options)`, for envs that draw frames only when asked as they are made: the options that ask (`make(...,
    render=True)`), raising NotImplementedError, with the reason, where the env cannot draw."""
    _PREFIXES[prefix] = (factory, help, render_options)


def names() -> list[str]:
    """Registered native env names, then the adapter patterns (e.g. `vmas/<scenario>`)."""
    return sorted(_ENVS) + [f"{prefix}/<{help}>" for prefix, (_, help, _) in sorted(_PREFIXES.items())]


def env_class(name: str) -> type[MultiAgentEnv]:
    if name not in _ENVS:
        raise KeyError(_unknown(name))
    return _ENVS[name]


def _unknown(name: str) -> str:
    return f"unknown env {name!r}; known envs: {', '.join(names())}"


def make(
    name: str,
    *,
    num_envs: int,
    device: torch.device | str = "cpu",
    seed: int | None = None,
    check_values: bool = False,
    compile: bool = False,
    render: bool = False,
    **options: Any,
) -> MultiAgentEnv:
    """Build env `name` with `num_envs` copies on `device`.

    `options` are the env's own (see `marl envs` or `describe(name)`); an unknown or invalid option
    raises an error that lists the valid ones with their types and defaults. `check_values` and
    `compile` are explained in `MultiAgentEnv.__init__`. `render`: build the env to draw frames, where it
    must be asked as it is made (a PettingZoo env); NotImplementedError, with the reason, where it cannot.
    """
    if not isinstance(name, str):
        raise TypeError(
            f"make takes the env's name as a str, got {type(name).__name__} {name!r}; known envs: {', '.join(names())}"
        )
    if render:
        options = render_options(name, options)
    if "/" in name:
        prefix, rest = name.split("/", 1)
        if prefix not in _PREFIXES:
            raise KeyError(_unknown(name))
        factory, _, _ = _PREFIXES[prefix]
        return factory(
            rest, num_envs=num_envs, device=device, seed=seed, check_values=check_values, compile=compile, **options
        )
    cls = env_class(name)
    config = _options.build(cls.Config, options, what=f"env {name!r}")
    return cls(config, num_envs=num_envs, device=device, seed=seed, check_values=check_values, compile=compile)


def render_options(name: str, options: dict) -> dict:
    """The options with which `make(name, render=True, **options)` builds env `name`: those its adapter's
    `render_options` gives (`register_prefix`), else `options` (an env that draws as it is made, or never).
    NotImplementedError, with the reason, where the adapter says the env cannot draw."""
    prefix, slash, rest = name.partition("/")
    asks = _PREFIXES[prefix][2] if slash and prefix in _PREFIXES else None
    return asks(rest, dict(options)) if asks is not None else dict(options)


def describe(name: str) -> str:
    """The options of native env `name`, one per line with type, default and meaning."""
    return _options.describe(env_class(name).Config)

"""Specs: what one agent observes and does, and how to check or sample a batch of it.

A spec describes a single agent; a group of `n` agents shares one spec, so its tensors are shaped
`[*batch, n, *spec.shape]`. Every spec can sample a random batch on a device from a given
`torch.Generator` and convert itself to a gymnasium space.
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass

import torch

Bound = float | tuple[float, ...]


def _count(value, what: str, minimum: int) -> int:
    """`value` as an int >= `minimum`; floats, bools and strings are refused rather than cast (`Discrete(5.5)`
    would otherwise fail inside torch when sampled)."""
    try:
        if isinstance(value, bool):
            raise TypeError
        count = operator.index(value)  # ints, numpy ints and one-element integer tensors
    except TypeError:
        raise TypeError(f"{what} must be an int, got {type(value).__name__} {value!r}") from None
    if count < minimum:
        raise ValueError(f"{what} must be >= {minimum}, got {count}")
    return count


def _sizes(value, what: str, example: str) -> tuple[int, ...]:
    """`value` as a tuple of ints >= 0: a shape or an nvec, given as a sequence (`(4,)`, not `4`)."""
    if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        raise TypeError(f"{what} must be a tuple of ints, e.g. {example}, got {type(value).__name__} {value!r}")
    return tuple(_count(size, f"each size of {what} {value!r}", 0) for size in value)


def _flat(bound: Bound) -> tuple[float, ...]:
    return bound if isinstance(bound, tuple) else (bound,)


@dataclass(frozen=True)
class Box:
    """A float box for one agent's observation or continuous action.

    `low` and `high` are scalars, or flat tuples with one value per element of `shape` (row-major);
    use +-inf for unbounded sides.
    """

    shape: tuple[int, ...]
    low: Bound = float("-inf")
    high: Bound = float("inf")
    dtype: torch.dtype = torch.float32

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", _sizes(self.shape, "Box shape", "Box((4,))"))
        if not isinstance(self.dtype, torch.dtype) or not self.dtype.is_floating_point:  # before the bounds: an
            # integer dtype cannot hold the default infinite ones
            raise ValueError(f"Box dtype must be a float dtype (torch.float32 by default), got {self.dtype!r}")
        numel = math.prod(self.shape)
        for name in ("low", "high"):
            value = getattr(self, name)
            if not isinstance(value, (tuple, list)) and getattr(value, "ndim", 0):  # float() would fail on it
                raise TypeError(
                    f"Box {name} must be a number or a flat tuple of numbers, got {type(value).__name__} "
                    f"(convert an array with .tolist())"
                )
            if isinstance(value, (tuple, list)):
                value = tuple(float(v) for v in value)
                if len(value) != numel:
                    raise ValueError(
                        f"Box {name} has {len(value)} values, expected 1 or {numel} for shape {self.shape}"
                    )
            else:
                value = float(value)
            object.__setattr__(self, name, value)
        low, high = self.bounds("cpu")
        if not bool((low <= high).all()):
            raise ValueError(f"Box low={self.low} must be <= high={self.high}")

    def bounds(self, device: torch.device | str) -> tuple[torch.Tensor, torch.Tensor]:
        """`(low, high)` as tensors shaped `shape` on `device`."""

        def shaped(value: Bound) -> torch.Tensor:
            tensor = torch.tensor(value, dtype=self.dtype, device=device)
            return tensor.reshape(self.shape) if tensor.dim() else tensor.expand(self.shape).clone()

        return shaped(self.low), shaped(self.high)

    @property
    def bounded(self) -> bool:
        values = [*_flat(self.low), *_flat(self.high)]
        return all(math.isfinite(v) for v in values)

    def sample(
        self, batch_shape: tuple[int, ...], device: torch.device | str, generator: torch.Generator
    ) -> torch.Tensor:
        """Uniform in the box, or standard normal clipped to it when a side is unbounded;
        shape `[*batch_shape, *shape]`."""
        shape = (*batch_shape, *self.shape)
        low, high = self.bounds(device)
        if self.bounded:
            u = torch.rand(shape, device=device, generator=generator, dtype=self.dtype)
            return low + (high - low) * u
        return torch.maximum(
            torch.minimum(torch.randn(shape, device=device, generator=generator, dtype=self.dtype), high), low
        )

    def to_gymnasium(self):
        import gymnasium
        import numpy as np

        low, high = (b.numpy().astype(np.float32) for b in self.bounds("cpu"))
        return gymnasium.spaces.Box(low, high, self.shape, dtype=np.float32)


@dataclass(frozen=True)
class Discrete:
    """One choice among `n` per agent (int64, shape `()`), optionally restricted by an action mask.

    With `masked=True` the env publishes `(group, "action_mask")`, a bool `[*batch, n_agents, n]`
    tensor; sampling then draws only allowed actions.
    """

    n: int
    masked: bool = False
    dtype: torch.dtype = torch.int64

    @property
    def shape(self) -> tuple[int, ...]:
        return ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "n", _count(self.n, "Discrete n", 1))
        if not isinstance(self.masked, bool):  # "no" would be truthy
            raise TypeError(f"Discrete masked must be True or False, got {self.masked!r}")

    def sample(
        self,
        batch_shape: tuple[int, ...],
        device: torch.device | str,
        generator: torch.Generator,
        mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Uniform over the allowed actions; shape `batch_shape`. `mask` is bool `[*batch_shape, n]`."""
        if mask is None:
            return torch.randint(self.n, batch_shape, device=device, generator=generator)
        # Gumbel-max over allowed actions keeps the draw batched with no data-dependent shapes.
        u = torch.rand((*batch_shape, self.n), device=device, generator=generator)
        return torch.where(mask, u, -1.0).argmax(-1)

    def to_gymnasium(self):
        import gymnasium

        return gymnasium.spaces.Discrete(self.n)


@dataclass(frozen=True)
class MultiDiscrete:
    """Several independent choices per agent: int64 shape `(len(nvec),)`, choice `i` in `[0, nvec[i])`."""

    nvec: tuple[int, ...]
    dtype: torch.dtype = torch.int64

    def __post_init__(self) -> None:
        object.__setattr__(self, "nvec", _sizes(self.nvec, "MultiDiscrete nvec", "MultiDiscrete((3, 2))"))
        if not self.nvec or min(self.nvec) < 1:
            raise ValueError(f"MultiDiscrete needs a non-empty nvec of values >= 1, got {self.nvec}")

    @property
    def shape(self) -> tuple[int, ...]:
        return (len(self.nvec),)

    def sample(
        self, batch_shape: tuple[int, ...], device: torch.device | str, generator: torch.Generator
    ) -> torch.Tensor:
        nvec = torch.tensor(self.nvec, device=device, dtype=torch.float32)
        u = torch.rand((*batch_shape, len(self.nvec)), device=device, generator=generator)
        return (u * nvec).long().clamp_max(nvec.long() - 1)

    def to_gymnasium(self):
        import gymnasium
        import numpy as np

        return gymnasium.spaces.MultiDiscrete(np.array(self.nvec, dtype=np.int64))


ActionSpec = Box | Discrete | MultiDiscrete


@dataclass(frozen=True)
class GroupSpec:
    """A group of agents sharing one observation spec and one action spec."""

    agents: tuple[str, ...]
    observation: Box
    action: ActionSpec
    agents_leave: bool = False
    """Whether its agents may leave an episode before their env's end (the env writes `_agent_terminated`):
    its reset and step data then hold `active` `[B, n]` bool, False for an agent that left, until its env
    resets. Set by `MultiAgentEnv`, not by the env author."""

    def __post_init__(self) -> None:
        # A str is a sequence too: GroupSpec("agent_0", ...) would be 7 agents named "a", "g", ...
        if isinstance(self.agents, str) or not hasattr(self.agents, "__iter__"):
            raise TypeError(
                f"GroupSpec agents must be a list of agent names, got {type(self.agents).__name__} {self.agents!r}"
            )
        object.__setattr__(self, "agents", tuple(self.agents))
        if not all(isinstance(agent, str) and agent for agent in self.agents):
            raise TypeError(f"agent names must be non-empty strs, got {self.agents}")
        if not isinstance(self.observation, Box):
            raise TypeError(f"GroupSpec observation must be a Box, got {self.observation!r}")
        if not isinstance(self.action, (Box, Discrete, MultiDiscrete)):
            raise TypeError(f"GroupSpec action must be a Box, Discrete or MultiDiscrete, got {self.action!r}")
        if not self.agents:
            raise ValueError("a group needs at least one agent")
        if not isinstance(self.agents_leave, bool):
            raise TypeError(f"GroupSpec agents_leave must be True or False, got {self.agents_leave!r}")
        if len(set(self.agents)) != len(self.agents):
            raise ValueError(f"agent names in a group must be unique, got {self.agents}")

    @property
    def n_agents(self) -> int:
        return len(self.agents)

    @property
    def is_discrete(self) -> bool:
        return isinstance(self.action, (Discrete, MultiDiscrete))

    @property
    def has_action_mask(self) -> bool:
        return isinstance(self.action, Discrete) and self.action.masked

"""gym / gymnasium spaces -> vecmarl specs, for the adapters (VMAS uses gym's, PettingZoo gymnasium's).

Both libraries give their spaces the same attributes (`shape`, `low`, `high`, `n`, `nvec`), so one
converter serves both. Bounds shared by every element become one number.
"""

from __future__ import annotations

import numpy as np

from envs.specs import ActionSpec, Box, Discrete, MultiDiscrete


def observation_spec(space, what: str) -> Box:
    """A Box observation space -> a float32 `Box` with the same bounds; `what` names the agent in errors."""
    if type(space).__name__ != "Box":
        raise TypeError(f"{what} observes a {space}; the adapters take Box observations")
    low, high = (np.broadcast_to(bound, space.shape).reshape(-1) for bound in (space.low, space.high))
    return Box(tuple(space.shape), _bound(low), _bound(high))


def action_spec(space, what: str, masked: bool = False) -> ActionSpec:
    """A Discrete, Box or 1-d MultiDiscrete action space -> our spec (`masked`: the env publishes an action mask)."""
    kind = type(space).__name__
    if kind == "Discrete":
        return Discrete(int(space.n), masked=masked)
    if masked:
        raise TypeError(f"{what} has an action mask but a {space} action space; masks need a Discrete one")
    if kind == "Box":
        if not np.issubdtype(space.dtype, np.floating):  # the policies' actions are floats, which it would refuse
            raise TypeError(
                f"{what} has a {space} action space of {space.dtype} numbers; the adapters take a Box action of "
                "floats (continuous), Discrete or 1-d MultiDiscrete"
            )
        return Box(tuple(space.shape), _bound(space.low.reshape(-1)), _bound(space.high.reshape(-1)))
    if kind == "MultiDiscrete" and np.ndim(space.nvec) == 1 and not np.any(getattr(space, "start", 0)):
        return MultiDiscrete(tuple(int(n) for n in space.nvec))
    raise TypeError(f"{what} has a {space} action space; expected Discrete, Box or 1-d MultiDiscrete")


def _bound(values: np.ndarray) -> float | tuple[float, ...]:
    values = np.asarray(values, dtype=np.float64)
    return float(values[0]) if np.all(values == values[0]) else tuple(float(v) for v in values)

"""What the VMAS adapter needs to know about a VMAS world: its batched tensors, and its random state.

`batched_slots` finds, once, every tensor of a scenario whose first dim is the batch (entity states
and actions, joints, sensors, scenario buffers such as reward shaping), by walking the objects of the
live world, a scratch world of the same size and a probe world of another size side by side.
`copy_rows` then resets envs by mask: it copies the masked rows of each such tensor from the freshly
reset scratch world into the live one with `torch.where`, with no loop over envs.

`PrivateRandomState` gives each adapter its own random stream: VMAS draws from the global generators,
swapped in from one list that every VMAS env shares.
"""

from __future__ import annotations

from typing import Any

import torch


class PrivateRandomState:
    """Swaps an env's own random state into VMAS's shared one for the length of a `with` block.

    `shared` is VMAS's `[torch CPU state, numpy state, Python random state]` list, which VMAS's methods
    load into the global generators and save back; on CUDA the device's generator is swapped too.
    """

    def __init__(self, shared: list, device: torch.device) -> None:
        self.shared = shared
        self.own = list(shared)
        self.cuda = device if device.type == "cuda" else None
        self.own_cuda = torch.cuda.get_rng_state(device) if self.cuda else None

    def __enter__(self) -> PrivateRandomState:
        self.saved = list(self.shared)
        self.shared[:] = self.own
        if self.cuda:
            self.saved_cuda = torch.cuda.get_rng_state(self.cuda)
            torch.cuda.set_rng_state(self.own_cuda, self.cuda)
        return self

    def __exit__(self, *exc) -> None:
        self.own = list(self.shared)
        self.shared[:] = self.saved
        if self.cuda:
            self.own_cuda = torch.cuda.get_rng_state(self.cuda)
            torch.cuda.set_rng_state(self.saved_cuda, self.cuda)


Path = tuple[Any, ...]  # keys from the scenario object down to a tensor: attribute names, list indices, dict keys


def batched_slots(live, scratch, probe) -> list[Path]:
    """The paths of every batched tensor reachable from the `live` scenario object.

    Walks the attributes, lists and dicts of VMAS objects (scenario, world, entities, states, actions,
    joints, sensors) of three worlds side by side; a tensor is batched when its first dim is
    `num_envs` in `live` and `scratch` and the other `num_envs` in `probe`, with the same other dims.
    """
    num_envs, probe_envs = live.world.batch_dim, probe.world.batch_dim
    paths: list[Path] = []
    seen: set[int] = set()
    todo: list[tuple[Path, Any, Any, Any]] = [((), live, scratch, probe)]
    while todo:
        path, node, twin, other = todo.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        for key, value in _children(node):
            twin_value, other_value = _child(twin, key), _child(other, key)
            if isinstance(value, torch.Tensor):
                if (
                    isinstance(twin_value, torch.Tensor)
                    and isinstance(other_value, torch.Tensor)
                    and value.dim() >= 1
                    and value.shape == twin_value.shape
                    and value.shape[0] == num_envs
                    and other_value.shape == (probe_envs, *value.shape[1:])
                ):
                    paths.append((*path, key))
            elif _walkable(value) and type(twin_value) is type(value) and type(other_value) is type(value):
                todo.append(((*path, key), value, twin_value, other_value))
    return paths


def copy_rows(paths: list[Path], live, scratch, mask: torch.Tensor) -> None:
    """Where the bool `[B]` mask is true, replace each batched tensor of `live` by `scratch`'s."""
    for path in paths:
        live_parent, scratch_parent = _resolve(live, path[:-1]), _resolve(scratch, path[:-1])
        key = path[-1]
        old, fresh = _child(live_parent, key), _child(scratch_parent, key)
        if not isinstance(old, torch.Tensor) or not isinstance(fresh, torch.Tensor) or old.shape != fresh.shape:
            continue  # not set (yet) in one of the worlds
        _container(live_parent)[key] = torch.where(rows(mask, old), fresh, old)


def rows(mask: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """The bool `[B]` mask shaped to broadcast over `like`'s `[B, ...]`."""
    return mask.view(-1, *[1] * (like.dim() - 1))


def _walkable(value) -> bool:
    if isinstance(value, (list, dict)):
        return True
    return hasattr(value, "__dict__") and type(value).__module__.startswith("vmas.")


def _container(node):
    return node if isinstance(node, (list, dict)) else vars(node)


def _children(node):
    container = _container(node)
    return list(enumerate(container) if isinstance(container, list) else container.items())


def _child(node, key):
    container = _container(node)
    if isinstance(container, list):
        return container[key] if key < len(container) else None
    return container.get(key)


def _resolve(node, path: Path):
    for key in path:
        node = _child(node, key)
    return node

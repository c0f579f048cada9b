"""What the VMAS adapter needs to know about a VMAS world: its batched tensors, and its random state.

`batched_slots` finds, once, every tensor of a scenario whose first dim is the batch (entity states
and actions, joints, sensors, scenario buffers such as reward shaping), by walking the objects of the
live world, a scratch world of the same size and a probe world of another size side by side.
`copy_rows` then resets envs by mask: it copies the masked rows of each such tensor from the freshly
reset scratch world into the live one with `torch.where`, with no loop over envs.

Dicts keyed by a world's own objects (football's scripted AI keeps `objectives[agent]`, tensors of
its targets) have other keys in each world: their keys are matched by position (see `_twin_keys`),
so each batched tensor has a path in the live world and one in the scratch world.

`world_state` and `load_world_state` save and restore the tensors at the slots' paths (a checkpoint of
the world); `PrivateRandomState` gives each adapter its own random stream: VMAS draws from the global
generators, swapped in from one list that every VMAS env shares. Both save tensors and plain numbers
only, which `torch.load(weights_only=True)` reads.
"""

from __future__ import annotations

from typing import Any

import numpy as np
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

    def state_dict(self) -> dict:
        """The stream's state as tensors and numbers (numpy's and Python's states are tuples of their own)."""
        torch_state, (_, keys, position, has_gauss, gauss), (version, internal, gauss_next) = self.own
        return {
            "torch": torch_state.clone(),
            "numpy": {
                "keys": torch.from_numpy(keys.astype(np.int64)),
                "position": int(position),
                "has_gauss": int(has_gauss),
                "gauss": float(gauss),
            },
            "python": {"version": version, "internal": torch.tensor(internal), "gauss_next": gauss_next},
            "cuda": self.own_cuda.clone() if self.cuda else None,
        }

    def load_state_dict(self, state: dict) -> None:
        numpy, python = state["numpy"], state["python"]
        self.own = [
            state["torch"].clone(),
            ("MT19937", numpy["keys"].numpy().astype(np.uint32), numpy["position"], numpy["has_gauss"], numpy["gauss"]),
            (python["version"], tuple(python["internal"].tolist()), python["gauss_next"]),
        ]
        if self.cuda:
            self.own_cuda = state["cuda"].clone()


Path = tuple[Any, ...]  # keys from the scenario object down to a tensor: attribute names, list indices, dict keys
Slot = tuple[Path, Path]  # one batched tensor's path in the live world and in the scratch world


def batched_slots(live, scratch, probe) -> list[Slot]:
    """The paths (in `live` and in `scratch`) of every batched tensor reachable from the `live` scenario.

    Walks the attributes, lists and dicts of VMAS objects (scenario, world, entities, states, actions,
    joints, sensors, scripted controllers) of three worlds side by side; a tensor is batched when its
    first dim is `num_envs` in `live` and `scratch` and the other `num_envs` in `probe`, with the same
    other dims. Only lists, dicts and objects of VMAS's classes or the scenario file's own (football's
    scripted AI) are walked, each once (cycles end there); the keys of dicts are matched, never walked.
    """
    num_envs, probe_envs = live.world.batch_dim, probe.world.batch_dim
    # VMAS loads each scenario file as a module named "", anew for each world: its classes are known by
    # the scenario's module name, and one class of the file is a different class object in each world.
    scenario_module = type(live).__module__
    slots: list[Slot] = []
    seen: set[int] = set()
    todo: list[tuple[Path, Path, Any, Any, Any]] = [((), (), live, scratch, probe)]
    while todo:
        path, twin_path, node, twin, other = todo.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        for key, twin_key, other_key in _twin_keys(node, twin, other, scenario_module):
            value, twin_value, other_value = _child(node, key), _child(twin, twin_key), _child(other, other_key)
            if isinstance(value, torch.Tensor):
                if (
                    isinstance(twin_value, torch.Tensor)
                    and isinstance(other_value, torch.Tensor)
                    and value.dim() >= 1
                    and value.shape == twin_value.shape
                    and value.shape[0] == num_envs
                    and other_value.shape == (probe_envs, *value.shape[1:])
                ):
                    slots.append(((*path, key), (*twin_path, twin_key)))
            elif _walkable(value, scenario_module) and _same_class(scenario_module, value, twin_value, other_value):
                todo.append(((*path, key), (*twin_path, twin_key), value, twin_value, other_value))
    return slots


def copy_rows(slots: list[Slot], live, scratch, mask: torch.Tensor) -> None:
    """Where the bool `[B]` mask is true, replace each batched tensor of `live` by `scratch`'s."""
    for path, twin_path in slots:
        live_parent, scratch_parent = _resolve(live, path[:-1]), _resolve(scratch, twin_path[:-1])
        old, fresh = _resolve(live_parent, path[-1:]), _resolve(scratch_parent, twin_path[-1:])
        if not isinstance(old, torch.Tensor) or not isinstance(fresh, torch.Tensor) or old.shape != fresh.shape:
            continue  # not set (yet) in one of the worlds
        _container(live_parent)[path[-1]] = torch.where(rows(mask, old), fresh, old)


def world_paths(scenario) -> tuple[list[Path], list[Path]]:
    """The paths in `scenario` of every tensor (batched or not: a goal's colour is one for the batch) and of
    every attribute, list item or dict value that holds one of the world's entities (MPE scenarios pick a
    landmark as the goal for the whole batch: `agent.goal_b`). Walks what `batched_slots` walks, in one world:
    the paths of two worlds built alike come in the same order, which is how a saved state is matched."""
    module = type(scenario).__module__
    entities = {id(entity) for entity in scenario.world.entities}
    tensors: list[Path] = []
    references: list[Path] = []
    seen: set[int] = set()
    todo: list[tuple[Path, Any]] = [((), scenario)]
    while todo:
        path, node = todo.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        for key, value in _children(node):
            if isinstance(value, torch.Tensor):
                tensors.append((*path, key))
            elif _walkable(value, module):
                if id(value) in entities:
                    references.append((*path, key))
                todo.append(((*path, key), value))
    return tensors, references


def world_state(scenario, paths: list[Path], references: list[Path] = ()) -> dict:
    """Copies of the tensors at `paths` of `scenario`: `tensors`, each distinct tensor once (paths that
    hold one tensor restore as one), and `index`, each path's tensor in `tensors` (-1: none set); for
    each of `references`, the place in `world.entities` of the entity it holds (-1: none). Each path is
    named (`names`, `reference_names`), so that a world whose walk met them in another order loads them."""
    entities = {id(entity): i for i, entity in enumerate(scenario.world.entities)}
    tensors: list[torch.Tensor] = []
    index: list[int] = []
    first: dict[int, int] = {}  # id of a tensor -> its place in `tensors`
    for path in paths:
        value = _resolve(scenario, path)
        if not isinstance(value, torch.Tensor):
            index.append(-1)
            continue
        if id(value) not in first:
            first[id(value)] = len(tensors)
            tensors.append(value.clone())  # outside inference mode: an ordinary tensor, as torch.save needs
        index.append(first[id(value)])
    return {
        "names": [_name(scenario, path) for path in paths],
        "tensors": tensors,
        "index": index,
        "reference_names": [_name(scenario, path) for path in references],
        "references": [entities.get(id(_resolve(scenario, path)), -1) for path in references],
    }


def load_world_state(
    scenario, paths: list[Path], state: dict, device: torch.device, references: list[Path] = ()
) -> None:
    """Put `world_state`'s tensors back at `paths` of `scenario` (None where none was set), and its entities
    at `references`, each by its name. Call it under `torch.inference_mode()`, as VMAS's world runs."""
    named = {_name(scenario, path): path for path in [*paths, *references]}
    saved = [*state["names"], *state["reference_names"]]
    if len(named) != len(paths) + len(references) or set(saved) != set(named) or len(saved) != len(named):
        missing = sorted(set(named) ^ set(saved)) or ["(two paths of one name)"]
        raise ValueError(
            f"the saved VMAS world does not fit this one ({missing[0]} is in one of them only): it was saved from "
            "another scenario, other options or another num_envs"
        )
    entities = scenario.world.entities  # before any reference is set: `world._agents[i]` are references too
    copies = [tensor.to(device).clone() for tensor in state["tensors"]]
    values = [copies[i] if i >= 0 else None for i in state["index"]]
    values += [entities[i] if i >= 0 else None for i in state["references"]]
    for name, value in zip(saved, values):
        path = named[name]
        parent = _resolve(scenario, path[:-1])
        container = _container(parent) if parent is not None else None
        if container is None or (isinstance(container, list) and path[-1] >= len(container)):
            continue  # a container on the way is not set in this world
        container[path[-1]] = value


def _name(scenario, path: Path) -> str:
    """A path as text that is the same in every world built alike: a dict key that is one of the world's
    objects is named by its class, its name and its place in the dict (`_twin_keys` pairs such keys so)."""
    parts, node = [], scenario
    for key in path:
        if isinstance(key, (str, int, float, tuple)) or key is None:
            parts.append(repr(key))
        else:
            place = next(i for i, other in enumerate(node) if other is key)
            parts.append(f"<{type(key).__qualname__} {getattr(key, 'name', '')} #{place}>")
        node = _child(node, key)
    return "/".join(parts)


def rows(mask: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """The bool `[B]` mask shaped to broadcast over `like`'s `[B, ...]`."""
    return mask.view(-1, *[1] * (like.dim() - 1))


def _walkable(value, scenario_module: str) -> bool:
    if isinstance(value, (list, dict)):
        return True
    module = type(value).__module__
    return hasattr(value, "__dict__") and (module.startswith("vmas.") or module == scenario_module)


def _same_class(scenario_module: str, *values) -> bool:
    """Whether `values` (one per world) are of one class, or of one class of the scenario file, which
    each world loads anew."""
    kinds = [type(value) for value in values]
    if all(kind is kinds[0] for kind in kinds):
        return True
    return all(kind.__module__ == scenario_module and kind.__qualname__ == kinds[0].__qualname__ for kind in kinds)


def _container(node):
    return node if isinstance(node, (list, dict)) else vars(node)


def _children(node):
    container = _container(node)
    return list(enumerate(container) if isinstance(container, list) else container.items())


def _twin_keys(node, twin, other, scenario_module: str) -> list[tuple[Any, Any, Any]]:
    """Each key of `node` with the keys that name the same child in `twin` and `other` (its worlds' twins).

    Attribute names, list indices and dict keys that are values (strings, numbers, tuples) are the
    same in every world. A dict keyed by the world's own objects (`{agent: ...}`) has none of its keys
    in the twin: its keys are paired by position, when the three dicts have as many keys and each
    position holds objects compared by identity, of one class and one name, as dicts built by the same
    code from the same options do. A dict that fits neither is left out.
    """
    keys = [key for key, _ in _children(node)]
    if not isinstance(node, dict) or any(key in twin for key in keys):
        return [(key, key, key) for key in keys]
    twins, others = list(twin), list(other)  # the walk pairs a dict with dicts only
    paired = list(zip(keys, twins, others))
    if len(keys) == len(twins) == len(others) and all(_same_object(scenario_module, *three) for three in paired):
        return paired
    return []


def _same_object(scenario_module: str, *keys) -> bool:
    """Whether dict keys, one per world, are objects compared by identity (entities, not values) of one
    class and one name."""
    names = [getattr(key, "name", None) for key in keys]
    return (
        _same_class(scenario_module, *keys)
        and all(type(key).__eq__ is object.__eq__ and type(key).__hash__ is object.__hash__ for key in keys)
        and all(name == names[0] for name in names)
    )


def _child(node, key):
    container = _container(node)
    if isinstance(container, list):
        return container[key] if key < len(container) else None
    return container.get(key)


def _resolve(node, path: Path):
    for key in path:
        if node is None:
            return None  # a container on the way is not set (any more) in this world
        node = _child(node, key)
    return node

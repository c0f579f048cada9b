"""The grouping layer: decide which agents are trained together, for any env.

A group map regroups an env's agents:

- `"by_type"` (the default): the env's own groups, as they are (no copies);
- `"all_in_one"`: every agent in one group `"agents"` (their specs must agree, or pass `pad=True`);
- `"per_agent"`: one group per agent, named after it;
- `{group: [agent names]}`: an explicit partition of the env's agents.

`GroupedEnv(env, group_map)` keeps the env contract, so nothing downstream knows which map is in
use: observations, action masks, rewards and flags come regrouped, and actions given per group are
split back to the env's own groups. A group is one stacked tensor `[B, n, ...]`: agents in it share
one spec. With `pad=True` (all-in-one only) observations of different sizes are zero-padded to the
largest and tagged with a one-hot of their env group, so heterogeneous teams can be stacked when
their action specs agree.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from tensordict import TensorDict, TensorDictBase

from envs.base import ROOT_KEYS as ENV_ROOT_KEYS
from envs.base import group_action, sample_actions
from envs.specs import Box, GroupSpec

GroupMap = str | Mapping[str, Sequence[str]]
GROUP_MAPS = ("by_type", "all_in_one", "per_agent")
PER_AGENT_KEYS = ("observation", "action_mask", "active", "reward", "terminated", "truncated", "done")
# Keys at the root of a step (the env's), a rollout or a replay sample, next to the groups' sub-TensorDicts: a
# group of one of these names would overwrite them (a group "done" would replace the env-level done flags).
ROOT_KEYS = (*ENV_ROOT_KEYS, "next_state", "is_init", "index", "weight")


@dataclass(frozen=True)
class _Segment:
    """A run of agents `[start, stop)` of `source` group, in order."""

    source: str
    start: int
    stop: int


def _segments(members: list[tuple[str, int]]) -> list[_Segment]:
    """Cut a list of `(group, index)` into maximal contiguous runs."""
    runs: list[_Segment] = []
    for group, index in members:
        if runs and runs[-1].source == group and runs[-1].stop == index:
            runs[-1] = _Segment(group, runs[-1].start, index + 1)
        else:
            runs.append(_Segment(group, index, index + 1))
    return runs


def _gather(tensors: Mapping[str, torch.Tensor], segments: list[_Segment], sizes: Mapping[str, int]) -> torch.Tensor:
    """Stack the agents named by `segments` along the agent dim (dim 1): `[B, n_segments_total, ...]`."""
    parts = []
    for s in segments:
        tensor = tensors[s.source]
        parts.append(tensor if (s.start, s.stop) == (0, sizes[s.source]) else tensor[:, s.start : s.stop])
    return parts[0] if len(parts) == 1 else torch.cat(parts, 1)


class GroupedEnv:
    """Any env with its agents regrouped by a group map; see the module docstring."""

    def __init__(self, env, group_map: GroupMap = "by_type", pad: bool = False) -> None:
        if not isinstance(pad, bool):  # "no" would be truthy
            raise TypeError(f"pad must be True or False, got {pad!r}")
        self.env = env
        self.group_map = group_map
        self.pad = pad
        source_specs: dict[str, GroupSpec] = env.groups
        members = self._members(source_specs, group_map)
        for group in members:
            if not isinstance(group, str) or not group or group in ROOT_KEYS:
                raise ValueError(
                    f"group name {group!r} cannot be used: a group is named by a non-empty str other than the "
                    f"root keys {list(ROOT_KEYS)}, which its data would overwrite"
                )
        if pad and group_map != "all_in_one":
            raise ValueError(f"pad=True only applies to group_map='all_in_one', got group_map={group_map!r}")
        self.identity = not pad and members == self._members(source_specs, "by_type")
        if pad and any(len(s.observation.shape) != 1 for s in source_specs.values()):
            shapes = {g: s.observation.shape for g, s in source_specs.items()}
            raise ValueError(f"pad=True pads flat observations [d]; this env's groups observe {shapes}")
        # Observation transform per env group when padding: [B, n, d] -> [B, n, d_max + n_types].
        self._pad_to = max(s.observation.shape[0] for s in source_specs.values()) if pad else None
        self.groups: dict[str, GroupSpec] = {g: self._stacked_spec(g, m, source_specs) for g, m in members.items()}
        source_of = {(s, i): g for g, m in members.items() for (s, i) in m}
        position = {(s, i): k for m in members.values() for k, (s, i) in enumerate(m)}
        self._forward = {g: _segments(m) for g, m in members.items()}
        # Backward: each env group's agents, as runs of the new groups' agents.
        self._backward = {
            g: _segments([(source_of[(g, i)], position[(g, i)]) for i in range(spec.n_agents)])
            for g, spec in source_specs.items()
        }
        self._source_sizes = {g: s.n_agents for g, s in source_specs.items()}
        self._sizes = {g: s.n_agents for g, s in self.groups.items()}

    # ---- building the map --------------------------------------------------------------------

    @staticmethod
    def _members(source_specs: Mapping[str, GroupSpec], group_map: GroupMap) -> dict[str, list[tuple[str, int]]]:
        """New group -> its agents as `(env group, index in that group)`."""
        everyone = [(g, i) for g, spec in source_specs.items() for i in range(spec.n_agents)]
        name_of = {(g, i): source_specs[g].agents[i] for g, i in everyone}
        if group_map == "by_type":
            return {g: [(g, i) for i in range(spec.n_agents)] for g, spec in source_specs.items()}
        if group_map == "all_in_one":
            return {"agents": everyone}
        if group_map == "per_agent":
            return {name_of[a]: [a] for a in everyone}
        if isinstance(group_map, str) or not isinstance(group_map, Mapping):
            raise ValueError(
                f"unknown group map {group_map!r}; expected one of {GROUP_MAPS} or a dict {{group: [agent names]}}"
            )
        where = {name: a for a, name in name_of.items()}
        members: dict[str, list[tuple[str, int]]] = {}
        seen: dict[str, str] = {}
        for group, agents in group_map.items():
            if isinstance(agents, str) or not agents:
                raise ValueError(f"group {group!r} must list one or more agent names, got {agents!r}")
            for agent in agents:
                if agent not in where:
                    raise ValueError(f"group {group!r} names unknown agent {agent!r}; the env's agents: {list(where)}")
                if agent in seen:
                    raise ValueError(f"agent {agent!r} is in both group {seen[agent]!r} and group {group!r}")
                seen[agent] = group
            members[group] = [where[a] for a in agents]
        missing = [name for name in where if name not in seen]
        if missing:
            raise ValueError(f"the group map leaves out agents {missing}; every agent must be in exactly one group")
        return members

    def _stacked_spec(self, group: str, members, source_specs: Mapping[str, GroupSpec]) -> GroupSpec:
        agents = [source_specs[s].agents[i] for s, i in members]
        first_source, first_index = members[0]
        first = source_specs[first_source]
        observation = first.observation
        if self.pad:
            observation = Box((self._pad_to + len(source_specs),), dtype=first.observation.dtype)
        for s, i in members[1:]:
            spec = source_specs[s]
            clash = spec.action != first.action or (not self.pad and spec.observation != first.observation)
            if clash:
                hint = (
                    ""
                    if self.pad or spec.action != first.action
                    else " (or pad observations: pad=True, marl train --pad)"
                )
                raise ValueError(
                    f"cannot stack agent {first.agents[first_index]!r} (group {first_source!r}: observation "
                    f"{first.observation}, action {first.action}) with agent {spec.agents[i]!r} (group {s!r}: "
                    f"observation {spec.observation}, action {spec.action}) in group {group!r}: their specs differ; "
                    f"keep them in separate groups{hint}"
                )
        # An env whose agents leave marks every group so (`MultiAgentEnv.agents_leave`): so do its stacks.
        return GroupSpec(agents, observation, first.action, agents_leave=first.agents_leave)

    # ---- the env contract ------------------------------------------------------------------------

    def __getattr__(self, name):
        # num_envs, device, max_steps, state_spec, name, config, seed, runs_on_host, ... come from the env.
        if name == "env":
            raise AttributeError(name)
        return getattr(self.env, name)

    @property
    def check_values(self) -> bool:
        return self.env.check_values

    @check_values.setter
    def check_values(self, value: bool) -> None:
        self.env.check_values = value

    @property
    def agents(self) -> list[str]:
        return [a for spec in self.groups.values() for a in spec.agents]

    def reset(self, seed: int | None = None, *, mask: torch.Tensor | None = None) -> TensorDictBase:
        return self._as_tensordict(self.reset_data(seed, mask=mask))

    def step(
        self, action: Mapping[str, torch.Tensor] | TensorDictBase, *, auto_reset: bool = True
    ) -> tuple[TensorDictBase, TensorDictBase]:
        next_data, obs = self.step_data(action, auto_reset=auto_reset)
        return self._as_tensordict(next_data), self._as_tensordict(obs)

    def reset_data(self, seed: int | None = None, *, mask: torch.Tensor | None = None) -> dict:
        return self._regroup(self.env.reset_data(seed, mask=mask))

    def step_data(
        self, action: Mapping[str, torch.Tensor] | TensorDictBase, *, auto_reset: bool = True
    ) -> tuple[dict, dict]:
        next_data, obs = self.env.step_data(self._split_action(action), auto_reset=auto_reset)
        return self._regroup(next_data), self._regroup(obs)

    def _as_tensordict(self, data: dict) -> TensorDict:
        return TensorDict(data, batch_size=[self.num_envs], device=self.device)

    def sample_actions(self, generator: torch.Generator | None = None, obs: TensorDictBase | None = None):
        return sample_actions(self.groups, self.num_envs, self.device, generator, obs)

    def render(self, index: int = 0):
        return self.env.render(index)

    def __repr__(self) -> str:
        groups = ", ".join(f"{g}: {s.n_agents} agents" for g, s in self.groups.items())
        return f"GroupedEnv({self.group_map!r}, {groups}, env={self.env!r})"

    # ---- moving tensors between the two groupings ------------------------------------------------

    def _split_action(self, action) -> dict[str, torch.Tensor]:
        if self.identity:
            return action
        if not isinstance(action, (Mapping, TensorDictBase)):
            raise TypeError(f"action must be a mapping group -> tensor, got {type(action).__name__}")
        missing = [g for g in self.groups if g not in action.keys()]
        unknown = sorted(set(action.keys()) - set(self.groups))
        if missing or unknown:
            raise KeyError(
                f"action groups {sorted(action.keys())} do not match the groups {list(self.groups)}"
                + (f"; missing {missing}" if missing else "")
                + (f"; unknown {unknown}" if unknown else "")
            )
        tensors = {}
        for group, spec in self.groups.items():
            what = f"action for group '{group}'"
            value = group_action(action[group], what)
            expected = (self.num_envs, spec.n_agents, *spec.action.shape)
            if not isinstance(value, torch.Tensor):
                raise TypeError(f"{what} must be a torch.Tensor, got {type(value).__name__}")
            if tuple(value.shape) != expected:
                raise ValueError(f"{what} has shape {tuple(value.shape)}, expected {expected}")
            # Checked here, where the group is the user's: concatenated with another group's agents, a
            # float action would be promoted and refused under the env's group name, another device fail in cat.
            if value.dtype.is_floating_point != isinstance(spec.action, Box) or value.dtype == torch.bool:
                kind = "a float dtype" if isinstance(spec.action, Box) else "an integer dtype"
                raise TypeError(f"{what} has dtype {value.dtype}, expected {kind}")
            if value.device != self.device:
                raise ValueError(f"{what} is on {value.device}, expected the env's device {self.device}")
            tensors[group] = value
        return {g: _gather(tensors, segments, self._sizes) for g, segments in self._backward.items()}

    def _regroup(self, data: dict) -> dict:
        """An env step's nested dict, with its per-agent entries moved to the new groups."""
        if self.identity:
            return data
        source = self.env.groups
        out = {k: v for k, v in data.items() if k not in source}  # root flags and state
        for group in self.groups:
            out[group] = {}
        for key in PER_AGENT_KEYS:
            # Only masked groups have an "action_mask"; a new group has one when its agents come from them
            # (its agents share one action spec, so they all do or none does).
            tensors = {g: data[g][key] for g in source if key in data[g]}
            if key == "observation" and self.pad:
                tensors = self._padded(tensors)
            for group, segments in self._forward.items():
                if all(s.source in tensors for s in segments):
                    out[group][key] = _gather(tensors, segments, self._source_sizes)
        return out

    def _padded(self, observations: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Zero-pad each env group's observation to the largest size and append its type's one-hot."""
        types = list(self.env.groups)
        padded = {}
        for t, (group, obs) in enumerate(observations.items()):
            B, n, d = obs.shape
            one_hot = torch.zeros(B, n, self._pad_to - d + len(types), dtype=obs.dtype, device=obs.device)
            one_hot[..., self._pad_to - d + t] = 1.0
            padded[group] = torch.cat([obs, one_hot], -1)
        return padded

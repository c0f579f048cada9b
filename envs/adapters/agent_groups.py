"""Group a wrapped simulator's agents by type, read from their names: `agent_0` -> group `agent`.

Adapters (VMAS, PettingZoo) see a flat list of named agents; the vecmarl contract wants groups of
agents that share one observation spec and one action spec. An agent's type is its name without the
trailing number and separator (`adversary_2` -> `adversary`, `agent 0` -> `agent`, `agent_blue_1` ->
`agent_blue`); a name without a number is a type of its own (`speaker`). Agents of one type whose specs
differ are not stacked: each of them gets a group of its own, named after the agent.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from envs.specs import ActionSpec, Box, GroupSpec

_NUMBERED = re.compile(r"^(.*?)[\s_\-]*\d+$")


def agent_type(name: str) -> str:
    """`"adversary_2"` -> `"adversary"`; spaces become underscores so the type is a clean key."""
    match = _NUMBERED.match(name)
    kind = match.group(1) if match and match.group(1) else name
    return re.sub(r"\s+", "_", kind.strip())


def group_by_type(
    agents: Sequence[str], observations: Sequence[Box], actions: Sequence[ActionSpec]
) -> tuple[dict[str, GroupSpec], dict[str, list[int]]]:
    """Group `agents` (with their per-agent specs, in the simulator's order) by type.

    Returns `(groups, members)`: `groups` maps group name -> `GroupSpec` in order of first appearance,
    `members` maps group name -> the agents' indices into `agents`, in the simulator's order.
    """
    by_type: dict[str, list[int]] = {}
    for index, name in enumerate(agents):
        by_type.setdefault(agent_type(name), []).append(index)
    members: dict[str, list[int]] = {}
    for kind, indices in by_type.items():
        first = indices[0]
        same = all(observations[i] == observations[first] and actions[i] == actions[first] for i in indices)
        if same:
            members[_unique(kind, members)] = indices
        else:
            for i in indices:
                members[_unique(re.sub(r"\s+", "_", agents[i]), members)] = [i]
    groups = {
        group: GroupSpec([agents[i] for i in indices], observations[indices[0]], actions[indices[0]])
        for group, indices in members.items()
    }
    return groups, members


def _unique(name: str, taken: dict) -> str:
    candidate, k = name, 1
    while candidate in taken:
        candidate, k = f"{name}_{k}", k + 1
    return candidate

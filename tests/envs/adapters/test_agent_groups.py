import pytest

from envs.adapters.agent_groups import agent_type, group_by_type
from envs.specs import Box, Discrete


@pytest.mark.parametrize(
    "name, kind",
    [
        ("agent_0", "agent"),
        ("agent 12", "agent"),
        ("adversary-3", "adversary"),
        ("agent_blue_1", "agent_blue"),
        ("lead_adversary_0", "lead_adversary"),
        ("speaker", "speaker"),
        ("7", "7"),
    ],
)
def test_agent_type_drops_the_number(name, kind):
    assert agent_type(name) == kind


def test_groups_keep_order_and_split_types_whose_specs_differ():
    names = ["adversary_0", "agent_0", "adversary_1", "drone_0", "drone_1", "speaker"]
    small, large = Box((4,)), Box((6,))
    observations = [small, large, small, small, large, small]
    actions = [Discrete(5)] * 6
    groups, members = group_by_type(names, observations, actions)
    assert members == {"adversary": [0, 2], "agent": [1], "drone_0": [3], "drone_1": [4], "speaker": [5]}
    assert groups["adversary"].agents == ("adversary_0", "adversary_1") and groups["drone_1"].observation == large

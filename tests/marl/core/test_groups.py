import numpy as np
import pytest
import torch

import envs
from marl.core.groups import GroupedEnv
from tests.marl.echo_env import Echo, EchoConfig

B = 4


def echo(green="none"):
    return Echo(EchoConfig(green=green), num_envs=B, seed=0)


def uids(obs, group):
    return obs[group, "observation"][0, :, 0].tolist()


def test_by_type_is_the_env_itself_without_copies():
    env = echo()
    grouped = GroupedEnv(env)
    assert grouped.identity and list(grouped.groups) == ["red", "blue"]
    action = {"red": torch.zeros(B, 2, 2), "blue": torch.zeros(B, 3, 2)}
    next_td, _ = grouped.step(action)
    # The returned TensorDict holds the env's own tensors.
    assert next_td["red", "observation"].shape == (B, 2, 4)


@pytest.mark.parametrize(
    "group_map, expected",
    [
        ("all_in_one", {"agents": ["red_0", "red_1", "blue_0", "blue_1", "blue_2"]}),
        ("per_agent", {a: [a] for a in ["red_0", "red_1", "blue_0", "blue_1", "blue_2"]}),
        (
            {"mixed": ["blue_1", "red_0"], "rest": ["blue_2", "red_1", "blue_0"]},
            {"mixed": ["blue_1", "red_0"], "rest": ["blue_2", "red_1", "blue_0"]},
        ),
    ],
    ids=["all_in_one", "per_agent", "explicit"],
)
def test_round_trip_of_observations_actions_and_rewards(group_map, expected):
    env = echo()
    grouped = GroupedEnv(env, group_map)
    assert {g: list(s.agents) for g, s in grouped.groups.items()} == expected
    uid = {a: float(i) for i, a in enumerate(env.agents)}
    obs = grouped.reset(seed=0)
    for g, agents in expected.items():
        assert uids(obs, g) == [uid[a] for a in agents]
    # Give each agent an action equal to a code of its uid, then read back what the env received.
    action = {
        g: torch.tensor([[uid[a] / 10, -uid[a] / 10] for a in agents]).expand(B, -1, -1)
        for g, agents in expected.items()
    }
    next_td, obs = grouped.step(action)
    for g, agents in expected.items():
        received = next_td[g, "observation"][..., 2:4]
        torch.testing.assert_close(received, action[g])
        torch.testing.assert_close(
            next_td[g, "reward"][..., 0], torch.tensor([uid[a] * 1.1 for a in agents]).expand(B, -1)
        )
        assert next_td[g, "done"].shape == (B, len(agents), 1)
    assert torch.equal(next_td["done"], env.step(env.sample_actions())[0]["done"])


@pytest.mark.parametrize(
    "group_map", ["by_type", "all_in_one", "per_agent", {"x": ["blue_2"], "y": ["red_0", "red_1", "blue_0", "blue_1"]}]
)
def test_grouped_env_passes_check_env(group_map):
    envs.check_env(GroupedEnv(echo(), group_map))


def test_grouped_navigation_passes_check_env():
    envs.check_env(GroupedEnv(envs.make("navigation", num_envs=3, seed=0, max_steps=10), "per_agent"))


def test_stacking_different_specs_names_both():
    with pytest.raises(ValueError) as error:
        GroupedEnv(echo("small_obs"), "all_in_one")
    message = str(error.value)
    assert "cannot stack agent 'red_0' (group 'red': observation Box(shape=(4,)" in message
    assert "with agent 'green_0' (group 'green': observation Box(shape=(2,)" in message
    assert "pad=True, marl train --pad" in message


def test_padding_stacks_different_observation_sizes():
    grouped = GroupedEnv(echo("small_obs"), "all_in_one", pad=True)
    spec = grouped.groups["agents"]
    assert spec.observation.shape == (4 + 3,)  # largest observation + one-hot of 3 env groups
    obs = grouped.reset(seed=1)["agents", "observation"]
    assert obs.shape == (B, 6, 7)
    # green_0 (last) sees 2 numbers, zero padding, then the one-hot of type 2.
    torch.testing.assert_close(obs[:, 5, 2:4], torch.zeros(B, 2))
    torch.testing.assert_close(obs[:, 5, 4:], torch.tensor([0.0, 0.0, 1.0]).expand(B, 3))
    torch.testing.assert_close(obs[:, 0, 4:], torch.tensor([1.0, 0.0, 0.0]).expand(B, 3))
    envs.check_env(grouped)


def test_padding_needs_matching_actions():
    with pytest.raises(ValueError, match="their specs differ; keep them in separate groups$"):
        GroupedEnv(echo("discrete"), "all_in_one", pad=True)
    with pytest.raises(ValueError, match="pad=True only applies to group_map='all_in_one'"):
        GroupedEnv(echo(), "per_agent", pad=True)


@pytest.mark.parametrize(
    "group_map, message",
    [
        ("by_colour", "unknown group map 'by_colour'"),
        ({"a": ["red_0", "nobody"]}, "names unknown agent 'nobody'"),
        ({"a": ["red_0"], "b": ["red_0"]}, "agent 'red_0' is in both group 'a' and group 'b'"),
        ({"a": ["red_0", "red_1"]}, r"leaves out agents \['blue_0', 'blue_1', 'blue_2'\]"),
        ({"a": "red_0"}, "must list one or more agent names"),
    ],
)
def test_bad_group_maps(group_map, message):
    with pytest.raises(ValueError, match=message):
        GroupedEnv(echo(), group_map)


def test_bad_action_shape_for_a_regrouped_group():
    grouped = GroupedEnv(echo(), "all_in_one")
    with pytest.raises(ValueError, match=r"action for group 'agents' has shape \(4, 4, 2\), expected \(4, 5, 2\)"):
        grouped.step({"agents": torch.zeros(B, 4, 2)})
    with pytest.raises(KeyError, match="missing"):
        grouped.step({"red": torch.zeros(B, 2, 2)})
    # a numpy action read "has shape ndarray, expected (4, 5, 2)"
    with pytest.raises(TypeError, match="action for group 'agents' must be a torch.Tensor, got ndarray"):
        grouped.step({"agents": np.zeros((B, 5, 2), dtype=np.float32)})


@pytest.mark.parametrize("name", ["done", "terminated", "state", "", 1])
def test_a_group_named_like_a_root_key_or_not_a_str_is_refused(name):
    # A group "done" replaced the env-level done flags of every step, silently; a group 1 failed in tensordict.
    others = ["red_1", "blue_0", "blue_1", "blue_2"]
    with pytest.raises(ValueError, match=f"group name {name!r} cannot be used: a group is named by a non-empty str"):
        GroupedEnv(echo(), {name: ["red_0"], "rest": others})


def test_regrouped_actions_of_the_wrong_dtype_or_device_name_the_users_group():
    env = echo("discrete")
    grouped = GroupedEnv(env, {"movers": ["red_0", "red_1", "blue_0", "blue_1", "blue_2"], "talker": ["green_0"]})
    good = {"movers": torch.zeros(B, 5, 2), "talker": torch.zeros(B, 1, dtype=torch.long)}
    with pytest.raises(TypeError, match="action for group 'talker' has dtype torch.float32, expected an integer dtype"):
        grouped.step({**good, "talker": torch.zeros(B, 1)})  # was refused under the env's group 'green'
    with pytest.raises(TypeError, match="action for group 'movers' has dtype torch.int64, expected a float dtype"):
        grouped.step({**good, "movers": torch.zeros(B, 5, 2, dtype=torch.long)})
    with pytest.raises(ValueError, match="action for group 'movers' is on meta, expected the env's device cpu"):
        grouped.step({**good, "movers": torch.zeros(B, 5, 2, device="meta")})  # was torch.cat's device error
    with pytest.raises(TypeError, match="pad must be True or False, got 'no'"):
        GroupedEnv(env, "all_in_one", pad="no")


@pytest.mark.parametrize("group_map", ["per_agent", {"movers": ["mover_0", "mover_1"], "pickers": ["picker_0"]}])
def test_regrouping_keeps_the_masks_of_masked_groups_next_to_unmasked_ones(group_map):
    # The mask was regrouped only when every env group had one: a masked group next to a Box group lost it,
    # and training failed on a KeyError (or sampled actions its mask forbids).
    from tests.envs.broken_envs import Counter

    env = Counter(num_envs=B, seed=0)
    grouped = GroupedEnv(env, group_map)
    envs.check_env(grouped)
    picker = "picker_0" if group_map == "per_agent" else "pickers"
    obs = grouped.reset(seed=0)
    assert torch.equal(obs[picker, "action_mask"], env.reset(seed=0)["picker", "action_mask"])
    next_td, _ = grouped.step(grouped.sample_actions(obs=obs))
    assert next_td[picker, "action_mask"].shape == (B, 1, 3)
    assert "action_mask" not in next_td["mover_0" if group_map == "per_agent" else "movers"].keys()

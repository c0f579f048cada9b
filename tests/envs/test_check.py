import pytest

import envs
from tests.envs import broken_envs as broken


def test_correct_toy_env_passes():
    envs.check_env(broken.Counter(num_envs=5, seed=0))


def test_correct_env_whose_agents_leave_passes():
    envs.check_env(broken.Exits(num_envs=5, seed=0))


@pytest.mark.parametrize("num_envs", [1, 4])
@pytest.mark.parametrize("n_agents", [1, 3, 24])
def test_navigation_passes(num_envs, n_agents):
    envs.check_env(envs.make("navigation", num_envs=num_envs, seed=0, n_agents=n_agents, max_steps=12))


@pytest.mark.parametrize(
    "env_class, prop, key",
    [
        (broken.WrongShape, "data", "observation"),
        (broken.WrongDtype, "data", "observation"),
        (broken.NanReward, "data", "reward"),
        (broken.NanRewardAtStep3, "data", "reward"),
        (broken.InfObservation, "data", "observation"),
        (broken.HostSync, "host_sync", None),
        (broken.HostToDevice, "host_sync", None),
        (broken.GlobalRandom, "seeding", None),
        (broken.LeakyEnvs, "independence", "reward"),
        (broken.ResetsEveryEnv, "auto_reset", None),
        (broken.IgnoresResetMask, "masked_reset", None),
        (broken.SkipsAutoReset, "auto_reset", "observation"),
        (broken.OverwritesNext, "auto_reset", "observation"),
        (broken.StepWithoutAutoReset, "auto_reset", None),
        (broken.IgnoresAutoResetFalse, "auto_reset", "observation"),
        (broken.TimeLimitAsTermination, "truncation", "truncated"),
        (broken.BadRender, "render", None),
        (broken.PerEnvReward, "data", "reward"),
        (broken.MissingRewardGroup, "data", "reward"),
        (broken.PerAgentTerminated, "data", "terminated"),
        (broken.FloatTerminated, "data", "terminated"),
        (broken.IntActionMask, "data", "action_mask"),
        (broken.UndeclaredActionMask, "data", "action_mask"),
        (broken.AliasedObservation, "auto_reset", "observation"),
        (broken.RewardOnly, "data", "reward"),
        (broken.NoActionAllowed, "data", "action_mask"),
        (broken.StateCreatedInStep, "data", "state"),
        (broken.PythonNumberState, "data", "state"),
        (broken.KeepsDepartedOnReset, "flags", "active"),
        (broken.DepartedComeBack, "flags", "active"),
        (broken.DepartedEarnReward, "flags", "reward"),
        (broken.LoopsOverEnvs, "vectorised", None),
        (broken.LoopsOverAgents, "vectorised", None),
    ],
    ids=lambda v: v.__name__ if isinstance(v, type) else str(v),
)
def test_catches_broken_env(env_class, prop, key):
    env = env_class(num_envs=4, seed=0)
    with pytest.raises(envs.CheckError) as error:
        envs.check_env(env)
    assert error.value.prop == prop, str(error.value)
    if key is not None:
        assert error.value.key == key, str(error.value)
    assert f"property '{prop}' failed" in str(error.value)


def test_names_what_the_env_returned_and_what_was_expected():
    # Mistakes in what `_step`, `_observe` or `_action_mask` return were crashes deep in torch (a per-agent
    # `terminated`, an int mask), or passed (a mask the spec does not declare, which training then lost).
    cases = [
        (
            broken.PerAgentTerminated,
            r"_step\(\)'s terminated \(bool \[num_envs\]\) has shape \(4, 2\), expected \(4,\)",
        ),
        (broken.IntActionMask, r"_action_mask\(\)\['picker'\] .* has dtype torch.int64, expected torch.bool"),
        (
            broken.UndeclaredActionMask,
            r"_action_mask\(\) has groups \['picker'\], expected the groups whose action spec ",
        ),
        (
            broken.MissingRewardGroup,
            r"_step\(\)'s reward has groups \['mover'\], expected every group: \['mover', 'picker'\]",
        ),
        (broken.RewardOnly, r"_step\(\) must return a pair \(reward .*, terminated bool \[num_envs\]\), got a dict"),
        (broken.NoActionAllowed, r"'picker', key 'action_mask': action_mask allows no action for some agent"),
        (broken.KeepsDepartedOnReset, r"'mover', key 'active': an agent is out .* at the start of an episode: _reset"),
        (broken.DepartedEarnReward, r"'mover', key 'reward': an agent that left its episode got a reward: _step gives"),
        # The base class's value checks (check_env turns check_values on) name the method and the envs.
        (broken.NanRewardAtStep3, r"_step\(\)'s reward for group 'mover' contains NaN or inf in 1 of 4 envs \(env 2\)"),
        (broken.InfObservation, r"_observe\(\) for group 'mover' contains NaN or inf in 1 of 4 envs \(env 1\)"),
    ]
    for env_class, message in cases:
        with pytest.raises(envs.CheckError, match=message):
            envs.check_env(env_class(num_envs=4, seed=0))


def test_observation_out_of_bounds_names_the_element_and_its_values():
    # It said only "observation is outside its Box bounds", not which of its numbers nor by how much.
    message = r"'mover', key 'observation': reset observation is outside its Box bounds: element \(1,\) has values in \[0\.\d+, 0\.\d+\], outside \[0, 0\.5\]"
    with pytest.raises(envs.CheckError, match=message):
        envs.check_env(broken.ObservationOutOfBounds(num_envs=4, seed=0))


def test_aliased_observation_names_the_in_place_update():
    with pytest.raises(envs.CheckError, match="_observe returns a state tensor that _reset then updates in place"):
        envs.check_env(broken.AliasedObservation(num_envs=4, seed=0))


def test_auto_reset_failure_names_the_likely_causes():
    # ResetsEveryEnv's _reset ignores its mask; the message used to name no cause.
    with pytest.raises(envs.CheckError, match=r"_reset changed envs outside its mask .* or _observe draws random"):
        envs.check_env(broken.ResetsEveryEnv(num_envs=4, seed=0))


@pytest.mark.parametrize(
    "env_class, message",
    [
        (broken.StepWithoutAutoReset, r"raised TypeError: .*unexpected keyword argument 'auto_reset'"),
        (broken.IgnoresAutoResetFalse, r"gave an obs other than next's observation \(did it reset the done envs\?\)"),
    ],
    ids=lambda v: v.__name__ if isinstance(v, type) else "",
)
def test_a_step_that_drops_auto_reset_false_says_to_pass_it_on(env_class, message):
    # Such an env passed, and failed only under `marl eval --render` (or a demo's --gif).
    with pytest.raises(
        envs.CheckError, match=message + r".*pass it on: super\(\)\.step\(action, auto_reset=auto_reset\)"
    ):
        envs.check_env(env_class(num_envs=4, seed=0))


def test_host_to_device_copy_names_the_line():
    # On a CPU env the checker treats the device as remote: a copy that would sync on CUDA fails here too.
    message = r"'host_sync' failed: host-to-device copy: .*\(torch\.tensor\).* \(at .*broken_envs\.py:\d+ in _step"
    with pytest.raises(envs.CheckError, match=message):
        envs.check_env(broken.HostToDevice(num_envs=4, seed=0))


def test_loop_over_envs_names_the_line():
    # A Python loop over the envs passed every property: its results are right, only slow.
    message = (
        r"'vectorised' failed: .* in step grows with num_envs \(16 ops for 4 envs, 20 for 5 envs, 24 for 6 envs\) at "
        r".*broken_envs\.py:\d+ in \S+: `.*for b in range\(self\.num_envs\)"
    )
    with pytest.raises(envs.CheckError, match=message):
        envs.check_env(broken.LoopsOverEnvs(num_envs=4, seed=0))


def test_one_env_passes_where_its_ops_differ_from_two():
    # A matmul of one env takes other ops than of two (navigation's lidar, 2 agents: 3 ops, then 7): no loop.
    envs.check_env(envs.make("navigation", num_envs=1, n_agents=2, seed=0))


def test_loop_over_agents_names_the_field_and_the_line():
    # A Python loop over the agents passed every property, the loop over envs' too (its op count grows with
    # n_agents, not num_envs).
    message = (
        r"'vectorised' failed for group 'mover': .* in step grows with the number of agents \(8 ops with "
        r"n_agents=2, 12 with n_agents=3, 16 with n_agents=4\) at .*broken_envs\.py:\d+ in \S+: "
        r"`.*for i in range\(self\.config\.n_agents\)"
        r".*batched ops over the agent dim"
    )
    with pytest.raises(envs.CheckError, match=message):
        envs.check_env(broken.LoopsOverAgents(num_envs=4, seed=0))


def test_loop_over_agents_is_found_below_the_most_agents_the_config_takes():
    # n_agents=3 is its config's maximum: the check counts the ops with 1, 2 and 3 agents instead.
    message = r"grows with the number of agents \(\d+ ops with n_agents=1, \d+ with n_agents=2, \d+ with n_agents=3\)"
    with pytest.raises(envs.CheckError, match=message):
        envs.check_env(broken.LoopsOverAtMost3Agents(num_envs=4, seed=0))


@pytest.mark.parametrize(
    "make",
    [lambda: broken.Counter(num_envs=4, seed=(0, 1)), lambda: envs.make("tag", num_envs=4, seed=(3, 5))],
    ids=["counter", "tag"],
)
def test_env_built_with_several_seeds_passes(make):
    # As a population builds its envs (one seed per member, marl train --seeds): check_env reset it with an
    # int seed, which such an env refuses.
    env = make()
    envs.check_env(env)
    assert isinstance(env.seed, tuple) and len(env.seed) == 2


def test_seeding_failure_names_the_env_stream():
    # It said only "two resets with the same seed differ", not where the randomness must come from.
    with pytest.raises(
        envs.CheckError, match=r"two resets with the same seed differ: draw every random number from self\.rng"
    ):
        envs.check_env(broken.GlobalRandom(num_envs=4, seed=0))


def test_seeding_failure_names_state_that_reset_leaves():
    # An env whose _reset forgot a state tensor was told only to draw its random numbers from self.rng.
    with pytest.raises(
        envs.CheckError,
        match=r"two resets with the same seed differ: .*; and let _reset overwrite every state tensor where mask",
    ):
        envs.check_env(broken.KeepsPositionOnReset(num_envs=4, seed=0))


def test_seeding_catches_state_that_reset_leaves_whatever_the_history():
    # The two runs it compared had the same actions, so state that only the last action sets ended them alike,
    # and a _reset that forgot it passed.
    with pytest.raises(
        envs.CheckError,
        match=r"'seeding' failed for group 'picker', key 'observation': two resets with the same seed differ: .*"
        r"let _reset overwrite every state tensor where mask",
    ):
        envs.check_env(broken.KeepsLastPickOnReset(num_envs=4, seed=0))


@pytest.mark.parametrize("take", [envs.check_env, envs.to_pettingzoo], ids=["check_env", "to_pettingzoo"])
def test_a_name_where_an_env_goes_is_refused_saying_how_to_make_one(take):
    # was "AttributeError: 'str' object has no attribute 'check_values'" (and 'name' for to_pettingzoo)
    with pytest.raises(TypeError, match=r"takes an env .*got str 'spread': make one with envs.make\('spread'"):
        take("spread")

import pytest

import envs
from tests.envs import broken_envs as broken


def test_correct_toy_env_passes():
    envs.check_env(broken.Counter(num_envs=5, seed=0))


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
        (broken.HostSync, "host_sync", None),
        (broken.GlobalRandom, "seeding", None),
        (broken.LeakyEnvs, "independence", "reward"),
        (broken.ResetsEveryEnv, "auto_reset", None),
        (broken.IgnoresResetMask, "masked_reset", None),
        (broken.SkipsAutoReset, "auto_reset", "observation"),
        (broken.OverwritesNext, "auto_reset", "observation"),
        (broken.TimeLimitAsTermination, "truncation", "truncated"),
        (broken.BadRender, "render", None),
        (broken.SharedAgentNames, "specs", None),
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

"""One conformance check over every registered native env, with its default options: a new env is
covered the moment it is registered."""

import pytest

import envs

NATIVE = [name for name in envs.names() if "/" not in name]


@pytest.mark.parametrize("name", NATIVE)
@pytest.mark.parametrize("num_envs", [1, 5])
def test_every_registered_env_passes_check_env(name, num_envs):
    envs.check_env(envs.make(name, num_envs=num_envs, seed=0))


def test_the_native_envs_are_registered():
    assert {"navigation", "spread", "tag", "speaker_listener"} <= set(NATIVE)

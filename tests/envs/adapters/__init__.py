"""What the adapters' tests share."""

from __future__ import annotations

import pytest

import envs


def assert_seeding_advice(env, advice: str) -> None:
    """`check_env(env)` fails its seeding with the adapter's `advice` (a regex), not a native env's (which
    names `self.rng` and `_reset`, the hooks of an env the user writes, not of the simulator an adapter wraps)."""
    message = rf"'seeding' failed for group .*: two resets with the same seed differ: {advice}"
    with pytest.raises(envs.CheckError, match=message) as caught:
        envs.check_env(env)
    assert "self.rng" not in str(caught.value) and "_reset" not in str(caught.value)

"""The collector's arguments: what it cannot collect with is refused naming what it takes."""

import pytest
import torch

import envs
from marl.core.models import Policy
from marl.core.rollout import Acting, Collector


def spread_and_acting():
    env = envs.make("spread", num_envs=4, device="cpu", seed=0)
    return env, Acting({"agent": Policy(env.groups["agent"], [8], "tanh", share_params=True)})


@pytest.mark.parametrize(
    ("change", "error", "says"),
    [
        (
            lambda acting: {"rollout_length": 0},
            ValueError,
            r"Collector: rollout_length must be a positive int, got 0",
        ),
        (
            lambda acting: {"generator": 0},
            TypeError,
            r"Collector: generator must be a torch.Generator on cpu .*; got 0",
        ),
        (
            lambda acting: {"acting": acting.policies},
            TypeError,
            r"Collector: acting must be a marl.core.rollout.Acting .*, got dict",
        ),
        (
            lambda acting: {"acting": Acting({"speaker": acting.policies["agent"]})},
            ValueError,
            r"Collector: acting.policies has the groups \['speaker'\], expected one policy for each of the env's "
            r"groups \['agent'\]",
        ),
    ],
    ids=["rollout_length", "generator", "acting-dict", "acting-groups"],
)
def test_collector_refuses_arguments_it_cannot_collect_with(change, error, says):
    """They failed inside torch ("zeros: Dimension size must be non-negative", "rand() received an invalid
    combination of arguments"), on "'dict' object has no attribute 'policies'", or with a bare KeyError."""
    env, acting = spread_and_acting()
    arguments = {"acting": acting, "rollout_length": 4, "generator": torch.Generator().manual_seed(0)}
    arguments.update(change(acting))
    with pytest.raises(error, match=says):
        Collector(env, arguments["acting"], arguments["rollout_length"], arguments["generator"], seed=0)

"""A PettingZoo env of a user's own whose agents leave mid-episode (`tests.envs.pz_couriers`: couriers leave at a
set step and on reaching a goal, beside a dispatcher group of one), through the README's route for it
(`marl train --env pettingzoo/<module>`): every algorithm family trains on it, and `marl eval` of each checkpoint
gives the returns a plain loop over the PettingZoo env gives with the checkpoint's policies."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from marl.app.build import build_algorithm, make_env
from marl.app.checkpoint import load_algorithm_state, load_checkpoint
from marl.app.cli import main
from marl.app.distributed import World
from marl.config import TrainConfig

pytest.importorskip("pettingzoo")
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
ENV = "pettingzoo/tests.envs.pz_couriers"


def greedy_returns(checkpoint) -> dict[str, float]:
    """Each group's mean episode return over its agents, of one episode of the PettingZoo env stepped by hand with
    the checkpoint's policies' modes (a departed agent's input: the last observation PettingZoo gave it)."""
    from tests.envs.pz_couriers import parallel_env

    state = load_checkpoint(checkpoint)
    config = TrainConfig.from_dict(state["config"])
    env = make_env(config, torch.device("cpu"), num_envs=1, seed=0)
    algorithm = build_algorithm(config, env, torch.device("cpu"), World(), torch.Generator())
    load_algorithm_state(algorithm, state["algorithm"], algorithm.label(config, env.groups))
    raw = parallel_env()
    last, _ = raw.reset()
    returns = dict.fromkeys(raw.possible_agents, 0.0)
    while raw.agents:
        actions = {}
        for g, spec in env.groups.items():
            observation = torch.from_numpy(np.stack([last[agent] for agent in spec.agents]))[None]  # [1, n, d]
            action = algorithm.acting.policies[g](observation, None).mode()[0]
            actions |= {agent: int(a) for agent, a in zip(spec.agents, action) if agent in raw.agents}
        observations, rewards, *_ = raw.step(actions)
        last |= observations
        for agent, reward in rewards.items():
            returns[agent] += reward
    return {g: float(np.mean([returns[a] for a in spec.agents])) for g, spec in env.groups.items()}


def train_argv(tmp_path, algo: str, *more: str) -> list[str]:
    """`marl train` of `algo` on the couriers for 128 frames (8 envs, 8 steps), in `tmp_path/algo`."""
    sizes = (
        ["--minibatch-size", "32"] if algo.endswith("ppo") else ["--batch-size", "32", "--updates-per-iteration", "2"]
    )
    argv = ["train", "--algo", algo, "--env", ENV, "--num-envs", "8", "--rollout-length", "8", *sizes, *more]
    return [
        *argv,
        "--total-frames",
        "128",
        "--log-dir",
        str(tmp_path),
        "--run-name",
        algo,
        "--no-progress",
        "--no-tensorboard",
    ]


@pytest.mark.parametrize("algo", ["mappo", "ippo", "masac", "iql", "qmix"])
def test_train_and_eval_on_a_users_pettingzoo_env_whose_agents_leave(tmp_path, capsys, algo):
    assert main(train_argv(tmp_path, algo)) == 0
    out = capsys.readouterr().out
    assert "courier        mean episode return" in out and "dispatcher     mean episode return" in out
    checkpoint = tmp_path / algo / "checkpoint.pt"
    assert main(["eval", "--checkpoint", str(checkpoint), "--episodes", "3", "--device", "cpu"]) == 0
    lines = capsys.readouterr().out.splitlines()
    expected = greedy_returns(checkpoint)
    for g, value in expected.items():  # the env and the modes are deterministic: every episode the same
        assert f"{g}: mean episode return {value:.4f} over 3 episodes (std across episodes 0.0000)" in lines
    assert "mean episode length 8.0" in lines


@pytest.mark.parametrize("algo", ["mappo", "qmix"])
def test_a_population_trains_on_a_users_pettingzoo_env_whose_agents_leave(tmp_path, capsys, algo):
    # Two groups that may lose agents: each group's values and moments read its own `active` flags.
    assert main(train_argv(tmp_path, algo, "--seeds", "0", "1")) == 0
    assert "dispatcher" in capsys.readouterr().out

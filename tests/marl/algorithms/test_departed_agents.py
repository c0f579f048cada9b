"""Agents that leave mid-episode (`_agent_terminated`): the env's `active` flag, the rollout and the replay
buffer that store it, and every learner's losses over the active agent-steps only, each against a reference
computed over those steps alone (and not equal to the loss over every step, which learners used before)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import envs
from marl.app.trainer import Trainer
from marl.config import EnvSettings, TrainConfig
from marl.core.groups import GroupedEnv
from tests.marl.algorithms.test_offpolicy import small_config as off_policy_config
from tests.marl.app.test_training import small_config as ppo_config
from tests.marl.leavers_env import Leavers, LeaversConfig

LIFETIMES = (3, 1)  # agent_1 acts at each episode's first step only; agent_0 ends the 3-step episode


@pytest.fixture(autouse=True)
def leavers(monkeypatch):
    monkeypatch.setitem(envs.registry._ENVS, "leavers", Leavers)


def leavers_settings(num_envs: int = 4, discrete: bool = False) -> EnvSettings:
    return EnvSettings(env="leavers", num_envs=num_envs, env_options={"lifetimes": LIFETIMES, "discrete": discrete})


def ppo_leavers_config(tmp_path, **run) -> TrainConfig:
    """PPO on 4 envs of leavers, 6-step rollouts in minibatches of 24 frames."""
    config = ppo_config(tmp_path)
    algo = dataclasses.replace(config.algo, minibatch_size=24, entropy_coef=0.01)
    run = dataclasses.replace(config.run, **{"rollout_length": 6, "total_frames": 4 * 6 * 2, **run})
    return dataclasses.replace(config, env=leavers_settings(), algo=algo, run=run)


def on_policy(tmp_path, **run) -> Trainer:
    return Trainer(ppo_leavers_config(tmp_path, **run), run_dir=tmp_path / "ppo")


def off_policy(tmp_path, algo: str, **options) -> Trainer:
    discrete = algo in ("iql", "vdn", "qmix")
    config = off_policy_config(tmp_path, algo, **options)
    config = dataclasses.replace(config, env=leavers_settings(8, discrete))
    return Trainer(config, run_dir=tmp_path / algo)


def expected_active(steps: range, num_envs: int) -> torch.Tensor:
    """`[T, B, 2]`: agent_0 acts at every step, agent_1 at each 3-step episode's first only."""
    first = torch.tensor([t % 3 == 0 for t in steps])
    return torch.stack([torch.ones_like(first), first], -1)[:, None].expand(-1, num_envs, -1)


# ---- the flag: env, group maps, rollout, replay --------------------------------------------------------------


def test_the_env_says_which_agents_act_until_their_env_resets():
    env = Leavers(LeaversConfig(lifetimes=LIFETIMES), num_envs=2, seed=1)
    assert env.groups["agent"].agents_leave and not envs.make("navigation", num_envs=2).groups["agent"].agents_leave
    obs, acting, still_in = env.reset(seed=1), [], []
    for _ in range(4):
        acting.append(obs["agent", "active"][0].tolist())
        next_td, obs = env.step({"agent": torch.zeros(2, 2, 1)})
        still_in.append(next_td["agent", "active"][0].tolist())
        assert torch.equal(next_td["agent", "terminated"][..., 0], ~next_td["agent", "active"])
    assert acting == [[True, True], [True, False], [True, False], [True, True]]  # the reset brings agent_1 back
    assert still_in == [[True, False], [True, False], [False, False], [True, False]]
    # A group map moves the flag with the agents; an env whose agents all end together has none.
    per_agent = GroupedEnv(env, "per_agent")
    assert per_agent.groups["agent_1"].agents_leave
    assert per_agent.reset(seed=1)["agent_1", "active"].shape == (2, 1)
    assert "active" not in envs.make("navigation", num_envs=2).reset()["agent"].keys()


@pytest.mark.parametrize("compile", [False, True], ids=["eager", "compiled"])
def test_the_rollout_stores_whether_each_agent_acted_across_resets_and_calls(tmp_path, compile):
    trainer = on_policy(tmp_path, compile=compile)
    assert trainer.collector.compiled == compile
    first = trainer.collector.collect()["agent", "active"].clone()
    second = trainer.collector.collect()["agent", "active"]  # 6 steps on: the episodes' phase carries over
    assert torch.equal(first, expected_active(range(6), 4))
    assert torch.equal(second, expected_active(range(6, 12), 4))


def test_the_replay_buffer_stores_and_draws_the_flag_with_its_step(tmp_path):
    trainer = off_policy(tmp_path, "isac")
    batch = trainer.collector.collect()  # [8, 8]
    trainer.buffer.extend(batch)
    stored = trainer.buffer.storage[("agent", "active")][:64]
    assert torch.equal(stored, batch["agent", "active"].flatten(0, 1))
    index = torch.tensor([0, 9, 18, 27])  # steps 0, 1, 2, 3 of envs 0, 1, 2, 3
    assert trainer.buffer.gather(index)["agent"]["active"][:, 1].tolist() == [True, False, False, True]
    navigation = Trainer(off_policy_config(tmp_path, "isac"), run_dir=tmp_path / "nav")
    assert ("agent", "active") not in navigation.buffer.storage

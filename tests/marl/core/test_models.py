"""Policies and critics on observations that are not flat: the MLPs read them flattened row-major."""

import pytest
import torch

import envs
from envs.specs import Box, Discrete, GroupSpec
from marl.algorithms.ppo import PPOConfig
from marl.app.trainer import Trainer
from marl.config import EnvSettings, ModelConfig, RunConfig, TrainConfig
from marl.core.groups import GroupedEnv
from marl.core.models import CriticInput, Policy

BOARD = GroupSpec(("player_1", "player_2"), Box((3, 3, 2)), Discrete(9, masked=True))
FLAT = GroupSpec(BOARD.agents, Box((18,)), BOARD.action)


def test_a_board_observation_gives_the_policy_of_its_row_major_flattening():
    torch.manual_seed(0)
    board, flat = Policy(BOARD, (16,), "tanh", True), Policy(FLAT, (16,), "tanh", True)
    flat.load_state_dict(board.state_dict())  # same sizes: the board's MLP reads 18 inputs
    obs = torch.randn(5, 2, 3, 3, 2)
    mask = torch.rand(5, 2, 9) > 0.3
    mask[..., 0] = True
    expected = flat(obs.reshape(5, 2, 18), mask)
    got = board(obs, mask)
    assert torch.equal(got.log_probs, expected.log_probs)


def test_critic_inputs_flatten_board_observations():
    obs = torch.randn(4, 2, 3, 3, 2)
    groups = {"player": BOARD}
    agent = CriticInput("agent", "player", groups, state_size=None, agent_id=True)
    team = CriticInput("group", "player", groups, state_size=None, agent_id=True)
    assert (agent.size, team.size) == (18, 2 * 18 + 2)
    assert torch.equal(agent({"player": obs}, None), obs.reshape(4, 2, 18))
    shared = obs.reshape(4, 36)
    assert torch.equal(team({"player": obs}, None)[:, 0], shared)


def test_marl_trains_on_tictactoe_boards_within_its_action_masks(tmp_path):
    # check_values makes the env reject any action its mask forbids, so the run shows the policy
    # samples only legal moves from the flattened boards.
    config = TrainConfig(
        env=EnvSettings(env="pettingzoo/pettingzoo.classic.tictactoe_v3", num_envs=4, env_options={}),
        algo=PPOConfig(minibatch_size=64, epochs=1),
        model=ModelConfig(hidden=(16,)),
        run=RunConfig(total_frames=2 * 4 * 32, rollout_length=32, log_dir=str(tmp_path), progress=False),
    )
    trainer = Trainer(config, run_dir=tmp_path / "run")
    trainer.env.check_values = True
    rows = [trainer.train_iteration() for _ in range(2)]
    assert all(torch.isfinite(torch.tensor(row["player/loss"])) for row in rows)
    assert rows[-1]["episodes"] > 0


def test_padding_board_observations_is_a_clear_error():
    env = envs.make("pettingzoo/pettingzoo.classic.tictactoe_v3", num_envs=2, seed=0)
    with pytest.raises(ValueError, match=r"pad=True pads flat observations \[d\]; this env's groups observe"):
        GroupedEnv(env, "all_in_one", pad=True)

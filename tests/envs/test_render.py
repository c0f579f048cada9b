"""`envs.render.play`, the loop of the native envs' demos (`python -m envs.native.<name> --gif x.gif`)."""

import math

import envs
from envs.render import demo_policy, play
from tests.envs.ticker import TICK_GREY, Ticker, gif_greys


def test_the_gif_holds_each_episode_to_the_state_its_last_action_reached(tmp_path):
    # `step` resets a done env before returning, so each of env 0's episodes lost its last frame (in a real
    # task, the agents on their goals): 9 steps gave [0, 40, 80, 120, 0, 40, 80, 120, 0].
    env = Ticker(num_envs=2, seed=0)  # env 0's episodes last 4 steps, env 1's 5
    gif = tmp_path / "demo.gif"
    play(env, lambda obs: env.sample_actions(), 9, gif=str(gif))
    episode = [TICK_GREY * ticks for ticks in range(5)]  # the reset's state, then after each of its 4 actions
    assert gif_greys(gif) == episode + episode + episode[:2]  # the third episode: its first step


def test_recording_changes_no_return(tmp_path):
    """The recording resets the done envs itself, from the draws the auto-reset would take."""
    returns = []
    for gif in (None, str(tmp_path / "demo.gif")):
        env = envs.make("navigation", num_envs=3, seed=0, max_steps=4)
        returns.append(play(env, demo_policy(env, "random", scripted=None), 9, gif=gif))  # seeded actions
    assert returns[0] == returns[1] and not math.isnan(returns[0]["agent"])

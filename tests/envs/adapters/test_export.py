"""`envs.to_pettingzoo`: vecmarl envs pass PettingZoo's own API and seed tests, and a round trip
through both adapters gives back the wrapped env."""

import warnings

import numpy as np
import pytest
import torch

import envs
from envs.base import MultiAgentEnv
from tests.envs.broken_envs import Counter

pytest.importorskip("pettingzoo")
with warnings.catch_warnings():  # PettingZoo's test module imports its deprecated env modules
    warnings.simplefilter("ignore", DeprecationWarning)
    from pettingzoo.test import parallel_api_test, parallel_seed_test

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::UserWarning")

MAKERS = {
    "navigation": lambda: envs.make("navigation", num_envs=1, seed=0, max_steps=30),
    "counter": lambda: Counter(num_envs=2, seed=0),  # Box and masked Discrete groups; num_envs > 1
    "runners": lambda: envs.make("pettingzoo/tests.envs.pz_toy", num_envs=1, seed=0, lifetimes=(5, 2, 3)),
}


@pytest.mark.parametrize("name", MAKERS)
def test_passes_parallel_api_test(name):
    parallel_api_test(envs.to_pettingzoo(MAKERS[name]()), num_cycles=60)


@pytest.mark.parametrize("name", MAKERS)
def test_passes_parallel_seed_test(name):
    parallel_seed_test(lambda: envs.to_pettingzoo(MAKERS[name]()), num_cycles=60)


@pytest.mark.parametrize("name", MAKERS)
def test_same_seed_same_episodes(name):
    """PettingZoo's seed test stops after one step; this one runs 40 (episodes end and restart)."""
    runs = []
    for _ in range(2):
        par_env = envs.to_pettingzoo(MAKERS[name]())
        spaces = {agent: par_env.action_space(agent) for agent in par_env.possible_agents}
        for i, space in enumerate(spaces.values()):
            space.seed(i)
        trajectory = [par_env.reset(seed=4)[0]]
        for _ in range(40):
            if not par_env.agents:
                trajectory.append(par_env.reset()[0])
            trajectory.append(par_env.step({agent: spaces[agent].sample() for agent in par_env.agents})[:4])
        runs.append(trajectory)
    first, second = _leaves(runs[0]), _leaves(runs[1])
    assert len(first) == len(second)
    for a, b in zip(first, second):
        np.testing.assert_array_equal(a, b)


def _leaves(data):
    if isinstance(data, dict):
        return [leaf for key in sorted(data) for leaf in _leaves(data[key])]
    if isinstance(data, (tuple, list)):
        return [leaf for item in data for leaf in _leaves(item)]
    return [data]


def test_agents_leave_and_the_episode_ends():
    par_env = envs.to_pettingzoo(MAKERS["runners"]())
    par_env.reset(seed=0)
    alive = []
    while par_env.agents:
        _, _, terminations, _, _ = par_env.step({agent: 1 for agent in par_env.agents})
        alive.append(list(par_env.agents))
        assert set(terminations) >= set(par_env.agents)
    assert alive == [["runner_0", "runner_1", "runner_2"], ["runner_0", "runner_2"], ["runner_0"], ["runner_0"], []]
    with pytest.raises(RuntimeError, match="call reset"):
        par_env.step({})


def test_masked_agents_observe_dicts():
    par_env = envs.to_pettingzoo(Counter(num_envs=1, seed=0))
    observations, _ = par_env.reset(seed=0)
    assert set(observations["picker_0"]) == {"observation", "action_mask"}
    assert observations["picker_0"]["action_mask"].tolist() == [1, 1, 0]
    assert par_env.observation_space("picker_0").contains(observations["picker_0"])
    assert par_env.observation_space("mover_0").contains(observations["mover_0"])


def test_round_trip_gives_back_the_wrapped_env():
    mpe2 = pytest.importorskip("mpe2.simple_spread_v3")
    par_env = envs.to_pettingzoo(envs.make("pettingzoo/mpe2.simple_spread_v3", num_envs=1, seed=0))
    raw = mpe2.parallel_env()
    observations, _ = par_env.reset(seed=3)
    raw_observations, _ = raw.reset(seed=3)
    for _ in range(30):
        for agent in raw.agents:
            np.testing.assert_array_equal(observations[agent], raw_observations[agent])
        actions = {agent: (i + len(observations)) % 5 for i, agent in enumerate(par_env.agents)}
        observations, rewards, terminations, truncations, _ = par_env.step(actions)
        raw_observations, raw_rewards, raw_terminations, raw_truncations, _ = raw.step(actions)
        assert rewards == pytest.approx(raw_rewards) and terminations == raw_terminations
        assert truncations == raw_truncations
        if not raw.agents:
            assert not par_env.agents
            break


@pytest.mark.parametrize(
    "actions, match",
    [
        ({"mover_0": [0.5], "mover_1": [0.5]}, r"counter: no action for live agents \['picker_0'\]"),
        (
            {"mover_0": [0.5], "mover_1": [0.5], "picker_0": 1, "ghost": 0},
            r"counter: actions for unknown agents \['ghost'\]; the agents are \['mover_0', 'mover_1', 'picker_0'\]",
        ),
        (
            {"mover_0": [0.5], "mover_1": [0.5], "picker_0": 1.7},
            r"counter: the action of 'picker_0' is 1\.7 \(float64\), expected an integer",
        ),
        (
            {"mover_0": np.zeros(5), "mover_1": [0.5], "picker_0": 1},
            r"counter: the action of 'mover_0' has shape \(5,\), expected \(1,\)",
        ),
        (
            {"mover_0": [0.5], "mover_1": [0.5], "picker_0": [1]},
            r"counter: the action of 'picker_0' has shape \(1,\), expected \(\) \(Discrete\(3\)\)",
        ),
        # The wrapped env checks no values unless made with check_values: these stepped on silently.
        (
            {"mover_0": [0.5], "mover_1": [0.5], "picker_0": 3},
            r"counter: the action of 'picker_0' is 3, outside Discrete\(3\)",
        ),
        ({"mover_0": [0.5], "mover_1": [0.5], "picker_0": -1}, r"the action of 'picker_0' is -1, outside"),
        (
            {"mover_0": [float("nan")], "mover_1": [0.5], "picker_0": 1},
            r"counter: the action of 'mover_0' is \[nan\], expected finite numbers",
        ),
    ],
    ids=[
        "missing",
        "unknown",
        "float-for-discrete",
        "wrong-shape-box",
        "wrong-shape-discrete",
        "discrete-too-large",
        "discrete-negative",
        "nan",
    ],
)
def test_bad_actions_raise_like_pettingzoo_envs(actions, match):
    par_env = envs.to_pettingzoo(Counter(num_envs=1, seed=0))
    par_env.reset(seed=0)
    with pytest.raises(ValueError, match=match):
        par_env.step(actions)


def test_actions_of_agents_that_left_are_ignored():
    """PettingZoo's envs step only the agents in `agents`; extra actions for those that left are fine."""
    runs = []
    for extra in (False, True):
        par_env = envs.to_pettingzoo(MAKERS["runners"]())
        par_env.reset(seed=0)
        trajectory = []
        while par_env.agents:
            agents = par_env.possible_agents if extra else par_env.agents
            trajectory.append(par_env.step({agent: 2 for agent in agents})[:4])
        runs.append(trajectory)
    first, second = _leaves(runs[0]), _leaves(runs[1])
    assert len(first) == len(second) and all(np.array_equal(a, b) for a, b in zip(first, second))


def test_render_after_the_last_step_shows_the_state_it_reached():
    """`render()` after an episode's last step drew the next episode's start: the step auto-reset the env."""
    B, index = 2, 1
    ending, running = (envs.make("navigation", num_envs=B, seed=0, max_steps=m) for m in (3, 100))
    par_env, twin = envs.to_pettingzoo(ending, index), envs.to_pettingzoo(running, index)
    par_env.reset(seed=0), twin.reset(seed=0)
    ending.step_count.copy_(torch.tensor([1, 0]))  # env 0, another of the batch, ends a step before env 1
    spaces = {agent: par_env.action_space(agent) for agent in par_env.possible_agents}
    for i, space in enumerate(spaces.values()):
        space.seed(i)
    for t in range(1, 4):
        actions = {agent: spaces[agent].sample() for agent in par_env.agents}
        observations = par_env.step(actions)[0]
        twin_observations = twin.step(actions)[0]
        assert all(np.array_equal(observations[agent], twin_observations[agent]) for agent in observations)
        assert np.array_equal(par_env.render(), twin.render())  # env 1 as its last action left it
        # env 0 carries on from its reset, env 1 waits for reset()
        assert (ending.step_count.tolist(), par_env.agents == []) == ([[2, 0, 1][t - 1], t], t == 3)


class NoRender(Counter):
    _render = MultiAgentEnv._render  # the base class's: raises NotImplementedError


def assert_render_modes(par_env, modes: list[str]) -> None:
    assert par_env.metadata["render_modes"] == modes
    assert par_env.render_mode == (modes[0] if modes else None)
    par_env.reset(seed=0)
    if modes:
        image = par_env.render()
        assert image.dtype == np.uint8 and image.ndim == 3 and image.shape[2] == 3
    else:
        with pytest.raises(NotImplementedError):
            par_env.render()


def test_render_modes_say_whether_the_env_renders():
    assert_render_modes(envs.to_pettingzoo(Counter(num_envs=1, seed=0)), ["rgb_array"])
    assert_render_modes(envs.to_pettingzoo(NoRender(num_envs=1, seed=0)), [])


def test_pettingzoo_envs_render_when_made_with_render_mode_rgb_array():
    pytest.importorskip("mpe2")
    name = "pettingzoo/mpe2.simple_spread_v3"
    assert_render_modes(envs.to_pettingzoo(envs.make(name, num_envs=1, seed=0)), [])
    made = envs.make(name, num_envs=1, seed=0, render_mode="rgb_array")
    assert_render_modes(envs.to_pettingzoo(made), ["rgb_array"])


def test_vmas_envs_render_where_vmas_can_draw(monkeypatch):
    pytest.importorskip("vmas")
    from envs.adapters import vmas as vmas_adapter

    if vmas_adapter.render_problem() is None:
        assert_render_modes(envs.to_pettingzoo(envs.make("vmas/navigation", num_envs=1, seed=0)), ["rgb_array"])
    monkeypatch.setattr(vmas_adapter, "_egl_devices", lambda: 0)  # neither EGL nor a display: VMAS cannot draw
    monkeypatch.delenv("DISPLAY", raising=False)
    assert_render_modes(envs.to_pettingzoo(envs.make("vmas/navigation", num_envs=1, seed=0)), [])


@pytest.mark.parametrize(
    "index, error, message",
    [
        (2, IndexError, r"index must be in \[0, 2\), got 2"),
        (-1, IndexError, r"index must be in \[0, 2\), got -1"),
        # 1.0 was taken, then reset failed in TensorDict indexing ("only integers, slices ..."); "1" raised
        # "'<=' not supported between instances of 'int' and 'str'"
        (1.0, TypeError, "index must be an int, got float 1.0"),
        ("1", TypeError, "index must be an int, got str '1'"),
        (True, TypeError, "index must be an int, got bool True"),
    ],
)
def test_an_index_outside_the_batch_or_not_an_int_is_refused(index, error, message):
    with pytest.raises(error, match=message):
        envs.to_pettingzoo(Counter(num_envs=2, seed=0), index=index)
    assert envs.to_pettingzoo(Counter(num_envs=2, seed=0), index=np.int64(1)).index == 1

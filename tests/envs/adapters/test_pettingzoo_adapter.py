"""The PettingZoo adapter: conformance, parity with the wrapped envs (resets included), action masks,
agents that leave mid-episode, time limits, and its errors."""

import importlib
import re
import sys
import warnings

import numpy as np
import pytest
import torch

import envs
from tests.envs.adapters import assert_seeding_advice
from tests.envs.caller_reset import steps_without_auto_reset

pytest.importorskip("pettingzoo")
pytest.importorskip("mpe2")
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
TOY = "tests.envs.pz_toy"
COURIERS = "tests.envs.pz_couriers"  # deterministic; couriers leave at a set step and on reaching a goal


@pytest.mark.parametrize(
    "name, options, random_reset",
    [
        ("mpe2.simple_spread_v3", {}, True),
        ("mpe2.simple_tag_v3", {}, True),
        ("mpe2.simple_speaker_listener_v4", {"continuous_actions": True}, True),
        ("pettingzoo.classic.tictactoe_v3", {}, False),  # action masks; every game starts on an empty board
        (TOY, {"lifetimes": (4, 2, 3)}, True),  # agents leave mid-episode
        (COURIERS, {}, False),  # two groups; agents leave at a set step and on a condition
    ],
    ids=["simple_spread", "simple_tag", "simple_speaker_listener-continuous", "tictactoe", "runners", "couriers"],
)
def test_passes_check_env(name, options, random_reset):
    env = envs.make(f"pettingzoo/{name}", num_envs=3, seed=0, max_steps=12, **options)
    envs.check_env(env, random_reset=random_reset)


def raw_copies(name: str, num_envs: int, seed: int, **kwargs):
    """The wrapped env as a user would build it, each copy reset with the adapter's seed."""
    from envs.adapters.pettingzoo import parallel_env

    copies = [parallel_env(importlib.import_module(name), kwargs) for _ in range(num_envs)]
    return copies, [copy.reset(seed=seed + i)[0] for i, copy in enumerate(copies)]


def slots(env):
    return [(g, j, agent) for g, spec in env.groups.items() for j, agent in enumerate(spec.agents)]


def assert_observations(td, env, i: int, observations: dict) -> None:
    for g, j, agent in slots(env):
        if agent not in observations:
            continue
        observation = observations[agent]
        if isinstance(observation, dict):
            mask = observation["action_mask"].astype(bool)
            mask[0] |= not mask.any()  # an agent waiting for its turn may only pick the ignored action 0
            np.testing.assert_array_equal(td[g, "action_mask"][i, j].numpy(), mask)
            observation = observation["observation"]
        np.testing.assert_array_equal(td[g, "observation"][i, j].numpy(), observation.astype(np.float32))


@pytest.mark.parametrize(
    "name, options",
    [
        ("mpe2.simple_spread_v3", {}),
        ("mpe2.simple_tag_v3", {}),
        ("mpe2.simple_speaker_listener_v4", {}),
        ("pettingzoo.classic.tictactoe_v3", {}),
    ],
    ids=["simple_spread", "simple_tag", "simple_speaker_listener", "tictactoe"],
)
def test_equals_the_wrapped_envs(name, options):
    """Same seeds, same actions, 110 steps (four MPE episodes of 25): observations, masks, rewards and
    per-agent flags equal those of the wrapped envs, reset with `reset()` when their episode ends."""
    B, seed = 3, 11
    env = envs.make(f"pettingzoo/{name}", num_envs=B, seed=seed, **options)
    max_cycles = {"max_cycles": env.max_steps} if name.startswith("mpe2") else {}
    copies, observations = raw_copies(name, B, seed, **options, **max_cycles)
    obs = env.reset(seed=seed)
    generator = torch.Generator().manual_seed(0)
    for _ in range(110):
        for i in range(B):
            assert_observations(obs, env, i, observations[i])
        action = env.sample_actions(generator, obs)
        next_td, obs = env.step(action)
        for i, copy in enumerate(copies):
            actions = {a: int(action[g][i, j]) for g, j, a in slots(env) if a in copy.agents}
            observations[i], rewards, terminations, truncations, _ = copy.step(actions)
            assert_observations(next_td, env, i, observations[i])
            for g, j, agent in slots(env):
                assert next_td[g, "reward"][i, j, 0] == np.float32(rewards.get(agent, 0.0))
                assert bool(next_td[g, "terminated"][i, j, 0]) == terminations.get(agent, True)
                assert bool(next_td[g, "truncated"][i, j, 0]) == truncations.get(agent, False)
            assert bool(next_td["done"][i, 0]) == (not copy.agents)
            if not copy.agents:
                observations[i] = copy.reset()[0]


def test_agents_leave_through_per_agent_flags():
    env = envs.make(f"pettingzoo/{TOY}", num_envs=2, seed=0, max_steps=10, lifetimes=(4, 2))
    assert list(env.groups) == ["runner"]
    obs = env.reset(seed=0)
    stay = {"runner": torch.ones(2, 2, dtype=torch.long)}  # action 1: stay in place
    flags = []
    for t in range(1, 5):
        next_td, obs_next = env.step(stay)
        flags.append(next_td["runner", "terminated"][0, :, 0].tolist())
        if t == 3:  # runner_1 left at step 2: no reward, its last observation kept, the env goes on
            assert next_td["runner", "reward"][0, 1, 0] == 0.0
            assert next_td["runner", "observation"][0, 1, 1] == 2.0
            assert not next_td["done"].any()
        obs = obs_next
    assert flags == [[False, False], [False, True], [False, True], [True, True]]
    assert next_td["terminated"].all() and (obs["runner", "observation"][:, :, 1] == 0).all()


def test_a_step_without_auto_reset_leaves_done_envs_as_the_last_action_left_them():
    """As a native env's (`tests/envs/test_base.py`): the adapter resets its copies in the base class's
    auto-reset, which `auto_reset=False` leaves to the caller."""
    auto, manual = (envs.make(f"pettingzoo/{TOY}", num_envs=2, seed=0, max_steps=10, lifetimes=(4, 2)) for _ in "ab")
    for env in (auto, manual):  # env 1 is truncated after 2 steps (a masked reset), env 0 terminated after 4
        env.step_count.copy_(torch.tensor([0, 8]))
    generator = torch.Generator().manual_seed(0)
    actions = [auto.sample_actions(generator) for _ in range(6)]
    for t, next_td in enumerate(steps_without_auto_reset(auto, manual, actions), 1):
        assert next_td["done"][:, 0].tolist() == [t == 4, t in (2, 6)]
        if t == 4:  # copy 0 ended its episode: `manual`'s is still at its end, `auto`'s has begun the next
            assert (manual.copies[0].t, manual.copies[0].agents) == (4, []) and auto.copies[0].t == 0
    assert t == len(actions)


def test_the_couriers_env_passes_pettingzoos_api_test():
    with warnings.catch_warnings():  # PettingZoo's test module imports its deprecated env modules
        warnings.simplefilter("ignore", DeprecationWarning)
        from pettingzoo.test import parallel_api_test, parallel_seed_test
    from tests.envs.pz_couriers import parallel_env

    with warnings.catch_warnings():  # its warnings ("Live agent was not given ...") are failures here
        warnings.simplefilter("error")
        for max_cycles in (3, 40):  # episodes cut by the time limit, and long enough for couriers to leave
            parallel_api_test(parallel_env(max_cycles=max_cycles), num_cycles=max_cycles)
        parallel_seed_test(parallel_env)


def test_departed_agents_follow_the_wrapped_env_step_by_step():
    """The couriers env (two groups; couriers leave at a set step and on reaching a goal) against a plain loop
    over the same PettingZoo envs, 60 steps of random actions on 4 envs (episodes of 8 steps, auto-reset):
    `active` in `next` is whether the agent is still in its episode after the step (one truncated with the
    rest at its end still is), in `obs` whether it acts at the next step (every agent after a reset); a
    departed agent reads reward 0, `terminated`, and the observation PettingZoo last gave it."""
    B = 4
    env = envs.make(f"pettingzoo/{COURIERS}", num_envs=B, seed=0)
    assert all(spec.agents_leave for spec in env.groups.values()) and env.max_steps == 8
    copies, observations = raw_copies(COURIERS, B, 0, max_cycles=8)
    last = [dict(o) for o in observations]  # each agent's last observation, as the adapter keeps it
    obs = env.reset(seed=0)
    generator = torch.Generator().manual_seed(0)
    left, ended_seen = set(), 0  # the agents seen leaving mid-episode; the episodes ended
    for _ in range(60):
        for i, copy in enumerate(copies):
            for g, j, agent in slots(env):
                assert bool(obs[g, "active"][i, j]) == (agent in copy.agents), (i, agent)
            assert_observations(obs, env, i, last[i])
        action = env.sample_actions(generator, obs)
        next_td, obs = env.step(action)
        for i, copy in enumerate(copies):
            actions = {a: int(action[g][i, j]) for g, j, a in slots(env) if a in copy.agents}
            observations, rewards, terminations, truncations, _ = copy.step(actions)
            last[i].update(observations)
            ended = not copy.agents
            for g, j, agent in slots(env):
                still_in = agent in copy.agents or (ended and truncations.get(agent, False))
                assert bool(next_td[g, "active"][i, j]) == still_in, (i, agent)
                assert next_td[g, "reward"][i, j, 0] == np.float32(rewards.get(agent, 0.0)), (i, agent)
                assert bool(next_td[g, "terminated"][i, j, 0]) == (not still_in), (i, agent)
                assert bool(next_td[g, "truncated"][i, j, 0]) == (still_in and ended), (i, agent)
                if not still_in and not ended:
                    left.add(agent)
            assert_observations(next_td, env, i, last[i])
            assert bool(next_td["done"][i, 0]) == ended and bool(next_td["truncated"][i, 0]) == ended
            if ended:  # the adapter reset it: every agent back (checked above), acting from the fresh observation
                ended_seen += 1
                last[i] = dict(copy.reset()[0])
    assert left == {"courier_1", "courier_2"} and ended_seen >= B  # at a set step, on reaching the goal


def test_agents_that_join_after_the_reset_are_refused(monkeypatch):
    """The adapter takes every possible agent as in its episode from the reset until it leaves: an agent missing
    at the reset would have acted (and counted in the losses) on zeros, one that comes back after it left would
    read terminated. Both are refused with the agents named."""
    from tests.envs import pz_couriers

    reset, step = pz_couriers.CouriersEnv.reset, pz_couriers.CouriersEnv.step

    def late_reset(self, seed=None, options=None):
        observations, infos = reset(self, seed, options)
        self.agents.remove("courier_2")
        return {a: o for a, o in observations.items() if a != "courier_2"}, infos

    monkeypatch.setattr(pz_couriers.CouriersEnv, "reset", late_reset)
    with pytest.raises(ValueError, match=r"copy 0 lacks the agents \['courier_2'\] after its reset"):
        envs.make(f"pettingzoo/{COURIERS}", num_envs=2, seed=0)
    monkeypatch.setattr(pz_couriers.CouriersEnv, "reset", reset)

    def returning_step(self, actions):
        result = step(self, actions)
        if self.t == 3:  # courier_1 left at step 2
            self.agents.append("courier_1")
        return result

    monkeypatch.setattr(pz_couriers.CouriersEnv, "step", returning_step)
    env = envs.make(f"pettingzoo/{COURIERS}", num_envs=2, seed=0)
    stay = {"courier": torch.ones(2, 3, dtype=torch.long), "dispatcher": torch.ones(2, 1, dtype=torch.long)}
    env.step(stay), env.step(stay)
    with pytest.raises(ValueError, match=r"copy 0 brought back the agents \['courier_1'\] after they left"):
        env.step(stay)


def test_episode_cut_by_the_env_before_max_steps_is_terminated_with_a_warning():
    env = envs.make(f"pettingzoo/{TOY}", num_envs=1, seed=0, max_steps=5, lifetimes=(9, 9), limit=3)
    stay = {"runner": torch.ones(1, 2, dtype=torch.long)}
    env.step(stay), env.step(stay)
    with pytest.warns(UserWarning, match=r"truncated an episode after 3 steps, before max_steps=5"):
        next_td, _ = env.step(stay)
    assert next_td["terminated"].all() and not next_td["truncated"].any()
    at_limit = envs.make(f"pettingzoo/{TOY}", num_envs=1, seed=0, max_steps=3, lifetimes=(9, 9), limit=3)
    for _ in range(3):
        next_td, _ = at_limit.step(stay)
    assert next_td["truncated"].all() and not next_td["terminated"].any()


def test_max_cycles_follows_max_steps():
    default = envs.make("pettingzoo/mpe2.simple_spread_v3", num_envs=1)
    assert default.max_steps == 25 and default.copies[0].unwrapped.max_cycles == 25
    short = envs.make("pettingzoo/mpe2.simple_spread_v3", num_envs=1, max_steps=10)
    assert short.copies[0].unwrapped.max_cycles == 10
    assert envs.make("pettingzoo/mpe2.simple_spread_v3", num_envs=1, max_cycles=7).max_steps == 7
    with pytest.raises(ValueError, match="max_cycles=7 and max_steps=10 differ"):
        envs.make("pettingzoo/mpe2.simple_spread_v3", num_envs=1, max_cycles=7, max_steps=10)


def test_unknown_module_says_what_a_name_is():
    with pytest.raises(
        KeyError, match=r"cannot import 'mpe2.simple_sprad_v3'.*e\.g\. pettingzoo/mpe2\.simple_spread_v3"
    ):
        envs.make("pettingzoo/mpe2.simple_sprad_v3", num_envs=1)
    with pytest.raises(KeyError, match=r"module 'json' has neither parallel_env\(\) nor env\(\)"):
        envs.make("pettingzoo/json", num_envs=1)
    for name in ("", ".simple_spread_v3", "mpe2..simple_spread_v3", "mpe2/simple_spread_v3"):
        # importlib's own errors were "Empty module name" or a TypeError about relative imports
        with pytest.raises(KeyError, match=rf"{re.escape(repr(name))} is not a module name.*e\.g\. pettingzoo/mpe2"):
            envs.make(f"pettingzoo/{name}", num_envs=1)


def test_missing_pettingzoo_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "pettingzoo", None)
    with pytest.raises(ImportError, match=r'pip install "vecmarl\[pettingzoo\]"'):
        envs.make("pettingzoo/mpe2.simple_spread_v3", num_envs=1)


@pytest.mark.gpu
def test_runs_on_cuda_like_on_cpu():
    cpu = envs.make("pettingzoo/mpe2.simple_spread_v3", num_envs=4, seed=0)
    cuda = envs.make("pettingzoo/mpe2.simple_spread_v3", num_envs=4, seed=0, device="cuda")
    envs.check_env(cuda)
    generator = torch.Generator().manual_seed(0)
    obs_cpu, obs_cuda = cpu.reset(seed=1), cuda.reset(seed=1)
    for _ in range(30):
        action = cpu.sample_actions(generator)
        (next_cpu, obs_cpu), (next_cuda, obs_cuda) = cpu.step(action), cuda.step(action.to("cuda"))
        assert (next_cpu == next_cuda.cpu()).all() and (obs_cpu == obs_cuda.cpu()).all()


def test_state_dict_says_the_wrapped_envs_state_is_not_saved():
    """The base class would save only the adapter's tensors, not the PettingZoo copies: a restored env
    would continue from another simulator state. The trainer catches NotImplementedError."""
    env = envs.make("pettingzoo/mpe2.simple_spread_v3", num_envs=2, seed=0)
    with pytest.raises(
        NotImplementedError, match=r"pettingzoo/mpe2\.simple_spread_v3: state_dict\(\).*PettingZoo envs"
    ):
        env.state_dict()
    with pytest.raises(NotImplementedError, match=r"load_state_dict\(\) is not supported.*PettingZoo envs"):
        env.load_state_dict({"tensors": {}})


@pytest.mark.parametrize(
    "options, match, cause",
    [
        (
            {"M_": 3},
            r"pettingzoo/mpe2\.simple_spread_v3: building the wrapped env with kwargs \{'M_': 3, 'max_cycles': 25\} "
            r"failed \(TypeError: .*'M_'\); the env's keyword arguments are: N, local_ratio, max_cycles",
            TypeError,
        ),
        (
            {"N": 0},
            r"pettingzoo/mpe2\.simple_spread_v3: building the wrapped env with kwargs \{'N': 0, 'max_cycles': 25\} "
            r"failed \(ValueError: zero-size array",
            ValueError,
        ),
    ],
    ids=["unknown-kwarg", "no-agents"],
)
def test_errors_of_the_wrapped_env_name_it(options, match, cause):
    with pytest.raises(ValueError, match=match) as info:
        envs.make("pettingzoo/mpe2.simple_spread_v3", num_envs=2, seed=0, **options)
    assert isinstance(info.value.__cause__, cause)


def test_errors_of_the_first_reset_name_the_env(monkeypatch):
    from tests.envs import pz_toy

    def broken_reset(self, seed=None, options=None):
        raise RuntimeError("no start position")

    monkeypatch.setattr(pz_toy.RunnersEnv, "reset", broken_reset)
    with pytest.raises(
        ValueError,
        match=r"pettingzoo/tests\.envs\.pz_toy: resetting the wrapped env with kwargs \{'lifetimes': \(2, 3\)\} "
        r"failed \(RuntimeError: no start position\)",
    ):
        envs.make(f"pettingzoo/{TOY}", num_envs=2, seed=0, lifetimes=(2, 3))


@pytest.mark.parametrize("seed", [-1, True, 1.5, "0"])
def test_bad_seed_is_a_clear_error(seed):
    with pytest.raises(ValueError, match=r"pettingzoo/mpe2\.simple_spread_v3: seed must be a non-negative int"):
        envs.make("pettingzoo/mpe2.simple_spread_v3", num_envs=2, seed=seed)
    env = envs.make("pettingzoo/mpe2.simple_spread_v3", num_envs=2, seed=0)
    with pytest.raises(ValueError, match=r"pettingzoo/mpe2\.simple_spread_v3: seed must be a non-negative int"):
        env.reset(seed=seed)


def test_accepts_actions_that_require_grad():
    """Continuous actions straight from a policy require grad; native and VMAS envs accept them."""
    env = envs.make("pettingzoo/mpe2.simple_speaker_listener_v4", num_envs=2, seed=0, continuous_actions=True)
    plain = env.sample_actions(torch.Generator().manual_seed(0))
    action = {group: plain[group].clone().requires_grad_() for group in env.groups}
    next_td, _ = env.step(action)
    twin = envs.make("pettingzoo/mpe2.simple_speaker_listener_v4", num_envs=2, seed=0, continuous_actions=True)
    assert (next_td == twin.step(plain)[0]).all()


def test_actions_the_wrapped_env_refuses_name_the_env_and_copy():
    env = envs.make("pettingzoo/mpe2.simple_spread_v3", num_envs=2, seed=0)
    action = env.sample_actions(torch.Generator().manual_seed(0))
    action["agent"][1, 0] = 99  # outside Discrete(5): without check_values, MPE's own assert refuses it
    with pytest.raises(ValueError, match=r"^pettingzoo/mpe2\.simple_spread_v3: copy 1 refused the actions .*99"):
        env.step(action)


def test_a_box_action_of_integers_is_refused_when_the_env_is_made(monkeypatch):
    # It was taken as a float Box: the env refused the first step's actions ("... not in Box(0, 5, (2,), int64)").
    from gymnasium import spaces

    from tests.envs import pz_toy

    monkeypatch.setattr(pz_toy.RunnersEnv, "action_space", lambda self, agent: spaces.Box(0, 5, (2,), np.int64))
    with pytest.raises(TypeError, match=r"'runner_0' has a Box\(0, 5, \(2,\), int64\) action space of int64 numbers"):
        envs.make(f"pettingzoo/{TOY}", num_envs=2, seed=0)


def test_an_action_mask_of_another_size_than_the_actions_is_refused_when_the_env_is_made(monkeypatch):
    # It failed at the first reset as "resetting the wrapped env ... failed (ValueError: could not broadcast
    # input array from shape (4,) into shape (3,))", blaming the env's reset.
    from gymnasium import spaces

    from tests.envs import pz_toy

    masked = spaces.Dict({"observation": spaces.Box(-1, 1, (2,)), "action_mask": spaces.Box(0, 1, (4,), np.int8)})
    monkeypatch.setattr(pz_toy.RunnersEnv, "observation_space", lambda self, agent: masked)
    with pytest.raises(
        TypeError,
        match=r"'runner_0' observes an action_mask of shape \(4,\) but has a Discrete\(3\) action space; expected "
        r"one entry per action, shape \(3,\)",
    ):
        envs.make(f"pettingzoo/{TOY}", num_envs=2, seed=0)


def test_a_seeding_failure_says_what_an_adapter_user_can_do():
    # It told the user to draw from self.rng and fix _reset: the adapter's names, not the wrapped env's.
    env = envs.make(f"pettingzoo/{TOY}", num_envs=2, seed=0, max_steps=10, lifetimes=(9, 9), seeded=False)
    advice = r"the adapter resets copy i with reset\(seed=seed \+ i\).*draw every random number from the generator "
    assert_seeding_advice(env, advice + r"reset\(seed\) seeds \(self\.np_random")


@pytest.mark.parametrize("given", [{}, {"render_mode": "human"}], ids=["no-render-mode", "human"])
def test_made_to_render_the_copies_draw_in_rgb_array_mode(given, monkeypatch):
    # A run trained without render_mode='rgb_array' could not be drawn: marl eval --render told the user to train
    # again. make(render=True) asks for it, in place of "human", which would open a window.
    import pygame

    monkeypatch.setattr(pygame.display, "set_mode", lambda *args, **kwargs: pytest.fail("a window was opened"))
    env = envs.make("pettingzoo/mpe2.simple_spread_v3", num_envs=2, seed=0, max_steps=3, render=True, **given)
    assert env.renders and env.config.env_kwargs["render_mode"] == "rgb_array"
    env.reset()
    env.step(env.sample_actions())
    frame = env.render(1)
    assert frame.dtype == np.uint8 and frame.ndim == 3 and frame.shape[-1] == 3 and frame.min() < frame.max()


def test_made_to_render_or_not_the_episodes_are_the_same():
    runs = []
    for render in (False, True):
        env = envs.make("pettingzoo/mpe2.simple_spread_v3", num_envs=2, seed=0, max_steps=4, render=render)
        steps = [env.reset()["agent", "observation"]]
        for t in range(5):  # through an auto-reset
            if render:
                env.render(0)
            next_data, obs = env.step(env.sample_actions(torch.Generator().manual_seed(t)))
            steps += [next_data["agent", "reward"], obs["agent", "observation"]]
        runs.append(steps)
    for without, drawn in zip(*runs):
        torch.testing.assert_close(without, drawn, rtol=0, atol=0)


@pytest.mark.parametrize(
    "metadata, listed",
    [
        ({"name": "runners_v0"}, "lists no render_modes"),
        ({"render_modes": ["ansi"]}, r"lists only the render_modes \['ansi'\]"),
    ],
    ids=["none", "ansi"],
)
def test_an_env_that_cannot_draw_rgb_arrays_is_refused_before_it_is_built(metadata, listed, monkeypatch):
    toy = importlib.import_module(TOY)
    monkeypatch.setattr(toy.RunnersEnv, "metadata", metadata)
    monkeypatch.setattr(toy, "parallel_env", lambda **kwargs: pytest.fail("built"))
    with pytest.raises(NotImplementedError, match=rf"^pettingzoo/{TOY} cannot draw frames: its metadata {listed}, and"):
        envs.make(f"pettingzoo/{TOY}", num_envs=2, seed=0, render=True)


def test_a_render_that_gives_no_image_names_the_env(monkeypatch):
    env = envs.make("pettingzoo/mpe2.simple_spread_v3", num_envs=2, seed=0, render=True)
    env.reset()
    monkeypatch.setattr(env.copies[0], "render", lambda: None)
    with pytest.raises(NotImplementedError, match=r"simple_spread_v3: the wrapped env's render\(\) returned NoneType"):
        env.render(0)


def test_native_envs_ignore_the_request_to_render():
    env = envs.make("spread", num_envs=2, seed=0, render=True)
    assert env.renders and env.config == envs.make("spread", num_envs=2, seed=0).config

"""The VMAS adapter: conformance, parity with raw VMAS (resets included), the batched masked reset
against VMAS's own `reset_at`, and its errors."""

import re
import subprocess
import sys

import numpy as np
import pytest
import torch

import envs
from envs.adapters import vmas as vmas_adapter
from tests.envs.adapters import assert_seeding_advice
from tests.envs.caller_reset import steps_without_auto_reset
from tests.envs.row_invariant_random import RowInvariantRandom

vmas = pytest.importorskip("vmas")
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::UserWarning")


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """VMAS steps are many tiny ops: a second intra-op thread only adds synchronisation, and stalls
    when the cores are shared (the module runs 2-3x faster on one thread on a busy 2-core machine)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.mark.parametrize(
    "scenario, options",
    [
        ("navigation", {"n_agents": 3}),
        ("balance", {}),
        ("simple_tag", {"continuous_actions": False}),  # discrete; two agent types, different observations
        ("simple_spread", {"continuous_actions": False, "multidiscrete_actions": True}),
        # Draws observation noise at every step: a masked reset drawing from the same stream changed the
        # noise of the envs it left alone.
        ("asym_joint", {}),
    ],
    ids=["navigation", "balance", "simple_tag-discrete", "simple_spread-multidiscrete", "asym_joint"],
)
def test_passes_check_env(scenario, options):
    envs.check_env(envs.make(f"vmas/{scenario}", num_envs=4, seed=0, max_steps=8, **options))


def test_groups_by_type_and_maps_action_spaces():
    env = envs.make("vmas/simple_tag", num_envs=2, seed=0, continuous_actions=False)
    assert {g: s.agents for g, s in env.groups.items()} == {
        "adversary": ("adversary_0", "adversary_1", "adversary_2"),
        "agent": ("agent_0",),
    }
    assert env.groups["adversary"].observation.shape == (16,) and env.groups["agent"].observation.shape == (14,)
    assert env.groups["agent"].action == envs.Discrete(9)  # VMAS: 3 choices per axis
    continuous = envs.make("vmas/simple_speaker_listener", num_envs=2, seed=0)
    # VMAS's speaker: 2 force dims in [-1, 1] (it cannot move, but has them) and 3 communication dims in [0, 1]
    assert continuous.groups["speaker"].action == envs.Box((5,), (-1.0, -1.0, 0.0, 0.0, 0.0), 1.0)
    assert continuous.groups["listener"].action == envs.Box((2,), -1.0, 1.0)


def raw_actions(actions: dict, env) -> list[torch.Tensor]:
    """`{group: [B, n, ...]}` -> VMAS's per-agent list, in VMAS's agent order."""
    by_name = {a: actions[g][:, j] for g, s in env.groups.items() for j, a in enumerate(s.agents)}
    return [by_name[agent.name] for agent in env.vmas_env.agents]


def stacked(per_agent: list, env, group: str) -> torch.Tensor:
    names = [agent.name for agent in env.vmas_env.agents]
    return torch.stack([per_agent[names.index(a)] for a in env.groups[group].agents], 1)


def test_info_keys_of_mixed_shapes_are_grouped_like_a_per_key_stack():
    """Scalar and vector keys together, a key one agent lacks and a non-tensor value: each kept key
    equals the stack of its agents' values, [B, n, 1] for a scalar; the others are dropped."""
    env = envs.make("vmas/navigation", num_envs=4, seed=0, n_agents=3)
    g = torch.Generator().manual_seed(0)
    infos = [
        {
            "a": torch.rand(4, generator=g),
            "vec": torch.rand(4, 2, generator=g),
            "b": torch.rand(4, generator=g),
            "partial": torch.rand(4, generator=g),
            "name": "x",
        }
        for _ in range(3)
    ]
    del infos[1]["partial"]
    for _ in range(2):  # the first call chooses the keys, the second reuses them
        grouped = env._info_by_group(infos)["agent"]
        assert sorted(grouped) == ["a", "b", "vec"]
        for key in ("a", "b"):
            assert torch.equal(grouped[key], torch.stack([info[key] for info in infos], 1).unsqueeze(-1))
        assert torch.equal(grouped["vec"], torch.stack([info["vec"] for info in infos], 1))
        infos = [{k: v + 1 if isinstance(v, torch.Tensor) else v for k, v in info.items()} for info in infos]


@pytest.mark.parametrize(
    "scenario, options",
    [("navigation", {"n_agents": 3}), ("simple_tag", {"continuous_actions": False})],
    ids=["navigation", "simple_tag-discrete"],
)
def test_equals_raw_vmas_over_episodes(scenario, options):
    """Same seed, same actions: 120 steps, four episodes of 30, reset by VMAS's `reset()` on the raw side."""
    B, max_steps = 6, 30
    env = envs.make(f"vmas/{scenario}", num_envs=B, seed=3, max_steps=max_steps, **options)
    raw = vmas.make_env(scenario, num_envs=B, seed=3, **options)
    obs = env.reset(seed=5)
    raw_obs = raw.reset(seed=5)
    generator = torch.Generator().manual_seed(0)
    t = 0
    for _ in range(120):
        for g in env.groups:
            torch.testing.assert_close(obs[g, "observation"], stacked(raw_obs, env, g), rtol=0, atol=0)
        action = env.sample_actions(generator)
        next_td, obs = env.step(action)
        raw_obs, raw_reward, raw_done, raw_info = raw.step(raw_actions(action, env))
        t += 1
        for g in env.groups:
            torch.testing.assert_close(next_td[g, "observation"], stacked(raw_obs, env, g), rtol=0, atol=0)
            torch.testing.assert_close(next_td[g, "reward"][..., 0], stacked(raw_reward, env, g), rtol=0, atol=0)
            info = next_td[g]["info"] if "info" in next_td[g].keys() else {}
            for key, value in info.items():
                expected = stacked([info[key] for info in raw_info], env, g)
                torch.testing.assert_close(value, expected.reshape(value.shape), rtol=0, atol=0)
        assert torch.equal(next_td["terminated"][:, 0], raw_done)
        assert torch.equal(next_td["truncated"][:, 0], ~raw_done & (t >= max_steps))
        finished = raw_done | (t >= max_steps)
        if bool(finished.any()):
            assert bool(finished.all()), "random actions should not end an episode early"
            raw_obs, t = raw.reset(), 0


@pytest.mark.parametrize(
    "scenario, options",
    [("navigation", {"n_agents": 3}), ("transport", {}), ("balance", {}), ("football", {})],
    ids=["navigation", "transport", "balance", "football"],
)
def test_masked_reset_equals_vmas_reset_at(scenario, options):
    """Envs 1, 3, 4 reset by the adapter's batched copy and by VMAS's `reset_at(i)`, with random draws
    that give every env the same numbers: then the two worlds must match, now and for 20 steps on
    (which would show any state the copy missed, e.g. reward shaping buffers, or football's scripted
    red team, whose targets live in dicts keyed by agent and in classes of the scenario's own file)."""
    B, mask = 5, torch.tensor([False, True, False, True, True])
    env = envs.make(f"vmas/{scenario}", num_envs=B, seed=0, max_steps=1000, **options)
    raw = vmas.make_env(scenario, num_envs=B, seed=0, **options)
    generator = torch.Generator().manual_seed(1)
    actions = [env.sample_actions(generator) for _ in range(25)]
    for action in actions[:5]:
        env.step(action)
        raw.step(raw_actions(action, env))

    with RowInvariantRandom(B, seed=7):
        obs = env.reset(mask=mask)
    for index in mask.nonzero()[:, 0].tolist():
        with RowInvariantRandom(B, seed=7):
            raw.reset_at(index)
    (raw_obs,) = raw.get_from_scenario(get_observations=True, get_rewards=False, get_infos=False, get_dones=False)
    for g in env.groups:
        torch.testing.assert_close(obs[g, "observation"], stacked(raw_obs, env, g), rtol=0, atol=0)
    for action in actions[5:]:
        next_td, _ = env.step(action)
        raw_obs, raw_reward, raw_done, _ = raw.step(raw_actions(action, env))
        for g in env.groups:
            torch.testing.assert_close(next_td[g, "observation"], stacked(raw_obs, env, g), rtol=0, atol=0)
            torch.testing.assert_close(next_td[g, "reward"][..., 0], stacked(raw_reward, env, g), rtol=0, atol=0)
        assert torch.equal(next_td["terminated"][:, 0], raw_done)


def test_a_step_without_auto_reset_leaves_done_envs_as_the_last_action_left_them():
    """As a native env's (`tests/envs/test_base.py`): the adapter's reset, masked or full, is the base
    class's auto-reset, which `auto_reset=False` leaves to the caller."""
    B = 3
    auto, manual, long = (
        envs.make("vmas/navigation", num_envs=B, seed=0, n_agents=2, max_steps=m) for m in (3, 3, 100)
    )
    for env in (auto, manual):  # env 1 ends a step before envs 0 and 2: masked resets
        env.step_count.copy_(torch.tensor([0, 1, 0]))
    generator = torch.Generator().manual_seed(0)
    actions = [auto.sample_actions(generator) for _ in range(7)]

    def positions(env) -> torch.Tensor:  # [n, 2] env 0's agents
        return torch.stack([agent.state.pos[0] for agent in env.vmas_env.agents])

    for t, (next_td, action) in enumerate(zip(steps_without_auto_reset(auto, manual, actions), actions), 1):
        assert next_td["done"][:, 0].tolist() == [t % 3 == 0, t % 3 == 2, t % 3 == 0]
        if t <= 3:  # env 0's first episode
            long.step(action)
            assert torch.equal(positions(manual), positions(long))
            if vmas_adapter.render_problem() is None:
                assert np.array_equal(manual.render(0), long.render(0))
        if t == 3:  # `auto` has begun env 0's next episode, `manual` not yet
            assert not torch.equal(positions(auto), positions(long))
    assert t == len(actions)


def test_returns_ordinary_tensors():
    """VMAS runs under inference mode inside the adapter; what it hands on must not be inference
    tensors, which autograd could not save and in-place ops outside inference mode could not change."""
    env = envs.make("vmas/navigation", num_envs=3, seed=0, max_steps=2, n_agents=2)
    generator = torch.Generator().manual_seed(0)
    outputs = [env.reset()]
    for _ in range(3):  # the second step ends every episode: a reset inside `step`
        outputs.extend(env.step(env.sample_actions(generator)))
    outputs.append(env.reset(mask=torch.tensor([True, False, True])))  # the masked copy
    outputs.extend(env.step(env.sample_actions(generator)))
    tensors = [t for td in outputs for t in td.values(include_nested=True, leaves_only=True)]
    assert tensors and not [t.shape for t in tensors if t.is_inference()]
    weight = torch.ones(env.groups["agent"].observation.shape[0], requires_grad=True)
    (outputs[-1]["agent", "observation"] @ weight).sum().backward()  # saves the observation for backward
    outputs[-2]["terminated"].logical_not_()  # the last step's next data


drawable = pytest.mark.skipif(vmas_adapter.render_problem() is not None, reason="VMAS cannot draw here")


@drawable
def test_render_gives_vmas_own_frames():
    """Env 1's frames equal those VMAS's own `render(mode="rgb_array", env_index=1)` draws of a raw env
    given the same seed and actions, and change as the agents move."""
    action = {"agent": torch.ones(2, 2, 2)}  # full force along +x, +y: every agent moves

    def frames(render, step) -> list[np.ndarray]:
        out = []
        for _ in range(3):
            out.append(render())
            step()
        return out

    env = envs.make("vmas/navigation", num_envs=2, seed=3, n_agents=2)
    raw = vmas.make_env("navigation", num_envs=2, seed=3, n_agents=2)
    # Each env drawn alone: VMAS draws right only while no other env draws in between (see the next test).
    expected = frames(lambda: raw.render(mode="rgb_array", env_index=1), lambda: raw.step(raw_actions(action, env)))
    assert env.renders
    got = frames(lambda: env.render(1), lambda: env.step(action))
    for frame, own in zip(got, expected):
        assert isinstance(frame, np.ndarray) and frame.dtype == np.uint8 and frame.shape[2:] == (3,)
        assert np.array_equal(frame, own)
    assert not np.array_equal(got[0], got[1]) and not np.array_equal(got[1], got[2])


@drawable
def test_render_is_not_drawn_over_by_another_env():
    """VMAS clears whichever OpenGL context is current before switching to its own: after another env
    drew, raw VMAS draws the frame over its last one (translucent agents look opaque). The adapter's
    frame of an unchanged env is the same before and after another env draws."""
    a = envs.make("vmas/navigation", num_envs=2, seed=3, n_agents=2)
    b = envs.make("vmas/navigation", num_envs=2, seed=4, n_agents=2)
    a.render(0)
    before = a.render(0)
    b.render(0)
    assert np.array_equal(a.render(0), before)


@drawable
def test_a_frame_vmas_fails_to_draw_names_the_scenario_and_the_cause(monkeypatch):
    """As VMAS's sampling scenario, whose colour map uses matplotlib.cm.get_cmap (gone in matplotlib 3.9):
    the error was an AttributeError from deep in VMAS."""
    env = envs.make("vmas/navigation", num_envs=2, seed=0)

    def extra_render(env_index):
        raise AttributeError("module 'matplotlib.cm' has no attribute 'get_cmap'")

    monkeypatch.setattr(env.vmas_env.scenario, "extra_render", extra_render)
    with pytest.raises(RuntimeError, match=r"^vmas/navigation: VMAS failed to draw a frame: AttributeError: module "):
        env.render(0)


@pytest.mark.parametrize("devices, egl", [(0, "EGL lists none"), (None, "libEGL cannot be loaded")])
def test_render_without_egl_or_display_says_what_is_needed(monkeypatch, devices, egl):
    env = envs.make("vmas/navigation", num_envs=2, seed=0)
    monkeypatch.setattr(vmas_adapter, "_egl_devices", lambda: devices)
    monkeypatch.setenv("DISPLAY", ":99")  # VMAS draws in a window there
    assert env.renders
    monkeypatch.delenv("DISPLAY")
    assert not env.renders
    with pytest.raises(NotImplementedError) as error:
        env.render(0)
    assert str(error.value) == (
        f"vmas/navigation cannot render on this machine: VMAS draws headless only where EGL lists a device, and "
        f"here {egl}, nor is there an X display (DISPLAY is not set): install EGL (on Debian or Ubuntu: "
        "apt-get install libegl1 libegl-mesa0 libgl1 libglu1-mesa; Mesa's is a software device, a GPU driver has "
        "its own), or run under a virtual display (xvfb-run -s '-screen 0 1400x900x24' COMMAND)"
    )


def test_adapters_keep_their_own_random_streams():
    """Two adapters with one seed, stepped in turn with torch's global generator used in between,
    give the trajectory of one adapter alone."""

    def starts(interleave: bool) -> list[torch.Tensor]:
        a = envs.make("vmas/navigation", num_envs=3, seed=0, max_steps=2)
        b = envs.make("vmas/navigation", num_envs=3, seed=0, max_steps=2) if interleave else None
        action = {"agent": torch.zeros(3, 4, 2)}
        out = []
        for _ in range(4):
            out.append(a.step(action)[1]["agent", "observation"])
            if b is not None:
                b.step(action)
                torch.rand(5)
        return out

    for alone, interleaved in zip(starts(False), starts(True)):
        assert torch.equal(alone, interleaved)


@pytest.mark.parametrize(
    "scenario, options",
    [
        ("navigation", {"n_agents": 3}),
        ("balance", {}),
        ("transport", {}),
        ("wheel", {}),
        ("simple_tag", {"continuous_actions": False}),
        ("flocking", {}),
        ("dispersion", {}),
        ("football", {}),  # a scripted red team, whose targets live in dicts keyed by agent
        ("simple_speaker_listener", {}),  # the goal: a landmark picked for the whole batch, and its colour
        ("simple_push", {}),
    ],
    ids=lambda value: value if isinstance(value, str) else "",
)
def test_a_saved_state_loaded_into_an_env_of_another_seed_steps_on_identically(scenario, options):
    """Through torch.save and torch.load(weights_only=True), past full and masked resets: what a resumed
    run's env does (the trainer saves and loads it as a native env's)."""
    import io

    saved, restored = (envs.make(f"vmas/{scenario}", num_envs=3, seed=s, max_steps=4, **options) for s in (0, 9))
    generator = torch.Generator().manual_seed(1)
    for t in range(3):
        saved.step(saved.sample_actions(generator))
        if t == 0:
            saved.reset(mask=torch.tensor([False, True, False]))  # the envs' episodes end apart from here
    buffer = io.BytesIO()
    torch.save(saved.state_dict(), buffer)
    buffer.seek(0)
    restored.load_state_dict(torch.load(buffer, weights_only=True))
    for _ in range(7):
        action = saved.sample_actions(generator)
        for expected, got in zip(saved.step(action), restored.step(action)):
            for key, value in expected.items(True, True):
                torch.testing.assert_close(got[key], value, rtol=0, atol=0, equal_nan=True, msg=str(key))


def test_a_scenario_whose_state_does_not_restore_refuses_state_dict_and_says_why(monkeypatch):
    """Here the adapter misses the goal of simple_speaker_listener, a landmark object the scenario picks for the
    whole batch (as it misses what road_traffic keeps). The check runs once per scenario and options."""
    checks, check, paths = [], vmas_adapter.restore_problem, vmas_adapter.world_paths
    monkeypatch.setattr(vmas_adapter, "_RESTORE_PROBLEMS", {})
    monkeypatch.setattr(vmas_adapter, "restore_problem", lambda *args: checks.append(args) or check(*args))
    monkeypatch.setattr(vmas_adapter, "world_paths", lambda scenario: (paths(scenario)[0], []))
    env = envs.make("vmas/simple_speaker_listener", num_envs=2, seed=0)
    said = (
        r"^vmas/simple_speaker_listener keeps state that the adapter cannot save: restored into another env, its "
        r"state did not repeat the steps that followed \(next/speaker/observation differed\)$"
    )
    with pytest.raises(NotImplementedError, match=said):
        env.state_dict()
    with pytest.raises(NotImplementedError, match=said):
        envs.make("vmas/simple_speaker_listener", num_envs=4, seed=1).state_dict()
    assert len(checks) == 1
    envs.make("vmas/simple_speaker_listener", num_envs=2, seed=0, continuous_actions=False).state_problem()
    assert len(checks) == 2  # other options: checked again


def test_a_world_whose_objects_depend_on_the_seed_is_not_restored():
    """ball_passage places a random set of passages: another seed's world has other objects, which the
    saved paths' names show, so its state is not loaded into it."""
    problem = envs.make("vmas/ball_passage", num_envs=2, seed=0).state_problem()
    assert problem.startswith("vmas/ball_passage: its state could not be saved and restored (ValueError: the saved")
    assert "does not fit this one ('passages_to_place'/" in problem


def test_unknown_scenario_lists_where_names_are():
    with pytest.raises(KeyError, match=r"unknown VMAS scenario 'navigatoin'.*vmas\.scenarios.*navigation"):
        envs.make("vmas/navigatoin", num_envs=2)


def test_unused_scenario_option_is_an_error():
    with pytest.raises(TypeError, match=r"vmas/navigation: Scenario kwargs: \{'n_agnts': 3\} passed but not used"):
        envs.make("vmas/navigation", num_envs=2, n_agnts=3)


@pytest.mark.parametrize(
    "value, error",
    [
        (0, r"AssertionError \(no message\) at vmas/scenarios/balance\.py:\d+$"),  # a bare assert
        ("three", r"TypeError: '>' not supported between .* \(at vmas/scenarios/balance\.py:\d+\)$"),
    ],
    ids=["bare-assert", "bad-type"],
)
def test_options_the_scenario_rejects_name_the_env_options_and_error(value, error):
    options = re.escape(repr({"n_agents": value}))
    with pytest.raises(
        ValueError, match=rf"^vmas/balance: the scenario rejected its options {options}: {error}"
    ) as info:
        envs.make("vmas/balance", num_envs=2, n_agents=value)
    assert isinstance(info.value.__cause__, (AssertionError, TypeError))


@pytest.mark.parametrize(
    "option, message",
    [
        ("n_agents=0", r"vmas/balance: the scenario rejected its options \{'n_agents': 0\}: AssertionError"),
        ("continuous_actions=false", r"write continuous_actions=False, not continuous_actions=false"),
    ],
)
def test_bad_options_on_the_command_line_are_one_line_errors(option, message, tmp_path, capsys):
    from marl.app.cli import main

    argv = ["train", "--env", "vmas/balance", "--env-option", option, "--num-envs", "2", "--minibatch-size", "32"]
    assert main([*argv, "--log-dir", str(tmp_path), "--no-tensorboard", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("marl train: error: ")
    assert re.search(message, err) and "Traceback" not in err


def test_option_errors_list_only_what_the_user_can_pass():
    """`scenario` and `scenario_kwargs` are set from the env's name and the other keywords: not listed as
    options, and passing them is an error that says so (not Python's "got multiple values")."""
    with pytest.raises(TypeError) as info:
        envs.make("vmas/balance", num_envs=2, continuous_actions="false")
    message, listing = str(info.value).split("valid options are:")
    assert "has type str, expected bool (values are read as Python literals: write continuous_actions=False" in message
    assert [line.split(":")[0].strip() for line in listing.strip().splitlines()] == [
        "max_steps",
        "continuous_actions",
        "multidiscrete_actions",
    ]
    for name, value in (("scenario", "navigation"), ("scenario_kwargs", {"n_agents": 3})):
        with pytest.raises(TypeError, match=rf"vmas/balance: \['{name}'\] are not options: the env's name gives"):
            envs.make("vmas/balance", num_envs=2, **{name: value})


def test_vmas_environment_arguments_are_refused():
    with pytest.raises(TypeError, match=r"\['dict_spaces'\] are arguments of vmas.make_env that the adapter sets"):
        envs.make("vmas/navigation", num_envs=2, dict_spaces=True)


def test_missing_vmas_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "vmas", None)
    with pytest.raises(ImportError, match=r'pip install "vecmarl\[vmas\]"'):
        envs.make("vmas/navigation", num_envs=2)


def test_compile_is_refused():
    with pytest.raises(ValueError, match="compile=True is not supported"):
        envs.make("vmas/navigation", num_envs=2, compile=True)


def test_importing_envs_imports_no_simulator():
    code = "import sys, envs; print(sorted(m for m in ('vmas', 'pettingzoo', 'gymnasium') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.gpu
def test_passes_check_env_on_cuda():
    envs.check_env(envs.make("vmas/navigation", num_envs=8, device="cuda", seed=0, max_steps=8))


def test_actions_vmas_refuses_are_a_clear_error_without_value_checks():
    """Without check_values the adapter passes values on unchecked; VMAS's bare asserts on them become
    an error that names the env, where VMAS refused, and how to have the value named."""
    env = envs.make("vmas/balance", num_envs=2, seed=0)
    action = env.sample_actions(torch.Generator().manual_seed(0))
    action["agent"][0, 0, 0] = float("nan")
    with pytest.raises(
        ValueError, match=r"^vmas/balance: VMAS refused the actions: AssertionError .*check_values=True"
    ):
        env.step(action)
    checked = envs.make("vmas/balance", num_envs=2, seed=0, check_values=True)
    with pytest.raises(ValueError, match=r"action for group 'agent' contains NaN"):
        checked.step(action)


def test_seeds_vmas_cannot_take_are_refused_before_vmas_is_seeded():
    """VMAS holds one random stream per batch: several members' seeds are refused naming the env, and a bad
    `reset(seed=...)` leaves VMAS's stream as it was (it used to be re-seeded with `int(1.5)` first)."""
    with pytest.raises(ValueError, match=r"vmas/navigation: seed must be one int, got \(1, 2\)"):
        envs.make("vmas/navigation", num_envs=4, seed=(1, 2))
    env = envs.make("vmas/navigation", num_envs=2, seed=0)
    twin = envs.make("vmas/navigation", num_envs=2, seed=0)
    with pytest.raises(TypeError, match="seed must be an int"):
        env.reset(seed=1.5)
    with pytest.raises(ValueError, match=r"reset\(seed=\(1, 2\)\) does not fit the env's seed 0: expected one int"):
        env.reset(seed=(1, 2))
    assert env.seed == 0
    assert torch.equal(env.reset()["agent", "observation"], twin.reset()["agent", "observation"])


def test_a_seeding_failure_says_what_an_adapter_user_can_do():
    # It told the user to draw from self.rng and fix _reset: names of a native env, not of VMAS's scenario.
    env = envs.make("vmas/navigation", num_envs=2, seed=0, max_steps=8)
    scenario, private = env.vmas_env.scenario, torch.Generator().manual_seed(0)  # a stream no seed sets
    reset_world_at = scenario.reset_world_at

    def reset_from_a_private_stream(env_index=None):
        reset_world_at(env_index)
        for agent in scenario.world.agents:
            agent.state.pos += torch.rand(agent.state.pos.shape, generator=private)

    scenario.reset_world_at = reset_from_a_private_stream
    advice = (
        r"VMAS seeds torch's, numpy's and Python's global generators.*report it to vecmarl with the scenario's name"
    )
    assert_seeding_advice(env, advice)

"""The base class's argument checks, auto-reset and flags, on the toy env and on navigation."""

import dataclasses
import functools
import re

import numpy as np
import pytest
import torch
from tensordict import TensorDict

import envs
from envs import registry
from envs.base import EnvOutputError
from tests.envs.broken_envs import (
    Counter,
    CounterConfig,
    InfObservation,
    NanRewardAtStep3,
    PerEnvReward,
    SharedAgentNames,
    WrongDtype,
    WrongShape,
)
from tests.envs.caller_reset import steps_without_auto_reset


def make(**kwargs):
    return Counter(num_envs=4, seed=0, **kwargs)


def good_action(env):
    return {
        "mover": torch.zeros(env.num_envs, env.config.n_agents, 1),
        "picker": torch.zeros(env.num_envs, 1, dtype=torch.long),
    }


@pytest.mark.parametrize("num_envs", [0, -3, 2.5, True])
def test_num_envs_must_be_positive_int(num_envs):
    with pytest.raises(ValueError, match="num_envs must be a positive int"):
        Counter(num_envs=num_envs)


def test_action_with_wrong_shape_names_group_and_shapes():
    env = make()
    action = good_action(env)
    action["mover"] = torch.zeros(4, 2, 2)
    with pytest.raises(ValueError, match=r"action for group 'mover' has shape \(4, 2, 2\), expected \(4, 2, 1\)"):
        env.step(action)


def test_action_with_wrong_dtype():
    env = make()
    action = good_action(env)
    action["mover"] = torch.zeros(4, 2, 1, dtype=torch.long)
    with pytest.raises(TypeError, match="action for group 'mover' has dtype torch.int64, expected a float dtype"):
        env.step(action)
    action = good_action(env)
    action["picker"] = torch.zeros(4, 1)
    with pytest.raises(TypeError, match="action for group 'picker' has dtype torch.float32, expected an integer"):
        env.step(action)


def test_action_on_wrong_device():
    env = make()
    action = good_action(env)
    action["mover"] = torch.zeros(4, 2, 1, device="meta")
    with pytest.raises(ValueError, match="action for group 'mover' is on meta, expected the env's device cpu"):
        env.step(action)


def test_an_indexed_device_names_the_device_its_tensors_report():
    # torch.device("cpu:0") != torch.device("cpu"), yet tensors made on either report `cpu`: the env
    # keeps the form its tensors report, so actions made on its device pass its device check.
    for env in (make(device="cpu:0"), envs.make("navigation", num_envs=2, device="cpu:0", seed=0)):
        assert env.device == torch.device("cpu")
        env.step(env.sample_actions())


def test_canonical_device_rejects_devices_that_cannot_hold_tensors():
    assert envs.base.canonical_device("cpu:0") == torch.device("cpu")
    with pytest.raises(ValueError, match="device 'nonsense' cannot hold tensors here"):
        envs.base.canonical_device("nonsense")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="device 'cuda' cannot hold tensors here"):
            make(device="cuda")


@pytest.mark.parametrize(
    "seed, error, message",
    [
        (1.5, TypeError, "seed must be an int (or a sequence of ints, one per member), got float 1.5"),  # was seed 1
        (True, TypeError, "got bool True"),  # was seed 1
        ("7", TypeError, "got str '7'"),  # was int()'s "invalid literal for int() with base 10"
        ([0, 1.5], TypeError, "got float 1.5"),
        ([], ValueError, "seed is an empty sequence; expected an int, or one int per member"),  # was ZeroDivisionError
    ],
)
def test_a_seed_that_is_not_an_int_is_refused_not_cast(seed, error, message):
    with pytest.raises(error, match=re.escape(message)):
        Counter(num_envs=4, seed=seed)
    with pytest.raises(error, match=re.escape(message)):
        make().reset(seed=seed)


def test_a_mask_given_where_the_seed_goes_says_to_name_it():
    # reset(mask) passes the mask as the seed: torch's "only one element tensors can be converted" before.
    with pytest.raises(TypeError, match=re.escape("got Tensor tensor([True, True, True, True]) (pass the reset mask")):
        make().reset(torch.ones(4, dtype=torch.bool))
    assert (
        Counter(num_envs=4, seed=torch.tensor(3)).seed == Counter(num_envs=4, seed=np.int64(3)).seed == 3
    )  # integers of any kind are ints


def test_make_and_the_env_refuse_arguments_of_the_wrong_type():
    with pytest.raises(
        TypeError, match="make takes the env's name as a str, got NoneType None; known envs: .*navigation"
    ):
        envs.make(None, num_envs=2)  # was "argument of type 'NoneType' is not iterable"
    with pytest.raises(ValueError, match="device 'None' cannot hold tensors here"):
        make(device=None)  # was torch's "device() received an invalid combination of arguments"
    with pytest.raises(TypeError, match="counter: check_values must be True or False, got 'no'"):
        make(check_values="no")  # was truthy: value checks on
    with pytest.raises(TypeError, match="counter: compile must be True or False, got 1"):
        make(compile=1)
    with pytest.raises(TypeError, match="render index must be an int, got float 0.5"):
        envs.make("navigation", num_envs=2, seed=0).render(0.5)  # was torch's "only integers, slices ..."


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")])
def test_env_options_refuse_non_finite_floats(value):
    # A NaN radius passed `agent_radius <= 0` and made every distance test False.
    for option in ("agent_radius", "collision_penalty"):
        with pytest.raises(ValueError, match=f"invalid option for env 'navigation': {option} must be a finite number"):
            envs.make("navigation", num_envs=2, **{option: value})


def test_a_group_tensordict_without_an_action_names_the_group():
    env = make()
    action = TensorDict({g: TensorDict({"act": a}, [4]) for g, a in good_action(env).items()}, [4])
    with pytest.raises(KeyError, match=r"action for group 'mover' is a TensorDict without an 'action' entry"):
        env.step(action)  # was tensordict's 'key "action" not found in TensorDict with keys [\'act\']'


def test_missing_and_unknown_groups():
    env = make()
    action = good_action(env)
    del action["picker"]
    action["prey"] = torch.zeros(4, 1)
    with pytest.raises(KeyError, match=r"missing \['picker'\]; unknown \['prey'\]"):
        env.step(action)


def test_action_must_be_a_mapping():
    with pytest.raises(TypeError, match="action must be a mapping group -> tensor"):
        make().step(torch.zeros(4, 2, 1))


def test_value_checks_catch_nan_bounds_and_masks_only_when_on():
    env = make(check_values=True)
    action = good_action(env)
    action["mover"][0, 0, 0] = float("nan")
    with pytest.raises(ValueError, match="action for group 'mover' contains NaN or inf"):
        env.step(action)
    action = good_action(env)
    action["mover"][1, 1, 0] = 3.0
    with pytest.raises(ValueError, match="outside the action bounds"):
        env.step(action)
    action = good_action(env)
    action["picker"][2, 0] = 2  # masked out
    with pytest.raises(ValueError, match="action_mask forbids"):
        env.step(action)
    action["picker"][2, 0] = 5
    with pytest.raises(ValueError, match=r"outside \[0, 3\)"):
        env.step(action)
    # Without value checks the same out-of-bounds action is clipped to the bounds, with no host sync.
    env = make()
    action = good_action(env)
    action["mover"][1, 1, 0] = 3.0
    next_td, _ = env.step(action)
    assert next_td["mover", "observation"][1, 1, 0] == pytest.approx(1.0)


def test_reset_mask_is_checked():
    env = make()
    with pytest.raises(ValueError, match=r"mask has shape \(3,\), expected \(4,\)"):
        env.reset(mask=torch.zeros(3, dtype=torch.bool))
    with pytest.raises(TypeError, match="mask has dtype torch.int64, expected torch.bool"):
        env.reset(mask=torch.zeros(4, dtype=torch.long))


def test_flags_and_auto_reset_at_max_steps():
    env = make()  # max_steps = 6
    env.reset(seed=1)
    for t in range(1, 7):
        next_td, obs = env.step(good_action(env))  # zero actions never reach the targets
        truncated = next_td["truncated"][:, 0]
        assert truncated.all() == (t == 6)
        assert not next_td["terminated"].any()
        assert torch.equal(next_td["mover", "truncated"], truncated[:, None, None].expand(4, 2, 1))
        assert torch.equal(next_td["done"], next_td["truncated"])
    # After the time limit every env restarted: counters are back to zero, targets are fresh.
    assert torch.equal(env.step_count, torch.zeros(4, dtype=torch.long))
    assert not torch.equal(next_td["mover", "observation"][..., 1], obs["mover", "observation"][..., 1])


@pytest.mark.parametrize("compile", [False, True])
def test_a_step_without_auto_reset_leaves_done_envs_as_the_last_action_left_them(request, compile):
    # `marl eval --render` drew env 0 only after `step` had reset it: an episode's last state (the agents on
    # their goals) was never drawn. Without the auto-reset, it is there until the caller resets the env.
    if compile:
        request.getfixturevalue("without_inductor")
    make = functools.partial(envs.make, "navigation", num_envs=3, seed=0, n_agents=2, compile=compile)
    auto, manual = make(max_steps=3), make(max_steps=3)
    long = make(max_steps=100)  # the same run, with no end in these steps
    for env in (auto, manual):  # env i ends after 3 - i steps: masked resets
        env.step_count.copy_(torch.arange(3))
    generator = torch.Generator().manual_seed(0)
    actions = [auto.sample_actions(generator) for _ in range(7)]  # truncated, never all on their goals
    for t, (next_td, action) in enumerate(zip(steps_without_auto_reset(auto, manual, actions), actions), 1):
        assert next_td["done"][:, 0].tolist() == [(t + i) % 3 == 0 for i in range(3)]
        if t <= 3:  # env 0's first episode
            long.step(action)
            assert np.array_equal(manual.render(0), long.render(0))
        if t == 3:  # `auto` has begun env 0's next episode, `manual` not yet
            assert not np.array_equal(auto.render(0), long.render(0))
            assert manual.step_count.tolist() == [3, 1, 2] and auto.step_count.tolist() == [0, 1, 2]
    assert t == len(actions) and torch.equal(manual.step_count, auto.step_count)


def test_tensordict_actions_are_accepted():
    from tensordict import TensorDict

    env = make()
    action = TensorDict({g: {"action": a} for g, a in good_action(env).items()}, batch_size=[4])
    env.step(action)


def test_an_action_that_requires_grad_leaves_no_graph_in_the_state():
    # A policy's action straight into step chained every step's state into one autograd graph (memory grew
    # with every step) and render then failed inside the env: "Can't call numpy() on Tensor that requires grad".
    env = envs.make("navigation", num_envs=2, seed=0)
    action = {"agent": env.sample_actions(torch.Generator().manual_seed(0))["agent"].requires_grad_()}
    for _ in range(2):
        next_data, obs = env.step(action)
    assert not next_data["agent", "reward"].requires_grad and not obs["agent", "observation"].requires_grad
    assert not any(t.requires_grad for t in env.static_tensors())
    assert env.render(np.int64(1)).dtype == np.uint8


@pytest.mark.parametrize("generator", [0, np.random.default_rng(0)], ids=["seed", "numpy"])
def test_sample_actions_refuses_what_is_not_a_torch_generator(generator):
    # was torch.rand's "received an invalid combination of arguments", from inside the spec
    with pytest.raises(TypeError, match=r"sample_actions: generator must be a torch.Generator on cpu \(or None\)"):
        make().sample_actions(generator)


def test_sample_actions_honours_masks():
    env = make()
    obs = env.reset()
    actions = torch.stack([env.sample_actions(torch.Generator().manual_seed(i), obs)["picker"] for i in range(50)])
    assert set(actions.unique().tolist()) == {0, 1}


def test_registry_errors():
    with pytest.raises(KeyError, match="unknown env 'navigaton'; known envs: .*navigation"):
        envs.make("navigaton", num_envs=2)
    with pytest.raises(TypeError, match=r"unknown option\(s\) \['n_agent'\] for env 'navigation'; valid options"):
        envs.make("navigation", num_envs=2, n_agent=3)
    with pytest.raises(TypeError, match=r"option n_agents=2.5 .* has type float, expected int"):
        envs.make("navigation", num_envs=2, n_agents=2.5)
    with pytest.raises(ValueError, match=r"n_agents must be in \[1, 256\], got 0"):
        envs.make("navigation", num_envs=2, n_agents=0)
    with pytest.raises(ValueError, match="max_steps must be >= 1"):
        envs.make("navigation", num_envs=2, max_steps=0)
    message = ""
    try:
        envs.make("navigation", num_envs=2, bogus=1)
    except TypeError as error:
        message = str(error)
    assert "n_agents: int = 3  -- Number of agents" in message
    assert "shared_reward: bool = True" in message


def test_names_lists_navigation():
    assert "navigation" in envs.names()


def define_toy(reward: float) -> type:
    """A new definition of the same class on each call, as a notebook cell run again defines it."""

    class Toy(Counter):
        def _step(self, action):
            rewards, terminated = super()._step(action)
            return {g: torch.full_like(r, reward) for g, r in rewards.items()}, terminated

    return Toy


def test_register_again_replaces_a_redefinition_and_refuses_another_class():
    try:
        envs.register("toy_redefined")(define_toy(1.0))
        envs.register("toy_redefined")(define_toy(2.0))  # the cell is run again after an edit
        env = envs.make("toy_redefined", num_envs=2)
        next_td, _ = env.step(good_action(env))
        assert torch.equal(next_td["mover", "reward"], torch.full((2, 2, 1), 2.0))
        with pytest.raises(ValueError, match="an env named 'toy_redefined' is already registered"):
            envs.register("toy_redefined")(type("Other", (Counter,), {}))
    finally:
        registry._ENVS.pop("toy_redefined", None)


@pytest.mark.slow
@pytest.mark.filterwarnings("error::RuntimeWarning")  # compiled, the errors are the env's, not a compile failure
@pytest.mark.parametrize("compile", [False, True])
def test_what_the_author_methods_return_is_checked_on_every_reset_and_step(request, compile):
    if compile:
        request.getfixturevalue("without_inductor")
    # Without check_env, as `marl train` runs an env: a per-env reward [B] used to be broadcast into
    # every agent's slot without a word, a wrong observation crashed deep in the policy's matmul.
    env = PerEnvReward(num_envs=4, seed=0, compile=compile)
    with pytest.raises(EnvOutputError, match=r"_step\(\)'s reward\['mover'\] .* has shape \(4,\), expected \(4, 2\)"):
        env.step(good_action(env))
    with pytest.raises(EnvOutputError, match=r"_observe\(\)\['mover'\] .* has shape \(4, 2, 1\), expected \(4, 2, 2\)"):
        WrongShape(num_envs=4, seed=0, compile=compile).reset()
    with pytest.raises(
        EnvOutputError, match=r"_observe\(\)\['mover'\] .* has dtype torch.float64, expected torch.float32"
    ):
        WrongDtype(num_envs=4, seed=0, compile=compile).reset()


@pytest.mark.filterwarnings("error::RuntimeWarning")  # compiled, the errors are the env's, not a compile failure
@pytest.mark.parametrize("compile", [False, True])
def test_check_values_names_nan_or_inf_in_what_the_env_returns(request, compile):
    # A NaN reward or an inf observation went into training unseen, and surfaced iterations later as a NaN
    # loss that did not point at the env. Compiled, the values are checked on what the compiled step returned.
    if compile:
        request.getfixturevalue("without_inductor")
    env = NanRewardAtStep3(num_envs=4, seed=0, check_values=True, compile=compile)
    env.reset()
    action = good_action(env)  # zero actions never reach the targets: no env ends before step 3
    env.step(action)
    env.step(action)
    message = "counter: _step()'s reward for group 'mover' contains NaN or inf in 1 of 4 envs (env 2)"
    with pytest.raises(EnvOutputError, match=re.escape(message)) as error:
        env.step(action)
    assert (error.value.group, error.value.key) == ("mover", "reward")
    env = InfObservation(num_envs=4, seed=0, check_values=True, compile=compile)
    env.reset()
    message = "counter: _observe() for group 'mover' contains NaN or inf in 1 of 4 envs (env 1)"
    with pytest.raises(EnvOutputError, match=re.escape(message)) as error:
        env.step(action)
    assert (error.value.group, error.value.key) == ("mover", "observation")


def test_check_values_names_nan_or_inf_in_the_state_after_a_reset():
    class InfState(Counter):
        def _state_spec(self):
            return envs.Box((2,))

        def _state(self):
            return torch.where(self.pos == 0, float("inf"), self.pos)  # inf where at 0, as after a reset

    message = "counter: _state() (after a reset) contains NaN or inf in 4 of 4 envs (env 0, 1, 2, 3)"
    with pytest.raises(EnvOutputError, match=re.escape(message)):
        InfState(num_envs=4, seed=0, check_values=True).reset()


def test_output_values_are_not_checked_without_check_values():
    # The check costs a host sync per step, so it is off unless asked for: the NaN and inf go through.
    for env_class, key, env_index in ((NanRewardAtStep3, "reward", 2), (InfObservation, "observation", 1)):
        env = env_class(num_envs=4, seed=0)
        env.reset()
        action = good_action(env)
        with envs.forbid_host_sync(env.device):
            for _ in range(3):
                next_td, _ = env.step(action)
        assert not torch.isfinite(next_td["mover", key][env_index]).all()


def test_state_must_match_its_spec():
    class Undeclared(Counter):
        def _state(self):
            return self.pos

    class WrongState(Counter):
        def _state_spec(self):
            return envs.Box((3,))

        def _state(self):
            return self.pos

    with pytest.raises(EnvOutputError, match=r"_state\(\) returned a tensor but _state_spec\(\) returned None"):
        Undeclared(num_envs=4).reset()
    with pytest.raises(EnvOutputError, match=r"_state\(\) .* has shape \(4, 2\), expected \(4, 3\)"):
        WrongState(num_envs=4).reset()


def test_register_refuses_what_would_fail_later():
    with pytest.raises(TypeError, match=r"write @envs.register\('my_env'\)"):
        envs.register(Counter)  # `@envs.register` without the name

    with pytest.raises(TypeError, match=r"register\('not_env'\): NotAnEnv must subclass envs.MultiAgentEnv"):
        envs.register("not_env")(type("NotAnEnv", (), {}))

    class NotADataclass(envs.EnvConfig):  # forgot @dataclass: its fields were not options, yet were read
        n_agents: int = 2

    with pytest.raises(TypeError, match=r"NotADataclass declares \['n_agents'\] but is not a dataclass"):
        envs.register("undecorated")(type("Undecorated", (Counter,), {"Config": NotADataclass}))

    @dataclasses.dataclass(frozen=True)
    class Plain:  # not an EnvConfig: no max_steps, which the base class reads on the first step
        n_agents: int = 2

    with pytest.raises(TypeError, match=r"Config must be a frozen dataclass subclassing envs.EnvConfig"):
        envs.register("plain_config")(type("PlainConfig", (Counter,), {"Config": Plain}))
    assert not {"not_env", "undecorated", "plain_config"} & set(registry._ENVS)


@pytest.mark.parametrize(
    ("register", "was"),
    [
        (lambda: envs.register(Counter), TypeError),
        (lambda: envs.register("not_env")(type("NotAnEnv", (), {})), TypeError),
        (lambda: envs.register("a/b")(type("Slashed", (Counter,), {})), ValueError),
        (lambda: envs.register("")(type("Unnamed", (Counter,), {})), ValueError),
        (lambda: envs.register("my env")(type("Spaced", (Counter,), {})), ValueError),
    ],
    ids=["no-name", "not-an-env", "slash", "empty", "space"],
)
def test_register_refusals_are_registration_errors_of_the_types_they_had(register, was):
    # Their own type, which `marl --imports` reports in one line; still the TypeError or ValueError they were.
    with pytest.raises(was) as refused:
        register()
    assert refused.type is envs.RegistrationError
    assert not {"not_env", "a/b", "", "my env"} & set(registry._ENVS)


def test_fixed_length_tuple_option():
    @dataclasses.dataclass(frozen=True)
    class GoalConfig(CounterConfig):
        goal: tuple[float, float] = (0.5, 0.5)

    try:
        envs.register("goal_toy")(type("GoalToy", (Counter,), {"Config": GoalConfig}))
        assert envs.make("goal_toy", num_envs=2, goal=(1, 2)).config.goal == (1, 2)
        # In the field's form: floats, and a tuple where a list was given (a config from JSON or Python).
        goal = envs.make("goal_toy", num_envs=2, goal=[1, 2.5]).config.goal
        assert goal == (1.0, 2.5) and type(goal) is tuple and all(type(g) is float for g in goal)
        with pytest.raises(TypeError, match=r"option goal=\(1, 2, 3\) .* expected tuple\[float, float\]"):
            envs.make("goal_toy", num_envs=2, goal=(1, 2, 3))
        with pytest.raises(TypeError, match=r"option goal=\(1, 'a'\) .* expected tuple\[float, float\]"):
            envs.make("goal_toy", num_envs=2, goal=(1, "a"))
    finally:
        registry._ENVS.pop("goal_toy", None)


@pytest.mark.parametrize("name", ["done", "terminated", "state", "", 3])
def test_a_group_named_like_a_root_key_or_not_a_str_is_refused(name):
    # A group "done" had its data overwritten by the env-level flags (check_env then said its observation was
    # missing); a group "state" by an env's global state; an int name failed inside TensorDict.
    class Renamed(Counter):
        def _make_groups(self):
            groups = super()._make_groups()
            return {name: groups["mover"], "picker": groups["picker"]}

    with pytest.raises(EnvOutputError, match=re.escape(f"_make_groups() names a group {name!r}; a group is named by")):
        Renamed(num_envs=2, seed=0)


def test_make_groups_must_give_group_specs():
    class Tuples(Counter):
        def _make_groups(self):
            return {"mover": (["mover_0"], envs.Box((2,)), envs.Box((1,), -1.0, 1.0))}

    with pytest.raises(EnvOutputError, match=r"_make_groups\(\)\['mover'\] must be an envs.GroupSpec, got tuple"):
        Tuples(num_envs=2, seed=0)
    with pytest.raises(EnvOutputError, match=r"must return a non-empty dict \{group name: GroupSpec\}, got \{\}"):
        type("NoGroups", (Counter,), {"_make_groups": lambda self: {}})(num_envs=2, seed=0)


def test_an_agent_named_in_two_groups_is_refused():
    # It built and trained by type; `--group-map per_agent` then failed as "marl train: error: ('mover', 0)".
    with pytest.raises(
        EnvOutputError,
        match=re.escape("_make_groups() names the agent(s) ['mover_0'] in group 'picker' and in group 'mover'"),
    ):
        SharedAgentNames(num_envs=2, seed=0)


@pytest.mark.parametrize("method", ["_make_groups", "_reset", "_step", "_observe"])
def test_a_method_the_env_does_not_write_is_named(method):
    # The base class raised a bare NotImplementedError, which named neither the class nor the method's contract.
    Unwritten = type("Unwritten", (Counter,), {method: getattr(envs.MultiAgentEnv, method)})
    with pytest.raises(NotImplementedError, match=rf"Unwritten does not write {method}\(.*every env subclassing"):
        env = Unwritten(num_envs=2, seed=0)
        env.step(good_action(env))


def test_state_allocated_off_the_env_device_is_named():
    # It failed in the first `_reset` inside torch ("Tensor on device meta is not on the expected device cpu!").
    class OffDevice(Counter):
        def _init_state(self):
            super()._init_state()
            self.target = torch.zeros(self.num_envs, self.config.n_agents, device="meta")

    with pytest.raises(
        EnvOutputError,
        match=r"_init_state allocated the state tensor target on meta, expected the env's device cpu: .*device=self.device",
    ):
        OffDevice(num_envs=2, seed=0)


@pytest.mark.parametrize(
    "built_with, given, expected",
    [((1, 2), 5, "a sequence of 2 seeds"), ((1, 2), (1, 2, 3), "a sequence of 2 seeds"), (1, (1, 2), "one int")],
)
def test_reset_seed_that_does_not_fit_the_env_changes_nothing(built_with, given, expected):
    """A population env (one seed per member) re-seeded with one int, or a single env with several, is refused
    naming what fits, and the env keeps its seed and stream: the next reset is the one it would have made."""
    env = envs.make("spread", num_envs=4, seed=built_with)
    twin = envs.make("spread", num_envs=4, seed=built_with)
    with pytest.raises(
        ValueError, match=f"spread: reset\\(seed=.*\\) does not fit the env's seed .*expected {expected}"
    ):
        env.reset(seed=given)
    assert env.seed == built_with
    assert (env.reset() == twin.reset()).all()

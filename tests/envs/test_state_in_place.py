"""A compiled env keeps its state tensors at fixed addresses (`MultiAgentEnv.hold_state_in_place`).

On CUDA a compiled call's outputs live in the CUDA graph's memory pool and are overwritten by the next
compiled call: state an env keeps from one step to the next (`self.pos = ...`) must be written back into
the tensor it held. That overwrite cannot happen on the CPU, so these tests check what it needs: the
state tensors are the same objects after every step and reset, compiled or not, and the transitions
are those of the plain env, step for step.
"""

import collections

import pytest
import torch
from torch._dynamo.utils import counters

import envs
import marl.core.rollout
from envs.base import EnvOutputError
from marl.core.models import Policy
from marl.core.rollout import Acting, Collector
from tests.envs.broken_envs import Counter

NATIVE = ["navigation", "spread", "tag", "speaker_listener"]


def state_tensors(env) -> dict[str, torch.Tensor]:
    flat = {}
    for name, value in env._state_tensors().items():
        items = value.items() if isinstance(value, dict) else [(None, value)]
        flat.update({(name, key): tensor for key, tensor in items})
    return flat


def run_side_by_side(plain, held, steps: int):
    addresses = {key: (t, t.data_ptr()) for key, t in state_tensors(held).items()}
    generator = torch.Generator().manual_seed(1)
    resets = 0
    for _ in range(steps):
        action = plain.sample_actions(generator)
        (next_a, obs_a), (next_b, obs_b) = plain.step(action), held.step(action)
        torch.testing.assert_close(next_b.to_dict(), next_a.to_dict(), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(obs_b.to_dict(), obs_a.to_dict(), atol=1e-5, rtol=1e-5)
        resets += int(next_a["done"].sum())
        now = state_tensors(held)
        assert now.keys() == addresses.keys()
        for key, (tensor, pointer) in addresses.items():
            assert now[key] is tensor and now[key].data_ptr() == pointer, f"{key} moved"
    assert resets > 0  # the masked resets ran too


@pytest.mark.parametrize("name", NATIVE)
def test_held_state_stays_in_place_and_steps_as_the_plain_env(name):
    plain = envs.make(name, num_envs=6, seed=3, max_steps=7)
    held = envs.make(name, num_envs=6, seed=3, max_steps=7)
    held.hold_state_in_place()
    held.hold_state_in_place()  # twice is once
    run_side_by_side(plain, held, steps=16)


@pytest.mark.filterwarnings("error::RuntimeWarning")  # the compile fallback's warning fails the test
@pytest.mark.usefixtures("without_inductor")
def test_a_compiled_env_writes_its_state_in_place():
    plain = envs.make("navigation", num_envs=6, seed=3, max_steps=7)
    compiled = envs.make("navigation", num_envs=6, seed=3, max_steps=7, compile=True)
    assert compiled.state_in_place
    static = {id(t) for t in compiled.static_tensors()}
    assert all(id(t) in static for t in state_tensors(compiled).values())
    run_side_by_side(plain, compiled, steps=16)


class Reshaping(Counter):
    def _step(self, action):
        reward, terminated = super()._step(action)
        self.picks = self.picks[:, None]  # [B] -> [B, 1]
        return reward, terminated


def test_a_state_tensor_that_changes_shape_is_named():
    env = Reshaping(num_envs=4, seed=0)
    env.hold_state_in_place()
    with pytest.raises(EnvOutputError, match=r"state tensor picks changed from torch.float32 \(4,\) .* \(4, 1\)"):
        env.step(env.sample_actions(torch.Generator().manual_seed(0)))


class Swapping(Counter):
    """Swaps two state tensors by assignment: each must get the other's values, not a half-overwritten one.
    Its observation of `picks` is a view of that state tensor (Counter's `self.picks[:, None, None]`)."""

    def _step(self, action):
        self.pos, self.target = self.target, self.pos
        return super()._step(action)


def test_swapped_state_and_observed_views_stay_right_when_held_in_place():
    plain, held = Swapping(num_envs=4, seed=0), Swapping(num_envs=4, seed=0)
    held.hold_state_in_place()
    run_side_by_side(plain, held, steps=12)


class CountingCompile:
    """Stands in for `maybe_compile`: torch.compile with a backend that counts, by the name given, the graphs
    made and each run of one (a compiled call runs one graph per piece: more than one where it breaks)."""

    def __init__(self):
        self.graphs, self.runs = collections.Counter(), collections.Counter()

    def __call__(self, fn, enabled, device, cpp_wrapper=False, name=None):
        if not enabled:
            return fn

        def backend(graph, example_inputs):
            self.graphs[name] += 1

            def run(*args):
                self.runs[name] += 1
                return graph.forward(*args)

            return run

        return torch.compile(fn, backend=backend, dynamic=False)


@pytest.fixture
def counting(monkeypatch):
    torch._dynamo.reset()
    counters.clear()
    compile = CountingCompile()
    monkeypatch.setattr(envs.base, "maybe_compile", compile)
    monkeypatch.setattr(marl.core.rollout, "maybe_compile", compile)
    return compile


def test_a_compiled_env_steps_and_resets_in_one_graph_each(counting):
    plain = envs.make("navigation", num_envs=6, seed=3, max_steps=7)
    compiled = envs.make("navigation", num_envs=6, seed=3, max_steps=7, compile=True)
    run_side_by_side(plain, compiled, steps=16)  # auto-resets included
    mask = torch.tensor([True, False, True, False, False, True])
    for kwargs in ({"mask": mask}, {}):
        torch.testing.assert_close(compiled.reset(**kwargs).to_dict(), plain.reset(**kwargs).to_dict())
    assert dict(counters["graph_break"]) == {}
    assert counters["stats"]["unique_graphs"] == 2
    # One compiled call, one graph, per step and per reset.
    assert counting.graphs == {"navigation step": 1, "navigation reset": 1}
    assert counting.runs == {"navigation step": 16, "navigation reset": 2}


def test_the_compiled_rollout_traces_a_compiled_env_inline(counting):
    """A rollout compiled with its env's step inside traces the step into its own graph, whether or not
    the env compiled itself: equal buffers, one rollout graph, and the env's own step graph never made."""
    buffers = []
    for env_compiled in (False, True):
        torch._dynamo.reset()
        counters.clear()
        counting.graphs.clear()
        counting.runs.clear()
        env = envs.make("navigation", num_envs=6, seed=3, max_steps=3, compile=env_compiled)
        torch.manual_seed(0)
        policies = {g: Policy(spec, [8], "tanh", share_params=True) for g, spec in env.groups.items()}
        collector = Collector(env, Acting(policies), 8, torch.Generator().manual_seed(0), seed=0, compile=True)
        buffers.append(collector.collect().clone())
        assert dict(counters["graph_break"]) == {}
        # The env's own reset graph runs once, in the collector's first reset.
        assert counting.graphs == {"rollout step": 1, **({"navigation reset": 1} if env_compiled else {})}
        assert counting.runs == {"rollout step": 8, **({"navigation reset": 1} if env_compiled else {})}
    torch.testing.assert_close(buffers[1].to_dict(), buffers[0].to_dict())
    assert buffers[0]["agent", "done"].any()  # auto-resets included


class StateFromReset(Counter):
    """Allocates `picks` on its first reset instead of in `_init_state`: eager it steps, but held in place
    (compiled) `picks` would be a new tensor every call, which a CUDA graph replay does not see."""

    def _init_state(self):
        B, n = self.num_envs, self.config.n_agents
        self.pos = torch.zeros(B, n, device=self.device)
        self.target = torch.zeros(B, n, device=self.device)

    def _reset(self, mask):
        if not hasattr(self, "picks"):
            self.picks = torch.zeros(self.num_envs, device=self.device)
        super()._reset(mask)


class StateFromStep(Counter):
    def _step(self, action):
        self.steps_taken = getattr(self, "steps_taken", torch.zeros(self.num_envs, device=self.device)) + 1
        return super()._step(action)


@pytest.mark.parametrize("compile", [False, True])
def test_state_first_created_in_reset_is_refused_naming_init_state(compile):
    with pytest.raises(
        EnvOutputError,
        match=r"counter: _reset created the state attribute\(s\) \['picks'\], which "
        r"_init_state does not allocate.*allocate them in _init_state",
    ):
        StateFromReset(num_envs=4, seed=0, compile=compile)


def test_state_first_created_in_step_is_refused_when_held_in_place():
    env = StateFromStep(num_envs=4, seed=0)
    env.step(env.sample_actions(torch.Generator().manual_seed(0)))  # eager: nothing to hold in place
    with pytest.raises(EnvOutputError, match=r"_reset or _step created the state attribute\(s\) \['steps_taken'\]"):
        env.hold_state_in_place()


def test_state_first_created_in_a_compiled_step_is_refused():
    # The env holds its state in place before its first step, so the check above never saw `steps_taken`:
    # the compiled step returned it as a graph output, which on CUDA the next replay overwrites.
    env = StateFromStep(num_envs=4, seed=0, compile=True)
    with pytest.raises(EnvOutputError, match=r"_step created the state attribute\(s\) \['steps_taken'\]"):
        env.step(env.sample_actions(torch.Generator().manual_seed(0)))


@pytest.mark.parametrize(
    ("name", "needs"),
    [*((n, None) for n in NATIVE), ("vmas/navigation", "vmas"), ("pettingzoo/tests.envs.pz_toy", "pettingzoo")],
)
def test_every_shipped_env_allocates_its_state_in_init_state(name, needs):
    if needs:
        pytest.importorskip(needs)
    env = envs.make(name, num_envs=3, seed=0)
    for _ in range(2):
        env.step(env.sample_actions(torch.Generator().manual_seed(0)))
    env.hold_state_in_place()  # no state created after _init_state: the guard has no false positive here

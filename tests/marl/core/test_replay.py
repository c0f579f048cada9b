"""The replay buffer: layout and size up front, ring order, every group aligned under one index, uniform and
prioritized draws by chi-square, importance weights by their formula, priorities, bad input, no host sync,
checkpoints. The sum tree runs as Triton under the interpreter (the default here) or its torch path."""

import io
import math
import re

import pytest
import torch
from tensordict import TensorDict

import envs
from envs.specs import Box, Discrete, GroupSpec
from envs.sync import forbid_host_sync
from kernels.sum_tree import sum_tree_leaves
from marl.core.models import Policy
from marl.core.replay import Prioritized, ReplayBuffer, replay_nbytes
from marl.core.rollout import Acting, Collector, transition_layout

CHI_SQUARE_Z999 = 3.090232


def chi_square_limit(df: int) -> float:
    """The 0.999 quantile of a chi-square with `df` degrees of freedom (Wilson-Hilferty)."""
    return df * (1 - 2 / (9 * df) + CHI_SQUARE_Z999 * math.sqrt(2 / (9 * df))) ** 3


def chi_square(counts: torch.Tensor, probability: torch.Tensor) -> float:
    expected = counts.sum() * probability
    return ((counts - expected) ** 2 / expected).sum().item()


def rollout(env_name: str, num_envs: int = 3, steps: int = 4, seed: int = 0) -> tuple[object, TensorDict]:
    """A `[steps, num_envs]` rollout of random policies, as `marl.core.rollout` collects it."""
    env = envs.make(env_name, num_envs=num_envs, device="cpu", seed=seed)
    torch.manual_seed(seed)
    policies = {g: Policy(spec, [8], "tanh", share_params=True) for g, spec in env.groups.items()}
    collector = Collector(env, Acting(policies), steps, torch.Generator().manual_seed(seed), seed=seed)
    return env, collector.collect().clone()


# Synthetic groups, a masked discrete group and a global state: what no native env has yet.
GROUPS = {
    "red": GroupSpec(["red_0", "red_1"], Box((3,)), Box((2,), -1.0, 1.0)),
    "blue": GroupSpec(["blue_0"], Box((2, 2)), Discrete(4, masked=True)),
}
STATE = Box((5,))


def numbered(steps: int, num_envs: int, first: int = 0) -> TensorDict:
    """A `[steps, num_envs]` batch for GROUPS + STATE whose every value is its env step's number
    (`first`, `first + 1`, ... in time-major order), so the stored order can be read back."""
    step = torch.arange(first, first + steps * num_envs).view(steps, num_envs)
    data = {}
    for g, spec in GROUPS.items():
        layout = {k[1]: v for k, v in transition_layout({g: spec}).items()}
        data[g] = {
            key: step.view(steps, num_envs, *[1] * len(shape)).expand(steps, num_envs, *shape).to(dtype)
            if dtype != torch.bool
            else (step % 2 == 1).view(steps, num_envs, *[1] * len(shape)).expand(steps, num_envs, *shape)
            for key, (shape, dtype) in layout.items()
        }
    data["state"] = step[..., None].expand(steps, num_envs, 5).float()
    data["next_state"] = data["state"] + 0.5
    return TensorDict(data, batch_size=[steps, num_envs])


def stored_steps(buffer: ReplayBuffer) -> list[int]:
    return buffer.storage[("state",)][: len(buffer), 0].long().tolist()


# ---- layout and size ----------------------------------------------------------------------------------


def test_nbytes_computed_from_the_specs_before_allocating():
    env = envs.make("navigation", num_envs=2, device="cpu", seed=0)  # 3 agents, observation 18, action 2
    per_step = 2 * 3 * 18 * 4 + 3 * 2 * 4 + 3 * 4 + 3 + 3  # observations, action, reward, terminated, done
    assert replay_nbytes(env.groups, 1000) == 1000 * per_step == 474_000
    # + the float64 tree: 1024 leaves (a multiple of 32), then the root's row: 0 and their running sums
    assert replay_nbytes(env.groups, 1000, prioritized=True) == 474_000 + (1024 + 1025) * 8
    for prioritized in (None, Prioritized()):
        buffer = ReplayBuffer.for_env(env, 1000, prioritized=prioritized)
        allocated = sum(x.numel() * x.element_size() for x in buffer.storage.values())
        allocated += 0 if buffer.tree is None else buffer.tree.numel() * 8
        assert buffer.nbytes == allocated == replay_nbytes(env.groups, 1000, prioritized=prioritized is not None)
    # With a mask and a state: mask and next mask [n, 4] bool, state and next state [5] float32.
    blue = 2 * 4 * 4 + 8 + 4 + 1 + 1 + 2 * 4  # observations [2, 2], int64 action, reward, flags, masks
    red = 2 * (2 * 3 * 4) + 2 * 2 * 4 + 2 * 4 + 2 + 2
    assert replay_nbytes(GROUPS, 10, STATE) == 10 * (blue + red + 2 * 5 * 4)


def test_a_buffer_that_cannot_fit_is_refused_before_allocating():
    env = envs.make("navigation", num_envs=2, device="cpu", seed=0)
    with pytest.raises(MemoryError) as error:
        ReplayBuffer.for_env(env, 10**13)
    message = str(error.value)
    assert "replay buffer of capacity 10,000,000,000,000 needs 4311.00 TiB (474 bytes per env step" in message
    assert "is free on cpu: lower the capacity; at most about" in message


# ---- extend -------------------------------------------------------------------------------------------


def test_extend_stores_a_rollout_in_time_major_order():
    env, data = rollout("navigation", num_envs=3, steps=4)
    buffer = ReplayBuffer.for_env(env, 100)
    buffer.extend(data)
    assert len(buffer) == 12 and buffer.size.item() == 12 and buffer.position.item() == 12
    for key, storage in buffer.storage.items():
        for t in range(4):
            for b in range(3):
                assert torch.equal(storage[t * 3 + b], data[key][t, b]), (key, t, b)
        assert not storage[12:].any()


@pytest.mark.parametrize("backend", ["auto", "torch"])
def test_wrap_around_keeps_exactly_the_newest_capacity_steps(backend):
    capacity = 7
    buffer = ReplayBuffer(GROUPS, capacity, state_spec=STATE, prioritized=Prioritized(), backend=backend)
    newest: list[int] = []  # the reference: a plain list of every step, cut to the last `capacity`
    first = 0
    for steps, num_envs in [(1, 2), (2, 2), (3, 1), (5, 2), (1, 1), (4, 3)]:  # 10 and 12 exceed the capacity
        buffer.extend(numbered(steps, num_envs, first))
        newest = (newest + list(range(first, first + steps * num_envs)))[-capacity:]
        first += steps * num_envs
        assert len(buffer) == buffer.size.item() == len(newest)
        assert buffer.position.item() == first % capacity
        assert sorted(stored_steps(buffer)) == newest
        # The slot of step s is s mod capacity, in every tensor of every group.
        for s in newest:
            for key, storage in buffer.storage.items():
                value = storage[s % capacity]
                expected = (s % 2 == 1) if value.dtype == torch.bool else s
                assert (value == expected).all() or key == ("next_state",), (key, s)
        # Every stored step has a priority (the largest so far: 1 before any update); empty slots none.
        leaves = sum_tree_leaves(buffer.tree)
        assert (leaves[: len(buffer)] == 1.0).all() and (leaves[len(buffer) :] == 0).all()


def test_extend_accepts_one_batch_dim_and_leaves_other_keys_out():
    env, data = rollout("navigation", num_envs=2, steps=3)
    data["agent", "log_prob"] = torch.zeros(3, 2, 3)
    buffer = ReplayBuffer.for_env(env, 10)
    buffer.extend(data.reshape(6))
    assert len(buffer) == 6 and ("agent", "log_prob") not in buffer.storage


# ---- sampling -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("env_name", ["tag", "speaker_listener"])
@pytest.mark.parametrize("prioritized", [None, Prioritized()], ids=["uniform", "prioritized"])
def test_heterogeneous_groups_are_stored_and_sampled_aligned(env_name, prioritized):
    env, data = rollout(env_name, num_envs=3, steps=4)
    flat = data.reshape(12)
    buffer = ReplayBuffer.for_env(env, 20, prioritized=prioritized)
    buffer.extend(data)
    batch = buffer.sample(12, torch.Generator().manual_seed(0))
    assert batch.batch_size == (12,) and set(batch.keys()) >= set(env.groups)
    assert ("weight" in batch.keys()) == (prioritized is not None)
    for g, spec in env.groups.items():
        for key in ("observation", "next_observation", "action", "reward", "terminated", "done"):
            # Row i of every group is the env step at the sampled slot: the same step for all groups.
            assert torch.equal(batch[g, key], flat[g, key][batch["index"]]), (g, key)
        assert batch[g, "observation"].shape == (12, spec.n_agents, *spec.observation.shape)


def test_state_and_action_mask_are_stored_and_sampled():
    buffer = ReplayBuffer(GROUPS, 10, state_spec=STATE)
    buffer.extend(numbered(2, 3))
    batch = buffer.sample(6, torch.Generator().manual_seed(0))
    step = batch["index"]  # slot s holds step s here
    assert torch.equal(batch["state"][:, 0], step.float()) and torch.equal(batch["next_state"][:, 0], step + 0.5)
    assert torch.equal(batch["blue", "action_mask"], (step % 2 == 1)[:, None, None].expand(6, 1, 4))
    assert batch["blue", "action"].dtype == torch.int64 and batch["blue", "observation"].shape == (6, 1, 2, 2)


def test_uniform_draws_are_uniform_chi_square():
    buffer = ReplayBuffer(GROUPS, 40, state_spec=STATE)
    buffer.extend(numbered(6, 5))  # 30 of 40 slots filled
    generator = torch.Generator().manual_seed(0)
    index = torch.cat([buffer.sample(30, generator)["index"] for _ in range(500)])
    counts = torch.bincount(index, minlength=40).double()
    assert counts[30:].sum() == 0  # empty slots are never drawn
    assert chi_square(counts[:30], torch.full((30,), 1 / 30)) < chi_square_limit(29)


@pytest.mark.parametrize("backend", ["auto", "torch"])
def test_prioritized_draws_follow_the_priorities_chi_square(backend):
    prioritized = Prioritized(alpha=0.7, beta=0.5, reduce="max")
    buffer = ReplayBuffer(GROUPS, 32, state_spec=STATE, prioritized=prioritized, backend=backend)
    buffer.extend(numbered(4, 5))  # 20 steps
    priority = torch.linspace(0.0, 3.0, 20)  # slot 0 gets priority 0 (+ eps)
    buffer.update_priority(torch.arange(20), priority)
    generator = torch.Generator().manual_seed(0)
    index = torch.cat([buffer.sample(20, generator)["index"] for _ in range(200 if backend == "torch" else 40)])
    counts = torch.bincount(index, minlength=32).double()
    assert counts[20:].sum() == 0 and counts[0] == 0  # eps ** 0.7 = 2.5e-6 of the total
    weight = (priority.double() + prioritized.eps) ** prioritized.alpha
    assert chi_square(counts[1:20], weight[1:] / weight[1:].sum()) < chi_square_limit(18)


def test_importance_weights_equal_the_formula():
    prioritized = Prioritized(alpha=0.6, beta=0.4)
    buffer = ReplayBuffer(GROUPS, 16, state_spec=STATE, prioritized=prioritized)
    buffer.extend(numbered(2, 5))  # 10 steps
    priority = [0.5, 1.0, 2.0, 4.0, 0.1, 3.0, 0.0, 1.5, 2.5, 0.7]
    buffer.update_priority(torch.arange(10), torch.tensor(priority))
    batch = buffer.sample(8, torch.Generator().manual_seed(3))
    # w_i = (N P(i))^-beta / max_j (N P(j))^-beta over the batch, P(i) = (p_i + eps)^alpha / sum_k (p_k + eps)^alpha
    p = [(x + prioritized.eps) ** prioritized.alpha for x in priority]
    probability = [p[i] / sum(p) for i in batch["index"].tolist()]
    raw = [(len(buffer) * P) ** -prioritized.beta for P in probability]
    expected = torch.tensor([w / max(raw) for w in raw])
    torch.testing.assert_close(batch["weight"], expected.float())
    assert batch["weight"].max() == 1.0


# ---- priorities ---------------------------------------------------------------------------------------


def leaves(buffer: ReplayBuffer) -> torch.Tensor:
    return sum_tree_leaves(buffer.tree)[: buffer.capacity]


def test_repeated_indices_keep_the_largest_and_new_steps_enter_at_the_largest_so_far():
    prioritized = Prioritized(alpha=0.5, eps=1e-8)
    buffer = ReplayBuffer(GROUPS, 8, state_spec=STATE, prioritized=prioritized)
    buffer.extend(numbered(1, 4))
    buffer.update_priority(torch.tensor([1, 1, 2, 1]), torch.tensor([0.25, 9.0, 4.0, 1.0]))
    expected = torch.tensor([1.0, (9.0 + 1e-8) ** 0.5, (4.0 + 1e-8) ** 0.5, 1.0, 0, 0, 0, 0], dtype=torch.float64)
    assert torch.equal(leaves(buffer), expected)
    assert buffer.max_priority.item() == 9.0 + 1e-8
    buffer.extend(numbered(1, 2, first=4))
    assert torch.equal(leaves(buffer)[4:6], torch.full((2,), (9.0 + 1e-8) ** 0.5, dtype=torch.float64))
    # The largest so far stays the largest, even after that step's priority drops.
    buffer.update_priority(torch.tensor([1]), torch.tensor([0.0]))
    buffer.extend(numbered(1, 1, first=6))
    assert leaves(buffer)[6] == (9.0 + 1e-8) ** 0.5 and leaves(buffer)[1] == 1e-8**0.5


@pytest.mark.parametrize("reduce", ["max", "mean"])
def test_priorities_per_agent_are_reduced_over_the_agents_of_all_groups(reduce):
    prioritized = Prioritized(alpha=1.0, eps=1e-8, reduce=reduce)
    buffer = ReplayBuffer(GROUPS, 4, state_spec=STATE, prioritized=prioritized)
    buffer.extend(numbered(1, 4))
    red = torch.tensor([[1.0, 3.0], [2.0, 2.0]])  # [k, 2 agents]
    blue = torch.tensor([[[5.0]], [[0.5]]])  # [k, 1 agent, 1]
    buffer.update_priority(torch.tensor([0, 3]), {"red": red, "blue": blue})
    expected = [5.0, 2.0] if reduce == "max" else [3.0, 1.5]
    assert leaves(buffer)[[0, 3]].tolist() == [x + 1e-8 for x in expected]
    buffer.update_priority(torch.tensor([1, 2]), red)  # a bare [k, n] tensor is reduced the same way
    assert leaves(buffer)[[1, 2]].tolist() == [x + 1e-8 for x in ([3.0, 2.0] if reduce == "max" else [2.0, 2.0])]


# ---- no host sync -------------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["auto", "torch"])
@pytest.mark.parametrize("prioritized", [None, Prioritized()], ids=["uniform", "prioritized"])
def test_extend_sample_update_never_sync_with_the_host(prioritized, backend):
    env, data = rollout("tag", num_envs=2, steps=3)
    buffer = ReplayBuffer.for_env(env, 8, prioritized=prioritized, backend=backend)
    generator = torch.Generator().manual_seed(0)
    with forbid_host_sync():
        for _ in range(2):
            buffer.extend(data)  # 6 steps into 8 slots: the second call wraps around
            batch = buffer.sample(4, generator)
            if prioritized:
                buffer.update_priority(batch["index"], {g: batch[g, "reward"].abs() for g in env.groups})
    assert len(buffer) == 8 and buffer.position.item() == 4


# ---- bad input: one clear error, raised before anything is written ---------------------------------------


def snapshot(buffer: ReplayBuffer) -> dict:
    state = {key: value.clone() for key, value in buffer.storage.items()}
    state["position"], state["size"] = buffer.position.clone(), buffer.size.clone()
    if buffer.tree is not None:
        state["tree"] = buffer.tree.clone()
    return state


def assert_unchanged(buffer: ReplayBuffer, before: dict) -> None:
    after = snapshot(buffer)
    assert all(torch.equal(after[key], before[key]) for key in before)


def broken(change) -> TensorDict:
    data = numbered(2, 3)
    change(data)
    return data


BAD_EXTENDS = {
    "missing-key": (
        lambda d: d["blue"].del_("action_mask"),
        KeyError,
        r"group 'blue', key 'action_mask' is missing from the data; expected a tensor of shape \(2, 3, 1, 4\)",
    ),
    "missing-group": (lambda d: d.del_("red"), KeyError, r"group 'red', key 'observation' is missing"),
    "missing-state": (lambda d: d.del_("next_state"), KeyError, r"key 'next_state' \(env state\) is missing"),
    "wrong-shape": (
        lambda d: d["blue"].set("observation", torch.zeros(2, 3, 1, 4), inplace=False),
        ValueError,
        r"group 'blue', key 'observation' has shape \(2, 3, 1, 4\), expected \(2, 3, 1, 2, 2\)",
    ),
    "wrong-agents": (
        lambda d: d["red"].set("reward", torch.zeros(2, 3, 3)),
        ValueError,
        r"group 'red', key 'reward' has shape \(2, 3, 3\), expected \(2, 3, 2\)",
    ),
    "wrong-dtype": (
        lambda d: d["blue"].set("action", torch.zeros(2, 3, 1)),
        TypeError,
        r"group 'blue', key 'action' has dtype torch.float32, expected torch.int64 \(shape \(2, 3, 1\)\)",
    ),
    "flag-as-float": (
        lambda d: d["red"].set("done", torch.zeros(2, 3, 2)),
        TypeError,
        r"group 'red', key 'done' has dtype torch.float32, expected torch.bool",
    ),
}


@pytest.mark.parametrize("change, error, message", BAD_EXTENDS.values(), ids=BAD_EXTENDS.keys())
def test_bad_extend_is_a_clear_error_and_writes_nothing(change, error, message):
    buffer = ReplayBuffer(GROUPS, 10, state_spec=STATE, prioritized=Prioritized())
    buffer.extend(numbered(1, 2))
    before = snapshot(buffer)
    with pytest.raises(error, match=message):
        buffer.extend(broken(change))  # "red" comes first and is fine: nothing of it may be written
    assert_unchanged(buffer, before)
    assert len(buffer) == 2


def test_extend_on_another_device_or_not_a_tensordict_is_a_clear_error():
    buffer = ReplayBuffer(GROUPS, 10, state_spec=STATE)
    data = numbered(2, 3)
    data = TensorDict({**data.to_dict(), "state": data["state"].to("meta")}, batch_size=[2, 3])
    with pytest.raises(ValueError, match=r"key 'state' \(env state\) is on meta, expected cpu like the buffer"):
        buffer.extend(data)
    assert len(buffer) == 0 and not buffer.storage[("red", "observation")].any()
    with pytest.raises(TypeError, match="extend takes the TensorDict"):
        buffer.extend({"red": {}})


def test_a_buffer_for_what_is_not_an_env_is_refused():
    # was "AttributeError: 'str' object has no attribute 'groups'"
    with pytest.raises(TypeError, match=r"^ReplayBuffer.for_env takes an env .*got str 'spread': make one with"):
        ReplayBuffer.for_env("spread", capacity=16)


def test_bad_sample_is_a_clear_error():
    buffer = ReplayBuffer(GROUPS, 10, state_spec=STATE)
    with pytest.raises(ValueError, match=r"batch_size 1 is larger than the 0 env steps stored \(capacity 10\)"):
        buffer.sample(1)
    buffer.extend(numbered(1, 3))
    with pytest.raises(ValueError, match=r"batch_size 4 is larger than the 3 env steps stored"):
        buffer.sample(4)
    with pytest.raises(ValueError, match="batch_size must be a positive int, got 0"):
        buffer.sample(0)


@pytest.mark.parametrize("prioritized", [None, Prioritized()], ids=["uniform", "prioritized"])
def test_a_generator_that_is_not_one_or_a_bad_beta_is_a_clear_error(prioritized):
    # A seed in place of a generator failed inside the device check: "'int' object has no attribute 'device'";
    # a uniform buffer took any beta (a string, 2.0) without a word.
    buffer = ReplayBuffer(GROUPS, 10, state_spec=STATE, prioritized=prioritized)
    buffer.extend(numbered(1, 3))
    with pytest.raises(TypeError, match=r"sample: generator must be a torch.Generator on cpu \(or None\), got int 0"):
        buffer.sample(2, 0)
    if prioritized is None:  # draw_chunks is uniform only
        with pytest.raises(TypeError, match="draw_chunks: generator must be a torch.Generator on cpu"):
            buffer.draw_chunks(1, 1, 3, generator=0)
    for beta in ("0.5", 2.0):
        with pytest.raises(ValueError, match=rf"sample: beta = {beta!r}, expected a float in \[0, 1\]"):
            buffer.sample(2, None, beta)


BAD_PRIORITIES = {
    "negative": (torch.tensor([0, 1]), torch.tensor([1.0, -0.5]), ValueError, "1 of 2 priorities are negative, NaN"),
    "nan": (torch.tensor([0, 1]), torch.tensor([math.nan, 1.0]), ValueError, "1 of 2 priorities are negative, NaN"),
    "inf": (torch.tensor([0, 1]), torch.tensor([1.0, math.inf]), ValueError, "1 of 2 priorities are negative, NaN"),
    "index-past-content": (
        torch.tensor([0, 3]),
        torch.tensor([1.0, 1.0]),
        IndexError,
        r"index holds 3, expected slots in \[0, 3\) \(the 3 env steps stored\)",
    ),
    "negative-index": (torch.tensor([-1, 0]), torch.tensor([1.0, 1.0]), IndexError, "index holds -1"),
    "wrong-length": (
        torch.tensor([0, 1]),
        torch.tensor([1.0, 1.0, 1.0]),
        ValueError,
        r"priority has shape \(3,\), expected \(2,\), \(2, n\) or \(2, n, 1\) with n in \[1, 2, 3\]",
    ),
    # was reduced over its 5 columns as if they were agents: GROUPS has 2 + 1
    "bare-wrong-agents": (
        torch.tensor([0, 1]),
        torch.ones(2, 5),
        ValueError,
        r"priority has shape \(2, 5\), expected \(2,\), \(2, n\) or \(2, n, 1\) with n in \[1, 2, 3\] \(a group's",
    ),
    "group-wrong-agents": (
        torch.tensor([0, 1]),
        {"red": torch.ones(2, 3)},
        ValueError,
        r"priority of group 'red' has shape \(2, 3\), expected \(2, 2\) or \(2, 2, 1\)",
    ),
    "unknown-group": (torch.tensor([0]), {"green": torch.ones(1, 1)}, KeyError, "group 'green' is not in the buffer"),
    "integer-priority": (torch.tensor([0]), torch.ones(1, dtype=torch.int64), TypeError, "expected floating point"),
    "float-index": (torch.tensor([0.0]), torch.ones(1), ValueError, r"index has shape \(1,\) and dtype torch.float32"),
}


@pytest.mark.parametrize("index, priority, error, message", BAD_PRIORITIES.values(), ids=BAD_PRIORITIES.keys())
def test_bad_priorities_are_clear_errors_and_write_nothing(index, priority, error, message):
    buffer = ReplayBuffer(GROUPS, 8, state_spec=STATE, prioritized=Prioritized(), check_values=True)
    buffer.extend(numbered(1, 3))
    before = snapshot(buffer)
    with pytest.raises(error, match=message):
        buffer.update_priority(index, priority)
    assert_unchanged(buffer, before)
    assert buffer.max_priority.item() == 1.0


def test_update_priority_of_a_uniform_buffer_and_bad_configs_are_errors():
    buffer = ReplayBuffer(GROUPS, 8, state_spec=STATE)
    with pytest.raises(RuntimeError, match="this buffer samples uniformly"):
        buffer.update_priority(torch.tensor([0]), torch.ones(1))
    with pytest.raises(ValueError, match=r"beta = 1.5, expected a float in \[0.0, 1.0\]"):
        Prioritized(beta=1.5)
    with pytest.raises(ValueError, match="eps = 0.0, expected a float > 0"):
        Prioritized(eps=0.0)
    with pytest.raises(ValueError, match="reduce = 'sum', expected 'max' or 'mean'"):
        Prioritized(reduce="sum")
    with pytest.raises(ValueError, match="capacity must be a positive int, got 0"):
        ReplayBuffer(GROUPS, 0)


@pytest.mark.parametrize(
    "build, error, message",
    [
        # alpha = inf made every leaf 0 or inf: the first prioritized draw then failed inside the sum tree
        (lambda: Prioritized(alpha=math.inf), ValueError, "alpha = inf, expected a finite float >= 0.0"),
        (lambda: Prioritized(alpha=math.nan), ValueError, "alpha = nan, expected a finite float >= 0.0"),
        # accepted, and refused by the sum tree at the first extend (uniform buffers: never)
        (lambda: ReplayBuffer(GROUPS, 8, backend="cuda"), ValueError, "backend='cuda' is not one of 'auto', 'triton'"),
        (lambda: ReplayBuffer(GROUPS, 8, check_values="no"), TypeError, "check_values must be True or False, got 'no'"),
        (lambda: ReplayBuffer(["red"], 8), TypeError, "groups must be a mapping group -> GroupSpec"),  # was dict()'s
        (lambda: ReplayBuffer(GROUPS, 8, device=None), ValueError, "device 'None' cannot hold tensors here"),
        # a hidden state for no group, or of the wrong number of agents, was stored and refused only at extend
        (lambda: ReplayBuffer(GROUPS, 8, hidden={"green": (1, 4)}), ValueError, r"hidden\['green'\] = \(1, 4\)"),
        (
            lambda: ReplayBuffer(GROUPS, 8, hidden={"red": (3, 4)}),
            ValueError,
            r"of one env step's hidden state, here \(2, h\)",
        ),
    ],
)
def test_bad_buffer_arguments_are_refused_when_built(build, error, message):
    with pytest.raises(error, match=message):
        build()


def test_update_priority_of_no_indices_changes_nothing():
    # k = 0 failed in reduce_priority's reshape: "cannot reshape tensor of 0 elements into shape [0, -1]"
    buffer = ReplayBuffer(GROUPS, 8, state_spec=STATE, prioritized=Prioritized())
    buffer.extend(numbered(1, 3))
    before = snapshot(buffer)
    buffer.update_priority(torch.zeros(0, dtype=torch.int64), {"red": torch.zeros(0, 2)})
    assert_unchanged(buffer, before)


# ---- checkpoints --------------------------------------------------------------------------------------


@pytest.mark.parametrize("prioritized", [None, Prioritized(alpha=0.8, beta=0.3)], ids=["uniform", "prioritized"])
def test_state_dict_round_trip_is_exact(prioritized):
    def build():
        return ReplayBuffer(GROUPS, 6, state_spec=STATE, prioritized=prioritized)

    buffer = build()
    buffer.extend(numbered(2, 4))  # 8 steps into 6 slots: wrapped, position 2
    if prioritized:
        buffer.update_priority(torch.tensor([0, 4, 5]), torch.tensor([3.0, 0.5, 7.0]))
    saved = io.BytesIO()
    torch.save(buffer.state_dict(), saved)
    saved.seek(0)
    restored = build()
    restored.load_state_dict(torch.load(saved))
    assert_unchanged(restored, snapshot(buffer))
    assert len(restored) == 6 and restored.position.item() == 2
    if prioritized:
        assert restored.max_priority.item() == buffer.max_priority.item()
    # Resumed runs draw the same batches and go on the same way.
    for b in (buffer, restored):
        b.extend(numbered(1, 3, first=8))
    one, two = (b.sample(5, torch.Generator().manual_seed(1)) for b in (buffer, restored))
    assert (one == two).all()


def test_load_state_dict_of_another_layout_is_an_error():
    buffer = ReplayBuffer(GROUPS, 6, state_spec=STATE)
    buffer.extend(numbered(1, 2))
    with pytest.raises(
        ValueError, match=r"the saved buffer \(capacity 6, layout .*\) does not match this one \(capacity 7"
    ):
        ReplayBuffer(GROUPS, 7, state_spec=STATE).load_state_dict(buffer.state_dict())
    with pytest.raises(ValueError, match="does not match this one"):
        ReplayBuffer(GROUPS, 6).load_state_dict(buffer.state_dict())
    with pytest.raises(ValueError, match="the saved buffer is uniform, this one is prioritized"):
        ReplayBuffer(GROUPS, 6, state_spec=STATE, prioritized=Prioritized()).load_state_dict(buffer.state_dict())
    # The tree holds (priority + eps) ** alpha: loaded under another alpha or eps, the saved leaves and the
    # new steps' would follow two formulas.
    prioritized = ReplayBuffer(GROUPS, 6, prioritized=Prioritized(alpha=0.6))
    prioritized.extend(numbered(1, 2))
    message = "the saved buffer's priorities are (priority + 1e-08) ** 0.6, this one's (priority + 1e-08) ** 0.9"
    with pytest.raises(ValueError, match=re.escape(message)):
        ReplayBuffer(GROUPS, 6, prioritized=Prioritized(alpha=0.9)).load_state_dict(prioritized.state_dict())
    with pytest.raises(ValueError, match=r"\(priority \+ 0.01\) \*\* 0.6"):
        ReplayBuffer(GROUPS, 6, prioritized=Prioritized(alpha=0.6, eps=0.01)).load_state_dict(prioritized.state_dict())
    ReplayBuffer(GROUPS, 6, prioritized=Prioritized(alpha=0.6, beta=0.9)).load_state_dict(prioritized.state_dict())


# ---- on a GPU -----------------------------------------------------------------------------------------


@pytest.mark.gpu
def test_on_cuda_nothing_syncs_and_the_tree_equals_the_cpu_one():
    prioritized = Prioritized(alpha=0.6, beta=0.4)
    buffers = {d: ReplayBuffer(GROUPS, 1000, d, state_spec=STATE, prioritized=prioritized) for d in ("cpu", "cuda")}
    generator = torch.Generator("cuda").manual_seed(0)
    for round_ in range(3):
        data = numbered(32, 16, first=512 * round_)  # 512 steps a call: the third wraps around
        index = torch.randint(len(buffers["cpu"]) or 1, (256,), generator=torch.Generator().manual_seed(round_))
        priority = torch.rand(256, 2, generator=torch.Generator().manual_seed(round_))
        buffers["cpu"].extend(data)
        if round_:
            buffers["cpu"].update_priority(index, {"red": priority})
        with forbid_host_sync():
            buffers["cuda"].extend(data.to("cuda"))
            if round_:
                buffers["cuda"].update_priority(index.cuda(), {"red": priority.cuda()})
            batch = buffers["cuda"].sample(512, generator)  # no more than the first round stored
        # Same sums in the same order; only CUDA's and the CPU's pow (leaf = p ** alpha) may differ in an ulp.
        torch.testing.assert_close(buffers["cuda"].tree.cpu(), buffers["cpu"].tree, rtol=1e-14, atol=0)
        slots = batch["index"]
        assert torch.equal(batch["state"], buffers["cuda"].storage[("state",)][slots])
        assert torch.equal(batch["blue", "action_mask"], buffers["cuda"].storage[("blue", "action_mask")][slots])
        assert (batch["weight"] <= 1).all() and batch["weight"].max() == 1

"""GAE: the Triton kernel (under TRITON_INTERPRET=1 here) and the fast torch path against the reference
loop, and the reference against hand-computed numbers."""

import math

import pytest
import torch
from kernel_cases import DENSITIES, assert_close, rollout

from envs.sync import forbid_host_sync
from kernels import gae
from kernels._common import column_layout

FAST = ("triton", "torch")
# Every test holds the Triton kernel, on CPU tensors, to the reference: under the interpreter.
pytestmark = pytest.mark.needs_interpreter
BATCHES = {"B1": (1,), "B7": (7,), "B5xn3": (5, 3), "B4xn3x1": (4, 3, 1)}


def gae_by(backend, data, gamma=0.9, lmbda=0.95):
    names = ("reward", "value", "next_value", "done", "terminated")
    return gae(*(data[name] for name in names), gamma=gamma, lmbda=lmbda, backend=backend)


def assert_matches_reference(data, gamma=0.9, lmbda=0.95, backends=FAST):
    expected = gae_by("reference", data, gamma, lmbda)
    for backend in backends:
        advantage, value_target = gae_by(backend, data, gamma, lmbda)
        assert advantage.is_contiguous() and value_target.is_contiguous()
        assert_close(advantage, expected[0])
        assert_close(value_target, expected[1])


@pytest.mark.parametrize("batch", BATCHES.values(), ids=BATCHES.keys())
@pytest.mark.parametrize("num_steps", [1, 3, 64, 200], ids=lambda t: f"T{t}")
def test_matches_reference_over_sizes(num_steps, batch):
    assert_matches_reference(rollout(num_steps, batch))


@pytest.mark.parametrize("lmbda", [0.0, 0.9, 1.0], ids=lambda x: f"lmbda{x}")
@pytest.mark.parametrize("gamma", [0.0, 0.9, 1.0], ids=lambda x: f"gamma{x}")
def test_matches_reference_over_gamma_lmbda(gamma, lmbda):
    assert_matches_reference(rollout(64, (5, 3)), gamma, lmbda)


@pytest.mark.parametrize("num_steps", [3, 64], ids=lambda t: f"T{t}")
@pytest.mark.parametrize("density", DENSITIES.values(), ids=DENSITIES.keys())
def test_matches_reference_over_flag_densities(density, num_steps):
    assert_matches_reference(rollout(num_steps, (7,), density))


def test_env_level_flags_broadcast_over_agents_without_a_copy():
    data = rollout(37, (6, 4, 1), density=0.1)  # [T, B, n, 1]
    env_flags = rollout(37, (6, 1, 1), density=0.1, seed=1)  # [T, B, 1, 1]
    data["done"], data["terminated"] = env_flags["done"], env_flags["terminated"]
    assert_matches_reference(data)
    expanded = {**data, "done": data["done"].expand(37, 6, 4, 1)}
    expanded["terminated"] = data["terminated"].expand(37, 6, 4, 1)
    for got, want in zip(gae_by("triton", data), gae_by("reference", expanded), strict=True):
        assert_close(got, want)
    # The kernel reads the env flag through a zero stride over agents: [B, n] stays a grid, no copy.
    n1, n2, tensors, strides = column_layout(data["value"].shape, [data["value"], data["done"]])
    assert (n1, n2) == (6, 4) and tensors[1] is data["done"]
    assert strides[3:] == [6, 1, 0]  # done: (time, env, agent) strides


def test_team_reward_broadcast_over_agents():
    data = rollout(20, (6, 4, 1))
    data["reward"] = data["reward"][:, :, :1]  # [T, B, 1, 1]
    assert_matches_reference(data)


def test_team_reward_and_team_bootstrap_broadcast_over_agents():
    # Only value has the output's shape: an op that wrote the output from reward and next_value alone
    # would resize it to [T, B, 1, 1].
    data = rollout(20, (6, 4, 1))
    data["reward"], data["next_value"] = data["reward"][:, :, :1], data["next_value"][:, :, :1]
    assert_matches_reference(data)


@pytest.mark.parametrize("dtype", [torch.bfloat16], ids=["bf16"])
def test_bf16_inputs_accumulate_in_fp32(dtype):
    data = rollout(64, (5, 3), dtype=dtype)
    assert_matches_reference(data)
    # The reference upcasts the same bf16 numbers; fp32 inputs of equal value give the same outputs.
    as_fp32 = {name: x.float() if x.is_floating_point() else x for name, x in data.items()}
    for got, want in zip(gae_by("triton", data), gae_by("reference", as_fp32), strict=True):
        assert_close(got, want)


@pytest.mark.parametrize("flag_dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
def test_float_flags_match_bool_flags(flag_dtype):
    # In bf16 or fp16, gamma * lmbda * (1 - done) would round gamma * lmbda = 0.855 (to 0.8555 in bf16).
    data = rollout(30, (5, 3), density=0.2)
    float_flags = {**data, "done": data["done"].to(flag_dtype), "terminated": data["terminated"].to(flag_dtype)}
    expected = gae_by("reference", data)
    for backend in (*FAST, "reference"):
        for got, want in zip(gae_by(backend, float_flags), expected, strict=True):
            assert_close(got, want)


NON_CONTIGUOUS = {
    "transposed-batch": lambda x: x.transpose(1, 2).contiguous().transpose(1, 2),
    "strided-slice": lambda x: torch.repeat_interleave(x, 2, dim=2)[:, :, ::2],
    "time-slice": lambda x: torch.repeat_interleave(x, 2, dim=0)[::2],
    "time-last-in-memory": lambda x: x.permute(1, 2, 0).contiguous().permute(2, 0, 1),
}


@pytest.mark.parametrize("make_view", NON_CONTIGUOUS.values(), ids=NON_CONTIGUOUS.keys())
def test_non_contiguous_inputs(make_view):
    data = rollout(19, (5, 3), density=0.1)
    views = {name: make_view(x) for name, x in data.items()}
    assert not views["value"].is_contiguous()
    assert all(torch.equal(views[name], data[name]) for name in data)
    expected = gae_by("reference", data)
    for backend in FAST:
        for got, want in zip(gae_by(backend, views), expected, strict=True):
            assert_close(got, want)


def test_flags_broadcast_over_a_middle_dim_are_copied_and_still_correct():
    # [T, B, 1, k] flags against [T, B, n, k] values leave three grid dims: the launcher copies them.
    data = rollout(11, (3, 4, 2), density=0.2)
    flags = rollout(11, (3, 1, 2), density=0.2, seed=2)
    data["done"], data["terminated"] = flags["done"], flags["terminated"]
    n1, n2, tensors, _ = column_layout(data["value"].shape, [data["value"], data["done"]])
    assert n1 * n2 == 24 and tensors[1] is not data["done"]
    assert_matches_reference(data)


def test_hand_computed_four_steps_with_one_truncation_and_one_termination():
    # t = 1 is truncated: it bootstraps from the true final observation's value 99, and cuts the trace.
    # t = 2 is terminated: no bootstrap. t = 3 ends the rollout without ending the episode: bootstraps.
    reward = torch.tensor([1.0, 2.0, 3.0, 4.0])
    value = torch.tensor([10.0, 20.0, 30.0, 40.0])
    next_value = torch.tensor([20.0, 99.0, 40.0, 50.0])
    done = torch.tensor([False, True, True, False])
    terminated = torch.tensor([False, False, True, False])
    # gamma = lmbda = 0.5, so gamma * lmbda = 0.25:
    #   delta = [1 + 0.5 * 20 - 10, 2 + 0.5 * 99 - 20, 3 + 0 - 30, 4 + 0.5 * 50 - 40] = [1, 31.5, -27, -11]
    #   A[3] = -11; A[2] = -27 (done); A[1] = 31.5 (done); A[0] = 1 + 0.25 * 31.5 = 8.875
    expected_advantage = torch.tensor([8.875, 31.5, -27.0, -11.0])
    expected_target = expected_advantage + value
    for backend in (*FAST, "reference"):
        advantage, value_target = gae(
            reward[:, None],
            value[:, None],
            next_value[:, None],
            done[:, None],
            terminated[:, None],
            gamma=0.5,
            lmbda=0.5,
            backend=backend,
        )
        torch.testing.assert_close(advantage[:, 0], expected_advantage, rtol=0, atol=0)
        torch.testing.assert_close(value_target[:, 0], expected_target, rtol=0, atol=0)


def test_a_large_next_value_at_a_terminated_step_does_not_swamp_the_reward():
    # A terminated step's next_value is not used; the torch path added gamma * next_value and took it
    # off again, which at 1e6 kept the reward only to float32's spacing there (0.0625): off by ~1e-2.
    data = rollout(6, (4, 3))
    data["terminated"][2] = data["done"][2] = True
    data["next_value"][2] = 1e6
    assert_matches_reference(data)


def test_non_finite_values_spread_to_earlier_steps_as_the_docstring_says():
    # Values are not checked, and the flags cut by multiplying: an inf next_value at a terminated step
    # (column 0) and a NaN reward of the next episode (both columns) make the earlier steps NaN, on every
    # backend alike. If that changes, the docstring's paragraph on values changes with it.
    data = rollout(4, (2,), density=0.0)
    data["done"][1] = True
    data["terminated"][1, 0] = True
    data["next_value"][1, 0] = math.inf
    data["reward"][2] = math.nan
    for backend in (*FAST, "reference"):
        advantage, value_target = gae_by(backend, data)
        assert advantage[:3].isnan().all() and value_target[:3].isnan().all(), backend
        assert advantage[3].isfinite().all(), backend


def test_one_dim_input_without_batch_dims():
    data = rollout(9, ())
    assert_matches_reference(data)


def test_empty_batch_gives_empty_outputs():
    data = rollout(5, (0, 3))
    for backend in (*FAST, "reference"):
        advantage, value_target = gae_by(backend, data)
        assert advantage.shape == value_target.shape == (5, 0, 3)


def test_outputs_carry_no_gradient():
    data = rollout(8, (3,))
    data["value"].requires_grad_(True)
    for backend in (*FAST, "reference"):
        advantage, value_target = gae_by(backend, data)
        assert not advantage.requires_grad and not value_target.requires_grad


# Wide rollouts, on one and on several torch threads: the recurrence's rows are split in blocks of rows
# (or pieces of a row when a row alone is over torch's parallel grain of 32768 elements).
WIDE = {"T40xB1000xn3": (40, (1000, 3)), "T3xB33000": (3, (33000,))}


@pytest.fixture(params=[1, 2], ids=["1-thread", "2-threads"])
def torch_threads(request):
    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(before)


@pytest.mark.parametrize("num_steps, batch", WIDE.values(), ids=WIDE.keys())
def test_matches_reference_across_row_blocks(num_steps, batch, torch_threads):
    data = rollout(num_steps, batch, density=0.05)
    flags = rollout(num_steps, (batch[0],) + (1,) * (len(batch) - 1), density=0.05, seed=1)
    assert_matches_reference(data)
    assert_matches_reference({**data, "done": flags["done"], "terminated": flags["terminated"]})


@pytest.mark.parametrize("tile", [1, 4, 16, 64], ids=lambda c: f"tile{c}")
@pytest.mark.parametrize("num_steps", [3, 16, 37], ids=lambda t: f"T{t}")
def test_kernel_over_several_programs_and_tile_sizes(num_steps, tile, monkeypatch):
    # Blocks of 16 columns: 35 columns take three programs, the last one partly masked. Tiles of 1 to 64
    # steps against T = 3, 16 and 37: T shorter than a tile, a multiple of it, and a partial earliest tile.
    monkeypatch.setattr("kernels._common.CPU_MAX_BLOCK", 16)
    monkeypatch.setattr("kernels._common.CPU_TILE", tile)
    data = rollout(num_steps, (5, 7), density=0.1)
    env_flags = rollout(num_steps, (5, 1), density=0.1, seed=1)
    assert_matches_reference(data, backends=("triton",))
    assert_matches_reference({**data, "done": env_flags["done"]}, backends=("triton",))


@pytest.mark.parametrize("lmbda", [0.5, 1.0], ids=lambda x: f"lmbda{x}")
@pytest.mark.parametrize("flag", ["done", "terminated"])
def test_episode_ends_at_tile_boundaries(flag, lmbda, monkeypatch):
    # Tiles of 4 steps over T = 13 are [9, 13), [5, 9), [1, 5), [0, 1): an episode ends at each tile's
    # first and last step (and at no other), so the trace is cut exactly where a tile's carry goes in or out.
    monkeypatch.setattr("kernels._common.CPU_TILE", 4)
    data = rollout(13, (3, 2), density=0.0)
    ends = torch.zeros(13, dtype=torch.bool)
    ends[[0, 1, 4, 5, 8, 9, 12]] = True
    data["done"] = ends[:, None, None].expand(13, 3, 2).clone()
    if flag == "terminated":
        data["terminated"] = data["done"].clone()
    data["done"][:, 0] = False  # and a column where no episode ends, whose carry crosses every boundary
    data["terminated"][:, 0] = False
    assert_matches_reference(data, gamma=0.99, lmbda=lmbda, backends=("triton",))


def test_long_rollout_with_gamma_lmbda_near_one_keeps_fp32_precision():
    # The scan multiplies a tile's trace decays in another order than the loop does: over T = 1024 steps
    # with no episode end and gamma * lmbda ~ 0.9999 (|A| up to ~100), the kernel stays within a few times
    # the fp32 loop's own rounding error, both against the same loop in float64.
    data, gamma = rollout(1024, (4, 3), density=0.0), 0.99995
    exact = torch.zeros(1024, 4, 3, dtype=torch.float64)
    next_advantage = torch.zeros(4, 3, dtype=torch.float64)
    for t in reversed(range(1024)):  # no episode ends: delta = r + gamma * V' - V, A = delta + gamma^2 * A'
        delta = data["reward"][t].double() + gamma * data["next_value"][t].double() - data["value"][t].double()
        exact[t] = next_advantage = delta + gamma * gamma * next_advantage
    kernel_error = (gae_by("triton", data, gamma, gamma)[0].double() - exact).abs().max()
    loop_error = (gae_by("reference", data, gamma, gamma)[0].double() - exact).abs().max()
    assert exact.abs().max() > 30
    assert kernel_error <= 4 * loop_error, (kernel_error, loop_error)


# Per-column gamma and lmbda: (batch of the values, of the flags, gamma's shape, lmbda's shape, or None for a
# float). A tensor broadcasts against [*batch], aligned on the right.
PER_COLUMN = {
    "per-env-gamma": ((6, 4, 1), (6, 1, 1), (6, 1, 1), None),
    "per-env-lmbda": ((6, 4, 1), (6, 1, 1), None, (6, 1, 1)),
    "per-agent-gamma-per-env-lmbda": ((6, 4, 1), (6, 1, 1), (4, 1), (6, 1, 1)),
    "every-column-both": ((5, 7), (5, 7), (5, 7), (5, 7)),
    "zero-dim-gamma": ((9,), (9,), (), (9,)),
    "three-grid-dims-copied": ((3, 4, 2), (3, 1, 2), (3, 1, 2), None),
}


def per_column_scalar_calls(data, gamma, lmbda):
    """The independent check: the reference called once per column with that column's floats."""
    shape = data["value"].shape
    columns = {name: x.expand(shape).reshape(shape[0], -1) for name, x in data.items()}  # [T, N]
    gammas, lmbdas = (torch.as_tensor(x).expand(shape[1:]).reshape(-1) for x in (gamma, lmbda))
    outputs = [
        gae_by("reference", {name: x[:, j] for name, x in columns.items()}, float(gammas[j]), float(lmbdas[j]))
        for j in range(gammas.numel())
    ]
    return tuple(torch.stack(out, 1).view(shape) for out in zip(*outputs, strict=True))


@pytest.mark.parametrize("batch, flag_batch, gamma_shape, lmbda_shape", PER_COLUMN.values(), ids=PER_COLUMN.keys())
def test_per_column_gamma_and_lmbda_match_a_scalar_call_per_column(batch, flag_batch, gamma_shape, lmbda_shape):
    data = rollout(13, batch, density=0.1)
    flags = rollout(13, flag_batch, density=0.1, seed=1)
    data["done"], data["terminated"] = flags["done"], flags["terminated"]
    generator = torch.Generator().manual_seed(2)
    gamma, lmbda = (0.9 if s is None else torch.rand(s, generator=generator) for s in (gamma_shape, lmbda_shape))
    expected = per_column_scalar_calls(data, gamma, lmbda)
    for backend in (*FAST, "reference"):
        for got, want in zip(gae_by(backend, data, gamma, lmbda), expected, strict=True):
            assert_close(got, want)


def test_per_column_gamma_and_lmbda_over_several_programs(monkeypatch):
    # 35 columns in blocks of 16: three programs, the last partly masked, each loading its columns' values.
    monkeypatch.setattr("kernels._common.CPU_MAX_BLOCK", 16)
    data = rollout(21, (5, 7), density=0.1)
    gamma, lmbda = torch.rand(5, 1), torch.rand(5, 7)
    expected = per_column_scalar_calls(data, gamma, lmbda)
    for got, want in zip(gae_by("triton", data, gamma, lmbda), expected, strict=True):
        assert_close(got, want)


@pytest.mark.parametrize("backend", ["torch", "reference"])
def test_per_column_gamma_and_lmbda_need_no_host_sync(backend):
    # The Triton path is left out: its CPU interpreter copies tensors to the host, a CUDA launch does not.
    data = rollout(50, (8, 3, 1), density=0.1)
    gamma, lmbda = torch.rand(8, 1, 1), torch.rand(8, 1, 1)
    with forbid_host_sync("cpu"):
        gae_by(backend, data, gamma, lmbda)

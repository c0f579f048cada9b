"""TD(lambda) and discounted returns: Triton kernel (interpreted here) and fast torch path against the
reference loops; the references against hand-computed numbers and against GAE."""

import pytest
import torch
from kernel_cases import DENSITIES, assert_close, rollout

from kernels import discounted_returns, gae, td_lambda_returns

FAST = ("triton", "torch")
# Every test holds the Triton kernel, on CPU tensors, to the reference: under the interpreter.
pytestmark = pytest.mark.needs_interpreter
BATCHES = {"B1": (1,), "B7": (7,), "B5xn3": (5, 3), "B4xn3x1": (4, 3, 1)}


def td_lambda_by(backend, data, gamma=0.9, lmbda=0.95):
    names = ("reward", "next_value", "done", "terminated")
    return td_lambda_returns(*(data[name] for name in names), gamma=gamma, lmbda=lmbda, backend=backend)


def monte_carlo_by(backend, data, gamma=0.9):
    return discounted_returns(data["reward"], data["done"], gamma=gamma, backend=backend)


def bootstrapped_by(backend, data, gamma=0.9):
    return discounted_returns(
        data["reward"],
        data["done"],
        gamma=gamma,
        next_value=data["next_value"],
        terminated=data["terminated"],
        backend=backend,
    )


OPS = {"td_lambda": td_lambda_by, "monte_carlo": monte_carlo_by, "bootstrapped": bootstrapped_by}


def assert_matches_reference(op, data, **hyper):
    expected = op("reference", data, **hyper)
    for backend in FAST:
        got = op(backend, data, **hyper)
        assert got.is_contiguous()
        assert_close(got, expected)


@pytest.mark.parametrize("batch", BATCHES.values(), ids=BATCHES.keys())
@pytest.mark.parametrize("num_steps", [1, 3, 64, 200], ids=lambda t: f"T{t}")
@pytest.mark.parametrize("op", OPS.values(), ids=OPS.keys())
def test_matches_reference_over_sizes(op, num_steps, batch):
    assert_matches_reference(op, rollout(num_steps, batch))


@pytest.mark.parametrize("lmbda", [0.0, 0.9, 1.0], ids=lambda x: f"lmbda{x}")
@pytest.mark.parametrize("gamma", [0.0, 0.9, 1.0], ids=lambda x: f"gamma{x}")
def test_td_lambda_matches_reference_over_gamma_lmbda(gamma, lmbda):
    assert_matches_reference(td_lambda_by, rollout(64, (5, 3)), gamma=gamma, lmbda=lmbda)


@pytest.mark.parametrize("gamma", [0.0, 0.9, 1.0], ids=lambda x: f"gamma{x}")
@pytest.mark.parametrize("op", [monte_carlo_by, bootstrapped_by], ids=["monte_carlo", "bootstrapped"])
def test_discounted_matches_reference_over_gamma(op, gamma):
    assert_matches_reference(op, rollout(64, (5, 3)), gamma=gamma)


@pytest.mark.parametrize("density", DENSITIES.values(), ids=DENSITIES.keys())
@pytest.mark.parametrize("op", OPS.values(), ids=OPS.keys())
def test_matches_reference_over_flag_densities(op, density):
    assert_matches_reference(op, rollout(64, (7,), density))


@pytest.mark.parametrize("op", OPS.values(), ids=OPS.keys())
def test_env_level_flags_bf16_and_non_contiguous_inputs(op):
    data = rollout(21, (6, 4, 1), density=0.1, dtype=torch.bfloat16)
    flags = rollout(21, (6, 1, 1), density=0.1, seed=1)
    data["done"], data["terminated"] = flags["done"], flags["terminated"]
    assert_matches_reference(op, data)
    views = {name: x.transpose(1, 2).contiguous().transpose(1, 2) for name, x in data.items()}
    assert_matches_reference(op, views)


@pytest.mark.parametrize("op", [td_lambda_by, bootstrapped_by], ids=["td_lambda", "bootstrapped"])
def test_a_large_next_value_at_a_terminated_step_does_not_swamp_the_reward(op):
    # As in GAE's test of the same name: a terminated step's next_value is not used; the torch path added
    # gamma * next_value and took it off again, which at 1e6 kept the reward only to float32's spacing there.
    data = rollout(6, (4, 3))
    for t in (2, 5):  # a middle step, and the last, which the torch path computes apart
        data["terminated"][t] = data["done"][t] = True
        data["next_value"][t] = 1e6
    assert_matches_reference(op, data)


@pytest.mark.parametrize("flag_dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("op", OPS.values(), ids=OPS.keys())
def test_half_precision_float_flags_match_bool_flags(op, flag_dtype):
    # In bf16, gamma * (1 - done) would round gamma = 0.9 to 0.8984.
    data = rollout(30, (5, 3), density=0.2)
    half_flags = {**data, "done": data["done"].to(flag_dtype), "terminated": data["terminated"].to(flag_dtype)}
    expected = op("reference", data)
    for backend in (*FAST, "reference"):
        assert_close(op(backend, half_flags), expected)


def test_hand_computed_four_steps_with_one_truncation_and_one_termination():
    # The case of test_gae: t = 1 truncated (bootstraps from 99), t = 2 terminated, t = 3 ends the rollout.
    reward = torch.tensor([1.0, 2.0, 3.0, 4.0])[:, None]
    next_value = torch.tensor([20.0, 99.0, 40.0, 50.0])[:, None]
    done = torch.tensor([False, True, True, False])[:, None]
    terminated = torch.tensor([False, False, True, False])[:, None]
    # gamma = lmbda = 0.5:
    #   G[3] = 4 + 0.5 * 50 = 29 (rollout end bootstraps); G[2] = 3 (terminated); G[1] = 2 + 0.5 * 99 = 51.5
    #   G[0] = 1 + 0.5 * (0.5 * 20 + 0.5 * G[1]) = 18.875
    # lambda = 1 keeps the same ends and gives G[0] = 1 + 0.5 * 51.5 = 26.75; without a critic
    # G = [1 + 0.5 * 2, 2, 3, 4].
    cases = {
        "td_lambda": (
            lambda b: td_lambda_returns(reward, next_value, done, terminated, gamma=0.5, lmbda=0.5, backend=b),
            [18.875, 51.5, 3.0, 29.0],
        ),
        "bootstrapped": (
            lambda b: discounted_returns(
                reward, done, gamma=0.5, next_value=next_value, terminated=terminated, backend=b
            ),
            [26.75, 51.5, 3.0, 29.0],
        ),
        "monte_carlo": (
            lambda b: discounted_returns(reward, done, gamma=0.5, backend=b),
            [2.0, 2.0, 3.0, 4.0],
        ),
    }
    for name, (run, expected) in cases.items():
        for backend in (*FAST, "reference"):
            torch.testing.assert_close(run(backend)[:, 0], torch.tensor(expected), rtol=0, atol=0, msg=name)


@pytest.mark.parametrize("lmbda", [0.0, 0.7, 1.0], ids=lambda x: f"lmbda{x}")
def test_gae_value_target_equals_td_lambda_return(lmbda):
    # Within an episode next_value[t] == value[t + 1]; at an episode end next_value is the true final
    # observation's value, and value[t + 1] that of the reset observation. Then GAE's value target is
    # the TD(lambda) return: two formulations, one answer.
    data = rollout(50, (9, 2), density=0.1)
    values = torch.randn(51, 9, 2, generator=torch.Generator().manual_seed(3))
    data["value"] = values[:-1]
    data["next_value"] = torch.where(data["done"], data["next_value"], values[1:])
    names = ("reward", "value", "next_value", "done", "terminated")
    _, value_target = gae(*(data[name] for name in names), gamma=0.9, lmbda=lmbda, backend="reference")
    assert_close(td_lambda_by("reference", data, gamma=0.9, lmbda=lmbda), value_target)


WIDE = {"T40xB1000xn3": (40, (1000, 3)), "T3xB33000": (3, (33000,))}  # blocks of rows; pieces of rows


@pytest.mark.parametrize("num_steps, batch", WIDE.values(), ids=WIDE.keys())
@pytest.mark.parametrize("op", OPS.values(), ids=OPS.keys())
def test_matches_reference_across_row_blocks(op, num_steps, batch):
    before = torch.get_num_threads()
    torch.set_num_threads(2)  # several threads: the vectorised passes run in parallel, the recurrence in pieces
    try:
        assert_matches_reference(op, rollout(num_steps, batch, density=0.05))
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("tile", [1, 4, 16, 64], ids=lambda c: f"tile{c}")
@pytest.mark.parametrize("num_steps", [3, 16, 37], ids=lambda t: f"T{t}")
@pytest.mark.parametrize("op", OPS.values(), ids=OPS.keys())
def test_kernel_over_several_programs_and_tile_sizes(op, num_steps, tile, monkeypatch):
    # T shorter than a tile, a multiple of it, and a partial earliest tile
    monkeypatch.setattr("kernels._common.CPU_MAX_BLOCK", 16)  # 35 columns: three programs
    monkeypatch.setattr("kernels._common.CPU_TILE", tile)
    data = rollout(num_steps, (5, 7), density=0.1)
    expected = op("reference", data)
    assert_close(op("triton", data), expected)


@pytest.mark.parametrize("flag", ["done", "terminated"])
@pytest.mark.parametrize("op", OPS.values(), ids=OPS.keys())
def test_episode_ends_at_tile_boundaries(op, flag, monkeypatch):
    # Tiles of 4 steps over T = 13 are [9, 13), [5, 9), [1, 5), [0, 1): an episode ends at each tile's
    # first and last step, so the trace is cut exactly where a tile's carry goes in or out; column 0 has
    # no episode end, its carry crosses every boundary.
    monkeypatch.setattr("kernels._common.CPU_TILE", 4)
    data = rollout(13, (3, 2), density=0.0)
    ends = torch.zeros(13, 3, 2, dtype=torch.bool)
    ends[[0, 1, 4, 5, 8, 9, 12], 1:] = True
    data["done"] = ends
    if flag == "terminated":
        data["terminated"] = ends.clone()
    expected = op("reference", data, gamma=0.99)
    assert_close(op("triton", data, gamma=0.99), expected)


def test_bootstrapped_returns_read_a_next_value_of_size_one_in_a_batch_dim_on_every_backend():
    # discounted_returns' output is reward's shape, and next_value may have size 1 in a batch dim (an env-level
    # value [T, B, 1] against per-agent rewards [T, B, n]): the reference loop failed there in torch's expand.
    data = rollout(9, (5, 3), density=0.2)
    shared = data["next_value"][..., :1]  # [T, B, 1]
    expected = bootstrapped_by("reference", {**data, "next_value": shared.expand(9, 5, 3).contiguous()})
    for backend in (*FAST, "reference"):
        assert_close(bootstrapped_by(backend, {**data, "next_value": shared}), expected)

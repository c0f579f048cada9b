"""Every input error is raised with a message that names the argument and what was expected."""

import re

import numpy as np
import pytest
import torch

from kernels import discounted_returns, gae, td_lambda_returns

T, B, N = 4, 5, 3


def inputs(**changes):
    """GAE inputs [T, B, n], with some replaced."""
    data = {
        "reward": torch.zeros(T, B, N),
        "value": torch.zeros(T, B, N),
        "next_value": torch.zeros(T, B, N),
        "done": torch.zeros(T, B, N, dtype=torch.bool),
        "terminated": torch.zeros(T, B, N, dtype=torch.bool),
    }
    return {**data, **changes}


def call_gae(gamma=0.9, lmbda=0.95, backend="auto", **changes):
    return gae(**inputs(**changes), gamma=gamma, lmbda=lmbda, backend=backend)


EXPECTED_SHAPE = "; expected value's shape (4, 5, 3), or that shape with 1 in some batch dims"
GAE_ERRORS = {
    "flag-batch-mismatch": (
        dict(done=torch.zeros(T, B, 2, dtype=torch.bool)),
        ValueError,
        "gae: done has shape (4, 5, 2)" + EXPECTED_SHAPE,
    ),
    "reward-fewer-steps": (
        dict(reward=torch.zeros(T - 1, B, N)),
        ValueError,
        "gae: reward has shape (3, 5, 3)",
    ),
    "reward-missing-dim": (
        dict(reward=torch.zeros(T, B)),
        ValueError,
        "gae: reward has shape (4, 5)" + EXPECTED_SHAPE,
    ),
    "next-value-broadcast-over-time": (
        dict(next_value=torch.zeros(1, B, N)),
        ValueError,
        "gae: next_value has shape (1, 5, 3)",
    ),
    "zero-steps": (
        {name: x[:0] for name, x in inputs().items()},
        ValueError,
        "gae: value has T = 0 time steps (shape (0, 5, 3)); expected at least one step",
    ),
    "zero-dim-value": (
        dict(value=torch.tensor(1.0)),
        ValueError,
        "gae: value is a 0-d tensor; expected a time-major tensor [T, *batch]",
    ),
    "integer-value": (
        dict(value=torch.zeros(T, B, N, dtype=torch.int64)),
        TypeError,
        "gae: value has dtype torch.int64; expected floating point (float32, bfloat16)",
    ),
    "integer-reward": (
        dict(reward=torch.zeros(T, B, N, dtype=torch.int32)),
        TypeError,
        "gae: reward has dtype torch.int32",
    ),
    "integer-flag": (
        dict(terminated=torch.zeros(T, B, N, dtype=torch.int64)),
        TypeError,
        "gae: terminated has dtype torch.int64; expected bool (or float 0.0/1.0)",
    ),
    "not-a-tensor": (dict(reward=[0.0] * T), TypeError, "gae: reward must be a torch.Tensor, got list"),
    # the shape owner is checked like the others, before its shape is read
    "value-not-a-tensor": (dict(value=[0.0] * T), TypeError, "gae: value must be a torch.Tensor, got list"),
    # None is no "optional input not given": every gae input is required
    "terminated-none": (dict(terminated=None), TypeError, "gae: terminated must be a torch.Tensor, got NoneType"),
    "next-value-none": (dict(next_value=None), TypeError, "gae: next_value must be a torch.Tensor, got NoneType"),
    "sparse-reward": (
        dict(reward=torch.zeros(T, B, N).to_sparse()),
        TypeError,
        "gae: reward is a torch.sparse_coo tensor; expected a dense (torch.strided) tensor",
    ),
    "different-devices": (
        dict(done=torch.zeros(T, B, N, dtype=torch.bool, device="meta")),
        ValueError,
        "gae: done is on meta, expected cpu like value",
    ),
    # hyper-parameters and backend
    "gamma-above-one": (dict(gamma=1.5), ValueError, "gae: gamma = 1.5 is outside [0, 1]"),
    "gamma-negative": (dict(gamma=-0.1), ValueError, "gae: gamma = -0.1 is outside [0, 1]"),
    "gamma-nan": (dict(gamma=float("nan")), ValueError, "gae: gamma = nan is outside [0, 1]"),
    "lmbda-above-one": (dict(lmbda=2), ValueError, "gae: lmbda = 2 is outside [0, 1]"),
    "gamma-numpy-float32": (  # float32 is also the dtype a per-column tensor must have: name numpy's type
        dict(gamma=np.float32(0.9)),
        TypeError,
        "gae: gamma must be a Python float in [0, 1] or a float32 tensor of one value per column, got numpy.float32",
    ),
    "lmbda-bool": (
        dict(lmbda=True),
        TypeError,
        "gae: lmbda must be a Python float in [0, 1] or a float32 tensor of one value per column, got bool",
    ),
    # per-column gamma and lmbda tensors: float32, on the inputs' device, broadcast against [*batch] = (5, 3)
    "gamma-float64-tensor": (
        dict(gamma=torch.full((B, 1), 0.9, dtype=torch.float64)),
        TypeError,
        "gae: gamma has dtype torch.float64; expected float32 (one value per column)",
    ),
    "gamma-tensor-with-a-time-dim": (
        dict(gamma=torch.full((T, B, 1), 0.9)),
        ValueError,
        "gae: gamma has shape (4, 5, 1); expected one that broadcasts against the batch dims (5, 3) of the"
        " inputs (4, 5, 3) (aligned on the right",
    ),
    "lmbda-tensor-of-the-wrong-size": (
        dict(lmbda=torch.full((B,), 0.9)),  # aligned on the right: against n = 3, not B = 5
        ValueError,
        "gae: lmbda has shape (5,); expected one that broadcasts against the batch dims (5, 3)",
    ),
    "gamma-tensor-on-another-device": (
        dict(gamma=torch.full((B, 1), 0.9, device="meta")),
        ValueError,
        "gae: gamma is on meta, expected cpu like the inputs",
    ),
    "lmbda-sparse-tensor": (
        dict(lmbda=torch.full((B, N), 0.9).to_sparse()),
        TypeError,
        "gae: lmbda is a torch.sparse_coo tensor; expected a dense (torch.strided) tensor",
    ),
    "unknown-backend": (
        dict(backend="cuda"),
        ValueError,
        "backend='cuda' is not one of 'auto', 'triton', 'torch', 'reference'",
    ),
}


@pytest.mark.parametrize("backend", ["triton", "torch", "reference"])
@pytest.mark.parametrize("changes, error, message", GAE_ERRORS.values(), ids=GAE_ERRORS.keys())
def test_gae_errors(changes, error, message, backend):
    with pytest.raises(error, match=re.escape(message)):
        call_gae(**{"backend": backend, **changes})


def test_td_lambda_returns_errors_name_next_value_as_the_shape_owner():
    data = inputs(reward=torch.zeros(T, B, 2))
    with pytest.raises(
        ValueError,
        match=re.escape("td_lambda_returns: reward has shape (4, 5, 2); expected next_value's shape (4, 5, 3)"),
    ):
        td_lambda_returns(data["reward"], data["next_value"], data["done"], data["terminated"], gamma=0.9, lmbda=0.9)
    with pytest.raises(ValueError, match=re.escape("td_lambda_returns: lmbda = -1.0 is outside [0, 1]")):
        td_lambda_returns(
            data["next_value"], data["next_value"], data["done"], data["terminated"], gamma=0.9, lmbda=-1.0
        )


def test_discounted_returns_errors():
    data = inputs()
    with pytest.raises(ValueError, match="discounted_returns: pass next_value and terminated together"):
        discounted_returns(data["reward"], data["done"], gamma=0.9, next_value=data["next_value"])
    with pytest.raises(ValueError, match="discounted_returns: pass next_value and terminated together"):
        discounted_returns(data["reward"], data["done"], gamma=0.9, terminated=data["terminated"])
    with pytest.raises(
        ValueError,
        match=re.escape("discounted_returns: done has shape (4, 1, 2); expected reward's shape (4, 5, 3)"),
    ):
        discounted_returns(data["reward"], torch.zeros(T, 1, 2, dtype=torch.bool), gamma=0.9)
    with pytest.raises(ValueError, match=re.escape("discounted_returns: gamma = 1.01 is outside [0, 1]")):
        discounted_returns(data["reward"], data["done"], gamma=1.01)
    message = "discounted_returns: gamma must be a Python float in [0, 1], got torch.Tensor (pass float(tensor) once"
    with pytest.raises(TypeError, match=re.escape(message)):
        discounted_returns(data["reward"], data["done"], gamma=torch.tensor(0.9))


@pytest.mark.parametrize("backend", ["triton", "torch", "reference"])
def test_missing_required_inputs_are_named(backend):
    data = inputs()
    with pytest.raises(
        TypeError, match=re.escape("td_lambda_returns: terminated must be a torch.Tensor, got NoneType")
    ):
        td_lambda_returns(data["reward"], data["next_value"], data["done"], None, gamma=0.9, lmbda=0.9, backend=backend)
    with pytest.raises(TypeError, match=re.escape("td_lambda_returns: next_value must be a torch.Tensor, got list")):
        td_lambda_returns(
            data["reward"], [0.0], data["done"], data["terminated"], gamma=0.9, lmbda=0.9, backend=backend
        )
    with pytest.raises(TypeError, match=re.escape("discounted_returns: done must be a torch.Tensor, got NoneType")):
        discounted_returns(data["reward"], None, gamma=0.9, backend=backend)
    with pytest.raises(TypeError, match=re.escape("discounted_returns: reward must be a torch.Tensor, got NoneType")):
        discounted_returns(None, data["done"], gamma=0.9, backend=backend)

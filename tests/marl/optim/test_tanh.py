"""marl.optim.tanh: the sigmoid form equals torch's tanh and its gradient, and is taken only where chosen."""

import pytest
import torch

from marl.optim import tanh
from marl.optim.tanh import Tanh


@pytest.mark.parametrize("via_sigmoid", [False, True], ids=["torch_tanh", "sigmoid_form"])
def test_tanh_activation_equals_torch_tanh_with_its_gradient(monkeypatch, via_sigmoid):
    monkeypatch.setattr(tanh, "EAGER_TANH_VIA_SIGMOID", via_sigmoid)
    x = torch.linspace(-12, 12, 2001, dtype=torch.float32, requires_grad=True)
    ours = Tanh()(x)
    assert (ours.grad_fn.name() == "_SigmoidTanhBackward") == via_sigmoid
    ours.sum().backward()
    grad = x.grad.clone()
    x.grad = None
    reference = torch.tanh(x)
    reference.sum().backward()
    torch.testing.assert_close(ours, reference, atol=3e-7, rtol=0)
    torch.testing.assert_close(grad, x.grad, atol=1e-6, rtol=0)
    # Acting (no gradient): the same numbers, without the autograd Function's per-call cost.
    monkeypatch.setattr(tanh._SigmoidTanh, "apply", None)
    with torch.no_grad():
        assert torch.equal(Tanh()(x), ours.detach())


@pytest.mark.parametrize(
    ("mkl", "vendor", "expected"),
    [(True, "AuthenticAMD", True), (True, "GenuineIntel", False), (True, "", False), (False, "AuthenticAMD", False)],
)
def test_eager_tanh_takes_the_sigmoid_form_only_where_mkl_runs_its_slow_paths(monkeypatch, mkl, vendor, expected):
    monkeypatch.setattr(torch.backends.mkl, "is_available", lambda: mkl)
    monkeypatch.setattr(tanh, "_cpu_vendor", lambda: vendor)
    assert tanh._eager_tanh_via_sigmoid() is expected

"""tanh for the networks, with the CPU path that measured faster end to end.

Built with MKL, torch's eager CPU tanh runs MKL's vector math, which picks its code paths by CPU vendor:
fast on Intel's, slow elsewhere (AMD), where `2 * sigmoid(2x) - 1` (torch's own vectorised sigmoid) is
several times faster. Under torch.compile, Inductor's C++ code for tanh is slower than for the sigmoid
form on every CPU. `marl train` defaults on an AMD CPU measured faster with it (the README's table of
CPU-only paths); on CUDA and on Intel's eager path it is plain `torch.tanh`.
"""

from __future__ import annotations

import torch
from torch import nn


def _sigmoid_tanh(x: torch.Tensor) -> torch.Tensor:
    return torch.sigmoid(x * 2.0).mul_(2.0).sub_(1.0)


class _SigmoidTanh(torch.autograd.Function):
    """tanh(x) as `2 * sigmoid(2x) - 1` (equal within 3e-7), with tanh's own backward `grad * (1 - y^2)`."""

    @staticmethod
    def forward(x: torch.Tensor) -> torch.Tensor:
        return _sigmoid_tanh(x)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:  # apart from forward, as torch.func's grad needs
        ctx.save_for_backward(output)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        (y,) = ctx.saved_tensors
        return torch.ops.aten.tanh_backward(grad, y)


def _cpu_vendor() -> str:
    """The CPU's vendor string from /proc/cpuinfo (`GenuineIntel`, `AuthenticAMD`, ...), "" where unknown."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("vendor_id"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def _eager_tanh_via_sigmoid() -> bool:
    """Whether torch's eager CPU tanh is MKL's slow path here: MKL present, and the CPU not Intel's."""
    return torch.backends.mkl.is_available() and _cpu_vendor() not in ("GenuineIntel", "")


EAGER_TANH_VIA_SIGMOID = _eager_tanh_via_sigmoid()


class Tanh(nn.Module):
    """tanh; on the CPU the sigmoid form where that is faster (see the module docstring)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.device.type == "cpu" and (EAGER_TANH_VIA_SIGMOID or torch.compiler.is_compiling()):
            if not torch.is_grad_enabled():
                # Acting: the same arithmetic without the Function, whose every eager call binds its
                # arguments through `inspect.signature`, a cost per call that small rollouts feel.
                return _sigmoid_tanh(x)
            return _SigmoidTanh.apply(x)
        return torch.tanh(x)

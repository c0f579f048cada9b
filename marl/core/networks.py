"""Multi-agent networks: one batched MLP per group, mapping `[*B, n, d_in] -> [*B, n, d_out]`.

Parameters are shared by the group's agents (one MLP applied to every agent), or held per agent:
then every layer's weights are stacked on a leading agent dim `[n, d_in, d_out]` and applied as one
batched matmul, never a loop over agents.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

from marl.optim.tanh import Tanh

ACTIVATIONS = {"tanh": Tanh, "relu": nn.ReLU, "elu": nn.ELU}


class StackedLinear(nn.Module):
    """`n` independent linear layers applied at once: `[*B, n, d_in] -> [*B, n, d_out]`."""

    def __init__(self, n_agents: int, in_features: int, out_features: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(n_agents, in_features, out_features))  # [n, d_in, d_out]
        self.bias = nn.Parameter(torch.zeros(n_agents, out_features))  # [n, d_out]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch = x.shape[:-2]
        n, d_in = x.shape[-2:]
        # [n, prod(B), d_in] @ [n, d_in, d_out] -> [n, prod(B), d_out]
        y = torch.baddbmm(self.bias.unsqueeze(1), x.reshape(-1, n, d_in).transpose(0, 1), self.weight)
        return y.transpose(0, 1).reshape(*batch, n, -1)


def _orthogonal_(weight: torch.Tensor, gain: float) -> None:
    """Orthogonal init of `[d_out, d_in]` (nn.Linear) or `[n, d_in, d_out]` (stacked) weights."""
    with torch.no_grad():
        if weight.dim() == 2:
            nn.init.orthogonal_(weight, gain)
        else:
            for w in weight:  # initialisation only: a loop over agents once, never in a forward pass
                nn.init.orthogonal_(w.T, gain)


class MultiAgentMLP(nn.Module):
    """An MLP for a group of `n_agents`: `[*B, n, in_features] -> [*B, n, out_features]`.

    Args:
        in_features: input size per agent (for a centralised critic, the size of its global input).
        out_features: output size per agent.
        n_agents: agents in the group.
        hidden: hidden layer sizes.
        activation: `"tanh"`, `"relu"` or `"elu"`.
        share_params: one MLP for every agent; else per-agent parameters, stacked.
        output_gain: gain of the last layer's orthogonal init (small for policies, 1 for critics).
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        n_agents: int,
        hidden: Sequence[int] = (64, 64),
        activation: str = "tanh",
        share_params: bool = True,
        output_gain: float = 1.0,
    ) -> None:
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(f"unknown activation {activation!r}; expected one of {list(ACTIVATIONS)}")
        self.n_agents, self.in_features, self.out_features = n_agents, in_features, out_features
        self.share_params = share_params
        sizes = [in_features, *hidden, out_features]
        layers: list[nn.Module] = []
        for i, (d_in, d_out) in enumerate(zip(sizes[:-1], sizes[1:])):
            layer = nn.Linear(d_in, d_out) if share_params else StackedLinear(n_agents, d_in, d_out)
            last = i == len(sizes) - 2
            _orthogonal_(layer.weight, output_gain if last else math.sqrt(2))
            nn.init.zeros_(layer.bias)
            layers.append(layer)
            if not last:
                layers.append(ACTIVATIONS[activation]())
        self.layers = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-2:] != (self.n_agents, self.in_features):
            raise ValueError(
                f"MultiAgentMLP expects inputs [*B, {self.n_agents}, {self.in_features}], got {tuple(x.shape)}"
            )
        if not self.share_params:
            return self.layers(x)  # stacked layers act on [*B, n, d]
        # Shared: one 2-D pass over all rows [prod(B) * n, d]; a linear layer on more dims would
        # reshape to 2-D and back (and autograd record both) at every layer.
        return self.layers(x.reshape(-1, self.in_features)).view(*x.shape[:-1], self.out_features)

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


class MultiAgentGRU(nn.Module):
    """A GRU for a group of `n_agents`: inputs `[*B, n, in_features]`, hidden state `[*B, n, hidden_size]`.

    The gates are `torch.nn.GRU`'s (reset r, update z, candidate c):
    `r = σ(x W_ir + h W_hr + b_r)`, `z = σ(x W_iz + h W_hz + b_z)`, `c = tanh(x W_ic + b_ic + r (h W_hc + b_hc))`,
    `h' = (1 - z) c + z h`. Weights are stacked `[k, d, 3h]` (`k` = 1 shared, or `n` per agent), so every
    product is one batched matmul over the agents. Inside, tensors are "rows": `[k, R, features]` with `R`
    the rows each weight sees (`prod(B) * n` shared, `prod(B)` per agent).

    `forward(x, h)` takes one step (acting); `scan(x, h0, reset)` runs a sequence `[L, *M, n, d]` from
    `h0`, zeroing the state before step t where `reset[t]` (an episode started there): the input
    products of all L steps are one matmul, and only the recurrent product and the gates run per step.
    """

    def __init__(self, in_features: int, hidden_size: int, n_agents: int, share_params: bool = True) -> None:
        super().__init__()
        self.n_agents, self.in_features, self.hidden_size = n_agents, in_features, hidden_size
        self.share_params = share_params
        k = 1 if share_params else n_agents
        self.weight_ih = nn.Parameter(torch.empty(k, in_features, 3 * hidden_size))  # [k, d, 3h]: r, z, c
        self.weight_hh = nn.Parameter(torch.empty(k, hidden_size, 3 * hidden_size))  # [k, h, 3h]
        self.bias_ih = nn.Parameter(torch.zeros(k, 3 * hidden_size))  # [k, 3h]
        self.bias_hh = nn.Parameter(torch.zeros(k, 3 * hidden_size))  # [k, 3h]
        for weight in (self.weight_ih, self.weight_hh):
            for gate in weight.split(hidden_size, -1):  # each gate's block orthogonal, as RL GRUs start
                _orthogonal_(gate.detach(), 1.0)

    def _rows(self, x: torch.Tensor) -> torch.Tensor:
        """`[*B, n, f]` -> `[k, R, f]` (a view when shared)."""
        if self.share_params:
            return x.reshape(1, -1, x.shape[-1])
        return x.reshape(-1, self.n_agents, x.shape[-1]).transpose(0, 1)  # [n, prod(B), f]

    def _unrows(self, y: torch.Tensor, batch: tuple[int, ...]) -> torch.Tensor:
        """`[k, R, f]` -> `[*batch, n, f]`."""
        if self.share_params:
            return y.reshape(*batch, self.n_agents, y.shape[-1])
        return y.transpose(0, 1).reshape(*batch, self.n_agents, y.shape[-1])

    def _check(self, x: torch.Tensor, h: torch.Tensor, time: bool) -> None:
        batch = x.shape[1:-2] if time else x.shape[:-2]
        want_x = (self.n_agents, self.in_features)
        want_h = (*batch, self.n_agents, self.hidden_size)
        if x.shape[-2:] != want_x or tuple(h.shape) != want_h:
            lead = "[L, *M" if time else "[*B"
            raise ValueError(
                f"MultiAgentGRU expects inputs {lead}, {self.n_agents}, {self.in_features}] and a hidden state "
                f"{list(want_h)}, got {tuple(x.shape)} and {tuple(h.shape)}"
            )

    def forward(self, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        """One step: `x` `[*B, n, d]`, `h` `[*B, n, h]` -> the next state `[*B, n, h]` (also the output)."""
        self._check(x, h, time=False)
        gi = _affine(self.bias_ih, self._rows(x), self.weight_ih)  # [k, R, 3h]
        h_next, *_ = _gru_step(gi, self._rows(h), self.weight_hh, self.bias_hh)
        return self._unrows(h_next, x.shape[:-2])

    def scan(self, x: torch.Tensor, h0: torch.Tensor, reset: torch.Tensor) -> torch.Tensor:
        """`x` `[L, *M, n, d]` from `h0` `[*M, n, h]`; `reset` `[L, *M]` bool zeroes the state before
        step t. Returns every step's output (= its next state) `[L, *M, n, h]`."""
        self._check(x, h0, time=True)
        L, batch = x.shape[0], x.shape[1:-2]
        gi = _affine(self.bias_ih, self._rows(x), self.weight_ih)  # [k, L * R, 3h]
        gi = gi.view(gi.shape[0], L, -1, gi.shape[-1])  # [k, L, R, 3h]: rows keep time-major order
        flags = reset.view(*reset.shape, 1, 1).expand(*reset.shape, self.n_agents, 1)  # [L, *M, n, 1]
        keep = (~self._rows(flags)).to(x.dtype).view(gi.shape[0], L, -1, 1)  # [k, L, R, 1]
        h0 = self._rows(h0)  # [k, R, h]
        if torch.is_grad_enabled():
            y, *_ = _GRUScan.apply(gi, keep, h0, self.weight_hh, self.bias_hh)  # [k, L, R, h]
        else:  # nothing to save for a backward
            y = _scan_states(gi, keep, h0, self.weight_hh, self.bias_hh)
        return self._unrows(y.view(y.shape[0], -1, self.hidden_size), (L, *batch))


_TANH = Tanh()


def _affine(bias: torch.Tensor, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """`x @ weight + bias` per stack: `[k, 3h]`, `[k, R, d]`, `[k, d, 3h]` -> `[k, R, 3h]` (2-D when k = 1,
    which is faster than a batched matmul of one)."""
    if weight.shape[0] == 1:
        return torch.addmm(bias[0], x[0], weight[0]).unsqueeze(0)
    return torch.baddbmm(bias.unsqueeze(1), x, weight)


def _matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """`a @ b` per stack, `[k, p, q] @ [k, q, r]` (2-D when k = 1)."""
    return (a[0] @ b[0]).unsqueeze(0) if a.shape[0] == 1 else torch.bmm(a, b)


def _gru_step(
    gi: torch.Tensor, h: torch.Tensor, weight_hh: torch.Tensor, bias_hh: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """One step on rows: `gi` `[k, R, 3h]` (input product with its bias), `h` `[k, R, h]` -> the next state,
    and what the scan's backward needs: `σ` of the r and z gates `[k, R, 2h]`, the candidate `c` and the
    recurrent product of its gate `[k, R, h]`. Acting and training run this same arithmetic."""
    size = h.shape[-1]
    gh = _affine(bias_hh, h, weight_hh)  # [k, R, 3h]
    gi_rz, gi_c = gi.split([2 * size, size], -1)
    gh_rz, gh_c = gh.split([2 * size, size], -1)
    rz = torch.sigmoid(gi_rz + gh_rz)  # [k, R, 2h]
    r, z = rz.split(size, -1)
    candidate = _TANH(torch.addcmul(gi_c, r, gh_c))
    return torch.lerp(candidate, h, z), rz, candidate, gh_c  # (1 - z) c + z h


def _scan_states(gi, keep, h0, weight_hh, bias_hh) -> torch.Tensor:
    """`_GRUScan`'s forward without what its backward reads: every step's state `[k, L, R, h]`."""
    h, states = h0, []
    for gi_t, keep_t in zip(gi.unbind(1), keep.unbind(1)):
        h, *_ = _gru_step(gi_t, h * keep_t, weight_hh, bias_hh)
        states.append(h)
    return torch.stack(states, 1)


class _GRUScan(torch.autograd.Function):
    """The time loop of `MultiAgentGRU.scan` as one autograd node, with its backward through time written
    out: per step the gates' gradients and one matmul for the state's, and the recurrent weights' gradient
    as one matmul over all steps at the end (autograd would take one per step, and record every op).

    The steps run in a Python loop: each needs the previous step's state, and torch has no fused GRU that
    resets the state per sequence mid-way (`torch.nn.GRU` takes one `h0`, and shares its weights over the
    batch, so per-agent weights would need a loop over agents). Under `--compile` the loop is traced
    into the update step's graph.

    Inputs: `gi` `[k, L, R, 3h]`, `keep` `[k, L, R, 1]` (0 where the state is zeroed before the step), `h0`
    `[k, R, h]`, `weight_hh` `[k, h, 3h]`, `bias_hh` `[k, 3h]`. Outputs: every step's state `[k, L, R, h]`,
    then what the backward reads (no gradient)."""

    @staticmethod
    def forward(gi, keep, h0, weight_hh, bias_hh):
        h, states, starts, gates, candidates, products = h0, [], [], [], [], []
        for gi_t, keep_t in zip(gi.unbind(1), keep.unbind(1)):
            h = h * keep_t
            starts.append(h)
            h, rz, candidate, gh_c = _gru_step(gi_t, h, weight_hh, bias_hh)
            for saved, value in zip((states, gates, candidates, products), (h, rz, candidate, gh_c)):
                saved.append(value)
        return tuple(torch.stack(saved, 1) for saved in (states, starts, gates, candidates, products))

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:  # apart from forward, as torch.func's grad needs
        _, keep, _, weight_hh, _ = inputs
        _, starts, gates, candidates, products = output
        ctx.save_for_backward(keep, weight_hh, starts, gates, candidates, products)
        ctx.mark_non_differentiable(starts, gates, candidates, products)
        ctx.set_materialize_grads(False)  # the saved outputs get no gradient: no zero tensors for them

    @staticmethod
    def backward(ctx, d_states, *_):
        keep, weight_hh, starts, gates, candidates, products = ctx.saved_tensors
        k, L, R, size = starts.shape
        weight_rz, weight_c = weight_hh.transpose(1, 2).split([2 * size, size], 1)  # [k, 2h, h], [k, h, h]
        # Per step, the gradients w.r.t. the gates' pre-activations: r and z's (the same for the input and
        # the recurrent product), c's input part and c's recurrent part (times r). No `out=` writes:
        # torch.func's grad (the compiled update step) runs this backward on tensors that track gradients.
        d_rz, d_c, d_gh_c = [], [], []
        dh = torch.zeros_like(starts[:, 0])  # [k, R, h]: the loss's gradient w.r.t. the state after step t
        for t in reversed(range(L)):
            dh = dh + d_states[:, t]
            rz, candidate = gates[:, t], candidates[:, t]
            r, z = rz.split(size, -1)
            # h' = (1 - z) c + z h, c = tanh(i_c + r * p_c), (r, z) = sigmoid(i_rz + p_rz)
            d_c.append(dh * (1 - z) * (1 - candidate.square()))
            d_rz.append(torch.cat([d_c[-1] * products[:, t], dh * (starts[:, t] - candidate)], -1) * (rz * (1 - rz)))
            d_gh_c.append(d_c[-1] * r)
            dh = dh * z + _matmul(d_rz[-1], weight_rz) + _matmul(d_gh_c[-1], weight_c)
            dh = dh * keep[:, t]  # to the state before the reset
        d_rz, d_c, d_gh_c = (torch.stack(d[::-1], 1) for d in (d_rz, d_c, d_gh_c))  # [k, L, R, 2h | h | h]
        starts_t = starts.reshape(k, L * R, size).transpose(1, 2)  # [k, h, L * R]
        d_rz_rows, d_gh_c_rows = d_rz.view(k, L * R, 2 * size), d_gh_c.view(k, L * R, size)
        d_weight = torch.cat([_matmul(starts_t, d_rz_rows), _matmul(starts_t, d_gh_c_rows)], -1)
        d_bias = torch.cat([d_rz_rows.sum(1), d_gh_c_rows.sum(1)], -1)
        return torch.cat([d_rz, d_c], -1), None, dh, d_weight, d_bias

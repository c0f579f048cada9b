"""Multi-agent networks: one batched MLP per group, mapping `[*B, n, d_in] -> [*B, n, d_out]`, and a GRU
(`MultiAgentGRU`) with its state `[*B, n, h]`.

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
    """`n` independent linear layers applied at once to rows: `[n, R, d_in] -> [n, R, d_out]`."""

    def __init__(self, n_agents: int, in_features: int, out_features: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(n_agents, in_features, out_features))  # [n, d_in, d_out]
        self.bias = nn.Parameter(torch.zeros(n_agents, out_features))  # [n, d_out]

    def forward(self, rows: torch.Tensor) -> torch.Tensor:
        return torch.baddbmm(self.bias.unsqueeze(1), rows, self.weight)


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
        agent_ids: `k > 0` when the input of each of `k` agents is one input they share followed by the agent's
            one-hot id (a centralised critic with parameters shared by the agents). `forward` then takes the
            shared input `[*B, n, in_features - k]` and returns `[*B, k, n, out_features]`: the first layer
            runs once on it and adds its id columns as a bias per agent. The values are those of the `k` full
            inputs, for a `k`-th of the first layer's products (the largest layer of a critic that reads
            every agent's observations).
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
        agent_ids: int = 0,
    ) -> None:
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(f"unknown activation {activation!r}; expected one of {list(ACTIVATIONS)}")
        self.n_agents, self.in_features, self.out_features = n_agents, in_features, out_features
        self.share_params, self.agent_ids = share_params, agent_ids
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
        width = self.in_features - self.agent_ids
        if x.shape[-2:] != (self.n_agents, width):
            raise ValueError(f"MultiAgentMLP expects inputs [*B, {self.n_agents}, {width}], got {tuple(x.shape)}")
        batch, n, k = x.shape[:-2], self.n_agents, self.agent_ids
        # Every layer runs on rows, reshaped once: `[prod(B) * n, d]` with shared parameters (a linear layer on
        # more dims would reshape to 2-D and back, and autograd record both, at every layer), `[n, prod(B), d]`
        # stacked (one batched matmul per layer, on the same layout throughout).
        rows = x.reshape(-1, width) if self.share_params else x.reshape(-1, n, width).transpose(0, 1)
        layers = self.layers
        if k:
            rows, layers = self._first_layer_with_ids(rows), layers[1:]  # k rows for each one
        y = layers(rows)
        if self.share_params:
            y = y.view(*batch, n, k or 1, self.out_features).movedim(-2, -3)
        else:
            y = y.view(n, *batch, k or 1, self.out_features).movedim(0, -2)
        return y if k else y.squeeze(-3)  # [*B, k, n, out] or [*B, n, out]

    def _first_layer_with_ids(self, rows: torch.Tensor) -> torch.Tensor:
        """The first layer on shared rows and each of the k agents' one-hot ids: `[R, d]` -> `[R * k, h]`
        (shared parameters) or `[n, R, d]` -> `[n, R * k, h]` (stacked). The product of id i with the weights
        is their row i, so agent i's row is `x W + b + W_id[i]`."""
        first = self.layers[0]
        if self.share_params:  # nn.Linear's weight [h, d + k], as one stack [1, d + k, h]
            return _affine_with_ids(first.bias[None], rows[None], first.weight.T[None], self.agent_ids)[0]
        return _affine_with_ids(first.bias, rows, first.weight, self.agent_ids)


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

    With `agent_ids` (shared parameters only; as `MultiAgentMLP`'s) the n agents' inputs are one shared
    input `[*B, 1, in_features - n]` and each agent's one-hot id: the input product runs once on it and
    adds each id's weights.
    """

    def __init__(
        self, in_features: int, hidden_size: int, n_agents: int, share_params: bool = True, agent_ids: bool = False
    ) -> None:
        super().__init__()
        if agent_ids and not share_params:
            raise ValueError("agent ids tell agents apart in a GRU whose parameters they share: share_params=True")
        self.n_agents, self.in_features, self.hidden_size = n_agents, in_features, hidden_size
        self.share_params, self.agent_ids = share_params, n_agents if agent_ids else 0
        k = 1 if share_params else n_agents
        self.weight_ih = nn.Parameter(torch.empty(k, in_features, 3 * hidden_size))  # [k, d, 3h]: r, z, c
        self.weight_hh = nn.Parameter(torch.empty(k, hidden_size, 3 * hidden_size))  # [k, h, 3h]
        self.bias_ih = nn.Parameter(torch.zeros(k, 3 * hidden_size))  # [k, 3h]
        self.bias_hh = nn.Parameter(torch.zeros(k, 3 * hidden_size))  # [k, 3h]
        # The candidate's activation, a child module (no parameters): a population (`marl.core.members`)
        # swaps it for one that runs under vmap.
        self.tanh = Tanh()
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
        want_x = (1, self.in_features - self.agent_ids) if self.agent_ids else (self.n_agents, self.in_features)
        want_h = (*batch, self.n_agents, self.hidden_size)
        if x.shape[-2:] != want_x or tuple(h.shape) != want_h:
            lead = "[L, *M" if time else "[*B"
            raise ValueError(
                f"MultiAgentGRU expects inputs {lead}, {want_x[0]}, {want_x[1]}] and a hidden state "
                f"{list(want_h)}, got {tuple(x.shape)} and {tuple(h.shape)}"
            )

    def _input_product(self, x: torch.Tensor) -> torch.Tensor:
        """`x W_ih + b_ih` of inputs `[*B, m, d]` on rows `[k, R, 3h]`. With agent ids, agent i's row is the
        shared input's product plus row i of the ids' weights (the product of its one-hot)."""
        if not self.agent_ids:
            return _affine(self.bias_ih, self._rows(x), self.weight_ih)
        return _affine_with_ids(self.bias_ih, x.reshape(1, -1, x.shape[-1]), self.weight_ih, self.agent_ids)

    def forward(self, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        """One step: `x` `[*B, n, d]`, `h` `[*B, n, h]` -> the next state `[*B, n, h]` (also the output)."""
        self._check(x, h, time=False)
        gi = self._input_product(x)  # [k, R, 3h]
        return self._unrows(_gru_step(gi, self._rows(h), self.weight_hh, self.bias_hh, self.tanh), x.shape[:-2])

    def scan(self, x: torch.Tensor, h0: torch.Tensor, reset: torch.Tensor) -> torch.Tensor:
        """`x` `[L, *M, n, d]` from `h0` `[*M, n, h]`; `reset` `[L, *M]` bool zeroes the state before
        step t. Returns every step's output (= its next state) `[L, *M, n, h]`."""
        self._check(x, h0, time=True)
        if reset.shape != x.shape[:-2] or reset.dtype != torch.bool:
            # Else a reset of another shape ([L], [M, L]) was reshaped onto the steps and envs, with no error.
            raise ValueError(
                f"MultiAgentGRU.scan expects reset [L, *M] = {list(x.shape[:-2])} bool (true where the state is "
                f"zeroed before the step), got {reset.dtype} {tuple(reset.shape)}"
            )
        L, batch = x.shape[0], x.shape[1:-2]
        gi = self._input_product(x)  # [k, L * R, 3h]
        gi = gi.view(gi.shape[0], L, -1, gi.shape[-1])  # [k, L, R, 3h]: rows keep time-major order
        flags = reset.view(*reset.shape, 1, 1).expand(*reset.shape, self.n_agents, 1)  # [L, *M, n, 1]
        keep = (~self._rows(flags)).to(x.dtype).view(gi.shape[0], L, -1, 1)  # [k, L, R, 1]
        h, states = self._rows(h0), []  # [k, R, h]
        # The steps run in a Python loop: each needs the previous step's state, and torch has no fused GRU
        # that resets the state per sequence mid-way (`torch.nn.GRU` takes one `h0`, and shares its weights
        # over the batch, so per-agent weights would need a loop over agents). Unbound, not indexed per
        # step: an index's backward fills a zero tensor of all L steps, at every step. Under `--compile`
        # the loop is traced into the update step's graph.
        for gi_t, keep_t in zip(gi.unbind(1), keep.unbind(1)):
            h = _gru_step(gi_t, h * keep_t, self.weight_hh, self.bias_hh, self.tanh)
            states.append(h)
        y = torch.stack(states, 1)  # [k, L, R, h]
        return self._unrows(y.view(y.shape[0], -1, self.hidden_size), (L, *batch))


def _affine(bias: torch.Tensor, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """`x @ weight + bias` per stack: `[k, 3h]`, `[k, R, d]`, `[k, d, 3h]` -> `[k, R, 3h]` (2-D when k = 1,
    which is faster than a batched matmul of one)."""
    if weight.shape[0] == 1:
        return torch.addmm(bias[0], x[0], weight[0]).unsqueeze(0)
    return torch.baddbmm(bias.unsqueeze(1), x, weight)


def _affine_with_ids(bias: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, ids: int) -> torch.Tensor:
    """`_affine` of shared inputs and each of `ids` agents' one-hot ids, which the weights read after them:
    `[k, h]`, `[k, R, d]`, `[k, d + ids, h]` -> `[k, R * ids, h]`. A one-hot's product with the weights is one
    of their rows, so agent i's row is `x W + b + W_id[i]`, with the product of `x` taken once for all."""
    shared, per_agent = weight.split([x.shape[-1], ids], 1)  # [k, d, h], [k, ids, h]
    return (_affine(bias, x, shared).unsqueeze(-2) + per_agent.unsqueeze(1)).flatten(1, 2)


def _gru_step(
    gi: torch.Tensor, h: torch.Tensor, weight_hh: torch.Tensor, bias_hh: torch.Tensor, tanh: nn.Module
) -> torch.Tensor:
    """One step on rows: `gi` `[k, R, 3h]` (input product with its bias), `h` `[k, R, h]` -> the next state.
    Acting and training run this same arithmetic, so training recomputes exactly what acting computed."""
    size = h.shape[-1]
    gh = _affine(bias_hh, h, weight_hh)  # [k, R, 3h]
    # Split, not sliced: a slice's backward fills a zero tensor of the whole input, a split's is one cat.
    gi_rz, gi_c = gi.split([2 * size, size], -1)
    gh_rz, gh_c = gh.split([2 * size, size], -1)
    r, z = torch.sigmoid(gi_rz + gh_rz).split(size, -1)  # [k, R, h] each
    candidate = tanh(torch.addcmul(gi_c, r, gh_c))
    return torch.lerp(candidate, h, z)  # (1 - z) c + z h

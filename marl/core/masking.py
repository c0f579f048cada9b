"""Loss reductions over the agent-steps that count.

An agent that left its episode before its env's end (`GroupSpec.agents_leave`) reads per-agent `done`,
reward 0 and its last observation until the env resets: the data of its group holds `active` `[*batch, n]`
bool, False at those steps (`marl.core.rollout`). Every loss term, advantage normalisation and logged mean
reduces over the active entries only, with these helpers. Where `active` is None (a group whose agents
all end with their env) they compute exactly what the plain reductions did, so such runs are unchanged
bit for bit.
"""

from __future__ import annotations

import torch


def masked_mean(x: torch.Tensor, active: torch.Tensor | None) -> torch.Tensor:
    """The mean of `x` over the entries where `active` (bool, broadcast to `x`'s shape) is True; 0 where no
    entry is (an empty mean is no signal, not NaN). With `active` None, `x.mean()`."""
    if active is None:
        return x.mean()
    active = active.expand_as(x)
    # torch.where, not a product: a NaN or inf at an inactive entry stays out of the value and the gradient.
    return torch.where(active, x, 0.0).sum() / active.sum().clamp_min(1)


def standardized(x: torch.Tensor, active: torch.Tensor | None, eps: float = 1e-8) -> torch.Tensor:
    """`(x - mean) / (std + eps)`, the mean and (unbiased) std over `x`'s active entries; `x` as it is where
    fewer than two are active (one value has no spread to divide by). With `active` None, over every entry."""
    if active is None:
        return (x - x.mean()) / (x.std() + eps)
    active = active.expand_as(x)
    mean, std = masked_mean(x, active), masked_var(x, active).sqrt()
    return torch.where(active.sum() > 1, (x - mean) / (std + eps), x)


def masked_var(x: torch.Tensor, active: torch.Tensor) -> torch.Tensor:
    """The unbiased variance of `x`'s entries where `active` (bool, broadcast to `x`'s shape); 0 where fewer
    than two are active."""
    active = active.expand_as(x)
    squares = torch.where(active, (x - masked_mean(x, active)).square(), 0.0).sum()
    return squares / (active.sum() - 1).clamp_min(1)


def masked_moments(x: torch.Tensor, active: torch.Tensor | None) -> torch.Tensor:
    """`[count, sum, sum of squares]` of `x`'s active entries in float64 (a critic's running value moments
    take them in); with `active` None, of every entry."""
    wide = x.double()
    if active is None:
        return torch.stack([wide.new_full((), wide.numel()), wide.sum(), wide.square().sum()])
    active = active.expand_as(x)
    kept = torch.where(active, wide, 0.0)
    return torch.stack([active.sum().double(), kept.sum(), kept.square().sum()])


def inactive_zeroed(x: torch.Tensor, active: torch.Tensor | None) -> torch.Tensor:
    """`x` with its inactive entries 0 (`active` broadcast to its shape; None: `x` itself): a departed agent's
    TD error must not raise the priority of its env step in a prioritized replay."""
    return x if active is None else torch.where(active, x, 0.0)

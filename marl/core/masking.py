"""Loss reductions over the agent-steps that count.

An agent that left its episode before its env's end (`GroupSpec.agents_leave`) reads per-agent `done`,
reward 0 and its last observation until the env resets: the data of its group holds `active` `[*batch, n]`
bool, False at those steps (`marl.core.rollout`). Every loss term, advantage normalisation and logged mean
reduces over the active entries only, with these helpers. Where `active` is None (a group whose agents
all end with their env) they compute exactly what the plain reductions did, so such runs are unchanged
bit for bit; so do they where every entry of `active` is True (an adapter's env whose agents happen to end
together, such as PettingZoo's MPE).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import torch


def masked_mean(x: torch.Tensor, active: torch.Tensor | None, dim: int | tuple[int, ...] | None = None) -> torch.Tensor:
    """The mean of `x` over the entries where `active` (bool, broadcast to `x`'s shape) is True, over every dim
    or over `dim`; 0 where no entry is (an empty mean is no signal, not NaN). With `active` None, `x.mean(dim)`.

    Computed as the plain mean with the inactive entries 0, times `entries / active entries`; with every entry
    active, the plain mean itself, so the value and its gradient are bit for bit those of the plain mean on any
    device (a sum divided by the count is not: CUDA's mean multiplies by `1 / entries`; nor is the factor,
    which torch computes as `entries * (1 / count)`)."""
    if active is None:
        return x.mean() if dim is None else x.mean(dim)
    active = active.expand_as(x)
    # torch.where, not a product: a NaN or inf at an inactive entry stays out of the value and the gradient.
    kept = torch.where(active, x, 0.0)
    mean, count = (kept.mean(), active.sum()) if dim is None else (kept.mean(dim), active.sum(dim))
    entries = active.numel() // count.numel()  # per mean
    return torch.where(count == entries, mean, mean * (entries / count.clamp_min(1).to(mean.dtype)))


def standardized(x: torch.Tensor, active: torch.Tensor | None, eps: float = 1e-8) -> torch.Tensor:
    """`(x - mean) / (std + eps)`, the mean and (unbiased) std over `x`'s active entries; `x` as it is where
    fewer than two are active (one value has no spread to divide by). With `active` None, over every entry;
    with every entry active, bit for bit the same."""
    if active is None:
        return (x - x.mean()) / (x.std() + eps)
    active = active.expand_as(x)
    mean, std = masked_mean(x, active), _spread(x, active, torch.std)
    return torch.where(active.sum() > 1, (x - mean) / (std + eps), x)


def masked_var(x: torch.Tensor, active: torch.Tensor) -> torch.Tensor:
    """The unbiased variance of `x`'s entries where `active` (bool, broadcast to `x`'s shape); 0 where fewer
    than two are active. With every entry active, bit for bit `x.var()`."""
    return _spread(x, active.expand_as(x), torch.var)


def _spread(x: torch.Tensor, active: torch.Tensor, spread) -> torch.Tensor:
    """`spread` (`torch.var` or `torch.std`, unbiased) of `x`'s active entries, 0 where fewer than two are.
    The inactive entries set to the active ones' mean add nothing to the squares: the plain spread over every
    entry, rescaled from `entries - 1` to `count - 1` degrees of freedom; not at all when all are active
    (`x.std()` is not `x.var().sqrt()` bit for bit: it takes the root before rounding)."""
    if x.numel() < 2:  # static: one entry has no spread (and torch's would warn of no degrees of freedom)
        return x.new_zeros(())
    count = active.sum()
    plain = spread(torch.where(active, x, masked_mean(x, active)))
    scale = (x.numel() - 1) / (count - 1).clamp_min(1).to(x.dtype)
    rescaled = plain * (scale if spread is torch.var else scale.sqrt())
    return torch.where(count > 1, torch.where(count == x.numel(), plain, rescaled), 0.0)


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
    """`x` with its inactive entries 0 (`active` `[*batch, n]` holds `x`'s leading dims, and is broadcast over
    the rest, as an agent's features `[*batch, n, d]`; None: `x` itself): a departed agent's TD error must not
    raise the priority of its env step in a prioritized replay, nor its observation reach a centralised critic."""
    if active is None:
        return x
    return torch.where(active.view(*active.shape, *(1,) * (x.dim() - active.dim())), x, 0.0)


def agents_in(data: Mapping, groups: Iterable[str], next: bool = False) -> dict[str, torch.Tensor]:
    """Per group of `groups` whose agents may leave (its data, `data[group]`, holds `active`), which of its
    agents are in at the step's observation, `active` `[*batch, n]`; with `next`, at the step's true next
    observation, `~terminated`. Groups whose agents end together are absent: nothing of theirs is masked.

    The next observation takes the next step's flag, not this one's: an agent that leaves at this step
    (active here, terminated by it) is gone from the next observation on, so a critic that reads the others'
    inputs sees its slot zeroed there (`marl.core.models.CriticInput`), and a target's `V'(s')` must read the
    input the critic is trained on at `s'`, not the departing agent's last observation that no trained
    input holds. `~terminated` is the env's `active` of the next observation wherever a target bootstraps:
    they differ only where the env's episode terminated, where every agent reads terminated and no target
    bootstraps."""
    return {g: ~data[g]["terminated"] if next else data[g]["active"] for g in groups if "active" in data[g].keys()}

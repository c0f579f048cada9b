"""The PPO loss, one for MAPPO and IPPO: they differ only in what the critic sees (`marl.models`).

`ppo_loss` is a pure function of tensors shaped `[M, n]` (M samples of a group's n agents), so it can
be checked by hand. It returns the named terms and diagnostics:

- `policy_loss`: clipped surrogate, `-mean(min(r * A, clip(r, 1 - eps, 1 + eps) * A))`;
- `value_loss`: `0.5 * mean((V - target)^2)`, or with `clip_value` the max of that and the clipped
  version `V_old + clip(V - V_old, -eps, eps)` (as in the PPO reference implementations);
- `entropy_loss`: `-entropy_coef * mean(entropy)`;
- `loss = policy_loss + value_coef * value_loss + entropy_loss`;
- diagnostics (no gradient): `approx_kl` (`mean((r - 1) - log r)`), `clip_fraction`, `entropy`.
"""

from __future__ import annotations

import torch


def ppo_loss(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantage: torch.Tensor,
    value: torch.Tensor,
    old_value: torch.Tensor,
    value_target: torch.Tensor,
    entropy: torch.Tensor,
    *,
    clip_eps: float,
    clip_value: bool,
    entropy_coef: float,
    value_coef: float,
    normalize_advantage: bool,
) -> dict[str, torch.Tensor]:
    """PPO's loss terms for one group's minibatch; every tensor is `[M, n]`."""
    if normalize_advantage:
        advantage = (advantage - advantage.mean()) / (advantage.std() + 1e-8)
    log_ratio = log_prob - old_log_prob
    ratio = log_ratio.exp()
    surrogate = torch.minimum(ratio * advantage, ratio.clamp(1 - clip_eps, 1 + clip_eps) * advantage)
    policy_loss = -surrogate.mean()

    value_error = (value - value_target).square()
    if clip_value:
        clipped = old_value + (value - old_value).clamp(-clip_eps, clip_eps)
        value_error = torch.maximum(value_error, (clipped - value_target).square())
    value_loss = 0.5 * value_error.mean()

    mean_entropy = entropy.mean()
    entropy_loss = -entropy_coef * mean_entropy
    with torch.no_grad():
        approx_kl = ((ratio - 1) - log_ratio).mean()
        clip_fraction = ((ratio - 1).abs() > clip_eps).float().mean()
    return {
        "loss": policy_loss + value_coef * value_loss + entropy_loss,
        "policy_loss": policy_loss,
        "value_loss": value_loss,
        "entropy_loss": entropy_loss,
        "approx_kl": approx_kl,
        "clip_fraction": clip_fraction,
        "entropy": mean_entropy.detach(),
    }


def explained_variance(value: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """`1 - Var(target - value) / Var(target)`: 1 is a perfect critic, 0 no better than a constant."""
    return 1 - (target - value).var() / target.var().clamp_min(1e-8)

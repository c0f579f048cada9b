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
    terms = policy_terms(
        log_prob,
        old_log_prob,
        advantage,
        entropy,
        clip_eps=clip_eps,
        entropy_coef=entropy_coef,
        normalize_advantage=normalize_advantage,
    )
    return combined_terms(
        terms,
        value_terms(value, old_value, value_target, clip_eps=clip_eps, clip_value=clip_value, value_coef=value_coef),
    )


def combined_terms(policy: dict[str, torch.Tensor], value: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`ppo_loss`'s terms from its two parts: the policy's terms, the critic's `value_loss`, and `loss`
    the sum of their shares."""
    return {**policy, "loss": policy["loss"] + value["loss"], "value_loss": value["value_loss"]}


def policy_terms(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantage: torch.Tensor,
    entropy: torch.Tensor,
    *,
    clip_eps: float,
    entropy_coef: float,
    normalize_advantage: bool,
) -> dict[str, torch.Tensor]:
    """The policy's part of `ppo_loss`: its terms with `value_loss` 0 and `loss` the policy's share
    (`policy_loss + entropy_loss`), for an update that steps the policy apart from the critic."""
    if normalize_advantage:
        advantage = (advantage - advantage.mean()) / (advantage.std() + 1e-8)
    log_ratio = log_prob - old_log_prob
    ratio = log_ratio.exp()
    surrogate = torch.minimum(ratio * advantage, ratio.clamp(1 - clip_eps, 1 + clip_eps) * advantage)
    policy_loss = -surrogate.mean()
    mean_entropy = entropy.mean()
    entropy_loss = -entropy_coef * mean_entropy
    with torch.no_grad():
        approx_kl = ((ratio - 1) - log_ratio).mean()
        clip_fraction = ((ratio - 1).abs() > clip_eps).float().mean()
    return {
        "loss": policy_loss + entropy_loss,
        "policy_loss": policy_loss,
        "value_loss": torch.zeros_like(policy_loss),
        "entropy_loss": entropy_loss,
        "approx_kl": approx_kl,
        "clip_fraction": clip_fraction,
        "entropy": mean_entropy.detach(),
    }


def value_terms(
    value: torch.Tensor,
    old_value: torch.Tensor,
    value_target: torch.Tensor,
    *,
    clip_eps: float,
    clip_value: bool,
    value_coef: float = 1.0,
) -> dict[str, torch.Tensor]:
    """The critic's part of `ppo_loss`: `value_loss`, `loss` its share (`value_coef * value_loss`), and
    every policy term 0, for an update that steps the critic apart from the policy."""
    value_error = (value - value_target).square()
    if clip_value:
        clipped = old_value + (value - old_value).clamp(-clip_eps, clip_eps)
        value_error = torch.maximum(value_error, (clipped - value_target).square())
    value_loss = 0.5 * value_error.mean()
    zero = torch.zeros_like(value_loss)
    return {
        "loss": value_coef * value_loss,
        "policy_loss": zero,
        "value_loss": value_loss,
        "entropy_loss": zero,
        "approx_kl": zero,
        "clip_fraction": zero,
        "entropy": zero,
    }


def explained_variance(value: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """`1 - Var(target - value) / Var(target)`: 1 is a perfect critic, 0 no better than a constant."""
    return 1 - (target - value).var() / target.var().clamp_min(1e-8)

"""Policy heads: turn network outputs into action distributions for each kind of action spec.

Every distribution works on a *raw* action (what the buffer stores) and converts it to the *env*
action (what the env receives):

- `TanhNormal` for bounded continuous actions: raw `u ~ Normal(mean, std)`, env action
  `low + (tanh(u) + 1) / 2 * (high - low)`. `log_prob(u)` is the log-density of the env action (the
  Normal's minus the log-Jacobian of the squashing), so PPO ratios are those of what the env saw.
  `entropy()` is the Normal's (the squashed entropy has no closed form); it only feeds the bonus.
- `MaskedCategorical` for `Discrete` actions: disallowed actions (action mask false) get probability
  zero; raw and env actions are the same int64 index.
- `MultiCategorical` for `MultiDiscrete` actions: independent categoricals, log-probs summed.
- `EpsilonGreedy` for value-based groups (IQL, VDN, QMIX) with `Discrete` or `MultiDiscrete` actions: the
  greedy action of the Q values, or with probability `epsilon` a uniformly random allowed one; raw and env
  actions are the same index (per head). It has no density either.
- `NoisyDeterministic` for DDPG's bounded continuous actions: the policy's action plus Gaussian
  exploration noise of scale `sigma` (a fraction of the half range), clipped to the bounds; raw and env
  actions are the same. It has no density: an algorithm that needs `log_prob` does not use it.

Every distribution also draws a uniformly random action from the same noise (`random`): off-policy
algorithms act at random for their first `warmup_frames` (`RandomWhile`).

Shapes: parameters `[*B, n, ...]`; `log_prob`, `entropy` -> `[*B, n]`. Sampling is a deterministic
function of noise drawn beforehand (`draw_noise`): the rollout draws a whole iteration's noise in one
call from its own generator, so a seed reproduces a run and the compiled rollout step (which cannot
hold a generator) computes exactly what the eager one does.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from envs.specs import ActionSpec, Box, Discrete, MultiDiscrete

LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)
UNIFORM_EDGE = 1 - 1e-6  # |tanh(u)| of a random raw action stays below this: atanh(1) is infinite


class TanhNormal:
    def __init__(self, mean: torch.Tensor, log_std: torch.Tensor, low: torch.Tensor, high: torch.Tensor) -> None:
        self.mean, self.log_std = mean, log_std.expand_as(mean)  # [*B, n, A]
        self.low, self.half_range = low, (high - low) / 2  # [A]

    def sample(self, noise: torch.Tensor) -> torch.Tensor:
        """`noise`: standard normal, shaped like the mean."""
        return self.mean + self.log_std.exp() * noise

    def mode(self) -> torch.Tensor:
        return self.mean

    def random(self, noise: torch.Tensor) -> torch.Tensor:
        """The raw action whose env action is uniform in the bounds: `atanh(2 * Phi(noise) - 1)`."""
        return torch.atanh((2 * torch.special.ndtr(noise) - 1).clamp(-UNIFORM_EDGE, UNIFORM_EDGE))

    def env_action(self, raw: torch.Tensor) -> torch.Tensor:
        return self.low + (torch.tanh(raw) + 1) * self.half_range

    def log_prob(self, raw: torch.Tensor) -> torch.Tensor:
        z = (raw - self.mean) / self.log_std.exp()
        normal = -0.5 * z.square() - self.log_std - LOG_SQRT_2PI
        # log |d tanh(u)/du| = log(1 - tanh(u)^2) = 2 * (log 2 - u - softplus(-2u)), stable for large |u|;
        # softplus(-2u) as -logsigmoid(2u): torch's CPU softplus rounds a tensor's tail elements apart, so a
        # step's log-probs would change in the last bit with the batch they are computed in (PPO's first
        # epoch recomputes exactly what was collected: tests/marl/algorithms/test_recurrent.py).
        log_jacobian = 2 * (math.log(2) - raw + F.logsigmoid(2 * raw)) + self.half_range.log()
        return (normal - log_jacobian).sum(-1)

    def entropy(self) -> torch.Tensor:
        return (0.5 + LOG_SQRT_2PI + self.log_std).sum(-1)


class MaskedCategorical:
    def __init__(self, logits: torch.Tensor, mask: torch.Tensor | None = None) -> None:
        if mask is not None:
            logits = logits.masked_fill(~mask, torch.finfo(logits.dtype).min)
        self.log_probs = logits.log_softmax(-1)  # [*B, n, K]
        self.mask = mask

    def sample(self, noise: torch.Tensor) -> torch.Tensor:
        """`noise`: uniform in [0, 1), shaped like the logits. Gumbel-max: argmax(log p + Gumbel) ~ p."""
        gumbel = -torch.log(-torch.log(noise.clamp(1e-20, 1.0 - 1e-7)))
        return (self.log_probs + gumbel).argmax(-1)

    def mode(self) -> torch.Tensor:
        return self.log_probs.argmax(-1)

    def random(self, noise: torch.Tensor) -> torch.Tensor:
        """A uniform draw over the allowed actions: Gumbel-max over equal logits."""
        gumbel = -torch.log(-torch.log(noise.clamp(1e-20, 1.0 - 1e-7)))
        if self.mask is not None:
            gumbel = gumbel.masked_fill(~self.mask, -math.inf)
        return gumbel.argmax(-1)

    def env_action(self, raw: torch.Tensor) -> torch.Tensor:
        return raw

    def log_prob(self, raw: torch.Tensor) -> torch.Tensor:
        return self.log_probs.gather(-1, raw.unsqueeze(-1)).squeeze(-1)

    def entropy(self) -> torch.Tensor:
        p_log_p = self.log_probs.exp() * self.log_probs
        if self.mask is not None:
            p_log_p = torch.where(self.mask, p_log_p, 0.0)
        return -p_log_p.sum(-1)


class MultiCategorical:
    def __init__(self, logits: torch.Tensor, nvec: tuple[int, ...]) -> None:
        self.nvec = list(nvec)
        self.parts = [MaskedCategorical(part) for part in logits.split(self.nvec, -1)]

    def sample(self, noise: torch.Tensor) -> torch.Tensor:
        """`noise`: uniform in [0, 1), shaped like the (concatenated) logits."""
        return torch.stack([p.sample(u) for p, u in zip(self.parts, noise.split(self.nvec, -1))], -1)

    def mode(self) -> torch.Tensor:
        return torch.stack([p.mode() for p in self.parts], -1)

    def random(self, noise: torch.Tensor) -> torch.Tensor:
        return torch.stack([p.random(u) for p, u in zip(self.parts, noise.split(self.nvec, -1))], -1)

    def env_action(self, raw: torch.Tensor) -> torch.Tensor:
        return raw

    def log_prob(self, raw: torch.Tensor) -> torch.Tensor:
        return sum(p.log_prob(a) for p, a in zip(self.parts, raw.unbind(-1)))

    def entropy(self) -> torch.Tensor:
        return sum(p.entropy() for p in self.parts)


class NoisyDeterministic:
    """A deterministic action `[*B, n, A]` in the env's bounds, explored with Gaussian noise: `sample` is
    `clamp(action + sigma * half_range * noise, low, high)` with `sigma` a 0-d tensor (annealed by the
    algorithm, read on the device)."""

    def __init__(self, action: torch.Tensor, sigma: torch.Tensor, low: torch.Tensor, high: torch.Tensor) -> None:
        self.action, self.sigma, self.low, self.high = action, sigma, low, high  # low, high: [A]

    def sample(self, noise: torch.Tensor) -> torch.Tensor:
        """`noise`: standard normal, shaped like the action."""
        step = self.sigma * (self.high - self.low) / 2 * noise
        return torch.maximum(torch.minimum(self.action + step, self.high), self.low)

    def mode(self) -> torch.Tensor:
        return self.action

    def random(self, noise: torch.Tensor) -> torch.Tensor:
        """Uniform in the bounds: `low + Phi(noise) * (high - low)`."""
        return self.low + torch.special.ndtr(noise) * (self.high - self.low)

    def env_action(self, raw: torch.Tensor) -> torch.Tensor:
        return raw


class EpsilonGreedy:
    """Acting on Q values `[*B, n, sum(nvec)]` (one head of `nvec[h]` values per sub-action; a `Discrete`
    spec is one head, and its raw action `[*B, n]` has no head dim): greedy, or with probability `epsilon`
    (a 0-d tensor the algorithm anneals, read on the device) each agent draws uniformly over its allowed
    actions (`mask` `[*B, n, K]`, False where not allowed; one head only)."""

    def __init__(
        self, q: torch.Tensor, epsilon: torch.Tensor, mask: torch.Tensor | None, nvec: tuple[int, ...], heads: bool
    ) -> None:
        self.q, self.epsilon, self.mask, self.nvec, self.heads = q, epsilon, mask, list(nvec), heads

    def _per_head(self, values: torch.Tensor, fill: float) -> list[torch.Tensor]:
        if self.mask is not None:
            values = values.masked_fill(~self.mask, fill)
        return list(values.split(self.nvec, -1))

    def _join(self, parts: list[torch.Tensor]) -> torch.Tensor:
        return torch.stack(parts, -1) if self.heads else parts[0]

    def mode(self) -> torch.Tensor:
        """The greedy allowed action."""
        return self._join([part.argmax(-1) for part in self._per_head(self.q, -math.inf)])

    def random(self, noise: torch.Tensor) -> torch.Tensor:
        """A uniform draw over the allowed actions: the argmax of iid uniform noise over them."""
        return self._join([part.argmax(-1) for part in self._per_head(noise, -1.0)])

    def sample(self, noise: torch.Tensor) -> torch.Tensor:
        """`noise`: uniform in [0, 1), shaped like `q`. The random action is the argmax of the first head's
        allowed noise; its largest value `u_max` is independent of which one it is (iid draws), and
        `u_max ** allowed` is uniform in [0, 1): the coin that picks exploring, from the same noise."""
        first = self._per_head(noise, -1.0)[0]  # [*B, n, nvec[0]]
        allowed = self.mask.sum(-1) if self.mask is not None else first.shape[-1]
        explore = first.amax(-1).clamp_min(0).pow(allowed) < self.epsilon  # [*B, n]
        if self.heads:
            explore = explore.unsqueeze(-1)
        return torch.where(explore, self.random(noise), self.mode())

    def env_action(self, raw: torch.Tensor) -> torch.Tensor:
        return raw


class RandomWhile:
    """`dist`, except that `sample` draws a uniformly random action (its `random`) while the 0-d bool
    tensor `flag` is set: off-policy algorithms' warm-up, switched on the device with no host sync."""

    def __init__(self, dist, flag: torch.Tensor) -> None:
        self.dist, self.flag = dist, flag

    def sample(self, noise: torch.Tensor) -> torch.Tensor:
        return torch.where(self.flag, self.dist.random(noise), self.dist.sample(noise))

    def mode(self) -> torch.Tensor:
        return self.dist.mode()

    def env_action(self, raw: torch.Tensor) -> torch.Tensor:
        return self.dist.env_action(raw)


Distribution = TanhNormal | MaskedCategorical | MultiCategorical | NoisyDeterministic | EpsilonGreedy | RandomWhile


def head_size(spec: ActionSpec) -> int:
    """How many numbers per agent the policy network outputs for this action spec."""
    if isinstance(spec, Box):
        if not spec.bounded:
            raise ValueError(f"continuous actions must be bounded for the tanh-squashed policy, got {spec}")
        return math.prod(spec.shape)
    if isinstance(spec, Discrete):
        return spec.n
    if isinstance(spec, MultiDiscrete):
        return sum(spec.nvec)
    raise TypeError(f"unsupported action spec {spec!r}")


def draw_noise(
    spec: ActionSpec, batch_shape: tuple[int, ...], generator: torch.Generator | None, device: torch.device | str
) -> torch.Tensor:
    """The noise `sample` turns into actions, for `batch_shape` agents: `[*batch_shape, head_size(spec)]`
    standard normal for continuous actions, uniform for discrete ones."""
    shape = (*batch_shape, head_size(spec))
    if isinstance(spec, Box):
        return torch.randn(shape, generator=generator, device=device)
    return torch.rand(shape, generator=generator, device=device)


def raw_action_dtype(spec: ActionSpec) -> torch.dtype:
    return torch.float32 if isinstance(spec, Box) else torch.int64

"""Acting outside collection, one step at a time, and playing each env's first episode: what `marl eval`
and the evaluation during training (`marl train --eval-every`) share.

`Actor` turns an observation into the env's actions with an algorithm's acting policies (`Acting`): per
group policy -> distribution -> its mode (or a sample of pre-drawn noise) -> the env's action, with the
recurrent policies' states started at zero and zeroed where an env's episode ends; groups with action
masks act within them. `first_episodes` steps a batch of envs until each has ended its first episode and
returns each env's return and length, on the device: where the env has a time limit (`max_steps`) that is
a fixed number of steps, with no read of a device value on the host.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch

from marl.core.distributions import draw_noise
from marl.core.rollout import Acting, check_acting, recurrent_output

CHUNK_STEPS = 1000
"""Steps between two reads of whether every env's first episode has ended, where the episodes may last longer
(a time limit above it, or none known)."""
MAX_STEPS_WITHOUT_LIMIT = 100_000
"""Where an env has no known time limit: the steps after which `first_episodes` stops, leaving out the
episodes that have not ended (rather than wait forever on a policy that never ends one)."""


class Actor:
    """The actions of `acting`'s policies for `num_envs` envs, step by step: `actor(obs)` with `obs` the env's
    observation (a TensorDict or nested dicts: `obs[group]["observation"]`, `["action_mask"]` where the
    group has one) returns `{group: env action}`. `deterministic`: the distributions' mode; else a sample
    of noise drawn from `generator`. Call `end_episodes(done)` after each step (a recurrent policy's state
    is zeroed where `done` `[B]` is true) and `reset()` before a new batch of episodes."""

    def __init__(
        self,
        acting: Acting,
        groups: Mapping,
        num_envs: int,
        device: torch.device,
        *,
        deterministic: bool = True,
        generator: torch.Generator | None = None,
    ) -> None:
        check_acting(acting, groups)
        self.policies, self.groups, self.num_envs, self.device = dict(acting.policies), groups, num_envs, device
        self.deterministic, self.generator = deterministic, generator
        # Recurrent policies act from their state, zero at each episode's start: [B, n, h] per group.
        self.hidden = {g: torch.zeros(num_envs, *shape, device=device) for g, shape in acting.hidden.items()}

    def reset(self) -> None:
        for hidden in self.hidden.values():
            hidden.zero_()

    def __call__(self, obs) -> dict[str, torch.Tensor]:
        actions = {}
        for g, policy in self.policies.items():
            observation, mask = obs[g]["observation"], obs[g].get("action_mask", None)
            if g in self.hidden:
                dist, self.hidden[g] = recurrent_output(g, policy(observation, mask, self.hidden[g]), self.hidden[g])
            else:
                dist = policy(observation, mask)
            if self.deterministic:
                if not callable(getattr(dist, "mode", None)):
                    raise TypeError(
                        f"group {g!r}: the acting policy returned a {type(dist).__name__}, which has no mode() to "
                        "act with (as marl.core.distributions' do): define mode(), or act stochastically (marl eval "
                        "--stochastic)"
                    )
                raw = dist.mode()
            else:
                spec = self.groups[g]
                raw = dist.sample(draw_noise(spec.action, (self.num_envs, spec.n_agents), self.generator, self.device))
            actions[g] = dist.env_action(raw)
        return actions

    def end_episodes(self, done: torch.Tensor) -> None:
        """Zero the recurrent states of the envs whose episode ended (`done` `[B]` bool)."""
        for g, hidden in self.hidden.items():
            self.hidden[g] = hidden.masked_fill(done[:, None, None], 0.0)


@dataclass
class FirstEpisodes:
    """Each env's first episode (`[B]` tensors on the device): per group its return (the agents' summed
    rewards, averaged over the agents, as training's `episode_return`), its length, and whether it ended
    (always, but where `first_episodes` stopped at a cap)."""

    returns: dict[str, torch.Tensor]
    length: torch.Tensor
    finished: torch.Tensor


@torch.no_grad()
def first_episodes(
    env,
    actor: Actor,
    obs,
    *,
    frames: list[np.ndarray] | None = None,
) -> FirstEpisodes:
    """Step `env` from `obs` (its observation after a full reset) with `actor`'s actions until every env has
    ended its first episode. Where `env.max_steps` is known and at most `CHUNK_STEPS`, that is `max_steps`
    steps (each episode ends by then) and nothing is read on the host; else chunks of `CHUNK_STEPS` steps
    with one read after each, up to `max_steps` or, with no time limit known, `MAX_STEPS_WITHOUT_LIMIT`.
    `frames`: append env 0's frame after each of its first episode's steps (the caller draws the first);
    until that episode ends, the done envs are reset after the frame is drawn (the auto-reset would draw
    the next episode's first state over its last one; the draws are the same), a read per step."""
    B, device = env.num_envs, env.device
    running = {g: torch.zeros(B, s.n_agents, device=device) for g, s in env.groups.items()}  # [B, n]
    length = torch.zeros(B, device=device)
    finished = torch.zeros(B, dtype=torch.bool, device=device)
    limit = getattr(env, "max_steps", None)
    steps_left = limit if isinstance(limit, int) and limit > 0 else MAX_STEPS_WITHOUT_LIMIT
    while steps_left > 0:
        chunk = min(steps_left, CHUNK_STEPS)
        for _ in range(chunk):
            recording = frames is not None and not bool(finished[0])
            next_data, obs = env.step_data(actor(obs), auto_reset=not recording)
            done = next_data["done"][:, 0]  # [B]
            if recording:
                frames.append(env.render(0))
                obs = env.reset_data(mask=done)
            actor.end_episodes(done)
            playing = ~finished
            for g in env.groups:
                running[g] += torch.where(playing[:, None], next_data[g]["reward"][..., 0], 0.0)
            length += playing
            finished |= done
        steps_left -= chunk
        if steps_left > 0 and bool(finished.all()):  # the one read per chunk, where episodes may run longer
            break
    return FirstEpisodes({g: r.mean(-1) for g, r in running.items()}, length, finished)

"""`speaker_listener`: a speaker who cannot move tells a listener who cannot see the goal where to go
(MPE's `simple_speaker_listener`).

`n_landmarks` landmarks and the listener spawn uniformly in [-1, 1]^2; one landmark is the target.
MPE's dynamics for the listener (dt 0.1, damping 0.25, action force x5, no collisions).

- `speaker` (1 agent): observes the target landmark's colour, one-hot `[n_landmarks]` (MPE shows its
  RGB); acts by sending one of `n_landmarks` symbols (`Discrete(n_landmarks)`; MPE's 3-symbol channel).
- `listener` (1 agent): observes its velocity (2), every landmark relative to itself (2 each) and the
  last symbol heard, one-hot (`n_landmarks`; zeros before the first): 11 numbers for 3 landmarks, in
  MPE's order. Acts with a 2-D force in [-1, 1].

A symbol sent at step t is heard in the observation after step t, as in MPE. Reward, shared by both:
minus the *squared* distance from the listener to the target (MPE's).

Run `python -m envs.native.speaker_listener --gif sl.gif` to watch the scripted pair.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch
from tensordict import TensorDictBase

from envs.base import EnvConfig, MultiAgentEnv
from envs.native import physics
from envs.registry import register
from envs.render import Canvas, colour, lighter
from envs.specs import Box, Discrete, GroupSpec


@dataclasses.dataclass(frozen=True)
class SpeakerListenerConfig(EnvConfig):
    max_steps: int = 25
    """Episode length (MPE's max_cycles)."""
    n_landmarks: int = 3
    """Number of landmarks, and of symbols the speaker can send (2 to 16)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 2 <= self.n_landmarks <= 16:
            raise ValueError(f"n_landmarks must be in [2, 16], got {self.n_landmarks}")


LISTENER_RADIUS, LANDMARK_RADIUS = 0.075, 0.04  # MPE's sizes


@register("speaker_listener")
class SpeakerListener(MultiAgentEnv):
    Config = SpeakerListenerConfig
    config: SpeakerListenerConfig

    def _make_groups(self):
        L = self.config.n_landmarks
        return {
            "speaker": GroupSpec(["speaker_0"], Box((L,), 0.0, 1.0), Discrete(L)),
            "listener": GroupSpec(["listener_0"], Box((2 + 3 * L,)), Box((2,), -1.0, 1.0)),
        }

    def _init_state(self) -> None:
        B, L, d = self.num_envs, self.config.n_landmarks, self.device
        self.pos = torch.zeros(B, 2, device=d)  # [B, 2] the listener's
        self.vel = torch.zeros(B, 2, device=d)  # [B, 2]
        self.landmark = torch.zeros(B, L, 2, device=d)  # [B, L, 2]
        self.target = torch.zeros(B, dtype=torch.long, device=d)  # [B] index of the target landmark
        self.heard = torch.zeros(B, L, device=d)  # [B, L] last symbol, one-hot
        self.symbols = torch.arange(L, device=d)  # [L]; one-hot by comparison (F.one_hot checks on the host)

    def _reset(self, mask: torch.Tensor) -> None:
        B, L = self.num_envs, self.config.n_landmarks
        spawn = physics.spawn_uniform(B, 1 + L, 1.0, self.rng)  # [B, 1+L, 2]: listener, landmarks
        target = self.rng.randint(L, B)
        m = mask[:, None]
        self.pos = torch.where(m, spawn[:, 0], self.pos)
        self.vel = torch.where(m, 0.0, self.vel)
        self.landmark = torch.where(m[..., None], spawn[:, 1:], self.landmark)
        self.target = torch.where(mask, target, self.target)
        self.heard = torch.where(m, 0.0, self.heard)

    def _step(self, action):
        self.heard = (action["speaker"] == self.symbols).float()  # [B, 1] -> [B, L]
        force = action["listener"][:, 0] * physics.MPE_ACCEL
        self.pos, self.vel = physics.integrate_explicit(
            self.pos, self.vel, force, dt=physics.MPE_DT, drag=physics.MPE_DRAG
        )
        goal = self.landmark.gather(1, self.target[:, None, None].expand(-1, 1, 2)).squeeze(1)  # [B, 2]
        reward = -(goal - self.pos).square().sum(-1, keepdim=True)  # [B, 1]
        return {"speaker": reward, "listener": reward}, torch.zeros_like(self.target, dtype=torch.bool)

    def _observe(self):
        landmarks = (self.landmark - self.pos.unsqueeze(1)).flatten(1)  # [B, 2L]
        return {
            "speaker": (self.target[:, None] == self.symbols).float().unsqueeze(1),
            "listener": torch.cat([self.vel, landmarks, self.heard], -1).unsqueeze(1),
        }

    def _render(self, index: int) -> np.ndarray:
        canvas = Canvas(1.5)
        canvas.border(1.0)
        target = int(self.target[index])
        for i, point in enumerate(self.landmark[index].cpu().numpy()):
            if i == target:
                canvas.disc(point, 2.5 * LANDMARK_RADIUS, lighter(colour(i)))
            canvas.disc(point, LANDMARK_RADIUS, colour(i))
        heard = self.heard[index].cpu().numpy()
        # The listener wears the colour of the symbol it last heard (grey before the first).
        canvas.disc(
            self.pos[index].cpu().numpy(), LISTENER_RADIUS, colour(int(heard.argmax())) if heard.any() else (96, 96, 96)
        )
        return canvas.image


def scripted_actions(obs: TensorDictBase, gain: float = 3.0, damping: float = 1.0) -> dict[str, torch.Tensor]:
    """The scripted pair: the speaker names the target; the listener drives to the landmark it heard
    named with a PD controller (and waits before the first symbol arrives).

    `obs` is the env's observation TensorDict; returns `{"speaker": [B, 1], "listener": [B, 1, 2]}`.
    It is the yardstick that trained pairs are compared against.
    """
    target = obs["speaker", "observation"].argmax(-1)  # [B, 1]
    listener = obs["listener", "observation"]  # [B, 1, 2+3L]
    L = (listener.shape[-1] - 2) // 3
    velocity, landmarks, heard = listener[..., :2], listener[..., 2 : 2 + 2 * L], listener[..., 2 + 2 * L :]
    goal = (landmarks.unflatten(-1, (L, 2)) * heard.unsqueeze(-1)).sum(-2)  # zero when nothing was heard yet
    force = (gain * goal - damping * velocity) * heard.sum(-1, keepdim=True)
    return {"speaker": target, "listener": force.clamp(-1.0, 1.0)}


def _main() -> None:
    from envs.render import demo_env, demo_parser, demo_policy, play

    parser = demo_parser("Run the scripted speaker-listener pair (or random actions).")
    parser.add_argument("--n-landmarks", type=int, default=3, help="landmarks (and symbols) per env")
    args = parser.parse_args()
    config = dict(n_landmarks=args.n_landmarks)
    env = demo_env(parser, lambda: SpeakerListener(SpeakerListenerConfig(**config), num_envs=args.num_envs, seed=0))
    returns = play(env, demo_policy(env, args.policy, scripted_actions), args.steps, gif=args.gif)
    print(f"mean episode return: {returns['listener']:.3f}")


if __name__ == "__main__":
    _main()

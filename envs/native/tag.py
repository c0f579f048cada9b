"""`tag`: predators chase faster prey among obstacles (MPE's `simple_tag`).

MPE's predator-prey task: `n_predators` large, slow discs (radius 0.075, accel 3, top speed 1.0) chase
`n_prey` small, fast ones (radius 0.05, accel 4, top speed 1.3) around `n_obstacles` fixed discs
(radius 0.2). Everyone collides softly with everyone (MPE's contact forces, dt 0.1, damping 0.25);
agents spawn uniformly in [-1, 1]^2, obstacles in [-0.9, 0.9]^2. Actions are 2-D forces in [-1, 1],
scaled by the agent's accel.

Observations differ by type (MPE's layout; 16 and 14 numbers with the defaults):
- predator: own velocity (2), own position (2), obstacles relative to self (2 each), every other agent
  relative to self (2 each; predators first, then prey), every prey's velocity (2 each);
- prey: the same, but only the *other* prey's velocities.

Rewards, MPE's: every predator gets `catch_reward` for each touching (predator, prey) pair; each prey
loses `catch_reward` per predator touching it, and pays MPE's bound penalty per coordinate beyond 0.9
(linear to 1 at 1.0, then `exp(2x - 2)` capped at 10). With `scripted_prey` the prey flee by
`scripted_prey_action` and are not a group: `env.groups` holds only `predator`.

Run `python -m envs.native.tag --gif tag.gif` to watch scripted predators chase scripted prey.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from envs.base import EnvConfig, MultiAgentEnv
from envs.native import physics
from envs.registry import register
from envs.render import Canvas
from envs.specs import Box, GroupSpec


@dataclasses.dataclass(frozen=True)
class TagConfig(EnvConfig):
    max_steps: int = 25
    """Episode length (MPE's max_cycles)."""
    n_predators: int = 3
    """Number of predators (1 to 32)."""
    n_prey: int = 1
    """Number of prey (1 to 32)."""
    n_obstacles: int = 2
    """Number of fixed obstacles (0 to 16)."""
    scripted_prey: bool = False
    """The prey flee by a heuristic and are not a trainable group (env.groups holds only 'predator')."""
    predator_max_speed: float = 1.0
    """Top speed of a predator."""
    prey_max_speed: float = 1.3
    """Top speed of a prey."""
    predator_accel: float = 3.0
    """Force of a predator's full action."""
    prey_accel: float = 4.0
    """Force of a prey's full action."""
    catch_reward: float = 10.0
    """Reward to every predator per touching (predator, prey) pair; penalty to a prey per predator touching it."""

    def __post_init__(self) -> None:
        super().__post_init__()
        for name, low, high in (("n_predators", 1, 32), ("n_prey", 1, 32), ("n_obstacles", 0, 16)):
            if not low <= getattr(self, name) <= high:
                raise ValueError(f"{name} must be in [{low}, {high}], got {getattr(self, name)}")
        for name in ("predator_max_speed", "prey_max_speed", "predator_accel", "prey_accel"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")


PREDATOR_RADIUS, PREY_RADIUS, OBSTACLE_RADIUS = 0.075, 0.05, 0.2  # MPE's sizes


def bound_penalty(position: torch.Tensor) -> torch.Tensor:
    """MPE's penalty for a prey leaving the arena, summed over coordinates: `[..., 2] -> [...]`."""
    x = position.abs()
    beyond = torch.where(x < 1.0, (x - 0.9) * 10, torch.exp(2 * x - 2).clamp_max(10.0))
    return torch.where(x < 0.9, 0.0, beyond).sum(-1)


@register("tag")
class Tag(MultiAgentEnv):
    Config = TagConfig
    config: TagConfig

    def _make_groups(self):
        c = self.config
        n_agents = c.n_predators + c.n_prey
        seen = 4 + 2 * c.n_obstacles + 2 * (n_agents - 1)  # own velocity and position, obstacles, other agents
        force = Box((2,), -1.0, 1.0)
        # Predators see every prey's velocity, prey the other prey's.
        groups = {"predator": GroupSpec(_names("predator", c.n_predators), Box((seen + 2 * c.n_prey,)), force)}
        if not c.scripted_prey:
            groups["prey"] = GroupSpec(_names("prey", c.n_prey), Box((seen + 2 * c.n_prey - 2,)), force)
        return groups

    def _init_state(self) -> None:
        c, B, d = self.config, self.num_envs, self.device
        P, Q = c.n_predators, c.n_prey
        self.pos = torch.zeros(B, P + Q, 2, device=d)  # [B, P+Q, 2]: predators, then prey
        self.vel = torch.zeros(B, P + Q, 2, device=d)  # [B, P+Q, 2]
        self.obstacle = torch.zeros(B, c.n_obstacles, 2, device=d)  # [B, L, 2]
        per_agent = lambda predator, prey: torch.tensor([predator] * P + [prey] * Q, device=d)  # noqa: E731
        self.accel = per_agent(c.predator_accel, c.prey_accel).unsqueeze(-1)  # [P+Q, 1]
        self.max_speed = per_agent(c.predator_max_speed, c.prey_max_speed)  # [P+Q]
        self.radius = torch.cat(
            [per_agent(PREDATOR_RADIUS, PREY_RADIUS), torch.full((c.n_obstacles,), OBSTACLE_RADIUS, device=d)]
        )  # [P+Q+L]: agents, then obstacles

    def _reset(self, mask: torch.Tensor) -> None:
        c, B = self.config, self.num_envs
        m = mask[:, None, None]
        agents = physics.spawn_uniform(B, c.n_predators + c.n_prey, 1.0, self.rng)
        obstacles = physics.spawn_uniform(B, c.n_obstacles, 0.9, self.rng)
        self.pos = torch.where(m, agents, self.pos)
        self.vel = torch.where(m, 0.0, self.vel)
        self.obstacle = torch.where(m, obstacles, self.obstacle)

    def _step(self, action):
        c, P = self.config, self.config.n_predators
        prey_action = scripted_prey_action(self._observe_all()[1], c) if c.scripted_prey else action["prey"]
        force = torch.cat([action["predator"], prey_action], 1) * self.accel  # [B, P+Q, 2]
        contact = physics.contact_forces(
            torch.cat([self.pos, self.obstacle], 1),
            self.radius,
            physics.MPE_CONTACT_STIFFNESS,
            physics.MPE_CONTACT_MARGIN,
            cutoff=False,
        )  # [B, P+Q+L, 2]; obstacles do not move
        self.pos, self.vel = physics.integrate_explicit(
            self.pos,
            self.vel,
            force + contact[:, : P + c.n_prey],
            dt=physics.MPE_DT,
            drag=physics.MPE_DRAG,
            max_speed=self.max_speed,
        )

        gap = (self.pos[:, None, P:] - self.pos[:, :P, None]).norm(dim=-1)  # [B, predator, prey]
        touching = (gap < PREDATOR_RADIUS + PREY_RADIUS).float()
        catches = touching.sum((1, 2)).unsqueeze(-1)  # [B, 1]
        reward = {"predator": c.catch_reward * catches.expand(-1, P)}
        if not c.scripted_prey:
            reward["prey"] = -c.catch_reward * touching.sum(1) - bound_penalty(self.pos[:, P:])
        return reward, torch.zeros(self.num_envs, dtype=torch.bool, device=self.device)

    def _observe_all(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The predators' `[B, P, .]` and the prey's `[B, Q, .]` observations."""
        B, P, Q = self.num_envs, self.config.n_predators, self.config.n_prey
        obstacles = self.obstacle.unsqueeze(1) - self.pos.unsqueeze(2)  # [B, P+Q, L, 2]
        others = physics.pairwise_offsets(self.pos, others_only=True)  # [B, P+Q, P+Q-1, 2]
        seen = torch.cat([self.vel, self.pos, obstacles.flatten(2), others.flatten(2)], -1)  # [B, P+Q, .]
        prey_vel = self.vel[:, P:]  # [B, Q, 2]
        predator = torch.cat([seen[:, :P], prey_vel.flatten(1).unsqueeze(1).expand(B, P, 2 * Q)], -1)
        other_prey_vel = physics.drop_self(prey_vel.unsqueeze(1).expand(B, Q, Q, 2))  # [B, Q, Q-1, 2]
        prey = torch.cat([seen[:, P:], other_prey_vel.flatten(2)], -1)
        return predator, prey

    def _observe(self):
        predator, prey = self._observe_all()
        return {"predator": predator} if self.config.scripted_prey else {"predator": predator, "prey": prey}

    def _render(self, index: int) -> np.ndarray:
        P = self.config.n_predators
        canvas = Canvas(1.5)
        canvas.border(1.0)
        for point in self.obstacle[index].cpu().numpy():
            canvas.disc(point, OBSTACLE_RADIUS, (64, 64, 64))
        for i, point in enumerate(self.pos[index].cpu().numpy()):
            canvas.disc(point, PREDATOR_RADIUS if i < P else PREY_RADIUS, (217, 89, 89) if i < P else (89, 217, 89))
        return canvas.image


def _names(kind: str, n: int) -> list[str]:
    return [f"{kind}_{i}" for i in range(n)]


def _split(observation: torch.Tensor, config: TagConfig):
    """Own velocity, own position, obstacles `[..., L, 2]` and other agents `[..., P+Q-1, 2]` of an observation."""
    L, M = config.n_obstacles, config.n_predators + config.n_prey
    obstacles = observation[..., 4 : 4 + 2 * L].unflatten(-1, (L, 2))
    others = observation[..., 4 + 2 * L : 2 + 2 * L + 2 * M].unflatten(-1, (M - 1, 2))
    return observation[..., :2], observation[..., 2:4], obstacles, others


def _unit(vector: torch.Tensor) -> torch.Tensor:
    return vector / vector.norm(dim=-1, keepdim=True).clamp_min(1e-6)


def scripted_predator_action(observation: torch.Tensor, config: TagConfig) -> torch.Tensor:
    """Chase the nearest prey, aiming where it is heading: `[*B, P, obs]` -> `[*B, P, 2]` forces.

    The yardstick that trained predators are compared against.
    """
    Q = config.n_prey
    _, _, _, others = _split(observation, config)
    prey = others[..., config.n_predators - 1 :, :]  # [*B, P, Q, 2] relative to self
    prey_vel = observation[..., -2 * Q :].unflatten(-1, (Q, 2))  # [*B, P, Q, 2]
    distance = prey.norm(dim=-1, keepdim=True)  # [*B, P, Q, 1]
    aim = prey + 0.5 * distance * prey_vel  # lead the target by about the time it takes to get there
    nearest = distance.argmin(-2, keepdim=True).expand(*aim.shape[:-2], 1, 2)
    return _unit(aim.gather(-2, nearest).squeeze(-2))


def scripted_prey_action(observation: torch.Tensor, config: TagConfig) -> torch.Tensor:
    """Flee: run from the predators (the closer, the stronger), around obstacles, and back from the
    arena's edge: `[*B, Q, obs]` -> `[*B, Q, 2]` forces. Drives the prey when `scripted_prey`."""
    _, pos, obstacles, others = _split(observation, config)
    predators = others[..., : config.n_predators, :]  # [*B, Q, P, 2] relative to self
    away = -(predators / predators.norm(dim=-1, keepdim=True).clamp_min(1e-3) ** 3).sum(-2)
    gap = obstacles.norm(dim=-1, keepdim=True).clamp_min(1e-3)  # [*B, Q, L, 1]
    near = (gap < OBSTACLE_RADIUS + 0.2).float()
    away = away - (near * obstacles / gap**3).sum(-2)
    # Past 0.7 from the centre the edge pushes back harder than the predators push out.
    edge = torch.relu(pos.abs() - 0.7) * pos.sign() * 50.0
    return _unit(_unit(away) - edge)


def _main() -> None:
    from envs.render import demo_env, demo_parser, demo_policy, play

    parser = demo_parser("Run scripted (or random) predators against scripted prey on tag.")
    parser.add_argument("--n-predators", type=int, default=3, help="predators per env")
    parser.add_argument("--n-prey", type=int, default=1, help="prey per env")
    args = parser.parse_args()
    options = dict(n_predators=args.n_predators, n_prey=args.n_prey, scripted_prey=True)
    env = demo_env(parser, lambda: Tag(TagConfig(**options), num_envs=args.num_envs, seed=0))
    config = env.config
    scripted = lambda obs: {"predator": scripted_predator_action(obs["predator", "observation"], config)}  # noqa: E731
    policy = demo_policy(env, args.policy, scripted)
    returns = play(env, policy, args.steps, gif=args.gif)
    print(f"catches per episode: {returns['predator'] / config.catch_reward:.2f}")


if __name__ == "__main__":
    _main()

"""`navigation`: agents drive to their own goals without bumping into each other.

The same task as VMAS's `navigation` scenario, so the two can be compared on equal work: `n_agents`
discs with 2-D force actions, damped double-integrator dynamics (VMAS's: dt 0.1 in 2 substeps, drag
0.25, soft contacts), and an 18-number observation: own position, velocity, goal relative to self and
a 12-ray LIDAR that senses other agents. Reward: the decrease in distance to goal (summed over the
team when `shared_reward`), a penalty for each collision, and a bonus when every agent is on its goal,
which also ends the episode.

`goal_visible_steps=k` makes it a task that needs memory: an agent sees its goal only in the first k
observations of an episode, after which the goal part of its observation reads 0. It must remember where
the goal was (its own position is in the observation): a recurrent policy can, an MLP cannot.

`discrete_actions` replaces the forces by 5 discrete moves (spread's: no-op, left, right, down, up, each a
unit force), for value-based algorithms.

Run `python -m envs.native.navigation --gif nav.gif` to watch the scripted go-to-goal controller.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import torch
import torch.nn.functional as F

from envs.base import EnvConfig, MultiAgentEnv
from envs.native import physics
from envs.native.spread import MOVES
from envs.registry import register
from envs.render import Canvas, colour, lighter
from envs.specs import Box, Discrete, GroupSpec


@dataclasses.dataclass(frozen=True)
class NavigationConfig(EnvConfig):
    n_agents: int = 3
    """Number of agents (1 to 256), each with its own goal."""
    shared_reward: bool = True
    """Give every agent the team's summed distance reward (else each its own)."""
    agent_radius: float = 0.1
    """Radius of an agent's disc."""
    goal_radius: float = 0.1
    """An agent is on its goal when its centre is this close to it."""
    spawn_half_width: float = 0.0
    """Agents and goals spawn in [-w, w]^2; 0 picks max(1, 0.6 * sqrt(n_agents))."""
    lidar_range: float = 0.35
    """How far the LIDAR sees."""
    n_lidar_rays: int = 12
    """Number of LIDAR rays, evenly spaced."""
    collision_penalty: float = -1.0
    """Reward added to each agent of a colliding pair."""
    final_reward: float = 0.01
    """Reward for every agent when all agents are on their goals."""
    distance_reward_scale: float = 1.0
    """Scale of the reward for getting closer to the goal."""
    goal_visible_steps: int = 0
    """An agent sees its goal only in an episode's first this many observations (then 0s): a task that
    needs memory. 0: always."""
    discrete_actions: bool = False
    """5 discrete moves (no-op, left, right, down, up: a unit force) instead of 2-D forces in [-1, 1]."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 1 <= self.n_agents <= 256:
            raise ValueError(f"n_agents must be in [1, 256], got {self.n_agents}")
        for name in ("agent_radius", "goal_radius", "lidar_range"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.spawn_half_width < 0:
            raise ValueError(f"spawn_half_width must be >= 0, got {self.spawn_half_width}")
        if self.n_lidar_rays < 1:
            raise ValueError(f"n_lidar_rays must be >= 1, got {self.n_lidar_rays}")
        if self.goal_visible_steps < 0:
            raise ValueError(f"goal_visible_steps must be >= 0 (0: always visible), got {self.goal_visible_steps}")

    @property
    def arena(self) -> float:
        return self.spawn_half_width or max(1.0, 0.6 * math.sqrt(self.n_agents))


# VMAS's world constants, for equal work.
DT, SUBSTEPS, DRAG, CONTACT_STIFFNESS, COLLISION_DISTANCE = 0.1, 2, 0.25, 100.0, 0.005


@register("navigation")
class Navigation(MultiAgentEnv):
    Config = NavigationConfig
    config: NavigationConfig

    def _make_groups(self):
        c = self.config
        observation = Box((6 + c.n_lidar_rays,))
        action = Discrete(len(MOVES)) if c.discrete_actions else Box((2,), -1.0, 1.0)
        return {"agent": GroupSpec([f"agent_{i}" for i in range(c.n_agents)], observation, action)}

    def _init_state(self) -> None:
        B, n = self.num_envs, self.config.n_agents
        self.pos = torch.zeros(B, n, 2, device=self.device)  # [B, n, 2]
        self.vel = torch.zeros(B, n, 2, device=self.device)  # [B, n, 2]
        self.goal = torch.zeros(B, n, 2, device=self.device)  # [B, n, 2]
        self.distance = torch.zeros(B, n, device=self.device)  # [B, n] to the goal, after the last step
        self.moves = torch.tensor(MOVES, device=self.device)  # [5, 2]: the force of each discrete move

    def _reset(self, mask: torch.Tensor) -> None:
        c, B, n = self.config, self.num_envs, self.config.n_agents
        spawn = physics.spawn_separated(
            B, 2 * n, c.arena, 2 * c.agent_radius + 0.05, self.rng
        )  # [B, 2n, 2]: agents then goals
        m = mask[:, None, None]
        self.pos = torch.where(m, spawn[:, :n], self.pos)
        self.goal = torch.where(m, spawn[:, n:], self.goal)
        self.vel = torch.where(m, 0.0, self.vel)
        self.distance = (self.goal - self.pos).norm(dim=-1)

    def _step(self, action):
        c = self.config
        push = F.embedding(action["agent"], self.moves) if c.discrete_actions else action["agent"]  # [B, n, 2]
        for substep in range(SUBSTEPS):
            force = push + physics.contact_forces(self.pos, c.agent_radius, CONTACT_STIFFNESS)
            drag = DRAG if substep == 0 else 0.0
            self.pos, self.vel = physics.integrate(self.pos, self.vel, force, dt=DT / SUBSTEPS, drag=drag)

        distance = (self.goal - self.pos).norm(dim=-1)  # [B, n]
        progress = (self.distance - distance) * c.distance_reward_scale
        self.distance = distance
        if c.shared_reward:
            progress = progress.sum(-1, keepdim=True).expand_as(progress)
        centre_gap = physics.pairwise_offsets(self.pos).norm(dim=-1)  # [B, n, n]
        colliding = (centre_gap <= 2 * c.agent_radius + COLLISION_DISTANCE) & ~torch.eye(
            c.n_agents, dtype=torch.bool, device=self.device
        )
        collisions = colliding.sum(-1) * c.collision_penalty
        all_on_goal = (distance < c.goal_radius).all(-1)  # [B]
        reward = progress + collisions + torch.where(all_on_goal, c.final_reward, 0.0)[:, None]
        return {"agent": reward}, all_on_goal

    def _observe(self):
        c = self.config
        lidar = physics.lidar(self.pos, c.agent_radius, c.n_lidar_rays, c.lidar_range)  # [B, n, K]
        to_goal = self.goal - self.pos  # [B, n, 2]
        if c.goal_visible_steps:
            to_goal = to_goal * (self.step_count < c.goal_visible_steps)[:, None, None]
        # Like VMAS, the LIDAR reads range minus distance: 0 means nothing in sight.
        return {"agent": torch.cat([self.pos, self.vel, to_goal, c.lidar_range - lidar], -1)}

    def _render(self, index: int) -> np.ndarray:
        c = self.config
        canvas = Canvas(c.arena + 0.3)
        canvas.border(c.arena)
        pos, goal = self.pos[index].cpu().numpy(), self.goal[index].cpu().numpy()
        for i in range(c.n_agents):
            canvas.disc(goal[i], c.goal_radius, lighter(colour(i)))
        for i in range(c.n_agents):
            canvas.disc(pos[i], c.agent_radius, colour(i))
        return canvas.image


def scripted_action(
    observation: torch.Tensor, gain: float = 3.0, damping: float = 1.5, repulsion: float = 10.0
) -> torch.Tensor:
    """A go-to-goal PD controller that steers away from what its LIDAR sees:
    `[*B, n, 6 + K]` observations -> `[*B, n, 2]` forces in [-1, 1].

    It is the yardstick trained teams are compared against.
    """
    velocity, to_goal, lidar = observation[..., 2:4], observation[..., 4:6], observation[..., 6:]
    angles = torch.arange(lidar.shape[-1], device=lidar.device) * (2 * math.pi / lidar.shape[-1])
    directions = torch.stack([angles.cos(), angles.sin()], -1)  # [K, 2]
    away = -lidar @ directions  # LIDAR readings grow as things get closer: push from them
    return (gain * to_goal - damping * velocity + repulsion * away).clamp(-1.0, 1.0)


def _main() -> None:
    import time

    from envs.render import demo_env, demo_parser, demo_policy, play

    parser = demo_parser("Run the scripted go-to-goal controller (or random actions) on navigation.")
    parser.add_argument("--n-agents", type=int, default=3, help="agents per env")
    parser.add_argument("--max-steps", type=int, default=100, help="steps per episode")
    args = parser.parse_args()
    config = dict(n_agents=args.n_agents, max_steps=args.max_steps)
    env = demo_env(parser, lambda: Navigation(NavigationConfig(**config), num_envs=args.num_envs, seed=0))
    policy = demo_policy(env, args.policy, lambda obs: {"agent": scripted_action(obs["agent", "observation"])})
    start = time.perf_counter()
    returns = play(env, policy, args.steps, gif=args.gif)
    elapsed = time.perf_counter() - start
    print(f"{args.num_envs * args.steps / elapsed:,.0f} env-steps/s; mean episode return {returns['agent']:.3f}")


if __name__ == "__main__":
    _main()

"""`spread`: agents cover landmarks without bumping into each other (MPE's `simple_spread`).

The same task as MPE's `simple_spread` (mpe2 `simple_spread_v3`, JaxMARL `MPE_simple_spread_v3`), so they
can be compared on equal work: `n_agents` discs (radius 0.15) and as many landmarks spawn uniformly in
[-1, 1]^2; MPE's dynamics (dt 0.1, damping 0.25, action force x5, soft contacts between agents) and
25-step episodes.

Observation per agent, `6 * n_agents` numbers (18 for 3), in MPE's order: own velocity (2), own
position (2), every landmark relative to self (2 each), every other agent relative to self (2 each),
then the other agents' communication channels (2 each, always zero: the agents are silent).

Actions: MPE's 5 discrete moves (0 no-op, 1 left, 2 right, 3 down, 4 up), or with `continuous_actions`
a 2-D force in [-1, 1] (MPE's continuous `[_, left, right, down, up]` acts as `(right - left, up - down)`,
which spans the same forces).

Reward, MPE's: the team's coverage `-sum over landmarks of the distance to the closest agent`, weighted
`1 - local_ratio`, plus each agent's own `-1 per agent it collides with`, weighted `local_ratio`.

Run `python -m envs.spread --gif spread.gif` to watch the scripted greedy-assignment controller.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from envs import physics
from envs.base import EnvConfig, MultiAgentEnv
from envs.registry import register
from envs.render import Canvas, colour
from envs.specs import Box, Discrete, GroupSpec


@dataclasses.dataclass(frozen=True)
class SpreadConfig(EnvConfig):
    max_steps: int = 25
    """Episode length (MPE's max_cycles)."""
    n_agents: int = 3
    """Number of agents, and of landmarks to cover (1 to 64)."""
    local_ratio: float = 0.5
    """Weight of each agent's own collision penalty; the shared coverage reward weighs 1 - local_ratio."""
    continuous_actions: bool = False
    """2-D forces in [-1, 1] instead of MPE's 5 discrete moves."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 1 <= self.n_agents <= 64:
            raise ValueError(f"n_agents must be in [1, 64], got {self.n_agents}")
        if not 0.0 <= self.local_ratio <= 1.0:
            raise ValueError(f"local_ratio must be in [0, 1], got {self.local_ratio}")


# MPE's world constants.
DT, DRAG, ACCEL, CONTACT_STIFFNESS, CONTACT_MARGIN = 0.1, 0.25, 5.0, 100.0, 1e-3
AGENT_RADIUS, LANDMARK_RADIUS, COMM_DIM = 0.15, 0.05, 2
# Force of each discrete move: no-op, left, right, down, up.
MOVES = ((0.0, 0.0), (-1.0, 0.0), (1.0, 0.0), (0.0, -1.0), (0.0, 1.0))


@register("spread")
class Spread(MultiAgentEnv):
    Config = SpreadConfig
    config: SpreadConfig

    def _make_groups(self):
        n = self.config.n_agents
        action = Box((2,), -1.0, 1.0) if self.config.continuous_actions else Discrete(len(MOVES))
        return {"agent": GroupSpec([f"agent_{i}" for i in range(n)], Box((6 * n,)), action)}

    def _init_state(self) -> None:
        B, n = self.num_envs, self.config.n_agents
        self.pos = torch.zeros(B, n, 2, device=self.device)  # [B, n, 2]
        self.vel = torch.zeros(B, n, 2, device=self.device)  # [B, n, 2]
        self.landmark = torch.zeros(B, n, 2, device=self.device)  # [B, n, 2]
        self.silence = torch.zeros(B, n, COMM_DIM * (n - 1), device=self.device)  # [B, n, 2(n-1)] others' comm
        self.moves = torch.tensor(MOVES, device=self.device) * ACCEL  # [5, 2]

    def _reset(self, mask: torch.Tensor) -> None:
        n = self.config.n_agents
        spawn = physics.spawn_uniform(self.num_envs, 2 * n, 1.0, self.generator, self.device)  # agents, landmarks
        m = mask[:, None, None]
        self.pos = torch.where(m, spawn[:, :n], self.pos)
        self.landmark = torch.where(m, spawn[:, n:], self.landmark)
        self.vel = torch.where(m, 0.0, self.vel)

    def _step(self, action):
        c = self.config
        force = action["agent"] * ACCEL if c.continuous_actions else self.moves[action["agent"]]  # [B, n, 2]
        force = force + physics.contact_forces(self.pos, AGENT_RADIUS, CONTACT_STIFFNESS, CONTACT_MARGIN, cutoff=False)
        self.pos, self.vel = physics.integrate_explicit(self.pos, self.vel, force, dt=DT, drag=DRAG)

        to_landmark = (self.landmark.unsqueeze(1) - self.pos.unsqueeze(2)).norm(dim=-1)  # [B, agent, landmark]
        coverage = -to_landmark.amin(1).sum(-1, keepdim=True)  # [B, 1]
        gap = physics.pairwise_offsets(self.pos).norm(dim=-1)  # [B, n, n]
        collisions = (gap < 2 * AGENT_RADIUS).sum(-1) - 1  # [B, n]: an agent is always within reach of itself
        reward = (1 - c.local_ratio) * coverage - c.local_ratio * collisions
        return {"agent": reward}, torch.zeros(self.num_envs, dtype=torch.bool, device=self.device)

    def _observe(self):
        landmarks = self.landmark.unsqueeze(1) - self.pos.unsqueeze(2)  # [B, n, n, 2]
        others = physics.drop_self(physics.pairwise_offsets(self.pos))  # [B, n, n-1, 2]
        return {"agent": torch.cat([self.vel, self.pos, landmarks.flatten(2), others.flatten(2), self.silence], -1)}

    def _render(self, index: int) -> np.ndarray:
        canvas = Canvas(1.5)
        canvas.border(1.0)
        for i, point in enumerate(self.pos[index].cpu().numpy()):
            canvas.disc(point, AGENT_RADIUS, colour(i))
        for point in self.landmark[index].cpu().numpy():  # on top, so that covered landmarks show
            canvas.disc(point, LANDMARK_RADIUS, (64, 64, 64))
        return canvas.image


def scripted_action(observation: torch.Tensor, continuous: bool = False) -> torch.Tensor:
    """Greedy assignment then go-to-landmark: `[*B, n, 6n]` observations -> `[*B, n]` moves (or `[*B, n, 2]`
    forces when `continuous`).

    Every agent rebuilds the whole layout from its own observation and runs the same greedy matching
    (closest free agent-landmark pair first), so the team agrees on who covers what without talking.
    It ignores collisions; it is the yardstick that trained teams are compared against.
    """
    n = observation.shape[-1] // 6
    velocity, landmarks = observation[..., :2], observation[..., 4 : 4 + 2 * n].unflatten(-1, (n, 2))
    others = observation[..., 4 + 2 * n : 2 + 4 * n].unflatten(-1, (n - 1, 2))  # [*B, n, n-1, 2]
    # The matching depends on distances only, so each observer may list itself first: [*B, n, n, 2].
    agents = torch.cat([torch.zeros_like(others[..., :1, :]), others], -2)
    distance = (landmarks.unsqueeze(-3) - agents.unsqueeze(-2)).norm(dim=-1)  # [*B, observer, agent, landmark]
    slot = torch.arange(n, device=observation.device)
    mine = torch.zeros(distance.shape[:-2], dtype=torch.long, device=observation.device)  # [*B, n]
    for _ in range(n):
        pair = distance.flatten(-2).argmin(-1)  # [*B, n]: the closest free (agent, landmark) pair
        agent, landmark = pair // n, pair % n
        mine = torch.where(agent == 0, landmark, mine)
        taken = (slot == agent[..., None]).unsqueeze(-1) | (slot == landmark[..., None]).unsqueeze(-2)
        distance = distance.masked_fill(taken, float("inf"))
    target = landmarks.gather(-2, mine[..., None, None].expand(*mine.shape, 1, 2)).squeeze(-2)  # [*B, n, 2]
    force = 3.0 * target - 1.0 * velocity  # a PD pull towards the landmark
    if continuous:
        return force.clamp(-1.0, 1.0)
    moves = torch.tensor(MOVES, device=observation.device)  # [5, 2]
    score = force @ moves.T - 0.5  # the no-op wins unless the pull is clear
    score[..., 0] = 0.0
    return score.argmax(-1)


def _main() -> None:
    from envs.render import demo_parser, play

    parser = demo_parser("Run the scripted greedy-assignment controller on spread.")
    parser.add_argument("--n-agents", type=int, default=3, help="agents (and landmarks) per env")
    args = parser.parse_args()
    env = Spread(SpreadConfig(n_agents=args.n_agents), num_envs=args.num_envs, seed=0)
    returns = play(env, lambda obs: {"agent": scripted_action(obs["agent", "observation"])}, args.steps, gif=args.gif)
    print(f"mean episode return per agent: {returns['agent']:.3f}")


if __name__ == "__main__":
    _main()

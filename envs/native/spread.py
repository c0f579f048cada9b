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

Run `python -m envs.native.spread --gif spread.gif` to watch the scripted greedy-assignment controller.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch
import torch.nn.functional as F

from envs.base import EnvConfig, MultiAgentEnv
from envs.native import physics
from envs.native.physics import MPE_ACCEL, MPE_CONTACT_MARGIN, MPE_CONTACT_STIFFNESS, MPE_DRAG, MPE_DT
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


AGENT_RADIUS, LANDMARK_RADIUS = 0.15, 0.05  # MPE's sizes
# Force of each discrete move: no-op, left, right, down, up.
MOVES = ((0.0, 0.0), (-1.0, 0.0), (1.0, 0.0), (0.0, -1.0), (0.0, 1.0))


def offset_tables(n: int, device: torch.device) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """What spread reads from the world, as differences of entries of a flattened world row
    (`[B, 2(3n + 1)]`: `(x, y)` of the agents' positions, the landmarks, the agents' velocities and the
    origin, which stays zero): observations, and offsets between agents and from agents to landmarks.

    Each table is a pair of index tensors `(plus, minus)` `[k]`, read eagerly as `row[plus] - row[minus]`:
    two gathers and a subtraction over the whole batch. Eager CPU broadcasting of `[B, n, n, 2]` tensors
    (an innermost dimension of 2) is slow: a rewrite with navigation's named tensors and broadcast
    offsets stepped at 0.4-0.9x these tables' env-steps/s (the README's table of CPU-only paths).
    "Planar" tables list every x, then every y, so that distances come from two contiguous halves.
    """
    pos, landmark, vel = (lambda i, c: 2 * i + c), (lambda k, c: 2 * (n + k) + c), (lambda i, c: 2 * (2 * n + i) + c)
    origin = 6 * n
    others = [(i, j) for i in range(n) for j in range(n) if j != i]  # each agent's other agents, MPE's order
    pairs = [(pos(j, c), pos(i, c)) for c in range(2) for i, j in others]  # planar pos_j - pos_i
    # Planar pos_j - pos_i, then landmark_k - pos_i (landmark-major: the closest agent is a min over the last dim).
    sight = [
        entry
        for c in range(2)
        for entry in [(pos(j, c), pos(i, c)) for i, j in others]
        + [(landmark(k, c), pos(i, c)) for k in range(n) for i in range(n)]
    ]
    observe = []  # agent after agent, MPE's layout: velocity, position, landmarks, other agents, silent comm
    for i in range(n):
        observe += [(vel(i, c), origin) for c in range(2)] + [(pos(i, c), origin) for c in range(2)]
        observe += [(landmark(k, c), pos(i, c)) for k in range(n) for c in range(2)]
        observe += [(pos(j, c), pos(i, c)) for j in range(n) if j != i for c in range(2)]
        observe += [(origin, origin)] * (2 * (n - 1))
    tables = {"pairs": pairs, "sight": sight, "observe": observe}
    return {
        name: tuple(torch.tensor(entries, dtype=torch.long, device=device).reshape(-1, 2).T)
        for name, entries in tables.items()
    }


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
        # [B, 3n + 1, 2]: agent positions, landmarks, agent velocities, the origin (always zero).
        self.world = torch.zeros(B, 3 * n + 1, 2, device=self.device)
        self.tables = offset_tables(n, self.device)
        self.moves = torch.tensor(MOVES, device=self.device) * MPE_ACCEL  # [5, 2]

    @property
    def pos(self) -> torch.Tensor:
        return self.world[:, : self.config.n_agents]  # [B, n, 2]

    @property
    def landmark(self) -> torch.Tensor:
        return self.world[:, self.config.n_agents : 2 * self.config.n_agents]  # [B, n, 2]

    @property
    def vel(self) -> torch.Tensor:
        return self.world[:, 2 * self.config.n_agents : 3 * self.config.n_agents]  # [B, n, 2]

    def _reset(self, mask: torch.Tensor) -> None:
        B, n = self.num_envs, self.config.n_agents
        spawn = physics.spawn_uniform(B, 2 * n, 1.0, self.rng)  # [B, 2n, 2]: agents, landmarks
        at_rest = torch.zeros(B, n + 1, 2, device=self.device)  # velocities and the origin
        self.world = torch.where(mask[:, None, None], torch.cat([spawn, at_rest], 1), self.world)

    def _read(self, table: str) -> torch.Tensor:
        """What `table` reads from the world: `[B, 2, k]` planar offsets for "pairs" (pos_j - pos_i of every
        agent i and other agent j) and "sight" (those, then landmark_l - pos_i, landmark-major); `[B, n, 6n]`
        observations for "observe".

        Eager, as gathers from the index tables (the fastest form on a CPU). Compiled, by broadcasting,
        which inductor fuses into one vectorised loop (it emits scalar, bounds-checked loads for gathers).
        """
        B, n = self.num_envs, self.config.n_agents
        if not torch.compiler.is_compiling():
            plus, minus = self.tables[table]
            row = self.world.flatten(1)  # [B, 2(3n + 1)]
            read = row.index_select(1, plus).sub_(row.index_select(1, minus))
            return read.view(B, n, 6 * n) if table == "observe" else read.view(B, 2, -1)
        others = physics.pairwise_offsets(self.pos, others_only=True)  # [B, n, n-1, 2]
        if table == "observe":
            landmarks = self.landmark.unsqueeze(1) - self.pos.unsqueeze(2)  # [B, n, n, 2]: seen from each agent
            silence = self.pos.new_zeros(B, n, 2 * (n - 1))  # the other agents' communication
            return torch.cat([self.vel, self.pos, landmarks.flatten(2), others.flatten(2), silence], -1)
        pairs = others.flatten(1, 2).transpose(1, 2)  # [B, 2, m]
        if table == "pairs":
            return pairs
        landmarks = (self.landmark.unsqueeze(2) - self.pos.unsqueeze(1)).flatten(1, 2).transpose(1, 2)  # [B, 2, n^2]
        return torch.cat([pairs, landmarks], -1)

    def _step(self, action):
        c, B, n = self.config, self.num_envs, self.config.n_agents
        m = n * (n - 1)
        force = action["agent"] * MPE_ACCEL if c.continuous_actions else F.embedding(action["agent"], self.moves)

        # MPE's soft contacts between every two agents (no cutoff: the push fades like exp(-gap / margin)).
        offsets = self._read("pairs")  # [B, 2, m]: pos_j - pos_i for every (agent i, other agent j)
        distance = _square_norm(offsets).sqrt().clamp_min(1e-6)  # [B, m]
        penetration = F.softplus((2 * AGENT_RADIUS - distance) / MPE_CONTACT_MARGIN)  # in units of the margin
        push = penetration * (-MPE_CONTACT_STIFFNESS * MPE_CONTACT_MARGIN) / distance  # [B, m], away from j
        contact = (offsets.view(B, 2, n, n - 1) * push.view(B, 1, n, n - 1)).sum(-1).transpose(1, 2)  # [B, n, 2]
        pos, vel = physics.integrate_explicit(self.pos, self.vel, force + contact, dt=MPE_DT, drag=MPE_DRAG)
        self.world = torch.cat([pos, self.world[:, n : 2 * n], vel, self.world[:, 3 * n :]], 1)

        square_distance = _square_norm(self._read("sight"))  # [B, m + n^2]
        collisions = (square_distance[:, :m] < (2 * AGENT_RADIUS) ** 2).view(B, n, n - 1).sum(-1)  # [B, n]
        closest = square_distance[:, m:].view(B, n, n).amin(-1)  # [B, landmark]: squared distance to its closest agent
        shared = closest.sqrt().sum(-1, keepdim=True) * (c.local_ratio - 1)  # [B, 1]: -coverage, weighted
        reward = torch.add(shared, collisions, alpha=-c.local_ratio)  # [B, n]
        return {"agent": reward}, torch.zeros(B, dtype=torch.bool, device=self.device)

    def _observe(self):
        return {"agent": self._read("observe")}

    def _render(self, index: int) -> np.ndarray:
        canvas = Canvas(1.5)
        canvas.border(1.0)
        for i, point in enumerate(self.pos[index].cpu().numpy()):
            canvas.disc(point, AGENT_RADIUS, colour(i))
        for point in self.landmark[index].cpu().numpy():  # on top, so that covered landmarks show
            canvas.disc(point, LANDMARK_RADIUS, (64, 64, 64))
        return canvas.image


def _square_norm(planar: torch.Tensor) -> torch.Tensor:
    """Squared lengths of planar vectors: `[B, 2, k]` (all x, then all y) -> `[B, k]`."""
    x, y = planar.unbind(1)
    return torch.addcmul(x.square(), y, y)


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
    from envs.render import demo_env, demo_parser, demo_policy, play

    parser = demo_parser("Run the scripted greedy-assignment controller (or random actions) on spread.")
    parser.add_argument("--n-agents", type=int, default=3, help="agents (and landmarks) per env")
    args = parser.parse_args()
    env = demo_env(parser, lambda: Spread(SpreadConfig(n_agents=args.n_agents), num_envs=args.num_envs, seed=0))
    policy = demo_policy(env, args.policy, lambda obs: {"agent": scripted_action(obs["agent", "observation"])})
    returns = play(env, policy, args.steps, gif=args.gif)
    print(f"mean episode return per agent: {returns['agent']:.3f}")


if __name__ == "__main__":
    _main()

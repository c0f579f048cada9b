"""Batched 2-D particle physics shared by the native envs.

Everything works on whole batches: positions `[B, m, 2]`, pairwise terms `[B, m, m, ...]`. Nothing
loops over envs or agents in Python and nothing reads a value back to the host.
"""

from __future__ import annotations

import math

import torch

from envs.random import CounterRandom

# MPE's world (mpe2's `core.World`, shared by its scenarios): time step, velocity damping per step,
# contact stiffness and margin, and the force of a full action for agents without an accel of their own.
MPE_DT, MPE_DRAG, MPE_CONTACT_STIFFNESS, MPE_CONTACT_MARGIN, MPE_ACCEL = 0.1, 0.25, 100.0, 1e-3, 5.0


def pairwise_offsets(pos: torch.Tensor, others_only: bool = False) -> torch.Tensor:
    """`offsets[b, i, j] = pos[b, j] - pos[b, i]`: where `j` is seen from `i`; `[B, m, m, 2]`.

    With `others_only`, `[B, m, m - 1, 2]` without `j == i`, row `i` holding every other `j` in order
    (as `drop_self` gives).
    """
    offsets = pos.unsqueeze(1) - pos.unsqueeze(2)
    return drop_self(offsets) if others_only else offsets


def drop_self(pairwise: torch.Tensor) -> torch.Tensor:
    """Remove the diagonal of a pairwise tensor: `[B, m, m, ...] -> [B, m, m - 1, ...]`, row `i` holding
    every `j != i` in order (MPE's "other agents" order).

    Views and one copy, no index tensor: the `m * m - 1` entries after the first, cut into rows of
    `m + 1`, hold each diagonal entry in their last column.
    """
    B, m = pairwise.shape[:2]
    rest = pairwise.shape[3:]
    off_diagonal = pairwise.flatten(1, 2)[:, 1:].unflatten(1, (m - 1, m + 1))[:, :, :m]  # [B, m-1, m, ...]
    return off_diagonal.reshape(B, m, m - 1, *rest)


def spawn_uniform(num_envs: int, n_entities: int, half_width: float, rng: CounterRandom) -> torch.Tensor:
    """Positions drawn uniformly from `[-half_width, half_width]^2` (MPE's spawn); `[num_envs, n_entities, 2]`."""
    return (rng.rand(num_envs, n_entities, 2) * 2 - 1) * half_width


MAX_CELLS_PER_SIDE = 64


def spawn_separated(
    num_envs: int,
    n_entities: int,
    half_width: float,
    min_distance: float,
    rng: CounterRandom,
) -> torch.Tensor:
    """Random positions in `[-half_width, half_width]^2`, pairwise at least `min_distance` apart.

    A jittered grid on a torus: the square is cut into a grid of cells at least `2 * min_distance`
    wide; each entity takes its own random cell and a random spot in the middle of it (at least
    `min_distance / 2` from the cell's sides), then the whole layout is shifted by a random offset and
    wrapped around the square. Entities in different cells stay `min_distance` apart, and the shift
    makes each entity's position uniform over the square. The draw costs a handful of batched ops, no
    rejection loop, and the same amount of randomness whatever the data, so a seed fixes it.

    Returns `[num_envs, n_entities, 2]`.
    """
    width = 2 * half_width
    # Every reset sorts a random key per cell for the whole batch: a large arena gets a grid of at most
    # MAX_CELLS_PER_SIDE squared cells (wider cells keep entities further apart), not one that outgrows memory.
    cells_per_side = max(int(min(width // (2 * min_distance), MAX_CELLS_PER_SIDE)), 1)
    if cells_per_side**2 < n_entities:
        cells_per_side = int(min(width // min_distance, MAX_CELLS_PER_SIDE))
    if cells_per_side**2 < n_entities:
        raise ValueError(
            f"cannot place {n_entities} entities {min_distance} apart in a square of half-width {half_width}: "
            f"make the arena larger"
        )
    cell = width / cells_per_side
    cells = rng.bits32(num_envs, cells_per_side**2).argsort(-1)[:, :n_entities]  # distinct random cells
    grid = torch.arange(cells_per_side**2, device=rng.device)
    corners = torch.stack([grid % cells_per_side, grid // cells_per_side], -1).float() * cell  # [cells, 2]
    corner = corners[cells]  # [B, m, 2]
    jitter = rng.rand(num_envs, n_entities, 2) * (cell - min_distance)
    shift = rng.rand(num_envs, 1, 2) * width
    return torch.remainder(corner + min_distance / 2 + jitter + shift, width) - half_width


def contact_forces(
    pos: torch.Tensor,
    radius: float | torch.Tensor,
    stiffness: float = 100.0,
    margin: float = 1e-3,
    *,
    cutoff: bool = True,
) -> torch.Tensor:
    """Soft repulsion between overlapping discs; `[B, m, 2]` force on each.

    `radius` is one float for discs of equal size, or a `[m]` tensor of per-disc radii. The push grows
    like a softplus of the penetration depth (smooth, so the integrator stays stable). With `cutoff`
    (VMAS's contact model) discs that do not touch do not push; without it (MPE's) the push fades
    outside contact like `exp(-gap / margin)`.
    """
    offsets = pairwise_offsets(pos, others_only=True)  # [B, m, m-1, 2], every other j seen from i
    distance = offsets.norm(dim=-1)  # [B, m, m-1]
    if isinstance(radius, (int, float)):
        reach = 2 * radius
    else:
        reach = drop_self((radius[:, None] + radius[None, :]).unsqueeze(0)).squeeze(0)  # [m, m-1]
    penetration = torch.nn.functional.softplus((reach - distance) / margin) * margin
    pushing = distance > 1e-6  # discs at the same spot: no direction to push
    if cutoff:
        pushing = pushing & (distance < reach)
    magnitude = torch.where(pushing, stiffness * penetration / distance.clamp_min(1e-6), 0.0)
    # Force on i points away from every j that pushes it.
    return -(magnitude.unsqueeze(-1) * offsets).sum(2)


def integrate(
    pos: torch.Tensor,
    vel: torch.Tensor,
    force: torch.Tensor,
    *,
    dt: float,
    drag: float,
    mass: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One semi-implicit Euler step of a damped double integrator; returns the new `(pos, vel)`."""
    vel = vel * (1 - drag) + force / mass * dt
    return pos + vel * dt, vel


def integrate_explicit(
    pos: torch.Tensor,
    vel: torch.Tensor,
    force: torch.Tensor,
    *,
    dt: float,
    drag: float,
    max_speed: float | torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One step of MPE's integrator (unit mass): the position moves with the old velocity, then the
    velocity is damped, pushed by `force` and capped at `max_speed` (one float, or `[m]` per entity);
    returns the new `(pos, vel)`."""
    pos = torch.add(pos, vel, alpha=dt)
    vel = torch.add(vel * (1 - drag), force, alpha=dt)
    if max_speed is not None:
        if isinstance(max_speed, torch.Tensor):
            max_speed = max_speed.unsqueeze(-1)  # [m, 1]
        vel = vel * (max_speed / vel.norm(dim=-1, keepdim=True).clamp_min(1e-12)).clamp_max(1.0)
    return pos, vel


def lidar(pos: torch.Tensor, radius: float, n_rays: int, max_range: float) -> torch.Tensor:
    """Range to the nearest other disc along `n_rays` evenly spaced rays from each disc's centre.

    Rays start at angle 0 and turn anticlockwise. A ray that hits nothing within `max_range` reads
    `max_range`. Returns `[B, m, n_rays]`.
    """
    B, m = pos.shape[:2]
    if m == 1:  # nothing else to see
        return pos.new_full((B, 1, n_rays), max_range)
    angles = torch.arange(n_rays, device=pos.device, dtype=pos.dtype) * (2 * math.pi / n_rays)
    directions = torch.stack([angles.cos(), angles.sin()])  # [2, K]
    offsets = pairwise_offsets(pos, others_only=True)  # [B, m, m-1, 2]: the other discs only
    # Distance along each ray to the point closest to disc j, one matmul: [B, m, m-1, K]. These tensors
    # dominate the step (memory-bound passes), so the rest is done in place on two of them.
    along = offsets @ directions
    # The ray enters disc j where along^2 - (|offset|^2 - r^2) > 0, at distance along - sqrt(that).
    beyond = offsets.square().sum(-1, keepdim=True) - radius**2  # [B, m, m-1, 1]
    discriminant = torch.mul(along, along).sub_(beyond)  # (x * x: torch's CPU pow is several times slower)
    miss = (discriminant <= 0).logical_or_(along <= 0)
    # Clamped to the smallest normal float, not 0: torch's CPU sqrt is much slower on zeros (most rays miss).
    entry = along.sub_(discriminant.clamp_min_(torch.finfo(pos.dtype).tiny).sqrt_())
    return entry.masked_fill_(miss, max_range).amin(2).clamp_(0, max_range)  # [B, m, K]

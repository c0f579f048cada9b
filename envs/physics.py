"""Batched 2-D particle physics shared by the native envs.

Everything works on whole batches: positions `[B, m, 2]`, pairwise terms `[B, m, m, ...]`. Nothing
loops over envs or agents in Python and nothing reads a value back to the host.
"""

from __future__ import annotations

import math

import torch


def pairwise_offsets(pos: torch.Tensor) -> torch.Tensor:
    """`offsets[b, i, j] = pos[b, j] - pos[b, i]`: where `j` is seen from `i`; `[B, m, m, 2]`."""
    return pos.unsqueeze(1) - pos.unsqueeze(2)


def spawn_separated(
    num_envs: int,
    n_entities: int,
    half_width: float,
    min_distance: float,
    generator: torch.Generator,
    device: torch.device,
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
    cells_per_side = max(int(width // (2 * min_distance)), 1)
    if cells_per_side**2 < n_entities:
        cells_per_side = int(width // min_distance)
    if cells_per_side**2 < n_entities:
        raise ValueError(
            f"cannot place {n_entities} entities {min_distance} apart in a square of half-width {half_width}: "
            f"make the arena larger"
        )
    cell = width / cells_per_side
    cells = torch.rand(num_envs, cells_per_side**2, generator=generator, device=device).argsort(-1)[:, :n_entities]
    corner = torch.stack([cells % cells_per_side, cells // cells_per_side], -1).float() * cell  # [B, m, 2]
    jitter = torch.rand(num_envs, n_entities, 2, generator=generator, device=device) * (cell - min_distance)
    shift = torch.rand(num_envs, 1, 2, generator=generator, device=device) * width
    return torch.remainder(corner + min_distance / 2 + jitter + shift, width) - half_width


def contact_forces(pos: torch.Tensor, radius: float, stiffness: float = 100.0, margin: float = 1e-3) -> torch.Tensor:
    """Soft repulsion between overlapping discs of equal `radius`; `[B, m, 2]` force on each.

    The push grows like a softplus of the penetration depth (smooth, so the integrator stays stable),
    and is zero for discs that do not touch, like VMAS's contact model.
    """
    offsets = pairwise_offsets(pos)  # [B, m, m, 2], j seen from i
    distance = offsets.norm(dim=-1)  # [B, m, m]
    penetration = torch.nn.functional.softplus((2 * radius - distance) / margin) * margin
    touching = (distance < 2 * radius) & (distance > 1e-6)
    magnitude = torch.where(touching, stiffness * penetration / distance.clamp_min(1e-6), 0.0)
    # Force on i points away from every j it touches.
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


def lidar(pos: torch.Tensor, radius: float, n_rays: int, max_range: float) -> torch.Tensor:
    """Range to the nearest other disc along `n_rays` evenly spaced rays from each disc's centre.

    Rays start at angle 0 and turn anticlockwise. A ray that hits nothing within `max_range` reads
    `max_range`. Returns `[B, m, n_rays]`.
    """
    angles = torch.arange(n_rays, device=pos.device, dtype=pos.dtype) * (2 * math.pi / n_rays)
    offsets = pairwise_offsets(pos).unsqueeze(-2)  # [B, m, m, 1, 2]
    # Distance along each ray to the point closest to disc j: [B, m, m, K] (elementwise, so it fuses).
    along = offsets[..., 0] * angles.cos() + offsets[..., 1] * angles.sin()
    # The ray enters disc j where along^2 - (|offset|^2 - r^2) > 0, at distance along - sqrt(that).
    beyond = offsets.square().sum(-1) - radius**2  # [B, m, m, 1]
    discriminant = along.square() - beyond
    hit = (discriminant > 0) & (along > 0)  # a disc never sees itself: its own offset is 0
    entry = along - discriminant.clamp_min(0).sqrt()
    return torch.where(hit, entry, max_range).amin(2).clamp(0, max_range)  # [B, m, K]

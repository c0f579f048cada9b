"""A counter-based random stream made of plain tensor ops, for env resets.

The `i`-th 64-bit draw of a stream (from 0) is `splitmix64(key + (i + 1) * golden_gamma)`: a hash of the
stream's key and the draw's index (the construction of JAX's and Philox's counter-based generators, with
SplitMix64's finaliser as the hash), which is SplitMix64's own generator started at `key`. The `+ 1` keeps
the key itself out of the hash: seed 0's key is 0, whose hash is 0. Because it is ordinary integer tensor arithmetic, with its state in two tensors,
it runs inside `torch.compile` graphs and CUDA graphs, gives the same numbers eagerly and compiled, on
every device, and is saved with the env's state. A `torch.Generator` cannot go into a graph: each draw
from one would split the compiled env step.

Envs draw for the whole batch on every reset (and select with `torch.where`), so how many numbers are
drawn never depends on data, and one env's start never depends on which other envs reset.

Seeded with a sequence of `S` seeds (several training runs' envs in one `[S * B]` batch: `marl train
--seeds`), the stream holds one key per member and splits every draw's env dim (its first; `member_dim`
says another) into `S` blocks: block `k` is exactly what a stream seeded with `seeds[k]` draws for `B`
envs, so member `k`'s envs start as a single run's with seed `k` do.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch


def _signed(value: int) -> int:
    """A 64-bit unsigned constant as the int64 with the same bits."""
    return value - (1 << 64) if value >= 1 << 63 else value


GOLDEN_GAMMA = _signed(0x9E3779B97F4A7C15)
MIX_1 = _signed(0xBF58476D1CE4E5B9)
MIX_2 = _signed(0x94D049BB133111EB)


def _shift_right(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Logical right shift of int64 bits (torch's `>>` on int64 is arithmetic)."""
    return (x >> bits) & ((1 << (64 - bits)) - 1)


def splitmix64(z: torch.Tensor) -> torch.Tensor:
    """SplitMix64's finaliser on int64 tensors (multiplications wrap modulo 2**64)."""
    z = (z ^ _shift_right(z, 30)) * MIX_1
    z = (z ^ _shift_right(z, 27)) * MIX_2
    return z ^ _shift_right(z, 31)


def _count(shape: tuple) -> int:
    """The number of draws for `shape`, whose sizes must be separate ints."""
    if not all(isinstance(size, (int, torch.SymInt)) for size in shape):
        raise TypeError(
            f"random sizes are separate ints, e.g. rng.rand(B, n) or rng.randint(high, B, n) (not torch's "
            f"randint(low, high, size)); got {shape}"
        )
    return math.prod(shape)


class CounterRandom:
    """A seeded stream of random numbers on `device`; its state is `key` and `counter` (int64 tensors).

    `seed` is an int, or a sequence of `S` ints for one stream per member (`key` then `[S]`): every draw's
    member dim (the env dim, its first unless `member_dim` says otherwise) is then split into `S` blocks."""

    def __init__(self, seed: int | Sequence[int], device: torch.device | str) -> None:
        self.device = torch.device(device)
        shape = (len(seed),) if isinstance(seed, Sequence) else ()
        self.key = torch.zeros(shape, dtype=torch.int64, device=self.device)
        self.counter = torch.zeros((), dtype=torch.int64, device=self.device)
        self.seed(seed)

    @property
    def members(self) -> int | None:
        """The number of member streams, None for a single stream."""
        return self.key.shape[0] if self.key.dim() else None

    def seed(self, seed: int | Sequence[int]) -> None:
        """Restart the stream from `seed` (any int; different seeds give unrelated streams), or each member's
        from its seed (a sequence as long as the stream was built with)."""
        seeds = list(seed) if isinstance(seed, Sequence) else [seed]
        if len(seeds) != (self.members or 1) or isinstance(seed, Sequence) != (self.members is not None):
            raise ValueError(f"this stream takes {self.members or 'one'} seed(s), got {seed!r}")
        keys = splitmix64(torch.tensor([_signed(int(s) % (1 << 64)) for s in seeds], dtype=torch.int64))
        self.key.copy_(keys.reshape(self.key.shape))
        self.counter.zero_()

    def _draws(self, shape: tuple, member_dim: int, words: int) -> tuple[torch.Tensor, tuple]:
        """`words(count)` fresh 64-bit draws per member for `count` numbers of `shape` (each member's share
        of it): `[S, words]` with member streams, else `[words]`; and the shape of one member's share."""
        count = _count(shape)
        members = self.members
        if members is not None:
            if not shape or shape[member_dim] % members:
                raise ValueError(
                    f"a draw shaped {tuple(shape)} from {members} member streams needs dim {member_dim} "
                    f"(the env dim) divisible by {members}"
                )
            shape = (*shape[:member_dim], shape[member_dim] // members, *shape[member_dim + 1 :])
            count //= members
        n = words(count)
        index = self.counter + torch.arange(1, n + 1, dtype=torch.int64, device=self.device)
        self.counter += n
        key = self.key if members is None else self.key[:, None]  # [S, 1]: one stream per member
        return splitmix64(key + index * GOLDEN_GAMMA), shape

    def _shaped(self, draws: torch.Tensor, shape: tuple, member_dim: int) -> torch.Tensor:
        """Each member's draws `[S, count]` (or one stream's `[count]`) laid out as `shape`, member `k`'s
        share as block `k` of `member_dim`."""
        if self.members is None:
            return draws.reshape(shape)
        local = (*shape[:member_dim], shape[member_dim] // self.members, *shape[member_dim + 1 :])
        return draws.reshape(self.members, *local).movedim(0, member_dim).reshape(shape)

    def bits(self, *shape: int, member_dim: int = 0) -> torch.Tensor:
        """Fresh random int64 bits shaped `shape`; advances the stream by their number (per member)."""
        draws, _ = self._draws(shape, member_dim, lambda count: count)
        return self._shaped(draws, shape, member_dim)

    def bits32(self, *shape: int, member_dim: int = 0) -> torch.Tensor:
        """Fresh random int32 bits shaped `shape`: both halves of each 64-bit draw (half the hashing)."""
        draws, local = self._draws(shape, member_dim, lambda count: (count + 1) // 2)
        count = math.prod(local)
        return self._shaped(draws.view(torch.int32)[..., :count], shape, member_dim)

    def rand(self, *shape: int, member_dim: int = 0) -> torch.Tensor:
        """Uniform float32 in [0, 1), 24 random bits each."""
        return ((self.bits32(*shape, member_dim=member_dim) >> 8) & 0xFFFFFF).float() * (1.0 / (1 << 24))

    def randn(self, *shape: int) -> torch.Tensor:
        """Standard normal float32 (Box-Muller on two uniforms)."""
        u1, u2 = self.rand(2, *shape, member_dim=1).unbind(0)
        return torch.sqrt(-2.0 * torch.log1p(-u1)) * torch.cos(2 * math.pi * u2)

    def randint(self, high: int, *shape: int) -> torch.Tensor:
        """Uniform int64 in [0, high)."""
        return (self.rand(*shape) * high).long().clamp_max(high - 1)

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {"key": self.key.clone(), "counter": self.counter.clone()}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.key.copy_(state["key"])
        self.counter.copy_(state["counter"])

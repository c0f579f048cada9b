"""A counter-based random stream made of plain tensor ops, for env resets.

The `i`-th 64-bit draw of a stream is `splitmix64(key + i * golden_gamma)`: a hash of the stream's key
and the draw's index (the construction of JAX's and Philox's counter-based generators, with SplitMix64's
finaliser as the hash). Because it is ordinary integer tensor arithmetic, with its state in two tensors,
it runs inside `torch.compile` graphs and CUDA graphs, gives the same numbers eagerly and compiled, on
every device, and is saved with the env's state. A `torch.Generator` cannot go into a graph: each draw
from one would split the compiled env step.

Envs draw for the whole batch on every reset (and select with `torch.where`), so how many numbers are
drawn never depends on data, and one env's start never depends on which other envs reset.
"""

from __future__ import annotations

import math

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
    """A seeded stream of random numbers on `device`; its state is `key` and `counter` (int64 tensors)."""

    def __init__(self, seed: int, device: torch.device | str) -> None:
        self.device = torch.device(device)
        self.key = torch.zeros((), dtype=torch.int64, device=self.device)
        self.counter = torch.zeros((), dtype=torch.int64, device=self.device)
        self.seed(seed)

    def seed(self, seed: int) -> None:
        """Restart the stream from `seed` (any int; different seeds give unrelated streams)."""
        key = splitmix64(torch.tensor(_signed(int(seed) % (1 << 64)), dtype=torch.int64))
        self.key.fill_(int(key))
        self.counter.zero_()

    def bits(self, *shape: int) -> torch.Tensor:
        """Fresh random int64 bits shaped `shape`; advances the stream by their number."""
        count = _count(shape)
        index = self.counter + torch.arange(count, dtype=torch.int64, device=self.device)
        self.counter += count
        return splitmix64(self.key + index * GOLDEN_GAMMA).reshape(shape)

    def bits32(self, *shape: int) -> torch.Tensor:
        """Fresh random int32 bits shaped `shape`: both halves of each 64-bit draw (half the hashing)."""
        count = _count(shape)
        return self.bits((count + 1) // 2).view(torch.int32)[:count].reshape(shape)

    def rand(self, *shape: int) -> torch.Tensor:
        """Uniform float32 in [0, 1), 24 random bits each."""
        return ((self.bits32(*shape) >> 8) & 0xFFFFFF).float() * (1.0 / (1 << 24))

    def randn(self, *shape: int) -> torch.Tensor:
        """Standard normal float32 (Box-Muller on two uniforms)."""
        u1, u2 = self.rand(2, *shape).unbind(0)
        return torch.sqrt(-2.0 * torch.log1p(-u1)) * torch.cos(2 * math.pi * u2)

    def randint(self, high: int, *shape: int) -> torch.Tensor:
        """Uniform int64 in [0, high)."""
        return (self.rand(*shape) * high).long().clamp_max(high - 1)

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {"key": self.key.clone(), "counter": self.counter.clone()}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.key.copy_(state["key"])
        self.counter.copy_(state["counter"])

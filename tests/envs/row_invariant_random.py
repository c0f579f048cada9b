"""`RowInvariantRandom`: random draws that give every env of a batch the same numbers.

VMAS's batched reset draws `[B, ...]` numbers at once, its per-index `reset_at(i)` draws `[1, ...]`:
with one seed the two give different worlds, so they cannot be compared directly. Under this mode a
draw shaped `[B, *rest]` or `[1, *rest]` takes `rest`-shaped numbers from its own generator and
repeats them along the batch, so a batched reset and a per-index reset started from the same seed
give each env the same random numbers, and the worlds they build can be compared exactly.
A random function the mode does not know raises, so that a comparison never passes by accident.
"""

from __future__ import annotations

import torch
from torch.overrides import TorchFunctionMode

_UNSUPPORTED = {
    torch.randn,
    torch.randperm,
    torch.multinomial,
    torch.normal,
    torch.bernoulli,
    torch.rand_like,
    torch.randn_like,
    torch.randint_like,
    torch.Tensor.normal_,
    torch.Tensor.random_,
    torch.Tensor.exponential_,
    torch.Tensor.bernoulli_,
}


class RowInvariantRandom(TorchFunctionMode):
    def __init__(self, num_envs: int, seed: int) -> None:
        """`num_envs` must not equal the size of any unbatched draw (pick an odd number like 5)."""
        super().__init__()
        self.num_envs = num_envs
        self.generator = torch.Generator().manual_seed(seed)

    def row_shape(self, shape: tuple[int, ...]) -> tuple[tuple[int, ...], bool]:
        """The shape to draw and whether it repeats along a leading batch dim."""
        if len(shape) >= 1 and shape[0] in (1, self.num_envs):
            return (1, *shape[1:]), True
        return shape, False

    def draw(self, shape, sample) -> torch.Tensor:
        row, batched = self.row_shape(tuple(shape))
        values = sample(row)
        return values.expand(tuple(shape)).clone() if batched else values

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func in _UNSUPPORTED:
            raise NotImplementedError(f"RowInvariantRandom does not handle {func}")
        if func is torch.Tensor.uniform_:
            tensor = args[0]
            low = float(args[1] if len(args) > 1 else kwargs.get("from", 0.0))
            high = float(args[2] if len(args) > 2 else kwargs.get("to", 1.0))
            values = self.draw(tensor.shape, lambda s: torch.rand(s, generator=self.generator) * (high - low) + low)
            return tensor.copy_(values)
        if func is torch.rand:
            shape = kwargs.pop("size", None) or (args[0] if isinstance(args[0], (tuple, list, torch.Size)) else args)
            values = self.draw(shape, lambda s: torch.rand(s, generator=self.generator))
        elif func is torch.randint:
            *bounds, shape = (*args, kwargs.pop("size")) if "size" in kwargs else args
            low, high = (0, bounds[0]) if len(bounds) == 1 else bounds
            values = self.draw(shape, lambda s: torch.randint(low, high, s, generator=self.generator))
        else:
            return func(*args, **kwargs)
        return values.to(device=kwargs.get("device"), dtype=kwargs.get("dtype") or values.dtype)

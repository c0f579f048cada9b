"""Shared test data and checks for the kernel tests (imported by them, not a test module)."""

import torch

# Flag densities: how often an episode ends at a step ("none", "2%", "all").
DENSITIES = {"none": 0.0, "2%": 0.02, "all": 1.0}


def rollout(
    num_steps: int,
    batch: tuple[int, ...],
    density: float = 0.02,
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
) -> dict[str, torch.Tensor]:
    """Random time-major rollout `[T, *batch]`; about half of the episode ends are terminations."""
    generator = torch.Generator().manual_seed(seed)
    shape = (num_steps, *batch)
    done = torch.rand(shape, generator=generator) < density
    terminated = done & (torch.rand(shape, generator=generator) < 0.5)
    values = {name: torch.randn(shape, generator=generator).to(dtype) for name in ("reward", "value", "next_value")}
    return {**values, "done": done, "terminated": terminated}


def assert_close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    assert actual.dtype == torch.float32 and actual.shape == expected.shape
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5)

import gymnasium
import numpy as np
import pytest
import torch

from envs.specs import Box, Discrete, GroupSpec, MultiDiscrete


def test_box_sample_in_bounds_and_gymnasium():
    box = Box((3,), low=(-1.0, 0.0, 2.0), high=(1.0, 5.0, 2.5))
    sample = box.sample((100, 4), "cpu", torch.Generator().manual_seed(0))
    low, high = box.bounds("cpu")
    assert sample.shape == (100, 4, 3) and sample.dtype == torch.float32
    assert ((sample >= low) & (sample <= high)).all()
    space = box.to_gymnasium()
    assert isinstance(space, gymnasium.spaces.Box)
    np.testing.assert_allclose(space.low, [-1, 0, 2])
    assert space.contains(sample[0, 0].numpy())


def test_unbounded_box_samples_normal():
    sample = Box((2,)).sample((10000,), "cpu", torch.Generator().manual_seed(0))
    assert abs(sample.std().item() - 1) < 0.05 and not Box((2,)).bounded


def test_box_rejects_bad_bounds():
    with pytest.raises(ValueError, match="must be <="):
        Box((1,), 1.0, 0.0)
    with pytest.raises(ValueError, match="has 2 values, expected 1 or 3"):
        Box((3,), (0.0, 1.0), 2.0)


def test_discrete_sample_respects_mask():
    spec = Discrete(4, masked=True)
    mask = torch.tensor([[True, False, False, True]]).expand(500, 4)
    sample = spec.sample((500,), "cpu", torch.Generator().manual_seed(0), mask=mask)
    assert set(sample.tolist()) == {0, 3}
    assert isinstance(spec.to_gymnasium(), gymnasium.spaces.Discrete) and spec.to_gymnasium().n == 4


def test_multidiscrete_sample_in_range():
    spec = MultiDiscrete((2, 5))
    sample = spec.sample((1000,), "cpu", torch.Generator().manual_seed(0))
    assert sample.shape == (1000, 2)
    assert sample[:, 0].max() == 1 and sample[:, 1].max() == 4 and sample.min() == 0
    assert list(spec.to_gymnasium().nvec) == [2, 5]


def test_group_spec_checks_agents():
    with pytest.raises(ValueError, match="unique"):
        GroupSpec(["a", "a"], Box((1,)), Discrete(2))
    with pytest.raises(ValueError, match="at least one agent"):
        GroupSpec([], Box((1,)), Discrete(2))

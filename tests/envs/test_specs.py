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


@pytest.mark.parametrize("bounds", [(), (0.0, 5.0)], ids=["unbounded", "bounded"])
def test_box_refuses_a_dtype_that_is_not_float(bounds):
    # Unbounded, it failed in torch: "value cannot be converted to type int64 without overflow".
    with pytest.raises(ValueError, match="Box dtype must be a float dtype .*, got torch.int64"):
        Box((2,), *bounds, dtype=torch.int64)
    with pytest.raises(ValueError, match="Box dtype must be a float dtype .*, got 'float32'"):
        Box((2,), *bounds, dtype="float32")


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


def test_group_spec_refuses_a_str_of_agents_and_other_specs():
    # A str is a sequence: it would silently make one agent per character.
    with pytest.raises(TypeError, match="list of agent names, got str 'agent_0'"):
        GroupSpec("agent_0", Box((1,)), Discrete(2))
    with pytest.raises(TypeError, match="agent names must be non-empty strs"):
        GroupSpec([0, 1], Box((1,)), Discrete(2))
    with pytest.raises(TypeError, match="observation must be a Box"):
        GroupSpec(["a"], Discrete(2), Box((1,)))  # observation and action swapped
    with pytest.raises(TypeError, match="action must be a Box, Discrete or MultiDiscrete"):
        GroupSpec(["a"], Box((1,)), gymnasium.spaces.Discrete(2))


def test_specs_refuse_sizes_that_are_not_ints():
    with pytest.raises(TypeError, match=r"Box shape must be a tuple of ints, e.g. Box\(\(4,\)\), got int 4"):
        Box(4)
    with pytest.raises(ValueError, match="must be >= 0, got -1"):
        Box((2, -1))
    with pytest.raises(TypeError, match="Box low must be a number or a flat tuple"):
        Box((2,), low=np.zeros(2), high=1.0)
    with pytest.raises(TypeError, match="Discrete n must be an int, got float 5.5"):
        Discrete(5.5)
    with pytest.raises(TypeError, match="masked must be True or False"):
        Discrete(5, masked="yes")
    with pytest.raises(TypeError, match="MultiDiscrete nvec must be a tuple of ints"):
        MultiDiscrete(3)
    with pytest.raises(TypeError, match="must be an int, got float 2.5"):
        MultiDiscrete((3, 2.5))  # int() would silently make it 2 choices
    # What the adapters pass stays accepted: numpy ints, one-element tensors, lists.
    assert Discrete(np.int64(4)).n == 4 and Discrete(torch.tensor(3)).n == 3
    assert Box([2, np.int64(3)]).shape == (2, 3) and MultiDiscrete(np.array([2, 3])).nvec == (2, 3)

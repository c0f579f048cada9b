import pytest
import torch
from torch import nn

from marl.core.networks import MultiAgentMLP


def per_agent_reference(mlp: MultiAgentMLP, x: torch.Tensor) -> torch.Tensor:
    """Apply agent i's own layers to x[..., i, :] one agent at a time, with plain nn.Linear."""
    outputs = []
    for i in range(mlp.n_agents):
        h = x[..., i, :]
        for layer in mlp.layers:
            if hasattr(layer, "weight"):
                linear = nn.Linear(layer.weight.shape[1], layer.weight.shape[2])
                linear.weight.data = layer.weight[i].T.clone()
                linear.bias.data = layer.bias[i].clone()
                h = linear(h)
            else:
                h = layer(h)
        outputs.append(h)
    return torch.stack(outputs, -2)


@pytest.mark.parametrize("batch", [(), (5,), (4, 3)], ids=["no_batch", "B", "T_B"])
def test_per_agent_parameters_equal_a_loop_of_mlps(batch):
    torch.manual_seed(0)
    mlp = MultiAgentMLP(7, 3, n_agents=4, hidden=(16, 8), share_params=False)
    x = torch.randn(*batch, 4, 7)
    torch.testing.assert_close(mlp(x), per_agent_reference(mlp, x))
    # Agents really have different parameters.
    assert not torch.allclose(mlp.layers[0].weight[0], mlp.layers[0].weight[1])


def test_shared_parameters_apply_one_mlp_to_every_agent():
    torch.manual_seed(0)
    mlp = MultiAgentMLP(5, 2, n_agents=3, hidden=(8,), share_params=True)
    x = torch.randn(6, 3, 5)
    expected = torch.stack([mlp.layers(x[:, i]) for i in range(3)], 1)
    torch.testing.assert_close(mlp(x), expected)
    # Same input for every agent -> same output.
    same = x[:, :1].expand(6, 3, 5)
    out = mlp(same)
    torch.testing.assert_close(out[:, 0], out[:, 2])


def test_gradients_reach_every_agent_with_per_agent_parameters():
    mlp = MultiAgentMLP(3, 1, n_agents=2, hidden=(4,), share_params=False)
    mlp(torch.randn(10, 2, 3)).sum().backward()
    assert (mlp.layers[0].weight.grad.abs().sum((1, 2)) > 0).all()


def test_wrong_input_shape_is_a_clear_error():
    mlp = MultiAgentMLP(3, 1, n_agents=2)
    with pytest.raises(ValueError, match=r"expects inputs \[\*B, 2, 3\], got \(10, 3, 3\)"):
        mlp(torch.randn(10, 3, 3))
    with pytest.raises(ValueError, match="unknown activation"):
        MultiAgentMLP(3, 1, n_agents=2, activation="gelu2")

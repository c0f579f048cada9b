import pytest
import torch
from torch import nn

from marl.core.networks import MultiAgentGRU, MultiAgentMLP


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


@pytest.mark.parametrize("share_params", [True, False])
@pytest.mark.parametrize("hidden", [(8, 8), ()], ids=["hidden", "linear"])
def test_agent_ids_give_each_agent_the_mlp_of_the_shared_input_and_its_one_hot_id(share_params, hidden):
    torch.manual_seed(0)
    k, n, d = 3, 2, 5  # 3 agents with ids; 2 stacked networks (twin critics) when not shared
    stacks = 1 if share_params else n
    mlp = MultiAgentMLP(d + k, 4, stacks, hidden, "tanh", share_params, agent_ids=k)
    x = torch.randn(6, stacks, d)
    out = mlp(x)  # [6, k, stacks, 4]
    assert out.shape == (6, k, stacks, 4)
    for agent in range(k):
        one_hot = torch.nn.functional.one_hot(torch.tensor(agent), k).float().expand(6, stacks, k)
        full = torch.cat([x, one_hot], -1)
        expected = mlp.layers(full) if share_params else per_agent_reference(mlp, full)
        torch.testing.assert_close(out[:, agent], expected)
    with pytest.raises(ValueError, match=rf"expects inputs \[\*B, {stacks}, {d}\], got \(6, {stacks}, {d + k}\)"):
        mlp(torch.randn(6, stacks, d + k))


def test_a_gru_with_agent_ids_equals_the_gru_on_the_full_inputs():
    torch.manual_seed(0)
    n, d, h = 3, 5, 4
    gru = MultiAgentGRU(d + n, h, n, share_params=True, agent_ids=True)
    full_gru = MultiAgentGRU(d + n, h, n, share_params=True)
    full_gru.load_state_dict(gru.state_dict())
    x = torch.randn(6, 2, 1, d)  # [L, B, 1, d]: one shared input per env and step
    full = torch.cat([x.expand(6, 2, n, d), torch.eye(n).expand(6, 2, n, n)], -1)  # each agent's, with its id
    h0, reset = torch.randn(2, n, h), torch.rand(6, 2) < 0.3
    torch.testing.assert_close(gru.scan(x, h0, reset), full_gru.scan(full, h0, reset))
    torch.testing.assert_close(gru(x[0], h0), full_gru(full[0], h0))
    with pytest.raises(ValueError, match=r"expects inputs \[\*B, 1, 5\]"):
        gru(full[0], h0)
    with pytest.raises(ValueError, match="share_params=True"):
        MultiAgentGRU(d + n, h, n, share_params=False, agent_ids=True)


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


# ---- MultiAgentGRU ---------------------------------------------------------------------------------


def random_gru(share_params: bool, n_agents: int = 3, inputs: int = 5, hidden: int = 8) -> MultiAgentGRU:
    torch.manual_seed(0)
    gru = MultiAgentGRU(inputs, hidden, n_agents, share_params)
    with torch.no_grad():  # biases start at 0: give them values, so a mixed-up bias would show
        gru.bias_ih.normal_()
        gru.bias_hh.normal_()
    return gru


def torch_gru(gru: MultiAgentGRU, agent: int) -> nn.GRU:
    """`torch.nn.GRU` holding agent `agent`'s weights of `gru`."""
    k = 0 if gru.share_params else agent
    reference = nn.GRU(gru.in_features, gru.hidden_size)
    with torch.no_grad():
        reference.weight_ih_l0.copy_(gru.weight_ih[k].T)
        reference.weight_hh_l0.copy_(gru.weight_hh[k].T)
        reference.bias_ih_l0.copy_(gru.bias_ih[k])
        reference.bias_hh_l0.copy_(gru.bias_hh[k])
    return reference


@pytest.mark.parametrize("share_params", [True, False], ids=["shared", "per_agent"])
def test_gru_scan_equals_torch_gru_per_agent_restarted_at_resets(share_params):
    gru = random_gru(share_params)
    L, M, n = 9, 4, 3
    x, h0 = torch.randn(L, M, n, 5), torch.randn(M, n, 8)
    reset = torch.zeros(L, M, dtype=torch.bool)
    reset[3, 1] = reset[7, 1] = reset[0, 2] = reset[5, 3] = True  # env 0 never resets
    with torch.no_grad():
        y = gru.scan(x, h0, reset)
        for i in range(n):
            reference = torch_gru(gru, i)
            for m in range(M):
                # torch.nn.GRU over each stretch between resets: from h0, then from zeros.
                starts = [0, *(t for t in range(1, L) if reset[t, m]), L]
                h = torch.zeros(1, 8) if reset[0, m] else h0[m, i][None]
                for a, b in zip(starts[:-1], starts[1:]):
                    out, h = reference(x[a:b, m, i], h)
                    torch.testing.assert_close(y[a:b, m, i], out)
                    h = torch.zeros(1, 8)
        # One step (acting) is the scan's first step, from the state zeroed where env 2 resets.
        torch.testing.assert_close(gru(x[0], h0.masked_fill(reset[0, :, None, None], 0.0)), y[0])
    assert not torch.allclose(y[3, 1], y[3, 0])


@pytest.mark.parametrize("share_params", [True, False], ids=["shared", "per_agent"])
def test_gru_scan_gradients_equal_autograd_through_torch_gru_cells(share_params):
    gru = random_gru(share_params)
    L, M, n = 6, 2, 3
    x = torch.randn(L, M, n, 5, requires_grad=True)
    h0 = torch.randn(M, n, 8, requires_grad=True)
    reset = torch.zeros(L, M, dtype=torch.bool)
    reset[2, 0] = reset[4, 1] = True
    weights = torch.randn(L, M, n, 8)
    (gru.scan(x, h0, reset) * weights).sum().backward()
    ours = [x.grad, h0.grad, *(p.grad for p in gru.parameters())]

    # Reference: torch.gru_cell per step and agent, autograd through it, from the same parameters.
    for t in (x, h0, *gru.parameters()):
        t.grad = None
    states = []
    h = h0
    for step in range(L):
        h = h * (~reset[step]).float()[:, None, None]
        k = [0 if share_params else i for i in range(n)]
        h = torch.stack(
            [
                torch.gru_cell(
                    x[step, :, i],
                    h[:, i],
                    gru.weight_ih[k[i]].T,
                    gru.weight_hh[k[i]].T,
                    gru.bias_ih[k[i]],
                    gru.bias_hh[k[i]],
                )
                for i in range(n)
            ],
            1,
        )
        states.append(h)
    (torch.stack(states) * weights).sum().backward()
    reference = [x.grad, h0.grad, *(p.grad for p in gru.parameters())]
    for a, b in zip(ours, reference):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_gru_shapes_are_checked():
    gru = MultiAgentGRU(3, 4, n_agents=2)
    with pytest.raises(ValueError, match=r"expects inputs \[\*B, 2, 3\] and a hidden state \[5, 2, 4\]"):
        gru(torch.randn(5, 2, 3), torch.randn(5, 2, 3))
    with pytest.raises(ValueError, match=r"expects inputs \[L, \*M, 2, 3\]"):
        gru.scan(torch.randn(7, 5, 3, 3), torch.randn(5, 3, 4), torch.zeros(7, 5, dtype=torch.bool))


@pytest.mark.parametrize("share_params", [True, False], ids=["shared", "per-agent"])
@pytest.mark.parametrize(
    "reset",
    [
        torch.zeros(7, dtype=torch.bool),
        torch.zeros(7, 1, dtype=torch.bool),
        torch.zeros(5, 7, dtype=torch.bool),
        torch.zeros(7, 5, 2, dtype=torch.bool),
        torch.zeros(7, 5),
    ],
    ids=["[L]", "[L, 1]", "[M, L]", "[L, M, n]", "float"],
)
def test_gru_scan_refuses_a_reset_of_another_shape_or_dtype(share_params, reset):
    """A reset [L] or [M, L] scanned per-agent parameters with no error, each flag reshaped onto another step
    and env; shared ones failed inside torch ("The size of tensor a ... must match the size of tensor b ...")."""
    gru = MultiAgentGRU(3, 4, n_agents=2, share_params=share_params)
    says = r"MultiAgentGRU.scan expects reset \[L, \*M\] = \[7, 5\] bool .*, got torch\.\w+ \(" + ", ".join(
        map(str, reset.shape)
    )
    with pytest.raises(ValueError, match=says):
        gru.scan(torch.randn(7, 5, 2, 3), torch.zeros(5, 2, 4), reset)

"""marl.optim.FusedAdam steps exactly like torch's fused Adam, also across a state-dict round trip."""

import copy

import torch

from marl.optim import FusedAdam


def nets():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))


def test_fused_adam_equals_torch_adam():
    ours, theirs = nets(), nets()
    mine = FusedAdam(ours.parameters(), lr=1e-2, eps=1e-6)
    reference = torch.optim.Adam(theirs.parameters(), lr=1e-2, eps=1e-6, fused=True)
    generator = torch.Generator().manual_seed(1)
    for step in range(12):
        x = torch.randn(16, 5, generator=generator)
        for net, optimizer in ((ours, mine), (theirs, reference)):
            for group in optimizer.param_groups:
                group["lr"] = 1e-2 * (1 - step / 12)  # a schedule, as the trainer anneals
            optimizer.zero_grad(set_to_none=True)
            net(x).square().mean().backward()
            if step == 5:
                net[2].bias.grad = None  # a parameter without a gradient this step: skipped by both
            optimizer.step()
        if step == 7:  # checkpoint round trip: Adam's own state dict
            state = copy.deepcopy(mine.state_dict())
            mine = FusedAdam(ours.parameters(), lr=1e-2, eps=1e-6)
            mine.load_state_dict(state)
        for a, b in zip(ours.parameters(), theirs.parameters()):
            torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert mine.state_dict()["state"][0]["step"].item() == 12

import pytest
import torch
from torch import distributions as D

from envs.specs import Box, Discrete, GroupSpec, MultiDiscrete
from marl.core.distributions import MaskedCategorical, MultiCategorical, TanhNormal, draw_noise
from marl.core.models import Policy


def test_tanh_normal_log_prob_matches_torch_on_env_actions():
    torch.manual_seed(0)
    mean, log_std = torch.randn(64, 3, 2), torch.randn(1, 2) * 0.3
    low, high = torch.tensor([-1.0, 0.0]), torch.tensor([1.0, 4.0])
    dist = TanhNormal(mean, log_std, low, high)
    raw = dist.sample(torch.randn(64, 3, 2, generator=torch.Generator().manual_seed(1)))
    env_action = dist.env_action(raw)
    assert ((env_action >= low) & (env_action <= high)).all()
    reference = D.TransformedDistribution(
        D.Normal(mean, log_std.exp().expand_as(mean)),
        [D.TanhTransform(), D.AffineTransform((low + high) / 2, (high - low) / 2)],
    )
    torch.testing.assert_close(dist.log_prob(raw), reference.log_prob(env_action).sum(-1), atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(dist.entropy(), D.Normal(mean, log_std.exp().expand_as(mean)).entropy().sum(-1))


def test_tanh_normal_log_prob_stays_finite_when_saturated():
    dist = TanhNormal(torch.zeros(2, 1, 1), torch.zeros(1, 1), torch.tensor([-1.0]), torch.tensor([1.0]))
    raw = torch.tensor([[[30.0]], [[-30.0]]])
    assert torch.isfinite(dist.log_prob(raw)).all()


def test_masked_categorical_matches_torch_and_never_samples_masked():
    torch.manual_seed(0)
    logits = torch.randn(500, 2, 4)
    mask = torch.rand(500, 2, 4) > 0.4
    mask[..., 0] = True
    dist = MaskedCategorical(logits, mask)
    reference = D.Categorical(logits=logits.masked_fill(~mask, -1e9))
    action = dist.sample(torch.rand(500, 2, 4, generator=torch.Generator().manual_seed(0)))
    assert mask.gather(-1, action.unsqueeze(-1)).all()
    torch.testing.assert_close(dist.log_prob(action), reference.log_prob(action))
    torch.testing.assert_close(dist.entropy(), reference.entropy(), atol=1e-5, rtol=1e-5)
    assert torch.equal(dist.mode(), logits.masked_fill(~mask, -1e9).argmax(-1))


def test_categorical_sampling_follows_the_probabilities():
    logits = torch.log(torch.tensor([0.1, 0.6, 0.3])).expand(20000, 1, 3)
    action = MaskedCategorical(logits).sample(torch.rand(20000, 1, 3, generator=torch.Generator().manual_seed(0)))
    frequencies = torch.bincount(action.flatten(), minlength=3).float() / 20000
    torch.testing.assert_close(frequencies, torch.tensor([0.1, 0.6, 0.3]), atol=0.015, rtol=0)


def test_multi_categorical_sums_parts():
    logits = torch.randn(8, 2, 5)
    dist = MultiCategorical(logits, (2, 3))
    action = dist.sample(torch.rand(8, 2, 5, generator=torch.Generator().manual_seed(0)))
    assert action.shape == (8, 2, 2) and action[..., 0].max() <= 1 and action[..., 1].max() <= 2
    expected = D.Categorical(logits=logits[..., :2]).log_prob(action[..., 0]) + D.Categorical(
        logits=logits[..., 2:]
    ).log_prob(action[..., 1])
    torch.testing.assert_close(dist.log_prob(action), expected)


@pytest.mark.parametrize(
    "action, raw_shape",
    [(Box((2,), -1.0, 1.0), (4, 3, 2)), (Discrete(5, masked=True), (4, 3)), (MultiDiscrete((2, 3)), (4, 3, 2))],
    ids=["box", "discrete", "multidiscrete"],
)
@pytest.mark.parametrize("share_params", [True, False])
def test_policy_heads_for_every_spec(action, raw_shape, share_params):
    spec = GroupSpec(["a_0", "a_1", "a_2"], Box((6,)), action)
    policy = Policy(spec, hidden=(8,), activation="tanh", share_params=share_params)
    mask = torch.ones(4, 3, 5, dtype=torch.bool) if isinstance(action, Discrete) else None
    dist = policy(torch.randn(4, 3, 6), mask)
    raw = dist.sample(draw_noise(action, (4, 3), torch.Generator().manual_seed(0), "cpu"))
    assert raw.shape == raw_shape
    assert dist.log_prob(raw).shape == (4, 3) and dist.entropy().shape == (4, 3)


def test_unbounded_continuous_actions_are_refused():
    spec = GroupSpec(["a_0"], Box((3,)), Box((2,)))
    with pytest.raises(ValueError, match="continuous actions must be bounded"):
        Policy(spec, hidden=(8,), activation="tanh", share_params=True)


@pytest.mark.parametrize("share_params", [True, False])
def test_state_dependent_std_starts_at_log_std_init_and_follows_the_network(share_params):
    """std='state': the net's second half of outputs, through softplus(x + bias) + 0.01, is the std;
    log-probs are a Normal's with that std per sample, squashed; gradients reach the std outputs."""
    torch.manual_seed(0)
    spec = GroupSpec(["a_0", "a_1", "a_2"], Box((6,)), Box((2,), -2.0, 2.0))
    policy = Policy(spec, hidden=(8,), activation="tanh", share_params=share_params, log_std_init=-0.5, std="state")
    assert not hasattr(policy, "log_std") and policy.net.out_features == 4
    with torch.no_grad():
        policy.net.layers[-1].weight.zero_()  # outputs = biases = 0: the std is the initial one
    dist = policy(torch.randn(5, 3, 6))
    torch.testing.assert_close(dist.log_std, torch.full((5, 3, 2), -0.5))
    with torch.no_grad():
        policy.net.layers[-1].bias.normal_()
    obs = torch.randn(5, 3, 6)
    dist = policy(obs)
    out = policy.net(obs)
    std = torch.nn.functional.softplus(out[..., 2:] + policy.std_bias) + 0.01
    torch.testing.assert_close(dist.log_std.exp(), std)
    raw = dist.sample(torch.randn(5, 3, 2))
    reference = D.TransformedDistribution(
        D.Normal(out[..., :2], std), [D.TanhTransform(), D.AffineTransform(0.0, 2.0)]
    ).log_prob(dist.env_action(raw).clamp(-2 + 1e-6, 2 - 1e-6))
    torch.testing.assert_close(dist.log_prob(raw), reference.sum(-1), atol=1e-4, rtol=1e-4)
    dist.entropy().sum().backward()
    last = policy.net.layers[-1]
    weight_grad = last.weight.grad if share_params else last.weight.grad.transpose(-1, -2)
    assert weight_grad[..., 2:, :].abs().sum() > 0  # the entropy depends on the std outputs only
    assert weight_grad[..., :2, :].abs().sum() == 0


def test_state_dependent_std_rejects_what_it_cannot_start_at():
    spec = GroupSpec(["a_0"], Box((3,)), Box((2,), -1.0, 1.0))
    with pytest.raises(ValueError, match="log_std_init must give a std above 0.01"):
        Policy(spec, hidden=(8,), activation="tanh", share_params=True, log_std_init=-5.0, std="state")
    with pytest.raises(ValueError, match="unknown std source 'net'"):
        Policy(spec, hidden=(8,), activation="tanh", share_params=True, std="net")

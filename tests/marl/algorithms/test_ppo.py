import math

import pytest
import torch

from marl.algorithms.ppo import explained_variance, ppo_loss
from marl.app.trainer import Trainer
from marl.core.rollout import observations
from tests.marl.app.test_training import small_config


def reference_ppo(
    log_prob, old_log_prob, advantage, value, old_value, target, entropy, clip, clip_value, ent, vc, norm
):
    """PPO written out element by element in plain Python."""
    lp, olp, adv = log_prob.flatten().tolist(), old_log_prob.flatten().tolist(), advantage.flatten().tolist()
    v, ov, tg, en = (
        value.flatten().tolist(),
        old_value.flatten().tolist(),
        target.flatten().tolist(),
        entropy.flatten().tolist(),
    )
    n = len(lp)
    if norm:
        mean = sum(adv) / n
        std = math.sqrt(sum((a - mean) ** 2 for a in adv) / (n - 1))
        adv = [(a - mean) / (std + 1e-8) for a in adv]
    surrogate, value_terms, kl, clipped = 0.0, 0.0, 0.0, 0
    for i in range(n):
        r = math.exp(lp[i] - olp[i])
        surrogate += min(r * adv[i], max(min(r, 1 + clip), 1 - clip) * adv[i])
        err = (v[i] - tg[i]) ** 2
        if clip_value:
            vc_i = ov[i] + max(min(v[i] - ov[i], clip), -clip)
            err = max(err, (vc_i - tg[i]) ** 2)
        value_terms += err
        kl += (r - 1) - (lp[i] - olp[i])
        clipped += abs(r - 1) > clip
    policy_loss, value_loss = -surrogate / n, 0.5 * value_terms / n
    entropy_loss = -ent * sum(en) / n
    return {
        "loss": policy_loss + vc * value_loss + entropy_loss,
        "policy_loss": policy_loss,
        "value_loss": value_loss,
        "entropy_loss": entropy_loss,
        "approx_kl": kl / n,
        "clip_fraction": clipped / n,
        "entropy": sum(en) / n,
    }


@pytest.mark.parametrize("clip_value", [True, False])
@pytest.mark.parametrize("normalize", [True, False])
def test_ppo_loss_equals_hand_written_reference(clip_value, normalize):
    g = torch.Generator().manual_seed(0)
    shape = (6, 3)
    old_log_prob = torch.randn(shape, generator=g)
    log_prob = old_log_prob + 0.4 * torch.randn(shape, generator=g)  # some ratios beyond the clip
    tensors = [log_prob, old_log_prob] + [torch.randn(shape, generator=g) for _ in range(5)]
    kwargs = dict(clip_eps=0.2, clip_value=clip_value, entropy_coef=0.01, value_coef=0.5, normalize_advantage=normalize)
    terms = ppo_loss(*tensors, **kwargs)
    expected = reference_ppo(*tensors, 0.2, clip_value, 0.01, 0.5, normalize)
    for name, value in expected.items():
        assert terms[name].item() == pytest.approx(value, rel=1e-5, abs=1e-6), name
    assert 0 < terms["clip_fraction"].item() < 1


def test_gradient_flows_only_through_new_log_prob_and_value():
    log_prob = torch.zeros(4, 2, requires_grad=True)
    value = torch.zeros(4, 2, requires_grad=True)
    advantage = torch.tensor([[1.0, -1.0]] * 4)
    terms = ppo_loss(
        log_prob,
        torch.zeros(4, 2),
        advantage,
        value,
        torch.zeros(4, 2),
        torch.ones(4, 2),
        torch.zeros(4, 2),
        clip_eps=0.2,
        clip_value=False,
        entropy_coef=0.0,
        value_coef=1.0,
        normalize_advantage=False,
    )
    terms["loss"].backward()
    # d(-mean(r * A))/d log_prob = -A / N at r = 1; d(0.5 mean((V - 1)^2))/dV = (V - 1) / N.
    torch.testing.assert_close(log_prob.grad, -advantage / 8)
    torch.testing.assert_close(value.grad, torch.full((4, 2), -1 / 8))


def test_explained_variance():
    target = torch.tensor([1.0, 2.0, 3.0, 4.0])
    assert explained_variance(target, target).item() == pytest.approx(1.0)
    assert explained_variance(torch.full((4,), 2.5), target).item() == pytest.approx(0.0)


def test_a_minibatch_of_one_advantage_is_left_unnormalised():
    # One frame of a one-agent group: its std is NaN, which made every loss NaN.
    tensors = [torch.tensor([[v]]) for v in (-0.5, -0.7, 2.0, 0.1, 0.3, 1.0, 0.8)]
    kwargs = dict(clip_eps=0.2, clip_value=True, entropy_coef=0.01, value_coef=0.5)
    terms = ppo_loss(*tensors, **kwargs, normalize_advantage=True)
    expected = reference_ppo(*tensors, 0.2, True, 0.01, 0.5, False)
    for name, value in expected.items():
        assert terms[name].item() == pytest.approx(value, rel=1e-5, abs=1e-6), name


def test_the_value_clip_is_centred_on_the_critics_prediction_when_it_collected(tmp_path):
    # PPO's value clip is a trust region around the prediction the critic made for the rollout: before any
    # step the critic's output is that centre. The value targets' running moments are updated before the
    # epochs; the centre re-expressed in the new moments lay away from the critic's output (on the first
    # iteration by about the targets' mean over their std), so the clipped branch, saturated, won the max
    # and the critic had no gradient from those frames (12% of them in the defaults' first iteration, most
    # where the returns sit far from 0).
    trainer = Trainer(small_config(tmp_path, device="cpu"))
    algorithm = trainer.algorithm
    batch = trainer.collector.collect()
    algorithm.advantages(batch)  # the first iteration: the moments move from (0, 1) to the targets'
    flat, _ = algorithm.update_inputs(batch)
    learner = algorithm.learners["agent"]
    obs, state = observations(batch, list(trainer.env.groups))
    with torch.no_grad():
        prediction = learner.critic(learner.critic_input(obs, state)).flatten(0, 1)  # normalised units
    torch.testing.assert_close(flat["agent"]["old_value"], prediction, rtol=1e-5, atol=1e-5)

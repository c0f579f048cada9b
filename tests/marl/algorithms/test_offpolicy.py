"""MADDPG/IDDPG and MASAC/ISAC: each loss term against a written-out reference, the targets, the target
networks, entropy tuning, the networks they are built from, and their runs (heterogeneous groups,
compiled, resumed, without host syncs)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import envs
from envs.native.navigation import scripted_action
from kernels.sum_tree import sum_tree_find_reference, sum_tree_update_reference
from marl import algorithms
from marl.algorithms.ddpg import DDPGConfig, ddpg_terms
from marl.algorithms.offpolicy import critic_loss, td_targets
from marl.algorithms.sac import SACConfig, continuous_terms, discrete_terms
from marl.app.trainer import Trainer
from marl.config import EnvSettings, ModelConfig, RunConfig, TrainConfig
from marl.core.distributions import MaskedCategorical, NoisyDeterministic, RandomWhile, TanhNormal
from marl.core.models import CriticInput, QCritic
from tests.marl.algorithms.offpolicy_checks import assert_repeats, resume_midway, update_without_host_sync


def small_config(
    tmp_path, algo: str, env: str = "navigation", compile: bool = False, group_map: str = "by_type", **options
) -> TrainConfig:
    """A small off-policy run of any registered off-policy `algo` (the value-based tests use it too)."""
    options = {"batch_size": 32, "updates_per_iteration": 3, "buffer_size": 1000, **options}
    return TrainConfig(
        env=EnvSettings(env=env, num_envs=8, group_map=group_map),
        algo=algorithms.config_class(algo)(algo=algo, **options),
        model=ModelConfig(hidden=(16,)),
        run=RunConfig(
            total_frames=10**5,
            rollout_length=8,
            device="cpu",
            progress=False,
            tensorboard=False,
            compile=compile,
            log_dir=str(tmp_path),
            save_buffer=True,
        ),
    )


# ---- the terms, by hand -------------------------------------------------------------------------------


def test_td_targets_bootstrap_on_truncation_but_not_on_termination():
    reward = torch.tensor([[1.0, 2.0], [0.5, -1.0]])
    terminated = torch.tensor([[True, False], [False, False]])  # step 1 was truncated: it bootstraps
    next_value = torch.tensor([[10.0, 20.0], [30.0, 40.0]])
    expected = torch.tensor([[1.0, 2.0 + 0.9 * 20.0], [0.5 + 0.9 * 30.0, -1.0 + 0.9 * 40.0]])
    assert torch.allclose(td_targets(reward, terminated, next_value, 0.9), expected)


def test_critic_loss_is_the_weighted_mean_square_summed_over_twins():
    q, target, weight = torch.randn(5, 2, 3), torch.randn(5, 3), torch.rand(5)
    expected = 0.0
    for twin in range(2):
        expected += sum(weight[i] * (q[i, twin, j] - target[i, j]) ** 2 for i in range(5) for j in range(3)) / 15
    assert torch.allclose(critic_loss(q, target, weight), expected)
    assert torch.allclose(critic_loss(q, target, None), critic_loss(q, target, torch.ones(5)))


def test_ddpg_terms_by_hand():
    q = torch.tensor([[[1.0, 2.0]], [[3.0, 0.0]]])  # [k=2, 1, n=2]
    target = torch.tensor([[0.0, 2.0], [1.0, 1.0]])
    q_policy = torch.tensor([[4.0, 2.0], [0.0, -2.0]])
    terms = ddpg_terms(q, target, q_policy, torch.tensor([1.0, 0.5]))
    critic = (1 * 1.0 + 1 * 0.0 + 0.5 * 4.0 + 0.5 * 1.0) / 4
    assert terms["critic_loss"].item() == pytest.approx(critic)
    assert terms["policy_loss"].item() == pytest.approx(-1.0)
    assert terms["loss"].item() == pytest.approx(critic - 1.0)
    assert terms["td_error"].item() == pytest.approx((1 + 0 + 2 + 1) / 4)


def test_continuous_sac_terms_by_hand():
    k, n = 4, 2
    q, target, q_policy = torch.randn(k, 2, n), torch.randn(k, n), torch.randn(k, 2, n)
    log_prob, log_alpha, target_entropy = torch.randn(k, n), torch.tensor(-0.7, requires_grad=True), -2.0
    terms = continuous_terms(q, target, q_policy, log_prob, log_alpha, target_entropy, None)
    alpha = math.exp(-0.7)
    policy = sum(alpha * log_prob[i, j] - min(q_policy[i, 0, j], q_policy[i, 1, j]) for i in range(k) for j in range(n))
    assert terms["policy_loss"].item() == pytest.approx(policy.item() / (k * n), rel=1e-5)
    alpha_loss = sum(0.7 * (log_prob[i, j] + target_entropy) for i in range(k) for j in range(n)) / (k * n)
    assert terms["alpha_loss"].item() == pytest.approx(alpha_loss.item(), rel=1e-5)
    assert terms["alpha"].item() == pytest.approx(alpha)
    assert terms["entropy"].item() == pytest.approx(-log_prob.mean().item(), rel=1e-5)
    # alpha's gradient flows through its own loss only; the policy's loss uses a fixed alpha.
    (grad,) = torch.autograd.grad(terms["loss"], log_alpha)
    assert grad.item() == pytest.approx(-(log_prob + target_entropy).mean().item(), rel=1e-5)


def test_discrete_sac_terms_by_hand_with_a_masked_action():
    k, n, actions = 3, 2, 3
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(k, n, actions, generator=generator).requires_grad_()
    mask = torch.ones(k, n, actions, dtype=torch.bool)
    mask[0, 1, 2] = mask[2, 0, 0] = False
    log_probs = MaskedCategorical(logits, mask).log_probs
    q, target = torch.randn(k, 2, n, generator=generator), torch.randn(k, n, generator=generator)
    q_policy = torch.randn(k, 2, n, actions, generator=generator)
    log_alpha = torch.tensor(0.3, requires_grad=True)
    terms = discrete_terms(q, target, q_policy, log_probs, mask, log_alpha, 0.5, torch.ones(k))
    alpha = math.exp(0.3)
    policy, entropy = 0.0, 0.0
    for i in range(k):
        for j in range(n):
            allowed = [a for a in range(actions) if mask[i, j, a]]
            p = torch.softmax(logits[i, j, allowed], 0)
            lp = p.log()
            q_min = torch.minimum(q_policy[i, 0, j, allowed], q_policy[i, 1, j, allowed])
            policy += (p * (alpha * lp - q_min)).sum()
            entropy += -(p * lp).sum()
    # Sums of terms of both signs: near a cancellation a relative tolerance alone is float32's noise.
    assert terms["policy_loss"].item() == pytest.approx(policy.item() / (k * n), rel=1e-5, abs=1e-6)
    assert terms["entropy"].item() == pytest.approx(entropy.item() / (k * n), rel=1e-5, abs=1e-6)
    alpha_loss = -0.3 * (0.5 - entropy.item() / (k * n))
    assert terms["alpha_loss"].item() == pytest.approx(alpha_loss, rel=1e-5, abs=1e-6)
    # Masked actions have probability 0, and neither they nor an alpha above 1 make a gradient NaN.
    terms["loss"].backward()
    assert torch.isfinite(logits.grad).all() and torch.isfinite(log_alpha.grad)


def test_the_temperature_moves_towards_the_target_entropy():
    """Entropy above the target: alpha's gradient step lowers it; below: raises it."""
    log_prob = torch.full((8, 2), -1.0)  # entropy estimate 1
    for target_entropy, direction in ((-3.0, -1), (3.0, +1)):
        log_alpha = torch.tensor(0.0, requires_grad=True)
        q = torch.zeros(8, 2, 2)
        terms = continuous_terms(q, q[:, 0], q, log_prob, log_alpha, target_entropy, None)
        (grad,) = torch.autograd.grad(terms["alpha_loss"], log_alpha)
        assert math.copysign(1, -grad.item()) == direction


@pytest.mark.parametrize("env", ["navigation", "speaker_listener"])  # continuous; one discrete group too
def test_without_learn_alpha_the_temperature_stays_at_alpha_init(tmp_path, env):
    trainer = Trainer(small_config(tmp_path, "masac", env, learn_alpha=False, alpha_init=0.05), run_dir=tmp_path / "r")
    rows = [trainer.train_iteration() for _ in range(2)]
    for g, learner in trainer.algorithm.learners.items():
        assert learner.temperature.log_alpha.item() == torch.tensor(math.log(0.05)).item(), g  # as it started
        assert rows[-1][f"{g}/alpha"] == pytest.approx(0.05), g
        assert math.isfinite(rows[-1][f"{g}/critic_loss"]), g


def test_tanh_normal_log_prob_is_the_numerical_change_of_variables():
    """log p(a) of the squashed action equals log N(u) - log |da/du| with da/du by finite differences,
    and the density integrates to 1 over the action's bounds."""
    torch.manual_seed(0)
    low, high = torch.tensor([-2.0, 0.0], dtype=torch.float64), torch.tensor([1.0, 4.0], dtype=torch.float64)
    mean, log_std = torch.randn(64, 1, 2, dtype=torch.float64), torch.randn(64, 1, 2, dtype=torch.float64) * 0.5
    dist = TanhNormal(mean, log_std, low, high)
    u = (mean + log_std.exp() * torch.randn_like(mean) * 2).clamp(-5, 5)  # finite differences need da/du >> 1e-10
    h = 1e-6
    slope = (dist.env_action(u + h) - dist.env_action(u - h)) / (2 * h)  # diagonal Jacobian
    normal = torch.distributions.Normal(mean, log_std.exp()).log_prob(u)
    assert torch.allclose(dist.log_prob(u), (normal - slope.log()).sum(-1), rtol=1e-6, atol=1e-5)
    # In one dimension: integrate the density of a over (low, high) on a fine grid of u.
    one = TanhNormal(torch.tensor([[0.3]]), torch.tensor([[-0.2]]), torch.tensor([-1.0]), torch.tensor([3.0]))
    grid = torch.linspace(-12, 12, 200_001).view(-1, 1, 1)
    density = one.log_prob(grid).exp()  # p(a(u)), integrated over a = a(u): times da/du
    da = torch.diff(one.env_action(grid).flatten())
    assert torch.sum(density.flatten()[1:] * da).item() == pytest.approx(1.0, abs=1e-3)


def test_noisy_deterministic_explores_within_the_bounds():
    low, high = torch.tensor([-1.0, 0.0]), torch.tensor([1.0, 10.0])
    action = torch.tensor([[[0.9, 5.0]]])
    dist = NoisyDeterministic(action, torch.tensor(0.5), low, high)
    noise = torch.tensor([[[1.0, -1.0]]])
    assert torch.allclose(dist.sample(noise), torch.tensor([[[1.0, 5.0 - 0.5 * 5.0]]]))  # clipped; half range 5
    assert torch.equal(dist.mode(), action) and torch.equal(dist.env_action(action), action)


def test_random_actions_while_warming_up_are_uniform_in_the_bounds_and_the_allowed_actions():
    generator = torch.Generator().manual_seed(0)
    tanh = TanhNormal(
        torch.full((20000, 1, 1), 3.0), torch.full((20000, 1, 1), -3.0), torch.tensor([0.0]), torch.tensor([2.0])
    )
    on, off = torch.tensor(True), torch.tensor(False)
    noise = torch.randn(20000, 1, 1, generator=generator)
    uniform = tanh.env_action(RandomWhile(tanh, on).sample(noise)).flatten()
    assert uniform.min() >= 0 and uniform.max() <= 2
    assert uniform.mean().item() == pytest.approx(1.0, abs=0.03) and uniform.var().item() == pytest.approx(
        1 / 3, abs=0.02
    )
    assert torch.equal(RandomWhile(tanh, off).sample(noise), tanh.sample(noise))
    mask = torch.tensor([True, False, True, True]).expand(20000, 1, 4)
    categorical = MaskedCategorical(torch.tensor([9.0, 0.0, 0.0, 0.0]).expand(20000, 1, 4), mask)
    drawn = RandomWhile(categorical, on).sample(torch.rand(20000, 1, 4, generator=generator)).flatten()
    counts = torch.bincount(drawn, minlength=4) / 20000
    assert counts[1] == 0 and torch.allclose(counts[[0, 2, 3]], torch.full((3,), 1 / 3), atol=0.02)


# ---- networks -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("share_params", [True, False])
def test_twin_critics_are_independent_networks_run_as_one(share_params):
    torch.manual_seed(0)
    n, d = 3, 5
    critic = QCritic(d, 4, n, (8,), "relu", share_params, twins=2)
    x = torch.randn(6, n, d)
    out = critic(x)  # [6, 2, n, 4]
    layers = [m for m in critic.net.layers if hasattr(m, "weight")]
    for twin in range(2):
        for agent in range(n):
            net = twin if share_params else twin * n + agent
            h = torch.relu(x[:, agent] @ layers[0].weight[net] + layers[0].bias[net])
            assert torch.allclose(out[:, twin, agent], h @ layers[1].weight[net] + layers[1].bias[net], atol=1e-6)
    shared = QCritic(d, 1, n, (8,), "relu", share_params, twins=2, shared_value=True)
    values = shared(torch.randn(6, 1, d))
    assert values.shape == (6, 2, n, 1) and torch.equal(values[:, :, 0], values[:, :, 2])


def with_agent_ids(x: torch.Tensor, n: int) -> torch.Tensor:
    """A shared input `[*B, 1, d]` as the n agents' full inputs `[*B, n, d + n]`: each followed by its one-hot id."""
    batch = x.shape[:-2]
    return torch.cat([x.expand(*batch, n, x.shape[-1]), torch.eye(n).expand(*batch, n, n)], -1)


def test_a_critic_with_agent_ids_equals_the_same_network_on_the_full_inputs():
    # An input shared by the agents comes once; the network gives agent i the value of the shared input
    # followed by i's one-hot id, and the gradients of its parameters are the full inputs' too.
    torch.manual_seed(0)
    n, d = 3, 5
    critic = QCritic(d + n, 4, n, (8, 8), "tanh", True, twins=2, agent_ids=n)
    reference = QCritic(d + n, 4, n, (8, 8), "tanh", True, twins=2)
    reference.load_state_dict(critic.state_dict())
    x = torch.randn(6, 1, d, requires_grad=True)
    full = x.detach().requires_grad_()
    out, expected = critic(x), reference(with_agent_ids(full, n))
    assert out.shape == (6, 2, n, 4) and not torch.equal(out[:, :, 0], out[:, :, 1])
    torch.testing.assert_close(out, expected)
    out.square().sum().backward()
    expected.square().sum().backward()
    for ours, theirs in zip(critic.parameters(), reference.parameters()):
        torch.testing.assert_close(ours.grad, theirs.grad)
    torch.testing.assert_close(x.grad, full.grad)
    with pytest.raises(ValueError, match=r"expects inputs \[\*B, 1, d\]"):
        critic(torch.randn(6, n, d))


def test_a_global_critic_input_holds_every_groups_observations_and_actions():
    env = envs.make("tag", num_envs=2, seed=0)  # predator 3 x 16, prey 1 x 14; actions 2 each
    groups = env.groups
    seen = CriticInput("global", "predator", groups, None, agent_id=True, action_sizes={"predator": 2, "prey": 2})
    obs = {"predator": torch.randn(4, 3, 16), "prey": torch.randn(4, 1, 14)}
    actions = {"predator": torch.randn(4, 3, 2), "prey": torch.randn(4, 1, 2)}
    x = seen(obs, None, actions)
    shared = torch.cat(
        [
            torch.cat([obs["predator"], actions["predator"]], -1).flatten(1),
            torch.cat([obs["prey"], actions["prey"]], -1).flatten(1),
        ],
        -1,
    )
    assert seen.size == 3 * 18 + 16 + 3 and seen.agent_ids == 3 and x.shape == (4, 1, 70)
    assert torch.equal(x[:, 0], shared)
    for agent in range(3):
        assert torch.equal(with_agent_ids(x, 3)[:, agent, 70:], F.one_hot(torch.tensor(agent), 3).float().expand(4, 3))
    own = CriticInput("agent", "prey", groups, None, agent_id=True, action_sizes={"predator": 2, "prey": 2})
    assert torch.equal(own(obs, None, actions), torch.cat([obs["prey"], actions["prey"]], -1))


# ---- the whole loss against a reference ----------------------------------------------------------------


def test_maddpg_loss_equals_a_written_out_reference(tmp_path):
    trainer = Trainer(small_config(tmp_path, "maddpg"), run_dir=tmp_path / "run")
    trainer.buffer.extend(trainer.collector.collect())
    algorithm, learner = trainer.algorithm, trainer.algorithm.learners["agent"]
    index = torch.tensor([0, 5, 17, 63])
    total, terms, priority = algorithm.loss(trainer.buffer.storage, index, None, {}, torch.tensor([0]))
    b = trainer.buffer.gather(index)["agent"]
    gamma, k = learner.algo.gamma, 4

    def q_of(critic, obs, actions):  # written out: every agent's observation and action, then its id
        rows = []
        for agent in range(3):
            x = torch.cat(
                [torch.cat([obs, actions], -1).flatten(1), F.one_hot(torch.tensor(agent), 3).float().expand(k, 3)], -1
            )
            rows.append(critic.net.layers(x.unsqueeze(0))[0, :, 0])  # the layers on the full rows [1, k, d]
        return torch.stack(rows, 1)  # [k, n]

    def act(policy, obs):  # the policy's action in the bounds [-1, 1]
        return torch.tanh(policy.net(obs))

    with torch.no_grad():
        next_q = q_of(learner.target_critic, b["next_observation"], act(learner.target_policy, b["next_observation"]))
        target = b["reward"] + gamma * (~b["terminated"]).float() * next_q
        q = q_of(learner.critic, b["observation"], b["action"])
        q_policy = q_of(learner.critic, b["observation"], act(learner.policy, b["observation"]))
    assert terms["agent"][1].item() == pytest.approx(((q - target) ** 2).mean().item(), rel=1e-5)
    assert terms["agent"][2].item() == pytest.approx(-q_policy.mean().item(), rel=1e-5)
    assert torch.allclose(priority["agent"], (q - target).abs(), atol=1e-6)
    # The actor's loss moves the policy only; the critic's moves the critic only.
    policy_grads = torch.autograd.grad(terms_loss := total, [*learner.policy.parameters()], retain_graph=True)
    assert all(torch.isfinite(g).all() for g in policy_grads)
    critic_grad = torch.autograd.grad(terms_loss, [*learner.critic.parameters()], retain_graph=True)
    reference = torch.autograd.grad(
        ((q_of(learner.critic, b["observation"], b["action"]) - target) ** 2).mean(), [*learner.critic.parameters()]
    )
    assert all(torch.allclose(a, b_, atol=1e-6) for a, b_ in zip(critic_grad, reference))


def test_target_networks_move_by_exactly_tau(tmp_path):
    trainer = Trainer(small_config(tmp_path, "masac", updates_per_iteration=1, tau=0.25), run_dir=tmp_path / "run")
    learner = trainer.algorithm.learners["agent"]
    before = [p.clone() for p in learner.target_critic.parameters()]
    trainer.train_iteration()
    for old, new, online in zip(before, learner.target_critic.parameters(), learner.critic.parameters()):
        assert torch.allclose(new, 0.75 * old + 0.25 * online, atol=1e-7)
    assert any(not torch.equal(old, new) for old, new in zip(before, learner.target_critic.parameters()))


# ---- runs -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("algo", "env"),
    [("masac", "speaker_listener"), ("maddpg", "tag"), ("isac", "spread"), ("iddpg", "navigation")],
)
def test_heterogeneous_and_discrete_groups_train(tmp_path, algo, env):
    trainer = Trainer(small_config(tmp_path, algo, env), run_dir=tmp_path / "run")
    rows = [trainer.train_iteration() for _ in range(2)]
    for g in trainer.env.groups:
        for name in ("loss", "critic_loss", "policy_loss", "q_value", "critic_grad_norm", "buffer_fill"):
            assert math.isfinite(rows[-1][f"{g}/{name}"]), (g, name)
        assert rows[-1][f"{g}/buffer_fill"] == pytest.approx(128 / 1000)
    if algo.endswith("sac"):
        assert all(0 < rows[-1][f"{g}/alpha"] < 1 for g in trainer.env.groups)  # tuned down from 1 already


def test_value_based_groups_are_refused_by_ddpg_with_the_algorithms_that_fit(tmp_path):
    with pytest.raises(ValueError, match=r"group 'agent' has Discrete.*masac or isac"):
        Trainer(small_config(tmp_path, "maddpg", "spread"), run_dir=tmp_path / "run")
    with pytest.raises(ValueError, match="batch_size=512 is larger than the 64 frames"):
        small_config(tmp_path, "masac", batch_size=512)
    with pytest.raises(ValueError, match="shared_value needs a centralised critic"):
        SACConfig(algo="isac", shared_value=True)
    with pytest.raises(ValueError, match="tau must be in"):
        DDPGConfig(tau=1.5)


@pytest.mark.parametrize(
    "algo, env, prioritized",
    [("masac", "speaker_listener", False), ("masac", "speaker_listener", True), ("maddpg", "navigation", False)],
    ids=["masac-uniform", "masac-prioritized", "maddpg"],
)
def test_an_update_reads_nothing_back_from_the_device(tmp_path, algo, env, prioritized):
    # Nor copies anything to it: the checker treats the CPU as a remote device (DDPG's critic inputs once
    # built the action bounds from the spec's numbers at every step).
    config = small_config(tmp_path, algo, env, prioritized=prioritized, warmup_frames=64)
    update_without_host_sync(config, tmp_path / "run")


@pytest.mark.parametrize("algo", ["masac", "maddpg"])
def test_a_resumed_run_continues_exactly(tmp_path, algo):
    env = "speaker_listener" if algo == "masac" else "tag"
    resumed, expected = resume_midway(small_config(tmp_path, algo, env, prioritized=True), tmp_path)
    assert_repeats(resumed, expected, ("loss", "alpha", "sigma", "q_value", "episode_return"))


class Recording:
    """An update step that keeps what each call hands to `after_step`: the slots drawn and their priorities."""

    def __init__(self, step) -> None:
        self.step, self.trainables, self.aux = step, step.trainables, []

    def __call__(self, *inputs):
        out, (index, priority, active) = self.step(*inputs)
        self.aux.append((index.clone(), {g: v.clone() for g, v in priority.items()}))
        return out, (index, priority, active)


@pytest.mark.slow
@pytest.mark.filterwarnings("error::RuntimeWarning")  # the compile fallback's warning fails the test
@pytest.mark.parametrize(
    ("algo", "env", "prioritized"),
    [("maddpg", "navigation", False), ("masac", "speaker_listener", True), ("qmix", "spread", True)],
    ids=["maddpg-uniform", "masac-prioritized", "qmix-prioritized"],
)
@pytest.mark.usefixtures("eager_rollout", "without_inductor")
def test_a_compiled_update_is_one_graph_and_equals_the_eager_one(tmp_path, algo, env, prioritized):
    # With --compile each optimiser step (its draw from the buffer, the losses, Adam, the targets and the
    # priorities) is one graph, compiled once: no graph break, no recompile when beta moves; with priorities
    # each compiled step draws from the tree the previous one left. Traced without Inductor's C++ (see
    # `without_inductor`): what Inductor makes of the step's parts is held to eager elsewhere, the tree's
    # in-place writes by the sum tree's compiled tests and the losses and Adam by PPO's. The rollout step
    # stays eager.
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    trainers = {}
    for compile in (False, True):
        config = small_config(tmp_path, algo, env, compile=compile, prioritized=prioritized)
        trainer = trainers[compile] = Trainer(config, run_dir=tmp_path / f"compile{compile}")
        algorithm = trainer.algorithm
        for frames in (0, 64):
            algorithm.begin_iteration(frames, 10**5)
            trainer.buffer.extend(trainer.collector.collect())
            counters.clear()
            if prioritized and frames > 0:
                update_checking_draws(trainer)
            else:
                algorithm.update(trainer.buffer, trainer.timer)
            if compile:
                assert counters["stats"]["unique_graphs"] == (1 if frames == 0 else 0), frames
                assert not counters["graph_break"], dict(counters["graph_break"])
    eager, compiled = (trainers[c] for c in (False, True))
    for a, b in zip(eager.algorithm.parameters(), compiled.algorithm.parameters(), strict=True):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5)
    if prioritized:
        torch.testing.assert_close(compiled.buffer.tree, eager.buffer.tree, rtol=1e-4, atol=1e-6)
        torch.testing.assert_close(compiled.buffer.max_priority, eager.buffer.max_priority, rtol=1e-4, atol=0)


def update_checking_draws(trainer: Trainer) -> None:
    """`trainer.algorithm.update`, checking that each optimiser step found its slots in the tree the previous
    step's priorities updated: the tree after the update equals one rebuilt by replaying the update's draws
    and priorities step by step with the reference sum tree."""
    buffer, algorithm, algo = trainer.buffer, trainer.algorithm, trainer.config.algo
    tree, max_priority, state = buffer.tree.clone(), buffer.max_priority.item(), trainer.generator.get_state()
    step = algorithm.step
    algorithm.step = Recording(step)
    try:
        algorithm.update(buffer, trainer.timer)
        recorded = algorithm.step.aux
    finally:
        algorithm.step = step
    replay = torch.Generator().set_state(state)  # the iteration's draws, again: the noise, then the fractions
    algorithm.draw_noise(algo.updates_per_iteration, algo.batch_size, replay)
    fractions = torch.rand(algo.updates_per_iteration, algo.batch_size, dtype=torch.float64, generator=replay)
    assert len(recorded) == algo.updates_per_iteration
    for fraction, (index, priority) in zip(fractions, recorded, strict=True):
        stratified = (fraction + torch.arange(algo.batch_size)) / algo.batch_size
        assert torch.equal(index, sum_tree_find_reference(tree, stratified)[0])
        per_step = torch.cat([p.flatten(1) for p in priority.values()], 1).amax(1).double()
        per_step = per_step + buffer.prioritized.eps
        max_priority = max(max_priority, per_step.max().item())
        sum_tree_update_reference(tree, index, per_step**algo.priority_alpha)
    torch.testing.assert_close(buffer.tree, tree, rtol=1e-12, atol=0)
    assert buffer.max_priority.item() == max_priority


def test_each_step_draws_from_the_tree_the_previous_step_left(tmp_path):
    # Eager here; the compiled step is checked the same way in `test_a_compiled_update_is_one_graph...`.
    config = small_config(tmp_path, "masac", "speaker_listener", prioritized=True)
    trainer = Trainer(config, run_dir=tmp_path / "run")
    trainer.train_iteration()
    trainer.algorithm.begin_iteration(64, 10**5)
    trainer.buffer.extend(trainer.collector.collect())
    update_checking_draws(trainer)


def mean_return(policy, env, steps=25) -> float:
    obs = env.reset(seed=123)
    total = torch.zeros(env.num_envs)
    with torch.no_grad():
        for _ in range(steps):
            next_td, obs = env.step({"agent": policy(obs["agent", "observation"])})
            total += next_td["agent", "reward"][:, 0, 0]
    return total.mean().item()


@pytest.mark.slow
@pytest.mark.parametrize(("algo", "options"), [("maddpg", {}), ("masac", {"alpha_init": 0.02})])
def test_short_training_covers_a_stated_fraction_from_random_to_scripted(tmp_path, algo, options):
    """navigation with 25-step episodes, 12,288 frames: at least 30% of the way from a random policy's
    return to the scripted controller's (both measured here on the same episodes)."""
    cls = DDPGConfig if algo == "maddpg" else SACConfig
    config = TrainConfig(
        env=EnvSettings(env="navigation", num_envs=32, env_options={"max_steps": 25}),
        algo=cls(algo=algo, batch_size=256, updates_per_iteration=64, lr=1e-3, **options),
        model=ModelConfig(hidden=(64, 64)),
        run=RunConfig(
            total_frames=12_288,
            rollout_length=16,
            device="cpu",
            progress=False,
            tensorboard=False,
            log_dir=str(tmp_path),
            checkpoint_every=1000,
        ),
    )
    trainer = Trainer(config, run_dir=tmp_path / "run")
    trainer.train()
    env = envs.make("navigation", num_envs=256, seed=7, max_steps=25)
    policy = trainer.algorithm.learners["agent"].policy
    trained = mean_return(lambda o: (d := policy(o)).env_action(d.mode()), env)
    generator = torch.Generator().manual_seed(0)
    random = mean_return(lambda o: torch.rand(o.shape[:-1] + (2,), generator=generator) * 2 - 1, env)
    scripted = mean_return(scripted_action, env)
    assert trained > random + 0.3 * (scripted - random), (trained, random, scripted)

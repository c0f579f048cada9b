"""IQL, VDN and QMIX: the mixers against written-out references, QMIX's monotonicity, double-Q targets and
masked maxima by hand, ε-greedy acting and its schedule, the target networks, the whole loss against a
reference, and runs (discrete groups, a continuous group refused, compiled, resumed, without host syncs,
learning on spread)."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

import envs
from envs import registry
from envs.native.spread import scripted_action
from envs.specs import Box, Discrete, GroupSpec, MultiDiscrete
from marl.algorithms.qlearning import QConfig, QMixer, best_actions, chosen_values, next_values, team_step, vdn_mix
from marl.app.evaluate import evaluate
from marl.app.trainer import Trainer
from marl.config import EnvSettings, ModelConfig, RunConfig, TrainConfig
from marl.core.distributions import EpsilonGreedy
from tests.envs.broken_envs import Counter
from tests.marl.algorithms.offpolicy_checks import assert_repeats, resume_midway, update_without_host_sync
from tests.marl.algorithms.test_offpolicy import mean_return, small_config


class MaskedCounter(Counter):
    """`Counter` with discrete movers (move by -0.1, 0 or +0.1; mover_0 may never move up), a picker with
    two independent choices (MultiDiscrete), and a global state (the positions and targets)."""

    def _make_groups(self):
        n = self.config.n_agents
        return {
            "mover": GroupSpec([f"mover_{i}" for i in range(n)], Box((2,)), Discrete(3, masked=True)),
            "picker": GroupSpec(["picker_0"], Box((1,)), MultiDiscrete((2, 3))),
        }

    def _state_spec(self):
        return Box((2 * self.config.n_agents,))

    def _step(self, action):
        self.pos = self.pos + (action["mover"].float() - 1) * 0.1
        self.picks = self.picks + action["picker"][:, 0].sum(-1).float()
        distance = (self.pos - self.target).abs()
        reward = {"mover": -distance, "picker": -distance.mean(-1, keepdim=True)}
        return reward, (distance < 0.05).all(-1)

    def _action_mask(self):
        mask = torch.ones(self.num_envs, self.config.n_agents, 3, dtype=torch.bool, device=self.device)
        mask[:, 0, 2] = False
        return {"mover": mask}

    def _state(self):
        return torch.cat([self.pos, self.target], -1)


def discrete_config(tmp_path, algo: str, env: str = "spread", **options) -> TrainConfig:
    """`small_config` on spread (discrete actions) unless told otherwise."""
    return small_config(tmp_path, algo, env, **options)


# ---- mixers ---------------------------------------------------------------------------------------------


def test_the_mixers_equal_written_out_references():
    torch.manual_seed(0)
    k, n, d, embed = 5, 3, 7, 4
    q, state = torch.randn(k, n), torch.randn(k, d)
    assert torch.allclose(vdn_mix(q), torch.tensor([sum(q[i, j] for j in range(n)) for i in range(k)]))
    mixer = QMixer(n, d, embed).requires_grad_(False)
    out = mixer(q, state)
    for i in range(k):
        s = state[i]
        w1 = (mixer.hyper_w1.weight @ s + mixer.hyper_w1.bias).abs().view(n, embed)
        b1 = mixer.hyper_b1.weight @ s + mixer.hyper_b1.bias
        hidden = [b1[e] + sum(q[i, j] * w1[j, e] for j in range(n)) for e in range(embed)]
        hidden = [h if h > 0 else math.exp(h) - 1 for h in hidden]  # elu
        w2 = (mixer.hyper_w2.weight @ s + mixer.hyper_w2.bias).abs()
        v = mixer.hyper_b2[2](torch.relu(mixer.hyper_b2[0](s)))
        expected = sum(hidden[e] * w2[e] for e in range(embed)) + v[0]
        assert out[i].item() == pytest.approx(float(expected), rel=1e-5, abs=1e-6)


def test_qmix_is_monotonic_in_every_agents_value():
    torch.manual_seed(1)
    mixer = QMixer(4, 10, 8)
    q = (torch.randn(256, 4) * 5).requires_grad_()
    (grad,) = torch.autograd.grad(mixer(q, torch.randn(256, 10) * 3).sum(), q)
    assert (grad >= 0).all() and (grad > 0).any()


def test_team_reward_is_the_mean_and_the_team_terminates_when_every_agent_has():
    reward = torch.tensor([[1.0, 2.0, 6.0], [0.0, 0.0, -3.0], [4.0, 5.0, 0.0]])
    terminated = torch.tensor([[False, True, False], [False, False, False], [True, True, True]])
    next_q = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]])
    team_reward, team_terminated, team_next_q = team_step(reward, terminated, next_q)
    assert torch.equal(team_reward, torch.tensor([[3.0], [-1.0], [3.0]]))
    assert torch.equal(team_terminated, torch.tensor([[False], [False], [True]]))
    # An agent that has left adds no next value: agent 1 of row 0 (and all of row 2, which ends anyway).
    assert torch.equal(team_next_q, torch.tensor([[1.0, 0.0, 3.0], [4.0, 5.0, 6.0], [0.0, 0.0, 0.0]]))


# ---- targets by hand ------------------------------------------------------------------------------------


def test_double_q_targets_and_masked_maxima_by_hand():
    target_q = torch.tensor([[[1.0, 9.0, 3.0], [4.0, 0.0, 2.0]]])  # [k=1, n=2, 3 actions]
    online_q = torch.tensor([[[0.0, 1.0, 5.0], [7.0, 8.0, 6.0]]])
    mask = torch.tensor([[[True, False, True], [True, False, True]]])  # action 1 not allowed
    # Double Q: the online argmax over allowed actions (2 and 0), valued by the target network.
    assert torch.equal(next_values(target_q, online_q, mask, (3,)), torch.tensor([[3.0, 4.0]]))
    # Without double Q: the target's own best allowed action (9 and 0 are masked out).
    assert torch.equal(next_values(target_q, None, mask, (3,)), torch.tensor([[3.0, 4.0]]))
    assert torch.equal(next_values(target_q, None, None, (3,)), torch.tensor([[9.0, 4.0]]))
    assert torch.equal(next_values(target_q, online_q, None, (3,)), torch.tensor([[3.0, 0.0]]))


def test_multi_discrete_heads_add_up_and_are_maximised_apart():
    q = torch.tensor([[[1.0, 5.0, 0.0, 2.0, 7.0]]])  # heads of 2 and 3 actions
    assert torch.equal(best_actions(q, None, (2, 3)), torch.tensor([[[1, 2]]]))
    assert torch.equal(chosen_values(q, torch.tensor([[[0, 1]]]), (2, 3)), torch.tensor([[1.0 + 2.0]]))
    assert torch.equal(next_values(q, None, None, (2, 3)), torch.tensor([[5.0 + 7.0]]))
    assert torch.equal(chosen_values(q[..., :2], torch.tensor([[1]]), (2,)), torch.tensor([[5.0]]))  # Discrete


# ---- acting ---------------------------------------------------------------------------------------------


def test_epsilon_greedy_explores_at_rate_epsilon_over_allowed_actions_only():
    generator = torch.Generator().manual_seed(0)
    draws = 40000
    q = torch.tensor([5.0, 0.0, 1.0, 9.0]).expand(draws, 1, 4)
    mask = torch.tensor([True, True, True, False]).expand(draws, 1, 4)  # the best action, 3, is not allowed
    dist = EpsilonGreedy(q, torch.tensor(0.3), mask, (4,), heads=False)
    assert torch.equal(dist.mode(), torch.zeros(draws, 1, dtype=torch.long))
    counts = torch.bincount(dist.sample(torch.rand(draws, 1, 4, generator=generator)).flatten(), minlength=4) / draws
    # Greedy (action 0) with 0.7, else uniform over the three allowed actions.
    expected = torch.tensor([0.7 + 0.1, 0.1, 0.1, 0.0])
    assert counts[3] == 0 and torch.allclose(counts, expected, atol=0.01), counts
    never = EpsilonGreedy(q, torch.tensor(0.0), mask, (4,), heads=False)
    assert (never.sample(torch.rand(draws, 1, 4, generator=generator)) == 0).all()
    uniform = torch.bincount(dist.random(torch.rand(draws, 1, 4, generator=generator)).flatten(), minlength=4)
    assert uniform[3] == 0 and torch.allclose(uniform[:3] / draws, torch.full((3,), 1 / 3), atol=0.01)


def test_epsilon_greedy_on_heads_acts_per_head():
    q = torch.tensor([1.0, 5.0, 0.0, 2.0, 7.0]).expand(20000, 2, 5)
    dist = EpsilonGreedy(q, torch.tensor(1.0), None, (2, 3), heads=True)
    action = dist.sample(torch.rand(20000, 2, 5, generator=torch.Generator().manual_seed(0)))
    assert action.shape == (20000, 2, 2)
    assert torch.allclose(torch.bincount(action[..., 1].flatten()) / 40000, torch.full((3,), 1 / 3), atol=0.01)
    assert torch.equal(dist.mode()[0, 0], torch.tensor([1, 2]))


def test_epsilon_is_annealed_linearly_over_the_stated_fraction_of_the_run(tmp_path):
    config = discrete_config(tmp_path, "iql", exploration_eps_init=0.8, exploration_eps_end=0.1, exploration_anneal=0.5)
    trainer = Trainer(config, run_dir=tmp_path / "run")
    epsilon = trainer.algorithm.learners["agent"].policy.epsilon
    for frames, expected in ((0, 0.8), (25_000, 0.45), (50_000, 0.1), (90_000, 0.1)):
        trainer.algorithm.begin_iteration(frames, 100_000)
        assert epsilon.item() == pytest.approx(expected)
    row = trainer.train_iteration()
    assert row["agent/epsilon"] == pytest.approx(0.8)


# ---- the whole loss against a reference ----------------------------------------------------------------


@pytest.mark.parametrize("algo", ["iql", "vdn", "qmix"])
def test_the_loss_equals_a_written_out_reference(tmp_path, algo):
    trainer = Trainer(discrete_config(tmp_path, algo, double_q=algo != "vdn"), run_dir=tmp_path / "run")
    trainer.buffer.extend(trainer.collector.collect())
    learner = trainer.algorithm.learners["agent"]
    index = torch.tensor([0, 5, 17, 63])
    weight = torch.tensor([1.0, 0.5, 2.0, 1.0])
    total, terms, priority = trainer.algorithm.loss(trainer.buffer.storage, index, weight, {}, torch.tensor([0]))
    b = trainer.buffer.gather(index)["agent"]
    k, n, gamma = 4, 3, learner.algo.gamma
    with torch.no_grad():
        q_all = learner.policy.net(b["observation"])  # [k, n, 5]
        q = torch.stack([torch.stack([q_all[i, j, b["action"][i, j]] for j in range(n)]) for i in range(k)])
        next_target = learner.target_q(b["next_observation"])
        picker = learner.policy.net(b["next_observation"]) if algo != "vdn" else next_target
        next_q = torch.stack(
            [torch.stack([next_target[i, j, picker[i, j].argmax()] for j in range(n)]) for i in range(k)]
        )
        if algo == "iql":
            value, next_value = q, next_q
            reward, alive = b["reward"], (~b["terminated"]).float()
        else:
            if algo == "vdn":
                value, next_value = q.sum(1, keepdim=True), next_q.sum(1, keepdim=True)
            else:
                obs, next_obs = b["observation"].flatten(1), b["next_observation"].flatten(1)
                value = learner.mixer(q, obs).unsqueeze(1)
                next_value = learner.target_mixer(next_q, next_obs).unsqueeze(1)
            reward = b["reward"].mean(1, keepdim=True)
            alive = 1.0 - b["terminated"].any(1, keepdim=True).float()
        target = reward + gamma * alive * next_value
        expected = (weight[:, None] * (value - target) ** 2).mean()
    assert terms["agent"][0].item() == pytest.approx(expected.item(), rel=1e-5)
    assert total.item() == pytest.approx(expected.item(), rel=1e-5)
    assert torch.allclose(priority["agent"], (value - target).abs().expand(k, n), atol=1e-6)
    assert terms["agent"][1].item() == pytest.approx(q.mean().item(), rel=1e-5)
    # Gradients reach the online nets only.
    grads = torch.autograd.grad(total, [*learner.policy.parameters()], allow_unused=True)
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    assert not any(p.requires_grad for p in learner.target_q.parameters())


@pytest.mark.parametrize("capacity", [1000, 100], ids=["filling", "wrapped"])
def test_n_step_targets_equal_a_walk_through_the_collected_steps(tmp_path, capacity):
    """3-step IQL targets of draws near episode ends (step 24 of 25), the write position, and (wrapped) the
    ring's seam, against the same env's steps walked one by one in the batches as collected."""
    config = discrete_config(tmp_path, "iql", n_step=3, buffer_size=capacity, gamma=0.9, double_q=False)
    trainer = Trainer(config, run_dir=tmp_path / "run")
    algorithm, learner = trainer.algorithm, trainer.algorithm.learners["agent"]
    batches = []
    for _ in range(4):  # 4 x [8 steps, 8 envs]: time-major, global step t * 8 + env
        batch = trainer.collector.collect()
        trainer.buffer.extend(batch)
        batches.append(batch["agent"].clone())
    steps = {key: torch.cat([b[key] for b in batches]).flatten(0, 1) for key in batches[0].keys()}  # [256, ...]
    written = 256
    algorithm.position = trainer.buffer.position
    index = torch.tensor([0, 7, 24 * 8 + 3, 23 * 8 + 5, 250, 255, 244, 99, 40, 156])  # wrapped: 56, the oldest
    index = index.remainder(capacity)
    _, _, priority = algorithm.loss(trainer.buffer.storage, index, None, {}, torch.tensor([0]))
    with torch.no_grad():
        for row, slot in enumerate(index.tolist()):
            first = slot + capacity * ((written - 1 - slot) // capacity)  # the newest step stored in the slot
            total, m = torch.zeros(3), 0
            for j in range(3):
                step = first + 8 * j
                if step >= written:
                    break
                total += 0.9**j * steps["reward"][step]
                m += 1
                if steps["done"][step].any():
                    break
            last = first + 8 * (m - 1)
            next_q = learner.target_q(steps["next_observation"][last].unsqueeze(0))[0].amax(-1)  # [n]
            target = total + 0.9**m * (~steps["terminated"][last]).float() * next_q
            q = learner.policy.net(steps["observation"][first].unsqueeze(0))[0]
            q = q.gather(-1, steps["action"][first].unsqueeze(-1)).squeeze(-1)
            assert torch.allclose(priority["agent"][row], (q - target).abs(), atol=1e-5), (slot, first, m)


@pytest.mark.parametrize("n_step", [1, 3])
@pytest.mark.parametrize("algo", ["iql", "vdn", "qmix"])
def test_the_team_plays_on_after_an_agent_leaves(tmp_path, algo, n_step):
    """PettingZoo runners (`tests.envs.pz_toy`): runner_1 leaves after 2 steps, runner_0 ends the 4-step
    episode. The team's targets, walked through the collected steps: its n-step sums run until the env's
    episode ends, it bootstraps unless the episode ended there (terminated: max_steps is 100), and
    runner_1's next value, once it has left, is 0 in the sum or the mixer (IQL: runner_0's n-step sums run
    on past runner_1's leaving too). Once it has left, runner_1's Q is 0 in the sum or the mixer too, the
    mixer reads zeros for its observation, and its own IQL error (and priority) is 0: it acts no more."""
    pytest.importorskip("pettingzoo")
    config = discrete_config(tmp_path, algo, "pettingzoo/tests.envs.pz_toy", n_step=n_step, gamma=0.9, double_q=False)
    trainer = Trainer(config, run_dir=tmp_path / "run")
    algorithm, learner = trainer.algorithm, trainer.algorithm.learners["runner"]
    if learner.mixer is not None:  # undo the small init of the output layers: runner_1's Q' must show
        for net in (learner.mixer, learner.target_mixer):
            for p in net.parameters():
                p.data.mul_(100)
    batch = trainer.collector.collect()  # [8 steps, 8 envs]: slot t * 8 + env, two episodes per env
    trainer.buffer.extend(batch)
    algorithm.position = trainer.buffer.position
    steps = {key: batch["runner"][key].flatten(0, 1) for key in ("observation", "next_observation", "action")}
    steps |= {key: batch["runner"][key].flatten(0, 1).squeeze(-1) for key in ("reward", "terminated")}  # [64, 2]
    active = batch["runner"]["active"].flatten(0, 1)  # [64, 2]
    assert torch.equal(active[:, 1], torch.arange(64) // 8 % 4 < 2)  # runner_1 acts at its episode's steps 0, 1
    env_done = torch.arange(64) // 8 % 4 == 3  # [64]: the episodes' last steps, all terminated
    # runner_1 has left after its episode's steps 0 and 1, runner_0 after step 3.
    assert torch.equal(steps["terminated"], torch.stack([env_done, torch.arange(64) // 8 % 4 >= 1], -1))
    index = torch.tensor([0, 8 + 1, 2 * 8 + 2, 3 * 8 + 3, 4 * 8 + 4, 6 * 8 + 5, 7 * 8 + 6])  # each episode step
    _, _, priority = algorithm.loss(trainer.buffer.storage, index, None, {}, torch.tensor([0]))

    def mix(q, observation, mixer):  # [2] -> [] (IQL: [2] as it is)
        if algo == "iql":
            return q
        return q.sum() if mixer is None else mixer(q.unsqueeze(0), observation.flatten().unsqueeze(0))[0]

    with torch.no_grad():
        for row, first in enumerate(index.tolist()):
            total, m = torch.zeros(2), 0
            for j in range(n_step):
                step = first + 8 * j
                if step >= 64:
                    break
                total += 0.9**j * steps["reward"][step]
                m += 1
                if env_done[step]:
                    break
            last = first + 8 * (m - 1)
            next_q = learner.target_q(steps["next_observation"][last]).amax(-1)  # [2]
            next_q = torch.where(steps["terminated"][last], 0.0, next_q)  # a runner that has left adds nothing
            # The mixer reads zeros for a runner that has left: at s' one terminated by the step, at s one out.
            next_seen = torch.where(steps["terminated"][last].unsqueeze(-1), 0.0, steps["next_observation"][last])
            bootstrap = mix(next_q, next_seen, learner.target_mixer)
            reward = total if algo == "iql" else total.mean()
            target = reward + (0.0 if env_done[last] else 0.9**m * bootstrap)
            q = learner.policy.net(steps["observation"][first]).gather(-1, steps["action"][first].unsqueeze(-1))
            seen = torch.where(active[first].unsqueeze(-1), steps["observation"][first], 0.0)
            value = mix(torch.where(active[first], q.squeeze(-1), 0.0), seen, learner.mixer)
            error = (value - target).abs().expand(2)  # a mixer's one error for both runners
            if algo == "iql":
                error = torch.where(active[first], error, 0.0)
            assert torch.allclose(priority["runner"][row], error, atol=1e-5), (first, m)


def test_the_mixer_sees_the_state_when_the_env_has_one(tmp_path):
    trainer = Trainer(discrete_config(tmp_path, "qmix"), run_dir=tmp_path / "run")
    state = {"state": torch.randn(4, 2, 3), "next_state": torch.randn(4, 2, 3), "agent": {}}
    condition, next_condition = (trainer.algorithm._condition(state, "agent", when, None) for when in ("", "next_"))
    assert torch.equal(condition, state["state"].flatten(1)) and torch.equal(
        next_condition, state["next_state"].flatten(1)
    )


# ---- target networks -----------------------------------------------------------------------------------


def test_target_networks_move_by_tau_or_are_copied_every_n_steps(tmp_path):
    trainer = Trainer(discrete_config(tmp_path, "qmix", updates_per_iteration=1, tau=0.25), run_dir=tmp_path / "run")
    learner = trainer.algorithm.learners["agent"]
    online = [*learner.policy.net.parameters(), *learner.mixer.parameters()]
    targets = [*learner.target_q.parameters(), *learner.target_mixer.parameters()]
    before = [p.clone() for p in targets]
    trainer.train_iteration()
    for old, new, source in zip(before, targets, online):
        assert torch.allclose(new, 0.75 * old + 0.25 * source, atol=1e-7)
    config = discrete_config(tmp_path, "vdn", updates_per_iteration=2, target_update="hard", target_update_every=3)
    trainer = Trainer(config, run_dir=tmp_path / "hard")
    learner = trainer.algorithm.learners["agent"]
    initial = [p.clone() for p in learner.target_q.parameters()]
    trainer.train_iteration()  # steps 1, 2: no copy yet
    assert all(torch.equal(a, b) for a, b in zip(initial, learner.target_q.parameters()))
    trainer.train_iteration()  # step 3 copies, step 4 does not
    moved = [p.clone() for p in learner.policy.net.parameters()]
    assert not all(torch.equal(a, b) for a, b in zip(initial, learner.target_q.parameters()))
    assert not all(torch.equal(a, b) for a, b in zip(moved, learner.target_q.parameters()))  # step 4 moved on
    assert trainer.algorithm.updates.item() == 4


# ---- runs -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("algo", "group_map"), [("iql", "by_type"), ("vdn", "per_agent"), ("qmix", "by_type"), ("qmix", "per_agent")]
)
def test_discrete_groups_train(tmp_path, algo, group_map):
    trainer = Trainer(discrete_config(tmp_path, algo, group_map=group_map, prioritized=True), run_dir=tmp_path / "run")
    rows = [trainer.train_iteration() for _ in range(2)]
    nets = ("q", "mixer") if algo == "qmix" else ("q",)
    for g in trainer.env.groups:
        for name in ("loss", "q_value", "q_total", "td_error", "epsilon", *(f"{net}_grad_norm" for net in nets)):
            assert math.isfinite(rows[-1][f"{g}/{name}"]), (g, name)
        assert rows[-1][f"{g}/buffer_fill"] == pytest.approx(128 / 1000)
    if group_map == "per_agent":
        assert len(trainer.env.groups) == 3


@pytest.mark.parametrize("algo", ["qmix", "iql"])
def test_masked_and_multi_discrete_groups_train_and_the_mixer_sees_the_state(tmp_path, monkeypatch, algo):
    monkeypatch.setitem(registry._ENVS, "masked_counter", MaskedCounter)  # registered for this test only
    trainer = Trainer(discrete_config(tmp_path, algo, "masked_counter"), run_dir=tmp_path / "run")
    if algo == "qmix":
        assert trainer.algorithm.learners["mover"].mixer.hyper_w1.in_features == 4  # the state, not observations
    for _ in range(2):
        row = trainer.train_iteration()
    assert all(math.isfinite(row[f"{g}/loss"]) for g in ("mover", "picker"))
    stored = trainer.buffer.storage
    assert (stored["mover", "action"][:128, 0] != 2).all()  # epsilon 0.8 explores, never onto a masked action
    assert (stored["mover", "action"][:128, 1] == 2).any()
    picks = stored["picker", "action"][:128, 0]  # [steps, 2 heads]
    assert picks.shape == (128, 2) and (picks[:, 1] == 2).any() and (picks[:, 0] <= 1).all()


def test_each_group_may_take_its_own_value_based_algorithm(tmp_path):
    config = discrete_config(tmp_path, "qmix", group_map="per_agent", double_q=False)
    overrides = {"agent_0": {"algo": "iql"}, "agent_1": {"algo": "vdn", "double_q": True}}
    trainer = Trainer(dataclasses.replace(config, group_overrides=overrides), run_dir=tmp_path / "run")
    learners = trainer.algorithm.learners
    assert learners["agent_0"].mixer is None and learners["agent_1"].mixer is None
    assert learners["agent_2"].mixer is not None and learners["agent_1"].algo.double_q
    row = trainer.train_iteration()
    assert math.isfinite(row["agent_2/mixer_grad_norm"]) and "agent_0/mixer_grad_norm" not in row
    assert all(math.isfinite(row[f"agent_{i}/q_grad_norm"]) for i in range(3))


def test_continuous_groups_and_actor_critic_options_are_refused(tmp_path):
    with pytest.raises(ValueError, match=r"group 'predator' has Box.*maddpg, iddpg, masac or isac"):
        Trainer(discrete_config(tmp_path, "qmix", "tag"), run_dir=tmp_path / "run")
    with pytest.raises(ValueError, match="critic_scope and shared_value are options of the actor-critic"):
        QConfig(algo="vdn", shared_value=True)
    with pytest.raises(ValueError, match="exploration_eps_init must be in"):
        QConfig(exploration_eps_init=1.5)
    with pytest.raises(ValueError, match="target_update_every must be >= 1"):
        QConfig(target_update="hard", target_update_every=0)


@pytest.mark.parametrize("prioritized", [False, True], ids=["uniform", "prioritized"])
def test_an_update_reads_nothing_back_from_the_device(tmp_path, prioritized):
    config = discrete_config(
        tmp_path, "qmix", prioritized=prioritized, warmup_frames=64, target_update="hard", n_step=3
    )
    update_without_host_sync(config, tmp_path / "run")


@pytest.mark.parametrize("algo", ["qmix", "iql"])
def test_a_resumed_run_continues_exactly(tmp_path, algo):
    options = {"prioritized": True, "target_update": "hard", "target_update_every": 4}
    resumed, expected = resume_midway(discrete_config(tmp_path, algo, **options), tmp_path)
    assert resumed.algorithm.updates.item() == 6
    got = assert_repeats(resumed, expected, ("loss", "q_value", "q_total", "epsilon", "episode_return"))
    assert math.isfinite(got["agent/episode_return"])  # iteration 4 ends the 25-step episodes


def test_checkpoints_hold_the_target_networks_and_optimiser_and_evaluate_greedily(tmp_path):
    trainer = Trainer(discrete_config(tmp_path, "qmix"), run_dir=tmp_path / "run")
    trainer.train_iteration()
    state = trainer.algorithm.state_dict()
    assert set(state["agent"]) == {"policy", "target_q", "mixer", "target_mixer", "optimizer"}
    assert state["agent"]["optimizer"]["state"]  # Adam's moments
    path = trainer.save()
    greedy = evaluate(str(path), episodes=4, device="cpu")
    again = evaluate(str(path), episodes=4, device="cpu")
    assert greedy["episodes"] == 4 and math.isfinite(greedy["returns"]["agent"]["mean"])
    assert greedy["returns"] == again["returns"]  # greedy: the same episodes give the same returns
    sampled = evaluate(str(path), episodes=4, device="cpu", deterministic=False)
    assert math.isfinite(sampled["returns"]["agent"]["mean"])


@pytest.mark.usefixtures("without_inductor")
@pytest.mark.filterwarnings("error::RuntimeWarning")  # the compile fallback's warning fails the test
def test_compiled_steps_match_eager(tmp_path):
    torch._dynamo.reset()
    runs = {}
    for compile in (False, True):
        config = discrete_config(
            tmp_path, "qmix", compile=compile, target_update="hard", target_update_every=2, n_step=3
        )
        trainer = Trainer(config, run_dir=tmp_path / f"compile{compile}")
        runs[compile] = [trainer.train_iteration() for _ in range(2)]
    for eager, compiled in zip(runs[False], runs[True]):
        for key in ("agent/loss", "agent/q_total", "agent/q_grad_norm", "agent/mixer_grad_norm"):
            assert compiled[key] == pytest.approx(eager[key], rel=1e-4, abs=1e-5), key


@pytest.mark.slow
@pytest.mark.parametrize(
    ("env", "frames", "eval_envs"), [("spread", 24_576, 256), ("pettingzoo/mpe2.simple_spread_v3", 12_288, 32)]
)
def test_short_vdn_training_covers_a_stated_fraction_from_random_to_scripted(tmp_path, env, frames, eval_envs):
    """spread (3 agents, 25-step episodes), native and MPE's own through the PettingZoo adapter (the same
    observations and moves; fewer frames, as its envs step on the host), 12,288-24,576 frames: the greedy
    team at least 25% of the way from a random team's return to the scripted controller's (both measured
    here on the same episodes)."""
    config = TrainConfig(
        env=EnvSettings(env=env, num_envs=32),
        algo=QConfig(algo="vdn", batch_size=128, updates_per_iteration=64, lr=1e-3, gamma=0.9, exploration_anneal=0.5),
        model=ModelConfig(hidden=(64, 64), activation="relu"),
        run=RunConfig(
            total_frames=frames,
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
    env = envs.make(env, num_envs=eval_envs, seed=7)
    policy = trainer.algorithm.learners["agent"].policy
    trained = mean_return(lambda o: policy(o).mode(), env)
    generator = torch.Generator().manual_seed(0)
    random = mean_return(lambda o: torch.randint(0, 5, o.shape[:-1], generator=generator), env)
    scripted = mean_return(scripted_action, env)
    assert trained > random + 0.25 * (scripted - random), (trained, random, scripted)

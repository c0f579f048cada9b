"""Agents that leave mid-episode (`_agent_terminated`): the env's `active` flag, the rollout and the replay
buffer that store it, and every learner's losses over the active agent-steps only, each against a reference
computed over those steps alone (and not equal to the loss over every step, which learners used before)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import envs
from envs.specs import Box, GroupSpec
from envs.sync import forbid_host_sync
from marl.algorithms import ppo_seeds
from marl.algorithms.ddpg import ddpg_terms
from marl.algorithms.offpolicy import critic_loss
from marl.algorithms.ppo import ppo_loss
from marl.algorithms.sac import continuous_terms, discrete_terms
from marl.app.trainer import Trainer
from marl.config import EnvSettings, TrainConfig
from marl.core.groups import GroupedEnv
from marl.core.masking import agents_in, masked_mean, masked_var, standardized
from marl.core.models import CriticInput
from marl.core.replay import Prioritized, ReplayBuffer
from tests.marl.algorithms.test_offpolicy import small_config as off_policy_config
from tests.marl.algorithms.test_ppo import reference_ppo
from tests.marl.app.test_seeds import SEEDS, assert_rows_match
from tests.marl.app.test_training import small_config as ppo_config
from tests.marl.core.test_replay import leaves
from tests.marl.leavers_env import Leavers, LeaversConfig

LIFETIMES = (3, 1)  # agent_1 acts at each episode's first step only; agent_0 ends the 3-step episode


@pytest.fixture(autouse=True)
def leavers(monkeypatch):
    monkeypatch.setitem(envs.registry._ENVS, "leavers", Leavers)


def leavers_settings(num_envs: int = 4, discrete: bool = False) -> EnvSettings:
    return EnvSettings(env="leavers", num_envs=num_envs, env_options={"lifetimes": LIFETIMES, "discrete": discrete})


def ppo_leavers_config(tmp_path, **run) -> TrainConfig:
    """PPO on 4 envs of leavers, 6-step rollouts in minibatches of 24 frames."""
    config = ppo_config(tmp_path)
    algo = dataclasses.replace(config.algo, minibatch_size=24, entropy_coef=0.01)
    run = dataclasses.replace(config.run, **{"rollout_length": 6, "total_frames": 4 * 6 * 2, **run})
    return dataclasses.replace(config, env=leavers_settings(), algo=algo, run=run)


def on_policy(tmp_path, **run) -> Trainer:
    return Trainer(ppo_leavers_config(tmp_path, **run), run_dir=tmp_path / "ppo")


def off_policy(tmp_path, algo: str, **options) -> Trainer:
    discrete = algo in ("iql", "vdn", "qmix")
    config = off_policy_config(tmp_path, algo, **options)
    config = dataclasses.replace(config, env=leavers_settings(8, discrete))
    return Trainer(config, run_dir=tmp_path / algo)


def expected_active(steps: range, num_envs: int) -> torch.Tensor:
    """`[T, B, 2]`: agent_0 acts at every step, agent_1 at each 3-step episode's first only."""
    first = torch.tensor([t % 3 == 0 for t in steps])
    return torch.stack([torch.ones_like(first), first], -1)[:, None].expand(-1, num_envs, -1)


# ---- the flag: env, group maps, rollout, replay --------------------------------------------------------------


def test_the_env_says_which_agents_act_until_their_env_resets():
    env = Leavers(LeaversConfig(lifetimes=LIFETIMES), num_envs=2, seed=1)
    assert env.groups["agent"].agents_leave and not envs.make("navigation", num_envs=2).groups["agent"].agents_leave
    obs, acting, still_in = env.reset(seed=1), [], []
    for _ in range(4):
        acting.append(obs["agent", "active"][0].tolist())
        next_td, obs = env.step({"agent": torch.zeros(2, 2, 1)})
        still_in.append(next_td["agent", "active"][0].tolist())
        assert torch.equal(next_td["agent", "terminated"][..., 0], ~next_td["agent", "active"])
    assert acting == [[True, True], [True, False], [True, False], [True, True]]  # the reset brings agent_1 back
    assert still_in == [[True, False], [True, False], [False, False], [True, False]]
    # A group map moves the flag with the agents; an env whose agents all end together has none.
    per_agent = GroupedEnv(env, "per_agent")
    assert per_agent.groups["agent_1"].agents_leave
    assert per_agent.reset(seed=1)["agent_1", "active"].shape == (2, 1)
    assert "active" not in envs.make("navigation", num_envs=2).reset()["agent"].keys()


@pytest.mark.parametrize("compile", [False, True], ids=["eager", "compiled"])
def test_the_rollout_stores_whether_each_agent_acted_across_resets_and_calls(tmp_path, compile):
    trainer = on_policy(tmp_path, compile=compile)
    assert trainer.collector.compiled == compile
    first = trainer.collector.collect()["agent", "active"].clone()
    second = trainer.collector.collect()["agent", "active"]  # 6 steps on: the episodes' phase carries over
    assert torch.equal(first, expected_active(range(6), 4))
    assert torch.equal(second, expected_active(range(6, 12), 4))


def test_the_replay_buffer_stores_and_draws_the_flag_with_its_step(tmp_path):
    trainer = off_policy(tmp_path, "isac")
    batch = trainer.collector.collect()  # [8, 8]
    trainer.buffer.extend(batch)
    stored = trainer.buffer.storage[("agent", "active")][:64]
    assert torch.equal(stored, batch["agent", "active"].flatten(0, 1))
    index = torch.tensor([0, 9, 18, 27])  # steps 0, 1, 2, 3 of envs 0, 1, 2, 3
    assert trainer.buffer.gather(index)["agent"]["active"][:, 1].tolist() == [True, False, False, True]
    navigation = Trainer(off_policy_config(tmp_path, "isac"), run_dir=tmp_path / "nav")
    assert ("agent", "active") not in navigation.buffer.storage


# ---- the helpers -------------------------------------------------------------------------------------------


def test_masked_mean_and_standardized_count_active_entries_only():
    x = torch.tensor([[1.0, 100.0], [3.0, float("nan")], [5.0, 7.0]])
    active = torch.tensor([[True, False], [True, False], [True, True]])
    assert masked_mean(x, active).item() == pytest.approx((1 + 3 + 5 + 7) / 4)
    assert masked_mean(x, torch.zeros_like(active)).item() == 0.0  # no active entry: 0, not NaN
    kept = torch.tensor([1.0, 3.0, 5.0, 7.0])
    assert torch.allclose(standardized(x, active)[active], (kept - kept.mean()) / (kept.std() + 1e-8))
    one = torch.tensor([[True, False], [False, False], [False, False]])
    assert standardized(x, one)[0, 0].item() == 1.0  # one value has no spread: left as it is


@pytest.mark.parametrize("size", [1, 3, 63, 500, 4097])
def test_with_every_entry_active_the_helpers_equal_the_plain_reductions_bit_for_bit(size):
    """An env that writes `_agent_terminated` but whose agents all end together (PettingZoo's MPE) takes the
    masked path with `active` all True: it must train exactly as the plain reductions would."""
    generator = torch.Generator().manual_seed(size)
    every = torch.ones(size, 3, dtype=torch.bool)
    for _ in range(10):  # an odd rounding is rare: several draws of each size
        x = torch.randn(size, 3, generator=generator) * 3 + 1
        assert torch.equal(masked_mean(x, every), x.mean())
        assert torch.equal(masked_mean(x, every[:, :1], dim=0), x.mean(0))
        assert torch.equal(standardized(x, every), (x - x.mean()) / (x.std() + 1e-8))
        assert torch.equal(masked_var(x, every), x.var())
    masked, plain = x.clone().requires_grad_(), x.clone().requires_grad_()
    masked_mean(masked.square(), every).backward()
    plain.square().mean().backward()
    assert torch.equal(masked.grad, plain.grad)


# ---- PPO ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("normalize", [True, False])
def test_ppo_loss_over_active_steps_equals_the_reference_over_them_alone(normalize):
    generator = torch.Generator().manual_seed(0)
    M, n = 12, 3
    log_prob, old_log_prob, advantage, value, old_value, target = (
        torch.randn(M, n, generator=generator) for _ in range(6)
    )
    entropy = torch.rand(M, n, generator=generator)
    active = torch.rand(M, n, generator=generator) > 0.4
    options = dict(clip_eps=0.2, clip_value=True, entropy_coef=0.01, value_coef=0.5, normalize_advantage=normalize)
    inputs = (log_prob, old_log_prob, advantage, value, old_value, target, entropy)
    terms = ppo_loss(*inputs, **options, active=active)
    reference = reference_ppo(*(x[active] for x in inputs), 0.2, True, 0.01, 0.5, normalize)
    for name, expected in reference.items():
        assert terms[name].item() == pytest.approx(expected, rel=1e-5, abs=1e-7), name
    assert terms["loss"].item() != pytest.approx(ppo_loss(*inputs, **options)["loss"].item(), rel=1e-3)


def test_ppo_update_and_critic_moments_leave_departed_agents_out(tmp_path):
    trainer = on_policy(tmp_path)
    algorithm, learner = trainer.algorithm, trainer.algorithm.learners["agent"]
    batch = trainer.collector.collect()
    algorithm.advantages(batch)
    active = batch["agent", "active"]
    # The critic's moments took in the active steps' targets only (its first batch: their mean).
    assert learner.critic.target_mean.item() == pytest.approx(batch["agent", "value_target"][active].mean().item())
    flat, state = algorithm.update_inputs(batch)
    _, terms = algorithm._minibatch_loss(flat, state, slice(None))
    with torch.no_grad():
        data = flat["agent"]
        dist = learner.policy(data["observation"])
        # The centralised critic reads a departed agent's observation as zeros.
        seen = torch.where(data["active"][..., None], data["observation"], 0.0)
        value = learner.critic(learner.critic_input({"agent": seen}, state))
        inputs = (
            dist.log_prob(data["action"]),
            data["log_prob"],
            data["advantage"],
            value,
            data["old_value"],
            data["value_target"],
            dist.entropy(),
        )
        a = learner.algo
        kept = [x[data["active"]].unsqueeze(-1) for x in inputs]  # [K, 1]: the active agent-steps alone
        options = dict(clip_eps=a.clip_eps, clip_value=a.clip_value, entropy_coef=a.entropy_coef)
        options |= dict(value_coef=a.value_coef, normalize_advantage=True)
        expected = ppo_loss(*kept, **options)
        everything = ppo_loss(*inputs, **options)
    names = ("loss", "policy_loss", "value_loss", "entropy_loss", "approx_kl", "clip_fraction", "entropy")
    for i, name in enumerate(names):
        assert terms["agent"][i].item() == pytest.approx(expected[name].item(), rel=1e-4, abs=1e-6), name
    assert terms["agent"][0].item() != pytest.approx(everything["loss"].item(), rel=1e-3)


# ---- off-policy terms ----------------------------------------------------------------------------------------


def _selected(x: torch.Tensor, active: torch.Tensor) -> torch.Tensor:
    """`x` `[k, n, ...]`, or `[k, twins, n, ...]` (twins 1 or 2, n 3), at the active agent-steps alone, as
    one agent: `[K, 1, ...]` or `[K, twins, 1, ...]`."""
    if x.dim() > active.dim() and x.shape[1] != active.shape[1]:  # twins before the agents
        return x.movedim(1, 2)[active].movedim(1, 0).unsqueeze(2).movedim(0, 1)
    return x[active].unsqueeze(1)


def _per_agent(x) -> bool:
    return isinstance(x, torch.Tensor) and x.dim() > 1


def test_off_policy_terms_over_active_steps_equal_the_terms_of_those_steps_alone():
    generator = torch.Generator().manual_seed(1)
    k, n, K = 16, 3, 4

    def randn(*shape):
        return torch.randn(*shape, generator=generator)

    active = torch.rand(k, n, generator=generator) > 0.4
    weight = torch.rand(k, generator=generator) + 0.5
    weights = weight[:, None].expand(k, n)[active]  # each kept agent-step keeps its env step's weight
    q, target, q_policy, log_prob = randn(k, 2, n), randn(k, n), randn(k, 2, n), randn(k, n)
    log_alpha = torch.tensor(-1.0)
    log_probs = torch.log_softmax(randn(k, n, K), -1)
    mask = torch.rand(k, n, K, generator=generator) > 0.2
    cases = {  # name: (terms, their arguments)
        "critic_loss": (critic_loss, (q, target, weight)),
        "ddpg": (ddpg_terms, (q[:, :1], target, q_policy[:, 0], weight)),
        "sac": (continuous_terms, (q, target, q_policy, log_prob, log_alpha, -1.0, weight)),
        "discrete sac": (discrete_terms, (q, target, randn(k, 2, n, K), log_probs, mask, log_alpha, -0.5, weight)),
    }
    for name, (terms_of, args) in cases.items():
        masked = terms_of(*args, active=active)
        # The same terms of the active agent-steps alone, each an agent of its own, with its step's weight.
        alone = terms_of(*(weights if x is weight else _selected(x, active) if _per_agent(x) else x for x in args))
        everything = terms_of(*args)
        if not isinstance(masked, dict):
            masked, alone, everything = {"loss": masked}, {"loss": alone}, {"loss": everything}
        for term, value in alone.items():
            assert masked[term].item() == pytest.approx(value.item(), rel=1e-5, abs=1e-6), (name, term)
        assert masked["loss"].item() != pytest.approx(everything["loss"].item(), rel=1e-3), name


# ---- off-policy and value-based learners ---------------------------------------------------------------------


def _loss(trainer: Trainer, index: torch.Tensor):
    algorithm = trainer.algorithm
    noise = algorithm.draw_noise(1, len(index), torch.Generator().manual_seed(0))
    total, terms, priority = algorithm.loss(trainer.buffer.storage, index, None, noise, torch.tensor([0]))
    return total, terms["agent"], priority["agent"]


@pytest.mark.parametrize("algo", ["isac", "iddpg", "iql", "vdn", "masac", "maddpg", "qmix"])
def test_what_a_departed_agent_reads_does_not_reach_the_loss(tmp_path, algo):
    """The loss, its terms and the priorities are the same whatever a departed agent's observations and
    actions read: at the steps after it left, and its next observation from the step it leaves by. Agent-scope
    critics, IQL and VDN's sum see each agent's own data alone; centralised critics (MASAC, MADDPG) and QMIX's
    mixer, which read the other agents' inputs, read zeros in its place."""
    trainer = off_policy(tmp_path, algo)
    trainer.buffer.extend(trainer.collector.collect())
    index = torch.arange(64)
    before = _loss(trainer, index)
    storage, gone = trainer.buffer.storage, ~trainer.buffer.storage[("agent", "active")]
    leaving = storage[("agent", "terminated")] & ~gone  # in at the step, out at its next observation
    assert gone[:64].any() and not gone[:64].all() and leaving[:64].any()
    storage[("agent", "observation")][gone] = 5.0
    storage[("agent", "next_observation")][gone | leaving] = 5.0
    action = storage[("agent", "action")]
    action[gone] = action[gone].flip(0)  # other actions the agents took
    after = _loss(trainer, index)
    for x, y in zip(before, after):
        torch.testing.assert_close(x, y)


def test_what_a_departed_agent_reads_does_not_reach_mappo(tmp_path):
    """MAPPO's centralised critic reads zeros for a departed agent, at the steps after it left and at the
    next observation of the step it leaves by: values, advantages, targets and the update's terms are the
    same whatever it reads there."""
    trainer = on_policy(tmp_path)
    algorithm, critic = trainer.algorithm, trainer.algorithm.learners["agent"].critic
    batch = trainer.collector.collect()
    gone, ended = ~batch["agent", "active"], batch["agent", "terminated"]
    assert (ended & ~gone).any()
    changed = batch.clone()
    changed["agent", "observation"][gone] = 5.0
    changed["agent", "next_observation"][ended] = 5.0
    moments = {k: v.clone() for k, v in critic.state_dict().items()}
    algorithm.advantages(batch)
    critic.load_state_dict(moments)  # the second batch's moments start where the first's did
    algorithm.advantages(changed)
    for key in ("value", "advantage", "value_target"):
        torch.testing.assert_close(changed["agent", key], batch["agent", key])
    terms = [algorithm._minibatch_loss(*algorithm.update_inputs(b), slice(None))[1]["agent"] for b in (batch, changed)]
    torch.testing.assert_close(terms[1], terms[0])


def test_a_centralised_critic_input_reads_zeros_for_a_departed_agent():
    """Group and global scopes: a departed agent's observation and action are zeros in the input every agent's
    critic reads (the env's state is left as it is); scope agent: each agent's own input, as it is."""
    leaving = GroupSpec(["a_0", "a_1"], Box((2,)), Box((1,), -1.0, 1.0), agents_leave=True)
    groups = {"a": leaving, "b": GroupSpec(["b_0"], Box((1,)), Box((1,), -1.0, 1.0))}
    observations = {"a": torch.tensor([[[1.0, 2.0], [3.0, 4.0]]]), "b": torch.tensor([[[5.0]]])}  # B = 1
    actions = {"a": torch.tensor([[[0.5], [0.25]]]), "b": torch.tensor([[[0.75]]])}
    active = {"a": torch.tensor([[True, False]])}  # a_1 has left
    state = torch.tensor([[7.0, 8.0]])
    sizes = {"a": 1, "b": 1}
    expected = {
        "group": [1.0, 2.0, 0.5, 0.0, 0.0, 0.0],
        "global": [1.0, 2.0, 0.5, 0.0, 0.0, 0.0, 5.0, 0.75],
        "state": [7.0, 8.0, 0.5, 0.0, 0.75],
    }
    for name, row in expected.items():
        scope, state_size = ("global", 2) if name == "state" else (name, None)
        seen = CriticInput(scope, "a", groups, state_size, agent_id=False, action_sizes=sizes)
        x = seen(observations, state if state_size else None, actions, active)
        assert x.tolist() == [[row, row]], name  # [B, n, size]: the same input for both agents
        everything = seen(observations, state if state_size else None, actions)
        assert everything[0, 0, 3].item() != 0.0  # without the flags, a_1's own observation
    own = CriticInput("agent", "a", groups, None, agent_id=False, action_sizes=sizes)
    assert own(observations, None, actions, active).tolist() == [[[1.0, 2.0, 0.5], [3.0, 4.0, 0.25]]]


def test_the_next_observation_takes_the_flag_of_the_agents_still_in():
    """`agents_in`: the step's flag for its observation; for its true next observation, the agents not
    terminated by the step (an agent that leaves by the step is out there, though it acted at the step)."""
    data = {
        "agent": {
            "active": torch.tensor([[True, True], [True, False]]),
            "terminated": torch.tensor([[False, True], [False, True]]),
        },
        "other": {"terminated": torch.tensor([[False]])},  # its agents end together: no flag, nothing masked
    }
    assert agents_in(data, ["agent", "other"])["agent"].tolist() == [[True, True], [True, False]]
    assert agents_in(data, ["agent", "other"], next=True).keys() == {"agent"}
    assert agents_in(data, ["agent"], next=True)["agent"].tolist() == [[True, False], [True, False]]


@pytest.mark.parametrize("reduce", ["max", "mean"])
def test_a_priority_is_reduced_over_the_agents_that_acted(reduce):
    buffer = ReplayBuffer(
        {"a": GroupSpec(["a_0", "a_1"], Box((1,)), Box((1,))), "b": GroupSpec(["b_0"], Box((1,)), Box((1,)))},
        4,
        prioritized=Prioritized(reduce=reduce),
    )
    priority = {"a": torch.tensor([[1.0, 9.0], [2.0, 4.0], [0.0, 6.0]]), "b": torch.tensor([[3.0], [5.0], [0.0]])}
    active = {"a": torch.tensor([[True, False], [True, True], [False, False]])}  # b's agents end together
    expected = {"max": [3.0, 5.0, 0.0], "mean": [(1 + 3) / 2, (2 + 4 + 5) / 3, 0.0]}[reduce]
    assert buffer.reduce_priority(priority, active).tolist() == pytest.approx(expected)
    everything = {"max": [9.0, 5.0, 6.0], "mean": [13 / 3, 11 / 3, 2.0]}[reduce]
    assert buffer.reduce_priority(priority).tolist() == pytest.approx(everything)


@pytest.mark.parametrize("algo", ["isac", "vdn"])
def test_a_prioritized_step_sets_the_mean_priority_of_the_agents_that_acted(tmp_path, algo):
    """With --priority-reduce mean a step's priority is the mean TD error of the agents that acted there, not
    lowered by a departed agent's zeroed one (VDN: the team's error)."""
    trainer = off_policy(tmp_path, algo, prioritized=True, priority_reduce="mean", priority_alpha=1.0)
    buffer, algorithm = trainer.buffer, trainer.algorithm
    buffer.extend(trainer.collector.collect())
    algorithm.replay_buffer = buffer
    index = torch.arange(64)
    noise = algorithm.draw_noise(1, len(index), torch.Generator().manual_seed(0))
    _, _, aux = algorithm.step_loss(buffer.storage, index, None, noise, torch.tensor([0]))
    algorithm.after_step(aux)
    error, active = aux[1]["agent"], buffer.storage[("agent", "active")][index]
    expected = [sum(error[i, j].item() for j in range(2) if active[i, j]) / active[i].sum().item() for i in range(64)]
    assert leaves(buffer)[:64].tolist() == pytest.approx([p + buffer.prioritized.eps for p in expected], rel=1e-6)
    if algo == "isac":  # VDN's is the team's error at every agent: its mean over all of them was the team's too
        assert not torch.allclose(error.mean(1).double() + buffer.prioritized.eps, leaves(buffer)[:64])


@pytest.mark.parametrize("algo", ["iql", "vdn", "qmix"])
def test_q_learning_loss_counts_active_agents_only(tmp_path, algo):
    """IQL's TD loss over the active agent-steps; VDN's and QMIX's team value from the active agents' Qs alone
    (a departed agent's Q zeroed, as its Q' already is), against the loss written out."""
    trainer = off_policy(tmp_path, algo, double_q=False, gamma=0.9)
    trainer.buffer.extend(trainer.collector.collect())
    learner, index = trainer.algorithm.learners["agent"], torch.arange(64)
    total, terms, _ = _loss(trainer, index)
    b = trainer.buffer.gather(index)["agent"]
    active = b["active"]
    with torch.no_grad():
        q = learner.policy.net(b["observation"]).gather(-1, b["action"].unsqueeze(-1))[..., 0]  # [k, n]
        next_q = learner.target_q(b["next_observation"]).amax(-1)
        next_q = torch.where(b["terminated"], 0.0, next_q)
        if algo == "iql":
            errors = [
                (q[i, j] - (b["reward"][i, j] + 0.9 * next_q[i, j])) ** 2
                for i in range(64)
                for j in range(2)
                if active[i, j]
            ]
        else:
            q = torch.where(active, q, 0.0)
            reward, ended = b["reward"].mean(1), b["terminated"].all(1)
            if learner.mixer is None:
                value, next_value = q.sum(1), next_q.sum(1)
            else:  # the mixer reads zeros for an agent out: at s' those terminated by the step
                seen = torch.where(active[..., None], b["observation"], 0.0)
                next_seen = torch.where(b["terminated"][..., None], 0.0, b["next_observation"])
                value = learner.mixer(q, seen.flatten(1))
                next_value = learner.target_mixer(next_q, next_seen.flatten(1))
            errors = [(value[i] - (reward[i] + 0.9 * (0.0 if ended[i] else next_value[i]))) ** 2 for i in range(64)]
        expected = sum(errors) / len(errors)
    assert total.item() == pytest.approx(expected.item(), rel=1e-5)
    assert terms[0].item() == pytest.approx(expected.item(), rel=1e-5)


@pytest.mark.parametrize("algo", ["mappo", "masac", "maddpg", "qmix"])
def test_an_update_with_departed_agents_reads_nothing_back_from_the_device(tmp_path, algo):
    if algo == "mappo":
        trainer = on_policy(tmp_path)
        with forbid_host_sync("cpu"):
            batch = trainer.collector.collect()
            trainer.algorithm.update(batch, trainer.timer)
        return
    prioritized = {"prioritized": True, "priority_reduce": "mean"}
    trainer = off_policy(tmp_path, algo, **(prioritized if algo in ("masac", "qmix") else {}))
    trainer.buffer.extend(trainer.collector.collect())
    with forbid_host_sync("cpu"):
        trainer.collector.collect()
        trainer.algorithm.update(trainer.buffer, trainer.timer)


@pytest.mark.parametrize("algo", ["mappo", "masac", "qmix"])
def test_agents_that_end_together_train_as_on_the_unmasked_path_bit_for_bit(tmp_path, monkeypatch, algo):
    """PettingZoo's MPE: the adapter writes `_agent_terminated`, so its data holds `active` (all True there)
    and the learners take the masked path. Parameters, optimiser state and logged terms equal those of the
    same run forced onto the unmasked path (no `active`), bit for bit."""
    pytest.importorskip("mpe2")
    from envs.adapters.pettingzoo import PettingZooEnv
    from envs.base import MultiAgentEnv

    if algo == "mappo":
        config = dataclasses.replace(
            ppo_config(tmp_path), algo=dataclasses.replace(ppo_config(tmp_path).algo, minibatch_size=32)
        )
        config = dataclasses.replace(config, run=dataclasses.replace(config.run, rollout_length=8))
    else:
        config = off_policy_config(tmp_path, algo)
    config = dataclasses.replace(config, env=EnvSettings(env="pettingzoo/mpe2.simple_spread_v3", num_envs=8))

    def trained(name: str):
        trainer = Trainer(config, run_dir=tmp_path / name)
        rows = [trainer.train_iteration() for _ in range(3)]
        rows = [{k: v for k, v in row.items() if not k.endswith("_s")} for row in rows]  # not the timings
        return trainer.algorithm.state_dict(), rows, trainer.env.groups["agent"].agents_leave

    masked = trained("masked")
    monkeypatch.setattr(PettingZooEnv, "_agent_terminated", MultiAgentEnv._agent_terminated)
    unmasked = trained("unmasked")
    assert masked[2] and not unmasked[2]
    torch.testing.assert_close(masked[0], unmasked[0], rtol=0, atol=0)
    for row, other in zip(masked[1], unmasked[1]):
        assert str(row) == str(other)  # NaN (no episode yet) equals itself here


# ---- populations ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("algo", ["mappo", "iql", "isac", "masac", "maddpg", "qmix"])
def test_each_member_with_departed_agents_trains_as_its_single_run(tmp_path, monkeypatch, algo):
    """A population's losses leave departed agents out as its single runs' do: per member its advantages
    normalised over its active steps, its critic's moments, its masked means (in one part of rows), and its
    centralised critics' and mixer's inputs with departed agents zeroed (QMIX: prioritized, the mean over the
    agents that acted)."""
    if algo == "mappo":
        config = ppo_leavers_config(tmp_path)
    else:
        prioritized = {"prioritized": True, "priority_reduce": "mean"} if algo == "qmix" else {}
        config = off_policy_config(tmp_path, algo, env="leavers", **prioritized)
        config = dataclasses.replace(config, env=leavers_settings(8, algo in ("iql", "qmix")))

    def with_run(**run) -> TrainConfig:
        return dataclasses.replace(config, run=dataclasses.replace(config.run, **run))

    batched = Trainer(with_run(seeds=SEEDS), run_dir=tmp_path / "seeds")
    if algo == "mappo":  # rows in parts where they would be (critic passes, and steps but for departed agents)
        monkeypatch.setattr(ppo_seeds, "CHUNK_ROWS", 40)
        monkeypatch.setattr(ppo_seeds, "UPDATE_CHUNK_ROWS", 16)
        batched.algorithm.chunked = True
    singles = [Trainer(with_run(seed=s), run_dir=tmp_path / f"seed{s}") for s in SEEDS]
    for _ in range(2):
        row = batched.train_iteration()
        for member, single in zip(row["members"], singles):
            assert_rows_match(member, single.train_iteration())

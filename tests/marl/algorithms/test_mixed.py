"""Groups of one run on off-policy algorithms of different modules (`marl.algorithms.mixed`): the speaker
of `speaker_listener` (discrete) on Q-learning, the listener (continuous) on SAC or DDPG."""

from __future__ import annotations

import math

import pytest
import torch

from marl.algorithms.mixed import Mixed
from marl.algorithms.qlearning import QLearning
from marl.algorithms.sac import SAC
from marl.app.cli import algorithms_text
from marl.app.trainer import Trainer
from marl.core.replay import gather
from tests.marl.algorithms.offpolicy_checks import assert_repeats, resume_midway, update_without_host_sync
from tests.marl.algorithms.test_offpolicy import small_config


def mixed_config(tmp_path, algo="masac", speaker="iql", **options):
    config = small_config(tmp_path, algo, "speaker_listener", **options)
    return type(config)(**{**vars(config), "group_overrides": {"speaker": {"algo": speaker}}})


@pytest.mark.parametrize(("algo", "speaker"), [("masac", "iql"), ("maddpg", "qmix")])
def test_each_group_trains_with_its_own_algorithm_in_one_step(tmp_path, algo, speaker):
    trainer = Trainer(mixed_config(tmp_path, algo, speaker), run_dir=tmp_path / "run")
    mixed = trainer.algorithm
    assert isinstance(mixed, Mixed) and len(mixed.members) == 2
    assert (
        algorithms_text(trainer.config, trainer.env.groups) == f"{speaker.upper()} (speaker), {algo.upper()} (listener)"
    )
    before = {
        g: [p.detach().clone() for p in t.optimizer.param_groups[0]["params"]] for g, t in mixed.trainables.items()
    }
    rows = [trainer.train_iteration() for _ in range(2)]
    for name in ("loss", "q_value", "td_error", "epsilon", "q_grad_norm", "buffer_fill"):
        assert math.isfinite(rows[-1][f"speaker/{name}"]), name
    for name in ("loss", "critic_loss", "policy_loss", "critic_grad_norm", "buffer_fill"):
        assert math.isfinite(rows[-1][f"listener/{name}"]), name
    assert rows[-1]["speaker/epsilon"] == pytest.approx(0.8 - 0.79 * 64 / (10**5 / 3))  # QConfig's defaults
    assert "speaker/alpha" not in rows[-1] and "listener/epsilon" not in rows[-1]
    for g, t in mixed.trainables.items():  # both algorithms' optimisers stepped
        after = t.optimizer.param_groups[0]["params"]
        assert all(not torch.equal(a, b) for a, b in zip(before[g], after)), g
    # Options the run's algorithm lacks are the group's own; the shared ones are the run's.
    speaker_config = trainer.config.for_group("speaker")[0]
    assert speaker_config.algo == speaker and speaker_config.lr == trainer.config.algo.lr


def test_a_centralised_critic_sees_the_greedy_next_action_of_a_q_learning_group(tmp_path):
    trainer = Trainer(mixed_config(tmp_path), run_dir=tmp_path / "run")
    trainer.buffer.extend(trainer.collector.collect())
    mixed = trainer.algorithm
    index, _ = trainer.buffer.draw(16, trainer.generator, 1.0)
    batch = gather(trainer.buffer.storage, index)
    noise = mixed.draw_noise(1, 16)
    step = torch.zeros(1, dtype=torch.long)
    after = {g: v for m in mixed.members for g, v in m.next_actions(batch, noise, step).items()}
    q_net = mixed.learners["speaker"].policy.net
    q = q_net(batch["speaker"]["next_observation"])  # [16, 1, K]
    greedy = torch.nn.functional.one_hot(q.argmax(-1), q.shape[-1]).float()
    torch.testing.assert_close(after["speaker"][0], greedy, rtol=0, atol=0)
    listener = mixed.learners["listener"]
    seen = listener.critic_input(
        {g: batch[g]["next_observation"] for g in trainer.env.groups}, None, {g: f for g, (f, _) in after.items()}
    )
    assert any(torch.equal(seen[..., i : i + q.shape[-1]], greedy) for i in range(seen.shape[-1] - q.shape[-1] + 1))


def test_a_mixed_update_reads_nothing_back_and_a_resumed_run_continues_exactly(tmp_path):
    update_without_host_sync(mixed_config(tmp_path, prioritized=True, warmup_frames=64), tmp_path / "sync")
    resumed, expected = resume_midway(mixed_config(tmp_path, prioritized=True), tmp_path)
    assert isinstance(resumed.algorithm, Mixed)
    assert_repeats(resumed, expected, ("loss", "alpha", "epsilon", "q_value", "episode_return"))


@pytest.mark.parametrize("options", [{"critic_scope": "group"}, {"shared_value": True}])
def test_the_runs_critic_options_reach_the_actor_critic_groups_not_the_q_learning_one(tmp_path, options):
    # `--algo masac --critic-scope group --group speaker.algo=iql`: the option is for the listener's critic;
    # the speaker's Q-learning has no critic and keeps its defaults instead of refusing an option it was not given.
    trainer = Trainer(mixed_config(tmp_path, **options), run_dir=tmp_path / "run")
    speaker, listener = (trainer.config.for_group(g)[0] for g in ("speaker", "listener"))
    assert (speaker.critic_scope, speaker.shared_value) == ("auto", False)
    assert {name: getattr(listener, name) for name in options} == options
    assert trainer.algorithm.learners["listener"].algo == listener
    # Given for the Q-learning group itself, they are still refused.
    config = mixed_config(tmp_path)
    config = type(config)(**{**vars(config), "group_overrides": {"speaker": {"algo": "iql", **options}}})
    with pytest.raises(ValueError, match="critic.*iql|iql has no critic"):
        config.for_group("speaker")


def test_groups_that_cannot_take_their_algorithm_are_refused_clearly(tmp_path):
    config = small_config(tmp_path, "masac", "speaker_listener")
    bad = {
        (("speaker", "algo", "mappo"),): "the groups of one run all learn on-policy or all off-policy",
        (("speaker", "algo", "nope"),): "unknown algorithm 'nope'",
        (("speaker", "exploration_eps_init", 0.5),): r"unknown field\(s\) \['exploration_eps_init'\]",
    }
    for overrides, message in bad.items():
        groups = {}
        for group, field, value in overrides:
            groups.setdefault(group, {})[field] = value
        with pytest.raises(ValueError, match=message):
            type(config)(**{**vars(config), "group_overrides": groups})
    # The value-based group's own options are accepted once the group takes it.
    ok = type(config)(**{**vars(config), "group_overrides": {"speaker": {"algo": "iql", "exploration_eps_init": 0.5}}})
    assert ok.for_group("speaker")[0].exploration_eps_init == 0.5
    listener_on_iql = type(config)(**{**vars(config), "group_overrides": {"listener": {"algo": "iql"}}})
    with pytest.raises(ValueError, match=r"group 'listener' has Box.*--group listener.algo=masac"):
        Trainer(listener_on_iql, run_dir=tmp_path / "run")
    assert {type(m) for m in Trainer(mixed_config(tmp_path), run_dir=tmp_path / "ok").algorithm.members} == {
        QLearning,
        SAC,
    }


def test_a_critic_sees_each_groups_stored_action_as_the_env_action_it_sent_whichever_algorithm_acted(tmp_path):
    # SAC stores the Gaussian's sample before the tanh, DDPG the env's action: a critic of either reads another
    # group's stored action as that group's algorithm stores it, scaled to [-1, 1] as the env received it.
    config = small_config(tmp_path, "masac", "navigation", group_map="per_agent")
    config = type(config)(**{**vars(config), "group_overrides": {"agent_1": {"algo": "maddpg"}}})
    trainer = Trainer(config, run_dir=tmp_path / "run")
    trainer.algorithm.begin_iteration(0, config.run.total_frames)
    trainer.buffer.extend(trainer.collector.collect())
    mixed = trainer.algorithm
    seen = {}
    for g in ("agent_0", "agent_1"):  # masac's and maddpg's: record what their critics are given
        learner = mixed.learners[g]
        inputs, calls = learner.critic_input, seen.setdefault(g, [])
        learner.critic_input = lambda obs, state, actions, active, inputs=inputs, calls=calls: (
            calls.append(actions) or inputs(obs, state, actions, active)
        )
    index = torch.arange(16)
    mixed.loss(trainer.buffer.storage, index, None, mixed.draw_noise(1, 16), torch.zeros(1, dtype=torch.long))
    batch = gather(trainer.buffer.storage, index)
    low, high = (b.flatten() for b in trainer.env.groups["agent_1"].action.bounds("cpu"))
    sent = {  # the env action each group sent, scaled to [-1, 1]
        "agent_0": torch.tanh(batch["agent_0"]["action"]),
        "agent_1": (batch["agent_1"]["action"] - low) / (high - low) * 2 - 1,
    }
    for g in ("agent_0", "agent_1"):
        stored = seen[g][1]  # the critic's call at the stored actions (after the target's at s')
        for other, expected in sent.items():
            torch.testing.assert_close(stored[other], expected, msg=f"{g}'s critic, {other}'s action")

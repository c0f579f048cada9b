"""Heterogeneous groups: per-group configs, a discrete and a continuous group in one run, critics
that see across groups, and padding."""

import re

import pytest
import torch

import envs
from envs.native.speaker_listener import scripted_actions
from marl.algorithms.ppo import PPOConfig
from marl.app.trainer import Trainer, make_env
from marl.config import EnvSettings, ModelConfig, RunConfig, TrainConfig
from marl.core.models import CriticInput


def config(tmp_path, env="speaker_listener", frames=None, **kwargs) -> TrainConfig:
    run = dict(
        rollout_length=16,
        log_dir=str(tmp_path),
        run_name="run",
        progress=False,
        tensorboard=False,
        checkpoint_every=1000,
    )
    return TrainConfig(
        env=kwargs.pop("env_settings", EnvSettings(env=env, num_envs=32)),
        algo=kwargs.pop("algo", PPOConfig(minibatch_size=256, epochs=2)),
        model=kwargs.pop("model", ModelConfig(hidden=(32, 32))),
        run=RunConfig(total_frames=frames or 32 * 16 * 2, **run),
        **kwargs,
    )


def test_per_group_configs_reach_their_networks(tmp_path):
    trainer = Trainer(
        config(
            tmp_path,
            group_overrides={
                "speaker": {"hidden": (16,), "lr": 3e-3, "activation": "relu", "critic_scope": "agent"},
                "listener": {"activation": "elu"},
            },
        )
    )
    speaker, listener = trainer.algorithm.learners["speaker"], trainer.algorithm.learners["listener"]
    assert [m.out_features for m in speaker.policy.net.layers if hasattr(m, "out_features")] == [16, 3]
    assert isinstance(speaker.policy.net.layers[1], torch.nn.ReLU)
    assert isinstance(listener.policy.net.layers[1], torch.nn.ELU)
    assert speaker.optimizer.param_groups[0]["lr"] == 3e-3 and listener.optimizer.param_groups[0]["lr"] == 1e-3
    assert speaker.critic_input.scope == "agent" and listener.critic_input.scope == "global"
    # The listener's critic sees every group: speaker (3) + listener (11) observations, and its one agent's id.
    assert listener.critic_input.size == 3 + 11 + 1
    predators = Trainer(config(tmp_path, env="tag", group_overrides={"predator": {"share_params": False}}))
    learners = predators.algorithm.learners
    assert not learners["predator"].policy.net.share_params and learners["prey"].policy.net.share_params


def test_share_params_on_groups_of_one_agent_is_refused_for_a_new_run(tmp_path, monkeypatch, capsys):
    """A group of one agent has no network to share: its own `share_params` is refused, and the run's
    `--no-share-params` where every group has one agent (as `--std` where every group is discrete); tag's
    predators (3) take the run's. A checkpoint that holds one (of an earlier version) resumes as trained."""
    from marl.app import trainer as trainer_module
    from marl.app.cli import main

    with pytest.raises(
        ValueError, match=r"^--group prey\.share_params=False: group 'prey' has one agent, with nothing "
    ):
        Trainer(config(tmp_path, env="tag", group_overrides={"prey": {"share_params": False}}))
    alone = config(tmp_path, model=ModelConfig(hidden=(32, 32), share_params=False))
    message = (
        "--no-share-params: speaker_listener's groups (speaker, listener) have one agent each, with nothing to "
        "share: it applies to groups of several agents: leave it out"
    )
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        Trainer(alone)
    assert main(["train", "--env", "speaker_listener", "--no-share-params", "--log-dir", str(tmp_path)]) == 2
    assert capsys.readouterr().err == f"marl train: error: {message}\n"
    Trainer(config(tmp_path, env="tag", model=ModelConfig(hidden=(32, 32), share_params=False)))
    with monkeypatch.context() as patched:  # a checkpoint of an earlier version, which took it
        patched.setattr(trainer_module, "check_share_params_used", lambda config, groups: None)
        earlier = Trainer(alone, run_dir=tmp_path / "earlier")
        earlier.save()
    Trainer.resume(tmp_path / "earlier" / "checkpoint.pt").train_iteration()


def test_global_critic_input_shapes():
    env = envs.make("tag", num_envs=5, seed=0)  # predators see 16 numbers, the prey 14
    groups = env.groups
    obs = env.reset()
    observations = {g: obs[g, "observation"] for g in groups}
    sizes = {g: s.observation.shape[0] for g, s in groups.items()}
    assert sizes == {"predator": 16, "prey": 14}
    total = 3 * 16 + 1 * 14
    for group, n in (("predator", 3), ("prey", 1)):
        build = CriticInput("global", group, groups, state_size=None, agent_id=True)
        x = build(observations, None)
        # Every agent of the group sees the same observations of everyone (once), then its own one-hot id.
        assert x.shape == (5, 1, total) and build.size == total + n and build.agent_ids == n
        torch.testing.assert_close(
            x[:, 0], torch.cat([observations["predator"].flatten(1), observations["prey"].flatten(1)], -1)
        )
        separate = CriticInput("global", group, groups, state_size=None, agent_id=False)
        assert separate(observations, None).shape == (5, n, total) and separate.agent_ids == 0
    local = CriticInput("agent", "prey", groups, state_size=None, agent_id=True)
    assert local(observations, None).shape == (5, 1, 14) and local.agent_ids == 0
    time_major = {g: o.expand(7, *o.shape) for g, o in observations.items()}
    assert CriticInput("group", "predator", groups, None, True)(time_major, None).shape == (7, 5, 1, 3 * 16)


def test_discrete_and_continuous_groups_train_in_one_run(tmp_path):
    trainer = Trainer(config(tmp_path))
    before = {g: [p.detach().clone() for p in lr.policy.parameters()] for g, lr in trainer.algorithm.learners.items()}
    rows = trainer.train()
    assert {g: type(s.action).__name__ for g, s in trainer.env.groups.items()} == {
        "speaker": "Discrete",
        "listener": "Box",
    }
    for g, learner in trainer.algorithm.learners.items():
        assert any(not torch.equal(a, b) for a, b in zip(before[g], learner.policy.parameters())), g
        assert rows[-1][f"{g}/loss"] == rows[-1][f"{g}/loss"]  # finite, not NaN


def test_all_in_one_needs_padding_on_heterogeneous_envs(tmp_path):
    with pytest.raises(ValueError, match=r"cannot stack agent 'predator_0'.*pad=True, marl train --pad\)$"):
        make_env(config(tmp_path, env_settings=EnvSettings(env="tag", num_envs=16, group_map="all_in_one")), "cpu")
    # Speaker and listener act differently: padding cannot help.
    with pytest.raises(ValueError, match="cannot stack agent 'speaker_0'.*keep them in separate groups$"):
        make_env(
            config(
                tmp_path,
                env_settings=EnvSettings(env="speaker_listener", num_envs=16, group_map="all_in_one", pad=True),
            ),
            "cpu",
        )
    padded = make_env(
        config(tmp_path, env_settings=EnvSettings(env="tag", num_envs=16, group_map="all_in_one", pad=True)), "cpu"
    )
    assert list(padded.groups) == ["agents"] and padded.groups["agents"].observation.shape == (16 + 2,)
    envs.check_env(padded)


def test_padded_team_trains_as_one_group(tmp_path):
    trainer = Trainer(
        config(tmp_path, env_settings=EnvSettings(env="tag", num_envs=32, group_map="all_in_one", pad=True))
    )
    rows = trainer.train()
    assert list(trainer.algorithm.learners) == ["agents"] and len(rows) == 2


def mean_return(env, act, steps=25) -> float:
    obs = env.reset(seed=99)
    total = torch.zeros(env.num_envs)
    for _ in range(steps):
        next_td, obs = env.step(act(obs))
        total += next_td["listener", "reward"][:, 0, 0]
    return total.mean().item()


def test_short_heterogeneous_training_improves_on_random(tmp_path):
    trainer = Trainer(
        config(
            tmp_path,
            frames=64 * 25 * 60,
            env_settings=EnvSettings(env="speaker_listener", num_envs=64),
            algo=PPOConfig(minibatch_size=800, epochs=4, lr=1e-3, entropy_coef=0.01),
            model=ModelConfig(hidden=(64, 64)),
        )
    )
    trainer.train()
    env = envs.make("speaker_listener", num_envs=512, seed=3)
    policies = {g: lr.policy for g, lr in trainer.algorithm.learners.items()}

    def trained(obs):
        with torch.no_grad():
            return {g: (d := p(obs[g, "observation"])).env_action(d.mode()) for g, p in policies.items()}

    generator = torch.Generator().manual_seed(0)
    learned = mean_return(env, trained)
    random = mean_return(env, lambda obs: env.sample_actions(generator))
    scripted = mean_return(env, scripted_actions)
    assert learned > random + 0.4 * (scripted - random), (learned, random, scripted)


def test_unknown_groups_in_overrides_are_errors_naming_the_groups(tmp_path):
    with pytest.raises(
        ValueError,
        match=r"unknown group\(s\) \['speakr'\] in the per-group overrides; .* are \['listener', 'speaker'\]",
    ):
        Trainer(config(tmp_path, group_overrides={"speakr": {"lr": 1e-3}}))
    # After the group map: `all_in_one` puts tag's agents in one group, `agents`.
    padded = EnvSettings(env="tag", num_envs=32, group_map="all_in_one", pad=True)
    with pytest.raises(ValueError, match=r"\['predator'\] .* are \['agents'\]"):
        Trainer(config(tmp_path, env_settings=padded, group_overrides={"predator": {"lr": 1e-3}}))
    Trainer(config(tmp_path, env_settings=padded, group_overrides={"agents": {"lr": 1e-3}}))


def test_the_cli_reports_an_unknown_group_in_one_line(tmp_path, capsys):
    from marl.app.cli import main

    argv = ["train", "--env", "speaker_listener", "--group", "foo.lr=3e-4", "--log-dir", str(tmp_path)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "marl train: error: unknown group(s) ['foo']" in err and "['listener', 'speaker']" in err
    assert "Traceback" not in err


def test_a_box_that_is_not_float32_is_refused_when_the_env_is_built(tmp_path, monkeypatch):
    # check_env accepts a float64 Box; training then failed inside torch ("mat1 and mat2 must have the same
    # dtype" for an observation, index_copy_ of the log-probs for an action).
    from envs import registry
    from tests.envs.broken_envs import Counter

    class Float64Observation(Counter):
        def _make_groups(self):
            groups = super()._make_groups()
            spec = groups["mover"]
            groups["mover"] = envs.GroupSpec(spec.agents, envs.Box((2,), dtype=torch.float64), spec.action)
            return groups

        def _observe(self):
            return {**super()._observe(), "mover": super()._observe()["mover"].double()}

    class Float64Action(Counter):
        def _make_groups(self):
            groups = super()._make_groups()
            spec = groups["mover"]
            groups["mover"] = envs.GroupSpec(spec.agents, spec.observation, envs.Box((1,), -1.0, 1.0, torch.float64))
            return groups

        def _step(self, action):
            return super()._step({**action, "mover": action["mover"].float()})  # the toy steps in float32

    for name, cls, what in [
        ("float64_observation", Float64Observation, "group 'mover''s observation"),
        ("float64_action", Float64Action, "group 'mover''s action"),
    ]:
        monkeypatch.setitem(registry._ENVS, name, cls)
        envs.check_env(envs.make(name, num_envs=4, seed=0))  # a valid env, just not a trainable one
        with pytest.raises(ValueError, match=f"{what} is a torch.float64 Box, but marl trains in float32"):
            Trainer(config(tmp_path, env_settings=EnvSettings(env=name, num_envs=16)))


@pytest.mark.parametrize("shape", [(), (1, 1)], ids=["scalar", "2-d"])
def test_a_box_action_that_is_not_1d_is_refused_when_the_env_is_built(tmp_path, monkeypatch, shape):
    # check_env accepts a Box action of any rank; training then failed at the first step, blaming the policy:
    # "the acting policy's distribution sampled a torch.float32 action of shape (16, 2, 1), expected (16, 2)".
    from envs import registry
    from tests.envs.broken_envs import Counter

    class ShapedAction(Counter):
        def _make_groups(self):
            groups = super()._make_groups()
            spec = groups["mover"]
            groups["mover"] = envs.GroupSpec(spec.agents, spec.observation, envs.Box(shape, -1.0, 1.0))
            return groups

        def _step(self, action):
            return super()._step({**action, "mover": action["mover"].reshape(self.num_envs, -1, 1)})

    monkeypatch.setitem(registry._ENVS, "shaped_action", ShapedAction)
    envs.check_env(envs.make("shaped_action", num_envs=4, seed=0))  # a valid env, just not a trainable one
    with pytest.raises(
        ValueError, match=rf"group 'mover''s action is a Box of shape {re.escape(str(shape))}, .* \(1,\)"
    ):
        Trainer(config(tmp_path, env_settings=EnvSettings(env="shaped_action", num_envs=16)))

"""Recurrent IQL, VDN and QMIX (`--model gru`): chunks drawn from the replay buffer against a loop over the
steps written, the unrolled Q values against those acted on, resets inside a chunk, no host sync, resume,
eval and the refused options."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from tensordict import TensorDict

from envs.specs import Box, Discrete, GroupSpec
from marl import algorithms
from marl.algorithms.qlearning import QConfig, RecurrentQ, gather_chunks
from marl.app.evaluate import evaluate
from marl.app.trainer import Trainer
from marl.config import EnvSettings, ModelConfig, RunConfig, TrainConfig
from marl.core.replay import Prioritized, ReplayBuffer
from tests.marl.algorithms.offpolicy_checks import assert_repeats, resume_midway, update_without_host_sync
from tests.marl.algorithms.test_recurrent import stagger_episodes

T, B = 12, 8  # rollout length, envs


def gru_q_config(tmp_path, algo: str = "vdn", share_params: bool = True, **options) -> TrainConfig:
    options = {"batch_size": 32, "updates_per_iteration": 3, "buffer_size": 400, "chunk_length": 4, **options}
    return TrainConfig(
        env=EnvSettings(env="spread", num_envs=B, env_options={"max_steps": 7}),
        algo=algorithms.config_class(algo)(algo=algo, **options),
        model=ModelConfig(hidden=(16,), model="gru", gru_hidden=8, share_params=share_params),
        run=RunConfig(
            total_frames=10**5,
            rollout_length=T,
            device="cpu",
            progress=False,
            tensorboard=False,
            log_dir=str(tmp_path),
            save_buffer=True,
        ),
    )


# ---- chunks against a loop over the steps written ----------------------------------------------------


def marked_buffer(capacity: int, rollouts: int) -> tuple[ReplayBuffer, list[tuple[int, int]]]:
    """A buffer of one agent extended with `rollouts` `[T, B]` rollouts whose reward marks each step as
    `time * B + env`, and the (time, env) of the steps it holds, by a loop over the steps written."""
    spec = GroupSpec(["a_0"], Box((1,)), Discrete(2))
    buffer = ReplayBuffer({"a": spec}, capacity, hidden={"a": (1, 2)})
    written = []
    for r in range(rollouts):
        time = torch.arange(r * T, (r + 1) * T).view(T, 1)
        mark = (time * B + torch.arange(B)).float()  # [T, B]
        data = {key[-1]: torch.zeros(T, B, *shape, dtype=dtype) for key, (shape, dtype) in buffer.layout.items()}
        data["reward"] = mark.view(T, B, 1)
        group = {k: data.pop(k) for k in [k for (*g, k) in buffer.layout if g == ["a"]]}
        buffer.extend(TensorDict({"a": group, **data}, batch_size=[T, B]))
        written += [(t, e) for t in range(r * T, (r + 1) * T) for e in range(B)]  # time-major, as extended
    return buffer, written[-capacity:]


@pytest.mark.parametrize("capacity, rollouts", [(500, 2), (93, 3), (93, 7)], ids=["filling", "wrapped", "wrapped_more"])
def test_chunks_are_consecutive_steps_of_one_env_and_never_cross_the_write_position(capacity, rollouts):
    buffer, stored = marked_buffer(capacity, rollouts)
    length = 5
    held = set(stored)
    whole = {(t, e) for t, e in stored if all((t + j, e) in held for j in range(length))}  # the reference
    slots = buffer.draw_chunks(4000, length, B, torch.Generator().manual_seed(0))  # [length, 4000]
    mark = buffer.storage[("a", "reward")][slots, 0].long()  # [length, 4000]
    time, env = mark // B, mark % B
    assert (env == env[0]).all() and torch.equal(time - time[0], torch.arange(length).view(-1, 1).expand_as(time))
    starts = set(zip(time[0].tolist(), env[0].tolist()))
    assert starts == whole  # every whole chunk drawn (4000 draws over at most 240), none other


def test_chunk_draws_refuse_what_the_buffer_cannot_hold():
    buffer, _ = marked_buffer(93, 1)  # 93 slots, 12 steps of 8 envs written: 93 held
    with pytest.raises(ValueError, match=r"a chunk of 13 steps of one env spans 97 slots \(8 envs per step\), more"):
        buffer.draw_chunks(4, 13, B)
    with pytest.raises(ValueError, match="length must be a positive int, got 0"):
        buffer.draw_chunks(4, 0, B)
    spec = GroupSpec(["a_0"], Box((1,)), Discrete(2))
    with pytest.raises(ValueError, match="chunks are drawn uniformly; this buffer is prioritized"):
        ReplayBuffer({"a": spec}, 8, prioritized=Prioritized()).draw_chunks(1, 1, 1)


# ---- the unroll against acting ---------------------------------------------------------------------------


class Recorder(torch.nn.Module):
    """An acting policy that records the Q values it acts on, `[B, n, A]` per step."""

    def __init__(self, policy) -> None:
        super().__init__()
        self.policy, self.values = policy, []

    def forward(self, observation, action_mask=None, hidden=None):
        dist, hidden = self.policy(observation, action_mask, hidden)
        self.values.append(dist.q)
        return dist, hidden


@pytest.mark.parametrize(
    "share_params, burn_in", [(True, 0), (True, 3), (False, 3)], ids=["shared", "shared_burn_in", "per_agent_burn_in"]
)
def test_unrolled_q_values_are_exactly_those_acted_on(tmp_path, share_params, burn_in):
    trainer = Trainer(gru_q_config(tmp_path, share_params=share_params, burn_in=burn_in), run_dir=tmp_path / "run")
    stagger_episodes(trainer)
    trainer.train_iteration()  # weights moved from their start; the states carried into the next rollout are not 0
    algorithm, collector = trainer.algorithm, trainer.collector
    recorder = collector.policies["agent"] = Recorder(algorithm.learners["agent"].policy)
    buffer = ReplayBuffer.for_env(trainer.env, 4 * T * B, hidden=algorithm.acting_hidden())
    buffer.extend(collector.collect())  # slot t * B + e is step t of env e
    acted = torch.stack(recorder.values).flatten(0, 1)  # [T * B, n, A]
    index = buffer.draw_chunks(20, burn_in + 4, B, torch.Generator().manual_seed(0))  # [W, 20]
    main, window = gather_chunks(buffer.storage, index, burn_in)
    assert window["is_init"].any() and not window["is_init"].all()  # episodes start inside some chunks
    lr = algorithm.learners["agent"]
    with torch.no_grad():
        values, _ = algorithm._unrolled_values(lr, "agent", main, window, index.shape)
    assert values.shape == (4 * 20, 3, 5)
    if share_params:
        assert torch.equal(values, acted[index[burn_in:].flatten()])
    else:  # MKL's batched matmul (per-agent weights) may round a row by its position in the batch: 1 ulp
        torch.testing.assert_close(values, acted[index[burn_in:].flatten()], rtol=0, atol=1e-6)
    # The match needs the stored states: the same chunks unrolled from zero states do not match.
    window["agent"]["hidden"] = torch.zeros_like(window["agent"]["hidden"])
    with torch.no_grad():
        from_zero, _ = algorithm._unrolled_values(lr, "agent", main, window, index.shape)
    assert (from_zero - values).abs().max() > 1e-3


def test_a_reset_inside_a_chunk_zeroes_the_state_of_that_chunk_only():
    net = RecurrentQ(3, 4, 2, (8,), "tanh", True, gru_hidden=5)
    W, C, burn_in = 6, 3, 2
    x, h0 = torch.randn(W, C, 2, 3), torch.randn(C, 2, 5)
    reset = torch.zeros(W, C, dtype=torch.bool)
    reset[4, 1] = True  # chunk 1's episode starts at its step 4
    with torch.no_grad():
        states = net.unroll(x, h0, reset, burn_in)  # [W - burn_in, C, 2, 5]
        expected = torch.empty_like(states)
        for c in range(C):  # the reference: each chunk alone, a step at a time
            h = h0[c : c + 1]
            for t in range(W):
                h = net.gru(x[t, c : c + 1], torch.zeros_like(h) if reset[t, c] else h)
                if t >= burn_in:
                    expected[t - burn_in, c] = h[0]
        unreset = net.unroll(x, h0, torch.zeros_like(reset), burn_in)
    torch.testing.assert_close(states, expected, rtol=1e-6, atol=1e-6)
    assert torch.equal(states[:, [0, 2]], unreset[:, [0, 2]])  # the other chunks are untouched
    assert torch.equal(states[:2, 1], unreset[:2, 1]) and (states[2:, 1] - unreset[2:, 1]).abs().max() > 1e-3


# ---- runs ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("algo", ["qmix", "iql"])
def test_a_recurrent_update_reads_nothing_back_from_the_device(tmp_path, algo):
    update_without_host_sync(gru_q_config(tmp_path, algo, burn_in=2, warmup_frames=64), tmp_path / "run")


def test_a_resumed_recurrent_run_continues_exactly_and_evaluates(tmp_path):
    config = gru_q_config(tmp_path, "qmix", burn_in=2, target_update="hard", target_update_every=4)
    resumed, expected = resume_midway(config, tmp_path)
    assert resumed.collector.hidden["agent"].abs().sum() > 0  # the saved acting states came back
    assert resumed.buffer.storage[("agent", "hidden")].abs().sum() > 0  # and the stored ones
    assert_repeats(resumed, expected, ("loss", "q_value", "q_total", "td_error", "epsilon", "episode_return"))
    result = evaluate(str(resumed.save()), episodes=4, device="cpu")
    assert result["episodes"] == 4 and math.isfinite(result["returns"]["agent"]["mean"])


def test_options_recurrent_chunks_cannot_serve_are_refused(tmp_path):
    cases = [
        ({"prioritized": True}, "Q-learning draws chunks of steps uniformly"),
        (
            {"chunk_length": 10, "burn_in": 3},
            r"a chunk with its burn-in is 13 steps of one env .*\(rollout_length 12\)",
        ),
        ({"batch_size": 2}, r"batch_size \(2\) .* less than one chunk \(chunk_length 4\)"),
        ({"buffer_size": 24, "batch_size": 24}, r"spans 25 slots of the buffer .* more than buffer_size \(24\)"),
    ]
    for options, message in cases:
        with pytest.raises(ValueError, match=message):
            gru_q_config(tmp_path, **options)
    with pytest.raises(ValueError, match="burn_in must be >= 0"):
        QConfig(burn_in=-1)
    with pytest.raises(ValueError, match=r"group 'agent' has n_step 3; Q-learning on chunks takes TD\(0\) targets"):
        Trainer(gru_q_config(tmp_path, n_step=3), run_dir=tmp_path / "n_step")
    mixed = dataclasses.replace(
        gru_q_config(tmp_path),
        env=EnvSettings(env="speaker_listener", num_envs=B),
        algo=algorithms.config_class("masac")(algo="masac", batch_size=32, buffer_size=400),
        model=ModelConfig(hidden=(16,)),
        group_overrides={"speaker": {"algo": "iql", "model": "gru"}},
    )
    with pytest.raises(ValueError, match=r"group\(s\) \['speaker'\] train Q-learning on chunks of steps, which a run"):
        Trainer(mixed, run_dir=tmp_path / "mixed")

"""marl.fused_step: the compiled update's one-graph minibatch step does what the eager update does
(autograd, per-net clipping, FusedAdam), here run eagerly on two groups with different settings."""

import torch

from marl.config import AlgoConfig, EnvSettings, ModelConfig, RunConfig, TrainConfig
from marl.fused_step import FusedUpdateStep
from marl.trainer import LOSS_TERMS, Trainer


def config(tmp_path) -> TrainConfig:
    return TrainConfig(
        env=EnvSettings(env="speaker_listener", num_envs=16),
        algo=AlgoConfig(minibatch_size=128, epochs=2, lr_schedule="linear", max_grad_norm=0.05),
        model=ModelConfig(hidden=(16, 16)),
        run=RunConfig(total_frames=16 * 16 * 4, rollout_length=16, log_dir=str(tmp_path), progress=False),
        # A discrete and a continuous group; one without clipping, one with its own lr and Adam eps.
        group_overrides={"speaker": {"max_grad_norm": 0.0, "lr": 1e-3}, "listener": {"adam_eps": 1e-6}},
    )


def test_fused_step_equals_the_eager_update(tmp_path):
    trainers = [Trainer(config(tmp_path), run_dir=tmp_path / name) for name in ("eager", "fused")]
    eager, fused = trainers
    learners = fused.learners
    fused._fused_step = FusedUpdateStep(
        {g: {"policy": lr.policy, "critic": lr.critic} for g, lr in learners.items()},
        {g: lr.optimizer for g, lr in learners.items()},
        {g: lr.algo.max_grad_norm for g, lr in learners.items()},
        fused._minibatch_loss_eager,
        fused.device,
        compile=False,
    )
    for iteration in range(2):
        terms = []
        for trainer in trainers:
            trainer.frames = iteration * trainer.frames_per_iteration  # the annealed lr differs per iteration
            trainer._set_learning_rates()
            buffer = trainer.collector.collect()
            trainer.compute_advantages(buffer)
            terms.append(trainer.update(buffer))
        for g in learners:
            for name in (*LOSS_TERMS, "policy_grad_norm", "critic_grad_norm"):
                torch.testing.assert_close(terms[0][g][name], terms[1][g][name], rtol=1e-4, atol=1e-6)
            for net in ("policy", "critic"):
                ours = getattr(fused.learners[g], net).parameters()
                for a, b in zip(getattr(eager.learners[g], net).parameters(), ours, strict=True):
                    torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
            state = fused.learners[g].optimizer.state_dict()["state"]
            assert all(s["step"].item() == (iteration + 1) * 4 for s in state.values())
    # The clipped group's norms are recorded; the unclipped one's stay zero, as in the eager update.
    assert terms[1]["listener"]["policy_grad_norm"] > 0
    assert terms[1]["speaker"]["policy_grad_norm"] == 0

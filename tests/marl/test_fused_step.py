"""marl.fused_step: the compiled update's one-graph minibatch step does what the eager update does
(autograd, per-net clipping, FusedAdam), here run eagerly on two groups with different settings."""

import pytest
import torch

from marl.config import AlgoConfig, EnvSettings, ModelConfig, RunConfig, TrainConfig
from marl.fused_step import NETS, FusedUpdateStep, _adam_, adam_step_scalars
from marl.trainer import LOSS_TERMS, Trainer


def config(tmp_path) -> TrainConfig:
    return TrainConfig(
        env=EnvSettings(env="speaker_listener", num_envs=16),
        algo=AlgoConfig(minibatch_size=128, epochs=2, lr_schedule="linear", max_grad_norm=0.05),
        model=ModelConfig(hidden=(16, 16)),
        run=RunConfig(total_frames=16 * 16 * 10, rollout_length=16, log_dir=str(tmp_path), progress=False),
        # A discrete and a continuous group; one without clipping, one with its own lr and Adam eps.
        group_overrides={"speaker": {"max_grad_norm": 0.0, "lr": 1e-3}, "listener": {"adam_eps": 1e-6}},
    )


def test_fused_step_equals_the_eager_update(tmp_path):
    trainers = [Trainer(config(tmp_path), run_dir=tmp_path / name) for name in ("eager", "fused")]
    eager, fused = trainers
    learners = fused.learners
    fused._fused_step = FusedUpdateStep(learners, fused._minibatch_loss_eager, fused.device, compile=False)
    # 10 iterations: a systematic difference (Adam's scalars in float32) grew past the tolerance by then.
    for iteration in range(10):
        terms = []
        for trainer in trainers:
            trainer.frames = iteration * trainer.frames_per_iteration  # the annealed lr differs per iteration
            trainer._set_learning_rates()
            buffer = trainer.collector.collect()
            trainer.compute_advantages(buffer)
            terms.append(trainer.update(buffer))
        for g in learners:
            for name in (*LOSS_TERMS, "policy_grad_norm", "critic_grad_norm"):
                torch.testing.assert_close(terms[0][g][name], terms[1][g][name], rtol=1e-5, atol=1e-6, equal_nan=True)
            for net in ("policy", "critic"):
                ours = getattr(fused.learners[g], net).parameters()
                for a, b in zip(getattr(eager.learners[g], net).parameters(), ours, strict=True):
                    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
            state = fused.learners[g].optimizer.state_dict()["state"]
            assert all(s["step"].item() == (iteration + 1) * 4 for s in state.values())
    # The clipped group's norms are recorded; the unclipped one's are not measured: NaN, as in the eager update.
    assert terms[1]["listener"]["policy_grad_norm"] > 0
    assert terms[1]["speaker"]["policy_grad_norm"].isnan()


def test_a_policy_step_then_a_critic_step_equal_the_step_of_both(tmp_path):
    """The step split by net (so the critics' steps can run apart from the policies') trains the same
    parameters, Adam state and loss terms as the one step of both nets, over several iterations."""
    both, apart = (Trainer(config(tmp_path), run_dir=tmp_path / name) for name in ("both", "apart"))
    runs = [
        (both, [FusedUpdateStep(both.learners, both._minibatch_loss_eager, both.device, compile=False)]),
        (
            apart,
            [FusedUpdateStep(apart.learners, apart._minibatch_loss_eager, apart.device, False, (net,)) for net in NETS],
        ),
    ]
    for _ in range(3):
        sums = []
        for trainer, steps in runs:
            buffer = trainer.collector.collect()
            trainer.compute_advantages(buffer)
            flat, state = trainer.update_inputs(buffer)
            sums.append({g: torch.zeros(len(LOSS_TERMS) + 2) for g in flat})
            for start in (0, 128):
                for step in steps:
                    step(flat, state, torch.arange(start, start + 128), sums[-1])
        for g in both.learners:
            torch.testing.assert_close(sums[0][g], sums[1][g], rtol=1e-6, atol=1e-7)
            for net in NETS:
                for a, b in zip(
                    getattr(both.learners[g], net).parameters(), getattr(apart.learners[g], net).parameters()
                ):
                    torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
            for a, b in zip(*(t.learners[g].optimizer.state_lists() for t in (both, apart))):
                torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
    assert sums[1]["listener"][len(LOSS_TERMS) :].min() > 0  # both nets' norms, each from its own step


def test_the_step_names_the_nets_it_can_train(tmp_path):
    trainer = Trainer(config(tmp_path), run_dir=tmp_path / "run")
    for nets in ((), ("value",), ("critic", "policy")):
        with pytest.raises(ValueError, match=r"nets must be some of \('policy', 'critic'\)"):
            FusedUpdateStep(trainer.learners, trainer._minibatch_loss_eager, trainer.device, False, nets)


def test_written_out_adam_follows_torchs_fused_adam_over_many_steps():
    """`_adam_` with `adam_step_scalars` against `torch.optim.Adam(fused=True)` over 1000 annealed steps:
    no systematic drift (computing the lr and `beta ** step` in float32 drifted here past the tolerance)."""
    generator = torch.Generator().manual_seed(0)
    params = [torch.randn(64, 64, generator=generator), torch.randn(64, generator=generator)]
    reference = [p.clone().requires_grad_() for p in params]
    optimizer = torch.optim.Adam(reference, lr=2.5e-4, eps=1e-5, fused=True)
    ours = [p.clone() for p in params]
    exp_avgs, exp_avg_sqs = [torch.zeros_like(p) for p in ours], [torch.zeros_like(p) for p in ours]
    steps = torch.zeros(len(ours))
    for step in range(1000):
        grads = [torch.randn(p.shape, generator=generator) * 1e-3 for p in params]
        optimizer.param_groups[0]["lr"] = 2.5e-4 * (1 - step / 1000)
        for p, g in zip(reference, grads):
            p.grad = g.clone()
        optimizer.step()
        steps.add_(1)
        scalars = adam_step_scalars(steps, optimizer.param_groups[0]["lr"], 0.9, 0.999)
        _adam_(ours, grads, exp_avgs, exp_avg_sqs, *scalars, 0.9, 0.999, 1e-5)
    for a, b in zip(reference, ours):
        torch.testing.assert_close(a.detach(), b, rtol=0, atol=2e-7)


def test_the_step_compiles_in_one_trace(tmp_path):
    """The compiled step is traced once. A Python float met while tracing (the critic's float64 target
    count was one, reached by `functional_call`'s search for tied weights) becomes a symbol that
    AOTAutograd specialises by restarting the whole trace: ~3 s more of compiling with a cold cache."""
    torch._dynamo.reset()
    trainer = Trainer(config(tmp_path), run_dir=tmp_path / "run")
    traces = []

    def counting_aot_eager(graph, example_inputs):  # AOTAutograd's passes without Inductor's codegen
        traces.append(graph)
        return torch._dynamo.lookup_backend("aot_eager")(graph, example_inputs)

    step = FusedUpdateStep(trainer.learners, trainer._minibatch_loss_eager, trainer.device, compile=False)
    step._step = torch.compile(step._step_eager, backend=counting_aot_eager, dynamic=False)
    buffer = trainer.collector.collect()
    trainer.compute_advantages(buffer)
    flat, state = trainer.update_inputs(buffer)
    sums = {g: torch.zeros(len(LOSS_TERMS) + 2) for g in flat}
    step(flat, state, torch.arange(128), sums)
    assert len(traces) == 1

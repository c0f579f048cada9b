"""marl.optim.update_step: the compiled one-graph step does what the eager step does (autograd, per-net
clipping, torch's fused Adam), here run eagerly on two groups with different settings; a step of some of
the nets, then of the others, does what the step of all of them does."""

import pytest
import torch

from marl.algorithms.ppo import LOSS_TERMS, PPOConfig
from marl.app.distributed import World
from marl.app.trainer import Trainer
from marl.config import EnvSettings, ModelConfig, RunConfig, TrainConfig
from marl.core.members import clip_members_, member_lr_step
from marl.optim.update_step import Trainable, UpdateStep, _adam_, _scaled, adam, adam_step_scalars, clip_factors


def config(tmp_path) -> TrainConfig:
    return TrainConfig(
        env=EnvSettings(env="speaker_listener", num_envs=16),
        algo=PPOConfig(minibatch_size=128, epochs=2, lr_schedule="linear", max_grad_norm=0.05),
        model=ModelConfig(hidden=(16, 16)),
        run=RunConfig(total_frames=16 * 16 * 10, rollout_length=16, log_dir=str(tmp_path), progress=False),
        # A discrete and a continuous group; one without clipping, one with its own lr and Adam eps.
        group_overrides={"speaker": {"max_grad_norm": 0.0, "lr": 1e-3}, "listener": {"adam_eps": 1e-6}},
    )


def fused_step(trainer: Trainer, nets: tuple[str, ...] | None = None) -> UpdateStep:
    """The trainer's update step (of `nets`) taken as the compiled one is, but run eagerly (no compiling
    in a test)."""
    step = trainer.algorithm.step
    fused = UpdateStep(step.trainables, step.loss, trainer.device, trainer.world, compile=True, nets=nets)
    fused._fused_step = fused._fused_step_eager
    return fused


def test_fused_step_equals_the_eager_update(tmp_path):
    trainers = [Trainer(config(tmp_path), run_dir=tmp_path / name) for name in ("eager", "fused")]
    eager, fused = trainers
    assert not eager.algorithm.step.fused
    fused.algorithm.step = fused_step(fused)
    learners = fused.algorithm.learners
    # 10 iterations: a systematic difference (Adam's scalars in float32) grew past the tolerance by then.
    for iteration in range(10):
        terms = []
        for trainer in trainers:
            frames = iteration * trainer.frames_per_iteration  # the annealed lr differs per iteration
            trainer.algorithm.begin_iteration(frames, trainer.config.run.total_frames)
            buffer = trainer.collector.collect()
            trainer.algorithm.advantages(buffer)
            terms.append(trainer.algorithm.epochs(buffer))
        for g in learners:
            for name in (*LOSS_TERMS, "policy_grad_norm", "critic_grad_norm"):
                torch.testing.assert_close(terms[0][g][name], terms[1][g][name], rtol=1e-5, atol=1e-6, equal_nan=True)
            for net in ("policy", "critic"):
                ours = getattr(fused.algorithm.learners[g], net).parameters()
                for a, b in zip(getattr(eager.algorithm.learners[g], net).parameters(), ours, strict=True):
                    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
            state = fused.algorithm.learners[g].optimizer.state_dict()["state"]
            assert all(s["step"].item() == (iteration + 1) * 4 for s in state.values())
    # The clipped group's norms are recorded; the unclipped one's are not measured: NaN, as in the eager update.
    assert terms[1]["listener"]["policy_grad_norm"] > 0
    assert terms[1]["speaker"]["policy_grad_norm"].isnan()


@pytest.mark.parametrize("fused", [False, True])
def test_a_policy_step_then_a_critic_step_equal_the_step_of_both(tmp_path, fused):
    """The step split by net (so that the critics' steps can run apart from the policies') trains the same
    parameters, Adam state and loss terms as the one step of both nets, over several iterations."""
    both, apart = (Trainer(config(tmp_path), run_dir=tmp_path / name) for name in ("both", "apart"))
    if fused:
        runs = [(both, [fused_step(both)]), (apart, [fused_step(apart, (net,)) for net in ("policy", "critic")])]
    else:
        step = apart.algorithm.step
        split = [
            UpdateStep(step.trainables, step.loss, apart.device, apart.world, nets=(net,))
            for net in ("policy", "critic")
        ]
        runs = [(both, [both.algorithm.step]), (apart, split)]
    for _ in range(3):
        sums = []
        for trainer, steps in runs:
            buffer = trainer.collector.collect()
            trainer.algorithm.advantages(buffer)
            flat, state = trainer.algorithm.update_inputs(buffer)
            sums.append({g: torch.zeros(len(LOSS_TERMS) + 2) for g in flat})
            for start in (0, 128):
                for step in steps:
                    for g, out in step(flat, state, torch.arange(start, start + 128)).items():
                        sums[-1][g] += out
        for g, learner in both.algorithm.learners.items():
            torch.testing.assert_close(sums[0][g], sums[1][g], rtol=1e-6, atol=1e-7, equal_nan=True)
            other = apart.algorithm.learners[g]
            for a, b in zip(learner.parameters(), other.parameters(), strict=True):
                torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
            ours, theirs = (lr.optimizer.state_dict()["state"] for lr in (learner, other))
            assert ours.keys() == theirs.keys()
            for k in ours:
                for name in ("step", "exp_avg", "exp_avg_sq"):
                    torch.testing.assert_close(ours[k][name], theirs[k][name], rtol=1e-6, atol=1e-7)
    assert sums[1]["listener"][len(LOSS_TERMS) :].min() > 0  # both nets' norms, each from its own step
    assert sums[1]["speaker"][len(LOSS_TERMS) :].isnan().all()  # not clipped: not measured, as the step of both


def test_a_step_of_some_nets_names_them_in_order():
    nets = {"policy": torch.nn.Linear(2, 2), "critic": torch.nn.Linear(2, 1)}
    trainable = Trainable(nets, adam([p for net in nets.values() for p in net.parameters()], lr=1e-3, eps=1e-5), 1.0)
    for wrong in ((), ("value",), ("critic", "policy"), ("policy", "policy")):
        with pytest.raises(ValueError, match=r"group 'g': nets must be some of \('policy', 'critic'\) in that order"):
            UpdateStep({"g": trainable}, lambda: None, torch.device("cpu"), world=None, nets=wrong)


def test_the_optimiser_must_hold_the_nets_parameters_in_order():
    policy, critic = torch.nn.Linear(2, 2), torch.nn.Linear(2, 1)
    nets = {"policy": policy, "critic": critic}
    wrong = adam([*critic.parameters(), *policy.parameters()], lr=1e-3, eps=1e-5)
    with pytest.raises(ValueError, match="group 'g': the optimiser must hold its nets' parameters, in order"):
        UpdateStep({"g": Trainable(nets, wrong, 1.0)}, lambda: None, torch.device("cpu"), world=None)


@pytest.mark.parametrize("fused", [False, True], ids=["eager", "fused"])
@pytest.mark.parametrize(
    ("returned", "says"),
    [
        (lambda loss: loss, r"must return \(total 0-d tensor, \{group: terms, a 1-d tensor \[K\]\}\), got Tensor"),
        (lambda loss: (loss.expand(3), {"g": loss.detach().reshape(1)}), r"its total has shape \(3,\), expected a 0-d"),
        (lambda loss: (loss, {}), r"for the groups \['g'\]; got terms \[\]"),
        (lambda loss: (loss, {"g": loss.detach()}), r"group 'g''s terms have shape \(\), expected a 1-d tensor"),
        (lambda loss: (loss, {"g": 1.0}), r"group 'g''s terms have float, expected a 1-d tensor"),
    ],
    ids=["total-only", "total-not-0-d", "group-missing", "0-d-term", "float-term"],
)
def test_a_loss_of_another_layout_is_refused_naming_it(fused, returned, says):
    """A user's loss returning `{group: loss.detach()}` (0-d) failed in torch.cat with "zero-dimensional tensor
    (at position 0) cannot be concatenated", a missing group with a bare KeyError, the total alone with
    "iteration over a 0-d tensor"."""
    net = torch.nn.Linear(2, 1)
    trainable = Trainable({"policy": net}, adam(net.parameters(), lr=1e-3, eps=1e-5), 1.0)
    step = UpdateStep(
        {"g": trainable}, lambda x: returned(net(x).square().mean()), torch.device("cpu"), world=World(), compile=fused
    )
    if fused:
        step._fused_step = step._fused_step_eager  # the compiled step's code, run eagerly
    with pytest.raises(TypeError, match=says):
        step(torch.ones(4, 2))


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

    step = fused_step(trainer)
    step._fused_step = torch.compile(step._fused_step_eager, backend=counting_aot_eager, dynamic=False)
    buffer = trainer.collector.collect()
    trainer.algorithm.advantages(buffer)
    flat, state = trainer.algorithm.update_inputs(buffer)
    step(flat, state, torch.arange(128))
    assert len(traces) == 1


def test_member_clipping_and_adam_follow_the_eager_populations():
    """Stacked parameters `[S, ...]` (`members`): `clip_factors` clips each member by its own norm, as
    `clip_members_`, and `_adam_` with each member's lr steps as torch's fused Adam scaled by `member_lr_step`."""
    generator = torch.Generator().manual_seed(0)
    lr = torch.tensor([1e-3, 3e-2, 1e-2])
    params = [torch.randn(3, 8, 4, generator=generator), torch.randn(3, 8, generator=generator), torch.randn(3)]
    reference = [p.clone().requires_grad_() for p in params]
    optimizer = adam(reference, lr=1.0, eps=1e-5)
    ours = [p.clone() for p in params]
    exp_avgs, exp_avg_sqs = [torch.zeros_like(p) for p in ours], [torch.zeros_like(p) for p in ours]
    steps = torch.zeros(len(ours))
    for _ in range(20):
        grads = [
            torch.randn(p.shape, generator=generator) * torch.tensor([0.01, 1.0, 10.0]).view(-1, *(1,) * (p.dim() - 1))
            for p in params
        ]
        for p, g in zip(reference, grads):
            p.grad = g.clone()
        norms = clip_members_(reference, 0.5)
        member_lr_step(optimizer, reference, lr)
        (our_norms,), (factor,) = clip_factors([grads], 0.5, members=True)
        torch.testing.assert_close(our_norms, norms)
        steps.add_(1)
        _adam_(
            ours,
            _scaled(grads, factor),
            exp_avgs,
            exp_avg_sqs,
            *adam_step_scalars(steps, 1.0, 0.9, 0.999),
            0.9,
            0.999,
            1e-5,
            member_lr=lr,
        )
    for a, b in zip(reference, ours):
        torch.testing.assert_close(a.detach(), b, rtol=1e-5, atol=1e-6)

"""The compiled update's minibatch step as one graph: loss, gradients, clipping and Adam together.

Compiling only the loss (as `marl train --compile` did first) leaves, every minibatch step, autograd's
engine walking the backward graph, the clipping and Adam as eager ops, and the compiled call's own
wrappers: at JaxMARL's `ippo_ff_mpe` sizes (1536 samples through 64-64 MLPs) that was about as long as
the arithmetic itself. Here the gradients come from `torch.func.grad` of a pure function of the
parameters, so `torch.compile` traces the forward, the backward, the per-net gradient clipping and
Adam into one graph and a step is one call (on the Xeon dev box 1.9 ms a step where it was 3.3 ms).

The eager trainer keeps autograd and `FusedAdam`; both compute the same update (tested: run eagerly,
this step equals the eager update to ~1e-7 over 10 iterations; compiled, over the first iterations,
after which Inductor's own rounding lets runs part as any two float orders do). Adam's moments and
step counts are the optimiser's own state tensors, updated in place, so checkpoints are the same
either way.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
from torch import nn
from torch.func import functional_call, grad

from envs.compile import maybe_compile
from marl.optim import clip_factors

NETS = ("policy", "critic")  # a group's nets, in its optimiser's order


class _Nets(nn.Module):
    """Every group's policy and critic under one module, whose forward is the trainer's loss: so
    `functional_call` can run that loss with other tensors in place of all the parameters at once."""

    def __init__(self, learners: Mapping, loss: Callable) -> None:
        super().__init__()
        self.groups = nn.ModuleDict(
            {g: nn.ModuleDict({"policy": lr.policy, "critic": lr.critic}) for g, lr in learners.items()}
        )
        self.loss = loss

    def forward(self, *args):
        return self.loss(*args)


class FusedUpdateStep:
    """`step(flat, state, index, sums)`: one minibatch step of every group's nets, in place, compiled.

    Args:
        learners: per group, its `marl.trainer.Learner`: the policy and critic (each net's gradients
            clipped apart, at `algo.max_grad_norm`; 0 or less: no clipping) and the `FusedAdam` over
            the policy's then the critic's parameters.
        loss: `loss(flat, state, index, nets) -> (total, {group: loss terms})`, computed with the networks
            (of `nets` only).
        device: where the step runs (CUDA: `mode="reduce-overhead"`, CUDA graphs; not yet run on a GPU).
        compile: `torch.compile` the step (else it runs the same function eagerly, for tests).
        nets: which of every group's nets the step trains, `NETS` or one of them: a policy step and a
            critic step in turn do what the step of both does (tested), so the two can run apart.
        cpp_wrapper: compile with Inductor's C++ wrapper, for a step run on a second thread
            (`envs.compile.maybe_compile`).
    """

    def __init__(
        self,
        learners: Mapping,
        loss: Callable,
        device: torch.device,
        compile: bool = True,
        nets: tuple[str, ...] = NETS,
        cpp_wrapper: bool = False,
    ) -> None:
        self.module = _Nets(learners, loss)
        self.optimizers = {g: lr.optimizer for g, lr in learners.items()}
        self.max_grad_norms = {g: lr.algo.max_grad_norm for g, lr in learners.items()}
        if not nets or any(net not in NETS for net in nets) or list(nets) != sorted(nets, key=NETS.index):
            raise ValueError(f"nets must be some of {NETS} in that order, got {nets}")
        self.nets = tuple(nets)
        self.net_indices = [NETS.index(net) for net in self.nets]  # contiguous: (0,), (1,) or (0, 1)
        # Adam's constants per group, read once: the compiled graph must not guard on the param group
        # (its lr changes every iteration and arrives inside the per-parameter step sizes instead).
        self.adam_constants = {
            g: (*optimizer.param_groups[0]["betas"], optimizer.param_groups[0]["eps"])
            for g, optimizer in self.optimizers.items()
        }
        # Per group: the parameter names of its policy and of its critic, in `module`'s naming.
        self.names = {
            g: [[f"groups.{g}.{net}.{name}" for name, _ in nets[net].named_parameters()] for net in NETS]
            for g, nets in self.module.groups.items()
        }
        # Per group: where the stepped nets' parameters lie in the optimiser's list (policy's, then critic's).
        self.spans = {}
        named = dict(self.module.named_parameters())
        for g, optimizer in self.optimizers.items():
            ours = [named[name] for net_names in self.names[g] for name in net_names]
            if [id(p) for p in ours] != [id(p) for p in optimizer.param_groups[0]["params"]]:
                raise ValueError(f"group {g!r}: the optimiser must hold the policy's then the critic's parameters")
            sizes = [len(net_names) for net_names in self.names[g]]
            start = sum(sizes[: self.net_indices[0]])
            self.spans[g] = (start, start + sum(sizes[i] for i in self.net_indices))
        self.device = device
        self._step = maybe_compile(self._step_eager, compile, device, cpp_wrapper)

    def __call__(
        self,
        flat: dict[str, dict[str, torch.Tensor]],
        state: torch.Tensor | None,
        index: torch.Tensor,
        sums: dict[str, torch.Tensor],
    ) -> None:
        """Adds each group's loss terms (those of the stepped nets; the others' are 0) and the stepped
        nets' gradient norms to `sums[g]` (`[terms + 2]`)."""
        named = dict(self.module.named_parameters())
        params = {name: named[name] for names in self.names.values() for i in self.net_indices for name in names[i]}
        adam = {}
        for g, optimizer in self.optimizers.items():
            exp_avgs, exp_avg_sqs, steps = optimizer.state_lists()
            start, end = self.spans[g]
            steps = steps[start:end]  # a view: the stepped nets' counts advance in the optimiser's state
            steps.add_(1)
            beta1, beta2, _ = self.adam_constants[g]
            scalars = adam_step_scalars(steps, optimizer.param_groups[0]["lr"], beta1, beta2)
            adam[g] = (exp_avgs[start:end], exp_avg_sqs[start:end], *scalars)
            if self.device.type == "cuda":  # CUDA graphs replay on fixed addresses (parameters already are)
                for tensor in (*adam[g][0], *adam[g][1]):
                    torch._dynamo.mark_static_address(tensor)
        self._step(params, adam, flat, state, index, sums)

    @torch.no_grad()
    def _step_eager(self, params, adam, flat, state, index, sums) -> None:
        # d(loss of the stepped nets)/d(their parameters); the per-group loss terms ride along as the
        # auxiliary output. No weights are tied, and looking for ties walks every buffer: traced, the
        # critic's float64 target count became a symbolic float, and AOTAutograd restarted the whole trace
        # to specialise it.
        def loss(p):
            return functional_call(self.module, p, (flat, state, index, self.nets), tie_weights=False)

        grads, terms = grad(loss, has_aux=True)(params)
        first = self.net_indices[0]
        for g, names in self.names.items():
            count = terms[g].shape[0]
            sums[g][:count] += terms[g]
            net_grads = [[grads[name] for name in names[i]] for i in self.net_indices]
            if self.max_grad_norms[g] > 0:
                # Clipped apart, as the eager update: the critic's large gradients must not
                # shrink the policy's through one shared norm.
                norms, factors = clip_factors(net_grads, self.max_grad_norms[g])
                net_grads = [torch._foreach_mul(gs, factor) for gs, factor in zip(net_grads, factors)]
                sums[g][count + first : count + first + len(norms)] += torch.stack(norms)
            group_params = [params[name] for i in self.net_indices for name in names[i]]
            _adam_(group_params, [x for gs in net_grads for x in gs], *adam[g], *self.adam_constants[g])


def adam_step_scalars(steps: torch.Tensor, lr: float, beta1: float, beta2: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Each parameter's Adam step size `lr / (1 - beta1^step)` and `sqrt(1 - beta2^step)`, `[params]`
    each, from the step counts `steps` `[params]` (this step included) and the learning rate `lr`.

    Computed in float64, as torch's fused kernel computes them: in float32 (the lr, `beta ** step`) they
    differed from it systematically, and the run drifted away from the eager one within 15 iterations
    instead of staying equal to ~1e-7. Computed eagerly, before the compiled step: inside it, Inductor
    recomputed them (two float64 `pow`s) for every 16 elements of every parameter, and Adam's kernel
    took 230-270 us a step instead of 92 us (IPPO at BenchMARL's sizes on the Xeon dev box)."""
    counts = steps.double()
    step_sizes = (lr / (1 - beta1**counts)).float()
    bias_correction2_sqrts = (1 - beta2**counts).sqrt_().float()
    return step_sizes, bias_correction2_sqrts


def _adam_(
    params,
    grads,
    exp_avgs,
    exp_avg_sqs,
    step_sizes: torch.Tensor,
    bias_correction2_sqrts: torch.Tensor,
    beta1: float,
    beta2: float,
    eps: float,
) -> None:
    """torch's fused Adam step written out, in place, traceable (`torch._fused_adam_` with a tensor lr
    cannot be compiled), with the per-parameter scalars of `adam_step_scalars`."""
    for param, g, exp_avg, exp_avg_sq, step_size, bias_correction2_sqrt in zip(
        params, grads, exp_avgs, exp_avg_sqs, step_sizes.unbind(), bias_correction2_sqrts.unbind()
    ):
        exp_avg.lerp_(g, 1 - beta1)
        exp_avg_sq.mul_(beta2).addcmul_(g, g, value=1 - beta2)
        param.sub_(step_size * exp_avg / (exp_avg_sq.sqrt() / bias_correction2_sqrt + eps))

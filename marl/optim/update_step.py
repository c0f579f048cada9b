"""One optimiser step of every group's nets, from a loss: the update-step interface every algorithm uses.

    step = UpdateStep({g: Trainable({"policy": p, "critic": c}, Adam(...), max_grad_norm)}, loss, device,
                      world, compile=config.run.compile)
    out = step(*inputs)  # {group: [loss terms..., one gradient norm per net]}, 0-d tensors stacked, on device

`loss(*inputs) -> (total, {group: terms [K]})` computes with the trainables' nets; `total` is what is
differentiated (the sum of every group's loss), the terms are detached diagnostics. Each net's gradients
are clipped apart (a critic's gradients, large while values are far off, must not shrink its policy's
through one shared norm), at the group's `max_grad_norm`; the norms before clipping are returned, NaN
where a group does not clip (they are measured by the clipping).

Two ways to take the step, the same update (tested):

- **eager**: autograd, `world.average_gradients` (torchrun), `clip_grad_norm_` per net, and the group's
  `torch.optim.Adam(fused=True)`;
- **compiled** (`compile=True`, one process): the gradients come from `torch.func.grad` of a pure function
  of the parameters, so `torch.compile` traces the forward, the backward, the clipping and Adam into one
  graph and a step is one call. Compiling only the loss leaves autograd's engine, the clipping and Adam
  as eager ops every minibatch, which at small batches cost as much as the arithmetic. Under torchrun
  the gradient all-reduce sits between backward and Adam, so there only the loss is compiled.

Adam's moments and step counts are the optimiser's own state tensors, updated in place by both, so
checkpoints are the same either way.

An algorithm may ask for more: `prepare` maps the step's inputs to the loss's first (e.g. an off-policy
step's draw from its replay buffer), inside the compiled graph when compiled but outside the gradient
transform; `aux=True` lets the loss return a third value, any tensors computed with the
loss (e.g. the TD errors that set replay priorities), returned by the step beside the terms; `after_step`
runs after the optimiser step with them, inside the compiled graph when compiled (e.g. the Polyak update
of target networks, the replay priorities).

A step may train some of every group's nets only (`nets`, e.g. `("policy",)`): the loss is then called
with `nets=` those names and computes their part only, and only their parameters, gradient norms and Adam
state (moments and step counts) move. A step of each part in turn trains as the step of all of them
(tested), so the parts can run apart: PPO's `overlap_critic` runs the critics' step on a second thread
(`marl.optim.background`), compiled with `cpp_wrapper`.

A population (`marl train --seeds ... --compile`, `members`) takes its compiled step here too, over its
stacked nets `[S, ...]` (`marl.core.members.Members`): the loss runs for every member under vmap with
the parameters `torch.func.grad` differentiates by, the gradients are those of the members' summed
losses (each member's its own loss's), each member's norm per net `[S]` clips its own gradients, and
Adam, elementwise, steps every member with its own moments, each scaled by its own learning rate when
lr is swept. Its eager step is the population's own (`marl.algorithms.seeded`'s subclasses).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import nn
from torch.func import functional_call, grad

from envs import cudagraphs
from envs.compile import maybe_compile

if TYPE_CHECKING:
    from marl.core.members import Members


@dataclass
class Trainable:
    """A group's nets stepped by one Adam over their parameters, in the order of `nets`."""

    nets: dict[str, nn.Module]
    optimizer: torch.optim.Adam
    max_grad_norm: float
    """Clip each net's gradient norm to this; 0 or less: no clipping."""

    def parameters(self) -> list[nn.Parameter]:
        return [p for net in self.nets.values() for p in net.parameters()]


def adam(parameters, lr: float, eps: float) -> torch.optim.Adam:
    """The optimiser `UpdateStep` steps: torch's fused Adam."""
    return torch.optim.Adam(parameters, lr=lr, eps=eps, fused=True)


class _Nets(nn.Module):
    """Every group's nets under one module whose forward is the loss: so `functional_call` can run the loss
    with other tensors in place of all the parameters at once."""

    def __init__(self, trainables: Mapping[str, Trainable], loss: Callable) -> None:
        super().__init__()
        self.groups = nn.ModuleDict({g: nn.ModuleDict(t.nets) for g, t in trainables.items()})
        self.loss = loss

    def forward(self, *inputs, **kwargs):
        return self.loss(*inputs, **kwargs)


class UpdateStep:
    """`step(*inputs) -> {group: [terms..., grad norm per net]}`: one step of every group's nets, in place.

    Args:
        trainables: per group its nets, optimiser (one parameter group holding the nets' parameters in
            order: `adam(trainable.parameters(), ...)`) and clipping.
        loss: `loss(*inputs) -> (total, {group: terms [K]})`, computed with the trainables' nets; with
            `nets`, `loss(*inputs, nets=nets)`, computed with those nets only.
        device: where the step runs (CUDA: `mode="reduce-overhead"`, CUDA graphs).
        world: `marl.app.distributed`'s world: gradients are averaged over its ranks.
        compile: take the step as one compiled graph (one process) or compile the loss (torchrun).
        nets: the names of the nets to step, some of every group's in their order (None: all of them).
            The others' gradient norms read 0.
        cpp_wrapper: compile with Inductor's C++ wrapper, for a step run on a second thread
            (`envs.compile.maybe_compile`).
        aux: the loss returns `(total, terms, aux)`; the step then returns `(out, aux)`.
        after_step: called after every optimiser step with the loss's aux (None without `aux`), in the
            compiled graph when compiled.
        prepare: `prepare(*inputs) -> loss inputs`, called first (in the compiled graph when compiled, with
            no gradients); None: the loss takes the step's inputs.
        members: a population's stacked nets (`marl.core.members.Members`, `marl train --seeds`): the
            trainables' nets are its template's, their optimisers hold the stacked parameters `[S, ...]` (in
            the nets' order), and the loss, of the template's nets, runs for every member at once
            (`members(loss, *inputs)`: every input and output `[S, ...]`, `total` `[S]`); the gradients are
            those of the members' summed losses, so each member's is its own loss's, clipped by its own norm
            per net `[S]`; the step returns per group `[S, terms + nets]`. Compiled only (one process): a
            population's eager step is its own (`marl.algorithms.seeded`).
        member_lr: with `members`, each member's learning rate `[S]` (a swept lr; the optimisers' own is then
            1): Adam's step is proportional to its lr, so each member's is scaled by its own
            (`marl.core.members.member_lr_step` the eager one).
        split: `split(*loss inputs) -> [(part's loss inputs, weight), ...]`: the compiled step takes the loss
            part by part, its gradients and terms the parts' weighted sum (the loss a mean over rows: each
            part's rows' share), so the parts' activations are not all live at once (a population's rows on a
            CPU, `marl.algorithms.ppo_seeds`). Without aux; None: the inputs whole.
    """

    def __init__(
        self,
        trainables: Mapping[str, Trainable],
        loss: Callable,
        device: torch.device,
        world,
        compile: bool = False,
        nets: tuple[str, ...] | None = None,
        cpp_wrapper: bool = False,
        aux: bool = False,
        after_step: Callable[[object], None] | None = None,
        prepare: Callable[..., tuple] | None = None,
        members: Members | None = None,
        member_lr: torch.Tensor | None = None,
        split: Callable[..., list[tuple[tuple, float]]] | None = None,
    ) -> None:
        self.trainables, self.loss, self.device, self.world = dict(trainables), loss, device, world
        self.aux, self.after_step, self.prepare = aux, after_step, prepare
        self.members, self.member_lr, self.split = members, member_lr, split
        if split is not None and (aux or not compile or world.size != 1):
            raise ValueError("split: the compiled step (one process) of a loss without aux takes its inputs in parts")
        for g, t in self.trainables.items():
            held = t.optimizer.param_groups
            want = t.parameters() if members is None else [members.params[n] for n in members.names(t.parameters())]
            if len(held) != 1 or [id(p) for p in held[0]["params"]] != [id(p) for p in want]:
                raise ValueError(f"group {g!r}: the optimiser must hold its nets' parameters, in order, in one group")
        self.loss_kwargs = {} if nets is None else {"nets": tuple(nets)}
        # Per group: the positions of the stepped nets among its nets, and of their parameters in its optimiser.
        self.stepped = {g: _stepped(g, t, nets) for g, t in self.trainables.items()}
        self.slots = {}
        for g, t in self.trainables.items():
            starts = [0]
            for net in t.nets.values():
                starts.append(starts[-1] + len(list(net.parameters())))
            self.slots[g] = [k for i in self.stepped[g] for k in range(starts[i], starts[i + 1])]
        self.parameters = [p for t in self.trainables.values() for p in t.parameters()]
        # The norms of a group that does not clip, the same every step: NaN for the stepped nets (the clipping
        # measures them), 0 for the others.
        self.unmeasured = {
            g: torch.tensor([math.nan if i in self.stepped[g] else 0.0 for i in range(len(t.nets))], device=device)
            for g, t in self.trainables.items()
        }
        if members is not None:  # each member's: [S, nets]
            self.unmeasured = {g: v.expand(members.count, -1).contiguous() for g, v in self.unmeasured.items()}
        # The parameters of the nets not stepped: their gradients are dropped before the eager step.
        self.not_stepped = [
            p
            for g, t in self.trainables.items()
            for i, net in enumerate(t.nets.values())
            if i not in self.stepped[g]
            for p in net.parameters()
        ]
        self.fused = compile and world.size == 1
        if members is not None and not self.fused:
            raise ValueError("a population's update step (members) is the compiled one, in one process")
        if self.fused:
            if members is not None:
                self.member_loss = functools.partial(loss, **self.loss_kwargs)
                # Read by the step, in place for the whole run (the members' running moments, schedules).
                cudagraphs.mark_static(members.buffers.values(), device)
                # Per group and net: the names of its stacked parameters in `members.params`.
                self.names = {
                    g: [members.names(net.parameters()) for net in t.nets.values()] for g, t in self.trainables.items()
                }
            else:
                self.module = _Nets(self.trainables, loss)
                # Per group and net: the parameter names in `module`'s naming.
                self.names = {
                    g: [
                        [f"groups.{g}.{net}.{name}" for name, _ in module.named_parameters()]
                        for net, module in nets.items()
                    ]
                    for g, nets in self.module.groups.items()
                }
            # Adam's constants, read once: the compiled graph must not guard on the param group (its lr
            # changes every iteration and reaches the graph inside the per-parameter step sizes instead).
            self.adam_constants = {
                g: (*t.optimizer.param_groups[0]["betas"], t.optimizer.param_groups[0]["eps"])
                for g, t in self.trainables.items()
            }
            self._fused_step = maybe_compile(self._fused_step_eager, True, device, cpp_wrapper, name="update step")
        else:
            self._loss = maybe_compile(loss, compile, device, cpp_wrapper, name="update step")

    def __call__(self, *inputs):
        out, aux = self._step_fused(inputs) if self.fused else self._step_eager(inputs)
        return (out, aux) if self.aux else out

    # ---- eager: autograd and torch's Adam -------------------------------------------------------------

    def _step_eager(self, inputs):
        if self.prepare is not None:
            with torch.no_grad():
                inputs = self.prepare(*inputs)
        total, terms, *aux = _checked_loss_output(self._loss(*inputs, **self.loss_kwargs), self.trainables)
        for t in self.trainables.values():
            t.optimizer.zero_grad(set_to_none=True)
        total.backward()
        for p in self.not_stepped:  # Adam skips a parameter without a gradient
            p.grad = None
        self.world.average_gradients(self.parameters)
        out = {}
        for g, t in self.trainables.items():
            nets = list(t.nets.values())
            if t.max_grad_norm > 0:
                norms = [
                    torch.nn.utils.clip_grad_norm_(nets[i].parameters(), t.max_grad_norm, foreach=True)
                    for i in self.stepped[g]
                ]
                norms = self._all_norms(g, norms)
            else:
                norms = self.unmeasured[g]
            t.optimizer.step()
            out[g] = torch.cat([terms[g], norms])
        aux = aux[0] if aux else None
        if self.after_step is not None:
            with torch.no_grad():
                self.after_step(aux)
        return out, aux

    def _all_norms(self, g: str, norms: list[torch.Tensor]) -> torch.Tensor:
        """Group `g`'s gradient norm per net: the stepped nets' `norms`, 0 for the others."""
        by_net = dict(zip(self.stepped[g], norms))
        return torch.stack(
            [by_net[i] if i in by_net else torch.zeros_like(norms[0]) for i in range(len(self.trainables[g].nets))],
            -1,
        )

    # ---- compiled: one graph of loss, gradients, clipping and Adam ------------------------------------

    def _step_fused(self, inputs):
        named = self.members.params if self.members is not None else dict(self.module.named_parameters())
        params = {name: named[name] for g, nets in self.names.items() for i in self.stepped[g] for name in nets[i]}
        adam_state = {}
        for g, t in self.trainables.items():
            # The stepped nets' moments and step counts (only theirs advance).
            exp_avgs, exp_avg_sqs, steps = ([x[k] for k in self.slots[g]] for x in _adam_state(t.optimizer))
            torch._foreach_add_(steps, 1)
            beta1, beta2, _ = self.adam_constants[g]
            lr = t.optimizer.param_groups[0]["lr"]
            adam_state[g] = (exp_avgs, exp_avg_sqs, *adam_step_scalars(torch.stack(steps), lr, beta1, beta2))
            cudagraphs.mark_static((*exp_avgs, *exp_avg_sqs), self.device)  # parameters already are static
        return self._fused_step(params, adam_state, inputs)

    @torch.no_grad()
    def _fused_step_eager(self, params, adam_state, inputs):
        if self.prepare is not None:
            inputs = self.prepare(*inputs)

        # d(total)/d(parameters); the per-group terms ride along as the auxiliary output. No weights are
        # tied, and looking for ties walks every buffer (traced, a float64 buffer became a symbolic float
        # and AOTAutograd restarted the whole trace to specialise it).
        def loss(p, inputs, weight=1.0):
            if self.members is None:
                out = functional_call(self.module, p, inputs, self.loss_kwargs, tie_weights=False)
                total, *rest = _checked_loss_output(out, self.trainables)
                return total * weight, rest
            total, *rest = self.members(self.member_loss, *inputs, params=p)
            return total.sum() * weight, rest  # each member's gradient is its own loss's

        if self.split is None:
            grads, (terms, *aux) = grad(loss, has_aux=True)(params, inputs)
        else:  # part by part, in the graph: each part's gradients and terms weighted and summed
            grads, terms, aux = None, None, ()
            for part, weight in self.split(*inputs):
                part_grads, (part_terms,) = grad(loss, has_aux=True)(params, part, weight)
                part_terms = {g: v * weight for g, v in part_terms.items()}
                if grads is None:
                    grads, terms = part_grads, part_terms
                else:
                    grads = {name: grads[name] + v for name, v in part_grads.items()}
                    terms = {g: terms[g] + v for g, v in part_terms.items()}
        out = {}
        for g, t in self.trainables.items():
            stepped = [self.names[g][i] for i in self.stepped[g]]
            net_grads = [[grads[name] for name in names] for names in stepped]
            if t.max_grad_norm > 0:
                norms, factors = clip_factors(net_grads, t.max_grad_norm, members=self.members is not None)
                net_grads = [_scaled(gs, factor) for gs, factor in zip(net_grads, factors)]
                norms = self._all_norms(g, norms)
            else:
                norms = self.unmeasured[g]
            group_params = [params[name] for names in stepped for name in names]
            grads_in_order = [x for gs in net_grads for x in gs]
            _adam_(group_params, grads_in_order, *adam_state[g], *self.adam_constants[g], member_lr=self.member_lr)
            out[g] = torch.cat([terms[g], norms], -1)
        aux = aux[0] if aux else None
        if self.after_step is not None:
            self.after_step(aux)
        return out, aux


def _checked_loss_output(out, groups: Mapping) -> tuple:
    """The loss's `(total, {group: terms [K]}, *aux)` for one run, refused naming that layout: a user's loss
    returning a 0-d term (`loss.detach()`) failed in torch.cat ("zero-dimensional tensor (at position 0)
    cannot be concatenated"), a missing group with a bare KeyError, the total alone in tuple unpacking."""
    layout = "(total 0-d tensor, {group: terms, a 1-d tensor [K]})"
    if not (isinstance(out, tuple) and len(out) >= 2):
        raise TypeError(f"UpdateStep: the loss must return {layout}, got {type(out).__name__}")
    total, terms = out[0], out[1]
    if not (isinstance(total, torch.Tensor) and total.dim() == 0):
        got = f"shape {tuple(total.shape)}" if isinstance(total, torch.Tensor) else type(total).__name__
        raise TypeError(f"UpdateStep: the loss must return {layout}; its total has {got}, expected a 0-d tensor")
    missing = [g for g in groups if not isinstance(terms, Mapping) or g not in terms]
    if missing:
        got = sorted(terms) if isinstance(terms, Mapping) else type(terms).__name__
        raise TypeError(f"UpdateStep: the loss must return {layout} for the groups {list(groups)}; got terms {got}")
    for g in groups:
        if not (isinstance(terms[g], torch.Tensor) and terms[g].dim() == 1):
            got = f"shape {tuple(terms[g].shape)}" if isinstance(terms[g], torch.Tensor) else type(terms[g]).__name__
            raise TypeError(
                f"UpdateStep: the loss must return {layout}; group {g!r}'s terms have {got}, expected a 1-d "
                "tensor (torch.stack of the terms, or one term's .reshape(1))"
            )
    return out


def _stepped(group: str, trainable: Trainable, nets: tuple[str, ...] | None) -> list[int]:
    """The positions among `trainable`'s nets of those named in `nets` (None: all of them)."""
    names = list(trainable.nets)
    if nets is None:
        return list(range(len(names)))
    nets = tuple(nets)
    if (
        not nets
        or len(set(nets)) < len(nets)
        or not set(nets) <= set(names)
        or list(nets) != sorted(nets, key=names.index)
    ):
        raise ValueError(f"group {group!r}: nets must be some of {tuple(names)} in that order, got {nets}")
    return [names.index(net) for net in nets]


def _adam_state(optimizer: torch.optim.Adam) -> tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]]:
    """The moments and step counts of the optimiser's parameters, in order; missing state is created as
    torch's fused Adam creates it on its first step."""
    states = []
    for p in optimizer.param_groups[0]["params"]:
        state = optimizer.state[p]
        if not state:
            state["step"] = torch.zeros((), dtype=torch.float32, device=p.device)
            state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        states.append(state)
    return [s["exp_avg"] for s in states], [s["exp_avg_sq"] for s in states], [s["step"] for s in states]


def clip_factors(
    grad_lists: list[list[torch.Tensor]], max_norm: float, members: bool = False
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Each list's total gradient norm and the factor, `min(1, max_norm / (norm + 1e-6))`, that clips it
    to `max_norm` (as `torch.nn.utils.clip_grad_norm_`), traceable, from one norm pass over all lists.
    `members`: the gradients are stacked `[S, ...]`, and each member's norm and factor are its own, `[S]`
    (as `marl.core.members.clip_members_`)."""
    flat = [g for grads in grad_lists for g in grads]
    if members:
        per_tensor = [torch.linalg.vector_norm(g.reshape(g.shape[0], -1), dim=1) for g in flat]  # [S] each
    else:
        per_tensor = torch._foreach_norm(flat)
    norms, start = [], 0
    for grads in grad_lists:
        norms.append(torch.linalg.vector_norm(torch.stack(per_tensor[start : start + len(grads)]), dim=0))
        start += len(grads)
    return norms, [(max_norm / (norm + 1e-6)).clamp(max=1.0) for norm in norms]


def _scaled(grads: list[torch.Tensor], factor: torch.Tensor) -> list[torch.Tensor]:
    """`grads` times `factor`: 0-d, or each member's `[S]` along their leading member dim."""
    if factor.dim() == 0:
        return torch._foreach_mul(grads, factor)
    return [g * factor.view(-1, *(1,) * (g.dim() - 1)) for g in grads]


def adam_step_scalars(steps: torch.Tensor, lr: float, beta1: float, beta2: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Each parameter's Adam step size `lr / (1 - beta1^step)` and `sqrt(1 - beta2^step)`, `[params]`
    each, from the step counts `steps` `[params]` (this step included).

    In float64, as torch's fused kernel computes them: in float32 they differ from it systematically and a
    run drifts away from the eager one. Computed before the compiled step, not inside it, where Inductor
    recomputed them for every few elements of every parameter."""
    counts = steps.double()
    step_sizes = (lr / (1 - beta1**counts)).float()
    bias_correction2_sqrts = (1 - beta2**counts).sqrt_().float()
    return step_sizes, bias_correction2_sqrts


def _adam_(
    params, grads, exp_avgs, exp_avg_sqs, step_sizes, bias_correction2_sqrts, beta1, beta2, eps, member_lr=None
) -> None:
    """torch's fused Adam step written out, in place, traceable (`torch._fused_adam_` with a tensor lr
    cannot be compiled), with the per-parameter scalars of `adam_step_scalars`. `member_lr`: stacked
    parameters `[S, ...]` whose members each step by their own learning rate `[S]` (the scalars' lr then 1)."""
    for param, g, exp_avg, exp_avg_sq, step_size, bias_correction2_sqrt in zip(
        params, grads, exp_avgs, exp_avg_sqs, step_sizes.unbind(), bias_correction2_sqrts.unbind()
    ):
        exp_avg.lerp_(g, 1 - beta1)
        exp_avg_sq.mul_(beta2).addcmul_(g, g, value=1 - beta2)
        if member_lr is not None:
            step_size = step_size * member_lr.view(-1, *(1,) * (param.dim() - 1))
        param.sub_(step_size * exp_avg / (exp_avg_sq.sqrt() / bias_correction2_sqrt + eps))

"""Adam with torch's fused kernel and less Python around it."""

from __future__ import annotations

import torch


class FusedAdam(torch.optim.Adam):
    """`torch.optim.Adam(fused=True)` that gathers its parameters' state once, not on every step.

    torch's `Optimizer.step` rebuilds and checks the lists of parameters, moments and step counts on
    every call: ~150 us for a policy and a critic on the CPU, as long as a whole minibatch step's
    arithmetic at small batches. This keeps those lists after the first step (again after
    `load_state_dict`) and calls the same fused kernel with the same arguments, so its updates equal
    `torch.optim.Adam(fused=True)`'s (tested) and its state dict is Adam's. A group's step counts are
    gathered into one tensor whose elements (views) are the states' `step` tensors, so a step advances
    them in one op, not one per parameter. No AMSGrad, no maximize.
    """

    def __init__(self, params, lr: float, eps: float) -> None:
        super().__init__(params, lr=lr, eps=eps, fused=True)
        # Per group: params, m, v, steps (views of the next), all steps as one tensor [params].
        self._lists: list[tuple[list, list, list, list, torch.Tensor]] | None = None

    def load_state_dict(self, state_dict: dict) -> None:
        super().load_state_dict(state_dict)
        self._lists = None

    @torch.no_grad()
    def step(self, closure=None):  # type: ignore[override]
        if closure is not None:
            return super().step(closure)
        grads = [[p.grad for p in group["params"]] for group in self.param_groups]
        if self._lists is None or any(g is None for group in grads for g in group):
            super().step()  # creates the state on the first step; skips parameters without gradients
            self._lists = self._gather() if self._lists is None else self._lists
            return None
        for group, group_grads, (params, exp_avgs, exp_avg_sqs, steps, all_steps) in zip(
            self.param_groups, grads, self._lists
        ):
            all_steps.add_(1)
            beta1, beta2 = group["betas"]
            torch._fused_adam_(
                params,
                group_grads,
                exp_avgs,
                exp_avg_sqs,
                [],
                steps,
                amsgrad=False,
                lr=group["lr"],
                beta1=beta1,
                beta2=beta2,
                weight_decay=group["weight_decay"],
                eps=group["eps"],
                maximize=False,
            )
        return None

    def state_lists(self) -> tuple[list[torch.Tensor], list[torch.Tensor], torch.Tensor]:
        """The moments of the (one) parameter group, in its parameters' order, and its step counts as one
        tensor `[params]` (each state's `step` is a view of an element), for an update written out
        elsewhere (`marl.fused_step`); missing state is created as Adam's first step would create it."""
        if len(self.param_groups) != 1:
            raise ValueError(f"state_lists needs one parameter group, this optimiser has {len(self.param_groups)}")
        if self._lists is None:
            for p in self.param_groups[0]["params"]:
                if not self.state[p]:
                    self.state[p] = {
                        "step": torch.zeros((), dtype=torch.float32, device=p.device),
                        "exp_avg": torch.zeros_like(p, memory_format=torch.preserve_format),
                        "exp_avg_sq": torch.zeros_like(p, memory_format=torch.preserve_format),
                    }
            self._lists = self._gather()
        ((_, exp_avgs, exp_avg_sqs, _, all_steps),) = self._lists
        return exp_avgs, exp_avg_sqs, all_steps

    def _gather(self) -> list[tuple[list, list, list, list, torch.Tensor]] | None:
        """Every group's parameters and their state, or None while some parameter has no state yet.
        Each state's `step` becomes an element (a view) of its group's one step tensor."""
        lists = []
        for group in self.param_groups:
            states = [self.state[p] for p in group["params"]]
            if not all(states):
                return None
            all_steps = torch.stack([s["step"] for s in states])  # [params]
            for state, step in zip(states, all_steps.unbind()):
                state["step"] = step
            lists.append(
                (
                    list(group["params"]),
                    [s["exp_avg"] for s in states],
                    [s["exp_avg_sq"] for s in states],
                    [s["step"] for s in states],
                    all_steps,
                )
            )
        return lists


def clip_factors(
    grad_lists: list[list[torch.Tensor]], max_norm: float
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Each list's total gradient norm and the factor, `min(1, max_norm / (norm + 1e-6))`, that clips it
    to `max_norm` (as `torch.nn.utils.clip_grad_norm_`), from one per-tensor norm pass over all lists.
    An empty list has norm 0. The eager and the compiled update both clip with it."""
    flat = [grad for grads in grad_lists for grad in grads]
    per_tensor = torch._foreach_norm(flat) if flat else []
    norms, start = [], 0
    for grads in grad_lists:
        part = per_tensor[start : start + len(grads)]
        start += len(grads)
        norms.append(torch.linalg.vector_norm(torch.stack(part)) if part else torch.zeros((), device=_device(flat)))
    return norms, [(max_norm / (norm + 1e-6)).clamp(max=1.0) for norm in norms]


def _device(tensors: list[torch.Tensor]) -> torch.device:
    return tensors[0].device if tensors else torch.device("cpu")

"""Several training runs in one process (`marl train --seeds 0 1 2 3 4`): seeds are one more batch dim.

Each run is a *member*. Member `k`'s envs are rows `k * B .. (k + 1) * B` of one `[S * B]` env batch
(`split` and `join` move between that layout and a leading member dim `[S, ..., B, ...]`), and its
parameters are slot `k` of tensors stacked on a leading member dim `[S, ...]`.

`Members` holds every member's parameters and buffers stacked, and runs any function of one member's
nets for all members at once with `torch.func.vmap` over that dim: the nets are ordinary modules (a
template, built as a single run builds them), every layer becomes one batched matmul over the members
(and agents), and whatever the function computes per run (a mean over its rows, an advantage
normalisation) stays per member. Autograd runs through it as through any op, so the sum of the members'
losses gives each member exactly the gradient of its own loss.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import torch
from torch import nn
from torch.func import functional_call, vmap

from marl.optim.tanh import EAGER_TANH_VIA_SIGMOID, Tanh


def split(x: torch.Tensor, members: int, dim: int = 0) -> torch.Tensor:
    """`[..., S * B, ...]` (the member-major env dim at `dim`) -> `[S, ..., B, ...]`."""
    return x.unflatten(dim, (members, -1)).movedim(dim, 0)


def join(x: torch.Tensor, dim: int = 0) -> torch.Tensor:
    """`split`'s inverse: `[S, ..., B, ...]` -> `[..., S * B, ...]` with the env dim at `dim`."""
    return x.movedim(0, dim).flatten(dim, dim + 1)


class VmapTanh(nn.Module):
    """`marl.optim.tanh.Tanh` for nets run under vmap: the same function (the sigmoid form where `Tanh`
    takes it) in plain ops, whose derivative autograd takes; under vmap `Tanh`'s autograd.Function would
    go through a Python rule at every call."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.device.type == "cpu" and EAGER_TANH_VIA_SIGMOID:
            return torch.sigmoid(x * 2.0) * 2.0 - 1.0
        return torch.tanh(x)


def vmap_activations_(net: nn.Module) -> None:
    """Swap every `Tanh` in `net` for a `VmapTanh`, in place (activations hold no parameters)."""
    for module in net.modules():
        for name, child in module.named_children():
            if isinstance(child, Tanh):
                module._modules[name] = VmapTanh()


class _Call(nn.Module):
    """The members' nets under one module whose forward runs any function of them, so that
    `functional_call` can run it with one member's tensors in place of the nets' own."""

    def __init__(self, nets: nn.Module) -> None:
        super().__init__()
        self.nets = nets

    def forward(self, fn: Callable, *args):
        return fn(*args)


class Members:
    """The parameters and buffers of `S` copies of `nets` (modules of the same structure, one per member),
    stacked on a leading member dim; `members(fn, *args)` runs `fn` (a function of `template`'s nets) for
    every member at once.

    `params[name]` `[S, ...]` are leaf `nn.Parameter`s (an optimiser steps them); `buffers[name]` `[S, ...]`.
    Names are those of `nets.named_parameters()` / `named_buffers()`."""

    def __init__(self, nets: Sequence[nn.Module]) -> None:
        self.count = len(nets)
        self.template = nets[0]
        vmap_activations_(self.template)
        self._call = _Call(self.template)
        self.params = {
            name: nn.Parameter(torch.stack([dict(net.named_parameters())[name].detach() for net in nets]))
            for name, _ in self.template.named_parameters()
        }
        self.buffers = {
            name: torch.stack([dict(net.named_buffers())[name] for net in nets])
            for name, _ in self.template.named_buffers()
        }

    def state(self) -> dict[str, torch.Tensor]:
        """Every stacked tensor, in `_Call`'s naming."""
        return {f"nets.{name}": tensor for name, tensor in (*self.params.items(), *self.buffers.items())}

    def __call__(self, fn: Callable, *args, params: dict[str, torch.Tensor] | None = None):
        """`fn(*args)` for every member: each tensor in `args` (nested in dicts, tuples; an arg None passes as is)
        carries a leading member dim `[S, ...]`, and so does every tensor `fn` returns. `params`: stacked
        tensors `[S, ...]` by name (`params`' naming) in place of those parameters, e.g. the ones a
        `torch.func.grad` differentiates by (the compiled update step: `marl.optim.update_step`)."""

        def one(state, *member_args):
            return functional_call(self._call, state, (fn, *member_args), tie_weights=False, strict=True)

        state = self.state()
        if params is not None:
            state.update({f"nets.{name}": tensor for name, tensor in params.items()})
        in_dims = (0, *(None if arg is None else 0 for arg in args))  # vmap maps no None
        return vmap(one, in_dims=in_dims)(state, *args)

    def broadcast(self, fn: Callable, *args):
        """`fn(*args)` once, with the nets' tensors replaced by the stacked ones (`[S, ...]`), without vmap:
        for elementwise bookkeeping on 0-d buffers, such as running moments updated in place, which then
        update every member's slot by broadcasting."""
        return functional_call(self._call, self.state(), (fn, *args), tie_weights=False, strict=True)

    def names(self, params: Iterable[nn.Parameter]) -> list[str]:
        """The names in `self.params` of the stacked tensors of `params` (parameters of `template`'s nets), in
        their order."""
        by_id = {id(p): name for name, p in self.template.named_parameters()}
        return [by_id[id(p)] for p in params]

    def member(self, k: int, prefix: str) -> dict[str, torch.Tensor]:
        """Member `k`'s tensors of the submodule at `prefix` (`"agent.policy"`), named as in its
        `state_dict()`: an ordinary single run's module state."""
        start = f"{prefix}."
        return {
            name[len(start) :]: tensor[k].detach().clone()
            for name, tensor in (*self.params.items(), *self.buffers.items())
            if name.startswith(start)
        }

    def nbytes(self) -> int:
        """The bytes of every stacked parameter and buffer."""
        return sum(t.numel() * t.element_size() for t in (*self.params.values(), *self.buffers.values()))


class MemberPolicy:
    """A group's policy for every member's envs at once, as the rollout calls one: `(observation [S * B, n,
    ...], action mask or None) -> MemberDistribution`. `log_prob`: whether a sample's log-probability is
    computed with it (on-policy collection stores it; an off-policy one's distributions may have none)."""

    def __init__(self, members: Members, policy: nn.Module, log_prob: bool = True) -> None:
        self.members, self.policy, self.log_prob = members, policy, log_prob

    def __call__(
        self, observation: torch.Tensor, action_mask: torch.Tensor | None = None, hidden: torch.Tensor | None = None
    ) -> MemberDistribution | tuple[MemberDistribution, torch.Tensor]:
        """With a recurrent policy (`Acting.hidden`), `hidden` `[S * B, n, h]`: the GRU steps every member
        at once (the policy's `recur`), and the distribution reads the next state (its `from_hidden`),
        `(distribution, next hidden)` as `Policy` (or Q-learning's `QPolicy`)."""
        if hidden is None:
            return MemberDistribution(self, observation, action_mask)
        count = self.members.count
        next_hidden = join(self.members(self.policy.recur, split(observation, count), split(hidden, count)))
        return MemberDistribution(self, observation, action_mask, next_hidden), next_hidden


class MemberDistribution:
    """What the rollout asks of a distribution (`sample`, then `log_prob` and `env_action` of that sample),
    for `[S * B]` envs: the sample computes all three in one pass of the members' policies, and the other
    two return them (of another raw action, they run the policies again)."""

    def __init__(
        self,
        owner: MemberPolicy,
        observation: torch.Tensor,
        mask: torch.Tensor | None,
        hidden: torch.Tensor | None = None,
    ) -> None:
        self.owner, self.observation, self.mask = owner, observation, mask
        self.hidden = hidden  # a recurrent policy's next state [S * B, n, h]: its MLP reads it
        self._raw: torch.Tensor | None = None

    def _run(self, fn: Callable, *per_env: torch.Tensor):
        """`fn(dist, *args)` with each member's distribution, over `[S * B, ...]` tensors."""
        members, policy = self.owner.members, self.owner.policy
        mask = split(self.mask, members.count) if self.mask is not None else None
        hidden = split(self.hidden, members.count) if self.hidden is not None else None

        def one(observation, mask, hidden, *args):
            if hidden is None:
                return fn(policy(observation, mask), *args)
            return fn(policy.from_hidden(hidden, mask), *args)

        per_member = (split(x, members.count) for x in per_env)
        out = members(one, split(self.observation, members.count), mask, hidden, *per_member)
        return tuple(join(x) for x in out) if isinstance(out, tuple) else join(out)

    def sample(self, noise: torch.Tensor) -> torch.Tensor:
        def act(dist, noise):
            raw = dist.sample(noise)
            return raw, dist.log_prob(raw), dist.env_action(raw)

        def act_only(dist, noise):
            raw = dist.sample(noise)
            return raw, dist.env_action(raw)

        if self.owner.log_prob:
            self._raw, self._log_prob, self._env_action = self._run(act, noise)
        else:
            self._raw, self._env_action = self._run(act_only, noise)
        return self._raw

    def random(self, noise: torch.Tensor) -> torch.Tensor:
        """A uniformly random action (off-policy warm-up: `marl.core.distributions.RandomWhile`)."""
        return self._run(lambda dist, noise: dist.random(noise), noise)

    def log_prob(self, raw: torch.Tensor) -> torch.Tensor:
        if raw is self._raw and self.owner.log_prob:
            return self._log_prob
        return self._run(lambda dist, raw: dist.log_prob(raw), raw)

    def env_action(self, raw: torch.Tensor) -> torch.Tensor:
        if raw is self._raw:
            return self._env_action
        return self._run(lambda dist, raw: dist.env_action(raw), raw)

    def mode(self) -> torch.Tensor:
        return self._run(lambda dist: dist.mode())


def stacked_norms(grads: Sequence[torch.Tensor]) -> torch.Tensor:
    """The gradient norm of each member over `grads` (`[S, ...]` each): `[S]`. One norm over the grads side
    by side (`[S, total size]`): a few ops for any number of tensors (a GPU's small steps cost host time
    per op)."""
    return torch.linalg.vector_norm(torch.cat([g.reshape(g.shape[0], -1) for g in grads], 1), dim=1)


def clip_members_(params: Sequence[torch.Tensor], max_norm: float) -> torch.Tensor:
    """Clip each member's gradient of `params` (`[S, ...]`) to `max_norm` in place, as
    `torch.nn.utils.clip_grad_norm_` clips a single run's; returns each member's norm before, `[S]`."""
    grads = [p.grad for p in params if p.grad is not None]
    norms = stacked_norms(grads)
    factor = (max_norm / (norms + 1e-6)).clamp(max=1.0)
    shaped = {d: factor.view(-1, *([1] * (d - 1))) for d in {g.dim() for g in grads}}  # [S, 1, ...] per rank
    torch._foreach_mul_(grads, [shaped[g.dim()] for g in grads])
    return norms


def member_optimizer_state(optimizer: torch.optim.Optimizer, k: int, lr: Sequence[float] | None = None) -> dict:
    """Member `k`'s slot of `optimizer`'s state over stacked parameters `[S, ...]` (Adam's moments; its
    step count is every member's), as the single run's optimiser's `state_dict()`. With each member's learning
    rate `lr` (a swept lr: `member_lr_step`, the optimiser's own then 1, or a schedule's factor), the member's
    param groups hold its own times theirs, as its single run's do: a single run loads its lr from them."""
    state = optimizer.state_dict()
    per_param = {
        i: {name: (value[k].clone() if name != "step" else value.clone()) for name, value in held.items()}
        for i, held in state["state"].items()
    }
    groups = state["param_groups"]
    if lr is not None:
        groups = [{**group, "lr": lr[k] * group["lr"]} for group in groups]
    return {"state": per_param, "param_groups": groups}


@torch.no_grad()
def member_lr_step(optimizer: torch.optim.Optimizer, params: Sequence[torch.Tensor], lr: torch.Tensor | None) -> None:
    """`optimizer.step()`; with each member's learning rate `lr` `[S]` (the optimiser's own then 1), each
    member's step of `params` (`[S, ...]`) scaled by its own: Adam's step is proportional to its lr."""
    if lr is None:
        optimizer.step()
        return
    before = [p.clone() for p in params]
    optimizer.step()
    for p, old in zip(params, before):
        p.copy_(old + lr.view(-1, *([1] * (p.dim() - 1))) * (p - old))


@torch.no_grad()
def member_polyak_(targets: Sequence[torch.Tensor], online: Sequence[torch.Tensor], tau: torch.Tensor) -> None:
    """`target <- (1 - tau) * target + tau * online` with each member's own `tau` `[S]`, for every pair of
    stacked tensors `[S, ...]` (a single run's Polyak update, `marl.algorithms.offpolicy.polyak_`, per member)."""
    for target, source in zip(targets, online):
        target.lerp_(source, tau.view(-1, *([1] * (target.dim() - 1))))


def draw_member_noise(
    draw: Callable[[tuple[int, ...], torch.Generator], torch.Tensor],
    shape: tuple[int, ...],
    generators: Sequence[torch.Generator],
) -> torch.Tensor:
    """One rollout's noise `[T, S * B, ...]`: member `k`'s `[T, B, ...]` block drawn by `draw(shape,
    generator)` from its own generator, as a single run with its seed draws it. A loop over the members
    once per rollout (never per step): torch draws from one generator per call."""
    T, num_envs, *rest = shape
    local = (T, num_envs // len(generators), *rest)
    return torch.cat([draw(local, generator) for generator in generators], dim=1)

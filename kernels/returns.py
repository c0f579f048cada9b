"""Discounted and TD(lambda) returns over a time-major rollout.

Layout: every tensor is time-major `[T, *batch]`; row `t` is one contiguous step of the rollout.

Semantics, for each column independently, walking time backwards. With a critic (`next_value`, the
value of the true next observation of step `t`, before any auto-reset):

    G[t] = reward[t] + gamma * (1 - terminated[t]) * ((1 - lmbda) * next_value[t] + lmbda * B[t])
    B[t] = next_value[t] if done[t] or t == T - 1 else G[t + 1]

`terminated` zeroes the bootstrap; `done` cuts the trace, and a truncated step (done, not terminated)
bootstraps from its own `next_value[t]`, as does the last step of the rollout. `lmbda = 1` gives
discounted returns bootstrapped from the critic, `lmbda = 0` one-step TD targets. Where
`next_value[t] == value[t + 1]` within episodes, `td_lambda_returns` equals GAE's `value_target`.

Without a critic (`discounted_returns` without `next_value`), Monte-Carlo returns cut at `done`:

    G[t] = reward[t] + gamma * (1 - done[t]) * G[t + 1],   G[T] = 0

Values are not checked (that would make the host wait for the device): the flags cut by multiplying, so
a NaN or inf in a column makes its earlier steps NaN, across `done` and from a terminated step's
`next_value` too (0 * inf is NaN), as in `kernels/gae.py`.

One Triton kernel serves both ops (`BOOTSTRAP` chooses the formula); each op also has a fast torch path,
a reference loop and one public function, as in `kernels/gae.py`.
"""

from __future__ import annotations

import torch

from ._common import (
    Backend,
    autotuned,
    backwards_recurrence,
    check_inputs,
    check_unit_interval,
    column_offsets,
    decay,
    flag_as_number,
    last_row,
    launch_columns,
    resolve_backend,
    reverse_recurrence_,
    tl,
    triton_jit,
)


# One line per tensor's strides: keep the signature as written.
# fmt: off
@triton_jit
def _returns_kernel(
    reward_ptr, next_value_ptr, done_ptr, terminated_ptr,  # inputs [T, *batch], any strides
    returns_ptr,  # output [T, N] float32, contiguous
    T, N, N2,  # steps, columns, and the inner size of the [N1, N2] grid of columns
    r_st, r_s1, r_s2, nv_st, nv_s1, nv_s2, d_st, d_s1, d_s2, m_st, m_s1, m_s2,
    gamma, lmbda,
    BOOTSTRAP: tl.constexpr,  # TD(lambda) returns from next_value; else Monte-Carlo (next_value unread)
    FLAT: tl.constexpr,  # the batch dims of every input collapse to one (see column_offsets)
    BLOCK: tl.constexpr,  # columns per program
    TILE: tl.constexpr,  # time steps per tile: loaded together, then scanned in parallel (as in _gae_kernel)
):
    columns = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)  # [BLOCK]
    in_range = columns < N
    rows = tl.arange(0, TILE)[:, None]  # [TILE, 1]: row i of a tile holds step `last - i`, latest first
    reward_ptr += column_offsets(columns, N2, r_s1, r_s2, FLAT)  # [BLOCK] pointers, step 0 of each column
    next_value_ptr += column_offsets(columns, N2, nv_s1, nv_s2, FLAT)
    done_ptr += column_offsets(columns, N2, d_s1, d_s2, FLAT)
    terminated_ptr += column_offsets(columns, N2, m_s1, m_s2, FLAT)
    if BOOTSTRAP:  # G[T] = next_value[T - 1]: the last step bootstraps as if truncated
        ret = tl.load(next_value_ptr + tl.cast(T - 1, tl.int64) * nv_st, mask=in_range).to(tl.float32)
    else:
        ret = tl.zeros([BLOCK], dtype=tl.float32)  # G[last + 1], then the later tile's
    for start in range(0, T, TILE):
        last = T - 1 - start
        t = (last - rows).to(tl.int64)  # [TILE, 1]
        mask = (t >= 0) & in_range[None, :]  # [TILE, BLOCK]: rows before step 0 are zeros, not stored
        reward = tl.load(reward_ptr + t * r_st, mask=mask, other=0.0).to(tl.float32)  # [TILE, BLOCK] each
        done = tl.load(done_ptr + t * d_st, mask=mask, other=0).to(tl.float32)
        if BOOTSTRAP:
            next_value = tl.load(next_value_ptr + t * nv_st, mask=mask, other=0.0).to(tl.float32)
            terminated = tl.load(terminated_ptr + t * m_st, mask=mask, other=0).to(tl.float32)
            # G[t] = reward + bootstrap * ((1 - lmbda) * next_value + lmbda * B[t]), bootstrap = gamma *
            # (1 - terminated), B[t] = next_value if done else G[t + 1]; as G[t] = c + a * G[t + 1]:
            bootstrap = gamma * (1.0 - terminated)
            trace = bootstrap * lmbda * (1.0 - done)  # the share of G[t + 1]
            own = reward + (bootstrap - trace) * next_value  # the rest of the bootstrap is next_value[t]
        else:  # G[t] = reward + gamma * (1 - done) * G[t + 1]
            trace = gamma * (1.0 - done)
            own = reward
        returns = backwards_recurrence(trace, own, ret)  # [TILE, BLOCK]
        tl.store(returns_ptr + t * N + columns[None, :], returns, mask=mask)
        ret = last_row(returns, TILE)  # G of the tile's earliest step: the earlier tile's G[t + 1]


# fmt: on
_returns_kernel_tuned = autotuned(_returns_kernel)


def _returns_triton(reward, next_value, done, terminated, *, gamma, lmbda, shape):
    returns = torch.empty(shape, dtype=torch.float32, device=reward.device)
    bootstrap = next_value is not None
    # Without a critic the kernel never reads next_value and terminated: reward stands in for them.
    inputs = (reward, next_value, done, terminated) if bootstrap else (reward, reward, done, reward)
    outputs, scalars = (returns,), (gamma, lmbda)
    launch_columns(_returns_kernel, _returns_kernel_tuned, inputs, outputs, scalars, BOOTSTRAP=bootstrap)
    return returns


def _returns_torch(reward, next_value, done, terminated, *, gamma, lmbda, shape):
    # G[t] = c[t] + trace[t] * G[t + 1], with trace = gamma * lmbda * (1 - terminated) * (1 - done) and
    # c = reward + gamma * (1 - terminated) * next_value - next_value * trace; the last step bootstraps.
    returns = torch.empty(shape, dtype=torch.float32, device=reward.device)  # contiguous rows
    flags = done.shape if next_value is None else torch.broadcast_shapes(done.shape, terminated.shape)
    trace = torch.empty(flags, dtype=torch.float32, device=reward.device)
    returns.copy_(reward)  # fp32; reward may be broadcast against the output
    if next_value is None:
        decay(done, gamma, out=trace)
    else:
        # The bootstrap as next_value times gamma * (1 - terminated), exactly 0 where terminated (as in
        # GAE): adding gamma * next_value and taking it off again rounded the reward away under a large
        # next_value.
        bootstrap = decay(
            terminated, gamma, out=torch.empty(terminated.shape, dtype=torch.float32, device=reward.device)
        )
        decay(done, gamma * lmbda, out=trace)
        trace.addcmul_(trace, flag_as_number(terminated), value=-1.0)
        returns.addcmul_(next_value, bootstrap)
        returns.addcmul_(next_value, trace, value=-1.0)
        # G[T - 1] = reward + gamma * (1 - terminated) * next_value: no trace
        torch.addcmul(reward[-1].float(), next_value[-1], bootstrap[-1], out=returns[-1])
    return reverse_recurrence_(returns, trace)


def td_lambda_returns_reference(
    reward: torch.Tensor,
    next_value: torch.Tensor,
    done: torch.Tensor,
    terminated: torch.Tensor,
    *,
    gamma: float,
    lmbda: float,
) -> torch.Tensor:
    """TD(lambda) returns as a plain loop over time, written to be checked by eye; as `td_lambda_returns`."""
    returns = torch.zeros(next_value.shape, dtype=torch.float32, device=next_value.device)
    next_return = next_value[-1].float()  # the last step bootstraps as if truncated
    for t in reversed(range(next_value.shape[0])):
        done_t = done[t].float()
        not_terminated = 1.0 - terminated[t].float()
        bootstrap = done_t * next_value[t].float() + (1.0 - done_t) * next_return
        next_return = reward[t].float() + gamma * not_terminated * (
            (1.0 - lmbda) * next_value[t].float() + lmbda * bootstrap
        )
        returns[t] = next_return
    return returns


def discounted_returns_reference(reward: torch.Tensor, done: torch.Tensor, *, gamma: float) -> torch.Tensor:
    """Monte-Carlo discounted returns as a plain loop over time; as `discounted_returns` without a critic."""
    returns = torch.zeros(reward.shape, dtype=torch.float32, device=reward.device)
    next_return = torch.zeros(reward.shape[1:], dtype=torch.float32, device=reward.device)  # G[T] = 0
    for t in reversed(range(reward.shape[0])):
        next_return = reward[t].float() + gamma * (1.0 - done[t].float()) * next_return
        returns[t] = next_return
    return returns


def _returns_reference(reward, next_value, done, terminated, *, gamma, lmbda, shape):
    if next_value is None:
        return discounted_returns_reference(reward, done, gamma=gamma)
    # discounted_returns' output is reward's shape, against which next_value may have size 1 in a batch dim;
    # td_lambda_returns_reference makes next_value's.
    next_value = next_value.expand(shape)
    return td_lambda_returns_reference(reward, next_value, done, terminated, gamma=gamma, lmbda=lmbda)


_IMPLEMENTATIONS = {"triton": _returns_triton, "torch": _returns_torch, "reference": _returns_reference}


@torch.no_grad()
def td_lambda_returns(
    reward: torch.Tensor,
    next_value: torch.Tensor,
    done: torch.Tensor,
    terminated: torch.Tensor,
    *,
    gamma: float,
    lmbda: float,
    backend: Backend = "auto",
) -> torch.Tensor:
    """TD(lambda) returns of a time-major rollout, bootstrapped from the critic.

    Args:
        reward: `[T, *batch]` floating point (computed in float32), reward of each step.
        next_value: `[T, *batch]` floating point (computed in float32), `V` of the true next observation
            of step `t` (before any reset); its shape is the output shape.
        done: `[T, *batch]` bool (or float 0.0/1.0), the episode ended at step `t`, by termination or
            truncation: cuts the trace.
        terminated: `[T, *batch]` bool (or float 0.0/1.0), the episode ended for real at step `t`:
            zeroes the bootstrap. A truncated step (done, not terminated) bootstraps from `next_value`.
        gamma: discount in [0, 1].
        lmbda: TD(lambda) lambda in [0, 1].
        backend: `"auto"` (Triton for CUDA tensors, and for CPU tensors under `TRITON_INTERPRET=1`;
            the fast torch path otherwise), `"triton"`, `"torch"` or `"reference"`.

    `reward` and the flags may have size 1 in any batch dim (e.g. env-level flags `[T, B, 1, 1]` against
    per-agent values `[T, B, n, 1]`), read through strides; any strides are accepted.

    Returns:
        `[T, *batch]` float32, contiguous; a target, so no gradient flows through it.
    """
    gamma = check_unit_interval("td_lambda_returns", "gamma", gamma)
    lmbda = check_unit_interval("td_lambda_returns", "lmbda", lmbda)
    values = {"reward": reward, "next_value": next_value}
    flags = {"done": done, "terminated": terminated}
    shape, device = check_inputs("td_lambda_returns", "next_value", values, flags)
    run = _IMPLEMENTATIONS[resolve_backend(backend, device, _returns_kernel)]
    return run(reward, next_value, done, terminated, gamma=gamma, lmbda=lmbda, shape=shape)


@torch.no_grad()
def discounted_returns(
    reward: torch.Tensor,
    done: torch.Tensor,
    *,
    gamma: float,
    next_value: torch.Tensor | None = None,
    terminated: torch.Tensor | None = None,
    backend: Backend = "auto",
) -> torch.Tensor:
    """Discounted returns of a time-major rollout: Monte-Carlo, or bootstrapped from a critic.

    Args:
        reward: `[T, *batch]` floating point (computed in float32), reward of each step; its shape is the
            output shape.
        done: `[T, *batch]` bool (or float 0.0/1.0), the episode ended at step `t`: the return stops there.
        gamma: discount in [0, 1].
        next_value: optional `[T, *batch]`, `V` of the true next observation of step `t`. Without it the
            returns are Monte-Carlo, `G[t] = reward[t] + gamma * (1 - done[t]) * G[t + 1]`, `G[T] = 0`.
            With it, truncated steps and the rollout's last step bootstrap from it: this is
            `td_lambda_returns(..., lmbda=1)`.
        terminated: `[T, *batch]` bool (or float 0.0/1.0), required with `next_value` (and only then):
            the episode ended for real, so no bootstrap.
        backend: as in `td_lambda_returns`.

    `done`, `terminated` and `next_value` may have size 1 in any batch dim, read through strides.

    Returns:
        `[T, *batch]` float32, contiguous; a target, so no gradient flows through it.
    """
    gamma = check_unit_interval("discounted_returns", "gamma", gamma)
    if (next_value is None) != (terminated is None):
        raise ValueError(
            "discounted_returns: pass next_value and terminated together (truncated steps bootstrap from"
            " next_value, terminated ones do not), or neither for Monte-Carlo returns"
        )
    values = {"reward": reward, "next_value": next_value}
    flags = {"done": done, "terminated": terminated}
    optional = ("next_value", "terminated")
    shape, device = check_inputs("discounted_returns", "reward", values, flags, optional)
    run = _IMPLEMENTATIONS[resolve_backend(backend, device, _returns_kernel)]
    return run(reward, next_value, done, terminated, gamma=gamma, lmbda=1.0, shape=shape)

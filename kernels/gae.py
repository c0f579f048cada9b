"""Generalized advantage estimation (Schulman et al. 2016) over a time-major rollout.

Layout: every tensor is time-major `[T, *batch]` (`*batch` is any number of dims, e.g. `[B, n, 1]` for
`B` envs and `n` agents); row `t` is one contiguous step of the rollout.

Semantics, for each column independently, walking time backwards from `A[T] = 0`:

    delta[t] = reward[t] + gamma * (1 - terminated[t]) * next_value[t] - value[t]
    A[t]     = delta[t] + gamma * lmbda * (1 - done[t]) * A[t + 1]
    value_target[t] = A[t] + value[t]

`next_value[t]` is the value of the true next observation of step `t` (before any auto-reset).
`terminated` zeroes the bootstrap (the episode really ended) and `done` cuts the trace (the next row
belongs to another episode). A truncated step (done and not terminated) keeps its bootstrap
`next_value[t]`. `terminated` implies `done`.

`gamma` and `lmbda` are floats, or tensors of one value per column (`[*batch]`-broadcastable, e.g. one per
env of a population whose members discount differently): column `j` then uses its own in both lines.

Four implementations, held to each other by the tests:
- `_gae_kernel`: the Triton kernel, one program per block of columns walking time backwards a tile of
  steps at a time, each tile's recurrence a parallel scan;
- `_gae_torch`: the fast CPU path, a vectorised `delta`, then fused ops over contiguous rows walking
  time backwards (`reverse_recurrence_`);
- `gae_reference`: a plain loop a reader can check against the formulas above;
- `gae`: the public function that checks its inputs and dispatches.
"""

from __future__ import annotations

import torch

from ._common import (
    Backend,
    autotuned,
    backwards_recurrence,
    check_inputs,
    check_per_column,
    column_offsets,
    decay,
    decay_shape,
    last_row,
    launch_columns,
    resolve_backend,
    reverse_recurrence_,
    scratch,
    tl,
    triton_jit,
)


# One line per tensor's strides: keep the signature as written.
# fmt: off
@triton_jit
def _gae_kernel(
    reward_ptr, value_ptr, next_value_ptr, done_ptr, terminated_ptr,  # inputs [T, *batch], any strides
    advantage_ptr, value_target_ptr,  # outputs [T, N] float32, contiguous
    T, N, N2,  # steps, columns, and the inner size of the [N1, N2] grid of columns
    r_st, r_s1, r_s2, v_st, v_s1, v_s2, nv_st, nv_s1, nv_s2, d_st, d_s1, d_s2, m_st, m_s1, m_s2,
    gamma, g_s1, g_s2, lmbda, l_s1, l_s2,  # floats (strides 0), or pointers to one value per column
    FLAT: tl.constexpr,  # the batch dims of every input collapse to one (see column_offsets)
    GAMMA_PER_COLUMN: tl.constexpr,  # gamma points to a float32 [*batch] tensor (column strides g_s1, g_s2)
    LMBDA_PER_COLUMN: tl.constexpr,  # lmbda likewise
    BLOCK: tl.constexpr,  # columns per program
    TILE: tl.constexpr,  # time steps per tile: loaded together, then scanned in parallel
):
    columns = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)  # [BLOCK]
    in_range = columns < N
    rows = tl.arange(0, TILE)[:, None]  # [TILE, 1]: row i of a tile holds step `last - i`, latest first
    reward_ptr += column_offsets(columns, N2, r_s1, r_s2, FLAT)  # [BLOCK] pointers, step 0 of each column
    value_ptr += column_offsets(columns, N2, v_s1, v_s2, FLAT)
    next_value_ptr += column_offsets(columns, N2, nv_s1, nv_s2, FLAT)
    done_ptr += column_offsets(columns, N2, d_s1, d_s2, FLAT)
    terminated_ptr += column_offsets(columns, N2, m_s1, m_s2, FLAT)
    # A per-column gamma or lmbda is read once, [BLOCK]: a column keeps its value for the whole rollout.
    if GAMMA_PER_COLUMN:
        gamma = tl.load(gamma + column_offsets(columns, N2, g_s1, g_s2, FLAT), mask=in_range, other=0.0)
    if LMBDA_PER_COLUMN:
        lmbda = tl.load(lmbda + column_offsets(columns, N2, l_s1, l_s2, FLAT), mask=in_range, other=0.0)
    trace_decay = gamma * lmbda  # a float, or [BLOCK] (broadcast over a tile's rows)
    advantage = tl.zeros([BLOCK], dtype=tl.float32)  # A[last + 1] in fp32: A[T] = 0, then the later tile's
    for start in range(0, T, TILE):
        last = T - 1 - start
        t = (last - rows).to(tl.int64)  # [TILE, 1]
        # Rows before step 0 (the end of the earliest tile) load zeros; they follow every real step in the
        # scan, so they change none, and they are not stored.
        mask = (t >= 0) & in_range[None, :]  # [TILE, BLOCK]
        reward = tl.load(reward_ptr + t * r_st, mask=mask, other=0.0).to(tl.float32)  # [TILE, BLOCK] each
        value = tl.load(value_ptr + t * v_st, mask=mask, other=0.0).to(tl.float32)
        next_value = tl.load(next_value_ptr + t * nv_st, mask=mask, other=0.0).to(tl.float32)
        done = tl.load(done_ptr + t * d_st, mask=mask, other=0).to(tl.float32)
        terminated = tl.load(terminated_ptr + t * m_st, mask=mask, other=0).to(tl.float32)
        delta = reward + gamma * (1.0 - terminated) * next_value - value
        # A[t] = delta[t] + trace_decay * (1 - done[t]) * A[t + 1] for every step of the tile at once
        advantages = backwards_recurrence(trace_decay * (1.0 - done), delta, advantage)  # [TILE, BLOCK]
        tl.store(advantage_ptr + t * N + columns[None, :], advantages, mask=mask)
        tl.store(value_target_ptr + t * N + columns[None, :], advantages + value, mask=mask)
        advantage = last_row(advantages, TILE)  # A of the tile's earliest step: the earlier tile's A[t + 1]


# fmt: on
_gae_kernel_tuned = autotuned(_gae_kernel)


def _gae_triton(reward, value, next_value, done, terminated, *, gamma, lmbda):
    advantage = torch.empty(value.shape, dtype=torch.float32, device=value.device)
    value_target = torch.empty_like(advantage)
    inputs = (reward, value, next_value, done, terminated)
    launch_columns(
        _gae_kernel,
        _gae_kernel_tuned,
        inputs,
        (advantage, value_target),
        scalars=(),
        per_column=(gamma, lmbda),
        GAMMA_PER_COLUMN=isinstance(gamma, torch.Tensor),
        LMBDA_PER_COLUMN=isinstance(lmbda, torch.Tensor),
    )
    return advantage, value_target


def _gae_torch(reward, value, next_value, done, terminated, *, gamma, lmbda):
    advantage = torch.empty(value.shape, dtype=torch.float32, device=value.device)  # contiguous rows
    value_target = torch.empty_like(advantage)
    # delta = reward - value + gamma * (1 - terminated) * next_value, in fp32; value has the output's
    # shape, so the first op writes all of delta (reward and next_value may be broadcast)
    delta = advantage
    torch.sub(reward.float(), value, out=delta)
    # The bootstrap as next_value times gamma * (1 - terminated), exactly 0 where terminated: adding
    # gamma * next_value and taking it off again rounded the reward away under a large next_value.
    # value_target is scratch until it is written last (flags have at most the output's size).
    # (A per-column gamma may be wider than a flag, e.g. [B, n, 1] against env flags [T, B, 1, 1]: the
    # decay then takes the shape of both, at most the output's.)
    delta.addcmul_(next_value, decay(terminated, gamma, out=scratch(value_target, decay_shape(terminated, gamma))))
    trace_decay = gamma * lmbda  # a float, or [*batch]-broadcastable float32 when either is a tensor
    trace = scratch(value_target, decay_shape(done, trace_decay))  # until value_target is written
    decay(done, trace_decay, out=trace)
    reverse_recurrence_(advantage, trace)
    torch.add(advantage, value, out=value_target)
    return advantage, value_target


def gae_reference(
    reward: torch.Tensor,
    value: torch.Tensor,
    next_value: torch.Tensor,
    done: torch.Tensor,
    terminated: torch.Tensor,
    *,
    gamma: float | torch.Tensor,
    lmbda: float | torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE as a plain loop over time, written to be checked by eye; same arguments as `gae` (a tensor
    gamma or lmbda broadcasts against each step's `[*batch]`)."""
    advantage = torch.zeros(value.shape, dtype=torch.float32, device=value.device)
    next_advantage = torch.zeros(value.shape[1:], dtype=torch.float32, device=value.device)  # A[T] = 0
    for t in reversed(range(value.shape[0])):
        not_terminated = 1.0 - terminated[t].float()
        not_done = 1.0 - done[t].float()
        delta = reward[t].float() + gamma * not_terminated * next_value[t].float() - value[t].float()
        next_advantage = delta + gamma * lmbda * not_done * next_advantage
        advantage[t] = next_advantage
    return advantage, advantage + value.float()


@torch.no_grad()
def gae(
    reward: torch.Tensor,
    value: torch.Tensor,
    next_value: torch.Tensor,
    done: torch.Tensor,
    terminated: torch.Tensor,
    *,
    gamma: float | torch.Tensor,
    lmbda: float | torch.Tensor,
    backend: Backend = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalized advantage estimates and value targets of a time-major rollout.

    Args:
        reward: `[T, *batch]` floating point (computed in float32), reward of each step.
        value: `[T, *batch]` floating point (computed in float32), `V(obs[t])`; its shape is the output
            shape.
        next_value: `[T, *batch]`, `V` of the true next observation of step `t` (before any reset).
        done: `[T, *batch]` bool (or float 0.0/1.0), the episode ended at step `t`, by termination or
            truncation: cuts the trace.
        terminated: `[T, *batch]` bool (or float 0.0/1.0), the episode ended for real at step `t`:
            zeroes the bootstrap. A truncated step (done, not terminated) bootstraps from `next_value`.
        gamma: discount in [0, 1]: a Python float (checked), or a float32 tensor on the inputs' device
            of one value per column, e.g. `[B, 1, 1]` (one per env) for `[T, B, n, 1]` inputs. It
            broadcasts against `[*batch]` as torch broadcasts, aligned on the right, without enlarging
            it: at most `len(batch)` dims, each 1 or the batch dim's size, and no time dim. Its values are
            not checked, as reading them would make the host wait for the device at every call: build it
            once from checked numbers. A float stays the fastest path.
        lmbda: GAE lambda in [0, 1], a float or a per-column tensor as `gamma` (either may be a tensor).
        backend: `"auto"` (Triton for CUDA tensors, and for CPU tensors under `TRITON_INTERPRET=1`;
            the fast torch path otherwise), `"triton"`, `"torch"` or `"reference"`.

    `reward`, `next_value` and the flags may have size 1 in any batch dim (e.g. env-level flags
    `[T, B, 1, 1]` against per-agent values `[T, B, n, 1]`); they are read through strides, not copied.
    Any strides are accepted.

    Values are not checked (that would make the host wait for the device): the flags cut by multiplying,
    so a NaN or inf in a column makes its earlier steps NaN, across `done` and from a terminated step's
    `next_value` too (0 * inf is NaN).

    Returns:
        `(advantage, value_target)`, both `[T, *batch]` float32 and contiguous, with
        `value_target = advantage + value`. They are targets: no gradient flows through them.
    """
    values = {"reward": reward, "value": value, "next_value": next_value}
    shape, device = check_inputs("gae", "value", values, {"done": done, "terminated": terminated})
    gamma = check_per_column("gae", "gamma", gamma, shape, device)
    lmbda = check_per_column("gae", "lmbda", lmbda, shape, device)
    implementation = {"triton": _gae_triton, "torch": _gae_torch, "reference": gae_reference}
    run = implementation[resolve_backend(backend, device, _gae_kernel)]
    return run(reward, value, next_value, done, terminated, gamma=gamma, lmbda=lmbda)

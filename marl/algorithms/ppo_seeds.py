"""PPO for several seeds in one process (`marl train --seeds 0 1 2 3 4`): member `k` learns exactly as a
single run with seed `k` does (to float rounding: batched matmuls sum in another order).

Each member's nets are built as a single run builds them (the global RNG seeded with the member's seed),
then stacked (`marl.core.members.Members`): collection, values and losses run every member at once under
`vmap`. What a single run computes over its own rows stays per member: loss means (inside the vmapped
loss), advantage normalisation (over each member's minibatch), GAE (per env column), the critics'
running moments (`[S]` buffers), gradient-norm clipping (`clip_members_`) and the minibatch orders (each
member's generator). Adam over stacked parameters is elementwise, so one Adam per group is `S` single
runs' Adams. On a CPU the critic passes and each step's forward and backward go through their rows in
chunks (`CHUNK_ROWS`, `UPDATE_CHUNK_ROWS`): S times a single run's activations outgrow the caches. On a
GPU they go whole (`chunked`): there a small batch costs host time per op launched, not memory traffic,
and chunks of rows would launch about S times a single run's ops.

With `--compile` (one process) each minibatch step is one compiled graph (`compiled_step`, the update step
of `marl.optim.update_step` over the stacked nets, as a single run's): the advantages normalised per member,
the vmapped loss, the gradients of the members' summed losses by `torch.func.grad`, each member's norms and
clipping per net, Adam (scaled by each member's swept lr). On a CPU its forward and backward too go through
the rows in chunks (`chunks`, in the graph: `UpdateStep`'s `split`): whole, the compiled update of three
seeds took as long as the eager chunked one (1.6 s an iteration at `marl train`'s defaults), in chunks 1.0 s
(marl/bench/README.md, seeds).

A population (`--sweep lr=1e-4,1e-3`) gives each member its own values of `SWEEPABLE` options, as `[S]`
tensors: the loss reads them (vmapped, one value per member), and a swept learning rate scales each
member's Adam step (Adam then steps with lr 1). A swept `gamma` or `lmbda` is a per-env-column tensor to
the GAE kernel (member `k`'s value on its block of columns): one call for the whole population.

Recurrent nets (`--model gru`) as `PPO`'s: the members' policies act from their envs' states (`MemberPolicy`
with `hidden`), a recurrent critic runs over each member's rollout from its envs' carried states (the
template's `critic_hidden`, `[S * B, m, h]`, in the checkpoint as a single run's), and each member's rollout
is cut into its chunks by `PPO`'s own `chunk_windows` under vmap; each epoch shuffles each member's chunks.
"""

from __future__ import annotations

import math

import torch
from tensordict import TensorDict
from torch import nn
from torch.func import vmap

import kernels
from marl.algorithms.base import register_seeded
from marl.algorithms.ppo import (
    LOSS_TERMS,
    NETS,
    PPO,
    UPDATE_KEYS,
    chunk_windows,
    explained_variance,
    linear_lr_factors,
)
from marl.algorithms.seeded import Seeded, swept_options
from marl.config import TrainConfig, options_without_effect
from marl.core.masking import agents_in, masked_moments, standardized
from marl.core.members import (
    MemberPolicy,
    Members,
    clip_members_,
    join,
    member_lr_step,
    member_optimizer_state,
    split,
)
from marl.core.rollout import Acting, observations
from marl.optim.update_step import Trainable, UpdateStep, adam

SWEEPABLE = ("lr", "entropy_coef", "clip_eps", "value_coef", "gamma", "lmbda")
DISCOUNTS = ("gamma", "lmbda")  # swept, read by GAE (`_gae`), not by the loss
CHUNK_ROWS = 4096  # env steps of all members per chunk of the advantages' critic passes (`_in_chunks`)
UPDATE_CHUNK_ROWS = 2048  # minibatch frames of all members per chunk of a step's forward and backward (`step`)


@register_seeded("mappo", "ippo")
class SeededPPO(Seeded):
    """`PPO` for `len(seeds)` members; `generators[k]` is member `k`'s random stream (collection noise and
    minibatch orders), as a single run's."""

    SWEEPABLE = SWEEPABLE
    recurrent = True  # --model gru: recurrent policies and critics, trained on each member's chunks
    sweep_owner = "PPO's"
    single = PPO

    def check(self) -> None:
        if self.config.algo.overlap_critic:  # the population's update never runs the singles' apart steps
            raise options_without_effect(
                ["--overlap-critic"],
                "a single run's update only (its critics' steps on a second thread); a population steps every "
                "member's policies and critics together, in one vmapped step",
                None,
            )

    def build(self, singles: list[PPO]) -> None:
        # Each member's values of the swept options the loss reads, [S]; a swept lr scales the Adam steps.
        self.swept = {
            n: torch.tensor(v, device=self.device) for n, v in self.sweep.items() if n not in ("lr", *DISCOUNTS)
        } or None
        # Each swept gamma or lmbda per env column, [S * B]: member k's value (checked by its PPOConfig) on
        # its block of B columns, the per-column tensor GAE reads.
        self.discounts = {
            n: torch.tensor(v, dtype=torch.float32, device=self.device).repeat_interleave(self.config.env.num_envs)
            for n, v in self.sweep.items()
            if n in DISCOUNTS
        }
        # Rows in chunks on a CPU only (the module docstring): on a GPU one iteration's ops stay as many for
        # any number of members.
        self.chunked = self.device.type == "cpu"
        self.template = singles[0]  # its nets run every member's tensors (`Members`)
        self.members = Members([_nets(single) for single in singles])
        # Per group its stacked parameters in a single run's optimiser order (every net's, in NETS' order).
        self.group_params = {
            g: {net: self.stacked(getattr(lr, net).parameters()) for net in NETS}
            for g, lr in self.template.learners.items()
        }
        self.base_lr = {
            g: 1.0 if self.member_lr is not None else lr.algo.lr for g, lr in self.template.learners.items()
        }
        self.optimizers = {
            g: adam([p for net in NETS for p in self.group_params[g][net]], lr=self.base_lr[g], eps=lr.algo.adam_eps)
            for g, lr in self.template.learners.items()
        }
        # --compile (one process): each minibatch step is one compiled graph (`UpdateStep` over the stacked
        # nets), its rows in the eager step's chunks on a CPU; otherwise `step` takes it eagerly.
        self.compiled_step = None
        if self.config.run.compile and self.world.size == 1:
            self.compiled_step = UpdateStep(
                {
                    g: Trainable({net: getattr(lr, net) for net in NETS}, self.optimizers[g], lr.algo.max_grad_norm)
                    for g, lr in self.template.learners.items()
                },
                self.member_loss,
                self.device,
                self.world,
                compile=True,
                prepare=self.prepare_step,
                members=self.members,
                member_lr=self.member_lr,
                split=self.chunks if self.chunked else None,
            )

    @property
    def acting(self) -> Acting:
        single = self.template.acting  # its recurrent groups' state shapes, whether it stores is_init
        policies = {g: MemberPolicy(self.members, lr.policy) for g, lr in self.template.learners.items()}
        return Acting(policies, True, single.hidden, single.episode_starts)

    @property
    def sequences(self) -> bool:
        """Recurrent nets: the update's samples are each member's chunks (`PPO.sequence_inputs`)."""
        return self.template.sequences

    def schedules(self, frames: int, total_frames: int) -> dict[str, float]:
        """With `lr_schedule` linear: lr * (1 - progress), as `PPO.schedules`; with lr swept, the scale of
        each member's lr (`base_lr` is then 1)."""
        name = "lr" if self.member_lr is None else "lr scale"  # of each run's own lr
        factors = linear_lr_factors(self.template.learners, frames, total_frames)
        return {f"{g} {name}": self.base_lr[g] * factor for g, factor in factors.items()}

    def begin_iteration(self, frames: int, total_frames: int) -> None:
        for g, factor in linear_lr_factors(self.template.learners, frames, total_frames).items():
            for group in self.optimizers[g].param_groups:
                group["lr"] = self.base_lr[g] * factor

    def update(self, batch: TensorDict, timer) -> dict[str, dict[str, torch.Tensor]]:
        """`PPO.update` for every member; each term is `[S]`, one per member."""
        explained = self.advantages(batch)
        timer.mark("advantages_s")
        terms = self.epochs(batch)
        return {g: {"explained_variance": explained[g], **terms[g]} for g in self.template.learners}

    def _critic_buffer(self, g: str, name: str) -> torch.Tensor:
        return self.members.buffers[f"{g}.critic.{name}"]  # [S]

    def _normalized(self, g: str, value: torch.Tensor) -> torch.Tensor:
        """Values `[S, ...]` of group `g` in each member's critic's normalised units (its moments now)."""
        mean, std = self._critic_buffer(g, "target_mean"), self._critic_buffer(g, "target_var").sqrt()
        shape = (self.count, *(1,) * (value.dim() - 1))
        return (value - mean.view(shape)) / std.view(shape)

    @torch.no_grad()
    def advantages(self, batch: TensorDict) -> dict[str, torch.Tensor]:
        """`PPO.advantages` for every member: values, GAE (per env, so over the whole `[T, S * B]` batch),
        each member's critic moments; returns each group's explained variance per member `[S]`."""
        S, groups = self.count, list(self.env.groups)
        obs, state = observations(batch, groups)
        next_obs, next_state = observations(batch, groups, next=True)
        active, next_active = agents_in(batch, groups), agents_in(batch, groups, next=True)
        # [T, S * B, ...] -> [S, T, B, ...]
        obs, next_obs, active, next_active = (
            {g: split(x, S, 1) for g, x in o.items()} for o in (obs, next_obs, active, next_active)
        )
        state, next_state = (split(s, S, 1) if s is not None else None for s in (state, next_state))
        explained = {}
        for g, learner in self.template.learners.items():
            data = batch[g]
            if learner.critic.gru is not None:
                inputs = (obs, state, active, next_obs, next_state, next_active)
                values, next_values = self._recurrent_values(g, learner, batch, *inputs)
            else:

                def value(obs, state, active, learner=learner):
                    return learner.critic.value(learner.critic_input(obs, state, active=active))

                values = self._in_chunks(value, obs, state, active)  # [S, T, B, n]
                next_values = self._in_chunks(value, next_obs, next_state, next_active)
            advantage, target = self._gae(learner.algo, data, join(values, 1), join(next_values, 1))
            # As `PPO.advantages`: `old_value` in each member's normalised units before its moments move.
            data.update({"value": join(values, 1), "advantage": advantage, "value_target": target})
            data["old_value"] = join(self._normalized(g, values), 1)
            in_group = split(data["active"], S, 1) if "active" in data.keys() else None  # [S, T, B, n]
            if in_group is None:
                wide = split(target.double(), S, 1).flatten(1)  # [S, T * B * n]
                moments = (wide.new_full((S,), wide.shape[1]), wide.sum(1), wide.square().sum(1))
            else:  # as `PPO.advantages`: each member's moments over its active agent-steps
                moments = vmap(masked_moments)(split(target, S, 1), in_group).unbind(-1)
            self.members.broadcast(learner.critic.update_moments, *moments)
            counted = () if in_group is None else (in_group,)  # vmap takes tensors only
            explained[g] = vmap(explained_variance)(values, split(target, S, 1), *counted)
        return explained

    def _recurrent_values(
        self, g: str, learner, batch: TensorDict, obs, state, active, next_obs, next_state, next_active
    ):
        """A recurrent critic's values of the rollout and of its next observations `[S, T, B, n]` (reward
        units), every member in one call from its envs' carried states (the template's `critic_hidden`,
        `[S * B, m, h]`), as `PPO.advantages`: it stores each step's starting state in `batch` and carries
        the last to the next rollout. Not in chunks of steps: each step needs the previous one's state.
        `active` and `next_active`: `agents_in`'s, of the steps and of their next observations."""
        S, critic, carried = self.count, learner.critic, self.template.critic_hidden[g]

        def values(obs, state, active, next_obs, next_state, next_active, h0, reset):
            x = learner.critic_input(obs, state, active=active)
            next_x = learner.critic_input(next_obs, next_state, active=next_active)
            value, next_value, started, last = critic.rollout_values(x, next_x, h0, reset)
            return critic.denormalize(value), critic.denormalize(next_value), started, last

        reset = split(batch["is_init"], S, 1)
        inputs = (obs, state, active, next_obs, next_state, next_active)
        value, next_value, started, last = self.members(values, *inputs, split(carried, S), reset)
        batch[g]["critic_hidden"] = join(started, 1)  # [T, S * B, m, h]
        carried.copy_(join(last))  # the next rollout's first step zeroes it where is_init
        return value, next_value

    def env_state_dict(self) -> dict:
        return self.template.env_state_dict()  # every member's envs' recurrent critic states [S * B, m, h]

    def load_env_state_dict(self, state: dict) -> None:
        self.template.load_env_state_dict(state)

    def _gae(self, algo, data: TensorDict, value: torch.Tensor, next_value: torch.Tensor):
        """`kernels.gae` over the `[T, S * B, ...]` batch of a group (its `algo` config), in one call: a swept
        gamma or lmbda goes as a per-column tensor (member `k`'s value on its block of env columns), so each
        member's columns are discounted as its single run's."""
        inputs = (data["reward"], value, next_value, data["done"], data["terminated"])
        trailing = (1,) * (value.dim() - 2)  # [S * B] -> [S * B, 1, ...], against [T, S * B, n, ...]
        gamma, lmbda = (
            self.discounts[n].view(-1, *trailing) if n in self.discounts else getattr(algo, n) for n in DISCOUNTS
        )
        return kernels.gae(*inputs, gamma=gamma, lmbda=lmbda)

    def _in_chunks(self, fn, obs: dict, state, active: dict):
        """`self.members(fn, obs, state, active)` over `[S, T, B, ...]` inputs, on a CPU a few steps `T` at a time:
        every member's values at once would outgrow the CPU's caches (S times a single run's rows), and
        every elementwise op would then run at memory speed. On a GPU in one call (`chunked`)."""
        T, B = next(iter(obs.values())).shape[1:3]
        if not self.chunked:
            return self.members(fn, obs, state, active)
        steps = max(1, CHUNK_ROWS // (self.count * B))
        parts = []
        for t in range(0, T, steps):
            obs_part, active_part = ({g: x[:, t : t + steps] for g, x in d.items()} for d in (obs, active))
            state_part = state[:, t : t + steps] if state is not None else None
            parts.append(self.members(fn, obs_part, state_part, active_part))
        return torch.cat(parts, 1)

    def update_inputs(self, batch: TensorDict) -> tuple[dict[str, dict[str, torch.Tensor]], torch.Tensor | None]:
        """`PPO.update_inputs` per member: `[S, T * B, ...]` (member `k`'s rows in a single run's order),
        values and targets in each member's critic's normalised units. With recurrent nets, as
        `PPO.sequence_inputs`, each member's chunks `[S, C, W, ...]` (its `PER_CHUNK` keys `[S, C, ...]`),
        windowed by `chunk_windows` for every member at once under vmap."""
        S, sequences = self.count, self.sequences
        keys = (*UPDATE_KEYS, "hidden", "critic_hidden") if sequences else UPDATE_KEYS

        def per_member(x: torch.Tensor) -> torch.Tensor:  # [T, S * B, ...] -> [S, T, B, ...] or [S, T * B, ...]
            return split(x, S, 1) if sequences else split(x, S, 1).flatten(1, 2)

        flat = {g: {k: per_member(v) for k, v in batch[g].items() if k in keys} for g in self.template.learners}
        for g, data in flat.items():
            data["value_target"] = self._normalized(g, data["value_target"])
        state = per_member(batch["state"]) if "state" in batch.keys() else None
        if not sequences:
            return flat, state
        algo = self.config.algo

        def windows(flat, is_init):
            return chunk_windows(flat, None, is_init, algo.chunk_length, algo.burn_in)[0]

        def state_windows(state, is_init):
            return chunk_windows({}, state, is_init, algo.chunk_length, algo.burn_in)[1]

        is_init = split(batch["is_init"], S, 1)
        return vmap(windows)(flat, is_init), vmap(state_windows)(state, is_init) if state is not None else None

    def epochs(self, batch: TensorDict) -> dict[str, dict[str, torch.Tensor]]:
        """`PPO.epochs` for every member: each epoch, every member shuffles its own frames with its own
        generator (a loop over the members once per epoch: one draw per generator) and every minibatch step
        steps all members."""
        algo, S = self.config.algo, self.count
        flat, state = self.update_inputs(batch)
        # The samples shuffled: each member's frames, or with recurrent nets its chunks (as `PPO.epochs`).
        L = algo.chunk_length if self.sequences else 1
        frames, size = batch.batch_size.numel() // S // L, algo.minibatch_size // L
        count = frames // size
        sums = {g: torch.zeros(S, len(LOSS_TERMS) + 2, device=self.device) for g in flat}
        rows = torch.arange(S, device=self.device)[:, None]
        for _ in range(algo.epochs):
            order = torch.stack([torch.randperm(frames, generator=gen, device=self.device) for gen in self.generators])
            data = {
                g: {k: v[rows, order] for k, v in tensors.items()} for g, tensors in flat.items()
            }  # [S, frames, ...]
            data_state = state[rows, order] if state is not None else None
            for k in range(count):
                index = slice(k * size, (k + 1) * size)
                minibatch = {g: {key: v[:, index] for key, v in tensors.items()} for g, tensors in data.items()}
                minibatch_state = data_state[:, index] if data_state is not None else None
                if self.compiled_step is not None:
                    out = self.compiled_step(minibatch, minibatch_state, self.swept)
                else:
                    out = self.step(minibatch, minibatch_state)
                for g, vector in out.items():
                    sums[g] += vector
        names = (*LOSS_TERMS, "policy_grad_norm", "critic_grad_norm")
        return {g: dict(zip(names, (vector / (algo.epochs * count)).unbind(-1))) for g, vector in sums.items()}

    def step(self, flat, state) -> dict[str, torch.Tensor]:
        """One minibatch step of every member: the members' losses summed (each member's gradient is its
        own loss's), each member's gradients clipped per net, Adam; per group `[S, terms + 2 norms]`.

        On a CPU (`chunked`) the forward and backward go through the minibatch's rows in chunks of about
        `UPDATE_CHUNK_ROWS` frames of all members, the gradients accumulating: every loss term is a mean
        over the rows, so each chunk's, weighted by its share of the rows, sums to the minibatch's
        (advantages are normalised over the whole minibatch first). All of a step's activations at once
        would outgrow the CPU's caches, S times a single run's, and every elementwise op would then run at
        memory speed. On a GPU a step is one chunk: its ops are as many for any number of members."""
        template = self.template
        for optimizer in self.optimizers.values():
            optimizer.zero_grad(set_to_none=True)
        terms: dict[str, torch.Tensor] = {}
        for chunk, weight in self.chunks(self._normalized_advantages(flat), state, self.swept):
            total, chunk_terms = self.members(self.member_loss, *chunk)
            (total.sum() * weight).backward()
            for g, t in chunk_terms.items():
                terms[g] = terms[g] + t * weight if g in terms else t * weight
        out = {}
        for g, learner in template.learners.items():
            norms = []
            for net in NETS:
                if learner.algo.max_grad_norm > 0:
                    norms.append(clip_members_(self.group_params[g][net], learner.algo.max_grad_norm))
                else:
                    norms.append(torch.full((self.count,), math.nan, device=self.device))
            self._adam_step(g)
            out[g] = torch.cat([terms[g], torch.stack(norms, -1)], -1)
        return out

    def chunks(self, flat, state, swept) -> list[tuple[tuple, float]]:
        """The loss's inputs in chunks of the minibatch's rows (`step`: on a CPU about `UPDATE_CHUNK_ROWS`
        frames of all members each; one on a GPU, or where agents leave mid-episode), each with its share of
        the rows."""
        rows = next(iter(flat.values()))["advantage"].shape[1]
        count = max(1, min(rows, -(-self.count * rows // UPDATE_CHUNK_ROWS))) if self.chunked else 1
        if any("active" in data for data in flat.values()):
            # Means over active agent-steps do not split by rows (each chunk's count of them differs, per
            # member and group): one part.
            count = 1
        size = -(-rows // count)
        out = []
        for start in range(0, rows, size):
            part, weight = slice(start, start + size), (min(rows, start + size) - start) / rows
            chunk = {g: {k: v[:, part] for k, v in data.items()} for g, data in flat.items()}
            out.append(((chunk, state[:, part] if state is not None else None, swept), weight))
        return out

    def prepare_step(self, flat, state, swept) -> tuple:
        """The compiled step's loss inputs: the minibatch with its advantages normalised per member."""
        return self._normalized_advantages(flat), state, swept

    def member_loss(self, flat, state, swept):
        """One member's minibatch loss (run under vmap), with its swept values; its advantages normalised."""
        with swept_options(self.template, {**(swept or {}), "normalize_advantage": False}):
            return self.template._minibatch_loss(flat, state, slice(None))

    def _normalized_advantages(self, flat):
        """`flat` with each group's advantages normalised per member over the minibatch (where its config
        says so), as `policy_terms` normalises a single run's."""
        out = {}
        burn_in = self.config.algo.burn_in if self.sequences else 0
        for g, data in flat.items():
            advantage = data["advantage"]  # [S, M, n], or chunks [S, M, W, n]: over their last L steps
            loss_steps = advantage[:, :, burn_in:] if self.sequences else advantage
            # As `policy_terms`: one value per member has no spread to divide by.
            if self.template.learners[g].algo.normalize_advantage and loss_steps[0].numel() > 1:
                if "active" in data:  # over each member's active agent-steps (burn-in steps have no loss)
                    counted = data["active"]
                    if burn_in:
                        counted = counted.clone()
                        counted[:, :, :burn_in] = False
                    data = {**data, "advantage": vmap(standardized)(advantage, counted)}
                else:
                    dims = tuple(range(1, advantage.dim()))
                    mean, std = loss_steps.mean(dims, keepdim=True), loss_steps.std(dims, keepdim=True)
                    data = {**data, "advantage": (advantage - mean) / (std + 1e-8)}
            out[g] = data
        return out

    def _adam_step(self, g: str) -> None:
        """Group `g`'s Adam step; with a swept lr (Adam's own is then 1), each member's step scaled by its lr."""
        member_lr_step(self.optimizers[g], [p for net in NETS for p in self.group_params[g][net]], self.member_lr)

    def member_state_dict(self, k: int) -> dict:
        """Member `k`'s state as a single run's `PPO.state_dict()`: its checkpoint is an ordinary one."""
        state = {}
        for g in self.template.learners:
            state[g] = {
                "policy": self.members.member(k, f"{g}.policy"),
                "critic": self.members.member(k, f"{g}.critic"),
                "optimizer": member_optimizer_state(self.optimizers[g], k, self.sweep.get("lr")),
            }
        return state

    @classmethod
    def label(cls, config: TrainConfig, groups) -> str:
        return PPO.label(config, groups)


def _nets(ppo: PPO) -> nn.Module:
    """A PPO's nets under one module, named `GROUP.policy` and `GROUP.critic`."""
    return nn.ModuleDict(
        {g: nn.ModuleDict({"policy": lr.policy, "critic": lr.critic}) for g, lr in ppo.learners.items()}
    )

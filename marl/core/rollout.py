"""Collect `T` steps from a batched env into a preallocated time-major buffer on the env's device.

The buffer is a `TensorDict` with `batch_size=[T, B]`. Per group (`[T, B, n, ...]`):
`observation`, `action_mask` and `next_action_mask` (masked discrete actions: off-policy targets take the
best allowed next action), `action` (the policy's raw action),
`log_prob` (when the algorithm asks for it), `reward`, `terminated`, `done` and `next_observation` (the
true next observation, which bootstraps truncated episodes). At the root: `state` and `next_state` when the env has a global state.
Rewards and flags are stored per agent without the trailing 1: `[T, B, n]`.
Groups whose agents may leave mid-episode (`GroupSpec.agents_leave`) also store `active` `[T, B, n]` bool,
the env's flag for the observation acted on: False at the steps of an agent that had already left its
episode (reward 0, last observation repeated), which every loss leaves out (`marl.core.masking`). Other
groups store none: all their agent-steps count.
With recurrent policies (`Acting.hidden`): per recurrent group `hidden` `[T, B, n, h]`, the state the policy
acted from at each step, and at the root `is_init` `[T, B]` bool, true where the step is an episode's first
(its state zeroed): a training sequence that starts from a stored state and zeroes it where `is_init` sees
what the policy saw when acting.

Nothing in `collect` reads a device value on the host; episode statistics accumulate on the device
and are read once per iteration by the trainer.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch
from tensordict import TensorDict, TensorDictBase

from envs import cudagraphs
from envs.compile import maybe_compile
from marl.core.distributions import Distribution, draw_noise, raw_action_dtype
from marl.core.members import draw_member_noise


@dataclass(frozen=True)
class Acting:
    """What an algorithm collects with: per group a policy, `(observation [B, n, ...], action mask or None)
    -> a distribution` of `marl.core.distributions` (sampled from pre-drawn noise), and whether each step
    stores the log-probability of the action taken (`log_prob`: on-policy ratios need it).

    `hidden` names the groups whose policies are recurrent, with the shape `(n, h)` of one env's state:
    such a policy is called `(observation, action mask or None, hidden [B, n, h])` and returns
    `(distribution, next hidden)`; the state starts at zero and is zeroed where an env's episode ends.
    `episode_starts`: store `is_init` (implied by `hidden`; a recurrent critic alone needs it too)."""

    policies: Mapping[str, Callable[..., Distribution]]
    log_prob: bool = False
    hidden: Mapping[str, tuple[int, int]] = field(default_factory=dict)
    episode_starts: bool = False


def check_acting(acting: Acting, groups: Mapping, where: str = "acting") -> None:
    """Refuse an `acting` that collection and `marl eval` cannot act with for `groups`, naming what they need:
    else a list of policies failed in `dict()`, a group the env lacks with a bare KeyError, and a recurrent
    state of another shape inside torch. `where` names it in the errors (an algorithm's `acting`)."""
    if not isinstance(acting, Acting):  # else collection fails reading `.policies` of it
        raise TypeError(
            f"{where} must be a marl.core.rollout.Acting (its policies per group: "
            f"Acting(policies)), got {type(acting).__name__}"
        )
    if not isinstance(acting.policies, Mapping):
        raise TypeError(
            f"{where}.policies must be a dict {{group: policy}} for the groups {list(groups)}, "
            f"got {type(acting.policies).__name__}"
        )
    if set(acting.policies) != set(groups):
        raise ValueError(
            f"{where}.policies has the groups {sorted(acting.policies)}, expected one policy for each of the env's "
            f"groups {sorted(groups)}"
        )
    if not isinstance(acting.hidden, Mapping):
        raise TypeError(f"{where}.hidden must be a dict {{group: (n_agents, h)}}, got {type(acting.hidden).__name__}")
    for g, shape in acting.hidden.items():
        n = groups[g].n_agents if g in groups else None
        if (
            n is None
            or not isinstance(shape, (tuple, list))
            or len(shape) != 2
            or shape[0] != n
            or not _positive_int(shape[1])
        ):
            expected = f"({n}, h)" if n else f"a group of {sorted(groups)}"
            raise ValueError(
                f"{where}.hidden[{g!r}] = {shape!r}; expected {expected}: the shape of one env's recurrent state "
                "(n_agents, h)"
            )


def _positive_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def transition_layout(
    groups: Mapping,
    state_spec=None,
    log_prob: bool = False,
    hidden: Mapping[str, tuple[int, int]] | None = None,
    episode_starts: bool = False,
) -> dict[tuple[str, ...], tuple[tuple[int, ...], torch.dtype]]:
    """What one env step of a batch holds: `{key: (shape without the batch dims, dtype)}`, keys `(group,
    name)` or `(name,)` at the root (the module docstring lists them). The rollout buffer stores it
    `[T, B, ...]` and the replay buffer (`marl.core.replay`) `[capacity, ...]`, so one extends the other.
    `hidden` (`Acting.hidden`: recurrent group -> `(n, h)`) adds those groups' `hidden` and, with
    `episode_starts` too, the root's `is_init`."""
    layout: dict[tuple[str, ...], tuple[tuple[int, ...], torch.dtype]] = {}
    for g, spec in groups.items():
        n, observation = spec.n_agents, (spec.n_agents, *spec.observation.shape)
        layout[(g, "observation")] = (observation, torch.float32)
        layout[(g, "next_observation")] = (observation, torch.float32)
        layout[(g, "action")] = ((n, *spec.action.shape), raw_action_dtype(spec.action))
        if log_prob:
            layout[(g, "log_prob")] = ((n,), torch.float32)
        layout[(g, "reward")] = ((n,), torch.float32)
        layout[(g, "terminated")] = ((n,), torch.bool)
        layout[(g, "done")] = ((n,), torch.bool)
        if spec.agents_leave:
            layout[(g, "active")] = ((n,), torch.bool)
        if spec.has_action_mask:
            layout[(g, "action_mask")] = ((n, spec.action.n), torch.bool)
            layout[(g, "next_action_mask")] = ((n, spec.action.n), torch.bool)
    if state_spec is not None:
        layout[("state",)] = (tuple(state_spec.shape), torch.float32)
        layout[("next_state",)] = (tuple(state_spec.shape), torch.float32)
    for g, shape in (hidden or {}).items():
        layout[(g, "hidden")] = (tuple(shape), torch.float32)
    if hidden or episode_starts:
        layout[("is_init",)] = ((), torch.bool)
    return layout


class EpisodeStats:
    """Running returns of unfinished episodes and sums over finished ones, all on the device. Every
    tensor is updated in place, so its address is fixed: a compiled rollout step that updates them can be
    replayed as a CUDA graph (see `Collector`). With `members` (several seeds' envs in one batch,
    `marl.core.members`) the sums are per member, `[S]`."""

    def __init__(self, groups: Mapping, num_envs: int, device: torch.device, members: int = 1) -> None:
        self.running = {g: torch.zeros(num_envs, s.n_agents, device=device) for g, s in groups.items()}  # [B, n]
        self.length = torch.zeros(num_envs, device=device)  # [B]
        self.members = members
        shape = (members,) if members > 1 else ()
        self.return_sum = {g: torch.zeros(shape, device=device) for g in self.running}
        self.length_sum = torch.zeros(shape, device=device)
        self.episodes = torch.zeros(shape, device=device)

    def _sum(self, x: torch.Tensor) -> torch.Tensor:
        """`[B]` summed over the envs (of each member)."""
        return x.sum() if self.members == 1 else x.view(self.members, -1).sum(-1)

    def tensors(self) -> list[torch.Tensor]:
        return [*self.running.values(), self.length, *self.return_sum.values(), self.length_sum, self.episodes]

    def clear(self) -> None:
        for total in (*self.return_sum.values(), self.length_sum, self.episodes):
            total.zero_()

    def update(self, rewards: Mapping[str, torch.Tensor], done: torch.Tensor) -> None:
        """`rewards[g]` `[B, n]`; `done` `[B]` bool: the env's episode ended at this step."""
        self.length += 1
        finished = done.float()
        for g, reward in rewards.items():
            self.running[g] += reward
            # An episode's return for a group: its agents' summed rewards, averaged over the agents.
            self.return_sum[g] += self._sum(self.running[g].mean(-1) * finished)
            self.running[g].masked_fill_(done[:, None], 0.0)
        self.length_sum += self._sum(self.length * finished)
        self.episodes += self._sum(finished)
        self.length.masked_fill_(done, 0.0)

    def take_finished(self) -> FinishedEpisodes:
        """The sums over the episodes finished so far, handed over; counting starts again from zero (copies:
        what was handed over stays as it was while the next batch is collected)."""
        finished = FinishedEpisodes(
            {g: total.clone() for g, total in self.return_sum.items()}, self.length_sum.clone(), self.episodes.clone()
        )
        self.clear()
        return finished

    def state_dict(self) -> dict:
        finished = {"return_sum": self.return_sum, "length_sum": self.length_sum, "episodes": self.episodes}
        return {"running": self.running, "length": self.length, **finished}

    def load_state_dict(self, state: dict, *, running: bool = True) -> None:
        """`running=False`: the sums over finished episodes only (those of a batch collected ahead), for an env
        that starts new episodes (it cannot save its state)."""
        # Checkpoints load on the CPU (and gathered ranks' states are sent there): copied onto this device.
        if running:
            for g, value in state["running"].items():
                self.running[g].copy_(value)
            self.length.copy_(state["length"])
        if "episodes" in state:  # checkpoints written before the sums were saved had none pending
            for g, value in state["return_sum"].items():
                self.return_sum[g].copy_(value)
            self.length_sum.copy_(state["length_sum"])
            self.episodes.copy_(state["episodes"])


@dataclass
class FinishedEpisodes:
    """What `EpisodeStats` summed over finished episodes: per group the summed returns, the summed
    lengths and the count (0-d tensors on the device)."""

    return_sum: dict[str, torch.Tensor]
    length_sum: torch.Tensor
    episodes: torch.Tensor


class Collector:
    """Steps `env` with `acting`'s policies and fills the buffer; keeps the current observation between calls.

    One step (act, write the buffer, step the env, count episodes) is one function, `_step`, of
    tensors only; with `compile=True` `unroll` steps at a time go through `torch.compile` as a whole.
    The env's resets draw from its generator, which a graph cannot hold, so the compiler splits the
    step there and runs the draw eagerly; everything else fuses. With an env torch.compile cannot trace
    (`env.traceable` False: VMAS, PettingZoo), or one that checks values (`env.check_values`), the
    collector runs eagerly (`compiled` False): see `__init__`.

    Several seeds in one batch (`marl.core.members`): `generator` is a list, one per member, `seed` the
    members' seeds, and the episode statistics are per member.
    """

    def __init__(
        self,
        env,
        acting: Acting,
        rollout_length: int,
        generator: torch.Generator | list[torch.Generator],
        seed: int | tuple[int, ...],
        compile: bool = False,
        unroll: int = 1,
    ) -> None:
        check_acting(acting, env.groups, "Collector: acting")
        if isinstance(rollout_length, bool) or not isinstance(rollout_length, int) or rollout_length < 1:
            raise ValueError(f"Collector: rollout_length must be a positive int, got {rollout_length!r}")
        generators = generator if isinstance(generator, list) else [generator]
        if not all(g is None or isinstance(g, torch.Generator) for g in generators):
            raise TypeError(
                f"Collector: generator must be a torch.Generator on {env.device} (a list of them, one per member), "
                f"or None; got {generator!r}"
            )
        self.env, self.acting, self.T, self.generator = env, acting, rollout_length, generator
        self.policies = dict(acting.policies)
        self.device = env.device
        self.buffer = self._allocate()
        # Leaf tensors looked up once: the step writes them in place, with no TensorDict in the loop.
        self.leaves = {g: {k: self.buffer[g, k] for k in self.buffer[g].keys()} for g in env.groups}
        self.state_leaves = {k: self.buffer[k] for k in ("state", "next_state") if k in self.buffer.keys()}
        self.is_init_leaf = self.buffer.get("is_init", None)  # [T, B] with recurrent policies
        # The observation acted on next (nested dicts of tensors), at fixed addresses: each call of the
        # steps writes the next one into it (see `_steps_eager`).
        self.obs = _clone_tree(env.reset_data(seed=seed))
        members = len(generator) if isinstance(generator, list) else 1
        self.stats = EpisodeStats(env.groups, env.num_envs, env.device, members)
        # Recurrent policies' states between steps, and whether each env's next step starts an episode.
        B = env.num_envs
        self.hidden = {g: torch.zeros(B, *shape, device=self.device) for g, shape in acting.hidden.items()}
        self.is_init = torch.ones(B, dtype=torch.bool, device=self.device)  # [B]
        # Compiled, a call runs `unroll` steps: the fixed cost of a compiled call (guards, wrapper) then
        # comes once per `unroll` steps, which matters at small batches.
        if rollout_length % unroll:
            raise ValueError(f"unroll ({unroll}) must divide rollout_length ({rollout_length})")
        self.unroll = unroll
        # An env torch.compile cannot trace (VMAS, PettingZoo) would split each step's graph in two, the
        # acting before it and the bookkeeping after: compiled so, collection took as long as eager
        # collection (the simulator's own step is most of it) after seconds of compiling, so such envs
        # are collected eagerly. So are envs that check values: the checks read values on the host each
        # step, and an error they raised in a compiled call was taken for a compiler failure, the steps
        # then rerun eagerly past the bad value (a NaN that came once went on into training).
        self.compiled = compile and env.traceable and not env.check_values
        if self.compiled:
            # The step writes the buffer, the episode statistics and the env's counters in place: on CUDA
            # torch records no graph that mutates an input not marked static.
            written = (*self.buffer.values(include_nested=True, leaves_only=True), *self.stats.tensors())
            written = (*written, *self.hidden.values(), self.is_init, *_leaves(self.obs))
            env.hold_state_in_place()
            cudagraphs.mark_static((*written, *env.static_tensors()), self.device)
        self._steps = maybe_compile(self._steps_eager, self.compiled, self.device, name="rollout step")

    def _allocate(self) -> TensorDict:
        T, B = self.T, self.env.num_envs
        data: dict = {}
        acting = self.acting
        layout = transition_layout(
            self.env.groups, self.env.state_spec, acting.log_prob, acting.hidden, acting.episode_starts
        )
        for key, (shape, dtype) in layout.items():
            where = data.setdefault(key[0], {}) if len(key) == 2 else data
            where[key[-1]] = torch.zeros(T, B, *shape, dtype=dtype)
        return TensorDict(data, batch_size=[T, B]).to(self.device)

    def hidden_state(self) -> dict:
        """The recurrent policies' states and `is_init` (for checkpoints)."""
        return {"hidden": self.hidden, "is_init": self.is_init}

    def load_hidden_state(self, state: dict) -> None:
        for g, value in state["hidden"].items():
            self.hidden[g].copy_(value)
        self.is_init.copy_(state["is_init"])

    @torch.no_grad()
    def collect(self) -> TensorDict:
        """Run `T` steps; returns the filled buffer (overwritten by the next call)."""
        env, B = self.env, self.env.num_envs
        # The whole iteration's sampling noise in one draw per group: [T, B, n, head].
        noise = {g: self._noise(env.groups[g].action, (self.T, B, env.groups[g].n_agents)) for g in self.policies}
        # Steps are addressed by a tensor index, so the compiled steps are one graph for every t.
        for t in torch.arange(self.T, device=self.device).view(-1, self.unroll, 1):  # [unroll, 1] each
            self._steps(t, noise)
        return self.buffer

    def load_obs(self, obs: dict) -> None:
        """Continue from `obs` (a checkpoint's `self.obs`), written into the held observation."""
        _copy_tree_(self.obs, obs)

    def _noise(self, spec, shape: tuple[int, ...]) -> torch.Tensor:
        if isinstance(self.generator, list):  # each member's block from its own generator
            return draw_member_noise(
                lambda local, gen: draw_noise(spec, local, gen, self.device), shape, self.generator
            )
        return draw_noise(spec, shape, self.generator, self.device)

    def _steps_eager(self, t: torch.Tensor, noise: dict[str, torch.Tensor]) -> None:
        """`_step_eager` for each index in `t` (`[unroll, 1]`), from `self.obs`; the last next obs is
        written into `self.obs` (in place: a compiled call's outputs do not outlive the next call on CUDA)."""
        obs = self.obs
        for step in t:
            obs = self._step_eager(step, obs, noise)
        _copy_tree_(self.obs, obs)

    def _step_eager(self, t: torch.Tensor, obs: dict, noise: dict[str, torch.Tensor]) -> dict:
        """Act on `obs` with step `t`'s noise (`noise[g]` is `[T, B, n, head]`), write step `t` of the
        buffer, step the env; returns the next `obs`."""
        actions, next_hidden = {}, {}
        for g, policy in self.policies.items():
            leaf, observation = self.leaves[g], obs[g]["observation"]
            mask = obs[g].get("action_mask")
            if g in self.hidden:
                _write(leaf["hidden"], t, self.hidden[g])
                dist, next_hidden[g] = recurrent_output(g, policy(observation, mask, self.hidden[g]), self.hidden[g])
            else:
                dist = policy(observation, mask)
            if not hasattr(dist, "env_action"):  # e.g. a torch.distributions one: its sample takes a shape
                raise TypeError(
                    f"group {g!r}: the acting policy returned a {type(dist).__name__}, not a distribution of "
                    "marl.core.distributions (sampled from pre-drawn noise: sample(noise), env_action(raw), "
                    "log_prob, mode), as marl.core.models.Policy returns"
                )
            raw = dist.sample(noise[g].index_select(0, t).squeeze(0))
            slot = leaf["action"]  # [T, B, n, ...]: shapes and dtypes only, no host read of values
            if raw.shape != slot.shape[1:] or raw.dtype != slot.dtype:
                raise TypeError(
                    f"group {g!r}: the acting policy's distribution sampled a {raw.dtype} action of shape "
                    f"{tuple(raw.shape)}, expected {slot.dtype} {tuple(slot.shape[1:])} (the raw action, before "
                    "env_action(raw): [B, n, *action shape] float32 for a Box group, [B, n] int64 else)"
                )
            _write(leaf["observation"], t, observation)
            _write(leaf["action"], t, raw)
            if self.acting.log_prob:
                _write(leaf["log_prob"], t, dist.log_prob(raw))
            if mask is not None:
                _write(leaf["action_mask"], t, mask)
            if "active" in leaf:
                _write(leaf["active"], t, obs[g]["active"])
            actions[g] = dist.env_action(raw)
        if self.state_leaves:
            _write(self.state_leaves["state"], t, obs["state"])
        next_data, obs = self.env.step_data(actions)
        rewards = {}
        for g in self.env.groups:
            leaf, transition = self.leaves[g], next_data[g]
            rewards[g] = transition["reward"][..., 0]
            _write(leaf["reward"], t, rewards[g])
            _write(leaf["terminated"], t, transition["terminated"][..., 0])
            _write(leaf["done"], t, transition["done"][..., 0])
            _write(leaf["next_observation"], t, transition["observation"])
            if "next_action_mask" in leaf:
                _write(leaf["next_action_mask"], t, transition["action_mask"])
        if self.state_leaves:
            _write(self.state_leaves["next_state"], t, next_data["state"])
        done = next_data["done"][:, 0]  # [B]
        self.stats.update(rewards, done)
        if self.is_init_leaf is not None:
            _write(self.is_init_leaf, t, self.is_init)
            self.is_init.copy_(done)
            for g, hidden in next_hidden.items():  # a finished episode's state is not the next one's
                self.hidden[g].copy_(hidden.masked_fill(done[:, None, None], 0.0))
        return obs


def recurrent_output(g: str, out, hidden: torch.Tensor) -> tuple[Distribution, torch.Tensor]:
    """A recurrent policy's `(distribution, next hidden)`, refused unless the next state is shaped as `hidden`
    `[B, n, h]`: a lone distribution failed to unpack, and a state of another shape broadcast into the held one
    (in collection, and in `marl eval`)."""
    if isinstance(out, tuple) and len(out) == 2 and isinstance(out[1], torch.Tensor) and out[1].shape == hidden.shape:
        return out
    if isinstance(out, tuple) and len(out) == 2 and isinstance(out[1], torch.Tensor):
        got = f"a next hidden of shape {tuple(out[1].shape)}"
    else:
        got = f"{type(out).__name__} {out!r}"[:120] if isinstance(out, tuple) else f"a {type(out).__name__}"
    raise TypeError(
        f"group {g!r} is recurrent (Acting.hidden names it): its acting policy is called (observation, action mask, "
        f"hidden) and must return (distribution, next hidden {tuple(hidden.shape)}), got {got}"
    )


def _leaves(tree: dict) -> list[torch.Tensor]:
    return [leaf for value in tree.values() for leaf in (_leaves(value) if isinstance(value, dict) else [value])]


def _clone_tree(tree: dict) -> dict:
    return {k: _clone_tree(v) if isinstance(v, dict) else v.clone() for k, v in tree.items()}


def _copy_tree_(into: dict, tree: dict) -> None:
    """Copy the tensors of `tree` into those of `into` (same keys, shapes and dtypes)."""
    if into.keys() != tree.keys():
        raise ValueError(f"expected the keys {sorted(into)}, got {sorted(tree)}")
    for k, held in into.items():
        if isinstance(held, dict):
            _copy_tree_(held, tree[k])
        elif held.shape != tree[k].shape or held.dtype != tree[k].dtype:
            raise ValueError(
                f"{k!r}: expected {held.dtype} {tuple(held.shape)}, got {tree[k].dtype} {tuple(tree[k].shape)}"
            )
        elif tree[k] is not held:
            held.copy_(tree[k])


def _write(buffer: torch.Tensor, t: torch.Tensor, value: torch.Tensor) -> None:
    """`buffer[t] = value` for a one-element index tensor `t` (no host read of t)."""
    buffer.index_copy_(0, t, value.unsqueeze(0))


def observations(
    data: TensorDictBase, groups, next: bool = False
) -> tuple[dict[str, torch.Tensor], torch.Tensor | None]:
    """Every group's (next) observations and the (next) state from a buffer slice."""
    key = "next_observation" if next else "observation"
    obs = {g: data[g, key] for g in groups}
    state = data.get("next_state" if next else "state", None)
    return obs, state

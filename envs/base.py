"""The batched multi-agent environment contract.

An env runs `num_envs` copies of one task on one device. Its agents come in groups (`env.groups`, an
ordered mapping name -> `GroupSpec`); each group's tensors are shaped `[B, n, ...]`.

    obs = env.reset(seed=0)          # TensorDict [B]: (group, "observation"), (group, "action_mask")
    next, obs = env.step(action)     # action: {group: tensor [B, n, *action_shape]}

`next` is the transition: the true next observation (before any reset), `(group, "reward")`
`[B, n, 1]`, per-agent `(group, "terminated" | "truncated" | "done")` `[B, n, 1]` and env-level
`"terminated" | "truncated" | "done"` `[B, 1]`. `obs` is what the policy acts on next: `next`'s
observation where the env is not done, a fresh reset observation where it is (auto-reset by mask).

The auto-reset leaves nothing to see of the state an episode ended in, which a recording needs (`marl eval
--render`: the agents on their goals). `step(action, auto_reset=False)` leaves the done envs as the step
left them, with `obs` `next`'s observation; the caller renders them, then resets them before the next step:

    next, obs = env.step(action, auto_reset=False)
    frame = env.render(0)                       # env 0 after the action, also where it is done
    obs = env.reset(mask=next["done"][:, 0])    # the `obs` that `step(action)` gives, from the same draws

The two run what `step(action)` runs, in its order and with its random draws, so a run is the same
either way. (`compile=True` compiles only the auto-resetting step; this one runs eagerly.)

Envs whose agents leave mid-episode write `_agent_terminated`; their groups' specs then say `agents_leave`
and their reset and step data hold `(group, "active")` `[B, n]` bool: False for an agent that has left its
episode, until its env resets (`next`'s: still in after this step; `obs`'s: acts at the next step). Such an
agent reads per-agent `terminated` and `done` True; the env gives it reward 0 and may keep its last
observation, and `_agent_terminated` stays True for it until `_reset` clears it (`check_env` checks this);
learners leave its steps out of their losses (`marl.core.rollout` stores `active` with each step). Other
envs hold no `active`.

An env author subclasses `MultiAgentEnv` and writes only the physics:

- `Config`: a frozen dataclass of options (subclass `EnvConfig`, which holds `max_steps`);
- `_make_groups()`: the group specs;
- `_init_state()`: allocate the state tensors (every attribute holding a tensor or a dict of tensors that
  `_reset` and `_step` then update: one first created there is refused, as a compiled step would not hold
  it in place);
- `_reset(mask)`: re-initialise the state where the bool `[B]` mask is true (draw random numbers for
  the whole batch from `self.rng`, the env's counter-based stream (`envs.random`; sizes as separate ints:
  `self.rng.rand(B, n, 2)`, `self.rng.randint(high, B, n)`), and select with `torch.where`, so no shape
  depends on data and the step compiles into one graph);
- `_step(action) -> (reward, terminated)`: advance every env and agent at once; `action` is
  `{group: [B, n, *action_shape]}` (a `Box`'s float, clipped to its bounds; a `Discrete`'s int64 `[B, n]`);
  `reward` is float32 `{group: [B, n]}` (one per agent, also for a team reward), `terminated` a bool `[B]`;
- `_observe() -> {group: [B, n, *obs_shape]}` of the observation spec's dtype (never a state tensor
  that `_reset` or `_step` then update in place).

Optionally: `_action_mask() -> {group: bool [B, n, n_actions]}` for exactly the groups whose action is
`Discrete(masked=True)`; `_state_spec() -> Box` with `_state() -> [B, *state_spec.shape]`, a global state
for centralised critics (both or neither); `_agent_terminated() -> {group: bool [B, n]}` for agents that
leave (above); `_render(index) -> uint8 [H, W, 3]`, an image of env `index`.

The base class owns step counting, truncation at `max_steps`, masked auto-reset, seeding and the
argument checks. Shape, dtype and device checks of the actions and of what the env author's methods
return cost no host sync and always run. Value checks need one, so they run only when the env is built
with `check_values=True`: NaN/inf, out-of-bounds and masked-out actions, and NaN/inf in the float rewards,
observations and state the env returns (which would otherwise surface much later as a NaN loss).

Built with `compile=True`, the env compiles what `step_data` does after checking the actions (the
physics, step counting, flags, auto-reset and both observations) into one graph, and `reset_data`'s
reset and observation into another: one compiled call per step, which on CUDA is one CUDA graph replay
(`envs.cudagraphs` reports them as "<name> step" and "<name> reset"). The output checks run while
torch.compile traces, so they cost nothing at run time. The value checks (`check_values=True`) cannot
be traced: they run eagerly, the action checks before the compiled call and the output checks on what
it returned. Traced into a caller's graph (the compiled rollout), the env's step is traced inline, not
compiled again; value checks there split the caller's graph where they read values on the host.
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Mapping, Sequence
from typing import ClassVar

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase

from envs import cudagraphs
from envs import options as _options
from envs.compile import maybe_compile
from envs.random import CounterRandom
from envs.specs import Box, Discrete, GroupSpec, MultiDiscrete


def _copying_outputs(method):
    def call(*args):
        result = method(*args)
        if isinstance(result, dict):
            return {key: value.clone() for key, value in result.items()}
        return result.clone() if isinstance(result, torch.Tensor) else result

    return call


def _seed(seed: int | Sequence[int]) -> int | tuple[int, ...]:
    """An env's seed: an int, or a tuple of its members' seeds (see `BaseEnv.__init__`). Anything else is
    refused rather than cast: `int(1.5)` would quietly seed with 1, and a mask given where the seed goes
    (`env.reset(mask)`) would fail inside torch."""
    if isinstance(seed, Sequence) and not isinstance(seed, str):
        if not seed:
            raise ValueError("seed is an empty sequence; expected an int, or one int per member")
        return tuple(_seed_int(s) for s in seed)
    return _seed_int(seed)


def _seed_int(seed) -> int:
    try:
        if isinstance(seed, bool):
            raise TypeError
        return operator.index(seed)  # ints, numpy ints and one-element integer tensors
    except TypeError:
        hint = " (pass the reset mask by name: reset(mask=...))" if isinstance(seed, torch.Tensor) else ""
        raise TypeError(
            f"seed must be an int (or a sequence of ints, one per member), got {type(seed).__name__} {seed!r}{hint}"
        ) from None


def _unwritten(env: MultiAgentEnv, method: str) -> NotImplementedError:
    """The error of a method every env writes that `env`'s class does not."""
    return NotImplementedError(
        f"{type(env).__name__} does not write {method}: every env subclassing envs.MultiAgentEnv writes "
        "_make_groups, _reset, _step and _observe (see the envs.base docstring)"
    )


def check_is_env(env, where: str) -> None:
    """Refuse what is not an env where one is taken (a name, say), instead of failing at its first attribute.
    A wrapper with an env's interface (`marl.core.groups.GroupedEnv`) is taken as one."""
    if isinstance(env, MultiAgentEnv) or all(hasattr(env, name) for name in ("groups", "num_envs", "reset", "step")):
        return
    hint = f": make one with envs.make({env!r}, num_envs=...)" if isinstance(env, str) else ""
    raise TypeError(f"{where} takes an env (an envs.MultiAgentEnv), got {type(env).__name__} {env!r}{hint}")


def canonical_device(device: torch.device | str) -> torch.device:
    """`device` as the tensors made there report it: `cpu:0` is `cpu`, a bare `cuda` is `cuda:<current>`.
    Device checks compare with `!=`, under which `cuda` and `cuda:0` differ, so envs and the trainer
    keep this form."""
    try:
        return torch.empty(0, device=torch.device(device)).device
    except (RuntimeError, AssertionError, TypeError) as error:  # an unknown device type, one this build lacks, None
        raise ValueError(f"device {str(device)!r} cannot hold tensors here: {error}") from error


ROOT_KEYS = ("terminated", "truncated", "done", "state")
"""The keys of `reset` and `step` data next to the groups' entries; no group may be named so."""

_OUTPUTS = {  # key -> (the env author's method that returns it, the layout of each group's tensor)
    "observation": ("_observe()", "[num_envs, n_agents, *observation.shape]"),
    "action_mask": ("_action_mask()", "bool [num_envs, n_agents, n_actions]"),
    "reward": ("_step()'s reward", "float32 [num_envs, n_agents]"),
}


class EnvOutputError(ValueError):
    """A method the env author writes (`_step`, `_observe`, `_action_mask`, ...) returned data that breaks
    the env contract: a missing group, a wrong shape, dtype or device, or (with `check_values=True`) NaN or
    inf values. `group` and `key` say where."""

    def __init__(self, message: str, group: str | None = None, key: str | None = None) -> None:
        super().__init__(message)
        self.group, self.key = group, key


@dataclasses.dataclass(frozen=True)
class EnvConfig:
    max_steps: int = 100
    """Episode length: an env is truncated after this many steps."""

    def __post_init__(self) -> None:
        _options.check_fields(self)
        if self.max_steps < 1:
            raise ValueError(f"max_steps must be >= 1, got {self.max_steps}")


class MultiAgentEnv:
    """Base class of every vecmarl env; see the module docstring for the contract."""

    Config: ClassVar[type[EnvConfig]] = EnvConfig
    name: ClassVar[str] = "env"
    runs_on_host: ClassVar[bool] = False
    """True for adapters of host (numpy) simulators, e.g. PettingZoo: their steps copy data between host
    and device by nature, so `check_env` does not hold them to the no-host-sync property."""
    seeding_advice: ClassVar[str | None] = None
    """What `check_env` tells when one seed gave two different runs: None, a native env's advice (draw from
    `self.rng`, overwrite the state in `_reset`); an adapter says what its user can do about the simulator
    it wraps, whose code is not the adapter user's."""
    traceable: ClassVar[bool] = True
    """Whether torch.compile can trace `step_data` into a graph. The compiled rollout (`marl train
    --compile`) traces the env's step with the policy; an env that cannot be traced (an adapter of a
    simulator that branches on data in Python, or runs on the host) says False, and is then collected
    eagerly."""

    def __init__(
        self,
        config: EnvConfig | None = None,
        *,
        num_envs: int,
        device: torch.device | str = "cpu",
        seed: int | Sequence[int] | None = None,
        check_values: bool = False,
        compile: bool = False,
    ) -> None:
        """Build `num_envs` copies on `device`.

        Args:
            config: the env's options (`type(self).Config`); defaults when None.
            num_envs: number of envs stepped as one batch (B), >= 1.
            device: where the state and every tensor live.
            seed: seeds the env's own random stream (`self.rng`); a random seed when None. A sequence of
                `S` seeds (`num_envs` divisible by `S`) seeds each block of `num_envs / S` envs as an env
                of that size built with that seed (several runs' envs in one batch, `marl train --seeds`).
            check_values: also check values on every step: the actions' (NaN/inf, bounds, masks), and
                that the float rewards, observations and state the env returns hold no NaN or inf (an
                `EnvOutputError` naming the method, group and envs). This synchronises with the host, so
                it is meant for tests and debugging (`marl train --env-option check_values=True`).
            compile: run each step (after the action checks) and each reset through `torch.compile`
                as one graph, which fuses its many small ops into a few kernels (the first step then
                takes seconds to compile). A compiler failure falls back to eager with one warning.
        """
        if config is None:
            config = self.Config()
        if not isinstance(config, self.Config):
            raise TypeError(f"{self.name}: config must be a {self.Config.__name__}, got {type(config).__name__}")
        if isinstance(num_envs, bool) or not isinstance(num_envs, int) or num_envs <= 0:
            raise ValueError(f"{self.name}: num_envs must be a positive int, got {num_envs!r}")
        for flag, value in (("check_values", check_values), ("compile", compile)):
            if not isinstance(value, bool):  # "no" would be truthy
                raise TypeError(f"{self.name}: {flag} must be True or False, got {value!r}")
        self.config = config
        self.num_envs = num_envs
        self.device = canonical_device(device)
        self.check_values = check_values
        self.seed = _seed(seed) if seed is not None else int(torch.randint(2**62, (1,)).item())
        if isinstance(self.seed, tuple) and num_envs % len(self.seed):
            raise ValueError(f"{self.name}: num_envs ({num_envs}) must be divisible by the {len(self.seed)} seeds")
        self.rng = CounterRandom(self.seed, self.device)
        self.groups: dict[str, GroupSpec] = self._checked_groups(self._make_groups())
        self.state_spec: Box | None = self._state_spec()
        specs = self.groups.items()
        self._output_layouts = {  # what `_observe`, `_action_mask` and `_step` return: {group: (shape, dtype)}
            "observation": {g: ((num_envs, s.n_agents, *s.observation.shape), s.observation.dtype) for g, s in specs},
            "action_mask": {g: ((num_envs, s.n_agents, s.action.n), torch.bool) for g, s in specs if s.has_action_mask},
            "reward": {g: ((num_envs, s.n_agents), torch.float32) for g, s in specs},
        }
        self.step_count = torch.zeros(num_envs, dtype=torch.long, device=self.device)  # [B]
        self._action_bounds = {
            g: spec.action.bounds(self.device) for g, spec in self.groups.items() if isinstance(spec.action, Box)
        }
        self.compiled = compile
        self._init_state()
        self._state_names = tuple(self._state_tensors())
        self._check_state_devices()
        self.state_in_place = False
        # What `step_data` and `reset_data` run after checking their arguments: the bodies, or with
        # `compile` each body as one compiled call (a compiler failure falls back to eager, once).
        self._step_call, self._reset_call = self._step_body, self._reset_body
        if compile:
            self.hold_state_in_place()
            cudagraphs.mark_static(self.static_tensors(), self.device)
            self._step_call = maybe_compile(self._step_body, True, self.device, name=f"{self.name} step")
            self._reset_call = maybe_compile(self._reset_body, True, self.device, name=f"{self.name} reset")
        self._reset(torch.ones(num_envs, dtype=torch.bool, device=self.device))
        self._check_state_allocated("_reset")

    # ---- what an env author writes -------------------------------------------------------------

    def _make_groups(self) -> Mapping[str, GroupSpec]:
        raise _unwritten(self, "_make_groups() -> {group name: envs.GroupSpec}")

    def _state_spec(self) -> Box | None:
        """The spec of the global `"state"` `[B, *shape]`, or None when the env has none."""
        return None

    def _init_state(self) -> None:
        """Allocate the state tensors (`[B, ...]` or `[B, n, ...]` on `self.device`)."""

    def _reset(self, mask: torch.Tensor) -> None:
        raise _unwritten(self, "_reset(mask), re-initialising the state where the bool [num_envs] mask is true")

    def _step(self, action: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        raise _unwritten(
            self, "_step(action) -> (reward {group: float32 [num_envs, n_agents]}, terminated bool [num_envs])"
        )

    def _observe(self) -> dict[str, torch.Tensor]:
        raise _unwritten(self, "_observe() -> {group: [num_envs, n_agents, *observation.shape]}")

    def _action_mask(self) -> dict[str, torch.Tensor]:
        """Bool `[B, n, n_actions]` per group whose action spec is masked."""
        return {}

    def _state(self) -> torch.Tensor | None:
        return None

    def _agent_terminated(self) -> dict[str, torch.Tensor] | None:
        """Per-agent termination `{group: bool [B, n]}` for envs whose agents leave early: True from the step
        an agent leaves until its env resets (`_reset` clears it). A group left out never loses an agent."""
        return None

    def _render(self, index: int) -> np.ndarray:
        raise NotImplementedError(f"{self.name} does not render")

    # ---- the contract ----------------------------------------------------------------------------

    @property
    def max_steps(self) -> int:
        return self.config.max_steps

    @property
    def renders(self) -> bool:
        """Whether `render` gives images: the env writes `_render` (an adapter may say more)."""
        return type(self)._render is not MultiAgentEnv._render

    @property
    def agents(self) -> list[str]:
        return [a for spec in self.groups.values() for a in spec.agents]

    @property
    def agents_leave(self) -> bool:
        """Whether agents may leave an episode before their env's end: the env writes `_agent_terminated`."""
        return type(self)._agent_terminated is not MultiAgentEnv._agent_terminated

    def reset(self, seed: int | None = None, *, mask: torch.Tensor | None = None) -> TensorDictBase:
        """Reset every env (re-seeding first when `seed` is given), or only those where the bool `[B]`
        `mask` is true; returns the observations of all envs."""
        return self._as_tensordict(self.reset_data(seed, mask=mask))

    def step(
        self, action: Mapping[str, torch.Tensor] | TensorDictBase, *, auto_reset: bool = True
    ) -> tuple[TensorDictBase, TensorDictBase]:
        """Advance every env one step; returns `(next, obs)`. With `auto_reset=False` the done envs are
        left for the caller to reset (see the module docstring)."""
        next_data, obs_data = self.step_data(action, auto_reset=auto_reset)
        return self._as_tensordict(next_data), self._as_tensordict(obs_data)

    def reset_data(self, seed: int | None = None, *, mask: torch.Tensor | None = None) -> dict:
        """`reset` returning nested dicts of tensors instead of a TensorDict (same keys and shapes)."""
        if seed is not None:
            seed = self._reseed_value(seed)
            self.rng.seed(seed)
            self.seed = seed
        if mask is None:
            mask = torch.ones(self.num_envs, dtype=torch.bool, device=self.device)
        else:
            self._check_tensor("mask", mask, (self.num_envs,), torch.bool)
        # Traced into a caller's graph (the compiled rollout), the body is traced inline: no nested compile.
        obs = (self._reset_body if torch.compiler.is_compiling() else self._reset_call)(mask)
        if self.check_values:
            self._check_output_values((obs, " (after a reset)"))
        return obs

    def _reseed_value(self, seed) -> int | tuple[int, ...]:
        """`seed` checked for `reset(seed=...)` before anything is re-seeded: an int for an env built with one
        seed, a sequence of as many seeds for one built with a member's seed each (a refused seed must leave
        `self.seed` and the stream as they were)."""
        seed = _seed(seed)
        members = len(self.seed) if isinstance(self.seed, tuple) else None
        given = len(seed) if isinstance(seed, tuple) else None
        if given != members:
            expected = f"a sequence of {members} seeds, one per member" if members else "one int"
            raise ValueError(
                f"{self.name}: reset(seed={seed!r}) does not fit the env's seed {self.seed!r}: expected {expected}"
            )
        return seed

    def step_data(
        self, action: Mapping[str, torch.Tensor] | TensorDictBase, *, auto_reset: bool = True
    ) -> tuple[dict, dict]:
        """`step` returning nested dicts of tensors instead of TensorDicts (same keys and shapes): the
        rollout's hot path, which skips building two TensorDicts per step."""
        if not isinstance(auto_reset, bool):  # "no" would be truthy
            raise TypeError(f"{self.name}: auto_reset must be True or False, got {auto_reset!r}")
        action = self._check_action(action)
        if not auto_reset:  # eager: a compiled step (`compile=True`) is the auto-resetting one
            next_data, obs = self._step_body(action, auto_reset=False)
        else:  # traced into a caller's graph (the compiled rollout), the body is traced inline: no nested compile
            next_data, obs = (self._step_body if torch.compiler.is_compiling() else self._step_call)(action)
        if self.check_values:
            # `obs` equals `next`'s observation where no env was reset, so what is only in `obs` came from a reset.
            self._check_output_values((next_data, ""), (obs, " (after the auto-reset)"))
        return next_data, obs

    def _reset_body(self, mask: torch.Tensor) -> dict:
        """`reset_data` after its checks: reset where the bool `[B]` `mask` is true, observe."""
        self._reset_where(mask)
        return self._observation_data()

    def _step_body(self, action: dict[str, torch.Tensor], auto_reset: bool = True) -> tuple[dict, dict]:
        """`step_data` after the action checks: the physics, step counts, flags, auto-reset and both
        observations. Compiled, it is one graph: the output checks are on shapes and dtypes only, which
        torch.compile decides while tracing, so they cost nothing when it runs."""
        result = self._step(action)
        # Unpacked blindly, a bare reward dict `{"agent": r}` would fail as "reward ... got a str" (its keys).
        if not (isinstance(result, (tuple, list)) and len(result) == 2):
            raise EnvOutputError(
                f"{self.name}: _step() must return a pair (reward {{group: float32 [num_envs, n_agents]}}, "
                f"terminated bool [num_envs]), got a {type(result).__name__}"
                + (f" of {len(result)}" if isinstance(result, (tuple, list)) else ""),
                key="reward",
            )
        reward, terminated = result
        self._check_outputs("reward", reward)
        self._check_output(
            "_step()'s terminated (bool [num_envs])", terminated, (self.num_envs,), torch.bool, key="terminated"
        )
        self.step_count += 1
        truncated = (self.step_count >= self.max_steps) & ~terminated  # [B]
        done = terminated | truncated
        next_data = self._observation_data()
        if not auto_reset:  # `obs` is `next`'s observation: observed again, noise would be drawn twice
            obs = {key: dict(value) if isinstance(value, dict) else value for key, value in next_data.items()}
        for group, spec in self.groups.items():
            n = spec.n_agents
            if not spec.agents_leave:  # the env's flags hold for every agent: views, no ops
                flags = [terminated, truncated, done]
                agent_flags = [flag.view(-1, 1, 1).expand(-1, n, 1) for flag in flags]
            else:
                agent_term = ~next_data[group]["active"] | terminated[:, None]
                agent_trunc = truncated[:, None] & ~agent_term
                agent_flags = [f.unsqueeze(-1) for f in (agent_term, agent_trunc, agent_term | agent_trunc)]
            next_data[group].update(
                {"reward": reward[group].unsqueeze(-1), **dict(zip(("terminated", "truncated", "done"), agent_flags))}
            )
        next_data.update(
            {
                "terminated": terminated.unsqueeze(-1),
                "truncated": truncated.unsqueeze(-1),
                "done": done.unsqueeze(-1),
            }
        )
        if not auto_reset:
            return next_data, obs
        self._reset_where(done)
        return next_data, self._observation_data()

    def sample_actions(self, generator: torch.Generator | None = None, obs: TensorDictBase | None = None) -> TensorDict:
        """A random action for every agent, `{group: [B, n, *action_shape]}`, honouring the action
        masks in `obs` when given. Uses `generator` (not the env's own, by default a fresh one)."""
        return sample_actions(self.groups, self.num_envs, self.device, generator, obs)

    def static_tensors(self) -> list[torch.Tensor]:
        """The tensors a compiled step updates in place, at fixed addresses: the state tensors (see
        `hold_state_in_place`), the step counts and the random stream's state. A compiled step that
        mutates them replays as a CUDA graph only when they are marked static
        (`envs.cudagraphs.mark_static`): the env does so when it compiles itself, the rollout when it
        compiles the env's step into its own."""
        tensors = [self.step_count, self.rng.key, self.rng.counter]
        for value in self._state_tensors().values():
            tensors += value.values() if isinstance(value, dict) else [value]
        return list({id(t): t for t in tensors}.values())

    def hold_state_in_place(self) -> None:
        """From now on `_step` and `_reset` leave every state tensor where it was: what they assign to a
        state attribute (`self.pos = ...`) is copied into the tensor it held before. Compiled steps need
        this: on CUDA a graph's outputs live in memory that the next compiled call overwrites, so state
        kept from one call to the next must be an input written in place (inside the graph, where the
        copy fuses into the kernel that computes it), never an output. The env calls it when it
        compiles itself, the rollout when it compiles the env's step into its own."""
        if not self.state_in_place:
            self._check_state_allocated("_reset or _step")
            self.state_in_place = True
            self._step = self._holding_state(self._step)
            self._reset = self._holding_state(self._reset)
            # What the env reports may be a view of its state (`{"agent": self.pos}`), which the next
            # step now overwrites: it is copied (in a graph the copy fuses into the op that computes it).
            for name in ("_observe", "_action_mask", "_state", "_agent_terminated"):
                setattr(self, name, _copying_outputs(getattr(self, name)))

    def _check_state_allocated(self, where: str) -> None:
        """Refuse state tensors that `_init_state` did not allocate: held in place (compiled), only the
        tensors it allocated are written back, so one first assigned in `_reset` would be a new tensor each
        call, and a CUDA graph replay would read a stale one. Eager it would work, which hides the bug."""
        new = sorted(set(self._state_tensors()) - set(self._state_names))
        if new:
            raise EnvOutputError(
                f"{self.name}: {where} created the state attribute(s) {new}, which _init_state does not allocate: "
                "a compiled step holds in place only the state _init_state allocates (a CUDA graph would read "
                "stale tensors); allocate them in _init_state ([num_envs, ...] on self.device) and let _reset "
                "write them with torch.where",
                key="state",
            )

    def _check_state_devices(self) -> None:
        """Refuse a state tensor `_init_state` allocated off the env's device, which would otherwise fail in
        the first `_reset` as torch's "Expected all tensors to be on the same device", naming no tensor."""
        for name, value in self._state_tensors().items():
            for label, tensor in value.items() if isinstance(value, dict) else [(None, value)]:
                if tensor.device != self.device:
                    where = name if label is None else f"{name}[{label!r}]"
                    raise EnvOutputError(
                        f"{self.name}: _init_state allocated the state tensor {where} on {tensor.device}, expected "
                        f"the env's device {self.device}: create it with device=self.device",
                        key="state",
                    )

    def _holding_state(self, method):
        def call(*args):
            before = {name: getattr(self, name) for name in self._state_names}
            before = {name: dict(value) if isinstance(value, dict) else value for name, value in before.items()}
            result = method(*args)
            # A compiled step that creates a state attribute would return it as a graph output, which the
            # next call overwrites: refused here, when torch.compile traces the method (free at run time).
            self._check_state_allocated(method.__name__)
            # (label, the tensor held before, the value assigned now) for every state tensor
            pairs = []
            for name, held in before.items():
                now = getattr(self, name)
                if isinstance(held, dict):
                    pairs += [(f"{name}[{key!r}]", tensor, now[key]) for key, tensor in held.items()]
                else:
                    pairs.append((name, held, now))
                setattr(self, name, held)
            # A value that is another state's held tensor (`self.a, self.b = self.b, self.a`) is read before
            # any write-back overwrites it.
            # (By `is`, not `id()`: torch.compile before 2.13 cannot take the id of a tensor the graph computed.)
            helds = [held for _, held, _ in pairs]
            for label, held, now in [
                (la, h, n.clone() if n is not h and any(n is other for other in helds) else n) for la, h, n in pairs
            ]:
                self._write_back(label, held, now)
            return result

        return call

    def _write_back(self, name: str, held: torch.Tensor, now: torch.Tensor) -> None:
        if now is held:
            return
        if now.shape != held.shape or now.dtype != held.dtype or now.device != held.device:
            raise EnvOutputError(
                f"{self.name}: state tensor {name} changed from {held.dtype} {tuple(held.shape)} on {held.device} "
                f"to {now.dtype} {tuple(now.shape)} on {now.device}: a state tensor keeps its shape, dtype and "
                "device (allocate it so in _init_state)"
            )
        held.copy_(now)

    def _state_tensors(self) -> dict[str, torch.Tensor | dict[str, torch.Tensor]]:
        """The attributes holding a tensor or a dict of tensors."""
        return {
            name: value
            for name, value in vars(self).items()
            if isinstance(value, torch.Tensor)
            or (isinstance(value, dict) and value and all(isinstance(v, torch.Tensor) for v in value.values()))
        }

    def state_dict(self) -> dict:
        """Everything needed to continue exactly where the env is: its tensors (attributes holding a
        tensor or a dict of tensors), step counters and random stream."""
        return {"tensors": self._state_tensors(), "rng": self.rng.state_dict(), "seed": self.seed}

    def load_state_dict(self, state: dict) -> None:
        static = {id(tensor) for tensor in self.static_tensors()}
        for name, value in state["tensors"].items():
            held = getattr(self, name, None)
            if isinstance(value, dict):
                if isinstance(held, dict) and held.keys() == value.keys() and all(id(held[k]) in static for k in held):
                    for k, tensor in held.items():
                        tensor.copy_(value[k])  # keeps its address (see `static_tensors`)
                else:
                    setattr(self, name, {k: v.to(self.device) for k, v in value.items()})
            elif id(held) in static:
                held.copy_(value)  # keeps its address (see `static_tensors`)
            else:
                setattr(self, name, value.to(self.device))
        self.rng.load_state_dict(state["rng"])
        self.seed = state["seed"]

    def render(self, index: int = 0) -> np.ndarray:
        """An RGB image `[H, W, 3]` uint8 of env `index`; needs no display."""
        if isinstance(index, bool) or not isinstance(index, (int, np.integer)):
            raise TypeError(f"{self.name}: render index must be an int, got {type(index).__name__} {index!r}")
        if not 0 <= index < self.num_envs:
            raise IndexError(f"{self.name}: render index must be in [0, {self.num_envs}), got {index}")
        return self._render(index)

    def __repr__(self) -> str:
        groups = ", ".join(f"{g}: {s.n_agents} agents" for g, s in self.groups.items())
        return f"{type(self).__name__}(num_envs={self.num_envs}, device={self.device}, {groups}, config={self.config})"

    # ---- internals -------------------------------------------------------------------------------

    def _checked_groups(self, groups) -> dict[str, GroupSpec]:
        """What `_make_groups` returned, refused where it would fail far away: a group named like a key of
        the step's root (`next["done"]`) would be overwritten by it, a non-str name fails inside TensorDict."""
        if not isinstance(groups, Mapping) or not groups:
            raise EnvOutputError(
                f"{self.name}: _make_groups() must return a non-empty dict {{group name: GroupSpec}}, got {groups!r}"
            )
        for group, spec in groups.items():
            if not isinstance(group, str) or not group or group in ROOT_KEYS:
                raise EnvOutputError(
                    f"{self.name}: _make_groups() names a group {group!r}; a group is named by a non-empty str other "
                    f"than the keys {list(ROOT_KEYS)}, which the step's data holds next to the groups",
                    key="groups",
                )
            if not isinstance(spec, GroupSpec):
                raise EnvOutputError(
                    f"{self.name}: _make_groups()[{group!r}] must be an envs.GroupSpec, got {type(spec).__name__}",
                    group,
                    "groups",
                )
        owners: dict[str, str] = {}  # agent name -> its group
        for group, spec in groups.items():
            clash = sorted(agent for agent in spec.agents if agent in owners)
            if clash:
                raise EnvOutputError(
                    f"{self.name}: _make_groups() names the agent(s) {clash} in group {group!r} and in group "
                    f"{owners[clash[0]]!r}: an agent name is unique across groups (native envs name them "
                    "'<group>_<i>'), as group maps (all_in_one, per_agent) select agents by name",
                    group,
                    "groups",
                )
            owners.update(dict.fromkeys(spec.agents, group))
        if self.agents_leave:  # every group's data holds `active`, so that group maps can stack any agents
            return {group: dataclasses.replace(spec, agents_leave=True) for group, spec in groups.items()}
        return dict(groups)

    def _reset_where(self, mask: torch.Tensor) -> None:
        self._reset(mask)
        self.step_count.masked_fill_(mask, 0)

    def _observation_data(self) -> dict:
        observations = self._observe()
        masks = self._action_mask()
        self._check_outputs("observation", observations)
        self._check_outputs("action_mask", masks)
        data: dict = {}
        left = self._agents_left() if self.agents_leave else {}
        for group in self.groups:
            data[group] = {"observation": observations[group]}
            if group in masks:
                data[group]["action_mask"] = masks[group]
            if self.agents_leave:  # [B, n]
                n = self.groups[group].n_agents
                stays = torch.ones(self.num_envs, n, dtype=torch.bool, device=self.device)
                data[group]["active"] = ~left[group] if group in left else stays
        state = self._state()
        if (state is None) != (self.state_spec is None):
            raise EnvOutputError(
                f"{self.name}: _state() returned {'None' if state is None else 'a tensor'} but _state_spec() "
                f"returned {self.state_spec}: an env with a global state writes both, an env without one neither",
                key="state",
            )
        if state is not None:
            shape = (self.num_envs, *self.state_spec.shape)
            self._check_output(
                "_state() ([num_envs, *state_spec.shape])", state, shape, self.state_spec.dtype, key="state"
            )
            data["state"] = state
        return data

    def _agents_left(self) -> dict[str, torch.Tensor]:
        """`_agent_terminated()`, checked: `{group: bool [B, n]}` for the groups it names."""
        left = self._agent_terminated() or {}
        for group, value in left.items():
            if group not in self.groups:
                raise EnvOutputError(
                    f"{self.name}: _agent_terminated() has unknown group {group!r}; groups: {list(self.groups)}"
                )
            what = f"_agent_terminated()['{group}'] (bool [num_envs, n_agents])"
            self._check_output(
                what, value, (self.num_envs, self.groups[group].n_agents), torch.bool, group, "terminated"
            )
        return left

    def _check_outputs(self, key: str, values) -> None:
        """`values`, what an env author's method returned for `key` ("observation", "action_mask" or
        "reward"), is `{group: tensor}` for exactly the groups that need one, each of the shape and dtype
        the specs give (`_output_layouts`). Metadata only, no host sync; messages are built on failure."""
        expected = self._output_layouts[key]
        method, layout = _OUTPUTS[key]
        if not isinstance(values, Mapping):
            raise EnvOutputError(
                f"{self.name}: {method} must be a dict {{group: tensor}}, got a {type(values).__name__}", key=key
            )
        if values.keys() != expected.keys():
            need = "the groups whose action spec is Discrete(masked=True)" if key == "action_mask" else "every group"
            raise EnvOutputError(
                f"{self.name}: {method} has groups {sorted(values)}, expected {need}: {list(expected)}", key=key
            )
        for group, (shape, dtype) in expected.items():
            value = values[group]
            if not (
                isinstance(value, torch.Tensor)
                and value.shape == shape
                and value.dtype == dtype
                and value.device == self.device
            ):
                self._check_output(f"{method}['{group}'] ({layout})", value, shape, dtype, group, key)

    def _check_output_values(self, *parts: tuple[dict, str]) -> None:
        """`check_values`: the float rewards, observations and state in each `(data, when)` of `parts` (what
        `step_data` or `reset_data` returns; `when` is said after the method) hold no NaN or inf. One host
        sync for all; run on what a compiled step returned, as a graph cannot branch on values."""
        outputs = []  # (what, group, key, tensor [B, ...])
        for data, when in parts:
            for group in self.groups:
                for key in ("reward", "observation"):
                    if key in data[group]:
                        outputs.append((f"{_OUTPUTS[key][0]}{when} for group '{group}'", group, key, data[group][key]))
            if "state" in data:
                outputs.append((f"_state(){when}", None, "state", data["state"]))
        outputs = [output for output in outputs if output[-1].is_floating_point()]
        if not outputs or bool(torch.stack([torch.isfinite(value).all() for *_, value in outputs]).all()):
            return
        for what, group, key, value in outputs:  # some are not finite: find the first, on the host
            bad = (
                torch.nonzero(~torch.isfinite(value).reshape(self.num_envs, -1).all(1)).flatten().tolist()
            )  # env indices
            if bad:
                shown = ", ".join(map(str, bad[:8])) + (", ..." if len(bad) > 8 else "")
                raise EnvOutputError(
                    f"{self.name}: {what} contains NaN or inf in {len(bad)} of {self.num_envs} envs (env {shown})",
                    group,
                    key,
                )

    def _check_output(self, what, value, shape, dtype, group: str | None = None, key: str | None = None) -> None:
        """`_check_tensor` for data an env author's method returned: raises `EnvOutputError`."""
        try:
            self._check_tensor(what, value, shape, dtype)
        except (TypeError, ValueError) as error:
            raise EnvOutputError(str(error), group, key) from None

    def _as_tensordict(self, data: dict) -> TensorDict:
        """Nested dicts of tensors (made by this class, so already checked) as TensorDicts, skipping
        TensorDict's per-entry validation, which costs more than the step's own bookkeeping on the CPU."""
        batch_size = torch.Size([self.num_envs])
        return TensorDict._new_unsafe(
            {k: self._as_tensordict(v) if isinstance(v, dict) else v for k, v in data.items()},
            batch_size=batch_size,
            device=self.device,
        )

    def _check_tensor(self, what: str, value, shape: tuple[int, ...], dtype: torch.dtype | None) -> None:
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"{self.name}: {what} must be a torch.Tensor, got {type(value).__name__}")
        if tuple(value.shape) != tuple(shape):
            raise ValueError(f"{self.name}: {what} has shape {tuple(value.shape)}, expected {tuple(shape)}")
        if dtype is not None and value.dtype != dtype:
            raise TypeError(f"{self.name}: {what} has dtype {value.dtype}, expected {dtype}")
        if value.device != self.device:
            raise ValueError(f"{self.name}: {what} is on {value.device}, expected the env's device {self.device}")

    def _check_action(self, action: Mapping[str, torch.Tensor] | TensorDictBase) -> dict[str, torch.Tensor]:
        """Validate `{group: tensor}` (or a TensorDict holding `(group, "action")`) and return plain
        tensors; continuous actions are clipped to their bounds."""
        if not isinstance(action, (Mapping, TensorDictBase)):
            raise TypeError(f"{self.name}: action must be a mapping group -> tensor, got {type(action).__name__}")
        keys = set(action.keys())
        missing = [g for g in self.groups if g not in keys]
        unknown = sorted(k for k in keys if k not in self.groups)
        if missing or unknown:
            raise KeyError(
                f"{self.name}: action groups {sorted(keys)} do not match the env's groups {list(self.groups)}"
                + (f"; missing {missing}" if missing else "")
                + (f"; unknown {unknown}" if unknown else "")
            )
        checked = {}
        for group, spec in self.groups.items():
            what = f"action for group '{group}'"
            value = group_action(action[group], what)
            shape = (self.num_envs, spec.n_agents, *spec.action.shape)
            self._check_tensor(what, value, shape, None)
            if isinstance(spec.action, Box):
                if not value.dtype.is_floating_point:
                    raise TypeError(f"{self.name}: {what} has dtype {value.dtype}, expected a float dtype")
                low, high = self._action_bounds[group]
                if self.check_values:
                    self._check_values(what, value, low, high)
                # detach: a policy's action may require grad; kept, it would chain every later step's state
                # into one autograd graph (growing memory, `render` refusing to call .numpy()).
                value = torch.clamp(value.detach().to(spec.action.dtype), low, high)
            else:
                if value.dtype.is_floating_point or value.dtype == torch.bool or value.is_complex():
                    raise TypeError(f"{self.name}: {what} has dtype {value.dtype}, expected an integer dtype")
                value = value.long()
                if self.check_values:
                    self._check_discrete_values(group, what, value, spec)
            checked[group] = value
        return checked

    def _check_values(self, what: str, value: torch.Tensor, low: torch.Tensor, high: torch.Tensor) -> None:
        if not bool(torch.isfinite(value).all()):
            raise ValueError(f"{self.name}: {what} contains NaN or inf")
        if bool(((value < low) | (value > high)).any()):
            raise ValueError(
                f"{self.name}: {what} has values in [{value.min().item():.4g}, {value.max().item():.4g}], "
                f"outside the action bounds [{low.min().item():.4g}, {high.max().item():.4g}]"
            )

    def _check_discrete_values(self, group: str, what: str, value: torch.Tensor, spec: GroupSpec) -> None:
        nvec = spec.action.nvec if isinstance(spec.action, MultiDiscrete) else spec.action.n
        if bool(((value < 0) | (value >= torch.tensor(nvec, device=self.device))).any()):
            raise ValueError(f"{self.name}: {what} has values outside [0, {nvec}) per choice")
        if isinstance(spec.action, Discrete) and spec.action.masked:
            mask = self._action_mask()[group]
            allowed = mask.gather(-1, value.unsqueeze(-1)).squeeze(-1)
            if not bool(allowed.all()):
                raise ValueError(f"{self.name}: {what} picks actions that its action_mask forbids")


def group_action(value, what: str):
    """A group's entry of an action mapping: its tensor, or from a group TensorDict (`td[group]`) its
    `"action"`."""
    if isinstance(value, TensorDictBase):
        if "action" not in value.keys():
            raise KeyError(f"{what} is a TensorDict without an 'action' entry (keys {sorted(value.keys())})")
        value = value["action"]
    return value


def sample_actions(
    groups: Mapping[str, GroupSpec],
    num_envs: int,
    device: torch.device,
    generator: torch.Generator | None = None,
    obs: TensorDictBase | None = None,
) -> TensorDict:
    """Random actions `{group: [num_envs, n, *action_shape]}` for `groups`, honouring the action masks in
    `obs` when given; drawn from `generator` (a freshly seeded one when None)."""
    if generator is not None and (
        not isinstance(generator, torch.Generator) or torch.device(generator.device).type != torch.device(device).type
    ):
        got = f"one on {generator.device}" if isinstance(generator, torch.Generator) else type(generator).__name__
        raise TypeError(f"sample_actions: generator must be a torch.Generator on {device} (or None), got {got}")
    if generator is None:
        generator = torch.Generator(device=device)
        generator.manual_seed(int(torch.randint(2**62, (1,)).item()))
    actions = {}
    for group, spec in groups.items():
        batch = (num_envs, spec.n_agents)
        if spec.has_action_mask and obs is not None:
            actions[group] = spec.action.sample(batch, device, generator, mask=obs[group, "action_mask"])
        else:
            actions[group] = spec.action.sample(batch, device, generator)
    return TensorDict(actions, batch_size=[num_envs], device=device)

"""`check_env(env)`: the conformance check every vecmarl env passes (and env authors run on theirs).

It checks, in order, and stops at the first property that fails, naming it with the group and key:

- `specs`: groups, agents and specs are well formed;
- `data`: every tensor of `reset` and `step` matches its spec (shape, dtype, device, bounds, finite), and
  the env keeps its state in the tensors `_init_state` allocates (no state attribute that `_reset` or
  `_step` creates, no Python number attribute that they change);
- `flags`: `done == terminated | truncated`, never both, and an env-level `done` finishes every agent;
  where agents leave (`_agent_terminated`), every agent is active when its episode starts, one that left
  stays out (reward 0) until its env resets;
- `host_sync`: `reset` and `step` never synchronise with the host, make data-dependent shapes, or copy
  host data to the env's device (a CPU env's device is treated as remote, as `forbid_host_sync` explains,
  so a copy that would sync on a GPU fails here too; not checked for adapters of host simulators, whose
  class sets `runs_on_host = True`);
- `vectorised`: `reset` and `step` run as many tensor ops for more envs, and no op more times for each agent
  more (a Python loop over the envs or the agents runs more; checked for native envs, built again with a few
  more envs, and with more agents where an int config field sets a group's agent count, e.g. `n_agents`);
- `seeding`: one seed gives one trajectory, whatever ran before it, and different seeds give different starts;
- `independence`: changing env 0's actions changes nothing in the other envs;
- `truncation`: `truncated` is set exactly at `max_steps` (and `terminated` is not);
- `auto_reset`: `next` keeps the true final observation of a finished episode while `obs` holds a fresh
  one; where an env is not done, `obs` equals `next`'s observation; and (checked after `masked_reset`, as it
  resets by mask) `step(action, auto_reset=False)` then `reset(mask=next["done"][:, 0])`, how a recording
  keeps an episode's last state, gives what `step(action)` gives;
- `masked_reset`: `reset(mask=...)` resets the masked envs only, and the others carry on unchanged;
- `render`: `render()` gives an RGB uint8 image (when the env renders).
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import math
import sys

import numpy as np
import torch
from tensordict import TensorDictBase
from torch.utils._python_dispatch import TorchDispatchMode

from envs.base import EnvOutputError, MultiAgentEnv, check_is_env
from envs.specs import Box, Discrete, GroupSpec, MultiDiscrete
from envs.sync import HostSyncError, caller, describe_caller, forbid_host_sync

FLAGS = ("terminated", "truncated", "done")
# What `reset(seed=...)` seeds is a native env's own stream: any other source of randomness breaks seeding, and
# so does state that `_reset` leaves as the last episode ended (the runs before the check's differ).
NATIVE_SEEDING_ADVICE = (
    "draw every random number from self.rng (self.rng.rand, randn, randint), not from torch's global generator "
    "(torch.rand, randn_like, ...), Python's random or numpy's; and let _reset overwrite every state tensor where "
    "mask is true (torch.where(mask, fresh, old)), so that no episode starts from what the last one left"
)
# How many sizes `vectorised` runs an env at: num_envs and the next ones, and consecutive values of a config
# field that sets an agent count. A loop over the envs or agents runs its ops once more at each env or agent
# more, from the same path of calls. Without one, size may still change what runs once: a helper may run only
# from 2 agents on (navigation's lidar), a reshape that is a view for 2 agents copies for 3, a matmul of one env
# takes other ops than of two (an op more on the line, at another count for each caller of the helper). So an
# op must run more times from one path at each of the 2 steps.
COUNTS = 3


class CheckError(AssertionError):
    """An env broke a property of the env contract."""

    def __init__(self, env: MultiAgentEnv, prop: str, detail: str, group: str | None = None, key: str | None = None):
        where = "".join([f" for group '{group}'" if group else "", f", key '{key}'" if key else ""])
        super().__init__(f"check_env({env.name}): property '{prop}' failed{where}: {detail}")
        self.prop, self.group, self.key = prop, group, key


def check_env(
    env: MultiAgentEnv,
    *,
    seed: int = 0,
    max_check_steps: int = 300,
    random_reset: bool = True,
) -> None:
    """Run every conformance check on `env`; raise `CheckError` naming the first property that fails.

    Args:
        env: the env to check; it is reset and stepped (with value checks on) and, if it passes, left reset.
        seed: the seed used for its runs; an env built with `S` seeds (a population's, `marl train --seeds`)
            is reset with the `S` seeds `seed, seed + 1, ..., seed + S - 1`.
        max_check_steps: the longest run; the truncation check needs `max_steps + 2` steps.
        random_reset: the env's starts are random, so different seeds must give different starts.
    """
    check_is_env(env, "check_env")
    checker = _Checker(env, seed, max_check_steps)
    previous = env.check_values
    env.check_values = True
    try:
        checker.specs()
        checker.host_sync()
        checker.vectorised()  # after host_sync: without a sync, no op can depend on data
        checker.data_and_flags()
        checker.seeding(random_reset)
        checker.independence()
        checker.truncation_and_auto_reset()
        checker.masked_reset()
        checker.caller_reset()
        checker.render()
    except EnvOutputError as error:  # the base class's own checks of what `_step`, `_observe`, ... return
        raise CheckError(env, "data", str(error), error.group, error.key) from error
    finally:
        env.check_values = previous
    env.reset(seed=checker.seed)  # not in `finally`: an env that failed may fail to reset too, hiding the CheckError


class _CountOps(TorchDispatchMode):
    """Counts the aten ops run inside the block: `lines[line]` by the line that asked for each (`envs.sync.caller`),
    and `calls[(path, op)]` by the op and the path of calls that led to it (every frame's code and line, up to
    the frame that opened the block), whose line is `where[(path, op)]`."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: collections.Counter[tuple[str, int, str] | None] = collections.Counter()
        self.calls: collections.Counter[tuple[tuple, object]] = collections.Counter()
        self.where: dict[tuple[tuple, object], tuple[str, int, str] | None] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        line = caller(skip=(__file__,))
        self.lines[line] += 1
        frame, path = sys._getframe(1), []
        while frame is not None and frame.f_code.co_filename != __file__:
            path.append((frame.f_code, frame.f_lineno))
            frame = frame.f_back
        key = (tuple(path), func)
        self.calls[key] += 1
        self.where.setdefault(key, line)
        return func(*args, **(kwargs or {}))


def _count_ops(env: MultiAgentEnv) -> tuple[_CountOps, _CountOps]:
    """The tensor ops of `env`'s reset and of one random step, each counted by line and by path (`_CountOps`)."""
    with _CountOps() as reset_ops:
        obs = env.reset()
    action = env.sample_actions(torch.Generator(env.device).manual_seed(3), obs)
    with _CountOps() as step_ops:
        env.step(action)
    return reset_ops, step_ops


def _at(line: tuple[str, int, str] | None) -> str:
    """` at <file:line in function: `code`>` for a line `_CountOps` counted, or nothing where no line asked."""
    return f" at {describe_caller(line)}" if line is not None else ""


def _growth(runs: list[tuple[_CountOps, _CountOps]], labels: list[str]) -> tuple[str, object, str] | None:
    """`(what, line, counts)` for the first of reset and step where some op runs more times from one path of
    calls at each step of `runs` (`_count_ops` of envs of growing size, labelled by `labels`), as a loop over the
    envs or agents makes it: `line` asked for it, `counts` says how many ops that line ran in each env."""
    for index, what in enumerate(("reset", "step")):
        calls = [run[index].calls for run in runs]
        grows = [key for key in calls[-1] if all(a.get(key, 0) < b.get(key, 0) for a, b in itertools.pairwise(calls))]
        if grows:
            line = runs[-1][index].where[grows[0]]
            counts = [run[index].lines.get(line, 0) for run in runs]
            return (
                what,
                line,
                ", ".join(f"{n}{' ops' if i == 0 else ''} {label}" for i, (n, label) in enumerate(zip(counts, labels))),
            )
    return None


def _python_numbers(env: MultiAgentEnv) -> dict[str, object]:
    """The env's attributes that hold a Python (or numpy) number."""
    return {k: v for k, v in vars(env).items() if isinstance(v, (int, float, complex, np.generic))}


class _Checker:
    def __init__(self, env: MultiAgentEnv, seed: int, max_check_steps: int) -> None:
        self.env = env
        # What `reset(seed=...)` takes: an int, or as many seeds as the env was built with.
        self.members = len(env.seed) if isinstance(getattr(env, "seed", None), tuple) else None
        self.seed = seed if self.members is None else tuple(range(seed, seed + self.members))
        self.other_seed = (
            seed + 1 if self.members is None else tuple(range(seed + self.members, seed + 2 * self.members))
        )
        self.B = env.num_envs
        self.long_run = min(env.max_steps + 2, max_check_steps)
        self.short_run = min(self.long_run, 20)

    def fail(self, prop: str, detail: str, group: str | None = None, key: str | None = None):
        raise CheckError(self.env, prop, detail, group, key)

    # ---- runs ------------------------------------------------------------------------------------

    def actions(self, generator: torch.Generator, obs: TensorDictBase):
        # An agent whose mask allows nothing gets a forbidden action from any sampler or policy; say so here,
        # before stepping, where the step's action check would blame the action instead.
        for group, spec in self.env.groups.items():
            if spec.has_action_mask and not bool(obs[group, "action_mask"].any(-1).all()):
                self.fail("data", "action_mask allows no action for some agent", group, "action_mask")
        return self.env.sample_actions(generator, obs)

    def run(self, steps: int, action_seed: int = 1, perturb_env0: bool = False, reset_mask_at: int | None = None):
        """Reset with `self.seed`, step `steps` times with seeded random actions; returns the initial
        obs and a list of `(next, obs)` clones. Optionally env 0 gets different actions, or
        `reset(mask=every other env)` is called before step `reset_mask_at`."""
        env = self.env
        obs = env.reset(seed=self.seed).clone()
        start = obs
        generator = torch.Generator(env.device).manual_seed(action_seed)
        other = torch.Generator(env.device).manual_seed(action_seed + 7919)
        first = torch.arange(self.B, device=env.device) == 0  # [B]: env 0
        trajectory = []
        for t in range(steps):
            if reset_mask_at == t:
                obs = env.reset(mask=self.reset_mask()).clone()
                trajectory.append((None, obs))
            action = self.actions(generator, obs)
            if perturb_env0:
                alternative = self.actions(other, obs)
                action = action.apply(lambda a, b: torch.where(first.view(-1, *[1] * (a.dim() - 1)), b, a), alternative)
            next_td, obs = env.step(action)
            trajectory.append((next_td.clone(), obs.clone()))
        return start, trajectory

    def reset_mask(self) -> torch.Tensor:
        return torch.arange(self.B, device=self.env.device) % 2 == 1

    # ---- properties ------------------------------------------------------------------------------

    def specs(self) -> None:
        env = self.env
        required = ("groups", "num_envs", "device", "max_steps", "state_spec", "reset", "step", "sample_actions")
        missing = [name for name in required if not hasattr(env, name)]
        if missing:
            self.fail("specs", f"env lacks {missing} of the env contract ({type(env).__name__})")
        if not env.groups:
            self.fail("specs", "env.groups is empty")
        seen: set[str] = set()
        for group, spec in env.groups.items():
            if not isinstance(spec, GroupSpec):
                self.fail("specs", f"spec is a {type(spec).__name__}, expected a GroupSpec", group)
            if not isinstance(spec.observation, Box):
                self.fail("specs", "observation spec must be a Box", group, "observation")
            if not isinstance(spec.action, (Box, Discrete, MultiDiscrete)):
                self.fail("specs", f"unknown action spec {spec.action!r}", group, "action")
            clash = seen.intersection(spec.agents)
            if clash:
                self.fail("specs", f"agent names {sorted(clash)} appear in more than one group", group)
            seen.update(spec.agents)

    def vectorised(self) -> None:
        """Count the tensor ops of a reset and a step, by the path of calls that asks for each, in fresh eager envs
        of the class: of `num_envs` envs and `COUNTS - 1` larger sizes; and for each int config field that sets a
        group's agent count (`n_agents`, tag's `n_predators`), with the field at `COUNTS` consecutive values (the
        env's own and the next ones, or lower ones where the config refuses those). A batched env runs no op more
        times from one path at each env or agent more. Only for native envs (built by `MultiAgentEnv.__init__`,
        traceable: no op depends on data)."""
        env = self.env
        if env.runs_on_host or not env.traceable or type(env).__init__ is not MultiAgentEnv.__init__:
            return
        step = self.members or 1  # an env of S seeds takes S envs at a time
        sizes = [self.B + k * step for k in range(COUNTS)]
        base = _count_ops(self.build(env.config, sizes[0]))
        runs = [base, *(_count_ops(self.build(env.config, size)) for size in sizes[1:])]
        growth = _growth(runs, [f"for {size} envs" for size in sizes])
        if growth:
            what, line, seen = growth
            self.fail(
                "vectorised",
                f"the number of tensor ops in {what} grows with num_envs ({seen}){_at(line)}, as a Python loop over "
                "the envs does (one small op per env): compute all envs at once with batched ops over dim 0 "
                "(broadcasting, torch.where, gather)",
            )
        for field, group, values in self.agent_counts():
            runs = [base if other is None else _count_ops(other) for _, other in values]
            growth = _growth(runs, [f"with {field}={value}" for value, _ in values])
            if growth:
                what, line, seen = growth
                self.fail(
                    "vectorised",
                    f"the number of tensor ops in {what} grows with the number of agents ({seen}){_at(line)}, as "
                    "a Python loop over the agents does (one small op per agent): compute all agents at once "
                    "with batched ops over the agent dim (dim 1 of [num_envs, n_agents, ...]: broadcasting, "
                    "torch.where, gather)",
                    group,
                )

    def build(self, config, num_envs: int) -> MultiAgentEnv:
        """A fresh eager env of the checked env's class, seeded alike."""
        env = self.env
        return type(env)(config, num_envs=num_envs, device=env.device, seed=env.seed)

    def agent_counts(self):
        """`(field, group, [(value, env)] * COUNTS)` for each int field of the env's config that sets a
        group's agent count: consecutive values of the field, from the env's own up where the config takes them
        (else from lower), each with an env of `num_envs` envs built with it (None for the env's own value);
        `group`'s agent count differs there. A field is skipped where the config (or the env) takes no such
        values, or where changing it changes which groups exist (more groups run more ops, one set per group, by
        design); `max_steps`, the episode length, is no agent count."""
        env, config = self.env, self.env.config
        if not dataclasses.is_dataclass(config):
            return
        for field in dataclasses.fields(config):
            value = getattr(config, field.name)
            if not field.init or field.name == "max_steps" or isinstance(value, bool) or not isinstance(value, int):
                continue
            for low in range(value, value - COUNTS, -1):
                values = [v for v in range(low, low + COUNTS) if v != value]
                try:  # `dataclasses.replace` runs the config's own checks, `build` the env's
                    configs = [dataclasses.replace(config, **{field.name: v}) for v in values]
                    first = self.build(configs[0], self.B)
                    grown = [g for g, spec in env.groups.items() if first.groups.get(g, spec).n_agents != spec.n_agents]
                    if list(first.groups) != list(env.groups) or not grown:
                        break
                    built = [first, *(self.build(c, self.B) for c in configs[1:])]
                except (TypeError, ValueError):
                    continue
                yield field.name, grown[0], sorted([(value, None), *zip(values, built)], key=lambda pair: pair[0])
                break

    def host_sync(self) -> None:
        env = self.env
        if env.runs_on_host:
            return
        generator = torch.Generator(env.device).manual_seed(3)
        env.check_values = False
        try:
            with forbid_host_sync(env.device):
                obs = env.reset()
            for _ in range(self.short_run):
                action = self.actions(generator, obs)
                with forbid_host_sync(env.device):
                    _, obs = env.step(action)
                    env.reset(mask=self.reset_mask())
        except HostSyncError as error:
            self.fail("host_sync", str(error))
        finally:
            env.check_values = True

    def data_and_flags(self) -> None:
        env = self.env
        env.reset(seed=self.seed)
        numbers = _python_numbers(env)
        start, trajectory = self.run(self.short_run)
        # Eager, a state attribute first created in `_step` works; compiled, it would be a graph output that
        # the next call overwrites (`MultiAgentEnv._check_state_allocated`).
        env._check_state_allocated("_reset or _step")
        changed = sorted(k for k, v in _python_numbers(env).items() if k not in numbers or numbers[k] != v)
        if changed and not env.runs_on_host:
            self.fail(
                "data",
                f"reset and step changed the Python number attribute(s) {changed}: state kept in a Python number "
                "is one value for all num_envs envs, which a masked reset cannot reset per env, a checkpoint does "
                "not save, and a compiled step reads as a constant; keep it in a tensor [num_envs, ...] "
                "allocated in _init_state",
                key="state",
            )
        self.check_observations(start, "reset")
        before = start
        for next_td, obs in trajectory:
            self.check_observations(obs, "step's obs")
            self.check_observations(next_td, "step's next")
            self.check_transition(next_td)
            self.check_departures(before, next_td, obs)
            before = obs
        self.check_departures(None, None, start)

    def check_observations(self, td: TensorDictBase, where: str) -> None:
        env, B = self.env, self.B
        if not isinstance(td, TensorDictBase) or tuple(td.batch_size) != (B,):
            self.fail("data", f"{where} must be a TensorDict with batch_size [{B}]")
        for group, spec in env.groups.items():
            if group not in td.keys():
                self.fail("data", f"{where} has no entry for the group", group)
            n = spec.n_agents
            obs = self.tensor(
                td, (group, "observation"), (B, n, *spec.observation.shape), spec.observation.dtype, where
            )
            low, high = spec.observation.bounds(env.device)
            if not bool(torch.isfinite(obs).all()):
                self.fail("data", f"{where} observation has NaN or inf", group, "observation")
            outside = (obs < low) | (obs > high)  # [B, n, *shape]
            if bool(outside.any()):
                self.fail("data", self.out_of_bounds(where, obs, outside, low, high), group, "observation")
            if spec.has_action_mask:
                mask = self.tensor(td, (group, "action_mask"), (B, n, spec.action.n), torch.bool, where)
                if not bool(mask.any(-1).all()):
                    self.fail("data", f"{where} action_mask allows no action for some agent", group, "action_mask")
        if env.state_spec is not None:
            state = self.tensor(td, ("state",), (B, *env.state_spec.shape), env.state_spec.dtype, where)
            if not bool(torch.isfinite(state).all()):
                self.fail("data", f"{where} state has NaN or inf", key="state")

    @staticmethod
    def out_of_bounds(where: str, obs: torch.Tensor, outside: torch.Tensor, low, high) -> str:
        """Which element of the observations `obs` `[B, n, *shape]` is `outside` its bounds, and its range."""
        shape = tuple(low.shape)
        element = int(outside.reshape(-1, math.prod(shape)).any(0).nonzero()[0])  # in the flattened shape
        values = obs.reshape(-1, math.prod(shape))[:, element]
        index = tuple(int(i) for i in np.unravel_index(element, shape))
        bound = low.reshape(-1)[element].item(), high.reshape(-1)[element].item()
        return (
            f"{where} observation is outside its Box bounds: element {index} has values in "
            f"[{values.min().item():.4g}, {values.max().item():.4g}], outside [{bound[0]:.4g}, {bound[1]:.4g}]"
        )

    def tensor(self, td: TensorDictBase, key: tuple, shape: tuple, dtype: torch.dtype, where: str) -> torch.Tensor:
        group, name = (key[0], key[-1]) if len(key) > 1 else (None, key[0])
        value = td.get(key, None)
        if value is None:
            self.fail("data", f"{where} is missing {key}", group, name)
        if tuple(value.shape) != tuple(shape):
            self.fail("data", f"{where} has shape {tuple(value.shape)}, expected {tuple(shape)}", group, name)
        if value.dtype != dtype:
            self.fail("data", f"{where} has dtype {value.dtype}, expected {dtype}", group, name)
        if value.device != self.env.device:
            self.fail("data", f"{where} is on {value.device}, expected {self.env.device}", group, name)
        return value

    def check_transition(self, next_td: TensorDictBase) -> None:
        B = self.B
        root = {f: self.tensor(next_td, (f,), (B, 1), torch.bool, "next") for f in FLAGS}
        self.check_flags(root, None)
        for group, spec in self.env.groups.items():
            n = spec.n_agents
            reward = self.tensor(next_td, (group, "reward"), (B, n, 1), torch.float32, "next")
            if not bool(torch.isfinite(reward).all()):
                self.fail("data", "reward has NaN or inf", group, "reward")
            flags = {f: self.tensor(next_td, (group, f), (B, n, 1), torch.bool, "next") for f in FLAGS}
            self.check_flags(flags, group)
            if bool((root["done"] & ~flags["done"].all(1)).any()):
                self.fail("flags", "the env is done but some of its agents are not", group, "done")

    def check_departures(self, before: TensorDictBase | None, next_td: TensorDictBase | None, obs: TensorDictBase):
        """Where agents leave: `obs`'s new episodes (where `next_td` is done, or all of them) start with every
        agent active; an agent out `before` the step is still out in `next_td`, with reward 0."""
        fresh = (
            torch.ones(self.B, dtype=torch.bool, device=self.env.device) if next_td is None else next_td["done"][:, 0]
        )
        for group, spec in self.env.groups.items():
            if not spec.agents_leave:
                continue
            if not bool(obs[group, "active"][fresh].all()):
                self.fail(
                    "flags",
                    "an agent is out (not active) at the start of an episode: _reset must bring every agent back "
                    "where mask is true, clearing what _agent_terminated reads (e.g. "
                    "self.out = torch.where(mask[:, None], False, self.out))",
                    group,
                    "active",
                )
            if before is None:
                continue
            out = ~before[group, "active"]  # [B, n]: left at an earlier step
            if bool((out & next_td[group, "active"]).any()):
                self.fail(
                    "flags",
                    "an agent that left its episode is active again before its env reset: _agent_terminated must "
                    "stay True from the step an agent leaves until _reset clears it (keep it in a state tensor, "
                    "e.g. self.out = self.out | leaving)",
                    group,
                    "active",
                )
            if bool((out & (next_td[group, "reward"][..., 0] != 0)).any()):
                self.fail(
                    "flags",
                    "an agent that left its episode got a reward: _step gives it 0 until its env resets "
                    "(torch.where(out, 0.0, reward), out as before the step)",
                    group,
                    "reward",
                )

    def check_flags(self, flags: dict, group: str | None) -> None:
        if not torch.equal(flags["done"], flags["terminated"] | flags["truncated"]):
            self.fail("flags", "done != terminated | truncated", group, "done")
        if bool((flags["terminated"] & flags["truncated"]).any()):
            self.fail("flags", "an episode is both terminated and truncated", group, "truncated")

    def seeding(self, random_reset: bool) -> None:
        start_a, run_a = self.run(self.short_run)
        # Other actions in between: state that _reset leaves would then differ at the next start, even state
        # that only the last action sets (run_a ends as the run before it, with the same actions).
        self.run(self.short_run, action_seed=2)
        start_b, run_b = self.run(self.short_run)
        fix = ": " + (self.env.seeding_advice or NATIVE_SEEDING_ADVICE)
        self.compare(start_a, start_b, "seeding", "two resets with the same seed differ" + fix)
        for (next_a, obs_a), (next_b, obs_b) in zip(run_a, run_b):
            self.compare(next_a, next_b, "seeding", "the same seed and actions gave different transitions" + fix)
            self.compare(obs_a, obs_b, "seeding", "the same seed and actions gave different observations" + fix)
        if random_reset:
            other = self.env.reset(seed=self.other_seed)
            same = all(torch.equal(start_a[g, "observation"], other[g, "observation"]) for g in self.env.groups)
            if same:
                self.fail("seeding", "different seeds gave identical starts (pass random_reset=False if intended)")

    def independence(self) -> None:
        if self.B < 2:
            return
        _, base = self.run(self.short_run)
        _, perturbed = self.run(self.short_run, perturb_env0=True)
        rest = slice(1, None)
        for t, ((next_a, obs_a), (next_b, obs_b)) in enumerate(zip(base, perturbed)):
            detail = f"envs 1..{self.B - 1} changed at step {t} when only env 0's actions changed"
            self.compare(next_a[rest], next_b[rest], "independence", detail)
            self.compare(obs_a[rest], obs_b[rest], "independence", detail)

    def masked_reset(self) -> None:
        if self.B < 2:
            return
        at = min(3, self.short_run - 1)
        _, plain = self.run(self.short_run)
        _, masked = self.run(self.short_run, reset_mask_at=at)
        mask = self.reset_mask()
        kept = ~mask
        # Until an unmasked env finishes an episode, it must carry on exactly as if nothing happened.
        # (After that, its next reset may draw different random numbers, which is allowed.)
        _, obs_after_reset = masked[at]
        _, obs_before_reset = plain[at - 1] if at > 0 else (None, self.env.reset(seed=self.seed))
        self.compare(
            obs_before_reset[kept],
            obs_after_reset[kept],
            "masked_reset",
            "reset(mask) changed envs outside the mask",
        )
        changed = [
            not torch.equal(obs_before_reset[g, "observation"][mask], obs_after_reset[g, "observation"][mask])
            for g in self.env.groups
        ]
        if not any(changed):
            self.fail("masked_reset", "reset(mask) left the masked envs as they were")
        running = kept.clone()
        for (next_a, obs_a), (next_b, obs_b) in zip(plain[at:], masked[at + 1 :]):
            self.compare(next_a[running], next_b[running], "masked_reset", "reset(mask) changed envs outside the mask")
            running &= ~next_a["done"][:, 0]
            self.compare(obs_a[running], obs_b[running], "masked_reset", "reset(mask) changed envs outside the mask")

    def truncation_and_auto_reset(self) -> None:
        env = self.env
        _, trajectory = self.run(self.long_run)
        self.auto_reset_run = trajectory  # for `caller_reset`
        count = torch.zeros(self.B, dtype=torch.long, device=env.device)
        saw_done = False
        at_limit = ended_terminated_at_limit = 0
        for t, (next_td, obs) in enumerate(trajectory):
            count += 1
            terminated, truncated, done = (next_td[f][:, 0] for f in FLAGS)
            expected = (count >= env.max_steps) & ~terminated
            if not torch.equal(truncated, expected):
                self.fail(
                    "truncation",
                    f"at step {t + 1} after reset, truncated={truncated.tolist()[:8]} but expected "
                    f"{expected.tolist()[:8]} (max_steps={env.max_steps}, truncated only when not terminated)",
                    key="truncated",
                )
            at_limit += int((count == env.max_steps).sum())
            ended_terminated_at_limit += int(((count == env.max_steps) & terminated).sum())
            count = torch.where(done, 0, count)
            unchanged = []  # groups whose observation the reset left equal in every finished env
            for group in env.groups:
                final, fresh = next_td[group, "observation"], obs[group, "observation"]
                not_done = ~done
                if not torch.equal(final[not_done], fresh[not_done]):
                    self.fail(
                        "auto_reset",
                        "obs differs from next's observation in an env that is not done: either _reset changed "
                        "envs outside its mask (select every state tensor with torch.where(mask, fresh, old)) or "
                        "_observe draws random numbers, which it does twice per step (draw them in _step and "
                        "keep them in the state)",
                        group,
                    )
                if torch.equal(final[done], fresh[done]):
                    unchanged.append(group)
            # A fresh start may repeat one group's observation (a speaker shown the same target again), so
            # only a reset that changes no group's observation at all gives the bug away.
            if bool(done.any()):
                saw_done = True
                if len(unchanged) == len(env.groups):
                    self.fail(
                        "auto_reset",
                        f"at step {t + 1} a finished env's next observation equals its obs in every group: either "
                        "next was overwritten by the reset observation (as when _observe returns a state tensor "
                        "that _reset then updates in place: return a new tensor, e.g. .clone()) or the env was "
                        "not reset",
                        unchanged[0],
                        "observation",
                    )
        if at_limit > 1 and ended_terminated_at_limit == at_limit:
            self.fail(
                "truncation",
                f"all {at_limit} episodes that reached max_steps={env.max_steps} were marked terminated, none "
                "truncated: a time limit must set truncated",
                key="truncated",
            )
        if env.max_steps + 2 <= self.long_run and not saw_done:
            self.fail("truncation", f"no episode ended in {self.long_run} steps with max_steps={env.max_steps}")

    def caller_reset(self) -> None:
        """Property `auto_reset`, continued: `step(action, auto_reset=False)`, then `reset(mask=next["done"][:, 0])`,
        the caller's reset that `marl eval --render` and the demos record with, give what `step(action)` gave in
        `truncation_and_auto_reset`'s run (the same seed and actions), up to the step after the first reset."""
        env = self.env
        fix = (
            "an override of step or step_data must take auto_reset and pass it on: "
            "super().step(action, auto_reset=auto_reset) (or step_data's)"
        )
        obs = env.reset(seed=self.seed)
        generator = torch.Generator(env.device).manual_seed(1)  # `run`'s actions
        reset_before = False
        for t, (next_auto, obs_auto) in enumerate(self.auto_reset_run, 1):
            action = self.actions(generator, obs)
            try:
                next_td, obs = env.step(action, auto_reset=False)
            except TypeError as error:
                self.fail("auto_reset", f"step(action, auto_reset=False) raised TypeError: {error}; {fix}")
            step = f"at step {t}, step(action, auto_reset=False)"
            self.compare(next_auto, next_td, "auto_reset", f"{step} gave another next than step(action); {fix}")
            observed = next_td.select(*obs.keys(True, True))
            detail = f"{step} gave an obs other than next's observation (did it reset the done envs?); {fix}"
            self.compare(observed, obs, "auto_reset", detail)
            obs = env.reset(mask=next_td["done"][:, 0])
            detail = f"{step} then reset(mask=next['done'][:, 0]) gave another obs than step(action); {fix}"
            self.compare(obs_auto, obs, "auto_reset", detail)
            if reset_before:
                return
            reset_before = bool(next_td["done"].any())

    def render(self) -> None:
        try:
            image = self.env.render(0)
        except NotImplementedError:
            return
        if not isinstance(image, np.ndarray) or image.dtype != np.uint8 or image.ndim != 3 or image.shape[2] != 3:
            self.fail(
                "render",
                f"render() must return a uint8 [H, W, 3] array, got {getattr(image, 'shape', image)}",
            )

    def compare(self, a: TensorDictBase, b: TensorDictBase, prop: str, detail: str) -> None:
        for key in a.keys(include_nested=True, leaves_only=True):
            x, y = a.get(key), b.get(key, None)
            group, name = (key[0], key[-1]) if isinstance(key, tuple) else (None, key)
            if y is None:
                self.fail(prop, f"{detail} (key missing in one run)", group, name)
            if x.shape != y.shape or not torch.allclose(x.float(), y.float(), atol=1e-6, rtol=0):
                self.fail(prop, detail, group, name)

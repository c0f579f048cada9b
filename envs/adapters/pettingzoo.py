"""`pettingzoo/<module>.<env>`: a PettingZoo env, `num_envs` copies stepped as one batch.

    env = envs.make("pettingzoo/mpe2.simple_spread_v3", num_envs=32, seed=0, N=3)
    env = envs.make("pettingzoo/pettingzoo.classic.tictactoe_v3", num_envs=8, seed=0)

The name after `pettingzoo/` is an importable module: its `parallel_env(**kwargs)` is used, or, for
AEC-only modules, `env(**kwargs)` converted by PettingZoo (`aec_to_parallel`, or
`turn_based_aec_to_parallel` for turn-based games that PettingZoo does not mark parallelizable, where
only the agent whose turn it is acts). Keywords other than `max_steps` go to the env.

Batching: the copies step one after another on the host (`runs_on_host = True`); their numpy outputs
go into one host buffer per dtype, moved to the device once per step (`envs.adapters.host_batch`: pinned
memory and an asynchronous copy when the device is CUDA).

What maps to what:
- groups by type from agent names (`adversary_0` -> `adversary`); `(group, "observation")`
  `[B, n, *shape]` float32, `(group, "reward")` `[B, n, 1]`;
- Dict observations `{"observation", "action_mask"}` make the action a masked `Discrete` and fill
  `(group, "action_mask")`; an agent whose mask allows nothing (it waits for its turn) gets a mask
  that allows action 0 only, which the env ignores;
- agents that leave mid-episode: an agent PettingZoo terminates (or truncates while others go on)
  reads `terminated` until its env resets; meanwhile its reward is 0, its observation keeps its last
  value, its action is not passed on and `(group, "active")` reads False (every group of the adapter
  has the key: `GroupSpec.agents_leave`). An env is done when all its agents are. Every agent is in its
  episode from the reset (one missing then, or one that comes back after it left, is an error).
  Learners leave those steps out: PPO's losses and advantage normalisation, the off-policy critic and
  actor losses, IQL's TD loss are means over the active agent-steps, VDN and QMIX sum or mix only the
  active agents' Qs (`marl.core.masking`); centralised critics and QMIX's mixer read zeros for a
  departed agent's observation and action (the env's `state` is left as the env gives it);
- time limits are vecmarl's `max_steps`. For envs with a `max_cycles` option (MPE, SISL, butterfly)
  the two are one number: `max_cycles=max_steps` is passed on (default: the env's own `max_cycles`).
  An env that ends by its own truncation before `max_steps` is reported as terminated, with a warning;
- rendering: `render(i)` is copy `i`'s `render()`, which gives images where the copies were made with
  `render_mode="rgb_array"`: the option, or `make(..., render=True)` (`marl eval --render`), which asks for it
  in place of any other mode (`"human"` would open a window) and refuses, before building, an env whose
  metadata lists no `"rgb_array"` among its `render_modes`. The mode changes nothing of the episodes;
- PettingZoo's infos are not passed through (they hold arbitrary Python objects);
- seeding: `make(seed=s)` and `reset(seed=s)` reset copy `i` with seed `s + i`; later resets continue
  each copy's own random stream, as in PettingZoo;
- `state_dict()` raises NotImplementedError: the copies' simulator state cannot be saved, so a resumed
  training run starts new episodes.

An error of the wrapped env while it is made (built and first reset) is a ValueError that names the env
and its keyword arguments (and lists the ones it accepts, when its constructor's signature says).
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import inspect
import warnings
from typing import Any

import numpy as np
import torch

from envs import options as _options
from envs.adapters.agent_groups import group_by_type
from envs.adapters.host_batch import HostBatch
from envs.adapters.spaces import action_spec, observation_spec
from envs.base import EnvConfig, MultiAgentEnv
from envs.registry import register_prefix

INSTALL = 'pip install "vecmarl[pettingzoo]"'
EXAMPLES = (
    "pettingzoo/mpe2.simple_spread_v3 (MPE envs: the modules in mpe2.all_modules.mpe_environments) or "
    "pettingzoo/pettingzoo.classic.tictactoe_v3 (PettingZoo's own: pettingzoo.utils.all_modules.all_environments)"
)


@dataclasses.dataclass(frozen=True)
class PettingZooConfig(EnvConfig):
    env: str = _options.internal(default="mpe2.simple_spread_v3")
    """Importable module of the env, with a parallel_env() or env() function (from the env's name)."""
    env_kwargs: dict = _options.internal(default_factory=dict)
    """Keyword arguments of the module's parallel_env() or env(): `make`'s keywords other than max_steps."""


class PettingZooEnv(MultiAgentEnv):
    """`num_envs` copies of a PettingZoo env as one vecmarl env; `copies` are the PettingZoo envs."""

    Config = PettingZooConfig
    config: PettingZooConfig
    name = "pettingzoo"
    runs_on_host = True
    traceable = False
    seeding_advice = (
        "the adapter resets copy i with reset(seed=seed + i) and then lets each copy draw on, so the wrapped "
        "PettingZoo env draws from a generator that reset(seed) does not seed, or keeps state from the last "
        "episode. In an env of your own, draw every random number from the generator reset(seed) seeds "
        "(self.np_random, from gymnasium.utils.seeding.np_random(seed)), not numpy's, Python's or torch's global "
        "ones, and set all episode state in reset; an env you cannot change trains, but its runs do not repeat "
        "from a seed"
    )

    def __init__(self, config: PettingZooConfig | None = None, **kwargs: Any) -> None:
        self._made = False  # until then, errors of the wrapped env name it (`_wrapped_env_errors`)
        super().__init__(config, **kwargs)
        self._made = True

    @property
    def renders(self) -> bool:
        """Whether `render()` gives images: the copies were made with render_mode='rgb_array'."""
        return self.config.env_kwargs.get("render_mode") == "rgb_array"

    # ---- the contract's hooks ----------------------------------------------------------------------

    def _make_groups(self):
        # The copies are built here, the first hook the base class calls, because their agents define the groups.
        self.name = f"pettingzoo/{self.config.env}"
        module = import_env_module(self.config.env)
        with self._wrapped_env_errors("building", module):
            self.copies = [parallel_env(module, self.config.env_kwargs) for _ in range(self.num_envs)]
        first = self.copies[0]
        self._agents = list(first.possible_agents)
        observations, actions = [], []
        self._masked: dict[str, bool] = {}
        self._action_start: dict[str, int] = {}
        for agent in self._agents:
            space = first.observation_space(agent)
            self._masked[agent] = _is_masked(space)
            observations.append(observation_spec(space["observation"] if self._masked[agent] else space, repr(agent)))
            action_space = first.action_space(agent)
            actions.append(action_spec(action_space, repr(agent), self._masked[agent]))
            mask_shape = tuple(space["action_mask"].shape) if self._masked[agent] else None
            if mask_shape is not None and mask_shape != (actions[-1].n,):  # else it failed at the first reset
                raise TypeError(
                    f"{agent!r} observes an action_mask of shape {mask_shape} but has a {action_space} action space; "
                    f"expected one entry per action, shape ({actions[-1].n},)"
                )
            self._action_start[agent] = int(getattr(action_space, "start", 0)) if actions[-1].shape == () else 0
        groups, members = group_by_type(self._agents, observations, actions)
        self._slot = {self._agents[i]: (group, j) for group, indices in members.items() for j, i in enumerate(indices)}
        return groups

    def _init_state(self) -> None:
        B = self.num_envs
        layout: dict[str, tuple[tuple[int, ...], torch.dtype]] = {"terminated": ((B,), torch.bool)}
        for group, spec in self.groups.items():
            n = spec.n_agents
            layout[f"{group}/observation"] = ((B, n, *spec.observation.shape), torch.float32)
            layout[f"{group}/reward"] = ((B, n), torch.float32)
            layout[f"{group}/left"] = ((B, n), torch.bool)  # the agent left this episode
            if spec.has_action_mask:
                layout[f"{group}/action_mask"] = ((B, n, spec.action.n), torch.bool)
        self._host = HostBatch(layout, self.device)
        self._data = self._host.upload()
        self._pending_seeds: list[int | None] = [self.seed + i for i in range(B)]
        self._warned_early_truncation = False

    def _reset(self, mask: torch.Tensor) -> None:
        indices = np.flatnonzero(mask.cpu().numpy())
        if len(indices) == 0:
            return
        arrays = self._host.arrays
        self._host.wait()
        arrays["terminated"][indices] = False
        for group in self.groups:
            arrays[f"{group}/left"][indices] = False
            arrays[f"{group}/observation"][indices] = 0.0
            if f"{group}/action_mask" in arrays:
                arrays[f"{group}/action_mask"][indices] = False
                arrays[f"{group}/action_mask"][indices, :, 0] = True
        with self._wrapped_env_errors("resetting"):
            for i in indices:
                observations, _ = self.copies[i].reset(seed=self._pending_seeds[i])
                self._pending_seeds[i] = None
                missing = [agent for agent in self._agents if agent not in self.copies[i].agents]
                if missing:
                    raise ValueError(
                        f"{self.name}: copy {i} lacks the agents {missing} after its reset; the adapter takes every "
                        "agent of possible_agents as in the episode from its start until it leaves (agents may leave "
                        "early, not join late)"
                    )
                self._write_observations(i, observations)
        self._data = self._host.upload()

    def _step(self, action: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        # detach: the caller's actions may require grad (e.g. continuous actions straight from a policy)
        host_action = {group: value.detach().cpu().numpy() for group, value in action.items()}  # [B, n, ...]
        arrays = self._host.arrays
        self._host.wait()
        for group in self.groups:
            arrays[f"{group}/reward"][:] = 0.0
        for i, copy in enumerate(self.copies):
            actions = {agent: self._pz_action(agent, host_action, i) for agent in copy.agents}
            try:
                observations, rewards, terminations, truncations, _ = copy.step(actions)
            except (AssertionError, ValueError) as error:  # how PettingZoo's envs refuse an action
                raise ValueError(
                    f"{self.name}: copy {i} refused the actions {actions} ({type(error).__name__}: {error}); "
                    "with check_values=True the adapter checks them first and names the group"
                ) from error
            back = [agent for agent in copy.agents if agent not in actions]
            if back:
                raise ValueError(
                    f"{self.name}: copy {i} brought back the agents {back} after they left; an agent that leaves "
                    "stays out until its env resets (as PettingZoo's parallel_api_test asks)"
                )
            self._write_observations(i, observations)
            ended = not copy.agents
            for agent, reward in rewards.items():
                group, j = self._slot[agent]
                arrays[f"{group}/reward"][i, j] = reward
            for agent in terminations:
                group, j = self._slot[agent]
                if terminations[agent] or (truncations.get(agent, False) and not ended):
                    arrays[f"{group}/left"][i, j] = True
            arrays["terminated"][i] = ended and not (any(truncations.values()) and self._at_limit(i))
        self._data = self._host.upload()
        reward = {group: self._data[f"{group}/reward"] for group in self.groups}
        return reward, self._data["terminated"]

    def _observe(self) -> dict[str, torch.Tensor]:
        return {group: self._data[f"{group}/observation"] for group in self.groups}

    def _action_mask(self) -> dict[str, torch.Tensor]:
        return {g: self._data[f"{g}/action_mask"] for g, spec in self.groups.items() if spec.has_action_mask}

    def _agent_terminated(self) -> dict[str, torch.Tensor]:
        return {group: self._data[f"{group}/left"] for group in self.groups}

    def _render(self, index: int) -> np.ndarray:
        if not self.renders:
            raise NotImplementedError(
                f"{self.name} renders only when made with render_mode='rgb_array' (envs.make(..., render=True) "
                "asks for it)"
            )
        frame = self.copies[index].render()
        if not (isinstance(frame, np.ndarray) and frame.ndim == 3 and frame.shape[-1] == 3):
            got = f"an array of shape {frame.shape}" if isinstance(frame, np.ndarray) else type(frame).__name__
            raise NotImplementedError(
                f"{self.name}: the wrapped env's render() returned {got} with render_mode='rgb_array', where an "
                "RGB image [H, W, 3] was expected"
            )
        return frame.astype(np.uint8, copy=False)

    def reset_data(self, seed: int | None = None, *, mask: torch.Tensor | None = None) -> dict:
        check_seed(self.name, seed)
        if seed is not None:
            self._pending_seeds = [int(seed) + i for i in range(self.num_envs)]
        return super().reset_data(seed, mask=mask)

    def state_dict(self) -> dict:
        raise NotImplementedError(
            f"{self.name}: state_dict() is not supported: the wrapped PettingZoo envs' state (their simulators "
            "and random streams) is not saved, so a restored env would not continue where this one is"
        )

    def load_state_dict(self, state: dict) -> None:
        raise NotImplementedError(
            f"{self.name}: load_state_dict() is not supported: the wrapped PettingZoo envs' state is not saved "
            "by state_dict(), so it cannot be restored"
        )

    # ---- internals ---------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _wrapped_env_errors(self, doing: str, module=None):
        """While the env is made, an error of the wrapped env (a bad keyword argument, say) becomes a
        ValueError naming the env and its kwargs; later (`_made`) errors pass through unchanged."""
        if self._made:
            yield
            return
        try:
            yield
        except Exception as error:
            kwargs = self.config.env_kwargs
            accepted = accepted_keywords(module) if module is not None and isinstance(error, TypeError) else None
            hint = f"; the env's keyword arguments are: {', '.join(accepted)}" if accepted is not None else ""
            raise ValueError(
                f"{self.name}: {doing} the wrapped env with kwargs {kwargs} failed "
                f"({type(error).__name__}: {error}){hint}"
            ) from error

    def _write_observations(self, i: int, observations: dict) -> None:
        arrays = self._host.arrays
        for agent, observation in observations.items():
            group, j = self._slot[agent]
            if self._masked[agent]:
                allowed = np.asarray(observation["action_mask"], dtype=bool)
                arrays[f"{group}/action_mask"][i, j] = allowed
                arrays[f"{group}/action_mask"][i, j, 0] |= not allowed.any()
                observation = observation["observation"]
            arrays[f"{group}/observation"][i, j] = observation

    def _pz_action(self, agent: str, host_action: dict[str, np.ndarray], i: int):
        group, j = self._slot[agent]
        value = host_action[group][i, j]
        if self.groups[group].action.shape == ():
            return int(value) + self._action_start[agent]
        return np.array(value)  # a copy: the env may keep it, and the caller's tensor may change

    def _at_limit(self, i: int) -> bool:
        """Whether env `i` reaches `max_steps` with this step: its own truncation is then vecmarl's."""
        at_limit = int(self.step_count[i]) + 1 >= self.max_steps
        if not at_limit and not self._warned_early_truncation:
            self._warned_early_truncation = True
            warnings.warn(
                f"{self.name}: the env truncated an episode after {int(self.step_count[i]) + 1} steps, before "
                f"max_steps={self.max_steps}; vecmarl reports it as terminated. Set max_steps to the env's own "
                "time limit so that it is reported as truncated.",
                stacklevel=4,
            )
        return at_limit


def _is_masked(space) -> bool:
    spaces = getattr(space, "spaces", None)
    return isinstance(spaces, dict) and "observation" in spaces and "action_mask" in spaces


def import_env_module(path: str):
    try:
        import pettingzoo  # noqa: F401
    except ImportError as error:
        raise ImportError(f"the PettingZoo adapter needs pettingzoo ({error}); install it with: {INSTALL}") from error
    if not all(part.isidentifier() for part in path.split(".")):  # importlib: "Empty module name", or a relative import
        raise KeyError(
            f"pettingzoo/{path}: {path!r} is not a module name; the name after 'pettingzoo/' is an importable "
            f"module with a parallel_env() or env() function, e.g. {EXAMPLES}"
        )
    try:
        module = importlib.import_module(path)
    except ImportError as error:
        raise KeyError(
            f"cannot import {path!r} for pettingzoo/{path} ({type(error).__name__}: {error}); the name after "
            f"'pettingzoo/' is an importable module with a parallel_env() or env() function, e.g. {EXAMPLES}"
        ) from error
    if not hasattr(module, "parallel_env") and not hasattr(module, "env"):
        raise KeyError(
            f"module {path!r} has neither parallel_env() nor env(); expected a PettingZoo env module, e.g. {EXAMPLES}"
        )
    return module


def parallel_env(module, kwargs: dict):
    """The module's Parallel env, converting an AEC-only one with PettingZoo's own wrappers."""
    if hasattr(module, "parallel_env"):
        return module.parallel_env(**kwargs)
    from pettingzoo.utils.conversions import aec_to_parallel, turn_based_aec_to_parallel

    aec = module.env(**kwargs)
    return aec_to_parallel(aec) if aec.metadata.get("is_parallelizable", False) else turn_based_aec_to_parallel(aec)


def accepted_keywords(module) -> list[str] | None:
    """The keyword arguments the module's env takes: those of the first of `parallel_env`, `env` and
    `raw_env` whose signature names them all (no `**kwargs`); None when none does."""
    for name in ("parallel_env", "env", "raw_env"):
        function = getattr(module, name, None)
        try:
            parameters = inspect.signature(function).parameters.values() if callable(function) else None
        except (TypeError, ValueError):
            continue
        if parameters is None or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
            continue
        return [p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    return None


def check_seed(name: str, seed) -> None:
    # Checked here: the wrapped envs (gymnasium) reject a bad seed with a message that names no env.
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0):
        raise ValueError(f"{name}: seed must be a non-negative int or None, got {seed!r}")


def declared_render_modes(module) -> list[str] | None:
    """The `render_modes` in the metadata of the module's env class: `raw_env`, `parallel_env` or `env` where
    one is a class, else the one PettingZoo env class the module defines (a module of functions building it);
    None where no class is found. An env class whose metadata has no `render_modes` declares none."""
    from pettingzoo import AECEnv, ParallelEnv

    named = [c for c in (getattr(module, n, None) for n in ("raw_env", "parallel_env", "env")) if isinstance(c, type)]
    defined = [
        c
        for c in vars(module).values()
        if isinstance(c, type) and issubclass(c, (AECEnv, ParallelEnv)) and c.__module__ == module.__name__
    ]
    found = named[:1] or (defined if len(defined) == 1 else [])
    metadata = getattr(found[0], "metadata", None) if found else None
    return list(metadata.get("render_modes", ())) if isinstance(metadata, dict) else None


def render_options(path: str, options: dict) -> dict:
    """`envs.make("pettingzoo/<module>", render=True)`: the options with `render_mode="rgb_array"`, in place of any
    other mode (`"human"` would open a window; the mode changes nothing of the episodes). NotImplementedError
    where the env's metadata lists render modes without `"rgb_array"`."""
    modes = declared_render_modes(import_env_module(path))
    if modes is not None and "rgb_array" not in modes:
        listed = f"lists only the render_modes {modes}" if modes else "lists no render_modes"
        raise NotImplementedError(
            f"pettingzoo/{path} cannot draw frames: its metadata {listed}, and the adapter draws with "
            "render_mode='rgb_array'"
        )
    return {**options, "render_mode": "rgb_array"}


def _max_cycles_default(module) -> int | None:
    """The env's own `max_cycles` default when its constructor takes one, else None."""
    for name in ("raw_env", "parallel_env", "env"):
        function = getattr(module, name, None)
        try:
            parameter = inspect.signature(function).parameters.get("max_cycles") if function else None
        except (TypeError, ValueError):
            continue
        if parameter is not None and isinstance(parameter.default, int):
            return parameter.default
    return None


def make_pettingzoo(
    path: str,
    *,
    num_envs: int,
    device: torch.device | str = "cpu",
    seed: int | None = None,
    check_values: bool = False,
    compile: bool = False,
    **options: Any,
) -> PettingZooEnv:
    """`envs.make("pettingzoo/<module>", ...)`: `max_steps` is vecmarl's, the rest the env's."""
    if compile:
        raise ValueError(f"pettingzoo/{path}: compile=True is not supported: the env runs on the host")
    check_seed(f"pettingzoo/{path}", seed)
    max_cycles = _max_cycles_default(import_env_module(path))
    if max_cycles is not None:
        given = options.get("max_cycles")
        if given is not None and "max_steps" in options and given != options["max_steps"]:
            raise ValueError(
                f"pettingzoo/{path}: max_cycles={given} and max_steps={options['max_steps']} differ; pass only "
                "max_steps (vecmarl's time limit, passed on as max_cycles)"
            )
        steps = options.pop("max_steps", given if given is not None else max_cycles)
        options["max_cycles"] = steps
        options = {"max_steps": steps, **options}
    own = {"max_steps": options.pop("max_steps")} if "max_steps" in options else {}
    config = _options.build(
        PettingZooConfig, {**own, "env": path, "env_kwargs": options}, what=f"env 'pettingzoo/{path}'"
    )
    return PettingZooEnv(config, num_envs=num_envs, device=device, seed=seed, check_values=check_values)


register_prefix("pettingzoo", make_pettingzoo, "module.env", render_options=render_options)

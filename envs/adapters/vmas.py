"""`vmas/<scenario>`: any VMAS scenario behind the vecmarl env contract, on its device.

    env = envs.make("vmas/navigation", num_envs=1024, device="cuda", seed=0, n_agents=3)
    env = envs.make("vmas/simple_tag", num_envs=64, continuous_actions=False, max_steps=50)

Options: `max_steps` (vecmarl owns the time limit; VMAS itself runs without one), `continuous_actions`
(True: Box actions in VMAS's ranges; False: one Discrete choice per agent), `multidiscrete_actions`
(with `continuous_actions=False`: one choice per action dimension). Every other keyword goes to the
scenario; one the scenario does not use is an error.

What maps to what: agents are grouped by type from their names (`agent_0` -> group `agent`, see
`envs.adapters.agent_groups`); `(group, "observation")` `[B, n, obs_dim]`; `(group, "reward")` `[B, n, 1]`;
`terminated` is the scenario's `done()`. VMAS's per-agent info is passed through in `next` as
`(group, "info", key)`, shaped `[B, n, *shape]` (a scalar per agent is `[B, n, 1]`).

Auto-reset without a loop over envs. VMAS resets one env index or all of them. The adapter keeps a
second VMAS world built from the same scenario and options, the scratch. To reset the envs where a
mask is true it resets the whole scratch, then copies the masked rows of every batched tensor (entity
states and actions, joints, scenario buffers such as reward shaping, football's scripted red team)
into the live world with `torch.where` (`envs.adapters.vmas_world`: the tensors are found once, at
construction, by walking the objects of the worlds side by side). When every env is to be reset it
calls VMAS's own `reset()`, which also redraws what some scenarios keep for the whole batch
(simple_speaker_listener's goal).
`tests/envs/adapters/test_vmas_adapter.py` shows that the masked copy equals VMAS's own per-index `reset_at`.

Host syncs. VMAS's own step and reset synchronise with the host (asserts on action values, branches
on `tensor.any()`, rejection sampling), so calls into VMAS run under `allow_host_sync`. The adapter
itself reads whether any env (and then whether every env) is to be reset: steps where no env
finished skip the reset, which costs about a third of a step.

Inference mode. Calls into VMAS run under `torch.inference_mode()` (VMAS's simulation needs no
autograd), so the live world's tensors become inference tensors: code that steps or edits
`env.vmas_env` itself must do so under `torch.inference_mode()` too. What the adapter returns are
ordinary tensors.

Rendering. `render(i)` is VMAS's own `render(mode="rgb_array", env_index=i)`, a `[H, W, 3]` uint8
frame drawn by pyglet with OpenGL: headless where EGL finds a device (a GPU driver's, or Mesa's
software one: `apt-get install libegl1 libegl-mesa0`), else in a window on the X display `DISPLAY`
names. Where neither is there, `renders` is False and `render` says what to install
(`render_problem`), so `marl eval --render` refuses before the episode runs.

Checkpoints. `state_dict()` saves the base class's tensors, every tensor of the live and the scratch
world (found as the masked reset's are, unbatched ones too: a goal's colour; tensors that several paths
hold are saved once and restored as one), which of the world's entities each reference to one holds (MPE
scenarios pick a landmark as the goal of the whole batch) and both private random streams, as tensors,
numbers and strings (`torch.load(weights_only=True)` reads them; each path saved by name, `world_paths`).
`load_state_dict` into an env of the same scenario, options and `num_envs`, whatever its seed, continues
exactly, so `marl train --resume` does. What a scenario keeps elsewhere (Python numbers, objects other than
entities, a world whose objects depend on the seed) is not saved: `state_problem()` finds it once per
scenario and options in a process, by saving a small env's state into one of another seed and stepping
both on through resets, and `state_dict()` then raises NotImplementedError with its reason, so a resumed
run starts new episodes and says why (among VMAS 1.5.2's scenarios: ball_passage, road_traffic, sampling).

Randomness. VMAS draws from torch's, numpy's and Python's global generators, swapped in from one list
shared by every VMAS env. Each adapter keeps its own copy of that list and swaps it in around its
calls into VMAS, so adapters never share a random stream. The masked reset draws from a second
stream (seeded from the env's seed), so that resetting some envs leaves what the others draw next
unchanged. Seeding follows VMAS: `make(..., seed=s)` and `reset(seed=s)` start where VMAS's
`make_env(..., seed=s)` and `reset(seed=s)` do (for `s < 2**32`; VMAS also seeds numpy, so larger
seeds are taken modulo 2**32).
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import functools
import io
import os
import random
import sys
import traceback
import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from tensordict import TensorDictBase

from envs import options as _options
from envs.adapters.agent_groups import group_by_type
from envs.adapters.spaces import action_spec, observation_spec
from envs.adapters.vmas_world import (
    PrivateRandomState,
    batched_slots,
    copy_rows,
    load_world_state,
    rows,
    world_paths,
    world_state,
)
from envs.base import EnvConfig, MultiAgentEnv
from envs.registry import register_prefix
from envs.specs import Discrete
from envs.sync import allow_host_sync

INSTALL = 'pip install "vecmarl[vmas]"'
INSTALL_GL = "on Debian or Ubuntu: apt-get install libegl1 libegl-mesa0 libgl1 libglu1-mesa"
OWN_OPTIONS = ("max_steps", "continuous_actions", "multidiscrete_actions")
# vmas.make_env's own arguments, which the adapter sets: passed on, they would not reach the scenario.
VMAS_ENV_ARGUMENTS = {
    "dict_spaces",
    "clamp_actions",
    "grad_enabled",
    "terminated_truncated",
    "wrapper",
    "wrapper_kwargs",
}


@dataclasses.dataclass(frozen=True)
class VmasConfig(EnvConfig):
    scenario: str = _options.internal(default="navigation")
    """The VMAS scenario (names in vmas.scenarios, vmas.mpe_scenarios, vmas.debug_scenarios)."""
    continuous_actions: bool = True
    """Box actions in VMAS's ranges; False gives Discrete actions."""
    multidiscrete_actions: bool = False
    """With continuous_actions=False: one choice per action dimension (MultiDiscrete)."""
    scenario_kwargs: dict = _options.internal(default_factory=dict)
    """Keyword arguments of the scenario (e.g. n_agents): `make`'s keywords that are not the above."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.multidiscrete_actions and self.continuous_actions:
            raise ValueError("multidiscrete_actions=True needs continuous_actions=False")


class VmasEnv(MultiAgentEnv):
    """A VMAS scenario as a vecmarl env; `vmas_env` is the live VMAS `Environment` (e.g. to render)."""

    Config = VmasConfig
    config: VmasConfig
    name = "vmas"
    traceable = False  # VMAS's physics branches on data in Python (as `make_vmas` says to compile=True)
    seeding_advice = (
        "VMAS seeds torch's, numpy's and Python's global generators, and the adapter gives each env its own copy "
        "of them, so a scenario that draws only from those and sets its whole state in reset_world_at repeats "
        "from a seed; this one draws elsewhere or keeps state from the last episode. The scenario is VMAS's, not "
        "yours to change: report it to vecmarl with the scenario's name and options (the adapter's bug to fix), "
        "or train on it knowing that its runs do not repeat from a seed"
    )

    @property
    def renders(self) -> bool:
        """Whether `render()` gives images: VMAS can draw on this machine (see `render_problem`)."""
        return render_problem() is None

    # ---- the contract's hooks ----------------------------------------------------------------------

    def _make_groups(self):
        # The simulator is built here, the first hook the base class calls (after checking num_envs,
        # device and seed), because its agents define the groups.
        self.name = f"vmas/{self.config.scenario}"
        vmas = import_vmas()
        known = [*vmas.scenarios, *vmas.mpe_scenarios, *vmas.debug_scenarios]
        if self.config.scenario not in known:
            raise KeyError(
                f"unknown VMAS scenario {self.config.scenario!r}; the valid names are those in "
                f"vmas.scenarios, vmas.mpe_scenarios and vmas.debug_scenarios: {', '.join(known)}"
            )
        if isinstance(self.seed, tuple):  # `seed % 2**32` would fail naming neither the env nor the seed
            raise ValueError(
                f"{self.name}: seed must be one int, got {self.seed!r}: VMAS draws every env's numbers from one "
                "random stream, so one batch cannot hold several members' seeds"
            )
        shared = vmas.simulator.environment.Environment.vmas_random_state
        self._random = PrivateRandomState(shared, self.device)
        # The masked reset draws from a stream of its own: from the live world's, it would change what
        # the envs it leaves alone draw next (asym_joint draws observation noise at every step).
        self._scratch_random = PrivateRandomState(shared, self.device)
        self.vmas_env = self._build(vmas, self.num_envs, seed=self.seed % 2**32, check_kwargs=True)
        self._scratch = self._build(vmas, self.num_envs)
        probe = self._build(vmas, 2 if self.num_envs == 1 else 1)
        self._slots = batched_slots(self.vmas_env.scenario, self._scratch.scenario, probe.scenario)
        # What a checkpoint saves of each world: every tensor, and which entity each reference holds.
        self._live_paths = world_paths(self.vmas_env.scenario)
        self._scratch_paths = world_paths(self._scratch.scenario)
        self._seed_vmas(self.seed)  # so that the base class's first reset starts where make_env(seed) does

        agents = self.vmas_env.agents
        spaces = self.vmas_env.observation_space.spaces
        observations = [observation_spec(space, f"{self.name}: agent {a.name!r}") for a, space in zip(agents, spaces)]
        actions = [
            action_spec(self.vmas_env.get_agent_action_space(a), f"{self.name}: agent {a.name!r}") for a in agents
        ]
        groups, self._members = group_by_type([agent.name for agent in agents], observations, actions)
        return groups

    def _init_state(self) -> None:
        B = self.num_envs
        self._obs = {  # [B, n, obs_dim] per group: what `_observe` returns
            g: torch.zeros(B, spec.n_agents, *spec.observation.shape, device=self.device)
            for g, spec in self.groups.items()
        }
        self._info: dict[str, dict[str, torch.Tensor]] = {}  # group -> key -> [B, n, ...]
        self._info_keys: dict[str, list[list[str]]] | None = None  # group -> keys of one shape

    def _reset(self, mask: torch.Tensor) -> None:
        # The adapter's own reads of device values (VMAS itself makes many): no env to reset, no reset;
        # every env to reset, VMAS's own full reset, which also redraws what scenarios keep for the
        # whole batch (e.g. simple_speaker_listener's goal); else the scratch reset and masked copy.
        with allow_host_sync():
            if not bool(mask.any()):
                return
            every = bool(mask.all())
        with self._calling_vmas(self._random if every else self._scratch_random):
            (self._scratch if not every else self.vmas_env).reset(return_observations=False)
            if not every:
                copy_rows(self._slots, self.vmas_env.scenario, self._scratch.scenario, mask)
            (observations,) = self.vmas_env.get_from_scenario(
                get_observations=True, get_rewards=False, get_infos=False, get_dones=False
            )
        fresh = self._by_group(observations)
        # Where no env was reset, keep the step's observation: recomputing may draw new noise.
        self._obs = {g: torch.where(rows(mask, fresh[g]), fresh[g], self._obs[g]) for g in self.groups}

    def _step(self, action: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        per_agent: list[torch.Tensor] = [None] * len(self.vmas_env.agents)
        for group, indices in self._members.items():
            value = action[group]
            if isinstance(self.groups[group].action, Discrete):
                value = value.unsqueeze(-1)  # VMAS takes Discrete actions as [B, 1]
            for i, agent_value in zip(indices, value.unbind(1)):  # one op for the group's n views
                per_agent[i] = agent_value
        with self._calling_vmas():
            try:
                observations, rewards, terminated, infos = self.vmas_env.step(per_agent)
            except AssertionError as error:  # VMAS checks action values with asserts, before the world moves
                raise ValueError(
                    f"{self.name}: VMAS refused the actions: {describe_error(error)}. Their shapes and dtypes are "
                    "right, so some value is NaN or out of range; with check_values=True the adapter names it"
                ) from error
        # Stacked out here, so what the adapter hands on are ordinary tensors, not inference tensors.
        self._obs = self._by_group(observations)
        self._info = self._info_by_group(infos)
        reward = self._by_group([r.reshape(self.num_envs) for r in rewards])
        return reward, terminated.to(torch.bool, copy=True)

    def _observe(self) -> dict[str, torch.Tensor]:
        return self._obs

    def _render(self, index: int) -> np.ndarray:
        problem = render_problem()
        if problem is not None:
            raise NotImplementedError(f"{self.name} cannot render on this machine: {problem}")
        if self.vmas_env.viewer is not None:
            # VMAS clears the current OpenGL context before it switches to its own: after another VMAS
            # env has drawn, the frame would be drawn over this env's last one, not on a clear canvas.
            self.vmas_env.viewer.window.switch_to()
        with self._calling_vmas():
            try:
                frame = self.vmas_env.render(mode="rgb_array", env_index=index)
            except Exception as error:  # a bug of VMAS's drawing code, e.g. sampling's colour map (matplotlib 3.9)
                raise RuntimeError(f"{self.name}: VMAS failed to draw a frame: {describe_error(error)}") from error
        return np.ascontiguousarray(frame)  # VMAS's is a view of OpenGL's rows, flipped

    def reset_data(self, seed: int | None = None, *, mask: torch.Tensor | None = None) -> dict:
        if seed is not None:
            seed = self._reseed_value(seed)  # checked before VMAS is re-seeded: a refused seed changes nothing
            self._seed_vmas(seed)
        return super().reset_data(seed, mask=mask)

    def step_data(
        self, action: Mapping[str, torch.Tensor] | TensorDictBase, *, auto_reset: bool = True
    ) -> tuple[dict, dict]:
        """As `MultiAgentEnv.step_data`, with VMAS's info in `next` as `(group, "info", key)`."""
        next_data, obs = super().step_data(action, auto_reset=auto_reset)
        for group, info in self._info.items():
            if info:
                next_data[group]["info"] = info
        return next_data, obs

    def state_dict(self) -> dict:
        """Everything needed to continue exactly where the env is: the base class's tensors, the batched
        tensors of the live and the scratch world (`batched_slots`) and both private random streams.
        Raises NotImplementedError where `state_problem()` says that the scenario cannot be restored."""
        problem = self.state_problem()
        if problem is not None:
            raise NotImplementedError(problem)
        return self._saved_state()

    def load_state_dict(self, state: dict) -> None:
        if "vmas" not in state:
            raise ValueError(f"{self.name}: the state to load has no VMAS world: it was not saved by a VMAS env")
        saved = state["vmas"]
        with torch.inference_mode():  # the world's tensors are inference tensors, as VMAS's steps make them
            for world, paths, part in (
                (self.vmas_env, self._live_paths, "live"),
                (self._scratch, self._scratch_paths, "scratch"),
            ):
                load_world_state(world.scenario, paths[0], saved[part], self.device, paths[1])
        self._random.load_state_dict(saved["random"])
        self._scratch_random.load_state_dict(saved["scratch_random"])
        super().load_state_dict(state)

    def state_problem(self) -> str | None:
        """Why `state_dict()` cannot save this scenario's state, or None where it can.

        The adapter saves the world's batched tensors, not what a scenario keeps elsewhere (Python numbers,
        tensors of other shapes, objects): whether that is all is checked once per scenario, options and
        device in a process (`restore_problem`, a fraction of a second for most scenarios)."""
        c = self.config
        key = (c.scenario, c.continuous_actions, c.multidiscrete_actions, repr(sorted(c.scenario_kwargs.items())))
        key += (str(self.device),)
        if key not in _RESTORE_PROBLEMS:
            _RESTORE_PROBLEMS[key] = restore_problem(self.config, self.device)
        return _RESTORE_PROBLEMS[key]

    # ---- internals ---------------------------------------------------------------------------------

    def _saved_state(self) -> dict:
        return {
            **super().state_dict(),
            "vmas": {
                "live": world_state(self.vmas_env.scenario, *self._live_paths),
                "scratch": world_state(self._scratch.scenario, *self._scratch_paths),
                "random": self._random.state_dict(),
                "scratch_random": self._scratch_random.state_dict(),
            },
        }

    def _build(self, vmas, num_envs: int, seed: int | None = None, check_kwargs: bool = False):
        c = self.config
        with self._calling_vmas(), warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:  # builds the scenario's world and resets it: where VMAS checks the options
                env = vmas.make_env(
                    c.scenario,
                    num_envs=num_envs,
                    device=self.device,
                    continuous_actions=c.continuous_actions,
                    multidiscrete_actions=c.multidiscrete_actions,
                    seed=seed,
                    max_steps=None,
                    **c.scenario_kwargs,
                )
            except ImportError:
                raise  # a scenario's missing dependency: its own message says what to install
            except Exception as error:
                # VMAS checks options with bare asserts and fails on bad types deep inside the scenario.
                raise ValueError(
                    f"{self.name}: the scenario rejected its options {self._vmas_options()}: {describe_error(error)}"
                ) from error
        for warning in caught if check_kwargs else ():
            if "passed but not used by the scenario" in str(warning.message):
                raise TypeError(f"{self.name}: {str(warning.message).split(' This will')[0]}")
            warnings.warn(warning.message, warning.category, stacklevel=4)
        return env

    def _vmas_options(self) -> dict[str, Any]:
        """The options given to VMAS that the user chose: the scenario's, and the action options where
        they are not the defaults."""
        defaults = VmasConfig()
        chosen = {
            name: getattr(self.config, name)
            for name in ("continuous_actions", "multidiscrete_actions")
            if getattr(self.config, name) != getattr(defaults, name)
        }
        return {**chosen, **self.config.scenario_kwargs}

    @contextlib.contextmanager
    def _calling_vmas(self, stream: PrivateRandomState | None = None):
        """Around every call into VMAS: the adapter's own random streams (`stream`, else the live
        world's), host syncs allowed (VMAS makes them), and inference mode: VMAS's simulation needs no
        autograd, and its bookkeeping slows a step of VMAS's many small ops."""
        with stream or self._random, allow_host_sync(), torch.inference_mode():
            yield

    def _seed_vmas(self, seed: int) -> None:
        with self._random:
            self.vmas_env.seed(seed % 2**32)  # VMAS also seeds numpy, which takes 32-bit seeds
        with self._scratch_random:  # another seed: the same one would repeat the live world's first starts
            self._scratch.seed(random.Random(seed).getrandbits(32))

    def _by_group(self, per_agent: list[torch.Tensor]) -> dict[str, torch.Tensor]:
        """VMAS's per-agent list of `[B, ...]` -> `{group: [B, n, ...]}`."""
        return {g: torch.stack([per_agent[i] for i in indices], 1) for g, indices in self._members.items()}

    def _info_by_group(self, infos: list[dict]) -> dict[str, dict[str, torch.Tensor]]:
        """Keys that every agent of a group reports as a tensor of one shape, stacked to `[B, n, *shape]`
        (`[B, n, 1]` for a scalar per env). The keys are chosen at the first step and kept, in lists of
        keys of one shape: one stack per list (navigation's 3 scalar keys: one stack, not 3)."""
        if self._info_keys is None:
            self._info_keys = {}
            for group, indices in self._members.items():
                by_shape: dict[torch.Size, list[str]] = {}
                for key, value in infos[indices[0]].items():
                    if all(
                        isinstance(infos[i].get(key), torch.Tensor) and infos[i][key].shape == value.shape
                        for i in indices
                    ):
                        by_shape.setdefault(value.shape, []).append(key)
                self._info_keys[group] = list(by_shape.values())
        grouped = {}
        for group, indices in self._members.items():
            grouped[group] = {}
            for keys in self._info_keys[group]:
                shape = infos[indices[0]][keys[0]].shape[1:] or (1,)  # per env; a scalar as [1]
                stacked = torch.stack([infos[i][key] for key in keys for i in indices], 1)  # [B, keys * n, ...]
                grouped[group].update(zip(keys, stacked.view(self.num_envs, len(keys), len(indices), *shape).unbind(1)))
        return grouped


# ---- whether a scenario's state can be saved ----------------------------------------------------------

# (scenario, action options, scenario options, device) -> `restore_problem`'s answer, found once per process
_RESTORE_PROBLEMS: dict[tuple, str | None] = {}
CHECK_MAX_STEPS = 3  # short episodes: the check's steps cross full and masked resets
CHECK_STEPS = 7


def restore_problem(config: VmasConfig, device: torch.device) -> str | None:
    """Why a state saved by `state_dict()` does not restore this scenario exactly, or None where it does.

    Two envs of 2, built with other seeds: the first steps (its envs' episodes ending apart, so that the
    resets that follow are masked ones as well as full ones), its state goes through torch.save and
    torch.load(weights_only=True) into the second, and both step on with the same actions, through
    resets: every output must be equal."""
    name = f"vmas/{config.scenario}"
    config = dataclasses.replace(config, max_steps=CHECK_MAX_STEPS)
    try:
        first, second = (VmasEnv(config, num_envs=2, device=device, seed=seed) for seed in (1, 2))
        generator = torch.Generator(device).manual_seed(0)
        with allow_host_sync():
            first.step(first.sample_actions(generator))
            first.reset(mask=torch.tensor([True, False], device=device))
            first.step(first.sample_actions(generator))
            saved = io.BytesIO()
            torch.save(first._saved_state(), saved)
            saved.seek(0)
            second.load_state_dict(torch.load(saved, weights_only=True))
            for _ in range(CHECK_STEPS):
                action = first.sample_actions(generator)
                for key, (a, b) in _pairs(first.step(action), second.step(action)):
                    if not _equal(a, b):
                        return (
                            f"{name} keeps state that the adapter cannot save: restored into another env, its "
                            f"state did not repeat the steps that followed ({'/'.join(key)} differed)"
                        )
    except Exception as error:  # whatever fails, the state cannot be relied on: resumed runs start new episodes
        return f"{name}: its state could not be saved and restored ({describe_error(error)})"
    return None


def _pairs(first: tuple[TensorDictBase, ...], second: tuple[TensorDictBase, ...]):
    """(key, first's tensor, second's) of every tensor of the step's (next, obs)."""
    for part, (a, b) in zip(("next", "obs"), zip(first, second)):
        for key, value in a.items(True, True):
            yield (part, *((key,) if isinstance(key, str) else key)), (value, b.get(key))


def _equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit for bit, NaN equal to NaN."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    same = a == b
    if a.is_floating_point():
        same |= a.isnan() & b.isnan()
    return bool(same.all())


# ---- construction ----------------------------------------------------------------------------------


def import_vmas():
    try:
        import vmas
    except ImportError as error:
        raise ImportError(f"the VMAS adapter needs vmas ({error}); install it with: {INSTALL}") from error
    return vmas


def render_problem() -> str | None:
    """Why VMAS cannot draw a frame on this machine, or None where it can.

    VMAS draws with pyglet and OpenGL: headless where EGL lists a device (a GPU driver's, or Mesa's
    software one), else in a window on the X display that `DISPLAY` names (`Environment.render`)."""
    missing = _missing_libraries()
    if missing:
        install = "pip install pyglet" if missing == ("pyglet",) else INSTALL_GL
        return f"VMAS draws with pyglet and OpenGL, and {' and '.join(missing)} cannot be loaded ({install})"
    devices = _egl_devices()
    if sys.platform != "linux" or devices or os.environ.get("DISPLAY"):
        return None  # macOS and Windows draw in a window of their own display
    return (
        "VMAS draws headless only where EGL lists a device, and here "
        + ("EGL lists none" if devices == 0 else "libEGL cannot be loaded")
        + f", nor is there an X display (DISPLAY is not set): install EGL ({INSTALL_GL}; Mesa's is a software "
        "device, a GPU driver has its own), or run under a virtual display "
        "(xvfb-run -s '-screen 0 1400x900x24' COMMAND)"
    )


@functools.cache
def _missing_libraries() -> tuple[str, ...]:
    """pyglet, and the OpenGL libraries VMAS's drawing code imports, where they cannot be loaded."""
    try:
        import pyglet
    except ImportError:
        return ("pyglet",)
    missing = []
    for library in ("GL", "GLU") if sys.platform == "linux" else ():
        try:
            pyglet.lib.load_library(library)
        except ImportError:
            missing.append(f"lib{library}")
    return tuple(missing)


@functools.cache
def _egl_devices() -> int | None:
    """How many devices EGL lists (VMAS's own test of whether it can draw headless); None without libEGL."""
    import pyglet

    try:
        pyglet.lib.load_library("EGL")
        from pyglet.libs.egl import egl, eglext
    except ImportError:
        return None
    devices = egl.EGLint()
    eglext.eglQueryDevicesEXT(0, None, ctypes.byref(devices))
    return devices.value


def describe_error(error: Exception) -> str:
    """`error`'s type and message, and where it was raised: the innermost line of VMAS's code (a bare
    `assert` has no message; the line is the only clue), else the innermost line."""
    root = os.path.dirname(os.path.dirname(import_vmas().__file__))  # paths are shown from "vmas/..."
    lines = [(frame.f_code.co_filename, line) for frame, line in traceback.walk_tb(error.__traceback__)]
    in_vmas = [(name, line) for name, line in lines if name.startswith(os.path.join(root, "vmas", ""))]
    where = ""
    if lines:
        name, line = (in_vmas or lines)[-1]
        where = f" at {os.path.relpath(name, root) if in_vmas else name}:{line}"
    message = str(error)
    if not message:
        return f"{type(error).__name__} (no message){where}"
    return f"{type(error).__name__}: {message}" + (f" ({where.strip()})" if where else "")


def make_vmas(
    scenario: str,
    /,
    *,
    num_envs: int,
    device: torch.device | str = "cpu",
    seed: int | None = None,
    check_values: bool = False,
    compile: bool = False,
    **options: Any,
) -> VmasEnv:
    """`envs.make("vmas/<scenario>", ...)`: the adapter's own options, the rest for the scenario."""
    if compile:
        raise ValueError(
            f"vmas/{scenario}: compile=True is not supported: VMAS's physics is Python that branches on data"
        )
    internal = sorted(f.name for f in dataclasses.fields(VmasConfig) if _options.is_internal(f) and f.name in options)
    if internal:
        raise TypeError(
            f"vmas/{scenario}: {internal} are not options: the env's name gives the scenario (vmas/<scenario>) "
            f"and the scenario's options are keywords of their own (e.g. n_agents=3); the adapter's options "
            f"are {list(OWN_OPTIONS)}"
        )
    taken = sorted(VMAS_ENV_ARGUMENTS.intersection(options))
    if taken:
        raise TypeError(
            f"vmas/{scenario}: {taken} are arguments of vmas.make_env that the adapter sets itself; its options "
            f"are {list(OWN_OPTIONS)}, and every other keyword goes to the scenario"
        )
    own = {k: options.pop(k) for k in OWN_OPTIONS if k in options}
    config = _options.build(
        VmasConfig, {**own, "scenario": scenario, "scenario_kwargs": options}, what=f"env 'vmas/{scenario}'"
    )
    return VmasEnv(config, num_envs=num_envs, device=device, seed=seed, check_values=check_values)


register_prefix("vmas", make_vmas, "scenario")

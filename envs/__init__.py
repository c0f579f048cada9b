"""Batched multi-agent environments that live on the device.

import envs
env = envs.make("navigation", num_envs=1024, device="cuda", seed=0, n_agents=3)
obs = env.reset()
next, obs = env.step(env.sample_actions())

Adapters: `envs.make("vmas/<scenario>", ...)` and `envs.make("pettingzoo/<module>.<env>", ...)` (their
simulators are imported only when such an env is made); `envs.to_pettingzoo(env)` exports any env.

Modules: base (MultiAgentEnv, EnvConfig: step counting, truncation, auto-reset, seeding, output checks),
specs, registry (make, register), options, random (counter-based streams), sync (forbid_host_sync), check
(check_env), compile, cudagraphs, render (frames, GIFs, demos); native/ (the four envs and their physics),
adapters/ (vmas, pettingzoo, export), bench/.
"""

import warnings

# Importing registers the native envs and the adapters' prefixes.
from envs.adapters import pettingzoo, vmas  # noqa: F401
from envs.base import EnvConfig, EnvOutputError, MultiAgentEnv
from envs.check import CheckError, check_env
from envs.native import navigation, speaker_listener, spread, tag  # noqa: F401
from envs.registry import RegistrationError, describe, make, names, register, register_prefix
from envs.specs import Box, Discrete, GroupSpec, MultiDiscrete
from envs.sync import HostSyncError, allow_host_sync, forbid_host_sync

# `python -m envs.native.navigation` (each native env's demo) imports this package, which imports the env's
# module, before running that module as __main__; runpy then warns that the module was already
# imported. The registry expects exactly that (the second definition keeps the registered class), so
# that one warning is noise.
warnings.filterwarnings(
    "ignore",
    message=r"'envs\.native\.\w+' found in sys\.modules after import of package 'envs\.native'",
    category=RuntimeWarning,
)


def to_pettingzoo(env: MultiAgentEnv, index: int = 0):
    """Env `index` of `env`'s batch as a PettingZoo `ParallelEnv`, numpy in and out (see `envs.adapters.export`)."""
    from envs.adapters.export import to_pettingzoo as export

    return export(env, index)


__all__ = [
    "Box",
    "CheckError",
    "Discrete",
    "EnvConfig",
    "EnvOutputError",
    "GroupSpec",
    "HostSyncError",
    "MultiAgentEnv",
    "MultiDiscrete",
    "RegistrationError",
    "allow_host_sync",
    "check_env",
    "describe",
    "forbid_host_sync",
    "make",
    "names",
    "register",
    "register_prefix",
    "to_pettingzoo",
]

"""Batched multi-agent environments that live on the device.

import envs
env = envs.make("navigation", num_envs=1024, device="cuda", seed=0, n_agents=3)
obs = env.reset()
next, obs = env.step(env.sample_actions())
"""

from envs import navigation, speaker_listener, spread, tag  # noqa: F401  (registers the native envs)
from envs.base import EnvConfig, MultiAgentEnv
from envs.check import CheckError, check_env
from envs.registry import describe, make, names, register, register_prefix
from envs.specs import Box, Discrete, GroupSpec, MultiDiscrete
from envs.sync import HostSyncError, forbid_host_sync

__all__ = [
    "Box",
    "CheckError",
    "Discrete",
    "EnvConfig",
    "GroupSpec",
    "HostSyncError",
    "MultiAgentEnv",
    "MultiDiscrete",
    "check_env",
    "describe",
    "forbid_host_sync",
    "make",
    "names",
    "register",
    "register_prefix",
]

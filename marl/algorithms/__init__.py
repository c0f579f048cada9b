"""Algorithms, registered by name (`marl train --algo NAME`): one module each.

- `ppo`: MAPPO and IPPO (one PPO loss; what each group's critic sees is its scope).

`marl.algorithms.base` holds the interface (`Algorithm`) and the registry.
"""

from marl.algorithms import ppo  # noqa: E402, F401  (registers mappo and ippo)
from marl.algorithms.base import DEFAULT, Algorithm, build, config_class, default_config, get, names, register

__all__ = ["DEFAULT", "Algorithm", "build", "config_class", "default_config", "get", "names", "register"]

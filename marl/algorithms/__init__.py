"""Algorithms, registered by name (`marl train --algo NAME`): one module each.

- `ppo`: MAPPO and IPPO (one PPO loss; what each group's critic sees is its scope);
- `ddpg`: MADDPG and IDDPG, `sac`: MASAC and ISAC (off-policy, from a replay buffer: `offpolicy`);
- `qlearning`: IQL, VDN and QMIX (value-based, discrete actions; on the same off-policy base);
- `mixed`: groups of one run on off-policy algorithms of different modules (`--group NAME.algo=...`);
- `ppo_seeds`, `offpolicy_seeds` (MADDPG/IDDPG, MASAC/ISAC, and mixed runs), `qlearning_seeds` (IQL/VDN/QMIX):
  every algorithm for several seeds in one process (`marl train --seeds`, `register_seeded`).

`marl.algorithms.base` holds the interface (`Algorithm`) and the registry.
"""

from marl.algorithms import ddpg, offpolicy_seeds, ppo, ppo_seeds, qlearning, qlearning_seeds, sac  # noqa: E402, F401  (register their algorithms)
from marl.algorithms.base import (
    DEFAULT,
    Algorithm,
    build,
    build_seeded,
    check_seeded,
    config_class,
    default_config,
    get,
    label,
    names,
    register,
    register_seeded,
)

__all__ = [
    "DEFAULT",
    "Algorithm",
    "build",
    "build_seeded",
    "check_seeded",
    "config_class",
    "default_config",
    "get",
    "label",
    "names",
    "register",
    "register_seeded",
]

"""IQL, VDN and QMIX for several seeds in one process (`marl train --algo qmix --seeds 0 1 2`): the off-policy
population (`marl.algorithms.offpolicy_seeds`) with each member's epsilon annealed as its single run's, its
n-step returns read from its own ring, and the clock of the hard target copies, every member's (each takes
the same number of steps), saved with the population and with each member's own checkpoint. A swept `tau`
needs Polyak targets (`--target-update polyak`): hard copies are refused.

Recurrent Q-networks (`--model gru`) as `QLearning`'s: the members' Q-networks act from their envs' states
(`MemberPolicy` with `hidden`, the `[S * B, n, h]` states carried by the collector and saved with the
checkpoints), each member's buffer stores with every step the state it was acted from and `is_init`, each
member draws its chunks of steps of one of its envs from its own generator (`draw_member_chunks`), and the
vmapped loss unrolls each member's nets (Q-network, target, mixers) over its chunks from their stored states.
"""

from __future__ import annotations

from marl.algorithms.base import register_seeded
from marl.algorithms.offpolicy_seeds import SeededOffPolicy
from marl.algorithms.qlearning import QLearning


@register_seeded("qmix", "vdn", "iql")
class SeededQLearning(SeededOffPolicy):
    """`QLearning` for `len(seeds)` members; `generators[k]` is member `k`'s random stream (its exploration
    noise and its buffer's draws), as a single run's. What is Q-learning's own (epsilon, the clock, the n-step
    stride, the chunks) `SeededOffPolicy` takes from the single run, as for a Q-learning group of a mixed run."""

    single = QLearning
    sweep_owner = "Q-learning's"
    recurrent = True  # --model gru: recurrent Q-networks, trained on each member's chunks of steps

"""What every population (`marl train --seeds`, `register_seeded`) shares: its members as single runs built
with their seeds and swept values, their stacked nets (`marl.core.members.Members`), one optimiser per group
over the stacked parameters, and the checkpoint of all of them."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterable
from typing import ClassVar

import torch
from torch import nn

from marl.algorithms.base import Algorithm
from marl.config import TrainConfig, changed_flags, field_names
from marl.core.members import Members


class Seeded(Algorithm):
    """A population of `len(seeds)` members of one algorithm; `generators[k]` is member `k`'s random
    stream, as a single run's. Member `k`'s envs are columns `k * B .. (k + 1) * B` of one `[T, S * B]`
    batch, its parameters slot `k` of tensors stacked on a leading member dim `[S, ...]`. A subclass
    (registered with `marl.algorithms.register_seeded(NAME)`; a worked example:
    `tests/marl/algorithms/reinforce_seeds.py`) provides:

    - `single`: the algorithm each member trains as (its class, or a function of the same arguments that
      builds it, as `marl.algorithms.build` builds a mixed run). Each member is first built as that single
      run with its seed (the global RNG seeded with it), so its initial parameters are that run's;
    - `SWEEPABLE`: the options `--sweep` may give each member, each member's value an `[S]` tensor in
      `self.sweep` (a swept `lr`: `member_lr_step`, as `marl/algorithms/ppo_seeds.py` does);
    - `build(singles)`: set `self.template = singles[0]` (its nets run every member's tensors), stack the
      singles' nets into `self.members = Members([...])` and set `self.optimizers`, one Adam per group over
      `self.stacked(net.parameters())` (Adam is elementwise, so one Adam is `S` runs' Adams);
    - `acting`: `Acting({g: MemberPolicy(self.members, policy)})`, each member acting on its own envs;
    - `update(batch, timer)`: `split(x, S, 1)` turns `[T, S * B, ...]` into `[S, T, B, ...]`, and
      `self.members(fn, *args)` runs `fn`, a function of the template's nets (the single run's loss), for
      every member under `torch.func.vmap` with its own parameters and rows. Backward through the summed
      losses gives each member its own gradient; `clip_members_` clips each by its own norm. Each returned
      term is `[S]`; anything else a single run keeps (a running baseline, a normaliser) is `[S]` too;
    - `member_state_dict(k)`: member `k`'s state as the single run's `state_dict()` (`members.member(k,
      prefix)`; `member_optimizer_state(optimizer, k, self.sweep.get("lr"))`, which with a swept lr puts the
      member's own in its param groups), so `seed_K/checkpoint.pt` works with `marl eval` and `--resume`;
      `state_dict()` holds all members (add your `[S]` state to this class's)."""

    single: ClassVar[Callable[..., Algorithm]]
    SWEEPABLE: ClassVar[tuple[str, ...]] = ()
    recurrent: ClassVar[bool] = False
    """Whether it trains recurrent nets (`--model gru`); `check_seeded` refuses them otherwise."""
    sweep_owner: ClassVar[str] = ""
    """Whose options `SWEEPABLE` are, for the refusal of any other (`PPO's`)."""

    members: Members
    optimizers: dict[str, torch.optim.Optimizer]
    template: Algorithm  # a member's single run, whose nets run every member's tensors (set by `build`)

    def __init__(
        self,
        config: TrainConfig,
        env,
        device: torch.device,
        world,
        generators: list[torch.Generator],
        seeds: tuple[int, ...],
        sweep: dict[str, tuple[float, ...]] | None = None,
    ) -> None:
        super().__init__(config, env, device, world, generators[0])
        self.seeds, self.generators = tuple(seeds), list(generators)
        self.sweep = dict(sweep or {})
        unknown = sorted(set(self.sweep) - set(self.SWEEPABLE))
        if unknown and not self.SWEEPABLE:
            raise ValueError(
                f"--algo {config.algo.algo} takes no --sweep (its population, {type(self).__qualname__}, lists no "
                f"SWEEPABLE options): leave out --sweep {' '.join(unknown)}, or run one population per value"
            )
        if unknown:
            raise ValueError(
                f"--sweep takes {self.sweep_owner} options {', '.join(self.SWEEPABLE)}, not {', '.join(unknown)}"
            )
        overridden = sorted({n for o in config.group_overrides.values() for n in o} & set(self.sweep))
        if overridden:
            raise ValueError(f"--sweep and --group both set {', '.join(overridden)}: sweep it for every group, or none")
        given = changed_flags(config.algo, tuple(n for n in self.sweep if n in field_names(type(config.algo))))
        if given:  # the swept values replace the run's own without a word
            one = len(given) == 1
            raise ValueError(
                f"{', '.join(given)}: --sweep {' '.join(config.run.sweep)} gives each run its own value, so "
                f"{'it' if one else 'they'} would have no effect: leave {'it' if one else 'them'} out, or add "
                f"{'it' if one else 'them'} to the swept values"
            )
        # Each member's learning rate `[S]` when swept (its optimiser's own is then 1: `member_lr_step`).
        self.member_lr = torch.tensor(self.sweep["lr"], device=device) if "lr" in self.sweep else None
        self.check()
        self.build(self.singles())

    def check(self) -> None:
        """Refuse what this population does not train, before any member is built."""

    def build(self, singles: list[Algorithm]) -> None:
        """Stack the `singles` (every member as the single run it trains as, in order) into this population."""
        raise NotImplementedError

    def schedules(self, frames: int, total_frames: int) -> dict[str, float]:
        """The single run's: every member's schedules are its own (none is swept)."""
        return self.template.schedules(frames, total_frames)

    @property
    def count(self) -> int:
        return len(self.seeds)

    def singles(self) -> list[Algorithm]:
        """Every member as the single run (`single`) it trains as: its seed (the init of its networks), its
        generator, its swept values."""
        out = []
        for k, (seed, generator) in enumerate(zip(self.seeds, self.generators)):
            values = {n: v[k] for n, v in self.sweep.items()}
            member = dataclasses.replace(self.config, algo=dataclasses.replace(self.config.algo, **values))
            torch.manual_seed(seed)  # as a single run with this seed seeds the init of its networks
            out.append(self.single(member, self.env, self.device, self.world, generator))
        return out

    def stacked(self, params: Iterable[nn.Parameter]) -> list[nn.Parameter]:
        """The stacked parameters `[S, ...]` of `params`, tensors of the template member's nets (`members.
        template`, the first single run's), in their order."""
        return [self.members.params[name] for name in self.members.names(params)]

    def parameters(self) -> list[torch.Tensor]:
        return list(self.members.params.values())

    def state_dict(self) -> dict:
        return {
            "params": {k: v.detach() for k, v in self.members.params.items()},
            "buffers": dict(self.members.buffers),
            "optimizers": {g: opt.state_dict() for g, opt in self.optimizers.items()},
        }

    def load_state_dict(self, state: dict) -> None:
        with torch.no_grad():
            for source, held in ((state["params"], self.members.params), (state["buffers"], self.members.buffers)):
                for name, tensor in held.items():
                    tensor.copy_(source[name])
        for g, optimizer in self.optimizers.items():
            optimizer.load_state_dict(state["optimizers"][g])


@contextlib.contextmanager
def swept_options(algorithm: Algorithm, values: dict):
    """Within: every learner's config of `algorithm` reads `values` instead of its own (swept options: one
    member's value, a 0-d tensor under vmap; a view, as a config's checks cannot read batched values).
    Traceable: the compiled update step (`marl.optim.update_step` with `members`) enters it."""
    held = {g: lr.algo for g, lr in algorithm.learners.items()}
    try:
        for lr in algorithm.learners.values():
            lr.algo = _Swept(lr.algo, values)
        yield
    finally:
        for g, lr in algorithm.learners.items():
            lr.algo = held[g]


class _Swept:
    """A config's options, `values` read in place of its own (`swept_options`)."""

    def __init__(self, config, values: dict) -> None:
        self._config, self._values = config, values

    def __getattr__(self, name: str):
        values = self.__dict__["_values"]
        return values[name] if name in values else getattr(self.__dict__["_config"], name)

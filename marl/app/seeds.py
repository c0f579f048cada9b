"""What a run of several seeds in one process (`marl train --seeds 0 1 2 3 4`) adds around the run loop:
its checks and memory estimate, its logs, each member's single-seed checkpoint, its summary.

A population's run folder holds:
- `checkpoint.pt`: the whole population (`marl train --resume` continues every member);
- `aggregate.csv`: per iteration and metric, the mean over the members, their standard deviation and a
  95% bootstrap confidence interval of the mean (`NAME`, `NAME_std`, `NAME_ci_low`, `NAME_ci_high`);
- `seed_<s>/` (with `--sweep`: `seed_<s>-lr_0.001-...`): each member as an ordinary run folder, its
  `metrics.csv` and a single-seed `checkpoint.pt` that `marl eval`, `marl plot` and `marl train --resume`
  take as any other run's.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import shutil
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from marl.app.logger import EVAL_PREFIX, RunLogger, last_iteration, read_rows, rows_by_iteration
from marl.app.wandb_logging import wandb_run
from marl.config import Member, TrainConfig
from marl.core.member_replay import MemberReplayBuffer
from marl.core.replay import format_bytes, free_bytes, replay_nbytes
from marl.core.rollout import transition_layout

AGGREGATE = "aggregate.csv"
CONFIDENCE = 0.95
RESAMPLES = 1000
STATS = ("std", "ci_low", "ci_high")  # the aggregate's columns beside each metric's mean: NAME_std, ...


def seeds_text(seeds: Sequence[int], sep: str = ", ") -> str:
    """`0-4` for consecutive seeds, else the seeds joined by `sep`."""
    seeds = list(seeds)
    if len(seeds) > 2 and seeds == list(range(seeds[0], seeds[0] + len(seeds))):
        return f"{seeds[0]}-{seeds[-1]}"
    return sep.join(map(str, seeds))


def members_text(members: Sequence[Member]) -> str:
    """`seeds 0-4`, with a sweep `seeds 0-1 x lr 0.0001, 0.001` (one seed: `seed 3 x lr ...`)."""
    seeds = sorted({m.seed for m in members})
    swept = {name: sorted({v for m in members for k, v in m.values if k == name}) for name, _ in members[0].values}
    return " x ".join(
        [
            f"seed{'s' * (len(seeds) > 1)} {seeds_text(seeds)}",
            *(f"{k} {', '.join(f'{v:g}' for v in vs)}" for k, vs in swept.items()),
        ]
    )


def sweep_values(members: Sequence[Member]) -> dict[str, tuple[float, ...]]:
    """Each swept option's value for every member, in the members' order."""
    return {name: tuple(dict(m.values)[name] for m in members) for name, _ in members[0].values}


def member_dir(run_dir: Path, member: Member) -> Path:
    return Path(run_dir) / member.name


def logs(run_dir: Path, members: Sequence[Member]) -> list[Path]:
    """Every CSV a run of `members` writes."""
    if len(members) == 1:
        return [Path(run_dir) / "metrics.csv"]
    return [Path(run_dir) / AGGREGATE, *(member_dir(run_dir, m) / "metrics.csv" for m in members)]


def logged_rows(run_dir: Path, members: Sequence[Member]) -> list[dict]:
    """The rows a run of `members` logged, as `Trainer.train` returns them (with several seeds, each
    member's row under `members`, paired by iteration: those every member logged): a resumed run's summary
    is of the whole run, not only the rows it trains."""
    if len(members) == 1:
        return read_rows(Path(run_dir) / "metrics.csv")
    logged = [read_rows(member_dir(run_dir, m) / "metrics.csv") for m in members]
    return [{**rows[0], "members": list(rows)} for rows in rows_by_iteration(logged)]


def keep_trained_alone(run_dir: Path, members: Sequence[Member]) -> list[str]:
    """Before a population resumes: a member resumed alone (`marl train --resume RUN/seed_s/checkpoint.pt`,
    which trains on in that member's folder) logged iterations past the population's last, which the
    population's resume drops (`drop_rows_after` its checkpoint's iteration) before it overwrites that
    member's checkpoint. Its folder is copied beside the run folder first, as `RUN-seed_s-alone` (an ordinary
    run: `marl eval`, `marl plot` or `--resume` it), so nothing it trained is lost. Logs are compared by their
    iteration column, not their row counts: a log that lost a row still ends at the iteration it trained to.
    Returns a line per copy, to print."""
    if len(members) == 1:
        return []
    run_dir = Path(run_dir)
    logged = {m.name: last_iteration(member_dir(run_dir, m) / "metrics.csv") for m in members}
    # Without rows in its aggregate.csv (deleted), the population logged as far as its least advanced member
    # that logged any (a member without a log says nothing of where the population stopped).
    population = last_iteration(run_dir / AGGREGATE)
    if population is None:
        population = min((last for last in logged.values() if last is not None), default=None)
    lines = []
    for member in members:
        folder, last = member_dir(run_dir, member), logged[member.name]
        if last is not None and population is not None and last > population:
            copy = _free_name(run_dir.parent / f"{run_dir.name}-{member.name}-alone")
            shutil.copytree(folder, copy)
            lines.append(
                f"{member.name} trained on alone to iteration {last}, past the population's iteration {population}: "
                f"that run is kept in {copy}; the population trains {member.name} on from its own checkpoint"
            )
    return lines


def _free_name(path: Path) -> Path:
    """`path`, or `path-2`, `path-3`, ...: the first that does not exist."""
    number, free = 1, path
    while free.exists():
        number += 1
        free = path.with_name(f"{path.name}-{number}")
    return free


def check_population(config: TrainConfig, world) -> None:
    """Refuse what several seeds in one process do not support, before anything is built (each group's
    algorithm and model: `marl.algorithms.build_seeded`, once the env has named the groups)."""
    if world.size > 1:
        run = config.run
        given = [
            flag
            for flag, on in (("--seeds", run.seeds), ("--num-seeds", run.num_seeds > 1), ("--sweep", run.sweep))
            if on
        ]
        raise ValueError(
            f"{' with '.join(given)} trains {len(run.members())} runs in one process, which torchrun cannot split "
            "over ranks: run them without torchrun, or one run per torchrun job"
        )


def derived_seed(seed: int, purpose: str, iteration: int, bits: int) -> int:
    """A seed of `bits` bits for `purpose` after `iteration` of the run seeded `seed`: a hash of the three, apart
    from the run's own streams, different at each iteration, and the same whenever it is asked again (a
    resumed run's)."""
    digest = hashlib.sha256(f"vecmarl {purpose} {seed} {iteration}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> (64 - bits)


def env_seed(config: TrainConfig, seeds: tuple[int, ...]) -> int | tuple[int, ...]:
    """The seed of a population's `[S * B]` envs: every member's own for a native env (its counter-based
    stream splits by member, `envs.random`), the first member's for an adapter's simulator (VMAS,
    PettingZoo), whose one random stream cannot: its members are then independent runs, each seeded apart
    in its nets and sampling, but their envs are not a single run's with their seed."""
    if "/" not in config.env.env:
        return seeds
    print(
        f"{config.env.env}: one random stream (seeded {seeds[0]}) serves every seed's envs: each member "
        "trains independently, but its envs do not draw as a single run's with its seed"
    )
    return seeds[0]


# ---- memory --------------------------------------------------------------------------------------


def member_nbytes(config: TrainConfig, env, algorithm) -> dict[str, int]:
    """What one member takes, by part: its rollout (every transition and, on-policy, the values, advantages
    and targets computed on it; with recurrent nets the policies' and critics' stored states and `is_init`),
    on-policy the update's per-member copies of the rollout (member-major, then shuffled: two; with
    recurrent nets windows of `burn_in + chunk_length` steps per chunk of `chunk_length`), off-policy its
    replay buffer (prioritized: with its sum tree; with recurrent Q-networks each step's stored state and
    `is_init` too), and its nets with their gradients and Adam's two moments (target nets: the parameters alone)."""
    frames = config.env.num_envs * config.run.rollout_length
    on_policy = algorithm.collects == "rollout"
    acting = algorithm.acting
    layout = transition_layout(env.groups, env.state_spec, on_policy, acting.hidden, acting.episode_starts)
    per_frame = sum(math.prod(shape) * torch.empty((), dtype=dtype).element_size() for shape, dtype in layout.values())
    # A trained tensor, its gradient and Adam's two moments: 4 copies; a target net's (no gradient): 1.
    nets = sum((4 if p.requires_grad else 1) * p.numel() * p.element_size() for p in algorithm.parameters())
    nets //= algorithm.count
    if not on_policy:  # its replay buffer, the rollout it is extended from, and its nets
        capacity, prioritized = algorithm.replay()
        replay = replay_nbytes(env.groups, capacity, env.state_spec, prioritized is not None, hidden=acting.hidden)
        return {"rollout": frames * per_frame, "replay buffer": replay, "nets and Adam": nets}
    per_frame += sum(3 * 4 * spec.n_agents for spec in env.groups.values())  # value, advantage, target
    critic_hidden = algorithm.env_state_dict().get("critic_hidden", {})  # per env [S * B, m, h]
    per_frame += sum(4 * math.prod(h.shape[1:]) for h in critic_hidden.values())  # each step's, stored
    windows = 1.0
    if getattr(algorithm, "sequences", False):
        windows = (config.algo.burn_in + config.algo.chunk_length) / config.algo.chunk_length
    update = int(2 * frames * per_frame * windows)
    return {"rollout": frames * per_frame, "update": update, "nets and Adam": nets}


def check_memory(config: TrainConfig, env, device: torch.device, algorithm, free: int | None = None) -> None:
    """Print what the members take; refuse, saying how many seeds fit, when it exceeds the memory free on
    `device` (before the rollout is allocated)."""
    parts = member_nbytes(config, env, algorithm)
    each, count = sum(parts.values()), algorithm.count
    free = free_bytes(device) if free is None else free
    split = ", ".join(f"{name} {format_bytes(n)}" for name, n in parts.items())
    where = "unknown" if free is None else format_bytes(free)
    print(
        f"{members_text(config.run.members())}: {count} runs in one process, {format_bytes(each)} each ({split}): "
        f"{format_bytes(each * count)} of {where} free on {device}"
    )
    if free is not None and each * count > free:
        fit = int(free // max(each, 1))
        smaller = "fewer --num-envs or a shorter --rollout-length"
        if "replay buffer" in parts:  # off-policy: the buffer is most of a member, sized by --buffer-size
            smaller = f"a smaller --buffer-size, {smaller}"
        raise MemoryError(
            f"{count} runs need {format_bytes(each * count)} ({format_bytes(each)} each) but "
            f"{format_bytes(free)} is free on {device}: {fit_text(config.run.members(), fit)}"
            + (f"; or pass {smaller}" if fit else f": pass {smaller}")
        )


def fit_text(members: Sequence[Member], fit: int) -> str:
    """How to train `members` when only `fit` of them fit in memory: whole seeds (each with every swept
    setting) in this process, the others in another."""
    seeds = list(dict.fromkeys(m.seed for m in members))
    settings = len(members) // len(seeds)  # each seed trains every combination of the swept values
    if fit == 0:
        return "not one run fits"
    if fit < settings:
        return f"at most {fit} run(s) fit, fewer than one seed's {settings} swept settings: sweep fewer values"
    keep = seeds[: fit // settings]
    per_seed = f" ({settings} swept settings each)" if settings > 1 else ""
    return (
        f"at most {len(keep)} seed(s){per_seed} fit: pass --seeds {' '.join(map(str, keep))} and train the others "
        f"({seeds_text(seeds[len(keep) :])}) in another process"
    )


# ---- members as single runs ----------------------------------------------------------------------


def member_config(config: TrainConfig, member: Member) -> TrainConfig:
    """The config of the single run a member trains as: its seed, its swept values."""
    run = dataclasses.replace(config.run, seed=member.seed, seeds=(), num_seeds=1, sweep=())
    return dataclasses.replace(config, run=run, algo=dataclasses.replace(config.algo, **dict(member.values)))


def member_state(trainer, state: dict, k: int) -> dict:
    """Member `k`'s checkpoint, as a single run with its seed writes it, from the population's `state`
    (`Trainer.state_dict()`): its slot of every stacked tensor, its block of the envs."""
    count, num_envs = len(trainer.members), trainer.config.env.num_envs
    rows = slice(k * num_envs, (k + 1) * num_envs)

    def envs_rows(value):
        if isinstance(value, dict):
            return {name: envs_rows(v) for name, v in value.items()}
        if isinstance(value, torch.Tensor) and value.dim() and value.shape[0] == count * num_envs:
            return value[rows].clone()
        return value

    env, unsaved = state["env"], state.get("env_unsaved")
    if env is not None and not isinstance(trainer.env_seed, tuple):
        # An adapter's simulator (VMAS) draws every member's envs from one stream: no member's alone.
        env, unsaved = None, f"{trainer.env.name}: the population's envs drew from one random stream, not this member's"
    if env is not None:
        rng = {"key": env["rng"]["key"][k].clone(), "counter": env["rng"]["counter"].clone()}
        env = {**env, "tensors": envs_rows(env["tensors"]), "rng": rng, "seed": trainer.seeds[k]}
    stats = state["stats"]
    sums = {"return_sum": {g: v[k].clone() for g, v in stats["return_sum"].items()}}
    sums.update({name: stats[name][k].clone() for name in ("length_sum", "episodes")})
    return {
        **state,
        "config": member_config(trainer.config, trainer.members[k]).to_dict(),
        "algorithm": trainer.algorithm.member_state_dict(k),
        "generator": state["generator"][k],
        "env": env,
        "env_unsaved": unsaved,
        "obs": envs_rows(state["obs"]),
        "hidden": envs_rows(state["hidden"]),
        "algorithm_envs": envs_rows(state["algorithm_envs"]),
        "stats": {"running": envs_rows(stats["running"]), "length": envs_rows(stats["length"]), **sums},
        "buffer": MemberReplayBuffer.member_state_dict(state["buffer"], k) if state["buffer"] is not None else None,
        "pending": None,
    }


# ---- logs ------------------------------------------------------------------------------------------


def bootstrap_ci(values: Sequence[float], confidence: float = CONFIDENCE, resamples: int = RESAMPLES) -> tuple:
    """The mean of `values` (NaNs left out), their standard deviation, and a percentile bootstrap
    confidence interval of the mean: `(mean, std, low, high)`; NaN where no value is finite."""
    finite = np.array([v for v in values if math.isfinite(v)], dtype=np.float64)
    if finite.size == 0:
        return (math.nan,) * 4
    mean = float(finite.mean())
    std = float(finite.std(ddof=1)) if finite.size > 1 else 0.0
    # A fixed stream: the same members give the same interval in every run and on resume.
    draws = np.random.default_rng(0).integers(0, finite.size, size=(resamples, finite.size))
    means = finite[draws].mean(1)
    tail = (1 - confidence) / 2 * 100
    low, high = np.percentile(means, [tail, 100 - tail])
    return mean, std, float(low), float(high)


def aggregate_row(row: dict) -> dict[str, float]:
    """An iteration's population row (`Trainer.train_iteration`: `members`, one metrics dict per member)
    as the aggregate's: the shared columns, then every metric's mean, std and confidence interval."""
    members = row["members"]
    out = {k: v for k, v in row.items() if k != "members"}
    for name in members[0]:
        mean, *stats = bootstrap_ci([m[name] for m in members])
        out[name] = mean
        out.update({f"{name}_{stat}": value for stat, value in zip(STATS, stats)})
    return out


class PopulationLogger:
    """Each member's row to its own `seed_<s>/metrics.csv` (and with --wandb its own W&B run, all in one group
    named after the run); the aggregate to `aggregate.csv` (and TensorBoard), with the progress bar."""

    def __init__(
        self, run_dir: Path, members: Sequence[Member], total_frames: int, config: TrainConfig, start_frames: int
    ) -> None:
        run = config.run
        group = run.wandb_name or Path(run_dir).name
        self.members = [
            RunLogger(
                member_dir(run_dir, m),
                total_frames,
                start_frames,
                progress=False,
                tensorboard=False,
                wandb=wandb_run(run, f"{group}/{m.name}", group, member_config(config, m).to_dict()),
            )
            for m in members
        ]
        self.aggregate = RunLogger(
            run_dir, total_frames, start_frames, run.progress, run.tensorboard, csv_name=AGGREGATE
        )

    def log(self, row: dict) -> None:
        # The aggregate's row first: a run stopped between the writes leaves no member's log past the
        # aggregate's, which its resume would take for a member trained on alone (`keep_trained_alone`).
        self.aggregate.log(aggregate_row(row))
        shared = {k: v for k, v in row.items() if k != "members"}
        for logger, member in zip(self.members, row["members"]):
            logger.log({**shared, **member})

    def close(self, exit_code: int = 0) -> None:
        for logger in (*self.members, self.aggregate):
            logger.close(exit_code)


# ---- summary ----------------------------------------------------------------------------------------


def final_return(rows: list[dict], key: str) -> float:
    """A run's final return: its mean over the last tenth of the iterations where an episode ended (as the
    single run's summary), NaN when none did."""
    tail = max(1, len(rows) // 10)
    recent = [r[key] for r in rows[-tail:] if math.isfinite(r.get(key, math.nan))]
    if not recent:
        recent = [r[key] for r in rows if math.isfinite(r.get(key, math.nan))][-tail:]
    return sum(recent) / len(recent) if recent else math.nan


def print_summary(trainer, rows: list[dict]) -> None:
    """The end of a population's run: per group the members' final returns, their mean and its 95% CI over
    the seeds; with a sweep, per combination of values, ranked by its mean."""
    if not rows:
        print("nothing to train: the run already reached total_frames")
        return
    last, members = rows[-1], trainer.members
    lines = [
        "",
        f"run            {trainer.run_dir}",
        f"env            {trainer.config.env.env}  ({len(members)} runs x {trainer.config.env.num_envs} envs "
        f"on {trainer.device}: {members_text(members)})",
        f"frames         {int(last['frames']):,} per run in {last['time_s']:.1f} s "
        f"({len(members) * last['frames'] / max(last['time_s'], 1e-9):,.0f} frames/s, all runs)",
        f"iterations     {int(last['iteration'])}",
    ]
    for g in trainer.env.groups:
        key = f"{g}/episode_return"
        finals = [final_return([{**r, **r["members"][k]} for r in rows], key) for k in range(len(members))]
        if not any(math.isfinite(value) for value in finals):  # as the single run's summary says it, not "nan"
            lines.append(f"{g:<14} final return: no episode ended in the {len(rows)} iteration(s)")
            continue
        lines += _ranked(g, members, finals, "final return")
    evaluated = [r for r in rows if math.isfinite(r["members"][0].get(f"{EVAL_PREFIX}episodes", math.nan))]
    if evaluated:  # --eval-every: the last evaluation's, per group
        last_eval = evaluated[-1]
        at = f"eval return at iteration {int(last_eval['iteration'])}"
        for g in trainer.env.groups:
            values = [member[f"{EVAL_PREFIX}{g}/episode_return"] for member in last_eval["members"]]
            lines += _ranked(f"eval {g}", members, values, at)
    first = member_dir(trainer.run_dir, members[0])
    lines += [
        f"checkpoint     {trainer.checkpoint_path} (all runs); one run's: {first / 'checkpoint.pt'}",
        f"next           marl eval --checkpoint {first / 'checkpoint.pt'}",
        f"               marl plot {trainer.run_dir}",
    ]
    print("\n".join(lines))


def _ranked(label: str, members: Sequence[Member], values: list[float], what: str) -> list[str]:
    """`label`'s lines of the summary: the members' `values` (`what`) over the seeds, with a sweep per combination
    of values, ranked by its mean."""
    by_values: dict[tuple, list[tuple[int, float]]] = {}
    for member, value in zip(members, values):
        by_values.setdefault(member.values, []).append((member.seed, value))
    ranked = sorted(by_values.items(), key=lambda item: -_nan_low(bootstrap_ci([v for _, v in item[1]])[0]))
    lines = []
    for rank, (swept_values, runs) in enumerate(ranked, 1):
        swept = " ".join(f"{k}={v:g}" for k, v in swept_values)
        head = f"{label:<14}" if rank == 1 else " " * 14
        lines.append(f"{head} {f'#{rank} {swept}: ' if swept_values else ''}{what} {_over_seeds(runs)}")
    return lines


def _over_seeds(runs: list[tuple[int, float]]) -> str:
    """The mean of the final returns of `runs` (seed, return) with its 95% CI, each seed's after; of one seed,
    its return alone: a CI of one run, of zero width, would mean nothing (as `marl eval --member all` says it)."""
    if len(runs) == 1:
        return f"{runs[0][1]:.4f} (seed {runs[0][0]})"
    mean, std, low, high = bootstrap_ci([v for _, v in runs])
    each = ", ".join(f"{v:.3f}" for _, v in runs)
    return (
        f"{mean:.4f} (95% CI {low:.4f} to {high:.4f}, std {std:.4f}) over seeds {seeds_text([s for s, _ in runs])}: "
        f"{each}"
    )


def _nan_low(value: float) -> float:
    return value if math.isfinite(value) else -math.inf

"""Evaluate a checkpoint (`marl eval`): mean episode return per group, and an optional GIF of one episode; and
the evaluation during training (`marl train --eval-every`, `TrainingEvaluation`)."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Sequence
from pathlib import Path

import torch

from envs.base import canonical_device
from marl.app import seeds
from marl.app.build import build_algorithm, make_env, resolve_device
from marl.app.checkpoint import load_algorithm_state, load_checkpoint
from marl.app.distributed import World
from marl.app.logger import EVAL_PREFIX
from marl.app.paths import check_output_file
from marl.config import TrainConfig, check_seed
from marl.core.episodes import Actor, first_episodes
from marl.core.rollout import Acting


@torch.no_grad()
def evaluate(
    checkpoint: str,
    episodes: int = 100,
    render: str | None = None,
    device: str = "auto",
    num_envs: int | None = None,
    seed: int = 12345,
    deterministic: bool = True,
    member: int | str | None = None,
) -> dict:
    """Run `episodes` full episodes with the checkpoint's policies (their mode when `deterministic`).

    Every env contributes its first episode only, so short episodes are not over-counted; with more
    episodes than `num_envs` (default min(episodes, 256)) the envs run in rounds with fresh seeds.
    `render`: write env 0's first episode to this GIF path, from its first state to the one its last action
    reached (episode length + 1 frames); the envs are then made to draw (`envs.make(..., render=True)`: a
    PettingZoo env trained without render_mode='rgb_array' gets it), which changes no episode. A checkpoint
    of several seeds (`marl train --seeds`) evaluates its `member` (a seed, or with a sweep the member's name,
    `seed_0-lr_0.001`), from that member's own checkpoint in the run folder.
    """
    if episodes < 1:
        raise ValueError(f"episodes must be >= 1, got {episodes}")
    check_seed(seed)
    if num_envs is not None and num_envs < 1:
        raise ValueError(f"num_envs must be >= 1 (or left out: min(episodes, 256)), got {num_envs}")
    if num_envs is not None and num_envs > episodes:  # each env runs one episode a round: the others would idle
        raise ValueError(
            f"--num-envs {num_envs} with --episodes {episodes}: each env runs one episode at a time, so at most "
            f"{episodes} run: pass --num-envs {episodes} or less, or more --episodes"
        )
    if render:
        check_render_path(render)  # now, not after the whole evaluation
    device = canonical_device(resolve_device(device))  # an argument: checked before the checkpoint is read
    state = load_checkpoint(checkpoint)
    config = TrainConfig.from_dict(state["config"])
    trained = config.run.members()
    if len(trained) > 1 or member is not None:
        chosen = [m for m in trained if str(member) in (m.name, str(m.seed))]
        if len(chosen) > 1:  # a seed of a sweep: one member per setting
            raise ValueError(
                f"seed {member} of {checkpoint} trained {len(chosen)} swept settings: pass --member with one's "
                f"name ({', '.join(m.name for m in chosen)}), or --member all for every member"
            )
        if len(chosen) != 1:
            own = f" (or its own checkpoint, {seeds.member_dir(Path(checkpoint).parent, trained[0])}/checkpoint.pt)"
            names = ", ".join(m.name for m in trained)
            asked = "" if member is None else f"--member {member!r} is none of them: "
            raise ValueError(
                f"{checkpoint} holds {seeds.members_text(trained)} ({names}): {asked}pass --member SEED or NAME, one of "
                f"them, to evaluate one" + (own + ", or --member all for every one" if len(trained) > 1 else "")
            )
        if len(trained) > 1:
            state = load_checkpoint(seeds.member_dir(Path(checkpoint).parent, chosen[0]) / "checkpoint.pt")
            config = TrainConfig.from_dict(state["config"])
    batch = num_envs if num_envs is not None else min(episodes, 256)
    returns: dict[str, list[float]] = {}
    lengths: list[float] = []
    frames: list = []
    generator = torch.Generator(device).manual_seed(seed)
    round_index = 0
    acting = None  # built once: the policies depend on the env's groups, not on how many envs a round runs
    while len(lengths) < episodes:
        k = min(batch, episodes - len(lengths))
        # Round r's envs from seed + r * batch: an adapter's copy i takes seed + i (PettingZoo), so with seed + r
        # each round would run all but one of the previous round's episodes again.
        # Made to draw where an env must be asked (a PettingZoo env's render_mode): the episodes are the same.
        try:
            env = make_env(config, device, num_envs=k, seed=seed + round_index * batch, render=bool(render))
            if render and not env.renders:
                env.render(0)  # raises NotImplementedError with the env's own reason, e.g. what VMAS needs to draw
                raise NotImplementedError(f"{config.env.env} does not render")
        except NotImplementedError as error:
            if not render:
                raise
            raise ValueError(f"{error}: run marl eval without --render") from error
        if acting is None:
            algorithm = build_algorithm(config, env, device, World(), generator)
            load_algorithm_state(algorithm, state["algorithm"], algorithm.label(config, env.groups))
            acting = algorithm.acting
        actor = Actor(acting, env.groups, k, device, deterministic=deterministic, generator=generator)
        obs = env.reset_data()
        recording = render and round_index == 0
        if recording:
            frames.append(env.render(0))
        played = first_episodes(env, actor, obs, frames=frames if recording else None)
        for g in env.groups:
            returns.setdefault(g, []).extend(played.returns[g].tolist())
        lengths.extend(played.length.tolist())
        round_index += 1
    if render:
        from envs.render import save_gif

        save_gif(frames, render)
    summary = {g: {"mean": _mean(v), "std": _std(v)} for g, v in returns.items()}
    return {"returns": summary, "episodes": len(lengths), "episode_length": _mean(lengths)}


def check_render_path(render: str) -> None:
    """Refuse a `--render` path that the GIF could not be written to: a missing folder, a folder, or a
    name whose extension Pillow cannot write an animation in (it would say only "unknown file extension")."""
    from PIL import Image

    check_output_file(render, f"cannot write {render}", example="episode.gif")
    path = Path(render)
    Image.init()
    if Image.registered_extensions().get(path.suffix.lower()) not in Image.SAVE_ALL:
        raise ValueError(f"cannot write {render}: --render writes an animated GIF, so give a name ending in .gif")


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def _std(values: list[float]) -> float:
    mean = _mean(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / max(len(values) - 1, 1))


# ---- the evaluation during training ----------------------------------------------------------------------


def eval_columns(groups: Sequence[str]) -> list[str]:
    """The columns `TrainingEvaluation.run` fills, in order."""
    return [
        *(f"{EVAL_PREFIX}{g}/episode_return" for g in groups),
        f"{EVAL_PREFIX}episode_return",
        f"{EVAL_PREFIX}episode_length",
        f"{EVAL_PREFIX}episodes",
    ]


def eval_seed(seed: int, iteration: int) -> int:
    """The env seed of the evaluation after `iteration` of the run seeded `seed`: a hash of both, so that it
    is apart from training's streams (`seed`, `seed + 1`), differs from one evaluation to the next, and is
    the same for a resumed run. Below 2**62: the ranks' offsets and PettingZoo's per-copy ones stay valid."""
    return seeds.derived_seed(seed, "eval", iteration, bits=62)


class TrainingEvaluation:
    """`marl train --eval-every`: the acting policies' mode, on an env batch of its own (built once, with the
    run's env settings), `eval_episodes` envs per member, each env's first episode. Each evaluation re-seeds
    those envs from the members' seeds and the iteration (`eval_seed`), so it depends only on the policies and
    the iteration: training is not touched (nor torch's global generators), and a resumed run evaluates as an
    uninterrupted one. Under torchrun each rank plays its own episodes (seeded per rank, as its training envs)
    and `run` pools every rank's: one all-reduce. `run` reads nothing on the host where the env has a time
    limit (`marl.core.episodes.first_episodes`)."""

    def __init__(self, config: TrainConfig, acting: Acting, seeds: Sequence[int], device: torch.device, world) -> None:
        self.seeds, self.world, self.device = tuple(seeds), world, device
        self.episodes = config.run.eval_episodes
        # An adapter's simulator has one random stream for the whole batch (`marl.app.seeds.env_seed`).
        self.one_stream = "/" in config.env.env
        num_envs = len(self.seeds) * self.episodes
        with own_random_state(device):
            self.env = make_env(config, device, num_envs=num_envs, seed=self.env_seed(0))
        if EVAL_PREFIX.rstrip("/") in self.env.groups:  # its columns would be the evaluation's
            raise ValueError(
                f"{config.env.env} has a group named {EVAL_PREFIX.rstrip('/')!r}, whose metrics.csv columns "
                f"({EVAL_PREFIX}episode_return, ...) would be --eval-every's: rename it with an explicit group_map "
                "(EnvSettings(group_map={'name': [agents]})), or train without --eval-every"
            )
        self.actor = Actor(acting, self.env.groups, num_envs, device)
        self.columns = eval_columns(list(self.env.groups))

    def env_seed(self, iteration: int) -> int | tuple[int, ...]:
        """The eval envs' seed after `iteration`: each member's own, or one for an adapter's envs."""
        own = [self.world.seed(eval_seed(seed, iteration)) for seed in self.seeds]
        return own[0] if len(own) == 1 or self.one_stream else tuple(own)

    @torch.no_grad()
    def run(self, iteration: int) -> dict[str, torch.Tensor]:
        """The evaluation after `iteration`: `{column: value}` (`eval_columns`), device tensors, each `[S]` (one
        value per member) with several seeds, else 0-d."""
        members = len(self.seeds)
        with own_random_state(self.device):
            obs = self.env.reset_data(seed=self.env_seed(iteration))
            self.actor.reset()
            played = first_episodes(self.env, self.actor, obs)
        finished = played.finished.float().view(members, -1)  # [S, K]
        parts = [finished, played.length.view(members, -1), *(r.view(members, -1) for r in played.returns.values())]
        sums = self.world.sum(torch.stack([(part * finished).sum(-1) for part in parts]))  # [2 + groups, S]
        count, length, returns = sums[0], sums[1], sums[2:] / sums[0]
        values = [*returns, returns.mean(0), length / count, count]
        return {name: value if members > 1 else value[0] for name, value in zip(self.columns, values)}


@contextlib.contextmanager
def own_random_state(device: torch.device) -> Iterator[None]:
    """torch's global generators (the CPU's, and `device`'s) as they were before: an env may draw from them
    (as VMAS's scenarios do), and the evaluation must not change what training draws."""
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        yield

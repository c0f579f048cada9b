"""Evaluate a checkpoint: mean episode return per group, and an optional GIF of one episode."""

from __future__ import annotations

import math
from pathlib import Path

import torch

from envs.base import canonical_device
from marl.app import seeds
from marl.app.build import build_algorithm, make_env, resolve_device
from marl.app.checkpoint import load_algorithm_state, load_checkpoint
from marl.app.distributed import World
from marl.app.paths import check_output_file
from marl.config import TrainConfig, check_seed
from marl.core.distributions import draw_noise
from marl.core.rollout import recurrent_output


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
    reached (episode length + 1 frames). A checkpoint of several seeds (`marl train
    --seeds`) evaluates its `member` (a seed, or with a sweep the member's name, `seed_0-lr_0.001`), from
    that member's own checkpoint in the run folder.
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
    frames = []
    generator = torch.Generator(device).manual_seed(seed)
    round_index = 0
    policies = None  # built once: they depend on the env's groups, not on how many envs a round runs
    while len(lengths) < episodes:
        k = min(batch, episodes - len(lengths))
        env = make_env(config, device, num_envs=k, seed=seed + round_index)
        if render and not env.renders:
            try:
                env.render(0)
                reason = f"{config.env.env} does not render"
            except NotImplementedError as error:  # the env's own reason, e.g. how to make a PettingZoo env render
                reason = str(error)
            raise ValueError(f"{reason}: run marl eval without --render")
        if policies is None:
            algorithm = build_algorithm(config, env, device, World(), generator)
            load_algorithm_state(algorithm, state["algorithm"], algorithm.label(config, env.groups))
            policies, hidden_shapes = algorithm.acting.policies, algorithm.acting.hidden
        obs = env.reset()
        # Recurrent policies act from their state, zero at each episode's start.
        hidden = {g: torch.zeros(k, *shape, device=device) for g, shape in hidden_shapes.items()}
        running = {g: torch.zeros(k, s.n_agents, device=device) for g, s in env.groups.items()}
        finished = torch.zeros(k, dtype=torch.bool, device=device)
        final = {g: torch.zeros(k, device=device) for g in env.groups}
        length = torch.zeros(k, device=device)
        if render and round_index == 0:
            frames.append(env.render(0))
        while not bool(finished.all()):
            # Until env 0's first episode ends, the step leaves done envs to be reset here, after env 0's
            # frame: the auto-reset would draw the next episode's first state over its last one.
            recording = render and round_index == 0 and not bool(finished[0])
            actions = {}
            for g, policy in policies.items():
                if g in hidden:
                    out = policy(obs[g, "observation"], obs.get((g, "action_mask"), None), hidden[g])
                    dist, hidden[g] = recurrent_output(g, out, hidden[g])
                else:
                    dist = policy(obs[g, "observation"], obs.get((g, "action_mask"), None))
                if deterministic:
                    if not callable(getattr(dist, "mode", None)):
                        raise TypeError(
                            f"group {g!r}: the acting policy returned a {type(dist).__name__}, which has no mode() to "
                            "act with (as marl.core.distributions' do): define mode(), or pass --stochastic to sample"
                        )
                    raw = dist.mode()
                else:
                    raw = dist.sample(draw_noise(env.groups[g].action, (k, env.groups[g].n_agents), generator, device))
                actions[g] = dist.env_action(raw)
            next_td, obs = env.step(actions, auto_reset=not recording)
            if recording:
                frames.append(env.render(0))
                obs = env.reset(mask=next_td["done"][:, 0])
            for g, h in hidden.items():
                hidden[g] = h.masked_fill(next_td["done"][:, 0, None, None], 0.0)
            done = next_td["done"][:, 0] & ~finished
            for g in env.groups:
                running[g] += next_td[g, "reward"][..., 0]
                final[g] = torch.where(done, running[g].mean(-1), final[g])
            length = torch.where(finished, length, length + 1)
            finished |= done
        for g in env.groups:
            returns.setdefault(g, []).extend(final[g].tolist())
        lengths.extend(length.tolist())
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

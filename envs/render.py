"""A tiny rasteriser for 2-D particle envs (discs and rings on a white canvas, no display needed), and
`play` with `demo_parser`, the loop and command line of the envs' demos: run a scripted policy, score
it, record it as a GIF."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np
import torch

PALETTE = np.array(
    [
        (55, 126, 184),
        (255, 127, 0),
        (77, 175, 74),
        (247, 129, 191),
        (152, 78, 163),
        (228, 26, 28),
        (222, 222, 0),
        (166, 86, 40),
    ],
    dtype=np.uint8,
)


def colour(i: int) -> np.ndarray:
    return PALETTE[i % len(PALETTE)]


class Canvas:
    """An RGB image of the square `[-half_width, half_width]^2` of the world."""

    def __init__(self, half_width: float, size: int = 320) -> None:
        self.half_width = float(half_width)
        self.size = size
        self.image = np.full((size, size, 3), 255, dtype=np.uint8)
        # Pixel centres in world coordinates; y grows upwards in the world, downwards in the image.
        coords = (np.arange(size) + 0.5) / size * 2 * self.half_width - self.half_width
        self._x = coords[None, :]
        self._y = coords[::-1, None]

    def disc(self, centre, radius: float, rgb, ring: float | None = None) -> None:
        """Fill a disc (or draw a ring of width `ring`) of world `radius` at world `centre`."""
        distance = np.sqrt((self._x - float(centre[0])) ** 2 + (self._y - float(centre[1])) ** 2)
        inside = distance <= radius
        if ring is not None:
            inside &= distance >= radius - ring
        self.image[inside] = rgb

    def line(self, start, end, rgb, width: float) -> None:
        start, end = np.asarray(start, dtype=float), np.asarray(end, dtype=float)
        direction = end - start
        length_sq = max(float(direction @ direction), 1e-12)
        t = np.clip(((self._x - start[0]) * direction[0] + (self._y - start[1]) * direction[1]) / length_sq, 0, 1)
        distance = np.sqrt((self._x - start[0] - t * direction[0]) ** 2 + (self._y - start[1] - t * direction[1]) ** 2)
        self.image[distance <= width / 2] = rgb

    def border(self, half_width: float, rgb=(120, 120, 120), width: float = 0.01) -> None:
        """Outline the square `[-half_width, half_width]^2`."""
        corners = [
            (-half_width, -half_width),
            (half_width, -half_width),
            (half_width, half_width),
            (-half_width, half_width),
        ]
        for a, b in zip(corners, corners[1:] + corners[:1]):
            self.line(a, b, rgb, width)


def lighter(rgb, amount: float = 0.55) -> np.ndarray:
    rgb = np.asarray(rgb, dtype=float)
    return (rgb + (255 - rgb) * amount).astype(np.uint8)


def save_gif(frames: list[np.ndarray], path: str, fps: int = 10) -> None:
    """Write RGB frames `[H, W, 3]` uint8 as an animated GIF."""
    from PIL import Image

    images = [Image.fromarray(frame) for frame in frames]
    images[0].save(path, save_all=True, append_images=images[1:], duration=int(1000 / fps), loop=0)


def demo_parser(description: str) -> argparse.ArgumentParser:
    """The command line of an env's `__main__` demo: `--num-envs`, `--steps`, `--gif`; add the env's own."""
    # Run as `python -m envs.native.NAME`: the usage line says that, not the file's name.
    spec = getattr(sys.modules["__main__"], "__spec__", None)
    prog = f"python -m {spec.name}" if spec is not None and spec.name.startswith("envs.") else None
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--num-envs", type=_positive_int, default=256, help="envs stepped as one batch")
    parser.add_argument("--steps", type=_positive_int, default=100, help="steps to run")
    parser.add_argument(
        "--gif", type=_gif_path, default=None, help="write env 0 as an animated GIF to this path (ending in .gif)"
    )
    parser.add_argument(
        "--policy",
        choices=("scripted", "random"),
        default="scripted",
        help="the env's scripted controller, or uniformly random actions (the two yardsticks of training)",
    )
    return parser


def demo_env(parser: argparse.ArgumentParser, build: Callable[[], object]):
    """`build()`, the demo's env from its options; an option the env refuses (`--n-agents 0`) is a usage
    error in one line, as argparse's own, not a traceback."""
    try:
        return build()
    except (ValueError, TypeError) as error:
        parser.error(str(error))


def _positive_int(text: str) -> int:
    """An argparse type: `--steps 0` would write an empty GIF (a bare IndexError) and `--steps -3` run nothing."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive int, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive int, got {value}")
    return value


def _gif_path(text: str) -> str:
    """An argparse type: a GIF's path, refused before the steps run, after which a missing folder or another
    extension failed with Pillow's traceback."""
    path = Path(text)
    if path.suffix.lower() != ".gif":
        raise argparse.ArgumentTypeError(f"expected a path ending in .gif, got {text!r}")
    if not path.parent.is_dir():
        raise argparse.ArgumentTypeError(f"cannot write {text}: the folder {path.parent} does not exist")
    return text


def demo_policy(env, policy: str, scripted: Callable[[object], Mapping[str, torch.Tensor]]):
    """`scripted`, or random actions from a seeded generator when `policy == "random"`."""
    if policy == "scripted":
        return scripted
    generator = torch.Generator(env.device).manual_seed(0)
    return lambda obs: env.sample_actions(generator, obs=obs)


def play(
    env,
    policy: Callable[[object], Mapping[str, torch.Tensor]],
    steps: int,
    *,
    gif: str | None = None,
    fps: int = 10,
) -> dict[str, float]:
    """Run `policy` (obs TensorDict -> `{group: action}`) on `env` for `steps` steps from a reset.

    Returns each group's mean episode return per agent over the episodes that finished (NaN when none
    did), read back once at the end. With `gif`, env 0's frames are written there: each of its episodes
    from its first state to the one its last action reached.
    """
    obs = env.reset()
    running = {g: torch.zeros(env.num_envs, device=env.device) for g in env.groups}  # [B] return so far
    total = {g: torch.zeros((), device=env.device) for g in env.groups}
    finished = torch.zeros((), device=env.device)
    frames = [env.render(0)] if gif else []
    for t in range(steps):
        # Recording, the step leaves done envs to be reset here, after env 0's frame: the auto-reset would
        # draw the next episode's first state over the last one (the same draws either way).
        next_td, obs = env.step(policy(obs), auto_reset=not gif)
        done = next_td["done"][:, 0]
        if gif:
            frames.append(env.render(0))
            obs = env.reset(mask=done)
            if t + 1 < steps and bool(done[0]):  # env 0's next episode starts from the reset's state
                frames.append(env.render(0))
        finished += done.sum()
        for g in env.groups:
            running[g] += next_td[g, "reward"][..., 0].mean(-1)
            total[g] += torch.where(done, running[g], 0.0).sum()
            running[g] = torch.where(done, 0.0, running[g])
    if gif:
        save_gif(frames, gif, fps)
    count = finished.item()  # read back once
    if count == 0:
        print(
            f"note: no episode ended in {steps} steps (episodes last up to {env.config.max_steps}); "
            f"so no return to report (nan): run --steps {env.config.max_steps} or more",
            file=sys.stderr,
        )
    return {g: (total[g] / count).item() if count > 0 else float("nan") for g in env.groups}

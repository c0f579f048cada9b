"""The readable summary printed at the end of `marl train`."""

from __future__ import annotations

import math

from envs.registry import render_options
from marl.app.logger import EVAL_PREFIX


def print_summary(trainer, rows: list[dict[str, float]]) -> None:
    if not rows:
        print("nothing to train: the run already reached total_frames")
        return
    last = rows[-1]
    groups = list(trainer.env.groups)
    tail = max(1, len(rows) // 10)  # the last tenth of the run, for a steadier figure

    lines = [
        "",
        f"run            {trainer.run_dir}",
        f"env            {trainer.config.env.env}  ({trainer.config.env.num_envs} envs on {trainer.device}"
        + (f", on each of {trainer.world.size} ranks)" if trainer.world.size > 1 else ")"),
        f"frames         {int(last['frames']):,} in {last['time_s']:.1f} s "
        f"({last['frames'] / max(last['time_s'], 1e-9):,.0f} frames/s)",
        f"iterations     {int(last['iteration'])}",
    ]
    for g in groups:
        lines.append(f"{g:<14} {return_text(rows, f'{g}/episode_return', tail)}")
    evaluated = [r for r in rows if math.isfinite(r.get(f"{EVAL_PREFIX}episodes", math.nan))]
    if evaluated:  # --eval-every: the last evaluation's
        last_eval = evaluated[-1]
        returns = ", ".join(f"{g} {last_eval[f'{EVAL_PREFIX}{g}/episode_return']:.4f}" for g in groups)
        lines.append(
            f"eval           mean episode return {returns} at iteration {int(last_eval['iteration'])} (the policies' "
            f"mode, {int(last_eval[f'{EVAL_PREFIX}episodes'])} episodes)"
        )
    phases = [k for k in ("collect_s", "advantages_s", "update_s") if k in last]
    if phases:
        total = sum(last[k] for k in phases)
        lines.append("time split     " + ", ".join(f"{k[:-2]} {100 * last[k] / total:.0f}%" for k in phases))
    lines += [
        f"checkpoint     {trainer.checkpoint_path}",
        "next           marl eval --checkpoint "
        + str(trainer.checkpoint_path)
        + (" --render episode.gif" if renders_when_asked(trainer) else ""),
        "               marl plot " + str(trainer.run_dir),
    ]
    print("\n".join(lines))


def renders_when_asked(trainer) -> bool:
    """Whether `marl eval --render` draws the run's env: it draws as made, or would when made to draw (a
    PettingZoo env trained without render_mode='rgb_array': `envs.make(..., render=True)` asks for it)."""
    if trainer.env.renders:
        return True
    settings = trainer.config.env
    try:
        return render_options(settings.env, settings.env_options) != settings.env_options
    except NotImplementedError:  # the env's metadata says it cannot
        return False


def return_text(rows: list[dict[str, float]], key: str, tail: int) -> str:
    """The mean episode return of the last `tail` iterations. An iteration in which no episode ended
    logs NaN: those are left out, and when none of the last `tail` has a return, the last `tail`
    iterations that do are averaged instead (and named), so one long episode does not print `nan`."""
    finite = _finite(rows, key)
    if not finite:
        return f"mean episode return: no episode ended in the {len(rows)} iteration(s)"
    first = f"(first: {finite[0][key]:.4f} at {int(finite[0]['frames']):,} frames)"
    recent = _finite(rows[-tail:], key)
    if recent:
        return f"mean episode return {_mean(recent, key):.4f} over the last {tail} iteration(s) {first}"
    recent = finite[-tail:]
    span = _iterations(recent)
    return (
        f"mean episode return {_mean(recent, key):.4f} over {span} "
        f"(no episode ended in the last {tail} iteration(s)) {first}"
    )


def _finite(rows: list[dict[str, float]], key: str) -> list[dict[str, float]]:
    return [r for r in rows if math.isfinite(r.get(key, math.nan))]


def _mean(rows: list[dict[str, float]], key: str) -> float:
    return sum(r[key] for r in rows) / len(rows)


def _iterations(rows: list[dict[str, float]]) -> str:
    """`iteration 7` or `iterations 3-5` (the first and last of `rows`, which may skip some)."""
    first, last = int(rows[0]["iteration"]), int(rows[-1]["iteration"])
    return f"iteration {first}" if first == last else f"iterations {first}-{last}"

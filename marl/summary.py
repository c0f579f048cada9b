"""The readable summary printed at the end of `marl train`."""

from __future__ import annotations

import math


def print_summary(trainer, rows: list[dict[str, float]]) -> None:
    if not rows:
        print("nothing to train: the run already reached total_frames")
        return
    last = rows[-1]
    groups = list(trainer.learners)
    tail = rows[-max(1, len(rows) // 10) :]  # the last tenth of the run, for a steadier figure

    def mean_of(key: str, part: list[dict]) -> float:
        values = [r[key] for r in part if math.isfinite(r.get(key, math.nan))]
        return sum(values) / len(values) if values else math.nan

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
        key = f"{g}/episode_return"
        finite = [r for r in rows if math.isfinite(r[key])]
        start = f" (first: {finite[0][key]:.4f} at {int(finite[0]['frames']):,} frames)" if finite else ""
        lines.append(
            f"{g:<14} mean episode return {mean_of(key, tail):.4f} over the last {len(tail)} iteration(s){start}"
        )
    phases = [k for k in ("collect_s", "advantages_s", "update_s") if k in last]
    if phases:
        total = sum(last[k] for k in phases)
        lines.append("time split     " + ", ".join(f"{k[:-2]} {100 * last[k] / total:.0f}%" for k in phases))
    lines += [
        f"checkpoint     {trainer.checkpoint_path}",
        "next           marl eval --checkpoint "
        + str(trainer.checkpoint_path)
        + (" --render episode.gif" if trainer.env.renders else ""),
        "               marl plot " + str(trainer.run_dir),
    ]
    print("\n".join(lines))

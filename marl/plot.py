"""Learning curves from a run's metrics.csv, as a PNG."""

from __future__ import annotations

import csv
import math
from pathlib import Path


def read_metrics(run_dir: str | Path) -> list[dict[str, float]]:
    path = Path(run_dir) / "metrics.csv"
    if not path.is_file():
        raise FileNotFoundError(f"no metrics.csv in {run_dir}: pass the folder of a run made by marl train")
    with open(path) as f:
        return [{k: float(v) if v not in ("", None) else math.nan for k, v in row.items()} for row in csv.DictReader(f)]


X_AXES = {"frames": "frames", "time": "time_s"}  # --x choice -> metrics.csv column


def plot_runs(run_dirs: list[str | Path], out: str | Path | None = None, x: str = "frames") -> Path:
    """Plot each group's mean episode return of every run against frames (or training seconds, `x="time"`)
    on one figure; returns the PNG's path (default: the first run's `learning_curve.png`)."""
    if not run_dirs:
        raise ValueError("give at least one run folder")
    if x not in X_AXES:
        raise ValueError(f"x must be one of {sorted(X_AXES)}, got {x!r}")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as error:
        raise ImportError('plotting needs matplotlib: pip install "vecmarl[plot]"') from error
    runs = {Path(d): read_metrics(d) for d in run_dirs}
    for run_dir, rows in runs.items():
        if not rows:
            raise ValueError(f"{run_dir}/metrics.csv has no rows yet")
    out = Path(out) if out is not None else Path(run_dirs[0]) / "learning_curve.png"
    fig, ax = plt.subplots(figsize=(6, 4), dpi=120)
    for run_dir, rows in runs.items():
        for key in [k for k in rows[0] if k.endswith("/episode_return")]:
            # Iterations in which no episode ended have no return (NaN): draw through them.
            points = [(r[X_AXES[x]], r[key]) for r in rows if math.isfinite(r[key])]
            group = key.split("/")[0]
            label = group if len(runs) == 1 else f"{run_dir.name}: {group}"
            ax.plot([p[0] for p in points], [p[1] for p in points], marker=".", markersize=3, label=label)
    ax.set_xlabel("frames" if x == "frames" else "training time (s)")
    ax.set_ylabel("mean episode return")
    if len(runs) == 1:
        ax.set_title(next(iter(runs)).name, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)
    return out

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


def plot_run(run_dir: str | Path, out: str | Path | None = None) -> Path:
    """Plot each group's mean episode return against frames; returns the PNG's path."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as error:
        raise ImportError('plotting needs matplotlib: pip install "vecmarl[plot]"') from error
    rows = read_metrics(run_dir)
    if not rows:
        raise ValueError(f"{run_dir}/metrics.csv has no rows yet")
    out = Path(out) if out is not None else Path(run_dir) / "learning_curve.png"
    fig, ax = plt.subplots(figsize=(6, 4), dpi=120)
    for key in [k for k in rows[0] if k.endswith("/episode_return")]:
        # Iterations in which no episode ended have no return (NaN): draw through them.
        points = [(r["frames"], r[key]) for r in rows if math.isfinite(r[key])]
        ax.plot([p[0] for p in points], [p[1] for p in points], marker=".", label=key.split("/")[0])
    ax.set_xlabel("frames")
    ax.set_ylabel("mean episode return")
    ax.set_title(Path(run_dir).name, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)
    return out

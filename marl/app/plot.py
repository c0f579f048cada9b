"""Learning curves from a run's metrics.csv, as a PNG (training's returns, and the evaluation's, dashed, where
the run evaluated: `marl train --eval-every`); a run of several seeds (`marl train --seeds`) as its members'
mean with the 95% confidence band (its aggregate.csv)."""

from __future__ import annotations

import math
import os
from pathlib import Path

from marl.app.logger import EVAL_PREFIX, eval_returns, read_rows, rows_by_iteration, training_returns
from marl.app.paths import check_output_file


def read_metrics(run_dir: str | Path) -> list[dict[str, float]]:
    """A run's rows: its metrics.csv, or a population's aggregate.csv."""
    return read_rows(metrics_path(run_dir))


def metrics_path(run_dir: str | Path) -> Path:
    """The file `read_metrics` reads: a run's metrics.csv, or a population's aggregate.csv."""
    path = Path(run_dir) / "metrics.csv"
    if not path.is_file() and (Path(run_dir) / AGGREGATE).is_file():
        path = Path(run_dir) / AGGREGATE
    if not path.is_file():
        raise FileNotFoundError(f"no metrics.csv in {run_dir}: {_hint(Path(run_dir))}")
    return path


def _hint(path: Path) -> str:
    """What to pass instead of `path`, which holds no metrics.csv: for the common mistakes, the run folder
    of a file in it, or the runs a folder of runs holds."""
    if not path.exists():
        return "there is no such folder"
    if path.is_file():
        return f"pass the run folder that holds it ({path.parent}), not a file"
    # A run holds metrics.csv, a population (`--seeds`) aggregate.csv.
    files = ("metrics.csv", AGGREGATE)
    runs = sorted(d.name for d in path.glob("*/") if any((d / f).is_file() for f in files)) if path.is_dir() else []
    if runs:
        shown = ", ".join(runs[:5]) + (f" and {len(runs) - 5} more" if len(runs) > 5 else "")
        return f"it is a folder of runs ({shown}); pass one or more of them, e.g. {path / runs[0]}"
    return "pass the folder of a run made by marl train"


def sweep_rows(run_dir: str | Path) -> dict[str, list[dict[str, float]]]:
    """A swept population's curves (`marl train --sweep`), whose aggregate.csv averages over every setting:
    per setting (`lr_0.001-gamma_0.9`) and iteration, each group's return averaged over that setting's seeds
    with its 95% CI (as aggregate.csv's columns), from the members' `seed_<s>-<setting>/metrics.csv`, their
    rows paired by iteration: only the iterations every seed of the setting logged (`rows_by_iteration`);
    empty for a single run or a population of seeds alone. A setting of one seed is that member's curve, with
    no interval (one run has no spread), named `lr_0.001 (seed 3)`."""
    members: dict[str, dict[str, list[dict[str, float]]]] = {}
    for log in sorted(Path(run_dir).glob("seed_*-*/metrics.csv")):
        seed, setting = log.parent.name.removeprefix("seed_").split("-", 1)
        members.setdefault(setting, {})[seed] = read_rows(log)
    if not (Path(run_dir) / AGGREGATE).is_file() or not members:
        return {}
    from marl.app.seeds import STATS, bootstrap_ci

    curves = {}
    for setting, by_seed in members.items():
        rows = []
        for iteration in rows_by_iteration(list(by_seed.values())):
            row = dict(iteration[0])
            for key in [k for k in row if k.endswith("/episode_return") and len(iteration) > 1]:
                mean, *stats = bootstrap_ci([r[key] for r in iteration])
                row.update({key: mean, **{f"{key}_{stat}": v for stat, v in zip(STATS, stats)}})
            rows.append(row)
        if not rows:
            raise ValueError(
                f"{run_dir}: the seeds of setting {setting} logged no iteration in common (their "
                "seed_*/metrics.csv are empty, or lost rows), so there is no mean to plot"
            )
        curves[setting if len(by_seed) > 1 else f"{setting} (seed {next(iter(by_seed))})"] = rows
    return curves


X_AXES = {"frames": "frames", "time": "time_s"}  # --x choice -> metrics.csv column
AGGREGATE = "aggregate.csv"  # a population's (`marl.app.seeds`): each metric's mean, std and CI over the seeds


def output_path(out: str | Path | None, first_run: str | Path) -> Path:
    """Where the figure goes: `out`, or `learning_curve.png` inside it when it is a folder, or the first
    run's `learning_curve.png`. A name without an extension gets `.png`, which matplotlib would add
    itself (the path reported must be the file written); a format matplotlib does not write, or a missing or
    read-only folder, is refused before plotting."""
    hint = ""
    if out is None:  # e.g. a read-only run folder: the figure can still go elsewhere
        out, hint = Path(first_run) / "learning_curve.png", "; pass --out to write the figure elsewhere"
    elif Path(out).is_dir() or str(out).endswith(("/", os.sep)):
        out = Path(out) / "learning_curve.png"
    out = Path(out)
    if not out.suffix:
        out = out.with_name(out.name + ".png")
    from matplotlib.backend_bases import FigureCanvasBase

    formats = FigureCanvasBase.get_supported_filetypes()  # {"png": "Portable Network Graphics", ...}
    if out.suffix[1:].lower() not in formats:  # else matplotlib refuses only after the figure is drawn
        raise ValueError(f"cannot write {out}: matplotlib writes {', '.join(f'.{f}' for f in sorted(formats))}")
    try:
        check_output_file(out, f"cannot write {out}")
    except ValueError as error:
        raise ValueError(f"{error}{hint}") from None
    return out


def plot_runs(run_dirs: list[str | Path], out: str | Path | None = None, x: str = "frames") -> Path:
    """Plot each group's mean episode return of every run against frames (or training seconds, `x="time"`)
    on one figure, and where a run evaluated during training (`--eval-every`) its evaluation's, dashed in the
    group's colour; returns the figure's path (default: the first run's `learning_curve.png`)."""
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
            raise ValueError(f"{metrics_path(run_dir)} has no rows yet")
        returns = training_returns(rows[0])
        if not returns:
            raise ValueError(f"{metrics_path(run_dir)} has no episode_return column: it is not a marl train log")
        if X_AXES[x] not in rows[0]:
            raise ValueError(f"{metrics_path(run_dir)} has no {X_AXES[x]} column to plot against (--x {x})")
        if not any(math.isfinite(r[k]) for r in rows for k in returns):
            raise ValueError(
                f"{run_dir}: no episode has ended yet in its {len(rows)} iteration(s), so there is no return to "
                "plot; train longer (an episode must end within the frames trained)"
            )
    # After the runs are read: a folder given that is not a run is said as that, not as a place to write.
    out = output_path(out, run_dirs[0])
    # Runs are named by their folder, or by the path given where two folders share a name (seed0/nav, seed1/nav).
    short = [d.name for d in runs]
    names = {d: d.name if short.count(d.name) == 1 else str(d) for d in runs}
    fig, ax = plt.subplots(figsize=(6, 4), dpi=120)
    curves = [(d, setting, r) for d, rows in runs.items() for setting, r in (sweep_rows(d) or {"": rows}).items()]
    count = sum(len(training_returns(rows[0])) for _, _, rows in curves)  # one colour each (evaluations share it)
    if count > 10:  # the default cycle's 10 colours would repeat: tab20's 20, else as many from a colour map
        palette = (
            plt.get_cmap("tab20").colors
            if count <= 20
            else plt.get_cmap("turbo")([i / (count - 1) for i in range(count)])
        )
        ax.set_prop_cycle(color=list(palette))
    for run_dir, setting, rows in curves:
        colours = {}  # group -> its training curve's colour, which its evaluation's (dashed) takes
        for key in [*training_returns(rows[0]), *eval_returns(rows[0])]:
            # Iterations in which no episode ended (or that did not evaluate) have no return (NaN): draw through them.
            points = [(r[X_AXES[x]], r[key]) for r in rows if math.isfinite(r[key])]
            evaluated = key.startswith(EVAL_PREFIX)
            group = key.removeprefix(EVAL_PREFIX).removesuffix("/episode_return")
            name = group + (f" {setting}" if setting else "") + (" (eval)" if evaluated else "")
            label = name if len(runs) == 1 else f"{names[run_dir]}: {name}"
            band = f"{key}_ci_low" in rows[0]  # a population: the mean over its seeds and its 95% CI
            if band:
                label += " (mean, 95% CI over seeds)"
            style = {"linestyle": "--", "color": colours.get(group)} if evaluated else {}
            line = ax.plot(
                [p[0] for p in points], [p[1] for p in points], marker=".", markersize=3, label=label, **style
            )
            colours.setdefault(group, line[0].get_color())
            if band:
                finite = [r for r in rows if math.isfinite(r[key])]
                lows, highs = ([r[f"{key}_{end}"] for r in finite] for end in ("ci_low", "ci_high"))
                ax.fill_between([p[0] for p in points], lows, highs, color=line[0].get_color(), alpha=0.2)
    ax.set_xlabel("frames" if x == "frames" else "training time (s)")
    ax.set_ylabel("mean episode return")
    if len(runs) == 1:
        ax.set_title(next(iter(runs)).name, fontsize=9)
    ax.grid(alpha=0.3)
    if count > 10:  # a legend of that many lines would cover the curves: beside the axes instead
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1), borderaxespad=0)
    else:
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, bbox_inches="tight" if count > 10 else None)
    plt.close(fig)
    return out

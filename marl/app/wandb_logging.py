"""Weights & Biases logging (`marl train --wandb`, the `wandb` extra): a W&B run mirrors the rows of a run
folder's metrics.csv, step = frames. `wandb` is imported only when a W&B run is opened."""

from __future__ import annotations

import dataclasses
import importlib.util
import os
from pathlib import Path
from typing import Any

INSTALL = 'pip install "vecmarl[wandb]"'
RUN_ID_FILE = "wandb-run-id"  # in the run folder: a resumed run continues its W&B run


@dataclasses.dataclass(frozen=True)
class WandbRun:
    """What one W&B run is opened with: the `--wandb-*` options, its name, its group (the population's, or
    None) and its config (the run's `TrainConfig.to_dict()`)."""

    project: str
    entity: str
    mode: str
    name: str
    group: str | None
    config: dict[str, Any]


class WandbStartError(RuntimeError):
    """W&B could not open a run (no API key, a bad entity or project, no network): `marl train` says so in
    one line, before any iteration, with what to do."""


def check_installed() -> None:
    """A clear error, before anything trains, when --wandb is asked for without the package."""
    if importlib.util.find_spec("wandb") is None:
        raise ImportError(f"--wandb logs to Weights & Biases, which is not installed: {INSTALL}")


def wandb_run(run, name: str, group: str | None, config: dict[str, Any]) -> WandbRun | None:
    """The W&B run that `run` (a `RunConfig`) asks for, or None without --wandb."""
    if not run.wandb:
        return None
    return WandbRun(run.wandb_project, run.wandb_entity, run.wandb_mode, name, group, config)


class WandbLog:
    """One open W&B run, fed the rows a `RunLogger` writes to `run_dir`'s CSV. W&B's files go to `run_dir`
    (its `wandb/` folder) unless WANDB_DIR says otherwise; the run's id is kept in `run_dir`, so that a run
    resumed from its checkpoint continues the same W&B run."""

    def __init__(self, run_dir: Path, spec: WandbRun) -> None:
        check_installed()
        import wandb

        id_file = Path(run_dir) / RUN_ID_FILE
        run_id = id_file.read_text().strip() if id_file.exists() else None  # None: W&B draws a new one
        try:
            self.run = wandb.init(
                project=spec.project,
                entity=spec.entity or None,
                mode=spec.mode or None,  # None: WANDB_MODE, else online
                name=spec.name,
                group=spec.group,
                config=spec.config,
                id=run_id,
                resume="allow",
                dir=os.environ.get("WANDB_DIR") or str(run_dir),
                # Several members log at once, each to its own run (W&B's `create_new`: no global run); the
                # console stays the trainer's, not captured once per member.
                reinit="create_new",
                settings=wandb.Settings(silent=True, console="off"),
            )
        except (wandb.errors.UsageError, wandb.errors.CommError) as error:  # else a traceback through wandb's code
            raise WandbStartError(
                f"--wandb: W&B could not start the run ({str(error).strip()}): log in with `wandb login` (or set "
                "WANDB_API_KEY), or pass --wandb-mode offline to log without an account and upload later with "
                "`wandb sync`"
            ) from error
        if run_id is None and self.run.settings.mode != "disabled":
            id_file.write_text(self.run.id + "\n")
        if self.run.settings.mode == "offline":
            print(f"W&B run {spec.name} (offline): upload it with `wandb sync {Path(self.run.dir).parent}`")
        elif self.run.settings.mode == "online":
            print(f"W&B run {spec.name}: {self.run.url}")

    def log(self, row: dict[str, float]) -> None:
        self.run.log(row, step=int(row["frames"]))

    def close(self, exit_code: int = 0) -> None:
        """Finish the run: W&B marks it failed when `exit_code` is not 0 (the training died)."""
        self.run.finish(exit_code=exit_code)

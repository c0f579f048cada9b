"""Run logging: a CSV file per run (TensorBoard too when installed, Weights & Biases with --wandb), a progress bar
and a summary."""

from __future__ import annotations

import csv
import importlib.util
import math
import os
from collections.abc import Sequence
from pathlib import Path

from tqdm.auto import tqdm

from marl.app.wandb_logging import WandbLog, WandbRun

EVAL_PREFIX = "eval/"
"""The columns of the evaluation during training (`marl train --eval-every`): `eval/<group>/episode_return`
(as training's `<group>/episode_return`), `eval/episode_return` (the groups' mean), `eval/episode_length`,
`eval/episodes`; beside them `eval_s`, its seconds. NaN in the rows of iterations that did not
evaluate."""


def training_returns(keys) -> list[str]:
    """The columns of training's per group returns, `<group>/episode_return`, among `keys`."""
    return [k for k in keys if k.endswith("/episode_return") and not k.startswith(EVAL_PREFIX)]


def eval_returns(keys) -> list[str]:
    """The columns of the evaluation's per group returns, `eval/<group>/episode_return`, among `keys`."""
    return [k for k in keys if k.startswith(EVAL_PREFIX) and k.endswith("/episode_return") and k.count("/") > 1]


def _evaluated(key: str) -> bool:
    return key.startswith(EVAL_PREFIX) or key == "eval_s"


class LogWriteError(OSError):
    """A run's folder or a row of its CSV log could not be written (a full disk, a folder that cannot be
    made); the message names the path and gives the OS's reason."""


def writes_tensorboard(tensorboard: bool) -> bool:
    """Whether a RunLogger asked for `tensorboard` writes `run_dir/tensorboard/`: only where TensorBoard is
    installed."""
    return tensorboard and importlib.util.find_spec("tensorboard") is not None


class RunLogger:
    """Appends one row per iteration to `run_dir/metrics.csv` (or `csv_name`) and mirrors it to TensorBoard
    and to the W&B run `wandb` (step: frames). `start_frames`: the frames of the checkpoint a run resumes
    from (0 for a new run)."""

    def __init__(
        self,
        run_dir: str | os.PathLike,
        total_frames: int,
        start_frames: int = 0,
        progress: bool = True,
        tensorboard: bool = True,
        csv_name: str = "metrics.csv",
        wandb: WandbRun | None = None,
    ) -> None:
        self.run_dir = Path(run_dir)
        try:
            self.run_dir.mkdir(parents=True, exist_ok=True)
        except OSError as error:  # the up-front checks passed, yet the OS refuses (e.g. a folder under /proc)
            raise LogWriteError(f"could not make the run folder {self.run_dir}: {error.strerror or error}") from error
        self.csv_path = self.run_dir / csv_name
        self._columns: list[str] | None = None
        if self.csv_path.exists() and self.csv_path.stat().st_size > 0:
            with open(self.csv_path) as f:
                self._columns = next(csv.reader(f))
        self._writer = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                # A resumed run logs again the frames after its checkpoint: `purge_step` makes TensorBoard
                # drop the old events at those steps (as `drop_rows_after` does for the CSV).
                purge_step = start_frames + 1 if start_frames > 0 else None
                self._writer = SummaryWriter(str(self.run_dir / "tensorboard"), purge_step=purge_step)
            except ImportError:
                pass
        self._wandb = WandbLog(self.run_dir, wandb) if wandb is not None else None
        self.bar = tqdm(
            total=total_frames,
            initial=start_frames,
            unit="frame",
            unit_scale=True,
            disable=not progress,
            dynamic_ncols=True,
        )

    def log(self, row: dict[str, float]) -> None:
        if self._columns is None:
            self._columns = list(row)
        added = [key for key in row if key not in self._columns]
        if added:  # a resumed run that logs more (`--resume --eval-every N`): the header takes its columns too
            self._columns += added
            add_columns(self.csv_path, self._columns)
        try:
            with open(self.csv_path, "a", newline="") as f:
                writer = csv.DictWriter(f, fieldnames=self._columns, extrasaction="ignore")
                if f.tell() == 0:
                    writer.writeheader()
                writer.writerow(row)
        except OSError as error:  # a row cut short is left out on resume (`_read_csv`)
            raise LogWriteError(
                f"could not write iteration {row.get('iteration', '?')}'s row of {self.csv_path}: "
                f"{error.strerror or error}"
            ) from error
        if self._writer is not None:
            for key, value in row.items():
                if key != "frames" and isinstance(value, (int, float)) and math.isfinite(value):
                    self._writer.add_scalar(key, value, int(row["frames"]))
        if self._wandb is not None:  # not the NaN of iterations that did not evaluate
            self._wandb.log({k: v for k, v in row.items() if not (_evaluated(k) and math.isnan(v))})
        returns = [row[k] for k in training_returns(row) if math.isfinite(row[k])]
        postfix = {"frames/s": f"{row['frames_per_s']:,.0f}"}
        if returns:
            postfix["return"] = f"{sum(returns) / len(returns):.3f}"
        if math.isfinite(row.get(f"{EVAL_PREFIX}episode_return", math.nan)):
            postfix["eval"] = f"{row[f'{EVAL_PREFIX}episode_return']:.3f}"
        self.bar.set_postfix(postfix, refresh=False)
        self.bar.update(int(row["frames"]) - self.bar.n)

    def close(self, exit_code: int = 0) -> None:
        """`exit_code` not 0: the training died (its W&B run is marked failed)."""
        self.bar.close()
        if self._writer is not None:
            self._writer.close()
        if self._wandb is not None:
            self._wandb.close(exit_code)


class NoLogger:
    """Stands in for `RunLogger` on the ranks that do not log (all but rank 0 under torchrun)."""

    def log(self, row: dict[str, float]) -> None:
        pass

    def close(self, exit_code: int = 0) -> None:
        pass


def drop_rows_after(csv_path: str | os.PathLike, iteration: int) -> None:
    """Drop the rows of `csv_path` logged after `iteration` (a resumed run logs them again), rewriting
    the file atomically (temp file, then rename): a crash mid-way leaves the old file whole. A damaged
    row is refused (`read_rows`), before anything is written; a last row cut short by a crash is dropped."""
    csv_path = Path(csv_path)
    if not csv_path.exists():
        return
    columns, rows, cut = _read_csv(csv_path)
    if columns is None:
        return
    _check_iteration_column(csv_path, columns)
    kept = [text for text, numbers in rows if numbers["iteration"] <= iteration]
    if len(kept) == len(rows) and not cut:  # a cut row is rewritten away: the next row must start a line
        return
    _rewrite(csv_path, columns, kept)


def add_columns(csv_path: Path, columns: list[str]) -> None:
    """Rewrite `csv_path` (if it has rows) with the header `columns`, its first columns' as they were, the rows'
    cells in the columns it adds empty (NaN); atomically, as `drop_rows_after`."""
    if not csv_path.exists() or csv_path.stat().st_size == 0:
        return
    old, rows, _ = _read_csv(csv_path)
    _rewrite(csv_path, columns, [cells + [""] * (len(columns) - len(old)) for cells, _ in rows])


def _rewrite(csv_path: Path, columns: list[str], rows: list[list[str]]) -> None:
    """Write `columns` and `rows` to `csv_path` atomically (temp file, then rename): a crash mid-way leaves the
    old file whole."""
    tmp = csv_path.with_name(csv_path.name + ".tmp")
    try:
        with open(tmp, "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(columns)
            writer.writerows(rows)
        os.replace(tmp, csv_path)
    except BaseException:  # a full disk, Ctrl-C: the old file stays, and no temporary file is left beside it
        tmp.unlink(missing_ok=True)
        raise


def last_iteration(csv_path: str | os.PathLike) -> int | None:
    """The last iteration `csv_path` logged (the largest in its iteration column, as `drop_rows_after` and
    `rows_by_iteration` go by), None when it logged none or there is no such file."""
    csv_path = Path(csv_path)
    if not csv_path.exists():
        return None
    columns, rows, _ = _read_csv(csv_path)
    if columns is None:
        return None
    _check_iteration_column(csv_path, columns)
    return int(max(numbers["iteration"] for _, numbers in rows)) if rows else None


def _check_iteration_column(csv_path: Path, columns: list[str]) -> None:
    if "iteration" not in columns:
        raise ValueError(f"{csv_path}: its header has no iteration column: it is not a marl train log")


def read_rows(csv_path: str | os.PathLike) -> list[dict[str, float]]:
    """The rows of `csv_path` as numbers (an empty cell as NaN); none when there is no such file. A row
    that is not one number per column of the header is refused, naming the file and line."""
    csv_path = Path(csv_path)
    if not csv_path.exists():
        return []
    return [numbers for _, numbers in _read_csv(csv_path)[1]]


def _read_csv(csv_path: Path) -> tuple[list[str] | None, list[tuple[list[str], dict[str, float]]], bool]:
    """The header of `csv_path` (None for an empty file), each row as its cells and as numbers, and whether
    a cut row was left out: a damaged last line without its newline is a row whose write was cut short (a
    crash, a full disk), of an iteration after the last checkpoint (a row is logged before its checkpoint)."""
    text = csv_path.read_text()
    lines = text.splitlines()
    cut = not text.endswith("\n")
    reader = csv.reader(lines)
    columns = next(reader, None)
    rows = []
    for cells in reader:
        if not cells:
            continue
        try:
            rows.append((cells, _numbers(columns, cells, f"{csv_path}, line {reader.line_num}")))
        except ValueError:
            if cut and reader.line_num == len(lines):
                return columns, rows, True
            raise
    return columns, rows, False


def _numbers(columns: list[str], cells: list[str], where: str) -> dict[str, float]:
    """A row's cells as numbers by column (an empty cell as NaN); a damaged row is refused, saying `where`."""
    if len(cells) != len(columns):  # two rows run together, or a line cut short
        raise ValueError(
            f"{where}: {len(cells)} values, expected {len(columns)} (one per column of the header): "
            "the row is damaged; fix or delete that line"
        )
    numbers = {}
    for key, value in zip(columns, cells):
        try:
            numbers[key] = float(value) if value != "" else math.nan
        except ValueError:  # float() names neither the file nor the cell
            raise ValueError(f"{where}: {key} is {value!r}, not a number; fix or delete that line") from None
    return numbers


def rows_by_iteration(logs: Sequence[list[dict[str, float]]]) -> list[tuple[dict[str, float], ...]]:
    """Several runs' rows (`read_rows`: a population's members) paired by their iteration column, not by
    position: for each iteration that every log holds, in order, each log's row of it (its last, should an
    iteration repeat). An iteration some log lacks (rows lost, a member trained on alone past the others)
    is left out, so that every pair averages over the same runs."""
    by_iteration = [{row["iteration"]: row for row in rows} for rows in logs]
    common = set.intersection(*(set(rows) for rows in by_iteration)) if by_iteration else set()
    return [tuple(rows[i] for rows in by_iteration) for i in sorted(common)]

"""Checkpoints written atomically: a crash or Ctrl-C mid-write never leaves a broken file behind."""

from __future__ import annotations

import os
import pickle
from pathlib import Path
from typing import Any

import torch


class CheckpointWriteError(OSError):
    """A checkpoint could not be written (a full disk, a folder this user cannot write, ...); the
    message names the checkpoint, says whether the previous one is kept, and gives the OS's reason."""


def save_checkpoint(path: str | os.PathLike, state: dict[str, Any]) -> Path:
    """Write `state` to `path` through a temporary file and an atomic rename. A write that fails removes
    its temporary file and leaves the previous checkpoint as it was; an OS error (a full disk) raises a
    CheckpointWriteError saying so."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # Through a Python file, not the path: torch's own writer reports a full disk only as
        # "file write failed" or "unexpected pos", whereas the file's write raises the OSError itself.
        with tmp.open("wb") as file:
            torch.save(state, file)
            file.flush()
            os.fsync(file.fileno())  # some filesystems report a full disk only here; before the rename
        os.replace(tmp, path)
    except BaseException as error:  # also Ctrl-C: no temporary file is left behind
        tmp.unlink(missing_ok=True)
        cause = _os_error(error)
        if cause is None:
            raise
        kept = "the previous checkpoint there is kept" if path.is_file() else "no checkpoint was written"
        reason = cause.strerror or str(cause)
        raise CheckpointWriteError(f"could not write the checkpoint {path}: {reason}; {kept}") from error
    return path


def _os_error(error: BaseException) -> OSError | None:
    """The OSError that `error` is or was raised while handling: torch.save turns a failed write of the
    file into a RuntimeError raised in handling the file's OSError."""
    while error is not None and not isinstance(error, OSError):
        error = error.__cause__ or error.__context__
    return error


_ZIP_MAGIC = b"PK\x03\x04"  # how every file torch.save writes (a zip archive) starts

# The top-level keys `Trainer.state_dict` writes (under torchrun also "world_size" and "ranks").
CHECKPOINT_KEYS = ("config", "iteration", "frames", "elapsed", "algorithm", "generator", "env", "obs", "stats")


def load_checkpoint(path: str | os.PathLike, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """The state `save_checkpoint` wrote to `path`. A file that is not one (a text file, a CSV, another
    torch file, a truncated checkpoint) raises a ValueError saying so, instead of whatever torch.load
    raises, which can be as cryptic as a bare `KeyError: 105`."""
    path = Path(path)
    if path.is_dir() and (path / "checkpoint.pt").is_file():  # a run's folder: the usual slip
        raise FileNotFoundError(f"{path} is a run folder; pass its checkpoint, {path / 'checkpoint.pt'}")
    if path.is_dir():
        runs = sorted(path.glob("*/checkpoint.pt"))
        if runs:
            raise FileNotFoundError(f"{path} is a folder of runs; pass one's checkpoint, e.g. {runs[0]}")
        raise FileNotFoundError(
            f"{path} is a folder without a checkpoint.pt; pass the checkpoint.pt of a marl train run"
        )
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint at {path}")
    state = _read(path, map_location)
    if not isinstance(state, dict):
        raise _not_a_checkpoint(path, f"it holds a {type(state).__name__}, not a dict")
    missing = [key for key in CHECKPOINT_KEYS if key not in state]
    if missing:
        raise _not_a_checkpoint(path, f"it is a dict without the key(s) {missing}")
    return state


def _read(path: Path, map_location: str | torch.device) -> Any:
    # torch.save writes a zip archive: checking for one first gives a clear reason for the most common
    # mistake (a CSV, a log or a text file), for which torch.load raises e.g. `KeyError: 105`.
    if path.stat().st_size == 0:
        raise _not_a_checkpoint(path, "the file is empty")
    with path.open("rb") as file:
        if file.read(len(_ZIP_MAGIC)) != _ZIP_MAGIC:
            raise _not_a_checkpoint(path, "it is not a file written by torch.save")
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as error:
        # torch's message suggests weights_only=False, which would run code from an untrusted file. It raises
        # this error also for damaged bytes ("Unsupported operand 0"); only a Python object names its GLOBAL.
        if "GLOBAL" in str(error):
            raise _not_a_checkpoint(path, "it holds Python objects other than tensors and plain containers") from None
        reason = f"it is truncated or corrupted (torch.load: {_unpickler_reason(error)})"
        raise _not_a_checkpoint(path, reason) from None
    except Exception as error:  # a truncated or corrupted archive: RuntimeError, EOFError, ...
        reason = f"it is truncated or corrupted (torch.load: {_first_sentence(error)})"
        raise _not_a_checkpoint(path, reason) from None


def load_algorithm_state(algorithm, state: dict[str, Any], setup: str) -> None:
    """`algorithm.load_state_dict(state)`. A state of another layout (an entry missing, a tensor of another
    shape), as another version of vecmarl or another setup than `setup` (e.g. "MAPPO") writes, raises a
    ValueError saying so, not a bare KeyError or torch's list of every mismatched tensor."""
    other = f"it was written by another version of vecmarl or for another setup than {setup}"
    try:
        algorithm.load_state_dict(state)
    except KeyError as error:
        raise ValueError(f"the checkpoint's algorithm state has no entry {error}: {other}") from None
    except RuntimeError as error:
        lines = str(error).strip().split("\n")
        if not lines[0].startswith("Error(s) in loading state_dict"):
            raise
        first = lines[1].strip() if len(lines) > 1 else lines[0]  # e.g. "size mismatch for net.layers.0.weight: ..."
        raise ValueError(f"the checkpoint's algorithm state does not fit: {first.rstrip('.')}; {other}") from None


def _not_a_checkpoint(path: Path, reason: str) -> ValueError:
    return ValueError(f"{path} is not a vecmarl checkpoint (a checkpoint.pt written by marl train): {reason}")


def _unpickler_reason(error: Exception) -> str:
    """What torch's weights-only unpickler found (`Unsupported operand 0`), without the advice around it: the
    first line after `WeightsUnpickler error:` in its message."""
    _, marker, found = str(error).partition("WeightsUnpickler error:")
    lines = [line.strip() for line in found.split("\n") if line.strip()]
    return lines[0] if marker and lines else _first_sentence(error)


def _first_sentence(error: Exception) -> str:
    text = str(error).strip().split("\n")[0].split(". ")[0]
    return text or type(error).__name__

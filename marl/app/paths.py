"""Checks of the files a command will write, made before the work whose result goes there."""

from __future__ import annotations

import os
from pathlib import Path


def check_output_file(path: str | Path, what: str, example: str | None = None) -> None:
    """Raise a ValueError, its message starting with `what`, when `path` cannot be written as a file:
    its folder does not exist, is a file or is not writable, it is a file that is not writable, or (when
    `example` names a file to suggest inside it) it is a folder."""
    path = Path(path)
    if example is not None and path.is_dir():
        raise ValueError(f"{what}: it is a folder; give a file name such as {path / example}")
    if path.parent.exists() and not path.parent.is_dir():
        raise ValueError(f"{what}: {path.parent} is a file, not a folder")
    if not path.parent.is_dir():
        raise ValueError(f"{what}: the folder {path.parent} does not exist")
    if not os.access(path.parent, os.W_OK | os.X_OK):
        raise ValueError(f"{what}: the folder {path.parent} is not writable")
    if path.is_file() and not os.access(path, os.W_OK):
        raise ValueError(f"{what}: {path} is not writable")


def check_output_folder(path: str | Path, what: str) -> None:
    """Raise a ValueError, its message starting with `what`, when folder `path` can neither be used nor
    made: it, or the nearest of its parents that exists, is a file, or is a folder this user cannot write."""
    path = Path(path)
    existing = next(p for p in (path, *path.parents) if p.exists())
    if not existing.is_dir():
        raise ValueError(f"{what}: {existing} is a file, not a folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ValueError(f"{what}: the folder {existing} is not writable")

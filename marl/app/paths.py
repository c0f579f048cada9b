"""Checks of the files a command will write, made before the work whose result goes there."""

from __future__ import annotations

from pathlib import Path


def check_output_file(path: str | Path, what: str, example: str | None = None) -> None:
    """Raise a ValueError, its message starting with `what`, when `path` cannot be written as a file:
    its folder does not exist, or (when `example` names a file to suggest inside it) it is a folder."""
    path = Path(path)
    if example is not None and path.is_dir():
        raise ValueError(f"{what}: it is a folder; give a file name such as {path / example}")
    if not path.parent.is_dir():
        raise ValueError(f"{what}: the folder {path.parent} does not exist")

"""What the benchmarks share at their edges: argument checks (a count: `--repeats 0` would leave no
median to report; a peer's interpreter: `--peer-python PATH` and the like), made before anything is
timed, and `--json` output. They live in `kernels` because every benchmark package may import `kernels`,
and use the standard library only."""

from __future__ import annotations

import argparse
import json
import math
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path


def positive_int(text: str) -> int:
    """An argparse type for a count: sizes, steps, repeats, rounds, threads."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a positive integer")
    return value


# Prints a word of its own first: a program that is not Python (`/bin/true`, `/bin/echo`) cannot pass for one.
_FIND_MODULES = (
    "import importlib.util, sys; print('python-ok', *(m for m in sys.argv[1:] if importlib.util.find_spec(m) is None))"
)


def check_peer_python(flag: str, python: str, modules: tuple[str, ...]) -> None:
    """Refuse a peer interpreter (`flag python`) that does not exist, is not a Python, or lacks one of
    `modules`: a ValueError naming the flag, raised before the benchmark runs, not a traceback in it."""
    found = shutil.which(python)
    if found is None:
        exists = Path(python).exists()
        raise ValueError(f"{flag} {python}: " + ("not an executable file" if exists else "no such interpreter"))
    try:
        done = subprocess.run([found, "-c", _FIND_MODULES, *modules], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise ValueError(f"{flag} {python}: could not run it ({error})") from None
    words = done.stdout.split()
    if done.returncode != 0 or words[:1] != ["python-ok"]:
        said = done.stderr.strip()[-300:]
        raise ValueError(f"{flag} {python}: it is not a working Python" + (f" ({said})" if said else ""))
    if words[1:]:
        raise ValueError(f"{flag} {python}: {', '.join(words[1:])} not installed in that interpreter")


def checked(parser: argparse.ArgumentParser, check: Callable, *args, prefix: str = ""):
    """`check(*args)`'s result; a ValueError from it is `parser`'s usage error (one line, exit 2), `prefix`
    before its message: made before anything is timed, for what would otherwise fail in the runs, or after
    them, with a traceback (a device, a `--json` path, a peer's interpreter)."""
    try:
        return check(*args)
    except ValueError as error:
        parser.error(f"{prefix}{error}")


def json_text(report: object) -> str:
    """`report` as JSON text, NaN and infinities (a return where no episode ended, a target not reached)
    written as null: `json.dumps` would write `NaN`, which is not JSON and which strict readers refuse."""

    def finite(value: object) -> object:
        if isinstance(value, float) and not math.isfinite(value):
            return None
        if isinstance(value, dict):
            return {key: finite(item) for key, item in value.items()}
        if isinstance(value, list | tuple):
            return [finite(item) for item in value]
        return value

    return json.dumps(finite(report), indent=2, allow_nan=False)

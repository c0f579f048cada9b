"""Running a `python -m MODULE ARGS` command line inside the test process."""

import importlib
import runpy


def run_module_main(words: list[str], monkeypatch) -> None:
    """`python -m MODULE ARGS`: MODULE's `main` (or `_main`) with ARGS as `sys.argv`, in this process."""
    module = importlib.import_module(words[2])
    monkeypatch.setattr("sys.argv", [words[2], *words[3:]])
    if hasattr(module, "__path__"):  # a package: `python -m` runs its __main__
        runpy.run_module(f"{words[2]}.__main__", run_name="__main__")
        return
    (getattr(module, "main", None) or module._main)()

"""Under `.ci/run` (VECMARL_CI=1) a test that skips because an extra is missing fails the run."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


def run_probe(name: str, files: dict[str, str], env: dict[str, str]) -> subprocess.CompletedProcess:
    """Run pytest, in the environment `env`, on `files` (relative path -> source) written into a folder
    inside the tests folder, so that its conftest.py applies; the folder is removed afterwards."""
    probe = ROOT / "tests" / f"_probe_{name}_{os.getpid()}"
    try:
        for relative, source in files.items():
            (probe / relative).parent.mkdir(parents=True, exist_ok=True)
            (probe / relative).write_text(source)
        return subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                "-q",
                "-rs",
                "-p",
                "no:cacheprovider",
                "--continue-on-collection-errors",
                str(probe),
            ],
            capture_output=True,
            text=True,
            cwd=ROOT,
            env=env,
        )
    finally:
        shutil.rmtree(probe, ignore_errors=True)


@pytest.mark.parametrize("ci", ["1", "0"])
def test_a_missing_extra_fails_under_ci_and_skips_elsewhere(ci):
    # One module-level skip, one in a test.
    files = {
        "test_at_import.py": 'import pytest\n\npytest.importorskip("no_such_extra_module")\n',
        "test_in_a_test.py": 'import pytest\n\n\ndef test_it():\n    pytest.importorskip("no_such_extra_module")\n',
    }
    done = run_probe(f"missing_extra_{ci}", files, {**os.environ, "VECMARL_CI": ci})
    if ci == "1":  # the module-level skip fails its module's collection, the other its test
        assert done.returncode != 0 and "1 failed, 1 error" in done.stdout, done.stdout
        assert "VECMARL_CI=1 (.ci/run installs every extra), yet a test skipped" in done.stdout
    else:
        assert done.returncode == 0 and "2 skipped" in done.stdout, done.stdout


MARKED = """import os
import shutil

import pytest
import torch


def test_plain():
    pass


@pytest.mark.gpu
def test_on_a_gpu():
    pass


@pytest.mark.needs_interpreter
def test_interpreted():
    assert os.environ["TRITON_INTERPRET"] == "1"
"""


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU session; on a GPU `gpu` tests run")
@pytest.mark.parametrize("interpret", ["", "0"], ids=["interpreter-set-by-conftest", "interpreter-off"])
def test_marks_skip_by_marker_not_by_a_folder_named_gpu(interpret):
    # A checkout under a folder named `gpu` once skipped every test: `"gpu" in item.keywords` matched it.
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # unset: the conftest chooses
    if interpret:
        env["TRITON_INTERPRET"] = interpret
    done = run_probe(f"marks_{interpret or 'default'}", {"gpu/test_marked.py": MARKED}, env)
    skipped = 1 if interpret == "" else 2  # the gpu test always; the interpreted one when the interpreter is off
    assert done.returncode == 0 and f"{3 - skipped} passed, {skipped} skipped" in done.stdout, done.stdout
    assert "needs a CUDA device" in done.stdout, done.stdout
    if interpret == "0":
        assert "runs Triton on CPU tensors, which needs TRITON_INTERPRET=1" in done.stdout, done.stdout

"""Under `.ci/run` (VECMARL_CI=1) a test that skips because an extra is missing fails the run."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("ci", ["1", "0"])
def test_a_missing_extra_fails_under_ci_and_skips_elsewhere(ci):
    # Inside the tests folder, so its conftest.py applies: one module-level skip, one in a test.
    probe = ROOT / "tests" / f"_probe_missing_extra_{ci}_{os.getpid()}"
    probe.mkdir()
    try:
        (probe / "test_at_import.py").write_text('import pytest\n\npytest.importorskip("no_such_extra_module")\n')
        (probe / "test_in_a_test.py").write_text(
            'import pytest\n\n\ndef test_it():\n    pytest.importorskip("no_such_extra_module")\n'
        )
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                "-q",
                "-p",
                "no:cacheprovider",
                "--continue-on-collection-errors",
                str(probe),
            ],
            capture_output=True,
            text=True,
            cwd=ROOT,
            env={**os.environ, "VECMARL_CI": ci},
        )
    finally:
        for file in probe.iterdir():
            file.unlink()
        probe.rmdir()
    if ci == "1":  # the module-level skip fails its module's collection, the other its test
        assert done.returncode != 0 and "1 failed, 1 error" in done.stdout, done.stdout
        assert "VECMARL_CI=1 (.ci/run installs every extra), yet a test skipped" in done.stdout
    else:
        assert done.returncode == 0 and "2 skipped" in done.stdout, done.stdout

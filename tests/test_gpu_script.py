"""`.gpu/report.sh`, the GPU machine's one command: its mistakes are clear errors (the wheels it installs
are downloaded beforehand, so only a GPU session runs it for real)."""

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / ".gpu" / "report.sh"


def run(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(SCRIPT), *args], capture_output=True, text=True, env={**os.environ, **env})


def test_without_a_command_it_says_how_to_use_it():
    done = run()
    assert done.returncode == 2 and "usage: .gpu/report.sh wheels | .gpu/report.sh run OUT [MINUTES]" in done.stderr


def test_run_without_wheels_says_to_download_them_first(tmp_path):
    done = run("run", str(tmp_path / "out"), VECMARL_WHEELS=str(tmp_path / "none"))
    assert done.returncode == 2, done.stderr
    assert f"no wheels in {tmp_path / 'none'}/: run '.gpu/report.sh wheels' before the GPU session" in done.stderr
    assert not (tmp_path / "out").exists()


def test_the_wheels_folder_is_ignored_by_git():
    assert "/.whl/" in (ROOT / ".gitignore").read_text().splitlines()

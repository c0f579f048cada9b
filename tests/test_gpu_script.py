"""`.gpu/report.sh`, the GPU machine's one command: its mistakes are clear errors (the wheels it installs
are downloaded beforehand, so only a GPU session runs it for real)."""

import os
import subprocess
import sys
from pathlib import Path

from marl.bench import gpu_report

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


def test_dry_says_what_run_would_install_and_run_without_a_gpu(tmp_path):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / "vmas-1.5.2-py3-none-any.whl").write_text("")
    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run(
        [str(SCRIPT), "dry", str(out), "2"],
        capture_output=True,
        text=True,
        env={**env, "VECMARL_WHEELS": str(wheels), "PYTHON": sys.executable, "CUDA_VISIBLE_DEVICES": ""},
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert f"would install these 1 wheels into a scratch folder (--no-deps):\n    {wheels}/vmas-1.5.2" in done.stdout
    assert f"then {sys.executable} -m marl.bench.gpu_report REPORT --minutes 2" in done.stdout
    steps = [s.name for s in gpu_report.steps(out, minutes=2)]
    assert all(f"| {name} " in done.stdout for name in steps) and "not run" in done.stdout
    assert (out / "report.txt").exists() and not list(out.glob("step_*.log"))


def test_dry_without_wheels_says_run_would_stop_there(tmp_path):
    done = run("dry", str(tmp_path / "out"), VECMARL_WHEELS=str(tmp_path / "none"), PYTHON=sys.executable)
    assert done.returncode == 0, done.stderr
    assert f"no wheels in {tmp_path / 'none'}/ yet: 'run' would stop there" in done.stdout


def test_minutes_that_are_no_budget_are_refused_before_installing(tmp_path):
    for command in ("run", "dry"):
        for minutes in ("0", "abc", "-3"):
            done = run(command, str(tmp_path / "out"), minutes, VECMARL_WHEELS=str(tmp_path / "none"))
            assert done.returncode == 2
            assert f"MINUTES {minutes}: expected a positive number of minutes" in done.stderr
    assert not (tmp_path / "out").exists()

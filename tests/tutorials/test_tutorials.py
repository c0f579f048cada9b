"""Every tutorial runs as a script with the smoke-test budgets of `VECMARL_QUICK=1`, as CI runs them.

Each runs in a subprocess from a copy in a temporary folder laid out as the repository, so that what it
writes by default lands there: in quick mode its figures and runs must go to `runs/tutorial-figures/`,
never to `tutorials/figures/`, where the fully trained figures the README shows are tracked. They run
as a user runs them: GAE takes the torch path on CPU tensors
(`TRITON_INTERPRET`, which the test suite sets for the kernel tests, is removed), and with one torch
thread unless `OMP_NUM_THREADS` says otherwise, because on a CPU shared with other jobs torch's
threads wait on each other and a tutorial's many small ops run several times slower.
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TUTORIALS = sorted((REPO / "tutorials").glob("*.py"))
# What a tutorial's text says its output shows, as lines of that output.
PRINTED = {
    # "the error names both specs", and the way out
    "heterogeneous_groups": [
        "all in one, unpadded: cannot stack agent 'predator_0' (group 'predator': observation Box(shape=(16,)",
        "with agent 'prey_0' (group 'prey': observation Box(shape=(14,)",
        "(or pad observations: pad=True, marl train --pad)",
    ],
    # which property of check_env catches each of the four mistakes
    "write_a_gpu_env": [
        "SkipsIdleReset: check_env(rendezvous): property 'host_sync' failed",
        "IndexedReset: check_env(rendezvous): property 'host_sync' failed",
        "LeakyCentroid: check_env(rendezvous): property 'independence' failed",
        "LoopsOverAgents: check_env(rendezvous): property 'vectorised' failed for group 'agent'",
        "Rendezvous: passes",
    ],
}


def test_tutorials_are_found():
    assert TUTORIALS, f"no tutorials found in {REPO / 'tutorials'}"


@pytest.mark.slow
@pytest.mark.parametrize("path", TUTORIALS, ids=lambda path: path.stem)
def test_tutorial_runs(path: Path, tmp_path: Path):
    copy = tmp_path / "tutorials" / path.name
    (copy.parent / "figures").mkdir(parents=True)
    shutil.copy(path, copy)
    env = {key: value for key, value in os.environ.items() if key not in ("TRITON_INTERPRET", "VECMARL_TUTORIAL_OUT")}
    env.update(VECMARL_QUICK="1", MPLBACKEND="Agg")
    env.setdefault("OMP_NUM_THREADS", "1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    result = subprocess.run(
        [sys.executable, str(copy)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
    )
    output = (result.stdout + result.stderr)[-4000:]
    assert result.returncode == 0, f"{path.name} exited with {result.returncode}:\n{output}"
    quick_figures = tmp_path / "runs" / "tutorial-figures"
    assert not list((copy.parent / "figures").iterdir()), "quick mode wrote into tutorials/figures/"
    assert any(quick_figures.glob("*.png")), f"no figures in {quick_figures}"
    assert f"figures written to {quick_figures}" in result.stdout
    for text in PRINTED.get(path.stem, []):
        assert text in result.stdout, f"{path.name} did not print {text!r}:\n{output}"
